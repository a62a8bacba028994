//! Report parts: joining per-batch reports into the one report serial BLAST+ writes
//! ([`Assembler`], a part at a time, so the whole report is never in memory) and
//! counting their hits ([`HitCounter`], a line at a time).
//!
//! A merged batch's part is kept in the work directory for resume (and as the
//! master's fallback) zstd-compressed ([`store`]): the work directory is usually on
//! the shared file system, so every byte of a part crosses the storage link when it
//! is written and again when it is read back, and BLAST+ reports are text that zstd
//! shrinks about fourfold at its fastest level. Readers go through [`open`], which
//! recognises the zstd frame by its first bytes: a report is text, and no UTF-8 text
//! starts with the zstd magic (its second byte is a continuation byte; a report with
//! Latin-1 query titles would need a first query named `(\xb5/\xfd`), so parts
//! written plain (by BLAST+ itself in a split by queries, or by an earlier version)
//! read the same way. Only the zstd magic is looked for: a tabular report's first
//! line is a query identifier, which may well start with `BZh` (bzip2's magic).

use std::io::{BufRead, Read, Write};
use std::path::Path;

use crate::report;

/// The zstd level parts are stored at. On the replay workload's 227.4 MB pairwise
/// report (`docs/benchmarks.md`): level 1 stores 53.5 MB in 0.79 s of one core here,
/// level 3 (zstd's default) 49.3 MB in 1.35 s. The no-agent master stores its parts
/// on its own critical path, so the cheaper level: 92 % of the saving for 60 % of the
/// CPU.
pub const STORE_LEVEL: i32 = 1;

const ZSTD_MAGIC: [u8; 4] = zstd::zstd_safe::MAGICNUMBER.to_le_bytes();

/// Opens a part for reading, decompressing it if it was [`store`]d.
pub fn open(path: &Path) -> std::io::Result<Box<dyn BufRead + Send>> {
    let mut r = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    if r.fill_buf()?.starts_with(&ZSTD_MAGIC) {
        Ok(Box::new(std::io::BufReader::with_capacity(1 << 20, zstd::stream::read::Decoder::with_buffer(r)?)))
    } else {
        Ok(Box::new(r))
    }
}

/// A part's whole text (see [`open`]).
pub fn read(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut v = Vec::new();
    open(path)?.read_to_end(&mut v)?;
    Ok(v)
}

/// Stores the report `src` as a part at `dst`, zstd-compressed; returns the bytes
/// stored. `dst` is the caller's temporary name, renamed into place once this returns;
/// on failure it is removed, so no half-written part is left behind.
pub fn store(src: &Path, dst: &Path) -> std::io::Result<u64> {
    let stored = (|| {
        let mut input = std::fs::File::open(src)?;
        let out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(dst)?);
        let mut enc = zstd::stream::write::Encoder::new(out, STORE_LEVEL)?;
        std::io::copy(&mut input, &mut enc)?;
        let mut out = enc.finish()?;
        out.flush()?;
        out.into_inner().map_err(|e| e.into_error())?.metadata().map(|m| m.len())
    })();
    if stored.is_err() {
        let _ = std::fs::remove_file(dst);
    }
    stored
}

/// Joins per-batch reports (each a complete report for its queries) into the one report
/// serial BLAST+ writes for all of them, a line at a time: only the line being copied is
/// in memory, whatever the size of a part or of the whole report.
///
/// Per part: pairwise and query-anchored output keeps the first part's header (up to
/// its first `Query= `) and the last part's footer (from `  Database: `), and renumbers
/// the query-anchored alignments' query labels (see `Relabel`); XML keeps the first
/// header and the last closing tags and renumbers iterations; outfmt 7 sums the
/// `# BLAST processed N queries` trailers into one; other formats are concatenated.
pub struct Assembler<W: std::io::Write> {
    out: W,
    fmt: u32,
    parts: usize,
    /// Queries written so far (pairwise and query-anchored: `Query= ` lines, XML:
    /// iterations, outfmt 7: the trailers' counts).
    count: usize,
    relabel: Relabel,
}

/// Where a line of a part stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    Header,
    Body,
    Footer,
}

impl<W: std::io::Write> Assembler<W> {
    /// Writes to `out` a report of base format `fmt`.
    pub fn new(out: W, fmt: u32) -> Self {
        Assembler { out, fmt, parts: 0, count: 0, relabel: Relabel::default() }
    }

    /// Writes what this assembler would write from here on had it already joined parts
    /// holding `count` queries (none when `first`): a batch's *piece* of the report,
    /// made by the agent that wrote its part (see [`piece`]).
    pub fn continuing(out: W, fmt: u32, first: bool, count: usize) -> Self {
        Assembler { out, fmt, parts: usize::from(!first), count, relabel: Relabel::default() }
    }

