//! gepsea-client: how an application process talks to its node's agent.
//!
//! [`Client::connect`] registers with the agent over its Unix socket (kept open for the
//! life of the client: when this process dies the agent notices and releases its
//! locks, tasks and global memory), then opens a gepsea-net port of its own; requests
//! and replies travel over shared memory. Every request has a timeout and can be
//! cancelled; [`Client::start`] returns at once so the application can keep computing
//! while the agent works ([`Client::finish`] collects the reply).
//!
//! The typed operations come from [`gepsea_agent::api::Api`], implemented for
//! [`Client`] through [`Services`] — the same API the agents' plug-ins use. The C ABI
//! (`include/gepsea.h`) is in [`capi`].

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gepsea_agent::api::{check, ApiError, Services};
pub use gepsea_agent::api::{Api, Cas};
use gepsea_agent::server::agent_socket;
pub use gepsea_agent::wire;
use gepsea_agent::wire::*;
use gepsea_net::{Addr, Completion, NetError, Port, PortConfig, ReqId};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

pub mod capi;

/// Where and how to connect.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    pub namespace: String,
    pub node: u32,
    /// Shown by `gepsea agent status`.
    pub name: String,
    /// How long to wait for the agent to become ready (all `--nodes` agents up).
    pub ready_timeout: Duration,
    /// Default timeout of each request.
    pub timeout: Duration,
}

impl ConnectOptions {
    /// From the environment: `GEPSEA_NAMESPACE` (default `gepsea`), `GEPSEA_NODE`
    /// (default 1).
    pub fn from_env(name: &str) -> Result<Self, ClientError> {
        let namespace = std::env::var("GEPSEA_NAMESPACE").unwrap_or_else(|_| "gepsea".into());
        gepsea_net::trust::check_namespace(&namespace).map_err(|e| ClientError::Config(format!("GEPSEA_NAMESPACE: {e}")))?;
        let node = match std::env::var("GEPSEA_NODE") {
            Ok(v) => v.parse().map_err(|_| ClientError::Config(format!("GEPSEA_NODE={v:?} is not a node number")))?,
            Err(_) => 1,
        };
        Ok(ConnectOptions {
            namespace,
            node,
            name: name.to_string(),
            ready_timeout: Duration::from_secs(30),
            timeout: Duration::from_secs(60),
        })
    }
}

/// Why connecting failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no agent for node {node} in namespace {namespace:?} (socket {path}: {reason}); start one with `gepsea agent --node-id {node} --namespace {namespace}`")]
    NoAgent { node: u32, namespace: String, path: String, reason: String },
    #[error("the agent refused the registration: {0}")]
    Refused(String),
    #[error("the agent did not become ready within {0:?} (are all --nodes agents up?)")]
    NotReady(Duration),
    #[error("{0}")]
    Config(String),
    #[error("registration: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Net(#[from] NetError),
}

/// A registered application process.
pub struct Client {
    port: Port,
    agent: Addr,
    me: Addr,
    _registration: UnixStream,
    next_id: AtomicU64,
    next_large: AtomicU64,
    /// One lock for the request books: a request takes it three times, where the
    /// three separate locks were taken five times.
    books: Mutex<Books>,
    timeout: Duration,
}

struct Books {
    /// Requests started and not yet finished: id → posted reply receive.
    pending: FxHashMap<u64, ReqId>,
    /// Reply buffers of finished requests, for the next ones (a few, for requests in
    /// flight at once).
    buffers: EnvelopeBuffers,
    /// Requests are encoded here.
    encoder: EnvelopeEncoder,
}

