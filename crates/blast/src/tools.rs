//! Running NCBI BLAST+ programs, with errors that say what failed and how to fix it.

use std::cell::Cell;
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// A BLAST+ program could not be run or reported failure.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("{program} not found: install NCBI BLAST+ (Debian package ncbi-blast+, or `make setup`)")]
    Missing { program: String },
    #[error("{program} failed ({status}): {stderr}")]
    Failed { program: String, status: String, stderr: String },
    #[error("running {program}: {source}")]
    Io { program: String, source: std::io::Error },
    /// A replayed run (`--replay`) the recording does not hold.
    #[error("{message}")]
    Replay { message: String },
}

/// Makes the child get SIGTERM when the thread that started it ends, however its
/// process ends (killed outright, by the OOM killer, or by a launcher), so that nothing
/// a job started outlives it: a BLAST+ run of a killed search went on for as long as
/// its batch took (hours on a large database), on the cores a rerun then wanted.
///
/// The signal follows the starting *thread* (`PR_SET_PDEATHSIG`), so a child must be
/// started by a thread that outlives it: every caller here waits for its child on the
/// thread that started it. A child whose parent died before the request took effect
/// stops at once.
pub fn with_parent_death(c: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: prctl, getppid and raise are async-signal-safe and touch only the child
    // being created.
    unsafe {
        c.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            if libc::getppid() as u32 != parent {
                libc::raise(libc::SIGTERM);
            }
            Ok(())
        })
    }
}

/// How `child` ended, if it has, waiting up to `patience` for it (polled every 10 ms).
pub(crate) fn wait_for_exit(child: &mut std::process::Child, patience: std::time::Duration) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + patience;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(10)),
            _ => return None,
        }
    }
}

