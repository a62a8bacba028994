//! The BLAST plug-in: metadata = which database sequences each query hit.
//!
//! A BLAST report is a deterministic function of (queries, options, database); the hits
//! are a tiny subset of the database. So the compute site records, per query, the
//! global OIDs of its hit subjects (plus the queries, the options and a SHA-256 of the
//! output), and the storage site searches the queries again against only those
//! subjects of its own replica, through an `OIDLIST` alias that keeps the whole
//! database's title, sequence count and length (so statistics, header and footer are
//! those of the whole database) and its volumes (so even the "Posted date" is the
//! same). Nothing is copied out of the replica.
//!
//! Regeneration first searches all queries against the union of their subjects (one
//! BLAST+ run, or one per chunk of queries in parallel, joined). That is exact unless a query's whole-database search overflowed BLAST's
//! preliminary hit list; the output's SHA-256 tells. If it differs, each query is
//! searched against its own subjects and the reports are joined. If that differs too,
//! decoding fails: a different output is never returned.
//!
//! Trade-off: metadata size `x` (here ≈ 2 bytes per hit after compression) against
//! regeneration work; see `docs/paramedic.md` for where it wins (`D − x > B·(f(x) + g(x))`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use gepsea_blast::{db, fasta, tools};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::plugin::{MetadataPlugin, PluginError};

/// What the compute site searched (everything but the output itself).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BlastJob {
    /// The gepsea database directory (`gepsea db format`).
    pub db_dir: PathBuf,
    pub query: PathBuf,
    pub outfmt: String,
    pub blast_args: Vec<String>,
}

/// The metadata of one report.
#[derive(Debug, Serialize, Deserialize)]
struct BlastMeta {
    program: String,
    outfmt: String,
    blast_args: Vec<String>,
    /// The whole database's name (the `-db` of the report).
    db_name: String,
    /// SHA-256 over the database's files: the replica must be the same database.
    db_fingerprint: String,
    /// The query FASTA, as searched.
    #[serde(with = "serde_bytes")]
    queries: Vec<u8>,
    /// Per query (input order), the global OIDs of its hit subjects, ascending.
    subjects: Vec<Vec<u32>>,
    output_len: u64,
    output_sha256: [u8; 32],
}

/// The BLAST plug-in, at the compute site (encodes) or the storage site (decodes).
pub struct BlastPlugin {
    job: Option<BlastJob>,
    replica: PathBuf,
    /// BLAST+ runs of the last `decode` (1: the union search was exact).
    runs: std::sync::atomic::AtomicUsize,
    /// BLAST+ processes at once per regeneration.
    threads: usize,
    per_query: std::sync::atomic::AtomicBool,
}

impl BlastPlugin {
    /// The compute site: encodes reports of `job` (and can decode them too).
    pub fn compute_site(job: BlastJob) -> BlastPlugin {
        BlastPlugin { replica: job.db_dir.clone(), job: Some(job), runs: Default::default(), threads: 1, per_query: Default::default() }
    }

