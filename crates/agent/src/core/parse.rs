//! Parsing engine: splits byte streams into records, incrementally.
//!
//! Agents receive output in arbitrary chunks (whatever a worker handed over, whatever
//! arrived from the network); the parser keeps the partial record between chunks and
//! hands out only complete ones, each with its byte offset in the whole stream, so a
//! plug-in can index, merge or regenerate records without re-reading the stream.

/// How records are delimited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Format {
    /// One record per line (`\n`; the newline is kept).
    Lines,
    /// FASTA: a record starts at each line beginning with `>`.
    Fasta,
    /// Records that start at each line beginning with this prefix (e.g. `Query=` in
    /// BLAST pairwise output, `<Iteration>` in BLAST XML).
    LineStartsWith(Vec<u8>),
    /// Records of a 4-byte little-endian length followed by that many bytes.
    LengthPrefixed,
}

/// A complete record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    /// Offset of the record's first byte in the whole stream.
    pub offset: u64,
    pub bytes: Vec<u8>,
}

/// Input that cannot be a stream of this format.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("{what} at byte {offset}")]
    Malformed { what: String, offset: u64 },
    #[error("stream ended inside a record that started at byte {offset}")]
    Truncated { offset: u64 },
}

/// An incremental parser.
pub struct Parser {
    format: Format,
    buf: Vec<u8>,
    /// Stream offset of `buf[0]`.
    base: u64,
}

impl Parser {
    pub fn new(format: Format) -> Self {
        Parser { format, buf: Vec::new(), base: 0 }
    }

    /// Feeds a chunk; returns the records it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Parsed>, ParseError> {
        self.buf.extend_from_slice(chunk);
        self.take(false)
    }

    /// The stream ended; returns the last record(s).
    pub fn finish(&mut self) -> Result<Vec<Parsed>, ParseError> {
        self.take(true)
    }

    fn take(&mut self, eof: bool) -> Result<Vec<Parsed>, ParseError> {
        let mut out = Vec::new();
        let cut = match &self.format {
            Format::LengthPrefixed => {
                let mut at = 0;
                while self.buf.len() - at >= 4 {
                    let len = u32::from_le_bytes(self.buf[at..at + 4].try_into().unwrap()) as usize;
                    if self.buf.len() - at - 4 < len {
                        break;
                    }
                    out.push(Parsed { offset: self.base + at as u64, bytes: self.buf[at + 4..at + 4 + len].to_vec() });
                    at += 4 + len;
                }
                if eof && at < self.buf.len() {
                    return Err(ParseError::Truncated { offset: self.base + at as u64 });
                }
                at
            }
            Format::Lines => {
                let mut at = 0;
                while let Some(n) = self.buf[at..].iter().position(|&b| b == b'\n') {
                    out.push(Parsed { offset: self.base + at as u64, bytes: self.buf[at..at + n + 1].to_vec() });
                    at += n + 1;
                }
                if eof && at < self.buf.len() {
                    out.push(Parsed { offset: self.base + at as u64, bytes: self.buf[at..].to_vec() });
                    at = self.buf.len();
                }
                at
            }
            Format::Fasta | Format::LineStartsWith(_) => {
                let prefix: &[u8] = match &self.format {
                    Format::Fasta => b">",
                    Format::LineStartsWith(p) => p,
                    _ => unreachable!(),
                };
                let starts: Vec<usize> = line_starts(&self.buf).filter(|&i| self.buf[i..].starts_with(prefix)).collect();
                if self.base == 0 && !self.buf.is_empty() && starts.first() != Some(&0) && matches!(self.format, Format::Fasta) {
                    let complete_first_line = self.buf.contains(&b'\n') || eof;
                    if complete_first_line {
                        return Err(ParseError::Malformed { what: "FASTA data before the first '>' header".into(), offset: 0 });
                    }
                }
                let first = starts.first().copied().unwrap_or(self.buf.len());
                // Anything before the first record start is a preamble (e.g. a report
                // header); hand it out as its own record so no byte is lost.
                if first > 0 && (!starts.is_empty() || eof) {
                    out.push(Parsed { offset: self.base, bytes: self.buf[..first].to_vec() });
                }
                let mut consumed = if starts.is_empty() && !eof { 0 } else { first };
                for w in starts.windows(2) {
                    out.push(Parsed { offset: self.base + w[0] as u64, bytes: self.buf[w[0]..w[1]].to_vec() });
                    consumed = w[1];
                }
                if eof {
                    if let Some(&last) = starts.last() {
                        out.push(Parsed { offset: self.base + last as u64, bytes: self.buf[last..].to_vec() });
                    }
                    consumed = self.buf.len();
                }
                consumed
            }
        };
        self.buf.drain(..cut);
        self.base += cut as u64;
        Ok(out)
    }
}

