//! Staged fragments under a per-node scratch budget: the eviction half of hot-swap.
//!
//! The agents stage database fragments into node-local scratch (see `plugin`), one
//! directory per fragment object. Without a budget a staged copy stays until the agent
//! stops. With one (`gepsea search --scratch-bytes`, [`JobSpec::scratch_bytes`]),
//! staging a fragment first makes room for it: copies staged earlier are removed,
//! least recently used first, until the staged bytes, the bytes other stagings have
//! reserved and the new fragment's fit the budget.
//!
//! **A fragment being searched is never removed.** The worker holds a shared `flock`
//! on the fragment's directory for as long as BLAST+ runs ([`hold`]), and the agent
//! removes a directory only under an exclusive lock it takes without waiting; a busy
//! directory is skipped. A lock dies with its process, so a killed worker cannot pin a
//! fragment for ever, and nothing has to be told when a search ends. The agent renames
//! the directory away before it removes it, still under its lock, so a worker that
//! opened it just before sees, once its own lock is granted, that the path no longer
//! names what it holds and asks the agent to stage the fragment again.
//!
//! **Recency is the directory's modification time**, set when a worker takes its lock
//! and when the agent hands the fragment out: workers reuse a staged directory without
//! asking the agent, so the agent alone could not know which copies are in use.
//!
//! Other stagings under way (their reserved bytes, a copy being handed out) are waited
//! for, briefly, when they are what stands between a staging and the budget. When the
//! fragments being searched alone leave no room, the staging still goes ahead (a
//! search cannot wait for a fragment that cannot fit): the budget is then exceeded by
//! at most those fragments, and the peak is reported. So a budget of at least
//! (workers per node + 1) × the largest fragment is never exceeded.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Where staged fragment objects live under the plug-in's scratch (see
/// `fragment_object`: `blast-fragment/<hash>/<name>`).
const FRAGMENTS: &str = "blast-fragment";

/// What making room did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Room {
    /// Staged fragments removed.
    pub evicted: u32,
    /// Bytes staged once the new fragment is in (with other stagings' reservations).
    pub staged_after: u64,
    /// Over the budget partly because of other stagings under way (reserved bytes, or
    /// a staged copy being handed out): worth trying again once they are done.
    pub others_in_the_way: bool,
}

impl Room {
    pub(crate) fn fits(&self, budget: u64) -> bool {
        self.staged_after <= budget
    }
}

/// A staged fragment directory and what it holds.
struct Staged {
    dir: PathBuf,
    object: String,
    bytes: u64,
    used: SystemTime,
}

/// Every complete staged fragment under `scratch` (half-written `.partial` and
/// `.evicting` directories are not staged fragments).
fn staged(scratch: &Path) -> Vec<Staged> {
    let mut found = Vec::new();
    let hashes = std::fs::read_dir(scratch.join(FRAGMENTS)).into_iter().flatten().flatten();
    for hash in hashes {
        for entry in std::fs::read_dir(hash.path()).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.ends_with(".partial") || name.starts_with(".evicting") {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_dir() {
                continue;
            }
            let bytes =
                std::fs::read_dir(entry.path()).into_iter().flatten().flatten().filter_map(|f| f.metadata().ok()).map(|m| m.len()).sum();
            let object = format!("{FRAGMENTS}/{}/{name}", hash.file_name().to_string_lossy());
            found.push(Staged { dir: entry.path(), object, bytes, used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH) });
        }
    }
    found
}

/// Makes room for `need` more bytes under `budget` in `scratch`, given `reserved`
/// bytes that other stagings under way will add: removes staged fragments, least
/// recently used first, never `keep` (the object being staged), an object for which
/// `busy` says true (being staged or handed out right now) or a directory a worker
/// holds ([`hold`]). The caller serializes calls (the reservations must not change
/// meanwhile).
pub(crate) fn make_room(scratch: &Path, keep: &str, need: u64, reserved: u64, budget: u64, busy: impl Fn(&str) -> bool) -> Room {
    let mut all = staged(scratch);
    let mut total: u64 = all.iter().map(|s| s.bytes).sum();
    all.sort_by_key(|s| s.used);
    let mut evicted = 0;
    let mut skipped_busy = false;
    for s in all {
        if total + reserved + need <= budget {
            break;
        }
        if s.object == keep {
            continue;
        }
        if busy(&s.object) {
            skipped_busy = true;
            continue;
        }
        if remove_unless_held(&s.dir).unwrap_or_else(|e| {
            tracing::warn!("blast plug-in: could not remove the staged fragment {}: {e}", s.dir.display());
            false
        }) {
            total -= s.bytes;
            evicted += 1;
        }
    }
    let staged_after = total + reserved + need;
    Room { evicted, staged_after, others_in_the_way: staged_after > budget && (reserved > 0 || skipped_busy) }
}

/// Removes the staged directory `dir` if no worker holds it; true if removed.
fn remove_unless_held(dir: &Path) -> io::Result<bool> {
    let f = match File::open(dir) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    match f.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(false),
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    // Out of the way first, under the lock: a worker that opened `dir` before sees the
    // path gone once its lock is granted (see `hold`).
    // Unique, so that what a crash left half removed never blocks the next eviction.
    static EVICTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = EVICTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let away = dir.with_file_name(format!(".evicting-{name}-{}-{n}", std::process::id()));
    std::fs::rename(dir, &away)?;
    std::fs::remove_dir_all(&away)?;
    Ok(true)
}

