//! Local trust: what on this machine may talk to a port or an agent.
//!
//! gepsea runs on shared, multi-user nodes. Its node-local endpoints (the Unix sockets
//! that open shared-memory connections and register clients with the agent) live in
//! per-user runtime directories, `$TMPDIR/gepsea-<uid>/<namespace>/node-<n>`, created
//! mode 0700: another user cannot even reach the sockets, whatever namespace name they
//! guess. A directory that already exists is used only if it is a real directory (not
//! a symbolic link), owned by this user, and closed to group and others; anything else
//! is refused with the path and the problem, because an attacker who pre-creates it
//! could otherwise intercept every connection. As a second line, accepted connections
//! are checked with `SO_PEERCRED`: a peer of another uid is dropped. Shared-memory
//! segments are memfds passed over those sockets, so they have no name another user
//! could open.

use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::error::NetError;

/// This process's user id.
pub fn my_uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

/// The root of this user's runtime directories: `$TMPDIR/gepsea-<uid>`.
pub fn user_runtime_root() -> PathBuf {
    std::env::temp_dir().join(format!("gepsea-{}", my_uid()))
}

pub use crate::NAMESPACE_MAX;

/// Checks a namespace's name before it becomes a directory under the runtime root.
///
/// A namespace is a single path component of a fixed, portable alphabet: a name with a
/// `/` or `..` would put an agent's sockets outside its namespace (`..` into the shared
/// `TMPDIR` itself), an empty one straight into the runtime root beside every other
/// namespace, and a long one fails only at the socket's `bind`, after its directories
/// were made.
pub fn check_namespace(name: &str) -> Result<(), NetError> {
    let bad = |problem: &str| Err(NetError::BadNamespace { name: name.to_string(), problem: problem.to_string() });
    if name.is_empty() {
        return bad("is empty");
    }
    if name.len() > NAMESPACE_MAX {
        return bad(&format!("is {} bytes long", name.len()));
    }
    if name.starts_with('.') {
        return bad("starts with '.'");
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))) {
        return bad(&format!("holds {c:?}"));
    }
    Ok(())
}

/// Why a file or directory is not private to this user, if it is not: another owner,
/// or any permission for group or others. Shared by runtime directories and key files.
pub fn not_private_because(m: &std::fs::Metadata) -> Option<String> {
    let uid = my_uid();
    if m.uid() != uid {
        Some(format!("is owned by uid {}, not by this user (uid {uid})", m.uid()))
    } else if m.mode() & 0o077 != 0 {
        Some(format!("has mode {:04o}: group or others have access (only its owner may)", m.mode() & 0o7777))
    } else {
        None
    }
}

/// Why an existing directory cannot be trusted, if it cannot.
pub fn untrusted_because(path: &Path) -> std::io::Result<Option<String>> {
    let m = std::fs::symlink_metadata(path)?;
    Ok(if m.file_type().is_symlink() {
        Some("is a symbolic link".to_string())
    } else if !m.is_dir() {
        Some("is not a directory".to_string())
    } else {
        not_private_because(&m)
    })
}

fn refuse(path: &Path, problem: String) -> NetError {
    NetError::UntrustedDirectory { path: path.display().to_string(), problem }
}

/// Creates `path` (mode 0700) or checks the existing one (see the module docs).
fn private_dir(path: &Path) -> Result<(), NetError> {
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(NetError::io(format!("creating {}", path.display()), e)),
    }
    match untrusted_because(path) {
        Ok(None) => Ok(()),
        Ok(Some(problem)) => Err(refuse(path, problem)),
        Err(e) => Err(NetError::io(format!("checking {}", path.display()), e)),
    }
}

/// Makes `dir` a private runtime directory: every component from this user's runtime
/// root down is created mode 0700 or checked. A directory outside the root (a
/// configured `runtime_dir`) has its missing ancestors created and itself checked.
pub fn ensure_private_dir(dir: &Path) -> Result<(), NetError> {
    let root = user_runtime_root();
    match dir.strip_prefix(&root) {
        Ok(rest) => {
            private_dir(&root)?;
            let mut p = root.clone();
            for c in rest.components() {
                p.push(c);
                private_dir(&p)?;
            }
            Ok(())
        }
        Err(_) => {
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent).map_err(|e| NetError::io(format!("creating {}", parent.display()), e))?;
            }
            private_dir(dir)
        }
    }
}

/// A scratch directory `name` in this user's runtime root (`$TMPDIR/gepsea-<uid>/name`),
/// created mode 0700 or checked like a runtime directory. Scratch goes there, not
/// straight into the shared temporary directory: a name there that holds a process id
/// can be guessed, and a directory another user made under it in advance (open to
/// them, or a link into their own) was used as it stood, so they could read the
/// user's query batches and results, or swap them mid-search.
pub fn private_scratch(name: &str) -> Result<PathBuf, NetError> {
    let dir = user_runtime_root().join(name);
    ensure_private_dir(&dir)?;
    Ok(dir)
}

