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
}

/// One batch's merge and write, by whoever did them (the master or an agent).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchTrace {
    pub batch: usize,
    /// Parsing the fragments' archives and merging them per query.
    pub merge_seconds: f64,
    /// Writing the batch's part of the report (BLAST+ formatting included).
    pub write_seconds: f64,
    pub part_bytes: u64,
}

/// A run's trace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunTrace {
    pub tasks: Vec<TaskTrace>,
    pub batches: Vec<BatchTrace>,
}
