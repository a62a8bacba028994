//! `gepsea db format` + `gepsea search` against serial NCBI BLAST+ on real data: the
//! output must be byte-identical (pairwise output may differ only in its "Posted date"
//! line), for every format, fragment count and worker count; and every user error must
//! be reported clearly with a non-zero exit and no output file.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::{gepsea, records, run_ok, tempdir, zcat, DB_GZ, DB_PROTEINS, QUERY_GZ, RRNA};

const TITLE: &str = "UniProt example 5000";

/// Shared, built once: plain FASTA files (the first [`DB_PROTEINS`] example proteins), the
/// serial reference database, and gepsea databases with 1, 3 and 8 fragments. Removed
/// when the test process exits.
fn fixture() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    common::fixture(&DIR, "search", |dir| {
        std::fs::create_dir_all(dir.join("ref")).unwrap();
        let queries = zcat(QUERY_GZ);
        std::fs::write(dir.join("DB.fasta"), records(&zcat(DB_GZ), 0, DB_PROTEINS)).unwrap();
        std::fs::write(dir.join("q25.fasta"), records(&queries, 0, 25)).unwrap();
        std::fs::write(dir.join("q5.fasta"), records(&queries, 50, 5)).unwrap();
        let mut c = Command::new("makeblastdb");
        c.args(["-in", "../DB.fasta", "-dbtype", "prot", "-parse_seqids", "-title", TITLE, "-out", "DB"]).current_dir(dir.join("ref"));
        run_ok(c);
        for f in [1, 3, 8] {
            let mut c = gepsea();
            c.args(["db", "format", "--fragments", &f.to_string(), "--title", TITLE, "--input"])
                .arg(dir.join("DB.fasta"))
                .arg("--out")
                .arg(dir.join(format!("db{f}")));
            run_ok(c);
        }
    })
}

/// Serial BLAST+ over the reference database, as a user would run it.
fn serial(program: &str, refdir: &Path, db: &str, query: &Path, outfmt: &str, extra: &[&str], out: &Path) {
    let mut c = Command::new(program);
    c.env("BLASTDB", refdir)
        .args(["-db", db, "-outfmt", outfmt, "-num_threads", "2", "-query"])
        .arg(query)
        .arg("-out")
        .arg(out)
        .args(extra);
    run_ok(c);
}

/// Serial BLAST+ on the fixture's `queries` (`q25`) without options, in format
/// `fmt`: run once for the whole file, since several tests compare against the same
/// reference.
fn serial_ref(f: &Path, queries: &str, fmt: &str) -> PathBuf {
    type Cells = Mutex<HashMap<String, Arc<OnceLock<PathBuf>>>>;
    static REFS: OnceLock<Cells> = OnceLock::new();
    let name = format!("serial-{queries}.{fmt}");
    let cell = REFS.get_or_init(Default::default).lock().unwrap().entry(name.clone()).or_default().clone();
    cell.get_or_init(|| {
        let want = f.join(name);
        serial("blastp", &f.join("ref"), "DB", &f.join(format!("{queries}.fasta")), fmt, &[], &want);
        want
    })
    .clone()
}

/// The two ways of cutting a search into tasks, as `gepsea search` flags.
const SPLITS: [&[&str]; 2] = [&["--split", "fragments"], &["--split", "queries"]];

/// The split a finished search reports in its `--summary-json`.
fn reported_split(summary: &Path) -> String {
    let text = std::fs::read_to_string(summary).unwrap_or_else(|e| panic!("{}: {e}", summary.display()));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["split"].as_str().unwrap_or_else(|| panic!("no split in {text}")).to_string()
}

fn search_mode(db: &Path, query: &Path, outfmt: &str, workers: usize, extra: &[&str], out: &Path, mode: &[&str]) -> Output {
    let mut c = gepsea();
    c.args(["search", "--quiet", "--outfmt", outfmt, "--workers", &workers.to_string(), "--db"])
        .arg(db)
        .arg("--query")
        .arg(query)
        .arg("--out")
        .arg(out)
        .args(mode);
    if !extra.is_empty() {
        c.arg("--").args(extra);
    }
    run_ok(c)
}

/// Byte equality, except the "Posted date" line of pairwise output (the only allowed
/// difference: the databases were built at different times).
fn assert_same(got: &Path, want: &Path, what: &str) {
    let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let (g, w) = (read(got), read(want));
    if g == w {
        return;
    }
    let strip = |b: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(b).split('\n').filter(|l| !l.starts_with("    Posted date:  ")).map(|s| s.to_string()).collect()
    };
    let (gl, wl) = (strip(&g), strip(&w));
    if gl == wl {
        return;
    }
    let i = gl.iter().zip(&wl).position(|(a, b)| a != b).unwrap_or(gl.len().min(wl.len()));
    panic!(
        "{what}: output differs from serial BLAST+ at line {} ({} vs {} lines)\n  gepsea: {:?}\n  serial: {:?}",
        i + 1,
        gl.len(),
        wl.len(),
        gl.get(i),
        wl.get(i)
    );
}

