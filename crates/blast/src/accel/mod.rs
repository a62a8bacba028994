//! `gepsea search` accelerated by the agents (the GePSeA case study).
//!
//! Everything that is not searching is offloaded to the agents:
//!
//! - **Scheduling** is the agents' load-balancing primitive: the master submits one task
//!   per (query batch, fragment), batch by batch; workers `take` them, so faster
//!   workers get more, and batches complete one after another.
//! - **Asynchronous output consolidation**: a worker hands each raw result (`-outfmt
//!   11` archive) to its node's agent — the [`BlastPlugin`] — and goes straight on to
//!   its next task. The plug-in parses it there (see `hits`) and sends the hits to the
//!   batch's *merger* agent (compressed with zstd when they cross nodes), which merges
//!   them with the sort/merge component as fragments arrive, submits a query whose
//!   serial search might have overflowed BLAST's preliminary list as an urgent
//!   whole-database search as soon as the fragments in so far say so (the guard's
//!   counts only grow), settles every other query when the batch's last fragment is in,
//!   and then has a writer thread write the batch's share of the report as a part file in the
//!   output's directory. Which agent merges a batch is decided by the load balancer
//!   (dynamic: the agent with the fewest batches in hand; recorded on the bulletin
//!   board), or statically (batch number modulo the agents), or one agent for all,
//!   for the benchmark.
//! - **Hot-swap database fragments**: before searching a fragment a worker asks its
//!   agent to *stage* it: the agent copies the fragment into node-local scratch from
//!   wherever it is closest — already staged on this node, in this agent's memory, in
//!   another agent's memory (the distributed cache finds the holder through its
//!   directory), or, only if no node has it yet, the shared database directory — and
//!   checks every file against the manifest's SHA-256 first. At the start of a job the
//!   master asks every agent to prefetch the fragments it will search first (fragment
//!   `f` to the `f mod n`-th node), and tasks name their fragment, so the scheduler
//!   hands a task to a worker whose node already holds its fragment.
//! - **Output in place**: the output is the batches' *pieces* end to end (a part with
//!   the headers and footers that only the first and last batch keep, XML iterations
//!   renumbered, `crate::parts::piece`), identical to serial BLAST+. The writer that
//!   formats a part keeps its piece, and the master, which gives each piece its offset
//!   once the lengths before it are known, has the holder write it there while the
//!   search goes on; the master writes only what no agent holds.
//!
//! Files live in a job directory next to the output, so that agents on every node can
//! write their parts straight to the output location.

use std::collections::BTreeMap;
use std::path::PathBuf;

use gepsea_agent::plugin::PluginError;
use serde::{Deserialize, Serialize};

use crate::plan::*;

pub(crate) mod ahead;
mod hits;
mod local;
mod master;
mod plugin;
pub(crate) mod scratch;
mod worker;
mod writer;

use self::master::submit_task;
use self::plugin::failed;

pub(crate) use self::local::MAX_AGENT_RESTARTS;
pub use self::local::{with_parent_death, LocalAgent};
pub use self::master::master;
pub use self::plugin::BlastPlugin;
pub use self::worker::worker;
pub use crate::parts::{assemble, count_hits, join, Assembler};
pub use crate::plan::{batch_file, part_tmp, topic, JobSpec, MergeAssign, TaskPayload};

/// A failed request to the agent as a search error: a lost connection as
/// [`crate::error::SearchError::AgentLost`], which the search tells apart (its own
/// agent's end, a worker's quiet exit), anything else as what the agent said.
pub(crate) fn agent_error(e: gepsea_agent::api::ApiError) -> crate::error::SearchError {
    match e {
        gepsea_agent::api::ApiError::Transport(why) => crate::error::SearchError::AgentLost(why),
        other => crate::error::SearchError::Io(format!("agent: {other}")),
    }
}

/// Where a staged fragment came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StageSource {
    /// Already in this node's scratch.
    Staged,
    /// This agent's memory (prefetched, or staged for an earlier job).
    Memory,
    /// Another agent's memory.
    Peer,
    /// The shared database directory.
    Storage,
}

/// What a worker spent on one task besides its result.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct WorkStats {
    /// Inside BLAST+.
    pub blast_seconds: f64,
    /// Waiting for the fragment to be staged.
    pub input_seconds: f64,
    /// Stagings by source ([`StageSource`] order).
    pub staged: [u32; 4],
    /// For the trace (one task's, not added up): the worker (its pid), when it took
    /// the task and when it handed the result over (seconds since the Unix epoch).
    pub worker: u32,
    pub taken_unix: f64,
    pub handed_unix: f64,
}

