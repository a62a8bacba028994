//! Output consolidation, incrementally: a fragment's results are parsed by the agent of
//! the node that searched it, and the batch's merger feeds them to the agents'
//! sort/merge component ([`gepsea_agent::core::merge::Merger`]) as they arrive.
//!
//! Parsing an `-outfmt 11` archive is the expensive part of a merge (the archives of a
//! batch are several times the size of its report). Done where the result was
//! produced, it runs on every node's agent in parallel, while the batch's other
//! fragments are still being searched; the merger only orders hits it receives ready
//! to compare. What the merger receives per fragment ([`FragmentHits`]): every query's
//! hit count (for the overflow guard, which needs the counts before truncation) and
//! its best `k` hits in BLAST's order, their HSP texts already numbered for the batch.
//!
//! The merge order is [`archive::hit_order`] with the position in the fragment's own
//! (stably sorted) list as the last key, so the k-way merge gives exactly what one
//! stable sort of all fragments' hits gives — which is what a whole-database search
//! reports. Keeping only each fragment's best `k` per query loses nothing: the best
//! `k` overall are among them.

use std::cmp::Ordering;

use gepsea_agent::core::merge::{MergeError, Merger};
use serde::{Deserialize, Serialize};

use crate::archive::{self, ArchiveError, Real};

/// One fragment's results for one batch, as its searching node's agent parsed them.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FragmentHits {
    /// Size of the archive they came from (for the trace).
    pub archive_bytes: u64,
    /// Time the parse took on the searching node's agent.
    pub parse_seconds: f64,
    /// Per query of the batch: the hits the fragment found (before keeping the best k).
    pub counts: Vec<u32>,
    /// Each query's best `k` hits, by query, then in BLAST's order.
    pub hits: Vec<HitRecord>,
}

/// One hit (every HSP of one query against one subject).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HitRecord {
    /// Index of the query in its batch.
    pub query: u32,
    /// The hit's best e-value, `(mantissa, exponent)` as [`Real`] holds it.
    pub evalue: (u64, i32),
    pub score: i64,
    /// Its HSPs' archive texts, the query numbered `Query_<query + 1>`.
    pub hsps: Vec<String>,
}

impl FragmentHits {
    /// Parses a fragment's archive for a batch of `nqueries`, keeping `k` hits a query.
    pub fn parse(archive_text: &str, fragment: usize, nqueries: usize, k: usize) -> Result<FragmentHits, ArchiveError> {
        let started = std::time::Instant::now();
        let hsps = archive::hsps(archive_text)?;
        let per_query = archive::hits_by_query(&hsps, fragment, nqueries);
        let mut out = FragmentHits { archive_bytes: archive_text.len() as u64, ..Default::default() };
        for (local, mut list) in per_query.into_iter().enumerate() {
            out.counts.push(u32::try_from(list.len()).unwrap_or(u32::MAX));
            // Stable: hits that tie keep the archive's order, as in a whole-database sort.
            list.sort_by(archive::hit_order);
            list.truncate(k);
            for hit in list {
                out.hits.push(HitRecord {
                    query: local as u32,
                    evalue: (hit.evalue.mantissa, hit.evalue.exponent),
                    score: hit.score,
                    hsps: hit.hsps.iter().map(|s| archive::renumber(s, local + 1)).collect(),
                });
            }
        }
        out.parse_seconds = started.elapsed().as_secs_f64();
        Ok(out)
    }
}

/// A hit in the batch's merge order: query, then [`archive::hit_order`], then its
/// position in its fragment's list.
#[derive(Clone, Debug)]
struct Ranked {
    query: u32,
    evalue: Real,
    score: i64,
    fragment: u32,
    seq: u32,
    hsps: Vec<String>,
}

impl Ord for Ranked {
    fn cmp(&self, o: &Self) -> Ordering {
        self.query
            .cmp(&o.query)
            .then(self.evalue.cmp(&o.evalue))
            .then(o.score.cmp(&self.score))
            .then(o.fragment.cmp(&self.fragment))
            .then(self.seq.cmp(&o.seq))
    }
}
impl PartialOrd for Ranked {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl PartialEq for Ranked {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Ranked {}

/// What a batch's merge settles for one query.
#[derive(Debug, PartialEq, Eq)]
pub enum Settled {
    /// The query's final hits (as many as the report lists): their HSP texts.
    Hits { hits: usize, hsps: Vec<String> },
    /// Its fragments found so many hits that a whole-database search might have
    /// dropped some before the end (BLAST's preliminary list): search it whole.
    Overflow,
}

/// A batch's merge on its merger agent: one sorted run per fragment.
pub struct BatchMerge {
    merger: Merger<Ranked>,
    arrived: Vec<bool>,
    /// Per query: hits over every fragment, and the most from one fragment.
    total: Vec<u64>,
    largest: Vec<usize>,
    /// Per query: already reported by [`BatchMerge::new_overflows`].
    overflowing: Vec<bool>,
    best: Vec<Vec<Vec<String>>>,
    k: usize,
}

impl BatchMerge {
    pub fn new(fragments: usize, queries: usize, k: usize) -> BatchMerge {
        BatchMerge {
            merger: Merger::new(fragments),
            arrived: vec![false; fragments],
            total: vec![0; queries],
            largest: vec![0; queries],
            overflowing: vec![false; queries],
            best: vec![Vec::new(); queries],
            k,
        }
    }

