//! Payload checksums on TCP links, as negotiated in the handshake: a port that trusts
//! TCP (`TcpChecksums::Headers`) says so in its `Hello`/`HelloAck`; data goes without
//! a payload CRC only on a connection whose two ends both said so, and a port that
//! checksums payloads refuses data that comes without one. Checked on the wire, with a
//! hand-driven peer on a raw socket, end to end between two ports of each setting,
//! through a relay that cuts the link or alters a byte (what trusting TCP gives up,
//! and what it keeps), and for a job process given the setting by
//! `GEPSEA_TCP_CHECKSUMS`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use common::relay::Relay;
use common::{netpeer, unique, wait_for, Ns, Proc, TempDir};
use gepsea_net::frame::{Addr, Channel, Frame, FrameDecoder, Header, Kind, FLAG_LAST, FLAG_PAYLOAD_CRC, FLAG_TRUST_TCP, HEADER_LEN};
use gepsea_net::tcp::TcpChecksums;
use gepsea_net::{Completion, Port, PortConfig};

const ROGUE: Addr = Addr::new(9, 9);
const WAIT: Duration = Duration::from_secs(20);

fn listening_port(ns: &str, checksums: TcpChecksums) -> Port {
    let mut cfg = PortConfig::new(ns, Addr::new(1, 1));
    cfg.listen = Some("127.0.0.1:0".parse().unwrap());
    cfg.tcp_checksums = checksums;
    // The hand-driven peer acknowledges nothing: the port's last sends stay unacknowledged.
    cfg.linger = Duration::from_millis(100);
    Port::open(cfg).unwrap()
}

/// The hand-driven peer's `Hello`, saying it trusts TCP or not.
fn hello(to: Addr, trusting: bool) -> Header {
    let mut h = Header::new(Kind::Hello, Channel::Control, ROGUE, to);
    h.tag = 42;
    if trusting {
        h.flags |= FLAG_TRUST_TCP;
    }
    h
}

/// The hand-driven peer's `Hello`, trusting TCP and accepting payloads of up to `max`.
fn hello_accepting(to: Addr, max: usize) -> Header {
    let mut h = hello(to, true);
    h.total = max as u64;
    h
}

/// A frame of the hand-driven peer whose payload goes without a checksum, as a port
/// that trusts TCP sends data to a peer that does too.
fn unchecked(h: Header, body: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_LEN];
    h.encode_without_payload_crc(body.len(), &mut out);
    out.extend_from_slice(body);
    out
}

fn eager(to: Addr, seq: u64, body: &[u8]) -> Vec<u8> {
    let mut h = Header::new(Kind::Eager, Channel::Normal, ROGUE, to);
    h.seq = seq;
    h.tag = 5;
    unchecked(h, body)
}

/// An `Rts` for message `msg` of `total` bytes, then its data in pieces of at most
/// `piece` bytes, none with a payload checksum.
fn rendezvous(to: Addr, first_seq: u64, msg: u64, body: &[u8], piece: usize) -> Vec<u8> {
    let frame = |kind, seq, offset: usize, part: &[u8]| {
        let mut h = Header::new(kind, Channel::Normal, ROGUE, to);
        (h.seq, h.tag, h.id, h.total, h.offset) = (seq, 5, msg, body.len() as u64, offset as u64);
        if kind == Kind::Data && offset + part.len() == body.len() {
            h.flags |= FLAG_LAST;
        }
        h
    };
    let mut wire = Frame::control(frame(Kind::Rts, first_seq, 0, &[])).to_bytes();
    for (i, part) in body.chunks(piece).enumerate() {
        wire.extend(unchecked(frame(Kind::Data, first_seq + 1 + i as u64, i * piece, part), part));
    }
    wire
}

