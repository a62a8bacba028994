//! The master of a search over the agents: submits the tasks, asks the agents to
//! prefetch fragments, follows the parts the merger agents write, resubmits the work of
//! a dead agent, and has the batches' pieces written in place in the output.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use gepsea_agent::api::Api;

use crate::error::SearchError;
use crate::plan::*;

use super::*;

/// Runs the job `spec` (files already in `job`): submits tasks, waits for every part,
/// assembles the output into `tmp_out` (an empty file). `on_progress(queries done)`.
/// `watch` is polled about once a second: `Err` ends the run (e.g. every worker died).
///
/// With `agents_see_out` (`tmp_out` is where every agent can write it), each merger
/// agent writes its batches' pieces at their final offsets while the search goes on,
/// as soon as the lengths of the pieces before them are known (see `Placement`); the
/// master writes only what they could not (parts an earlier run finished, pieces whose
/// agent died or could not make them) from the part files.
#[allow(clippy::too_many_arguments)]
pub fn master(
    client: &gepsea_client::Client,
    spec: &JobSpec,
    job: &Path,
    tmp_out: &Path,
    agents_see_out: bool,
    workers: usize,
    mut on_progress: impl FnMut(usize),
    mut watch: impl FnMut() -> Result<(), SearchError>,
) -> Result<AccelStats, SearchError> {
    super::ahead::alongside(spec, job, |ahead| {
        let api_err = super::agent_error;
        client.subscribe(&topic(&spec.id)).map_err(api_err)?;
        // Each node's agent by incarnation: one that restarted lost what its predecessor held.
        let agents_now = || -> Result<BTreeMap<u32, u64>, SearchError> {
            Ok(client.global_state().map_err(api_err)?.iter().map(|s| (s.node, s.incarnation)).collect())
        };
        let mut agents = agents_now()?;
        let mut nodes: BTreeSet<u32> = agents.keys().copied().collect();
        // Nodes whose agent died and has not been seen back yet.
        let mut gone: BTreeSet<u32> = BTreeSet::new();
        // Data streaming: every agent stages the fragments it will search first (see
        // `prefetch_plan`). The tasks go out once each node holds its first one, so that
        // the scheduler, which hands a taker a task on a fragment its node holds, can keep
        // every node on its own fragment from the first task on; the rest are staged while
        // the search goes on.
        let mut prefetches = Vec::new();
        if spec.hot_swap && spec.split == SplitBy::Fragments {
            let order: Vec<u32> = nodes.iter().copied().collect();
            let prefetch = |node: u32, fragments: &[usize]| {
                let body =
                    postcard::to_stdvec(&BlastRequest::Prefetch { job: job.to_path_buf(), fragments: fragments.to_vec(), ahead: false })
                        .unwrap();
                client.start(gepsea_agent::wire::Op::PluginAt { node, name: "blast".into(), body })
            };
            let plan = prefetch_plan(order.len(), spec.fragments.len());
            let firsts: Vec<u64> =
                order.iter().zip(&plan).filter(|(_, f)| !f.is_empty()).map(|(&node, f)| prefetch(node, &f[..1])).collect();
            prefetches.extend(order.iter().zip(&plan).filter(|(_, f)| f.len() > 1).map(|(&node, f)| prefetch(node, &f[1..])));
            for id in firsts {
                // A failed prefetch only means that a worker stages the fragment itself; a
                // slow one (a large fragment) goes on while the tasks go out.
                match client.finish(id, Duration::from_secs(120)) {
                    Ok(_) | Err(gepsea_agent::api::ApiError::Timeout(_)) => {}
                    Err(e) => note!("gepsea search: a fragment prefetch failed: {e}"),
                }
            }
        }
        let mut stats = AccelStats::default();
        let mut done_batches = BTreeSet::new();
        let mut queries_done = 0;
        let mut placement = Placement::new(spec.batches.len());
        // Resume: batches whose part a previous run finished are not searched again.
        for (b, part) in spec.parts.iter().enumerate() {
            if part.is_file() {
                done_batches.insert(b);
                queries_done += spec.batches[b].1 - spec.batches[b].0;
                stats.hits +=
                    crate::parts::count_hits_in(part, &spec.outfmt).map_err(|e| SearchError::Io(format!("{}: {e}", part.display())))?;
                stats.reused_parts += 1;
                // Its piece's length, so that the pieces after it can be placed meanwhile;
                // the master writes this one at the end.
                if agents_see_out {
                    placement.known(b, piece_of_part(spec, b, std::io::sink())?, None);
                }
            }
        }
        if queries_done > 0 {
            on_progress(queries_done);
        }
        // Parts an earlier run finished were never shipped by this run's agents: this
        // node's agent ships them while the search goes on.
        let mut reshipping = Vec::new();
        if let Some(ship) = &spec.ship {
            for &b in &done_batches {
                let req = super::writer::part_request(spec, job, b, ship).map_err(SearchError::Io)?;
                reshipping.push((b, client.start(crate::ship::part_op(req))));
            }
        }
        let todo: Vec<usize> = (0..spec.batches.len()).filter(|b| !done_batches.contains(b)).collect();
        let submitted = Instant::now();
        stats.trace.started_unix = crate::trace::unix_now();
        submit_tasks(client, spec, job, &todo).map_err(api_err)?;
        if let Some(a) = ahead {
            a.start(&todo);
        }
        while done_batches.len() < spec.batches.len() {
            crate::error::check_interrupted()?;
            watch()?;
            // An agent died: results it held (handed over by its workers, or being merged
            // there) are gone. Search every unfinished batch again; results that did
            // arrive make the repeats no-ops at the mergers.
            let now = agents_now()?;
            let lost: Vec<u32> = agents.iter().filter(|(n, inc)| now.get(n) != Some(inc)).map(|(n, _)| *n).collect();
            if !lost.is_empty() {
                note!("gepsea search: the agent of node(s) {lost:?} is gone; searching its unfinished batches again");
                let unfinished: Vec<usize> = (0..spec.batches.len()).filter(|b| !done_batches.contains(b)).collect();
                submit_tasks(client, spec, job, &unfinished).map_err(api_err)?;
                stats.resubmitted_after_failure += 1;
            }
            // A restarted agent may be back in the same look (a new incarnation) or only in
            // a later one, after the membership dropped its node for a while.
            gone.extend(&lost);
            let back: Vec<u32> = gone.iter().copied().filter(|n| now.get(n).is_some_and(|inc| agents.get(n) != Some(inc))).collect();
            if !back.is_empty() {
                note!("gepsea search: node(s) {back:?} rejoined with a restarted agent");
                gone.retain(|n| !back.contains(n));
            }
            nodes = now.keys().copied().collect();
            agents = now;
            for a in client.next_adverts(64, Duration::from_secs(1)).map_err(api_err)? {
                let d = match postcard::from_bytes::<Notice>(&a.body).map_err(|e| SearchError::Io(format!("bad notice: {e}")))? {
                    Notice::Failure(f) if f.retried => {
                        note!("gepsea search: task {} failed; retrying once", f.what);
                        continue;
                    }
                    Notice::Failure(f) => return Err(SearchError::TaskFailed { task: None, what: f.what, message: f.message }),
                    Notice::Refused(f) => return Err(SearchError::ResultRefused { what: f.what, message: f.message }),
                    Notice::Part(d) => d,
                };
                if let Some(e) = d.error {
                    return Err(SearchError::Io(e));
                }
                if done_batches.insert(d.batch) {
                    if agents_see_out {
                        if let Some(len) = d.piece_bytes {
                            placement.known(d.batch, len, Some(d.merger));
                        }
                    }
                    if let Some(sh) = &d.shipped {
                        stats.shipped.get_or_insert_with(Default::default).add(sh);
                    }
                    queries_done += d.queries;
                    stats.hits += d.hits;
                    stats.whole_searches += d.whole_searches;
                    stats.work.add(&d.work);
                    stats.bytes_wire += d.bytes_wire;
                    stats.bytes_raw += d.bytes_raw;
                    *stats.mergers.entry(d.merger).or_default() += 1;
                    stats.trace.tasks.extend(d.tasks.iter().cloned());
                    let stats_ahead = match ahead {
                        Some(a) if d.stats_ahead => a.seconds_of(d.batch),
                        _ => (0.0, 0.0),
                    };
                    stats.trace.batches.push(crate::trace::BatchTrace {
                        batch: d.batch,
                        merge_seconds: d.merge_seconds,
                        write_seconds: d.write_seconds,
                        write_cpu_seconds: d.write_cpu_seconds,
                        write_thread_cpu_seconds: d.write_thread_cpu_seconds,
                        part_bytes: d.part_bytes,
                        written_unix: d.written_unix,
                        stats_ahead_seconds: stats_ahead.0,
                        stats_ahead_cpu_seconds: stats_ahead.1,
                    });
                    on_progress(queries_done);
                }
            }
            placement.start_ready(client, job, tmp_out);
            placement.collect(client, false);
        }
        stats.worker_span_seconds = submitted.elapsed().as_secs_f64();
        for p in prefetches {
            // Long done by now; a failed prefetch only meant a later stage did the work.
            if let Err(e) = client.finish(p, Duration::from_secs(60)) {
                note!("gepsea search: a fragment prefetch failed: {e}");
            }
        }
        for (b, id) in reshipping {
            // The wide-area link may be slow and regeneration long: as long as it takes.
            let sh = client.finish(id, Duration::from_secs(24 * 3600)).map_err(|e| e.to_string()).and_then(crate::ship::answer);
            let sh = sh.map_err(|e| SearchError::Io(format!("shipping part {b} (from an earlier run) to the storage site: {e}")))?;
            stats.shipped.get_or_insert_with(Default::default).add(&sh);
        }
        if spec.hot_swap {
            let body = postcard::to_stdvec(&BlastRequest::StageCounts { job: job.to_path_buf() }).unwrap();
            for &node in &nodes {
                let counts: StagingStats =
                    client.plugin_at(node, "blast", body.clone()).ok().and_then(|r| postcard::from_bytes(&r).ok()).unwrap_or_default();
                for (a, b) in stats.stagings.iter_mut().zip(counts.by_source) {
                    *a += b;
                }
                stats.evicted += counts.evicted;
                stats.scratch_peak_bytes = stats.scratch_peak_bytes.max(counts.peak_bytes);
            }
        }
        // The last pieces, before the agents forget the job (and drop pieces not asked for).
        placement.start_ready(client, job, tmp_out);
        placement.collect(client, true);
        // Every part is written: the agents may drop the job's state (best effort; an
        // agent that does not answer keeps a few kilobytes until it stops).
        let forget = postcard::to_stdvec(&BlastRequest::Forget { job: job.to_path_buf() }).unwrap();
        for &node in &nodes {
            if let Err(e) = client.plugin_at(node, "blast", forget.clone()) {
                tracing::debug!("agent of node {node} did not drop the job's state: {e}");
            }
        }
        // Only now are the workers let go: a node's agent stops once its last client has
        // left, and the requests above went to every node's agent. Stopped first, the
        // workers took their agents with them, and the master waited out a reconnect
        // (3 s) for each answer that could not come.
        for _ in 0..workers {
            client.submit(&postcard::to_stdvec(&TaskPayload::Stop).unwrap()).map_err(api_err)?;
        }
        // What no agent placed, the master writes from the part files, in order, one part in
        // memory at a time, between the pieces the agents wrote.
        let assembly_started = Instant::now();
        let out_err = |e: std::io::Error| SearchError::Output { path: tmp_out.to_path_buf(), source: e };
        let file = std::fs::OpenOptions::new().write(true).open(tmp_out).map_err(out_err)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, &file);
        let n = spec.batches.len();
        let mut at = 0u64;
        // The parts stay until the output is in place: a run stopped now resumes from them.
        for b in 0..n {
            if placement.placed.contains(&b) {
                at += placement.lens[b].expect("a placed piece has a length");
                continue;
            }
            use std::io::Seek;
            out.seek(std::io::SeekFrom::Start(at)).map_err(out_err)?;
            let len = piece_of_part(spec, b, &mut out)?;
            // Pieces after this one may already be in place: it must fill its gap exactly.
            if let Some(want) = placement.lens[b].filter(|&w| w != len) {
                return Err(SearchError::Io(format!(
                    "{}: batch {b}'s share of the output is {len} bytes here but its agent's piece was {want}",
                    spec.parts[b].display()
                )));
            }
            at += len;
        }
        drop(out);
        // Every piece is in: the last one's writer said so. The length is set rather than
        // read back because another node's writes may not show in this node's cached
        // attributes of a network file system yet.
        file.set_len(at).map_err(out_err)?;
        stats.trace.assembly_seconds = assembly_started.elapsed().as_secs_f64();
        stats.placed_by_agents = placement.placed.len();
        stats.parts = n;
        Ok(stats)
    })
}

