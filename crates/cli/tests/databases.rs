//! Real databases: existing BLAST databases searched in place (multi-volume protein and
//! nucleotide, by path and through BLASTDB, with taxonomy), `gepsea db format` streaming
//! compressed input, and the errors a damaged or wrong database gets. Every output is
//! compared byte for byte with serial NCBI BLAST+ on the same database.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::SystemTime;

use common::{assert_identical, gepsea, head, run_ok, tempdir, zcat, DB_GZ, DB_PROTEINS, QUERY_GZ, RRNA};

/// Built once per test process, removed at exit: the first [`DB_PROTEINS`] example
/// proteins as plain FASTA, a 3-volume protein database of them and a multi-volume 16S
/// nucleotide database (makeblastdb `-max_file_sz`), with queries for each.
static DIR: OnceLock<PathBuf> = OnceLock::new();

fn fixture() -> &'static Path {
    common::fixture(&DIR, "databases", |dir| {
        std::fs::create_dir_all(dir.join("prot")).unwrap();
        std::fs::create_dir_all(dir.join("nucl")).unwrap();
        let db = zcat(DB_GZ);
        std::fs::write(dir.join("DB.fasta"), head(&db, DB_PROTEINS)).unwrap();
        std::fs::write(dir.join("q.fasta"), head(&zcat(QUERY_GZ), 24)).unwrap();
        let rrna = std::fs::read_to_string(RRNA).unwrap();
        // Four 16S queries: each aligns to about 500 of the 5,181 (pairwise, 1.5 MB of
        // output per query); twelve made this file's slowest test (69 s).
        std::fs::write(dir.join("nq.fasta"), head(&rrna, 4)).unwrap();
        let mut c = Command::new("makeblastdb");
        c.args([
            "-in",
            "../DB.fasta",
            "-dbtype",
            "prot",
            "-parse_seqids",
            "-title",
            "Example proteins",
            "-out",
            "exdb",
            "-max_file_sz",
            "1MB",
        ])
        .current_dir(dir.join("prot"));
        run_ok(c);
        let mut c = Command::new("makeblastdb");
        c.args(["-in", RRNA, "-dbtype", "nucl", "-parse_seqids", "-title", "16S gold", "-out", "s16", "-max_file_sz", "400KB"])
            .current_dir(dir.join("nucl"));
        run_ok(c);
    })
}

/// Names, sizes and modification times of every file under `dir`.
fn snapshot(dir: &Path) -> BTreeMap<String, (u64, SystemTime)> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| {
            let m = e.metadata().unwrap();
            (e.file_name().to_string_lossy().to_string(), (m.len(), m.modified().unwrap()))
        })
        .collect()
}

/// Runs `program` serially on `db` (from `cwd`, with `blastdb` as BLASTDB) into `out`,
/// on both cores (BLAST+'s output does not depend on its thread count).
fn serial(program: &str, cwd: &Path, blastdb: Option<&Path>, db: &str, query: &Path, outfmt: &str, out: &Path) {
    let mut c = Command::new(program);
    c.current_dir(cwd)
        .env_remove("BLASTDB")
        .args(["-db", db, "-outfmt", outfmt, "-num_threads", "2", "-query"])
        .arg(query)
        .arg("-out")
        .arg(out);
    if let Some(b) = blastdb {
        c.env("BLASTDB", b);
    }
    run_ok(c);
}

/// `gepsea search` from `cwd`, with `blastdb` as BLASTDB.
fn search(cwd: &Path, blastdb: Option<&Path>, db: &str, query: &Path, outfmt: &str, out: &Path, extra: &[&str]) -> Output {
    let mut c = gepsea();
    c.current_dir(cwd)
        .env_remove("BLASTDB")
        .args(["search", "--quiet", "--workers", "2", "--db", db, "--outfmt", outfmt, "--query"])
        .arg(query)
        .arg("--out")
        .arg(out)
        .args(extra);
    if let Some(b) = blastdb {
        c.env("BLASTDB", b);
    }
    run_ok(c)
}

/// Leftovers of a search next to its output: nothing but the output itself.
fn assert_only(dir: &Path, expected: &[&str]) {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().to_string()).collect();
    names.sort();
    let mut want: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(names, want, "{} holds other files than the outputs", dir.display());
}