/// Reads frames from the raw socket until one of `kind` comes (each checked by the
/// decoder: headers always, payloads where flagged).
fn read_until(s: &mut TcpStream, dec: &mut FrameDecoder, kind: Kind) -> (Header, Vec<u8>) {
    s.set_read_timeout(Some(WAIT)).unwrap();
    loop {
        if let Some((h, p)) = dec.next_frame().expect("a well-formed frame from the port") {
            if h.kind == kind {
                return (h, p.to_vec());
            }
            continue;
        }
        let spare = dec.spare();
        let n = s.read(spare).expect("the port's next frame");
        assert!(n > 0, "the port closed the connection before a {kind:?} frame");
        dec.filled(n);
    }
}

fn received(port: &Port, r: gepsea_net::ReqId) -> Vec<u8> {
    match port.wait_timeout(r, WAIT).unwrap() {
        Completion::Received(m) => m.data.to_vec(),
        other => panic!("{other:?}"),
    }
}

fn body(n: usize, seed: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 + i / 4096 + seed) as u8).collect()
}

/// Connects the hand-driven peer, says hello, and returns the socket, a decoder for
/// what the port sends, and the port's `HelloAck`.
fn handshake(port: &Port, trusting: bool) -> (TcpStream, FrameDecoder, Header) {
    handshake_with(port.listen_addr().unwrap(), hello(port.addr(), trusting))
}

/// [`handshake`] with the port listening at `at`, saying `hello`.
fn handshake_with(at: std::net::SocketAddr, hello: Header) -> (TcpStream, FrameDecoder, Header) {
    let mut s = TcpStream::connect(at).unwrap();
    s.write_all(&Frame::control(hello).to_bytes()).unwrap();
    let mut dec = FrameDecoder::new(8 << 20);
    let (ack, _) = read_until(&mut s, &mut dec, Kind::HelloAck);
    (s, dec, ack)
}

/// The port sends the hand-driven peer a 2000-byte message: it arrives exact, and
/// whether its header carries a payload checksum.
fn reply_is_checksummed(port: &Port, s: &mut TcpStream, dec: &mut FrameDecoder, seed: usize) -> bool {
    let reply = body(2000, seed);
    let _send = port.isend(ROGUE, 6, Bytes::from(reply.clone()));
    let (h, payload) = read_until(s, dec, Kind::Eager);
    assert_eq!(payload, reply);
    h.flags & FLAG_PAYLOAD_CRC != 0
}

/// Writes `wire` from the hand-driven peer and waits for the port to refuse a frame of
/// it: its statistics then.
fn refused(port: &Port, s: &mut TcpStream, wire: &[u8]) -> gepsea_net::PortStats {
    s.write_all(wire).unwrap();
    wait_for(port, |st| st.frames_rejected == 1)
}

#[test]
fn two_trusting_ends_exchange_data_without_payload_checksums() {
    let ns = Ns(unique("pcs"));
    let port = listening_port(&ns.0, TcpChecksums::Headers);
    let me = port.addr();
    let (mut s, mut dec, ack) = handshake(&port, true);
    assert_ne!(ack.flags & FLAG_TRUST_TCP, 0, "the port did not say it trusts TCP");

    // Data without checksums is taken: an eager message, and a rendezvous message
    // whose first piece is read in place.
    let small = body(1000, 1);
    let large = body(300 << 10, 2);
    let r_small = port.irecv(Some(ROGUE), Some(5), small.len());
    let r_large = port.irecv(Some(ROGUE), Some(5), large.len());
    s.write_all(&[eager(me, 1, &small), rendezvous(me, 2, 77, &large, 256 << 10)].concat()).unwrap();
    assert!(received(&port, r_small) == small, "the eager message differs from what was sent");
    assert!(received(&port, r_large) == large, "the rendezvous message differs from what was sent");
    assert_eq!(port.stats().frames_rejected, 0);

    // And the port sends its data without them.
    assert!(!reply_is_checksummed(&port, &mut s, &mut dec, 3), "a payload checksum on a link both ends trust");
}

