//! `gepsea search` accelerated by the agents (the GePSeA case study).
//!
//! Everything that is not searching is offloaded to the agents:
//!
//! - **Scheduling** is the agents' load-balancing primitive: the master submits one task
//!   per (query batch, fragment); workers `take` them, so faster workers get more.
//! - **Asynchronous output consolidation**: a worker hands each raw result (`-outfmt
//!   11` archive) to its node's agent — the [`BlastPlugin`] — and goes straight on to
//!   its next task. The plug-in sends the result to the batch's *merger* agent
//!   (compressed with zstd when it crosses nodes), which merges each query as soon as
//!   the batch's last fragment is in, submits any query whose serial search might have
//!   overflowed BLAST's preliminary list for a whole-database search, and then writes
//!   the batch's share of the report as a part file in the output's directory. Which
//!   agent merges a batch is decided dynamically (the first agent that receives a
//!   result of the batch claims it on the bulletin board) or statically (batch number
//!   modulo the agents), for the benchmark.
//! - **Hot-swap database fragments**: before searching a fragment a worker asks its
//!   agent to *stage* it: the agent copies the fragment into node-local scratch from
//!   wherever it is closest — already staged on this node, in this agent's memory, in
//!   another agent's memory (the distributed cache finds the holder through its
//!   directory), or, only if no node has it yet, the shared database directory — and
//!   checks every file against the manifest's SHA-256 first. At the start of a job the
//!   master asks every agent to prefetch the fragments it will search first (fragment
//!   `f` to the `f mod n`-th node), and tasks name their fragment, so the scheduler
//!   hands a task to a worker whose node already holds its fragment.
//! - The master assembles the parts in query order (joining headers and footers, and
//!   renumbering XML iterations) into the output file, identical to serial BLAST+.
//!
//! Files live in a job directory next to the output, so that agents on every node can
//! write their parts straight to the output location.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gepsea_agent::api::{Api, ApiError, Cas};
use gepsea_agent::plugin::{Context, Plugin, PluginError, Uses};
use gepsea_agent::wire::{Codec, Dest, ErrorKind, LockMode};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::archive;
pub use crate::parts::{assemble, count_hits, Assembler};
use crate::report;
use crate::search::{SearchError, SplitBy};
use crate::tools::{self, ToolError};

/// How the merging and writing of batches is spread over the agents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum MergeAssign {
    /// The first agent to receive a result of a batch merges and writes it.
    #[default]
    Dynamic,
    /// Batch `b` goes to the `b mod n`-th live agent.
    Static,
    /// One agent (the lowest node) merges and writes everything.
    Single,
}

/// Everything the agents need to know about a job (in `job.json` in the job directory).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobSpec {
    pub id: String,
    pub program: String,
    /// The directory of gepsea's files for the database: the formatted database, or an
    /// existing database's side directory (see [`crate::db`]).
    pub db_dir: PathBuf,
    /// `BLASTDB` for every BLAST+ run of the job ([`crate::db::Database::blastdb`]).
    pub blastdb: String,
    pub db_name: String,
    pub outfmt: String,
    pub blast_args: Vec<String>,
    /// Hits kept per query.
    pub k: usize,
    /// BLAST's preliminary hit-list size for this search.
    pub prelim: usize,
    pub fragments: Vec<String>,
    /// Global query range of each batch.
    pub batches: Vec<(usize, usize)>,
    /// Tasks per (batch, fragment), merged by the agents; or per batch on the whole
    /// database, whose output is the batch's part as it stands.
    pub split: SplitBy,
    /// Split by queries: the number of last tasks that run BLAST+ with that many threads
    /// (the workers on one machine); 0 or 1: none.
    pub tail_threads: usize,
    pub compress: bool,
    pub assign: MergeAssign,
    /// Stage fragments in node-local scratch through the agents (hot-swap); off: search
    /// them in `db_dir` in place.
    pub hot_swap: bool,
    /// SHA-256 of each file a search of a fragment reads, by file name (from the
    /// manifest), per fragment.
    pub fragment_files: Vec<BTreeMap<String, String>>,
    /// Where each batch's finished part goes: in the work directory, named by a hash of
    /// everything that decides its contents, so that a rerun finds it (resume).
    pub parts: Vec<PathBuf>,
}

impl JobSpec {
    /// Batch `batch`'s finished part.
    fn part(&self, batch: usize) -> Result<&Path, PluginError> {
        self.parts.get(batch).map(|p| p.as_path()).ok_or_else(|| PluginError::BadRequest(format!("no batch {batch}")))
    }
}

/// A temporary name next to `part` (same file system, so the rename into place is
/// atomic), unique to this process and `tag`.
pub fn part_tmp(part: &Path, tag: &str) -> PathBuf {
    let name = part.file_name().unwrap_or_default().to_string_lossy();
    part.with_file_name(format!(".{name}.{}-{tag}.tmp", std::process::id()))
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
}

