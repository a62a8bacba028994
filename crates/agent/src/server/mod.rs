//! The agent process: one event loop that drives every component.
//!
//! One thread owns all component state and waits in `epoll` (mio) on four sources: the
//! registration socket and its client connections, the gepsea-net port's event
//! descriptor (requests from clients, messages from other agents, completed sends and
//! remote memory accesses, failed peers), a waker for calls from the agent's own job
//! threads, and a timer for discovery and deadlines. Nothing in the loop blocks: work
//! that takes CPU or waits on other agents (compression, plug-ins, cache misses that
//! must consult the directory and fetch) runs on job threads that call back into the
//! loop through the same [`Services`] API applications use. Idle, the loop wakes only
//! to look for new agents (every `discovery`); links to the other agents are watched
//! by the kernel (TCP keepalive), so an idle agent costs almost no CPU.
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
//! `peer_timeout`, or its host went silent: see `membership`); every survivor drops it
//! from the view, re-homes board entries, re-registers the locks its clients hold with
//! their new owners (`Reclaim`) and, if the scheduler changed, rejoins the new
//! scheduler. New owners hold back lock requests and the new scheduler holds back
//! assignments until every survivor has re-registered.
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
use rustc_hash::FxHashMap;
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

mod jobs;
mod looping;
mod membership;
mod net;
mod peers;
mod requests;
mod routed;
mod sessions;
mod spin;
mod status;

use jobs::*;
use spin::SpinPolicy;

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
    /// A peer whose link stays down this long is declared dead; a connected peer that
    /// goes silent (neither data nor TCP keepalive probes acknowledged) loses its link
    /// after as long (see `membership`).
    pub peer_timeout: Duration,
    /// How often the agent looks for new agents in the rendezvous directory and greets
    /// the ones that have not answered yet.
    pub discovery: Duration,
    /// Bytes of the data cache.
    pub cache_bytes: usize,
    /// Bytes of global memory this agent lends.
    pub gma_bytes: u64,
    /// Job threads (plug-ins, compression, cache misses) for this node's processes; as
    /// many again serve work that other agents ask of this one.
    pub jobs: usize,
    /// The job's key: agents on other nodes must prove they hold it (see
    /// `gepsea_net::auth`). `None`: links to other agents are not authenticated.
    pub key: Option<gepsea_net::auth::Key>,
    /// Encrypt links to other agents with `key` (`gepsea_net::seal`).
    pub encrypt: bool,
    /// Connections on the registration socket at once (registered processes, status
    /// queries): one more is refused with a clear reply and closed. Each may buffer up
    /// to one registration frame (`wire::unix::MAX`), so this bounds that memory too.
    pub max_sessions: usize,
    /// The TCP congestion control of the links to other agents
    /// (`gepsea_net::PortConfig::tcp_congestion`); `None`: the port's default.
    pub tcp_congestion: Option<String>,
    /// The kernel buffers of each link to another agent, each way
    /// (`gepsea_net::PortConfig::tcp_buffer`, by default as a port's:
    /// `GEPSEA_TCP_BUFFER`, else 4 MiB); `None`: the kernel sizes them (links across a
    /// wide area, whose bandwidth-delay product exceeds 8 MiB).
    pub tcp_buffer: Option<usize>,
    /// What the links to other agents checksum (`gepsea_net::PortConfig::tcp_checksums`,
    /// by default as a port's: `GEPSEA_TCP_CHECKSUMS`, else everything).
    pub tcp_checksums: gepsea_net::tcp::TcpChecksums,
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
            discovery: Duration::from_millis(500),
            cache_bytes: 1 << 30,
            gma_bytes: 1 << 30,
            jobs: 4,
            key: None,
            encrypt: false,
            max_sessions: 1024,
            tcp_congestion: None,
            tcp_buffer: gepsea_net::tcp::default_buffer(),
            tcp_checksums: gepsea_net::tcp::default_checksums(),
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

/// The longest a message nobody waits for is held back (`Agent::send_peer_lazy`)
/// while the loop spins.
const LAZY_FOR: Duration = Duration::from_micros(20);

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
    Rma { reply_to_port: Option<u32>, id: u64 },
}

/// An operation this agent routed to an owner and awaits.
struct Routed {
    dest: u32,
    client: Client,
    op: Op,
    reply: ReplyTo,
}

