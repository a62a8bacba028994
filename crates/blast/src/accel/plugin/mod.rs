//! The agent side of a search: the BLAST plug-in each agent hosts. It receives raw
//! results from its node's workers, forwards them to the batch's merger agent
//! (compressed across nodes), merges each batch when its last fragment is in, writes
//! the batch's part, and stages database fragments into node-local scratch.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gepsea_agent::api::{Api, ApiError, Cas};
use gepsea_agent::plugin::{Context, Plugin, PluginError, Uses};
use gepsea_agent::wire::{Codec, ErrorKind, LockMode};
use parking_lot::Mutex;

use crate::archive;
use crate::plan::*;

mod staging;

use super::hits::{BatchMerge, FragmentHits, Settled};
use super::writer::{make_piece, place_piece, publish_part, spawn_writers, WriteJob};
use super::*;

/// A result as it reaches its batch's merger.
pub(crate) enum Delivery {
    /// A fragment's hits, parsed by the agent of the node that searched it.
    Hits(FragmentHits),
    /// A whole-database fallback's archive (parsed by the merger).
    Archive(String),
}

#[derive(Default)]
pub(crate) struct BatchState {
    /// The fragments' hits, merged as they arrive (taken out when the last is in).
    merge: Option<BatchMerge>,
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
    /// For the trace: the batch's BLAST+ runs and the time its merge took.
    tasks: Vec<crate::trace::TaskTrace>,
    merge_seconds: f64,
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
    stage_counts: Mutex<HashMap<PathBuf, StagingStats>>,
    /// Bytes that stagings under way are writing into scratch (reserved under the
    /// scratch budget; see `scratch`). Also serializes making room.
    scratch_reserved: Mutex<u64>,
    /// Batches' mergers as recorded on the board (by merger key), so that each result
    /// does not ask again.
    mergers: Mutex<HashMap<String, u32>>,
    /// Fragments this agent asked itself to stage ahead of use (each once per job), and
    /// whether a look ahead is under way.
    prefetching: Arc<Mutex<BTreeSet<(PathBuf, usize)>>>,
    looking_ahead: Arc<std::sync::atomic::AtomicBool>,
    /// The part writers (started on first use).
    writers: std::sync::OnceLock<crossbeam_channel::Sender<WriteJob>>,
    /// The last jobs forgotten (at most [`FORGOTTEN`]): a late duplicate result for one
    /// is refused instead of bringing its state back.
    forgotten: Mutex<std::collections::VecDeque<PathBuf>>,
}

const FORGOTTEN: usize = 256;

/// Where this node keeps batch `batch`'s piece until the master places it.
pub(crate) fn piece_path(scratch: &Path, job_id: &str, batch: usize) -> PathBuf {
    scratch.join(format!("piece-{job_id}-{batch}"))
}

/// The board key (and placement key) of a batch's merger.
pub(crate) fn merger_key(spec: &JobSpec, batch: usize) -> String {
    format!("{}/merger/{batch}", topic(&spec.id))
}

pub(crate) fn failed(e: impl std::fmt::Display) -> PluginError {
    PluginError::Failed(e.to_string())
}

impl BlastPlugin {
    pub(crate) fn spec(&self, job: &Path) -> Result<Arc<JobSpec>, PluginError> {
        if let Some(s) = self.specs.lock().get(job) {
            return Ok(s.clone());
        }
        if self.forgotten.lock().iter().any(|j| j == job) {
            return Err(PluginError::BadRequest(format!("job {} is over (every part was written)", job.display())));
        }
        let p = job.join("job.json");
        let text = std::fs::read_to_string(&p).map_err(|e| PluginError::BadRequest(format!("{}: {e}", p.display())))?;
        let s: Arc<JobSpec> = Arc::new(serde_json::from_str(&text).map_err(|e| PluginError::BadRequest(format!("{}: {e}", p.display())))?);
        self.specs.lock().insert(job.to_path_buf(), s.clone());
        Ok(s)
    }

