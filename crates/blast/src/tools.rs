//! Running NCBI BLAST+ programs, with errors that say what failed and how to fix it.

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

/// Runs `program args...` with `BLASTDB` set to `blastdb` (if given), returning its
/// output on success.
pub fn run(program: &str, args: &[&str], blastdb: Option<&Path>, cwd: Option<&Path>) -> Result<Output, ToolError> {
    run_env(program, args, blastdb, cwd, &[])
}

/// Like [`run`], with extra environment variables.
pub fn run_env(program: &str, args: &[&str], blastdb: Option<&Path>, cwd: Option<&Path>, env: &[(&str, &str)]) -> Result<Output, ToolError> {
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

/// The BLAST+ version, e.g. `2.12.0+`.
pub fn version() -> Result<String, ToolError> {
    let out = run("blastp", &["-version"], None, None)?;
    let s = String::from_utf8_lossy(&out.stdout);
    Ok(s.split_whitespace().nth(1).unwrap_or("unknown").to_string())
}
