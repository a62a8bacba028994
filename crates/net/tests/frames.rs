//! Malformed input from the network: corrupted, truncated and oversized frames sent by a
//! raw socket are refused with a clear error, nothing is delivered, the connection is
//! reset, and the port keeps serving well-behaved peers.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::Bytes;
use common::{unique, wait_for};
use gepsea_net::frame::{encode_sums, Addr, Channel, Frame, Header, Kind, FLAG_LAST, HEADER_LEN};
use gepsea_net::{Completion, Port, PortConfig};

const ROGUE: Addr = Addr::new(9, 9);

fn listening_port(ns: &str, node: u32) -> Port {
    let mut cfg = PortConfig::new(ns, Addr::new(node, 1));
    cfg.listen = Some("127.0.0.1:0".parse().unwrap());
    Port::open(cfg).unwrap()
}

fn hello(to: Addr) -> Vec<u8> {
    let mut h = Header::new(Kind::Hello, Channel::Control, ROGUE, to);
    h.tag = 42;
    Frame::control(h).to_bytes()
}

fn eager(to: Addr, seq: u64, tag: u64, body: &[u8]) -> Vec<u8> {
    let mut h = Header::new(Kind::Eager, Channel::Normal, ROGUE, to);
    h.seq = seq;
    h.tag = tag;
    Frame { header: h, payload: Bytes::copy_from_slice(body) }.to_bytes()
}

/// Sends `bytes`, then waits until the port closes the connection (or `expect_close`
/// is false and the bytes were merely taken).
fn send_raw(port: &Port, bytes: &[u8], expect_close: bool) {
    let mut s = TcpStream::connect(port.listen_addr().unwrap()).unwrap();
    s.write_all(bytes).unwrap();
    if expect_close {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => continue, // the HelloAck
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
                Err(e) => panic!("port did not reset the connection: {e}"),
            }
        }
    }
}

