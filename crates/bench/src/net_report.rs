//! `gepsea-bench net`'s judging and drawing: alternated pairs of cases and the medians
//! of their ratios, the overlap table, and the plots of event-driven against inline
//! progress (seed 004's comparison) on both transports.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use gepsea_net::Progress;
use serde_json::{json, Value};

use crate::net::{fmt_size, median_of, netpeer_cmd, spawn_ready, CaseResult, Kill, Series, Where};

/// Runs gepsea's case and its reference `reps` times, one after the other, so that both
/// see the same states of the host. Returns every run of each.
pub(crate) fn alternate(
    reps: usize,
    what: &str,
    mut gepsea: impl FnMut(usize) -> Result<CaseResult>,
    mut reference: impl FnMut() -> Result<CaseResult>,
) -> Result<(Vec<CaseResult>, Vec<CaseResult>)> {
    let (mut g, mut m) = (Vec::new(), Vec::new());
    for i in 0..reps {
        eprintln!("measuring gepsea over {what} ({}/{reps}) ...", i + 1);
        g.push(gepsea(i)?);
        eprintln!("measuring OpenMPI over {what} ({}/{reps}) ...", i + 1);
        m.push(reference()?);
    }
    Ok((g, m))
}

/// One measure's gepsea/reference ratio in each alternated round, and its target.
pub(crate) struct PairedRatios {
    pub label: String,
    pub target: String,
    pub rounds: Vec<f64>,
}

impl PairedRatios {
    /// The ratio of `pick` (gepsea's value over the reference's) in each round where
    /// both have it.
    pub fn of(label: &str, target: &str, g: &[CaseResult], m: &[CaseResult], pick: impl Fn(&CaseResult) -> Option<&f64>) -> Self {
        let rounds =
            g.iter().zip(m).filter_map(|(a, b)| Some((pick(a)?, pick(b)?))).filter(|(_, b)| **b > 0.0).map(|(a, b)| a / b).collect();
        PairedRatios { label: label.to_string(), target: target.to_string(), rounds }
    }

    /// Issue 20's TCP measures against OpenMPI's TCP transport on `link`.
    pub fn tcp(link: &str, g: &[CaseResult], m: &[CaseResult]) -> Vec<Self> {
        let mut v = vec![Self::of(&format!("TCP {link} 1 MiB one-way / OpenMPI TCP"), "<= 1.1", g, m, |r| r.0.get(&(1 << 20)))];
        for size in [64usize << 10, 1 << 20, 4 << 20] {
            let label = format!("TCP {link} stream {} / OpenMPI TCP", fmt_size(size));
            v.push(Self::of(&label, ">= 1.0", g, m, move |r| r.1.get(&size)));
        }
        v
    }

    /// The same measures (but 64 KiB streams) for gepsea with both ends trusting TCP
    /// for data (`--tcp-checksums headers`): what the payload checksums cost, measured
    /// against the same OpenMPI rounds. Not issue 20's targets, which hold for the default.
    pub fn tcp_trusting(link: &str, g: &[CaseResult], m: &[CaseResult]) -> Vec<Self> {
        let target = "checksums off";
        let mut v = vec![Self::of(&format!("TCP {link} 1 MiB one-way, trusting TCP / OpenMPI"), target, g, m, |r| r.0.get(&(1 << 20)))];
        for size in [1usize << 20, 4 << 20] {
            let label = format!("TCP {link} stream {}, trusting TCP / OpenMPI", fmt_size(size));
            v.push(Self::of(&label, target, g, m, move |r| r.1.get(&size)));
        }
        v
    }

    pub fn median(&self) -> Option<f64> {
        median_of(&self.rounds)
    }

    pub fn rounds_text(&self) -> String {
        let each: Vec<String> = self.rounds.iter().map(|r| format!("{r:.3}")).collect();
        format!("(rounds: {})", each.join(", "))
    }
}

