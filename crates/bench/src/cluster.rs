//! `gepsea-bench cluster`: the GePSeA paper's mpiBLAST experiments at this machine's
//! scale. For 1, 2 and 4 emulated nodes (network namespaces on a bridge, launched with
//! `mpirun` exactly as on a cluster, one worker per node), the same result-heavy search
//! (pairwise output, hundreds of hits per query) runs without agents (mpiBLAST's own
//! architecture: the master merges and writes everything) and with them, in the
//! variants the paper compares: merging and writing assigned dynamically, statically,
//! or to one agent, and without runtime compression. Every output is checked against
//! serial `blastp`, whose time is the reference measured in the same run.
//!
//! Reported per run: wall time, speed-up over the 1-node run without agents, the share
//! of worker time spent inside BLAST+, the agents' CPU (sampled from /proc while the
//! job runs, including the BLAST+ formatting runs they start, as % of one core per
//! agent) and the bytes of results that crossed nodes.
//! Plots (PNG, plotters) go next to the JSON.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gepsea_blast::trace::RunTrace;
use gepsea_net::testbed::NetnsBridge;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::cluster_model::{measure_compression, Compression};
use crate::workload::{run_ok, same_output, StorageMount, TempDir, Workload};

#[derive(clap::Args, Debug)]
pub struct ClusterBenchArgs {
    #[command(flatten)]
    pub workload: Workload,
    /// Node counts to run, comma-separated [default: 1,2,4; with --replay 1,4,8,16,36].
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<usize>,
    /// Replay: workers do not run BLAST+ but wait each task's recorded duration and
    /// deliver its recorded output (everything else is real), so the master's and the
    /// agents' work shows as it would with the searches on other machines. DIR holds
    /// the recording; if it holds none yet, the search is first recorded into it for
    /// real on this machine (and checked against serial BLAST+).
    #[arg(long, value_name = "DIR")]
    pub replay: Option<PathBuf>,
    /// Only record the workload's search (real BLAST+, 2 workers on this machine) into
    /// DIR, check it against serial BLAST+, and stop.
    #[arg(long, value_name = "DIR", conflicts_with = "replay")]
    pub record: Option<PathBuf>,
    /// Variants to run (comma-separated indices into: no agent, agents dynamic, static,
    /// one merger, no compression) [default: all].
    #[arg(long, value_delimiter = ',')]
    pub variants: Vec<usize>,
    /// Options passed to every BLAST+ search (serial reference included), e.g.
    /// "-evalue 100 -num_alignments 1000" for more result data per query.
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    pub blast_options: String,
    /// BLAST output format (0, pairwise, is the result-heavy one).
    #[arg(long, default_value = "0")]
    pub outfmt: String,
    /// Query batches (each merged and written as one part): enough that the
    /// assignment of merging and writing to agents matters.
    #[arg(long, default_value_t = 16)]
    pub batches: usize,
    /// Rate of the link to the storage node holding the output location, Mbit/s
    /// (0: the output stays on this machine's disk).
    #[arg(long, default_value_t = 100)]
    pub storage_mbit: u32,
    /// Write results as JSON here; the plots go to the same directory.
    #[arg(long, default_value = "bench/out/cluster.json")]
    pub json: PathBuf,
    /// Run nothing: play the model again on the runs (and their traces) that an
    /// earlier `--replay` saved in FILE (its --json), with the recording in --replay.
    #[arg(long, value_name = "FILE", requires = "replay")]
    pub model_only: Option<PathBuf>,
}

