//! Wire frames: a fixed, versioned header followed by a payload.
//!
//! Over TCP every frame carries a CRC32C of its payload and a CRC32C of its header, so
//! a flipped bit anywhere is detected before the frame is acted on. A large rendezvous
//! piece may carry its payload's CRC32C in a [`Kind::Sum`] frame that follows it
//! instead ([`FLAG_SUM_AFTER`]): the sender hands the piece to the kernel first and
//! checksums it while the receiver copies, and the receiver acts on the piece only once
//! the sum has come and matched. Over shared memory
//! the same header travels in a compact form ([`Header::encode_compact`]): the ring
//! joins two ports, keeps order and is protected by the kernel, so addresses, sequence
//! numbers and checksums are left out.
//!
//! The codec is sans-IO: [`Header::encode`] writes into a buffer and [`FrameDecoder`]
//! accepts bytes in whatever pieces the socket returns and yields whole frames or a
//! [`FrameError`]. Neither touches a socket or a clock, so both are unit- and
//! property-tested directly. The layout is documented in `docs/protocol.md`.

use bytes::Bytes;

mod decoder;
pub use decoder::FrameDecoder;

/// `b"GPSA"` read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"GPSA");
/// Wire version; a peer speaking another version is refused, never guessed at.
pub const VERSION: u8 = 1;
/// Bytes in an encoded header.
pub const HEADER_LEN: usize = 88;
/// A [`FrameDecoder`]'s buffer to begin with: one bounded read of a TCP connection.
pub const DECODER_START: usize = 64 << 10;

/// Where a header holds its payload's length.
const LEN_AT: usize = 72;

/// CRC32C (Castagnoli) of `bytes`, the checksum of headers and payloads (see `crate::crc`
/// for how it is computed fast on each CPU).
pub fn crc32c(bytes: &[u8]) -> u32 {
    crate::crc::crc32c(bytes)
}
/// The payload CRC field is valid.
pub const FLAG_PAYLOAD_CRC: u8 = 1;
/// Last piece of a chunked transfer (rendezvous data, put, get reply).
pub const FLAG_LAST: u8 = 2;
/// Longest header in shared-memory form (see [`Header::encode_compact`]).
pub const COMPACT_MAX: usize = 40;
/// The operation failed at the remote side (e.g. an RMA access out of bounds).
pub const FLAG_ERROR: u8 = 4;
/// Single copy between ports on one node. On an `Rts`: the payload (16 bytes) names
/// the sender's process id and buffer address, for the receiver to copy from itself.
/// On a `Cts`: the receiver has the whole message; the send is complete.
pub const FLAG_SINGLE_COPY: u8 = 8;
/// A copy split between both ends (`proto::copy`). On a `Cts`: the receiver reads
/// `[0, offset)` itself and asks the sender to write `[offset, total)` into its buffer,
/// whose process id and address the payload names (16 bytes, as an `Rts`'s offer). An
/// empty `Data` frame flagged `FLAG_SINGLE_COPY` is the sender's report that it wrote
/// `[offset, total)` (with `FLAG_ERROR`: that it could not).
pub const FLAG_WRITE: u8 = 16;
/// A `Data` piece whose payload CRC is not in its header but in the [`Kind::Sum`] frame
/// that follows it (and the other pieces so flagged before it) on the same TCP
/// connection. The receiver holds such a piece, undelivered and unacknowledged, until
/// that sum has matched; a connection that sends anything else first is reset.
pub const FLAG_SUM_AFTER: u8 = 32;
/// On `Hello` and `HelloAck`: the sender trusts TCP's own checksums for the payloads
/// of application data ([`Kind::carries_data`]; `TcpChecksums::Headers`). A connection
/// carries such payloads without a CRC only when both of its handshake frames say so;
/// headers and link-control frames keep theirs either way.
pub const FLAG_TRUST_TCP: u8 = 64;
/// Bytes of one entry of a [`Kind::Sum`] payload: the piece's sequence number (u64) and
/// its payload's CRC32C (u32), little-endian.
pub const SUM_ENTRY_LEN: usize = 12;

/// (node, port): the address of one process's port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Addr {
    /// Node (host) identifier.
    pub node: u32,
    /// Port identifier, unique within its node.
    pub port: u32,
}

