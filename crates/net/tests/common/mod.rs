//! Shared helpers of the integration tests: child processes that are killed when the
//! test ends (also on failure), unique namespace names, and network-namespace testbeds
//! that are torn down on drop.
#![allow(dead_code)]

pub mod relay;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name no other test (in this run or a concurrent one) uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}x{}", std::process::id(), COUNTER.fetch_add(1, Ordering::SeqCst))
}

/// A test's own namespace, whose runtime directory is removed when the test ends, also
/// when it fails: a killed peer leaves its socket behind, so the last port to close
/// does not remove it.
pub struct Ns(pub String);

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(gepsea_net::namespace_dir(&self.0));
    }
}

/// The test peer binary (built with the `netpeer` feature, which the tests that call
/// this require).
#[cfg(feature = "netpeer")]
pub fn netpeer() -> &'static str {
    env!("CARGO_BIN_EXE_gepsea-netpeer")
}

/// A running child whose stdout lines are collected; killed on drop.
pub struct Proc {
    pub name: String,
    child: Option<Child>,
    lines: Receiver<String>,
    pub seen: Vec<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command) -> Proc {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawning {name}: {e}"));
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let e2 = stderr.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let mut s = e2.lock().unwrap();
                s.push_str(&l);
                s.push('\n');
            }
        });
        Proc { name: name.to_string(), child: Some(child), lines: rx, seen: Vec::new(), stderr }
    }

    /// Waits for a stdout line starting with `prefix`.
    pub fn expect_line(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.starts_with(prefix) {
                        return l;
                    }
                }
                Err(_) => panic!(
                    "{}: no line starting with {prefix:?} within {timeout:?}; stdout so far: {:?}; stderr: {}",
                    self.name,
                    self.seen,
                    self.stderr.lock().unwrap()
                ),
            }
        }
    }

    /// Waits for exit and asserts success; returns the final `OK` line.
    pub fn finish_ok(&mut self, timeout: Duration) -> String {
        let ok = self.expect_line("OK", timeout);
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                assert!(st.success(), "{} exited with {st}; stderr: {}", self.name, self.stderr.lock().unwrap());
                return ok;
            }
            assert!(Instant::now() < deadline, "{} printed OK but did not exit", self.name);
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The process id, while it has not been killed.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Stops the process (`SIGSTOP`) and returns once every one of its threads is
    /// stopped. The signal is delivered asynchronously: on a loaded machine a thread
    /// that is running could otherwise still act on what the test sends next.
    pub fn stop(&self) {
        let pid = self.pid().expect("stopping a live process");
        // SAFETY: kill has no memory-safety preconditions; the pid is our own child's.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
        let stopped = |stat: &str| stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with(['T', 't']));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process's threads");
            // A thread that exits meanwhile (no stat) does not hold the others up.
            if tasks.flatten().all(|t| std::fs::read_to_string(t.path().join("stat")).map_or(true, |s| stopped(&s))) {
                return;
            }
            assert!(Instant::now() < deadline, "process {pid} did not stop");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `cmd`, panicking with its output if it fails.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two network namespaces joined by a veth pair, as two "nodes" (see
/// `gepsea_net::testbed`).
pub type TwoNodes = gepsea_net::testbed::NetnsPair;

pub fn two_nodes() -> TwoNodes {
    TwoNodes::new("gp").expect("creating two network namespaces")
}

pub fn require_root() -> bool {
    // SAFETY: trivial libc call.
    let root = unsafe { libc::geteuid() } == 0;
    if !root && std::env::var("GEPSEA_SKIP_NETNS").is_ok() {
        eprintln!("skipping: not root and GEPSEA_SKIP_NETNS is set");
        return false;
    }
    assert!(root, "multi-node tests need root (network namespaces); set GEPSEA_SKIP_NETNS=1 to skip them");
    true
}

/// A temporary directory removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        let p = std::env::temp_dir().join(unique("gepsea-test-"));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every size from 1 B to 64 MiB the suite exchanges, across the eager threshold and
/// the rendezvous chunk size.
pub const SIZES: &str = "1,7,64,1000,4096,16384,16385,65536,262144,262145,1048576,4194304,67108864";
/// Sizes for the system channel (all eager), more messages than the credit window.
pub fn system_sizes() -> String {
    (0..300).map(|i| ((i * 997) % 16384 + 1).to_string()).collect::<Vec<_>>().join(",")
}

/// Polls `port`'s statistics until `what` holds (at most 10 s, then fails naming them).
pub fn wait_for(port: &gepsea_net::Port, what: impl Fn(&gepsea_net::PortStats) -> bool) -> gepsea_net::PortStats {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = port.stats();
        if what(&st) {
            return st;
        }
        assert!(Instant::now() < deadline, "condition not reached; stats {st:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