    /// Appends the next part; `last` for the final one (it brings the footer).
    pub fn part(&mut self, p: &str, last: bool) -> Result<(), String> {
        self.part_from(p.as_bytes(), last)
    }

    /// Appends the next part, read from `r` a line at a time; `last` for the final one.
    pub fn part_from(&mut self, mut r: impl std::io::BufRead, last: bool) -> Result<(), String> {
        let first = self.parts == 0;
        self.parts += 1;
        let offset = self.count;
        let mut section = Section::Header;
        let mut trailer = false;
        // Bytes: its lines are written as they were read (see `crate::text`).
        let mut footer = Vec::new();
        // XML: the local number of the iteration's query (its messages name it).
        let mut message_id: Option<usize> = None;
        let mut buf = Vec::new();
        loop {
            buf.clear();
            if r.read_until(b'\n', &mut buf).map_err(|e| format!("reading a part: {e}"))? == 0 {
                break;
            }
            // A query title need not be UTF-8 (BLAST+ prints its bytes): see `crate::text`.
            let read = crate::text::line(&buf);
            let line = read.as_str();
            // Which section this line opens or belongs to, and what to write for it.
            let text: Option<std::borrow::Cow<'_, str>> = match self.fmt {
                0..=4 => {
                    if line.starts_with("Query= ") {
                        // What looked like the footer was inside the body after all.
                        if section == Section::Footer {
                            self.out.write_all(&footer).map_err(|e| format!("writing the report: {e}"))?;
                            footer.clear();
                        }
                        section = Section::Body;
                        self.count += 1;
                    } else if section == Section::Body && line.starts_with("  Database: ") {
                        section = Section::Footer;
                    }
                    match section {
                        Section::Header => first.then_some(line.into()),
                        Section::Body if self.fmt == 0 => Some(line.into()),
                        Section::Body => Some(self.relabel.line(line, offset)?),
                        // The footer is the part from its last `  Database: ` line on:
                        // held until the end of the part or the next query says which.
                        Section::Footer => {
                            footer.extend_from_slice(&buf);
                            None
                        }
                    }
                }
                5 => match section {
                    Section::Header => {
                        if line == "<BlastOutput_iterations>\n" {
                            section = Section::Body;
                        }
                        first.then_some(line.into())
                    }
                    Section::Body if line == "</BlastOutput_iterations>\n" => {
                        section = Section::Footer;
                        last.then_some(line.into())
                    }
                    Section::Body => {
                        if let Some(v) = between(line, "  <Iteration_iter-num>", "</Iteration_iter-num>\n") {
                            let k: usize = v.parse().map_err(|_| format!("bad iteration number {v:?}"))?;
                            self.count += 1;
                            Some(format!("  <Iteration_iter-num>{}</Iteration_iter-num>\n", k + offset).into())
                        } else if let Some(v) = between(line, "  <Iteration_query-ID>Query_", "</Iteration_query-ID>\n") {
                            let k: usize = v.parse().map_err(|_| format!("bad query id {v:?}"))?;
                            message_id = Some(k);
                            Some(format!("  <Iteration_query-ID>Query_{}</Iteration_query-ID>\n", k + offset).into())
                        } else if let (Some(m), Some(k)) = (between(line, "  <Iteration_message>", "</Iteration_message>\n"), message_id) {
                            // A warning names the query by its local id ("Query_3 xs: Could
                            // not calculate ..."), at the start and after each "  ".
                            let (old, new) = (format!("Query_{k} "), format!("Query_{} ", k + offset));
                            let m = m.strip_prefix(&old).map(|rest| format!("{new}{rest}")).unwrap_or_else(|| m.to_string());
                            let m = m.replace(&format!(":  {old}"), &format!(":  {new}"));
                            Some(format!("  <Iteration_message>{m}</Iteration_message>\n").into())
                        } else {
                            Some(line.into())
                        }
                    }
                    Section::Footer => last.then_some(line.into()),
                },
                7 => match line.strip_prefix("# BLAST processed ") {
                    Some(rest) => {
                        let n: usize = rest.split_whitespace().next().and_then(|x| x.parse().ok()).ok_or("bad trailer")?;
                        self.count += n;
                        trailer = true;
                        last.then(|| format!("# BLAST processed {} queries\n", self.count).into())
                    }
                    None => Some(line.into()),
                },
                _ => Some(line.into()),
            };
            if let Some(t) = text {
                self.out.write_all(&read.bytes_of(&t)).map_err(|e| format!("writing the report: {e}"))?;
            }
        }
        if last {
            self.out.write_all(&footer).map_err(|e| format!("writing the report: {e}"))?;
        }
        match self.fmt {
            0..=4 if section == Section::Header => Err("pairwise part without a query".into()),
            0..=4 if section == Section::Body => Err("pairwise part without a footer".into()),
            5 if section == Section::Header => Err("XML part without iterations".into()),
            5 if section == Section::Body => Err("XML part without iterations end".into()),
            7 if !trailer => Err("tabular part without its trailer".into()),
            _ => Ok(()),
        }
    }

    /// The writer, flushed.
    pub fn finish(mut self) -> Result<W, String> {
        self.out.flush().map_err(|e| format!("writing the report: {e}"))?;
        Ok(self.out)
    }
}

