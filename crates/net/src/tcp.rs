//! TCP connections: framed, vectored writes, non-blocking reads into a frame decoder,
//! and the per-peer [`Link`] that survives a connection being replaced.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};

use crate::frame::{Addr, Channel, Frame, FrameDecoder, FrameError, Header, Kind, FLAG_PAYLOAD_CRC, FLAG_SUM_AFTER, HEADER_LEN};
use crate::reliable::{RecvWindow, SendWindow};

/// The most one read into the decoder takes.
const READ_AT_MOST: usize = 64 << 10;
/// Plaintext an encrypted connection seals at a time (see `TcpConn::seal_some`). 1 MiB
/// encrypted ping-pong on loopback, µs one way (3 alternated rounds): all at once
/// 2092-2424, 64 KiB at a time 873-990, 128 KiB 749-930.
const SEAL_AHEAD: usize = 128 << 10;

/// The least message whose rendezvous pieces carry their checksums after them, in a
/// [`Kind::Sum`] frame, rather than in their headers ([`FLAG_SUM_AFTER`]). A header's
/// CRC must be computed before the first byte of its piece can be written, so a 1 MiB
/// message waited ≈25 µs for its four pieces' checksums before anything moved; sent
/// first and checksummed while the kernel and the receiver copy, they cost nothing on
/// that path. The sum is one more `sendmsg`, and for a small message one more wake-up
/// of a receiver that has already drained the piece: a stream of 64 KiB messages went
/// from 2.1–3.2 to 1.0–1.4 GB/s on loopback with sums after every piece, while 128 and
/// 256 KiB messages were no slower. Hence whole messages from 256 KiB.
pub const SUM_AFTER_MIN: usize = 256 << 10;

/// The most a read that ends a piece received in place takes beyond it: the next
/// frame's header and, when that frame is the pieces' sum frame, its payload (12 bytes
/// per piece), so that the system call that ends a message's last piece also brings
/// its sum. With the header alone, a 1 MiB message's receiver read its sum in two
/// more calls, ≈4 µs at the very end of the transfer (a timestamped trace). When the
/// next frame is another piece, the few bytes of its payload read with its header go
/// through the decoder (at most 168; the rest lands in place as before).
const PIECE_TAIL: usize = 256;

/// Pieces received ahead of their sum that a connection may hold; one more is a
/// protocol error (a peer that never sends the sum must not grow memory without end).
const HELD_AT_MOST: usize = 1024;
/// Payload bytes a connection may hold in copies (pieces that came through the decoder
/// rather than straight into their buffer) while their sum is due.
const HELD_COPIES_AT_MOST: usize = 64 << 20;

/// Makes the kernel notice a peer that went silent without closing its end (a host
/// powered off, a cable pulled, a partition): a keepalive probe once the connection has
/// been idle for `silence` (whole seconds, at least 1), again every third of it, and
/// `TCP_USER_TIMEOUT` of `silence`, which bounds both how long our data may stay
/// unacknowledged and how long probes may go unanswered (it overrides the probe count).
/// The connection then fails with `ETIMEDOUT` like any other broken connection, about
/// 1⅓ × `silence` after the peer fell silent. The probes and their answers are the
/// kernel's own and wake no process; each still costs the kernel a packet each way, so
/// a healthy idle connection is probed once per `silence`, not more often (36 idle
/// agents on loopback: 1.8–2.7 % of a core for the whole machine, of which the agents'
/// processes 1.5–2.3 %).
pub fn watch_for_silence(stream: &mio::net::TcpStream, silence: Duration) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    let secs = |d: Duration| u32::try_from(d.as_secs().max(1)).unwrap_or(u32::MAX);
    let ms = u32::try_from(silence.as_millis().max(1)).unwrap_or(u32::MAX);
    setsockopt(stream, sockopt::KeepAlive, &true)?;
    setsockopt(stream, sockopt::TcpKeepIdle, &secs(silence))?;
    setsockopt(stream, sockopt::TcpKeepInterval, &secs(silence / 3))?;
    setsockopt(stream, sockopt::TcpKeepCount, &3)?;
    setsockopt(stream, sockopt::TcpUserTimeout, &ms)?;
    Ok(())
}

