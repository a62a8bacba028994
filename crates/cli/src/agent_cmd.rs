//! `gepsea agent` and `gepsea agent status`: parse options (flags over `--config`
//! file over defaults), then hand over to `gepsea_agent::server`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::logging::{emit, say};
use clap::{Args, Subcommand};
use gepsea_agent::server::{Agent, AgentConfig, Shutdown};
use gepsea_net::tcp::{BufferSetting, TcpChecksums};
use serde::Deserialize;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AgentArgs {
    #[command(subcommand)]
    pub action: Option<AgentAction>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand)]
pub enum AgentAction {
    /// Print a running agent's configuration, peers, processes and component state.
    Status(StatusArgs),
}

#[derive(Args)]
pub struct StatusArgs {
    /// Node whose agent to ask.
    #[arg(long, env = "GEPSEA_NODE", default_value_t = 1)]
    node_id: u32,
    #[arg(long, env = "GEPSEA_NAMESPACE", default_value = "gepsea")]
    namespace: String,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Default)]
pub struct RunArgs {
    /// This node's id (unique among the agents).
    #[arg(long, env = "GEPSEA_NODE")]
    node_id: Option<u32>,
    /// Isolates unrelated runs on one machine (default `gepsea`; 1 to 40 letters, digits, `-`, `_` or `.`).
    #[arg(long, env = "GEPSEA_NAMESPACE")]
    namespace: Option<String>,
    /// TCP address other agents connect to (e.g. 10.0.0.5:7400; port 0: any).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Shared directory where agents publish their address and find each other.
    #[arg(long, conflicts_with = "peers")]
    rendezvous: Option<PathBuf>,
    /// Every agent, as ID=HOST:PORT or HOST:PORT (then the ID is the 1-based position).
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Number of agents; the agent reports ready (and clients start) once all are up.
    #[arg(long)]
    nodes: Option<usize>,
    /// TOML file with any of these options (flags win).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Pin the agent to this core (e.g. a spare one).
    #[arg(long)]
    cpu: Option<usize>,
    /// Declare a peer dead after its link was down this long (ms); a peer whose host
    /// goes silent (no FIN, nothing answers) loses its link after as long again.
    #[arg(long)]
    peer_timeout_ms: Option<u64>,
    /// Bytes of the distributed data cache on this node.
    #[arg(long)]
    cache_bytes: Option<usize>,
    /// Bytes of global memory this node lends.
    #[arg(long)]
    gma_bytes: Option<u64>,
    /// Job threads for plug-ins and engines.
    #[arg(long)]
    jobs: Option<usize>,
    /// A file with the job's secret (at least 16 bytes, mode 0600): agents on other
    /// nodes must prove they hold the same one before anything they send is accepted.
    #[arg(long, env = "GEPSEA_KEY_FILE")]
    key_file: Option<PathBuf>,
    /// Encrypt links to other agents (Noise, keyed by --key-file); every agent of the
    /// job must agree.
    #[arg(long, env = "GEPSEA_ENCRYPT")]
    encrypt: bool,
    /// Connections on the registration socket at once (default 1024); more are refused.
    #[arg(long, env = "GEPSEA_MAX_SESSIONS")]
    max_sessions: Option<usize>,
    /// Run the links to other agents under this TCP congestion control (e.g. cubic,
    /// reno, bbr) instead of the system's default (application processes read the same
    /// variable). Useful where hosts default to bbr, which slows a cluster's bursts.
    #[arg(long, value_name = "NAME", env = "GEPSEA_TCP_CONGESTION")]
    tcp_congestion: Option<String>,
    /// Kernel buffers of each link to another agent, each way (default 4MiB; e.g.
    /// 16MiB, 8MB, 4194304), or `auto` for the kernel's own sizing: for links across a
    /// wide area, whose bandwidth-delay product exceeds twice the size. A size above the
    /// system's net.core.rmem_max or wmem_max leaves the links to the kernel as well.
    #[arg(long, value_name = "SIZE|auto", env = "GEPSEA_TCP_BUFFER", value_parser = parse_tcp_buffer)]
    tcp_buffer: Option<BufferSetting>,
    /// What the links to other agents checksum: `full` (default: every header and
    /// payload, CRC32C), or `headers`, which trusts TCP's own checksum for data payloads
    /// on each link whose other end says the same (a pass over every byte on each side
    /// saved, for sites that trust their network and hosts; application processes read
    /// the same variable).
    #[arg(long, value_name = "full|headers", env = "GEPSEA_TCP_CHECKSUMS")]
    tcp_checksums: Option<TcpChecksums>,
    #[command(flatten)]
    storage: StorageArgs,
}