/// Every pair of (format, fragment count), (format, worker count) and (fragment count,
/// worker count) split by fragments, and every (format, worker count) split by queries:
/// the worker count follows the format and the fragment count in turn. The full product
/// (32 searches of 50 queries) took this file past half of `make test`'s time, and a
/// format's printing does not depend on how the merged hits were cut. On 25 queries,
/// whose serial references the architecture test shares: split by fragments, the
/// default batches depend on the worker and fragment counts, not on the queries, so
/// those searches still assemble as many parts as on 50.
#[test]
fn identical_to_serial_blastp_for_every_format_fragment_and_worker_count() {
    let f = fixture();
    let q = f.join("q25.fasta");
    let mut covered = std::collections::BTreeSet::new();
    for (i, fmt) in ["6", "7", "0", "5"].into_iter().enumerate() {
        let want = serial_ref(f, "q25", fmt);
        for (j, frags) in [1, 3, 8].into_iter().enumerate() {
            let workers = 1 + (i + j) % 2;
            covered.insert((frags, workers));
            let got = f.join(format!("gepsea.{fmt}.{frags}.{workers}"));
            search_mode(&f.join(format!("db{frags}")), &q, fmt, workers, &[], &got, SPLITS[0]);
            assert_same(&got, &want, &format!("outfmt {fmt}, {frags} fragments, {workers} workers"));
            std::fs::remove_file(&got).unwrap();
        }
        // Split by queries (the default on one machine): the fragments do not matter.
        let workers = 1 + i % 2;
        let got = f.join(format!("gepsea.{fmt}.q.{workers}"));
        let summary = f.join("summary.json");
        search_mode(&f.join("db3"), &q, fmt, workers, &[], &got, &["--summary-json", summary.to_str().unwrap()]);
        assert_same(&got, &want, &format!("outfmt {fmt}, split by queries, {workers} workers"));
        assert_eq!(reported_split(&summary), "Queries", "the default split on one machine with 25 queries");
        std::fs::remove_file(&got).unwrap();
    }
    assert_eq!(covered.len(), 6, "every fragment count with both worker counts");
}

/// The agent mode's variants and the no-agent baseline (mpiBLAST's own architecture):
/// merging and writing by one agent, round robin, without compression, and the master
/// doing everything itself; small batches so that many parts are assembled. On 25
/// queries (half the residues, half the batch size): the 12 searches of 50 took 140 s.
#[test]
fn every_architecture_is_identical_to_serial_blastp() {
    let f = fixture();
    let q = f.join("q25.fasta");
    for fmt in ["7", "0", "5"] {
        let want = serial_ref(f, "q25", fmt);
        for mode in [
            &["--no-agent"][..],
            &["--split", "fragments", "--merge-assign", "single", "--batch-residues", "1500"],
            &["--split", "fragments", "--merge-assign", "static", "--no-compress", "--no-hot-swap", "--batch-residues", "1000"],
            &["--split", "queries", "--merge-assign", "static", "--no-compress", "--batch-residues", "350"],
        ] {
            let got = f.join(format!("gepsea-arch.{fmt}"));
            let summary = f.join("summary-arch.json");
            search_mode(&f.join("db3"), &q, fmt, 2, &[], &got, &[mode, &["--summary-json", summary.to_str().unwrap()]].concat());
            assert_same(&got, &want, &format!("outfmt {fmt} with {mode:?}"));
            // Over the agents, each batch's share of the output was written in place by
            // the agent that wrote its part (merged, or written by BLAST+ split by
            // queries); without agents the master does everything.
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
            if let Some(accel) = v["accel"].as_object() {
                let (parts, placed) = (accel["parts"].as_u64().unwrap(), accel["placed_by_agents"].as_u64().unwrap());
                assert!(parts > 1, "{mode:?}: {parts} parts");
                assert_eq!(placed, parts, "outfmt {fmt} with {mode:?}: batches placed by their agent");
            } else {
                assert!(mode.contains(&"--no-agent"), "{mode:?}: no accel statistics in {v}");
            }
        }
    }
}

/// The counts in the summary line about fragment staging (hot-swap), by source.
fn stagings(stderr: &[u8]) -> Option<[u32; 4]> {
    let text = String::from_utf8_lossy(stderr);
    let line = text.lines().find(|l| l.contains("fragments staged"))?;
    let num = |after: &str| -> u32 { line.split(after).next().unwrap().rsplit(' ').next().unwrap().parse().unwrap() };
    Some([num(" already staged"), num(" from memory"), num(" from another node"), num(" from storage")])
}

