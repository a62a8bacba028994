//! The storage site: regenerates what arrives and writes it, whole objects and reports
//! that come a part at a time.
//!
//! A whole object (a report shipped once the search is over) is regenerated and written
//! as `dir/<name>` through a temporary file. A part (shipped by a compute-site agent as
//! soon as its batch was final, see `gepsea_blast::ship`) is regenerated at once, kept
//! as `dir/.<name>.parts-<job>/<index>`, and fed to the report's [`Assembler`] as soon
//! as every part before it is in, so the report is written in order while the search
//! goes on; the last part completes it and the report is renamed into place. Parts
//! arrive in any order, from any compute node. Parts of different searches (jobs) never
//! mix, and a storage site restarted mid-report starts its assembly again from the
//! parts it kept.
//!
//! [`StorageSite`] counts what it received, regenerated and refused ([`SiteStats`]):
//! `gepsea agent --storage-listen` serves it from an agent ([`StoragePlugin`], shown by
//! `gepsea agent status`), `gepsea paramedic serve` from a process of its own.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use gepsea_agent::plugin::{Context, Plugin, PluginError as AgentPluginError, Uses};
use gepsea_blast::parts::Assembler;
use gepsea_blast::ship::PartOf;
use parking_lot::Mutex;
use serde::Serialize;

use crate::blast::BlastPlugin;
use crate::container::{self, ContainerError};
use crate::plugin::{MetadataPlugin, RawPlugin, ZstdPlugin};
use crate::trace::TracePlugin;
use crate::transfer::{self, write_atomically, Ack, Key, Sink};

/// The plug-in that regenerates what plug-in `name` encoded (`blast` needs this site's
/// replica of the database; it runs up to `threads` BLAST+ processes at once).
pub fn decoder(name: &str, replica: Option<&Path>, threads: usize) -> Option<Box<dyn MetadataPlugin>> {
    match name {
        "zstd" => Some(Box::new(ZstdPlugin::default())),
        "raw" => Some(Box::new(RawPlugin)),
        "trace" => Some(Box::new(TracePlugin)),
        "blast" => replica.map(|d| Box::new(BlastPlugin::storage_site(d).with_threads(threads)) as Box<dyn MetadataPlugin>),
        _ => None,
    }
}

/// What a storage site has done so far (shared with whoever reports it).
#[derive(Debug, Default, Clone, Serialize)]
pub struct SiteStats {
    /// Objects acknowledged as written (whole outputs and parts).
    pub objects_written: u64,
    /// Objects refused (damaged, foreign, unencrypted at an encrypted site, ...).
    pub objects_refused: u64,
    /// Bytes of the objects that arrived intact (metadata, compressed or raw).
    pub bytes_received: u64,
    /// Bytes regenerated (parts and whole outputs).
    pub bytes_regenerated: u64,
    /// Seconds spent checking, regenerating and writing.
    pub storage_seconds: f64,
    /// Reports completed from parts.
    pub reports_completed: u64,
    /// Reports being assembled: parts in / parts in all, by report name.
    pub reports_in_progress: BTreeMap<String, (u32, u32)>,
    /// Why the last refused object was refused.
    pub last_refusal: Option<String>,
}

impl SiteStats {
    /// Counts an acknowledgement that was sent.
    pub fn acknowledged(&mut self, ack: &Ack) {
        self.storage_seconds += ack.seconds;
        match &ack.result {
            Ok(_) => self.objects_written += 1,
            Err(e) => {
                self.objects_refused += 1;
                self.last_refusal = Some(if ack.name.is_empty() { e.clone() } else { format!("{}: {e}", ack.name) });
            }
        }
    }
}

/// A report being assembled from parts.
struct Assembly {
    total: u32,
    outfmt: String,
    /// The next part to feed (every part before it is in the report).
    next: u32,
    /// Parts regenerated and kept so far.
    have: std::collections::BTreeSet<u32>,
    tmp: PathBuf,
    asm: Assembler<std::io::BufWriter<std::fs::File>>,
}

type Decoders = Box<dyn Fn(&str) -> Option<Box<dyn MetadataPlugin>> + Send + Sync>;

/// Regenerates each object with the plug-in named in its container and writes it into
/// `dir` (see the module docs).
pub struct StorageSite {
    dir: PathBuf,
    decoders: Decoders,
    /// Reports being assembled, by (name, job): parts are regenerated on several
    /// threads at once, and fed into their report in order under this lock.
    assembling: Mutex<HashMap<(String, String), Assembly>>,
    stats: Arc<Mutex<SiteStats>>,
}

