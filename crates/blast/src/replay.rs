//! Recorded search runs, replayed (`gepsea search --record DIR` / `--replay DIR`): how
//! this 2-core machine emulates clusters of tens of nodes honestly.
//!
//! On one machine every emulated node shares the same cores, so a real search on 36
//! namespace nodes measures nothing but contention. What the GePSeA paper measures is
//! everything *around* the searches: scheduling, staging, merging, formatting,
//! compressing and writing results, and who waits for whom. Replay keeps all of that
//! real and removes only the BLAST+ search itself: a worker that would run BLAST+ for a
//! task instead waits (asleep, using no CPU) for as long as a real run of that same
//! task took when it was recorded, then delivers that run's exact output (its stdout,
//! or the file it wrote with `-out`). Merging, formatting (`blast_formatter`), the
//! agents, the master, the network and the output location are the real code.
//!
//! A recording is a directory: `recording.json` says which search it is of (the
//! database's manifest hash, the query file's SHA-256, program, output format and
//! options), and `runs/<key>.out` + `runs/<key>.json` hold each BLAST+ run's output and
//! duration, keyed by a hash of everything that decides that output (the recording's
//! identity, the query file's contents, the database name and the options; not paths,
//! the output file or the thread count). Replaying against another database or query
//! set is refused before anything starts; a task the recording does not hold (other
//! batches or fragments) fails with a message that says so. Recorded files are written
//! to a temporary name and renamed, so workers recording in parallel never leave a torn
//! run behind.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::output::Destination;
use crate::tools::{self, ToolError};

/// Record real runs, or replay recorded ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplayMode {
    Record,
    Replay,
}

/// What the user asked for on the command line.
#[derive(Clone, Debug)]
pub struct ReplayRequest {
    pub mode: ReplayMode,
    pub dir: PathBuf,
}

/// An opened recording, handed to every worker with its tasks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recording {
    pub mode: ReplayMode,
    /// Absolute: workers on other nodes open it.
    pub dir: PathBuf,
    /// Hash of the recording's identity (part of every run's key).
    pub identity: String,
}

/// Which search a recording is of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Identity {
    /// SHA-256 of the database's manifest (its fragments, files and their checksums).
    database: String,
    /// SHA-256 of the query file's bytes.
    queries: String,
    program: String,
    outfmt: String,
    blast_args: Vec<String>,
    /// Where they were, for the error message only.
    database_path: String,
    query_path: String,
}

/// One recorded BLAST+ run.
#[derive(Debug, Serialize, Deserialize)]
struct RunRecord {
    seconds: f64,
    /// What it was (for people reading the recording).
    program: String,
    database: String,
    /// The output went to `-out` (a part file) rather than stdout.
    to_file: bool,
}

/// Why a recording cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(
        "{dir}: not a recording (no recording.json); make one with `gepsea search --record {dir} ...` (or `gepsea-bench cluster --record`)"
    )]
    NotARecording { dir: PathBuf },
    #[error("{dir} holds a recording of another {what} ({recorded}), not of this search's {now}: record this search again with --record")]
    Mismatch { dir: PathBuf, what: &'static str, recorded: String, now: String },
    #[error("{dir}: {message}")]
    Bad { dir: PathBuf, message: String },
}

