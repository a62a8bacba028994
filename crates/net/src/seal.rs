//! Link encryption (`--encrypt`): a Noise session per TCP connection, below the frames.
//!
//! An encrypted connection carries records, not frames: `u16` big-endian length, then
//! that many bytes of one Noise message. The first record of the initiator is preceded
//! by [`MAGIC`], so a port that does not encrypt (or one that does, facing one that
//! does not) fails the connection with an error that says so instead of reading noise
//! as frames. The handshake is `Noise_NNpsk0_25519_AESGCM_BLAKE2s` (ParaMEDIC's
//! pattern, with AES-256-GCM instead of ChaCha20-Poly1305: on CPUs with AES-NI and
//! carry-less multiply it is the faster of the two) with a pre-shared key derived from
//! the job's key: fresh
//! ephemeral keys per connection (forward secrecy), and only holders of the job's key
//! complete it. The frames' own authentication handshake (`auth`) then runs inside, as
//! on a plain link, so nothing above this module changes.
//!
//! Sans-IO: [`Sealer`] turns plaintext into records and records into plaintext; the
//! connection ([`crate::tcp::TcpConn`]) moves the bytes. The bytes are the cost: with
//! ring's AES-GCM (4 GB/s here) a copy of a megabyte into a fresh buffer costs as much
//! as sealing it. So a large payload is queued as the `Bytes` it came in
//! ([`Sealer::push_plain_bytes`]), sealed straight into the caller's kept buffer
//! ([`Sealer::seal_into`], a bounded batch at a time), and a whole record is opened
//! where it was read ([`Sealer::open`]). Each record holds at most
//! [`MAX_PLAIN`] bytes of plaintext, sealed under a counter nonce, so a replayed,
//! reordered, cut or altered record fails to open.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use crate::auth::Key;

/// Sent by the initiator before its first record.
pub const MAGIC: &[u8; 4] = b"GPNE";
const PARAMS: &str = "Noise_NNpsk0_25519_AESGCM_BLAKE2s";
/// The largest Noise message.
const MAX_RECORD: usize = 65535;
const TAG: usize = 16;
/// Payload of the initiator's first handshake message: with the magic, the length and
/// the message's key and tag, the first bytes on the wire outnumber a frame header.
const FIRST_PAYLOAD: usize = crate::frame::HEADER_LEN;
/// Plaintext bytes in one record.
pub const MAX_PLAIN: usize = MAX_RECORD - TAG;

/// Why a connection's records could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("the peer does not encrypt its links, this port does (--encrypt on every agent, or on none)")]
    PeerPlain,
    #[error("the encrypted handshake failed (another key?): {0}")]
    Handshake(String),
    #[error("a record failed to open (altered, replayed or out of order): {0}")]
    Open(String),
}

/// One connection's encryption state.
pub struct Sealer {
    initiator: bool,
    handshake: Option<snow::HandshakeState>,
    transport: Option<snow::TransportState>,
    /// Plaintext queued before the session is up, or not sealed yet: whole segments, so
    /// that a frame's payload is sealed from the buffer it came in (no copy of it), and
    /// `small` gathering headers and small payloads in between.
    plain_out: VecDeque<Bytes>,
    small: Vec<u8>,
    plain_len: usize,
    /// The start of a record not received whole yet (acceptor: after the magic), and
    /// how much of the magic has been seen. Whole records are opened where they were
    /// read; only a record cut by the end of a read is copied here.
    raw_in: Vec<u8>,
    magic_seen: usize,
    scratch: Vec<u8>,
}

/// A payload of at least this many bytes is queued as it is, not copied into `small`.
const SEGMENT_MIN: usize = 4096;

impl Sealer {
    /// A session for one connection; the initiator's first record is in `out` at once.
    pub fn new(key: &Key, initiator: bool, out: &mut Vec<u8>) -> Sealer {
        Sealer::with_builder(key, initiator, out, snow::Builder::new)
    }

    /// [`Sealer::new`] with the Noise primitives `builder` chooses (the default,
    /// `snow::Builder::new`, takes ring's ciphers where ring has them).
    fn with_builder(
        key: &Key,
        initiator: bool,
        out: &mut Vec<u8>,
        builder: fn(snow::params::NoiseParams) -> snow::Builder<'static>,
    ) -> Sealer {
        let psk = key.derive(b"gepsea-net link encryption v1");
        let b = builder(PARAMS.parse().expect("valid Noise parameters")).psk(0, &psk).expect("32-byte psk");
        let mut hs = if initiator { b.build_initiator() } else { b.build_responder() }.expect("supported Noise parameters");
        let mut s = Sealer {
            initiator,
            handshake: None,
            transport: None,
            plain_out: VecDeque::new(),
            small: Vec::new(),
            plain_len: 0,
            raw_in: Vec::new(),
            magic_seen: if initiator { MAGIC.len() } else { 0 },
            scratch: vec![0u8; MAX_RECORD],
        };
        if initiator {
            out.extend_from_slice(MAGIC);
            // Padded to a frame header's length at least, so that a port that does not
            // encrypt reads a whole (bad) header and says so instead of waiting.
            let pad = [0u8; FIRST_PAYLOAD];
            let n = hs.write_message(&pad, &mut s.scratch).expect("the first handshake message fits");
            push_record(out, &s.scratch[..n]);
        }
        s.handshake = Some(hs);
        s
    }

