//! ParaMEDIC (Parallel Metadata Environment for Distributed I/O and Computing): instead
//! of moving bulky output from a compute site to a distant storage site, the compute
//! site turns it into small *semantic metadata*, ships that, and the storage site
//! regenerates the exact output from its own replica of the input.
//!
//! - [`MetadataPlugin`] is the contract: `encode` (output → metadata, compute site) and
//!   `decode` (metadata → the identical output, storage site). Application plug-ins know
//!   their output's meaning; [`ZstdPlugin`] is the generic fallback that works on any
//!   bytes without application knowledge.
//! - [`container`] wraps metadata for transfer and storage: magic, version, the plug-in's
//!   name, length and a SHA-256 over all of it, checked before anything is regenerated,
//!   so a corrupted or truncated object is refused with a clear error and never turns
//!   into a silently different output.

pub mod agent;
pub mod blast;
pub mod choose;
pub mod container;
pub mod plugin;
pub mod storage;
pub mod trace;
pub mod transfer;

pub use container::{open, seal, ContainerError};
pub use plugin::{MetadataPlugin, PluginError, RawPlugin, ZstdPlugin};