/// Hot-swap on one node: the agent prefetches every fragment from shared storage once,
/// and every task then finds its fragment staged; `--no-hot-swap` stages nothing.
#[test]
fn hot_swap_reads_each_fragment_from_storage_once() {
    let f = fixture();
    let q = f.join("q25.fasta");
    let want = serial_ref(f, "q25", "6");
    let got = f.join("gepsea-hot.6");
    let run = |mode: &[&str]| {
        let mut c = gepsea();
        c.args(["search", "--split", "fragments", "--outfmt", "6", "--workers", "2", "--batch-residues", "4000", "--db"])
            .arg(f.join("db8"))
            .arg("--query")
            .arg(&q)
            .arg("--out")
            .arg(&got)
            .args(mode);
        let o = run_ok(c);
        assert_same(&got, &want, &format!("outfmt 6 with {mode:?}"));
        o
    };
    let o = run(&[]);
    let text = String::from_utf8_lossy(&o.stderr).to_string();
    let [staged, memory, peer, storage] = stagings(&o.stderr).unwrap_or_else(|| panic!("no staging summary: {text}"));
    assert_eq!((storage, peer, memory), (8, 0, 0), "{text}");
    // The 8 prefetches and each worker's first use of each fragment ask the agent (a
    // worker reuses what it was given); whichever asks first reads from storage. The
    // data streaming's look ahead also stages: it counts only what it reads (here from
    // storage), and it can win the race against the prefetch that was to read that
    // fragment, which then counts it as already staged (seen once in CI: 17 + 8).
    assert!(staged + storage >= 8 && staged + storage <= 8 + 2 * 8 + 8, "{text}");
    // Without a budget every fragment stays staged: the peak is the whole database's
    // searched files, as the manifest lists them.
    let manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(f.join("db8/manifest.json")).unwrap()).unwrap();
    let sizes: Vec<u64> = manifest["fragments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|fr| {
            let files = fr["files"].as_object().unwrap().keys().filter(|n| !n.ends_with(".fasta"));
            files.map(|n| std::fs::metadata(f.join("db8").join(n)).unwrap().len()).sum()
        })
        .collect();
    assert_eq!(sizes.len(), 8);
    assert_eq!(scratch_use(&o.stderr), (sizes.iter().sum(), 0), "{text}");
    // Under a budget with room for three fragments (two being searched, one being
    // staged), staging one more removes the least recently used copy: the peak stays
    // under the budget, fragments evicted and needed again come back from the agent's
    // memory, never from storage again, and the output is unchanged.
    let largest = *sizes.iter().max().unwrap();
    // Written as a user would, in KiB (rounded up).
    let budget = (3 * largest).div_ceil(1024) * 1024;
    let o = run(&["--scratch-bytes", &format!("{} KiB", budget / 1024)]);
    let text = String::from_utf8_lossy(&o.stderr).to_string();
    let [_, memory, peer, storage] = stagings(&o.stderr).unwrap_or_else(|| panic!("no staging summary: {text}"));
    let (peak, evicted) = scratch_use(&o.stderr);
    assert!(peak <= budget && peak >= largest, "peak {peak} against a budget of {budget}: {text}");
    assert!(evicted >= 8 - 3, "{text}");
    assert_eq!((storage, peer), (8, 0), "{text}");
    assert!(memory <= evicted, "{text}");
    let o = run(&["--no-hot-swap"]);
    assert_eq!(stagings(&o.stderr), None);
}

/// From the staging summary line: the most bytes staged on a node, and the staged
/// copies removed to stay under `--scratch-bytes`.
fn scratch_use(stderr: &[u8]) -> (u64, u32) {
    let text = String::from_utf8_lossy(stderr);
    let line = text.lines().find(|l| l.contains("fragments staged")).unwrap_or_else(|| panic!("no staging summary: {text}"));
    let after = |marker: &str| line.split(marker).nth(1).unwrap_or_else(|| panic!("no {marker:?} in {line}"));
    let peak = after("at most ").split(' ').next().unwrap().parse().unwrap();
    let evicted = after("bytes staged on a node, ").split(' ').next().unwrap().parse().unwrap();
    (peak, evicted)
}

