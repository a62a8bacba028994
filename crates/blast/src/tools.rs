//! Running NCBI BLAST+ programs, with errors that say what failed and how to fix it.

use std::ffi::{OsStr, OsString};
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
pub fn run_env(program: &str, args: &[&str], blastdb: Option<&OsStr>, cwd: Option<&Path>, env: &[(&str, &str)]) -> Result<Output, ToolError> {
    let mut c = Command::new(program);
    c.args(args).stdin(Stdio::null());
    c.envs(env.iter().copied());
    if let Some(d) = blastdb {
        c.env("BLASTDB", d);
    }
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    let out = c.output().map_err(|e| {
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

/// BLAST+'s own complaint in `stderr`: its `Error:` lines (BLAST+ prints its whole
/// usage text after a bad option; the user needs the one line that says what is wrong).
pub fn error_lines(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().map(str::trim).filter(|l| l.contains("Error")).collect();
    if lines.is_empty() {
        stderr.trim().to_string()
    } else {
        lines.join("; ")
    }
}

/// The BLAST+ version, e.g. `2.12.0+`.
pub fn version() -> Result<String, ToolError> {
    let out = run("blastp", &["-version"], None, None)?;
    let s = String::from_utf8_lossy(&out.stdout);
    Ok(s.split_whitespace().nth(1).unwrap_or("unknown").to_string())
}
