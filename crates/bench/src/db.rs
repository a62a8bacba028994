//! `gepsea-bench db`: `gepsea db format` against one `makeblastdb` over the same FASTA
//! (synthesised to the asked size from the example proteins: copies with new
//! identifiers), measured in the same run — wall time and peak resident memory of each
//! — and the peak memory of every gepsea process of a search whose report is large
//! against the size of that report (out-of-core output).
//!
//! Memory is sampled from `/proc/<pid>/status` (`VmHWM`, the kernel's own high-water
//! mark) of the measured process and every descendant, every 50 ms; gepsea's own
//! processes and the BLAST+ tools they run are reported apart, since the targets are
//! about gepsea's processes.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;

#[derive(clap::Args, Debug)]
pub struct DbBenchArgs {
    /// FASTA the synthetic database is made of (copies with renamed identifiers).
    #[arg(long, default_value = "/usr/share/doc/mmseqs2/example-data/DB.fasta.gz")]
    pub source: PathBuf,
    /// Size of the synthetic FASTA, in GB (10^9 bytes).
    #[arg(long, default_value_t = 1.0)]
    pub gigabytes: f64,
    #[arg(long, default_value_t = 4)]
    pub fragments: usize,
    /// Queries of the search whose report memory is measured (0: no search). On the
    /// 1 GB database 150 queries gave a 962 MB XML report (6.4 MB a query; pairwise 4.9
    /// MB), so 160 give more than 1 GB.
    #[arg(long, default_value_t = 160)]
    pub queries: usize,
    /// Format of that report.
    #[arg(long, default_value = "5")]
    pub outfmt: String,
    #[arg(long, default_value = "/usr/share/doc/mmseqs2/example-data/QUERY.fasta.gz")]
    pub query: PathBuf,
    /// Working directory (default: a temporary one, removed at the end).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Write results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Peak memory of a measured command, KiB.
#[derive(Debug, Default, Clone)]
struct Peaks {
    /// The command's own process.
    own: u64,
    /// Highest peak among descendants, by command name.
    by_name: BTreeMap<String, u64>,
    /// Highest sum of the current resident sizes of all processes at one sample.
    total: u64,
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix(field)).and_then(|v| v.split_whitespace().next()?.parse().ok())
}

fn descendants(pid: u32, out: &mut Vec<u32>) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return };
    for t in tasks.flatten() {
        if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
            for child in c.split_whitespace().filter_map(|x| x.parse().ok()) {
                out.push(child);
                descendants(child, out);
            }
        }
    }
}