    /// BLAST+ runs the last `decode` needed: one per chunk of queries (see
    /// [`BlastPlugin::with_threads`]) when the search over the union of all subjects was
    /// exact, plus one per query when each query had to be searched on its own.
    pub fn last_runs(&self) -> usize {
        self.runs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the last `decode` had to search each query on its own.
    pub fn last_went_per_query(&self) -> bool {
        self.per_query.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The storage site: regenerates reports from its replica of the database.
    pub fn storage_site(replica: &Path) -> BlastPlugin {
        BlastPlugin { job: None, replica: replica.to_path_buf(), runs: Default::default(), threads: 1, per_query: Default::default() }
    }

    /// Regenerates with up to `threads` BLAST+ processes at once: each searches a
    /// contiguous chunk of the queries (or, in the per-query fallback, one query); their
    /// reports are joined as parallel BLAST joins its parts. (BLAST+'s own `-num_threads` was measured to change the report in 2
    /// of 8 runs on 20 example queries, and `-mt_mode 1` every time: not used.)
    pub fn with_threads(self, threads: usize) -> BlastPlugin {
        BlastPlugin { threads: threads.max(1), ..self }
    }
}

fn bad(m: impl Into<String>) -> PluginError {
    PluginError::BadInput(m.into())
}

fn failed(m: impl std::fmt::Display) -> PluginError {
    PluginError::Failed(m.to_string())
}

/// SHA-256 over every fragment file's checksum in the manifest.
fn fingerprint(m: &db::Manifest) -> String {
    let mut h = Sha256::new();
    for f in &m.fragments {
        for (name, sum) in &f.files {
            h.update(name.as_bytes());
            h.update(sum.as_bytes());
        }
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The database a report says it searched, as BLAST+ was given it (`-db`): formats 7
/// and 5 print it; others print its title, which the replica shares.
fn database_named(report: &str, fmt: u32) -> Option<&str> {
    let (open, close) = match fmt {
        7 => ("# Database: ", "\n"),
        5 => ("<BlastOutput_db>", "</BlastOutput_db>"),
        _ => return None,
    };
    let start = report.find(open)? + open.len();
    Some(&report[start..start + report[start..].find(close)?])
}

/// The identifier fields by which the plug-in reads a tabular report's rows: the query's
/// as the query file names it, the subject's as `blastdbcmd` finds it.
const QUERY_FIELDS: [&str; 3] = ["qseqid", "qacc", "qaccver"];
const SUBJECT_FIELDS: [&str; 3] = ["sseqid", "sacc", "saccver"];

/// Fields whose text may hold any character, the separator of a row included (titles
/// and organism names: 812 of the example database's 20,000 titles hold a comma, which
/// BLAST+ prints unquoted in CSV rows).
const FREE_TEXT_FIELDS: [&str; 10] =
    ["stitle", "salltitles", "ssciname", "sscinames", "scomname", "scomnames", "sblastname", "sblastnames", "sskingdom", "sskingdoms"];

/// The separator of a tabular report's fields: a tab, a comma in CSV (10), or `delim=`'s.
fn tabular_separator(outfmt: &str) -> char {
    let default = if gepsea_blast::report::base_format(outfmt) == 10 { ',' } else { '\t' };
    gepsea_blast::report::separator(outfmt, default)
}

/// Why the plug-in cannot describe a report in `outfmt`, if it cannot. It describes the
/// pairwise and query-anchored reports, XML, tabular output and CSV (0–7, 10), not the
/// organism report (18). Rows must name their query and subject (a field of each of
/// `qseqid qacc qaccver` and `sseqid sacc saccver`, as the default columns do), and where
/// fields are not separated by tabs, name them before any title or organism name: such a
/// field may hold the separator, and the columns after it then move from row to row.
pub fn cannot_describe(outfmt: &str) -> Option<String> {
    let fmt = gepsea_blast::report::base_format(outfmt);
    if fmt > 7 && fmt != 10 {
        return Some(format!("-outfmt {fmt}: BLAST metadata describes formats 0 to 7 and 10"));
    }
    if matches!(fmt, 6 | 7 | 10) {
        return row_columns(outfmt).err();
    }
    None
}

/// The columns of a tabular or CSV `outfmt` that name a row's query and subject, or why
/// they cannot be read ([`cannot_describe`]).
fn row_columns(outfmt: &str) -> Result<(usize, usize), String> {
    let fields = gepsea_blast::report::tabular_fields(outfmt);
    let column = |what: &str, names: &[&str]| {
        fields.iter().position(|f| names.contains(f)).ok_or_else(|| {
            let names = names.join(", ");
            format!(
                "-outfmt \"{outfmt}\": BLAST metadata finds a row's {what} by one of the fields {names}, which the format does not print"
            )
        })
    };
    let columns = (column("query", &QUERY_FIELDS)?, column("subject", &SUBJECT_FIELDS)?);
    let separator = tabular_separator(outfmt);
    if separator != '\t' {
        if let Some(text) = fields[..columns.0.max(columns.1)].iter().find(|f| FREE_TEXT_FIELDS.contains(f)) {
            return Err(format!(
                "-outfmt \"{outfmt}\": BLAST metadata cannot find a row's query and subject after {text}, whose text may hold the separator {separator:?}; print them before it"
            ));
        }
    }
    Ok(columns)
}

/// Per query (by index), the subject accessions the report names, in report order.
fn subjects_in_report(output: &str, outfmt: &str, query_ids: &HashMap<String, usize>, nq: usize) -> Result<Vec<Vec<String>>, PluginError> {
    let mut per: Vec<Vec<String>> = vec![Vec::new(); nq];
    let mut current: Option<usize> = None;
    let mut sections = 0usize;
    // Pairwise: the one-line descriptions list more subjects (-num_descriptions) than
    // get alignments (-num_alignments); 0 = outside, 1 = before its blank line, 2 = in.
    let mut descriptions = 0u8;
    let mut next_section = |line: &str| -> Result<usize, PluginError> {
        sections += 1;
        if sections > nq {
            return Err(bad(format!("the report has more queries than the query file ({nq}); at {line:?}")));
        }
        Ok(sections - 1)
    };
    if let Some(why) = cannot_describe(outfmt) {
        return Err(bad(format!("{why}; use the zstd plug-in")));
    }
    let fmt = gepsea_blast::report::base_format(outfmt);
    // Tabular and CSV: the columns naming the query and the subject (checked above; no
    // other format reads them), and what separates them.
    let columns = row_columns(outfmt).unwrap_or_default();
    let separator = tabular_separator(outfmt);
    // Query-anchored: whether the line is inside an alignment block (after its query
    // line, up to the blank line that ends it).
    let mut in_block = false;
    for (i, line) in output.lines().enumerate() {
        match fmt {
            0..=4 => {
                if line.starts_with("Query= ") {
                    current = Some(next_section(line)?);
                } else if line.starts_with("Sequences producing significant alignments") {
                    descriptions = 1;
                } else if descriptions > 0 {
                    if line.is_empty() {
                        descriptions = if descriptions == 1 { 2 } else { 0 };
                    } else {
                        let q = current.ok_or_else(|| bad(format!("line {}: descriptions before any \"Query=\"", i + 1)))?;
                        per[q].push(line.split_whitespace().next().unwrap_or("").to_string());
                    }
                } else if fmt == 0 {
                    if let Some(rest) = line.strip_prefix('>') {
                        let q = current.ok_or_else(|| bad(format!("line {}: a hit before any \"Query=\"", i + 1)))?;
                        per[q].push(rest.split_whitespace().next().unwrap_or("").to_string());
                    }
                } else if line.trim().is_empty() {
                    in_block = false;
                } else if !in_block {
                    // A block opens with the query's line (`Query_<k>`); with more
                    // alignments than descriptions (`-num_alignments` above
                    // `-num_descriptions`) its subjects' lines name hits the list does not.
                    in_block = matches!(gepsea_blast::report::query_line_label(line), Some((Some(_), _)));
                } else if !line.starts_with(' ') {
                    let q = current.ok_or_else(|| bad(format!("line {}: an alignment before any \"Query=\"", i + 1)))?;
                    per[q].push(line.split_whitespace().next().unwrap_or("").to_string());
                }
            }
            5 => {
                let t = line.trim_start();
                if t.starts_with("<Iteration>") {
                    current = Some(next_section(line)?);
                } else if let Some(rest) = t.strip_prefix("<Hit_accession>") {
                    let q = current.ok_or_else(|| bad(format!("line {}: a hit outside an <Iteration>", i + 1)))?;
                    per[q].push(rest.trim_end_matches("</Hit_accession>").to_string());
                }
            }
            6 | 7 | 10 => {
                if line.starts_with('#') || line.is_empty() {
                    continue;
                }
                let cols: Vec<&str> = line.split(separator).collect();
                let (Some(&qid), Some(&sid)) = (cols.get(columns.0), cols.get(columns.1)) else {
                    return Err(bad(format!("line {}: not a tabular hit line of -outfmt {outfmt:?}", i + 1)));
                };
                let q = *query_ids.get(qid).ok_or_else(|| bad(format!("line {}: query {qid:?} is not in the query file", i + 1)))?;
                if per[q].last().map(String::as_str) != Some(sid) {
                    per[q].push(sid.to_string());
                }
            }
            _ => unreachable!("refused above"),
        }
    }
    Ok(per)
}

/// Global OIDs of `accessions` in the database `name` under `db_dir`.
fn oids(db_dir: &Path, name: &str, dbtype: &str, accessions: &BTreeSet<&str>, scratch: &Path) -> Result<HashMap<String, u32>, PluginError> {
    if accessions.is_empty() {
        return Ok(HashMap::new());
    }
    let list = scratch.join("accessions.txt");
    std::fs::write(&list, accessions.iter().map(|a| format!("{a}\n")).collect::<String>()).map_err(failed)?;
    let db_dir = std::fs::canonicalize(db_dir).map_err(|e| failed(format!("{}: {e}", db_dir.display())))?;
    // Accession and whole identifier: a report names a subject by either (`sacc`,
    // `saccver`, and descriptions; `sseqid`, `tr|A7TBS3|A7TBS3_NEMVE`).
    let out = tools::run(
        "blastdbcmd",
        &["-db", name, "-dbtype", dbtype, "-entry_batch", &list.to_string_lossy(), "-outfmt", "%a\t%i\t%o"],
        Some(db_dir.as_os_str()),
        Some(scratch),
    )
    .map_err(|e| match e {
        // One line per identifier it did not find ("Error: [blastdbcmd] Skipped X").
        tools::ToolError::Failed { stderr, .. } if stderr.contains("Skipped ") => {
            let skipped: Vec<&str> = stderr.lines().filter_map(|l| l.split("Skipped ").nth(1)).collect();
            bad(format!(
                "{} of the report's {} subject identifiers are not in the database {name} (the first: {:?}): was the report searched against it, with this -outfmt?",
                skipped.len(),
                accessions.len(),
                skipped.first().copied().unwrap_or_default()
            ))
        }
        e => failed(e),
    })?;
    let mut map = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut fields = line.split('\t');
        let (Some(acc), Some(id), Some(oid)) = (fields.next(), fields.next(), fields.next()) else {
            return Err(failed(format!("blastdbcmd printed {line:?}")));
        };
        let oid: u32 = oid.trim().parse().map_err(|_| failed(format!("blastdbcmd printed {line:?}")))?;
        // An accession of several sequences keeps its first; the report names it once.
        map.entry(acc.to_string()).or_insert(oid);
        map.entry(id.to_string()).or_insert(oid);
    }
    Ok(map)
}

struct Scratch(PathBuf);
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(tag: &str) -> Result<Scratch, PluginError> {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = gepsea_net::trust::private_scratch(&format!("gepsea-paramedic-{tag}-{}-{n}", std::process::id()))
        .map_err(|e| failed(e.to_string()))?;
    Ok(Scratch(d))
}

/// An `OIDLIST` mask of one volume: its number of sequences (u32, big-endian), then one
/// bit per OID of the volume, the most significant bit of each byte first.
fn oid_mask(total: u64, oids: &BTreeSet<u32>) -> Vec<u8> {
    let mut v = (total as u32).to_be_bytes().to_vec();
    let mut bits = vec![0u8; (total as usize).div_ceil(8)];
    for &o in oids {
        bits[o as usize / 8] |= 0x80 >> (o % 8);
    }
    v.extend_from_slice(&bits);
    v
}

impl BlastPlugin {
    /// Searches `queries` against `subjects` of the replica, as the original search did.
    fn regenerate(&self, m: &BlastMeta, manifest: &db::Manifest, queries: &[u8], subjects: &BTreeSet<u32>) -> Result<Vec<u8>, PluginError> {
        let s = scratch("regen")?;
        let dbdir = s.0.join("db");
        std::fs::create_dir_all(&dbdir).map_err(failed)?;
        let replica = std::fs::canonicalize(&self.replica).map_err(|e| failed(format!("{}: {e}", self.replica.display())))?;
        let letter = gepsea_blast::db::alias_letter(manifest.dbtype);
        // An OIDLIST applies to each volume of its alias's DBLIST with the volume's own
        // numbering: one masked alias per fragment, and the whole-database alias (the
        // report's -db name, title and counts) over those.
        let mut members = Vec::new();
        for f in &manifest.fragments {
            let local: BTreeSet<u32> =
                subjects.range(f.first_oid as u32..(f.first_oid + f.sequences) as u32).map(|o| o - f.first_oid as u32).collect();
            std::fs::write(dbdir.join(format!("{}.msk", f.name)), oid_mask(f.sequences, &local)).map_err(failed)?;
            std::fs::write(
                dbdir.join(format!("{}.sub.{letter}al", f.name)),
                format!("DBLIST {}\nOIDLIST {}.msk\n", replica.join(&f.name).display(), f.name),
            )
            .map_err(failed)?;
            members.push(format!("{}.sub", f.name));
        }
        std::fs::write(
            dbdir.join(format!("{}.{letter}al", m.db_name)),
            format!("TITLE {}\nDBLIST {}\nNSEQ {}\nLENGTH {}\n", manifest.title, members.join(" "), manifest.sequences, manifest.residues),
        )
        .map_err(failed)?;
        let q = s.0.join("queries.fasta");
        std::fs::write(&q, queries).map_err(failed)?;
        let out = s.0.join("report");
        let qs = q.to_string_lossy().into_owned();
        let os = out.to_string_lossy().into_owned();
        let mut args: Vec<&str> = vec!["-query", &qs, "-db", &m.db_name, "-outfmt", &m.outfmt, "-out", &os];
        args.extend(m.blast_args.iter().map(String::as_str));
        tools::run(&m.program, &args, Some(dbdir.as_os_str()), Some(&s.0)).map_err(failed)?;
        std::fs::read(&out).map_err(failed)
    }
}

impl BlastPlugin {
    /// Searches each group of queries against its subjects, `threads` BLAST+ processes
    /// at a time, each thread taking the next group as soon as its last one is done;
    /// the reports, in the groups' order. (Waves of `threads` groups, each waiting for
    /// its slowest, left cores idle behind stragglers: the per-query fallback runs one
    /// short BLAST+ process per query.)
    fn regenerate_each(
        &self,
        m: &BlastMeta,
        manifest: &db::Manifest,
        groups: Vec<(Vec<u8>, &BTreeSet<u32>)>,
    ) -> Result<Vec<Vec<u8>>, PluginError> {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let next = AtomicUsize::new(0);
        let failed_once = AtomicBool::new(false);
        type Slot = parking_lot::Mutex<Option<Result<Vec<u8>, PluginError>>>;
        let reports: Vec<Slot> = groups.iter().map(|_| parking_lot::Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for _ in 0..self.threads.max(1).min(groups.len()) {
                s.spawn(|| {
                    // After a failure the rest is not started: the whole object fails.
                    while !failed_once.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((q, subjects)) = groups.get(i) else { break };
                        let r = self.regenerate(m, manifest, q, subjects);
                        failed_once.fetch_or(r.is_err(), Ordering::Relaxed);
                        *reports[i].lock() = Some(r);
                    }
                });
            }
        });
        let mut parts = Vec::with_capacity(groups.len());
        for r in reports {
            let r = r.into_inner().unwrap_or_else(|| Err(failed("a regeneration was not run after another failed")));
            parts.push(r?);
        }
        Ok(parts)
    }
}

fn matches(m: &BlastMeta, out: &[u8]) -> bool {
    out.len() as u64 == m.output_len && Sha256::digest(out).as_slice() == m.output_sha256
}

impl MetadataPlugin for BlastPlugin {
    fn name(&self) -> &'static str {
        "blast"
    }