impl WorkStats {
    fn add(&mut self, o: &WorkStats) {
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

/// What workers take from the load balancer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum TaskPayload {
    Fragment {
        job: PathBuf,
        batch: usize,
        fragment: usize,
        attempt: u8,
    },
    /// Re-search `queries` (global indices) of `batch` on the whole database.
    Whole {
        job: PathBuf,
        batch: usize,
        queries: Vec<usize>,
        attempt: u8,
    },
    /// Split by queries: search `batch` on the whole database in the report's format;
    /// the output is the batch's part. `threads` > 1: BLAST+ runs with that many
    /// threads (the last tasks, see [`submit_tasks`]).
    Batch {
        job: PathBuf,
        batch: usize,
        attempt: u8,
        threads: usize,
    },
    Stop,
}

impl TaskPayload {
    fn describe(&self, spec: &JobSpec) -> String {
        match self {
            TaskPayload::Fragment { batch, fragment, .. } => {
                format!("batch {batch} on fragment {}", spec.fragments.get(*fragment).map_or("?", |s| s.as_str()))
            }
            TaskPayload::Whole { queries, .. } => format!("{} queries on the whole database", queries.len()),
            TaskPayload::Batch { batch, .. } => format!("batch {batch} on the whole database"),
            TaskPayload::Stop => "stop".into(),
        }
    }
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
    Failure(TaskFailure),
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
    Prefetch { job: PathBuf, fragments: Vec<usize> },
    /// This agent's stagings for `job` by source ([`StageSource`] order), as
    /// `[u32; 4]`.
    StageCounts { job: PathBuf },
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
}

pub fn topic(job_id: &str) -> String {
    format!("blast/{job_id}")
}

pub fn batch_file(job: &Path, batch: usize) -> PathBuf {
    job.join(format!("batch{batch}.fasta"))
}

fn whole_file(job: &Path, batch: usize, first: usize) -> PathBuf {
    job.join(format!("whole-{batch}-{first}.fasta"))
}

#[derive(Default)]
struct BatchState {
    fragments: Vec<Option<String>>,
    /// Final hits per query of the batch (HSP texts numbered locally, `Query_<i+1>`).
    results: Vec<Option<Vec<String>>>,
    hits: usize,
    pending_whole: BTreeSet<usize>,
    merged: bool,
    written: bool,
    whole_searches: usize,
    work: WorkStats,
    bytes_wire: u64,
    bytes_raw: u64,
}

/// The BLAST plug-in every agent runs (see the module docs).
#[derive(Default)]
pub struct BlastPlugin {
    specs: Mutex<HashMap<PathBuf, Arc<JobSpec>>>,
    batches: Mutex<HashMap<(PathBuf, usize), BatchState>>,
    /// Batches whose part this agent wrote: late duplicates of their results (tasks
    /// re-run after a failure) are ignored.
    written: Mutex<BTreeSet<(PathBuf, usize)>>,
    /// One lock per fragment object being staged on this node: a fragment is copied
    /// once however many workers (or prefetches) ask for it at the same time.
    staging: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    stage_counts: Mutex<HashMap<PathBuf, [u32; 4]>>,
}

fn failed(e: impl std::fmt::Display) -> PluginError {
    PluginError::Failed(e.to_string())
}

impl BlastPlugin {
    fn spec(&self, job: &Path) -> Result<Arc<JobSpec>, PluginError> {
        if let Some(s) = self.specs.lock().get(job) {
            return Ok(s.clone());
        }
        let p = job.join("job.json");
        let text = std::fs::read_to_string(&p).map_err(|e| PluginError::BadRequest(format!("{}: {e}", p.display())))?;
        let s: Arc<JobSpec> = Arc::new(serde_json::from_str(&text).map_err(|e| PluginError::BadRequest(format!("{}: {e}", p.display())))?);
        self.specs.lock().insert(job.to_path_buf(), s.clone());
        Ok(s)
    }

    /// The agent that merges and writes `batch`.
    fn merger(&self, ctx: &Context<'_>, spec: &JobSpec, batch: usize) -> Result<u32, PluginError> {
        let mut nodes: Vec<u32> = ctx.services.global_state()?.iter().map(|s| s.node).collect();
        nodes.sort_unstable();
        if nodes.is_empty() {
            nodes.push(ctx.node);
        }
        match spec.assign {
            MergeAssign::Single => Ok(nodes[0]),
            MergeAssign::Static => Ok(nodes[batch % nodes.len()]),
            MergeAssign::Dynamic => {
                // Claimed by the first agent that has a result of the batch; a claim of
                // an agent that died is taken over.
                let key = format!("blast/{}/merger/{batch}", spec.id);
                let mut expected = 0;
                loop {
                    match ctx.services.board_cas(&key, expected, &ctx.node.to_le_bytes())? {
                        Cas::Written(_) => return Ok(ctx.node),
                        Cas::Conflict(_) => {
                            let v = ctx.services.board_get(&key)?.ok_or_else(|| failed(format!("{key} vanished")))?;
                            let holder = u32::from_le_bytes(v.value.try_into().map_err(|_| failed(format!("{key} is not a node id")))?);
                            if nodes.contains(&holder) {
                                return Ok(holder);
                            }
                            expected = v.version;
                        }
                    }
                }
            }
        }
    }

    /// Brings `fragment` into this node's scratch (see the module docs); returns its
    /// directory and where it came from.
    fn stage(&self, ctx: &Context<'_>, job: &Path, spec: &JobSpec, fragment: usize) -> Result<(PathBuf, StageSource), PluginError> {
        let name = spec.fragments.get(fragment).ok_or_else(|| PluginError::BadRequest(format!("no fragment {fragment}")))?;
        let files =
            spec.fragment_files.get(fragment).ok_or_else(|| PluginError::BadRequest(format!("no file list for fragment {fragment}")))?;
        let object = fragment_object(name, files);
        let dir = ctx.scratch.join(&object);
        let lock = self.staging.lock().entry(object.clone()).or_default().clone();
        let _held = lock.lock();
        let (dir, source) = self.stage_locked(ctx, spec, name, files, dir, &object)?;
        self.stage_counts.lock().entry(job.to_path_buf()).or_default()[source as usize] += 1;
        Ok((dir, source))
    }

