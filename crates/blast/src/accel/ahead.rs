//! The statistics runs of every batch's report, run by the master ahead of the
//! batches' results.
//!
//! Writing a batch's part takes two statistics runs of BLAST+ besides the formatter
//! (`crate::report`): one for the archive's request, one for the per-query footers.
//! They depend only on the batch's queries, the database and the options, so they
//! need not wait for the batch's results. At a search's start nothing is complete
//! yet and the merger agents have nothing to write: on the replayed 36-node cluster
//! the machine was 29 % busy in the first 2 s after the tasks went out and 65 % in
//! the next 2, then saturated until the end, with every batch's statistics runs
//! (≈14 CPU-s) still inside its write. The master runs them then, batch by batch on
//! up to two threads at the writers' low priority, into the job directory
//! (`plan::stats_dir`), where the batch's writer finds them (`writer::write_part`)
//! and otherwise runs them itself, as before.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use crate::plan::*;
use crate::report;

/// Runs `body` (the master) with the batches' statistics run ahead alongside it on up
/// to two threads, which stop when it returns; split by queries (the workers write the
/// parts) there is nothing to run ahead and `body` gets `None`.
pub(crate) fn alongside<R>(spec: &JobSpec, job: &Path, body: impl FnOnce(Option<&StatsAhead>) -> R) -> R {
    if spec.split != SplitBy::Fragments {
        return body(None);
    }
    let ahead = StatsAhead::new();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(2);
    // One directory for the threads' scratch, named by this process alone, so that a
    // later search sweeps it if this one is killed (`search::files::sweep_stale`).
    let scratch = scratch_dir();
    let _remove = crate::search::files::RemoveDir(scratch.clone());
    std::thread::scope(|s| {
        for i in 0..threads {
            let (ahead, scratch) = (&ahead, scratch.join(i.to_string()));
            s.spawn(move || ahead.run(spec, job, &scratch));
        }
        let r = body(Some(&ahead));
        ahead.stop();
        r
    })
}

/// Where this process's statistics runs write their scratch files: `gepsea-stats-<pid>`
/// in this user's private runtime root (created by the first run, and checked:
/// `gepsea_net::trust::ensure_private_dir`).
fn scratch_dir() -> PathBuf {
    gepsea_net::trust::user_runtime_root().join(format!("{SCRATCH_PREFIX}{}", std::process::id()))
}

/// The prefix of [`scratch_dir`]'s name, before the process id.
pub(crate) const SCRATCH_PREFIX: &str = "gepsea-stats-";

/// Statistics runs ahead of the results, shared by the master and its threads.
pub(crate) struct StatsAhead {
    /// Batches to run, in order (set by `start`); `next` is the first not yet taken.
    batches: Mutex<Vec<usize>>,
    next: AtomicUsize,
    go: AtomicBool,
    stop: AtomicBool,
    /// Seconds each batch's runs took (wall, CPU), recorded before they are saved, so
    /// that a writer that used them finds their cost here.
    seconds: Mutex<BTreeMap<usize, (f64, f64)>>,
}

impl StatsAhead {
    pub(crate) fn new() -> Self {
        StatsAhead {
            batches: Mutex::new(Vec::new()),
            next: AtomicUsize::new(0),
            go: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            seconds: Mutex::new(BTreeMap::new()),
        }
    }

    /// The threads begin with `batches`, in order. Called once the tasks are out: the
    /// fragments staged before them have the machine first.
    pub(crate) fn start(&self, batches: &[usize]) {
        *self.batches.lock() = batches.to_vec();
        self.go.store(true, Ordering::SeqCst);
    }

    /// No more batches are started (one under way finishes).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// What batch `batch`'s runs took (wall and CPU seconds), if they were run ahead.
    pub(crate) fn seconds_of(&self, batch: usize) -> (f64, f64) {
        self.seconds.lock().get(&batch).copied().unwrap_or((0.0, 0.0))
    }

