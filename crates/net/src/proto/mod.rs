//! The port protocol as a deterministic state machine (sans-IO).
//!
//! [`Proto`] holds everything one port knows about its messages: posted receives,
//! unexpected messages, the system-channel pool, rendezvous transfers in flight, RMA
//! regions and requests, eager credits per peer. It never touches a socket, a ring or a
//! clock. The transports feed it frames ([`Proto::on_frame`]) and pull the frames it
//! wants sent ([`Proto::pop_frame`]); the application side calls [`Proto::isend`],
//! [`Proto::irecv`] and friends and collects completions with [`Proto::take`]. That is
//! what lets the whole protocol be tested frame by frame without processes (see the tests
//! below and `tests/proto.rs`).
//!
//! Channels:
//! - **System**: a message of at most `eager_threshold` bytes is sent at once and lands in
//!   the receiver's pool without the receiver posting anything. Every eager message costs
//!   the sender one *credit* for that peer; the receiver returns credits once the
//!   application has taken the messages out of the pool. A sender without credits holds
//!   its messages back (flow control): nothing is dropped, memory stays bounded.
//! - **Normal**: tagged messages matched against posted receives in MPI order (first
//!   posted receive whose source and tag match; otherwise queued as unexpected). Small
//!   messages go eagerly (with a credit); large ones by rendezvous: `Rts` → the receiver
//!   matches a posted buffer → `Cts` → `Data` pieces copied straight into that buffer.
//!   Between ports on one node the `Rts` can offer a **single copy** instead: it names
//!   the sender's process and buffer, the receiver copies the message itself (a
//!   [`CopyJob`] the transport carries out) and answers with a `Cts` that says "done".
//!   If the copy fails (the system forbids it) the receiver answers with a plain `Cts`
//!   and the message goes the ring way. From [`SPLIT_MIN`] bytes the copy is split
//!   between both ends: the receiver reads one half while the sender writes the other
//!   into the receiver's buffer (see `proto/copy.rs`).
//! - **Open**: `Put` pieces are written into the owner's exposed region, `GetReq` is
//!   answered with `GetReply` pieces, all by the owner's progress engine without its
//!   application taking part; both sides get completion events.
//!
//! Ordering: per destination and channel, messages (eager and RTS) leave in the order
//! they were issued, and a message waiting for credits holds back the ones behind it.
//! Each channel has its own credits and queue, and control frames (CTS, credits) and
//! bulk pieces (rendezvous data, RMA) bypass both, so a full system pool can never
//! block the normal-channel transfer the application is waiting for.

use std::collections::VecDeque;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use bytes::Bytes;

use crate::error::NetError;
use crate::frame::{Addr, Channel, Frame, Header, Kind, FLAG_ERROR, FLAG_LAST, FLAG_PAYLOAD_CRC, FLAG_SINGLE_COPY, FLAG_WRITE};

pub use crate::reqtable::ReqId;
use crate::reqtable::ReqTable;

mod ahead;
mod copy;
mod moving;
mod rma;
mod transport;

pub use copy::{CopyJob, Remote, WriteJob, SPLIT_MIN};
use copy::{Offer, SplitRecv};

/// Tunables of the protocol.
#[derive(Clone, Debug)]
pub struct ProtoConfig {
    /// Largest message sent eagerly (system channel limit, normal-channel eager limit).
    pub eager_threshold: usize,
    /// Eager messages a sender may have outstanding at one receiver.
    pub credits: u32,
    /// Size of one piece of a rendezvous or RMA transfer.
    pub chunk: usize,
    /// Rendezvous announcements (RTS) one peer may have waiting for a matching receive;
    /// each is only metadata, but a peer announcing without end would grow the
    /// unexpected queue without bound, so one past this is a protocol error.
    pub max_unexpected_rts: u32,
}

