//! Two nodes as two network namespaces joined by a veth pair: the same suite over TCP,
//! then the connection is destroyed (`ss -K`, as a failing network would) in the middle
//! of a stream, several times, and every message still arrives exactly once, in order.

mod common;

use std::time::Duration;

use common::*;

fn peer_args<'a>(ns: &'a str, node: &'a str, listen: &'a str, dir: &'a str) -> Vec<&'a str> {
    vec!["--ns", ns, "--node", node, "--port", "1", "--listen", listen, "--directory", dir]
}

fn pair(role_a: &[&str], role_b: &[&str]) -> (String, String) {
    if !require_root() {
        return (String::new(), String::new());
    }
    let nodes = two_nodes();
    let dir = TempDir::new();
    let ns = unique("tcp");
    let la = format!("{}:0", nodes.ip[0]);
    let lb = format!("{}:0", nodes.ip[1]);
    let mut a_cmd = nodes.cmd(0, netpeer());
    a_cmd.args(peer_args(&ns, "1", &la, dir.path())).args(role_a);
    let mut b_cmd = nodes.cmd(1, netpeer());
    b_cmd.args(peer_args(&ns, "2", &lb, dir.path())).args(role_b);
    let mut a = Proc::spawn("node1", a_cmd);
    let mut b = Proc::spawn("node2", b_cmd);
    let ra = a.finish_ok(Duration::from_secs(180));
    let rb = b.finish_ok(Duration::from_secs(180));
    (ra, rb)
}

#[test]
fn tcp_normal_channel_1b_to_64mib_both_directions() {
    let (a, b) = pair(&["exchange", "--peer", "2:1", "--sizes", SIZES], &["exchange", "--peer", "1:1", "--sizes", SIZES]);
    if a.is_empty() {
        return;
    }
    let total: usize = SIZES.split(',').map(|s| s.parse::<usize>().unwrap()).sum();
    assert_eq!(a, format!("OK exchanged 13 messages, {total} bytes verified"));
    assert_eq!(b, a);
}

#[test]
fn tcp_system_channel_beyond_the_credit_window() {
    let sizes = system_sizes();
    let (a, b) =
        pair(&["exchange", "--system", "--peer", "2:1", "--sizes", &sizes], &["exchange", "--system", "--peer", "1:1", "--sizes", &sizes]);
    if a.is_empty() {
        return;
    }
    assert!(a.starts_with("OK exchanged 300 messages"), "{a}");
    assert_eq!(b, a);
}

#[test]
fn tcp_rma_put_get_and_bounds() {
    let (a, b) = pair(&["rma-origin", "--peer", "2:1", "--len", "3000000"], &["rma-target", "--peer", "1:1", "--len", "3000000"]);
    if a.is_empty() {
        return;
    }
    assert_eq!(a, "OK rma 3000000 bytes; owner saw 2 puts, 2 gets, identical contents");
    assert_eq!(b, "OK puts 2 gets 2");
}

#[test]
fn stream_survives_connections_destroyed_midway() {
    if !require_root() {
        return;
    }
    let nodes = two_nodes();
    let dir = TempDir::new();
    let ns = unique("cut");
    let count = "6000";
    let la = format!("{}:0", nodes.ip[0]);
    let lb = format!("{}:0", nodes.ip[1]);
    let mut rx_cmd = nodes.cmd(1, netpeer());
    rx_cmd.args(peer_args(&ns, "2", &lb, dir.path())).args(["stream-recv", "--peer", "1:1", "--count", count]);
    let mut rx = Proc::spawn("receiver", rx_cmd);
    let mut tx_cmd = nodes.cmd(0, netpeer());
    tx_cmd.args(peer_args(&ns, "1", &la, dir.path())).args(["stream-send", "--peer", "2:1", "--count", count]);
    let mut tx = Proc::spawn("sender", tx_cmd);
    // Destroy every TCP socket between the nodes, from both sides, three times while the
    // stream runs.
    for at in ["SENT 1000", "SENT 2500", "SENT 4000"] {
        tx.expect_line(at, Duration::from_secs(60));
        let side = if at == "SENT 2500" { 1 } else { 0 };
        let peer_ip = &nodes.ip[1 - side];
        let out = sh(&["ip", "netns", "exec", &nodes.ns[side], "ss", "-K", "-t", "dst", peer_ip]);
        assert!(out.contains("ESTAB"), "ss -K found no connection to destroy at {at}: {out}");
    }
    let r = rx.finish_ok(Duration::from_secs(120));
    let s = tx.finish_ok(Duration::from_secs(120));
    assert!(r.starts_with(&format!("OK received {count} in order")), "{r}");
    // The cuts really happened and were repaired: at least one connection per cut.
    let field = |name: &str| -> u64 {
        let i = s.find(name).unwrap_or_else(|| panic!("{name} missing in {s}")) + name.len() + 1;
        s[i..].split_whitespace().next().unwrap().parse().unwrap()
    };
    assert!(field("lost") >= 3, "{s}");
    assert!(field("established") >= 4, "{s}");
}

#[test]
fn a_namespace_pair_takes_its_own_congestion_control_and_leaves_the_hosts() {
    if !require_root() {
        return;
    }
    const KEY: &str = "net.ipv4.tcp_congestion_control";
    let host = || std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap().trim().to_string();
    let before = host();
    // Reno is built into every kernel; pick the other one when the host already runs it.
    let wanted = if before == "reno" { "cubic" } else { "reno" };
    let nodes = two_nodes();
    nodes.set_sysctl(KEY, wanted).unwrap();
    assert_eq!(nodes.sysctl(0, KEY).unwrap(), wanted);
    assert_eq!(nodes.sysctl(1, KEY).unwrap(), wanted);
    assert_eq!(host(), before);
    let refused = nodes.set_sysctl(KEY, "no-such-algorithm").unwrap_err().to_string();
    assert!(refused.contains("no-such-algorithm"), "{refused}");
    assert_eq!(nodes.sysctl(0, KEY).unwrap(), wanted);
    assert_eq!(host(), before);
}
