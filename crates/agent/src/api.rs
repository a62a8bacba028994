//! The one API to the agents, shared by applications and plug-ins.
//!
//! [`Services`] is the transport-neutral contract: send one [`Op`], get its [`Reply`].
//! The client library implements it over gepsea-net shared memory; inside the agent,
//! plug-ins get an implementation that talks to the agent's event loop directly. The
//! typed methods of [`Api`] are written once on top, so a plug-in uses the components
//! and primitives exactly as an external application would.

use std::time::Duration;

use crate::wire::*;

/// A request failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ApiError {
    /// The agent (or the owner agent it consulted) refused or failed the request.
    #[error("{message}")]
    Agent { kind: ErrorKind, message: String },
    #[error("no reply within {0:?} (the request was cancelled)")]
    Timeout(Duration),
    #[error("lost contact with the agent: {0}")]
    Transport(String),
    #[error("protocol error: unexpected reply {0} to {1}")]
    Unexpected(String, &'static str),
}

impl ApiError {
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            ApiError::Agent { kind, .. } => Some(*kind),
            _ => None,
        }
    }
}

/// Outcome of a compare-and-swap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cas {
    /// Written; the new version.
    Written(u64),
    /// Not written: the key's current version differs (0: no such key).
    Conflict(u64),
}

/// Send one operation, get its reply (`Reply::Err` arrives as `Err(ApiError::Agent)`).
pub trait Services: Send + Sync {
    fn call(&self, op: Op) -> Result<Reply, ApiError>;
}

fn unexpected<T>(r: Reply, op: &'static str) -> Result<T, ApiError> {
    Err(ApiError::Unexpected(format!("{r:?}").chars().take(80).collect(), op))
}

/// Turns an error reply into `Err`.
pub fn check(r: Reply) -> Result<Reply, ApiError> {
    match r {
        Reply::Err(e) => Err(ApiError::Agent { kind: e.kind, message: e.message }),
        r => Ok(r),
    }
}

macro_rules! expect {
    ($r:expr, $name:literal, $pat:pat => $val:expr) => {
        match $r? {
            $pat => Ok($val),
            other => unexpected(other, $name),
        }
    };
}

