//! The benchmarks' JSON results, written whole or not at all.
//!
//! A result file is read again later: `cluster --replay --model-only` plays the model on
//! a saved run, the docs' tables and plots come from them, and a replay's
//! `workload.json` says which recording belongs to which workload. A run killed while
//! writing, or a full disk, must leave the previous file or none, never half of one.
//! So the text is written to a temporary file beside the target (same file system),
//! then renamed over it; on any error the temporary file is removed.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

/// Writes `value` as pretty JSON to `path`, creating its directory if needed.
pub fn write(path: &Path, value: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).with_context(|| format!("{}: encoding the results", path.display()))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = temporary(path);
    let written = std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("writing {}", path.display()))
}

/// A hidden name beside `path`, unique to this process: two runs writing the same
/// result do not write into each other's temporary file.
fn temporary(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gepsea-bench-json-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn entries(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn a_result_replaces_the_old_one_whole_in_a_new_directory() {
        let d = scratch("whole");
        let p = d.join("sub/result.json");
        write(&p, &serde_json::json!({"wall": 1.5})).unwrap();
        write(&p, &serde_json::json!({"wall": 2.5, "runs": [1, 2]})).unwrap();
        let back: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(back, serde_json::json!({"wall": 2.5, "runs": [1, 2]}));
        assert_eq!(entries(&d.join("sub")), ["result.json"], "no temporary file left");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_failed_write_leaves_the_old_result_and_no_temporary_file() {
        let d = scratch("failed");
        let p = d.join("result.json");
        write(&p, &serde_json::json!({"wall": 1.5})).unwrap();
        let before = std::fs::read(&p).unwrap();
        // JSON object keys must be strings: encoding fails before anything is written.
        let unencodable: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let e = write(&p, &unencodable).unwrap_err();
        assert!(format!("{e:#}").contains("result.json: encoding the results"), "{e:#}");
        // The rename fails: the target is a directory. The temporary file goes too.
        let dir_target = d.join("taken");
        std::fs::create_dir_all(dir_target.join("inside")).unwrap();
        let e = write(&dir_target, &serde_json::json!({"wall": 2.5})).unwrap_err();
        assert!(format!("{e:#}").contains("writing"), "{e:#}");
        assert_eq!(std::fs::read(&p).unwrap(), before, "the old result is untouched");
        assert_eq!(entries(&d), ["result.json", "taken"], "no temporary file left");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
