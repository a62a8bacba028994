//! Tests of the port's internals: quiet TCP sets, the timers' links, acknowledgements at
//! close, forgotten peers, and the spin extension's rules; the behaviour seen through
//! the API is tested in `tests/`.

use super::*;

const MIB: usize = 1 << 20;

/// A hub port with `peers` TCP links, each carried one message from the hub; the
/// hub's and its peers' runtime directory goes with the namespace when dropped.
fn hub_with_tcp_peers(peers: u32) -> (NsDir, Port, Vec<Port>) {
    let ns = NsDir(format!("quiet{}x{peers}", std::process::id()));
    let open = |node: u32| {
        let mut c = PortConfig::new(&ns.0, Addr::new(node, 1));
        c.listen = Some("127.0.0.1:0".parse().unwrap());
        Port::open(c).unwrap()
    };
    let hub = open(100);
    let others: Vec<Port> = (1..=peers).map(open).collect();
    for p in &others {
        hub.add_route(p.addr(), p.listen_addr().unwrap());
        let r = p.irecv(Some(hub.addr()), Some(1), 8);
        let s = hub.isend(p.addr(), 1, b"hello".to_vec());
        p.wait_timeout(r, Duration::from_secs(20)).unwrap();
        hub.wait_timeout(s, Duration::from_secs(20)).unwrap();
    }
    (ns, hub, others)
}

struct NsDir(String);
impl Drop for NsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(namespace_dir(&self.0));
    }
}

/// Polls `port` as an event loop does (`poll_events`, which reads the TCP
/// connections itself) until every request in `wanted` has completed, for at most
/// 20 s; whether they all did.
fn polled_until_complete(port: &Port, wanted: &[ReqId]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut left: std::collections::HashSet<ReqId> = wanted.iter().copied().collect();
    let mut events = Vec::new();
    while !left.is_empty() && Instant::now() < deadline {
        port.poll_events(&mut events);
        for e in events.drain(..) {
            if let Event::Completed(id) = e {
                left.remove(&id);
            }
        }
    }
    left.is_empty()
}

#[test]
fn a_polling_application_quiets_its_tcp_links_at_any_count_and_reads_them_itself() {
    // Both ways of reading while quiet: each connection (few), the set's edges (many).
    for peers in [2, READ_EACH_MAX as u32 + 2] {
        let (ns, hub, others) = hub_with_tcp_peers(peers);
        hub.enable_events();
        hub.start_polling();
        assert!(!hub.sh.st.lock().tcp_set.is_watched(), "{peers} peers: taken from the event thread");
        // Quiet, the application's own polls take in what the peers send.
        let recvs: Vec<_> = others.iter().map(|p| hub.irecv(Some(p.addr()), Some(3), 8)).collect();
        let sends: Vec<_> = others.iter().map(|p| p.isend(hub.addr(), 3, b"quiet".to_vec())).collect();
        assert!(polled_until_complete(&hub, &recvs), "{peers} peers: the messages came while quiet");
        // A link set up while quiet: its handshake is read by the application too.
        let late = {
            let mut c = PortConfig::new(&ns.0, Addr::new(99, 1));
            c.listen = Some("127.0.0.1:0".parse().unwrap());
            Port::open(c).unwrap()
        };
        hub.add_route(late.addr(), late.listen_addr().unwrap());
        let r = hub.irecv(Some(late.addr()), Some(4), 8);
        let s = hub.isend(late.addr(), 4, b"hi".to_vec());
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let lr = late.irecv(Some(hub.addr()), Some(4), 8);
                late.wait_timeout(lr, Duration::from_secs(20)).unwrap();
                let ls = late.isend(hub.addr(), 4, b"hi back".to_vec());
                late.wait_timeout(ls, Duration::from_secs(20)).unwrap();
            });
            assert!(polled_until_complete(&hub, &[r]), "{peers} peers: a new link's answer came while quiet");
            assert!(!hub.sh.st.lock().tcp_set.is_watched(), "{peers} peers: still quiet");
        });
        hub.stop_polling();
        hub.wait_timeout(s, Duration::from_secs(20)).unwrap();
        assert!(hub.sh.st.lock().tcp_set.is_watched(), "{peers} peers: handed back");
        for (p, s) in others.iter().zip(sends) {
            p.wait_timeout(s, Duration::from_secs(20)).unwrap();
        }
        // The links still carry messages both ways once handed back.
        for p in &others {
            let r = hub.irecv(Some(p.addr()), Some(2), 8);
            let s = p.isend(hub.addr(), 2, b"back".to_vec());
            hub.wait_timeout(r, Duration::from_secs(20)).unwrap();
            p.wait_timeout(s, Duration::from_secs(20)).unwrap();
        }
    }
}

