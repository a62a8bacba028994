//! Turning merged hits into the exact report serial BLAST+ would have written.
//!
//! 1. A *statistics run* searches all queries against `stats` — a one-sequence database
//!    aliased to the whole database's size — with the user's options and `-outfmt 11`.
//!    Its archive holds the request exactly as a serial run's would (all queries,
//!    numbered globally; every option) at the cost of a few milliseconds per query.
//! 2. Its `alignments` are replaced by the merged hits and its database by the
//!    whole-database alias; `blast_formatter` prints the report. For `-outfmt 6/7`
//!    that is byte-identical to serial BLAST.
//! 3. An archive keeps Karlin blocks and search space only once per batch, so for
//!    `-outfmt 0` and `5` a second statistics run prints the same format directly and
//!    its per-query statistics (pairwise footer / XML `Iteration_stat`) replace the
//!    formatter's, query by query.

use std::path::{Path, PathBuf};

use crate::archive::{self, ArchiveError};
use crate::tools::{self, ToolError};

/// Errors assembling the report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error("archive: {0}")]
    Archive(#[from] ArchiveError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("not supported: {0}")]
    Unsupported(String),
    #[error("statistics blocks do not line up with the report ({report} in the report, {stats} from the statistics run)")]
    StatsMismatch { report: usize, stats: usize },
}

/// BLAST+ reads its query batch size (in letters) from `BATCH_SIZE`.
const ONE_BATCH: &[(&str, &str)] = &[("BATCH_SIZE", "2000000000")];

/// Options of `blast_formatter` (the formatting subset of BLAST+ options).
const FORMAT_OPTIONS: &[&str] = &["-num_descriptions", "-num_alignments", "-max_target_seqs", "-line_length", "-sorthits", "-sorthsps"];
const FORMAT_FLAGS: &[&str] = &["-html", "-show_gis", "-parse_deflines"];

/// Splits user options into those `blast_formatter` also needs.
pub fn format_args(blast_args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < blast_args.len() {
        let a = blast_args[i].as_str();
        if FORMAT_FLAGS.contains(&a) {
            out.push(a.to_string());
        } else if FORMAT_OPTIONS.contains(&a) && i + 1 < blast_args.len() {
            out.push(a.to_string());
            out.push(blast_args[i + 1].clone());
            i += 1;
        }
        i += 1;
    }
    out
}

/// The report's base format number (`"6 qseqid sseqid"` → 6).
pub fn base_format(outfmt: &str) -> u32 {
    outfmt.split_whitespace().next().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Whether reports in base format `fmt` are laid out as the pairwise report is: a
/// header, one block per query from its `Query= ` line on, closed by the query's
/// statistics, and a footer from `  Database: ` on. The pairwise report (0) and the
/// query-anchored ones (1–4), which differ only in how alignments are drawn.
pub fn is_pairwise_layout(fmt: u32) -> bool {
    fmt <= 4
}

/// Everything needed to write one report.
pub struct Spec<'a> {
    pub program: &'a str,
    /// `BLASTDB`: finds `stats` (the statistics database) and `db_name`.
    pub blastdb: &'a std::ffi::OsStr,
    pub db_name: &'a str,
    pub queries: &'a Path,
    pub outfmt: &'a str,
    pub blast_args: &'a [String],
    pub scratch: &'a Path,
}

fn args<'b>(base: &'b [&'b str], extra: &'b [String]) -> Vec<&'b str> {
    base.iter().copied().chain(extra.iter().map(|s| s.as_str())).collect()
}

/// The output of a batch's statistics runs (steps 1 and 3 above). They depend only on
/// the batch's queries, the database and the options, never on the hits, so they can
/// run before the batch's results are in (see [`Statistics::save`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Statistics {
    /// The `-outfmt 11` archive of step 1.
    pub archive: String,
    /// The directly printed report of step 3 (`-outfmt 0` and `5` only): bytes, since
    /// it prints the query titles as they are in the query file (see `crate::text`).
    pub direct: Option<Vec<u8>>,
}

/// The statistics files in a directory made by [`Statistics::save`].
const STATS_ARCHIVE: &str = "stats.asn";
const STATS_DIRECT: &str = "stats.direct";