    /// Whether the session is up (records carry plaintext).
    pub fn ready(&self) -> bool {
        self.transport.is_some()
    }

    /// Queues a copy of `bytes`; plaintext is sealed by [`Sealer::seal_into`] once the
    /// session is up.
    pub fn push_plain(&mut self, bytes: &[u8]) {
        self.small.extend_from_slice(bytes);
        self.plain_len += bytes.len();
    }

    /// Queues `bytes` without copying it unless it is small (a frame's payload).
    pub fn push_plain_bytes(&mut self, bytes: &Bytes) {
        if bytes.len() < SEGMENT_MIN {
            return self.push_plain(bytes);
        }
        if !self.small.is_empty() {
            self.plain_out.push_back(Bytes::from(std::mem::take(&mut self.small)));
        }
        self.plain_out.push_back(bytes.clone());
        self.plain_len += bytes.len();
    }

    /// Plaintext queued and not sealed yet.
    pub fn pending(&self) -> usize {
        self.plain_len
    }

    pub fn clear(&mut self) {
        self.plain_out.clear();
        self.small.clear();
        self.plain_len = 0;
    }

    /// Seals up to `limit` bytes of what is queued (whole records; at least one record
    /// if anything is queued) into records appended to `out`; nothing before the
    /// session is up. Each record is sealed in place in `out`: with the records' buffer
    /// kept by the caller, a large message costs its encryption and no copy.
    pub fn seal_into(&mut self, out: &mut BytesMut, limit: usize) {
        let Some(t) = &mut self.transport else { return };
        if !self.small.is_empty() {
            self.plain_out.push_back(Bytes::from(std::mem::take(&mut self.small)));
        }
        let limit = limit.max(1);
        let n = self.plain_len.min(limit);
        out.reserve(n + (n.div_ceil(MAX_PLAIN) + 1) * (TAG + 2));
        let mut sealed = 0;
        while sealed < limit {
            let Some(mut segment) = self.plain_out.pop_front() else { break };
            let chunk = segment.split_to(segment.len().min(MAX_PLAIN));
            if !segment.is_empty() {
                self.plain_out.push_front(segment);
            }
            let at = out.len();
            out.resize(at + 2 + chunk.len() + TAG, 0);
            let m = t.write_message(&chunk, &mut out[at + 2..]).expect("a chunk fits one Noise message");
            out[at..at + 2].copy_from_slice(&(m as u16).to_be_bytes());
            out.truncate(at + 2 + m);
            sealed += chunk.len();
        }
        self.plain_len -= sealed;
    }

    /// Takes bytes read from the socket. Plaintext of complete records goes to
    /// `plain`; handshake answers go to `out` (to be written).
    pub fn open(&mut self, mut bytes: &[u8], plain: &mut dyn FnMut(&[u8]), out: &mut Vec<u8>) -> Result<(), SealError> {
        while self.magic_seen < MAGIC.len() {
            let Some((&b, rest)) = bytes.split_first() else { return Ok(()) };
            if b != MAGIC[self.magic_seen] {
                return Err(SealError::PeerPlain);
            }
            self.magic_seen += 1;
            bytes = rest;
        }
        // A record begun by an earlier read: complete it from the front of this one.
        while !self.raw_in.is_empty() && !bytes.is_empty() {
            if self.raw_in.len() < 2 {
                self.raw_in.push(bytes[0]);
                bytes = &bytes[1..];
                continue;
            }
            let need = 2 + u16::from_be_bytes([self.raw_in[0], self.raw_in[1]]) as usize;
            let take = (need - self.raw_in.len()).min(bytes.len());
            self.raw_in.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.raw_in.len() == need {
                let record = std::mem::take(&mut self.raw_in);
                self.record(&record[2..], plain, out)?;
                self.raw_in = record;
                self.raw_in.clear();
            }
        }
        // Whole records, opened where they were read.
        while bytes.len() >= 2 {
            let len = u16::from_be_bytes([bytes[0], bytes[1]]) as usize;
            if bytes.len() - 2 < len {
                break;
            }
            self.record(&bytes[2..2 + len], plain, out)?;
            bytes = &bytes[2 + len..];
        }
        self.raw_in.extend_from_slice(bytes);
        Ok(())
    }

