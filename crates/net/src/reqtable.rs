//! The table of a port's requests: a slab indexed by the request id.
//!
//! Every message passes through it at least twice (created, finished, collected), so
//! it is on the path whose length sets the small-message latency. Hash maps cost a hash
//! and a probe per operation, and the old design kept running and finished requests in
//! two of them (an insert and a remove to finish one); here a request is a slot that
//! changes state in place, found by indexing.
//!
//! An id is `generation << 32 | slot`. A slot's generation advances when its finished
//! request is collected, so a stale or forged id (ids also come back from peers, in
//! rendezvous and RMA frames) never reaches the slot's next occupant. Generations start
//! at 1, so 0 is never an id, and ids fit in 63 bits.

/// Identifies a request issued on a port.
pub type ReqId = u64;

enum State<R, D> {
    Free,
    /// Allocated, between two running states (the caller took the request out to
    /// change it).
    Reserved,
    Running(R),
    Done(D),
}

struct Slot<R, D> {
    generation: u32,
    state: State<R, D>,
}

/// Requests (`R`) while they run, their results (`D`) once they finish.
pub struct ReqTable<R, D> {
    slots: Vec<Slot<R, D>>,
    free: Vec<u32>,
}

impl<R, D> Default for ReqTable<R, D> {
    fn default() -> Self {
        ReqTable { slots: Vec::new(), free: Vec::new() }
    }
}

impl<R, D> ReqTable<R, D> {
    fn slot(&self, id: ReqId) -> Option<&Slot<R, D>> {
        let s = self.slots.get((id & 0xffff_ffff) as usize)?;
        (s.generation as u64 == id >> 32 && !matches!(s.state, State::Free)).then_some(s)
    }

    fn slot_mut(&mut self, id: ReqId) -> Option<&mut Slot<R, D>> {
        let s = self.slots.get_mut((id & 0xffff_ffff) as usize)?;
        (s.generation as u64 == id >> 32 && !matches!(s.state, State::Free)).then_some(s)
    }