    fn stage_locked(
        &self,
        ctx: &Context<'_>,
        spec: &JobSpec,
        name: &str,
        files: &BTreeMap<String, String>,
        dir: PathBuf,
        object: &str,
    ) -> Result<(PathBuf, StageSource), PluginError> {
        if dir.is_dir() {
            return Ok((dir, StageSource::Staged));
        }
        let was_here = ctx.services.global_state()?.iter().any(|s| s.node == ctx.node && s.holds.iter().any(|h| h == object));
        let fetch = || match ctx.services.cache_get(object) {
            Ok(b) => Ok(Some(b)),
            Err(ApiError::Agent { kind: ErrorKind::NotFound, .. }) => Ok(None),
            Err(e) => Err(PluginError::from(e)),
        };
        let (bundle, source) = match fetch()? {
            Some(b) => (b, if was_here { StageSource::Memory } else { StageSource::Peer }),
            None => {
                // Nobody has it: one agent of the whole cluster reads it from shared
                // storage while the others wait for it under a distributed lock, then
                // take it from that agent's memory.
                let lock = format!("blast-stage/{object}");
                ctx.services.lock(&lock, LockMode::Exclusive)?;
                let loaded = match fetch() {
                    Ok(Some(b)) => Ok((b, StageSource::Peer)),
                    Ok(None) => read_fragment(spec, files).map(|b| {
                        // In this agent's memory and in the directory: other nodes
                        // fetch it from here instead of from shared storage.
                        if let Err(e) = ctx.services.cache_put(object, &b) {
                            tracing::warn!("fragment {name} not cached on node {} ({e}); others read it from storage", ctx.node);
                        }
                        (b, StageSource::Storage)
                    }),
                    Err(e) => Err(e),
                };
                let _ = ctx.services.unlock(&lock);
                loaded?
            }
        };
        let contents: Vec<(String, Vec<u8>)> =
            postcard::from_bytes(&bundle).map_err(|e| failed(format!("fragment {name}: damaged cache object: {e}")))?;
        let tmp = dir.with_extension("partial");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| failed(format!("{}: {e}", tmp.display())))?;
        for (f, data) in &contents {
            let want = files.get(f).ok_or_else(|| failed(format!("fragment {name}: unexpected file {f}")))?;
            let got = sha256_hex(data);
            if &got != want {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(failed(format!("fragment {name}: {f} has SHA-256 {got}, the manifest says {want} (from {source:?})")));
            }
            std::fs::write(tmp.join(f), data).map_err(|e| failed(format!("{}: {e}", tmp.join(f).display())))?;
        }
        if contents.len() != files.len() {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(failed(format!("fragment {name}: {} of {} files", contents.len(), files.len())));
        }
        std::fs::rename(&tmp, &dir).map_err(|e| failed(format!("{}: {e}", dir.display())))?;
        Ok((dir, source))
    }

    fn stage_counts(&self, job: &Path) -> [u32; 4] {
        self.stage_counts.lock().get(job).copied().unwrap_or_default()
    }

    fn on_result(&self, ctx: &Context<'_>, task: TaskPayload, archive: Vec<u8>, work: WorkStats) -> Result<(), PluginError> {
        let (job, batch) = match &task {
            TaskPayload::Fragment { job, batch, .. } | TaskPayload::Whole { job, batch, .. } | TaskPayload::Batch { job, batch, .. } => {
                (job.clone(), *batch)
            }
            TaskPayload::Stop => return Err(PluginError::BadRequest("a stop task has no result".into())),
        };
        let spec = self.spec(&job)?;
        let mut body: Option<Vec<u8>> = None;
        // A merger that dies while (or before) it takes the result is replaced by the
        // next one the live view gives; the master searches the batches it held again.
        for attempt in 0.. {
            let merger = self.merger(ctx, &spec, batch)?;
            if merger == ctx.node {
                return self.on_part(ctx, task, String::from_utf8(archive).map_err(|_| failed("archive is not text"))?, work, (0, 0));
            }
            let b = match &body {
                Some(b) => b.clone(),
                None => {
                    // Crossing nodes: compress first (runtime output compression).
                    let (compressed, data) = if spec.compress {
                        (true, ctx.engine.compress(&Codec::Zstd, 3, &archive).map_err(failed)?)
                    } else {
                        (false, archive.clone())
                    };
                    body.insert(postcard::to_stdvec(&BlastRequest::Part { task: task.clone(), compressed, data, work }).map_err(failed)?)
                        .clone()
                }
            };
            match ctx.services.plugin_at(merger, "blast", b) {
                Err(e) if e.kind() == Some(ErrorKind::Unavailable) && attempt < 8 => {
                    tracing::warn!("merger node {merger} of batch {batch} is gone ({e}); handing the result to the next");
                    std::thread::sleep(Duration::from_millis(100));
                }
                r => return r.map(|_| ()).map_err(PluginError::from),
            }
        }
        unreachable!("the loop returns")
    }

