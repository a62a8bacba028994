//! gepsea-blast: parallel BLAST whose output is identical to one serial BLAST+ run.
//!
//! mpiBLAST's scatter-search-gather: `db` splits a database into fragments, `search`
//! runs (query batch × fragment) tasks on worker processes over gepsea-net, `archive`
//! merges the fragments' hits exactly, and `report` formats the merged result with
//! BLAST+'s own formatter and restores per-query statistics. See `docs/blast.md`.

pub mod accel;
pub mod archive;
pub mod cluster;
pub mod db;
pub mod error;
pub mod fasta;
pub mod parts;
pub mod plan;
pub mod replay;
pub mod report;
pub mod schedule;
pub mod search;
pub mod ship;
#[cfg(test)]
mod test_dir;
pub mod tools;
pub mod trace;
