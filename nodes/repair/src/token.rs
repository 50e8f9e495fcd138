//! Tokens: where a key lives on the ring. token = murmur3_x86_32(key,
//! seed 0), in [0, 2^32).
//!
//! Slice-based rather than the `murmur3` crate's `Read`-based interface,
//! which measured 2.5–4× slower per key (`cargo bench -p drift-repair`,
//! "token/"); a test pins the output to the crate's bit for bit.

const C1: u32 = 0xcc9e_2d51;
const C2: u32 = 0x1b87_3593;

#[inline]
fn mix_k(k: u32) -> u32 {
    k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2)
}

#[inline]
pub(crate) fn fmix(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// murmur3_x86_32 of `data` with `seed`.
pub fn murmur3_32(data: &[u8], seed: u32) -> u32 {
    let mut h = seed;
    let mut blocks = data.chunks_exact(4);
    for b in &mut blocks {
        let k = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        h ^= mix_k(k);
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let mut k = 0u32;
        for (i, &byte) in tail.iter().enumerate() {
            k |= (byte as u32) << (8 * i);
        }
        h ^= mix_k(k);
    }
    fmix(h ^ data.len() as u32)
}

/// The token of a key.
#[inline]
pub fn token(key: &[u8]) -> u32 {
    murmur3_32(key, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        assert_eq!(murmur3_32(b"", 0), 0);
        assert_eq!(murmur3_32(b"", 1), 0x514e_28b7);
        assert_eq!(murmur3_32(b"hello", 0), 0x248b_fa47);
        assert_eq!(
            murmur3_32(b"The quick brown fox jumps over the lazy dog", 0),
            0x2e4f_f723
        );
    }
}
