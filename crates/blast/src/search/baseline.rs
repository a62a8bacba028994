//! The master of the mpiBLAST baseline (`--no-agent`): it starts the workers (or, in
//! a launched job, waits for their hello), hands out (batch, fragment) tasks with
//! fragment affinity, merges each batch as its last fragment comes in, searches the
//! risky queries again on the whole database, writes each settled batch's part, and
//! joins the parts into the output. Everything the agents take over in an accelerated
//! search happens here, in one process: this is the baseline the agents are measured
//! against. The messages and the worker's loop are in [`super::mpiblast`].

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gepsea_net::{Addr, Completion, NetError, Port, PortConfig};

use super::files::{Cleanup, RemoveDir};
use super::mpiblast::*;
use super::progress::Progress;
use super::{batch_trace, deliver, describe, Env, SearchOptions, Summary};
use crate::archive;
use crate::db::Manifest;
use crate::error::{check_interrupted, SearchError};
use crate::fasta::Record;
use crate::plan::*;
use crate::report;
use crate::schedule::{AfterFailure, Scheduler, Target};
use crate::tools;

/// What the search driver prepared for the baseline's master: the checked options'
/// outcome, the batches written to `scratch`, their parts' paths, and which batches
/// an earlier run already finished.
pub(super) struct Baseline<'a> {
    pub(super) started: Instant,
    pub(super) workers: usize,
    pub(super) manifest: Manifest,
    pub(super) queries: &'a [Record],
    pub(super) program: String,
    pub(super) blastdb: String,
    pub(super) batch_ranges: Vec<std::ops::Range<usize>>,
    /// The query batches, in FASTA, one per batch (in `scratch`).
    pub(super) batch_files: Vec<PathBuf>,
    /// Where workers read the batch files (and the whole-database re-searches' queries).
    pub(super) scratch: PathBuf,
    pub(super) split: SplitBy,
    pub(super) tmp_out: PathBuf,
    pub(super) ns: String,
    pub(super) parts: Vec<PathBuf>,
    /// Batches whose part an earlier run left (resume): not searched again.
    pub(super) reusable: Vec<usize>,
    pub(super) recording: Option<crate::replay::Recording>,
}