/// This network namespace's TCP setting `name` (`/proc/sys/net/ipv4/<name>`, e.g.
/// `tcp_congestion_control`), trimmed.
pub fn ipv4_setting(name: &str) -> io::Result<String> {
    Ok(std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))?.trim().to_string())
}

/// Runs the connection of `socket` under congestion control `name` (`TCP_CONGESTION`).
pub fn set_congestion(socket: &impl std::os::fd::AsFd, name: &str) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    setsockopt(socket, sockopt::TcpCongestion, &std::ffi::OsString::from(name))?;
    Ok(())
}

/// The largest socket buffers this process may ask for: the smaller of the system's
/// `net.core.rmem_max` and `net.core.wmem_max` (in this network namespace); `None`
/// where they cannot be read.
pub fn buffer_limit() -> Option<usize> {
    let read = |name: &str| std::fs::read_to_string(format!("/proc/sys/net/core/{name}")).ok()?.trim().parse::<usize>().ok();
    Some(read("rmem_max")?.min(read("wmem_max")?))
}

/// Whether buffers of `bytes` may be set under `limit` ([`buffer_limit`]): the kernel
/// would cut a larger request down to the limit and still turn its own sizing off,
/// which grows a busy connection's buffers well past a low limit.
pub fn buffers_allowed(bytes: usize, limit: Option<usize>) -> bool {
    limit.is_some_and(|l| bytes <= l)
}

pub use crate::error::{BufferSettingError, ByteSizeError};

mod checksums;
pub use checksums::{checksums_from_env, default_checksums, ChecksumsSettingError, TcpChecksums};

/// A socket buffer setting as a user writes it (`GEPSEA_TCP_BUFFER`, `--tcp-buffer`): a
/// size in bytes ([`crate::parse_byte_size`]), or `auto` for the kernel's own sizing;
/// parsed, the [`PortConfig::tcp_buffer`](crate::PortConfig::tcp_buffer) it stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferSetting(pub Option<usize>);

impl std::str::FromStr for BufferSetting {
    type Err = BufferSettingError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "auto" => Ok(BufferSetting(None)),
            n => match crate::parse_byte_size(n) {
                Ok(0) => Err(BufferSettingError::Zero),
                Ok(n) => usize::try_from(n).map(|n| BufferSetting(Some(n))).map_err(|_| BufferSettingError::NotASize),
                Err(ByteSizeError::NotASize) => Err(BufferSettingError::NotASize),
                Err(e) => Err(e.into()),
            },
        }
    }
}

/// `GEPSEA_TCP_BUFFER`, when set (and not empty): the setting, or what is wrong with it.
pub fn buffer_setting_from_env() -> Option<Result<BufferSetting, crate::NetError>> {
    let value = std::env::var("GEPSEA_TCP_BUFFER").ok().filter(|v| !v.trim().is_empty())?;
    Some(value.parse().map_err(|problem| crate::NetError::BadTcpBuffer { value, problem }))
}

/// The socket buffers a port gets unless told otherwise: `GEPSEA_TCP_BUFFER` when it
/// is set and valid (a bad value is refused when a port opens), else
/// [`DEFAULT_TCP_BUFFER`](crate::DEFAULT_TCP_BUFFER).
pub fn default_buffer() -> Option<usize> {
    match buffer_setting_from_env() {
        Some(Ok(BufferSetting(setting))) => setting,
        _ => Some(crate::DEFAULT_TCP_BUFFER),
    }
}

/// Gives the connection of `socket` kernel buffers of `bytes` each way (`SO_SNDBUF`,
/// `SO_RCVBUF`; the kernel doubles the value for its bookkeeping), which turns the
/// kernel's own sizing off for this socket.
pub fn set_buffers(socket: &impl std::os::fd::AsFd, bytes: usize) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    setsockopt(socket, sockopt::SndBuf, &bytes)?;
    setsockopt(socket, sockopt::RcvBuf, &bytes)?;
    Ok(())
}

