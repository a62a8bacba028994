//! How much is under way: the measures the port's `wait` reads to decide how long to
//! spin for a transfer (`spin_extension` in `port`): rendezvous bytes in flight
//! and moved, eager bytes held back for credits and released.

use super::*;

impl Proto {
    /// Bytes of rendezvous messages under way (sent and not yet acknowledged, or
    /// matched and not yet received): how long a waiter may expect to wait.
    pub fn bulk_bytes_in_flight(&self) -> usize {
        self.reqs
            .running()
            .map(|(_, r)| match r {
                Req::SendRts { data, .. } | Req::SendSplit { data, .. } => data.len(),
                Req::RecvSplit(r) => r.remaining(),
                Req::RecvData { total, got, .. } => total - got,
                Req::RecvCopy { total, .. } => *total,
                _ => 0,
            })
            .sum()
    }

    /// Rendezvous bytes moved so far (pieces written or received, single copies made):
    /// with [`Proto::bulk_bytes_in_flight`], how fast the transfers under way move.
    pub fn bulk_bytes_moved(&self) -> u64 {
        self.bulk_moved
    }

    /// Bytes of eager messages still in their queues, counted up to what one window of
    /// credits lets go (`credits × eager_threshold`). In a port, frames leave as soon
    /// as credits allow, so these are the ones held back for their receivers' credits:
    /// a sender that streams faster than its receiver takes messages in waits for
    /// credits, which come back as the receiver takes them (every half window), and
    /// a return releases at most a window. With [`Proto::eager_bytes_released`], how
    /// fast they leave.
    pub fn eager_bytes_stalled(&self) -> usize {
        let window = self.cfg.eager_threshold.saturating_mul(self.cfg.credits as usize);
        let mut stalled = 0;
        for q in self.peers.values().flat_map(|p| p.msgs.iter()) {
            for out in q.iter().filter(|o| o.frame.header.kind == Kind::Eager) {
                stalled += out.frame.payload.len();
                if stalled >= window {
                    return window;
                }
            }
        }
        stalled
    }

    /// Payload bytes of eager messages that have left their queue (credits allowing)
    /// so far.
    pub fn eager_bytes_released(&self) -> u64 {
        self.eager_released
    }
}
