//! `gepsea db format`: split a FASTA database into fragments balanced by residues and
//! build a BLAST database per fragment, streaming, in parallel, in bounded memory.
//!
//! Two passes over the input, neither holding it:
//!
//! 1. **Scan**: validate every line ([`fasta::scan`]), count sequences and residues,
//!    refuse duplicate identifiers (makeblastdb `-parse_seqids` would), and keep
//!    *checkpoints* — (byte offset, sequence index, residues before) at record starts.
//!    Up to [`MAX_CHECKPOINTS`] of them: past that every other one is dropped and the
//!    spacing doubles, so the cut points are exact for inputs of up to that many
//!    sequences and within 1/[`MAX_CHECKPOINTS`] of the input beyond.
//! 2. **Build**: fragment boundaries are chosen among the checkpoints as
//!    [`super::balanced_split`] would choose them among records; `--jobs` threads each
//!    pipe a fragment's bytes, exactly as they stand in the input, into `makeblastdb
//!    -in -`. A plain file is read at each fragment's offset; a compressed one cannot be
//!    seeked, so the fragments are cut into one contiguous group per job and each job
//!    decompresses from the start, skipping to its group (decompression is several times
//!    faster than makeblastdb).
//!
//! Memory: the read buffers, the checkpoints (at most [`MAX_CHECKPOINTS`] × 24 bytes)
//! and, for duplicate detection, a 64-bit hash per sequence identifier, sorted in runs
//! of at most 4 Mi hashes (32 MiB) that spill to the build directory and are merged at
//! the end (8 bytes of disk per sequence; `super::ids`); a hash seen twice is confirmed
//! by exact identifiers in one more pass over the input, so a collision is never
//! reported as a duplicate. No FASTA copy is kept: each fragment's
//! files are hashed (SHA-256) and sized once, here, for [`super::verify`] and
//! [`super::open`].
//!
//! The database is built in a temporary directory next to `--out` and renamed into
//! place only when complete.

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::ids::{confirm_duplicates, id_hash, seq_id_key, IdHashes, ID_HASHES_IN_MEMORY};
use super::{alias_letter, io, sha256_file, stats_alias, write_stats_db, DbError, Fragment, Manifest, MANIFEST_VERSION};
use crate::fasta::{self, Compression, Line, MolGuess, MolType};
use crate::tools::{self, ToolError};

/// Most checkpoints the scan keeps (see the module docs).
pub const MAX_CHECKPOINTS: usize = 1 << 16;

/// Read buffer for the input.
pub(super) const READ_BUFFER: usize = 1 << 20;

/// makeblastdb options gepsea sets itself, with what to use instead.
const OWNED: &[(&str, &str)] = &[
    ("-in", "give the FASTA with --input"),
    ("-out", "give the directory with --out"),
    ("-dbtype", "use --dbtype"),
    ("-title", "use --title"),
    ("-input_type", "gepsea reads FASTA (plain, gzip, zstd or bzip2)"),
];

/// makeblastdb options whose value is a file, resolved against the user's directory
/// (makeblastdb runs in the build directory).
const FILE_OPTIONS: &[&str] = &["-taxid_map", "-mask_data", "-gi_mask_name", "-logfile"];

/// Options of `gepsea db format`.
pub struct FormatOptions<'a> {
    pub input: &'a Path,
    pub fragments: usize,
    pub out: &'a Path,
    pub dbtype: Option<MolType>,
    pub title: Option<String>,
    pub name: Option<String>,
    pub force: bool,
    /// Fragments built at once (0: one per core).
    pub jobs: usize,
    /// Passed to every makeblastdb run (e.g. `-taxid_map F`, `-blastdb_version 4`,
    /// `-max_file_sz 1GB`); `-parse_seqids` is always set.
    pub makeblastdb_args: Vec<String>,
}

/// The default database name: the input file name without compression and FASTA
/// extensions.
pub fn default_name(input: &Path) -> String {
    let mut n = input.file_name().map(|s| s.to_string_lossy().to_string()).unwrap_or_else(|| "db".into());
    for ext in [".gz", ".zst", ".bz2", ".fasta", ".fa", ".faa", ".fna", ".fas"] {
        if let Some(s) = n.strip_suffix(ext) {
            n = s.to_string();
        }
    }
    n
}

/// A record start the scan remembered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Checkpoint {
    offset: u64,
    sequence: u64,
    residues_before: u64,
}