#[test]
fn a_multi_volume_protein_database_is_searched_in_place_by_path() {
    let f = fixture();
    let prot = f.join("prot");
    let volumes = std::fs::read_dir(&prot).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".pin")).count();
    assert!(volumes >= 3, "the fixture should be multi-volume, has {volumes} index files");
    let before = snapshot(&prot);
    let d = tempdir("prot");
    for fmt in ["0", "5", "6", "7"] {
        let want = d.0.join(format!("serial.{fmt}"));
        // By a path relative to the working directory, as a user types it.
        serial("blastp", f, None, "prot/exdb", &f.join("q.fasta"), fmt, &want);
        for split in ["queries", "fragments"] {
            let got = d.0.join(format!("gepsea.{fmt}.{split}"));
            search(f, None, "prot/exdb", &f.join("q.fasta"), fmt, &got, &["--split", split]);
            assert_identical(&got, &want, &format!("outfmt {fmt}, split by {split}"));
            std::fs::remove_file(&got).unwrap();
        }
        std::fs::remove_file(&want).unwrap();
    }
    assert_eq!(snapshot(&prot), before, "the database directory was written to");
    assert_only(&d.0, &[]);
}

#[test]
fn a_database_named_through_blastdb_keeps_its_name_and_work_dirs_are_reused() {
    let f = fixture();
    let d = tempdir("byname");
    let blastdb = f.join("prot");
    let want = d.0.join("serial.7");
    serial("blastp", &d.0, Some(&blastdb), "exdb", &f.join("q.fasta"), "7", &want);
    let work = d.0.join("work");
    for (i, extra) in
        [&["--split", "fragments", "--fragments", "3"][..], &["--split", "fragments", "--fragments", "3", "--no-agent"]].iter().enumerate()
    {
        let got = d.0.join(format!("gepsea.{i}"));
        let mut args = extra.to_vec();
        args.extend(["--work-dir", work.to_str().unwrap()]);
        search(&d.0, Some(&blastdb), "exdb", &f.join("q.fasta"), "7", &got, &args);
        assert_identical(&got, &want, &format!("by name through BLASTDB, {extra:?}"));
        assert!(std::fs::read_to_string(&got).unwrap().contains("# Database: exdb\n"), "the report names the database as given");
    }
    // One side directory, made by the first search and reused by the second: three
    // virtual fragments over OID ranges covering the database once, in order.
    let sides: Vec<PathBuf> = std::fs::read_dir(&work).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(sides.len(), 1, "{sides:?}");
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(sides[0].join("manifest.json")).unwrap()).unwrap();
    let frags = m["fragments"].as_array().unwrap();
    assert_eq!(frags.len(), 3);
    let mut next = 0;
    for fr in frags {
        assert_eq!(fr["first_oid"].as_u64().unwrap(), next);
        next += fr["sequences"].as_u64().unwrap();
    }
    assert_eq!(next, m["sequences"].as_u64().unwrap());
    let alias = std::fs::read_to_string(sides[0].join("frag01.stats.pal")).unwrap();
    assert!(alias.contains("FIRST_OID ") && alias.contains("LAST_OID ") && alias.contains(&format!("NSEQ {next}\n")), "{alias}");
}

#[test]
fn a_multi_volume_nucleotide_database_gives_serial_blastn_output() {
    let f = fixture();
    let nucl = f.join("nucl");
    assert!(nucl.join("s16.nal").is_file(), "the fixture should have a .nal alias over its volumes");
    let before = snapshot(&nucl);
    let d = tempdir("nucl");
    for fmt in ["0", "5", "6", "7"] {
        let want = d.0.join(format!("serial.{fmt}"));
        serial("blastn", f, None, "nucl/s16", &f.join("nq.fasta"), fmt, &want);
        // XML with DUST-masked queries is refused split by fragments (docs/blast.md).
        let splits: &[&str] = if fmt == "5" { &["queries"] } else { &["queries", "fragments"] };
        for split in splits {
            let got = d.0.join(format!("gepsea.{fmt}.{split}"));
            search(f, None, "nucl/s16", &f.join("nq.fasta"), fmt, &got, &["--split", split]);
            assert_identical(&got, &want, &format!("blastn outfmt {fmt}, split by {split}"));
        }
    }
    assert_eq!(snapshot(&nucl), before, "the database directory was written to");
}

