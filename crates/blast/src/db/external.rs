//! Searching an existing BLAST database (made by `makeblastdb`, or downloaded
//! preformatted from NCBI: multi-volume, with `.pal`/`.nal` alias files) without
//! reformatting or copying it.
//!
//! The database is named as `blastp -db NAME` would take it: a path, or a name found in
//! the working directory or through `BLASTDB`. `blastdbcmd -info` says what it is; every
//! volume's index is checked against its files (a truncated download is refused here,
//! not hours into a search); `blastdbcmd -outfmt %l` streams the sequence lengths, from
//! which the database is cut into fragments balanced by residues. A fragment is
//! *virtual*: an alias over the whole database with `FIRST_OID`/`LAST_OID` and the whole
//! database's `NSEQ`/`LENGTH`, so it scans only its OID range but reports whole-database
//! statistics and global OIDs. These aliases, the statistics database and a manifest go
//! into a side directory under the job's work directory, keyed by the database's
//! `-info` (a rebuilt database gets a new one), never into the database's own
//! directory, which may be read-only or shared.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{
    alias_letter, io, stats_alias, write_stats_db, Database, DbError, External, Fragment, Manifest, OnlineSplit, MANIFEST_VERSION,
};
use crate::fasta::MolType;
use crate::tools::{self, ToolError};

/// Whether `path` names a BLAST database by its files (`path.pal`, `path.pin`, ...),
/// as opposed to a gepsea database directory of the same name.
pub fn looks_like_blast_db(path: &Path) -> bool {
    ["pal", "pin", "nal", "nin", "00.pin", "00.nin"].iter().any(|ext| PathBuf::from(format!("{}.{ext}", path.display())).is_file())
}

/// What `blastdbcmd -info` says about a database.
#[derive(Clone, Debug, PartialEq)]
pub struct Info {
    pub title: String,
    pub sequences: u64,
    pub residues: u64,
    /// Volume paths (without extension), in OID order.
    pub volumes: Vec<PathBuf>,
    /// The whole text, the side directory's key.
    pub text: String,
}

/// Parses `blastdbcmd -info` output.
pub fn parse_info(text: &str) -> Option<Info> {
    let mut lines = text.lines();
    let title = lines.next()?.strip_prefix("Database: ")?.to_string();
    let counts = lines.next()?.trim();
    let (seqs, rest) = counts.split_once(" sequences; ")?;
    let res = rest.strip_suffix(" total residues").or_else(|| rest.strip_suffix(" total bases"))?;
    let num = |s: &str| s.replace(',', "").trim().parse::<u64>().ok();
    let mut volumes = Vec::new();
    let mut in_volumes = false;
    for l in text.lines() {
        if l.starts_with("Volumes:") {
            in_volumes = true;
        } else if in_volumes && l.starts_with('\t') {
            volumes.push(PathBuf::from(l.trim()));
        } else if in_volumes {
            in_volumes = false;
        }
    }
    Some(Info { title, sequences: num(seqs)?, residues: num(res)?, volumes, text: text.to_string() })
}

fn blastdbcmd(given: &str, dbtype: MolType, args: &[&str]) -> Result<std::process::Output, ToolError> {
    let mut all = vec!["-db", given, "-dbtype", dbtype.as_str()];
    all.extend_from_slice(args);
    // The user's own BLASTDB and working directory: the name resolves as in their serial run.
    tools::run("blastdbcmd", &all, None, None)
}

