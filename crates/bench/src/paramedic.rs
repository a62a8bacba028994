//! `gepsea-bench paramedic`: the ParaMEDIC paper's experiments at this machine's scale.
//!
//! Two sites as network namespaces ([`WanSites`]): a compute site of `--compute-nodes`
//! nodes on a bridge, a storage site of one node, joined through a router that
//! emulates the wide-area link: a token bucket per direction for the rate, and a
//! user-space NFQUEUE daemon (`gepsea-bench testbed delay`) for the one-way delay (this kernel
//! has no `netem`). TCP is tuned inside every node as for a long fat network (64 MiB
//! buffers, BBR, no cached metrics); the round-trip time is measured, not assumed.
//!
//! The same search (`mpirun` over the compute nodes, agents on) delivers its output to
//! the storage site in each variant:
//! - **direct**: the output itself, streamed over one TCP connection as soon as the
//!   search ends (through the same transfer code as ParaMEDIC, so the comparison is of
//!   bytes, not of implementations), optionally encrypted (Noise, ChaCha20-Poly1305);
//! - **remote file system**: the search writes its output into an `sshfs` mount of the
//!   storage node (SSH: always encrypted; its ≈2 MB channel window caps it per RTT);
//! - **zstd -3**: the output compressed by the generic plug-in, the middle of the
//!   trade-off (5× fewer bytes for ≈0.02 s at each end);
//! - **ParaMEDIC**: BLAST metadata, from which the storage site's `paramedic serve`
//!   regenerates the identical report from its replica, optionally encrypted;
//! - **auto**: `--ship auto`, each part the way the agent's model of the link says.
//!
//! With agents, the parts go as soon as each batch is final (ParaMEDIC's overlap), so
//! "delivery" and "storage site" seconds are work summed over parts, not wall time;
//! the end-to-end time is what shows the overlap. Both sites share this machine's
//! cores: the storage site runs with fewer CPU shares (`--storage-cpu-shares`, cgroup
//! v1), and the CPU seconds of each site are reported beside the wall time.
//!
//! Every run's output at the storage site is compared byte for byte with the output of
//! a search that shipped nothing (the reference run, measured in the same bench).
//! Reported: end-to-end time (launch to the output complete at the storage site),
//! ParaMEDIC's speed-up over each direct variant, the metadata reduction, regeneration
//! time relative to the search, and the break-even link rate below which ParaMEDIC wins.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gepsea_net::testbed::WanSites;
use serde::Serialize;
use serde_json::json;

use crate::workload::{run_ok, same_output, StorageMount, TempDir, Workload};