impl Default for ProtoConfig {
    fn default() -> Self {
        ProtoConfig { eager_threshold: 16 * 1024, credits: 64, chunk: 64 * 1024, max_unexpected_rts: 4096 }
    }
}

/// A received message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub src: Addr,
    pub tag: u64,
    pub data: Vec<u8>,
}

/// What a completed request produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Completion {
    /// A send finished: its buffer is no longer needed.
    Sent,
    /// A receive matched and filled its buffer.
    Received(Message),
    /// A put was applied at the owner.
    Put,
    /// A get returned these bytes.
    Got(Vec<u8>),
}

/// Something that happened on the port, for applications that watch an event queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Request finished (successfully or not); collect it with `test`/`wait`.
    Completed(ReqId),
    /// A message arrived in the system-channel pool.
    SystemMessage { src: Addr },
    /// A peer wrote into one of our regions.
    RemotePut { from: Addr, region: u64, offset: u64, len: u64 },
    /// A peer read from one of our regions.
    RemoteGet { from: Addr, region: u64, offset: u64, len: u64 },
    /// A peer failed; its requests were failed too.
    PeerFailed { peer: Addr, reason: String },
}

/// A frame the transport should send, and the send request it completes once written.
#[derive(Debug)]
pub struct OutFrame {
    pub frame: Frame,
    pub completes: Option<ReqId>,
}

enum Req {
    /// Eager send queued or written; completes when written.
    SendEager {
        dst: Addr,
    },
    /// Rendezvous send: waiting for CTS, then data pieces queued.
    SendRts {
        dst: Addr,
        data: Bytes,
        /// Its pieces' checksums computed while its `Cts` is awaited (see `ahead`);
        /// `None` when they are not, or once the `Cts` took them.
        ahead: Option<ahead::SumsAhead>,
    },
    /// Rendezvous send whose copy the receiver split with us (see [`copy`]): writing
    /// our part, or sending pieces the receiver asked for, until its final CTS.
    SendSplit {
        dst: Addr,
        data: Bytes,
    },
    /// Posted receive not yet matched.
    RecvPosted {
        src: Option<Addr>,
        tag: Option<u64>,
        buf: Vec<u8>,
    },
    /// Matched to an RTS, data arriving.
    RecvData {
        src: Addr,
        tag: u64,
        buf: Vec<u8>,
        total: usize,
        got: usize,
    },
    /// An eager message from another node matched while its payload was still on the
    /// way: the transport reads it straight into `buf` ([`Proto::direct_destination`]).
    /// Bound to that frame (`seq` on `src`'s link) until it is whole, also across a
    /// reconnect, so that its replay lands in the same receive.
    RecvEagerInPlace {
        src: Addr,
        tag: u64,
        seq: u64,
        buf: Vec<u8>,
    },
    /// Matched to a single-copy RTS; the transport is copying (see [`CopyJob`]).
    RecvCopy {
        src: Addr,
        total: usize,
    },
    /// Matched to a single-copy RTS whose copy is split with the sender.
    RecvSplit(Box<SplitRecv>),
    Put {
        dst: Addr,
        region: u64,
        offset: u64,
        len: u64,
    },
    Get {
        dst: Addr,
        region: u64,
        offset: u64,
        buf: Vec<u8>,
        got: usize,
    },
}

impl Req {
    /// Whether this request depends on `peer` (and fails with it).
    fn involves(&self, peer: Addr) -> bool {
        match self {
            Req::SendEager { dst } | Req::SendRts { dst, .. } | Req::SendSplit { dst, .. } => *dst == peer,
            Req::RecvPosted { src, .. } => *src == Some(peer),
            Req::RecvData { src, .. } | Req::RecvCopy { src, .. } | Req::RecvEagerInPlace { src, .. } => *src == peer,
            Req::RecvSplit(r) => r.src() == peer,
            Req::Put { dst, .. } | Req::Get { dst, .. } => *dst == peer,
        }
    }
}

