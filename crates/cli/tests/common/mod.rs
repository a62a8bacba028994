//! Helpers shared by the integration tests: running gepsea and BLAST+, temporary
//! directories removed on drop, FASTA slices of the example data.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

pub const DB_GZ: &str = "/usr/share/doc/mmseqs2/example-data/DB.fasta.gz";
pub const QUERY_GZ: &str = "/usr/share/doc/mmseqs2/example-data/QUERY.fasta.gz";
pub const RRNA: &str = "/usr/share/microbiomeutil-data/RESOURCES/rRNA16S.gold.fasta";

/// Proteins of the example database (20,000) that the search tests search: its first
/// quarter. A search's cost grows with the database (25 queries, one thread: 6.8 s on
/// all of it, 2.3 s on 5,000, which still give those queries 372 hits); what the tests
/// check (cutting, merging, printing, stopping, resuming) does not. `make test` took
/// 1,824-1,967 s on a 2-vCPU guest on the whole database (budget: 25 minutes). The
/// benchmarks and `make soak` search all of it.
pub const DB_PROTEINS: usize = 5000;

pub fn gepsea() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gepsea"))
}

/// Runs `c`, failing the test with its stderr unless it succeeds.
pub fn run_ok(mut c: Command) -> Output {
    let out = c.output().expect("spawn");
    assert!(out.status.success(), "{c:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// The text of a gzip file.
pub fn zcat(path: &str) -> String {
    let mut c = Command::new("zcat");
    c.arg(path);
    String::from_utf8(run_ok(c).stdout).unwrap()
}

/// The first `n` records of a FASTA text.
pub fn head(text: &str, n: usize) -> String {
    records(text, 0, n)
}

/// Records `skip + 1` to `skip + n` of a FASTA text.
pub fn records(text: &str, skip: usize, n: usize) -> String {
    let mut out = String::new();
    let mut count = 0;
    for line in text.lines() {
        if line.starts_with('>') {
            count += 1;
        }
        if count > skip.saturating_add(n) {
            break;
        }
        if count > skip {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// A directory removed when dropped (also when the test fails).
pub struct TempDir(pub PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory named after the test and this process.
pub fn tempdir(tag: &str) -> TempDir {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let d =
        std::env::temp_dir().join(format!("gepsea-t-{tag}-{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)));
    std::fs::create_dir_all(&d).unwrap();
    TempDir(d)
}

/// Finished parts in the default work directory of search output `out` (kept for a
/// rerun to resume from).
pub fn part_files(out: &std::path::Path) -> Vec<PathBuf> {
    let parts = out.parent().unwrap().join(format!(".{}.gepsea-work/parts", out.file_name().unwrap().to_string_lossy()));
    std::fs::read_dir(parts)
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".part")).map(|e| e.path()).collect())
        .unwrap_or_default()
}

pub fn finished_parts(out: &std::path::Path) -> usize {
    part_files(out).len()
}

/// The names in `dir`, sorted.
pub fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
    v.sort();
    v
}

/// Byte equality with the first differing line in the failure message.
pub fn assert_identical(got: &std::path::Path, want: &std::path::Path, what: &str) {
    let (g, w) = (std::fs::read(got).unwrap_or_else(|e| panic!("{}: {e}", got.display())), std::fs::read(want).unwrap());
    if g != w {
        let (gl, wl) = (String::from_utf8_lossy(&g), String::from_utf8_lossy(&w));
        let i = gl.lines().zip(wl.lines()).position(|(a, b)| a != b).unwrap_or(gl.lines().count().min(wl.lines().count()));
        panic!(
            "{what}: differs from serial BLAST+ at line {}:\n  gepsea: {:?}\n  serial: {:?}",
            i + 1,
            gl.lines().nth(i),
            wl.lines().nth(i)
        );
    }
}

/// Directories built once per test process by [`fixture`], removed when it exits.
static AT_EXIT: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

extern "C" fn remove_fixtures() {
    if let Ok(dirs) = AT_EXIT.lock() {
        for d in dirs.iter() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A directory shared by the tests of one file, built once by `init` and removed when
/// the test process exits (tests run as threads of one process; the last one to finish
/// cannot know it is the last).
pub fn fixture(cell: &'static std::sync::OnceLock<PathBuf>, tag: &str, init: impl FnOnce(&std::path::Path)) -> &'static std::path::Path {
    cell.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("gepsea-{tag}-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut dirs = AT_EXIT.lock().unwrap();
        if dirs.is_empty() {
            // SAFETY: registering a plain C callback that only removes directories.
            unsafe { libc::atexit(remove_fixtures) };
        }
        dirs.push(dir.clone());
        drop(dirs);
        init(&dir);
        dir
    })
}
