//! Progress: the event thread's loop (epoll through mio), the copies of large messages
//! done outside the lock, and the `State` methods every transport shares (awake
//! accounting, dispatch of readiness events, timers).

use super::*;

/// The most established TCP connections a spinner reads one by one (`State::poll_tcp`);
/// with more, it asks their set which have news. A `read` that finds nothing costs
/// about what the set's `epoll_wait` does, so with few connections reading them saves
/// the `epoll_wait` on each arrival.
pub(super) const READ_EACH_MAX: usize = 4;

/// How often a spinner asks the TCP set whether a full socket has room. The kernel
/// reports room once half of what the socket held has gone, so the other half (a
/// megabyte or more here, ≥ 100 µs of copying for the receiver) still keeps the
/// receiver busy: with a look every 20 µs, alternated streams stayed within their
/// spread, where a look on every pass of the spin (one `epoll_wait` per microsecond or
/// so) took ≈5,000 system calls per 768 MiB streamed, and a look every 20 µs 256.
const ROOM_LOOK_EVERY: Duration = Duration::from_micros(20);

/// How long the event thread queues for the lock held by someone who is not a spinning
/// wait before it looks again whether a wait has started spinning meanwhile, to leave
/// it its events rather than queue on (the holder may be about to call `wait`; see
/// `crate::handover`).
pub(super) const LOCK_SLICE: Duration = Duration::from_micros(50);

/// One readiness event as `epoll` reported it (kept, or left to a spinning wait).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ready {
    pub token: Token,
    pub readable: bool,
    pub writable: bool,
}

impl Ready {
    pub fn of(ev: &mio::event::Event) -> Ready {
        Ready { token: ev.token(), readable: ev.is_readable() || ev.is_read_closed(), writable: ev.is_writable() }
    }
}

/// Carries out the single copies the protocol asked for (see [`crate::cma`]), each
/// outside the port's lock: a 1 MiB copy takes ≈50–90 µs, during which other threads of
/// the process keep communicating (and an awake event thread takes the next copy).
///
/// Waking the sleeping event thread to copy in parallel was tried: streaming 1 MiB
/// messages stayed at 9–11 GB/s, the rate a single copy already reaches with 16
/// receive buffers in turn (the memory system, not a core, is the limit), so it is not
/// done.
pub(super) fn run_copies(st: &mut MutexGuard<'_, State>) {
    let mut ran = false;
    // Writes first: the receiver is copying its own part meanwhile.
    while let Some(job) = st.proto.next_write() {
        let dst = job.dst();
        let verified = st.is_peer_process(dst, job.remote.pid);
        let r = if verified {
            MutexGuard::unlocked(st, || crate::cma::write_from(job.remote.pid, job.remote.addr, &job.data))
        } else {
            Err(io::Error::other(format!("{dst} named process {}, which is not the process connected as {dst}", job.remote.pid)))
        };
        if let Err(e) = &r {
            st.log_error(format!(
                "writing {} bytes into {dst}'s buffer failed ({e}); sending them through the shared-memory ring instead",
                job.data.len()
            ));
        }
        st.proto.write_done(job, r.is_ok());
        ran = true;
    }
    if ran || st.proto.has_copies() {
        // What the copies' peers wait for leaves before the copies start: a split
        // copy's request for the sender's help (or the parts run one after the other),
        // a write's report.
        st.flush_all();
    }
    while let Some(mut job) = st.proto.next_copy() {
        // Only from the process at the other end of the connection, as the kernel
        // names it: a pid from another pid namespace (or a forged one) would name some
        // other process here.
        let src = job.src();
        let verified = st.is_peer_process(src, job.remote.pid);
        if !verified {
            st.stats.single_copies_not_from_peer += 1;
            st.log_error(format!("single copy offered by {src} as process {}, which is not the process connected as {src}; using the shared-memory ring instead", job.remote.pid));
            st.proto.copy_done(job, false);
            ran = true;
            continue;
        }
        let mut buf = std::mem::take(&mut job.buf);
        let r = MutexGuard::unlocked(st, || crate::cma::read_into(job.remote.pid, job.remote.addr, job.len, &mut buf));
        job.buf = buf;
        if let Err(e) = &r {
            st.log_error(format!(
                "single copy of {} bytes from process {} failed ({e}); using the shared-memory ring instead",
                job.len, job.remote.pid
            ));
        }
        st.proto.copy_done(job, r.is_ok());
        ran = true;
    }
    if ran {
        st.flush_all();
    }
}

