//! [`Port`]: one process's endpoint, and the event loop that drives its transports.
//!
//! All state lives in one `State` behind a mutex: the sans-IO [`Proto`], the shared
//! memory connections, the TCP connections and links. Two kinds of thread make
//! progress on it:
//!
//! - The **event thread** ([`Progress::Thread`], the default) sleeps in `epoll` (through
//!   mio) on every descriptor the port owns — listeners, TCP sockets, the shared-memory
//!   doorbells — and wakes only when the kernel reports something. It completes posted
//!   receives, answers rendezvous requests and RMA while the application computes and
//!   never calls the library. Idle, it sleeps: no core is burnt.
//! - The **application thread**, inside `isend`/`test`/`wait`, pushes its own sends
//!   straight into the ring or socket (no hand-off, so no wake-up on the send path), and
//!   in `wait` spins for a bounded time (`spin`, default 50 µs) polling the rings before
//!   it sleeps on a condition variable. While it spins it marks the port awake so that
//!   shared-memory peers skip the doorbell.
//!
//! [`Progress::Inline`] drops the event thread: progress happens only inside library
//! calls, and `wait` polls the descriptors itself. That is the classic MPI progress
//! engine, kept as the baseline the overlap benchmark measures against.

use std::collections::{HashMap, HashSet};

use rustc_hash::FxHashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use parking_lot::{Condvar, Mutex, MutexGuard};
use tracing::{debug, warn};

use crate::error::NetError;
use crate::frame::{Addr, Channel, Frame, Header, Kind, COMPACT_MAX};
use crate::proto::{Completion, Event, Message, OutFrame, Proto, ProtoConfig, ReqId};
use crate::reliable::Admit;
use crate::shm::{Bell, ShmConn};
use crate::tcp::{ConnState, Link, ReadOutcome, TcpConn};

mod api;
mod event_loop;
mod local;
mod output;
mod remote;
mod tcp_set;
mod wait;

use event_loop::*;

/// How communication makes progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Progress {
    /// A dedicated event thread progresses on OS events (the default).
    #[default]
    Thread,
    /// Progress only inside library calls (baseline for comparison).
    Inline,
}