/// Batch `index` of `total`'s *piece*: exactly the bytes the [`Assembler`] writes for its
/// part `r` after parts holding `before` queries, so that the pieces laid end to end are
/// the assembled report and each can be written at its final offset by whoever holds it
/// (the agents do, while the search goes on) once the pieces before it have a length.
/// `queries` is the batch's query count: query-anchored `Query= ` lines, XML iterations
/// and the tabular trailer must say as many, or the renumbering and the last trailer
/// would not be the assembled report's. Returns the piece's length.
#[allow(clippy::too_many_arguments)]
pub fn piece(
    r: impl std::io::BufRead,
    out: impl std::io::Write,
    fmt: u32,
    index: usize,
    total: usize,
    before: usize,
    queries: usize,
) -> Result<u64, String> {
    let mut a = Assembler::continuing(Counted { inner: out, bytes: 0 }, fmt, index == 0, before);
    a.part_from(r, index + 1 == total)?;
    let counted = a.count - before;
    if matches!(fmt, 1..=5 | 7) && counted != queries {
        let what = match fmt {
            5 => "XML iterations",
            7 => "queries in its trailer",
            _ => "`Query= ` lines",
        };
        return Err(format!("the part has {counted} {what} for {queries} queries"));
    }
    Ok(a.finish()?.bytes)
}

/// A writer that counts what goes through it.
struct Counted<W> {
    inner: W,
    bytes: u64,
}

impl<W: std::io::Write> std::io::Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Query-anchored reports (formats 1–4) label the query line of each alignment block
/// with the query's local id, `Query_<k>`, numbered within its BLAST+ run, and pad every
/// label of a block to one width, the longest label plus two. Renumbered for the whole
/// report, a longer label (`Query_9` → `Query_10`) can widen its block: then every line
/// of the block, subjects' and insertion marks' too, moves right by as much, as serial
/// BLAST+ lays it out.
#[derive(Default)]
struct Relabel {
    /// Whether the next line opens a block (the line before was blank).
    after_blank: bool,
    /// The current block's label width as the part has it, and how much it grows.
    width: usize,
    grown: usize,
}

impl Relabel {
    /// The line to write for `line` of a part whose queries follow `offset` others.
    fn line<'a>(&mut self, line: &'a str, offset: usize) -> Result<std::borrow::Cow<'a, str>, String> {
        if line.trim().is_empty() {
            (self.after_blank, self.grown) = (true, 0);
            return Ok(line.into());
        }
        if std::mem::take(&mut self.after_blank) {
            if let Some((k, width)) = query_label(line) {
                let k: usize = k.parse().map_err(|_| format!("bad query label in {:?}", line.trim_end()))?;
                let label = format!("Query_{}", k + offset);
                self.width = width;
                self.grown = (label.len() + 2).saturating_sub(width);
                return Ok(format!("{label:<w$}{}", &line[width..], w = width + self.grown).into());
            }
        }
        if self.grown == 0 || line.len() < self.width || !line.is_char_boundary(self.width) {
            return Ok(line.into());
        }
        Ok(format!("{}{:g$}{}", &line[..self.width], "", &line[self.width..], g = self.grown).into())
    }
}

/// A query-anchored block's query line (`report::query_line_label`): `k` of its
/// `Query_<k>`, and the label column's width.
fn query_label(line: &str) -> Option<(&str, usize)> {
    match report::query_line_label(line)? {
        (Some(k), width) => Some((k, width)),
        (None, _) => None,
    }
}

/// [`Assembler`] over parts in memory (small reports): their bytes, which are UTF-8 or
/// hold query titles in another encoding (see `crate::text`).
pub fn join(parts: &[impl AsRef<[u8]>], fmt: u32) -> Result<Vec<u8>, String> {
    let mut a = Assembler::new(Vec::new(), fmt);
    for (i, p) in parts.iter().enumerate() {
        a.part_from(p.as_ref(), i + 1 == parts.len())?;
    }
    a.finish()
}

