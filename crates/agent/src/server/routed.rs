//! Owner-routed operations: board keys, locks and merge streams are executed by their
//! owner agent; this is the routing and the owner's side.

use super::*;

/// The key that decides which agent executes an owner-routed operation.
pub(super) fn routed_key(op: &Op) -> Option<String> {
    Some(match op {
        Op::BoardGet { key } | Op::BoardPut { key, .. } | Op::BoardCas { key, .. } => key.clone(),
        Op::Lock { name, .. } | Op::Unlock { name } => lock_key(name),
        Op::MergeOpen { stream, .. } | Op::MergePush { stream, .. } | Op::MergePull { stream } => merge_key(stream),
        _ => return None,
    })
}

impl Agent {
    /// Sends an owner-routed operation to its owner (ourselves included); returns the
    /// owner, or `None` if there is none (no view yet).
    pub(super) fn route(&mut self, client: Client, op: Op, reply: ReplyTo, reuse: Option<u64>) -> Option<u32> {
        self.route_as(client, op, reply, reuse, false)
    }

    /// [`Agent::route`]; `lazily`: the operation travels with the next message to any
    /// agent, within `LAZY_FOR`, or before the loop sleeps (`Agent::send_peer_lazy`).
    fn route_as(&mut self, client: Client, op: Op, reply: ReplyTo, reuse: Option<u64>, lazily: bool) -> Option<u32> {
        let key = routed_key(&op).expect("not an owner-routed operation");
        let &dest = ranked(&key, &self.view).first()?;
        let id = reuse.unwrap_or_else(|| self.new_op());
        if let (ReplyTo::Client { port, id: rid }, Op::Lock { .. }) = (&reply, &op) {
            self.cancellable.insert((*port, *rid), id);
        }
        let body = op.clone();
        self.routed.insert(id, Routed { dest, client, op, reply });
        if lazily {
            self.send_peer_lazy(dest, PeerMsg::Routed { op: id, client, body });
        } else {
            self.send_peer(dest, &PeerMsg::Routed { op: id, client, body });
        }
        Some(dest)
    }

    /// A client's lock operation, with releases answered early: a release of a lock
    /// this agent knows the client holds is answered at once and sent on to the owner
    /// without waiting for its answer. The lock stays held until the owner has the
    /// release, so mutual exclusion holds; what the client wrote under it was
    /// acknowledged before it released. A lock pair across nodes then costs one
    /// round trip to the owner instead of two.
    ///
    /// Order: the client's next request for the same lock follows the release on the
    /// same link to the same owner, which executes them in order. If it would go to
    /// another owner (the view changed meanwhile), it waits for the release's answer.
    ///
    /// A release of a lock that nobody else waited for when it was granted
    /// (`PeerMsg::Granted`'s `alone`) goes lazily: with the next message to any agent,
    /// typically the same client's next lock request, in one write (each write is a
    /// system call that also runs the receiver's network input path here); at the
    /// latest after `LAZY_FOR` or before the loop sleeps. Someone who asked for the lock
    /// since waits up to that much longer. A release of a lock others were waiting for
    /// goes at once: holding those back cost 4 nodes contending for one lock ≈12 % of
    /// their lock pairs.
    pub(super) fn route_lock_op(&mut self, client: Client, op: Op, reply: ReplyTo) {
        match &op {
            Op::Unlock { name } => {
                let key = (name.clone(), client);
                let Some(held) = self.held_locks.remove(&key) else {
                    // Not known to be held here: the owner answers (`NotHeld`, say).
                    self.route(client, op, reply, None);
                    return;
                };
                // The answer first: sending to another node is a system call or two.
                self.reply(reply, Reply::Ok);
                let id = self.new_op();
                if let Some(dest) = self.route_as(client, op, ReplyTo::Discard, Some(id), held.alone) {
                    self.releasing.insert(key, (id, dest));
                }
            }
            Op::Lock { name, .. } => {
                let key = (name.clone(), client);
                let owner = ranked(&lock_key(name), &self.view).first().copied();
                match self.releasing.get(&key) {
                    Some(&(_, dest)) if owner != Some(dest) => self.after_release.entry(key).or_default().push((op, reply)),
                    _ => {
                        self.route(client, op, reply, None);
                    }
                }
            }
            _ => unreachable!("only locks and releases come here"),
        }
    }

