//! The agents as real processes on four network namespaces joined by a bridge (root;
//! `GEPSEA_SKIP_NETNS=1` skips): advertising exactly once everywhere, 4 × 10,000
//! concurrent compare-and-swap increments, lock mutual exclusion and FIFO order, and
//! the death, silence, stop and restart of a node's agent.

use std::time::{Duration, Instant};

use gepsea_client::wire::Record;
use gepsea_client::Api;

mod agent_harness;

use agent_harness::*;

#[test]
fn four_nodes_advertising_board_and_locks() {
    if skip_netns() {
        return;
    }
    let mut a = Agents::new(4, true);
    // Advertising: a subscriber on every node, then 4 publishers × 500 adverts.
    let subs: Vec<Lines> = (0..4).map(|i| a.spawn(i, &["subscribe", "t", "2000"])).collect();
    for s in &subs {
        assert_eq!(s.next(Duration::from_secs(20)), "subscribed");
    }
    let pubs: Vec<Lines> = (0..4).map(|i| a.spawn(i, &["publish", "t", "500"])).collect();
    for p in &pubs {
        assert_eq!(p.next(Duration::from_secs(60)), "published 500");
    }
    for s in &subs {
        assert_eq!(s.next(Duration::from_secs(60)), "received 2000 extra 0 from {1: 500, 2: 500, 3: 500, 4: 500}");
    }
    // Bulletin board: 4 × 10,000 concurrent CAS increments of one key.
    let incs: Vec<Lines> = (0..4).map(|i| a.spawn(i, &["cas-incr", "counter", "10000"])).collect();
    let mut conflicts = 0;
    for l in &incs {
        let line = l.next(Duration::from_secs(300));
        assert!(line.starts_with("done 10000 conflicts "), "{line}");
        conflicts += line.rsplit(' ').next().unwrap().parse::<u64>().unwrap();
    }
    eprintln!("CAS conflicts (retries): {conflicts}");
    assert_eq!(a.run(2, &["board-get", "counter"]).trim(), "value 40000 version 40000");
    // Locks: mutual exclusion over a file counter no process could keep consistent alone.
    let file = a.dir.join("shared-counter");
    let loops: Vec<Lines> = (0..4).map(|i| a.spawn(i, &["lock-loop", "L", "250", file.to_str().unwrap()])).collect();
    for l in &loops {
        assert_eq!(l.next(Duration::from_secs(120)), "done 250");
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "1000\n");
    assert_eq!(std::fs::read_to_string(format!("{}.log", file.display())).unwrap().lines().count(), 1000);
    // FIFO: while node 1 holds F, nodes 2, 3, 4 queue in that order; killing the
    // holder's process hands the lock on in queue order.
    let holder = a.spawn(0, &["hold-lock", "F"]);
    assert_eq!(holder.next(Duration::from_secs(20)), "locked");
    let log = a.dir.join("fifo.log");
    let mut waiters = Vec::new();
    for (i, tag) in [(1, "B"), (2, "C"), (3, "D")] {
        let w = a.spawn(i, &["lock-queue", "F", tag, log.to_str().unwrap()]);
        assert_eq!(w.next(Duration::from_secs(20)), "queued");
        wait_until(Duration::from_secs(20), || waiting_on(&a, "F") == i, "the lock queue to grow");
        waiters.push(w);
    }
    let holder_pid = a.others[a.others.len() - 4].id();
    kill_tree(holder_pid);
    for w in &waiters {
        assert_eq!(w.next(Duration::from_secs(30)), "done");
    }
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "B\nC\nD\n");
}

