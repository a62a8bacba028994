//! The kernel options a port gives its TCP connections, at the end that connects and at
//! the end that accepts: the congestion control it is given (`PortConfig::tcp_congestion`;
//! a name the kernel cannot give is refused when the port opens, through the
//! configuration or the environment, `GEPSEA_TCP_CONGESTION`), and the socket buffers
//! (`PortConfig::tcp_buffer`; without one, the kernel's own sizing).

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use gepsea_net::{namespace_dir, Addr, NetError, Port, PortConfig};

fn system_default() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap().trim().to_string()
}

/// An algorithm other than the system's default: Reno is built into every kernel, and
/// when the default is Reno, CUBIC (Linux's own default) is the other.
fn not_the_default() -> &'static str {
    if system_default() == "reno" {
        "cubic"
    } else {
        "reno"
    }
}

/// The congestion control of every established TCP socket with `port` at one end, as
/// `ss` reports them: an address line, then a line that starts with the algorithm.
fn algorithms_on(port: u16) -> Vec<(String, String)> {
    let filter = format!("( sport = :{port} or dport = :{port} )");
    let out = Command::new("ss").args(["-tinH", "state", "established", &filter]).output().expect("running ss (iproute2)");
    assert!(out.status.success(), "ss: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .map(|p| (p[0].split_whitespace().skip(2).collect::<Vec<_>>().join(" "), p[1].split_whitespace().next().unwrap_or("").to_string()))
        .collect()
}

#[test]
fn both_ends_of_a_link_run_under_the_congestion_control_given() {
    let ns = Ns(unique("cc"));
    let wanted = not_the_default();
    let open = |node: u32| {
        let mut c = PortConfig::new(&ns.0, Addr::new(node, 1));
        c.listen = Some("127.0.0.1:0".parse().unwrap());
        c.tcp_congestion = Some(wanted.to_string());
        Port::open(c).unwrap()
    };
    let (a, b) = (open(1), open(2));
    a.add_route(b.addr(), b.listen_addr().unwrap());
    let r = b.irecv(Some(a.addr()), Some(7), 1 << 20);
    let s = a.isend(b.addr(), 7, vec![5u8; 1 << 20]);
    b.wait_timeout(r, Duration::from_secs(20)).unwrap();
    a.wait_timeout(s, Duration::from_secs(20)).unwrap();
    let sockets = algorithms_on(b.listen_addr().unwrap().port());
    // The connecting socket (a's) and the accepted one (b's).
    assert_eq!(sockets.len(), 2, "{sockets:?}");
    for (addresses, algorithm) in &sockets {
        assert_eq!(algorithm, wanted, "socket {addresses} (system default {})", system_default());
    }
}

#[test]
fn a_port_leaves_the_system_default_alone_when_given_none() {
    let ns = Ns(unique("ccd"));
    let open = |node: u32| {
        let mut c = PortConfig::new(&ns.0, Addr::new(node, 1));
        c.listen = Some("127.0.0.1:0".parse().unwrap());
        c.tcp_congestion = None;
        Port::open(c).unwrap()
    };
    let (a, b) = (open(1), open(2));
    a.add_route(b.addr(), b.listen_addr().unwrap());
    let r = b.irecv(Some(a.addr()), Some(7), 64);
    let s = a.isend(b.addr(), 7, b"hello".to_vec());
    b.wait_timeout(r, Duration::from_secs(20)).unwrap();
    a.wait_timeout(s, Duration::from_secs(20)).unwrap();
    let sockets = algorithms_on(b.listen_addr().unwrap().port());
    assert_eq!(sockets.len(), 2, "{sockets:?}");
    for (addresses, algorithm) in &sockets {
        assert_eq!(*algorithm, system_default(), "socket {addresses}");
    }
}

#[test]
fn an_algorithm_the_kernel_cannot_give_is_refused_when_the_port_opens() {
    let ns = Ns(unique("ccx"));
    let mut c = PortConfig::new(&ns.0, Addr::new(1, 1));
    c.listen = Some("127.0.0.1:0".parse().unwrap());
    c.tcp_congestion = Some("no-such-algorithm".to_string());
    let e = Port::open(c).map(|_| ()).unwrap_err();
    assert!(matches!(&e, NetError::Congestion { name, .. } if name == "no-such-algorithm"), "{e}");
    let text = e.to_string();
    assert!(text.contains("\"no-such-algorithm\"") && text.contains("no such algorithm") && text.contains("reno"), "{text}");
    assert!(!namespace_dir(&ns.0).exists(), "a port that did not open left {}", namespace_dir(&ns.0).display());

    // The same through the environment, in a process of its own.
    let stderr = refused_with("GEPSEA_TCP_CONGESTION", "no-such-algorithm");
    assert!(stderr.contains("\"no-such-algorithm\""), "{stderr}");
}

/// The standard error of a peer process given `value` in the environment variable
/// `var`, which must have refused to open its port.
fn refused_with(var: &str, value: &str) -> String {
    let ns = Ns(unique("env"));
    let out = Command::new(netpeer())
        .args(["--ns", &ns.0, "--node", "1", "--port", "1", "--listen", "127.0.0.1:0", "echo", "--peer", "2:1", "--count", "1"])
        .env(var, value)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{var}={value:?} was taken: {stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("READY"));
    stderr
}

/// The kernel buffers of every established TCP socket with `port` at one end, as `ss -m`
/// reports them: its local address, `rb` (receive) and `tb` (send), in bytes.
fn buffers_on(port: u16) -> Vec<(String, usize, usize)> {
    let filter = format!("( sport = :{port} or dport = :{port} )");
    let out = Command::new("ss").args(["-tmnH", "state", "established", &filter]).output().expect("running ss (iproute2)");
    assert!(out.status.success(), "ss: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let field = |mem: &str, name: &str| -> usize {
        let inner = mem.trim().trim_start_matches("skmem:(").trim_end_matches(')');
        let v = inner.split(',').find_map(|f| f.strip_prefix(name).filter(|v| v.bytes().all(|b| b.is_ascii_digit())));
        v.unwrap_or_else(|| panic!("no {name} in {mem:?}")).parse().unwrap()
    };
    lines.chunks(2).map(|p| (p[0].split_whitespace().nth(2).unwrap_or("").to_string(), field(p[1], "rb"), field(p[1], "tb"))).collect()
}

/// Two ports on nodes 1 and 2 of `ns` (TCP on loopback) with socket buffers `buffer`,
/// `a` with a route to `b`.
fn two_ports(ns: &str, buffer: Option<usize>) -> (Port, Port) {
    let open = |node: u32| {
        let mut c = PortConfig::new(ns, Addr::new(node, 1));
        c.listen = Some("127.0.0.1:0".parse().unwrap());
        c.tcp_buffer = buffer;
        Port::open(c).unwrap()
    };
    let (a, b) = (open(1), open(2));
    a.add_route(b.addr(), b.listen_addr().unwrap());
    (a, b)
}

/// Sends `count` messages of `len` bytes from `a` to `b`.
fn stream(a: &Port, b: &Port, count: usize, len: usize) {
    for _ in 0..count {
        let r = b.irecv(Some(a.addr()), Some(7), len);
        let s = a.isend(b.addr(), 7, vec![5u8; len]);
        b.wait_timeout(r, Duration::from_secs(20)).unwrap();
        a.wait_timeout(s, Duration::from_secs(20)).unwrap();
    }
}

#[test]
fn both_ends_of_a_link_get_the_socket_buffers_given() {
    let ns = Ns(unique("buf"));
    // A size the system's limits allow wherever this runs.
    let limit = gepsea_net::tcp::buffer_limit().expect("reading net.core.rmem_max and wmem_max");
    let wanted = (1 << 20).min(limit);
    let (a, b) = two_ports(&ns.0, Some(wanted));
    assert_eq!((a.tcp_buffer(), b.tcp_buffer()), (Some(wanted), Some(wanted)));
    stream(&a, &b, 4, 1 << 20);
    let sockets = buffers_on(b.listen_addr().unwrap().port());
    assert_eq!(sockets.len(), 2, "{sockets:?}");
    for (local, rb, tb) in &sockets {
        // The kernel doubles what it is given, and keeps it: its own sizing is off.
        assert_eq!((*rb, *tb), (2 * wanted, 2 * wanted), "socket {local} asked for {wanted} each way");
    }
}

#[test]
fn without_a_size_the_kernel_sizes_a_links_buffers() {
    let ns = Ns(unique("bufk"));
    let (a, b) = two_ports(&ns.0, None);
    assert_eq!((a.tcp_buffer(), b.tcp_buffer()), (None, None));
    let moderated = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_moderate_rcvbuf").unwrap().trim() == "1";
    let listen = b.listen_addr().unwrap().port();
    // The accepted end (b's) receives.
    let receiving = || {
        let sockets = buffers_on(listen);
        assert_eq!(sockets.len(), 2, "{sockets:?}");
        sockets.into_iter().find(|(local, _, _)| local.ends_with(&format!(":{listen}"))).expect("b's socket").1
    };
    stream(&a, &b, 1, 5);
    let before = receiving();
    stream(&a, &b, 32, 1 << 20);
    let after = receiving();
    if moderated {
        assert!(after > before, "32 MiB in, the kernel grew the receive buffer: {before} then {after}");
    } else {
        assert_eq!(after, before);
    }
}

#[test]
fn a_bad_gepsea_tcp_buffer_is_refused_when_the_port_opens() {
    let stderr = refused_with("GEPSEA_TCP_BUFFER", "lots");
    assert!(stderr.contains("GEPSEA_TCP_BUFFER=\"lots\": neither a size in bytes (4194304, 4MiB, 4MB) nor `auto`"), "{stderr}");
}
