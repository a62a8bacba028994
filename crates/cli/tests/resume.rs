//! Long jobs that survive being stopped: a search killed (SIGKILL) or stopped (SIGTERM)
//! halfway and run again redoes only its unfinished batches and writes output identical
//! to serial BLAST+; a changed option or `--no-resume` reuses nothing; nothing is left
//! but the output once it succeeds.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_identical, entries, finished_parts, gepsea, head, part_files, run_ok, tempdir, zcat, DB_GZ, DB_PROTEINS, QUERY_GZ};

/// A formatted database of the first [`DB_PROTEINS`] example proteins and 40 queries, in
/// `dir`.
fn setup(dir: &Path) {
    std::fs::write(dir.join("q.fasta"), head(&zcat(QUERY_GZ), 40)).unwrap();
    std::fs::write(dir.join("db.fasta"), head(&zcat(DB_GZ), DB_PROTEINS)).unwrap();
    run_ok({
        let mut c = gepsea();
        c.args(["db", "format", "--fragments", "3", "--name", "DB", "--input"]).arg(dir.join("db.fasta")).arg("--out").arg(dir.join("db"));
        c
    });
    std::fs::remove_file(dir.join("db.fasta")).unwrap();
}

fn serial(dir: &Path, outfmt: &str, extra: &[&str], out: &Path) {
    let mut c = Command::new("blastp");
    c.current_dir(dir.join("db"))
        .env("BLASTDB", dir.join("db"))
        .args(["-db", "DB", "-outfmt", outfmt, "-num_threads", "2", "-query"])
        .arg(dir.join("q.fasta"))
        .arg("-out")
        .arg(out)
        .args(extra);
    run_ok(c);
}

/// Every search of this file cuts the 40 queries into batches of at most 2,000 residues
/// (10 batches): a stopped search has finished its first batch long before its last. With
/// the default batches (2 when split by fragments, shrinking ones split by queries) the
/// last batches could finish within the test's 20 ms look for the first, and the search
/// ended before it could be stopped (seen once in a clean-clone CI run).
const BATCHES: [&str; 2] = ["--batch-residues", "2000"];

fn search_cmd(dir: &Path, out: &Path, mode: &[&str], extra: &[&str]) -> Command {
    let mut c = gepsea();
    c.current_dir(dir)
        .args(["search", "--quiet", "--workers", "2", "--db", "db", "--query", "q.fasta", "--outfmt", "6", "--out"])
        .arg(out)
        .args(BATCHES)
        .args(mode);
    if !extra.is_empty() {
        c.arg("--").args(extra);
    }
    c
}

/// Starts a search and stops it with `signal` once at least one batch is finished;
/// returns how many were.
/// Stops a search once it has finished a batch; returns the batches finished and the
/// search's pid.
fn stop_halfway(dir: &Path, out: &Path, mode: &[&str], signal: i32) -> (usize, u32) {
    let mut child = search_cmd(dir, out, mode, &[]).stderr(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while finished_parts(out) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, signal) };
    let st = child.wait().unwrap();
    assert!(!st.success(), "{mode:?}: the search finished before it could be stopped");
    // Killed outright, the master cannot stop its children: let them notice.
    std::thread::sleep(Duration::from_millis(300));
    let n = finished_parts(out);
    assert!(n >= 1, "a batch should have been finished");
    (n, child.id())
}

/// Runs the search to the end; returns the number of batches reused.
fn rerun(dir: &Path, out: &Path, mode: &[&str], extra: &[&str]) -> u64 {
    rerun_summary(dir, out, mode, extra)["reused_parts"].as_u64().unwrap()
}

/// Runs the search to the end; returns its summary.
fn rerun_summary(dir: &Path, out: &Path, mode: &[&str], extra: &[&str]) -> serde_json::Value {
    let summary = dir.join("summary.json");
    let mut flags = mode.to_vec();
    flags.extend(["--summary-json", summary.to_str().unwrap()]);
    run_ok(search_cmd(dir, out, &flags, extra));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    std::fs::remove_file(&summary).unwrap();
    v
}

/// Removes what a search killed with `pid` leaves for its rerun to sweep (its runtime
/// namespace and scratch), where the test runs none (it would search for minutes).
fn forget_killed_search(pid: u32) {
    let _ = std::fs::remove_dir_all(gepsea_net::namespace_dir(&format!("search{pid}")));
    for scratch in scratch_dirs(pid) {
        let _ = std::fs::remove_dir_all(scratch);
    }
}

