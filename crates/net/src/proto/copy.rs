//! Single copy between ports on one node, and copies split between both ends.
//!
//! A rendezvous `Rts` to a port on this node offers the sender's process id and
//! buffer address ([`Remote`]); the receiver copies the message itself with
//! `process_vm_readv` (a [`CopyJob`] its transport carries out outside the port's lock)
//! and answers with a `Cts` flagged `FLAG_SINGLE_COPY`: done, the sender's buffer can
//! go. One copy, the kernel's, instead of one into a ring and one out of it.
//!
//! **Split copies.** A message of at least [`SPLIT_MIN`] bytes whose offer says the
//! sender will help (`FLAG_WRITE` on the `Rts`: its port has an event thread, see
//! [`Proto::help_split_copies`]) is copied by both ends at once: the receiver answers
//! the offer at once with a `Cts` flagged `FLAG_WRITE` that names *its* process and
//! buffer, and starts reading the first half; the sender,
//! which is waiting for that very message to go (or spinning in a ping-pong for the
//! answer), writes the second half into the receiver's buffer with `process_vm_writev`
//! (a [`WriteJob`]) and reports with an empty `Data` frame flagged `FLAG_SINGLE_COPY`.
//! When both halves are in, the receiver completes the receive and sends the final
//! "done" `Cts`. On these machines a copy is bound by the core doing it: two at once
//! move 9.6–10 GB/s where one moves 4.3–5.7 (1 MiB, AMD EPYC guest).
//!
//! Failures fall back to the ring without losing a byte: a receiver whose read is
//! refused asks for `[0, split)` as data pieces (a plain `Cts` with `offset` and
//! `total` set: a range); a sender whose write is refused says so (`FLAG_ERROR` on its
//! report) and the receiver asks for `[split, total)` once its own copy is back, and
//! asks for no more split copies. The receiver's buffer is a [`LentBuf`] while the
//! sender may write into it: abandoned half way (peer failed, port dropped), it is
//! leaked rather than freed under the sender's write.

use super::*;
use crate::lent::LentBuf;

/// Messages at least this large are copied by both ends at once. Shared-memory
/// ping-pong, one way, 5 alternated rounds (AMD EPYC guest): 32 KiB 4.7–5.1 µs split
/// against 5.6–8.7 whole; 64 KiB 6.2–7.0 against 7.9–8.9; 1 MiB 62 against 105–117.
/// Smaller rendezvous messages (16–32 KiB) are left whole: the split halves would be
/// a few pages each.
pub const SPLIT_MIN: usize = 32 * 1024;

/// Where a single-copy message lies in its sender (or, for a split copy's write, where
/// the receiver's buffer lies): process id and address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remote {
    /// The process's id, in its own pid namespace.
    pub pid: u32,
    /// Address of the first byte in that process's memory.
    pub addr: u64,
}

impl Remote {
    pub(super) const LEN: usize = 16;

    pub(super) fn encode(self) -> Bytes {
        let mut b = Vec::with_capacity(Self::LEN);
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.addr.to_le_bytes());
        Bytes::from(b)
    }

    pub(super) fn decode(p: &[u8]) -> Option<Remote> {
        (p.len() == Self::LEN).then(|| Remote {
            pid: u32::from_le_bytes(p[0..4].try_into().unwrap()),
            addr: u64::from_le_bytes(p[8..16].try_into().unwrap()),
        })
    }
}

/// A single-copy offer as an `Rts` makes it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Offer {
    /// Where the message lies.
    pub remote: Remote,
    /// The sender runs write requests promptly (`FLAG_WRITE` on the `Rts`, see
    /// [`Proto::help_split_copies`]): the receiver may split the copy with it.
    pub helps: bool,
}

/// A copy the transport must carry out for a single-copy rendezvous: `len` bytes at
/// `remote` into `buf` (empty, with at least `len` capacity), then hand the job back
/// with [`Proto::copy_done`].
#[derive(Debug)]
pub struct CopyJob {
    /// Where to copy from.
    pub remote: Remote,
    /// How many bytes.
    pub len: usize,
    /// The posted receive buffer to copy into (empty, capacity at least `len`).
    pub buf: Vec<u8>,
    pub(super) req: ReqId,
    pub(super) src: Addr,
    pub(super) tag: u64,
    pub(super) msg: u64,
    /// The first part of a split copy: the sender may be writing the rest of `buf`.
    pub(super) split: bool,
}

