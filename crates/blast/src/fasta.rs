//! FASTA reading with the checks a user needs before hours of BLAST: the file and line
//! of every problem, empty input, and the molecule type.
//!
//! Records keep their defline and sequence lines byte for byte (BLAST prints deflines
//! verbatim, trailing blanks included), so a fragment file is the exact slice of the
//! input it came from. A defline is bytes, not text: BLAST+ reads deflines in any
//! encoding (Latin-1 ones too) and prints them as they are; sequence lines are ASCII
//! letters, or the file is refused.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

/// One sequence: its defline (without the newline) and its raw sequence lines.
#[derive(Clone, Debug)]
pub struct Record {
    /// The `>` line's bytes, whatever their encoding.
    pub defline: Vec<u8>,
    pub lines: Vec<String>,
    /// Letters in the sequence (no whitespace).
    pub residues: usize,
    /// Line number of the defline in the input (1-based).
    pub line: usize,
}

impl Record {
    /// The identifier: the defline's first word without the `>`.
    pub fn id(&self) -> &[u8] {
        first_word(&self.defline[1..])
    }

    /// The title BLAST+ prints for the query: the defline without the `>`.
    pub fn title(&self) -> &[u8] {
        &self.defline[1..]
    }

    /// Appends the record as FASTA text.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.defline);
        out.push(b'\n');
        for l in &self.lines {
            out.extend_from_slice(l.as_bytes());
            out.push(b'\n');
        }
    }

    /// The sequence's letters: its lines without what a query's lines may hold besides
    /// ([`not_residue`]).
    pub(crate) fn letters(&self) -> impl Iterator<Item = u8> + '_ {
        self.lines.iter().flat_map(|l| l.bytes()).filter(|&b| !not_residue(b, Reading::Queries))
    }
}

/// The first word of `text` (words are cut at ASCII white space, as BLAST+ cuts a
/// defline's identifier), or nothing.
pub fn first_word(text: &[u8]) -> &[u8] {
    text.split(u8::is_ascii_whitespace).find(|w| !w.is_empty()).unwrap_or_default()
}

/// `records` as one FASTA text, each as [`Record::write_to`] writes it: the query
/// batches and whole-database re-searches the BLAST+ runs read.
pub fn text_of<'a>(records: impl IntoIterator<Item = &'a Record>) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        r.write_to(&mut out);
    }
    out
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
    #[error("{path}: FASTQ (its first line starts with '@'), where FASTA is needed: convert it first, e.g. `seqtk seq -A {path}`")]
    Fastq { path: PathBuf },
    #[error("{path}:{line}: header line has no identifier after '>'")]
    EmptyId { path: PathBuf, line: usize },
    #[error("{path}:{line}: sequence {id:?} has no residues")]
    EmptySequence { path: PathBuf, line: usize, id: String },
    #[error("{path}: every sequence is empty, so BLAST+ has nothing to search (it fails with \"Sequence contains no data\")")]
    NoResidues { path: PathBuf },
    #[error("{path}:{line}: invalid character {ch:?} in sequence {id:?}")]
    BadChar { path: PathBuf, line: usize, id: String, ch: char },
    #[error("{path}:{line}: invalid byte 0x{byte:02X} in sequence {id:?} (sequence lines are ASCII letters)")]
    BadByte { path: PathBuf, line: usize, id: String, byte: u8 },
    #[error("{path}:{line}: duplicate sequence identifier {id:?} (first seen on line {first})")]
    Duplicate { path: PathBuf, line: usize, id: String, first: usize },
    #[error("{path}:{line}: sequence {id:?} has the accession {key:?} of {first_id:?} (line {first}): makeblastdb -parse_seqids takes them for one sequence and refuses both")]
    SameAccession { path: PathBuf, line: usize, id: String, key: String, first_id: String, first: usize },
    #[error("{path}:{line}: identifier {id:?} is not ASCII, which makeblastdb -parse_seqids refuses (\"Malformatted ID\"); give the sequence an ASCII identifier (the rest of its '>' line may keep any text)")]
    IdNotAscii { path: PathBuf, line: usize, id: String },
    #[error("{path}: no sequences (the file is empty or has no '>' header lines)")]
    Empty { path: PathBuf },
}