impl Statistics {
    /// Writes the statistics into the directory `dir`, which appears complete or not at
    /// all: the files go into a sibling directory first, which is then renamed. `Ok`
    /// also when another process saved the same statistics first.
    pub fn save(&self, dir: &Path) -> Result<(), ReportError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ReportError::Io { path, source }
        };
        let tmp = dir.with_extension(format!("tmp{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        let saved = (|| {
            std::fs::write(tmp.join(STATS_ARCHIVE), &self.archive).map_err(io(&tmp.join(STATS_ARCHIVE)))?;
            if let Some(d) = &self.direct {
                std::fs::write(tmp.join(STATS_DIRECT), d).map_err(io(&tmp.join(STATS_DIRECT)))?;
            }
            match std::fs::rename(&tmp, dir) {
                Ok(()) => Ok(()),
                Err(_) if dir.join(STATS_ARCHIVE).exists() => Ok(()),
                Err(e) => Err(io(dir)(e)),
            }
        })();
        let _ = std::fs::remove_dir_all(&tmp);
        saved
    }

    /// The statistics saved in `dir` by [`Statistics::save`], if they are there.
    pub fn load(dir: &Path) -> Option<Statistics> {
        let archive = std::fs::read_to_string(dir.join(STATS_ARCHIVE)).ok()?;
        let direct = std::fs::read(dir.join(STATS_DIRECT)).ok();
        Some(Statistics { archive, direct })
    }

    /// Whether these statistics serve a report in `outfmt` (a directly printed report
    /// is needed for `-outfmt 0` to `5`).
    pub fn serve(&self, outfmt: &str) -> bool {
        !needs_direct(outfmt) || self.direct.is_some()
    }
}

/// Whether a report in `outfmt` takes its per-query statistics from a direct run.
fn needs_direct(outfmt: &str) -> bool {
    let fmt = base_format(outfmt);
    is_pairwise_layout(fmt) || fmt == 5
}

/// Runs the statistics runs of a report (steps 1 and 3), in `spec.scratch`.
pub fn statistics(spec: &Spec) -> Result<Statistics, ReportError> {
    let q = spec.queries.to_string_lossy().to_string();
    let stats_asn = spec.scratch.join("stats.asn");
    let sa = stats_asn.to_string_lossy().to_string();
    // One internal batch, so that the archive is one object holding every query (the
    // formatter prints per-object headers, footers and query counts). The hit count as
    // the fragments' searches have it: `-num_alignments 0` would make it 0 here, which
    // BLAST+ refuses ("No hits are being saved").
    let for_archive = crate::plan::archive_args(spec.blast_args, spec.outfmt);
    tools::run_env(
        spec.program,
        &args(&["-query", &q, "-db", "stats", "-outfmt", "11", "-out", &sa], &for_archive),
        Some(spec.blastdb),
        Some(spec.scratch),
        ONE_BATCH,
    )?;
    let archive = std::fs::read_to_string(&stats_asn).map_err(|e| ReportError::Io { path: stats_asn.clone(), source: e })?;
    let direct = if needs_direct(spec.outfmt) {
        let direct = spec.scratch.join("stats.direct");
        let d = direct.to_string_lossy().to_string();
        tools::run_env(
            spec.program,
            &args(&["-query", &q, "-db", "stats", "-outfmt", spec.outfmt, "-out", &d], spec.blast_args),
            Some(spec.blastdb),
            Some(spec.scratch),
            ONE_BATCH,
        )?;
        Some(std::fs::read(&direct).map_err(|e| ReportError::Io { path: direct.clone(), source: e })?)
    } else {
        None
    };
    Ok(Statistics { archive, direct })
}

/// Writes the report for `hsps` (merged, query ids global) to `out`.
pub fn write(spec: &Spec, hsps: &[String], out: &Path) -> Result<(), ReportError> {
    write_with(spec, &statistics(spec)?, hsps, out)
}