#[test]
fn taxonomy_columns_equal_serial_blast() {
    let f = fixture();
    let d = tempdir("tax");
    // A taxid for every sequence, from its position: different taxa across fragments.
    let fasta = std::fs::read_to_string(f.join("DB.fasta")).unwrap();
    let map: String = fasta
        .lines()
        .filter_map(|l| l.strip_prefix('>'))
        .enumerate()
        .map(|(i, l)| format!("{} {}\n", l.split_whitespace().next().unwrap(), [9606, 10090, 562, 4932, 7227][i % 5]))
        .collect();
    std::fs::write(d.0.join("taxmap.txt"), map).unwrap();
    let mut c = Command::new("makeblastdb");
    c.args(["-in", "../DB.fasta", "-dbtype", "prot", "-parse_seqids", "-title", "tax", "-taxid_map"])
        .arg(d.0.join("taxmap.txt"))
        .args(["-out"])
        .arg(d.0.join("taxdb"))
        .current_dir(f.join("prot"));
    run_ok(c);
    // The same through `db format`, passing -taxid_map through (a relative path).
    let mut c = gepsea();
    c.current_dir(&d.0).arg("db").arg("format").arg("--input").arg(f.join("DB.fasta")).args([
        "--fragments",
        "3",
        "--title",
        "tax",
        "--name",
        "taxdb",
        "--out",
        "formatted",
        "--",
        "-taxid_map",
        "taxmap.txt",
    ]);
    run_ok(c);
    let fmt = "6 qseqid sseqid staxids sscinames evalue bitscore";
    let want = d.0.join("serial.tax");
    serial("blastp", &d.0, None, "taxdb", &f.join("q.fasta"), fmt, &want);
    let text = std::fs::read_to_string(&want).unwrap();
    assert!(
        text.lines().any(|l| l.split('\t').nth(2) == Some("10090")),
        "taxids should be in the serial output: {}",
        &text[..200.min(text.len())]
    );
    for (db, split) in [("taxdb", "fragments"), ("taxdb", "queries"), ("formatted", "fragments")] {
        let got = d.0.join(format!("gepsea.{db}.{split}"));
        search(&d.0, None, db, &f.join("q.fasta"), fmt, &got, &["--split", split]);
        assert_identical(&got, &want, &format!("taxonomy columns, {db} split by {split}"));
    }
}

