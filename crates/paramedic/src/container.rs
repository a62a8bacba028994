//! The metadata container: what crosses the wide-area link and what is stored.
//!
//! ```text
//! "GPMD" | version (1 byte) | name length (1) | plug-in name | payload length (u64 LE)
//!        | payload | SHA-256 of everything before it (32 bytes)
//! ```
//!
//! [`open`] checks every field before it hands the payload to a plug-in: a wrong magic
//! or version, a length that runs past the end (truncation), trailing bytes, or a
//! checksum that does not match (corruption) are errors that say which.

use sha2::{Digest, Sha256};

use crate::plugin::{MetadataPlugin, PluginError};

pub const MAGIC: &[u8; 4] = b"GPMD";
pub const VERSION: u8 = 1;

/// Why a container was refused, or its plug-in failed.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error("not ParaMEDIC metadata (bad magic bytes)")]
    BadMagic,
    #[error("metadata format version {0} is not supported (this build reads version {VERSION})")]
    Version(u8),
    #[error("metadata truncated: {needed} bytes needed, {have} present")]
    Truncated { needed: u64, have: u64 },
    #[error("metadata has {0} unexpected bytes after its checksum")]
    Trailing(usize),
    #[error("metadata corrupted: SHA-256 {actual}, expected {expected}")]
    Checksum { expected: String, actual: String },
    #[error("metadata was made by plug-in {found:?}, not {expected:?}")]
    WrongPlugin { expected: String, found: String },
    #[error("plug-in {plugin}: {source}")]
    Plugin { plugin: String, source: PluginError },
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Encodes `output` with `plugin` and wraps the metadata.
pub fn seal(plugin: &dyn MetadataPlugin, output: &[u8]) -> Result<Vec<u8>, ContainerError> {
    let payload = plugin.encode(output).map_err(|source| ContainerError::Plugin { plugin: plugin.name().into(), source })?;
    Ok(wrap(plugin.name(), &payload))
}

/// Wraps an already encoded payload.
pub fn wrap(name: &str, payload: &[u8]) -> Vec<u8> {
    assert!(name.len() < 256, "plug-in names are short");
    let mut v = Vec::with_capacity(payload.len() + name.len() + 48);
    v.extend_from_slice(MAGIC);
    v.push(VERSION);
    v.push(name.len() as u8);
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    v.extend_from_slice(payload);
    let sum = Sha256::digest(&v);
    v.extend_from_slice(&sum);
    v
}

/// Checks a container and returns (plug-in name, payload).
pub fn unwrap(data: &[u8]) -> Result<(String, &[u8]), ContainerError> {
    let short = |needed: usize| ContainerError::Truncated { needed: needed as u64, have: data.len() as u64 };
    if data.len() < 6 {
        return Err(if data.len() >= 4 && &data[..4] != MAGIC { ContainerError::BadMagic } else { short(6) });
    }
    if &data[..4] != MAGIC {
        return Err(ContainerError::BadMagic);
    }
    if data[4] != VERSION {
        return Err(ContainerError::Version(data[4]));
    }
    let name_len = data[5] as usize;
    let head = 6 + name_len + 8;
    if data.len() < head {
        return Err(short(head));
    }
    let name = String::from_utf8_lossy(&data[6..6 + name_len]).into_owned();
    let len = u64::from_le_bytes(data[6 + name_len..head].try_into().unwrap());
    let total = (head as u64)
        .checked_add(len)
        .and_then(|t| t.checked_add(32))
        .ok_or(ContainerError::Truncated { needed: u64::MAX, have: data.len() as u64 })?;
    if (data.len() as u64) < total {
        return Err(ContainerError::Truncated { needed: total, have: data.len() as u64 });
    }
    let total = total as usize;
    if data.len() > total {
        return Err(ContainerError::Trailing(data.len() - total));
    }
    let body_end = total - 32;
    let actual = Sha256::digest(&data[..body_end]);
    if actual.as_slice() != &data[body_end..] {
        return Err(ContainerError::Checksum { expected: hex(&data[body_end..]), actual: hex(&actual) });
    }
    Ok((name, &data[head..body_end]))
}

/// Checks a container made by `plugin` and regenerates the output.
pub fn open(plugin: &dyn MetadataPlugin, data: &[u8]) -> Result<Vec<u8>, ContainerError> {
    let (name, payload) = unwrap(data)?;
    if name != plugin.name() {
        return Err(ContainerError::WrongPlugin { expected: plugin.name().into(), found: name });
    }
    plugin.decode(payload).map_err(|source| ContainerError::Plugin { plugin: name, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ZstdPlugin;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn zstd_round_trips_any_bytes(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let p = ZstdPlugin { level: 3 };
            let sealed = seal(&p, &data).unwrap();
            prop_assert_eq!(open(&p, &sealed).unwrap(), data);
        }

        #[test]
        fn any_flipped_byte_is_refused(data in proptest::collection::vec(any::<u8>(), 1..512), at in any::<prop::sample::Index>(), bit in 0u8..8) {
            let p = ZstdPlugin { level: 3 };
            let mut sealed = seal(&p, &data).unwrap();
            let i = at.index(sealed.len());
            sealed[i] ^= 1 << bit;
            prop_assert!(open(&p, &sealed).is_err());
        }

        #[test]
        fn any_truncation_is_refused(data in proptest::collection::vec(any::<u8>(), 0..512), cut in any::<prop::sample::Index>()) {
            let p = ZstdPlugin { level: 3 };
            let sealed = seal(&p, &data).unwrap();
            let n = cut.index(sealed.len());
            let err = open(&p, &sealed[..n]).unwrap_err();
            prop_assert!(matches!(err, ContainerError::Truncated { .. }), "{err}");
        }
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let p = ZstdPlugin::default();
        let sealed = seal(&p, b"hello").unwrap();
        let mut v = sealed.clone();
        v[0] = b'X';
        assert!(matches!(open(&p, &v), Err(ContainerError::BadMagic)));
        let mut v = sealed.clone();
        v[4] = 9;
        assert_eq!(open(&p, &v).unwrap_err().to_string(), "metadata format version 9 is not supported (this build reads version 1)");
        let mut v = sealed.clone();
        v.push(0);
        assert!(matches!(open(&p, &v), Err(ContainerError::Trailing(1))));
        let mut v = sealed.clone();
        let mid = v.len() - 40;
        v[mid] ^= 0xff;
        assert!(matches!(open(&p, &v), Err(ContainerError::Checksum { .. })));
        let other = wrap("blast", b"x");
        assert!(matches!(open(&p, &other), Err(ContainerError::WrongPlugin { .. })));
    }
}
