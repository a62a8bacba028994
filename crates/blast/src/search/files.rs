//! The files a search leaves around its output: the work directory (kept for a
//! rerun), the temporary output, scratch and job directories, removed on the way out
//! (also after a signal), and leftovers of killed runs swept when their process is gone.

use std::path::{Path, PathBuf};
use std::process::Child;

use super::SearchError;
use crate::db::Database;

pub(crate) fn work_dir_name(out_name: &str) -> String {
    format!(".{out_name}.gepsea-work")
}

/// The work directory a search of `out` uses when none is given.
pub(crate) fn default_work_dir(out: &Path) -> Option<PathBuf> {
    let dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    Some(std::fs::canonicalize(dir).ok()?.join(work_dir_name(&out.file_name()?.to_string_lossy())))
}

/// A search's hold on its default work directory, for as long as it lives: two
/// searches of one output shared that directory, and the first to finish removed it
/// under the other, which then failed with "lost contact with the agent" and a missing
/// part. An `flock` on `work_dir/lock`, which the kernel releases however the holder
/// ends, so a killed search's rerun takes it at once (or within moments: see `take`). The holder's pid is written in
/// the file for the refusal to name.
pub(crate) struct WorkDirLock {
    _file: std::fs::File,
}

/// How long [`WorkDirLock::take`] waits for the lock of a holder that is gone.
const GONE_HOLDER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

impl WorkDirLock {
    /// Takes the lock, creating `work_dir` if needed. `Err(holder)`: another search
    /// holds it. `Ok(None)`: no lock could be made (the directory cannot be created,
    /// which the search reports itself, or a file system without locks): the search
    /// goes on as before.
    pub(crate) fn take(work_dir: &Path) -> Result<Option<WorkDirLock>, Option<u32>> {
        use rustix::fs::{flock, FlockOperation};
        use std::io::{Read, Seek, Write};
        if std::fs::create_dir_all(work_dir).is_err() {
            return Ok(None);
        }
        let path = work_dir.join("lock");
        let Ok(mut file) = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path) else {
            return Ok(None);
        };
        // A holder killed outright can leave its lock behind for a moment: a child it
        // was starting holds a copy of the descriptor between fork and exec (or until
        // it sees its parent gone and stops). A rerun right after the kill waits for
        // that, up to `GONE_HOLDER_PATIENCE`, instead of being refused in the name of a
        // dead search.
        let deadline = std::time::Instant::now() + GONE_HOLDER_PATIENCE;
        loop {
            match flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {
                    let _ = file.set_len(0).and_then(|()| file.rewind()).and_then(|()| write!(file, "{}", std::process::id()));
                    return Ok(Some(WorkDirLock { _file: file }));
                }
                Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                    let mut text = String::new();
                    let _ = file.rewind().and_then(|()| file.read_to_string(&mut text));
                    let holder: Option<u32> = text.trim().parse().ok();
                    if holder.is_some_and(crate::tools::process_gone) && std::time::Instant::now() < deadline {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                        continue;
                    }
                    return Err(holder);
                }
                Err(_) => return Ok(None),
            }
        }
    }
}

/// A search's share of a work directory the user gave (`--work-dir`), which several
/// searches may use at once as a cache: each holds a shared `flock` on the directory
/// itself (no file of ours among the user's) for as long as it lives, and removes
/// finished parts (its own
/// at the end, older ones for `--no-resume`) only when it alone holds it. Parts are
/// keyed by what decides their content, so two searches of the same batches write the
/// same parts; without this the first to finish removed the other's, which then failed
/// for a missing part. The kernel drops the lock however its holder ends.
pub(crate) struct SharedWorkDir {
    /// `None`: no lock could be made (a file system without locks); the search then
    /// removes what it would have removed anyway, as before.
    file: Option<std::fs::File>,
}

impl SharedWorkDir {
    pub(crate) fn join(work_dir: &Path) -> SharedWorkDir {
        use rustix::fs::{flock, FlockOperation};
        let file = std::fs::create_dir_all(work_dir)
            .and_then(|()| std::fs::File::open(work_dir))
            .ok()
            .filter(|f| flock(f, FlockOperation::LockShared).is_ok());
        SharedWorkDir { file }
    }

    /// Whether no other search is using the directory now. If so, this search keeps it
    /// to itself from here on (an exclusive lock), so that none starts using parts it is
    /// about to remove; if not, it goes on sharing it (a failed conversion may have
    /// dropped the shared lock: it is taken again).
    pub(crate) fn alone(&self) -> bool {
        self.exclusive_or(rustix::fs::FlockOperation::LockShared)
    }

    /// Whether this search, done with the directory's parts, is the last one using it
    /// (then it keeps it to itself, as [`SharedWorkDir::alone`]). A search that is not
    /// lets go of the directory instead of sharing it again, so that of two searches
    /// finishing at the same moment the later check finds it free: sharing it again,
    /// each saw the other's lock and both left the parts.
    pub(crate) fn last_to_leave(&self) -> bool {
        self.exclusive_or(rustix::fs::FlockOperation::Unlock)
    }

    /// Takes the directory's lock exclusively if no other search holds it; otherwise
    /// applies `otherwise` to this search's lock and returns false.
    fn exclusive_or(&self, otherwise: rustix::fs::FlockOperation) -> bool {
        use rustix::fs::{flock, FlockOperation};
        let Some(f) = &self.file else { return true };
        if flock(f, FlockOperation::NonBlockingLockExclusive).is_ok() {
            return true;
        }
        let _ = flock(f, otherwise);
        false
    }
}

