//! The transport conformance suite: what a port promises its application, checked by
//! one body per property that runs over both transports — shared memory (two ports of
//! one node) and TCP (two nodes, on loopback), the latter also with both ports trusting
//! TCP's own checksums for data (`TcpChecksums::Headers`). A transport-specific
//! shortcut that breaks a promise fails here under that transport's name (`shm::…`,
//! `tcp::…` or `tcp_trusting::…`).
//!
//! The promises: messages from one sender with one tag arrive in send order, across
//! the eager/rendezvous boundary; receives match by source and tag, wildcards in
//! arrival order; every size is delivered byte-exact and a too-small buffer is
//! reported; a cancelled receive takes nothing; a peer's death fails the requests
//! waiting on it; large messages and RMA (put/get) are exact; progress goes on while
//! the application computes, also right after it waited for a large transfer; a cork
//! holds TCP writes back until it is lifted, and loses nothing.

mod common;

use std::time::Duration;

use common::unique;
use gepsea_net::tcp::TcpChecksums;
use gepsea_net::{Addr, Completion, NetError, Port, PortConfig, ProtoConfig};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Shm,
    Tcp,
    /// TCP between ports that both checksum headers only.
    TcpTrusting,
}

impl Transport {
    fn is_tcp(self) -> bool {
        self != Transport::Shm
    }
}

/// Two connected ports and the namespace directory they use (removed on drop).
struct Pair {
    a: Option<Port>,
    b: Port,
    a_addr: Addr,
    ns: String,
}

impl Pair {
    fn new(t: Transport, tweak: impl Fn(&mut PortConfig)) -> Pair {
        let ns = unique("conf");
        let (a_addr, b_addr) = match t {
            Transport::Shm => (Addr::new(1, 1), Addr::new(1, 2)),
            Transport::Tcp | Transport::TcpTrusting => (Addr::new(1, 1), Addr::new(2, 1)),
        };
        let open = |addr: Addr| {
            let mut c = PortConfig::new(&ns, addr);
            if t.is_tcp() {
                c.listen = Some("127.0.0.1:0".parse().unwrap());
            }
            if t == Transport::TcpTrusting {
                c.tcp_checksums = TcpChecksums::Headers;
            }
            tweak(&mut c);
            Port::open(c).unwrap()
        };
        let (a, b) = (open(a_addr), open(b_addr));
        if t.is_tcp() {
            a.add_route(b_addr, b.listen_addr().unwrap());
            b.add_route(a_addr, a.listen_addr().unwrap());
        }
        Pair { a: Some(a), b, a_addr, ns }
    }

    fn a(&self) -> &Port {
        self.a.as_ref().unwrap()
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        drop(self.a.take());
        let _ = std::fs::remove_dir_all(gepsea_net::namespace_dir(&self.ns));
    }
}

const WAIT: Duration = Duration::from_secs(60);

/// `n` bytes that say which message they belong to.
fn pattern(n: usize, seed: usize) -> Vec<u8> {
    (0..n).map(|i| ((i * 31 + seed * 7) % 251) as u8).collect()
}

fn received(r: Result<Completion, NetError>) -> gepsea_net::Message {
    match r {
        Ok(Completion::Received(m)) => m,
        other => panic!("expected a message, got {other:?}"),
    }
}

fn messages_arrive_in_send_order_across_the_eager_rendezvous_boundary(t: Transport) {
    let p = Pair::new(t, |_| {});
    let eager = ProtoConfig::default().eager_threshold;
    let sizes = [0, 1, 100, eager - 1, eager, eager + 1, 100_000, 7];
    let n = 120;
    let (a, b) = (p.a(), &p.b);
    let sends: Vec<_> = (0..n).map(|i| a.isend(b.addr(), 7, pattern(sizes[i % sizes.len()], i))).collect();
    for i in 0..n {
        let m = received(b.wait_timeout(b.irecv(Some(p.a_addr), Some(7), 1 << 20), WAIT));
        assert_eq!((m.src, m.tag, m.data.len()), (p.a_addr, 7, sizes[i % sizes.len()]), "{t:?}: message {i}");
        assert!(m.data == pattern(sizes[i % sizes.len()], i), "{t:?}: message {i} arrived out of order or damaged");
    }
    for s in sends {
        assert_eq!(a.wait_timeout(s, WAIT).unwrap(), Completion::Sent);
    }
}