/// One measured run. Saved with its trace in the JSON, so that the model can be played
/// again on it (`--model-only`) without replaying.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Row {
    pub nodes: usize,
    pub variant: String,
    /// Index into [`VARIANTS`].
    pub variant_index: usize,
    pub wall_seconds: f64,
    pub speedup: f64,
    pub search_fraction: f64,
    /// The same over workers' active time (first task to last result handed over).
    pub active_search_fraction: f64,
    pub agent_cpu_percent: f64,
    /// CPU seconds of the agents' own processes (their loops, event and job threads),
    /// without the BLAST+ formatting runs they wait for: the cost of running the
    /// agents themselves, which the model plays on the shared cores.
    #[serde(default)]
    pub agent_own_cpu_seconds: f64,
    /// CPU of this many agents left idle on the same testbed, in cores, measured before
    /// the runs (`idle_agents`): what the group costs when it has nothing to do
    /// (until the eleventh session, heartbeats that grew with the square of the group).
    /// Zero for mpiBLAST, for runs that were not replayed (the model that
    /// reports it plays replays only) and for runs saved before it was kept.
    #[serde(default)]
    pub idle_agent_cores: f64,
    /// CPU seconds this many agents spent starting (to every one ready), measured with
    /// the idle group: the part of the agents' own CPU that grows with the node count
    /// whatever the work. Zero where `idle_agent_cores` is, and for runs saved before
    /// it was kept.
    #[serde(default)]
    pub agent_start_cpu_seconds: f64,
    /// CPU seconds the whole machine was busy during the search (all cores, every
    /// process: agents, BLAST+ formatting runs, the master, `sshd`/`sshfs` of the storage
    /// link, the kernel). Over the cores it is the shortest the run could have been on
    /// this machine. Zero for runs saved before it was kept.
    #[serde(default)]
    pub machine_busy_seconds: f64,
    pub bytes_wire: u64,
    pub bytes_raw: u64,
    pub mergers: usize,
    /// Task by task and batch by batch (`Summary::trace`).
    pub trace: RunTrace,
}

impl Row {
    /// CPU seconds of the run's agents, with the BLAST+ runs they waited for (zero
    /// without agents): `agent_cpu_percent` of a core per node, over the run.
    pub fn agent_cpu_seconds(&self) -> f64 {
        self.agent_cpu_percent / 100.0 * self.nodes as f64 * self.wall_seconds
    }
}

const VARIANTS: [(&str, &[&str]); 5] = [
    ("no agent (mpiBLAST)", &["--no-agent"]),
    ("agents, dynamic", &[]),
    ("agents, static", &["--merge-assign", "static"]),
    ("agents, one merger", &["--merge-assign", "single"]),
    ("agents, no compression", &["--no-compress"]),
];

/// What a group of agents costs apart from any work ([`idle_agents`]).
#[derive(Clone, Copy, Debug, Default)]
struct IdleGroup {
    /// CPU seconds, all agents together, from their start until every one is ready
    /// (process start, shared memory, meeting the others, authenticated links).
    start_cpu_seconds: f64,
    /// Cores, all agents together, once all are ready and nothing is asked of them.
    cores: f64,
}