/// ParaMEDIC's storage site, served by this agent (`paramedic-storage` plug-in).
#[derive(Args, Default)]
pub struct StorageArgs {
    /// Be a ParaMEDIC storage site: take shipped outputs, parts and metadata on this TCP
    /// address (what compute sites give as `gepsea search --storage-site`).
    #[arg(long, requires = "storage_out", help_heading = "Storage site")]
    storage_listen: Option<SocketAddr>,
    /// Where the storage site writes the reports it receives and regenerates.
    #[arg(long, requires = "storage_listen", help_heading = "Storage site")]
    storage_out: Option<PathBuf>,
    /// This site's replica of the database (to regenerate BLAST metadata).
    #[arg(long, requires = "storage_listen", help_heading = "Storage site")]
    storage_db: Option<PathBuf>,
    /// Accept only transfers encrypted under this key (`gepsea paramedic keygen`).
    #[arg(long, requires = "storage_listen", help_heading = "Storage site")]
    storage_key: Option<PathBuf>,
    /// BLAST+ processes at once per regeneration (default: this machine's cores).
    #[arg(long, requires = "storage_listen", help_heading = "Storage site")]
    storage_threads: Option<usize>,
    /// Objects (parts) the storage site checks and regenerates at once, each on a
    /// thread of its own.
    #[arg(long, requires = "storage_listen", help_heading = "Storage site", default_value_t = paramedic::storage::DEFAULT_OBJECTS_AT_ONCE, value_parser = clap::value_parser!(u64).range(1..=256))]
    storage_objects_at_once: u64,
}

/// Starts the storage site's plug-in, if asked for.
fn storage_site(a: &StorageArgs) -> Result<Option<std::sync::Arc<paramedic::storage::StoragePlugin>>> {
    let (Some(listen), Some(out)) = (a.storage_listen, &a.storage_out) else { return Ok(None) };
    if let Some(db) = &a.storage_db {
        gepsea_blast::db::open(db).with_context(|| format!("--storage-db {}", db.display()))?;
    }
    let key = match &a.storage_key {
        Some(k) => Some(paramedic::transfer::Key::read(k)?),
        None => None,
    };
    let cfg = paramedic::storage::StorageConfig {
        listen,
        out: out.clone(),
        replica: a.storage_db.clone(),
        key,
        threads: a.storage_threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1),
        max_object: paramedic::transfer::DEFAULT_MAX_OBJECT,
        objects_at_once: a.storage_objects_at_once as usize,
    };
    let p = paramedic::storage::StoragePlugin::start(cfg).with_context(|| format!("storage site on --storage-listen {listen}"))?;
    say!("gepsea agent: storage site listening on {}, writing to {}", p.listen_addr(), out.display());
    Ok(Some(std::sync::Arc::new(p)))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileConfig {
    node_id: Option<u32>,
    namespace: Option<String>,
    listen: Option<SocketAddr>,
    rendezvous: Option<PathBuf>,
    peers: Option<Vec<String>>,
    nodes: Option<usize>,
    cpu: Option<usize>,
    peer_timeout_ms: Option<u64>,
    cache_bytes: Option<usize>,
    gma_bytes: Option<u64>,
    jobs: Option<usize>,
    key_file: Option<PathBuf>,
    encrypt: Option<bool>,
    max_sessions: Option<usize>,
    tcp_congestion: Option<String>,
    tcp_buffer: Option<FileTcpBuffer>,
    tcp_checksums: Option<String>,
}

