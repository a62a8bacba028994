//! Distributed lock manager: the state one owner agent keeps for the locks it owns.
//!
//! Each lock is owned by one agent (chosen like bulletin-board keys); requests from any
//! node travel to that owner, which runs this state machine and answers with grants.
//!
//! - Modes: **exclusive**; **shared** (any number of shared holders); **group** — shared
//!   among the members of one group, exclusive against everyone else (GePSeA's
//!   group-wise shared locks, e.g. all workers searching one fragment).
//! - **FIFO**: requests are granted strictly in arrival order; a compatible request
//!   never overtakes an earlier incompatible one, so nobody starves. Consecutive
//!   compatible requests at the head of the queue are granted together.
//! - **Failure**: when a process or a whole node dies, its holds and its waiting
//!   requests are removed and whoever is next in line is granted.

use std::collections::{HashMap, VecDeque};

use super::Client;

/// How a lock is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    Exclusive,
    Shared,
    /// Shared among the members of group `g` only.
    Group(u64),
}

/// A lock's name, its holders and its waiters, as `snapshot` reports them.
pub type LockSnapshot = (String, Vec<(Client, Mode)>, Vec<(Client, Mode)>);

impl Mode {
    fn compatible(self, other: Mode) -> bool {
        match (self, other) {
            (Mode::Shared, Mode::Shared) => true,
            (Mode::Group(a), Mode::Group(b)) => a == b,
            _ => false,
        }
    }
}

/// A lock was granted to a client (the owner sends it the news).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub lock: String,
    pub client: Client,
    pub mode: Mode,
}

/// Why a lock operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    #[error("{client:?} already holds or waits for lock {lock:?}")]
    AlreadyRequested { lock: String, client: Client },
    #[error("{client:?} does not hold lock {lock:?}")]
    NotHeld { lock: String, client: Client },
}

#[derive(Default, Debug)]
struct LockState {
    holders: Vec<(Client, Mode)>,
    waiting: VecDeque<(Client, Mode)>,
}

impl LockState {
    fn grantable(&self, mode: Mode) -> bool {
        self.holders.iter().all(|(_, m)| m.compatible(mode))
    }

    /// Grants from the head of the queue while compatible.
    fn promote(&mut self, lock: &str, out: &mut Vec<Grant>) {
        while let Some(&(c, m)) = self.waiting.front() {
            if !self.grantable(m) {
                break;
            }
            self.waiting.pop_front();
            self.holders.push((c, m));
            out.push(Grant { lock: lock.to_string(), client: c, mode: m });
        }
    }
}

/// The locks one agent owns.
#[derive(Default, Debug)]
pub struct LockTable {
    locks: HashMap<String, LockState>,
}

