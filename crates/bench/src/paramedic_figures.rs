//! `gepsea-bench paramedic-figures`: the ParaMEDIC paper's figures from the JSON files
//! that runs of `gepsea-bench paramedic` wrote, each as a PNG with its table (Markdown,
//! on stdout, for `docs/benchmarks.md`).
//!
//! A sweep is several bench runs that differ in one setting (the query set, BLAST+'s
//! `-max_target_seqs`, the storage site's CPU shares); each run measures its own
//! reference search and checks every output byte for byte, so the figures only gather
//! and draw. Which numbers are measured and which are modelled is said on each figure:
//! two things here are models, labelled so on their figures: the break-even curve (the
//! time each way of shipping would take after the search, from costs measured in the
//! run), and the overlap model ([`Overlap`]), calibrated on the large run, checked
//! against every measured point, and used to say what compute and storage sites the
//! paper's speed-ups need.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::paramedic::median;
use crate::plots::{Series, Series1};

#[derive(clap::Args, Debug)]
pub struct FiguresArgs {
    /// One run of the large workload: the time breakdown (paper Fig. 7), end-to-end
    /// time against rate and delay, and the break-even curve.
    #[arg(long, value_name = "JSON")]
    pub breakdown: Option<PathBuf>,
    /// The link (Mbit/s, one-way delay ms) whose runs the breakdown and sweeps show.
    #[arg(long, value_delimiter = ',', default_value = "100,100")]
    pub link: Vec<f64>,
    /// Runs over growing query sets (Fig. 9a, and encrypted vs remote FS, Figs. 10–13).
    #[arg(long, value_delimiter = ',', value_name = "JSON")]
    pub queries_sweep: Vec<PathBuf>,
    /// Runs with different `-max_target_seqs` (Fig. 9b).
    #[arg(long, value_delimiter = ',', value_name = "JSON")]
    pub targets_sweep: Vec<PathBuf>,
    /// Runs with different storage-site CPU shares (the split of cores between search
    /// and regeneration, Fig. 8).
    #[arg(long, value_delimiter = ',', value_name = "JSON")]
    pub shares_sweep: Vec<PathBuf>,
    /// Where the PNGs go.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
}

/// The setting a sweep varies, read from each of its runs.
type SweptSetting = fn(&Bench) -> f64;

/// What a `gepsea-bench paramedic` JSON holds that the figures use.
#[derive(Deserialize, Debug)]
struct Bench {
    queries: usize,
    #[serde(default)]
    queries_from_db: usize,
    output_bytes: u64,
    reference_search_seconds: f64,
    #[serde(default)]
    blast_args: Vec<String>,
    #[serde(default)]
    storage_cpu_shares: Option<u64>,
    #[serde(default)]
    compute_nodes: usize,
    runs: Vec<Run>,
}

#[derive(Deserialize, Debug, Clone)]
struct Run {
    rate_mbit: u32,
    delay_ms: f64,
    variant: String,
    complete_seconds: f64,
    search_seconds: f64,
    storage_seconds: Option<f64>,
    encode_seconds: Option<f64>,
    shipped_bytes: Option<u64>,
    #[serde(default)]
    objects: Option<u64>,
    #[serde(default)]
    rtt_ms: f64,
    compute_cpu_seconds: f64,
    storage_cpu_seconds: f64,
}

fn load(path: &Path) -> Result<Bench> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not a `gepsea-bench paramedic` JSON", path.display()))
}

impl Bench {
    fn total_queries(&self) -> usize {
        self.queries + self.queries_from_db
    }

    /// BLAST+'s `-max_target_seqs` in this run (500, its default for pairwise output,
    /// when not given).
    fn max_target_seqs(&self) -> f64 {
        self.blast_args.windows(2).find(|w| w[0] == "-max_target_seqs").and_then(|w| w[1].parse().ok()).unwrap_or(500.0)
    }