/// [`write()`] with the statistics runs' output already at hand (`stats` must come from
/// [`statistics`] for the same queries, database, format and options).
pub fn write_with(spec: &Spec, stats: &Statistics, hsps: &[String], out: &Path) -> Result<(), ReportError> {
    let text = &stats.archive;
    let merged = archive::spliced(text, hsps, "stats", spec.db_name)?;
    let merged_path = spec.scratch.join("merged.asn");
    // Written piece by piece: joined first, a batch's archive would be copied once more.
    std::fs::File::create(&merged_path)
        .and_then(|f| {
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            merged.write_to(&mut w)?;
            std::io::Write::flush(&mut w)
        })
        .map_err(|e| ReportError::Io { path: merged_path.clone(), source: e })?;
    let mp = merged_path.to_string_lossy().to_string();
    // The formatter writes to scratch, and the report reaches `out` in one write: `out`
    // may be on a network file system, where reading the formatted text back to fix
    // its statistics and writing it again would cross the network three times.
    let formatted = spec.scratch.join("formatted");
    let o = formatted.to_string_lossy().to_string();
    let fargs = format_args(spec.blast_args);
    tools::run(
        "blast_formatter",
        &args(&["-archive", &mp, "-outfmt", spec.outfmt, "-out", &o], &fargs),
        Some(spec.blastdb),
        Some(spec.scratch),
    )?;
    let fmt = base_format(spec.outfmt);
    let titles = query_titles(spec.queries)?;
    let (open, close) = match fmt {
        0..=4 => ("\nLambda      K        H", "\nEffective search space used: "),
        5 => ("<Iteration_stat>", "</Iteration_stat>"),
        6 | 7 | 10 | 18 if titles.is_some() => {
            let report = std::fs::read_to_string(&formatted).map_err(|e| ReportError::Io { path: formatted.clone(), source: e })?;
            let titles = titles.as_deref().unwrap_or_default();
            let fixed = match fmt {
                18 => restore_titles(report.as_bytes(), titles, "Query= "),
                10 => restore_ids(report.as_bytes(), titles, separator(spec.outfmt, ',')),
                _ => restore_ids(&restore_titles(report.as_bytes(), titles, "# Query: "), titles, separator(spec.outfmt, '\t')),
            };
            std::fs::write(out, fixed).map_err(|e| ReportError::Io { path: out.to_path_buf(), source: e })?;
            return Ok(());
        }
        _ => {
            std::fs::copy(&formatted, out).map_err(|e| ReportError::Io { path: out.to_path_buf(), source: e })?;
            return Ok(());
        }
    };
    let masks = query_masks(text);
    let direct =
        stats.direct.as_deref().ok_or_else(|| ReportError::Unsupported("statistics without the direct run this format needs".into()))?;
    // Read as Latin-1 if it is not UTF-8, and what is written turned back alike: the
    // formatter's text is ASCII, so what comes from the direct run (an XML warning
    // naming a query) keeps its bytes.
    let direct = crate::text::line(direct);
    let stats_text = direct.as_str();
    let report = std::fs::read_to_string(&formatted).map_err(|e| ReportError::Io { path: formatted.clone(), source: e })?;
    let mut fixed = replace_blocks(&report, stats_text, open, close)?;
    if fmt == 5 {
        fixed = carry_warnings(&fixed, stats_text);
    }
    if !masks.is_empty() {
        if fmt == 5 {
            // Serial XML marks masked residues by a rule not yet reproduced; refuse rather
            // than write a report that could differ from serial BLAST+.
            return Err(ReportError::Unsupported("XML output (-outfmt 5) when query masking (SEG/DUST) masked residues; use -outfmt 0 to 4, 6 or 7, or --split queries, or turn masking off".into()));
        }
        fixed = mask_pairwise(&fixed, &masks);
    }
    let fixed = direct.bytes_of(&fixed);
    let fixed = match (fmt, &titles) {
        (0..=4, Some(t)) => restore_titles(&fixed, t, "Query= "),
        (5, Some(t)) => restore_xml_titles(&fixed, t),
        _ => fixed.into_owned(),
    };
    std::fs::write(out, fixed).map_err(|e| ReportError::Io { path: out.to_path_buf(), source: e })?;
    Ok(())
}

/// The batch's query titles (deflines without `>`, bytes in whatever encoding the query
/// file has) when one of them holds bytes outside ASCII, which [`restore_titles`] must
/// put back; `None` for the usual all-ASCII file.
fn query_titles(queries: &Path) -> Result<Option<Vec<Vec<u8>>>, ReportError> {
    let bytes = std::fs::read(queries).map_err(|e| ReportError::Io { path: queries.to_path_buf(), source: e })?;
    if bytes.is_ascii() {
        return Ok(None);
    }
    let records = crate::fasta::read_from(bytes.as_slice(), queries).map_err(|e| ReportError::Io {
        path: queries.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
    })?;
    Ok(Some(records.iter().map(|r| r.title().to_vec()).collect()))
}

