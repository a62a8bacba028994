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
use gepsea_agent::wire::{Codec, Dest, ErrorKind, LockMode};
use parking_lot::Mutex;

use crate::archive;
use crate::plan::*;
use crate::report::{self};

use super::*;

#[derive(Default)]
pub(crate) struct BatchState {
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
    stage_counts: Mutex<HashMap<PathBuf, [u32; 4]>>,
}

pub(crate) fn failed(e: impl std::fmt::Display) -> PluginError {
    PluginError::Failed(e.to_string())
}

impl BlastPlugin {
    pub(crate) fn spec(&self, job: &Path) -> Result<Arc<JobSpec>, PluginError> {
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
    pub(crate) fn stage(
        &self,
        ctx: &Context<'_>,
        job: &Path,
        spec: &JobSpec,
        fragment: usize,
    ) -> Result<(PathBuf, StageSource), PluginError> {
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

    pub(crate) fn stage_locked(
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

    pub(crate) fn stage_counts(&self, job: &Path) -> [u32; 4] {
        self.stage_counts.lock().get(job).copied().unwrap_or_default()
    }

    pub(crate) fn on_result(&self, ctx: &Context<'_>, task: TaskPayload, archive: Vec<u8>, work: WorkStats) -> Result<(), PluginError> {
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

    pub(crate) fn on_part(
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
            st.tasks.push(crate::trace::TaskTrace {
                batch,
                fragment: match &task {
                    TaskPayload::Fragment { fragment, .. } => Some(*fragment),
                    _ => None,
                },
                seconds: work.blast_seconds,
                bytes: text.len() as u64,
                worker: work.worker,
                taken_unix: work.taken_unix,
                handed_unix: work.handed_unix,
            });
            st.bytes_wire += wire;
            st.bytes_raw += raw;
            match &task {
                TaskPayload::Fragment { fragment, .. } => {
                    // A re-run (its worker died after handing the result over) adds nothing.
                    // (After the merge `fragments` is empty: test `merged` first.)
                    if !st.merged && st.fragments.get(*fragment).is_some_and(|f| f.is_none()) {
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
            let merge_started = Instant::now();
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
                st.merge_seconds += merge_started.elapsed().as_secs_f64();
            }
            if !risky.is_empty() {
                // Whole-database searches for the queries a fragment merge cannot settle,
                // spread over the workers as separate tasks.
                let queries = crate::fasta::read(&batch_file(&job, batch)).map_err(failed)?;
                for chunk in crate::plan::fallback_chunks(&risky) {
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
            }],
            merge_seconds: 0.0,
            write_seconds: 0.0,
            part_bytes: bytes,
        };
        ctx.services.publish(&topic(&spec.id), &postcard::to_stdvec(&Notice::Part(done)).map_err(failed)?, Dest::All)?;
        Ok(())
    }

    /// Writes the batch's part of the report once every query is settled.
    pub(crate) fn maybe_write(&self, ctx: &Context<'_>, spec: &JobSpec, job: &Path, batch: usize) -> Result<(), PluginError> {
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
                part_bytes: 0,
            };
            (hsps, done)
        };
        let scratch = job.join(format!("scratch-{batch}"));
        let write_started = Instant::now();
        let mut part_bytes = 0;
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
            part_bytes = std::fs::metadata(&tmp).map(|m| m.len()).unwrap_or(0);
            std::fs::rename(&tmp, part).map_err(|e| e.to_string())
        })();
        let _ = std::fs::remove_dir_all(&scratch);
        let done = PartDone { error: result.err(), write_seconds: write_started.elapsed().as_secs_f64(), part_bytes, ..done };
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
