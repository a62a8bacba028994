//! What clients and agents say to each other.
//!
//! Three conversations, all encoded with postcard (compact, schema-less, refuses
//! malformed input with an error rather than a panic):
//!
//! - **Registration** ([`LocalRequest`] / [`LocalReply`]) over the agent's Unix socket,
//!   length-prefixed. The socket stays open for the life of the client: when it closes
//!   the agent knows the process is gone and cleans up after it. `gepsea agent status`
//!   uses the same socket without registering.
//! - **Requests** ([`Request`] → [`Reply`]) from a registered client to its agent over
//!   gepsea-net shared memory, normal channel. A request goes with tag [`TAG_REQUEST`];
//!   its reply comes back with tag `TAG_REPLY | id`, so that many requests can be in
//!   flight and each waiter matches only its own reply. Every request gets exactly one
//!   reply — a cancelled one too (`Err(Cancelled)`) — so a client never has to guess
//!   whether a late grant is on its way.
//! - **Peer messages** ([`PeerMsg`]) between agents, tag [`TAG_PEER`], over TCP between
//!   nodes.
//!
//! Bodies bigger than [`SMALL_MAX`] travel as an [`Envelope::Large`] header followed by
//! the body on a tag of their own, so receivers can keep one modest receive buffer
//! posted and size the big one exactly.

use serde::{Deserialize, Serialize};

mod envelope;
pub use envelope::*;

/// Client → agent requests.
pub const TAG_REQUEST: u64 = 1;
/// Agent → agent messages.
pub const TAG_PEER: u64 = 2;
/// Replies: `TAG_REPLY | request id`.
pub const TAG_REPLY: u64 = 1 << 63;
/// Bodies of large messages: `TAG_LARGE | sender's counter`.
pub const TAG_LARGE: u64 = 1 << 62;
/// Largest body sent inline; receivers post buffers of this size.
pub const SMALL_MAX: usize = 80 * 1024;
/// Largest body the agent accepts at all (cache objects, merge chunks, plug-in calls).
pub const MAX_BODY: usize = 1 << 30;

/// Identifies a process served by an agent (re-exported from the core).
pub use crate::core::Client;

/// A lock mode on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockMode {
    Exclusive,
    Shared,
    Group(u64),
}

impl From<LockMode> for crate::core::locks::Mode {
    fn from(m: LockMode) -> Self {
        match m {
            LockMode::Exclusive => Self::Exclusive,
            LockMode::Shared => Self::Shared,
            LockMode::Group(g) => Self::Group(g),
        }
    }
}

impl From<crate::core::locks::Mode> for LockMode {
    fn from(m: crate::core::locks::Mode) -> Self {
        use crate::core::locks::Mode;
        match m {
            Mode::Exclusive => LockMode::Exclusive,
            Mode::Shared => LockMode::Shared,
            Mode::Group(g) => LockMode::Group(g),
        }
    }
}

/// Where an advert goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Dest {
    /// Every live agent, the publisher's own included.
    All,
    /// These nodes only.
    Nodes(Vec<u32>),
}

/// Compression codecs of the compression engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Codec {
    Zstd,
    Gzip,
    /// A codec registered with the engine by name (application-specific compression).
    Custom(String),
}

/// What a node is doing (global process state).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Activity {
    Idle,
    Busy,
    Waiting,
}

/// A block of global memory: `len` bytes on `node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GlobalPtr {
    pub node: u32,
    pub region: u64,
    pub len: u64,
}

/// One record of a merge stream (ordered by key, then value).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Record {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

/// A unit of work handed out by the load balancer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub id: u64,
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// The data object the task reads: the scheduler prefers a taker whose node holds
    /// it (see `primitives::balance`).
    pub affinity: Option<String>,
    /// Finishes work already under way (e.g. the searches a merge waits for): handed
    /// out before every task that is not.
    pub urgent: bool,
}