/// How to open a port.
#[derive(Clone, Debug)]
pub struct PortConfig {
    /// This port's address.
    pub addr: Addr,
    /// Isolates unrelated runs on one machine: ports only find peers of the same
    /// namespace.
    pub namespace: String,
    /// Where this node's Unix sockets live (default `$TMPDIR/gepsea-<uid>/<namespace>/node-<n>`, private to this user).
    pub runtime_dir: Option<PathBuf>,
    /// TCP address to listen on for peers on other nodes (none: no inter-node traffic
    /// towards this port, though it can still connect out).
    pub listen: Option<SocketAddr>,
    /// Shared directory where every listening port publishes its TCP address, and
    /// where peers' addresses are looked up.
    pub directory: Option<PathBuf>,
    /// Static addresses of remote ports (checked before `directory`).
    pub routes: HashMap<Addr, SocketAddr>,
    pub progress: Progress,
    pub proto: ProtoConfig,
    /// Bytes in each direction's shared-memory ring.
    pub ring_bytes: usize,
    /// Rendezvous messages between ports on this node are copied once, by the
    /// receiver, straight from the sender's buffer (see [`crate::cma`]) instead of
    /// through the ring. Falls back to the ring by itself where the system forbids it.
    pub single_copy: bool,
    /// Largest frame payload accepted from the network.
    pub max_frame: usize,
    /// Size of the pieces rendezvous and RMA transfers to other nodes are cut into
    /// (at most `max_frame`). Each TCP piece costs a header and its checksum, and its
    /// receiver reads all but the first one straight into the posted buffer.
    pub tcp_chunk: usize,
    /// Largest normal-channel message sent eagerly to peers on other nodes (at most
    /// `credits × eager_threshold` of [`ProtoConfig`]; those on this node keep its
    /// `eager_threshold`). Above it a message goes by rendezvous, whose data waits a
    /// round trip for the receiver's answer; an eager message that finds its receive
    /// posted is read straight into it. Encrypted links (`encrypt`) keep the
    /// shared-memory limit: their records must be opened before a frame is decoded.
    pub tcp_eager: usize,
    /// How long `wait` spins before sleeping.
    pub spin: Duration,
    /// After this much of its spin, `wait` yields its core between looks (spin, snooze,
    /// park). For a process whose peer shares its cores and may need this very core to
    /// answer: a client of the local agent, with more busy processes than cores. `None`
    /// (the default): pure spinning, which peers with cores of their own answer
    /// soonest (a yield per look slowed a 64 KiB TCP ping-pong from 34 to 50-100 µs).
    pub snooze_after: Option<Duration>,
    /// How long after a library call returns the port still counts as awake, so that
    /// shared-memory peers skip the doorbell between back-to-back calls. The event
    /// thread takes over at its first look after the lease expired: its looks at a
    /// lease that keeps being renewed back off from one lease, doubling, to 4 ms (or
    /// one lease, if longer), so progress resumes within about a burst's length after
    /// a short burst of calls ends, and within 4 ms after a long one.
    pub lease: Duration,
    /// How long a broken link is retried before its peer is declared failed.
    pub reconnect_timeout: Duration,
    /// How long dropping the port waits for queued output to be delivered.
    pub linger: Duration,
    /// Keep TCP links up, for ports that must notice a lost peer while nothing is being
    /// said (agents): a link that drops is reconnected at once whether or not anything
    /// waits on it, and a connected peer that goes silent at the TCP level (neither our
    /// data nor the kernel's keepalive probes acknowledged) for this long loses its
    /// connection ([`crate::tcp::watch_for_silence`]). Either way a peer unreachable for
    /// `reconnect_timeout` more is reported failed. `None` (the default): links come up
    /// when there is something to send, and only data left unacknowledged finds a lost
    /// peer.
    pub keepalive: Option<Duration>,
    /// Write an event trace of the application's messages to this file (see
    /// [`crate::trace`]). Default: under `$GEPSEA_NET_TRACE` when that is set.
    pub trace: Option<PathBuf>,
    /// The job's link key: TCP peers must prove they hold it before anything they send
    /// is delivered (see [`crate::auth`]). `None`: links are not authenticated.
    pub key: Option<crate::auth::Key>,
    /// Encrypt TCP links with a Noise session keyed by `key` (see [`crate::seal`]);
    /// every port of a job must agree. Needs `key`.
    pub encrypt: bool,
    /// The TCP congestion control this port's connections run under (`TCP_CONGESTION`,
    /// e.g. `cubic`, `reno`, `bbr`), in place of the system's default. Checked when the
    /// port opens: a name the kernel does not have, or may not give this process, is
    /// refused there. Default: `$GEPSEA_TCP_CONGESTION` when set, else the system's.
    ///
    /// For sites whose hosts default to a pacing algorithm such as BBR, which suits
    /// long wide-area paths but slows the bursts of a cluster's links: 1 MiB one way on
    /// loopback under `bbr` took 254.6 µs against 201.3 with `cubic` set per connection,
    /// 1 MiB streams 3.82 against 5.29 GB/s (medians of 6 rounds, `docs/benchmarks.md`).
    pub tcp_congestion: Option<String>,
    /// The kernel buffers of each TCP connection, each way (`SO_SNDBUF` and `SO_RCVBUF`,
    /// which the kernel doubles for its bookkeeping), in place of the kernel's own
    /// sizing. Applied only where the system's limits (`net.core.rmem_max` and
    /// `wmem_max`) allow the whole size: under them the kernel would lock a smaller
    /// buffer than its own sizing reaches, so the connections are then left to it
    /// ([`Port::tcp_buffer`] says which).
    ///
    /// Default: `$GEPSEA_TCP_BUFFER` when set (bytes, or `auto` for `None`; anything
    /// else is refused when the port opens), else 4 MiB. The kernel sizes a
    /// connection's buffers from what its last round trips carried, and large-message
    /// streams ran below their long-run rate while they grew: 256 MiB streams after a
    /// 64 KiB one in the same pair, GB/s, medians of 6 alternated rounds on a 2-core
    /// guest, with against without: 1 MiB messages 8.20 against 7.10 and 4 MiB 6.34
    /// against 5.02 on loopback, 7.03 against 6.63 and 5.73 against 5.34 across a veth
    /// pair; smaller in `make bench-net`'s ratios to OpenMPI (0.845 against 0.815 at
    /// 1 MiB on loopback, none seen across veth; `docs/benchmarks.md`). `None` for
    /// links whose bandwidth-delay product exceeds the 8 MiB this allows (wide-area
    /// paths), which the kernel's sizing serves up to `net.ipv4.tcp_rmem`'s maximum.
    pub tcp_buffer: Option<usize>,
    /// What this port checksums on its TCP links (see [`crate::tcp::TcpChecksums`]):
    /// every header and payload, or ([`TcpChecksums::Headers`](crate::tcp::TcpChecksums::Headers))
    /// headers and link control only, the payloads of application data then trusted to
    /// TCP's own checksum on each link whose other end does the same. Default:
    /// `$GEPSEA_TCP_CHECKSUMS` (`full` or `headers`; anything else is refused when the
    /// port opens), else `full`.
    pub tcp_checksums: crate::tcp::TcpChecksums,
}

