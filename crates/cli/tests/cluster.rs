//! `gepsea search` launched by `mpirun` on three "nodes" (network namespaces on a
//! bridge; needs root, `GEPSEA_SKIP_NETNS=1` skips): every process finds its rank in
//! OpenMPI's environment, the first process of each node starts its agent, the agents
//! meet in a shared rendezvous directory. The output must be identical to serial BLAST+,
//! also when a node's agent is killed in the middle of the run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gepsea_net::testbed::NetnsBridge;

const DB_GZ: &str = "/usr/share/doc/mmseqs2/example-data/DB.fasta.gz";
const QUERY_GZ: &str = "/usr/share/doc/mmseqs2/example-data/QUERY.fasta.gz";

fn skip() -> bool {
    if std::env::var_os("GEPSEA_SKIP_NETNS").is_some() {
        eprintln!("GEPSEA_SKIP_NETNS set: skipping");
        return true;
    }
    // SAFETY: no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "cluster tests need root (GEPSEA_SKIP_NETNS=1 skips them)");
    false
}

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run_ok(c: &mut Command) -> std::process::Output {
    let o = c.output().unwrap();
    assert!(o.status.success(), "{c:?}: {}", String::from_utf8_lossy(&o.stderr));
    o
}

/// A 3-node testbed with mpirun wired to it, a database (3 fragments) and the serial
/// reference database built from the same FASTA.
struct Cluster {
    bed: NetnsBridge,
    dir: Dir,
    subnet: String,
}

impl Cluster {
    fn new(tag: &str) -> Cluster {
        let bed = NetnsBridge::new(tag, 3).unwrap();
        let dir = Dir(std::env::temp_dir().join(format!("gepsea-cluster-{tag}-{}", std::process::id())));
        let d = &dir.0;
        std::fs::create_dir_all(d.join("ref")).unwrap();
        let subnet = bed.subnet();
        let fasta = run_ok(Command::new("zcat").arg(DB_GZ)).stdout;
        std::fs::write(d.join("db.fasta"), fasta).unwrap();
        let q = String::from_utf8(run_ok(Command::new("zcat").arg(QUERY_GZ)).stdout).unwrap();
        let mut n = 0;
        let queries: String = q.lines().filter(|l| { if l.starts_with('>') { n += 1; } n <= 40 }).map(|l| format!("{l}\n")).collect();
        std::fs::write(d.join("q.fasta"), queries).unwrap();
        run_ok(Command::new("makeblastdb").args(["-in", "../db.fasta", "-dbtype", "prot", "-parse_seqids", "-title", "T", "-out", "DB"]).current_dir(d.join("ref")));
        run_ok(Command::new(env!("CARGO_BIN_EXE_gepsea")).args(["db", "format", "--fragments", "3", "--title", "T", "--name", "DB", "--input"]).arg(d.join("db.fasta")).arg("--out").arg(d.join("g")));
        Cluster { bed, dir, subnet }
    }

    fn serial(&self, fmt: &str) -> PathBuf {
        let out = self.dir.0.join(format!("serial.{fmt}"));
        run_ok(Command::new("blastp").env("BLASTDB", self.dir.0.join("ref")).args(["-db", "DB", "-outfmt", fmt, "-query"]).arg(self.dir.0.join("q.fasta")).arg("-out").arg(&out));
        out
    }

    /// `mpirun -np 6` (2 processes per node) of `gepsea search`, from node 0.
    fn mpirun(&self, fmt: &str, out: &Path, extra: &[&str]) -> Command {
        let mut c = self.bed.mpirun(&self.dir.0, &[2, 2, 2], 6).unwrap();
        c.arg(env!("CARGO_BIN_EXE_gepsea")).args(["search", "--outfmt", fmt, "--db"]).arg(self.dir.0.join("g")).arg("--query").arg(self.dir.0.join("q.fasta"));
        c.arg("--out").arg(out).arg("--rendezvous").arg(self.dir.0.join(format!("rv-{}", out.file_name().unwrap().to_string_lossy()))).args(["--agent-net", &self.subnet]).args(extra);
        c
    }
}