    /// One record: plaintext once the session is up, a handshake message before.
    fn record(&mut self, record: &[u8], plain: &mut dyn FnMut(&[u8]), out: &mut Vec<u8>) -> Result<(), SealError> {
        if let Some(t) = &mut self.transport {
            let n = t.read_message(record, &mut self.scratch).map_err(|e| SealError::Open(e.to_string()))?;
            plain(&self.scratch[..n]);
            return Ok(());
        }
        let mut hs = self.handshake.take().ok_or_else(|| SealError::Handshake("no handshake in progress".into()))?;
        hs.read_message(record, &mut self.scratch).map_err(|e| SealError::Handshake(e.to_string()))?;
        if !self.initiator {
            let n = hs.write_message(&[], &mut self.scratch).map_err(|e| SealError::Handshake(e.to_string()))?;
            push_record(out, &self.scratch[..n]);
        }
        if hs.is_handshake_finished() {
            self.transport = Some(hs.into_transport_mode().map_err(|e| SealError::Handshake(e.to_string()))?);
            // What was queued before the session: sealed behind the handshake answer.
            let mut queued = BytesMut::new();
            self.seal_into(&mut queued, usize::MAX);
            out.extend_from_slice(&queued);
        } else {
            self.handshake = Some(hs);
        }
        Ok(())
    }
}