    fn encode(&self, output: &[u8]) -> Result<Vec<u8>, PluginError> {
        let job = self.job.as_ref().ok_or_else(|| bad("encoding needs the compute site's job (database, queries, options)"))?;
        let manifest = db::open(&job.db_dir).map_err(failed)?;
        let queries = fasta::read(&job.query).map_err(failed)?;
        let query_bytes = std::fs::read(&job.query).map_err(|e| failed(format!("{}: {e}", job.query.display())))?;
        let fmt = gepsea_blast::report::base_format(&job.outfmt);
        let program = if manifest.dbtype == fasta::MolType::Prot { "blastp" } else { "blastn" };
        // Rows are read by the columns the format names: one BLAST+ left out would
        // shift those after it.
        gepsea_blast::plan::check_tabular_fields(program, &job.outfmt).map_err(|e| bad(e.to_string()))?;
        // Query titles need not be UTF-8 (BLAST+ prints their bytes): the report's lines
        // and the identifiers are read alike, Latin-1 where not UTF-8
        // (`gepsea_blast::text`), so each identifier finds its rows.
        let ids: HashMap<String, usize> =
            queries.iter().enumerate().map(|(i, q)| (gepsea_blast::text::line(q.id()).as_str().to_string(), i)).collect();
        let text = gepsea_blast::text::lines(output);
        if let Some(named) = database_named(&text, fmt).filter(|n| *n != manifest.name) {
            return Err(bad(format!(
                "the report names the database {named:?}, and the one in {} is {:?}: the regenerated report would name that one. \
                 Encode a report searched with --db {} (the database's directory)",
                job.db_dir.display(),
                manifest.name,
                job.db_dir.display()
            )));
        }
        let per = subjects_in_report(&text, &job.outfmt, &ids, queries.len())?;
        let all: BTreeSet<&str> = per.iter().flatten().map(String::as_str).collect();
        let s = scratch("encode")?;
        let map = oids(&job.db_dir, &manifest.name, manifest.dbtype.as_str(), &all, &s.0)?;
        let mut subjects = Vec::with_capacity(per.len());
        for (q, accs) in per.iter().enumerate() {
            let mut v: Vec<u32> = accs
                .iter()
                .map(|a| {
                    map.get(a)
                        .copied()
                        .ok_or_else(|| bad(format!("query {}: subject {a:?} is not in the database {}", q + 1, job.db_dir.display())))
                })
                .collect::<Result<_, _>>()?;
            v.sort_unstable();
            v.dedup();
            subjects.push(v);
        }
        let meta = BlastMeta {
            program: program.into(),
            outfmt: job.outfmt.clone(),
            blast_args: job.blast_args.clone(),
            db_name: manifest.name.clone(),
            db_fingerprint: fingerprint(&manifest),
            queries: query_bytes,
            subjects: delta(&subjects),
            output_len: output.len() as u64,
            output_sha256: Sha256::digest(output).into(),
        };
        let raw = postcard::to_stdvec(&meta).map_err(failed)?;
        zstd::bulk::compress(&raw, 19).map_err(failed)
    }