#[derive(clap::Args, Debug)]
pub struct ParamedicBenchArgs {
    #[command(flatten)]
    pub workload: Workload,
    /// Nodes of the compute site (one BLAST worker each; the master shares node 0).
    #[arg(long, default_value_t = 2)]
    pub compute_nodes: usize,
    /// BLAST output format (0, pairwise, is the bulky one ParaMEDIC is made for).
    #[arg(long, default_value = "0")]
    pub outfmt: String,
    /// One-way delays of the wide-area link, ms, comma-separated.
    #[arg(long, default_value = "0,10,50,100", value_delimiter = ',')]
    pub delays_ms: Vec<f64>,
    /// Rates of the wide-area link, Mbit/s, comma-separated.
    #[arg(long, default_value = "1000,100,10", value_delimiter = ',')]
    pub rates_mbit: Vec<u32>,
    /// Write results as JSON here; the plots go to the same directory.
    #[arg(long, default_value = "bench/out/paramedic.json")]
    pub json: PathBuf,
    /// Residues per query batch (`gepsea search --batch-residues`): smaller batches,
    /// more parts, each shipped as soon as it is final.
    #[arg(long)]
    pub batch_residues: Option<usize>,
    /// Replay the searches' BLAST+ runs from this recording instead of searching (the
    /// compute site's CPU then goes to formatting, shipping and the storage site; see
    /// `gepsea-bench cluster --replay`). If DIR holds no recording yet, the reference
    /// search records into it for real. Splits by fragments (the recording's layout).
    #[arg(long, value_name = "DIR")]
    pub replay: Option<PathBuf>,
    /// Only these variants, comma-separated (default: all): direct, direct-encrypted,
    /// remote-fs, zstd, paramedic, paramedic-encrypted, auto.
    #[arg(long, value_delimiter = ',')]
    pub variants: Vec<String>,
    /// CPU shares (cgroup v1 `cpu.shares`; a compute-site process has 1024) of the
    /// storage site, which shares this machine's cores with the compute site: lower
    /// keeps its regeneration from starving the search.
    #[arg(long, default_value_t = 256)]
    pub storage_cpu_shares: u64,
    /// Only the reference search (with `--replay` and no recording yet: record it and
    /// stop), so that recordings can be made on a quiet machine ahead of the runs.
    #[arg(long)]
    pub reference_only: bool,
    /// BLAST+ options for every search, after `--` (e.g. `-- -max_target_seqs 100`).
    #[arg(last = true, allow_hyphen_values = true)]
    pub blast_args: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Ship {
    Direct,
    RemoteFs,
    Zstd,
    Paramedic,
    /// `--ship auto`: per part, from the measured link.
    Auto,
}

struct Variant {
    name: &'static str,
    ship: Ship,
    encrypted: bool,
}

impl Variant {
    /// Its name on the command line (`--variants`).
    fn key(&self) -> &'static str {
        match (self.ship, self.encrypted) {
            (Ship::Direct, false) => "direct",
            (Ship::Direct, true) => "direct-encrypted",
            (Ship::RemoteFs, _) => "remote-fs",
            (Ship::Zstd, _) => "zstd",
            (Ship::Paramedic, false) => "paramedic",
            (Ship::Paramedic, true) => "paramedic-encrypted",
            (Ship::Auto, _) => "auto",
        }
    }
}

const VARIANTS: [Variant; 7] = [
    Variant { name: "direct", ship: Ship::Direct, encrypted: false },
    Variant { name: "direct, encrypted", ship: Ship::Direct, encrypted: true },
    Variant { name: "remote FS (sshfs, encrypted)", ship: Ship::RemoteFs, encrypted: true },
    Variant { name: "zstd -3", ship: Ship::Zstd, encrypted: false },
    Variant { name: "ParaMEDIC", ship: Ship::Paramedic, encrypted: false },
    Variant { name: "ParaMEDIC, encrypted", ship: Ship::Paramedic, encrypted: true },
    Variant { name: "auto", ship: Ship::Auto, encrypted: false },
];

/// One measured run.
#[derive(Clone, Debug, Serialize)]
struct Row {
    rate_mbit: u32,
    delay_ms: f64,
    rtt_ms: f64,
    variant: &'static str,
    encrypted: bool,
    /// Launch to the end of `mpirun` (the output is complete at the storage site by then).
    wall_seconds: f64,
    /// Launch to the output complete at the storage site (its modification time).
    complete_seconds: f64,
    /// The search itself (inside `gepsea search`, before shipping).
    search_seconds: f64,
    /// Encoding and transfer, including the storage site's work (not for the remote
    /// file system, where the search writes through the mount).
    delivery_seconds: Option<f64>,
    shipped_bytes: Option<u64>,
    /// Checking, regenerating and writing at the storage site.
    storage_seconds: Option<f64>,
    encode_seconds: Option<f64>,
    /// CPU seconds spent at each site during the run (the compute site: every process
    /// under `mpirun`; the storage site: its server and its BLAST+ runs).
    compute_cpu_seconds: f64,
    storage_cpu_seconds: f64,
    /// Parts shipped (1: the whole output once the search was over).
    objects: Option<u64>,
    /// `--ship auto`: parts per encoding.
    chosen: Option<serde_json::Value>,
}

/// Child processes killed when the bench ends, however it ends.
struct Children(Vec<Child>);
impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

const PLAIN_PORT: u16 = 7500;
const KEYED_PORT: u16 = 7501;
const RTT_PORT: u16 = 7600;