/// [`join`] for parts that are UTF-8 text (tests).
pub fn assemble(parts: &[String], fmt: u32) -> Result<String, String> {
    Ok(String::from_utf8(join(parts, fmt)?).expect("UTF-8 parts join into UTF-8"))
}

/// Hits (query–subject pairs) in a report of base format `outfmt`: description lines of
/// pairwise output, `<Hit>` elements of XML, and for tabular output runs of lines with the
/// same query and subject columns (those of the format's field list; the first two
/// columns when it names none; HSP lines when it names no query or subject column).
pub fn count_hits(report: &str, outfmt: &str) -> usize {
    let mut c = HitCounter::new(outfmt);
    for line in report.lines() {
        c.line(line);
    }
    c.hits()
}

/// [`count_hits`] fed a line at a time, so that a report on disk is counted without
/// being read into memory.
pub struct HitCounter {
    base: u32,
    /// Tabular: the query and subject columns, or `None` to count HSP lines.
    columns: Option<(usize, usize)>,
    separator: char,
    in_list: bool,
    /// Whether the list being read has had a description yet.
    listed: bool,
    last: Option<(String, String)>,
    n: usize,
}

impl HitCounter {
    pub fn new(outfmt: &str) -> Self {
        let base = report::base_format(outfmt);
        let col = |names: &[&str]| report::tabular_column(outfmt, names);
        let columns = match (col(&["qseqid", "qacc", "qaccver", "qgi"]), col(&["sseqid", "sacc", "saccver", "sgi", "sallseqid"])) {
            (Some(q), Some(s)) => Some((q, s)),
            _ => None,
        };
        let separator = report::separator(outfmt, if base == 10 { ',' } else { '\t' });
        HitCounter { base, columns, separator, in_list: false, listed: false, last: None, n: 0 }
    }

    /// The next line of the report (without its line end).
    pub fn line(&mut self, line: &str) {
        match self.base {
            0..=4 => {
                // The list of descriptions: from its heading to the first blank line
                // after its first description (an alignment or the statistics follow).
                if line.starts_with("Sequences producing significant alignments") {
                    (self.in_list, self.listed) = (true, false);
                } else if self.in_list && line.trim().is_empty() {
                    self.in_list = !self.listed;
                } else if self.in_list {
                    (self.n, self.listed) = (self.n + 1, true);
                }
            }
            5 => self.n += usize::from(line.trim_start() == "<Hit>"),
            6 | 7 | 10 if !line.starts_with('#') && !line.is_empty() => match self.columns {
                None => self.n += 1,
                Some((q, s)) => {
                    let cols: Vec<&str> = line.split(self.separator).collect();
                    let key = (cols.get(q).copied().unwrap_or(""), cols.get(s).copied().unwrap_or(""));
                    if self.last.as_ref().map(|(a, b)| (a.as_str(), b.as_str())) != Some(key) {
                        self.n += 1;
                        self.last = Some((key.0.to_string(), key.1.to_string()));
                    }
                }
            },
            _ => {}
        }
    }

    pub fn hits(&self) -> usize {
        self.n
    }
}

/// Hits in the report at `path`, read in chunks that the agents' parsing engine
/// ([`gepsea_agent::core::parse`]) cuts into lines, so that a report on disk is
/// counted without being read into memory (the BLAST plug-in counts every part it
/// puts in place this way).
pub fn count_hits_in(path: &Path, outfmt: &str) -> std::io::Result<usize> {
    use gepsea_agent::core::parse::{Format, Parser};
    let mut c = HitCounter::new(outfmt);
    let mut parser = Parser::new(Format::Lines);
    let mut file = open(path)?;
    let mut chunk = vec![0u8; 1 << 20];
    let mut count = |records: Vec<gepsea_agent::core::parse::Parsed>| {
        for r in records {
            // Latin-1 where not UTF-8 (`crate::text`): distinct identifiers stay distinct.
            c.line(crate::text::line(&r.bytes).as_str().trim_end_matches(['\n', '\r']));
        }
    };
    loop {
        let n = file.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        count(parser.feed(&chunk[..n]).map_err(std::io::Error::other)?);
    }
    count(parser.finish().map_err(std::io::Error::other)?);
    Ok(c.hits())
}

