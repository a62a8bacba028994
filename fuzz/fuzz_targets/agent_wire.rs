//! The agent's wire messages: requests from local processes (registration socket and
//! gepsea-net), messages from other agents, replies, and the registration socket's
//! length-prefixed framing.
#![no_main]
use gepsea_agent::wire::{decode, unix, Envelope, LocalReply, LocalRequest, PeerMsg, Reply, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode::<Request>("request", data);
    let _ = decode::<LocalRequest>("local request", data);
    let _ = decode::<LocalReply>("local reply", data);
    let _ = decode::<PeerMsg>("peer message", data);
    let _ = decode::<Reply>("reply", data);
    let _ = decode::<Envelope>("envelope", data);
    let mut buf = data.to_vec();
    while let Ok(Some(body)) = unix::split(&mut buf) {
        let _ = decode::<LocalRequest>("local request", &body);
    }
});
