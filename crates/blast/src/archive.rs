//! BLAST archives (`-outfmt 11`, ASN.1 text): the one output that carries full-precision
//! e-values, so the one output fragments can be merged from exactly.
//!
//! Measured facts this rests on (see `docs/blast.md`): BLAST orders a query's hits by
//! best e-value ascending (exact), then the raw score of the hit's first HSP descending,
//! then the subject's position in the database descending. Fragments are contiguous
//! slices of the database in order, so "later fragment first" breaks exact ties.
//! `blast_formatter` on a merged archive reproduces `blastp -outfmt 6/7` byte for byte;
//! for `-outfmt 0/5` only per-query statistics differ, which `report` restores.
//!
//! The parser is deliberately small: it understands the nesting of braces and quoted
//! strings of ASN.1 text and the few fields it needs, and leaves every Seq-align's text
//! untouched except the query's local id.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::sync::LazyLock;

use memchr::memmem::Finder;

/// Substring finders built once. The agents look for these in every HSP of every
/// archive (about half a million HSPs in a replayed 36-node run), where `str::find`
/// built a two-way searcher per call and then compared byte by byte: 1.4 % of the
/// 2 cores in a profile of that run, under query renumbering and HSP parsing.
static IDS: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"ids {"));
static QUERY_ID: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"local str \"Query_"));
static E_VALUE_ID: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"id str \"e_value\","));
static SCORE_ID: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"id str \"score\","));
static RESULTS_OPEN: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\n  results {"));

/// Where `finder`'s needle (ASCII, so a match starts on a character boundary) first
/// occurs in `text`.
fn find(finder: &Finder, text: &str) -> Option<usize> {
    finder.find(text.as_bytes())
}

/// A problem in an archive's text.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArchiveError {
    #[error("archive has no `{0}` block")]
    MissingBlock(String),
    #[error("unbalanced braces in archive")]
    Unbalanced,
    #[error("alignment without {0}")]
    MissingField(&'static str),
}

/// Locates `name {` at line start with `indent` spaces; returns (start of line, index
/// just past the matching `}`).
pub fn find_block(text: &str, name: &str, indent: usize) -> Result<(usize, usize), ArchiveError> {
    let pat = format!("\n{}{} {{", " ".repeat(indent), name);
    let at = text.find(&pat).ok_or_else(|| ArchiveError::MissingBlock(name.to_string()))?;
    let open = at + pat.len();
    let end = matching_brace(text, open)?;
    Ok((at + 1, end))
}

/// Index just past the `}` closing the block whose body starts at `from` (depth 1).
/// Jumps from brace to brace and over quoted strings (`""` is a quote inside one) with
/// `memchr`: the agents parse every archive a search produces, about 1 GB in a
/// replayed 36-node run, and a byte-at-a-time loop was their largest single cost.
fn matching_brace(text: &str, from: usize) -> Result<usize, ArchiveError> {
    let b = text.as_bytes();
    let mut depth = 1usize;
    let mut i = from;
    while let Some(off) = memchr::memchr3(b'{', b'}', b'"', b.get(i..).unwrap_or_default()) {
        i += off;
        match b[i] {
            b'"' => {
                i = string_end(b, i + 1)?;
                continue;
            }
            b'{' => depth += 1,
            _ => {
                depth -= 1;
                if depth == 0 {
                    return Ok(i + 1);
                }
            }
        }
        i += 1;
    }
    Err(ArchiveError::Unbalanced)
}

/// Index just past the quote closing the string whose text starts at `from`.
fn string_end(b: &[u8], mut from: usize) -> Result<usize, ArchiveError> {
    loop {
        let q = from + memchr::memchr(b'"', b.get(from..).unwrap_or_default()).ok_or(ArchiveError::Unbalanced)?;
        if b.get(q + 1) == Some(&b'"') {
            from = q + 2;
        } else {
            return Ok(q + 1);
        }
    }
}

/// The top-level `{ ... }` elements inside the block body that starts at `from`, and
/// the index just past the `}` closing that block.
fn elements(text: &str, from: usize) -> Result<(Vec<&str>, usize), ArchiveError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = from;
    while i < b.len() {
        match b[i] {
            b'{' => {
                let end = matching_brace(text, i + 1)?;
                out.push(&text[i..end]);
                i = end;
            }
            b'}' => return Ok((out, i + 1)),
            b'"' => i = string_end(b, i + 1)?,
            _ => i += 1,
        }
    }
    Err(ArchiveError::Unbalanced)
}

