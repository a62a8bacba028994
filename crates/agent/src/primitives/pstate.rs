//! Global process state: what every node is doing and what data it holds.
//!
//! Each agent summarises its own node (from what its processes declare and what its
//! cache holds) and advertises every change to all agents, which keep the latest
//! version per node. A node's activity is `Busy` if any process is busy, else
//! `Waiting` if any waits, else `Idle`.

use std::collections::BTreeMap;

use crate::wire::{Activity, NodeState};

pub fn summarise(processes: &[(u32, Activity)]) -> Activity {
    if processes.iter().any(|(_, a)| *a == Activity::Busy) {
        Activity::Busy
    } else if processes.iter().any(|(_, a)| *a == Activity::Waiting) {
        Activity::Waiting
    } else {
        Activity::Idle
    }
}

/// The latest state of every live node.
#[derive(Default, Debug)]
pub struct Table {
    nodes: BTreeMap<u32, NodeState>,
}

impl Table {
    /// Keeps `s` unless a newer version of that node is already known (a restarted
    /// agent's versions start again from 1, so a later incarnation is newer).
    pub fn update(&mut self, s: NodeState) -> bool {
        match self.nodes.get(&s.node) {
            Some(cur) if (cur.incarnation, cur.version) >= (s.incarnation, s.version) => false,
            _ => {
                self.nodes.insert(s.node, s);
                true
            }
        }
    }

    pub fn remove(&mut self, node: u32) {
        self.nodes.remove(&node);
    }

    pub fn all(&self) -> Vec<NodeState> {
        self.nodes.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_updates_are_ignored_and_activity_summarised() {
        let mut t = Table::default();
        let s = |v, a| NodeState { node: 1, activity: a, processes: vec![], holds: vec![], incarnation: 7, version: v };
        assert!(t.update(s(2, Activity::Busy)));
        assert!(!t.update(s(1, Activity::Idle)));
        assert_eq!(t.all()[0].activity, Activity::Busy);
        let restarted = NodeState { incarnation: 8, ..s(1, Activity::Idle) };
        assert!(t.update(restarted), "a restarted agent's first state replaces its predecessor's last");
        assert_eq!(t.all()[0].activity, Activity::Idle);
        assert_eq!(summarise(&[(1, Activity::Idle), (2, Activity::Waiting)]), Activity::Waiting);
        assert_eq!(summarise(&[(1, Activity::Busy), (2, Activity::Waiting)]), Activity::Busy);
        assert_eq!(summarise(&[]), Activity::Idle);
    }
}
