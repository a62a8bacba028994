//! Encrypted links (`PortConfig::encrypt`): ports talk through a relay that records
//! every byte on the wire, can cut the connections and can alter a byte. Encrypted, no
//! message's bytes appear on the wire (plain, they do: the check can fail); messages
//! survive a cut and are replayed over a new session; an altered byte is caught (by the
//! records' tags, which stand for the payload checksums there) and the message arrives
//! intact all the same; an encrypting port and a plain one refuse each other with an
//! error that says why; encryption without a key is refused at open. On a plain link,
//! a byte altered in a piece whose checksum the waiting sender computed ahead (in its
//! header) is caught as well.

mod common;

use std::time::Duration;

use common::relay::Relay;
use common::{unique, Ns};
use gepsea_net::auth::Key;
use gepsea_net::{Addr, Completion, NetError, Port, PortConfig};

fn port(ns: &str, node: u32, key: Option<&Key>, encrypt: bool) -> Port {
    port_spinning(ns, node, key, encrypt, PortConfig::new(ns, Addr::new(node, 1)).spin)
}

/// [`port`], whose waits spin for `spin` before they sleep.
fn port_spinning(ns: &str, node: u32, key: Option<&Key>, encrypt: bool, spin: Duration) -> Port {
    let mut c = PortConfig::new(ns, Addr::new(node, 1));
    c.spin = spin;
    c.listen = Some("127.0.0.1:0".parse().unwrap());
    c.key = key.cloned();
    c.encrypt = encrypt;
    c.reconnect_timeout = Duration::from_secs(3);
    c.linger = Duration::from_millis(100);
    Port::open(c).unwrap()
}

/// `a` reaches `b` through a relay only (`b` answers on the same connection).
fn through_relay(a_enc: bool, b_enc: bool) -> (Ns, Port, Port, Relay) {
    through_altering_relay(a_enc, b_enc, None)
}

fn through_altering_relay(a_enc: bool, b_enc: bool, flip: Option<usize>) -> (Ns, Port, Port, Relay) {
    let k = Key::from_secret(b"the job's secret");
    let ns = Ns(unique("enc"));
    let (a, b) = (port(&ns.0, 1, Some(&k), a_enc), port(&ns.0, 2, Some(&k), b_enc));
    let relay = Relay::altering(b.listen_addr().unwrap(), flip);
    a.add_route(b.addr(), relay.addr);
    (ns, a, b, relay)
}

/// Plain ports, `a` reaching `b` through a relay that alters the byte at `flip` of what
/// `a` sends; `a`'s waits spin for a second before they sleep.
fn plain_spinning_through_altering_relay(flip: usize) -> (Ns, Port, Port, Relay) {
    let ns = Ns(unique("sum"));
    let (a, b) = (port_spinning(&ns.0, 1, None, false, Duration::from_secs(1)), port(&ns.0, 2, None, false));
    let relay = Relay::altering(b.listen_addr().unwrap(), Some(flip));
    a.add_route(b.addr(), relay.addr);
    (ns, a, b, relay)
}

/// A message that cannot appear on the wire by chance.
fn secret(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ 0x5a).collect()
}

fn exchange(a: &Port, b: &Port, tag: u64, data: &[u8]) {
    let s = a.isend(b.addr(), tag, data.to_vec());
    let r = b.irecv(Some(a.addr()), Some(tag), data.len());
    let got = b.wait_timeout(r, Duration::from_secs(20));
    assert!(matches!(&got, Ok(Completion::Received(m)) if m.data == data), "{got:?}\n{:?}\n{:?}", a.stats(), b.stats());
    a.wait_timeout(s, Duration::from_secs(20)).unwrap();
    let s = b.isend(a.addr(), tag + 1, data[..100].to_vec());
    let r = a.irecv(Some(b.addr()), Some(tag + 1), 100);
    assert!(matches!(a.wait_timeout(r, Duration::from_secs(20)), Ok(Completion::Received(m)) if m.data == data[..100]));
    b.wait_timeout(s, Duration::from_secs(20)).unwrap();
}

fn on_wire(wire: &[u8], data: &[u8]) -> bool {
    wire.windows(64).any(|w| w == &data[5000..5064])
}

#[test]
fn encrypted_links_carry_messages_and_nothing_readable() {
    let (_ns, a, b, relay) = through_relay(true, true);
    let eager = secret(10_000, 1);
    let rendezvous = secret(1 << 20, 2);
    exchange(&a, &b, 10, &eager);
    exchange(&a, &b, 20, &rendezvous);
    b.expose(7, 1 << 16).unwrap();
    let put = secret(1 << 16, 3);
    assert_eq!(a.wait(a.put(b.addr(), 7, 0, put.clone())).unwrap(), Completion::Put);
    assert_eq!(a.wait(a.get(b.addr(), 7, 0, 1 << 16)).unwrap(), Completion::Got(put.clone()));
    let wire = relay.wire();
    assert!(wire.len() > (1 << 20) + 2 * (1 << 16), "everything went through the relay ({} bytes)", wire.len());
    for (what, d) in [("eager", &eager), ("rendezvous", &rendezvous), ("put", &put)] {
        assert!(!on_wire(&wire, d), "the {what} message is readable on the wire");
    }
    assert!(!wire.windows(4).any(|w| w == b"GPSA"), "not even the frame magic shows");
}

#[test]
fn plain_links_are_readable_on_the_wire() {
    // The check above can fail: without encryption the same bytes are on the wire.
    let (_ns, a, b, relay) = through_relay(false, false);
    let eager = secret(10_000, 1);
    exchange(&a, &b, 10, &eager);
    assert!(on_wire(&relay.wire(), &eager));
}

