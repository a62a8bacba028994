//! The records of an encrypted link (`gepsea_net::seal`), read from whatever a peer
//! sends: before the handshake (an acceptor reading the magic and the first Noise
//! message) and after it (an established session reading records cut anywhere). Bytes
//! that are not a session's records must be refused, never panic or be delivered.
#![no_main]
use gepsea_net::auth::Key;
use gepsea_net::seal::Sealer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    // The cut points of the reads: 1 to 64 bytes, or whole.
    let step = match mode & 0x3f {
        0 => usize::MAX,
        s => s as usize,
    };
    let key = Key::from_secret(b"fuzzing the records");
    let mut out = Vec::new();
    let mut reader = if mode & 0x40 == 0 {
        Sealer::new(&key, false, &mut Vec::new())
    } else {
        // An established session: the records after a real handshake.
        let mut hello = Vec::new();
        let mut initiator = Sealer::new(&key, true, &mut hello);
        let mut acceptor = Sealer::new(&key, false, &mut Vec::new());
        let mut answer = Vec::new();
        acceptor.open(&hello, &mut |_| panic!("plaintext before the session"), &mut answer).expect("a real hello opens");
        initiator.open(&answer, &mut |_| panic!("plaintext before the session"), &mut Vec::new()).expect("a real answer opens");
        assert!(initiator.ready() && acceptor.ready());
        initiator
    };
    let mut delivered = 0usize;
    for piece in rest.chunks(step.min(rest.len().max(1))) {
        if reader.open(piece, &mut |p| delivered += p.len(), &mut out).is_err() {
            break;
        }
    }
    // Nobody else holds this session's keys: nothing can have opened.
    assert_eq!(delivered, 0, "forged records delivered plaintext");
});
