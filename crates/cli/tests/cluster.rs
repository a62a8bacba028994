//! `gepsea search` launched by `mpirun` on three "nodes" (network namespaces on a
//! bridge; needs root, `GEPSEA_SKIP_NETNS=1` skips): every process finds its rank in
//! OpenMPI's environment, the first process of each node starts its agent, the agents
//! meet in a shared rendezvous directory. The output must be identical to serial BLAST+,
//! also when a node's agent is killed in the middle of the run.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{finished_parts, head, zcat, DB_GZ, DB_PROTEINS, QUERY_GZ};
use gepsea_net::testbed::NetnsBridge;

/// All of the example database, where a test needs the search to last: one that kills
/// an agent mid-run and waits for its restarted successor to rejoin before the search
/// ends. The others search its first [`DB_PROTEINS`].
const WHOLE: usize = usize::MAX;

/// One cluster at a time: each runs up to 12 processes under `mpirun` on a 2-core
/// machine, and OpenMPI's daemons time out connecting to each other when several
/// clusters start at once (seen once: "unable to complete a TCP connection").
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_cluster_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

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
    /// The agents' namespaces of the jobs run (one per output), whose runtime
    /// directories go with the cluster even when a test fails: a search that mpirun
    /// aborted leaves its agents' sockets and staged fragments there.
    jobs: std::cell::RefCell<Vec<String>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for ns in self.jobs.borrow().iter() {
            let _ = std::fs::remove_dir_all(gepsea_net::namespace_dir(ns));
        }
    }
}

impl Cluster {
    fn new(tag: &str) -> Cluster {
        Cluster::with_nodes(tag, 3, DB_PROTEINS)
    }

    /// `nodes` namespace nodes; a database of the first `proteins` example proteins.
    fn with_nodes(tag: &str, nodes: usize, proteins: usize) -> Cluster {
        let bed = NetnsBridge::new(tag, nodes).unwrap();
        let dir = Dir(std::env::temp_dir().join(format!("gepsea-cluster-{tag}-{}", std::process::id())));
        let d = &dir.0;
        std::fs::create_dir_all(d.join("ref")).unwrap();
        let subnet = bed.subnet();
        std::fs::write(d.join("db.fasta"), head(&zcat(DB_GZ), proteins)).unwrap();
        std::fs::write(d.join("q.fasta"), head(&zcat(QUERY_GZ), 40)).unwrap();
        run_ok(
            Command::new("makeblastdb")
                .args(["-in", "../db.fasta", "-dbtype", "prot", "-parse_seqids", "-title", "T", "-out", "DB"])
                .current_dir(d.join("ref")),
        );
        run_ok(
            Command::new(env!("CARGO_BIN_EXE_gepsea"))
                .args(["db", "format", "--fragments", "3", "--title", "T", "--name", "DB", "--input"])
                .arg(d.join("db.fasta"))
                .arg("--out")
                .arg(d.join("g")),
        );
        Cluster { bed, dir, subnet, jobs: Default::default() }
    }

    /// Serial BLAST+ on both cores (its output does not depend on the thread count):
    /// the cluster tests run one at a time, so a one-thread reference left a core idle.
    fn serial(&self, fmt: &str) -> PathBuf {
        let out = self.dir.0.join(format!("serial.{fmt}"));
        run_ok(
            Command::new("blastp")
                .env("BLASTDB", self.dir.0.join("ref"))
                .args(["-db", "DB", "-outfmt", fmt, "-num_threads", "2", "-query"])
                .arg(self.dir.0.join("q.fasta"))
                .arg("-out")
                .arg(&out),
        );
        out
    }

    /// `mpirun -np 6 --map-by MAP` (2 processes per node) of `gepsea search`, from node
    /// 0, with neither --nodes nor --rendezvous: the processes find their nodes
    /// through the default rendezvous next to the output.
    fn mpirun(&self, map_by: &str, fmt: &str, out: &Path, extra: &[&str]) -> Command {
        self.jobs.borrow_mut().push(namespace_of(out));
        let mut c = self.bed.mpirun(&self.dir.0, &[2, 2, 2], 6).unwrap();
        c.args(["--map-by", map_by]);
        c.arg(env!("CARGO_BIN_EXE_gepsea"))
            .args(["search", "--outfmt", fmt, "--db"])
            .arg(self.dir.0.join("g"))
            .arg("--query")
            .arg(self.dir.0.join("q.fasta"));
        c.arg("--out").arg(out).args(["--agent-net", &self.subnet]).args(extra);
        c
    }