/// Median round-trip time between compute node 0 and the storage node, ms.
fn measure_rtt(sites: &WanSites, tools: &Path) -> Result<f64> {
    let at = format!("{}:{RTT_PORT}", sites.storage_ip);
    let listener = Children(vec![sites.storage_cmd(tools).args(["testbed", "rtt", "--count", "7", "--listen", &at]).spawn()?]);
    std::thread::sleep(Duration::from_millis(200));
    let o = run_ok(sites.compute.cmd(0, tools).args(["testbed", "rtt", "--count", "7", "--to", &at]))?;
    drop(listener);
    Ok(String::from_utf8_lossy(&o.stdout).trim().parse()?)
}

pub fn run(a: &ParamedicBenchArgs) -> Result<()> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench paramedic builds network namespaces: run it as root");
    }
    if a.compute_nodes < 1 {
        bail!("--compute-nodes must be at least 1");
    }
    if let Some(bad) = a.variants.iter().find(|n| !VARIANTS.iter().any(|v| v.key() == n.as_str())) {
        bail!("--variants: no variant {bad:?} (there are {})", VARIANTS.iter().map(|v| v.key()).collect::<Vec<_>>().join(", "));
    }
    let gepsea = crate::net::sibling("gepsea")?;
    let tools = std::env::current_exe()?;
    let dir = TempDir(std::env::temp_dir().join(format!("gepsea-bench-paramedic-{}", std::process::id())));
    let d = &dir.0;
    for sub in ["local", "at-storage/plain", "at-storage/keyed"] {
        std::fs::create_dir_all(d.join(sub))?;
    }
    a.workload.prepare(&gepsea, d)?;
    if let Some(rec) = &a.replay {
        keep_recorded_database(rec, &d.join("g"))?;
    }
    // The storage site's replica: the same database files, its own copy.
    run_ok(Command::new("cp").arg("-a").arg(d.join("g")).arg(d.join("replica")))?;
    run_ok(Command::new(&gepsea).args(["paramedic", "keygen", "--out"]).arg(d.join("key")))?;

    let sites = WanSites::new("pmb", a.compute_nodes).context("building the two sites")?;
    sites.sysctl_nodes(&[
        "net.ipv4.tcp_rmem=4096 131072 67108864",
        "net.ipv4.tcp_wmem=4096 16384 67108864",
        "net.ipv4.tcp_no_metrics_save=1",
        "net.ipv4.tcp_congestion_control=bbr",
    ])?;
    let storage_addr = |port: u16| format!("{}:{port}", sites.storage_ip);
    let mut servers = Children(Vec::new());
    for (port, out, keyed) in [(PLAIN_PORT, "plain", false), (KEYED_PORT, "keyed", true)] {
        let mut c = sites.storage_cmd(&gepsea);
        c.args(["paramedic", "serve", "--listen", &storage_addr(port), "--db"])
            .arg(d.join("replica"))
            .arg("--out")
            .arg(d.join("at-storage").join(out));
        if keyed {
            c.arg("--key").arg(d.join("key"));
        }
        c.stderr(std::fs::File::create(d.join(format!("serve-{out}.log")))?);
        servers.0.push(c.spawn().context("starting the storage site")?);
    }
    let server_pids: Vec<u32> = servers.0.iter().map(|c| c.id()).collect();
    // Both sites share this machine's cores: the storage site gets fewer CPU shares, so
    // that regenerating does not starve the search (as it would not on its own host).
    let storage_group = CpuGroup::new(&format!("gepsea-bench-storage-{}", std::process::id()), a.storage_cpu_shares, &server_pids);
    let mount = StorageMount::new(&sites.storage_ns, &sites.storage_ip, &sites.compute.ns[0], d)?;
    let export = d.join("storage-export");
    let subnet = sites.compute.subnet();
    let slots: Vec<usize> = (0..a.compute_nodes).map(|i| if i == 0 { 2 } else { 1 }).collect();
    let mut runs = 0usize;

    // One search under mpirun, delivering as `ship` says; returns the wall time, the
    // summary, where the output must now be and the CPU seconds of each site.
    let mut search = |ship: Option<&Variant>| -> Result<(f64, serde_json::Value, PathBuf, (f64, f64))> {
        runs += 1;
        let name = format!("run{runs}.out");
        let out = match ship {
            Some(v) if v.ship == Ship::RemoteFs => mount.mountpoint.join(&name),
            _ => d.join("local").join(&name),
        };
        let summary = d.join("summary.json");
        let _ = std::fs::remove_file(&summary);
        let mut c = sites.compute.mpirun(d, &slots, a.compute_nodes + 1)?;
        c.arg(&gepsea).args(["search", "--quiet", "--outfmt", &a.outfmt, "--db"]).arg(d.join("g")).arg("--query").arg(d.join("q.fasta"));
        c.arg("--out")
            .arg(&out)
            .arg("--rendezvous")
            .arg(d.join(format!("rv{runs}")))
            .args(["--agent-net", &subnet, "--nodes", &a.compute_nodes.to_string()])
            .arg("--summary-json")
            .arg(&summary);
        if let Some(r) = a.batch_residues {
            c.args(["--batch-residues", &r.to_string()]);
        }
        if let Some(dir) = &a.replay {
            // The reference run records when there is nothing to replay yet.
            let recorded = std::fs::read_dir(dir.join("runs")).is_ok_and(|mut d| d.next().is_some());
            c.args(["--split", "fragments"]).arg(if ship.is_none() && !recorded { "--record" } else { "--replay" }).arg(dir);
        }
        let mut at_storage = out.clone();
        if let Some(v) = ship.filter(|v| v.ship != Ship::RemoteFs) {
            c.args(["--storage-site", &storage_addr(if v.encrypted { KEYED_PORT } else { PLAIN_PORT })]);
            if v.encrypted {
                c.arg("--storage-key").arg(d.join("key"));
            }
            c.args([
                "--ship",
                match v.ship {
                    Ship::Paramedic => "metadata",
                    Ship::Auto => "auto",
                    Ship::Zstd => "zstd",
                    _ => "output",
                },
            ]);
            at_storage = d.join("at-storage").join(if v.encrypted { "keyed" } else { "plain" }).join(&name);
        } else if ship.is_some() {
            at_storage = export.join(&name);
        }
        if !a.blast_args.is_empty() {
            c.arg("--").args(&a.blast_args);
        }
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let storage_cpu = || server_pids.iter().filter_map(|&p| crate::procstat::cpu_seconds(p, true)).sum::<f64>();
        let (compute0, storage0) = (children_cpu_seconds(), storage_cpu());
        let launched = std::time::SystemTime::now();
        let t = Instant::now();
        let o = c.output()?;
        let wall = t.elapsed().as_secs_f64();
        let cpu = (children_cpu_seconds() - compute0, storage_cpu() - storage0);
        if !o.status.success() {
            bail!(
                "{}: mpirun failed: {}{}",
                ship.map_or("reference", |v| v.name),
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let mut s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary)?)?;
        // When the output was complete where it is needed (its last write: it is renamed
        // into place complete), from the launch: free of `mpirun`'s tear-down, which
        // varies by seconds from run to run here.
        let complete = std::fs::metadata(&at_storage)?.modified()?;
        s["bench_complete_seconds"] = complete.duration_since(launched).map_or(0.0, |d| d.as_secs_f64()).into();
        Ok((wall, s, at_storage, cpu))
    };

    // The reference: the same search, delivering nothing.
    let (ref_wall, ref_summary, reference, _) = search(None)?;
    let output_bytes = std::fs::metadata(&reference)?.len();
    let ref_search = ref_summary["wall_seconds"].as_f64().unwrap_or(0.0);
    eprintln!(
        "bench paramedic: {} queries, outfmt {}, {} fragments, {} compute node(s) + 1 storage node; the reference search (nothing shipped): {ref_wall:.2} s end to end, {ref_search:.2} s searching, {:.2} MB of output",
        a.workload.queries,
        a.outfmt,
        a.workload.fragments,
        a.compute_nodes,
        output_bytes as f64 / 1e6
    );

    let mut rows: Vec<Row> = Vec::new();
    let rates: &[u32] = if a.reference_only { &[] } else { &a.rates_mbit };
    for &rate in rates {
        sites.set_rate(rate)?;
        for &delay in &a.delays_ms {
            let _daemon = if delay > 0.0 {
                let daemon = Children(vec![sites
                    .router_cmd(&tools)
                    .args(["testbed", "delay", "--queue", "0", "--delay-ms", &delay.to_string()])
                    .spawn()
                    .context("starting the delay daemon")?]);
                std::thread::sleep(Duration::from_millis(300));
                sites.queue_wan_traffic(Some(0))?;
                Some(daemon)
            } else {
                None
            };
            let rtt = measure_rtt(&sites, &tools)?;
            eprintln!("  link {rate} Mbit/s, one-way delay {delay} ms: measured RTT {rtt:.2} ms");
            for v in VARIANTS.iter().filter(|v| a.variants.is_empty() || a.variants.iter().any(|n| n == v.key())) {
                let (wall, s, at_storage, (compute_cpu, storage_cpu)) = search(Some(v))?;
                if !same_output(&at_storage, &reference)? {
                    bail!("{rate} Mbit/s, {delay} ms, {}: the output at the storage site differs from the reference run's", v.name);
                }
                let ship = &s["delivery"];
                let f = |v: &serde_json::Value| v.as_f64();
                let row = Row {
                    rate_mbit: rate,
                    delay_ms: delay,
                    rtt_ms: rtt,
                    variant: v.name,
                    encrypted: v.encrypted,
                    wall_seconds: wall,
                    complete_seconds: s["bench_complete_seconds"].as_f64().unwrap_or(f64::NAN),
                    search_seconds: s["wall_seconds"].as_f64().unwrap_or(0.0),
                    delivery_seconds: f(&ship["encode_seconds"]).zip(f(&ship["transfer_seconds"])).map(|(e, t)| e + t),
                    shipped_bytes: ship["bytes"].as_u64(),
                    storage_seconds: f(&ship["storage_seconds"]),
                    encode_seconds: f(&ship["encode_seconds"]),
                    compute_cpu_seconds: compute_cpu,
                    storage_cpu_seconds: storage_cpu,
                    objects: ship["objects"].as_u64(),
                    chosen: ship.get("chosen").filter(|c| c.as_object().is_some_and(|o| !o.is_empty())).cloned(),
                };
                let opt = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2} s"));
                eprintln!(
                    "    {:<30} {wall:6.2} s end to end, output complete at {:.2} s (search {:.2} s, delivery {}, storage site {}), {} bytes shipped in {} object(s){}; CPU {:.1} s compute site, {:.1} s storage site; identical at the storage site",
                    v.name,
                    row.complete_seconds,
                    row.search_seconds,
                    opt(row.delivery_seconds),
                    opt(row.storage_seconds),
                    row.shipped_bytes.map_or("-".to_string(), |b| b.to_string()),
                    row.objects.unwrap_or(0),
                    row.chosen.as_ref().map_or(String::new(), |c| format!(" (auto: {c})")),
                    row.compute_cpu_seconds,
                    row.storage_cpu_seconds,
                );
                rows.push(row);
                let _ = std::fs::remove_file(&at_storage);
            }
            sites.queue_wan_traffic(None)?;
        }
    }
    drop(mount);
    // Killed, the storage sites cannot remove their gepsea-net runtime directories.
    drop(servers);
    drop(storage_group);
    for pid in server_pids {
        let _ = std::fs::remove_dir_all(gepsea_net::namespace_dir(&format!("paramedic-storage{pid}")));
    }
    drop(sites);
    let _ = std::fs::remove_file(&reference);
    if a.reference_only {
        return Ok(());
    }
    report(a, &rows, output_bytes, ref_search)
}

