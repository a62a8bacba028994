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
        zstd::stream::decode_all(metadata).map_err(|e| PluginError::BadInput(format!("not a zstd stream: {e}")))
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
