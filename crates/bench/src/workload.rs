//! What the cluster, ParaMEDIC, soak and spare-core benchmarks share: the workload
//! (queries and database, prepared and formatted), the storage node's output location
//! behind `sshfs`, a temporary directory removed on drop, and the output check against
//! serial BLAST+.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// What the cluster and ParaMEDIC benchmarks search.
#[derive(clap::Args, Debug)]
pub struct Workload {
    /// FASTA database.
    #[arg(long, default_value = "/usr/share/doc/mmseqs2/example-data/DB.fasta.gz")]
    pub db: PathBuf,
    /// FASTA queries (the first --queries are used).
    #[arg(long, default_value = "/usr/share/doc/mmseqs2/example-data/QUERY.fasta.gz")]
    pub query: PathBuf,
    #[arg(long, default_value_t = 60)]
    pub queries: usize,
    #[arg(long, default_value_t = 4)]
    pub fragments: usize,
    /// More queries: this many database sequences, taken evenly across the database,
    /// after the query file's (a search with more result data than 500 example
    /// queries give).
    #[arg(long, default_value_t = 0)]
    pub queries_from_db: usize,
}

impl Workload {
    /// Writes the database FASTA as `dir/db.fasta` and the first `queries` queries as
    /// `dir/q.fasta` (either input may be gzipped), and formats the database into
    /// `dir/g` with `gepsea`; returns the queries' residues.
    pub fn prepare(&self, gepsea: &Path, d: &Path) -> Result<usize> {
        let residues = prepare_inputs(&self.db, &self.query, self.queries, self.queries_from_db, d)?;
        run_ok(
            Command::new(gepsea)
                .args(["db", "format", "--fragments", &self.fragments.to_string(), "--title", "T", "--name", "DB", "--input"])
                .arg(d.join("db.fasta"))
                .arg("--out")
                .arg(d.join("g")),
        )?;
        Ok(residues)
    }

    /// Formats `dir/db.fasta` (written by [`Workload::prepare`]) with one makeblastdb
    /// run as `dir/ref/DB`: the database serial BLAST+ searches for the reference.
    pub fn reference_db(d: &Path) -> Result<PathBuf> {
        let refdir = d.join("ref");
        std::fs::create_dir_all(&refdir)?;
        run_ok(
            Command::new("makeblastdb")
                .args(["-in", "../db.fasta", "-dbtype", "prot", "-parse_seqids", "-title", "T", "-out", "DB"])
                .current_dir(&refdir),
        )?;
        Ok(refdir)
    }
}

/// The output location on a storage node: `sshd` in the storage node's namespace, the
/// directory mounted here with `sshfs` (run in a compute node's network namespace,
/// mounted in this machine's mount namespace so every node sees it). Writes to the
/// output cross the network to the storage node as they would to a file server.
pub(crate) struct StorageMount {
    pub mountpoint: PathBuf,
    sshd: std::process::Child,
}

