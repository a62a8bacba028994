//! The job's plan, shared by every role (master, worker, agent plug-in): how a search
//! is cut (by queries or by fragments), into which batches, with which BLAST+ options,
//! and the names that identify its pieces (tasks, batch files, part keys, the job's
//! topic). It does no I/O beyond hashing; the roles depend on it, not on each other.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gepsea_agent::plugin::PluginError;
use serde::{Deserialize, Serialize};

use crate::db::Manifest;
use crate::error::SearchError;
use crate::fasta::{MolType, Record};
use crate::report::{self};

mod options;
pub use options::{check_blast_args, check_outfmt, check_tabular_fields, whole_database_option, REPRODUCED_FORMATS};

/// How a search is cut into tasks.
///
/// By **fragments** (mpiBLAST's database segmentation): a task is (query batch,
/// fragment), each query's hits are merged from its fragments, and a query whose
/// whole-database search might have overflowed BLAST's preliminary hit list is searched
/// again on the whole database. A node only ever needs the fragments it searches.
///
/// By **queries** (query segmentation): a task is one query batch searched on the whole
/// database, written straight in the report's format. Exact by construction — nothing
/// to merge, nothing that can overflow differently — and less BLAST+ work: measured on
/// the example data (100 queries, 4 fragments), the four fragment searches took 9.8 %
/// more CPU than one whole-database search, and the overflow guard re-searched 4
/// queries (another 11 %). Every worker reads the whole database, so it suits a
/// database that one node holds, with enough queries to keep every worker busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SplitBy {
    Fragments,
    Queries,
}

impl std::fmt::Display for SplitBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SplitBy::Fragments => "fragments",
            SplitBy::Queries => "queries",
        })
    }
}

/// Queries per worker from which `--split auto` cuts by queries.
pub const AUTO_QUERIES_PER_WORKER: usize = 4;

/// The (query, database) molecule types of a BLAST+ search program.
pub fn program_types(program: &str) -> Option<(MolType, MolType)> {
    use MolType::*;
    match program {
        "blastp" => Some((Prot, Prot)),
        "blastn" => Some((Nucl, Nucl)),
        "blastx" => Some((Nucl, Prot)),
        "tblastn" => Some((Prot, Nucl)),
        "tblastx" => Some((Nucl, Nucl)),
        _ => None,
    }
}

/// Programs that translate the query or the database. Split by queries they are exact
/// by construction (each task is a serial BLAST+ run on the whole database); the merge
/// of fragments is not proven for them, so they are searched by queries only.
pub fn is_translated(program: &str) -> bool {
    matches!(program, "blastx" | "tblastn" | "tblastx")
}

/// The split a search uses: `requested`, or — when `None` — by queries on one machine
/// with at least [`AUTO_QUERIES_PER_WORKER`] queries per worker, by fragments otherwise
/// (few queries need the fragments' extra parallelism; on a cluster the fragments let a
/// node hold only part of the database, and the no-agent baseline is mpiBLAST's own
/// fragment search).
pub fn choose_split(
    requested: Option<SplitBy>,
    one_machine: bool,
    no_agent: bool,
    queries: usize,
    workers: usize,
    program: &str,
    whole_database: Option<(&'static str, &'static str)>,
) -> Result<SplitBy, SearchError> {
    if let Some((option, why)) = whole_database {
        return match requested {
            Some(SplitBy::Fragments) => Err(SearchError::OptionByFragments { option, why }),
            _ if no_agent => Err(SearchError::OptionWithoutAgents { option, why }),
            _ => Ok(SplitBy::Queries),
        };
    }
    if is_translated(program) {
        return match requested {
            Some(SplitBy::Fragments) => Err(SearchError::TranslatedByFragments(program.to_string())),
            _ if no_agent => Err(SearchError::QuerySplitWithoutAgents),
            _ => Ok(SplitBy::Queries),
        };
    }
    match requested {
        Some(SplitBy::Queries) if no_agent => Err(SearchError::QuerySplitWithoutAgents),
        Some(s) => Ok(s),
        None if one_machine && !no_agent && queries >= AUTO_QUERIES_PER_WORKER * workers.max(1) => Ok(SplitBy::Queries),
        None => Ok(SplitBy::Fragments),
    }
}

