//! Global memory aggregator: the allocation table one agent keeps for its memory.
//!
//! A global pointer names (node, region, length). Each allocation is its own region of
//! the agent's gepsea-net port, exposed on the open channel, so puts and gets from any
//! node are plain remote memory accesses that the owning agent does not take part in.
//! The application chooses placement by naming the node. Blocks belong to the process
//! that allocated them and are freed when it dies.

use std::collections::HashMap;

use crate::core::Client;

/// Why an allocation failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GmaError {
    #[error("allocation of {want} bytes exceeds this node's free global memory ({free} of {limit} bytes)")]
    OutOfMemory { want: u64, free: u64, limit: u64 },
    #[error("no global memory block {0} on this node")]
    NoSuchBlock(u64),
}

#[derive(Debug)]
pub struct Allocations {
    blocks: HashMap<u64, (Client, u64)>,
    next: u64,
    used: u64,
    limit: u64,
}

/// Regions below this are left to other users of the agent's port.
pub const FIRST_REGION: u64 = 1 << 32;

impl Allocations {
    pub fn new(limit: u64) -> Self {
        Allocations { blocks: HashMap::new(), next: FIRST_REGION, used: 0, limit }
    }

    /// Reserves `len` bytes for `owner`; returns the region id to expose.
    pub fn alloc(&mut self, owner: Client, len: u64) -> Result<u64, GmaError> {
        if len > self.limit - self.used {
            return Err(GmaError::OutOfMemory { want: len, free: self.limit - self.used, limit: self.limit });
        }
        let r = self.next;
        self.next += 1;
        self.used += len;
        self.blocks.insert(r, (owner, len));
        Ok(r)
    }

    pub fn free(&mut self, region: u64) -> Result<(), GmaError> {
        let (_, len) = self.blocks.remove(&region).ok_or(GmaError::NoSuchBlock(region))?;
        self.used -= len;
        Ok(())
    }

    /// Frees every block of owners matching `dead`; returns their regions.
    pub fn forget(&mut self, dead: impl Fn(&Client) -> bool) -> Vec<u64> {
        let gone: Vec<u64> = self.blocks.iter().filter(|(_, (c, _))| dead(c)).map(|(r, _)| *r).collect();
        for r in &gone {
            self.free(*r).unwrap();
        }
        gone
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_owner_death() {
        let mut a = Allocations::new(100);
        let (x, y) = (Client::new(1, 1), Client::new(2, 1));
        let r1 = a.alloc(x, 60).unwrap();
        assert_eq!(a.alloc(y, 50), Err(GmaError::OutOfMemory { want: 50, free: 40, limit: 100 }));
        let r2 = a.alloc(y, 40).unwrap();
        assert_ne!(r1, r2);
        assert_eq!(a.forget(|c| c.node == 1), vec![r1]);
        assert_eq!(a.used(), 40);
        assert_eq!(a.free(r1), Err(GmaError::NoSuchBlock(r1)));
    }
}
