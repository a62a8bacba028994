//! What a port checksums on its TCP links: everything (the default), or headers and
//! link control only, trusting TCP's own checksum for the payloads of application data.
//!
//! Every TCP frame carries a CRC32C of its header and one of its payload, computed by
//! the sender and checked by the receiver: a pass over every byte on each side, on top
//! of the kernel's copies. That catches what TCP's 16-bit checksum lets through and
//! what goes wrong between the kernel and the process, at a price: on a 2-core guest
//! whose two cores a large stream keeps busy, a 1 MiB stream on loopback ran at
//! 0.80–0.82× OpenMPI's TCP transport (which trusts TCP's checksum) with the payload
//! checksums and 0.94–0.95× without, a 1 MiB one way at 1.10–1.11× and 1.01–1.04×
//! (three `make bench-net` runs, `docs/benchmarks.md`, forty-ninth session). Sites
//! whose links and hosts they trust (a cluster fabric with link-level CRCs and ECC
//! memory) may give that pass up for data, as NVMe/TCP and iSCSI make their data
//! digests optional.
//!
//! The setting is negotiated per connection: each end says in its `Hello` or `HelloAck`
//! whether it trusts TCP ([`crate::frame::FLAG_TRUST_TCP`]), and data payloads go
//! without a checksum only when both do. One port that keeps its checksums keeps them
//! for every link it has, both ways: it refuses data that comes without one
//! ([`crate::frame::FrameError::PayloadUnchecked`]). Headers, sequence numbers,
//! acknowledgements and replay are the same either way; encrypted links check every
//! byte with their seals and carry no CRC in either setting.

pub use crate::error::ChecksumsSettingError;

/// What a port checksums on its TCP links ([`PortConfig::tcp_checksums`](crate::PortConfig::tcp_checksums)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TcpChecksums {
    /// Every frame's header and payload (CRC32C).
    #[default]
    Full,
    /// Headers and link control; the payloads of application data rely on TCP's own
    /// checksum on links whose other end says the same.
    Headers,
}

impl TcpChecksums {
    /// The name a user writes (`full`, `headers`).
    pub fn name(self) -> &'static str {
        match self {
            TcpChecksums::Full => "full",
            TcpChecksums::Headers => "headers",
        }
    }
}

impl std::fmt::Display for TcpChecksums {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for TcpChecksums {
    type Err = ChecksumsSettingError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "full" => Ok(TcpChecksums::Full),
            "headers" => Ok(TcpChecksums::Headers),
            _ => Err(ChecksumsSettingError),
        }
    }
}

/// `GEPSEA_TCP_CHECKSUMS`, when set (and not empty): the setting, or what is wrong with it.
pub fn checksums_from_env() -> Option<Result<TcpChecksums, crate::NetError>> {
    let value = std::env::var("GEPSEA_TCP_CHECKSUMS").ok().filter(|v| !v.trim().is_empty())?;
    Some(value.parse().map_err(|_| crate::NetError::BadTcpChecksums { value }))
}

/// What a port checksums unless told otherwise: `GEPSEA_TCP_CHECKSUMS` when it is set
/// and valid (a bad value is refused when a port opens), else everything.
pub fn default_checksums() -> TcpChecksums {
    match checksums_from_env() {
        Some(Ok(setting)) => setting,
        _ => TcpChecksums::Full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_settings_read_as_written_and_anything_else_is_refused() {
        for setting in [TcpChecksums::Full, TcpChecksums::Headers] {
            assert_eq!(setting.name().parse::<TcpChecksums>(), Ok(setting));
            assert_eq!(format!(" {setting}\n").parse::<TcpChecksums>(), Ok(setting));
        }
        for bad in ["", "none", "Full", "payload", "headers,full"] {
            assert_eq!(bad.parse::<TcpChecksums>(), Err(ChecksumsSettingError), "{bad:?}");
        }
        assert_eq!(TcpChecksums::default(), TcpChecksums::Full);
    }
}