/// Stops a child that shuts down cleanly on SIGTERM (an agent): asks it, gives it
/// `patience`, then kills it; reaped either way.
pub(crate) fn terminate(child: &mut std::process::Child, patience: std::time::Duration) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    wait_for_exit(child, patience);
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs `program args...` with `BLASTDB` set to `blastdb` (if given: one directory, or a
/// search path as [`search_path`] makes), returning its output on success.
pub fn run(program: &str, args: &[&str], blastdb: Option<&OsStr>, cwd: Option<&Path>) -> Result<Output, ToolError> {
    run_env(program, args, blastdb, cwd, &[])
}

/// `BLASTDB` for BLAST+ runs of a job: `dirs` first (gepsea's own alias files), then
/// the directories the user's own `BLASTDB` names, so that a database name resolves as
/// it does in the user's serial run and taxonomy files (`taxdb.bti`) are still found.
/// BLAST+ reads `BLASTDB` as a colon-separated list.
pub fn search_path(dirs: &[&Path]) -> OsString {
    let mut out = OsString::new();
    let user = std::env::var_os("BLASTDB").filter(|v| !v.is_empty());
    for (i, d) in dirs.iter().map(|d| d.as_os_str()).chain(user.as_deref()).enumerate() {
        if i > 0 {
            out.push(":");
        }
        out.push(d);
    }
    out
}

/// Like [`run`], with extra environment variables.
pub fn run_env(
    program: &str,
    args: &[&str],
    blastdb: Option<&OsStr>,
    cwd: Option<&Path>,
    env: &[(&str, &str)],
) -> Result<Output, ToolError> {
    let mut c = Command::new(program);
    with_parent_death(&mut c).args(args).stdin(Stdio::null());
    c.envs(env.iter().copied());
    if let Some(d) = blastdb {
        c.env("BLASTDB", d);
    }
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    let out = output_counting_cpu(&mut c).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ToolError::Missing { program: program.to_string() }
        } else {
            ToolError::Io { program: program.to_string(), source: e }
        }
    })?;
    if !out.status.success() {
        return Err(ToolError::Failed {
            program: program.to_string(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out)
}

thread_local! {
    /// CPU seconds of the programs this thread ran through [`run_env`], theirs and
    /// their children's, added as each one ends.
    static CHILDREN_CPU: Cell<f64> = const { Cell::new(0.0) };
}

/// The CPU a piece of work costs: the calling thread's own, plus that of the BLAST+
/// programs it runs meanwhile ([`run`], [`run_env`]).
///
/// Why not the wall time: where many writers share few cores (36 emulated nodes on 2
/// cores), each write's wall time is stretched by all the others, and a model that
/// books those times as work on the cores plays the contention twice (see
/// `gepsea-bench cluster`'s model). CPU time is what the work costs wherever it runs.
/// The wall time comes along ([`CpuClock::wall_seconds`]): the traces keep both, the
/// mpiBLAST master's writes being played as wall time on its critical path.
#[derive(Clone, Copy, Debug)]
pub struct CpuClock {
    wall_started: std::time::Instant,
    thread_started: f64,
    children_started: f64,
}

impl CpuClock {
    pub fn start() -> CpuClock {
        CpuClock { wall_started: std::time::Instant::now(), thread_started: thread_cpu(), children_started: CHILDREN_CPU.with(Cell::get) }
    }

    /// Wall seconds since [`CpuClock::start`].
    pub fn wall_seconds(&self) -> f64 {
        self.wall_started.elapsed().as_secs_f64()
    }

    /// CPU seconds since [`CpuClock::start`], on this thread and its programs (call it
    /// on the thread that started the clock).
    pub fn seconds(&self) -> f64 {
        self.thread_seconds() + (CHILDREN_CPU.with(Cell::get) - self.children_started).max(0.0)
    }

    /// The part of [`CpuClock::seconds`] spent on this thread itself (in a process's
    /// own CPU, where its programs' is not).
    pub fn thread_seconds(&self) -> f64 {
        (thread_cpu() - self.thread_started).max(0.0)
    }
}

fn thread_cpu() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// [`Command::output`], and the program's CPU time (its own and its waited-for
/// children's) added to this thread's [`CHILDREN_CPU`]. The times are read from
/// `/proc/PID/stat` once the program has exited and before it is reaped (`waitid`
/// with `WNOWAIT`), which needs no `unsafe`; a program whose times cannot be read
/// counts for nothing.
fn output_counting_cpu(c: &mut Command) -> std::io::Result<Output> {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn()?;
    // Both pipes drain at once, or a program filling one would block on it.
    let stderr_pipe = child.stderr.take();
    let stderr_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(mut s) = stderr_pipe {
            let _ = s.read_to_end(&mut v);
        }
        v
    });
    let mut stdout = Vec::new();
    if let Err(e) = child.stdout.take().map_or(Ok(0), |mut s| s.read_to_end(&mut stdout)) {
        // Neither the program nor the reader thread is left behind.
        let _ = child.kill();
        let _ = child.wait();
        let _ = stderr_reader.join();
        return Err(e);
    }
    let stderr = stderr_reader.join().unwrap_or_default();
    let pid = rustix::process::Pid::from_child(&child);
    let exited = rustix::process::waitid(
        rustix::process::WaitId::Pid(pid),
        rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOWAIT,
    );
    if exited.is_ok() {
        if let Some(cpu) = exited_cpu_seconds(child.id()) {
            CHILDREN_CPU.with(|c| c.set(c.get() + cpu));
        }
    }
    let status = child.wait()?;
    Ok(Output { status, stdout, stderr })
}

/// User and system time of exited (not yet reaped) process `pid`, its reaped
/// children's included.
fn exited_cpu_seconds(pid: u32) -> Option<f64> {
    proc_stat(pid).map(|s| s.own + s.waited)
}

/// What `/proc/PID/stat` says of a process: for the CPU accounting of the programs
/// run here, and for the benchmarks' samplers.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcStat {
    /// The command name (the program's file name, up to 15 bytes).
    pub comm: String,
    /// CPU seconds of the process itself, and of the children it has waited for.
    pub own: f64,
    pub waited: f64,
    /// When it started, in seconds since boot (`/proc/uptime`'s clock).
    pub started: f64,
}