impl Client {
    pub fn connect(opts: &ConnectOptions) -> Result<Client, ClientError> {
        gepsea_net::trust::check_namespace(&opts.namespace)?;
        let path = agent_socket(&opts.namespace, opts.node);
        let no_agent = |reason: String| ClientError::NoAgent {
            node: opts.node,
            namespace: opts.namespace.clone(),
            path: path.display().to_string(),
            reason,
        };
        let mut s = UnixStream::connect(&path).map_err(|e| no_agent(e.to_string()))?;
        unix::write(&mut s, &encode(&LocalRequest::Register { pid: std::process::id(), name: opts.name.clone() }))?;
        let reply = unix::read(&mut s).map_err(|e| no_agent(format!("no answer to registration: {e}")))?;
        let (node, port, namespace, ready) =
            match decode::<LocalReply>("registration reply", &reply).map_err(|e| ClientError::Refused(e.to_string()))? {
                LocalReply::Registered { node, port, namespace, ready } => (node, port, namespace, ready),
                LocalReply::Refused(m) => return Err(ClientError::Refused(m)),
                other => return Err(ClientError::Refused(format!("unexpected reply {other:?}"))),
            };
        if !ready {
            s.set_read_timeout(Some(opts.ready_timeout))?;
            match unix::read(&mut s).ok().and_then(|b| decode::<LocalReply>("ready", &b).ok()) {
                Some(LocalReply::Ready) => {}
                _ => return Err(ClientError::NotReady(opts.ready_timeout)),
            }
            s.set_read_timeout(None)?;
        }
        let me = Addr::new(node, port);
        // The agent shares this node's cores: after 10 µs a wait lets it have ours (a
        // request to another node's agent waited for the client's spin to end when the
        // agent that was to answer had been placed on the client's core).
        let mut pc = PortConfig::new(&namespace, me);
        pc.snooze_after = Some(Duration::from_micros(10));
        let port = Port::open(pc)?;
        Ok(Client {
            port,
            agent: Addr::new(node, 0),
            me,
            _registration: s,
            next_id: AtomicU64::new(1),
            next_large: AtomicU64::new(1),
            books: Mutex::new(Books { pending: FxHashMap::default(), buffers: EnvelopeBuffers::new(8), encoder: EnvelopeEncoder::new() }),
            timeout: opts.timeout,
        })
    }

    /// Connects with [`ConnectOptions::from_env`].
    pub fn connect_env(name: &str) -> Result<Client, ClientError> {
        Self::connect(&ConnectOptions::from_env(name)?)
    }

    /// This process's address (node, port).
    pub fn addr(&self) -> Addr {
        self.me
    }

    pub fn node(&self) -> u32 {
        self.me.node
    }

