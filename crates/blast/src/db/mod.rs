//! Databases a search runs on: made by `gepsea db format`, or any existing BLAST
//! database (NCBI's preformatted ones included), described alike by a [`Manifest`].
//!
//! Exactness needs every fragment search to see whole-database statistics: each
//! fragment gets an alias (`<frag>.stats.pal`) carrying the whole database's title,
//! sequence count and residue count (`NSEQ`, `LENGTH`), which fixes e-values, the
//! effective search space and the report's header counts. A one-sequence database with
//! the same whole-database alias (`stats.pal`) lets the final report recompute
//! per-query statistics cheaply.
//!
//! - [`format`](mod@format) builds a database from FASTA: fragments are real BLAST databases, and an
//!   alias over all of them in order (`<name>.pal`) *is* the whole database (same OIDs).
//! - [`external`] opens an existing BLAST database without copying a byte of it: its
//!   fragments are *virtual*, aliases over the whole database restricted to an OID range
//!   (`FIRST_OID`/`LAST_OID`), kept in a small side directory outside the database's own
//!   (which may be read-only).
//!
//! Opening a database for a search checks the manifest, every fragment file's size and
//! that the whole-database and statistics files are there; the
//! SHA-256 of every file, computed once at format time, is checked on demand by
//! [`verify`] (`gepsea db verify`): hashing a large database on every search would cost
//! more than many searches.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::fasta::{FastaError, MolType};
use crate::tools::{self, ToolError};

pub mod external;
pub mod format;
mod ids;

pub use format::{default_name, format, FormatOptions};

/// Current manifest format.
pub const MANIFEST_VERSION: u32 = 1;

/// One fragment of the database.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Fragment {
    /// Base name of the BLAST database (and alias `<name>.stats`).
    pub name: String,
    pub sequences: u64,
    pub residues: u64,
    /// Global index (OID) of the fragment's first sequence.
    pub first_oid: u64,
    /// SHA-256 of every file of the fragment, by file name; empty for a virtual
    /// fragment (an OID range of an existing database: it has no files of its own).
    pub files: BTreeMap<String, String>,
    /// Size in bytes of every file in `files` (absent in manifests of older gepsea
    /// versions: those are checked for existence only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sizes: BTreeMap<String, u64>,
}

impl Fragment {
    /// The files a search of the fragment reads, with their SHA-256: its BLAST files
    /// and its statistics alias, never the FASTA it was made from (what hot-swap
    /// stages).
    pub fn searched_files(&self) -> impl Iterator<Item = (&String, &String)> {
        self.files.iter().filter(|(n, _)| !n.ends_with(".fasta"))
    }
}

/// An existing BLAST database a manifest describes (see [`external`]).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct External {
    /// The `-db` argument as the user gave it; BLAST+ prints it in tabular and XML
    /// reports, so every run of the job names the database this way.
    pub given: String,
    /// The directory the name was resolved from (the user's working directory).
    pub cwd: PathBuf,
    /// What `blastdbcmd -info` said when the side directory was made: a rebuilt database
    /// (another date, size or volume list) invalidates it.
    pub info: String,
}

/// `manifest.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub format_version: u32,
    /// The `-db` name a serial run would use: the whole-database alias of a formatted
    /// database, or an existing database's name as the user gave it.
    pub name: String,
    pub dbtype: MolType,
    pub title: String,
    pub blast_version: String,
    pub sequences: u64,
    pub residues: u64,
    pub fragments: Vec<Fragment>,
    /// Set when the fragments are virtual views of an existing BLAST database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<External>,
}

impl Manifest {
    /// Whether fragments have files of their own that agents can stage (hot-swap).
    pub fn has_fragment_files(&self) -> bool {
        self.fragments.iter().all(|f| !f.files.is_empty())
    }
}

/// A database ready to search: its manifest, the directory of gepsea's own files for
/// it (the formatted database, or an existing database's side directory), and the
/// `BLASTDB` every BLAST+ run of the job uses.
#[derive(Clone, Debug)]
pub struct Database {
    pub manifest: Manifest,
    pub dir: PathBuf,
    pub blastdb: OsString,
}

