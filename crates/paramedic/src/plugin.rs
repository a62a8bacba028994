//! The metadata plug-in contract and the generic byte-stream plug-in.

/// A plug-in could not encode or regenerate.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The input is not what the plug-in understands (names what and where).
    #[error("{0}")]
    BadInput(String),
    /// Regeneration did not give back the exact output (a plug-in must never return a
    /// different output silently).
    #[error("regeneration mismatch: {0}")]
    Mismatch(String),
    /// A tool or file the plug-in needs failed.
    #[error("{0}")]
    Failed(String),
}

/// Converts output to metadata at the compute site and metadata back to the identical
/// output at the storage site.
///
/// Contract (checked for every plug-in by the conformance tests): for every output `o`
/// the plug-in accepts, `decode(encode(o)) == o`, byte for byte; `decode` of metadata
/// that `encode` did not produce fails with an error, it never returns other bytes.
pub trait MetadataPlugin: Send + Sync {
    /// Stable name, stored in the container so the storage site picks the same plug-in.
    fn name(&self) -> &'static str;
    fn encode(&self, output: &[u8]) -> Result<Vec<u8>, PluginError>;
    fn decode(&self, metadata: &[u8]) -> Result<Vec<u8>, PluginError>;
}

/// The most a zstd-compressed output may expand to at the storage site (16 GiB): a
/// small object that would decompress past it is refused as it grows, not allocated.
pub const MAX_DECODED_OUTPUT: u64 = 16 << 30;

/// The most a plug-in's zstd-compressed metadata may expand to (1 GiB; real metadata
/// is a few bytes per reported sequence).
pub const MAX_DECODED_METADATA: u64 = 1 << 30;

/// Decompresses a zstd stream, refusing one that expands past `limit` bytes; `what`
/// names it in the error.
pub fn zstd_decode_bounded(data: &[u8], limit: u64, what: &str) -> Result<Vec<u8>, PluginError> {
    use std::io::Read;
    let bad = |e: std::io::Error| PluginError::BadInput(format!("{what} is not a zstd stream: {e}"));
    let mut out = Vec::new();
    zstd::stream::read::Decoder::new(data).map_err(bad)?.take(limit.saturating_add(1)).read_to_end(&mut out).map_err(bad)?;
    if out.len() as u64 > limit {
        return Err(PluginError::BadInput(format!("{what} expands past {limit} bytes, the most this site accepts")));
    }
    Ok(out)
}

/// The level shipping compresses at (`--ship zstd`, and `auto` when it compresses):
/// 5× on BLAST reports at ≈200 MB/s; -19 gains another 20 % for 80× the time.
pub const ZSTD_LEVEL: i32 = 3;

/// Byte-stream compression (zstd): works for any output, with no knowledge of it.
#[derive(Clone, Copy, Debug)]
pub struct ZstdPlugin {
    pub level: i32,
}

impl Default for ZstdPlugin {
    fn default() -> Self {
        ZstdPlugin { level: 19 }
    }
}

impl MetadataPlugin for ZstdPlugin {
    fn name(&self) -> &'static str {
        "zstd"
    }
    fn encode(&self, output: &[u8]) -> Result<Vec<u8>, PluginError> {
        zstd::bulk::compress(output, self.level).map_err(|e| PluginError::Failed(format!("zstd: {e}")))
    }
    fn decode(&self, metadata: &[u8]) -> Result<Vec<u8>, PluginError> {
        zstd_decode_bounded(metadata, MAX_DECODED_OUTPUT, "the compressed output")
    }
}

/// The output itself, unchanged: for shipping output directly (the baseline ParaMEDIC
/// is compared against), through the same transfer, checks and encryption.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawPlugin;

impl MetadataPlugin for RawPlugin {
    fn name(&self) -> &'static str {
        "raw"
    }
    fn encode(&self, output: &[u8]) -> Result<Vec<u8>, PluginError> {
        Ok(output.to_vec())
    }
    fn decode(&self, metadata: &[u8]) -> Result<Vec<u8>, PluginError> {
        Ok(metadata.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_expanding_past_the_limit_is_refused() {
        let z = zstd::bulk::compress(&vec![0u8; 1 << 20], 3).unwrap();
        assert!(z.len() < 1000, "a small object");
        assert_eq!(zstd_decode_bounded(&z, 1 << 20, "x").unwrap().len(), 1 << 20);
        let e = zstd_decode_bounded(&z, (1 << 20) - 1, "the test stream").unwrap_err().to_string();
        assert_eq!(e, format!("the test stream expands past {} bytes, the most this site accepts", (1 << 20) - 1));
        assert!(zstd_decode_bounded(b"not zstd", 100, "x").is_err());
    }
}