    fn at(&self, rate: u32, delay: f64) -> impl Iterator<Item = &Run> {
        self.runs.iter().filter(move |r| r.rate_mbit == rate && r.delay_ms == delay)
    }
}

pub fn run(a: &FiguresArgs) -> Result<()> {
    let [rate, delay] = a.link[..] else { bail!("--link takes two numbers: Mbit/s and one-way delay in ms (e.g. 100,100)") };
    let rate = rate as u32;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    if let Some(p) = &a.breakdown {
        let b = load(p)?;
        breakdown(a, &b, rate, delay)?;
        against_link(a, &b)?;
        break_even(a, &b)?;
        overlap_model(a, &b, rate, delay)?;
    }
    let sweeps: [(&[PathBuf], &str, &str, SweptSetting); 3] = [
        (&a.queries_sweep, "queries", "queries", |b| b.total_queries() as f64),
        (&a.targets_sweep, "max_target_seqs", "BLAST+ -max_target_seqs", Bench::max_target_seqs),
        (&a.shares_sweep, "storage_shares", "storage site's CPU shares (the search's: 1024 per process)", |b| {
            b.storage_cpu_shares.unwrap_or(256) as f64
        }),
    ];
    for (files, name, x_label, x_of) in sweeps {
        if !files.is_empty() {
            let benches = files.iter().map(|f| load(f)).collect::<Result<Vec<_>>>()?;
            sweep(a, &benches, rate, delay, name, x_label, x_of)?;
        }
    }
    Ok(())
}

/// Fig. 7: per variant, the time of each stage, stacked, and the end-to-end time (with
/// overlap the stages run at once, so the stack is taller than the end-to-end time).
/// Shipping is shown as its parts' encoding and its bytes' time on the link: the
/// measured transfer times also hold each part's wait for the storage site's queue.
fn breakdown(a: &FiguresArgs, b: &Bench, rate: u32, delay: f64) -> Result<()> {
    let runs: Vec<&Run> = b.at(rate, delay).collect();
    if runs.is_empty() {
        bail!("--breakdown has no runs at {rate} Mbit/s, {delay} ms (--link)");
    }
    println!(
        "\n### Time breakdown, {rate} Mbit/s, {delay} ms one way ({} queries, {:.1} MB of output)\n",
        b.total_queries(),
        b.output_bytes as f64 / 1e6
    );
    println!("The search alone (the reference run, shipping nothing): {:.1} s.\n", b.reference_search_seconds);
    println!("| variant | search s (until the last part was acknowledged) | encoding s (summed over parts) | on the link s (bytes ÷ rate) | storage site busy s (summed) | output complete s | bytes shipped | CPU s compute / storage |");
    println!("|---|---|---|---|---|---|---|---|");
    // A remote file system ships the output itself (its run counts no objects).
    let on_link = |r: &Run| r.shipped_bytes.unwrap_or(b.output_bytes) as f64 * 8.0 / 1e6 / r.rate_mbit as f64;
    for r in &runs {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {:.1} / {:.1} |",
            r.variant,
            r.search_seconds,
            r.encode_seconds.unwrap_or(0.0),
            on_link(r),
            r.storage_seconds.unwrap_or(0.0),
            r.complete_seconds,
            r.shipped_bytes.map_or("-".into(), |b| b.to_string()),
            r.compute_cpu_seconds,
            r.storage_cpu_seconds
        );
    }
    let names: Vec<String> = runs.iter().map(|r| r.variant.clone()).collect();
    let layer = |name: &str, f: &dyn Fn(&Run) -> f64| (name.to_string(), runs.iter().map(|r| f(r)).collect::<Vec<f64>>());
    let layers: Vec<Series1> = vec![
        layer("search alone (the reference run)", &|_| b.reference_search_seconds),
        layer("encoding (summed over parts)", &|r| r.encode_seconds.unwrap_or(0.0)),
        layer("on the link (bytes / rate)", &on_link),
        layer("storage site busy (summed over parts)", &|r| r.storage_seconds.unwrap_or(0.0)),
    ];
    let mark = layer("output complete at the storage site", &|r| r.complete_seconds);
    crate::plots::stacked_bars(
        &a.out.join("paramedic_breakdown.png"),
        &format!("Work per stage and end to end (s), {rate} Mbit/s, {delay} ms"),
        &names,
        &layers,
        Some(&mark),
    )
}

