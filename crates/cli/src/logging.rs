//! One logging switch for every command, following the Rust convention: `RUST_LOG`
//! (tracing-subscriber's filter syntax, e.g. `debug` or `warn,gepsea_agent=debug`)
//! decides when set; otherwise `-v` (info), `-vv` (debug), `-vvv` (trace) and `-q`
//! (errors only) move the command's default level (info for the agent, a daemon whose
//! log is its output; warn for everything else). `GEPSEA_LOG`, the older name, is
//! still read after `RUST_LOG`.
//!
//! The chosen filter is exported as `RUST_LOG` before anything else starts, so the
//! agents and workers a command spawns log at the same level.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::EnvFilter;

/// `-q`: errors only. Read by [`say!`] and [`report!`], which every command's
/// progress and summary lines go through (the log filter covers only `tracing`).
static QUIET: AtomicBool = AtomicBool::new(false);

/// Whether `-q` asked for errors only.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// A line on stderr, as `eprintln!` but never panicking: a closed or broken stderr (a
/// reader that went away, a terminal hung up) must not end the command, nor the
/// signal thread that stops it cleanly (a storage site whose log reader was gone
/// ignored SIGTERM: its handler panicked on the message before it exited).
macro_rules! tell {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// A progress or summary line on stderr, unless `-q` asked for errors only.
macro_rules! say {
    ($($t:tt)*) => {
        if !$crate::logging::quiet() {
            $crate::logging::tell!($($t)*)
        }
    };
}

/// A line of a command's output on stdout, as `println!` but never panicking: a
/// reader that stopped reading (`| head -1`) is not an error of the command's.
macro_rules! emit {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// A command's summary line on stdout, unless `-q` asked for errors only (the exit
/// status says it succeeded).
macro_rules! report {
    ($($t:tt)*) => {
        if !$crate::logging::quiet() {
            $crate::logging::emit!($($t)*)
        }
    };
}

pub(crate) use {emit, report, say, tell};

/// The filter for `-v` × `verbose` or `-q` over `default`.
pub fn level(verbose: u8, quiet: bool, default: &str) -> &'static str {
    const LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];
    let base = LEVELS.iter().position(|l| *l == default).unwrap_or(1);
    if quiet {
        return "error";
    }
    LEVELS[(base + verbose as usize).min(LEVELS.len() - 1)]
}

/// Installs the subscriber (stderr) and exports the filter to child processes. Call it
/// first in `main`, before any thread starts (it sets an environment variable).
pub fn init(verbose: u8, quiet: bool, default: &str) {
    QUIET.store(quiet, Ordering::Relaxed);
    let from_env = ["RUST_LOG", "GEPSEA_LOG"].iter().find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()));
    let spec = from_env.unwrap_or_else(|| level(verbose, quiet, default).to_string());
    let filter = EnvFilter::try_new(&spec).unwrap_or_else(|e| {
        tell!("gepsea: warning: RUST_LOG={spec:?} is not a log filter ({e}); logging warnings only");
        EnvFilter::new("warn")
    });
    std::env::set_var("RUST_LOG", &spec);
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::level;

    #[test]
    fn flags_move_the_default_level() {
        assert_eq!(level(0, false, "warn"), "warn");
        assert_eq!(level(1, false, "warn"), "info");
        assert_eq!(level(2, false, "warn"), "debug");
        assert_eq!(level(9, false, "warn"), "trace");
        assert_eq!(level(0, false, "info"), "info");
        assert_eq!(level(1, false, "info"), "debug");
        assert_eq!(level(0, true, "info"), "error");
    }
}
