//! The mpiBLAST baseline without agents (`--no-agent`): the messages between master
//! and workers over gepsea-net, the worker's loop, and the master's per-query merge
//! state. The master's loop is [`super::baseline`].

use std::path::{Path, PathBuf};
use std::time::Instant;

use gepsea_net::{Addr, NetError, Port, PortConfig};
use serde::{Deserialize, Serialize};

use crate::archive;
use crate::error::SearchError;
use crate::tools::{self, ToolError};

pub(crate) const MASTER: Addr = Addr::new(0, 0);

pub(crate) const TAG_CTRL: u64 = 1;

pub(crate) const TAG_DATA: u64 = 2;

pub(crate) const TAG_TASK: u64 = 3;

pub(crate) const TAG_SHUTDOWN: u64 = 4;

#[derive(Serialize, Deserialize, Debug)]
pub(crate) enum Ctrl {
    Hello,
    Result { task: usize, len: usize, blast_seconds: f64 },
    Failed { task: usize, message: String },
}

#[derive(Serialize, Deserialize, Debug)]
pub(crate) struct TaskMsg {
    pub(crate) task: usize,
    pub(crate) query_file: PathBuf,
    pub(crate) database: String,
    /// `BLASTDB` for the run (the master resolved the database; workers need not).
    pub(crate) blastdb: String,
    pub(crate) program: String,
    /// Search runs are recorded or replayed ([`crate::replay`]).
    #[serde(default)]
    pub(crate) recording: Option<crate::replay::Recording>,
}

/// Each query's final hits (HSP texts numbered within the query's batch), held only
/// until its batch is settled: then the batch's part of the report is written and its
/// hits dropped, so the master never holds the whole report.
pub(crate) struct QueryResults {
    hsps: Vec<Option<Vec<String>>>,
    ranges: Vec<std::ops::Range<usize>>,
    /// Queries of each batch not yet settled.
    left: Vec<usize>,
    /// Batches whose part is written (late duplicates of their results are ignored).
    pub(crate) written: Vec<bool>,
    /// Batches settled since the last [`QueryResults::take_settled`].
    settled: Vec<usize>,
    pub(crate) hits: usize,
}

impl QueryResults {
    pub(crate) fn new(n: usize, ranges: &[std::ops::Range<usize>]) -> Self {
        QueryResults {
            hsps: vec![None; n],
            ranges: ranges.to_vec(),
            left: ranges.iter().map(|r| r.len()).collect(),
            written: vec![false; ranges.len()],
            settled: Vec::new(),
            hits: 0,
        }
    }

    /// Records query `g`'s hits (in final order), renumbering them to its place in its
    /// batch (`Query_<local+1>`), as the batch's own report numbers it.
    pub(crate) fn store(&mut self, g: usize, hits: &[archive::Hit]) {
        let b = self.ranges.partition_point(|r| r.end <= g);
        if self.written[b] || self.hsps[g].is_some() {
            return;
        }
        let local = g - self.ranges[b].start;
        self.hits += hits.len();
        self.hsps[g] = Some(hits.iter().flat_map(|h| h.hsps.iter().map(|s| archive::renumber(s, local + 1))).collect());
        self.left[b] -= 1;
        if self.left[b] == 0 {
            self.settled.push(b);
        }
    }

    /// The batches settled since the last call, each with its HSPs (dropped from here).
    pub(crate) fn take_settled(&mut self) -> Vec<(usize, Vec<String>)> {
        let settled = std::mem::take(&mut self.settled);
        settled
            .into_iter()
            .map(|b| {
                self.written[b] = true;
                let hsps = self.ranges[b].clone().flat_map(|g| self.hsps[g].take().unwrap_or_default()).collect();
                (b, hsps)
            })
            .collect()
    }
}