#[test]
fn killing_a_nodes_agent_releases_its_locks_and_reelects_the_scheduler() {
    if skip_netns() {
        return;
    }
    let mut a = Agents::new(4, true);
    assert_eq!(a.run(3, &["scheduler"]).trim(), "scheduler 1");
    // Board values survive their owner: 4 × 500 increments before, 3 × 500 after.
    for i in 0..4 {
        a.run(i, &["cas-incr", "survivor", "500"]);
    }
    // Node 1's process holds X; node 3 waits for it.
    let holder = a.spawn(0, &["hold-lock", "X"]);
    assert_eq!(holder.next(Duration::from_secs(20)), "locked");
    let waiter = a.spawn(2, &["lock-timeout", "X", "60000"]);
    // 300 tasks submitted from node 2; workers on nodes 2, 3, 4 (5 ms each).
    a.run(1, &["submit", "300"]);
    let log = a.dir.join("tasks.log");
    let workers: Vec<Lines> = (1..4).map(|i| a.spawn(i, &["work", log.to_str().unwrap(), "4", "5"])).collect();
    for w in &workers {
        assert_eq!(w.next(Duration::from_secs(20)), "working");
    }
    wait_until(Duration::from_secs(30), || std::fs::read_to_string(&log).map_or(0, |s| s.lines().count()) >= 60, "work to start");
    a.kill_node(0);
    let line = waiter.next(Duration::from_secs(60));
    assert!(line.starts_with("locked after"), "{line}");
    let mut worked = 0;
    for w in &workers {
        let l = w.next(Duration::from_secs(120));
        worked += l.strip_prefix("worked ").expect(&l).parse::<usize>().unwrap();
    }
    let done = std::fs::read_to_string(&log).unwrap();
    let mut names: Vec<&str> = done.lines().collect();
    assert_eq!(names.len(), worked);
    names.sort_unstable();
    names.dedup();
    let mut want: Vec<String> = (0..300).map(|i| format!("task-{i}")).collect();
    want.sort_unstable();
    assert_eq!(names, want.iter().map(String::as_str).collect::<Vec<_>>(), "every task ran");
    eprintln!("tasks run: {worked} for 300 submitted (re-runs after the failover: {})", worked - 300);
    for i in 1..4 {
        assert_eq!(a.run(i, &["scheduler"]).trim(), "scheduler 2");
        let st = a.status(i);
        assert_eq!(st["view"], serde_json::json!([2, 3, 4]), "{st}");
    }
    for i in 1..4 {
        a.run(i, &["cas-incr", "survivor", "500"]);
    }
    assert_eq!(a.run(3, &["board-get", "survivor"]).trim().split(' ').nth(1), Some("3500"));
}

/// An agent that is stopped (SIGTERM, as a job's leader stops its node's agent at the
/// end) says so before it goes: the others drop it from their views at once, as having
/// left rather than failed (no reconnect timeout to wait out: a job's master waited 3 s
/// for it), and serve on without it.
#[test]
fn a_stopped_agent_leaves_and_the_others_drop_it_at_once() {
    let mut a = Agents::new(3, false);
    a.run(0, &["cas-incr", "shared", "5"]);
    let mut third = a.agents[2].take().unwrap();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(third.id() as i32, libc::SIGTERM) };
    assert!(third.wait().unwrap().success(), "agent 3 did not stop cleanly: {}", a.log(2));
    wait_until(
        Duration::from_secs(20),
        || (0..2).all(|i| a.status(i)["view"] == serde_json::json!([1, 2])),
        "nodes 1 and 2 to drop node 3",
    );
    for i in 0..2 {
        let log = a.log(i);
        assert!(log.contains("agent 3 left"), "node {}: {log}", i + 1);
        assert!(!log.contains("agent 3 failed"), "node {} took the leave for a failure: {log}", i + 1);
    }
    a.run(1, &["cas-incr", "shared", "5"]);
    assert_eq!(a.run(0, &["board-get", "shared"]).trim().split(' ').nth(1), Some("10"));
}

/// A node that goes silent without closing its connections (a host powered off, a
/// cable pulled: no FIN, no RST, nothing answers) is declared dead by the others while
/// nothing is being said to it (the kernel's keepalive probes go unanswered; without
/// them a silent peer would be found only by data left unacknowledged, after the
/// kernel's retransmissions, about 15 minutes), and the silent node declares them dead
/// too. The survivors go on serving.
#[test]
fn a_node_that_goes_silent_is_declared_dead_while_idle() {
    if skip_netns() {
        return;
    }
    let a = Agents::new(3, true);
    for i in 0..3 {
        assert_eq!(a.status(i)["view"], serde_json::json!([1, 2, 3]));
    }
    a.run(0, &["cas-incr", "before", "5"]);
    a.bed.as_ref().unwrap().cut(2).expect("taking node 3 off the bridge");
    let cut = Instant::now();
    wait_until(
        Duration::from_secs(60),
        || (0..2).all(|i| a.status(i)["view"] == serde_json::json!([1, 2])) && a.status(2)["view"] == serde_json::json!([3]),
        "nodes 1 and 2 to declare node 3 dead, and node 3 them",
    );
    eprintln!("silent node declared dead {:.1} s after the cut (peer timeout 1.5 s)", cut.elapsed().as_secs_f64());
    for i in 0..2 {
        a.run(i, &["cas-incr", "after", "5"]);
    }
    assert_eq!(a.run(1, &["board-get", "after"]).trim().split(' ').nth(1), Some("10"));
}

