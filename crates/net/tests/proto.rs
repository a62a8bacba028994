//! The port protocol driven frame by frame between two `Proto` state machines: no
//! sockets, no threads, no clocks. Every frame goes through the real encoder and
//! decoder on the way, so framing is exercised too.

use bytes::Bytes;
use gepsea_net::frame::{Addr, FrameDecoder, Header};
use gepsea_net::proto::{Completion, Event, Message, Proto, ProtoConfig};
use gepsea_net::NetError;

const A: Addr = Addr::new(1, 1);
const B: Addr = Addr::new(2, 1);

fn pair(credits: u32) -> (Proto, Proto) {
    let cfg = ProtoConfig { eager_threshold: 100, credits, chunk: 64, max_unexpected_rts: 16 };
    (Proto::new(A, cfg.clone()), Proto::new(B, cfg))
}

/// Moves at most `limit` frames from `from` to `to`; returns how many moved.
fn step(from: &mut Proto, to: &mut Proto, limit: usize) -> usize {
    let peer = to.addr();
    let mut n = 0;
    while n < limit {
        let Some(out) = from.pop_frame(peer) else { break };
        let bytes = out.frame.to_bytes();
        from.frame_sent(out.completes);
        let mut d = FrameDecoder::new(1 << 20);
        d.extend(&bytes);
        let (h, p) = d.next_frame().unwrap().unwrap();
        to.on_frame(&h, p).unwrap();
        n += 1;
    }
    n
}

/// Runs both directions until nothing moves.
fn pump(a: &mut Proto, b: &mut Proto) {
    while step(a, b, usize::MAX) + step(b, a, usize::MAX) > 0 {}
}

fn received(r: Option<Result<Completion, NetError>>) -> Message {
    match r {
        Some(Ok(Completion::Received(m))) => m,
        other => panic!("expected a received message, got {other:?}"),
    }
}

#[test]
fn eager_matches_posted_and_unexpected_in_mpi_order() {
    let (mut a, mut b) = pair(8);
    // Unexpected first: two messages with tags 1 and 2, then receives in reverse tag
    // order, then one by any tag.
    a.isend(B, 1, Bytes::from_static(b"one"));
    a.isend(B, 2, Bytes::from_static(b"two"));
    a.isend(B, 1, Bytes::from_static(b"three"));
    pump(&mut a, &mut b);
    assert_eq!(b.stats.unexpected, 3);
    let r2 = b.irecv(Some(A), Some(2), 10);
    let r_any = b.irecv(None, None, 10);
    let r1 = b.irecv(Some(A), Some(1), 10);
    assert_eq!(received(b.take(r2)).data, b"two");
    assert_eq!(received(b.take(r_any)).data, b"one", "oldest matching unexpected message first");
    assert_eq!(received(b.take(r1)).data, b"three");
    // Expected path: receive posted before the message.
    let r = b.irecv(None, Some(7), 10);
    assert!(b.take(r).is_none());
    a.isend(B, 7, Bytes::from_static(b"seven"));
    pump(&mut a, &mut b);
    let m = received(b.take(r));
    assert_eq!((m.src, m.tag, &m.data[..]), (A, 7, &b"seven"[..]));
}

#[test]
fn rendezvous_before_and_after_the_receive_is_posted() {
    let (mut a, mut b) = pair(8);
    let big: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    // Receive posted first (expected).
    let r = b.irecv(Some(A), Some(3), 1000);
    let s = a.isend(B, 3, Bytes::from(big.clone()));
    pump(&mut a, &mut b);
    assert_eq!(received(b.take(r)).data, big);
    assert_eq!(a.take(s), Some(Ok(Completion::Sent)));
    // Message first (unexpected RTS): nothing but the RTS moves until the receive.
    let s = a.isend(B, 4, Bytes::from(big.clone()));
    assert_eq!(step(&mut a, &mut b, usize::MAX), 1, "only the RTS goes out");
    assert_eq!(step(&mut b, &mut a, usize::MAX), 0, "no CTS without a receive");
    assert!(a.take(s).is_none());
    let r = b.irecv(None, None, 4096);
    pump(&mut a, &mut b);
    assert_eq!(received(b.take(r)).data, big);
    assert_eq!(a.take(s), Some(Ok(Completion::Sent)));
    assert_eq!(a.stats.rendezvous_sent, 2);
}

/// The sizes of the data pieces `from` sends `to` for one rendezvous message of `len`
/// bytes, delivered whole.
fn piece_sizes(from: &mut Proto, to: &mut Proto, len: usize) -> Vec<usize> {
    let src = from.addr();
    let r = to.irecv(Some(src), Some(9), len);
    from.isend(to.addr(), 9, Bytes::from(vec![7u8; len]));
    let mut sizes = Vec::new();
    loop {
        let moved = step(to, from, usize::MAX);
        let mut n = 0;
        while let Some(out) = from.pop_frame(to.addr()) {
            if out.frame.header.kind == gepsea_net::frame::Kind::Data {
                sizes.push(out.frame.payload.len());
            }
            from.frame_sent(out.completes);
            to.on_frame(&out.frame.header, &out.frame.payload).unwrap();
            n += 1;
        }
        if moved + n == 0 {
            break;
        }
    }
    assert_eq!(received(to.take(r)).data.len(), len);
    sizes
}