enum Unexpected {
    Eager { src: Addr, tag: u64, data: Vec<u8> },
    Rts { src: Addr, tag: u64, msg: u64, total: usize, remote: Option<Offer> },
}

impl Unexpected {
    fn src_tag(&self) -> (Addr, u64) {
        match self {
            Unexpected::Eager { src, tag, .. } | Unexpected::Rts { src, tag, .. } => (*src, *tag),
        }
    }
}

/// Credits an eager message of `len` bytes costs: one per `eager_threshold` bytes,
/// rounded up (one for every message the shared-memory limit allows). A free function
/// so that `pop_frame` can charge it while it holds a peer's state.
fn credits_for(len: usize, eager_threshold: usize) -> u32 {
    len.div_ceil(eager_threshold.max(1)).max(1) as u32
}

/// A receive's result once `payload` is for `buf`: the message, or truncation when
/// `buf` cannot hold it (its capacity is the receive's limit).
fn filled(src: Addr, tag: u64, mut buf: Vec<u8>, payload: &[u8]) -> Result<Completion, NetError> {
    if payload.len() > buf.capacity() {
        return Err(NetError::Truncated { len: payload.len(), capacity: buf.capacity() });
    }
    buf.clear();
    buf.extend_from_slice(payload);
    Ok(Completion::Received(Message { src, tag, data: buf }))
}

/// Index of a channel's own credit pool and message queue.
const SYS: usize = 0;
const NORM: usize = 1;

fn lane(c: Channel) -> usize {
    if c == Channel::System {
        SYS
    } else {
        NORM
    }
}

#[derive(Default)]
struct Peer {
    /// Eager credits per lane (system, normal): a stalled system channel never holds
    /// back the normal channel, or an application waiting for a normal-channel message
    /// while not draining its pool would deadlock.
    credits: [u32; 2],
    credits_owed: [u32; 2],
    /// Eager messages received from this peer per lane and not yet credited back: the
    /// credit contract, checked on the receiving side. A peer that sends past its
    /// credits (or grants back more than it was given) breaks the protocol and is
    /// dropped, so what one peer can park in this port's pools is bounded by
    /// `credits × eager_threshold` per lane.
    unreturned: [u32; 2],
    /// This peer's RTS waiting in the unexpected queue (bounded by `max_unexpected_rts`).
    unexpected_rts: u32,
    ctrl: VecDeque<OutFrame>,
    msgs: [VecDeque<OutFrame>; 2],
    bulk: VecDeque<OutFrame>,
    /// Pieces of a put that fell outside the region, by request id.
    failed_puts: HashSet<u64>,
    /// The size transfers to this peer are cut into, in place of the remote chunk
    /// ([`Proto::set_peer_chunk`]).
    chunk: Option<usize>,
}

/// Counters for diagnostics and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProtoStats {
    pub eager_sent: u64,
    pub rendezvous_sent: u64,
    pub unexpected: u64,
    pub credit_stalls: u64,
    pub frames_in: u64,
    /// Rendezvous messages received by single copy.
    pub single_copies: u64,
    /// Single copies that failed and went through the ring instead.
    pub single_copy_fallbacks: u64,
    /// Parts of split copies this port wrote into its receivers' buffers.
    pub single_copy_writes: u64,
}

