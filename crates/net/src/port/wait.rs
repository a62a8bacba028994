//! The core of `wait`: spin (polling the rings, reading and writing the TCP
//! connections it took, checksumming ahead, serving what the event thread left it),
//! then sleep until the event thread (or, inline, its own poll) makes progress; and the
//! lease a call leaves when it returns (see "Progress and wake-ups" in
//! `docs/architecture.md`).

use super::*;

/// Bytes a spinning waiter checksums ahead between two looks at its sockets
/// (`proto::ahead`): ≈1 µs of CRC32C, so a CTS that comes meanwhile waits at most that.
const SUM_AHEAD_STEP: usize = 64 << 10;

impl Port {
    /// Keeps the port awake for `lease` after a call returns (see
    /// [`PortConfig::lease`]) when the call was part of a burst (it started within a
    /// lease of the previous one's return); makes sure somebody expires the lease.
    ///
    /// A call after a quiet spell (the application computed) leaves no lease: the port
    /// goes to sleep at once and peers ring its doorbell. Expiring a lease needs the
    /// event thread's timer, and arming a timer that fires sooner than anything else on
    /// the CPU reprograms the local APIC timer — a VM exit that costs 6–13 µs on these
    /// KVM guests, which was most of the `wait` after a compute phase.
    pub(super) fn leave_awake(&self, st: &mut MutexGuard<'_, State>, started: Instant, now: Instant) {
        let burst = st.last_return.is_some_and(|t| started.saturating_duration_since(t) <= self.sh.lease);
        st.last_return = Some(now);
        if self.sh.progress == Progress::Inline {
            // No event thread: the lease lasts until the next call, which releases it
            // before it sleeps.
            st.lease = Some(now);
            return;
        }
        if !burst {
            // Declare sleep; anything that slipped in unannounced meanwhile is handled
            // here, as nobody rang for it.
            while st.set_awake(false) {
                st.set_awake(true);
                progress_all(st);
            }
            return;
        }
        let until = now + self.sh.lease;
        st.lease = Some(until);
        // Any look the event thread already plans within the back-off will do: it
        // re-reads the lease then.
        if st.thread_wake_at.is_none_or(|t| t > until + MAX_LEASE_BACKOFF) {
            st.thread_wake_at = Some(until);
            st.stats.lease_wakeups += 1;
            let _ = self.sh.waker.wake();
        }
    }

    /// A timer was armed outside the event thread: make sure the event thread wakes
    /// for it.
    pub(super) fn kick_if_needed(&self, st: &mut State) {
        if st.kick {
            st.kick = false;
            if let Some(t) = st.next_timer() {
                st.wake_event_thread_by(t);
            }
        }
    }

    /// Serves the events the event thread left this spinning wait, if any (`handover`). When
    /// its TCP connections were among them, the wait takes the connections from the
    /// event thread (`State::quiet_tcp`, as for a transfer under way): the wait reads
    /// them itself anyway, and each further segment would wake the event thread only
    /// to leave one more event here, taking a core from the spinning processes. Whether
    /// it took them, `quiet` is set (the wait then writes what they take too, and gives
    /// them back as any quiet wait does).
    fn serve_and_take_tcp(&self, st: &mut MutexGuard<'_, State>, quiet: &mut bool) {
        if !self.sh.handover.take_pending() {
            return;
        }
        let tcp = serve_handed_over(&self.sh, st);
        if tcp && !*quiet && self.sh.progress == Progress::Thread {
            st.quiet_tcp();
            *quiet = true;
        }
    }

    /// The core wait loop: spin (polling the rings) for `spin`, then sleep until the
    /// event thread (or, inline, our own poll) makes progress.
    pub(super) fn wait_until<R>(&self, timeout: Duration, mut done: impl FnMut(&mut State) -> Option<R>) -> Option<R> {
        let mut st = self.sh.st.lock();
        st.in_wait += 1;
        self.sh.handover.spin_start();
        let r = self.wait_locked(&mut st, timeout, &mut done);
        if self.sh.handover.spin_end() {
            serve_handed_over(&self.sh, &mut st);
        }
        st.in_wait -= 1;
        r
    }

