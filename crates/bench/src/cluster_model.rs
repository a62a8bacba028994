//! The many-node model ([`crate::model`]) fed by `gepsea-bench cluster --replay`:
//! calibrated on the smallest replayed run of each variant, checked against every
//! other replayed run, then extrapolated to node counts this machine cannot host.
//!
//! What is measured and what is modelled, kept apart:
//! - every task's search time and archive size, every batch's merge and write time
//!   (and its statistics runs, when the agents' master ran them ahead) and the
//!   fallbacks come from the trace of the smallest replayed run (the master's
//!   or the agents' own timings, `Summary::trace`);
//! - the compression rate and ratio are measured here on the recording's archives
//!   (zstd -3, as the agents compress);
//! - the agents' own CPU: their start and idle cost are measured on a group of agents
//!   left alone before each node count's runs, and the rest of the calibration run's own
//!   CPU is charged per task ([`AgentOwn`]);
//! - the rest of the machine's CPU in the calibration run (the workers, the master, the
//!   kernel, the storage link: what this machine was busy with besides the agents and
//!   the master's statistics runs) is charged per task on the shared cores, in
//!   validation only ([`rest_of_machine_cpu`]);
//! - the launch's fixed cost (start-up, agents meeting, final assembly) is the part of
//!   the smallest run's wall time the model does not play, and is held constant;
//! - link rate and task round trip are set from `bench net` / `bench agent` figures.
//!
//! Validation plays the emulated cluster as it is: agents' work shares this machine's
//! cores. Extrapolation plays a real cluster: every agent has its node's spare core,
//! and the workload is repeated so that each worker has as much work as at the
//! largest replayed size (weak scaling).

use std::path::Path;
use std::time::Instant;

use crate::cluster::Row;
use anyhow::{bail, Result};
use gepsea_blast::trace::RunTrace;
use serde::{Deserialize, Serialize};

use crate::model::{self, Arch, Assign, BatchWork, Costs};

#[derive(Serialize)]
struct Point {
    nodes: usize,
    variant: String,
    measured_wall: Option<f64>,
    predicted_wall: f64,
    error_percent: Option<f64>,
    measured_search_fraction: Option<f64>,
    predicted_search_fraction: f64,
    measured_active_search_fraction: Option<f64>,
    predicted_active_search_fraction: f64,
    measured_agent_own_cpu_seconds: f64,
    predicted_agent_own_cpu_seconds: f64,
    /// The model played with this run's own traced costs (its merges and writes)
    /// instead of the calibration run's. Where this is close and `predicted_wall` is
    /// not, the miss is the costs changing between runs, not the model's queueing.
    /// For agents only when the trace holds the writes' CPU times ([`Times::Cpu`]):
    /// their wall times include the shared cores' contention, which the model plays
    /// again.
    predicted_wall_own_costs: Option<f64>,
}

/// The variant's architecture in the model.
fn arch(variant: usize) -> Arch {
    match variant {
        0 => Arch::Mpiblast,
        2 => Arch::Agents { assign: Assign::Static, compress: true },
        3 => Arch::Agents { assign: Assign::Single, compress: true },
        4 => Arch::Agents { assign: Assign::Dynamic, compress: false },
        _ => Arch::Agents { assign: Assign::Dynamic, compress: true },
    }
}

/// Which traced times of the batches' writes and statistics runs the model plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Times {
    /// Wall times: the mpiBLAST master's writes, one after another on its critical
    /// path, reading and writing over the storage link as they go.
    Wall,
    /// CPU times (the BLAST+ programs' included), where the trace has them: the
    /// agents' writes, played as work on the cores. Their wall times were stretched by
    /// every other write on the same cores (33 at once at 36 nodes on 2 cores), which
    /// the model plays itself; booked again, a run calibrated at 36 nodes played ten
    /// times too long. Wall times for a trace saved before CPU was traced.
    Cpu,
}

/// The times the model plays for `arch`'s writes (see [`Times`]).
fn times_for(arch: Arch) -> Times {
    if arch == Arch::Mpiblast {
        Times::Wall
    } else {
        Times::Cpu
    }
}

/// Whether `trace` holds the writes' CPU times.
fn has_cpu_times(trace: &RunTrace) -> bool {
    trace.batches.iter().any(|b| b.write_cpu_seconds > 0.0)
}

