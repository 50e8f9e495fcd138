//! Insert deduplication: block ids and the window that bounds them.
//!
//! A block's id is `<partition>_<hi>_<lo>` where hi/lo are the halves of a
//! SipHash-128, taken over the block's part checksums or, with an
//! `insert_deduplication_token`, over `<token>_<n>` (n the block's ordinal
//! in its insert). The id names a znode under `blocks/` holding the part
//! that first committed it; an insert whose id exists is dropped and
//! answered as a success.
//!
//! The window: only the leader removes ids, on its cleanup period. It keeps
//! the newest `replicated_deduplication_window` ids that are also no older
//! than `replicated_deduplication_window_seconds` before the *newest* id —
//! not the wall clock. So the window is a lower bound (an id may live past
//! it until the next cleanup), and a table nobody writes to keeps its
//! newest ids for ever.

use crate::format::Checksums;
use crate::hash::sip128;

fn id(partition: &str, hash: u128) -> String {
    format!("{partition}_{}_{}", (hash >> 64) as u64, hash as u64)
}

/// The id of a block from its content.
pub fn block_id(partition: &str, sums: &Checksums) -> String {
    id(partition, sums.content_hash())
}

/// The id of the `ordinal`-th block (from 0) of an insert with a token.
pub fn token_block_id(partition: &str, token: &str, ordinal: usize) -> String {
    id(partition, sip128(format!("{token}_{ordinal}").as_bytes()))
}

/// The partition a block id belongs to.
pub fn partition_of(block_id: &str) -> Option<&str> {
    let mut it = block_id.rsplitn(3, '_');
    let (_, _, p) = (it.next()?, it.next()?, it.next()?);
    Some(p)
}

/// Which block ids a cleanup removes, given every id with its creation
/// time (ms since the epoch, as the coordinator stamps it): all but the
/// newest `window` ids that are at most `window_seconds` older than the
/// newest one. Ties in time are broken by name, so every leader chooses
/// the same ids.
pub fn block_ids_to_remove(blocks: &[(String, i64)], window: u64, window_seconds: u64) -> Vec<String> {
    let mut by_age: Vec<&(String, i64)> = blocks.iter().collect();
    by_age.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    let Some(newest) = by_age.first().map(|b| b.1) else {
        return Vec::new();
    };
    let oldest_kept = newest.saturating_sub(window_seconds.saturating_mul(1000).min(i64::MAX as u64) as i64);
    let kept = by_age
        .iter()
        .take(window.min(usize::MAX as u64) as usize)
        .take_while(|b| b.1 >= oldest_kept)
        .count();
    let mut out: Vec<String> = by_age[kept..].iter().map(|b| b.0.clone()).collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[(&str, i64)]) -> Vec<(String, i64)> {
        v.iter().map(|(n, t)| (n.to_string(), *t)).collect()
    }

    #[test]
    fn ids_name_their_partition() {
        let t = token_block_id("202", "tok", 0);
        assert_eq!(partition_of(&t), Some("202"));
        assert_ne!(t, token_block_id("202", "tok", 1));
        assert_ne!(t, token_block_id("203", "tok", 0));
        assert_eq!(partition_of("-1_5_6"), Some("-1"));
    }

    #[test]
    fn the_window_keeps_the_newest_by_count_and_by_age_from_the_newest() {
        let b = ids(&[("a", 1_000), ("b", 2_000), ("c", 3_000), ("d", 10_000)]);
        // by count
        assert_eq!(block_ids_to_remove(&b, 2, 1_000_000), ["a", "b"]);
        // by age: 5 s before the newest (10 s) keeps only d
        assert_eq!(block_ids_to_remove(&b, 100, 5), ["a", "b", "c"]);
        // the idle rule: however old, the newest stays
        assert_eq!(block_ids_to_remove(&b, 100, 0), ["a", "b", "c"]);
        assert!(block_ids_to_remove(&[], 1, 1).is_empty());
        // ties broken by name, the same on every leader
        let t = ids(&[("x", 5), ("y", 5), ("z", 5)]);
        assert_eq!(block_ids_to_remove(&t, 1, 100), ["x", "y"]);
    }
}
