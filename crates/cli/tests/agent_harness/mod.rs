//! The agents' test harness, shared by `agent.rs` (one host) and `agent_nodes.rs`
//! (four network namespaces): agents of one test started as real processes, probes
//! and clients registered with them, all stopped and their files removed on drop.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use gepsea_client::{ClientError, ConnectOptions};
use gepsea_net::testbed::NetnsBridge;

pub static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

pub fn skip_netns() -> bool {
    if std::env::var_os("GEPSEA_SKIP_NETNS").is_some() {
        eprintln!("GEPSEA_SKIP_NETNS set: skipping");
        return true;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("multi-namespace tests need root (set GEPSEA_SKIP_NETNS=1 to skip them)");
    }
    false
}

/// Agents of one test, and every process started for it; all killed and their
/// runtime files removed on drop (also when the test fails).
pub struct Agents {
    pub ns: String,
    pub dir: PathBuf,
    pub bed: Option<NetnsBridge>,
    pub ips: Vec<String>,
    pub agents: Vec<Option<Child>>,
    pub others: Vec<Child>,
}

/// The test agents' limit on registration-socket connections (`--max-sessions`).
pub const MAX_SESSIONS: usize = 64;

impl Agents {
    pub fn new(n: usize, bridged: bool) -> Agents {
        let tag = format!("agt{}x{}", std::process::id(), COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
        let dir = std::env::temp_dir().join(format!("gepsea-test-{tag}"));
        std::fs::create_dir_all(dir.join("rv")).unwrap();
        let bed = bridged.then(|| NetnsBridge::new("ga", n).expect("creating namespaces"));
        let ips = match &bed {
            Some(b) => b.ip.clone(),
            None => vec!["127.0.0.1".to_string(); n],
        };
        let mut a = Agents { ns: tag, dir, bed, ips, agents: Vec::new(), others: Vec::new() };
        for i in 0..n {
            let c = a.start_agent(i, n);
            a.agents.push(Some(c));
        }
        for i in 0..n {
            a.wait_ready(i);
        }
        a
    }

    pub fn cmd(&self, i: usize, exe: &str) -> Command {
        let mut c = match &self.bed {
            Some(b) => b.cmd(i, exe),
            None => Command::new(exe),
        };
        c.env("GEPSEA_NAMESPACE", &self.ns).env("GEPSEA_NODE", (i + 1).to_string());
        c.env("GEPSEA_MAX_SESSIONS", MAX_SESSIONS.to_string());
        c
    }

    pub fn start_agent(&self, i: usize, n: usize) -> Child {
        self.start_agent_with(i, n, &[])
    }

    /// [`Agents::start_agent`] with more arguments.
    pub fn start_agent_with(&self, i: usize, n: usize, extra: &[&str]) -> Child {
        let log = std::fs::File::create(self.dir.join(format!("agent{}.log", i + 1))).unwrap();
        let listen = if self.bed.is_some() { format!("{}:7400", self.ips[i]) } else { "127.0.0.1:0".into() };
        self.cmd(i, env!("CARGO_BIN_EXE_gepsea"))
            .args(["agent", "--node-id", &(i + 1).to_string(), "--listen", &listen, "--nodes", &n.to_string(), "--peer-timeout-ms", "1500"])
            .arg("--rendezvous")
            .arg(self.dir.join("rv"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting gepsea agent")
    }

    pub fn status(&self, i: usize) -> serde_json::Value {
        serde_json::from_str(&gepsea_client::status(&self.ns, i as u32 + 1).expect("agent status")).unwrap()
    }

    pub fn wait_ready(&self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(j) = gepsea_client::status(&self.ns, i as u32 + 1) {
                let v: serde_json::Value = serde_json::from_str(&j).unwrap();
                if v["ready"] == true {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "agent {} not ready: {}", i + 1, self.log(i));
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("agent{}.log", i + 1))).unwrap_or_default()
    }

    pub fn probe(&self, i: usize, args: &[&str]) -> Command {
        let mut c = self.cmd(i, env!("CARGO_BIN_EXE_gepsea-agentprobe"));
        c.args(args);
        c
    }

    /// Runs a probe to completion; its stdout.
    pub fn run(&self, i: usize, args: &[&str]) -> String {
        let out = self.probe(i, args).output().unwrap();
        assert!(out.status.success(), "probe {args:?} on node {} failed: {}\n{}", i + 1, String::from_utf8_lossy(&out.stderr), self.log(i));
        String::from_utf8(out.stdout).unwrap()
    }

    /// Starts a probe; returns a reader of its stdout lines.
    pub fn spawn(&mut self, i: usize, args: &[&str]) -> Lines {
        let mut c = self.probe(i, args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let out = c.stdout.take().unwrap();
        let err = c.stderr.take().unwrap();
        self.others.push(c);
        Lines::new(out, err, format!("node {} {args:?}", i + 1))
    }

    /// Kills node `i`: its agent and every application process on it.
    pub fn kill_node(&mut self, i: usize) {
        if let Some(mut c) = self.agents[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(b) = &self.bed {
            b.kill_all(i);
        }
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        for c in self.others.iter_mut().chain(self.agents.iter_mut().flatten()) {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.bed.take();
        let _ = std::fs::remove_dir_all(gepsea_net::namespace_dir(&self.ns));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Lines of a child's stdout, read on a thread so a test can wait for one.
pub struct Lines {
    pub rx: mpsc::Receiver<String>,
    pub what: String,
    pub err: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Lines {
    pub fn new(out: ChildStdout, mut errp: std::process::ChildStderr, what: String) -> Lines {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let err = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let e2 = err.clone();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = errp.read_to_string(&mut s);
            *e2.lock().unwrap() = s;
        });
        Lines { rx, what, err }
    }

    pub fn next(&self, timeout: Duration) -> String {
        match self.rx.recv_timeout(timeout) {
            Ok(l) => l,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(200));
                panic!("{}: no output line within {timeout:?}; stderr: {}", self.what, self.err.lock().unwrap())
            }
        }
    }
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    gepsea_net::testkit::pattern(seed, len)
}

pub fn connect(a: &Agents, node: u32) -> Result<gepsea_client::Client, ClientError> {
    let mut o = ConnectOptions::from_env("test").unwrap();
    o.namespace = a.ns.clone();
    o.node = node;
    o.timeout = Duration::from_secs(30);
    gepsea_client::Client::connect(&o)
}

pub fn kill_tree(pid: u32) {
    // `ip netns exec` execs the program, so the child's pid is the probe itself.
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
}

pub fn waiting_on(a: &Agents, lock: &str) -> usize {
    (0..a.agents.len())
        .filter(|&i| a.agents[i].is_some())
        .map(|i| {
            a.status(i)["locks"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|l| l["name"] == lock)
                .map(|l| l["waiting"].as_array().unwrap().len())
                .sum::<usize>()
        })
        .sum()
}

pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