/// A node's entry in the global process state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    pub node: u32,
    pub activity: Activity,
    /// Registered processes and what each says it is doing.
    pub processes: Vec<(u32, Activity)>,
    /// Names of the data this node holds (its cache, plus what processes declared).
    pub holds: Vec<String>,
    /// The node's agent's incarnation: a new one means the agent restarted, and
    /// whatever its predecessor held is gone.
    pub incarnation: u64,
    /// Bumped on every change, so readers can tell fresh from stale.
    pub version: u64,
}

/// A bulletin-board value and its version (1 for the first write).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoardValue {
    pub version: u64,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

/// A client's request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    pub op: Op,
}

/// Everything a client (or a plug-in) can ask of the agents.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    Ping,
    // bulletin board
    BoardGet {
        key: String,
    },
    BoardPut {
        key: String,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    },
    /// Write only if the key's version is `expected` (0: must not exist).
    BoardCas {
        key: String,
        expected: u64,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    },
    // locks
    Lock {
        name: String,
        mode: LockMode,
    },
    Unlock {
        name: String,
    },
    // advertising
    Subscribe {
        topic: String,
    },
    Unsubscribe {
        topic: String,
    },
    Publish {
        topic: String,
        #[serde(with = "serde_bytes")]
        body: Vec<u8>,
        dest: Dest,
    },
    /// Up to `max` adverts from this client's mailbox, waiting up to `wait_ms` for one.
    NextAdverts {
        max: u32,
        wait_ms: u64,
    },
    // data cache and directory
    CachePut {
        name: String,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    CacheGet {
        name: String,
    },
    CacheRemove {
        name: String,
    },
    Locate {
        name: String,
    },
    // data streaming
    Prefetch {
        name: String,
    },
    Swap {
        name: String,
        to: u32,
    },
    // global memory
    GmaAlloc {
        node: u32,
        len: u64,
    },
    GmaFree {
        ptr: GlobalPtr,
    },
    GmaPut {
        ptr: GlobalPtr,
        offset: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    GmaGet {
        ptr: GlobalPtr,
        offset: u64,
        len: u64,
    },
    // global process state
    SetState {
        activity: Activity,
        holds: Vec<String>,
    },
    GlobalState,
    // dynamic load balancing
    Submit {
        #[serde(with = "serde_bytes")]
        payload: Vec<u8>,
        affinity: Option<String>,
        /// See [`Task::urgent`].
        urgent: bool,
    },
    Take {
        wait_ms: u64,
    },
    /// Which agent takes on `key` (e.g. merging one batch): the scheduler's
    /// [`crate::primitives::balance::Placement`]. Replies `Node`.
    Place {
        key: String,
        weight: u64,
    },
    /// `key`'s work is done (its weight stops counting); answered once the scheduler
    /// has it, so that a placement asked after the answer sees the release.
    Release {
        key: String,
    },
    /// The data objects of the next `count` tasks the scheduler would hand this node
    /// (`Balance::upcoming`); replies `Names`.
    Upcoming {
        count: u32,
    },
    Done {
        task: u64,
    },
    Scheduler,
    // distributed sort/merge
    MergeOpen {
        stream: String,
        runs: u32,
    },
    MergePush {
        stream: String,
        run: u32,
        records: Vec<Record>,
        last: bool,
    },
    /// Records now certainly next in order; `done` once every run finished and all
    /// records were pulled.
    MergePull {
        stream: String,
    },
    // engines
    Compress {
        codec: Codec,
        level: i32,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    Decompress {
        codec: Codec,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    // plug-ins
    Plugin {
        name: String,
        #[serde(with = "serde_bytes")]
        body: Vec<u8>,
    },
    /// Calls plug-in `name` of the agent of `node` (plug-ins talking to their peers).
    PluginAt {
        node: u32,
        name: String,
        #[serde(with = "serde_bytes")]
        body: Vec<u8>,
    },
    /// Withdraws request `id` (a queued lock, a waiting take or mailbox read); the
    /// withdrawn request is answered with `Err(Cancelled)` if it had not finished.
    Cancel {
        id: u64,
    },
}

impl Op {
    /// A short name for logs and statistics.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Ping => "ping",
            Op::BoardGet { .. } => "board-get",
            Op::BoardPut { .. } => "board-put",
            Op::BoardCas { .. } => "board-cas",
            Op::Lock { .. } => "lock",
            Op::Unlock { .. } => "unlock",
            Op::Subscribe { .. } => "subscribe",
            Op::Unsubscribe { .. } => "unsubscribe",
            Op::Publish { .. } => "publish",
            Op::NextAdverts { .. } => "next-adverts",
            Op::CachePut { .. } => "cache-put",
            Op::CacheGet { .. } => "cache-get",
            Op::CacheRemove { .. } => "cache-remove",
            Op::Locate { .. } => "locate",
            Op::Prefetch { .. } => "prefetch",
            Op::Swap { .. } => "swap",
            Op::GmaAlloc { .. } => "gma-alloc",
            Op::GmaFree { .. } => "gma-free",
            Op::GmaPut { .. } => "gma-put",
            Op::GmaGet { .. } => "gma-get",
            Op::SetState { .. } => "set-state",
            Op::GlobalState => "global-state",
            Op::Submit { .. } => "submit",
            Op::Place { .. } => "place",
            Op::Release { .. } => "release",
            Op::Upcoming { .. } => "upcoming",
            Op::Take { .. } => "take",
            Op::Done { .. } => "done",
            Op::Scheduler => "scheduler",
            Op::MergeOpen { .. } => "merge-open",
            Op::MergePush { .. } => "merge-push",
            Op::MergePull { .. } => "merge-pull",
            Op::Compress { .. } => "compress",
            Op::Decompress { .. } => "decompress",
            Op::Plugin { .. } => "plugin",
            Op::PluginAt { .. } => "plugin-at",
            Op::Cancel { .. } => "cancel",
        }
    }
}

/// An advert as a subscriber reads it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdvertMsg {
    pub publisher: u32,
    pub seq: u64,
    pub topic: String,
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

/// What a request produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    Ok,
    /// A board value and its version (None: no such key).
    Value(Option<BoardValue>),
    /// A write succeeded with this new version.
    Version(u64),
    /// A compare-and-swap lost: the key's current version.
    Conflict {
        current: u64,
    },
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    Nodes(Vec<u32>),
    Adverts(Vec<AdvertMsg>),
    Ptr(GlobalPtr),
    States(Vec<NodeState>),
    TaskId(u64),
    Task(Option<Task>),
    Node(u32),
    /// Names (e.g. of data objects).
    Names(Vec<String>),
    Records {
        records: Vec<Record>,
        done: bool,
    },
    Err(ErrorReply),
}

