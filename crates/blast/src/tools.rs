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
    /// A replayed run (`--replay`) the recording does not hold.
    #[error("{message}")]
    Replay { message: String },
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

/// BLAST+'s own complaint in `stderr`: its first error line (BLAST+ prints its whole
/// usage text after a bad option, and the same error twice; the user needs the one line
/// that says what is wrong).
pub fn error_lines(stderr: &str) -> String {
    let errors: Vec<&str> = stderr.lines().map(str::trim).filter(|l| l.starts_with("Error") || l.contains(" error: ")).collect();
    // For a bad option value BLAST+ first says what failed to convert, then which
    // argument it was: the line naming the argument says more.
    let named = errors.iter().find(|l| l.starts_with("Error: Argument") || l.starts_with("Error: Unknown argument"));
    named.or(errors.first()).copied().unwrap_or(stderr.trim()).to_string()
}

/// Whether BLAST+'s `stderr` reports a bad command-line option (its argument parser's
/// `CArgException`), as opposed to a problem with the data.
pub fn is_option_error(stderr: &str) -> bool {
    stderr.contains("CArgException")
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
    fn the_first_error_line_is_blasts_complaint() {
        let usage = "USAGE\n  blastp [-h] ...\nDESCRIPTION\n   Protein-Protein BLAST 2.12.0+\n\nUse '-help' to print detailed descriptions of command line arguments\n========================================================================\n\nError: Unknown argument: \"evalu\"\nError:  (CArgException::eInvalidArg) Unknown argument: \"evalu\"\n";
        assert_eq!(error_lines(usage), "Error: Unknown argument: \"evalu\"");
        assert!(is_option_error(usage));
        let value = "Error: Cannot convert string 'abc' to double (m_Pos = 0)\nError: Argument \"evalue\". Argument cannot be converted:  `abc'\nError:  (CArgException::eConvert) Argument \"evalue\". Argument cannot be converted:  `abc'\n";
        assert_eq!(error_lines(value), "Error: Argument \"evalue\". Argument cannot be converted:  `abc'");
        let db = "BLAST Database error: No alias or index file found for protein database [x] in search path [/tmp::]";
        assert_eq!(error_lines(db), db);
        assert!(!is_option_error(db));
    }
}
