//! Distributed data cache and directory service — the per-agent parts.
//!
//! Each agent keeps cached objects (e.g. database fragments) in a bounded in-memory
//! [`Store`] with least-recently-used eviction. The **directory** — which nodes hold
//! which object — lives in the bulletin board under [`dir_key`], so it has an owner,
//! versions and compare-and-swap like every other shared value; holders add and remove
//! themselves with a CAS loop over [`with_holder`]. A read is location-transparent:
//! local hit, else look the name up in the directory and fetch from a live holder.

use std::collections::HashMap;

use bytes::Bytes;

/// The board key of `name`'s directory entry.
pub fn dir_key(name: &str) -> String {
    format!("gepsea.dir/{name}")
}

/// Decodes a directory entry (sorted node ids).
pub fn holders(entry: Option<&[u8]>) -> Vec<u32> {
    entry.and_then(|b| postcard::from_bytes::<Vec<u32>>(b).ok()).unwrap_or_default()
}

/// The entry with `node` added (`present`) or removed.
pub fn with_holder(entry: Option<&[u8]>, node: u32, present: bool) -> Vec<u8> {
    let mut h = holders(entry);
    h.retain(|&n| n != node);
    if present {
        h.push(node);
        h.sort_unstable();
    }
    postcard::to_stdvec(&h).expect("encoding into a Vec")
}

/// One agent's cached objects.
#[derive(Debug)]
pub struct Store {
    items: HashMap<String, (Bytes, u64)>,
    bytes: usize,
    capacity: usize,
    clock: u64,
}

impl Store {
    /// A store of at most `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        Store { items: HashMap::new(), bytes: 0, capacity, clock: 0 }
    }

    pub fn get(&mut self, name: &str) -> Option<Bytes> {
        self.clock += 1;
        let clock = self.clock;
        self.items.get_mut(name).map(|(b, used)| {
            *used = clock;
            b.clone()
        })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.items.contains_key(name)
    }

    /// Stores `data` under `name`; returns the names evicted to make room (their
    /// directory entries must drop this node). An object larger than the whole store
    /// is refused with `Err`.
    pub fn insert(&mut self, name: &str, data: Bytes) -> Result<Vec<String>, usize> {
        if data.len() > self.capacity {
            return Err(self.capacity);
        }
        self.remove(name);
        let mut evicted = Vec::new();
        while self.bytes + data.len() > self.capacity {
            let victim =
                self.items.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone()).expect("non-empty when over capacity");
            self.remove(&victim);
            evicted.push(victim);
        }
        self.clock += 1;
        self.bytes += data.len();
        self.items.insert(name.to_string(), (data, self.clock));
        Ok(evicted)
    }

    pub fn remove(&mut self, name: &str) -> bool {
        match self.items.remove(name) {
            Some((b, _)) => {
                self.bytes -= b.len();
                true
            }
            None => false,
        }
    }

    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.items.keys().cloned().collect();
        v.sort();
        v
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_recently_used_is_evicted_first() {
        let mut s = Store::new(10);
        s.insert("a", Bytes::from_static(b"aaaa")).unwrap();
        s.insert("b", Bytes::from_static(b"bbbb")).unwrap();
        s.get("a");
        assert_eq!(s.insert("c", Bytes::from_static(b"cccc")).unwrap(), vec!["b".to_string()]);
        assert_eq!(s.names(), vec!["a", "c"]);
        assert_eq!(s.bytes(), 8);
        assert_eq!(s.insert("big", Bytes::from(vec![0; 11])), Err(10));
        s.insert("a", Bytes::from_static(b"x")).unwrap();
        assert_eq!(s.bytes(), 5);
    }

    #[test]
    fn directory_entries_add_and_remove_holders() {
        let e = with_holder(None, 3, true);
        let e = with_holder(Some(&e), 1, true);
        let e = with_holder(Some(&e), 3, true);
        assert_eq!(holders(Some(&e)), vec![1, 3]);
        let e = with_holder(Some(&e), 1, false);
        assert_eq!(holders(Some(&e)), vec![3]);
        assert_eq!(holders(Some(b"\xff\xff")), Vec::<u32>::new());
    }
}