/// `pid`'s [`ProcStat`]; `None` once the process is gone (or reaped).
pub fn proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_proc_stat(&stat, rustix::param::clock_ticks_per_second() as f64)
}

/// A `/proc/PID/stat` line read with `ticks_per_second` clock ticks a second. The
/// command name (field 2) may hold spaces and parentheses: the fields are counted from
/// its last `)`.
fn parse_proc_stat(stat: &str, ticks_per_second: f64) -> Option<ProcStat> {
    let (head, tail) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_string();
    let f: Vec<&str> = tail.split_whitespace().collect();
    // Counted from the state (field 3): utime, stime, cutime, cstime (11-14),
    // starttime (19).
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok());
    let hz = ticks_per_second.max(1.0);
    Some(ProcStat {
        comm,
        own: (ticks(11)? + ticks(12)?) / hz,
        waited: (ticks(13)? + ticks(14)?) / hz,
        started: ticks(19).unwrap_or(0.0) / hz,
    })
}

/// Whether process `pid` of this host is gone: no such process, or a zombie (dead,
/// waiting to be reaped; where PID 1 does not reap, as in containers started without
/// an init, a killed search stays one for good and would count as running).
pub fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => proc_state_dead(&stat),
        Err(_) => true,
    }
}

/// Removes every entry of `dir` named `<prefix><pid>` (for one of `prefixes`) whose
/// process is gone ([`process_gone`]; this process's own are kept): what a run killed
/// outright left behind, file or directory.
pub(crate) fn remove_leftovers_of_gone(dir: &Path, prefixes: &[&str]) {
    remove_leftovers_of_gone_if(dir, prefixes, |_| true)
}

/// [`remove_leftovers_of_gone`], for the entries `ours` also claims (a name alone does
/// not prove whose an entry is where a user may choose names too).
pub(crate) fn remove_leftovers_of_gone_if(dir: &Path, prefixes: &[&str], ours: impl Fn(&Path) -> bool) {
    let gone = |pid: &str| pid.parse::<u32>().is_ok_and(|p| p != std::process::id() && process_gone(p));
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if prefixes.iter().any(|p| name.strip_prefix(p).is_some_and(gone)) && ours(&e.path()) {
            let p = e.path();
            let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        }
    }
}

/// Whether `a` and `b` name the same existing file (through links or other spellings
/// of the path too).
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => (x.dev(), x.ino()) == (y.dev(), y.ino()),
        _ => false,
    }
}

/// Whether a `/proc/PID/stat` line's state (the field after the command name's last
/// `)`) is a dead one: zombie or dead.
fn proc_state_dead(stat: &str) -> bool {
    stat.rsplit_once(')').and_then(|(_, tail)| tail.split_whitespace().next()).is_some_and(|s| s == "Z" || s == "X")
}

/// BLAST+'s own complaint in `stderr`: its first error line (BLAST+ prints its whole
/// usage text after a bad option, and the same error twice; the user needs the one line
/// that says what is wrong).
pub fn error_lines(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().map(str::trim).collect();
    let errors: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].starts_with("Error") || lines[i].contains(" error: ")).collect();
    // For a bad option value BLAST+ first says what failed to convert, then which
    // argument it was: the line naming the argument says more.
    let named = errors.iter().find(|&&i| lines[i].starts_with("Error: Argument") || lines[i].starts_with("Error: Unknown argument"));
    match named.or(errors.first()) {
        // "Error: NCBI C++ Exception:" says what follows on the next line.
        Some(&i) if lines[i].ends_with(':') && lines.get(i + 1).is_some_and(|l| !l.is_empty()) => format!("{} {}", lines[i], lines[i + 1]),
        Some(&i) => lines[i].to_string(),
        // One line of the rest, as an error line is: a C++ exception's `terminate
        // called ...` and `what(): ...` came as two.
        None => stderr.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" "),
    }
}

/// Below this many bytes free a file system counts as full in
/// [`with_full_file_system`].
const FULL_BELOW_BYTES: u64 = 1 << 20;