/// The CPU of `nodes` agents, one per node of `bed` as a search starts them
/// (authenticated links, a rendezvous directory): what their start costs, and what
/// they cost left idle, in cores over 5 s once all are ready. An idle agent only looks
/// for new agents now and then; its links are watched by the kernel (TCP keepalive).
/// The model charges both as measured (`cluster_model::AgentOwn`).
fn idle_agents(bed: &NetnsBridge, nodes: usize, gepsea: &Path, d: &Path) -> Result<IdleGroup> {
    let ns = format!("gbidle{}n{nodes}", std::process::id());
    let dir = d.join(format!("idle-{nodes}"));
    std::fs::create_dir_all(&dir)?;
    let key = dir.join("key");
    crate::net::write_key_file(&key)?;
    let rv = dir.join("agents");
    let mut agents = crate::net::Kill(Vec::new());
    let result = (|| -> Result<IdleGroup> {
        for i in 0..nodes {
            let mut c = bed.cmd(i, gepsea);
            c.args(["agent", "--quiet", "--namespace", &ns, "--node-id", &(i + 1).to_string()])
                .args(["--listen", &format!("{}:0", bed.ip[i]), "--nodes", &nodes.to_string(), "--rendezvous"])
                .arg(&rv)
                .arg("--key-file")
                .arg(&key)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            agents.0.push(c.spawn().context("starting an idle agent")?);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        let ready = |n: usize| {
            let status = gepsea_client::status(&ns, n as u32).unwrap_or_default();
            serde_json::from_str::<serde_json::Value>(&status).is_ok_and(|s| s["ready"] == true)
        };
        let cpu = |agents: &crate::net::Kill| -> f64 {
            agents.0.iter().filter_map(|c| crate::procstat::cpu_split(c.id())).map(|(own, waited)| own + waited).sum()
        };
        // Polled every 20 ms: an idle group costs well under 1 % of a core, so the
        // poll's overshoot adds nothing measurable to the start.
        while !(1..=nodes).all(ready) {
            if Instant::now() > deadline {
                bail!("the idle agents were not all ready within 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let start_cpu_seconds = cpu(&agents);
        std::thread::sleep(Duration::from_secs(2));
        let (t0, c0) = (Instant::now(), cpu(&agents));
        std::thread::sleep(Duration::from_secs(5));
        Ok(IdleGroup { start_cpu_seconds, cores: (cpu(&agents) - c0) / t0.elapsed().as_secs_f64() })
    })();
    drop(agents);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(gepsea_net::namespace_dir(&ns));
    result
}

/// What [`sample_agents`] saw during one run.
#[derive(Default)]
struct Sampled {
    /// Per agent process: CPU seconds with the children it waited for, and its own.
    agents: BTreeMap<u32, (f64, f64)>,
    /// `(unix time, machine busy CPU seconds)`, every sampling round, the last one
    /// after the run ended ([`crate::procstat::busy_between`] reads the search's window).
    machine: Vec<(f64, f64)>,
}

/// Samples the CPU time of every `gepsea agent` of namespace `ns` until stopped; the
/// last sample of each agent is its total (agents live only as long as the job): CPU
/// seconds with the children it has waited for (its BLAST+ runs), and its own. Each
/// round also reads the machine's busy CPU, timed by the clock the search's trace uses.
fn sample_agents(ns: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Sampled> {
    std::thread::spawn(move || {
        let mut last = BTreeMap::new();
        let mut machine = Vec::new();
        let needle = format!("agent\0--namespace\0{ns}");
        // The sampler shares the 2 cores with the run it measures: reading every command
        // line every 100 ms cost 4 % of them, and reading each gepsea process's every
        // 250 ms still cost 1.3 CPU-s of a 36-node run. So each process is classified
        // once, from its `stat` (the command name) and, for a gepsea one, its command
        // line; after that only the agents' `stat` is read. A process forked by a rank
        // or an agent carries its parent's command line until it execs (an agent is
        // started that way, and starts BLAST+ that way), so a gepsea process is
        // classified only once it has run for a second.
        let mut agents: std::collections::HashSet<u32> = std::collections::HashSet::new();
        let mut others: std::collections::HashSet<u32> = std::collections::HashSet::new();
        loop {
            if let Some(busy) = crate::procstat::machine_busy_seconds() {
                machine.push((gepsea_blast::trace::unix_now(), busy));
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let up = crate::procstat::uptime_seconds().unwrap_or(f64::MAX);
            for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
                if others.contains(&pid) {
                    continue;
                }
                let Some(st) = crate::procstat::proc_stat(pid) else { continue };
                if !agents.contains(&pid) {
                    if st.comm != "gepsea" {
                        others.insert(pid);
                        continue;
                    }
                    if up - st.started < 1.0 {
                        continue;
                    }
                    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                    if !String::from_utf8_lossy(&cmd).contains(&needle) {
                        others.insert(pid);
                        continue;
                    }
                    agents.insert(pid);
                }
                last.insert(pid, (st.own + st.waited, st.own));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        Sampled { agents: last, machine }
    })
}

pub fn run(a: &ClusterBenchArgs) -> Result<()> {
    if let (Some(saved), Some(r)) = (&a.model_only, &a.replay) {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(saved).with_context(|| format!("{}", saved.display()))?)
            .with_context(|| format!("{}: not JSON", saved.display()))?;
        let rows: Vec<Row> = serde_json::from_value(v["runs"].clone())
            .with_context(|| format!("{}: no runs with traces (saved by an older gepsea-bench?)", saved.display()))?;
        let out_dir = a.json.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
        let compression = match Compression::saved(&v) {
            Some(c) => c,
            None => {
                eprintln!(
                    "bench cluster: {} holds no compression rate (saved by an older gepsea-bench): timing zstd again, so this model may differ slightly from the run's (about 0.1 %)",
                    saved.display()
                );
                measure_compression(&r.join("recording"))?
            }
        };
        crate::cluster_model::report(&rows, compression, &out_dir)?;
        return Ok(());
    }
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench cluster builds network namespaces: run it as root");
    }
    let gepsea = crate::net::sibling("gepsea")?;
    let dir = TempDir(std::env::temp_dir().join(format!("gepsea-bench-cluster-{}", std::process::id())));
    let d = &dir.0;
    std::fs::create_dir_all(d)?;
    // The workload (inputs, formatted database, serial reference) lives in the
    // recording's directory when there is one, so that later replays reuse exactly the
    // database the recording was made against.
    let keep = a.replay.as_ref().or(a.record.as_ref());
    let wd = keep.cloned().unwrap_or_else(|| d.clone());
    std::fs::create_dir_all(&wd)?;
    let wd = std::fs::canonicalize(&wd)?;
    let blast_opts: Vec<String> = a.blast_options.split_whitespace().map(str::to_string).collect();
    let params = json!({"db": a.workload.db, "query": a.workload.query, "queries": a.workload.queries, "queries_from_db": a.workload.queries_from_db, "fragments": a.workload.fragments,
        "batches": a.batches, "outfmt": a.outfmt, "blast_options": blast_opts});
    let prepared: Option<serde_json::Value> = std::fs::read(wd.join("workload.json")).ok().and_then(|b| serde_json::from_slice(&b).ok());
    let (serial, batch_residues) = match prepared {
        Some(p) if p["params"] == params && wd.join("recording/recording.json").is_file() => {
            eprintln!("bench cluster: reusing the workload and recording in {}", wd.display());
            (p["serial_seconds"].as_f64().unwrap_or(0.0), p["batch_residues"].as_u64().unwrap_or(1).to_string())
        }
        Some(p) if keep.is_some() && p["params"] == params => {
            // The workload is prepared but its recording is gone (removed after a change
            // to the tasks a search runs, such as how fallbacks are cut): record again,
            // against the same database and serial reference.
            eprintln!("bench cluster: reusing the workload in {}; recording its search again", wd.display());
            let batch_residues = p["batch_residues"].as_u64().unwrap_or(1).to_string();
            record(&gepsea, &wd, &a.outfmt, &batch_residues, &blast_opts)?;
            (p["serial_seconds"].as_f64().unwrap_or(0.0), batch_residues)
        }
        Some(p) if keep.is_some() && p["params"] != params => {
            bail!("{} holds a recording of another workload ({}); use another directory for this one", wd.display(), p["params"])
        }
        _ => {
            let residues = a.workload.prepare(&gepsea, &wd)?;
            let batch_residues = residues.div_ceil(a.batches.max(1)).to_string();
            Workload::reference_db(&wd)?;
            let t = Instant::now();
            run_ok(
                Command::new("blastp")
                    .env("BLASTDB", wd.join("ref"))
                    .args(["-db", "DB", "-outfmt", &a.outfmt, "-query"])
                    .arg(wd.join("q.fasta"))
                    .arg("-out")
                    .arg(wd.join("serial.out"))
                    .args(&blast_opts),
            )?;
            let serial = t.elapsed().as_secs_f64();
            if keep.is_some() {
                record(&gepsea, &wd, &a.outfmt, &batch_residues, &blast_opts)?;
                let w = json!({"params": params, "serial_seconds": serial, "batch_residues": batch_residues.parse::<u64>()?});
                crate::out::json(&wd.join("workload.json"), &w)?;
            }
            (serial, batch_residues)
        }
    };
    let serial_out = wd.join("serial.out");
    let out_bytes = std::fs::metadata(&serial_out)?.len();
    if a.record.is_some() {
        eprintln!(
            "bench cluster: recorded {} in {} (serial blastp {serial:.2} s, {:.1} MB of output)",
            recording_summary(&wd.join("recording"))?,
            wd.display(),
            out_bytes as f64 / 1e6
        );
        return Ok(());
    }
    let recording = a.replay.as_ref().map(|_| wd.join("recording"));
    let node_counts = if !a.nodes.is_empty() {
        a.nodes.clone()
    } else if recording.is_some() {
        vec![1, 4, 8, 16, 36]
    } else {
        vec![1, 2, 4]
    };
    let variants: Vec<(usize, &str, &[&str])> = VARIANTS
        .iter()
        .enumerate()
        .filter(|(i, _)| a.variants.is_empty() || a.variants.contains(i))
        .map(|(i, (name, flags))| (i, *name, *flags))
        .collect();
    if let Some(r) = &recording {
        eprintln!("bench cluster: replaying {}", recording_summary(r)?);
    }
    eprintln!(
        "bench cluster: {} queries in {} batches, {} fragments, outfmt {} ({:.1} MB of output), output location {}; serial blastp {serial:.2} s",
        a.workload.queries + a.workload.queries_from_db,
        a.batches,
        a.workload.fragments,
        a.outfmt,
        out_bytes as f64 / 1e6,
        if a.storage_mbit > 0 { format!("on a storage node behind a {} Mbit/s link (sshfs)", a.storage_mbit) } else { "on local disk".into() }
    );

    let mut rows: Vec<Row> = Vec::new();
    let mut base = None;
    for &nodes in &node_counts {
        // Nodes 0..n compute; node n holds the output location.
        let bed = NetnsBridge::new(&format!("bc{nodes}"), nodes + 1).context("building the testbed")?;
        let storage = if a.storage_mbit > 0 {
            // The switch's port towards the storage node carries every write to it.
            run_ok(Command::new("ip").args([
                "netns",
                "exec",
                &bed.switch_name(),
                "tc",
                "qdisc",
                "add",
                "dev",
                &format!("p{nodes}"),
                "root",
                "tbf",
                "rate",
                &format!("{}mbit", a.storage_mbit),
                "burst",
                "64kb",
                "latency",
                "50ms",
            ]))?;
            Some(StorageMount::new(&bed.ns[nodes], &bed.ip[nodes], &bed.ns[0], d)?)
        } else {
            None
        };
        let out_dir = storage.as_ref().map_or(d.to_path_buf(), |s| s.mountpoint.clone());
        let subnet = bed.subnet();
        // Only the model uses it (replays).
        let idle = if recording.is_some() && variants.iter().any(|v| !v.2.contains(&"--no-agent")) {
            let g = idle_agents(&bed, nodes, &gepsea, d).with_context(|| format!("{nodes} idle agents"))?;
            eprintln!(
                "  {nodes} node(s), agents left idle: start {:.2} CPU-s in all, then {:.3} cores in all",
                g.start_cpu_seconds, g.cores
            );
            g
        } else {
            IdleGroup::default()
        };
        // One worker per node; the master shares the first node.
        let slots: Vec<usize> = (0..nodes).map(|i| if i == 0 { 2 } else { 1 }).collect();
        for &(variant_index, variant, flags) in &variants {
            let out = out_dir.join(format!("out-{nodes}"));
            let summary = d.join("summary.json");
            let _ = std::fs::remove_file(&summary);
            let rv = d.join(format!("rv-{nodes}-{}", rows.len()));
            let mut c = bed.mpirun(d, &slots, nodes + 1)?;
            if std::env::var_os("RUST_LOG").is_some() {
                // The ranks' and agents' log, for looking into a run.
                c.args(["-x", "RUST_LOG"]);
            }
            c.arg(&gepsea)
                .args(["search", "--quiet", "--outfmt", &a.outfmt, "--split", "fragments", "--db"])
                .arg(wd.join("g"))
                .arg("--query")
                .arg(wd.join("q.fasta"));
            if let Some(r) = &recording {
                c.arg("--replay").arg(r);
            }
            c.arg("--out")
                .arg(&out)
                .arg("--rendezvous")
                .arg(&rv)
                .args(["--agent-net", &subnet])
                .arg("--summary-json")
                .arg(&summary)
                .args(["--nodes", &nodes.to_string(), "--batch-residues", &batch_residues])
                .args(flags)
                .arg("--")
                .args(&blast_opts);
            c.stdout(Stdio::piped()).stderr(Stdio::piped());
            let stop = Arc::new(AtomicBool::new(false));
            let sampler = sample_agents(gepsea_blast::cluster::namespace(&out), stop.clone());
            let o = c.output()?;
            stop.store(true, Ordering::Relaxed);
            let sampled = sampler.join().unwrap_or_default();
            let agent_cpu = sampled.agents.values().fold(0.0, |sum, c| sum + c.0);
            let agent_own_cpu = sampled.agents.values().fold(0.0, |sum, c| sum + c.1);
            if !o.status.success() {
                bail!(
                    "{nodes} nodes, {variant}: mpirun failed: {}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            if std::env::var_os("RUST_LOG").is_some() {
                // The ranks' and agents' log (a failed run's is in the error above).
                eprint!("{}", String::from_utf8_lossy(&o.stderr));
            }
            if !same_output(&out, &serial_out)? {
                bail!("{nodes} nodes, {variant}: the output differs from serial blastp");
            }
            let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary)?)?;
            let wall = s["wall_seconds"].as_f64().unwrap_or(0.0);
            let frac = s["blast_seconds"].as_f64().unwrap_or(0.0) / s["worker_seconds"].as_f64().unwrap_or(1.0).max(1e-9);
            let active = s["blast_seconds"].as_f64().unwrap_or(0.0) / s["worker_active_seconds"].as_f64().unwrap_or(1.0).max(1e-9);
            let base_wall = *base.get_or_insert(wall);
            let agents = if flags.contains(&"--no-agent") { 0 } else { nodes };
            let trace: RunTrace = serde_json::from_value(s["trace"].clone()).context("the summary's trace")?;
            let machine_busy_seconds =
                crate::procstat::busy_between(&sampled.machine, trace.finished_unix - wall, trace.finished_unix).unwrap_or(0.0);
            let row = Row {
                nodes,
                variant: variant.to_string(),
                variant_index,
                trace,
                machine_busy_seconds,
                wall_seconds: wall,
                speedup: base_wall / wall,
                search_fraction: frac,
                active_search_fraction: active,
                agent_cpu_percent: if agents == 0 { 0.0 } else { 100.0 * agent_cpu / (wall * agents as f64) },
                agent_own_cpu_seconds: agent_own_cpu,
                idle_agent_cores: if agents == 0 { 0.0 } else { idle.cores },
                agent_start_cpu_seconds: if agents == 0 { 0.0 } else { idle.start_cpu_seconds },
                bytes_wire: s["accel"]["bytes_wire"].as_u64().unwrap_or(0),
                bytes_raw: s["accel"]["bytes_raw"].as_u64().unwrap_or(0),
                mergers: s["accel"]["mergers"].as_object().map_or(1, |m| m.len()),
            };
            eprintln!(
                "  {nodes} node(s), {variant:<24} {wall:7.2} s  speed-up {:.2}  in BLAST+ {:5.1} % (active {:5.1} %)  agent CPU {:4.1} % (own {:.1} CPU-s)  results across nodes {:.2} MB ({:.2} MB raw), {} merger(s); identical to serial",
                row.speedup,
                100.0 * frac,
                100.0 * active,
                row.agent_cpu_percent,
                row.agent_own_cpu_seconds,
                row.bytes_wire as f64 / 1e6,
                row.bytes_raw as f64 / 1e6,
                row.mergers
            );
            if let Ok(stagings) = serde_json::from_value::<[u32; 4]>(s["accel"]["stagings"].clone()) {
                eprintln!(
                    "  {nodes} node(s), {variant}: {}; workers waited {:.2} s for input",
                    gepsea_blast::accel::describe_stagings(stagings),
                    s["accel"]["work"]["input_seconds"].as_f64().unwrap_or(0.0)
                );
            }
            rows.push(row);
            let _ = std::fs::remove_file(&out);
        }
        drop(storage);
        drop(bed);
    }
    println!("\nserial blastp (reference): {serial:.2} s\n");
    // The emulated nodes share this machine's cores, so the agents' work (their own and
    // their BLAST+ formatting runs) cannot end sooner than its CPU over the cores, and no
    // run sooner than all the CPU the machine spent on it: the bounds this machine puts
    // on a run, printed beside it.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    println!(
        "| nodes | variant | wall s | vs serial | speed-up | in BLAST+ | in BLAST+, active | agent CPU | agents' own CPU-s | agents' CPU over {cores} cores, s | machine busy over {cores} cores, s | MB across nodes (raw) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let floor = r.agent_cpu_seconds() / cores as f64;
        let dash = |x: f64| if x > 0.0 { format!("{x:.1}") } else { "–".into() };
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.1} % | {:.1} % | {:.1} % | {:.1} | {} | {} | {:.2} ({:.2}) |",
            r.nodes,
            r.variant,
            r.wall_seconds,
            r.wall_seconds / serial,
            r.speedup,
            100.0 * r.search_fraction,
            100.0 * r.active_search_fraction,
            r.agent_cpu_percent,
            r.agent_own_cpu_seconds,
            dash(floor),
            dash(r.machine_busy_seconds / cores as f64),
            r.bytes_wire as f64 / 1e6,
            r.bytes_raw as f64 / 1e6
        );
    }
    for line in machine_bounds(&rows, cores) {
        println!("{line}");
    }
    let out_dir = a.json.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
    // Timed once, with the runs over, and saved: `--model-only` plays the same costs.
    let compression = recording.as_deref().map(measure_compression).transpose()?;
    crate::out::json(
        &a.json,
        &json!({"queries": a.workload.queries, "queries_from_db": a.workload.queries_from_db, "batches": a.batches, "storage_mbit": a.storage_mbit, "fragments": a.workload.fragments, "outfmt": a.outfmt, "output_bytes": out_bytes, "serial_seconds": serial, "compression": compression, "runs": rows}),
    )?;
    crate::plots::lines(&out_dir.join("cluster_wall.png"), "Wall time (s)", "emulated nodes", &series(&rows, |r| r.wall_seconds))?;
    crate::plots::lines(
        &out_dir.join("cluster_search_fraction.png"),
        "Worker time inside BLAST+ (%)",
        "emulated nodes",
        &series(&rows, |r| 100.0 * r.search_fraction),
    )?;
    crate::plots::lines(
        &out_dir.join("cluster_search_fraction_active.png"),
        "Worker time inside BLAST+, over active time (%)",
        "emulated nodes",
        &series(&rows, |r| 100.0 * r.active_search_fraction),
    )?;
    crate::plots::lines(
        &out_dir.join("cluster_agent_cpu.png"),
        "Agent CPU (% of one core per agent)",
        "emulated nodes",
        &series(&rows, |r| r.agent_cpu_percent).into_iter().filter(|(n, _)| !n.starts_with("no agent")).collect::<Vec<_>>(),
    )?;
    if let Some(c) = compression {
        crate::cluster_model::report(&rows, c, &out_dir)?;
    }
    eprintln!("bench cluster: JSON {} and plots cluster_*.png in {}", a.json.display(), out_dir.display());
    Ok(())
}

/// For each node count with both architectures measured: the most the agents could have
/// gained over mpiBLAST on this machine, mpiBLAST's wall time over the agents run's busy
/// CPU spread perfectly over the cores (a run cannot end before its CPU is spent).
fn machine_bounds(rows: &[Row], cores: usize) -> Vec<String> {
    let mut out = Vec::new();
    for r in rows.iter().filter(|r| r.variant_index != 0 && r.machine_busy_seconds > 0.0) {
        let Some(base) = rows.iter().find(|b| b.nodes == r.nodes && b.variant_index == 0) else { continue };
        let floor = r.machine_busy_seconds / cores as f64;
        out.push(format!(
            "{} node(s), {}: this machine was busy {:.1} CPU-s during the run, {:.1} s over its {cores} cores: against mpiBLAST's {:.2} s at most {:.2}× was possible here (measured {:.2}×)",
            r.nodes,
            r.variant,
            r.machine_busy_seconds,
            floor,
            base.wall_seconds,
            base.wall_seconds / floor,
            base.wall_seconds / r.wall_seconds
        ));
    }
    out
}

/// Records the workload's search in `wd/recording`: a real local run (2 workers, the
/// batch layout every replay uses), checked against the serial reference.
fn record(gepsea: &Path, wd: &Path, outfmt: &str, batch_residues: &str, blast_opts: &[String]) -> Result<()> {
    let out = wd.join("recorded.out");
    let t = Instant::now();
    run_ok(
        Command::new(gepsea)
            .args(["search", "--quiet", "--workers", "2", "--split", "fragments", "--outfmt", outfmt, "--batch-residues", batch_residues])
            .arg("--db")
            .arg(wd.join("g"))
            .arg("--query")
            .arg(wd.join("q.fasta"))
            .arg("--out")
            .arg(&out)
            .arg("--record")
            .arg(wd.join("recording"))
            .arg("--")
            .args(blast_opts),
    )?;
    if !same_output(&out, &wd.join("serial.out"))? {
        bail!("the recorded run's output differs from serial blastp");
    }
    std::fs::remove_file(&out)?;
    eprintln!("bench cluster: recorded the search in {:.1} s (2 workers, real BLAST+), identical to serial", t.elapsed().as_secs_f64());
    Ok(())
}

/// Every recorded run's duration, in seconds.
pub(crate) fn recorded_durations(recording: &Path) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(recording.join("runs"))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "json") {
            let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p)?)?;
            out.push(v["seconds"].as_f64().unwrap_or(0.0));
        }
    }
    Ok(out)
}

