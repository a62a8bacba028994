//! What one search did, task by task and batch by batch: the measurements the
//! many-node model of `gepsea-bench cluster --replay` is calibrated with. Both the
//! mpiBLAST master and the agents' mergers fill it in; it rides in the summary
//! (`--summary-json`) and costs a few bytes per task.

use serde::{Deserialize, Serialize};

/// One BLAST+ run whose result reached a merger.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskTrace {
    pub batch: usize,
    /// The fragment searched; `None` for a whole-database search (a fallback).
    pub fragment: Option<usize>,
    /// Inside BLAST+ (or its replay).
    pub seconds: f64,
    /// Its archive, uncompressed.
    pub bytes: u64,
    /// The worker that ran it (pid; 0 unknown), when it took the task and when the
    /// result was handed over (to its agent, or taken by the master), in seconds since
    /// the Unix epoch: a worker's active time is from its first take to its last
    /// hand-over.
    pub worker: u32,
    pub taken_unix: f64,
    pub handed_unix: f64,
    /// Parsing its archive on the searching node's agent (agents only; the mpiBLAST
    /// master parses in its merge).
    #[serde(default)]
    pub parse_seconds: f64,
    /// Waiting for its fragment to be staged before the search (agents, hot-swap).
    #[serde(default)]
    pub input_seconds: f64,
}

/// Unix time now, in seconds.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

impl RunTrace {
    /// Sum over workers of their active time: from their first take to their last
    /// hand-over (what the workers' share of time in search is taken over).
    pub fn worker_active_seconds(&self) -> f64 {
        let mut by: std::collections::BTreeMap<u32, (f64, f64)> = std::collections::BTreeMap::new();
        for t in self.tasks.iter().filter(|t| t.worker != 0 && t.taken_unix > 0.0) {
            let e = by.entry(t.worker).or_insert((t.taken_unix, t.handed_unix));
            e.0 = e.0.min(t.taken_unix);
            e.1 = e.1.max(t.handed_unix);
        }
        by.values().map(|(a, b)| (b - a).max(0.0)).sum()
    }
}

/// One batch's merge and write, by whoever did them (the master or an agent).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchTrace {
    pub batch: usize,
    /// Merging the fragments' hits per query (and, by the mpiBLAST master, parsing
    /// their archives).
    pub merge_seconds: f64,
    /// Writing the batch's part of the report (BLAST+ formatting included).
    pub write_seconds: f64,
    pub part_bytes: u64,
    /// When the part was in place (seconds since the Unix epoch).
    #[serde(default)]
    pub written_unix: f64,
    /// The statistics runs of the batch's report, when the master ran them ahead of
    /// its results (agents; `write_seconds` then holds none): they take the cores
    /// from the search's start.
    #[serde(default)]
    pub stats_ahead_seconds: f64,
    /// CPU seconds of the write (its thread's and its BLAST+ programs', see
    /// `tools::CpuClock`): unlike `write_seconds`, not stretched by other work on the
    /// same cores. Zero in traces saved before 2026-11-29.
    #[serde(default)]
    pub write_cpu_seconds: f64,
    /// The part of `write_cpu_seconds` on the writing thread itself (an agent's own
    /// CPU counts it; its BLAST+ programs' it does not).
    #[serde(default)]
    pub write_thread_cpu_seconds: f64,
    /// CPU seconds of `stats_ahead_seconds`'s runs.
    #[serde(default)]
    pub stats_ahead_cpu_seconds: f64,
}

/// A run's trace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunTrace {
    pub tasks: Vec<TaskTrace>,
    pub batches: Vec<BatchTrace>,
    /// When the first tasks were handed out (seconds since the Unix epoch).
    #[serde(default)]
    pub started_unix: f64,
    /// Joining the parts into the output, at the end.
    #[serde(default)]
    pub assembly_seconds: f64,
    /// When the output was complete, the end of `wall_seconds` (seconds since the Unix
    /// epoch): with it a benchmark finds the search's window in its own samples.
    #[serde(default)]
    pub finished_unix: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(worker: u32, taken: f64, handed: f64) -> TaskTrace {
        TaskTrace {
            batch: 0,
            fragment: Some(0),
            seconds: handed - taken,
            bytes: 1,
            worker,
            taken_unix: taken,
            handed_unix: handed,
            parse_seconds: 0.0,
            input_seconds: 0.0,
        }
    }

    #[test]
    fn a_worker_is_active_from_its_first_take_to_its_last_hand_over() {
        let t = RunTrace {
            // Worker 7: 10..12 and 13..15 (1 s between tasks counts); worker 8: 11..20.
            tasks: vec![task(7, 13.0, 15.0), task(8, 11.0, 20.0), task(7, 10.0, 12.0), task(0, 1.0, 100.0)],
            ..Default::default()
        };
        assert_eq!(t.worker_active_seconds(), 5.0 + 9.0);
    }
}