/// An exact decimal `mantissa × 10^exponent` as ASN.1 text prints reals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Real {
    pub mantissa: u64,
    pub exponent: i32,
}

impl Real {
    pub const ZERO: Real = Real { mantissa: 0, exponent: 0 };

    fn digits(m: u64) -> i32 {
        if m == 0 {
            0
        } else {
            m.ilog10() as i32 + 1
        }
    }
}

impl Ord for Real {
    fn cmp(&self, o: &Self) -> Ordering {
        match (self.mantissa == 0, o.mantissa == 0) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            _ => {}
        }
        // Compare orders of magnitude, then the mantissas padded to equal length.
        let (da, db) = (Self::digits(self.mantissa), Self::digits(o.mantissa));
        let (ma, mb) = (i64::from(da) + i64::from(self.exponent), i64::from(db) + i64::from(o.exponent));
        if ma != mb {
            return ma.cmp(&mb);
        }
        let (mut a, mut b) = (self.mantissa as u128, o.mantissa as u128);
        for _ in da..db {
            a *= 10;
        }
        for _ in db..da {
            b *= 10;
        }
        a.cmp(&b)
    }
}

impl PartialOrd for Real {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

fn parse_real(s: &str) -> Option<Real> {
    let s = s.trim_start();
    if let Some(rest) = s.strip_prefix('{') {
        let inner = &rest[..rest.find('}')?];
        let mut it = inner.split(',').map(|x| x.trim());
        let m: i128 = it.next()?.parse().ok()?;
        let base: i32 = it.next()?.parse().ok()?;
        let e: i32 = it.next()?.parse().ok()?;
        if base != 10 || m < 0 {
            return None;
        }
        // Normalise mantissas beyond u64 (never seen; BLAST prints 15 digits).
        let (mut m, mut e) = (m, e);
        while m > u64::MAX as i128 {
            m /= 10;
            e = e.checked_add(1)?;
        }
        Some(Real { mantissa: m as u64, exponent: e })
    } else if s.starts_with('0') {
        Some(Real::ZERO)
    } else {
        None
    }
}

/// One HSP (Seq-align) of an archive.
#[derive(Clone, Debug)]
pub struct Hsp<'a> {
    pub text: &'a str,
    /// `n` of the query's local id `Query_n`.
    pub query: usize,
    /// The subject's id, as ASN.1 text (identifies the hit).
    pub subject: &'a str,
    pub evalue: Real,
    pub score: i64,
}

/// The value of the score `{ id str "<id>", value ... }` whose `id str "<id>",` is
/// `pat`.
fn score_field<'a>(el: &'a str, pat: &Finder) -> Option<&'a str> {
    let at = find(pat, el)? + pat.needle().len();
    let rest = el[at..].trim_start();
    rest.strip_prefix("value ")
}

fn parse_hsp(el: &str) -> Result<Hsp<'_>, ArchiveError> {
    let ids = find(&IDS, el).ok_or(ArchiveError::MissingField("ids"))?;
    let q = find(&QUERY_ID, &el[ids..]).ok_or(ArchiveError::MissingField("query id"))? + ids + QUERY_ID.needle().len();
    let qend = el[q..].find('"').ok_or(ArchiveError::MissingField("query id"))? + q;
    let query: usize = el[q..qend].parse().map_err(|_| ArchiveError::MissingField("query number"))?;
    // The subject id runs from after the query id's comma to the end of the ids block.
    let after_q = el[qend..].find(',').ok_or(ArchiveError::MissingField("subject id"))? + qend + 1;
    let ids_end = matching_brace(el, ids + "ids {".len())? - 1;
    let subject = el.get(after_q..ids_end).ok_or(ArchiveError::MissingField("subject id"))?.trim();
    let evalue = score_field(el, &E_VALUE_ID)
        .and_then(|v| v.strip_prefix("real"))
        .and_then(parse_real)
        .ok_or(ArchiveError::MissingField("e_value"))?;
    let score = score_field(el, &SCORE_ID)
        .and_then(|v| v.strip_prefix("int "))
        .and_then(|v| v.split(|c: char| !c.is_ascii_digit() && c != '-').next())
        .and_then(|v| v.parse().ok())
        .ok_or(ArchiveError::MissingField("score"))?;
    Ok(Hsp { text: el, query, subject, evalue, score })
}

