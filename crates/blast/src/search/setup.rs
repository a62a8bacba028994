//! What a search settles before any task runs, in the order `run_checked` asks: the
//! queries read (and those without residues noted), the output claimed, the program
//! checked against the queries and the database, BLAST+'s options tried on one query,
//! the batches cut and written, a recording checked against them. Each step fails with
//! the user's error before anything expensive starts.

use super::*;

/// Says once how many queries have no residues: serial BLAST+ warns of each on standard
/// error, twice; its output reports them with no hits, and so does ours.
pub(super) fn note_empty_queries(query: &Path, queries: &[Record]) {
    let empty: Vec<&Record> = queries.iter().filter(|q| q.residues == 0).collect();
    if let Some(first) = empty.first() {
        let (n, name) = (empty.len(), query.display());
        let more = if n > 1 { format!(" and {} more", n - 1) } else { String::new() };
        let (these, are) = if n == 1 { ("query", "is") } else { ("queries", "are") };
        note!(
            "gepsea search: {n} {these} without residues {are} reported with no hits, as BLAST+ reports them: {} ({name}:{}){more}",
            crate::text::shown(first.id()),
            first.line
        );
    }
}

/// The output's directory (absolute: BLAST+ tools run with the scratch directory as
/// their working directory) and file name. Claimed first: an output that is a
/// directory, or in one that does not exist, fails now, not after the search.
pub(super) fn claim_output(out: &Path) -> Result<(PathBuf, String), SearchError> {
    if out.is_dir() {
        let source = std::io::Error::new(std::io::ErrorKind::IsADirectory, "it is a directory; give a file name");
        return Err(SearchError::Output { path: out.to_path_buf(), source });
    }
    let dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir = std::fs::canonicalize(dir).map_err(|e| SearchError::Output { path: out.to_path_buf(), source: e })?;
    Ok((dir, out.file_name().unwrap_or_default().to_string_lossy().to_string()))
}

/// The program that runs (`--program`, or the database's default) and the queries'
/// molecule type, which both must suit.
pub(super) fn check_program(opts: &SearchOptions, queries: &[Record], manifest: &Manifest) -> Result<(String, MolType), SearchError> {
    let (default, programs) = match manifest.dbtype {
        MolType::Prot => ("blastp", "blastp or blastx"),
        MolType::Nucl => ("blastn", "blastn, tblastn or tblastx"),
    };
    let program = opts.program.clone().unwrap_or_else(|| default.to_string());
    let (query_type, db_type) = program_types(&program).ok_or_else(|| SearchError::UnknownProgram(program.clone()))?;
    if db_type != manifest.dbtype {
        return Err(SearchError::ProgramMismatch { program, db_type: mol_name(manifest.dbtype), expected: programs });
    }
    let qtype = fasta::guess_moltype(queries);
    if qtype != query_type {
        if opts.program.is_none() {
            return Err(SearchError::TypeMismatch {
                query: opts.query.clone(),
                query_type: mol_name(qtype),
                db: opts.db.clone(),
                db_type: mol_name(manifest.dbtype),
            });
        }
        return Err(SearchError::QueryTypeForProgram {
            query: opts.query.clone(),
            query_type: mol_name(qtype),
            program,
            expected: mol_name(query_type),
        });
    }
    Ok((program, qtype))
}

/// The query batches. By fragments: enough for two tasks per worker over `fragments`
/// fragments (or `--batch-residues`). By queries: within BLAST+'s own batch size, so
/// that each task's output is what serial BLAST+ prints for those queries; translated
/// searches keep exactly BLAST+'s batches. Batches without statistics join a neighbour.
pub(super) fn plan_batches(
    opts: &SearchOptions,
    split: SplitBy,
    queries: &[Record],
    program: &str,
    workers: usize,
    fragments: usize,
    qtype: MolType,
) -> Result<Vec<std::ops::Range<usize>>, SearchError> {
    let ranges = match split {
        SplitBy::Fragments => {
            let per_batch = opts.batch_residues.unwrap_or_else(|| {
                let total: usize = queries.iter().map(|q| q.residues).sum();
                let nb = (2 * workers).div_ceil(fragments).max(1);
                total.div_ceil(nb).max(1)
            });
            batches(queries, per_batch)
        }
        SplitBy::Queries => {
            let cap = blast_batch_letters(program, &opts.blast_args);
            match opts.batch_residues {
                Some(_) if is_translated(program) => return Err(SearchError::TranslatedBatches(program.to_string())),
                Some(r) => batches(queries, r.min(cap)),
                None if is_translated(program) => blast_batches(queries, cap),
                None => guided_batches(queries, workers, cap),
            }
        }
    };
    Ok(join_batches_without_statistics(ranges, queries, qtype))
}

