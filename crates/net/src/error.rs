//! The error type of gepsea-net's public API.

use crate::frame::{Addr, FrameError};

/// What is wrong with a socket buffer setting (`tcp::BufferSetting`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BufferSettingError {
    #[error("no buffer at all is not a size")]
    Zero,
    #[error("neither a size in bytes (4194304, 4MiB, 4MB) nor `auto`")]
    NotASize,
    #[error(transparent)]
    Unit(#[from] ByteSizeError),
}

/// A size a user wrote that [`crate::parse_byte_size`] does not take.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    #[error("not a size in bytes (e.g. 4194304, 4MiB, 20GB)")]
    NotASize,
    /// A bare prefix: `4M` is read as 4 MiB by some tools and 4 MB by others.
    #[error("{0}")]
    Ambiguous(Box<AmbiguousSize>),
}

/// A size with a bare prefix ([`ByteSizeError::Ambiguous`]), and both its readings.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{number}{prefix} is ambiguous: {number}{prefix}iB ({binary} bytes) or {number}{prefix}B ({decimal})?")]
pub struct AmbiguousSize {
    pub number: String,
    pub prefix: char,
    pub binary: u64,
    pub decimal: u64,
}

/// A TCP checksum setting that is neither `full` nor `headers` (`tcp::TcpChecksums`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("neither `full` nor `headers`")]
pub struct ChecksumsSettingError;

/// Why a request or a port operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    #[error("message of {len} bytes does not fit the posted receive buffer of {capacity} bytes")]
    Truncated { len: usize, capacity: usize },
    #[error("system-channel message of {len} bytes exceeds the eager threshold of {max} bytes; use the normal channel")]
    TooLargeForSystemChannel { len: usize, max: usize },
    #[error("peer {peer} failed: {reason}")]
    PeerFailed { peer: Addr, reason: String },
    #[error("cannot reach {peer}: {reason}")]
    Unreachable { peer: Addr, reason: String },
    #[error("region {region} of {peer} refused an access of {len} bytes at offset {offset} (region missing or too small)")]
    RegionAccess { peer: Addr, region: u64, offset: u64, len: u64 },
    #[error("region {0} is already exposed")]
    RegionExists(u64),
    #[error("no local region {0}")]
    NoSuchRegion(u64),
    #[error("request was cancelled")]
    Cancelled,
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
    #[error("unknown request {0} (already completed and collected, or never issued)")]
    UnknownRequest(u64),
    #[error("port is shut down")]
    Closed,
    #[error("{context}: {message}")]
    Io { context: String, message: String },
    #[error("key file {path}: {problem}")]
    BadKeyFile { path: String, problem: String },
    #[error("namespace {name:?} {problem}: a namespace is 1 to {max} letters, digits, '-', '_' or '.', not starting with '.'", max = crate::NAMESPACE_MAX)]
    BadNamespace { name: String, problem: String },
    #[error("runtime directory {path} {problem}: refusing to use it (remove it, or set TMPDIR to a directory of your own)")]
    UntrustedDirectory { path: String, problem: String },
    #[error(
        "link encryption needs the job's key (--key-file, or a launch key): encrypting with no key would not tell a peer from anyone else"
    )]
    EncryptWithoutKey,
    #[error(
        "TCP congestion control {name:?} cannot be used here: {problem}; name one of them, or leave it \
         unset (GEPSEA_TCP_CONGESTION) to keep the system's"
    )]
    Congestion { name: String, problem: String },
    #[error("GEPSEA_TCP_BUFFER={value:?}: {problem}; give a number of bytes, or `auto` for the kernel's own sizing")]
    BadTcpBuffer { value: String, problem: BufferSettingError },
    #[error(
        "GEPSEA_TCP_CHECKSUMS={value:?}: neither `full` nor `headers`; give `full` to checksum every payload (the \
         default), or `headers` to trust TCP's own checksum for data where both ends of a link do"
    )]
    BadTcpChecksums { value: String },
    #[error("malformed frame from {from}: {error}")]
    Frame { from: String, error: FrameError },
    #[error("protocol violation by {peer}: {reason}")]
    Protocol { peer: Addr, reason: String },
}

impl NetError {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, e: std::io::Error) -> Self {
        NetError::Io { context: context.into(), message: e.to_string() }
    }
}

/// `error` and its causes on one line, `what: why: deeper why`, for a program's
/// one-line error message. A cause whose text the line already holds is left out:
/// error types that print their source in their own message (as `thiserror` variants
/// with a `#[source]` field written into the message do) would otherwise say it twice.
pub fn one_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[derive(Debug, thiserror::Error)]
    #[error("reading {path}: {source}")]
    struct SaysItsSource {
        path: String,
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("the job failed")]
    struct HidesItsSource {
        #[source]
        source: SaysItsSource,
    }

    fn not_found() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::NotFound, "no such file")
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let e = SaysItsSource { path: "/q.fasta".into(), source: not_found() };
        assert_eq!(one_line(&e), "reading /q.fasta: no such file");
    }

    #[test]
    fn a_cause_not_in_the_message_is_appended_once() {
        let e = HidesItsSource { source: SaysItsSource { path: "/q.fasta".into(), source: not_found() } };
        assert_eq!(one_line(&e), "the job failed: reading /q.fasta: no such file");
    }
}
