//! Cluster mode: `gepsea search` started by a launcher (`mpirun`, `srun`) on many nodes.
//!
//! Every process learns its rank and the job size from the launcher's environment
//! ([`launch`]); which processes share a node, and the node ids, the processes settle
//! among themselves in a rendezvous directory every node sees ([`meet`]), so any rank
//! placement works and the node count is never needed. The first process of a node
//! to arrive (its leader) starts the node's agent (or attaches to one already
//! running), on a port the kernel picks by default; the agents publish their addresses
//! and meet in the same directory. Rank 0 is the master (it prepares the job, submits
//! the tasks and assembles the parts); every other rank is a worker registered with its
//! node's agent. When the master has written the output it drops a done flag, and the
//! leaders stop their agents.
//!
//! Everything of one launch lives in `<rendezvous>/<job namespace>/launch-<launch id>/`:
//! two searches to different outputs, or two launches of one search, never share files
//! or ports, so several jobs can share nodes.

pub mod launch;
pub mod meet;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gepsea_agent::api::Api;

pub use self::launch::{detect, detect_from, Launch};
use self::meet::{host_key, Arrival, Meeting};
use crate::accel::{with_parent_death, MAX_AGENT_RESTARTS};
use crate::search::{SearchError, SearchOptions, Summary};

/// How long the processes of a launch wait for each other to appear.
const MEET_TIMEOUT: Duration = Duration::from_secs(180);

/// How agents of a launched job find each other.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// A directory every node sees.
    /// A directory every node sees (default: [`default_rendezvous`]).
    pub rendezvous: Option<PathBuf>,
    /// The network agents talk over, as CIDR (e.g. 10.1.0.0/16): each agent listens on
    /// its address in it.
    pub agent_net: Option<String>,
    /// The agents' TCP port; 0 (the default) lets the kernel pick one per agent.
    pub agent_port: u16,
    /// Nodes in the job, checked against what the rendezvous finds (default: the
    /// launcher's count where it gives one).
    pub nodes: Option<usize>,
    /// Encrypt the links between agents (they are always authenticated).
    pub encrypt: bool,
}

/// This host's address inside `cidr` (or its first non-loopback IPv4 address).
pub fn local_ip(cidr: Option<&str>) -> Result<IpAddr, SearchError> {
    let (net, bits) = match cidr {
        Some(c) => {
            let (a, b) = c.split_once('/').ok_or_else(|| SearchError::Io(format!("--agent-net {c:?} is not a CIDR like 10.1.0.0/16")))?;
            let a: std::net::Ipv4Addr = a.parse().map_err(|_| SearchError::Io(format!("--agent-net {c:?}: bad address")))?;
            let b: u32 =
                b.parse().ok().filter(|b| *b <= 32).ok_or_else(|| SearchError::Io(format!("--agent-net {c:?}: bad prefix length")))?;
            (Some(u32::from(a)), b)
        }
        None => (None, 0),
    };
    let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
    let mut found = None;
    // SAFETY: getifaddrs fills a list we only read and then free with freeifaddrs.
    unsafe {
        let mut ifs: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut ifs) != 0 {
            return Err(SearchError::Io(format!("getifaddrs: {}", std::io::Error::last_os_error())));
        }
        let mut p = ifs;
        while !p.is_null() {
            let a = (*p).ifa_addr;
            if !a.is_null() && (*a).sa_family as i32 == libc::AF_INET {
                let sin = &*(a as *const libc::sockaddr_in);
                let ip = u32::from_be(sin.sin_addr.s_addr);
                let ok = match net {
                    Some(n) => ip & mask == n & mask,
                    None => ip >> 24 != 127,
                };
                if ok && found.is_none() {
                    found = Some(IpAddr::V4(ip.into()));
                }
            }
            p = (*p).ifa_next;
        }
        libc::freeifaddrs(ifs);
    }
    found.ok_or_else(|| SearchError::Io(format!("no local address in {}", cidr.unwrap_or("any network (give --agent-net)"))))
}

