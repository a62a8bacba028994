//! When the agent's loop spins instead of sleeping, and when a spinning loop yields its
//! core: a pure policy (the loop feeds it times and what it saw), so that the rule is
//! tested without processes or clocks.
//!
//! Right after work the loop polls without blocking for a while, so that a client's
//! next request is picked up without two thread wake-ups (the port's event thread, then
//! the loop: 30-40 µs each on these VMs). How long depends on what the next thing to
//! arrive is:
//! - after local work only, [`LOCAL`]: a client's next request comes within µs or not
//!   soon;
//! - after serving another agent, [`REMOTE`]: that agent's next request is a network
//!   round trip and its own client's turn away;
//! - with an operation out at another agent, [`AWAITING_PEER`]: its answer is a round
//!   trip away, and sleeping would cost more wake-ups than the wire takes.
//!
//! While remote work is under way, every idle round yields the core: with more
//! busy processes than cores (a client and two agents on this 2-core machine), the
//! process that has to answer next may be waiting for this very core. Local work does
//! not yield: a client placed on the agent's core then waits for the scheduler to move
//! one of them (a yield does not reliably hand the core over; each local request took
//! 15 µs instead of 1 in that placement). Measured on 2 namespace nodes, remote put and
//! lock pair at p50: a yield every round 48-54 and 63-76 µs, every 8th 47-61 and 70-95,
//! every 32nd 64-75 and 119-129.
//!
//! Background messages ([`is_background`]: state gossip, hellos) are not work:
//! nothing follows them soon, and every agent sends them to every other, so with many
//! agents they arrive in bursts. Spinning after each (then with heartbeats too) kept 36
//! agents on this machine's 2 cores busy at about 1 core, and took the cores from the
//! `blast_formatter` processes writing the job's output.

use std::time::{Duration, Instant};

use crate::wire::PeerMsg;

/// Spin after local work.
pub(super) const LOCAL: Duration = Duration::from_micros(50);
/// Spin after work for another agent.
pub(super) const REMOTE: Duration = Duration::from_micros(200);
/// Spin while an operation is out at another agent.
pub(super) const AWAITING_PEER: Duration = Duration::from_micros(500);

/// Whether a message from another agent is background: greetings and gossip that no
/// reply or next request follows, so it does not make the loop spin.
pub(super) fn is_background(m: &PeerMsg) -> bool {
    matches!(m, PeerMsg::State(_) | PeerMsg::Hello { .. } | PeerMsg::HelloAck { .. })
}

/// What a pass of the loop did, from its counts: `handled` things (each message one),
/// `peer` messages from other agents, of which `background`. `None`: nothing but
/// background, not work; otherwise whether some of the work was for another agent.
pub(super) fn pass_work(handled: u64, peer: u64, background: u64) -> Option<bool> {
    (handled > background).then_some(peer > background)
}

#[derive(Debug)]
pub(super) struct SpinPolicy {
    last_work: Instant,
    last_peer_work: Option<Instant>,
}

impl SpinPolicy {
    pub(super) fn new(now: Instant) -> Self {
        SpinPolicy { last_work: now - AWAITING_PEER, last_peer_work: None }
    }

    /// The loop did work (`for_peer`: some of it for another agent).
    pub(super) fn worked(&mut self, now: Instant, for_peer: bool) {
        self.last_work = now;
        if for_peer {
            self.last_peer_work = Some(now);
        }
    }

    fn remote_work(&self, now: Instant, awaiting_peer: bool) -> bool {
        awaiting_peer || self.last_peer_work.is_some_and(|t| now.saturating_duration_since(t) < REMOTE)
    }

    /// Whether to poll without blocking now.
    pub(super) fn spinning(&self, now: Instant, awaiting_peer: bool) -> bool {
        let window = match (awaiting_peer, self.remote_work(now, false)) {
            (true, _) => AWAITING_PEER,
            (false, true) => REMOTE,
            _ => LOCAL,
        };
        now.saturating_duration_since(self.last_work) < window
    }

    /// A spinning round found nothing to do: whether to yield the core now.
    pub(super) fn idle_round(&self, now: Instant, awaiting_peer: bool) -> bool {
        self.remote_work(now, awaiting_peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn a_pass_of_greetings_alone_is_not_work() {
        assert_eq!(pass_work(0, 0, 0), None);
        assert_eq!(pass_work(3, 3, 3), None, "three hellos");
        assert_eq!(pass_work(4, 3, 3), Some(false), "three hellos and a client's request");
        assert_eq!(pass_work(4, 4, 3), Some(true), "three hellos and a routed operation");
        assert_eq!(pass_work(1, 0, 0), Some(false), "a job thread's result");
    }

    #[test]
    fn liveness_and_gossip_are_background_and_operations_are_not() {
        assert!(is_background(&PeerMsg::Hello { node: 1, pid: 2, incarnation: 3 }));
        assert!(is_background(&PeerMsg::HelloAck { node: 1, pid: 2, incarnation: 3 }));
        assert!(!is_background(&PeerMsg::RoutedReply { op: 1, reply: crate::wire::Reply::Ok }));
        assert!(!is_background(&PeerMsg::Take { op: 1, client: crate::core::Client::new(1, 2) }));
    }

    #[test]
    fn idle_from_the_start_sleeps() {
        let t = Instant::now();
        assert!(!SpinPolicy::new(t).spinning(t, false));
    }

    #[test]
    fn local_work_spins_briefly_and_never_yields() {
        let t = Instant::now();
        let mut p = SpinPolicy::new(t);
        p.worked(t, false);
        assert!(p.spinning(t + 49 * US, false));
        assert!(!p.spinning(t + 50 * US, false));
        assert!((0..100).all(|_| !p.idle_round(t + US, false)));
    }

    #[test]
    fn work_for_a_peer_spins_longer_and_yields_when_idle() {
        let t = Instant::now();
        let mut p = SpinPolicy::new(t);
        p.worked(t, true);
        assert!(p.spinning(t + 199 * US, false));
        assert!(!p.spinning(t + 200 * US, false));
        assert!(p.idle_round(t + US, false));
        assert!(p.idle_round(t + 199 * US, false));
        // Later local work spins as local work again once the peer's is long past.
        p.worked(t + 300 * US, false);
        assert!(!p.spinning(t + 351 * US, false));
        assert!((0..16).all(|_| !p.idle_round(t + 310 * US, false)));
    }

    #[test]
    fn an_operation_out_at_a_peer_keeps_the_loop_spinning_and_yielding() {
        let t = Instant::now();
        let mut p = SpinPolicy::new(t);
        p.worked(t, false);
        assert!(p.spinning(t + 499 * US, true));
        assert!(!p.spinning(t + 500 * US, true));
        assert!(p.idle_round(t + US, true));
        // The answer came: local work again.
        assert!(!p.idle_round(t + 2 * US, false));
    }
}