fn receives_match_by_source_and_tag_and_wildcards_take_arrival_order(t: Transport) {
    let p = Pair::new(t, |_| {});
    let (a, b) = (p.a(), &p.b);
    for tag in [1u64, 2, 3] {
        a.send(b.addr(), tag, format!("m{tag}").into_bytes()).unwrap();
    }
    // The specific receive waits for tag 3; one sender's messages keep their order, so
    // 1 and 2 are queued (unexpected) by then, and the wildcards take them in order.
    assert_eq!(received(b.wait_timeout(b.irecv(Some(p.a_addr), Some(3), 64), WAIT)).data, b"m3");
    let any = received(b.wait_timeout(b.irecv(None, None, 64), WAIT));
    assert_eq!((any.src, any.tag, any.data), (p.a_addr, 1, b"m1".to_vec()), "{t:?}");
    let any_tag = received(b.wait_timeout(b.irecv(Some(p.a_addr), None, 64), WAIT));
    assert_eq!((any_tag.tag, any_tag.data), (2, b"m2".to_vec()), "{t:?}");
    // A receive posted before its message: matched when it comes, not by another tag.
    let want_5 = b.irecv(None, Some(5), 64);
    a.send(b.addr(), 4, b"four".to_vec()).unwrap();
    a.send(b.addr(), 5, b"five".to_vec()).unwrap();
    assert_eq!(received(b.wait_timeout(want_5, WAIT)).data, b"five");
    assert_eq!(received(b.wait_timeout(b.irecv(None, Some(4), 64), WAIT)).data, b"four");
}

fn every_size_is_exact_and_short_buffers_are_reported(t: Transport) {
    let p = Pair::new(t, |_| {});
    let (a, b) = (p.a(), &p.b);
    let cfg = ProtoConfig::default();
    let (eager, chunk) = (cfg.eager_threshold, cfg.chunk);
    for (i, n) in [eager - 1, eager, eager + 1, chunk - 1, chunk, chunk + 1, 3 * chunk + 5].into_iter().enumerate() {
        let s = a.isend(b.addr(), 10, pattern(n, i));
        let m = received(b.wait_timeout(b.irecv(Some(p.a_addr), Some(10), n), WAIT));
        assert!(m.data == pattern(n, i), "{t:?}: {n} bytes damaged");
        a.wait_timeout(s, WAIT).unwrap();
    }
    // One byte too many for the buffer, eager and rendezvous alike.
    for n in [100, 4 * chunk] {
        let s = a.isend(b.addr(), 11, pattern(n, 0));
        match b.wait_timeout(b.irecv(Some(p.a_addr), Some(11), n - 1), WAIT) {
            Err(NetError::Truncated { len, capacity }) => assert_eq!((len, capacity), (n, n - 1), "{t:?}"),
            other => panic!("{t:?}: {n} bytes into {}: {other:?}", n - 1),
        }
        let _ = a.wait_timeout(s, WAIT);
    }
    // The port still works after the errors.
    a.send(b.addr(), 12, b"still here".to_vec()).unwrap();
    assert_eq!(received(b.wait_timeout(b.irecv(None, Some(12), 64), WAIT)).data, b"still here");
}