impl Addr {
    /// Shorthand constructor.
    pub const fn new(node: u32, port: u32) -> Self {
        Addr { node, port }
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.node, self.port)
    }
}

/// Logical channel a frame belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Channel {
    /// Small eager messages into the receiver's pool; receiver posts nothing.
    System = 0,
    /// Tagged point-to-point messages: eager when small, rendezvous when large.
    Normal = 1,
    /// Remote memory access into exposed regions.
    Open = 2,
    /// Link control (handshake, acknowledgements, credits).
    Control = 3,
}

impl Channel {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Channel::System,
            1 => Channel::Normal,
            2 => Channel::Open,
            3 => Channel::Control,
            _ => return None,
        })
    }
}

/// What a frame asks the receiver to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// A whole message carried eagerly (`tag`, payload = data).
    Eager = 1,
    /// Request to send: `id` names the message, `total` its length, `tag` its tag.
    Rts = 2,
    /// Clear to send message `id`: the receiver has posted a buffer.
    Cts = 3,
    /// A piece of rendezvous message `id` at `offset`.
    Data = 4,
    /// RMA write of the payload into region `tag` at `offset`; `id` names the request.
    Put = 5,
    /// Completion of put `id` (with `FLAG_ERROR` if it was refused).
    PutAck = 6,
    /// RMA read of `total` bytes of region `tag` at `offset`; `id` names the request.
    GetReq = 7,
    /// A piece of the answer to get `id` at `offset`.
    GetReply = 8,
    /// Return `total` eager credits to the sender.
    Credit = 9,
    /// Standalone cumulative acknowledgement (the `ack` field).
    Ack = 10,
    /// First frame on a new TCP connection: who I am, and the last sequence number I
    /// received from you (`ack`).
    Hello = 11,
    /// Answer to `Hello`, same fields.
    HelloAck = 12,
    /// The initiator's proof that it holds the link key (see [`crate::auth`]).
    Auth = 13,
    /// The payload checksums of the [`FLAG_SUM_AFTER`] pieces sent just before it on
    /// this connection, in order ([`encode_sums`]). Link control: not sequenced, never
    /// replayed itself (replayed pieces get a sum of their own).
    Sum = 14,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Kind::Eager,
            2 => Kind::Rts,
            3 => Kind::Cts,
            4 => Kind::Data,
            5 => Kind::Put,
            6 => Kind::PutAck,
            7 => Kind::GetReq,
            8 => Kind::GetReply,
            9 => Kind::Credit,
            10 => Kind::Ack,
            11 => Kind::Hello,
            12 => Kind::HelloAck,
            13 => Kind::Auth,
            14 => Kind::Sum,
            _ => return None,
        })
    }

    /// Frames whose payload is application data (messages, rendezvous and RMA pieces),
    /// as opposed to link and protocol control: the payloads a link whose ends trust
    /// TCP ([`FLAG_TRUST_TCP`]) sends without a checksum.
    pub fn carries_data(self) -> bool {
        matches!(self, Kind::Eager | Kind::Data | Kind::Put | Kind::GetReply)
    }

    /// Frames that take part in the per-link sequence (everything but link control).
    pub fn is_sequenced(self) -> bool {
        !matches!(self, Kind::Ack | Kind::Hello | Kind::HelloAck | Kind::Auth | Kind::Sum)
    }
}

/// A decoded header. `len` and `crc` are filled in by the encoder from the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub channel: Channel,
    pub flags: u8,
    pub src: Addr,
    pub dst: Addr,
    /// Per-link sequence number (TCP) or per-ring sequence number (shared memory).
    pub seq: u64,
    /// Cumulative acknowledgement: the highest sequence number received in order.
    pub ack: u64,
    pub tag: u64,
    pub id: u64,
    pub offset: u64,
    pub total: u64,
    /// Payload length in bytes.
    pub len: u32,
    /// CRC32C of the payload (valid when `FLAG_PAYLOAD_CRC` is set).
    pub crc: u32,
}

impl Header {
    /// A header with every numeric field zero.
    pub fn new(kind: Kind, channel: Channel, src: Addr, dst: Addr) -> Self {
        Header { kind, channel, flags: 0, src, dst, seq: 0, ack: 0, tag: 0, id: 0, offset: 0, total: 0, len: 0, crc: 0 }
    }