/// BLAST+'s archives hold only ASCII: it writes a `#` for every other byte of a query's
/// title ("Bad char [0xC3] in string"), so the formatter prints `Müller` as `M##ller`
/// (and a Latin-1 `M\xfcller` as `M#ller`) where serial BLAST+ prints the bytes. Puts
/// them back: after the `n`-th line start with `prefix` (`Query= `, `# Query: `) the
/// `n`-th title must be printed byte for byte, each such byte as `#`, a space possibly
/// as the line break of a wrapped title; anything else is left as it is. The result is
/// bytes: a title need not be UTF-8.
fn restore_titles(report: &[u8], titles: &[Vec<u8>], prefix: &str) -> Vec<u8> {
    let (prefix, mut out) = (prefix.as_bytes(), Vec::with_capacity(report.len()));
    let mut at = 0;
    let mut titles = titles.iter();
    let line_start = [b"\n", prefix].concat();
    let next = |at: usize| {
        if at == 0 && report.starts_with(prefix) {
            Some(0)
        } else {
            memchr::memmem::find(&report[at..], &line_start).map(|p| at + p + 1)
        }
    };
    while let Some(p) = next(at) {
        let start = p + prefix.len();
        out.extend_from_slice(&report[at..start]);
        at = start;
        let Some(original) = titles.next() else { break };
        let Some(printed) = report.get(start..start + original.len()) else { continue };
        let same = |(&s, &o): (&u8, &u8)| s == o || (s == b'#' && !o.is_ascii()) || (s == b'\n' && o == b' ');
        if !original.is_ascii() && printed.iter().zip(original).all(same) {
            out.extend(printed.iter().zip(original).map(|(&s, &o)| if s == b'#' { o } else { s }));
            at = start + original.len();
        }
    }
    out.extend_from_slice(&report[at..]);
    out
}

/// XML titles as BLAST+ prints them: without trailing blanks, `&`, `<`, `>`, `"` and `'`
/// escaped, every other byte as it is (Latin-1 ones too; a UTF-8 title fails BLAST+'s
/// XML writer).
fn xml_escaped(title: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(title.len());
    for &b in title.trim_ascii_end() {
        match b {
            b'&' => out.extend_from_slice(b"&amp;"),
            b'<' => out.extend_from_slice(b"&lt;"),
            b'>' => out.extend_from_slice(b"&gt;"),
            b'"' => out.extend_from_slice(b"&quot;"),
            b'\'' => out.extend_from_slice(b"&apos;"),
            _ => out.push(b),
        }
    }
    out
}

/// [`restore_titles`] in XML: the report's first query title, then every iteration's.
fn restore_xml_titles(report: &[u8], titles: &[Vec<u8>]) -> Vec<u8> {
    let escaped: Vec<Vec<u8>> = titles.iter().map(|t| xml_escaped(t)).collect();
    let first = restore_titles(report, &escaped[..escaped.len().min(1)], "  <BlastOutput_query-def>");
    restore_titles(&first, &escaped, "  <Iteration_query-def>")
}

/// The field separator of a tabular `outfmt`: its `delim=` (`-outfmt "6 delim=; std"`),
/// or the format's own.
pub fn separator(outfmt: &str, default: char) -> char {
    outfmt.split_whitespace().find_map(|w| w.strip_prefix("delim=")?.chars().next()).unwrap_or(default)
}

/// What BLAST+'s `std` field stands for, in order.
const STD_FIELDS: [&str; 12] =
    ["qaccver", "saccver", "pident", "length", "mismatch", "gapopen", "qstart", "qend", "sstart", "send", "evalue", "bitscore"];

/// The column of a tabular `outfmt` that holds the first of the fields `names`, counted
/// as BLAST+ prints them: `std` stands for its twelve fields, `delim=` is none, and a
/// format that names no fields is `std` (`"6 evalue sseqid"`, `["sseqid", "sacc"]` → 1;
/// `"6"`, `["saccver"]` → 1).
pub fn tabular_column(outfmt: &str, names: &[&str]) -> Option<usize> {
    tabular_fields(outfmt).iter().position(|f| names.contains(f))
}

/// The fields a tabular `outfmt` names, as written (`std` unexpanded; `delim=` is not a
/// field); none for the default columns.
pub fn named_fields(outfmt: &str) -> Vec<&str> {
    outfmt.split_whitespace().skip(1).filter(|f| !f.starts_with("delim=")).collect()
}

/// The fields of a tabular `outfmt` (6, 7, 10) in the order BLAST+ prints them: `std`
/// stands for its twelve fields, `delim=` is none, and a format that names no fields is
/// `std`.
pub fn tabular_fields(outfmt: &str) -> Vec<&str> {
    let named = named_fields(outfmt);
    let fields = if named.is_empty() { vec!["std"] } else { named };
    fields.iter().flat_map(|&f| if f == "std" { STD_FIELDS.to_vec() } else { vec![f] }).collect()
}

