//! Which cross-core regime the machine is in. These 2-vCPU guests switch between a fast
//! (a cache-line round trip between the two CPUs of ≈0.09 µs) and a slow one (≈0.39 µs,
//! and worse in a bad hour), and every shared-memory and scheduling cost follows it. A
//! ratio of two figures from different regimes says nothing, so the benchmarks that
//! time cross-core work print this probe before and after their rounds. It also tells
//! a slow regime from a slow guest: on a Zen 3 guest whose vCPU 0 ran compute at about
//! 60 % of vCPU 1's speed, gepsea-net's 8 B round trip read 1.26–1.45 µs (0.43 on the
//! Zen 4 guest before it) while this probe read 0.079–0.090 µs, the fast regime.

use std::time::Instant;

/// The regimes' typical cache-line round trips, µs, for the reports' legends.
pub(crate) const LEGEND: &str = "fast regime ≈0.09, slow ≈0.39";

/// Cache-line round trip between two threads pinned to CPUs 0 and 1, in µs.
pub(crate) fn probe() -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    fn pin(cpu: usize) {
        // SAFETY: plain affinity call on the current thread with a valid cpu set.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
    let flag = Arc::new(AtomicU64::new(0));
    let f2 = flag.clone();
    const N: u64 = 200_000;
    let t = std::thread::spawn(move || {
        pin(1);
        for i in 0..N {
            while f2.load(Ordering::Acquire) != 2 * i + 1 {
                std::hint::spin_loop();
            }
            f2.store(2 * i + 2, Ordering::Release);
        }
    });
    pin(0);
    let start = Instant::now();
    for i in 0..N {
        flag.store(2 * i + 1, Ordering::Release);
        while flag.load(Ordering::Acquire) != 2 * i + 2 {
            std::hint::spin_loop();
        }
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / N as f64;
    t.join().unwrap();
    // SAFETY: as above; give the main thread both CPUs back.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::CPU_SET(1, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    us
}
