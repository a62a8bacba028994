//! The open channel: regions a port exposes, and remote puts and gets into them
//! (BCL-3's RMA channel).
//!
//! A put is cut into pieces like a rendezvous message, each written into the region as
//! it arrives. The owner answers the last piece with an acknowledgement, which is a
//! refusal if any piece fell outside the region, and the put completes on it. A get is
//! one request frame, answered with the bytes in pieces or with a refusal. The owner's
//! application takes no part: the frames are handled by its progress (the event
//! thread, or any call), so a one-sided operation completes while the owner computes;
//! with events on, the owner learns of each finished put or get afterwards
//! (`Event::RemotePut`, `Event::RemoteGet`).

use bytes::Bytes;

use super::*;

impl Proto {
    /// Exposes a zeroed region of `len` bytes for remote put/get.
    pub fn expose(&mut self, region: u64, len: usize) -> Result<(), NetError> {
        if self.regions.contains_key(&region) {
            return Err(NetError::RegionExists(region));
        }
        self.regions.insert(region, vec![0; len]);
        Ok(())
    }

    /// Withdraws an exposed region; later remote accesses to it fail.
    pub fn unexpose(&mut self, region: u64) -> Result<(), NetError> {
        self.regions.remove(&region).map(|_| ()).ok_or(NetError::NoSuchRegion(region))
    }

    /// Local access to an exposed region.
    pub fn region(&mut self, region: u64) -> Result<&mut Vec<u8>, NetError> {
        self.regions.get_mut(&region).ok_or(NetError::NoSuchRegion(region))
    }

    /// Writes `data` into `dst`'s region at `offset`.
    pub fn put(&mut self, dst: Addr, region: u64, offset: u64, data: Bytes) -> ReqId {
        let len = data.len() as u64;
        if let Some(reason) = self.failed_peers.get(&dst) {
            let e = NetError::PeerFailed { peer: dst, reason: reason.clone() };
            return self.fail_now(Req::Put { dst, region, offset, len }, e);
        }
        let id = self.new_req(Req::Put { dst, region, offset, len });
        let pieces = self.pieces(dst, data.len());
        for (i, (a, b)) in pieces.iter().enumerate() {
            let mut h = self.header(Kind::Put, Channel::Open, dst);
            h.tag = region;
            h.id = id;
            h.offset = offset + *a as u64;
            h.total = len;
            if i + 1 == pieces.len() {
                h.flags |= FLAG_LAST;
            }
            self.push(dst, Queue::Bulk, OutFrame { frame: Frame { header: h, payload: data.slice(a..b) }, completes: None });
        }
        id
    }

    /// Reads `len` bytes of `dst`'s region at `offset`.
    pub fn get(&mut self, dst: Addr, region: u64, offset: u64, len: usize) -> ReqId {
        if let Some(reason) = self.failed_peers.get(&dst) {
            let e = NetError::PeerFailed { peer: dst, reason: reason.clone() };
            return self.fail_now(Req::Get { dst, region, offset, buf: Vec::new(), got: 0 }, e);
        }
        let id = self.new_req(Req::Get { dst, region, offset, buf: vec![0; len], got: 0 });
        let mut h = self.header(Kind::GetReq, Channel::Open, dst);
        h.tag = region;
        h.id = id;
        h.offset = offset;
        h.total = len as u64;
        self.push(dst, Queue::Bulk, OutFrame { frame: Frame::control(h), completes: None });
        id
    }

    // ----- frames from peers -----------------------------------------------------------