#[test]
fn the_timers_look_only_at_the_links_that_have_a_deadline() {
    // Inline progress: nothing runs the hub's timers behind the test's back.
    let ns = NsDir(format!("timed{}", std::process::id()));
    let open = |node: u32, progress: Progress| {
        let mut c = PortConfig::new(&ns.0, Addr::new(node, 1));
        c.listen = Some("127.0.0.1:0".parse().unwrap());
        c.progress = progress;
        // The message to the peer that left is never delivered: do not wait for it.
        c.linger = Duration::from_millis(100);
        Port::open(c).unwrap()
    };
    let hub = open(100, Progress::Inline);
    let mut others: Vec<Port> = (1..=6).map(|n| open(n, Progress::Thread)).collect();
    let timed = |hub: &Port| hub.sh.st.lock().timed.clone();
    for p in &others {
        hub.add_route(p.addr(), p.listen_addr().unwrap());
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let m = p.recv(Some(hub.addr()), Some(1), 8).unwrap();
                p.send(hub.addr(), 2, m.data).unwrap();
            });
            let s = hub.isend(p.addr(), 1, b"hello".to_vec());
            let r = hub.irecv(Some(p.addr()), Some(2), 8);
            hub.wait_timeout(s, Duration::from_secs(20)).unwrap();
            hub.wait_timeout(r, Duration::from_secs(20)).unwrap();
        });
    }
    // The last answer left an acknowledgement due at the hub: its link has a
    // deadline, the links whose acknowledgements went out have none.
    let last = others.last().unwrap().addr();
    assert!(timed(&hub).contains(&last), "{:?}", timed(&hub));
    assert!(hub.sh.st.lock().next_timer().is_some());
    // Once the acknowledgements are out (5 ms), no link has a deadline.
    let idle = hub.irecv(None, Some(99), 8);
    assert!(hub.wait_timeout(idle, Duration::from_millis(30)).is_err());
    assert!(hub.cancel(idle));
    assert_eq!(timed(&hub), HashSet::new());
    assert_eq!(hub.sh.st.lock().links.len(), 6);
    assert_eq!(hub.sh.st.lock().next_timer(), None);
    // A peer gone while a message to it is out: its link is down and reconnects.
    let gone = others.remove(0);
    let gone_addr = gone.addr();
    drop(gone);
    let _ = hub.isend(gone_addr, 3, b"anyone?".to_vec());
    let idle = hub.irecv(None, Some(99), 8);
    assert!(hub.wait_timeout(idle, Duration::from_millis(100)).is_err());
    assert_eq!(timed(&hub), HashSet::from([gone_addr]));
    assert!(hub.sh.st.lock().next_timer().is_some(), "a reconnect to try");
}

/// Port 1 of `node` in namespace `ns`, listening on a loopback TCP port.
fn tcp_port(ns: &NsDir, node: u32, reconnect_timeout: Option<Duration>) -> Port {
    let mut c = PortConfig::new(&ns.0, Addr::new(node, 1));
    c.listen = Some("127.0.0.1:0".parse().unwrap());
    if let Some(t) = reconnect_timeout {
        c.reconnect_timeout = t;
    }
    Port::open(c).unwrap()
}