    /// The owner answered early release `op` of `name` by `client`: requests held back
    /// behind it go now.
    pub(super) fn released(&mut self, op: u64, name: &str, client: Client, reply: &Reply) {
        let key = (name.to_string(), client);
        if self.releasing.get(&key).is_none_or(|(id, _)| *id != op) {
            return;
        }
        self.releasing.remove(&key);
        if *reply != Reply::Ok {
            warn!("node {}: the owner refused {client:?}'s release of lock {name:?}, answered early: {reply:?}", self.me);
        }
        for (op, reply) in self.after_release.remove(&key).unwrap_or_default() {
            self.route(client, op, reply, None);
        }
    }

    /// The owner's side of a routed operation.
    pub(super) fn exec_owned(&mut self, origin: u32, op: u64, client: Client, body: Op) {
        // Held back: lock requests while holders re-register after a death; everything
        // while a join's hand-overs are on their way or the view is still forming.
        let reclaiming = matches!(body, Op::Lock { .. }) && self.settle_deadline.is_some();
        if reclaiming || self.handover_deadline.is_some() || !self.ready {
            self.deferred.push((origin, op, client, body));
            return;
        }
        if let Some(owner) = routed_key(&body).and_then(|k| ranked(&k, &self.view).first().copied()) {
            if owner != self.me {
                // The origin's view is behind ours (an agent joined): the key moved.
                self.moved_ops.insert((origin, op), owner);
                self.send_peer(owner, &PeerMsg::Forwarded { origin, op, client, body });
                self.send_peer(origin, &PeerMsg::Moved { op, dest: owner });
                return;
            }
        }
        // Nobody waits for the answer to a release answered early (see
        // `route_lock_op`): it travels lazily. (A release that was not answered early
        // is one of a lock its agent did not know held: its error answer may wait
        // `LAZY_FOR` more.)
        let release = matches!(body, Op::Unlock { .. });
        let r = match body {
            Op::BoardGet { key } => Reply::Value(self.board.get(&key).map(|v| BoardValue { version: v.version, value: v.value.to_vec() })),
            Op::BoardPut { key, value } => self.board_write(&key, None, value),
            Op::BoardCas { key, expected, value } => self.board_write(&key, Some(expected), value),
            Op::Lock { name, mode } => match self.locks.acquire(&name, client, mode.into()) {
                Ok(grants) => {
                    self.lock_waiters.insert((name, client), (origin, op));
                    self.send_grants(grants);
                    return;
                }
                Err(e) => Reply::err(ErrorKind::BadRequest, e.to_string()),
            },
            Op::Unlock { name } => match self.locks.release(&name, client) {
                Ok(grants) => {
                    self.send_grants(grants);
                    Reply::Ok
                }
                Err(e) => Reply::err(ErrorKind::NotHeld, e.to_string()),
            },
            Op::Cancel { id } => {
                // Withdraw a waiting lock request of `origin`'s operation `id`.
                let found = self.lock_waiters.iter().find(|(_, v)| **v == (origin, id)).map(|(k, _)| k.clone());
                if let Some((name, c)) = found {
                    if self.locks.waiting(&name).iter().any(|(w, _)| *w == c) {
                        self.lock_waiters.remove(&(name.clone(), c));
                        let grants = self.locks.cancel(&name, c);
                        self.send_peer(origin, &PeerMsg::RoutedReply { op: id, reply: Reply::err(ErrorKind::Cancelled, "cancelled") });
                        self.send_grants(grants);
                    }
                } else if let Some(&dest) = self.moved_ops.get(&(origin, id)) {
                    // The request went on to another agent; so does its cancel.
                    self.send_peer(dest, &PeerMsg::Forwarded { origin, op, client, body: Op::Cancel { id } });
                }
                return;
            }
            Op::MergeOpen { stream, runs } => match self.merges.entry(stream) {
                std::collections::hash_map::Entry::Occupied(e) => {
                    Reply::err(ErrorKind::BadRequest, format!("merge stream {:?} is already open", e.key()))
                }
                std::collections::hash_map::Entry::Vacant(_) if runs == 0 => {
                    Reply::err(ErrorKind::BadRequest, "a merge stream needs at least one run")
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(Merger::new(runs as usize));
                    Reply::Ok
                }
            },
            Op::MergePush { stream, run, records, last } => match self.merges.get_mut(&stream) {
                None => Reply::err(ErrorKind::NotFound, format!("no merge stream {stream:?}")),
                Some(m) => match m.push(run as usize, records).and_then(|_| if last { m.finish(run as usize) } else { Ok(()) }) {
                    Ok(()) => Reply::Ok,
                    Err(e) => Reply::err(ErrorKind::BadRequest, format!("merge stream {stream:?}: {e}")),
                },
            },
            Op::MergePull { stream } => match self.merges.get_mut(&stream) {
                None => Reply::err(ErrorKind::NotFound, format!("no merge stream {stream:?}")),
                Some(m) => {
                    let records = m.pop_ready();
                    let done = m.is_done();
                    if done {
                        self.merges.remove(&stream);
                    }
                    Reply::Records { records, done }
                }
            },
            other => Reply::err(ErrorKind::BadRequest, format!("{} is not an owner-routed operation", other.name())),
        };
        if release {
            self.send_peer_lazy(origin, PeerMsg::RoutedReply { op, reply: r });
        } else {
            self.send_peer(origin, &PeerMsg::RoutedReply { op, reply: r });
        }
    }