fn job_name_ok(job: &str) -> bool {
    !job.is_empty() && job.len() <= 128 && job.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl StorageSite {
    /// Writes into `dir`, regenerating BLAST metadata from `replica` with up to
    /// `threads` BLAST+ processes at once.
    pub fn new(dir: &Path, replica: Option<&Path>, threads: usize) -> StorageSite {
        let replica = replica.map(Path::to_path_buf);
        StorageSite {
            dir: dir.to_path_buf(),
            decoders: Box::new(move |name: &str| decoder(name, replica.as_deref(), threads)),
            assembling: Mutex::new(HashMap::new()),
            stats: Default::default(),
        }
    }

    /// Its counters, live.
    pub fn stats(&self) -> Arc<Mutex<SiteStats>> {
        self.stats.clone()
    }

    fn regenerate(&self, data: &[u8]) -> Result<Vec<u8>, String> {
        let (plugin_name, _) = container::unwrap(data).map_err(|e| e.to_string())?;
        let plugin = (self.decoders)(&plugin_name).ok_or_else(|| format!("no plug-in {plugin_name:?} at the storage site"))?;
        container::open(plugin.as_ref(), data).map_err(|e: ContainerError| e.to_string())
    }

    fn parts_dir(&self, name: &str, job: &str) -> PathBuf {
        self.dir.join(format!(".{name}.parts-{job}"))
    }

    fn store_part(&self, name: &str, part: &PartOf, data: &[u8]) -> Result<u64, String> {
        if !job_name_ok(&part.job) {
            return Err(format!("part of {name}: job id {:?} is not a plain name", part.job));
        }
        if part.index >= part.total {
            return Err(format!("part {} of {name} announced as one of {} parts", part.index, part.total));
        }
        let key = (name.to_string(), part.job.clone());
        let consistent = |a: &Assembly| -> Result<(), String> {
            if a.total != part.total || a.outfmt != part.outfmt {
                return Err(format!(
                    "part {} of {name} says {} parts of -outfmt {:?}; earlier parts said {} of {:?}",
                    part.index, part.total, part.outfmt, a.total, a.outfmt
                ));
            }
            Ok(())
        };
        if let Some(a) = self.assembling.lock().get(&key) {
            consistent(a)?;
        }
        // Regenerated without the lock: other parts regenerate meanwhile.
        let output = self.regenerate(data)?;
        let dir = self.parts_dir(name, &part.job);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let part_file = dir.join(part.index.to_string());
        let mut assembling = self.assembling.lock();
        // Checked again: another part may have begun the report while this one
        // regenerated.
        if let Some(a) = assembling.get(&key) {
            consistent(a)?;
        }
        write_atomically(&part_file, &output).map_err(|e| format!("{}: {e}", dir.display()))?;
        let regenerated = output.len() as u64;
        drop(output);
        if !assembling.contains_key(&key) {
            let tmp = self.dir.join(format!(".{name}.{}.gepsea-tmp{}", part.job, std::process::id()));
            let file = std::fs::File::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
            let asm = Assembler::new(std::io::BufWriter::with_capacity(1 << 20, file), gepsea_blast::report::base_format(&part.outfmt));
            let have = (0..part.total).filter(|i| dir.join(i.to_string()).is_file()).collect();
            assembling.insert(key.clone(), Assembly { total: part.total, outfmt: part.outfmt.clone(), next: 0, have, tmp, asm });
        }
        let result = self.advance(&mut assembling, &key, part.index, &dir);
        if result.is_err() {
            if let Some(a) = assembling.remove(&key) {
                let _ = std::fs::remove_file(&a.tmp);
            }
            self.stats.lock().reports_in_progress.remove(name);
        }
        result.map(|()| regenerated)
    }

    /// Feeds every part that is now next in line; completes the report with the last.
    fn advance(
        &self,
        assembling: &mut HashMap<(String, String), Assembly>,
        key: &(String, String),
        index: u32,
        dir: &Path,
    ) -> Result<(), String> {
        let name = &key.0;
        let a = assembling.get_mut(key).expect("assembly exists");
        a.have.insert(index);
        while a.have.contains(&a.next) {
            let p = dir.join(a.next.to_string());
            let f = std::fs::File::open(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            a.asm
                .part_from(std::io::BufReader::with_capacity(1 << 20, f), a.next + 1 == a.total)
                .map_err(|e| format!("{}: {e}", p.display()))?;
            a.next += 1;
        }
        let progress = (a.have.len() as u32, a.total);
        if a.next < a.total {
            self.stats.lock().reports_in_progress.insert(name.clone(), progress);
            return Ok(());
        }
        let a = assembling.remove(key).expect("assembly exists");
        let mut w = a.asm.finish()?;
        w.flush().map_err(|e| format!("{}: {e}", a.tmp.display()))?;
        drop(w);
        let out = self.dir.join(name);
        std::fs::rename(&a.tmp, &out).map_err(|e| format!("{}: {e}", out.display()))?;
        let _ = std::fs::remove_dir_all(dir);
        let mut s = self.stats.lock();
        s.reports_in_progress.remove(name);
        s.reports_completed += 1;
        Ok(())
    }

    /// Removes what a storage site of process `pid` leaves half-done: its temporary
    /// files in `dir` (a report being assembled, an output being written) and its
    /// regeneration scratch in the user's runtime root (`blast.rs`). Kept parts
    /// stay: a restarted site resumes from them.
    pub fn remove_temporaries(dir: &Path, pid: u32) {
        let remove = |dir: &Path, is_ours: &dyn Fn(&str) -> bool| {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if is_ours(&e.file_name().to_string_lossy()) {
                    let _ = std::fs::remove_dir_all(e.path()).or_else(|_| std::fs::remove_file(e.path()));
                }
            }
        };
        let (tmp_suffix, scratch_infix) = (format!(".gepsea-tmp{pid}"), format!("-{pid}-"));
        remove(dir, &|n| n.ends_with(&tmp_suffix));
        remove(&gepsea_net::trust::user_runtime_root(), &|n| n.starts_with("gepsea-paramedic-") && n.contains(&scratch_infix));
    }
}

impl Drop for StorageSite {
    fn drop(&mut self) {
        for (_, a) in self.assembling.get_mut().drain() {
            let _ = std::fs::remove_file(&a.tmp);
        }
    }
}

impl Sink for StorageSite {
    fn store(&self, name: &str, part: Option<&PartOf>, data: &[u8]) -> Result<u64, String> {
        let started = Instant::now();
        let r = match part {
            Some(p) => self.store_part(name, p, data),
            None => self
                .regenerate(data)
                .and_then(|out| write_atomically(&self.dir.join(name), &out).map(|_| out.len() as u64).map_err(|e| e.to_string())),
        };
        if let Ok(n) = &r {
            let mut s = self.stats.lock();
            s.bytes_received += data.len() as u64;
            s.bytes_regenerated += n;
        }
        tracing::debug!("stored {name} {part:?} in {:.3} s: {r:?}", started.elapsed().as_secs_f64());
        r
    }
}

/// How a storage-site agent serves (`gepsea agent --storage-listen`).
pub struct StorageConfig {
    /// Where compute sites send (port 0: any).
    pub listen: std::net::SocketAddr,
    /// Where reports are written.
    pub out: PathBuf,
    /// This site's replica of the database (BLAST metadata needs it).
    pub replica: Option<PathBuf>,
    /// Accept only transfers encrypted under this key.
    pub key: Option<Key>,
    /// BLAST+ processes at once per regeneration.
    pub threads: usize,
    /// Largest object taken (see [`transfer::DEFAULT_MAX_OBJECT`]).
    pub max_object: u64,
    /// Objects checked and regenerated at once ([`transfer::serve`]).
    pub objects_at_once: usize,
}

/// Objects a storage site regenerates at once by default: one regenerating while
/// another's serial steps (decrypting, checking, BLAST+'s start, formatting, writing)
/// run. On 2 cores it measured no faster than one at a time (`docs/benchmarks.md`); a
/// site with more cores than one part's BLAST+ runs can use gains more.
pub const DEFAULT_OBJECTS_AT_ONCE: u64 = 2;

/// The storage site as an agent plug-in (`paramedic-storage`): serves transfers on a
/// thread of its own; its [`SiteStats`] are in `gepsea agent status`, and a request
/// (any body) answers them as JSON.
pub struct StoragePlugin {
    stats: Arc<Mutex<SiteStats>>,
    listen: std::net::SocketAddr,
    namespace: String,
    out: PathBuf,
}

/// The storage plug-in's name.
pub const STORAGE_PLUGIN: &str = "paramedic-storage";

impl StoragePlugin {
    /// Opens the storage site's port on `cfg.listen` and serves on a thread until the
    /// process ends.
    pub fn start(cfg: StorageConfig) -> Result<StoragePlugin, transfer::TransferError> {
        std::fs::create_dir_all(&cfg.out).map_err(|e| transfer::TransferError::Io(format!("{}: {e}", cfg.out.display())))?;
        let namespace = format!("paramedic-storage{}", std::process::id());
        let port = transfer::storage_port(&namespace, cfg.listen)?;
        let listen = port.listen_addr().unwrap_or(cfg.listen);
        let site = StorageSite::new(&cfg.out, cfg.replica.as_deref(), cfg.threads);
        let stats = site.stats();
        std::thread::Builder::new()
            .name("paramedic-storage".into())
            .spawn(move || {
                let counted = site.stats();
                let served = transfer::serve(&port, &site, None, cfg.key.as_ref(), cfg.max_object, cfg.objects_at_once, |ack| {
                    counted.lock().acknowledged(ack);
                    match &ack.result {
                        Ok(n) => tracing::info!("storage site: regenerated {} ({n} bytes) in {:.2} s", ack.name, ack.seconds),
                        Err(e) => tracing::warn!("storage site: refused {}: {e}", ack.name),
                    }
                });
                if let Err(e) = served {
                    tracing::error!("storage site stopped: {e}");
                }
            })
            .map_err(|e| transfer::TransferError::Io(e.to_string()))?;
        Ok(StoragePlugin { stats, listen, namespace, out: cfg.out })
    }

    /// Where it listens (the port chosen, for port 0).
    pub fn listen_addr(&self) -> std::net::SocketAddr {
        self.listen
    }

    /// Removes its runtime directory and temporary files (the process is ending).
    pub fn remove_runtime(&self) {
        let _ = std::fs::remove_dir_all(gepsea_net::namespace_dir(&self.namespace));
        StorageSite::remove_temporaries(&self.out, std::process::id());
    }
}

impl Plugin for StoragePlugin {
    fn name(&self) -> &str {
        STORAGE_PLUGIN
    }
    fn uses(&self) -> &[Uses] {
        &[]
    }
    fn handle(&self, _ctx: &Context<'_>, _request: &[u8]) -> Result<Vec<u8>, AgentPluginError> {
        serde_json::to_vec(&*self.stats.lock()).map_err(|e| AgentPluginError::Failed(e.to_string()))
    }
    fn status(&self) -> Option<serde_json::Value> {
        let mut v = serde_json::to_value(&*self.stats.lock()).ok()?;
        v["listen"] = self.listen.to_string().into();
        v["out"] = self.out.display().to_string().into();
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pairwise-style parts: each a complete report (header, its queries, footer).
    fn parts(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| {
                format!(
                    "BLASTP 2.x\n\nDatabase: T\n\nQuery= q{i}a\nhit {i}\n\nQuery= q{i}b\nhit {i}b\n\n  Database: T\n    Posted date: x\n"
                )
            })
            .collect()
    }

    fn sealed(text: &str) -> Vec<u8> {
        container::seal(&RawPlugin, text.as_bytes()).unwrap()
    }

    fn of(job: &str, index: u32, total: u32) -> PartOf {
        PartOf { job: job.into(), index, total, outfmt: "0".into() }
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn dir(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("gepsea-storage-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    #[test]
    fn parts_in_any_order_make_the_report_once_the_last_is_in() {
        let d = dir("order");
        let p = parts(4);
        let want = gepsea_blast::parts::assemble(&p, 0).unwrap();
        let site = StorageSite::new(&d.0, None, 1);
        for (k, i) in [2u32, 0, 3, 1].into_iter().enumerate() {
            assert!(!d.0.join("r.txt").exists(), "the report appeared before its last part");
            assert_eq!(site.store("r.txt", Some(&of("j1", i, 4)), &sealed(&p[i as usize])), Ok(p[i as usize].len() as u64));
            if k < 3 {
                assert_eq!(site.stats().lock().reports_in_progress.get("r.txt"), Some(&(k as u32 + 1, 4)));
            }
        }
        assert_eq!(std::fs::read_to_string(d.0.join("r.txt")).unwrap(), want);
        let s = site.stats().lock().clone();
        assert_eq!((s.reports_completed, s.reports_in_progress.len()), (1, 0));
        assert_eq!(s.bytes_regenerated, p.iter().map(|x| x.len() as u64).sum::<u64>());
        // Nothing but the report is left: no kept parts, no temporary file.
        assert_eq!(files(&d.0), ["r.txt"]);
    }

    #[test]
    fn a_restarted_site_finishes_the_report_from_the_parts_it_kept() {
        let d = dir("restart");
        let p = parts(3);
        {
            let site = StorageSite::new(&d.0, None, 1);
            site.store("r.txt", Some(&of("j2", 0, 3)), &sealed(&p[0])).unwrap();
            site.store("r.txt", Some(&of("j2", 2, 3)), &sealed(&p[2])).unwrap();
        }
        // The first site is gone: its temporary report with it, its parts kept.
        assert_eq!(files(&d.0), [".r.txt.parts-j2"]);
        let site = StorageSite::new(&d.0, None, 1);
        site.store("r.txt", Some(&of("j2", 1, 3)), &sealed(&p[1])).unwrap();
        assert_eq!(std::fs::read_to_string(d.0.join("r.txt")).unwrap(), gepsea_blast::parts::assemble(&p, 0).unwrap());
        assert_eq!(files(&d.0), ["r.txt"]);
    }

    #[test]
    fn damaged_foreign_or_inconsistent_parts_are_refused_and_nothing_is_written() {
        let d = dir("refuse");
        let p = parts(2);
        let site = StorageSite::new(&d.0, None, 1);
        let mut damaged = sealed(&p[0]);
        let mid = damaged.len() / 2;
        damaged[mid] ^= 1;
        let e = site.store("r.txt", Some(&of("j3", 0, 2)), &damaged).unwrap_err();
        assert!(e.contains("SHA-256") || e.contains("checksum"), "{e}");
        // BLAST metadata at a site without a replica, a plug-in it lacks.
        let foreign = container::wrap("blast", b"x");
        assert!(site.store("r.txt", Some(&of("j3", 0, 2)), &foreign).unwrap_err().contains("no plug-in \"blast\""));
        assert!(site.store("r.txt", Some(&of("../x", 0, 2)), &sealed(&p[0])).unwrap_err().contains("not a plain name"));
        assert!(site.store("r.txt", Some(&of("j3", 2, 2)), &sealed(&p[0])).unwrap_err().contains("one of 2 parts"));
        assert!(files(&d.0).is_empty(), "{:?}", files(&d.0));
        site.store("r.txt", Some(&of("j3", 0, 2)), &sealed(&p[0])).unwrap();
        let e = site.store("r.txt", Some(&of("j3", 1, 3)), &sealed(&p[1])).unwrap_err();
        assert!(e.contains("earlier parts said 2"), "{e}");
        assert!(!d.0.join("r.txt").exists());
        // Another search's parts of a report of the same name do not mix with these.
        site.store("r.txt", Some(&of("j4", 1, 2)), &sealed(&p[1])).unwrap();
        assert!(!d.0.join("r.txt").exists());
        site.store("r.txt", Some(&of("j3", 1, 2)), &sealed(&p[1])).unwrap();
        assert_eq!(std::fs::read_to_string(d.0.join("r.txt")).unwrap(), gepsea_blast::parts::assemble(&p, 0).unwrap());
    }

    /// `serve` stores several parts at once: from 4 threads, 24 parts of two reports in
    /// a shuffled order make both reports exactly, each once.
    #[test]
    fn parts_stored_from_several_threads_at_once_make_each_report_exactly() {
        let d = dir("threads");
        let p = parts(12);
        let want = gepsea_blast::parts::assemble(&p, 0).unwrap();
        let site = StorageSite::new(&d.0, None, 1);
        let mut order: Vec<(&str, u32)> = (0..12).flat_map(|i| [("a.txt", i), ("b.txt", i)]).collect();
        // A fixed shuffle: far-apart parts first, neighbours on different threads.
        order.sort_by_key(|(n, i)| ((i * 7 + n.len() as u32) % 12, *n));
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&(name, i)) = order.get(k) else { break };
                    let job = if name == "a.txt" { "ja" } else { "jb" };
                    assert_eq!(site.store(name, Some(&of(job, i, 12)), &sealed(&p[i as usize])), Ok(p[i as usize].len() as u64));
                });
            }
        });
        for name in ["a.txt", "b.txt"] {
            assert_eq!(std::fs::read_to_string(d.0.join(name)).unwrap(), want, "{name}");
        }
        let s = site.stats().lock().clone();
        assert_eq!((s.reports_completed, s.reports_in_progress.len()), (2, 0));
        assert_eq!(files(&d.0), ["a.txt", "b.txt"]);
    }
}
