//! Reliable advertising: publish to all agents or a group, delivered exactly once and in
//! order per publisher, into mailboxes the agent manages (the receiver posts nothing).
//!
//! The publisher numbers its adverts and keeps each until every destination has
//! acknowledged it (resending after a reconnect); the receiver admits each publisher's
//! adverts strictly in sequence, buffering early arrivals and dropping duplicates, and
//! files only the topics it subscribed to. The mailbox is FIFO, so a later advert of a
//! publisher is never read before an earlier one.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use bytes::Bytes;

/// One advertisement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advert {
    pub publisher: u32,
    pub seq: u64,
    pub topic: String,
    pub body: Bytes,
}

/// Publisher side.
#[derive(Default, Debug)]
pub struct Outbox {
    me: u32,
    /// Per destination: a sequence that starts again at 1 when the destination died
    /// and came back (a restarted agent's sequencer starts from 1).
    next_seq: HashMap<u32, u64>,
    unacked: HashMap<u32, BTreeMap<u64, Advert>>,
}

impl Outbox {
    pub fn new(me: u32) -> Self {
        Outbox { me, next_seq: HashMap::new(), unacked: HashMap::new() }
    }

    /// Publishes to `dests`; returns what to send to whom.
    pub fn publish(&mut self, topic: &str, body: Bytes, dests: &[u32]) -> Vec<(u32, Advert)> {
        dests
            .iter()
            .map(|&d| {
                let next = self.next_seq.entry(d).or_insert(1);
                let a = Advert { publisher: self.me, seq: *next, topic: topic.to_string(), body: body.clone() };
                *next += 1;
                self.unacked.entry(d).or_default().insert(a.seq, a.clone());
                (d, a)
            })
            .collect()
    }

    /// `dest` has everything up to `seq`.
    pub fn on_ack(&mut self, dest: u32, seq: u64) {
        if let Some(m) = self.unacked.get_mut(&dest) {
            m.retain(|&s, _| s > seq);
        }
    }

    /// What to send `dest` again (after its connection was re-established).
    pub fn resend(&self, dest: u32) -> Vec<Advert> {
        self.unacked.get(&dest).map(|m| m.values().cloned().collect()).unwrap_or_default()
    }

    /// `dest` died: stop retaining adverts for it; if it comes back (restarted), its
    /// sequence starts again.
    pub fn drop_dest(&mut self, dest: u32) {
        self.unacked.remove(&dest);
        self.next_seq.remove(&dest);
    }
}

/// Receiver side, per agent: admits each publisher's adverts strictly in sequence,
/// buffering early ones and dropping duplicates.
#[derive(Default, Debug)]
pub struct Sequencer {
    next: HashMap<u32, u64>,
    early: HashMap<u32, BTreeMap<u64, Advert>>,
}

impl Sequencer {
    /// Admits `a`; returns the publisher's cumulative acknowledgement and the adverts
    /// that are now deliverable, in order.
    pub fn admit(&mut self, a: Advert) -> (u64, Vec<Advert>) {
        let p = a.publisher;
        let next = *self.next.entry(p).or_insert(1);
        if a.seq >= next {
            self.early.entry(p).or_default().insert(a.seq, a);
        }
        let early = self.early.entry(p).or_default();
        let mut n = next;
        let mut out = Vec::new();
        while let Some(a) = early.remove(&n) {
            out.push(a);
            n += 1;
        }
        self.next.insert(p, n);
        (n - 1, out)
    }

    /// A publisher died: if it comes back (restarted), its sequence starts again at 1.
    pub fn forget(&mut self, publisher: u32) {
        self.early.remove(&publisher);
        self.next.remove(&publisher);
    }
}

/// Receiver side: ordering, duplicate suppression, topic filter, mailbox.
#[derive(Default, Debug)]
pub struct Inbox {
    seq: Sequencer,
    topics: HashSet<String>,
    mailbox: VecDeque<Advert>,
}

impl Inbox {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn subscribe(&mut self, topic: &str) {
        self.topics.insert(topic.to_string());
    }

    pub fn unsubscribe(&mut self, topic: &str) {
        self.topics.remove(topic);
    }

    pub fn is_subscribed(&self, topic: &str) -> bool {
        self.topics.contains(topic)
    }

    /// Admits an advert; returns the cumulative acknowledgement for its publisher.
    pub fn receive(&mut self, a: Advert) -> u64 {
        let (ack, ready) = self.seq.admit(a);
        self.deliver(ready);
        ack
    }

