//! `gepsea-bench soak` (`make soak`): a bounded chaos soak. Round after round, one
//! search runs under `mpirun` on 3 namespace nodes (6 processes, agents keyed, as in
//! production; in odd rounds their links also encrypted), and at a random moment one
//! fault is injected:
//!
//! - `master`: SIGKILL of rank 0 (the launcher then aborts the job);
//! - `walltime`: SIGTERM of rank 0, as a batch system's time limit sends it;
//! - `worker`: SIGKILL of another rank;
//! - `agent`: SIGKILL of the agent of a node without the master (its node's leader
//!   starts it again, it rejoins, the job goes on);
//! - `link`: every TCP connection of the agents of one node cut (`ss -K`).
//!
//! A run that fails is run again, as a user would rerun the same command (resume reuses
//! the finished parts), up to `--reruns` times. Every finished output is compared with
//! serial BLAST+; after every round nothing may be left: no process in the nodes'
//! namespaces, no runtime directory, shared-memory or temporary file of the round's
//! namespace, no work directory or temporary output next to the output. The seed makes
//! a soak repeatable (the faults' kinds and moments; the machine's timing is not).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gepsea_net::testbed::NetnsBridge;
use serde::Serialize;

use crate::workload::{run_ok, same_output, TempDir, Workload};

#[derive(clap::Args, Debug)]
pub struct SoakArgs {
    /// Rounds (one search and one fault each).
    #[arg(long, default_value_t = 50)]
    rounds: usize,
    /// Seed of the faults' kinds and moments.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Reruns allowed after a failed run, per round.
    #[arg(long, default_value_t = 3)]
    reruns: usize,
    /// A run that takes longer than this (seconds) counts as hung.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    #[command(flatten)]
    work: Workload,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

const FAULTS: [&str; 5] = ["master", "walltime", "worker", "agent", "link"];

#[derive(Serialize, Debug)]
struct Round {
    round: usize,
    fault: &'static str,
    /// When the fault was injected, seconds after the launch.
    at: f64,
    /// Whether the fault found its target (the run may have finished before).
    injected: bool,
    /// Runs it took (1: the faulted run finished by itself).
    runs: usize,
    identical: bool,
    seconds: f64,
    leaks: Vec<String>,
    /// Why each failed run failed (the faulted run's failure is expected).
    failures: Vec<String>,
    error: Option<String>,
}

/// xorshift64*: enough for choosing faults, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub fn run(a: &SoakArgs) -> Result<()> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the soak builds network namespaces: run it as root");
    }
    let gepsea = crate::net::sibling("gepsea")?;
    let dir = TempDir(std::env::temp_dir().join(format!("gepsea-soak-{}", std::process::id())));
    let d = &dir.0;
    std::fs::create_dir_all(d)?;
    eprintln!("soak: preparing {} queries, {} fragments", a.work.queries, a.work.fragments);
    a.work.prepare(&gepsea, d)?;
    let refdir = Workload::reference_db(d)?;
    let want = d.join("serial.6");
    run_ok(
        Command::new("blastp")
            .env("BLASTDB", &refdir)
            .args(["-db", "DB", "-outfmt", "6", "-query"])
            .arg(d.join("q.fasta"))
            .arg("-out")
            .arg(&want),
    )?;
    let bed = NetnsBridge::new("sk", 3).context("building the testbed")?;
    let mut rng = Rng(a.seed.max(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);

    // A clean run first: its time spreads the faults over a search's whole life.
    let out = d.join("out.6");
    let started = Instant::now();
    let clean = launch(&bed, d, &gepsea, &out, false)?.wait_with_output()?;
    if !clean.status.success() || !same_output(&out, &want)? {
        bail!("the clean run failed or differs from serial BLAST+: {}", String::from_utf8_lossy(&clean.stderr));
    }
    let clean_s = started.elapsed().as_secs_f64();
    std::fs::remove_file(&out)?;
    eprintln!("soak: clean run {clean_s:.1} s; {} rounds, seed {}", a.rounds, a.seed);

    let mut rounds = Vec::new();
    for round in 0..a.rounds {
        let fault = FAULTS[rng.below(FAULTS.len() as u64) as usize];
        let at = 0.2 + (rng.below(1000) as f64 / 1000.0) * clean_s * 0.9;
        let victim = rng.next();
        let r = one_round(a, &bed, d, &gepsea, &want, round, fault, at, victim);
        eprintln!(
            "soak: round {round:3} {fault:8} at {:5.2} s: {} run(s), {}{}{}",
            r.at,
            r.runs,
            if r.identical { "identical" } else { "NOT IDENTICAL" },
            if r.injected { "" } else { " (finished before the fault)" },
            r.error.as_ref().map(|e| format!(", error: {e}")).unwrap_or_default()
        );
        for f in r.failures.iter().skip(usize::from(r.injected)) {
            eprintln!("soak:   unexpected failure: {f}");
        }
        for l in &r.leaks {
            eprintln!("soak:   left behind: {l}");
        }
        rounds.push(r);
    }
    let injected = rounds.iter().filter(|r| r.injected).count();
    let identical = rounds.iter().filter(|r| r.identical).count();
    let leaks: usize = rounds.iter().map(|r| r.leaks.len()).sum();
    let reruns: usize = rounds.iter().map(|r| r.runs - 1).sum();
    let kinds: Vec<(&str, usize)> = FAULTS.iter().map(|f| (*f, rounds.iter().filter(|r| r.injected && r.fault == *f).count())).collect();
    println!(
        "soak: {} rounds, {injected} faults injected ({}), {reruns} reruns, {identical}/{} outputs identical to serial BLAST+, {leaks} leaks",
        rounds.len(),
        kinds.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", "),
        rounds.len()
    );
    if let Some(p) = &a.json {
        let report = serde_json::json!({ "seed": a.seed, "clean_seconds": clean_s, "rounds": rounds });
        crate::out::json(p, &report)?;
    }
    let passed = rounds.iter().filter(|r| r.identical && r.leaks.is_empty()).count();
    println!("soak: {passed} passed, {} failed", rounds.len() - passed);
    if passed < rounds.len() {
        bail!("the soak found rounds that differ, failed or leaked (see above)");
    }
    Ok(())
}