impl CopyJob {
    /// The port that offered the copy.
    pub fn src(&self) -> Addr {
        self.src
    }
}

impl Drop for CopyJob {
    fn drop(&mut self) {
        if self.split {
            // Dropped before it came back (its peer failed): the sender may still be
            // writing into the buffer, so it must never be freed (see `LentBuf`).
            std::mem::forget(std::mem::take(&mut self.buf));
        }
    }
}

/// The second part of a split copy, for the sender's transport: write `data` at
/// `remote` (the receiver's buffer), then hand the job back with
/// [`Proto::write_done`].
#[derive(Debug)]
pub struct WriteJob {
    /// The receiver's process and the address to write to.
    pub remote: Remote,
    /// The bytes to write (the message from the split point on).
    pub data: Bytes,
    dst: Addr,
    msg: u64,
    offset: usize,
}

impl WriteJob {
    /// The port whose buffer this writes into.
    pub fn dst(&self) -> Addr {
        self.dst
    }
}

/// Progress of one part of a split receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Part {
    /// Being copied (our read, or the sender's write).
    Copying,
    Done,
    /// The copy was refused; its bytes must be asked for as data pieces.
    Refused,
    /// Asked for as data pieces.
    Fetching,
}

/// A receive whose message both ends are copying (see the module docs).
#[derive(Debug)]
pub(super) struct SplitRecv {
    src: Addr,
    tag: u64,
    msg: u64,
    total: usize,
    /// Bytes in place so far.
    got: usize,
    /// Our read covers `[0, split)`, the sender's write `[split, total)`.
    split: usize,
    buf: LentBuf,
    own: Part,
    peer: Part,
    /// Ranges asked for as data pieces, in the order the pieces arrive: (next, end).
    fetch: VecDeque<(usize, usize)>,
}

impl SplitRecv {
    pub(super) fn src(&self) -> Addr {
        self.src
    }

    pub(super) fn remaining(&self) -> usize {
        self.total - self.got
    }
}

impl Proto {
    /// The next single copy the transport should carry out.
    pub fn next_copy(&mut self) -> Option<CopyJob> {
        self.copies.pop_front()
    }

    /// Declares that this port's transport carries out write requests
    /// ([`Proto::next_write`]) promptly even while the application computes (a port
    /// with an event thread does; one progressed only inside the application's calls
    /// does not, and a receiver would wait for its half). Our single-copy offers then
    /// invite receivers to split their copies with us. Off by default.
    pub fn help_split_copies(&mut self, yes: bool) {
        self.helps_split_copies = yes;
    }

    /// Whether a single copy is waiting for the transport.
    pub fn has_copies(&self) -> bool {
        !self.copies.is_empty()
    }

    /// The next write into a receiver's buffer the transport should carry out.
    pub fn next_write(&mut self) -> Option<WriteJob> {
        self.writes.pop_front()
    }

