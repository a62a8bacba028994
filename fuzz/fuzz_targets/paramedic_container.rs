//! What a storage site reads from the wide-area network: the checked container, then
//! each metadata plug-in's decoder (raw, zstd, trace), and the BLAST metadata's summary.
#![no_main]
use libfuzzer_sys::fuzz_target;
use paramedic::plugin::{MetadataPlugin, RawPlugin, ZstdPlugin};
use paramedic::trace::TracePlugin;

fuzz_target!(|data: &[u8]| {
    let _ = paramedic::container::unwrap(data);
    let _ = RawPlugin.decode(data);
    let _ = ZstdPlugin { level: 3 }.decode(data);
    let _ = TracePlugin.decode(data);
    let _ = paramedic::blast::metadata_summary(data);
    // A container that passes its checksum reaches the plug-ins' decoders.
    for name in ["raw", "zstd", "trace"] {
        let sealed = paramedic::container::wrap(name, data);
        assert!(paramedic::container::unwrap(&sealed).is_ok());
    }
});