/// Typed operations over any [`Services`].
pub trait Api: Services {
    fn ping(&self) -> Result<(), ApiError> {
        expect!(self.call(Op::Ping), "ping", Reply::Ok => ())
    }
    fn board_get(&self, key: &str) -> Result<Option<BoardValue>, ApiError> {
        expect!(self.call(Op::BoardGet { key: key.into() }), "board-get", Reply::Value(v) => v)
    }
    fn board_put(&self, key: &str, value: &[u8]) -> Result<u64, ApiError> {
        expect!(self.call(Op::BoardPut { key: key.into(), value: value.to_vec() }), "board-put", Reply::Version(v) => v)
    }
    fn board_cas(&self, key: &str, expected: u64, value: &[u8]) -> Result<Cas, ApiError> {
        match self.call(Op::BoardCas { key: key.into(), expected, value: value.to_vec() })? {
            Reply::Version(v) => Ok(Cas::Written(v)),
            Reply::Conflict { current } => Ok(Cas::Conflict(current)),
            r => unexpected(r, "board-cas"),
        }
    }
    fn lock(&self, name: &str, mode: LockMode) -> Result<(), ApiError> {
        expect!(self.call(Op::Lock { name: name.into(), mode }), "lock", Reply::Ok => ())
    }
    fn unlock(&self, name: &str) -> Result<(), ApiError> {
        expect!(self.call(Op::Unlock { name: name.into() }), "unlock", Reply::Ok => ())
    }
    fn subscribe(&self, topic: &str) -> Result<(), ApiError> {
        expect!(self.call(Op::Subscribe { topic: topic.into() }), "subscribe", Reply::Ok => ())
    }
    fn unsubscribe(&self, topic: &str) -> Result<(), ApiError> {
        expect!(self.call(Op::Unsubscribe { topic: topic.into() }), "unsubscribe", Reply::Ok => ())
    }
    fn publish(&self, topic: &str, body: &[u8], dest: Dest) -> Result<(), ApiError> {
        expect!(self.call(Op::Publish { topic: topic.into(), body: body.to_vec(), dest }), "publish", Reply::Ok => ())
    }
    /// Up to `max` adverts, waiting up to `wait` for the first.
    fn next_adverts(&self, max: u32, wait: Duration) -> Result<Vec<AdvertMsg>, ApiError> {
        expect!(self.call(Op::NextAdverts { max, wait_ms: wait.as_millis() as u64 }), "next-adverts", Reply::Adverts(v) => v)
    }
    fn cache_put(&self, name: &str, data: &[u8]) -> Result<(), ApiError> {
        expect!(self.call(Op::CachePut { name: name.into(), data: data.to_vec() }), "cache-put", Reply::Ok => ())
    }
    fn cache_get(&self, name: &str) -> Result<Vec<u8>, ApiError> {
        expect!(self.call(Op::CacheGet { name: name.into() }), "cache-get", Reply::Data(d) => d)
    }
    fn cache_remove(&self, name: &str) -> Result<(), ApiError> {
        expect!(self.call(Op::CacheRemove { name: name.into() }), "cache-remove", Reply::Ok => ())
    }
    fn locate(&self, name: &str) -> Result<Vec<u32>, ApiError> {
        expect!(self.call(Op::Locate { name: name.into() }), "locate", Reply::Nodes(n) => n)
    }
    fn prefetch(&self, name: &str) -> Result<(), ApiError> {
        expect!(self.call(Op::Prefetch { name: name.into() }), "prefetch", Reply::Ok => ())
    }
    fn swap(&self, name: &str, to: u32) -> Result<(), ApiError> {
        expect!(self.call(Op::Swap { name: name.into(), to }), "swap", Reply::Ok => ())
    }
    fn gma_alloc(&self, node: u32, len: u64) -> Result<GlobalPtr, ApiError> {
        expect!(self.call(Op::GmaAlloc { node, len }), "gma-alloc", Reply::Ptr(p) => p)
    }
    fn gma_free(&self, ptr: GlobalPtr) -> Result<(), ApiError> {
        expect!(self.call(Op::GmaFree { ptr }), "gma-free", Reply::Ok => ())
    }
    fn gma_put(&self, ptr: GlobalPtr, offset: u64, data: &[u8]) -> Result<(), ApiError> {
        expect!(self.call(Op::GmaPut { ptr, offset, data: data.to_vec() }), "gma-put", Reply::Ok => ())
    }
    fn gma_get(&self, ptr: GlobalPtr, offset: u64, len: u64) -> Result<Vec<u8>, ApiError> {
        expect!(self.call(Op::GmaGet { ptr, offset, len }), "gma-get", Reply::Data(d) => d)
    }
    fn set_state(&self, activity: Activity, holds: Vec<String>) -> Result<(), ApiError> {
        expect!(self.call(Op::SetState { activity, holds }), "set-state", Reply::Ok => ())
    }
    fn global_state(&self) -> Result<Vec<NodeState>, ApiError> {
        expect!(self.call(Op::GlobalState), "global-state", Reply::States(s) => s)
    }
    fn submit(&self, payload: &[u8]) -> Result<u64, ApiError> {
        expect!(self.call(Op::Submit { payload: payload.to_vec(), affinity: None, urgent: false }), "submit", Reply::TaskId(t) => t)
    }
    /// Submits a task that reads the data object `data`: the scheduler prefers workers
    /// on a node that holds it.
    fn submit_near(&self, payload: &[u8], data: &str) -> Result<u64, ApiError> {
        expect!(self.call(Op::Submit { payload: payload.to_vec(), affinity: Some(data.into()), urgent: false }), "submit", Reply::TaskId(t) => t)
    }
    /// Submits a task that finishes work already under way (the searches a merge waits
    /// for): the scheduler hands it out before every task that is not urgent.
    fn submit_urgent(&self, payload: &[u8]) -> Result<u64, ApiError> {
        expect!(self.call(Op::Submit { payload: payload.to_vec(), affinity: None, urgent: true }), "submit", Reply::TaskId(t) => t)
    }
    /// The next task, waiting up to `wait` (None: nothing came).
    fn take(&self, wait: Duration) -> Result<Option<Task>, ApiError> {
        expect!(self.call(Op::Take { wait_ms: wait.as_millis() as u64 }), "take", Reply::Task(t) => t)
    }
    /// The agent that takes on `key` (e.g. merging one batch of results): the one with
    /// the least outstanding weight, as the load balancer sees it; the same agent while
    /// `key` is not released.
    fn place(&self, key: &str, weight: u64) -> Result<u32, ApiError> {
        expect!(self.call(Op::Place { key: key.into(), weight }), "place", Reply::Node(n) => n)
    }
    /// The data objects of the next `count` tasks this node's workers would be handed
    /// (the load balancer's lookahead): what to bring in ahead of use.
    fn upcoming(&self, count: u32) -> Result<Vec<String>, ApiError> {
        expect!(self.call(Op::Upcoming { count }), "upcoming", Reply::Names(n) => n)
    }
    /// `key`'s work is done; returns once the scheduler has taken it into account.
    fn release(&self, key: &str) -> Result<(), ApiError> {
        expect!(self.call(Op::Release { key: key.into() }), "release", Reply::Ok => ())
    }
    fn done(&self, task: u64) -> Result<(), ApiError> {
        expect!(self.call(Op::Done { task }), "done", Reply::Ok => ())
    }
    fn scheduler(&self) -> Result<u32, ApiError> {
        expect!(self.call(Op::Scheduler), "scheduler", Reply::Node(n) => n)
    }
    fn merge_open(&self, stream: &str, runs: u32) -> Result<(), ApiError> {
        expect!(self.call(Op::MergeOpen { stream: stream.into(), runs }), "merge-open", Reply::Ok => ())
    }
    fn merge_push(&self, stream: &str, run: u32, records: Vec<Record>, last: bool) -> Result<(), ApiError> {
        expect!(self.call(Op::MergePush { stream: stream.into(), run, records, last }), "merge-push", Reply::Ok => ())
    }
    /// Records now certainly next, and whether the stream is complete.
    fn merge_pull(&self, stream: &str) -> Result<(Vec<Record>, bool), ApiError> {
        expect!(self.call(Op::MergePull { stream: stream.into() }), "merge-pull", Reply::Records { records, done } => (records, done))
    }
    fn compress(&self, codec: Codec, level: i32, data: &[u8]) -> Result<Vec<u8>, ApiError> {
        expect!(self.call(Op::Compress { codec, level, data: data.to_vec() }), "compress", Reply::Data(d) => d)
    }
    fn decompress(&self, codec: Codec, data: &[u8]) -> Result<Vec<u8>, ApiError> {
        expect!(self.call(Op::Decompress { codec, data: data.to_vec() }), "decompress", Reply::Data(d) => d)
    }
    fn plugin(&self, name: &str, body: &[u8]) -> Result<Vec<u8>, ApiError> {
        expect!(self.call(Op::Plugin { name: name.into(), body: body.to_vec() }), "plugin", Reply::Data(d) => d)
    }
    /// Calls plug-in `name` on the agent of `node`.
    fn plugin_at(&self, node: u32, name: &str, body: Vec<u8>) -> Result<Vec<u8>, ApiError> {
        expect!(self.call(Op::PluginAt { node, name: name.into(), body }), "plugin-at", Reply::Data(d) => d)
    }
}

impl<T: Services + ?Sized> Api for T {}