/// All HSPs of an archive's results, in archive order. A file may hold several archive
/// objects (BLAST+ splits many queries into internal batches; query numbers run on
/// across them); an object without hits has no `alignments` block.
pub fn hsps(text: &str) -> Result<Vec<Hsp<'_>>, ArchiveError> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut found = false;
    // One pass over each results block: its alignments (when it has any, they are its
    // first member) element by element, then the rest of the block to its end.
    while let Some(p) = find(&RESULTS_OPEN, &text[at..]) {
        found = true;
        let open = at + p + RESULTS_OPEN.needle().len();
        let rest = &text[open..];
        let mut i = open;
        if let Some(after) = rest.trim_start().strip_prefix("alignments {") {
            let (els, end) = elements(text, open + rest.len() - after.len())?;
            for el in els {
                out.push(parse_hsp(el)?);
            }
            i = end;
        }
        at = matching_brace(text, i)?;
    }
    if !found {
        return Err(ArchiveError::MissingBlock("results".into()));
    }
    Ok(out)
}

/// A hit: every HSP of one query against one subject, in BLAST's order.
#[derive(Clone, Debug)]
pub struct Hit<'a> {
    pub hsps: Vec<&'a str>,
    pub evalue: Real,
    pub score: i64,
    /// Fragment the hit came from (later fragments hold later OIDs).
    pub fragment: usize,
}

/// Groups HSPs into hits per query (`result[q-1]`), for a batch of `nqueries`.
pub fn hits_by_query<'a>(hsps: &[Hsp<'a>], fragment: usize, nqueries: usize) -> Vec<Vec<Hit<'a>>> {
    let mut out: Vec<Vec<Hit<'a>>> = vec![Vec::new(); nqueries];
    let mut last: Option<(usize, &str)> = None;
    for h in hsps {
        let Some(list) = out.get_mut(h.query.wrapping_sub(1)) else { continue };
        if last == Some((h.query, h.subject)) {
            let hit = list.last_mut().unwrap();
            hit.hsps.push(h.text);
            hit.evalue = hit.evalue.min(h.evalue);
        } else {
            list.push(Hit { hsps: vec![h.text], evalue: h.evalue, score: h.score, fragment });
        }
        last = Some((h.query, h.subject));
    }
    out
}

/// BLAST's order of hits.
pub fn hit_order(a: &Hit, b: &Hit) -> Ordering {
    a.evalue.cmp(&b.evalue).then(b.score.cmp(&a.score)).then(b.fragment.cmp(&a.fragment))
}

/// Merges one query's hit lists from every fragment and keeps the best `k`.
pub fn merge_query<'a>(lists: Vec<Vec<Hit<'a>>>, k: usize) -> Vec<Hit<'a>> {
    let mut all: Vec<Hit<'a>> = lists.into_iter().flatten().collect();
    all.sort_by(hit_order);
    all.truncate(k);
    all
}

/// Rewrites the query's local id `Query_<old>` of an HSP to `Query_<new>`.
pub fn renumber(hsp: &str, new: usize) -> String {
    let ids = find(&IDS, hsp).unwrap_or(0);
    match find(&QUERY_ID, &hsp[ids..]) {
        Some(p) => {
            let s = ids + p + QUERY_ID.needle().len();
            let e = s + hsp[s..].find('"').unwrap_or(0);
            format!("{}{new}{}", &hsp[..s], &hsp[e..])
        }
        None => hsp.to_string(),
    }
}

/// Replaces (or inserts) the results' `alignments` block of `archive` with `hsps`, and
/// names `database` as the subject database.
pub fn with_alignments(archive: &str, hsps: &[String], from_db: &str, database: &str) -> Result<String, ArchiveError> {
    Ok(spliced(archive, hsps, from_db, database)?.into_string())
}