/// `--tcp-buffer`: the setting, or what is wrong with it (clap names the value).
fn parse_tcp_buffer(s: &str) -> Result<BufferSetting, String> {
    s.parse().map_err(|problem: gepsea_net::tcp::BufferSettingError| problem.to_string())
}

/// Setting `key` of a `--config` file, read as its flag reads it; an error names the
/// key and the value.
fn file_setting<T: std::str::FromStr>(key: &str, value: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    value.parse().map_err(|problem| anyhow::anyhow!("{key} in --config: {value:?}: {problem}"))
}

/// `tcp-buffer` in a `--config` file: a number of bytes, or "auto".
#[derive(Deserialize)]
#[serde(untagged)]
enum FileTcpBuffer {
    Bytes(usize),
    Word(String),
}
fn parse_peers(list: &[String]) -> Result<Vec<(u32, SocketAddr)>> {
    list.iter()
        .enumerate()
        .map(|(i, p)| {
            let (id, addr) = match p.split_once('=') {
                Some((id, a)) => (id.parse::<u32>().with_context(|| format!("--peers entry {p:?}: {id:?} is not a node id"))?, a),
                None => (i as u32 + 1, p.as_str()),
            };
            let addr = addr
                .parse::<SocketAddr>()
                .with_context(|| format!("--peers entry {p:?}: {addr:?} is not HOST:PORT (an IP address and port)"))?;
            Ok((id, addr))
        })
        .collect()
}

fn pin(cpu: usize) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let which = format!("this process may run on {cores} core(s); cores are numbered from 0");
    // CPU_SET panics past the set's 1,024 bits; the kernel refuses cores it lacks with
    // a bare EINVAL. Say which cores there are instead.
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        bail!("--cpu {cpu}: no such core ({which})");
    }
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it (cpu is in range, checked
    // above); sched_setaffinity reads it for the calling thread, which every later
    // thread inherits.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!("--cpu {cpu}: {} ({which})", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

pub fn config(a: &RunArgs) -> Result<(AgentConfig, Option<usize>)> {
    let f: FileConfig = match &a.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading --config {}", p.display()))?;
            toml::from_str(&text).with_context(|| format!("in --config {}", p.display()))?
        }
        None => FileConfig::default(),
    };
    let node = a.node_id.or(f.node_id).unwrap_or(1);
    let namespace = a.namespace.clone().or(f.namespace).unwrap_or_else(|| "gepsea".into());
    let mut c = AgentConfig::new(node, &namespace);
    c.listen = a.listen.or(f.listen);
    c.rendezvous = a.rendezvous.clone().or(f.rendezvous);
    let peers = if a.peers.is_empty() { f.peers.unwrap_or_default() } else { a.peers.clone() };
    c.peers = parse_peers(&peers)?;
    if !c.peers.is_empty() && c.rendezvous.is_some() {
        bail!("give either --rendezvous or --peers, not both");
    }
    if let Some((_, a)) = c.peers.iter().find(|(n, _)| *n == node) {
        if c.listen.is_none() {
            c.listen = Some(*a);
        }
    }
    if (!c.peers.is_empty() || c.rendezvous.is_some()) && c.listen.is_none() {
        bail!("agents on other nodes need an address to reach this one: give --listen HOST:PORT");
    }
    c.nodes = a.nodes.or(f.nodes).or(if c.peers.is_empty() { None } else { Some(c.peers.len().max(1)) });
    if let Some(ms) = a.peer_timeout_ms.or(f.peer_timeout_ms) {
        c.peer_timeout = Duration::from_millis(ms);
    }
    if let Some(b) = a.cache_bytes.or(f.cache_bytes) {
        c.cache_bytes = b;
    }
    if let Some(b) = a.gma_bytes.or(f.gma_bytes) {
        c.gma_bytes = b;
    }
    if let Some(m) = a.max_sessions.or(f.max_sessions) {
        c.max_sessions = m.max(1);
    }
    if let Some(j) = a.jobs.or(f.jobs) {
        c.jobs = j;
    }
    if let Some(k) = a.key_file.clone().or(f.key_file) {
        c.key = Some(gepsea_net::auth::Key::from_file(&k)?);
    }
    // As `PortConfig` takes `GEPSEA_TCP_CONGESTION`: trimmed, and empty is unset.
    c.tcp_congestion = a.tcp_congestion.clone().or(f.tcp_congestion).map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    let file_buffer = f
        .tcp_buffer
        .map(|b| match b {
            FileTcpBuffer::Bytes(n) => file_setting::<BufferSetting>("tcp-buffer", &n.to_string()),
            FileTcpBuffer::Word(w) => file_setting("tcp-buffer", &w),
        })
        .transpose()?;
    if let Some(b) = a.tcp_buffer.or(file_buffer) {
        c.tcp_buffer = b.0;
    }
    // The flag over the file: the file's value is only read without the flag.
    let checksums = match a.tcp_checksums {
        Some(setting) => Some(setting),
        None => f.tcp_checksums.map(|w| file_setting::<TcpChecksums>("tcp-checksums", &w)).transpose()?,
    };
    if let Some(setting) = checksums {
        c.tcp_checksums = setting;
    }
    c.encrypt = a.encrypt || f.encrypt.unwrap_or(false);
    if c.encrypt && c.key.is_none() {
        bail!("--encrypt needs the job's key: give --key-file FILE (the same secret on every agent)");
    }
    Ok((c, a.cpu.or(f.cpu)))
}