/// The protocol state of one port.
pub struct Proto {
    me: Addr,
    cfg: ProtoConfig,
    peers: HashMap<Addr, Peer>,
    reqs: ReqTable<Req, Result<Completion, NetError>>,
    posted: VecDeque<ReqId>,
    unexpected: VecDeque<Unexpected>,
    system_pool: VecDeque<Message>,
    /// (source, sender's message id) → our receive request, for rendezvous data.
    incoming: HashMap<(Addr, u64), ReqId>,
    regions: HashMap<u64, Vec<u8>>,
    events: VecDeque<Event>,
    events_enabled: bool,
    /// Requests whose completion nobody will ask about ([`Proto::detach`]).
    detached: HashSet<ReqId>,
    dirty: HashSet<Addr>,
    /// Ids of sends finished at once ([`Proto::direct_eager`]), which never enter the
    /// table.
    next_direct: ReqId,
    failed_peers: HashMap<Addr, String>,
    completions: u64,
    /// Our process id when single copy is offered to peers on this node.
    single_copy_pid: Option<u32>,
    copies: VecDeque<CopyJob>,
    writes: VecDeque<WriteJob>,
    /// Large single copies are split with the sender (off once a sender could not
    /// write into our buffer).
    split_copies: bool,
    /// Our offers invite receivers to split their copies with us
    /// ([`Proto::help_split_copies`]).
    helps_split_copies: bool,
    pub stats: ProtoStats,
    bulk_moved: u64,
    /// Payload bytes of eager messages that left their queue so far (for
    /// [`Proto::eager_bytes_released`]).
    eager_released: u64,
    /// Piece size for peers on other nodes ([`Proto::set_remote_chunk`]).
    remote_chunk: usize,
    /// Eager limit of the normal channel for peers on other nodes
    /// ([`Proto::set_remote_eager`]).
    remote_eager: usize,
    /// Per source, the receive an eager message is being read into in place
    /// ([`Req::RecvEagerInPlace`]).
    eager_in_place: HashMap<Addr, ReqId>,
    /// Buffers of large eager messages that arrived before their receive, kept for the
    /// next ones ([`Proto::unexpected_copy`]).
    spare_buffers: Vec<Vec<u8>>,
    /// Rendezvous sends whose pieces may be summed ahead, oldest first (`ahead`).
    to_sum: VecDeque<ReqId>,
    /// [`Proto::set_sum_ahead`].
    sums_ahead_wanted: bool,
}

impl Proto {
    /// A fresh port state for address `me`.
    pub fn new(me: Addr, cfg: ProtoConfig) -> Self {
        assert!(cfg.chunk > 0 && cfg.credits > 0);
        Proto {
            remote_chunk: cfg.chunk,
            remote_eager: cfg.eager_threshold,
            eager_in_place: HashMap::default(),
            spare_buffers: Vec::new(),
            to_sum: VecDeque::new(),
            sums_ahead_wanted: false,
            me,
            cfg,
            peers: HashMap::default(),
            reqs: ReqTable::default(),
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
            system_pool: VecDeque::new(),
            incoming: HashMap::default(),
            regions: HashMap::default(),
            events: VecDeque::new(),
            events_enabled: false,
            dirty: HashSet::default(),
            next_direct: 1,
            failed_peers: HashMap::default(),
            completions: 0,
            single_copy_pid: None,
            copies: VecDeque::new(),
            writes: VecDeque::new(),
            split_copies: true,
            helps_split_copies: false,
            detached: HashSet::default(),
            stats: ProtoStats::default(),
            bulk_moved: 0,
            eager_released: 0,
        }
    }

    /// This port's address.
    pub fn addr(&self) -> Addr {
        self.me
    }

    /// Offers single copy (see the module docs) for rendezvous messages to ports on
    /// this node; `pid` is this process's id. `None`: stop offering it.
    pub fn offer_single_copy(&mut self, pid: Option<u32>) {
        self.single_copy_pid = pid;
    }

    /// The configuration in force.
    pub fn config(&self) -> &ProtoConfig {
        &self.cfg
    }

    fn peer(&mut self, a: Addr) -> &mut Peer {
        let credits = self.cfg.credits;
        self.peers.entry(a).or_insert_with(|| Peer { credits: [credits; 2], ..Default::default() })
    }

    fn new_req(&mut self, r: Req) -> ReqId {
        self.reqs.alloc(r)
    }

    fn header(&self, kind: Kind, channel: Channel, dst: Addr) -> Header {
        Header::new(kind, channel, self.me, dst)
    }