/// BLAST+'s own query batch for `program` (letters; `GetQueryBatchSize` in BLAST+
/// 2.12): a serial run concatenates queries up to this size per database scan. A task of
/// a query split stays within it, because bigger concatenations change results (measured:
/// `BATCH_SIZE=20000` made blastp report other HSPs for one of 100 example queries).
pub fn blast_batch_letters(program: &str, blast_args: &[String]) -> usize {
    match program {
        "blastn" => match option_value(blast_args, "-task").unwrap_or("megablast") {
            "megablast" => 5_000_000,
            "dc-megablast" => 500_000,
            _ => 100_000,
        },
        "tblastn" => 20_000,
        "blastx" | "tblastx" => 10_002,
        _ => 10_000,
    }
}

/// The name of each batch's finished part: a SHA-256 of everything that decides its
/// bytes — the database (its manifest: checksums and sizes, or an existing database's
/// `-info`), program, output format, BLAST+ options, split, the batch's queries as
/// written, and the versions of gepsea's parts and of BLAST+ (`versions`). A rerun of
/// the same search finds the parts an interrupted run finished; a changed database,
/// query, option or BLAST+ (a multi-day job's rerun after a system upgrade) names other
/// parts, so nothing stale is reused and one output never mixes two BLAST+ versions.
pub fn part_keys(
    versions: &str,
    manifest: &Manifest,
    program: &str,
    outfmt: &str,
    blast_args: &[String],
    split: SplitBy,
    batches: &[Vec<u8>],
) -> Vec<String> {
    use sha2::{Digest, Sha256};
    let mut common = Sha256::new();
    // Raised whenever a fix changes what a part holds: 2 since parts searched by
    // fragments with `-num_alignments` kept too few hits (fixed in 35bec0e).
    common.update(b"gepsea part 2\0");
    common.update(versions.as_bytes());
    common.update(b"\0");
    common.update(serde_json::to_vec(manifest).expect("a manifest serialises"));
    for s in [program, outfmt, &split.to_string()] {
        common.update(s.as_bytes());
        common.update(b"\0");
    }
    for a in blast_args {
        common.update(a.as_bytes());
        common.update(b"\0");
    }
    batches
        .iter()
        .map(|b| {
            let mut h = common.clone();
            h.update(b);
            format!("{:x}", h.finalize())[..32].to_string()
        })
        .collect()
}

/// BLAST+'s own query batches: it reads queries into a batch until their letters reach
/// `cap` (the query that reaches it is the batch's last; measured with `BATCH_SIZE` on
/// tblastx: a first query of 171 letters is a batch of its own at 171 and shares one at
/// 172). A task per batch runs exactly the searches a serial run does; translated
/// searches need that, since their results depend on which queries share a batch
/// (tblastx: two queries searched apart report other hits than together).
pub fn blast_batches(queries: &[Record], cap: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut acc) = (0, 0);
    for (i, q) in queries.iter().enumerate() {
        acc += q.residues;
        if acc >= cap {
            out.push(start..i + 1);
            start = i + 1;
            acc = 0;
        }
    }
    if start < queries.len() {
        out.push(start..queries.len());
    }
    out
}

/// Query batches for a split by queries: contiguous, in input order, none above `cap`
/// letters, each about 1/(2W) of the letters still left (guided self-scheduling), but
/// no smaller than a quarter of `cap` or 1/W of all letters (`W` = `workers`), and a
/// remainder under half that floor joins the batch before it. Tasks are handed out in this
/// order, so the long ones go first and the short ones at the end let the workers finish
/// together, while each extra task costs one more BLAST+ start and database scan (about
/// 0.1 s of CPU on the example data). Measured with 100 example queries and W = 2 (wall
/// time against `blastp -num_threads 2` in the same round, worker time in BLAST+): 5
/// batches of 10,000 letters 0.94–1.01, 97.1–99.1 %; these 10 batches 0.955–1.062,
/// 99.0–99.4 %; 13 smaller ones 0.96–1.08, 99.0–99.7 %. With 20 queries (7,888
/// letters) these 3 batches took 1.81–1.87 s where 12 batches of 1/(8W) of the letters
/// took 2.20–2.30 s (`blastp -num_threads 2`: 1.72–1.83 s).
pub fn guided_batches(queries: &[Record], workers: usize, cap: usize) -> Vec<std::ops::Range<usize>> {
    let w = workers.max(1);
    let total: usize = queries.iter().map(|q| q.residues).sum();
    let cap = cap.max(1);
    let floor = (cap / 4).min(total / w).max(1);
    let mut out = Vec::new();
    let (mut start, mut left) = (0, total);
    while start < queries.len() {
        let target = (left / (2 * w)).clamp(floor, cap);
        let mut end = start;
        let mut acc = 0;
        while end < queries.len() && (end == start || acc + queries[end].residues <= target) {
            acc += queries[end].residues;
            end += 1;
        }
        // A remainder under half the floor would be a task that costs mostly its BLAST+
        // start: it goes with this batch when both fit in BLAST+'s batch.
        if left - acc < floor / 2 && left <= cap {
            acc = left;
            end = queries.len();
        }
        out.push(start..end);
        left -= acc;
        start = end;
    }
    out
}

