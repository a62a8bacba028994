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

use std::collections::HashMap;

use rustc_hash::FxHashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Where this node's Unix sockets live (default `$TMPDIR/gepsea-<namespace>/node-<n>`).
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
    /// How long `wait` spins before sleeping.
    pub spin: Duration,
    /// How long after a library call returns the port still counts as awake, so that
    /// shared-memory peers skip the doorbell between back-to-back calls. The event
    /// thread takes over when it expires; it bounds the delay before event-driven
    /// progress starts once the application goes off to compute.
    pub lease: Duration,
    /// How long a broken link is retried before its peer is declared failed.
    pub reconnect_timeout: Duration,
    /// How long dropping the port waits for queued output to be delivered.
    pub linger: Duration,
    /// Write an event trace of the application's messages to this file (see
    /// [`crate::trace`]). Default: under `$GEPSEA_NET_TRACE` when that is set.
    pub trace: Option<PathBuf>,
}

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
            spin: Duration::from_micros(50),
            lease: Duration::from_micros(50),
            reconnect_timeout: Duration::from_secs(10),
            linger: Duration::from_secs(5),
            trace: std::env::var_os("GEPSEA_NET_TRACE")
                .map(|d| PathBuf::from(d).join(format!("{namespace}-{}-{}.trace", addr.node, addr.port))),
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
    /// Frames sent again after a reconnect.
    pub frames_replayed: u64,
    /// Received frames discarded as already delivered.
    pub duplicates_dropped: u64,
    /// Doorbells rung towards sleeping shared-memory peers.
    pub doorbells: u64,
    /// Single copies refused because the offer named a process other than the peer.
    pub single_copies_not_from_peer: u64,
    /// The most recent transport errors, newest last (at most 16).
    pub recent_errors: Vec<String>,
}

const WAKER: Token = Token(0);
const UNIX_LISTENER: Token = Token(1);
const TCP_LISTENER: Token = Token(2);
const TIMER: Token = Token(3);
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

/// The longest the event thread lets a continuously renewed lease go unchecked: how
/// late, at worst, it takes over progress after a long burst of calls ends.
const MAX_LEASE_BACKOFF: Duration = Duration::from_millis(1);

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
    next_id: usize,
    awake: u32,
    waiters: u32,
    app_bell: Bell,
    app_bell_set: bool,
    stats: PortStats,
    /// A timer was armed outside the event thread: wake it so it recomputes its timeout.
    kick: bool,
    /// The awake lease left by the last `wait` (counted in `awake` while held).
    lease: Option<Instant>,
    /// How much later than a renewed lease's end the event thread looks again.
    lease_backoff: Duration,
    /// When the last `wait` returned: a wait that starts within a lease of it is part
    /// of a burst of calls and leaves a lease behind; one that follows a long
    /// computation does not.
    last_return: Option<Instant>,
    /// When the event thread will wake by itself (None: only on events).
    thread_wake_at: Option<Instant>,
    /// The event thread's deadline timer (none inline). Application threads that set a
    /// protocol deadline (an acknowledgement, a reconnect) arm it themselves rather
    /// than wake the sleeping event thread just so that it re-arms it (an IPI, 13–17 µs
    /// per call on a KVM guest). A lease in a burst still wakes the thread: arming the
    /// timer from the application's core left a 4 MiB transfer in the overlap
    /// benchmark unprogressed for most of the compute phase (a median wait of 815 µs
    /// after 1 ms of computing, against 1.3 µs with the wake-up).
    timer: Option<crate::timer::Timer>,
    /// Local peers whose socket was not there yet: (first failure, next attempt).
    shm_retry: HashMap<Addr, (Instant, Instant)>,
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
    lease: Duration,
    progress: Progress,
    linger: Duration,
    trace: Option<crate::trace::Tracer>,
}

/// A process's communication endpoint. Cheap to share between threads (`&Port` is
/// `Sync`); dropping it delivers queued output (up to `linger`) and stops the event
/// thread.
pub struct Port {
    sh: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    addr: Addr,
}

/// The default runtime directory of a namespace (`$TMPDIR/gepsea-<namespace>`). Ports
/// remove it when the last of them closes; whoever owns a namespace whose processes may
/// have been killed (their sockets stay behind) removes it when done.
pub fn namespace_dir(namespace: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gepsea-{namespace}"))
}

/// Where a peer's TCP address is published in a shared directory.
pub fn directory_entry(dir: &Path, addr: Addr) -> PathBuf {
    dir.join(format!("{}-{}.addr", addr.node, addr.port))
}

