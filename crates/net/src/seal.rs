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
//! connection ([`crate::tcp::TcpConn`]) moves the bytes. Each record holds at most
//! [`MAX_PLAIN`] bytes of plaintext, sealed under a counter nonce, so a replayed,
//! reordered, cut or altered record fails to open.

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
    /// Plaintext queued before the session is up, or not sealed yet.
    plain_out: Vec<u8>,
    /// Bytes read and not yet a whole record (acceptor: the magic first), from
    /// `raw_at` on (consumed bytes are dropped when the buffer is compacted, not per
    /// record).
    raw_in: Vec<u8>,
    raw_at: usize,
    magic_checked: bool,
    scratch: Vec<u8>,
}

impl Sealer {
    /// A session for one connection; the initiator's first record is in `out` at once.
    pub fn new(key: &Key, initiator: bool, out: &mut Vec<u8>) -> Sealer {
        let psk = key.derive(b"gepsea-net link encryption v1");
        let b = snow::Builder::new(PARAMS.parse().expect("valid Noise parameters")).psk(0, &psk).expect("32-byte psk");
        let mut hs = if initiator { b.build_initiator() } else { b.build_responder() }.expect("supported Noise parameters");
        let mut s = Sealer {
            initiator,
            handshake: None,
            transport: None,
            plain_out: Vec::new(),
            raw_in: Vec::new(),
            raw_at: 0,
            magic_checked: initiator,
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

    /// Queues plaintext; it is sealed by [`Sealer::seal_into`] once the session is up.
    pub fn push_plain(&mut self, bytes: &[u8]) {
        self.plain_out.extend_from_slice(bytes);
    }

    /// Plaintext queued and not sealed yet.
    pub fn pending(&self) -> usize {
        self.plain_out.len()
    }

    pub fn clear(&mut self) {
        self.plain_out.clear();
    }

    /// Seals everything queued into records appended to `out` (nothing before the
    /// session is up).
    pub fn seal_into(&mut self, out: &mut Vec<u8>) {
        let Some(t) = &mut self.transport else { return };
        let n = self.plain_out.len();
        out.reserve(n + n.div_ceil(MAX_PLAIN) * (TAG + 2));
        for chunk in self.plain_out.chunks(MAX_PLAIN) {
            let n = t.write_message(chunk, &mut self.scratch).expect("a chunk fits one Noise message");
            push_record(out, &self.scratch[..n]);
        }
        self.plain_out.clear();
    }

    /// Takes bytes read from the socket. Plaintext of complete records goes to
    /// `plain`; handshake answers go to `out` (to be written).
    pub fn open(&mut self, bytes: &[u8], plain: &mut dyn FnMut(&[u8]), out: &mut Vec<u8>) -> Result<(), SealError> {
        if self.raw_at == self.raw_in.len() {
            self.raw_in.clear();
            self.raw_at = 0;
        }
        self.raw_in.extend_from_slice(bytes);
        if !self.magic_checked {
            let have = &self.raw_in[self.raw_at..];
            let n = have.len().min(MAGIC.len());
            if have[..n] != MAGIC[..n] {
                return Err(SealError::PeerPlain);
            }
            if n < MAGIC.len() {
                return Ok(());
            }
            self.raw_at += MAGIC.len();
            self.magic_checked = true;
        }
        let mut at = self.raw_at;
        while self.raw_in.len() - at >= 2 {
            let len = u16::from_be_bytes([self.raw_in[at], self.raw_in[at + 1]]) as usize;
            if self.raw_in.len() - at - 2 < len {
                break;
            }
            let record = &self.raw_in[at + 2..at + 2 + len];
            at += 2 + len;
            if let Some(t) = &mut self.transport {
                let n = t.read_message(record, &mut self.scratch).map_err(|e| SealError::Open(e.to_string()))?;
                plain(&self.scratch[..n]);
                continue;
            }
            let mut hs = self.handshake.take().ok_or_else(|| SealError::Handshake("no handshake in progress".into()))?;
            hs.read_message(record, &mut self.scratch).map_err(|e| SealError::Handshake(e.to_string()))?;
            if !self.initiator {
                let n = hs.write_message(&[], &mut self.scratch).map_err(|e| SealError::Handshake(e.to_string()))?;
                push_record(out, &self.scratch[..n]);
            }
            if hs.is_handshake_finished() {
                self.transport = Some(hs.into_transport_mode().map_err(|e| SealError::Handshake(e.to_string()))?);
                self.seal_into(out);
            } else {
                self.handshake = Some(hs);
            }
        }
        self.raw_at = at;
        // Keep what is left of a partial record at the front once it is the minority.
        if self.raw_at > (1 << 20) || self.raw_at * 2 > self.raw_in.len() {
            self.raw_in.drain(..self.raw_at);
            self.raw_at = 0;
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
            let mut wire = Vec::new();
            a.seal_into(&mut wire);
            assert!(wire.len() > big.len() && !wire.windows(16).any(|w| w == &big[1000..1016]), "sealed, not in clear");
            let (got, _) = feed(&mut b, &wire, step).unwrap();
            assert_eq!(got, big);
            b.push_plain(b"back");
            let mut wire = Vec::new();
            b.seal_into(&mut wire);
            assert_eq!(feed(&mut a, &wire, step).unwrap().0, b"back");
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
            let mut record = Vec::new();
            i.seal_into(&mut record);
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
