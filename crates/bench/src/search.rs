//! `gepsea-bench search`: wall time of `gepsea search` against serial `blastp
//! -num_threads 2` over the whole database, same queries and options, alternated in one
//! run; the median ratio, and the share of worker time spent inside BLAST+. The default
//! split (by queries, on one machine) is measured, and for comparison the split by
//! fragments (mpiBLAST's database segmentation) in the same rounds.
//!
//! Each round also times `blastp -num_threads 1` (skip with `--no-single`): half its
//! time is what a perfect two-way split of serial BLAST+'s work would take, so
//! `single / 2 / threaded` is the best ratio any exact split can reach on this machine,
//! printed beside the measured one.

use std::path::{Path, PathBuf};
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
    /// Measure the mpiBLAST architecture (no agents) instead of agent mode (it splits by
    /// fragments only).
    #[arg(long)]
    pub no_agent: bool,
    /// Skip the comparison run split by fragments.
    #[arg(long)]
    pub no_fragment_split: bool,
    /// Skip the single-threaded blastp run that bounds the best ratio a split can reach.
    #[arg(long)]
    pub no_single: bool,
    /// Also measure a split by fragments whose staged copies live under a scratch budget
    /// (`gepsea search --scratch-bytes`) of this many of the largest fragment (agent
    /// mode; 0: not measured). With fewer than `--fragments`, fragments are evicted and
    /// staged again.
    #[arg(long, default_value_t = 0)]
    pub scratch_fragments: u64,
    /// Write results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One gepsea configuration's measurements over the rounds.
#[derive(Default)]
struct Runs {
    wall: Vec<f64>,
    ratio: Vec<f64>,
    inside: Vec<f64>,
}