#[test]
fn blast_options_after_double_dash_keep_identity() {
    let f = fixture();
    let q = f.join("q25.fasta");
    let opts = ["-evalue", "1e-5", "-max_target_seqs", "50", "-comp_based_stats", "1", "-seg", "yes"];
    for fmt in ["6", "0", "5"] {
        let want = f.join(format!("serial-opts.{fmt}"));
        serial("blastp", &f.join("ref"), "DB", &q, fmt, &opts, &want);
        for split in SPLITS {
            let got = f.join(format!("gepsea-opts.{fmt}"));
            if fmt == "5" && split == SPLITS[0] {
                // Merged fragments cannot yet print SEG-masked residues the way serial XML
                // does: refused, never written differently.
                let mut c = gepsea();
                c.args(["search", "--quiet", "--outfmt", "5", "--db"])
                    .arg(f.join("db3"))
                    .arg("--query")
                    .arg(&q)
                    .arg("--out")
                    .arg(&got)
                    .args(split)
                    .arg("--")
                    .args(opts);
                let o = c.output().unwrap();
                assert!(
                    !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("-outfmt 5"),
                    "{}",
                    String::from_utf8_lossy(&o.stderr)
                );
                assert!(!got.exists());
                continue;
            }
            search_mode(&f.join("db3"), &q, fmt, 2, &opts, &got, split);
            assert_same(&got, &want, &format!("outfmt {fmt} with {opts:?} and {split:?}"));
        }
    }
}