    /// A receiver's answer to `src`'s offer of message `msg` (clear to send, a range to
    /// fetch, or done), before its flags, range or payload.
    fn cts(&self, src: Addr, msg: u64) -> Header {
        let mut h = self.header(Kind::Cts, Channel::Normal, src);
        h.id = msg;
        h
    }

    /// Requests completed so far (lets a spinning waiter notice progress made by
    /// another thread without re-running the protocol).
    pub fn completions(&self) -> u64 {
        self.completions
    }

    fn complete(&mut self, id: ReqId, r: Result<Completion, NetError>) {
        self.reqs.finish(id, r);
        self.completed(id);
    }

    /// Bookkeeping for a request that just finished.
    fn completed(&mut self, id: ReqId) {
        self.completions += 1;
        if !self.detached.is_empty() && self.detached.remove(&id) {
            self.reqs.take_done(id);
            return;
        }
        if self.events_enabled {
            self.events.push_back(Event::Completed(id));
        }
    }

    fn fail_now(&mut self, r: Req, e: NetError) -> ReqId {
        let id = self.new_req(r);
        self.complete(id, Err(e));
        id
    }

    fn push(&mut self, dst: Addr, q: Queue, out: OutFrame) {
        let p = self.peer(dst);
        match q {
            Queue::Ctrl => p.ctrl.push_back(out),
            Queue::Msg => p.msgs[lane(out.frame.header.channel)].push_back(out),
            Queue::Bulk => p.bulk.push_back(out),
        }
        self.dirty.insert(dst);
    }

    // ----- application side -------------------------------------------------------

    /// Starts a tagged send on the normal channel.
    pub fn isend(&mut self, dst: Addr, tag: u64, data: Bytes) -> ReqId {
        if let Some(reason) = self.failed_peers.get(&dst) {
            let e = NetError::PeerFailed { peer: dst, reason: reason.clone() };
            return self.fail_now(Req::SendEager { dst }, e);
        }
        if data.len() <= self.eager_limit(dst, Channel::Normal) {
            let id = self.new_req(Req::SendEager { dst });
            let mut h = self.header(Kind::Eager, Channel::Normal, dst);
            h.tag = tag;
            self.stats.eager_sent += 1;
            self.push(dst, Queue::Msg, OutFrame { frame: Frame { header: h, payload: data }, completes: Some(id) });
            id
        } else {
            let total = data.len() as u64;
            let offer = self.single_copy_pid.filter(|_| dst.node == self.me.node).map(|pid| Remote { pid, addr: data.as_ptr() as u64 });
            let ahead = self.sums_ahead_for(dst);
            let sum_ahead = ahead.is_some();
            let id = self.new_req(Req::SendRts { dst, data, ahead });
            if sum_ahead {
                self.to_sum.push_back(id);
            }
            let mut h = self.header(Kind::Rts, Channel::Normal, dst);
            h.tag = tag;
            h.id = id;
            h.total = total;
            self.stats.rendezvous_sent += 1;
            let frame = match offer {
                // The buffer stays alive (and immutable) in the request until the
                // receiver's `Cts` says it has copied it.
                Some(r) => {
                    h.flags |= FLAG_SINGLE_COPY;
                    if self.helps_split_copies {
                        h.flags |= FLAG_WRITE;
                    }
                    Frame { header: h, payload: r.encode() }
                }
                None => Frame::control(h),
            };
            self.push(dst, Queue::Msg, OutFrame { frame, completes: None });
            id
        }
    }

    /// Fast path for a small message (`channel` system or normal) that the transport
    /// can write at once: when nothing is queued to `dst` ahead of it (control frames or
    /// messages on its lane) and a credit is free, takes the credit and returns the
    /// header to write and an id for the send, which is finished as soon as it is
    /// written and never enters the request table. `None`: use
    /// [`Proto::isend`]/[`Proto::send_system`] (which also report failed peers and
    /// oversized messages). If the transport cannot write it after all it must call
    /// [`Proto::direct_eager_unsent`].
    pub fn direct_eager(&mut self, dst: Addr, channel: Channel, tag: u64, len: usize) -> Option<(Header, ReqId)> {
        // With events on, the application expects an event for every send it made.
        if self.events_enabled {
            return None;
        }
        self.direct_eager_detached(dst, channel, tag, len)
    }