/// [`PortConfig::tcp_buffer`]'s default: 4 MiB each way.
pub const DEFAULT_TCP_BUFFER: usize = 4 << 20;

impl PortConfig {
    /// Defaults for `addr` in `namespace`.
    pub fn new(namespace: &str, addr: Addr) -> Self {
        PortConfig {
            addr,
            namespace: namespace.to_string(),
            runtime_dir: None,
            listen: None,
            directory: None,
            routes: HashMap::new(),
            progress: Progress::Thread,
            proto: ProtoConfig::default(),
            ring_bytes: 256 << 10,
            single_copy: true,
            max_frame: 1 << 20,
            tcp_chunk: 256 << 10,
            tcp_eager: 64 << 10,
            spin: Duration::from_micros(50),
            snooze_after: None,
            lease: Duration::from_micros(50),
            reconnect_timeout: Duration::from_secs(10),
            linger: Duration::from_secs(5),
            keepalive: None,
            trace: std::env::var_os("GEPSEA_NET_TRACE")
                .map(|d| PathBuf::from(d).join(format!("{namespace}-{}-{}.trace", addr.node, addr.port))),
            key: None,
            encrypt: false,
            tcp_congestion: std::env::var("GEPSEA_TCP_CONGESTION").ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()),
            tcp_buffer: crate::tcp::default_buffer(),
            tcp_checksums: crate::tcp::default_checksums(),
        }
    }

    fn runtime_dir(&self) -> PathBuf {
        self.runtime_dir.clone().unwrap_or_else(|| namespace_dir(&self.namespace).join(format!("node-{}", self.addr.node)))
    }
}