#[test]
fn queries_that_may_overflow_the_preliminary_hit_list_are_searched_whole() {
    // At -evalue 1000 nearly every query has more candidates than BLAST's preliminary
    // list holds; merging fragments would differ from serial BLAST (measured: 49 of 50
    // queries). gepsea must detect this and still match.
    let f = fixture();
    let q = f.join("q5.fasta");
    let opts = ["-evalue", "1000"];
    let want = f.join("serial-e1000.6");
    serial("blastp", &f.join("ref"), "DB", &q, "6", &opts, &want);
    let got = f.join("gepsea-e1000.6");
    let re_searched = |split: &[&str]| -> usize {
        let mut c = gepsea();
        c.args(["search", "--outfmt", "6", "--workers", "2", "--db"])
            .arg(f.join("db3"))
            .arg("--query")
            .arg(&q)
            .arg("--out")
            .arg(&got)
            .args(split)
            .arg("--")
            .args(opts);
        let out = run_ok(c);
        assert_same(&got, &want, &format!("outfmt 6 at -evalue 1000, {split:?}"));
        let log = String::from_utf8_lossy(&out.stderr);
        log.split(" queries re-searched whole")
            .next()
            .and_then(|s| s.rsplit('(').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no summary in {log}"))
    };
    let n = re_searched(SPLITS[0]);
    assert!(n > 0, "expected whole-database fallbacks when split by fragments");
    // Split by queries every task is a whole-database search: nothing to re-search.
    assert_eq!(re_searched(SPLITS[1]), 0);
}

#[test]
fn blastn_on_16s_rrna_is_identical() {
    let dir = tempdir("blastn");
    let db = dir.0.join("rrna.fasta");
    std::fs::write(&db, records(&std::fs::read_to_string(RRNA).unwrap(), 0, 2000)).unwrap();
    let q = dir.0.join("q.fasta");
    std::fs::write(&q, records(&std::fs::read_to_string(RRNA).unwrap(), 2000, 4)).unwrap();
    let mut c = Command::new("makeblastdb");
    c.args(["-in", "../rrna.fasta", "-dbtype", "nucl", "-parse_seqids", "-title", "16S gold", "-out", "rrna"]);
    std::fs::create_dir_all(dir.0.join("ref")).unwrap();
    c.current_dir(dir.0.join("ref"));
    run_ok(c);
    let mut c = gepsea();
    c.args(["db", "format", "--fragments", "3", "--title", "16S gold", "--input"]).arg(&db).arg("--out").arg(dir.0.join("g"));
    run_ok(c);
    for fmt in ["6", "0"] {
        let want = dir.0.join(format!("serial.{fmt}"));
        serial("blastn", &dir.0.join("ref"), "rrna", &q, fmt, &[], &want);
        for split in SPLITS {
            let got = dir.0.join(format!("gepsea.{fmt}"));
            search_mode(&dir.0.join("g"), &q, fmt, 2, &[], &got, split);
            assert_same(&got, &want, &format!("blastn outfmt {fmt}, {split:?}"));
        }
    }
}

#[test]
fn a_worker_killed_mid_run_does_not_change_the_output() {
    let f = fixture();
    let q = f.join("q25.fasta");
    let want = serial_ref(f, "q25", "6");
    for split in SPLITS {
        kill_a_worker(f, &q, &want, split);
    }
}

fn kill_a_worker(f: &Path, q: &Path, want: &Path, split: &[&str]) {
    let got = f.join("gepsea-kill.6");
    let mut c = gepsea();
    // Small batches: many tasks, so the run lasts long enough to kill a worker in it.
    c.args(["search", "--outfmt", "6", "--workers", "2", "--batch-residues", "2000", "--db"])
        .arg(f.join("db8"))
        .arg("--query")
        .arg(q)
        .arg("--out")
        .arg(&got)
        .args(split);
    let child = c.stderr(std::process::Stdio::piped()).spawn().unwrap();
    // Find a worker (a child process of the search that is running BLAST+; the agent,
    // also a child, runs none) and kill it while it searches.
    let master = child.id();
    let mut killed = None;
    'find: for _ in 0..200 {
        std::thread::sleep(Duration::from_millis(50));
        let kids = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children")).unwrap_or_default();
        for pid in kids.split_whitespace() {
            let grandkids = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
            if !grandkids.trim().is_empty() {
                let _ = Command::new("kill").args(["-9", pid]).status();
                let _ = Command::new("kill").args(["-9", grandkids.trim()]).status();
                killed = Some(pid.to_string());
                break 'find;
            }
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "search failed after a worker was killed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(killed.is_some(), "never found a worker to kill");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("died") && log.contains("reassigned"), "the kill went unnoticed: {log}");
    assert_same(&got, want, &format!("outfmt 6 with a killed worker, {split:?}"));
}

/// Runs gepsea expecting failure: returns stderr, and checks no output was left.
fn fails(args: &[&str], out: Option<&Path>) -> String {
    let o = gepsea().args(args).output().unwrap();
    assert!(!o.status.success(), "{args:?} should fail");
    if let Some(p) = out {
        assert!(!p.exists(), "{} was left behind", p.display());
        let dir = p.parent().unwrap();
        let leftovers: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.contains("gepsea-tmp"))
            .collect();
        assert!(leftovers.is_empty(), "temporary output left: {leftovers:?}");
    }
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn user_errors_are_clear_and_leave_nothing_behind() {
    let f = fixture();
    let d = tempdir("errors");
    let p = |n: &str| d.0.join(n);
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let out = p("out.txt");
    let db3 = s(&f.join("db3"));
    let q = s(&f.join("q25.fasta"));
    let search = |db: &str, q: &str| -> String {
        fails(&["search", "--quiet", "--db", db, "--query", q, "--out", &s(&out), "--outfmt", "6"], Some(&out))
    };

    // Missing files.
    let e = search(&db3, &s(&p("nope.fa")));
    assert!(e.contains("nope.fa") && e.contains("No such file"), "{e}");
    let e = search(&s(&p("nodb")), &q);
    assert!(e.contains("manifest.json") && e.contains("gepsea db format"), "{e}");
    // Malformed FASTA, with the line (digits are BLAST+'s to ignore: tests/programs.rs).
    std::fs::write(p("bad.fa"), ">q1\nMKV\n>q2\nMK.V\n").unwrap();
    let e = search(&db3, &s(&p("bad.fa")));
    assert!(e.contains("bad.fa:4: invalid character '.'"), "{e}");
    // Empty query file.
    std::fs::write(p("empty.fa"), "").unwrap();
    assert!(search(&db3, &s(&p("empty.fa"))).contains("no sequences"));
    // (Duplicate query ids are accepted, as BLAST+ accepts them: tests/programs.rs.)
    // Nucleotide queries against a protein database.
    std::fs::write(p("dna.fa"), ">n1\nACGTACGTTGCAACGTAGCTAGCTAGCTGACTGATCGATCG\n").unwrap();
    let e = search(&db3, &s(&p("dna.fa")));
    assert!(e.contains("nucleotide sequences but the database") && e.contains("protein"), "{e}");
    // A manifest whose checksums don't match: damage a copy of a fragment.
    let copy = p("damaged");
    run_ok({
        let mut c = Command::new("cp");
        c.arg("-r").arg(f.join("db3")).arg(&copy);
        c
    });
    let target = std::fs::read_dir(&copy)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "psq"))
        .unwrap();
    let mut bytes = std::fs::read(&target).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&target, &bytes).unwrap();
    // A search checks sizes only; `db verify` reads every byte.
    let e = fails(&["db", "verify", &s(&copy)], None);
    assert!(e.contains("checksum mismatch") && e.contains(".psq"), "{e}");
    std::fs::write(&target, &bytes[..bytes.len() - 1]).unwrap();
    let e = search(&s(&copy), &q);
    assert!(e.contains(".psq") && e.contains("but the manifest says") && e.contains("truncated"), "{e}");
    std::fs::write(&target, &bytes).unwrap();
    // Files the manifest does not list, which every search reads: refused before any
    // task runs, naming the file (BLAST+ failed at the first task, twice, naming none).
    let name = serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(copy.join("manifest.json")).unwrap()).unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    for missing in [format!("{name}.pal"), "stats.pal".to_string(), "stats-seq.psq".to_string()] {
        let aside = p("aside");
        std::fs::rename(copy.join(&missing), &aside).unwrap();
        for split in SPLITS {
            let (db, out_path) = (s(&copy), s(&out));
            let mut args = vec!["search", "--quiet", "--db", &db, "--query", &q, "--out", &out_path, "--outfmt", "6"];
            args.extend(split);
            let e = fails(&args, Some(&out));
            assert!(e.contains(&format!("{}: missing; the database is incomplete", s(&copy.join(&missing)))), "{missing}, {split:?}: {e}");
        }
        std::fs::rename(&aside, copy.join(&missing)).unwrap();
    }
    // Unwritable output path.
    let e = fails(&["search", "--quiet", "--db", &db3, "--query", &q, "--out", &s(&p("no/such/dir/out.txt"))], None);
    assert!(e.contains("cannot write the output") && e.contains("no/such/dir"), "{e}");
    // A path under a file: said of the output, not of the hidden work directory
    // beside it (the first thing written there).
    std::fs::write(p("plain-file"), "x").unwrap();
    let e = fails(&["search", "--quiet", "--db", &db3, "--query", &q, "--out", &s(&p("plain-file/out.txt"))], None);
    assert!(
        e.trim() == format!("gepsea: error: cannot write the output {}: Not a directory (os error 20)", s(&p("plain-file/out.txt"))),
        "{e}"
    );
    std::fs::remove_file(p("plain-file")).unwrap();
    // An output path that names an input is refused before anything is written, and
    // the input is intact: the query file (also through a link), a file of the
    // database. A directory is refused before the search too (it failed at the end,
    // after every task).
    let q_copy = p("q-copy.fasta");
    std::fs::copy(&q, &q_copy).unwrap();
    std::os::unix::fs::symlink(&q_copy, p("q-link.fasta")).unwrap();
    let manifest = f.join("db3").join("manifest.json");
    let before = (std::fs::read(&q_copy).unwrap(), std::fs::read(&manifest).unwrap());
    for (target, what) in
        [(q_copy.clone(), "the query file"), (p("q-link.fasta"), "the query file"), (manifest.clone(), "a file of the database")]
    {
        let e = fails(&["search", "--quiet", "--db", &db3, "--query", &s(&q_copy), "--out", &s(&target)], None);
        assert!(e.contains(&format!("is {what}: the search's output would replace it")), "{e}");
    }
    assert_eq!(before, (std::fs::read(&q_copy).unwrap(), std::fs::read(&manifest).unwrap()));
    std::fs::create_dir(p("a-dir")).unwrap();
    let e = fails(&["search", "--quiet", "--db", &db3, "--query", &q, "--out", &s(&p("a-dir"))], None);
    assert!(e.contains("a-dir: it is a directory"), "{e}");
    assert!(!p(".a-dir.gepsea-work").exists(), "a refused search leaves no work directory");
    // A bad option is refused before any task runs (more in tests/programs.rs).
    for split in SPLITS {
        let o = gepsea()
            .args(["search", "--db", &db3, "--query", &q, "--out", &s(&out), "--workers", "2"])
            .args(split)
            .args(["--", "-evalue", "abc"])
            .output()
            .unwrap();
        assert!(!o.status.success());
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(
            !e.contains("retrying once") && e.contains("BLAST+ refused the options after --") && e.contains("evalue"),
            "{split:?}: {e}"
        );
        assert!(!out.exists());
    }
    // An output format BLAST+ does not have fails before any task runs too, in one line
    // (BLAST+ does not report it as an option error), with and without agents; zero
    // workers is refused rather than run as one.
    for agents in [&[][..], &["--no-agent"][..]] {
        let mut args = vec!["search", "--quiet", "--db", &db3, "--query", &q];
        let o = s(&out);
        args.extend(["--out", &o, "--outfmt", "99"]);
        args.extend(agents);
        let e = fails(&args, Some(&out));
        assert!(
            e.contains("--outfmt 99: BLAST+ refused it (Formatting choice is out of range)")
                && !e.contains("failed twice")
                && e.trim().lines().count() == 1,
            "{agents:?}: {e}"
        );
    }
    // A tabular field BLAST+ does not know (it would leave the column out, silently),
    // named with the one meant when it is a slip away.
    let e = fails(&["search", "--db", &db3, "--query", &q, "--out", &s(&out), "--outfmt", "6 qseqid sseqid evalu"], Some(&out));
    assert_eq!(
        e.trim(),
        "gepsea: error: --outfmt \"6 qseqid sseqid evalu\": blastp has no field evalu (did you mean evalue?) and would print the rows without it; `blastp -help` lists its fields under -outfmt"
    );
    let e = fails(&["search", "--db", &db3, "--query", &q, "--out", &s(&out), "--outfmt", "10 delim=; qacc bogus"], Some(&out));
    assert!(e.contains("blastp has no field bogus and would print") && e.trim().lines().count() == 1, "{e}");
    // The fields are lower case: a capital is one slip, and the field meant is named.
    let e = fails(&["search", "--db", &db3, "--query", &q, "--out", &s(&out), "--outfmt", "6 qseqid Sseqid"], Some(&out));
    assert!(e.contains("blastp has no field Sseqid (did you mean sseqid?)"), "{e}");
    let e = fails(&["search", "--db", &db3, "--query", &q, "--out", &s(&out), "--workers", "0"], Some(&out));
    assert!(e.contains("invalid value '0' for '--workers <WORKERS>': must be at least 1"), "{e}");
    // A bare prefix is refused with both readings, not guessed.
    let e = fails(&["search", "--db", &db3, "--query", &q, "--out", &s(&out), "--scratch-bytes", "20G"], Some(&out));
    assert!(
        e.contains("invalid value '20G' for '--scratch-bytes <SIZE>': 20G is ambiguous: 20GiB (21474836480 bytes) or 20GB (20000000000)?"),
        "{e}"
    );
    // A BLAST+ failure in every task (taxonomy filtering of a database without taxonomy,
    // which only the real search can tell): retried once, then BLAST's own line. By
    // fragments a taxonomy filter is refused before anything runs (the search space
    // comes from the taxa kept in the whole database).
    let e = fails(
        &["search", "--quiet", "--db", &db3, "--query", &q, "--out", &s(&out), "--split", "fragments", "--", "-taxids", "9606"],
        Some(&out),
    );
    assert!(e.contains("BLAST+ option -taxids is searched split by queries only") && e.trim().lines().count() == 1, "{e}");
    {
        let split = ["--split", "queries"];
        let o = gepsea()
            .args(["search", "--db", &db3, "--query", &q, "--out", &s(&out), "--workers", "2"])
            .args(split)
            .args(["--", "-taxids", "9606"])
            .output()
            .unwrap();
        assert!(!o.status.success());
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains("retrying once") && e.contains("failed twice") && e.contains("Taxonomy ID"), "{split:?}: {e}");
        assert!(!e.contains("USAGE"), "{e}");
        assert!(!out.exists());
        // Errors only under -q: the retry is not one (it was printed all the same).
        let o = gepsea()
            .args(["-q", "search", "--db", &db3, "--query", &q, "--out", &s(&out), "--workers", "2"])
            .args(split)
            .args(["--", "-taxids", "9606"])
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && e.trim().lines().count() == 1 && e.contains("failed twice"), "{split:?}, -q: {e}");
    }
    // An agent that cannot start (a core this machine does not have) is reported at
    // once (not after the start timeout, whose error differs), in one line with the
    // agent's own reason.
    let e = fails(&["search", "--quiet", "--agent-cpu", "4096", "--db", &db3, "--query", &q, "--out", &s(&out)], Some(&out));
    assert!(e.contains("the agent did not start: --cpu 4096") && e.trim().lines().count() == 1, "{e}");
    // The no-agent baseline is mpiBLAST's fragment search only.
    let e = fails(&["search", "--quiet", "--no-agent", "--split", "queries", "--db", &db3, "--query", &q, "--out", &s(&out)], Some(&out));
    assert!(e.contains("--split queries needs the agents"), "{e}");
    // Agent-mode options are refused without agents, not silently ignored.
    for agent_only in [
        &["--scratch-bytes", "100000000"][..],
        &["--no-compress"],
        &["--no-hot-swap"],
        &["--agent-cpu", "0"],
        &["--merge-assign", "static"],
    ] {
        let mut args = vec!["search", "--quiet", "--no-agent", "--db", &db3, "--query", &q];
        let o = s(&out);
        args.extend(["--out", &o]);
        args.extend(agent_only);
        let e = fails(&args, Some(&out));
        assert!(e.contains(agent_only[0]) && e.contains("--no-agent") && e.contains("cannot be used with"), "{agent_only:?}: {e}");
    }
    // db format: more fragments than sequences; non-empty directory.
    std::fs::write(p("two.fa"), ">a\nMKV\n>b\nMKL\n").unwrap();
    let e = fails(&["db", "format", "--input", &s(&p("two.fa")), "--fragments", "3", "--out", &s(&p("two"))], None);
    assert!(e.contains("cannot split 2 sequences into 3 fragments"), "{e}");
    assert!(!p("two").exists());
    let e = fails(&["db", "format", "--input", &s(&p("two.fa")), "--fragments", "1", "--out", &db3], None);
    assert!(e.contains("is not empty; pass --force"), "{e}");
}