#[test]
fn garbage_bad_version_corrupted_and_oversized_frames_are_refused() {
    let ns = unique("frm");
    let port = listening_port(&ns, 1);
    let me = port.addr();
    let pending = port.irecv(None, None, 1 << 20);

    // 1. Not gepsea at all.
    send_raw(&port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".repeat(4).as_slice(), true);
    let st = wait_for(&port, |s| s.frames_rejected == 1);
    assert!(st.recent_errors.last().unwrap().contains("bad magic"), "{:?}", st.recent_errors);

    // 2. A future wire version.
    let mut v = hello(me);
    v[4] = 2;
    send_raw(&port, &v, true);
    let st = wait_for(&port, |s| s.frames_rejected == 2);
    assert!(st.recent_errors.last().unwrap().contains("unsupported wire version 2"), "{:?}", st.recent_errors);

    // 3. A proper handshake, then a message whose payload was damaged in flight.
    let mut bad = eager(me, 1, 5, b"payload that will be damaged");
    bad[HEADER_LEN + 3] ^= 0x10;
    send_raw(&port, &[hello(me), bad].concat(), true);
    let st = wait_for(&port, |s| s.frames_rejected == 3);
    assert!(st.recent_errors.last().unwrap().contains("payload checksum mismatch"), "{:?}", st.recent_errors);

    // 4. A header announcing more than the frame limit.
    let big = {
        let h = Header::new(Kind::Eager, Channel::Normal, ROGUE, me);
        let mut b = vec![0u8; HEADER_LEN];
        h.encode(&vec![0u8; 2 << 20], &mut b);
        b
    };
    send_raw(&port, &[hello(me), big].concat(), true);
    let st = wait_for(&port, |s| s.frames_rejected == 4);
    assert!(st.recent_errors.last().unwrap().contains("exceeds the limit"), "{:?}", st.recent_errors);

    // 5. A truncated frame, then the sender vanishes: nothing to reject, nothing delivered.
    let t = eager(me, 1, 5, &[1u8; 1000]);
    send_raw(&port, &[hello(me), t[..600].to_vec()].concat(), false);
    let st = wait_for(&port, |s| s.connections_lost >= 5);
    assert_eq!(st.frames_rejected, 4);

    // Nothing of the above was delivered.
    assert!(port.test(pending).is_none(), "a malformed frame was delivered");

    // 6. The port still serves a well-behaved peer over TCP.
    let good = listening_port(&ns, 2);
    good.add_route(me, port.listen_addr().unwrap());
    good.send(me, 7, &b"still alive"[..]).unwrap();
    match port.wait_timeout(pending, Duration::from_secs(10)).unwrap() {
        Completion::Received(m) => {
            assert_eq!(m.src, good.addr());
            assert_eq!(m.data, b"still alive");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn well_formed_rogue_peer_delivers_exactly_once() {
    // The positive control for the test above: the same hand-made frames, undamaged,
    // are delivered, and a replayed duplicate is dropped.
    let ns = unique("frm");
    let port = listening_port(&ns, 1);
    let me = port.addr();
    let r = port.irecv(Some(ROGUE), Some(5), 100);
    let frames = [hello(me), eager(me, 1, 5, b"one"), eager(me, 1, 5, b"one")].concat();
    let mut s = TcpStream::connect(port.listen_addr().unwrap()).unwrap();
    s.write_all(&frames).unwrap();
    match port.wait_timeout(r, Duration::from_secs(10)).unwrap() {
        Completion::Received(m) => assert_eq!(m.data, b"one"),
        other => panic!("{other:?}"),
    }
    wait_for(&port, |st| st.duplicates_dropped == 1);
    assert_eq!(port.stats().frames_rejected, 0);
}

/// One frame of a rendezvous message `msg` of `total` bytes from the rogue peer: the
/// announcement (`Rts`, no body) or a piece of data at `offset`.
fn rendezvous(to: Addr, kind: Kind, seq: u64, msg: u64, total: usize, offset: usize, body: &[u8]) -> Vec<u8> {
    let mut h = Header::new(kind, Channel::Normal, ROGUE, to);
    h.seq = seq;
    h.tag = 5;
    h.id = msg;
    h.total = total as u64;
    h.offset = offset as u64;
    if kind == Kind::Data && offset + body.len() == total {
        h.flags |= FLAG_LAST;
    }
    Frame { header: h, payload: Bytes::copy_from_slice(body) }.to_bytes()
}

#[test]
fn a_damaged_piece_read_in_place_is_refused_and_its_replay_lands_intact() {
    // Large pieces from another node are read straight into the posted buffer, outside
    // the decoder, and checked as they land. A damaged one must be refused like any
    // other frame, and must leave nothing behind: the buffer is cut back, so that the
    // piece replayed on the next connection goes where it belongs.
    let ns = unique("frm");
    let port = listening_port(&ns, 1);
    let me = port.addr();
    let total = 300 << 10;
    let body: Vec<u8> = (0..total).map(|i| (i * 7 + i / 4096) as u8).collect();
    let r = port.irecv(Some(ROGUE), Some(5), total);
    let piece = 256 << 10;
    let rts = rendezvous(me, Kind::Rts, 1, 77, total, 0, &[]);
    let first = rendezvous(me, Kind::Data, 2, 77, total, 0, &body[..piece]);
    let second = rendezvous(me, Kind::Data, 3, 77, total, piece, &body[piece..]);
    let mut damaged = first.clone();
    damaged[HEADER_LEN + 200_000] ^= 0x01;

    send_raw(&port, &[hello(me), rts, damaged].concat(), true);
    let st = wait_for(&port, |s| s.frames_rejected == 1);
    assert!(st.recent_errors.last().unwrap().contains("payload checksum mismatch"), "{:?}", st.recent_errors);
    assert_eq!(st.pieces_in_place, 0);
    assert!(port.test(r).is_none(), "a damaged piece completed the receive");

    // The same incarnation reconnects and replays from what the port acknowledges.
    let mut s = TcpStream::connect(port.listen_addr().unwrap()).unwrap();
    s.write_all(&hello(me)).unwrap();
    let mut ack = [0u8; HEADER_LEN];
    s.read_exact(&mut ack).unwrap();
    let ack = Header::decode(&ack, 0).unwrap();
    assert_eq!((ack.kind, ack.ack), (Kind::HelloAck, 1), "the announcement was delivered, the piece was not");
    s.write_all(&[first, second].concat()).unwrap();
    match port.wait_timeout(r, Duration::from_secs(10)).unwrap() {
        Completion::Received(m) => {
            assert_eq!(m.data.len(), total);
            assert!(m.data == body, "the message differs from what was sent");
        }
        other => panic!("{other:?}"),
    }
    // Both pieces went in place: the damaged one left the buffer as it found it.
    let st = port.stats();
    assert_eq!(st.pieces_in_place, 2, "{st:?}");
    assert_eq!(st.frames_rejected, 1);
}

/// A piece as `rendezvous` makes it, but with its checksum to follow in a sum frame
/// (`FLAG_SUM_AFTER`), as a port sends its large pieces.
fn piece_sum_after(to: Addr, seq: u64, msg: u64, total: usize, offset: usize, body: &[u8]) -> Vec<u8> {
    let wire = rendezvous(to, Kind::Data, seq, msg, total, offset, body);
    let h = Header::decode(&wire[..HEADER_LEN], usize::MAX).unwrap();
    let mut out = vec![0u8; HEADER_LEN];
    h.encode_sum_after(body.len(), &mut out);
    out.extend_from_slice(body);
    out
}

/// The sum frame that follows pieces `(seq, body)`.
fn sum_of(to: Addr, pieces: &[(u64, &[u8])]) -> Vec<u8> {
    let sums: Vec<(u64, u32)> = pieces.iter().map(|&(seq, b)| (seq, crc32c::crc32c(b))).collect();
    let mut h = Header::new(Kind::Sum, Channel::Control, ROGUE, to);
    h.total = sums.len() as u64;
    Frame { header: h, payload: Bytes::from(encode_sums(&sums)) }.to_bytes()
}

#[test]
fn pieces_whose_sum_comes_after_are_held_until_it_matches_and_a_damaged_one_is_refused() {
    // Large pieces go out before their checksums, which follow in a sum frame. A
    // damaged piece must be refused when its sum comes, leaving nothing delivered or
    // acknowledged and nothing in the buffer, so that its replay lands intact.
    let ns = unique("frm");
    let port = listening_port(&ns, 1);
    let me = port.addr();
    let total = 600 << 10;
    let body: Vec<u8> = (0..total).map(|i| (i * 11 + i / 4096) as u8).collect();
    let r = port.irecv(Some(ROGUE), Some(5), total);
    let piece = 256 << 10;
    let (a, b, c) = (&body[..piece], &body[piece..2 * piece], &body[2 * piece..]);
    let rts = rendezvous(me, Kind::Rts, 1, 78, total, 0, &[]);
    let first = piece_sum_after(me, 2, 78, total, 0, a);
    let second = piece_sum_after(me, 3, 78, total, piece, b);
    let third = piece_sum_after(me, 4, 78, total, 2 * piece, c);
    let mut damaged = second.clone();
    damaged[HEADER_LEN + 100_000] ^= 0x08;
    let sum = sum_of(me, &[(2, a), (3, b), (4, c)]);

    send_raw(&port, &[hello(me), rts, first.clone(), damaged, third.clone(), sum.clone()].concat(), true);
    let st = wait_for(&port, |s| s.frames_rejected == 1);
    assert!(st.recent_errors.last().unwrap().contains("payload checksum mismatch"), "{:?}", st.recent_errors);
    assert_eq!(st.pieces_in_place, 0, "a piece was delivered before its sum");
    assert!(port.test(r).is_none(), "a damaged piece completed the receive");

    // Without its sum, a whole, undamaged message is held, not delivered.
    send_raw(&port, &[hello(me), first.clone(), second.clone(), third.clone()].concat(), false);
    wait_for(&port, |s| s.connections_lost >= 2);
    assert!(port.test(r).is_none(), "pieces were delivered without their sum");

    // The same incarnation reconnects: nothing of the pieces was acknowledged, and the
    // replay with its sum lands exactly.
    let mut s = TcpStream::connect(port.listen_addr().unwrap()).unwrap();
    s.write_all(&hello(me)).unwrap();
    let mut ack = [0u8; HEADER_LEN];
    s.read_exact(&mut ack).unwrap();
    let ack = Header::decode(&ack, 0).unwrap();
    assert_eq!((ack.kind, ack.ack), (Kind::HelloAck, 1), "the announcement was delivered, the pieces were not");
    s.write_all(&[first, second, third, sum].concat()).unwrap();
    match port.wait_timeout(r, Duration::from_secs(10)).unwrap() {
        Completion::Received(m) => assert!(m.data == body, "the message differs from what was sent"),
        other => panic!("{other:?}"),
    }
    let st = port.stats();
    assert_eq!(st.frames_rejected, 1);
    assert!(st.pieces_in_place >= 1, "{st:?}");
}

#[test]
fn a_frame_between_pieces_and_their_sum_is_refused() {
    let ns = unique("frm");
    let port = listening_port(&ns, 1);
    let me = port.addr();
    let total = 300 << 10;
    let body = vec![7u8; total];
    let r = port.irecv(Some(ROGUE), Some(5), total);
    let other = port.irecv(Some(ROGUE), Some(6), 100);
    let rts = rendezvous(me, Kind::Rts, 1, 79, total, 0, &[]);
    let piece = piece_sum_after(me, 2, 79, total, 0, &body);
    send_raw(&port, &[hello(me), rts, piece, eager(me, 3, 6, b"cuts in"), sum_of(me, &[(2, &body)])].concat(), true);
    let st = wait_for(&port, |s| s.frames_rejected == 1);
    assert!(st.recent_errors.last().unwrap().contains("came before the checksums"), "{:?}", st.recent_errors);
    assert!(port.test(r).is_none() && port.test(other).is_none(), "something was delivered out of step");
}