/// Whether a worker's error is its agent's: the connection lost (the agent died), or
/// a request the agent failed (`accel::agent_error`).
fn agent_failed(e: &SearchError) -> bool {
    match e {
        SearchError::AgentLost(_) => true,
        SearchError::Io(m) => m.contains("agent:"),
        _ => false,
    }
}

/// The agents' namespace of the job writing `out`: the same on every node.
pub fn namespace(out: &std::path::Path) -> String {
    let key = format!("{}", std::path::absolute(out).unwrap_or(out.to_path_buf()).display());
    let h = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    format!("job{h:012x}")
}

/// The rendezvous used when none is given: next to the output, which a cluster job
/// writes to shared storage anyway (its work directory, with the finished parts, is
/// there too).
pub fn default_rendezvous(out: &Path) -> PathBuf {
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    let dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::path::absolute(dir).unwrap_or(dir.to_path_buf()).join(format!(".{name}.gepsea-rendezvous"))
}

/// This launch's directory under the job's namespace directory.
fn launch_dir(ns_dir: &Path, job: &str) -> PathBuf {
    let safe: String = job.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
    ns_dir.join(format!("launch-{safe}"))
}

/// Earlier launches of the same search (killed before rank 0 could clean up).
fn sweep_other_launches(ns_dir: &Path, mine: &Path) {
    for e in std::fs::read_dir(ns_dir).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().starts_with("launch-") && e.path() != mine {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Removed by rank 0 when the search is over: this launch's directory, the job's
/// namespace directory once empty, and the default rendezvous once empty.
struct LaunchFiles {
    dir: PathBuf,
    ns_dir: PathBuf,
    own_rendezvous: Option<PathBuf>,
}
impl Drop for LaunchFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir(&self.ns_dir);
        if let Some(rv) = &self.own_rendezvous {
            let _ = std::fs::remove_dir(rv);
        }
    }
}

/// The agent this process started, stopped on drop; its node's runtime directory (and
/// the job's, once empty) goes with it, also when the agent was killed.
struct AgentChild(Option<(Child, PathBuf)>);
impl Drop for AgentChild {
    fn drop(&mut self) {
        if let Some((c, node_dir)) = &mut self.0 {
            crate::tools::terminate(c, Duration::from_secs(5));
            // Sockets of workers that were killed stay behind; the node's directory is ours.
            let _ = std::fs::remove_dir_all(&node_dir);
            if let Some(ns_dir) = node_dir.parent() {
                let _ = std::fs::remove_dir(ns_dir);
            }
        }
    }
}

/// The pid of the agent serving `node` now, if one answers.
fn agent_pid(ns: &str, node: u32) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(&gepsea_client::status(ns, node).ok()?).ok()?;
    v["pid"].as_u64()
}