#[test]
fn blast_not_installed_is_reported() {
    let f = fixture();
    let d = tempdir("nopath");
    let out = d.0.join("o.txt");
    let o = gepsea()
        .env("PATH", "/nonexistent")
        .args(["search", "--quiet", "--db"])
        .arg(f.join("db3"))
        .arg("--query")
        .arg(f.join("q25.fasta"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("blastp not found") && e.contains("ncbi-blast+"), "{e}");
    assert!(!out.exists());
}

/// A search whose stderr reader goes away (`2>&1 | head -1`, a hung-up terminal)
/// finishes its work: its progress and summary lines are not worth the search (a
/// write to the broken pipe panicked and ended it, leaving no output).
#[test]
fn a_search_whose_progress_reader_went_away_still_finishes() {
    let f = fixture();
    let d = tempdir("noreader");
    let out = d.0.join("hits.6");
    for split in SPLITS {
        let mut c = gepsea();
        c.args(["search", "--outfmt", "6", "--workers", "2", "--db"])
            .arg(f.join("db3"))
            .arg("--query")
            .arg(f.join("q25.fasta"))
            .arg("--out")
            .arg(&out)
            .args(split)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        // The reader closes its end before a line is written.
        drop(child.stderr.take());
        let status = child.wait().unwrap();
        assert!(status.success(), "{split:?}: {status}");
        assert!(std::fs::read(&out).unwrap() == std::fs::read(serial_ref(f, "q25", "6")).unwrap(), "{split:?}: output differs");
        std::fs::remove_file(&out).unwrap();
    }
}

#[test]
fn queries_from_standard_input_are_searched_as_from_a_file() {
    let f = fixture();
    let want = serial_ref(f, "q25", "6");
    let d = tempdir("stdin");
    // Plain and gzip-compressed (`cat q.fasta | gepsea search --query - ...`).
    let plain = std::fs::read(f.join("q25.fasta")).unwrap();
    let mut gzip = Command::new("gzip");
    gzip.arg("-c").arg(f.join("q25.fasta"));
    let gz = run_ok(gzip).stdout;
    for (what, input) in [("plain", plain), ("gzip", gz)] {
        let out = d.0.join(format!("{what}.6"));
        let mut c = gepsea();
        c.args(["search", "--quiet", "--outfmt", "6", "--workers", "2", "--query", "-", "--db"])
            .arg(f.join("db3"))
            .arg("--out")
            .arg(&out)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), &input).unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{what}: {}", String::from_utf8_lossy(&o.stderr));
        assert_same(&out, &want, &format!("queries on standard input, {what}"));
    }
    // Bad input there is named as such.
    let mut c = gepsea();
    c.args(["search", "--query", "-", "--db"])
        .arg(f.join("db3"))
        .arg("--out")
        .arg(d.0.join("bad.6"))
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"MKV\n>q1\nMKV\n").unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(!o.status.success());
    assert_eq!(
        String::from_utf8_lossy(&o.stderr).trim(),
        "gepsea: error: standard input:1: sequence data before the first '>' header line"
    );
    assert!(!d.0.join("bad.6").exists());
}