#[test]
fn an_encrypted_link_cut_twice_loses_nothing() {
    let (_ns, a, b, relay) = through_relay(true, true);
    let mut sends = Vec::new();
    let n = 60;
    let r = b.irecv(Some(a.addr()), Some(99), 16);
    for i in 0..n {
        sends.push(a.isend(b.addr(), 100 + i, secret(if i % 3 == 0 { 200_000 } else { 3_000 }, i as u8)));
        if i == 20 || i == 40 {
            relay.cut();
        }
    }
    for i in 0..n {
        let want = secret(if i % 3 == 0 { 200_000 } else { 3_000 }, i as u8);
        let got = b.wait_timeout(b.irecv(Some(a.addr()), Some(100 + i), 200_000), Duration::from_secs(30));
        assert!(matches!(&got, Ok(Completion::Received(m)) if m.data == want), "message {i}: {got:?}\n{:?}", b.stats());
    }
    for s in sends {
        a.wait_timeout(s, Duration::from_secs(30)).unwrap();
    }
    assert!(a.stats().connections_established + b.stats().connections_established >= 2, "{:?}", a.stats());
    b.cancel(r);
}

#[test]
fn a_byte_altered_on_an_encrypted_link_is_caught_and_the_message_still_arrives_intact() {
    // Frames on encrypted links carry no payload checksum: the records' tags check
    // every byte. The byte altered here is deep in a 1 MiB message's data.
    let (_ns, a, b, relay) = through_altering_relay(true, true, Some(600_000));
    let data = secret(1 << 20, 9);
    exchange(&a, &b, 30, &data);
    assert!(relay.wire().len() > 600_000, "the altered byte went through the relay");
    let errors = b.stats().recent_errors.join("\n");
    assert!(errors.contains("failed to open"), "the alteration went unnoticed: {errors}");
    assert!(b.stats().connections_established >= 2, "the link was not renewed: {:?}", b.stats());
}

#[test]
fn an_encrypting_port_and_a_plain_one_refuse_each_other() {
    for (a_enc, b_enc, says) in [(true, false, "bad magic"), (false, true, "does not encrypt")] {
        let (_ns, a, b, _relay) = through_relay(a_enc, b_enc);
        let r = b.irecv(None, None, 1 << 16);
        let s = a.isend(b.addr(), 5, b"let me in".to_vec());
        match a.wait_timeout(s, Duration::from_secs(30)) {
            Err(NetError::PeerFailed { .. }) => {}
            other => panic!("encrypt {a_enc} -> {b_enc}: the send ended with {other:?}\n{:?}\n{:?}", a.stats(), b.stats()),
        }
        assert!(matches!(b.wait_timeout(r, Duration::from_millis(300)), Err(NetError::Timeout(_))), "something was delivered");
        let errors = [a.stats().recent_errors, b.stats().recent_errors].concat().join("\n");
        assert!(errors.to_lowercase().contains(says), "encrypt {a_enc} -> {b_enc}: {errors}");
    }
}

#[test]
fn encryption_without_a_key_is_refused() {
    let mut c = PortConfig::new(&unique("enc"), Addr::new(1, 1));
    c.encrypt = true;
    let e = Port::open(c).err().expect("refused");
    assert!(matches!(e, NetError::EncryptWithoutKey), "{e}");
}

#[test]
fn a_byte_altered_in_a_piece_summed_ahead_is_caught_and_the_message_still_arrives_intact() {
    // A sender that waits for its CTS checksums its pieces meanwhile, and they carry
    // their checksums in their headers rather than in a sum frame after them. The
    // receive is posted late so that the sender waits (spinning: it sums only then);
    // the altered byte is in the third of the 1 MiB message's four pieces.
    use gepsea_net::frame::{FrameDecoder, Kind, FLAG_PAYLOAD_CRC, FLAG_SUM_AFTER};
    let (_ns, a, b, relay) = plain_spinning_through_altering_relay(600_000);
    let data = secret(1 << 20, 11);
    let sent = std::thread::scope(|s| {
        let sender = s.spawn(|| a.wait_timeout(a.isend(b.addr(), 40, data.clone()), Duration::from_secs(20)));
        std::thread::sleep(Duration::from_millis(100));
        let got = b.wait_timeout(b.irecv(Some(a.addr()), Some(40), data.len()), Duration::from_secs(20));
        assert!(matches!(&got, Ok(Completion::Received(m)) if m.data == data), "{got:?}\n{:?}", b.stats());
        sender.join().unwrap()
    });
    assert_eq!(sent.unwrap(), Completion::Sent);
    let errors = b.stats().recent_errors.join("\n");
    assert!(errors.contains("payload checksum mismatch"), "the alteration went unnoticed: {errors}");
    assert!(b.stats().connections_established >= 2, "the link was not renewed: {:?}", b.stats());
    // The first connection's pieces, up to the altered one: checksums in their headers.
    let first = relay.first_record();
    let mut dec = FrameDecoder::new(1 << 21);
    dec.extend(&first[..first.len().min(550_000)]);
    let mut pieces = 0;
    while let Ok(Some((h, _))) = dec.next_frame() {
        if h.kind == Kind::Data {
            assert_ne!(h.flags & FLAG_PAYLOAD_CRC, 0, "piece at {} without its checksum", h.offset);
            assert_eq!(h.flags & FLAG_SUM_AFTER, 0);
            pieces += 1;
        }
    }
    assert_eq!(pieces, 2, "the two pieces before the altered byte");
}
