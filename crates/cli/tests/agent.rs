//! The agents as real processes on one host (no root needed): `gepsea agent` per node,
//! application processes (`gepsea-agentprobe`, the Rust client, the C example)
//! registered with them. Two agents on loopback exercise every component and primitive
//! end to end, and bad input from clients. `agent_nodes.rs` runs agents on four
//! network namespaces.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gepsea_client::wire::{self, Codec, ErrorKind, Record};
use gepsea_client::Api;

mod agent_harness;

use agent_harness::*;

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
    // A namespace that is not one plain path component, named with where it came from.
    let out = Command::new(&exe).env("GEPSEA_NAMESPACE", "../up").arg(&out_file).arg("10").output().unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.contains("GEPSEA_NAMESPACE: namespace \"../up\" starts with '.'"), "{e}");
}

fn zstd_decode(z: &[u8]) -> Vec<u8> {
    gepsea_agent::core::compress::Engine::new().decompress(&Codec::Zstd, z).unwrap()
}

/// `--tcp-congestion`: the agent's links run under the algorithm named (here, what an
/// agent on another node connecting to it gets: the accepted end), and a name the
/// kernel cannot give is refused in one line before anything is created.
#[test]
fn the_agents_links_take_the_congestion_control_named_and_a_bad_name_is_refused() {
    let default = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap().trim().to_string();
    let wanted = if default == "reno" { "cubic" } else { "reno" };
    let mut a = Agents::new(0, false);
    a.agents.push(Some(a.start_agent_with(0, 1, &["--tcp-congestion", wanted])));
    a.wait_ready(0);
    let entry: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(a.dir.join("rv/agent-1.json")).unwrap()).unwrap();
    let listen: std::net::SocketAddr = entry["listen"].as_str().unwrap().parse().unwrap();
    let _peer = std::net::TcpStream::connect(listen).unwrap();
    let filter = format!("( sport = :{} )", listen.port());
    // The accepted socket's algorithm, once the agent has taken it from the kernel's
    // queue (until then it shows the listener's, the system's default): an address
    // line, then one that starts with the algorithm.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = Command::new("ss").args(["-tinH", "state", "established", &filter]).output().expect("running ss (iproute2)");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if text.lines().nth(1).and_then(|info| info.split_whitespace().next()) == Some(wanted) {
            break;
        }
        assert!(Instant::now() < deadline, "wanted {wanted} (system default {default}): {text:?}\n{}", a.log(0));
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = a.status(0);
    assert_eq!((st["tcp_congestion"].as_str(), st["system_congestion"].as_str()), (Some(wanted), Some(default.as_str())), "{st}");

    let e = refused_agent(&a, 2, &["--tcp-congestion", "no-such-algorithm"]);
    assert!(e.lines().count() == 1 && e.contains("\"no-such-algorithm\" cannot be used here"), "{e}");
}

/// The standard error of `gepsea agent` for node `node` given `args`, which must have
/// refused to start (and left no socket behind).
fn refused_agent(a: &Agents, node: u32, args: &[&str]) -> String {
    let out = a
        .cmd(node as usize - 1, env!("CARGO_BIN_EXE_gepsea"))
        .env("RUST_BACKTRACE", "1")
        .args(["agent", "--node-id", &node.to_string()])
        .args(args)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert!(!out.status.success(), "{args:?} was taken: {e}");
    assert!(!gepsea_agent::server::agent_socket(&a.ns, node).exists());
    e
}