/// Whether this process may run TCP connections under congestion control `name`: set
/// on a fresh socket, so that a port refuses a bad name when it opens, with the
/// kernel's lists, rather than log it at every connection.
pub fn check_congestion(name: &str) -> Result<(), crate::NetError> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    let problem = match socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None) {
        Ok(s) => match set_congestion(&s, name) {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => "the kernel has no such algorithm".to_string(),
            Err(e) if e.raw_os_error() == Some(nix::libc::EPERM) => "this process may not choose it".to_string(),
            Err(e) => e.to_string(),
        },
        Err(e) => format!("no socket to try it on ({e})"),
    };
    let list = |setting: &str| ipv4_setting(setting).unwrap_or_else(|e| format!("unknown ({e})"));
    let problem = format!(
        "{problem} (this kernel has: {}; a process without CAP_NET_ADMIN may choose: {})",
        list("tcp_available_congestion_control"),
        list("tcp_allowed_congestion_control")
    );
    Err(crate::NetError::Congestion { name: name.to_string(), problem })
}

/// Refuses application data that comes without a payload checksum on a connection
/// that checksums payloads ([`TcpConn::checks_payloads`]): a port that keeps its
/// checksums gets them from every peer.
pub fn check_payload_sum(checks_payloads: bool, h: &Header) -> Result<(), FrameError> {
    if checks_payloads && h.kind.carries_data() && h.len > 0 && h.flags & (FLAG_PAYLOAD_CRC | FLAG_SUM_AFTER) == 0 {
        return Err(FrameError::PayloadUnchecked(h.kind));
    }
    Ok(())
}

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// We connected; the TCP handshake may still be running. `Hello` is queued.
    Connecting,
    /// We sent `Hello` and wait for `HelloAck`.
    HelloSent,
    /// Accepted; waiting for the peer's `Hello`.
    Accepted,
    /// Accepted, `HelloAck` with our proof sent; waiting for the peer's `Auth`.
    AuthWait,
    /// Handshake done: sequenced frames may flow.
    Established,
}

/// What a read pass found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// The socket has nothing more now.
    Drained,
    /// Stopped early with data possibly left in the socket: read again after decoding.
    More,
    /// The peer closed the connection.
    Eof,
}

/// One TCP connection.
pub struct TcpConn {
    pub stream: mio::net::TcpStream,
    pub peer: Option<Addr>,
    pub initiator: bool,
    pub state: ConnState,
    pub dec: FrameDecoder,
    /// Authentication (keyed links): our nonce, the peer's, and the `Hello` that waits
    /// for the peer's proof before it takes effect.
    pub nonce_mine: Option<[u8; crate::auth::NONCE_LEN]>,
    pub nonce_theirs: Option<[u8; crate::auth::NONCE_LEN]>,
    pub pending_hello: Option<crate::frame::Header>,
    wq: VecDeque<Bytes>,
    wq_bytes: usize,
    /// Link encryption (`crate::seal`): frames go through it as plaintext.
    sealer: Option<crate::seal::Sealer>,
    /// The read buffer of an encrypted connection, kept between reads.
    sealed_in: Vec<u8>,
    /// The records of an encrypted connection are sealed here, then queued.
    sealed_out: BytesMut,
    /// Pieces queued with their checksum to follow ([`FLAG_SUM_AFTER`]), not yet
    /// summed: sequence number and payload.
    unsummed: Vec<(u64, Bytes)>,
    /// Where the sum of `unsummed` goes (its pieces' source and destination ports).
    unsummed_route: (Addr, Addr),
    /// Received pieces waiting for their sum.
    pub pending: PendingSums,
    /// Application data carries payload checksums both ways: false once both ends said
    /// they trust TCP's own ([`TcpChecksums::Headers`], [`TcpConn::trust_tcp`]).
    payload_sums: bool,
    /// The data frame whose payload is being read straight into its message's buffer.
    direct: Option<DirectRead>,
    /// Such a frame just ended.
    after_direct: bool,
    /// The socket took less than it was offered: it is full until the kernel reports
    /// room again ([`TcpConn::room_reported`]). Writing into a full socket whenever a
    /// few hundred bytes of it were freed, as a spinning waiter's every pass did,
    /// split a stream into writes of ≈400 bytes: the first 16 MiB of a fresh
    /// connection's 1 MiB stream went out as 14 writes of 490 KiB and then 2,935 of
    /// 424 B, a system call each.
    full: bool,
}

