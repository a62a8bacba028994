//! The report scanners: joining parts of each base format, counting hits.
#![no_main]
use gepsea_blast::parts::{count_hits, Assembler};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    let fmt = [0u32, 5, 6, 7][usize::from(sel & 3)];
    // Two parts: the input cut where its first byte says.
    let cut = text.char_indices().map(|(i, _)| i).nth(usize::from(sel >> 2)).unwrap_or(text.len());
    let mut a = Assembler::new(Vec::new(), fmt);
    if a.part(&text[..cut], false).is_ok() && a.part(&text[cut..], true).is_ok() {
        let _ = a.finish();
    }
    for outfmt in ["0", "5", "6", "7", "6 qseqid sseqid evalue", "7 evalue"] {
        let _ = count_hits(&text, outfmt);
    }
});
