//! Helpers shared by the repair tests.
#![allow(dead_code)]

use drift_repair::session::{Report, SessionConfig, HASH_BYTES_DEFAULT};
use drift_repair::{Entry, Replica, TokenRange};

pub fn cfg(seed: u64, row_level: bool) -> SessionConfig {
    SessionConfig {
        seed,
        row_level,
        started_ts: 1_000,
        hash_bytes: HASH_BYTES_DEFAULT,
        set_reconciliation: false,
    }
}

pub fn repair(a: &mut Replica, b: &mut Replica, c: SessionConfig) -> Report {
    drift_repair::run(a, 1, b, 2, c).expect("session completes")
}

pub fn contents(r: &Replica) -> Vec<Entry> {
    r.entries().collect()
}

/// xorshift64*, for reproducible test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The reference scenario of Merkle repair: `n` keys on both replicas at ts 1, then `divergent`
/// distinct keys get a newer write on one side (alternating by chance).
pub fn reference_scenario(n: u32, divergent: usize, depth: u32, seed: u64) -> (Replica, Replica) {
    let mut a = Replica::new(TokenRange::FULL, depth);
    let mut b = Replica::new(TokenRange::FULL, depth);
    for i in 0..n {
        let e = Entry::put(format!("key{i}").as_bytes(), 1, format!("value{i}").as_bytes());
        a.merge(e.clone());
        b.merge(e);
    }
    let mut rng = Rng(seed);
    let mut chosen = std::collections::BTreeSet::new();
    while chosen.len() < divergent {
        chosen.insert(rng.next() % n as u64);
    }
    for i in chosen {
        let e = Entry::put(format!("key{i}").as_bytes(), 2, b"newer");
        if rng.next() & 1 == 0 {
            a.merge(e);
        } else {
            b.merge(e);
        }
    }
    (a, b)
}

// murmur3_x86_32 run backwards, to make keys with chosen tokens.

const C1: u32 = 0xcc9e_2d51;
const C2: u32 = 0x1b87_3593;

fn inverse(odd: u32) -> u32 {
    // Newton's iteration for the inverse modulo 2^32
    let mut x = odd;
    for _ in 0..5 {
        x = x.wrapping_mul(2u32.wrapping_sub(odd.wrapping_mul(x)));
    }
    x
}

fn unxorshift(mut h: u32, s: u32) -> u32 {
    let mut r = h;
    for _ in 0..(32 / s) {
        h >>= s;
        r ^= h;
    }
    r
}

fn fmix_inverse(mut h: u32) -> u32 {
    h = unxorshift(h, 16);
    h = h.wrapping_mul(inverse(0xc2b2_ae35));
    h = unxorshift(h, 13);
    h = h.wrapping_mul(inverse(0x85eb_ca6b));
    unxorshift(h, 16)
}

fn mix_k(k: u32) -> u32 {
    k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2)
}

fn mix_k_inverse(k: u32) -> u32 {
    k.wrapping_mul(inverse(C2)).rotate_right(15).wrapping_mul(inverse(C1))
}

/// An 8-byte key `prefix ‖ x` whose token is `target`.
pub fn key_with_token(prefix: u32, target: u32) -> Vec<u8> {
    // forward through the first block
    let mut h = mix_k(prefix); // seed 0 xor the mixed block
    h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    // backwards from the target to the state before the second block
    let mut t = fmix_inverse(target) ^ 8;
    t = t.wrapping_sub(0xe654_6b64).wrapping_mul(inverse(5)).rotate_right(13);
    let k2 = mix_k_inverse(t ^ h);
    let mut key = prefix.to_le_bytes().to_vec();
    key.extend_from_slice(&k2.to_le_bytes());
    assert_eq!(drift_repair::token::token(&key), target, "inverse murmur3 is wrong");
    key
}