    /// The agent that merges and writes `batch`.
    pub(crate) fn merger(&self, ctx: &Context<'_>, spec: &JobSpec, batch: usize) -> Result<u32, PluginError> {
        let mut nodes: Vec<u32> = ctx.services.global_state()?.iter().map(|s| s.node).collect();
        nodes.sort_unstable();
        if nodes.is_empty() {
            nodes.push(ctx.node);
        }
        match spec.assign {
            MergeAssign::Single => Ok(nodes[0]),
            MergeAssign::Static => Ok(nodes[batch % nodes.len()]),
            MergeAssign::Dynamic => {
                // The load balancer places the batch on the agent with the fewest batches
                // being merged (see `Placement`); the first placement is recorded on the
                // board, so that the answer stays the same through a scheduler change.
                // An agent that died is replaced by a new placement.
                let key = merger_key(spec, batch);
                if let Some(&m) = self.mergers.lock().get(&key) {
                    if nodes.contains(&m) {
                        return Ok(m);
                    }
                }
                let mut expected = 0;
                let mut recorded = ctx.services.board_get(&key)?;
                loop {
                    if let Some(v) = &recorded {
                        let holder =
                            u32::from_le_bytes(v.value.as_slice().try_into().map_err(|_| failed(format!("{key} is not a node id")))?);
                        if nodes.contains(&holder) {
                            self.mergers.lock().insert(key, holder);
                            return Ok(holder);
                        }
                        expected = v.version;
                    }
                    let pick = match ctx.services.place(&key, 1) {
                        Ok(n) if nodes.contains(&n) => n,
                        // No scheduler just now (an election), or it does not know the
                        // agent we see: this agent merges.
                        Ok(_) | Err(ApiError::Agent { kind: ErrorKind::Unavailable, .. }) => ctx.node,
                        Err(e) => return Err(e.into()),
                    };
                    match ctx.services.board_cas(&key, expected, &pick.to_le_bytes())? {
                        Cas::Written(_) => {
                            self.mergers.lock().insert(key, pick);
                            return Ok(pick);
                        }
                        Cas::Conflict(_) => recorded = ctx.services.board_get(&key)?,
                    }
                }
            }
        }
    }

    /// Drops everything kept for `job` (see [`BlastRequest::Forget`]). Staged
    /// fragments stay: they belong to the database, not to the job.
    pub(crate) fn forget(&self, job: &Path) -> Option<Arc<JobSpec>> {
        {
            let mut f = self.forgotten.lock();
            if !f.iter().any(|j| j == job) {
                if f.len() == FORGOTTEN {
                    f.pop_front();
                }
                f.push_back(job.to_path_buf());
            }
        }
        let spec = self.specs.lock().remove(job);
        if let Some(spec) = &spec {
            // Every board key of the job lies under its topic (see `merger_key`).
            let prefix = format!("{}/", topic(&spec.id));
            self.mergers.lock().retain(|k, _| !k.starts_with(&prefix));
        }
        self.batches.lock().retain(|(j, _), _| j != job);
        self.written.lock().retain(|(j, _)| j != job);
        self.stage_counts.lock().remove(job);
        self.prefetching.lock().retain(|(j, _)| j != job);
        spec
    }

    /// Jobs this agent keeps state for (specs, batches, written parts, staging counts,
    /// look-ahead records): what [`BlastPlugin::forget`] must leave empty.
    #[cfg(test)]
    pub(crate) fn jobs_held(&self) -> BTreeSet<PathBuf> {
        let mut held: BTreeSet<PathBuf> = self.specs.lock().keys().cloned().collect();
        held.extend(self.batches.lock().keys().map(|(j, _)| j.clone()));
        held.extend(self.written.lock().iter().map(|(j, _)| j.clone()));
        held.extend(self.stage_counts.lock().keys().cloned());
        held.extend(self.prefetching.lock().iter().map(|(j, _)| j.clone()));
        held
    }