/// A failed request: a machine-readable kind and a message for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub kind: ErrorKind,
    pub message: String,
}

/// Failure classes a caller may want to tell apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The request could not be decoded or makes no sense.
    BadRequest,
    UnknownPlugin,
    TooLarge,
    NotFound,
    NotHeld,
    Cancelled,
    /// The node or service needed is not (or no longer) there.
    Unavailable,
    /// A plug-in (or engine) failed on this input.
    Failed,
}

impl Reply {
    pub fn err(kind: ErrorKind, message: impl Into<String>) -> Reply {
        Reply::Err(ErrorReply { kind, message: message.into() })
    }
}

/// Registration conversation on the Unix socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LocalRequest {
    Register { pid: u32, name: String },
    Status,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum LocalReply {
    Registered {
        node: u32,
        port: u32,
        namespace: String,
        ready: bool,
    },
    /// The agent's status as JSON (the same document `gepsea agent status --json` prints).
    Status(String),
    /// Sent once more on the registration socket when the agent becomes ready.
    Ready,
    Refused(String),
}

/// Messages between agents. `op` fields number the sender's outstanding operations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum PeerMsg {
    Hello {
        node: u32,
        pid: u32,
        incarnation: u64,
    },
    HelloAck {
        node: u32,
        pid: u32,
        incarnation: u64,
    },
    /// An owner-routed operation (board, lock, merge, directory) from `origin`'s client.
    Routed {
        op: u64,
        client: Client,
        body: Op,
    },
    RoutedReply {
        op: u64,
        reply: Reply,
    },
    /// Owner → origin: lock request `op` is granted; `alone`: nobody else was waiting
    /// for the lock then, so the holder's agent may send its release lazily (see
    /// `Agent::route_lock_op`).
    Granted {
        op: u64,
        alone: bool,
    },
    /// Owner → backup (and old owner → new owner): board entries (version kept).
    BoardCopy {
        entries: Vec<(String, BoardValue)>,
    },
    /// After a node died, to every survivor: the locks this agent's clients hold whose
    /// owner is now the recipient (often none). Owners grant nothing new until every
    /// survivor's reclaim is in.
    Reclaim {
        view: Vec<u32>,
        locks: Vec<(String, Client, LockMode)>,
    },
    Advert {
        publisher: u32,
        seq: u64,
        topic: String,
        #[serde(with = "serde_bytes")]
        body: Vec<u8>,
    },
    AdvertAck {
        seq: u64,
    },
    ProcessDied {
        client: Client,
    },
    /// Global-process-state update of the sender's node.
    State(NodeState),
    /// Load balancer, towards the scheduler.
    Submit {
        task: Task,
        submitter: u32,
    },
    Take {
        op: u64,
        client: Client,
    },
    CancelTake {
        op: u64,
    },
    Place {
        op: u64,
        key: String,
        weight: u64,
    },
    Release {
        op: u64,
        key: String,
    },
    Upcoming {
        op: u64,
        count: u32,
    },
    Done {
        task: u64,
    },
    /// A task arrived after its take was withdrawn: back to the queue.
    Giveback {
        task: u64,
    },
    /// After a scheduler change: unfinished tasks of this node, tasks its clients hold,
    /// and its waiting takes.
    Rejoin {
        view: Vec<u32>,
        submitted: Vec<Task>,
        holding: Vec<(u64, Client)>,
        takes: Vec<(u64, Client)>,
    },
    /// Scheduler → worker's agent.
    Assigned {
        op: u64,
        task: Task,
    },
    /// Scheduler → submitter's agent.
    TaskFinished {
        task: u64,
    },
    // cache, streaming, global memory
    Fetch {
        op: u64,
        name: String,
    },
    Store {
        op: u64,
        name: String,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    GmaAlloc {
        op: u64,
        client: Client,
        len: u64,
    },
    GmaFree {
        op: u64,
        region: u64,
    },
    Plugin {
        op: u64,
        client: Client,
        name: String,
        #[serde(with = "serde_bytes")]
        body: Vec<u8>,
    },
    Reply {
        op: u64,
        reply: Reply,
    },
    /// When the view grew, old owner → new owner (and, empty, between every pair that
    /// just met): the locks and merge streams the sender owned whose owner is now the
    /// recipient. The recipient serves no owner-routed operation until every member of
    /// its view has sent one (board entries travel before it as `BoardCopy`).
    Handover {
        locks: Vec<HandedLock>,
        merges: Vec<(String, MergeState)>,
    },
    /// An owner-routed operation that reached an agent which no longer owns its key
    /// (the origin's view was behind): executed by the recipient, which answers
    /// `origin` directly.
    Forwarded {
        origin: u32,
        op: u64,
        client: Client,
        body: Op,
    },
    /// To an origin: its operation `op` is now with agent `dest` (forwarded, or a lock
    /// request handed over while waiting), so a cancel or that agent's death is
    /// followed there.
    Moved {
        op: u64,
        dest: u32,
    },
    /// The sender is stopping (its last word): drop it from the view now, as a failure
    /// that needs no timeout to be noticed.
    Leaving,
}

