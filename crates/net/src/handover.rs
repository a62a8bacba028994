//! Events handed from a port's event thread to a spinning `wait` instead of its
//! queueing for the lock (used by `port`; loom-checked, `handover_loom`).
//!
//! A `wait` that spins holds the port's lock nearly all the time: it lets go for an
//! instant every few rounds of its spin, and not at all while it has output to push. An
//! event thread woken meanwhile (its planned look at the lease, a socket turning
//! writable) used to block on that lock. `parking_lot`'s eventual fairness then handed
//! it the lock at one of those instants, after half a millisecond or more, and the wait
//! stood still until the event thread had a core, ran its pass and let go: on 2 cores
//! both held by spinning processes, milliseconds. Streaming 1 MiB messages over TCP
//! loopback, a timestamped trace showed the sender writing nothing for 2–10 ms at a
//! time, once or twice per 256 MiB, with its event thread blocked on the lock for the
//! whole stream and every unlock of the spinning wait paying a `futex` wake for it.
//!
//! Now the event thread only tries the lock. When a wait is spinning
//! (`Handover::spinning` counts them) it leaves its events here and goes back to
//! `epoll`; the wait serves them at its next look (`serve_handed_over` in
//! `port::event_loop`), holding the lock anyway. When they include its TCP
//! connections, the wait takes those from the event thread for the rest
//! of its spin, as it does for a transfer under way (`Port::serve_and_take_tcp`), so
//! that further segments do not wake the event thread once each to leave one more
//! event. A wait that stops spinning (to sleep, or to return) takes what was left first
//! ([`Handover::spin_end`]), and the event thread takes its events back when it finds
//! no wait spinning any more right after leaving them. A holder of the lock that is not
//! a spinning wait (a send, a test) is queued for a `LOCK_SLICE` at a time, looking
//! in between whether it has started to spin. The wait runs the deadlines that fell
//! due; the rest of the event thread's pass (the lease's expiry, its next look) stays
//! the event thread's, so after every hand-over it arms its own timer within the
//! back-off cap. Armed by the wait, it put a `timerfd_settime`, a VM exit on these
//! guests, on the wait's path at every hand-over, and a 1 MiB ping-pong over TCP lost
//! 6 % (189 against 178 µs one way, 16 alternated rounds).
//!
//! The count of spinning waits changes on every wait's path, under the port's lock: a
//! plain store when a wait starts spinning (an event thread that misses it queues for
//! the lock a `LOCK_SLICE` and looks again), one locked decrement when it stops, the
//! fence that keeps its look at what was left from passing the decrement (without it
//! a wait could miss events left in that instant while the event thread still saw it
//! spinning; an `epoll` timeout on the event thread's side to cover that woke it once
//! more per hand-over).

#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, AtomicU32, Ordering};
#[cfg(loom)]
use loom::sync::Mutex;
#[cfg(not(loom))]
use parking_lot::Mutex;
#[cfg(not(loom))]
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// The two sides rely on `SeqCst` accesses being in one total order (the wait's
/// decrement before its look at `pending`, the event thread's store to `pending` before
/// its look at the count): whichever comes second in that order sees the other. Loom
/// models `SeqCst` accesses as acquire/release only and finds the lost hand-over that
/// order rules out; a `SeqCst` fence, which it does model, stands in for it there.
#[inline(always)]
fn sc_fence_for_loom() {
    #[cfg(loom)]
    loom::sync::atomic::fence(Ordering::SeqCst);
}

/// Events left by the event thread for a spinning wait (see the module docs).
pub struct Handover<E> {
    /// Waits spinning now (inside `Port::wait_until`, not asleep on the condition
    /// variable). Changed only under the port's lock.
    spinning: AtomicU32,
    /// `events` holds something a spinning wait is to serve.
    pending: AtomicBool,
    events: Mutex<Vec<E>>,
}

impl<E> Default for Handover<E> {
    fn default() -> Self {
        Handover { spinning: AtomicU32::new(0), pending: AtomicBool::new(false), events: Mutex::new(Vec::new()) }
    }
}

