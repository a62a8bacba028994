//! "Nodes" as network namespaces, for multi-node tests and benchmarks (needs root): two
//! joined by a veth pair ([`NetnsPair`]), any number on one Linux bridge that lives
//! in a namespace of its own ([`NetnsBridge`]), or two sites joined by a router whose
//! wide-area link can be rate-limited and delayed ([`WanSites`]), so the host's network
//! is never touched. Everything is torn down on drop: processes inside the
//! namespaces are killed first, then the namespaces (and with them the veths) deleted.
//! Names carry the creating process's id and a counter so concurrent runs never collide.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Two namespaces `ns[0]`, `ns[1]` with addresses `ip[0]`, `ip[1]` on one /24.
pub struct NetnsPair {
    pub ns: [String; 2],
    pub ip: [String; 2],
    /// Each side's end of the veth pair (e.g. for `tc`).
    pub dev: [String; 2],
}

fn run(args: &[&str]) -> std::io::Result<()> {
    let out = Command::new(args[0]).args(&args[1..]).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("{args:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim())))
    }
}

/// Sets kernel parameter `setting` (`key=value`, as `sysctl` names it) inside
/// namespace `ns`.
fn set_sysctl_in(ns: &str, setting: &str) -> std::io::Result<()> {
    run(&["ip", "netns", "exec", ns, "sysctl", "-qw", setting])
}

