//! The transport side of [`Proto`]: frames out to each peer (credits, queues), frames
//! in and the protocol's reactions to them (eager delivery and matching, rendezvous
//! RTS/CTS/DATA, RMA put and get), and peer failure. Still sans-IO: the port's event
//! loop moves the bytes.

use super::*;

impl Proto {
    // ----- transport side ---------------------------------------------------------

    /// Peers with frames waiting to be sent (cleared as they are drained), appended to
    /// `out` (a reusable buffer: this is on every message's path).
    pub fn dirty_peers_into(&self, out: &mut Vec<Addr>) {
        out.extend(self.dirty.iter().copied());
    }

    /// Whether a request waits on `peer` (a send or RMA to it, a receive from it): a
    /// broken link to such a peer must be re-established or declared failed, even with
    /// nothing to send, or the request would wait forever.
    pub fn waits_on(&self, peer: Addr) -> bool {
        self.reqs.running().any(|(_, r)| r.involves(peer))
    }

    /// Whether frames are waiting for `peer`.
    pub fn is_dirty(&self, peer: Addr) -> bool {
        self.dirty.contains(&peer)
    }

    /// Whether anything is waiting to be sent to anybody.
    pub fn has_output(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// The next frame to send to `peer`, control first, then messages (if credits
    /// allow), then bulk pieces. `None` when nothing can go now.
    pub fn pop_frame(&mut self, peer: Addr) -> Option<OutFrame> {
        let p = self.peers.get_mut(&peer)?;
        let mut out = p.ctrl.pop_front();
        for l in [NORM, SYS] {
            if out.is_some() {
                break;
            }
            if let Some(front) = p.msgs[l].front() {
                let cost = credits_for(front.frame.payload.len(), self.cfg.eager_threshold);
                if front.frame.header.kind != Kind::Eager {
                    out = p.msgs[l].pop_front();
                } else if p.credits[l] >= cost {
                    p.credits[l] -= cost;
                    self.eager_released += front.frame.payload.len() as u64;
                    out = p.msgs[l].pop_front();
                } else {
                    self.stats.credit_stalls += 1;
                }
            }
        }
        if out.is_none() {
            out = p.bulk.pop_front();
        }
        if out.is_none() {
            self.dirty.remove(&peer);
        }
        out
    }

    /// Puts back a frame the transport could not send yet (it goes out first next time).
    pub fn unpop_frame(&mut self, peer: Addr, out: OutFrame) {
        let cost = self.credit_cost(out.frame.payload.len());
        let p = self.peer(peer);
        let l = lane(out.frame.header.channel);
        match out.frame.header.kind {
            Kind::Eager => {
                p.credits[l] += cost;
                p.msgs[l].push_front(out);
            }
            Kind::Rts => p.msgs[l].push_front(out),
            Kind::Cts | Kind::Credit | Kind::PutAck => p.ctrl.push_front(out),
            _ => p.bulk.push_front(out),
        }
        self.dirty.insert(peer);
    }

    /// The transport has written `out` (into a ring, or to TCP with replay retained).
    pub fn frame_sent(&mut self, completes: Option<ReqId>) {
        if let Some(id) = completes {
            self.complete(id, Ok(Completion::Sent));
        }
    }

    /// The transport has written `frame` (as [`Proto::frame_sent`]): counts the
    /// rendezvous bytes it carried, for [`Proto::bulk_bytes_moved`].
    pub fn bulk_sent(&mut self, frame: &Frame) {
        if matches!(frame.header.kind, Kind::Data | Kind::GetReply) {
            self.bulk_moved += frame.payload.len() as u64;
        }
    }

    /// Handles one received frame. An error means the peer broke the protocol; the
    /// transport should drop its connection.
    pub fn on_frame(&mut self, h: &Header, payload: &[u8]) -> Result<(), NetError> {
        self.stats.frames_in += 1;
        let src = h.src;
        if h.dst != self.me {
            return Err(NetError::Protocol { peer: src, reason: format!("frame addressed to {} arrived at {}", h.dst, self.me) });
        }
        if h.kind == Kind::Eager {
            self.eager_arrived(src, h.channel, payload.len())?;
        }
        match (h.kind, h.channel) {
            (Kind::Eager, Channel::System) => {
                self.system_pool.push_back(Message { src, tag: h.tag, data: payload.to_vec() });
                if self.events_enabled {
                    self.events.push_back(Event::SystemMessage { src });
                }
            }
            (Kind::Eager, Channel::Normal) if self.eager_in_place.contains_key(&src) => self.eager_claimed_whole(h, payload)?,
            (Kind::Eager, Channel::Normal) => self.on_eager(src, h.tag, payload),
            (Kind::Rts, Channel::Normal) => {
                let remote = if h.flags & FLAG_SINGLE_COPY != 0 {
                    if src.node != self.me.node {
                        return Err(NetError::Protocol { peer: src, reason: "single-copy offer from another node".into() });
                    }
                    let remote = Remote::decode(payload).ok_or_else(|| NetError::Protocol {
                        peer: src,
                        reason: format!("single-copy offer of {} bytes, expected {}", payload.len(), Remote::LEN),
                    })?;
                    Some(Offer { remote, helps: h.flags & FLAG_WRITE != 0 })
                } else {
                    None
                };
                self.on_rts(src, h.tag, h.id, h.total as usize, remote)?
            }
            (Kind::Cts, _) => self.on_cts(src, h, payload)?,
            (Kind::Data, _) => self.on_data(src, h, payload)?,
            (Kind::Put, _) => self.on_put(src, h, payload),
            (Kind::PutAck, _) => self.on_put_ack(src, h)?,
            (Kind::GetReq, _) => self.on_get_req(src, h),
            (Kind::GetReply, _) => self.on_get_reply(src, h, payload)?,
            (Kind::Credit, _) => {
                let l = if h.tag == SYS as u64 { SYS } else { NORM };
                let max = self.cfg.credits;
                let p = self.peer(src);
                match u32::try_from(h.total).ok().and_then(|n| p.credits[l].checked_add(n)).filter(|&c| c <= max) {
                    Some(c) => p.credits[l] = c,
                    None => {
                        return Err(NetError::Protocol {
                            peer: src,
                            reason: format!("granted {} credits on top of {} (at most {max} exist)", h.total, p.credits[l]),
                        })
                    }
                }
                self.dirty.insert(src);
            }
            (k, c) => {
                return Err(NetError::Protocol { peer: src, reason: format!("unexpected {k:?} frame on {c:?} channel") });
            }
        }
        Ok(())
    }

    /// Fails every request involving `peer` and refuses new ones.
    pub fn peer_failed(&mut self, peer: Addr, reason: &str) {
        self.failed_peers.insert(peer, reason.to_string());
        let err = || NetError::PeerFailed { peer, reason: reason.to_string() };
        let victims: Vec<ReqId> = self.reqs.running().filter(|(_, r)| r.involves(peer)).map(|(id, _)| id).collect();
        for id in victims {
            self.posted.retain(|&r| r != id);
            self.complete(id, Err(err()));
        }
        self.incoming.retain(|(s, _), _| *s != peer);
        self.eager_in_place.remove(&peer);
        self.copies.retain(|j| j.src != peer);
        self.writes.retain(|j| j.dst() != peer);
        self.unexpected.retain(|u| u.src_tag().0 != peer);
        self.peers.remove(&peer);
        self.dirty.remove(&peer);
        if self.events_enabled {
            self.events.push_back(Event::PeerFailed { peer, reason: reason.to_string() });
        }
    }

    /// Forgets a failure so that `peer` may be contacted again (it restarted).
    pub fn peer_recovered(&mut self, peer: Addr) {
        self.failed_peers.remove(&peer);
    }

    // ----- internals --------------------------------------------------------------

    /// The pieces (start, end) a transfer of `len` bytes to `peer` is cut into.
    pub(super) fn pieces(&self, peer: Addr, len: usize) -> Vec<(usize, usize)> {
        if len == 0 {
            return vec![(0, 0)];
        }
        let chunk = if peer.node == self.me.node {
            self.cfg.chunk
        } else {
            self.peers.get(&peer).and_then(|p| p.chunk).unwrap_or(self.remote_chunk)
        };
        (0..len).step_by(chunk).map(|a| (a, (a + chunk).min(len))).collect()
    }

    pub(super) fn credit_returned(&mut self, src: Addr, l: usize, cost: u32) {
        let half = (self.cfg.credits / 2).max(1);
        let me = self.me;
        let p = self.peer(src);
        p.credits_owed[l] += cost;
        if p.credits_owed[l] >= half {
            let mut h = Header::new(Kind::Credit, Channel::Control, me, src);
            h.tag = l as u64;
            h.total = p.credits_owed[l] as u64;
            p.unreturned[l] = p.unreturned[l].saturating_sub(p.credits_owed[l]);
            p.credits_owed[l] = 0;
            p.ctrl.push_back(OutFrame { frame: Frame::control(h), completes: None });
            self.dirty.insert(src);
        }
    }

    /// Counts an eager message against the credits `src` was given (see
    /// `Peer::unreturned`); past them, or larger than an eager message can be, it is a
    /// protocol error.
    fn eager_arrived(&mut self, src: Addr, channel: Channel, len: usize) -> Result<(), NetError> {
        if !matches!(channel, Channel::System | Channel::Normal) {
            return Err(NetError::Protocol { peer: src, reason: format!("eager message on the {channel:?} channel") });
        }
        let l = lane(channel);
        let limit = self.eager_limit(src, channel);
        if len > limit {
            return Err(NetError::Protocol { peer: src, reason: format!("eager message of {len} bytes (the eager limit is {limit})") });
        }
        let max = self.cfg.credits;
        let cost = self.credit_cost(len);
        let p = self.peer(src);
        p.unreturned[l] += cost;
        if p.unreturned[l] > max {
            return Err(NetError::Protocol { peer: src, reason: format!("sent more than its {max} eager credits") });
        }
        Ok(())
    }

    /// Where in the posted queue the receive a message from `src` with `tag` matches
    /// is: the first posted one whose source and tag accept it (MPI order).
    fn first_posted(&self, src: Addr, tag: u64) -> Option<usize> {
        self.posted.iter().position(|id| match self.reqs.get(*id) {
            Some(Req::RecvPosted { src: s, tag: t, .. }) => s.is_none_or(|x| x == src) && t.is_none_or(|x| x == tag),
            _ => false,
        })
    }

    pub(super) fn match_posted(&mut self, src: Addr, tag: u64) -> Option<ReqId> {
        let pos = self.first_posted(src, tag)?;
        self.posted.remove(pos)
    }

    pub(super) fn on_eager(&mut self, src: Addr, tag: u64, payload: &[u8]) {
        match self.match_posted(src, tag) {
            Some(id) => {
                self.credit_returned(src, NORM, self.credit_cost(payload.len()));
                // In place: this is every small message's path.
                self.reqs.finish_with(id, |req| {
                    let Req::RecvPosted { buf, .. } = req else { unreachable!("posted receives are RecvPosted") };
                    filled(src, tag, buf, payload)
                });
                self.completed(id);
            }
            None => {
                self.stats.unexpected += 1;
                let data = self.unexpected_copy(payload);
                self.unexpected.push_back(Unexpected::Eager { src, tag, data });
            }
        }
    }

    pub(super) fn on_rts(&mut self, src: Addr, tag: u64, msg: u64, total: usize, remote: Option<Offer>) -> Result<(), NetError> {
        match self.match_posted(src, tag) {
            Some(id) => {
                let Some(Req::RecvPosted { buf, .. }) = self.reqs.remove(id) else { unreachable!() };
                self.accept_rts(id, src, tag, msg, total, remote, buf);
            }
            None => {
                let max = self.cfg.max_unexpected_rts;
                let p = self.peer(src);
                p.unexpected_rts += 1;
                if p.unexpected_rts > max {
                    return Err(NetError::Protocol {
                        peer: src,
                        reason: format!("announced more than {max} unmatched rendezvous messages"),
                    });
                }
                self.stats.unexpected += 1;
                self.unexpected.push_back(Unexpected::Rts { src, tag, msg, total, remote });
            }
        }
        Ok(())
    }

    /// Receive `id` takes rendezvous message `msg`: queue the single copy it offers, or
    /// answer CTS, or fail on truncation (the sender still gets a CTS so it is not left
    /// hanging; the data is discarded).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn accept_rts(&mut self, id: ReqId, src: Addr, tag: u64, msg: u64, total: usize, remote: Option<Offer>, mut buf: Vec<u8>) {
        let capacity = buf.capacity();
        let truncated = total > capacity;
        buf.clear();
        if let (Some(remote), false) = (remote, truncated) {
            self.accept_copy(id, src, tag, msg, total, remote, buf);
            return;
        }
        self.reqs.insert(id, Req::RecvData { src, tag, buf, total, got: 0 });
        self.incoming.insert((src, msg), id);
        if truncated {
            self.incoming.remove(&(src, msg));
            self.complete(id, Err(NetError::Truncated { len: total, capacity }));
            // Tell the sender to stop: a CTS with the error flag completes its send.
        }
        let mut h = self.cts(src, msg);
        if truncated {
            h.flags |= FLAG_ERROR;
        }
        self.push(src, Queue::Ctrl, OutFrame { frame: Frame::control(h), completes: None });
    }