/// A port that closes right after taking in a message acknowledges it first, so
/// the sender has nothing left to replay and its own close does not wait out its
/// linger for a reconnect that will never come (it did: every no-agent search's
/// master waited 5 s after its workers had gone).
#[test]
fn a_port_that_closes_acknowledges_what_it_received_first() {
    let ns = NsDir(format!("lastack{}", std::process::id()));
    let (sender, receiver) = (tcp_port(&ns, 1, None), tcp_port(&ns, 2, None));
    let to = receiver.addr();
    sender.add_route(to, receiver.listen_addr().unwrap());
    for round in 0..3u64 {
        sender.send(to, round, format!("message {round}").into_bytes()).unwrap();
    }
    for round in 0..3u64 {
        assert_eq!(receiver.recv(Some(sender.addr()), Some(round), 64).unwrap().data, format!("message {round}").into_bytes());
    }
    // Closed before its delayed acknowledgement (5 ms) was due.
    drop(receiver);
    let deadline = Instant::now() + Duration::from_secs(20);
    while sender.stats().connections_lost == 0 {
        assert!(Instant::now() < deadline, "the receiver's close never reached the sender");
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut st = sender.sh.st.lock();
    assert_eq!(st.links[&to].send.unacked(), 0, "frames the receiver took in are still held for replay");
    assert!(st.output_settled(), "the sender would wait out its linger to close");
}

/// A peer that said it left is forgotten at once: no link, no reconnect to try,
/// nothing held for it, and what waited on it fails rather than waiting out the
/// reconnect timeout.
#[test]
fn a_peer_that_left_is_forgotten_without_reconnecting() {
    let ns = NsDir(format!("forget{}", std::process::id()));
    let long = Some(Duration::from_secs(600));
    let (stays, leaves) = (tcp_port(&ns, 1, long), tcp_port(&ns, 2, long));
    let gone = leaves.addr();
    stays.add_route(gone, leaves.listen_addr().unwrap());
    stays.send(gone, 1, b"hello".to_vec()).unwrap();
    assert_eq!(leaves.recv(Some(stays.addr()), Some(1), 8).unwrap().data, b"hello");
    let waiting = stays.irecv(Some(gone), Some(2), 8);
    drop(leaves);
    stays.forget_peer(gone);
    match stays.wait_timeout(waiting, Duration::from_secs(20)) {
        Err(NetError::PeerFailed { peer, .. }) => assert_eq!(peer, gone),
        other => panic!("a receive from the peer that left: {other:?}"),
    }
    let mut st = stays.sh.st.lock();
    assert!(!st.links.contains_key(&gone), "its link is kept");
    assert!(!st.timed.contains(&gone), "a reconnect to it is still due");
    assert!(st.output_settled(), "closing would wait for it");
}

fn mark(in_flight: usize, moved: u64, at: Instant) -> SpinMark {
    SpinMark { in_flight, moved, at }
}

#[test]
fn a_new_transfer_is_spun_for_at_memory_speed() {
    let t = Instant::now();
    assert_eq!(spin_extension(None, mark(MIB, 0, t)), Some(Duration::from_nanos(1024 * SPIN_NS_PER_KIB)));
    assert_eq!(spin_extension(None, mark(0, 0, t)), None);
    // A second transfer announced on top of the first before anything moved.
    let later = t + Duration::from_micros(300);
    assert_eq!(spin_extension(Some(mark(MIB, 0, t)), mark(2 * MIB, 0, later)), Some(Duration::from_nanos(2048 * SPIN_NS_PER_KIB)));
}

#[test]
fn a_wait_after_a_large_message_spins_for_the_answer_in_proportion() {
    assert_eq!(answer_spin(0), None);
    assert_eq!(answer_spin(ANSWER_SPIN_MIN - 1), None, "the default spin covers small messages");
    // 64 KiB: taking it in is quick, but an answer as large is three trips away.
    assert_eq!(answer_spin(64 << 10), Some(ANSWER_SPIN_FLOOR));
    // 1 MiB: the peer takes it in (256 µs at 250 ns/KiB), then answers.
    assert_eq!(answer_spin(MIB as u64), Some(Duration::from_micros(512)));
    assert_eq!(answer_spin(4 * MIB as u64), Some(Duration::from_micros(2048)));
}

#[test]
fn a_stalled_transfer_is_not_spun_for_again() {
    let t = Instant::now();
    assert_eq!(spin_extension(Some(mark(MIB, 7, t)), mark(MIB, 7, t + Duration::from_micros(300))), None);
}

#[test]
fn a_transfer_moving_at_tcp_speed_keeps_the_spin() {
    // 1 MiB announced, 384 KiB arrived in the 256 µs spin (1.5 GB/s, a veth pair).
    let t = Instant::now();
    let now = mark(MIB - 384 * 1024, 384 * 1024, t + Duration::from_micros(256));
    assert_eq!(spin_extension(Some(mark(MIB, 0, t)), now), Some(Duration::from_nanos(640 * SPIN_NS_PER_KIB)));
}

#[test]
fn a_window_of_transfers_is_judged_by_bytes_moved_not_bytes_left() {
    // 16 MiB in flight throughout: each message that completes is replaced by a new
    // one, while 12 MiB moved in 4 ms (3 GB/s).
    let t = Instant::now();
    let now = mark(16 * MIB, 12 << 20, t + Duration::from_millis(4));
    assert!(spin_extension(Some(mark(16 * MIB, 0, t)), now).is_some());
}

#[test]
fn a_transfer_on_a_slow_link_is_slept_through() {
    // 64 KiB arrived in 52 ms: 10 Mbit/s.
    let t = Instant::now();
    let moved = 64 * 1024;
    let slow = mark(MIB - moved, moved as u64, t + Duration::from_millis(52));
    assert_eq!(spin_extension(Some(mark(MIB, 0, t)), slow), None);
    // Another transfer announced meanwhile does not keep a slow link spun for.
    assert_eq!(spin_extension(Some(mark(MIB, 0, t)), SpinMark { in_flight: 3 * MIB, ..slow }), None);
    // Just at the slowest rate still spun for, and just below it.
    let edge = t + Duration::from_nanos(64 * SLOWEST_SPUN_NS_PER_KIB);
    assert!(spin_extension(Some(mark(MIB, 0, t)), SpinMark { at: edge, ..slow }).is_some());
    let past = edge + Duration::from_nanos(1);
    assert!(spin_extension(Some(mark(MIB, 0, t)), SpinMark { at: past, ..slow }).is_none());
}