/// The workload as a run traced it: per batch, its fragments' searches (first result
/// per fragment; a re-run adds nothing), its fallbacks, and its merge and write.
pub fn workload(trace: &RunTrace, times: Times) -> Vec<BatchWork> {
    let cpu = times == Times::Cpu && has_cpu_times(trace);
    let nb = trace.batches.iter().map(|b| b.batch + 1).chain(trace.tasks.iter().map(|t| t.batch + 1)).max().unwrap_or(0);
    let mut out = vec![BatchWork::default(); nb];
    // Per batch, each fragment's first result, in fragment order (the model's task
    // order and the master's fragment affinity go by it).
    let mut firsts = std::collections::BTreeMap::new();
    for t in &trace.tasks {
        match t.fragment {
            Some(f) => {
                firsts.entry((t.batch, f)).or_insert((t.seconds, t.bytes, t.parse_seconds));
            }
            None => out[t.batch].whole.push((t.seconds, t.bytes)),
        }
    }
    for ((b, _), task) in firsts {
        out[b].fragments.push(task);
    }
    for b in &trace.batches {
        let w = &mut out[b.batch];
        w.merge_seconds += b.merge_seconds;
        w.write_own_seconds += b.write_thread_cpu_seconds;
        if cpu {
            w.write_seconds += b.write_cpu_seconds;
            w.stats_ahead_seconds += b.stats_ahead_cpu_seconds;
        } else {
            w.write_seconds += b.write_seconds;
            w.stats_ahead_seconds += b.stats_ahead_seconds;
        }
    }
    out
}

/// zstd -3 on the recording's archives, as the agents compress: what the model charges
/// for compressing. Measured once, after a replay's runs, and saved in its JSON, so
/// that `--model-only` plays the same costs again: timed anew on every call, the rate
/// moved by a few per cent (541 against 560 MB/s), and the model's walls by about 0.1 %.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Compression {
    /// Raw bytes compressed per second.
    pub bytes_per_second: f64,
    /// Raw bytes over compressed bytes.
    pub ratio: f64,
}

impl Compression {
    /// The rate saved in a replay's JSON (`None` in one saved before it was kept, or
    /// holding no usable rate).
    pub fn saved(v: &serde_json::Value) -> Option<Compression> {
        let c: Compression = serde_json::from_value(v.get("compression")?.clone()).ok()?;
        (c.bytes_per_second > 0.0 && c.ratio > 0.0).then_some(c)
    }
}

/// zstd -3 over the recording's archives (up to 64 MB of them).
pub fn measure_compression(recording: &Path) -> Result<Compression> {
    let mut raw = 0usize;
    let mut packed = 0usize;
    let mut seconds = 0.0;
    for e in std::fs::read_dir(recording.join("runs"))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "out") && raw < 64 << 20 {
            let data = std::fs::read(&p)?;
            let t = Instant::now();
            packed += zstd::bulk::compress(&data, 3)?.len();
            seconds += t.elapsed().as_secs_f64();
            raw += data.len();
        }
    }
    if raw == 0 {
        bail!("{}: no recorded archives to measure compression on", recording.display());
    }
    Ok(Compression { bytes_per_second: raw as f64 / seconds.max(1e-9), ratio: raw as f64 / packed.max(1) as f64 })
}

/// What the agents cost themselves besides the work the model plays apart (parsing,
/// merging, compressing), split by what it grows with:
/// - **starting**, per agent: measured with an idle group of the run's size
///   (`Row::agent_start_cpu_seconds`);
/// - **being there**, per agent-second: an idle agent's cost, from the largest idle
///   group measured ([`idle_agent_cores_each`]);
/// - **per task**: the rest of the calibration run's own CPU, over its tasks (taking
///   them, the hand-overs, the messages that go with each result).
///
/// Until 2026-11-28 all of it was charged per agent-second. The same work at 36 nodes
/// keeps 9 times as many agents for a fifth of the time, and that charge put their own
/// CPU at 17.7 CPU-s in a run that measured 12.6. The idle groups measure the start at
/// about 0.01 CPU-s per agent and the idle cost at about 0.01 % of a core: nearly all
/// of the agents' own CPU follows the work. What grows with the node count beyond
/// those two (about 3 CPU-s from 4 to 36 nodes, in the agents' loops and event
/// threads) is not charged; each run's measured and modelled own CPU are reported
/// side by side.
///
/// Besides the agents, the calibration run measures the rest of the machine per task
/// ([`rest_of_machine_cpu`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct AgentOwn {
    per_task: f64,
    idle_cores_each: f64,
    rest_per_task: f64,
}