/// A lock a client of this agent holds, as its owner granted it.
#[derive(Clone, Copy, Debug)]
struct HeldLock {
    mode: LockMode,
    /// Nobody else waited for the lock when it was granted (`PeerMsg::Granted`): its
    /// release goes to the owner lazily (`Agent::route_lock_op`).
    alone: bool,
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
    // The maps every request touches hash with Fx (ids and ports are ours, not an
    // attacker's): SipHash was ≈0.1 µs of a 1 µs local request.
    clients: FxHashMap<u32, ClientInfo>,
    next_port: u32,
    // membership
    known: BTreeMap<u32, Option<(u32, u64)>>,
    dead: BTreeSet<u32>,
    view: Vec<u32>,
    ready: bool,
    // gepsea-net
    net: FxHashMap<ReqId, NetOp>,
    large_counter: u64,
    /// Receive buffers for requests and peer messages, reused.
    buffers: crate::wire::EnvelopeBuffers,
    /// Replies and messages to other agents are encoded here.
    encoder: crate::wire::EnvelopeEncoder,
    loopback: VecDeque<PeerMsg>,
    loopback_from: VecDeque<(u32, PeerMsg)>,
    /// The port is corked until the end of this pass (see `Agent::send_peer`).
    corked: bool,
    /// Messages to other agents held back (`Agent::send_peer_lazy`), and until when.
    lazy: Vec<(u32, PeerMsg)>,
    lazy_deadline: Option<Instant>,
    /// The port's events taken on one pass of the loop (kept to reuse its allocation).
    port_events: Vec<Event>,
    // components
    board: Board,
    locks: LockTable,
    lock_waiters: HashMap<(String, Client), (u32, u64)>,
    held_locks: HashMap<(String, Client), HeldLock>,
    /// Releases answered here and on their way to the lock's owner (see
    /// `Agent::route_lock_op`): our operation id and the owner it went to.
    releasing: HashMap<(String, Client), (u64, u32)>,
    /// Lock requests waiting for the same client's release of the same lock to reach
    /// its owner (they would go to another owner, so could overtake it).
    after_release: HashMap<(String, Client), Vec<(Op, ReplyTo)>>,
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
    cancellable: FxHashMap<(u32, u64), u64>,
    my_tasks: BTreeMap<u64, Task>,
    next_task: u64,
    holding: HashMap<u64, Client>,
    takes: HashMap<u64, (Client, ReplyTo, Instant)>,
    // settling after a death: agents whose Reclaim is awaited, deferred lock requests
    awaiting_reclaim: BTreeSet<u32>,
    /// The view those re-registrations are for (the view right after the death; agents
    /// may join meanwhile).
    reclaim_view: Vec<u32>,
    /// Agents that joined while we were settling a death: their hand-over is sent once
    /// every re-registration is in, so it holds the locks re-registered with us.
    handover_owed: Vec<u32>,
    /// Reclaims that arrived before we saw the death they refer to: (their view, sender).
    early_reclaims: Vec<(Vec<u32>, u32)>,
    /// Load-balancing messages that reached us before we knew we were the scheduler.
    early_sched: Vec<(u32, PeerMsg)>,
    sched_settle_deadline: Option<Instant>,
    settle_deadline: Option<Instant>,
    deferred: Vec<(u32, u64, Client, Op)>,
    // joining: agents whose hand-over is awaited (nothing owner-routed is served until
    // they are in), and where handed-over or forwarded operations went
    awaiting_handover: BTreeSet<u32>,
    handover_deadline: Option<Instant>,
    moved_ops: HashMap<(u32, u64), u32>,
    /// Our operations forwarded to an agent we know is dead: routed again at the time.
    retry_routes: Vec<(Instant, u64)>,
    /// Dead agents' incarnations: a hello from the same incarnation is not a rejoin.
    buried: HashMap<u32, u64>,
    rejoins: u64,
    /// This agent replaced a dead one of its node (its rendezvous entry was stale).
    restarted: bool,
    /// The rendezvous directory has been read once.
    discovered: bool,
    // jobs: the first half serves this node's processes, the second half other agents
    jobs: Vec<Sender<Job>>,
    /// Runs jobs that a job itself asked for (see [`Agent::job`]).
    nested: (InProc, Sender<JobDone>),
    calls_rx: Receiver<Call>,
    done_rx: Receiver<JobDone>,
    shutdown: Arc<Shutdown>,
    next_discovery: Instant,
    requests_served: u64,
    peer_messages: u64,
    /// Of which liveness and gossip ([`spin::is_background`]).
    background_messages: u64,
}

