//! The FASTA reader every query file and `db format` input goes through.
#![no_main]
use gepsea_blast::fasta;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(records) = fasta::read_from(data, std::path::Path::new("fuzz.fasta")) {
        let mut out = Vec::new();
        for r in &records {
            r.write_to(&mut out);
        }
        // What was read writes back to something that reads the same.
        let again = fasta::read_from(&out[..], std::path::Path::new("again.fasta")).expect("written records read back");
        assert_eq!(again.len(), records.len());
    }
});
