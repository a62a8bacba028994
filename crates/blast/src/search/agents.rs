//! Agent mode of a search: the node's agent (or a cluster's agents) run the workers'
//! tasks and merge and write the parts; the master submits the tasks and assembles the
//! parts. The no-agent baseline (the master merges and writes everything) is in
//! `baseline.rs`.

use super::*;

/// What the master prepared (queries, batches, parts) that agent mode runs with.
pub(super) struct Accel<'a> {
    pub(super) started: Instant,
    pub(super) manifest: Manifest,
    pub(super) queries: &'a [Record],
    pub(super) program: String,
    pub(super) db_dir: PathBuf,
    pub(super) blastdb: String,
    pub(super) batch_ranges: Vec<std::ops::Range<usize>>,
    /// Each batch as FASTA text, as written into the search's scratch directory: the
    /// job directory the agents read gets the same bytes.
    pub(super) batch_texts: Vec<Vec<u8>>,
    pub(super) split: SplitBy,
    pub(super) tmp_out: PathBuf,
    pub(super) out_dir: PathBuf,
    pub(super) ns: String,
    pub(super) parts: Vec<PathBuf>,
    pub(super) recording: Option<crate::replay::Recording>,
}

/// Agent mode on one machine: start the node's agent and W workers registered with it;
/// the master submits the tasks and assembles the parts the agents write.
pub(super) fn run_accel(opts: &SearchOptions, mut a: Accel<'_>, cleanup: &mut Cleanup, env: Env<'_>) -> Result<Summary, SearchError> {
    use crate::accel;
    let id = format!("{}-{}", std::process::id(), a.started.elapsed().as_nanos());
    let job_parent = match &env {
        // Absolute: agents on other nodes read the job's paths.
        Env::Cluster { shared, .. } => std::fs::canonicalize(shared).map_err(|e| SearchError::Io(format!("{}: {e}", shared.display())))?,
        _ => a.out_dir.clone(),
    };
    let job = job_parent.join(format!(".gepsea-job-{}", std::process::id()));
    std::fs::create_dir_all(&job).map_err(|e| SearchError::Output { path: job.clone(), source: e })?;
    let _job_guard = RemoveDir(job.clone());
    for (b, text) in std::mem::take(&mut a.batch_texts).into_iter().enumerate() {
        let f = accel::batch_file(&job, b);
        std::fs::write(&f, text).map_err(|e| SearchError::Io(format!("{}: {e}", f.display())))?;
    }
    let k = hitlist_size(&opts.blast_args, &opts.outfmt);
    let cbs = a.program == "blastp" && !matches!(option_value(&opts.blast_args, "-comp_based_stats"), Some("0" | "F" | "f"));
    let spec = accel::JobSpec {
        id,
        program: a.program.clone(),
        db_dir: a.db_dir.clone(),
        blastdb: a.blastdb.clone(),
        db_name: a.manifest.name.clone(),
        outfmt: opts.outfmt.clone(),
        blast_args: opts.blast_args.clone(),
        k,
        prelim: preliminary_list(k, cbs),
        fragments: a.manifest.fragments.iter().map(|f| f.name.clone()).collect(),
        batches: a.batch_ranges.iter().map(|r| (r.start, r.end)).collect(),
        split: a.split,
        // On one machine the workers share its cores: the last tasks can use the cores
        // of the workers that ran out of work. On a cluster a worker's cores are its own.
        tail_threads: if matches!(env, Env::Local) {
            opts.workers.max(1).min(std::thread::available_parallelism().map_or(1, |n| n.get()))
        } else {
            1
        },
        compress: opts.compress,
        assign: opts.assign,
        // A virtual fragment has no files to stage: it is a view of the database itself.
        hot_swap: opts.hot_swap && a.manifest.has_fragment_files(),
        scratch_bytes: opts.scratch_bytes,
        recording: a.recording.clone(),
        ship: opts.ship_parts.clone(),
        parts: a.parts.clone(),
        fragment_files: a.manifest.fragments.iter().map(|f| f.searched_files().map(|(n, h)| (n.clone(), h.clone())).collect()).collect(),
    };
    std::fs::write(job.join("job.json"), serde_json::to_string_pretty(&spec).unwrap()).map_err(|e| SearchError::Io(e.to_string()))?;
    // The agents write the parts into the work directory, so they can write the output
    // next to it too: on one machine, or when the work directory is in the output's
    // directory (the default). Otherwise the master writes the whole output.
    let work_dir = a.parts.first().and_then(|p| p.parent()?.parent());
    let agents_see_out = matches!(env, Env::Local) || work_dir.and_then(|w| w.parent()) == Some(a.out_dir.as_path());
    let mut progress = Progress::new(a.queries.len(), opts.quiet);
    let (mut stats, agent, own_client, workers, cluster_client) = match env {
        Env::Cluster { client, workers, .. } => (
            accel::master(client, &spec, &job, &a.tmp_out, agents_see_out, workers, |d| progress.set(d), || Ok(()))?,
            None,
            None,
            workers,
            Some(client),
        ),
        Env::ClusterNoAgent(_) => unreachable!("a run without agents never gets here"),
        Env::Local => {
            let mut agent = accel::LocalAgent::start(&opts.worker_exe, &a.ns, opts.agent_cpu)?;
            let workers = opts.workers.max(1);
            for _ in 0..workers {
                let mut c = Command::new(&opts.worker_exe);
                tools::with_parent_death(&mut c)
                    // The search reports its agent's end, once; its workers would each
                    // say that they lost it (as many lines as workers, above that one).
                    .args(["agent-worker", "--namespace", &a.ns, "--node", "1", "--quiet-if-agent-lost"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null());
                cleanup
                    .children
                    .push(c.spawn().map_err(|e| SearchError::Io(format!("starting worker {}: {e}", opts.worker_exe.display())))?);
            }
            let mut co = gepsea_client::ConnectOptions::from_env("gepsea search").map_err(|e| SearchError::Io(e.to_string()))?;
            co.namespace = a.ns.clone();
            co.node = 1;
            let client = gepsea_client::Client::connect(&co).map_err(|e| match agent.ended(Duration::from_millis(500)) {
                Some(status) => SearchError::own_agent_ended(agent.pid(), status),
                None => SearchError::Io(format!("connecting to the agent: {e}")),
            })?;
            let mut alive = vec![true; workers];
            let children = &mut cleanup.children;
            let watch = || -> Result<(), SearchError> {
                // Workers end when their agent does: that is the news, not their exits.
                if let Some(status) = agent.ended(Duration::ZERO) {
                    return Err(SearchError::own_agent_ended(agent.pid(), status));
                }
                let mut last = String::new();
                for (w, c) in children.iter_mut().enumerate() {
                    if alive[w] {
                        if let Ok(Some(st)) = c.try_wait() {
                            alive[w] = false;
                            last = format!("worker {} exited with {st}", w + 1);
                            // Its agent saw its registration close and put its task back.
                            note!("gepsea search: worker {} died ({st}); its task is reassigned by the agents' scheduler", w + 1);
                        }
                    }
                }
                if !alive.iter().any(|a| *a) {
                    return Err(SearchError::NoWorkers(last));
                }
                Ok(())
            };
            let stats = match accel::master(&client, &spec, &job, &a.tmp_out, agents_see_out, workers, |d| progress.set(d), watch) {
                Ok(stats) => stats,
                Err(e) => {
                    // The workers go before their agent: stopped after it, each printed
                    // that it had lost the agent, above the error that ended the search.
                    cleanup.stop_children();
                    if matches!(e, SearchError::AgentLost(_)) {
                        if let Some(status) = agent.ended(Duration::from_millis(500)) {
                            return Err(SearchError::own_agent_ended(agent.pid(), status));
                        }
                    }
                    return Err(e);
                }
            };
            (stats, Some(agent), Some(client), workers, None)
        }
    };
    progress.finish();
    std::fs::rename(&a.tmp_out, &opts.out).map_err(|e| SearchError::Output { path: opts.out.clone(), source: e })?;
    let wall = a.started.elapsed().as_secs_f64();
    stats.trace.finished_unix = crate::trace::unix_now();
    let delivery = match &stats.shipped {
        Some(sh) => Some(serde_json::to_value(sh).map_err(|e| SearchError::Io(e.to_string()))?),
        None => deliver(opts, cluster_client.or(own_client.as_ref()))?,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    for c in cleanup.children.iter_mut() {
        while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    drop(own_client);
    drop(agent);
    let trace = std::mem::take(&mut stats.trace);
    let worker_active_seconds = trace.worker_active_seconds();
    Ok(Summary {
        queries: a.queries.len(),
        hits: stats.hits,
        split: a.split,
        tasks: match a.split {
            SplitBy::Fragments => a.batch_ranges.len() * spec.fragments.len(),
            SplitBy::Queries => a.batch_ranges.len(),
        },
        whole_db_fallbacks: stats.whole_searches,
        wall_seconds: wall,
        blast_seconds: stats.work.blast_seconds,
        worker_seconds: stats.worker_span_seconds * workers as f64,
        output: opts.out.clone(),
        reused_parts: stats.reused_parts,
        accel: Some(stats),
        delivery,
        worker_active_seconds,
        trace,
    })
}

/// The hidden `gepsea agent-worker` process: a worker registered with its node's agent.
pub fn agent_worker(namespace: &str, node: u32) -> Result<(), SearchError> {
    let mut co = gepsea_client::ConnectOptions::from_env("gepsea worker").map_err(|e| SearchError::Io(e.to_string()))?;
    co.namespace = namespace.to_string();
    co.node = node;
    let client = gepsea_client::Client::connect(&co).map_err(|e| match e {
        // Gone, or going (killed while this worker registered: "Connection reset by peer").
        gepsea_client::ClientError::NoAgent { .. } | gepsea_client::ClientError::Io(_) => SearchError::AgentUnreachable(e.to_string()),
        e => SearchError::Io(format!("connecting to the agent: {e}")),
    })?;
    crate::accel::worker(&client, &|| false)
}
