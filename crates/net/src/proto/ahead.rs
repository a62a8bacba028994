//! Checksums of a rendezvous message's pieces, computed while its `Cts` is awaited.
//!
//! Every piece of a message to another node is checksummed (CRC32C) once on each side.
//! Computed when a piece was queued, the sender's pass delayed the first byte; computed
//! after the pieces went to the kernel ([`crate::tcp::SUM_AFTER_MIN`]), it follows the
//! kernel's copy, and the receiver waits for the sum frame it makes. Between the `Rts`
//! and the `Cts`, a TCP round trip, the sender has nothing to do: a waiting
//! application spends that time here ([`Proto::sum_ahead`], called by the port's wait
//! between its looks at the sockets), a step at a time so that the `Cts` is not kept
//! waiting. What is summed by the time the `Cts` comes goes out as pieces with their
//! checksums in their headers (the part of a piece summed so far becomes a shorter
//! piece of its own), not read again (and the kernel's copy then finds the bytes in
//! the cache); the rest is cut and sent as before, its checksums after it. The buffer
//! of a send is immutable ([`Bytes`]) from the call until its completion, so a sum
//! taken early holds.
//!
//! Pieces are summed in order, whole `remote_chunk`s as [`Proto::pieces`] cuts them
//! for a peer on another node, so the summed ones are always a prefix: a receiver
//! never sees a piece with its checksum in its header after one whose checksum is to
//! follow.

use super::*;

/// Sends queued for summing ahead at most: the queue is pruned only from its front
/// (by [`Proto::sum_ahead`], or when a send is queued), so a port whose sends are
/// answered without anyone waiting (an event loop that never calls `wait`) must not
/// grow it without end. Beyond it a send is not summed ahead.
const QUEUED_AT_MOST: usize = 64;

/// What of a rendezvous send's pieces has been checksummed ahead, in piece order.
#[derive(Default)]
pub(super) struct SumsAhead {
    /// Each whole piece summed so far: its length (the last piece of a message may be
    /// shorter than a chunk) and CRC32C.
    done: Vec<(usize, u32)>,
    /// CRC32C of the first `partial_len` bytes of the next piece.
    partial: u32,
    partial_len: usize,
}

impl SumsAhead {
    /// The summed prefix as pieces, `(length, CRC32C)`: the whole pieces, then the part
    /// of the next one summed so far as a shorter piece of its own (so that no step is
    /// wasted when the `Cts` comes in the middle of a piece).
    pub(super) fn into_pieces(self) -> Vec<(usize, u32)> {
        let mut pieces = self.done;
        if self.partial_len > 0 {
            pieces.push((self.partial_len, self.partial));
        }
        pieces
    }
}

impl Proto {
    /// Whether rendezvous sends to other nodes have their pieces' checksums computed
    /// ahead ([`Proto::sum_ahead`]): off for a port whose links are encrypted (their
    /// seals check every byte; no CRC is sent).
    pub fn set_sum_ahead(&mut self, on: bool) {
        self.sums_ahead_wanted = on;
    }

    /// What a rendezvous send to `dst`, about to be created, keeps of its sums ahead:
    /// `Some` if its pieces will carry checksums and the queue has room, and then the
    /// caller queues the send's id in `to_sum`.
    pub(super) fn sums_ahead_for(&mut self, dst: Addr) -> Option<SumsAhead> {
        if !self.sums_ahead_wanted || dst.node == self.me.node {
            return None;
        }
        while let Some(&front) = self.to_sum.front() {
            if matches!(self.reqs.get(front), Some(Req::SendRts { ahead: Some(_), .. })) {
                break;
            }
            self.to_sum.pop_front();
        }
        (self.to_sum.len() < QUEUED_AT_MOST).then(SumsAhead::default)
    }