/// The user id of the process at the other end of a Unix socket.
pub fn peer_uid(sock: &impl AsFd) -> std::io::Result<u32> {
    let cred = nix::sys::socket::getsockopt(sock, nix::sys::socket::sockopt::PeerCredentials)?;
    Ok(cred.uid())
}

/// Whether a local peer may connect: only processes of this user.
pub fn peer_allowed(sock: &impl AsFd) -> Result<(), String> {
    match peer_uid(sock) {
        Ok(uid) if uid == my_uid() => Ok(()),
        Ok(uid) => Err(format!("a process of uid {uid} tried to connect (only uid {} may)", my_uid())),
        Err(e) => Err(format!("cannot read the peer's credentials: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_private_directory_is_created_0700_and_bad_ones_are_refused() {
        let base = Dir(std::env::temp_dir().join(format!("gepsea-trust-{}", std::process::id())));
        std::fs::create_dir_all(&base.0).unwrap();
        let good = base.0.join("a/b");
        ensure_private_dir(&good).unwrap();
        assert_eq!(std::fs::metadata(&good).unwrap().mode() & 0o777, 0o700);
        ensure_private_dir(&good).unwrap(); // again: accepted as it is
        let open = base.0.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = ensure_private_dir(&open).unwrap_err().to_string();
        assert!(e.contains("has mode 0755") && e.contains(&open.display().to_string()), "{e}");
        let link = base.0.join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert!(ensure_private_dir(&link).unwrap_err().to_string().contains("is a symbolic link"));
        let file = base.0.join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(ensure_private_dir(&file).unwrap_err().to_string().contains("is not a directory"));
        if my_uid() == 0 {
            let theirs = base.0.join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            assert!(ensure_private_dir(&theirs).unwrap_err().to_string().contains("is owned by uid 65534"));
        }
    }

    #[test]
    fn namespaces_are_one_portable_path_component() {
        for good in ["gepsea", "job0123abcd", "search4711", "a", "My_run-2.b", &"x".repeat(NAMESPACE_MAX)] {
            assert_eq!(check_namespace(good), Ok(()), "{good}");
        }
        let problem = |name: &str| match check_namespace(name) {
            Err(NetError::BadNamespace { name: n, problem }) if n == name => problem,
            other => panic!("{name:?}: {other:?}"),
        };
        assert_eq!(problem(""), "is empty");
        assert_eq!(problem(".."), "starts with '.'");
        assert_eq!(problem(".hidden"), "starts with '.'");
        assert_eq!(problem("../x"), "starts with '.'");
        assert_eq!(problem("a/b"), "holds '/'");
        assert_eq!(problem("a b"), "holds ' '");
        assert_eq!(problem("día"), "holds 'í'");
        assert_eq!(problem(&"x".repeat(NAMESPACE_MAX + 1)), format!("is {} bytes long", NAMESPACE_MAX + 1));
        let e = check_namespace("a/b").unwrap_err().to_string();
        assert!(e.starts_with("namespace \"a/b\" holds '/': a namespace is 1 to 40 letters"), "{e}");
    }

    #[test]
    fn the_longest_namespace_leaves_room_for_every_socket_path() {
        // The longest port socket path under TMPDIR=/tmp: every number at its widest.
        let path = format!("/tmp/gepsea-{}/{}/node-{}/port-{}.sock", u32::MAX, "x".repeat(NAMESPACE_MAX), u32::MAX, u32::MAX);
        // sun_path holds 108 bytes, the terminating NUL included.
        assert!(path.len() < 108, "{} bytes: {path}", path.len());
    }

    #[test]
    fn peers_of_this_user_are_allowed_others_are_not() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(peer_uid(&a).unwrap(), my_uid());
        assert!(peer_allowed(&a).is_ok());
        if my_uid() != 0 {
            return; // needs root to run a process as another user
        }
        // A process of uid 65534 connects to a socket in a directory it may enter.
        let base = Dir(std::env::temp_dir().join(format!("gepsea-trust-peer-{}", std::process::id())));
        std::fs::create_dir_all(&base.0).unwrap();
        std::fs::set_permissions(&base.0, std::fs::Permissions::from_mode(0o777)).unwrap();
        let path = base.0.join("s.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        let script = format!("import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?}); s.recv(1)", path.display().to_string());
        let mut child = std::os::unix::process::CommandExt::uid(&mut std::process::Command::new("python3"), 65534)
            .args(["-c", &script])
            .spawn()
            .unwrap();
        let (conn, _) = listener.accept().unwrap();
        assert_eq!(peer_uid(&conn).unwrap(), 65534);
        let e = peer_allowed(&conn).unwrap_err();
        assert!(e.contains("uid 65534"), "{e}");
        drop(conn);
        child.wait().unwrap();
    }
}