#[test]
fn a_peer_chunk_cuts_transfers_to_that_peer_only() {
    let cfg = ProtoConfig { eager_threshold: 100, credits: 8, chunk: 64, max_unexpected_rts: 16 };
    let (mut a, mut b, mut c) = (Proto::new(A, cfg.clone()), Proto::new(B, cfg.clone()), Proto::new(Addr::new(3, 1), cfg));
    a.set_remote_chunk(1000);
    a.set_peer_chunk(B, Some(3000));
    assert_eq!(piece_sizes(&mut a, &mut b, 7000), [3000, 3000, 1000]);
    assert_eq!(piece_sizes(&mut a, &mut c, 2500), [1000, 1000, 500], "another peer keeps the remote chunk");
    a.set_peer_chunk(B, None);
    assert_eq!(piece_sizes(&mut a, &mut b, 2500), [1000, 1000, 500], "back to the remote chunk");
}

#[test]
fn truncation_is_reported_to_the_receiver_and_releases_the_sender() {
    let (mut a, mut b) = pair(8);
    let r = b.irecv(None, None, 10);
    a.isend(B, 0, Bytes::from(vec![1u8; 50]));
    pump(&mut a, &mut b);
    assert_eq!(b.take(r), Some(Err(NetError::Truncated { len: 50, capacity: 10 })));
    let r = b.irecv(None, None, 10);
    let s = a.isend(B, 0, Bytes::from(vec![1u8; 500]));
    pump(&mut a, &mut b);
    assert_eq!(b.take(r), Some(Err(NetError::Truncated { len: 500, capacity: 10 })));
    assert_eq!(a.take(s), Some(Ok(Completion::Sent)));
}

#[test]
fn system_channel_holds_senders_back_when_credits_run_out() {
    let (mut a, mut b) = pair(4);
    let sends: Vec<_> = (0..10).map(|i| a.send_system(B, i, Bytes::from(vec![i as u8; 20]))).collect();
    assert_eq!(step(&mut a, &mut b, usize::MAX), 4, "four credits, four messages");
    assert_eq!(b.system_pending(), 4);
    assert!(a.take(sends[4]).is_none(), "fifth send is held back");
    // The application takes two: half the window goes back as one credit frame.
    assert_eq!(b.recv_system().unwrap().tag, 0);
    assert_eq!(b.recv_system().unwrap().tag, 1);
    assert_eq!(step(&mut b, &mut a, usize::MAX), 1);
    assert_eq!(step(&mut a, &mut b, usize::MAX), 2);
    // Drain everything; all ten arrive in order, nothing lost or duplicated.
    let mut tags = vec![0, 1];
    loop {
        pump(&mut a, &mut b);
        match b.recv_system() {
            Some(m) => tags.push(m.tag),
            None => break,
        }
    }
    assert_eq!(tags, (0..10).collect::<Vec<_>>());
    for s in sends {
        assert_eq!(a.take(s), Some(Ok(Completion::Sent)));
    }
    assert!(a.stats.credit_stalls > 0);
}

#[test]
fn oversized_system_message_fails_at_once() {
    let (mut a, _) = pair(4);
    let s = a.send_system(B, 0, Bytes::from(vec![0u8; 101]));
    assert_eq!(a.take(s), Some(Err(NetError::TooLargeForSystemChannel { len: 101, max: 100 })));
}

#[test]
fn a_full_pool_does_not_block_a_rendezvous_transfer() {
    let (mut a, mut b) = pair(2);
    // Exhaust credits with system messages the receiver is not reading...
    for i in 0..5 {
        a.send_system(B, i, Bytes::from_static(b"x"));
    }
    // ...while the application waits for a large normal-channel message.
    let r = b.irecv(Some(A), Some(9), 1000);
    let s = a.isend(B, 9, Bytes::from(vec![9u8; 1000]));
    pump(&mut a, &mut b);
    // Eager messages behind the credit stall stay queued, but the RTS (no credit) and
    // the data pieces (bulk) get through.
    assert_eq!(b.system_pending(), 2);
    assert_eq!(received(b.take(r)).data, vec![9u8; 1000]);
    assert_eq!(a.take(s), Some(Ok(Completion::Sent)));
}

#[test]
fn rma_put_get_events_and_bounds() {
    let (mut a, mut b) = pair(8);
    b.enable_events();
    b.expose(5, 300).unwrap();
    assert_eq!(b.expose(5, 1), Err(NetError::RegionExists(5)));
    let data: Vec<u8> = (0..250u32).map(|i| i as u8).collect();
    let p = a.put(B, 5, 20, Bytes::from(data.clone()));
    pump(&mut a, &mut b);
    assert_eq!(a.take(p), Some(Ok(Completion::Put)));
    assert_eq!(&b.region(5).unwrap()[20..270], &data[..]);
    let g = a.get(B, 5, 10, 100);
    pump(&mut a, &mut b);
    let mut want = vec![0u8; 10];
    want.extend_from_slice(&data[..90]);
    assert_eq!(a.take(g), Some(Ok(Completion::Got(want))));
    let bad = a.put(B, 5, 290, Bytes::from(vec![1u8; 20]));
    pump(&mut a, &mut b);
    assert!(matches!(a.take(bad), Some(Err(NetError::RegionAccess { region: 5, offset: 290, len: 20, .. }))));
    assert!(b.region(5).unwrap()[290..].iter().all(|&x| x == 0), "refused put wrote nothing");
    let bad = a.get(B, 6, 0, 1);
    pump(&mut a, &mut b);
    assert!(matches!(a.take(bad), Some(Err(NetError::RegionAccess { region: 6, .. }))));
    let events: Vec<Event> = std::iter::from_fn(|| b.next_event()).collect();
    assert_eq!(
        events,
        vec![Event::RemotePut { from: A, region: 5, offset: 20, len: 250 }, Event::RemoteGet { from: A, region: 5, offset: 10, len: 100 }]
    );
}