    pub(super) fn board_write(&mut self, key: &str, expected: Option<u64>, value: Vec<u8>) -> Reply {
        let res = match expected {
            None => self.board.put(key, Bytes::from(value)),
            Some(e) => self.board.cas(key, e, Bytes::from(value)),
        };
        match res {
            Ok(v) => {
                if let Some(&b) = ranked(key, &self.view).get(1) {
                    let val = self.board.get(key).unwrap().value.to_vec();
                    self.send_peer(b, &PeerMsg::BoardCopy { entries: vec![(key.to_string(), BoardValue { version: v, value: val })] });
                }
                Reply::Version(v)
            }
            Err(BoardError::Conflict { current, .. }) => Reply::Conflict { current },
            Err(e) => Reply::err(ErrorKind::TooLarge, e.to_string()),
        }
    }

    pub(super) fn send_grants(&mut self, grants: Vec<crate::core::locks::Grant>) {
        for g in grants {
            if let Some((origin, op)) = self.lock_waiters.remove(&(g.lock.clone(), g.client)) {
                let alone = !self.locks.has_waiters(&g.lock);
                self.send_peer(origin, &PeerMsg::Granted { op, alone });
            }
        }
    }

    pub(super) fn deliver_assignments(&mut self, a: Vec<Assignment>) {
        for a in a {
            self.send_peer(a.client.node, &PeerMsg::Assigned { op: a.op, task: a.task });
        }
    }

    pub(super) fn publish_state(&mut self) {
        self.state_version += 1;
        let mut processes: Vec<(u32, Activity)> = self.clients.iter().map(|(p, c)| (*p, c.activity)).collect();
        processes.sort_unstable();
        let mut holds = self.store.names();
        for c in self.clients.values() {
            holds.extend(c.holds.iter().cloned());
        }
        holds.sort();
        holds.dedup();
        let s = NodeState {
            node: self.me,
            activity: pstate::summarise(&processes),
            processes,
            holds,
            incarnation: self.incarnation,
            version: self.state_version,
        };
        for n in self.view.clone() {
            self.send_peer(n, &PeerMsg::State(s.clone()));
        }
        // Also on the bulletin board, where a late joiner or another tool can read it.
        let value = encode(&s);
        if value.len() <= crate::core::board::MAX_VALUE {
            self.route(Client::new(self.me, 0), Op::BoardPut { key: format!("gepsea.pstate/{}", self.me), value }, ReplyTo::Discard, None);
        }
    }
}