impl AgentOwn {
    /// Calibrated on `cal` (zero for mpiBLAST, and for a run saved before the agents'
    /// own CPU was recorded).
    fn calibrate(cal: &Row, runs: &[Row], work: &[BatchWork], arch: Arch, compress_rate: f64) -> AgentOwn {
        if arch == Arch::Mpiblast || cal.agent_own_cpu_seconds <= 0.0 {
            return AgentOwn::default();
        }
        let idle_cores_each = idle_agent_cores_each(runs);
        let rest = cal.agent_own_cpu_seconds
            - tasks_cpu(cal, work, arch, compress_rate)
            - cal.agent_start_cpu_seconds
            - idle_cores_each * cal.nodes as f64 * cal.wall_seconds;
        let tasks = task_count(work).max(1) as f64;
        AgentOwn { per_task: rest.max(0.0) / tasks, idle_cores_each, rest_per_task: rest_of_machine_cpu(cal).unwrap_or(0.0) / tasks }
    }

    /// The model's costs for playing `run`.
    fn costs(&self, run: &Row, base: &Costs) -> Costs {
        Costs {
            agent_own_cores: self.idle_cores_each,
            agent_cpu_per_task: self.per_task,
            agent_start_cpu: run.agent_start_cpu_seconds / run.nodes.max(1) as f64,
            rest_cpu_per_task: self.rest_per_task,
            ..base.clone()
        }
    }
}

/// CPU seconds this machine was busy during `run` besides its agents (with the BLAST+
/// programs they ran) and the master's statistics runs ahead: the workers handing their
/// archives over, the master itself, the kernel's networking, the storage link's
/// `ssh`, the sampler. At 4 nodes the cores have room for it; at 36 on 2 cores they
/// have none, and the 36-node runs of 2026-11-29 measured 7.3–10.1 CPU-s of it that
/// the model did not play (a tenth of those runs' wall time). `None` where the
/// machine's CPU was not measured (a run saved before it was kept) or there are no
/// agents.
fn rest_of_machine_cpu(run: &Row) -> Option<f64> {
    if run.machine_busy_seconds <= 0.0 || run.variant_index == 0 {
        return None;
    }
    let ahead: f64 = run.trace.batches.iter().map(|b| b.stats_ahead_cpu_seconds).sum();
    Some((run.machine_busy_seconds - run.agent_cpu_seconds() - ahead).max(0.0))
}

/// Every search task of the workload: fragments and whole-database fallbacks.
fn task_count(work: &[BatchWork]) -> usize {
    work.iter().map(|b| b.fragments.len() + b.whole.len()).sum()
}

/// The agents' CPU for the work the model plays apart (parsing, merging, their part
/// writers' own share of the writes, and compressing `run`'s raw bytes), in CPU
/// seconds.
fn tasks_cpu(run: &Row, work: &[BatchWork], arch: Arch, compress_rate: f64) -> f64 {
    let parse: f64 = work.iter().flat_map(|b| b.fragments.iter().map(|f| f.2)).sum();
    let merge_and_write: f64 = work.iter().map(|b| b.merge_seconds + b.write_own_seconds).sum();
    let compress = match arch {
        Arch::Agents { compress: true, .. } => run.bytes_raw as f64 / compress_rate.max(1.0),
        _ => 0.0,
    };
    parse + merge_and_write + compress
}

/// The agents' own CPU (`Row::agent_own_cpu_seconds`) the model charges `run`'s agents
/// when it plays the run in `wall` seconds with `costs`.
fn modelled_own_cpu(run: &Row, work: &[BatchWork], arch: Arch, costs: &Costs, wall: f64) -> f64 {
    if arch == Arch::Mpiblast {
        return 0.0;
    }
    let nodes = run.nodes as f64;
    tasks_cpu(run, work, arch, costs.compress_bytes_per_second)
        + costs.agent_cpu_per_task * task_count(work) as f64
        + costs.agent_start_cpu * nodes
        + costs.agent_own_cores * nodes * wall
}

/// Why the calibration run cannot be trusted, if it cannot: the model plays the
/// calibration run itself in `played` seconds against `measured`, and only adds the
/// difference as a fixed cost when it played less. Where the trace's writes are wall
/// times (a trace saved before CPU times were kept, [`Times`]), a run whose `nodes`
/// agents wrote at once on `cores` cores traced each write stretched by the others (a
/// 36-node run on 2 cores traced 878 s of writes that took 50 s of wall time
/// together): played as work on the cores, that makes the run many times longer than
/// it was.
fn calibration_doubt(nodes: usize, cores: usize, played: f64, measured: f64) -> Option<String> {
    if played <= measured * 1.25 {
        return None;
    }
    Some(format!(
        "the model plays its calibration run ({nodes} nodes) in {played:.1} s against {measured:.1} s measured: its traced \
         merges and writes were slowed by one another on {cores} cores, and every prediction from it is too long. \
         Calibrate on a small node count (e.g. --nodes 4,{nodes})"
    ))
}