fn a_cancelled_receive_takes_nothing(t: Transport) {
    let p = Pair::new(t, |_| {});
    let (a, b) = (p.a(), &p.b);
    let r = b.irecv(Some(p.a_addr), Some(9), 64);
    assert!(b.cancel(r), "{t:?}: a pending receive can be cancelled");
    assert!(matches!(b.wait_timeout(r, WAIT), Err(NetError::Cancelled)), "{t:?}");
    a.send(b.addr(), 9, b"after".to_vec()).unwrap();
    let r2 = b.irecv(Some(p.a_addr), Some(9), 64);
    assert_eq!(received(b.wait_timeout(r2, WAIT)).data, b"after", "{t:?}: the message went to the next receive");
    assert!(!b.cancel(r2), "{t:?}: a collected request cannot be cancelled");
}

fn a_dead_peer_fails_the_requests_waiting_on_it(t: Transport) {
    let mut p = Pair::new(t, |c| {
        c.reconnect_timeout = Duration::from_millis(500);
        c.linger = Duration::from_millis(100);
    });
    // A link exists: one message each way.
    p.a().send(p.b.addr(), 1, b"hi".to_vec()).unwrap();
    received(p.b.wait_timeout(p.b.irecv(Some(p.a_addr), Some(1), 8), WAIT));
    let pending = p.b.irecv(Some(p.a_addr), Some(2), 8);
    drop(p.a.take());
    match p.b.wait_timeout(pending, WAIT) {
        Err(NetError::PeerFailed { peer, .. }) => assert_eq!(peer, p.a_addr, "{t:?}"),
        other => panic!("{t:?}: a receive from a dead peer ended with {other:?}"),
    }
}

fn large_messages_and_rma_are_exact(t: Transport) {
    let p = Pair::new(t, |_| {});
    let (a, b) = (p.a(), &p.b);
    let n = 16 << 20;
    let s = a.isend(b.addr(), 20, pattern(n, 3));
    let m = received(b.wait_timeout(b.irecv(Some(p.a_addr), Some(20), n), WAIT));
    assert!(m.data.len() == n && m.data == pattern(n, 3), "{t:?}: 16 MiB damaged");
    a.wait_timeout(s, WAIT).unwrap();
    // RMA: put 1 MiB at an offset of b's region, read it back with get.
    let len = 1 << 20;
    b.expose(77, 2 * len).unwrap();
    assert_eq!(a.wait_timeout(a.put(b.addr(), 77, 4096, pattern(len, 5)), WAIT).unwrap(), Completion::Put, "{t:?}");
    b.with_region(77, |r| assert!(r[4096..4096 + len] == pattern(len, 5)[..], "{t:?}: put landed damaged")).unwrap();
    match a.wait_timeout(a.get(b.addr(), 77, 4096, len), WAIT).unwrap() {
        Completion::Got(d) => assert!(d == pattern(len, 5), "{t:?}: get returned other bytes"),
        other => panic!("{t:?}: {other:?}"),
    }
    // Outside the region: refused, not applied.
    assert!(matches!(a.wait_timeout(a.get(b.addr(), 77, 2 * len as u64 - 10, 20), WAIT), Err(NetError::RegionAccess { .. })), "{t:?}");
}

fn poll_readable(fd: i32, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    n == 1 && p.revents & libc::POLLIN != 0
}

/// A waiter spinning on a large transfer may take over the event thread's work (on
/// TCP it reads and writes the sockets itself); once it returns, messages that arrive
/// while the application computes (no library call) are progressed again.
fn progress_goes_on_without_library_calls_after_a_large_transfer(t: Transport) {
    let p = Pair::new(t, |_| {});
    let (a, b) = (p.a(), &p.b);
    let fd = b.enable_events();
    for round in 0..3 {
        let big = pattern(8 << 20, round);
        let s = a.isend(b.addr(), 20, big.clone());
        let m = received(b.wait_timeout(b.irecv(Some(p.a_addr), Some(20), 8 << 20), WAIT));
        assert!(m.data == big, "{t:?}: round {round}: the large message arrived damaged");
        a.wait_timeout(s, WAIT).unwrap();
        while b.next_event().is_some() {}
        // b "computes": it only watches its event descriptor, which the event thread
        // makes readable when it completes the receive.
        let r = b.irecv(Some(p.a_addr), Some(21), 100_000);
        a.wait_timeout(a.isend(b.addr(), 21, pattern(100_000, round)), WAIT).unwrap();
        assert!(poll_readable(fd, 30_000), "{t:?}: round {round}: no progress without a library call");
        assert!(received(b.wait_timeout(r, WAIT)).data == pattern(100_000, round), "{t:?}: round {round}");
    }
}

