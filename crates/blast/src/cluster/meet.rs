//! Node identity by rendezvous: the processes of one launch find out which of them
//! share a node, and number the nodes 1..=N, through files in a directory every node
//! sees. Nothing depends on how the launcher placed ranks.
//!
//! A node is a *host key*: the host name plus the network namespace (two containers or
//! namespaces on one machine are two nodes; two processes in one namespace are one).
//! The protocol uses only operations that are atomic on local and network file systems
//! (exclusive create, rename), never locks:
//!
//! 1. every process tries to create `hosts/<key>.claim` exclusively; the one that
//!    succeeds is its node's *leader* (it starts the node's agent);
//! 2. the leader takes the lowest free node id by creating `ids/<n>` exclusively, and
//!    publishes it as `hosts/<key>.node` (written aside, renamed into place);
//! 3. every process waits for its node's id and reports `ranks/<rank>`;
//! 4. leaders wait for all ranks, count the nodes and check the count against what the
//!    launcher says (processes on this node, nodes in the job), so two machines that
//!    look alike fail with a message instead of sharing an agent.
//!
//! Ids are dense because a leader never gives one back. The directory belongs to one
//! launch (its name carries the launcher's job id); rank 0 removes it at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// What went wrong while the processes of a launch were meeting.
#[derive(Debug, thiserror::Error)]
pub enum MeetError {
    #[error("rendezvous directory {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("rendezvous {dir}: waited {secs} s for {what}; are all ranks of the job running, and does every node see this directory (it must be on a shared file system)?")]
    Timeout { dir: PathBuf, secs: u64, what: String },
    #[error("rendezvous {dir}: {problem}")]
    Inconsistent { dir: PathBuf, problem: String },
}

/// This process's place among the nodes of the launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meeting {
    /// This node's id, 1..=nodes.
    pub node: u32,
    /// Whether this process starts (and stops) its node's agent.
    pub leader: bool,
    /// Nodes in the job (known to leaders only: the others need not wait for every rank).
    pub nodes: Option<usize>,
}

/// What a process brings to the meeting.
#[derive(Clone, Debug)]
pub struct Arrival<'a> {
    pub rank: usize,
    pub size: usize,
    /// Identifies the node this process runs on ([`host_key`]).
    pub host: &'a str,
    /// Processes on this node, and nodes in the job, where the launcher says.
    pub local_size: Option<usize>,
    pub nodes: Option<usize>,
}

/// This host's key: host name and network namespace.
pub fn host_key() -> String {
    // The UTS name (what gethostname(2) returns), read without FFI.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "unknown-host".into());
    use std::os::unix::fs::MetadataExt;
    let netns = std::fs::metadata("/proc/self/ns/net").map(|m| m.ino()).unwrap_or(0);
    format!("{host}/netns:{netns}")
}

fn file_name_of(key: &str) -> String {
    let h = Sha256::digest(key.as_bytes());
    h[..12].iter().map(|b| format!("{b:02x}")).collect()
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> MeetError + '_ {
    move |source| MeetError::Io { path: path.to_path_buf(), source }
}

/// Creates `path` with `text` only if it does not exist; `Ok(false)` if it did.
fn create_exclusive(path: &Path, text: &str) -> Result<bool, MeetError> {
    match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(mut f) => {
            f.write_all(text.as_bytes()).map_err(io(path))?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io(path)(e)),
    }
}

/// Writes `path` so readers see all of `text` or nothing.
fn publish(path: &Path, text: &str) -> Result<(), MeetError> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path)).map_err(io(path))
}

