//! Core components (GePSeA's bottom layer), each a sans-IO state machine.

pub mod advert;
pub mod board;
pub mod cache;
pub mod compress;
pub mod locks;
pub mod merge;
pub mod parse;
/// The key whose owner (`board::ranked`) owns lock `name`.
pub fn lock_key(name: &str) -> String {
    format!("gepsea.lock/{name}")
}

/// The key whose owner (`board::ranked`) runs merge stream `stream`.
pub fn merge_key(stream: &str) -> String {
    format!("gepsea.merge/{stream}")
}

/// A process served by an agent: (node, process id on that node).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Client {
    pub node: u32,
    pub process: u32,
}

impl Client {
    pub const fn new(node: u32, process: u32) -> Self {
        Client { node, process }
    }
}
