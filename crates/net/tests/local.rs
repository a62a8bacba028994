//! Two processes on one node: every channel over shared memory, both directions at
//! once, verified byte for byte; RMA; event-descriptor readiness; peer failure.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use gepsea_net::{Addr, Completion, Event, NetError, Port, PortConfig};

fn peer_cmd(ns: &str, node: u32, port: u32, extra: &[&str]) -> Command {
    let mut c = Command::new(netpeer());
    c.args(["--ns", ns, "--node", &node.to_string(), "--port", &port.to_string()]).args(extra);
    c
}

fn exchange_pair(extra_a: &[&str], extra_b: &[&str], role_args: &[&str]) -> (String, String) {
    let ns = unique("loc");
    let _ns_dir = Ns(ns.clone());
    let mut a_args = extra_a.to_vec();
    a_args.extend(["exchange", "--peer", "0:2"]);
    a_args.extend(role_args);
    let mut b_args = extra_b.to_vec();
    b_args.extend(["exchange", "--peer", "0:1"]);
    b_args.extend(role_args);
    let mut a = Proc::spawn("a", peer_cmd(&ns, 0, 1, &a_args));
    let mut b = Proc::spawn("b", peer_cmd(&ns, 0, 2, &b_args));
    let ra = a.finish_ok(Duration::from_secs(120));
    let rb = b.finish_ok(Duration::from_secs(120));
    let copies = |p: &Proc| p.seen.iter().find(|l| l.starts_with("COPIES")).cloned().unwrap_or_default();
    (format!("{}\n{ra}", copies(&a)), format!("{}\n{rb}", copies(&b)))
}

/// The messages of `SIZES` above the eager threshold (16 KiB): those go by rendezvous.
fn rendezvous_count() -> usize {
    SIZES.split(',').filter(|s| s.parse::<usize>().unwrap() > 16 * 1024).count()
}

#[test]
fn normal_channel_1b_to_64mib_both_directions() {
    let (a, b) = exchange_pair(&[], &[], &["--sizes", SIZES]);
    let total: usize = SIZES.split(',').map(|s| s.parse::<usize>().unwrap()).sum();
    // Every rendezvous message is copied once, by its receiver, from the sender.
    let want =
        format!("COPIES {} single, 0 refused (0 not from the peer)\nOK exchanged 13 messages, {total} bytes verified", rendezvous_count());
    assert_eq!(a, want);
    assert_eq!(b, want);
}

#[test]
fn a_single_copy_offered_by_a_process_that_is_not_the_peer_is_refused() {
    // `a` names pid 1 (init) in its offers: `b` must not read from there (the kernel
    // says `a` is another process), and gets every byte through the ring instead.
    let (a, b) = exchange_pair(&["--claim-pid", "1"], &[], &["--sizes", SIZES]);
    let total: usize = SIZES.split(',').map(|s| s.parse::<usize>().unwrap()).sum();
    let n = rendezvous_count();
    assert_eq!(b, format!("COPIES 0 single, {n} refused ({n} not from the peer)\nOK exchanged 13 messages, {total} bytes verified"));
    // `b` stops offering after its first refusal (it takes a failed copy for a system
    // that forbids them), so how many of its messages `a` copied depends on timing.
    let (copies, rest) = a.split_once('\n').unwrap();
    assert_eq!(rest, format!("OK exchanged 13 messages, {total} bytes verified"));
    let single: usize = copies.strip_prefix("COPIES ").unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(single <= n && copies.ends_with(" single, 0 refused (0 not from the peer)"), "{copies}");
}

#[test]
fn normal_channel_through_the_ring_without_single_copy() {
    let (a, b) = exchange_pair(&["--no-single-copy"], &["--no-single-copy"], &["--sizes", SIZES]);
    let total: usize = SIZES.split(',').map(|s| s.parse::<usize>().unwrap()).sum();
    let want = format!("COPIES 0 single, 0 refused (0 not from the peer)\nOK exchanged 13 messages, {total} bytes verified");
    assert_eq!(a, want);
    assert_eq!(b, want);
}

#[test]
fn system_channel_beyond_the_credit_window() {
    let sizes = system_sizes();
    let total: usize = sizes.split(',').map(|s| s.parse::<usize>().unwrap()).sum();
    let (a, b) = exchange_pair(&[], &[], &["--system", "--sizes", &sizes]);
    assert_eq!(a, format!("COPIES 0 single, 0 refused (0 not from the peer)\nOK exchanged 300 messages, {total} bytes verified"));
    assert_eq!(b, a);
}