    /// Receive `id` takes a single-copy offer: copy it whole, or split it with the
    /// sender when it is large and we can name our own buffer.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn accept_copy(&mut self, id: ReqId, src: Addr, tag: u64, msg: u64, total: usize, offer: Offer, buf: Vec<u8>) {
        let remote = offer.remote;
        let me = self.single_copy_pid.filter(|_| offer.helps && self.split_copies && total >= SPLIT_MIN);
        let Some(pid) = me else {
            self.reqs.insert(id, Req::RecvCopy { src, total });
            self.copies.push_back(CopyJob { remote, len: total, buf, req: id, src, tag, msg, split: false });
            return;
        };
        let split = (total / 2) & !4095;
        let mut lent = LentBuf::new(buf);
        let at = Remote { pid, addr: lent.addr(split) };
        let buf = lent.take();
        let r =
            SplitRecv { src, tag, msg, total, got: 0, split, buf: lent, own: Part::Copying, peer: Part::Copying, fetch: VecDeque::new() };
        self.reqs.insert(id, Req::RecvSplit(Box::new(r)));
        self.incoming.insert((src, msg), id);
        self.copies.push_back(CopyJob { remote, len: split, buf, req: id, src, tag, msg, split: true });
        let mut h = self.cts(src, msg);
        h.flags |= FLAG_WRITE;
        h.offset = split as u64;
        h.total = total as u64;
        self.push(src, Queue::Ctrl, OutFrame { frame: Frame { header: h, payload: at.encode() }, completes: None });
    }

    /// The transport carried out `job` (`copied`: `job.buf` now holds its bytes) or
    /// could not (then they are fetched through the transport instead, and single
    /// copy is no longer offered: the system evidently forbids it).
    pub fn copy_done(&mut self, mut job: CopyJob, copied: bool) {
        let buf = std::mem::take(&mut job.buf);
        let (len, req, src, tag, msg) = (job.len, job.req, job.src, job.tag, job.msg);
        if copied {
            self.stats.single_copies += 1;
            self.bulk_moved += len as u64;
        } else {
            self.stats.single_copy_fallbacks += 1;
            self.single_copy_pid = None;
        }
        if job.split {
            let Some(Req::RecvSplit(r)) = self.reqs.get_mut(req) else {
                // The peer failed meanwhile, and its write may still be running.
                std::mem::forget(buf);
                return;
            };
            r.buf.put_back(buf);
            if copied {
                r.own = Part::Done;
                r.got += len;
            } else {
                r.own = Part::Refused;
            }
            self.split_progress(req);
            return;
        }
        if !matches!(self.reqs.get(req), Some(Req::RecvCopy { .. })) {
            // The peer failed meanwhile and the receive was failed with it.
            return;
        }
        let mut h = self.cts(src, msg);
        if copied {
            h.flags |= FLAG_SINGLE_COPY;
            self.complete(req, Ok(Completion::Received(Message { src, tag, data: buf })));
        } else {
            let mut buf = buf;
            buf.clear();
            self.reqs.insert(req, Req::RecvData { src, tag, buf, total: len, got: 0 });
            self.incoming.insert((src, msg), req);
        }
        self.push(src, Queue::Ctrl, OutFrame { frame: Frame::control(h), completes: None });
    }

    /// The sender's side of a `Cts` flagged `FLAG_WRITE`: queue the write of
    /// `[offset, total)` into the receiver's buffer.
    pub(super) fn on_write_request(&mut self, src: Addr, cts: &Header, payload: &[u8]) -> Result<(), NetError> {
        let msg = cts.id;
        let bad = |reason: String| Err(NetError::Protocol { peer: src, reason });
        let Some(Req::SendRts { dst, data, .. }) = self.reqs.get(msg) else {
            return bad(format!("write request for message {msg}, which is not waiting for one"));
        };
        let (offset, len) = (cts.offset as usize, data.len());
        if *dst != src || src.node != self.me.node || cts.total as usize != len || offset >= len {
            return bad(format!("write request for bytes {offset}..{} of message {msg} ({len} bytes to {dst})", cts.total));
        }
        let Some(remote) = Remote::decode(payload) else {
            return bad(format!("write request naming {} bytes, expected {}", payload.len(), Remote::LEN));
        };
        let data = data.slice(offset..);
        let Some(Req::SendRts { dst, data: whole, .. }) = self.reqs.remove(msg) else { unreachable!() };
        self.reqs.insert(msg, Req::SendSplit { dst, data: whole });
        self.writes.push_back(WriteJob { remote, data, dst: src, msg, offset });
        Ok(())
    }

    /// The transport carried out `job` (`written`) or could not; tell the receiver.
    pub fn write_done(&mut self, job: WriteJob, written: bool) {
        if !matches!(self.reqs.get(job.msg), Some(Req::SendSplit { .. })) {
            return; // the receiver failed meanwhile
        }
        let mut h = self.header(Kind::Data, Channel::Normal, job.dst);
        h.id = job.msg;
        h.offset = job.offset as u64;
        h.total = (job.offset + job.data.len()) as u64;
        h.flags |= FLAG_SINGLE_COPY | FLAG_LAST;
        if written {
            self.stats.single_copy_writes += 1;
            self.bulk_moved += job.data.len() as u64;
        } else {
            h.flags |= FLAG_ERROR;
        }
        self.push(job.dst, Queue::Bulk, OutFrame { frame: Frame::control(h), completes: None });
    }

    /// The sender's side of a plain `Cts` for a split message: send `[offset, total)`
    /// as data pieces (the receiver could not have it copied).
    pub(super) fn on_range_request(&mut self, src: Addr, cts: &Header) -> Result<(), NetError> {
        let msg = cts.id;
        let Some(Req::SendSplit { data, .. }) = self.reqs.get(msg) else { unreachable!("checked by on_cts") };
        let (a, b) = (cts.offset as usize, cts.total as usize);
        if a >= b || b > data.len() {
            return Err(NetError::Protocol { peer: src, reason: format!("asked for bytes {a}..{b} of a {}-byte message", data.len()) });
        }
        let data = data.clone();
        self.push_pieces(src, msg, &data, a..b, None, &[]);
        Ok(())
    }

    /// A data frame for split receive `id`: the sender's report on its write, or a
    /// piece of a range we asked for.
    pub(super) fn on_split_data(&mut self, id: ReqId, src: Addr, h: &Header, payload: &[u8]) -> Result<(), NetError> {
        let Some(Req::RecvSplit(r)) = self.reqs.get_mut(id) else { unreachable!("checked by on_data") };
        let bad = |reason: String| Err(NetError::Protocol { peer: src, reason });
        let off = h.offset as usize;
        if h.flags & FLAG_SINGLE_COPY != 0 {
            if r.peer != Part::Copying || off != r.split || h.total as usize != r.total || !payload.is_empty() {
                return bad(format!("report of a write at {off}..{} for message {} (split at {} of {})", h.total, r.msg, r.split, r.total));
            }
            r.buf.returned();
            if h.flags & FLAG_ERROR != 0 {
                r.peer = Part::Refused;
                self.split_copies = false;
            } else {
                r.peer = Part::Done;
                r.got += r.total - r.split;
                self.bulk_moved += (r.total - r.split) as u64;
            }
        } else {
            match r.fetch.front_mut() {
                Some((next, end)) if *next == off && off + payload.len() <= *end => {
                    r.buf.write_at(off, payload);
                    *next += payload.len();
                    if *next == *end {
                        r.fetch.pop_front();
                    }
                    r.got += payload.len();
                    self.bulk_moved += payload.len() as u64;
                }
                _ => return bad(format!("data at {off}+{} of message {}, which was not asked for", payload.len(), r.msg)),
            }
        }
        self.split_progress(id);
        Ok(())
    }

    /// Asks for the parts whose copies were refused (once our buffer is back), and
    /// completes the receive when every byte is in.
    fn split_progress(&mut self, id: ReqId) {
        let Some(Req::RecvSplit(r)) = self.reqs.get_mut(id) else { return };
        let mut ask = Vec::new();
        if r.own == Part::Refused {
            r.own = Part::Fetching;
            ask.push((0, r.split));
        }
        if r.peer == Part::Refused && r.own != Part::Copying {
            r.peer = Part::Fetching;
            ask.push((r.split, r.total));
        }
        r.fetch.extend(ask.iter().copied());
        let (src, msg, done) = (r.src, r.msg, r.got == r.total);
        for (a, b) in ask {
            let mut h = self.cts(src, msg);
            h.offset = a as u64;
            h.total = b as u64;
            self.push(src, Queue::Ctrl, OutFrame { frame: Frame::control(h), completes: None });
        }
        if done {
            self.incoming.remove(&(src, msg));
            let Some(Req::RecvSplit(r)) = self.reqs.remove(id) else { unreachable!() };
            let SplitRecv { src, tag, total, buf, .. } = *r;
            let mut h = self.cts(src, msg);
            h.flags |= FLAG_SINGLE_COPY;
            self.push(src, Queue::Ctrl, OutFrame { frame: Frame::control(h), completes: None });
            self.complete(id, Ok(Completion::Received(Message { src, tag, data: buf.into_message(total) })));
        }
    }
}