    /// Writes the header into `out` (exactly [`HEADER_LEN`] bytes), with the payload's
    /// and its own checksums.
    pub fn encode(&self, payload: &[u8], out: &mut [u8]) {
        self.encode_with(payload.len(), self.flags | FLAG_PAYLOAD_CRC, crc32c(payload), out);
    }

    /// Writes the header of a frame whose payload checksum was computed ahead and is in
    /// `self.crc` (`FLAG_PAYLOAD_CRC` set: see `Proto::sum_ahead`); nothing of the
    /// payload is read here.
    pub fn encode_summed(&self, payload_len: usize, out: &mut [u8]) {
        debug_assert_ne!(self.flags & FLAG_PAYLOAD_CRC, 0);
        self.encode_with(payload_len, self.flags, self.crc, out);
    }

    /// Writes the header of a frame whose payload goes without a CRC: nothing of the
    /// payload is read, and the header keeps its own checksum. For frames that travel
    /// inside sealed records (`crate::seal`), whose authentication tags already cover
    /// every byte of the payload (a record altered, dropped or replayed fails to open,
    /// and the connection is reset and its frames replayed, as after a checksum
    /// mismatch), and for data on a link whose ends both trust TCP's own checksums
    /// ([`FLAG_TRUST_TCP`]).
    pub fn encode_without_payload_crc(&self, payload_len: usize, out: &mut [u8]) {
        self.encode_with(payload_len, self.flags & !FLAG_PAYLOAD_CRC, 0, out);
    }

    /// Writes the header of a piece whose payload checksum follows in a [`Kind::Sum`]
    /// frame ([`FLAG_SUM_AFTER`]): nothing of the payload is read here.
    pub fn encode_sum_after(&self, payload_len: usize, out: &mut [u8]) {
        self.encode_with(payload_len, (self.flags & !FLAG_PAYLOAD_CRC) | FLAG_SUM_AFTER, 0, out);
    }