    /// [`Proto::direct_eager`] for a send nobody will ask about (see
    /// [`Proto::detach`]): taken even when events are on, since it raises none.
    pub fn direct_eager_detached(&mut self, dst: Addr, channel: Channel, tag: u64, len: usize) -> Option<(Header, ReqId)> {
        if len > self.cfg.eager_threshold || channel == Channel::Open || channel == Channel::Control {
            return None;
        }
        let p = self.peers.get_mut(&dst)?;
        let l = lane(channel);
        if p.credits[l] == 0 || !p.msgs[l].is_empty() || !p.ctrl.is_empty() {
            return None;
        }
        p.credits[l] -= 1;
        self.stats.eager_sent += 1;
        let mut h = Header::new(Kind::Eager, channel, self.me, dst);
        h.tag = tag;
        // Below 2^32, apart from the table's ids (whose generation is at least 1).
        let id = self.next_direct;
        self.next_direct = if self.next_direct >= u32::MAX as u64 { 1 } else { self.next_direct + 1 };
        Some((h, id))
    }

    /// Returns the credit of a [`Proto::direct_eager`] send that was not written.
    pub fn direct_eager_unsent(&mut self, dst: Addr, channel: Channel) {
        if let Some(p) = self.peers.get_mut(&dst) {
            p.credits[lane(channel)] += 1;
            self.stats.eager_sent -= 1;
        }
    }

    /// Sends a small message into `dst`'s system pool.
    pub fn send_system(&mut self, dst: Addr, tag: u64, data: Bytes) -> ReqId {
        if data.len() > self.cfg.eager_threshold {
            let e = NetError::TooLargeForSystemChannel { len: data.len(), max: self.cfg.eager_threshold };
            return self.fail_now(Req::SendEager { dst }, e);
        }
        if let Some(reason) = self.failed_peers.get(&dst) {
            let e = NetError::PeerFailed { peer: dst, reason: reason.clone() };
            return self.fail_now(Req::SendEager { dst }, e);
        }
        let id = self.new_req(Req::SendEager { dst });
        let mut h = self.header(Kind::Eager, Channel::System, dst);
        h.tag = tag;
        self.stats.eager_sent += 1;
        self.push(dst, Queue::Msg, OutFrame { frame: Frame { header: h, payload: data }, completes: Some(id) });
        id
    }

    /// Takes the oldest message from the system pool.
    pub fn recv_system(&mut self) -> Option<Message> {
        let m = self.system_pool.pop_front()?;
        self.credit_returned(m.src, SYS, self.credit_cost(m.data.len()));
        Some(m)
    }

    /// Messages waiting in the system pool.
    pub fn system_pending(&self) -> usize {
        self.system_pool.len()
    }

    /// Posts a receive for a message from `src` (any if `None`) with `tag` (any if
    /// `None`), into a new buffer of `capacity` bytes.
    pub fn irecv(&mut self, src: Option<Addr>, tag: Option<u64>, capacity: usize) -> ReqId {
        self.irecv_into(src, tag, Vec::with_capacity(capacity))
    }