#[test]
fn inline_progress_against_event_thread() {
    let (a, b) = exchange_pair(&["--inline"], &[], &["--sizes", "1,16385,1048576,4194304"]);
    assert_eq!(a, b);
    assert!(a.ends_with("OK exchanged 4 messages, 5259266 bytes verified"), "{a}");
}

#[test]
fn rma_put_get_and_bounds() {
    let ns = unique("rma");
    let _ns_dir = Ns(ns.clone());
    let mut t = Proc::spawn("target", peer_cmd(&ns, 0, 2, &["rma-target", "--peer", "0:1", "--len", "3000000"]));
    let mut o = Proc::spawn("origin", peer_cmd(&ns, 0, 1, &["rma-origin", "--peer", "0:2", "--len", "3000000"]));
    assert_eq!(o.finish_ok(Duration::from_secs(60)), "OK rma 3000000 bytes; owner saw 2 puts, 2 gets, identical contents");
    assert_eq!(t.finish_ok(Duration::from_secs(60)), "OK puts 2 gets 2");
}

fn poll_readable(fd: i32, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    n == 1 && p.revents & libc::POLLIN != 0
}

#[test]
fn event_descriptor_is_readable_exactly_while_events_are_pending() {
    let ns = unique("evt");
    let _ns_dir = Ns(ns.clone());
    let port = Port::open(PortConfig::new(&ns, Addr::new(0, 1))).unwrap();
    // Two echoes: the child must outlive the checks (its exit is itself an event).
    let mut echo = Proc::spawn("echo", peer_cmd(&ns, 0, 2, &["echo", "--peer", "0:1", "--count", "2"]));
    let fd = port.enable_events();
    assert!(!poll_readable(fd, 0), "no events yet");
    let r = port.irecv(Some(Addr::new(0, 2)), Some(5), 100);
    let s = port.isend(Addr::new(0, 2), 5, &b"hello"[..]);
    assert!(poll_readable(fd, 10_000), "completion must make the descriptor readable");
    // Drain: both requests complete and each is reported once.
    let mut completed = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while completed.len() < 2 && std::time::Instant::now() < deadline {
        while let Some(e) = port.next_event() {
            if let Event::Completed(id) = e {
                completed.push(id);
            }
        }
        poll_readable(fd, 100);
    }
    completed.sort();
    let mut want = vec![r, s];
    want.sort();
    assert_eq!(completed, want);
    assert!(!poll_readable(fd, 0), "descriptor must be quiet once the queue is empty");
    let Completion::Received(m) = port.wait(r).unwrap() else { panic!() };
    assert_eq!(m.data, b"hello");
    port.send(Addr::new(0, 2), 6, &b"bye"[..]).unwrap();
    assert_eq!(port.recv(Some(Addr::new(0, 2)), Some(6), 10).unwrap().data, b"bye");
    echo.finish_ok(Duration::from_secs(10));
    // The peer's exit is reported as an event too (after the completions of the last
    // send and receive, which are still queued: keep draining until it comes).
    let mut saw_failure = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !saw_failure && std::time::Instant::now() < deadline {
        poll_readable(fd, 100);
        while let Some(e) = port.next_event() {
            saw_failure |= matches!(e, Event::PeerFailed { peer, .. } if peer == Addr::new(0, 2));
        }
    }
    assert!(saw_failure, "no PeerFailed event within 10 s of the peer's exit");
}

#[test]
fn killed_peer_fails_pending_requests() {
    let ns = unique("die");
    let _ns_dir = Ns(ns.clone());
    let port = Port::open(PortConfig::new(&ns, Addr::new(0, 1))).unwrap();
    let mut echo = Proc::spawn("echo", peer_cmd(&ns, 0, 2, &["echo", "--peer", "0:1", "--count", "100"]));
    let peer = Addr::new(0, 2);
    // One round trip proves the connection is up.
    port.send(peer, 1, &b"x"[..]).unwrap();
    assert_eq!(port.recv(Some(peer), Some(1), 10).unwrap().data, b"x");
    let pending = port.irecv(Some(peer), Some(2), 10);
    echo.kill();
    match port.wait_timeout(pending, Duration::from_secs(10)) {
        Err(NetError::PeerFailed { peer: p, .. }) => assert_eq!(p, peer),
        other => panic!("expected PeerFailed, got {other:?}"),
    }
    // New requests to the dead peer fail at once instead of hanging.
    assert!(matches!(port.wait(port.isend(peer, 3, &b"y"[..])), Err(NetError::PeerFailed { .. })));
    // The killed peer's socket stays behind: the test owns the namespace, and `Ns`
    // removes it.
}

