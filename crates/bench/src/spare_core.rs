//! `gepsea-bench spare-core`: the GePSeA paper's spare-core experiments (Figs. 8 and
//! 10) on this machine's real cores. The paper gave the accelerator one core of four
//! (3 workers + agent against 4 workers without one); here there are two, so:
//!
//! - **2 workers, no agent** (mpiBLAST): both cores search, the master merges;
//! - **1 worker + agent on a spare core**: the master and its worker on core 0, the
//!   agent pinned to core 1 (`gepsea search --agent-cpu 1`);
//! - **2 workers + agent sharing their cores**: the agent on an oversubscribed core,
//!   as the paper's other set-up;
//! - **1 worker, no agent, one core**: what giving a core up costs without an agent.
//!
//! Real BLAST+ searches (not replayed), split by fragments, pairwise output (the
//! result-heavy format), alternated in rounds; every output is checked against serial
//! `blastp`. Ratios are against the first configuration, measured in the same round.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::search::{median, prepare, time_blastp, Prepared};

#[derive(clap::Args, Debug)]
pub struct SpareCoreArgs {
    /// FASTA database.
    #[arg(long, default_value = "/usr/share/doc/mmseqs2/example-data/DB.fasta.gz")]
    pub db: PathBuf,
    /// FASTA queries (the first --queries are used).
    #[arg(long, default_value = "/usr/share/doc/mmseqs2/example-data/QUERY.fasta.gz")]
    pub query: PathBuf,
    #[arg(long, default_value_t = 200)]
    pub queries: usize,
    #[arg(long, default_value_t = 4)]
    pub fragments: usize,
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    #[arg(long, default_value = "0")]
    pub outfmt: String,
    /// Write results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// (label, cores the search is confined to, `gepsea search` options).
const CONFIGS: [(&str, &str, &[&str]); 4] = [
    ("2 workers, no agent", "0,1", &["--no-agent", "--workers", "2"]),
    ("1 worker + agent on a spare core", "0", &["--workers", "1", "--agent-cpu", "1"]),
    ("2 workers + agent sharing their cores", "0,1", &["--workers", "2"]),
    ("1 worker, no agent, one core", "0", &["--no-agent", "--workers", "1"]),
];

pub fn run(a: &SpareCoreArgs) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 {
        bail!("bench spare-core needs 2 cores (this machine has {cores})");
    }
    let dir = crate::workload::TempDir(std::env::temp_dir().join(format!("gepsea-bench-spare-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0)?;
    let d = &dir.0;
    let (recs, qs) = (gepsea_blast::fasta::read(&a.db)?, gepsea_blast::fasta::read(&a.query)?);
    let Prepared { ref_dir, gdb, queries } = prepare(&recs, &qs, a.queries, a.fragments, d)?;
    let serial_out = d.join("serial.out");
    let serial = time_blastp(&ref_dir, 2, &a.outfmt, &queries, &serial_out)?;
    let want = std::fs::read(&serial_out)?;
    let gepsea = crate::net::sibling("gepsea")?;
    eprintln!(
        "bench spare-core: {} queries, {} fragments, outfmt {} ({:.1} MB of output); serial blastp -num_threads 2 {serial:.2} s",
        a.queries.min(qs.len()),
        a.fragments,
        a.outfmt,
        want.len() as f64 / 1e6
    );
    let mut walls: Vec<Vec<f64>> = vec![Vec::new(); CONFIGS.len()];
    let mut inside: Vec<Vec<f64>> = vec![Vec::new(); CONFIGS.len()];
    for round in 0..a.rounds.max(1) {
        let mut line = format!("round {}:", round + 1);
        for (i, (label, cpus, opts)) in CONFIGS.iter().enumerate() {
            let (wall, share) =
                search_once(&gepsea, cpus, opts, &gdb, &queries, &a.outfmt, d, &want).with_context(|| format!("{label}: gepsea search"))?;
            walls[i].push(wall);
            inside[i].push(share);
            line += &format!(" {label} {wall:.2} s;");
        }
        eprintln!("{line}");
    }
    let base = median(&walls[0]);
    println!("\n| set-up | cores | wall s (median) | vs 2 workers, no agent | workers' time in BLAST+ |");
    println!("|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (i, (label, cpus, _)) in CONFIGS.iter().enumerate() {
        let m = median(&walls[i]);
        println!("| {label} | {cpus} | {m:.2} | {:.2}× | {:.1} % |", base / m, 100.0 * median(&inside[i]));
        rows.push(json!({"config": label, "cpus": cpus, "wall_s": walls[i], "inside_blast": inside[i], "speedup_vs_no_agent": base / m}));
    }
    println!("\nserial blastp -num_threads 2 (reference): {serial:.2} s; every output identical to it");
    if let Some(p) = &a.json {
        let doc = json!({"queries": a.queries, "fragments": a.fragments, "outfmt": a.outfmt, "serial_s": serial, "configs": rows});
        crate::out::json(p, &doc)?;
    }
    Ok(())
}

/// One `gepsea search` confined to `cpus` (`taskset`; the agent pins itself with
/// `--agent-cpu`), checked against `want`: its wall time and the workers' share of
/// time inside BLAST+.
#[allow(clippy::too_many_arguments)]
fn search_once(
    gepsea: &Path,
    cpus: &str,
    opts: &[&str],
    db: &Path,
    queries: &Path,
    outfmt: &str,
    d: &Path,
    want: &[u8],
) -> Result<(f64, f64)> {
    let out = d.join("gepsea.out");
    let summary = d.join("summary.json");
    let t = Instant::now();
    let o = Command::new("taskset")
        .args(["-c", cpus])
        .arg(gepsea)
        .args(["search", "--quiet", "--split", "fragments", "--outfmt", outfmt, "--db"])
        .arg(db)
        .arg("--query")
        .arg(queries)
        .arg("--out")
        .arg(&out)
        .arg("--summary-json")
        .arg(&summary)
        .args(opts)
        .output()
        .context("running taskset (util-linux)")?;
    let wall = t.elapsed().as_secs_f64();
    if !o.status.success() {
        bail!("{}", String::from_utf8_lossy(&o.stderr).trim());
    }
    if std::fs::read(&out)? != want {
        bail!("the output differs from serial blastp: the benchmark measures nothing if gepsea is not exact");
    }
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&summary)?)?;
    let share = s["blast_seconds"].as_f64().unwrap_or(0.0) / s["worker_seconds"].as_f64().unwrap_or(1.0).max(1e-9);
    let _ = std::fs::remove_file(&out);
    Ok((wall, share))
}