/// A piece received with [`FLAG_SUM_AFTER`], undelivered until its sum has matched.
pub struct Held {
    pub header: Header,
    /// The CRC32C of the payload as it arrived.
    crc: u32,
    /// The payload, when it came through the decoder; `None` when it was read straight
    /// into its message's buffer, where it already is.
    pub payload: Option<Bytes>,
}

/// What the end of a piece read in place means.
pub enum Finished {
    /// Its checksum matched: deliver it.
    Deliver(Header),
    /// Its checksum follows in a sum frame: it is held ([`PendingSums::take_summed`]).
    Held,
}

/// A rendezvous data frame received outside the decoder: its header, where its payload
/// ends in the message buffer, and the checksum of what has arrived so far (computed
/// piece by piece as it lands, while the bytes are still in the cache).
struct DirectRead {
    header: Header,
    end: usize,
    crc: u32,
    /// The payload has a checksum to check (in its header, or to follow): not so on a
    /// connection whose ends trust TCP ([`TcpConn::trust_tcp`]).
    summed: bool,
}

impl TcpConn {
    /// Wraps a connected or connecting stream.
    pub fn new(stream: mio::net::TcpStream, peer: Option<Addr>, initiator: bool, max_payload: usize) -> Self {
        let _ = stream.set_nodelay(true);
        TcpConn {
            stream,
            peer,
            initiator,
            state: if initiator { ConnState::Connecting } else { ConnState::Accepted },
            dec: FrameDecoder::new(max_payload),
            nonce_mine: None,
            nonce_theirs: None,
            pending_hello: None,
            wq: VecDeque::new(),
            wq_bytes: 0,
            sealer: None,
            sealed_in: Vec::new(),
            sealed_out: BytesMut::new(),
            unsummed: Vec::new(),
            unsummed_route: (Addr::default(), Addr::default()),
            pending: PendingSums::default(),
            payload_sums: true,
            direct: None,
            after_direct: false,
            full: false,
        }
    }

    /// Encrypts this connection with a session keyed by `key` (see `crate::seal`); call
    /// right after [`TcpConn::new`], before anything is queued.
    pub fn encrypt(&mut self, key: &crate::auth::Key) {
        let mut first = Vec::new();
        self.sealer = Some(crate::seal::Sealer::new(key, self.initiator, &mut first));
        self.push_raw(first);
    }

    fn push_raw(&mut self, bytes: Vec<u8>) {
        if !bytes.is_empty() {
            self.wq_bytes += bytes.len();
            self.wq.push_back(Bytes::from(bytes));
        }
    }

    /// Encodes `f` and appends it to the write queue: with its payload CRC in its
    /// header, or, for a piece of a large rendezvous message on a plain connection, with
    /// the CRC to follow in a sum frame ([`FLAG_SUM_AFTER`]; see [`TcpConn::write_out`]);
    /// on an encrypted connection without one (the seal's tags check every byte), and
    /// so is application data on a connection whose ends trust TCP ([`TcpConn::trust_tcp`]).
    ///
    /// A data piece whose header already carries its checksum (`FLAG_PAYLOAD_CRC`,
    /// computed while its CTS was awaited: `Proto::sum_ahead`) goes with it as it is.
    pub fn queue(&mut self, f: &Frame) {
        let mut h = vec![0u8; HEADER_LEN];
        if self.sealer.is_none() && !self.payload_sums && f.header.kind.carries_data() {
            self.queue_sum();
            f.header.encode_without_payload_crc(f.payload.len(), &mut h);
            self.push_encoded(h, &f.payload);
            return;
        }
        let summed = f.header.kind == Kind::Data && f.header.flags & FLAG_PAYLOAD_CRC != 0;
        if self.sealer.is_none() && summed {
            debug_assert_eq!(f.header.crc, crate::frame::crc32c(&f.payload), "a checksum computed ahead is the payload's");
            self.queue_sum();
            f.header.encode_summed(f.payload.len(), &mut h);
            self.push_encoded(h, &f.payload);
            return;
        }
        if self.sealer.is_none() && f.header.kind == Kind::Data && f.header.total >= SUM_AFTER_MIN as u64 && !f.payload.is_empty() {
            if self.wq.is_empty() {
                // The pieces of the pending sum have all left (a write that left their
                // sum to come with what follows: `write_out_leaving_sum`).
                self.queue_sum();
            }
            f.header.encode_sum_after(f.payload.len(), &mut h);
            self.unsummed.push((f.header.seq, f.payload.clone()));
            self.unsummed_route = (f.header.src, f.header.dst);
            self.push_encoded(h, &f.payload);
            return;
        }
        // Nothing may come between pieces and their sum.
        self.queue_sum();
        if let Some(s) = &mut self.sealer {
            // The records' tags are the payload's checksum here: a CRC as well was two
            // more passes over every byte (sender and receiver), on the critical path
            // of both (`Header::encode_without_payload_crc`).
            f.header.encode_without_payload_crc(f.payload.len(), &mut h);
            s.push_plain(&h);
            s.push_plain_bytes(&f.payload);
            return;
        }
        f.header.encode(&f.payload, &mut h);
        self.push_encoded(h, &f.payload);
    }

