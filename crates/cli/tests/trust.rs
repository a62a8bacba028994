//! Local trust on a shared node: runtime directories are private to their user
//! (`$TMPDIR/gepsea-<uid>/…`, mode 0700), a directory someone else prepared — another
//! owner, open permissions, a symbolic link, at any level — is refused with a message
//! naming it, and a process of another user cannot reach the agent's socket.
//!
//! Each case gets its own `TMPDIR`, so the tests never touch the real runtime root.

mod common;

use std::collections::BTreeSet;
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

/// A search's scratch (its query batches, report files, statistics runs, a stream
/// output's file) goes into the private runtime root, never straight into the shared
/// temporary directory, where its pid-named directories could be created first by
/// another user and were then used as they stood. Watched from outside while each
/// search runs: nothing but `gepsea-<uid>` ever appears in `TMPDIR`, and the root is
/// empty again afterwards. A root open to others stops the search before it writes
/// anything.
#[test]
fn scratch_stays_in_the_private_root_and_a_prepared_one_is_refused() {
    let d = scratch("search");
    std::fs::write(d.0.join("db.fasta"), common::head(&common::zcat(common::DB_GZ), 400)).unwrap();
    std::fs::write(d.0.join("q.fasta"), common::head(&common::zcat(common::QUERY_GZ), 6)).unwrap();
    let tmp = d.0.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let gepsea = || {
        let mut c = common::gepsea();
        c.current_dir(&d.0).env("TMPDIR", &tmp).env_remove("RUST_LOG");
        c
    };
    let mut fmt = gepsea();
    fmt.args(["db", "format", "--fragments", "2", "--input", "db.fasta", "--out", "db"]);
    common::run_ok(fmt);
    let root = tmp.join(format!("gepsea-{}", uid()));
    let modes: [&[&str]; 2] = [&["--split", "fragments", "--out", "hits.tsv"], &["--no-agent", "--out", "-"]];
    for mode in modes {
        let mut c = gepsea();
        c.args(["search", "--quiet", "--workers", "2", "--db", "db", "--query", "q.fasta", "--outfmt", "6"])
            .args(mode)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let mut seen = BTreeSet::new();
        let mut scratch_seen = false;
        while child.try_wait().unwrap().is_none() {
            seen.extend(common::entries(&tmp));
            scratch_seen |=
                std::fs::read_dir(&root).is_ok_and(|r| r.flatten().any(|e| e.file_name().to_string_lossy().starts_with("gepsea-")));
            std::thread::sleep(Duration::from_millis(5));
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{mode:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(seen, BTreeSet::from([format!("gepsea-{}", uid())]), "{mode:?}: what appeared in the shared TMPDIR");
        assert!(scratch_seen, "{mode:?}: no scratch was ever seen in {}", root.display());
        assert_eq!(common::entries(&root), Vec::<String>::new(), "{mode:?}: left in the runtime root");
    }
    assert!(std::fs::metadata(d.0.join("hits.tsv")).unwrap().len() > 0);
    // A root someone opened up: refused in one line, nothing written.
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut c = gepsea();
    c.args(["search", "--quiet", "--workers", "2", "--db", "db", "--query", "q.fasta", "--outfmt", "6", "--out", "again.tsv"]);
    let out = c.output().unwrap();
    let e = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert!(!out.status.success());
    assert!(e.contains(&root.display().to_string()) && e.contains("has mode 0777"), "{e}");
    assert_eq!(e.lines().count(), 1, "one clear line: {e}");
    assert_eq!(common::entries(&root), Vec::<String>::new());
    assert!(!d.0.join("again.tsv").exists());
}

/// Agents that share the job's key form the view; an agent with another key, in the
/// same rendezvous directory, is refused at every handshake and never joins.
#[test]
fn an_agent_with_another_key_cannot_join() {
    let d = scratch("key");
    let key = |name: &str, byte: u8| -> PathBuf {
        let p = d.0.join(name);
        std::fs::write(&p, [byte; 32]).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p
    };
    let (k1, k2) = (key("k1", 1), key("k2", 2));
    let ns = format!("trustkey{}", std::process::id());
    let start = |node: u32, k: &Path| -> Running {
        let log = std::fs::File::create(d.0.join(format!("agent{node}.log"))).unwrap();
        let mut c = Command::new(env!("CARGO_BIN_EXE_gepsea"));
        c.env_remove("RUST_LOG").args([
            "agent",
            "--namespace",
            &ns,
            "--node-id",
            &node.to_string(),
            "--listen",
            "127.0.0.1:0",
            "--nodes",
            "2",
        ]);
        c.args(["--peer-timeout-ms", "1500", "--rendezvous"]).arg(d.0.join("rv")).arg("--key-file").arg(k);
        Running(c.stdout(Stdio::null()).stderr(log).spawn().unwrap())
    };
    let _agents = [start(1, &k1), start(2, &k1), start(3, &k2)];
    let status =
        |node: u32| -> Option<serde_json::Value> { gepsea_client::status(&ns, node).ok().and_then(|j| serde_json::from_str(&j).ok()) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while ![1, 2].iter().all(|&n| status(n).is_some_and(|v| v["ready"] == true)) {
        assert!(Instant::now() < deadline, "agents 1 and 2 did not become ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Give agent 3 time to find the others in the rendezvous directory and try.
    let logs =
        || (1..=3).map(|n| std::fs::read_to_string(d.0.join(format!("agent{n}.log"))).unwrap_or_default()).collect::<Vec<_>>().join("\n");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !logs().contains("authentication failed") {
        assert!(Instant::now() < deadline, "no refused handshake logged: {}", logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    for n in [1, 2] {
        let v = status(n).unwrap();
        assert_eq!(v["view"], serde_json::json!([1, 2]), "agent {n}'s view: {v}");
        assert_eq!(v["authenticated"], true);
    }
    let v3 = status(3).unwrap();
    assert_eq!((v3["view"].clone(), v3["ready"].clone()), (serde_json::json!([3]), serde_json::json!(false)), "{v3}");
    // A key file others can read is refused in one line.
    std::fs::set_permissions(&k2, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_gepsea"))
        .args(["agent", "--namespace", &ns, "--node-id", "4", "--key-file"])
        .arg(&k2)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr).trim().to_string();
    assert!(!o.status.success() && e.lines().count() == 1 && e.contains("has mode 0644"), "{e}");
    let _ = std::fs::remove_dir_all(gepsea_net::namespace_dir(&ns));
}

/// A namespace becomes a directory under the runtime root, so its name must be one
/// plain path component: `..` would put an agent's sockets in the shared `TMPDIR`, an
/// empty name in the root beside every namespace, and a long one failed only at the
/// socket's bind, with its directories already made. Each is refused in one line, by
/// the agent and by `agent status` alike, before anything is created.
#[test]
fn namespace_names_that_are_not_one_plain_component_are_refused() {
    let d = scratch("names");
    let long = "x".repeat(41);
    for (ns, problem) in [("", "is empty"), ("../t6", "starts with '.'"), ("t6/a", "holds '/'"), (long.as_str(), "is 41 bytes long")] {
        let want = format!("namespace {ns:?} {problem}: a namespace is 1 to 40 letters");
        let e = refused(&d.0, ns);
        assert!(e.contains(&want), "agent --namespace {ns:?}: {e}");
        let o =
            Command::new(env!("CARGO_BIN_EXE_gepsea")).env("TMPDIR", &d.0).args(["agent", "status", "--namespace", ns]).output().unwrap();
        let e = String::from_utf8_lossy(&o.stderr).trim().to_string();
        assert!(!o.status.success() && e.contains(&want) && e.lines().count() == 1, "agent status --namespace {ns:?}: {e}");
    }
    let made: Vec<String> = walkdir(&d.0);
    assert!(made.iter().all(|p| p == &format!("gepsea-{}", uid())), "made for refused namespaces: {made:?}");
}

/// Every path under `dir`, relative to it.
fn walkdir(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            out.push(e.path().strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                todo.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// A search sweeps the runtime namespace a killed search left (`search<pid>`, its pid
/// gone), but only one the search marked as its own: a user's agent may run in a
/// namespace of that name, and its sockets were removed under it.
#[test]
fn a_users_namespace_named_like_a_killed_searchs_is_not_swept() {
    let d = scratch("lookalike");
    std::fs::write(d.0.join("db.fasta"), common::head(&common::zcat(common::DB_GZ), 200)).unwrap();
    std::fs::write(d.0.join("q.fasta"), common::head(&common::zcat(common::QUERY_GZ), 2)).unwrap();
    let tmp = d.0.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let gone_pid = || {
        let mut c = Command::new("true").spawn().unwrap();
        c.wait().unwrap();
        c.id()
    };
    let root = tmp.join(format!("gepsea-{}", uid()));
    // The user's agent, in a namespace named as a search's of a pid that is gone.
    let users = format!("search{}", gone_pid());
    let _agent = Running(agent(&tmp, &users).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap());
    let sock = root.join(&users).join("node-1/agent.sock");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "the agent did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // What a search killed outright leaves: its marked namespace with a node's sockets.
    let killed = root.join(format!("search{}", gone_pid()));
    std::fs::create_dir_all(killed.join("node-1")).unwrap();
    for dir in [&killed, &killed.join("node-1")] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    std::fs::write(killed.join(".gepsea-search"), b"").unwrap();
    std::fs::write(killed.join("node-1/port-1.sock"), b"").unwrap();
    let gepsea = || {
        let mut c = common::gepsea();
        c.current_dir(&d.0).env("TMPDIR", &tmp).env_remove("RUST_LOG");
        c
    };
    let mut fmt = gepsea();
    fmt.args(["db", "format", "--fragments", "1", "--input", "db.fasta", "--out", "db"]);
    common::run_ok(fmt);
    let mut search = gepsea();
    search.args([
        "search",
        "--quiet",
        "--no-agent",
        "--workers",
        "1",
        "--db",
        "db",
        "--query",
        "q.fasta",
        "--outfmt",
        "6",
        "--out",
        "hits.tsv",
    ]);
    common::run_ok(search);
    assert!(!killed.exists(), "the killed search's namespace was not swept");
    assert!(sock.exists(), "the user's agent's socket in namespace {users} was swept");
    let status = gepsea().args(["agent", "status", "--namespace", &users]).output().unwrap();
    assert!(status.status.success(), "the user's agent no longer answers: {}", String::from_utf8_lossy(&status.stderr));
}