impl Port {
    /// Opens the port: binds its Unix socket (and TCP listener), publishes its address,
    /// starts the event thread.
    pub fn open(cfg: PortConfig) -> Result<Port, NetError> {
        let me = cfg.addr;
        let dir = cfg.runtime_dir();
        std::fs::create_dir_all(&dir).map_err(|e| NetError::io(format!("creating runtime directory {}", dir.display()), e))?;
        let sock_path = dir.join(format!("port-{}.sock", me.port));
        let unix_listener = bind_unix(&sock_path, me)?;
        let tcp_listener = match cfg.listen {
            Some(a) => Some(mio::net::TcpListener::bind(a).map_err(|e| NetError::io(format!("listening on {a}"), e))?),
            None => None,
        };
        let mut dir_entry = None;
        if let (Some(d), Some(l)) = (&cfg.directory, &tcp_listener) {
            let local = l.local_addr().map_err(|e| NetError::io("listener address", e))?;
            std::fs::create_dir_all(d).map_err(|e| NetError::io(format!("creating directory {}", d.display()), e))?;
            let entry = directory_entry(d, me);
            let tmp = entry.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, local.to_string()).map_err(|e| NetError::io(format!("writing {}", tmp.display()), e))?;
            std::fs::rename(&tmp, &entry).map_err(|e| NetError::io(format!("publishing {}", entry.display()), e))?;
            dir_entry = Some(entry);
        }
        let poll = Poll::new().map_err(|e| NetError::io("epoll", e))?;
        let registry = poll.registry().try_clone().map_err(|e| NetError::io("epoll", e))?;
        let waker = Waker::new(poll.registry(), WAKER).map_err(|e| NetError::io("waker", e))?;
        let mut unix_listener = unix_listener;
        registry.register(&mut unix_listener, UNIX_LISTENER, Interest::READABLE).map_err(|e| NetError::io("register", e))?;
        let mut tcp_listener = tcp_listener;
        if let Some(l) = tcp_listener.as_mut() {
            registry.register(l, TCP_LISTENER, Interest::READABLE).map_err(|e| NetError::io("register", e))?;
        }
        let incarnation = {
            let mut b = [0u8; 8];
            let _ = getrandom(&mut b);
            u64::from_le_bytes(b) | 1
        };
        let spin = cfg.spin;
        let lease = cfg.lease;
        let progress = cfg.progress;
        let linger = cfg.linger;
        let trace = match &cfg.trace {
            Some(p) => Some(crate::trace::Tracer::create(p).map_err(|e| NetError::io(format!("creating the trace {}", p.display()), e))?),
            None => None,
        };
        let timer = match progress {
            Progress::Thread => {
                // Deadlines go through a timerfd: epoll's timeout only has millisecond
                // resolution.
                let t = crate::timer::Timer::new()?;
                registry
                    .register(&mut SourceFd(&t.raw()), TIMER, Interest::READABLE)
                    .map_err(|e| NetError::io("registering the timer", e))?;
                Some(t)
            }
            Progress::Inline => None,
        };
        let mut proto = Proto::new(me, cfg.proto.clone());
        proto.offer_single_copy(cfg.single_copy.then(std::process::id));
        let st = State {
            proto,
            me,
            incarnation,
            cfg,
            registry,
            unix_listener,
            tcp_listener,
            shm: FxHashMap::default(),
            shm_ids: Vec::new(),
            shm_send: FxHashMap::default(),
            tcp: FxHashMap::default(),
            links: FxHashMap::default(),
            scratch: Vec::new(),
            scratch_ids: Vec::new(),
            next_id: 0,
            awake: 0,
            waiters: 0,
            app_bell: Bell::new()?,
            app_bell_set: false,
            stats: PortStats::default(),
            kick: false,
            lease: None,
            last_return: None,
            lease_backoff: Duration::ZERO,
            thread_wake_at: None,
            timer,
            shm_retry: HashMap::new(),
        };
        let sh = Arc::new(Shared {
            st: Mutex::new(st),
            cv: Condvar::new(),
            poll: Mutex::new(poll),
            waker,
            shutdown: AtomicBool::new(false),
            sock_path,
            dir_entry,
            spin,
            lease,
            progress,
            linger,
            trace,
        });
        let thread = if progress == Progress::Thread {
            let sh2 = sh.clone();
            Some(
                std::thread::Builder::new()
                    .name(format!("gepsea-net {me}"))
                    .spawn(move || event_thread(sh2))
                    .map_err(|e| NetError::io("spawning event thread", e))?,
            )
        } else {
            None
        };
        Ok(Port { sh, thread, addr: me })
    }

    /// This port's address.
    pub fn addr(&self) -> Addr {
        self.addr
    }

    /// The TCP address the port listens on, if any.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.sh.st.lock().tcp_listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Adds or replaces the TCP address of a remote port.
    pub fn add_route(&self, peer: Addr, addr: SocketAddr) {
        self.sh.st.lock().cfg.routes.insert(peer, addr);
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut st = self.sh.st.lock();
        let r = f(&mut st);
        run_copies(&mut st);
        st.flush_all();
        st.update_app_bell();
        self.kick_if_needed(&mut st);
        r
    }

    /// Keeps the port awake for `lease` after a call returns (see
    /// [`PortConfig::lease`]) when the call was part of a burst (it started within a
    /// lease of the previous one's return); makes sure somebody expires the lease.
    ///
    /// A call after a quiet spell (the application computed) leaves no lease: the port
    /// goes to sleep at once and peers ring its doorbell. Expiring a lease needs the
    /// event thread's timer, and arming a timer that fires sooner than anything else on
    /// the CPU reprograms the local APIC timer — a VM exit that costs 6–13 µs on these
    /// KVM guests, which was most of the `wait` after a compute phase.
    fn leave_awake(&self, st: &mut MutexGuard<'_, State>, started: Instant, now: Instant) {
        let burst = st.last_return.is_some_and(|t| started.saturating_duration_since(t) <= self.sh.lease);
        st.last_return = Some(now);
        if self.sh.progress == Progress::Inline {
            // No event thread: the lease lasts until the next call, which releases it
            // before it sleeps.
            st.lease = Some(now);
            return;
        }
        if !burst {
            // Declare sleep; anything that slipped in unannounced meanwhile is handled
            // here, as nobody rang for it.
            while st.set_awake(false) {
                st.set_awake(true);
                progress_all(st);
            }
            return;
        }
        let until = now + self.sh.lease;
        st.lease = Some(until);
        // Any look the event thread already plans within the back-off will do: it
        // re-reads the lease then.
        if st.thread_wake_at.is_none_or(|t| t > until + MAX_LEASE_BACKOFF) {
            st.thread_wake_at = Some(until);
            let _ = self.sh.waker.wake();
        }
    }

    /// A timer was armed outside the event thread: make sure the event thread wakes
    /// for it.
    fn kick_if_needed(&self, st: &mut State) {
        if st.kick {
            st.kick = false;
            if let Some(t) = st.next_timer() {
                st.wake_event_thread_by(t);
            }
        }
    }

    /// Starts a tagged send of `data` to `dst` on the normal channel (eager up to the
    /// threshold, rendezvous above).
    pub fn isend(&self, dst: Addr, tag: u64, data: impl Into<Bytes>) -> ReqId {
        self.send_on(Channel::Normal, dst, tag, Payload::Owned(data.into()))
    }

    /// Like [`Port::isend`], from a borrowed buffer: a small message to a connected
    /// peer on this node is copied straight into the ring (no allocation, no
    /// reference count); anything else is first copied into a buffer of its own. The
    /// buffer can be reused as soon as this returns, as after `MPI_Bsend`.
    pub fn isend_copy(&self, dst: Addr, tag: u64, data: &[u8]) -> ReqId {
        self.send_on(Channel::Normal, dst, tag, Payload::Borrowed(data))
    }

    /// Blocking [`Port::isend_copy`].
    pub fn send_copy(&self, dst: Addr, tag: u64, data: &[u8]) -> Result<(), NetError> {
        let r = self.isend_copy(dst, tag, data);
        self.wait(r).map(|_| ())
    }

    /// The send path of `isend`, `isend_copy` and `send_system`: a small message to a
    /// connected local peer goes straight into the ring (see [`Port::direct_send`]);
    /// anything else becomes a request of the protocol (its bytes copied first if they
    /// are borrowed).
    fn send_on(&self, channel: Channel, dst: Addr, tag: u64, data: Payload<'_>) -> ReqId {
        let bytes = data.as_slice();
        if let Some(t) = &self.sh.trace {
            t.record(if channel == Channel::System { "sys-send" } else { "send" }, dst, bytes.len());
        }
        if let Some(id) = self.direct_send(dst, channel, tag, bytes) {
            return id;
        }
        let data = data.into_bytes();
        self.with(|st| {
            let id = match channel {
                Channel::System => st.proto.send_system(dst, tag, data),
                _ => st.proto.isend(dst, tag, data),
            };
            st.settled_at_once(id)
        })
    }

    /// A small message to a connected peer on this node with nothing queued ahead of
    /// it goes straight into the ring: no request, no queue, finished on return.
    fn direct_send(&self, dst: Addr, channel: Channel, tag: u64, data: &[u8]) -> Option<ReqId> {
        if dst.node != self.addr.node {
            return None;
        }
        let mut st = self.sh.st.lock();
        let (h, id) = st.proto.direct_eager(dst, channel, tag, data.len())?;
        if st.push_shm_now(&h, data) {
            Some(id | PRESETTLED)
        } else {
            st.proto.direct_eager_unsent(dst, channel);
            None
        }
    }

    /// Posts a receive for up to `capacity` bytes from `src` (`None`: any) with `tag`
    /// (`None`: any).
    pub fn irecv(&self, src: Option<Addr>, tag: Option<u64>, capacity: usize) -> ReqId {
        self.with(|st| st.proto.irecv(src, tag, capacity))
    }

    /// Like [`Port::irecv`], receiving into `buf` (capacity is the limit), so that
    /// large buffers can be reused instead of faulted in afresh.
    pub fn irecv_into(&self, src: Option<Addr>, tag: Option<u64>, buf: Vec<u8>) -> ReqId {
        self.with(|st| st.proto.irecv_into(src, tag, buf))
    }

    /// Sends a small message into `dst`'s system-channel pool.
    pub fn send_system(&self, dst: Addr, tag: u64, data: impl Into<Bytes>) -> ReqId {
        self.send_on(Channel::System, dst, tag, Payload::Owned(data.into()))
    }

    /// Takes a message from the system pool, if one is there.
    pub fn try_recv_system(&self) -> Option<Message> {
        let m = self.with(|st| {
            st.progress();
            st.proto.recv_system()
        });
        self.traced_system(m)
    }

    /// Waits up to `timeout` for a system-channel message.
    pub fn recv_system(&self, timeout: Duration) -> Result<Message, NetError> {
        self.traced_system(self.wait_until(timeout, |st| st.proto.recv_system())).ok_or(NetError::Timeout(timeout))
    }

    fn traced_system(&self, m: Option<Message>) -> Option<Message> {
        if let (Some(t), Some(m)) = (&self.sh.trace, &m) {
            t.record("sys-recv", m.src, m.data.len());
        }
        m
    }

    /// Records a receive handed to the application.
    fn traced(&self, r: Option<Result<Completion, NetError>>) -> Option<Result<Completion, NetError>> {
        if let (Some(t), Some(Ok(Completion::Received(m)))) = (&self.sh.trace, &r) {
            t.record("recv", m.src, m.data.len());
        }
        r
    }

    /// Exposes a zeroed region of `len` bytes under `region` for remote put/get.
    pub fn expose(&self, region: u64, len: usize) -> Result<(), NetError> {
        self.with(|st| st.proto.expose(region, len))
    }

    /// Withdraws a region exposed with [`Port::expose`].
    pub fn unexpose(&self, region: u64) -> Result<(), NetError> {
        self.with(|st| st.proto.unexpose(region))
    }

    /// Reads or writes a local region.
    pub fn with_region<R>(&self, region: u64, f: impl FnOnce(&mut [u8]) -> R) -> Result<R, NetError> {
        self.with(|st| st.proto.region(region).map(|r| f(r)))
    }

    /// Writes `data` at `offset` of `dst`'s region.
    pub fn put(&self, dst: Addr, region: u64, offset: u64, data: impl Into<Bytes>) -> ReqId {
        let data = data.into();
        self.with(|st| st.proto.put(dst, region, offset, data))
    }

    /// Reads `len` bytes at `offset` of `dst`'s region.
    pub fn get(&self, dst: Addr, region: u64, offset: u64, len: usize) -> ReqId {
        self.with(|st| st.proto.get(dst, region, offset, len))
    }

    /// Makes progress once and returns the request's result if it has finished (the
    /// result is handed out once).
    pub fn test(&self, req: ReqId) -> Option<Result<Completion, NetError>> {
        if is_presettled(req) {
            return Some(Ok(Completion::Sent));
        }
        self.traced(self.with(|st| {
            st.progress();
            st.proto.take(req)
        }))
    }

    /// Waits for a request to finish.
    pub fn wait(&self, req: ReqId) -> Result<Completion, NetError> {
        self.wait_timeout(req, FOREVER)
    }

    /// Waits up to `timeout`; on timeout the request keeps running.
    pub fn wait_timeout(&self, req: ReqId, timeout: Duration) -> Result<Completion, NetError> {
        if is_presettled(req) {
            return Ok(Completion::Sent);
        }
        if !self.sh.st.lock().proto.is_known(req) {
            return Err(NetError::UnknownRequest(req));
        }
        self.traced(self.wait_until(timeout, |st| st.proto.take(req))).unwrap_or(Err(NetError::Timeout(timeout)))
    }

    /// Waits until one of `reqs` finishes; returns its index and result.
    pub fn wait_any(&self, reqs: &[ReqId]) -> (usize, Result<Completion, NetError>) {
        if let Some(i) = reqs.iter().position(|&r| is_presettled(r)) {
            return (i, Ok(Completion::Sent));
        }
        let (i, r) = self
            .wait_until(FOREVER, |st| reqs.iter().enumerate().find_map(|(i, r)| st.proto.take(*r).map(|x| (i, x))))
            .expect("wait_any without deadline");
        (i, self.traced(Some(r)).expect("some"))
    }

    /// Cancels a posted receive that has not matched.
    pub fn cancel(&self, req: ReqId) -> bool {
        if is_presettled(req) {
            return false;
        }
        self.with(|st| st.proto.cancel(req))
    }

    /// Blocking send.
    pub fn send(&self, dst: Addr, tag: u64, data: impl Into<Bytes>) -> Result<(), NetError> {
        let r = self.isend(dst, tag, data);
        self.wait(r).map(|_| ())
    }

    /// Blocking receive.
    pub fn recv(&self, src: Option<Addr>, tag: Option<u64>, capacity: usize) -> Result<Message, NetError> {
        let r = self.irecv(src, tag, capacity);
        match self.wait(r)? {
            Completion::Received(m) => Ok(m),
            other => unreachable!("receive completed as {other:?}"),
        }
    }

    /// Turns on the event queue and returns a descriptor that is readable while events
    /// are pending, for use in the application's own `poll`/`epoll`.
    pub fn enable_events(&self) -> RawFd {
        self.with(|st| {
            st.proto.enable_events();
            st.app_bell.raw()
        })
    }

    /// The oldest pending event.
    pub fn next_event(&self) -> Option<Event> {
        self.with(|st| {
            st.progress();
            st.proto.next_event()
        })
    }

    /// Makes progress on every transport now — drains the shared-memory rings and reads
    /// every established TCP connection — without waiting. For an event loop of its
    /// own that spins briefly after work (as the agent does) instead of waiting for
    /// the event thread to be woken.
    pub fn poll(&self) {
        self.with(|st| {
            st.poll_tcp();
            st.progress();
        })
    }

    /// Transport counters.
    pub fn stats(&self) -> PortStats {
        self.sh.st.lock().stats.clone()
    }

    /// Protocol counters.
    pub fn proto_stats(&self) -> crate::proto::ProtoStats {
        self.sh.st.lock().proto.stats.clone()
    }

    /// Fault injection for tests: offer single copies as process `pid` (a process this
    /// port is not), as a peer in another pid namespace would. Receivers must refuse
    /// them and fetch the data through the ring.
    #[doc(hidden)]
    pub fn claim_pid_for_single_copy(&self, pid: u32) {
        self.sh.st.lock().proto.offer_single_copy(Some(pid));
    }

    /// Fault injection for tests and operators: abruptly shuts down every TCP
    /// connection of this port (as a network failure would); links reconnect and replay.
    pub fn reset_connections(&self) {
        let st = self.sh.st.lock();
        for c in st.tcp.values() {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
        drop(st);
        let _ = self.sh.waker.wake();
    }

    /// The core wait loop: spin (polling the rings) for `spin`, then sleep until the
    /// event thread (or, inline, our own poll) makes progress.
    fn wait_until<R>(&self, timeout: Duration, mut done: impl FnMut(&mut State) -> Option<R>) -> Option<R> {
        let started = Instant::now();
        let deadline = started.checked_add(timeout).unwrap_or(started + FOREVER);
        // The latest clock reading: one per pass, not one per use (a reading costs
        // ≈16 ns, a sizeable share of a small message's path).
        let mut now = started;
        let mut st = self.sh.st.lock();
        // Already finished (the event thread did the work while the application
        // computed): hand it over without touching the rings or the awake flags, whose
        // cache lines have gone cold meanwhile.
        if let Some(r) = done(&mut st) {
            st.last_return = Some(started);
            return Some(r);
        }
        if st.lease.take().is_none() {
            st.set_awake(true);
        }
        let mut spin_until = started + self.sh.spin;
        let mut extended = false;
        loop {
            progress_all(&mut st);
            self.kick_if_needed(&mut st);
            if let Some(r) = done(&mut st) {
                st.flush_all();
                st.update_app_bell();
                self.leave_awake(&mut st, started, now);
                return Some(r);
            }
            now = Instant::now();
            if now >= deadline {
                self.leave_awake(&mut st, started, now);
                return None;
            }
            if now >= spin_until && !extended {
                // A large transfer under way takes longer than the spin: the peer is
                // copying, and sleeping now would add a wake-up (10-20 µs here) to
                // each message. Spin for about as long as the bytes take.
                extended = true;
                let bulk = st.proto.bulk_bytes_in_flight() as u64;
                spin_until += Duration::from_nanos(bulk * SPIN_NS_PER_KIB / 1024);
            }
            if now < spin_until {
                // Spin without re-running the whole progress pass until there is
                // something to do (one load per ring), releasing the lock every few
                // rounds so that other threads of the process can get in.
                let seen = st.proto.completions();
                let mut n = 0u32;
                loop {
                    std::hint::spin_loop();
                    n = n.wrapping_add(1);
                    if n.is_multiple_of(16) {
                        MutexGuard::unlocked(&mut st, || {});
                        // A spinning waiter reads its TCP sockets itself: the reply is
                        // handled here instead of waking the event thread and then us.
                        st.poll_tcp();
                        now = Instant::now();
                        if now >= spin_until {
                            break;
                        }
                        if extended {
                            // Spinning on behalf of a long transfer: let anything else
                            // runnable on this core (another process's event thread
                            // doing the copy, say) go first.
                            MutexGuard::unlocked(&mut st, std::thread::yield_now);
                        }
                    }
                    if st.proto.completions() != seen || st.has_work() {
                        break;
                    }
                }
                continue;
            }
            if st.set_awake(false) {
                // Data slipped in while we declared sleep: go round again.
                st.set_awake(true);
                continue;
            }
            let slice = deadline.min(now + Duration::from_millis(100));
            match self.sh.progress {
                Progress::Thread => {
                    st.waiters += 1;
                    self.sh.cv.wait_until(&mut st, slice);
                    st.waiters -= 1;
                }
                Progress::Inline => {
                    MutexGuard::unlocked(&mut st, || poll_once(&self.sh, Some(slice - now)));
                }
            }
            st.set_awake(true);
        }
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        // Deliver what is queued (like MPI_Finalize), bounded by `linger`.
        let _ = self.wait_until(self.sh.linger, |st| st.output_settled().then_some(()));
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

fn getrandom(buf: &mut [u8]) -> io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// Binds the port's Unix socket, replacing a stale one left by a dead process but never
/// stealing the address of a live port.
fn bind_unix(path: &Path, me: Addr) -> Result<mio::net::UnixListener, NetError> {
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

/// Carries out the single copies the protocol asked for (see [`crate::cma`]), each
/// outside the port's lock: a 1 MiB copy takes ≈50–90 µs, during which other threads of
/// the process keep communicating (and an awake event thread takes the next copy).
///
/// Waking the sleeping event thread to copy in parallel was tried: streaming 1 MiB
/// messages stayed at 9–11 GB/s, the rate a single copy already reaches with 16
/// receive buffers in turn (the memory system, not a core, is the limit), so it is not
/// done.
fn run_copies(st: &mut MutexGuard<'_, State>) {
    let mut ran = false;
    while let Some(mut job) = st.proto.next_copy() {
        // Only from the process at the other end of the connection, as the kernel
        // names it: a pid from another pid namespace (or a forged one) would name some
        // other process here.
        let src = job.src();
        let verified = st.shm.values().any(|c| c.peer == src && c.peer_pid == Some(job.remote.pid));
        if !verified {
            st.stats.single_copies_not_from_peer += 1;
            st.log_error(format!("single copy offered by {src} as process {}, which is not the process connected as {src}; using the shared-memory ring instead", job.remote.pid));
            st.proto.copy_done(job, false);
            ran = true;
            continue;
        }
        let mut buf = std::mem::take(&mut job.buf);
        let r = MutexGuard::unlocked(st, || crate::cma::read_into(job.remote.pid, job.remote.addr, job.len, &mut buf));
        job.buf = buf;
        if let Err(e) = &r {
            st.log_error(format!(
                "single copy of {} bytes from process {} failed ({e}); using the shared-memory ring instead",
                job.len, job.remote.pid
            ));
        }
        st.proto.copy_done(job, r.is_ok());
        ran = true;
    }
    if ran {
        st.flush_all();
    }
}

/// Drains every transport, then carries out the copies that asked for.
fn progress_all(st: &mut MutexGuard<'_, State>) {
    st.progress();
    run_copies(st);
}

fn event_thread(sh: Arc<Shared>) {
    let mut events = Events::with_capacity(256);
    loop {
        {
            let mut poll = sh.poll.lock();
            if let Err(e) = poll.poll(&mut events, None) {
                if e.kind() != io::ErrorKind::Interrupted {
                    warn!("epoll failed: {e}");
                }
            }
        }
        if sh.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let mut st = sh.st.lock();
        st.set_awake(true);
        for ev in events.iter() {
            if ev.token() == TIMER {
                if let Some(t) = &st.timer {
                    t.clear();
                }
                continue;
            }
            st.handle_event(ev.token(), ev.is_readable() || ev.is_read_closed(), ev.is_writable());
        }
        progress_all(&mut st);
        st.timers();
        let now = Instant::now();
        let mut lease_check = None;
        if let Some(until) = st.lease {
            if until <= now {
                // The application went quiet: stop claiming to be awake for it.
                st.lease = None;
                st.lease_backoff = Duration::ZERO;
                if st.set_awake(false) {
                    st.set_awake(true);
                    progress_all(&mut st);
                    st.set_awake(false);
                }
            } else {
                // Renewed since we last looked: the application is busy communicating.
                // Look again less and less often (each look is a wake-up that takes a
                // core from the spinning application), up to MAX_LEASE_BACKOFF.
                st.lease_backoff = (st.lease_backoff * 2).clamp(sh.lease, MAX_LEASE_BACKOFF);
                lease_check = Some(until + st.lease_backoff);
            }
        }
        while st.set_awake(false) {
            st.set_awake(true);
            progress_all(&mut st);
        }
        st.update_app_bell();
        st.kick = false;
        if st.waiters > 0 {
            sh.cv.notify_all();
        }
        let wake = [st.next_timer(), lease_check].into_iter().flatten().min();
        st.thread_wake_at = wake;
        if let Some(t) = &st.timer {
            t.arm(wake.map(|t| t.saturating_duration_since(Instant::now())));
        }
    }
}

/// Inline progress: poll the descriptors once (the caller does not hold the state lock).
fn poll_once(sh: &Shared, timeout: Option<Duration>) {
    let mut events = Events::with_capacity(256);
    let timeout = {
        let st = sh.st.lock();
        match (st.next_timer(), timeout) {
            (Some(t), Some(d)) => Some(t.saturating_duration_since(Instant::now()).min(d)),
            (Some(t), None) => Some(t.saturating_duration_since(Instant::now())),
            (None, d) => d,
        }
    };
    {
        let mut poll = sh.poll.lock();
        let _ = poll.poll(&mut events, timeout);
    }
    let mut st = sh.st.lock();
    for ev in events.iter() {
        st.handle_event(ev.token(), ev.is_readable() || ev.is_read_closed(), ev.is_writable());
    }
    st.timers();
    progress_all(&mut st);
}

impl State {
    /// Counts a progressing thread in or out. Returns, when the last one leaves, whether
    /// work arrived meanwhile (then the caller must not sleep).
    fn set_awake(&mut self, awake: bool) -> bool {
        if awake {
            self.awake += 1;
            if self.awake == 1 {
                for c in self.shm.values() {
                    c.set_awake(true);
                }
            }
            false
        } else {
            self.awake -= 1;
            if self.awake > 0 {
                return false;
            }
            let mut pending = false;
            for c in self.shm.values_mut() {
                c.set_awake(false);
            }
            // Pairs with the peer's fence between publishing (data or space) and
            // reading our awake flag: either it sees us asleep and rings, or we see
            // its work here.
            std::sync::atomic::fence(Ordering::SeqCst);
            for c in self.shm.values_mut() {
                // Space freed while we were awake came without a doorbell too: a sender
                // that went to sleep on a full ring would otherwise miss it (this was a
                // 100 ms stall, ended only by the sleeping waiter's time slice).
                pending |= c.has_unannounced_work();
            }
            pending
        }
    }

    /// Pushes a new send out at once; if that finished it, hands its id back marked
    /// [`PRESETTLED`] instead of leaving the result to be collected. Not when the
    /// application reads events: those name the plain id.
    fn settled_at_once(&mut self, id: ReqId) -> ReqId {
        if self.proto.events_enabled() {
            return id;
        }
        self.flush_all();
        match self.proto.take_if_sent(id) {
            true => id | PRESETTLED,
            false => id,
        }
    }

    /// Makes the event thread wake by `at` at the latest, by arming its timer when it
    /// would otherwise sleep past `at` (no-op inline, where every wait polls itself).
    fn wake_event_thread_by(&mut self, at: Instant) {
        let Some(timer) = &self.timer else { return };
        if self.thread_wake_at.is_none_or(|t| t > at) {
            self.thread_wake_at = Some(at);
            timer.arm(Some(at.saturating_duration_since(Instant::now())));
        }
    }

    fn log_error(&mut self, msg: String) {
        warn!("{}: {msg}", self.me);
        self.stats.recent_errors.push(msg);
        if self.stats.recent_errors.len() > 16 {
            self.stats.recent_errors.remove(0);
        }
    }

    fn update_app_bell(&mut self) {
        let pending = self.proto.events_pending() > 0;
        if pending && !self.app_bell_set {
            self.app_bell.ring();
            self.app_bell_set = true;
        } else if !pending && self.app_bell_set {
            self.app_bell.clear();
            self.app_bell_set = false;
        }
    }

    /// Drains every inbound ring and pushes every queued frame out.
    fn progress(&mut self) {
        for i in 0..self.shm_ids.len() {
            if let Some(&id) = self.shm_ids.get(i) {
                self.drain_shm(id);
            }
        }
        self.flush_all();
    }

    /// Non-blocking read of every established TCP connection (for spinning waiters).
    fn poll_tcp(&mut self) {
        if self.tcp.is_empty() {
            return;
        }
        let mut ids = std::mem::take(&mut self.scratch_ids);
        ids.extend(self.tcp.iter().filter(|(_, c)| c.state == ConnState::Established).map(|(id, _)| *id));
        for id in ids.drain(..) {
            self.tcp_readable(id);
        }
        self.scratch_ids = ids;
    }

    /// Cheap check for the spin loop: anything in a ring or queued to send?
    fn has_work(&mut self) -> bool {
        self.proto.has_output() || self.shm.values_mut().any(|c| c.rx.has_data())
    }

    fn output_settled(&mut self) -> bool {
        self.flush_all();
        !self.proto.has_output()
            && self.shm.values().all(|c| c.tx.is_drained())
            && self.tcp.values().all(|c| c.queued() == 0)
            && self.links.values().all(|l| {
                l.send.unacked() == 0 || l.conn.is_none() && l.down_since.is_some_and(|t| t.elapsed() > self.cfg.reconnect_timeout)
            })
    }

    fn handle_event(&mut self, token: Token, readable: bool, writable: bool) {
        match token {
            WAKER => {}
            UNIX_LISTENER => self.accept_unix(),
            TCP_LISTENER => self.accept_tcp(),
            Token(t) if t >= FIRST_CONN => {
                let id = (t - FIRST_CONN) / 4;
                match (t - FIRST_CONN) % 4 {
                    0 => {
                        if let Some(c) = self.shm.get(&id) {
                            c.my_bell.clear();
                        }
                        self.drain_shm(id);
                        if let Some(p) = self.shm.get(&id).map(|c| c.peer) {
                            self.flush(p);
                        }
                    }
                    1 => self.check_shm_alive(id),
                    2 => {
                        if writable {
                            self.tcp_writable(id);
                        }
                        if readable {
                            self.tcp_readable(id);
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }

    // ----- shared memory ----------------------------------------------------------

    fn accept_unix(&mut self) {
        loop {
            match self.unix_listener.accept() {
                Ok((s, _)) => {
                    // SAFETY: converting an owned descriptor between wrapper types.
                    let std_sock = unsafe { std::os::unix::net::UnixStream::from_raw_fd(s.into_raw_fd()) };
                    let _ = std_sock.set_nonblocking(false);
                    match ShmConn::accept(std_sock) {
                        Ok(c) => {
                            let peer = c.peer;
                            self.proto.peer_recovered(peer);
                            let id = self.add_shm(c);
                            self.shm_send.entry(peer).or_insert(id);
                            self.drain_shm(id);
                        }
                        Err(e) => self.log_error(format!("shared-memory handshake refused: {e}")),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    self.log_error(format!("accept on unix socket: {e}"));
                    return;
                }
            }
        }
    }

    fn add_shm(&mut self, mut c: ShmConn) -> usize {
        let id = self.next_id;
        self.next_id += 1;
        c.set_awake(self.awake > 0);
        let bell = c.my_bell.raw();
        let _ = self.registry.register(&mut SourceFd(&bell), bell_token(id), Interest::READABLE);
        let _ = self.registry.register(&mut c.sock, shm_sock_token(id), Interest::READABLE);
        self.shm.insert(id, c);
        self.shm_ids.push(id);
        id
    }

    fn connect_shm(&mut self, peer: Addr) -> Result<usize, NetError> {
        let dir = self.cfg.runtime_dir();
        let path = dir.join(format!("port-{}.sock", peer.port));
        let sock = std::os::unix::net::UnixStream::connect(&path)
            .map_err(|e| NetError::Unreachable { peer, reason: format!("{}: {e}", path.display()) })?;
        // Whole records, and room for the largest frame (a ring takes records of up to
        // half its size).
        let largest = crate::ring::record_size(COMPACT_MAX + self.cfg.proto.chunk.max(self.cfg.proto.eager_threshold));
        let ring_bytes = self.cfg.ring_bytes.max(2 * largest).next_multiple_of(2 * crate::ring::RECORD_ALIGN);
        let c = ShmConn::create(self.me, peer, sock, ring_bytes)?;
        let id = self.add_shm(c);
        self.shm_send.insert(peer, id);
        Ok(id)
    }

    fn drain_shm(&mut self, id: usize) {
        let State { shm, proto, cfg, .. } = self;
        let Some(c) = shm.get_mut(&id) else { return };
        let max = cfg.max_frame.max(cfg.proto.chunk);
        let mut consumed = false;
        let mut failure = None;
        let (src, dst) = (c.peer, proto.addr());
        loop {
            let r = c.rx.pop_with(|rec| -> Result<(), NetError> {
                let (h, hlen) =
                    Header::decode_compact(rec, src, dst, max).map_err(|e| NetError::Frame { from: "shared memory".into(), error: e })?;
                let payload = &rec[hlen..];
                h.check_payload(payload).map_err(|e| NetError::Frame { from: "shared memory".into(), error: e })?;
                proto.on_frame(&h, payload)
            });
            match r {
                None => break,
                Some(res) => {
                    consumed = true;
                    if let Err(e) = res {
                        failure = Some(e);
                        break;
                    }
                }
            }
        }
        if consumed {
            c.notify_space();
        }
        if let Some(e) = failure {
            let peer = c.peer;
            self.log_error(format!("shared-memory connection with {peer}: {e}"));
            self.drop_shm(id, &e.to_string());
        }
    }

    fn check_shm_alive(&mut self, id: usize) {
        let Some(c) = self.shm.get_mut(&id) else { return };
        let mut b = [0u8; 64];
        use std::io::Read;
        match c.sock.read(&mut b) {
            Ok(0) => {
                // Peer exited: take what it left in the ring, then fail what remains.
                self.drain_shm(id);
                let peer = self.shm[&id].peer;
                debug!("{}: shared-memory peer {peer} closed", self.me);
                self.drop_shm(id, "process exited (shared-memory connection closed)");
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                self.drain_shm(id);
                self.drop_shm(id, &format!("shared-memory socket error: {e}"));
            }
        }
    }

    fn drop_shm(&mut self, id: usize, reason: &str) {
        if let Some(mut c) = self.shm.remove(&id) {
            self.shm_ids.retain(|&x| x != id);
            let bell = c.my_bell.raw();
            let _ = self.registry.deregister(&mut SourceFd(&bell));
            let _ = self.registry.deregister(&mut c.sock);
            let peer = c.peer;
            let others = self.shm.values().any(|o| o.peer == peer);
            if self.shm_send.get(&peer) == Some(&id) {
                self.shm_send.remove(&peer);
            }
            if !others {
                self.proto.peer_failed(peer, reason);
            } else if !self.shm_send.contains_key(&peer) {
                if let Some((oid, _)) = self.shm.iter().find(|(_, o)| o.peer == peer) {
                    self.shm_send.insert(peer, *oid);
                }
            }
        }
    }

    // ----- output -----------------------------------------------------------------

    fn flush_all(&mut self) {
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

    fn flush(&mut self, peer: Addr) {
        if peer.node == self.me.node {
            self.flush_shm(peer);
        } else {
            self.flush_tcp(peer);
        }
    }

    fn flush_shm(&mut self, peer: Addr) {
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
    fn push_shm_now(&mut self, h: &Header, payload: &[u8]) -> bool {
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

    fn flush_tcp(&mut self, peer: Addr) {
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
        let State { tcp, proto, links, .. } = self;
        let link = links.get_mut(&peer).unwrap();
        let Some(c) = tcp.get_mut(&cid) else { return };
        if c.state != ConnState::Established {
            return;
        }
        while c.queued() < (8 << 20) {
            let Some(out) = proto.pop_frame(peer) else { break };
            let OutFrame { mut frame, completes } = out;
            frame.header.ack = link.recv.take_ack();
            link.ack_due = None;
            let frame = link.send.stamp(frame);
            c.queue(&frame);
            proto.frame_sent(completes);
        }
        if let Err(e) = c.write_out() {
            let msg = format!("write to {peer}: {e}");
            self.conn_lost(cid, &msg);
        }
    }

    // ----- TCP --------------------------------------------------------------------

    fn resolve(&self, peer: Addr) -> Option<SocketAddr> {
        if let Some(a) = self.cfg.routes.get(&peer) {
            return Some(*a);
        }
        let d = self.cfg.directory.as_ref()?;
        std::fs::read_to_string(directory_entry(d, peer)).ok()?.trim().parse().ok()
    }

    fn connect_tcp(&mut self, peer: Addr) {
        let Some(addr) = self.resolve(peer) else {
            // The peer may not have started yet: retry until the reconnect timeout.
            self.link_down(peer, "no route: not in the routes table nor the directory");
            return;
        };
        let stream = match mio::net::TcpStream::connect(addr) {
            Ok(s) => s,
            Err(e) => {
                let msg = format!("connect to {peer} at {addr}: {e}");
                self.link_down(peer, &msg);
                return;
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        let mut c = TcpConn::new(stream, Some(peer), true, self.cfg.max_frame.max(self.cfg.proto.chunk));
        if let Err(e) = self.registry.register(&mut c.stream, tcp_token(id), Interest::READABLE | Interest::WRITABLE) {
            self.log_error(format!("register: {e}"));
            return;
        }
        let link = self.links.entry(peer).or_default();
        link.conn = Some(id);
        let mut h = Header::new(Kind::Hello, Channel::Control, self.me, peer);
        h.ack = link.recv.delivered();
        h.tag = self.incarnation;
        c.queue(&Frame::control(h));
        self.tcp.insert(id, c);
        // The connect may already be complete (loopback).
        self.tcp_writable(id);
    }

    fn accept_tcp(&mut self) {
        loop {
            let Some(l) = self.tcp_listener.as_ref() else { return };
            match l.accept() {
                Ok((stream, _)) => {
                    let id = self.next_id;
                    self.next_id += 1;
                    let mut c = TcpConn::new(stream, None, false, self.cfg.max_frame.max(self.cfg.proto.chunk));
                    if self.registry.register(&mut c.stream, tcp_token(id), Interest::READABLE | Interest::WRITABLE).is_ok() {
                        self.tcp.insert(id, c);
                        self.tcp_readable(id);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    self.log_error(format!("accept on TCP listener: {e}"));
                    return;
                }
            }
        }
    }

    fn tcp_writable(&mut self, id: usize) {
        let Some(c) = self.tcp.get_mut(&id) else { return };
        if c.state == ConnState::Connecting {
            match c.finish_connect() {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => {
                    let msg = format!("connect to {}: {e}", c.peer.map(|p| p.to_string()).unwrap_or_default());
                    self.conn_lost(id, &msg);
                    return;
                }
            }
        }
        let c = self.tcp.get_mut(&id).unwrap();
        if let Err(e) = c.write_out() {
            self.conn_lost(id, &format!("write: {e}"));
            return;
        }
        if let Some(p) = c.peer {
            if c.state == ConnState::Established {
                self.flush_tcp(p);
            }
        }
    }

    fn tcp_readable(&mut self, id: usize) {
        loop {
            let Some(c) = self.tcp.get_mut(&id) else { return };
            let outcome = match c.read_in() {
                Ok(o) => o,
                Err(e) => {
                    self.conn_lost(id, &format!("read: {e}"));
                    return;
                }
            };
            if !self.process_frames(id) {
                return;
            }
            match outcome {
                ReadOutcome::More => continue,
                ReadOutcome::Drained => break,
                ReadOutcome::Eof => {
                    self.conn_lost(id, "closed by peer");
                    return;
                }
            }
        }
        if let Some(p) = self.tcp.get(&id).and_then(|c| c.peer) {
            self.after_input(p);
        }
    }

    /// Schedules or sends acknowledgements after input from `peer`.
    fn after_input(&mut self, peer: Addr) {
        let Some(link) = self.links.get_mut(&peer) else { return };
        let pending = link.recv.pending_ack();
        if pending == 0 {
            return;
        }
        if pending >= 32 {
            self.send_ack(peer);
        } else if link.ack_due.is_none() {
            link.ack_due = Some(Instant::now() + Duration::from_millis(5));
            self.kick = true;
        }
        self.flush_tcp(peer);
    }

    fn send_ack(&mut self, peer: Addr) {
        let Some(link) = self.links.get_mut(&peer) else { return };
        let Some(cid) = link.conn else { return };
        let Some(c) = self.tcp.get_mut(&cid) else { return };
        if c.state != ConnState::Established {
            return;
        }
        let mut h = Header::new(Kind::Ack, Channel::Control, self.me, peer);
        h.ack = link.recv.take_ack();
        link.ack_due = None;
        c.queue(&Frame::control(h));
        if let Err(e) = c.write_out() {
            self.conn_lost(cid, &format!("write: {e}"));
        }
    }

    /// Decodes and handles buffered frames of connection `id`. Returns false if the
    /// connection was dropped.
    fn process_frames(&mut self, id: usize) -> bool {
        loop {
            let State { tcp, links, proto, stats, .. } = self;
            let Some(c) = tcp.get_mut(&id) else { return false };
            let state = c.state;
            let conn_peer = c.peer;
            let handshake: Header;
            match c.dec.next_frame() {
                Ok(None) => return true,
                Err(e) => {
                    stats.frames_rejected += 1;
                    let from = c.stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
                    let msg = NetError::Frame { from, error: e }.to_string();
                    self.log_error(format!("{msg}; resetting the connection"));
                    self.conn_lost(id, &msg);
                    return false;
                }
                Ok(Some((h, payload))) => {
                    if matches!(h.kind, Kind::Hello | Kind::HelloAck) {
                        handshake = h;
                    } else {
                        let err = if state != ConnState::Established || conn_peer != Some(h.src) {
                            Some(format!("{:?} frame from {} before handshake", h.kind, h.src))
                        } else {
                            let link = links.get_mut(&h.src).expect("established connection has a link");
                            if let Err(e) = link.send.on_ack(h.ack) {
                                Some(e.to_string())
                            } else if h.kind.is_sequenced() {
                                match link.recv.admit(h.seq) {
                                    Ok(Admit::Deliver) => proto.on_frame(&h, payload).err().map(|e| e.to_string()),
                                    Ok(Admit::Duplicate) => {
                                        stats.duplicates_dropped += 1;
                                        None
                                    }
                                    Err(e) => Some(e.to_string()),
                                }
                            } else {
                                None
                            }
                        };
                        if let Some(msg) = err {
                            self.log_error(format!("protocol error on connection to {}: {msg}", h.src));
                            self.conn_lost(id, &msg);
                            return false;
                        }
                        continue;
                    }
                }
            }
            if !self.handshake(id, &handshake) {
                return false;
            }
        }
    }

    fn handshake(&mut self, id: usize, h: &Header) -> bool {
        let peer = h.src;
        if h.dst != self.me {
            self.log_error(format!("handshake from {peer} addressed to {}, not {}", h.dst, self.me));
            self.conn_lost(id, "misaddressed handshake");
            return false;
        }
        let c = self.tcp.get(&id).unwrap();
        match (h.kind, c.state) {
            (Kind::Hello, ConnState::Accepted) => {
                self.check_incarnation(peer, h.tag);
                let link = self.links.entry(peer).or_default();
                if let Some(existing) = link.conn.filter(|&e| e != id) {
                    let ours_pending = self.tcp.get(&existing).is_some_and(|e| e.initiator && e.state != ConnState::Established);
                    if ours_pending && self.me < peer {
                        // Simultaneous connect: the lower address's connection wins.
                        self.close_tcp(id);
                        return false;
                    }
                    self.close_tcp(existing);
                }
                let link = self.links.get_mut(&peer).unwrap();
                link.conn = Some(id);
                let c = self.tcp.get_mut(&id).unwrap();
                c.peer = Some(peer);
                c.state = ConnState::Established;
                let mut a = Header::new(Kind::HelloAck, Channel::Control, self.me, peer);
                a.ack = link.recv.delivered();
                a.tag = self.incarnation;
                c.queue(&Frame::control(a));
                self.established(peer, id, h.ack)
            }
            (Kind::HelloAck, ConnState::HelloSent) if c.peer == Some(peer) => {
                self.check_incarnation(peer, h.tag);
                let c = self.tcp.get_mut(&id).unwrap();
                c.state = ConnState::Established;
                self.established(peer, id, h.ack)
            }
            (k, s) => {
                self.log_error(format!("unexpected {k:?} from {peer} in state {s:?}"));
                self.conn_lost(id, "handshake out of order");
                false
            }
        }
    }

    /// A new incarnation of `peer` (it restarted): its old conversation is over.
    fn check_incarnation(&mut self, peer: Addr, inc: u64) {
        let link = self.links.entry(peer).or_default();
        match link.incarnation {
            Some(old) if old != inc => {
                let conn = link.conn;
                *link = Link::new();
                link.conn = conn;
                link.incarnation = Some(inc);
                self.proto.peer_failed(peer, "peer restarted");
                self.proto.peer_recovered(peer);
            }
            _ => link.incarnation = Some(inc),
        }
        self.proto.peer_recovered(peer);
    }

    fn established(&mut self, peer: Addr, id: usize, peer_has: u64) -> bool {
        self.stats.connections_established += 1;
        let link = self.links.get_mut(&peer).unwrap();
        link.down_since = None;
        link.retry_at = None;
        link.backoff = Duration::ZERO;
        let replay = match link.send.replay(peer_has) {
            Ok(r) => r,
            Err(e) => {
                let msg = e.to_string();
                self.log_error(format!("handshake with {peer}: {msg}"));
                self.conn_lost(id, &msg);
                return false;
            }
        };
        let c = self.tcp.get_mut(&id).unwrap();
        self.stats.frames_replayed += replay.len() as u64;
        for mut f in replay {
            f.header.ack = link.recv.delivered();
            c.queue(&f);
        }
        debug!("{}: link to {peer} established", self.me);
        self.flush_tcp(peer);
        self.tcp.contains_key(&id)
    }

    fn close_tcp(&mut self, id: usize) {
        if let Some(mut c) = self.tcp.remove(&id) {
            let _ = self.registry.deregister(&mut c.stream);
        }
    }

    fn conn_lost(&mut self, id: usize, reason: &str) {
        let Some(mut c) = self.tcp.remove(&id) else { return };
        let _ = self.registry.deregister(&mut c.stream);
        self.stats.connections_lost += 1;
        debug!("{}: connection {id} lost: {reason}", self.me);
        if let Some(peer) = c.peer {
            if self.links.get(&peer).is_some_and(|l| l.conn == Some(id)) {
                self.link_down(peer, reason);
            }
        }
    }

    fn link_down(&mut self, peer: Addr, reason: &str) {
        let timeout = self.cfg.reconnect_timeout;
        let link = self.links.entry(peer).or_default();
        link.conn = None;
        let now = Instant::now();
        let since = *link.down_since.get_or_insert(now);
        link.backoff = if link.backoff.is_zero() { Duration::from_millis(1) } else { (link.backoff * 2).min(Duration::from_millis(500)) };
        link.retry_at = Some(now + link.backoff);
        self.kick = true;
        if now.duration_since(since) > timeout {
            self.links.remove(&peer);
            self.log_error(format!("giving up on {peer} after {timeout:?}: {reason}"));
            self.proto.peer_failed(peer, reason);
        }
    }

    fn timers(&mut self) {
        let now = Instant::now();
        let due: Vec<Addr> = self.shm_retry.iter().filter(|(_, (_, next))| *next <= now).map(|(p, _)| *p).collect();
        for p in due {
            self.flush_shm(p);
        }
        let acks: Vec<Addr> = self.links.iter().filter(|(_, l)| l.ack_due.is_some_and(|t| t <= now)).map(|(p, _)| *p).collect();
        for p in acks {
            self.send_ack(p);
        }
        let retry: Vec<Addr> =
            self.links.iter().filter(|(_, l)| l.conn.is_none() && l.retry_at.is_some_and(|t| t <= now)).map(|(p, _)| *p).collect();
        for p in retry {
            let wants = self.links[&p].send.unacked() > 0 || self.proto.is_dirty(p);
            if wants {
                self.connect_tcp(p);
            } else if let Some(l) = self.links.get_mut(&p) {
                l.retry_at = None;
                l.down_since = None;
            }
        }
    }

    fn next_timer(&self) -> Option<Instant> {
        let links = self.links.values().flat_map(|l| [l.ack_due, if l.conn.is_none() { l.retry_at } else { None }]).flatten();
        links.chain(self.shm_retry.values().map(|(_, next)| *next)).min()
    }
}

impl AsRawFd for Port {
    /// The event descriptor (see [`Port::enable_events`]).
    fn as_raw_fd(&self) -> RawFd {
        self.sh.st.lock().app_bell.raw()
    }
}
