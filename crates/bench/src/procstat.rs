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
    proc_stat(pid).map(|s| (s.own, s.waited))
}

/// One read of `/proc/<pid>/stat` (the parser the BLAST plug-in's CPU accounting uses).
pub use gepsea_blast::tools::proc_stat;

/// Seconds since boot, the clock of `ProcStat::started` ([`proc_stat`]).
pub fn uptime_seconds() -> Option<f64> {
    std::fs::read_to_string("/proc/uptime").ok()?.split_whitespace().next()?.parse().ok()
}

/// CPU seconds this machine has spent busy since boot, all cores together (user, nice,
/// system, interrupts and stolen time from the first line of `/proc/stat`; idle and
/// I/O wait are not busy). Differences between two reads give a window's busy CPU.
pub fn machine_busy_seconds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = s.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<f64> = cpu.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let busy: f64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| ticks.get(i)).sum();
    Some(busy / rustix::param::clock_ticks_per_second() as f64)
}

/// Busy CPU seconds between unix times `from` and `to`, from `(unix time, busy
/// seconds)` samples in time order, the ends interpolated between the samples around
/// them. `None` when the samples do not cover the window.
pub fn busy_between(samples: &[(f64, f64)], from: f64, to: f64) -> Option<f64> {
    let at = |t: f64| -> Option<f64> {
        let i = samples.iter().position(|&(st, _)| st >= t)?;
        if i == 0 {
            return (samples[0].0 == t).then_some(samples[0].1);
        }
        let ((t0, b0), (t1, b1)) = (samples[i - 1], samples[i]);
        Some(b0 + (b1 - b0) * (t - t0) / (t1 - t0).max(1e-9))
    };
    Some(at(to)? - at(from)?)
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

    #[test]
    fn a_process_s_stat_names_it_and_says_when_it_started() {
        let me = proc_stat(std::process::id()).unwrap();
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_string_lossy();
        assert!(name.starts_with(&me.comm), "{} is not {name}", me.comm);
        let up = uptime_seconds().unwrap();
        assert!(me.started > 0.0 && me.started <= up + 0.01, "started {} s after boot, up {up} s", me.started);
        let (own, waited) = cpu_split(std::process::id()).unwrap();
        assert!(me.own <= own && me.waited <= waited);
        assert!(proc_stat(4_000_000_000).is_none(), "no such process");
        // A command name with a space and parentheses does not shift the fields.
        let dir = std::env::temp_dir().join(format!("gepsea-procstat-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let odd = dir.join("a (b) c");
        std::fs::copy("/bin/sleep", &odd).unwrap();
        let child = std::process::Command::new(&odd).arg("5").spawn();
        let _ = std::fs::remove_dir_all(&dir);
        let mut child = child.unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let st = proc_stat(child.id());
        let _ = child.kill();
        let _ = child.wait();
        let st = st.unwrap();
        assert_eq!(st.comm, "a (b) c");
        assert!(st.started >= me.started && st.started <= uptime_seconds().unwrap(), "{st:?}");
    }

    #[test]
    fn the_machine_s_busy_time_grows_with_work_and_windows_interpolate() {
        let before = machine_busy_seconds().unwrap();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = machine_busy_seconds().unwrap();
        // 300 ms of spinning: at least a clock tick or two of busy time, whatever else runs.
        assert!(after - before >= 0.2, "{before} -> {after}");
        let samples = [(10.0, 100.0), (11.0, 101.0), (13.0, 105.0)];
        assert_eq!(busy_between(&samples, 10.0, 13.0), Some(5.0));
        // 10.5 s: halfway from 100 to 101; 12 s: halfway from 101 to 105.
        assert_eq!(busy_between(&samples, 10.5, 12.0), Some(103.0 - 100.5));
        assert_eq!(busy_between(&samples, 9.0, 12.0), None, "before the first sample");
        assert_eq!(busy_between(&samples, 10.0, 14.0), None, "after the last sample");
    }
}