    /// Files already-sequenced adverts (from the agent's [`Sequencer`]) by topic.
    pub fn deliver(&mut self, ready: impl IntoIterator<Item = Advert>) {
        for a in ready {
            if self.topics.contains(&a.topic) {
                self.mailbox.push_back(a);
            }
        }
    }

    /// The oldest unread advert.
    pub fn read(&mut self) -> Option<Advert> {
        self.mailbox.pop_front()
    }

    pub fn unread(&self) -> usize {
        self.mailbox.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_restarted_publisher_or_subscriber_starts_a_new_sequence() {
        let (mut old, mut survivor) = (Outbox::new(1), Outbox::new(2));
        let mut seq_at_2 = Sequencer::default();
        let mut seq_at_1 = Sequencer::default();
        for i in 0..3 {
            let (_, a) = old.publish("t", Bytes::from(vec![i]), &[2]).remove(0);
            assert_eq!(seq_at_2.admit(a).1.len(), 1);
            let (_, a) = survivor.publish("t", Bytes::from(vec![i]), &[1]).remove(0);
            assert_eq!(seq_at_1.admit(a).1.len(), 1);
        }
        // Node 1's agent dies and restarts: a new outbox and sequencer on node 1; node 2
        // forgets it as publisher and as destination.
        seq_at_2.forget(1);
        survivor.drop_dest(1);
        let (mut new, mut seq_at_1) = (Outbox::new(1), Sequencer::default());
        let (_, a) = new.publish("t", Bytes::from_static(b"after"), &[2]).remove(0);
        assert_eq!(seq_at_2.admit(a).1.len(), 1, "the restarted publisher's first advert is delivered");
        let (_, a) = survivor.publish("t", Bytes::from_static(b"to the new one"), &[1]).remove(0);
        assert_eq!(
            seq_at_1.admit(a),
            (1, vec![Advert { publisher: 2, seq: 1, topic: "t".into(), body: Bytes::from_static(b"to the new one") }])
        );
    }

    #[test]
    fn filters_topics_and_acks_cumulatively() {
        let mut out = Outbox::new(1);
        let mut inbox = Inbox::new();
        inbox.subscribe("load");
        let sent: Vec<Advert> =
            ["load", "other", "load"].iter().map(|t| out.publish(t, Bytes::from_static(b"x"), &[2]).remove(0).1).collect();
        assert_eq!(inbox.receive(sent[2].clone()), 0, "early advert is held");
        assert_eq!(inbox.unread(), 0);
        assert_eq!(inbox.receive(sent[0].clone()), 1);
        assert_eq!(inbox.receive(sent[1].clone()), 3);
        let got: Vec<u64> = std::iter::from_fn(|| inbox.read()).map(|a| a.seq).collect();
        assert_eq!(got, vec![1, 3], "the unsubscribed topic is consumed, not delivered");
        out.on_ack(2, 3);
        assert!(out.resend(2).is_empty());
    }

    proptest! {
        /// Adverts from several publishers, each sent possibly several times, arriving in
        /// any order: every subscribed advert is delivered exactly once, and each
        /// publisher's in order.
        #[test]
        fn exactly_once_in_order_per_publisher(n in 1usize..40, dup in 0usize..3, seed in any::<u64>()) {
            let mut pubs: Vec<Outbox> = (0..3).map(Outbox::new).collect();
            let mut wire = Vec::new();
            for i in 0..n {
                let p = i % 3;
                let a = pubs[p].publish("t", Bytes::from(vec![i as u8]), &[9]).remove(0).1;
                for _ in 0..=dup { wire.push(a.clone()); }
            }
            // Deterministic shuffle.
            let mut x = seed | 1;
            for i in (1..wire.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                wire.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let mut inbox = Inbox::new();
            inbox.subscribe("t");
            for a in wire { inbox.receive(a); }
            let got: Vec<Advert> = std::iter::from_fn(|| inbox.read()).collect();
            prop_assert_eq!(got.len(), n);
            for p in 0..3u32 {
                let seqs: Vec<u64> = got.iter().filter(|a| a.publisher == p).map(|a| a.seq).collect();
                let want: Vec<u64> = (1..=seqs.len() as u64).collect();
                prop_assert_eq!(seqs, want);
            }
        }
    }
}