/// The variants' end-to-end times against the link's rate (one plot per delay).
fn against_link(a: &FiguresArgs, b: &Bench) -> Result<()> {
    let delays: Vec<f64> = dedup(b.runs.iter().map(|r| r.delay_ms));
    for delay in delays {
        let mut by_variant: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
        for r in b.runs.iter().filter(|r| r.delay_ms == delay) {
            by_variant.entry(&r.variant).or_default().push((r.rate_mbit as f64, r.complete_seconds));
        }
        let series: Vec<Series> = by_variant
            .into_iter()
            .map(|(v, mut p)| {
                p.sort_by(|x, y| x.0.total_cmp(&y.0));
                (v.to_string(), p)
            })
            .collect();
        if series.iter().all(|(_, p)| p.len() < 2) {
            continue;
        }
        crate::plots::lines_log_x(
            &a.out.join(format!("paramedic_rate_{delay}ms.png")),
            &format!("Launch to output complete at the storage site (s), {delay} ms one way"),
            "link rate (Mbit/s, log scale)",
            &series,
        )?;
    }
    Ok(())
}

/// The break-even curve (modelled from the run's measured costs): the time each way
/// of shipping needs to deliver the whole output after the search, without overlap,
/// against the link's rate: D/B for the output, x/B + f + g for zstd and ParaMEDIC.
fn break_even(a: &FiguresArgs, b: &Bench) -> Result<()> {
    let cost = |variant: &str| -> Option<(f64, f64)> {
        let runs: Vec<&Run> = b.runs.iter().filter(|r| r.variant == variant).collect();
        let bytes = median(runs.iter().filter_map(|r| r.shipped_bytes.map(|x| x as f64)).collect());
        let work = median(runs.iter().filter_map(|r| Some(r.encode_seconds? + r.storage_seconds?)).collect());
        (bytes.is_finite() && work.is_finite()).then_some((bytes, work))
    };
    let mut models: Vec<(String, f64, f64)> = vec![("output".into(), b.output_bytes as f64, 0.0)];
    for (name, variant) in [("zstd -3", "zstd -3"), ("ParaMEDIC", "ParaMEDIC, encrypted"), ("ParaMEDIC", "ParaMEDIC")] {
        if models.iter().any(|m| m.0 == name) {
            continue;
        }
        if let Some((x, w)) = cost(variant) {
            models.push((name.into(), x, w));
        }
    }
    if models.len() < 2 {
        return Ok(());
    }
    let rates: Vec<f64> = (0..=30).map(|i| 10f64.powf(i as f64 / 10.0)).collect();
    let series: Vec<Series> = models
        .iter()
        .map(|(name, bytes, work)| {
            let curve = rates.iter().map(|&r| (r, delivery_seconds(*bytes, *work, r))).collect();
            (format!("{name}: {:.1} MB + {work:.0} s of work", bytes / 1e6), curve)
        })
        .collect();
    println!("\n### Break-even (modelled from the measured bytes and work; no overlap)\n");
    println!("| shipping | bytes | encode + storage-site work s | faster than the output below |");
    println!("|---|---|---|---|");
    for (name, bytes, work) in &models {
        let below = break_even_mbit(b.output_bytes as f64, *bytes, *work).map_or("-".into(), |r| format!("{r:.1} Mbit/s"));
        println!("| {name} | {bytes:.0} | {work:.1} | {below} |");
    }
    crate::plots::lines_log_x(
        &a.out.join("paramedic_break_even.png"),
        "Delivering the whole output after the search (s, modelled)",
        "link rate (Mbit/s, log scale)",
        &series,
    )
}

