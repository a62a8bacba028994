//! Requests of clients (local, remote, or the agent's own job threads): dispatch by
//! operation; job threads for work that takes CPU or waits; RMA; global memory.

use super::*;

impl Agent {
    pub(super) fn call(&mut self, c: Call) {
        match c {
            Call::Op { client, op, reply } => self.request(client, op, ReplyTo::Local(reply)),
            Call::Internal { op, reply } => self.internal(op, ReplyTo::Local(reply)),
        }
    }

    pub(super) fn request(&mut self, client: Client, op: Op, reply: ReplyTo) {
        self.requests_served += 1;
        let r = match op {
            Op::Ping => Reply::Ok,
            Op::BoardGet { .. }
            | Op::BoardPut { .. }
            | Op::BoardCas { .. }
            | Op::Lock { .. }
            | Op::Unlock { .. }
            | Op::MergeOpen { .. }
            | Op::MergePush { .. }
            | Op::MergePull { .. } => {
                if let (Op::BoardPut { value, .. } | Op::BoardCas { value, .. }, true) = (&op, true) {
                    if value.len() > crate::core::board::MAX_VALUE {
                        return self.reply(reply, Reply::err(ErrorKind::TooLarge, BoardError::TooLarge { len: value.len() }.to_string()));
                    }
                }
                if matches!(op, Op::Lock { .. } | Op::Unlock { .. }) {
                    return self.route_lock_op(client, op, reply);
                }
                self.route(client, op, reply, None);
                return;
            }
            Op::Subscribe { topic } => self.with_client(client, |c| c.inbox.subscribe(&topic)),
            Op::Unsubscribe { topic } => self.with_client(client, |c| c.inbox.unsubscribe(&topic)),
            Op::Publish { topic, body, dest } => {
                let dests: Vec<u32> = match dest {
                    Dest::All => self.view.clone(),
                    Dest::Nodes(n) => {
                        let missing: Vec<u32> = n.iter().copied().filter(|x| !self.view.contains(x)).collect();
                        if !missing.is_empty() {
                            return self.reply(
                                reply,
                                Reply::err(ErrorKind::Unavailable, format!("nodes {missing:?} are not live agents (view {:?})", self.view)),
                            );
                        }
                        n
                    }
                };
                for (d, a) in self.outbox.publish(&topic, Bytes::from(body), &dests) {
                    self.send_peer(d, &PeerMsg::Advert { publisher: a.publisher, seq: a.seq, topic: a.topic, body: a.body.to_vec() });
                }
                Reply::Ok
            }
            Op::NextAdverts { max, wait_ms } => {
                let (ReplyTo::Client { port, id }, Some(c)) = (&reply, self.clients.get_mut(&client.process)) else {
                    return self.reply(reply, Reply::err(ErrorKind::BadRequest, "only registered processes have mailboxes"));
                };
                let got = take_adverts(&mut c.inbox, max);
                if got.is_empty() && wait_ms > 0 {
                    if c.parked.is_some() {
                        return self.reply(reply, Reply::err(ErrorKind::BadRequest, "a mailbox read is already waiting for this process"));
                    }
                    c.parked = Some((*id, max.max(1), Instant::now() + Duration::from_millis(wait_ms)));
                    let _ = port;
                    return;
                }
                Reply::Adverts(got)
            }
            Op::CachePut { name, data } => {
                let me = self.me;
                return self.job(client, reply, move |s| store_and_register(s, name, data, me));
            }
            Op::CacheGet { name } => {
                if let Some(d) = self.store.get(&name) {
                    Reply::Data(d.to_vec())
                } else {
                    let me = self.me;
                    return self.job(client, reply, move |s| cache_fetch(s, &name, me));
                }
            }
            // Data streaming: bring an object into this node's cache ahead of use (the
            // application starts this and goes on computing; the reply says it is here).
            Op::Prefetch { name } => {
                if self.store.contains(&name) {
                    Reply::Ok
                } else {
                    let me = self.me;
                    return self.job(client, reply, move |s| match cache_fetch(s, &name, me) {
                        Reply::Data(_) => Reply::Ok,
                        other => other,
                    });
                }
            }
            Op::CacheRemove { name } => {
                let had = self.store.remove(&name);
                let me = self.me;
                self.publish_state();
                return self.job(client, reply, move |s| {
                    if !had {
                        return Reply::err(ErrorKind::NotFound, format!("{name:?} is not cached on node {me}"));
                    }
                    match dir_update(s, &name, me, false) {
                        Ok(()) => Reply::Ok,
                        Err(e) => Reply::err(ErrorKind::Failed, e.to_string()),
                    }
                });
            }
            Op::Locate { name } => {
                return self.job(client, reply, move |s| {
                    use crate::api::Api;
                    match s.board_get(&dir_key(&name)) {
                        Ok(v) => Reply::Nodes(holders(v.as_ref().map(|v| v.value.as_slice()))),
                        Err(e) => Reply::err(ErrorKind::Failed, e.to_string()),
                    }
                })
            }
            Op::Swap { name, to } => {
                if !self.view.contains(&to) {
                    return self.reply(reply, Reply::err(ErrorKind::Unavailable, format!("node {to} is not a live agent")));
                }
                let me = self.me;
                return self.job(client, reply, move |s| swap(s, &name, me, to));
            }
            Op::GmaAlloc { node, len } => {
                if node == self.me {
                    self.gma_alloc(client, len)
                } else if !self.view.contains(&node) {
                    Reply::err(ErrorKind::Unavailable, format!("node {node} is not a live agent (view {:?})", self.view))
                } else {
                    let op = self.new_op();
                    self.peer_ops.insert(op, (node, reply));
                    self.send_peer(node, &PeerMsg::GmaAlloc { op, client, len });
                    return;
                }
            }
            Op::GmaFree { ptr } => {
                if ptr.node == self.me {
                    self.gma_free(ptr.region)
                } else {
                    let op = self.new_op();
                    self.peer_ops.insert(op, (ptr.node, reply));
                    self.send_peer(ptr.node, &PeerMsg::GmaFree { op, region: ptr.region });
                    return;
                }
            }
            Op::GmaPut { ptr, offset, data } => {
                if offset.checked_add(data.len() as u64).is_none_or(|end| end > ptr.len) {
                    Reply::err(
                        ErrorKind::BadRequest,
                        format!("put of {} bytes at offset {offset} overruns the block of {} bytes", data.len(), ptr.len),
                    )
                } else if ptr.node == self.me {
                    match self.port.with_region(ptr.region, |r| r[offset as usize..offset as usize + data.len()].copy_from_slice(&data)) {
                        Ok(()) => Reply::Ok,
                        Err(e) => Reply::err(ErrorKind::NotFound, e.to_string()),
                    }
                } else {
                    let r = self.port.put(Addr::new(ptr.node, 0), ptr.region, offset, data);
                    self.rma(r, reply);
                    return;
                }
            }
            Op::GmaGet { ptr, offset, len } => {
                if offset.checked_add(len).is_none_or(|end| end > ptr.len) {
                    Reply::err(
                        ErrorKind::BadRequest,
                        format!("get of {len} bytes at offset {offset} overruns the block of {} bytes", ptr.len),
                    )
                } else if ptr.node == self.me {
                    match self.port.with_region(ptr.region, |r| r[offset as usize..(offset + len) as usize].to_vec()) {
                        Ok(d) => Reply::Data(d),
                        Err(e) => Reply::err(ErrorKind::NotFound, e.to_string()),
                    }
                } else {
                    let r = self.port.get(Addr::new(ptr.node, 0), ptr.region, offset, len as usize);
                    self.rma(r, reply);
                    return;
                }
            }
            Op::SetState { activity, holds } => {
                let r = self.with_client(client, |c| {
                    c.activity = activity;
                    c.holds = holds;
                });
                self.publish_state();
                r
            }
            Op::GlobalState => Reply::States(self.ptable.all()),
            Op::Submit { payload, affinity, urgent } => {
                let id = ((self.me as u64) << 40) | self.next_task;
                self.next_task += 1;
                let task = Task { id, payload, affinity, urgent };
                self.my_tasks.insert(id, task.clone());
                if let Some(s) = self.scheduler_node {
                    self.send_peer(s, &PeerMsg::Submit { task, submitter: self.me });
                }
                Reply::TaskId(id)
            }
            Op::Take { wait_ms } => {
                let op = self.new_op();
                if let ReplyTo::Client { port, id } = &reply {
                    self.cancellable.insert((*port, *id), op);
                }
                self.takes.insert(op, (client, reply, Instant::now() + Duration::from_millis(wait_ms)));
                if let Some(s) = self.scheduler_node {
                    self.send_peer(s, &PeerMsg::Take { op, client });
                }
                return;
            }
            Op::Done { task } => {
                if self.holding.remove(&task).is_none() {
                    Reply::err(ErrorKind::NotHeld, format!("task {task:#x} is not held by a process of node {}", self.me))
                } else {
                    if let Some(s) = self.scheduler_node {
                        self.send_peer(s, &PeerMsg::Done { task });
                    }
                    Reply::Ok
                }
            }
            Op::Place { key, weight } => {
                let none = Reply::err(ErrorKind::Unavailable, "no scheduler elected");
                return self.ask_scheduler(reply, none, |op| PeerMsg::Place { op, key, weight });
            }
            Op::Upcoming { count } => {
                let none = Reply::err(ErrorKind::Unavailable, "no scheduler elected");
                return self.ask_scheduler(reply, none, |op| PeerMsg::Upcoming { op, count });
            }
            // Placements live only in the scheduler: without one there is none to release.
            Op::Release { key } => return self.ask_scheduler(reply, Reply::Ok, |op| PeerMsg::Release { op, key }),
            Op::Scheduler => match self.scheduler_node {
                Some(n) => Reply::Node(n),
                None => Reply::err(ErrorKind::Unavailable, "no scheduler elected"),
            },
            Op::Compress { codec, level, data } => {
                let engine = self.engine.clone();
                return self.job(client, reply, move |_| match engine.compress(&codec, level, &data) {
                    Ok(d) => Reply::Data(d),
                    Err(e) => Reply::err(ErrorKind::Failed, e.to_string()),
                });
            }
            Op::Decompress { codec, data } => {
                let engine = self.engine.clone();
                return self.job(client, reply, move |_| match engine.decompress(&codec, &data) {
                    Ok(d) => Reply::Data(d),
                    Err(e) => Reply::err(ErrorKind::Failed, e.to_string()),
                });
            }
            Op::Plugin { name, body } => return self.run_plugin(client, name, body, reply),
            Op::PluginAt { node, name, body } => {
                if node == self.me {
                    return self.run_plugin(client, name, body, reply);
                }
                if !self.view.contains(&node) {
                    return self.reply(
                        reply,
                        Reply::err(ErrorKind::Unavailable, format!("node {node} is not a live agent (view {:?})", self.view)),
                    );
                }
                let op = self.new_op();
                self.peer_ops.insert(op, (node, reply));
                self.send_peer(node, &PeerMsg::Plugin { op, client, name, body });
                return;
            }
            Op::Cancel { id } => {
                self.cancel(client, id);
                Reply::Ok
            }
        };
        self.reply(reply, r);
    }