    fn on_part(
        &self,
        ctx: &Context<'_>,
        task: TaskPayload,
        text: String,
        work: WorkStats,
        (wire, raw): (u64, u64),
    ) -> Result<(), PluginError> {
        let (job, batch) = match &task {
            TaskPayload::Fragment { job, batch, .. } | TaskPayload::Whole { job, batch, .. } | TaskPayload::Batch { job, batch, .. } => {
                (job.clone(), *batch)
            }
            TaskPayload::Stop => return Err(PluginError::BadRequest("a stop task has no result".into())),
        };
        let spec = self.spec(&job)?;
        let (start, end) = *spec.batches.get(batch).ok_or_else(|| PluginError::BadRequest(format!("no batch {batch}")))?;
        let nq = end - start;
        let nfrag = spec.fragments.len();
        let mut ready = None;
        if self.written.lock().contains(&(job.clone(), batch)) {
            return Ok(());
        }
        if matches!(task, TaskPayload::Batch { .. }) {
            return Err(PluginError::BadRequest(format!("batch {batch}: a split-by-queries result comes as a file, not as text")));
        }
        {
            let mut all = self.batches.lock();
            let st = all.entry((job.clone(), batch)).or_insert_with(|| BatchState {
                fragments: vec![None; nfrag],
                results: vec![None; nq],
                ..Default::default()
            });
            st.work.add(&work);
            st.bytes_wire += wire;
            st.bytes_raw += raw;
            match &task {
                TaskPayload::Fragment { fragment, .. } => {
                    // A re-run (its worker died after handing the result over) adds nothing.
                    if *fragment < nfrag && st.fragments[*fragment].is_none() && !st.merged {
                        st.fragments[*fragment] = Some(text);
                        if st.fragments.iter().all(|f| f.is_some()) {
                            st.merged = true;
                            ready = Some(std::mem::take(&mut st.fragments));
                        }
                    }
                }
                TaskPayload::Whole { queries, .. } => {
                    if queries.iter().any(|q| st.pending_whole.contains(q)) {
                        let hsps = archive::hsps(&text).map_err(failed)?;
                        let hits = archive::hits_by_query(&hsps, 0, queries.len());
                        for (i, list) in hits.iter().enumerate() {
                            let local = queries[i] - start;
                            st.hits += list.len();
                            st.results[local] =
                                Some(list.iter().flat_map(|h| h.hsps.iter().map(|s| archive::renumber(s, local + 1))).collect());
                            st.pending_whole.remove(&queries[i]);
                        }
                    }
                }
                TaskPayload::Stop | TaskPayload::Batch { .. } => {}
            }
        }
        if let Some(frags) = ready {
            // Merge outside the lock: parsing is the expensive part.
            let parsed: Vec<Vec<archive::Hsp>> =
                frags.iter().map(|a| archive::hsps(a.as_deref().unwrap()).map_err(failed)).collect::<Result<_, _>>()?;
            let mut per_frag: Vec<Vec<Vec<archive::Hit>>> =
                parsed.iter().enumerate().map(|(f, h)| archive::hits_by_query(h, f, nq)).collect();
            let mut risky = Vec::new();
            let mut merged: Vec<(usize, Vec<String>, usize)> = Vec::new();
            for local in 0..nq {
                let lists: Vec<Vec<archive::Hit>> = per_frag.iter_mut().map(|f| std::mem::take(&mut f[local])).collect();
                if lists.len() > 1 {
                    let n: usize = lists.iter().map(|l| l.len()).sum();
                    if n * 4 >= spec.prelim || lists.iter().any(|l| l.len() >= spec.k) {
                        risky.push(start + local);
                        continue;
                    }
                }
                let hits = archive::merge_query(lists, spec.k);
                merged.push((
                    local,
                    hits.iter().flat_map(|h| h.hsps.iter().map(|s| archive::renumber(s, local + 1))).collect(),
                    hits.len(),
                ));
            }
            {
                let mut all = self.batches.lock();
                let st = all.get_mut(&(job.clone(), batch)).unwrap();
                for (local, hsps, n) in merged {
                    st.results[local] = Some(hsps);
                    st.hits += n;
                }
                st.pending_whole.extend(risky.iter().copied());
                st.whole_searches += risky.len();
            }
            if !risky.is_empty() {
                // Whole-database searches for the queries a fragment merge cannot settle,
                // spread over the workers as separate tasks.
                let queries = crate::fasta::read(&batch_file(&job, batch)).map_err(failed)?;
                let per = risky.len().div_ceil(4).max(1);
                for chunk in risky.chunks(per) {
                    let mut buf = Vec::new();
                    for &g in chunk {
                        queries[g - start].write_to(&mut buf);
                    }
                    std::fs::write(whole_file(&job, batch, chunk[0]), buf).map_err(failed)?;
                    let payload = postcard::to_stdvec(&TaskPayload::Whole { job: job.clone(), batch, queries: chunk.to_vec(), attempt: 0 })
                        .map_err(failed)?;
                    ctx.services.submit(&payload)?;
                }
            }
        }
        self.maybe_write(ctx, &spec, &job, batch)
    }

    /// Split by queries: the worker's output file is the batch's part as it stands. The
    /// job directory is shared by every node, so the worker's own agent puts it in place:
    /// no merger, nothing read into memory but a line at a time to count hits.
    fn on_result_file(&self, ctx: &Context<'_>, task: TaskPayload, file: &Path, work: WorkStats) -> Result<(), PluginError> {
        let TaskPayload::Batch { job, batch, .. } = &task else {
            return Err(PluginError::BadRequest("only split-by-queries results come as files".into()));
        };
        let spec = self.spec(job)?;
        let (start, end) = *spec.batches.get(*batch).ok_or_else(|| PluginError::BadRequest(format!("no batch {batch}")))?;
        // Only one copy of a batch's output is written: a task re-run after its worker
        // died may deliver a second, identical one.
        if !self.written.lock().insert((job.clone(), *batch)) {
            let _ = std::fs::remove_file(file);
            return Ok(());
        }
        let part = spec.part(*batch)?;
        let bytes = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
        let result = crate::parts::count_hits_in(file, &spec.outfmt)
            .and_then(|hits| std::fs::rename(file, part).map(|_| hits))
            .map_err(|e| format!("{}: {e}", part.display()));
        let done = PartDone {
            batch: *batch,
            queries: end - start,
            hits: *result.as_ref().unwrap_or(&0),
            whole_searches: 0,
            merger: ctx.node,
            work,
            bytes_wire: 0,
            bytes_raw: bytes,
            error: result.err(),
        };
        ctx.services.publish(&topic(&spec.id), &postcard::to_stdvec(&Notice::Part(done)).map_err(failed)?, Dest::All)?;
        Ok(())
    }

