//! The agent process: one event loop that drives every component.
//!
//! One thread owns all component state and waits in `epoll` (mio) on four sources: the
//! registration socket and its client connections, the gepsea-net port's event
//! descriptor (requests from clients, messages from other agents, completed sends and
//! remote memory accesses, failed peers), a waker for calls from the agent's own job
//! threads, and a timer for heartbeats and deadlines. Nothing in the loop blocks: work
//! that takes CPU or waits on other agents (compression, plug-ins, cache misses that
//! must consult the directory and fetch) runs on job threads that call back into the
//! loop through the same [`Services`] API applications use. Idle, the loop wakes only
//! for the heartbeat (every `heartbeat`), so an idle agent costs almost no CPU.
//!
//! **Ownership.** Bulletin-board keys, locks and merge streams are owned by one agent
//! each, chosen by rendezvous hashing over the live agents (`board::ranked`); requests
//! travel to the owner (`PeerMsg::Routed`) and the owner answers the origin agent, which
//! answers the client. Board writes are copied to the key's backup (the next agent in
//! rendezvous order), which becomes the owner if the owner dies.
//!
//! **Failures.** A client that dies closes its registration socket: its agent tells every
//! agent (`ProcessDied`), which release its locks, requeue its tasks and free its global
//! memory. An agent that dies is detected by gepsea-net (its link stays down longer than
//! `peer_timeout`); every survivor drops it from the view, re-homes board entries,
//! re-registers the locks its clients hold with their new owners (`Reclaim`) and, if the
//! scheduler changed, rejoins the new scheduler. New owners hold back lock requests and
//! the new scheduler holds back assignments until every survivor has re-registered.
//!
//! Limits (documented in `docs/architecture.md`): agents should all be up before clients
//! take locks (`--nodes` makes clients wait for that); merge streams and the cache copies
//! of a dead agent are lost.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use gepsea_net::{namespace_dir, Addr, Completion, Event, Port, PortConfig, ReqId};
use mio::net::{UnixListener, UnixStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use serde::Serialize;
use tracing::{debug, info, warn};

use crate::api::{check, ApiError, Services};
use crate::core::advert::{Advert, Inbox, Outbox, Sequencer};
use crate::core::board::{ranked, Board, BoardError, Versioned};
use crate::core::cache::{dir_key, holders, with_holder, Store};
use crate::core::compress::Engine;
use crate::core::locks::LockTable;
use crate::core::merge::Merger;
use crate::core::Client;
use crate::plugin::{Context, Registry};
use crate::primitives::balance::{Assignment, Scheduler};
use crate::primitives::gma::Allocations;
use crate::primitives::{elect, pstate};
use crate::wire::*;

/// How to run an agent.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub node: u32,
    pub namespace: String,
    /// TCP address other agents reach this one at.
    pub listen: Option<SocketAddr>,
    /// Shared directory where agents publish themselves and find each other.
    pub rendezvous: Option<PathBuf>,
    /// Static peers (node id, address).
    pub peers: Vec<(u32, SocketAddr)>,
    /// Agents expected; the agent reports ready (and clients start) once all are up.
    pub nodes: Option<usize>,
    /// A peer whose link stays down this long is declared dead.
    pub peer_timeout: Duration,
    pub heartbeat: Duration,
    /// Bytes of the data cache.
    pub cache_bytes: usize,
    /// Bytes of global memory this agent lends.
    pub gma_bytes: u64,
    /// Job threads (plug-ins, compression, cache misses) for this node's processes; as
    /// many again serve work that other agents ask of this one.
    pub jobs: usize,
}

impl AgentConfig {
    pub fn new(node: u32, namespace: &str) -> Self {
        AgentConfig {
            node,
            namespace: namespace.to_string(),
            listen: None,
            rendezvous: None,
            peers: Vec::new(),
            nodes: None,
            peer_timeout: Duration::from_secs(3),
            heartbeat: Duration::from_millis(500),
            cache_bytes: 1 << 30,
            gma_bytes: 1 << 30,
            jobs: 4,
        }
    }
}

/// The agent's registration socket for (namespace, node).
pub fn agent_socket(namespace: &str, node: u32) -> PathBuf {
    namespace_dir(namespace).join(format!("node-{node}")).join("agent.sock")
}

/// Why the agent could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("an agent for node {node} of namespace {namespace:?} is already running (its socket {path} answers); stop it first or pick another --node-id")]
    AlreadyRunning { node: u32, namespace: String, path: PathBuf },
    #[error("node {node} is already served by a live agent at {addr} (rendezvous entry {path}); pick another --node-id")]
    NodeTaken { node: u32, addr: String, path: PathBuf },
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error(transparent)]
    Net(#[from] gepsea_net::NetError),
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> AgentError {
    let context = context.into();
    move |source| AgentError::Io { context, source }
}

/// Stops a running agent from another thread (or a signal handler thread).
#[derive(Default)]
pub struct Shutdown {
    flag: AtomicBool,
    waker: parking_lot::Mutex<Option<Arc<Waker>>>,
}

impl Shutdown {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
    pub fn trigger(&self) {
        self.flag.store(true, Ordering::SeqCst);
        if let Some(w) = &*self.waker.lock() {
            let _ = w.wake();
        }
    }
    fn is_set(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }
}

const WAKER: Token = Token(0);
const PORT_EVENTS: Token = Token(1);
const LISTENER: Token = Token(2);
const FIRST_SESSION: usize = 16;

/// Where a reply goes.
enum ReplyTo {
    Client {
        port: u32,
        id: u64,
    },
    Local(Sender<Reply>),
    /// Another agent's `PeerMsg` operation `op`.
    Peer {
        node: u32,
        op: u64,
    },
    /// Nobody waits (background work such as directory clean-up).
    Discard,
}

/// A call from a job thread into the loop.
enum Call {
    Op { client: Client, op: Op, reply: Sender<Reply> },
    Internal { op: Internal, reply: Sender<Reply> },
}

/// Loop-only operations the job threads need.
enum Internal {
    LocalGet { name: String },
    StoreLocal { name: String, data: Vec<u8> },
    DropLocal { name: String },
    FetchFrom { node: u32, name: String },
    StoreAt { node: u32, name: String, data: Vec<u8> },
}

/// In-process [`Services`] for job threads and plug-ins.
#[derive(Clone)]
pub struct InProc {
    tx: Sender<Call>,
    waker: Arc<Waker>,
    client: Client,
}

impl InProc {
    fn roundtrip(&self, c: impl FnOnce(Sender<Reply>) -> Call) -> Result<Reply, ApiError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.tx.send(c(tx)).map_err(|_| ApiError::Transport("agent stopped".into()))?;
        let _ = self.waker.wake();
        rx.recv().map_err(|_| ApiError::Transport("agent stopped".into()))
    }
    fn internal(&self, op: Internal) -> Result<Reply, ApiError> {
        check(self.roundtrip(|reply| Call::Internal { op, reply })?)
    }
}

impl Services for InProc {
    fn call(&self, op: Op) -> Result<Reply, ApiError> {
        let client = self.client;
        check(self.roundtrip(|reply| Call::Op { client, op, reply })?)
    }
}

/// Work for a job thread.
struct Job {
    reply: ReplyTo,
    work: Box<dyn FnOnce(&InProc) -> Reply + Send>,
    client: Client,
}

struct JobDone {
    reply: ReplyTo,
    result: Reply,
}

struct Session {
    stream: UnixStream,
    buf: Vec<u8>,
    port: Option<u32>,
}

struct ClientInfo {
    session: Token,
    pid: u32,
    name: String,
    inbox: Inbox,
    /// A parked mailbox read: (request id, max, deadline).
    parked: Option<(u64, u32, Instant)>,
    activity: Activity,
    holds: Vec<String>,
}

#[derive(Debug)]
enum NetOp {
    RecvRequest,
    RecvPeer,
    RecvLarge { src: Addr, peer: bool },
    Send,
    Rma { reply_to_port: Option<u32>, id: u64 },
}

/// An operation this agent routed to an owner and awaits.
struct Routed {
    dest: u32,
    client: Client,
    op: Op,
    reply: ReplyTo,
}

#[derive(Serialize)]
struct Status {
    node: u32,
    pid: u32,
    namespace: String,
    listen: Option<String>,
    rendezvous: Option<String>,
    ready: bool,
    expected_nodes: Option<usize>,
    view: Vec<u32>,
    dead: Vec<u32>,
    scheduler: Option<u32>,
    peer_timeout_ms: u64,
    cache_bytes_limit: usize,
    gma_bytes_limit: u64,
    clients: Vec<StatusClient>,
    board_keys: usize,
    locks: Vec<StatusLock>,
    cache_objects: Vec<String>,
    cache_bytes: usize,
    gma_blocks: usize,
    gma_bytes: u64,
    merge_streams: usize,
    tasks: Option<StatusTasks>,
    plugins: Vec<(String, Vec<crate::plugin::Uses>)>,
    requests_served: u64,
    peer_messages: u64,
}

#[derive(Serialize)]
struct StatusClient {
    port: u32,
    pid: u32,
    name: String,
    activity: Activity,
    subscribed_unread: usize,
}

#[derive(Serialize)]
struct StatusLock {
    name: String,
    holders: Vec<String>,
    waiting: Vec<String>,
}

#[derive(Serialize)]
struct StatusTasks {
    queued: usize,
    running: usize,
    idle_takers: usize,
    assigned_total: u64,
    settling: bool,
}

