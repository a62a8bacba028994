//! ParaMEDIC on files: `gepsea paramedic encode` at the "compute site", `decode` at the
//! "storage site" against its own replica (a copy) of the database. The regenerated
//! output must be byte-identical to the output, in every supported format; damaged
//! metadata or a different replica must fail clearly and write nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

const DB_GZ: &str = "/usr/share/doc/mmseqs2/example-data/DB.fasta.gz";
const QUERY_GZ: &str = "/usr/share/doc/mmseqs2/example-data/QUERY.fasta.gz";

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process that is killed and reaped if the test ends, or fails, before it
/// does: a failed assertion left a storage site running for good.
struct Running(Option<std::process::Child>);

impl Running {
    fn spawn(mut c: Command) -> Running {
        Running(Some(c.spawn().unwrap()))
    }

    fn child(&mut self) -> &mut std::process::Child {
        self.0.as_mut().expect("not taken")
    }

    /// The child, no longer killed on drop: the test waits for it itself.
    fn take(mut self) -> std::process::Child {
        self.0.take().expect("not taken")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            // SIGTERM first, so that a storage site removes its runtime directory;
            // SIGKILL if it has not ended within 5 s.
            // SAFETY: signalling our own child by pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while c.try_wait().ok().flatten().is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn gepsea() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gepsea"));
    c.env("RUST_BACKTRACE", "0");
    c
}

fn run_ok(mut c: Command) -> Output {
    let o = c.output().unwrap();
    assert!(o.status.success(), "{c:?}: {}", String::from_utf8_lossy(&o.stderr));
    o
}

fn fails(mut c: Command) -> String {
    let o = c.output().unwrap();
    assert!(!o.status.success(), "{c:?} should have failed");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The first `n` records of a gzipped FASTA file.
fn head(gz: &str, n: usize) -> String {
    let text = String::from_utf8(
        run_ok({
            let mut c = Command::new("zcat");
            c.arg(gz);
            c
        })
        .stdout,
    )
    .unwrap();
    let mut k = 0;
    text.lines()
        .filter(|l| {
            if l.starts_with('>') {
                k += 1;
            }
            k <= n
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

struct Fixture {
    dir: TempDir,
}

fn fixture_dir() -> PathBuf {
    std::env::temp_dir().join(format!("gepsea-paramedic-test-{}", std::process::id()))
}

extern "C" fn remove_fixture() {
    let _ = std::fs::remove_dir_all(fixture_dir());
}

/// A 3-fragment database, its replica (a copy, as the storage site would hold), and 15
/// queries; built once for all tests of this file.
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = TempDir(fixture_dir());
        std::fs::create_dir_all(&dir.0).unwrap();
        // A static is never dropped: remove the directory when the test process exits.
        // SAFETY: registering a plain C callback that only removes a directory.
        unsafe { libc::atexit(remove_fixture) };
        std::fs::write(dir.0.join("q.fasta"), head(QUERY_GZ, 15)).unwrap();
        let mut c = gepsea();
        c.args(["db", "format", "--fragments", "3", "--title", "T", "--name", "DB", "--input", DB_GZ, "--out"]).arg(dir.0.join("db"));
        run_ok(c);
        run_ok({
            let mut c = Command::new("cp");
            c.arg("-a").arg(dir.0.join("db")).arg(dir.0.join("replica"));
            c
        });
        Fixture { dir }
    })
}

fn search(f: &Fixture, query: &Path, fmt: &str, extra: &[&str], out: &Path) {
    let mut c = gepsea();
    c.args(["search", "--quiet", "--workers", "2", "--outfmt", fmt, "--db"])
        .arg(f.dir.0.join("db"))
        .arg("--query")
        .arg(query)
        .arg("--out")
        .arg(out);
    if !extra.is_empty() {
        c.arg("--").args(extra);
    }
    run_ok(c);
}

fn encode(f: &Fixture, output: &Path, query: &Path, fmt: &str, extra: &[&str], meta: &Path) {
    let mut c = gepsea();
    c.args(["paramedic", "encode", "--outfmt", fmt, "--output"])
        .arg(output)
        .arg("--out")
        .arg(meta)
        .arg("--db")
        .arg(f.dir.0.join("db"))
        .arg("--query")
        .arg(query);
    if !extra.is_empty() {
        c.arg("--").args(extra);
    }
    run_ok(c);
}

fn decode(f: &Fixture, meta: &Path, out: &Path) -> Command {
    let mut c = gepsea();
    c.args(["paramedic", "decode", "--metadata"]).arg(meta).arg("--out").arg(out).arg("--db").arg(f.dir.0.join("replica"));
    c
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("gepsea-tmp"))
        .collect()
}

#[test]
fn blast_metadata_regenerates_every_format_exactly() {
    let f = fixture();
    let d = &f.dir.0;
    let q = d.join("q.fasta");
    // Query-anchored too, once with more alignments than descriptions: the subjects of
    // the last eight alignments of each query are named only in its alignment blocks.
    let fewer_listed = ["-num_descriptions", "2", "-num_alignments", "10"];
    // CSV rows with their own fields and whole subject identifiers
    // (`tr|A7TBS3|A7TBS3_NEMVE`): read by the query and subject columns wherever they are,
    // before titles that hold commas.
    let custom = "10 evalue sseqid qacc stitle";
    for (fmt, args) in [("0", &[][..]), ("5", &[]), ("6", &[]), ("7", &[]), ("1", &[]), ("3", &fewer_listed), (custom, &[])] {
        let out = d.join(format!("direct.{fmt}"));
        search(f, &q, fmt, args, &out);
        let meta = d.join(format!("meta.{fmt}"));
        encode(f, &out, &q, fmt, args, &meta);
        // One BLAST+ process, and three at once over chunks of the queries (the formats
        // added later only the latter, whose joining of chunks renumbers and widens).
        let threads: &[&str] = if ["0", "5", "6", "7"].contains(&fmt) { &["1", "3"] } else { &["3"] };
        for &threads in threads {
            let regen = d.join(format!("regen.{fmt}.{threads}"));
            let mut c = decode(f, &meta, &regen);
            c.args(["--threads", threads]);
            let log = String::from_utf8_lossy(&run_ok(c).stderr).into_owned();
            assert!(
                !log.contains("per query"),
                "outfmt {fmt}, {threads} thread(s): the search over all subjects should have been exact: {log}"
            );
            let (want, got) = (std::fs::read(&out).unwrap(), std::fs::read(&regen).unwrap());
            assert!(
                want == got,
                "outfmt {fmt}, {threads} thread(s): regenerated {} bytes differ from the {} bytes written directly",
                got.len(),
                want.len()
            );
        }
        let want = std::fs::read(&out).unwrap();
        let m = std::fs::metadata(&meta).unwrap().len() as usize;
        if fmt == "0" {
            // ParaMEDIC's point: pairwise output shrinks by two orders of magnitude.
            assert!(m * 100 < want.len(), "pairwise: {m} bytes of metadata for {} bytes of output", want.len());
        }
        if fmt == "6" {
            // The data include a query with many hits.
            let mut per_query = std::collections::HashMap::<&str, usize>::new();
            let text = String::from_utf8(want.clone()).unwrap();
            for l in text.lines() {
                *per_query.entry(l.split('\t').next().unwrap()).or_default() += 1;
            }
            assert!(per_query.values().any(|n| *n >= 200), "no query with 200+ hit lines: {per_query:?}");
        }
    }
}

/// Queries whose deflines are Latin-1, not UTF-8 (BLAST+ prints their bytes): the
/// report is encoded (its rows found by those identifiers) and regenerated exactly,
/// also when joined from chunks of the queries.
#[test]
fn latin1_query_titles_are_regenerated_byte_for_byte() {
    let f = fixture();
    let d = TempDir(f.dir.0.join("latin1"));
    std::fs::create_dir_all(&d.0).unwrap();
    let text = std::fs::read(f.dir.0.join("q.fasta")).unwrap();
    let mut records: Vec<Vec<u8>> = text.split(|&b| b == b'>').skip(1).take(6).map(|r| [&b">"[..], r].concat()).collect();
    records[0].splice(1..1, b"g\xe8ne1 ".iter().copied());
    records[3].splice(1..1, b"q\xfc4 caf\xe9 ".iter().copied());
    let q = d.0.join("latin1.fasta");
    std::fs::write(&q, records.concat()).unwrap();
    for fmt in ["0", "5", "7"] {
        let out = d.0.join(format!("direct.{fmt}"));
        search(f, &q, fmt, &[], &out);
        let want = std::fs::read(&out).unwrap();
        assert!(want.windows(5).any(|w| w == b"g\xe8ne1"), "outfmt {fmt}: the title's byte is printed");
        let meta = d.0.join(format!("meta.{fmt}"));
        encode(f, &out, &q, fmt, &[], &meta);
        let regen = d.0.join(format!("regen.{fmt}"));
        let mut c = decode(f, &meta, &regen);
        c.args(["--threads", "3"]);
        run_ok(c);
        assert!(std::fs::read(&regen).unwrap() == want, "outfmt {fmt}: the regenerated report differs");
    }
}

/// A report searched through the database's alias file (`--db db/DB`) names the
/// database as given, which a regeneration from the directory cannot print: encoding
/// it is refused at once, saying what to search with, instead of after a regeneration
/// that could only differ ("regeneration mismatch").
#[test]
fn a_report_naming_another_database_path_is_refused_when_encoded() {
    let f = fixture();
    let d = TempDir(f.dir.0.join("alias"));
    std::fs::create_dir_all(&d.0).unwrap();
    let q = f.dir.0.join("q.fasta");
    let out = d.0.join("by-alias.7");
    let alias = f.dir.0.join("db/DB");
    run_ok({
        let mut c = gepsea();
        c.args(["search", "--quiet", "--workers", "2", "--outfmt", "7", "--db"]).arg(&alias).arg("--query").arg(&q).arg("--out").arg(&out);
        c
    });
    let meta = d.0.join("meta");
    // Encoding `out` as a report in `outfmt` (one error line, also with a backtrace asked for).
    let encode = |outfmt: &str| {
        let mut c = gepsea();
        c.env("RUST_BACKTRACE", "1")
            .args(["paramedic", "encode", "--quiet", "--outfmt", outfmt, "--output"])
            .arg(&out)
            .arg("--out")
            .arg(&meta)
            .arg("--db")
            .arg(f.dir.0.join("db"))
            .arg("--query")
            .arg(&q);
        c
    };
    let e = fails(encode("7"));
    let want = format!(
        "the report names the database {:?}, and the one in {} is \"DB\": the regenerated report would name that one. Encode a report searched with --db {}",
        alias.display().to_string(),
        f.dir.0.join("db").display(),
        f.dir.0.join("db").display()
    );
    assert!(e.contains(&want) && e.trim().lines().count() == 1, "{e}");
    assert!(!meta.exists());
    // A format naming a field BLAST+ does not know (it prints the rows without it, and
    // the columns after it would be read as other fields) is refused before any row.
    let e = fails(encode("7 qacc sacc evalu"));
    assert!(
        e.contains("--outfmt \"7 qacc sacc evalu\": blastp has no field evalu (did you mean evalue?)") && e.trim().lines().count() == 1,
        "{e}"
    );
    assert!(!meta.exists());
}

/// `--ship metadata` for a report BLAST metadata cannot describe is refused before
/// anything runs, in one line saying what to ship instead (it failed when the first
/// part was encoded, after its batch had been searched).
#[test]
fn metadata_for_a_format_it_cannot_describe_is_refused_at_once() {
    let f = fixture();
    let out = f.dir.0.join("refused");
    for (fmt, why) in [
        ("18", "-outfmt 18: BLAST metadata describes formats 0 to 7 and 10"),
        // CSV whose subject comes after a title, which may hold commas.
        (
            "10 qacc stitle sacc",
            "-outfmt \"10 qacc stitle sacc\": BLAST metadata cannot find a row's query and subject after stitle, whose text may hold the separator ','; print them before it",
        ),
        // Tabular rows that do not name their subject cannot be described either.
        (
            "6 qseqid evalue",
            "-outfmt \"6 qseqid evalue\": BLAST metadata finds a row's subject by one of the fields sseqid, sacc, saccver, which the format does not print",
        ),
    ] {
        let mut c = gepsea();
        c.args(["search", "--outfmt", fmt, "--storage-site", "127.0.0.1:9", "--paramedic", "--db"])
            .arg(f.dir.0.join("db"))
            .arg("--query")
            .arg(f.dir.0.join("q.fasta"))
            .arg("--out")
            .arg(&out);
        let e = fails(c);
        let want = format!("--ship metadata: {why}; choose --ship zstd or output");
        assert!(e.contains(&want) && e.trim().lines().count() == 1, "{e}");
        assert!(!out.exists());
    }
}

/// At `-evalue 1000` whole-database searches overflow BLAST's preliminary hit list, so a
/// search over the union of subjects differs; each query is then regenerated against
/// its own subjects, and the output is still exact.
#[test]
fn overflowing_queries_are_regenerated_one_by_one() {
    let f = fixture();
    let d = &f.dir.0;
    let q = d.join("q4.fasta");
    std::fs::write(&q, head(QUERY_GZ, 4)).unwrap();
    for fmt in ["0", "6"] {
        let out = d.join(format!("e1000.{fmt}"));
        search(f, &q, fmt, &["-evalue", "1000"], &out);
        let meta = d.join(format!("e1000.meta.{fmt}"));
        encode(f, &out, &q, fmt, &["-evalue", "1000"], &meta);
        // One BLAST+ process over all 4 queries (or 3 over chunks of them) first, then
        // one per query (up to 3 at once).
        for (threads, runs) in [("1", 5), ("3", 7)] {
            let regen = d.join(format!("e1000.regen.{fmt}.{threads}"));
            let mut c = decode(f, &meta, &regen);
            c.args(["--threads", threads]);
            let o = run_ok(c);
            let log = String::from_utf8_lossy(&o.stderr);
            assert!(
                log.contains(&format!("regenerated per query, {runs} BLAST+ runs")),
                "outfmt {fmt}, {threads} thread(s): the per-query path was not taken: {log}"
            );
            assert!(std::fs::read(&out).unwrap() == std::fs::read(&regen).unwrap(), "outfmt {fmt} at -evalue 1000, {threads} thread(s)");
        }
    }
}

#[test]
fn damaged_metadata_or_another_database_fails_and_writes_nothing() {
    let f = fixture();
    let d = &f.dir.0.join("damage");
    std::fs::create_dir_all(d).unwrap();
    let q = f.dir.0.join("q.fasta");
    let out = d.join("direct.6");
    search(f, &q, "6", &[], &out);
    let meta = d.join("meta");
    encode(f, &out, &q, "6", &[], &meta);
    let good = std::fs::read(&meta).unwrap();
    let target = d.join("regen.6");

    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x10;
    std::fs::write(&meta, &flipped).unwrap();
    let e = fails(decode(f, &meta, &target));
    assert!(e.contains("metadata corrupted: SHA-256"), "{e}");
    assert!(!target.exists() && leftovers(d).is_empty());

    std::fs::write(&meta, &good[..good.len() - 100]).unwrap();
    let e = fails(decode(f, &meta, &target));
    assert!(e.contains("metadata truncated"), "{e}");
    assert!(!target.exists() && leftovers(d).is_empty());

    std::fs::write(&meta, b"not metadata at all").unwrap();
    let e = fails(decode(f, &meta, &target));
    assert!(e.contains("not ParaMEDIC metadata"), "{e}");

    // A replica that is not the database searched (fewer sequences).
    std::fs::write(&meta, &good).unwrap();
    std::fs::write(d.join("small.fasta"), head(DB_GZ, 500)).unwrap();
    let mut c = gepsea();
    c.args(["db", "format", "--fragments", "2", "--title", "T", "--name", "DB", "--input"])
        .arg(d.join("small.fasta"))
        .arg("--out")
        .arg(d.join("other"));
    run_ok(c);
    let mut c = gepsea();
    c.args(["paramedic", "decode", "--metadata"]).arg(&meta).arg("--out").arg(&target).arg("--db").arg(d.join("other"));
    let e = fails(c);
    assert!(e.contains("is not the database the compute site searched"), "{e}");
    assert!(!target.exists() && leftovers(d).is_empty());

    // Metadata that records other BLAST+ options than the search's: the regenerated
    // report differs, the storage site says so and how the search is recorded, and
    // writes nothing.
    let wrong = d.join("wrong-options");
    encode(f, &out, &q, "6", &["-evalue", "1e-30"], &wrong);
    let e = fails(decode(f, &wrong, &target));
    assert!(e.contains("regeneration mismatch") && e.contains("the search ran as `blastp -outfmt \"6\" -evalue 1e-30`"), "{e}");
    assert!(!target.exists() && leftovers(d).is_empty());

    // The intact metadata still decodes.
    run_ok(decode(f, &meta, &target));
    assert!(std::fs::read(&target).unwrap() == std::fs::read(&out).unwrap());
}

#[test]
fn zstd_plugin_round_trips_any_file() {
    let f = fixture();
    let d = &f.dir.0.join("zstd");
    std::fs::create_dir_all(d).unwrap();
    // Incompressible and compressible bytes, every byte value.
    let mut data = gepsea_net::testkit::pattern(1, 200_000);
    data.extend((0..=255u8).cycle().take(100_000));
    let input = d.join("input.bin");
    std::fs::write(&input, &data).unwrap();
    let meta = d.join("input.pmd");
    let mut c = gepsea();
    c.args(["paramedic", "encode", "--plugin", "zstd", "--output"]).arg(&input).arg("--out").arg(&meta);
    run_ok(c);
    let back = d.join("back.bin");
    let mut c = gepsea();
    c.args(["paramedic", "decode", "--metadata"]).arg(&meta).arg("--out").arg(&back);
    run_ok(c);
    assert!(std::fs::read(&back).unwrap() == data);
    // An --out that is the command's own input is refused, and the input survives
    // (encoding replaced the output with its metadata, decoding the metadata with
    // nothing).
    let mut c = gepsea();
    c.args(["paramedic", "encode", "--plugin", "zstd", "--output"]).arg(&input).arg("--out").arg(&input);
    assert!(fails(c).contains("input.bin is the --output file: writing it would destroy it"));
    let mut c = gepsea();
    c.args(["paramedic", "decode", "--metadata"]).arg(&meta).arg("--out").arg(&meta);
    assert!(fails(c).contains("input.pmd is the --metadata file"));
    assert!(std::fs::read(&input).unwrap() == data);
    let mut c = gepsea();
    c.args(["paramedic", "decode", "--metadata"]).arg(&meta).arg("--out").arg(&back);
    run_ok(c);
    assert!(std::fs::read(&back).unwrap() == data, "the metadata is intact");
}

/// Two sites as network namespaces joined by a veth pair, the compute site's side
/// limited to 100 Mbit/s: a 24 MB object is on the wire for ≈2 s, encrypted, and its
/// TCP connection is destroyed (`ss -K`, as a failing network would) in the middle. The
/// transfer resumes on a new connection within the same encrypted session, resends only
/// what the storage site had not acknowledged, and the storage site writes the exact
/// bytes.
#[test]
fn a_transfer_cut_midway_resumes_without_resending_what_arrived() {
    if std::env::var_os("GEPSEA_SKIP_NETNS").is_some() {
        return;
    }
    let f = fixture();
    let d = &f.dir.0.join("wan");
    std::fs::create_dir_all(d.join("storage")).unwrap();
    let sites = gepsea_net::testbed::NetnsPair::new("pm").unwrap();
    let tc = Command::new("ip")
        .args([
            "netns",
            "exec",
            &sites.ns[0],
            "tc",
            "qdisc",
            "add",
            "dev",
            &sites.dev[0],
            "root",
            "tbf",
            "rate",
            "100mbit",
            "burst",
            "64kb",
            "latency",
            "100ms",
        ])
        .status()
        .unwrap();
    assert!(tc.success());
    let data = gepsea_net::testkit::pattern(2, 24_000_000);
    std::fs::write(d.join("big.bin"), &data).unwrap();
    let mut c = gepsea();
    c.args(["paramedic", "encode", "--plugin", "zstd", "--output"]).arg(d.join("big.bin")).arg("--out").arg(d.join("big.pmd"));
    run_ok(c);
    let key = d.join("key");
    let mut c = gepsea();
    c.args(["paramedic", "keygen", "--out"]).arg(&key);
    run_ok(c);
    let listen = format!("{}:7600", sites.ip[1]);
    let mut serve = sites.cmd(1, env!("CARGO_BIN_EXE_gepsea"));
    serve
        .args(["paramedic", "serve", "--count", "1", "--listen", &listen, "--key"])
        .arg(&key)
        .arg("--out")
        .arg(d.join("storage"))
        .stderr(std::process::Stdio::piped());
    let serve = Running::spawn(serve);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut send = sites.cmd(0, env!("CARGO_BIN_EXE_gepsea"));
    send.args(["paramedic", "send", "--name", "big.bin", "--to", &listen, "--key"])
        .arg(&key)
        .arg("--metadata")
        .arg(d.join("big.pmd"))
        .stderr(std::process::Stdio::piped());
    let send = Running::spawn(send);
    std::thread::sleep(std::time::Duration::from_millis(800));
    let cut = Command::new("ip").args(["netns", "exec", &sites.ns[0], "ss", "-K", "-t", "dst", &sites.ip[1]]).output().unwrap();
    assert!(String::from_utf8_lossy(&cut.stdout).contains("ESTAB"), "no connection to cut: {}", String::from_utf8_lossy(&cut.stdout));
    let sent = send.take().wait_with_output().unwrap();
    let served = serve.take().wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&sent.stderr).into_owned();
    assert!(sent.status.success(), "send: {log}\nserve: {}", String::from_utf8_lossy(&served.stderr));
    assert!(served.status.success(), "serve: {}", String::from_utf8_lossy(&served.stderr));
    assert!(log.contains("encrypted"), "{log}");
    assert!(std::fs::read(d.join("storage/big.bin")).unwrap() == data, "the storage site's copy differs");
    let num = |after: &str| -> u64 { log.split(after).next().unwrap().rsplit(' ').next().unwrap().parse().unwrap() };
    let (reconnects, resent) = (num(" reconnect(s)"), num(" frame(s) resent"));
    // The object travels as pieces of the protocol's chunk size; what had arrived is not
    // resent. Each re-established connection resends what was unacknowledged when the
    // previous one broke, at most the window in flight: `ss -K` destroys the links of
    // both directions (the acknowledgements travel on one the storage site dials), and
    // on a loaded machine (a clean-clone CI run) the site then re-established its link
    // more than once (3 reconnects, 439 frames resent for 367 pieces); restarting the
    // object would resend every piece on every reconnect.
    let chunk = gepsea_net::ProtoConfig::default().chunk as u64;
    let pieces = std::fs::metadata(d.join("big.pmd")).unwrap().len().div_ceil(chunk);
    assert!(reconnects >= 1, "the connection was not re-established: {log}");
    assert!(resent < reconnects * pieces / 2, "{resent} of {pieces} pieces resent over {reconnects} reconnect(s): {log}");
}