/// Drains every transport, then carries out the copies that asked for.
pub(super) fn progress_all(st: &mut MutexGuard<'_, State>) {
    st.progress();
    run_copies(st);
}

/// A look of the event thread that found the application still communicating: counted
/// (`PortStats::busy_looks`), and the interval to the next look doubled and returned,
/// from one lease up to [`MAX_LEASE_BACKOFF`]. Doubling keeps how late the event thread
/// takes over after a burst of calls ends to about the burst's own length (a short
/// burst is checked on soon), and the cap to at most that. (A lease longer than the cap
/// is its own cap: `clamp` panics, and took the event thread with it, when its bounds
/// cross.)
fn busy_look(sh: &Shared, backoff: &mut Duration) -> Duration {
    sh.busy_looks.fetch_add(1, Ordering::Relaxed);
    *backoff = (*backoff * 2).clamp(sh.lease, MAX_LEASE_BACKOFF.max(sh.lease));
    *backoff
}

pub(super) fn event_thread(sh: Arc<Shared>) {
    let mut events = Events::with_capacity(256);
    let mut ready: Vec<Ready> = Vec::new();
    // How long after this look the next one comes while the application keeps
    // communicating (`busy_look`); only this thread plans its looks. Back to one lease
    // once a look finds the lease expired (the burst ended).
    let mut backoff = Duration::ZERO;
    loop {
        {
            let mut poll = sh.poll.lock();
            if let Err(e) = poll.poll(&mut events, None) {
                if e.kind() != io::ErrorKind::Interrupted {
                    warn!("epoll failed: {e}");
                }
            }
        }
        if sh.shutdown.load(Ordering::SeqCst) {
            return;
        }
        ready.extend(events.iter().map(Ready::of));
        let timer = ready.iter().any(|r| r.token == TIMER);
        // A spinning wait holds the lock and makes progress itself: leave it the events
        // rather than queue for the lock (`handover`).
        let st = loop {
            if let Some(st) = sh.st.try_lock() {
                break Some(st);
            }
            if sh.handover.offer(&mut ready) {
                // The wait serves the events and runs the deadlines that fell due; the
                // rest of a pass (the lease's expiry, the next look) is still ours, so
                // look again after the back-off (a spinning wait is a burst still going
                // on, as a renewed lease is), or sooner if the wait set a deadline
                // meanwhile, without the lock. (A waker's event handed over without this
                // left the look it asked for unplanned: a port whose application then
                // stopped calling stayed awake, and its peers never rang it. The wait
                // arming the timer instead put a system call and a VM exit on its path:
                // 1 MiB one way 189 against 178 µs.)
                let next = busy_look(&sh, &mut backoff);
                if let Some(t) = &sh.timer {
                    if timer {
                        t.clear();
                    }
                    t.arm_unless_sooner(next);
                }
                break None;
            }
            if let Some(st) = sh.st.try_lock_for(LOCK_SLICE) {
                break Some(st);
            }
        };
        let Some(mut st) = st else { continue };
        st.set_awake(true);
        for r in ready.drain(..) {
            st.handle_ready(r);
        }
        progress_all(&mut st);
        st.timers();
        let now = Instant::now();
        let mut lease_check = None;
        if let Some(until) = st.lease {
            if until <= now {
                // The application went quiet: stop claiming to be awake for it, and
                // watch the sockets its last wait kept.
                st.lease = None;
                backoff = Duration::ZERO;
                if std::mem::take(&mut st.quiet_lingers) {
                    st.unquiet_tcp();
                }
                if st.set_awake(false) {
                    st.set_awake(true);
                    progress_all(&mut st);
                    st.set_awake(false);
                }
            } else {
                // Renewed since we last looked: the application is busy communicating.
                // Look again less and less often (each look is a wake-up that takes a
                // core from the spinning application).
                lease_check = Some(until + busy_look(&sh, &mut backoff));
            }
        } else if st.in_wait > st.waiters {
            // A wait is spinning: it took the lease and leaves a new one when it
            // returns. Look again after the back-off, as for a renewed lease, rather
            // than forget the lease: that return would then have to wake this thread
            // just to re-arm the look (`Port::leave_awake`). A client's calls to its
            // agent that take longer than this pass did so about every other call (a
            // remote board put loop on 2 cores: 7,188 wake-ups in 0.5 s, each waiting
            // 20-30 µs for a core the spinning processes held, then taking it).
            lease_check = Some(now + busy_look(&sh, &mut backoff));
        }
        // (A look that finds neither a lease nor a spinning wait keeps the back-off.
        // Resetting it there too, the agents' ports, woken by requests between their
        // own bursts, looked more often: a remote lock pair's p50 came out at
        // 0.76-1.22× its target in 9 of 51 rounds of `gepsea-bench agent`; kept, in 1
        // of 30 (0.90), and with the 1 ms cap in none of 66.)
        while st.set_awake(false) {
            st.set_awake(true);
            progress_all(&mut st);
        }
        st.update_app_bell();
        st.kick = false;
        if st.waiters > 0 {
            sh.cv.notify_all();
        }
        let wake = [st.next_timer(), lease_check].into_iter().flatten().min();
        st.thread_wake_at = wake;
        if let Some(t) = &st.timer {
            t.arm(wake.map(|t| t.saturating_duration_since(Instant::now())));
        }
    }
}