    pub(super) fn on_cts(&mut self, src: Addr, cts: &Header, payload: &[u8]) -> Result<(), NetError> {
        let msg = cts.id;
        if cts.flags & FLAG_WRITE != 0 {
            return self.on_write_request(src, cts, payload);
        }
        let (dst, data, split, ahead) = match self.reqs.get_mut(msg) {
            Some(Req::SendRts { dst, data, ahead }) => (*dst, data.clone(), false, ahead.take()),
            Some(Req::SendSplit { dst, data }) => (*dst, data.clone(), true, None),
            _ => return Err(NetError::Protocol { peer: src, reason: format!("CTS for unknown message {msg}") }),
        };
        if dst != src {
            return Err(NetError::Protocol { peer: src, reason: format!("CTS for message {msg} sent to {dst}") });
        }
        if split && cts.flags & FLAG_SINGLE_COPY == 0 {
            return self.on_range_request(src, cts);
        }
        if cts.flags & (FLAG_ERROR | FLAG_SINGLE_COPY) != 0 {
            // The receiver refused the message (its buffer was too small and it reported
            // the truncation on its side), or copied it itself: the send is over,
            // nothing more to transfer, the buffer can go.
            self.complete(msg, Ok(Completion::Sent));
            return Ok(());
        }
        let summed = ahead.map(|a| a.into_pieces()).unwrap_or_default();
        self.push_pieces(src, msg, &data, 0..data.len(), Some(msg), &summed);
        Ok(())
    }