/// Splits queries into contiguous batches of about `per_batch` residues.
pub fn batches(queries: &[Record], per_batch: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut acc = 0;
    for (i, q) in queries.iter().enumerate() {
        if acc > 0 && acc + q.residues > per_batch {
            out.push(start..i);
            start = i;
            acc = 0;
        }
        acc += q.residues;
    }
    out.push(start..queries.len());
    out
}

/// Whether BLAST+ cannot compute Karlin-Altschul statistics for query `q` of type
/// `moltype`: it has no residues, or only unknown ones (`X` in a protein, `N` in a
/// nucleotide sequence, stops and gaps aside). BLAST+ reports such a query with no hits,
/// and prints its pairwise report's statistics block by the batch it is searched in: none
/// when another query of that batch has statistics, else one of `-1.00`s.
pub fn without_statistics(q: &Record, moltype: MolType) -> bool {
    let unknown = if moltype == MolType::Prot { [b'X', b'x'] } else { [b'N', b'n'] };
    q.letters().all(|b| unknown.contains(&b) || matches!(b, b'*' | b'-'))
}

/// `ranges` with every batch none of whose queries has statistics
/// ([`without_statistics`]: empty ones, all `X`) joined to the batch before it (leading
/// ones to the first batch after them). Serial BLAST+ searches them in its batches of
/// 10,000 letters with their neighbours, and a batch cut by letters could hold them
/// alone: a run of only empty queries fails ("BLAST engine error: Warning: Sequence
/// contains no data"), and one of only such queries prints `-1.00` statistics blocks
/// where serial BLAST+ prints none.
pub fn join_batches_without_statistics(
    ranges: Vec<std::ops::Range<usize>>,
    queries: &[Record],
    moltype: MolType,
) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::with_capacity(ranges.len());
    let mut leading: Option<usize> = None;
    for r in ranges {
        if queries[r.clone()].iter().all(|q| without_statistics(q, moltype)) {
            match out.last_mut() {
                Some(last) => last.end = r.end,
                None => leading = Some(leading.unwrap_or(r.start)),
            }
        } else {
            out.push(leading.take().unwrap_or(r.start)..r.end);
        }
    }
    // Only when no query has statistics.
    if let Some(start) = leading {
        out.push(start..queries.len());
    }
    out
}

/// BLAST's preliminary hit-list size for a final list of `k` (see `docs/blast.md`).
pub fn preliminary_list(k: usize, composition_stats: bool) -> usize {
    if composition_stats {
        if k <= 500 {
            1050
        } else {
            2 * k + 50
        }
    } else {
        (2 * k).min(k + 50)
    }
}

/// The overflow guard: whether a query whose hits were split over `fragments`
/// fragments — `total` hits in all, at most `largest` from one fragment — may have lost
/// candidates in a whole-database search, where BLAST keeps only `prelim` of them
/// before rescoring. Such a query is searched again on the whole database.
pub fn may_overflow(fragments: usize, total: u64, largest: usize, prelim: usize, k: usize) -> bool {
    fragments > 1 && (total.saturating_mul(4) >= prelim as u64 || largest >= k)
}

pub(crate) fn option_value<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(|s| s.as_str())
}

/// The number of hits BLAST keeps per query for these options and format:
/// `-max_target_seqs`; else, for the reports (formats 0 to 4), the larger of
/// `-num_descriptions` (500) and `-num_alignments` (250); else (tabular, XML, archives)
/// `-num_alignments`, which BLAST+ then reads as the number of hits (500 without it;
/// `-num_descriptions` is ignored there).
pub fn hitlist_size(args: &[String], outfmt: &str) -> usize {
    if let Some(v) = option_value(args, "-max_target_seqs").and_then(|v| v.parse().ok()) {
        return v;
    }
    let a: Option<usize> = option_value(args, "-num_alignments").and_then(|v| v.parse().ok());
    if report::base_format(outfmt) <= 4 {
        let d: usize = option_value(args, "-num_descriptions").and_then(|v| v.parse().ok()).unwrap_or(500);
        return d.max(a.unwrap_or(250));
    }
    a.unwrap_or(500)
}