    pub(super) fn run_plugin(&mut self, client: Client, name: String, body: Vec<u8>, reply: ReplyTo) {
        let Some(p) = self.registry.get(&name).cloned() else {
            return self.reply(
                reply,
                Reply::err(
                    ErrorKind::UnknownPlugin,
                    format!("no plug-in named {name:?} on node {} (it has: {})", self.me, self.registry.names().join(", ")),
                ),
            );
        };
        let engine = self.engine.clone();
        let node = self.me;
        let scratch = self.runtime_dir.join("scratch");
        self.job(client, reply, move |s| {
            let agent = InProc { client: Client::new(node, 0), ..s.clone() };
            let ctx = Context {
                caller: client,
                node,
                services: s,
                background: Arc::new(s.clone()),
                agent: &agent,
                engine: &engine,
                scratch: &scratch,
            };
            match p.handle(&ctx, &body) {
                Ok(d) => Reply::Data(d),
                Err(crate::plugin::PluginError::BadRequest(m)) => Reply::err(ErrorKind::BadRequest, format!("plug-in {name}: {m}")),
                Err(e) => Reply::err(ErrorKind::Failed, format!("plug-in {name}: {e}")),
            }
        });
    }

    pub(super) fn with_client(&mut self, client: Client, f: impl FnOnce(&mut ClientInfo)) -> Reply {
        match self.clients.get_mut(&client.process) {
            Some(c) => {
                f(c);
                Reply::Ok
            }
            None => Reply::err(ErrorKind::BadRequest, "only registered processes can do this"),
        }
    }

