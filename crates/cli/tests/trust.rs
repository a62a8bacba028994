//! Local trust on a shared node: runtime directories are private to their user
//! (`$TMPDIR/gepsea-<uid>/…`, mode 0700), a directory someone else prepared — another
//! owner, open permissions, a symbolic link, at any level — is refused with a message
//! naming it, and a process of another user cannot reach the agent's socket.
//!
//! Each case gets its own `TMPDIR`, so the tests never touch the real runtime root.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(tag: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("gepsea-trust-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

fn agent(tmpdir: &Path, ns: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gepsea"));
    c.env("TMPDIR", tmpdir).env_remove("RUST_LOG").args(["agent", "--namespace", ns, "--node-id", "1"]);
    c
}

/// Runs an agent that must refuse to start; its stderr.
fn refused(tmpdir: &Path, ns: &str) -> String {
    let mut child = agent(tmpdir, ns).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the agent started in {} instead of refusing", tmpdir.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o: Output = child.wait_with_output().unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr).trim().to_string();
    assert_eq!(e.lines().count(), 1, "one clear line: {e}");
    e
}

#[test]
fn runtime_directories_prepared_by_someone_else_are_refused() {
    let d = scratch("dirs");
    let root = |case: &str| d.0.join(case).join(format!("gepsea-{}", uid()));
    // Open to others.
    std::fs::create_dir_all(root("open")).unwrap();
    std::fs::set_permissions(root("open"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = refused(&d.0.join("open"), "t1");
    assert!(e.contains(&format!("{} has mode 0755", root("open").display())) && e.contains("set TMPDIR"), "{e}");
    // A symbolic link to a directory that would otherwise pass.
    std::fs::create_dir_all(d.0.join("link")).unwrap();
    std::fs::create_dir(d.0.join("elsewhere")).unwrap();
    std::fs::set_permissions(d.0.join("elsewhere"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(d.0.join("elsewhere"), root("link")).unwrap();
    let e = refused(&d.0.join("link"), "t2");
    assert!(e.contains("is a symbolic link"), "{e}");
    assert_eq!(std::fs::read_dir(d.0.join("elsewhere")).unwrap().count(), 0, "nothing was created through the link");
    // One level down: the namespace directory, open to everyone.
    std::fs::create_dir_all(root("nested").join("t3")).unwrap();
    std::fs::set_permissions(root("nested"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(root("nested").join("t3"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = refused(&d.0.join("nested"), "t3");
    assert!(e.contains(&format!("{} has mode 0777", root("nested").join("t3").display())), "{e}");
    if uid() == 0 {
        // Another owner (as root we can make one).
        std::fs::create_dir_all(root("theirs")).unwrap();
        std::fs::set_permissions(root("theirs"), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(root("theirs"), Some(65534), Some(65534)).unwrap();
        let e = refused(&d.0.join("theirs"), "t4");
        assert!(e.contains("is owned by uid 65534"), "{e}");
    }
}

struct Running(Child);
impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn another_user_cannot_reach_the_agent() {
    if uid() != 0 {
        eprintln!("needs root to run a process as another user: skipping");
        return;
    }
    let d = scratch("peer");
    // The scratch directory itself must be enterable by the other user, so that only
    // gepsea's own directories stand in the way.
    std::fs::set_permissions(&d.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let _agent = Running(agent(&d.0, "t5").stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap());
    let sock = d.0.join(format!("gepsea-{}", uid())).join("t5/node-1/agent.sock");
    let status = || -> Output {
        let mut c = Command::new(env!("CARGO_BIN_EXE_gepsea"));
        c.env("TMPDIR", &d.0).args(["agent", "status", "--namespace", "t5", "--node-id", "1"]);
        c.output().unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !status().status.success() {
        assert!(Instant::now() < deadline, "the agent did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mode = std::fs::metadata(d.0.join(format!("gepsea-{}", uid()))).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    // uid 65534 tries the socket directly.
    let script = format!(
        "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect({:?})\n    print('connected')\nexcept OSError as e:\n    print(type(e).__name__)\n",
        sock.display().to_string()
    );
    let o = std::os::unix::process::CommandExt::uid(&mut Command::new("python3"), 65534).args(["-c", &script]).output().unwrap();
    let said = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert_eq!(said, "PermissionError", "another user's process: {said} {}", String::from_utf8_lossy(&o.stderr));
    // The owner still gets in.
    let mine = status();
    assert!(mine.status.success() && String::from_utf8_lossy(&mine.stdout).contains("node"), "{mine:?}");
}