    /// Writes the batch's part of the report once every query is settled.
    fn maybe_write(&self, ctx: &Context<'_>, spec: &JobSpec, job: &Path, batch: usize) -> Result<(), PluginError> {
        let (hsps, done) = {
            let mut all = self.batches.lock();
            let Some(st) = all.get_mut(&(job.to_path_buf(), batch)) else { return Ok(()) };
            if !st.merged || !st.pending_whole.is_empty() || st.written || st.results.iter().any(|r| r.is_none()) {
                return Ok(());
            }
            st.written = true;
            let hsps: Vec<String> = st.results.iter().flat_map(|r| r.clone().unwrap_or_default()).collect();
            let done = PartDone {
                batch,
                queries: st.results.len(),
                hits: st.hits,
                whole_searches: st.whole_searches,
                merger: ctx.node,
                work: st.work,
                bytes_wire: st.bytes_wire,
                bytes_raw: st.bytes_raw,
                error: None,
            };
            (hsps, done)
        };
        let scratch = job.join(format!("scratch-{batch}"));
        let result = (|| -> Result<(), String> {
            std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
            let queries = batch_file(job, batch);
            let rs = report::Spec {
                program: &spec.program,
                blastdb: spec.blastdb.as_ref(),
                db_name: &spec.db_name,
                queries: &queries,
                outfmt: &spec.outfmt,
                blast_args: &spec.blast_args,
                scratch: &scratch,
            };
            let part = spec.parts.get(batch).ok_or_else(|| format!("no batch {batch}"))?;
            let tmp = part_tmp(part, "merged");
            report::write(&rs, &hsps, &tmp).map_err(|e| e.to_string())?;
            std::fs::rename(&tmp, part).map_err(|e| e.to_string())
        })();
        let _ = std::fs::remove_dir_all(&scratch);
        let done = PartDone { error: result.err(), ..done };
        self.batches.lock().remove(&(job.to_path_buf(), batch));
        self.written.lock().insert((job.to_path_buf(), batch));
        ctx.services.publish(&topic(&spec.id), &postcard::to_stdvec(&Notice::Part(done)).map_err(failed)?, Dest::All)?;
        Ok(())
    }
}

impl Plugin for BlastPlugin {
    fn name(&self) -> &str {
        "blast"
    }
    fn uses(&self) -> &[Uses] {
        &[Uses::LoadBalancing, Uses::BulletinBoard, Uses::Advertising, Uses::Compression, Uses::SortMerge, Uses::ProcessState]
    }
    fn handle(&self, ctx: &Context<'_>, request: &[u8]) -> Result<Vec<u8>, PluginError> {
        match postcard::from_bytes::<BlastRequest>(request).map_err(|e| PluginError::BadRequest(format!("blast request: {e}")))? {
            BlastRequest::Result { task, archive, work } => self.on_result(ctx, task, archive, work)?,
            BlastRequest::ResultFile { task, path, work } => self.on_result_file(ctx, task, &path, work)?,
            BlastRequest::Stage { job, fragment } => {
                let spec = self.spec(&job)?;
                let (dir, source) = self.stage(ctx, &job, &spec, fragment)?;
                return postcard::to_stdvec(&Staged { dir, source }).map_err(failed);
            }
            BlastRequest::StageCounts { job } => return postcard::to_stdvec(&self.stage_counts(&job)).map_err(failed),
            BlastRequest::Prefetch { job, fragments } => {
                let spec = self.spec(&job)?;
                for f in fragments {
                    self.stage(ctx, &job, &spec, f)?;
                }
            }
            BlastRequest::Part { task, compressed, data, work } => {
                let wire = data.len() as u64;
                let raw = if compressed { ctx.engine.decompress(&Codec::Zstd, &data).map_err(failed)? } else { data };
                let len = raw.len() as u64;
                self.on_part(ctx, task, String::from_utf8(raw).map_err(|_| failed("archive is not text"))?, work, (wire, len))?;
            }
        }
        Ok(Vec::new())
    }
}

// ----- the worker ----------------------------------------------------------------------