    /// Adds fragment `fragment`'s hits. `Ok(false)`: it was already in (a task re-run
    /// after its worker died delivers the same results again).
    pub fn add(&mut self, fragment: usize, hits: FragmentHits) -> Result<bool, String> {
        let nq = self.total.len();
        match self.arrived.get(fragment) {
            None => return Err(format!("fragment {fragment} of {}", self.arrived.len())),
            Some(true) => return Ok(false),
            Some(false) => {}
        }
        if hits.counts.len() != nq {
            return Err(format!("fragment {fragment}: hit counts for {} queries, the batch has {nq}", hits.counts.len()));
        }
        let mut run = Vec::with_capacity(hits.hits.len());
        let mut seq = 0u32;
        let mut prev_query = None;
        for h in hits.hits {
            if h.query as usize >= nq {
                return Err(format!("fragment {fragment}: a hit of query {} in a batch of {nq}", h.query));
            }
            if prev_query != Some(h.query) {
                seq = 0;
                prev_query = Some(h.query);
            }
            run.push(Ranked {
                query: h.query,
                evalue: Real { mantissa: h.evalue.0, exponent: h.evalue.1 },
                score: h.score,
                fragment: fragment as u32,
                seq,
                hsps: h.hsps,
            });
            seq += 1;
        }
        let named = |e: MergeError| format!("fragment {fragment}: {e}");
        self.merger.push(fragment, run).map_err(named)?;
        self.merger.finish(fragment).map_err(named)?;
        self.arrived[fragment] = true;
        for (q, &c) in hits.counts.iter().enumerate() {
            self.total[q] += u64::from(c);
            self.largest[q] = self.largest[q].max(c as usize);
        }
        self.take_ready();
        Ok(true)
    }

    fn take_ready(&mut self) {
        for r in self.merger.pop_ready() {
            let best = &mut self.best[r.query as usize];
            if best.len() < self.k {
                best.push(r.hsps);
            }
        }
    }

    /// The queries (local indices, ascending) that overflow by the counts in so far and
    /// were not reported before. The guard's counts only grow as fragments arrive, so a
    /// query that overflows now overflows in [`BatchMerge::settle`] too: its whole-database
    /// search can start at once instead of after the batch's last fragment (a heavy
    /// query's search is the longest task of a job, and the last batches' would
    /// otherwise end the job long after every other search).
    pub fn new_overflows(&mut self, prelim: usize) -> Vec<usize> {
        let fragments = self.arrived.len();
        let mut out = Vec::new();
        for q in 0..self.total.len() {
            if !self.overflowing[q] && crate::plan::may_overflow(fragments, self.total[q], self.largest[q], prelim, self.k) {
                self.overflowing[q] = true;
                out.push(q);
            }
        }
        out
    }

    /// Every fragment is in.
    pub fn complete(&self) -> bool {
        self.arrived.iter().all(|&a| a)
    }