/// Waits until the node's agent answers again (restarted by the node's leader), the
/// job ended (`done` flag or launch directory gone), a signal asked us to stop, or a
/// minute passed.
fn wait_for_restart(ns: &str, node: u32, done: &Path, dir: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && !done.exists() && dir.exists() && crate::error::check_interrupted().is_ok() {
        let ready = gepsea_client::status(ns, node)
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
            .is_some_and(|v| v["ready"] == true);
        if ready {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

fn connect(ns: &str, node: u32, name: &str) -> Result<gepsea_client::Client, SearchError> {
    let mut co = gepsea_client::ConnectOptions::from_env(name).map_err(|e| SearchError::Io(e.to_string()))?;
    co.namespace = ns.to_string();
    co.node = node;
    co.ready_timeout = Duration::from_secs(120);
    gepsea_client::Client::connect(&co).map_err(|e| SearchError::Io(format!("connecting to the agent of node {node}: {e}")))
}

/// Runs this process's part of a launched search. Rank 0 returns the summary.
pub fn run(opts: &SearchOptions, launch: Launch, c: &ClusterOptions) -> Result<Option<Summary>, SearchError> {
    let ns = namespace(&opts.out);
    let job = launch.job_id().map_err(SearchError::Launch)?;
    let rendezvous = c.rendezvous.clone().unwrap_or_else(|| default_rendezvous(&opts.out));
    let ns_dir = rendezvous.join(&ns);
    let dir = launch_dir(&ns_dir, job);
    let _files = (launch.rank == 0).then(|| {
        sweep_other_launches(&ns_dir, &dir);
        LaunchFiles { dir: dir.clone(), ns_dir: ns_dir.clone(), own_rendezvous: c.rendezvous.is_none().then(|| rendezvous.clone()) }
    });
    let host = host_key();
    let arrival =
        Arrival { rank: launch.rank, size: launch.size, host: &host, local_size: launch.local_size, nodes: c.nodes.or(launch.nodes) };
    let meeting = meet::meet(&dir, &arrival, MEET_TIMEOUT).map_err(|e| SearchError::Launch(e.to_string()))?;
    // Every TCP link of the launch (agents, or master and workers) proves this key.
    let key_file = dir.join("key");
    let key = launch_key(&key_file)?;
    if opts.no_agent {
        // The mpiBLAST baseline: rank 0 merges and writes everything itself.
        let net = crate::search::ClusterNet {
            namespace: ns,
            ip: local_ip(c.agent_net.as_deref())?,
            directory: dir.join("net"),
            workers: launch.size - 1,
            key: Some(key),
        };
        std::fs::create_dir_all(&net.directory).map_err(|e| SearchError::Io(format!("{}: {e}", net.directory.display())))?;
        return if launch.rank == 0 {
            crate::search::run_cluster_no_agent(opts, net).map(Some)
        } else {
            crate::search::cluster_worker(opts, &net, launch.rank as u32, meeting.node).map(|()| None)
        };
    }
    run_with_agents(opts, &launch, c, &ns, &dir, &meeting)
}

/// The launch's key in its directory: the first process to get there creates it (32
/// random bytes, mode 0600, linked into place whole), everyone reads it. The directory
/// is the user's, on the shared file system the ranks already trust for the job.
fn launch_key(path: &Path) -> Result<gepsea_net::auth::Key, SearchError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if !path.exists() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let key = gepsea_net::auth::Key::generate().map_err(|e| SearchError::Io(format!("generating the launch key: {e}")))?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| SearchError::Io(format!("{}: {e}", tmp.display())))?;
        f.write_all(key.bytes()).map_err(|e| SearchError::Io(format!("{}: {e}", tmp.display())))?;
        drop(f);
        match std::fs::hard_link(&tmp, path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(SearchError::Io(format!("{}: {e}", path.display()))),
        }
        let _ = std::fs::remove_file(&tmp);
    }
    gepsea_net::auth::Key::from_file(path).map_err(|e| SearchError::Launch(e.to_string()))
}