    /// Queues bytes `range` of rendezvous message `msg` to `dst` as data pieces, the
    /// last flagged `FLAG_LAST` and completing `completes` once written. `summed`: the
    /// first pieces, `(length, CRC32C)`, whose checksums were computed ahead (`ahead`):
    /// they go in the pieces' headers ([`FLAG_PAYLOAD_CRC`]), so the transport does not
    /// compute them again; the rest of the range is cut as usual.
    pub(super) fn push_pieces(
        &mut self,
        dst: Addr,
        msg: u64,
        data: &Bytes,
        range: std::ops::Range<usize>,
        completes: Option<ReqId>,
        summed: &[(usize, u32)],
    ) {
        let mut pieces = Vec::with_capacity(summed.len());
        let mut at = 0;
        for &(len, _) in summed {
            pieces.push((at, at + len));
            at += len;
        }
        debug_assert!(at <= range.len());
        if at < range.len() || pieces.is_empty() {
            pieces.extend(self.pieces(dst, range.len() - at).into_iter().map(|(a, b)| (at + a, at + b)));
        }
        for (i, (a, b)) in pieces.iter().enumerate() {
            let mut h = self.header(Kind::Data, Channel::Normal, dst);
            h.id = msg;
            h.offset = (range.start + a) as u64;
            h.total = data.len() as u64;
            let last = i + 1 == pieces.len();
            if last {
                h.flags |= FLAG_LAST;
            }
            if let Some(&(_, crc)) = summed.get(i) {
                h.flags |= FLAG_PAYLOAD_CRC;
                h.crc = crc;
            }
            let payload = data.slice(range.start + a..range.start + b);
            self.push(dst, Queue::Bulk, OutFrame { frame: Frame { header: h, payload }, completes: completes.filter(|_| last) });
        }
    }