    fn decode(&self, metadata: &[u8]) -> Result<Vec<u8>, PluginError> {
        let raw = crate::plugin::zstd_decode_bounded(metadata, crate::plugin::MAX_DECODED_METADATA, "BLAST metadata")?;
        let mut m: BlastMeta = postcard::from_bytes(&raw).map_err(|e| bad(format!("BLAST metadata does not decode: {e}")))?;
        m.subjects = undelta(&m.subjects);
        let manifest = db::open(&self.replica).map_err(failed)?;
        if fingerprint(&manifest) != m.db_fingerprint {
            return Err(bad(format!(
                "the replica {} is not the database the compute site searched (its files differ)",
                self.replica.display()
            )));
        }
        if m.subjects.iter().flatten().any(|&o| o as u64 >= manifest.sequences) {
            return Err(bad("a subject OID lies beyond the database"));
        }
        let records = fasta::read_from(&m.queries[..], Path::new("metadata queries")).map_err(failed)?;
        if records.len() != m.subjects.len() {
            return Err(bad(format!("metadata lists {} queries, its query file has {}", m.subjects.len(), records.len())));
        }
        let fmt = gepsea_blast::report::base_format(&m.outfmt);
        let fasta_of = |rs: &[fasta::Record]| {
            let mut q = Vec::new();
            for r in rs {
                r.write_to(&mut q);
            }
            q
        };
        // The queries against the union of all their subjects: one BLAST+ run, or one
        // per chunk of queries, in parallel, joined like parallel BLAST's parts.
        let union: BTreeSet<u32> = m.subjects.iter().flatten().copied().collect();
        let chunks = self.threads.min(records.len()).max(1);
        let out = if chunks == 1 {
            self.regenerate(&m, &manifest, &m.queries, &union)?
        } else {
            let groups =
                (0..chunks).map(|c| (fasta_of(&records[c * records.len() / chunks..(c + 1) * records.len() / chunks]), &union)).collect();
            gepsea_blast::accel::join(&self.regenerate_each(&m, &manifest, groups)?, fmt).map_err(failed)?
        };
        self.runs.store(chunks, std::sync::atomic::Ordering::Relaxed);
        self.per_query.store(false, std::sync::atomic::Ordering::Relaxed);
        if matches(&m, &out) {
            return Ok(out);
        }
        // Some query's whole-database search overflowed its preliminary list: each
        // query against its own subjects, joined the same way.
        let own: Vec<BTreeSet<u32>> = m.subjects.iter().map(|s| s.iter().copied().collect()).collect();
        let groups = records.iter().zip(&own).map(|(r, set)| (fasta_of(std::slice::from_ref(r)), set)).collect();
        let parts = self.regenerate_each(&m, &manifest, groups)?;
        self.runs.store(chunks + records.len(), std::sync::atomic::Ordering::Relaxed);
        self.per_query.store(true, std::sync::atomic::Ordering::Relaxed);
        let joined = gepsea_blast::accel::join(&parts, fmt).map_err(failed)?;
        if matches(&m, &joined) {
            return Ok(joined);
        }
        // The database is checked against its fingerprint and the queries travel in the
        // metadata, so what usually differs is how `encode` was told the search ran.
        let mut how = format!("{} -outfmt \"{}\"", m.program, m.outfmt);
        for a in &m.blast_args {
            how.push(' ');
            how.push_str(a);
        }
        Err(PluginError::Mismatch(format!(
            "the regenerated report ({} bytes) differs from the original ({} bytes); nothing was written. \
             The metadata says the search ran as `{how}`: if it did not, encode the report again with \
             the search's --outfmt and BLAST+ options after `--`",
            joined.len(),
            m.output_len
        )))
    }
}