impl Database {
    /// `BLASTDB` as a string for job files read by other processes.
    pub fn blastdb_str(&self) -> Result<String, DbError> {
        self.blastdb.clone().into_string().map_err(|p| DbError::NotUtf8(PathBuf::from(p)))
    }
}

/// What went wrong formatting or opening a database.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error(transparent)]
    Fasta(#[from] FastaError),
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{0} is not empty; pass --force to overwrite it")]
    NotEmpty(PathBuf),
    #[error("{0} holds files but no gepsea database (no manifest.json): --force replaces only a database made by `gepsea db format`; choose a new or empty directory")]
    ForceNotADatabase(PathBuf),
    #[error("--input {input} lies inside --out {out}, which --force would replace: move the input or choose another --out")]
    InputInsideOut { input: PathBuf, out: PathBuf },
    #[error("cannot split {sequences} sequences into {fragments} fragments: ask for at most {sequences}")]
    TooManyFragments { sequences: u64, fragments: usize },
    #[error("--fragments must be at least 1")]
    ZeroFragments,
    #[error("{path}: not a gepsea database manifest: {reason}")]
    BadManifest { path: PathBuf, reason: String },
    #[error("{0} is a file, not a database directory: give the directory `gepsea db format --out` made")]
    FileNotDatabase(PathBuf),
    #[error(
        "{path}: checksum mismatch (manifest says {expected}, file has {actual}); the database was modified or damaged: format it again"
    )]
    Checksum { path: PathBuf, expected: String, actual: String },
    #[error(
        "{path}: {actual} bytes, but the manifest says {expected}; the database was modified or damaged (truncated?): format it again"
    )]
    Size { path: PathBuf, expected: u64, actual: u64 },
    #[error("{path}: missing; the database is incomplete: format it again")]
    Missing { path: PathBuf },
    #[error("{0}: not valid UTF-8; use a path without such characters")]
    NotUtf8(PathBuf),
    #[error("database {given:?} not found: it is not a directory made by `gepsea db format` (no manifest.json), and BLAST+ finds no database of that name in {cwd} or BLASTDB ({blastdb}): {blast}")]
    NotFound { given: String, cwd: PathBuf, blastdb: String, blast: String },
    #[error("database {given:?}: BLAST+ cannot read it: {blast}")]
    Unreadable { given: String, blast: String },
    #[error("database {given:?}: {reason}")]
    External { given: String, reason: String },
    #[error("makeblastdb option {option} is set by gepsea db format; {instead}")]
    OwnedOption { option: String, instead: &'static str },
    #[error("{0}")]
    Format(String),
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DbError + '_ {
    move |e| DbError::Io { path: path.to_path_buf(), source: e }
}

pub(crate) fn sha256_file(path: &Path) -> Result<String, DbError> {
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(io(path))?;
    Ok(format!("{:x}", h.finalize()))
}

/// Splits records into `k` contiguous groups of nearly equal residues; returns the
/// start index of each group.
pub fn balanced_split(residues: &[usize], k: usize) -> Vec<usize> {
    let total: usize = residues.iter().sum();
    let mut split = OnlineSplit::new(total as u64, residues.len() as u64, k);
    for &r in residues {
        split.push(r as u64);
    }
    split.starts.into_iter().map(|s| s as usize).collect()
}

/// Cuts a stream of `n` sequence lengths summing to `total` into `k` contiguous groups
/// of nearly equal residues without holding the lengths: a group starts at the first
/// sequence where the residues before it reach the group's share, or where every
/// remaining sequence must start a group of its own for all `k` to be non-empty.
pub struct OnlineSplit {
    total: u64,
    n: u64,
    k: u64,
    acc: u64,
    i: u64,
    /// Index of each group's first sequence, so far.
    pub starts: Vec<u64>,
}

impl OnlineSplit {
    pub fn new(total: u64, n: u64, k: usize) -> Self {
        OnlineSplit { total, n, k: k.max(1) as u64, acc: 0, i: 0, starts: vec![0] }
    }

