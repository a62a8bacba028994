//! gepsea-blast: parallel BLAST whose output is identical to one serial BLAST+ run.
//!
//! mpiBLAST's scatter-search-gather: `db` splits a database into fragments, `search`
//! runs (query batch × fragment) tasks on worker processes over gepsea-net, `archive`
//! merges the fragments' hits exactly, and `report` formats the merged result with
//! BLAST+'s own formatter and restores per-query statistics. See `docs/blast.md`.

/// A line on stderr for the user (progress, warnings, recoveries): as `eprintln!`, but
/// a closed or broken stderr (a reader that went away, `2>&1 | head`; a terminal hung
/// up) is ignored instead of panicking the thread, which ended the whole search. Not
/// printed under `-q` ([`set_quiet`]): errors come back to the caller as values.
macro_rules! note {
    ($($t:tt)*) => {{
        if !$crate::quiet() {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), $($t)*);
        }
    }};
}

/// [`note!`] printed under `-q` too: another process's lines passed on, which `-q`
/// already cut down to its errors.
macro_rules! relay {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `-q` ("errors only"): the library's own lines (`note!`: progress, warnings, a
/// retried task) are not printed, and the processes it starts are told the same.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`set_quiet`] asked for errors only.
pub fn quiet() -> bool {
    QUIET.load(std::sync::atomic::Ordering::Relaxed)
}

pub mod accel;
pub mod archive;
pub mod cluster;
pub mod db;
pub mod error;
pub mod fasta;
pub mod output;
pub mod parts;
pub mod plan;
pub mod replay;
pub mod report;
pub mod schedule;
pub mod search;
pub mod ship;
#[cfg(test)]
mod test_dir;
pub mod text;
pub mod tools;
pub mod trace;
