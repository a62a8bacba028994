//! Recorded searches replayed (`gepsea search --record DIR` / `--replay DIR`, the
//! many-node benchmark's emulation; the 4-node replay is in `tests/cluster.rs`): a
//! replay reproduces the recorded output exactly, and a recording is refused, before
//! anything runs and with nothing written, for another database, another query set or
//! another batch layout.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{assert_identical, gepsea, head, run_ok, tempdir, zcat, DB_GZ, QUERY_GZ};

fn search(dir: &Path, db: &str, queries: &str, out: &str, extra: &[&str]) -> Command {
    let mut c = gepsea();
    c.current_dir(dir)
        .args([
            "search",
            "--quiet",
            "--workers",
            "2",
            "--split",
            "fragments",
            "--outfmt",
            "6",
            "--db",
            db,
            "--query",
            queries,
            "--out",
            out,
        ])
        .args(extra);
    c
}

#[test]
fn a_replay_repeats_the_recording_and_refuses_another_database_query_set_or_layout() {
    let t = tempdir("replay");
    let d = &t.0;
    let queries = zcat(QUERY_GZ);
    std::fs::write(d.join("q.fasta"), head(&queries, 12)).unwrap();
    // The same number of queries, other sequences.
    let other: String = {
        let all = head(&queries, 24);
        let start = all.match_indices('>').nth(12).unwrap().0;
        all[start..].to_string()
    };
    std::fs::write(d.join("other.fasta"), other).unwrap();
    for (name, fragments) in [("db", "3"), ("db4", "4")] {
        run_ok({
            let mut c = gepsea();
            c.args(["db", "format", "--input", DB_GZ, "--fragments", fragments, "--out"]).arg(d.join(name));
            c
        });
    }
    let layout = ["--batch-residues", "1500"];
    run_ok(search(d, "db", "q.fasta", "recorded.6", &[&["--record", "rec"][..], &layout].concat()));
    run_ok(search(d, "db", "q.fasta", "replayed.6", &[&["--replay", "rec"][..], &layout].concat()));
    assert_identical(&d.join("replayed.6"), &d.join("recorded.6"), "replayed with agents");
    run_ok(search(d, "db", "q.fasta", "no-agent.6", &[&["--replay", "rec", "--no-agent"][..], &layout].concat()));
    assert_identical(&d.join("no-agent.6"), &d.join("recorded.6"), "replayed without agents");

    let refused = |db: &str, q: &str, extra: &[&str], says: &str| {
        let o = search(d, db, q, "refused.6", &[&["--replay", "rec"][..], extra].concat()).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{db} {q} {extra:?}: {err}");
        assert!(err.contains(says), "{db} {q} {extra:?}: expected {says:?} in {err}");
        assert_eq!(err.trim().lines().count(), 1, "one clear line: {err}");
        let left: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("refused"))
            .collect();
        assert!(left.is_empty(), "{db} {q} {extra:?} left {left:?}");
    };
    refused("db4", "q.fasta", &layout, "holds a recording of another database (db), not of this search's db4");
    refused("db", "other.fasta", &layout, "holds a recording of another query set (q.fasta), not of this search's other.fasta");
    refused("db", "q.fasta", &["--batch-residues", "700"], "no recorded run of query batch 0 on");
    refused("db", "q.fasta", &[&layout[..], &["--", "-evalue", "1"]].concat(), "another set of BLAST+ options");
    let o = search(d, "db", "q.fasta", "refused.6", &["--replay", "nothing-here"]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing-here: not a recording"), "{}", String::from_utf8_lossy(&o.stderr));

    // Results the merge cannot read (recorded archives whose queries lost their local
    // ids): the search ends with one line saying so. With agents, the agent that took
    // such a result in refused it, and the master once waited forever for its batch.
    for run in std::fs::read_dir(d.join("rec/runs")).unwrap().flatten().map(|e| e.path()) {
        if run.extension().is_some_and(|e| e == "out") {
            let text = std::fs::read_to_string(&run).unwrap();
            std::fs::write(&run, text.replace("local str \"Query_", "local str \"Bogus_")).unwrap();
        }
    }
    for (mode, says) in
        [(&[][..], "could not be merged: plug-in blast: alignment without query id"), (&["--no-agent"][..], "alignment without query id")]
    {
        let mut c = search(d, "db", "q.fasta", "unreadable.6", &[&["--replay", "rec"][..], &layout, mode].concat());
        let o = output_within(&mut c, Duration::from_secs(120));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{mode:?}: {err}");
        assert!(err.contains(says), "{mode:?}: expected {says:?} in {err}");
        assert_eq!(err.trim().lines().count(), 1, "one clear line: {err}");
        assert!(!d.join("unreadable.6").exists(), "{mode:?}: an output was written");
    }
}

/// Runs `c` to its end, killing it (and failing the test) if it outlasts `limit`.
fn output_within(c: &mut Command, limit: Duration) -> Output {
    let child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(limit) {
        Ok(o) => o.unwrap(),
        Err(_) => {
            // SIGTERM: the search stops its agent and workers on the way out.
            let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
            panic!("still running after {limit:?}: it hangs");
        }
    }
}