/// A sender whose link is full (a shared-memory ring, a socket buffer) waits until the
/// receiver frees room; a receiver that took one message and went off to compute (no
/// library call) still frees room through its event thread, and the sender hears of it
/// then, not when the computation ends. (Shared memory defers the receive's look at
/// whether the sender sleeps waiting for room, to keep a fence off the message's path;
/// `shm::tests` checks who pays that look. Here the sender's spin, extended while its
/// held-back messages move, usually finds the room before it would sleep.)
fn a_sender_on_a_full_link_resumes_while_the_receiver_computes(t: Transport) {
    let p = Pair::new(t, |_| {});
    let (a, b) = (p.a(), &p.b);
    let eager = ProtoConfig::default().eager_threshold;
    // 64 eager messages: four times a 256 KiB ring, so the sender waits for room
    // several times.
    let n = 64;
    let compute = Duration::from_secs(2);
    let (sent, computed) = std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let sends: Vec<_> = (0..n).map(|i| a.isend(b.addr(), 31, pattern(eager, i))).collect();
            for r in sends {
                a.wait_timeout(r, WAIT).unwrap();
            }
            std::time::Instant::now()
        });
        // b takes the first message, then computes.
        let r = b.irecv(Some(p.a_addr), Some(31), eager);
        assert!(received(b.wait_timeout(r, WAIT)).data == pattern(eager, 0), "{t:?}");
        let computed = std::time::Instant::now() + compute;
        std::thread::sleep(compute);
        (sender.join().unwrap(), computed)
    });
    assert!(sent < computed, "{t:?}: the sender finished only when the receiver's computation did");
    for i in 1..n {
        let m = received(b.wait_timeout(b.irecv(Some(p.a_addr), Some(31), eager), WAIT));
        assert!(m.data == pattern(eager, i), "{t:?}: message {i}");
    }
}

/// Waits in quick succession (a burst of library calls) may leave the TCP sockets with
/// the next wait rather than hand them back to the event thread each time; when the
/// application then stops calling, the event thread takes them back and progress goes
/// on.
fn progress_goes_on_without_library_calls_after_a_burst_of_large_waits(t: Transport) {
    // A lease long enough that the second wait surely falls within it, however slowly
    // this machine runs the test.
    let p = Pair::new(t, |c| c.lease = Duration::from_millis(20));
    let (a, b) = (p.a(), &p.b);
    let fd = b.enable_events();
    for round in 0..3 {
        let big = [pattern(2 << 20, round), pattern(3 << 20, round + 1)];
        let rs = [b.irecv(Some(p.a_addr), Some(30), 2 << 20), b.irecv(Some(p.a_addr), Some(31), 3 << 20)];
        let ss = [a.isend(b.addr(), 30, big[0].clone()), a.isend(b.addr(), 31, big[1].clone())];
        // Back to back: the second wait starts within the lease of the first (the
        // messages are checked after both).
        let got: Vec<_> = rs.into_iter().map(|r| b.wait_timeout(r, WAIT)).collect();
        for (m, want) in got.into_iter().zip(&big) {
            assert!(received(m).data == *want, "{t:?}: round {round}: a large message arrived damaged");
        }
        for s in ss {
            a.wait_timeout(s, WAIT).unwrap();
        }
        while b.next_event().is_some() {}
        let r = b.irecv(Some(p.a_addr), Some(32), 100_000);
        a.wait_timeout(a.isend(b.addr(), 32, pattern(100_000, round)), WAIT).unwrap();
        assert!(poll_readable(fd, 30_000), "{t:?}: round {round}: no progress without a library call after a burst");
        assert!(received(b.wait_timeout(r, WAIT)).data == pattern(100_000, round), "{t:?}: round {round}");
    }
}