/// How an input file is compressed (recognised by its first bytes, not its name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
    Bzip2,
}

impl Compression {
    fn sniff(head: &[u8]) -> Self {
        if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(&zstd::zstd_safe::MAGICNUMBER.to_le_bytes()) {
            Compression::Zstd
        } else if head.starts_with(b"BZh") {
            Compression::Bzip2
        } else {
            Compression::None
        }
    }
}

/// Opens `path`, transparently decompressing gzip, zstd and bzip2, with a read buffer
/// of `capacity` bytes.
pub fn open_with(path: &Path, capacity: usize) -> Result<(Box<dyn BufRead + Send>, Compression), FastaError> {
    let f = std::fs::File::open(path).map_err(|e| FastaError::Io { path: path.to_path_buf(), source: e })?;
    decoding(f, capacity, path)
}

/// `input`, decompressed by what its first bytes say; `name` for errors.
fn decoding(input: impl Read + Send + 'static, capacity: usize, name: &Path) -> Result<(Box<dyn BufRead + Send>, Compression), FastaError> {
    let io = |e| FastaError::Io { path: name.to_path_buf(), source: e };
    let mut r = BufReader::with_capacity(capacity, input);
    let kind = Compression::sniff(r.fill_buf().map_err(io)?);
    let reader: Box<dyn BufRead + Send> = match kind {
        Compression::None => Box::new(r),
        Compression::Gzip => Box::new(BufReader::with_capacity(capacity, flate2::read::MultiGzDecoder::new(r))),
        Compression::Zstd => Box::new(BufReader::with_capacity(capacity, zstd::stream::read::Decoder::with_buffer(r).map_err(io)?)),
        Compression::Bzip2 => Box::new(BufReader::with_capacity(capacity, bzip2::bufread::MultiBzDecoder::new(r))),
    };
    Ok((reader, kind))
}

/// The path that stands for standard input where a command reads its input once
/// (`gepsea search --query -`, as BLAST+'s `-query -`).
pub const STDIN: &str = "-";

/// [`read`], or standard input when `path` is [`STDIN`] (named "standard input" in
/// errors; plain or compressed alike).
pub fn read_or_stdin(path: &Path) -> Result<Vec<Record>, FastaError> {
    if path.as_os_str() != STDIN {
        return read(path);
    }
    let name = Path::new("standard input");
    read_from(decoding(std::io::stdin(), 64 << 10, name)?.0, name)
}

/// Opens `path`, transparently decompressing gzip, zstd and bzip2.
pub fn open(path: &Path) -> Result<Box<dyn BufRead + Send>, FastaError> {
    Ok(open_with(path, 64 << 10)?.0)
}

/// Reads and validates every record of `path`.
pub fn read(path: &Path) -> Result<Vec<Record>, FastaError> {
    read_from(open(path)?, path)
}

/// One line of a FASTA stream, as [`scan`] hands it over.
pub enum Line<'a> {
    /// A `>` line: the defline (without line end; bytes in any encoding, see the module
    /// docs) and its identifier, its 1-based line number, and the byte offset where the
    /// line starts in the (decompressed) stream.
    Header { defline: &'a [u8], id: &'a [u8], line: usize, offset: u64 },
    /// A sequence line (without line end) and its letters.
    Sequence { text: &'a str, residues: usize },
}

/// Totals of a scanned stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub sequences: u64,
    pub residues: u64,
    /// Bytes of the (decompressed) stream.
    pub bytes: u64,
}