/// [`with_alignments`]'s output as the pieces it is made of, to be written out without
/// first being joined: a batch's merged archive is tens of MB, and joining, splicing
/// and renaming it as strings copied it four times into fresh memory (a quarter of
/// the part writers' own CPU at 36 emulated nodes, most of it page faults).
pub fn spliced<'a>(archive: &'a str, hsps: &'a [String], from_db: &str, database: &str) -> Result<Spliced<'a>, ArchiveError> {
    let (results, results_end) = find_block(archive, "results", 2)?;
    let (head, tail) = match find_block(&archive[results..results_end], "alignments", 4) {
        // The block starts at its line (indentation included): splice the new one in.
        Ok((s, e)) => (Cow::Borrowed(&archive[..results + s]), Cow::Borrowed(&archive[results + e..])),
        Err(_) => {
            let open = results + archive[results..].find('{').unwrap() + 1;
            (Cow::Owned(format!("{}\n", &archive[..open])), Cow::Owned(format!(",{}", &archive[open..])))
        }
    };
    let from = format!("subject database \"{from_db}\"");
    let to = format!("subject database \"{database}\"");
    // The first occurrence in the whole output: in the head if the head holds one (an
    // occurrence that crossed into the body would start after it).
    if let Some(at) = head.find(&from) {
        let head = Cow::Owned(format!("{}{to}{}", &head[..at], &head[at + from.len()..]));
        return Ok(Spliced { head, hsps: Some(hsps), tail });
    }
    let joined = Spliced { head, hsps: Some(hsps), tail }.into_string();
    if !joined.contains(&from) {
        return Err(ArchiveError::MissingBlock(from));
    }
    Ok(Spliced { head: Cow::Owned(joined.replacen(&from, &to, 1)), hsps: None, tail: Cow::Borrowed("") })
}

/// An archive with its alignments replaced (see [`spliced`]).
pub struct Spliced<'a> {
    head: Cow<'a, str>,
    /// The new alignments block's HSPs; `None` when `head` already holds everything.
    hsps: Option<&'a [String]>,
    tail: Cow<'a, str>,
}

