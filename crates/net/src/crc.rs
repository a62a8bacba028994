//! CRC32C (Castagnoli), the checksum of every header and of every payload on plain
//! connections (encrypted ones leave payloads to their records' tags), and the one part
//! of a large TCP transfer that costs as much as the kernel's copies.
//!
//! `crc-fast` folds with carry-less multiplies, chosen at run time: on a CPU with
//! AVX-512 and VPCLMULQDQ (the Intel guests of earlier sessions) it checksums 1 MiB in
//! ≈16 µs, and it is used as it is there. Without AVX-512 it falls back to 128-bit
//! folds mixed with the `crc32` instruction, which on the AMD EPYC (Zen 3) guests runs
//! at 13–17 GB/s: 60–80 µs per MiB, on each side of every message. A 1 MiB ping-pong
//! on loopback with the payload checksums skipped (a throwaway build, both processes
//! pinned, 6 alternated rounds) took 176–326 µs one way against 353–512 µs: the
//! checksums were about half of it.
//!
//! Those CPUs have VPCLMULQDQ on 256-bit registers, and their carry-less multiplier and
//! the `crc32` instruction run on different units. So each block of [`x86::BLOCK`] bytes
//! is split in four: the first part is folded 256 bytes at a time in eight 256-bit
//! accumulators while three streams of `crc32` instructions run through the other
//! three parts in the same loop; the four results are joined by shifting each by the
//! length after it (one carry-less multiply and one `crc32` each); what is shorter
//! than a block goes through the `crc32` streams of the `crc32c` crate, and input under
//! 1 KiB (headers) through `crc-fast`, which is as fast there. Measured on the
//! Zen 3 guest, 1 MiB: 31–33 µs in cache (`crc-fast` 56–80, the `crc32c` crate's
//! three-way `crc32` loop 44–70), 41–53 µs from the last-level cache. The split of a
//! block (256 bytes folded to 3 × 88 through `crc32` per step) was the fastest of
//! 64 to 128 bytes per stream.
//!
//! The folding constants are `x^n mod P` computed at compile time: for moving a
//! 128-bit lane forward by `d` bits, the bit-reflected `x^(d+32)` and `x^(d-32)`
//! shifted left by one (the usual reflected-CRC folding of Intel's "Fast CRC
//! Computation for Generic Polynomials Using PCLMULQDQ"); for shifting a CRC by `n`
//! bytes, the bit-reflected `x^(8n-33)`, multiplied and reduced by the `crc32`
//! instruction. The tests check every path against two independent implementations.

/// The CRC32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    append(0, bytes)
}

/// The CRC32C of the bytes whose CRC32C is `crc` followed by `bytes`: a checksum
/// computed piece by piece as a message arrives.
pub fn append(crc: u32, bytes: &[u8]) -> u32 {
    // Below 1 KiB (headers, small messages) `crc-fast` is as fast as any here (84 B:
    // 4–6 GB/s, within a few ns of the `crc32c` crate).
    #[cfg(target_arch = "x86_64")]
    if bytes.len() >= 1024 && x86::usable() {
        // SAFETY: `usable()` has checked that this CPU has every feature `x86::append`
        // is compiled for.
        return unsafe { x86::append(crc, bytes) };
    }
    generic(crc, bytes)
}

