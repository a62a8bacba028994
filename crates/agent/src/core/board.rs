//! Bulletin board: an addressable memory any node can read and write.
//!
//! Every key is owned by one agent, chosen by rendezvous (highest-random-weight)
//! hashing over the live agents, so that when an agent dies only its keys move. The
//! owner serialises all operations on its keys through this state machine: a value has
//! a version that grows by one on every write, and compare-and-swap succeeds only
//! against the current version. That is the synchronisation that prevents torn or lost
//! updates: concurrent increments retry on conflict and none is lost.

use std::collections::HashMap;

use bytes::Bytes;

/// Largest value the board stores (bigger data belongs in the data cache).
pub const MAX_VALUE: usize = 64 * 1024;

/// A stored value and its version (1 for the first write).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    pub version: u64,
    pub value: Bytes,
}

/// Why a board operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BoardError {
    #[error("value of {len} bytes exceeds the bulletin-board limit of {MAX_VALUE} bytes")]
    TooLarge { len: usize },
    #[error("version conflict: expected {expected}, current is {current}")]
    Conflict { expected: u64, current: u64 },
}

/// The keys one agent owns.
#[derive(Default, Debug)]
pub struct Board {
    entries: HashMap<String, Versioned>,
}

impl Board {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, key: &str) -> Option<&Versioned> {
        self.entries.get(key)
    }

    /// Unconditional write; returns the new version.
    pub fn put(&mut self, key: &str, value: Bytes) -> Result<u64, BoardError> {
        let current = self.entries.get(key).map_or(0, |v| v.version);
        self.cas(key, current, value)
    }

    /// Writes `value` only if the key's version is `expected` (0: the key must not
    /// exist). Returns the new version, or the current one in the error.
    pub fn cas(&mut self, key: &str, expected: u64, value: Bytes) -> Result<u64, BoardError> {
        if value.len() > MAX_VALUE {
            return Err(BoardError::TooLarge { len: value.len() });
        }
        let current = self.entries.get(key).map_or(0, |v| v.version);
        if current != expected {
            return Err(BoardError::Conflict { expected, current });
        }
        self.entries.insert(key.to_string(), Versioned { version: current + 1, value });
        Ok(current + 1)
    }

    /// Removes and returns every entry (to hand keys over to a new owner).
    pub fn drain(&mut self) -> Vec<(String, Versioned)> {
        self.entries.drain().collect()
    }

    /// Adopts entries from a previous owner, keeping the higher version on conflict.
    pub fn adopt(&mut self, entries: Vec<(String, Versioned)>) {
        for (k, v) in entries {
            match self.entries.get(&k) {
                Some(cur) if cur.version >= v.version => {}
                _ => {
                    self.entries.insert(k, v);
                }
            }
        }
    }
}