    pub(super) fn on_data(&mut self, src: Addr, h: &Header, payload: &[u8]) -> Result<(), NetError> {
        let Some(&id) = self.incoming.get(&(src, h.id)) else {
            return Err(NetError::Protocol { peer: src, reason: format!("data for unknown message {}", h.id) });
        };
        if let Some(Req::RecvSplit(_)) = self.reqs.get(id) {
            return self.on_split_data(id, src, h, payload);
        }
        let Some(Req::RecvData { buf, total, .. }) = self.reqs.get_mut(id) else { unreachable!() };
        let off = h.offset as usize;
        if off.checked_add(payload.len()).is_none_or(|end| end > *total) {
            return Err(NetError::Protocol { peer: src, reason: format!("data at {off}+{} beyond message of {total}", payload.len()) });
        }
        // Pieces arrive in order on one connection: append (no zero-fill of the buffer).
        if off == buf.len() {
            buf.extend_from_slice(payload);
        } else {
            if buf.len() < off + payload.len() {
                buf.resize(off + payload.len(), 0);
            }
            buf[off..off + payload.len()].copy_from_slice(payload);
        }
        self.data_arrived(id, src, h.id, payload.len());
        Ok(())
    }

    /// Counts `n` bytes of rendezvous message `msg` (receive `id`) as arrived, and
    /// completes the receive when they were the last.
    fn data_arrived(&mut self, id: ReqId, src: Addr, msg: u64, n: usize) {
        let Some(Req::RecvData { got, total, .. }) = self.reqs.get_mut(id) else { unreachable!() };
        *got += n;
        self.bulk_moved += n as u64;
        if *got == *total {
            self.incoming.remove(&(src, msg));
            let Some(Req::RecvData { src, tag, buf, .. }) = self.reqs.remove(id) else { unreachable!() };
            self.complete(id, Ok(Completion::Received(Message { src, tag, data: buf })));
        }
    }