    pub(super) fn cancel(&mut self, client: Client, id: u64) {
        let port = client.process;
        if let Some(c) = self.clients.get_mut(&port) {
            if c.parked.is_some_and(|(p, _, _)| p == id) {
                c.parked = None;
                self.reply(ReplyTo::Client { port, id }, Reply::err(ErrorKind::Cancelled, "cancelled"));
                return;
            }
        }
        for waiting in self.after_release.values_mut() {
            if let Some(i) = waiting.iter().position(|(_, r)| matches!(r, ReplyTo::Client { port: p, id: i } if *p == port && *i == id)) {
                let (_, r) = waiting.remove(i);
                return self.reply(r, Reply::err(ErrorKind::Cancelled, "cancelled"));
            }
        }
        let Some(&op) = self.cancellable.get(&(port, id)) else { return };
        if let Some((_, r, _)) = self.takes.remove(&op) {
            if let Some(s) = self.scheduler_node {
                self.send_peer(s, &PeerMsg::CancelTake { op });
            }
            return self.reply(r, Reply::err(ErrorKind::Cancelled, "cancelled"));
        }
        if let Some(r) = self.routed.get(&op) {
            if matches!(r.op, Op::Lock { .. }) {
                let dest = r.dest;
                self.send_peer(dest, &PeerMsg::Routed { op, client, body: Op::Cancel { id: op } });
            }
        }
    }