/// Serves, from a spinning wait, the events the event thread left it
/// (`crate::handover`), as the event thread's pass would have, the timer's due
/// deadlines included (the event thread planned its next look itself). Whether TCP
/// connections were among them (see `Port::serve_and_take_tcp`).
pub(super) fn serve_handed_over(sh: &Shared, st: &mut MutexGuard<'_, State>) -> bool {
    let mut ready = Vec::new();
    sh.handover.take(&mut ready);
    let tcp = ready.iter().any(|r| r.token == TCP_SET);
    let timer = ready.iter().any(|r| r.token == TIMER);
    // The event thread planned its next look itself, without the lock: within the cap
    // on the back-off, or at a sooner setting it found. Say so here, so that a deadline
    // set from now on within that cap arms the timer (`State::wake_event_thread_by`):
    // a stale, passed `thread_wake_at` would have it wait for the look, up to the cap late.
    let now = Instant::now();
    let cap = now + MAX_LEASE_BACKOFF;
    st.thread_wake_at = Some(match st.thread_wake_at {
        Some(t) if t > now && t < cap => t,
        _ => cap,
    });
    for r in ready.into_iter().filter(|r| r.token != TIMER) {
        st.handle_event(r.token, r.readable, r.writable);
    }
    if timer {
        st.timers();
    }
    if st.waiters > 0 {
        sh.cv.notify_all();
    }
    tcp
}

/// Inline progress: poll the descriptors once (the caller does not hold the state lock).
pub(super) fn poll_once(sh: &Shared, timeout: Option<Duration>) {
    let mut events = Events::with_capacity(256);
    let timeout = {
        let st = sh.st.lock();
        match (st.next_timer(), timeout) {
            (Some(t), Some(d)) => Some(t.saturating_duration_since(Instant::now()).min(d)),
            (Some(t), None) => Some(t.saturating_duration_since(Instant::now())),
            (None, d) => d,
        }
    };
    {
        let mut poll = sh.poll.lock();
        let _ = poll.poll(&mut events, timeout);
    }
    let mut st = sh.st.lock();
    for ev in events.iter() {
        st.handle_ready(Ready::of(ev));
    }
    st.timers();
    progress_all(&mut st);
}

impl State {
    /// Counts a progressing thread in or out. Returns, when the last one leaves, whether
    /// work arrived meanwhile (then the caller must not sleep).
    pub(super) fn set_awake(&mut self, awake: bool) -> bool {
        if awake {
            self.awake += 1;
            if self.awake == 1 {
                for c in self.shm.values() {
                    c.set_awake(true);
                }
            }
            false
        } else {
            self.awake -= 1;
            if self.awake > 0 {
                return false;
            }
            let mut pending = false;
            for c in self.shm.values_mut() {
                c.set_awake(false);
            }
            // Pairs with the peer's fence between publishing (data or space) and
            // reading our awake flag: either it sees us asleep and rings, or we see
            // its work here.
            std::sync::atomic::fence(Ordering::SeqCst);
            for c in self.shm.values_mut() {
                // Space freed while we were awake came without a doorbell too: a sender
                // that went to sleep on a full ring would otherwise miss it (this was a
                // 100 ms stall, ended only by the sleeping waiter's time slice).
                pending |= c.has_unannounced_work();
                // And space we freed and have not told a sleeping sender of.
                c.settle_space(true);
            }
            self.space_owed = false;
            pending
        }
    }