pub fn run(a: &AgentArgs) -> Result<()> {
    if let Some(AgentAction::Status(s)) = &a.action {
        return status(s);
    }
    let (cfg, cpu) = config(&a.run)?;
    if let Some(cpu) = cpu {
        pin(cpu)?;
    }
    let shutdown = Shutdown::new();
    let mut plugins = gepsea_agent::plugin::Registry::with_builtins();
    plugins.register(std::sync::Arc::new(gepsea_blast::accel::BlastPlugin::default())).map_err(anyhow::Error::msg)?;
    plugins.register(std::sync::Arc::new(paramedic::agent::ShipPlugin::default())).map_err(anyhow::Error::msg)?;
    let storage = storage_site(&a.run.storage)?;
    if let Some(p) = &storage {
        plugins.register(p.clone()).map_err(anyhow::Error::msg)?;
    }
    let agent = match Agent::start(cfg, plugins, Default::default(), shutdown.clone()) {
        Ok(agent) => agent,
        Err(e) => {
            storage.inspect(|p| p.remove_runtime());
            return Err(e.into());
        }
    };
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
        .context("installing signal handlers")?;
    let s2 = shutdown.clone();
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            s2.trigger();
        }
    });
    let ran = agent.run();
    if let Some(p) = &storage {
        p.remove_runtime();
    }
    ran?;
    Ok(())
}