    /// Appends an encoded header and its payload to the write queue (plain connections).
    fn push_encoded(&mut self, head: Vec<u8>, payload: &Bytes) {
        self.wq_bytes += HEADER_LEN + payload.len();
        self.wq.push_back(Bytes::from(head));
        if !payload.is_empty() {
            self.wq.push_back(payload.clone());
        }
    }

    /// Both ends of this connection trust TCP's own checksums for application data
    /// (each said so in its handshake frame): from now on such payloads go without a
    /// CRC, and come without one. Call before anything but the handshake is queued.
    pub fn trust_tcp(&mut self) {
        self.payload_sums = false;
    }

    /// Whether application data on this connection carries payload checksums.
    pub fn checks_payloads(&self) -> bool {
        self.payload_sums && self.sealer.is_none()
    }

    /// Bytes queued and not yet accepted by the kernel.
    pub fn queued(&self) -> usize {
        self.wq_bytes + self.sealer.as_ref().map_or(0, |s| s.pending())
    }

    /// Queues the sum frame of the pieces queued since the last one, if any: their
    /// checksums are computed now, after the pieces went to the kernel (or at least
    /// into the queue ahead of the sum).
    fn queue_sum(&mut self) {
        if self.unsummed.is_empty() {
            return;
        }
        let (src, dst) = self.unsummed_route;
        let sums: Vec<(u64, u32)> = self.unsummed.drain(..).map(|(seq, p)| (seq, crate::frame::crc32c(&p))).collect();
        let mut h = Header::new(Kind::Sum, Channel::Control, src, dst);
        h.total = sums.len() as u64;
        let payload = Bytes::from(crate::frame::encode_sums(&sums));
        let mut head = vec![0u8; HEADER_LEN];
        h.encode(&payload, &mut head);
        self.push_encoded(head, &payload);
    }

    /// Discards unsent bytes (the connection is being abandoned; the link replays).
    pub fn clear_queue(&mut self) {
        self.wq.clear();
        self.wq_bytes = 0;
        self.unsummed.clear();
        if let Some(s) = &mut self.sealer {
            s.clear();
        }
    }

    /// The kernel reported room in the socket (a writable edge): writes may go on.
    pub fn room_reported(&mut self) {
        self.full = false;
    }

    /// Whether the socket is full: nothing is written until [`TcpConn::room_reported`].
    pub fn is_full(&self) -> bool {
        self.full
    }

    /// Writes as much of the queue as the socket takes. `Ok(())` also when it would
    /// block, and without a system call while the socket is known to be full: a
    /// non-blocking TCP write that stopped short (or would block) has marked the socket
    /// as waiting for room, and the kernel reports the room (an `EPOLLOUT` edge) once
    /// half of what is queued has gone, so the next write carries that much.
    pub fn write_out(&mut self) -> io::Result<()> {
        self.write_queue(true)
    }

