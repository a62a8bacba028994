//! `gepsea search` in local mode: a master process, W worker processes, gepsea-net
//! between them (shared memory on one node). This is the *no-agent baseline* — the
//! architecture of mpiBLAST itself, where the master merges and writes everything.
//!
//! The master cuts the queries into batches by residues and creates one task per
//! (batch, fragment); the [`Scheduler`](crate::schedule::Scheduler) hands tasks to idle workers with fragment
//! affinity. A worker runs BLAST+ with `-outfmt 11` on the fragment's whole-statistics
//! alias and sends the archive back. When a batch's last fragment is in, its queries are
//! merged; a query whose whole-database search might have overflowed BLAST's
//! preliminary hit list (which no fragment merge can reproduce) is searched again on
//! the whole database. Finally `report` writes the output, identical to serial BLAST+.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gepsea_net::{Addr, Port, PortConfig};

use crate::db::{self, Manifest};
use crate::fasta::{self, MolType, Record};
use crate::output::Destination;
use crate::schedule::Target;
use crate::tools::{self, ToolError};

mod agents;
mod baseline;
pub(crate) mod files;
mod mpiblast;
mod progress;
mod request;
mod setup;

pub use self::agents::agent_worker;
use self::agents::*;
use self::baseline::*;
use self::files::*;
use self::progress::*;
pub use self::request::{Deliver, DeliverFn, SearchOptions, Summary};
use self::setup::*;

use self::mpiblast::*;
pub use self::mpiblast::{worker, ClusterNet};
pub use crate::error::{interrupt, interrupted, SearchError};
use crate::plan::*;
pub use crate::plan::{
    archive_args, batches, blast_batch_letters, blast_batches, check_blast_args, check_outfmt, choose_split, guided_batches, hitlist_size,
    is_translated, part_keys, preliminary_list, program_types, SplitBy, AUTO_QUERIES_PER_WORKER,
};

/// The trace entry of batch `b`, made on first use.
pub(crate) fn batch_trace(trace: &mut crate::trace::RunTrace, b: usize) -> &mut crate::trace::BatchTrace {
    let i = match trace.batches.iter().position(|t| t.batch == b) {
        Some(i) => i,
        None => {
            trace.batches.push(crate::trace::BatchTrace { batch: b, ..Default::default() });
            trace.batches.len() - 1
        }
    };
    &mut trace.batches[i]
}

fn mol_name(t: MolType) -> &'static str {
    match t {
        MolType::Prot => "protein",
        MolType::Nucl => "nucleotide",
    }
}

/// Where the agents and workers of an agent-mode run come from.
enum Env<'c> {
    /// Start this node's agent and the workers here.
    Local,
    /// A launcher started them (cluster mode); this is rank 0. `shared` is a directory
    /// every node sees (the rendezvous), for the job's batch files and parts.
    Cluster { client: &'c gepsea_client::Client, workers: usize, shared: &'c Path },
    /// A launcher started `workers` workers without agents (the mpiBLAST baseline on a
    /// cluster); they find this master's TCP address in `directory`.
    ClusterNoAgent(ClusterNet),
}

/// Runs a whole search; the output appears at `opts.out` only if everything succeeded.
pub fn run(opts: &SearchOptions) -> Result<Summary, SearchError> {
    run_with(opts, Env::Local)
}

/// Rank 0 of a launched search without agents: the master of the mpiBLAST baseline,
/// with workers on other nodes talking to it over gepsea-net TCP.
pub fn run_cluster_no_agent(opts: &SearchOptions, net: ClusterNet) -> Result<Summary, SearchError> {
    run_with(opts, Env::ClusterNoAgent(net))
}

/// A worker rank of a launched search without agents (the master is rank 0).
pub fn cluster_worker(opts: &SearchOptions, net: &ClusterNet, rank: u32, node: u32) -> Result<(), SearchError> {
    let scratch = gepsea_net::trust::private_scratch(&format!("gepsea-worker-{}", std::process::id()))?;
    let _scratch = RemoveDir(scratch.clone());
    let mut pc = PortConfig::new(&net.namespace, Addr::new(node, rank));
    pc.listen = Some(std::net::SocketAddr::new(net.ip, 0));
    pc.directory = Some(net.directory.clone());
    pc.key = net.key.clone();
    // The master may still be reading its input when workers start.
    pc.reconnect_timeout = Duration::from_secs(120);
    worker_on(Port::open(pc)?, &scratch, &archive_args(&opts.blast_args, &opts.outfmt))
}

