//! BLAST+ programs, options and formats as a user gives them: the translated searches
//! (blastx, tblastn, tblastx) and the query-anchored reports identical to serial BLAST+, duplicate query identifiers as BLAST+
//! takes them, options gepsea owns refused with what to use instead, a mistyped option
//! reported by BLAST+'s own line before any worker starts, `--version`, and SIGINT /
//! SIGTERM stopping a search cleanly.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{assert_identical, finished_parts, gepsea, head, run_ok, tempdir, zcat, DB_GZ, DB_PROTEINS, QUERY_GZ};

/// One codon per amino acid: a protein written back as DNA whose translation in frame 1
/// is the protein again (ambiguity letters as their usual reading).
fn back_translate(protein: &str) -> String {
    protein
        .chars()
        .filter_map(|a| {
            Some(match a.to_ascii_uppercase() {
                'A' => "GCT",
                'R' => "CGT",
                'N' | 'B' => "AAT",
                'D' => "GAT",
                'C' | 'U' => "TGT",
                'Q' => "CAA",
                'E' | 'Z' => "GAA",
                'G' => "GGT",
                'H' => "CAT",
                'I' => "ATT",
                'L' | 'J' => "CTG",
                'K' | 'O' => "AAA",
                'M' => "ATG",
                'F' => "TTT",
                'P' => "CCG",
                'S' => "TCT",
                'T' => "ACT",
                'W' => "TGG",
                'Y' => "TAT",
                'V' => "GTT",
                'X' => "NNN",
                _ => return None,
            })
        })
        .collect()
}

/// A FASTA text with every sequence back-translated, 60 letters a line.
fn back_translate_fasta(fasta: &str) -> String {
    let mut out = String::new();
    let mut seq = String::new();
    let flush = |seq: &mut String, out: &mut String| {
        let dna = back_translate(seq);
        for chunk in dna.as_bytes().chunks(60) {
            out.push_str(std::str::from_utf8(chunk).unwrap());
            out.push('\n');
        }
        seq.clear();
    };
    for line in fasta.lines() {
        if line.starts_with('>') {
            if !seq.is_empty() {
                flush(&mut seq, &mut out);
            }
            out.push_str(line);
            out.push('\n');
        } else {
            seq.push_str(line.trim());
        }
    }
    flush(&mut seq, &mut out);
    out
}

/// Built once, removed at exit: protein and back-translated queries, a protein database
/// of the first [`DB_PROTEINS`] example proteins, a nucleotide database of 800 of them
/// back-translated.
static DIR: OnceLock<PathBuf> = OnceLock::new();

fn fixture() -> &'static Path {
    common::fixture(&DIR, "programs", |dir| {
        let db = zcat(DB_GZ);
        let queries = zcat(QUERY_GZ);
        std::fs::write(dir.join("prot.fasta"), head(&db, DB_PROTEINS)).unwrap();
        std::fs::write(dir.join("q.fasta"), head(&queries, 8)).unwrap();
        // 16 queries back-translated: about 19,000 letters, two of blastx's 10,002-letter
        // batches.
        std::fs::write(dir.join("nq.fasta"), back_translate_fasta(&head(&queries, 16))).unwrap();
        std::fs::write(dir.join("nq2.fasta"), back_translate_fasta(&head(&queries, 2))).unwrap();
        std::fs::write(dir.join("nucl.fasta"), back_translate_fasta(&head(&db, 800))).unwrap();
        for (input, t, out) in [("prot.fasta", "prot", "protdb"), ("nucl.fasta", "nucl", "nucldb")] {
            let mut c = Command::new("makeblastdb");
            c.args(["-in", input, "-dbtype", t, "-parse_seqids", "-title", out, "-out", out]).current_dir(dir);
            run_ok(c);
        }
    })
}