/// Overlap results of one transport: (name, event thread, inline), each keyed by
/// (size, compute µs) with (wait µs, total µs).
pub(crate) type Overlap = (&'static str, BTreeMap<(usize, u128), (f64, f64)>, BTreeMap<(usize, u128), (f64, f64)>);

/// Prints the overlap table; returns whether the wait target held wherever it applies,
/// and the rows as JSON.
pub(crate) fn overlap_table(overlaps: &[Overlap], rounds: usize) -> (bool, Vec<Value>) {
    println!("\nOverlap: post irecv(S), compute C, wait; medians of {rounds} rounds, µs");
    println!(
        "{:>8}{:>10}{:>8}{:>14}{:>14}{:>14}{:>14}{:>10}",
        "link", "S", "C", "wait thread", "wait inline", "total thread", "total inline", "ratio"
    );
    let mut ok = true;
    let mut rows = Vec::new();
    for (transport, thread, inline) in overlaps {
        for ((s, c), (wt, tt)) in thread {
            let Some(&(wi, ti)) = inline.get(&(*s, *c)) else { continue };
            let r = wt / wi.max(1e-9);
            // The target applies when C >= 2x the transfer time (inline wait = transfer).
            if (*c as f64) >= 2.0 * wi {
                ok &= r <= 0.10;
            }
            println!("{:>8}{:>10}{:>6}ms{:>14.1}{:>14.1}{:>14.1}{:>14.1}{:>10.3}", transport, fmt_size(*s), c / 1000, wt, wi, tt, ti, r);
            rows.push(json!({"transport": transport, "size": s, "compute_us": c, "wait_thread_us": wt, "wait_inline_us": wi,
                             "total_thread_us": tt, "total_inline_us": ti, "wait_ratio": r}));
        }
    }
    (ok, rows)
}

/// Draws, into `dir`: `net_latency.png` and `net_bandwidth.png` (gepsea with and
/// without its event thread, and OpenMPI, plain and thread-safe on shared memory, on
/// shared memory and TCP loopback), and
/// `net_overlap.png` (the wait after 10 ms of computation, event thread vs inline).
pub(crate) fn plots(dir: &Path, lat: &Series, bw: &Series, overlaps: &[Overlap]) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let names = ["gepsea shm", "gepsea shm inline", "OpenMPI shm", "OpenMPI shm mt", "gepsea tcp lo", "gepsea lo inline", "OpenMPI tcp lo"];
    let lines = |t: &Series| -> Vec<crate::plots::Series> {
        names
            .iter()
            .filter_map(|n| t.get(*n).map(|m| (n.to_string(), m.iter().map(|(s, v)| (*s as f64 / 1024.0, *v)).collect())))
            .filter(|(_, p): &(String, Vec<(f64, f64)>)| !p.is_empty())
            .collect()
    };
    let (lat_lines, bw_lines) = (lines(lat), lines(bw));
    if !lat_lines.is_empty() {
        crate::plots::lines_log_xy(&dir.join("net_latency.png"), "One-way latency (µs)", "message size (KiB)", &lat_lines)?;
        crate::plots::lines_log_x(&dir.join("net_bandwidth.png"), "Streaming bandwidth (GB/s)", "message size (KiB)", &bw_lines)?;
    }
    let mut waits = Vec::new();
    for (transport, thread, inline) in overlaps {
        for (progress, m) in [("event thread", thread), ("inline", inline)] {
            let points: Vec<(f64, f64)> =
                m.iter().filter(|((_, c), _)| *c == 10_000).map(|((s, _), (w, _))| (*s as f64 / 1024.0, w.max(0.1))).collect();
            waits.push((format!("{transport}, {progress}"), points));
        }
    }
    crate::plots::lines_log_xy(&dir.join("net_overlap.png"), "Wait after 10 ms of computation (µs)", "message size (KiB)", &waits)?;
    eprintln!("plots net_latency.png, net_bandwidth.png, net_overlap.png, net_uni_*.png in {}", dir.display());
    Ok(())
}

/// One unidirectional-bandwidth case (seed 004, Figs. 4-9): by size, the receiver's
/// (GB/s, CPU time over wall time).
pub(crate) type Uni = BTreeMap<usize, (f64, f64)>;

/// The sizes of the unidirectional test: eager (1 KiB, 16 KiB, the eager limit) and
/// rendezvous (64 KiB, 1 MiB).
pub(crate) const UNI_SIZES: [usize; 4] = [1 << 10, 16 << 10, 64 << 10, 1 << 20];

/// Runs `gepsea-netpeer uni-send` / `uni-recv` at `place` (shared memory or TCP on
/// loopback), with `progress` on both sides, receives expected or `unexpected`.
pub(crate) fn uni_case(netpeer: &Path, ns: &str, place: &Where, progress: Progress, unexpected: bool, quick: bool) -> Result<Uni> {
    let tcp = !matches!(place, Where::Shm);
    let dir = std::env::temp_dir().join(format!("{ns}-dir"));
    let bytes = if quick { 4usize << 20 } else { 256 << 20 };
    let sizes = UNI_SIZES.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",");
    let node = |n: u32| if tcp { n } else { 0 };
    if tcp {
        std::fs::create_dir_all(&dir)?;
    }
    let base = |port: u32| netpeer_cmd(netpeer, place, ns, node(port), port, &dir, progress);
    let mut send = base(2);
    send.args(["uni-send", "--peer", &format!("{}:1", node(1)), "--sizes", &sizes, "--bytes", &bytes.to_string()]);
    let guard = Kill(vec![spawn_ready(send, "uni-send")?]);
    let mut recv = base(1);
    recv.args(["uni-recv", "--peer", &format!("{}:2", node(2)), "--sizes", &sizes, "--bytes", &bytes.to_string()]);
    if unexpected {
        recv.arg("--unexpected");
    }
    let out = recv.output().context("running uni-recv")?;
    drop(guard);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(gepsea_net::namespace_dir(ns));
    if !out.status.success() {
        bail!("uni-recv failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    let mut r = Uni::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if let ["UNI", size, gbs, cpu] = f[..] {
            r.insert(size.parse()?, (gbs.parse()?, cpu.parse()?));
        }
    }
    Ok(r)
}