/// One launch of the search; `encrypt`: the agents' links encrypted (odd rounds).
fn launch(bed: &NetnsBridge, d: &Path, gepsea: &Path, out: &Path, encrypt: bool) -> Result<Child> {
    let mut c = bed.mpirun(d, &[2, 2, 2], 6)?;
    c.args(["--map-by", "slot"]).arg(gepsea).args(["-q", "search", "--outfmt", "6", "--batch-residues", "1500", "--db"]);
    c.arg(d.join("g")).arg("--query").arg(d.join("q.fasta")).arg("--out").arg(out).args(["--agent-net", &bed.subnet()]);
    c.args(encrypt.then_some("--encrypt-links"));
    Ok(c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?)
}

#[allow(clippy::too_many_arguments)]
fn one_round(
    a: &SoakArgs,
    bed: &NetnsBridge,
    d: &Path,
    gepsea: &Path,
    want: &Path,
    round: usize,
    fault: &'static str,
    at: f64,
    victim: u64,
) -> Round {
    let out = d.join("out.6");
    let started = Instant::now();
    let mut r = Round {
        round,
        fault,
        at,
        injected: false,
        runs: 0,
        identical: false,
        seconds: 0.0,
        leaks: Vec::new(),
        failures: Vec::new(),
        error: None,
    };
    let mut ok = false;
    while r.runs <= a.reruns && !ok {
        r.runs += 1;
        let child = match launch(bed, d, gepsea, &out, round % 2 == 1) {
            Ok(c) => c,
            Err(e) => {
                r.error = Some(e.to_string());
                break;
            }
        };
        let pid = child.id();
        let waiter = std::thread::spawn(move || child.wait_with_output());
        if r.runs == 1 {
            let t0 = Instant::now();
            while t0.elapsed().as_secs_f64() < at && !waiter.is_finished() {
                std::thread::sleep(Duration::from_millis(20));
            }
            if !waiter.is_finished() {
                r.injected = inject(bed, fault, victim);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(a.timeout);
        while !waiter.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if !waiter.is_finished() {
            r.error = Some(format!("run {} hung for {} s", r.runs, a.timeout));
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            for i in 0..3 {
                bed.kill_all(i);
            }
        }
        match waiter.join() {
            Ok(Ok(o)) if o.status.success() => ok = true,
            Ok(Ok(o)) => {
                // Expected after most faults: the next run resumes.
                let text = String::from_utf8_lossy(&o.stderr);
                let why = text.lines().find(|l| l.contains("error") || l.contains("gepsea")).unwrap_or("failed").trim().to_string();
                r.failures.push(format!("run {}: {} ({why})", r.runs, o.status));
            }
            Ok(Err(e)) => r.error = Some(e.to_string()),
            Err(_) => r.error = Some("the waiter panicked".into()),
        }
    }
    r.seconds = started.elapsed().as_secs_f64();
    r.identical = ok && same_output(&out, want).unwrap_or(false);
    if ok {
        r.error = None;
    }
    // Whatever a failed last run left is cleaned here, but reported first.
    r.leaks = leaks(bed, d, &out);
    for i in 0..3 {
        bed.kill_all(i);
    }
    let _ = std::fs::remove_file(&out);
    r
}

/// Every process in the nodes' namespaces: (node, pid, command line, MPI rank).
fn processes(bed: &NetnsBridge) -> Vec<(usize, u32, String, Option<u32>)> {
    (0..bed.ns.len())
        .flat_map(|i| {
            let pids = Command::new("ip").args(["netns", "pids", &bed.ns[i]]).output().map(|o| o.stdout).unwrap_or_default();
            String::from_utf8_lossy(&pids)
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .map(|pid| {
                    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
                    let rank = env
                        .split(|&b| b == 0)
                        .find_map(|kv| kv.strip_prefix(b"OMPI_COMM_WORLD_RANK="))
                        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok());
                    (i, pid, String::from_utf8_lossy(&cmd).replace('\0', " "), rank)
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Injects `fault`; false if its target was not found (the run ended meanwhile).
fn inject(bed: &NetnsBridge, fault: &str, victim: u64) -> bool {
    let procs = processes(bed);
    let searches = |p: &&(usize, u32, String, Option<u32>)| p.2.contains(" search ") && p.3.is_some();
    let kill = |sig: &str, pid: u32| Command::new("kill").args([sig, &pid.to_string()]).status().is_ok_and(|s| s.success());
    match fault {
        "master" | "walltime" => {
            let sig = if fault == "master" { "-KILL" } else { "-TERM" };
            procs.iter().filter(searches).find(|p| p.3 == Some(0)).is_some_and(|p| kill(sig, p.1))
        }
        "worker" => {
            let workers: Vec<_> = procs.iter().filter(searches).filter(|p| p.3 != Some(0)).collect();
            !workers.is_empty() && kill("-KILL", workers[(victim % workers.len() as u64) as usize].1)
        }
        "agent" | "link" => {
            let master_node = procs.iter().filter(searches).find(|p| p.3 == Some(0)).map(|p| p.0);
            let agents: Vec<_> = procs.iter().filter(|p| p.2.contains(" agent --namespace ") && Some(p.0) != master_node).collect();
            if agents.is_empty() {
                return false;
            }
            let a = agents[(victim % agents.len() as u64) as usize];
            if fault == "agent" {
                return kill("-KILL", a.1);
            }
            // Every TCP connection of the agents' listening ports in that node.
            let ports: Vec<String> = procs
                .iter()
                .filter(|p| p.2.contains(" agent --namespace "))
                .filter_map(|p| p.2.split_whitespace().skip_while(|w| *w != "--listen").nth(1).map(str::to_string))
                .filter_map(|l| listening_port(bed, l))
                .collect();
            let mut filter = String::new();
            for p in &ports {
                if !filter.is_empty() {
                    filter.push_str(" or ");
                }
                filter.push_str(&format!("sport = :{p} or dport = :{p}"));
            }
            !ports.is_empty()
                && bed.cmd(a.0, "ss").args(["-K", "-t", &format!("( {filter} )")]).stdout(Stdio::null()).status().is_ok_and(|s| s.success())
        }
        _ => false,
    }
}

/// The port an agent listening on `listen` (`IP:0` picks one) actually has.
fn listening_port(bed: &NetnsBridge, listen: String) -> Option<String> {
    let (ip, port) = listen.rsplit_once(':')?;
    if port != "0" {
        return Some(port.to_string());
    }
    let node = bed.ip.iter().position(|i| i == ip)?;
    let o = bed.cmd(node, "ss").args(["-ltnpH"]).output().ok()?;
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains("gepsea"))
        .filter_map(|l| l.split_whitespace().nth(3)?.rsplit_once(':').map(|(_, p)| p.to_string()))
        .next()
}

/// What a round left behind: processes in the nodes, files of its namespace in /tmp,
/// /dev/shm and the runtime directories, anything but inputs and output next to it.
fn leaks(bed: &NetnsBridge, d: &Path, out: &Path) -> Vec<String> {
    let mut left: Vec<String> =
        processes(bed).into_iter().map(|(i, pid, cmd, _)| format!("node {i}: process {pid} {}", cmd.trim())).collect();
    let ns = gepsea_blast::cluster::namespace(out);
    if gepsea_net::namespace_dir(&ns).exists() {
        left.push(format!("runtime directory {}", gepsea_net::namespace_dir(&ns).display()));
    }
    for dir in ["/tmp", "/dev/shm"] {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.contains(&ns) {
                left.push(format!("{dir}/{n}"));
            }
        }
    }
    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with('.') || (n.contains("gepsea") && !n.ends_with(".fasta")) {
            left.push(format!("{}/{n}", d.display()));
        }
    }
    left
}
