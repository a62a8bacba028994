//! The malloc policy of the `gepsea` binary (`src/malloc_policy.rs`): memory one thread
//! frees, another thread's next allocation reuses without faulting its pages in again.
//!
//! No test harness: the policy is process-wide and must be applied before any thread
//! starts, so each case runs in a fresh process (this program, run again) with nothing
//! else in it.

#[path = "../src/malloc_policy.rs"]
mod malloc_policy;

use std::process::Command;

/// A buffer of the size an agent's job handles (a few MB): past glibc's default 128 KiB
/// threshold, so glibc maps it on its own unless told otherwise.
const BUFFER: usize = 8 << 20;
const CASE: &str = "GEPSEA_MALLOC_POLICY_CASE";

/// This thread's minor page faults so far (`/proc/thread-self/stat`, field 10).
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("/proc/thread-self/stat");
    // The command name (field 2) may hold spaces: count from its closing parenthesis.
    let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
    rest.split(' ').nth(7).and_then(|f| f.parse().ok()).expect("minflt")
}

/// One thread fills a buffer and frees it; the next thread fills one of the same size.
/// Returns the page faults the second thread took for it.
fn faults_of_a_second_thread() -> u64 {
    std::thread::spawn(|| drop(std::hint::black_box(vec![1u8; BUFFER]))).join().expect("first thread");
    std::thread::spawn(|| {
        let before = minor_faults();
        let b = std::hint::black_box(vec![1u8; BUFFER]);
        let after = minor_faults();
        drop(b);
        after - before
    })
    .join()
    .expect("second thread")
}

fn run_case(case: &str) -> u64 {
    let mut c = Command::new(std::env::current_exe().expect("this test's path"));
    c.env(CASE, case);
    if case == "user-settings" {
        // glibc's default, named: the user has decided.
        c.env("GLIBC_TUNABLES", "glibc.malloc.perturb=0");
    } else {
        c.env_remove("GLIBC_TUNABLES");
    }
    let o = c
        .env_remove("MALLOC_ARENA_MAX")
        .env_remove("MALLOC_TRIM_THRESHOLD_")
        .env_remove("MALLOC_MMAP_THRESHOLD_")
        .output()
        .expect("running this test again");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "case {case} failed: {out}{}", String::from_utf8_lossy(&o.stderr));
    out.trim().parse().unwrap_or_else(|_| panic!("case {case} printed {out:?}"))
}

/// Settings the user gave glibc keep the policy off.
fn the_user_s_glibc_malloc_settings_keep_the_policy_off() {
    let env =
        |pairs: &'static [(&'static str, &'static str)]| move |v: &str| pairs.iter().find(|(k, _)| *k == v).map(|(_, x)| x.to_string());
    assert_eq!(malloc_policy::user_setting(env(&[])), None);
    assert_eq!(malloc_policy::user_setting(env(&[("GLIBC_TUNABLES", "glibc.rtld.nns=2")])), None);
    assert_eq!(
        malloc_policy::user_setting(env(&[("GLIBC_TUNABLES", "glibc.rtld.nns=2:glibc.malloc.arena_max=4")])),
        Some("GLIBC_TUNABLES")
    );
    assert_eq!(malloc_policy::user_setting(env(&[("MALLOC_TRIM_THRESHOLD_", "0")])), Some("MALLOC_TRIM_THRESHOLD_"));
    assert_eq!(malloc_policy::user_setting(env(&[("MALLOC_ARENA_MAX", "2")])), Some("MALLOC_ARENA_MAX"));
}

fn main() {
    if std::env::var_os(CASE).is_some() {
        // Faults are counted per page: where the host maps fresh memory in transparent
        // huge pages, 8 MiB would be 4 faults, not 2,048.
        rustix::thread::disable_transparent_huge_pages(true).expect("prctl(PR_SET_THP_DISABLE)");
    }
    match std::env::var(CASE).as_deref() {
        Ok("policy") => {
            assert_eq!(malloc_policy::apply(), malloc_policy::Applied::Yes);
            println!("{}", faults_of_a_second_thread());
        }
        Ok("glibc-default") => println!("{}", faults_of_a_second_thread()),
        Ok("user-settings") => {
            let applied = malloc_policy::apply();
            assert_eq!(applied, malloc_policy::Applied::UserSettings("GLIBC_TUNABLES"));
            println!("{}", faults_of_a_second_thread());
        }
        Ok(other) => panic!("unknown case {other}"),
        Err(_) => {
            the_user_s_glibc_malloc_settings_keep_the_policy_off();
            let pages = (BUFFER / 4096) as u64;
            // glibc's defaults: the second thread's buffer is on fresh pages, every one
            // faulted in (the case the policy is for; if this fails, glibc changed).
            let default = run_case("glibc-default");
            assert!(default >= pages / 2, "glibc's defaults: {default} faults for {pages} pages");
            // The policy: the first thread's pages are reused.
            let policy = run_case("policy");
            assert!(policy < pages / 16, "with the policy: {policy} faults for {pages} pages (glibc's defaults: {default})");
            // The user's settings left alone: glibc's defaults again.
            let user = run_case("user-settings");
            assert!(user >= pages / 2, "with the user's GLIBC_TUNABLES: {user} faults for {pages} pages");
            println!("malloc_policy: a second thread's {BUFFER}-byte buffer took {default} page faults with glibc's defaults, {policy} with the policy: ok");
        }
    }
}
