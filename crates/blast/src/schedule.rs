//! Dynamic task assignment with fragment affinity, as a pure state machine.
//!
//! mpiBLAST's rule: an idle worker gets a pending task on the fragment it searched last
//! (its pages are hot in that node's cache), otherwise the oldest pending task. A
//! whole-database fallback goes before both: its batch waits for it to be written. A task
//! that fails is retried once, on another worker when there is one; a task whose worker
//! died is simply handed out again (that is not the task's fault).

use std::collections::{HashMap, VecDeque};

/// What a task searches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// One fragment (through its whole-statistics alias).
    Fragment(usize),
    /// The whole database (for queries whose merge could not be trusted).
    Whole,
}

/// A unit of work.
#[derive(Clone, Debug)]
pub struct Task {
    pub id: usize,
    pub batch: usize,
    pub target: Target,
    /// Global indices of the task's queries, in order (`Query_1` = first).
    pub queries: Vec<usize>,
    failures: u32,
    failed_on: Vec<usize>,
    /// A whole-database fallback: it finishes a batch whose merge waits for it, so it
    /// goes before every fragment task (the batch is written while the rest is searched).
    urgent: bool,
}

/// The decision after a task failed.
#[derive(Debug, PartialEq, Eq)]
pub enum AfterFailure {
    Retry,
    GiveUp,
}

/// Assignment state.
#[derive(Default)]
pub struct Scheduler {
    tasks: Vec<Task>,
    pending: VecDeque<usize>,
    running: HashMap<usize, usize>,
    last_fragment: HashMap<usize, usize>,
    done: usize,
}

impl Scheduler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a task; returns its id.
    pub fn add(&mut self, batch: usize, target: Target, queries: Vec<usize>) -> usize {
        let id = self.tasks.len();
        let urgent = target == Target::Whole;
        self.tasks.push(Task { id, batch, target, queries, failures: 0, failed_on: Vec::new(), urgent });
        self.pending.push_back(id);
        id
    }

    pub fn task(&self, id: usize) -> &Task {
        &self.tasks[id]
    }

    /// The next task for idle `worker`, or `None` if nothing is pending.
    pub fn assign(&mut self, worker: usize, workers_alive: usize) -> Option<usize> {
        let eligible = |t: &Task| workers_alive <= 1 || !t.failed_on.contains(&worker);
        let affine = self.last_fragment.get(&worker).copied();
        let pos = self
            .pending
            .iter()
            .position(|&id| eligible(&self.tasks[id]) && self.tasks[id].urgent)
            .or_else(|| {
                self.pending
                    .iter()
                    .position(|&id| eligible(&self.tasks[id]) && affine.is_some_and(|f| self.tasks[id].target == Target::Fragment(f)))
            })
            .or_else(|| self.pending.iter().position(|&id| eligible(&self.tasks[id])))?;
        let id = self.pending.remove(pos).unwrap();
        if let Target::Fragment(f) = self.tasks[id].target {
            self.last_fragment.insert(worker, f);
        }
        self.running.insert(worker, id);
        Some(id)
    }

    /// `worker` finished its task successfully; returns the task id.
    pub fn succeeded(&mut self, worker: usize) -> Option<usize> {
        let id = self.running.remove(&worker)?;
        self.done += 1;
        Some(id)
    }

    /// `worker`'s task failed.
    pub fn failed(&mut self, worker: usize) -> Option<(usize, AfterFailure)> {
        let id = self.running.remove(&worker)?;
        let t = &mut self.tasks[id];
        t.failures += 1;
        t.failed_on.push(worker);
        if t.failures >= 2 {
            return Some((id, AfterFailure::GiveUp));
        }
        self.pending.push_front(id);
        Some((id, AfterFailure::Retry))
    }

    /// `worker` died: its task goes back to the front of the queue.
    pub fn worker_lost(&mut self, worker: usize) -> Option<usize> {
        self.last_fragment.remove(&worker);
        let id = self.running.remove(&worker)?;
        self.pending.push_front(id);
        Some(id)
    }

    /// The task `worker` is running.
    pub fn running_on(&self, worker: usize) -> Option<usize> {
        self.running.get(&worker).copied()
    }

    /// Whether every task added so far has succeeded.
    pub fn all_done(&self) -> bool {
        self.done == self.tasks.len()
    }

    /// Tasks added so far.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefers_the_fragment_a_worker_searched_last() {
        let mut s = Scheduler::new();
        for b in 0..2 {
            for f in 0..3 {
                s.add(b, Target::Fragment(f), vec![b]);
            }
        }
        assert_eq!(s.assign(0, 2), Some(0)); // batch 0 frag 0
        assert_eq!(s.assign(1, 2), Some(1)); // batch 0 frag 1
        s.succeeded(0);
        s.succeeded(1);
        let t1 = s.assign(1, 2).unwrap();
        assert_eq!(s.task(t1).target, Target::Fragment(1), "worker 1 keeps fragment 1");
        let t0 = s.assign(0, 2).unwrap();
        assert_eq!(s.task(t0).target, Target::Fragment(0), "worker 0 keeps fragment 0");
    }

    #[test]
    fn fallbacks_go_before_fragment_tasks() {
        let mut s = Scheduler::new();
        s.add(0, Target::Fragment(0), vec![0]);
        s.add(0, Target::Fragment(0), vec![1]);
        assert_eq!(s.assign(0, 1), Some(0));
        s.succeeded(0);
        let w1 = s.add(0, Target::Whole, vec![0]);
        let w2 = s.add(0, Target::Whole, vec![1]);
        // Worker 0 searched fragment 0 last, yet the fallbacks come first, in order.
        assert_eq!(s.assign(0, 1), Some(w1));
        s.succeeded(0);
        assert_eq!(s.assign(0, 1), Some(w2));
        s.succeeded(0);
        assert_eq!(s.assign(0, 1), Some(1));
    }

    #[test]
    fn failures_retry_elsewhere_once_and_lost_workers_requeue() {
        let mut s = Scheduler::new();
        let t = s.add(0, Target::Whole, vec![0]);
        let u = s.add(0, Target::Whole, vec![1]);
        assert_eq!(s.assign(0, 2), Some(t));
        assert_eq!(s.failed(0), Some((t, AfterFailure::Retry)));
        assert_eq!(s.assign(0, 2), Some(u), "worker 0 does not get the task that failed on it");
        assert_eq!(s.assign(1, 2), Some(t));
        assert_eq!(s.failed(1), Some((t, AfterFailure::GiveUp)));
        assert_eq!(s.worker_lost(0), Some(u));
        assert_eq!(s.assign(1, 1), Some(u));
        s.succeeded(1);
        assert!(!s.all_done());
    }
}