    /// Once [`BatchMerge::complete`]: each query's outcome; an overflow is what
    /// [`crate::plan::may_overflow`] says of its counts.
    pub fn settle(mut self, prelim: usize) -> Vec<Settled> {
        debug_assert!(self.complete());
        self.take_ready();
        let fragments = self.arrived.len();
        self.best
            .into_iter()
            .enumerate()
            .map(|(q, hits)| {
                if crate::plan::may_overflow(fragments, self.total[q], self.largest[q], prelim, self.k) {
                    Settled::Overflow
                } else {
                    Settled::Hits { hits: hits.len(), hsps: hits.into_iter().flatten().collect() }
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(query: u32, e: (u64, i32), score: i64, name: &str) -> HitRecord {
        HitRecord { query, evalue: e, score, hsps: vec![name.to_string()] }
    }

    fn frag(counts: Vec<u32>, hits: Vec<HitRecord>) -> FragmentHits {
        FragmentHits { counts, hits, ..Default::default() }
    }

    fn hsps(s: &Settled) -> Vec<String> {
        match s {
            Settled::Hits { hsps, .. } => hsps.clone(),
            Settled::Overflow => panic!("overflow"),
        }
    }

    #[test]
    fn fragments_in_any_order_merge_to_blast_s_order_and_keep_k() {
        // e-values 1e-5 < 2e-5 = 20e-6 (equal: the higher score first, then the later
        // fragment first) < 3e-5.
        let f0 = frag(vec![2, 1], vec![rec(0, (1, -5), 50, "a"), rec(0, (2, -5), 40, "b"), rec(1, (3, -5), 10, "x")]);
        let f1 = frag(vec![2, 0], vec![rec(0, (20, -6), 40, "c"), rec(0, (3, -5), 30, "d")]);
        let f2 = frag(vec![1, 0], vec![rec(0, (2, -5), 45, "e")]);
        for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0]] {
            let mut m = BatchMerge::new(3, 2, 4);
            let fs = [f0.clone(), f1.clone(), f2.clone()];
            for (i, &f) in order.iter().enumerate() {
                assert!(!m.complete());
                assert_eq!(m.add(f, fs[f].clone()), Ok(true));
                if i == 0 {
                    assert_eq!(m.add(f, fs[f].clone()), Ok(false), "a re-run adds nothing");
                }
            }
            assert!(m.complete());
            let s = m.settle(1000);
            assert_eq!(hsps(&s[0]), ["a", "e", "c", "b"], "order {order:?}");
            assert_eq!(s[0], Settled::Hits { hits: 4, hsps: vec!["a".into(), "e".into(), "c".into(), "b".into()] });
            assert_eq!(hsps(&s[1]), ["x"]);
        }
    }

    #[test]
    fn the_overflow_guard_sees_counts_before_truncation() {
        let two_hits = || {
            let mut m = BatchMerge::new(2, 1, 2);
            m.add(0, frag(vec![1], vec![rec(0, (1, -5), 9, "a")])).unwrap();
            m.add(1, frag(vec![1], vec![rec(0, (1, -4), 9, "b")])).unwrap();
            m
        };
        // 2 hits: a quarter of a preliminary list of 8 → overflow; of 9 → settled.
        assert_eq!(two_hits().settle(8), vec![Settled::Overflow]);
        assert_eq!(two_hits().settle(9), vec![Settled::Hits { hits: 2, hsps: vec!["a".into(), "b".into()] }]);
        // One fragment alone reported k (its list was cut to k when parsed).
        let mut m = BatchMerge::new(2, 1, 2);
        m.add(0, frag(vec![5], vec![rec(0, (1, -5), 9, "a"), rec(0, (1, -4), 9, "b")])).unwrap();
        m.add(1, frag(vec![0], vec![])).unwrap();
        assert_eq!(m.settle(1000), vec![Settled::Overflow]);
        // Over one fragment nothing can overflow.
        let mut m = BatchMerge::new(1, 1, 2);
        m.add(0, frag(vec![5], vec![rec(0, (1, -5), 9, "a"), rec(0, (1, -4), 9, "b")])).unwrap();
        assert_eq!(m.settle(4), vec![Settled::Hits { hits: 2, hsps: vec!["a".into(), "b".into()] }]);
    }

    #[test]
    fn overflows_are_reported_once_as_soon_as_the_counts_so_far_trip_the_guard() {
        // 3 fragments, k = 2, a preliminary list of 8: 2 hits in all overflow.
        let mut m = BatchMerge::new(3, 3, 2);
        m.add(0, frag(vec![1, 2, 0], vec![rec(0, (1, -5), 9, "a"), rec(1, (1, -5), 9, "b"), rec(1, (1, -4), 9, "c")])).unwrap();
        // Query 1 already has k from one fragment (and 2 in all); query 0 has 1.
        assert_eq!(m.new_overflows(8), [1]);
        assert_eq!(m.new_overflows(8), Vec::<usize>::new(), "reported once");
        m.add(2, frag(vec![1, 0, 0], vec![rec(0, (1, -6), 9, "d")])).unwrap();
        assert_eq!(m.new_overflows(8), [0]);
        m.add(1, frag(vec![0, 0, 1], vec![rec(2, (1, -6), 9, "e")])).unwrap();
        assert_eq!(m.new_overflows(8), Vec::<usize>::new());
        // The settled overflows are exactly those reported along the way.
        let s = m.settle(8);
        assert_eq!(s[0], Settled::Overflow);
        assert_eq!(s[1], Settled::Overflow);
        assert_eq!(s[2], Settled::Hits { hits: 1, hsps: vec!["e".into()] });
    }

    #[test]
    fn malformed_deliveries_are_named() {
        let mut m = BatchMerge::new(2, 1, 2);
        assert!(m.add(5, frag(vec![0], vec![])).unwrap_err().contains("fragment 5 of 2"));
        assert!(m.add(0, frag(vec![0, 0], vec![])).unwrap_err().contains("counts for 2 queries"));
        assert!(m.add(0, frag(vec![1], vec![rec(3, (1, 0), 1, "z")])).unwrap_err().contains("query 3"));
        let unsorted = frag(vec![2], vec![rec(0, (1, -3), 9, "late"), rec(0, (1, -5), 9, "early")]);
        assert!(m.add(1, unsorted).unwrap_err().contains("not sorted"));
    }
}
