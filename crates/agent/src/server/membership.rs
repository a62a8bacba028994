//! Membership: finding the other agents, noticing their death, and what a new view
//! moves (board entries, locks, the scheduler).

use super::*;

/// How a dead agent is noticed. There are no heartbeats: the port keeps every link to
/// another agent up (`PortConfig::keepalive`), so a link that drops is reconnected at
/// once, and the kernel's keepalive probes and `TCP_USER_TIMEOUT` break the connection
/// of a peer that went silent without closing it. A peer that cannot be reached again
/// within `peer_timeout` is reported failed ([`Event::PeerFailed`]), and
/// [`Agent::peer_failed`] takes it out of the view. All-to-all heartbeats had grown
/// with the square of the group: each was a write, a read, two wake-ups and an
/// acknowledgement's round of the same (36 idle agents took 9-18 % of a core in all,
/// and a model of 1,000 nodes 8 % of a core per agent); an idle link now costs its
/// processes nothing.
impl Agent {
    pub(super) fn discover(&mut self) {
        let Some(dir) = self.cfg.rendezvous.clone() else { return };
        let Ok(rd) = std::fs::read_dir(&dir) else { return };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(n) = name.strip_prefix("agent-").and_then(|s| s.strip_suffix(".json")).and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if n != self.me && !self.known.contains_key(&n) && !self.dead.contains(&n) {
                debug!("node {}: found agent {n} in {}", self.me, dir.display());
                self.known.insert(n, None);
                self.send_peer(n, &PeerMsg::Hello { node: self.me, pid: std::process::id(), incarnation: self.incarnation });
            }
        }
        self.discovered = true;
        self.check_ready();
    }

    pub(super) fn peer_alive(&mut self, node: u32, pid: u32, incarnation: u64) {
        if self.dead.contains(&node) {
            // Only a new incarnation comes back: a restarted agent of that node.
            if incarnation == 0 || self.buried.get(&node) == Some(&incarnation) {
                return;
            }
            info!("node {}: agent {node} restarted (pid {pid}); letting it back in", self.me);
            self.dead.remove(&node);
            self.buried.remove(&node);
            self.rejoins += 1;
        } else if let Some(Some((_, was))) = self.known.get(&node) {
            if *was != 0 && incarnation != 0 && *was != incarnation {
                // Restarted faster than we noticed it gone: its old self died first.
                self.peer_failed(Addr::new(node, 0), "it restarted");
                return self.peer_alive(node, pid, incarnation);
            }
        }
        let was = self.known.insert(node, Some((pid, incarnation)));
        if !matches!(was, Some(Some(_))) {
            info!("node {}: agent {node} joined", self.me);
            let old = self.view.clone();
            self.view.push(node);
            self.view.sort_unstable();
            self.view_changed(&old);
            self.hand_over(node, &old);
            self.publish_state();
        } else if let Some(Some((p, inc))) = self.known.get_mut(&node) {
            // A hello after a message told us it lives: keep its real identity.
            if *inc == 0 {
                (*p, *inc) = (pid, incarnation);
            }
        }
    }

    /// `joined` entered the view: locks and merge streams we owned whose owner is now
    /// someone else go to their new owner, and every pair that just met swaps a
    /// (usually empty) `Handover`; until ours from `joined` is in, we serve no
    /// owner-routed operation, so nothing is granted or read twice across the move.
    fn hand_over(&mut self, joined: u32, old: &[u32]) {
        if old.len() < self.view.len() && joined != self.me {
            self.awaiting_handover.insert(joined);
            self.handover_deadline = Some(Instant::now() + self.cfg.peer_timeout * 4);
        }
        if self.settle_deadline.is_some() {
            // Locks are still being re-registered with us after a death: what we hand
            // over must include them.
            self.handover_owed.push(joined);
            return;
        }
        self.send_handovers(&[joined]);
    }

    /// Sends every agent in `to` its hand-over (possibly empty), and every other new
    /// owner what moved to it: our locks and merge streams whose owner under the
    /// current view is someone else.
    pub(super) fn send_handovers(&mut self, to: &[u32]) {
        let me = self.me;
        let view = self.view.clone();
        let owner = |key: &str| ranked(key, &view).first().copied();
        type Handed = (Vec<HandedLock>, Vec<(String, MergeState)>);
        let mut out: BTreeMap<u32, Handed> = BTreeMap::new();
        for &n in to {
            if view.contains(&n) {
                out.entry(n).or_default();
            }
        }
        for (name, holders, waiting) in self.locks.take(|name| owner(&lock_key(name)) != Some(me)) {
            let Some(dest) = owner(&lock_key(&name)) else { continue };
            let mut w = Vec::new();
            for (c, m) in waiting {
                if let Some((origin, op)) = self.lock_waiters.remove(&(name.clone(), c)) {
                    self.moved_ops.insert((origin, op), dest);
                    self.send_peer(origin, &PeerMsg::Moved { op, dest });
                    w.push((c, m.into(), origin, op));
                }
            }
            let holders = holders.into_iter().map(|(c, m)| (c, m.into())).collect();
            out.entry(dest).or_default().0.push(HandedLock { name, holders, waiting: w });
        }
        let moving: Vec<String> = self.merges.keys().filter(|s| owner(&merge_key(s)) != Some(me)).cloned().collect();
        for stream in moving {
            let (Some(m), Some(dest)) = (self.merges.remove(&stream), owner(&merge_key(&stream))) else { continue };
            let (runs, last) = m.into_parts();
            out.entry(dest).or_default().1.push((stream, MergeState { runs, last }));
        }
        for (dest, (locks, merges)) in out {
            if !locks.is_empty() || !merges.is_empty() {
                info!("node {me}: handing {} locks and {} merge streams to agent {dest}", locks.len(), merges.len());
            }
            self.send_peer(dest, &PeerMsg::Handover { locks, merges });
        }
    }

    /// A `Handover` from `from`: adopt what it sends, and serve again once every
    /// agent that joined has sent one.
    pub(super) fn handover_in(&mut self, from: u32, locks: Vec<HandedLock>, merges: Vec<(String, MergeState)>) {
        for l in locks {
            let waiting = l.waiting.iter().map(|(c, m, _, _)| (*c, (*m).into())).collect();
            for (c, _, origin, op) in &l.waiting {
                self.lock_waiters.insert((l.name.clone(), *c), (*origin, *op));
            }
            let holders = l.holders.into_iter().map(|(c, m)| (c, m.into())).collect();
            let grants = self.locks.adopt(&l.name, holders, waiting);
            self.send_grants(grants);
        }
        for (stream, st) in merges {
            match Merger::from_parts(st.runs, st.last) {
                Some(m) => {
                    self.merges.insert(stream, m);
                }
                None => warn!("node {}: merge stream {stream:?} from agent {from} is inconsistent; dropped", self.me),
            }
        }
        self.awaiting_handover.remove(&from);
        if self.awaiting_handover.is_empty() && self.handover_deadline.is_some() {
            self.settled();
        }
    }

    pub(super) fn peer_failed(&mut self, peer: Addr, reason: &str) {
        if peer.node == self.me {
            if peer.port != 0 {
                self.client_died(peer.port);
            }
            return;
        }
        if peer.port != 0 || self.dead.contains(&peer.node) {
            return;
        }
        warn!("node {}: agent {} failed: {reason}", self.me, peer.node);
        self.drop_member(peer.node, reason);
    }

    /// Agent `node` said it is stopping: out of the view at once, and its link with it
    /// (no reconnecting to it, no waiting for its acknowledgements when this agent
    /// stops in turn). Otherwise as a failure: what it owned moves to the survivors.
    pub(super) fn peer_left(&mut self, node: u32) {
        if node == self.me || self.dead.contains(&node) {
            return;
        }
        info!("node {}: agent {node} left", self.me);
        self.port.forget_peer(Addr::new(node, 0));
        self.drop_member(node, "it left");
    }

    fn drop_member(&mut self, dead: u32, reason: &str) {
        self.dead.insert(dead);
        let incarnation = self.known.remove(&dead).flatten().map_or(0, |(_, inc)| inc);
        self.buried.insert(dead, incarnation);
        self.awaiting_handover.remove(&dead);
        if self.awaiting_handover.is_empty() {
            self.handover_deadline = None;
        }
        let old = self.view.clone();
        self.view.retain(|&n| n != dead);
        self.ptable.remove(dead);
        self.outbox.drop_dest(dead);
        self.seq.forget(dead);
        let grants = self.locks.node_died(dead);
        self.lock_waiters.retain(|(_, c), _| c.node != dead);
        self.deferred.retain(|(o, _, _, _)| *o != dead);
        self.send_grants(grants);
        if let Some(s) = &mut self.scheduler {
            let a = s.node_died(dead);
            self.deliver_assignments(a);
        }
        // Locks held by our clients whose owner moved: re-register them with the new
        // owners, and tell every survivor we did (they wait for everyone's).
        let mut reclaims: BTreeMap<u32, Vec<(String, Client, LockMode)>> = BTreeMap::new();
        for ((lock, c), held) in &self.held_locks {
            let key = lock_key(lock);
            if ranked(&key, &old).first() == Some(&dead) {
                if let Some(&o) = ranked(&key, &self.view).first() {
                    reclaims.entry(o).or_default().push((lock.clone(), *c, held.mode));
                }
            }
        }
        self.awaiting_reclaim = self.view.iter().copied().collect();
        self.reclaim_view = self.view.clone();
        for (v, from) in std::mem::take(&mut self.early_reclaims) {
            if v == self.view {
                self.awaiting_reclaim.remove(&from);
            }
        }
        self.settle_deadline = Some(Instant::now() + self.cfg.peer_timeout * 2);
        for n in self.view.clone() {
            let locks = reclaims.remove(&n).unwrap_or_default();
            self.send_peer(n, &PeerMsg::Reclaim { view: self.view.clone(), locks });
        }
        self.view_changed(&old);
        // Operations in flight to the dead agent go to the keys' new owners.
        let lost: Vec<u64> = self.routed.iter().filter(|(_, r)| r.dest == dead).map(|(o, _)| *o).collect();
        for op in lost {
            let r = self.routed.remove(&op).unwrap();
            self.route(r.client, r.op, r.reply, Some(op));
        }
        let lost: Vec<u64> = self.peer_ops.iter().filter(|(_, (n, _))| *n == dead).map(|(o, _)| *o).collect();
        for op in lost {
            let (_, reply) = self.peer_ops.remove(&op).unwrap();
            self.reply(reply, Reply::err(ErrorKind::Unavailable, format!("node {dead} failed: {reason}")));
        }
    }

    /// Re-homes board entries and follows the scheduler after any change of the view.
    pub(super) fn view_changed(&mut self, old: &[u32]) {
        let mut copies: BTreeMap<u32, Vec<(String, BoardValue)>> = BTreeMap::new();
        let mut drop = Vec::new();
        for (k, v) in self.board.entries() {
            let r = ranked(k, &self.view);
            let bv = BoardValue { version: v.version, value: v.value.to_vec() };
            if r.first() == Some(&self.me) {
                if let Some(&b) = r.get(1) {
                    if ranked(k, old).get(1) != Some(&b) || ranked(k, old).first() != Some(&self.me) {
                        copies.entry(b).or_default().push((k.clone(), bv));
                    }
                }
            } else if r.get(1) != Some(&self.me) {
                copies.entry(r[0]).or_default().push((k.clone(), bv));
                drop.push(k.clone());
            }
        }
        for k in drop {
            self.board.remove(&k);
        }
        for (n, entries) in copies {
            self.send_peer(n, &PeerMsg::BoardCopy { entries });
        }
        let new_sched = elect(&self.view);
        if new_sched != self.scheduler_node {
            self.scheduler_node = new_sched;
            if new_sched == Some(self.me) {
                info!("node {}: elected scheduler (view {:?})", self.me, self.view);
                let others: Vec<u32> = self.view.clone();
                let mut sched = Scheduler::taking_over(others);
                for st in self.ptable.all() {
                    sched.set_holdings(st.node, st.holds);
                }
                self.scheduler = Some(sched);
                self.sched_settle_deadline = Some(Instant::now() + self.cfg.peer_timeout * 2);
            } else {
                self.scheduler = None;
                self.early_sched.clear();
            }
            if let Some(s) = new_sched {
                let submitted: Vec<Task> = self.my_tasks.values().cloned().collect();
                let holding: Vec<(u64, Client)> = self.holding.iter().map(|(t, c)| (*t, *c)).collect();
                let takes: Vec<(u64, Client)> = self.takes.iter().map(|(o, (c, _, _))| (*o, *c)).collect();
                self.send_peer(s, &PeerMsg::Rejoin { view: self.view.clone(), submitted, holding, takes });
            }
        }
        if self.scheduler.is_some() {
            for (from, m) in std::mem::take(&mut self.early_sched) {
                self.loopback_from.push_back((from, m));
            }
        }
        self.check_ready();
    }

    /// Ready (clients may start, owner-routed operations are served) once the view
    /// holds the expected agents, or, for an agent restarted into a running job (its
    /// node may be the only one that came back), once every agent its discovery found
    /// has answered or been found dead.
    pub(super) fn check_ready(&mut self) {
        let complete = self.restarted && self.discovered && self.known.values().all(Option::is_some);
        let ready = complete || self.cfg.nodes.is_none_or(|n| self.view.len() >= n);
        if ready && !self.ready {
            self.ready = true;
            info!("node {}: ready, view {:?}", self.me, self.view);
            let frame = encode(&LocalReply::Ready);
            for s in self.sessions.values_mut() {
                if s.port.is_some() {
                    let _ = unix::write(&mut s.stream, &frame);
                }
            }
            self.settled();
        }
    }

    /// Runs the owner-routed operations held back while settling, once nothing is
    /// awaited any more (neither lock re-registrations after a death nor hand-overs
    /// after a join).
    pub(super) fn settled(&mut self) {
        if self.awaiting_reclaim.is_empty() {
            self.settle_deadline = None;
            if !self.handover_owed.is_empty() {
                let owed = std::mem::take(&mut self.handover_owed);
                self.send_handovers(&owed);
            }
        }
        if self.awaiting_handover.is_empty() {
            self.handover_deadline = None;
        }
        if self.settle_deadline.is_some() || self.handover_deadline.is_some() || !self.ready {
            return;
        }
        for (origin, op, client, body) in std::mem::take(&mut self.deferred) {
            self.exec_owned(origin, op, client, body);
        }
    }
}
