//! The benchmarks' results (JSON and PNG), written whole or not at all.
//!
//! A result file is read again later: `cluster --replay --model-only` plays the model on
//! a saved run, the docs' tables and plots come from them, and a replay's
//! `workload.json` says which recording belongs to which workload. A run killed while
//! writing, or a full disk, must leave the previous file or none, never half of one.
//! So each is written to a temporary file beside the target (same file system), then
//! renamed over it; on any error the temporary file is removed.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

/// Writes `value` as pretty JSON to `path`.
pub fn json(path: &Path, value: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).with_context(|| format!("{}: encoding the results", path.display()))?;
    whole(path, |tmp| std::fs::write(tmp, &text).with_context(|| format!("writing {}", path.display())))
}

/// Has `write` write `path`'s contents into a temporary file it is given (with the same
/// extension, for writers that pick a format by it, such as plotters' PNG backend),
/// then renames that over `path`. Creates `path`'s directory if needed.
pub fn whole(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = temporary(path);
    let done = write(&tmp).and_then(|_| std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display())));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// A hidden name beside `path`, unique to this process (two runs writing the same
/// result do not write into each other's temporary file), ending in `path`'s extension.
fn temporary(path: &Path) -> PathBuf {
    let stem = path.file_stem().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let ext = path.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
    path.with_file_name(format!(".{stem}.{}.tmp{ext}", std::process::id()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gepsea-bench-json-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// The names in directory `d`, sorted.
    pub(crate) fn entries(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn a_result_replaces_the_old_one_whole_in_a_new_directory() {
        let d = scratch("whole");
        let p = d.join("sub/result.json");
        json(&p, &serde_json::json!({"wall": 1.5})).unwrap();
        json(&p, &serde_json::json!({"wall": 2.5, "runs": [1, 2]})).unwrap();
        let back: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(back, serde_json::json!({"wall": 2.5, "runs": [1, 2]}));
        assert_eq!(entries(&d.join("sub")), ["result.json"], "no temporary file left");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_writer_gets_a_temporary_name_with_the_target_s_extension_and_its_error_removes_it() {
        let d = scratch("whole-writer");
        let p = d.join("cluster_wall.png");
        let mut seen = PathBuf::new();
        let e = whole(&p, |tmp| {
            seen = tmp.to_path_buf();
            std::fs::write(tmp, b"half a picture")?;
            anyhow::bail!("the plot failed")
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "the plot failed");
        assert_eq!(seen.extension().unwrap(), "png", "{}", seen.display());
        assert_eq!(seen.parent(), Some(d.as_path()));
        assert!(!p.exists() && !seen.exists(), "neither the target nor the temporary file");
        whole(&p, |tmp| Ok(std::fs::write(tmp, b"a picture")?)).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"a picture");
        assert_eq!(entries(&d), ["cluster_wall.png"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_failed_write_leaves_the_old_result_and_no_temporary_file() {
        let d = scratch("failed");
        let p = d.join("result.json");
        json(&p, &serde_json::json!({"wall": 1.5})).unwrap();
        let before = std::fs::read(&p).unwrap();
        // JSON object keys must be strings: encoding fails before anything is written.
        let unencodable: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let e = json(&p, &unencodable).unwrap_err();
        assert!(format!("{e:#}").contains("result.json: encoding the results"), "{e:#}");
        // The rename fails: the target is a directory. The temporary file goes too.
        let dir_target = d.join("taken");
        std::fs::create_dir_all(dir_target.join("inside")).unwrap();
        let e = json(&dir_target, &serde_json::json!({"wall": 2.5})).unwrap_err();
        assert!(format!("{e:#}").contains("writing"), "{e:#}");
        assert_eq!(std::fs::read(&p).unwrap(), before, "the old result is untouched");
        assert_eq!(entries(&d), ["result.json", "taken"], "no temporary file left");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