fn sha256_hex(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

impl ReplayRequest {
    /// Opens the recording for this search: record mode creates the directory (or
    /// reuses one holding a recording of the same search); replay mode checks that the
    /// recording is of this database, query set, program, format and options.
    pub fn open(
        &self,
        manifest: &crate::db::Manifest,
        database_path: &Path,
        query_path: &Path,
        program: &str,
        outfmt: &str,
        blast_args: &[String],
    ) -> Result<Recording, ReplayError> {
        let bad = |message: String| ReplayError::Bad { dir: self.dir.clone(), message };
        let queries = std::fs::read(query_path).map_err(|e| bad(format!("{}: {e}", query_path.display())))?;
        let now = Identity {
            database: sha256_hex(&serde_json::to_vec(manifest).expect("a manifest serialises")),
            queries: sha256_hex(&queries),
            program: program.to_string(),
            outfmt: outfmt.to_string(),
            blast_args: blast_args.iter().filter(|a| !is_thread_option(a)).cloned().collect(),
            database_path: database_path.display().to_string(),
            query_path: query_path.display().to_string(),
        };
        let file = self.dir.join("recording.json");
        let recorded: Option<Identity> = match std::fs::read(&file) {
            Ok(b) => Some(serde_json::from_slice(&b).map_err(|e| bad(format!("recording.json: {e}")))?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(bad(format!("recording.json: {e}"))),
        };
        match (self.mode, recorded) {
            (ReplayMode::Replay, None) => return Err(ReplayError::NotARecording { dir: self.dir.clone() }),
            (_, Some(r)) => check_same(&self.dir, &r, &now)?,
            (ReplayMode::Record, None) => {
                std::fs::create_dir_all(self.dir.join("runs")).map_err(|e| bad(e.to_string()))?;
                Destination::of(&file)
                    .write(&serde_json::to_vec_pretty(&now).expect("an identity serialises"))
                    .map_err(|e| bad(e.to_string()))?;
            }
        }
        let dir = std::fs::canonicalize(&self.dir).map_err(|e| bad(e.to_string()))?;
        let mut h = Sha256::new();
        for s in [&now.database, &now.queries, &now.program, &now.outfmt] {
            h.update(s.as_bytes());
            h.update([0]);
        }
        for a in &now.blast_args {
            h.update(a.as_bytes());
            h.update([0]);
        }
        Ok(Recording { mode: self.mode, dir, identity: format!("{:x}", h.finalize()) })
    }
}

fn check_same(dir: &Path, recorded: &Identity, now: &Identity) -> Result<(), ReplayError> {
    let differ = |what: &'static str, r: String, n: String| ReplayError::Mismatch { dir: dir.to_path_buf(), what, recorded: r, now: n };
    if recorded.database != now.database {
        return Err(differ("database", recorded.database_path.clone(), now.database_path.clone()));
    }
    if recorded.queries != now.queries {
        return Err(differ("query set", recorded.query_path.clone(), now.query_path.clone()));
    }
    if recorded.program != now.program {
        return Err(differ("program", recorded.program.clone(), now.program.clone()));
    }
    if recorded.outfmt != now.outfmt {
        return Err(differ("output format", format!("-outfmt {}", recorded.outfmt), format!("-outfmt {}", now.outfmt)));
    }
    if recorded.blast_args != now.blast_args {
        return Err(differ("set of BLAST+ options", recorded.blast_args.join(" "), now.blast_args.join(" ")));
    }
    Ok(())
}

fn is_thread_option(a: &str) -> bool {
    a == "-num_threads"
}

impl Recording {
    /// The key of a BLAST+ run: the recording's identity, the program, the query file's
    /// contents, and every other argument except the output file and the thread count.
    fn key(&self, program: &str, args: &[&str]) -> std::io::Result<(String, Option<PathBuf>)> {
        let mut h = Sha256::new();
        h.update(self.identity.as_bytes());
        h.update([0]);
        h.update(program.as_bytes());
        h.update([0]);
        let mut out = None;
        let mut i = 0;
        while i < args.len() {
            let (a, v) = (args[i], args.get(i + 1).copied());
            match (a, v) {
                ("-query", Some(q)) => {
                    h.update(b"-query\0");
                    h.update(std::fs::read(q)?);
                    h.update([0]);
                    i += 2;
                }
                ("-out", Some(o)) => {
                    out = Some(PathBuf::from(o));
                    i += 2;
                }
                ("-num_threads", Some(_)) => i += 2,
                _ => {
                    h.update(a.as_bytes());
                    h.update([0]);
                    i += 1;
                }
            }
        }
        Ok((format!("{:x}", h.finalize())[..40].to_string(), out))
    }

    /// Replay: checks that the recording holds the search of every batch file on every
    /// database, as workers will ask for them (`-query B -db D -outfmt F args...`).
    pub fn check_holds(
        &self,
        program: &str,
        batches: &[PathBuf],
        databases: &[String],
        outfmt: &str,
        blast_args: &[String],
    ) -> Result<(), ReplayError> {
        if self.mode != ReplayMode::Replay {
            return Ok(());
        }
        for (b, q) in batches.iter().enumerate() {
            for d in databases {
                let qs = q.to_string_lossy();
                let mut args: Vec<&str> = vec!["-query", &qs, "-db", d, "-outfmt", outfmt];
                args.extend(blast_args.iter().map(|s| s.as_str()));
                let (key, _) = self.key(program, &args).map_err(|e| ReplayError::Bad { dir: self.dir.clone(), message: e.to_string() })?;
                if !self.dir.join("runs").join(format!("{key}.json")).is_file() {
                    return Err(ReplayError::Bad {
                        dir: self.dir.clone(),
                        message: format!(
                            "no recorded run of query batch {b} on {d}: the recording was made with other batches or fragments; replay with the --batch-residues, --split and database it was recorded with, or record again"
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// Runs (record) or replays one BLAST+ search run: what [`tools::run`] would
    /// return, and, when `-out` names a file, that file written.
    pub fn run(&self, program: &str, args: &[&str], blastdb: Option<&std::ffi::OsStr>, cwd: Option<&Path>) -> Result<Output, ToolError> {
        let io = |e: std::io::Error| ToolError::Io { program: format!("{program} (recording {})", self.dir.display()), source: e };
        let (key, out_file) = self.key(program, args).map_err(io)?;
        let data_path = self.dir.join("runs").join(format!("{key}.out"));
        let meta_path = self.dir.join("runs").join(format!("{key}.json"));
        let database = args.iter().position(|a| *a == "-db").and_then(|i| args.get(i + 1)).unwrap_or(&"").to_string();
        match self.mode {
            ReplayMode::Record => {
                let started = Instant::now();
                let out = tools::run(program, args, blastdb, cwd)?;
                let seconds = started.elapsed().as_secs_f64();
                let data = match &out_file {
                    Some(f) => std::fs::read(f).map_err(io)?,
                    None => out.stdout.clone(),
                };
                Destination::of(&data_path).write(&data).map_err(io)?;
                let meta = RunRecord { seconds, program: program.to_string(), database, to_file: out_file.is_some() };
                Destination::of(&meta_path).write(&serde_json::to_vec(&meta).expect("a record serialises")).map_err(io)?;
                Ok(out)
            }
            ReplayMode::Replay => {
                let started = Instant::now();
                let meta: RunRecord = match std::fs::read(&meta_path) {
                    Ok(b) => serde_json::from_slice(&b).map_err(|e| io(std::io::Error::other(format!("{}: {e}", meta_path.display()))))?,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Err(ToolError::Replay {
                            message: format!(
                                "{}: no recorded run of {program} on {database} for this query batch (key {key}); the recording was made with other batches or fragments: record again with the same --batch-residues, --split and database",
                                self.dir.display()
                            ),
                        })
                    }
                    Err(e) => return Err(io(e)),
                };
                let data = std::fs::read(&data_path).map_err(io)?;
                if let Some(left) = Duration::from_secs_f64(meta.seconds.max(0.0)).checked_sub(started.elapsed()) {
                    std::thread::sleep(left);
                }
                let stdout = match &out_file {
                    Some(f) => {
                        std::fs::write(f, &data).map_err(io)?;
                        Vec::new()
                    }
                    None => data,
                };
                use std::os::unix::process::ExitStatusExt;
                Ok(Output { status: std::process::ExitStatus::from_raw(0), stdout, stderr: Vec::new() })
            }
        }
    }
}

/// A search run: recorded or replayed under `recording`, else BLAST+ itself.
pub fn run_search(
    recording: Option<&Recording>,
    program: &str,
    args: &[&str],
    blastdb: Option<&std::ffi::OsStr>,
    cwd: Option<&Path>,
) -> Result<Output, ToolError> {
    match recording {
        Some(r) => r.run(program, args, blastdb, cwd),
        None => tools::run(program, args, blastdb, cwd),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_dir::TestDir;

    fn recording(dir: &Path, mode: ReplayMode) -> Recording {
        Recording { mode, dir: dir.to_path_buf(), identity: "id".into() }
    }

    #[test]
    fn the_key_ignores_paths_of_output_and_threads_but_not_the_queries() {
        let d = TestDir::new("replay-test-key");
        let (q1, q2, q3) = (d.path().join("a.fasta"), d.path().join("b.fasta"), d.path().join("c.fasta"));
        std::fs::write(&q1, ">q\nMKV\n").unwrap();
        std::fs::write(&q2, ">q\nMKV\n").unwrap();
        std::fs::write(&q3, ">q\nMKW\n").unwrap();
        let r = recording(d.path(), ReplayMode::Replay);
        let k = |q: &Path, extra: &[&str]| {
            let qs = q.to_string_lossy().to_string();
            let mut args = vec!["-query", qs.as_str(), "-db", "f0.stats", "-outfmt", "11"];
            args.extend(extra);
            r.key("blastp", &args).unwrap()
        };
        assert_eq!(k(&q1, &[]).0, k(&q2, &["-num_threads", "2", "-out", "/x/y"]).0);
        assert_eq!(k(&q2, &["-out", "/x/y"]).1, Some(PathBuf::from("/x/y")));
        assert_ne!(k(&q1, &[]).0, k(&q3, &[]).0);
        assert_ne!(k(&q1, &[]).0, k(&q1, &["-evalue", "1"]).0);
    }

    #[test]
    fn a_replayed_run_returns_the_recorded_bytes_after_the_recorded_time() {
        let d = TestDir::new("replay-test-run");
        std::fs::create_dir_all(d.path().join("runs")).unwrap();
        let q = d.path().join("q.fasta");
        std::fs::write(&q, ">q\nMKV\n").unwrap();
        let qs = q.to_string_lossy().to_string();
        let r = recording(d.path(), ReplayMode::Replay);
        let args = ["-query", qs.as_str(), "-db", "DB", "-outfmt", "11"];
        let (key, _) = r.key("blastp", &args).unwrap();
        match r.run("blastp", &args, None, None) {
            Err(ToolError::Replay { message }) => assert!(message.contains("no recorded run of blastp on DB"), "{message}"),
            other => panic!("expected a missing run, got {other:?}"),
        }
        std::fs::write(d.path().join("runs").join(format!("{key}.out")), b"archive bytes").unwrap();
        let meta = RunRecord { seconds: 0.3, program: "blastp".into(), database: "DB".into(), to_file: false };
        std::fs::write(d.path().join("runs").join(format!("{key}.json")), serde_json::to_vec(&meta).unwrap()).unwrap();
        let t = Instant::now();
        let out = r.run("blastp", &args, None, None).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(300));
        assert_eq!(out.stdout, b"archive bytes");
        // With -out, the bytes go to that file.
        let part = d.path().join("part");
        let ps = part.to_string_lossy().to_string();
        let with_out = ["-query", qs.as_str(), "-db", "DB", "-outfmt", "11", "-out", ps.as_str()];
        assert!(r.run("blastp", &with_out, None, None).unwrap().stdout.is_empty());
        assert_eq!(std::fs::read(&part).unwrap(), b"archive bytes");
    }
}