/// Ascending OIDs as gaps (small numbers: short varints).
fn delta(v: &[Vec<u32>]) -> Vec<Vec<u32>> {
    v.iter().map(|l| l.iter().scan(0u32, |prev, &o| Some(std::mem::replace(prev, o).wrapping_neg().wrapping_add(o))).collect()).collect()
}

fn undelta(v: &[Vec<u32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|l| {
            l.iter()
                .scan(0u32, |acc, &d| {
                    *acc = acc.wrapping_add(d);
                    Some(*acc)
                })
                .collect()
        })
        .collect()
}

/// Sizes of what the plug-in ships, for reports.
pub fn metadata_summary(metadata: &[u8]) -> Option<BTreeMap<&'static str, u64>> {
    let raw = crate::plugin::zstd_decode_bounded(metadata, crate::plugin::MAX_DECODED_METADATA, "BLAST metadata").ok()?;
    let m: BlastMeta = postcard::from_bytes(&raw).ok()?;
    let mut s = BTreeMap::new();
    s.insert("queries", m.subjects.len() as u64);
    s.insert("subjects", m.subjects.iter().map(|l| l.len() as u64).sum());
    s.insert("output_bytes", m.output_len);
    s.insert("metadata_bytes", metadata.len() as u64);
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_round_trip() {
        let v = vec![vec![0, 3, 4, 100, 19_999], vec![], vec![7]];
        assert_eq!(undelta(&delta(&v)), v);
        assert_eq!(delta(&v)[0], vec![0, 3, 1, 96, 19_899]);
    }

    #[test]
    fn the_database_a_report_names() {
        assert_eq!(database_named("# BLASTP 2.12.0+\n# Query: q\n# Database: dir/DB\n", 7), Some("dir/DB"));
        assert_eq!(database_named("<BlastOutput_db>DB</BlastOutput_db>\n", 5), Some("DB"));
        assert_eq!(database_named("Database: Example proteins\n", 0), None, "a title, not a name");
        assert_eq!(database_named("# 0 hits found\n", 7), None);
    }

    #[test]
    fn tabular_rows_are_read_by_their_query_and_subject_columns() {
        let ids = HashMap::from([("q1".to_string(), 0), ("q2".to_string(), 1)]);
        let rows = "1e-5;s1;q1\n1e-3;s1;q1\n2e-3;s2;q1\n1e-9;tr|S3|S3_X;q2\n";
        let per = subjects_in_report(rows, "6 delim=; evalue sacc qseqid", &ids, 2).unwrap();
        assert_eq!(per, [vec!["s1", "s2"], vec!["tr|S3|S3_X"]]);
        let std = "q1\ts1\t90\nq2\ts2\t80\n";
        assert_eq!(subjects_in_report(std, "6", &ids, 2).unwrap(), [vec!["s1"], vec!["s2"]]);
        assert_eq!(subjects_in_report(&format!("# Query: q1\n{std}"), "7 std", &ids, 2).unwrap(), [vec!["s1"], vec!["s2"]]);
        // CSV: commas in a title after the columns read do not move them.
        let csv = "q1,s1,97.5,Protein X, fragment, OS=Y\nq2,s2,50.0,Plain\n";
        assert_eq!(subjects_in_report(csv, "10 qaccver saccver pident stitle", &ids, 2).unwrap(), [vec!["s1"], vec!["s2"]]);
        assert_eq!(subjects_in_report("q1,s1,90\nq2,s2,80\n", "10", &ids, 2).unwrap(), [vec!["s1"], vec!["s2"]]);
    }

    #[test]
    fn formats_it_cannot_describe_say_why() {
        for ok in ["0", "1", "4", "5", "6", "7", "6 qseqid sseqid", "7 sacc qaccver evalue", "6 delim=, std"] {
            assert_eq!(cannot_describe(ok), None, "{ok}");
        }
        let why = |f: &str| cannot_describe(f).unwrap();
        for ok in ["10", "10 qaccver saccver stitle", "10 sseqid qseqid scomnames evalue", "6 delim=, qacc sacc salltitles"] {
            assert_eq!(cannot_describe(ok), None, "{ok}");
        }
        assert!(why("18").contains("describes formats 0 to 7 and 10"), "{}", why("18"));
        // A title before the query or subject moves them in rows whose title holds the
        // separator; with tabs it cannot.
        for (f, text) in [("10 qaccver stitle saccver", "stitle"), ("6 delim=, sscinames sacc qacc", "sscinames")] {
            assert!(why(f).contains(&format!("cannot find a row's query and subject after {text}")), "{}", why(f));
        }
        assert_eq!(cannot_describe("6 qaccver stitle saccver"), None);
        assert!(
            why("6 qseqid evalue").contains("a row's subject by one of the fields sseqid, sacc, saccver"),
            "{}",
            why("6 qseqid evalue")
        );
        assert!(why("7 sseqid evalue").contains("a row's query by one of the fields qseqid, qacc, qaccver"));
        // Refused before any row is read, by encoding too.
        assert!(subjects_in_report("", "6 evalue", &HashMap::new(), 0).is_err());
    }

    #[test]
    fn mask_sets_one_bit_per_oid_msb_first() {
        let m = oid_mask(20, &[0, 9, 19].into_iter().collect());
        assert_eq!(m, vec![0, 0, 0, 20, 0b1000_0000, 0b0100_0000, 0b0001_0000]);
    }
}