/// A cork ([`Port::cork`]) holds TCP writes back until `uncork` (shared memory is not
/// held); nothing corked is lost or reordered, and a blocking wait on a corked port
/// uncorks rather than wait for its own held-back message.
fn a_cork_holds_writes_until_uncork_and_loses_nothing(t: Transport) {
    // Corked before the first message: the connection is set up meanwhile (its
    // handshake is not held), and the message leaves at uncork. (The connection's
    // writable edge came while corked and was dropped: nothing ever left.)
    let p = Pair::new(t, |_| {});
    let (a, b) = (p.a(), &p.b);
    a.cork();
    a.send_detached_copy(b.addr(), 7, &pattern(100, 7));
    std::thread::sleep(Duration::from_millis(200));
    a.uncork();
    assert!(received(b.wait_timeout(b.irecv(Some(p.a_addr), Some(7), 100), WAIT)).data == pattern(100, 7), "{t:?}");
    drop(p);

    let p = Pair::new(t, |_| {});
    let (a, b) = (p.a(), &p.b);
    // The connection first, so that the cork is all that holds the messages back.
    a.wait_timeout(a.isend(b.addr(), 8, pattern(10, 0)), WAIT).unwrap();
    received(b.wait_timeout(b.irecv(Some(p.a_addr), Some(8), 100), WAIT));
    let eager = ProtoConfig::default().eager_threshold;
    let sizes = [1, 100, eager + 1, 100_000, 0];
    let n = 40;
    a.cork();
    for i in 0..n {
        a.send_detached_copy(b.addr(), 9, &pattern(sizes[i % sizes.len()], i));
    }
    let first = b.irecv(Some(p.a_addr), Some(9), 1 << 20);
    if t.is_tcp() {
        let until = std::time::Instant::now() + Duration::from_millis(200);
        while std::time::Instant::now() < until {
            assert!(b.test(first).is_none(), "tcp: a corked message arrived before uncork");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    a.uncork();
    for i in 0..n {
        let r = if i == 0 { first } else { b.irecv(Some(p.a_addr), Some(9), 1 << 20) };
        let m = received(b.wait_timeout(r, WAIT));
        assert!(m.data == pattern(sizes[i % sizes.len()], i), "{t:?}: corked message {i} lost, damaged or out of order");
    }
    a.cork();
    let r = b.irecv(Some(p.a_addr), Some(10), 1 << 20);
    a.wait_timeout(a.isend(b.addr(), 10, pattern(100_000, 1)), WAIT).expect("a wait on a corked port");
    assert!(received(b.wait_timeout(r, WAIT)).data == pattern(100_000, 1), "{t:?}");
}

/// One test per (property, transport), all from the bodies above.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod shm {
            $( #[test] fn $name() { super::$name(super::Transport::Shm) } )*
        }
        mod tcp {
            $( #[test] fn $name() { super::$name(super::Transport::Tcp) } )*
        }
        mod tcp_trusting {
            $( #[test] fn $name() { super::$name(super::Transport::TcpTrusting) } )*
        }
    };
}

conformance!(
    messages_arrive_in_send_order_across_the_eager_rendezvous_boundary,
    receives_match_by_source_and_tag_and_wildcards_take_arrival_order,
    every_size_is_exact_and_short_buffers_are_reported,
    a_cancelled_receive_takes_nothing,
    a_dead_peer_fails_the_requests_waiting_on_it,
    large_messages_and_rma_are_exact,
    progress_goes_on_without_library_calls_after_a_large_transfer,
    progress_goes_on_without_library_calls_after_a_burst_of_large_waits,
    a_sender_on_a_full_link_resumes_while_the_receiver_computes,
    a_cork_holds_writes_until_uncork_and_loses_nothing,
);
