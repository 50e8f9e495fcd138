//! The quorum znode's content: which part waits for how many replicas, and
//! which replicas hold it so far. The writer creates it in its commit
//! multi naming itself; each replica that fetches the part adds itself in
//! the same multi that records the part; the one that completes the count
//! deletes the znode, which is what the writer waits for.
//!
//! ```text
//! version: 1
//! part_name: 1_7_7_0
//! required_number_of_replicas: 2
//! actual_number_of_replicas: 1
//! replicas:
//! r1
//! ```

use crate::error::ParseError;
use crate::part::PartInfo;
use crate::schema::valid_name;
use std::collections::BTreeSet;

/// Most replicas a quorum entry may list.
pub const QUORUM_REPLICAS_MAX: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuorumEntry {
    pub part: PartInfo,
    pub required: u32,
    pub replicas: BTreeSet<String>,
}

impl QuorumEntry {
    pub fn new(part: PartInfo, required: u32, writer: &str) -> QuorumEntry {
        QuorumEntry {
            part,
            required,
            replicas: BTreeSet::from([writer.to_string()]),
        }
    }

    pub fn is_reached(&self) -> bool {
        self.replicas.len() as u32 >= self.required
    }

    pub fn encode(&self) -> String {
        let mut s = format!(
            "version: 1\npart_name: {}\nrequired_number_of_replicas: {}\nactual_number_of_replicas: {}\nreplicas:\n",
            self.part,
            self.required,
            self.replicas.len()
        );
        for r in &self.replicas {
            s.push_str(r);
            s.push('\n');
        }
        s
    }

    pub fn decode(text: &str) -> Result<QuorumEntry, ParseError> {
        let bad = |why: String| ParseError::new("quorum entry", why);
        let mut lines = text.lines();
        let mut field = |key: &str| -> Result<String, ParseError> {
            lines
                .next()
                .and_then(|l| l.strip_prefix(key))
                .and_then(|l| l.strip_prefix(": "))
                .map(str::to_string)
                .ok_or_else(|| bad(format!("expected `{key}: …`")))
        };
        if field("version")? != "1" {
            return Err(bad("unknown version".into()));
        }
        let part = PartInfo::parse(&field("part_name")?).map_err(|e| bad(e.to_string()))?;
        let required: u32 = field("required_number_of_replicas")?
            .parse()
            .map_err(|_| bad("bad required_number_of_replicas".into()))?;
        let actual: usize = field("actual_number_of_replicas")?
            .parse()
            .map_err(|_| bad("bad actual_number_of_replicas".into()))?;
        if lines.next() != Some("replicas:") {
            return Err(bad("expected `replicas:`".into()));
        }
        let mut replicas = BTreeSet::new();
        for r in lines {
            if !valid_name(r) || replicas.len() == QUORUM_REPLICAS_MAX {
                return Err(bad(format!("bad replica {r:?}")));
            }
            replicas.insert(r.to_string());
        }
        if replicas.len() != actual || required == 0 {
            return Err(bad("counts do not match".into()));
        }
        Ok(QuorumEntry {
            part,
            required,
            replicas,
        })
    }
}

/// The quorum an insert asks for: `insert_quorum` N (1 means none, as in
/// ClickHouse) or `auto` (a majority of the replicas).
pub fn required_replicas(setting: Option<u32>, auto: bool, total_replicas: u32) -> u32 {
    if auto {
        total_replicas / 2 + 1
    } else {
        setting.unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_counts() {
        let mut q = QuorumEntry::new(PartInfo::parse("1_7_7_0").unwrap(), 2, "r1");
        assert!(!q.is_reached());
        assert_eq!(QuorumEntry::decode(&q.encode()).unwrap(), q);
        q.replicas.insert("r3".into());
        assert!(q.is_reached());
        assert_eq!(QuorumEntry::decode(&q.encode()).unwrap(), q);
        let bad = q
            .encode()
            .replace("actual_number_of_replicas: 2", "actual_number_of_replicas: 3");
        assert!(QuorumEntry::decode(&bad).unwrap_err().to_string().contains("counts"));
        assert_eq!(required_replicas(None, true, 3), 2);
        assert_eq!(required_replicas(Some(3), false, 3), 3);
    }
}