/// `message` (a BLAST+ program's failure), followed by the reason when the program
/// wrote into `dir` and that file system is full: BLAST+ reports a failed write as a
/// C++ exception ("basic_ios::clear: iostream error") that does not say why. Asked
/// before the failed run's output is removed (which frees its space again).
pub fn with_full_file_system(message: String, dir: &Path) -> String {
    match rustix::fs::statvfs(dir).map(|st| st.f_bavail.saturating_mul(st.f_frsize)) {
        Ok(free) if free < FULL_BELOW_BYTES => format!("{message} (the file system of {} is full ({free} bytes free))", dir.display()),
        _ => message,
    }
}

/// Whether BLAST+'s `stderr` reports a bad command-line option (its argument parser's
/// `CArgException`), as opposed to a problem with the data.
pub fn is_option_error(stderr: &str) -> bool {
    stderr.contains("CArgException")
}

/// The fields `program` prints in a tabular report (`-outfmt "6 qseqid ..."`), as its
/// own `-help` lists them: BLAST+ leaves out a field it does not know without a word,
/// and each version knows its own list. Empty if the help text holds no such list.
/// Asked once per program and process (an agent's plug-in checks every part it
/// encodes; a `-help` run takes ≈75 ms).
pub fn tabular_fields_known(program: &str) -> Result<Vec<String>, ToolError> {
    static KNOWN: std::sync::Mutex<Vec<(String, Vec<String>)>> = std::sync::Mutex::new(Vec::new());
    if let Some((_, fields)) = KNOWN.lock().unwrap_or_else(|e| e.into_inner()).iter().find(|(p, _)| p == program) {
        return Ok(fields.clone());
    }
    let out = run(program, &["-help"], None, None)?;
    let fields = fields_in_help(&String::from_utf8_lossy(&out.stdout));
    KNOWN.lock().unwrap_or_else(|e| e.into_inner()).push((program.to_string(), fields.clone()));
    Ok(fields)
}

/// The field names of a BLAST+ program's `-help` text: the lines `qseqid means Query
/// Seq-id` between "The supported format specifiers" and "When not provided".
fn fields_in_help(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.contains("The supported format specifiers"))
        .take_while(|l| !l.contains("When not provided"))
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [field, "means", ..] => Some(field.to_string()),
            _ => None,
        })
        .collect()
}