    fn encode_with(&self, payload_len: usize, flags: u8, crc: u32, out: &mut [u8]) {
        assert!(out.len() >= HEADER_LEN);
        let o = &mut out[..HEADER_LEN];
        o[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        o[4] = VERSION;
        o[5] = self.kind as u8;
        o[6] = self.channel as u8;
        o[7] = flags;
        o[8..12].copy_from_slice(&self.src.node.to_le_bytes());
        o[12..16].copy_from_slice(&self.src.port.to_le_bytes());
        o[16..20].copy_from_slice(&self.dst.node.to_le_bytes());
        o[20..24].copy_from_slice(&self.dst.port.to_le_bytes());
        o[24..32].copy_from_slice(&self.seq.to_le_bytes());
        o[32..40].copy_from_slice(&self.ack.to_le_bytes());
        o[40..48].copy_from_slice(&self.tag.to_le_bytes());
        o[48..56].copy_from_slice(&self.id.to_le_bytes());
        o[56..64].copy_from_slice(&self.offset.to_le_bytes());
        o[64..72].copy_from_slice(&self.total.to_le_bytes());
        o[LEN_AT..LEN_AT + 4].copy_from_slice(&(payload_len as u32).to_le_bytes());
        o[76..80].copy_from_slice(&crc.to_le_bytes());
        o[80..84].copy_from_slice(&[0u8; 4]);
        let hcrc = crc32c(&o[..84]);
        o[84..88].copy_from_slice(&hcrc.to_le_bytes());
    }

    /// Writes the shared-memory form of the header and returns its length (at most
    /// [`COMPACT_MAX`]). A shared-memory connection joins exactly two ports and keeps
    /// its frames in order, so source, destination, sequence and acknowledgement are
    /// implied and no checksum is needed; what remains is kind, channel, flags, the
    /// payload length, a mask saying which of tag, id, offset and total are non-zero,
    /// and those. An eager message with tag 0 needs 8 bytes instead of 88: with its
    /// payload it fits the one cache line a ring record starts on.
    pub fn encode_compact(&self, payload_len: usize, out: &mut [u8; COMPACT_MAX]) -> usize {
        out[0] = self.kind as u8;
        out[1] = self.channel as u8;
        out[2] = self.flags & !FLAG_PAYLOAD_CRC;
        out[4..8].copy_from_slice(&(payload_len as u32).to_le_bytes());
        let mut mask = 0u8;
        let mut n = 8;
        for (bit, v) in [self.tag, self.id, self.offset, self.total].into_iter().enumerate() {
            if v != 0 {
                mask |= 1 << bit;
                out[n..n + 8].copy_from_slice(&v.to_le_bytes());
                n += 8;
            }
        }
        out[3] = mask;
        n
    }

    /// Reads a header written by [`Header::encode_compact`] from the front of `b`;
    /// returns it with its length. Kind, channel, mask and payload length are checked.
    pub fn decode_compact(b: &[u8], src: Addr, dst: Addr, max_payload: usize) -> Result<(Header, usize), FrameError> {
        if b.len() < 8 {
            return Err(FrameError::Truncated { have: b.len(), need: 8 });
        }
        let kind = Kind::from_u8(b[0]).ok_or(FrameError::BadKind(b[0]))?;
        let channel = Channel::from_u8(b[1]).ok_or(FrameError::BadChannel(b[1]))?;
        let mask = b[3];
        if mask > 0xf {
            return Err(FrameError::BadMask(mask));
        }
        let len = u32::from_le_bytes(b[4..8].try_into().unwrap());
        if len as usize > max_payload {
            return Err(FrameError::TooLong { len: len as usize, max: max_payload });
        }
        let need = 8 + 8 * mask.count_ones() as usize;
        if b.len() < need {
            return Err(FrameError::Truncated { have: b.len(), need });
        }
        let mut fields = [0u64; 4];
        let mut n = 8;
        for (bit, f) in fields.iter_mut().enumerate() {
            if mask & (1 << bit) != 0 {
                *f = u64::from_le_bytes(b[n..n + 8].try_into().unwrap());
                n += 8;
            }
        }
        let [tag, id, offset, total] = fields;
        let h = Header { kind, channel, flags: b[2], src, dst, seq: 0, ack: 0, tag, id, offset, total, len, crc: 0 };
        Ok((h, need))
    }

    /// Parses and validates a header (magic, version, kind, channel, header CRC, length
    /// limit). The payload is checked separately by [`Header::check_payload`].
    pub fn decode(b: &[u8], max_payload: usize) -> Result<Header, FrameError> {
        if b.len() < HEADER_LEN {
            return Err(FrameError::Truncated { have: b.len(), need: HEADER_LEN });
        }
        let u32at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let magic = u32at(0);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if b[4] != VERSION {
            return Err(FrameError::BadVersion(b[4]));
        }
        let want = u32at(84);
        let got = crc32c(&b[..84]);
        if want != got {
            return Err(FrameError::HeaderCrc { expected: want, actual: got });
        }
        let kind = Kind::from_u8(b[5]).ok_or(FrameError::BadKind(b[5]))?;
        let channel = Channel::from_u8(b[6]).ok_or(FrameError::BadChannel(b[6]))?;
        let len = u32at(LEN_AT);
        if len as usize > max_payload {
            return Err(FrameError::TooLong { len: len as usize, max: max_payload });
        }
        Ok(Header {
            kind,
            channel,
            flags: b[7],
            src: Addr::new(u32at(8), u32at(12)),
            dst: Addr::new(u32at(16), u32at(20)),
            seq: u64at(24),
            ack: u64at(32),
            tag: u64at(40),
            id: u64at(48),
            offset: u64at(56),
            total: u64at(64),
            len,
            crc: u32at(76),
        })
    }

    /// Verifies the payload against the header's length and CRC.
    pub fn check_payload(&self, payload: &[u8]) -> Result<(), FrameError> {
        if payload.len() != self.len as usize {
            return Err(FrameError::Truncated { have: payload.len(), need: self.len as usize });
        }
        if self.flags & FLAG_PAYLOAD_CRC != 0 {
            let got = crc32c(payload);
            if got != self.crc {
                return Err(FrameError::PayloadCrc { expected: self.crc, actual: got });
            }
        }
        Ok(())
    }
}

/// A header and its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub header: Header,
    pub payload: Bytes,
}

impl Frame {
    /// A frame without payload.
    pub fn control(header: Header) -> Self {
        Frame { header, payload: Bytes::new() }
    }

