//! The port protocol (sans-IO `Proto`) driven by frames a peer could send: every
//! header field and payload comes from the input; magic, version and header CRC are
//! made valid so that the input reaches the protocol instead of the frame check. The
//! receiving side has receives posted, an exposed region and events on; it must answer
//! with frames or errors, never panic, and never grow without bound. When the input's
//! first byte is odd the peer is a port on this node and both sides offer single and
//! split copies, so offers, write requests, write reports and byte-range requests
//! (`proto/copy.rs`) are input too; every copy and write is reported refused.
#![no_main]
use bytes::Bytes;
use gepsea_net::frame::{Addr, Header, HEADER_LEN, MAGIC, VERSION};
use gepsea_net::proto::{Proto, ProtoConfig};
use libfuzzer_sys::fuzz_target;

const REMOTE_ME: Addr = Addr::new(2, 1);
const LOCAL_ME: Addr = Addr::new(1, 2);
const PEER: Addr = Addr::new(1, 1);

fuzz_target!(|data: &[u8]| {
    let local = data.first().is_some_and(|b| b & 1 == 1);
    let me = if local { LOCAL_ME } else { REMOTE_ME };
    let mut p = Proto::new(me, ProtoConfig { eager_threshold: 64, credits: 4, chunk: 32, max_unexpected_rts: 8 });
    p.enable_events();
    let _ = p.expose(7, 256);
    let mut posted = vec![p.irecv(Some(PEER), Some(1), 100), p.irecv(None, None, 16), p.irecv(None, Some(3), 1000)];
    let _ = p.isend(PEER, 9, Bytes::from_static(&[1; 200]));
    if local {
        p.offer_single_copy(Some(std::process::id()));
        p.help_split_copies(true);
        // Large enough to be split either way.
        posted.push(p.irecv(Some(PEER), Some(5), 128 << 10));
        let _ = p.isend(PEER, 11, Bytes::from(vec![2u8; 64 << 10]));
    }
    let me_bytes: Vec<u8> = [me.node.to_le_bytes(), me.port.to_le_bytes()].concat();
    let mut rest = data;
    while rest.len() >= HEADER_LEN {
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&rest[..HEADER_LEN]);
        h[..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[4] = VERSION;
        // Addressed from the peer to this port, mostly: a stray address is input too.
        if h[7] & 0x80 == 0 {
            h[8..16].copy_from_slice(&[1, 0, 0, 0, 1, 0, 0, 0]);
            h[16..24].copy_from_slice(&me_bytes);
        }
        let len = (u32::from_le_bytes(h[72..76].try_into().unwrap()) % 300) as usize;
        h[72..76].copy_from_slice(&(len as u32).to_le_bytes());
        h[7] &= !1; // no payload CRC: the payload's bytes are the fuzzer's to choose
        let crc = crc32c::crc32c(&h[..84]);
        h[84..88].copy_from_slice(&crc.to_le_bytes());
        rest = &rest[HEADER_LEN..];
        let payload = &rest[..len.min(rest.len())];
        rest = &rest[payload.len()..];
        let Ok(header) = Header::decode(&h, 1 << 16) else { continue };
        if header.check_payload(payload).is_err() {
            continue;
        }
        if p.on_frame(&header, payload).is_err() {
            // The transport resets such a connection; the peer then counts as failed.
            p.peer_failed(PEER, "fuzzed frame refused");
            break;
        }
        while let Some(out) = p.pop_frame(PEER) {
            p.frame_sent(out.completes);
        }
        while p.next_event().is_some() {}
        while let Some(job) = p.next_copy() {
            p.copy_done(job, false);
        }
        while let Some(job) = p.next_write() {
            p.write_done(job, false);
        }
    }
    for id in posted {
        let _ = p.take(id);
    }
    while p.recv_system().is_some() {}
});
