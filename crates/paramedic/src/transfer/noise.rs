//! Transfer keys and the Noise sessions they start: a pre-shared 32-byte key
//! ([`Key`], `gepsea paramedic keygen`) and an object's body sealed as consecutive
//! ChaCha20-Poly1305 messages (see the parent module's documentation).

use std::path::{Path, PathBuf};

/// Noise pattern of an encrypted transfer: `NN` (fresh ephemeral keys on both sides,
/// so every object has its own session keys and forward secrecy) with a pre-shared key
/// mixed in before the first message (`psk0`), which authenticates both sites: only a
/// holder of the key can start a session or answer one. One round trip, like TLS 1.3.
pub(super) const NOISE_PARAMS: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
/// The largest Noise message; a body is sent as consecutive messages of this size.
pub(super) const NOISE_MAX: usize = 65535;
pub(super) const NOISE_TAG: usize = 16;
pub(super) const NOISE_CHUNK: usize = NOISE_MAX - NOISE_TAG;

/// A 32-byte key both sites hold; it encrypts and authenticates transfers.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

/// A key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: a key file holds 64 hexadecimal digits (32 bytes) on one line, as `gepsea paramedic keygen` writes it")]
    Format { path: PathBuf },
}

impl Key {
    /// A fresh random key (from the kernel's generator).
    pub fn generate() -> std::io::Result<Key> {
        random_bytes().map(Key)
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_hex(s: &str) -> Option<Key> {
        let s = s.trim();
        if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut k = [0u8; 32];
        for (i, b) in k.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Key(k))
    }

    /// Reads a key file (`gepsea paramedic keygen`).
    pub fn read(path: &Path) -> Result<Key, KeyError> {
        let s = std::fs::read_to_string(path).map_err(|source| KeyError::Io { path: path.into(), source })?;
        Key::from_hex(&s).ok_or_else(|| KeyError::Format { path: path.into() })
    }

    /// Writes the key readable by its owner only, failing if `path` exists.
    pub fn write_new(&self, path: &Path) -> Result<(), KeyError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let io = |source| KeyError::Io { path: path.into(), source };
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(io)?;
        writeln!(f, "{}", self.to_hex()).map_err(io)
    }

    pub(super) fn handshake(&self, initiator: bool) -> snow::HandshakeState {
        let b = snow::Builder::new(NOISE_PARAMS.parse().expect("valid Noise parameters")).psk(0, &self.0).expect("32-byte psk");
        if initiator { b.build_initiator() } else { b.build_responder() }.expect("supported Noise parameters")
    }
}

/// Bytes of an encrypted body of `plain` bytes.
pub(super) fn sealed_len(plain: u64) -> u64 {
    plain + plain.div_ceil(NOISE_CHUNK as u64) * NOISE_TAG as u64
}

pub(super) fn seal_body(t: &mut snow::TransportState, plain: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; sealed_len(plain.len() as u64) as usize];
    let mut at = 0;
    for chunk in plain.chunks(NOISE_CHUNK) {
        at += t.write_message(chunk, &mut out[at..at + chunk.len() + NOISE_TAG]).expect("a chunk fits one Noise message");
    }
    out
}

pub(super) fn open_body(t: &mut snow::TransportState, sealed: &[u8]) -> Result<Vec<u8>, snow::Error> {
    let mut out = vec![0u8; sealed.len()];
    let mut n = 0;
    for chunk in sealed.chunks(NOISE_MAX) {
        n += t.read_message(chunk, &mut out[n..])?;
    }
    out.truncate(n);
    Ok(out)
}

/// `N` bytes from the kernel's random source.
pub(super) fn random_bytes<const N: usize>() -> std::io::Result<[u8; N]> {
    use std::io::Read;
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b)
}