/// Runs the baseline's master to the end: the output at `opts.out`, then `done_work`
/// (the parts and work directory removed), then the delivery.
pub(super) fn run_baseline(
    opts: &SearchOptions,
    job: Baseline<'_>,
    cleanup: &mut Cleanup,
    env: Env<'_>,
    done_work: &dyn Fn(&[PathBuf]),
) -> Result<Summary, SearchError> {
    let pid = std::process::id();
    let nfrag = job.manifest.fragments.len();
    let mut sched = Scheduler::new();
    for (b, r) in job.batch_ranges.iter().enumerate() {
        if job.reusable.contains(&b) {
            continue;
        }
        for frag in 0..nfrag {
            sched.add(b, Target::Fragment(frag), r.clone().collect());
        }
    }
    let mut pc = PortConfig::new(&job.ns, MASTER);
    // Where each worker is: local workers are ports 1..=W of this node; launched ones
    // say hello from wherever the launcher put them (port = rank).
    let mut worker_addr: Vec<Addr> = (0..job.workers).map(|w| Addr::new(MASTER.node, w as u32 + 1)).collect();
    if let Env::ClusterNoAgent(net) = &env {
        pc.listen = Some(std::net::SocketAddr::new(net.ip, 0));
        pc.directory = Some(net.directory.clone());
        pc.key = net.key.clone();
    }
    let port = Port::open(pc)?;
    for w in 0..job.workers {
        if matches!(env, Env::ClusterNoAgent(_)) {
            break;
        }
        let mut c = Command::new(&opts.worker_exe);
        tools::with_parent_death(&mut c)
            .args(["worker", "--ns", &job.ns, "--port", &(w + 1).to_string()])
            .arg("--scratch")
            .arg(&job.scratch)
            .arg("--")
            .args(archive_args(&opts.blast_args, &opts.outfmt))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        cleanup.children.push(c.spawn().map_err(|e| SearchError::Io(format!("starting worker {}: {e}", opts.worker_exe.display())))?);
    }

    let k = hitlist_size(&opts.blast_args, &opts.outfmt);
    let cbs = job.program == "blastp" && !matches!(option_value(&opts.blast_args, "-comp_based_stats"), Some("0" | "F" | "f"));
    let prelim = preliminary_list(k, cbs);

    let mut archives: Vec<Vec<Option<String>>> = vec![vec![None; nfrag]; job.batch_ranges.len()];
    let mut results = QueryResults::new(job.queries.len(), &job.batch_ranges);
    let mut reused_hits = 0;
    for &b in &job.reusable {
        results.written[b] = true;
        reused_hits += crate::parts::count_hits_in(&job.parts[b], &opts.outfmt)
            .map_err(|e| SearchError::Io(format!("{}: {e}", job.parts[b].display())))?;
    }
    // Each batch's part of the report, written as soon as the batch is settled. The
    // statistics runs and the formatter work in a directory on this node: `job.scratch` may
    // be on the shared file system, where their files would cross the network.
    let report_scratch = gepsea_net::trust::private_scratch(&format!("gepsea-report-{pid}"))?;
    let _report_scratch = RemoveDir(report_scratch.clone());
    let mut trace = crate::trace::RunTrace::default();
    let write_parts = |results: &mut QueryResults, trace: &mut crate::trace::RunTrace| -> Result<(), SearchError> {
        for (b, hsps) in results.take_settled() {
            let clock = crate::tools::CpuClock::start();
            let spec = report::Spec {
                program: &job.program,
                blastdb: job.blastdb.as_ref(),
                db_name: &job.manifest.name,
                queries: &job.batch_files[b],
                outfmt: &opts.outfmt,
                blast_args: &opts.blast_args,
                scratch: &report_scratch,
            };
            // Formatted here, then stored compressed in the work directory (see
            // `crate::parts::store`).
            let local = report_scratch.join(format!("report-{b}"));
            report::write(&spec, &hsps, &local)?;
            let part_bytes = std::fs::metadata(&local).map(|m| m.len()).unwrap_or(0);
            let tmp = crate::accel::part_tmp(&job.parts[b], "master");
            let stored = crate::parts::store(&local, &tmp);
            let _ = std::fs::remove_file(&local);
            stored.map_err(|e| SearchError::Io(format!("{}: {e}", tmp.display())))?;
            std::fs::rename(&tmp, &job.parts[b]).map_err(|e| SearchError::Io(format!("{}: {e}", job.parts[b].display())))?;
            let bt = batch_trace(trace, b);
            bt.write_seconds += clock.wall_seconds();
            bt.write_cpu_seconds += clock.seconds();
            bt.write_thread_cpu_seconds += clock.thread_seconds();
            bt.part_bytes = part_bytes;
            bt.written_unix = crate::trace::unix_now();
        }
        Ok(())
    };
    let mut alive: Vec<bool> = vec![true; job.workers];
    let mut idle: Vec<bool> = vec![false; job.workers];
    // Per worker: when it reported ready, and when it stopped (for time accounting).
    let mut hello_at: Vec<Option<Instant>> = vec![None; job.workers];
    let mut gone_at: Vec<Option<Instant>> = vec![None; job.workers];
    // When each worker was last given a task (for the trace).
    let mut task_given: Vec<f64> = vec![0.0; job.workers];
    let mut done_queries: usize = job.reusable.iter().map(|&b| job.batch_ranges[b].len()).sum();
    let mut fallbacks = 0usize;
    let mut blast_seconds = 0.0;
    let mut last_death = String::new();
    let mut progress = Progress::new(job.queries.len(), opts.quiet);
    let mut ctrl = port.irecv(None, Some(TAG_CTRL), 1 << 16);

    while !sched.all_done() {
        check_interrupted()?;
        // Hand out work.
        for w in 0..job.workers {
            if alive[w] && idle[w] {
                let live = alive.iter().filter(|a| **a).count();
                if let Some(t) = sched.assign(w, live) {
                    let task = sched.task(t);
                    let (query_file, database) = match &task.target {
                        Target::Fragment(f) => (job.batch_files[task.batch].clone(), format!("{}.stats", job.manifest.fragments[*f].name)),
                        Target::Whole => {
                            let f = job.scratch.join(format!("whole{t}.fasta"));
                            let text = crate::fasta::text_of(task.queries.iter().map(|&i| &job.queries[i]));
                            std::fs::write(&f, text).map_err(|e| SearchError::Io(format!("{}: {e}", f.display())))?;
                            (f, job.manifest.name.clone())
                        }
                    };
                    let msg = serde_json::to_vec(&TaskMsg {
                        task: t,
                        query_file,
                        database,
                        blastdb: job.blastdb.clone(),
                        program: job.program.clone(),
                        recording: job.recording.clone(),
                    })
                    .unwrap();
                    port.send(worker_addr[w], TAG_TASK, msg)?;
                    task_given[w] = crate::trace::unix_now();
                    if trace.started_unix == 0.0 {
                        trace.started_unix = task_given[w];
                    }
                    idle[w] = false;
                }
            }
        }
        // Notice dead workers (killed, crashed): their task is handed out again.
        for w in 0..job.workers {
            if alive[w] {
                // (Launched workers are not our children; the launcher watches them.)
                if let Some(Ok(Some(st))) = cleanup.children.get_mut(w).map(|c| c.try_wait()) {
                    alive[w] = false;
                    gone_at[w] = Some(Instant::now());
                    last_death = format!("worker {} exited with {st}", w + 1);
                    if let Some(t) = sched.worker_lost(w) {
                        note!("gepsea search: worker {} died ({st}); task {t} is reassigned", w + 1);
                    }
                }
            }
        }
        if !alive.iter().any(|a| *a) {
            return Err(SearchError::NoWorkers(last_death));
        }
        let m = match port.wait_timeout(ctrl, Duration::from_millis(50)) {
            Err(NetError::Timeout(_)) => continue,
            Err(NetError::PeerFailed { .. }) => continue,
            Err(e) => return Err(e.into()),
            Ok(Completion::Received(m)) => m,
            Ok(other) => return Err(SearchError::Io(format!("unexpected completion {other:?}"))),
        };
        ctrl = port.irecv(None, Some(TAG_CTRL), 1 << 16);
        let w = m.src.port as usize - 1;
        let msg: Ctrl = serde_json::from_slice(&m.data).map_err(|e| SearchError::Io(format!("bad message from worker {}: {e}", w + 1)))?;
        match msg {
            Ctrl::Hello => {
                worker_addr[w] = m.src;
                idle[w] = true;
                hello_at[w] = Some(Instant::now());
            }
            Ctrl::Failed { task, message } => {
                idle[w] = true;
                let what = describe(sched.task(task), &job.manifest);
                match sched.failed(w) {
                    Some((_, AfterFailure::Retry)) => {
                        note!("gepsea search: task {task} ({what}) failed on worker {}; retrying once", w + 1)
                    }
                    _ => return Err(SearchError::TaskFailed { task: Some(task), what, message }),
                }
            }
            Ctrl::Result { task, len, blast_seconds: secs } => {
                let data = match port.wait(port.irecv(Some(m.src), Some(TAG_DATA), len))? {
                    Completion::Received(d) => d.data,
                    other => return Err(SearchError::Io(format!("unexpected completion {other:?}"))),
                };
                idle[w] = true;
                blast_seconds += secs;
                sched.succeeded(w);
                let text = String::from_utf8(data).map_err(|_| SearchError::Io(format!("task {task}: archive is not text")))?;
                let t = sched.task(task).clone();
                trace.tasks.push(crate::trace::TaskTrace {
                    batch: t.batch,
                    fragment: match t.target {
                        Target::Fragment(f) => Some(f),
                        Target::Whole => None,
                    },
                    seconds: secs,
                    bytes: text.len() as u64,
                    worker: w as u32 + 1,
                    taken_unix: task_given[w],
                    handed_unix: crate::trace::unix_now(),
                    parse_seconds: 0.0,
                    input_seconds: 0.0,
                });
                match t.target {
                    Target::Whole => {
                        let hsps = archive::hsps(&text).map_err(|error| SearchError::BadArchive { task, error })?;
                        let hits = archive::hits_by_query(&hsps, 0, t.queries.len());
                        for (local, list) in hits.iter().enumerate() {
                            results.store(t.queries[local], list);
                            done_queries += 1;
                        }
                    }
                    Target::Fragment(f) => {
                        archives[t.batch][f] = Some(text);
                        if archives[t.batch].iter().all(|a| a.is_some()) {
                            let range = job.batch_ranges[t.batch].clone();
                            let merge_started = Instant::now();
                            let risky = merge_batch(&archives[t.batch], range.clone(), k, prelim, &mut results, task)?;
                            batch_trace(&mut trace, t.batch).merge_seconds += merge_started.elapsed().as_secs_f64();
                            archives[t.batch] = vec![None; nfrag];
                            done_queries += range.len() - risky.len();
                            if !risky.is_empty() {
                                // Spread the re-searches over the workers: they are the
                                // heaviest queries and otherwise form a serial tail.
                                fallbacks += risky.len();
                                for chunk in crate::plan::fallback_chunks(&risky) {
                                    sched.add(t.batch, Target::Whole, chunk.to_vec());
                                }
                            }
                        }
                    }
                }
                write_parts(&mut results, &mut trace)?;
                progress.set(done_queries);
            }
        }
    }
    progress.finish();
    // All searching is done: release the workers before the master writes the report.
    let stop = Instant::now();
    let worker_seconds: f64 =
        (0..job.workers).filter_map(|w| Some(gone_at[w].unwrap_or(stop).duration_since(hello_at[w]?).as_secs_f64())).sum();
    for w in 0..job.workers {
        if alive[w] {
            let _ = port.send(worker_addr[w], TAG_SHUTDOWN, Vec::new());
        }
    }
    let hits = results.hits + reused_hits;
    // Out of core: the parts, one in memory at a time, joined into the output in order.
    let file = std::fs::File::create(&job.tmp_out).map_err(|e| SearchError::Output { path: job.tmp_out.clone(), source: e })?;
    let assembly_started = Instant::now();
    let mut asm = crate::parts::Assembler::new(std::io::BufWriter::with_capacity(1 << 20, file), report::base_format(&opts.outfmt));
    for (b, p) in job.parts.iter().enumerate() {
        let part = crate::parts::open(p).map_err(|e| SearchError::Io(format!("{}: {e}", p.display())))?;
        asm.part_from(part, b + 1 == job.parts.len()).map_err(|e| SearchError::Io(format!("{}: {e}", p.display())))?;
    }
    asm.finish().map_err(SearchError::Io)?;
    trace.assembly_seconds = assembly_started.elapsed().as_secs_f64();
    std::fs::rename(&job.tmp_out, &opts.out).map_err(|e| SearchError::Output { path: opts.out.clone(), source: e })?;
    done_work(&job.parts);
    let wall = job.started.elapsed().as_secs_f64();
    trace.finished_unix = crate::trace::unix_now();
    let delivery = deliver(opts, None)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    for c in cleanup.children.iter_mut() {
        while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    Ok(Summary {
        queries: job.queries.len(),
        hits,
        split: job.split,
        tasks: sched.len(),
        whole_db_fallbacks: fallbacks,
        wall_seconds: wall,
        blast_seconds,
        worker_seconds,
        output: opts.out.clone(),
        accel: None,
        delivery,
        reused_parts: job.reusable.len(),
        worker_active_seconds: trace.worker_active_seconds(),
        trace,
    })
}