/// A recording is of one formatted database, and a database's files carry the minute
/// they were formatted (so replay refuses another formatting of the same sequences):
/// the recording keeps the database it was made on as `REC/database`, and later runs
/// search that copy instead of the one they formatted.
fn keep_recorded_database(rec: &Path, formatted: &Path) -> Result<()> {
    let kept = rec.join("database");
    if kept.join("manifest.json").exists() {
        std::fs::remove_dir_all(formatted)?;
        run_ok(Command::new("cp").arg("-a").arg(&kept).arg(formatted)).map(drop)
    } else {
        let _ = std::fs::remove_dir_all(&kept);
        std::fs::create_dir_all(rec)?;
        run_ok(Command::new("cp").arg("-a").arg(formatted).arg(&kept)).map(drop)
    }
}

/// CPU seconds of this process's reaped descendants (everything under `mpirun`).
fn children_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// A cgroup (v1 `cpu` controller) with the given CPU shares holding `pids` and, as they
/// are forked, their children; removed when dropped (after its processes are gone).
/// Where cgroups cannot be made, the bench says so and goes on without.
struct CpuGroup(Option<PathBuf>);

impl CpuGroup {
    fn new(name: &str, shares: u64, pids: &[u32]) -> CpuGroup {
        let dir = Path::new("/sys/fs/cgroup/cpu").join(name);
        let made = std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::write(dir.join("cpu.shares"), shares.to_string()))
            .and_then(|_| pids.iter().try_for_each(|p| std::fs::write(dir.join("cgroup.procs"), p.to_string())));
        match made {
            Ok(()) => CpuGroup(Some(dir)),
            Err(e) => {
                eprintln!(
                    "bench paramedic: cannot give the storage site {shares} CPU shares ({}: {e}); it competes with the search as an equal",
                    dir.display()
                );
                let _ = std::fs::remove_dir(&dir);
                CpuGroup(None)
            }
        }
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn report(a: &ParamedicBenchArgs, rows: &[Row], output_bytes: u64, ref_search: f64) -> Result<()> {
    let wall = |rate: u32, delay: f64, variant: &str| {
        rows.iter().find(|r| r.rate_mbit == rate && r.delay_ms == delay && r.variant == variant).map(|r| r.complete_seconds)
    };
    println!("\n| link | one-way delay | RTT | variant | output complete s | end to end s | search s | delivery s | storage site s | bytes shipped | objects | CPU s compute / storage | ParaMEDIC speed-up |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        // ParaMEDIC (same encryption) against this row's way of delivering.
        let pm = wall(r.rate_mbit, r.delay_ms, if r.encrypted { "ParaMEDIC, encrypted" } else { "ParaMEDIC" });
        let speedup = match (r.variant.starts_with("ParaMEDIC"), pm) {
            (false, Some(pm)) => format!("{:.2}×", r.complete_seconds / pm),
            _ => String::new(),
        };
        let opt = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}"));
        println!(
            "| {} Mbit/s | {} ms | {:.1} ms | {} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {}{} | {:.1} / {:.1} | {speedup} |",
            r.rate_mbit,
            r.delay_ms,
            r.rtt_ms,
            r.variant,
            r.complete_seconds,
            r.wall_seconds,
            r.search_seconds,
            opt(r.delivery_seconds),
            opt(r.storage_seconds),
            r.shipped_bytes.map_or("-".to_string(), |b| b.to_string()),
            r.objects.map_or("-".to_string(), |n| n.to_string()),
            r.chosen.as_ref().map_or(String::new(), |c| format!(" {c}")),
            r.compute_cpu_seconds,
            r.storage_cpu_seconds,
        );
    }
    let pm_rows: Vec<&Row> = rows.iter().filter(|r| r.variant.starts_with("ParaMEDIC")).collect();
    let meta = median(pm_rows.iter().filter_map(|r| r.shipped_bytes.map(|b| b as f64)).collect());
    let regen = median(pm_rows.iter().filter_map(|r| r.storage_seconds).collect());
    let encode = median(pm_rows.iter().filter_map(|r| r.encode_seconds).collect());
    // ParaMEDIC wins when the link needs longer for the bytes it saves than encoding
    // and regeneration take: (D − x) / B > f + g.
    let break_even_mbit = (output_bytes as f64 - meta) * 8.0 / 1e6 / (encode + regen);
    let z: Vec<&Row> = rows.iter().filter(|r| r.variant == "zstd -3").collect();
    let (zx, zfg) = (
        median(z.iter().filter_map(|r| r.shipped_bytes.map(|b| b as f64)).collect()),
        median(z.iter().filter_map(|r| Some(r.encode_seconds? + r.storage_seconds?)).collect()),
    );
    let break_even_zstd_mbit = (zx - meta) * 8.0 / 1e6 / (encode + regen - zfg).max(1e-9);
    // The break-even needs ParaMEDIC's measured costs (and zstd's): only when they ran.
    if !pm_rows.is_empty() {
        println!(
            "\nmetadata: {meta:.0} bytes for {output_bytes} bytes of output ({:.0}× smaller); encoding {encode:.2} s; regeneration at the storage site {regen:.2} s = {:.2}× the search ({ref_search:.2} s)",
            output_bytes as f64 / meta,
            regen / ref_search
        );
        println!("break-even: ParaMEDIC beats sending the output where the link delivers less than {break_even_mbit:.1} Mbit/s end to end ((D − x)·8 / (f + g))");
    }
    if !pm_rows.is_empty() && !z.is_empty() {
        println!(
            "break-even: ParaMEDIC beats zstd -3 ({zx:.0} bytes, {zfg:.2} s of work at both ends) below {break_even_zstd_mbit:.1} Mbit/s"
        );
    }
    let out_dir = a.json.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
    crate::out::json(
        &a.json,
        &json!({
            "queries": a.workload.queries, "queries_from_db": a.workload.queries_from_db, "fragments": a.workload.fragments,
            "compute_nodes": a.compute_nodes, "outfmt": a.outfmt, "blast_args": a.blast_args, "batch_residues": a.batch_residues,
            "replayed": a.replay.is_some(), "storage_cpu_shares": a.storage_cpu_shares,
            "output_bytes": output_bytes, "metadata_bytes": meta, "reference_search_seconds": ref_search,
            "encode_seconds": encode, "regenerate_seconds": regen, "break_even_mbit": break_even_mbit, "break_even_vs_zstd_mbit": break_even_zstd_mbit,
            "tcp": "BBR, 64 MiB buffers", "runs": rows,
        }),
    )?;
    for &rate in &a.rates_mbit {
        let series: Vec<(String, Vec<(f64, f64)>)> = VARIANTS
            .iter()
            .map(|v| {
                (
                    v.name.to_string(),
                    rows.iter().filter(|r| r.rate_mbit == rate && r.variant == v.name).map(|r| (r.delay_ms, r.complete_seconds)).collect(),
                )
            })
            .filter(|(_, pts): &(String, Vec<(f64, f64)>)| !pts.is_empty())
            .collect();
        crate::plots::lines(
            &out_dir.join(format!("paramedic_wall_{rate}mbit.png")),
            &format!("Launch to output complete at the storage site (s), {rate} Mbit/s"),
            "one-way delay (ms)",
            &series,
        )?;
    }
    let mut speedups = Vec::new();
    for &rate in &a.rates_mbit {
        for (base, pm) in [
            ("direct, encrypted", "ParaMEDIC, encrypted"),
            ("remote FS (sshfs, encrypted)", "ParaMEDIC, encrypted"),
            ("zstd -3", "ParaMEDIC"),
        ] {
            let pts = a.delays_ms.iter().filter_map(|&dl| Some((dl, wall(rate, dl, base)? / wall(rate, dl, pm)?))).collect();
            speedups.push((format!("{rate} Mbit/s, vs {base}"), pts));
        }
    }
    speedups.retain(|(_, pts): &(String, Vec<(f64, f64)>)| !pts.is_empty());
    if !speedups.is_empty() {
        crate::plots::lines(&out_dir.join("paramedic_speedup.png"), "ParaMEDIC speed-up", "one-way delay (ms)", &speedups)?;
    }
    eprintln!("bench paramedic: JSON {} and plots paramedic_*.png in {}", a.json.display(), out_dir.display());
    Ok(())
}