    /// [`TcpConn::write_out`] for a caller about to queue more frames: a sum whose
    /// pieces have all been written is left to go in the same write as those frames
    /// (it is queued ahead of them, [`TcpConn::queue`]) rather than in one of its own.
    /// A stream of 1 MiB messages wrote each message's 136-byte sum by itself: a second
    /// system call per message, and on loopback a second pass through the receiving
    /// socket's input path. The caller must call `write_out` once it has queued what
    /// it had, or the sum would wait.
    pub fn write_out_leaving_sum(&mut self) -> io::Result<()> {
        self.write_queue(false)
    }

    fn write_queue(&mut self, sum_now: bool) -> io::Result<()> {
        if self.state == ConnState::Connecting || self.full {
            return Ok(());
        }
        loop {
            if self.wq.is_empty() && self.seal_some() {
                continue;
            }
            if self.wq.is_empty() {
                // The pieces are with the kernel: checksum them while the receiver
                // copies them out, and send the sum after them.
                if self.unsummed.is_empty() || !sum_now {
                    break;
                }
                self.queue_sum();
            }
            let slices: Vec<IoSlice<'_>> = self.wq.iter().take(64).map(|b| IoSlice::new(b)).collect();
            let offered: usize = slices.iter().map(|s| s.len()).sum();
            match self.stream.write_vectored(&slices) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "connection wrote zero bytes")),
                Ok(mut n) => {
                    if n < offered {
                        self.full = true;
                    }
                    self.wq_bytes -= n;
                    while n > 0 {
                        let front = self.wq.front_mut().unwrap();
                        if n >= front.len() {
                            n -= front.len();
                            self.wq.pop_front();
                        } else {
                            front.advance(n);
                            n = 0;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.full = true;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            if self.full {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Seals the next [`SEAL_AHEAD`] bytes of an encrypted connection's plaintext into
    /// the write queue; whether there were any. A batch at a time, each sealed once
    /// the last is with the kernel: the receiver opens one batch while the next is
    /// sealed (sealing a whole megabyte before writing any of it put both ends'
    /// encryption end to end). Sealed into a kept buffer: once the batch before has
    /// left the queue, its memory takes the next (a fresh megabyte per message cost
    /// its page faults, and a copy more than the encryption).
    fn seal_some(&mut self) -> bool {
        let Some(s) = &mut self.sealer else { return false };
        if s.pending() == 0 {
            return false;
        }
        s.seal_into(&mut self.sealed_out, SEAL_AHEAD);
        if self.sealed_out.is_empty() {
            return false;
        }
        let records = self.sealed_out.split().freeze();
        self.wq_bytes += records.len();
        self.wq.push_back(records);
        true
    }

    /// Reads what the socket has into the decoder.
    pub fn read_in(&mut self) -> io::Result<ReadOutcome> {
        if self.sealer.is_some() {
            return self.read_in_sealed();
        }
        loop {
            // A bounded read, after which the caller decodes what came (the socket is
            // edge-triggered, so it must come back for the rest): a complete frame is
            // checked and delivered while the next one arrives, and a rendezvous
            // piece whose header arrives with most of its payload still to come is
            // read in place (see `TcpConn::start_direct`), not through the decoder.
            // Right after such a piece, only the next header is read: it is likely
            // the next piece's.
            let buffered = self.dec.buffered();
            let spare = self.dec.spare();
            let mut n = spare.len().min(READ_AT_MOST);
            if self.after_direct && buffered < PIECE_TAIL {
                n = n.min(PIECE_TAIL - buffered);
            }
            match self.stream.read(&mut spare[..n]) {
                Ok(0) => return Ok(ReadOutcome::Eof),
                Ok(n) => {
                    self.after_direct = false;
                    self.dec.filled(n);
                    return Ok(ReadOutcome::More);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(ReadOutcome::Drained),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// [`TcpConn::read_in`] of an encrypted connection: records are opened into the
    /// decoder; a handshake answer is written at once.
    fn read_in_sealed(&mut self) -> io::Result<ReadOutcome> {
        let mut raw = std::mem::take(&mut self.sealed_in);
        raw.resize(256 << 10, 0);
        let mut answer = Vec::new();
        let outcome = loop {
            let n = match self.stream.read(&mut raw) {
                Ok(0) => break ReadOutcome::Eof,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break ReadOutcome::Drained,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let (sealer, dec) = (self.sealer.as_mut().expect("sealed connection"), &mut self.dec);
            let mut to_decoder = |mut plain: &[u8]| {
                while !plain.is_empty() {
                    let spare = dec.spare();
                    let k = spare.len().min(plain.len());
                    spare[..k].copy_from_slice(&plain[..k]);
                    dec.filled(k);
                    plain = &plain[k..];
                }
            };
            if let Err(e) = sealer.open(&raw[..n], &mut to_decoder, &mut answer) {
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
            if self.dec.buffered() >= 4 << 20 {
                break ReadOutcome::More;
            }
        };
        self.sealed_in = raw;
        if !answer.is_empty() {
            self.push_raw(answer);
            self.write_out()?;
        }
        Ok(outcome)
    }

    /// Whether frames could be received outside the decoder: the connection is
    /// established, plain (records of an encrypted one must be opened first), and not
    /// already in such a frame.
    pub fn can_read_direct(&self) -> bool {
        self.state == ConnState::Established && self.sealer.is_none() && self.direct.is_none()
    }

    /// Starts receiving the decoder's partial data frame `header` (see
    /// [`FrameDecoder::partial_header`]) straight into `dest`, its message's buffer,
    /// which must hold exactly the bytes before the frame's offset and have room for
    /// its payload. The bytes already buffered move over now.
    pub fn start_direct(&mut self, header: Header, dest: &mut Vec<u8>) {
        debug_assert_eq!(dest.len() as u64, header.offset);
        let end = header.offset as usize + header.len as usize;
        debug_assert!(dest.capacity() >= end);
        let buffered = self.dec.take_partial();
        let summed = header.flags & (FLAG_PAYLOAD_CRC | FLAG_SUM_AFTER) != 0;
        let crc = if summed { crate::crc::append(0, buffered) } else { 0 };
        dest.extend_from_slice(buffered);
        self.direct = Some(DirectRead { header, end, crc, summed });
    }

    /// The header of the frame being received outside the decoder, if any.
    pub fn direct_header(&self) -> Option<&Header> {
        self.direct.as_ref().map(|d| &d.header)
    }

    /// Reads more of the direct frame's payload into `dest`, and at most one header
    /// beyond it into the decoder (so that one system call ends a piece and announces
    /// the next). `More` when bytes came; then see [`TcpConn::finish_direct`].
    pub fn read_direct(&mut self, dest: &mut Vec<u8>) -> io::Result<ReadOutcome> {
        use std::os::fd::AsRawFd;
        let Some(d) = &mut self.direct else { return Ok(ReadOutcome::More) };
        let want = d.end - dest.len();
        let before = dest.len();
        let tail = self.dec.spare();
        let tail_len = tail.len().min(PIECE_TAIL);
        loop {
            match crate::uio::readv_spare(self.stream.as_raw_fd(), dest, want, &mut tail[..tail_len]) {
                Ok(0) => return Ok(ReadOutcome::Eof),
                Ok(n) => {
                    if d.summed {
                        d.crc = crate::crc::append(d.crc, &dest[before..]);
                    }
                    self.dec.filled(n - (dest.len() - before));
                    return Ok(ReadOutcome::More);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(ReadOutcome::Drained),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Ends the direct frame once its whole payload is in `dest`: to deliver when its
    /// checksum matches, held when its checksum is to follow ([`FLAG_SUM_AFTER`]), or the
    /// mismatch (with `dest` cut back to the frame's offset, as if it never arrived).
    /// `None` while bytes are missing.
    pub fn finish_direct(&mut self, dest: &mut Vec<u8>) -> Option<Result<Finished, FrameError>> {
        if self.direct.as_ref()?.end != dest.len() {
            return None;
        }
        let d = self.direct.take().expect("checked above");
        self.after_direct = true;
        let actual = d.crc;
        if d.header.flags & FLAG_SUM_AFTER != 0 {
            return Some(self.pending.hold(d.header, actual, None).map(|()| Finished::Held));
        }
        if d.header.flags & FLAG_PAYLOAD_CRC != 0 && actual != d.header.crc {
            dest.truncate(d.header.offset as usize);
            return Some(Err(FrameError::PayloadCrc { expected: d.header.crc, actual }));
        }
        Some(Ok(Finished::Deliver(d.header)))
    }

    /// Completes a non-blocking connect. `Ok(true)` once connected.
    pub fn finish_connect(&mut self) -> io::Result<bool> {
        if let Some(e) = self.stream.take_error()? {
            return Err(e);
        }
        match self.stream.peer_addr() {
            Ok(_) => {
                self.state = ConnState::HelloSent;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Received pieces whose checksums are to follow ([`FLAG_SUM_AFTER`]), in arrival order,
/// undelivered and unacknowledged until their sum has matched.
#[derive(Default)]
pub struct PendingSums {
    held: VecDeque<Held>,
    /// Payload bytes of `held` that are copies.
    held_copied: usize,
}

impl PendingSums {
    /// Holds piece `header`, whose payload arrived with CRC32C `crc` (`payload`: a copy,
    /// when it is not already in its message's buffer), until its sum comes.
    pub fn hold(&mut self, header: Header, crc: u32, payload: Option<Bytes>) -> Result<(), FrameError> {
        let copied = self.held_copied + payload.as_ref().map_or(0, |p| p.len());
        if self.held.len() >= HELD_AT_MOST || copied > HELD_COPIES_AT_MOST {
            return Err(FrameError::SumMissing { pieces: self.held.len() + 1, bytes: copied });
        }
        self.held_copied = copied;
        self.held.push_back(Held { header, crc, payload });
        Ok(())
    }

    /// Whether pieces wait for their sum (then the next frame must be a sum or another
    /// such piece).
    pub fn holds_pieces(&self) -> bool {
        !self.held.is_empty()
    }

    /// The sequence number after the last held piece: the one the next piece must carry
    /// (the link's window has not seen the held ones yet).
    pub fn next_seq_after_held(&self) -> Option<u64> {
        self.held.back().map(|h| h.header.seq + 1)
    }

    /// The pieces still held (for a connection given up: those read in place must be
    /// cut from their buffers).
    pub fn held(&self) -> impl Iterator<Item = &Held> {
        self.held.iter()
    }

    /// Checks a sum frame's entries against the oldest held pieces and, when every one
    /// matches, hands those pieces over for delivery, in order. On a mismatch nothing is
    /// taken: the connection is to be dropped, and its held pieces with it.
    pub fn take_summed(&mut self, sums: &[(u64, u32)]) -> Result<Vec<Held>, FrameError> {
        if sums.len() > self.held.len() {
            return Err(FrameError::SumOutOfStep(format!("{} checksums for {} pieces", sums.len(), self.held.len())));
        }
        for (&(seq, crc), h) in sums.iter().zip(&self.held) {
            if seq != h.header.seq {
                return Err(FrameError::SumOutOfStep(format!("checksum for piece {seq} where piece {} came", h.header.seq)));
            }
            if crc != h.crc {
                return Err(FrameError::PayloadCrc { expected: crc, actual: h.crc });
            }
        }
        let taken: Vec<Held> = self.held.drain(..sums.len()).collect();
        self.held_copied -= taken.iter().map(|h| h.payload.as_ref().map_or(0, |p| p.len())).sum::<usize>();
        Ok(taken)
    }
}

/// Everything we know about one remote peer, independent of the current connection.
pub struct Link {
    pub send: SendWindow,
    pub recv: RecvWindow,
    /// The connection frames currently go out on.
    pub conn: Option<usize>,
    /// The peer's incarnation (random per port instance): a new value means the peer
    /// restarted and the windows start over.
    pub incarnation: Option<u64>,
    pub down_since: Option<Instant>,
    pub retry_at: Option<Instant>,
    pub backoff: Duration,
    pub ack_due: Option<Instant>,
}

impl Link {
    /// A link with nothing sent or received.
    pub fn new() -> Self {
        Link {
            send: SendWindow::new(),
            recv: RecvWindow::new(),
            conn: None,
            incarnation: None,
            down_since: None,
            retry_at: None,
            backoff: Duration::ZERO,
            ack_due: None,
        }
    }
}

impl Default for Link {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests;