impl Spliced<'_> {
    fn for_each_piece(&self, mut f: impl FnMut(&str)) {
        f(&self.head);
        match self.hsps {
            None => {}
            Some([]) => f("    alignments {\n    }"),
            Some(hsps) => {
                f("    alignments {\n      ");
                for (i, h) in hsps.iter().enumerate() {
                    if i > 0 {
                        f(",\n      ");
                    }
                    f(h);
                }
                f("\n    }");
            }
        }
        f(&self.tail);
    }

    fn len(&self) -> usize {
        let mut n = 0;
        self.for_each_piece(|p| n += p.len());
        n
    }

    fn into_string(self) -> String {
        let mut s = String::with_capacity(self.len());
        self.for_each_piece(|p| s.push_str(p));
        s
    }

    /// Writes the archive to `w`, piece by piece (buffer `w`: the pieces are the HSPs).
    pub fn write_to(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        let mut result = Ok(());
        self.for_each_piece(|p| {
            if result.is_ok() {
                result = w.write_all(p.as_bytes());
            }
        });
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `blast_archive` fuzz target: a query id whose comma lies past the
    /// end of the ids block sliced the text backwards. Now it is a missing subject id.
    #[test]
    fn fuzzed_archive_with_the_subject_outside_its_ids_block_is_an_error() {
        let data = include_bytes!("../../../fuzz/regressions/blast_archive/crash-1183af2deea09d21f42a4fd293ee31bbe75f072d");
        let text = String::from_utf8_lossy(data);
        assert!(matches!(hsps(&text), Err(ArchiveError::MissingField("subject id"))), "{:?}", hsps(&text).err());
        let huge = Real { mantissa: 1, exponent: i32::MAX };
        assert_eq!(huge.cmp(&Real { mantissa: 99, exponent: i32::MIN }), Ordering::Greater);
    }

    fn r(m: u64, e: i32) -> Real {
        Real { mantissa: m, exponent: e }
    }

    #[test]
    fn reals_compare_exactly() {
        assert!(r(197073276011232, -52) < r(2, -37));
        assert!(r(1, 2) == r(1, 2));
        assert_eq!(r(1, 2).cmp(&r(100, 0)), Ordering::Equal);
        assert!(r(123456789012345, -20) < r(123456789012346, -20));
        assert!(r(9, -5) < r(1, -4));
        assert!(Real::ZERO < r(1, -300));
        assert_eq!(parse_real(" { 197073276011232, 10, -52 }"), Some(r(197073276011232, -52)));
        assert_eq!(parse_real(" 0,"), Some(Real::ZERO));
    }

    const ARCHIVE: &str = r#"Blast4-archive ::= {
  request {
    body queue-search {
      subject database "stats",
      queries bioseq-set { seq-set { seq { id { local str "Query_1" }, descr { title "a ""quoted"" } brace" } } } }
    }
  },
  results {
    alignments {
      {
        score {
          { id str "score", value int 50 },
          { id str "e_value", value real { 5, 10, -3 } }
        },
        segs denseg { ids { local str "Query_1", gi 11 }, starts { 0, 0 } }
      },
      {
        score {
          { id str "score", value int 40 },
          { id str "e_value", value real { 7, 10, -3 } }
        },
        segs denseg { ids { local str "Query_1", gi 11 }, starts { 5, 5 } }
      },
      {
        score {
          { id str "score", value int 60 },
          { id str "e_value", value real { 1, 10, -3 } }
        },
        segs denseg { ids { local str "Query_2", gi 12 }, starts { 0, 0 } }
      }
    },
    masks {
    }
  }
}
"#;

    #[test]
    fn parses_hsps_groups_hits_and_renumbers() {
        let h = hsps(ARCHIVE).unwrap();
        assert_eq!(h.len(), 3);
        assert_eq!((h[0].query, h[0].subject, h[0].score), (1, "gi 11", 50));
        assert_eq!(h[1].evalue, r(7, -3));
        let hits = hits_by_query(&h, 0, 2);
        assert_eq!(hits[0].len(), 1, "two HSPs of one subject are one hit");
        assert_eq!(hits[0][0].hsps.len(), 2);
        assert_eq!(hits[0][0].evalue, r(5, -3));
        assert_eq!(hits[1][0].score, 60);
        assert!(renumber(h[2].text, 42).contains("local str \"Query_42\", gi 12"));
    }

    /// The parser before it went to one pass per results block (a block search, then
    /// brace matching over results, alignments and each element in turn): the
    /// one-pass parser must find the same HSPs.
    fn hsps_by_blocks(text: &str) -> Result<Vec<Hsp<'_>>, ArchiveError> {
        let mut out = Vec::new();
        let mut at = 0;
        let mut found = false;
        while let Ok((rs, re)) = find_block(&text[at..], "results", 2) {
            found = true;
            let (results, results_end) = (at + rs, at + re);
            if let Ok((s, _)) = find_block(&text[results..results_end], "alignments", 4) {
                let body = text[results + s..].find('{').unwrap() + results + s + 1;
                out.extend(elements(text, body)?.0.into_iter().map(parse_hsp).collect::<Result<Vec<_>, _>>()?);
            }
            at = results_end;
        }
        if !found {
            return Err(ArchiveError::MissingBlock("results".into()));
        }
        Ok(out)
    }

    #[test]
    fn one_pass_finds_what_block_by_block_parsing_finds() {
        let no_hits = ARCHIVE.replace(&ARCHIVE[ARCHIVE.find("    alignments {").unwrap()..ARCHIVE.find("    masks").unwrap()], "");
        let quoted = ARCHIVE.replace("gi 12", "general { db \"x{\"\"}\", tag str \"}\" }");
        let cases = [
            ARCHIVE.to_string(),
            no_hits.clone(),
            quoted.clone(),
            // Several archive objects in one file, one of them without hits.
            format!("{ARCHIVE}{no_hits}{quoted}"),
        ];
        for (n, text) in cases.iter().enumerate() {
            let (one, blocks) = (hsps(text).unwrap(), hsps_by_blocks(text).unwrap());
            assert_eq!(key_of(&one), key_of(&blocks), "case {n}");
        }
        assert_eq!(hsps(&cases[3]).unwrap().len(), 6);
        assert_eq!(hsps(&quoted).unwrap()[2].subject, "general { db \"x{\"\"}\", tag str \"}\" }");
        // Cut anywhere, every prefix is an error or the HSPs of its complete objects.
        for cut in (0..cases[3].len()).step_by(7) {
            let text = &cases[3][..cut];
            match (hsps(text), hsps_by_blocks(text)) {
                (Ok(a), Ok(b)) => assert_eq!(key_of(&a), key_of(&b), "cut at {cut}"),
                (Err(_), _) => {}
                (Ok(a), Err(e)) => panic!("cut at {cut}: {} HSPs where blocks found {e}", a.len()),
            }
        }
    }

    fn key_of<'a>(h: &[Hsp<'a>]) -> Vec<(&'a str, usize, &'a str, Real, i64)> {
        h.iter().map(|h| (h.text, h.query, h.subject, h.evalue, h.score)).collect()
    }

    #[test]
    fn merge_orders_by_evalue_score_then_later_fragment() {
        let mk = |ev: u64, score: i64, fragment: usize| Hit { hsps: vec![], evalue: r(ev, -10), score, fragment };
        let merged = merge_query(vec![vec![mk(1, 50, 0), mk(3, 40, 0)], vec![mk(1, 50, 1), mk(1, 60, 1), mk(2, 10, 1)]], 4);
        let got: Vec<(u64, i64, usize)> = merged.iter().map(|h| (h.evalue.mantissa, h.score, h.fragment)).collect();
        assert_eq!(got, vec![(1, 60, 1), (1, 50, 1), (1, 50, 0), (2, 10, 1)]);
    }

    #[test]
    fn alignments_are_replaced_and_database_renamed() {
        let out = with_alignments(ARCHIVE, &["{ x }".to_string()], "stats", "whole").unwrap();
        assert!(out.contains("subject database \"whole\""));
        assert!(out.contains("    alignments {\n      { x }\n    },\n    masks"), "{out}");
        let h = hsps(&out);
        assert!(h.is_err(), "the placeholder is not an HSP");
        let none = with_alignments(ARCHIVE, &[], "stats", "whole").unwrap();
        assert!(hsps(&none).unwrap().is_empty());
    }

    /// `with_alignments` as it was before it wrote pieces: joined, spliced and renamed
    /// as strings.
    fn joined_as_before(archive: &str, hsps: &[String], from_db: &str, database: &str) -> Result<String, ArchiveError> {
        let body = if hsps.is_empty() {
            "    alignments {\n    }".to_string()
        } else {
            format!("    alignments {{\n      {}\n    }}", hsps.join(",\n      "))
        };
        let (results, results_end) = find_block(archive, "results", 2)?;
        let out = match find_block(&archive[results..results_end], "alignments", 4) {
            Ok((s, e)) => format!("{}{}{}", &archive[..results + s], body, &archive[results + e..]),
            Err(_) => {
                let open = results + archive[results..].find('{').unwrap() + 1;
                format!("{}\n{},{}", &archive[..open], body, &archive[open..])
            }
        };
        let from = format!("subject database \"{from_db}\"");
        if !out.contains(&from) {
            return Err(ArchiveError::MissingBlock(from));
        }
        Ok(out.replacen(&from, &format!("subject database \"{database}\""), 1))
    }

    #[test]
    fn the_spliced_pieces_are_the_archive_joined_as_before() {
        let no_alignments = {
            let (s, e) = find_block(ARCHIVE, "alignments", 4).unwrap();
            format!("{}{}", &ARCHIVE[..s], ARCHIVE[e..].trim_start_matches([',', '\n']))
        };
        // The database named only after the results (not in the request): found there.
        let late_name = ARCHIVE.replacen("subject database \"stats\"", "subject database \"other\"", 1) + "\nsubject database \"stats\"\n";
        let hsp_sets: [Vec<String>; 3] = [vec![], vec!["{ x }".into()], vec!["{ a }".into(), "{ b,\n c }".into(), "{ \"q\" }".into()]];
        for archive in [ARCHIVE.to_string(), no_alignments, late_name] {
            for hsps in &hsp_sets {
                for (from, to) in [("stats", "whole"), ("stats", "stats"), ("absent", "whole")] {
                    let want = joined_as_before(&archive, hsps, from, to).map_err(|e| e.to_string());
                    let got = with_alignments(&archive, hsps, from, to).map_err(|e| e.to_string());
                    assert_eq!(got, want, "{from} -> {to}, {} HSPs", hsps.len());
                    if let Ok(want) = want {
                        let pieces = spliced(&archive, hsps, from, to).unwrap();
                        assert_eq!(pieces.len(), want.len());
                        let mut written = Vec::new();
                        pieces.write_to(&mut written).unwrap();
                        assert_eq!(String::from_utf8(written).unwrap(), want);
                    }
                }
            }
        }
    }
}