#[test]
fn peer_failure_fails_its_requests_and_refuses_new_ones() {
    let (mut a, mut b) = pair(8);
    let r = b.irecv(Some(A), None, 10);
    let r_any = b.irecv(None, None, 10);
    let s = b.isend(A, 0, Bytes::from(vec![0u8; 500]));
    b.peer_failed(A, "gone");
    let failed = |x| matches!(x, Some(Err(NetError::PeerFailed { peer: A, .. })));
    assert!(failed(b.take(r)));
    assert!(failed(b.take(s)));
    assert!(b.take(r_any).is_none(), "a receive from any source survives");
    let s2 = b.isend(A, 0, Bytes::new());
    assert!(failed(b.take(s2)));
    b.peer_recovered(A);
    let s = b.isend(A, 0, Bytes::from_static(b"hi"));
    pump(&mut b, &mut a);
    assert_eq!(b.take(s), Some(Ok(Completion::Sent)));
    assert!(b.cancel(r_any));
    assert_eq!(b.take(r_any), Some(Err(NetError::Cancelled)));
}

/// Two ports on one node (single copy only applies there).
fn local_pair() -> (Proto, Proto) {
    let cfg = ProtoConfig { eager_threshold: 100, credits: 8, chunk: 64, max_unexpected_rts: 16 };
    let (x, y) = (Addr::new(3, 1), Addr::new(3, 2));
    (Proto::new(x, cfg.clone()), Proto::new(y, cfg))
}

/// Carries out the receiver's copies as the port does: with `process_vm_readv` from
/// this very process (the sender's buffer lives here).
fn run_copies(p: &mut Proto, allowed: bool) -> usize {
    let mut n = 0;
    while let Some(mut job) = p.next_copy() {
        let mut buf = std::mem::take(&mut job.buf);
        let ok = allowed && gepsea_net::cma::read_into(job.remote.pid, job.remote.addr, job.len, &mut buf).is_ok();
        job.buf = buf;
        p.copy_done(job, ok);
        n += 1;
    }
    n
}

#[test]
fn single_copy_rendezvous_expected_and_unexpected() {
    let (mut a, mut b) = local_pair();
    a.offer_single_copy(Some(std::process::id()));
    let big: Bytes = (0..5000u32).map(|i| (i * 13 + i / 7) as u8).collect::<Vec<u8>>().into();
    // Expected: the receive is posted first.
    let r = b.irecv(Some(a.addr()), Some(4), 8000);
    let s = a.isend(b.addr(), 4, big.clone());
    pump(&mut a, &mut b);
    assert!(b.take(r).is_none(), "nothing lands before the receiver copies");
    assert_eq!(b.bulk_bytes_in_flight(), 5000);
    assert_eq!(run_copies(&mut b, true), 1);
    assert_eq!(received(b.take(r)).data, &big[..]);
    assert!(a.take(s).is_none(), "the sender keeps its buffer until told the copy is done");
    pump(&mut a, &mut b);
    assert!(matches!(a.take(s), Some(Ok(Completion::Sent))));
    // Unexpected: the offer waits for the receive, then the copy runs.
    let s = a.isend(b.addr(), 5, big.slice(100..4100));
    pump(&mut a, &mut b);
    assert_eq!(run_copies(&mut b, true), 0);
    let r = b.irecv(None, Some(5), 4000);
    assert_eq!(run_copies(&mut b, true), 1);
    assert_eq!(received(b.take(r)).data, &big[100..4100]);
    pump(&mut a, &mut b);
    assert!(matches!(a.take(s), Some(Ok(Completion::Sent))));
    assert_eq!(b.stats.single_copies, 2);
    assert_eq!(b.stats.frames_in, 2, "one offer per message, no data frames");
    assert_eq!(a.bulk_bytes_in_flight() + b.bulk_bytes_in_flight(), 0);
}

#[test]
fn a_refused_single_copy_falls_back_to_data_frames_and_is_not_offered_again() {
    let (mut a, mut b) = local_pair();
    a.offer_single_copy(Some(std::process::id()));
    b.offer_single_copy(Some(std::process::id()));
    let big: Bytes = (0..3000u32).map(|i| (i * 31) as u8).collect::<Vec<u8>>().into();
    let r = b.irecv(None, None, 3000);
    let s = a.isend(b.addr(), 1, big.clone());
    pump(&mut a, &mut b);
    assert_eq!(run_copies(&mut b, false), 1);
    pump(&mut a, &mut b);
    assert_eq!(received(b.take(r)).data, &big[..]);
    assert!(matches!(a.take(s), Some(Ok(Completion::Sent))));
    assert_eq!((b.stats.single_copies, b.stats.single_copy_fallbacks), (0, 1));
    // The side whose copy failed stops offering; its answer travels as data frames.
    let r = a.irecv(None, None, 3000);
    b.isend(a.addr(), 2, big.clone());
    pump(&mut a, &mut b);
    assert_eq!(run_copies(&mut a, true), 0, "no offer from a side that could not copy");
    assert_eq!(received(a.take(r)).data, &big[..]);
}