/// Seconds to send `bytes` at `mbit` Mbit/s and do `work` seconds of encoding and
/// regeneration, one after the other (no overlap).
fn delivery_seconds(bytes: f64, work: f64, mbit: f64) -> f64 {
    bytes * 8.0 / 1e6 / mbit + work
}

/// The link rate (Mbit/s) below which shipping `bytes` with `work` seconds of work
/// beats shipping the `output_bytes` themselves: (D − x)·8 / (f + g); none without work.
fn break_even_mbit(output_bytes: f64, bytes: f64, work: f64) -> Option<f64> {
    (work > 0.0).then(|| (output_bytes - bytes) * 8.0 / 1e6 / work)
}

/// The overlap model of one way of shipping, calibrated on a measured run: with parts
/// shipped as they are final, the search, the link and the storage site work at once,
/// so the end-to-end time is the slowest of the three plus what the last part still
/// needs after it (its share of the link and of the storage site, and a few round
/// trips for its connection, rendezvous and acknowledgement).
#[derive(Clone, Copy, Debug)]
struct Overlap {
    /// Bytes on the link.
    bytes: f64,
    /// The storage site's CPU seconds (receiving, checking, regenerating, writing).
    storage_cpu: f64,
    /// The storage site's busy seconds, summed over objects (it stores one at a time).
    storage_busy: f64,
    /// Objects shipped.
    parts: f64,
    /// Seconds per round trip.
    rtt: f64,
}

impl Overlap {
    fn of(r: &Run) -> Option<Overlap> {
        Some(Overlap {
            bytes: r.shipped_bytes? as f64,
            storage_cpu: r.storage_cpu_seconds,
            storage_busy: r.storage_seconds.unwrap_or(0.0),
            parts: r.objects?.max(1) as f64,
            rtt: r.rtt_ms / 1e3,
        })
    }

    /// Seconds from launch to the output complete at the storage site, for a search of
    /// `search` seconds, a link of `mbit` Mbit/s and a storage site of `cores` cores.
    /// `as_built`: the storage site stores one object at a time, as now (it cannot be
    /// faster than its measured busy time); otherwise it is assumed to spread objects
    /// over all its cores (not built yet: `docs/paramedic.md`, left alone).
    fn predict(&self, search: f64, mbit: f64, cores: f64, as_built: bool) -> f64 {
        let link = self.bytes * 8.0 / 1e6 / mbit;
        let spread = self.storage_cpu / cores;
        let storage = if as_built { spread.max(self.storage_busy) } else { spread };
        search.max(link).max(storage) + (link + storage) / self.parts + 4.0 * self.rtt
    }
}