/// Cores one idle agent costs, from the largest idle group measured
/// (`Row::idle_agent_cores`). Zero when no run measured it.
fn idle_agent_cores_each(runs: &[Row]) -> f64 {
    let Some(r) = runs.iter().filter(|r| r.idle_agent_cores > 0.0 && r.nodes > 1).max_by_key(|r| r.nodes) else { return 0.0 };
    r.idle_agent_cores / r.nodes as f64
}

/// Calibrates, validates and extrapolates; prints the tables, writes JSON and plots
/// into `out_dir`. Returns the largest error of a validated point, in percent.
pub fn report(runs: &[Row], compression: Compression, out_dir: &Path) -> Result<f64> {
    let Compression { bytes_per_second: compress_rate, ratio: compress_ratio } = compression;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let base_costs = Costs {
        // `bench net`: 1 MiB streaming across a veth pair, 1.55 GB/s.
        link_bytes_per_second: 1.55e9,
        compress_bytes_per_second: compress_rate,
        compress_ratio,
        // `bench agent`: an operation crossing nodes ≈ 0.5 ms; a take and its reply.
        take_seconds: 0.001,
        shared_cores: Some(cores),
        agent_own_cores: 0.0,
        agent_cpu_per_task: 0.0,
        agent_start_cpu: 0.0,
        rest_cpu_per_task: 0.0,
        fixed_seconds: 0.0,
    };
    eprintln!(
        "bench cluster model: zstd -3 on the recorded archives {:.0} MB/s, ratio {compress_ratio:.1}; agents share {cores} cores as emulated; an idle agent {:.3} % of a core",
        compress_rate / 1e6,
        100.0 * idle_agent_cores_each(runs)
    );
    let mut points = Vec::new();
    let mut worst: f64 = 0.0;
    let mut variants: Vec<usize> = runs.iter().map(|r| r.variant_index).collect();
    variants.sort_unstable();
    variants.dedup();
    let mut calibrated = Vec::new();
    let mut own_cost_checks = Vec::new();
    println!("\nModel (calibrated on the smallest run of each variant) against the replayed runs:\n");
    println!(
        "| nodes | variant | measured s | model s | error | in search: measured, model | active: measured, model | agents' own CPU-s: measured, model |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for &v in &variants {
        let mut mine: Vec<&Row> = runs.iter().filter(|r| r.variant_index == v).collect();
        mine.sort_by_key(|r| r.nodes);
        let Some(cal) = mine.first() else { continue };
        let work = workload(&cal.trace, times_for(arch(v)));
        if work.is_empty() {
            continue;
        }
        let own = AgentOwn::calibrate(cal, runs, &work, arch(v), compress_rate);
        if own != AgentOwn::default() {
            eprintln!(
                "bench cluster model: {}: the agents' own CPU {:.1} ms per task and {:.3} % of a core per agent, besides their start as measured (from {} nodes: {:.1} CPU-s in {:.1} s, {:.2} of them starting); the rest of the machine {:.1} ms per task",
                cal.variant,
                1e3 * own.per_task,
                100.0 * own.idle_cores_each,
                cal.nodes,
                cal.agent_own_cpu_seconds,
                cal.wall_seconds,
                cal.agent_start_cpu_seconds,
                1e3 * own.rest_per_task
            );
        }
        let played = model::simulate(&work, cal.nodes, arch(v), &own.costs(cal, &base_costs));
        if let Some(why) = calibration_doubt(cal.nodes, cores, played.wall_seconds, cal.wall_seconds) {
            eprintln!("bench cluster model: {}: WARNING: {why}", cal.variant);
        }
        let fixed_seconds = (cal.wall_seconds - played.wall_seconds).max(0.0);
        let costs_for = |r: &Row| Costs { fixed_seconds, ..own.costs(r, &base_costs) };
        eprintln!(
            "bench cluster model: {}: {} nodes played in {:.2} s, measured {:.2} s: fixed cost {fixed_seconds:.2} s",
            cal.variant, cal.nodes, played.wall_seconds, cal.wall_seconds
        );
        for r in &mine {
            let costs = costs_for(r);
            let p = model::simulate(&work, r.nodes, arch(v), &costs);
            let err = 100.0 * (p.wall_seconds - r.wall_seconds) / r.wall_seconds;
            if r.nodes != cal.nodes {
                worst = worst.max(err.abs());
            }
            let own_cpu = modelled_own_cpu(r, &work, arch(v), &costs, p.wall_seconds);
            let own_costs = (r.nodes != cal.nodes && (arch(v) == Arch::Mpiblast || has_cpu_times(&r.trace))).then(|| {
                let theirs = workload(&r.trace, times_for(arch(v)));
                let merges_and_writes = |w: &[BatchWork]| w.iter().map(|b| b.merge_seconds + b.write_seconds).sum::<f64>();
                let q = model::simulate(&theirs, r.nodes, arch(v), &costs).wall_seconds;
                // And with the agents' own CPU as this run measured it (charged per task
                // as in the calibration): what is left is the model's queueing.
                let own_here = AgentOwn::calibrate(r, runs, &theirs, arch(v), compress_rate);
                let all_own = Costs { fixed_seconds, ..own_here.costs(r, &base_costs) };
                let q_all = model::simulate(&theirs, r.nodes, arch(v), &all_own).wall_seconds;
                let error = |q: f64| 100.0 * (q - r.wall_seconds) / r.wall_seconds;
                own_cost_checks.push(format!(
                    "| {} | {} | {:.2} | {:.2} | {:.2} ({:+.1} %) | {:.1}, {:.1} | {:.2} ({:+.1} %) |",
                    r.nodes,
                    r.variant,
                    merges_and_writes(&work),
                    merges_and_writes(&theirs),
                    q,
                    error(q),
                    1e3 * own.per_task,
                    1e3 * own_here.per_task,
                    q_all,
                    error(q_all),
                ));
                q
            });
            println!(
                "| {} | {} | {:.2} | {:.2} | {:+.1} %{} | {:.1} %, {:.1} % | {:.1} %, {:.1} % | {:.1}, {:.1} |",
                r.nodes,
                r.variant,
                r.wall_seconds,
                p.wall_seconds,
                err,
                if r.nodes == cal.nodes { " (calibration)" } else { "" },
                100.0 * r.search_fraction,
                100.0 * p.search_fraction,
                100.0 * r.active_search_fraction,
                100.0 * p.active_search_fraction,
                r.agent_own_cpu_seconds,
                own_cpu
            );
            points.push(Point {
                nodes: r.nodes,
                variant: r.variant.clone(),
                measured_wall: Some(r.wall_seconds),
                predicted_wall: p.wall_seconds,
                error_percent: Some(err),
                measured_search_fraction: Some(r.search_fraction),
                predicted_search_fraction: p.search_fraction,
                measured_active_search_fraction: Some(r.active_search_fraction),
                predicted_active_search_fraction: p.active_search_fraction,
                measured_agent_own_cpu_seconds: r.agent_own_cpu_seconds,
                predicted_agent_own_cpu_seconds: own_cpu,
                predicted_wall_own_costs: own_costs,
            });
        }
        // Extrapolated with the largest run's measured start per agent.
        let largest = costs_for(mine.last().copied().unwrap_or(cal));
        calibrated.push((v, cal.variant.clone(), cal.nodes, work, largest));
    }
    if !own_cost_checks.is_empty() {
        println!(
            "\nEach run played with its own traced costs (merges and writes as that run traced them; the agents' writes as CPU time):\n"
        );
        println!(
            "| nodes | variant | merges + writes s, calibration run | the same, this run | model s (error) | agents' own CPU per task, ms: calibration run, this run | model s with both this run's (error) |"
        );
        println!("|---|---|---|---|---|---|---|");
        for line in &own_cost_checks {
            println!("{line}");
        }
    }
    // A real cluster: each agent on its node's spare core, the work grown with the
    // nodes so that each worker keeps the share it had at the largest replayed size.
    let largest = runs.iter().map(|r| r.nodes).max().unwrap_or(1);
    let sizes = [largest, 128, 1000];
    println!(
        "\nModel, extrapolated (each agent on its own spare core; workload repeated to keep the work per worker of {largest} nodes):\n"
    );
    println!("| nodes | variant | model s | in search | active | speed-up over mpiBLAST |");
    println!("|---|---|---|---|---|---|");
    let mut scale_series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut share_series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut extrapolated = Vec::new();
    for &n in &sizes {
        let times = n.div_ceil(largest).max(1);
        let mut base = None;
        for (v, name, _, work, costs) in &calibrated {
            let w = model::repeated(work, times);
            let c = Costs { shared_cores: None, ..costs.clone() };
            let p = model::simulate(&w, n, arch(*v), &c);
            let b = *base.get_or_insert(p.wall_seconds);
            println!(
                "| {n} | {name} | {:.2} | {:.1} % | {:.1} % | {:.2} |",
                p.wall_seconds,
                100.0 * p.search_fraction,
                100.0 * p.active_search_fraction,
                b / p.wall_seconds
            );
            extrapolated.push(serde_json::json!({"nodes": n, "variant": name, "repeat": times, "wall_seconds": p.wall_seconds,
                "search_fraction": p.search_fraction, "active_search_fraction": p.active_search_fraction, "speedup_over_mpiblast": b / p.wall_seconds}));
            add_point(&mut scale_series, name, (n as f64, b / p.wall_seconds));
            add_point(&mut share_series, name, (n as f64, 100.0 * p.search_fraction));
        }
    }
    let validated = runs.iter().any(|r| runs.iter().any(|c| c.variant_index == r.variant_index && c.nodes < r.nodes));
    if validated {
        println!("\nlargest model error on a validated point: {worst:.1} %");
    } else {
        println!(
            "\nno validated point: each variant ran at one node count only, its calibration (give --nodes a small count and larger ones)"
        );
    }
    crate::out::json(
        &out_dir.join("cluster_model.json"),
        &serde_json::json!({
            "compress_bytes_per_second": compress_rate, "compress_ratio": compress_ratio, "shared_cores": cores,
            "validation": points, "largest_error_percent": worst, "extrapolation": extrapolated,
        }),
    )?;
    // Measured points against the model's line, per variant.
    let mut fit: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for p in &points {
        for (label, y) in
            [(format!("{} (measured)", p.variant), p.measured_wall.unwrap_or(0.0)), (format!("{} (model)", p.variant), p.predicted_wall)]
        {
            add_point(&mut fit, &label, (p.nodes as f64, y));
        }
    }
    crate::plots::lines(&out_dir.join("cluster_model_fit.png"), "Wall time (s): replayed runs and the model", "emulated nodes", &fit)?;
    crate::plots::lines(&out_dir.join("cluster_model_speedup.png"), "Model: speed-up over mpiBLAST", "nodes", &scale_series)?;
    crate::plots::lines(&out_dir.join("cluster_model_search_share.png"), "Model: worker time in search (%)", "nodes", &share_series)?;
    Ok(worst)
}

