//! One logging switch for every command: `-v`/`-q` move the level, `RUST_LOG` decides
//! when set, and the agents and workers a search starts log at the search's level
//! (their lines reach the search's stderr).

mod common;

use std::path::Path;
use std::process::Output;

use common::*;

fn setup(d: &Path) {
    std::fs::write(d.join("db.fasta"), head(&zcat(DB_GZ), 300)).unwrap();
    std::fs::write(d.join("q.fasta"), head(&zcat(QUERY_GZ), 8)).unwrap();
    let mut c = gepsea();
    c.args(["db", "format", "--fragments", "2", "--input"]).arg(d.join("db.fasta")).arg("--out").arg(d.join("g"));
    run_ok(c);
}

/// A local search with agents (2 workers) and the given flags and environment.
fn search(d: &Path, flags: &[&str], rust_log: Option<&str>) -> Output {
    let mut c = gepsea();
    c.env_remove("RUST_LOG").env_remove("GEPSEA_LOG");
    if let Some(l) = rust_log {
        c.env("RUST_LOG", l);
    }
    c.args(flags)
        .args(["search", "--workers", "2", "--db"])
        .arg(d.join("g"))
        .arg("--query")
        .arg(d.join("q.fasta"))
        .arg("--out")
        .arg(d.join("hits.6"));
    run_ok(c)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn verbosity_flags_and_rust_log_reach_the_agents() {
    let d = tempdir("log");
    setup(&d.0);
    // Default: warnings only; the one summary line of the search.
    let quiet_agents = stderr(&search(&d.0, &[], None));
    assert!(!quiet_agents.contains("INFO") && !quiet_agents.contains("DEBUG"), "{quiet_agents}");
    assert!(quiet_agents.contains("gepsea search:"), "the summary line: {quiet_agents}");
    // -v: the agent (a child process) logs at info.
    let v = stderr(&search(&d.0, &["-v"], None));
    assert!(v.contains("INFO") && v.contains("listening on"), "-v shows the agent's start: {v}");
    assert!(!v.contains("DEBUG"), "{v}");
    // -vv: debug, also after the subcommand (a global flag).
    let mut c = gepsea();
    c.env_remove("RUST_LOG").env_remove("GEPSEA_LOG");
    c.args(["search", "-vv", "--workers", "2", "--db"])
        .arg(d.0.join("g"))
        .arg("--query")
        .arg(d.0.join("q.fasta"))
        .arg("--out")
        .arg(d.0.join("hits.6"));
    let vv = stderr(&run_ok(c));
    assert!(vv.contains("DEBUG"), "-vv: {vv}");
    // -q: nothing at all on success.
    let q = stderr(&search(&d.0, &["-q"], None));
    assert_eq!(q, "", "-q prints nothing when all goes well");
    // RUST_LOG decides over the flags.
    let env = stderr(&search(&d.0, &["-q"], Some("debug")));
    assert!(env.contains("DEBUG"), "RUST_LOG=debug: {env}");
    // A filter that does not parse is reported, not ignored.
    let bad = stderr(&search(&d.0, &[], Some("gepsea=loud")));
    assert!(bad.contains("RUST_LOG=\"gepsea=loud\" is not a log filter"), "{bad}");
    // Every run wrote the same output.
    assert!(std::fs::metadata(d.0.join("hits.6")).unwrap().len() > 100);
}

#[test]
fn quiet_and_verbose_together_are_refused() {
    let o = gepsea().args(["-q", "-v", "db", "verify", "/nonexistent"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
}

#[test]
fn quiet_silences_every_command_and_changes_nothing_it_writes() {
    let d = tempdir("logq");
    std::fs::write(d.0.join("db.fasta"), head(&zcat(DB_GZ), 300)).unwrap();
    std::fs::write(d.0.join("q.fasta"), head(&zcat(QUERY_GZ), 8)).unwrap();
    let p = |n: &str| d.0.join(n).to_string_lossy().into_owned();
    let silent = |args: &[&str]| {
        let mut c = gepsea();
        c.env_remove("RUST_LOG").env_remove("GEPSEA_LOG").arg("-q").args(args);
        let o = run_ok(c);
        assert_eq!((stderr(&o).as_str(), String::from_utf8_lossy(&o.stdout).as_ref()), ("", ""), "-q {args:?}");
    };
    let noisy = |args: &[&str]| {
        let mut c = gepsea();
        c.env_remove("RUST_LOG").env_remove("GEPSEA_LOG").args(args);
        let o = run_ok(c);
        format!("{}{}", stderr(&o), String::from_utf8_lossy(&o.stdout))
    };
    // Each command's progress and summary lines without -q, none with it.
    let format = |out: &str| ["db", "format", "--fragments", "2", "--input", &p("db.fasta"), "--out", out].map(str::to_string);
    let (g, g2) = (p("g"), p("g2"));
    let said = noisy(&format(&g).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(said.contains("gepsea db format: fragment 2/2 built") && said.contains("into 2 fragments"), "{said}");
    silent(&format(&g2).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(noisy(&["db", "verify", &g]).contains("every checksum matches"));
    silent(&["db", "verify", &g2]);
    silent(&["search", "--workers", "2", "--db", &g, "--query", &p("q.fasta"), "--out", &p("hits.6"), "--outfmt", "6"]);
    let encode = |out: &str| {
        ["paramedic", "encode", "--output", &p("hits.6"), "--out", out, "--db", &g, "--query", &p("q.fasta"), "--outfmt", "6"]
            .map(str::to_string)
    };
    let said = noisy(&encode(&p("m1")).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(said.contains("bytes of blast metadata"), "{said}");
    silent(&encode(&p("m2")).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(noisy(&["paramedic", "decode", "--metadata", &p("m1"), "--out", &p("back1"), "--db", &g]).contains("regenerated"));
    silent(&["paramedic", "decode", "--metadata", &p("m2"), "--out", &p("back2"), "--db", &g]);
    silent(&["paramedic", "keygen", "--out", &p("key")]);
    // What the quiet commands wrote is what the others did.
    let read = |n: &str| std::fs::read(d.0.join(n)).unwrap();
    assert_eq!(read("m1"), read("m2"));
    assert_eq!(read("back1"), read("hits.6"));
    assert_eq!(read("back2"), read("hits.6"));
    assert_eq!(read("g/manifest.json"), read("g2/manifest.json"));
    assert_eq!(read("key").len(), 65);
}
