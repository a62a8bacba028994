//! The compact header of shared-memory records: read from whatever a peer process
//! wrote into the ring.
#![no_main]
use gepsea_net::frame::Header;
use gepsea_net::Addr;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((h, used)) = Header::decode_compact(data, Addr::new(1, 2), Addr::new(1, 3), 1 << 16) {
        assert!(used <= data.len());
        assert!(h.len as usize <= 1 << 16);
    }
});