/// `gepsea search --storage-site [--paramedic] --storage-key`: the compute site searches
/// and its agent ships, encrypted, the report as metadata, then the report itself, then
/// (without agents, from the search process) the report compressed; the storage site
/// (`paramedic serve --key`) writes the same bytes every time.
#[test]
fn search_ships_metadata_or_output_encrypted_and_the_storage_site_writes_the_report() {
    let f = fixture();
    let d = &f.dir.0.join("ship");
    std::fs::create_dir_all(d.join("storage")).unwrap();
    let key = d.join("key");
    let mut c = gepsea();
    c.args(["paramedic", "keygen", "--out"]).arg(&key);
    run_ok(c);
    // A free port on loopback for the storage site.
    let listen = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let mut serve = gepsea();
    serve
        .args(["paramedic", "serve", "--listen", &listen, "--key"])
        .arg(&key)
        .arg("--out")
        .arg(d.join("storage"))
        .arg("--db")
        .arg(f.dir.0.join("replica"))
        .stderr(std::process::Stdio::piped());
    let mut serve = Running::spawn(serve);
    let q = d.join("q8.fasta");
    std::fs::write(&q, head(QUERY_GZ, 8)).unwrap();
    let mut sent = Vec::new();
    // Last, `--ship auto` for a report BLAST metadata cannot describe (CSV rows whose
    // subject follows a title): said once, and every part compressed.
    let csv = "10 qacc stitle sacc";
    for (name, ship, agent) in
        [("hits.0", "metadata", true), ("direct.0", "output", true), ("packed.0", "zstd", false), ("auto.csv", "auto", true)]
    {
        let fmt = if name.ends_with(".csv") { csv } else { "0" };
        let out = d.join(name);
        let summary = d.join(format!("{name}.json"));
        let mut c = gepsea();
        // Not --quiet: the delivery's summary line is asserted below.
        c.args(["search", "--workers", "2", "--outfmt", fmt, "--storage-site", &listen, "--storage-key"])
            .arg(&key)
            .arg("--db")
            .arg(f.dir.0.join("db"))
            .arg("--query")
            .arg(&q)
            .arg("--out")
            .arg(&out)
            .arg("--summary-json")
            .arg(&summary);
        // `--paramedic` is the spelling of `--ship metadata`.
        if ship == "metadata" {
            c.arg("--paramedic");
        } else {
            c.args(["--ship", ship]);
        }
        if !agent {
            c.arg("--no-agent");
        }
        let o = run_ok(c);
        let log = String::from_utf8_lossy(&o.stderr);
        // With agents, every part goes as soon as its batch is final, shipped by the
        // agent that wrote it; without, the search process ships the whole output.
        assert!(log.contains(if agent { ", encrypted, by the agents (" } else { ", encrypted, by this process in" }), "{log}");
        let auto_note = format!("--ship auto: -outfmt \"{csv}\": BLAST metadata cannot find a row's query and subject after stitle, whose text may hold the separator ','; print them before it; its parts go compressed (zstd)");
        assert_eq!(log.matches(&auto_note).count(), usize::from(ship == "auto"), "{log}");
        let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
        let output = std::fs::metadata(&out).unwrap().len();
        let shipped = &s["delivery"];
        if agent {
            // The parts, each a report of its batch (a pairwise one with its header and
            // footer; CSV rows have none).
            let parts = shipped["output_bytes"].as_u64().unwrap();
            assert!(if fmt == "0" { parts > output } else { parts == output }, "{s}");
            assert!(shipped["objects"].as_u64().unwrap() > 1, "{s}");
        } else {
            assert_eq!(shipped["output_bytes"].as_u64(), Some(output), "{s}");
        }
        assert_eq!(shipped["bytes_written_at_storage"], shipped["output_bytes"]);
        assert_eq!(
            shipped["plugin"],
            [("metadata", "blast"), ("output", "raw"), ("zstd", "zstd"), ("auto", "zstd")].iter().find(|(s, _)| *s == ship).unwrap().1
        );
        assert_eq!(shipped["by_agent"], agent, "with agents, the node's agent ships, not the search process");
        assert_eq!(shipped["encrypted"], true);
        sent.push(shipped["bytes"].as_u64().unwrap());
        assert!(std::fs::read(d.join("storage").join(name)).unwrap() == std::fs::read(&out).unwrap(), "the storage site's {name} differs");
    }
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(serve.child().id() as i32, libc::SIGTERM) };
    let served = serve.take().wait_with_output().unwrap();
    let served = String::from_utf8_lossy(&served.stderr);
    assert!(!served.contains("refused") && served.contains("stopped by signal 15"), "serve: {served}");
    // The metadata is far smaller than the report it stands for.
    assert!(
        sent[0] * 10 < sent[2] && sent[2] < sent[1],
        "metadata {} bytes, compressed {} bytes, output {} bytes",
        sent[0],
        sent[2],
        sent[1]
    );
}