/// A running agent (see the module docs).
pub struct Agent {
    cfg: AgentConfig,
    me: u32,
    incarnation: u64,
    port: Port,
    poll: Poll,
    listener: UnixListener,
    sock_path: PathBuf,
    runtime_dir: PathBuf,
    rendezvous_entry: Option<PathBuf>,
    registry: Registry,
    engine: Arc<Engine>,
    sessions: HashMap<Token, Session>,
    next_session: usize,
    clients: HashMap<u32, ClientInfo>,
    next_port: u32,
    // membership
    known: BTreeMap<u32, Option<(u32, u64)>>,
    dead: BTreeSet<u32>,
    view: Vec<u32>,
    ready: bool,
    // gepsea-net
    net: HashMap<ReqId, NetOp>,
    large_counter: u64,
    loopback: VecDeque<PeerMsg>,
    loopback_from: VecDeque<(u32, PeerMsg)>,
    // components
    board: Board,
    locks: LockTable,
    lock_waiters: HashMap<(String, Client), (u32, u64)>,
    held_locks: HashMap<(String, Client), LockMode>,
    seq: Sequencer,
    outbox: Outbox,
    store: Store,
    merges: HashMap<String, Merger<Record>>,
    gma: Allocations,
    ptable: pstate::Table,
    state_version: u64,
    scheduler: Option<Scheduler>,
    scheduler_node: Option<u32>,
    // origin-side bookkeeping
    next_op: u64,
    routed: HashMap<u64, Routed>,
    peer_ops: HashMap<u64, (u32, ReplyTo)>,
    cancellable: HashMap<(u32, u64), u64>,
    my_tasks: BTreeMap<u64, Task>,
    next_task: u64,
    holding: HashMap<u64, Client>,
    takes: HashMap<u64, (Client, ReplyTo, Instant)>,
    // settling after a death: agents whose Reclaim is awaited, deferred lock requests
    awaiting_reclaim: BTreeSet<u32>,
    /// Reclaims that arrived before we saw the death they refer to: (their view, sender).
    early_reclaims: Vec<(Vec<u32>, u32)>,
    /// Load-balancing messages that reached us before we knew we were the scheduler.
    early_sched: Vec<(u32, PeerMsg)>,
    sched_settle_deadline: Option<Instant>,
    settle_deadline: Option<Instant>,
    deferred: Vec<(u32, u64, Client, Op)>,
    // jobs: the first half serves this node's processes, the second half other agents
    jobs: Vec<Sender<Job>>,
    /// Runs jobs that a job itself asked for (see [`Agent::job`]).
    nested: (InProc, Sender<JobDone>),
    calls_rx: Receiver<Call>,
    done_rx: Receiver<JobDone>,
    shutdown: Arc<Shutdown>,
    next_heartbeat: Instant,
    requests_served: u64,
    peer_messages: u64,
}