fn status(a: &StatusArgs) -> Result<()> {
    let json = gepsea_client::status(&a.namespace, a.node_id)?;
    if a.json {
        emit!("{json}");
        return Ok(());
    }
    let v: serde_json::Value = serde_json::from_str(&json)?;
    let list = |k: &str| v[k].as_array().map(|a| a.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")).unwrap_or_default();
    emit!("agent of node {} (pid {}), namespace {}", v["node"], v["pid"], v["namespace"]);
    emit!("  listen        {}", v["listen"].as_str().unwrap_or("(none: this node only)"));
    emit!("  rendezvous    {}", v["rendezvous"].as_str().unwrap_or("(none)"));
    emit!(
        "  peer links    {}",
        match (v["authenticated"] == true, v["encrypted"] == true) {
            (true, true) => "authenticated and encrypted",
            (true, false) => "authenticated (key file), not encrypted",
            _ => "not authenticated (no --key-file)",
        }
    );
    let system = v["system_congestion"].as_str().unwrap_or("unknown");
    match v["tcp_congestion"].as_str() {
        Some(c) => emit!("  congestion    {c} on links to other agents (chosen; the system's: {system})"),
        None => emit!("  congestion    {system} on links to other agents (the system's)"),
    }
    match v["tcp_buffer"].as_u64() {
        Some(b) => emit!("  buffers       {b} bytes each way on links to other agents"),
        None => emit!("  buffers       the kernel's sizing on links to other agents"),
    }
    match v["tcp_checksums"].as_str() {
        Some("headers") => emit!("  checksums     headers; data payloads trusted to TCP on links whose other end trusts it too"),
        _ => emit!("  checksums     every header and payload on links to other agents"),
    }
    let expected = v["expected_nodes"].as_u64().map_or("not set (--nodes)".to_string(), |n| n.to_string());
    emit!("  ready         {} (expected nodes: {expected})", v["ready"]);
    emit!("  live agents   [{}]   dead: [{}]   scheduler: {}", list("view"), list("dead"), v["scheduler"]);
    if v["restarted"] == true || v["rejoins"].as_u64().unwrap_or(0) > 0 {
        emit!(
            "  restarts      {}; agents let back in: {}",
            if v["restarted"] == true { "this agent replaced a dead one of its node" } else { "this agent is its node's first" },
            v["rejoins"]
        );
    }
    emit!("  peer timeout  {} ms", v["peer_timeout_ms"]);
    let clients = v["clients"].as_array().cloned().unwrap_or_default();
    emit!("  processes     {}", clients.len());
    for c in &clients {
        emit!(
            "    port {:>4}  pid {:>7}  {:<8} {}",
            c["port"],
            c["pid"],
            c["activity"].as_str().unwrap_or(""),
            c["name"].as_str().unwrap_or("")
        );
    }
    emit!("  board keys    {}", v["board_keys"]);
    let locks = v["locks"].as_array().cloned().unwrap_or_default();
    emit!("  locks owned   {}", locks.len());
    for l in &locks {
        emit!("    {}: held by {} waiting {}", l["name"].as_str().unwrap_or(""), l["holders"], l["waiting"]);
    }
    emit!(
        "  cache         {} objects, {} bytes of {}",
        v["cache_objects"].as_array().map_or(0, |a| a.len()),
        v["cache_bytes"],
        v["cache_bytes_limit"]
    );
    emit!("  global memory {} blocks, {} bytes of {}", v["gma_blocks"], v["gma_bytes"], v["gma_bytes_limit"]);
    emit!("  merge streams {}", v["merge_streams"]);
    if !v["tasks"].is_null() {
        let t = &v["tasks"];
        emit!(
            "  scheduler     {} queued, {} running, {} idle takers, {} assigned so far",
            t["queued"],
            t["running"],
            t["idle_takers"],
            t["assigned_total"]
        );
    }
    emit!(
        "  plug-ins      {}",
        v["plugins"]
            .as_array()
            .map(|a| a.iter().map(|p| p[0].as_str().unwrap_or("").to_string()).collect::<Vec<_>>().join(", "))
            .unwrap_or_default()
    );
    emit!(
        "  in use        {}",
        v["components"].as_array().map(|a| a.iter().map(|c| c.as_str().unwrap_or("")).collect::<Vec<_>>().join(", ")).unwrap_or_default()
    );
    emit!("  served        {} requests, {} agent messages", v["requests_served"], v["peer_messages"]);
    let st = &v["plugin_status"][paramedic::storage::STORAGE_PLUGIN];
    if !st.is_null() {
        emit!("  storage site  listening on {}, writing to {}", st["listen"].as_str().unwrap_or(""), st["out"].as_str().unwrap_or(""));
        emit!(
            "    objects     {} written, {} refused; {} bytes received, {} bytes regenerated in {:.2} s",
            st["objects_written"],
            st["objects_refused"],
            st["bytes_received"],
            st["bytes_regenerated"],
            st["storage_seconds"].as_f64().unwrap_or(0.0)
        );
        emit!("    reports     {} completed from parts", st["reports_completed"]);
        for (name, p) in st["reports_in_progress"].as_object().into_iter().flatten() {
            emit!("      {name}: {} of {} parts in", p[0], p[1]);
        }
        if let Some(why) = st["last_refusal"].as_str() {
            emit!("    last refusal  {why}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    /// The agent configuration from `args` (after the program name).
    fn config_of(args: &[&str]) -> Result<AgentConfig> {
        let cli = Cli::try_parse_from(std::iter::once("gepsea-agent").chain(args.iter().copied()))?;
        Ok(config(&cli.run)?.0)
    }

    /// Removed when the test ends, also when it fails.
    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// `--config` files of the given names and contents, in a directory of the test's own.
    fn config_files(test: &str, files: &[(&str, &str)]) -> (Dir, Vec<String>) {
        let dir = Dir(std::env::temp_dir().join(format!("gepsea-agent-cfg-{test}-{}", std::process::id())));
        std::fs::create_dir_all(&dir.0).unwrap();
        let paths = files
            .iter()
            .map(|(name, text)| {
                let p = dir.0.join(name);
                std::fs::write(&p, text).unwrap();
                p.display().to_string()
            })
            .collect();
        (dir, paths)
    }

    #[test]
    fn tcp_buffer_comes_from_the_flag_over_the_file_over_the_default() {
        let (_dir, paths) = config_files(
            "buffer",
            &[("auto.toml", "tcp-buffer = \"auto\"\n"), ("bytes.toml", "tcp-buffer = 65536\n"), ("bad.toml", "tcp-buffer = \"lots\"\n")],
        );
        let [auto, bytes, bad] = [&paths[0], &paths[1], &paths[2]];
        assert_eq!(config_of(&[]).unwrap().tcp_buffer, Some(gepsea_net::DEFAULT_TCP_BUFFER));
        assert_eq!(config_of(&["--tcp-buffer", "auto"]).unwrap().tcp_buffer, None);
        assert_eq!(config_of(&["--tcp-buffer", "1048576"]).unwrap().tcp_buffer, Some(1 << 20));
        assert_eq!(config_of(&["--config", auto]).unwrap().tcp_buffer, None);
        assert_eq!(config_of(&["--config", bytes]).unwrap().tcp_buffer, Some(65536));
        assert_eq!(config_of(&["--config", auto, "--tcp-buffer", "4096"]).unwrap().tcp_buffer, Some(4096));
        let e = config_of(&["--config", bad]).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("tcp-buffer in --config") && e.contains("\"lots\""), "{e}");
        assert!(config_of(&["--tcp-buffer", "0"]).is_err(), "no buffer at all is not a size");
    }

    #[test]
    fn tcp_checksums_come_from_the_flag_over_the_file_over_the_default() {
        let (_dir, paths) =
            config_files("checksums", &[("headers.toml", "tcp-checksums = \"headers\"\n"), ("bad.toml", "tcp-checksums = \"none\"\n")]);
        let [headers, bad] = [&paths[0], &paths[1]];
        assert_eq!(config_of(&[]).unwrap().tcp_checksums, TcpChecksums::Full);
        assert_eq!(config_of(&["--tcp-checksums", "headers"]).unwrap().tcp_checksums, TcpChecksums::Headers);
        assert_eq!(config_of(&["--config", headers]).unwrap().tcp_checksums, TcpChecksums::Headers);
        assert_eq!(config_of(&["--config", headers, "--tcp-checksums", "full"]).unwrap().tcp_checksums, TcpChecksums::Full);
        let e = config_of(&["--config", bad]).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("tcp-checksums in --config: \"none\": neither `full` nor `headers`"), "{e}");
        let e = config_of(&["--tcp-checksums", "crc"]).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("neither `full` nor `headers`"), "{e}");
    }
}
