//! Authenticated TCP links: a per-job secret that both ends of a connection must prove
//! they hold before any frame is delivered.
//!
//! Mutual challenge-response over the existing handshake, HMAC-SHA256 (RFC 2104) with a
//! 32-byte key, fresh 32-byte nonces from each side, bound to both addresses:
//!
//! ```text
//! initiator                                   acceptor
//!   Hello    [nonce_i]                 ──▶
//!                                      ◀──    HelloAck [nonce_a, mac("acceptor", …)]
//!   (checks the acceptor's proof)
//!   Auth     [mac("initiator", …)]     ──▶    (checks it; only now established)
//! ```
//!
//! `mac(role, …) = HMAC(key, "gepsea-net auth v1" ‖ role ‖ nonce_i ‖ nonce_a ‖
//! initiator address ‖ acceptor address)`. Fresh nonces on both sides defeat replay of
//! an old handshake; binding the addresses stops a proof from being reused for another
//! pair of ports; the acceptor proves first but learns nothing it could use, and
//! neither side treats the peer as connected (incarnation, replay of unacknowledged
//! frames, delivery) until the other has proved itself. A connection that fails is
//! dropped and logged; nothing it sent is delivered. Links are authenticated, not
//! encrypted: frames travel in the clear (with their CRC32C).

use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::error::NetError;
use crate::frame::Addr;

/// Bytes of a nonce and of a proof.
pub const NONCE_LEN: usize = 32;
pub const MAC_LEN: usize = 32;

/// The secret a job's ports share. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

/// Which side a proof speaks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Initiator,
    Acceptor,
}

impl Key {
    /// A key derived from any secret bytes (SHA-256 of them).
    pub fn from_secret(secret: &[u8]) -> Key {
        Key(Sha256::digest(secret).into())
    }

    /// A fresh random key.
    pub fn generate() -> std::io::Result<Key> {
        let mut k = [0u8; 32];
        crate::port::getrandom(&mut k)?;
        Ok(Key(k))
    }

    /// The raw key bytes (to hand over in a private file).
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A 32-byte key for another use (`label` names it), so the job's key itself is
    /// never used twice: HMAC-SHA256(key, label).
    pub fn derive(&self, label: &[u8]) -> [u8; 32] {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(label);
        m.finalize().into_bytes().into()
    }

    /// Reads a key file: any secret, at least 16 bytes, in a file only its owner (this
    /// user) can read.
    pub fn from_file(path: &Path) -> Result<Key, NetError> {
        let bad = |problem: String| NetError::BadKeyFile { path: path.display().to_string(), problem };
        let m = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
        if let Some(problem) = crate::trust::not_private_because(&m) {
            return Err(bad(format!("{problem}: chmod 600 it")));
        }
        let secret = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        if secret.len() < 16 {
            return Err(bad(format!("holds {} bytes; a key needs at least 16 (e.g. head -c 32 /dev/urandom)", secret.len())));
        }
        Ok(Key::from_secret(&secret))
    }

    fn mac(&self, role: Role, nonce_i: &[u8], nonce_a: &[u8], initiator: Addr, acceptor: Addr) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(b"gepsea-net auth v1");
        m.update(match role {
            Role::Initiator => b"I",
            Role::Acceptor => b"A",
        });
        m.update(nonce_i);
        m.update(nonce_a);
        for a in [initiator, acceptor] {
            m.update(&a.node.to_le_bytes());
            m.update(&a.port.to_le_bytes());
        }
        m
    }

    /// `role`'s proof for this handshake.
    pub fn proof(&self, role: Role, nonce_i: &[u8], nonce_a: &[u8], initiator: Addr, acceptor: Addr) -> [u8; MAC_LEN] {
        self.mac(role, nonce_i, nonce_a, initiator, acceptor).finalize().into_bytes().into()
    }

    /// Checks `role`'s proof in constant time.
    pub fn verify(&self, role: Role, nonce_i: &[u8], nonce_a: &[u8], initiator: Addr, acceptor: Addr, proof: &[u8]) -> bool {
        self.mac(role, nonce_i, nonce_a, initiator, acceptor).verify_slice(proof).is_ok()
    }
}

/// A fresh nonce.
pub fn nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    crate::port::getrandom(&mut n)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_the_key_the_role_the_nonces_and_the_addresses() {
        let k = Key::from_secret(b"job secret");
        let (ni, na) = ([1u8; 32], [2u8; 32]);
        let (i, a) = (Addr::new(1, 0), Addr::new(2, 0));
        let p = k.proof(Role::Acceptor, &ni, &na, i, a);
        assert!(k.verify(Role::Acceptor, &ni, &na, i, a, &p));
        assert!(!Key::from_secret(b"other").verify(Role::Acceptor, &ni, &na, i, a, &p), "another key");
        assert!(!k.verify(Role::Initiator, &ni, &na, i, a, &p), "reflected to the other role");
        assert!(!k.verify(Role::Acceptor, &na, &ni, i, a, &p), "other nonces");
        assert!(!k.verify(Role::Acceptor, &ni, &na, a, i, &p), "other addresses");
        assert!(!k.verify(Role::Acceptor, &ni, &na, i, a, &p[..31]), "truncated");
        assert_eq!(format!("{k:?}"), "Key(<redacted>)");
    }

    #[test]
    fn key_files_must_be_private_and_long_enough() {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("gepsea-key-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("key");
        std::fs::write(&f, [7u8; 32]).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Key::from_file(&f).unwrap_err().to_string().contains("has mode 0644"));
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(Key::from_file(&f).unwrap(), Key::from_secret(&[7u8; 32]));
        std::fs::write(&f, b"short").unwrap();
        assert!(Key::from_file(&f).unwrap_err().to_string().contains("holds 5 bytes"));
        let _ = std::fs::remove_dir_all(&d);
    }
}