/// The options of a search whose archive (`-outfmt 11`) is to be merged into a report
/// in format `outfmt`: the user's options, with the number of hits kept given as
/// `-max_target_seqs` where the user gave it through the display options
/// (`-num_descriptions`, `-num_alignments`). BLAST+ reads those by the output format,
/// and an archive search would keep `-num_alignments` hits where a serial search for a
/// report keeps as many as both lists show. Unchanged without them.
pub fn archive_args(args: &[String], outfmt: &str) -> Vec<String> {
    const DISPLAY_COUNTS: [&str; 2] = ["-num_descriptions", "-num_alignments"];
    if !args.iter().any(|a| DISPLAY_COUNTS.contains(&a.as_str())) {
        return args.to_vec();
    }
    let k = hitlist_size(args, outfmt);
    if k == 0 {
        // BLAST+ refuses it ("No hits are being saved"), as it would the serial search.
        return args.to_vec();
    }
    let mut out = Vec::with_capacity(args.len());
    let mut i = 0;
    while i < args.len() {
        if DISPLAY_COUNTS.contains(&args[i].as_str()) {
            i += 2;
            continue;
        }
        out.push(args[i].clone());
        i += 1;
    }
    out.extend(["-max_target_seqs".to_string(), k.to_string()]);
    out
}

/// How the merging and writing of batches is spread over the agents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum MergeAssign {
    /// The load balancer places each batch on the agent with the fewest batches placed
    /// and not yet written (the one holding its first result, on a tie).
    #[default]
    Dynamic,
    /// Batch `b` goes to the `b mod n`-th live agent.
    Static,
    /// One agent (the lowest node) merges and writes everything.
    Single,
}

/// Everything the agents need to know about a job (in `job.json` in the job directory).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobSpec {
    pub id: String,
    pub program: String,
    /// The directory of gepsea's files for the database: the formatted database, or an
    /// existing database's side directory (see [`crate::db`]).
    pub db_dir: PathBuf,
    /// `BLASTDB` for every BLAST+ run of the job ([`crate::db::Database::blastdb`]).
    pub blastdb: String,
    pub db_name: String,
    pub outfmt: String,
    pub blast_args: Vec<String>,
    /// Hits kept per query.
    pub k: usize,
    /// BLAST's preliminary hit-list size for this search.
    pub prelim: usize,
    pub fragments: Vec<String>,
    /// Global query range of each batch.
    pub batches: Vec<(usize, usize)>,
    /// Tasks per (batch, fragment), merged by the agents; or per batch on the whole
    /// database, whose output is the batch's part as it stands.
    pub split: SplitBy,
    /// Split by queries: the number of last tasks that run BLAST+ with that many threads
    /// (the workers on one machine); 0 or 1: none.
    pub tail_threads: usize,
    pub compress: bool,
    pub assign: MergeAssign,
    /// Stage fragments in node-local scratch through the agents (hot-swap); off: search
    /// them in `db_dir` in place.
    pub hot_swap: bool,
    /// Hot-swap: bytes of staged fragments each node keeps in its scratch; staging one
    /// more removes the least recently used ones not being searched (see
    /// `accel::scratch`). `None`: staged fragments stay until the agent stops.
    #[serde(default)]
    pub scratch_bytes: Option<u64>,
    /// SHA-256 of each file a search of a fragment reads, by file name (from the
    /// manifest), per fragment.
    pub fragment_files: Vec<BTreeMap<String, String>>,
    /// Where each batch's finished part goes: in the work directory, named by a hash of
    /// everything that decides its contents, so that a rerun finds it (resume).
    pub parts: Vec<PathBuf>,
    /// Search runs are recorded or replayed ([`crate::replay`]).
    #[serde(default)]
    pub recording: Option<crate::replay::Recording>,
    /// Ship each part to a storage site as soon as it is written ([`crate::ship`]).
    #[serde(default)]
    pub ship: Option<crate::ship::ShipParts>,
}