fn serial(program: &str, dir: &Path, db: &str, query: &str, outfmt: &str, out: &Path, extra: &[&str]) {
    let mut c = Command::new(program);
    c.current_dir(dir).env_remove("BLASTDB").args(["-db", db, "-query", query, "-outfmt", outfmt, "-out"]).arg(out).args(extra);
    run_ok(c);
}

fn search(dir: &Path, program: &str, db: &str, query: &str, outfmt: &str, out: &Path, mode: &[&str]) {
    let mut c = gepsea();
    c.current_dir(dir)
        .env_remove("BLASTDB")
        .args(["search", "--quiet", "--workers", "2", "--program", program, "--db", db, "--query", query, "--outfmt", outfmt, "--out"])
        .arg(out)
        .args(mode);
    run_ok(c);
}

#[test]
fn translated_searches_are_identical_to_serial_blast() {
    let f = fixture();
    let d = tempdir("translated");
    for (program, db, query, fmt) in [
        ("blastx", "protdb", "nq.fasta", "0"),
        ("blastx", "protdb", "nq.fasta", "7"),
        ("tblastn", "nucldb", "q.fasta", "0"),
        ("tblastn", "nucldb", "q.fasta", "6"),
        ("tblastx", "nucldb", "nq2.fasta", "6"),
    ] {
        let want = d.0.join(format!("serial-{program}.{fmt}"));
        serial(program, f, db, query, fmt, &want, &[]);
        let text = std::fs::read_to_string(&want).unwrap();
        assert!(text.lines().filter(|l| !l.starts_with('#')).count() > 10, "{program} should find hits: {}", &text[..300.min(text.len())]);
        let got = d.0.join(format!("gepsea-{program}.{fmt}"));
        let summary = d.0.join("summary.json");
        search(f, program, db, query, fmt, &got, &["--summary-json", summary.to_str().unwrap()]);
        assert_identical(&got, &want, &format!("{program} outfmt {fmt}"));
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
        assert_eq!(v["split"], "Queries", "{program}");
        if program == "blastx" {
            assert!(v["tasks"].as_u64().unwrap() >= 2, "blastx should span several of BLAST+'s batches: {v}");
        }
    }
    // The fragment merge is not proven for translated searches: refused, not guessed.
    let out = d.0.join("refused.txt");
    let o = gepsea()
        .current_dir(f)
        .args(["search", "--quiet", "--program", "blastx", "--split", "fragments", "--db", "protdb", "--query", "nq.fasta", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("blastx is searched split by queries only"), "{e}");
    assert!(!out.exists());
    // A query file of the wrong molecule for the program.
    let o = gepsea()
        .current_dir(f)
        .args(["search", "--quiet", "--program", "blastx", "--db", "protdb", "--query", "q.fasta", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("looks like protein sequences, but blastx searches nucleotide queries"), "{e}");
}

#[test]
fn duplicate_query_identifiers_are_kept_as_blast_keeps_them() {
    let f = fixture();
    let d = tempdir("dups");
    // The same identifier three times, with different sequences, as BLAST+ accepts it.
    let q = head(&std::fs::read_to_string(f.join("q.fasta")).unwrap(), 6);
    let mut n = 0;
    let dup: String = q
        .lines()
        .map(|l| {
            if l.starts_with('>') {
                n += 1;
                if n % 2 == 0 {
                    return ">same_id repeated\n".to_string();
                }
            }
            format!("{l}\n")
        })
        .collect();
    std::fs::write(d.0.join("dup.fasta"), dup).unwrap();
    let query = d.0.join("dup.fasta");
    let query = query.to_str().unwrap();
    for (fmt, split) in [("0", "queries"), ("6", "fragments"), ("5", "queries")] {
        let want = d.0.join(format!("serial.{fmt}"));
        serial("blastp", f, "protdb", query, fmt, &want, &[]);
        let got = d.0.join(format!("gepsea.{fmt}.{split}"));
        search(f, "blastp", "protdb", query, fmt, &got, &["--split", split]);
        assert_identical(&got, &want, &format!("duplicate ids, outfmt {fmt}, by {split}"));
    }
}

/// Queries as users have them: lower case, a terminal `*`, two residues, and all `X`
/// (BLAST+ cannot compute its statistics: its report says so where others have them),
/// each reported as serial BLAST+ reports it, in both splits, with and without agents,
/// in batches that put the `X` query past the first.
#[test]
fn unusual_queries_are_reported_as_serial_blast_reports_them() {
    let f = fixture();
    let d = tempdir("unusual");
    let records: Vec<String> = std::fs::read_to_string(f.join("q.fasta")).unwrap().split('>').skip(1).map(|r| format!(">{r}")).collect();
    let (head_line, seq) = records[2].split_once('\n').unwrap();
    let starred = format!("{head_line}\n{}*\n", seq.trim_end());
    // Sequence lines numbered as GenBank prints them ("61 mkvl..."): BLAST+ ignores the
    // digits (gepsea refused the file before 2026-12-01).
    let numbered = |record: &str| {
        let (head, seq) = record.split_once('\n').unwrap();
        let seq: String = seq.split_whitespace().collect();
        let lines: Vec<String> =
            seq.as_bytes().chunks(60).enumerate().map(|(i, c)| format!("{} {}\n", i * 60 + 1, std::str::from_utf8(c).unwrap())).collect();
        format!("{head}\n{}", lines.concat())
    };
    // Queries without residues too, first, between others and last: BLAST+ reports each
    // with no hits (gepsea refused the file before 2026-12-01), but fails a run of only
    // empty ones, which a batch cut by letters made of the two last ones.
    let queries = [
        ">empty0 nothing\n".to_string(),
        records[0].clone(),
        records[1].to_lowercase(),
        starred,
        ">shorty\nMK\n".into(),
        ">empty4\n\n".into(),
        format!(">xs\n{}\n", "X".repeat(28)),
        records[3].clone(),
        numbered(&records[4]),
        ">empty7\n>empty8\n".into(),
    ]
    .concat();
    std::fs::write(d.0.join("unusual.fasta"), queries).unwrap();
    let q = d.0.join("unusual.fasta");
    let q = q.to_str().unwrap();
    for fmt in ["0", "5"] {
        let want = d.0.join(format!("serial.{fmt}"));
        serial("blastp", f, "protdb", q, fmt, &want, &[]);
        let text = std::fs::read_to_string(&want).unwrap();
        assert!(
            text.contains("Could not calculate ungapped Karlin-Altschul parameters") || fmt == "0",
            "outfmt {fmt}: the X query's warning"
        );
        for mode in [
            &["--split", "fragments", "--batch-residues", "500"][..],
            &["--split", "fragments", "--no-agent", "--batch-residues", "500"],
            &["--split", "queries", "--batch-residues", "500"],
            &["--split", "fragments", "--batch-residues", "20"],
            &["--split", "queries", "--batch-residues", "20"],
        ] {
            let got = d.0.join(format!("gepsea.{fmt}"));
            search(f, "blastp", "protdb", q, fmt, &got, mode);
            assert_identical(&got, &want, &format!("outfmt {fmt} {mode:?}"));
        }
    }
    // Said once, naming the first empty query by file and line (BLAST+ warns of each).
    let out = d.0.join("noted.6");
    let o = gepsea().current_dir(f).args(["search", "--db", "protdb", "--query", q, "--outfmt", "6", "--out"]).arg(&out).output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{e}");
    let notes: Vec<&str> = e.lines().filter(|l| l.contains("without residues")).collect();
    assert_eq!(
        notes,
        [format!("gepsea search: 4 queries without residues are reported with no hits, as BLAST+ reports them: empty0 ({q}:1) and 3 more")]
    );
}

/// Query titles and identifiers outside ASCII: serial BLAST+ prints their bytes, and
/// the formatter that prints a merge of fragments printed a `#` for each (BLAST+'s
/// archives hold only ASCII).
#[test]
fn titles_outside_ascii_are_printed_as_serial_blast_prints_them() {
    let f = fixture();
    let d = tempdir("utf8");
    let records: Vec<String> = std::fs::read_to_string(f.join("q.fasta")).unwrap().split('>').skip(1).map(|r| format!(">{r}")).collect();
    let renamed = records[0].replacen('>', ">g\u{e8}ne1 ", 1);
    let described = records[1].replacen(' ', " M\u{fc}ller \u{3b2}-lactamase \u{65e5}\u{672c} ", 1);
    std::fs::write(d.0.join("utf8.fasta"), [renamed, described, records[2].clone()].concat()).unwrap();
    let q = d.0.join("utf8.fasta");
    let q = q.to_str().unwrap();
    for fmt in ["0", "7", "10", "18"] {
        let want = d.0.join(format!("serial.{fmt}"));
        serial("blastp", f, "protdb", q, fmt, &want, &[]);
        for mode in [&["--split", "fragments"][..], &["--split", "fragments", "--no-agent"]] {
            let got = d.0.join(format!("gepsea.{fmt}"));
            search(f, "blastp", "protdb", q, fmt, &got, mode);
            assert_identical(&got, &want, &format!("outfmt {fmt} {mode:?}"));
        }
    }
}

/// A query file that is not UTF-8 (Latin-1 deflines, as older tools write them): BLAST+
/// reads it and prints the bytes, XML included; so does gepsea, in both splits, with
/// and without agents. Before, the file was refused ("not UTF-8 text").
#[test]
fn latin1_query_files_are_searched_and_printed_as_serial_blast_prints_them() {
    let f = fixture();
    let d = tempdir("latin1");
    let text = std::fs::read(f.join("q.fasta")).unwrap();
    let mut records: Vec<Vec<u8>> = text.split(|&b| b == b'>').skip(1).map(|r| [&b">"[..], r].concat()).collect();
    records[0].splice(1..1, b"g\xe8ne1 ".iter().copied());
    let space = records[1].iter().position(|&b| b == b' ').unwrap();
    records[1].splice(space..space, b" M\xfcller \xdf-lactamase caf\xe9".iter().copied());
    std::fs::write(d.0.join("latin1.fasta"), records.concat()).unwrap();
    assert!(std::str::from_utf8(&std::fs::read(d.0.join("latin1.fasta")).unwrap()).is_err());
    let q = d.0.join("latin1.fasta");
    let q = q.to_str().unwrap();
    for fmt in ["0", "5", "7", "10"] {
        let want = d.0.join(format!("serial.{fmt}"));
        serial("blastp", f, "protdb", q, fmt, &want, &[]);
        let printed = std::fs::read(&want).unwrap();
        let id = b"g\xe8ne1";
        assert!(printed.windows(id.len()).any(|w| w == id), "outfmt {fmt}: serial BLAST+ prints the byte");
        for mode in
            [&["--split", "fragments"][..], &["--split", "fragments", "--no-agent"], &["--split", "queries", "--batch-residues", "1500"]]
        {
            let got = d.0.join(format!("gepsea.{fmt}"));
            search(f, "blastp", "protdb", q, fmt, &got, mode);
            assert_identical(&got, &want, &format!("outfmt {fmt} {mode:?}"));
        }
    }
}

/// The query-anchored reports (formats 1–4) by fragments, with and without agents, and
/// by queries, in batches of a few queries. Each batch's BLAST+ run labels a query's
/// alignment blocks with its local id (`Query_3`), padding the block's labels to the
/// longest plus two; the report renumbers them, and widens a block whose label grows
/// (`Query_9` → `Query_10`) as serial BLAST+ lays it out. Masked residues (`-seg yes`)
/// are lower-cased on the query lines of a merge of fragments, between gaps too
/// (format 3). Refused before 2026-12-07.
#[test]
fn query_anchored_reports_are_identical_to_serial_blast() {
    let f = fixture();
    let d = tempdir("anchored");
    let all = zcat(QUERY_GZ);
    let records: Vec<&str> = all.split('>').skip(1).collect();
    // The first nine queries, then two (48th and 70th of the file) whose blocks' width
    // their label sets: only subjects of at most six letters align to them.
    let picked: String = [0, 1, 2, 3, 4, 5, 6, 7, 8, 47, 69].iter().map(|&i| format!(">{}", records[i])).collect();
    std::fs::write(d.0.join("q11.fasta"), picked).unwrap();
    let q = d.0.join("q11.fasta");
    let q = q.to_str().unwrap();
    let agents = &["--split", "fragments", "--batch-residues", "1500"][..];
    let no_agent = &["--split", "fragments", "--no-agent", "--batch-residues", "1500"][..];
    let queries = &["--split", "queries", "--batch-residues", "1500"][..];
    let seg = &["-seg", "yes"][..];
    for (fmt, extra, modes) in [
        ("1", &[][..], &[agents, no_agent, queries][..]),
        ("2", &[], &[queries]),
        ("3", &[], &[agents]),
        ("4", &[], &[no_agent]),
        ("3", seg, &[agents]),
    ] {
        let want = d.0.join(format!("serial.{fmt}"));
        serial("blastp", f, "protdb", q, fmt, &want, extra);
        let printed = std::fs::read_to_string(&want).unwrap();
        let query_lines = || printed.lines().filter(|l| l.starts_with("Query_"));
        assert!(query_lines().any(|l| l.starts_with("Query_10  ")), "outfmt {fmt}: no block that Query_10's label widens");
        if !extra.is_empty() {
            assert!(query_lines().any(|l| l.bytes().any(|b| b.is_ascii_lowercase())), "outfmt {fmt}: no masked residue shown");
        }
        for mode in modes {
            let got = d.0.join(format!("gepsea.{fmt}"));
            let mode = if extra.is_empty() { mode.to_vec() } else { [mode, &["--"][..], extra].concat() };
            search(f, "blastp", "protdb", q, fmt, &got, &mode);
            assert_identical(&got, &want, &format!("outfmt {fmt} {mode:?}"));
        }
    }
}

/// Runs gepsea expecting failure; returns stderr; checks that `out` was not made and that
/// the error is one line without BLAST+'s usage text or a backtrace.
fn one_line_error(dir: &Path, args: &[&str], out: &Path) -> String {
    let started = Instant::now();
    let o = gepsea().current_dir(dir).env("RUST_BACKTRACE", "1").args(args).output().unwrap();
    assert!(!o.status.success(), "{args:?} should fail");
    assert!(!out.exists(), "{} was left behind", out.display());
    let e = String::from_utf8_lossy(&o.stderr).trim().to_string();
    assert_eq!(e.lines().count(), 1, "one line: {e}");
    assert!(!e.contains("USAGE") && !e.contains("backtrace"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(60), "refused late: {:?}", started.elapsed());
    e
}

#[test]
fn options_gepsea_owns_are_refused_and_bad_options_reported_by_blast() {
    let f = fixture();
    let d = tempdir("options");
    let out = d.0.join("out.txt");
    let o = out.to_str().unwrap();
    let base = ["search", "--quiet", "--workers", "2", "--db", "protdb", "--query", "q.fasta", "--out", o, "--"];
    for (option, value, hint) in [
        ("-db", "x", "--db"),
        ("-query", "x", "--query"),
        ("-out", "x", "--out"),
        ("-outfmt", "6", "--outfmt"),
        ("-remote", "", "drop -remote"),
        ("-subject", "x", "--db"),
        ("-num_threads", "2", "--workers"),
    ] {
        let mut args = base.to_vec();
        args.push(option);
        if !value.is_empty() {
            args.push(value);
        }
        let e = one_line_error(f, &args, &out);
        assert!(e.contains(&format!("BLAST+ option {option} is set by gepsea")) && e.contains(hint), "{option}: {e}");
    }
    // With one worker, -num_threads is BLAST+'s own business.
    let want = d.0.join("serial.6");
    serial("blastp", f, "protdb", "q.fasta", "6", &want, &["-num_threads", "2"]);
    let got = d.0.join("gepsea.6");
    let mut c = gepsea();
    c.current_dir(f)
        .args(["search", "--quiet", "--workers", "1", "--db", "protdb", "--query", "q.fasta", "--outfmt", "6", "--out"])
        .arg(&got)
        .args(["--", "-num_threads", "2"]);
    run_ok(c);
    assert_identical(&got, &want, "-num_threads with one worker");
    // A mistyped option and a bad value: BLAST+'s own error line, before any task runs
    // (nothing is retried).
    let mut args = base.to_vec();
    args.extend(["-evalu", "1"]);
    let e = one_line_error(f, &args, &out);
    assert!(e.contains("BLAST+ refused the options after --") && e.contains("Unknown argument: \"evalu\""), "{e}");
    let mut args = base.to_vec();
    args.extend(["-evalue", "abc"]);
    let e = one_line_error(f, &args, &out);
    assert!(e.contains("BLAST+ refused the options after --") && e.contains("evalue"), "{e}");
    // Output formats whose per-run framing gepsea does not reproduce: refused, not
    // written different from serial BLAST+.
    for fmt in ["8", "11", "15"] {
        let args = ["search", "--quiet", "--db", "protdb", "--query", "q.fasta", "--out", o, "--outfmt", fmt];
        let e = one_line_error(f, &args, &out);
        assert!(e.contains(&format!("--outfmt {fmt}: not written by gepsea, which writes formats 0 to 7, 10 and 18")), "{e}");
    }
    let mut args = base.to_vec();
    args.push("-html");
    let e = one_line_error(f, &args, &out);
    assert!(e.contains("BLAST+ option -html: gepsea does not write HTML reports"), "{e}");
    // Options BLAST+ finds wrong only once it searches: its line, before any task runs.
    for (bad, says) in [
        (&["-num_descriptions", "0", "-num_alignments", "0"][..], "No hits are being saved"),
        (&["-ungapped"][..], "not supported with an ungapped search"),
    ] {
        let mut args = base.to_vec();
        args.extend(bad);
        let e = one_line_error(f, &args, &out);
        assert!(e.contains("BLAST+ refused the options after --") && e.contains(says), "{bad:?}: {e}");
    }
    // A missing query file: named, and the system's reason said once (the error's
    // message already holds its cause).
    let missing = ["search", "--quiet", "--workers", "2", "--db", "protdb", "--query", "missing.fasta", "--out", o];
    let e = one_line_error(f, &missing, &out);
    assert!(e.contains("missing.fasta: cannot read"), "{e}");
    assert_eq!(e.matches("No such file or directory").count(), 1, "{e}");
}

/// Options that decide how many hits BLAST+ keeps, or which of them it reports, each as
/// serial BLAST+ gives it: merged from fragments where the merge reproduces it, searched
/// by queries (each on the whole database) where it cannot.
#[test]
fn hit_count_and_hit_filter_options_give_serial_blasts_output() {
    let f = fixture();
    let d = tempdir("hit-options");
    // BLAST+ reads the hit count by output format: a report keeps as many hits as both of
    // its lists show, an archive (what fragments are merged from) `-num_alignments`.
    for (fmt, extra, mode) in [
        ("0", &["-num_alignments", "2"][..], &[][..]),
        ("0", &["-num_descriptions", "3", "-num_alignments", "1"][..], &["--no-agent"][..]),
        ("0", &["-num_alignments", "0"][..], &[][..]),
        ("7", &["-num_alignments", "2"][..], &[][..]),
        ("5", &["-num_alignments", "3"][..], &["--no-agent"][..]),
        ("10", &["-num_alignments", "2"][..], &[][..]),
        ("18", &[][..], &[][..]),
    ] {
        let what = format!("outfmt {fmt} {extra:?} {mode:?}");
        let want = d.0.join("serial.out");
        serial("blastp", f, "protdb", "q.fasta", fmt, &want, extra);
        let got = d.0.join("gepsea.out");
        let split = ["--split", "fragments", "--fragments", "3"];
        search(f, "blastp", "protdb", "q.fasta", fmt, &got, &[&split[..], mode, &["--"], extra].concat());
        assert_identical(&got, &want, &what);
    }
    // Filters over all of a query's hits, and orders a merge cannot rebuild: by queries,
    // even for two queries on two workers (which a merge of fragments would otherwise
    // search), and refused by fragments and without agents.
    std::fs::write(d.0.join("q2.fasta"), head(&std::fs::read_to_string(f.join("q.fasta")).unwrap(), 2)).unwrap();
    let q2 = d.0.join("q2.fasta");
    let q2 = q2.to_str().unwrap();
    // Every other sequence of the database's first 2,000, by accession.
    let listed: String = zcat(DB_GZ)
        .lines()
        .filter(|l| l.starts_with('>'))
        .take(2000)
        .step_by(2)
        .map(|l| format!("{}\n", l[1..].split_whitespace().next().unwrap()))
        .collect();
    let ids = d.0.join("ids.txt");
    std::fs::write(&ids, listed).unwrap();
    let ids = ids.to_str().unwrap();
    // The same sequences with taxonomy, as NCBI's preformatted databases have it: human
    // 9606, mouse 10090, the rest 7. By fragments `-taxids` failed in the statistics
    // runs ("Taxonomy ID(s) not found"), and BLAST+ takes its search space from the
    // taxa kept, which no fragment sees.
    let map: String = zcat(DB_GZ)
        .lines()
        .filter_map(|l| l.strip_prefix('>'))
        .map(|l| {
            let id = l.split_whitespace().next().unwrap();
            let taxid = if id.ends_with("_HUMAN") {
                9606
            } else if id.ends_with("_MOUSE") {
                10090
            } else {
                7
            };
            format!("{}\t{taxid}\n", id.split('|').nth(1).unwrap())
        })
        .collect();
    std::fs::write(d.0.join("taxid.map"), map).unwrap();
    let taxdb = d.0.join("taxdb");
    let mut c = Command::new("makeblastdb");
    c.arg("-in").arg(f.join("prot.fasta")).args(["-dbtype", "prot", "-parse_seqids", "-taxid_map"]).arg(d.0.join("taxid.map"));
    c.args(["-title", "taxdb", "-out"]).arg(&taxdb);
    run_ok(c);
    let taxdb = taxdb.to_str().unwrap();
    for (db, extra) in [
        ("protdb", &["-culling_limit", "1"][..]),
        ("protdb", &["-qcov_hsp_perc", "60"]),
        ("protdb", &["-parse_deflines"]),
        ("protdb", &["-sorthits", "2"]),
        ("protdb", &["-seqidlist", ids]),
        (taxdb, &["-taxids", "9606"]),
        (taxdb, &["-negative_taxids", "7"]),
    ] {
        let option = extra[0];
        let want = d.0.join("serial.0");
        serial("blastp", f, db, q2, "0", &want, extra);
        let got = d.0.join("gepsea.0");
        let summary = d.0.join("summary.json");
        search(f, "blastp", db, q2, "0", &got, &[&["--summary-json", summary.to_str().unwrap(), "--"][..], extra].concat());
        assert_identical(&got, &want, option);
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
        assert_eq!(v["split"], "Queries", "{option}");
        let out = d.0.join("refused.0");
        let o = out.to_str().unwrap();
        let base = ["search", "--quiet", "--workers", "2", "--db", db, "--query", q2, "--out", o];
        let e = one_line_error(f, &[&base[..], &["--split", "fragments", "--"], extra].concat(), &out);
        assert!(e.contains(&format!("BLAST+ option {option} is searched split by queries only (drop --split fragments)")), "{e}");
        let e = one_line_error(f, &[&base[..], &["--no-agent", "--"], extra].concat(), &out);
        assert!(
            e.contains(&format!("BLAST+ option {option} needs each query searched on the whole database")) && e.contains("drop --no-agent"),
            "{e}"
        );
    }
    // XML with query masking (blastn's DUST is on by default): by queries from the start.
    // By fragments it was refused only once the search was done and masks were seen.
    let want = d.0.join("serial.5");
    serial("blastn", f, "nucldb", "nq2.fasta", "5", &want, &[]);
    let got = d.0.join("gepsea.5");
    let summary = d.0.join("summary.json");
    search(f, "blastn", "nucldb", "nq2.fasta", "5", &got, &["--summary-json", summary.to_str().unwrap()]);
    assert_identical(&got, &want, "blastn XML");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(v["split"], "Queries", "blastn XML");
    let out = d.0.join("refused.5");
    let args = [
        "search",
        "--quiet",
        "--program",
        "blastn",
        "--db",
        "nucldb",
        "--query",
        "nq2.fasta",
        "--outfmt",
        "5",
        "--split",
        "fragments",
        "--out",
    ];
    let e = one_line_error(f, &[&args[..], &[out.to_str().unwrap()]].concat(), &out);
    assert!(e.contains("BLAST+ option -dust (on by default for blastn) is searched split by queries only"), "{e}");
}

#[test]
fn version_names_gepsea_and_blast() {
    let o = run_ok({
        let mut c = gepsea();
        c.arg("--version");
        c
    });
    let blast = String::from_utf8(
        run_ok({
            let mut c = Command::new("blastp");
            c.arg("-version");
            c
        })
        .stdout,
    )
    .unwrap();
    let v = blast.split_whitespace().nth(1).unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), format!("gepsea {}\nBLAST+ {v}\n", env!("CARGO_PKG_VERSION")));
}

/// Processes whose command line mentions `needle`, other than the caller.
fn processes_with(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) && !cmd.contains("programs-") {
                found.push(cmd);
            }
        }
    }
    found
}

