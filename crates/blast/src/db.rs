//! `gepsea db format`: split a FASTA database into fragments balanced by residues,
//! build a BLAST database per fragment, and describe it all in `manifest.json`.
//!
//! Exactness needs every fragment search to see whole-database statistics: each
//! fragment gets an alias (`<frag>.stats.pal`) carrying the whole database's title,
//! sequence count and residue count (`NSEQ`, `LENGTH`), which fixes e-values, the
//! effective search space and the report's header counts. An alias over all fragments
//! in order (`<name>.pal`) *is* the whole database (same OIDs), used to format the
//! merged result. A one-sequence database with the same whole-database alias
//! (`stats.pal`) lets the final report recompute per-query statistics cheaply.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::fasta::{self, FastaError, MolType, Record};
use crate::tools::{self, ToolError};

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
    /// SHA-256 of every file of the fragment, by file name.
    pub files: std::collections::BTreeMap<String, String>,
}

/// `manifest.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub format_version: u32,
    /// Name of the whole-database alias; the `-db` name a serial run would use.
    pub name: String,
    pub dbtype: MolType,
    pub title: String,
    pub blast_version: String,
    pub sequences: u64,
    pub residues: u64,
    pub fragments: Vec<Fragment>,
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
    #[error("cannot split {sequences} sequences into {fragments} fragments: ask for at most {sequences}")]
    TooManyFragments { sequences: usize, fragments: usize },
    #[error("--fragments must be at least 1")]
    ZeroFragments,
    #[error("{path}: not a gepsea database manifest: {reason}")]
    BadManifest { path: PathBuf, reason: String },
    #[error("{path}: checksum mismatch (manifest says {expected}, file has {actual}); the database was modified or damaged: format it again")]
    Checksum { path: PathBuf, expected: String, actual: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DbError + '_ {
    move |e| DbError::Io { path: path.to_path_buf(), source: e }
}

fn sha256_file(path: &Path) -> Result<String, DbError> {
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(io(path))?;
    Ok(format!("{:x}", h.finalize()))
}

/// Splits `n` records into `k` contiguous groups of nearly equal residues; returns the
/// start index of each group.
pub fn balanced_split(residues: &[usize], k: usize) -> Vec<usize> {
    let total: usize = residues.iter().sum();
    let mut starts = vec![0];
    let mut acc = 0usize;
    for (i, r) in residues.iter().enumerate() {
        // Cut before record i when the running total has reached the next boundary,
        // keeping at least one record per group and enough records for the rest.
        let next = starts.len();
        if next < k && i > *starts.last().unwrap() && acc * k >= total * next && residues.len() - i >= k - next {
            starts.push(i);
        }
        acc += r;
    }
    while starts.len() < k {
        // Degenerate sizes: cut the remaining records one by one from the end.
        let last = *starts.last().unwrap();
        starts.push(last + 1);
    }
    starts
}

/// Options of `gepsea db format`.
pub struct FormatOptions<'a> {
    pub input: &'a Path,
    pub fragments: usize,
    pub out: &'a Path,
    pub dbtype: Option<MolType>,
    pub title: Option<String>,
    pub name: Option<String>,
    pub force: bool,
}

/// The default database name: the input file name without `.gz` and FASTA extension.
pub fn default_name(input: &Path) -> String {
    let mut n = input.file_name().map(|s| s.to_string_lossy().to_string()).unwrap_or_else(|| "db".into());
    for ext in [".gz", ".fasta", ".fa", ".faa", ".fna", ".fas"] {
        if let Some(s) = n.strip_suffix(ext) {
            n = s.to_string();
        }
    }
    n
}

