//! CPU time of a process from `/proc/<pid>/stat`, for the benchmarks.

/// User + system CPU seconds of `pid`; with `children`, also those of the children it
/// has waited for (an agent's BLAST+ formatting runs). `None` once the process is gone.
pub fn cpu_seconds(pid: u32, children: bool) -> Option<f64> {
    let (own, waited) = cpu_split(pid)?;
    Some(if children { own + waited } else { own })
}

/// User + system CPU seconds of `pid` itself, and of the children it has waited for,
/// from one read of its `stat`. `None` once the process is gone.
pub fn cpu_split(pid: u32) -> Option<(f64, f64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may itself contain spaces and parentheses.
    let f: Vec<&str> = s.rsplit(')').next()?.split_whitespace().collect();
    let ticks = |fields: std::ops::RangeInclusive<usize>| -> f64 {
        fields.map(|i| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0)).sum()
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // utime and stime (11, 12), then cutime and cstime (13, 14), counted from the state.
    Some((ticks(11..=12) / hz, ticks(13..=14) / hz))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_s_own_and_waited_for_cpu_add_up_to_its_total() {
        // Burn a little CPU in a child and wait for it, so that both parts can be > 0.
        let burn = std::process::Command::new("sh").args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"]).status();
        assert!(burn.unwrap().success());
        let me = std::process::id();
        let (own, waited) = cpu_split(me).unwrap();
        assert!(own >= 0.0 && waited > 0.0, "own {own}, waited {waited}");
        let all = cpu_seconds(me, true).unwrap();
        // Later reads only grow: the total is at least the parts read before it.
        assert!(all >= own + waited, "{all} < {own} + {waited}");
        assert!(cpu_split(4_000_000_000).is_none(), "no such process");
    }
}