#[test]
fn single_copy_truncation_and_bad_offers() {
    let (mut a, mut b) = local_pair();
    a.offer_single_copy(Some(std::process::id()));
    let r = b.irecv(None, None, 10);
    let s = a.isend(b.addr(), 1, Bytes::from(vec![1u8; 500]));
    pump(&mut a, &mut b);
    assert_eq!(run_copies(&mut b, true), 0, "a message that does not fit is not copied");
    assert!(matches!(b.take(r), Some(Err(NetError::Truncated { len: 500, capacity: 10 }))));
    assert!(matches!(a.take(s), Some(Ok(Completion::Sent))), "the sender is released");
    // Ports on different nodes never offer single copy...
    let (mut x, mut y) = pair(8);
    x.offer_single_copy(Some(std::process::id()));
    let r = y.irecv(None, None, 500);
    x.isend(B, 1, Bytes::from(vec![2u8; 500]));
    pump(&mut x, &mut y);
    assert_eq!(run_copies(&mut y, true), 0);
    assert_eq!(received(y.take(r)).data, vec![2u8; 500]);
    // ...and refuse one that claims to come from another node, or is malformed.
    use gepsea_net::frame::{Channel, Header, Kind, FLAG_SINGLE_COPY};
    let mut h = Header::new(Kind::Rts, Channel::Normal, A, B);
    h.flags = FLAG_SINGLE_COPY;
    h.total = 500;
    assert!(matches!(y.on_frame(&h, &[0u8; 16]), Err(NetError::Protocol { .. })));
    let (p, mut q) = local_pair();
    let mut h = Header::new(Kind::Rts, Channel::Normal, p.addr(), q.addr());
    h.flags = FLAG_SINGLE_COPY;
    h.total = 500;
    let e = q.on_frame(&h, &[0u8; 5]).unwrap_err().to_string();
    assert!(e.contains("single-copy offer of 5 bytes"), "{e}");
}

#[test]
fn direct_eager_only_when_nothing_is_queued_ahead_and_a_credit_is_free() {
    use gepsea_net::frame::{Channel, Kind};
    let (mut a, mut b) = pair(2);
    // No state for a peer that was never sent to: the first message goes the queued way.
    assert!(a.direct_eager(B, Channel::Normal, 1, 8).is_none());
    a.isend(B, 1, Bytes::from_static(b"first"));
    assert!(a.direct_eager(B, Channel::Normal, 2, 6).is_none(), "must not overtake the queued message");
    pump(&mut a, &mut b);
    // Nothing queued now: the fast path takes a credit and hands over a header to write.
    let (h, id1) = a.direct_eager(B, Channel::Normal, 2, 6).unwrap();
    assert_eq!((h.kind, h.channel, h.tag, h.dst), (Kind::Eager, Channel::Normal, 2, B));
    b.on_frame(&Header { len: 6, ..h }, b"second").unwrap();
    // Both credits are spent (`first`, `second`): no fast path, and a message queued
    // behind the stall keeps later ones out of it.
    assert!(a.direct_eager(B, Channel::Normal, 3, 5).is_none());
    a.isend(B, 3, Bytes::from_static(b"third"));
    assert!(a.direct_eager(B, Channel::Normal, 4, 5).is_none());
    // The system lane has credits of its own; an unwritten direct send gives its back.
    let (_, id2) = a.direct_eager(B, Channel::System, 5, 3).unwrap();
    assert_ne!(id1, id2, "every send gets an id of its own");
    a.direct_eager_unsent(B, Channel::System);
    let (_, id3) = a.direct_eager(B, Channel::System, 5, 3).unwrap();
    a.direct_eager_unsent(B, Channel::System);
    assert!(id3 > id2);
    assert!(a.direct_eager(B, Channel::System, 6, 101).is_none(), "beyond the eager threshold");
    let r = (b.irecv(None, None, 10), b.irecv(None, None, 10), b.irecv(None, None, 10));
    pump(&mut a, &mut b);
    let got: Vec<Vec<u8>> = [r.0, r.1, r.2].into_iter().map(|r| received(b.take(r)).data).collect();
    assert_eq!(got, [b"first".to_vec(), b"second".to_vec(), b"third".to_vec()], "order kept");
    assert_eq!(a.stats.eager_sent, 3);
}