    /// Checksums at most `step` more bytes of the oldest rendezvous send still awaiting
    /// its `Cts`; whether there was anything to sum. For a thread that would otherwise
    /// spin: each step reads `step` bytes once.
    pub fn sum_ahead(&mut self, step: usize) -> bool {
        let chunk = self.remote_chunk;
        while let Some(&id) = self.to_sum.front() {
            if let Some(Req::SendRts { data, ahead: Some(a), .. }) = self.reqs.get_mut(id) {
                let start = a.done.len() * chunk + a.partial_len;
                if start < data.len() {
                    let piece_end = ((a.done.len() + 1) * chunk).min(data.len());
                    let end = (start + step.max(1)).min(piece_end);
                    a.partial = crate::crc::append(a.partial, &data[start..end]);
                    a.partial_len += end - start;
                    if end == piece_end {
                        a.done.push((a.partial_len, a.partial));
                        a.partial = 0;
                        a.partial_len = 0;
                    }
                    return true;
                }
            }
            // Summed whole, answered (the `Cts` took its sums) or gone.
            self.to_sum.pop_front();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(node: u32, port: u32) -> Addr {
        Addr { node, port }
    }

    /// The data frames `p` queued for `dst`, in order.
    fn data_frames(p: &mut Proto, dst: Addr) -> Vec<Frame> {
        std::iter::from_fn(|| p.pop_frame(dst)).filter(|f| f.frame.header.kind == Kind::Data).map(|f| f.frame).collect()
    }

    fn rts_id(p: &mut Proto, dst: Addr) -> u64 {
        let f = p.pop_frame(dst).expect("the RTS");
        assert_eq!(f.frame.header.kind, Kind::Rts);
        f.frame.header.id
    }

    fn cts(p: &mut Proto, from: Addr, msg: u64) {
        let mut h = Header::new(Kind::Cts, Channel::Normal, from, p.addr());
        h.id = msg;
        p.on_frame(&h, &[]).unwrap();
    }

    #[test]
    fn pieces_summed_before_the_cts_carry_their_checksums_and_the_rest_do_not() {
        let me = addr(1, 1);
        let peer = addr(2, 1);
        let mut p = Proto::new(me, ProtoConfig { eager_threshold: 256, ..ProtoConfig::default() });
        p.set_remote_chunk(1000);
        p.set_sum_ahead(true);
        let data: Bytes = (0..3500u32).map(|i| (i * 7 + i / 13) as u8).collect::<Vec<u8>>().into();
        p.isend(peer, 5, data.clone());
        let msg = rts_id(&mut p, peer);
        // Steps do not cross pieces (300, 300, 300, 100 each): two whole pieces, and
        // the first step of the third.
        for _ in 0..9 {
            assert!(p.sum_ahead(300));
        }
        cts(&mut p, peer, msg);
        assert!(!p.sum_ahead(300), "answered: nothing more to sum ahead");
        let frames = data_frames(&mut p, peer);
        let cut: Vec<(u64, usize)> = frames.iter().map(|f| (f.header.offset, f.payload.len())).collect();
        assert_eq!(cut, [(0, 1000), (1000, 1000), (2000, 300), (2300, 1000), (3300, 200)], "the summed part of a piece is a piece");
        for f in &frames[..3] {
            assert_ne!(f.header.flags & FLAG_PAYLOAD_CRC, 0);
            assert_eq!(f.header.crc, crate::frame::crc32c(&f.payload));
        }
        for f in &frames[3..] {
            assert_eq!(f.header.flags & FLAG_PAYLOAD_CRC, 0, "not summed ahead: its sum follows");
        }
        assert_eq!(frames.iter().filter(|f| f.header.flags & FLAG_LAST != 0).count(), 1);
        assert_ne!(frames[4].header.flags & FLAG_LAST, 0);
        let joined: Vec<u8> = frames.iter().flat_map(|f| f.payload.iter().copied()).collect();
        assert_eq!(joined, data);
    }

    #[test]
    fn a_message_summed_whole_ahead_goes_as_its_usual_pieces_all_with_checksums() {
        let peer = addr(2, 1);
        let mut p = Proto::new(addr(1, 1), ProtoConfig { eager_threshold: 256, ..ProtoConfig::default() });
        p.set_remote_chunk(1000);
        p.set_sum_ahead(true);
        let data: Bytes = (0..2600u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into();
        p.isend(peer, 5, data.clone());
        let msg = rts_id(&mut p, peer);
        let mut steps = 0;
        while p.sum_ahead(4096) {
            steps += 1;
        }
        assert_eq!(steps, 3, "a step never crosses a piece");
        cts(&mut p, peer, msg);
        let frames = data_frames(&mut p, peer);
        let cut: Vec<(u64, usize)> = frames.iter().map(|f| (f.header.offset, f.payload.len())).collect();
        assert_eq!(cut, [(0, 1000), (1000, 1000), (2000, 600)]);
        for f in &frames {
            assert_ne!(f.header.flags & FLAG_PAYLOAD_CRC, 0);
            assert_eq!(f.header.crc, crate::frame::crc32c(&f.payload));
        }
        assert_ne!(frames[2].header.flags & FLAG_LAST, 0);
    }

    #[test]
    fn sends_answered_while_nobody_sums_do_not_pile_up_in_the_queue() {
        // An event loop that never waits: every send is answered, none summed ahead.
        let peer = addr(2, 1);
        let mut p = Proto::new(addr(1, 1), ProtoConfig { eager_threshold: 256, ..ProtoConfig::default() });
        p.set_sum_ahead(true);
        for _ in 0..1000 {
            p.isend(peer, 5, vec![1u8; 1000].into());
            let msg = rts_id(&mut p, peer);
            cts(&mut p, peer, msg);
            assert!(p.to_sum.len() <= 1, "answered sends are dropped from the front");
        }
        // Unanswered ones are capped.
        for _ in 0..1000 {
            p.isend(peer, 5, vec![1u8; 1000].into());
        }
        assert_eq!(p.to_sum.len(), QUEUED_AT_MOST);
    }

    #[test]
    fn only_sends_to_other_nodes_of_a_port_that_wants_it_are_summed_ahead() {
        let me = addr(1, 1);
        let data: Bytes = vec![3u8; 100_000].into();
        let mut off = Proto::new(me, ProtoConfig::default());
        off.isend(addr(2, 1), 0, data.clone());
        assert!(!off.sum_ahead(1 << 20));
        let mut on = Proto::new(me, ProtoConfig::default());
        on.set_sum_ahead(true);
        on.isend(addr(1, 2), 0, data.clone());
        assert!(!on.sum_ahead(1 << 20), "same node: its pieces carry no checksums");
        on.isend(addr(2, 1), 0, data);
        let mut steps = 0;
        while on.sum_ahead(1 << 20) {
            steps += 1;
        }
        assert_eq!(steps, 2, "one step per 64 KiB piece");
    }
}