    /// Sends `op` and returns its request id at once; collect with [`Client::finish`].
    ///
    /// The request goes out before its reply's receive is posted, as a ping-pong's
    /// send precedes its receive: the agent takes longer to answer than the posting
    /// takes, and a reply that wins the race waits as unexpected until it is posted.
    /// Sends are detached: a failure shows up as the reply's failure.
    pub fn start(&self, op: Op) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut books = self.books.lock();
        books.encoder.send_detached(&self.port, self.agent, TAG_REQUEST, &Request { id, op }, || {
            TAG_LARGE | self.next_large.fetch_add(1, Ordering::Relaxed)
        });
        let buf = books.buffers.take();
        let r = self.port.irecv_into(Some(self.agent), Some(TAG_REPLY | id), buf);
        books.pending.insert(id, r);
        id
    }

    /// Waits up to `timeout` for request `id`'s reply. On timeout the request is
    /// cancelled at the agent and `Err(Timeout)` returned, unless its reply raced in.
    pub fn finish(&self, id: u64, timeout: Duration) -> Result<Reply, ApiError> {
        let r = self.books.lock().pending.remove(&id).ok_or_else(|| ApiError::Transport(format!("unknown request {id}")))?;
        match self.port.wait_timeout(r, timeout) {
            Ok(c) => self.reply_of(c),
            Err(NetError::Timeout(_)) => {
                let cancel = self.start(Op::Cancel { id });
                let grace = Duration::from_secs(5);
                let late = self.port.wait_timeout(r, grace);
                let _ = self.finish_plain(cancel, grace);
                match late {
                    Ok(c) => match self.reply_of(c) {
                        Err(ApiError::Agent { kind: ErrorKind::Cancelled, .. }) => Err(ApiError::Timeout(timeout)),
                        other => other,
                    },
                    Err(_) => {
                        self.port.cancel(r);
                        Err(ApiError::Timeout(timeout))
                    }
                }
            }
            Err(e) => Err(ApiError::Transport(e.to_string())),
        }
    }

    /// Request `id`'s reply if it has arrived, without waiting (`None`: not yet; the
    /// request stays pending). For a caller that keeps several requests in flight while
    /// it does other work, as the search master does with the agents' placements.
    pub fn try_finish(&self, id: u64) -> Option<Result<Reply, ApiError>> {
        let Some(r) = self.books.lock().pending.get(&id).copied() else {
            return Some(Err(ApiError::Transport(format!("unknown request {id}"))));
        };
        let done = self.port.test(r)?;
        self.books.lock().pending.remove(&id);
        Some(match done {
            Ok(c) => self.reply_of(c),
            Err(e) => Err(ApiError::Transport(e.to_string())),
        })
    }

    fn finish_plain(&self, id: u64, timeout: Duration) -> Result<Reply, ApiError> {
        let r = self.books.lock().pending.remove(&id).ok_or_else(|| ApiError::Transport(format!("unknown request {id}")))?;
        match self.port.wait_timeout(r, timeout) {
            Ok(c) => self.reply_of(c),
            Err(e) => {
                self.port.cancel(r);
                Err(ApiError::Transport(e.to_string()))
            }
        }
    }

    /// Withdraws request `id` at the agent (a waiting lock, take or mailbox read); its
    /// reply then arrives as `Err(Cancelled)` through [`Client::finish`].
    pub fn cancel(&self, id: u64) -> Result<(), ApiError> {
        let c = self.start(Op::Cancel { id });
        self.finish_plain(c, self.timeout).and_then(check).map(|_| ())
    }

    /// Sends `op` and waits up to `timeout`.
    pub fn call_timeout(&self, op: Op, timeout: Duration) -> Result<Reply, ApiError> {
        let id = self.start(op);
        self.finish(id, timeout)
    }

    fn reply_of(&self, c: Completion) -> Result<Reply, ApiError> {
        let Completion::Received(m) = c else { return Err(ApiError::Transport("unexpected completion".into())) };
        let large;
        let body = match decode::<Envelope>("reply envelope", &m.data).map_err(|e| ApiError::Transport(e.to_string()))? {
            Envelope::Inline(b) => b,
            Envelope::Large { len, tag } => match self.port.recv(Some(self.agent), Some(tag), len as usize) {
                Ok(m) => {
                    large = m.data;
                    &large[..]
                }
                Err(e) => return Err(ApiError::Transport(e.to_string())),
            },
        };
        let reply = decode::<Reply>("reply", body).map_err(|e| ApiError::Transport(e.to_string()));
        self.books.lock().buffers.give_back(m.data);
        check(reply?)
    }

    /// The agent's status document (JSON), as `gepsea agent status --json` prints it.
    pub fn status(namespace: &str, node: u32) -> Result<String, ClientError> {
        status(namespace, node)
    }
}

impl Services for Client {
    fn call(&self, op: Op) -> Result<Reply, ApiError> {
        self.call_timeout(op, self.timeout)
    }
}

/// Asks the agent of (namespace, node) for its status without registering.
pub fn status(namespace: &str, node: u32) -> Result<String, ClientError> {
    gepsea_net::trust::check_namespace(namespace)?;
    let path = agent_socket(namespace, node);
    let no_agent =
        |reason: String| ClientError::NoAgent { node, namespace: namespace.to_string(), path: path.display().to_string(), reason };
    let mut s = UnixStream::connect(&path).map_err(|e| no_agent(e.to_string()))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    unix::write(&mut s, &encode(&LocalRequest::Status))?;
    s.flush()?;
    let b = unix::read(&mut s).map_err(|e| no_agent(format!("no answer: {e}")))?;
    match decode::<LocalReply>("status reply", &b).map_err(|e| ClientError::Refused(e.to_string()))? {
        LocalReply::Status(j) => Ok(j),
        other => Err(ClientError::Refused(format!("unexpected reply {other:?}"))),
    }
}

/// Waits until the agent of (namespace, node) answers on its socket.
pub fn wait_for_agent(namespace: &str, node: u32, timeout: Duration) -> Result<(), ClientError> {
    let deadline = Instant::now() + timeout;
    loop {
        match status(namespace, node) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