/// The receiving side holds a peer to its credits: what one peer can park in a port's
/// pools is bounded, and a peer that sends past its credits, sends an "eager" message
/// larger than the eager limit, or grants back credits that never existed is refused
/// (the transport then drops its connection).
#[test]
fn a_peer_past_its_credits_or_limits_is_refused() {
    use gepsea_net::frame::{Channel, Kind};
    let (_, mut b) = pair(4);
    let eager = |channel, len: usize| {
        let mut h = Header::new(Kind::Eager, channel, A, B);
        h.len = len as u32;
        h
    };
    for _ in 0..4 {
        b.on_frame(&eager(Channel::System, 3), b"abc").unwrap();
    }
    let e = b.on_frame(&eager(Channel::System, 3), b"abc").unwrap_err();
    assert!(e.to_string().contains("more than its 4 eager credits"), "{e}");
    // Draining the pool returns the credits: the peer may send again.
    while b.recv_system().is_some() {}
    let (_, mut b) = pair(4);
    for _ in 0..4 {
        b.on_frame(&eager(Channel::System, 3), b"abc").unwrap();
    }
    for _ in 0..4 {
        b.recv_system().unwrap();
    }
    b.on_frame(&eager(Channel::System, 3), b"abc").unwrap();
    // The normal channel has its own credits, and the same limit.
    for _ in 0..4 {
        b.on_frame(&eager(Channel::Normal, 1), b"x").unwrap();
    }
    assert!(b.on_frame(&eager(Channel::Normal, 1), b"x").is_err());

    let (_, mut b) = pair(4);
    let big = vec![0u8; 101];
    let e = b.on_frame(&eager(Channel::Normal, big.len()), &big).unwrap_err();
    assert!(e.to_string().contains("eager message of 101 bytes (the eager limit is 100)"), "{e}");

    let (_, mut b) = pair(4);
    let mut credit = Header::new(Kind::Credit, Channel::Control, A, B);
    credit.total = u32::MAX as u64;
    let e = b.on_frame(&credit, &[]).unwrap_err();
    assert!(e.to_string().contains("at most 4 exist"), "{e}");

    // Rendezvous announcements nobody receives yet: 16 wait, the 17th is refused; a
    // matching receive takes one off the count.
    let (_, mut b) = pair(4);
    let rts = |id: u64| {
        let mut h = Header::new(Kind::Rts, Channel::Normal, A, B);
        h.id = id;
        h.total = 1000;
        h.tag = 9;
        h
    };
    for id in 0..16 {
        b.on_frame(&rts(id), &[]).unwrap();
    }
    let e = b.on_frame(&rts(16), &[]).unwrap_err();
    assert!(e.to_string().contains("more than 16 unmatched rendezvous messages"), "{e}");
    let (_, mut b) = pair(4);
    for id in 0..16 {
        b.on_frame(&rts(id), &[]).unwrap();
    }
    b.irecv(Some(A), Some(9), 1000);
    b.on_frame(&rts(16), &[]).unwrap();
}

/// Carries out the sender's writes into its receivers' buffers as the port does: with
/// `process_vm_writev` into this very process (the receiver's buffer lives here).
fn run_writes(p: &mut Proto, allowed: bool) -> usize {
    let mut n = 0;
    while let Some(job) = p.next_write() {
        let ok = allowed && gepsea_net::cma::write_from(job.remote.pid, job.remote.addr, &job.data).is_ok();
        p.write_done(job, ok);
        n += 1;
    }
    n
}

/// Two local ports that both offer single copy, and a message large enough to split.
fn split_pair() -> (Proto, Proto, Bytes) {
    let (mut a, mut b) = local_pair();
    a.offer_single_copy(Some(std::process::id()));
    b.offer_single_copy(Some(std::process::id()));
    a.help_split_copies(true);
    let big: Bytes = (0..300_000u32).map(|i| (i * 29 + i / 4099) as u8).collect::<Vec<u8>>().into();
    assert!(big.len() >= gepsea_net::proto::SPLIT_MIN);
    (a, b, big)
}

#[test]
fn a_large_single_copy_is_split_between_receiver_and_sender() {
    let (mut a, mut b, big) = split_pair();
    // Either part may finish first.
    for writer_first in [true, false] {
        let r = b.irecv(Some(a.addr()), Some(7), 400_000);
        let s = a.isend(b.addr(), 7, big.clone());
        pump(&mut a, &mut b);
        // The receiver asked for help at once, before copying anything.
        assert_eq!(a.bulk_bytes_in_flight(), big.len());
        if writer_first {
            assert_eq!(run_writes(&mut a, true), 1);
            pump(&mut a, &mut b);
            assert!(b.take(r).is_none(), "half a message is not a message");
            assert_eq!(run_copies(&mut b, true), 1);
        } else {
            assert_eq!(run_copies(&mut b, true), 1);
            pump(&mut a, &mut b);
            assert!(b.take(r).is_none(), "half a message is not a message");
            assert_eq!(run_writes(&mut a, true), 1);
            assert!(a.take(s).is_none(), "the sender keeps its buffer until the receiver has everything");
            pump(&mut a, &mut b);
        }
        assert_eq!(received(b.take(r)).data, &big[..]);
        pump(&mut a, &mut b);
        assert!(matches!(a.take(s), Some(Ok(Completion::Sent))));
        assert_eq!(a.bulk_bytes_in_flight() + b.bulk_bytes_in_flight(), 0);
    }
    assert_eq!((b.stats.single_copies, b.stats.single_copy_fallbacks, a.stats.single_copy_writes), (2, 0, 2));
    // The offer and the write's report, per message: no data pieces.
    assert_eq!(b.stats.frames_in, 4);
    // A sender that cannot promise to write promptly (no event thread) is not asked:
    // the receiver copies the whole message.
    a.help_split_copies(false);
    let r = b.irecv(None, None, big.len());
    let s = a.isend(b.addr(), 8, big.clone());
    pump(&mut a, &mut b);
    assert_eq!(run_writes(&mut a, true), 0);
    assert_eq!(run_copies(&mut b, true), 1);
    assert_eq!(received(b.take(r)).data, &big[..]);
    pump(&mut a, &mut b);
    assert!(matches!(a.take(s), Some(Ok(Completion::Sent))));
    assert_eq!(a.stats.single_copy_writes, 2);
}

