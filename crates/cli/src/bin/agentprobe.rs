//! gepsea-agentprobe: one application process that exercises the agents, for the
//! multi-process and multi-namespace tests and `gepsea-bench agent`. Namespace and
//! node come from GEPSEA_NAMESPACE / GEPSEA_NODE. Results go to stdout, one
//! `key value...` line each, so tests can check exact numbers.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gepsea_client::wire::{Dest, LockMode};
use gepsea_client::{Api, Cas, Client};

fn arg<T: std::str::FromStr>(a: &[String], i: usize, what: &str) -> Result<T> {
    a.get(i).with_context(|| format!("missing {what}"))?.parse().map_err(|_| anyhow::anyhow!("bad {what}: {:?}", a[i]))
}

fn say(line: String) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

const USAGE: &str = "usage: gepsea-agentprobe ROLE ARGS...   (agent from GEPSEA_NAMESPACE / GEPSEA_NODE)
roles: ping, cas-incr KEY N, board-get KEY, lock-loop NAME N FILE, lock-queue NAME TAG LOG,
       hold-lock NAME [SECONDS], hold-all NAME, lock-timeout NAME MS, subscribe TOPIC EXPECT,
       publish TOPIC N, submit N, work LOG IDLE_SECS, cache-get NAME, cache-remove NAME, scheduler, state,
       lat-put N, lat-remote KIND N AGENTS, bench-op KIND N (arguments: see the source's comments)";

/// Errors are one line and exit status 1 (`anyhow` from `main` would add a backtrace
/// when `RUST_BACKTRACE` is set).
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gepsea-agentprobe: error: {}", gepsea_net::error::one_line(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let role = a.first().context(USAGE)?.clone();
    if role == "--help" || role == "-h" {
        say(USAGE.to_string());
        return Ok(());
    }
    let c = Client::connect_env(&format!("probe-{role}"))?;
    match role.as_str() {
        "ping" => {
            c.ping()?;
            say(format!("pong node {}", c.node()));
        }
        // cas-incr KEY N: N read + compare-and-swap increments of KEY.
        "cas-incr" => {
            let key: String = arg(&a, 1, "key")?;
            let n: u64 = arg(&a, 2, "count")?;
            let mut conflicts = 0u64;
            for _ in 0..n {
                loop {
                    let (ver, val) = match c.board_get(&key)? {
                        Some(v) => {
                            (v.version, u64::from_le_bytes(v.value.try_into().map_err(|_| anyhow::anyhow!("{key} is not a counter"))?))
                        }
                        None => (0, 0),
                    };
                    match c.board_cas(&key, ver, &(val + 1).to_le_bytes())? {
                        Cas::Written(_) => break,
                        Cas::Conflict(_) => conflicts += 1,
                    }
                }
            }
            say(format!("done {n} conflicts {conflicts}"));
        }
        "board-get" => {
            let key: String = arg(&a, 1, "key")?;
            match c.board_get(&key)? {
                Some(v) if v.value.len() == 8 => {
                    say(format!("value {} version {}", u64::from_le_bytes(v.value.try_into().unwrap()), v.version))
                }
                Some(v) => say(format!("bytes {} version {}", v.value.len(), v.version)),
                None => say("absent".into()),
            }
        }
        // lock-loop NAME N FILE: N times: lock, read the number in FILE, write it + 1,
        // append "node pid i" to FILE.log, unlock. Without mutual exclusion increments
        // are lost.
        "lock-loop" => {
            let name: String = arg(&a, 1, "lock")?;
            let n: u64 = arg(&a, 2, "count")?;
            let file: String = arg(&a, 3, "file")?;
            for i in 0..n {
                c.lock(&name, LockMode::Exclusive)?;
                let v: u64 = std::fs::read_to_string(&file).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
                std::thread::yield_now();
                std::fs::write(&file, format!("{}\n", v + 1))?;
                let mut log = std::fs::OpenOptions::new().create(true).append(true).open(format!("{file}.log"))?;
                writeln!(log, "{} {} {i}", c.node(), std::process::id())?;
                c.unlock(&name)?;
            }
            say(format!("done {n}"));
        }
        // lock-queue NAME TAG LOG: queue for the lock, log TAG when granted, release.
        "lock-queue" => {
            let name: String = arg(&a, 1, "lock")?;
            let tag: String = arg(&a, 2, "tag")?;
            let log: String = arg(&a, 3, "log")?;
            say("queued".into());
            c.lock(&name, LockMode::Exclusive)?;
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
            f.write_all(format!("{tag}\n").as_bytes())?;
            c.unlock(&name)?;
            say("done".into());
        }
        // hold-lock NAME [SECONDS]: take the lock, say so, hold it (until killed).
        "hold-lock" => {
            let name: String = arg(&a, 1, "lock")?;
            let secs: u64 = a.get(2).map(|s| s.parse()).transpose()?.unwrap_or(3600);
            c.lock(&name, LockMode::Exclusive)?;
            say("locked".into());
            std::thread::sleep(Duration::from_secs(secs));
            c.unlock(&name)?;
            say("released".into());
        }
        // hold-all NAME: take lock NAME, 1 MiB of global memory on this node and a
        // subscription, say so, then wait to be killed.
        "hold-all" => {
            let name: String = arg(&a, 1, "lock")?;
            c.lock(&name, LockMode::Exclusive)?;
            let p = c.gma_alloc(c.node(), 1 << 20)?;
            c.gma_put(p, 0, b"mine")?;
            c.subscribe("t")?;
            say("holding".into());
            std::thread::sleep(Duration::from_secs(3600));
        }
        // lock-timeout NAME MS: try the lock for MS milliseconds.
        "lock-timeout" => {
            let name: String = arg(&a, 1, "lock")?;
            let ms: u64 = arg(&a, 2, "ms")?;
            let t = Instant::now();
            match c.call_timeout(gepsea_client::wire::Op::Lock { name: name.clone(), mode: LockMode::Exclusive }, Duration::from_millis(ms))
            {
                Ok(_) => say(format!("locked after {} ms", t.elapsed().as_millis())),
                Err(e) => say(format!("not locked: {e}")),
            }
        }
        // subscribe TOPIC EXPECT: read adverts until EXPECT arrived; check order.
        "subscribe" => {
            let topic: String = arg(&a, 1, "topic")?;
            let expect: usize = arg(&a, 2, "expected count")?;
            c.subscribe(&topic)?;
            say("subscribed".into());
            let mut last: BTreeMap<u32, u64> = BTreeMap::new();
            let mut per: BTreeMap<u32, usize> = BTreeMap::new();
            let mut got = 0;
            let deadline = Instant::now() + Duration::from_secs(120);
            while got < expect {
                if Instant::now() > deadline {
                    bail!("only {got} of {expect} adverts arrived");
                }
                for m in c.next_adverts(256, Duration::from_secs(1))? {
                    if m.topic != topic {
                        bail!("advert on topic {:?} delivered to a subscriber of {topic:?}", m.topic);
                    }
                    let prev = last.insert(m.publisher, m.seq);
                    if prev.is_some_and(|p| m.seq <= p) {
                        bail!("publisher {} seq {} after {:?}: duplicate or out of order", m.publisher, m.seq, prev);
                    }
                    *per.entry(m.publisher).or_default() += 1;
                    got += 1;
                }
            }
            // Nothing more may come.
            let extra = c.next_adverts(256, Duration::from_millis(300))?;
            say(format!("received {got} extra {} from {per:?}", extra.len()));
        }
        // publish TOPIC N: N adverts to every agent.
        "publish" => {
            let topic: String = arg(&a, 1, "topic")?;
            let n: u64 = arg(&a, 2, "count")?;
            for i in 0..n {
                c.publish(&topic, format!("{} {i}", c.node()).as_bytes(), Dest::All)?;
            }
            say(format!("published {n}"));
        }
        // submit N: N tasks (payload "task-i").
        "submit" => {
            let n: u64 = arg(&a, 1, "count")?;
            for i in 0..n {
                c.submit(format!("task-{i}").as_bytes())?;
            }
            say(format!("submitted {n}"));
        }
        // work LOG IDLE_SECS: take tasks, log their payloads, mark done; stop after IDLE_SECS without work.
        "work" => {
            let log: String = arg(&a, 1, "log")?;
            let idle: u64 = arg(&a, 2, "idle seconds")?;
            let ms: u64 = a.get(3).map(|s| s.parse()).transpose()?.unwrap_or(0);
            let mut n = 0;
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
            say("working".into());
            while let Some(t) = c.take(Duration::from_secs(idle))? {
                std::thread::sleep(Duration::from_millis(ms));
                // One write per line: several workers append to the same file.
                f.write_all(format!("{}\n", String::from_utf8_lossy(&t.payload)).as_bytes())?;
                c.done(t.id)?;
                n += 1;
            }
            say(format!("worked {n}"));
        }
        "cache-get" => {
            let name: String = arg(&a, 1, "name")?;
            let d = c.cache_get(&name)?;
            say(format!("len {} fnv {:08x}", d.len(), gepsea_net::testkit::fingerprint(&d)));
        }
        "cache-remove" => {
            let name: String = arg(&a, 1, "name")?;
            c.cache_remove(&name)?;
            say("removed".into());
        }
        "scheduler" => say(format!("scheduler {}", c.scheduler()?)),
        "state" => {
            for s in c.global_state()? {
                say(format!("node {} {:?} processes {} holds {:?}", s.node, s.activity, s.processes.len(), s.holds));
            }
        }
        // lat-put N: per-operation latency percentiles of N board puts.
        "lat-put" => {
            let n: u32 = arg(&a, 1, "count")?;
            let mut v = Vec::new();
            for i in 0..n {
                let t = Instant::now();
                c.board_put(&format!("lat/{}", i % 16), b"x")?;
                v.push(t.elapsed().as_secs_f64() * 1e6);
            }
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            say(format!("p10 {:.1} p50 {:.1} p90 {:.1} max {:.1}", v[v.len() / 10], v[v.len() / 2], v[v.len() * 9 / 10], v[v.len() - 1]));
        }
        // lat-remote KIND N AGENTS: per-operation latency percentiles of N board puts
        // (KIND put) or lock acquire + release pairs (KIND lockpair) on keys and locks
        // that another of the AGENTS agents (1..=AGENTS) owns, after N/10 unmeasured.
        "lat-remote" => {
            let kind: String = arg(&a, 1, "kind")?;
            let n: usize = arg(&a, 2, "count")?;
            let agents: u32 = arg(&a, 3, "agents")?;
            let view: Vec<u32> = (1..=agents).collect();
            let me = c.node();
            let owned_elsewhere = |k: &String| gepsea_agent::core::board::ranked(k, &view).first() != Some(&me);
            let keys: Vec<String> = (0..).map(|i| format!("remote/{me}/{i}")).filter(owned_elsewhere).take(16).collect();
            let locks: Vec<String> = (0..)
                .map(|i| format!("remote-lock/{me}/{i}"))
                .filter(|l| owned_elsewhere(&gepsea_agent::core::lock_key(l)))
                .take(4)
                .collect();
            let mut v = Vec::with_capacity(n);
            for i in 0..n + n / 10 {
                let t = Instant::now();
                match kind.as_str() {
                    "put" => {
                        c.board_put(&keys[i % keys.len()], &(i as u64).to_le_bytes())?;
                    }
                    "lockpair" => {
                        let l = &locks[i % locks.len()];
                        c.lock(l, LockMode::Exclusive)?;
                        c.unlock(l)?;
                    }
                    k => bail!("unknown kind {k}"),
                }
                if i >= n / 10 {
                    v.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            say(format!("{kind} p10 {:.2} p50 {:.2} p90 {:.2}", v[v.len() / 10], v[v.len() / 2], v[v.len() * 9 / 10]));
        }
        // bench-op KIND N: N operations of one kind (after N/10 unmeasured); prints µs per op.
        "bench-op" => {
            let kind: String = arg(&a, 1, "kind")?;
            let n: u32 = arg(&a, 2, "count")?;
            let me = c.node();
            let one = |i: u32| -> Result<()> {
                match kind.as_str() {
                    "ping" => c.ping()?,
                    "put" => {
                        c.board_put(&format!("bench/{me}/{}", i % 64), &i.to_le_bytes())?;
                    }
                    "lockpair" => {
                        c.lock("bench-lock", LockMode::Exclusive)?;
                        c.unlock("bench-lock")?;
                    }
                    "publish" => c.publish("bench", &i.to_le_bytes(), Dest::All)?,
                    k => bail!("unknown kind {k}"),
                }
                Ok(())
            };
            for i in 0..n / 10 {
                one(i)?;
            }
            let t = Instant::now();
            for i in 0..n {
                one(i)?;
            }
            say(format!("us {kind} {:.3}", t.elapsed().as_secs_f64() * 1e6 / n as f64));
        }
        other => bail!("unknown role {other:?}"),
    }
    Ok(())
}
