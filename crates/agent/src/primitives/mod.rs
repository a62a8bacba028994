//! Primitives: GePSeA's middle layer, built on the core components.
//!
//! - [`balance`]: dynamic load balancing — an elected scheduler hands tasks to whoever
//!   is idle; its state can be rebuilt from the other agents when it dies.
//! - [`pstate`]: global process state — every node's activity and holdings.
//! - [`gma`]: global memory aggregator — blocks of agents' memory addressed globally.
//!
//! The data streaming service (prefetch, swap) is a thin layer over the data cache and
//! lives in the agent's job code (`server`), since it is a sequence of cache and
//! directory operations rather than state of its own.

pub mod balance;
pub mod gma;
pub mod pstate;

/// The elected scheduler among the live agents: the lowest node id. Deterministic, so
/// every agent that has the same view agrees without a round of voting; when the
/// scheduler dies, the next lowest takes over as soon as the failure is detected.
pub fn elect(alive: &[u32]) -> Option<u32> {
    alive.iter().copied().min()
}
