//! Agent-to-agent messages: the receiving side of the peer protocol.

use super::*;
use crate::primitives::balance::PlaceError;

impl Agent {
    pub(super) fn peer_msg(&mut self, from: u32, m: PeerMsg) {
        // First: from an agent not in the view, any other message makes it a member.
        if m == PeerMsg::Leaving {
            self.peer_left(from);
            return;
        }
        if from != self.me && !matches!(m, PeerMsg::Hello { .. } | PeerMsg::HelloAck { .. }) && !self.view.contains(&from) {
            if self.dead.contains(&from) {
                return;
            }
            // A message from an agent we have not heard say hello (its hello is in
            // flight behind, or we learnt of it only now): it is alive.
            self.peer_alive(from, 0, 0);
        }
        if self.scheduler.is_none()
            && matches!(
                m,
                PeerMsg::Submit { .. }
                    | PeerMsg::Take { .. }
                    | PeerMsg::CancelTake { .. }
                    | PeerMsg::Done { .. }
                    | PeerMsg::Giveback { .. }
                    | PeerMsg::Rejoin { .. }
                    | PeerMsg::Place { .. }
                    | PeerMsg::Release { .. }
                    | PeerMsg::Upcoming { .. }
            )
        {
            // Sent by an agent that already sees us as the scheduler: keep it until we do.
            self.early_sched.push((from, m));
            return;
        }
        match m {
            PeerMsg::Leaving => unreachable!("handled first"),
            PeerMsg::Hello { node, pid, incarnation } => {
                self.send_peer(node, &PeerMsg::HelloAck { node: self.me, pid: std::process::id(), incarnation: self.incarnation });
                self.peer_alive(node, pid, incarnation);
            }
            PeerMsg::HelloAck { node, pid, incarnation } => self.peer_alive(node, pid, incarnation),
            PeerMsg::Routed { op, client, body } => self.exec_owned(from, op, client, body),
            PeerMsg::Granted { op, alone } => self.routed_reply(op, Reply::Ok, alone),
            PeerMsg::RoutedReply { op, reply } => self.routed_reply(op, reply, false),
            PeerMsg::BoardCopy { entries } => {
                self.board
                    .adopt(entries.into_iter().map(|(k, v)| (k, Versioned { version: v.version, value: Bytes::from(v.value) })).collect());
            }
            PeerMsg::Reclaim { view, locks } => {
                // A lock whose owner changed again since (an agent joined) is
                // re-registered with its owner now, in a reclaim that counts for nothing.
                let mut onward: BTreeMap<u32, Vec<(String, Client, LockMode)>> = BTreeMap::new();
                for (name, client, mode) in locks {
                    match ranked(&lock_key(&name), &self.view).first() {
                        Some(&o) if o != self.me && self.handover_owed.is_empty() => {
                            onward.entry(o).or_default().push((name, client, mode))
                        }
                        _ => self.locks.reclaim(&name, client, mode.into()),
                    }
                }
                for (o, locks) in onward {
                    self.send_peer(o, &PeerMsg::Reclaim { view: Vec::new(), locks });
                }
                if view.is_empty() {
                    // Forwarded (above): nobody waits for it.
                } else if view == self.reclaim_view && self.settle_deadline.is_some() {
                    self.awaiting_reclaim.remove(&from);
                } else {
                    self.early_reclaims.push((view, from));
                }
                if self.awaiting_reclaim.is_empty() && self.settle_deadline.is_some() {
                    self.settled();
                }
            }
            PeerMsg::Advert { publisher, seq, topic, body } => {
                let (ack, ready) = self.seq.admit(Advert { publisher, seq, topic, body: Bytes::from(body) });
                if !ready.is_empty() {
                    let mut wake = Vec::new();
                    for (p, c) in self.clients.iter_mut() {
                        c.inbox.deliver(ready.iter().cloned());
                        if c.parked.is_some() && c.inbox.unread() > 0 {
                            wake.push(*p);
                        }
                    }
                    for p in wake {
                        let c = self.clients.get_mut(&p).unwrap();
                        let (id, max, _) = c.parked.take().unwrap();
                        let got = take_adverts(&mut c.inbox, max);
                        self.reply(ReplyTo::Client { port: p, id }, Reply::Adverts(got));
                    }
                }
                self.send_peer(from, &PeerMsg::AdvertAck { seq: ack });
            }
            PeerMsg::AdvertAck { seq } => self.outbox.on_ack(from, seq),
            PeerMsg::ProcessDied { client } => {
                let grants = self.locks.process_died(client);
                self.lock_waiters.retain(|(_, c), _| *c != client);
                self.send_grants(grants);
                for r in self.gma.forget(|c| *c == client) {
                    let _ = self.port.unexpose(r);
                }
                if let Some(s) = &mut self.scheduler {
                    let a = s.forget(|c| *c == client);
                    self.deliver_assignments(a);
                }
            }
            PeerMsg::State(s) => {
                let (node, holds) = (s.node, s.holds.clone());
                if self.ptable.update(s) {
                    if let Some(sched) = &mut self.scheduler {
                        sched.set_holdings(node, holds);
                    }
                }
            }
            PeerMsg::Submit { task, submitter } => {
                if let Some(s) = &mut self.scheduler {
                    let a = s.submit(task, submitter);
                    self.deliver_assignments(a);
                }
            }
            PeerMsg::Take { op, client } => {
                if let Some(s) = &mut self.scheduler {
                    let a = s.take(op, client);
                    self.deliver_assignments(a);
                }
            }
            PeerMsg::Place { op, key, weight } => {
                let live = self.view.clone();
                let reply = match &mut self.scheduler {
                    Some(s) => match s.placement.place(&key, weight, &live, from) {
                        Ok(n) => Reply::Node(n),
                        Err(e @ PlaceError::NoLiveAgent(_)) => Reply::err(ErrorKind::Unavailable, e.to_string()),
                        Err(e @ PlaceError::TooMany) => Reply::err(ErrorKind::TooLarge, e.to_string()),
                    },
                    None => Reply::err(ErrorKind::Unavailable, format!("node {} is not the scheduler", self.me)),
                };
                self.send_peer(from, &PeerMsg::Reply { op, reply });
            }
            PeerMsg::Upcoming { op, count } => {
                let reply = match &self.scheduler {
                    // At most a queue's worth: the count is the asker's to choose.
                    Some(s) => Reply::Names(s.upcoming(from, (count as usize).min(1024))),
                    None => Reply::err(ErrorKind::Unavailable, format!("node {} is not the scheduler", self.me)),
                };
                self.send_peer(from, &PeerMsg::Reply { op, reply });
            }
            PeerMsg::Release { op, key } => {
                if let Some(s) = &mut self.scheduler {
                    s.placement.release(&key);
                }
                // Not the scheduler (any more): its placements went with the old one.
                self.send_peer(from, &PeerMsg::Reply { op, reply: Reply::Ok });
            }
            PeerMsg::CancelTake { op } => {
                if let Some(s) = &mut self.scheduler {
                    s.cancel_take(op, from);
                }
            }
            PeerMsg::Done { task } => {
                if let Some(s) = &mut self.scheduler {
                    if let Some(sub) = s.done(task) {
                        self.send_peer(sub, &PeerMsg::TaskFinished { task });
                    }
                }
            }
            PeerMsg::Giveback { task } => {
                if let Some(s) = &mut self.scheduler {
                    let a = s.giveback(task);
                    self.deliver_assignments(a);
                }
            }
            PeerMsg::Rejoin { view: _, submitted, holding, takes } => {
                if let Some(s) = &mut self.scheduler {
                    let a = s.rejoin(from, submitted, holding, takes);
                    self.deliver_assignments(a);
                }
            }
            PeerMsg::Assigned { op, task } => match self.takes.remove(&op) {
                Some((client, reply, _)) => {
                    self.holding.insert(task.id, client);
                    self.reply(reply, Reply::Task(Some(task)));
                }
                None => {
                    // The take timed out or was cancelled while the task was on its way.
                    if let Some(s) = self.scheduler_node {
                        self.send_peer(s, &PeerMsg::Giveback { task: task.id });
                    }
                }
            },
            PeerMsg::TaskFinished { task } => {
                self.my_tasks.remove(&task);
            }
            PeerMsg::Fetch { op, name } => {
                let reply = match self.store.get(&name) {
                    Some(d) => Reply::Data(d.to_vec()),
                    None => Reply::err(ErrorKind::NotFound, format!("{name:?} is not cached on node {}", self.me)),
                };
                self.send_peer(from, &PeerMsg::Reply { op, reply });
            }
            PeerMsg::Store { op, name, data } => {
                let me = self.me;
                self.job(Client::new(me, 0), ReplyTo::Peer { node: from, op }, move |s| store_and_register(s, name, data, me));
            }
            PeerMsg::GmaAlloc { op, client, len } => {
                let reply = self.gma_alloc(client, len);
                self.send_peer(from, &PeerMsg::Reply { op, reply });
            }
            PeerMsg::GmaFree { op, region } => {
                let reply = self.gma_free(region);
                self.send_peer(from, &PeerMsg::Reply { op, reply });
            }
            PeerMsg::Plugin { op, client, name, body } => self.run_plugin(client, name, body, ReplyTo::Peer { node: from, op }),
            PeerMsg::Reply { op, reply } => {
                if let Some((_, to)) = self.peer_ops.remove(&op) {
                    self.reply(to, reply);
                }
            }
            PeerMsg::Handover { locks, merges } => self.handover_in(from, locks, merges),
            PeerMsg::Forwarded { origin, op, client, body } => self.exec_owned(origin, op, client, body),
            PeerMsg::Moved { op, dest } => {
                if let Some(r) = self.routed.get_mut(&op) {
                    r.dest = dest;
                    if self.dead.contains(&dest) {
                        // Forwarded by an agent that has not seen `dest` die yet: ask
                        // again a little later, when it may have.
                        self.retry_routes.push((Instant::now() + self.cfg.discovery, op));
                    }
                }
            }
        }
    }

    /// The owner's answer to routed operation `op`; `alone`: a lock granted with
    /// nobody else waiting for it (`PeerMsg::Granted`).
    fn routed_reply(&mut self, op: u64, reply: Reply, alone: bool) {
        if let Some(r) = self.routed.remove(&op) {
            if let Op::Unlock { name } = &r.op {
                self.released(op, name, r.client, &reply);
            }
            if reply == Reply::Ok {
                match &r.op {
                    Op::Lock { name, mode } => {
                        if self.clients.contains_key(&r.client.process) || r.client.process == 0 {
                            self.held_locks.insert((name.clone(), r.client), HeldLock { mode: *mode, alone });
                        } else {
                            // Granted to a process that died meanwhile.
                            self.route(r.client, Op::Unlock { name: name.clone() }, ReplyTo::Discard, None);
                        }
                    }
                    Op::Unlock { name } => {
                        self.held_locks.remove(&(name.clone(), r.client));
                    }
                    _ => {}
                }
            }
            self.reply(r.reply, reply);
        }
    }
}