/// What the scan found.
struct Scanned {
    totals: fasta::Totals,
    checkpoints: Vec<Checkpoint>,
    moltype: MolType,
    compression: Compression,
}

/// Pass 1 (see the module docs); `work` holds spilled identifier hashes.
fn scan(input: &Path, work: &Path) -> Result<Scanned, DbError> {
    let (reader, compression) = fasta::open_with(input, READ_BUFFER)?;
    let mut checkpoints = Vec::new();
    let mut spacing = 0u64;
    let mut residues_before = 0u64;
    let mut sequence = 0u64;
    let mut hashes = IdHashes::new(work, ID_HASHES_IN_MEMORY);
    let mut spill_error = None;
    let mut guess = MolGuess::default();
    let totals = fasta::scan(reader, input, fasta::Reading::Database, |l| {
        match l {
            Line::Header { id, offset, .. } => {
                if let Err(e) = hashes.push(id_hash(seq_id_key(id))) {
                    spill_error.get_or_insert(e);
                }
                let last = checkpoints.last().map_or(0, |c: &Checkpoint| c.offset);
                if checkpoints.is_empty() || offset - last >= spacing {
                    checkpoints.push(Checkpoint { offset, sequence, residues_before });
                    if checkpoints.len() >= MAX_CHECKPOINTS {
                        let mut i = 0;
                        checkpoints.retain(|_| {
                            i += 1;
                            i % 2 == 1
                        });
                        spacing = (spacing * 2).max(offset / checkpoints.len() as u64);
                    }
                }
                sequence += 1;
            }
            Line::Sequence { text, residues } => {
                residues_before += residues as u64;
                if sequence <= 200 {
                    guess.add(text.bytes());
                }
            }
        }
        Ok(())
    })?;
    if let Some(e) = spill_error {
        return Err(e);
    }
    let collided = hashes.repeated()?;
    if !collided.is_empty() {
        confirm_duplicates(input, &collided)?;
    }
    Ok(Scanned { totals, checkpoints, moltype: guess.guess(), compression })
}

/// Fragment boundaries among the checkpoints: indices into `checkpoints` of each
/// fragment's first record, chosen by the rule of [`super::OnlineSplit`].
fn cut(checkpoints: &[Checkpoint], totals: fasta::Totals, k: usize) -> Vec<usize> {
    let mut starts = vec![0usize];
    let (total, n, k64) = (totals.residues, totals.sequences, k as u64);
    for (i, c) in checkpoints.iter().enumerate().skip(1) {
        let next = starts.len() as u64;
        if next >= k64 {
            break;
        }
        if c.residues_before * k64 >= total * next || n - c.sequence <= k64 - next {
            starts.push(i);
        }
    }
    starts
}