    /// Encodes header and payload into one contiguous buffer (tests and small frames).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; HEADER_LEN + self.payload.len()];
        self.header.encode(&self.payload, &mut v[..HEADER_LEN]);
        v[HEADER_LEN..].copy_from_slice(&self.payload);
        v
    }
}

/// The payload of a [`Kind::Sum`] frame: one entry per piece, `(sequence number, CRC32C
/// of its payload)`.
pub fn encode_sums(sums: &[(u64, u32)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(sums.len() * SUM_ENTRY_LEN);
    for &(seq, crc) in sums {
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&crc.to_le_bytes());
    }
    out
}

/// The entries of a [`Kind::Sum`] payload; `None` if its length is not a whole number
/// of entries.
pub fn decode_sums(payload: &[u8]) -> Option<Vec<(u64, u32)>> {
    payload.len().is_multiple_of(SUM_ENTRY_LEN).then(|| {
        payload
            .chunks_exact(SUM_ENTRY_LEN)
            .map(|e| (u64::from_le_bytes(e[..8].try_into().unwrap()), u32::from_le_bytes(e[8..].try_into().unwrap())))
            .collect()
    })
}

/// Why bytes were refused as a frame. Every variant means the stream can no longer be
/// trusted: the connection that produced it is reset and nothing from it is delivered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad magic 0x{0:08x} (expected 0x{MAGIC:08x} \"GPSA\"): not a gepsea peer, or the stream is out of step")]
    BadMagic(u32),
    #[error("unsupported wire version {0} (this build speaks version {VERSION})")]
    BadVersion(u8),
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    #[error("unknown channel {0}")]
    BadChannel(u8),
    #[error("bad field mask 0x{0:02x} in a shared-memory header")]
    BadMask(u8),
    #[error("header checksum mismatch (expected 0x{expected:08x}, computed 0x{actual:08x})")]
    HeaderCrc { expected: u32, actual: u32 },
    #[error("payload checksum mismatch (expected 0x{expected:08x}, computed 0x{actual:08x})")]
    PayloadCrc { expected: u32, actual: u32 },
    #[error("frame payload of {len} bytes exceeds the limit of {max} bytes")]
    TooLong { len: usize, max: usize },
    #[error("truncated frame: have {have} bytes, need {need}")]
    Truncated { have: usize, need: usize },
    #[error("{pieces} pieces ({bytes} bytes copied) wait for a checksum frame that does not come")]
    SumMissing { pieces: usize, bytes: usize },
    #[error("checksum frame out of step with the pieces before it: {0}")]
    SumOutOfStep(String),
    #[error("{0:?} payload without a checksum, on a link that checksums payloads (only links whose two ends both trust TCP's own checksums go without)")]
    PayloadUnchecked(Kind),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample(len: usize) -> Frame {
        let mut h = Header::new(Kind::Eager, Channel::Normal, Addr::new(1, 2), Addr::new(3, 4));
        h.seq = 77;
        h.ack = 76;
        h.tag = 0xdead_beef;
        h.id = 5;
        h.offset = 6;
        h.total = 7;
        h.flags = FLAG_LAST;
        Frame { header: h, payload: Bytes::from((0..len).map(|i| i as u8).collect::<Vec<_>>()) }
    }

    #[test]
    fn roundtrip_single_frame() {
        let f = sample(1000);
        let bytes = f.to_bytes();
        let mut d = FrameDecoder::new(1 << 20);
        d.extend(&bytes);
        let (h, p) = d.next_frame().unwrap().unwrap();
        assert_eq!(p, &f.payload[..]);
        assert_eq!(h.seq, 77);
        assert_eq!(h.flags, FLAG_LAST | FLAG_PAYLOAD_CRC);
        assert_eq!(h.len, 1000);
        assert!(d.next_frame().unwrap().is_none());
    }

    #[test]
    fn bad_magic_version_and_oversize_are_refused() {
        let mut b = sample(10).to_bytes();
        b[0] ^= 1;
        assert!(matches!(Header::decode(&b, 100), Err(FrameError::BadMagic(_))));
        let mut b = sample(10).to_bytes();
        b[4] = 9;
        assert_eq!(Header::decode(&b, 100), Err(FrameError::BadVersion(9)));
        let b = sample(200).to_bytes();
        assert_eq!(Header::decode(&b, 100), Err(FrameError::TooLong { len: 200, max: 100 }));
    }

    #[test]
    fn flipped_payload_bit_is_detected_and_poisons_the_stream() {
        let mut b = sample(64).to_bytes();
        b[HEADER_LEN + 10] ^= 0x40;
        let mut d = FrameDecoder::new(1 << 20);
        d.extend(&b);
        d.extend(&sample(1).to_bytes());
        assert!(matches!(d.next_frame(), Err(FrameError::PayloadCrc { .. })));
        // Nothing after a bad frame is trusted.
        assert!(d.next_frame().is_err());
    }

    /// `f` with its header written by `encode` and one payload byte altered, decoded.
    fn decoded_altered(f: &Frame, encode: fn(&Header, usize, &mut [u8])) -> (Header, Vec<u8>) {
        let mut b = vec![0u8; HEADER_LEN];
        encode(&f.header, f.payload.len(), &mut b);
        b.extend_from_slice(&f.payload);
        b[HEADER_LEN + 10] ^= 0x40;
        let mut d = FrameDecoder::new(1 << 20);
        d.extend(&b);
        let (h, p) = d.next_frame().unwrap().unwrap();
        (h, p.to_vec())
    }

    #[test]
    fn a_piece_with_its_sum_after_decodes_unchecked_and_its_sums_round_trip() {
        let mut f = sample(1000);
        f.header.kind = Kind::Data;
        // The decoder leaves the payload's check to whoever receives the sum.
        let (h, p) = decoded_altered(&f, Header::encode_sum_after);
        assert_eq!(h.flags, FLAG_LAST | FLAG_SUM_AFTER);
        assert_eq!((h.len, h.crc, p.len()), (1000, 0, 1000));
        let sums = [(77, crc32c(&f.payload)), (u64::MAX, 0xdead_beef)];
        let wire = encode_sums(&sums);
        assert_eq!(wire.len(), 2 * SUM_ENTRY_LEN);
        assert_eq!(decode_sums(&wire).unwrap(), sums);
        assert!(decode_sums(&wire[1..]).is_none(), "a partial entry is refused");
        assert!(!Kind::Sum.is_sequenced());
    }

    #[test]
    fn a_sealed_frame_carries_no_payload_checksum_and_decodes_unchecked() {
        // Inside sealed records the tags check the payload; the header still checks
        // itself.
        let f = sample(1000);
        let (h, p) = decoded_altered(&f, Header::encode_without_payload_crc);
        assert_eq!(h.flags & FLAG_PAYLOAD_CRC, 0);
        assert_eq!((h.len, h.crc, p.len()), (1000, 0, 1000));
        let mut b = vec![0u8; HEADER_LEN];
        f.header.encode_without_payload_crc(f.payload.len(), &mut b);
        b[20] ^= 1;
        let mut d = FrameDecoder::new(1 << 20);
        d.extend(&b);
        assert!(matches!(d.next_frame(), Err(FrameError::HeaderCrc { .. })));
    }

    #[test]
    fn truncated_stream_yields_nothing() {
        let b = sample(100).to_bytes();
        let mut d = FrameDecoder::new(1 << 20);
        d.extend(&b[..b.len() - 1]);
        assert_eq!(d.next_frame().unwrap(), None);
        d.extend(&b[b.len() - 1..]);
        assert!(d.next_frame().unwrap().is_some());
    }

    proptest! {
        #[test]
        fn crc32c_agrees_with_an_independent_implementation(data in proptest::collection::vec(any::<u8>(), 0..70_000), cut in 0usize..64) {
            // Unaligned starts too: pieces are slices at any offset of a message.
            let d = &data[cut.min(data.len())..];
            prop_assert_eq!(crc32c(d), crc32c::crc32c(d));
        }
    }

    #[test]
    fn a_partial_frame_can_be_taken_out_and_decoding_goes_on_after_it() {
        let (big, next) = (sample(1000), sample(10));
        let (wire_big, wire_next) = (big.to_bytes(), next.to_bytes());
        let mut d = FrameDecoder::new(4096);
        d.extend(&wire_big[..HEADER_LEN - 1]);
        assert_eq!(d.partial_header(), None, "no header yet");
        d.extend(&wire_big[HEADER_LEN - 1..HEADER_LEN + 300]);
        let sent = Header::decode(&wire_big[..HEADER_LEN], 4096).unwrap();
        assert_eq!((sent.len, sent.seq), (1000, 77));
        assert_eq!(d.partial_header(), Some((sent, 300)));
        assert_eq!(d.take_partial(), &big.payload[..300]);
        assert_eq!(d.buffered(), 0);
        // The taker read the rest elsewhere; the stream goes on with the next frame.
        d.extend(&wire_next);
        assert_eq!(d.partial_header(), None, "a complete frame is not partial");
        let (h, p) = d.next_frame().unwrap().unwrap();
        assert_eq!((h, p), (Header::decode(&wire_next[..HEADER_LEN], 4096).unwrap(), &next.payload[..]));
    }

    #[test]
    fn the_buffer_starts_small_and_grows_only_for_a_frame_read_through_it() {
        let max = 1 << 20;
        let (big, next) = (sample(max), sample(10));
        let (wire_big, wire_next) = (big.to_bytes(), next.to_bytes());
        let mut d = FrameDecoder::new(max);
        assert_eq!(d.capacity(), DECODER_START, "not the room for the largest frame up front");
        // A large piece whose header came with part of its payload is taken out and
        // read in place: the buffer never grew for it.
        d.extend(&wire_big[..DECODER_START]);
        assert_eq!(d.next_frame().unwrap(), None);
        let (h, have) = d.partial_header().unwrap();
        assert_eq!((h.len as usize, have), (max, DECODER_START - HEADER_LEN));
        assert_eq!(d.take_partial(), &big.payload[..DECODER_START - HEADER_LEN]);
        d.extend(&wire_next);
        assert_eq!(d.next_frame().unwrap().unwrap().1, &next.payload[..]);
        assert_eq!(d.capacity(), DECODER_START);
        // The same frame read through the decoder, behind a small one, in reads of
        // the decoder's spare room: it grows to hold it, and both come out whole.
        let stream = [&wire_next[..], &wire_big[..]].concat();
        let (mut at, mut got) = (0, Vec::new());
        while got.len() < 2 {
            let spare = d.spare();
            let n = spare.len().min(stream.len() - at).min(DECODER_START);
            spare[..n].copy_from_slice(&stream[at..at + n]);
            d.filled(n);
            at += n;
            while let Some((h, p)) = d.next_frame().unwrap() {
                got.push((h.len as usize, p == &big.payload[..] || p == &next.payload[..]));
            }
        }
        assert_eq!(got, vec![(10, true), (max, true)]);
        assert_eq!(at, stream.len());
        assert!(d.capacity() >= HEADER_LEN + max && d.capacity() <= 4 * max, "{}", d.capacity());
    }

    #[test]
    fn has_frame_says_whether_next_frame_has_something_to_return() {
        let b = sample(100).to_bytes();
        let mut d = FrameDecoder::new(1 << 20);
        assert!(!d.has_frame());
        d.extend(&b[..HEADER_LEN - 1]);
        assert!(!d.has_frame(), "part of a header");
        d.extend(&b[HEADER_LEN - 1..b.len() - 1]);
        assert!(!d.has_frame(), "a header without all of its payload");
        d.extend(&b[b.len() - 1..]);
        assert!(d.has_frame());
        assert!(d.next_frame().unwrap().is_some());
        assert!(!d.has_frame());
        // A header that does not decode is something to return (the error).
        let mut bad = sample(10).to_bytes();
        bad[0] ^= 1;
        d.extend(&bad);
        assert!(d.has_frame());
        assert!(d.next_frame().is_err());
        assert!(d.has_frame(), "a poisoned stream keeps returning its error");
    }

    #[test]
    fn compact_header_errors_name_the_field() {
        let (src, dst) = (Addr::new(1, 1), Addr::new(1, 2));
        let mut b = [0u8; COMPACT_MAX];
        let n = Header::new(Kind::Eager, Channel::Normal, src, dst).encode_compact(10, &mut b);
        assert_eq!(n, 8, "an eager message with tag 0 has an 8-byte header");
        let mut bad = b;
        bad[0] = 99;
        assert_eq!(Header::decode_compact(&bad[..n], src, dst, 100), Err(FrameError::BadKind(99)));
        let mut bad = b;
        bad[1] = 9;
        assert_eq!(Header::decode_compact(&bad[..n], src, dst, 100), Err(FrameError::BadChannel(9)));
        let mut bad = b;
        bad[3] = 0x10;
        assert_eq!(Header::decode_compact(&bad[..n], src, dst, 100), Err(FrameError::BadMask(0x10)));
        assert_eq!(Header::decode_compact(&b[..n], src, dst, 5), Err(FrameError::TooLong { len: 10, max: 5 }));
    }

    proptest! {
        /// Any sequence of frames, split at arbitrary points, decodes to the same frames.
        #[test]
        fn frames_survive_arbitrary_splits(
            lens in proptest::collection::vec(0usize..3000, 1..20),
            cuts in proptest::collection::vec(1usize..500, 1..50),
        ) {
            let frames: Vec<Frame> = lens.iter().enumerate().map(|(i, &l)| {
                let mut f = sample(l);
                f.header.seq = i as u64;
                f
            }).collect();
            let stream: Vec<u8> = frames.iter().flat_map(|f| f.to_bytes()).collect();
            let mut d = FrameDecoder::new(1 << 20);
            let mut out = Vec::new();
            let mut pos = 0;
            let mut ci = 0;
            while pos < stream.len() {
                let step = cuts[ci % cuts.len()].min(stream.len() - pos);
                ci += 1;
                let buf = d.spare();
                let n = step.min(buf.len());
                buf[..n].copy_from_slice(&stream[pos..pos + n]);
                d.filled(n);
                pos += n;
                while let Some((h, p)) = d.next_frame().unwrap() {
                    out.push(Frame { header: h, payload: Bytes::copy_from_slice(p) });
                }
            }
            let want: Vec<Frame> = frames.into_iter().map(|mut f| { f.header.flags |= FLAG_PAYLOAD_CRC; f.header.len = f.payload.len() as u32; f.header.crc = crc32c::crc32c(&f.payload); f }).collect();
            prop_assert_eq!(out, want);
        }

        /// The shared-memory form carries every field the connection does not imply,
        /// in as few bytes as the non-zero fields need.
        #[test]
        fn compact_headers_round_trip(
            kind in 1u8..=12, channel in 0u8..=3, flags in any::<u8>(),
            fields in proptest::array::uniform4(prop_oneof![Just(0u64), any::<u64>()]),
            len in 0usize..100_000,
        ) {
            let (src, dst) = (Addr::new(5, 6), Addr::new(5, 7));
            let mut h = Header::new(Kind::from_u8(kind).unwrap(), Channel::from_u8(channel).unwrap(), src, dst);
            h.flags = flags & !FLAG_PAYLOAD_CRC;
            [h.tag, h.id, h.offset, h.total] = fields;
            let mut out = [0u8; COMPACT_MAX];
            let n = h.encode_compact(len, &mut out);
            prop_assert_eq!(n, 8 + 8 * fields.iter().filter(|&&v| v != 0).count());
            let (back, m) = Header::decode_compact(&out[..n], src, dst, 1 << 20).unwrap();
            prop_assert_eq!(m, n);
            h.len = len as u32;
            prop_assert_eq!(back, h);
            // Every shorter prefix is refused as truncated, never misread.
            for cut in 0..n {
                let truncated = matches!(Header::decode_compact(&out[..cut], src, dst, 1 << 20), Err(FrameError::Truncated { .. }));
                prop_assert!(truncated);
            }
        }

        /// Any single corrupted byte in a frame is either refused or (only in fields no
        /// check covers, of which there are none) decoded unchanged: never silently altered.
        #[test]
        fn any_corruption_is_refused(len in 0usize..200, pos_seed in any::<usize>(), bit in 0u8..8) {
            let f = sample(len);
            let mut b = f.to_bytes();
            let pos = pos_seed % b.len();
            b[pos] ^= 1 << bit;
            let mut d = FrameDecoder::new(1 << 20);
            d.extend(&b);
            match d.next_frame() {
                Err(_) => {}
                Ok(None) => {} // a corrupted length asked for more bytes than exist: nothing delivered
                Ok(Some((h, _))) => prop_assert!(false, "corrupted frame delivered: {:?}", h),
            }
        }
    }
}