impl WorkStats {
    pub(crate) fn add(&mut self, o: &WorkStats) {
        self.blast_seconds += o.blast_seconds;
        self.input_seconds += o.input_seconds;
        for (a, b) in self.staged.iter_mut().zip(o.staged) {
            *a += b;
        }
    }
}

/// Reply to [`BlastRequest::Stage`].
#[derive(Debug, Serialize, Deserialize)]
pub struct Staged {
    /// Directory holding the fragment's files (use it as BLASTDB).
    pub dir: PathBuf,
    pub source: StageSource,
}

/// Reply to [`BlastRequest::StageCounts`]: one agent's stagings for a job.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagingStats {
    /// Stagings by source ([`StageSource`] order).
    pub by_source: [u32; 4],
    /// Staged fragments removed to make room (`JobSpec::scratch_bytes`).
    pub evicted: u32,
    /// The most bytes of staged fragments this node held or was staging at once, as
    /// seen by this job's stagings.
    pub peak_bytes: u64,
}

/// Cache object name of a fragment: content-addressed by its files' checksums, so a
/// copy can only ever stand for identical files.
pub fn fragment_object(name: &str, files: &BTreeMap<String, String>) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for (f, sum) in files {
        h.update(f.as_bytes());
        h.update([0]);
        h.update(sum.as_bytes());
        h.update([0]);
    }
    let d = h.finalize();
    let hex: String = d.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("blast-fragment/{hex}/{name}")
}

/// Advertised on `blast/<job id>` by a worker whose BLAST+ run failed.
#[derive(Debug, Serialize, Deserialize)]
pub struct TaskFailure {
    pub what: String,
    pub message: String,
    /// The task was submitted again (first failure); false: the run must fail.
    pub retried: bool,
}

/// Everything advertised on a job's topic.
#[derive(Debug, Serialize, Deserialize)]
pub enum Notice {
    Part(PartDone),
    /// A task's search failed (`retried`: it was submitted again).
    Failure(TaskFailure),
    /// A task's result was refused by the agent that took it in (`retried` is false).
    Refused(TaskFailure),
}

/// Requests to the BLAST plug-in.
#[derive(Debug, Serialize, Deserialize)]
pub enum BlastRequest {
    /// A worker's raw result, to its node's agent.
    Result {
        task: TaskPayload,
        #[serde(with = "serde_bytes")]
        archive: Vec<u8>,
        work: WorkStats,
    },
    /// Split by queries: a worker's output, already in the report's format, written by
    /// BLAST+ into `path` in the job directory; its agent renames it into the batch's
    /// part (nothing is read into memory or sent anywhere).
    ResultFile { task: TaskPayload, path: PathBuf, work: WorkStats },
    /// A result on its way to the batch's merger (maybe zstd-compressed).
    Part {
        task: TaskPayload,
        compressed: bool,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        work: WorkStats,
    },
    /// Make fragment `fragment` of `job` available in node-local scratch; replies
    /// [`Staged`].
    Stage { job: PathBuf, fragment: usize },
    /// Stage these fragments ahead of use (the data streaming service).
    /// `ahead`: the data streaming's look ahead, which counts only the stagings it
    /// did (one that found the fragment staged meanwhile did nothing).
    Prefetch { job: PathBuf, fragments: Vec<usize>, ahead: bool },
    /// What this agent's stagings for `job` did; replies [`StagingStats`].
    StageCounts { job: PathBuf },
    /// The job is over (every part written): drop what this agent keeps for it (its
    /// spec, batches, mergers, staging counts), so that a long-lived agent serving job
    /// after job does not grow. Late results for it are then refused (no spec).
    Forget { job: PathBuf },
    /// Write batch `batch`'s piece, which this agent made when it wrote the batch's
    /// part, at `offset` of the output `out`, and drop it; replies its length (`u64`).
    Place { job: PathBuf, batch: usize, offset: u64, out: PathBuf },
}

