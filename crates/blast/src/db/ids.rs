//! Duplicate sequence identifiers in a database's input, found in bounded memory:
//! `db format`'s scan hashes every identifier's key (what makeblastdb
//! `-parse_seqids` tells sequences apart by), keeps the hashes in sorted runs that
//! spill to disk, merges the runs for hashes seen twice, and confirms each with the
//! exact identifiers in one more pass, so a hash collision is never reported as a
//! duplicate.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::{io, DbError};
use crate::fasta::{self, FastaError, Line};
use crate::text::shown;

/// What `makeblastdb -parse_seqids` tells sequences apart by, where that is not the
/// whole identifier: UniProt's `sp|ACC|NAME` and `tr|ACC|NAME` and a local `lcl|ID` go
/// by the accession or ID, which is also the key of that accession given bare. To
/// makeblastdb `tr|P1|a` and `tr|P1|b` are the same sequence, as are `sp|P1|a`,
/// `tr|P1|b` and `P1`, and `lcl|x` and `x` (each pair checked with makeblastdb 2.12).
/// Other NCBI forms (`gi|`, `ref|`, ...) are left whole. Checked across the whole input:
/// each fragment's makeblastdb sees only its own sequences, and two in different
/// fragments made a database that serial makeblastdb refuses.
/// Identifiers are bytes, as deflines are (see `fasta`).
pub(super) fn seq_id_key(id: &[u8]) -> &[u8] {
    let mut fields = id.splitn(3, |&b| b == b'|');
    match (fields.next(), fields.next()) {
        (Some(tag), Some(acc)) if !acc.is_empty() && [&b"sp"[..], b"tr", b"lcl"].iter().any(|t| tag.eq_ignore_ascii_case(t)) => acc,
        _ => id,
    }
}

pub(super) fn id_hash(id: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

/// Identifier hashes of every sequence, held in sorted runs of at most `cap` in memory
/// and spilled to files in `dir` beyond: memory stays bounded whatever the number of
/// sequences, and a merge of the runs finds every hash seen more than once.
pub(super) struct IdHashes {
    run: Vec<u64>,
    cap: usize,
    dir: PathBuf,
    files: Vec<PathBuf>,
}

impl IdHashes {
    pub(super) fn new(dir: &Path, cap: usize) -> Self {
        IdHashes { run: Vec::new(), cap: cap.max(1), dir: dir.to_path_buf(), files: Vec::new() }
    }

    pub(super) fn push(&mut self, h: u64) -> Result<(), DbError> {
        self.run.push(h);
        if self.run.len() >= self.cap {
            self.spill()?;
        }
        Ok(())
    }

    fn spill(&mut self) -> Result<(), DbError> {
        self.run.sort_unstable();
        let path = self.dir.join(format!(".ids-{}.run", self.files.len()));
        let mut w = std::io::BufWriter::new(std::fs::File::create(&path).map_err(io(&path))?);
        for h in &self.run {
            w.write_all(&h.to_le_bytes()).map_err(io(&path))?;
        }
        w.flush().map_err(io(&path))?;
        self.files.push(path);
        self.run.clear();
        Ok(())
    }

    /// Hashes seen more than once; removes the run files.
    pub(super) fn repeated(mut self) -> Result<HashSet<u64>, DbError> {
        let mut repeated = HashSet::new();
        if self.files.is_empty() {
            self.run.sort_unstable();
            repeated.extend(self.run.windows(2).filter(|w| w[0] == w[1]).map(|w| w[0]));
            return Ok(repeated);
        }
        if !self.run.is_empty() {
            self.spill()?;
        }
        // k-way merge of the sorted runs.
        let mut readers = Vec::new();
        for p in &self.files {
            readers.push(std::io::BufReader::with_capacity(64 << 10, std::fs::File::open(p).map_err(io(p))?));
        }
        let next = |r: &mut std::io::BufReader<std::fs::File>| -> Option<u64> {
            let mut b = [0u8; 8];
            r.read_exact(&mut b).ok().map(|_| u64::from_le_bytes(b))
        };
        let mut heap = std::collections::BinaryHeap::new();
        for (i, r) in readers.iter_mut().enumerate() {
            if let Some(h) = next(r) {
                heap.push(std::cmp::Reverse((h, i)));
            }
        }
        let mut last = None;
        while let Some(std::cmp::Reverse((h, i))) = heap.pop() {
            if last == Some(h) {
                repeated.insert(h);
            }
            last = Some(h);
            if let Some(n) = next(&mut readers[i]) {
                heap.push(std::cmp::Reverse((n, i)));
            }
        }
        for p in &self.files {
            let _ = std::fs::remove_file(p);
        }
        Ok(repeated)
    }
}

/// Identifier hashes kept in memory at once (32 MiB) before a sorted run goes to disk.
pub(super) const ID_HASHES_IN_MEMORY: usize = 4 << 20;

/// Finds the exact duplicate behind identifier hashes seen twice (or learns that they
/// were collisions of distinct identifiers).
pub(super) fn confirm_duplicates(input: &Path, collided: &HashSet<u64>) -> Result<(), DbError> {
    let (reader, _) = fasta::open_with(input, super::format::READ_BUFFER)?;
    let mut first: HashMap<Vec<u8>, (usize, Vec<u8>)> = HashMap::new();
    fasta::scan(reader, input, fasta::Reading::Database, |l| {
        if let Line::Header { id, line, .. } = l {
            let key = seq_id_key(id);
            if collided.contains(&id_hash(key)) {
                if let Some((f, first_id)) = first.get(key) {
                    let path = input.to_path_buf();
                    return Err(if first_id == id {
                        FastaError::Duplicate { path, line, id: shown(id), first: *f }
                    } else {
                        FastaError::SameAccession { path, line, id: shown(id), key: shown(key), first_id: shown(first_id), first: *f }
                    });
                }
                first.insert(key.to_vec(), (line, id.to_vec()));
            }
        }
        Ok(())
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniprot_and_local_identifiers_are_told_apart_by_accession_as_makeblastdb_does() {
        let key = |id: &'static str| std::str::from_utf8(seq_id_key(id.as_bytes())).unwrap();
        assert_eq!(key("sp|P12345|A_HUMAN"), "P12345");
        assert_eq!(key("tr|W0FSK4|W0FSK4_9FLAV"), "W0FSK4");
        assert_eq!(key("SP|P12345|A_HUMAN"), "P12345");
        assert_eq!(key("lcl|query1"), "query1");
        assert_eq!(key("P12345"), "P12345", "bare: itself, the key of sp|P12345|…");
        // Left whole: other NCBI forms, and forms with nothing after the bar.
        assert_eq!(key("gi|123|ref|NP_1.1|"), "gi|123|ref|NP_1.1|");
        assert_eq!(key("ref|NP_000001.1|"), "ref|NP_000001.1|");
        assert_eq!(key("sp||x"), "sp||x");
        assert_eq!(key("spx|P1|a"), "spx|P1|a");
    }

    #[test]
    fn repeated_identifier_hashes_are_found_across_spilled_runs() {
        let dir = std::env::temp_dir().join(format!("gepsea-idhash-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for cap in [1000, 7, 1] {
            let mut h = IdHashes::new(&dir, cap);
            for x in (0..100u64).chain([42, 99, 0]) {
                h.push(x * 2654435761 % 1000003).unwrap();
            }
            let want: HashSet<u64> = [42u64, 99, 0].iter().map(|x| x * 2654435761 % 1000003).collect();
            assert_eq!(h.repeated().unwrap(), want, "cap {cap}");
        }
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "run files are removed");
        std::fs::remove_dir(&dir).unwrap();
    }
}