/// The overlap model (modelled): checked against every run of the large workload (the
/// storage site had this machine's 2 cores, which the replayed compute site leaves
/// nearly idle), then ParaMEDIC's speed-up at the `--link` rate for larger compute
/// sites (the replayed search scaled by nodes) and storage sites of more cores.
fn overlap_model(a: &FiguresArgs, b: &Bench, rate: u32, delay: f64) -> Result<()> {
    const CORES_HERE: f64 = 2.0;
    println!("\n### Overlap model against the measured runs (modelled vs measured)\n");
    println!("| link | variant | measured s | modelled s | error |");
    println!("|---|---|---|---|---|");
    for r in &b.runs {
        if let Some(m) = Overlap::of(r) {
            let p = m.predict(b.reference_search_seconds, r.rate_mbit as f64, CORES_HERE, true);
            println!(
                "| {} Mbit/s, {} ms | {} | {:.1} | {p:.1} | {:+.1} % |",
                r.rate_mbit,
                r.delay_ms,
                r.variant,
                r.complete_seconds,
                (p / r.complete_seconds - 1.0) * 100.0
            );
        }
    }
    let model = |variant: &str| b.at(rate, delay).find(|r| r.variant == variant).and_then(Overlap::of);
    let (Some(pm), Some(direct)) = (model("ParaMEDIC, encrypted"), model("direct, encrypted")) else {
        return Ok(());
    };
    let zstd = model("zstd -3");
    let nodes_here = b.compute_nodes.max(1) as f64;
    let cores: Vec<f64> = (0..=7).map(|i| f64::from(1u32 << i)).collect();
    let mut series: Vec<Series> = Vec::new();
    println!(
        "\n### ParaMEDIC, encrypted: modelled speed-up at {rate} Mbit/s, {delay} ms, objects regenerated concurrently on every core\n"
    );
    println!("| compute nodes (search s) | storage-site cores | vs direct, encrypted | vs zstd -3 |");
    println!("|---|---|---|---|");
    for nodes in [nodes_here, nodes_here * 4.0, nodes_here * 16.0] {
        let search = b.reference_search_seconds * nodes_here / nodes;
        let speedup = |other: &Overlap, c: f64| other.predict(search, rate as f64, c, false) / pm.predict(search, rate as f64, c, false);
        series.push((format!("vs direct, encrypted: {nodes} compute nodes"), cores.iter().map(|&c| (c, speedup(&direct, c))).collect()));
        if let Some(z) = &zstd {
            series.push((format!("vs zstd -3: {nodes} compute nodes"), cores.iter().map(|&c| (c, speedup(z, c))).collect()));
        }
        for &c in &cores {
            let vs_zstd = zstd.as_ref().map_or("-".into(), |z| format!("{:.2}×", speedup(z, c)));
            println!("| {nodes} ({search:.1} s) | {c} | {:.2}× | {vs_zstd} |", speedup(&direct, c));
        }
    }
    crate::plots::lines_log_x(
        &a.out.join("paramedic_model_speedup.png"),
        &format!("ParaMEDIC's speed-up, modelled (concurrent regeneration), {rate} Mbit/s, {delay} ms"),
        "storage-site cores (log scale)",
        &series,
    )
}

/// A sweep: end-to-end time per variant against the swept setting, and ParaMEDIC's
/// speed-up over the encrypted direct and remote-file-system transfers.
fn sweep(a: &FiguresArgs, benches: &[Bench], rate: u32, delay: f64, name: &str, x_label: &str, x_of: SweptSetting) -> Result<()> {
    let mut benches: Vec<&Bench> = benches.iter().collect();
    benches.sort_by(|p, q| x_of(p).total_cmp(&x_of(q)));
    let variants: Vec<String> = dedup(benches.iter().flat_map(|b| b.at(rate, delay).map(|r| r.variant.clone())));
    if variants.is_empty() {
        bail!("the {name} sweep has no runs at {rate} Mbit/s, {delay} ms (--link)");
    }
    println!("\n### Sweep over {x_label}, {rate} Mbit/s, {delay} ms one way: output complete at the storage site (s)\n");
    println!("| {x_label} | output MB | search s | {} |", variants.join(" | "));
    println!("|---|---|---|{}", "---|".repeat(variants.len()));
    let time = |b: &Bench, v: &str| b.at(rate, delay).find(|r| r.variant == v).map(|r| r.complete_seconds);
    for b in &benches {
        let cells: Vec<String> = variants.iter().map(|v| time(b, v).map_or("-".into(), |t| format!("{t:.1}"))).collect();
        println!("| {} | {:.1} | {:.1} | {} |", x_of(b), b.output_bytes as f64 / 1e6, b.reference_search_seconds, cells.join(" | "));
    }
    let mut series: Vec<Series> =
        variants.iter().map(|v| (v.clone(), benches.iter().filter_map(|b| Some((x_of(b), time(b, v)?))).collect())).collect();
    series.push(("search alone".into(), benches.iter().map(|b| (x_of(b), b.reference_search_seconds)).collect()));
    crate::plots::lines(
        &a.out.join(format!("paramedic_sweep_{name}.png")),
        &format!("Output complete at the storage site (s), {rate} Mbit/s, {delay} ms"),
        x_label,
        &series,
    )?;
    let speedups: Vec<Series> = ["direct, encrypted", "remote FS (sshfs, encrypted)", "zstd -3"]
        .iter()
        .map(|base| {
            let pts = benches.iter().filter_map(|b| Some((x_of(b), time(b, base)? / time(b, "ParaMEDIC, encrypted")?))).collect();
            (format!("ParaMEDIC, encrypted, vs {base}"), pts)
        })
        .filter(|(_, p): &Series| !p.is_empty())
        .collect();
    if !speedups.is_empty() {
        crate::plots::lines(
            &a.out.join(format!("paramedic_sweep_{name}_speedup.png")),
            &format!("ParaMEDIC's speed-up, {rate} Mbit/s, {delay} ms"),
            x_label,
            &speedups,
        )?;
    }
    Ok(())
}