/// The BLAST+ version, e.g. `2.12.0+`.
pub fn version() -> Result<String, ToolError> {
    let out = run("blastp", &["-version"], None, None)?;
    let s = String::from_utf8_lossy(&out.stdout);
    Ok(s.split_whitespace().nth(1).unwrap_or("unknown").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tabular_fields_are_read_from_the_programs_help() {
        let help = "   -outfmt\n   The supported format specifiers are:\n   \t    qseqid means Query Seq-id\n   \t   staxids means unique Subject Taxonomy ID(s), separated by a ';'\n   \t\t\t (in numerical order)\n   \t   qcovhsp means Query Coverage Per HSP\n   When not provided, the default value is:\n   'qaccver saccver pident' means the same\n";
        assert_eq!(fields_in_help(help), ["qseqid", "staxids", "qcovhsp"]);
        assert!(fields_in_help("no list here\n").is_empty());
    }

    #[test]
    fn zombies_and_missing_processes_are_gone_and_running_ones_are_not() {
        assert!(proc_state_dead("4242 (blast (x) y) Z 1 4242 4242 0 -1"));
        assert!(proc_state_dead("4242 (a) X 1"));
        assert!(!proc_state_dead("4242 (a) Z) S 1 4242"), "the state follows the last parenthesis");
        assert!(!proc_state_dead("4242 (a) R 1"));
        assert!(!process_gone(std::process::id()));
        // A child killed and not yet waited for is a zombie.
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        child.kill().unwrap();
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !process_gone(pid) {
            assert!(std::time::Instant::now() < deadline, "the killed child never showed as gone");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        child.wait().unwrap();
        assert!(process_gone(pid));
    }

    #[test]
    fn a_stat_line_gives_its_cpu_fields_whatever_the_command_name() {
        // A real line's shape: pid, (comm), state, then fields 4.. ; utime 123,
        // stime 45, cutime 6, cstime 7 (fields 14-17), starttime 99 (field 22).
        let line = "4242 (blast (x) y) Z 1 4242 4242 0 -1 4194560 300 0 0 0 123 45 6 7 20 0 1 0 99 0 0";
        let st = parse_proc_stat(line, 100.0).unwrap();
        assert_eq!((st.comm.as_str(), st.own, st.waited, st.started), ("blast (x) y", 1.68, 0.13, 0.99));
        assert_eq!(parse_proc_stat("4242 (short) Z 1 2 3", 100.0), None);
        assert_eq!(parse_proc_stat("no parenthesis", 100.0), None);
    }

    #[test]
    fn a_programs_cpu_is_counted_on_the_thread_that_ran_it() {
        // A shell that burns CPU for a while, then exits: its time is counted on the
        // clock of the thread that ran it, not on this one's (which only waits).
        let here = CpuClock::start();
        let there = std::thread::spawn(|| {
            let clock = CpuClock::start();
            let burn = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo done";
            let out = run("sh", &["-c", burn], None, None).unwrap();
            assert_eq!(out.stdout, b"done\n");
            (clock.seconds(), clock.thread_seconds())
        })
        .join()
        .unwrap();
        let (there, there_thread) = there;
        assert!(there >= 0.05, "a program that burned CPU counted {there} s");
        assert!(there_thread < there / 2.0, "the program's CPU was counted as its thread's own: {there_thread} of {there} s");
        assert!(here.seconds() < there / 2.0, "the waiting thread was charged {} s of {there} s", here.seconds());
        // Its wall clock ran all along: at least the program's CPU time (one thread),
        // give or take the kernel's clock tick in which that is counted.
        assert!(here.wall_seconds() + 0.02 >= there, "wall {} s against the program's {there} CPU-s", here.wall_seconds());
        // A failing program's output still comes back whole.
        let err = run("sh", &["-c", "echo oops >&2; exit 3"], None, None).unwrap_err().to_string();
        assert!(err.contains("oops") && err.contains("exit status: 3"), "{err}");
    }

    #[test]
    fn the_first_error_line_is_blasts_complaint() {
        let usage = "USAGE\n  blastp [-h] ...\nDESCRIPTION\n   Protein-Protein BLAST 2.12.0+\n\nUse '-help' to print detailed descriptions of command line arguments\n========================================================================\n\nError: Unknown argument: \"evalu\"\nError:  (CArgException::eInvalidArg) Unknown argument: \"evalu\"\n";
        assert_eq!(error_lines(usage), "Error: Unknown argument: \"evalu\"");
        assert!(is_option_error(usage));
        let value = "Error: Cannot convert string 'abc' to double (m_Pos = 0)\nError: Argument \"evalue\". Argument cannot be converted:  `abc'\nError:  (CArgException::eConvert) Argument \"evalue\". Argument cannot be converted:  `abc'\n";
        assert_eq!(error_lines(value), "Error: Argument \"evalue\". Argument cannot be converted:  `abc'");
        let db = "BLAST Database error: No alias or index file found for protein database [x] in search path [/tmp::]";
        assert_eq!(error_lines(db), db);
        // A C++ exception's first line only announces the next one.
        let exception =
            "Error: NCBI C++ Exception:\n    T0 \"ncbidiag.hpp\", line 2490: Error: (CSeqIdException::eFormat) Malformatted ID x\n";
        assert_eq!(
            error_lines(exception),
            "Error: NCBI C++ Exception: T0 \"ncbidiag.hpp\", line 2490: Error: (CSeqIdException::eFormat) Malformatted ID x"
        );
        let thrown = "terminate called after throwing an instance of 'std::__ios_failure'\n  what():  basic_ios::clear: iostream error\n";
        assert_eq!(
            error_lines(thrown),
            "terminate called after throwing an instance of 'std::__ios_failure' what():  basic_ios::clear: iostream error"
        );
        assert!(!is_option_error(db));
    }
}