    pub(super) fn on_put(&mut self, src: Addr, h: &Header, payload: &[u8]) {
        let ok = match self.regions.get_mut(&h.tag) {
            Some(r) if (h.offset as usize).checked_add(payload.len()).is_some_and(|e| e <= r.len()) => {
                r[h.offset as usize..h.offset as usize + payload.len()].copy_from_slice(payload);
                true
            }
            _ => false,
        };
        let me = self.me;
        let events = self.events_enabled;
        let p = self.peer(src);
        if !ok {
            p.failed_puts.insert(h.id);
        }
        if h.flags & FLAG_LAST != 0 {
            let failed = p.failed_puts.remove(&h.id);
            let mut a = Header::new(Kind::PutAck, Channel::Open, me, src);
            a.id = h.id;
            if failed {
                a.flags |= FLAG_ERROR;
            }
            p.ctrl.push_back(OutFrame { frame: Frame::control(a), completes: None });
            self.dirty.insert(src);
            // The last piece ends the put that began `total` bytes before its end (a
            // peer's inconsistent numbers just make no event).
            let start = h.offset.checked_add(payload.len() as u64).and_then(|end| end.checked_sub(h.total));
            if let (true, false, Some(start)) = (events, failed, start) {
                self.events.push_back(Event::RemotePut { from: src, region: h.tag, offset: start, len: h.total });
            }
        }
    }

    pub(super) fn on_put_ack(&mut self, src: Addr, h: &Header) -> Result<(), NetError> {
        let Some(Req::Put { dst, region, offset, len }) = self.reqs.get(h.id) else {
            return Err(NetError::Protocol { peer: src, reason: format!("put-ack for unknown request {}", h.id) });
        };
        let r = if h.flags & FLAG_ERROR != 0 {
            Err(NetError::RegionAccess { peer: *dst, region: *region, offset: *offset, len: *len })
        } else {
            Ok(Completion::Put)
        };
        self.complete(h.id, r);
        Ok(())
    }

    pub(super) fn on_get_req(&mut self, src: Addr, h: &Header) {
        let len = h.total as usize;
        let data = match self.regions.get(&h.tag) {
            Some(r) if (h.offset as usize).checked_add(len).is_some_and(|e| e <= r.len()) => {
                Some(Bytes::copy_from_slice(&r[h.offset as usize..h.offset as usize + len]))
            }
            _ => None,
        };
        match data {
            None => {
                let mut a = self.header(Kind::GetReply, Channel::Open, src);
                a.id = h.id;
                a.flags |= FLAG_ERROR | FLAG_LAST;
                self.push(src, Queue::Ctrl, OutFrame { frame: Frame::control(a), completes: None });
            }
            Some(data) => {
                let pieces = self.pieces(src, len);
                for (i, (a, b)) in pieces.iter().enumerate() {
                    let mut r = self.header(Kind::GetReply, Channel::Open, src);
                    r.id = h.id;
                    r.offset = *a as u64;
                    r.total = len as u64;
                    if i + 1 == pieces.len() {
                        r.flags |= FLAG_LAST;
                    }
                    self.push(src, Queue::Bulk, OutFrame { frame: Frame { header: r, payload: data.slice(a..b) }, completes: None });
                }
                if self.events_enabled {
                    self.events.push_back(Event::RemoteGet { from: src, region: h.tag, offset: h.offset, len: h.total });
                }
            }
        }
    }

    pub(super) fn on_get_reply(&mut self, src: Addr, h: &Header, payload: &[u8]) -> Result<(), NetError> {
        let Some(Req::Get { dst, region, offset, buf, got }) = self.reqs.get_mut(h.id) else {
            return Err(NetError::Protocol { peer: src, reason: format!("get-reply for unknown request {}", h.id) });
        };
        if h.flags & FLAG_ERROR != 0 {
            let e = NetError::RegionAccess { peer: *dst, region: *region, offset: *offset, len: buf.len() as u64 };
            self.complete(h.id, Err(e));
            return Ok(());
        }
        let off = h.offset as usize;
        if off + payload.len() > buf.len() {
            return Err(NetError::Protocol { peer: src, reason: "get-reply beyond requested length".into() });
        }
        buf[off..off + payload.len()].copy_from_slice(payload);
        *got += payload.len();
        self.bulk_moved += payload.len() as u64;
        if h.flags & FLAG_LAST != 0 {
            let Some(Req::Get { buf, .. }) = self.reqs.remove(h.id) else { unreachable!() };
            self.complete(h.id, Ok(Completion::Got(buf)));
        }
        Ok(())
    }
}