    /// Where the payload of data frame `h` can be read straight into, by a transport
    /// that receives outside its frame decoder (TCP, `port::remote`): the buffer of the
    /// receive it belongs to, when the frame is addressed here, is the next piece in
    /// order (the buffer holds exactly the bytes before it), and fits the message.
    /// The transport appends the payload, checks it, then calls
    /// [`Proto::data_received_in_place`]; if the frame fails, it cuts the buffer back
    /// to the frame's offset (see [`Proto::rendezvous_buffer`]).
    ///
    /// An eager message of the normal channel is matched here, while its payload is
    /// still on the way (bound to the first posted receive that matches and can hold
    /// it); then the transport calls [`Proto::eager_received_in_place`] instead.
    pub fn direct_destination(&mut self, h: &Header) -> Option<&mut Vec<u8>> {
        if h.dst != self.me {
            return None;
        }
        if h.kind == Kind::Eager {
            return self.claim_eager(h);
        }
        if h.kind != Kind::Data {
            return None;
        }
        let end = (h.offset as usize).checked_add(h.len as usize)?;
        let (buf, total) = self.rendezvous_buffer(h.src, h.id)?;
        (buf.len() as u64 == h.offset && end <= total && end <= buf.capacity()).then_some(buf)
    }

    /// Matches eager message `h` (whose header has arrived, its payload not yet) to the
    /// receive [`Proto::on_eager`] would give it once whole, the first posted one that
    /// matches, when that receive can hold it, and binds the two: the receive leaves
    /// the posted queue (it cannot be cancelled any more) and waits for this frame
    /// alone, also through a reconnect, whose replay of the frame lands in it again.
    /// Matching at the header rather than at the end is the same match: the frame is
    /// the next one delivered from its source, and receives posted meanwhile queue
    /// behind. `None`: no receive is posted for it (or too small); it comes whole.
    fn claim_eager(&mut self, h: &Header) -> Option<&mut Vec<u8>> {
        let len = h.len as usize;
        if h.channel != Channel::Normal || h.offset != 0 || len > self.eager_limit(h.src, h.channel) {
            return None;
        }
        if let Some(&id) = self.eager_in_place.get(&h.src) {
            // The replay of a frame whose connection broke while it was read in place.
            return match self.reqs.get_mut(id) {
                Some(Req::RecvEagerInPlace { seq, buf, .. }) if *seq == h.seq && buf.capacity() >= len => {
                    buf.clear();
                    Some(buf)
                }
                _ => None,
            };
        }
        let pos = self.first_posted(h.src, h.tag)?;
        let id = self.posted[pos];
        if !matches!(self.reqs.get(id), Some(Req::RecvPosted { buf, .. }) if buf.capacity() >= len) {
            // Too small: it fails as truncated when the whole frame is matched.
            return None;
        }
        self.posted.remove(pos);
        let Some(Req::RecvPosted { mut buf, .. }) = self.reqs.remove(id) else { unreachable!("posted receives are RecvPosted") };
        buf.clear();
        self.reqs.insert(id, Req::RecvEagerInPlace { src: h.src, tag: h.tag, seq: h.seq, buf });
        self.eager_in_place.insert(h.src, id);
        self.eager_buffer(h.src)
    }