/// A storage site started on `listen`, once it says it listens (its port open and its
/// signal handler installed): the process, its runtime directory and its stderr.
fn started_site(listen: &str, out: &Path) -> (Running, PathBuf, std::io::BufReader<std::process::ChildStderr>) {
    let mut serve = gepsea();
    serve.args(["paramedic", "serve", "--listen", listen, "--out"]).arg(out).stderr(std::process::Stdio::piped());
    let mut running = Running::spawn(serve);
    let child = running.child();
    let runtime = gepsea_net::namespace_dir(&format!("paramedic-storage{}", child.id()));
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
    assert!(line.contains("listening on"), "{line}");
    assert!(runtime.exists(), "no runtime directory {}", runtime.display());
    (running, runtime, stderr)
}

/// Sends SIGTERM and waits (at most 10 s) for the process to end.
fn stop_with_sigterm(child: &mut std::process::Child) -> std::process::ExitStatus {
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(std::time::Instant::now() < deadline, "the storage site did not stop on SIGTERM");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A storage site runs until stopped; stopped by SIGTERM it leaves no runtime directory.
#[test]
fn a_storage_site_stopped_by_a_signal_leaves_nothing_behind() {
    let f = fixture();
    let d = f.dir.0.join("stopped");
    let listen = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let (mut running, runtime, mut stderr) = started_site(&listen, &d);
    let status = stop_with_sigterm(running.child());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert_eq!(status.code(), Some(128 + 15), "{rest}");
    assert!(!runtime.exists(), "{} left behind", runtime.display());

    // The same when whoever read its log has gone (its handler panicked on writing
    // the last line to the closed pipe, and the site ran on, ignoring SIGTERM).
    let (mut running, runtime, stderr) = started_site(&listen, &d);
    drop(stderr);
    assert_eq!(stop_with_sigterm(running.child()).code(), Some(128 + 15));
    assert!(!runtime.exists(), "{} left behind", runtime.display());
}
