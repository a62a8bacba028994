//! Output: flushing the sans-IO protocol's frames to each peer, into its ring (local)
//! or socket (remote).

use super::*;

impl State {
    pub(super) fn flush_all(&mut self) {
        if !self.proto.has_output() {
            return;
        }
        let mut peers = std::mem::take(&mut self.scratch);
        self.proto.dirty_peers_into(&mut peers);
        for p in peers.drain(..) {
            self.flush(p);
        }
        self.scratch = peers;
    }

    pub(super) fn flush(&mut self, peer: Addr) {
        if peer.node == self.me.node {
            self.flush_shm(peer);
        } else {
            self.flush_tcp(peer);
        }
    }

    pub(super) fn flush_shm(&mut self, peer: Addr) {
        let id = match self.shm_send.get(&peer) {
            Some(&id) => id,
            None => {
                let now = Instant::now();
                if self.shm_retry.get(&peer).is_some_and(|(_, next)| *next > now) {
                    return;
                }
                match self.connect_shm(peer) {
                    Ok(id) => {
                        self.shm_retry.remove(&peer);
                        id
                    }
                    Err(e) => {
                        // Not started yet, or gone: retry for a while, like a TCP link.
                        let (since, _) = *self.shm_retry.entry(peer).or_insert((now, now));
                        if now.duration_since(since) > self.cfg.reconnect_timeout {
                            self.shm_retry.remove(&peer);
                            self.log_error(e.to_string());
                            self.proto.peer_failed(peer, &e.to_string());
                        } else {
                            let wait = now.duration_since(since).clamp(Duration::from_millis(1), Duration::from_millis(100));
                            self.shm_retry.insert(peer, (since, now + wait));
                            self.kick = true;
                        }
                        return;
                    }
                }
            }
        };
        let State { shm, proto, stats, .. } = self;
        let c = shm.get_mut(&id).expect("send connection exists");
        let mut pushed = false;
        let mut hdr = [0u8; COMPACT_MAX];
        while let Some(out) = proto.pop_frame(peer) {
            let n = out.frame.header.encode_compact(out.frame.payload.len(), &mut hdr);
            if c.tx.try_push(&[&hdr[..n], &out.frame.payload]) {
                pushed = true;
                proto.bulk_sent(&out.frame);
                proto.frame_sent(out.completes);
            } else {
                let len = out.frame.payload.len();
                proto.unpop_frame(peer, out);
                c.set_want_space(true);
                if c.tx.fits(COMPACT_MAX + len) {
                    c.set_want_space(false);
                    continue;
                }
                break;
            }
        }
        if pushed {
            if !proto.is_dirty(peer) {
                c.set_want_space(false);
            }
            if c.notify_data() {
                stats.doorbells += 1;
            }
        }
    }

    /// Writes one frame to `h.dst`'s established ring now, if it fits.
    pub(super) fn push_shm_now(&mut self, h: &Header, payload: &[u8]) -> bool {
        let Some(c) = self.shm_send.get(&h.dst).and_then(|id| self.shm.get_mut(id)) else { return false };
        let mut hdr = [0u8; COMPACT_MAX];
        let n = h.encode_compact(payload.len(), &mut hdr);
        if !c.tx.try_push(&[&hdr[..n], payload]) {
            return false;
        }
        if c.notify_data() {
            self.stats.doorbells += 1;
        }
        true
    }

    /// Ends a cork ([`Port::cork`]), writing out what it held back.
    pub(super) fn uncork(&mut self) {
        if self.corked {
            self.corked = false;
            self.flush_all();
            self.flush_tcp_backlog();
        }
    }

    pub(super) fn flush_tcp(&mut self, peer: Addr) {
        /// Queued bytes that are written out at once rather than after the queue fills
        /// (8 MiB): a large message still starts moving while the rest is checksummed,
        /// but each `writev` carries up to 1 MiB of pieces. Every `sendmsg` on a TCP
        /// socket pushes its tail and runs the receiving side's input path for what it
        /// sent, so a 1 MiB message written as four 256 KiB pieces paid that four
        /// times: raw TCP on loopback, 1 MiB ping-pong, 4 × (88 B + 256 KiB) writes
        /// 207–213 µs against 139 µs for one `writev` of the same pieces (8 alternated
        /// rounds); gepsea-net, both processes pinned, 312 → 219 µs (inline) and 505 →
        /// 236 µs (event thread) when the threshold went from 256 KiB to past the
        /// message.
        const WRITE_AT: usize = 1 << 20;
        let link = self.links.entry(peer).or_default();
        let cid = match link.conn {
            Some(cid) => cid,
            None => {
                if link.retry_at.is_none_or(|t| t <= Instant::now()) {
                    self.connect_tcp(peer);
                }
                return;
            }
        };
        let State { tcp, proto, links, corked, .. } = self;
        let link = links.get_mut(&peer).unwrap();
        let Some(c) = tcp.get_mut(&cid) else { return };
        if c.state != ConnState::Established {
            return;
        }
        // Early writes stop once the socket is full: the rest waits for it to drain.
        // Corked, frames are only queued (up to the queue's bound).
        let mut write_early = !*corked;
        while c.queued() < (8 << 20) {
            let Some(out) = proto.pop_frame(peer) else { break };
            let OutFrame { mut frame, completes } = out;
            proto.bulk_sent(&frame);
            frame.header.ack = link.recv.take_ack();
            link.ack_due = None;
            let frame = link.send.stamp(frame);
            c.queue(&frame);
            proto.frame_sent(completes);
            if write_early && c.queued() >= WRITE_AT {
                // Hand the kernel the pieces checksummed so far: the peer copies and
                // checks them while we checksum the next ones, instead of the whole
                // message going through each step one after the other.
                if let Err(e) = c.write_out_leaving_sum() {
                    let msg = format!("write to {peer}: {e}");
                    self.conn_lost(cid, &msg);
                    return;
                }
                write_early = c.queued() < WRITE_AT;
            }
        }
        self.write_unless_corked(cid);
    }
}
