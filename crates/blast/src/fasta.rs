//! FASTA reading with the checks a user needs before hours of BLAST: the file and line
//! of every problem, duplicate identifiers, empty input, and the molecule type.
//!
//! Records keep their defline and sequence lines byte for byte (BLAST prints deflines
//! verbatim, trailing blanks included), so a fragment file is the exact slice of the
//! input it came from.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

/// One sequence: its defline (without the newline) and its raw sequence lines.
#[derive(Clone, Debug)]
pub struct Record {
    pub defline: String,
    pub lines: Vec<String>,
    /// Letters in the sequence (no whitespace).
    pub residues: usize,
    /// Line number of the defline in the input (1-based).
    pub line: usize,
}

impl Record {
    /// The identifier: the defline's first word without the `>`.
    pub fn id(&self) -> &str {
        self.defline[1..].split_whitespace().next().unwrap_or("")
    }

    /// Appends the record as FASTA text.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.defline.as_bytes());
        out.push(b'\n');
        for l in &self.lines {
            out.extend_from_slice(l.as_bytes());
            out.push(b'\n');
        }
    }

    fn letters(&self) -> impl Iterator<Item = u8> + '_ {
        self.lines.iter().flat_map(|l| l.bytes()).filter(|b| !b.is_ascii_whitespace())
    }
}

/// Protein or nucleotide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MolType {
    Prot,
    Nucl,
}

impl MolType {
    /// The `-dbtype` word of makeblastdb.
    pub fn as_str(self) -> &'static str {
        match self {
            MolType::Prot => "prot",
            MolType::Nucl => "nucl",
        }
    }
}

impl std::str::FromStr for MolType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "prot" | "protein" => Ok(MolType::Prot),
            "nucl" | "nucleotide" => Ok(MolType::Nucl),
            _ => Err(format!("unknown molecule type {s:?} (expected prot or nucl)")),
        }
    }
}

/// What is wrong with a FASTA file.
#[derive(Debug, thiserror::Error)]
pub enum FastaError {
    #[error("{path}: cannot read: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}: sequence data before the first '>' header line")]
    DataBeforeHeader { path: PathBuf, line: usize },
    #[error("{path}:{line}: header line has no identifier after '>'")]
    EmptyId { path: PathBuf, line: usize },
    #[error("{path}:{line}: sequence {id:?} has no residues")]
    EmptySequence { path: PathBuf, line: usize, id: String },
    #[error("{path}:{line}: invalid character {ch:?} in sequence {id:?}")]
    BadChar { path: PathBuf, line: usize, id: String, ch: char },
    #[error("{path}:{line}: duplicate sequence identifier {id:?} (first seen on line {first})")]
    Duplicate { path: PathBuf, line: usize, id: String, first: usize },
    #[error("{path}: no sequences (the file is empty or has no '>' header lines)")]
    Empty { path: PathBuf },
}

/// Opens `path`, transparently decompressing `.gz`.
pub fn open(path: &Path) -> Result<Box<dyn BufRead>, FastaError> {
    let f = std::fs::File::open(path).map_err(|e| FastaError::Io { path: path.to_path_buf(), source: e })?;
    let mut r = BufReader::new(f);
    let gz = {
        let buf = r.fill_buf().map_err(|e| FastaError::Io { path: path.to_path_buf(), source: e })?;
        buf.starts_with(&[0x1f, 0x8b])
    };
    Ok(if gz { Box::new(BufReader::new(flate2::read::MultiGzDecoder::new(r))) } else { Box::new(r) })
}

/// Reads and validates every record of `path`.
pub fn read(path: &Path) -> Result<Vec<Record>, FastaError> {
    read_from(open(path)?, path)
}