/// Adds `point` to the series called `name`, starting it if it is new.
fn add_point(series: &mut Vec<(String, Vec<(f64, f64)>)>, name: &str, point: (f64, f64)) {
    match series.iter_mut().find(|(s, _)| s == name) {
        Some((_, points)) => points.push(point),
        None => series.push((name.to_string(), vec![point])),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn row(nodes: usize, wall: f64, own: f64, bytes_raw: u64) -> Row {
        Row {
            nodes,
            variant: "agents, dynamic".into(),
            variant_index: 1,
            wall_seconds: wall,
            speedup: 1.0,
            search_fraction: 1.0,
            active_search_fraction: 1.0,
            agent_cpu_percent: 0.0,
            agent_own_cpu_seconds: own,
            idle_agent_cores: 0.0,
            agent_start_cpu_seconds: 0.0,
            machine_busy_seconds: 0.0,
            bytes_wire: 0,
            bytes_raw,
            mergers: 1,
            trace: RunTrace::default(),
        }
    }

    #[test]
    fn model_only_reads_the_compression_a_run_saved_and_nothing_else() {
        let c = Compression { bytes_per_second: 541.25e6, ratio: 15.7 };
        // As `cluster::run` writes it beside the runs.
        let saved = serde_json::json!({"serial_seconds": 1.0, "compression": Some(c), "runs": []});
        let text = serde_json::to_string(&saved).unwrap();
        assert_eq!(Compression::saved(&serde_json::from_str(&text).unwrap()), Some(c), "read back exactly: {text}");
        assert_eq!(Compression::saved(&serde_json::json!({"runs": []})), None, "saved before the rate was kept");
        let none: Option<Compression> = None;
        assert_eq!(Compression::saved(&serde_json::json!({"compression": none})), None, "a run without a recording");
        let broken = serde_json::json!({"compression": {"bytes_per_second": 0.0, "ratio": 15.7}});
        assert_eq!(Compression::saved(&broken), None, "no rate to charge by");
    }

    /// Costs with nothing charged yet, on 2 shared cores.
    fn two_shared_cores() -> Costs {
        Costs {
            link_bytes_per_second: 1e9,
            compress_bytes_per_second: 1e8,
            compress_ratio: 10.0,
            take_seconds: 0.0,
            shared_cores: Some(2),
            agent_own_cores: 0.0,
            agent_cpu_per_task: 0.0,
            agent_start_cpu: 0.0,
            rest_cpu_per_task: 0.0,
            fixed_seconds: 0.0,
        }
    }

    #[test]
    fn a_calibration_played_much_longer_than_measured_is_doubted_and_says_what_to_do() {
        assert_eq!(calibration_doubt(4, 2, 160.0, 161.8), None);
        assert_eq!(calibration_doubt(4, 2, 125.0, 100.0), None, "a quarter over is still played");
        let why = calibration_doubt(36, 2, 489.49, 50.81).expect("ten times too long");
        assert!(why.contains("36 nodes") && why.contains("489.5 s") && why.contains("50.8 s") && why.contains("--nodes 4,36"), "{why}");
    }

    #[test]
    fn the_agents_own_cpu_per_task_leaves_out_their_start_their_idle_cost_and_the_work_the_model_plays() {
        // 4 agents for 100 s used 30 CPU-s on themselves: 2 s of it parsing, 3 s
        // merging, 1 s in their part writer (of a 9 s write: the rest its BLAST+
        // programs'), 5 s compressing 500 MB at 100 MB/s, 2 s starting, and 0.01
        // cores each idle (4 CPU-s): 13 CPU-s over 2 tasks.
        let work = vec![BatchWork {
            fragments: vec![(1.0, 0, 1.5), (1.0, 0, 0.5)],
            whole: vec![],
            merge_seconds: 3.0,
            write_seconds: 9.0,
            write_own_seconds: 1.0,
            stats_ahead_seconds: 0.0,
        }];
        let dynamic = Arch::Agents { assign: Assign::Dynamic, compress: true };
        let cal = Row { agent_start_cpu_seconds: 2.0, ..row(4, 100.0, 30.0, 500_000_000) };
        let idle_group = Row { idle_agent_cores: 0.04, ..row(4, 100.0, 30.0, 0) };
        let runs = [cal.clone(), idle_group];
        let own = AgentOwn::calibrate(&cal, &runs, &work, dynamic, 1e8);
        assert!((own.per_task - 6.5).abs() < 1e-9, "{own:?}");
        assert!((own.idle_cores_each - 0.01).abs() < 1e-12);
        assert_eq!(own.rest_per_task, 0.0, "the machine's CPU was not measured");
        // Without compression its 5 s stay the agents' own.
        let plain = Arch::Agents { assign: Assign::Dynamic, compress: false };
        assert!((AgentOwn::calibrate(&cal, &runs, &work, plain, 1e8).per_task - 9.0).abs() < 1e-9);
        // Played at 36 nodes for 20 s, with that size's start of 9 CPU-s measured: the
        // same tasks, 9 × 2 = 18 CPU-s idle, 11 s for the model's own work.
        let big = Row { agent_start_cpu_seconds: 9.0, ..row(36, 20.0, 0.0, 500_000_000) };
        let base = two_shared_cores();
        let costs = own.costs(&big, &base);
        assert!((costs.agent_start_cpu - 0.25).abs() < 1e-12);
        assert!((modelled_own_cpu(&big, &work, dynamic, &costs, 20.0) - (11.0 + 13.0 + 9.0 + 7.2)).abs() < 1e-9);
        // Not for mpiBLAST, nor for a run saved before the agents' own CPU was kept.
        assert_eq!(AgentOwn::calibrate(&cal, &runs, &work, Arch::Mpiblast, 1e8), AgentOwn::default());
        assert_eq!(AgentOwn::calibrate(&row(4, 100.0, 0.0, 0), &runs, &work, dynamic, 1e8), AgentOwn::default());
        // Never below zero.
        assert_eq!(AgentOwn::calibrate(&row(4, 100.0, 1.0, 0), &runs, &work, dynamic, 1e8).per_task, 0.0);
    }

    #[test]
    fn the_rest_of_the_machine_is_what_it_was_busy_with_besides_the_agents_and_the_statistics_ahead() {
        use gepsea_blast::trace::BatchTrace;
        // 4 agents at 10 % for 100 s (40 CPU-s, their BLAST+ runs included), the master's
        // statistics runs ahead 8 CPU-s: of 60 CPU-s busy, 12 were the rest's.
        let ahead = |cpu| BatchTrace { stats_ahead_cpu_seconds: cpu, ..Default::default() };
        let trace = RunTrace { batches: vec![ahead(5.0), ahead(3.0)], ..Default::default() };
        let cal = Row { machine_busy_seconds: 60.0, agent_cpu_percent: 10.0, trace, ..row(4, 100.0, 30.0, 0) };
        assert_eq!(rest_of_machine_cpu(&cal), Some(12.0));
        // Over its 2 tasks, charged to every run played from it.
        let work = vec![BatchWork { fragments: vec![(1.0, 0, 0.0), (1.0, 0, 0.0)], ..Default::default() }];
        let dynamic = Arch::Agents { assign: Assign::Dynamic, compress: false };
        let own = AgentOwn::calibrate(&cal, std::slice::from_ref(&cal), &work, dynamic, 1e8);
        assert_eq!(own.rest_per_task, 6.0);
        let base = two_shared_cores();
        assert_eq!(own.costs(&row(36, 20.0, 0.0, 0), &base).rest_cpu_per_task, 6.0);
        // Not measured, or mpiBLAST (no agents to tell apart).
        assert_eq!(rest_of_machine_cpu(&Row { machine_busy_seconds: 0.0, ..cal.clone() }), None);
        assert_eq!(rest_of_machine_cpu(&Row { variant_index: 0, ..cal.clone() }), None);
        // Never below zero.
        assert_eq!(rest_of_machine_cpu(&Row { machine_busy_seconds: 30.0, ..cal }), Some(0.0));
    }

    #[test]
    fn the_agents_writes_are_played_as_cpu_time_where_the_trace_has_it() {
        use gepsea_blast::trace::{BatchTrace, TaskTrace};
        let task = |batch, fragment| TaskTrace { batch, fragment, seconds: 2.0, bytes: 10, ..Default::default() };
        let batch = |batch, wall, cpu, own| BatchTrace {
            batch,
            merge_seconds: 0.5,
            write_seconds: wall,
            write_cpu_seconds: cpu,
            write_thread_cpu_seconds: own,
            stats_ahead_seconds: 3.0,
            stats_ahead_cpu_seconds: 1.0,
            ..Default::default()
        };
        let trace = RunTrace {
            tasks: vec![task(0, Some(0)), task(0, Some(1)), task(1, Some(0)), task(1, None)],
            batches: vec![batch(0, 20.0, 2.5, 0.25), batch(1, 30.0, 3.5, 0.5)],
            ..Default::default()
        };
        let cpu = workload(&trace, times_for(Arch::Agents { assign: Assign::Dynamic, compress: true }));
        let writes = |w: &[BatchWork]| w.iter().map(|b| (b.write_seconds, b.stats_ahead_seconds, b.write_own_seconds)).collect::<Vec<_>>();
        assert_eq!(writes(&cpu), [(2.5, 1.0, 0.25), (3.5, 1.0, 0.5)]);
        assert_eq!((cpu[0].fragments.len(), cpu[1].fragments.len(), cpu[1].whole.len()), (2, 1, 1));
        // The mpiBLAST master's writes are played as they took on its critical path.
        assert_eq!(writes(&workload(&trace, times_for(Arch::Mpiblast))), [(20.0, 3.0, 0.25), (30.0, 3.0, 0.5)]);
        // A trace saved before CPU times were kept: wall times.
        let mut old = trace.clone();
        for b in &mut old.batches {
            (b.write_cpu_seconds, b.write_thread_cpu_seconds, b.stats_ahead_cpu_seconds) = (0.0, 0.0, 0.0);
        }
        assert_eq!(writes(&workload(&old, Times::Cpu)), [(20.0, 3.0, 0.0), (30.0, 3.0, 0.0)]);
    }

    #[test]
    fn an_idle_agent_s_cost_comes_from_the_largest_idle_group_measured() {
        assert_eq!(idle_agent_cores_each(&[row(36, 60.0, 30.0, 0)]), 0.0, "nothing measured");
        let idle = |nodes, cores| Row { idle_agent_cores: cores, ..row(nodes, 60.0, 30.0, 0) };
        let runs = [idle(4, 0.01), idle(36, 0.018), row(64, 60.0, 30.0, 0)];
        assert!((idle_agent_cores_each(&runs) - 0.0005).abs() < 1e-15);
    }
}
