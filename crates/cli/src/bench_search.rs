//! `gepsea bench search`: wall time of `gepsea search` against serial `blastp
//! -num_threads 2` over the whole database, same queries and options, alternated in one
//! run; the median ratio, and the share of worker time spent inside BLAST+.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use gepsea_blast::{db, search};
use serde_json::json;

#[derive(clap::Args, Debug)]
pub struct SearchBenchArgs {
    /// FASTA database.
    #[arg(long, default_value = "/usr/share/doc/mmseqs2/example-data/DB.fasta.gz")]
    pub db: PathBuf,
    /// FASTA queries (the first --queries are used).
    #[arg(long, default_value = "/usr/share/doc/mmseqs2/example-data/QUERY.fasta.gz")]
    pub query: PathBuf,
    #[arg(long, default_value_t = 100)]
    pub queries: usize,
    #[arg(long, default_value_t = 4)]
    pub fragments: usize,
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Alternated rounds (gepsea, then serial, per round).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    #[arg(long, default_value = "6")]
    pub outfmt: String,
    /// Measure the mpiBLAST architecture (no agents) instead of agent mode.
    #[arg(long)]
    pub no_agent: bool,
    /// Write results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

pub fn run(a: &SearchBenchArgs) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("gepsea-bench-search-{}", std::process::id()));
    struct Rm(PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _rm = Rm(dir.clone());
    std::fs::create_dir_all(dir.join("ref"))?;
    let recs = gepsea_blast::fasta::read(&a.db)?;
    let mut buf = Vec::new();
    for r in &recs {
        r.write_to(&mut buf);
    }
    std::fs::write(dir.join("db.fasta"), &buf)?;
    let qs = gepsea_blast::fasta::read(&a.query)?;
    let mut qbuf = Vec::new();
    for r in qs.iter().take(a.queries) {
        r.write_to(&mut qbuf);
    }
    let qpath = dir.join("queries.fasta");
    std::fs::write(&qpath, &qbuf)?;
    let title = "bench";
    let st = Command::new("makeblastdb")
        .args(["-in", "../db.fasta", "-dbtype", "prot", "-parse_seqids", "-title", title, "-out", "db"])
        .current_dir(dir.join("ref"))
        .output()?;
    if !st.status.success() {
        bail!("makeblastdb failed: {}", String::from_utf8_lossy(&st.stderr));
    }
    let gdb = dir.join("gdb");
    db::format(
        &db::FormatOptions { input: &dir.join("db.fasta"), fragments: a.fragments, out: &gdb, dbtype: None, title: Some(title.into()), name: Some("db".into()), force: true },
        |_, _| {},
    )?;
    eprintln!("bench search: {} queries, {} sequences, {} fragments, {} workers, outfmt {}", a.queries.min(qs.len()), recs.len(), a.fragments, a.workers, a.outfmt);
    let (mut tg, mut ts, mut ratios, mut inside) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..a.rounds {
        let out_g = dir.join("gepsea.out");
        let opts = search::SearchOptions {
            db: gdb.clone(),
            query: qpath.clone(),
            out: out_g.clone(),
            workers: a.workers,
            outfmt: a.outfmt.clone(),
            program: None,
            batch_residues: None,
            quiet: true,
            blast_args: vec![],
            worker_exe: std::env::current_exe()?,
            no_agent: a.no_agent,
            compress: true,
            assign: Default::default(),
            hot_swap: true,
            deliver: None,
        };
        let t = Instant::now();
        let s = search::run(&opts).context("gepsea search")?;
        let g = t.elapsed().as_secs_f64();
        let out_s = dir.join("serial.out");
        let t = Instant::now();
        let o = Command::new("blastp")
            .env("BLASTDB", dir.join("ref"))
            .args(["-db", "db", "-num_threads", "2", "-outfmt", &a.outfmt, "-query"])
            .arg(&qpath)
            .arg("-out")
            .arg(&out_s)
            .output()?;
        let sr = t.elapsed().as_secs_f64();
        if !o.status.success() {
            bail!("blastp failed: {}", String::from_utf8_lossy(&o.stderr));
        }
        let same = std::fs::read(&out_g)? == std::fs::read(&out_s)?;
        let frac = s.blast_seconds / s.worker_seconds.max(1e-9);
        eprintln!("round {}: gepsea {g:.2} s, blastp -num_threads 2 {sr:.2} s, ratio {:.3}, identical {same}, worker time in BLAST+ {:.1} %", round + 1, g / sr, frac * 100.0);
        if !same {
            bail!("outputs differ: the benchmark measures nothing if gepsea is not exact");
        }
        tg.push(g);
        ts.push(sr);
        ratios.push(g / sr);
        inside.push(frac);
    }
    let (mg, ms, mr, mi) = (median(&mut tg), median(&mut ts), median(&mut ratios), median(&mut inside));
    println!("gepsea search (W={}, {} fragments): median {mg:.2} s", a.workers, a.fragments);
    println!("blastp -num_threads 2 (whole database): median {ms:.2} s");
    println!("median ratio gepsea / blastp: {mr:.3}   [target <= 0.9]");
    println!("worker time inside BLAST+: {:.1} %   [target >= 99 %]", mi * 100.0);
    if let Some(p) = &a.json {
        let doc = json!({"gepsea_s": tg, "blastp_s": ts, "ratio_median": mr, "inside_blast_median": mi,
            "queries": a.queries, "fragments": a.fragments, "workers": a.workers, "outfmt": a.outfmt});
        let tmp = p.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(&doc)?)?;
        std::fs::rename(&tmp, p)?;
    }
    Ok(())
}
