//! Exactly-once, in-order delivery over a link whose connection may be replaced.
//!
//! TCP alone is reliable only while one connection lives; when it drops, bytes in flight
//! (in kernel buffers on either side) are lost without a trace. So each direction of a
//! link numbers its frames (1, 2, 3, ...) and keeps every frame until the peer
//! acknowledges it cumulatively. After a reconnect the two sides exchange the last
//! sequence number each received in order (`Hello`/`HelloAck`), the sender replays
//! everything after it, and the receiver discards anything it has already seen. The
//! application sees neither loss nor duplication.
//!
//! Both halves are pure state machines: no sockets, no clocks, unit- and property-tested.

use std::collections::VecDeque;

use crate::frame::Frame;

/// Sender half: stamps sequence numbers and retains frames until acknowledged.
#[derive(Default, Debug)]
pub struct SendWindow {
    next_seq: u64,
    acked: u64,
    unacked: VecDeque<Frame>,
    unacked_bytes: usize,
}

impl SendWindow {
    /// An empty window; the first frame gets sequence number 1.
    pub fn new() -> Self {
        SendWindow { next_seq: 1, acked: 0, unacked: VecDeque::new(), unacked_bytes: 0 }
    }

    /// Assigns the next sequence number to `frame` and retains a copy (the payload is
    /// reference-counted, so this does not copy data).
    pub fn stamp(&mut self, mut frame: Frame) -> Frame {
        frame.header.seq = self.next_seq;
        self.next_seq += 1;
        self.unacked_bytes += frame.payload.len();
        self.unacked.push_back(frame.clone());
        frame
    }

    /// The peer has received everything up to and including `ack`. Returns how many
    /// frames were released. Acks never move backwards; a stale one is ignored.
    pub fn on_ack(&mut self, ack: u64) -> Result<usize, ReliableError> {
        if ack >= self.next_seq {
            return Err(ReliableError::AckFromFuture { ack, sent: self.next_seq - 1 });
        }
        let mut n = 0;
        while let Some(f) = self.unacked.front() {
            if f.header.seq > ack {
                break;
            }
            self.unacked_bytes -= f.payload.len();
            self.unacked.pop_front();
            n += 1;
        }
        self.acked = self.acked.max(ack);
        Ok(n)
    }

    /// Frames to send again on a new connection, given that the peer has everything up to
    /// `peer_has`.
    pub fn replay(&mut self, peer_has: u64) -> Result<Vec<Frame>, ReliableError> {
        self.on_ack(peer_has)?;
        Ok(self.unacked.iter().cloned().collect())
    }

    /// Frames sent and not yet acknowledged.
    pub fn unacked(&self) -> usize {
        self.unacked.len()
    }

    /// Payload bytes retained for possible replay.
    pub fn unacked_bytes(&self) -> usize {
        self.unacked_bytes
    }

    /// Highest sequence number acknowledged by the peer.
    pub fn acked(&self) -> u64 {
        self.acked
    }
}

/// Receiver half: admits each sequence number once, in order.
#[derive(Default, Debug)]
pub struct RecvWindow {
    delivered: u64,
    unacknowledged: u64,
}

/// What to do with a received sequenced frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit {
    /// Next in order: deliver it.
    Deliver,
    /// Already delivered before a reconnect: drop it silently.
    Duplicate,
}

impl RecvWindow {
    /// Nothing received yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decides the fate of a frame carrying `seq`. A gap means the peer skipped frames,
    /// which a correct peer over an ordered stream never does: the connection is reset.
    pub fn admit(&mut self, seq: u64) -> Result<Admit, ReliableError> {
        if seq <= self.delivered {
            Ok(Admit::Duplicate)
        } else if seq == self.delivered + 1 {
            self.delivered = seq;
            self.unacknowledged += 1;
            Ok(Admit::Deliver)
        } else {
            Err(ReliableError::Gap { expected: self.delivered + 1, got: seq })
        }
    }

    /// Whether a frame carrying `seq` is the next to deliver (what [`RecvWindow::admit`]
    /// would say `Deliver` to), without admitting it.
    pub fn is_next(&self, seq: u64) -> bool {
        seq == self.delivered + 1
    }