/// Batch `b`'s piece (see [`crate::parts::piece`]) made from its part file into `out`;
/// its length.
fn piece_of_part(spec: &JobSpec, b: usize, out: impl std::io::Write) -> Result<u64, SearchError> {
    super::piece_from_part(spec, b, &spec.parts[b], out).map_err(SearchError::Io)
}

/// Where each batch's piece goes in the output, and which agents were asked to write
/// theirs there. A piece's offset is the sum of the lengths before it, so pieces are
/// placed in batch order as their lengths become known; the search finishes batches
/// roughly in that order, so most pieces are written while later batches are searched
/// rather than after the last one.
struct Placement {
    /// Each batch's piece length, once known.
    lens: Vec<Option<u64>>,
    /// The agent holding each batch's piece (`None`: the master writes the batch).
    holders: Vec<Option<u32>>,
    /// The first batch without an offset, and its offset.
    next: usize,
    offset: u64,
    /// Placements asked for: request id → batch.
    asked: BTreeMap<u64, usize>,
    /// Batches an agent reported written at their offset.
    placed: BTreeSet<usize>,
}

impl Placement {
    fn new(n: usize) -> Self {
        Placement { lens: vec![None; n], holders: vec![None; n], next: 0, offset: 0, asked: BTreeMap::new(), placed: BTreeSet::new() }
    }