/// The distinct values, in their first order.
fn dedup<T: PartialEq>(v: impl Iterator<Item = T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench(blast_args: &[&str]) -> Bench {
        Bench {
            queries: 500,
            queries_from_db: 500,
            output_bytes: 0,
            reference_search_seconds: 0.0,
            blast_args: blast_args.iter().map(|s| s.to_string()).collect(),
            storage_cpu_shares: None,
            compute_nodes: 16,
            runs: Vec::new(),
        }
    }

    #[test]
    fn max_target_seqs_is_read_from_the_blast_options_or_defaults_to_500() {
        assert_eq!(bench(&["-max_target_seqs", "50"]).max_target_seqs(), 50.0);
        assert_eq!(bench(&["-evalue", "1e-5", "-max_target_seqs", "250"]).max_target_seqs(), 250.0);
        assert_eq!(bench(&["-evalue", "1e-5"]).max_target_seqs(), 500.0);
        assert_eq!(bench(&[]).total_queries(), 1000);
    }

    #[test]
    fn break_even_is_where_both_deliveries_take_as_long() {
        // 100 MB of output against 1 MB and 40 s of work.
        let rate = break_even_mbit(100e6, 1e6, 40.0).unwrap();
        assert!((rate - 19.8).abs() < 1e-9, "{rate}");
        let (output, metadata) = (delivery_seconds(100e6, 0.0, rate), delivery_seconds(1e6, 40.0, rate));
        assert!((output - metadata).abs() < 1e-9, "{output} vs {metadata}");
        assert_eq!(break_even_mbit(100e6, 20e6, 0.0), None);
    }

    #[test]
    fn the_overlap_model_takes_the_slowest_stage_plus_the_last_part() {
        // 100 MB in 10 parts at 100 Mbit/s (8 s on the link), 20 CPU-s at the storage
        // site, 50 ms round trips.
        // 100 MB in 10 parts at 100 Mbit/s (8 s on the link), 20 CPU-s at the storage
        // site that were 16 s of its time one object at a time, 50 ms round trips.
        let m = Overlap { bytes: 100e6, storage_cpu: 20.0, storage_busy: 16.0, parts: 10.0, rtt: 0.05 };
        let tail = |storage: f64| (8.0 + storage) / 10.0 + 0.2;
        // A 60 s search hides both; a 1 s search leaves the storage site (1 core: 20 s)
        // or, with 4 cores, the link (8 s) as the slowest stage.
        assert!((m.predict(60.0, 100.0, 2.0, false) - (60.0 + tail(10.0))).abs() < 1e-9);
        assert!((m.predict(1.0, 100.0, 1.0, false) - (20.0 + tail(20.0))).abs() < 1e-9);
        assert!((m.predict(1.0, 100.0, 4.0, false) - (8.0 + tail(5.0))).abs() < 1e-9);
        // As built, one object at a time: no faster than its busy time.
        assert!((m.predict(1.0, 100.0, 4.0, true) - (16.0 + tail(16.0))).abs() < 1e-9);
    }

    #[test]
    fn dedup_keeps_first_order() {
        assert_eq!(dedup([3.0, 1.0, 3.0, 2.0, 1.0].into_iter()), vec![3.0, 1.0, 2.0]);
    }
}