/// A node whose agent died and was started again (same node id, new incarnation) is
/// let back in: every agent's view holds it again with its new pid, the keys, locks
/// and merge streams it now owns are handed to it (a lock held and waited on across
/// the move stays exclusive and its queue is served), and it takes tasks again.
#[test]
fn a_restarted_agent_rejoins_and_gets_its_keys_locks_and_tasks_back() {
    if skip_netns() {
        return;
    }
    use gepsea_agent::core::board::ranked;
    use gepsea_agent::core::{lock_key, merge_key};
    let mut a = Agents::new(3, true);
    // Names whose owner is node 3 with it and node 1 or 2 without it.
    let back_to_3 = |key: &dyn Fn(&str) -> String, stem: &str| {
        (0..1000).map(|i| format!("{stem}{i}")).find(|n| ranked(&key(n), &[1, 2, 3])[0] == 3).unwrap()
    };
    let lock = back_to_3(&|n| lock_key(n), "L");
    let key = back_to_3(&|n| n.to_string(), "K");
    let stream = back_to_3(&|n| merge_key(n), "M");
    for i in 0..3 {
        a.run(i, &["cas-incr", "counter", "100"]);
    }
    a.kill_node(2);
    wait_until(
        Duration::from_secs(30),
        || (0..2).all(|i| a.status(i)["view"] == serde_json::json!([1, 2])),
        "nodes 1 and 2 to drop node 3",
    );

    // While node 3 is away: a key written, a lock held by node 1 and waited for by
    // node 2, a merge stream half pushed, all owned by node 1 or 2.
    a.run(0, &["cas-incr", &key, "50"]);
    let holder = a.spawn(0, &["hold-lock", &lock]);
    let holder_pid = a.others.last().unwrap().id();
    assert_eq!(holder.next(Duration::from_secs(20)), "locked");
    let waiter = a.spawn(1, &["lock-timeout", &lock, "60000"]);
    wait_until(Duration::from_secs(20), || waiting_on(&a, &lock) == 1, "node 2 to queue for the lock");
    let c = connect(&a, 1).unwrap();
    let rec = |k: u32| Record { key: k.to_be_bytes().to_vec(), value: vec![] };
    c.merge_open(&stream, 2).unwrap();
    c.merge_push(&stream, 0, vec![rec(1), rec(4)], true).unwrap();

    // Node 3's agent again, same node id.
    a.agents[2] = Some(a.start_agent(2, 3));
    a.wait_ready(2);
    let me3 = a.status(2);
    assert_eq!(me3["restarted"], true, "{me3}");
    wait_until(
        Duration::from_secs(30),
        || (0..3).all(|i| a.status(i)["view"] == serde_json::json!([1, 2, 3]) && a.status(i)["deferred_ops"] == 0),
        "every agent to see node 3 back",
    );
    for i in 0..2 {
        let st = a.status(i);
        assert_eq!(st["dead"], serde_json::json!([]), "{st}");
        assert_eq!(st["rejoins"], 1, "{st}");
        let peer3 = st["peers"].as_array().unwrap().iter().find(|p| p[0] == 3).cloned();
        assert_eq!(peer3, Some(serde_json::json!([3, me3["pid"], me3["incarnation"]])), "node {} knows the new agent: {st}", i + 1);
    }
    // The lock moved to node 3 with its holder and its queue.
    let on = |i: usize| a.status(i)["locks"].as_array().unwrap().iter().any(|l| l["name"] == lock.as_str());
    wait_until(Duration::from_secs(10), || on(2), "the lock to move to node 3");
    assert!(!on(0) && !on(1), "the old owner dropped it");
    let l = a.status(2)["locks"].as_array().unwrap().iter().find(|l| l["name"] == lock.as_str()).cloned().unwrap();
    assert_eq!((l["holders"].as_array().unwrap().len(), l["waiting"].as_array().unwrap().len()), (1, 1), "{l}");
    let line = a.run(2, &["lock-timeout", &lock, "1500"]);
    assert!(line.starts_with("not locked"), "node 1 still holds it across the move: {line}");
    kill_tree(holder_pid);
    let line = waiter.next(Duration::from_secs(30));
    assert!(line.starts_with("locked after"), "the waiter handed over is served by the new owner: {line}");

    // The board entry and the merge stream followed their key.
    assert_eq!(a.run(2, &["board-get", &key]).trim().split(' ').nth(1), Some("50"));
    assert_eq!(a.run(1, &["board-get", &key]).trim().split(' ').nth(1), Some("50"));
    c.merge_push(&stream, 1, vec![rec(2), rec(3)], true).unwrap();
    assert_eq!(c.merge_pull(&stream).unwrap(), (vec![rec(1), rec(2), rec(3), rec(4)], true));
    assert_eq!(a.status(2)["merge_streams"], 0, "pulled to the end on its new owner");
    for i in 0..3 {
        a.run(i, &["cas-incr", "counter", "100"]);
    }
    assert_eq!(a.run(2, &["board-get", "counter"]).trim().split(' ').nth(1), Some("600"));

    // It takes tasks again: 40 tasks, only node 3 works.
    assert_eq!(a.run(2, &["scheduler"]).trim(), "scheduler 1");
    a.run(0, &["submit", "40"]);
    let log = a.dir.join("rejoin-tasks.log");
    let w = a.spawn(2, &["work", log.to_str().unwrap(), "2"]);
    assert_eq!(w.next(Duration::from_secs(20)), "working");
    assert_eq!(w.next(Duration::from_secs(60)), "worked 40");
}
