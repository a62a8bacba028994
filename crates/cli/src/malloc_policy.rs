//! How every gepsea process asks glibc's malloc to keep the memory it frees.
//!
//! An agent handles each task's results in buffers of a few MB, on whichever of its job
//! threads takes the job (a worker's archive, the hits decompressed from another node,
//! the parsed archive), and its part writers in buffers of tens of MB. With glibc's
//! defaults each thread that allocates gets an arena of its own (up to 8 per core), and
//! an arena gives its free memory back to the kernel as soon as more than 128 KiB of it
//! is free at its top. So the next job's buffer is often on pages the kernel must map
//! and zero again, one fault per 4 KiB. In a 36-node replayed cluster run on this 2-core
//! machine (`gepsea-bench cluster --replay`) the agents' job threads took 0.73 M page
//! faults, and zeroing pages was 37 % of their CPU samples.
//!
//! So `gepsea`, first thing in every process it starts (agents, ranks, the CLI):
//! - lets its threads share [`ARENAS`] arena(s), so that what one job thread frees the
//!   next job, on any thread, reuses;
//! - keeps up to [`KEEP_FREE`] bytes free at an arena's top (glibc's default: 128 KiB);
//! - maps a block on its own only from [`OWN_MAPPING_FROM`] up (glibc's largest; fixed,
//!   so it no longer moves with what was freed last).
//!
//! A process then holds on to the most it had in use at once, less what lies above
//! [`KEEP_FREE`]: the cost of not faulting the same pages in task after task.
//!
//! Measured on that 36-node run, glibc's defaults against the policy, alternated, four
//! pairs (2026-11-29): the agents' own CPU 17.6–18.0 → 14.9–16.2 CPU-s, page faults
//! machine-wide 2.62–2.70 M → 1.92–2.00 M, wall 40.68–43.45 s → 38.47–40.31 s, and the
//! gepsea processes' peak resident memory, summed, 3.74–3.82 → 3.35 GB: with one arena
//! what a thread frees is no longer stranded in an arena only that thread uses. (Raising
//! the two thresholds alone, the twenty-sixth session's trial, cut the faults by 14 %,
//! left the agents' CPU as it was and took a third more memory.)
//!
//! Settings the user gave glibc win: when `GLIBC_TUNABLES` names a `glibc.malloc`
//! tunable, or one of glibc's `MALLOC_ARENA_MAX`, `MALLOC_TRIM_THRESHOLD_`,
//! `MALLOC_MMAP_THRESHOLD_` is set, nothing is changed. Only the `gepsea` binary applies
//! the policy: a program that links `libgepsea_client` keeps its own allocator as it is.

/// Arenas every thread of the process shares.
pub const ARENAS: i32 = 1;
/// Free bytes an arena keeps at its top before it gives any back to the kernel.
pub const KEEP_FREE: i32 = 256 << 20;
/// Allocations this large or larger get a mapping of their own (freed at once).
pub const OWN_MAPPING_FROM: i32 = 32 << 20;

/// What [`apply`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    /// The policy is in force.
    Yes,
    /// The user's own glibc malloc settings, named, were left in charge.
    UserSettings(&'static str),
    /// glibc refused a setting (not glibc, or a glibc without it).
    Refused(&'static str),
}

/// The user's glibc malloc setting that keeps the policy off, if any.
pub(crate) fn user_setting(var: impl Fn(&str) -> Option<String>) -> Option<&'static str> {
    if var("GLIBC_TUNABLES").is_some_and(|t| t.contains("glibc.malloc.")) {
        return Some("GLIBC_TUNABLES");
    }
    ["MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"].into_iter().find(|v| var(v).is_some())
}

/// Applies the policy to this process. Call it before the process starts a thread:
/// threads that have allocated by then keep the arena they have.
pub fn apply() -> Applied {
    if let Some(name) = user_setting(|v| std::env::var(v).ok()) {
        return Applied::UserSettings(name);
    }
    for (param, value, name) in [
        (libc::M_ARENA_MAX, ARENAS, "M_ARENA_MAX"),
        (libc::M_TRIM_THRESHOLD, KEEP_FREE, "M_TRIM_THRESHOLD"),
        (libc::M_MMAP_THRESHOLD, OWN_MAPPING_FROM, "M_MMAP_THRESHOLD"),
    ] {
        // SAFETY: mallopt takes two integers and changes only malloc's own parameters,
        // under malloc's lock; every value here is within the range glibc documents.
        if unsafe { libc::mallopt(param, value) } != 1 {
            return Applied::Refused(name);
        }
    }
    Applied::Yes
}
