//! The shared log's entries, as text.
//!
//! Every replica reads every entry, and during an upgrade replicas of two
//! versions share one log, so an entry is versioned text in ClickHouse's
//! shape: a header of `key: value` lines, the entry type on a line of its
//! own, its parts, then optional `key: value` lines. A reader skips
//! trailing lines it does not know; a version it does not know, or a body
//! it cannot read, is an error naming the line.
//!
//! ```text
//! format version: 4
//! create_time: 2026-12-01 09:30:00
//! source replica: r1
//! block_id: 1_1234_5678
//! get
//! 1_7_7_0
//! quorum: 2
//! ```

use crate::error::ParseError;
use crate::part::PartInfo;
use crate::schema::valid_name;

/// The format version this code writes; it reads 4 and below.
pub const FORMAT_VERSION: u32 = 4;
/// Most parts one merge entry names (also bounds what a reader accepts).
pub const MERGE_PARTS_MAX: usize = 1000;
/// Longest entry text a reader accepts.
pub const ENTRY_BYTES_MAX: usize = 256 * 1024;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A part an insert committed: fetch it from a replica that has it.
    GetPart {
        part: PartInfo,
        block_id: Option<String>,
        /// Replicas that must hold the part before the insert is
        /// acknowledged (0: no quorum).
        quorum: u32,
    },
    /// Merge `parts` (adjacent, in block order) into `into`.
    MergeParts { parts: Vec<PartInfo>, into: PartInfo },
    /// Remove every part `range` contains.
    DropRange { range: PartInfo },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// Seconds since the epoch, as the writing replica's clock read it
    /// (information only: nothing orders by it).
    pub create_time_s: i64,
    pub source_replica: String,
    pub kind: EntryKind,
}

impl LogEntry {
    /// The part the replica will hold once the entry is done.
    pub fn new_part(&self) -> &PartInfo {
        match &self.kind {
            EntryKind::GetPart { part, .. } => part,
            EntryKind::MergeParts { into, .. } => into,
            EntryKind::DropRange { range } => range,
        }
    }

    /// ClickHouse's name for the entry type (`system.replication_queue`).
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            EntryKind::GetPart { .. } => "GET_PART",
            EntryKind::MergeParts { .. } => "MERGE_PARTS",
            EntryKind::DropRange { .. } => "DROP_RANGE",
        }
    }

    pub fn encode(&self) -> String {
        let block_id = match &self.kind {
            EntryKind::GetPart { block_id: Some(id), .. } => id.as_str(),
            _ => "",
        };
        let mut s = format!(
            "format version: {FORMAT_VERSION}\ncreate_time: {}\nsource replica: {}\nblock_id: {block_id}\n",
            format_time(self.create_time_s),
            self.source_replica
        );
        match &self.kind {
            EntryKind::GetPart { part, quorum, .. } => {
                s.push_str(&format!("get\n{part}\n"));
                if *quorum > 0 {
                    s.push_str(&format!("quorum: {quorum}\n"));
                }
            }
            EntryKind::MergeParts { parts, into } => {
                s.push_str("merge\n");
                for p in parts {
                    s.push_str(&format!("{p}\n"));
                }
                s.push_str(&format!("into\n{into}\n"));
            }
            EntryKind::DropRange { range } => s.push_str(&format!("drop\n{range}\n")),
        }
        s
    }

    pub fn decode(text: &str) -> Result<LogEntry, ParseError> {
        let bad = |why: String| ParseError::new("log entry", why);
        if text.len() > ENTRY_BYTES_MAX {
            return Err(bad(format!("of {} bytes (most {ENTRY_BYTES_MAX})", text.len())));
        }
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
        let mut next = |want: &str| -> Result<(usize, &str), ParseError> {
            lines.next().ok_or_else(|| bad(format!("ends before {want}")))
        };
        let header = |(n, line): (usize, &str), key: &str| -> Result<String, ParseError> {
            line.strip_prefix(key)
                .and_then(|r| r.strip_prefix(": ").or(if r == ":" { Some("") } else { None }))
                .map(str::to_string)
                .ok_or_else(|| bad(format!("line {n}: expected `{key}: …`, got {line:?}")))
        };
        let version_line = next("the format version")?;
        let version: u32 = header(version_line, "format version")?
            .parse()
            .map_err(|_| bad(format!("line 1: bad format version {:?}", version_line.1)))?;
        if !(1..=FORMAT_VERSION).contains(&version) {
            return Err(bad(format!(
                "line 1: format version {version} is newer than this replica reads ({FORMAT_VERSION})"
            )));
        }
        let time_line = next("create_time")?;
        let create_time_s = parse_time(&header(time_line, "create_time")?)
            .ok_or_else(|| bad(format!("line {}: bad create_time", time_line.0)))?;
        let source_replica = header(next("source replica")?, "source replica")?;
        if !valid_name(&source_replica) {
            return Err(bad(format!("bad source replica {source_replica:?}")));
        }
        let block_id = header(next("block_id")?, "block_id")?;
        if !block_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(bad(format!("bad block_id {block_id:?}")));
        }
        let part = |(n, line): (usize, &str)| PartInfo::parse(line).map_err(|e| bad(format!("line {n}: {e}")));
        let (n, ty) = next("the entry type")?;
        let kind = match ty {
            "get" => {
                let part = part(next("the part name")?)?;
                let mut quorum = 0;
                for (n, line) in lines.by_ref() {
                    if let Some(q) = line.strip_prefix("quorum: ") {
                        quorum = q.parse().map_err(|_| bad(format!("line {n}: bad quorum {q:?}")))?;
                    }
                }
                EntryKind::GetPart {
                    part,
                    block_id: (!block_id.is_empty()).then_some(block_id),
                    quorum,
                }
            }
            "merge" => {
                let mut parts = Vec::new();
                loop {
                    let l = next("`into`")?;
                    if l.1 == "into" {
                        break;
                    }
                    if parts.len() == MERGE_PARTS_MAX {
                        return Err(bad(format!("a merge of more than {MERGE_PARTS_MAX} parts")));
                    }
                    parts.push(part(l)?);
                }
                let into = part(next("the merged part")?)?;
                if parts.len() < 2 || PartInfo::merged_checked(&parts).as_ref() != Some(&into) {
                    return Err(bad(format!("merge into {into} of parts that do not make it")));
                }
                EntryKind::MergeParts { parts, into }
            }
            "drop" => EntryKind::DropRange {
                range: part(next("the range")?)?,
            },
            other => return Err(bad(format!("line {n}: unknown entry type {other:?}"))),
        };
        Ok(LogEntry {
            create_time_s,
            source_replica,
            kind,
        })
    }
}