    /// A new running request.
    pub fn alloc(&mut self, req: R) -> ReqId {
        let index = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize].state = State::Running(req);
                i
            }
            None => {
                let i = u32::try_from(self.slots.len()).expect("more than 2^32 requests outstanding");
                self.slots.push(Slot { generation: 1, state: State::Running(req) });
                i
            }
        };
        ((self.slots[index as usize].generation as u64) << 32) | index as u64
    }

    /// The running request `id`.
    pub fn get(&self, id: ReqId) -> Option<&R> {
        match &self.slot(id)?.state {
            State::Running(r) => Some(r),
            _ => None,
        }
    }

    pub fn get_mut(&mut self, id: ReqId) -> Option<&mut R> {
        match &mut self.slot_mut(id)?.state {
            State::Running(r) => Some(r),
            _ => None,
        }
    }

    /// Takes the running request out, keeping its id allocated (put a new state back
    /// with [`ReqTable::insert`] or finish it).
    pub fn remove(&mut self, id: ReqId) -> Option<R> {
        let s = self.slot_mut(id)?;
        match std::mem::replace(&mut s.state, State::Reserved) {
            State::Running(r) => Some(r),
            other => {
                s.state = other;
                None
            }
        }
    }

    /// Puts a running state back into an allocated id. Ids not allocated are ignored.
    pub fn insert(&mut self, id: ReqId, req: R) {
        if let Some(s) = self.slot_mut(id) {
            debug_assert!(!matches!(s.state, State::Done(_)), "request {id} ran again after it finished");
            s.state = State::Running(req);
        }
    }

    /// Records the result of `id` (running or reserved); it waits to be collected.
    pub fn finish(&mut self, id: ReqId, result: D) {
        if let Some(s) = self.slot_mut(id) {
            s.state = State::Done(result);
        }
    }

    /// Finishes the running request `id` with the result `f` makes of it, in place.
    /// Returns whether `id` was running.
    pub fn finish_with(&mut self, id: ReqId, f: impl FnOnce(R) -> D) -> bool {
        let Some(s) = self.slot_mut(id) else { return false };
        match std::mem::replace(&mut s.state, State::Reserved) {
            State::Running(r) => {
                s.state = State::Done(f(r));
                true
            }
            other => {
                s.state = other;
                false
            }
        }
    }

    /// The result of `id`, if finished, without collecting it.
    pub fn peek_done(&self, id: ReqId) -> Option<&D> {
        match &self.slot(id)?.state {
            State::Done(d) => Some(d),
            _ => None,
        }
    }

    /// Collects the result of a finished request; its id is retired.
    pub fn take_done(&mut self, id: ReqId) -> Option<D> {
        let index = (id & 0xffff_ffff) as u32;
        let s = self.slot_mut(id)?;
        if !matches!(s.state, State::Done(_)) {
            return None;
        }
        let State::Done(d) = std::mem::replace(&mut s.state, State::Free) else { unreachable!() };
        // Generations wrap at 2^31 so that ids keep bit 63 free (the port marks
        // presettled sends with it) and never reach 0.
        s.generation = if s.generation >= (1 << 31) - 1 { 1 } else { s.generation + 1 };
        self.free.push(index);
        Some(d)
    }

    /// Whether `id` is running, reserved, or finished and not yet collected.
    pub fn is_known(&self, id: ReqId) -> bool {
        self.slot(id).is_some()
    }

    /// Whether `id` has finished and waits to be collected.
    pub fn is_done(&self, id: ReqId) -> bool {
        self.peek_done(id).is_some()
    }

    /// Running requests with their ids.
    pub fn running(&self) -> impl Iterator<Item = (ReqId, &R)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| match &s.state {
            State::Running(r) => Some((((s.generation as u64) << 32) | i as u64, r)),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_and_stale_ids() {
        let mut t: ReqTable<&str, u32> = ReqTable::default();
        let a = t.alloc("a");
        let b = t.alloc("b");
        assert_ne!(a, b);
        assert!(a != 0 && b != 0 && a >> 63 == 0);
        assert_eq!(t.get(a), Some(&"a"));
        assert_eq!(t.remove(a), Some("a"));
        assert!(t.is_known(a) && t.get(a).is_none(), "reserved between states");
        t.insert(a, "a2");
        assert_eq!(t.running().map(|(id, r)| (id, *r)).collect::<Vec<_>>(), vec![(a, "a2"), (b, "b")]);
        assert!(!t.finish_with(12345, |_| 0), "unknown id");
        assert!(t.finish_with(a, |r| r.len() as u32 + 5));
        assert!(!t.finish_with(a, |_| 0), "finished once");
        assert!(t.is_done(a) && t.get(a).is_none());
        assert_eq!(t.peek_done(a), Some(&7));
        assert_eq!(t.take_done(a), Some(7));
        assert!(!t.is_known(a), "collected once");
        assert_eq!(t.take_done(a), None);
        // The slot is reused under a new generation: the old id does not reach it.
        let c = t.alloc("c");
        assert_eq!(c & 0xffff_ffff, a & 0xffff_ffff);
        assert_ne!(c, a);
        assert!(t.get(a).is_none() && t.remove(a).is_none() && t.take_done(a).is_none());
        t.finish(a, 9);
        t.insert(a, "forged");
        assert_eq!(t.get(c), Some(&"c"), "a stale id changes nothing");
        // Ids never issued are unknown.
        assert!(!t.is_known(0) && !t.is_known(12345 << 32 | 1) && !t.is_known(1 << 32 | 99));
        assert_eq!(t.take_done(b), None, "still running");
    }

    #[test]
    fn many_requests_reuse_few_slots() {
        let mut t: ReqTable<u64, u64> = ReqTable::default();
        let mut seen = std::collections::HashSet::new();
        for i in 0..10_000u64 {
            let x = t.alloc(i);
            let y = t.alloc(i + 1);
            assert!(seen.insert(x) && seen.insert(y), "ids are not reused");
            t.finish(x, i);
            t.finish(y, i);
            assert_eq!(t.take_done(y), Some(i));
            assert_eq!(t.take_done(x), Some(i));
        }
        assert_eq!(t.slots.len(), 2);
    }
}