/// Rank 0 of a launched (cluster-mode) search: the agents and `workers` workers run
/// elsewhere; `client` is registered with this node's agent; `shared` is a directory
/// every node sees (batch files and the agents' parts go there, not next to the
/// output, which may be on a distant file system).
pub fn run_master(opts: &SearchOptions, client: &gepsea_client::Client, workers: usize, shared: &Path) -> Result<Summary, SearchError> {
    run_with(opts, Env::Cluster { client, workers, shared })
}

/// The search into `opts.out` as [`Destination::of`] sees it: a file (a link's
/// target), or a stream (standard output, a device, a FIFO) into which the finished
/// output is copied from a file of a private directory of its own (`gepsea-stream-<pid>`)
/// (no resume: a stream is written once). Renamed onto a device, the output replaced
/// it (`--out /dev/null` as root made `/dev/null` a regular file).
fn run_with(opts: &SearchOptions, env: Env<'_>) -> Result<Summary, SearchError> {
    let dest = Destination::of(&opts.out);
    let Destination::Stream(_) = dest else {
        return match dest.file() {
            Some(file) if file != opts.out => run_into_file(&SearchOptions { out: file.to_path_buf(), ..opts.clone() }, env),
            _ => run_into_file(opts, env),
        };
    };
    if !matches!(env, Env::Local) {
        let source = std::io::Error::other(
            "not a regular file: a launched search writes its output where every node's storage sees it; give a file",
        );
        return Err(SearchError::Output { path: opts.out.clone(), source });
    }
    let dir = gepsea_net::trust::private_scratch(&format!("gepsea-stream-{}", std::process::id()))?;
    let _removed = files::RemoveDir(dir.clone());
    let inner = SearchOptions { out: dir.join("out"), resume: false, ..opts.clone() };
    let mut summary = run_into_file(&inner, env)?;
    dest.put(&inner.out).map_err(|e| SearchError::Output { path: opts.out.clone(), source: e })?;
    summary.output = opts.out.clone();
    Ok(summary)
}