/// Counters describing what the transports did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames refused as malformed (bad magic, version, checksum, length).
    pub frames_rejected: u64,
    /// TCP connections dropped (by error, by the peer, or by us after a bad frame).
    pub connections_lost: u64,
    /// TCP connections established (first ones and reconnects).
    pub connections_established: u64,
    /// Of those, the ones whose two ends both trust TCP for data: their data payloads
    /// go without checksums ([`crate::tcp::TcpChecksums::Headers`]).
    pub connections_trusting_tcp: u64,
    /// Frames sent again after a reconnect.
    pub frames_replayed: u64,
    /// TCP connections refused because the peer could not prove it holds the key (or
    /// the two sides disagree on whether links are authenticated).
    pub auth_failures: u64,
    /// Received frames discarded as already delivered.
    pub duplicates_dropped: u64,
    /// Doorbells rung towards sleeping shared-memory peers.
    pub doorbells: u64,
    /// Times a `wait` returning within a burst of calls woke this port's event thread
    /// so that it would look at the lease it left (`PortConfig::lease`).
    pub lease_wakeups: u64,
    /// Times the event thread looked at a port whose application was still
    /// communicating (its lease renewed, or a `wait` of it spinning). Each look takes a
    /// core from the application; they thin out as a burst of calls goes on, down to
    /// one per 4 ms.
    pub busy_looks: u64,
    /// Single copies refused because the offer named a process other than the peer.
    pub single_copies_not_from_peer: u64,
    /// Rendezvous pieces from TCP peers received straight into the posted buffer
    /// (the rest of them went through the connection's decoder and were copied).
    pub pieces_in_place: u64,
    /// The most recent transport errors, newest last (at most 16).
    pub recent_errors: Vec<String>,
}

const WAKER: Token = Token(0);
const UNIX_LISTENER: Token = Token(1);
const TCP_LISTENER: Token = Token(2);
const TIMER: Token = Token(3);
/// The TCP connections' own `epoll` set (`tcp_set`).
const TCP_SET: Token = Token(4);
const FIRST_CONN: usize = 16;

/// The bytes of a send: the application's own buffer, or borrowed ones that are copied
/// only if they cannot go straight into a ring.
enum Payload<'a> {
    Owned(Bytes),
    Borrowed(&'a [u8]),
}

impl Payload<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            Payload::Owned(b) => b,
            Payload::Borrowed(s) => s,
        }
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Payload::Owned(b) => b,
            Payload::Borrowed(s) => Bytes::copy_from_slice(s),
        }
    }
}