/// What search `pid` keeps in the user's runtime root: its scratch, its report's and its
/// statistics runs'.
fn scratch_dirs(pid: u32) -> [std::path::PathBuf; 3] {
    ["search", "report", "stats"].map(|what| gepsea_net::trust::user_runtime_root().join(format!("gepsea-{what}-{pid}")))
}

#[test]
fn a_search_stopped_halfway_resumes_and_equals_serial_blast() {
    let d = tempdir("resume");
    setup(&d.0);
    let want = d.0.join("serial.6");
    serial(&d.0, "6", &[], &want);
    let cases: [(&[&str], i32, &str); 3] = [
        (&["--split", "queries"], libc::SIGKILL, "killed"),
        (&["--split", "fragments"], libc::SIGTERM, "stopped"),
        (&["--no-agent"], libc::SIGKILL, "killed, no agents"),
    ];
    for (i, (mode, signal, what)) in cases.iter().enumerate() {
        let outdir = d.0.join(format!("out{i}"));
        std::fs::create_dir_all(&outdir).unwrap();
        let out = outdir.join("hits.tsv");
        let (done, pid) = stop_halfway(&d.0, &out, mode, *signal);
        // Merged batches' parts are stored zstd-compressed; split by queries, a part is
        // the worker's BLAST+ output as it stands.
        // (One listing: an agent may still be renaming a part into place.)
        let listed = part_files(&out);
        let compressed = listed.iter().filter(|p| std::fs::read(p).unwrap().starts_with(&[0x28, 0xb5, 0x2f, 0xfd])).count();
        let want_compressed = if mode.contains(&"queries") { 0 } else { listed.len() };
        assert_eq!(compressed, want_compressed, "{what}: parts stored compressed");
        if *signal == libc::SIGTERM {
            // Stopped cleanly: only the work directory (for the rerun) is left.
            assert_eq!(entries(&outdir), vec![".hits.tsv.gepsea-work".to_string()], "{what}");
        }
        let v = rerun_summary(&d.0, &out, mode, &[]);
        let reused = v["reused_parts"].as_u64().unwrap();
        assert!(reused as usize >= done, "{what}: {done} batches were finished, {reused} reused");
        if !mode.contains(&"--no-agent") {
            // The master wrote the reused batches' share of the output from their parts,
            // between the pieces the agents wrote in place for the others (merged, or
            // written by BLAST+ split by queries).
            let (parts, placed) = (v["accel"]["parts"].as_u64().unwrap(), v["accel"]["placed_by_agents"].as_u64().unwrap());
            assert!(reused < parts, "{what}: every batch was reused");
            assert_eq!(placed, parts - reused, "{what}: batches placed by their agent");
        }
        assert_identical(&out, &want, &format!("{what}, {mode:?}, then rerun"));
        // The rerun swept what the stopped search's own runtime namespace left.
        let ns = gepsea_net::namespace_dir(&format!("search{pid}"));
        assert!(!ns.exists(), "{what}: {} left after the rerun", ns.display());
        // And its scratch in the runtime root (the report's and the statistics runs',
        // next to the job's).
        for p in scratch_dirs(pid) {
            assert!(!p.exists(), "{what}: {} left after the rerun", p.display());
        }
        assert_eq!(entries(&outdir), vec!["hits.tsv".to_string()], "{what}: nothing but the output after success");
    }
}

#[test]
fn a_changed_option_or_no_resume_reuses_nothing() {
    let d = tempdir("noreuse");
    setup(&d.0);
    let outdir = d.0.join("out");
    std::fs::create_dir_all(&outdir).unwrap();
    let out = outdir.join("hits.tsv");
    let mode: &[&str] = &["--split", "queries"];
    stop_halfway(&d.0, &out, mode, libc::SIGTERM);
    // Other options: other parts (the finished ones stay for a rerun of the first).
    let want = d.0.join("serial-evalue.6");
    serial(&d.0, "6", &["-evalue", "1e-3"], &want);
    assert_eq!(rerun(&d.0, &out, mode, &["-evalue", "1e-3"]), 0, "a changed option reuses nothing");
    assert_identical(&out, &want, "-evalue 1e-3 after an interrupted default run");
    // --no-resume searches everything again.
    std::fs::remove_file(&out).unwrap();
    stop_halfway(&d.0, &out, mode, libc::SIGTERM);
    let want = d.0.join("serial.6");
    serial(&d.0, "6", &[], &want);
    assert_eq!(rerun(&d.0, &out, &["--split", "queries", "--no-resume"], &[]), 0, "--no-resume reuses nothing");
    assert_identical(&out, &want, "--no-resume");
}