/// A large message is copied by both ends (the receiver reads half, the sender writes
/// half into the receiver's buffer). A sender that never writes its half (stopped,
/// then killed) leaves the receive waiting, then failed with the peer: nothing
/// completes with a half-written buffer.
#[test]
fn a_sender_that_dies_before_writing_its_half_fails_the_receive() {
    let ns = unique("half");
    let _ns_dir = Ns(ns.clone());
    let port = Port::open(PortConfig::new(&ns, Addr::new(0, 1))).unwrap();
    let peer = Addr::new(0, 2);
    let mut s = Proc::spawn("stream", peer_cmd(&ns, 0, 2, &["stream", "--peer", "0:1", "--sizes", "1048576", "--bytes", "1048576"]));
    // `stream` starts once its sink says it is ready (tag 8); we post nothing.
    s.expect_line("READY", Duration::from_secs(20));
    port.send(peer, 8, &b"ready"[..]).unwrap();
    // Its 16 offers (a window's worth) arrive with no receive posted.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while port.proto_stats().unexpected < 16 {
        assert!(std::time::Instant::now() < deadline, "no offers from the sender");
        std::thread::sleep(Duration::from_millis(5));
    }
    s.stop();
    let r = port.irecv(Some(peer), Some(0), 1 << 20);
    // Our half can be read from a stopped process; the other half never comes.
    let early = port.wait_timeout(r, Duration::from_millis(300));
    assert!(matches!(early, Err(NetError::Timeout(_))), "expected a timeout, got {early:?}");
    assert_eq!(port.proto_stats().single_copies, 1, "our half was copied");
    s.kill();
    match port.wait_timeout(r, Duration::from_secs(10)) {
        Err(NetError::PeerFailed { peer: p, .. }) => assert_eq!(p, peer),
        other => panic!("expected PeerFailed, got {other:?}"),
    }
}

#[test]
fn second_port_with_the_same_address_is_refused_and_stale_socket_replaced() {
    let ns = unique("dup");
    let _ns_dir = Ns(ns.clone());
    let a = Port::open(PortConfig::new(&ns, Addr::new(0, 1))).unwrap();
    let e = Port::open(PortConfig::new(&ns, Addr::new(0, 1))).err().expect("second open must fail");
    assert!(e.to_string().contains("another live process"), "{e}");
    drop(a);
    // A socket file left behind by a dead process is not trusted: it is replaced.
    let dir = gepsea_net::namespace_dir(&ns).join("node-0");
    assert!(!dir.exists(), "the last port to close removes the runtime directory");
    // As a killed process leaves it: private directories with its socket inside.
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700).create(&dir).unwrap();
    let stale = dir.join("port-3.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let p = Port::open(PortConfig::new(&ns, Addr::new(0, 3))).unwrap();
    drop(p);
    assert!(!dir.parent().unwrap().exists());
}