#[test]
fn db_format_streams_every_compression_to_the_same_fragments() {
    let f = fixture();
    let d = tempdir("format");
    let plain = f.join("DB.fasta");
    run_ok({
        let mut c = Command::new("zstd");
        c.args(["-q", "-3"]).arg(&plain).arg("-o").arg(d.0.join("DB.fasta.zst"));
        c
    });
    for (tool, ext) in [("bzip2", "bz2"), ("gzip", "gz")] {
        run_ok({
            let mut c = Command::new("sh");
            c.arg("-c").arg(format!("{tool} -c {} > {}", plain.display(), d.0.join(format!("DB.fasta.{ext}")).display()));
            c
        });
    }
    let fragments = |m: &Path| -> Vec<(String, u64, u64, u64)> {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(m.join("manifest.json")).unwrap()).unwrap();
        v["fragments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["name"].as_str().unwrap().to_string(),
                    f["sequences"].as_u64().unwrap(),
                    f["residues"].as_u64().unwrap(),
                    f["first_oid"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let mut all = Vec::new();
    for (input, jobs) in
        [(d.0.join("DB.fasta.gz"), "2"), (d.0.join("DB.fasta.zst"), "1"), (d.0.join("DB.fasta.bz2"), "2"), (plain.clone(), "2")]
    {
        let out = d.0.join(format!("db-{}", input.extension().unwrap().to_string_lossy()));
        run_ok({
            let mut c = gepsea();
            c.args(["db", "format", "--fragments", "4", "--title", "Example proteins", "--name", "exdb", "--jobs", jobs, "--input"])
                .arg(&input)
                .arg("--out")
                .arg(&out);
            c
        });
        let names: Vec<String> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
        assert!(!names.iter().any(|n| n.ends_with(".fasta") || n.ends_with(".log")), "no FASTA copy or log is kept: {names:?}");
        run_ok({
            let mut c = gepsea();
            c.args(["db", "verify"]).arg(&out);
            c
        });
        all.push((input, fragments(&out)));
    }
    let first = &all[0].1;
    let residues: Vec<u64> = first.iter().map(|f| f.2).collect();
    let (lo, hi) = (residues.iter().min().unwrap(), residues.iter().max().unwrap());
    assert!(hi - lo <= 2 * 8081, "balanced by residues within two of the longest sequence: {residues:?}");
    for (input, frags) in &all[1..] {
        assert_eq!(frags, first, "{} cut differently", input.display());
    }
    // The formatted database searches like serial BLAST+ over a makeblastdb of the FASTA.
    let want = d.0.join("serial.6");
    serial("blastp", f, None, "prot/exdb", &f.join("q.fasta"), "6", &want);
    let got = d.0.join("gepsea.6");
    search(&d.0, None, "db-zst", &f.join("q.fasta"), "6", &got, &["--split", "fragments"]);
    assert_identical(&got, &want, "a zstd-formatted database");
}

/// Titles in any encoding (Latin-1 here, as older files have them): makeblastdb stores a
/// `#` for each byte outside ASCII, serially and per fragment alike, so the search
/// prints what serial BLAST+ prints. Identifiers must be ASCII, as makeblastdb
/// `-parse_seqids` refuses others ("Malformatted ID"): `db format` says so, naming the
/// line, before building anything (it was "not UTF-8" before, and a UTF-8 one failed
/// in makeblastdb with a reason it printed where `db format` did not look).
#[test]
fn db_format_takes_titles_in_any_encoding_and_refuses_identifiers_outside_ascii() {
    let f = fixture();
    let d = tempdir("latin1");
    let mut extra = [&b" caf\xe9"[..], b" \xfcber M\xfcller"].into_iter();
    let mut fasta = Vec::new();
    for line in head(&zcat(DB_GZ), 300).lines() {
        fasta.extend_from_slice(line.as_bytes());
        if line.starts_with('>') {
            fasta.extend_from_slice(extra.next().unwrap_or_default());
        }
        fasta.push(b'\n');
    }
    assert!(std::str::from_utf8(&fasta).is_err());
    std::fs::write(d.0.join("l1.fa"), &fasta).unwrap();
    std::fs::create_dir(d.0.join("serial")).unwrap();
    let mut c = Command::new("makeblastdb");
    c.current_dir(d.0.join("serial")).args(["-in", "../l1.fa", "-dbtype", "prot", "-parse_seqids", "-title", "L1", "-out", "l1"]);
    run_ok(c);
    run_ok({
        let mut c = gepsea();
        c.current_dir(&d.0).args(["db", "format", "--quiet", "--input", "l1.fa", "--fragments", "3", "--title", "L1", "--out", "l1db"]);
        c
    });
    let fmt = "6 qseqid sseqid stitle evalue bitscore";
    let want = d.0.join("serial.6");
    serial("blastp", &d.0, None, "serial/l1", &f.join("q.fasta"), fmt, &want);
    assert!(std::fs::read_to_string(&want).unwrap().contains("caf#"), "the titles' bytes are in the hits");
    let got = d.0.join("gepsea.6");
    search(&d.0, None, "l1db", &f.join("q.fasta"), fmt, &got, &["--split", "fragments"]);
    assert_identical(&got, &want, "a database with Latin-1 titles");
    for (name, id, shown) in [("latin1-id.fa", &b"x\xe9y"[..], "x\u{e9}y"), ("utf8-id.fa", "g\u{e8}ne1".as_bytes(), "g\u{e8}ne1")] {
        let input = d.0.join(name);
        std::fs::write(&input, [&b">a\nMKVL\n>"[..], id, b" title\nMKLV\n"].concat()).unwrap();
        let mut serial = Command::new("makeblastdb");
        serial.current_dir(&d.0).arg("-in").arg(&input).args(["-dbtype", "prot", "-parse_seqids", "-out", "serial/bad"]);
        let o = serial.output().unwrap();
        assert!(
            !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("Malformatted ID"),
            "{name}: serial makeblastdb refuses it: {o:?}"
        );
        let dbout = d.0.join("baddb");
        let e = fails(
            &d.0,
            &["db", "format", "--quiet", "--input", input.to_str().unwrap(), "--fragments", "2", "--out", dbout.to_str().unwrap()],
            &dbout,
        );
        let want = format!("{name}:3: identifier \"{shown}\" is not ASCII, which makeblastdb -parse_seqids refuses");
        assert!(e.contains(&want) && e.trim().lines().count() == 1, "{e}");
    }
}

/// Runs gepsea expecting failure from `cwd`: returns stderr, checks `out` was not made.
fn fails(cwd: &Path, args: &[&str], out: &Path) -> String {
    let o = gepsea().current_dir(cwd).env_remove("BLASTDB").env("RUST_BACKTRACE", "1").args(args).output().unwrap();
    assert!(!o.status.success(), "{args:?} should fail");
    assert!(!out.exists(), "{} was left behind", out.display());
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!e.contains("stack backtrace"), "a user error printed a backtrace: {e}");
    e
}

#[test]
fn bad_databases_get_clear_errors_and_leave_nothing() {
    let f = fixture();
    let d = tempdir("bad");
    let q = f.join("q.fasta");
    let q = q.to_str().unwrap();
    let out = d.0.join("out.txt");
    let o = out.to_str().unwrap();
    // A name BLAST+ does not know.
    let e = fails(&d.0, &["search", "--quiet", "--db", "no_such_db", "--query", q, "--out", o], &out);
    assert!(e.contains("\"no_such_db\" not found") && e.contains("BLASTDB"), "{e}");
    // Two databases in one `--db`, as `blastp -db "a b"` takes them: the way to join
    // them, in one line, before anything runs (it was "not found" before).
    let both = format!("{} {}", f.join("prot/exdb").display(), f.join("prot/exdb").display());
    let e = fails(&d.0, &["search", "--quiet", "--db", &both, "--query", q, "--out", o], &out);
    assert!(
        e.trim().lines().count() == 1
            && e.contains(&format!(
                "names several databases, and gepsea searches one: join them with `blastdb_aliastool -dblist \"{both}\" -dbtype prot"
            )),
        "{e}"
    );
    // A truncated volume (a copy of the database with one sequence file cut short).
    let copy = d.0.join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    for e in std::fs::read_dir(f.join("prot")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, copy.join(p.file_name().unwrap())).unwrap();
    }
    let psq = copy.join("exdb.01.psq");
    let len = std::fs::metadata(&psq).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&psq).unwrap().set_len(len / 2).unwrap();
    let e = fails(&d.0, &["search", "--quiet", "--db", "copy/exdb", "--query", q, "--out", o], &out);
    assert!(e.contains("exdb.01.psq") && e.contains(&format!("{} bytes", len / 2)) && e.contains(&len.to_string()), "{e}");
    // An alias naming a volume that is not there.
    std::fs::write(d.0.join("broken.pal"), "TITLE broken\nDBLIST copy/exdb.00 copy/missing_volume\n").unwrap();
    let e = fails(&d.0, &["search", "--quiet", "--db", "broken", "--query", q, "--out", o], &out);
    assert!(e.contains("broken") && e.contains("missing_volume"), "{e}");
    // An alias whose counts do not match its volumes.
    std::fs::write(d.0.join("lying.pal"), format!("TITLE lying\nDBLIST {}\nNSEQ 7\nLENGTH 1000\n", f.join("prot/exdb").display())).unwrap();
    let e = fails(
        f,
        &["search", "--quiet", "--split", "fragments", "--db", d.0.join("lying").to_str().unwrap(), "--query", q, "--out", o],
        &out,
    );
    assert!(e.contains("lying") && e.contains("sequences") && e.contains("7"), "{e}");
    // Duplicate identifiers: makeblastdb -parse_seqids would refuse them, so does db format.
    let dup = d.0.join("dup.fa");
    std::fs::write(&dup, ">a first\nMKVL\n>b\nMKLV\n>c\nMKKV\n>a again\nMKVV\n").unwrap();
    let dbout = d.0.join("dupdb");
    let e = fails(&d.0, &["db", "format", "--input", dup.to_str().unwrap(), "--fragments", "2", "--out", dbout.to_str().unwrap()], &dbout);
    assert!(e.contains("dup.fa:7: duplicate sequence identifier \"a\" (first seen on line 1)"), "{e}");
    // One UniProt accession under two identifiers, in what become two fragments: each
    // fragment's makeblastdb would accept its half, serial makeblastdb refuses the file.
    let acc = d.0.join("acc.fa");
    std::fs::write(&acc, ">sp|P12345|A_HUMAN one\nMKVL\n>other\nMKLV\n>tr|P12345|B_HUMAN two\nMKKV\n").unwrap();
    let serial_dir = d.0.join("serial-acc");
    std::fs::create_dir(&serial_dir).unwrap();
    let mut serial = Command::new("makeblastdb");
    serial.current_dir(&serial_dir).arg("-in").arg(&acc).args(["-dbtype", "prot", "-parse_seqids", "-out", "acc"]);
    assert!(!serial.output().unwrap().status.success(), "serial makeblastdb takes them for one sequence");
    std::fs::remove_dir_all(&serial_dir).unwrap();
    let e = fails(&d.0, &["db", "format", "--input", acc.to_str().unwrap(), "--fragments", "2", "--out", dbout.to_str().unwrap()], &dbout);
    assert!(e.contains("acc.fa:5: sequence \"tr|P12345|B_HUMAN\" has the accession \"P12345\" of \"sp|P12345|A_HUMAN\" (line 1)"), "{e}");
    std::fs::remove_file(&acc).unwrap();
    // `db verify` given a file, not the database's directory.
    let e = fails(&d.0, &["db", "verify", dup.to_str().unwrap()], &dbout);
    assert_eq!(
        e.trim(),
        format!("gepsea: error: {} is a file, not a database directory: give the directory `gepsea db format --out` made", dup.display())
    );
    let leftovers: Vec<_> =
        std::fs::read_dir(&d.0).unwrap().map(|e| e.unwrap().file_name()).filter(|n| n.to_string_lossy().contains("tmp")).collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // Options gepsea sets itself, with what to use instead.
    let e = fails(
        &d.0,
        &["db", "format", "--input", dup.to_str().unwrap(), "--fragments", "1", "--out", dbout.to_str().unwrap(), "--", "-title", "x"],
        &dbout,
    );
    assert!(e.contains("-title is set by gepsea db format; use --title"), "{e}");
    // --fragments belongs to existing databases.
    run_ok({
        let mut c = gepsea();
        c.args(["db", "format", "--input", DB_GZ, "--fragments", "2", "--out"]).arg(d.0.join("g2"));
        c
    });
    let e = fails(&d.0, &["search", "--quiet", "--split", "fragments", "--fragments", "5", "--db", "g2", "--query", q, "--out", o], &out);
    assert!(e.contains("--fragments 5") && e.contains("format it again"), "{e}");
    // An output path that is a volume's file of the BLAST database searched: refused,
    // the volume untouched.
    let before = snapshot(&f.join("prot"));
    let volume_file = f.join("prot/exdb.01.psq");
    let o2 = gepsea()
        .current_dir(f)
        .env_remove("BLASTDB")
        .args(["search", "--quiet", "--db", "prot/exdb", "--query", q, "--out"])
        .arg(&volume_file)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o2.stderr);
    assert!(!o2.status.success() && e.contains("exdb.01.psq is a file of the database"), "{e}");
    assert_eq!(snapshot(&f.join("prot")), before, "the volume was written to");
    assert_only(&d.0, &["broken.pal", "copy", "dup.fa", "g2", "lying.pal"]);
}

