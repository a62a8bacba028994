//! Authenticated links: ports that share the job's key talk over TCP; a port with
//! another key, or none, is refused at the handshake and nothing it sends is
//! delivered (its sends fail once the link is given up).

mod common;

use std::time::Duration;

use common::{unique, Ns};
use gepsea_net::auth::Key;
use gepsea_net::{Addr, Completion, NetError, Port, PortConfig};

fn port(ns: &str, node: u32, key: Option<&Key>) -> Port {
    let mut c = PortConfig::new(ns, Addr::new(node, 1));
    c.listen = Some("127.0.0.1:0".parse().unwrap());
    c.key = key.cloned();
    c.reconnect_timeout = Duration::from_millis(800);
    c.linger = Duration::from_millis(100);
    Port::open(c).unwrap()
}

fn pair(a_key: Option<&Key>, b_key: Option<&Key>) -> (Ns, Port, Port) {
    let ns = Ns(unique("auth"));
    let (a, b) = (port(&ns.0, 1, a_key), port(&ns.0, 2, b_key));
    a.add_route(b.addr(), b.listen_addr().unwrap());
    b.add_route(a.addr(), a.listen_addr().unwrap());
    (ns, a, b)
}

#[test]
fn ports_with_the_same_key_talk_both_ways() {
    let k = Key::from_secret(b"the job's secret");
    let (_ns, a, b) = pair(Some(&k), Some(&k));
    for (from, to) in [(&a, &b), (&b, &a)] {
        let s = from.isend(to.addr(), 3, vec![7u8; 100_000]);
        let r = to.irecv(Some(from.addr()), Some(3), 100_000);
        let got = to.wait_timeout(r, Duration::from_secs(20));
        assert!(
            matches!(&got, Ok(Completion::Received(m)) if m.data == vec![7u8; 100_000]),
            "{got:?}\n{:?}\n{:?}",
            from.stats(),
            to.stats()
        );
        from.wait_timeout(s, Duration::from_secs(20)).unwrap();
    }
    assert_eq!(a.stats().auth_failures + b.stats().auth_failures, 0);
}

/// `a` sends to `b`; `b` must receive nothing, `a`'s send must fail, and someone must
/// have counted an authentication failure.
fn refused(a_key: Option<&Key>, b_key: Option<&Key>, what: &str) {
    let (_ns, a, b) = pair(a_key, b_key);
    let r = b.irecv(None, None, 1 << 16);
    let s = a.isend(b.addr(), 5, b"let me in".to_vec());
    match a.wait_timeout(s, Duration::from_secs(30)) {
        Err(NetError::PeerFailed { .. }) => {}
        other => panic!("{what}: the send ended with {other:?}"),
    }
    assert!(matches!(b.wait_timeout(r, Duration::from_millis(300)), Err(NetError::Timeout(_))), "{what}: something was delivered");
    assert!(a.stats().auth_failures + b.stats().auth_failures > 0, "{what}: no authentication failure counted");
    let errors = [a.stats().recent_errors, b.stats().recent_errors].concat().join("\n");
    assert!(errors.contains("refused"), "{what}: {errors}");
}

#[test]
fn another_key_is_refused_and_nothing_is_delivered() {
    refused(Some(&Key::from_secret(b"mine")), Some(&Key::from_secret(b"theirs")), "wrong key");
}

#[test]
fn a_port_without_the_key_is_refused_either_way() {
    let k = Key::from_secret(b"job");
    refused(None, Some(&k), "unkeyed initiator");
    refused(Some(&k), None, "unkeyed acceptor");
}

#[test]
fn completions_after_authentication_are_the_usual_ones() {
    let k = Key::generate().unwrap();
    let (_ns, a, b) = pair(Some(&k), Some(&k));
    b.expose(9, 4096).unwrap();
    assert_eq!(a.wait(a.put(b.addr(), 9, 0, vec![1u8; 4096])).unwrap(), Completion::Put);
}

/// A keyed port that restarts (same address, new incarnation) is accepted on its first
/// connection: the acceptor answers its hello as a new conversation, not with what the
/// old incarnation had been acknowledged (which the newcomer would reject as frames
/// it never sent), and the first message after the restart is delivered.
#[test]
fn a_restarted_keyed_peer_is_accepted_at_once() {
    let k = Key::from_secret(b"the job's secret");
    let (ns, a, b) = pair(Some(&k), Some(&k));
    for i in 0..5u8 {
        let s = b.isend(a.addr(), 4, vec![i; 1000]);
        let r = a.irecv(Some(b.addr()), Some(4), 1000);
        assert!(matches!(a.wait_timeout(r, Duration::from_secs(20)), Ok(Completion::Received(_))));
        b.wait_timeout(s, Duration::from_secs(20)).unwrap();
    }
    drop(b);
    let b = port(&ns.0, 2, Some(&k));
    b.add_route(a.addr(), a.listen_addr().unwrap());
    let s = b.isend(a.addr(), 4, b"again".to_vec());
    let r = a.irecv(None, Some(4), 1000);
    let got = a.wait_timeout(r, Duration::from_secs(20));
    assert!(matches!(&got, Ok(Completion::Received(m)) if m.data == b"again"), "{got:?}");
    b.wait_timeout(s, Duration::from_secs(20)).unwrap();
    let errors = b.stats().recent_errors.join("\n");
    assert!(!errors.contains("acknowledged"), "{errors}");
    assert_eq!(b.stats().connections_established, 1, "{errors}");
}