/// Formats the database; returns its manifest. Nothing is left in `out` on failure
/// except what `--force` allowed to be replaced.
pub fn format(o: &FormatOptions, mut progress: impl FnMut(usize, usize)) -> Result<Manifest, DbError> {
    if o.fragments == 0 {
        return Err(DbError::ZeroFragments);
    }
    let recs = fasta::read(o.input)?;
    if o.fragments > recs.len() {
        return Err(DbError::TooManyFragments { sequences: recs.len(), fragments: o.fragments });
    }
    let dbtype = o.dbtype.unwrap_or_else(|| fasta::guess_moltype(&recs));
    let name = o.name.clone().unwrap_or_else(|| default_name(o.input));
    let title = o.title.clone().unwrap_or_else(|| name.clone());
    if o.out.exists() {
        let nonempty = std::fs::read_dir(o.out).map_err(io(o.out))?.next().is_some();
        if nonempty && !o.force {
            return Err(DbError::NotEmpty(o.out.to_path_buf()));
        }
    }
    let blast_version = tools::version()?;
    // Build in a sibling temporary directory, then swap it in: a failed run leaves the
    // previous database (or nothing) behind, never half a database.
    let parent = o.out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let tmp = parent.join(format!(".{}.tmp{}", o.out.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let result = build(&recs, o.fragments, dbtype, &name, &title, &blast_version, &tmp, &mut progress);
    match result {
        Ok(m) => {
            if o.out.exists() {
                std::fs::remove_dir_all(o.out).map_err(io(o.out))?;
            }
            std::fs::rename(&tmp, o.out).map_err(io(o.out))?;
            Ok(m)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn build(recs: &[Record], k: usize, dbtype: MolType, name: &str, title: &str, blast_version: &str, dir: &Path, progress: &mut impl FnMut(usize, usize)) -> Result<Manifest, DbError> {
    let residues: Vec<usize> = recs.iter().map(|r| r.residues).collect();
    let starts = balanced_split(&residues, k);
    let total_seqs = recs.len() as u64;
    let total_res: u64 = residues.iter().map(|&r| r as u64).sum();
    let width = (k.max(2) - 1).to_string().len().max(2);
    let mut fragments = Vec::new();
    for (i, &s) in starts.iter().enumerate() {
        let e = starts.get(i + 1).copied().unwrap_or(recs.len());
        let fname = format!("frag{:0width$}", i, width = width);
        let fasta_path = dir.join(format!("{fname}.fasta"));
        let mut buf = Vec::new();
        for r in &recs[s..e] {
            r.write_to(&mut buf);
        }
        std::fs::write(&fasta_path, &buf).map_err(io(&fasta_path))?;
        tools::run(
            "makeblastdb",
            &["-in", &format!("{fname}.fasta"), "-dbtype", dbtype.as_str(), "-parse_seqids", "-title", title, "-out", &fname],
            None,
            Some(dir),
        )?;
        let res: u64 = residues[s..e].iter().map(|&r| r as u64).sum();
        std::fs::write(
            dir.join(format!("{fname}.stats.{}al", alias_letter(dbtype))),
            format!("TITLE {title}\nDBLIST {fname}\nNSEQ {total_seqs}\nLENGTH {total_res}\n"),
        )
        .map_err(io(dir))?;
        let mut files = std::collections::BTreeMap::new();
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map_err(io(dir))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with(&format!("{fname}.")))
            .collect();
        names.sort();
        for n in names {
            files.insert(n.clone(), sha256_file(&dir.join(&n))?);
        }
        fragments.push(Fragment { name: fname, sequences: (e - s) as u64, residues: res, first_oid: s as u64, files });
        progress(i + 1, k);
    }
    let l = alias_letter(dbtype);
    let list: Vec<&str> = fragments.iter().map(|f| f.name.as_str()).collect();
    std::fs::write(dir.join(format!("{name}.{l}al")), format!("TITLE {title}\nDBLIST {}\n", list.join(" "))).map_err(io(dir))?;
    // One-sequence database for per-query statistics (see module docs).
    let tiny = if dbtype == MolType::Prot { "ACDEFGHIKLMNPQRSTVWY" } else { "ACGTACGTTGCAACGTTGCA" };
    std::fs::write(dir.join("stats-seq.fasta"), format!(">gepsea_stats_placeholder\n{tiny}\n")).map_err(io(dir))?;
    tools::run("makeblastdb", &["-in", "stats-seq.fasta", "-dbtype", dbtype.as_str(), "-title", title, "-out", "stats-seq"], None, Some(dir))?;
    std::fs::write(dir.join(format!("stats.{l}al")), format!("TITLE {title}\nDBLIST stats-seq\nNSEQ {total_seqs}\nLENGTH {total_res}\n")).map_err(io(dir))?;
    let m = Manifest {
        format_version: MANIFEST_VERSION,
        name: name.to_string(),
        dbtype,
        title: title.to_string(),
        blast_version: blast_version.to_string(),
        sequences: total_seqs,
        residues: total_res,
        fragments,
    };
    let path = dir.join("manifest.json");
    std::fs::write(&path, serde_json::to_string_pretty(&m).unwrap()).map_err(io(&path))?;
    Ok(m)
}

/// `p` for protein alias files (`.pal`), `n` for nucleotide (`.nal`).
pub fn alias_letter(t: MolType) -> char {
    match t {
        MolType::Prot => 'p',
        MolType::Nucl => 'n',
    }
}

/// Reads `DIR/manifest.json` and checks every fragment file against its checksum.
pub fn open(dir: &Path) -> Result<Manifest, DbError> {
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            DbError::BadManifest { path: path.clone(), reason: "missing: format the database with `gepsea db format`".into() }
        } else {
            DbError::Io { path: path.clone(), source: e }
        }
    })?;
    let m: Manifest = serde_json::from_str(&text).map_err(|e| DbError::BadManifest { path: path.clone(), reason: e.to_string() })?;
    if m.format_version != MANIFEST_VERSION {
        return Err(DbError::BadManifest { path, reason: format!("format version {} (this gepsea reads {MANIFEST_VERSION})", m.format_version) });
    }
    for f in &m.fragments {
        for (name, sum) in &f.files {
            let p = dir.join(name);
            let actual = sha256_file(&p)?;
            if &actual != sum {
                return Err(DbError::Checksum { path: p, expected: sum.clone(), actual });
            }
        }
    }
    Ok(m)
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
    }
}