#[test]
fn db_format_force_replaces_a_database_in_place_and_nothing_else() {
    use std::os::unix::fs::MetadataExt;
    let d = tempdir("force");
    let input = d.0.join("in.fasta");
    std::fs::write(&input, head(&zcat(QUERY_GZ), 30)).unwrap();
    let format = |cwd: &Path, out: &str, fragments: &str, force: bool| {
        let mut c = gepsea();
        c.current_dir(cwd).args(["-q", "db", "format", "--fragments", fragments, "--input"]).arg(&input).args(["--out", out]);
        if force {
            c.arg("--force");
        }
        c.output().unwrap()
    };
    let fragments_in = |dir: &Path| std::fs::read_to_string(dir.join("manifest.json")).unwrap().matches("\"first_oid\"").count();
    // `--out .` in an empty directory builds there; `--force` replaces that database in
    // the same directory (a shell sitting in it keeps seeing it), leaving nothing beside.
    let here = d.0.join("here");
    std::fs::create_dir(&here).unwrap();
    let inode = std::fs::metadata(&here).unwrap().ino();
    assert!(format(&here, ".", "2", false).status.success());
    assert_eq!(fragments_in(&here), 2);
    // What a killed run left beside it (its half-built database) is swept; a live
    // run's (this test's own pid stands for one) is not.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let (stale, live) = (d.0.join(format!(".here.tmp{}", gone.id())), d.0.join(format!(".here.tmp{}", std::process::id())));
    for dir in [&stale, &live] {
        std::fs::create_dir(dir).unwrap();
        std::fs::write(dir.join("frag00.psq"), "half").unwrap();
    }
    assert!(format(&here, ".", "3", true).status.success());
    assert!(!stale.exists() && live.is_dir(), "the dead run's build is swept, the live one's kept");
    std::fs::remove_dir_all(&live).unwrap();
    assert_eq!((fragments_in(&here), std::fs::metadata(&here).unwrap().ino()), (3, inode));
    run_ok({
        let mut c = gepsea();
        c.args(["-q", "db", "verify"]).arg(&here);
        c
    });
    let mut beside: Vec<String> = std::fs::read_dir(&d.0).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    beside.sort();
    assert_eq!(beside, ["here", "in.fasta"]);
    // A directory of other things is not a database: `--force` refuses it, and leaves it
    // as it was (this emptied the working directory before).
    let other = d.0.join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "mine").unwrap();
    let o = format(&other, ".", "2", true);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("holds files but no gepsea database (no manifest.json)"), "{e}");
    assert_eq!(std::fs::read_to_string(other.join("notes.txt")).unwrap(), "mine");
    assert_eq!(std::fs::read_dir(&other).unwrap().count(), 1);
    // Nor does it replace a database that holds the input it is reading.
    let inside = here.join("in.fasta");
    std::fs::copy(&input, &inside).unwrap();
    let mut c = gepsea();
    c.args(["-q", "db", "format", "--fragments", "2", "--force", "--input"]).arg(&inside).arg("--out").arg(&here);
    let o = c.output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("lies inside --out") && e.contains("which --force would replace"), "{e}");
    assert!(inside.is_file() && fragments_in(&here) == 3);
}

