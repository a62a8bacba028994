//! gepsea-agent: the per-node agent of GePSeA.
//!
//! Three layers, bottom up, as in the GePSeA papers:
//!
//! - [`core`] components, each a deterministic state machine with no I/O (sans-IO):
//!   reliable advertising, bulletin board, distributed locks, data cache and directory,
//!   sort/merge, parsing and compression engines.
//! - [`primitives`] built on them: load balancing (elected scheduler), global process
//!   state, global memory aggregator (and the data streaming service in `server`).
//! - [`plugin`]s that applications address by name.
//!
//! [`server`] is the agent process's event loop that drives them all over gepsea-net;
//! [`wire`] is what clients and agents say to each other; [`api`] is the one typed API
//! both applications (through `gepsea-client`) and plug-ins use.

pub mod api;
pub mod core;
pub mod plugin;
pub mod primitives;
pub mod server;
pub mod wire;
