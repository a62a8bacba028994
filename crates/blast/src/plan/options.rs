//! The BLAST+ options a search is given, checked before anything runs: those gepsea
//! sets itself, the output formats it reproduces, and those whose serial output only
//! a search of the whole database gives (which decide the split, `super::choose_split`).

use super::option_value;
use crate::error::SearchError;
use crate::report;

/// BLAST+ options gepsea sets itself, and what to use instead.
const OWNED_OPTIONS: &[(&str, &str)] = &[
    ("-db", "give the database with --db"),
    ("-query", "give the queries with --query"),
    ("-out", "give the output file with --out"),
    ("-outfmt", "give the format with --outfmt (e.g. --outfmt \"6 qseqid sseqid evalue\")"),
    ("-remote", "gepsea searches local databases; drop -remote"),
    ("-subject", "gepsea searches a database; make one with `gepsea db format` or makeblastdb and give it with --db"),
    ("-subject_loc", "gepsea searches a database; drop -subject_loc"),
    ("-import_search_strategy", "give the options themselves after --"),
    ("-export_search_strategy", "run one serial BLAST+ search to export a strategy"),
];

/// Refuses, one option at a time, the BLAST+ options after `--` that gepsea sets itself;
/// `-num_threads` too when several workers run (they are the threads: use --workers).
pub fn check_blast_args(args: &[String], workers: usize) -> Result<(), SearchError> {
    for a in args {
        if let Some((option, instead)) = OWNED_OPTIONS.iter().find(|(o, _)| o == a) {
            return Err(SearchError::OwnedOption { option: option.to_string(), instead });
        }
        if a == "-num_threads" && workers > 1 {
            return Err(SearchError::OwnedOption { option: a.clone(), instead: "gepsea runs --workers BLAST+ processes and gives idle cores to the last tasks; use --workers (with --workers 1, -num_threads is passed on)" });
        }
    }
    Ok(())
}

/// BLAST+ output formats gepsea writes byte-identical to serial BLAST+, by either split.
pub const REPRODUCED_FORMATS: [u32; 10] = [0, 1, 2, 3, 4, 5, 6, 7, 10, 18];

/// Refuses a BLAST+ output format (1 to 17) that gepsea does not reproduce: the
/// structured documents (ASN.1, JSON, XML2, SAM: 8, 9, 11–17), which are one document
/// per BLAST+ run. Numbers BLAST+ does not have are left to its own check. Also HTML
/// reports (`-html`, which only changes formats 0 to 4), whose markup the joining of
/// parts does not know.
pub fn check_outfmt(outfmt: &str, blast_args: &[String]) -> Result<(), SearchError> {
    let n = report::base_format(outfmt);
    if (1..=17).contains(&n) && !REPRODUCED_FORMATS.contains(&n) {
        return Err(SearchError::OutfmtNotReproduced(outfmt.to_string()));
    }
    if report::is_pairwise_layout(n) && blast_args.iter().any(|a| a == "-html") {
        return Err(SearchError::HtmlNotReproduced);
    }
    Ok(())
}

/// A tabular `outfmt` that names a field `program` does not know is refused: BLAST+
/// prints the rows without it and says nothing, so `-outfmt "6 qseqid sseqid evalu"`
/// made a report one column short of what was asked for (and, for gepsea, columns
/// counted past it named other fields than the format said: the summary's hit count
/// and ParaMEDIC read rows by their query and subject columns). The fields are the
/// installed program's own (`tools::tabular_fields_known`); a help text without the
/// list leaves the format to BLAST+.
pub fn check_tabular_fields(program: &str, outfmt: &str) -> Result<(), SearchError> {
    if !matches!(report::base_format(outfmt), 6 | 7 | 10) {
        return Ok(());
    }
    let named: Vec<&str> = report::named_fields(outfmt).into_iter().filter(|f| *f != "std").collect();
    if named.is_empty() {
        return Ok(());
    }
    let known = crate::tools::tabular_fields_known(program)?;
    if known.is_empty() {
        return Ok(());
    }
    let Some(field) = named.into_iter().find(|f| !known.iter().any(|k| k == f)) else { return Ok(()) };
    // A typing slip is a letter or two away from the field meant (the fields are
    // lower case).
    let lower = field.to_lowercase();
    let hint = match known.iter().map(|k| (strsim::levenshtein(&lower, k), k)).min() {
        Some((d, k)) if d <= 2 => format!(" (did you mean {k}?)"),
        _ => String::new(),
    };
    Err(SearchError::OutfmtField { outfmt: outfmt.to_string(), program: program.to_string(), field: field.to_string(), hint })
}