fn line_starts(b: &[u8]) -> impl Iterator<Item = usize> + '_ {
    std::iter::once(0).chain(b.iter().enumerate().filter(|(_, &c)| c == b'\n').map(|(i, _)| i + 1)).filter(move |&i| i < b.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn all(format: Format, data: &[u8], cuts: &[usize]) -> Result<Vec<Parsed>, ParseError> {
        let mut p = Parser::new(format);
        let mut out = Vec::new();
        let mut at = 0;
        for &c in cuts {
            let c = c.min(data.len()).max(at);
            out.extend(p.feed(&data[at..c])?);
            at = c;
        }
        out.extend(p.feed(&data[at..])?);
        out.extend(p.finish()?);
        Ok(out)
    }

    proptest! {
        #[test]
        fn chunking_never_changes_the_records(cuts in proptest::collection::vec(0usize..200, 0..6)) {
            let mut cuts = cuts;
            cuts.sort();
            let fasta = b">a one\nACGT\nAC\n>b\nGG\n>c\n".to_vec();
            let whole = all(Format::Fasta, &fasta, &[]).unwrap();
            prop_assert_eq!(whole.iter().map(|r| r.bytes.clone()).collect::<Vec<_>>(),
                vec![b">a one\nACGT\nAC\n".to_vec(), b">b\nGG\n".to_vec(), b">c\n".to_vec()]);
            prop_assert_eq!(&all(Format::Fasta, &fasta, &cuts).unwrap(), &whole);
            let mut lp = Vec::new();
            for r in ["x", "", "yz"] { lp.extend((r.len() as u32).to_le_bytes()); lp.extend(r.as_bytes()); }
            let recs = all(Format::LengthPrefixed, &lp, &cuts).unwrap();
            prop_assert_eq!(recs.iter().map(|r| r.bytes.clone()).collect::<Vec<_>>(), vec![b"x".to_vec(), vec![], b"yz".to_vec()]);
            prop_assert_eq!(recs.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![0, 5, 9]);
            let lines = all(Format::Lines, b"a\nbb\nc", &cuts).unwrap();
            prop_assert_eq!(lines.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![0, 2, 5]);
        }
    }

    #[test]
    fn preamble_is_kept_and_bad_input_is_named() {
        let rep = b"BLASTP 2.12\n\nQuery= a\nhits\nQuery= b\nmore\n";
        let r = all(Format::LineStartsWith(b"Query=".to_vec()), rep, &[3]).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r.iter().flat_map(|p| p.bytes.clone()).collect::<Vec<_>>(), rep.to_vec());
        assert_eq!(r[1].offset, 13);
        assert_eq!(
            all(Format::Fasta, b"ACGT\n>a\n", &[]).unwrap_err(),
            ParseError::Malformed { what: "FASTA data before the first '>' header".into(), offset: 0 }
        );
        assert_eq!(all(Format::LengthPrefixed, &[5, 0, 0, 0, 1], &[]).unwrap_err(), ParseError::Truncated { offset: 0 });
    }
}
