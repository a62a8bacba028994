//! Two "nodes" as network namespaces joined by a veth pair, for multi-node tests and
//! benchmarks (needs root). Everything is torn down on drop: processes inside the
//! namespaces are killed first, then the namespaces (and with them the veths) deleted.
//! Names carry the creating process's id and a counter so concurrent runs never collide.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Two namespaces `ns[0]`, `ns[1]` with addresses `ip[0]`, `ip[1]` on one /24.
pub struct NetnsPair {
    pub ns: [String; 2],
    pub ip: [String; 2],
}

fn run(args: &[&str]) -> std::io::Result<()> {
    let out = Command::new(args[0]).args(&args[1..]).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("{args:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim())))
    }
}

impl NetnsPair {
    /// Creates the pair; `prefix` (a few letters) tags the names.
    pub fn new(prefix: &str) -> std::io::Result<NetnsPair> {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let tag = format!("{prefix}{pid}x{n}");
        let subnet = format!("10.{}.{}", 200 + (n % 50), pid % 250);
        let pair = NetnsPair { ns: [format!("{tag}a"), format!("{tag}b")], ip: [format!("{subnet}.1"), format!("{subnet}.2")] };
        run(&["ip", "netns", "add", &pair.ns[0]])?;
        run(&["ip", "netns", "add", &pair.ns[1]])?;
        // Interface names are limited to 15 characters.
        let va = format!("v{}a", &tag[tag.len().saturating_sub(12)..]);
        let vb = format!("v{}b", &tag[tag.len().saturating_sub(12)..]);
        run(&["ip", "link", "add", &va, "netns", &pair.ns[0], "type", "veth", "peer", "name", &vb, "netns", &pair.ns[1]])?;
        for (i, dev) in [&va, &vb].iter().enumerate() {
            run(&["ip", "-n", &pair.ns[i], "addr", "add", &format!("{}/24", pair.ip[i]), "dev", dev])?;
            run(&["ip", "-n", &pair.ns[i], "link", "set", dev, "up"])?;
            run(&["ip", "-n", &pair.ns[i], "link", "set", "lo", "up"])?;
        }
        Ok(pair)
    }

    /// `program` to be run inside node `i`'s namespace.
    pub fn cmd(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns[i]]).arg(program);
        c
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for ns in &self.ns {
            if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}
