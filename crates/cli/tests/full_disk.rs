//! A full file system under the output (a real tmpfs, mounted small): the search and
//! `db format` fail in one line saying which file system is full, leave no partial
//! output, and a search keeps its finished batches, so that its rerun, once there is
//! room, resumes and equals serial BLAST+.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{assert_identical, entries, gepsea, head, run_ok, tempdir, zcat, DB_GZ, QUERY_GZ};

/// A tmpfs of `size` mounted at `at`, unmounted on drop (also when the test fails).
struct Mounted(PathBuf);

impl Mounted {
    fn tmpfs(at: &Path, size: &str) -> Mounted {
        std::fs::create_dir_all(at).unwrap();
        run_ok({
            let mut c = Command::new("mount");
            c.args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(at);
            c
        });
        Mounted(at.to_path_buf())
    }

    fn resize(&self, size: &str) {
        run_ok({
            let mut c = Command::new("mount");
            c.args(["-o", &format!("remount,size={size}")]).arg(&self.0);
            c
        });
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_file_system_is_named_and_a_rerun_with_room_resumes() {
    let d = tempdir("full-disk");
    std::fs::write(d.0.join("q.fasta"), head(&zcat(QUERY_GZ), 40)).unwrap();
    let mut c = gepsea();
    c.args(["-q", "db", "format", "--input", DB_GZ, "--fragments", "2", "--out"]).arg(d.0.join("db"));
    run_ok(c);
    let want = d.0.join("serial.6");
    let mut c = Command::new("blastp");
    c.current_dir(d.0.join("db")).env("BLASTDB", d.0.join("db")).args(["-db", "DB", "-outfmt", "6", "-query"]).arg(d.0.join("q.fasta"));
    std::fs::write(&want, run_ok(c).stdout).unwrap();
    // 40 queries give 139 kB of tabular output, and the search holds it twice (the
    // batches, and the output they are assembled into).
    let full = Mounted::tmpfs(&d.0.join("full"), "256k");

    // db format: the fragments do not fit; nothing is left of them.
    let o = gepsea().args(["-q", "db", "format", "--input", DB_GZ, "--fragments", "2", "--out"]).arg(full.0.join("db")).output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "db format on a full file system succeeded");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains("is full (") || e.contains("No space left on device"), "the error says the disk is full: {e}");
    assert!(entries(&full.0).is_empty(), "db format left {:?}", entries(&full.0));

    // search, split by queries: BLAST+ itself writes the batches into the work directory.
    let out = full.0.join("hits.6");
    let search = || {
        let mut c = gepsea();
        c.current_dir(&d.0)
            .args(["-q", "search", "--workers", "2", "--db", "db", "--query", "q.fasta", "--outfmt", "6", "--split", "queries"])
            .args(["--batch-residues", "2000", "--out"])
            .arg(&out);
        c
    };
    let o = search().output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a search on a full file system succeeded");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    // Which write finds the disk full first (a BLAST+ run writing its batch, an agent
    // its piece of the output) varies; either way the full file system is named.
    let work = full.0.join(".hits.6.gepsea-work");
    let named = e.contains(&format!("the file system of {} is full (", work.join("parts").display()))
        || (e.contains("No space left on device") && e.contains(&full.0.display().to_string()));
    assert!(named, "names the full file system: {e}");
    assert_eq!(entries(&full.0), [".hits.6.gepsea-work"], "only the work directory, with the batches finished, is left");
    let finished =
        std::fs::read_dir(work.join("parts")).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".part")).count();

    // Room again: the rerun takes the finished batches and writes the whole output.
    full.resize("64m");
    let summary = d.0.join("summary.json");
    let mut c = search();
    c.arg("--summary-json").arg(&summary);
    run_ok(c);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(v["reused_parts"].as_u64(), Some(finished as u64), "the rerun reuses every finished batch");
    assert_identical(&out, &want, "rerun after the disk was full");
    assert_eq!(entries(&full.0), ["hits.6"]);
}
