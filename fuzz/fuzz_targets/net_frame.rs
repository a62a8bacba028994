//! The TCP frame decoder, fed the input in pieces (sizes taken from the input's first
//! byte), as a socket would deliver it: every frame is returned whole or the stream is
//! poisoned, never a panic, never a read past the buffer.
#![no_main]
use gepsea_net::frame::{FrameDecoder, Header, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&step, stream)) = data.split_first() else { return };
    let _ = Header::decode(&stream[..stream.len().min(HEADER_LEN)], 1 << 16);
    let mut d = FrameDecoder::new(1 << 16);
    for piece in stream.chunks(usize::from(step).max(1)) {
        d.extend(piece);
        loop {
            match d.next_frame() {
                Ok(Some((h, payload))) => assert_eq!(payload.len(), h.len as usize),
                Ok(None) => break,
                Err(_) => {
                    // Poisoned for good: the same error again, whatever follows.
                    assert!(d.next_frame().is_err());
                    return;
                }
            }
        }
    }
});