/// A timeout that never comes.
const FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest the event thread lets a continuously renewed lease (or a wait that spins
/// on) go unchecked: how late, at worst, it takes over progress after a long burst of
/// calls ends (a shorter burst is checked on within about its own length: the interval
/// doubles from one lease). Each look takes a core from the communicating application
/// on a busy machine: at 1 ms they cost a 1 MiB TCP ping-pong on 2 cores ≈ 15 µs per
/// one way against inline progress (capped at 2, 4 and 8 ms: 9, 11 and 12 µs of it
/// recovered; `docs/benchmarks.md`, forty-seventh session).
const MAX_LEASE_BACKOFF: Duration = Duration::from_millis(4);

/// Marks a send that was written out (and so finished) before `isend` returned: the
/// request never enters the protocol's tables, and `wait`/`test` answer it without
/// taking the lock — most small messages on shared memory take this path.
const PRESETTLED: ReqId = 1 << 63;

fn is_presettled(req: ReqId) -> bool {
    req & PRESETTLED != 0
}

/// Extra spin per KiB of rendezvous data in flight (≈4 GB/s, below what shared memory
/// moves, so the spin covers the transfer).
const SPIN_NS_PER_KIB: u64 = 250;

/// A transfer is spun for again only while it moves at least this fast (4 µs per KiB,
/// ≈256 MB/s). Below it the bytes take milliseconds, against which the two wake-ups a
/// sleep costs (30-40 µs each here) are small; spinning on a 10 Mbit/s link for the
/// whole transfer burned a core per waiter (90 CPU-s for 300 MB received).
const SLOWEST_SPUN_NS_PER_KIB: u64 = 4_000;

/// Rendezvous bytes a wait must have moved for the next wait to spin for an answer
/// ([`answer_spin`]); below it the default spin covers the peer's turn.
const ANSWER_SPIN_MIN: u64 = 32 << 10;

/// The least a wait spins for an answer after a rendezvous message: the answer, if
/// large, is itself three trips away (its RTS, our CTS, its data) once the peer has
/// taken ours in, and one TCP trip is ≈10 µs on these guests, more when a core is
/// busy. With only the default spin (50 µs) a 64 KiB ping-pong over TCP loopback slept
/// in most round trips: 259–931 context switches of the client in ≈150 round trips,
/// 37–75 with this floor (3 alternated runs); one-way median 71 → 51 µs (8 alternated
/// rounds, faster in 6), and the client's CPU time fell (30–37 → 20–26 ms).
const ANSWER_SPIN_FLOOR: Duration = Duration::from_micros(120);

/// How long the wait after one that moved `moved` rendezvous bytes spins before it
/// sleeps: as long as the peer takes to take those bytes in at [`SPIN_NS_PER_KIB`],
/// and as long again for its answer, which, if one comes, follows them. Over TCP a
/// send completes once the kernel has the bytes, and the receiver then needs about
/// 200 µs more for 1 MiB on loopback: a ping-pong's wait for the reply outlasted the
/// default spin and slept, and the reply came through two wake-ups (the event
/// thread's, then the waiter's; 30–40 µs each here). Measured on a 1 MiB ping-pong
/// (120 round trips): 789–932 context switches of the client without, 222 with.
/// At least [`ANSWER_SPIN_FLOOR`]; `None` below [`ANSWER_SPIN_MIN`].
fn answer_spin(moved: u64) -> Option<Duration> {
    (moved >= ANSWER_SPIN_MIN).then(|| Duration::from_nanos(2 * moved * SPIN_NS_PER_KIB / 1024).max(ANSWER_SPIN_FLOOR))
}

/// What a waiter saw when it last extended its spin for data on its way.
#[derive(Clone, Copy, Debug)]
struct SpinMark {
    /// Bytes in flight: rendezvous transfers under way ([`Proto::bulk_bytes_in_flight`])
    /// and eager messages held back for credits ([`Proto::eager_bytes_stalled`]).
    in_flight: usize,
    /// Bytes moved so far: rendezvous bytes ([`Proto::bulk_bytes_moved`]) and eager
    /// messages let go ([`Proto::eager_bytes_released`]).
    moved: u64,
    at: Instant,
}

impl SpinMark {
    fn of(proto: &Proto, at: Instant) -> SpinMark {
        SpinMark {
            in_flight: proto.bulk_bytes_in_flight() + proto.eager_bytes_stalled(),
            moved: proto.bulk_bytes_moved() + proto.eager_bytes_released(),
            at,
        }
    }
}

/// When a waiter's spin runs out while rendezvous bytes are in flight: how much longer
/// to spin, if at all, given what it saw at its last extension (`last`). A first
/// transfer, or one announced since while nothing moved, is spun for (its bytes at
/// memory speed); transfers that moved since are spun for again only if they moved at
/// least [`SLOWEST_SPUN_NS_PER_KIB`]; stalled ones not at all. Pure, so that the rule is
/// tested without a transfer.
fn spin_extension(last: Option<SpinMark>, now: SpinMark) -> Option<Duration> {
    let more = Duration::from_nanos(now.in_flight as u64 * SPIN_NS_PER_KIB / 1024);
    match last {
        _ if now.in_flight == 0 => None,
        None => Some(more),
        Some(l) if now.moved > l.moved => {
            let moved_kib = (now.moved - l.moved).div_ceil(1024);
            let took = now.at.saturating_duration_since(l.at).as_nanos() as u64;
            (took <= moved_kib * SLOWEST_SPUN_NS_PER_KIB).then_some(more)
        }
        Some(l) => (now.in_flight > l.in_flight).then_some(more),
    }
}

fn bell_token(id: usize) -> Token {
    Token(FIRST_CONN + id * 4)
}
fn shm_sock_token(id: usize) -> Token {
    Token(FIRST_CONN + id * 4 + 1)
}
fn tcp_token(id: usize) -> Token {
    Token(FIRST_CONN + id * 4 + 2)
}

struct State {
    proto: Proto,
    me: Addr,
    incarnation: u64,
    cfg: PortConfig,
    /// The kernel buffers each TCP connection gets ([`PortConfig::tcp_buffer`] where the
    /// system's limits allow it).
    tcp_buffer: Option<usize>,
    registry: Registry,
    unix_listener: mio::net::UnixListener,
    tcp_listener: Option<mio::net::TcpListener>,
    shm: FxHashMap<usize, ShmConn>,
    /// Keys of `shm`, kept alongside so the hot loop need not collect them.
    shm_ids: Vec<usize>,
    shm_send: FxHashMap<Addr, usize>,
    tcp: FxHashMap<usize, TcpConn>,
    links: FxHashMap<Addr, Link>,
    /// Reusable buffer for the list of peers with output.
    scratch: Vec<Addr>,
    /// Reusable buffer for connection ids.
    scratch_ids: Vec<usize>,
    /// When a spinner next asks the TCP set whether a full socket has room
    /// (`State::poll_tcp`).
    next_room_look: Instant,
    /// Some shared-memory connection owes its peer a look at `want_space`
    /// ([`crate::shm::ShmConn::owe_space`]); [`State::settle_space`] pays.
    space_owed: bool,
    next_id: usize,
    awake: u32,
    /// The application polls the port itself ([`Port::start_polling`]; counted in
    /// `awake` while set).
    app_polling: bool,
    /// TCP writes are held back ([`Port::cork`]).
    corked: bool,
    /// Application threads in `wait` (spinning or asleep) ...
    in_wait: u32,
    /// ... and of them, those asleep on the condition variable.
    waiters: u32,
    app_bell: Bell,
    app_bell_set: bool,
    stats: PortStats,
    /// A timer was armed outside the event thread: wake it so it recomputes its timeout.
    kick: bool,
    /// The awake lease left by the last `wait` (counted in `awake` while held).
    lease: Option<Instant>,
    /// When the last `wait` returned: a wait that starts within a lease of it is part
    /// of a burst of calls and leaves a lease behind; one that follows a long
    /// computation does not.
    last_return: Option<Instant>,
    /// Until when the next wait spins at least, because the last one moved a large
    /// message ([`answer_spin`]).
    answer_spin_until: Option<Instant>,
    /// When the event thread will wake by itself (None: only on events).
    thread_wake_at: Option<Instant>,
    /// The event thread's deadline timer (none inline). Application threads that set a
    /// protocol deadline (an acknowledgement, a reconnect) arm it themselves rather
    /// than wake the sleeping event thread just so that it re-arms it (an IPI, 13–17 µs
    /// per call on a KVM guest). A lease in a burst still wakes the thread: arming the
    /// timer from the application's core left a 4 MiB transfer in the overlap
    /// benchmark unprogressed for most of the compute phase (a median wait of 815 µs
    /// after 1 ms of computing, against 1.3 µs with the wake-up).
    timer: Option<Arc<crate::timer::Timer>>,
    /// Local peers whose socket was not there yet: (first failure, next attempt).
    shm_retry: HashMap<Addr, (Instant, Instant)>,
    /// Every peer whose link may have a deadline (an acknowledgement due, a reconnect
    /// to try or to give up on): a superset, pruned by [`State::timers`]. The timers
    /// look at these links only, not at every link: an agent keeps one to every agent
    /// it has worked with, and its event thread looks at the timers on every pass
    /// (35 links on the emulated 36-node cluster, 1,000 on the nodes the model plays).
    timed: HashSet<Addr>,
    /// The TCP connections' `epoll` set, which the port's watches as one descriptor.
    tcp_set: tcp_set::TcpSet,
    /// Reusable buffer for the edges taken from `tcp_set`.
    tcp_edges: Vec<(Token, bool, bool)>,
    /// Spinners that took the TCP connections from the event thread (see
    /// [`State::quiet_tcp`]).
    tcp_quiet: u32,
    /// A wait that ended within a burst of library calls left its hold on the TCP
    /// sockets (`quiet_tcp`) to the next wait, or to the event thread when the lease
    /// runs out: handing them back and taking them again cost an `epoll_ctl` per
    /// socket each way and woke the event thread for what arrived in between.
    quiet_lingers: bool,
}

struct Shared {
    st: Mutex<State>,
    cv: Condvar,
    poll: Mutex<Poll>,
    waker: Waker,
    shutdown: AtomicBool,
    sock_path: PathBuf,
    dir_entry: Option<PathBuf>,
    spin: Duration,
    snooze_after: Option<Duration>,
    lease: Duration,
    progress: Progress,
    linger: Duration,
    trace: Option<crate::trace::Tracer>,
    /// Events the event thread left for a spinning wait (see `crate::handover`).
    handover: crate::handover::Handover<Ready>,
    /// The event thread's timer (also in `State`): it arms it without the lock when it
    /// leaves its events to a spinning wait.
    timer: Option<Arc<crate::timer::Timer>>,
    /// `PortStats::busy_looks`: counted here, as the event thread counts some of them
    /// without the lock.
    busy_looks: AtomicU64,
}

/// A process's communication endpoint. Cheap to share between threads (`&Port` is
/// `Sync`); dropping it delivers queued output (up to `linger`) and stops the event
/// thread.
pub struct Port {
    sh: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    addr: Addr,
}

/// The default runtime directory of a namespace (`$TMPDIR/gepsea-<uid>/<namespace>`, private
/// to this user: see [`crate::trust`]). Ports
/// remove it when the last of them closes; whoever owns a namespace whose processes may
/// have been killed (their sockets stay behind) removes it when done.
pub fn namespace_dir(namespace: &str) -> PathBuf {
    crate::trust::user_runtime_root().join(namespace)
}

/// Where a peer's TCP address is published in a shared directory.
pub fn directory_entry(dir: &Path, addr: Addr) -> PathBuf {
    dir.join(format!("{}-{}.addr", addr.node, addr.port))
}

impl Drop for Port {
    fn drop(&mut self) {
        // Deliver what is queued (like MPI_Finalize), bounded by `linger`.
        let _ = self.wait_until(self.sh.linger, |st| st.output_settled().then_some(()));
        // (The wait uncorked the port.)
        self.sh.st.lock().acknowledge_all();
        self.sh.shutdown.store(true, Ordering::SeqCst);
        let _ = self.sh.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.sh.sock_path);
        if let Some(e) = &self.sh.dir_entry {
            let _ = std::fs::remove_file(e);
        }
        // Remove the node and namespace runtime directories once the last port is gone
        // (remove_dir fails harmlessly while other ports still use them).
        if let Some(node_dir) = self.sh.sock_path.parent() {
            let _ = std::fs::remove_dir(node_dir);
            if let Some(ns_dir) = node_dir.parent() {
                let _ = std::fs::remove_dir(ns_dir);
            }
        }
    }
}

/// Fills `buf` from the kernel's random source (incarnations, nonces, keys).
pub(crate) fn getrandom(buf: &mut [u8]) -> io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// Binds the port's Unix socket, replacing a stale one left by a dead process but never
/// stealing the address of a live port.
pub(super) fn bind_unix(path: &Path, me: Addr) -> Result<mio::net::UnixListener, NetError> {
    match mio::net::UnixListener::bind(path) {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(NetError::Io {
                    context: format!("opening port {me}"),
                    message: format!("address in use: another live process owns {}", path.display()),
                });
            }
            std::fs::remove_file(path).map_err(|e| NetError::io(format!("removing stale socket {}", path.display()), e))?;
            mio::net::UnixListener::bind(path).map_err(|e| NetError::io(format!("binding {}", path.display()), e))
        }
        Err(e) => Err(NetError::io(format!("binding {}", path.display()), e)),
    }
}

impl AsRawFd for Port {
    /// The event descriptor (see [`Port::enable_events`]).
    fn as_raw_fd(&self) -> RawFd {
        self.sh.st.lock().app_bell.raw()
    }
}

#[cfg(test)]
mod tests;