/// A lock handed to its new owner: holders, and waiters in order with the operation
/// each waits on (`origin` agent, its op id) so the grant can be answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandedLock {
    pub name: String,
    pub holders: Vec<(Client, LockMode)>,
    pub waiting: Vec<(Client, LockMode, u32, u64)>,
}

/// A merge stream in flight: each run's buffered records and whether it finished, and
/// the last record each run sent (to keep checking order).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeState {
    pub runs: Vec<(Vec<Record>, bool)>,
    pub last: Vec<Option<Record>>,
}

/// Wire decoding failed.
#[derive(Debug, thiserror::Error)]
#[error("malformed {what}: {source}")]
pub struct DecodeError {
    pub what: &'static str,
    #[source]
    pub source: postcard::Error,
}

pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_stdvec(v).expect("postcard encoding into a Vec cannot fail")
}

pub fn decode<'a, T: Deserialize<'a>>(what: &'static str, b: &'a [u8]) -> Result<T, DecodeError> {
    postcard::from_bytes(b).map_err(|source| DecodeError { what, source })
}

/// Length-prefixed frames on the registration socket (4-byte little-endian length).
pub mod unix {
    use std::io::{self, Read, Write};

    /// Largest registration-socket message.
    pub const MAX: usize = 16 << 20;