impl Agent {
    /// Opens the registration socket and the port, publishes the rendezvous entry and
    /// starts the job threads.
    pub fn start(cfg: AgentConfig, registry: Registry, engine: Engine, shutdown: Arc<Shutdown>) -> Result<Agent, AgentError> {
        let me = cfg.node;
        let runtime_dir = namespace_dir(&cfg.namespace).join(format!("node-{me}"));
        std::fs::create_dir_all(&runtime_dir).map_err(io_err(format!("creating {}", runtime_dir.display())))?;
        let sock_path = runtime_dir.join("agent.sock");
        if sock_path.exists() {
            if std::os::unix::net::UnixStream::connect(&sock_path).is_ok() {
                return Err(AgentError::AlreadyRunning { node: me, namespace: cfg.namespace.clone(), path: sock_path });
            }
            warn!("removing stale agent socket {} (nobody answers on it)", sock_path.display());
            let _ = std::fs::remove_file(&sock_path);
        }
        // A stale port socket of a previous agent of this node would make the port
        // refuse to bind; the agent socket above proved that agent is gone.
        let _ = std::fs::remove_file(runtime_dir.join("port-0.sock"));
        // Plug-ins' node-local files; whatever a dead predecessor left is ours to drop.
        let scratch = runtime_dir.join("scratch");
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch).map_err(io_err(format!("creating {}", scratch.display())))?;
        let mut rendezvous_entry = None;
        if let Some(dir) = &cfg.rendezvous {
            std::fs::create_dir_all(dir).map_err(io_err(format!("creating rendezvous directory {}", dir.display())))?;
            let entry = dir.join(format!("agent-{me}.json"));
            if let Ok(text) = std::fs::read_to_string(&entry) {
                let addr = serde_json::from_str::<serde_json::Value>(&text).ok().and_then(|v| v["listen"].as_str().map(str::to_string));
                if let Some(a) = addr.as_deref().and_then(|a| a.parse::<SocketAddr>().ok()) {
                    if std::net::TcpStream::connect_timeout(&a, Duration::from_millis(300)).is_ok() && Some(a) != cfg.listen {
                        return Err(AgentError::NodeTaken { node: me, addr: a.to_string(), path: entry });
                    }
                }
                warn!("replacing stale rendezvous entry {} ({})", entry.display(), addr.unwrap_or_default());
            }
            rendezvous_entry = Some(entry);
        }
        let mut pc = PortConfig::new(&cfg.namespace, Addr::new(me, 0));
        pc.listen = cfg.listen;
        pc.directory = cfg.rendezvous.clone();
        pc.reconnect_timeout = cfg.peer_timeout;
        pc.linger = Duration::from_millis(500);
        for (n, a) in &cfg.peers {
            if *n != me {
                pc.routes.insert(Addr::new(*n, 0), *a);
            }
        }
        let port = Port::open(pc)?;
        let listen = port.listen_addr();
        if let Some(entry) = &rendezvous_entry {
            let doc = serde_json::json!({"node": me, "pid": std::process::id(), "listen": listen.map(|a| a.to_string())});
            let tmp = entry.with_extension("json.tmp");
            std::fs::write(&tmp, doc.to_string())
                .and_then(|_| std::fs::rename(&tmp, entry))
                .map_err(io_err(format!("writing {}", entry.display())))?;
        }
        let poll = Poll::new().map_err(io_err("creating the event loop"))?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(io_err("creating the waker"))?);
        *shutdown.waker.lock() = Some(waker.clone());
        let efd = port.enable_events();
        poll.registry().register(&mut SourceFd(&efd), PORT_EVENTS, Interest::READABLE).map_err(io_err("watching the port"))?;
        let mut listener = UnixListener::bind(&sock_path).map_err(io_err(format!("binding {}", sock_path.display())))?;
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE).map_err(io_err("watching the socket"))?;

        let (calls_tx, calls_rx) = crossbeam_channel::unbounded();
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<JobDone>();
        let engine = Arc::new(engine);
        let mut jobs = Vec::new();
        let template = InProc { tx: calls_tx.clone(), waker: waker.clone(), client: Client::new(me, 0) };
        for i in 0..2 * cfg.jobs.max(1) {
            let (tx, rx) = crossbeam_channel::unbounded::<Job>();
            let inproc = template.clone();
            let done_tx = done_tx.clone();
            let waker = waker.clone();
            std::thread::Builder::new()
                .name(format!("gepsea-job-{i}"))
                .spawn(move || {
                    for job in rx {
                        let svc = InProc { client: job.client, ..inproc.clone() };
                        let result = (job.work)(&svc);
                        if done_tx.send(JobDone { reply: job.reply, result }).is_err() {
                            break;
                        }
                        let _ = waker.wake();
                    }
                })
                .map_err(io_err("starting a job thread"))?;
            jobs.push(tx);
        }
        let incarnation = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        let mut known = BTreeMap::new();
        for (n, _) in &cfg.peers {
            if *n != me {
                known.insert(*n, None);
            }
        }
        info!("agent of node {me} (namespace {:?}) listening on {:?}, socket {}", cfg.namespace, listen, sock_path.display());
        let mut a = Agent {
            me,
            incarnation,
            port,
            poll,
            listener,
            sock_path,
            runtime_dir,
            rendezvous_entry,
            registry,
            engine,
            sessions: HashMap::new(),
            next_session: FIRST_SESSION,
            clients: HashMap::new(),
            next_port: 1,
            known,
            dead: BTreeSet::new(),
            view: vec![me],
            ready: false,
            net: HashMap::new(),
            large_counter: 0,
            loopback: VecDeque::new(),
            loopback_from: VecDeque::new(),
            board: Board::new(),
            locks: LockTable::new(),
            lock_waiters: HashMap::new(),
            held_locks: HashMap::new(),
            seq: Sequencer::default(),
            outbox: Outbox::new(me),
            store: Store::new(cfg.cache_bytes),
            merges: HashMap::new(),
            gma: Allocations::new(cfg.gma_bytes),
            ptable: pstate::Table::default(),
            state_version: 0,
            scheduler: None,
            scheduler_node: None,
            next_op: 1,
            routed: HashMap::new(),
            peer_ops: HashMap::new(),
            cancellable: HashMap::new(),
            my_tasks: BTreeMap::new(),
            next_task: 1,
            holding: HashMap::new(),
            takes: HashMap::new(),
            awaiting_reclaim: BTreeSet::new(),
            early_reclaims: Vec::new(),
            early_sched: Vec::new(),
            sched_settle_deadline: None,
            settle_deadline: None,
            deferred: Vec::new(),
            jobs,
            nested: (template, done_tx.clone()),
            calls_rx,
            done_rx,
            shutdown,
            next_heartbeat: Instant::now(),
            requests_served: 0,
            peer_messages: 0,
            cfg,
        };
        a.post_receives();
        a.view_changed(&[]);
        a.publish_state();
        Ok(a)
    }

    /// The port's TCP address (for tests that let the system pick one).
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.port.listen_addr()
    }

    /// Serves until [`Shutdown::trigger`].
    pub fn run(mut self) -> Result<(), AgentError> {
        let mut events = Events::with_capacity(256);
        // Spin, then sleep: right after work, poll without blocking for a short while
        // so that a client's next request is picked up without two thread wake-ups
        // (the port's event thread, then this loop); idle, block until the next event.
        const SPIN: Duration = Duration::from_micros(50);
        let mut last_work = Instant::now() - SPIN;
        while !self.shutdown.is_set() {
            let spinning = last_work.elapsed() < SPIN;
            if spinning {
                self.port.poll();
            }
            let timeout = if spinning { Duration::ZERO } else { self.next_timeout() };
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(AgentError::Io { context: "waiting for events".into(), source: e });
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(),
                    WAKER | PORT_EVENTS => {}
                    t => self.session_ready(t),
                }
            }
            if self.turn() || !events.is_empty() {
                last_work = Instant::now();
            }
        }
        info!("agent of node {} stopping", self.me);
        let _ = std::fs::remove_dir_all(self.runtime_dir.join("scratch"));
        Ok(())
    }

    /// One pass over everything that may have happened.
    fn turn(&mut self) -> bool {
        let mut any = false;
        loop {
            let mut progressed = false;
            while let Ok(c) = self.calls_rx.try_recv() {
                progressed = true;
                self.call(c);
            }
            while let Ok(d) = self.done_rx.try_recv() {
                progressed = true;
                self.reply(d.reply, d.result);
            }
            while let Some(ev) = self.port.next_event() {
                progressed = true;
                match ev {
                    Event::Completed(id) => self.net_completed(id),
                    Event::PeerFailed { peer, reason } => self.peer_failed(peer, &reason),
                    _ => {}
                }
            }
            while let Some(m) = self.loopback.pop_front() {
                progressed = true;
                self.peer_msg(self.me, m);
            }
            while let Some((from, m)) = self.loopback_from.pop_front() {
                progressed = true;
                self.peer_msg(from, m);
            }
            if !progressed {
                break;
            }
            any = true;
        }
        self.timers();
        any
    }

    fn next_timeout(&self) -> Duration {
        let now = Instant::now();
        let mut t = self.next_heartbeat;
        for c in self.clients.values() {
            if let Some((_, _, d)) = c.parked {
                t = t.min(d);
            }
        }
        for (_, _, d) in self.takes.values() {
            t = t.min(*d);
        }
        for d in [self.settle_deadline, self.sched_settle_deadline].into_iter().flatten() {
            t = t.min(d);
        }
        t.saturating_duration_since(now)
    }

    fn timers(&mut self) {
        let now = Instant::now();
        if now >= self.next_heartbeat {
            self.next_heartbeat = now + self.cfg.heartbeat;
            self.discover();
            for n in self.view.clone() {
                if n != self.me {
                    self.send_peer(n, &PeerMsg::Heartbeat);
                }
            }
            let unknown: Vec<u32> = self.known.iter().filter(|(n, v)| v.is_none() && !self.dead.contains(n)).map(|(n, _)| *n).collect();
            for n in unknown {
                self.send_peer(n, &PeerMsg::Hello { node: self.me, pid: std::process::id(), incarnation: self.incarnation });
            }
        }
        let expired: Vec<u32> = self.clients.iter().filter(|(_, c)| c.parked.is_some_and(|(_, _, d)| d <= now)).map(|(p, _)| *p).collect();
        for p in expired {
            if let Some((id, _, _)) = self.clients.get_mut(&p).and_then(|c| c.parked.take()) {
                self.reply(ReplyTo::Client { port: p, id }, Reply::Adverts(Vec::new()));
            }
        }
        let expired: Vec<u64> = self.takes.iter().filter(|(_, (_, _, d))| *d <= now).map(|(o, _)| *o).collect();
        for op in expired {
            let (_, reply, _) = self.takes.remove(&op).unwrap();
            if let Some(s) = self.scheduler_node {
                self.send_peer(s, &PeerMsg::CancelTake { op });
            }
            self.reply(reply, Reply::Task(None));
        }
        if self.sched_settle_deadline.is_some_and(|d| d <= now) {
            self.sched_settle_deadline = None;
            if let Some(s) = &mut self.scheduler {
                if s.settling() {
                    warn!("node {}: scheduler stops waiting for rejoins", self.me);
                    let a = s.settle();
                    self.deliver_assignments(a);
                }
            }
        }
        if self.settle_deadline.is_some_and(|d| d <= now) {
            warn!("node {}: giving up waiting for lock re-registration from {:?}", self.me, self.awaiting_reclaim);
            self.awaiting_reclaim.clear();
            self.settled();
        }
    }

    // ----- membership -------------------------------------------------------------

    fn discover(&mut self) {
        let Some(dir) = self.cfg.rendezvous.clone() else { return };
        let Ok(rd) = std::fs::read_dir(&dir) else { return };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(n) = name.strip_prefix("agent-").and_then(|s| s.strip_suffix(".json")).and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if n != self.me && !self.known.contains_key(&n) && !self.dead.contains(&n) {
                debug!("node {}: found agent {n} in {}", self.me, dir.display());
                self.known.insert(n, None);
                self.send_peer(n, &PeerMsg::Hello { node: self.me, pid: std::process::id(), incarnation: self.incarnation });
            }
        }
    }

    fn peer_alive(&mut self, node: u32, pid: u32, incarnation: u64) {
        if self.dead.contains(&node) {
            return;
        }
        let was = self.known.insert(node, Some((pid, incarnation)));
        if !matches!(was, Some(Some(_))) {
            info!("node {}: agent {node} joined", self.me);
            let old = self.view.clone();
            self.view.push(node);
            self.view.sort_unstable();
            self.view_changed(&old);
            self.publish_state();
        }
    }

    fn peer_failed(&mut self, peer: Addr, reason: &str) {
        if peer.node == self.me {
            if peer.port != 0 {
                self.client_died(peer.port);
            }
            return;
        }
        if peer.port != 0 || self.dead.contains(&peer.node) {
            return;
        }
        warn!("node {}: agent {} failed: {reason}", self.me, peer.node);
        let dead = peer.node;
        self.dead.insert(dead);
        self.known.remove(&dead);
        let old = self.view.clone();
        self.view.retain(|&n| n != dead);
        self.ptable.remove(dead);
        self.outbox.drop_dest(dead);
        self.seq.forget(dead);
        let grants = self.locks.node_died(dead);
        self.lock_waiters.retain(|(_, c), _| c.node != dead);
        self.deferred.retain(|(o, _, _, _)| *o != dead);
        self.send_grants(grants);
        if let Some(s) = &mut self.scheduler {
            let a = s.node_died(dead);
            self.deliver_assignments(a);
        }
        // Locks held by our clients whose owner moved: re-register them with the new
        // owners, and tell every survivor we did (they wait for everyone's).
        let mut reclaims: BTreeMap<u32, Vec<(String, Client, LockMode)>> = BTreeMap::new();
        for ((lock, c), m) in &self.held_locks {
            let key = lock_key(lock);
            if ranked(&key, &old).first() == Some(&dead) {
                if let Some(&o) = ranked(&key, &self.view).first() {
                    reclaims.entry(o).or_default().push((lock.clone(), *c, *m));
                }
            }
        }
        self.awaiting_reclaim = self.view.iter().copied().collect();
        for (v, from) in std::mem::take(&mut self.early_reclaims) {
            if v == self.view {
                self.awaiting_reclaim.remove(&from);
            }
        }
        self.settle_deadline = Some(Instant::now() + self.cfg.peer_timeout * 2);
        for n in self.view.clone() {
            let locks = reclaims.remove(&n).unwrap_or_default();
            self.send_peer(n, &PeerMsg::Reclaim { view: self.view.clone(), locks });
        }
        self.view_changed(&old);
        // Operations in flight to the dead agent go to the keys' new owners.
        let lost: Vec<u64> = self.routed.iter().filter(|(_, r)| r.dest == dead).map(|(o, _)| *o).collect();
        for op in lost {
            let r = self.routed.remove(&op).unwrap();
            self.route(r.client, r.op, r.reply, Some(op));
        }
        let lost: Vec<u64> = self.peer_ops.iter().filter(|(_, (n, _))| *n == dead).map(|(o, _)| *o).collect();
        for op in lost {
            let (_, reply) = self.peer_ops.remove(&op).unwrap();
            self.reply(reply, Reply::err(ErrorKind::Unavailable, format!("node {dead} failed: {reason}")));
        }
    }

    /// Re-homes board entries and follows the scheduler after any change of the view.
    fn view_changed(&mut self, old: &[u32]) {
        let mut copies: BTreeMap<u32, Vec<(String, BoardValue)>> = BTreeMap::new();
        let mut drop = Vec::new();
        for (k, v) in self.board.entries() {
            let r = ranked(k, &self.view);
            let bv = BoardValue { version: v.version, value: v.value.to_vec() };
            if r.first() == Some(&self.me) {
                if let Some(&b) = r.get(1) {
                    if ranked(k, old).get(1) != Some(&b) || ranked(k, old).first() != Some(&self.me) {
                        copies.entry(b).or_default().push((k.clone(), bv));
                    }
                }
            } else if r.get(1) != Some(&self.me) {
                copies.entry(r[0]).or_default().push((k.clone(), bv));
                drop.push(k.clone());
            }
        }
        for k in drop {
            self.board.remove(&k);
        }
        for (n, entries) in copies {
            self.send_peer(n, &PeerMsg::BoardCopy { entries });
        }
        let new_sched = elect(&self.view);
        if new_sched != self.scheduler_node {
            self.scheduler_node = new_sched;
            if new_sched == Some(self.me) {
                info!("node {}: elected scheduler (view {:?})", self.me, self.view);
                let others: Vec<u32> = self.view.clone();
                let mut sched = Scheduler::taking_over(others);
                for st in self.ptable.all() {
                    sched.set_holdings(st.node, st.holds);
                }
                self.scheduler = Some(sched);
                self.sched_settle_deadline = Some(Instant::now() + self.cfg.peer_timeout * 2);
            } else {
                self.scheduler = None;
                self.early_sched.clear();
            }
            if let Some(s) = new_sched {
                let submitted: Vec<Task> = self.my_tasks.values().cloned().collect();
                let holding: Vec<(u64, Client)> = self.holding.iter().map(|(t, c)| (*t, *c)).collect();
                let takes: Vec<(u64, Client)> = self.takes.iter().map(|(o, (c, _, _))| (*o, *c)).collect();
                self.send_peer(s, &PeerMsg::Rejoin { view: self.view.clone(), submitted, holding, takes });
            }
        }
        if self.scheduler.is_some() {
            for (from, m) in std::mem::take(&mut self.early_sched) {
                self.loopback_from.push_back((from, m));
            }
        }
        let ready = self.cfg.nodes.is_none_or(|n| self.view.len() >= n);
        if ready && !self.ready {
            self.ready = true;
            info!("node {}: ready, view {:?}", self.me, self.view);
            let frame = encode(&LocalReply::Ready);
            for s in self.sessions.values_mut() {
                if s.port.is_some() {
                    let _ = unix::write(&mut s.stream, &frame);
                }
            }
        }
    }

    fn settled(&mut self) {
        self.settle_deadline = None;
        for (origin, op, client, body) in std::mem::take(&mut self.deferred) {
            self.exec_owned(origin, op, client, body);
        }
    }

    // ----- registration socket ----------------------------------------------------

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    let t = Token(self.next_session);
                    self.next_session += 1;
                    if self.poll.registry().register(&mut stream, t, Interest::READABLE).is_ok() {
                        self.sessions.insert(t, Session { stream, buf: Vec::new(), port: None });
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    warn!("accepting a client: {e}");
                    return;
                }
            }
        }
    }

    fn session_ready(&mut self, t: Token) {
        let mut closed = false;
        let mut frames = Vec::new();
        if let Some(s) = self.sessions.get_mut(&t) {
            let mut chunk = [0u8; 4096];
            loop {
                match s.stream.read(&mut chunk) {
                    Ok(0) => {
                        closed = true;
                        break;
                    }
                    Ok(n) => s.buf.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        closed = true;
                        break;
                    }
                }
            }
            loop {
                match unix::split(&mut s.buf) {
                    Ok(Some(f)) => frames.push(Ok(f)),
                    Ok(None) => break,
                    Err(e) => {
                        frames.push(Err(e));
                        break;
                    }
                }
            }
        }
        for f in frames {
            let reply = match f {
                Ok(body) => match decode::<LocalRequest>("registration message", &body) {
                    Ok(r) => self.local_request(t, r),
                    Err(e) => LocalReply::Refused(e.to_string()),
                },
                Err(e) => {
                    closed = true;
                    LocalReply::Refused(format!("malformed registration frame: {e}"))
                }
            };
            if let Some(s) = self.sessions.get_mut(&t) {
                let _ = unix::write(&mut s.stream, &encode(&reply));
            }
        }
        if closed {
            if let Some(mut s) = self.sessions.remove(&t) {
                let _ = self.poll.registry().deregister(&mut s.stream);
                if let Some(p) = s.port {
                    self.client_died(p);
                }
            }
        }
    }

    fn local_request(&mut self, t: Token, r: LocalRequest) -> LocalReply {
        match r {
            LocalRequest::Status => LocalReply::Status(serde_json::to_string_pretty(&self.status()).unwrap()),
            LocalRequest::Register { pid, name } => {
                if let Some(p) = self.sessions.get(&t).and_then(|s| s.port) {
                    return LocalReply::Refused(format!("this connection is already registered (port {p}); a process registers once"));
                }
                if let Some((p, _)) = self.clients.iter().find(|(_, c)| c.pid == pid) {
                    return LocalReply::Refused(format!(
                        "process {pid} is already registered with this agent (port {p}); a process registers once"
                    ));
                }
                let port = self.next_port;
                self.next_port += 1;
                self.sessions.get_mut(&t).unwrap().port = Some(port);
                self.clients.insert(
                    port,
                    ClientInfo {
                        session: t,
                        pid,
                        name: name.clone(),
                        inbox: Inbox::new(),
                        parked: None,
                        activity: Activity::Idle,
                        holds: Vec::new(),
                    },
                );
                info!("node {}: registered {name:?} (pid {pid}) as port {port}", self.me);
                self.publish_state();
                LocalReply::Registered { node: self.me, port, namespace: self.cfg.namespace.clone(), ready: self.ready }
            }
        }
    }

    fn client_died(&mut self, port: u32) {
        let Some(c) = self.clients.remove(&port) else { return };
        info!("node {}: client {:?} (pid {}, port {port}) is gone; releasing what it held", self.me, c.name, c.pid);
        let _ = c.session;
        let client = Client::new(self.me, port);
        self.cancellable.retain(|(p, _), _| *p != port);
        let takes: Vec<u64> = self.takes.iter().filter(|(_, (c, _, _))| *c == client).map(|(o, _)| *o).collect();
        for op in takes {
            self.takes.remove(&op);
        }
        self.holding.retain(|_, c| *c != client);
        self.held_locks.retain(|(_, c), _| *c != client);
        // Its port socket stays behind if it was killed.
        let _ = std::fs::remove_file(self.runtime_dir.join(format!("port-{port}.sock")));
        for p in self.registry.all() {
            p.process_died(client);
        }
        for n in self.view.clone() {
            self.send_peer(n, &PeerMsg::ProcessDied { client });
        }
        self.publish_state();
    }

    // ----- gepsea-net plumbing ----------------------------------------------------

    fn post_receives(&mut self) {
        let r = self.port.irecv(None, Some(TAG_REQUEST), SMALL_MAX + 64);
        self.net.insert(r, NetOp::RecvRequest);
        let r = self.port.irecv(None, Some(TAG_PEER), SMALL_MAX + 64);
        self.net.insert(r, NetOp::RecvPeer);
    }

    fn send_env(&mut self, dst: Addr, tag: u64, body: Vec<u8>) {
        if body.len() <= SMALL_MAX {
            let r = self.port.isend(dst, tag, encode(&Envelope::Inline(body)));
            self.net.insert(r, NetOp::Send);
        } else {
            self.large_counter += 1;
            let ltag = TAG_LARGE | self.large_counter;
            let r = self.port.isend(dst, tag, encode(&Envelope::Large { len: body.len() as u64, tag: ltag }));
            self.net.insert(r, NetOp::Send);
            let r = self.port.isend(dst, ltag, Bytes::from(body));
            self.net.insert(r, NetOp::Send);
        }
    }

    fn send_peer(&mut self, node: u32, m: &PeerMsg) {
        if node == self.me {
            self.loopback.push_back(m.clone());
        } else {
            self.send_env(Addr::new(node, 0), TAG_PEER, encode(m));
        }
    }

    fn reply(&mut self, to: ReplyTo, r: Reply) {
        match to {
            ReplyTo::Local(tx) => {
                let _ = tx.send(r);
            }
            ReplyTo::Peer { node, op } => self.send_peer(node, &PeerMsg::Reply { op, reply: r }),
            ReplyTo::Discard => {}
            ReplyTo::Client { port, id } => {
                self.cancellable.remove(&(port, id));
                if self.clients.contains_key(&port) {
                    self.send_env(Addr::new(self.me, port), TAG_REPLY | id, encode(&r));
                }
            }
        }
    }

    fn net_completed(&mut self, id: ReqId) {
        let Some(kind) = self.net.remove(&id) else { return };
        let Some(res) = self.port.test(id) else {
            self.net.insert(id, kind);
            return;
        };
        match (kind, res) {
            (NetOp::RecvRequest, res) => {
                let r = self.port.irecv(None, Some(TAG_REQUEST), SMALL_MAX + 64);
                self.net.insert(r, NetOp::RecvRequest);
                if let Ok(Completion::Received(m)) = res {
                    self.envelope(m.src, false, &m.data);
                }
            }
            (NetOp::RecvPeer, res) => {
                let r = self.port.irecv(None, Some(TAG_PEER), SMALL_MAX + 64);
                self.net.insert(r, NetOp::RecvPeer);
                if let Ok(Completion::Received(m)) = res {
                    self.envelope(m.src, true, &m.data);
                }
            }
            (NetOp::RecvLarge { src, peer }, Ok(Completion::Received(m))) => self.body(src, peer, m.data),
            (NetOp::RecvLarge { src, .. }, Err(e)) => warn!("node {}: large message from {src} lost: {e}", self.me),
            (NetOp::Send, Err(e)) => debug!("node {}: send failed: {e}", self.me),
            (NetOp::Rma { reply_to_port, id, .. }, res) => {
                let reply = match res {
                    Ok(Completion::Put) => Reply::Ok,
                    Ok(Completion::Got(d)) => Reply::Data(d),
                    Ok(other) => Reply::err(ErrorKind::Failed, format!("unexpected completion {other:?}")),
                    Err(e) => Reply::err(ErrorKind::Failed, e.to_string()),
                };
                if let Some(port) = reply_to_port {
                    self.reply(ReplyTo::Client { port, id }, reply);
                } else if let Some((_, to)) = self.peer_ops.remove(&id) {
                    self.reply(to, reply);
                }
            }
            _ => {}
        }
    }

    fn envelope(&mut self, src: Addr, peer: bool, data: &[u8]) {
        match decode::<Envelope>("envelope", data) {
            Ok(Envelope::Inline(b)) => self.body(src, peer, b),
            Ok(Envelope::Large { len, tag }) => {
                if len as usize > MAX_BODY || tag & TAG_LARGE == 0 {
                    warn!("node {}: {src} announced a body of {len} bytes (limit {MAX_BODY}) on tag {tag:#x}; ignored", self.me);
                    return;
                }
                let r = self.port.irecv(Some(src), Some(tag), len as usize);
                self.net.insert(r, NetOp::RecvLarge { src, peer });
            }
            Err(e) => warn!("node {}: dropping a message from {src}: {e}", self.me),
        }
    }

    fn body(&mut self, src: Addr, peer: bool, body: Vec<u8>) {
        if peer {
            self.peer_messages += 1;
            match decode::<PeerMsg>("agent message", &body) {
                Ok(m) => self.peer_msg(src.node, m),
                Err(e) => warn!("node {}: dropping a message from agent {}: {e}", self.me, src.node),
            }
            return;
        }
        if src.node != self.me || !self.clients.contains_key(&src.port) {
            warn!("node {}: request from unregistered port {src}; ignored", self.me);
            return;
        }
        match decode::<Request>("request", &body) {
            Ok(r) => self.request(Client::new(self.me, src.port), r.op, ReplyTo::Client { port: src.port, id: r.id }),
            Err(e) => {
                // The id is the first field; answer it if it can be read at all.
                let id = postcard::take_from_bytes::<u64>(&body).map(|(id, _)| id).ok();
                warn!("node {}: malformed request from {src}: {e}", self.me);
                if let Some(id) = id {
                    self.reply(
                        ReplyTo::Client { port: src.port, id },
                        Reply::err(ErrorKind::BadRequest, format!("{e} (is the client library the agent's version?)")),
                    );
                }
            }
        }
    }

    // ----- requests ---------------------------------------------------------------

    fn call(&mut self, c: Call) {
        match c {
            Call::Op { client, op, reply } => self.request(client, op, ReplyTo::Local(reply)),
            Call::Internal { op, reply } => self.internal(op, ReplyTo::Local(reply)),
        }
    }

    fn request(&mut self, client: Client, op: Op, reply: ReplyTo) {
        self.requests_served += 1;
        if let ReplyTo::Client { port, id } = &reply {
            if !matches!(op, Op::Cancel { .. }) {
                self.cancellable.insert((*port, *id), 0);
            }
        }
        let r = match op {
            Op::Ping => Reply::Ok,
            Op::BoardGet { .. }
            | Op::BoardPut { .. }
            | Op::BoardCas { .. }
            | Op::Lock { .. }
            | Op::Unlock { .. }
            | Op::MergeOpen { .. }
            | Op::MergePush { .. }
            | Op::MergePull { .. } => {
                if let (Op::BoardPut { value, .. } | Op::BoardCas { value, .. }, true) = (&op, true) {
                    if value.len() > crate::core::board::MAX_VALUE {
                        return self.reply(reply, Reply::err(ErrorKind::TooLarge, BoardError::TooLarge { len: value.len() }.to_string()));
                    }
                }
                return self.route(client, op, reply, None);
            }
            Op::Subscribe { topic } => self.with_client(client, |c| c.inbox.subscribe(&topic)),
            Op::Unsubscribe { topic } => self.with_client(client, |c| c.inbox.unsubscribe(&topic)),
            Op::Publish { topic, body, dest } => {
                let dests: Vec<u32> = match dest {
                    Dest::All => self.view.clone(),
                    Dest::Nodes(n) => {
                        let missing: Vec<u32> = n.iter().copied().filter(|x| !self.view.contains(x)).collect();
                        if !missing.is_empty() {
                            return self.reply(
                                reply,
                                Reply::err(ErrorKind::Unavailable, format!("nodes {missing:?} are not live agents (view {:?})", self.view)),
                            );
                        }
                        n
                    }
                };
                for (d, a) in self.outbox.publish(&topic, Bytes::from(body), &dests) {
                    self.send_peer(d, &PeerMsg::Advert { publisher: a.publisher, seq: a.seq, topic: a.topic, body: a.body.to_vec() });
                }
                Reply::Ok
            }
            Op::NextAdverts { max, wait_ms } => {
                let (ReplyTo::Client { port, id }, Some(c)) = (&reply, self.clients.get_mut(&client.process)) else {
                    return self.reply(reply, Reply::err(ErrorKind::BadRequest, "only registered processes have mailboxes"));
                };
                let got = take_adverts(&mut c.inbox, max);
                if got.is_empty() && wait_ms > 0 {
                    if c.parked.is_some() {
                        return self.reply(reply, Reply::err(ErrorKind::BadRequest, "a mailbox read is already waiting for this process"));
                    }
                    c.parked = Some((*id, max.max(1), Instant::now() + Duration::from_millis(wait_ms)));
                    let _ = port;
                    return;
                }
                Reply::Adverts(got)
            }
            Op::CachePut { name, data } => {
                let me = self.me;
                return self.job(client, reply, move |s| store_and_register(s, name, data, me));
            }
            Op::CacheGet { name } => {
                if let Some(d) = self.store.get(&name) {
                    Reply::Data(d.to_vec())
                } else {
                    let me = self.me;
                    return self.job(client, reply, move |s| cache_fetch(s, &name, me));
                }
            }
            // Data streaming: bring an object into this node's cache ahead of use (the
            // application starts this and goes on computing; the reply says it is here).
            Op::Prefetch { name } => {
                if self.store.contains(&name) {
                    Reply::Ok
                } else {
                    let me = self.me;
                    return self.job(client, reply, move |s| match cache_fetch(s, &name, me) {
                        Reply::Data(_) => Reply::Ok,
                        other => other,
                    });
                }
            }
            Op::CacheRemove { name } => {
                let had = self.store.remove(&name);
                let me = self.me;
                self.publish_state();
                return self.job(client, reply, move |s| {
                    if !had {
                        return Reply::err(ErrorKind::NotFound, format!("{name:?} is not cached on node {me}"));
                    }
                    match dir_update(s, &name, me, false) {
                        Ok(()) => Reply::Ok,
                        Err(e) => Reply::err(ErrorKind::Failed, e.to_string()),
                    }
                });
            }
            Op::Locate { name } => {
                return self.job(client, reply, move |s| {
                    use crate::api::Api;
                    match s.board_get(&dir_key(&name)) {
                        Ok(v) => Reply::Nodes(holders(v.as_ref().map(|v| v.value.as_slice()))),
                        Err(e) => Reply::err(ErrorKind::Failed, e.to_string()),
                    }
                })
            }
            Op::Swap { name, to } => {
                if !self.view.contains(&to) {
                    return self.reply(reply, Reply::err(ErrorKind::Unavailable, format!("node {to} is not a live agent")));
                }
                let me = self.me;
                return self.job(client, reply, move |s| swap(s, &name, me, to));
            }
            Op::GmaAlloc { node, len } => {
                if node == self.me {
                    self.gma_alloc(client, len)
                } else if !self.view.contains(&node) {
                    Reply::err(ErrorKind::Unavailable, format!("node {node} is not a live agent (view {:?})", self.view))
                } else {
                    let op = self.new_op();
                    self.peer_ops.insert(op, (node, reply));
                    self.send_peer(node, &PeerMsg::GmaAlloc { op, client, len });
                    return;
                }
            }
            Op::GmaFree { ptr } => {
                if ptr.node == self.me {
                    self.gma_free(ptr.region)
                } else {
                    let op = self.new_op();
                    self.peer_ops.insert(op, (ptr.node, reply));
                    self.send_peer(ptr.node, &PeerMsg::GmaFree { op, region: ptr.region });
                    return;
                }
            }
            Op::GmaPut { ptr, offset, data } => {
                if offset.checked_add(data.len() as u64).is_none_or(|end| end > ptr.len) {
                    Reply::err(
                        ErrorKind::BadRequest,
                        format!("put of {} bytes at offset {offset} overruns the block of {} bytes", data.len(), ptr.len),
                    )
                } else if ptr.node == self.me {
                    match self.port.with_region(ptr.region, |r| r[offset as usize..offset as usize + data.len()].copy_from_slice(&data)) {
                        Ok(()) => Reply::Ok,
                        Err(e) => Reply::err(ErrorKind::NotFound, e.to_string()),
                    }
                } else {
                    let r = self.port.put(Addr::new(ptr.node, 0), ptr.region, offset, data);
                    self.rma(r, reply);
                    return;
                }
            }
            Op::GmaGet { ptr, offset, len } => {
                if offset.checked_add(len).is_none_or(|end| end > ptr.len) {
                    Reply::err(
                        ErrorKind::BadRequest,
                        format!("get of {len} bytes at offset {offset} overruns the block of {} bytes", ptr.len),
                    )
                } else if ptr.node == self.me {
                    match self.port.with_region(ptr.region, |r| r[offset as usize..(offset + len) as usize].to_vec()) {
                        Ok(d) => Reply::Data(d),
                        Err(e) => Reply::err(ErrorKind::NotFound, e.to_string()),
                    }
                } else {
                    let r = self.port.get(Addr::new(ptr.node, 0), ptr.region, offset, len as usize);
                    self.rma(r, reply);
                    return;
                }
            }
            Op::SetState { activity, holds } => {
                let r = self.with_client(client, |c| {
                    c.activity = activity;
                    c.holds = holds;
                });
                self.publish_state();
                r
            }
            Op::GlobalState => Reply::States(self.ptable.all()),
            Op::Submit { payload, affinity } => {
                let id = ((self.me as u64) << 40) | self.next_task;
                self.next_task += 1;
                let task = Task { id, payload, affinity };
                self.my_tasks.insert(id, task.clone());
                if let Some(s) = self.scheduler_node {
                    self.send_peer(s, &PeerMsg::Submit { task, submitter: self.me });
                }
                Reply::TaskId(id)
            }
            Op::Take { wait_ms } => {
                let op = self.new_op();
                if let ReplyTo::Client { port, id } = &reply {
                    self.cancellable.insert((*port, *id), op);
                }
                self.takes.insert(op, (client, reply, Instant::now() + Duration::from_millis(wait_ms)));
                if let Some(s) = self.scheduler_node {
                    self.send_peer(s, &PeerMsg::Take { op, client });
                }
                return;
            }
            Op::Done { task } => {
                if self.holding.remove(&task).is_none() {
                    Reply::err(ErrorKind::NotHeld, format!("task {task:#x} is not held by a process of node {}", self.me))
                } else {
                    if let Some(s) = self.scheduler_node {
                        self.send_peer(s, &PeerMsg::Done { task });
                    }
                    Reply::Ok
                }
            }
            Op::Scheduler => match self.scheduler_node {
                Some(n) => Reply::Node(n),
                None => Reply::err(ErrorKind::Unavailable, "no scheduler elected"),
            },
            Op::Compress { codec, level, data } => {
                let engine = self.engine.clone();
                return self.job(client, reply, move |_| match engine.compress(&codec, level, &data) {
                    Ok(d) => Reply::Data(d),
                    Err(e) => Reply::err(ErrorKind::Failed, e.to_string()),
                });
            }
            Op::Decompress { codec, data } => {
                let engine = self.engine.clone();
                return self.job(client, reply, move |_| match engine.decompress(&codec, &data) {
                    Ok(d) => Reply::Data(d),
                    Err(e) => Reply::err(ErrorKind::Failed, e.to_string()),
                });
            }
            Op::Plugin { name, body } => return self.run_plugin(client, name, body, reply),
            Op::PluginAt { node, name, body } => {
                if node == self.me {
                    return self.run_plugin(client, name, body, reply);
                }
                if !self.view.contains(&node) {
                    return self.reply(
                        reply,
                        Reply::err(ErrorKind::Unavailable, format!("node {node} is not a live agent (view {:?})", self.view)),
                    );
                }
                let op = self.new_op();
                self.peer_ops.insert(op, (node, reply));
                self.send_peer(node, &PeerMsg::Plugin { op, client, name, body });
                return;
            }
            Op::Cancel { id } => {
                self.cancel(client, id);
                Reply::Ok
            }
        };
        self.reply(reply, r);
    }

    fn run_plugin(&mut self, client: Client, name: String, body: Vec<u8>, reply: ReplyTo) {
        let Some(p) = self.registry.get(&name).cloned() else {
            return self.reply(
                reply,
                Reply::err(
                    ErrorKind::UnknownPlugin,
                    format!("no plug-in named {name:?} on node {} (it has: {})", self.me, self.registry.names().join(", ")),
                ),
            );
        };
        let engine = self.engine.clone();
        let node = self.me;
        let scratch = self.runtime_dir.join("scratch");
        self.job(client, reply, move |s| {
            let ctx = Context { caller: client, node, services: s, engine: &engine, scratch: &scratch };
            match p.handle(&ctx, &body) {
                Ok(d) => Reply::Data(d),
                Err(crate::plugin::PluginError::BadRequest(m)) => Reply::err(ErrorKind::BadRequest, format!("plug-in {name}: {m}")),
                Err(e) => Reply::err(ErrorKind::Failed, format!("plug-in {name}: {e}")),
            }
        });
    }

    fn with_client(&mut self, client: Client, f: impl FnOnce(&mut ClientInfo)) -> Reply {
        match self.clients.get_mut(&client.process) {
            Some(c) => {
                f(c);
                Reply::Ok
            }
            None => Reply::err(ErrorKind::BadRequest, "only registered processes can do this"),
        }
    }

    fn cancel(&mut self, client: Client, id: u64) {
        let port = client.process;
        if let Some(c) = self.clients.get_mut(&port) {
            if c.parked.is_some_and(|(p, _, _)| p == id) {
                c.parked = None;
                self.reply(ReplyTo::Client { port, id }, Reply::err(ErrorKind::Cancelled, "cancelled"));
                return;
            }
        }
        let Some(&op) = self.cancellable.get(&(port, id)) else { return };
        if let Some((_, r, _)) = self.takes.remove(&op) {
            if let Some(s) = self.scheduler_node {
                self.send_peer(s, &PeerMsg::CancelTake { op });
            }
            return self.reply(r, Reply::err(ErrorKind::Cancelled, "cancelled"));
        }
        if let Some(r) = self.routed.get(&op) {
            if matches!(r.op, Op::Lock { .. }) {
                let dest = r.dest;
                self.send_peer(dest, &PeerMsg::Routed { op, client, body: Op::Cancel { id: op } });
            }
        }
    }

    fn job(&mut self, client: Client, reply: ReplyTo, work: impl FnOnce(&InProc) -> Reply + Send + 'static) {
        if let ReplyTo::Local(_) = reply {
            // Asked by a job (a plug-in's cache miss, say), which blocks its thread until
            // this is done: queued behind it on any pool thread, it could wait forever.
            // Such jobs (cache fetches, directory updates) start no jobs of their own,
            // so a thread each ends the chain.
            let (inproc, done_tx) = (InProc { client, ..self.nested.0.clone() }, self.nested.1.clone());
            let spawned = std::thread::Builder::new().name("gepsea-nested".into()).spawn(move || {
                let result = work(&inproc);
                if done_tx.send(JobDone { reply, result }).is_ok() {
                    let _ = inproc.waker.wake();
                }
            });
            if let Err(e) = spawned {
                warn!("node {}: cannot start a thread for a nested job: {e}", self.me);
            }
            return;
        }
        // One client's jobs always go to the same thread: they finish in the order sent.
        // Work asked by another agent never queues behind a local job: that job may be
        // waiting on the very agent that asked (two plug-ins calling each other's node
        // at once would otherwise deadlock when their callers share a port number).
        let half = self.jobs.len() / 2;
        let i = match reply {
            ReplyTo::Peer { .. } => half + (client.node as usize * 31 + client.process as usize) % half,
            _ => client.process as usize % half,
        };
        let _ = self.jobs[i].send(Job { reply, work: Box::new(work), client });
    }

    fn rma(&mut self, r: ReqId, reply: ReplyTo) {
        match reply {
            ReplyTo::Client { port, id } => {
                self.net.insert(r, NetOp::Rma { reply_to_port: Some(port), id });
            }
            local => {
                let op = self.new_op();
                self.peer_ops.insert(op, (u32::MAX, local));
                self.net.insert(r, NetOp::Rma { reply_to_port: None, id: op });
            }
        }
    }

    fn new_op(&mut self) -> u64 {
        self.next_op += 1;
        self.next_op
    }

    fn internal(&mut self, op: Internal, reply: ReplyTo) {
        let r = match op {
            Internal::LocalGet { name } => match self.store.get(&name) {
                Some(d) => Reply::Data(d.to_vec()),
                None => Reply::err(ErrorKind::NotFound, format!("{name:?} is not cached on node {}", self.me)),
            },
            Internal::StoreLocal { name, data } => match self.store.insert(&name, Bytes::from(data)) {
                Ok(evicted) => {
                    let me = self.me;
                    for e in evicted {
                        self.job(Client::new(me, 0), ReplyTo::Discard, move |s| {
                            let _ = dir_update(s, &e, me, false);
                            Reply::Ok
                        });
                    }
                    self.publish_state();
                    Reply::Ok
                }
                Err(cap) => Reply::err(
                    ErrorKind::TooLarge,
                    format!("{name:?} is larger than the whole cache of node {} ({cap} bytes; raise --cache-bytes)", self.me),
                ),
            },
            Internal::DropLocal { name } => {
                self.store.remove(&name);
                self.publish_state();
                Reply::Ok
            }
            Internal::FetchFrom { node, name } => {
                if !self.view.contains(&node) {
                    Reply::err(ErrorKind::Unavailable, format!("node {node} is not live"))
                } else {
                    let op = self.new_op();
                    self.peer_ops.insert(op, (node, reply));
                    self.send_peer(node, &PeerMsg::Fetch { op, name });
                    return;
                }
            }
            Internal::StoreAt { node, name, data } => {
                let op = self.new_op();
                self.peer_ops.insert(op, (node, reply));
                self.send_peer(node, &PeerMsg::Store { op, name, data });
                return;
            }
        };
        self.reply(reply, r);
    }

    fn gma_alloc(&mut self, client: Client, len: u64) -> Reply {
        match self.gma.alloc(client, len) {
            Ok(region) => match self.port.expose(region, len as usize) {
                Ok(()) => Reply::Ptr(GlobalPtr { node: self.me, region, len }),
                Err(e) => {
                    let _ = self.gma.free(region);
                    Reply::err(ErrorKind::Failed, e.to_string())
                }
            },
            Err(e) => Reply::err(ErrorKind::TooLarge, e.to_string()),
        }
    }

    fn gma_free(&mut self, region: u64) -> Reply {
        match self.gma.free(region) {
            Ok(()) => {
                let _ = self.port.unexpose(region);
                Reply::Ok
            }
            Err(e) => Reply::err(ErrorKind::NotFound, e.to_string()),
        }
    }

    // ----- owner-routed operations ------------------------------------------------

    /// Sends an owner-routed operation to its owner (ourselves included).
    fn route(&mut self, client: Client, op: Op, reply: ReplyTo, reuse: Option<u64>) {
        let key = match &op {
            Op::BoardGet { key } | Op::BoardPut { key, .. } | Op::BoardCas { key, .. } => key.clone(),
            Op::Lock { name, .. } | Op::Unlock { name } => lock_key(name),
            Op::MergeOpen { stream, .. } | Op::MergePush { stream, .. } | Op::MergePull { stream } => format!("gepsea.merge/{stream}"),
            _ => unreachable!("not an owner-routed operation"),
        };
        let Some(&dest) = ranked(&key, &self.view).first() else { return };
        let id = reuse.unwrap_or_else(|| self.new_op());
        if let (ReplyTo::Client { port, id: rid }, Op::Lock { .. }) = (&reply, &op) {
            self.cancellable.insert((*port, *rid), id);
        }
        let body = op.clone();
        self.routed.insert(id, Routed { dest, client, op, reply });
        self.send_peer(dest, &PeerMsg::Routed { op: id, client, body });
    }

    /// The owner's side of a routed operation.
    fn exec_owned(&mut self, origin: u32, op: u64, client: Client, body: Op) {
        if matches!(body, Op::Lock { .. }) && self.settle_deadline.is_some() {
            self.deferred.push((origin, op, client, body));
            return;
        }
        let r = match body {
            Op::BoardGet { key } => Reply::Value(self.board.get(&key).map(|v| BoardValue { version: v.version, value: v.value.to_vec() })),
            Op::BoardPut { key, value } => self.board_write(&key, None, value),
            Op::BoardCas { key, expected, value } => self.board_write(&key, Some(expected), value),
            Op::Lock { name, mode } => match self.locks.acquire(&name, client, mode.into()) {
                Ok(grants) => {
                    self.lock_waiters.insert((name, client), (origin, op));
                    self.send_grants(grants);
                    return;
                }
                Err(e) => Reply::err(ErrorKind::BadRequest, e.to_string()),
            },
            Op::Unlock { name } => match self.locks.release(&name, client) {
                Ok(grants) => {
                    self.send_grants(grants);
                    Reply::Ok
                }
                Err(e) => Reply::err(ErrorKind::NotHeld, e.to_string()),
            },
            Op::Cancel { id } => {
                // Withdraw a waiting lock request of `origin`'s operation `id`.
                let found = self.lock_waiters.iter().find(|(_, v)| **v == (origin, id)).map(|(k, _)| k.clone());
                if let Some((name, c)) = found {
                    if self.locks.waiting(&name).iter().any(|(w, _)| *w == c) {
                        self.lock_waiters.remove(&(name.clone(), c));
                        let grants = self.locks.cancel(&name, c);
                        self.send_peer(origin, &PeerMsg::RoutedReply { op: id, reply: Reply::err(ErrorKind::Cancelled, "cancelled") });
                        self.send_grants(grants);
                    }
                }
                return;
            }
            Op::MergeOpen { stream, runs } => match self.merges.entry(stream) {
                std::collections::hash_map::Entry::Occupied(e) => {
                    Reply::err(ErrorKind::BadRequest, format!("merge stream {:?} is already open", e.key()))
                }
                std::collections::hash_map::Entry::Vacant(_) if runs == 0 => {
                    Reply::err(ErrorKind::BadRequest, "a merge stream needs at least one run")
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(Merger::new(runs as usize));
                    Reply::Ok
                }
            },
            Op::MergePush { stream, run, records, last } => match self.merges.get_mut(&stream) {
                None => Reply::err(ErrorKind::NotFound, format!("no merge stream {stream:?}")),
                Some(m) => match m.push(run as usize, records).and_then(|_| if last { m.finish(run as usize) } else { Ok(()) }) {
                    Ok(()) => Reply::Ok,
                    Err(e) => Reply::err(ErrorKind::BadRequest, format!("merge stream {stream:?}: {e}")),
                },
            },
            Op::MergePull { stream } => match self.merges.get_mut(&stream) {
                None => Reply::err(ErrorKind::NotFound, format!("no merge stream {stream:?}")),
                Some(m) => {
                    let records = m.pop_ready();
                    let done = m.is_done();
                    if done {
                        self.merges.remove(&stream);
                    }
                    Reply::Records { records, done }
                }
            },
            other => Reply::err(ErrorKind::BadRequest, format!("{} is not an owner-routed operation", other.name())),
        };
        self.send_peer(origin, &PeerMsg::RoutedReply { op, reply: r });
    }

    fn board_write(&mut self, key: &str, expected: Option<u64>, value: Vec<u8>) -> Reply {
        let res = match expected {
            None => self.board.put(key, Bytes::from(value)),
            Some(e) => self.board.cas(key, e, Bytes::from(value)),
        };
        match res {
            Ok(v) => {
                if let Some(&b) = ranked(key, &self.view).get(1) {
                    let val = self.board.get(key).unwrap().value.to_vec();
                    self.send_peer(b, &PeerMsg::BoardCopy { entries: vec![(key.to_string(), BoardValue { version: v, value: val })] });
                }
                Reply::Version(v)
            }
            Err(BoardError::Conflict { current, .. }) => Reply::Conflict { current },
            Err(e) => Reply::err(ErrorKind::TooLarge, e.to_string()),
        }
    }

    fn send_grants(&mut self, grants: Vec<crate::core::locks::Grant>) {
        for g in grants {
            if let Some((origin, op)) = self.lock_waiters.remove(&(g.lock.clone(), g.client)) {
                self.send_peer(origin, &PeerMsg::RoutedReply { op, reply: Reply::Ok });
            }
        }
    }

    fn deliver_assignments(&mut self, a: Vec<Assignment>) {
        for a in a {
            self.send_peer(a.client.node, &PeerMsg::Assigned { op: a.op, task: a.task });
        }
    }

    fn publish_state(&mut self) {
        self.state_version += 1;
        let mut processes: Vec<(u32, Activity)> = self.clients.iter().map(|(p, c)| (*p, c.activity)).collect();
        processes.sort_unstable();
        let mut holds = self.store.names();
        for c in self.clients.values() {
            holds.extend(c.holds.iter().cloned());
        }
        holds.sort();
        holds.dedup();
        let s = NodeState { node: self.me, activity: pstate::summarise(&processes), processes, holds, version: self.state_version };
        for n in self.view.clone() {
            self.send_peer(n, &PeerMsg::State(s.clone()));
        }
        // Also on the bulletin board, where a late joiner or another tool can read it.
        let value = encode(&s);
        if value.len() <= crate::core::board::MAX_VALUE {
            self.route(Client::new(self.me, 0), Op::BoardPut { key: format!("gepsea.pstate/{}", self.me), value }, ReplyTo::Discard, None);
        }
    }

    // ----- agent-to-agent ---------------------------------------------------------

    fn peer_msg(&mut self, from: u32, m: PeerMsg) {
        if from != self.me && !matches!(m, PeerMsg::Hello { .. } | PeerMsg::HelloAck { .. }) && !self.view.contains(&from) {
            if self.dead.contains(&from) {
                return;
            }
            // A message from an agent we have not heard say hello (its hello is in
            // flight behind, or we learnt of it only now): it is alive.
            self.peer_alive(from, 0, 0);
        }
        if self.scheduler.is_none()
            && matches!(
                m,
                PeerMsg::Submit { .. }
                    | PeerMsg::Take { .. }
                    | PeerMsg::CancelTake { .. }
                    | PeerMsg::Done { .. }
                    | PeerMsg::Giveback { .. }
                    | PeerMsg::Rejoin { .. }
            )
        {
            // Sent by an agent that already sees us as the scheduler: keep it until we do.
            self.early_sched.push((from, m));
            return;
        }
        match m {
            PeerMsg::Hello { node, pid, incarnation } => {
                self.send_peer(node, &PeerMsg::HelloAck { node: self.me, pid: std::process::id(), incarnation: self.incarnation });
                self.peer_alive(node, pid, incarnation);
            }
            PeerMsg::HelloAck { node, pid, incarnation } => self.peer_alive(node, pid, incarnation),
            PeerMsg::Heartbeat => {}
            PeerMsg::Routed { op, client, body } => self.exec_owned(from, op, client, body),
            PeerMsg::RoutedReply { op, reply } => {
                if let Some(r) = self.routed.remove(&op) {
                    if reply == Reply::Ok {
                        match &r.op {
                            Op::Lock { name, mode } => {
                                if self.clients.contains_key(&r.client.process) || r.client.process == 0 {
                                    self.held_locks.insert((name.clone(), r.client), *mode);
                                } else {
                                    // Granted to a process that died meanwhile.
                                    self.route(r.client, Op::Unlock { name: name.clone() }, ReplyTo::Discard, None);
                                }
                            }
                            Op::Unlock { name } => {
                                self.held_locks.remove(&(name.clone(), r.client));
                            }
                            _ => {}
                        }
                    }
                    self.reply(r.reply, reply);
                }
            }
            PeerMsg::BoardCopy { entries } => {
                self.board
                    .adopt(entries.into_iter().map(|(k, v)| (k, Versioned { version: v.version, value: Bytes::from(v.value) })).collect());
            }
            PeerMsg::Reclaim { view, locks } => {
                for (name, client, mode) in locks {
                    self.locks.reclaim(&name, client, mode.into());
                }
                if view == self.view {
                    self.awaiting_reclaim.remove(&from);
                } else {
                    self.early_reclaims.push((view, from));
                }
                if self.awaiting_reclaim.is_empty() && self.settle_deadline.is_some() {
                    self.settled();
                }
            }
            PeerMsg::Advert { publisher, seq, topic, body } => {
                let (ack, ready) = self.seq.admit(Advert { publisher, seq, topic, body: Bytes::from(body) });
                if !ready.is_empty() {
                    let mut wake = Vec::new();
                    for (p, c) in self.clients.iter_mut() {
                        c.inbox.deliver(ready.iter().cloned());
                        if c.parked.is_some() && c.inbox.unread() > 0 {
                            wake.push(*p);
                        }
                    }
                    for p in wake {
                        let c = self.clients.get_mut(&p).unwrap();
                        let (id, max, _) = c.parked.take().unwrap();
                        let got = take_adverts(&mut c.inbox, max);
                        self.reply(ReplyTo::Client { port: p, id }, Reply::Adverts(got));
                    }
                }
                self.send_peer(from, &PeerMsg::AdvertAck { seq: ack });
            }
            PeerMsg::AdvertAck { seq } => self.outbox.on_ack(from, seq),
            PeerMsg::ProcessDied { client } => {
                let grants = self.locks.process_died(client);
                self.lock_waiters.retain(|(_, c), _| *c != client);
                self.send_grants(grants);
                for r in self.gma.forget(|c| *c == client) {
                    let _ = self.port.unexpose(r);
                }
                if let Some(s) = &mut self.scheduler {
                    let a = s.forget(|c| *c == client);
                    self.deliver_assignments(a);
                }
            }
            PeerMsg::State(s) => {
                let (node, holds) = (s.node, s.holds.clone());
                if self.ptable.update(s) {
                    if let Some(sched) = &mut self.scheduler {
                        sched.set_holdings(node, holds);
                    }
                }
            }
            PeerMsg::Submit { task, submitter } => {
                if let Some(s) = &mut self.scheduler {
                    let a = s.submit(task, submitter);
                    self.deliver_assignments(a);
                }
            }
            PeerMsg::Take { op, client } => {
                if let Some(s) = &mut self.scheduler {
                    let a = s.take(op, client);
                    self.deliver_assignments(a);
                }
            }
            PeerMsg::CancelTake { op } => {
                if let Some(s) = &mut self.scheduler {
                    s.cancel_take(op, from);
                }
            }
            PeerMsg::Done { task } => {
                if let Some(s) = &mut self.scheduler {
                    if let Some(sub) = s.done(task) {
                        self.send_peer(sub, &PeerMsg::TaskFinished { task });
                    }
                }
            }
            PeerMsg::Giveback { task } => {
                if let Some(s) = &mut self.scheduler {
                    let a = s.giveback(task);
                    self.deliver_assignments(a);
                }
            }
            PeerMsg::Rejoin { view: _, submitted, holding, takes } => {
                if let Some(s) = &mut self.scheduler {
                    let a = s.rejoin(from, submitted, holding, takes);
                    self.deliver_assignments(a);
                }
            }
            PeerMsg::Assigned { op, task } => match self.takes.remove(&op) {
                Some((client, reply, _)) => {
                    self.holding.insert(task.id, client);
                    self.reply(reply, Reply::Task(Some(task)));
                }
                None => {
                    // The take timed out or was cancelled while the task was on its way.
                    if let Some(s) = self.scheduler_node {
                        self.send_peer(s, &PeerMsg::Giveback { task: task.id });
                    }
                }
            },
            PeerMsg::TaskFinished { task } => {
                self.my_tasks.remove(&task);
            }
            PeerMsg::Fetch { op, name } => {
                let reply = match self.store.get(&name) {
                    Some(d) => Reply::Data(d.to_vec()),
                    None => Reply::err(ErrorKind::NotFound, format!("{name:?} is not cached on node {}", self.me)),
                };
                self.send_peer(from, &PeerMsg::Reply { op, reply });
            }
            PeerMsg::Store { op, name, data } => {
                let me = self.me;
                self.job(Client::new(me, 0), ReplyTo::Peer { node: from, op }, move |s| store_and_register(s, name, data, me));
            }
            PeerMsg::GmaAlloc { op, client, len } => {
                let reply = self.gma_alloc(client, len);
                self.send_peer(from, &PeerMsg::Reply { op, reply });
            }
            PeerMsg::GmaFree { op, region } => {
                let reply = self.gma_free(region);
                self.send_peer(from, &PeerMsg::Reply { op, reply });
            }
            PeerMsg::Plugin { op, client, name, body } => self.run_plugin(client, name, body, ReplyTo::Peer { node: from, op }),
            PeerMsg::Reply { op, reply } => {
                if let Some((_, to)) = self.peer_ops.remove(&op) {
                    self.reply(to, reply);
                }
            }
        }
    }

    fn status(&self) -> Status {
        Status {
            node: self.me,
            pid: std::process::id(),
            namespace: self.cfg.namespace.clone(),
            listen: self.port.listen_addr().map(|a| a.to_string()),
            rendezvous: self.cfg.rendezvous.as_ref().map(|p| p.display().to_string()),
            ready: self.ready,
            expected_nodes: self.cfg.nodes,
            view: self.view.clone(),
            dead: self.dead.iter().copied().collect(),
            scheduler: self.scheduler_node,
            peer_timeout_ms: self.cfg.peer_timeout.as_millis() as u64,
            cache_bytes_limit: self.cfg.cache_bytes,
            gma_bytes_limit: self.cfg.gma_bytes,
            clients: {
                let mut v: Vec<StatusClient> = self
                    .clients
                    .iter()
                    .map(|(p, c)| StatusClient {
                        port: *p,
                        pid: c.pid,
                        name: c.name.clone(),
                        activity: c.activity,
                        subscribed_unread: c.inbox.unread(),
                    })
                    .collect();
                v.sort_by_key(|c| c.port);
                v
            },
            board_keys: self.board.len(),
            locks: self
                .locks
                .snapshot()
                .into_iter()
                .map(|(name, h, w)| StatusLock {
                    name,
                    holders: h.iter().map(|(c, m)| format!("{}.{} {m:?}", c.node, c.process)).collect(),
                    waiting: w.iter().map(|(c, m)| format!("{}.{} {m:?}", c.node, c.process)).collect(),
                })
                .collect(),
            cache_objects: self.store.names(),
            cache_bytes: self.store.bytes(),
            gma_blocks: self.gma.blocks(),
            gma_bytes: self.gma.used(),
            merge_streams: self.merges.len(),
            tasks: self.scheduler.as_ref().map(|s| StatusTasks {
                queued: s.queued(),
                running: s.running(),
                idle_takers: s.idle_takers(),
                assigned_total: s.assigned_total,
                settling: s.settling(),
            }),
            plugins: self.registry.describe(),
            requests_served: self.requests_served,
            peer_messages: self.peer_messages,
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.sock_path);
        if let Some(e) = &self.rendezvous_entry {
            let _ = std::fs::remove_file(e);
        }
    }
}