    /// One thread's share: batches in order until none is left or `stop`. A failure
    /// only means the writer runs the statistics itself, and says why there.
    pub(crate) fn run(&self, spec: &JobSpec, job: &Path, scratch: &Path) {
        if let Err(e) = rustix::process::setpriority_process(None, super::writer::WRITER_NICE) {
            tracing::debug!("statistics ahead: keeping this thread's priority: {e}");
        }
        while !self.go.load(Ordering::SeqCst) {
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        while !self.stop.load(Ordering::SeqCst) {
            let i = self.next.fetch_add(1, Ordering::SeqCst);
            let Some(batch) = self.batches.lock().get(i).copied() else { break };
            // A writer that got to the batch first claimed it and runs them itself.
            if !claim(job, batch) {
                continue;
            }
            let dir = stats_dir(job, batch);
            let clock = crate::tools::CpuClock::start();
            match run_one(spec, job, batch, scratch) {
                Ok(stats) => {
                    self.seconds.lock().insert(batch, (clock.wall_seconds(), clock.seconds()));
                    if let Err(e) = stats.save(&dir) {
                        tracing::debug!("statistics ahead, batch {batch}: {e}");
                    }
                }
                Err(e) => {
                    tracing::debug!("statistics ahead, batch {batch}: {e}");
                    // Released: a writer waiting for them runs them itself at once.
                    let _ = std::fs::remove_file(claim_path(job, batch));
                }
            }
        }
        let _ = std::fs::remove_dir_all(scratch);
    }
}

/// Claims batch `batch`'s statistics runs for the caller: `true` once, for the first
/// caller in the job (the master's threads and the batch's writer race for it), so
/// that they are never run twice. The claim names its holder (host and process), so
/// that a writer waiting on it can tell when the holder died without saving them: an
/// agent killed while writing left a claim that a repeat of its batch waited out to
/// the end of its patience (30 s on every such search).
pub(crate) fn claim(job: &Path, batch: usize) -> bool {
    use std::io::Write;
    let Ok(mut f) = std::fs::OpenOptions::new().write(true).create_new(true).open(claim_path(job, batch)) else { return false };
    // An unreadable holder only means a waiter keeps waiting (up to its patience).
    let _ = writeln!(f, "{} {}", host_name(), std::process::id());
    true
}

fn claim_path(job: &Path, batch: usize) -> PathBuf {
    let mut c = stats_dir(job, batch).into_os_string();
    c.push(".claim");
    PathBuf::from(c)
}

/// This host's name, read once: a waiting writer checks claims every 10 ms.
fn host_name() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default())
}

/// Whether batch `batch`'s claim is held by a process of this host that is gone. A
/// holder on another host (a job directory on shared storage) cannot be checked from
/// here: it counts as alive.
fn claim_abandoned(job: &Path, batch: usize) -> bool {
    let Ok(holder) = std::fs::read_to_string(claim_path(job, batch)) else { return false };
    let mut words = holder.split_whitespace();
    let (Some(host), Some(pid)) = (words.next(), words.next().and_then(|p| p.parse::<u32>().ok())) else { return false };
    host == host_name() && crate::tools::process_gone(pid)
}

/// The statistics of batch `batch` for its writer: the ones run ahead, waiting for
/// them if the master is running them now (at most `patience`, and not once their
/// claimant is known to be gone); `None` when the writer is to run them itself (it
/// then holds the claim, or the claimant gave up or died).
pub(crate) fn for_writer(job: &Path, batch: usize, outfmt: &str, patience: std::time::Duration) -> Option<report::Statistics> {
    let dir = stats_dir(job, batch);
    let usable = |s: report::Statistics| s.serve(outfmt).then_some(s);
    if let Some(s) = report::Statistics::load(&dir) {
        return usable(s);
    }
    if claim(job, batch) {
        return None;
    }
    let until = Instant::now() + patience;
    while Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(10));
        if let Some(s) = report::Statistics::load(&dir) {
            return usable(s);
        }
        // Released by a holder that failed (and now claimed by us), or held by one that died.
        if claim(job, batch) || claim_abandoned(job, batch) {
            // Saved just before the holder went?
            return report::Statistics::load(&dir).and_then(usable);
        }
    }
    None
}

