//! Incremental k-way merge of sorted runs that arrive from many nodes in any order.
//!
//! Each run is a stream of sorted chunks ending with `finish`. An item can be emitted
//! as soon as no run can still produce a smaller one: every unfinished run must have a
//! buffered item to compare against. This is what lets agents merge a query's BLAST
//! results as fragments finish, instead of waiting for all of them.

use std::collections::VecDeque;

/// Misuse of a merger.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    #[error("run {0} does not exist")]
    NoSuchRun(usize),
    #[error("run {0} already finished")]
    Finished(usize),
    #[error("run {0} is not sorted: an item precedes one already received")]
    Unsorted(usize),
}

struct Run<T> {
    buf: VecDeque<T>,
    finished: bool,
}

/// A merger's state in parts (see [`Merger::into_parts`]): per run its buffered items
/// and whether it finished; the last item each run sent.
pub type MergerParts<T> = (Vec<(Vec<T>, bool)>, Vec<Option<T>>);

/// Merges `k` runs.
pub struct Merger<T: Ord> {
    runs: Vec<Run<T>>,
    last: Vec<Option<T>>,
}

impl<T: Ord + Clone> Merger<T> {
    pub fn new(k: usize) -> Self {
        Merger { runs: (0..k).map(|_| Run { buf: VecDeque::new(), finished: false }).collect(), last: vec![None; k] }
    }

    /// Adds a sorted chunk to run `run`.
    pub fn push(&mut self, run: usize, items: Vec<T>) -> Result<(), MergeError> {
        let r = self.runs.get_mut(run).ok_or(MergeError::NoSuchRun(run))?;
        if r.finished {
            return Err(MergeError::Finished(run));
        }
        let mut prev = self.last[run].clone();
        for it in &items {
            if prev.as_ref().is_some_and(|p| it < p) {
                return Err(MergeError::Unsorted(run));
            }
            prev = Some(it.clone());
        }
        self.last[run] = prev;
        r.buf.extend(items);
        Ok(())
    }

    /// Run `run` will produce nothing more.
    pub fn finish(&mut self, run: usize) -> Result<(), MergeError> {
        self.runs.get_mut(run).ok_or(MergeError::NoSuchRun(run))?.finished = true;
        Ok(())
    }

    /// Every item that is now certainly next in global order. Ties go to the lower run.
    pub fn pop_ready(&mut self) -> Vec<T> {
        let mut out = Vec::new();
        loop {
            if self.runs.iter().any(|r| !r.finished && r.buf.is_empty()) {
                break;
            }
            let best = self
                .runs
                .iter()
                .enumerate()
                .filter_map(|(i, r)| r.buf.front().map(|x| (x, i)))
                .min_by(|a, b| a.0.cmp(b.0).then(a.1.cmp(&b.1)));
            let Some((_, i)) = best else { break };
            out.push(self.runs[i].buf.pop_front().unwrap());
        }
        out
    }

    /// The merger's whole state, to move it to another agent: per run its buffered
    /// items and whether it finished, and the last item each run sent.
    pub fn into_parts(self) -> MergerParts<T> {
        (self.runs.into_iter().map(|r| (r.buf.into(), r.finished)).collect(), self.last)
    }

    /// A merger rebuilt from [`Merger::into_parts`]; `None` if the parts disagree on
    /// the number of runs.
    pub fn from_parts(runs: Vec<(Vec<T>, bool)>, last: Vec<Option<T>>) -> Option<Self> {
        (runs.len() == last.len())
            .then(|| Merger { runs: runs.into_iter().map(|(buf, finished)| Run { buf: buf.into(), finished }).collect(), last })
    }

    /// All runs finished and everything emitted.
    pub fn is_done(&self) -> bool {
        self.runs.iter().all(|r| r.finished && r.buf.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn emits_only_what_is_certain() {
        let mut m = Merger::new(2);
        m.push(0, vec![1, 5]).unwrap();
        assert!(m.pop_ready().is_empty(), "run 1 might still send something smaller");
        m.push(1, vec![3]).unwrap();
        assert_eq!(m.pop_ready(), vec![1, 3]);
        m.finish(1).unwrap();
        assert_eq!(m.pop_ready(), vec![5]);
        assert_eq!(m.push(0, vec![4]), Err(MergeError::Unsorted(0)));
        m.finish(0).unwrap();
        assert!(m.is_done());
        assert_eq!(m.push(1, vec![9]), Err(MergeError::Finished(1)));
    }

    #[test]
    fn a_merger_moved_in_parts_goes_on_where_it_was() {
        let mut m = Merger::new(3);
        m.push(0, vec![1, 5]).unwrap();
        m.push(2, vec![2]).unwrap();
        m.finish(2).unwrap();
        let (runs, last) = m.into_parts();
        assert!(Merger::from_parts(runs.clone(), vec![None]).is_none(), "parts of different run counts");
        let mut m = Merger::from_parts(runs, last).unwrap();
        assert_eq!(m.push(0, vec![4]), Err(MergeError::Unsorted(0)), "the order check came along");
        assert_eq!(m.push(2, vec![9]), Err(MergeError::Finished(2)));
        m.push(1, vec![3]).unwrap();
        m.finish(1).unwrap();
        m.finish(0).unwrap();
        assert_eq!(m.pop_ready(), vec![1, 2, 3, 5]);
        assert!(m.is_done());
    }

    proptest! {
        /// Runs cut into chunks delivered in any interleaving merge to the sorted union.
        #[test]
        fn any_arrival_order_gives_the_sorted_union(
            runs in proptest::collection::vec(proptest::collection::vec(0u32..1000, 0..30), 1..6),
            order in proptest::collection::vec(any::<u8>(), 0..400),
        ) {
            let runs: Vec<Vec<u32>> = runs.into_iter().map(|mut r| { r.sort(); r }).collect();
            let mut pos = vec![0usize; runs.len()];
            let mut m = Merger::new(runs.len());
            let mut out = Vec::new();
            let mut finished = vec![false; runs.len()];
            let mut step = order.into_iter().cycle().take(10_000);
            while finished.iter().any(|f| !f) {
                let b = step.next().unwrap_or(0) as usize;
                // The chosen run, or the next unfinished one after it.
                let r = (0..runs.len()).map(|i| (b + i) % runs.len()).find(|&r| !finished[r]).unwrap();
                let take = (b / runs.len()) % 4 + usize::from(pos[r] < runs[r].len() && b.is_multiple_of(7));
                let end = (pos[r] + take).min(runs[r].len());
                m.push(r, runs[r][pos[r]..end].to_vec()).unwrap();
                pos[r] = end;
                if pos[r] == runs[r].len() { m.finish(r).unwrap(); finished[r] = true; }
                out.extend(m.pop_ready());
            }
            out.extend(m.pop_ready());
            let mut want: Vec<u32> = runs.concat();
            want.sort();
            prop_assert_eq!(out, want);
            prop_assert!(m.is_done());
        }
    }
}