#[test]
fn a_port_that_keeps_its_checksums_sends_them_and_refuses_data_without_them() {
    let ns = Ns(unique("pcs"));
    let port = listening_port(&ns.0, TcpChecksums::Full);
    let me = port.addr();
    let (mut s, mut dec, ack) = handshake(&port, true);
    assert_eq!(ack.flags & FLAG_TRUST_TCP, 0, "a port that checksums everything said it trusts TCP");

    assert!(reply_is_checksummed(&port, &mut s, &mut dec, 4), "no payload checksum from a port that keeps them");

    // A large piece without its checksum is refused, not read in place and delivered.
    let large = body(300 << 10, 5);
    let r = port.irecv(Some(ROGUE), Some(5), large.len());
    let st = refused(&port, &mut s, &rendezvous(me, 1, 78, &large, 256 << 10));
    let error = st.recent_errors.last().unwrap();
    assert!(error.contains("Data payload without a checksum"), "{error}");
    assert_eq!(st.pieces_in_place, 0, "{st:?}");
    assert!(port.test(r).is_none(), "data without a checksum was delivered");
}

#[test]
fn a_trusting_port_keeps_checksums_with_a_peer_that_does_not_trust() {
    let ns = Ns(unique("pcs"));
    let port = listening_port(&ns.0, TcpChecksums::Headers);
    let me = port.addr();
    let (mut s, mut dec, ack) = handshake(&port, false);
    assert_ne!(ack.flags & FLAG_TRUST_TCP, 0, "the port did not say it trusts TCP");

    assert!(reply_is_checksummed(&port, &mut s, &mut dec, 6), "no payload checksum for a peer that did not trust TCP");

    let r = port.irecv(Some(ROGUE), Some(5), 1000);
    let st = refused(&port, &mut s, &eager(me, 1, &body(1000, 7)));
    let error = st.recent_errors.last().unwrap();
    assert!(error.contains("Eager payload without a checksum"), "{error}");
    assert!(port.test(r).is_none(), "data without a checksum was delivered");
}

#[test]
fn ports_of_either_setting_deliver_every_size_exactly_both_ways() {
    use TcpChecksums::{Full, Headers};
    // The last pairings authenticate their links, the terms travelling in the keyed
    // handshake's frames as in the plain one's, and encrypt them (sealed links carry no
    // payload checksums in either setting, and are not counted as trusting TCP).
    let key = gepsea_net::auth::Key::from_secret(b"the job's secret");
    let pairings = [
        (Headers, Headers, "plain"),
        (Headers, Full, "plain"),
        (Full, Headers, "plain"),
        (Headers, Headers, "keyed"),
        (Headers, Headers, "encrypted"),
    ];
    for (sa, sb, links) in pairings {
        let ns = Ns(unique("pcs"));
        let open = |addr: Addr, checksums: TcpChecksums| {
            let mut cfg = PortConfig::new(&ns.0, addr);
            cfg.listen = Some("127.0.0.1:0".parse().unwrap());
            cfg.tcp_checksums = checksums;
            cfg.key = (links != "plain").then(|| key.clone());
            cfg.encrypt = links == "encrypted";
            Port::open(cfg).unwrap()
        };
        let (a, b) = (open(Addr::new(1, 1), sa), open(Addr::new(2, 1), sb));
        a.add_route(b.addr(), b.listen_addr().unwrap());
        b.add_route(a.addr(), a.listen_addr().unwrap());
        let sizes = [0, 100, 64 << 10, (64 << 10) + 1, 1 << 20, (4 << 20) + 1];
        for (from, to) in [(&a, &b), (&b, &a)] {
            let recvs: Vec<_> = sizes.iter().map(|&n| to.irecv(Some(from.addr()), Some(3), n)).collect();
            let sends: Vec<_> = sizes.iter().enumerate().map(|(i, &n)| from.isend(to.addr(), 3, Bytes::from(body(n, i)))).collect();
            for (i, r) in recvs.into_iter().enumerate() {
                assert!(received(to, r) == body(sizes[i], i), "{sa:?} → {sb:?}, {links} links: message {i} of {} bytes differs", sizes[i]);
            }
            for s in sends {
                from.wait_timeout(s, WAIT).unwrap();
            }
        }
        for p in [&a, &b] {
            let st = p.stats();
            assert_eq!((st.frames_rejected, st.connections_lost), (0, 0), "{sa:?}/{sb:?}: {st:?}");
            let trusting = if (sa, sb, links == "encrypted") == (Headers, Headers, false) { st.connections_established } else { 0 };
            assert_eq!(st.connections_trusting_tcp, trusting, "{sa:?}/{sb:?}, {links} links: {st:?}");
        }
    }
}

