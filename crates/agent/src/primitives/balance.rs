//! Dynamic load balancing: the scheduler's state machine (sans-IO).
//!
//! Work is a queue of opaque tasks. Idle workers announce themselves with a *take*;
//! the scheduler assigns tasks by availability, first come first served, so faster
//! nodes naturally get more work. Tasks held by a process or node that dies go back to
//! the front of the queue.
//!
//! Urgent tasks (they finish work already under way, e.g. the searches a merge waits
//! for, so that results are consolidated while the rest is searched) go before all
//! others, in their order — except in the end-game: once no more than
//! [`ENDGAME_TASKS_PER_WORKER`] ordinary tasks per worker are queued, those go first.
//! They are what can still give rise to urgent work (a BLAST batch's last fragments
//! reveal the queries its merge must search again whole), and the urgent tasks held back
//! meanwhile keep the workers busy until it is revealed. Urgent first to the very end
//! left every worker whose fragment search ended early waiting for the fallbacks of the
//! last batches (0.5–1 s each at 36 nodes, 2 % of the workers' time).
//!
//! Data affinity (mpiBLAST's fragment affinity, across nodes): a task may name the data
//! object it reads. A taker gets, in this order, the first queued task whose object its
//! node already holds, else the first whose object no node holds (or that names none),
//! else the first task. So a node keeps working on the data it has, and data that some
//! other node holds is left for that node while there is anything else to do. The same
//! holds the other way round: a task that arrives while several takers wait goes to
//! the first of them whose node holds its data (else to the one that waited longest). What
//! each node holds comes from the global process state ([`Scheduler::set_holdings`]).
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

/// Placement: which agent takes on a unit of the agents' own work (e.g. merging and
/// writing one batch of results). The scheduler places each key on the live agent with
/// the least outstanding weight — preferring the asking agent on a tie, since the data
/// that prompted the question is already there — and remembers it until it is
/// released, so that asking again gives the same agent. This is the paper's dynamic
/// division of merging and writing among the accelerators by availability.
///
/// A placement lives only in the scheduler: after a scheduler change the new one starts
/// from no load. Callers that need one answer per key for the whole job record the
/// first answer themselves (the BLAST plug-in does, on the bulletin board).
#[derive(Default, Debug)]
pub struct Placement {
    placed: HashMap<String, (u32, u64)>,
    load: HashMap<u32, u64>,
}

/// Keys placed and not yet released, at most (a client that never releases cannot grow
/// the scheduler without bound).
pub const MAX_PLACED: usize = 1 << 20;

/// A placement that cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    #[error("no live agent to place {0:?} on")]
    NoLiveAgent(String),
    #[error("{MAX_PLACED} keys are placed and not released; release finished work")]
    TooMany,
}

impl Placement {
    /// The agent of `live` that takes `key`.
    pub fn place(&mut self, key: &str, weight: u64, live: &[u32], asking: u32) -> Result<u32, PlaceError> {
        if let Some(&(n, w)) = self.placed.get(key) {
            if live.contains(&n) {
                return Ok(n);
            }
            self.release_load(n, w);
            self.placed.remove(key);
        }
        if self.placed.len() >= MAX_PLACED {
            return Err(PlaceError::TooMany);
        }
        let load = |n: &u32| self.load.get(n).copied().unwrap_or(0);
        let node =
            live.iter().copied().min_by_key(|n| (load(n), *n != asking, *n)).ok_or_else(|| PlaceError::NoLiveAgent(key.to_string()))?;
        self.placed.insert(key.to_string(), (node, weight));
        let l = self.load.entry(node).or_default();
        *l = l.saturating_add(weight);
        Ok(node)
    }

    /// `key`'s work is done: its weight no longer counts against its agent.
    pub fn release(&mut self, key: &str) {
        if let Some((n, w)) = self.placed.remove(key) {
            self.release_load(n, w);
        }
    }

    fn release_load(&mut self, node: u32, weight: u64) {
        if let Some(l) = self.load.get_mut(&node) {
            *l = l.saturating_sub(weight);
        }
    }

    /// Outstanding weight placed on `node`.
    pub fn load(&self, node: u32) -> u64 {
        self.load.get(&node).copied().unwrap_or(0)
    }