/// (pid, ppid, state, command name) of every process, from `/proc/PID/stat`.
fn processes() -> Vec<(u32, u32, char, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // "pid (comm) state ppid ...": the name may hold spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let mut rest = stat[close + 1..].split_whitespace();
        let state = rest.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let ppid = rest.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        out.push((pid, ppid, state, stat[open + 1..close].to_string()));
    }
    out
}

/// Every live descendant of `root`: (pid, parent, command name).
fn descendants(root: u32) -> Vec<(u32, u32, String)> {
    let all = processes();
    let mut found = vec![root];
    let mut out = Vec::new();
    let mut i = 0;
    while i < found.len() {
        for (pid, ppid, state, name) in &all {
            if *ppid == found[i] && *state != 'Z' && !found.contains(pid) {
                found.push(*pid);
                out.push((*pid, *ppid, name.clone()));
            }
        }
        i += 1;
    }
    out
}

/// Whether `pid` has ended (a zombie has: nothing reaps orphans in some containers).
fn ended(pid: u32) -> bool {
    processes().iter().all(|(p, _, state, _)| *p != pid || *state == 'Z')
}

/// Processes SIGKILLed on drop, so that a failed test leaves none running.
struct KillOnDrop(Vec<u32>);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if !ended(pid) {
                // SAFETY: signalling processes this test started (through the search).
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
    }
}

#[test]
fn a_killed_search_takes_its_workers_and_blast_runs_with_it() {
    let d = tempdir("killed-children");
    setup(&d.0);
    // A few queries, each of which BLAST+ searches for seconds with a low word
    // threshold: the runs under way when the search is killed have long to go.
    std::fs::write(d.0.join("q.fasta"), head(&zcat(QUERY_GZ), 8)).unwrap();
    for mode in [&["--split", "queries"][..], &["--split", "fragments"], &["--no-agent"]] {
        let out = d.0.join("hits.tsv");
        let mut c = gepsea();
        c.current_dir(&d.0)
            .args(["search", "--quiet", "--workers", "2", "--db", "db", "--query", "q.fasta", "--outfmt", "6", "--out"])
            .arg(&out)
            .args(mode)
            .args(["--", "-threshold", "5"])
            .stderr(Stdio::null());
        let mut search = c.spawn().unwrap();
        let pid = search.id();
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut started = descendants(pid);
        // Both workers' BLAST+ runs (the search's own checks run BLAST+ too, briefly).
        while started.iter().filter(|(_, parent, name)| name == "blastp" && *parent != pid).count() < 2 {
            assert!(Instant::now() < deadline, "{mode:?}: no BLAST+ run started");
            std::thread::sleep(Duration::from_millis(20));
            started = descendants(pid);
        }
        let guard = KillOnDrop(started.iter().map(|p| p.0).collect());
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        search.wait().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut left: Vec<_> = started.clone();
        while !left.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            left.retain(|(p, _, _)| !ended(*p));
        }
        assert!(left.is_empty(), "{mode:?}: 10 s after the search was killed these of its processes still ran: {left:?} (of {started:?})");
        drop(guard);
        forget_killed_search(pid);
    }
}