fn run_one(spec: &JobSpec, job: &Path, batch: usize, scratch: &Path) -> Result<report::Statistics, report::ReportError> {
    gepsea_net::trust::ensure_private_dir(scratch)
        .map_err(|e| report::ReportError::Io { path: scratch.to_path_buf(), source: std::io::Error::other(e) })?;
    report::statistics(&spec.report_spec(&batch_file(job, batch), scratch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TestDir;
    use std::time::Duration;

    fn stats(direct: Option<&str>) -> report::Statistics {
        report::Statistics { archive: "Seq-annot ::= {}\n".into(), direct: direct.map(|d| d.as_bytes().to_vec()) }
    }

    #[test]
    fn statistics_are_claimed_once_and_saved_whole() {
        let d = TestDir::new("ahead-claim");
        let job = d.path();
        assert!(claim(job, 3), "the first claim wins");
        assert!(!claim(job, 3), "and only the first");
        assert!(claim(job, 4), "claims are per batch");
        let s = stats(Some("Lambda\n"));
        s.save(&stats_dir(job, 3)).unwrap();
        assert_eq!(report::Statistics::load(&stats_dir(job, 3)), Some(s.clone()));
        // Saving what is already there (another process was first) is no error.
        s.save(&stats_dir(job, 3)).unwrap();
        // Nothing half-written is left beside it.
        let mut names: Vec<String> = std::fs::read_dir(job).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        names.sort();
        assert_eq!(names, ["stats3", "stats3.claim", "stats4.claim"]);
    }

    #[test]
    fn a_writer_uses_saved_statistics_waits_for_claimed_ones_and_otherwise_runs_its_own() {
        let d = TestDir::new("ahead-writer");
        let job = d.path();
        // Saved: used at once.
        stats(Some("L\n")).save(&stats_dir(job, 0)).unwrap();
        assert_eq!(for_writer(job, 0, "0", Duration::ZERO), Some(stats(Some("L\n"))));
        // Saved without the direct run a pairwise report needs: not usable there.
        stats(None).save(&stats_dir(job, 1)).unwrap();
        assert_eq!(for_writer(job, 1, "0", Duration::ZERO), None);
        assert_eq!(for_writer(job, 1, "6", Duration::ZERO), Some(stats(None)));
        // Nobody has them: the writer claims them (the master will skip them).
        assert_eq!(for_writer(job, 2, "6", Duration::ZERO), None);
        assert!(!claim(job, 2));
        // Claimed by the master and saved meanwhile: the writer waits for them.
        assert!(claim(job, 5));
        let dir = stats_dir(job, 5);
        let saver = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            stats(None).save(&dir).unwrap();
        });
        assert_eq!(for_writer(job, 5, "6", Duration::from_secs(20)), Some(stats(None)));
        saver.join().unwrap();
        // Claimed and never saved (the master is stuck on it): the writer gives up waiting.
        assert!(claim(job, 6));
        assert_eq!(for_writer(job, 6, "6", Duration::from_millis(30)), None);
    }

    #[test]
    fn a_claim_whose_holder_died_is_not_waited_for() {
        let d = TestDir::new("ahead-dead");
        let job = d.path();
        // Held by a process of this host that has exited (an agent killed mid-write).
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let dead = gone.id();
        gone.wait().unwrap();
        std::fs::write(claim_path(job, 7), format!("{} {dead}\n", host_name())).unwrap();
        assert!(claim_abandoned(job, 7));
        let patience = Duration::from_secs(60);
        let asked = Instant::now();
        assert_eq!(for_writer(job, 7, "6", patience), None);
        assert!(asked.elapsed() < patience / 2, "waited {:?} for a dead holder", asked.elapsed());
        // Held by a live process here, or by any process of another host (shared
        // storage): waited for.
        assert!(claim(job, 8));
        assert_eq!(std::fs::read_to_string(claim_path(job, 8)).unwrap(), format!("{} {}\n", host_name(), std::process::id()));
        assert!(!claim_abandoned(job, 8));
        std::fs::write(claim_path(job, 9), format!("elsewhere-{} {dead}\n", host_name())).unwrap();
        assert!(!claim_abandoned(job, 9));
        // Released by a holder that failed: the writer claims them at once.
        std::fs::remove_file(claim_path(job, 8)).unwrap();
        let asked = Instant::now();
        assert_eq!(for_writer(job, 8, "6", patience), None);
        assert!(asked.elapsed() < patience / 2, "waited {:?} for a released claim", asked.elapsed());
        assert!(!claim(job, 8), "the writer holds it now");
        // A holder that has not written its name yet is alive.
        std::fs::write(claim_path(job, 10), "").unwrap();
        assert!(!claim_abandoned(job, 10));
    }
}