    /// The buffer the eager message from `src` matched by [`Proto::direct_destination`]
    /// is being read into.
    pub fn eager_buffer(&mut self, src: Addr) -> Option<&mut Vec<u8>> {
        let id = *self.eager_in_place.get(&src)?;
        match self.reqs.get_mut(id) {
            Some(Req::RecvEagerInPlace { buf, .. }) => Some(buf),
            _ => None,
        }
    }

    /// Eager frame `h`, whose payload the transport has read into the buffer named by
    /// [`Proto::direct_destination`] and checked, has arrived: [`Proto::on_frame`]
    /// for it, without the copy.
    pub fn eager_received_in_place(&mut self, h: &Header) -> Result<(), NetError> {
        self.stats.frames_in += 1;
        self.eager_arrived(h.src, h.channel, h.len as usize)?;
        let Some(id) = self.eager_in_place.remove(&h.src) else {
            return Err(NetError::Protocol { peer: h.src, reason: format!("eager frame {} read in place without a receive", h.seq) });
        };
        let Some(Req::RecvEagerInPlace { src, tag, buf, .. }) = self.reqs.remove(id) else {
            unreachable!("claimed receives are RecvEagerInPlace")
        };
        self.credit_returned(src, NORM, self.credit_cost(buf.len()));
        self.complete(id, Ok(Completion::Received(Message { src, tag, data: buf })));
        Ok(())
    }

    /// A claimed eager frame that came whole through the decoder after all (its
    /// replay, after the connection it was read in place on broke). A frame other than
    /// the claimed one breaks the protocol, and the receive stays claimed (the peer's
    /// failure fails it).
    fn eager_claimed_whole(&mut self, h: &Header, payload: &[u8]) -> Result<(), NetError> {
        let id = *self.eager_in_place.get(&h.src).expect("checked by the caller");
        match self.reqs.get(id) {
            Some(Req::RecvEagerInPlace { seq, .. }) if *seq == h.seq => {}
            Some(Req::RecvEagerInPlace { seq, .. }) => {
                return Err(NetError::Protocol { peer: h.src, reason: format!("eager frame {} arrived where frame {seq} was due", h.seq) });
            }
            _ => unreachable!("claimed receives are RecvEagerInPlace"),
        }
        self.eager_in_place.remove(&h.src);
        let Some(Req::RecvEagerInPlace { src, tag, buf, .. }) = self.reqs.remove(id) else { unreachable!("checked above") };
        self.credit_returned(src, NORM, self.credit_cost(payload.len()));
        self.complete(id, filled(src, tag, buf, payload));
        Ok(())
    }

    /// The buffer frame `h`, whose payload a transport reads outside its decoder
    /// ([`Proto::direct_destination`]), goes into: the claimed eager receive's, or the
    /// rendezvous receive's.
    pub fn in_place_buffer(&mut self, h: &Header) -> Option<&mut Vec<u8>> {
        if h.kind == Kind::Eager {
            self.eager_buffer(h.src)
        } else {
            self.rendezvous_buffer(h.src, h.id).map(|(dest, _)| dest)
        }
    }

    /// The buffer rendezvous message `msg` from `src` is being received into, and the
    /// message's length.
    pub fn rendezvous_buffer(&mut self, src: Addr, msg: u64) -> Option<(&mut Vec<u8>, usize)> {
        let &id = self.incoming.get(&(src, msg))?;
        match self.reqs.get_mut(id) {
            Some(Req::RecvData { buf, total, .. }) => Some((buf, *total)),
            _ => None,
        }
    }

    /// Data frame `h`, whose payload the transport has appended to the buffer named by
    /// [`Proto::direct_destination`] and checked, has arrived: [`Proto::on_frame`]
    /// for it, without the copy.
    pub fn data_received_in_place(&mut self, h: &Header) -> Result<(), NetError> {
        self.stats.frames_in += 1;
        let Some(&id) = self.incoming.get(&(h.src, h.id)) else {
            return Err(NetError::Protocol { peer: h.src, reason: format!("data for unknown message {}", h.id) });
        };
        self.data_arrived(id, h.src, h.id, h.len as usize);
        Ok(())
    }
}