/// Runs `args` with `input` on its standard input.
fn run_with_input(args: &[&str], input: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut c = Command::new(args[0])
        .args(&args[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    c.stdin.take().map(|mut s| s.write_all(input.as_bytes())).transpose()?;
    let out = c.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("{args:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim())))
    }
}

/// The hardware address of node `i`'s interface on a [`NetnsBridge`] (locally
/// administered, unique per node; bridges live in separate namespaces, so two beds
/// may reuse them).
fn bridge_mac(i: usize) -> String {
    format!("02:67:65:00:{:02x}:{:02x}", (i >> 8) & 0xff, i & 0xff)
}

impl NetnsPair {
    /// Creates the pair; `prefix` (a few letters) tags the names.
    pub fn new(prefix: &str) -> std::io::Result<NetnsPair> {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let tag = format!("{prefix}{pid}x{n}");
        let subnet = format!("10.{}.{}", 200 + (n % 50), pid % 250);
        // Interface names are limited to 15 characters.
        let va = format!("v{}a", &tag[tag.len().saturating_sub(12)..]);
        let vb = format!("v{}b", &tag[tag.len().saturating_sub(12)..]);
        let pair = NetnsPair {
            ns: [format!("{tag}a"), format!("{tag}b")],
            ip: [format!("{subnet}.1"), format!("{subnet}.2")],
            dev: [va.clone(), vb.clone()],
        };
        run(&["ip", "netns", "add", &pair.ns[0]])?;
        run(&["ip", "netns", "add", &pair.ns[1]])?;
        run(&["ip", "link", "add", &va, "netns", &pair.ns[0], "type", "veth", "peer", "name", &vb, "netns", &pair.ns[1]])?;
        for (i, dev) in [&va, &vb].iter().enumerate() {
            run(&["ip", "-n", &pair.ns[i], "addr", "add", &format!("{}/24", pair.ip[i]), "dev", dev])?;
            run(&["ip", "-n", &pair.ns[i], "link", "set", dev, "up"])?;
            run(&["ip", "-n", &pair.ns[i], "link", "set", "lo", "up"])?;
        }
        Ok(pair)
    }

    /// `program` to be run inside node `i`'s namespace.
    pub fn cmd(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns[i]]).arg(program);
        c
    }

    /// Sets kernel parameter `key` (as `sysctl` names it) to `value` in both namespaces;
    /// the host's own value is untouched. Network parameters such as
    /// `net.ipv4.tcp_congestion_control` are per namespace.
    pub fn set_sysctl(&self, key: &str, value: &str) -> std::io::Result<()> {
        for ns in &self.ns {
            set_sysctl_in(ns, &format!("{key}={value}"))?;
        }
        Ok(())
    }

    /// Kernel parameter `key` as node `i`'s namespace has it.
    pub fn sysctl(&self, i: usize, key: &str) -> std::io::Result<String> {
        let out = self.cmd(i, "sysctl").args(["-n", key]).output()?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!("sysctl {key} in {}: {}", self.ns[i], String::from_utf8_lossy(&out.stderr).trim())));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// `mpirun` (OpenMPI) with one rank in each namespace, across the veth pair (see
    /// `mpirun_across`). Writes the launcher's files into `dir`; add the program.
    pub fn mpirun(&self, dir: &std::path::Path) -> std::io::Result<Command> {
        let subnet = format!("{}.0/24", net_of(&self.ip[0]));
        mpirun_across(self.cmd(0, "mpirun"), &self.ns, &self.ip, &subnet, dir, &[1, 1], 2)
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for ns in &self.ns {
            kill_ns(ns);
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// `n` node namespaces, each with one veth into a bridge inside a switch namespace.
pub struct NetnsBridge {
    pub ns: Vec<String>,
    pub ip: Vec<String>,
    switch: String,
}

impl NetnsBridge {
    pub fn new(prefix: &str, n: usize) -> std::io::Result<NetnsBridge> {
        let c = COUNTER.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let tag = format!("{prefix}{pid}x{c}");
        let subnet = format!("10.{}.{}", 200 + (c % 50), pid % 250);
        let mut b = NetnsBridge { ns: Vec::new(), ip: Vec::new(), switch: format!("{tag}s") };
        run(&["ip", "netns", "add", &b.switch])?;
        run(&["ip", "-n", &b.switch, "link", "add", "br0", "type", "bridge"])?;
        run(&["ip", "-n", &b.switch, "link", "set", "br0", "up"])?;
        for i in 0..n {
            let ns = format!("{tag}n{i}");
            run(&["ip", "netns", "add", &ns])?;
            b.ns.push(ns.clone());
            let ip = format!("{subnet}.{}", i + 1);
            b.ip.push(ip.clone());
            let port = format!("p{i}");
            let mac = bridge_mac(i);
            run(&["ip", "link", "add", "eth0", "netns", &ns, "address", &mac, "type", "veth", "peer", "name", &port, "netns", &b.switch])?;
            run(&["ip", "-n", &b.switch, "link", "set", &port, "master", "br0"])?;
            run(&["ip", "-n", &b.switch, "link", "set", &port, "up"])?;
            run(&["ip", "-n", &ns, "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
            run(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        }
        // Every node knows every other's hardware address from the start. With tens of
        // nodes whose agents all connect to each other at once, the ARP broadcasts
        // (n² requests, each flooded to n ports through veths) overflow the kernel's
        // per-CPU backlog on this 2-core machine; requests retried in step fail again,
        // and connects end in "No route to host" after 3 s. A cluster's switch fabric
        // would not drop them; static entries take ARP out of the emulation.
        for (i, ns) in b.ns.iter().enumerate() {
            let batch: String = (0..n)
                .filter(|&j| j != i)
                .map(|j| format!("neigh replace {} lladdr {} dev eth0 nud permanent\n", b.ip[j], bridge_mac(j)))
                .collect();
            run_with_input(&["ip", "-n", ns, "-batch", "-"], &batch)?;
        }
        Ok(b)
    }

    /// `program` to be run inside node `i`'s namespace.
    pub fn cmd(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns[i]]).arg(program);
        c
    }

    /// The namespace holding the bridge (its port towards node `i` is `p<i>`).
    pub fn switch_name(&self) -> String {
        self.switch.clone()
    }

    /// The nodes' subnet as CIDR (e.g. `10.203.17.0/24`).
    pub fn subnet(&self) -> String {
        format!("{}.0/24", net_of(&self.ip[0]))
    }

    /// `mpirun` (OpenMPI) over the first `slots.len()` nodes, reached as hosts by their
    /// addresses (see `mpirun_across`); node `i` offers `slots[i]` slots. Writes the
    /// launcher's script and hostfile into `dir`; add the program.
    pub fn mpirun(&self, dir: &std::path::Path, slots: &[usize], np: usize) -> std::io::Result<Command> {
        mpirun_across(self.cmd(0, "mpirun"), &self.ns, &self.ip, &self.subnet(), dir, slots, np)
    }

    /// Takes node `i` off the network without a word, as a host that loses power or
    /// its cable does: its port on the bridge goes down, so nothing it sends arrives
    /// and nothing sent to it is answered (no FIN, no RST); its processes run on.
    pub fn cut(&self, i: usize) -> std::io::Result<()> {
        run(&["ip", "-n", &self.switch, "link", "set", &format!("p{i}"), "down"])
    }

    /// Kills every process inside node `i`'s namespace.
    pub fn kill_all(&self, i: usize) {
        kill_ns(&self.ns[i]);
    }
}

/// `mpirun` (OpenMPI) launched by `launcher` (an `mpirun` command inside the first
/// node's namespace) over nodes `ns` with addresses `ip` on `subnet`, reached as hosts
/// by their addresses: the launcher runs its daemons through an rsh-agent script that
/// maps an address to its namespace (`ip netns exec`) instead of ssh, and node `i`
/// offers `slots[i]` slots. Writes the script and the hostfile into `dir`.
fn mpirun_across(
    mut c: Command,
    ns: &[String],
    ip: &[String],
    subnet: &str,
    dir: &std::path::Path,
    slots: &[usize],
    np: usize,
) -> std::io::Result<Command> {
    use std::os::unix::fs::PermissionsExt;
    let mut script = String::from("#!/bin/sh\nhost=\"$1\"; shift\ncase \"$host\" in\n");
    for (ip, ns) in ip.iter().zip(ns).take(slots.len()) {
        script.push_str(&format!("  {ip}) ns={ns};;\n"));
    }
    // Each node also gets a host name of its own (a UTS namespace named after its
    // network namespace), as separate hosts have: OpenMPI names its session
    // directories after the host, and daemons that all called themselves by this
    // machine's name shared one tree, where one daemon's clean-up removed the
    // directory another was creating ("mkdir ... No such file or directory").
    script.push_str(
        "  *) echo \"unknown host $host\" >&2; exit 1;;\nesac\nexec ip netns exec \"$ns\" unshare --uts sh -c 'hostname \"$1\" && exec sh -c \"$2\"' sh \"$ns\" \"$*\"\n",
    );
    let rsh = dir.join("rsh.sh");
    std::fs::write(&rsh, script)?;
    std::fs::set_permissions(&rsh, std::fs::Permissions::from_mode(0o755))?;
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, ip.iter().zip(slots).map(|(ip, n)| format!("{ip} slots={n}\n")).collect::<String>())?;
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    c.arg("--hostfile").arg(&hosts).args(["-np", &np.to_string(), "--mca", "rtc", "^hwloc", "--mca", "plm_rsh_agent"]).arg(&rsh);
    c.args(["--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet]);
    // Every daemon talks to mpirun directly: with 37 namespace nodes the default
    // routing tree failed now and then ("ORTE does not know how to route a message
    // to the specified daemon", daemons unable to connect to each other).
    c.args(["--mca", "routed", "direct"]);
    // OpenMPI's session directories in `dir`, one tree per launch, not the shared
    // /tmp/ompi.<host>.<uid>: a launch whose rank was killed leaves its tree
    // behind, and a later launch whose job family hashes the same refused to start
    // ("mkdir ... File exists", exit 213). They go when `dir` goes.
    static LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let session = dir.join("ompi-session").join(format!("{}-{n}", std::process::id()));
    std::fs::create_dir_all(&session)?;
    c.arg("--mca").arg("orte_tmpdir_base").arg(&session);
    Ok(c)
}

/// The first three octets of an address on one of our /24s.
fn net_of(ip: &str) -> &str {
    ip.rsplit_once('.').map_or("", |(net, _)| net)
}

fn kill_ns(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
    }
}

impl Drop for NetnsBridge {
    fn drop(&mut self) {
        for ns in &self.ns {
            kill_ns(ns);
        }
        for ns in self.ns.iter().chain(std::iter::once(&self.switch)) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Two sites joined through a router: a compute site of `n` nodes on a bridge (a
/// [`NetnsBridge`], whose switch namespace is the router) and a storage site of one
/// node on a subnet of its own behind the router's `wan0`. Traffic between the sites is
/// routed, so the router is where the wide-area link is emulated: [`WanSites::set_rate`]
/// puts a token bucket on both of the router's egresses, [`WanSites::queue_wan_traffic`]
/// hands every packet between the sites (and only those: traffic inside the compute
/// site is bridged and untouched) to an NFQUEUE, where a user-space daemon can hold it
/// for the one-way delay (this kernel has no `netem`).
pub struct WanSites {
    pub compute: NetnsBridge,
    pub storage_ns: String,
    pub storage_ip: String,
    /// The compute site's gateway (the router's address on the bridge).
    pub gateway: String,
}

impl WanSites {
    pub fn new(prefix: &str, n: usize) -> std::io::Result<WanSites> {
        let compute = NetnsBridge::new(prefix, n)?;
        let router = compute.switch_name();
        let net = net_of(&compute.ip[0]).to_string();
        // The storage subnet: the compute subnet's second octet minus 50 (150..199),
        // a range no other testbed here uses.
        let mut octets: Vec<u32> = net.split('.').map(|o| o.parse().unwrap_or(0)).collect();
        octets[1] -= 50;
        let storage_net = format!("{}.{}.{}", octets[0], octets[1], octets[2]);
        let sites = WanSites {
            storage_ns: format!("{}st", &router[..router.len() - 1]),
            storage_ip: format!("{storage_net}.1"),
            gateway: format!("{net}.254"),
            compute,
        };
        let st = &sites.storage_ns;
        run(&["ip", "netns", "add", st])?;
        run(&["ip", "-n", &router, "addr", "add", &format!("{}/24", sites.gateway), "dev", "br0"])?;
        run(&["ip", "link", "add", "wan0", "netns", &router, "type", "veth", "peer", "name", "eth0", "netns", st])?;
        run(&["ip", "-n", &router, "addr", "add", &format!("{storage_net}.254/24"), "dev", "wan0"])?;
        run(&["ip", "-n", &router, "link", "set", "wan0", "up"])?;
        run(&["ip", "-n", st, "addr", "add", &format!("{}/24", sites.storage_ip), "dev", "eth0"])?;
        run(&["ip", "-n", st, "link", "set", "eth0", "up"])?;
        run(&["ip", "-n", st, "link", "set", "lo", "up"])?;
        run(&["ip", "-n", st, "route", "add", "default", "via", &format!("{storage_net}.254")])?;
        for ns in &sites.compute.ns {
            run(&["ip", "-n", ns, "route", "add", "default", "via", &sites.gateway])?;
        }
        set_sysctl_in(&router, "net.ipv4.ip_forward=1")?;
        Ok(sites)
    }

    pub fn router(&self) -> String {
        self.compute.switch_name()
    }

    /// `program` to be run inside the storage node's namespace.
    pub fn storage_cmd(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.storage_ns]).arg(program);
        c
    }

    /// `program` to be run inside the router's namespace.
    pub fn router_cmd(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.router()]).arg(program);
        c
    }

    fn storage_subnet(&self) -> String {
        format!("{}.0/24", net_of(&self.storage_ip))
    }

    /// Limits the wide-area link to `mbit` Mbit/s in each direction (`tc tbf` on the
    /// router's egress towards each site), replacing any earlier limit.
    pub fn set_rate(&self, mbit: u32) -> std::io::Result<()> {
        let router = self.router();
        // A bucket of ≥ 2 ms at the rate, so a 64 KB segment burst passes whole.
        let burst = format!("{}kb", (mbit as u64 * 2 / 8).max(64));
        for dev in ["wan0", "br0"] {
            let _ = Command::new("ip").args(["netns", "exec", &router, "tc", "qdisc", "del", "dev", dev, "root"]).output();
            run(&[
                "ip",
                "netns",
                "exec",
                &router,
                "tc",
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                &format!("{mbit}mbit"),
                "burst",
                &burst,
                "latency",
                "100ms",
            ])?;
        }
        Ok(())
    }

    /// Sends every packet between the sites, both ways, to NFQUEUE `queue` (bypassed
    /// while no daemon listens) or, with `None`, stops doing so.
    pub fn queue_wan_traffic(&self, queue: Option<u16>) -> std::io::Result<()> {
        let router = self.router();
        let _ = Command::new("ip").args(["netns", "exec", &router, "iptables", "-F", "FORWARD"]).output();
        if let Some(q) = queue {
            let storage = self.storage_subnet();
            for dir in ["-s", "-d"] {
                run(&[
                    "ip",
                    "netns",
                    "exec",
                    &router,
                    "iptables",
                    "-A",
                    "FORWARD",
                    dir,
                    &storage,
                    "-j",
                    "NFQUEUE",
                    "--queue-num",
                    &q.to_string(),
                    "--queue-bypass",
                ])?;
            }
        }
        Ok(())
    }

    /// Sets `key=value` sysctls in every node's namespace (TCP settings are per
    /// namespace).
    pub fn sysctl_nodes(&self, settings: &[&str]) -> std::io::Result<()> {
        for ns in self.compute.ns.iter().chain(std::iter::once(&self.storage_ns)) {
            for kv in settings {
                set_sysctl_in(ns, kv)?;
            }
        }
        Ok(())
    }
}

impl Drop for WanSites {
    fn drop(&mut self) {
        kill_ns(&self.storage_ns);
        kill_ns(&self.router());
        let _ = Command::new("ip").args(["netns", "del", &self.storage_ns]).status();
        // The compute site and the router go with `compute`.
    }
}
