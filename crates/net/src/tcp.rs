//! TCP connections: framed, vectored writes, non-blocking reads into a frame decoder,
//! and the per-peer [`Link`] that survives a connection being replaced.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};

use crate::frame::{Addr, Frame, FrameDecoder, FrameError, Header, FLAG_PAYLOAD_CRC, HEADER_LEN};
use crate::reliable::{RecvWindow, SendWindow};

/// The most one read into the decoder takes.
const READ_AT_MOST: usize = 64 << 10;

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
    /// The data frame whose payload is being read straight into its message's buffer.
    direct: Option<DirectRead>,
    /// Such a frame just ended.
    after_direct: bool,
}

/// A rendezvous data frame received outside the decoder: its header, where its payload
/// ends in the message buffer, and the checksum of what has arrived so far (computed
/// piece by piece as it lands, while the bytes are still in the cache).
struct DirectRead {
    header: Header,
    end: usize,
    crc: crc_fast::Digest,
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
            direct: None,
            after_direct: false,
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

    /// Encodes `f` (with payload CRC) and appends it to the write queue.
    pub fn queue(&mut self, f: &Frame) {
        let mut h = vec![0u8; HEADER_LEN];
        f.header.encode(&f.payload, &mut h);
        if let Some(s) = &mut self.sealer {
            s.push_plain(&h);
            s.push_plain(&f.payload);
            return;
        }
        self.wq_bytes += HEADER_LEN + f.payload.len();
        self.wq.push_back(Bytes::from(h));
        if !f.payload.is_empty() {
            self.wq.push_back(f.payload.clone());
        }
    }

    /// Bytes queued and not yet accepted by the kernel.
    pub fn queued(&self) -> usize {
        self.wq_bytes + self.sealer.as_ref().map_or(0, |s| s.pending())
    }

    /// Discards unsent bytes (the connection is being abandoned; the link replays).
    pub fn clear_queue(&mut self) {
        self.wq.clear();
        self.wq_bytes = 0;
        if let Some(s) = &mut self.sealer {
            s.clear();
        }
    }

    /// Writes as much of the queue as the socket takes. `Ok(())` also when it would block.
    pub fn write_out(&mut self) -> io::Result<()> {
        if self.state == ConnState::Connecting {
            return Ok(());
        }
        if let Some(s) = &mut self.sealer {
            let mut records = Vec::new();
            s.seal_into(&mut records);
            self.push_raw(records);
        }
        while !self.wq.is_empty() {
            let slices: Vec<IoSlice<'_>> = self.wq.iter().take(64).map(|b| IoSlice::new(b)).collect();
            match self.stream.write_vectored(&slices) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "connection wrote zero bytes")),
                Ok(mut n) => {
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
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
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
            if self.after_direct && buffered < HEADER_LEN {
                n = n.min(HEADER_LEN - buffered);
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
        let mut crc = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
        let buffered = self.dec.take_partial();
        crc.update(buffered);
        dest.extend_from_slice(buffered);
        self.direct = Some(DirectRead { header, end, crc });
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
        let tail_len = tail.len().min(HEADER_LEN);
        loop {
            match crate::uio::readv_spare(self.stream.as_raw_fd(), dest, want, &mut tail[..tail_len]) {
                Ok(0) => return Ok(ReadOutcome::Eof),
                Ok(n) => {
                    d.crc.update(&dest[before..]);
                    self.dec.filled(n - (dest.len() - before));
                    return Ok(ReadOutcome::More);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(ReadOutcome::Drained),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Ends the direct frame once its whole payload is in `dest`: its header when the
    /// checksum matches, or the mismatch (with `dest` cut back to the frame's offset,
    /// as if it never arrived). `None` while bytes are missing.
    pub fn finish_direct(&mut self, dest: &mut Vec<u8>) -> Option<Result<Header, FrameError>> {
        if self.direct.as_ref()?.end != dest.len() {
            return None;
        }
        let d = self.direct.take().expect("checked above");
        self.after_direct = true;
        let actual = d.crc.finalize() as u32;
        if d.header.flags & FLAG_PAYLOAD_CRC != 0 && actual != d.header.crc {
            dest.truncate(d.header.offset as usize);
            return Some(Err(FrameError::PayloadCrc { expected: d.header.crc, actual }));
        }
        Some(Ok(d.header))
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