/// What an existing `out` would destroy if the search's output replaced it: the
/// query file, or a file of the database (one in a gepsea database's directory, or of
/// a BLAST database's volumes). `None` when `out` is none of them (or does not exist).
pub(crate) fn clobbered_input(out: &Path, query: &Path, database: &Database) -> Option<&'static str> {
    let meta = std::fs::metadata(out).ok()?;
    if crate::tools::same_file(out, query) {
        return Some("the query file");
    }
    let canonical = std::fs::canonicalize(out).ok()?;
    let (dir, name) = (canonical.parent()?, canonical.file_name()?.to_string_lossy().into_owned());
    let in_database = match &database.manifest.external {
        // Everything in a gepsea database's directory is the database.
        None => meta.is_file() && dir == database.dir,
        // A volume `/path/name` has files `/path/name.*`.
        Some(ext) => volumes(&ext.info).any(|v| {
            let v = Path::new(v);
            v.parent() == Some(dir) && v.file_name().is_some_and(|stem| name.starts_with(&format!("{}.", stem.to_string_lossy())))
        }),
    };
    in_database.then_some("a file of the database")
}

/// The volume paths `blastdbcmd -info` lists after its `Volumes:` line.
fn volumes(info: &str) -> impl Iterator<Item = &str> {
    info.lines().skip_while(|l| l.trim() != "Volumes:").skip(1).map(str::trim).filter(|l| !l.is_empty())
}

/// A local search's own runtime namespace is `search<pid>`.
pub(crate) const NAMESPACE_PREFIX: &str = "search";
/// The file that marks a namespace as a search's own, made before anything runs in it.
pub(crate) const NAMESPACE_MARK: &str = ".gepsea-search";

/// Makes search `pid`'s own runtime namespace, private, and marks it as the search's
/// (so that the sweep of a later search removes it if this one is killed, and nothing
/// that merely has its name): its name and directory.
pub(crate) fn own_namespace(pid: u32) -> Result<(String, PathBuf), SearchError> {
    let name = format!("{NAMESPACE_PREFIX}{pid}");
    let dir = gepsea_net::namespace_dir(&name);
    gepsea_net::trust::ensure_private_dir(&dir)?;
    let mark = dir.join(NAMESPACE_MARK);
    std::fs::write(&mark, b"").map_err(|e| SearchError::Io(format!("{}: {e}", mark.display())))?;
    Ok((name, dir))
}

/// Removes what a search killed outright (SIGKILL, node loss) left behind: its
/// temporary output next to `out_name`, its job directory there, its scratch and
/// namespace directories in this user's runtime root — only those whose process is
/// gone.
pub(crate) fn sweep_stale(out_dir: &Path, out_name: &str) {
    let runtime = gepsea_net::trust::user_runtime_root();
    // A local search's namespace (`search<pid>`), if the search marked it as its own:
    // a user's agents may run in a namespace of that name too.
    crate::tools::remove_leftovers_of_gone_if(&runtime, &[NAMESPACE_PREFIX], |ns| ns.join(NAMESPACE_MARK).is_file());
    let tmp_prefix = format!(".{out_name}.gepsea-tmp");
    for (dir, prefixes) in [
        (out_dir, vec![tmp_prefix.as_str(), ".gepsea-job-"]),
        // Scratch of a master
        // (`gepsea-search-`, `gepsea-report-`, its statistics runs' `gepsea-stats-`), of
        // a worker on this node (`gepsea-worker-`), of a search into standard output or
        // a device (`gepsea-stream-`).
        (
            runtime.as_path(),
            vec!["gepsea-search-", "gepsea-report-", "gepsea-worker-", "gepsea-stream-", crate::accel::ahead::SCRATCH_PREFIX],
        ),
    ] {
        crate::tools::remove_leftovers_of_gone(dir, &prefixes);
    }
}

/// Removes the scratch directory and any temporary output, also on failure.
pub(crate) struct Cleanup {
    pub(crate) scratch: PathBuf,
    pub(crate) tmp_out: PathBuf,
    pub(crate) children: Vec<Child>,
    pub(crate) namespace: PathBuf,
}

impl Cleanup {
    /// Kills and reaps the children started so far.
    pub(crate) fn stop_children(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.stop_children();
        let _ = std::fs::remove_dir_all(&self.scratch);
        let _ = std::fs::remove_file(&self.tmp_out);
        // Killed workers leave their sockets behind; the namespace is ours alone.
        let _ = std::fs::remove_dir_all(&self.namespace);
    }
}

pub(crate) struct RemoveDir(pub(crate) PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::SharedWorkDir;

    #[test]
    fn of_two_searches_finishing_together_the_later_removes_the_parts() {
        let dir = std::env::temp_dir().join(format!("gepsea-shared-work-{}", std::process::id()));
        // Each `join` opens the directory anew: two searches' locks, as between processes.
        let (a, b) = (SharedWorkDir::join(&dir), SharedWorkDir::join(&dir));
        assert!(a.file.is_some() && b.file.is_some(), "this file system takes locks");
        assert!(!a.last_to_leave(), "b still uses the directory");
        assert!(b.last_to_leave(), "a let go: b is the last");
        drop((a, b));
        // A search still running keeps the parts from one that finishes, which lets go.
        let (running, finishing) = (SharedWorkDir::join(&dir), SharedWorkDir::join(&dir));
        assert!(!finishing.last_to_leave());
        assert!(running.alone(), "the finished search let go of the directory");
        drop((running, finishing));
        std::fs::remove_dir(&dir).unwrap();
    }
}