#[test]
fn output_to_standard_output_a_device_or_a_link_goes_where_it_points() {
    use std::os::unix::fs::FileTypeExt;
    let f = fixture();
    let want = serial_ref(f, "q25", "6");
    let d = tempdir("destinations");
    let search = |out: &str| {
        let mut c = gepsea();
        c.current_dir(&d.0)
            .args(["search", "--quiet", "--outfmt", "6", "--workers", "2", "--query"])
            .arg(f.join("q25.fasta"))
            .arg("--db")
            .arg(f.join("db3"))
            .args(["--out", out]);
        run_ok(c)
    };
    // `-`: standard output, byte for byte.
    let o = search("-");
    std::fs::write(d.0.join("stdout.6"), &o.stdout).unwrap();
    assert_same(&d.0.join("stdout.6"), &want, "--out -");
    // A device stays a device: renamed onto, the output replaced /dev/null itself. A
    // null device of the test's own (as root), so that a regression replaces that one.
    let null = d.0.join("null");
    run_ok({
        let mut c = Command::new("mknod");
        c.arg(&null).args(["c", "1", "3"]);
        c
    });
    search("null");
    assert!(std::fs::metadata(&null).unwrap().file_type().is_char_device(), "the device was replaced");
    // A link: the file it points to gets the output, the link stays.
    std::os::unix::fs::symlink("target.6", d.0.join("link.6")).unwrap();
    search("link.6");
    assert!(std::fs::symlink_metadata(d.0.join("link.6")).unwrap().file_type().is_symlink());
    assert_same(&d.0.join("target.6"), &want, "--out through a link");
    let mut names: Vec<_> = std::fs::read_dir(&d.0).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["link.6", "null", "stdout.6", "target.6"]);
}