impl PartInfo {
    /// [`PartInfo::merged`] for untrusted input: `None` where the parts are
    /// not adjacent parts of one partition in order.
    pub fn merged_checked(parts: &[PartInfo]) -> Option<PartInfo> {
        let ok = parts.len() >= 2
            && parts.iter().all(|p| p.partition == parts[0].partition)
            && parts.windows(2).all(|w| w[0].max_block < w[1].min_block);
        ok.then(|| PartInfo::merged(parts))
    }
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 } as i64;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD hh:mm:ss`, UTC.
pub fn format_time(s: i64) -> String {
    let (y, mo, d) = civil_from_days(s.div_euclid(86_400));
    let t = s.rem_euclid(86_400);
    format!("{y:04}-{mo:02}-{d:02} {:02}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
}

pub fn parse_time(t: &str) -> Option<i64> {
    let b = t.as_bytes();
    if b.len() != 19 || b[4] != b'-' || b[7] != b'-' || b[10] != b' ' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let n = |r: std::ops::Range<usize>| t.get(r)?.parse::<u32>().ok();
    let (y, mo, d, h, mi, s) = (n(0..4)?, n(5..7)?, n(8..10)?, n(11..13)?, n(14..16)?, n(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 59 {
        return None;
    }
    Some(days_from_civil(y as i64, mo, d) * 86_400 + (h * 3600 + mi * 60 + s) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(n: &str) -> PartInfo {
        PartInfo::parse(n).unwrap()
    }

    #[test]
    fn time_formats_as_clickhouse_writes_it() {
        assert_eq!(format_time(0), "1970-01-01 00:00:00");
        assert_eq!(format_time(1_796_083_200 + 9 * 3600 + 30 * 60), "2026-12-01 09:30:00");
        for s in [0, 951_782_400, 1_796_083_200, 4_102_444_799] {
            assert_eq!(parse_time(&format_time(s)), Some(s));
        }
        assert_eq!(parse_time("2026-13-01 00:00:00"), None);
    }

    #[test]
    fn entries_round_trip_and_skip_unknown_trailing_lines() {
        let e = LogEntry {
            create_time_s: 1_796_083_200,
            source_replica: "r1".into(),
            kind: EntryKind::GetPart {
                part: p("1_7_7_0"),
                block_id: Some("1_12_34".into()),
                quorum: 2,
            },
        };
        let text = e.encode();
        assert_eq!(
            text,
            "format version: 4\ncreate_time: 2026-12-01 00:00:00\nsource replica: r1\nblock_id: 1_12_34\nget\n1_7_7_0\nquorum: 2\n"
        );
        assert_eq!(LogEntry::decode(&text).unwrap(), e);
        assert_eq!(LogEntry::decode(&format!("{text}part_type: Wide\n")).unwrap(), e);
        let m = LogEntry {
            create_time_s: 5,
            source_replica: "r2".into(),
            kind: EntryKind::MergeParts {
                parts: vec![p("1_0_0_0"), p("1_2_3_1")],
                into: p("1_0_3_2"),
            },
        };
        assert_eq!(LogEntry::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn bad_entries_name_the_line() {
        let good =
            "format version: 4\ncreate_time: 2026-12-01 00:00:00\nsource replica: r1\nblock_id: \nget\n1_7_7_0\n";
        assert!(LogEntry::decode(good).is_ok());
        for (bad, says) in [
            (good.replace("version: 4", "version: 9"), "newer"),
            (good.replace("get\n", "fetch\n"), "line 5: unknown entry type"),
            (good.replace("1_7_7_0", "1_7_6_0"), "line 6"),
            (good.replace("create_time", "created"), "line 2"),
            (good[..good.len() - 8].to_string(), "ends before the part name"),
            (
                good.replace("get\n1_7_7_0", "merge\n1_0_0_0\n1_0_1_0\ninto\n1_0_1_1"),
                "do not make it",
            ),
        ] {
            let e = LogEntry::decode(&bad).unwrap_err();
            assert!(e.to_string().contains(says), "{says}: {e}");
        }
    }
}
