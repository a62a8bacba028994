//! Unit tests of the TCP connection: framing, the write queue, full sockets, sums.

use super::*;
use crate::frame::Channel;

fn piece(seq: u64) -> Header {
    let mut h = Header::new(Kind::Data, Channel::Normal, Addr::new(1, 1), Addr::new(2, 1));
    h.seq = seq;
    h.flags = FLAG_SUM_AFTER;
    h
}

#[test]
fn held_pieces_leave_only_with_a_sum_that_matches_them_in_order() {
    let mut p = PendingSums::default();
    p.hold(piece(7), 0xaa, None).unwrap();
    p.hold(piece(8), 0xbb, Some(Bytes::from_static(b"copy"))).unwrap();
    assert_eq!(p.next_seq_after_held(), Some(9));
    // Out of step, damaged, or too many entries: refused, and nothing is taken.
    assert!(matches!(p.take_summed(&[(8, 0xbb)]), Err(FrameError::SumOutOfStep(_))));
    assert_eq!(p.take_summed(&[(7, 0xab)]).err(), Some(FrameError::PayloadCrc { expected: 0xab, actual: 0xaa }));
    assert!(matches!(p.take_summed(&[(7, 0xaa), (8, 0xbb), (9, 0)]), Err(FrameError::SumOutOfStep(_))));
    assert_eq!(p.held().count(), 2);
    // A sum may clear the oldest pieces only.
    let first = p.take_summed(&[(7, 0xaa)]).unwrap();
    assert_eq!(first.iter().map(|h| h.header.seq).collect::<Vec<_>>(), [7]);
    assert!(p.holds_pieces());
    let second = p.take_summed(&[(8, 0xbb)]).unwrap();
    assert_eq!(second[0].payload.as_deref(), Some(&b"copy"[..]));
    assert!(!p.holds_pieces() && p.next_seq_after_held().is_none());
    assert_eq!(p.held_copied, 0);
}

#[test]
fn a_peer_that_never_sends_sums_is_cut_off_at_a_bound() {
    let mut p = PendingSums::default();
    for seq in 1..=HELD_AT_MOST as u64 {
        p.hold(piece(seq), 0, None).unwrap();
    }
    assert!(matches!(p.hold(piece(HELD_AT_MOST as u64 + 1), 0, None), Err(FrameError::SumMissing { .. })));
    let mut p = PendingSums::default();
    let big = Bytes::from(vec![0u8; HELD_COPIES_AT_MOST]);
    p.hold(piece(1), 0, Some(big)).unwrap();
    assert!(matches!(p.hold(piece(2), 0, Some(Bytes::from_static(b"x"))), Err(FrameError::SumMissing { pieces: 2, .. })));
}

/// A connected pair on loopback: the writing end, non-blocking, as the port holds
/// it, and a blocking reader.
fn socket_pair() -> (mio::net::TcpStream, std::net::TcpStream) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (reader, _) = listener.accept().unwrap();
    client.set_nonblocking(true).unwrap();
    (mio::net::TcpStream::from_std(client), reader)
}

#[test]
fn a_full_socket_is_written_again_only_once_the_kernel_reports_room() {
    use std::io::Read;
    let (mut stream, mut reader) = socket_pair();
    let mut poll = mio::Poll::new().unwrap();
    poll.registry().register(&mut stream, mio::Token(1), mio::Interest::READABLE | mio::Interest::WRITABLE).unwrap();
    let mut events = mio::Events::with_capacity(8);
    // The edge of the socket's first room, reported at registration.
    poll.poll(&mut events, Some(std::time::Duration::from_millis(100))).unwrap();
    let mut c = TcpConn::new(stream, None, false, 64 << 20);
    // More than a socket takes with nobody reading.
    let h = Header::new(Kind::Eager, Channel::Normal, Addr::new(1, 1), Addr::new(2, 1));
    let payload = Bytes::from(vec![7u8; 1 << 20]);
    for _ in 0..64 {
        c.queue(&Frame { header: h, payload: payload.clone() });
    }
    let total = c.queued();
    c.write_out().unwrap();
    let left = c.queued();
    assert!(c.is_full() && left > 0 && left < total, "{left} of {total} bytes left");

    // The reader frees some room: nothing is written into it until the kernel says
    // there is enough.
    let mut buf = vec![0u8; 256 << 10];
    reader.read_exact(&mut buf).unwrap();
    c.write_out().unwrap();
    assert_eq!(c.queued(), left, "a socket known to be full was written");

    // The kernel reports room (a writable edge) before the reader has taken everything.
    let mut taken = buf.len();
    let writable = loop {
        poll.poll(&mut events, Some(std::time::Duration::ZERO)).unwrap();
        if events.iter().any(|e| e.token() == mio::Token(1) && e.is_writable()) {
            break true;
        }
        if taken >= total - left {
            break false;
        }
        reader.read_exact(&mut buf).unwrap();
        taken += buf.len();
    };
    assert!(writable, "no writable edge after the reader took all {taken} bytes written");
    c.room_reported();
    assert!(!c.is_full());
    c.write_out().unwrap();
    assert!(c.queued() < left, "room reported, yet nothing written");
}

