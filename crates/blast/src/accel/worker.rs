//! A search worker registered with its node's agent: takes tasks from the load
//! balancer, has the agent stage the fragment, runs BLAST+, and hands the raw result
//! to the agent without waiting for it to be merged.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gepsea_agent::api::Api;
use gepsea_agent::wire::Dest;

use crate::error::SearchError;
use crate::plan::*;
use crate::tools::{self, ToolError};

use super::*;

// ----- the worker ----------------------------------------------------------------------

/// A worker registered with its node's agent: takes tasks, searches, hands results over,
/// until a stop task arrives or, between tasks, `over()` says the job ended without one
/// (the master failed or was stopped).
pub fn worker(client: &gepsea_client::Client, over: &dyn Fn() -> bool) -> Result<(), SearchError> {
    let mut inflight: Vec<HandOver> = Vec::new();
    // Fragments this worker had staged, by (job, fragment): only the first use asks the
    // agent (whose job thread for this worker may be busy merging the batch the
    // previous result completed), unless the copy was removed to make room since.
    let mut staged_dirs: HashMap<(PathBuf, usize), PathBuf> = HashMap::new();
    // Specs of the jobs this worker has taken tasks of, at most `SPECS_KEPT` (a worker
    // serves one job after another for as long as its agent runs).
    const SPECS_KEPT: usize = 16;
    let mut specs: HashMap<PathBuf, std::rc::Rc<JobSpec>> = HashMap::new();
    let api_err = super::agent_error;
    // The last task's completion, sent without waiting for its answer: the agent answers
    // it from its loop, in order, before the take that follows it, so that take need not
    // wait for the answer first (one round trip through the agent less per task; on
    // 2 cores shared by 36 emulated nodes the two took 34 ms per task at the median).
    let mut done_unanswered: Option<u64> = None;
    loop {
        let next = client.take(Duration::from_secs(1));
        if let Some(id) = done_unanswered.take() {
            client.finish(id, Duration::from_secs(600)).map_err(api_err)?;
        }
        // Hand-overs the agent has answered meanwhile: one it refused (a result it could
        // not parse or merge) fails the run now. Left until the next wait for a full
        // window, it left the master waiting for a batch that was never coming.
        let mut i = 0;
        while i < inflight.len() {
            match client.try_finish(inflight[i].id) {
                Some(answer) => inflight.remove(i).settle(client, answer)?,
                None => i += 1,
            }
        }
        let Some(t) = next.map_err(api_err)? else {
            if over() {
                return Ok(());
            }
            continue;
        };
        let payload: TaskPayload = postcard::from_bytes(&t.payload).map_err(|e| SearchError::Io(format!("bad task: {e}")))?;
        let job = match &payload {
            TaskPayload::Stop => {
                client.done(t.id).map_err(api_err)?;
                break;
            }
            TaskPayload::Fragment { job, .. } | TaskPayload::Whole { job, .. } | TaskPayload::Batch { job, .. } => job.clone(),
        };
        if !job.exists() {
            // The master finished and removed the job: this is a repeat of a task whose
            // result already arrived (submitted again after an agent died).
            client.done(t.id).map_err(api_err)?;
            continue;
        }
        // A job's spec does not change while it runs: read once per job, not per task
        // (the job directory is usually on a network file system).
        let spec = match specs.get(&job) {
            Some(s) => s.clone(),
            None => {
                let spec_path = job.join("job.json");
                let spec: JobSpec = std::fs::read_to_string(&spec_path)
                    .map_err(|e| e.to_string())
                    .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
                    .map_err(|e| SearchError::Io(format!("{}: {e}", spec_path.display())))?;
                let spec = std::rc::Rc::new(spec);
                if specs.len() == SPECS_KEPT {
                    specs.clear();
                }
                specs.insert(job.clone(), spec.clone());
                spec
            }
        };
        let (query_file, database) = match &payload {
            TaskPayload::Fragment { batch, fragment, .. } => (batch_file(&job, *batch), format!("{}.stats", spec.fragments[*fragment])),
            TaskPayload::Whole { batch, queries, .. } => (whole_file(&job, *batch, queries[0]), spec.db_name.clone()),
            TaskPayload::Batch { batch, .. } => (batch_file(&job, *batch), spec.db_name.clone()),
            TaskPayload::Stop => unreachable!(),
        };
        // A batch on the whole database is printed in the report's format; everything
        // else is merged from archives, the only output with full-precision e-values.
        let outfmt = if matches!(payload, TaskPayload::Batch { .. }) { spec.outfmt.as_str() } else { "11" };
        let mut work = WorkStats { worker: std::process::id(), taken_unix: crate::trace::unix_now(), ..Default::default() };
        // Hot-swap: the fragment comes from node-local scratch, staged by the agent, and
        // is held there until BLAST+ is done with it (`_held`).
        let mut _held = None;
        let blastdb = match &payload {
            TaskPayload::Fragment { fragment, .. } if spec.hot_swap => {
                staged_and_held(client, &job, *fragment, &mut staged_dirs, &mut work).map(|(dir, held)| {
                    _held = Some(held);
                    dir
                })
            }
            _ => Ok(PathBuf::from(&spec.blastdb)),
        }
        .map(|dir| if dir.as_os_str() == spec.blastdb.as_str() { dir.into_os_string() } else { tools::search_path(&[&dir]) });
        let q = query_file.to_string_lossy().to_string();
        let mut args: Vec<&str> = vec!["-query", &q, "-db", &database, "-outfmt", outfmt];
        let for_archive;
        let user_args = if outfmt == "11" {
            for_archive = archive_args(&spec.blast_args, &spec.outfmt);
            &for_archive
        } else {
            &spec.blast_args
        };
        args.extend(user_args.iter().map(|s| s.as_str()));
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
            crate::replay::run_search(spec.recording.as_ref(), &spec.program, &args, Some(&db), Some(&scratch)).map_err(|e| match e {
                ToolError::Failed { stderr, .. } => match part_file.as_deref().and_then(Path::parent) {
                    Some(dir) => tools::with_full_file_system(tools::error_lines(&stderr), dir),
                    None => tools::error_lines(&stderr),
                },
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
        work.handed_unix = crate::trace::unix_now();
        let what = payload.describe(&spec);
        let request = match part_file {
            Some(path) => BlastRequest::ResultFile { task: payload, path, work },
            None => BlastRequest::Result { task: payload, archive: out.stdout, work },
        };
        let body = postcard::to_stdvec(&request).unwrap();
        // Hand the result over and go on: collect earlier hand-overs without waiting.
        let id = client.start(gepsea_agent::wire::Op::Plugin { name: "blast".into(), body });
        inflight.push(HandOver { id, topic: topic(&spec.id), what });
        done_unanswered = Some(client.start(gepsea_agent::wire::Op::Done { task: t.id }));
        // Results not yet taken by the agent are held here: bound them.
        while inflight.len() > 8 {
            let h = inflight.remove(0);
            let answer = client.finish(h.id, Duration::from_secs(600));
            h.settle(client, answer)?;
        }
    }
    for h in inflight {
        let answer = client.finish(h.id, Duration::from_secs(600));
        h.settle(client, answer)?;
    }
    Ok(())
}

/// A result handed to the agent whose answer has not been read yet.
struct HandOver {
    id: u64,
    /// The job's notice topic, where a refused result is reported to the master.
    topic: String,
    /// The task, as the master names it.
    what: String,
}

impl HandOver {
    /// Reads the agent's answer: a result the agent refused fails the run (it would fail
    /// the same way again: the archive or the merge is at fault, not the worker).
    fn settle(
        self,
        client: &gepsea_client::Client,
        answer: Result<gepsea_agent::wire::Reply, gepsea_agent::api::ApiError>,
    ) -> Result<(), SearchError> {
        match answer {
            Ok(_) => Ok(()),
            Err(e @ (gepsea_agent::api::ApiError::Transport(_) | gepsea_agent::api::ApiError::Timeout(_))) => Err(super::agent_error(e)),
            Err(e) => {
                let notice = Notice::Refused(TaskFailure { what: self.what, message: e.to_string(), retried: false });
                client.publish(&self.topic, &postcard::to_stdvec(&notice).unwrap(), Dest::All).map_err(super::agent_error)
            }
        }
    }
}

/// The staged directory of `fragment` of `job` and a hold on it (`scratch::hold`; no
/// agent removes the directory until the file is dropped): the copy this worker was
/// given before if it is still there, else one the agent stages now.
fn staged_and_held(
    client: &gepsea_client::Client,
    job: &std::path::Path,
    fragment: usize,
    staged_dirs: &mut HashMap<(PathBuf, usize), PathBuf>,
    work: &mut WorkStats,
) -> Result<(PathBuf, std::fs::File), String> {
    // Each miss means another staging removed the copy between its staging and this
    // hold: only a budget far too small for the workers of a node repeats that.
    const TRIES: usize = 8;
    let key = (job.to_path_buf(), fragment);
    for _ in 0..TRIES {
        let dir = match staged_dirs.get(&key) {
            Some(d) => d.clone(),
            None => {
                let started = Instant::now();
                let req = postcard::to_stdvec(&BlastRequest::Stage { job: job.to_path_buf(), fragment }).unwrap();
                let staged = client
                    .plugin("blast", &req)
                    .map_err(|e| e.to_string())
                    .and_then(|r| postcard::from_bytes::<Staged>(&r).map_err(|e| format!("bad stage reply: {e}")));
                work.input_seconds += started.elapsed().as_secs_f64();
                let s = staged?;
                work.staged[s.source as usize] += 1;
                staged_dirs.insert(key.clone(), s.dir.clone());
                s.dir
            }
        };
        match scratch::hold(&dir) {
            Ok(Some(held)) => return Ok((dir, held)),
            Ok(None) => {
                staged_dirs.remove(&key);
            }
            Err(e) => return Err(format!("holding the staged fragment {}: {e}", dir.display())),
        }
    }
    Err(format!(
        "fragment {fragment} was removed from this node's scratch {TRIES} times before it could be searched: raise --scratch-bytes"
    ))
}
