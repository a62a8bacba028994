//! A directory of a unit test's own, removed also when the test fails (unit tests
//! only).

use std::path::{Path, PathBuf};

pub(crate) struct TestDir(PathBuf);

impl TestDir {
    /// An empty `gepsea-<tag>-<pid>` under the temporary directory.
    pub(crate) fn new(tag: &str) -> TestDir {
        let d = std::env::temp_dir().join(format!("gepsea-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TestDir(d)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