/// `crc-fast`, resumed from `crc` (its register holds the complement of a finished CRC).
fn generic(crc: u32, bytes: &[u8]) -> u32 {
    if crc == 0 {
        return crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32;
    }
    let mut d = crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(bytes);
    d.finalize() as u32
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Steps of a block: each step folds 256 bytes and runs each `crc32` stream over
    /// [`WORDS`] words.
    const STEPS: usize = 32;
    /// 8-byte words per `crc32` stream and step.
    const WORDS: usize = 11;
    /// The bytes of a block (16,640): a folded part of 256 bytes per step and three
    /// `crc32` streams of `8 × WORDS` bytes per step. Shorter input, and what is left
    /// after the blocks, goes through the `crc32c` crate's three `crc32` streams, which
    /// here are faster than `crc-fast` from 1 KiB up (from 8 MiB of data in the
    /// last-level cache, GB/s: 2 KiB 11–12 against 5–10, 64 KiB 17–18 against 11–13)
    /// and than blocks of this loop shorter than this (its final folds and shifts cost
    /// a fixed ≈60 cycles: blocks of 2 KiB ran at 7–9 GB/s).
    pub const BLOCK: usize = FOLDED + 3 * STREAM;
    /// The folded part of a block.
    const FOLDED: usize = 256 * STEPS;
    /// Each `crc32` stream's part of a block.
    const STREAM: usize = 8 * WORDS * STEPS;

    /// The CRC32C polynomial, normal (unreflected) form.
    const POLY: u32 = 0x1EDC_6F41;

    /// `x^n mod P`, normal form.
    const fn x_pow_mod(n: u32) -> u32 {
        let mut r: u32 = 1;
        let mut i = 0;
        while i < n {
            let carry = r & 0x8000_0000 != 0;
            r <<= 1;
            if carry {
                r ^= POLY;
            }
            i += 1;
        }
        r
    }

    /// The pair of constants that moves a 128-bit lane forward by `bits`.
    const fn fold_by(bits: u32) -> (i64, i64) {
        let lo = (x_pow_mod(bits + 32).reverse_bits() as u64) << 1;
        let hi = (x_pow_mod(bits - 32).reverse_bits() as u64) << 1;
        (lo as i64, hi as i64)
    }

    const BY_2048: (i64, i64) = fold_by(2048);
    const BY_1024: (i64, i64) = fold_by(1024);
    const BY_512: (i64, i64) = fold_by(512);
    const BY_256: (i64, i64) = fold_by(256);
    const BY_128: (i64, i64) = fold_by(128);

    /// The constant that shifts a CRC register past `bytes` bytes.
    const fn shift_past(bytes: usize) -> i64 {
        x_pow_mod(8 * bytes as u32 - 33).reverse_bits() as i64
    }
    /// Shifts a CRC register past one stream's part of a block.
    const PAST_STREAM: i64 = shift_past(STREAM);

    /// Whether this CPU runs [`append`], and is better off with it: with AVX-512 and
    /// VPCLMULQDQ, `crc-fast`'s 512-bit folds are faster.
    pub fn usable() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("vpclmulqdq")
            && is_x86_feature_detected!("pclmulqdq")
            && is_x86_feature_detected!("sse4.2")
            && !is_x86_feature_detected!("avx512vl")
    }

    /// [`super::append`] over whole blocks, the rest by the `crc32c` crate.
    ///
    /// # Safety
    /// The CPU must have AVX2, VPCLMULQDQ, PCLMULQDQ and SSE4.2 ([`usable`]).
    #[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
    pub unsafe fn append(crc: u32, bytes: &[u8]) -> u32 {
        let mut register = !crc;
        let mut blocks = bytes.chunks_exact(BLOCK);
        for b in &mut blocks {
            // SAFETY: `b` is one block; the features are the caller's promise,
            // repeated by this function's own.
            register = unsafe { block(register, b) };
        }
        crc32c::crc32c_append(!register, blocks.remainder())
    }

    /// Runs the CRC register `register` through one block.
    ///
    /// # Safety
    /// `b.len() == BLOCK`, and the CPU has the features [`append`] needs.
    #[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
    unsafe fn block(register: u32, b: &[u8]) -> u32 {
        assert_eq!(b.len(), BLOCK);
        let p = b.as_ptr();
        // SAFETY (every load below): the offsets stay inside the block (length checked
        // above). The folded part's loads are at 256 × step + 32 × i + 0..32 ≤ FOLDED; a
        // stream's at FOLDED + s × STREAM + 8 × (WORDS × step + j) + 0..8 ≤ BLOCK.
        // Unaligned loads are used throughout.
        let vec = |at: usize| unsafe { _mm256_loadu_si256(p.add(at).cast::<__m256i>()) };
        let word = |at: usize| unsafe { p.add(at).cast::<u64>().read_unaligned() };
        let mut acc: [__m256i; 8] = std::array::from_fn(|i| vec(32 * i));
        // The register enters as if it were XORed into the block's first 4 bytes.
        acc[0] = _mm256_xor_si256(acc[0], _mm256_setr_epi32(register as i32, 0, 0, 0, 0, 0, 0, 0));
        let k = both_lanes(BY_2048);
        let streams = [FOLDED, FOLDED + STREAM, FOLDED + 2 * STREAM];
        let mut regs = [0u64; 3];
        for step in 0..STEPS {
            if step > 0 {
                for (i, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_xor_si256(fold(*a, k), vec(256 * step + 32 * i));
                }
            }
            for j in 0..WORDS {
                let at = 8 * (WORDS * step + j);
                for (r, s) in regs.iter_mut().zip(streams) {
                    *r = _mm_crc32_u64(*r, word(s + at));
                }
            }
        }
        let mut register = reduce(acc);
        for r in regs {
            register = shift(register, PAST_STREAM) ^ r as u32;
        }
        register
    }

    /// Folds both 128-bit lanes of `acc` forward by the distance of `k`.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq")]
    fn fold(acc: __m256i, k: __m256i) -> __m256i {
        _mm256_xor_si256(_mm256_clmulepi64_epi128(acc, k, 0x00), _mm256_clmulepi64_epi128(acc, k, 0x11))
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn both_lanes(k: (i64, i64)) -> __m256i {
        _mm256_setr_epi64x(k.0, k.1, k.0, k.1)
    }

    /// The register after the folded part: its 256 bytes of accumulators folded into
    /// 16, which the `crc32` instruction then takes from a zero register.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
    fn reduce(mut acc: [__m256i; 8]) -> u32 {
        let k = both_lanes(BY_1024);
        for i in 0..4 {
            acc[i + 4] = _mm256_xor_si256(fold(acc[i], k), acc[i + 4]);
        }
        let k = both_lanes(BY_512);
        for i in 4..6 {
            acc[i + 2] = _mm256_xor_si256(fold(acc[i], k), acc[i + 2]);
        }
        let one = _mm256_xor_si256(fold(acc[6], both_lanes(BY_256)), acc[7]);
        let k = _mm_set_epi64x(BY_128.1, BY_128.0);
        let first = _mm256_castsi256_si128(one);
        let folded = _mm_xor_si128(_mm_clmulepi64_si128(first, k, 0x00), _mm_clmulepi64_si128(first, k, 0x11));
        let last = _mm_xor_si128(folded, _mm256_extracti128_si256(one, 1));
        let r = _mm_crc32_u64(0, _mm_cvtsi128_si64(last) as u64);
        _mm_crc32_u64(r, _mm_extract_epi64(last, 1) as u64) as u32
    }

    /// The register `register` run through as many zero bytes as `past` shifts by
    /// ([`shift_past`]).
    #[inline]
    #[target_feature(enable = "pclmulqdq,sse4.2")]
    fn shift(register: u32, past: i64) -> u32 {
        let product = _mm_clmulepi64_si128(_mm_cvtsi32_si128(register as i32), _mm_cvtsi64_si128(past), 0x00);
        _mm_crc32_u64(0, _mm_cvtsi128_si64(product) as u64) as u32
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn shifting_past_n_bytes_is_running_through_as_many_zeros() {
            if !usable() {
                return;
            }
            for bytes in [STREAM, 8 * WORDS, 100] {
                for register in [0u32, 1, 0x8000_0000, 0xdead_beef, u32::MAX] {
                    let zeros = crc32c::crc32c_append(!register, &vec![0u8; bytes]);
                    // SAFETY: `usable()` checked the features.
                    assert_eq!(unsafe { shift(register, shift_past(bytes)) }, !zeros, "register {register:#x}, {bytes} bytes");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Lengths around every boundary of the paths (the 1 KiB below which `crc-fast`
    /// takes everything, the x86 block), checked against the `crc32c` crate and, whole,
    /// against `crc-fast`; and resumed from every cut around them.
    #[test]
    fn agrees_with_two_independent_implementations_at_the_block_boundaries() {
        let (small, block) = (1_024, 16_640);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(block, x86::BLOCK);
        let data: Vec<u8> = (0..3 * block + 3 * small).map(|i| (i * 131 + 7) as u8).collect();
        let lens = [0, 1, 84, small - 1, small, small + 1, 4096, block - 1, block, block + 1, block + small, 2 * block + 999];
        for len in lens.into_iter().chain([3 * block + 3 * small]) {
            let d = &data[..len];
            let want = crc32c::crc32c(d);
            assert_eq!(crc32c(d), want, "length {len}");
            assert_eq!(crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, d) as u32, want, "length {len}");
            for cut in [1, len / 3, len.saturating_sub(block), len.saturating_sub(small), len.saturating_sub(small + 1)] {
                let cut = cut.min(len);
                assert_eq!(append(crc32c(&d[..cut]), &d[cut..]), want, "length {len} cut at {cut}");
            }
        }
    }

    /// `crc-fast` resumed from a finished CRC (the path of CPUs without VPCLMULQDQ or
    /// with AVX-512), whatever this CPU takes.
    #[test]
    fn crc_fast_resumes_from_a_finished_checksum() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for cut in [0, 1, 84, 1_024, 16_640, 69_999, 70_000] {
            assert_eq!(generic(generic(0, &data[..cut]), &data[cut..]), crc32c::crc32c(&data), "cut at {cut}");
        }
    }

    proptest! {
        #[test]
        fn pieces_appended_give_the_checksum_of_the_whole(data in proptest::collection::vec(any::<u8>(), 0..60_000), cuts in proptest::collection::vec(0usize..60_000, 0..4)) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.sort_unstable();
            let mut crc = 0;
            let mut from = 0;
            for c in cuts.into_iter().chain([data.len()]) {
                crc = append(crc, &data[from..c]);
                from = c;
            }
            prop_assert_eq!(crc, crc32c::crc32c(&data));
        }
    }
}
