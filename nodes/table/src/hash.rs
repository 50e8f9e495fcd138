//! The table's one hash: SipHash-2-4 with 128-bit output and zero keys,
//! as ClickHouse uses for block ids and part checksums. Zero keys, because
//! every replica and every retry must compute the same id for the same
//! bytes.

use siphasher::sip128::{Hasher128, SipHasher};
use std::hash::Hasher;

/// An incremental 128-bit hash.
pub struct Sip128(SipHasher);

impl Default for Sip128 {
    fn default() -> Self {
        Sip128(SipHasher::new_with_keys(0, 0))
    }
}

impl Sip128 {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }

    pub fn finish(&self) -> u128 {
        self.0.finish128().as_u128()
    }
}

pub fn sip128(bytes: &[u8]) -> u128 {
    let mut h = Sip128::default();
    h.update(bytes);
    h.finish()
}

#[cfg(test)]
mod tests {
    #[test]
    fn is_stable_and_incremental() {
        let mut h = super::Sip128::default();
        h.update(b"ab");
        h.update(b"c");
        assert_eq!(h.finish(), super::sip128(b"abc"));
        assert_ne!(super::sip128(b"abc"), super::sip128(b"abd"));
    }
}