/// [`restore_titles`] for the query identifiers of tabular rows (`qseqid`, `qacc`,
/// ...): a field that is, whole, the identifier of a title outside ASCII with each such
/// byte a `#` becomes that identifier. No identifier in the database can be printed
/// so: BLAST+ makes them the same way. `report` may already hold titles' bytes in any
/// encoding (format 7's comment lines), which pass through.
fn restore_ids(report: &[u8], titles: &[Vec<u8>], separator: char) -> Vec<u8> {
    let mangled: std::collections::HashMap<String, &[u8]> = titles
        .iter()
        .map(|t| crate::fasta::first_word(t))
        .filter(|id| !id.is_ascii())
        .map(|id| (id.iter().map(|&b| if b.is_ascii() { b as char } else { '#' }).collect(), id))
        .collect();
    if mangled.is_empty() {
        return report.to_vec();
    }
    let mut out = Vec::with_capacity(report.len());
    let mut sep = [0; 4];
    let sep = separator.encode_utf8(&mut sep).as_bytes();
    for raw in report.split_inclusive(|&b| b == b'\n') {
        if raw.starts_with(b"#") {
            out.extend_from_slice(raw);
            continue;
        }
        let line = crate::text::line(raw);
        let text = line.as_str();
        let (body, end) = text.strip_suffix('\n').map_or((text, ""), |b| (b, "\n"));
        for (i, field) in body.split(separator).enumerate() {
            if i > 0 {
                out.extend_from_slice(sep);
            }
            match mangled.get(field) {
                Some(id) => out.extend_from_slice(id),
                None => out.extend_from_slice(&line.bytes_of(field)),
            }
        }
        out.extend_from_slice(end.as_bytes());
    }
    out
}

