//! Sizes in bytes as users write them: `4194304`, `4MiB`, `4 MB`, `1.5GiB`
//! (`parse-size`: IEC prefixes are powers of 1024, SI ones powers of 1000, `B`
//! optional). A bare prefix (`4M`, `20g`) is refused as ambiguous, naming both readings:
//! `sort -S` and Slurm read it as binary, `parse-size` and disk makers as decimal, and a
//! 5 % difference in a budget or a buffer is not one to guess.

use crate::error::{AmbiguousSize, ByteSizeError};

/// The bytes `text` stands for.
pub fn parse_byte_size(text: &str) -> Result<u64, ByteSizeError> {
    let text = text.trim();
    if let Some(prefix) = text.chars().last().filter(|c| "kKmMgGtTpPeE".contains(*c)) {
        let number = text[..text.len() - 1].trim_end();
        if let (Ok(binary), Ok(decimal)) =
            (parse_size::parse_size(format!("{number}{prefix}iB")), parse_size::parse_size(format!("{number}{prefix}B")))
        {
            let prefix = prefix.to_ascii_uppercase();
            return Err(ByteSizeError::Ambiguous(Box::new(AmbiguousSize { number: number.to_string(), prefix, binary, decimal })));
        }
    }
    parse_size::parse_size(text).map_err(|_| ByteSizeError::NotASize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_read_with_their_units_and_a_bare_prefix_is_refused() {
        for (text, bytes) in [
            ("4194304", 4 << 20),
            ("4MiB", 4 << 20),
            ("4 MiB", 4 << 20),
            ("4mib", 4 << 20),
            ("4MB", 4_000_000),
            ("20GB", 20_000_000_000),
            ("1.5GiB", 3 << 29),
            ("512KiB", 512 << 10),
            ("0", 0),
        ] {
            assert_eq!(parse_byte_size(text), Ok(bytes), "{text}");
        }
        assert_eq!(
            parse_byte_size("4M"),
            Err(ByteSizeError::Ambiguous(Box::new(AmbiguousSize { number: "4".into(), prefix: 'M', binary: 4 << 20, decimal: 4_000_000 })))
        );
        assert_eq!(parse_byte_size("20g").unwrap_err().to_string(), "20G is ambiguous: 20GiB (21474836480 bytes) or 20GB (20000000000)?");
        for bad in ["lots", "", "-1", "4 MiBs", "M"] {
            assert_eq!(parse_byte_size(bad), Err(ByteSizeError::NotASize), "{bad:?}");
        }
    }
}