/// Formats the database; returns its manifest. Nothing is left in `out` on failure
/// except what `--force` allowed to be replaced. `progress(event)` reports the stages.
pub fn format(o: &FormatOptions, mut progress: impl FnMut(Progress)) -> Result<Manifest, DbError> {
    if o.fragments == 0 {
        return Err(DbError::ZeroFragments);
    }
    let user_args = makeblastdb_args(&o.makeblastdb_args)?;
    // An existing `out` by its real path: `.` or `dir/..` name a directory whose parent
    // is not what the words say, and the new database is built beside it.
    let out = if o.out.exists() { std::fs::canonicalize(o.out).map_err(io(o.out))? } else { o.out.to_path_buf() };
    if out.exists() {
        let nonempty = std::fs::read_dir(&out).map_err(io(&out))?.next().is_some();
        if nonempty && !o.force {
            return Err(DbError::NotEmpty(o.out.to_path_buf()));
        }
        // `--force` replaces a database, never a directory of other things (`--out .
        // --force` emptied the working directory), nor the input being read.
        if nonempty && !out.join("manifest.json").is_file() {
            return Err(DbError::ForceNotADatabase(o.out.to_path_buf()));
        }
        if std::fs::canonicalize(o.input).is_ok_and(|input| input.starts_with(&out)) {
            return Err(DbError::InputInsideOut { input: o.input.to_path_buf(), out: o.out.to_path_buf() });
        }
    }
    let blast_version = tools::version()?;
    // Build in a sibling temporary directory, then swap it in: a failed run leaves the
    // previous database (or nothing) behind, never half a database.
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let name = out.file_name().unwrap_or_default().to_string_lossy().into_owned();
    // What a run of the same output killed outright left beside it: its half-built
    // database, as large as the database itself. (A database that stepped aside during
    // the final swap, `.<name>.old<pid>`, is complete and stays.)
    tools::remove_leftovers_of_gone(parent, &[&format!(".{name}.tmp")]);
    let tmp = parent.join(format!(".{name}.tmp{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    set_stage(Stage::Building(tmp.clone()));
    let result = format_into(o, &tmp, &blast_version, &user_args, &mut progress);
    // From here a signal no longer removes the build: it is moved into place, or fails.
    set_stage(Stage::Placing);
    let placed = place(result, &out, &tmp, parent, &name);
    set_stage(Stage::Starting);
    placed
}

/// Moves the finished build `tmp` into place as `out`, or removes it if the build failed.
fn place(result: Result<Manifest, DbError>, out: &Path, tmp: &Path, parent: &Path, name: &str) -> Result<Manifest, DbError> {
    match result {
        Ok(m) => {
            if out.exists() {
                // Into the existing directory, which stays the same directory (a shell
                // sitting in it, as with `--out .`, keeps seeing it): the previous
                // database's files step aside, and come back if the new ones cannot
                // all be moved in.
                let old = parent.join(format!(".{name}.old{}", std::process::id()));
                std::fs::create_dir_all(&old).map_err(io(&old))?;
                if let Err(e) = move_entries(out, &old).and_then(|()| move_entries(tmp, out)) {
                    let _ = move_entries(out, tmp);
                    let _ = move_entries(&old, out);
                    let _ = std::fs::remove_dir_all(tmp);
                    let _ = std::fs::remove_dir_all(&old);
                    return Err(io(out)(e));
                }
                let _ = std::fs::remove_dir_all(&old);
                let _ = std::fs::remove_dir(tmp);
            } else {
                std::fs::rename(tmp, out).map_err(io(out))?;
            }
            Ok(m)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(tmp);
            Err(e)
        }
    }
}

/// Where [`format`] is, for a signal handler ([`stop_build`]).
enum Stage {
    /// Checking its arguments: nothing written yet.
    Starting,
    /// Building in this temporary directory: stopping loses nothing but it.
    Building(PathBuf),
    /// Moving the finished database into place, or failed and cleaning up.
    Placing,
}

static STAGE: std::sync::Mutex<Stage> = std::sync::Mutex::new(Stage::Starting);

fn set_stage(stage: Stage) {
    *STAGE.lock().unwrap_or_else(|e| e.into_inner()) = stage;
}

/// For a signal handler (`gepsea db format` on SIGINT/SIGTERM): exits with `code` at
/// once while [`format()`] is checking its arguments, and after removing the temporary
/// directory while it builds (a database's size: nr's is hundreds of GB), holding the
/// stage's lock so that the build cannot start moving into place meanwhile. Returns
/// while the finished database moves into place, which is left to finish (stopped
/// halfway, it would leave the old database half replaced).
pub fn stop_build(code: i32) {
    let stage = STAGE.lock().unwrap_or_else(|e| e.into_inner());
    match &*stage {
        Stage::Starting => std::process::exit(code),
        Stage::Building(tmp) => {
            let _ = std::fs::remove_dir_all(tmp);
            // Its makeblastdb runs get SIGTERM as the process ends (`tools::with_parent_death`).
            std::process::exit(code);
        }
        Stage::Placing => {}
    }
}

/// Renames every entry of `from` into `to` (one file system: `to` is `from`'s
/// sibling).
fn move_entries(from: &Path, to: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(from)? {
        let e = e?;
        std::fs::rename(e.path(), to.join(e.file_name()))?;
    }
    Ok(())
}

/// Everything [`format`] does inside its temporary directory `tmp`.
fn format_into(
    o: &FormatOptions,
    tmp: &Path,
    blast_version: &str,
    user_args: &[String],
    progress: &mut impl FnMut(Progress),
) -> Result<Manifest, DbError> {
    let scanned = scan(o.input, tmp)?;
    progress(Progress::Scanned { sequences: scanned.totals.sequences, residues: scanned.totals.residues, bytes: scanned.totals.bytes });
    if o.fragments as u64 > scanned.totals.sequences {
        return Err(DbError::TooManyFragments { sequences: scanned.totals.sequences, fragments: o.fragments });
    }
    let starts = cut(&scanned.checkpoints, scanned.totals, o.fragments);
    if starts.len() < o.fragments {
        return Err(DbError::Format(format!(
            "cannot cut {} into {} non-empty fragments balanced by residues; ask for fewer",
            o.input.display(),
            o.fragments
        )));
    }
    let dbtype = o.dbtype.unwrap_or(scanned.moltype);
    let name = o.name.clone().unwrap_or_else(|| default_name(o.input));
    let title = o.title.clone().unwrap_or_else(|| name.clone());
    let plan = Plan::new(&scanned, &starts, o.fragments);
    let jobs = if o.jobs == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { o.jobs };
    let fragments = build(o.input, &scanned, &plan, jobs, dbtype, &title, user_args, tmp, progress)?;
    let l = alias_letter(dbtype);
    let list: Vec<&str> = fragments.iter().map(|f| f.name.as_str()).collect();
    let whole = tmp.join(format!("{name}.{l}al"));
    std::fs::write(&whole, format!("TITLE {title}\nDBLIST {}\n", list.join(" "))).map_err(io(&whole))?;
    write_stats_db(tmp, dbtype, &title, scanned.totals.sequences, scanned.totals.residues)?;
    let m = Manifest {
        format_version: MANIFEST_VERSION,
        name: name.clone(),
        dbtype,
        title: title.clone(),
        blast_version: blast_version.to_string(),
        sequences: scanned.totals.sequences,
        residues: scanned.totals.residues,
        fragments,
        external: None,
    };
    let path = tmp.join("manifest.json");
    std::fs::write(&path, serde_json::to_string_pretty(&m).expect("a manifest serialises")).map_err(io(&path))?;
    Ok(m)
}

/// What [`format()`] reports as it goes.
#[derive(Clone, Copy, Debug)]
pub enum Progress {
    /// The scan is done.
    Scanned { sequences: u64, residues: u64, bytes: u64 },
    /// `done` of `total` fragments are built.
    Built { done: usize, total: usize },
}

/// The user's makeblastdb options, refused where gepsea owns them, with file arguments
/// made absolute and `-parse_seqids` added once.
fn makeblastdb_args(args: &[String]) -> Result<Vec<String>, DbError> {
    let mut out = vec!["-parse_seqids".to_string()];
    let cwd = std::env::current_dir().map_err(io(Path::new(".")))?;
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if let Some((_, instead)) = OWNED.iter().find(|(o, _)| o == a) {
            return Err(DbError::OwnedOption { option: a.clone(), instead });
        }
        if a == "-parse_seqids" {
            i += 1;
            continue;
        }
        out.push(a.clone());
        if FILE_OPTIONS.contains(&a.as_str()) {
            if let Some(v) = args.get(i + 1) {
                out.push(cwd.join(v).to_string_lossy().to_string());
                i += 1;
            }
        }
        i += 1;
    }
    Ok(out)
}

/// Each fragment's byte range, sequence count and residues.
struct Plan {
    ranges: Vec<(u64, u64)>,
    sequences: Vec<u64>,
    residues: Vec<u64>,
}

impl Plan {
    fn new(s: &Scanned, starts: &[usize], k: usize) -> Plan {
        let mut p = Plan { ranges: Vec::new(), sequences: Vec::new(), residues: Vec::new() };
        for i in 0..k {
            let a = s.checkpoints[starts[i]];
            let (end, seq_end, res_end) = match starts.get(i + 1) {
                Some(&j) => (s.checkpoints[j].offset, s.checkpoints[j].sequence, s.checkpoints[j].residues_before),
                None => (s.totals.bytes, s.totals.sequences, s.totals.residues),
            };
            // The first fragment also takes anything before the first record (blank lines).
            let start = if i == 0 { 0 } else { a.offset };
            p.ranges.push((start, end));
            p.sequences.push(seq_end - a.sequence);
            p.residues.push(res_end - a.residues_before);
        }
        p
    }
}

fn fragment_name(i: usize, k: usize) -> String {
    let width = (k.max(2) - 1).to_string().len().max(2);
    format!("frag{i:0width$}")
}

/// Pass 2: builds every fragment, `jobs` at a time.
#[allow(clippy::too_many_arguments)]
fn build(
    input: &Path,
    s: &Scanned,
    plan: &Plan,
    jobs: usize,
    dbtype: MolType,
    title: &str,
    args: &[String],
    dir: &Path,
    progress: &mut impl FnMut(Progress),
) -> Result<Vec<Fragment>, DbError> {
    let k = plan.ranges.len();
    let jobs = jobs.clamp(1, k);
    // Work lists: a plain file, any fragment to any job (seek); compressed, one
    // contiguous group of fragments per job (one decompression each).
    let groups: Vec<Vec<usize>> = if s.compression == Compression::None {
        (0..k).map(|i| vec![i]).collect()
    } else {
        (0..jobs).map(|j| (j * k / jobs..(j + 1) * k / jobs).collect()).filter(|g: &Vec<usize>| !g.is_empty()).collect()
    };
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (tx, rx) = std::sync::mpsc::channel::<Result<(usize, Fragment), DbError>>();
    let failed = std::sync::atomic::AtomicBool::new(false);
    let mut fragments: Vec<Option<Fragment>> = vec![None; k];
    let mut first_error = None;
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            let tx = tx.clone();
            let (next, groups, failed) = (&next, &groups, &failed);
            scope.spawn(move || loop {
                let g = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(group) = groups.get(g) else { break };
                if failed.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let r = build_group(input, s, plan, group, dbtype, title, args, dir, &tx);
                if let Err(e) = r {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    let _ = tx.send(Err(e));
                    break;
                }
            });
        }
        drop(tx);
        let mut done = 0;
        for r in rx {
            match r {
                Ok((i, f)) => {
                    fragments[i] = Some(f);
                    done += 1;
                    progress(Progress::Built { done, total: k });
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
    });
    if let Some(e) = first_error {
        return Err(e);
    }
    Ok(fragments.into_iter().map(|f| f.expect("every fragment reported")).collect())
}

/// Builds the fragments of `group` (consecutive) from one reader of the input.
#[allow(clippy::too_many_arguments)]
fn build_group(
    input: &Path,
    s: &Scanned,
    plan: &Plan,
    group: &[usize],
    dbtype: MolType,
    title: &str,
    args: &[String],
    dir: &Path,
    tx: &std::sync::mpsc::Sender<Result<(usize, Fragment), DbError>>,
) -> Result<(), DbError> {
    let start = plan.ranges[group[0]].0;
    let mut reader: Box<dyn BufRead + Send> = if s.compression == Compression::None {
        // A plain file: read it again at the group's offset.
        let mut f = std::fs::File::open(input).map_err(io(input))?;
        f.seek(SeekFrom::Start(start)).map_err(io(input))?;
        Box::new(std::io::BufReader::with_capacity(READ_BUFFER, f))
    } else {
        let (mut r, _) = fasta::open_with(input, READ_BUFFER)?;
        let skipped = std::io::copy(&mut (&mut r).take(start), &mut std::io::sink()).map_err(io(input))?;
        if skipped != start {
            return Err(DbError::Format(format!(
                "{}: shorter on the second reading than on the first; was it changed while formatting?",
                input.display()
            )));
        }
        r
    };
    for &i in group {
        let (a, b) = plan.ranges[i];
        let f = build_fragment(&mut reader, b - a, i, plan, input, dbtype, title, args, dir)?;
        if tx.send(Ok((i, f))).is_err() {
            break;
        }
    }
    Ok(())
}

/// Pipes `len` bytes of `reader` into makeblastdb as fragment `i`; hashes its files.
#[allow(clippy::too_many_arguments)]
fn build_fragment(
    reader: &mut dyn BufRead,
    len: u64,
    i: usize,
    plan: &Plan,
    input: &Path,
    dbtype: MolType,
    title: &str,
    args: &[String],
    dir: &Path,
) -> Result<Fragment, DbError> {
    let name = fragment_name(i, plan.ranges.len());
    let log = dir.join(format!(".{name}.log"));
    let log_file = std::fs::File::create(&log).map_err(io(&log))?;
    let mut child = crate::tools::with_parent_death(&mut Command::new("makeblastdb"))
        .args(["-in", "-", "-dbtype", dbtype.as_str(), "-title", title, "-out", &name])
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                DbError::Tool(ToolError::Missing { program: "makeblastdb".into() })
            } else {
                DbError::Tool(ToolError::Io { program: "makeblastdb".into(), source: e })
            }
        })?;
    let mut stdin = child.stdin.take().expect("piped");
    let copied = std::io::copy(&mut reader.take(len), &mut stdin);
    let flushed = stdin.flush();
    drop(stdin);
    let status = child.wait().map_err(|e| DbError::Tool(ToolError::Io { program: "makeblastdb".into(), source: e }))?;
    // Lossy: makeblastdb echoes titles in whatever encoding they have ("Bad char [0xE9]
    // in string"), and a reason read strictly was lost whole.
    let stderr = String::from_utf8_lossy(&std::fs::read(&log).unwrap_or_default()).into_owned();
    let _ = std::fs::remove_file(&log);
    if !status.success() {
        return Err(DbError::Format(format!(
            "makeblastdb failed on fragment {name} of {} ({status}): {}",
            input.display(),
            tools::with_full_file_system(tools::error_lines(&stderr), dir)
        )));
    }
    match copied {
        Ok(n) if n == len => {}
        Ok(n) => {
            return Err(DbError::Format(format!(
                "{}: {n} bytes where the first reading had {len}; was it changed while formatting?",
                input.display()
            )))
        }
        Err(e) => return Err(DbError::Io { path: input.to_path_buf(), source: e }),
    }
    flushed.map_err(io(input))?;
    let (sequences, residues) = (plan.sequences[i], plan.residues[i]);
    let first_oid: u64 = plan.sequences[..i].iter().sum();
    // The statistics alias is one of the fragment's files (staged with it by hot-swap).
    let alias = dir.join(format!("{name}.stats.{}al", alias_letter(dbtype)));
    let total_seqs: u64 = plan.sequences.iter().sum();
    let total_res: u64 = plan.residues.iter().sum();
    std::fs::write(&alias, stats_alias(title, &name, None, total_seqs, total_res)).map_err(io(&alias))?;
    let prefix = format!("{name}.");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    names.sort();
    let (mut files, mut sizes) = (BTreeMap::new(), BTreeMap::new());
    for n in names {
        let p = dir.join(&n);
        sizes.insert(n.clone(), std::fs::metadata(&p).map_err(io(&p))?.len());
        files.insert(n, sha256_file(&p)?);
    }
    Ok(Fragment { name, sequences, residues, first_oid, files, sizes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cps(res: &[u64]) -> (Vec<Checkpoint>, fasta::Totals) {
        let mut v = Vec::new();
        let mut acc = 0;
        for (i, r) in res.iter().enumerate() {
            v.push(Checkpoint { offset: i as u64 * 10, sequence: i as u64, residues_before: acc });
            acc += r;
        }
        (v, fasta::Totals { sequences: res.len() as u64, residues: acc, bytes: res.len() as u64 * 10 })
    }

    #[test]
    fn cuts_among_every_record_equal_the_balanced_split() {
        for (lens, k) in [(vec![10u64; 100], 4), (vec![1000, 1, 1, 1, 1, 1000], 3), (vec![5, 5, 5], 3), (vec![1000, 1, 1, 1], 4)] {
            let (c, t) = cps(&lens);
            let want = super::super::balanced_split(&lens.iter().map(|&x| x as usize).collect::<Vec<_>>(), k);
            assert_eq!(cut(&c, t, k), want, "{lens:?} into {k}");
        }
    }

    #[test]
    fn owned_options_are_refused_and_files_made_absolute() {
        let e = makeblastdb_args(&["-title".into(), "x".into()]).unwrap_err().to_string();
        assert_eq!(e, "makeblastdb option -title is set by gepsea db format; use --title");
        let a = makeblastdb_args(&["-parse_seqids".into(), "-taxid_map".into(), "map.txt".into(), "-max_file_sz".into(), "1GB".into()])
            .unwrap();
        assert_eq!(a[0], "-parse_seqids");
        assert_eq!(a.iter().filter(|x| *x == "-parse_seqids").count(), 1);
        assert!(Path::new(&a[2]).is_absolute() && a[2].ends_with("map.txt"), "{a:?}");
        assert_eq!(&a[3..], ["-max_file_sz", "1GB"]);
    }

    #[test]
    fn default_names_drop_compression_and_fasta_extensions() {
        assert_eq!(default_name(Path::new("/x/DB.fasta.gz")), "DB");
        assert_eq!(default_name(Path::new("nr.faa.zst")), "nr");
        assert_eq!(default_name(Path::new("nt.fna.bz2")), "nt");
    }
}