    /// Rings the peers that sleep waiting for space this side freed and has not looked
    /// at yet ([`crate::shm::ShmConn::owe_space`]).
    pub(super) fn settle_space(&mut self) {
        if std::mem::take(&mut self.space_owed) {
            for c in self.shm.values_mut() {
                c.settle_space(false);
            }
        }
    }

    /// Pushes a new send out at once; if that finished it, hands its id back marked
    /// [`PRESETTLED`] instead of leaving the result to be collected. Not when the
    /// application reads events: those name the plain id.
    pub(super) fn settled_at_once(&mut self, id: ReqId) -> ReqId {
        if self.proto.events_enabled() {
            return id;
        }
        self.flush_all();
        match self.proto.take_if_sent(id) {
            true => id | PRESETTLED,
            false => id,
        }
    }

    /// Makes the event thread wake by `at` at the latest, by arming its timer when it
    /// would otherwise sleep past `at` (no-op inline, where every wait polls itself).
    pub(super) fn wake_event_thread_by(&mut self, at: Instant) {
        let Some(timer) = &self.timer else { return };
        if self.thread_wake_at.is_none_or(|t| t > at) {
            self.thread_wake_at = Some(at);
            timer.arm(Some(at.saturating_duration_since(Instant::now())));
        }
    }

    pub(super) fn log_error(&mut self, msg: String) {
        warn!("{}: {msg}", self.me);
        self.stats.recent_errors.push(msg);
        if self.stats.recent_errors.len() > 16 {
            self.stats.recent_errors.remove(0);
        }
    }

    pub(super) fn update_app_bell(&mut self) {
        let pending = self.proto.events_pending() > 0;
        if pending && !self.app_bell_set {
            self.app_bell.ring();
            self.app_bell_set = true;
        } else if !pending && self.app_bell_set {
            self.app_bell.clear();
            self.app_bell_set = false;
        }
    }

    /// Drains every inbound ring and pushes every queued frame out.
    pub(super) fn progress(&mut self) {
        for i in 0..self.shm_ids.len() {
            if let Some(&id) = self.shm_ids.get(i) {
                self.drain_shm(id);
            }
        }
        self.flush_all();
    }

    /// Non-blocking reads of the TCP connections, for spinners. With a few, each
    /// established one is read (a `read` each, the fewest system calls when data
    /// came); with more, only those the set (`tcp_set`) has edges for. While the set
    /// is out of the event thread's watch (`quiet_tcp`), or there is no event thread,
    /// and a connection is still being set up, or one is full (`TcpConn::is_full`), the
    /// set's edges are taken here in any case: they may be its handshake's, or the room
    /// the full one waits for, which nothing else would report before this wait sleeps.
    pub(super) fn poll_tcp(&mut self) {
        if self.tcp.is_empty() {
            return;
        }
        let established = self.tcp.values().filter(|c| c.state == ConnState::Established).count();
        let read_each = established <= READ_EACH_MAX;
        let mut edges_needed = established < self.tcp.len();
        if !edges_needed && self.tcp.values().any(|c| c.is_full()) {
            let now = Instant::now();
            if now >= self.next_room_look {
                self.next_room_look = now + ROOM_LOOK_EVERY;
                edges_needed = true;
            }
        }
        if read_each {
            let mut ids = std::mem::take(&mut self.scratch_ids);
            ids.extend(self.tcp.iter().filter(|(_, c)| c.state == ConnState::Established).map(|(id, _)| *id));
            for id in ids.drain(..) {
                self.tcp_readable(id);
            }
            self.scratch_ids = ids;
        }
        // Without an event thread, nobody else takes the set's edges while this spins.
        let thread_watches = self.tcp_set.is_watched() && self.cfg.progress == Progress::Thread;
        if !read_each || (edges_needed && !thread_watches) {
            self.drain_tcp_set();
        }
    }