#[test]
fn small_sends_finish_at_once_and_keep_their_order_behind_queued_ones() {
    let ns = unique("fast");
    let _ns_dir = Ns(ns.clone());
    let a = Port::open(PortConfig::new(&ns, Addr::new(0, 1))).unwrap();
    let b = Port::open(PortConfig::new(&ns, Addr::new(0, 2))).unwrap();
    // 300 messages while the receiver takes none: the credits (64) run out and the rest
    // queue; one large message in the middle goes by rendezvous. The small ones written
    // straight into the ring must never overtake any of that.
    let body = |i: usize| -> Vec<u8> {
        let len = if i == 100 || i == 101 { 100_000 } else { 8 + i % 50 };
        (0..len).map(|k| (i * 31 + k) as u8).collect()
    };
    // Half of them from borrowed buffers (`isend_copy`), which are reused at once.
    let mut scratch = Vec::new();
    let ids: Vec<_> = (0..300)
        .map(|i| {
            if i % 2 == 0 {
                a.isend(b.addr(), 7, body(i))
            } else {
                scratch.clear();
                scratch.extend_from_slice(&body(i));
                let id = a.isend_copy(b.addr(), 7, &scratch);
                scratch.fill(0xee);
                id
            }
        })
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), ids.len(), "every send has an id of its own");
    for i in 0..300 {
        let m = b.recv(Some(a.addr()), Some(7), 100_000).unwrap();
        assert_eq!(m.data, body(i), "message {i} out of order or damaged");
    }
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(a.wait(*id).unwrap(), Completion::Sent, "send {i}");
    }
    // Sends finished at once answer `test` and `wait_any` without the protocol, and
    // cannot be cancelled.
    let s = a.isend(b.addr(), 8, &b"x"[..]);
    assert!(matches!(a.test(s), Some(Ok(Completion::Sent))));
    let r = a.irecv(None, None, 1);
    assert_eq!(a.wait_any(&[r, s]), (1, Ok(Completion::Sent)));
    assert!(!a.cancel(s));
    assert!(a.cancel(r));
    assert_eq!(b.recv(None, Some(8), 1).unwrap().data, b"x");
    assert_eq!(a.stats().recent_errors, Vec::<String>::new());
}

/// Two ports on one node; the first's waits spin to their answer, never asleep (each
/// wait takes the lease, and leaves a new one when it returns).
fn spinning_and_plain_ports(tag: &str) -> (Ns, Port, Port) {
    let ns = unique(tag);
    let dir = Ns(ns.clone());
    let mut config = PortConfig::new(&ns, Addr::new(0, 1));
    config.spin = Duration::from_secs(10);
    let a = Port::open(config).unwrap();
    let b = Port::open(PortConfig::new(&ns, Addr::new(0, 2))).unwrap();
    (dir, a, b)
}

#[test]
fn waits_longer_than_the_event_threads_look_do_not_wake_it_each_time() {
    // A client's calls that each take longer than its event thread's look at the lease
    // (a remote operation through the agent): every wait takes the lease and leaves a
    // new one when it returns. The event thread must keep its look scheduled across
    // them; when it forgot the lease mid-wait, every return woke it to re-arm the look
    // (a system call, and a wake-up that took a core from the spinning processes).
    let (_ns_dir, a, b) = spinning_and_plain_ports("lease");
    let calls = 200u32;
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..calls {
                let m = b.recv(Some(a.addr()), Some(1), 4).unwrap();
                std::thread::sleep(Duration::from_micros(200));
                b.send(a.addr(), 2, m.data).unwrap();
            }
        });
        for i in 0..calls {
            a.send(b.addr(), 1, i.to_le_bytes().to_vec()).unwrap();
            assert_eq!(a.recv(Some(b.addr()), Some(2), 4).unwrap().data, i.to_le_bytes());
        }
    });
    // Forgetting the lease woke it at about every other call (135 in 200); kept, it is
    // woken a few times, more when other processes take the cores (0-23 in 200 here,
    // the 23 right after a build, against a bound of 20 that then failed twice in 17).
    let woken = a.stats().lease_wakeups;
    assert!(woken < u64::from(calls / 4), "{woken} wake-ups of the event thread in {calls} calls");
}

/// While the application keeps communicating, each look of the event thread takes a
/// core from it; the looks at a wait that spins on and on thin out (the interval
/// doubles from one lease up to 4 ms). At a 1 ms cap the looks cost a 1 MiB TCP
/// ping-pong 6–26 µs per one way on 2 cores (issue 20).
#[test]
fn the_event_threads_looks_at_a_long_spinning_wait_thin_out() {
    let (_ns_dir, a, b) = spinning_and_plain_ports("looks");
    let call = |i: u32| {
        a.send(b.addr(), 1, i.to_le_bytes().to_vec()).unwrap();
        assert_eq!(a.recv(Some(b.addr()), Some(2), 4).unwrap().data, i.to_le_bytes());
    };
    let answer_after = |delay: Duration| {
        let m = b.recv(Some(a.addr()), Some(1), 4).unwrap();
        std::thread::sleep(delay);
        b.send(a.addr(), 2, m.data).unwrap();
    };
    let long = Duration::from_millis(200);
    let looks = std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..20 {
                answer_after(Duration::ZERO);
            }
            answer_after(long);
        });
        // A burst of quick calls (which leaves a lease the event thread looks at), then
        // one call that spins for `long`: its looks are counted.
        for i in 0..20 {
            call(i);
        }
        let before = a.stats().busy_looks;
        call(20);
        a.stats().busy_looks - before
    });
    // Doubling from the 50 µs lease to the 4 ms cap: at most 7 looks in the first
    // 6.4 ms, then one per 4 ms, ≈ 55 in all (43-56 here, also with three more busy
    // processes on the 2 cores); at a 1 ms cap one per ms (175 and 196). A timer that
    // fires late gives fewer, down to none (an event thread that got a core only after
    // the burst's lease expired planned no look at the long wait, whose return then
    // wakes it), so only the most is checked; that the event thread takes over once
    // the calls stop is checked by `conformance.rs`'s
    // `progress_goes_on_without_library_calls_after_a_burst_of_large_waits`.
    let most = long.as_millis() as u64 / 2;
    assert!(looks <= most, "{looks} looks of the event thread at a wait spinning for {long:?} (at most {most} expected)");
}

