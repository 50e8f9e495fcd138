//! Part names and the set of active parts.
//!
//! A part is named `<partition>_<min_block>_<max_block>_<level>`: the
//! block numbers it holds (inclusive) and how many merges made it (0 for
//! an insert). A part *contains* another of the same partition when its
//! range holds the other's and its level is at least the other's; a merge
//! of parts produces the part that contains them all.
//!
//! [`ActivePartSet`] keeps only maximal parts: adding a part removes the
//! parts it contains and is a no-op when a part already contains it. Two
//! parts that overlap without one containing the other cannot both be
//! active — that would be two histories of the same blocks — so adding
//! such a part is refused.

use crate::error::ParseError;
use crate::schema::valid_partition_id;
use std::collections::BTreeMap;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartInfo {
    pub partition: String,
    pub min_block: u64,
    pub max_block: u64,
    pub level: u32,
}

/// Highest level a part name may carry (ClickHouse caps merges' levels at
/// 999,999,999 too).
pub const LEVEL_MAX: u32 = 999_999_999;

impl PartInfo {
    pub fn new(partition: &str, min_block: u64, max_block: u64, level: u32) -> PartInfo {
        debug_assert!(min_block <= max_block);
        PartInfo {
            partition: partition.to_string(),
            min_block,
            max_block,
            level,
        }
    }

    /// Parses `<partition>_<min>_<max>_<level>`.
    pub fn parse(name: &str) -> Result<PartInfo, ParseError> {
        let bad = |why: &str| ParseError::new(format!("part name {name:?}"), why);
        let mut fields = name.rsplitn(4, '_');
        let (Some(level), Some(max), Some(min), Some(partition)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(bad("expected <partition>_<min>_<max>_<level>"));
        };
        let num = |s: &str, what: &str| -> Result<u64, ParseError> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0')) {
                return Err(bad(&format!("{what} {s:?} is not a number")));
            }
            s.parse::<u64>().map_err(|_| bad(&format!("{what} {s:?} is too large")))
        };
        let (min, max, level) = (num(min, "min block")?, num(max, "max block")?, num(level, "level")?);
        if !valid_partition_id(partition) {
            return Err(bad("bad partition id"));
        }
        if min > max {
            return Err(bad("min block above max block"));
        }
        if level > LEVEL_MAX as u64 {
            return Err(bad("level too high"));
        }
        Ok(PartInfo::new(partition, min, max, level as u32))
    }

    pub fn name(&self) -> String {
        self.to_string()
    }

    /// Whether `self` holds every block of `other` at an equal or later
    /// stage (a part contains itself).
    pub fn contains(&self, other: &PartInfo) -> bool {
        self.partition == other.partition
            && self.min_block <= other.min_block
            && self.max_block >= other.max_block
            && self.level >= other.level
    }

    /// Whether the block ranges share a number.
    pub fn overlaps(&self, other: &PartInfo) -> bool {
        self.partition == other.partition && self.min_block <= other.max_block && other.min_block <= self.max_block
    }

    /// The part a merge of `parts` (adjacent, same partition, in order)
    /// produces.
    pub fn merged(parts: &[PartInfo]) -> PartInfo {
        assert!(parts.len() >= 2, "a merge takes at least two parts");
        let first = &parts[0];
        let last = &parts[parts.len() - 1];
        assert!(parts.iter().all(|p| p.partition == first.partition));
        assert!(parts.windows(2).all(|w| w[0].max_block < w[1].min_block));
        let level = parts.iter().map(|p| p.level).max().unwrap_or(0) + 1;
        PartInfo::new(&first.partition, first.min_block, last.max_block, level.min(LEVEL_MAX))
    }
}

impl fmt::Display for PartInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}_{}_{}_{}",
            self.partition, self.min_block, self.max_block, self.level
        )
    }
}

/// What [`ActivePartSet::add`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Added {
    /// The part is now active; these parts it contains were removed.
    Active(Vec<PartInfo>),
    /// An active part already contains it.
    Covered(PartInfo),
}

/// Maximal parts, by partition and then by block range.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ActivePartSet {
    /// partition → min_block → part. Active parts of a partition do not
    /// overlap, so min_block identifies one.
    parts: BTreeMap<String, BTreeMap<u64, PartInfo>>,
}