impl LockTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// A client asks for `lock` in `mode`. Returns the grants this caused (the request
    /// itself if it could be granted at once, else nothing: it waits in line).
    pub fn acquire(&mut self, lock: &str, client: Client, mode: Mode) -> Result<Vec<Grant>, LockError> {
        let st = self.locks.entry(lock.to_string()).or_default();
        if st.holders.iter().any(|(c, _)| *c == client) || st.waiting.iter().any(|(c, _)| *c == client) {
            return Err(LockError::AlreadyRequested { lock: lock.to_string(), client });
        }
        st.waiting.push_back((client, mode));
        let mut out = Vec::new();
        st.promote(lock, &mut out);
        Ok(out)
    }

    /// A holder releases `lock`; returns the grants to the next in line.
    pub fn release(&mut self, lock: &str, client: Client) -> Result<Vec<Grant>, LockError> {
        let not_held = || LockError::NotHeld { lock: lock.to_string(), client };
        let st = self.locks.get_mut(lock).ok_or_else(not_held)?;
        let i = st.holders.iter().position(|(c, _)| *c == client).ok_or_else(not_held)?;
        st.holders.remove(i);
        let mut out = Vec::new();
        st.promote(lock, &mut out);
        self.gc(lock);
        Ok(out)
    }

    /// A waiting request is withdrawn (timeout or cancel). Returns grants it unblocked.
    pub fn cancel(&mut self, lock: &str, client: Client) -> Vec<Grant> {
        let mut out = Vec::new();
        if let Some(st) = self.locks.get_mut(lock) {
            st.waiting.retain(|(c, _)| *c != client);
            st.promote(lock, &mut out);
        }
        self.gc(lock);
        out
    }

    /// Every process matching `dead` has died: drop its holds and requests everywhere.
    pub fn forget(&mut self, dead: impl Fn(&Client) -> bool) -> Vec<Grant> {
        let mut out = Vec::new();
        let names: Vec<String> = self.locks.keys().cloned().collect();
        for name in names {
            let st = self.locks.get_mut(&name).unwrap();
            st.holders.retain(|(c, _)| !dead(c));
            st.waiting.retain(|(c, _)| !dead(c));
            st.promote(&name, &mut out);
            self.gc(&name);
        }
        out
    }

    /// A process died.
    pub fn process_died(&mut self, client: Client) -> Vec<Grant> {
        self.forget(|c| *c == client)
    }

    /// A node (its agent and all its processes) died.
    pub fn node_died(&mut self, node: u32) -> Vec<Grant> {
        self.forget(|c| c.node == node)
    }

    /// A lock's previous owner died while `client` held it: the holder re-registers
    /// with the new owner (see the agent's failover) and holds it again at once.
    pub fn reclaim(&mut self, lock: &str, client: Client, mode: Mode) {
        let st = self.locks.entry(lock.to_string()).or_default();
        if !st.holders.iter().any(|(c, _)| *c == client) {
            st.waiting.retain(|(c, _)| *c != client);
            st.holders.push((client, mode));
        }
    }

    /// Removes and returns every lock whose name `moved` selects (its owner changed),
    /// holders and waiters in order, for the new owner's [`LockTable::adopt`].
    pub fn take(&mut self, moved: impl Fn(&str) -> bool) -> Vec<LockSnapshot> {
        let names: Vec<String> = self.locks.keys().filter(|k| moved(k)).cloned().collect();
        let mut v: Vec<LockSnapshot> =
            names.into_iter().filter_map(|k| self.locks.remove(&k).map(|s| (k, s.holders, s.waiting.into_iter().collect()))).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// A lock handed over by its previous owner: its holders hold it here too, its
    /// waiters queue here in their order, ahead of anyone who asked this table since
    /// (nobody should have: new owners serve no lock request before the hand-over).
    /// Returns the grants this makes possible.
    pub fn adopt(&mut self, lock: &str, holders: Vec<(Client, Mode)>, waiting: Vec<(Client, Mode)>) -> Vec<Grant> {
        let st = self.locks.entry(lock.to_string()).or_default();
        for h in holders {
            if !st.holders.iter().any(|(c, _)| *c == h.0) {
                st.waiting.retain(|(c, _)| *c != h.0);
                st.holders.push(h);
            }
        }
        for (i, w) in waiting.into_iter().enumerate() {
            if !st.holders.iter().any(|(c, _)| *c == w.0) && !st.waiting.iter().any(|(c, _)| *c == w.0) {
                st.waiting.insert(i.min(st.waiting.len()), w);
            }
        }
        let mut out = Vec::new();
        st.promote(lock, &mut out);
        self.gc(lock);
        out
    }

    /// Every lock this table knows, with its holders and waiters (for status reports).
    pub fn snapshot(&self) -> Vec<LockSnapshot> {
        let mut v: Vec<_> = self.locks.iter().map(|(k, s)| (k.clone(), s.holders.clone(), s.waiting.iter().copied().collect())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Current holders of `lock`.
    pub fn holders(&self, lock: &str) -> Vec<(Client, Mode)> {
        self.locks.get(lock).map(|s| s.holders.clone()).unwrap_or_default()
    }

    /// Whether any request waits for `lock`.
    pub fn has_waiters(&self, lock: &str) -> bool {
        self.locks.get(lock).is_some_and(|s| !s.waiting.is_empty())
    }

    /// Requests waiting for `lock`, in order.
    pub fn waiting(&self, lock: &str) -> Vec<(Client, Mode)> {
        self.locks.get(lock).map(|s| s.waiting.iter().copied().collect()).unwrap_or_default()
    }

    fn gc(&mut self, lock: &str) {
        if self.locks.get(lock).is_some_and(|s| s.holders.is_empty() && s.waiting.is_empty()) {
            self.locks.remove(lock);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handed_over_lock_keeps_its_holders_and_queue_order() {
        let mut old = LockTable::new();
        let (a, b, c) = (Client::new(1, 1), Client::new(2, 1), Client::new(3, 1));
        assert_eq!(old.acquire("L", a, Mode::Exclusive).unwrap().len(), 1);
        assert_eq!(old.acquire("L", b, Mode::Shared).unwrap(), vec![]);
        assert_eq!(old.acquire("L", c, Mode::Shared).unwrap(), vec![]);
        assert_eq!(old.acquire("M", b, Mode::Exclusive).unwrap().len(), 1);
        let moved = old.take(|k| k == "L");
        assert_eq!(old.snapshot().len(), 1, "M stays");
        let mut new = LockTable::new();
        for (name, holders, waiting) in moved {
            assert_eq!(new.adopt(&name, holders, waiting), vec![]);
        }
        assert_eq!(new.holders("L"), vec![(a, Mode::Exclusive)]);
        assert_eq!(new.waiting("L"), vec![(b, Mode::Shared), (c, Mode::Shared)]);
        let g = new.release("L", a).unwrap();
        assert_eq!(g.iter().map(|g| g.client).collect::<Vec<_>>(), vec![b, c]);
    }

    #[test]
    fn reclaimed_holds_block_later_requests() {
        let mut t = LockTable::new();
        let (a, b) = (Client::new(1, 1), Client::new(2, 1));
        t.reclaim("L", a, Mode::Exclusive);
        assert_eq!(t.acquire("L", b, Mode::Exclusive).unwrap(), vec![]);
        t.reclaim("L", a, Mode::Exclusive);
        assert_eq!(t.holders("L"), vec![(a, Mode::Exclusive)]);
        assert_eq!(t.release("L", a).unwrap(), vec![Grant { lock: "L".into(), client: b, mode: Mode::Exclusive }]);
    }
    use proptest::prelude::*;

    const A: Client = Client::new(1, 1);
    const B: Client = Client::new(1, 2);
    const C: Client = Client::new(2, 1);
    const D: Client = Client::new(3, 1);

    fn who(g: &[Grant]) -> Vec<Client> {
        g.iter().map(|g| g.client).collect()
    }

    #[test]
    fn exclusive_is_fifo_and_shared_batches_are_granted_together() {
        let mut t = LockTable::new();
        assert_eq!(who(&t.acquire("x", A, Mode::Exclusive).unwrap()), vec![A]);
        assert!(t.acquire("x", B, Mode::Shared).unwrap().is_empty());
        assert!(t.acquire("x", C, Mode::Shared).unwrap().is_empty());
        assert!(t.acquire("x", D, Mode::Exclusive).unwrap().is_empty());
        // A leaves: the two shared requests at the head go together, D keeps waiting.
        assert_eq!(who(&t.release("x", A).unwrap()), vec![B, C]);
        assert!(t.release("x", B).unwrap().is_empty());
        assert_eq!(who(&t.release("x", C).unwrap()), vec![D]);
        assert_eq!(t.release("x", A), Err(LockError::NotHeld { lock: "x".into(), client: A }));
    }

    #[test]
    fn a_shared_request_never_overtakes_a_waiting_exclusive_one() {
        let mut t = LockTable::new();
        t.acquire("x", A, Mode::Shared).unwrap();
        t.acquire("x", B, Mode::Exclusive).unwrap();
        assert!(t.acquire("x", C, Mode::Shared).unwrap().is_empty(), "C must queue behind B");
        assert_eq!(who(&t.release("x", A).unwrap()), vec![B]);
        assert_eq!(who(&t.release("x", B).unwrap()), vec![C]);
    }

    #[test]
    fn group_locks_are_shared_within_a_group_only() {
        let mut t = LockTable::new();
        assert_eq!(who(&t.acquire("frag7", A, Mode::Group(7)).unwrap()), vec![A]);
        assert_eq!(who(&t.acquire("frag7", B, Mode::Group(7)).unwrap()), vec![B]);
        assert!(t.acquire("frag7", C, Mode::Group(8)).unwrap().is_empty());
        assert!(t.acquire("frag7", D, Mode::Shared).unwrap().is_empty());
        t.release("frag7", A).unwrap();
        assert_eq!(who(&t.release("frag7", B).unwrap()), vec![C]);
        assert!(t.acquire("frag7", A, Mode::Group(7)).is_ok());
        assert_eq!(t.acquire("frag7", A, Mode::Group(7)), Err(LockError::AlreadyRequested { lock: "frag7".into(), client: A }));
    }

    #[test]
    fn a_dead_nodes_holds_and_requests_vanish() {
        let mut t = LockTable::new();
        t.acquire("x", A, Mode::Exclusive).unwrap();
        t.acquire("x", B, Mode::Exclusive).unwrap();
        t.acquire("x", C, Mode::Exclusive).unwrap();
        t.acquire("y", B, Mode::Exclusive).unwrap();
        // Node 1 (A and B) dies: C gets x, y becomes free.
        assert_eq!(who(&t.node_died(1)), vec![C]);
        assert!(t.holders("y").is_empty());
        assert_eq!(who(&t.process_died(C)), Vec::<Client>::new());
        assert!(t.holders("x").is_empty() && t.waiting("x").is_empty());
    }

    proptest! {
        /// Under any sequence of requests, releases, cancels and deaths: no two
        /// incompatible holders ever coexist, and grants follow request order.
        #[test]
        fn mutual_exclusion_and_fifo_hold(ops in proptest::collection::vec((0u8..4, 0u32..5, 0u8..3), 1..200)) {
            let mut t = LockTable::new();
            let mut order: Vec<Client> = Vec::new(); // request order of current waiters+holders
            for (op, c, m) in ops {
                let client = Client::new(c % 3, c);
                let mode = [Mode::Exclusive, Mode::Shared, Mode::Group(1)][m as usize];
                let grants = match op {
                    0 => match t.acquire("l", client, mode) { Ok(g) => { order.push(client); g } Err(_) => vec![] },
                    1 => { let g = t.release("l", client).unwrap_or_default(); if t.holders("l").iter().all(|(h, _)| *h != client) && !t.waiting("l").iter().any(|(w, _)| *w == client) { order.retain(|x| *x != client); } g }
                    2 => { let g = t.cancel("l", client); if !t.holders("l").iter().any(|(h, _)| *h == client) { order.retain(|x| *x != client); } g }
                    _ => { let g = t.node_died(client.node); order.retain(|x| x.node != client.node); g }
                };
                let h = t.holders("l");
                for (i, (_, a)) in h.iter().enumerate() {
                    for (_, b) in &h[i + 1..] {
                        prop_assert!(a.compatible(*b), "incompatible holders {:?}", h);
                    }
                }
                // Everyone granted was requested before everyone still waiting.
                let waiting: Vec<Client> = t.waiting("l").iter().map(|(c, _)| *c).collect();
                for g in &grants {
                    let gi = order.iter().position(|x| *x == g.client).unwrap();
                    for w in &waiting {
                        let wi = order.iter().position(|x| x == w).unwrap();
                        prop_assert!(gi < wi, "{:?} granted before earlier waiter {:?}", g.client, w);
                    }
                }
            }
        }
    }
}
