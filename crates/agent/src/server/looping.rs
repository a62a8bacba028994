//! The agent's loop: when it spins and when it sleeps in `epoll`, and one pass over
//! everything that may have happened (job threads' calls and results, the port's
//! events, messages to itself, deadlines). See the module docs of `server` and
//! `spin` for why it spins, and `docs/architecture.md` ("Idle cost and the request
//! path") for what each part of a pass costs.

use super::*;

/// The message counts before a pass, to tell afterwards what kind of work it did.
struct Seen {
    peer_messages: u64,
    background: u64,
}

impl Seen {
    /// `None` if the pass handled nothing but background messages (greetings, state
    /// gossip: see `spin::is_background`), which do not make the loop spin; otherwise
    /// whether some of its work was for another agent.
    fn work(&self, agent: &Agent, handled: usize) -> Option<bool> {
        spin::pass_work(handled as u64, agent.peer_messages - self.peer_messages, agent.background_messages - self.background)
    }
}

impl Agent {
    /// Serves until [`Shutdown::trigger`].
    pub fn run(mut self) -> Result<(), AgentError> {
        let mut events = Events::with_capacity(256);
        // Spin, then sleep (`spin` says when). While spinning the port knows it is
        // polled (clients need not ring its doorbell), and the registration sockets are
        // looked at every few rounds only: an `epoll_wait` per round was a third of a
        // local request's cost.
        const ROUNDS_PER_EPOLL: u32 = 16;
        const CHECKS_PER_PASS: u32 = 64;
        let mut spin = SpinPolicy::new(Instant::now());
        let mut polling = false;
        let mut round = 0u32;
        while !self.shutdown.is_set() {
            // One clock reading per round (a fifth of the spinning loop's time went to
            // reading it three times).
            let now = Instant::now();
            let awaiting_peer = !self.routed.is_empty() || !self.peer_ops.is_empty();
            let spinning = spin.spinning(now, awaiting_peer);
            if spinning != polling {
                polling = spinning;
                if spinning {
                    self.port.start_polling();
                } else {
                    self.port.stop_polling();
                }
            }
            round = round.wrapping_add(1);
            let seen = self.seen();
            if spinning && !round.is_multiple_of(ROUNDS_PER_EPOLL) {
                let mut local_news = false;
                if !spin.idle_round(now, awaiting_peer) {
                    // Local work only: between full passes (each reads the clock and
                    // every TCP connection) look at what a process on this node or a
                    // job thread would have sent, as a waiter spins on its rings. A
                    // full pass per look put ≈0.1 µs between a request's arrival and
                    // its being seen. Remote work keeps a pass (and a yield) per round:
                    // see `spin`.
                    for _ in 0..CHECKS_PER_PASS {
                        if self.has_local_news() {
                            local_news = true;
                            break;
                        }
                        std::hint::spin_loop();
                    }
                }
                // Local news is served before the TCP connections are read (a system
                // call each: an agent with peers made every local request wait for
                // them); they are read on the next pass, and every 4th pass however
                // busy local clients keep the loop.
                let handled = self.turn(!local_news || round.is_multiple_of(4), now);
                if let Some(for_peer) = seen.work(&self, handled) {
                    spin.worked(now, for_peer);
                } else if spin.idle_round(now, awaiting_peer) {
                    std::thread::yield_now();
                }
                continue;
            }
            let timeout = if spinning { Duration::ZERO } else { self.next_timeout() };
            if !timeout.is_zero() {
                // About to sleep: nothing is held back over a sleep.
                self.flush_lazy();
            }
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(AgentError::Io { context: "waiting for events".into(), source: e });
            }
            // The port's and the waker's descriptors only say that the pass below has
            // something to take; whether that was work is the pass's to say.
            let mut sessions = false;
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => {
                        sessions = true;
                        self.accept();
                    }
                    WAKER | PORT_EVENTS => {}
                    t => {
                        sessions = true;
                        self.session_ready(t);
                    }
                }
            }
            let now = Instant::now();
            let handled = self.turn(spinning, now);
            match seen.work(&self, handled) {
                Some(for_peer) => spin.worked(now, for_peer),
                None if sessions => spin.worked(now, false),
                None => {}
            }
        }
        // A last word to every peer, so that they drop this node at once: seen as a
        // lost connection, it kept them reconnecting for their reconnect timeout (3 s),
        // and a job's master waited that long for its agent to see the others gone.
        for n in self.view.clone() {
            if n != self.me {
                self.send_peer(n, &PeerMsg::Leaving);
            }
        }
        self.flush_lazy();
        info!("agent of node {} stopping", self.me);
        let _ = std::fs::remove_dir_all(self.runtime_dir.join("scratch"));
        Ok(())
    }

    /// One pass over everything that may have happened. `read_tcp`: the loop is not
    /// going to block, so it reads the TCP connections itself rather than wait for the
    /// port's event thread to be woken by them. The port comes first: a client's
    /// request is what a spinning loop most often finds. Returns how many things it
    /// handled (events, calls, results, messages to itself).
    fn turn(&mut self, read_tcp: bool, now: Instant) -> usize {
        let mut handled = 0;
        loop {
            let before = handled;
            // All of the port's events at once: taken one by one, each would ring and
            // clear the port's event descriptor (two system calls per request).
            let mut evs = std::mem::take(&mut self.port_events);
            if read_tcp && handled == 0 {
                self.port.poll_events(&mut evs);
            } else {
                self.port.drain_events(&mut evs);
            }
            for ev in evs.drain(..) {
                handled += 1;
                match ev {
                    Event::Completed(id) => self.net_completed(id),
                    Event::PeerFailed { peer, reason } => self.peer_failed(peer, &reason),
                    _ => {}
                }
            }
            self.port_events = evs;
            while let Ok(c) = self.calls_rx.try_recv() {
                handled += 1;
                self.call(c);
            }
            while let Ok(d) = self.done_rx.try_recv() {
                handled += 1;
                self.reply(d.reply, d.result);
            }
            while let Some(m) = self.loopback.pop_front() {
                handled += 1;
                self.peer_msg(self.me, m);
            }
            while let Some((from, m)) = self.loopback_from.pop_front() {
                handled += 1;
                self.peer_msg(from, m);
            }
            if handled == before {
                break;
            }
        }
        self.timers(now);
        if self.corked {
            self.corked = false;
            self.port.uncork();
        }
        handled
    }

    fn seen(&self) -> Seen {
        Seen { peer_messages: self.peer_messages, background: self.background_messages }
    }

    /// Whether a pass would find local work: a request or reply on shared memory, a
    /// port event, a job thread's call or result.
    fn has_local_news(&self) -> bool {
        self.port.has_news()
            || !self.calls_rx.is_empty()
            || !self.done_rx.is_empty()
            || !self.loopback.is_empty()
            || !self.loopback_from.is_empty()
    }

    fn next_timeout(&self) -> Duration {
        let now = Instant::now();
        let mut t = self.next_discovery;
        for c in self.clients.values() {
            if let Some((_, _, d)) = c.parked {
                t = t.min(d);
            }
        }
        for (_, _, d) in self.takes.values() {
            t = t.min(*d);
        }
        let retry = self.retry_routes.iter().map(|(d, _)| *d).min();
        for d in [self.settle_deadline, self.sched_settle_deadline, self.handover_deadline, retry].into_iter().flatten() {
            t = t.min(d);
        }
        t.saturating_duration_since(now)
    }

    /// Deadlines due at `now` (read when the pass began: timers are milliseconds apart).
    fn timers(&mut self, now: Instant) {
        if self.lazy_deadline.is_some_and(|d| d <= now) {
            self.flush_lazy();
        }
        if now >= self.next_discovery {
            self.next_discovery = now + self.cfg.discovery;
            self.discover();
            let unknown: Vec<u32> = self.known.iter().filter(|(n, v)| v.is_none() && !self.dead.contains(n)).map(|(n, _)| *n).collect();
            for n in unknown {
                self.send_peer(n, &PeerMsg::Hello { node: self.me, pid: std::process::id(), incarnation: self.incarnation });
            }
        }
        let expired: Vec<u32> = self.clients.iter().filter(|(_, c)| c.parked.is_some_and(|(_, _, d)| d <= now)).map(|(p, _)| *p).collect();
        for p in expired {
            if let Some((id, _, _)) = self.clients.get_mut(&p).and_then(|c| c.parked.take()) {
                self.reply(ReplyTo::Client { port: p, id }, Reply::Adverts(Vec::new()));
            }
        }
        let expired: Vec<u64> = self.takes.iter().filter(|(_, (_, _, d))| *d <= now).map(|(o, _)| *o).collect();
        for op in expired {
            let (_, reply, _) = self.takes.remove(&op).unwrap();
            if let Some(s) = self.scheduler_node {
                self.send_peer(s, &PeerMsg::CancelTake { op });
            }
            self.reply(reply, Reply::Task(None));
        }
        if self.sched_settle_deadline.is_some_and(|d| d <= now) {
            self.sched_settle_deadline = None;
            if let Some(s) = &mut self.scheduler {
                if s.settling() {
                    warn!("node {}: scheduler stops waiting for rejoins", self.me);
                    let a = s.settle();
                    self.deliver_assignments(a);
                }
            }
        }
        if self.settle_deadline.is_some_and(|d| d <= now) {
            warn!("node {}: giving up waiting for lock re-registration from {:?}", self.me, self.awaiting_reclaim);
            self.awaiting_reclaim.clear();
            self.settle_deadline = None;
            self.settled();
        }
        if self.retry_routes.iter().any(|(d, _)| *d <= now) {
            let (due, later) = std::mem::take(&mut self.retry_routes).into_iter().partition(|(d, _)| *d <= now);
            self.retry_routes = later;
            for (_, op) in due {
                if let Some(r) = self.routed.remove(&op) {
                    self.route(r.client, r.op, r.reply, Some(op));
                }
            }
        }
        if self.handover_deadline.is_some_and(|d| d <= now) {
            warn!("node {}: giving up waiting for hand-overs from {:?}", self.me, self.awaiting_handover);
            self.awaiting_handover.clear();
            self.handover_deadline = None;
            self.settled();
        }
    }
}