impl ActivePartSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `part`, removing what it contains. Refuses a part that overlaps
    /// an active one without either containing the other.
    pub fn add(&mut self, part: PartInfo) -> Result<Added, String> {
        if let Some(c) = self.containing(&part) {
            return Ok(Added::Covered(c.clone()));
        }
        let in_partition = self.parts.entry(part.partition.clone()).or_default();
        let overlapping: Vec<PartInfo> = in_partition
            .range(..=part.max_block)
            .rev()
            .map(|(_, p)| p)
            .take_while(|p| p.max_block >= part.min_block)
            .cloned()
            .collect();
        if let Some(bad) = overlapping.iter().find(|p| !part.contains(p)) {
            return Err(format!(
                "part {part} intersects active part {bad} without containing it"
            ));
        }
        for p in &overlapping {
            in_partition.remove(&p.min_block);
        }
        in_partition.insert(part.min_block, part);
        let mut removed = overlapping;
        removed.reverse();
        Ok(Added::Active(removed))
    }

    /// Removes exactly `part`, if active.
    pub fn remove(&mut self, part: &PartInfo) -> bool {
        let Some(in_partition) = self.parts.get_mut(&part.partition) else {
            return false;
        };
        if in_partition.get(&part.min_block) != Some(part) {
            return false;
        }
        in_partition.remove(&part.min_block);
        if in_partition.is_empty() {
            self.parts.remove(&part.partition);
        }
        true
    }

    /// The active part that contains `part` (itself, if active).
    pub fn containing(&self, part: &PartInfo) -> Option<&PartInfo> {
        let in_partition = self.parts.get(&part.partition)?;
        let (_, p) = in_partition.range(..=part.min_block).next_back()?;
        p.contains(part).then_some(p)
    }

    /// Active parts that `part` contains.
    pub fn contained_by(&self, part: &PartInfo) -> Vec<PartInfo> {
        let Some(in_partition) = self.parts.get(&part.partition) else {
            return Vec::new();
        };
        in_partition
            .range(part.min_block..=part.max_block)
            .map(|(_, p)| p)
            .filter(|p| part.contains(p))
            .cloned()
            .collect()
    }

    pub fn contains_exactly(&self, part: &PartInfo) -> bool {
        self.parts
            .get(&part.partition)
            .and_then(|m| m.get(&part.min_block))
            .is_some_and(|p| p == part)
    }

    /// Every active part, by partition and block range.
    pub fn iter(&self) -> impl Iterator<Item = &PartInfo> {
        self.parts.values().flat_map(|m| m.values())
    }

    /// The active parts of one partition, in block order.
    pub fn in_partition<'a>(&'a self, partition: &str) -> impl Iterator<Item = &'a PartInfo> + 'a {
        self.parts.get(partition).into_iter().flat_map(|m| m.values())
    }

    pub fn partitions(&self) -> impl Iterator<Item = &String> {
        self.parts.keys()
    }

    pub fn len(&self) -> usize {
        self.parts.values().map(|m| m.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str) -> PartInfo {
        PartInfo::parse(name).unwrap()
    }

    #[test]
    fn names_round_trip_and_bad_names_say_why() {
        for n in ["all_0_0_0", "1_3_7_2", "-2_10_10_0", "0a1b_1_2_1"] {
            assert_eq!(p(n).name(), n);
        }
        for (n, why) in [
            ("all_0_0", "expected"),
            ("all_2_1_0", "min block above"),
            ("all_01_1_0", "not a number"),
            ("a_b_1_2_0", "bad partition"),
            ("all_1_2_x", "level"),
            ("all_0_0_1000000000", "level too high"),
        ] {
            let e = PartInfo::parse(n).unwrap_err();
            assert!(e.to_string().contains(why), "{n}: {e}");
        }
    }

    #[test]
    fn containment_needs_range_and_level() {
        assert!(p("1_0_5_1").contains(&p("1_2_3_0")));
        assert!(p("1_0_5_1").contains(&p("1_0_5_1")));
        assert!(!p("1_0_5_1").contains(&p("1_2_3_2")));
        assert!(!p("1_0_5_1").contains(&p("2_2_3_0")));
        assert!(!p("1_0_5_1").contains(&p("1_4_6_0")));
        assert_eq!(PartInfo::merged(&[p("1_0_0_0"), p("1_2_4_3")]), p("1_0_4_4"));
    }

    #[test]
    fn adding_a_covering_part_replaces_what_it_contains() {
        let mut s = ActivePartSet::new();
        for n in ["1_0_0_0", "1_1_1_0", "1_3_3_0", "2_0_0_0"] {
            assert_eq!(s.add(p(n)).unwrap(), Added::Active(vec![]));
        }
        assert_eq!(
            s.add(p("1_0_1_1")).unwrap(),
            Added::Active(vec![p("1_0_0_0"), p("1_1_1_0")])
        );
        assert_eq!(s.add(p("1_1_1_0")).unwrap(), Added::Covered(p("1_0_1_1")));
        assert!(s.add(p("1_1_3_1")).unwrap_err().contains("intersects"));
        let names: Vec<String> = s.iter().map(|p| p.name()).collect();
        assert_eq!(names, ["1_0_1_1", "1_3_3_0", "2_0_0_0"]);
        assert_eq!(s.containing(&p("1_1_1_0")), Some(&p("1_0_1_1")));
        assert_eq!(s.contained_by(&p("1_0_9_5")), vec![p("1_0_1_1"), p("1_3_3_0")]);
        assert!(s.remove(&p("1_3_3_0")));
        assert!(!s.remove(&p("1_3_3_0")));
        assert_eq!(s.len(), 2);
    }
}