/// The unidirectional cases of one run: (transport, progress, receives) and results.
pub(crate) type UniRun = Vec<((&'static str, &'static str, &'static str), Uni)>;

/// Prints the unidirectional table; returns its rows as JSON.
pub(crate) fn uni_table(runs: &UniRun) -> Vec<Value> {
    println!("\nUnidirectional bandwidth (batches of 16 blocking-style sends), receiver GB/s and CPU (CPU-s per s, all threads)");
    println!("{:>8}{:>14}{:>12}{:>10}{:>10}{:>8}", "link", "progress", "receives", "size", "GB/s", "CPU");
    let mut rows = Vec::new();
    for ((link, progress, receives), m) in runs {
        for (size, (gbs, cpu)) in m {
            println!("{link:>8}{progress:>14}{receives:>12}{:>10}{gbs:>10.3}{cpu:>8.2}", fmt_size(*size));
            rows.push(json!({"transport": link, "progress": progress, "receives": receives, "size": size, "gbs": gbs, "cpu": cpu}));
        }
    }
    rows
}

/// Draws `net_uni_<transport>.png` (bandwidth) and `net_uni_cpu_<transport>.png`
/// (receiver CPU) for each transport, one line per progress mode and kind of receive.
pub(crate) fn uni_plots(dir: &Path, runs: &UniRun) -> Result<()> {
    for (link, file) in [("shm", "shm"), ("tcp lo", "tcp")] {
        let series = |pick: fn(&(f64, f64)) -> f64| -> Vec<crate::plots::Series> {
            runs.iter()
                .filter(|((l, _, _), _)| *l == link)
                .map(|((_, p, r), m)| (format!("{p}, {r}"), m.iter().map(|(s, v)| (*s as f64 / 1024.0, pick(v))).collect()))
                .collect()
        };
        let bw = series(|v| v.0);
        if bw.iter().all(|(_, p)| p.is_empty()) {
            continue;
        }
        crate::plots::lines_log_x(
            &dir.join(format!("net_uni_{file}.png")),
            &format!("Unidirectional bandwidth, {link} (GB/s)"),
            "message size (KiB)",
            &bw,
        )?;
        crate::plots::lines_log_x(
            &dir.join(format!("net_uni_cpu_{file}.png")),
            &format!("Receiver CPU, {link} (CPU-s per s)"),
            "message size (KiB)",
            &series(|v| v.1),
        )?;
    }
    Ok(())
}

/// What one checksum pass over 1 MiB costs here, µs: `(in cache, after a copy)`.
///
/// Every TCP message pays one CRC32C pass on each side (gepsea-net's end-to-end
/// corruption detection; OpenMPI's TCP transport has none). The receiver checksums each
/// piece as it lands, in cache. The sender checksums after the `writev`, once the
/// kernel's copy into socket buffers has pushed much of the message out of cache: that
/// is the second figure (the copy here goes to one of 32 rotating destinations, as the
/// kernel's goes to fresh socket buffers). Builds without the checksums measured their
/// whole share directly: 72 of 278 µs of a 1 MiB one-way on loopback
/// (`docs/benchmarks.md`, thirtieth session).
pub(crate) fn checksum_cost() -> (f64, f64) {
    const MIB: usize = 1 << 20;
    const ROUNDS: usize = 400;
    let src: Vec<u8> = (0..MIB).map(|i| (i.wrapping_mul(31) >> 3) as u8).collect();
    let mut dsts: Vec<Vec<u8>> = (0..32).map(|_| vec![0u8; MIB]).collect();
    let mut sink = 0u32;
    let t = std::time::Instant::now();
    for _ in 0..ROUNDS {
        sink ^= gepsea_net::frame::crc32c(std::hint::black_box(&src));
    }
    let hot = t.elapsed().as_secs_f64() / ROUNDS as f64;
    let mut after_copy = 0.0;
    for i in 0..ROUNDS {
        dsts[i % 32].copy_from_slice(&src);
        let t = std::time::Instant::now();
        sink ^= gepsea_net::frame::crc32c(std::hint::black_box(&src));
        after_copy += t.elapsed().as_secs_f64();
    }
    std::hint::black_box(sink);
    (hot * 1e6, after_copy / ROUNDS as f64 * 1e6)
}