/// A worker registered with its node's agent: takes tasks, searches, hands results over.
pub fn worker(client: &gepsea_client::Client) -> Result<(), SearchError> {
    let mut inflight: Vec<u64> = Vec::new();
    // Fragments this worker had staged, by (job, fragment): a staged copy stays for the
    // agent's lifetime, so only the first use asks the agent (whose job thread for this
    // worker may be busy merging the batch the previous result completed).
    let mut staged_dirs: HashMap<(PathBuf, usize), PathBuf> = HashMap::new();
    let api_err = |e: gepsea_agent::api::ApiError| SearchError::Io(format!("agent: {e}"));
    loop {
        let Some(t) = client.take(Duration::from_secs(3600)).map_err(api_err)? else { continue };
        let payload: TaskPayload = postcard::from_bytes(&t.payload).map_err(|e| SearchError::Io(format!("bad task: {e}")))?;
        let job = match &payload {
            TaskPayload::Stop => {
                client.done(t.id).map_err(api_err)?;
                break;
            }
            TaskPayload::Fragment { job, .. } | TaskPayload::Whole { job, .. } | TaskPayload::Batch { job, .. } => job.clone(),
        };
        let spec_path = job.join("job.json");
        if !job.exists() {
            // The master finished and removed the job: this is a repeat of a task whose
            // result already arrived (submitted again after an agent died).
            client.done(t.id).map_err(api_err)?;
            continue;
        }
        let spec: JobSpec = std::fs::read_to_string(&spec_path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
            .map_err(|e| SearchError::Io(format!("{}: {e}", spec_path.display())))?;
        let (query_file, database) = match &payload {
            TaskPayload::Fragment { batch, fragment, .. } => (batch_file(&job, *batch), format!("{}.stats", spec.fragments[*fragment])),
            TaskPayload::Whole { batch, queries, .. } => (whole_file(&job, *batch, queries[0]), spec.db_name.clone()),
            TaskPayload::Batch { batch, .. } => (batch_file(&job, *batch), spec.db_name.clone()),
            TaskPayload::Stop => unreachable!(),
        };
        // A batch on the whole database is printed in the report's format; everything
        // else is merged from archives, the only output with full-precision e-values.
        let outfmt = if matches!(payload, TaskPayload::Batch { .. }) { spec.outfmt.as_str() } else { "11" };
        let mut work = WorkStats::default();
        // Hot-swap: the fragment comes from node-local scratch, staged by the agent.
        let blastdb = match &payload {
            TaskPayload::Fragment { fragment, .. } if spec.hot_swap => {
                match staged_dirs.get(&(job.clone(), *fragment)).filter(|d| d.is_dir()) {
                    Some(d) => Ok(d.clone()),
                    None => {
                        let started = Instant::now();
                        let req = postcard::to_stdvec(&BlastRequest::Stage { job: job.clone(), fragment: *fragment }).unwrap();
                        let staged = client
                            .plugin("blast", &req)
                            .map_err(|e| e.to_string())
                            .and_then(|r| postcard::from_bytes::<Staged>(&r).map_err(|e| format!("bad stage reply: {e}")));
                        work.input_seconds = started.elapsed().as_secs_f64();
                        staged.map(|s| {
                            work.staged[s.source as usize] += 1;
                            staged_dirs.insert((job.clone(), *fragment), s.dir.clone());
                            s.dir
                        })
                    }
                }
            }
            _ => Ok(PathBuf::from(&spec.blastdb)),
        }
        .map(|dir| if dir.as_os_str() == spec.blastdb.as_str() { dir.into_os_string() } else { tools::search_path(&[&dir]) });
        let q = query_file.to_string_lossy().to_string();
        let mut args: Vec<&str> = vec!["-query", &q, "-db", &database, "-outfmt", outfmt];
        args.extend(spec.blast_args.iter().map(|s| s.as_str()));
        let threads = match &payload {
            TaskPayload::Batch { threads, .. } if *threads > 1 && !spec.blast_args.iter().any(|a| a == "-num_threads") => {
                threads.to_string()
            }
            _ => String::new(),
        };
        if !threads.is_empty() {
            args.extend(["-num_threads", threads.as_str()]);
        }
        // Split by queries, BLAST+ writes the batch's part itself, into the job directory.
        let part_file = match &payload {
            TaskPayload::Batch { batch, attempt, .. } => spec.parts.get(*batch).map(|p| part_tmp(p, &format!("w{attempt}"))),
            _ => None,
        };
        let part_arg = part_file.as_ref().map(|p| p.to_string_lossy().to_string());
        if let Some(p) = &part_arg {
            args.extend(["-out", p.as_str()]);
        }
        let started = Instant::now();
        let scratch = std::env::temp_dir();
        let out = match blastdb.and_then(|db| {
            tools::run(&spec.program, &args, Some(&db), Some(&scratch)).map_err(|e| match e {
                ToolError::Failed { stderr, .. } => tools::error_lines(&stderr),
                other => other.to_string(),
            })
        }) {
            Ok(o) => o,
            Err(message) => {
                if let Some(p) = &part_file {
                    let _ = std::fs::remove_file(p);
                }
                // First failure: the task goes back to the queue once (another worker
                // will likely take it); second: the master fails the run.
                let retry = match &payload {
                    TaskPayload::Fragment { job, batch, fragment, attempt: 0 } => {
                        Some(TaskPayload::Fragment { job: job.clone(), batch: *batch, fragment: *fragment, attempt: 1 })
                    }
                    TaskPayload::Whole { job, batch, queries, attempt: 0 } => {
                        Some(TaskPayload::Whole { job: job.clone(), batch: *batch, queries: queries.clone(), attempt: 1 })
                    }
                    TaskPayload::Batch { job, batch, attempt: 0, threads } => {
                        Some(TaskPayload::Batch { job: job.clone(), batch: *batch, attempt: 1, threads: *threads })
                    }
                    _ => None,
                };
                let notice = Notice::Failure(TaskFailure { what: payload.describe(&spec), message, retried: retry.is_some() });
                if let Some(r) = retry {
                    submit_task(client, &spec, &r).map_err(api_err)?;
                }
                client.publish(&topic(&spec.id), &postcard::to_stdvec(&notice).unwrap(), Dest::All).map_err(api_err)?;
                client.done(t.id).map_err(api_err)?;
                continue;
            }
        };
        work.blast_seconds = started.elapsed().as_secs_f64();
        let request = match part_file {
            Some(path) => BlastRequest::ResultFile { task: payload, path, work },
            None => BlastRequest::Result { task: payload, archive: out.stdout, work },
        };
        let body = postcard::to_stdvec(&request).unwrap();
        // Hand the result over and go on: collect earlier hand-overs without waiting.
        inflight.push(client.start(gepsea_agent::wire::Op::Plugin { name: "blast".into(), body }));
        client.done(t.id).map_err(api_err)?;
        // Results not yet taken by the agent are held here: bound them.
        while inflight.len() > 8 {
            let id = inflight.remove(0);
            client.finish(id, Duration::from_secs(600)).map_err(api_err)?;
        }
    }
    for id in inflight {
        client.finish(id, Duration::from_secs(600)).map_err(api_err)?;
    }
    Ok(())
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
    /// From the first task's submission to the workers' release: each worker's time
    /// on the job (as the no-agent master counts it, from hello to shutdown).
    pub worker_span_seconds: f64,
    /// Times unfinished batches were searched again because an agent died.
    pub resubmitted_after_failure: usize,
    /// Batches whose part an earlier, interrupted run had finished (resume).
    pub reused_parts: usize,
}

/// Runs the job `spec` (files already in `job`): submits tasks, waits for every part,
/// assembles the output into `tmp_out`. `on_progress(queries done)`.
/// `watch` is polled about once a second: `Err` ends the run (e.g. every worker died).
pub fn master(
    client: &gepsea_client::Client,
    spec: &JobSpec,
    job: &Path,
    tmp_out: &Path,
    workers: usize,
    mut on_progress: impl FnMut(usize),
    mut watch: impl FnMut() -> Result<(), SearchError>,
) -> Result<AccelStats, SearchError> {
    let api_err = |e: gepsea_agent::api::ApiError| SearchError::Io(format!("agent: {e}"));
    client.subscribe(&topic(&spec.id)).map_err(api_err)?;
    let mut nodes: BTreeSet<u32> = client.global_state().map_err(api_err)?.iter().map(|s| s.node).collect();
    // Data streaming: every agent starts staging the fragments it will search first
    // (fragment f on the (f mod n)-th node) while the first tasks are handed out.
    let mut prefetches = Vec::new();
    if spec.hot_swap && spec.split == SplitBy::Fragments {
        let order: Vec<u32> = nodes.iter().copied().collect();
        for (i, &node) in order.iter().enumerate() {
            let fragments: Vec<usize> = (0..spec.fragments.len()).filter(|f| f % order.len() == i).collect();
            let body = postcard::to_stdvec(&BlastRequest::Prefetch { job: job.to_path_buf(), fragments }).unwrap();
            prefetches.push(client.start(gepsea_agent::wire::Op::PluginAt { node, name: "blast".into(), body }));
        }
    }
    let mut stats = AccelStats::default();
    let mut done_batches = BTreeSet::new();
    let mut queries_done = 0;
    // Resume: batches whose part a previous run finished are not searched again.
    for (b, part) in spec.parts.iter().enumerate() {
        if part.is_file() {
            done_batches.insert(b);
            queries_done += spec.batches[b].1 - spec.batches[b].0;
            stats.hits +=
                crate::parts::count_hits_in(part, &spec.outfmt).map_err(|e| SearchError::Io(format!("{}: {e}", part.display())))?;
            stats.reused_parts += 1;
        }
    }
    if queries_done > 0 {
        on_progress(queries_done);
    }
    let todo: Vec<usize> = (0..spec.batches.len()).filter(|b| !done_batches.contains(b)).collect();
    let submitted = Instant::now();
    submit_tasks(client, spec, job, &todo).map_err(api_err)?;
    while done_batches.len() < spec.batches.len() {
        crate::search::check_interrupted()?;
        watch()?;
        // An agent died: results it held (handed over by its workers, or being merged
        // there) are gone. Search every unfinished batch again; results that did
        // arrive make the repeats no-ops at the mergers.
        let now: BTreeSet<u32> = client.global_state().map_err(api_err)?.iter().map(|s| s.node).collect();
        let lost: Vec<u32> = nodes.difference(&now).copied().collect();
        if !lost.is_empty() {
            eprintln!("gepsea search: the agent of node(s) {lost:?} is gone; searching its unfinished batches again");
            let unfinished: Vec<usize> = (0..spec.batches.len()).filter(|b| !done_batches.contains(b)).collect();
            submit_tasks(client, spec, job, &unfinished).map_err(api_err)?;
            stats.resubmitted_after_failure += 1;
        }
        nodes = now;
        for a in client.next_adverts(64, Duration::from_secs(1)).map_err(api_err)? {
            let d = match postcard::from_bytes::<Notice>(&a.body).map_err(|e| SearchError::Io(format!("bad notice: {e}")))? {
                Notice::Failure(f) if f.retried => {
                    eprintln!("gepsea search: task {} failed; retrying once", f.what);
                    continue;
                }
                Notice::Failure(f) => return Err(SearchError::TaskFailed { task: 0, what: f.what, message: f.message }),
                Notice::Part(d) => d,
            };
            if let Some(e) = d.error {
                return Err(SearchError::Io(e));
            }
            if done_batches.insert(d.batch) {
                queries_done += d.queries;
                stats.hits += d.hits;
                stats.whole_searches += d.whole_searches;
                stats.work.add(&d.work);
                stats.bytes_wire += d.bytes_wire;
                stats.bytes_raw += d.bytes_raw;
                *stats.mergers.entry(d.merger).or_default() += 1;
                on_progress(queries_done);
            }
        }
    }
    for _ in 0..workers {
        client.submit(&postcard::to_stdvec(&TaskPayload::Stop).unwrap()).map_err(api_err)?;
    }
    stats.worker_span_seconds = submitted.elapsed().as_secs_f64();
    for p in prefetches {
        // Long done by now; a failed prefetch only meant a later stage did the work.
        if let Err(e) = client.finish(p, Duration::from_secs(60)) {
            eprintln!("gepsea search: a fragment prefetch failed: {e}");
        }
    }
    if spec.hot_swap {
        let body = postcard::to_stdvec(&BlastRequest::StageCounts { job: job.to_path_buf() }).unwrap();
        for &node in &nodes {
            let counts: [u32; 4] =
                client.plugin_at(node, "blast", body.clone()).ok().and_then(|r| postcard::from_bytes(&r).ok()).unwrap_or_default();
            for (a, b) in stats.stagings.iter_mut().zip(counts) {
                *a += b;
            }
        }
    }
    // Out of core: one part in memory at a time, streamed to the output in order.
    let file = std::fs::File::create(tmp_out).map_err(|e| SearchError::Output { path: tmp_out.to_path_buf(), source: e })?;
    let mut asm = Assembler::new(std::io::BufWriter::with_capacity(1 << 20, file), report::base_format(&spec.outfmt));
    let n = spec.batches.len();
    // The parts stay until the output is in place: a run stopped now resumes from them.
    for (b, p) in spec.parts.iter().enumerate() {
        let part = std::fs::File::open(p).map_err(|e| SearchError::Io(format!("{}: {e}", p.display())))?;
        asm.part_from(std::io::BufReader::with_capacity(1 << 20, part), b + 1 == n)
            .map_err(|e| SearchError::Io(format!("{}: {e}", p.display())))?;
    }
    asm.finish().map_err(SearchError::Io)?;
    stats.parts = n;
    Ok(stats)
}

/// Submits a task; a fragment search names its fragment, so that the scheduler prefers
/// a node that holds it.
fn submit_task(client: &gepsea_client::Client, spec: &JobSpec, task: &TaskPayload) -> Result<u64, gepsea_agent::api::ApiError> {
    let p = postcard::to_stdvec(task).unwrap();
    match task {
        TaskPayload::Fragment { fragment, .. } if spec.hot_swap => {
            client.submit_near(&p, &fragment_object(&spec.fragments[*fragment], &spec.fragment_files[*fragment]))
        }
        _ => client.submit(&p),
    }
}

/// The tasks of `batches`. Split by queries: one per batch, in batch order (the guided
/// batches shrink along it, so the longest go first); the last `workers` run BLAST+ with
/// `workers` threads, so that when one worker runs out of work the cores it leaves
/// idle help finish the others' last tasks (BLAST+ output does not depend on its thread
/// count). By fragments: one per (batch,
/// fragment), fragment-major, so that consecutive tasks share a fragment and a worker
/// tends to search the same fragment again.
fn submit_tasks(client: &gepsea_client::Client, spec: &JobSpec, job: &Path, batches: &[usize]) -> Result<(), gepsea_agent::api::ApiError> {
    if spec.split == SplitBy::Queries {
        for (i, &batch) in batches.iter().enumerate() {
            let threads = if i + spec.tail_threads >= batches.len() { spec.tail_threads } else { 1 };
            submit_task(client, spec, &TaskPayload::Batch { job: job.to_path_buf(), batch, attempt: 0, threads })?;
        }
        return Ok(());
    }
    for fragment in 0..spec.fragments.len() {
        for &batch in batches {
            submit_task(client, spec, &TaskPayload::Fragment { job: job.to_path_buf(), batch, fragment, attempt: 0 })?;
        }
    }
    Ok(())
}

/// Makes the child get SIGTERM when the process that started it dies, however it dies
/// (killed, or aborted by a launcher): an agent never outlives its job.
pub fn with_parent_death(c: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches only the child being created.
    unsafe {
        c.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        })
    }
}