#[test]
fn db_format_stopped_by_a_signal_leaves_no_half_built_database() {
    let d = tempdir("format-signal");
    // Eight copies of the example database under new accessions (BLAST+ refuses
    // repeated ones): 92 MB, so that the build is still under way when it is stopped.
    let db = zcat(DB_GZ);
    let mut big = String::with_capacity(8 * db.len() + (8 << 20));
    for copy in 0..8 {
        for line in db.lines() {
            match line.strip_prefix('>').and_then(|l| l.split_once('|')) {
                Some((tag, rest)) => {
                    let (acc, rest) = rest.split_once('|').unwrap_or((rest, ""));
                    big.push_str(&format!(">{tag}|{acc}x{copy}|{rest}\n"));
                }
                None => {
                    big.push_str(line);
                    big.push('\n');
                }
            }
        }
    }
    let input = d.0.join("big.fasta");
    std::fs::write(&input, big).unwrap();
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let mut c = gepsea();
        c.current_dir(&d.0).args(["db", "format", "--input", "big.fasta", "--fragments", "4", "--out", "big"]);
        let child = c.stderr(std::process::Stdio::piped()).spawn().unwrap();
        let tmp = d.0.join(format!(".big.tmp{}", child.id()));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        // Stopped once makeblastdb has written into the build.
        while std::fs::read_dir(&tmp).map_or(true, |mut e| e.next().is_none()) {
            assert!(std::time::Instant::now() < deadline, "the build never started");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(child.id() as i32, signal) };
        let o = child.wait_with_output().unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(128 + signal), "stopped, not finished: {e}");
        assert!(e.contains(&format!("stopping (signal {signal}): removing the database being built")), "{e}");
        let mut left: Vec<String> =
            std::fs::read_dir(&d.0).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, ["big.fasta"], "signal {signal}: the half-built database was left");
    }
}