/// A job process's port with `GEPSEA_TCP_CHECKSUMS=value` in its environment: whether
/// its `HelloAck` says it trusts TCP.
fn trusts_tcp_with_env(value: &str) -> bool {
    let ns = Ns(unique("pce"));
    let dir = TempDir::new();
    let mut cmd = Command::new(netpeer());
    cmd.args(["--ns", &ns.0, "--node", "1", "--port", "1", "--listen", "127.0.0.1:0", "--directory"])
        .arg(dir.path())
        .args(["echo", "--peer", "2:1", "--count", "1"])
        .env("GEPSEA_TCP_CHECKSUMS", value);
    let mut peer = Proc::spawn("echo", cmd);
    peer.expect_line("READY", WAIT);
    let at = std::fs::read_to_string(dir.0.join("1-1.addr")).unwrap().trim().parse().unwrap();
    let (_s, _dec, ack) = handshake_with(at, hello(Addr::new(1, 1), true));
    ack.flags & FLAG_TRUST_TCP != 0
}

#[test]
fn a_job_process_takes_the_setting_from_its_environment_and_refuses_a_bad_one() {
    assert!(trusts_tcp_with_env("headers"), "GEPSEA_TCP_CHECKSUMS=headers was not taken");
    assert!(!trusts_tcp_with_env("full"), "GEPSEA_TCP_CHECKSUMS=full trusts TCP");

    let ns = Ns(unique("pce"));
    let out = Command::new(netpeer())
        .args(["--ns", &ns.0, "--node", "1", "--port", "1", "--listen", "127.0.0.1:0", "echo", "--peer", "2:1", "--count", "1"])
        .env("GEPSEA_TCP_CHECKSUMS", "none")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "GEPSEA_TCP_CHECKSUMS=none was taken: {stderr}");
    assert!(stderr.contains("GEPSEA_TCP_CHECKSUMS=\"none\": neither `full` nor `headers`"), "{stderr}");
}

/// The sizes of the pieces a port sends the hand-driven peer, which said `hello`, for
/// a message of `len` bytes (the peer clears it to send).
fn pieces_sent(checksums: TcpChecksums, hello: Header, len: usize) -> Vec<usize> {
    let ns = Ns(unique("pcs"));
    let port = listening_port(&ns.0, checksums);
    let (mut s, mut dec, _) = handshake_with(port.listen_addr().unwrap(), hello);
    let _send = port.isend(ROGUE, 6, Bytes::from(body(len, 8)));
    let (rts, _) = read_until(&mut s, &mut dec, Kind::Rts);
    let mut cts = Header::new(Kind::Cts, Channel::Normal, ROGUE, port.addr());
    (cts.seq, cts.id) = (1, rts.id);
    s.write_all(&Frame::control(cts).to_bytes()).unwrap();
    let (mut sizes, mut got) = (Vec::new(), 0);
    while got < len {
        let (_, payload) = read_until(&mut s, &mut dec, Kind::Data);
        assert!(payload == body(len, 8)[got..got + payload.len()], "piece at {got} differs");
        got += payload.len();
        sizes.push(payload.len());
    }
    sizes
}

#[test]
fn pieces_on_a_trusting_link_are_as_large_as_both_ends_accept() {
    use TcpChecksums::{Full, Headers};
    let len = (1 << 20) + (200 << 10);
    let me = Addr::new(1, 1);
    // The port accepts frames of up to 1 MiB (the default); the peer says what it does.
    assert_eq!(pieces_sent(Headers, hello_accepting(me, 512 << 10), len), [512 << 10, 512 << 10, 200 << 10]);
    assert_eq!(pieces_sent(Headers, hello_accepting(me, 4 << 20), len), [1 << 20, 200 << 10]);
    // Otherwise pieces of `tcp_chunk`, as on any checksummed link.
    let quarter = 256 << 10;
    assert_eq!(pieces_sent(Headers, hello(me, false), len), [quarter, quarter, quarter, quarter, 200 << 10]);
    assert_eq!(pieces_sent(Full, hello_accepting(me, 4 << 20), len), [quarter, quarter, quarter, quarter, 200 << 10]);
}

