//! How fast this machine is right now: a fixed piece of CPU work, timed.
//!
//! These benchmarks run on shared 2-vCPU guests whose speed drifts by 15–20 % over
//! minutes (the same replayed 36-node search used 60 CPU-s in one stretch and 71 in
//! another). A model calibrated in one stretch and checked against a run in another
//! then misses by the drift, not by its queueing. The probe measures the drift beside
//! each run, so that the model can be played at the speed the run had
//! (`cluster_model`), and prints it, so that a reader can tell a slow stretch from a
//! slow build.
//!
//! The work imitates what dominates a replayed run's CPU (BLAST+'s formatter and the
//! agents' parsing and merging: many small allocations, string handling, sorting, and
//! zstd): it builds a tabular hit list, parses it into records, sorts them, prints them
//! again and compresses the text. One copy runs on every core at once, since the run
//! it stands for keeps every core busy and a neighbour's load can slow one core and
//! not the other.

use std::time::Instant;

/// Rounds of the probe; the median is kept.
const ROUNDS: usize = 5;
/// Hit lines per copy (about 2.6 MB of text): about 0.2 s per round on these guests.
const LINES: u32 = 40_000;

/// Seconds one round of the probe took (the median of [`ROUNDS`]), every core running
/// a copy. Comparable only between calls on the same machine.
pub fn probe() -> f64 {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut times: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            std::thread::scope(|s| {
                for c in 0..cores {
                    s.spawn(move || std::hint::black_box(one_copy(c as u32)));
                }
            });
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[ROUNDS / 2]
}

/// One copy of the work; returns the compressed size so that nothing is optimised away.
fn one_copy(seed: u32) -> usize {
    // A deterministic hit list in BLAST's tabular layout.
    let mut x = 0x9e37_79b9u32 ^ seed;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    };
    let mut text = String::new();
    for i in 0..LINES {
        let (s, e) = (next() % 5000, next() % 1000);
        text.push_str(&format!(
            "Query_{}\tsp|P{:05}|PROT_{}\t{}.{:03}\t{}\t{}\t0\t1\t{}\t{}\t{}\t{:.2e}\t{}\n",
            i / 40,
            s,
            e,
            next() % 100,
            next() % 1000,
            next() % 500,
            next() % 50,
            next() % 400,
            next() % 400,
            next() % 400,
            f64::from(next() % 1000) * 1e-30,
            next() % 900
        ));
    }
    // Parse, sort by query then score, print again: the merge's shape.
    let mut rows: Vec<(String, u32, Vec<String>)> = text
        .lines()
        .map(|l| {
            let f: Vec<String> = l.split('\t').map(str::to_string).collect();
            let score = f.last().and_then(|s| s.parse().ok()).unwrap_or(0);
            (f[0].clone(), score, f)
        })
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then_with(|| a.2.cmp(&b.2)));
    let mut again = String::with_capacity(text.len());
    for (_, _, f) in &rows {
        again.push_str(&f.join("\t"));
        again.push('\n');
    }
    zstd::bulk::compress(again.as_bytes(), 3).map_or(0, |z| z.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_of_the_work_is_deterministic_and_the_probe_takes_time() {
        assert_eq!(one_copy(1), one_copy(1));
        assert_ne!(one_copy(1), one_copy(2), "each core's copy differs");
        let t = probe();
        assert!(t > 0.0 && t.is_finite(), "{t}");
    }
}