fn mix(mut x: u64) -> u64 {
    // SplitMix64 finaliser: a cheap, well-distributed, platform-independent hash.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn key_hash(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// The agent (node id) that owns `key` among `agents` (empty: none).
pub fn owner_of(key: &str, agents: &[u32]) -> Option<u32> {
    let h = key_hash(key);
    agents.iter().copied().max_by_key(|&a| (mix(h ^ mix(a as u64 + 1)), a))
}

/// `key`'s agents in rendezvous order: the owner first, then its backup, and so on.
/// When the owner dies the backup becomes the owner, so a backup copy is exactly
/// where the key's next owner will look.
pub fn ranked(key: &str, agents: &[u32]) -> Vec<u32> {
    let h = key_hash(key);
    let mut v: Vec<u32> = agents.to_vec();
    v.sort_by_key(|&a| std::cmp::Reverse((mix(h ^ mix(a as u64 + 1)), a)));
    v
}

/// Every key and version this agent stores.
impl Board {
    pub fn entries(&self) -> impl Iterator<Item = (&String, &Versioned)> {
        self.entries.iter()
    }

    pub fn remove(&mut self, key: &str) {
        self.entries.remove(key);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranking_starts_with_the_owner_and_the_backup_inherits() {
        for k in ["a", "b", "gepsea.dir/x", "counter"] {
            let r = ranked(k, &[1, 2, 3, 4]);
            assert_eq!(r[0], owner_of(k, &[1, 2, 3, 4]).unwrap());
            let rest: Vec<u32> = [1, 2, 3, 4].into_iter().filter(|&n| n != r[0]).collect();
            assert_eq!(owner_of(k, &rest), Some(r[1]));
        }
    }

    #[test]
    fn versions_and_compare_and_swap() {
        let mut b = Board::new();
        assert_eq!(b.cas("k", 0, Bytes::from_static(b"a")), Ok(1));
        assert_eq!(b.cas("k", 0, Bytes::from_static(b"b")), Err(BoardError::Conflict { expected: 0, current: 1 }));
        assert_eq!(b.put("k", Bytes::from_static(b"c")), Ok(2));
        assert_eq!(b.get("k").unwrap(), &Versioned { version: 2, value: Bytes::from_static(b"c") });
        assert_eq!(b.put("k", Bytes::from(vec![0u8; MAX_VALUE + 1])), Err(BoardError::TooLarge { len: MAX_VALUE + 1 }));
        assert_eq!(b.get("k").unwrap().version, 2, "a refused write changes nothing");
    }

    #[test]
    fn interleaved_cas_increments_are_never_lost() {
        // Four clients each increment a counter 10,000 times by read + CAS, their steps
        // interleaved by a fixed pseudo-random schedule; conflicts retry.
        let mut b = Board::new();
        b.put("n", Bytes::from(0u64.to_le_bytes().to_vec())).unwrap();
        let mut left = [10_000u32; 4];
        let mut seen: [Option<(u64, u64)>; 4] = [None; 4];
        let mut x = 12345u64;
        let (mut conflicts, mut writes) = (0, 0);
        while left.iter().any(|&l| l > 0) {
            x = mix(x);
            let c = (x % 4) as usize;
            if left[c] == 0 {
                continue;
            }
            match seen[c].take() {
                None => {
                    let v = b.get("n").unwrap();
                    seen[c] = Some((v.version, u64::from_le_bytes(v.value[..8].try_into().unwrap())));
                }
                Some((ver, n)) => match b.cas("n", ver, Bytes::from((n + 1).to_le_bytes().to_vec())) {
                    Ok(_) => {
                        left[c] -= 1;
                        writes += 1;
                    }
                    Err(BoardError::Conflict { .. }) => conflicts += 1,
                    Err(e) => panic!("{e}"),
                },
            }
        }
        let v = b.get("n").unwrap();
        assert_eq!(u64::from_le_bytes(v.value[..8].try_into().unwrap()), 40_000);
        assert_eq!(writes, 40_000);
        assert!(conflicts > 0, "the schedule must actually interleave");
    }

    #[test]
    fn ownership_is_stable_when_an_agent_leaves() {
        let agents = [0, 1, 2, 3];
        let keys: Vec<String> = (0..1000).map(|i| format!("key{i}")).collect();
        let before: Vec<u32> = keys.iter().map(|k| owner_of(k, &agents).unwrap()).collect();
        for a in agents {
            let n = before.iter().filter(|&&o| o == a).count();
            assert!((150..350).contains(&n), "agent {a} owns {n} of 1000 keys");
        }
        let after: Vec<u32> = keys.iter().map(|k| owner_of(k, &[0, 1, 3]).unwrap()).collect();
        for (b, a) in before.iter().zip(&after) {
            if *b != 2 {
                assert_eq!(a, b, "keys of surviving agents do not move");
            }
        }
        assert_eq!(owner_of("x", &[]), None);
    }

    #[test]
    fn adoption_keeps_the_newer_version() {
        let mut a = Board::new();
        a.put("k", Bytes::from_static(b"old")).unwrap();
        let mut b = Board::new();
        b.put("k", Bytes::from_static(b"1")).unwrap();
        b.put("k", Bytes::from_static(b"2")).unwrap();
        a.adopt(b.drain());
        assert_eq!(a.get("k").unwrap().value, Bytes::from_static(b"2"));
    }
}