    fn wait_locked<R>(
        &self,
        st: &mut MutexGuard<'_, State>,
        timeout: Duration,
        done: &mut impl FnMut(&mut State) -> Option<R>,
    ) -> Option<R> {
        let started = Instant::now();
        let deadline = started.checked_add(timeout).unwrap_or(started + FOREVER);
        // The latest clock reading: one per pass, not one per use (a reading costs
        // ≈16 ns, a sizeable share of a small message's path).
        let mut now = started;
        st.uncork();
        // What the last wait's receives owe (it returned without looking): the message
        // this wait is for is still on its way, so the fence is off its path.
        st.settle_space();
        // Already finished (the event thread did the work while the application
        // computed): hand it over without touching the rings or the awake flags, whose
        // cache lines have gone cold meanwhile.
        if let Some(r) = done(st) {
            st.last_return = Some(started);
            return Some(r);
        }
        if st.lease.take().is_none() {
            st.set_awake(true);
        }
        let mut spin_until = started + self.sh.spin;
        if let Some(t) = st.answer_spin_until.take() {
            spin_until = spin_until.max(t);
        }
        let moved_before = st.proto.bulk_bytes_moved();
        // Rendezvous bytes in flight when the spin was last extended, and when: it is
        // extended again only if a transfer began, or moved on fast enough to be worth
        // a core (`spin_extension`), so a stalled or slow peer is not spun for.
        let mut extended_for: Option<SpinMark> = None;
        // This waiter took the TCP sockets from the event thread (`State::quiet_tcp`),
        // or inherited them from the wait before it (`State::quiet_lingers`).
        let mut quiet = std::mem::take(&mut st.quiet_lingers);
        loop {
            self.serve_and_take_tcp(st, &mut quiet);
            progress_all(st);
            self.kick_if_needed(st);
            if let Some(r) = done(st) {
                st.flush_all();
                st.update_app_bell();
                self.leave_awake(st, started, now);
                st.answer_spin_until = answer_spin(st.proto.bulk_bytes_moved() - moved_before).map(|d| now + d);
                if quiet {
                    if st.lease.is_some() && self.sh.progress == Progress::Thread {
                        // Within a burst: the next call is likely soon.
                        st.quiet_lingers = true;
                    } else {
                        st.unquiet_tcp();
                    }
                }
                return Some(r);
            }
            now = Instant::now();
            if now >= deadline {
                if quiet {
                    st.unquiet_tcp();
                }
                self.leave_awake(st, started, now);
                return None;
            }
            if now >= spin_until {
                // A large transfer under way takes longer than the spin: the peer is
                // copying, and sleeping now would add two wake-ups (the event thread's,
                // then ours: 30-40 µs each here) to each message. Spin for about as
                // long as the bytes take. A transfer that began while we spun (the
                // peer's announcement came in) counts too, and so do eager messages
                // held back for credits: a stream faster than its receiver waits for
                // each return of credits, and a sender that slept through them left
                // its writes to the event thread (64 KiB TCP streams 2.2-2.8 GB/s
                // against 4.3-5.7 with a longer spin, cubic loopback).
                let seen = SpinMark::of(&st.proto, now);
                if let Some(more) = spin_extension(extended_for, seen) {
                    extended_for = Some(seen);
                    spin_until = now + more;
                    if !quiet && self.sh.progress == Progress::Thread {
                        st.quiet_tcp();
                        quiet = true;
                    }
                }
            }
            let extended = extended_for.is_some();
            if now < spin_until {
                // A rendezvous send awaits its CTS: checksum a step of its pieces now
                // rather than after they are written (`proto::ahead`); once per pass
                // (output waiting for a connection keeps the spin below from starting),
                // then between looks at the sockets.
                st.proto.sum_ahead(SUM_AHEAD_STEP);
                // Spin without re-running the whole progress pass until there is
                // something to do (one load per ring), releasing the lock every few
                // rounds so that other threads of the process can get in.
                let seen = st.proto.completions();
                let mut n = 0u32;
                loop {
                    std::hint::spin_loop();
                    n = n.wrapping_add(1);
                    if n.is_multiple_of(16) {
                        st.proto.sum_ahead(SUM_AHEAD_STEP);
                        MutexGuard::unlocked(st, || {});
                        // A spinning waiter reads its TCP sockets itself: the reply is
                        // handled here instead of waking the event thread and then us.
                        st.poll_tcp();
                        self.serve_and_take_tcp(st, &mut quiet);
                        if quiet || self.sh.progress == Progress::Inline {
                            st.flush_tcp_backlog();
                        }
                        now = Instant::now();
                        if now >= spin_until {
                            break;
                        }
                        let snooze = self.sh.snooze_after.is_some_and(|s| now.saturating_duration_since(started) > s);
                        if extended || snooze {
                            // Spinning on behalf of a long transfer, or for longer than
                            // a peer on this machine takes to answer when it has a core
                            // (`PortConfig::snooze_after`): let anything else runnable
                            // on this core (the peer that is to answer, another
                            // process's event thread doing the copy) go first.
                            MutexGuard::unlocked(st, std::thread::yield_now);
                        }
                    }
                    if st.proto.completions() != seen || st.has_work() {
                        break;
                    }
                }
                continue;
            }
            if quiet {
                // Going to sleep: the event thread watches the sockets again.
                st.unquiet_tcp();
                quiet = false;
            }
            if st.set_awake(false) {
                // Data slipped in while we declared sleep: go round again.
                st.set_awake(true);
                continue;
            }
            let slice = deadline.min(now + Duration::from_millis(100));
            match self.sh.progress {
                Progress::Thread => {
                    if self.sh.handover.spin_end() {
                        // Left for this wait as it stopped spinning: serve them, and
                        // look again before sleeping.
                        serve_handed_over(&self.sh, st);
                        self.sh.handover.spin_start();
                        st.set_awake(true);
                        continue;
                    }
                    st.waiters += 1;
                    self.sh.cv.wait_until(st, slice);
                    st.waiters -= 1;
                    self.sh.handover.spin_start();
                }
                Progress::Inline => {
                    MutexGuard::unlocked(st, || poll_once(&self.sh, Some(slice - now)));
                }
            }
            st.set_awake(true);
        }
    }
}
