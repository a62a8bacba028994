//! The report scanners: joining parts of each base format, counting hits. Parts are
//! bytes in any encoding (query titles need not be UTF-8).
#![no_main]
use gepsea_blast::parts::{count_hits, join, Assembler};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let fmt = [0u32, 5, 6, 7][usize::from(sel & 3)];
    // Two parts: the input cut where its first byte says.
    let cut = usize::from(sel >> 2).min(rest.len());
    let mut a = Assembler::new(Vec::new(), fmt);
    if a.part_from(&rest[..cut], false).is_ok() && a.part_from(&rest[cut..], true).is_ok() {
        let _ = a.finish();
    }
    // Tabular parts without comments are joined as they are, byte for byte.
    assert_eq!(join(&[&rest[..cut], &rest[cut..]], 6).expect("format 6 joins anything"), rest);
    let text = String::from_utf8_lossy(rest);
    for outfmt in ["0", "5", "6", "7", "6 qseqid sseqid evalue", "7 evalue"] {
        let _ = count_hits(&text, outfmt);
    }
});