    /// Like [`Proto::irecv`], receiving into `buf` (its capacity is the limit; its
    /// contents are replaced). Reusing buffers avoids page faults on large messages.
    pub fn irecv_into(&mut self, src: Option<Addr>, tag: Option<u64>, mut buf: Vec<u8>) -> ReqId {
        buf.clear();
        let matches = |u: &Unexpected| {
            let (s, t) = u.src_tag();
            src.is_none_or(|x| x == s) && tag.is_none_or(|x| x == t)
        };
        if let Some(pos) = self.unexpected.iter().position(matches) {
            let u = self.unexpected.remove(pos).unwrap();
            match u {
                Unexpected::Eager { src, tag, data } => {
                    self.credit_returned(src, NORM, self.credit_cost(data.len()));
                    let id = self.new_req(Req::RecvPosted { src: Some(src), tag: Some(tag), buf: Vec::new() });
                    self.complete(id, filled(src, tag, buf, &data));
                    self.spare(data);
                    return id;
                }
                Unexpected::Rts { src, tag, msg, total, remote } => {
                    let p = self.peer(src);
                    p.unexpected_rts = p.unexpected_rts.saturating_sub(1);
                    let id = self.new_req(Req::RecvPosted { src: Some(src), tag: Some(tag), buf: Vec::new() });
                    self.accept_rts(id, src, tag, msg, total, remote, buf);
                    return id;
                }
            }
        }
        if let Some(s) = src {
            if let Some(reason) = self.failed_peers.get(&s) {
                let e = NetError::PeerFailed { peer: s, reason: reason.clone() };
                return self.fail_now(Req::RecvPosted { src, tag, buf: Vec::new() }, e);
            }
        }
        let id = self.new_req(Req::RecvPosted { src, tag, buf });
        self.posted.push_back(id);
        id
    }

    /// Cancels a posted receive that has not matched yet. Returns whether it was
    /// cancelled (a started transfer cannot be).
    pub fn cancel(&mut self, id: ReqId) -> bool {
        if let Some(Req::RecvPosted { .. }) = self.reqs.get(id) {
            self.posted.retain(|&r| r != id);
            self.complete(id, Err(NetError::Cancelled));
            true
        } else {
            false
        }
    }

    /// Cuts transfers to peers on other nodes into pieces of `chunk` bytes (those on
    /// this node keep [`ProtoConfig::chunk`], which their rings are sized for). The
    /// port sets it from [`crate::PortConfig::tcp_chunk`].
    pub fn set_remote_chunk(&mut self, chunk: usize) {
        assert!(chunk > 0);
        self.remote_chunk = chunk;
    }

    /// Cuts transfers to `peer` into pieces of `chunk` bytes rather than the remote chunk
    /// (`None`: back to it). The port sets it for a link whose ends both trust TCP for
    /// data, whose pieces carry no checksum and may be as large as a frame: without the
    /// passes, fewer and larger reads paid (1 GiB streams on loopback, medians of 4
    /// alternated rounds: 1 MiB pieces against 256 KiB, 1 MiB messages 10.05 against
    /// 9.4 GB/s, 4 MiB messages 8.2 against 7.7), while with checksums they did not.
    pub fn set_peer_chunk(&mut self, peer: Addr, chunk: Option<usize>) {
        self.peer(peer).chunk = chunk.filter(|&c| c > 0);
    }

    /// Sends normal-channel messages of up to `limit` bytes to peers on other nodes
    /// eagerly (those on this node keep [`ProtoConfig::eager_threshold`], where a
    /// rendezvous is a single copy). Both ends of a link must agree: a receiver refuses
    /// a larger eager message. An eager message costs one credit per
    /// `eager_threshold` bytes, rounded up, so what a peer can park in
    /// this port stays `credits × eager_threshold` per lane. The port sets it from
    /// [`crate::PortConfig::tcp_eager`].
    pub fn set_remote_eager(&mut self, limit: usize) {
        // Never more than all of a lane's credits (it could never be sent).
        let most = self.cfg.eager_threshold.saturating_mul(self.cfg.credits as usize);
        self.remote_eager = limit.min(most).max(self.cfg.eager_threshold);
    }

