//! Cluster mode: `gepsea search` started by a launcher (`mpirun`, `srun`) on many nodes.
//!
//! Every process learns its rank, the job size and its rank on its node from the
//! launcher's environment. The first process on a node starts that node's agent (or
//! attaches to one already running); the agents meet through a rendezvous directory
//! that all nodes share. Rank 0 is the master (it prepares the job, submits the tasks
//! and assembles the parts); every other rank is a worker registered with its node's
//! agent. When the master has written the output it sets a done flag on the bulletin
//! board, and the processes that started agents stop them.
//!
//! The node id is the global rank of the node's first process plus one, which is
//! unique as long as the launcher places a node's ranks contiguously (OpenMPI's and
//! Slurm's default block placement); `GEPSEA_NODE` overrides it.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gepsea_agent::api::Api;

use crate::accel::with_parent_death;
use crate::search::{SearchError, SearchOptions, Summary};

/// Where this process sits in a launched job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub rank: usize,
    pub size: usize,
    pub local_rank: usize,
    pub local_size: usize,
    pub node: u32,
}

/// Reads the launcher's environment (OpenMPI, Slurm, PMI); `None` outside a launcher.
pub fn detect() -> Option<Launch> {
    detect_from(|n| std::env::var(n).ok())
}

/// [`detect`] over any environment (`get` returns a variable's value).
pub fn detect_from(get: impl Fn(&str) -> Option<String>) -> Option<Launch> {
    let var = |names: &[&str]| names.iter().find_map(|n| get(n)?.parse::<usize>().ok());
    let rank = var(&["OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK", "PMIX_RANK"])?;
    let size = var(&["OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE"])?;
    let local_rank = var(&["OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"]).unwrap_or(0);
    let local_size = var(&["OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "MPI_LOCALNRANKS"]).unwrap_or(1);
    let node = match var(&["GEPSEA_NODE"]) {
        Some(n) => n as u32,
        None => match var(&["SLURM_NODEID"]) {
            Some(n) => n as u32 + 1,
            None => (rank - local_rank.min(rank)) as u32 + 1,
        },
    };
    Some(Launch { rank, size, local_rank, local_size, node })
}

/// How agents of a launched job find each other.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// A directory every node sees.
    pub rendezvous: PathBuf,
    /// The network agents talk over, as CIDR (e.g. 10.1.0.0/16): each agent listens on
    /// its address in it.
    pub agent_net: Option<String>,
    pub agent_port: u16,
    /// Nodes in the job (default: size / local size).
    pub nodes: Option<usize>,
}

/// This host's address inside `cidr` (or its first non-loopback IPv4 address).
pub fn local_ip(cidr: Option<&str>) -> Result<IpAddr, SearchError> {
    let (net, bits) = match cidr {
        Some(c) => {
            let (a, b) = c.split_once('/').ok_or_else(|| SearchError::Io(format!("--agent-net {c:?} is not a CIDR like 10.1.0.0/16")))?;
            let a: std::net::Ipv4Addr = a.parse().map_err(|_| SearchError::Io(format!("--agent-net {c:?}: bad address")))?;
            let b: u32 = b.parse().ok().filter(|b| *b <= 32).ok_or_else(|| SearchError::Io(format!("--agent-net {c:?}: bad prefix length")))?;
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

/// The agents' namespace of the job writing `out`: the same on every node.
pub fn namespace(out: &std::path::Path) -> String {
    let key = format!("{}", std::path::absolute(out).unwrap_or(out.to_path_buf()).display());
    let h = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    format!("job{h:012x}")
}

/// Written by rank 0 in the rendezvous directory when the output is complete. A file on
/// the shared directory rather than a bulletin-board key: the agents that hold the key
/// may stop (having seen it) before the last node has read it.
pub fn done_file(rendezvous: &std::path::Path, ns: &str) -> PathBuf {
    rendezvous.join(format!("{ns}.done"))
}

/// The agent this process started, stopped on drop; its node's runtime directory (and
/// the job's, once empty) goes with it, also when the agent was killed.
struct AgentChild(Option<(Child, PathBuf)>);
impl Drop for AgentChild {
    fn drop(&mut self) {
        if let Some((c, node_dir)) = &mut self.0 {
            // SAFETY: kill(2) on our own child.
            unsafe {
                libc::kill(c.id() as i32, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
            // Sockets of workers that were killed stay behind; the node's directory is ours.
            let _ = std::fs::remove_dir_all(&node_dir);
            if let Some(ns_dir) = node_dir.parent() {
                let _ = std::fs::remove_dir(ns_dir);
            }
        }
    }
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
    if opts.no_agent {
        // The mpiBLAST baseline: rank 0 merges and writes everything itself.
        let net = crate::search::ClusterNet { namespace: ns, ip: local_ip(c.agent_net.as_deref())?, directory: c.rendezvous.join("net"), workers: launch.size - 1 };
        std::fs::create_dir_all(&net.directory).map_err(|e| SearchError::Io(format!("{}: {e}", net.directory.display())))?;
        return if launch.rank == 0 {
            crate::search::run_cluster_no_agent(opts, net).map(Some)
        } else {
            crate::search::cluster_worker(opts, &net, launch.rank as u32, launch.node).map(|()| None)
        };
    }
    let nodes = c.nodes.unwrap_or_else(|| launch.size.div_ceil(launch.local_size.max(1)));
    let mut agent = AgentChild(None);
    if launch.local_rank == 0 {
        if gepsea_client::status(&ns, launch.node).is_err() {
            let ip = local_ip(c.agent_net.as_deref())?;
            let listen = SocketAddr::new(ip, c.agent_port);
            let child = with_parent_death(&mut Command::new(&opts.worker_exe))
                .args(["agent", "--namespace", &ns, "--node-id", &launch.node.to_string(), "--listen", &listen.to_string(), "--nodes", &nodes.to_string(), "--rendezvous"])
                .arg(&c.rendezvous)
                .env("GEPSEA_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .map_err(|e| SearchError::Io(format!("starting the agent: {e}")))?;
            agent.0 = Some((child, gepsea_net::namespace_dir(&ns).join(format!("node-{}", launch.node))));
        }
    }
    gepsea_client::wait_for_agent(&ns, launch.node, Duration::from_secs(60)).map_err(|e| SearchError::Io(format!("the agent of node {} did not start: {e}", launch.node)))?;
    let done = done_file(&c.rendezvous, &ns);
    let summary = if launch.rank == 0 {
        // A previous run to the same output left its flag (keepers read it only after
        // this run's master stopped their workers, long after this).
        let _ = std::fs::remove_file(&done);
        let client = connect(&ns, launch.node, "gepsea search (master)")?;
        let result = crate::search::run_master(opts, &client, launch.size - 1, &c.rendezvous);
        std::fs::write(&done, if result.is_ok() { "ok\n" } else { "failed\n" }).map_err(|e| SearchError::Io(format!("{}: {e}", done.display())))?;
        // Keep this node's agent until the other nodes' agents have left, then drop the flag.
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && client.global_state().map(|s| s.iter().any(|n| n.node != launch.node)).unwrap_or(false) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_file(&done);
        Some(result?)
    } else {
        let client = connect(&ns, launch.node, "gepsea search (worker)")?;
        match crate::accel::worker(&client) {
            Ok(()) => {}
            // The agent died under us: our tasks go to other nodes; leave quietly so
            // the launcher does not abort the job.
            Err(SearchError::Io(m)) if m.contains("lost contact") || m.contains("agent:") => {
                eprintln!("gepsea search: rank {}: lost the agent of node {} ({m}); leaving the work to the other nodes", launch.rank, launch.node);
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
        None
    };
    if agent.0.is_some() && launch.rank != 0 {
        // Keep this node's agent until the master has the whole output.
        let deadline = Instant::now() + Duration::from_secs(24 * 3600);
        while Instant::now() < deadline && !done.exists() {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    drop(agent);
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |n| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())
    }

    #[test]
    fn launchers_are_recognised_by_their_environment() {
        assert_eq!(detect_from(env(&[])), None);
        // OpenMPI, block placement, 2 per node: rank 5 is the second of the node whose
        // first process is rank 4.
        let ompi = [("OMPI_COMM_WORLD_RANK", "5"), ("OMPI_COMM_WORLD_SIZE", "6"), ("OMPI_COMM_WORLD_LOCAL_RANK", "1"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "2")];
        assert_eq!(detect_from(env(&ompi)), Some(Launch { rank: 5, size: 6, local_rank: 1, local_size: 2, node: 5 }));
        // Slurm numbers its nodes itself.
        let slurm = [("SLURM_PROCID", "7"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "3"), ("SLURM_NTASKS_PER_NODE", "4"), ("SLURM_NODEID", "1")];
        assert_eq!(detect_from(env(&slurm)), Some(Launch { rank: 7, size: 8, local_rank: 3, local_size: 4, node: 2 }));
        // Hydra's PMI; GEPSEA_NODE overrides any derivation.
        let pmi = [("PMI_RANK", "2"), ("PMI_SIZE", "4"), ("MPI_LOCALRANKID", "0"), ("GEPSEA_NODE", "9")];
        assert_eq!(detect_from(env(&pmi)), Some(Launch { rank: 2, size: 4, local_rank: 0, local_size: 1, node: 9 }));
    }
}