#[test]
fn refused_parts_of_a_split_copy_come_as_data_pieces() {
    // (reader allowed, writer allowed): each refused part is fetched through the ring.
    for (read_ok, write_ok) in [(true, false), (false, true), (false, false)] {
        let (mut a, mut b, big) = split_pair();
        let r = b.irecv(None, None, big.len());
        let s = a.isend(b.addr(), 1, big.clone());
        pump(&mut a, &mut b);
        assert_eq!(run_writes(&mut a, write_ok), 1);
        pump(&mut a, &mut b);
        assert_eq!(run_copies(&mut b, read_ok), 1);
        pump(&mut a, &mut b);
        let case = format!("read allowed {read_ok}, write allowed {write_ok}");
        assert_eq!(received(b.take(r)).data, &big[..], "{case}");
        assert!(matches!(a.take(s), Some(Ok(Completion::Sent))), "{case}");
        assert_eq!(b.stats.single_copies, read_ok as u64, "{case}");
        assert_eq!(a.stats.single_copy_writes, write_ok as u64, "{case}");
        // A receiver whose helper could not write asks no one for help again; one
        // whose own read failed stops offering single copy (as without splitting).
        let r = b.irecv(None, None, big.len());
        let s = a.isend(b.addr(), 2, big.clone());
        pump(&mut a, &mut b);
        let writes = run_writes(&mut a, true);
        assert_eq!(writes, (read_ok && write_ok) as usize, "{case}");
        run_copies(&mut b, true);
        pump(&mut a, &mut b);
        assert_eq!(received(b.take(r)).data, &big[..], "{case}");
        assert!(matches!(a.take(s), Some(Ok(Completion::Sent))), "{case}");
    }
}

#[test]
fn a_peer_failing_during_a_split_copy_fails_the_receive_and_the_send() {
    let (mut a, mut b, big) = split_pair();
    let r = b.irecv(None, None, big.len());
    let s = a.isend(b.addr(), 1, big.clone());
    pump(&mut a, &mut b);
    b.peer_failed(a.addr(), "gone");
    a.peer_failed(b.addr(), "gone");
    assert!(matches!(b.take(r), Some(Err(NetError::PeerFailed { .. }))));
    assert!(matches!(a.take(s), Some(Err(NetError::PeerFailed { .. }))));
    assert_eq!((run_copies(&mut b, true), run_writes(&mut a, true)), (0, 0), "abandoned copies are not run");
    assert_eq!(a.bulk_bytes_in_flight() + b.bulk_bytes_in_flight(), 0);
}

#[test]
fn split_copy_frames_out_of_turn_break_the_protocol() {
    use gepsea_net::frame::{Channel, Kind, FLAG_SINGLE_COPY, FLAG_WRITE};
    let (mut a, mut b, big) = split_pair();
    let (pa, pb) = (a.addr(), b.addr());
    // A write request for a message never announced.
    let mut h = Header::new(Kind::Cts, Channel::Normal, pb, pa);
    h.flags = FLAG_WRITE;
    h.id = 99;
    let e = a.on_frame(&h, &[0u8; 16]).unwrap_err().to_string();
    assert!(e.contains("write request for message 99"), "{e}");
    // A write request for bytes beyond the message.
    let r = b.irecv(None, None, big.len());
    let s = a.isend(pb, 1, big.clone());
    let mut cts = h;
    cts.id = s;
    cts.offset = big.len() as u64;
    cts.total = big.len() as u64;
    let e = a.on_frame(&cts, &[0u8; 16]).unwrap_err().to_string();
    assert!(e.contains("write request for bytes"), "{e}");
    pump(&mut a, &mut b);
    // A report of a write at another offset than asked, and data nobody asked for.
    let mut report = Header::new(Kind::Data, Channel::Normal, pa, pb);
    report.id = s;
    report.flags = FLAG_SINGLE_COPY;
    report.offset = 4096;
    report.total = big.len() as u64;
    let e = b.on_frame(&report, &[]).unwrap_err().to_string();
    assert!(e.contains("report of a write at 4096"), "{e}");
    let mut piece = report;
    piece.flags = 0;
    piece.offset = 0;
    let e = b.on_frame(&piece, &[1u8; 64]).unwrap_err().to_string();
    assert!(e.contains("which was not asked for"), "{e}");
    // The transfer itself is unharmed.
    run_writes(&mut a, true);
    run_copies(&mut b, true);
    pump(&mut a, &mut b);
    assert_eq!(received(b.take(r)).data, &big[..]);
}