    /// Serves every edge waiting in the TCP set.
    pub(super) fn drain_tcp_set(&mut self) {
        let mut edges = std::mem::take(&mut self.tcp_edges);
        loop {
            let mut more = false;
            if !self.tcp_set.take_edges(&mut edges, &mut more) && edges.is_empty() {
                break;
            }
            for (token, readable, writable) in edges.drain(..) {
                self.handle_event(token, readable, writable);
            }
            if !more {
                break;
            }
        }
        self.tcp_edges = edges;
    }

    /// Whether `pid` is the process the kernel reports at the other end of our
    /// shared-memory connection with `peer` (the only process a single copy may read
    /// from or write into).
    pub(super) fn is_peer_process(&self, peer: Addr, pid: u32) -> bool {
        self.shm.values().any(|c| c.peer == peer && c.peer_pid == Some(pid))
    }

    /// Cheap check for the spin loop: anything in a ring, or queued to send where it
    /// can go? Output for a peer behind a full socket waits for the kernel to report
    /// room, which the spin's look at the sockets (`poll_tcp`) finds: counting it as
    /// work sent the spin round its progress pass without ever reaching that look (a
    /// stream's sender spun 18 ms without writing).
    pub(super) fn has_work(&mut self) -> bool {
        (self.proto.has_output() && !self.output_waits_for_room()) || self.shm.values_mut().any(|c| c.rx.has_data())
    }

    /// Whether every peer with output queued is a remote one whose socket is full.
    fn output_waits_for_room(&mut self) -> bool {
        if !self.tcp.values().any(|c| c.is_full()) {
            return false;
        }
        let mut peers = std::mem::take(&mut self.scratch);
        self.proto.dirty_peers_into(&mut peers);
        let (me, links, tcp) = (self.me, &self.links, &self.tcp);
        let full =
            |p: &Addr| p.node != me.node && links.get(p).and_then(|l| l.conn).and_then(|cid| tcp.get(&cid)).is_some_and(|c| c.is_full());
        let waiting = peers.iter().all(full);
        peers.clear();
        self.scratch = peers;
        waiting
    }

    pub(super) fn output_settled(&mut self) -> bool {
        self.flush_all();
        !self.proto.has_output()
            && self.shm.values().all(|c| c.tx.is_drained())
            && self.tcp.values().all(|c| c.queued() == 0)
            && self.links.values().all(|l| {
                l.send.unacked() == 0 || l.conn.is_none() && l.down_since.is_some_and(|t| t.elapsed() > self.cfg.reconnect_timeout)
            })
    }

    /// What the event thread does with one readiness event.
    pub(super) fn handle_ready(&mut self, r: Ready) {
        if r.token == TIMER {
            if let Some(t) = &self.timer {
                t.clear();
            }
            return;
        }
        self.handle_event(r.token, r.readable, r.writable);
    }

