//! `--ship auto`: for each part, the encoding with the least predicted time, from what
//! the transfers to the same storage site measured so far.
//!
//! Shipping `D` bytes of output as encoding `k` costs `f_k·D` to encode, `x_k(D)/B` on
//! the link (`B`: the link's delivered rate) and `g_k·D` at the storage site (checks,
//! decompression or regeneration, writing). A fixed cost per object (connection set-up,
//! rendezvous, acknowledgement: a few round trips) is the same whatever the encoding,
//! so it decides nothing and is only measured to take it out of `B`. This is the
//! break-even rule of `docs/paramedic.md` (`D − x > B·(f(x) + g(x) − f(D) − g(D))`),
//! applied per part with every term measured.
//!
//! Nothing is assumed about the link: the first part goes compressed (it measures the
//! link's rate with many bytes), the second as metadata (it measures the per-object
//! cost with few bytes, and what regeneration costs); from then on each part goes the
//! way the model says, and each transfer refines the model (exponentially weighted).
//!
//! Every agent of a job ships parts to the same storage site, so they share one model
//! ([`Shared`], kept on the agents' bulletin board by `crate::agent`): the probes are
//! made once per job, not once per agent, and every transfer refines what all of them
//! choose from. A metadata probe (regenerating a whole part at the storage site, the
//! dearest way to learn) is claimed by one agent at a time; the others ship compressed
//! until it has measured.
//!
//! Sans-IO: [`Chooser`] and [`Shared`] only see numbers, so they are tested without a
//! network.

use serde::{Deserialize, Serialize};

/// What can cross the link for a part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord, Hash)]
pub enum Kind {
    Output,
    Zstd,
    Metadata,
}

impl Kind {
    /// The container plug-in that carries it (as the summary counts choices).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Output => "raw",
            Kind::Zstd => "zstd",
            Kind::Metadata => "blast",
        }
    }
}

/// One finished transfer, as [`Chooser::observe`] takes it.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub kind: Kind,
    /// Bytes of output the object stood for.
    pub output_bytes: u64,
    /// Bytes sent.
    pub bytes: u64,
    pub encode_seconds: f64,
    /// From opening the connection to the acknowledgement.
    pub transfer_seconds: f64,
    /// The storage site's share of that.
    pub storage_seconds: f64,
}

/// Per output byte (or per object), exponentially weighted.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
struct Ewma(Option<f64>);

impl Ewma {
    fn add(&mut self, x: f64) {
        if x.is_finite() {
            self.0 = Some(self.0.map_or(x, |old| 0.7 * old + 0.3 * x));
        }
    }
}

/// What is known of one encoding.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
struct Costs {
    /// Encoding seconds per output byte.
    encode: Ewma,
    /// Bytes sent per output byte.
    ratio: Ewma,
    /// Storage-site seconds per output byte.
    storage: Ewma,
}

/// The choice for one part and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    pub kind: Kind,
    /// The reasoning, for the search's summary.
    pub why: String,
}

/// The model of one storage site's link (see the module docs).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Chooser {
    costs: [Costs; 3],
    /// Seconds per object that do not depend on its size (the smallest transfer time
    /// net of the storage site's work seen so far).
    per_object: Option<f64>,
    /// The link's delivered rate, bytes per second.
    rate: Ewma,
    /// Big transfers (bytes, seconds net of the storage site's work) measured before
    /// the per-object cost was known.
    waiting: Vec<(u64, f64)>,
}

fn idx(k: Kind) -> usize {
    k as usize
}