impl<E> Handover<E> {
    /// A wait starts (or, woken, resumes) spinning. Under the port's lock.
    pub fn spin_start(&self) {
        self.spinning.store(self.spinning.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// A wait stops spinning (it goes to sleep, or returns); under the port's lock.
    /// Whether events were left for it, which it serves now.
    #[must_use]
    pub fn spin_end(&self) -> bool {
        self.spinning.fetch_sub(1, Ordering::SeqCst);
        sc_fence_for_loom();
        self.take_pending()
    }

    /// Whether events were left to serve (claims them: a second call answers `false`).
    #[must_use]
    pub fn take_pending(&self) -> bool {
        self.pending.load(Ordering::SeqCst) && self.pending.swap(false, Ordering::AcqRel)
    }

    /// The event thread, which did not get the lock: leaves `ready` for a spinning wait
    /// and answers `true`, or answers `false` when no wait is spinning (any more), with
    /// `ready` holding every event still unserved, its own and any left before: the
    /// event thread takes the lock and serves them itself.
    pub fn offer(&self, ready: &mut Vec<E>) -> bool {
        if self.spinning.load(Ordering::SeqCst) == 0 {
            if self.take_pending() {
                self.take(ready);
            }
            return false;
        }
        self.events().append(ready);
        self.pending.store(true, Ordering::SeqCst);
        sc_fence_for_loom();
        if self.spinning.load(Ordering::SeqCst) > 0 {
            return true;
        }
        // The wait stopped spinning meanwhile. If it claimed the events it serves them;
        // otherwise they are ours again.
        if self.take_pending() {
            self.take(ready);
            return false;
        }
        true
    }

    /// Moves the events left here into `out`.
    pub fn take(&self, out: &mut Vec<E>) {
        out.append(&mut self.events());
    }

    #[cfg(not(loom))]
    fn events(&self) -> parking_lot::MutexGuard<'_, Vec<E>> {
        self.events.lock()
    }

    #[cfg(loom)]
    fn events(&self) -> loom::sync::MutexGuard<'_, Vec<E>> {
        self.events.lock().unwrap()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn ev(t: usize) -> usize {
        t
    }

    #[test]
    fn with_no_wait_spinning_the_event_thread_keeps_its_events() {
        let h = Handover::<usize>::default();
        let mut ready = vec![ev(1)];
        assert!(!h.offer(&mut ready));
        assert_eq!(ready, vec![ev(1)]);
        assert!(!h.take_pending());
    }

    #[test]
    fn a_spinning_wait_gets_the_events_once_and_in_order() {
        let h = Handover::<usize>::default();
        h.spin_start();
        let mut first = vec![ev(1), ev(2)];
        assert!(h.offer(&mut first));
        assert!(first.is_empty());
        let mut second = vec![ev(3)];
        assert!(h.offer(&mut second));
        assert!(h.take_pending());
        assert!(!h.take_pending(), "claimed once");
        let mut out = Vec::new();
        h.take(&mut out);
        assert_eq!(out, vec![ev(1), ev(2), ev(3)]);
        assert!(!h.spin_end(), "nothing left when it stops");
    }

    #[test]
    fn a_wait_that_stops_spinning_serves_what_was_left_for_it() {
        let h = Handover::<usize>::default();
        h.spin_start();
        assert!(h.offer(&mut vec![ev(7)]));
        assert!(h.spin_end(), "the wait must serve the event before it sleeps or returns");
        let mut out = Vec::new();
        h.take(&mut out);
        assert_eq!(out, vec![ev(7)]);
        // No wait spins now: the next events stay with the event thread.
        let mut ready = vec![ev(8)];
        assert!(!h.offer(&mut ready));
        assert_eq!(ready, vec![ev(8)]);
    }

    /// Every event offered while waits come and go is served exactly once, by the
    /// event thread or by a wait, whatever the interleaving.
    #[test]
    fn no_event_is_lost_or_served_twice_across_threads() {
        use std::sync::Arc;
        let h = Arc::new(Handover::<usize>::default());
        let served = Arc::new(Mutex::new(Vec::new()));
        let waits = {
            let (h, served) = (h.clone(), served.clone());
            std::thread::spawn(move || {
                for _ in 0..20_000 {
                    h.spin_start();
                    for _ in 0..3 {
                        if h.take_pending() {
                            h.take(&mut served.lock());
                        }
                    }
                    if h.spin_end() {
                        h.take(&mut served.lock());
                    }
                }
            })
        };
        let mut mine = Vec::new();
        for t in 0..20_000 {
            let mut ready = vec![ev(t)];
            if !h.offer(&mut ready) {
                mine.append(&mut ready);
            }
        }
        waits.join().unwrap();
        assert!(!h.take_pending(), "every event left for a wait was served by a wait");
        let mut all: Vec<usize> = served.lock().iter().chain(mine.iter()).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..20_000).collect::<Vec<_>>());
    }
}

/// The protocol under the loom model checker: whatever the interleaving of an event
/// thread leaving events and a wait that spins, serves and stops, each event is served
/// once, and none is left when both are done.
#[cfg(all(test, loom))]
mod handover_loom {
    use super::*;
    use loom::sync::Arc;

    #[test]
    fn handover_loom_no_event_lost_or_served_twice() {
        loom::model(|| {
            let h = Arc::new(Handover::<u32>::default());
            h.spin_start();
            let wait = {
                let h = h.clone();
                loom::thread::spawn(move || {
                    let mut served = Vec::new();
                    if h.take_pending() {
                        h.take(&mut served);
                    }
                    if h.spin_end() {
                        h.take(&mut served);
                    }
                    served
                })
            };
            let mut kept = Vec::new();
            for e in [1, 2] {
                let mut ready = vec![e];
                if !h.offer(&mut ready) {
                    kept.append(&mut ready);
                }
            }
            let served = wait.join().unwrap();
            let mut all = served.clone();
            all.extend(kept.iter().copied());
            all.sort_unstable();
            assert_eq!(all, vec![1, 2], "served {served:?} kept {kept:?}");
            assert!(!h.take_pending());
        });
    }
}