impl JobSpec {
    /// What writing a report of `queries` needs, working in `scratch`.
    pub(crate) fn report_spec<'a>(&'a self, queries: &'a Path, scratch: &'a Path) -> crate::report::Spec<'a> {
        crate::report::Spec {
            program: &self.program,
            blastdb: self.blastdb.as_ref(),
            db_name: &self.db_name,
            queries,
            outfmt: &self.outfmt,
            blast_args: &self.blast_args,
            scratch,
        }
    }

    /// Batch `batch`'s finished part.
    pub(crate) fn part(&self, batch: usize) -> Result<&Path, PluginError> {
        self.parts.get(batch).map(|p| p.as_path()).ok_or_else(|| PluginError::BadRequest(format!("no batch {batch}")))
    }
}

/// A temporary name next to `part` (same file system, so the rename into place is
/// atomic), unique to this process and `tag`.
pub fn part_tmp(part: &Path, tag: &str) -> PathBuf {
    let name = part.file_name().unwrap_or_default().to_string_lossy();
    part.with_file_name(format!(".{name}.{}-{tag}.tmp", std::process::id()))
}

/// What workers take from the load balancer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum TaskPayload {
    Fragment {
        job: PathBuf,
        batch: usize,
        fragment: usize,
        attempt: u8,
    },
    /// Re-search `queries` (global indices) of `batch` on the whole database.
    Whole {
        job: PathBuf,
        batch: usize,
        queries: Vec<usize>,
        attempt: u8,
    },
    /// Split by queries: search `batch` on the whole database in the report's format;
    /// the output is the batch's part. `threads` > 1: BLAST+ runs with that many
    /// threads (the last tasks, see `accel::master::submit_tasks`).
    Batch {
        job: PathBuf,
        batch: usize,
        attempt: u8,
        threads: usize,
    },
    Stop,
}

impl TaskPayload {
    pub(crate) fn describe(&self, spec: &JobSpec) -> String {
        match self {
            TaskPayload::Fragment { batch, fragment, .. } => {
                format!("batch {batch} on fragment {}", spec.fragments.get(*fragment).map_or("?", |s| s.as_str()))
            }
            TaskPayload::Whole { queries, .. } => format!("{} queries on the whole database", queries.len()),
            TaskPayload::Batch { batch, .. } => format!("batch {batch} on the whole database"),
            TaskPayload::Stop => "stop".into(),
        }
    }
}

pub fn topic(job_id: &str) -> String {
    format!("blast/{job_id}")
}

pub fn batch_file(job: &Path, batch: usize) -> PathBuf {
    job.join(format!("batch{batch}.fasta"))
}

/// Where the statistics runs of batch `batch`'s report are kept when they were run
/// ahead of its results (`crate::report::Statistics::save`).
pub(crate) fn stats_dir(job: &Path, batch: usize) -> PathBuf {
    job.join(format!("stats{batch}"))
}

pub(crate) fn whole_file(job: &Path, batch: usize, first: usize) -> PathBuf {
    job.join(format!("whole-{batch}-{first}.fasta"))
}