impl Chooser {
    /// Records a finished transfer.
    pub fn observe(&mut self, s: Sample) {
        let d = s.output_bytes.max(1) as f64;
        let c = &mut self.costs[idx(s.kind)];
        c.encode.add(s.encode_seconds / d);
        c.ratio.add(s.bytes as f64 / d);
        c.storage.add(s.storage_seconds / d);
        let net = (s.transfer_seconds - s.storage_seconds).max(0.0);
        if s.kind == Kind::Metadata || s.bytes < 64 << 10 {
            self.per_object = Some(self.per_object.map_or(net, |p| p.min(net)));
        }
        // The rate from the objects whose bytes are not negligible (not metadata), net of
        // the fixed cost once that is known (earlier ones wait for it). A small object's
        // estimate is crude (a short transfer never leaves slow start), but it is what
        // a part of that size will see.
        if s.kind != Kind::Metadata {
            self.waiting.push((s.bytes, net));
        }
        if let Some(fixed) = self.per_object {
            for (bytes, net) in std::mem::take(&mut self.waiting) {
                let on_wire = (net - fixed).max(net * 0.05).max(1e-6);
                self.rate.add(bytes as f64 / on_wire);
            }
        }
    }

    /// Predicted seconds to ship `d` bytes of output as `k` (without the per-object
    /// cost), if every term is known.
    fn predict(&self, k: Kind, d: f64) -> Option<f64> {
        let c = &self.costs[idx(k)];
        let rate = self.rate.0?;
        let (encode, ratio, storage) = match k {
            // Shipping the output as it is encodes nothing and sends every byte; its
            // storage-site work (a write) is at most what a compressed object's is.
            Kind::Output => (0.0, 1.0, c.storage.0.or(self.costs[idx(Kind::Zstd)].storage.0)?),
            _ => (c.encode.0?, c.ratio.0?, c.storage.0?),
        };
        Some(encode * d + ratio * d / rate + storage * d)
    }

    /// The encoding for a part of `output_bytes` bytes.
    pub fn choose(&self, output_bytes: u64) -> Choice {
        if self.costs[idx(Kind::Metadata)].storage.0.is_some() && self.rate.0.is_none() {
            return Choice { kind: Kind::Zstd, why: "compressed, to measure the link's rate".into() };
        }
        if self.costs[idx(Kind::Zstd)].storage.0.is_none() {
            return Choice { kind: Kind::Zstd, why: "first part: compressed, to measure the link's rate".into() };
        }
        if self.costs[idx(Kind::Metadata)].storage.0.is_none() {
            return Choice {
                kind: Kind::Metadata,
                why: "second part: metadata, to measure the cost per object and of regeneration".into(),
            };
        }
        let d = output_bytes.max(1) as f64;
        let mut best: Option<(Kind, f64)> = None;
        let mut each = Vec::new();
        for k in [Kind::Output, Kind::Zstd, Kind::Metadata] {
            if let Some(t) = self.predict(k, d) {
                each.push(format!("{} {:.3} s", k.name(), t));
                if best.is_none_or(|(_, b)| t < b) {
                    best = Some((k, t));
                }
            }
        }
        let (kind, _) = best.expect("zstd and metadata are both measured");
        Choice {
            kind,
            why: format!(
                "link {:.1} Mbit/s delivered, {:.1} ms per object; predicted for {:.2} MB: {}",
                self.rate.0.unwrap_or(0.0) * 8.0 / 1e6,
                self.per_object.unwrap_or(0.0) * 1e3,
                d / 1e6,
                each.join(", ")
            ),
        }
    }
}

/// How long a claimed metadata probe keeps other agents from probing: longer than a
/// part takes to encode, cross a slow link and be regenerated, so that only an agent
/// that died with the claim holds the others back, and only this long.
pub const PROBE_CLAIM_SECONDS: f64 = 600.0;

/// The model that every agent of a job shares for one storage site, with the metadata
/// probe in flight, if any (see the module docs).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Shared {
    model: Chooser,
    /// When (Unix seconds) an agent claimed the metadata probe that is in flight.
    probe_claimed: Option<f64>,
}