    pub(super) fn handle_event(&mut self, token: Token, readable: bool, writable: bool) {
        match token {
            WAKER => {}
            UNIX_LISTENER => self.accept_unix(),
            TCP_LISTENER => self.accept_tcp(),
            TCP_SET => self.drain_tcp_set(),
            Token(t) if t >= FIRST_CONN => {
                let id = (t - FIRST_CONN) / 4;
                match (t - FIRST_CONN) % 4 {
                    0 => {
                        if let Some(c) = self.shm.get(&id) {
                            c.my_bell.clear();
                        }
                        self.drain_shm(id);
                        if let Some(p) = self.shm.get(&id).map(|c| c.peer) {
                            self.flush(p);
                        }
                    }
                    1 => self.check_shm_alive(id),
                    2 => {
                        if writable {
                            if let Some(c) = self.tcp.get_mut(&id) {
                                c.room_reported();
                            }
                            self.tcp_writable(id);
                        }
                        if readable {
                            self.tcp_readable(id);
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }

    pub(super) fn timers(&mut self) {
        let now = Instant::now();
        let due: Vec<Addr> = self.shm_retry.iter().filter(|(_, (_, next))| *next <= now).map(|(p, _)| *p).collect();
        for p in due {
            self.flush_shm(p);
        }
        let acks: Vec<Addr> = self.timed_links().filter(|(_, l)| l.ack_due.is_some_and(|t| t <= now)).map(|(p, _)| p).collect();
        for p in acks {
            self.send_ack(p);
        }
        self.expire_reconnects(now);
        let retry: Vec<Addr> =
            self.timed_links().filter(|(_, l)| l.conn.is_none() && l.retry_at.is_some_and(|t| t <= now)).map(|(p, _)| p).collect();
        for p in retry {
            // Reconnect while anything depends on the peer (until `reconnect_timeout`
            // declares it failed); an idle link may stay down, unless links are kept up.
            let wants =
                self.cfg.keepalive.is_some() || self.links[&p].send.unacked() > 0 || self.proto.is_dirty(p) || self.proto.waits_on(p);
            if wants {
                self.connect_tcp(p);
            } else if let Some(l) = self.links.get_mut(&p) {
                l.retry_at = None;
                l.down_since = None;
            }
        }
        // Links with no deadline left leave the set (a link given up is gone).
        let State { timed, links, .. } = self;
        timed.retain(|p| links.get(p).is_some_and(|l| l.ack_due.is_some() || l.retry_at.is_some() || l.down_since.is_some()));
    }

    /// The links that may have a deadline ([`State::timed`]).
    fn timed_links(&self) -> impl Iterator<Item = (Addr, &Link)> {
        self.timed.iter().filter_map(|p| self.links.get(p).map(|l| (*p, l)))
    }

    pub(super) fn next_timer(&self) -> Option<Instant> {
        let links =
            self.timed_links().flat_map(|(_, l)| [l.ack_due, if l.conn.is_none() { l.retry_at } else { None }, self.reconnect_deadline(l)]);
        links.flatten().chain(self.shm_retry.values().map(|(_, next)| *next)).min()
    }

    /// When a reconnection attempt still under way on a link that went down gives up:
    /// a connect to a host that vanished gets no answer at all, and the kernel would
    /// retry its SYN for minutes.
    fn reconnect_deadline(&self, l: &Link) -> Option<Instant> {
        let conn = self.tcp.get(&l.conn?)?;
        (conn.state != ConnState::Established).then_some(l.down_since? + self.cfg.reconnect_timeout)
    }

    /// Reconnection attempts past their deadline fail (`link_down` then gives up on
    /// the peer).
    fn expire_reconnects(&mut self, now: Instant) {
        let expired: Vec<usize> =
            self.timed_links().filter(|(_, l)| self.reconnect_deadline(l).is_some_and(|t| t <= now)).filter_map(|(_, l)| l.conn).collect();
        for id in expired {
            self.conn_lost(id, "reconnecting timed out");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The event thread, woken while a wait spins holding the lock (here the test holds
    /// it and never lets go), leaves its events to that wait rather than queue for the
    /// lock: it used to block until the wait let go.
    #[test]
    fn an_event_thread_woken_while_a_wait_spins_leaves_it_its_events() {
        let ns = format!("handover{}", std::process::id());
        let port = Port::open(PortConfig::new(&ns, Addr::new(1, 1))).unwrap();
        let sh = port.sh.clone();
        {
            let mut st = sh.st.lock();
            sh.handover.spin_start();
            sh.waker.wake().unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while !sh.handover.take_pending() {
                assert!(Instant::now() < deadline, "the event thread left nothing to the spinning wait");
                std::thread::yield_now();
            }
            // A look the event thread planned before, now passed: stale.
            let before = Instant::now();
            st.thread_wake_at = Some(before - Duration::from_millis(5));
            serve_handed_over(&sh, &mut st);
            assert!(!sh.handover.spin_end(), "served once");
            // The event thread looks again within the back-off's cap, and a deadline
            // set within it is the timer's (not left to that look).
            let planned = st.thread_wake_at.expect("the event thread's next look is known");
            assert!(planned > before && planned <= Instant::now() + MAX_LEASE_BACKOFF, "{planned:?}");
            let soon = Instant::now() + Duration::from_micros(100);
            st.wake_event_thread_by(soon);
            assert_eq!(st.thread_wake_at, Some(soon));
        }
        drop(port);
        let _ = std::fs::remove_dir_all(namespace_dir(&ns));
    }
}