    /// Buffers kept for large unexpected eager messages: a 64 KiB message that arrives
    /// before its receive is copied out of the connection's decoder, and a fresh buffer
    /// each time page-faulted (glibc gives freed memory of that size back), about 1,000
    /// faults per 256 MiB stream.
    const SPARE_BUFFERS: usize = 16;

    /// A copy of `payload` for the unexpected queue, in a kept buffer when it is larger
    /// than the shared-memory eager limit. A new buffer holds the credits the message
    /// cost (its length rounded up to `eager_threshold`), so the memory parked stays
    /// within the credit bound, plus the kept buffers.
    fn unexpected_copy(&mut self, payload: &[u8]) -> Vec<u8> {
        let threshold = self.cfg.eager_threshold;
        if payload.len() <= threshold {
            return payload.to_vec();
        }
        let mut data = match self.spare_buffers.iter().position(|b| b.capacity() >= payload.len()) {
            Some(i) => self.spare_buffers.swap_remove(i),
            None => Vec::with_capacity(payload.len().next_multiple_of(threshold)),
        };
        data.clear();
        data.extend_from_slice(payload);
        data
    }

    /// Keeps `data`, an unexpected message's buffer whose contents were delivered, for
    /// [`Proto::unexpected_copy`].
    fn spare(&mut self, data: Vec<u8>) {
        if data.capacity() > self.cfg.eager_threshold && self.spare_buffers.len() < Self::SPARE_BUFFERS {
            self.spare_buffers.push(data);
        }
    }

    /// The largest message sent eagerly to `peer` on `channel`.
    fn eager_limit(&self, peer: Addr, channel: Channel) -> usize {
        if channel == Channel::Normal && peer.node != self.me.node {
            self.remote_eager
        } else {
            self.cfg.eager_threshold
        }
    }

    /// Credits an eager message of `len` bytes costs ([`credits_for`]).
    fn credit_cost(&self, len: usize) -> u32 {
        credits_for(len, self.cfg.eager_threshold)
    }

    /// Removes and returns the result of a finished request; `None` while it runs.
    pub fn take(&mut self, id: ReqId) -> Option<Result<Completion, NetError>> {
        self.reqs.take_done(id)
    }

    /// Whether `id` names a request that is still running or has a result to collect.
    pub fn is_known(&self, id: ReqId) -> bool {
        self.reqs.is_known(id)
    }

    /// Whether the request has finished.
    pub fn is_done(&self, id: ReqId) -> bool {
        self.reqs.is_done(id)
    }

    /// Removes the result of `id` if it is a successful send (see `Port::isend`).
    pub fn take_if_sent(&mut self, id: ReqId) -> bool {
        if matches!(self.reqs.peek_done(id), Some(Ok(Completion::Sent))) {
            self.reqs.take_done(id);
            true
        } else {
            false
        }
    }

    /// Forgets request `id` (a send): its completion raises no event and is not kept
    /// for `test`/`wait`. For replies and notifications whose sender has nothing to do
    /// once they are out; a send that cannot be delivered shows up as its peer's
    /// failure ([`Event::PeerFailed`]) all the same.
    pub fn detach(&mut self, id: ReqId) {
        if self.reqs.is_done(id) {
            // Failed at once: its event, if any, is already queued.
            self.reqs.take_done(id);
            self.events.retain(|e| !matches!(e, Event::Completed(c) if *c == id));
        } else if self.reqs.is_known(id) {
            self.detached.insert(id);
        }
    }

    /// Whether events are being recorded.
    pub fn events_enabled(&self) -> bool {
        self.events_enabled
    }

    /// Starts recording events (see [`Event`]); off by default so that a port whose
    /// application never reads events does not accumulate them.
    pub fn enable_events(&mut self) {
        self.events_enabled = true;
    }

    /// Oldest unread event.
    pub fn next_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Events waiting to be read.
    pub fn events_pending(&self) -> usize {
        self.events.len()
    }
}

#[derive(Clone, Copy)]
enum Queue {
    Ctrl,
    Msg,
    Bulk,
}