fn lock_key(name: &str) -> String {
    format!("gepsea.lock/{name}")
}

fn take_adverts(inbox: &mut Inbox, max: u32) -> Vec<AdvertMsg> {
    let mut v = Vec::new();
    while v.len() < max.max(1) as usize {
        match inbox.read() {
            Some(a) => v.push(AdvertMsg { publisher: a.publisher, seq: a.seq, topic: a.topic, body: a.body.to_vec() }),
            None => break,
        }
    }
    v
}

/// Adds or removes `node` in `name`'s directory entry (compare-and-swap loop).
fn dir_update(s: &InProc, name: &str, node: u32, present: bool) -> Result<(), ApiError> {
    use crate::api::{Api, Cas};
    let key = dir_key(name);
    loop {
        let cur = s.board_get(&key)?;
        let (version, entry) = match &cur {
            Some(v) => (v.version, Some(v.value.as_slice())),
            None => (0, None),
        };
        let new = with_holder(entry, node, present);
        if entry == Some(new.as_slice()) {
            return Ok(());
        }
        if let Cas::Written(_) = s.board_cas(&key, version, &new)? {
            return Ok(());
        }
    }
}

/// A cache miss: find a live holder in the directory, fetch, keep a copy, register it.
fn cache_fetch(s: &InProc, name: &str, me: u32) -> Reply {
    use crate::api::Api;
    if let Ok(Reply::Data(d)) = s.internal(Internal::LocalGet { name: name.to_string() }) {
        return Reply::Data(d);
    }
    let entry = match s.board_get(&dir_key(name)) {
        Ok(v) => v,
        Err(e) => return Reply::err(ErrorKind::Failed, e.to_string()),
    };
    let hs = holders(entry.as_ref().map(|v| v.value.as_slice()));
    let mut errors = Vec::new();
    for h in hs.into_iter().filter(|&h| h != me) {
        match s.internal(Internal::FetchFrom { node: h, name: name.to_string() }) {
            Ok(Reply::Data(d)) => {
                if s.internal(Internal::StoreLocal { name: name.to_string(), data: d.clone() }).is_ok() {
                    let _ = dir_update(s, name, me, true);
                }
                return Reply::Data(d);
            }
            Ok(_) => {}
            Err(e) => errors.push(format!("node {h}: {e}")),
        }
    }
    if errors.is_empty() {
        Reply::err(ErrorKind::NotFound, format!("no live node caches {name:?}"))
    } else {
        Reply::err(ErrorKind::NotFound, format!("no live node could provide {name:?} ({})", errors.join("; ")))
    }
}