/// A pair whose messages between the two nodes go eagerly up to 400 bytes (4× the
/// shared-memory limit, so 4 credits each).
fn remote_eager_pair(credits: u32) -> (Proto, Proto) {
    let (mut a, mut b) = pair(credits);
    a.set_remote_eager(400);
    b.set_remote_eager(400);
    (a, b)
}

/// The next frame from `from` to `to` as a transport that reads payloads in place would
/// see it: its header, once the decoder has it, and its payload.
fn next_frame(from: &mut Proto, to: Addr) -> (Header, Vec<u8>) {
    let out = from.pop_frame(to).expect("a frame to send");
    let bytes = out.frame.to_bytes();
    from.frame_sent(out.completes);
    let mut d = FrameDecoder::new(1 << 20);
    d.extend(&bytes[..bytes.len() - out.frame.payload.len() + 1]);
    let (h, have) = d.partial_header().expect("header in, payload not yet");
    assert_eq!(have, 1);
    (h, out.frame.payload.to_vec())
}

#[test]
fn between_nodes_larger_messages_go_eagerly_and_cost_credits_by_size() {
    let (mut a, mut b) = remote_eager_pair(8);
    let msg = |i: u8| Bytes::from(vec![i; 400]);
    let sends: Vec<_> = (0..3).map(|i| a.isend(B, 5, msg(i))).collect();
    assert_eq!((a.stats.eager_sent, a.stats.rendezvous_sent), (3, 0));
    // 8 credits, 4 per message: two go, the third waits for credits to come back.
    assert_eq!(step(&mut a, &mut b, usize::MAX), 2);
    assert!(a.stats.credit_stalls > 0);
    assert!(a.take(sends[2]).is_none());
    let r: Vec<_> = (0..3).map(|_| b.irecv(Some(A), Some(5), 400)).collect();
    pump(&mut a, &mut b);
    for (i, r) in r.into_iter().enumerate() {
        assert_eq!(received(b.take(r)).data, vec![i as u8; 400]);
    }
    // 401 bytes is past the limit: rendezvous. On one node the shared-memory limit holds.
    a.isend(B, 5, Bytes::from(vec![0u8; 401]));
    assert_eq!(a.stats.rendezvous_sent, 1);
    let mut local = Proto::new(Addr::new(1, 2), ProtoConfig { eager_threshold: 100, credits: 8, chunk: 64, max_unexpected_rts: 16 });
    local.set_remote_eager(400);
    local.isend(A, 5, Bytes::from(vec![0u8; 101]));
    assert_eq!(local.stats.rendezvous_sent, 1);
    // A limit beyond all of a lane's credits is cut to them.
    let (mut a, mut b) = remote_eager_pair(2);
    a.set_remote_eager(1000);
    b.set_remote_eager(1000);
    a.isend(B, 5, Bytes::from(vec![0u8; 201]));
    assert_eq!(a.stats.rendezvous_sent, 1);
    // The receiver holds its peer to the same limit, and counts credits by size.
    use gepsea_net::frame::{Channel, Kind};
    let eager = |len: usize| {
        let mut h = Header::new(Kind::Eager, Channel::Normal, A, B);
        h.len = len as u32;
        h
    };
    let (_, mut b) = remote_eager_pair(8);
    let e = b.on_frame(&eager(401), &[0u8; 401]).unwrap_err();
    assert!(e.to_string().contains("eager message of 401 bytes (the eager limit is 400)"), "{e}");
    let (_, mut b) = remote_eager_pair(8);
    for _ in 0..2 {
        b.on_frame(&eager(400), &[0u8; 400]).unwrap();
    }
    let e = b.on_frame(&eager(1), b"x").unwrap_err();
    assert!(e.to_string().contains("more than its 8 eager credits"), "{e}");
}

#[test]
fn an_eager_message_is_matched_at_its_header_and_read_into_the_posted_receive() {
    let (mut a, mut b) = remote_eager_pair(8);
    let first = b.irecv(None, None, 400);
    let second = b.irecv(Some(A), Some(5), 400);
    a.isend(B, 5, Bytes::from(vec![7u8; 300]));
    let (h, payload) = next_frame(&mut a, B);
    let dest = b.direct_destination(&h).expect("the first matching receive is claimed");
    assert!(dest.is_empty() && dest.capacity() >= 300);
    dest.extend_from_slice(&payload);
    assert!(!b.cancel(first), "a claimed receive cannot be cancelled");
    b.eager_received_in_place(&h).unwrap();
    let m = received(b.take(first));
    assert_eq!((m.src, m.tag, m.data), (A, 5, vec![7u8; 300]));
    assert!(b.take(second).is_none(), "the later receive is still posted");
    assert_eq!(b.stats.unexpected, 0);
    a.isend(B, 5, Bytes::from_static(b"next"));
    pump(&mut a, &mut b);
    assert_eq!(received(b.take(second)).data, b"next");
    // Credits came back as for a message that came whole: 8 more 4-credit messages flow.
    let r: Vec<_> = (0..8).map(|_| b.irecv(Some(A), Some(6), 400)).collect();
    for _ in 0..8 {
        a.isend(B, 6, Bytes::from(vec![1u8; 400]));
    }
    pump(&mut a, &mut b);
    assert!(r.into_iter().all(|r| received(b.take(r)).data == vec![1u8; 400]));
}

