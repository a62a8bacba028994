//! gepsea-net: the communication layer every other part of gepsea sends its bytes through.
//!
//! In the tradition of BCL-3 and event-driven MPI: every process owns one [`Port`],
//! addressed as ([node](Addr::node), [port](Addr::port)). Messages travel on three
//! channels — the eager **system** channel into a receiver-managed pool, the **normal**
//! channel (tagged, eager when small, rendezvous when large, straight into the posted
//! buffer), and the **open** channel (remote memory access into exposed regions).
//! Inside a node they go through shared-memory rings; between nodes through TCP with
//! sequence numbers, checksums and replay after reconnect. A dedicated event thread
//! makes progress on OS events while the application computes.
//!
//! Layering, bottom up — each layer testable on its own:
//! - [`frame`]: the wire format and its decoder (sans-IO); `crc`: its checksum.
//! - [`reliable`]: per-link sequence/acknowledgement windows and replay (sans-IO).
//! - [`proto`]: matching, credits, rendezvous and RMA state machines (sans-IO).
//! - [`ring`]: the lock-free SPSC byte ring used in shared memory (loom-checked).
//! - `handover`: how a port's event thread leaves its events to a spinning wait
//!   instead of queueing for the lock (loom-checked).
//! - `shm`, `tcp`: the two transports (`cma`: single copy between processes of one
//!   node; `uio`: TCP reads straight into a posted buffer); `port`: the event loop
//!   that drives them.

#[cfg(not(loom))]
pub mod auth;
#[cfg(not(loom))]
pub mod cma;
mod crc;
pub mod error;
pub mod frame;
mod handover;
pub mod lent;
#[cfg(not(loom))]
pub mod port;
pub mod proto;
pub mod reliable;
mod reqtable;
pub mod ring;
#[cfg(not(loom))]
pub mod seal;
#[cfg(not(loom))]
pub mod shm;
mod size;
#[cfg(not(loom))]
pub mod tcp;
pub mod testbed;
pub mod testkit;
#[cfg(not(loom))]
mod timer;
pub mod trace;
#[cfg(not(loom))]
pub mod trust;
#[cfg(not(loom))]
mod uio;

/// The longest namespace name (`trust::check_namespace`): with `TMPDIR=/tmp`, the
/// longest user id, node and port numbers, a port's socket path
/// (`/tmp/gepsea-<uid>/<namespace>/node-<n>/port-<p>.sock`) still fits the 108 bytes of
/// a Unix socket address. (Here, not in `trust`, which the loom build leaves out.)
pub const NAMESPACE_MAX: usize = 40;

pub use error::NetError;
pub use frame::{Addr, Channel};
#[cfg(not(loom))]
pub use port::{namespace_dir, Port, PortConfig, PortStats, Progress, DEFAULT_TCP_BUFFER};
pub use proto::{Completion, Event, Message, ProtoConfig, ReqId};
pub use size::parse_byte_size;