    pub(super) fn job(&mut self, client: Client, reply: ReplyTo, work: impl FnOnce(&InProc) -> Reply + Send + 'static) {
        if let ReplyTo::Local(_) = reply {
            // Asked by a job (a plug-in's cache miss, say), which blocks its thread until
            // this is done: queued behind it on any pool thread, it could wait forever.
            // Such jobs (cache fetches, directory updates) start no jobs of their own,
            // so a thread each ends the chain.
            let (inproc, done_tx) = (InProc { client, ..self.nested.0.clone() }, self.nested.1.clone());
            let spawned = std::thread::Builder::new().name("gepsea-nested".into()).spawn(move || {
                let result = run_job(work, &inproc);
                if done_tx.send(JobDone { reply, result }).is_ok() {
                    let _ = inproc.waker.wake();
                }
            });
            if let Err(e) = spawned {
                warn!("node {}: cannot start a thread for a nested job: {e}", self.me);
            }
            return;
        }
        // One client's jobs always go to the same thread: they finish in the order sent.
        // Work asked by another agent never queues behind a local job: that job may be
        // waiting on the very agent that asked (two plug-ins calling each other's node
        // at once would otherwise deadlock when their callers share a port number).
        let half = self.jobs.len() / 2;
        let i = match reply {
            ReplyTo::Peer { .. } => half + (client.node as usize * 31 + client.process as usize) % half,
            _ => client.process as usize % half,
        };
        let _ = self.jobs[i].send(Job { reply, work: Box::new(work), client });
    }