    /// `node` died: what it held is placed again when asked for.
    pub fn node_died(&mut self, node: u32) {
        self.load.remove(&node);
        self.placed.retain(|_, (n, _)| *n != node);
    }
}

/// The end-game (see the module docs) begins when no more ordinary tasks than this
/// per worker are queued: about two rounds of tasks, the time for the ones handed out
/// first to reveal urgent work while the urgent backlog outlasts the last round.
pub const ENDGAME_TASKS_PER_WORKER: usize = 2;

#[derive(Default, Debug)]
pub struct Scheduler {
    /// Every unfinished task whose submitter told us about it.
    payloads: HashMap<u64, Task>,
    /// The data objects each node holds.
    holdings: HashMap<u32, HashSet<String>>,
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
    /// The agents' own work, placed by load (see [`Placement`]).
    pub placement: Placement,
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
        if self.payloads.insert(id, task).is_none() && !self.assigned.contains_key(&id) {
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
        self.placement.node_died(node);
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

    /// What `node` holds now (replaces what it held before).
    pub fn set_holdings(&mut self, node: u32, holds: impl IntoIterator<Item = String>) {
        self.holdings.insert(node, holds.into_iter().collect());
    }

    /// Position in the queue of the task best placed on `node` (see the module docs).
    fn pick(&self, node: u32) -> usize {
        self.pick_among(node, &HashSet::new()).unwrap_or(0)
    }

    /// [`Scheduler::pick`] over the queue without the positions in `skip`.
    fn pick_among(&self, node: u32, skip: &HashSet<usize>) -> Option<usize> {
        let held_here = |t: &Task| t.affinity.as_ref().is_some_and(|a| self.holdings.get(&node).is_some_and(|h| h.contains(a)));
        let held_nowhere = |t: &Task| t.affinity.as_ref().is_none_or(|a| !self.holdings.values().any(|h| h.contains(a)));
        let tasks =
            || self.queue.iter().enumerate().filter(|(i, _)| !skip.contains(i)).filter_map(|(i, id)| Some((i, self.payloads.get(id)?)));
        let ordinary = || tasks().filter(|(_, t)| !t.urgent);
        // Every worker either waits on a take or holds a task.
        let workers: HashSet<Client> = self.waiting.iter().map(|(_, c)| *c).chain(self.assigned.values().copied()).collect();
        let limit = ENDGAME_TASKS_PER_WORKER * workers.len();
        let endgame = ordinary().take(limit + 1).count() <= limit;
        if endgame {
            // Ordinary tasks first, but not one whose data another node holds before an
            // urgent one (that would stage data the other node has).
            return ordinary()
                .find(|(_, t)| held_here(t))
                .or_else(|| ordinary().find(|(_, t)| held_nowhere(t)))
                .or_else(|| tasks().find(|(_, t)| t.urgent))
                .or_else(|| tasks().next())
                .map(|(i, _)| i);
        }
        tasks()
            .find(|(_, t)| t.urgent)
            .or_else(|| tasks().find(|(_, t)| held_here(t)))
            .or_else(|| tasks().find(|(_, t)| held_nowhere(t)))
            .or_else(|| tasks().next())
            .map(|(i, _)| i)
    }

    /// The data objects of the next `count` tasks `node` would be handed if it asked now
    /// and nobody else took any, each once, in order: what its node should bring in
    /// ahead of use (the data streaming service's lookahead).
    pub fn upcoming(&self, node: u32, count: usize) -> Vec<String> {
        let mut skip = HashSet::new();
        let mut out: Vec<String> = Vec::new();
        while skip.len() < count.min(self.queue.len()) {
            let Some(i) = self.pick_among(node, &skip) else { break };
            skip.insert(i);
            if let Some(a) = self.queue.get(i).and_then(|id| self.payloads.get(id)).and_then(|t| t.affinity.as_ref()) {
                if !out.contains(a) {
                    out.push(a.clone());
                }
            }
        }
        out
    }

    fn assign(&mut self) -> Vec<Assignment> {
        let mut out = Vec::new();
        if self.settling() {
            return out;
        }
        while !self.queue.is_empty() && !self.waiting.is_empty() {
            let front = self.waiting.front().copied().unwrap();
            let id = self.queue.remove(self.pick(front.1.node)).unwrap();
            // Queued ids always have a payload (`done` removes both); skip one that does not.
            let Some(task) = self.payloads.get(&id).cloned() else { continue };
            // A task the front taker's node does not hold goes to the first waiting
            // taker whose node does: tasks submitted one by one to many waiting takers
            // (a job's start) then land where their data is, as later takes do.
            let held_by = |node: u32| task.affinity.as_ref().is_some_and(|a| self.holdings.get(&node).is_some_and(|h| h.contains(a)));
            let taker =
                if task.urgent || held_by(front.1.node) { 0 } else { self.waiting.iter().position(|(_, c)| held_by(c.node)).unwrap_or(0) };
            let (op, client) = self.waiting.remove(taker).unwrap();
            self.assigned.insert(id, client);
            self.assigned_total += 1;
            out.push(Assignment { op, client, task });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: u64) -> Task {
        Task { id, payload: vec![id as u8], affinity: None, urgent: false }
    }

    fn near(id: u64, data: &str) -> Task {
        Task { id, payload: vec![id as u8], affinity: Some(data.into()), urgent: false }
    }

    /// Node 1 holding f0, node 2 holding f1, one worker each, and `tasks` (id, data)
    /// queued.
    fn two_nodes(tasks: &[(u64, &str)]) -> (Scheduler, Client, Client) {
        let mut s = Scheduler::new();
        s.set_holdings(1, ["f0".to_string()]);
        s.set_holdings(2, ["f1".to_string()]);
        for &(id, f) in tasks {
            s.submit(near(id, f), 1);
        }
        (s, Client::new(1, 1), Client::new(2, 1))
    }

    #[test]
    fn takers_get_the_data_their_node_holds_then_data_nobody_holds() {
        let (mut s, a, b) = two_nodes(&[(1, "f1"), (2, "f2"), (3, "f0"), (4, "f1")]);
        // Node 1 holds f0: task 3, although tasks 1 and 2 came first.
        assert_eq!(s.take(10, a)[0].task.id, 3);
        // Nothing of f0 is left: the task whose data nobody holds (f2), not node 2's f1.
        assert_eq!(s.take(11, a)[0].task.id, 2);
        // Node 2 gets its own fragment in order.
        assert_eq!(s.take(12, b)[0].task.id, 1);
        // Only node 2's data is left: an idle node 1 still gets it (never idle while work waits).
        assert_eq!(s.take(13, a)[0].task.id, 4);
        // Holdings change: node 2 now holds f2 too.
        s.set_holdings(2, ["f1".to_string(), "f2".to_string()]);
        s.submit(task(5), 1);
        s.submit(near(6, "f2"), 1);
        assert_eq!(s.take(14, b)[0].task.id, 6);
        assert_eq!(s.take(15, b)[0].task.id, 5);
    }

    #[test]
    fn upcoming_is_what_a_node_would_be_handed_next() {
        let mut s = Scheduler::new();
        s.set_holdings(1, ["f0".to_string()]);
        s.set_holdings(2, ["f1".to_string()]);
        for (id, f) in [(1, "f1"), (2, "f0"), (3, "f2"), (4, "f0"), (5, "f1")] {
            s.submit(near(id, f), 1);
        }
        // Node 1: its own f0 twice, then f2 (held nowhere), then node 2's f1.
        assert_eq!(s.upcoming(1, 2), ["f0"]);
        assert_eq!(s.upcoming(1, 3), ["f0", "f2"]);
        assert_eq!(s.upcoming(1, 10), ["f0", "f2", "f1"]);
        // A node holding nothing: what nobody holds first.
        assert_eq!(s.upcoming(3, 1), ["f2"]);
        // Looking ahead hands nothing out.
        assert_eq!(s.queued(), 5);
        assert_eq!(s.take(9, Client::new(1, 1))[0].task.id, 2);
    }

    #[test]
    fn urgent_tasks_go_first_whatever_a_node_holds() {
        let mut s = Scheduler::new();
        let a = Client::new(1, 1);
        s.set_holdings(1, ["f0".to_string()]);
        s.submit(near(1, "f0"), 1);
        s.submit(task(2), 1);
        s.submit(task(5), 1);
        s.submit(Task { urgent: true, ..task(3) }, 1);
        s.submit(Task { urgent: true, ..near(4, "f9") }, 1);
        // Urgent ones in their order, then node 1's own data, then the rest. One worker
        // and three ordinary tasks queued: not yet the end-game.
        let order: Vec<u64> = (0..5).map(|i| s.take(10 + i, a)[0].task.id).collect();
        assert_eq!(order, [3, 4, 1, 2, 5]);
    }

    #[test]
    fn in_the_end_game_ordinary_tasks_go_before_urgent_ones() {
        let (mut s, a, b) = two_nodes(&[(1, "f0"), (2, "f1"), (3, "f0"), (4, "f1"), (5, "f2"), (6, "f1"), (10, "f0")]);
        assert_eq!(s.take(20, a)[0].task.id, 1);
        assert_eq!(s.take(21, b)[0].task.id, 2);
        // Two workers, five ordinary tasks queued (more than two each): urgent first.
        s.submit(Task { urgent: true, ..task(7) }, 1);
        s.done(1);
        assert_eq!(s.take(22, a)[0].task.id, 7);
        s.done(7);
        assert_eq!(s.take(23, a)[0].task.id, 3);
        // Four ordinary tasks left for two workers: the end-game. Node 1 gets its own
        // f0, then f2 that nobody holds, then an urgent one rather than node 2's f1.
        s.submit(Task { urgent: true, ..task(8) }, 1);
        s.submit(Task { urgent: true, ..task(9) }, 1);
        // Three tasks in a row for `c`, each done before the next take.
        let three = |s: &mut Scheduler, c: Client, op: u64| -> Vec<u64> {
            (0..3)
                .map(|i| {
                    let t = s.take(op + i, c)[0].task.id;
                    s.done(t);
                    t
                })
                .collect()
        };
        assert_eq!(three(&mut s, a, 24), [10, 5, 8]);
        // Node 2's own tasks before the last urgent one.
        s.done(2);
        assert_eq!(three(&mut s, b, 30), [4, 6, 9]);
        assert_eq!(s.queued(), 0);
    }

    #[test]
    fn work_is_placed_on_the_least_loaded_agent_and_stays_there() {
        let mut p = Placement::default();
        let live = [1, 2, 3];
        // Ties go to the asking agent, then to the lowest id.
        assert_eq!(p.place("b0", 1, &live, 2), Ok(2));
        assert_eq!(p.place("b1", 1, &live, 2), Ok(1));
        assert_eq!(p.place("b0", 1, &live, 3), Ok(2), "asked again: the same agent");
        assert_eq!(p.place("b2", 1, &live, 9), Ok(3));
        assert_eq!(p.place("b3", 5, &live, 1), Ok(1));
        // Node 1 carries 6, nodes 2 and 3 carry 1: the next goes to 2 (lower id).
        assert_eq!(p.place("b4", 1, &live, 1), Ok(2));
        assert_eq!((p.load(1), p.load(2), p.load(3)), (6, 2, 1));
        p.release("b3");
        p.release("b3");
        assert_eq!(p.load(1), 1, "a release counts once");
        // Node 2 dies: its keys are placed again, on live agents only.
        p.node_died(2);
        assert_eq!(p.place("b0", 1, &[1, 3], 1), Ok(1));
        assert_eq!(p.place("b9", 1, &[], 1), Err(PlaceError::NoLiveAgent("b9".into())));
    }

    #[test]
    fn a_task_submitted_to_waiting_takers_goes_to_one_whose_node_holds_its_data() {
        let mut s = Scheduler::new();
        let (a, b, c) = (Client::new(1, 1), Client::new(2, 1), Client::new(3, 1));
        s.set_holdings(1, ["f0".to_string()]);
        s.set_holdings(2, ["f1".to_string()]);
        for (op, taker) in [(10, a), (11, b), (12, c)] {
            assert!(s.take(op, taker).is_empty());
        }
        // Node 2 holds f1: its taker, although node 1's waited longer.
        assert_eq!(s.submit(near(1, "f1"), 1), vec![Assignment { op: 11, client: b, task: near(1, "f1") }]);
        // Nobody waiting holds f1 any more: the longest waiting taker.
        assert_eq!(s.submit(near(2, "f1"), 1), vec![Assignment { op: 10, client: a, task: near(2, "f1") }]);
        assert_eq!(s.submit(near(3, "f0"), 1), vec![Assignment { op: 12, client: c, task: near(3, "f0") }]);
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