/// The database's type and `-info`, trying protein first.
fn info(given: &str) -> Result<(MolType, Info), DbError> {
    let mut first_error = None;
    for t in [MolType::Prot, MolType::Nucl] {
        match blastdbcmd(given, t, &["-info"]) {
            Ok(out) => {
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                let info = parse_info(&text).ok_or_else(|| DbError::External {
                    given: given.into(),
                    reason: format!("unexpected `blastdbcmd -info` output: {:?}", text.lines().next().unwrap_or("")),
                })?;
                return Ok((t, info));
            }
            Err(ToolError::Failed { stderr, .. }) => {
                first_error.get_or_insert(tools::error_lines(&stderr));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(DbError::NotFound {
        given: given.into(),
        cwd: std::env::current_dir().unwrap_or_default(),
        blastdb: std::env::var("BLASTDB").unwrap_or_else(|_| "unset".into()),
        blast: first_error.unwrap_or_default(),
    })
}

/// Where the database `given` is, as an absolute path BLAST+ accepts in an alias's
/// `DBLIST` (the alias or index file without extension): found the way BLAST+ finds it,
/// in the working directory and then in each `BLASTDB` directory.
fn locate(given: &str, dbtype: MolType) -> Option<PathBuf> {
    let l = alias_letter(dbtype);
    let cwd = std::env::current_dir().ok()?;
    let mut dirs = vec![cwd.clone()];
    if let Some(v) = std::env::var_os("BLASTDB") {
        dirs.extend(std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()).map(|p| cwd.join(p)));
    }
    dirs.iter()
        .map(|d| d.join(given))
        .find(|p| [format!("{l}al"), format!("{l}in")].iter().any(|ext| PathBuf::from(format!("{}.{ext}", p.display())).is_file()))
}

fn be32(b: &[u8], at: &mut usize) -> Option<u32> {
    let v = u32::from_be_bytes(b.get(*at..*at + 4)?.try_into().ok()?);
    *at += 4;
    Some(v)
}

/// Checks one volume's header and sequence files against the sizes its index (`.pin` /
/// `.nin`, BLAST database version 4 or 5) records: a truncated or partly downloaded
/// volume is named before any search starts.
pub fn check_volume(volume: &Path, dbtype: MolType) -> Result<(), DbError> {
    let l = alias_letter(dbtype);
    let file = |ext: &str| PathBuf::from(format!("{}.{l}{ext}", volume.display()));
    let index_path = file("in");
    let mut index = Vec::new();
    std::fs::File::open(&index_path).and_then(|mut f| f.read_to_end(&mut index)).map_err(io(&index_path))?;
    let bad = |what: &str| DbError::External {
        given: volume.display().to_string(),
        reason: format!("{}: {what}; the volume is damaged or truncated: download or build it again", index_path.display()),
    };
    let mut at = 0;
    let version = be32(&index, &mut at).ok_or_else(|| bad("too short"))?;
    if version != 4 && version != 5 {
        return Err(bad(&format!("unknown index version {version}")));
    }
    at += 4; // molecule type
    if version == 5 {
        at += 4; // volume number
    }
    let strings = if version == 5 { 3 } else { 2 }; // title, (LMDB name,) date
    for _ in 0..strings {
        let n = be32(&index, &mut at).ok_or_else(|| bad("too short"))? as usize;
        at += n;
    }
    let oids = be32(&index, &mut at).ok_or_else(|| bad("too short"))? as usize;
    at += 8 + 4; // total length, longest sequence
    let header_end_at = at + 4 * oids;
    let sequence_end_at = at + 4 * (oids + 1) + 4 * oids;
    let header_end = be32(&index, &mut { header_end_at }).ok_or_else(|| bad("shorter than its own sequence count says"))?;
    let sequence_end = be32(&index, &mut { sequence_end_at }).ok_or_else(|| bad("shorter than its own sequence count says"))?;
    for (ext, expected) in [("hr", header_end), ("sq", sequence_end)] {
        let p = file(ext);
        let actual = std::fs::metadata(&p)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    DbError::Missing { path: p.clone() }
                } else {
                    DbError::Io { path: p.clone(), source: e }
                }
            })?
            .len();
        // Nucleotide sequence files end with the last sequence's ambiguity data.
        let short = if dbtype == MolType::Nucl && ext == "sq" { actual < expected as u64 } else { actual != expected as u64 };
        if short {
            return Err(DbError::Size { path: p, expected: expected as u64, actual });
        }
    }
    Ok(())
}