/// `--tcp-buffer`: the agent's links get the kernel buffers named (the accepted end of a
/// connection from another node), `auto` leaves them to the kernel, and a size that is
/// not one is refused, naming it.
#[test]
fn the_agents_links_take_the_socket_buffers_named_or_the_kernels_sizing() {
    let limit = gepsea_net::tcp::buffer_limit().expect("reading net.core.rmem_max and wmem_max");
    let wanted = (1usize << 20).min(limit);
    let mut a = Agents::new(0, false);
    a.agents.push(Some(a.start_agent_with(0, 2, &["--tcp-buffer", &wanted.to_string()])));
    a.agents.push(Some(a.start_agent_with(1, 2, &["--tcp-buffer", "auto"])));
    a.wait_ready(0);
    a.wait_ready(1);
    let listen_of = |node: u32| -> std::net::SocketAddr {
        let entry: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(a.dir.join(format!("rv/agent-{node}.json"))).unwrap()).unwrap();
        entry["listen"].as_str().unwrap().parse().unwrap()
    };
    let listen = listen_of(1);
    let _peer = std::net::TcpStream::connect(listen).unwrap();
    let filter = format!("( sport = :{} )", listen.port());
    let doubled = 2 * wanted;
    // Each accepted socket's skmem line, `skmem:(r0,rb…,t0,tb…,…)`, once the agent has
    // taken it from the kernel's queue (until then the kernel's sizing shows).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = Command::new("ss").args(["-tmnH", "state", "established", &filter]).output().expect("running ss (iproute2)");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let mems: Vec<&str> = text.lines().filter(|l| l.contains("skmem:(")).collect();
        if !mems.is_empty() && mems.iter().all(|m| m.contains(&format!(",rb{doubled},")) && m.contains(&format!(",tb{doubled},"))) {
            break;
        }
        assert!(Instant::now() < deadline, "asked for {wanted} each way: {text}\n{}", a.log(0));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(a.status(0)["tcp_buffer"].as_u64(), Some(wanted as u64));
    assert!(a.status(1)["tcp_buffer"].is_null(), "`auto`: the kernel's sizing");

    let e = refused_agent(&a, 3, &["--tcp-buffer", "lots"]);
    let first = e.lines().next().unwrap_or("");
    assert!(
        first.contains("invalid value 'lots' for '--tcp-buffer <SIZE|auto>': neither a size in bytes (4194304, 4MiB, 4MB) nor `auto`"),
        "{e}"
    );
}

/// `--tcp-checksums`: an agent told `headers` says in its handshake that it trusts TCP
/// for data (a link to another such agent then carries data without payload
/// checksums), one left at the default does not, `gepsea agent status` says which, and
/// a value that is neither is refused naming the flag.
#[test]
fn the_agents_links_checksum_payloads_unless_told_to_trust_tcp() {
    use gepsea_net::frame::{Addr, Channel, Frame, FrameDecoder, Header, Kind, FLAG_TRUST_TCP};
    use std::io::Read;
    let mut a = Agents::new(0, false);
    a.agents.push(Some(a.start_agent_with(0, 2, &["--tcp-checksums", "headers"])));
    a.agents.push(Some(a.start_agent(1, 2)));
    a.wait_ready(0);
    a.wait_ready(1);
    // A hand-driven peer that trusts TCP says hello to agent `i`: whether its answer does.
    let trusts_tcp = |i: usize| -> bool {
        let entry: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(a.dir.join(format!("rv/agent-{}.json", i + 1))).unwrap()).unwrap();
        let mut s = std::net::TcpStream::connect(entry["listen"].as_str().unwrap()).unwrap();
        let mut hello = Header::new(Kind::Hello, Channel::Control, Addr::new(99, 9), Addr::new(i as u32 + 1, 0));
        hello.tag = 7;
        hello.flags |= FLAG_TRUST_TCP;
        s.write_all(&Frame::control(hello).to_bytes()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut dec = FrameDecoder::new(1 << 20);
        loop {
            if let Some((h, _)) = dec.next_frame().expect("a well-formed answer") {
                assert_eq!(h.kind, Kind::HelloAck, "{}", a.log(i));
                return h.flags & FLAG_TRUST_TCP != 0;
            }
            let n = s.read(dec.spare()).expect("the agent's answer");
            assert!(n > 0, "agent {} closed the connection: {}", i + 1, a.log(i));
            dec.filled(n);
        }
    };
    assert!(trusts_tcp(0), "an agent given --tcp-checksums headers did not say it trusts TCP");
    assert!(!trusts_tcp(1), "an agent left at the default said it trusts TCP");
    assert_eq!((a.status(0)["tcp_checksums"].as_str(), a.status(1)["tcp_checksums"].as_str()), (Some("headers"), Some("full")));
    let human = a.cmd(0, env!("CARGO_BIN_EXE_gepsea")).args(["agent", "status"]).output().unwrap();
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("checksums     headers; data payloads trusted to TCP"), "{text}");

    let e = refused_agent(&a, 3, &["--tcp-checksums", "crc"]);
    let first = e.lines().next().unwrap_or("");
    assert!(first.contains("--tcp-checksums") && first.contains("neither `full` nor `headers`"), "{e}");
}
