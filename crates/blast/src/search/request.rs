//! What a search is asked to do ([`SearchOptions`], with [`Deliver`] for what happens
//! to the finished output) and what it reports ([`Summary`]).

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::plan::SplitBy;

/// Everything `gepsea search` was asked to do.
#[derive(Clone, Debug)]
pub struct SearchOptions {
    /// A directory made by `gepsea db format`, or any BLAST database `blastp -db` takes.
    pub db: PathBuf,
    /// Where the job keeps its own files (an existing database's side directory);
    /// `None`: a hidden directory next to the output, removed when the search ends.
    pub work_dir: Option<PathBuf>,
    /// Virtual fragments of an existing database split by fragments (default: one per
    /// worker); a formatted database has the fragments `db format` made.
    pub fragments: Option<usize>,
    /// Reuse the parts an interrupted run of the same search finished (see
    /// [`part_keys`](crate::plan::part_keys)); `false` searches everything again.
    pub resume: bool,
    pub query: PathBuf,
    pub out: PathBuf,
    pub workers: usize,
    pub outfmt: String,
    pub program: Option<String>,
    pub batch_residues: Option<usize>,
    /// How the search is cut into tasks; `None` chooses (see [`choose_split`](crate::plan::choose_split)).
    pub split: Option<SplitBy>,
    pub quiet: bool,
    pub blast_args: Vec<String>,
    /// The executable providing the hidden `worker` subcommand.
    pub worker_exe: PathBuf,
    /// The mpiBLAST architecture: the master merges and writes everything itself.
    pub no_agent: bool,
    /// Compress results with zstd before they cross nodes (agent mode).
    pub compress: bool,
    /// How merging and writing are spread over the agents (agent mode).
    pub assign: crate::accel::MergeAssign,
    /// Agent mode: stage fragments in node-local scratch through the agents (hot-swap).
    pub hot_swap: bool,
    /// Hot-swap: bytes of staged fragments each node keeps in its scratch (least
    /// recently used ones not being searched are removed to stay under it); `None`:
    /// no limit.
    pub scratch_bytes: Option<u64>,
    /// Agent mode: pin each node's agent to this core (a spare one, the paper's set-up;
    /// the workers are left wherever the launcher put them).
    pub agent_cpu: Option<usize>,
    /// Where the finished output goes next (e.g. a distant storage site).
    pub deliver: Option<Deliver>,
    /// Agent mode: ship each batch's part to a storage site as soon as it is written
    /// (ParaMEDIC's overlap, [`crate::ship`]); reported in [`Summary::delivery`].
    pub ship_parts: Option<crate::ship::ShipParts>,
    /// Record every BLAST+ search run, or replay recorded ones instead of searching
    /// (benchmarks: see [`crate::replay`]).
    pub replay: Option<crate::replay::ReplayRequest>,
}

/// Hands the complete output on (e.g. ships it to a storage site), once it is in
/// place: called with the output's path and, in agent mode, a client of this node's
/// agent, so the agent can do the work. Its report lands in [`Summary::delivery`].
#[derive(Clone)]
pub struct Deliver(pub std::sync::Arc<DeliverFn>);

/// The function behind [`Deliver`]: (output, the node's agent) → a report, or why not.
pub type DeliverFn = dyn Fn(&Path, Option<&gepsea_client::Client>) -> Result<serde_json::Value, String> + Send + Sync;

impl std::fmt::Debug for Deliver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deliver(..)")
    }
}

/// What a finished search reports.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Queries in the query file (all of them are in the output).
    pub queries: usize,
    /// Query–subject pairs reported (see [`crate::parts::count_hits`] for tabular formats).
    pub hits: usize,
    /// How the search was cut into tasks ([`choose_split`](crate::plan::choose_split)'s answer).
    pub split: SplitBy,
    /// Tasks the search was cut into: batches × fragments, or batches split by queries
    /// (retries and whole-database re-searches not counted).
    pub tasks: usize,
    /// Split by fragments: queries re-searched on the whole database because the
    /// fragments alone could not decide their exact answer (0 split by queries).
    pub whole_db_fallbacks: usize,
    /// From start to the output file renamed into place.
    pub wall_seconds: f64,
    /// Sum over tasks of the time workers spent inside BLAST+.
    pub blast_seconds: f64,
    /// Sum over workers of the time from their start (ready) to shutdown (or death).
    pub worker_seconds: f64,
    pub output: PathBuf,
    /// Agent mode only: what the agents did.
    pub accel: Option<crate::accel::AccelStats>,
    /// What [`SearchOptions::deliver`] reported (its time is not in `wall_seconds`).
    pub delivery: Option<serde_json::Value>,
    /// Batches whose part an earlier, interrupted run of the same search had finished.
    pub reused_parts: usize,
    /// Sum over workers of their active time, from their first task to their last
    /// result handed over (the idle end of a job whose tasks ran out is not in it).
    pub worker_active_seconds: f64,
    /// Task by task and batch by batch (split by fragments), for the many-node model.
    pub trace: crate::trace::RunTrace,
}
