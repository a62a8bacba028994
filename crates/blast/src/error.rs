//! What can stop a search, as one error type every role returns, and the stop request
//! a signal leaves (SIGINT/SIGTERM): the roles poll it between steps so that they
//! clean up on the way out.

use std::path::PathBuf;

use gepsea_net::NetError;

use crate::archive;
use crate::db::DbError;
use crate::fasta::FastaError;
use crate::report::ReportError;
use crate::tools::ToolError;

/// Why a search failed.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Fasta(#[from] FastaError),
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error(transparent)]
    Replay(#[from] crate::replay::ReplayError),
    #[error("communication: {0}")]
    Net(#[from] NetError),
    #[error("{path} is complete, but delivering it failed: {reason}")]
    Delivery { path: PathBuf, reason: String },
    #[error("{query}: looks like {query_type} sequences but the database {db} holds {db_type} sequences")]
    TypeMismatch { query: PathBuf, query_type: &'static str, db: PathBuf, db_type: &'static str },
    #[error("--program {program} cannot search a {db_type} database (use {expected})")]
    ProgramMismatch { program: String, db_type: &'static str, expected: &'static str },
    #[error("--program {0}: not a BLAST+ search program gepsea runs (blastp, blastn, blastx, tblastn, tblastx)")]
    UnknownProgram(String),
    #[error("{query}: looks like {query_type} sequences, but {program} searches {expected} queries")]
    QueryTypeForProgram { query: PathBuf, query_type: &'static str, program: String, expected: &'static str },
    #[error("{0} is searched split by queries only (drop --split fragments): the exact merge of fragments is not proven for translated searches")]
    TranslatedByFragments(String),
    #[error("BLAST+ option {option} is searched split by queries only (drop --split fragments): {why}")]
    OptionByFragments { option: &'static str, why: &'static str },
    #[error("BLAST+ option {option} needs each query searched on the whole database by one BLAST+ run ({why}): that is --split queries, which needs the agents (drop --no-agent)")]
    OptionWithoutAgents { option: &'static str, why: &'static str },
    #[error("{0} is searched in BLAST+'s own query batches, whose composition changes its results: --batch-residues does not apply")]
    TranslatedBatches(String),
    #[error("BLAST+ option {option} is set by gepsea; {instead}")]
    OwnedOption { option: String, instead: &'static str },
    #[error("BLAST+ refused the options after --: {0}")]
    BlastOptions(String),
    #[error("--outfmt {0}: not written by gepsea, which writes formats 0 to 7, 10 and 18 byte-identical to serial BLAST+ (this one's per-run framing is not reproduced); choose one of those, e.g. 5 (XML) or 7 (tabular with comments)")]
    OutfmtNotReproduced(String),
    #[error("BLAST+ option -html: gepsea does not write HTML reports (their markup is not joined as serial BLAST+ writes it); drop -html, or make the HTML from an identical plain report")]
    HtmlNotReproduced,
    #[error("--outfmt {outfmt}: BLAST+ refused it ({reason}); see `blastp -help`, -outfmt, for the formats")]
    Outfmt { outfmt: String, reason: String },
    #[error("--outfmt \"{outfmt}\": {program} has no field {field}{hint} and would print the rows without it; `{program} -help` lists its fields under -outfmt")]
    OutfmtField { outfmt: String, program: String, field: String, hint: String },
    #[error("interrupted by signal {0}; temporary files and processes are cleaned up")]
    Interrupted(i32),
    #[error("--out {path} is {what}: the search's output would replace it; choose another output path")]
    OutputIsInput { path: PathBuf, what: &'static str },
    #[error("cannot write the output {path}: {source}")]
    Output { path: PathBuf, source: std::io::Error },
    #[error("another search{} is writing {}: its work directory {} is in use. Wait for it to end, or give another --out", holder.map(|p| format!(" (pid {p})")).unwrap_or_default(), path.display(), work_dir.display())]
    OutputBusy { path: PathBuf, work_dir: PathBuf, holder: Option<u32> },
    #[error("{0}")]
    Io(String),
    #[error("cluster launch: {0}")]
    Launch(String),
    /// A task's BLAST+ run failed, then failed again on retry. `task`: its number where
    /// the master numbers tasks (without agents).
    #[error("{} failed twice; BLAST+ said: {message}", match task { Some(t) => format!("task {t} ({what})"), None => format!("the search of {what}") })]
    TaskFailed { task: Option<usize>, what: String, message: String },
    /// The agent could not take a task's result in (an archive it cannot parse, a merge
    /// or a write that failed): searching again would fail the same way.
    #[error("the result of {what} could not be merged: {message}")]
    ResultRefused { what: String, message: String },
    #[error("all workers died; the last one: {0}")]
    NoWorkers(String),
    #[error("agent: lost contact with the agent: {0}")]
    AgentLost(String),
    /// A worker could not register with its agent: none there, or it ended meanwhile.
    #[error("connecting to the agent: {0}")]
    AgentUnreachable(String),
    #[error("the search's agent (pid {pid}) ended ({status}); run the same command again to resume from the batches already finished")]
    OwnAgentEnded {
        pid: u32,
        status: String,
        /// Ended by a signal it did not handle (SIGKILL from the OOM killer or an
        /// operator, a crash), not by shutting down (a terminal's Ctrl-C reaches it too).
        killed: bool,
    },
    #[error(
        "--split queries needs the agents: the no-agent baseline is mpiBLAST's fragment search (drop --no-agent, or use --split fragments)"
    )]
    QuerySplitWithoutAgents,
    #[error("archive of task {task}: {error}")]
    BadArchive { task: usize, error: archive::ArchiveError },
    #[error("--fragments {0}: a database made by `gepsea db format` keeps the fragments it was formatted with (format it again to change them); --fragments is for existing BLAST databases")]
    FragmentsOfFormatted(usize),
}

impl SearchError {
    /// [`SearchError::OwnAgentEnded`] for the agent `pid` that ended with `status`.
    pub(crate) fn own_agent_ended(pid: u32, status: std::process::ExitStatus) -> SearchError {
        let killed = std::os::unix::process::ExitStatusExt::signal(&status).is_some();
        SearchError::OwnAgentEnded { pid, status: status.to_string(), killed }
    }
}

pub(crate) static INTERRUPTED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Records that the process got signal `sig` (SIGINT, SIGTERM): the running search stops
/// at its next check, removes its temporary files and stops its processes, and returns
/// [`SearchError::Interrupted`]. Call it from a signal-handling thread.
pub fn interrupt(sig: i32) {
    INTERRUPTED.store(sig, std::sync::atomic::Ordering::SeqCst);
}

/// The signal recorded by [`interrupt`], if any.
pub fn interrupted() -> Option<i32> {
    match INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// `Err(Interrupted)` once a signal was recorded (polled by the masters' loops).
pub(crate) fn check_interrupted() -> Result<(), SearchError> {
    interrupted().map_or(Ok(()), |s| Err(SearchError::Interrupted(s)))
}
