//! The BLAST archive (outfmt 11) scanner workers' results go through, and the merge
//! that follows it.
#![no_main]
use gepsea_blast::archive;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(hsps) = archive::hsps(&text) {
        let lists = archive::hits_by_query(&hsps, 0, 4);
        for list in lists {
            let merged = archive::merge_query(vec![list.clone(), list], 5);
            for h in &merged {
                for s in &h.hsps {
                    let _ = archive::renumber(s, 2);
                }
            }
        }
    }
    let _ = gepsea_blast::report::query_masks(&text);
});