/// Keeps `data` in this node's cache and registers this node in the directory.
fn store_and_register(s: &InProc, name: String, data: Vec<u8>, me: u32) -> Reply {
    if let Err(e) = s.internal(Internal::StoreLocal { name: name.clone(), data }) {
        return Reply::err(e.kind().unwrap_or(ErrorKind::Failed), e.to_string());
    }
    match dir_update(s, &name, me, true) {
        Ok(()) => Reply::Ok,
        Err(e) => Reply::err(ErrorKind::Failed, e.to_string()),
    }
}

/// Moves a cached object to node `to` instead of duplicating it.
fn swap(s: &InProc, name: &str, me: u32, to: u32) -> Reply {
    let data = match s.internal(Internal::LocalGet { name: name.to_string() }) {
        Ok(Reply::Data(d)) => d,
        _ => return Reply::err(ErrorKind::NotFound, format!("{name:?} is not cached on node {me}; only a holder can swap it away")),
    };
    if to == me {
        return Reply::Ok;
    }
    if let Err(e) = s.internal(Internal::StoreAt { node: to, name: name.to_string(), data }) {
        return Reply::err(e.kind().unwrap_or(ErrorKind::Failed), e.to_string());
    }
    let _ = s.internal(Internal::DropLocal { name: name.to_string() });
    match dir_update(s, name, me, false) {
        Ok(()) => Reply::Ok,
        Err(e) => Reply::err(ErrorKind::Failed, e.to_string()),
    }
}