    /// The next sequence's residues.
    pub fn push(&mut self, residues: u64) {
        let next = self.starts.len() as u64;
        if next < self.k && self.i > *self.starts.last().expect("never empty") {
            let share_reached = self.acc * self.k >= self.total * next;
            let must = self.n - self.i <= self.k - next;
            if share_reached || must {
                self.starts.push(self.i);
            }
        }
        self.acc += residues;
        self.i += 1;
    }
}

/// `p` for protein alias files (`.pal`), `n` for nucleotide (`.nal`).
pub fn alias_letter(t: MolType) -> char {
    match t {
        MolType::Prot => 'p',
        MolType::Nucl => 'n',
    }
}

/// The alias file giving fragment `frag` (a database name or path) the whole database's
/// statistics; `oids` restricts it to a 1-based inclusive OID range (a virtual fragment).
pub(crate) fn stats_alias(title: &str, frag: &str, oids: Option<(u64, u64)>, sequences: u64, residues: u64) -> String {
    // BLAST+ reads DBLIST entries as blank-separated; a path with blanks is quoted.
    let frag = if frag.contains(char::is_whitespace) { format!("\"{frag}\"") } else { frag.to_string() };
    let range = oids.map(|(a, b)| format!("FIRST_OID {a}\nLAST_OID {b}\n")).unwrap_or_default();
    format!("TITLE {title}\nDBLIST {frag}\n{range}NSEQ {sequences}\nLENGTH {residues}\n")
}

/// Writes the one-sequence database for per-query statistics (`stats-seq.*`) and its
/// whole-database alias `stats` into `dir` (see the module docs).
pub(crate) fn write_stats_db(dir: &Path, dbtype: MolType, title: &str, sequences: u64, residues: u64) -> Result<(), DbError> {
    let tiny = if dbtype == MolType::Prot { "ACDEFGHIKLMNPQRSTVWY" } else { "ACGTACGTTGCAACGTTGCA" };
    let fasta = dir.join("stats-seq.fasta");
    std::fs::write(&fasta, format!(">gepsea_stats_placeholder\n{tiny}\n")).map_err(io(&fasta))?;
    tools::run(
        "makeblastdb",
        &["-in", "stats-seq.fasta", "-dbtype", dbtype.as_str(), "-title", title, "-out", "stats-seq"],
        None,
        Some(dir),
    )?;
    std::fs::remove_file(&fasta).map_err(io(&fasta))?;
    let alias = dir.join(format!("stats.{}al", alias_letter(dbtype)));
    std::fs::write(&alias, stats_alias(title, "stats-seq", None, sequences, residues)).map_err(io(&alias))
}

fn read_manifest(dir: &Path) -> Result<Manifest, DbError> {
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        if dir.is_file() {
            // Not "FILE/manifest.json: Not a directory".
            DbError::FileNotDatabase(dir.to_path_buf())
        } else if e.kind() == std::io::ErrorKind::NotFound {
            DbError::BadManifest { path: path.clone(), reason: "missing: format the database with `gepsea db format`".into() }
        } else {
            DbError::Io { path: path.clone(), source: e }
        }
    })?;
    let m: Manifest = serde_json::from_str(&text).map_err(|e| DbError::BadManifest { path: path.clone(), reason: e.to_string() })?;
    if m.format_version != MANIFEST_VERSION {
        return Err(DbError::BadManifest {
            path,
            reason: format!("format version {} (this gepsea reads {MANIFEST_VERSION})", m.format_version),
        });
    }
    Ok(m)
}

/// Reads `DIR/manifest.json` and checks that every fragment file is there with the size
/// the manifest gives (cheap; [`verify`] checks contents).
pub fn open(dir: &Path) -> Result<Manifest, DbError> {
    let m = read_manifest(dir)?;
    for f in &m.fragments {
        for name in f.files.keys() {
            let p = dir.join(name);
            let meta = std::fs::metadata(&p).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    DbError::Missing { path: p.clone() }
                } else {
                    DbError::Io { path: p.clone(), source: e }
                }
            })?;
            if let Some(&expected) = f.sizes.get(name) {
                if meta.len() != expected {
                    return Err(DbError::Size { path: p, expected, actual: meta.len() });
                }
            }
        }
    }
    for name in unlisted_files(&m) {
        let p = dir.join(name);
        if !p.is_file() {
            return Err(DbError::Missing { path: p });
        }
    }
    Ok(m)
}

