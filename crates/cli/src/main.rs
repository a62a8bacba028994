//! The `gepsea` command: every user-facing subcommand. Thin by design: each
//! subcommand parses its arguments and calls into a library crate or a driver module.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use gepsea_blast::{db, search};
use logging::{emit, report, say, tell};

mod agent_cmd;
mod logging;
mod malloc_policy;
mod paramedic_cmd;

#[derive(Parser)]
#[command(name = "gepsea", version, about = "gepsea: a software accelerator for parallel scientific applications")]
struct Cli {
    /// More log output: -v info, -vv debug, -vvv trace (RUST_LOG, when set, decides).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Errors only: no progress, no summary lines, no warnings.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// BLAST databases split into fragments.
    Db {
        #[command(subcommand)]
        what: DbCmd,
    },
    /// Parallel BLAST whose output is identical to one serial BLAST+ run.
    Search(SearchArgs),
    /// The per-node agent (run it, or `gepsea agent status`).
    Agent(agent_cmd::AgentArgs),
    /// ParaMEDIC: ship small metadata instead of bulky output, regenerate it exactly.
    Paramedic {
        #[command(subcommand)]
        what: paramedic_cmd::ParamedicCmd,
    },
    /// (internal) A search worker registered with its node's agent.
    #[command(hide = true)]
    AgentWorker(AgentWorkerArgs),
    /// (internal) A search worker process, started by `gepsea search`.
    #[command(hide = true)]
    Worker(WorkerArgs),
}

#[derive(Subcommand)]
enum DbCmd {
    /// Split a FASTA database into fragments balanced by residues and build them
    /// (streaming, in parallel; memory does not grow with the input).
    Format(FormatArgs),
    /// Check every file of a database made by `db format` against the SHA-256 recorded
    /// when it was formatted (a search checks only sizes).
    Verify(VerifyArgs),
}

#[derive(Args)]
struct VerifyArgs {
    /// Database directory made by `gepsea db format`.
    dir: PathBuf,
}

#[derive(Args)]
#[command(
    after_help = "Options after `--` go to every makeblastdb run, e.g. `-- -taxid_map map.txt -blastdb_version 4 -max_file_sz 1GB`; -parse_seqids is always set."
)]
struct FormatArgs {
    /// FASTA database: plain, gzip, zstd or bzip2 (recognised by content).
    #[arg(long)]
    input: PathBuf,
    /// Number of fragments.
    #[arg(long)]
    fragments: usize,
    /// Output directory (refused if not empty, unless --force).
    #[arg(long)]
    out: PathBuf,
    /// prot or nucl (default: guessed from the sequences).
    #[arg(long)]
    dbtype: Option<gepsea_blast::fasta::MolType>,
    /// Database title, as makeblastdb -title (default: the name).
    #[arg(long)]
    title: Option<String>,
    /// Database name, the -db a serial run would use (default: input file name without extensions).
    #[arg(long)]
    name: Option<String>,
    /// Replace the database already in the output directory (a directory of other
    /// files is refused, as is one holding --input).
    #[arg(long)]
    force: bool,
    /// Fragments built at once (default: number of cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Options for makeblastdb, after `--`.
    #[arg(last = true, allow_hyphen_values = true)]
    makeblastdb_args: Vec<String>,
}