/// Two ports that trust TCP, `a` reaching `b` through a relay that alters the byte at
/// `flip` of what `a` sends on its first connection.
fn trusting_through_relay(flip: Option<usize>) -> (Ns, Port, Port, Relay) {
    let ns = Ns(unique("pcr"));
    let open = |node: u32| {
        let mut cfg = PortConfig::new(&ns.0, Addr::new(node, 1));
        cfg.listen = Some("127.0.0.1:0".parse().unwrap());
        cfg.tcp_checksums = TcpChecksums::Headers;
        cfg.reconnect_timeout = Duration::from_secs(3);
        cfg.linger = Duration::from_millis(100);
        Port::open(cfg).unwrap()
    };
    let (a, b) = (open(1), open(2));
    let relay = Relay::altering(b.listen_addr().unwrap(), flip);
    a.add_route(b.addr(), relay.addr);
    (ns, a, b, relay)
}

#[test]
fn a_trusting_link_cut_twice_loses_nothing() {
    let (_ns, a, b, relay) = trusting_through_relay(None);
    let size = |i: usize| if i.is_multiple_of(3) { 1_300_000 } else { 3_000 };
    let sends: Vec<_> = (0..60)
        .map(|i| {
            let s = a.isend(b.addr(), 100 + i as u64, Bytes::from(body(size(i), i)));
            if i == 20 || i == 40 {
                relay.cut();
            }
            s
        })
        .collect();
    for i in 0..60 {
        let r = b.irecv(Some(a.addr()), Some(100 + i as u64), size(i));
        assert!(received(&b, r) == body(size(i), i), "message {i} lost or damaged: {:?}", b.stats());
    }
    for s in sends {
        a.wait_timeout(s, WAIT).unwrap();
    }
    let st = b.stats();
    assert!(st.connections_established >= 2, "the link was never cut: {st:?}");
    assert_eq!(st.connections_trusting_tcp, st.connections_established, "{st:?}");
}

#[test]
fn trusting_tcp_gives_up_payload_checks_and_keeps_header_checks() {
    // What the setting means: a byte altered in a data payload where TCP's checksum
    // cannot see it (here in a relay between two connections; on a real path, in a
    // router's or a host's memory) is delivered as altered...
    let data = body(1 << 20, 21);
    let (_ns, a, b, relay) = trusting_through_relay(Some(600_000));
    let s = a.isend(b.addr(), 7, Bytes::from(data.clone()));
    let got = received(&b, b.irecv(Some(a.addr()), Some(7), data.len()));
    a.wait_timeout(s, WAIT).unwrap();
    assert!(relay.first_record().len() > 600_000, "the altered byte went through the relay");
    let differing: Vec<usize> = (0..data.len()).filter(|&i| got[i] != data[i]).collect();
    assert_eq!(differing.len(), 1, "one altered byte, delivered as it came");
    assert_eq!(b.stats().frames_rejected, 0);

    // ...while one altered in a header (the announcement that follows the Hello) is
    // caught, the link renewed, and the message arrives intact.
    let (_ns, a, b, _relay) = trusting_through_relay(Some(HEADER_LEN + 20));
    let s = a.isend(b.addr(), 8, Bytes::from(data.clone()));
    assert!(received(&b, b.irecv(Some(a.addr()), Some(8), data.len())) == data, "{:?}", b.stats());
    a.wait_timeout(s, WAIT).unwrap();
    let st = b.stats();
    assert!(st.recent_errors.join("\n").contains("header checksum mismatch"), "{st:?}");
    assert!(st.connections_established >= 2, "the link was not renewed: {st:?}");
}
