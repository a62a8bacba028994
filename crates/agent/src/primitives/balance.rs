//! Dynamic load balancing: the scheduler's state machine (sans-IO).
//!
//! Work is a queue of opaque tasks. Idle workers announce themselves with a *take*;
//! the scheduler assigns tasks by availability, first come first served, so faster
//! nodes naturally get more work. Tasks held by a process or node that dies go back to
//! the front of the queue.
//!
//! Failover: the scheduler's state is not replicated; instead every agent remembers
//! the tasks its clients submitted (until they finish), the tasks its clients hold and
//! the takes they are waiting on, and sends all three to a newly elected scheduler
//! ([`Scheduler::rejoin`]). The new scheduler assigns nothing until every live agent
//! has rejoined, so a held task is never handed out twice.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};


use crate::core::Client;
use crate::wire::Task;

/// A task handed to a waiting take: tell `client` (through its agent, request `op`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub op: u64,
    pub client: Client,
    pub task: Task,
}

#[derive(Default, Debug)]
pub struct Scheduler {
    /// Payloads of every unfinished task whose submitter told us about it.
    payloads: HashMap<u64, Vec<u8>>,
    queue: VecDeque<u64>,
    submitter: HashMap<u64, u32>,
    assigned: HashMap<u64, Client>,
    /// Tasks to requeue whose payload we have not seen yet (a rejoining worker held
    /// them; the submitter's rejoin will bring the payload).
    orphans: HashSet<u64>,
    waiting: VecDeque<(u64, Client)>,
    /// Agents whose rejoin is still awaited (empty: assigning).
    awaiting: BTreeSet<u32>,
    pub assigned_total: u64,
}

impl Scheduler {
    pub fn new() -> Self {
        Self::default()
    }

    /// A fresh scheduler taking over: assign nothing until `agents` have rejoined.
    pub fn taking_over(agents: impl IntoIterator<Item = u32>) -> Self {
        Scheduler { awaiting: agents.into_iter().collect(), ..Self::default() }
    }

    fn learn(&mut self, task: Task, submitter: u32) {
        let id = task.id;
        self.submitter.insert(id, submitter);
        if self.payloads.insert(id, task.payload).is_none() && !self.assigned.contains_key(&id) {
            self.orphans.remove(&id);
            self.queue.push_back(id);
        }
    }

    pub fn submit(&mut self, task: Task, submitter: u32) -> Vec<Assignment> {
        self.learn(task, submitter);
        self.assign()
    }

    pub fn take(&mut self, op: u64, client: Client) -> Vec<Assignment> {
        self.waiting.push_back((op, client));
        self.assign()
    }

    /// Withdraws a waiting take; true if it was still waiting.
    pub fn cancel_take(&mut self, op: u64, node: u32) -> bool {
        let before = self.waiting.len();
        self.waiting.retain(|(o, c)| !(*o == op && c.node == node));
        before != self.waiting.len()
    }

    /// A task finished; returns its submitter's node (to tell it).
    pub fn done(&mut self, task: u64) -> Option<u32> {
        self.assigned.remove(&task);
        self.queue.retain(|t| *t != task);
        self.payloads.remove(&task);
        self.orphans.remove(&task);
        self.submitter.remove(&task)
    }

    fn requeue_front(&mut self, id: u64) {
        if self.payloads.contains_key(&id) {
            self.queue.push_front(id);
        } else {
            self.orphans.insert(id);
        }
    }

    /// A task came back unstarted (its taker had gone): first in line again.
    pub fn giveback(&mut self, task: u64) -> Vec<Assignment> {
        if self.assigned.remove(&task).is_some() {
            self.requeue_front(task);
        }
        self.assign()
    }

    /// Requeues the tasks of every dead holder and drops dead waiters.
    pub fn forget(&mut self, dead: impl Fn(&Client) -> bool) -> Vec<Assignment> {
        let mut lost: Vec<u64> = self.assigned.iter().filter(|(_, c)| dead(c)).map(|(id, _)| *id).collect();
        lost.sort_unstable_by(|a, b| b.cmp(a));
        for id in lost {
            self.assigned.remove(&id);
            self.requeue_front(id);
        }
        self.waiting.retain(|(_, c)| !dead(c));
        self.assign()
    }