impl Agent {
    /// Opens the registration socket and the port, publishes the rendezvous entry and
    /// starts the job threads.
    pub fn start(cfg: AgentConfig, registry: Registry, engine: Engine, shutdown: Arc<Shutdown>) -> Result<Agent, AgentError> {
        let me = cfg.node;
        gepsea_net::trust::check_namespace(&cfg.namespace)?;
        let runtime_dir = namespace_dir(&cfg.namespace).join(format!("node-{me}"));
        gepsea_net::trust::ensure_private_dir(&runtime_dir)?;
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
        let mut restarted = false;
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
                warn!("replacing stale rendezvous entry {} ({}): rejoining as node {me}", entry.display(), addr.unwrap_or_default());
                restarted = true;
            }
            rendezvous_entry = Some(entry);
        }
        let mut pc = PortConfig::new(&cfg.namespace, Addr::new(me, 0));
        pc.listen = cfg.listen;
        pc.directory = cfg.rendezvous.clone();
        pc.reconnect_timeout = cfg.peer_timeout;
        pc.key = cfg.key.clone();
        pc.encrypt = cfg.encrypt;
        pc.linger = Duration::from_millis(500);
        pc.keepalive = Some(cfg.peer_timeout);
        if cfg.tcp_congestion.is_some() {
            pc.tcp_congestion = cfg.tcp_congestion.clone();
        }
        pc.tcp_buffer = cfg.tcp_buffer;
        pc.tcp_checksums = cfg.tcp_checksums;
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
                        let result = run_job(job.work, &svc);
                        if done_tx.send(JobDone { reply: job.reply, result }).is_err() {
                            break;
                        }
                        let _ = waker.wake();
                    }
                })
                .map_err(io_err("starting a job thread"))?;
            jobs.push(tx);
        }
        let incarnation = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
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
            clients: FxHashMap::default(),
            next_port: 1,
            known,
            dead: BTreeSet::new(),
            view: vec![me],
            ready: false,
            net: FxHashMap::default(),
            large_counter: 0,
            buffers: crate::wire::EnvelopeBuffers::new(4),
            encoder: crate::wire::EnvelopeEncoder::new(),
            loopback: VecDeque::new(),
            loopback_from: VecDeque::new(),
            port_events: Vec::new(),
            corked: false,
            lazy: Vec::new(),
            lazy_deadline: None,
            board: Board::new(),
            locks: LockTable::new(),
            lock_waiters: HashMap::new(),
            held_locks: HashMap::new(),
            releasing: HashMap::new(),
            after_release: HashMap::new(),
            seq: Sequencer::default(),
            outbox: Outbox::new(me),
            store: Store::new(cfg.cache_bytes),
            merges: HashMap::new(),
            gma: Allocations::new(cfg.gma_bytes),
            ptable: pstate::Table::default(),
            state_version: 0,
            scheduler: None,
            scheduler_node: None,
            // Operation ids start at the incarnation: a reply meant for this node's
            // previous agent can never match an operation of this one.
            next_op: incarnation,
            routed: HashMap::new(),
            peer_ops: HashMap::new(),
            cancellable: FxHashMap::default(),
            my_tasks: BTreeMap::new(),
            // Task ids are (node << 40 | n): n starts from the clock (µs, 39 bits) so a
            // restarted agent of the node never reuses its predecessor's ids.
            next_task: (incarnation / 1000) & ((1 << 39) - 1),
            holding: HashMap::new(),
            takes: HashMap::new(),
            awaiting_reclaim: BTreeSet::new(),
            reclaim_view: Vec::new(),
            handover_owed: Vec::new(),
            early_reclaims: Vec::new(),
            early_sched: Vec::new(),
            sched_settle_deadline: None,
            settle_deadline: None,
            deferred: Vec::new(),
            awaiting_handover: BTreeSet::new(),
            handover_deadline: None,
            moved_ops: HashMap::new(),
            retry_routes: Vec::new(),
            buried: HashMap::new(),
            rejoins: 0,
            restarted,
            discovered: cfg.rendezvous.is_none(),
            jobs,
            nested: (template, done_tx.clone()),
            calls_rx,
            done_rx,
            shutdown,
            next_discovery: Instant::now(),
            requests_served: 0,
            peer_messages: 0,
            background_messages: 0,
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
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.sock_path);
        if let Some(e) = &self.rendezvous_entry {
            let _ = std::fs::remove_file(e);
        }
    }
}