impl StorageMount {
    /// `storage_ns`/`storage_ip`: the storage node; `client_ns`: the namespace whose
    /// network the mount uses; `dir`: where keys, the export and the mount point go.
    pub fn new(storage_ns: &str, storage_ip: &str, client_ns: &str, dir: &Path) -> Result<StorageMount> {
        let keys = dir.join("ssh");
        let export = dir.join("storage-export");
        let mountpoint = dir.join("storage");
        for d in [&keys, &export, &mountpoint] {
            std::fs::create_dir_all(d)?;
        }
        std::fs::create_dir_all("/run/sshd")?;
        if !keys.join("host").exists() {
            run_ok(Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-f"]).arg(keys.join("host")))?;
            run_ok(Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-f"]).arg(keys.join("client")))?;
        }
        std::fs::copy(keys.join("client.pub"), keys.join("authorized_keys"))?;
        let config = format!(
            "Port 22\nListenAddress {}\nHostKey {}\nAuthorizedKeysFile {}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nStrictModes no\nUsePAM no\nSubsystem sftp internal-sftp\nPidFile {}\n",
            storage_ip,
            keys.join("host").display(),
            keys.join("authorized_keys").display(),
            keys.join("sshd.pid").display()
        );
        std::fs::write(keys.join("sshd_config"), config)?;
        let sshd = Command::new("ip")
            .args(["netns", "exec", storage_ns, "/usr/sbin/sshd"])
            .arg("-D")
            .arg("-f")
            .arg(keys.join("sshd_config"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting sshd")?;
        let mut m = StorageMount { mountpoint: mountpoint.clone(), sshd };
        let target = format!("root@{storage_ip}:{}", export.display());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let o = Command::new("nsenter")
                .arg(format!("--net=/run/netns/{client_ns}"))
                .args(["sshfs", &target])
                .arg(&mountpoint)
                .args([
                    "-o",
                    &format!(
                        "IdentityFile={},StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,LogLevel=ERROR",
                        keys.join("client").display()
                    ),
                ])
                .output()?;
            if o.status.success() {
                return Ok(m);
            }
            if Instant::now() > deadline {
                let _ = m.sshd.kill();
                bail!("sshfs mount of {target} failed: {}", String::from_utf8_lossy(&o.stderr));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for StorageMount {
    fn drop(&mut self) {
        let _ = Command::new("fusermount").arg("-u").arg(&self.mountpoint).status();
        let _ = self.sshd.kill();
        let _ = self.sshd.wait();
    }
}

/// A directory removed, with everything in it, when this goes out of scope (also when
/// a benchmark fails half way).
pub(crate) struct TempDir(pub PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `c` to completion; its failure is an error carrying its stdout and stderr.
pub(crate) fn run_ok(c: &mut Command) -> Result<std::process::Output> {
    let o = c.output().with_context(|| format!("running {c:?}"))?;
    if !o.status.success() {
        bail!("{c:?} failed: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    }
    Ok(o)
}

/// Whether two BLAST+ reports are the same, line for line, but for the `Posted date:`
/// lines (the database's formatting time, which differs between two formattings).
pub(crate) fn same_output(got: &Path, want: &Path) -> Result<bool> {
    let strip = |p: &Path| -> Result<Vec<String>> {
        Ok(std::fs::read_to_string(p)
            .with_context(|| p.display().to_string())?
            .lines()
            .filter(|l| !l.trim_start().starts_with("Posted date:"))
            .map(str::to_string)
            .collect())
    };
    Ok(strip(got)? == strip(want)?)
}

fn prepare_inputs(db: &Path, query: &Path, count: usize, from_db: usize, d: &Path) -> Result<usize> {
    let unzip = |p: &Path| -> Result<Vec<u8>> {
        if p.extension().is_some_and(|e| e == "gz") {
            Ok(run_ok(Command::new("zcat").arg(p))?.stdout)
        } else {
            std::fs::read(p).with_context(|| format!("{}", p.display()))
        }
    };
    let text = |p: &Path| -> Result<String> { String::from_utf8(unzip(p)?).with_context(|| format!("{}: not text", p.display())) };
    let db_text = text(db)?;
    std::fs::write(d.join("db.fasta"), &db_text)?;
    let q = text(query)?;
    let mut n = 0;
    let mut queries: String = q
        .lines()
        .filter(|l| {
            if l.starts_with('>') {
                n += 1;
            }
            n <= count
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let total = db_text.lines().filter(|l| l.starts_with('>')).count();
    // Every stride-th sequence, the first `from_db` of them.
    if let Some(stride) = total.checked_div(from_db).map(|s| s.max(1)) {
        let (mut seq, mut taken, mut keep) = (0usize, 0usize, false);
        for l in db_text.lines() {
            if l.starts_with('>') {
                seq += 1;
                keep = seq % stride == 0 && taken < from_db;
                taken += keep as usize;
            }
            if keep {
                queries.push_str(l);
                queries.push('\n');
            }
        }
    }
    let residues: usize = queries.lines().filter(|l| !l.starts_with('>')).map(|l| l.trim().len()).sum();
    std::fs::write(d.join("q.fasta"), queries)?;
    Ok(residues)
}