#[test]
fn a_signal_stops_a_search_and_leaves_nothing_behind() {
    let f = fixture();
    let d = tempdir("signals");
    let queries = d.0.join("q40.fasta");
    std::fs::write(&queries, head(&zcat(QUERY_GZ), 40)).unwrap();
    for (sig, code) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        let outdir = d.0.join(format!("out{sig}"));
        std::fs::create_dir_all(&outdir).unwrap();
        let child = gepsea()
            .current_dir(f)
            .args(["search", "--quiet", "--workers", "2", "--db", "protdb", "--outfmt", "0", "--query"])
            .arg(&queries)
            .arg("--out")
            .arg(outdir.join("hits.txt"))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        // Wait until the job has started (its job directory exists), then signal.
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::fs::read_dir(&outdir).unwrap().count() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(500));
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(pid as i32, sig) };
        let st = child.wait_with_output().unwrap();
        assert_eq!(st.status.code(), Some(code), "signal {sig}: {}", String::from_utf8_lossy(&st.stderr));
        // No output and no temporary file: only the work directory a rerun resumes from,
        // and only if a batch was finished before the signal (`resume.rs`).
        let left: Vec<String> =
            std::fs::read_dir(&outdir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        let parts = finished_parts(&outdir.join("hits.txt"));
        let allowed: &[&str] = if parts == 0 { &[] } else { &[".hits.txt.gepsea-work"] };
        assert_eq!(left, allowed, "signal {sig}: left next to the output ({parts} finished parts)");
        for p in [
            gepsea_net::trust::user_runtime_root().join(format!("gepsea-search-{pid}")),
            gepsea_net::namespace_dir(&format!("search{pid}")),
        ] {
            assert!(!p.exists(), "{} was left", p.display());
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !processes_with(&format!("search{pid}")).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(processes_with(&format!("search{pid}")), Vec::<String>::new(), "processes of the stopped search");
    }
}