/// The median of `v`, leaving `v` in round order (the JSON arrays line up by round).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// Runs serial `blastp` over the whole reference database and returns its wall time.
pub(crate) fn time_blastp(
    ref_dir: &std::path::Path,
    threads: usize,
    outfmt: &str,
    query: &std::path::Path,
    out: &std::path::Path,
) -> Result<f64> {
    let t = Instant::now();
    let o = Command::new("blastp")
        .env("BLASTDB", ref_dir)
        .args(["-db", "db", "-num_threads", &threads.to_string(), "-outfmt", outfmt, "-query"])
        .arg(query)
        .arg("-out")
        .arg(out)
        .output()?;
    let secs = t.elapsed().as_secs_f64();
    if !o.status.success() {
        bail!("blastp -num_threads {threads} failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(secs)
}

/// A workload in `dir`: the reference database (`ref/db`, for serial `blastp`), the
/// same database formatted by gepsea in `fragments` (`gdb`), and the first `queries`
/// queries (`queries.fasta`).
pub(crate) struct Prepared {
    pub ref_dir: PathBuf,
    pub gdb: PathBuf,
    pub queries: PathBuf,
}

pub(crate) fn prepare(
    db: &[gepsea_blast::fasta::Record],
    queries: &[gepsea_blast::fasta::Record],
    count: usize,
    fragments: usize,
    dir: &std::path::Path,
) -> Result<Prepared> {
    let ref_dir = dir.join("ref");
    std::fs::create_dir_all(&ref_dir)?;
    let mut buf = Vec::new();
    for r in db {
        r.write_to(&mut buf);
    }
    std::fs::write(dir.join("db.fasta"), &buf)?;
    let mut qbuf = Vec::new();
    for r in queries.iter().take(count) {
        r.write_to(&mut qbuf);
    }
    let qpath = dir.join("queries.fasta");
    std::fs::write(&qpath, &qbuf)?;
    let title = "bench";
    let st = Command::new("makeblastdb")
        .args(["-in", "../db.fasta", "-dbtype", "prot", "-parse_seqids", "-title", title, "-out", "db"])
        .current_dir(&ref_dir)
        .output()?;
    if !st.status.success() {
        bail!("makeblastdb failed: {}", String::from_utf8_lossy(&st.stderr));
    }
    let gdb = dir.join("gdb");
    db::format(
        &db::FormatOptions {
            input: &dir.join("db.fasta"),
            fragments,
            out: &gdb,
            dbtype: None,
            title: Some(title.into()),
            name: Some("db".into()),
            force: true,
            jobs: 0,
            makeblastdb_args: Vec::new(),
        },
        |_| {},
    )?;
    Ok(Prepared { ref_dir, gdb, queries: qpath })
}

/// The bytes a search stages for the largest fragment of the database `gdb`.
fn largest_fragment(gdb: &Path) -> Result<u64> {
    let m = db::open(gdb)?;
    let size = |f: &gepsea_blast::db::Fragment| -> Result<u64> {
        let files = f.searched_files().map(|(n, _)| gdb.join(n));
        files.map(|p| Ok(std::fs::metadata(&p).with_context(|| format!("{}", p.display()))?.len())).sum()
    };
    m.fragments.iter().map(size).try_fold(0, |a, s| Ok(a.max(s?)))
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
    let (recs, qs) = (gepsea_blast::fasta::read(&a.db)?, gepsea_blast::fasta::read(&a.query)?);
    let Prepared { ref_dir, gdb, queries: qpath } = prepare(&recs, &qs, a.queries, a.fragments, &dir)?;
    eprintln!(
        "bench search: {} queries, {} sequences, {} fragments, {} workers, outfmt {}",
        a.queries.min(qs.len()),
        recs.len(),
        a.fragments,
        a.workers,
        a.outfmt
    );
    // (label, split, scratch budget) of each gepsea configuration measured in every round.
    let mut configs: Vec<(String, Option<search::SplitBy>, Option<u64>)> =
        vec![((if a.no_agent { "no agent, by fragments" } else { "default split" }).to_string(), None, None)];
    if !a.no_agent && !a.no_fragment_split {
        configs.push(("split by fragments".into(), Some(search::SplitBy::Fragments), None));
    }
    if !a.no_agent && a.scratch_fragments > 0 {
        let budget = a.scratch_fragments * largest_fragment(&gdb)?;
        let label = format!("split by fragments, scratch for {} fragments ({budget} bytes)", a.scratch_fragments);
        configs.push((label, Some(search::SplitBy::Fragments), Some(budget)));
    }
    let mut runs: Vec<Runs> = configs.iter().map(|_| Runs::default()).collect();
    let (mut ts, mut t1, mut perfect) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..a.rounds {
        let mut line = format!("round {}:", round + 1);
        let mut measured = Vec::new();
        for (label, split, scratch_bytes) in &configs {
            let out_g = dir.join("gepsea.out");
            let opts = search::SearchOptions {
                db: gdb.clone(),
                work_dir: None,
                fragments: None,
                // Every round searches everything.
                resume: false,
                query: qpath.clone(),
                out: out_g.clone(),
                workers: a.workers,
                outfmt: a.outfmt.clone(),
                program: None,
                batch_residues: None,
                split: *split,
                quiet: true,
                blast_args: vec![],
                worker_exe: crate::net::sibling("gepsea")?,
                no_agent: a.no_agent,
                compress: true,
                assign: Default::default(),
                hot_swap: true,
                scratch_bytes: *scratch_bytes,
                agent_cpu: None,
                deliver: None,
                ship_parts: None,
                replay: None,
            };
            let t = Instant::now();
            let s = search::run(&opts).context("gepsea search")?;
            let g = t.elapsed().as_secs_f64();
            measured.push((g, s.blast_seconds / s.worker_seconds.max(1e-9), std::fs::read(&out_g)?, s.split, s.tasks, label));
        }
        let out_s = dir.join("serial.out");
        let sr = time_blastp(&ref_dir, 2, &a.outfmt, &qpath, &out_s)?;
        let want = std::fs::read(&out_s)?;
        for (i, (g, frac, out, split, tasks, label)) in measured.into_iter().enumerate() {
            let same = out == want;
            line += &format!(
                " gepsea ({label}: {tasks} tasks by {split}) {g:.2} s, ratio {:.3}, identical {same}, in BLAST+ {:.1} %;",
                g / sr,
                frac * 100.0
            );
            if !same {
                bail!("outputs differ ({label}): the benchmark measures nothing if gepsea is not exact");
            }
            runs[i].wall.push(g);
            runs[i].ratio.push(g / sr);
            runs[i].inside.push(frac);
        }
        line += &format!(" blastp -num_threads 2 {sr:.2} s");
        ts.push(sr);
        if !a.no_single {
            let out_1 = dir.join("serial1.out");
            let s1 = time_blastp(&ref_dir, 1, &a.outfmt, &qpath, &out_1)?;
            if std::fs::read(&out_1)? != want {
                bail!("blastp -num_threads 1 and -num_threads 2 disagree: the reference is not deterministic");
            }
            let bound = s1 / a.workers as f64 / sr;
            line += &format!(", -num_threads 1 {s1:.2} s (perfect split: ratio {bound:.3})");
            t1.push(s1);
            perfect.push(bound);
        }
        eprintln!("{line}");
    }
    let ms = median(&ts);
    println!("blastp -num_threads 2 (whole database): median {ms:.2} s");
    for ((label, _, _), r) in configs.iter().zip(&runs) {
        println!(
            "gepsea search (W={}, {} fragments, {label}): median {:.2} s, ratio {:.3}, worker time inside BLAST+ {:.1} %",
            a.workers,
            a.fragments,
            median(&r.wall),
            median(&r.ratio),
            median(&r.inside) * 100.0
        );
    }
    if !t1.is_empty() {
        println!(
            "blastp -num_threads 1: median {:.2} s; a perfect {}-way split of its work: ratio {:.3} (the best an exact split can reach here)",
            median(&t1),
            a.workers,
            median(&perfect)
        );
    }
    let (mr, mi) = (median(&runs[0].ratio), median(&runs[0].inside));
    println!("median ratio gepsea / blastp: {mr:.3}   [target <= 0.9]");
    println!("worker time inside BLAST+: {:.1} %   [target >= 99 %]", mi * 100.0);
    if let Some(p) = &a.json {
        let per_config: Vec<_> = configs
            .iter()
            .zip(&runs)
            .map(|((label, _, _), r)| json!({"config": label, "gepsea_s": r.wall, "ratios": r.ratio, "inside_blast": r.inside}))
            .collect();
        let doc = json!({"configs": per_config, "blastp_s": ts, "blastp_single_s": t1, "perfect_split_ratios": perfect, "ratio_median": mr, "inside_blast_median": mi,
            "queries": a.queries, "fragments": a.fragments, "workers": a.workers, "outfmt": a.outfmt});
        crate::out::json(p, &doc)?;
    }
    Ok(())
}
