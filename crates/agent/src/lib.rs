//! gepsea-agent: the per-node agent of GePSeA.
//!
//! Built bottom-up like gepsea-net: every core component is first a deterministic state
//! machine with no I/O (sans-IO) that the agent's event loop drives with messages from
//! gepsea-net. So far (see `docs/architecture.md`):
//!
//! - [`core::locks`]: distributed lock manager — exclusive, shared and group-wise shared
//!   locks, FIFO queueing, release of a dead process's or node's locks.
//! - [`core::board`]: bulletin board — versioned values, compare-and-swap, ownership of
//!   keys by rendezvous hashing over the live agents.
//! - [`core::advert`]: reliable advertising — per-publisher order, no duplicates, topic
//!   filtering, agent-managed mailboxes.
//! - [`core::merge`]: incremental k-way merge of sorted runs arriving in any order.

pub mod core;