    pub(super) fn rma(&mut self, r: ReqId, reply: ReplyTo) {
        match reply {
            ReplyTo::Client { port, id } => {
                self.net.insert(r, NetOp::Rma { reply_to_port: Some(port), id });
            }
            local => {
                let op = self.new_op();
                self.peer_ops.insert(op, (u32::MAX, local));
                self.net.insert(r, NetOp::Rma { reply_to_port: None, id: op });
            }
        }
    }

    /// Sends `msg(op)` to the scheduler, whose `Reply` to `op` answers `reply`; answers
    /// `none` if no scheduler is elected.
    fn ask_scheduler(&mut self, reply: ReplyTo, none: Reply, msg: impl FnOnce(u64) -> PeerMsg) {
        match self.scheduler_node {
            None => self.reply(reply, none),
            Some(s) => {
                let op = self.new_op();
                self.peer_ops.insert(op, (s, reply));
                self.send_peer(s, &msg(op));
            }
        }
    }

    pub(super) fn new_op(&mut self) -> u64 {
        self.next_op += 1;
        self.next_op
    }

    pub(super) fn internal(&mut self, op: Internal, reply: ReplyTo) {
        let r = match op {
            Internal::LocalGet { name } => match self.store.get(&name) {
                Some(d) => Reply::Data(d.to_vec()),
                None => Reply::err(ErrorKind::NotFound, format!("{name:?} is not cached on node {}", self.me)),
            },
            Internal::StoreLocal { name, data } => match self.store.insert(&name, Bytes::from(data)) {
                Ok(evicted) => {
                    let me = self.me;
                    for e in evicted {
                        self.job(Client::new(me, 0), ReplyTo::Discard, move |s| {
                            let _ = dir_update(s, &e, me, false);
                            Reply::Ok
                        });
                    }
                    self.publish_state();
                    Reply::Ok
                }
                Err(cap) => Reply::err(
                    ErrorKind::TooLarge,
                    format!("{name:?} is larger than the whole cache of node {} ({cap} bytes; raise --cache-bytes)", self.me),
                ),
            },
            Internal::DropLocal { name } => {
                self.store.remove(&name);
                self.publish_state();
                Reply::Ok
            }
            Internal::FetchFrom { node, name } => {
                if !self.view.contains(&node) {
                    Reply::err(ErrorKind::Unavailable, format!("node {node} is not live"))
                } else {
                    let op = self.new_op();
                    self.peer_ops.insert(op, (node, reply));
                    self.send_peer(node, &PeerMsg::Fetch { op, name });
                    return;
                }
            }
            Internal::StoreAt { node, name, data } => {
                let op = self.new_op();
                self.peer_ops.insert(op, (node, reply));
                self.send_peer(node, &PeerMsg::Store { op, name, data });
                return;
            }
        };
        self.reply(reply, r);
    }

    pub(super) fn gma_alloc(&mut self, client: Client, len: u64) -> Reply {
        match self.gma.alloc(client, len) {
            Ok(region) => match self.port.expose(region, len as usize) {
                Ok(()) => Reply::Ptr(GlobalPtr { node: self.me, region, len }),
                Err(e) => {
                    let _ = self.gma.free(region);
                    Reply::err(ErrorKind::Failed, e.to_string())
                }
            },
            Err(e) => Reply::err(ErrorKind::TooLarge, e.to_string()),
        }
    }

    pub(super) fn gma_free(&mut self, region: u64) -> Reply {
        match self.gma.free(region) {
            Ok(()) => {
                let _ = self.port.unexpose(region);
                Reply::Ok
            }
            Err(e) => Reply::err(ErrorKind::NotFound, e.to_string()),
        }
    }
}