#[test]
fn a_second_search_of_the_same_output_is_refused_while_the_first_runs() {
    let d = tempdir("busy");
    setup(&d.0);
    let want = d.0.join("serial.6");
    serial(&d.0, "6", &[], &want);
    // The first search: six queries that BLAST+ searches for seconds each (about 10 s
    // in all on one core; it is killed once the second has been refused).
    std::fs::write(d.0.join("slow.fasta"), head(&zcat(QUERY_GZ), 6)).unwrap();
    let out = d.0.join("hits.tsv");
    // Split by fragments, so that its master runs the batches' statistics ahead in a
    // scratch directory, which the rerun has to sweep.
    let mut c = gepsea();
    c.current_dir(&d.0)
        .args(["search", "--quiet", "--workers", "1", "--split", "fragments", "--db", "db", "--query", "slow.fasta"])
        .args(["--outfmt", "6", "--out"])
        .arg(&out)
        .args(["--", "-threshold", "5"])
        .stderr(Stdio::null());
    let mut first = c.spawn().unwrap();
    let pid = first.id();
    let guard = KillOnDrop(vec![pid]);
    let lock = d.0.join(".hits.tsv.gepsea-work/lock");
    let stats = scratch_dirs(pid)[2].clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&lock).ok() != Some(pid.to_string()) || !stats.exists() {
        assert!(Instant::now() < deadline, "the first search never took its work directory or ran statistics ahead");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The second is refused at once, names the first, and touches nothing of it. It used
    // to run alongside, and the first to finish removed the work directory under the
    // other.
    let second = search_cmd(&d.0, &out, &[], &[]).output().unwrap();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains(&format!("another search (pid {pid}) is writing")) && err.contains("give another --out"),
        "the refusal says who holds the output and what to do: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), pid.to_string(), "the first search's work directory is untouched");
    assert!(!out.exists());
    assert!(first.try_wait().unwrap().is_none(), "the first search goes on");
    // Killed, the first lets go at once: the next search of the output runs.
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    first.wait().unwrap();
    drop(guard);
    run_ok(search_cmd(&d.0, &out, &[], &[]));
    assert_identical(&out, &want, "after the first search was killed");
    assert_eq!(entries(&d.0).iter().filter(|e| e.contains("hits.tsv")).collect::<Vec<_>>(), ["hits.tsv"]);
    // The killed search's scratch was swept by the next search of the output; it used
    // to stay in the temporary directory for good (`gepsea-stats-<pid>-<thread>`).
    for p in scratch_dirs(pid) {
        assert!(!p.exists(), "{} left after the next search", p.display());
    }
    forget_killed_search(pid);
}

/// A `--work-dir` shared by two searches of the same batches at the same time (two
/// outputs, one cache): both equal serial BLAST+, and the parts are removed by the
/// last to finish. The first to finish used to remove the parts under the other, which
/// then failed for a missing part.
#[test]
fn searches_sharing_a_work_dir_keep_each_others_parts() {
    let d = tempdir("shared-work");
    setup(&d.0);
    let want = d.0.join("serial.6");
    serial(&d.0, "6", &[], &want);
    let shared = d.0.join("cache");
    let with_cache = ["--work-dir", shared.to_str().unwrap()];
    let parts = || -> usize {
        std::fs::read_dir(shared.join("parts"))
            .map(|r| r.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".part")).count())
            .unwrap_or(0)
    };
    let (a_out, b_out) = (d.0.join("a.6"), d.0.join("b.6"));
    let a = search_cmd(&d.0, &a_out, &with_cache, &[]).stderr(Stdio::piped()).spawn().unwrap();
    let guard = KillOnDrop(vec![a.id()]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while parts() == 0 {
        assert!(Instant::now() < deadline, "the first search finished no batch");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The second starts with the first's finished batches in the cache, and reuses them.
    let b = search_cmd(&d.0, &b_out, &with_cache, &[]).stderr(Stdio::piped()).spawn().unwrap();
    let guard_b = KillOnDrop(vec![b.id()]);
    for (name, child, out) in [("first", a, &a_out), ("second", b, &b_out)] {
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "the {name} search: {}", String::from_utf8_lossy(&o.stderr));
        assert_identical(out, &want, name);
    }
    drop((guard, guard_b));
    assert_eq!(parts(), 0, "the last search to finish removes the parts");
}

/// The command line of `pid`, its arguments joined by spaces.
fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline")).map(|b| String::from_utf8_lossy(&b).replace('\0', " ")).unwrap_or_default()
}

/// The search's agent: a live descendant of `search` running `gepsea agent`, not one
/// of `gone`.
fn search_agent(search: u32, gone: &[u32]) -> Option<u32> {
    descendants(search).iter().map(|p| p.0).find(|&p| !gone.contains(&p) && cmdline(p).contains(" agent --namespace "))
}