fn run_with_agents(
    opts: &SearchOptions,
    launch: &Launch,
    c: &ClusterOptions,
    ns: &str,
    dir: &Path,
    meeting: &Meeting,
) -> Result<Option<Summary>, SearchError> {
    let node = meeting.node;
    let mut agent = AgentChild(None);
    let start_agent = || -> Result<(Child, PathBuf), SearchError> {
        let ip = local_ip(c.agent_net.as_deref())?;
        let listen = SocketAddr::new(ip, c.agent_port);
        let nodes = meeting.nodes.unwrap_or(1);
        let child = with_parent_death(&mut Command::new(&opts.worker_exe))
            .args([
                "agent",
                "--namespace",
                ns,
                "--node-id",
                &node.to_string(),
                "--listen",
                &listen.to_string(),
                "--nodes",
                &nodes.to_string(),
                "--rendezvous",
            ])
            .arg(dir.join("agents"))
            .arg("--key-file")
            .arg(dir.join("key"))
            .args(c.encrypt.then_some("--encrypt"))
            .args(opts.agent_cpu.map(|c| format!("--cpu={c}")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| SearchError::Io(format!("starting the agent: {e}")))?;
        Ok((child, gepsea_net::namespace_dir(ns).join(format!("node-{node}"))))
    };
    if meeting.leader && gepsea_client::status(ns, node).is_err() {
        agent.0 = Some(start_agent()?);
    }
    gepsea_client::wait_for_agent(ns, node, Duration::from_secs(60))
        .map_err(|e| SearchError::Io(format!("the agent of node {node} did not start: {e}")))?;
    let done = dir.join("done");
    let summary = if launch.rank == 0 {
        let client = connect(ns, node, "gepsea search (master)")?;
        let result = crate::search::run_master(opts, &client, launch.size - 1, dir);
        std::fs::write(&done, if result.is_ok() { "ok\n" } else { "failed\n" })
            .map_err(|e| SearchError::Io(format!("{}: {e}", done.display())))?;
        // Keep this node's agent until the other nodes' agents have left (the launch
        // directory, with the flag, goes when this returns).
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && client.global_state().map(|s| s.iter().any(|n| n.node != node)).unwrap_or(false) {
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(result?)
    } else {
        let mut restarts = 0;
        loop {
            let client = connect(ns, node, "gepsea search (worker)")?;
            let registered_with = agent_pid(ns, node);
            // The master drops the done flag (or removes the launch directory) when it
            // finished or failed; a failed master submits no stop tasks.
            match crate::accel::worker(&client, &|| done.exists() || !dir.exists()) {
                Ok(()) => break,
                // The agent died under us. Its tasks go to other nodes meanwhile; the
                // node's leader starts it again (it rejoins the job's agents with a new
                // incarnation) and every worker of the node goes on with it. An agent
                // that is still the one we registered with only answered late: leave
                // quietly, as when it does not come back, so the launcher does not
                // abort the job.
                Err(e) if agent_failed(&e) => {
                    let m = e.to_string();
                    drop(client);
                    let rank = launch.rank;
                    let same_agent = registered_with.is_some() && agent_pid(ns, node) == registered_with;
                    if same_agent || restarts == MAX_AGENT_RESTARTS || done.exists() || !dir.exists() {
                        note!("gepsea search: rank {rank}: lost the agent of node {node} ({m}); leaving the work to the other nodes");
                        return Ok(None);
                    }
                    restarts += 1;
                    if let Some((old, _)) = &mut agent.0 {
                        // A killed agent's sockets close before its exit can be waited
                        // for; on busy cores the worker sees the first well before the
                        // second, and looking once left a dead agent unrestarted.
                        crate::tools::wait_for_exit(old, Duration::from_secs(5));
                        if !matches!(old.try_wait(), Ok(None)) {
                            let _ = old.wait();
                            agent.0 = Some(start_agent()?);
                            note!("gepsea search: rank {rank}: the agent of node {node} died ({m}); started it again ({restarts} of at most {MAX_AGENT_RESTARTS})");
                        }
                    }
                    if !wait_for_restart(ns, node, &done, dir) {
                        note!(
                            "gepsea search: rank {rank}: the agent of node {node} did not come back; leaving the work to the other nodes"
                        );
                        return Ok(None);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        None
    };
    if agent.0.is_some() && launch.rank != 0 {
        // Keep this node's agent until the master has the whole output (or gave up and
        // removed the launch directory), and start it again if it dies meanwhile: the
        // node's other workers may still be searching.
        let deadline = Instant::now() + Duration::from_secs(24 * 3600);
        let mut restarts = 0;
        while Instant::now() < deadline && !done.exists() && dir.exists() && crate::error::check_interrupted().is_ok() {
            if let Some((old, _)) = &mut agent.0 {
                if !matches!(old.try_wait(), Ok(None)) && restarts < MAX_AGENT_RESTARTS {
                    let _ = old.wait();
                    restarts += 1;
                    agent.0 = Some(start_agent()?);
                    note!(
                        "gepsea search: rank {}: the agent of node {node} died; started it again ({restarts} of at most {MAX_AGENT_RESTARTS})",
                        launch.rank
                    );
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    drop(agent);
    Ok(summary)
}