/// Runs `c` to completion, sampling memory; returns (wall seconds, peaks).
fn measured(mut c: Command) -> Result<(f64, Peaks)> {
    let started = Instant::now();
    let mut child =
        c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().with_context(|| format!("starting {c:?}"))?;
    let pid = child.id();
    let stderr = child.stderr.take().expect("piped");
    let err = std::thread::spawn(move || std::io::BufReader::new(stderr).lines().map_while(|l| l.ok()).collect::<Vec<_>>().join("\n"));
    let mut peaks = Peaks::default();
    loop {
        if let Some(st) = child.try_wait()? {
            let wall = started.elapsed().as_secs_f64();
            let text = err.join().unwrap_or_default();
            if !st.success() {
                bail!("{c:?} failed ({st}): {text}");
            }
            return Ok((wall, peaks));
        }
        peaks.own = peaks.own.max(status_kib(pid, "VmHWM:").unwrap_or(0));
        let mut kids = Vec::new();
        descendants(pid, &mut kids);
        let mut total = status_kib(pid, "VmRSS:").unwrap_or(0);
        for k in kids {
            let name = std::fs::read_to_string(format!("/proc/{k}/comm")).unwrap_or_default().trim().to_string();
            let hwm = status_kib(k, "VmHWM:").unwrap_or(0);
            total += status_kib(k, "VmRSS:").unwrap_or(0);
            let e = peaks.by_name.entry(name).or_default();
            *e = (*e).max(hwm);
        }
        peaks.total = peaks.total.max(total);
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Writes copies of `source` with new unique identifiers (`synth<copy>_<n>`, the old
/// one first in the description) until
/// `bytes` are written; returns (bytes, sequences).
fn synthesise(source: &Path, out: &Path, bytes: u64) -> Result<(u64, u64)> {
    let mut text = String::new();
    std::io::Read::read_to_string(&mut gepsea_blast::fasta::open(source)?, &mut text)
        .with_context(|| format!("reading {}", source.display()))?;
    let mut w =
        std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?);
    let (mut written, mut seqs, mut copy) = (0u64, 0u64, 0u64);
    while written < bytes {
        for line in text.lines() {
            let l = match line.strip_prefix('>') {
                Some(rest) => {
                    seqs += 1;
                    // A new identifier without `|`: makeblastdb -parse_seqids would read
                    // `sp|ACC|NAME_c1` as accession ACC again.
                    format!(">synth{copy}_{seqs} {rest}\n")
                }
                None => format!("{line}\n"),
            };
            w.write_all(l.as_bytes())?;
            written += l.len() as u64;
        }
        copy += 1;
    }
    w.flush()?;
    Ok((written, seqs))
}

pub fn run(a: &DbBenchArgs) -> Result<()> {
    let exe = crate::net::sibling("gepsea")?;
    let (dir, own_dir) = match &a.dir {
        Some(d) => (d.clone(), false),
        None => (std::env::temp_dir().join(format!("gepsea-bench-db-{}", std::process::id())), true),
    };
    std::fs::create_dir_all(&dir)?;
    let result = (|| -> Result<serde_json::Value> {
        let fasta = dir.join("synthetic.fasta");
        let t = Instant::now();
        let (bytes, seqs) = synthesise(&a.source, &fasta, (a.gigabytes * 1e9) as u64)?;
        eprintln!("bench db: {:.2} GB of FASTA, {seqs} sequences, synthesised in {:.1} s", bytes as f64 / 1e9, t.elapsed().as_secs_f64());
        let refdir = dir.join("ref");
        std::fs::create_dir_all(&refdir)?;
        let mut c = Command::new("makeblastdb");
        c.args(["-dbtype", "prot", "-parse_seqids", "-title", "synthetic", "-out"]).arg(refdir.join("synthetic")).arg("-in").arg(&fasta);
        let (t_ref, p_ref) = measured(c)?;
        eprintln!("bench db: makeblastdb {t_ref:.1} s, peak RSS {:.0} MiB", mib(p_ref.own));
        let gdb = dir.join("gepsea-db");
        let mut c = Command::new(&exe);
        c.args([
            "db",
            "format",
            "--force",
            "--title",
            "synthetic",
            "--name",
            "synthetic",
            "--fragments",
            &a.fragments.to_string(),
            "--input",
        ])
        .arg(&fasta)
        .arg("--out")
        .arg(&gdb);
        let (t_g, p_g) = measured(c)?;
        let mk = p_g.by_name.get("makeblastdb").copied().unwrap_or(0);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        eprintln!(
            "bench db: gepsea db format {t_g:.1} s = {:.3}x makeblastdb (target <= 0.75; a perfect {cores}-way split: {:.3}); gepsea's peak RSS {:.0} MiB (target <= 256), each makeblastdb's {:.0} MiB, all processes together {:.0} MiB",
            t_g / t_ref,
            1.0 / cores as f64,
            mib(p_g.own),
            mib(mk),
            mib(p_g.total)
        );
        let mut search = serde_json::Value::Null;
        if a.queries > 0 {
            let q = dir.join("queries.fasta");
            let mut text = String::new();
            std::io::Read::read_to_string(&mut gepsea_blast::fasta::open(&a.query)?, &mut text)?;
            let mut n = 0;
            let picked: String = text
                .lines()
                .take_while(|l| {
                    if l.starts_with('>') {
                        n += 1;
                    }
                    n <= a.queries
                })
                .map(|l| format!("{l}\n"))
                .collect();
            std::fs::write(&q, picked)?;
            let out = dir.join("report.txt");
            // Many hits per query (the synthetic database holds every protein many
            // times), all printed: a report many times the size of the database part a
            // query needs.
            let mut c = Command::new(&exe);
            c.args(["search", "--quiet", "--workers", "2", "--outfmt", &a.outfmt, "--db"])
                .arg(&gdb)
                .arg("--query")
                .arg(&q)
                .arg("--out")
                .arg(&out);
            c.args(["--", "-num_descriptions", "20000", "-num_alignments", "20000"]);
            let (t_s, p_s) = measured(c)?;
            let report = std::fs::metadata(&out)?.len();
            let gepsea_peak = p_s.by_name.get("gepsea").copied().unwrap_or(0).max(p_s.own);
            eprintln!(
                "bench db: search of {} queries, outfmt {}: report {:.0} MB in {t_s:.1} s; peak RSS of the master {:.0} MiB, of any other gepsea process {:.0} MiB (target <= 512 for a report >= 1 GB), of blastp {:.0} MiB",
                a.queries,
                a.outfmt,
                report as f64 / 1e6,
                mib(p_s.own),
                mib(p_s.by_name.get("gepsea").copied().unwrap_or(0)),
                mib(p_s.by_name.get("blastp").copied().unwrap_or(0))
            );
            search = json!({ "queries": a.queries, "outfmt": a.outfmt, "report_bytes": report, "seconds": t_s, "master_peak_kib": p_s.own, "gepsea_peak_kib": gepsea_peak, "by_name_peak_kib": p_s.by_name });
        }
        Ok(json!({
            "fasta_bytes": bytes, "sequences": seqs, "fragments": a.fragments, "cores": cores,
            "makeblastdb_s": t_ref, "makeblastdb_peak_kib": p_ref.own,
            "gepsea_s": t_g, "ratio": t_g / t_ref, "gepsea_peak_kib": p_g.own, "makeblastdb_child_peak_kib": mk, "all_processes_peak_kib": p_g.total,
            "search": search,
        }))
    })();
    if own_dir {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let v = result?;
    if let Some(p) = &a.json {
        crate::out::json(p, &v)?;
    }
    Ok(())
}
