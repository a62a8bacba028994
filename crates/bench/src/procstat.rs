//! CPU time of a process from `/proc/<pid>/stat`, for the benchmarks.

/// User + system CPU seconds of `pid`; with `children`, also those of the children it
/// has waited for (an agent's BLAST+ formatting runs). `None` once the process is gone.
pub fn cpu_seconds(pid: u32, children: bool) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may itself contain spaces and parentheses.
    let f: Vec<&str> = s.rsplit(')').next()?.split_whitespace().collect();
    let last = if children { 14 } else { 12 };
    let ticks: f64 = (11..=last).map(|i| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0)).sum();
    // SAFETY: sysconf has no preconditions.
    Some(ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}