/// What [`scan`] reads: a database's sequences or queries, which BLAST+ reads more
/// leniently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    /// Every sequence has residues, and nothing but letters, `*` and `-`.
    Database,
    /// Records without residues are kept (BLAST+ reports such a query with no hits, and
    /// a warning), and so are digits in sequence lines (BLAST+ ignores them: "FASTA-
    /// Reader: Ignoring invalid residues"), which are not residues.
    Queries,
}

/// Whether `b`, in a sequence line of what is being read, is no residue but something
/// BLAST+ passes over: white space, and in a query digits (see [`Reading`]).
fn not_residue(b: u8, reading: Reading) -> bool {
    b.is_ascii_whitespace() || (reading == Reading::Queries && b.is_ascii_digit())
}

/// Validates FASTA line by line without holding it — data before the first header, an
/// empty identifier, a sequence without residues, a character that is no residue (see
/// [`Reading`] for what queries may have) — and hands every header and sequence line
/// to `visit`. Blank lines are skipped; a trailing `\r` is not part of a line. Memory
/// is one line, whatever the input size.
pub fn scan(
    mut input: impl BufRead,
    path: &Path,
    reading: Reading,
    mut visit: impl FnMut(Line<'_>) -> Result<(), FastaError>,
) -> Result<Totals, FastaError> {
    let p = || path.to_path_buf();
    let mut buf = Vec::new();
    let mut totals = Totals::default();
    // The current record: its id, defline line number, and residues so far.
    let mut current: Option<(String, usize, usize)> = None;
    let mut n = 0usize;
    let finish = |rec: &Option<(String, usize, usize)>| match rec {
        Some((id, line, 0)) if reading == Reading::Database => Err(FastaError::EmptySequence { path: p(), line: *line, id: id.clone() }),
        _ => Ok(()),
    };
    loop {
        buf.clear();
        let got = input.read_until(b'\n', &mut buf).map_err(|e| FastaError::Io { path: p(), source: e })?;
        if got == 0 {
            break;
        }
        let offset = totals.bytes;
        totals.bytes += got as u64;
        n += 1;
        let mut bytes = buf.as_slice();
        if let Some(b) = bytes.strip_suffix(b"\n") {
            bytes = b;
        }
        if let Some(b) = bytes.strip_suffix(b"\r") {
            bytes = b;
        }
        if let Some(rest) = bytes.strip_prefix(b">") {
            finish(&current)?;
            let id = first_word(rest);
            if id.is_empty() {
                return Err(FastaError::EmptyId { path: p(), line: n });
            }
            if reading == Reading::Database && !id.is_ascii() {
                return Err(FastaError::IdNotAscii { path: p(), line: n, id: crate::text::shown(id) });
            }
            totals.sequences += 1;
            visit(Line::Header { defline: bytes, id, line: n, offset })?;
            current = Some((crate::text::shown(id), n, 0));
        } else if bytes.iter().all(u8::is_ascii_whitespace) {
            continue;
        } else {
            let Some(rec) = current.as_mut() else {
                if n == 1 && bytes.starts_with(b"@") {
                    return Err(FastaError::Fastq { path: p() });
                }
                return Err(FastaError::DataBeforeHeader { path: p(), line: n });
            };
            let allowed = |b: u8| b.is_ascii_alphabetic() || b == b'*' || b == b'-' || not_residue(b, reading);
            if let Some(at) = bytes.iter().position(|&b| !allowed(b)) {
                let (path, line, id) = (p(), n, rec.0.clone());
                // A character outside ASCII is named when it is UTF-8, else its byte.
                return Err(match bytes[at..].utf8_chunks().next().and_then(|c| c.valid().chars().next()) {
                    Some(ch) => FastaError::BadChar { path, line, id, ch },
                    None => FastaError::BadByte { path, line, id, byte: bytes[at] },
                });
            }
            // Every byte is an ASCII letter, `*`, `-` or one BLAST+ passes over.
            let line = std::str::from_utf8(bytes).expect("ASCII");
            let residues = bytes.iter().filter(|&&b| !not_residue(b, reading)).count();
            rec.2 += residues;
            totals.residues += residues as u64;
            visit(Line::Sequence { text: line, residues })?;
        }
    }
    finish(&current)?;
    if totals.sequences == 0 {
        return Err(FastaError::Empty { path: p() });
    }
    Ok(totals)
}

/// Reads and validates query records from `input`, naming `path` in errors. Duplicate
/// identifiers are kept, as BLAST+ keeps them in a query file (queries are known by their
/// position); a database with them is refused by `db format`, as makeblastdb
/// `-parse_seqids` would. So are records without residues, which BLAST+ reports with no
/// hits, unless every record is one (BLAST+ then fails).
pub fn read_from(input: impl Read, path: &Path) -> Result<Vec<Record>, FastaError> {
    let mut recs: Vec<Record> = Vec::new();
    scan(BufReader::new(input), path, Reading::Queries, |l| {
        match l {
            Line::Header { defline, line, .. } => {
                recs.push(Record { defline: defline.to_vec(), lines: Vec::new(), residues: 0, line });
            }
            Line::Sequence { text, residues } => {
                let rec = recs.last_mut().expect("scan sees a header first");
                rec.residues += residues;
                rec.lines.push(text.to_string());
            }
        }
        Ok(())
    })?;
    if recs.iter().all(|r| r.residues == 0) {
        return Err(FastaError::NoResidues { path: path.to_path_buf() });
    }
    Ok(recs)
}

/// Guesses the molecule type from letters: nucleotide if at least 90 % are A, C, G, T,
/// U or N (the rule BLAST's own tools use in spirit). Feed it letters with
/// [`MolGuess::add`] and ask [`MolGuess::guess`].
#[derive(Default)]
pub struct MolGuess {
    nuc: usize,
    all: usize,
}

impl MolGuess {
    pub fn add(&mut self, letters: impl Iterator<Item = u8>) {
        for b in letters.filter(|b| !b.is_ascii_whitespace()) {
            self.all += 1;
            if matches!(b.to_ascii_uppercase(), b'A' | b'C' | b'G' | b'T' | b'U' | b'N') {
                self.nuc += 1;
            }
        }
    }

    pub fn guess(&self) -> MolType {
        if self.all > 0 && self.nuc * 10 >= self.all * 9 {
            MolType::Nucl
        } else {
            MolType::Prot
        }
    }
}

/// Guesses the molecule type of `recs` from their first 200 sequences ([`MolGuess`]).
pub fn guess_moltype(recs: &[Record]) -> MolType {
    let mut g = MolGuess::default();
    for r in recs.iter().take(200) {
        g.add(r.letters());
    }
    g.guess()
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
        assert_eq!(r[0].defline, b">a desc with trailing blank ");
        assert_eq!((r[0].id(), r[0].residues, r[1].residues), (&b"a"[..], 5, 2));
        let mut out = Vec::new();
        r[0].write_to(&mut out);
        assert_eq!(out, b">a desc with trailing blank \nACD\nEF\n");
        assert_eq!(text_of(&r), b">a desc with trailing blank \nACD\nEF\n>b\nGG\n", "records one after the other");
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse(">a\nAC\n>b\nA.C\n").unwrap_err().to_string();
        assert_eq!(e, "x.fa:4: invalid character '.' in sequence \"b\"");
        let e = parse("ACGT\n>a\nAC\n").unwrap_err().to_string();
        assert_eq!(e, "x.fa:1: sequence data before the first '>' header line");
        let e = parse("@r1\nACGT\n+\nIIII\n").unwrap_err().to_string();
        assert_eq!(e, "x.fa: FASTQ (its first line starts with '@'), where FASTA is needed: convert it first, e.g. `seqtk seq -A x.fa`");
        // Duplicate query identifiers are BLAST+'s business: it accepts them.
        assert_eq!(parse(">a\nAC\n>a x\nAC\n").unwrap().len(), 2);
        // An empty query is BLAST+'s too (reported with no hits), unless all are; a
        // database sequence must have residues.
        let r = parse(">a\n>b\nAC\n>c\n").unwrap();
        assert_eq!(
            r.iter().map(|r| (r.id(), r.residues, r.line)).collect::<Vec<_>>(),
            [(&b"a"[..], 0, 1), (&b"b"[..], 2, 2), (&b"c"[..], 0, 4)]
        );
        let e = parse(">a\n\n>b\n").unwrap_err().to_string();
        assert_eq!(e, "x.fa: every sequence is empty, so BLAST+ has nothing to search (it fails with \"Sequence contains no data\")");
        let e = scan(">a\n>b\nAC\n".as_bytes(), Path::new("db.fa"), Reading::Database, |_| Ok(())).unwrap_err().to_string();
        assert_eq!(e, "db.fa:1: sequence \"a\" has no residues");
        // Digits in a query's sequence lines are BLAST+'s to ignore, not residues; a
        // database sequence may not have them.
        let r = parse(">a\n1 MKVL\n61 AC\n").unwrap();
        assert_eq!((r[0].residues, guess_moltype(&r)), (6, MolType::Prot));
        assert_eq!(guess_moltype(&parse(">n\n1 acgtacgtac\n11 acgt\n").unwrap()), MolType::Nucl);
        let e = scan(">a\n1 MKVL\n".as_bytes(), Path::new("db.fa"), Reading::Database, |_| Ok(())).unwrap_err().to_string();
        assert_eq!(e, "db.fa:2: invalid character '1' in sequence \"a\"");
        assert!(matches!(parse("\n\n"), Err(FastaError::Empty { .. })));
    }

    /// BLAST+ reads deflines in any encoding and prints their bytes: a Latin-1 query
    /// file is read, its deflines kept byte for byte; sequence lines stay ASCII, and a
    /// database's identifiers too (makeblastdb -parse_seqids refuses others).
    #[test]
    fn deflines_are_bytes_in_any_encoding() {
        let latin1 = b">g\xe8ne1 M\xfcller\nMKV\n>b caf\xc3\xa9\nAC\n";
        let r = read_from(&latin1[..], Path::new("q.fa")).unwrap();
        assert_eq!((r[0].id(), r[0].title(), r[1].title()), (&b"g\xe8ne1"[..], &b"g\xe8ne1 M\xfcller"[..], &b"b caf\xc3\xa9"[..]));
        assert_eq!(text_of(&r), latin1);
        let bad = |text: &[u8], reading| scan(text, Path::new("x.fa"), reading, |_| Ok(())).unwrap_err().to_string();
        assert_eq!(
            bad(b">a\nMK\xe9V\n", Reading::Queries),
            "x.fa:2: invalid byte 0xE9 in sequence \"a\" (sequence lines are ASCII letters)"
        );
        assert_eq!(bad(b">a\nMK\xc3\xa9V\n", Reading::Queries), "x.fa:2: invalid character '\u{e9}' in sequence \"a\"");
        let e = bad(b">x\xe9y caf\xe9\nMKV\n", Reading::Database);
        assert!(e.starts_with("x.fa:1: identifier \"x\u{e9}y\" is not ASCII, which makeblastdb -parse_seqids refuses"), "{e}");
        let mut titles = Vec::new();
        scan(&b">x caf\xe9\nMKV\n"[..], Path::new("db.fa"), Reading::Database, |l| {
            if let Line::Header { defline, .. } = l {
                titles.push(defline.to_vec());
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(titles, [b">x caf\xe9".to_vec()], "a database's titles may be in any encoding");
    }

    #[test]
    fn guesses_molecule_type() {
        assert_eq!(guess_moltype(&parse(">a\nACGTTGCAN\n").unwrap()), MolType::Nucl);
        assert_eq!(guess_moltype(&parse(">a\nMKVLAAGIW\n").unwrap()), MolType::Prot);
    }
}