/// Byte equality, except pairwise output's "Posted date" line.
fn assert_same(got: &Path, want: &Path, what: &str) {
    let (g, w) = (std::fs::read_to_string(got).unwrap(), std::fs::read_to_string(want).unwrap());
    let strip = |s: &str| s.lines().filter(|l| !l.trim_start().starts_with("Posted date:")).collect::<Vec<_>>().join("\n");
    assert!(g.len() > 1000, "{what}: output too small");
    assert!(strip(&g) == strip(&w), "{what}: output differs from serial BLAST+ ({} vs {} bytes)", g.len(), w.len());
}

#[test]
fn mpirun_on_three_nodes_is_identical_to_serial_blastp() {
    if skip() {
        return;
    }
    let c = Cluster::new("gc");
    // The mpiBLAST baseline (no agents: workers talk to rank 0 over gepsea-net TCP).
    let want = c.serial("7");
    let got = c.dir.0.join("mpi-no-agent.7");
    let o = c.mpirun("7", &got, &["--batch-residues", "3000", "--no-agent"]).output().unwrap();
    assert!(o.status.success(), "mpirun --no-agent failed: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_same(&got, &want, "outfmt 7 under mpirun on 3 nodes without agents");
    for fmt in ["6", "0"] {
        let want = c.serial(fmt);
        let got = c.dir.0.join(format!("mpi.{fmt}"));
        let o = c.mpirun(fmt, &got, &["--batch-residues", "3000"]).output().unwrap();
        assert!(o.status.success(), "mpirun failed: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert_same(&got, &want, &format!("outfmt {fmt} under mpirun on 3 nodes"));
        // Hot-swap: each of the 3 fragments was read from shared storage by exactly one
        // agent of the cluster (the others took it from that agent's memory), and no
        // node copied a fragment in twice.
        let log = String::from_utf8_lossy(&o.stderr).to_string();
        let line = log.lines().find(|l| l.contains("fragments staged")).unwrap_or_else(|| panic!("no staging summary: {log}"));
        let num = |after: &str| -> u32 { line.split(after).next().unwrap().rsplit(' ').next().unwrap().parse().unwrap() };
        assert_eq!(num(" from storage"), 3, "{line}");
        assert!(num(" from another node") + num(" from memory") + 3 <= 9, "{line}");
    }
    // Nothing left running.
    for i in 0..3 {
        let pids = String::from_utf8(run_ok(Command::new("ip").args(["netns", "pids", &c.bed.ns[i]])).stdout).unwrap();
        assert!(pids.trim().is_empty(), "processes left in node {i}: {pids}");
    }
}

#[test]
fn a_nodes_agent_killed_mid_run_does_not_change_the_output() {
    if skip() {
        return;
    }
    let c = Cluster::new("gk");
    let want = c.serial("6");
    let got = c.dir.0.join("kill.6");
    let child = c.mpirun("6", &got, &["--batch-residues", "1500", "--merge-assign", "static"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // Once the first parts are written, kill the agent of the third node (node id 5:
    // ranks 4 and 5 live there).
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut killed = false;
    while Instant::now() < deadline && !killed {
        std::thread::sleep(Duration::from_millis(100));
        // Finished parts go to the search's work directory next to the output (shared).
        let parts = std::fs::read_dir(c.dir.0.join(".kill.6.gepsea-work/parts")).into_iter().flatten().flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".part")).count();
        if parts >= 2 {
            let pids = String::from_utf8(run_ok(Command::new("ip").args(["netns", "pids", &c.bed.ns[2]])).stdout).unwrap();
            for pid in pids.split_whitespace() {
                let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default().replace('\0', " ");
                if cmd.contains(" agent ") && cmd.contains("--node-id 5 ") {
                    run_ok(Command::new("kill").args(["-9", pid]));
                    killed = true;
                }
            }
        }
    }
    let o = child.wait_with_output().unwrap();
    let log = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(killed, "never found node 3's agent to kill: {log}");
    assert!(o.status.success(), "mpirun failed after the agent was killed: {log}");
    assert!(log.contains("is gone; searching its unfinished batches again"), "the master did not notice: {log}");
    assert_same(&got, &want, "outfmt 6 with node 3's agent killed");
}