fn between<'a>(line: &'a str, pre: &str, post: &str) -> Option<&'a str> {
    line.strip_prefix(pre)?.strip_suffix(post)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_are_query_subject_pairs_in_every_format() {
        let tab = "q1\ts1\t90\nq1\ts1\t80\nq1\ts2\t70\nq2\ts1\t60\n";
        assert_eq!(count_hits(tab, "6"), 3);
        assert_eq!(count_hits(&format!("# BLASTP\n# 4 hits found\n{tab}# BLAST processed 2 queries\n"), "7"), 3);
        assert_eq!(count_hits(&tab.replace('\t', ","), "10"), 3);
        // Named fields: the query and subject columns wherever they are; none named: lines.
        assert_eq!(count_hits("90\tq1\ts1\n80\tq1\ts1\n", "6 pident qseqid sseqid"), 1);
        assert_eq!(count_hits("q1\t1e-5\nq1\t1e-3\n", "6 qseqid evalue"), 2);
        // `std` names the query and subject columns; `delim=` changes the separator.
        assert_eq!(count_hits("q1\ts1\t90\nq1\ts1\t80\nq1\ts2\t70\n", "6 std"), 2);
        assert_eq!(count_hits("9;q1;s1\n8;q1;s1\n", "6 delim=; evalue std"), 1);
        let pairwise = "Query= q1\n\nSequences producing significant alignments:                          (Bits)  Value\n\ns1 a protein   50  1e-5\ns2 another   40  1e-3\n\n\n> s1 a protein\nLength=10\n\nQuery= q2\n\n***** No hits found *****\n";
        assert_eq!(count_hits(pairwise, "0"), 2);
        // Without alignments (`-num_alignments 0`) the query's statistics follow the list;
        // in the query-anchored formats its alignment blocks do.
        let listed_only = "Query= q1\n\nSequences producing significant alignments:                          (Bits)  Value\n\ns1 a protein   50  1e-5\n\n\n\nLambda      K        H\n   0.3    0.1    0.4\n\nEffective search space used: 9\n\n\nQuery= q2\n";
        assert_eq!(count_hits(listed_only, "0"), 1);
        let anchored = pairwise.replace("> s1 a protein\nLength=10\n", "Query_1  1   MKV  3\ns1       5   ...  7\n");
        for fmt in ["1", "2", "3", "4"] {
            assert_eq!(count_hits(&anchored, fmt), 2, "outfmt {fmt}");
        }
        assert_eq!(count_hits("<Iteration>\n  <Iteration_hits>\n  <Hit>\n  </Hit>\n  <Hit>\n  </Hit>\n", "5"), 2);
    }

    #[test]
    fn a_report_on_disk_is_counted_as_in_memory_across_read_chunks() {
        // Over 1 MiB, so the parsing engine gets lines cut between two reads.
        let mut report = String::from("# BLASTP\n");
        for q in 0..20_000 {
            report.push_str(&format!("query{q}\tsubject{}\t{}\r\nquery{q}\tsubject{}\t1\n", q % 7, "x".repeat(q % 50), q % 7));
        }
        report.push_str("query-last\tsubject0\t1");
        let dir = std::env::temp_dir().join(format!("gepsea-count-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("part.tsv");
        std::fs::write(&path, &report).unwrap();
        assert!(report.len() > 1 << 20);
        let on_disk = count_hits_in(&path, "7");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(on_disk.unwrap(), count_hits(&report, "7"));
        assert_eq!(count_hits(&report, "7"), 20_001);
    }

    #[test]
    fn stored_parts_read_back_exactly_and_plain_ones_read_as_they_are() {
        let d = crate::test_dir::TestDir::new("store");
        let dir = d.path();
        // A tabular report whose first query identifier starts with bzip2's magic:
        // only the zstd frame may be taken for compression.
        let mut report = String::from("BZh9_HUMAN\tsp|P1|X\t99.1\n");
        for q in 0..30_000 {
            report.push_str(&format!("query{q}\tsubject{}\t{}.5\n", q % 13, q % 100));
        }
        let plain = dir.join("plain.part");
        std::fs::write(&plain, &report).unwrap();
        assert_eq!(read(&plain).unwrap(), report.as_bytes());
        let stored = dir.join("stored.part");
        let n = store(&plain, &stored).unwrap();
        let bytes = std::fs::read(&stored).unwrap();
        assert_eq!(n, bytes.len() as u64);
        assert!(bytes.starts_with(&ZSTD_MAGIC));
        assert!(bytes.len() * 4 < report.len(), "{} of {} bytes", bytes.len(), report.len());
        assert_eq!(read(&stored).unwrap(), report.as_bytes());
        assert_eq!(count_hits_in(&stored, "6").unwrap(), count_hits_in(&plain, "6").unwrap());
        assert_eq!(count_hits_in(&stored, "6").unwrap(), count_hits(&report, "6"));
        // A stored part cut short is an error, not a shorter report.
        std::fs::write(&stored, &bytes[..bytes.len() - 7]).unwrap();
        assert!(read(&stored).is_err());
        assert!(count_hits_in(&stored, "6").is_err());
        // A store that fails leaves no half-written part behind.
        assert!(store(&dir.join("no such report"), &stored).is_err());
        assert!(!stored.exists());
        // An empty report stays empty.
        std::fs::write(&plain, "").unwrap();
        store(&plain, &stored).unwrap();
        assert_eq!(read(&stored).unwrap(), b"");
    }

    #[test]
    fn tabular_parts_join_with_one_trailer() {
        let a = "# BLASTP\n# 1 hits found\nq1\ts\n# BLAST processed 1 queries\n";
        let b = "# BLASTP\n# 0 hits found\n# BLAST processed 1 queries\n";
        assert_eq!(
            assemble(&[a.into(), b.into()], 7).unwrap(),
            "# BLASTP\n# 1 hits found\nq1\ts\n# BLASTP\n# 0 hits found\n# BLAST processed 2 queries\n"
        );
    }

    #[test]
    fn xml_iterations_are_renumbered() {
        let part = |q: &str| {
            format!("<?xml?>\n<BlastOutput>\n<BlastOutput_iterations>\n<Iteration>\n  <Iteration_iter-num>1</Iteration_iter-num>\n  <Iteration_query-ID>Query_1</Iteration_query-ID>\n  <Iteration_query-def>{q}</Iteration_query-def>\n</Iteration>\n</BlastOutput_iterations>\n</BlastOutput>\n")
        };
        let out = assemble(&[part("a"), part("b")], 5).unwrap();
        assert_eq!(out.matches("<BlastOutput_iterations>").count(), 1);
        assert!(
            out.contains(
                "<Iteration_iter-num>2</Iteration_iter-num>\n  <Iteration_query-ID>Query_2</Iteration_query-ID>\n  <Iteration_query-def>b"
            ),
            "{out}"
        );
        assert!(out.ends_with("</Iteration>\n</BlastOutput_iterations>\n</BlastOutput>\n"));
        // A query BLAST+ could not compute statistics for: its warning names it by its
        // local id, which is renumbered there too (a title that says "Query_1 " is not).
        let warned = |q: &str| {
            format!("<?xml?>\n<BlastOutput>\n<BlastOutput_iterations>\n<Iteration>\n  <Iteration_iter-num>1</Iteration_iter-num>\n  <Iteration_query-ID>Query_1</Iteration_query-ID>\n  <Iteration_query-def>{q}</Iteration_query-def>\n  <Iteration_message>Query_1 {q}:  Query_1 {q}: Could not calculate  No hits found</Iteration_message>\n</Iteration>\n</BlastOutput_iterations>\n</BlastOutput>\n")
        };
        let out = assemble(&[part("a"), warned("xs Query_1 x")], 5).unwrap();
        assert!(
            out.contains(
                "<Iteration_message>Query_2 xs Query_1 x:  Query_2 xs Query_1 x: Could not calculate  No hits found</Iteration_message>"
            ),
            "{out}"
        );
    }

    /// Query titles that are not UTF-8 (a Latin-1 query file): their lines are joined,
    /// renumbered and counted byte for byte, in every format's special lines.
    #[test]
    fn parts_with_latin1_titles_join_byte_for_byte() {
        let xml = |n: &[u8]| -> Vec<u8> {
            [&b"<?xml?>\n<BlastOutput>\n<BlastOutput_iterations>\n<Iteration>\n  <Iteration_iter-num>1</Iteration_iter-num>\n  <Iteration_query-ID>Query_1</Iteration_query-ID>\n  <Iteration_query-def>"[..], n, b"</Iteration_query-def>\n  <Iteration_message>Query_1 ", n, b": No hits found</Iteration_message>\n</Iteration>\n</BlastOutput_iterations>\n</BlastOutput>\n"].concat()
        };
        let out = join(&[xml(b"g\xe8ne1"), xml(b"M\xfcller")], 5).unwrap();
        let tail = b"<Iteration_iter-num>2</Iteration_iter-num>\n  <Iteration_query-ID>Query_2</Iteration_query-ID>\n  <Iteration_query-def>M\xfcller</Iteration_query-def>\n  <Iteration_message>Query_2 M\xfcller: No hits found</Iteration_message>\n";
        let holds = |out: &[u8], want: &[u8]| out.windows(want.len()).any(|w| w == want);
        assert!(holds(&out, tail), "{}", String::from_utf8_lossy(&out));
        assert!(holds(&out, b"<Iteration_message>Query_1 g\xe8ne1: No hits"));
        let pairwise =
            |q: &[u8], db: &[u8]| -> Vec<u8> { [&b"BLASTP\n\nQuery= "[..], q, b"\n\nLength=3\n\n  Database: ", db, b"\n"].concat() };
        let out = join(&[pairwise(b"q\xe9", b"one"), pairwise(b"caf\xe9", b"d\xfcb")], 0).unwrap();
        assert_eq!(out, b"BLASTP\n\nQuery= q\xe9\n\nLength=3\n\nQuery= caf\xe9\n\nLength=3\n\n  Database: d\xfcb\n");
        let tabular = |q: &[u8]| -> Vec<u8> { [&b"# Query: "[..], q, b"\n", q, b"\ts\n# BLAST processed 1 queries\n"].concat() };
        let out = join(&[tabular(b"g\xe8ne1"), tabular(b"g\xe9ne1")], 7).unwrap();
        assert_eq!(out, b"# Query: g\xe8ne1\ng\xe8ne1\ts\n# Query: g\xe9ne1\ng\xe9ne1\ts\n# BLAST processed 2 queries\n");
        let mut c = HitCounter::new("6");
        for l in ["g\u{e8}ne1\ts", "g\u{e9}ne1\ts"] {
            c.line(l);
        }
        assert_eq!(c.hits(), 2, "identifiers read as Latin-1 stay apart");
    }

    /// Pieces made one by one, each knowing only its batch's place, laid end to end.
    fn pieces(parts: &[String], queries: &[usize], fmt: u32) -> Result<String, String> {
        let mut out = Vec::new();
        let mut before = 0;
        for (i, p) in parts.iter().enumerate() {
            let mut piece = Vec::new();
            let len = piece_of(p, &mut piece, fmt, i, parts.len(), before, queries[i])?;
            assert_eq!(len, piece.len() as u64);
            out.extend(piece);
            before += queries[i];
        }
        Ok(String::from_utf8(out).unwrap())
    }

    fn piece_of(p: &str, out: &mut Vec<u8>, fmt: u32, i: usize, n: usize, before: usize, queries: usize) -> Result<u64, String> {
        piece(p.as_bytes(), out, fmt, i, n, before, queries)
    }

    #[test]
    fn pieces_end_to_end_are_the_assembled_report_in_every_format() {
        let pairwise = |q: &str| format!("BLASTP\n\nDatabase: DB\n\nQuery= {q}\nhits {q}\n\n\n  Database: DB\n  footer\n");
        let xml = |qs: &[&str]| {
            let mut s = String::from("<?xml?>\n<BlastOutput>\n<BlastOutput_iterations>\n");
            for (i, q) in qs.iter().enumerate() {
                s.push_str(&format!("<Iteration>\n  <Iteration_iter-num>{n}</Iteration_iter-num>\n  <Iteration_query-ID>Query_{n}</Iteration_query-ID>\n  <Iteration_query-def>{q}</Iteration_query-def>\n</Iteration>\n", n = i + 1));
            }
            s + "</BlastOutput_iterations>\n</BlastOutput>\n"
        };
        let anchored = |qs: &[&str]| {
            let mut s = String::from("BLASTP\n\nDatabase: DB\n\n");
            for (i, q) in qs.iter().enumerate() {
                s.push_str(&format!("Query= {q}\n\n\nQuery_{n}  1  MKV  3\ns1       1  ...  3\n\n", n = i + 1));
            }
            s + "\n  Database: DB\n  footer\n"
        };
        let tab7 = |qs: &[&str]| {
            let mut s = String::new();
            for q in qs {
                s.push_str(&format!("# BLASTP\n# 1 hits found\n{q}\ts\n"));
            }
            s + &format!("# BLAST processed {} queries\n", qs.len())
        };
        let cases: Vec<(u32, Vec<String>, Vec<usize>)> = vec![
            (0, vec![pairwise("a"), pairwise("b"), pairwise("c")], vec![1, 1, 1]),
            (0, vec![pairwise("only")], vec![1]),
            (1, vec![anchored(&["a"]), anchored(&["b", "c"]), anchored(&["d"])], vec![1, 2, 1]),
            (3, (0..11).map(|i| anchored(&[&i.to_string()])).collect(), vec![1; 11]),
            (5, vec![xml(&["a", "b"]), xml(&["c"]), xml(&["d", "e", "f"])], vec![2, 1, 3]),
            (7, vec![tab7(&["a"]), tab7(&["b", "c"]), tab7(&["d"])], vec![1, 2, 1]),
            (6, vec!["a\ts\n".into(), "".into(), "b\ts\nc\ts\n".into()], vec![1, 1, 2]),
        ];
        for (fmt, parts, queries) in cases {
            let whole = assemble(&parts, fmt).unwrap();
            assert_eq!(pieces(&parts, &queries, fmt).unwrap(), whole, "outfmt {fmt}");
        }
        // A part that does not hold the batch's queries cannot be placed by itself.
        let e = piece_of(&xml(&["a"]), &mut Vec::new(), 5, 1, 3, 2, 2).unwrap_err();
        assert!(e.contains("1 XML iterations for 2 queries"), "{e}");
        let e = piece_of(&tab7(&["a", "b"]), &mut Vec::new(), 7, 0, 2, 0, 3).unwrap_err();
        assert!(e.contains("2 queries in its trailer for 3 queries"), "{e}");
        let e = piece_of(&anchored(&["a"]), &mut Vec::new(), 2, 1, 3, 1, 2).unwrap_err();
        assert!(e.contains("1 `Query= ` lines for 2 queries"), "{e}");
    }

    #[test]
    fn pairwise_keeps_the_first_header_and_the_last_footer() {
        let part = |q: &str| format!("BLASTP\n\nDatabase: DB\n\nQuery= {q}\nhits {q}\n\n\n  Database: DB\n  footer\n");
        let out = assemble(&[part("a"), part("b")], 0).unwrap();
        assert_eq!(out, "BLASTP\n\nDatabase: DB\n\nQuery= a\nhits a\n\n\nQuery= b\nhits b\n\n\n  Database: DB\n  footer\n");
        assert!(assemble(&["no queries".into()], 0).is_err());
        // A "  Database: " line inside a query's section is not the footer.
        let odd = "BLASTP\n\nQuery= a\n  Database: inside a\nmore a\nQuery= b\nhits b\n  Database: DB\n  footer\n";
        let out = assemble(&[odd.into(), part("c")], 0).unwrap();
        assert_eq!(
            out,
            "BLASTP\n\nQuery= a\n  Database: inside a\nmore a\nQuery= b\nhits b\nQuery= c\nhits c\n\n\n  Database: DB\n  footer\n"
        );
    }

    /// Query-anchored blocks as BLAST+ lays them out: labels padded to the longest plus
    /// two, insertion marks under the sequence columns.
    #[test]
    fn query_anchored_labels_are_renumbered_and_their_blocks_widened_as_blast_lays_them_out() {
        // Queries `first..first + n` as one BLAST+ run prints them, labelled from
        // `Query_1`: one block whose width its query label sets, one whose subject's does.
        let run = |first: usize, n: usize| {
            let mut s = String::from("BLASTP\n\nDatabase: DB\n\n");
            for k in first..first + n {
                let label = format!("Query_{}", k - first + 1);
                let w = label.len() + 2;
                s.push_str(&format!("Query= q{k}\n\nLength=3\n\n\n"));
                s.push_str(&format!("{label:<w$}1  MKV  3\n{:<w$}5  .I.  7\n{:<w$}     \\\n{:<w$}     G\n\n", "S1", "", ""));
                s.push_str(&format!("{label:<13}4  LL   5\n{:<13}8  ..   9\n\n\n", "SUBJECT0001"));
                s.push_str("Lambda      K        H\n\nEffective search space used: 9\n\n\n");
            }
            s + "  Database: DB\n  footer\n"
        };
        let whole = run(1, 12);
        assert!(whole.contains("Query_10  1  MKV  3\nS1        5  .I.  7\n               \\\n"), "{whole}");
        // The same queries in batches of 5, 5 and 2: queries 10 to 12 were `Query_5`,
        // `Query_1` and `Query_2` in theirs.
        let parts = [run(1, 5), run(6, 5), run(11, 2)];
        for fmt in 1..=4 {
            assert_eq!(assemble(&parts, fmt).unwrap(), whole, "outfmt {fmt}");
            assert_eq!(pieces(&parts, &[5, 5, 2], fmt).unwrap(), whole, "outfmt {fmt}");
        }
        // The pairwise report has no such labels: what looks like one stays as it is.
        let pairwise = "BLASTP\n\nQuery= a\n\nQuery_1  1  MKV  3\n\n  Database: DB\n";
        assert_eq!(assemble(&[pairwise.into(), pairwise.into()], 0).unwrap().matches("\nQuery_1  1").count(), 2);
    }
}
