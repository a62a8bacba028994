//! Report text that is not UTF-8.
//!
//! BLAST+ copies a query's title and identifier into its reports byte for byte, and a
//! query file need not be UTF-8: Latin-1 deflines (`>g\xe8ne1 M\xfcller`, as older
//! tools and spreadsheets write them) are read by BLAST+ as they are, and serial
//! BLAST+ prints those bytes. The report code works on `str` lines and changes only
//! their ASCII structure (query numbers, tags, trailers), so a line that is not UTF-8
//! is read as Latin-1 — each byte one `char`, U+0000 to U+00FF, a bijection — and
//! what is written for it is turned back into bytes the same way: such a line passes
//! through exactly, and nothing else changes for UTF-8 lines.

use std::borrow::Cow;

/// One line of a report as text (or a whole report read as one: the round trip holds
/// for any bytes).
pub struct Line<'a> {
    text: Cow<'a, str>,
    /// Read as Latin-1 ([`line()`]): its text goes back to bytes one `char` per byte.
    latin1: bool,
}

/// `bytes` as text: UTF-8 when they are, else Latin-1 (see the module docs).
pub fn line(bytes: &[u8]) -> Line<'_> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Line { text: Cow::Borrowed(s), latin1: false },
        Err(_) => Line { text: Cow::Owned(bytes.iter().map(|&b| char::from(b)).collect()), latin1: true },
    }
}

impl Line<'_> {
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The bytes to write for `text`, made from this line: as the line was read.
    pub fn bytes_of<'b>(&self, text: &'b str) -> Cow<'b, [u8]> {
        if self.latin1 {
            // Every `char` here came from one byte of the line or is ASCII the report
            // code wrote.
            Cow::Owned(text.chars().map(|c| u8::try_from(c).unwrap_or(b'?')).collect())
        } else {
            Cow::Borrowed(text.as_bytes())
        }
    }
}

/// A report as text, each line read as [`line()`] reads it: borrowed when the whole is
/// UTF-8 (the usual report), else one line at a time, so that an identifier read with
/// [`line()`] matches the lines that print it whatever the other lines hold.
pub fn lines(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => Cow::Owned(bytes.split_inclusive(|&b| b == b'\n').map(|l| line(l).text).collect()),
    }
}

/// `bytes` for a message: UTF-8 as it is, any other byte as its Latin-1 character
/// (what such a file most likely meant; error messages quote it with `{:?}`, which
/// escapes what is not printable).
pub fn shown(bytes: &[u8]) -> String {
    bytes.utf8_chunks().fold(String::new(), |mut s, c| {
        s.push_str(c.valid());
        s.extend(c.invalid().iter().map(|&b| char::from(b)));
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_that_are_not_utf8_round_trip_byte_for_byte() {
        let raw = b"Query= g\xe8ne1 M\xfcller \xff\n";
        let l = line(raw);
        assert_eq!(l.as_str(), "Query= g\u{e8}ne1 M\u{fc}ller \u{ff}\n");
        assert_eq!(&*l.bytes_of(l.as_str()), raw);
        let renumbered = l.as_str().replace("Query=", "Query_12=");
        assert_eq!(&*l.bytes_of(&renumbered), b"Query_12= g\xe8ne1 M\xfcller \xff\n");
        let utf8 = "Query= M\u{fc}ller \u{3b2}\n";
        let l = line(utf8.as_bytes());
        assert_eq!((l.as_str(), &*l.bytes_of(utf8)), (utf8, utf8.as_bytes()));
    }

    #[test]
    fn a_report_is_read_line_by_line() {
        assert!(matches!(lines(b"q1\ts\nq2\ts\n"), Cow::Borrowed("q1\ts\nq2\ts\n")));
        // A UTF-8 line keeps its characters beside a Latin-1 one.
        assert_eq!(lines(b"M\xc3\xbcller\tx\ng\xe8ne1\ty"), "M\u{fc}ller\tx\ng\u{e8}ne1\ty");
    }

    #[test]
    fn messages_show_other_bytes_as_latin1() {
        assert_eq!(shown(b"g\xe8ne1 M\xc3\xbcller \x81"), "g\u{e8}ne1 M\u{fc}ller \u{81}");
        assert_eq!(format!("{:?}", shown(b"x\x81")), "\"x\\u{81}\"");
    }
}