/// A frame as the receiver's decoder sees it: kind, sequence number, and the sums a
/// sum frame carries.
type Seen = (Kind, u64, Vec<(u64, u32)>);

fn frames_read(reader: &mut std::net::TcpStream, mut want: usize) -> Vec<Seen> {
    use std::io::Read;
    let mut dec = FrameDecoder::new(1 << 20);
    let mut out = Vec::new();
    while want > 0 {
        let n = reader.read(dec.spare()).unwrap();
        assert!(n > 0, "connection closed");
        dec.filled(n);
        while let Some((h, payload)) = dec.next_frame().unwrap() {
            let sums = if h.kind == Kind::Sum { crate::frame::decode_sums(payload).unwrap() } else { Vec::new() };
            out.push((h.kind, h.seq, sums));
            want -= 1;
        }
    }
    out
}

#[test]
fn a_sum_left_by_a_write_goes_ahead_of_the_next_piece_or_with_the_final_write() {
    let (stream, mut reader) = socket_pair();
    let mut c = TcpConn::new(stream, None, false, 1 << 20);
    let body = Bytes::from(vec![9u8; SUM_AFTER_MIN]);
    let crc = crate::frame::crc32c(&body);
    let piece = |seq: u64| {
        let mut h = Header::new(Kind::Data, Channel::Normal, Addr::new(1, 1), Addr::new(2, 1));
        h.seq = seq;
        h.total = 2 * SUM_AFTER_MIN as u64;
        Frame { header: h, payload: body.clone() }
    };
    c.queue(&piece(1));
    c.queue(&piece(2));
    c.write_out_leaving_sum().unwrap();
    assert_eq!(c.queued(), 0, "the pieces are written");
    // Their sum goes ahead of the next piece, in its write...
    c.queue(&piece(3));
    assert_eq!(c.queued(), 2 * HEADER_LEN + 2 * crate::frame::SUM_ENTRY_LEN + SUM_AFTER_MIN);
    c.write_out_leaving_sum().unwrap();
    // ...and the last one with the write that ends the caller's turn.
    c.write_out().unwrap();
    assert_eq!(c.queued(), 0);
    let seen = frames_read(&mut reader, 5);
    let expected = vec![
        (Kind::Data, 1, vec![]),
        (Kind::Data, 2, vec![]),
        (Kind::Sum, 0, vec![(1, crc), (2, crc)]),
        (Kind::Data, 3, vec![]),
        (Kind::Sum, 0, vec![(3, crc)]),
    ];
    assert_eq!(seen, expected);
}

#[test]
fn buffers_are_set_only_within_the_systems_limits() {
    assert!(buffers_allowed(4 << 20, Some(4 << 20)));
    assert!(buffers_allowed(1, Some(4 << 20)));
    assert!(!buffers_allowed((4 << 20) + 1, Some(4 << 20)), "the kernel would lock a cut-down buffer");
    assert!(!buffers_allowed(1, None), "limits unknown: left to the kernel");
}

#[test]
fn set_buffers_gives_each_direction_twice_the_size() {
    use nix::sys::socket::{getsockopt, sockopt};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let limit = buffer_limit().expect("reading net.core.rmem_max and wmem_max");
    let wanted = (384 << 10).min(limit);
    set_buffers(&client, wanted).unwrap();
    assert_eq!(getsockopt(&client, sockopt::SndBuf).unwrap(), 2 * wanted);
    assert_eq!(getsockopt(&client, sockopt::RcvBuf).unwrap(), 2 * wanted);
}

#[test]
fn a_buffer_setting_is_a_number_of_bytes_or_auto() {
    assert_eq!("4194304".parse(), Ok(BufferSetting(Some(4 << 20))));
    assert_eq!(" auto ".parse(), Ok(BufferSetting(None)));
    assert_eq!("0".parse::<BufferSetting>(), Err(BufferSettingError::Zero));
    assert_eq!("4MiB".parse(), Ok(BufferSetting(Some(4 << 20))));
    assert_eq!("8 MB".parse(), Ok(BufferSetting(Some(8_000_000))));
    assert_eq!("4M".parse::<BufferSetting>().unwrap_err().to_string(), "4M is ambiguous: 4MiB (4194304 bytes) or 4MB (4000000)?");
    assert_eq!("lots".parse::<BufferSetting>(), Err(BufferSettingError::NotASize));
    assert_eq!(BufferSettingError::NotASize.to_string(), "neither a size in bytes (4194304, 4MiB, 4MB) nor `auto`");
}
