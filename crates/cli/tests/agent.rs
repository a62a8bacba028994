//! The agents as real processes: `gepsea agent` per node, application processes
//! (`gepsea-agentprobe`, the Rust client, the C example) registered with them.
//!
//! - On one host (no root needed): two agents on loopback exercise every component
//!   and primitive end to end, and bad input from clients.
//! - On four network namespaces joined by a bridge (root; `GEPSEA_SKIP_NETNS=1` skips):
//!   advertising exactly once everywhere, 4 × 10,000 concurrent compare-and-swap
//!   increments, lock mutual exclusion and FIFO order, and the death of a node's agent.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use gepsea_client::wire::{self, Codec, ErrorKind, Record};
use gepsea_client::{Api, ClientError, ConnectOptions};
use gepsea_net::testbed::NetnsBridge;

static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn skip_netns() -> bool {
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
struct Agents {
    ns: String,
    dir: PathBuf,
    bed: Option<NetnsBridge>,
    ips: Vec<String>,
    agents: Vec<Option<Child>>,
    others: Vec<Child>,
}

/// The test agents' limit on registration-socket connections (`--max-sessions`).
const MAX_SESSIONS: usize = 64;

impl Agents {
    fn new(n: usize, bridged: bool) -> Agents {
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

    fn cmd(&self, i: usize, exe: &str) -> Command {
        let mut c = match &self.bed {
            Some(b) => b.cmd(i, exe),
            None => Command::new(exe),
        };
        c.env("GEPSEA_NAMESPACE", &self.ns).env("GEPSEA_NODE", (i + 1).to_string());
        c.env("GEPSEA_MAX_SESSIONS", MAX_SESSIONS.to_string());
        c
    }

    fn start_agent(&self, i: usize, n: usize) -> Child {
        let log = std::fs::File::create(self.dir.join(format!("agent{}.log", i + 1))).unwrap();
        let listen = if self.bed.is_some() { format!("{}:7400", self.ips[i]) } else { "127.0.0.1:0".into() };
        self.cmd(i, env!("CARGO_BIN_EXE_gepsea"))
            .args(["agent", "--node-id", &(i + 1).to_string(), "--listen", &listen, "--nodes", &n.to_string(), "--peer-timeout-ms", "1500"])
            .arg("--rendezvous")
            .arg(self.dir.join("rv"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting gepsea agent")
    }

    fn status(&self, i: usize) -> serde_json::Value {
        serde_json::from_str(&gepsea_client::status(&self.ns, i as u32 + 1).expect("agent status")).unwrap()
    }

    fn wait_ready(&self, i: usize) {
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

    fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("agent{}.log", i + 1))).unwrap_or_default()
    }

    fn probe(&self, i: usize, args: &[&str]) -> Command {
        let mut c = self.cmd(i, env!("CARGO_BIN_EXE_gepsea-agentprobe"));
        c.args(args);
        c
    }

    /// Runs a probe to completion; its stdout.
    fn run(&self, i: usize, args: &[&str]) -> String {
        let out = self.probe(i, args).output().unwrap();
        assert!(out.status.success(), "probe {args:?} on node {} failed: {}\n{}", i + 1, String::from_utf8_lossy(&out.stderr), self.log(i));
        String::from_utf8(out.stdout).unwrap()
    }

    /// Starts a probe; returns a reader of its stdout lines.
    fn spawn(&mut self, i: usize, args: &[&str]) -> Lines {
        let mut c = self.probe(i, args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let out = c.stdout.take().unwrap();
        let err = c.stderr.take().unwrap();
        self.others.push(c);
        Lines::new(out, err, format!("node {} {args:?}", i + 1))
    }

    /// Kills node `i`: its agent and every application process on it.
    fn kill_node(&mut self, i: usize) {
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
struct Lines {
    rx: mpsc::Receiver<String>,
    what: String,
    err: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Lines {
    fn new(out: ChildStdout, mut errp: std::process::ChildStderr, what: String) -> Lines {
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

    fn next(&self, timeout: Duration) -> String {
        match self.rx.recv_timeout(timeout) {
            Ok(l) => l,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(200));
                panic!("{}: no output line within {timeout:?}; stderr: {}", self.what, self.err.lock().unwrap())
            }
        }
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    gepsea_net::testkit::pattern(seed, len)
}

fn connect(a: &Agents, node: u32) -> Result<gepsea_client::Client, ClientError> {
    let mut o = ConnectOptions::from_env("test").unwrap();
    o.namespace = a.ns.clone();
    o.node = node;
    o.timeout = Duration::from_secs(30);
    gepsea_client::Client::connect(&o)
}

// ----- one host ----------------------------------------------------------------------

/// A release of a lock held across nodes is answered by the client's own agent and
/// reaches the owner one hop later: it returns while the owner agent is stopped, the
/// lock stays held until the owner has the release, and the same client's next
/// request for it, sent right behind, is granted after it (not refused as held).
#[test]
fn a_release_is_answered_by_the_local_agent_and_reaches_the_owner_in_order() {
    let a = Agents::new(2, false);
    let name = (0..)
        .map(|i| format!("early-{i}"))
        .find(|n| gepsea_agent::core::board::ranked(&gepsea_agent::core::lock_key(n), &[1, 2]).first() == Some(&2))
        .unwrap();
    let c = connect(&a, 1).expect("connecting to node 1");
    c.lock(&name, wire::LockMode::Exclusive).unwrap();
    let owner = a.agents[1].as_ref().unwrap().id() as i32;
    // SAFETY: kill has no memory-safety preconditions; the pid is our own child's.
    assert_eq!(unsafe { libc::kill(owner, libc::SIGSTOP) }, 0);
    // Continued from another thread after a while (well inside the 1.5 s peer timeout).
    let cont = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        // SAFETY: as above.
        unsafe { libc::kill(owner, libc::SIGCONT) };
        Instant::now()
    });
    c.unlock(&name).unwrap();
    let released_at = Instant::now();
    c.lock(&name, wire::LockMode::Exclusive).unwrap();
    let continued_at = cont.join().unwrap();
    assert!(released_at < continued_at, "the release waited for the stopped owner");
    // Held once, by our client, with nobody waiting; another node's client cannot
    // have it until we release it again.
    let locks = a.status(1)["locks"].clone();
    let l = locks.as_array().unwrap().iter().find(|l| l["name"] == name.as_str()).cloned().unwrap_or_else(|| panic!("{locks}"));
    assert_eq!(l["waiting"], serde_json::json!([]), "{l}");
    let line = a.run(1, &["lock-timeout", &name, "300"]);
    assert!(line.starts_with("not locked"), "{line}");
    c.unlock(&name).unwrap();
    let line = a.run(1, &["lock-timeout", &name, "5000"]);
    assert!(line.starts_with("locked after"), "{line}");
}

/// A release of a lock that nobody else waited for travels to the owner lazily, with
/// the agent's next message to any agent: here there is none, and the release must
/// still reach the owner (within `LAZY_FOR`, or before the agent sleeps), so that a
/// client of the owner's node gets the lock; the owner then shows it held by that
/// client alone. Then the same with a waiter queued at the owner before the grant.
#[test]
fn a_lazily_sent_release_still_reaches_the_owner() {
    let mut a = Agents::new(2, false);
    let name = (0..)
        .map(|i| format!("lazy-{i}"))
        .find(|n| gepsea_agent::core::board::ranked(&gepsea_agent::core::lock_key(n), &[1, 2]).first() == Some(&2))
        .unwrap();
    let c = connect(&a, 1).expect("connecting to node 1");
    for round in 0..20 {
        c.lock(&name, wire::LockMode::Exclusive).unwrap();
        c.unlock(&name).unwrap();
        // Nothing else goes from node 1 to node 2 now: the release must leave alone.
        let line = a.run(1, &["lock-timeout", &name, "5000"]);
        assert!(line.starts_with("locked after"), "round {round}: {line}");
    }
    // Granted while a client of the owner's node waits: the waiter gets it once the
    // holder releases.
    c.lock(&name, wire::LockMode::Exclusive).unwrap();
    let waiter = a.spawn(1, &["lock-timeout", &name, "10000"]);
    wait_until(Duration::from_secs(10), || waiting_on(&a, &name) == 1, "the owner's client to wait");
    c.unlock(&name).unwrap();
    let line = waiter.next(Duration::from_secs(15));
    assert!(line.starts_with("locked after"), "{line}");
}

/// Every component and primitive end to end, through two agents on loopback: the test
/// process is a client of node 1, probes are clients of node 2.
#[test]
fn components_and_primitives_across_two_agents() {
    let a = Agents::new(2, false);
    let c = connect(&a, 1).expect("connecting to node 1");

    // Data cache and directory: 3 MiB (above the inline limit) put on node 1, read
    // location-transparently on node 2, which then holds a copy too.
    let data = pattern(3 << 20, 7);
    c.cache_put("frag-1", &data).unwrap();
    assert_eq!(c.locate("frag-1").unwrap(), vec![1]);
    let got = a.run(1, &["cache-get", "frag-1"]);
    assert_eq!(got.trim(), format!("len {} fnv {:08x}", data.len(), gepsea_net::testkit::fingerprint(&data)));
    assert_eq!(c.locate("frag-1").unwrap(), vec![1, 2]);
    // Swap: node 1 hands its copy over instead of keeping a duplicate ... node 2 has
    // one already, so first drop node 2's and then move node 1's there.
    a.run(1, &["cache-remove", "frag-1"]);
    assert_eq!(c.locate("frag-1").unwrap(), vec![1]);
    c.swap("frag-1", 2).unwrap();
    assert_eq!(c.locate("frag-1").unwrap(), vec![2]);
    assert_eq!(a.status(0)["cache_objects"].as_array().unwrap().len(), 0);
    // `status` lists the components in use: what the plug-ins declare, each once.
    let st = a.status(0);
    let names = |v: &serde_json::Value| -> Vec<String> { v.as_array().unwrap().iter().map(|u| u.as_str().unwrap().to_string()).collect() };
    let mut declared: Vec<String> = st["plugins"].as_array().unwrap().iter().flat_map(|p| names(&p[1])).collect();
    declared.sort();
    declared.dedup();
    let mut listed = names(&st["components"]);
    listed.sort();
    assert_eq!(listed, declared);
    for c in ["SortMerge", "Parsing", "LoadBalancing"] {
        assert!(listed.iter().any(|l| l == c), "the BLAST plug-in uses {c}: {listed:?}");
    }
    // Prefetch brings it back to node 1 ahead of use; the read is then local.
    c.prefetch("frag-1").unwrap();
    assert_eq!(c.locate("frag-1").unwrap(), vec![1, 2]);
    assert_eq!(c.cache_get("frag-1").unwrap(), data);
    let e = c.cache_get("no-such").unwrap_err();
    assert_eq!(e.kind(), Some(ErrorKind::NotFound), "{e}");

    // Global memory: a block on node 2, written and read from node 1 (open channel).
    let p = c.gma_alloc(2, 200_000).unwrap();
    assert_eq!(p.node, 2);
    let block = pattern(100_000, 9);
    c.gma_put(p, 10, &block).unwrap();
    assert_eq!(c.gma_get(p, 10, 100_000).unwrap(), block);
    assert_eq!(c.gma_get(p, 0, 10).unwrap(), vec![0; 10]);
    assert_eq!(c.gma_get(p, 199_999, 2).unwrap_err().kind(), Some(ErrorKind::BadRequest));
    assert_eq!(a.status(1)["gma_blocks"], 1);
    c.gma_free(p).unwrap();
    assert_eq!(a.status(1)["gma_blocks"], 0);
    assert!(c.gma_get(p, 0, 1).is_err(), "a freed block is gone");
    assert_eq!(c.gma_alloc(2, 1 << 40).unwrap_err().kind(), Some(ErrorKind::TooLarge));

    // Sort/merge: three sorted runs pushed in an interleaved order, pulled
    // incrementally; nothing is released before it is certainly next.
    c.merge_open("m", 3).unwrap();
    let rec = |k: u32, run: u8| Record { key: k.to_be_bytes().to_vec(), value: vec![run] };
    c.merge_push("m", 0, vec![rec(1, 0), rec(5, 0)], false).unwrap();
    c.merge_push("m", 2, vec![rec(2, 2)], false).unwrap();
    assert_eq!(c.merge_pull("m").unwrap(), (vec![], false), "run 1 has not spoken yet");
    c.merge_push("m", 1, vec![rec(3, 1), rec(4, 1)], true).unwrap();
    assert_eq!(c.merge_pull("m").unwrap(), (vec![rec(1, 0), rec(2, 2)], false));
    c.merge_push("m", 2, vec![], true).unwrap();
    c.merge_push("m", 0, vec![rec(6, 0)], true).unwrap();
    assert_eq!(c.merge_pull("m").unwrap(), (vec![rec(3, 1), rec(4, 1), rec(5, 0), rec(6, 0)], true));
    assert_eq!(c.merge_push("m", 0, vec![], true).unwrap_err().kind(), Some(ErrorKind::NotFound));
    assert_eq!(c.merge_open("bad", 0).unwrap_err().kind(), Some(ErrorKind::BadRequest));

    // Compression engine in the agent.
    let text: Vec<u8> = (0..50_000).flat_map(|i: u32| format!("hit {i}\n").into_bytes()).collect();
    for codec in [Codec::Zstd, Codec::Gzip] {
        let z = c.compress(codec.clone(), 3, &text).unwrap();
        assert!(z.len() * 4 < text.len());
        assert_eq!(c.decompress(codec, &z).unwrap(), text);
    }
    assert_eq!(c.decompress(Codec::Zstd, b"garbage").unwrap_err().kind(), Some(ErrorKind::Failed));

    // The example plug-in counts through the bulletin board.
    for want in 1..=3u64 {
        assert_eq!(c.plugin("counter", b"x").unwrap(), want.to_le_bytes());
    }
    assert_eq!(a.run(1, &["board-get", "counter/x"]).trim(), "value 3 version 3");

    // Global process state, seen from node 2.
    c.set_state(wire::Activity::Busy, vec!["query-batch-7".into()]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let st = a.run(1, &["state"]);
        if st.contains("node 1 Busy") && st.contains("query-batch-7") && st.contains("frag-1") {
            break;
        }
        assert!(Instant::now() < deadline, "state never showed node 1 busy: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // ... and on the bulletin board.
    let v = c.board_get("gepsea.pstate/1").unwrap().expect("node 1's state on the board");
    let st: wire::NodeState = wire::decode("state", &v.value).unwrap();
    assert_eq!(st.activity, wire::Activity::Busy);
    assert!(st.holds.contains(&"query-batch-7".to_string()), "{st:?}");

    // Load balancing: node 1 submits, node 2 works, the scheduler is node 1.
    assert_eq!(c.scheduler().unwrap(), 1);
    for i in 0..5 {
        c.submit(format!("t{i}").as_bytes()).unwrap();
    }
    let log = a.dir.join("work.log");
    let out = a.run(1, &["work", log.to_str().unwrap(), "1"]);
    assert_eq!(out.lines().last().unwrap(), "worked 5");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "t0\nt1\nt2\nt3\nt4\n");
    assert_eq!(c.take(Duration::from_millis(100)).unwrap(), None);
    assert_eq!(c.done(12345).unwrap_err().kind(), Some(ErrorKind::NotHeld));

    // Placement by load, through the scheduler: from node 2, then node 1, each asker
    // gets the work while loads tie; asked again, the same agent; released work stops
    // counting; urgent tasks are handed out first (before the end-game).
    let c2 = connect(&a, 2).expect("connecting to node 2");
    assert_eq!(c2.place("batch-0", 1).unwrap(), 2);
    assert_eq!(c.place("batch-1", 1).unwrap(), 1);
    assert_eq!(c.place("batch-0", 1).unwrap(), 2);
    assert_eq!(c2.place("batch-2", 3).unwrap(), 2, "a tie goes to the asker");
    assert_eq!(c2.place("batch-3", 1).unwrap(), 1, "node 2 carries 4, node 1 carries 1");
    c2.release("batch-2").unwrap();
    assert_eq!(c.place("batch-4", 1).unwrap(), 2, "released: node 2 carries 1, node 1 carries 2");
    // Three plain tasks for one worker: more than the end-game's two per worker.
    for p in [&b"plain0"[..], b"plain1", b"plain2"] {
        c.submit(p).unwrap();
    }
    c.submit_urgent(b"urgent").unwrap();
    let mut order = Vec::new();
    for _ in 0..4 {
        let t = c2.take(Duration::from_secs(5)).unwrap().expect("a task");
        c2.done(t.id).unwrap();
        order.push(String::from_utf8(t.payload).unwrap());
    }
    assert_eq!(order, ["urgent", "plain0", "plain1", "plain2"]);
    // The lookahead names the data of the tasks node 2 would be handed next.
    assert_eq!(c2.upcoming(4).unwrap(), Vec::<String>::new());
    c.submit_near(b"on-a", "obj-a").unwrap();
    c.submit(b"plain").unwrap();
    c.submit_near(b"on-b", "obj-b").unwrap();
    assert_eq!(c2.upcoming(4).unwrap(), ["obj-a", "obj-b"]);
    for _ in 0..3 {
        let t = c2.take(Duration::from_secs(5)).unwrap().expect("a task");
        c2.done(t.id).unwrap();
    }
}

/// Malformed and abusive clients get clear errors; the agent keeps serving.
#[test]
fn bad_input_gets_clear_errors_and_the_agent_keeps_serving() {
    let a = Agents::new(1, false);
    let sock = gepsea_agent::server::agent_socket(&a.ns, 1);

    // Garbage on the registration socket.
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    wire::unix::write(&mut s, &[0xff, 0xff, 0xff, 0xff, 0x0f]).unwrap();
    let r: wire::LocalReply = wire::decode("reply", &wire::unix::read(&mut s).unwrap()).unwrap();
    assert!(matches!(&r, wire::LocalReply::Refused(m) if m.contains("malformed registration message")), "{r:?}");
    // An oversized frame header closes the connection after a clear refusal.
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    s.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let r: wire::LocalReply = wire::decode("reply", &wire::unix::read(&mut s).unwrap()).unwrap();
    assert!(matches!(&r, wire::LocalReply::Refused(m) if m.contains("exceeds")), "{r:?}");

    // Connections past the limit are refused with a clear reply; closing some makes
    // room again.
    let mut open = Vec::new();
    let refusal = loop {
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        wire::unix::write(&mut s, &wire::encode(&wire::LocalRequest::Status)).unwrap();
        match wire::decode::<wire::LocalReply>("reply", &wire::unix::read(&mut s).unwrap()).unwrap() {
            wire::LocalReply::Refused(m) => break m,
            _ => open.push(s),
        }
        assert!(open.len() <= MAX_SESSIONS, "more than {MAX_SESSIONS} connections were accepted");
    };
    assert!(refusal.contains(&format!("{MAX_SESSIONS} connections already open")) && refusal.contains("--max-sessions"), "{refusal}");
    drop(open);
    // The agent sees the closed connections when it next polls.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        wire::unix::write(&mut s, &wire::encode(&wire::LocalRequest::Status)).unwrap();
        let r: wire::LocalReply = wire::decode("reply", &wire::unix::read(&mut s).unwrap()).unwrap();
        if matches!(r, wire::LocalReply::Status(_)) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "closed connections never made room: {r:?}");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Registering twice on one connection, and a second registration of a process.
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let reg = wire::encode(&wire::LocalRequest::Register { pid: 999_999_001, name: "raw".into() });
    wire::unix::write(&mut s, &reg).unwrap();
    let r: wire::LocalReply = wire::decode("reply", &wire::unix::read(&mut s).unwrap()).unwrap();
    let wire::LocalReply::Registered { port, .. } = r else { panic!("{r:?}") };
    wire::unix::write(&mut s, &reg).unwrap();
    let r: wire::LocalReply = wire::decode("reply", &wire::unix::read(&mut s).unwrap()).unwrap();
    assert!(matches!(&r, wire::LocalReply::Refused(m) if m.contains("already registered")), "{r:?}");
    let c = connect(&a, 1).unwrap();
    let again = connect(&a, 1).err().expect("a second registration of one process is refused");
    assert!(again.to_string().contains("already registered"), "{again}");

    // Malformed requests over gepsea-net from the raw registration's port: a body that
    // is not a request (answered by id), and an envelope that is not an envelope.
    let port = gepsea_net::Port::open(gepsea_net::PortConfig::new(&a.ns, gepsea_net::Addr::new(1, port))).unwrap();
    let agent = gepsea_net::Addr::new(1, 0);
    port.send(agent, wire::TAG_REQUEST, vec![0xde, 0xad]).unwrap();
    let mut body = wire::encode(&77u64);
    body.extend_from_slice(&[0xff; 9]);
    port.send(agent, wire::TAG_REQUEST, wire::encode(&wire::Envelope::Inline(&body))).unwrap();
    let m = port.recv(Some(agent), Some(wire::TAG_REPLY | 77), 1 << 16).unwrap();
    let wire::Envelope::Inline(b) = wire::decode("env", &m.data).unwrap() else { panic!() };
    let r: wire::Reply = wire::decode("reply", b).unwrap();
    assert!(matches!(&r, wire::Reply::Err(e) if e.kind == ErrorKind::BadRequest && e.message.contains("malformed request")), "{r:?}");

    // Unknown plug-ins, oversized values, unlocking what one does not hold.
    let e = c.plugin("nope", b"").unwrap_err();
    assert_eq!(e.kind(), Some(ErrorKind::UnknownPlugin));
    assert!(e.to_string().contains("(it has: append, blast, counter, paramedic)"), "{e}");
    let e = c.board_put("big", &vec![0; 64 * 1024 + 1]).unwrap_err();
    assert_eq!(e.kind(), Some(ErrorKind::TooLarge), "{e}");
    assert!(e.to_string().contains("65537 bytes"), "{e}");
    assert_eq!(c.unlock("never-taken").unwrap_err().kind(), Some(ErrorKind::NotHeld));
    let bad = postcard_garbage();
    let e = c.plugin("append", &bad).unwrap_err();
    assert_eq!(e.kind(), Some(ErrorKind::BadRequest), "{e}");

    // A lock request that times out is withdrawn: the next one is granted at once.
    c.lock("L", wire::LockMode::Exclusive).unwrap();
    let out = a.run(0, &["lock-timeout", "L", "300"]);
    assert!(out.starts_with("not locked: no reply within 300ms"), "{out}");
    c.unlock("L").unwrap();
    assert!(a.run(0, &["lock-timeout", "L", "5000"]).starts_with("locked after"));

    // Still serving.
    c.ping().unwrap();
    assert_eq!(c.board_put("k", b"v").unwrap(), 1);
    let st = a.status(0);
    assert_eq!(st["clients"].as_array().unwrap().len(), 2, "{st}");
    drop(s);
    drop(port);
}

/// A killed client's lock, global memory, subscription and port socket are released;
/// a killed agent's socket and rendezvous entry are detected as stale and replaced,
/// while a live agent's node cannot be taken twice.
#[test]
fn dead_clients_and_dead_agents_are_cleaned_up_after() {
    let mut a = Agents::new(1, false);
    let l = a.spawn(0, &["hold-all", "K"]);
    assert_eq!(l.next(Duration::from_secs(20)), "holding");
    let st = a.status(0);
    assert_eq!(st["gma_blocks"], 1);
    assert_eq!(st["clients"].as_array().unwrap().len(), 1);
    let port = st["clients"][0]["port"].as_u64().unwrap();
    let sock = gepsea_net::namespace_dir(&a.ns).join(format!("node-1/port-{port}.sock"));
    assert!(sock.exists());
    let pid = a.others[0].id();
    kill_tree(pid);
    let _ = a.others[0].wait();
    wait_until(Duration::from_secs(10), || a.status(0)["clients"].as_array().unwrap().is_empty(), "the agent to notice the death");
    let st = a.status(0);
    assert_eq!(st["gma_blocks"], 0, "{st}");
    assert_eq!(st["locks"], serde_json::json!([]), "{st}");
    assert!(!sock.exists(), "the dead client's socket is removed");
    assert!(a.run(0, &["lock-timeout", "K", "5000"]).starts_with("locked after"));

    // A second agent for a live node is refused.
    let out = a.cmd(0, env!("CARGO_BIN_EXE_gepsea")).args(["agent", "--node-id", "1"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already running"), "{}", String::from_utf8_lossy(&out.stderr));
    // Killed, its socket and rendezvous entry stay behind; a new agent replaces them.
    a.kill_node(0);
    let agent_sock = gepsea_agent::server::agent_socket(&a.ns, 1);
    assert!(agent_sock.exists() && a.dir.join("rv/agent-1.json").exists());
    let c = a.start_agent(0, 1);
    a.agents[0] = Some(c);
    a.wait_ready(0);
    assert!(a.log(0).contains("removing stale agent socket"), "{}", a.log(0));
    assert!(a.log(0).contains("replacing stale rendezvous entry"), "{}", a.log(0));
    assert_eq!(a.run(0, &["ping"]).trim(), "pong node 1");
}

fn postcard_garbage() -> Vec<u8> {
    vec![0xff; 7]
}

/// The C example: at most 25 lines of integration, offloading compression and writing
/// of its results to the agent; the output equals the results.
#[test]
fn c_example_offloads_its_output() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let src = root.join("examples/offload.c");
    let text = std::fs::read_to_string(&src).unwrap();
    let integration = text.lines().filter(|l| l.contains("/* gepsea */")).count();
    assert!(integration > 0 && integration <= 25, "{integration} lines of integration");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_gepsea")).parent().unwrap().to_path_buf();
    let lib = bin_dir.join("libgepsea_client.so");
    assert!(lib.exists(), "{} missing (cargo builds it with the workspace)", lib.display());
    let a = Agents::new(1, false);
    let exe = a.dir.join("offload");
    let cc = Command::new("cc")
        .arg(&src)
        .arg("-I")
        .arg(root.join("include"))
        .arg("-L")
        .arg(&bin_dir)
        .arg(format!("-Wl,-rpath,{}", bin_dir.display()))
        .args(["-lgepsea_client", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .output()
        .unwrap();
    assert!(cc.status.success(), "cc: {}", String::from_utf8_lossy(&cc.stderr));
    let out_file = a.dir.join("results.zst");
    let out = a.cmd(0, exe.to_str().unwrap()).arg(&out_file).arg("2000").output().unwrap();
    assert!(out.status.success(), "offload: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // The same results, computed here.
    let mut want = String::new();
    for n in 1..=2000u64 {
        let (mut x, mut steps) = (n, 0);
        while x != 1 {
            x = if x % 2 == 0 { x / 2 } else { 3 * x + 1 };
            steps += 1;
        }
        want.push_str(&format!("{n} {steps}\n"));
    }
    let z = std::fs::read(&out_file).unwrap();
    let got = zstd_decode(&z);
    assert_eq!(String::from_utf8(got).unwrap(), want);
    assert!(z.len() < want.len() / 2, "compressed {} vs {}", z.len(), want.len());
    // A missing agent is a clear error, not a crash.
    let out = Command::new(&exe).env("GEPSEA_NAMESPACE", "no-such-namespace").arg(&out_file).arg("10").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no agent for node 1"), "{}", String::from_utf8_lossy(&out.stderr));
}

fn zstd_decode(z: &[u8]) -> Vec<u8> {
    gepsea_agent::core::compress::Engine::new().decompress(&Codec::Zstd, z).unwrap()
}

// ----- four namespaces -----------------------------------------------------------------

#[test]
fn four_nodes_advertising_board_and_locks() {
    if skip_netns() {
        return;
    }
    let mut a = Agents::new(4, true);
    // Advertising: a subscriber on every node, then 4 publishers × 500 adverts.
    let subs: Vec<Lines> = (0..4).map(|i| a.spawn(i, &["subscribe", "t", "2000"])).collect();
    for s in &subs {
        assert_eq!(s.next(Duration::from_secs(20)), "subscribed");
    }
    let pubs: Vec<Lines> = (0..4).map(|i| a.spawn(i, &["publish", "t", "500"])).collect();
    for p in &pubs {
        assert_eq!(p.next(Duration::from_secs(60)), "published 500");
    }
    for s in &subs {
        assert_eq!(s.next(Duration::from_secs(60)), "received 2000 extra 0 from {1: 500, 2: 500, 3: 500, 4: 500}");
    }
    // Bulletin board: 4 × 10,000 concurrent CAS increments of one key.
    let incs: Vec<Lines> = (0..4).map(|i| a.spawn(i, &["cas-incr", "counter", "10000"])).collect();
    let mut conflicts = 0;
    for l in &incs {
        let line = l.next(Duration::from_secs(300));
        assert!(line.starts_with("done 10000 conflicts "), "{line}");
        conflicts += line.rsplit(' ').next().unwrap().parse::<u64>().unwrap();
    }
    eprintln!("CAS conflicts (retries): {conflicts}");
    assert_eq!(a.run(2, &["board-get", "counter"]).trim(), "value 40000 version 40000");
    // Locks: mutual exclusion over a file counter no process could keep consistent alone.
    let file = a.dir.join("shared-counter");
    let loops: Vec<Lines> = (0..4).map(|i| a.spawn(i, &["lock-loop", "L", "250", file.to_str().unwrap()])).collect();
    for l in &loops {
        assert_eq!(l.next(Duration::from_secs(120)), "done 250");
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "1000\n");
    assert_eq!(std::fs::read_to_string(format!("{}.log", file.display())).unwrap().lines().count(), 1000);
    // FIFO: while node 1 holds F, nodes 2, 3, 4 queue in that order; killing the
    // holder's process hands the lock on in queue order.
    let holder = a.spawn(0, &["hold-lock", "F"]);
    assert_eq!(holder.next(Duration::from_secs(20)), "locked");
    let log = a.dir.join("fifo.log");
    let mut waiters = Vec::new();
    for (i, tag) in [(1, "B"), (2, "C"), (3, "D")] {
        let w = a.spawn(i, &["lock-queue", "F", tag, log.to_str().unwrap()]);
        assert_eq!(w.next(Duration::from_secs(20)), "queued");
        wait_until(Duration::from_secs(20), || waiting_on(&a, "F") == i, "the lock queue to grow");
        waiters.push(w);
    }
    let holder_pid = a.others[a.others.len() - 4].id();
    kill_tree(holder_pid);
    for w in &waiters {
        assert_eq!(w.next(Duration::from_secs(30)), "done");
    }
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "B\nC\nD\n");
}

#[test]
fn killing_a_nodes_agent_releases_its_locks_and_reelects_the_scheduler() {
    if skip_netns() {
        return;
    }
    let mut a = Agents::new(4, true);
    assert_eq!(a.run(3, &["scheduler"]).trim(), "scheduler 1");
    // Board values survive their owner: 4 × 500 increments before, 3 × 500 after.
    for i in 0..4 {
        a.run(i, &["cas-incr", "survivor", "500"]);
    }
    // Node 1's process holds X; node 3 waits for it.
    let holder = a.spawn(0, &["hold-lock", "X"]);
    assert_eq!(holder.next(Duration::from_secs(20)), "locked");
    let waiter = a.spawn(2, &["lock-timeout", "X", "60000"]);
    // 300 tasks submitted from node 2; workers on nodes 2, 3, 4 (5 ms each).
    a.run(1, &["submit", "300"]);
    let log = a.dir.join("tasks.log");
    let workers: Vec<Lines> = (1..4).map(|i| a.spawn(i, &["work", log.to_str().unwrap(), "4", "5"])).collect();
    for w in &workers {
        assert_eq!(w.next(Duration::from_secs(20)), "working");
    }
    wait_until(Duration::from_secs(30), || std::fs::read_to_string(&log).map_or(0, |s| s.lines().count()) >= 60, "work to start");
    a.kill_node(0);
    let line = waiter.next(Duration::from_secs(60));
    assert!(line.starts_with("locked after"), "{line}");
    let mut worked = 0;
    for w in &workers {
        let l = w.next(Duration::from_secs(120));
        worked += l.strip_prefix("worked ").expect(&l).parse::<usize>().unwrap();
    }
    let done = std::fs::read_to_string(&log).unwrap();
    let mut names: Vec<&str> = done.lines().collect();
    assert_eq!(names.len(), worked);
    names.sort_unstable();
    names.dedup();
    let mut want: Vec<String> = (0..300).map(|i| format!("task-{i}")).collect();
    want.sort_unstable();
    assert_eq!(names, want.iter().map(String::as_str).collect::<Vec<_>>(), "every task ran");
    eprintln!("tasks run: {worked} for 300 submitted (re-runs after the failover: {})", worked - 300);
    for i in 1..4 {
        assert_eq!(a.run(i, &["scheduler"]).trim(), "scheduler 2");
        let st = a.status(i);
        assert_eq!(st["view"], serde_json::json!([2, 3, 4]), "{st}");
    }
    for i in 1..4 {
        a.run(i, &["cas-incr", "survivor", "500"]);
    }
    assert_eq!(a.run(3, &["board-get", "survivor"]).trim().split(' ').nth(1), Some("3500"));
}

/// An agent that is stopped (SIGTERM, as a job's leader stops its node's agent at the
/// end) says so before it goes: the others drop it from their views at once, as having
/// left rather than failed (no reconnect timeout to wait out: a job's master waited 3 s
/// for it), and serve on without it.
#[test]
fn a_stopped_agent_leaves_and_the_others_drop_it_at_once() {
    let mut a = Agents::new(3, false);
    a.run(0, &["cas-incr", "shared", "5"]);
    let mut third = a.agents[2].take().unwrap();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(third.id() as i32, libc::SIGTERM) };
    assert!(third.wait().unwrap().success(), "agent 3 did not stop cleanly: {}", a.log(2));
    wait_until(
        Duration::from_secs(20),
        || (0..2).all(|i| a.status(i)["view"] == serde_json::json!([1, 2])),
        "nodes 1 and 2 to drop node 3",
    );
    for i in 0..2 {
        let log = a.log(i);
        assert!(log.contains("agent 3 left"), "node {}: {log}", i + 1);
        assert!(!log.contains("agent 3 failed"), "node {} took the leave for a failure: {log}", i + 1);
    }
    a.run(1, &["cas-incr", "shared", "5"]);
    assert_eq!(a.run(0, &["board-get", "shared"]).trim().split(' ').nth(1), Some("10"));
}

/// A node that goes silent without closing its connections (a host powered off, a
/// cable pulled: no FIN, no RST, nothing answers) is declared dead by the others while
/// nothing is being said to it (the kernel's keepalive probes go unanswered; without
/// them a silent peer would be found only by data left unacknowledged, after the
/// kernel's retransmissions, about 15 minutes), and the silent node declares them dead
/// too. The survivors go on serving.
#[test]
fn a_node_that_goes_silent_is_declared_dead_while_idle() {
    if skip_netns() {
        return;
    }
    let a = Agents::new(3, true);
    for i in 0..3 {
        assert_eq!(a.status(i)["view"], serde_json::json!([1, 2, 3]));
    }
    a.run(0, &["cas-incr", "before", "5"]);
    a.bed.as_ref().unwrap().cut(2).expect("taking node 3 off the bridge");
    let cut = Instant::now();
    wait_until(
        Duration::from_secs(60),
        || (0..2).all(|i| a.status(i)["view"] == serde_json::json!([1, 2])) && a.status(2)["view"] == serde_json::json!([3]),
        "nodes 1 and 2 to declare node 3 dead, and node 3 them",
    );
    eprintln!("silent node declared dead {:.1} s after the cut (peer timeout 1.5 s)", cut.elapsed().as_secs_f64());
    for i in 0..2 {
        a.run(i, &["cas-incr", "after", "5"]);
    }
    assert_eq!(a.run(1, &["board-get", "after"]).trim().split(' ').nth(1), Some("10"));
}

/// A node whose agent died and was started again (same node id, new incarnation) is
/// let back in: every agent's view holds it again with its new pid, the keys, locks
/// and merge streams it now owns are handed to it (a lock held and waited on across
/// the move stays exclusive and its queue is served), and it takes tasks again.
#[test]
fn a_restarted_agent_rejoins_and_gets_its_keys_locks_and_tasks_back() {
    if skip_netns() {
        return;
    }
    use gepsea_agent::core::board::ranked;
    use gepsea_agent::core::{lock_key, merge_key};
    let mut a = Agents::new(3, true);
    // Names whose owner is node 3 with it and node 1 or 2 without it.
    let back_to_3 = |key: &dyn Fn(&str) -> String, stem: &str| {
        (0..1000).map(|i| format!("{stem}{i}")).find(|n| ranked(&key(n), &[1, 2, 3])[0] == 3).unwrap()
    };
    let lock = back_to_3(&|n| lock_key(n), "L");
    let key = back_to_3(&|n| n.to_string(), "K");
    let stream = back_to_3(&|n| merge_key(n), "M");
    for i in 0..3 {
        a.run(i, &["cas-incr", "counter", "100"]);
    }
    a.kill_node(2);
    wait_until(
        Duration::from_secs(30),
        || (0..2).all(|i| a.status(i)["view"] == serde_json::json!([1, 2])),
        "nodes 1 and 2 to drop node 3",
    );

    // While node 3 is away: a key written, a lock held by node 1 and waited for by
    // node 2, a merge stream half pushed, all owned by node 1 or 2.
    a.run(0, &["cas-incr", &key, "50"]);
    let holder = a.spawn(0, &["hold-lock", &lock]);
    let holder_pid = a.others.last().unwrap().id();
    assert_eq!(holder.next(Duration::from_secs(20)), "locked");
    let waiter = a.spawn(1, &["lock-timeout", &lock, "60000"]);
    wait_until(Duration::from_secs(20), || waiting_on(&a, &lock) == 1, "node 2 to queue for the lock");
    let c = connect(&a, 1).unwrap();
    let rec = |k: u32| Record { key: k.to_be_bytes().to_vec(), value: vec![] };
    c.merge_open(&stream, 2).unwrap();
    c.merge_push(&stream, 0, vec![rec(1), rec(4)], true).unwrap();

    // Node 3's agent again, same node id.
    a.agents[2] = Some(a.start_agent(2, 3));
    a.wait_ready(2);
    let me3 = a.status(2);
    assert_eq!(me3["restarted"], true, "{me3}");
    wait_until(
        Duration::from_secs(30),
        || (0..3).all(|i| a.status(i)["view"] == serde_json::json!([1, 2, 3]) && a.status(i)["deferred_ops"] == 0),
        "every agent to see node 3 back",
    );
    for i in 0..2 {
        let st = a.status(i);
        assert_eq!(st["dead"], serde_json::json!([]), "{st}");
        assert_eq!(st["rejoins"], 1, "{st}");
        let peer3 = st["peers"].as_array().unwrap().iter().find(|p| p[0] == 3).cloned();
        assert_eq!(peer3, Some(serde_json::json!([3, me3["pid"], me3["incarnation"]])), "node {} knows the new agent: {st}", i + 1);
    }
    // The lock moved to node 3 with its holder and its queue.
    let on = |i: usize| a.status(i)["locks"].as_array().unwrap().iter().any(|l| l["name"] == lock.as_str());
    wait_until(Duration::from_secs(10), || on(2), "the lock to move to node 3");
    assert!(!on(0) && !on(1), "the old owner dropped it");
    let l = a.status(2)["locks"].as_array().unwrap().iter().find(|l| l["name"] == lock.as_str()).cloned().unwrap();
    assert_eq!((l["holders"].as_array().unwrap().len(), l["waiting"].as_array().unwrap().len()), (1, 1), "{l}");
    let line = a.run(2, &["lock-timeout", &lock, "1500"]);
    assert!(line.starts_with("not locked"), "node 1 still holds it across the move: {line}");
    kill_tree(holder_pid);
    let line = waiter.next(Duration::from_secs(30));
    assert!(line.starts_with("locked after"), "the waiter handed over is served by the new owner: {line}");

    // The board entry and the merge stream followed their key.
    assert_eq!(a.run(2, &["board-get", &key]).trim().split(' ').nth(1), Some("50"));
    assert_eq!(a.run(1, &["board-get", &key]).trim().split(' ').nth(1), Some("50"));
    c.merge_push(&stream, 1, vec![rec(2), rec(3)], true).unwrap();
    assert_eq!(c.merge_pull(&stream).unwrap(), (vec![rec(1), rec(2), rec(3), rec(4)], true));
    assert_eq!(a.status(2)["merge_streams"], 0, "pulled to the end on its new owner");
    for i in 0..3 {
        a.run(i, &["cas-incr", "counter", "100"]);
    }
    assert_eq!(a.run(2, &["board-get", "counter"]).trim().split(' ').nth(1), Some("600"));

    // It takes tasks again: 40 tasks, only node 3 works.
    assert_eq!(a.run(2, &["scheduler"]).trim(), "scheduler 1");
    a.run(0, &["submit", "40"]);
    let log = a.dir.join("rejoin-tasks.log");
    let w = a.spawn(2, &["work", log.to_str().unwrap(), "2"]);
    assert_eq!(w.next(Duration::from_secs(20)), "working");
    assert_eq!(w.next(Duration::from_secs(60)), "worked 40");
}

fn kill_tree(pid: u32) {
    // `ip netns exec` execs the program, so the child's pid is the probe itself.
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
}

fn waiting_on(a: &Agents, lock: &str) -> usize {
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

fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
