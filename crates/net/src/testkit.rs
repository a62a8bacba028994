//! Deterministic message contents for tests and benchmarks: both ends can generate
//! and check the bytes of message `seed` without shipping a reference copy.

/// `len` bytes that depend on `seed` and on every position (so a shifted, truncated or
/// swapped message never verifies).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Index of the first byte that differs from `pattern(seed, data.len())`.
pub fn first_mismatch(seed: u64, data: &[u8]) -> Option<usize> {
    pattern(seed, data.len()).iter().zip(data).position(|(a, b)| a != b)
}

/// FNV-1a over `b`: a cheap fingerprint two processes can compare.
pub fn fingerprint(b: &[u8]) -> u32 {
    b.iter().fold(0x811c_9dc5u32, |h, &x| (h ^ x as u32).wrapping_mul(16_777_619))
}