/// The agent's loop: detached sends raise no events, in order with everything else;
/// a port that says it polls is written to without doorbells, and whatever came in
/// while it polled is announced on its event descriptor once it stops.
#[test]
fn detached_sends_and_a_polling_event_loop_miss_nothing() {
    let ns = unique("det");
    let _ns_dir = Ns(ns.clone());
    let a = Port::open(PortConfig::new(&ns, Addr::new(0, 1))).unwrap();
    let b = Port::open(PortConfig::new(&ns, Addr::new(0, 2))).unwrap();
    let fd = a.enable_events();
    // Connect both ways first (a first message opens the rings).
    b.send(a.addr(), 1, &b"hi"[..]).unwrap();
    let r = a.irecv(Some(b.addr()), Some(1), 2);
    assert!(matches!(a.wait(r), Ok(Completion::Received(_))));
    let mut evs = Vec::new();
    a.drain_events(&mut evs);
    assert_eq!(evs, vec![Event::Completed(r)]);
    assert!(!poll_readable(fd, 0));

    // Small (straight into the ring) and large (rendezvous) detached sends: they
    // arrive in order and leave no event behind.
    let body = |i: usize| -> Vec<u8> { (0..if i == 3 { 200_000 } else { 10 + i }).map(|k| (i + k) as u8).collect() };
    for i in 0..6 {
        a.send_detached(b.addr(), 2, body(i));
    }
    for i in 0..6 {
        assert_eq!(b.recv(Some(a.addr()), Some(2), 200_000).unwrap().data, body(i), "message {i}");
    }
    std::thread::sleep(Duration::from_millis(50));
    a.drain_events(&mut evs);
    assert_eq!(evs, vec![Event::Completed(r)], "a detached send raised an event");
    assert!(!poll_readable(fd, 0));

    // Polling: b writes into a's ring without a doorbell...
    let r = a.irecv(Some(b.addr()), Some(3), 10);
    a.start_polling();
    let rung = b.stats().doorbells;
    for i in 0..20u8 {
        b.send(a.addr(), 4, vec![i]).unwrap();
    }
    assert_eq!(b.stats().doorbells, rung, "a polling port was rung");
    b.send(a.addr(), 3, &b"last"[..]).unwrap();
    // ...and nothing of it is lost when a stops polling without having looked.
    a.stop_polling();
    assert!(poll_readable(fd, 0), "what came in while polling must make the descriptor readable");
    let mut evs = Vec::new();
    a.drain_events(&mut evs);
    assert_eq!(evs, vec![Event::Completed(r)]);
    assert!(!poll_readable(fd, 0));
    for i in 0..20u8 {
        assert_eq!(a.recv(Some(b.addr()), Some(4), 1).unwrap().data, vec![i]);
    }
    // (Those receives raised their events too.)
    let mut evs = Vec::new();
    a.drain_events(&mut evs);
    assert_eq!(evs.len(), 20);
    // Asleep again: the next message rings the doorbell and the descriptor.
    let r = a.irecv(Some(b.addr()), Some(5), 10);
    b.send(a.addr(), 5, &b"x"[..]).unwrap();
    assert!(poll_readable(fd, 10_000));
    let mut evs = Vec::new();
    a.drain_events(&mut evs);
    assert_eq!(evs, vec![Event::Completed(r)]);
}