/// Each batch's FASTA, written into `scratch` as `batch{b}.fasta`, and its bytes (which
/// name the batch's part and go into the agents' job directory).
pub(super) fn write_batches(
    scratch: &Path,
    queries: &[Record],
    ranges: &[std::ops::Range<usize>],
) -> Result<(Vec<PathBuf>, Vec<Vec<u8>>), SearchError> {
    let mut files = Vec::with_capacity(ranges.len());
    let mut texts = Vec::with_capacity(ranges.len());
    for (b, r) in ranges.iter().enumerate() {
        let f = scratch.join(format!("batch{b}.fasta"));
        let text = fasta::text_of(&queries[r.clone()]);
        std::fs::write(&f, &text).map_err(|e| SearchError::Io(format!("{}: {e}", f.display())))?;
        files.push(f);
        texts.push(text);
    }
    Ok((files, texts))
}

/// A recording (`--replay`) of other batches or fragments fails now, not task by task.
pub(super) fn check_recording(
    recording: &crate::replay::Recording,
    opts: &SearchOptions,
    split: SplitBy,
    program: &str,
    manifest: &Manifest,
    batch_files: &[PathBuf],
) -> Result<(), SearchError> {
    let databases: Vec<String> = match split {
        SplitBy::Fragments => manifest.fragments.iter().map(|f| format!("{}.stats", f.name)).collect(),
        SplitBy::Queries => vec![manifest.name.clone()],
    };
    let (outfmt, args) = match split {
        SplitBy::Fragments => ("11", archive_args(&opts.blast_args, &opts.outfmt)),
        SplitBy::Queries => (opts.outfmt.as_str(), opts.blast_args.clone()),
    };
    Ok(recording.check_holds(program, batch_files, &databases, outfmt, &args)?)
}

/// One tiny BLAST+ run (the first query against the one-sequence statistics database)
/// with the user's options, before any worker starts: a mistyped option or a bad value
/// fails here in a fraction of a second, with BLAST+'s own error line, instead of in
/// every task. Only option errors count: anything else the statistics database cannot
/// show (e.g. `-taxids`) is left to the real search, apart from an `--outfmt` number
/// out of range.
pub(super) fn validate_options(
    program: &str,
    blastdb: &str,
    db_name: &str,
    first: &Record,
    outfmt: &str,
    args: &[String],
    scratch: &Path,
) -> Result<(), SearchError> {
    crate::plan::check_tabular_fields(program, outfmt)?;
    let q = scratch.join("validate.fasta");
    let mut buf = Vec::new();
    first.write_to(&mut buf);
    std::fs::write(&q, buf).map_err(|e| SearchError::Io(format!("{}: {e}", q.display())))?;
    let (qs, out) = (q.to_string_lossy().to_string(), scratch.join("validate.out").to_string_lossy().to_string());
    let mut all: Vec<&str> = vec!["-query", &qs, "-db", "stats", "-outfmt", outfmt, "-out", &out];
    all.extend(args.iter().map(|s| s.as_str()));
    match tools::run(program, &all, Some(blastdb.as_ref()), Some(scratch)) {
        // Also what BLAST+ finds wrong with the options only once it searches ("No hits are
        // being saved", an ungapped search with composition-based statistics): a serial
        // run fails the same way, and so would every task.
        Err(ToolError::Failed { stderr, .. })
            if tools::is_option_error(&stderr)
                || stderr.contains("BLAST query/options error:")
                || stderr.contains("BLAST options error:") =>
        {
            // The check searched the one-sequence statistics database: name the user's.
            Err(SearchError::BlastOptions(tools::error_lines(&stderr).replace("'stats'", &format!("'{db_name}'"))))
        }
        // A format number out of range is not an argument-parser error for BLAST+, but
        // it fails every task the same way.
        Err(ToolError::Failed { stderr, .. }) if stderr.contains("Formatting choice is out of range") => Err(SearchError::Outfmt {
            outfmt: outfmt.to_string(),
            reason: tools::error_lines(&stderr).trim_start_matches("Error: ").to_string(),
        }),
        Err(e @ ToolError::Missing { .. }) => Err(e.into()),
        _ => Ok(()),
    }
}