/// Reads and validates records from `input`, naming `path` in errors.
pub fn read_from(input: impl Read, path: &Path) -> Result<Vec<Record>, FastaError> {
    let p = || path.to_path_buf();
    let mut recs: Vec<Record> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let r = BufReader::new(input);
    for (i, line) in r.lines().enumerate() {
        let n = i + 1;
        let mut line = line.map_err(|e| FastaError::Io { path: p(), source: e })?;
        if line.ends_with('\r') {
            line.pop();
        }
        if line.starts_with('>') {
            finish(recs.last(), path)?;
            let rec = Record { defline: line, lines: Vec::new(), residues: 0, line: n };
            let id = rec.id().to_string();
            if id.is_empty() {
                return Err(FastaError::EmptyId { path: p(), line: n });
            }
            if let Some(&first) = seen.get(&id) {
                return Err(FastaError::Duplicate { path: p(), line: n, id, first });
            }
            seen.insert(id, n);
            recs.push(rec);
        } else if line.trim().is_empty() {
            continue;
        } else {
            let Some(rec) = recs.last_mut() else {
                return Err(FastaError::DataBeforeHeader { path: p(), line: n });
            };
            if let Some(ch) = line.chars().find(|c| !(c.is_ascii_alphabetic() || *c == '*' || *c == '-' || c.is_ascii_whitespace())) {
                return Err(FastaError::BadChar { path: p(), line: n, id: rec.id().to_string(), ch });
            }
            rec.residues += line.bytes().filter(|b| !b.is_ascii_whitespace()).count();
            rec.lines.push(line);
        }
    }
    finish(recs.last(), path)?;
    if recs.is_empty() {
        return Err(FastaError::Empty { path: p() });
    }
    Ok(recs)
}

fn finish(rec: Option<&Record>, path: &Path) -> Result<(), FastaError> {
    match rec {
        Some(r) if r.residues == 0 => Err(FastaError::EmptySequence { path: path.to_path_buf(), line: r.line, id: r.id().to_string() }),
        _ => Ok(()),
    }
}

/// Guesses the molecule type: nucleotide if at least 90 % of the letters are
/// A, C, G, T, U or N (the rule BLAST's own tools use in spirit).
pub fn guess_moltype(recs: &[Record]) -> MolType {
    let (mut nuc, mut all) = (0usize, 0usize);
    for r in recs.iter().take(200) {
        for b in r.letters() {
            all += 1;
            if matches!(b.to_ascii_uppercase(), b'A' | b'C' | b'G' | b'T' | b'U' | b'N') {
                nuc += 1;
            }
        }
    }
    if all > 0 && nuc * 10 >= all * 9 {
        MolType::Nucl
    } else {
        MolType::Prot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Vec<Record>, FastaError> {
        read_from(s.as_bytes(), Path::new("x.fa"))
    }

    #[test]
    fn keeps_deflines_verbatim_and_counts_residues() {
        let r = parse(">a desc with trailing blank \nACD\nEF\n\n>b\nGG\n").unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].defline, ">a desc with trailing blank ");
        assert_eq!((r[0].id(), r[0].residues, r[1].residues), ("a", 5, 2));
        let mut out = Vec::new();
        r[0].write_to(&mut out);
        assert_eq!(out, b">a desc with trailing blank \nACD\nEF\n");
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse(">a\nAC\n>b\nA1C\n").unwrap_err().to_string();
        assert_eq!(e, "x.fa:4: invalid character '1' in sequence \"b\"");
        let e = parse("ACGT\n>a\nAC\n").unwrap_err().to_string();
        assert_eq!(e, "x.fa:1: sequence data before the first '>' header line");
        let e = parse(">a\nAC\n>a x\nAC\n").unwrap_err().to_string();
        assert_eq!(e, "x.fa:3: duplicate sequence identifier \"a\" (first seen on line 1)");
        let e = parse(">a\n>b\nAC\n").unwrap_err().to_string();
        assert_eq!(e, "x.fa:1: sequence \"a\" has no residues");
        assert!(matches!(parse("\n\n"), Err(FastaError::Empty { .. })));
    }

    #[test]
    fn guesses_molecule_type() {
        assert_eq!(guess_moltype(&parse(">a\nACGTTGCAN\n").unwrap()), MolType::Nucl);
        assert_eq!(guess_moltype(&parse(">a\nMKVLAAGIW\n").unwrap()), MolType::Prot);
    }
}