    /// Highest sequence number delivered in order (the value to acknowledge).
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Frames delivered since the last call to [`RecvWindow::take_ack`].
    pub fn pending_ack(&self) -> u64 {
        self.unacknowledged
    }

    /// Returns the cumulative ack to send and resets the pending count.
    pub fn take_ack(&mut self) -> u64 {
        self.unacknowledged = 0;
        self.delivered
    }
}

/// Protocol violations detected by the windows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReliableError {
    #[error("sequence gap: expected frame {expected}, got {got}")]
    Gap { expected: u64, got: u64 },
    #[error("peer acknowledged frame {ack} but only {sent} were sent")]
    AckFromFuture { ack: u64, sent: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Addr, Channel, Header, Kind};
    use bytes::Bytes;
    use proptest::prelude::*;

    fn frame(tag: u64) -> Frame {
        let mut h = Header::new(Kind::Eager, Channel::Normal, Addr::new(0, 0), Addr::new(1, 0));
        h.tag = tag;
        Frame { header: h, payload: Bytes::from(vec![tag as u8; 3]) }
    }

    #[test]
    fn ack_releases_prefix_only() {
        let mut w = SendWindow::new();
        for i in 0..5 {
            w.stamp(frame(i));
        }
        assert_eq!(w.on_ack(3).unwrap(), 3);
        assert_eq!(w.unacked(), 2);
        assert_eq!(w.on_ack(2).unwrap(), 0, "stale ack changes nothing");
        assert_eq!(w.on_ack(9), Err(ReliableError::AckFromFuture { ack: 9, sent: 5 }));
        assert_eq!(w.replay(4).unwrap().iter().map(|f| f.header.seq).collect::<Vec<_>>(), vec![5]);
    }

    #[test]
    fn receiver_drops_duplicates_and_refuses_gaps() {
        let mut r = RecvWindow::new();
        assert_eq!(r.admit(1).unwrap(), Admit::Deliver);
        assert_eq!(r.admit(1).unwrap(), Admit::Duplicate);
        assert_eq!(r.admit(3), Err(ReliableError::Gap { expected: 2, got: 3 }));
        assert_eq!(r.admit(2).unwrap(), Admit::Deliver);
        assert_eq!(r.take_ack(), 2);
        assert_eq!(r.pending_ack(), 0);
    }

    proptest! {
        /// A stream of frames over a sequence of connections, each of which is cut after an
        /// arbitrary number of frames (the tail of what was written lost in flight, acks
        /// lost too), arrives exactly once and in order.
        #[test]
        fn exactly_once_across_reconnects(
            n in 1u64..300,
            cuts in proptest::collection::vec((1usize..40, 0usize..10), 0..12),
        ) {
            let mut tx = SendWindow::new();
            let mut rx = RecvWindow::new();
            let mut got = Vec::new();
            let mut next_tag = 0u64;
            let mut in_flight: Vec<Frame> = Vec::new();
            let mut cut_iter = cuts.into_iter();
            loop {
                // Application sends some more.
                while next_tag < n && in_flight.len() < 25 {
                    in_flight.push(tx.stamp(frame(next_tag)));
                    next_tag += 1;
                }
                let (deliver, lost) = cut_iter.next().unwrap_or((usize::MAX, 0));
                let k = deliver.min(in_flight.len());
                for f in in_flight.drain(..k) {
                    if rx.admit(f.header.seq).unwrap() == Admit::Deliver { got.push(f.header.tag); }
                }
                // The connection is cut: the rest in flight is lost, possibly with acks.
                let _ = lost;
                in_flight.clear();
                // Reconnect: handshake tells the sender what the receiver has; replay.
                in_flight = tx.replay(rx.delivered()).unwrap();
                if next_tag == n && in_flight.is_empty() { break; }
                if k == 0 && deliver == usize::MAX && in_flight.is_empty() && next_tag == n { break; }
            }
            prop_assert_eq!(got, (0..n).collect::<Vec<_>>());
        }
    }
}