/// How a batch's queries that need a whole-database search are cut into tasks: one
/// query per task. They are the heaviest queries, so a task of several would be a
/// serial tail; the agents start each as soon as its fragments' counts trip the guard
/// (`accel::hits::BatchMerge::new_overflows`), before the batch's other queries are
/// known; and the cut is the same in both architectures and every run, so that a
/// recording of one run holds the searches of any other ([`crate::replay`]). A search
/// costs BLAST+'s start (≈0.07 s on the example database) once per query instead of
/// once per piece.
pub fn fallback_chunks(risky: &[usize]) -> std::slice::Chunks<'_, usize> {
    risky.chunks(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_without_statistics_joins_a_neighbour() {
        let q = |seqs: &[&str]| -> Vec<Record> {
            let rec = |(i, s): (usize, &&str)| Record {
                defline: format!(">q{i}").into_bytes(),
                lines: if s.is_empty() { Vec::new() } else { vec![s.to_string()] },
                residues: s.len(),
                line: i + 1,
            };
            seqs.iter().enumerate().map(rec).collect()
        };
        let queries = q(&["", "XX*X", "MKVLA", "MKVLA", "", "MKVLA", "", "xx-x"]);
        let lacking: Vec<bool> = queries.iter().map(|r| without_statistics(r, MolType::Prot)).collect();
        assert_eq!(lacking, [true, true, false, false, true, false, true, true]);
        assert!(!without_statistics(&q(&["NNNN"])[0], MolType::Prot) && without_statistics(&q(&["NNnN"])[0], MolType::Nucl));
        let joined = join_batches_without_statistics((0..8).map(|i| i..i + 1).collect(), &queries, MolType::Prot);
        assert_eq!(joined, [0..3, 3..5, 5..8]);
        // Batches cut by letters: such a query never costs one of its own.
        assert_eq!(join_batches_without_statistics(batches(&queries, 5), &queries, MolType::Prot), [0..3, 3..5, 5..8]);
        assert_eq!(
            join_batches_without_statistics(vec![0..4, 4..8], &queries, MolType::Prot),
            [0..4, 4..8],
            "a batch with statistics stays"
        );
    }

    #[test]
    fn a_part_is_named_by_everything_that_decides_its_bytes_the_versions_included() {
        let manifest = Manifest {
            format_version: 1,
            name: "db".into(),
            dbtype: crate::fasta::MolType::Prot,
            title: "db".into(),
            blast_version: "2.12.0+".into(),
            sequences: 2,
            residues: 40,
            fragments: Vec::new(),
            external: None,
        };
        let batches = [b">q1\nMKV\n".to_vec(), b">q2\nMKW\n".to_vec()];
        let keys = |versions: &str, args: &[String]| part_keys(versions, &manifest, "blastp", "0", args, SplitBy::Fragments, &batches);
        let now = keys("gepsea 0.1.0 BLAST+ 2.12.0+", &[]);
        assert_eq!(now.len(), 2);
        assert_ne!(now[0], now[1]);
        assert_eq!(now, keys("gepsea 0.1.0 BLAST+ 2.12.0+", &[]), "a rerun finds the same parts");
        for other in [
            keys("gepsea 0.1.0 BLAST+ 2.16.0+", &[]),
            keys("gepsea 0.2.0 BLAST+ 2.12.0+", &[]),
            keys("gepsea 0.1.0 BLAST+ 2.12.0+", &["-evalue".into(), "1".into()]),
        ] {
            assert!(other.iter().all(|k| !now.contains(k)), "{other:?}");
        }
    }

    #[test]
    fn the_overflow_guard_needs_a_split_and_many_hits_or_one_full_fragment() {
        // A quarter of the preliminary list over all fragments, or k from one.
        assert!(may_overflow(2, 250, 10, 1000, 500));
        assert!(!may_overflow(2, 249, 10, 1000, 500));
        assert!(may_overflow(8, 20, 5, 1000, 5));
        // One fragment is the whole database: nothing to lose.
        assert!(!may_overflow(1, 10_000, 10_000, 1000, 500));
        // Counts near the top do not wrap around.
        assert!(may_overflow(3, u64::MAX, 0, usize::MAX, usize::MAX));
    }

    #[test]
    fn fallbacks_are_one_query_per_task() {
        let sizes = |n: usize| fallback_chunks(&(0..n).collect::<Vec<_>>()).map(|c| c.len()).collect::<Vec<_>>();
        assert_eq!(sizes(10), [1; 10]);
        assert_eq!(sizes(3), [1, 1, 1]);
        assert_eq!(sizes(0), Vec::<usize>::new());
    }

    fn recs(lengths: &[usize]) -> Vec<Record> {
        lengths
            .iter()
            .enumerate()
            .map(|(i, &n)| Record { defline: format!(">q{i}").into_bytes(), lines: vec!["M".repeat(n)], residues: n, line: 2 * i + 1 })
            .collect()
    }

    #[test]
    fn guided_batches_cover_every_query_in_order_and_shrink_within_the_cap() {
        let lengths: Vec<usize> = (0..100).map(|i| 200 + (i * 37) % 700).collect();
        let qs = recs(&lengths);
        let total: usize = lengths.iter().sum();
        for workers in [1, 2, 4, 16] {
            let b = guided_batches(&qs, workers, 10_000);
            assert_eq!(b.first().unwrap().start, 0);
            assert_eq!(b.last().unwrap().end, qs.len());
            assert!(b.windows(2).all(|w| w[0].end == w[1].start), "contiguous");
            let size = |r: &std::ops::Range<usize>| -> usize { lengths[r.clone()].iter().sum() };
            assert!(b.iter().all(|r| !r.is_empty() && (r.len() == 1 || size(r) <= 10_000)), "within BLAST+'s batch");
            // Enough tasks for every worker.
            assert!(b.len() >= 2 * workers.min(8), "{workers} workers: {} batches", b.len());
            // The first no smaller than the last, but for a remainder joined to it.
            let floor = (total / workers).min(10_000 / 4);
            let (first, last) = (size(&b[0]), size(b.last().unwrap()));
            assert!(first >= last || last < floor * 3 / 2, "{workers} workers: first {first} < last {last}");
            // No batch under the floor but a remainder too big to join the one before it.
            assert!(b[..b.len() - 1].iter().all(|r| size(r) + lengths[r.end] > floor), "{workers} workers");
            let last = b.len() - 1;
            assert!(size(&b[last]) >= floor / 2 || size(&b[last - 1]) + size(&b[last]) > 10_000, "{workers} workers: remainder");
        }
        // A small job: few tasks, each worth a BLAST+ start (floor 2,500 letters), the
        // 800-letter remainder joined to the last.
        assert_eq!(guided_batches(&recs(&[400; 20]), 2, 10_000), vec![0..6, 6..12, 12..20]);
        // Fewer letters than W floors: one batch per worker's share.
        assert_eq!(guided_batches(&recs(&[100; 10]), 2, 10_000), vec![0..5, 5..10]);
        // A query longer than the cap is a batch of its own.
        let b = guided_batches(&recs(&[50, 20_000, 50]), 2, 10_000);
        assert_eq!(b, vec![0..1, 1..2, 2..3]);
    }

    #[test]
    fn auto_split_is_by_queries_on_one_machine_with_enough_queries() {
        use SplitBy::*;
        assert_eq!(choose_split(None, true, false, 8, 2, "blastp", None).unwrap(), Queries);
        assert_eq!(choose_split(None, true, false, 7, 2, "blastp", None).unwrap(), Fragments);
        assert_eq!(choose_split(None, false, false, 500, 2, "blastp", None).unwrap(), Fragments, "a cluster");
        assert_eq!(choose_split(None, true, true, 500, 2, "blastp", None).unwrap(), Fragments, "the no-agent baseline");
        assert_eq!(choose_split(Some(Fragments), true, false, 500, 2, "blastp", None).unwrap(), Fragments);
        assert_eq!(choose_split(Some(Queries), false, false, 1, 8, "blastp", None).unwrap(), Queries);
        assert!(matches!(choose_split(Some(Queries), true, true, 500, 2, "blastp", None), Err(SearchError::QuerySplitWithoutAgents)));
        // Translated searches: by queries, wherever they run.
        assert_eq!(choose_split(None, false, false, 1, 8, "blastx", None).unwrap(), Queries);
        assert!(matches!(choose_split(Some(Fragments), true, false, 500, 2, "tblastn", None), Err(SearchError::TranslatedByFragments(_))));
        assert!(matches!(choose_split(None, true, true, 500, 2, "tblastx", None), Err(SearchError::QuerySplitWithoutAgents)));
    }

    #[test]
    fn formats_gepsea_does_not_reproduce_are_refused() {
        for f in ["0", "1", "2", "3", "4", "5", "6 qseqid sseqid", "7", "10", "18", "99", "x"] {
            assert!(check_outfmt(f, &[]).is_ok(), "{f}");
        }
        for f in ["8", "9", "11", "12", "13", "14", "15", "16", "17"] {
            assert!(matches!(check_outfmt(f, &[]), Err(SearchError::OutfmtNotReproduced(_))), "{f}");
        }
        let html = ["-html".to_string()];
        for f in ["0", "1", "4"] {
            assert!(matches!(check_outfmt(f, &html), Err(SearchError::HtmlNotReproduced)), "{f}");
        }
        assert!(check_outfmt("6", &html).is_ok() && check_outfmt("5", &html).is_ok(), "-html changes nothing there");
    }

    #[test]
    fn an_archive_search_keeps_as_many_hits_as_the_serial_report_shows() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(archive_args(&args("-evalue 1"), "0"), args("-evalue 1"), "no display counts: unchanged");
        assert_eq!(archive_args(&args("-num_alignments 2 -evalue 1"), "0"), args("-evalue 1 -max_target_seqs 500"));
        assert_eq!(archive_args(&args("-num_alignments 2 -evalue 1"), "7"), args("-evalue 1 -max_target_seqs 2"));
        assert_eq!(archive_args(&args("-num_descriptions 3 -num_alignments 5"), "0"), args("-max_target_seqs 5"));
        assert_eq!(archive_args(&args("-num_descriptions 3"), "6 qseqid"), args("-max_target_seqs 500"), "ignored by tabular");
        assert_eq!(archive_args(&args("-num_alignments 0"), "7"), args("-num_alignments 0"), "refused by BLAST+ as it stands");
        assert_eq!(hitlist_size(&args("-num_descriptions 900"), "0"), 900);
        assert_eq!(hitlist_size(&args("-num_alignments 7"), "5"), 7);
        assert_eq!(hitlist_size(&args("-max_target_seqs 9 -num_alignments 7"), "5"), 9);
    }

    #[test]
    fn options_a_fragment_merge_cannot_reproduce_split_by_queries() {
        use SplitBy::*;
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        for a in [
            "-culling_limit 2",
            "-evalue 1 -qcov_hsp_perc 50",
            "-parse_deflines",
            "-sorthits 2",
            "-seqidlist ids.txt",
            "-gilist gis.txt",
            "-taxids 9606",
            "-negative_taxidlist t.txt",
        ] {
            assert_eq!(choose_split_with(None, false, false, 1, 8, "blastp", &args(a)).unwrap(), Queries, "{a}: a cluster, one query");
            assert!(matches!(
                choose_split_with(Some(Fragments), true, false, 500, 2, "blastp", &args(a)),
                Err(SearchError::OptionByFragments { .. })
            ));
            assert!(matches!(
                choose_split_with(None, true, true, 500, 2, "blastp", &args(a)),
                Err(SearchError::OptionWithoutAgents { .. })
            ));
        }
        for a in ["-sorthits 0", "-sorthsps 1", "-evalue 1e-5", "-num_alignments 2"] {
            assert_eq!(choose_split_with(Some(Fragments), true, false, 500, 2, "blastp", &args(a)).unwrap(), Fragments, "{a}");
            assert_eq!(choose_split_with(None, true, false, 7, 2, "blastp", &args(a)).unwrap(), Fragments, "{a}");
        }
    }

    fn choose_split_with(
        r: Option<SplitBy>,
        one_machine: bool,
        no_agent: bool,
        queries: usize,
        workers: usize,
        program: &str,
        args: &[String],
    ) -> Result<SplitBy, SearchError> {
        choose_split(r, one_machine, no_agent, queries, workers, program, whole_database_option(program, "0", args))
    }

    #[test]
    fn xml_with_query_masking_splits_by_queries() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(whole_database_option("blastn", "5", &[]).map(|w| w.0), Some("-dust (on by default for blastn)"));
        assert_eq!(whole_database_option("blastn", "5", &args("-dust no")), None);
        assert_eq!(whole_database_option("blastn", "6", &[]), None, "tabular output shows no masks");
        assert_eq!(whole_database_option("blastp", "5", &[]), None, "blastp does not mask by default");
        assert_eq!(whole_database_option("blastp", "5", &args("-seg yes")).map(|w| w.0), Some("-seg"));
        assert_eq!(whole_database_option("blastp", "5", &args("-seg no")), None);
        assert_eq!(whole_database_option("blastp", "5", &args("-lcase_masking")).map(|w| w.0), Some("-lcase_masking"));
    }

    #[test]
    fn blast_batches_close_with_the_query_that_reaches_the_size() {
        assert_eq!(blast_batches(&recs(&[171, 500]), 171), vec![0..1, 1..2]);
        assert_eq!(blast_batches(&recs(&[171, 500]), 172), vec![0..2]);
        assert_eq!(blast_batches(&recs(&[100, 100, 100, 100, 100]), 250), vec![0..3, 3..5]);
        assert_eq!(blast_batches(&recs(&[5]), 10_002), vec![0..1]);
    }

    #[test]
    fn owned_blast_options_are_refused_with_what_to_use() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for o in ["-db", "-query", "-out", "-outfmt", "-remote", "-subject"] {
            let e = check_blast_args(&args(&["-evalue", "1", o, "x"]), 1).unwrap_err().to_string();
            assert!(e.starts_with(&format!("BLAST+ option {o} is set by gepsea; ")), "{e}");
        }
        assert!(check_blast_args(&args(&["-num_threads", "4"]), 2).unwrap_err().to_string().contains("use --workers"));
        assert!(check_blast_args(&args(&["-num_threads", "4", "-evalue", "1e-5"]), 1).is_ok());
    }

    #[test]
    fn blast_batch_sizes_follow_the_program_and_task() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(blast_batch_letters("blastp", &[]), 10_000);
        assert_eq!(blast_batch_letters("blastn", &[]), 5_000_000);
        assert_eq!(blast_batch_letters("blastn", &args(&["-task", "blastn"])), 100_000);
        assert_eq!(blast_batch_letters("blastn", &args(&["-evalue", "1", "-task", "dc-megablast"])), 500_000);
    }
}