fn push_record(out: &mut Vec<u8>, msg: &[u8]) {
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(ka: &Key, kb: &Key) -> (Sealer, Sealer, Vec<u8>) {
        let mut wire = Vec::new();
        let a = Sealer::new(ka, true, &mut wire);
        let b = Sealer::new(kb, false, &mut Vec::new());
        (a, b, wire)
    }

    /// Feeds `bytes` to `s` in pieces of `step`; returns (plaintext, bytes to send back).
    fn feed(s: &mut Sealer, bytes: &[u8], step: usize) -> Result<(Vec<u8>, Vec<u8>), SealError> {
        let (mut plain, mut out) = (Vec::new(), Vec::new());
        for piece in bytes.chunks(step.max(1)) {
            s.open(piece, &mut |p| plain.extend_from_slice(p), &mut out)?;
        }
        Ok((plain, out))
    }

    #[test]
    fn both_ways_in_any_pieces_and_queued_before_the_handshake() {
        let k = Key::from_secret(b"the job's secret");
        for step in [1, 3, 7, 1000, 1 << 20] {
            let (mut a, mut b, hello) = pair(&k, &k);
            a.push_plain(b"queued before the session");
            let (none, answer) = feed(&mut b, &hello, step).unwrap();
            assert!(none.is_empty() && b.ready());
            let (none, queued) = feed(&mut a, &answer, step).unwrap();
            assert!(none.is_empty() && a.ready());
            assert_eq!(feed(&mut b, &queued, step).unwrap().0, b"queued before the session", "sealed once the session is up");
            let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
            a.push_plain(&big);
            let mut wire = BytesMut::new();
            a.seal_into(&mut wire, usize::MAX);
            assert!(wire.len() > big.len() && !wire.windows(16).any(|w| w == &big[1000..1016]), "sealed, not in clear");
            let (got, _) = feed(&mut b, &wire, step).unwrap();
            assert_eq!(got, big);
            b.push_plain(b"back");
            let mut wire = BytesMut::new();
            b.seal_into(&mut wire, usize::MAX);
            assert_eq!(feed(&mut a, &wire, step).unwrap().0, b"back");
        }
    }

    /// Up to `limit` bytes at a time sealed into one kept buffer, as a connection does,
    /// each batch taken from it before the next is sealed.
    fn seal_in_batches(s: &mut Sealer, limit: usize) -> Vec<u8> {
        let (mut wire, mut out) = (Vec::new(), BytesMut::new());
        while s.pending() > 0 {
            let before = s.pending();
            s.seal_into(&mut out, limit);
            let sealed = before - s.pending();
            assert!(sealed > 0 && sealed < limit.max(1).saturating_add(MAX_PLAIN), "{sealed} sealed, limit {limit}");
            wire.extend_from_slice(&out.split().freeze());
        }
        wire
    }

    /// Two sessions whose handshake is done: (initiator, responder).
    fn session_with(
        ki: fn(snow::params::NoiseParams) -> snow::Builder<'static>,
        kr: fn(snow::params::NoiseParams) -> snow::Builder<'static>,
    ) -> (Sealer, Sealer) {
        let k = Key::from_secret(b"the job's secret");
        let mut hello = Vec::new();
        let mut i = Sealer::with_builder(&k, true, &mut hello, ki);
        let mut r = Sealer::with_builder(&k, false, &mut Vec::new(), kr);
        let (_, answer) = feed(&mut r, &hello, 1 << 20).unwrap();
        feed(&mut i, &answer, 1 << 20).unwrap();
        assert!(i.ready() && r.ready());
        (i, r)
    }

    #[test]
    fn payloads_queued_whole_and_small_pieces_come_out_in_order_whatever_the_batch() {
        let big = |n: usize, salt: u32| -> Bytes { (0..n as u32).map(|i| (i.wrapping_mul(31) ^ salt) as u8).collect::<Vec<u8>>().into() };
        for limit in [0, 1, 100, MAX_PLAIN - 1, MAX_PLAIN, 128 << 10, usize::MAX] {
            let (mut a, mut b) = session_with(snow::Builder::new, snow::Builder::new);
            let mut expected = Vec::new();
            let mut push = |a: &mut Sealer, piece: Bytes, whole: bool| {
                expected.extend_from_slice(&piece);
                if whole {
                    a.push_plain_bytes(&piece);
                } else {
                    a.push_plain(&piece);
                }
            };
            push(&mut a, Bytes::from_static(b"header one"), false);
            push(&mut a, big(300_000, 1), true);
            push(&mut a, Bytes::from_static(b"header two"), false);
            push(&mut a, big(SEGMENT_MIN - 1, 2), true);
            push(&mut a, big(SEGMENT_MIN, 3), true);
            push(&mut a, big(MAX_PLAIN, 4), true);
            push(&mut a, Bytes::from_static(b"last"), false);
            assert_eq!(a.pending(), expected.len());
            let wire = seal_in_batches(&mut a, limit);
            assert_eq!(a.pending(), 0);
            let step = if limit == 1 { 1 } else { 65_537 };
            let (got, _) = feed(&mut b, &wire, step).unwrap();
            assert_eq!(got, expected, "limit {limit}");
        }
    }

    /// Each end may take its ciphers from ring or from RustCrypto: the records are the
    /// same Noise messages, so a session between the two carries data both ways.
    #[test]
    fn ring_and_rustcrypto_ends_understand_each_other() {
        fn rustcrypto(p: snow::params::NoiseParams) -> snow::Builder<'static> {
            snow::Builder::with_resolver(p, Box::new(snow::resolvers::DefaultResolver))
        }
        for (ki, kr) in [(snow::Builder::new as fn(_) -> _, rustcrypto as fn(_) -> _), (rustcrypto, snow::Builder::new)] {
            let (mut i, mut r) = session_with(ki, kr);
            let data: Bytes = (0..200_000u32).map(|x| (x % 253) as u8).collect::<Vec<u8>>().into();
            i.push_plain_bytes(&data);
            let wire = seal_in_batches(&mut i, 128 << 10);
            assert_eq!(feed(&mut r, &wire, 4096).unwrap().0, &data[..]);
            r.push_plain(b"and back");
            let wire = seal_in_batches(&mut r, usize::MAX);
            assert_eq!(feed(&mut i, &wire, 3).unwrap().0, b"and back");
        }
    }

    #[test]
    fn another_key_a_plain_peer_and_altered_or_replayed_records_fail() {
        let (a, b) = (Key::from_secret(b"one secret"), Key::from_secret(b"another secret"));
        let (_, mut acc, hello) = pair(&a, &b);
        assert!(matches!(feed(&mut acc, &hello, 64), Err(SealError::Handshake(_))));

        let mut acc = Sealer::new(&a, false, &mut Vec::new());
        assert_eq!(feed(&mut acc, b"GPNF\x00\x01", 64).unwrap_err(), SealError::PeerPlain);

        let session = || {
            let (mut i, mut r, hello) = pair(&a, &a);
            let (_, answer) = feed(&mut r, &hello, 64).unwrap();
            feed(&mut i, &answer, 64).unwrap();
            i.push_plain(b"first");
            let mut record = BytesMut::new();
            i.seal_into(&mut record, usize::MAX);
            (r, record)
        };
        let (mut r, mut record) = session();
        let last = record.len() - 1;
        record[last] ^= 1;
        assert!(matches!(feed(&mut r, &record, 64), Err(SealError::Open(_))), "an altered record");
        let (mut r, record) = session();
        assert_eq!(feed(&mut r, &record, 64).unwrap().0, b"first");
        assert!(matches!(feed(&mut r, &record, 64), Err(SealError::Open(_))), "a replayed record");
        let (mut other, _) = session();
        let (_, record) = session();
        assert!(matches!(feed(&mut other, &record, 64), Err(SealError::Open(_))), "another session's record");
    }
}