fn recording_summary(recording: &Path) -> Result<String> {
    let d = recorded_durations(recording)?;
    Ok(format!("{} BLAST+ runs, {:.1} s of search in all", d.len(), d.iter().sum::<f64>()))
}

fn series(rows: &[Row], y: impl Fn(&Row) -> f64) -> Vec<(String, Vec<(f64, f64)>)> {
    VARIANTS
        .iter()
        .map(|(v, _)| (v.to_string(), rows.iter().filter(|r| r.variant == *v).map(|r| (r.nodes as f64, y(r))).collect::<Vec<_>>()))
        // Only the variants that ran (a legend entry without a line says nothing).
        .filter(|(_, points)| !points.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster_model::tests::row;

    #[test]
    fn the_machine_bound_is_mpiblast_s_wall_over_the_agents_busy_cpu_per_core() {
        let mpiblast = Row { variant_index: 0, variant: "no agent (mpiBLAST)".into(), ..row(36, 60.0, 0.0, 0) };
        let agents = Row { machine_busy_seconds: 80.0, ..row(36, 45.0, 20.0, 0) };
        // Not measured (a run saved before it was kept), or no mpiBLAST run beside it.
        let unmeasured = Row { machine_busy_seconds: 0.0, ..row(8, 45.0, 20.0, 0) };
        let alone = Row { machine_busy_seconds: 10.0, ..row(4, 45.0, 20.0, 0) };
        let lines = machine_bounds(&[mpiblast, agents, unmeasured, alone], 2);
        assert_eq!(lines.len(), 1, "{lines:?}");
        // 80 CPU-s over 2 cores: 40 s at least; 60 s / 40 s = 1.5x possible, 60 / 45 measured.
        assert!(lines[0].contains("busy 80.0 CPU-s during the run, 40.0 s over its 2 cores"), "{}", lines[0]);
        assert!(lines[0].contains("at most 1.50× was possible here (measured 1.33×)"), "{}", lines[0]);
    }
}