fn wait_for<T>(
    dir: &Path,
    timeout: Duration,
    what: impl Fn() -> String,
    mut poll: impl FnMut() -> Result<Option<T>, MeetError>,
) -> Result<T, MeetError> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(2);
    loop {
        if let Some(v) = poll()? {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(MeetError::Timeout { dir: dir.to_path_buf(), secs: timeout.as_secs(), what: what() });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Meets the other processes of the launch in `dir` (this launch's own directory).
pub fn meet(dir: &Path, me: &Arrival<'_>, timeout: Duration) -> Result<Meeting, MeetError> {
    let (hosts, ids, ranks) = (dir.join("hosts"), dir.join("ids"), dir.join("ranks"));
    for d in [&hosts, &ids, &ranks] {
        std::fs::create_dir_all(d).map_err(io(d))?;
    }
    let name = file_name_of(me.host);
    let node_file = hosts.join(format!("{name}.node"));
    let leader = create_exclusive(&hosts.join(format!("{name}.claim")), &format!("{}\nrank {}\n", me.host, me.rank))?;
    let node = if leader {
        let mut n = 1u32;
        while !create_exclusive(&ids.join(n.to_string()), &format!("{}\n", me.host))? {
            n += 1;
        }
        publish(&node_file, &format!("{n}\n"))?;
        n
    } else {
        wait_for(
            dir,
            timeout,
            || format!("the first process on host {} to publish the node id", me.host),
            || match std::fs::read_to_string(&node_file) {
                Ok(t) => Ok(t.trim().parse::<u32>().ok()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(io(&node_file)(e)),
            },
        )?
    };
    publish(&ranks.join(me.rank.to_string()), &format!("{node}\n"))?;
    if !leader {
        return Ok(Meeting { node, leader, nodes: None });
    }
    // Every rank's node, once all have reported.
    let node_of = wait_for(
        dir,
        timeout,
        || {
            let seen: BTreeSet<usize> =
                std::fs::read_dir(&ranks).into_iter().flatten().flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
            let missing: Vec<String> = (0..me.size).filter(|r| !seen.contains(r)).take(8).map(|r| r.to_string()).collect();
            format!("ranks {} (of {}) to report", missing.join(", "), me.size)
        },
        || {
            let mut got = BTreeMap::new();
            for e in std::fs::read_dir(&ranks).map_err(io(&ranks))?.flatten() {
                let Some(r) = e.file_name().to_str().and_then(|s| s.parse::<usize>().ok()) else { continue };
                if let Some(n) = std::fs::read_to_string(e.path()).ok().and_then(|t| t.trim().parse::<u32>().ok()) {
                    got.insert(r, n);
                }
            }
            Ok((got.len() >= me.size).then_some(got))
        },
    )?;
    let inconsistent = |problem: String| MeetError::Inconsistent { dir: dir.to_path_buf(), problem };
    if let Some(r) = node_of.keys().find(|r| **r >= me.size) {
        return Err(inconsistent(format!("rank {r} reported, but the job has {} ranks: is another launch using this directory?", me.size)));
    }
    let nodes: BTreeSet<u32> = node_of.values().copied().collect();
    if nodes.iter().copied().ne(1..=nodes.len() as u32) {
        return Err(inconsistent(format!("node ids {nodes:?} are not 1..={}", nodes.len())));
    }
    let here = node_of.values().filter(|n| **n == node).count();
    if let Some(want) = me.local_size.filter(|w| *w != here) {
        return Err(inconsistent(format!(
            "{here} ranks identify themselves as host {}, but the launcher puts {want} on each node of it: two nodes share a host name and network namespace; give them distinct host names",
            me.host
        )));
    }
    if let Some(want) = me.nodes.filter(|w| *w != nodes.len()) {
        return Err(inconsistent(format!(
            "the ranks came from {} distinct hosts, but the launcher says the job has {want} nodes",
            nodes.len()
        )));
    }
    Ok(Meeting { node, leader, nodes: Some(nodes.len()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn scratch(tag: &str) -> Dir {
        Dir(std::env::temp_dir().join(format!("gepsea-meet-{tag}-{}", std::process::id())))
    }

    /// `placement[rank]` is the host of each rank; all ranks meet concurrently.
    fn meet_all(
        dir: &Path,
        placement: &[&'static str],
        local_size: impl Fn(&str) -> Option<usize>,
        nodes: Option<usize>,
    ) -> Vec<Result<Meeting, String>> {
        let size = placement.len();
        let handles: Vec<_> = placement
            .iter()
            .enumerate()
            .map(|(rank, host)| {
                let (dir, host, local) = (dir.to_path_buf(), *host, local_size(host));
                std::thread::spawn(move || {
                    meet(&dir, &Arrival { rank, size, host, local_size: local, nodes }, Duration::from_secs(20)).map_err(|e| e.to_string())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn round_robin_placement_gives_each_host_one_id_and_one_leader() {
        let d = scratch("rr");
        // mpirun --map-by node on 3 hosts: ranks cycle over the hosts.
        let placement = ["a", "b", "c", "a", "b", "c", "a"];
        let got: Vec<Meeting> =
            meet_all(&d.0, &placement, |h| Some(if h == "a" { 3 } else { 2 }), Some(3)).into_iter().map(Result::unwrap).collect();
        let mut id_of = BTreeMap::new();
        for (m, host) in got.iter().zip(placement) {
            assert_eq!(*id_of.entry(host).or_insert(m.node), m.node, "host {host} got two ids");
            if m.leader {
                assert_eq!(m.nodes, Some(3));
            }
        }
        let ids: BTreeSet<u32> = id_of.values().copied().collect();
        assert_eq!(ids, BTreeSet::from([1, 2, 3]), "ids must be dense");
        for host in ["a", "b", "c"] {
            let leaders = got.iter().zip(placement).filter(|(m, h)| *h == host && m.leader).count();
            assert_eq!(leaders, 1, "host {host}");
        }
    }

    #[test]
    fn hosts_that_look_alike_are_reported_not_merged() {
        let d = scratch("alike");
        // Two machines both calling themselves "a" (2 ranks each per the launcher).
        let got = meet_all(&d.0, &["a", "a", "a", "a"], |_| Some(2), None);
        let leader_err = got.iter().find_map(|r| r.as_ref().err()).expect("the leader must refuse");
        assert!(leader_err.contains("4 ranks identify themselves as host a, but the launcher puts 2"), "{leader_err}");
        let d = scratch("count");
        let got = meet_all(&d.0, &["a", "b"], |_| None, Some(3));
        assert!(
            got.iter().any(|r| r.as_ref().is_err_and(|e| e.contains("2 distinct hosts, but the launcher says the job has 3 nodes"))),
            "{got:?}"
        );
    }

    #[test]
    fn a_missing_rank_times_out_with_the_ranks_named() {
        let d = scratch("missing");
        let e = meet(&d.0, &Arrival { rank: 0, size: 3, host: "a", local_size: None, nodes: None }, Duration::from_millis(300))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ranks 1, 2 (of 3) to report") && e.contains("shared file system"), "{e}");
    }

    #[test]
    fn the_host_key_tells_network_namespaces_apart() {
        let k = host_key();
        assert!(k.contains("/netns:") && !k.ends_with(":0"), "{k}");
        assert_eq!(k, host_key());
    }
}