#[test]
fn an_eager_message_with_no_receive_or_too_small_a_one_comes_whole() {
    let (mut a, mut b) = remote_eager_pair(8);
    a.isend(B, 5, Bytes::from(vec![1u8; 300]));
    let (h, payload) = next_frame(&mut a, B);
    assert!(b.direct_destination(&h).is_none(), "nothing posted");
    b.on_frame(&h, &payload).unwrap();
    assert_eq!(b.stats.unexpected, 1);
    let r = b.irecv(Some(A), Some(5), 300);
    assert_eq!(received(b.take(r)).data, vec![1u8; 300]);
    let small = b.irecv(Some(A), Some(5), 100);
    a.isend(B, 5, Bytes::from(vec![2u8; 300]));
    let (h, payload) = next_frame(&mut a, B);
    assert!(b.direct_destination(&h).is_none(), "too small to claim");
    b.on_frame(&h, &payload).unwrap();
    assert!(matches!(b.take(small), Some(Err(NetError::Truncated { len: 300, capacity: 100 }))));
}

/// A connection that breaks while an eager payload is read in place: the receive stays
/// bound to that frame, and its replay (in place again, or whole) lands in it, not in
/// a receive posted after it.
#[test]
fn a_claimed_eager_receive_waits_for_its_frame_across_a_reconnect() {
    for whole in [false, true] {
        let (mut a, mut b) = remote_eager_pair(8);
        let claimed = b.irecv(Some(A), Some(5), 400);
        a.isend(B, 5, Bytes::from(vec![3u8; 300]));
        let (h, payload) = next_frame(&mut a, B);
        b.direct_destination(&h).unwrap().extend_from_slice(&payload[..100]);
        // The connection breaks: the transport cuts the buffer back.
        b.eager_buffer(A).unwrap().clear();
        let later = b.irecv(Some(A), Some(5), 400);
        if whole {
            b.on_frame(&h, &payload).unwrap();
        } else {
            b.direct_destination(&h).expect("the replay finds its receive").extend_from_slice(&payload);
            b.eager_received_in_place(&h).unwrap();
        }
        assert_eq!(received(b.take(claimed)).data, vec![3u8; 300], "whole: {whole}");
        assert!(b.take(later).is_none());
    }
    // The peer fails instead: the claimed receive fails with it.
    let (mut a, mut b) = remote_eager_pair(8);
    let claimed = b.irecv(None, None, 400);
    a.isend(B, 5, Bytes::from(vec![3u8; 300]));
    let (h, _) = next_frame(&mut a, B);
    b.direct_destination(&h).unwrap();
    b.peer_failed(A, "gone");
    assert!(matches!(b.take(claimed), Some(Err(NetError::PeerFailed { .. }))));
    assert!(b.eager_buffer(A).is_none());
}

/// Large eager messages that arrive before their receives are copied into kept
/// buffers: a shorter one after a longer one carries nothing of it.
#[test]
fn unexpected_large_eager_messages_keep_their_own_bytes() {
    let (mut a, mut b) = remote_eager_pair(64);
    for round in 0..3u8 {
        let lens = [400usize, 101, 250, 399];
        for (i, &len) in lens.iter().enumerate() {
            a.isend(B, i as u64, Bytes::from(vec![round * 10 + i as u8; len]));
        }
        pump(&mut a, &mut b);
        for (i, &len) in lens.iter().enumerate() {
            let r = b.irecv(Some(A), Some(i as u64), 400);
            assert_eq!(received(b.take(r)).data, vec![round * 10 + i as u8; len], "round {round}, message {i}");
        }
    }
    assert_eq!(b.stats.unexpected, 12);
}

#[test]
fn eager_messages_held_for_credits_are_counted_up_to_one_window_and_released_as_credits_return() {
    // 8 credits of 100 bytes: a window of 800 bytes, 2 messages of 400 at a time.
    let (mut a, mut b) = remote_eager_pair(8);
    let sends: Vec<_> = (0..5).map(|i| a.isend(B, 5, Bytes::from(vec![i as u8; 400]))).collect();
    // Queued, none gone yet: what waits is counted up to one window.
    assert_eq!((a.eager_bytes_stalled(), a.eager_bytes_released()), (800, 0));
    assert_eq!(step(&mut a, &mut b, usize::MAX), 2);
    // Two let go; three wait for credits (1,200 bytes, still one window counted).
    assert_eq!((a.eager_bytes_stalled(), a.eager_bytes_released()), (800, 800));
    assert!(a.take(sends[2]).is_none());
    // The receiver takes them in: credits come back (every half window) and the
    // rest leave.
    let r: Vec<_> = (0..5).map(|_| b.irecv(Some(A), Some(5), 400)).collect();
    pump(&mut a, &mut b);
    assert_eq!((a.eager_bytes_stalled(), a.eager_bytes_released()), (0, 2000));
    for (i, r) in r.into_iter().enumerate() {
        assert_eq!(received(b.take(r)).data, vec![i as u8; 400]);
    }
    // Rendezvous messages are not eager ones: neither counted nor released here.
    a.isend(B, 5, Bytes::from(vec![0u8; 401]));
    assert_eq!((a.eager_bytes_stalled(), a.eager_bytes_released()), (0, 2000));
}