fn run_into_file(opts: &SearchOptions, env: Env<'_>) -> Result<Summary, SearchError> {
    // Held until the work directory is removed or kept (see `files::WorkDirLock`).
    let _lock = match opts.work_dir.is_none().then(|| default_work_dir(&opts.out)).flatten() {
        Some(dir) => match files::WorkDirLock::take(&dir) {
            Ok(lock) => lock,
            Err(holder) => return Err(SearchError::OutputBusy { path: opts.out.clone(), work_dir: dir, holder }),
        },
        None => None,
    };
    let local = matches!(env, Env::Local);
    let mut result = run_checked(opts, env);
    // A search on one machine whose agent was killed under it (the OOM killer, an
    // operator) starts again, as its rerun would: the batches already finished are
    // reused. Not an agent that shut down (a terminal's Ctrl-C reaches the agent as well
    // as the search), and not with queries from standard input, which cannot be read
    // twice.
    let mut restarts = 0;
    let max = crate::accel::MAX_AGENT_RESTARTS;
    while let Err(SearchError::OwnAgentEnded { pid, status, killed: true }) = &result {
        if !local || restarts == max || interrupted().is_some() || opts.query.as_os_str() == fasta::STDIN {
            break;
        }
        restarts += 1;
        note!(
            "gepsea search: the search's agent (pid {pid}) ended ({status}); starting a new one and resuming from the batches already finished ({restarts} of {max} restarts)"
        );
        // Every part there now is this process's own work (with `--no-resume`, or into a
        // stream, the first run removed any older one of its batches): reuse it.
        result = run_checked(&SearchOptions { resume: true, ..opts.clone() }, Env::Local);
    }
    if result.is_err() && opts.work_dir.is_none() {
        // Kept for a rerun only if it holds finished parts: a search that failed before
        // finishing anything (a bad database, a bad option) leaves nothing behind.
        if let Some(dir) = default_work_dir(&opts.out) {
            let has_parts =
                std::fs::read_dir(dir.join("parts")).is_ok_and(|d| d.flatten().any(|e| e.file_name().to_string_lossy().ends_with(".part")));
            if !has_parts {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
    // A signal also kills the workers, which may surface first as another error.
    match interrupted() {
        Some(sig) if result.is_err() => Err(SearchError::Interrupted(sig)),
        _ => result,
    }
}

fn run_checked(opts: &SearchOptions, env: Env<'_>) -> Result<Summary, SearchError> {
    let started = Instant::now();
    let workers = match &env {
        Env::ClusterNoAgent(net) => net.workers.max(1),
        _ => opts.workers.max(1),
    };
    check_blast_args(&opts.blast_args, workers)?;
    check_outfmt(&opts.outfmt, &opts.blast_args)?;
    if let Some(p) = &opts.program {
        program_types(p).ok_or_else(|| SearchError::UnknownProgram(p.clone()))?;
    }
    let queries = fasta::read_or_stdin(&opts.query)?;
    note_empty_queries(&opts.query, &queries);
    let no_agent = opts.no_agent && !matches!(env, Env::Cluster { .. });
    // The program that will run: the database's default one matches the queries' type,
    // or the search is refused below.
    let runs = opts
        .program
        .clone()
        .unwrap_or_else(|| if fasta::guess_moltype(&queries) == MolType::Nucl { "blastn" } else { "blastp" }.to_string());
    let split = choose_split(
        opts.split,
        matches!(env, Env::Local),
        no_agent,
        queries.len(),
        workers,
        opts.program.as_deref().unwrap_or(""),
        whole_database_option(&runs, &opts.outfmt, &opts.blast_args),
    )?;
    let (out_dir, out_name) = claim_output(&opts.out)?;
    sweep_stale(&out_dir, &out_name);
    // The work directory: the user's (kept: a cache of side directories), or one of our
    // own next to the output (shared storage on a cluster), removed when the search
    // succeeds. Finished parts wait there for a rerun if the search is stopped.
    let (work_dir, own_work_dir) = match &opts.work_dir {
        Some(d) => (d.clone(), false),
        None => (out_dir.join(work_dir_name(&out_name)), true),
    };
    if own_work_dir {
        // Ours goes next to the output: a directory the user cannot write is the
        // output's problem, not that of a hidden directory they never named.
        std::fs::create_dir_all(&work_dir).map_err(|e| SearchError::Output { path: opts.out.clone(), source: e })?;
    }
    // The default work directory is this search's alone (`WorkDirLock`); the user's may
    // serve other searches at the same time.
    let users = (!own_work_dir).then(|| files::SharedWorkDir::join(&work_dir));
    let alone = || users.as_ref().is_none_or(|u| u.alone());
    let fragments = match split {
        // Split by queries every task searches the whole database: one virtual fragment.
        SplitBy::Queries => 1,
        SplitBy::Fragments => opts.fragments.unwrap_or(workers),
    };
    let database = db::resolve(&opts.db, &work_dir, fragments)?;
    if let (Some(k), None) = (opts.fragments, &database.manifest.external) {
        return Err(SearchError::FragmentsOfFormatted(k));
    }
    if let Some(what) = files::clobbered_input(&opts.out, &opts.query, &database) {
        return Err(SearchError::OutputIsInput { path: opts.out.clone(), what });
    }
    let blastdb = database.blastdb_str()?;
    let manifest = database.manifest.clone();
    let (program, qtype) = check_program(opts, &queries, &manifest)?;
    // Also part of every part's name (`part_keys`).
    let blast_version = tools::version()?;
    let recording = match &opts.replay {
        Some(r) => Some(r.open(&manifest, &opts.db, &opts.query, &program, &opts.outfmt, &opts.blast_args)?),
        None => None,
    };
    let tmp_out = out_dir.join(format!(".{out_name}.gepsea-tmp{}", std::process::id()));
    std::fs::write(&tmp_out, b"").map_err(|e| SearchError::Output { path: opts.out.clone(), source: e })?;
    // In a launched job, workers on other nodes read the batch files, so they go next
    // to the output (shared storage), and only the master's node directory of the job's
    // namespace is ours to remove; locally, /tmp and a namespace of our own.
    let pid = std::process::id();
    let (scratch, ns, ns_dir) = match &env {
        Env::ClusterNoAgent(net) => (
            out_dir.join(format!(".gepsea-search-{pid}")),
            net.namespace.clone(),
            gepsea_net::namespace_dir(&net.namespace).join(format!("node-{}", MASTER.node)),
        ),
        _ => {
            let (name, dir) = files::own_namespace(pid)?;
            (gepsea_net::trust::user_runtime_root().join(format!("gepsea-search-{pid}")), name, dir)
        }
    };
    let mut cleanup = Cleanup { scratch: scratch.clone(), tmp_out: tmp_out.clone(), children: Vec::new(), namespace: ns_dir };
    if matches!(env, Env::ClusterNoAgent(_)) {
        std::fs::create_dir_all(&scratch).map_err(|e| SearchError::Io(format!("{}: {e}", scratch.display())))?;
    } else {
        // Private: it holds the user's query batches.
        gepsea_net::trust::ensure_private_dir(&scratch)?;
    }
    let db_dir = database.dir.clone();
    // An empty query would fail the check ("Sequence contains no data"); reading the
    // queries refused a file of only empty ones.
    let first = queries.iter().find(|q| q.residues > 0).unwrap_or(&queries[0]);
    validate_options(&program, &blastdb, &manifest.name, first, &opts.outfmt, &opts.blast_args, &scratch)?;

    let batch_ranges = plan_batches(opts, split, &queries, &program, workers, manifest.fragments.len(), qtype)?;
    let (batch_files, batch_texts) = write_batches(&scratch, &queries, &batch_ranges)?;
    if let Some(r) = &recording {
        check_recording(r, opts, split, &program, &manifest, &batch_files)?;
    }
    let parts_dir = work_dir.join("parts");
    std::fs::create_dir_all(&parts_dir).map_err(|e| SearchError::Io(format!("{}: {e}", parts_dir.display())))?;
    let versions = format!("gepsea {} BLAST+ {}", env!("CARGO_PKG_VERSION"), blast_version);
    let parts: Vec<PathBuf> = part_keys(&versions, &manifest, &program, &opts.outfmt, &opts.blast_args, split, &batch_texts)
        .into_iter()
        .map(|k| parts_dir.join(format!("{k}.part")))
        .collect();
    // With `--no-resume`, older parts are searched again; removed unless another search
    // sharing the work directory may be using them (it would write the same ones).
    if !opts.resume && alone() {
        for p in &parts {
            let _ = std::fs::remove_file(p);
        }
    }
    let reusable: Vec<usize> = if opts.resume { (0..parts.len()).filter(|&b| parts[b].is_file()).collect() } else { Vec::new() };
    if !reusable.is_empty() && !opts.quiet {
        let q: usize = reusable.iter().map(|&b| batch_ranges[b].len()).sum();
        note!(
            "gepsea search: resuming from {}: {} of {} batches ({q} of {} queries) are done already",
            work_dir.display(),
            reusable.len(),
            parts.len(),
            queries.len()
        );
    }
    let done_work = |parts: &[PathBuf]| {
        if !users.as_ref().is_none_or(|u| u.last_to_leave()) {
            // Another search is using the work directory: its parts may be these.
            return;
        }
        for p in parts {
            let _ = std::fs::remove_file(p);
        }
        if own_work_dir {
            let _ = std::fs::remove_dir_all(&work_dir);
        } else {
            let _ = std::fs::remove_dir(&parts_dir);
        }
    };

    if !no_agent {
        let parts_for_cleanup = parts.clone();
        let s = run_accel(
            opts,
            Accel {
                started,
                manifest,
                queries: &queries,
                program,
                db_dir,
                blastdb,
                batch_ranges,
                batch_texts,
                split,
                tmp_out,
                out_dir,
                ns,
                parts,
                recording,
            },
            &mut cleanup,
            env,
        )?;
        done_work(&parts_for_cleanup);
        return Ok(s);
    }
    drop(batch_texts);
    run_baseline(
        opts,
        Baseline {
            started,
            workers,
            manifest,
            queries: &queries,
            program,
            blastdb,
            batch_ranges,
            batch_files,
            scratch,
            split,
            tmp_out,
            ns,
            parts,
            reusable,
            recording,
        },
        &mut cleanup,
        env,
        &done_work,
    )
}

fn deliver(opts: &SearchOptions, agent: Option<&gepsea_client::Client>) -> Result<Option<serde_json::Value>, SearchError> {
    match &opts.deliver {
        Some(d) => Ok(Some((d.0)(&opts.out, agent).map_err(|e| SearchError::Delivery { path: opts.out.clone(), reason: e })?)),
        None => Ok(None),
    }
}

fn describe(t: &crate::schedule::Task, m: &Manifest) -> String {
    match t.target {
        Target::Fragment(f) => format!("batch {} on fragment {}", t.batch, m.fragments[f].name),
        Target::Whole => format!("{} queries on the whole database", t.queries.len()),
    }
}