/// Opens the existing database `given`, cut into `fragments` virtual fragments, with its
/// side directory under `work_dir` (made, or reused when the database is unchanged).
pub fn open(given: &Path, work_dir: &Path, fragments: usize) -> Result<Database, DbError> {
    let name = given.to_str().ok_or_else(|| DbError::NotUtf8(given.to_path_buf()))?.to_string();
    if fragments == 0 {
        return Err(DbError::ZeroFragments);
    }
    if name == "stats" || name == "stats-seq" || (name.starts_with("frag") && name.ends_with(".stats")) {
        return Err(DbError::External {
            given: name.clone(),
            reason: "the name is one gepsea uses for its own alias files; name the database by a path instead (e.g. ./NAME)".into(),
        });
    }
    if name.split_whitespace().count() > 1 {
        // BLAST+ takes `-db "nr swissprot"` as both databases together; gepsea cuts one
        // into fragments. Said before `locate`, which would call the pair missing
        // (`-info` reads them fine, and names their type for the advice).
        let dbtype = info(&name).map(|(t, _)| t.as_str()).unwrap_or("prot");
        return Err(DbError::External {
            given: name.clone(),
            reason: format!(
                "names several databases, and gepsea searches one: join them with `blastdb_aliastool -dblist \"{name}\" -dbtype {dbtype} -out all -title all` and give --db all"
            ),
        });
    }
    let (dbtype, info) = info(&name)?;
    for v in &info.volumes {
        // `-info` lists an alias restricted by OIDs as its alias file: nothing to check.
        if !v.extension().is_some_and(|e| e == "pal" || e == "nal") {
            check_volume(v, dbtype)?;
        }
    }
    let path = locate(&name, dbtype).ok_or_else(|| DbError::External {
        given: name.clone(),
        reason: "BLAST+ reads it, but its alias or index file was not found in the working directory or BLASTDB; give its path".into(),
    })?;
    let cwd = std::env::current_dir().map_err(io(Path::new(".")))?;
    if fragments as u64 > info.sequences {
        return Err(DbError::TooManyFragments { sequences: info.sequences, fragments });
    }
    let key = {
        let text = format!("{name}\n{}\n{}\n{fragments}\n{}", cwd.display(), path.display(), info.text);
        text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
    };
    let dir = work_dir.join(format!("db-{key:016x}"));
    let manifest = match super::open(&dir) {
        Ok(m) if m.external.as_ref().is_some_and(|e| e.info == info.text && e.given == name) => m,
        _ => build_side_dir(&name, &path, &cwd, dbtype, &info, fragments, work_dir, &dir)?,
    };
    let dir = std::fs::canonicalize(&dir).map_err(io(&dir))?;
    let blastdb = tools::search_path(&[&dir, &cwd]);
    Ok(Database { manifest, dir, blastdb })
}