    /// Batch `b`'s piece is `len` bytes, held by the agent of `holder`.
    fn known(&mut self, b: usize, len: u64, holder: Option<u32>) {
        self.lens[b] = Some(len);
        self.holders[b] = holder;
    }

    /// Asks the holders of every piece whose offset is now known to write it there.
    fn start_ready(&mut self, client: &gepsea_client::Client, job: &Path, out: &Path) {
        while let Some(len) = self.lens.get(self.next).copied().flatten() {
            if let Some(node) = self.holders[self.next] {
                let req = BlastRequest::Place { job: job.to_path_buf(), batch: self.next, offset: self.offset, out: out.to_path_buf() };
                let body = postcard::to_stdvec(&req).unwrap();
                let id = client.start(gepsea_agent::wire::Op::PluginAt { node, name: "blast".into(), body });
                self.asked.insert(id, self.next);
            }
            self.offset += len;
            self.next += 1;
        }
    }

    /// Takes the placements' answers: those in (`wait`: all of them). A placement that
    /// failed (its agent died, say) leaves the batch to the master.
    fn collect(&mut self, client: &gepsea_client::Client, wait: bool) {
        let ids: Vec<u64> = self.asked.keys().copied().collect();
        for id in ids {
            // The piece crosses the storage link: as long as that takes.
            let answer = if wait { Some(client.finish(id, Duration::from_secs(3600))) } else { client.try_finish(id) };
            let Some(answer) = answer else { continue };
            let b = self.asked.remove(&id).expect("asked");
            let len = answer.map_err(|e| e.to_string()).and_then(|r| match r {
                gepsea_agent::wire::Reply::Data(body) => postcard::from_bytes::<u64>(&body).map_err(|e| e.to_string()),
                other => Err(format!("unexpected reply {other:?}")),
            });
            match len {
                Ok(len) if Some(len) == self.lens[b] => {
                    self.placed.insert(b);
                }
                Ok(len) => note!("gepsea search: batch {b}'s piece was {len} bytes, not {:?}; writing it again", self.lens[b]),
                Err(e) => tracing::debug!("batch {b}'s piece was not placed by its agent ({e}); the master writes it"),
            }
        }
    }
}