    pub fn write(w: &mut impl Write, body: &[u8]) -> io::Result<()> {
        let mut b = Vec::with_capacity(4 + body.len());
        b.extend_from_slice(&(body.len() as u32).to_le_bytes());
        b.extend_from_slice(body);
        w.write_all(&b)
    }

    pub fn read(r: &mut impl Read) -> io::Result<Vec<u8>> {
        let mut len = [0u8; 4];
        r.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("message of {len} bytes exceeds {MAX}")));
        }
        let mut b = vec![0; len];
        r.read_exact(&mut b)?;
        Ok(b)
    }

    /// Splits complete frames off the front of `buf` (for a non-blocking reader).
    pub fn split(buf: &mut Vec<u8>) -> Result<Option<Vec<u8>>, String> {
        if buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize;
        if len > MAX {
            return Err(format!("message of {len} bytes exceeds {MAX}"));
        }
        if buf.len() < 4 + len {
            return Ok(None);
        }
        let body = buf[4..4 + len].to_vec();
        buf.drain(..4 + len);
        Ok(Some(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_garbage_is_refused() {
        let r = Request { id: 7, op: Op::BoardCas { key: "k".into(), expected: 3, value: b"v".to_vec() } };
        let b = encode(&r);
        assert_eq!(decode::<Request>("request", &b).unwrap(), r);
        let e = decode::<Request>("request", &[0xff, 0xff, 0xff]).unwrap_err();
        assert!(e.to_string().starts_with("malformed request"), "{e}");
        assert!(decode::<Request>("request", &b[..b.len() - 1]).is_err());
    }

    #[test]
    fn unix_frames_split_at_boundaries() {
        let mut out = Vec::new();
        unix::write(&mut out, b"abc").unwrap();
        unix::write(&mut out, b"").unwrap();
        let mut buf = out[..5].to_vec();
        assert_eq!(unix::split(&mut buf).unwrap(), None);
        buf.extend_from_slice(&out[5..]);
        assert_eq!(unix::split(&mut buf).unwrap(), Some(b"abc".to_vec()));
        assert_eq!(unix::split(&mut buf).unwrap(), Some(vec![]));
        assert!(buf.is_empty());
        let mut huge = ((unix::MAX + 1) as u32).to_le_bytes().to_vec();
        assert!(unix::split(&mut huge).is_err());
    }
}