    pub(crate) fn on_result(&self, ctx: &Context<'_>, task: TaskPayload, archive: Vec<u8>, work: WorkStats) -> Result<(), PluginError> {
        let (job, batch) = match &task {
            TaskPayload::Fragment { job, batch, .. } | TaskPayload::Whole { job, batch, .. } | TaskPayload::Batch { job, batch, .. } => {
                (job.clone(), *batch)
            }
            TaskPayload::Stop => return Err(PluginError::BadRequest("a stop task has no result".into())),
        };
        let spec = self.spec(&job)?;
        let text = String::from_utf8(archive).map_err(|_| failed("archive is not text"))?;
        // A fragment's result is parsed here, on the node that searched it, while the
        // batch's other fragments are still being searched (see `hits`); a fallback's
        // (rare) goes to the merger as it is.
        let delivery = match &task {
            TaskPayload::Fragment { fragment, .. } => {
                let (start, end) = *spec.batches.get(batch).ok_or_else(|| PluginError::BadRequest(format!("no batch {batch}")))?;
                Delivery::Hits(FragmentHits::parse(&text, *fragment, end - start, spec.k).map_err(failed)?)
            }
            _ => Delivery::Archive(text),
        };
        let mut body: Option<Vec<u8>> = None;
        // A merger that dies while (or before) it takes the result is replaced by the
        // next one the live view gives; the master searches the batches it held again.
        for attempt in 0.. {
            let merger = self.merger(ctx, &spec, batch)?;
            if merger == ctx.node {
                return self.on_part(ctx, task, delivery, work, (0, 0));
            }
            let b = match &body {
                Some(b) => b.clone(),
                None => {
                    let bytes = match &delivery {
                        Delivery::Hits(h) => postcard::to_stdvec(h).map_err(failed)?,
                        Delivery::Archive(t) => t.as_bytes().to_vec(),
                    };
                    // Crossing nodes: compress first (runtime output compression).
                    let (compressed, data) =
                        if spec.compress { (true, ctx.engine.compress(&Codec::Zstd, 3, &bytes).map_err(failed)?) } else { (false, bytes) };
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

    pub(crate) fn on_part(
        &self,
        ctx: &Context<'_>,
        task: TaskPayload,
        delivery: Delivery,
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
        // Queries whose whole-database search starts now (see `BatchMerge::new_overflows`).
        let mut risky = Vec::new();
        if self.written.lock().contains(&(job.clone(), batch)) {
            return Ok(());
        }
        if matches!(task, TaskPayload::Batch { .. }) {
            return Err(PluginError::BadRequest(format!("batch {batch}: a split-by-queries result comes as a file, not as text")));
        }
        {
            let mut all = self.batches.lock();
            let st = all.entry((job.clone(), batch)).or_insert_with(|| BatchState {
                merge: Some(BatchMerge::new(nfrag, nq, spec.k)),
                results: vec![None; nq],
                ..Default::default()
            });
            st.work.add(&work);
            let (bytes, parse_seconds) = match &delivery {
                Delivery::Hits(h) => (h.archive_bytes, h.parse_seconds),
                Delivery::Archive(t) => (t.len() as u64, 0.0),
            };
            st.tasks.push(crate::trace::TaskTrace {
                batch,
                fragment: match &task {
                    TaskPayload::Fragment { fragment, .. } => Some(*fragment),
                    _ => None,
                },
                seconds: work.blast_seconds,
                bytes,
                worker: work.worker,
                taken_unix: work.taken_unix,
                handed_unix: work.handed_unix,
                parse_seconds,
                input_seconds: work.input_seconds,
            });
            st.bytes_wire += wire;
            st.bytes_raw += raw;
            match (&task, delivery) {
                (TaskPayload::Fragment { fragment, .. }, Delivery::Hits(hits)) => {
                    // A re-run (its worker died after handing the result over) adds
                    // nothing, and neither does one after the merge.
                    if let Some(m) = st.merge.as_mut() {
                        let merge_started = Instant::now();
                        m.add(*fragment, hits).map_err(|e| failed(format!("batch {batch}: {e}")))?;
                        risky = m.new_overflows(spec.prelim).into_iter().map(|local| start + local).collect();
                        st.pending_whole.extend(risky.iter().copied());
                        st.whole_searches += risky.len();
                        st.merge_seconds += merge_started.elapsed().as_secs_f64();
                        if m.complete() {
                            st.merged = true;
                            ready = st.merge.take();
                        }
                    }
                }
                (TaskPayload::Fragment { .. }, Delivery::Archive(_)) => {
                    return Err(PluginError::BadRequest(format!("batch {batch}: a fragment's result comes parsed, not as an archive")));
                }
                (TaskPayload::Whole { queries, .. }, Delivery::Archive(text)) => {
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
                (TaskPayload::Whole { .. }, Delivery::Hits(_)) => {
                    return Err(PluginError::BadRequest(format!("batch {batch}: a fallback's result comes as an archive")));
                }
                (TaskPayload::Stop | TaskPayload::Batch { .. }, _) => {}
            }
        }
        if !risky.is_empty() {
            // Whole-database searches for the queries a fragment merge cannot settle,
            // spread over the workers as separate tasks.
            let queries = crate::fasta::read(&batch_file(&job, batch)).map_err(failed)?;
            for chunk in crate::plan::fallback_chunks(&risky) {
                let text = crate::fasta::text_of(chunk.iter().map(|&g| &queries[g - start]));
                std::fs::write(whole_file(&job, batch, chunk[0]), text).map_err(failed)?;
                let payload = postcard::to_stdvec(&TaskPayload::Whole { job: job.clone(), batch, queries: chunk.to_vec(), attempt: 0 })
                    .map_err(failed)?;
                ctx.services.submit_urgent(&payload)?;
            }
        }
        if let Some(merge) = ready {
            let merge_started = Instant::now();
            let mut merged: Vec<(usize, Vec<String>, usize)> = Vec::new();
            for (local, settled) in merge.settle(spec.prelim).into_iter().enumerate() {
                match settled {
                    // Its whole-database search went out when its counts tripped the
                    // guard, at the latest with the fragment that completed the batch.
                    Settled::Overflow => {}
                    Settled::Hits { hits, hsps } => merged.push((local, hsps, hits)),
                }
            }
            let mut all = self.batches.lock();
            let st = all.get_mut(&(job.clone(), batch)).unwrap();
            for (local, hsps, n) in merged {
                st.results[local] = Some(hsps);
                st.hits += n;
            }
            st.merge_seconds += merge_started.elapsed().as_secs_f64();
        }
        self.maybe_write(ctx, &spec, &job, batch)
    }

    /// Split by queries: the worker's output file is the batch's part as it stands. The
    /// job directory is shared by every node, so the worker's own agent puts it in place:
    /// no merger, nothing read into memory but a line at a time to count hits.
    pub(crate) fn on_result_file(&self, ctx: &Context<'_>, task: TaskPayload, file: &Path, work: WorkStats) -> Result<(), PluginError> {
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
        // The batch's piece, from the part just written (still in the page cache), for
        // the master to have placed in the output while the search goes on, as merged
        // batches are (`master::Placement`).
        let piece = piece_path(ctx.scratch, &spec.id, *batch);
        let piece_bytes = result.as_ref().ok().and_then(|_| make_piece(&spec, *batch, part, &piece));
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
            tasks: vec![crate::trace::TaskTrace {
                batch: *batch,
                fragment: None,
                seconds: work.blast_seconds,
                bytes,
                worker: work.worker,
                taken_unix: work.taken_unix,
                handed_unix: work.handed_unix,
                parse_seconds: 0.0,
                input_seconds: work.input_seconds,
            }],
            merge_seconds: 0.0,
            write_seconds: 0.0,
            write_cpu_seconds: 0.0,
            write_thread_cpu_seconds: 0.0,
            part_bytes: bytes,
            piece_bytes,
            written_unix: crate::trace::unix_now(),
            shipped: None,
            stats_ahead: false,
        };
        publish_part(ctx.background.clone(), spec.clone(), job.clone(), done).map_err(failed)
    }

    /// Writes the batch's part of the report once every query is settled.
    pub(crate) fn maybe_write(&self, ctx: &Context<'_>, spec: &Arc<JobSpec>, job: &Path, batch: usize) -> Result<(), PluginError> {
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
                tasks: std::mem::take(&mut st.tasks),
                merge_seconds: st.merge_seconds,
                write_seconds: 0.0,
                write_cpu_seconds: 0.0,
                write_thread_cpu_seconds: 0.0,
                part_bytes: 0,
                piece_bytes: None,
                written_unix: 0.0,
                shipped: None,
                stats_ahead: false,
            };
            (hsps, done)
        };
        self.batches.lock().remove(&(job.to_path_buf(), batch));
        self.written.lock().insert((job.to_path_buf(), batch));
        if spec.assign == MergeAssign::Dynamic {
            self.mergers.lock().remove(&merger_key(spec, batch));
        }
        // Writing runs BLAST+ and its formatter for seconds: on a writer thread, so that
        // this job thread goes on taking results (and submitting fallbacks) meanwhile.
        let job = WriteJob {
            spec: spec.clone(),
            job: job.to_path_buf(),
            batch,
            hsps,
            done,
            services: ctx.background.clone(),
            scratch: ctx.scratch.join(format!("part-{}-{batch}", spec.id)),
            piece: piece_path(ctx.scratch, &spec.id, batch),
        };
        self.writers.get_or_init(spawn_writers).send(job).map_err(|_| failed("the part writers stopped"))?;
        Ok(())
    }
}

impl Plugin for BlastPlugin {
    fn name(&self) -> &str {
        "blast"
    }
    fn uses(&self) -> &[Uses] {
        // Scheduling and merger placement; merger records; part notices; runtime
        // compression; the merge; counting the hits of a part; what nodes hold; fragments
        // in memory, read from storage by one agent under a lock, staged ahead of use.
        &[
            Uses::LoadBalancing,
            Uses::BulletinBoard,
            Uses::Advertising,
            Uses::Compression,
            Uses::SortMerge,
            Uses::Parsing,
            Uses::ProcessState,
            Uses::DataCache,
            Uses::Locks,
            Uses::DataStreaming,
        ]
    }
    fn handle(&self, ctx: &Context<'_>, request: &[u8]) -> Result<Vec<u8>, PluginError> {
        match postcard::from_bytes::<BlastRequest>(request).map_err(|e| PluginError::BadRequest(format!("blast request: {e}")))? {
            BlastRequest::Result { task, archive, work } => self.on_result(ctx, task, archive, work)?,
            BlastRequest::ResultFile { task, path, work } => self.on_result_file(ctx, task, &path, work)?,
            BlastRequest::Stage { job, fragment } => {
                let spec = self.spec(&job)?;
                let (dir, source) = self.stage(ctx, &job, &spec, fragment, true)?;
                self.look_ahead(ctx, &job, &spec);
                return postcard::to_stdvec(&Staged { dir, source }).map_err(failed);
            }
            BlastRequest::StageCounts { job } => return postcard::to_stdvec(&self.stage_counts(&job)).map_err(failed),
            BlastRequest::Forget { job } => {
                // Pieces the master did not ask for (it wrote those batches itself).
                if let Some(spec) = self.forget(&job) {
                    for b in 0..spec.batches.len() {
                        let _ = std::fs::remove_file(piece_path(ctx.scratch, &spec.id, b));
                    }
                }
            }
            BlastRequest::Place { job, batch, offset, out } => {
                let spec = self.spec(&job)?;
                let len = place_piece(&piece_path(ctx.scratch, &spec.id, batch), &out, offset).map_err(failed)?;
                return postcard::to_stdvec(&len).map_err(failed);
            }
            BlastRequest::Prefetch { job, fragments, ahead } => {
                let spec = self.spec(&job)?;
                if !ahead {
                    // The look-ahead leaves these to this prefetch rather than staging
                    // one of them first (and this prefetch then finding it staged).
                    self.prefetching.lock().extend(fragments.iter().map(|&f| (job.clone(), f)));
                }
                for f in fragments {
                    self.stage(ctx, &job, &spec, f, !ahead)?;
                }
            }
            BlastRequest::Part { task, compressed, data, work } => {
                let wire = data.len() as u64;
                let raw = if compressed { ctx.engine.decompress(&Codec::Zstd, &data).map_err(failed)? } else { data };
                let len = raw.len() as u64;
                let delivery = match &task {
                    TaskPayload::Fragment { .. } => {
                        Delivery::Hits(postcard::from_bytes(&raw).map_err(|e| PluginError::BadRequest(format!("a fragment's hits: {e}")))?)
                    }
                    _ => Delivery::Archive(String::from_utf8(raw).map_err(|_| failed("archive is not text"))?),
                };
                self.on_part(ctx, task, delivery, work, (wire, len))?;
            }
        }
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str) -> JobSpec {
        JobSpec {
            id: id.into(),
            program: "blastp".into(),
            db_dir: PathBuf::from("/nonexistent"),
            blastdb: String::new(),
            db_name: "db".into(),
            outfmt: "6".into(),
            blast_args: Vec::new(),
            k: 500,
            prelim: 500,
            fragments: vec!["f0".into(), "f1".into()],
            batches: vec![(0, 1)],
            split: SplitBy::Fragments,
            tail_threads: 0,
            compress: true,
            assign: MergeAssign::Dynamic,
            hot_swap: true,
            scratch_bytes: None,
            fragment_files: Vec::new(),
            parts: vec![PathBuf::from("/nonexistent/part0")],
            recording: None,
            ship: None,
        }
    }

    #[test]
    fn forget_drops_every_trace_of_one_job_and_refuses_it_afterwards() {
        let dir = std::env::temp_dir().join(format!("gepsea-forget-{}", std::process::id()));
        let plugin = BlastPlugin::default();
        let jobs: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("job{i}"))).collect();
        for (i, job) in jobs.iter().enumerate() {
            std::fs::create_dir_all(job).unwrap();
            std::fs::write(job.join("job.json"), serde_json::to_string(&spec(&format!("id{i}"))).unwrap()).unwrap();
            let s = plugin.spec(job).unwrap();
            plugin.batches.lock().insert((job.clone(), 0), BatchState::default());
            plugin.written.lock().insert((job.clone(), 0));
            plugin.stage_counts.lock().insert(job.clone(), StagingStats { by_source: [1, 0, 0, 0], ..Default::default() });
            plugin.prefetching.lock().insert((job.clone(), 1));
            plugin.mergers.lock().insert(merger_key(&s, 0), 1);
        }
        plugin.forget(&jobs[0]);
        let kept: BTreeSet<PathBuf> = [jobs[1].clone()].into();
        assert_eq!(plugin.jobs_held(), kept);
        let mergers: Vec<String> = plugin.mergers.lock().keys().cloned().collect();
        assert_eq!(mergers, vec![merger_key(&spec("id1"), 0)]);
        // A late result of the finished job does not bring it back (its job.json is
        // still there), while the other job goes on.
        let e = plugin.spec(&jobs[0]).unwrap_err().to_string();
        assert!(e.contains("is over"), "{e}");
        assert_eq!(plugin.jobs_held(), kept);
        assert_eq!(plugin.spec(&jobs[1]).unwrap().id, "id1");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