#[allow(clippy::too_many_arguments)]
fn build_side_dir(
    name: &str,
    path: &Path,
    cwd: &Path,
    dbtype: MolType,
    info: &Info,
    k: usize,
    work_dir: &Path,
    dir: &Path,
) -> Result<Manifest, DbError> {
    std::fs::create_dir_all(work_dir).map_err(io(work_dir))?;
    let tmp = work_dir.join(format!(".{}.tmp{}", dir.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let built = (|| {
        let lengths = sequence_lengths(name, dbtype, info, k)?;
        let blast_version = tools::version()?;
        let l = alias_letter(dbtype);
        let target = path.to_str().ok_or_else(|| DbError::NotUtf8(path.to_path_buf()))?;
        let width = (k.max(2) - 1).to_string().len().max(2);
        let mut fragments = Vec::new();
        for (i, (first, count, residues)) in lengths.into_iter().enumerate() {
            let fname = format!("frag{i:0width$}");
            let alias = tmp.join(format!("{fname}.stats.{l}al"));
            let text = stats_alias(&info.title, target, Some((first + 1, first + count)), info.sequences, info.residues);
            std::fs::write(&alias, text).map_err(io(&alias))?;
            fragments.push(Fragment {
                name: fname,
                sequences: count,
                residues,
                first_oid: first,
                files: Default::default(),
                sizes: Default::default(),
            });
        }
        write_stats_db(&tmp, dbtype, &info.title, info.sequences, info.residues)?;
        let m = Manifest {
            format_version: MANIFEST_VERSION,
            name: name.to_string(),
            dbtype,
            title: info.title.clone(),
            blast_version,
            sequences: info.sequences,
            residues: info.residues,
            fragments,
            external: Some(External { given: name.to_string(), cwd: cwd.to_path_buf(), info: info.text.clone() }),
        };
        let mp = tmp.join("manifest.json");
        std::fs::write(&mp, serde_json::to_string_pretty(&m).expect("a manifest serialises")).map_err(io(&mp))?;
        Ok(m)
    })();
    match built {
        Ok(m) => {
            let _ = std::fs::remove_dir_all(dir);
            std::fs::rename(&tmp, dir).map_err(io(dir))?;
            Ok(m)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// (first OID, sequences, residues) of each of `k` fragments balanced by residues,
/// from the lengths `blastdbcmd` streams in OID order.
fn sequence_lengths(name: &str, dbtype: MolType, info: &Info, k: usize) -> Result<Vec<(u64, u64, u64)>, DbError> {
    let mut child = crate::tools::with_parent_death(&mut Command::new("blastdbcmd"))
        .args(["-db", name, "-dbtype", dbtype.as_str(), "-entry", "all", "-outfmt", "%l"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                DbError::Tool(ToolError::Missing { program: "blastdbcmd".into() })
            } else {
                DbError::Tool(ToolError::Io { program: "blastdbcmd".into(), source: e })
            }
        })?;
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let err_reader = std::thread::spawn(move || {
        // Lossy: it may echo titles that are not UTF-8, and a strict read lost it all.
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    });
    let mut split = OnlineSplit::new(info.residues, info.sequences, k);
    // Residues of each fragment so far; a cut puts the current sequence in a new one.
    let mut residues = vec![0u64];
    let mut seen = 0u64;
    for line in BufReader::with_capacity(1 << 20, stdout).lines() {
        let line = line.map_err(|e| DbError::Io { path: PathBuf::from(name), source: e })?;
        let len: u64 = line
            .trim()
            .parse()
            .map_err(|_| DbError::External { given: name.into(), reason: format!("blastdbcmd printed {line:?} for a sequence length") })?;
        let before = split.starts.len();
        split.push(len);
        if split.starts.len() > before {
            residues.push(0);
        }
        *residues.last_mut().expect("one fragment at least") += len;
        seen += 1;
    }
    let status = child.wait().map_err(|e| DbError::Tool(ToolError::Io { program: "blastdbcmd".into(), source: e }))?;
    let stderr = err_reader.join().unwrap_or_default();
    if !status.success() {
        return Err(DbError::Unreadable { given: name.into(), blast: tools::error_lines(&stderr) });
    }
    if seen != info.sequences {
        return Err(DbError::External {
            given: name.into(),
            reason: format!(
                "blastdbcmd listed {seen} sequences, but the database says it has {}; it is damaged or an alias does not match its volumes",
                info.sequences
            ),
        });
    }
    let starts = split.starts;
    Ok(starts
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let end = starts.get(i + 1).copied().unwrap_or(seen);
            (s, end - s, residues[i])
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_is_parsed() {
        let text = "Database: Ex DB\n\t20,000 sequences; 9,055,569 total residues\n\nDate: Nov 24, 2026  10:43 AM\tLongest sequence: 8,081 residues\n\nBLASTDB Version: 5\n\nVolumes:\n\t/tmp/x/exdb.00\n\t/tmp/x/exdb.01\n";
        let i = parse_info(text).unwrap();
        assert_eq!((i.title.as_str(), i.sequences, i.residues), ("Ex DB", 20_000, 9_055_569));
        assert_eq!(i.volumes, vec![PathBuf::from("/tmp/x/exdb.00"), PathBuf::from("/tmp/x/exdb.01")]);
        let n = parse_info("Database: 16S\n\t1,000 sequences; 1,500,000 total bases\n").unwrap();
        assert_eq!((n.sequences, n.residues), (1000, 1_500_000));
        assert!(parse_info("Error: nothing").is_none());
    }
}