/// BLAST+ options whose serial output a merge of fragments cannot reproduce, with why.
/// Each was found different from serial BLAST+ when split by fragments.
const WHOLE_DATABASE_OPTIONS: &[(&str, &str)] = &[
    ("-culling_limit", CULLS),
    (
        "-qcov_hsp_perc",
        "BLAST+ orders the hits before this filter drops HSPs, and the order cannot be rebuilt from what the fragments keep",
    ),
    ("-parse_deflines", "the archives then name queries by their parsed identifiers, which the merge cannot number"),
    ("-sorthits", "blastp orders hits of equal score differently from blast_formatter, through which the merge prints"),
    ("-best_hit_overhang", CULLS),
    ("-best_hit_score_edge", CULLS),
    ("-searchsp", "with a fixed search space, fragments keep hits near the e-value cutoff that the whole database's search drops"),
    ("-seqidlist", LISTED),
    ("-negative_seqidlist", LISTED),
    ("-gilist", LISTED),
    ("-negative_gilist", LISTED),
    ("-taxids", LISTED),
    ("-taxidlist", LISTED),
    ("-negative_taxids", LISTED),
    ("-negative_taxidlist", LISTED),
];

/// Why the filters that drop a hit for better ones need the whole database.
const CULLS: &str = "it removes hits enveloped by better ones among all the database's hits, and a fragment sees only its own";

/// Why a list of the database's sequences (or taxa) to search or skip needs the whole
/// database: BLAST+ computes the search space from the sequences the list keeps (for
/// one query of the example set, 3,987,854 with `-taxids 9606` and 35,151,597 with a
/// 3,000-accession `-seqidlist`, against 228,300,363), and the merge's statistics
/// database holds none of them (by fragments `-seqidlist` failed with "DB contains no
/// accession info", `-taxids` with "Taxonomy ID(s) not found").
const LISTED: &str =
    "BLAST+ then computes e-values from the size of the sequences the list keeps in the whole database, which no fragment sees";

/// The first option of `args` that forces a search split by queries, and why: each query
/// must then be searched against the whole database by one BLAST+ run. `program` is
/// the program that will run (blastn for nucleotide queries when none is given).
pub fn whole_database_option(program: &str, outfmt: &str, args: &[String]) -> Option<(&'static str, &'static str)> {
    let listed = args.iter().find_map(|a| {
        WHOLE_DATABASE_OPTIONS.iter().copied().find(|(o, _)| o == a).filter(|(o, _)| {
            // `-sorthits 0` is BLAST+'s own order (by e-value), which the merge keeps.
            *o != "-sorthits" || option_value(args, o) != Some("0")
        })
    });
    listed.or_else(|| (report::base_format(outfmt) == 5).then(|| query_masking(program, args)).flatten().map(|o| (o, MASKED_XML)))
}

/// Why XML with query masking needs the whole database (`report::write` refuses it by
/// fragments, but only once the search is done and masks are seen).
const MASKED_XML: &str =
    "with -outfmt 5, serial BLAST+ marks masked query residues in XML by a rule the merge of fragments does not reproduce";

/// The option that masks query residues in this search, if any: blastn's DUST (on
/// unless `-dust no`), `-seg` other than `no`, lower-case or WindowMasker masking.
fn query_masking(program: &str, args: &[String]) -> Option<&'static str> {
    if args.iter().any(|a| a == "-lcase_masking") {
        return Some("-lcase_masking");
    }
    if let Some(o) = ["-window_masker_db", "-window_masker_taxid"].into_iter().find(|o| args.iter().any(|a| a == o)) {
        return Some(o);
    }
    match program {
        "blastn" if option_value(args, "-dust") != Some("no") => Some("-dust (on by default for blastn)"),
        _ if option_value(args, "-seg").is_some_and(|v| v != "no") => Some("-seg"),
        _ => None,
    }
}