/// Advertised on `blast/<job id>` when a batch's part is written.
#[derive(Debug, Serialize, Deserialize)]
pub struct PartDone {
    pub batch: usize,
    pub queries: usize,
    pub hits: usize,
    pub whole_searches: usize,
    pub merger: u32,
    pub work: WorkStats,
    /// Bytes of results received from other nodes, as sent and as decompressed.
    pub bytes_wire: u64,
    pub bytes_raw: u64,
    pub error: Option<String>,
    /// The batch's BLAST+ runs and its merge and write, for the many-node model.
    pub tasks: Vec<crate::trace::TaskTrace>,
    pub merge_seconds: f64,
    pub write_seconds: f64,
    /// The write's CPU seconds (`tools::CpuClock`), and the part of them on the
    /// writing thread itself.
    pub write_cpu_seconds: f64,
    pub write_thread_cpu_seconds: f64,
    pub part_bytes: u64,
    /// The length of the batch's piece (its bytes of the output, see
    /// `crate::parts::piece`) if its merger holds it, ready to be placed.
    pub piece_bytes: Option<u64>,
    /// When the part was in place (seconds since the Unix epoch).
    pub written_unix: f64,
    /// What shipping the part to the storage site measured (with `JobSpec::ship`).
    pub shipped: Option<Box<crate::ship::Shipped>>,
    /// The write used statistics run ahead by the master (`accel::ahead`), so
    /// `write_seconds` holds no statistics runs.
    pub stats_ahead: bool,
}

/// `stagings` (counts by [`StageSource`], as [`AccelStats::stagings`]) in words, for a
/// run's summary: "fragments staged N times: … from storage, … from another node, … from
/// memory, … already staged".
pub fn describe_stagings(stagings: [u32; 4]) -> String {
    let [staged, memory, peer, storage] = stagings;
    format!(
        "fragments staged {} times: {storage} from storage, {peer} from another node, {memory} from memory, {staged} already staged",
        staged + memory + peer + storage
    )
}

// ----- the master ----------------------------------------------------------------------

/// Statistics of an accelerated run.
#[derive(Debug, Default, Clone, Serialize)]
pub struct AccelStats {
    pub parts: usize,
    pub hits: usize,
    pub whole_searches: usize,
    pub work: WorkStats,
    pub bytes_wire: u64,
    pub bytes_raw: u64,
    pub mergers: BTreeMap<u32, usize>,
    /// Fragment stagings by every agent (prefetches included), by [`StageSource`].
    pub stagings: [u32; 4],
    /// Staged fragments removed to stay under `JobSpec::scratch_bytes`, by every agent.
    pub evicted: u32,
    /// The most bytes of staged fragments any one node held (or was staging) at once.
    pub scratch_peak_bytes: u64,
    /// From the first task's submission to the workers' release: each worker's time
    /// on the job (as the no-agent master counts it, from hello to shutdown).
    pub worker_span_seconds: f64,
    /// Times unfinished batches were searched again because an agent died.
    pub resubmitted_after_failure: usize,
    /// Batches whose part an earlier, interrupted run had finished (resume).
    pub reused_parts: usize,
    /// Batches whose share of the output their merger agent wrote in place; the master
    /// wrote the others' from their part files.
    pub placed_by_agents: usize,
    /// Task by task and batch by batch, from the mergers' notices.
    pub trace: crate::trace::RunTrace,
    /// Parts shipped to a storage site, summed (with `JobSpec::ship`).
    pub shipped: Option<crate::ship::Shipped>,
}

/// A fragment's files from the shared database directory, as one cache object.
pub(crate) fn read_fragment(spec: &JobSpec, files: &BTreeMap<String, String>) -> Result<Vec<u8>, PluginError> {
    let mut contents = Vec::new();
    for f in files.keys() {
        let p = spec.db_dir.join(f);
        contents.push((f.clone(), std::fs::read(&p).map_err(|e| failed(format!("{}: {e}", p.display())))?));
    }
    postcard::to_stdvec(&contents).map_err(failed)
}

/// Batch `batch`'s piece of the output (see `parts::piece`), made from the batch's part
/// at `part` and written to `out`; returns its length. The merger agents make theirs
/// from the part they just formatted, the master from the part files it has to place
/// itself (an earlier run's, or those whose agent could not).
pub(crate) fn piece_from_part(spec: &JobSpec, batch: usize, part: &std::path::Path, out: impl std::io::Write) -> Result<u64, String> {
    let r = crate::parts::open(part).map_err(|e| format!("{}: {e}", part.display()))?;
    let (first, end) = spec.batches[batch];
    let fmt = crate::report::base_format(&spec.outfmt);
    crate::parts::piece(r, out, fmt, batch, spec.batches.len(), first, end - first).map_err(|e| format!("{}: {e}", part.display()))
}

/// Hex SHA-256, as the manifest records it (`db::format`).
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(data))
}