/// A node agent started for a local-mode run (killed on drop).
pub struct LocalAgent {
    child: Child,
    pub namespace: String,
}

impl LocalAgent {
    pub fn start(exe: &Path, namespace: &str) -> Result<LocalAgent, SearchError> {
        let child = with_parent_death(&mut Command::new(exe))
            .args(["agent", "--namespace", namespace, "--node-id", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| SearchError::Io(format!("starting the agent ({}): {e}", exe.display())))?;
        let a = LocalAgent { child, namespace: namespace.to_string() };
        gepsea_client::wait_for_agent(namespace, 1, Duration::from_secs(20))
            .map_err(|e| SearchError::Io(format!("agent did not start: {e}")))?;
        Ok(a)
    }
}

impl Drop for LocalAgent {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fragment's files from the shared database directory, as one cache object.
fn read_fragment(spec: &JobSpec, files: &BTreeMap<String, String>) -> Result<Vec<u8>, PluginError> {
    let mut contents = Vec::new();
    for f in files.keys() {
        let p = spec.db_dir.join(f);
        contents.push((f.clone(), std::fs::read(&p).map_err(|e| failed(format!("{}: {e}", p.display())))?));
    }
    postcard::to_stdvec(&contents).map_err(failed)
}

/// Hex SHA-256, as the manifest records it (`db::format`).
fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(data))
}