    /// Only the outputs, the inputs and the serial reference are left in the job
    /// directory, and no gepsea file in /tmp or /dev/shm belongs to this test's runs.
    fn assert_clean(&self, namespaces: &[String]) {
        let names: Vec<String> =
            std::fs::read_dir(&self.dir.0).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        let left: Vec<&String> = names.iter().filter(|n| n.starts_with('.') || n.contains("gepsea")).collect();
        assert!(left.is_empty(), "left next to the outputs: {left:?}");
        for ns in namespaces {
            assert!(!gepsea_net::namespace_dir(ns).exists(), "runtime directory {} left", gepsea_net::namespace_dir(ns).display());
            for d in ["/tmp", "/dev/shm"] {
                let stale: Vec<String> = std::fs::read_dir(d)
                    .unwrap()
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.contains(ns.as_str()))
                    .collect();
                assert!(stale.is_empty(), "left in {d}: {stale:?}");
            }
        }
    }
}

fn namespace_of(out: &Path) -> String {
    gepsea_blast::cluster::namespace(out)
}

fn output_of(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn processes_left(c: &Cluster) {
    for i in 0..c.bed.ns.len() {
        let pids = String::from_utf8(run_ok(Command::new("ip").args(["netns", "pids", &c.bed.ns[i]])).stdout).unwrap();
        assert!(pids.trim().is_empty(), "processes left in node {i}: {pids}");
    }
}

/// Byte equality, except pairwise output's "Posted date" line.
fn assert_same(got: &Path, want: &Path, what: &str) {
    let (g, w) = (std::fs::read_to_string(got).unwrap(), std::fs::read_to_string(want).unwrap());
    let strip = |s: &str| s.lines().filter(|l| !l.trim_start().starts_with("Posted date:")).collect::<Vec<_>>().join("\n");
    assert!(g.len() > 1000, "{what}: output too small");
    assert!(strip(&g) == strip(&w), "{what}: output differs from serial BLAST+ ({} vs {} bytes)", g.len(), w.len());
}

/// The staging summary: each of the 3 fragments was read from shared storage by
/// exactly one agent of the cluster (the others took it from that agent's memory), and
/// no node copied a fragment in twice.
fn assert_hot_swap(log: &str, what: &str) {
    let line = log.lines().find(|l| l.contains("fragments staged")).unwrap_or_else(|| panic!("{what}: no staging summary: {log}"));
    let num = |after: &str| -> u32 { line.split(after).next().unwrap().rsplit(' ').next().unwrap().parse().unwrap() };
    assert_eq!(num(" from storage"), 3, "{what}: {line}");
    assert!(num(" from another node") + num(" from memory") + 3 <= 9, "{what}: {line}");
}

#[test]
fn mpirun_on_three_nodes_is_identical_to_serial_blastp() {
    if skip() {
        return;
    }
    let _one = one_cluster_at_a_time();
    let c = Cluster::new("gc");
    // The mpiBLAST baseline (no agents: workers talk to rank 0 over gepsea-net TCP).
    let want = c.serial("7");
    let got = c.dir.0.join("mpi-no-agent.7");
    let o = c.mpirun("node", "7", &got, &["--batch-residues", "3000", "--no-agent"]).output().unwrap();
    assert!(o.status.success(), "mpirun --no-agent failed: {}", output_of(&o));
    assert_same(&got, &want, "outfmt 7 under mpirun on 3 nodes without agents");
    // Round-robin and block placement at the same time on the same nodes, meeting in
    // one shared rendezvous directory: node ids come from the hosts, ports from the
    // kernel, so neither the placement nor the other job matters.
    let want = c.serial("6");
    let rv = c.dir.0.join("shared-rv");
    let runs: Vec<(&str, PathBuf, std::process::Child)> = ["node", "slot"]
        .into_iter()
        .map(|map| {
            let out = c.dir.0.join(format!("by-{map}.6"));
            let child = c
                .mpirun(map, "6", &out, &["--batch-residues", "3000", "--rendezvous"])
                .arg(&rv)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (map, out, child)
        })
        .collect();
    let mut namespaces = Vec::new();
    for (map, out, child) in runs {
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "mpirun --map-by {map} failed: {}", output_of(&o));
        assert_same(&out, &want, &format!("outfmt 6 under mpirun --map-by {map} on 3 nodes, beside another search"));
        assert_hot_swap(&output_of(&o), &format!("--map-by {map}"));
        namespaces.push(namespace_of(&out));
    }
    let rv_left: Vec<_> = std::fs::read_dir(&rv).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(rv_left.is_empty(), "left in the shared rendezvous: {rv_left:?}");
    std::fs::remove_dir(&rv).unwrap();
    let want = c.serial("0");
    let got = c.dir.0.join("mpi.0");
    let o = c.mpirun("slot", "0", &got, &["--batch-residues", "3000"]).output().unwrap();
    assert!(o.status.success(), "mpirun failed: {}", output_of(&o));
    assert_same(&got, &want, "outfmt 0 under mpirun on 3 nodes");
    namespaces.push(namespace_of(&got));
    processes_left(&c);
    c.assert_clean(&namespaces);
}