#[derive(Args)]
struct SearchArgs {
    /// A database directory made by `gepsea db format`, or any existing BLAST database
    /// as `blastp -db` takes it: a path or a name found through BLASTDB, single- or
    /// multi-volume, e.g. NCBI's preformatted swissprot or nr (searched in place).
    #[arg(long)]
    db: PathBuf,
    /// Where the job keeps its own small files (for an existing database: alias files
    /// describing its fragments; reused by later searches). Default: a hidden directory
    /// next to --out, removed at the end. Never inside the database's directory.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Existing databases split by fragments: how many OID ranges to cut it into,
    /// balanced by residues (default: one per worker).
    #[arg(long)]
    fragments: Option<usize>,
    /// Search everything again, even what an interrupted run of the same search left
    /// finished in the work directory (by default a rerun after a kill, a signal or a
    /// walltime limit redoes only unfinished batches).
    #[arg(long)]
    no_resume: bool,
    /// Query FASTA (plain or compressed; - reads standard input).
    #[arg(long)]
    query: PathBuf,
    /// Output file (written completely, then renamed into place); - writes to standard output.
    #[arg(long)]
    out: PathBuf,
    /// Worker processes (default: number of cores).
    #[arg(long, value_parser = at_least_one)]
    workers: Option<usize>,
    /// BLAST+ output format, e.g. 6, 7, 0, 5 or "6 qseqid sseqid evalue".
    #[arg(long, default_value = "0")]
    outfmt: String,
    /// blastp, blastn, blastx, tblastn or tblastx (default: blastp or blastn, from the
    /// database type). The translated searches are split by queries.
    #[arg(long)]
    program: Option<String>,
    /// How to cut the search into tasks: by query batches, each searched on the whole
    /// database and written as it stands (exact by construction, least BLAST+ work); by
    /// (query batch, database fragment), merged per query (mpiBLAST's way: a node needs
    /// only its fragments, and few queries still spread over many workers); auto: by
    /// queries on one machine with at least 4 queries per worker, else by fragments.
    #[arg(long, default_value = "auto", value_parser = ["auto", "queries", "fragments"])]
    split: String,
    /// Query residues per batch (default: by fragments, enough batches for two tasks per
    /// worker; by queries, batches shrinking from BLAST+'s own batch size, 10,000 letters
    /// for blastp, which also caps this value).
    #[arg(long)]
    batch_residues: Option<usize>,
    /// The mpiBLAST architecture without agents: the master merges and writes everything.
    #[arg(long)]
    no_agent: bool,
    /// Do not compress results before they cross nodes (agent mode).
    #[arg(long, conflicts_with = "no_agent")]
    no_compress: bool,
    /// Search fragments in place in the database directory instead of having the agents
    /// stage (prefetch, cache and hand over) them in node-local scratch (agent mode).
    #[arg(long, conflicts_with = "no_agent")]
    no_hot_swap: bool,
    /// Bytes of staged database fragments each node keeps in its local scratch (agent
    /// mode): staging one more first removes the least recently used ones that no
    /// worker is searching. Fragments being searched are always kept, so use at least
    /// (workers per node + 1) × the largest fragment. A size: 20GiB, 500MB, 1073741824.
    /// Default: no limit.
    #[arg(long, value_name = "SIZE", conflicts_with_all = ["no_hot_swap", "no_agent"], value_parser = parse_scratch_bytes)]
    scratch_bytes: Option<u64>,
    /// Pin each node's agent to this core, e.g. a core left free of workers (agent
    /// mode; the GePSeA paper's "accelerator on a spare core").
    #[arg(long, value_name = "CORE", conflicts_with = "no_agent")]
    agent_cpu: Option<usize>,
    /// Who merges and writes each batch (agent mode): dynamic (placed by the load
    /// balancer on the agent with the fewest batches in hand), static (round robin) or
    /// single (one agent).
    #[arg(long, default_value = "dynamic", value_parser = ["dynamic", "static", "single"], conflicts_with = "no_agent")]
    merge_assign: String,
    /// Cluster mode (under mpirun/srun): a directory every node shares, where the
    /// processes and agents of the job meet [default: .OUT.gepsea-rendezvous next to
    /// the output].
    #[arg(long)]
    rendezvous: Option<PathBuf>,
    /// Cluster mode: the network the agents talk over, as CIDR (e.g. 10.1.0.0/16).
    #[arg(long)]
    agent_net: Option<String>,
    /// Cluster mode: the agents' TCP port (0: the kernel picks a free one on each node,
    /// so several jobs can share nodes).
    #[arg(long, default_value_t = 0)]
    agent_port: u16,
    /// Cluster mode: encrypt the links between agents (Noise, keyed by the launch's
    /// key); they are always authenticated.
    #[arg(long)]
    encrypt_links: bool,
    /// Cluster mode: the number of nodes, checked against the hosts the processes
    /// report (never needed: nodes are found through the rendezvous).
    #[arg(long)]
    nodes: Option<usize>,
    /// Also deliver the output to a storage site (`gepsea paramedic serve --listen`
    /// there), under the --out file name: the output itself, or with --paramedic its
    /// BLAST metadata, from which the storage site regenerates the identical output.
    #[arg(long)]
    storage_site: Option<std::net::SocketAddr>,
    /// What goes to the --storage-site: the output itself, the output compressed
    /// (zstd), ParaMEDIC's BLAST metadata (a few hundred times smaller than pairwise
    /// or XML output; the storage site searches again over the hits to regenerate it),
    /// or, with agents, `auto`: per part, whichever the measured link and costs say is
    /// fastest (the summary says what it chose and why).
    #[arg(long, requires = "storage_site", value_parser = ["output", "zstd", "metadata", "auto"], default_value = "output")]
    ship: String,
    /// ParaMEDIC: the same as --ship metadata.
    #[arg(long, requires = "storage_site", conflicts_with = "ship")]
    paramedic: bool,
    /// Encrypt the transfer to the storage site under this key (`gepsea paramedic
    /// keygen`; the storage site's `serve --key` holds the same file).
    #[arg(long, requires = "storage_site")]
    storage_key: Option<PathBuf>,
    /// Also write the run's summary (times, counts, agent statistics) as JSON here.
    #[arg(long)]
    summary_json: Option<PathBuf>,
    /// Benchmarks: record every BLAST+ search run (output and duration) into DIR.
    #[arg(long, hide = true, value_name = "DIR", conflicts_with = "replay")]
    record: Option<PathBuf>,
    /// Benchmarks: instead of running BLAST+, each task waits its recorded duration and
    /// delivers the recorded output (DIR made by --record for this very search);
    /// everything else runs for real. See docs/benchmarks.md.
    #[arg(long, hide = true, value_name = "DIR")]
    replay: Option<PathBuf>,
    /// Options passed to BLAST+ unchanged, after `--` (e.g. -- -evalue 1e-5 -seg yes).
    #[arg(last = true, allow_hyphen_values = true)]
    blast_args: Vec<String>,
}