/// Masked query intervals (0-based, inclusive) by query number, from an archive's
/// `masks` (e.g. SEG). `blast_formatter` ignores them when printing alignments, while
/// serial BLAST+ shows masked query residues in lower case (pairwise) or as `X` (XML).
pub fn query_masks(archive: &str) -> std::collections::HashMap<usize, Vec<(usize, usize)>> {
    let mut out: std::collections::HashMap<usize, Vec<(usize, usize)>> = std::collections::HashMap::new();
    let Ok((s, e)) = archive::find_block(archive, "masks", 4) else { return out };
    let block = &archive[s..e];
    let num = |t: &str, key: &str| -> Option<usize> {
        let i = t.find(key)? + key.len();
        t[i..].trim_start().split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    for piece in block.split("from ").skip(1) {
        let from: Option<usize> = piece.split(|c: char| !c.is_ascii_digit()).next().and_then(|v| v.parse().ok());
        let to = num(piece, "to ");
        let q = num(piece, "local str \"Query_");
        if let (Some(f), Some(t), Some(q)) = (from, to, q) {
            out.entry(q).or_default().push((f, t));
        }
    }
    out
}

fn masked(m: &[(usize, usize)], pos0: usize) -> bool {
    m.iter().any(|&(f, t)| f <= pos0 && pos0 <= t)
}

/// Lower-cases masked residues on the query lines of alignments: `Query  <start>
/// <residues> <end>` in the pairwise report, `Query_<k>  <start>  <residues>  <end>` in
/// the query-anchored ones (where gaps are `-` as well).
pub fn mask_pairwise(report: &str, masks: &std::collections::HashMap<usize, Vec<(usize, usize)>>) -> String {
    let mut out = String::with_capacity(report.len());
    let mut query = 0usize;
    for line in report.split_inclusive('\n') {
        if line.starts_with("Query= ") {
            query += 1;
        }
        if let (Some(m), Some((start, at, seq))) = (masks.get(&query), alignment_query_line(line)) {
            let mut pos = start - 1;
            out.push_str(&line[..at]);
            out.extend(seq.chars().map(|c| {
                if c == '-' {
                    return c;
                }
                let r = if masked(m, pos) { c.to_ascii_lowercase() } else { c };
                pos += 1;
                r
            }));
            out.push_str(&line[at + seq.len()..]);
            continue;
        }
        out.push_str(line);
    }
    out
}

/// The label of an alignment's query line, `Query` (pairwise) or `Query_<k>`
/// (query-anchored, `k` the query's number within its BLAST+ run), padded by at least
/// two blanks as BLAST+ pads it: `k` if the label has one, and the label column's width.
pub fn query_line_label(line: &str) -> Option<(Option<&str>, usize)> {
    let rest = line.strip_prefix("Query")?;
    let (k, label) = match rest.strip_prefix('_') {
        Some(n) => {
            let k = &n[..n.bytes().take_while(u8::is_ascii_digit).count()];
            if k.is_empty() {
                return None;
            }
            (Some(k), 6 + k.len())
        }
        None => (None, 5),
    };
    let blanks = line[label..].bytes().take_while(|&b| b == b' ').count();
    (blanks >= 2).then_some((k, label + blanks))
}

/// A query line of an alignment ([`query_line_label`]): its first residue's 1-based
/// position, and where its residues are.
fn alignment_query_line(line: &str) -> Option<(usize, usize, &str)> {
    let (_, width) = query_line_label(line)?;
    let token = |from: usize| -> Option<(usize, &str)> {
        let at = from + line[from..].len() - line[from..].trim_start_matches(' ').len();
        let len = line[at..].find(char::is_whitespace).unwrap_or(line.len() - at);
        (len > 0).then(|| (at, &line[at..at + len]))
    };
    let (start_at, start) = token(width)?;
    let start: usize = start.parse().ok().filter(|&s| s > 0)?;
    let (at, seq) = token(start_at + line[start_at..].find(' ')?)?;
    Some((start, at, seq))
}

/// Byte ranges of the blocks from `open` to the end of the line holding `close`.
/// A query's statistics block: from its `open` (`None`: the query has none, as when
/// BLAST+ could not compute its Karlin-Altschul parameters), or else its `close`, to
/// the end of the `close` line.
struct Block {
    open: Option<usize>,
    close: usize,
    end: usize,
}

impl Block {
    /// Where the block starts, with the blank lines before it when either side of a
    /// swap has no `open`: the two then differ in those lines too.
    fn start(&self, text: &str, with_blank_lines: bool) -> usize {
        let s = self.open.unwrap_or(self.close);
        if with_blank_lines {
            text[..s].trim_end_matches('\n').len()
        } else {
            s
        }
    }
}

/// Every query's statistics block: one per `close` (every query has one), from the first
/// `open` since the previous block, if any (pairwise output has two: ungapped, gapped).
fn blocks(text: &str, open: &str, close: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(c) = text[at..].find(close) {
        let c = at + c;
        let o = text[at..c].find(open).map(|o| at + o);
        let after = c + close.len();
        let end = text[after..].find('\n').map(|n| after + n).unwrap_or(text.len());
        out.push(Block { open: o, close: c, end });
        at = end;
    }
    out
}

/// XML: the direct run's message of a query that has one besides "No hits found" (BLAST+'s
/// warning that it could not compute the query's statistics, say) replaces the
/// formatter's, which is only ever "No hits found". Such a query has no hits anywhere:
/// BLAST+ did not search it.
fn carry_warnings(report: &str, direct: &str) -> String {
    const OPEN: &str = "<Iteration_message>";
    const CLOSE: &str = "</Iteration_message>";
    let iterations = |t: &str| blocks(t, "<Iteration>", "</Iteration>");
    let message = |t: &str, b: &Block| -> Option<(usize, usize)> {
        let s = b.open.unwrap_or(b.close);
        let m = t[s..b.end].find(OPEN)? + s + OPEN.len();
        Some((m, t[m..b.end].find(CLOSE)? + m))
    };
    let (ri, di) = (iterations(report), iterations(direct));
    if ri.len() != di.len() {
        return report.to_string();
    }
    let mut out = String::with_capacity(report.len());
    let mut at = 0;
    for (r, d) in ri.into_iter().zip(di) {
        let warning = message(direct, &d).map(|(s, e)| &direct[s..e]).filter(|m| *m != "No hits found");
        if let (Some(w), Some((s, e))) = (warning, message(report, &r)) {
            out.push_str(&report[at..s]);
            out.push_str(w);
            at = e;
        }
    }
    out.push_str(&report[at..]);
    out
}

/// Replaces the i-th statistics block of `report` with the i-th of `stats`. A query
/// whose direct run printed no statistics (only its search space: BLAST+ could not
/// compute them for, say, a query of `X`s) gets that, with the direct run's blank
/// lines, in place of the formatter's block (which prints the batch's statistics for
/// every query).
pub fn replace_blocks(report: &str, stats: &str, open: &str, close: &str) -> Result<String, ReportError> {
    let rb = blocks(report, open, close);
    let sb = blocks(stats, open, close);
    if rb.len() != sb.len() {
        return Err(ReportError::StatsMismatch { report: rb.len(), stats: sb.len() });
    }
    let mut out = String::with_capacity(report.len() + 64 * rb.len());
    let mut at = 0;
    for (r, s) in rb.iter().zip(&sb) {
        let bare = r.open.is_none() || s.open.is_none();
        out.push_str(&report[at..r.start(report, bare)]);
        out.push_str(&stats[s.start(stats, bare)..s.end]);
        at = r.end;
    }
    out.push_str(&report[at..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_blocks_are_swapped_in_order() {
        let report = "q1\nLambda      K        H\n 0.3 0.1\nEffective search space used: 1\nq2\nLambda      K        H\n 0.3 0.1\nEffective search space used: 1\nend\n";
        let stats = "x\nLambda      K        H        a\n 0.3 0.1 0.7\nEffective search space used: 11\ny\nLambda      K        H        a\n 0.2 0.1 0.7\nEffective search space used: 22\n";
        let out = replace_blocks(report, stats, "\nLambda      K        H", "\nEffective search space used: ").unwrap();
        assert_eq!(out, "q1\nLambda      K        H        a\n 0.3 0.1 0.7\nEffective search space used: 11\nq2\nLambda      K        H        a\n 0.2 0.1 0.7\nEffective search space used: 22\nend\n");
        assert!(matches!(
            replace_blocks(report, "none", "\nLambda", "\nEffective"),
            Err(ReportError::StatsMismatch { report: 2, stats: 0 })
        ));
        // A query without statistics in the direct run (an all-`X` query): its search
        // space only, after the direct run's blank lines.
        let report = "q1 *****\n\n\n\nLambda      K        H\n 0.3\n\nEffective search space used: 5\n\n\nq2 *****\n\n\n\nLambda      K        H\n 0.3\n\nEffective search space used: 5\nend\n";
        let stats = "q1 *****\n\n\n\n\n\nEffective search space used: 0\n\n\nq2 *****\n\n\n\nLambda      K        H        a\n 0.2\n\nEffective search space used: 22\n";
        let out = replace_blocks(report, stats, "\nLambda      K        H", "\nEffective search space used: ").unwrap();
        assert_eq!(
            out,
            "q1 *****\n\n\n\n\n\nEffective search space used: 0\n\n\nq2 *****\n\n\n\nLambda      K        H        a\n 0.2\n\nEffective search space used: 22\nend\n"
        );
    }

    fn bytes(titles: &[&str]) -> Vec<Vec<u8>> {
        titles.iter().map(|t| t.as_bytes().to_vec()).collect()
    }

    #[test]
    fn query_titles_outside_ascii_get_their_bytes_back() {
        let titles = bytes(&["q1 plain", "q2 M\u{fc}ller \u{3b2}-lactamase x", "q3 caf\u{e9}"]);
        // As the formatter prints them: a `#` per byte, the second title wrapped.
        let report =
            "head\nQuery= q1 plain\n\nLength=3\nQuery= q2 M##ller\n##-lactamase x\n\nLength=4\nQuery= q3 caf## and more\nQuery= extra\n";
        let fixed = restore_titles(report.as_bytes(), &titles, "Query= ");
        assert_eq!(
            fixed,
            "head\nQuery= q1 plain\n\nLength=3\nQuery= q2 M\u{fc}ller\n\u{3b2}-lactamase x\n\nLength=4\nQuery= q3 caf\u{e9} and more\nQuery= extra\n"
                .as_bytes()
        );
        // A line that does not match its title byte for byte is left alone.
        let other = "# Query: q1 plain\n# Query: q2 Mxxller\n";
        assert_eq!(restore_titles(other.as_bytes(), &titles, "# Query: "), other.as_bytes());
        let rows = b"# Query: q1 plain\nq2\tM##ller\t1.0\n#\tM##ller\n";
        let ids = bytes(&["q1 plain", "M\u{fc}ller x"]);
        assert_eq!(restore_ids(rows, &ids, '\t'), "# Query: q1 plain\nq2\tM\u{fc}ller\t1.0\n#\tM##ller\n".as_bytes());
        assert_eq!(restore_ids(b"M##ller,M##llerx\n", &ids, ','), "M\u{fc}ller,M##llerx\n".as_bytes());
        assert_eq!((separator("6 delim=; std", '\t'), separator("10 qseqid", ','), separator("7", '\t')), (';', ',', '\t'));
        let first = restore_titles(b"# Query: q1 plain\n# Query: q2 M##ller ##-lactamase x\n", &titles, "# Query: ");
        assert_eq!(first, "# Query: q1 plain\n# Query: q2 M\u{fc}ller \u{3b2}-lactamase x\n".as_bytes());
    }

    /// A query file need not be UTF-8: a Latin-1 title's byte is one `#` in the
    /// formatter's text, and comes back as that byte, also where a row already holds
    /// another title's bytes (format 7: the comment lines are restored first).
    #[test]
    fn latin1_titles_and_identifiers_get_their_bytes_back() {
        let titles = vec![b"g\xe8ne1 M\xfcller".to_vec(), b"q2 caf\xe9".to_vec()];
        let report = "# Query: g#ne1 M#ller\ng#ne1\ts1\t0.5\n# Query: q2 caf#\nq2\ts#\t1.0\n";
        let restored = restore_titles(report.as_bytes(), &titles, "# Query: ");
        assert_eq!(restored, b"# Query: g\xe8ne1 M\xfcller\ng#ne1\ts1\t0.5\n# Query: q2 caf\xe9\nq2\ts#\t1.0\n");
        let rows = b"g#ne1\ts1 \xfc\t0.5\nq2\ts#\t1.0\n";
        assert_eq!(restore_ids(rows, &titles, '\t'), b"g\xe8ne1\ts1 \xfc\t0.5\nq2\ts#\t1.0\n", "only the identifier's field");
        assert_eq!(
            restore_ids(&restored, &titles, '\t'),
            b"# Query: g\xe8ne1 M\xfcller\ng\xe8ne1\ts1\t0.5\n# Query: q2 caf\xe9\nq2\ts#\t1.0\n"
        );
        // XML: escaped as BLAST+ escapes them, in the report's header and each iteration.
        let titles = vec![b"g\xe8ne1 a&b <c> ".to_vec(), b"q2 \"caf\xe9\"".to_vec()];
        let xml = "  <BlastOutput_query-def>g#ne1 a&amp;b &lt;c&gt;</BlastOutput_query-def>\n<Iteration>\n  <Iteration_query-def>g#ne1 a&amp;b &lt;c&gt;</Iteration_query-def>\n</Iteration>\n<Iteration>\n  <Iteration_query-def>q2 &quot;caf#&quot;</Iteration_query-def>\n";
        assert_eq!(
            restore_xml_titles(xml.as_bytes(), &titles),
            b"  <BlastOutput_query-def>g\xe8ne1 a&amp;b &lt;c&gt;</BlastOutput_query-def>\n<Iteration>\n  <Iteration_query-def>g\xe8ne1 a&amp;b &lt;c&gt;</Iteration_query-def>\n</Iteration>\n<Iteration>\n  <Iteration_query-def>q2 &quot;caf\xe9&quot;</Iteration_query-def>\n"
        );
    }

    #[test]
    fn masked_query_residues_are_lower_cased_in_pairwise_and_query_anchored_alignments() {
        // Query 1 masked at residues 3 to 5 (0-based 2..=4), query 2 not at all.
        let masks = std::collections::HashMap::from([(1, vec![(2, 4)])]);
        let pairwise = "Query= a\n\nQuery  1   MKVLAG  6\n           MK+LAG\nSbjct  9   MKILAG  14\n\nQuery= b\n\nQuery  1   MKVLAG  6\n";
        let masked = mask_pairwise(pairwise, &masks);
        assert_eq!(masked, pairwise.replacen("MKVLAG  6", "MKvlaG  6", 1));
        // Query-anchored: the local label, and gaps (formats 3 and 4) not counted as residues.
        let anchored = "Query= a\n\n\nQuery_1   2    KV-LAGW  7\nS1        9    ..I....  15\n\nQuery= b\n\nQuery_2   1    MK  2\n";
        assert_eq!(mask_pairwise(anchored, &masks), anchored.replace("KV-LAGW", "Kv-laGW"));
        // Lines that only look alike are left as they are.
        for line in ["Query= a\n", "Query_  1  MKV  3\n", "Query_1 1  MKV  3\n", "Query  x  MKV  3\n"] {
            assert_eq!(mask_pairwise(&format!("Query= a\n{line}"), &masks), format!("Query= a\n{line}"), "{line:?}");
        }
    }

    #[test]
    fn formatter_gets_only_formatting_options() {
        let a: Vec<String> = ["-evalue", "1e-5", "-num_alignments", "5", "-seg", "yes", "-html"].iter().map(|s| s.to_string()).collect();
        assert_eq!(format_args(&a), vec!["-num_alignments", "5", "-html"]);
        assert_eq!(base_format("6 qseqid sseqid"), 6);
    }
}