/// What every search of a database reads besides the fragments' files, which the
/// manifest does not list: the whole database's alias (a formatted database's; a
/// serial run's `-db`, and what a split by queries searches) and the statistics
/// database (`stats` and its one sequence's volume). Without one of them BLAST+ failed
/// only at the first task, twice, naming no file.
fn unlisted_files(m: &Manifest) -> Vec<String> {
    let l = alias_letter(m.dbtype);
    let mut files = vec![format!("stats.{l}al"), format!("stats-seq.{l}in"), format!("stats-seq.{l}hr"), format!("stats-seq.{l}sq")];
    if m.external.is_none() {
        files.push(format!("{}.{l}al", m.name));
    }
    files
}

/// [`open`], then every fragment file against the SHA-256 the manifest recorded at
/// format time; `progress(files checked, files)`.
pub fn verify(dir: &Path, mut progress: impl FnMut(usize, usize)) -> Result<Manifest, DbError> {
    let m = open(dir)?;
    let total: usize = m.fragments.iter().map(|f| f.files.len()).sum();
    let mut done = 0;
    for f in &m.fragments {
        for (name, sum) in &f.files {
            let p = dir.join(name);
            let actual = sha256_file(&p)?;
            if &actual != sum {
                return Err(DbError::Checksum { path: p, expected: sum.clone(), actual });
            }
            done += 1;
            progress(done, total);
        }
    }
    Ok(m)
}

/// What a search's `--db` names: a directory made by `gepsea db format`, or any BLAST
/// database `blastp -db NAME` would accept. An existing database's side directory goes
/// under `work_dir`, cut into `fragments` virtual fragments.
pub fn resolve(given: &Path, work_dir: &Path, fragments: usize) -> Result<Database, DbError> {
    if given.join("manifest.json").is_file() || (given.is_dir() && !external::looks_like_blast_db(given)) {
        let manifest = open(given)?;
        let dir = std::fs::canonicalize(given).map_err(io(given))?;
        let blastdb = tools::search_path(&[&dir]);
        return Ok(Database { manifest, dir, blastdb });
    }
    external::open(given, work_dir, fragments)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_balances_residues_and_keeps_every_group_nonempty() {
        let r = vec![10; 100];
        assert_eq!(balanced_split(&r, 4), vec![0, 25, 50, 75]);
        let r = vec![1000, 1, 1, 1, 1, 1000];
        let s = balanced_split(&r, 3);
        assert_eq!(s.len(), 3);
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(balanced_split(&[5, 5, 5], 3), vec![0, 1, 2]);
        assert_eq!(balanced_split(&[5], 1), vec![0]);
        // One huge sequence first: the others still get a group each.
        assert_eq!(balanced_split(&[1000, 1, 1, 1], 4), vec![0, 1, 2, 3]);
        let lens: Vec<usize> = (0..500).map(|i| 50 + (i * 37) % 900).collect();
        let s = balanced_split(&lens, 7);
        let sums: Vec<usize> =
            s.iter().enumerate().map(|(i, &a)| lens[a..s.get(i + 1).copied().unwrap_or(lens.len())].iter().sum()).collect();
        let (lo, hi) = (sums.iter().min().unwrap(), sums.iter().max().unwrap());
        assert!(hi - lo <= 2 * 950, "balanced within two sequences: {sums:?}");
    }

    #[test]
    fn stats_aliases_quote_paths_with_blanks_and_carry_oid_ranges() {
        assert_eq!(stats_alias("T", "frag0", None, 10, 100), "TITLE T\nDBLIST frag0\nNSEQ 10\nLENGTH 100\n");
        assert_eq!(
            stats_alias("T", "/a b/db", Some((1, 5)), 10, 100),
            "TITLE T\nDBLIST \"/a b/db\"\nFIRST_OID 1\nLAST_OID 5\nNSEQ 10\nLENGTH 100\n"
        );
    }
}