/// The fragments each of `nodes` nodes stages before searching, for `fragments`
/// fragments: fragment `f` on the `(f mod nodes)`-th node, so that every fragment is on
/// some node; with more nodes than fragments, node `i` stages fragment `i mod
/// fragments`, so that no node starts without one. Each node's first fragment is the one
/// it searches first.
pub(crate) fn prefetch_plan(nodes: usize, fragments: usize) -> Vec<Vec<usize>> {
    (0..nodes)
        .map(|i| {
            if fragments == 0 {
                Vec::new()
            } else if nodes > fragments {
                vec![i % fragments]
            } else {
                (i..fragments).step_by(nodes).collect()
            }
        })
        .collect()
}

/// Submits a task; a fragment search names its fragment, so that the scheduler prefers
/// a node that holds it.
pub(crate) fn submit_task(client: &gepsea_client::Client, spec: &JobSpec, task: &TaskPayload) -> Result<u64, gepsea_agent::api::ApiError> {
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
/// fragment), batch-major, so that batches complete one after another and their merging
/// and writing overlaps the search of later ones, instead of every batch completing with
/// the last fragment at the end of the job. Fragment reuse does not need the queue's
/// order: the scheduler hands a worker the first queued task whose fragment its node
/// holds.
pub(crate) fn submit_tasks(
    client: &gepsea_client::Client,
    spec: &JobSpec,
    job: &Path,
    batches: &[usize],
) -> Result<(), gepsea_agent::api::ApiError> {
    if spec.split == SplitBy::Queries {
        for (i, &batch) in batches.iter().enumerate() {
            let threads = if i + spec.tail_threads >= batches.len() { spec.tail_threads } else { 1 };
            submit_task(client, spec, &TaskPayload::Batch { job: job.to_path_buf(), batch, attempt: 0, threads })?;
        }
        return Ok(());
    }
    for &batch in batches {
        for fragment in 0..spec.fragments.len() {
            submit_task(client, spec, &TaskPayload::Fragment { job: job.to_path_buf(), batch, fragment, attempt: 0 })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::prefetch_plan;

    #[test]
    fn every_fragment_is_prefetched_and_every_node_gets_one_to_start_with() {
        assert_eq!(prefetch_plan(1, 3), vec![vec![0, 1, 2]]);
        assert_eq!(prefetch_plan(3, 8), vec![vec![0, 3, 6], vec![1, 4, 7], vec![2, 5]]);
        assert_eq!(prefetch_plan(4, 4), vec![vec![0], vec![1], vec![2], vec![3]]);
        let many = prefetch_plan(36, 8);
        assert_eq!(many.len(), 36);
        for (i, f) in many.iter().enumerate() {
            assert_eq!(f, &vec![i % 8], "node {i}");
        }
        assert_eq!(prefetch_plan(2, 0), vec![Vec::<usize>::new(), Vec::new()]);
    }
}