#[test]
fn a_nodes_agent_killed_mid_run_is_restarted_rejoins_and_the_output_is_unchanged() {
    if skip() {
        return;
    }
    let _one = one_cluster_at_a_time();
    let c = Cluster::with_nodes("gk", 3, WHOLE);
    let want = c.serial("6");
    let got = c.dir.0.join("kill.6");
    let child = c
        .mpirun("slot", "6", &got, &["--batch-residues", "1500", "--merge-assign", "static", "--encrypt-links"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once the first parts are written, kill the agent of the third node (rank 0, the
    // master, is on the first). The node's leader starts it again; it must rejoin:
    // every agent's status lists it live with its new pid while the search goes on.
    // The agents' links are encrypted (`--encrypt-links`), the restarted one's too.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut killed: Option<(String, u32, u32)> = None;
    let mut rejoined = None;
    let mut child = child;
    while Instant::now() < deadline && rejoined.is_none() && matches!(child.try_wait(), Ok(None)) {
        std::thread::sleep(Duration::from_millis(100));
        if let Some((ns, node, old_pid)) = &killed {
            rejoined = rejoined_everywhere(ns, *node, *old_pid);
            continue;
        }
        // Finished parts go to the search's work directory next to the output (shared).
        if finished_parts(&got) >= 2 {
            let pids = String::from_utf8(run_ok(Command::new("ip").args(["netns", "pids", &c.bed.ns[2]])).stdout).unwrap();
            for pid in pids.split_whitespace() {
                let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let args: Vec<&str> = cmd.split('\0').collect();
                if args.get(1) == Some(&"agent") {
                    let after = |flag: &str| args.iter().position(|a| *a == flag).map(|i| args[i + 1].to_string()).unwrap();
                    run_ok(Command::new("kill").args(["-9", pid]));
                    killed = Some((after("--namespace"), after("--node-id").parse().unwrap(), pid.parse().unwrap()));
                }
            }
        }
    }
    let o = child.wait_with_output().unwrap();
    let log = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(killed.is_some(), "never found node 3's agent to kill: {log}");
    assert!(o.status.success(), "mpirun failed after the agent was killed: {log}");
    let view = rejoined.unwrap_or_else(|| panic!("node 3's restarted agent was never seen back in every view: {log}"));
    assert_eq!(view.len(), 3, "{view:?}");
    assert!(log.contains("started it again (1 of at most"), "the node's leader did not restart its agent: {log}");
    assert!(log.contains("is gone; searching its unfinished batches again"), "the master did not notice: {log}");
    assert!(log.contains("rejoined with a restarted agent"), "the master did not see it come back: {log}");
    assert_same(&got, &want, "outfmt 6 with node 3's agent killed and restarted");
}

/// The replay used by the many-node benchmark (`gepsea-bench cluster --replay`): a
/// search recorded once for real on this machine (`--record`), then replayed on 4
/// namespace nodes under mpirun, where no worker runs BLAST+ but every merge, format,
/// agent, link and write is real, with agents and without: both outputs identical to
/// serial BLAST+, and the workers' time in (replayed) search is the recorded time.
#[test]
fn a_search_replayed_on_four_nodes_is_identical_to_serial_blastp() {
    if skip() {
        return;
    }
    let _one = one_cluster_at_a_time();
    let c = Cluster::with_nodes("gr", 4, DB_PROTEINS);
    let d = &c.dir.0;
    let want = c.serial("0");
    let recording = d.join("recording");
    let recorded = d.join("recorded.0");
    let layout = ["--split", "fragments", "--batch-residues", "2000"];
    let summary = |p: &Path| -> serde_json::Value { serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap() };
    run_ok(
        Command::new(env!("CARGO_BIN_EXE_gepsea"))
            .args(["search", "--quiet", "--outfmt", "0", "--workers", "2", "--db"])
            .arg(d.join("g"))
            .arg("--query")
            .arg(d.join("q.fasta"))
            .arg("--out")
            .arg(&recorded)
            .arg("--record")
            .arg(&recording)
            .arg("--summary-json")
            .arg(d.join("recorded.json"))
            .args(layout),
    );
    assert_same(&recorded, &want, "the recorded run");
    let runs = std::fs::read_dir(recording.join("runs")).unwrap().count();
    let tasks = summary(&d.join("recorded.json"))["tasks"].as_u64().unwrap() as usize;
    assert!(runs >= 2 * tasks, "{runs} files recorded for {tasks} tasks");
    for (what, extra) in [("agents", &[][..]), ("no agent", &["--no-agent"][..])] {
        let got = d.join(format!("replayed-{}.0", what.replace(' ', "-")));
        let js = d.join("replayed.json");
        c.jobs.borrow_mut().push(namespace_of(&got));
        let mut m = c.bed.mpirun(d, &[2, 1, 1, 1], 5).unwrap();
        m.arg(env!("CARGO_BIN_EXE_gepsea"))
            .args(["search", "--quiet", "--outfmt", "0", "--db"])
            .arg(d.join("g"))
            .arg("--query")
            .arg(d.join("q.fasta"))
            .arg("--out")
            .arg(&got)
            .args(["--agent-net", &c.subnet, "--nodes", "4"])
            .arg("--replay")
            .arg(&recording)
            .arg("--summary-json")
            .arg(&js)
            .args(layout)
            .args(extra);
        let o = m.output().unwrap();
        assert!(o.status.success(), "replay on 4 nodes ({what}) failed: {}", output_of(&o));
        assert_same(&got, &want, &format!("replayed on 4 nodes, {what}"));
        // The workers' time in search is the recorded time, spent asleep.
        let s = summary(&js);
        if extra.is_empty() {
            // 4 nodes, 3 fragments: two agents prefetch fragment 0 at once for the master,
            // and neither may refuse the staging lock as already held by that caller.
            assert!(!output_of(&o).contains("prefetch failed"), "{}", output_of(&o));
            let read_from_storage = s["accel"]["stagings"][3].as_u64();
            assert_eq!(read_from_storage, Some(3), "each fragment read from storage once: {s}");
        }
        // Each batch's write is traced with its CPU time, its BLAST+ programs' (the
        // statistics runs, `blast_formatter`) included, for the many-node model.
        let batches = s["trace"]["batches"].as_array().unwrap_or_else(|| panic!("{what}: no traced batches: {s}"));
        let cpu = |b: &serde_json::Value, k: &str| b[k].as_f64().unwrap_or_else(|| panic!("{what}: a batch without {k}: {b}"));
        let programs: f64 = batches.iter().map(|b| cpu(b, "write_cpu_seconds") - cpu(b, "write_thread_cpu_seconds")).sum();
        assert!(!batches.is_empty() && programs > 0.0, "{what}: the writes' BLAST+ programs' CPU not counted: {batches:?}");
        assert!(batches.iter().all(|b| cpu(b, "write_thread_cpu_seconds") > 0.0), "{what}: {batches:?}");
        let (rec, rep) = (summary(&d.join("recorded.json"))["blast_seconds"].as_f64().unwrap(), s["blast_seconds"].as_f64().unwrap());
        assert!(rep >= 0.95 * rec && rep <= 1.5 * rec + 1.0, "{what}: replayed search time {rep} s against {rec} s recorded");
    }
    processes_left(&c);
}

/// Some(view) once the agent of `node` answers with a pid other than `old_pid` and
/// every agent of its view lists the same view, no dead node, and that new agent (pid
/// and incarnation) among its peers, all over encrypted links.
fn rejoined_everywhere(ns: &str, node: u32, old_pid: u32) -> Option<Vec<u64>> {
    let status = |n: u32| gepsea_client::status(ns, n).ok().and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok());
    let me = status(node)?;
    if me["pid"] == old_pid || me["ready"] != true || me["encrypted"] != true {
        return None;
    }
    let view: Vec<u64> = me["view"].as_array()?.iter().filter_map(|v| v.as_u64()).collect();
    let new_agent = serde_json::json!([node, me["pid"], me["incarnation"]]);
    for &n in view.iter().filter(|&&n| n != node as u64) {
        let st = status(n as u32)?;
        let ok = st["view"] == me["view"] && st["dead"] == serde_json::json!([]) && st["peers"].as_array()?.contains(&new_agent);
        if !ok {
            return None;
        }
    }
    Some(view)
}

/// `examples/slurm.sbatch` and `examples/pbs.sh` run as shipped (paths from the
/// environment, as their comments say): the Slurm one under a stand-in for `srun`
/// (Slurm is not installed here) that gives each task the environment srun gives and
/// places the 6 tasks cyclically over the 3 nodes; the PBS one under the real
/// OpenMPI `mpirun`, with a `$PBS_NODEFILE` listing each node once per slot.
#[test]
fn the_batch_system_examples_run_as_written() {
    if skip() {
        return;
    }
    let _one = one_cluster_at_a_time();
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::new("gx");
    let d = &c.dir.0;
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let want = c.serial("6");
    let bin = d.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let ns = c.bed.ns.join(" ");
    let srun = format!(
        r#"#!/bin/bash
while [ "${{1#--}}" != "$1" ]; do shift; done
ns=({ns})
pids=()
for rank in 0 1 2 3 4 5; do
  node=$((rank % 3)); localid=$((rank / 3))
  ip netns exec "${{ns[$node]}}" env SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_PROCID=$rank SLURM_NTASKS=6 \
    SLURM_LOCALID=$localid SLURM_NODEID=$node SLURM_STEP_NUM_NODES=3 SLURM_STEP_TASKS_PER_NODE='2(x3)' "$@" &
  pids+=($!)
done
rc=0; for p in "${{pids[@]}}"; do wait "$p" || rc=1; done; exit $rc
"#
    );
    std::fs::write(bin.join("srun"), srun).unwrap();
    std::fs::set_permissions(bin.join("srun"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let script_env = |cmd: &mut Command, out: &Path| {
        cmd.env("DB", d.join("g")).env("QUERY", d.join("q.fasta")).env("OUT", out).env("OUTFMT", "6").env("BLAST_OPTIONS", "");
        cmd.env("AGENT_NET", &c.subnet).env("GEPSEA", env!("CARGO_BIN_EXE_gepsea"));
    };
    let slurm_out = d.join("slurm.6");
    c.jobs.borrow_mut().push(namespace_of(&slurm_out));
    let mut cmd = Command::new("bash");
    cmd.arg(examples.join("slurm.sbatch")).env("PATH", format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()));
    script_env(&mut cmd, &slurm_out);
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "slurm.sbatch failed: {}", output_of(&o));
    assert_same(&slurm_out, &want, "examples/slurm.sbatch (srun, cyclic placement)");

    // The PBS script calls plain `mpirun`: the testbed's wiring goes in through
    // OpenMPI's environment (OMPI_MCA_*), as a site's defaults would.
    let _ = c.bed.mpirun(d, &[2, 2, 2], 6).unwrap(); // writes rsh.sh
    let nodefile = d.join("pbs_nodefile");
    std::fs::write(&nodefile, c.bed.ip.iter().flat_map(|ip| [ip, ip]).map(|ip| format!("{ip}\n")).collect::<String>()).unwrap();
    let pbs_out = d.join("pbs.6");
    c.jobs.borrow_mut().push(namespace_of(&pbs_out));
    let mut cmd = c.bed.cmd(0, "bash");
    cmd.arg(examples.join("pbs.sh")).env("PBS_NODEFILE", &nodefile).env("PBS_O_WORKDIR", d);
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_plm_rsh_agent", d.join("rsh.sh"))
        .env("OMPI_MCA_rtc", "^hwloc");
    cmd.env("OMPI_MCA_btl_tcp_if_include", &c.subnet).env("OMPI_MCA_oob_tcp_if_include", &c.subnet);
    script_env(&mut cmd, &pbs_out);
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "pbs.sh failed: {}", output_of(&o));
    assert_same(&pbs_out, &want, "examples/pbs.sh (mpirun over $PBS_NODEFILE)");
    std::fs::remove_dir_all(&bin).unwrap();
    for f in ["rsh.sh", "hosts", "pbs_nodefile"] {
        std::fs::remove_file(d.join(f)).unwrap();
    }
    processes_left(&c);
    c.assert_clean(&[namespace_of(&slurm_out), namespace_of(&pbs_out)]);
}