#[derive(Args)]
struct AgentWorkerArgs {
    #[arg(long)]
    namespace: String,
    #[arg(long)]
    node: u32,
    /// Exit without a word when the agent goes away: the search that started this
    /// worker reports it.
    #[arg(long)]
    quiet_if_agent_lost: bool,
}

#[derive(Args)]
struct WorkerArgs {
    #[arg(long)]
    ns: String,
    #[arg(long)]
    port: u32,
    #[arg(long)]
    scratch: PathBuf,
    #[arg(last = true, allow_hyphen_values = true)]
    blast_args: Vec<String>,
}

/// `--scratch-bytes`: a size ([`gepsea_net::parse_byte_size`]), not zero.
fn parse_scratch_bytes(s: &str) -> Result<u64, String> {
    match gepsea_net::parse_byte_size(s) {
        Ok(0) => Err("no scratch at all would stage nothing; leave it out for no limit, or use --no-hot-swap".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// A count that must be at least one (`--workers`): zero workers would have run as
/// one, silently.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// A user error is one clear line and exit status 1, whatever `RUST_BACKTRACE` says
/// (anyhow would print a backtrace with it set); panics keep theirs. A search stopped by
/// SIGINT or SIGTERM exits with 128 + the signal, as a shell reports a killed command.
fn main() -> std::process::ExitCode {
    // Before any thread is started (see the module).
    let malloc = malloc_policy::apply();
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 2 && (args[1] == "--version" || args[1] == "-V") {
        print_version();
        return std::process::ExitCode::SUCCESS;
    }
    match run(malloc) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tell!("gepsea: error: {}", gepsea_net::error::one_line(e.as_ref()));
            match e.downcast_ref::<search::SearchError>() {
                Some(search::SearchError::Interrupted(sig)) => std::process::ExitCode::from((128 + sig) as u8),
                _ => std::process::ExitCode::FAILURE,
            }
        }
    }
}

/// gepsea's version and the BLAST+ it drives (found on PATH).
fn print_version() {
    emit!("gepsea {}", env!("CARGO_PKG_VERSION"));
    match gepsea_blast::tools::version() {
        Ok(v) => emit!("BLAST+ {v}"),
        Err(e) => emit!("BLAST+: {e}"),
    }
}

/// On the first SIGINT or SIGTERM, runs `first` with the signal on a thread of its
/// own; a second one ends the process at once (128 + signal).
fn on_stop_signals(first: impl Fn(i32) + Send + 'static) -> Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).context("installing signal handlers")?;
    std::thread::spawn(move || {
        let mut seen = false;
        for sig in signals.forever() {
            if seen {
                std::process::exit(128 + sig);
            }
            seen = true;
            first(sig);
        }
    });
    Ok(())
}

/// SIGINT and SIGTERM stop a search cleanly (see [`search::interrupt`]).
fn stop_on_signals() -> Result<()> {
    on_stop_signals(|sig| {
        say!("gepsea search: stopping (signal {sig}): removing temporary files and stopping workers");
        search::interrupt(sig);
    })
}

/// SIGINT and SIGTERM stop `db format` without leaving its half-built database (as
/// large as the database) beside the output; while the finished one moves into place,
/// they wait for it.
fn stop_db_format_on_signals() -> Result<()> {
    on_stop_signals(|sig| {
        say!("gepsea db format: stopping (signal {sig}): removing the database being built");
        db::format::stop_build(128 + sig);
        say!("gepsea db format: the database is being moved into place; stopping once it is");
    })
}

fn run(malloc: malloc_policy::Applied) -> Result<()> {
    let cli = Cli::parse();
    let default_level = if matches!(&cli.cmd, Cmd::Agent(a) if a.action.is_none()) { "info" } else { "warn" };
    logging::init(cli.verbose, cli.quiet, default_level);
    gepsea_blast::set_quiet(cli.quiet);
    tracing::debug!(?malloc, "malloc policy (keep freed memory for reuse)");
    match cli.cmd {
        Cmd::Db { what: DbCmd::Format(a) } => {
            stop_db_format_on_signals()?;
            let o = db::FormatOptions {
                input: &a.input,
                fragments: a.fragments,
                out: &a.out,
                dbtype: a.dbtype,
                title: a.title,
                name: a.name,
                force: a.force,
                jobs: a.jobs.unwrap_or(0),
                makeblastdb_args: a.makeblastdb_args,
            };
            let started = std::time::Instant::now();
            say!("gepsea db format: reading {}", a.input.display());
            let m = db::format(&o, |p| match p {
                db::format::Progress::Scanned { sequences, residues, bytes } => {
                    say!("gepsea db format: {sequences} sequences, {residues} residues ({:.1} MB of FASTA) checked in {:.1} s; building {} fragments", bytes as f64 / 1e6, started.elapsed().as_secs_f64(), a.fragments)
                }
                db::format::Progress::Built { done, total } => say!("gepsea db format: fragment {done}/{total} built"),
            })?;
            report!(
                "formatted {} ({} sequences, {} residues, {}) into {} fragments in {}",
                m.name,
                m.sequences,
                m.residues,
                m.dbtype.as_str(),
                m.fragments.len(),
                a.out.display()
            );
            Ok(())
        }
        Cmd::Db { what: DbCmd::Verify(a) } => {
            let m = db::verify(&a.dir, |i, n| {
                if i == n || i % 16 == 0 {
                    say!("gepsea db verify: {i}/{n} files checked");
                }
            })?;
            let files: usize = m.fragments.iter().map(|f| f.files.len()).sum();
            report!("{}: {} fragments, {files} files, every checksum matches", a.dir.display(), m.fragments.len());
            Ok(())
        }
        Cmd::Search(a) => {
            let workers = a.workers.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
            let ship = if a.paramedic { "metadata" } else { a.ship.as_str() };
            // With agents, each part goes as soon as it is written (ParaMEDIC's overlap);
            // without, the search process ships the whole output at the end.
            if a.storage_site.is_some() && a.no_agent && ship == "auto" {
                anyhow::bail!("--ship auto chooses per part from the agents' measured transfers: drop --no-agent, or choose --ship output, zstd or metadata");
            }
            // Refused or replaced now, not found when the first part is encoded.
            let undescribed = a.storage_site.and(paramedic::blast::cannot_describe(&a.outfmt));
            let ship = match (ship, undescribed) {
                ("metadata", Some(why)) => anyhow::bail!("--ship metadata: {why}; choose --ship zstd or output"),
                ("auto", Some(why)) => {
                    say!("gepsea search: --ship auto: {why}; its parts go compressed (zstd)");
                    "zstd"
                }
                (s, _) => s,
            };
            if a.storage_site.is_some() && a.no_agent && a.query.as_os_str() == gepsea_blast::fasta::STDIN {
                anyhow::bail!("--query -: without agents the output goes to the storage site after the search, which reads the queries again: give them as a file");
            }
            let (deliver, ship_parts) = match a.storage_site {
                Some(storage) if a.no_agent => (
                    Some(paramedic_cmd::deliver_to(
                        storage,
                        a.storage_key.as_deref(),
                        ship,
                        (a.db.as_path(), a.query.as_path(), a.outfmt.as_str(), a.blast_args.as_slice()),
                    )?),
                    None,
                ),
                Some(storage) => (
                    None,
                    Some(paramedic_cmd::ship_parts_to(
                        storage,
                        a.storage_key.as_deref(),
                        ship,
                        &a.out,
                        (a.db.as_path(), a.blast_args.as_slice()),
                    )?),
                ),
                None => (None, None),
            };
            let opts = search::SearchOptions {
                db: a.db,
                work_dir: a.work_dir,
                fragments: a.fragments,
                resume: !a.no_resume,
                query: a.query,
                out: a.out,
                workers,
                outfmt: a.outfmt,
                program: a.program,
                batch_residues: a.batch_residues,
                split: match a.split.as_str() {
                    "queries" => Some(search::SplitBy::Queries),
                    "fragments" => Some(search::SplitBy::Fragments),
                    _ => None,
                },
                quiet: cli.quiet,
                blast_args: a.blast_args,
                worker_exe: std::env::current_exe().context("locating the gepsea executable")?,
                no_agent: a.no_agent,
                compress: !a.no_compress,
                hot_swap: !a.no_hot_swap,
                scratch_bytes: a.scratch_bytes,
                agent_cpu: a.agent_cpu,
                deliver,
                ship_parts,
                replay: match (a.record, a.replay) {
                    (Some(dir), _) => Some(gepsea_blast::replay::ReplayRequest { mode: gepsea_blast::replay::ReplayMode::Record, dir }),
                    (_, Some(dir)) => Some(gepsea_blast::replay::ReplayRequest { mode: gepsea_blast::replay::ReplayMode::Replay, dir }),
                    _ => None,
                },
                assign: match a.merge_assign.as_str() {
                    "static" => gepsea_blast::accel::MergeAssign::Static,
                    "single" => gepsea_blast::accel::MergeAssign::Single,
                    _ => gepsea_blast::accel::MergeAssign::Dynamic,
                },
            };
            let launch = gepsea_blast::cluster::detect().filter(|l| l.size > 1);
            // The master cleans up after itself; other ranks keep the default action.
            if launch.as_ref().is_none_or(|l| l.rank == 0) {
                stop_on_signals()?;
            }
            let s = match launch {
                Some(l) => {
                    let c = gepsea_blast::cluster::ClusterOptions {
                        rendezvous: a.rendezvous.clone(),
                        agent_net: a.agent_net.clone(),
                        agent_port: a.agent_port,
                        nodes: a.nodes,
                        encrypt: a.encrypt_links,
                    };
                    let opts = search::SearchOptions { quiet: opts.quiet || l.rank != 0, ..opts };
                    match gepsea_blast::cluster::run(&opts, l, &c)? {
                        Some(s) => s,
                        None => return Ok(()),
                    }
                }
                None => search::run(&opts)?,
            };
            if let Some(d) = &s.delivery {
                if let Ok(sh) = serde_json::from_value::<paramedic::agent::Shipped>(d.clone()) {
                    say!(
                        "gepsea search: {} bytes of output shipped as {} bytes of {} to {}{} by {} in {:.2} s (encoding {:.2} s); the storage site wrote {} bytes ({:.2} s there); {} reconnect(s), {} frame(s) resent",
                        sh.output_bytes,
                        sh.bytes,
                        match sh.plugin.as_str() {
                            "blast" => "ParaMEDIC metadata",
                            "zstd" => "compressed output",
                            "mixed" => "output, compressed output or metadata as chosen per part",
                            _ => "output",
                        },
                        a.storage_site.map(|s| s.to_string()).unwrap_or_default(),
                        if sh.encrypted { ", encrypted," } else { "" },
                        match (sh.by_agent, sh.objects > 1) {
                            (true, true) => format!("the agents ({} parts, each as soon as its batch was final; times summed over parts)", sh.objects),
                            (true, false) => "the agent".into(),
                            _ => "this process".into(),
                        },
                        sh.transfer_seconds,
                        sh.encode_seconds,
                        sh.bytes_written_at_storage,
                        sh.storage_seconds,
                        sh.reconnects,
                        sh.frames_resent
                    );
                    if !sh.chosen.is_empty() {
                        let chosen: Vec<String> = sh.chosen.iter().map(|(k, n)| format!("{n} as {k}")).collect();
                        say!("gepsea search: --ship auto sent {}; last choice: {}", chosen.join(", "), sh.reason.as_deref().unwrap_or("-"));
                    }
                }
            }
            if let Some(p) = &a.summary_json {
                paramedic_cmd::write_atomically(p, serde_json::to_string_pretty(&s)?.as_bytes())?;
            }
            if !opts.quiet {
                tell!(
                    "gepsea search: {} queries, {} hits, {} tasks split by {} ({} queries re-searched whole{}), {:.2} s, output {}",
                    s.queries,
                    s.hits,
                    s.tasks,
                    s.split,
                    s.whole_db_fallbacks,
                    match s.reused_parts {
                        0 => String::new(),
                        1 => "; 1 batch reused from an interrupted run".to_string(),
                        n => format!("; {n} batches reused from an interrupted run"),
                    },
                    s.wall_seconds,
                    s.output.display()
                );
                if let Some(a) = s.accel.as_ref().filter(|a| a.stagings.iter().any(|n| *n > 0)) {
                    tell!(
                        "gepsea search: {}; workers waited {:.2} s for input; at most {} bytes staged on a node, {} staged copies removed to make room",
                        gepsea_blast::accel::describe_stagings(a.stagings),
                        a.work.input_seconds,
                        a.scratch_peak_bytes,
                        a.evicted
                    );
                }
            }
            Ok(())
        }
        Cmd::Agent(a) => agent_cmd::run(&a),
        Cmd::Paramedic { what } => paramedic_cmd::run(&what),
        Cmd::AgentWorker(a) => match search::agent_worker(&a.namespace, a.node) {
            // (Its client is closed already: nothing is left to drop.)
            // Also an agent killed while this worker was registering (the search restarts
            // it, or says that it ended).
            Err(search::SearchError::AgentLost(_) | search::SearchError::AgentUnreachable(_)) if a.quiet_if_agent_lost => {
                std::process::exit(1)
            }
            r => Ok(r?),
        },
        Cmd::Worker(a) => Ok(search::worker(&a.ns, a.port, &a.scratch, &a.blast_args)?),
    }
}
