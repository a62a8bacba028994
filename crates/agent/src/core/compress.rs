//! Compression engine: zstd and gzip, streaming, plus named application codecs.
//!
//! Streaming matters because the agent compresses results while they are still being
//! produced (runtime output compression): [`Engine::encoder`] wraps any `Write`, so a
//! result can be compressed chunk by chunk straight into a file or a network buffer.
//! Applications with better knowledge of their data register a [`CustomCodec`] by name
//! and use it through the same engine (GePSeA's "hook for application-specific
//! compression").
//!
//! One-shot zstd ([`Engine::compress`], [`Engine::decompress`]) keeps one compression
//! and one decompression context per thread. A fresh context per call allocated and
//! cleared megabytes of tables each time: on the replayed 36-node cluster the agents'
//! job threads spent more CPU taking fresh pages from the kernel (page faults, pages
//! cleared) than compressing. The frame records its size, so the receiver decompresses
//! into one buffer of exactly that size, with no window buffer and no regrowth.

use std::cell::RefCell;
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
            Codec::Zstd => Ok(Encoder::Zstd(zstd::stream::write::Encoder::new(w, zstd_level(level)?)?)),
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
        if let Codec::Zstd = codec {
            return zstd_one_shot(level, data);
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
        let corrupt = |source| CompressError::Corrupt { codec: name.into(), source };
        if let Codec::Zstd = codec {
            // Anything the one shot does not take whole (several frames, a damaged
            // frame) goes through the stream below, which reports what is wrong.
            if let Some(out) = one_shot_size(data).and_then(|size| zstd_one_shot_decompress(data, size)) {
                return Ok(out);
            }
        }
        let mut out = Vec::with_capacity(data.len() * 3);
        self.decoder(codec, data)?.read_to_end(&mut out).map_err(corrupt)?;
        Ok(out)
    }
}

thread_local! {
    /// This thread's zstd contexts, kept between calls (the module's docs say why).
    static COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Frames up to this size are decompressed in one shot into a buffer of their stated
/// size; larger ones (or a corrupt header claiming so) stream, growing as bytes come.
const ONE_SHOT_MAX: u64 = 1 << 30;

/// `level` if zstd has it (1 to 22).
fn zstd_level(level: i32) -> Result<i32, CompressError> {
    if (1..=22).contains(&level) {
        Ok(level)
    } else {
        Err(CompressError::BadLevel(level))
    }
}

/// zstd at `level` with this thread's kept context: one frame that records its size.
fn zstd_one_shot(level: i32, data: &[u8]) -> Result<Vec<u8>, CompressError> {
    let level = zstd_level(level)?;
    COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        let c = match &mut *c {
            Some((kept, c)) => {
                if *kept != level {
                    c.set_compression_level(level)?;
                    *kept = level;
                }
                c
            }
            empty => &mut empty.insert((level, zstd::bulk::Compressor::new(level)?)).1,
        };
        Ok(c.compress(data)?)
    })
}

/// `data` decompressed with this thread's kept context into a buffer of `size`, if it
/// is one frame of exactly that content.
fn zstd_one_shot_decompress(data: &[u8], size: usize) -> Option<Vec<u8>> {
    DECOMPRESSOR.with(|d| {
        let mut d = d.borrow_mut();
        let d = match &mut *d {
            Some(d) => d,
            empty => empty.insert(zstd::bulk::Decompressor::new().ok()?),
        };
        d.decompress(data, size).ok().filter(|out| out.len() == size)
    })
}

/// The content size a single zstd frame states, if it states one small enough to
/// decompress in one shot.
fn one_shot_size(data: &[u8]) -> Option<usize> {
    match zstd::zstd_safe::get_frame_content_size(data) {
        Ok(Some(n)) if n <= ONE_SHOT_MAX => usize::try_from(n).ok(),
        _ => None,
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

    #[test]
    fn kept_zstd_contexts_follow_the_level_and_take_any_frames() {
        let e = Engine::new();
        let text: Vec<u8> = (0..50_000u32).flat_map(|i| format!("hit {} score {}\n", i % 977, i % 31).into_bytes()).collect();
        // The kept context switches level and back: the same bytes as a fresh context's.
        for level in [3, 19, 3, 1] {
            let z = e.compress(&Codec::Zstd, level, &text).unwrap();
            assert_eq!(z, zstd::bulk::compress(&text, level).unwrap(), "level {level}");
            assert_eq!(one_shot_size(&z), Some(text.len()), "the frame states its size");
            assert_eq!(e.decompress(&Codec::Zstd, &z).unwrap(), text);
        }
        // Two frames back to back are one stream's worth of data, not an error.
        let a = e.compress(&Codec::Zstd, 3, &text[..1000]).unwrap();
        let b = e.compress(&Codec::Zstd, 3, &text[1000..]).unwrap();
        assert_eq!(e.decompress(&Codec::Zstd, &[a.clone(), b].concat()).unwrap(), text);
        // A sized frame cut short is reported, not half-returned.
        let z = e.compress(&Codec::Zstd, 3, &text).unwrap();
        assert!(matches!(e.decompress(&Codec::Zstd, &z[..z.len() - 9]), Err(CompressError::Corrupt { .. })));
        // Empty input round-trips.
        let z = e.compress(&Codec::Zstd, 3, b"").unwrap();
        assert_eq!(e.decompress(&Codec::Zstd, &z).unwrap(), b"");
    }
}