impl Shared {
    /// The encoding for a part, and whether this choice claims the metadata probe (the
    /// caller then writes the claim back before shipping, and reports the transfer with
    /// [`Shared::finished`] whatever its outcome). `now`: Unix seconds.
    pub fn choose(&mut self, output_bytes: u64, now: f64) -> (Choice, bool) {
        let choice = self.model.choose(output_bytes);
        let probe = choice.kind == Kind::Metadata && self.model.costs[idx(Kind::Metadata)].storage.0.is_none();
        if !probe {
            return (choice, false);
        }
        if self.probe_claimed.is_some_and(|t| now - t < PROBE_CLAIM_SECONDS) {
            let why = "compressed, while another agent measures regeneration with a metadata part".into();
            return (Choice { kind: Kind::Zstd, why }, false);
        }
        self.probe_claimed = Some(now);
        (choice, true)
    }

    /// A transfer is over: `sample` is what it measured (`None`: it failed). `probe`:
    /// its choice claimed the metadata probe, which is released either way.
    pub fn finished(&mut self, sample: Option<Sample>, probe: bool) {
        if probe {
            self.probe_claimed = None;
        }
        if let Some(s) = sample {
            self.model.observe(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link of `mbit` Mbit/s with `rtt` seconds per object, a storage site that
    /// regenerates at `regen` seconds per output byte: what a transfer there measures.
    fn transfer(kind: Kind, d: u64, mbit: f64, rtt: f64, regen: f64) -> Sample {
        let (ratio, encode, storage) = match kind {
            Kind::Output => (1.0, 0.0, 2e-9),
            Kind::Zstd => (0.2, 5e-9, 3e-9),
            Kind::Metadata => (0.005, 20e-9, regen),
        };
        let bytes = (d as f64 * ratio) as u64;
        let storage_seconds = storage * d as f64;
        Sample {
            kind,
            output_bytes: d,
            bytes,
            encode_seconds: encode * d as f64,
            transfer_seconds: 4.0 * rtt + bytes as f64 * 8.0 / (mbit * 1e6) + storage_seconds,
            storage_seconds,
        }
    }

    /// Drives a chooser through `parts` parts on a link and returns its choices.
    fn run(mbit: f64, rtt: f64, regen: f64, parts: usize) -> Vec<Kind> {
        let mut c = Chooser::default();
        (0..parts)
            .map(|_| {
                let k = c.choose(5_000_000).kind;
                c.observe(transfer(k, 5_000_000, mbit, rtt, regen));
                k
            })
            .collect()
    }

    #[test]
    fn it_measures_first_then_follows_the_break_even_rule() {
        // A slow wide-area link: metadata (5 MB as 25 KB, regenerated in 2 s) wins over
        // 1 MB of compressed output (4 s at 2 Mbit/s).
        let slow = run(2.0, 0.1, 400e-9, 6);
        assert_eq!(&slow[..2], [Kind::Zstd, Kind::Metadata]);
        assert!(slow[2..].iter().all(|k| *k == Kind::Metadata), "{slow:?}");
        // At 10 Mbit/s the compressed output (0.8 s) beats regeneration (2 s); on a fast
        // local link all the more.
        assert!(run(10.0, 0.1, 400e-9, 6)[2..].iter().all(|k| *k == Kind::Zstd));
        let fast = run(1000.0, 0.0001, 400e-9, 6);
        assert!(fast[2..].iter().all(|k| *k == Kind::Zstd), "{fast:?}");
        // At 50 Mbit/s, with a storage site that regenerates quickly: metadata (0.11 s,
        // mostly encoding) over the compressed output (0.2 s).
        let cheap = run(50.0, 0.0001, 1e-9, 6);
        assert!(cheap[2..].iter().all(|k| *k == Kind::Metadata), "{cheap:?}");
    }

    #[test]
    fn small_compressed_parts_on_a_fast_link_do_not_leave_it_probing_metadata() {
        // Parts of 230 KB compress to 46 KB: the rate comes from them all the same.
        let mut c = Chooser::default();
        let kinds: Vec<Kind> = (0..6)
            .map(|_| {
                let k = c.choose(230_000).kind;
                c.observe(transfer(k, 230_000, 1000.0, 0.0001, 400e-9));
                k
            })
            .collect();
        assert_eq!(&kinds[..2], [Kind::Zstd, Kind::Metadata]);
        assert!(kinds[2..].iter().all(|k| *k != Kind::Metadata), "{kinds:?}");
    }

    #[test]
    fn the_rate_is_measured_net_of_the_per_object_cost() {
        let mut c = Chooser::default();
        c.observe(transfer(Kind::Zstd, 5_000_000, 100.0, 0.05, 400e-9));
        c.observe(transfer(Kind::Metadata, 5_000_000, 100.0, 0.05, 400e-9));
        c.observe(transfer(Kind::Zstd, 5_000_000, 100.0, 0.05, 400e-9));
        let mbit = c.rate.0.unwrap() * 8.0 / 1e6;
        assert!((95.0..105.0).contains(&mbit), "{mbit} Mbit/s");
        let why = c.choose(5_000_000).why;
        assert!(why.contains("Mbit/s delivered") && why.contains("blast") && why.contains("zstd"), "{why}");
    }

    #[test]
    fn agents_sharing_a_model_probe_metadata_once() {
        // Four agents start at once: each ships its first part compressed (nothing is
        // known yet), then one claims the metadata probe while the others go on
        // compressing; once it has measured, everyone follows the model.
        let mut shared = Shared::default();
        let firsts: Vec<(Choice, bool)> = (0..4).map(|_| shared.choose(5_000_000, 0.0)).collect();
        assert!(firsts.iter().all(|(c, probe)| c.kind == Kind::Zstd && !probe), "{firsts:?}");
        shared.finished(Some(transfer(Kind::Zstd, 5_000_000, 2.0, 0.1, 400e-9)), false);
        let (probe, claimed) = shared.choose(5_000_000, 1.0);
        assert_eq!((probe.kind, claimed), (Kind::Metadata, true));
        let (other, claimed_too) = shared.choose(5_000_000, 2.0);
        assert_eq!((other.kind, claimed_too), (Kind::Zstd, false), "{}", other.why);
        assert!(other.why.contains("another agent"), "{}", other.why);
        shared.finished(Some(transfer(Kind::Metadata, 5_000_000, 2.0, 0.1, 400e-9)), true);
        // On a 2 Mbit/s link metadata now wins for every agent, without another probe.
        for t in 3..7 {
            let (c, claimed) = shared.choose(5_000_000, t as f64);
            assert_eq!((c.kind, claimed), (Kind::Metadata, false), "{}", c.why);
        }
    }

    #[test]
    fn a_failed_or_abandoned_probe_lets_another_agent_probe() {
        let mut shared = Shared::default();
        shared.finished(Some(transfer(Kind::Zstd, 5_000_000, 2.0, 0.1, 400e-9)), false);
        assert!(shared.choose(5_000_000, 0.0).1);
        // The probe's transfer failed: the claim is released, nothing is learnt.
        shared.finished(None, true);
        assert!(shared.choose(5_000_000, 1.0).1);
        // This one's agent died with the claim: others wait, then probe themselves.
        assert!(!shared.choose(5_000_000, 1.0 + PROBE_CLAIM_SECONDS / 2.0).1);
        assert!(shared.choose(5_000_000, 2.0 + PROBE_CLAIM_SECONDS).1);
    }

    #[test]
    fn the_shared_model_survives_its_encoding() {
        let mut shared = Shared::default();
        shared.finished(Some(transfer(Kind::Zstd, 5_000_000, 100.0, 0.05, 400e-9)), false);
        assert!(shared.choose(5_000_000, 10.0).1);
        let back: Shared = postcard::from_bytes(&postcard::to_stdvec(&shared).unwrap()).unwrap();
        assert_eq!(back.probe_claimed, Some(10.0));
        assert_eq!(format!("{:?}", back.model), format!("{:?}", shared.model));
    }
}