    pub fn node_died(&mut self, node: u32) -> Vec<Assignment> {
        self.awaiting.remove(&node);
        self.forget(|c| c.node == node)
    }

    /// One agent's state after a scheduler change.
    pub fn rejoin(&mut self, from: u32, submitted: Vec<Task>, holding: Vec<(u64, Client)>, takes: Vec<(u64, Client)>) -> Vec<Assignment> {
        for (id, c) in holding {
            self.queue.retain(|t| *t != id);
            self.orphans.remove(&id);
            self.assigned.insert(id, c);
        }
        for t in submitted {
            self.learn(t, from);
        }
        for tk in takes {
            if !self.waiting.contains(&tk) {
                self.waiting.push_back(tk);
            }
        }
        self.awaiting.remove(&from);
        self.assign()
    }

    /// Stop waiting for rejoins (the ones missing are presumed dead).
    pub fn settle(&mut self) -> Vec<Assignment> {
        self.awaiting.clear();
        self.assign()
    }

    pub fn settling(&self) -> bool {
        !self.awaiting.is_empty()
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    pub fn running(&self) -> usize {
        self.assigned.len()
    }

    pub fn idle_takers(&self) -> usize {
        self.waiting.len()
    }

    fn assign(&mut self) -> Vec<Assignment> {
        let mut out = Vec::new();
        if self.settling() {
            return out;
        }
        while !self.queue.is_empty() && !self.waiting.is_empty() {
            let id = self.queue.pop_front().unwrap();
            let Some(payload) = self.payloads.get(&id) else { continue };
            let (op, client) = self.waiting.pop_front().unwrap();
            self.assigned.insert(id, client);
            self.assigned_total += 1;
            out.push(Assignment { op, client, task: Task { id, payload: payload.clone() } });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: u64) -> Task {
        Task { id, payload: vec![id as u8] }
    }

    #[test]
    fn assigns_by_availability_and_requeues_the_dead() {
        let mut s = Scheduler::new();
        let (a, b) = (Client::new(1, 1), Client::new(2, 1));
        assert!(s.submit(task(1), 1).is_empty());
        s.submit(task(2), 1);
        assert_eq!(s.take(10, a), vec![Assignment { op: 10, client: a, task: task(1) }]);
        assert_eq!(s.take(11, b)[0].task, task(2));
        assert!(s.take(12, b).is_empty());
        assert_eq!(s.node_died(1), vec![Assignment { op: 12, client: b, task: task(1) }]);
        assert_eq!(s.done(1), Some(1));
        assert_eq!(s.running(), 1);
    }

    #[test]
    fn new_scheduler_waits_for_every_rejoin_and_never_reassigns_held_tasks() {
        let (a, b) = (Client::new(2, 1), Client::new(3, 1));
        let mut s = Scheduler::taking_over([2, 3]);
        assert!(s.rejoin(2, vec![task(5), task(6)], vec![], vec![(1, a)]).is_empty());
        let out = s.rejoin(3, vec![], vec![(5, b)], vec![]);
        assert_eq!(out, vec![Assignment { op: 1, client: a, task: task(6) }]);
        assert_eq!(s.running(), 2);
        assert_eq!(s.done(5), Some(2));
    }

    #[test]
    fn a_held_task_whose_payload_is_unknown_waits_for_its_submitter() {
        let (a, b) = (Client::new(2, 1), Client::new(3, 1));
        let mut s = Scheduler::taking_over([3]);
        s.rejoin(3, vec![], vec![(9, b)], vec![(4, b)]);
        // The holder dies before the submitter rejoined: nothing to hand out yet.
        assert!(s.node_died(3).is_empty());
        assert!(s.take(5, a).is_empty());
        assert_eq!(s.submit(task(9), 2), vec![Assignment { op: 5, client: a, task: task(9) }]);
    }
}
