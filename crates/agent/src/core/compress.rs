//! Compression engine: zstd and gzip, streaming, plus named application codecs.
//!
//! Streaming matters because the agent compresses results while they are still being
//! produced (runtime output compression): [`Engine::encoder`] wraps any `Write`, so a
//! result can be compressed chunk by chunk straight into a file or a network buffer.
//! Applications with better knowledge of their data register a [`CustomCodec`] by name
//! and use it through the same engine (GePSeA's "hook for application-specific
//! compression").

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::Arc;

use crate::wire::Codec;

/// Why compression or decompression failed.
#[derive(Debug, thiserror::Error)]
pub enum CompressError {
    #[error("unknown codec {0:?} (built in: zstd, gzip; register custom codecs with the engine)")]
    UnknownCodec(String),
    #[error("zstd level {0} is out of range 1..=22")]
    BadLevel(i32),
    #[error("corrupt or truncated {codec} data: {source}")]
    Corrupt { codec: String, source: io::Error },
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// An application-specific codec.
pub trait CustomCodec: Send + Sync {
    fn compress(&self, data: &[u8], level: i32) -> Result<Vec<u8>, CompressError>;
    fn decompress(&self, data: &[u8]) -> Result<Vec<u8>, CompressError>;
}

/// The engine: built-in codecs plus a registry of custom ones.
#[derive(Default, Clone)]
pub struct Engine {
    custom: HashMap<String, Arc<dyn CustomCodec>>,
}

/// A streaming compressor over `W`; call [`Encoder::finish`] to complete the stream.
pub enum Encoder<W: Write> {
    Zstd(zstd::stream::write::Encoder<'static, W>),
    Gzip(flate2::write::GzEncoder<W>),
}

impl<W: Write> Write for Encoder<W> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Encoder::Zstd(e) => e.write(b),
            Encoder::Gzip(e) => e.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Encoder::Zstd(e) => e.flush(),
            Encoder::Gzip(e) => e.flush(),
        }
    }
}

impl<W: Write> Encoder<W> {
    /// Writes the stream's trailer and returns the inner writer.
    pub fn finish(self) -> io::Result<W> {
        match self {
            Encoder::Zstd(e) => e.finish(),
            Encoder::Gzip(e) => e.finish(),
        }
    }
}

impl Engine {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers an application codec under `name` (replacing any earlier one).
    pub fn register(&mut self, name: &str, codec: Arc<dyn CustomCodec>) {
        self.custom.insert(name.to_string(), codec);
    }

    /// A streaming encoder for a built-in codec.
    pub fn encoder<W: Write>(&self, codec: &Codec, level: i32, w: W) -> Result<Encoder<W>, CompressError> {
        match codec {
            Codec::Zstd => {
                if !(1..=22).contains(&level) {
                    return Err(CompressError::BadLevel(level));
                }
                Ok(Encoder::Zstd(zstd::stream::write::Encoder::new(w, level)?))
            }
            Codec::Gzip => Ok(Encoder::Gzip(flate2::write::GzEncoder::new(w, flate2::Compression::new(level.clamp(0, 9) as u32)))),
            Codec::Custom(n) => Err(CompressError::UnknownCodec(format!("{n} (custom codecs are not streaming)"))),
        }
    }

    /// A streaming decoder for a built-in codec.
    pub fn decoder<'r, R: Read + 'r>(&self, codec: &Codec, r: R) -> Result<Box<dyn Read + 'r>, CompressError> {
        match codec {
            Codec::Zstd => Ok(Box::new(zstd::stream::read::Decoder::new(r)?)),
            Codec::Gzip => Ok(Box::new(flate2::read::MultiGzDecoder::new(r))),
            Codec::Custom(n) => Err(CompressError::UnknownCodec(n.clone())),
        }
    }

    pub fn compress(&self, codec: &Codec, level: i32, data: &[u8]) -> Result<Vec<u8>, CompressError> {
        if let Codec::Custom(n) = codec {
            return self.custom.get(n).ok_or_else(|| CompressError::UnknownCodec(n.clone()))?.compress(data, level);
        }
        let mut e = self.encoder(codec, level, Vec::with_capacity(data.len() / 3 + 64))?;
        e.write_all(data)?;
        Ok(e.finish()?)
    }

    pub fn decompress(&self, codec: &Codec, data: &[u8]) -> Result<Vec<u8>, CompressError> {
        if let Codec::Custom(n) = codec {
            return self.custom.get(n).ok_or_else(|| CompressError::UnknownCodec(n.clone()))?.decompress(data);
        }
        let name = match codec {
            Codec::Zstd => "zstd",
            _ => "gzip",
        };
        if data.is_empty() {
            return Err(CompressError::Corrupt { codec: name.into(), source: io::ErrorKind::UnexpectedEof.into() });
        }
        let mut out = Vec::with_capacity(data.len() * 3);
        self.decoder(codec, data)?.read_to_end(&mut out).map_err(|source| CompressError::Corrupt { codec: name.into(), source })?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    struct Reverse;
    impl CustomCodec for Reverse {
        fn compress(&self, d: &[u8], _: i32) -> Result<Vec<u8>, CompressError> {
            Ok(d.iter().rev().copied().collect())
        }
        fn decompress(&self, d: &[u8]) -> Result<Vec<u8>, CompressError> {
            Ok(d.iter().rev().copied().collect())
        }
    }

    proptest! {
        #[test]
        fn every_codec_round_trips_any_bytes(data in proptest::collection::vec(any::<u8>(), 0..5000), level in 1i32..10) {
            let mut e = Engine::new();
            e.register("rev", Arc::new(Reverse));
            for c in [Codec::Zstd, Codec::Gzip, Codec::Custom("rev".into())] {
                let z = e.compress(&c, level, &data).unwrap();
                prop_assert_eq!(e.decompress(&c, &z).unwrap(), data.clone());
            }
        }
    }

    #[test]
    fn streaming_equals_one_shot_and_corruption_is_reported() {
        let e = Engine::new();
        let text: Vec<u8> = (0..100_000u32).flat_map(|i| format!("line {i}\n").into_bytes()).collect();
        let mut enc = e.encoder(&Codec::Zstd, 3, Vec::new()).unwrap();
        for chunk in text.chunks(777) {
            enc.write_all(chunk).unwrap();
        }
        let z = enc.finish().unwrap();
        assert!(z.len() * 5 < text.len(), "{} vs {}", z.len(), text.len());
        assert_eq!(e.decompress(&Codec::Zstd, &z).unwrap(), text);
        let err = e.decompress(&Codec::Zstd, &z[..z.len() / 2]).unwrap_err();
        assert!(matches!(err, CompressError::Corrupt { .. }), "{err}");
        assert!(e.decompress(&Codec::Gzip, b"not gzip").is_err());
        assert!(matches!(e.compress(&Codec::Custom("nope".into()), 1, b"x"), Err(CompressError::UnknownCodec(_))));
        assert!(matches!(e.compress(&Codec::Zstd, 99, b"x"), Err(CompressError::BadLevel(99))));
    }
}