/// A search whose own agent is killed (the OOM killer, an operator) starts a new one and
/// resumes from the batches already finished, up to 3 times, saying so; the output
/// still equals serial BLAST+. Killed a fourth time, it ends with one error line that
/// says so and that the same command resumes (not one per worker that lost the agent),
/// takes its processes with it, and its rerun resumes and equals serial BLAST+.
#[test]
fn a_search_whose_agent_is_killed_starts_it_again_and_says_so() {
    let d = tempdir("agent-killed");
    setup(&d.0);
    let want = d.0.join("serial.6");
    serial(&d.0, "6", &[], &want);
    for (mode, kills) in [(&["--split", "fragments"][..], 1), (&["--split", "queries"], 4)] {
        let out = d.0.join("hits.tsv");
        // Not quiet: the notes a search prints are part of what is checked.
        let mut search = gepsea()
            .current_dir(&d.0)
            .args(["search", "--workers", "2", "--db", "db", "--query", "q.fasta", "--outfmt", "6", "--out"])
            .arg(&out)
            .args(BATCHES)
            .args(mode)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = search.id();
        let mut killed = Vec::new();
        let mut guard = KillOnDrop(vec![pid]);
        while killed.len() < kills {
            let deadline = Instant::now() + Duration::from_secs(120);
            let agent = loop {
                // The first kill once a batch is finished, so that there is one to reuse;
                // the others at once (the search must tell a killed agent from one that
                // failed to start, whenever it is killed).
                if let Some(a) = search_agent(pid, &killed).filter(|_| !killed.is_empty() || finished_parts(&out) > 0) {
                    break a;
                }
                assert!(search.try_wait().unwrap().is_none(), "{mode:?}: the search ended after {} kills", killed.len());
                assert!(Instant::now() < deadline, "{mode:?}: no agent after {} kills", killed.len());
                std::thread::sleep(Duration::from_millis(10));
            };
            guard.0.extend(descendants(pid).iter().map(|p| p.0));
            // SAFETY: signalling a process this test started (through the search).
            unsafe { libc::kill(agent as i32, libc::SIGKILL) };
            killed.push(agent);
        }
        let deadline = Instant::now() + Duration::from_secs(300);
        let status = loop {
            if let Some(st) = search.try_wait().unwrap() {
                break st;
            }
            assert!(Instant::now() < deadline, "{mode:?}: the search did not end");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut search.stderr.take().unwrap(), &mut stderr).unwrap();
        let lines: Vec<&str> = stderr.lines().collect();
        let restarted: Vec<String> = (1..=kills.min(3))
            .map(|k| {
                format!(
                    "gepsea search: the search's agent (pid {}) ended (signal: 9 (SIGKILL)); starting a new one and resuming from the batches already finished ({k} of 3 restarts)",
                    killed[k - 1]
                )
            })
            .collect();
        let noted: Vec<&str> = lines.iter().copied().filter(|l| l.contains("ended (")).collect();
        let failed = format!(
            "gepsea: error: the search's agent (pid {}) ended (signal: 9 (SIGKILL)); run the same command again to resume from the batches already finished",
            killed.last().unwrap()
        );
        let mut want_noted: Vec<&str> = restarted.iter().map(String::as_str).collect();
        if kills > 3 {
            want_noted.push(&failed);
        }
        assert_eq!(noted, want_noted, "{mode:?}: {stderr}");
        let others: Vec<&&str> = lines.iter().filter(|l| l.contains("error") || l.contains("died") || l.contains("lost")).collect();
        if kills > 3 {
            assert_eq!(status.code(), Some(1), "{mode:?}: {stderr}");
            assert_eq!(lines.last(), Some(&failed.as_str()), "{mode:?}: {stderr}");
            assert_eq!(others, vec![&failed.as_str()], "{mode:?}: one error line, the search's, and no word of workers dying");
            let family = guard.0.clone();
            let deadline = Instant::now() + Duration::from_secs(10);
            while family.iter().any(|&p| !ended(p)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let left: Vec<_> = family.iter().filter(|&&p| !ended(p)).collect();
            assert!(left.is_empty(), "{mode:?}: still running after the search ended: {left:?}");
            let done = finished_parts(&out);
            assert!(done >= 1, "{mode:?}: the finished batches were not kept");
            let reused = rerun(&d.0, &out, mode, &[]);
            assert!(reused as usize >= done, "{mode:?}: {done} batches were finished, {reused} reused");
        } else {
            assert!(status.success(), "{mode:?}: {stderr}");
            assert!(others.is_empty(), "{mode:?}: {others:?}");
            assert!(stderr.contains(" reused from an interrupted run"), "{mode:?}: {stderr}");
        }
        drop(guard);
        assert_identical(&out, &want, &format!("{mode:?}, agent killed {kills} times"));
        std::fs::remove_file(&out).unwrap();
    }
}
