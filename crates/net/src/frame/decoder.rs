//! The receiving half of the codec: bytes in whatever pieces the socket returns,
//! whole frames (or a [`FrameError`]) out, with a header checked as soon as it is in.

use super::*;

/// Incremental decoder for a byte stream of frames.
///
/// Read from the socket into [`FrameDecoder::spare`] and report the count with
/// [`FrameDecoder::filled`]; pull frames with [`FrameDecoder::next_frame`], which lends
/// the payload straight out of the receive buffer so that the consumer can copy it once,
/// directly into its destination (a posted receive buffer or an RMA region). A header is
/// validated as soon as its 88 bytes are in, so an oversized or garbled frame is refused
/// before its payload is buffered.
///
/// The buffer starts at [`DECODER_START`] bytes, whatever the largest frame allowed,
/// and grows (doubling) only while a frame larger than it is read through it. An agent
/// keeps a connection to every other agent it has worked with, and each connection's
/// decoder used to take room for the largest frame up front (2 MiB): on the replayed
/// 36-node cluster the event threads spent 0.37 CPU-s per run zeroing them (`memset`,
/// where the allocator handed back reused memory), although a rendezvous piece is read
/// in place ([`FrameDecoder::take_partial`]) and what goes through the decoder is
/// headers, control frames and eager messages (16 KiB at most by default).
pub struct FrameDecoder {
    buf: Vec<u8>,
    rpos: usize,
    wpos: usize,
    max_payload: usize,
    poisoned: Option<FrameError>,
}

impl FrameDecoder {
    /// A decoder refusing payloads over `max_payload` bytes.
    pub fn new(max_payload: usize) -> Self {
        FrameDecoder { buf: vec![0; DECODER_START], rpos: 0, wpos: 0, max_payload, poisoned: None }
    }

    /// Bytes the buffer holds room for now.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Appends received bytes (tests and callers that already hold the data).
    pub fn extend(&mut self, data: &[u8]) {
        let mut rest = data;
        while !rest.is_empty() {
            let spare = self.spare();
            let n = spare.len().min(rest.len());
            spare[..n].copy_from_slice(&rest[..n]);
            self.filled(n);
            rest = &rest[n..];
        }
    }

    /// Free space after the buffered bytes, to read into. Compacts or grows the buffer
    /// so that it is never empty.
    pub fn spare(&mut self) -> &mut [u8] {
        if self.wpos == self.buf.len() {
            if self.rpos > 0 {
                self.buf.copy_within(self.rpos..self.wpos, 0);
                self.wpos -= self.rpos;
                self.rpos = 0;
            } else {
                let n = self.buf.len() * 2;
                self.buf.resize(n, 0);
            }
        }
        &mut self.buf[self.wpos..]
    }

    /// Records that `n` bytes were written into the slice returned by `spare`.
    pub fn filled(&mut self, n: usize) {
        self.wpos += n;
        debug_assert!(self.wpos <= self.buf.len());
    }

    /// Bytes buffered and not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.wpos - self.rpos
    }

    /// Whether [`FrameDecoder::next_frame`] has something to return now: a header and
    /// as many bytes as it announces, or the error that poisoned the stream. Only the
    /// length is read here; `next_frame` validates the header (a damaged one is an
    /// error there whatever its length says), so the header CRC is computed once.
    pub fn has_frame(&self) -> bool {
        let avail = self.wpos - self.rpos;
        if self.poisoned.is_some() {
            return true;
        }
        if avail < HEADER_LEN {
            return false;
        }
        let len = u32::from_le_bytes(self.buf[self.rpos + LEN_AT..self.rpos + LEN_AT + 4].try_into().unwrap());
        avail - HEADER_LEN >= len as usize
    }

    /// The next complete frame (header and borrowed payload), `Ok(None)` if more bytes
    /// are needed, or the error that poisoned the stream (returned again on every later
    /// call).
    pub fn next_frame(&mut self) -> Result<Option<(Header, &[u8])>, FrameError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let avail = self.wpos - self.rpos;
        if avail < HEADER_LEN {
            self.make_room(HEADER_LEN);
            return Ok(None);
        }
        let header = match Header::decode(&self.buf[self.rpos..self.rpos + HEADER_LEN], self.max_payload) {
            Ok(h) => h,
            Err(e) => {
                self.poisoned = Some(e.clone());
                return Err(e);
            }
        };
        let total = HEADER_LEN + header.len as usize;
        if avail < total {
            self.make_room(total);
            return Ok(None);
        }
        let start = self.rpos + HEADER_LEN;
        let end = start + header.len as usize;
        self.rpos += total;
        if self.rpos == self.wpos {
            // Everything consumed: the next read starts at the front. The payload lent
            // out below stays intact because nothing is written before the next call.
            self.rpos = 0;
            self.wpos = 0;
        }
        if let Err(e) = header.check_payload(&self.buf[start..end]) {
            self.poisoned = Some(e.clone());
            return Err(e);
        }
        Ok(Some((header, &self.buf[start..end])))
    }

    /// The header at the front when its frame is not complete yet: the header (valid,
    /// its checksum checked) and how many payload bytes are buffered. A caller that
    /// has a better place for the payload takes the frame out with
    /// [`FrameDecoder::take_partial`] and reads the rest there itself.
    pub fn partial_header(&self) -> Option<(Header, usize)> {
        // `has_frame` is also true for a poisoned stream: that one is `next_frame`'s.
        if self.has_frame() || self.buffered() < HEADER_LEN {
            return None;
        }
        let h = Header::decode(&self.buf[self.rpos..self.rpos + HEADER_LEN], self.max_payload).ok()?;
        Some((h, self.buffered() - HEADER_LEN))
    }

    /// Takes the incomplete frame reported by [`FrameDecoder::partial_header`] out of
    /// the decoder and lends its buffered payload bytes; the decoder is then empty and
    /// expects the next frame's header. The payload's checksum is the taker's to check.
    pub fn take_partial(&mut self) -> &[u8] {
        debug_assert!(self.partial_header().is_some(), "take_partial without a partial frame");
        let start = self.rpos + HEADER_LEN;
        let end = self.wpos;
        self.rpos = 0;
        self.wpos = 0;
        &self.buf[start..end]
    }

    /// Moves a frame of `need` bytes that would run past the buffer's end to its front.
    /// It does not grow the buffer for a frame larger than it: [`FrameDecoder::spare`]
    /// does, as the bytes come, so that a piece taken out and read in place
    /// ([`FrameDecoder::take_partial`]) never costs the room for its payload.
    fn make_room(&mut self, need: usize) {
        if self.rpos == 0 || self.rpos + need <= self.buf.len() {
            return;
        }
        self.buf.copy_within(self.rpos..self.wpos, 0);
        self.wpos -= self.rpos;
        self.rpos = 0;
    }
}