/// Marks the staged directory `dir` as just used (its modification time).
pub(crate) fn touch(dir: &Path) {
    if let Ok(f) = File::open(dir) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// A worker's hold on a staged fragment directory: while it lives, no agent removes
/// the directory (see the module docs). `Ok(None)`: the directory is gone (removed to
/// make room); ask the agent to stage the fragment again.
pub fn hold(dir: &Path) -> io::Result<Option<File>> {
    let f = match File::open(dir) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // Waits only while an agent is removing this very directory.
    f.lock_shared()?;
    let held = f.metadata()?;
    match std::fs::metadata(dir) {
        Ok(now) if (now.dev(), now.ino()) == (held.dev(), held.ino()) => {}
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    }
    let _ = f.set_modified(SystemTime::now());
    Ok(Some(f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::test_dir::TestDir;

    /// A staged fragment `object` of `bytes` bytes, last used `age` seconds ago.
    fn stage(scratch: &Path, object: &str, bytes: usize, age: u64) -> PathBuf {
        let dir = scratch.join(object);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f.pin"), vec![7u8; bytes]).unwrap();
        File::open(&dir).unwrap().set_modified(SystemTime::now() - Duration::from_secs(age)).unwrap();
        dir
    }

    fn left(scratch: &Path) -> Vec<String> {
        let mut v: Vec<String> = staged(scratch).into_iter().map(|s| s.object).collect();
        v.sort();
        v
    }

    #[test]
    fn least_recently_used_go_first_and_held_or_busy_ones_stay() {
        let t = TestDir::new("scratch-lru");
        let s = t.path();
        let a = stage(s, "blast-fragment/aa/db.00", 100, 40);
        let _b = stage(s, "blast-fragment/bb/db.01", 100, 30);
        let _c = stage(s, "blast-fragment/cc/db.02", 100, 20);
        let _d = stage(s, "blast-fragment/dd/db.03", 100, 10);
        // A half-written staging is not counted and not touched.
        std::fs::create_dir_all(s.join("blast-fragment/ee/db.partial")).unwrap();
        // Room for 100 under 300: 400 + 100 must fall to 300, two go. The oldest is
        // held by a worker and the next is being staged (busy): the two after them go.
        let held = hold(&a).unwrap().expect("staged");
        let room = make_room(s, "blast-fragment/zz/db.09", 100, 0, 300, |o| o == "blast-fragment/bb/db.01");
        assert_eq!(room, Room { evicted: 2, staged_after: 300, others_in_the_way: false });
        // Taking the hold made the held one the most recently used.
        assert_eq!(left(s), ["blast-fragment/aa/db.00", "blast-fragment/bb/db.01"]);
        assert!(s.join("blast-fragment/ee/db.partial").is_dir());
        // Nothing else may go: over budget by what is held and busy.
        // Another staging's reservation and the busy one are in the way; the held one
        // alone would not be (a search can take long).
        let room = make_room(s, "blast-fragment/zz/db.09", 100, 50, 100, |o| o == "blast-fragment/bb/db.01");
        assert_eq!(room, Room { evicted: 0, staged_after: 350, others_in_the_way: true });
        let room = make_room(s, "blast-fragment/zz/db.09", 100, 0, 100, |_| false);
        assert_eq!(room, Room { evicted: 1, staged_after: 200, others_in_the_way: false }, "bb goes, aa is held");
        stage(s, "blast-fragment/bb/db.01", 100, 30);
        drop(held);
        let room = make_room(s, "blast-fragment/zz/db.09", 100, 0, 250, |_| false);
        assert_eq!(room, Room { evicted: 1, staged_after: 200, others_in_the_way: false });
        assert_eq!(left(s), ["blast-fragment/aa/db.00"], "the least recently used, bb, went");
        // Nothing is removed when it fits.
        assert_eq!(make_room(s, "x", 1, 0, 1000, |_| false), Room { evicted: 0, staged_after: 101, others_in_the_way: false });
    }

    #[test]
    fn a_hold_on_a_removed_or_replaced_directory_says_so() {
        let t = TestDir::new("scratch-hold");
        let s = t.path();
        let a = stage(s, "blast-fragment/aa/db.00", 10, 0);
        // Opened before it is removed and staged again: not what the path names now.
        let opened = File::open(&a).unwrap();
        assert!(remove_unless_held(&a).unwrap());
        assert!(hold(&a).unwrap().is_none());
        stage(s, "blast-fragment/aa/db.00", 10, 0);
        opened.lock_shared().unwrap();
        assert_ne!(opened.metadata().unwrap().ino(), std::fs::metadata(&a).unwrap().ino());
        let h = hold(&a).unwrap().expect("staged again");
        assert!(!remove_unless_held(&a).unwrap(), "held by a worker");
        drop(h);
        assert!(remove_unless_held(&a).unwrap());
        assert!(!a.exists());
    }
}