/// How the master and workers of a cluster run without agents meet.
#[derive(Clone, Debug)]
pub struct ClusterNet {
    /// The job's gepsea-net namespace (the same in every process).
    pub namespace: String,
    /// This process's address on the network the processes talk over.
    pub ip: std::net::IpAddr,
    /// A shared directory where every port publishes its TCP address.
    pub directory: PathBuf,
    /// Worker processes (rank 0 only).
    pub workers: usize,
    /// The launch's key: the master and workers authenticate their TCP links with it.
    pub key: Option<gepsea_net::auth::Key>,
}

/// The hidden `gepsea worker` process: searches whatever the master sends.
pub fn worker(ns: &str, port_id: u32, scratch: &Path, blast_args: &[String]) -> Result<(), SearchError> {
    worker_on(Port::open(PortConfig::new(ns, Addr::new(MASTER.node, port_id)))?, scratch, blast_args)
}

pub(crate) fn worker_on(port: Port, scratch: &Path, blast_args: &[String]) -> Result<(), SearchError> {
    port.send(MASTER, TAG_CTRL, serde_json::to_vec(&Ctrl::Hello).unwrap())?;
    loop {
        let m = match port.recv(Some(MASTER), None, 1 << 20) {
            Ok(m) => m,
            // The master is gone: nothing left to do.
            Err(NetError::PeerFailed { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if m.tag == TAG_SHUTDOWN {
            return Ok(());
        }
        let t: TaskMsg = serde_json::from_slice(&m.data).map_err(|e| SearchError::Io(format!("bad task message: {e}")))?;
        let q = t.query_file.to_string_lossy().to_string();
        let mut args: Vec<&str> = vec!["-query", &q, "-db", &t.database, "-outfmt", "11"];
        args.extend(blast_args.iter().map(|s| s.as_str()));
        let started = Instant::now();
        match crate::replay::run_search(t.recording.as_ref(), &t.program, &args, Some(t.blastdb.as_ref()), Some(scratch)) {
            Ok(out) => {
                let secs = started.elapsed().as_secs_f64();
                let header = Ctrl::Result { task: t.task, len: out.stdout.len(), blast_seconds: secs };
                port.send(MASTER, TAG_CTRL, serde_json::to_vec(&header).unwrap())?;
                port.send(MASTER, TAG_DATA, out.stdout)?;
            }
            Err(e) => {
                let message = match e {
                    ToolError::Failed { stderr, .. } => tools::error_lines(&stderr),
                    other => other.to_string(),
                };
                port.send(MASTER, TAG_CTRL, serde_json::to_vec(&Ctrl::Failed { task: t.task, message }).unwrap())?;
            }
        }
    }
}

/// Merges one batch's fragment archives into per-query hit lists. Returns the global
/// indices of queries that must be searched on the whole database instead.
pub(crate) fn merge_batch(
    archives: &[Option<String>],
    range: std::ops::Range<usize>,
    k: usize,
    prelim: usize,
    results: &mut QueryResults,
    task: usize,
) -> Result<Vec<usize>, SearchError> {
    let nq = range.len();
    let parsed: Vec<Vec<archive::Hsp>> = archives
        .iter()
        .map(|a| archive::hsps(a.as_deref().unwrap()).map_err(|error| SearchError::BadArchive { task, error }))
        .collect::<Result<_, _>>()?;
    let mut per_frag: Vec<Vec<Vec<archive::Hit>>> = parsed.iter().enumerate().map(|(f, h)| archive::hits_by_query(h, f, nq)).collect();
    let mut risky = Vec::new();
    for local in 0..nq {
        let g = range.start + local;
        let lists: Vec<Vec<archive::Hit>> = per_frag.iter_mut().map(|f| std::mem::take(&mut f[local])).collect();
        let total: usize = lists.iter().map(|l| l.len()).sum();
        let largest = lists.iter().map(|l| l.len()).max().unwrap_or(0);
        if crate::plan::may_overflow(lists.len(), total as u64, largest, prelim, k) {
            risky.push(g);
            continue;
        }
        results.store(g, &archive::merge_query(lists, k));
    }
    Ok(risky)
}
