//! A table's shape: typed columns, the partition key, the order key, and
//! the replication settings ClickHouse names the same way.
//!
//! The cluster file declares tables (the driver parses the expressions);
//! this module holds the parsed form and the pure functions over it:
//! a row's partition id, the order of rows inside a part.

use std::cmp::Ordering;
use std::fmt;

/// The column types a table may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnType {
    UInt64,
    Int64,
    String,
}

impl ColumnType {
    pub fn parse(name: &str) -> Option<ColumnType> {
        match name {
            "UInt64" => Some(ColumnType::UInt64),
            "Int64" => Some(ColumnType::Int64),
            "String" => Some(ColumnType::String),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ColumnType::UInt64 => "UInt64",
            ColumnType::Int64 => "Int64",
            ColumnType::String => "String",
        }
    }
}

/// One cell.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Value {
    UInt64(u64),
    Int64(i64),
    String(String),
}

impl Value {
    pub fn column_type(&self) -> ColumnType {
        match self {
            Value::UInt64(_) => ColumnType::UInt64,
            Value::Int64(_) => ColumnType::Int64,
            Value::String(_) => ColumnType::String,
        }
    }

    /// The value as a signed 128-bit integer, for arithmetic and
    /// comparisons across the integer types.
    pub fn as_i128(&self) -> Option<i128> {
        match self {
            Value::UInt64(v) => Some(*v as i128),
            Value::Int64(v) => Some(*v as i128),
            Value::String(_) => None,
        }
    }

    /// Orders values the way a query compares them: integers by value
    /// whatever their type, strings bytewise, integers before strings.
    pub fn compare(&self, other: &Value) -> Ordering {
        match (self.as_i128(), other.as_i128()) {
            (Some(a), Some(b)) => a.cmp(&b),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => self.cmp(other),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::UInt64(v) => write!(f, "{v}"),
            Value::Int64(v) => write!(f, "{v}"),
            Value::String(s) => f.write_str(s),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub ty: ColumnType,
}

/// How a row's partition is derived (ClickHouse's `PARTITION BY`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PartitionKey {
    /// `tuple()`: one partition, `all`.
    None,
    /// A column's value.
    Column(usize),
    /// `intDiv(column, N)` of an integer column, N > 0.
    IntDiv(usize, u64),
}

/// Longest column or table name; names become file and znode names.
pub const NAME_BYTES_MAX: usize = 64;
/// Most columns in a table.
pub const COLUMNS_MAX: usize = 64;

/// A name that is safe as a file name and a znode name: ASCII letters,
/// digits and `_`, not starting with a digit.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && !name.as_bytes()[0].is_ascii_digit()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The settings of one replicated table, with ClickHouse's names and, where
/// they suit a test cluster, its defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSettings {
    /// Block ids kept (by count) for deduplication; 0 turns dedup off.
    pub replicated_deduplication_window: u64,
    /// Block ids kept (by age relative to the newest block id).
    pub replicated_deduplication_window_seconds: u64,
    /// How often the leader removes old block ids and log entries.
    pub cleanup_delay_period_ms: u64,
    /// Log entries the leader keeps at least.
    pub min_replicated_logs_to_keep: u64,
    /// A replica further behind than this is marked lost.
    pub max_replicated_logs_to_keep: u64,
    /// Most parts one merge takes.
    pub max_parts_to_merge_at_once: usize,
    /// Parts in one partition at which the leader starts merging.
    pub parts_to_merge_min: usize,
    /// Fetches one replica runs at a time.
    pub fetch_pool_size: usize,
    /// Merges one replica runs at a time.
    pub merge_pool_size: usize,
    /// The leader's merge selection period.
    pub merge_selecting_period_ms: u64,
    /// Where the table lives in the coordinator.
    pub zookeeper_path: String,
}

impl Default for TableSettings {
    fn default() -> Self {
        TableSettings {
            replicated_deduplication_window: 1000,
            replicated_deduplication_window_seconds: 7 * 24 * 3600,
            cleanup_delay_period_ms: 30_000,
            min_replicated_logs_to_keep: 10,
            max_replicated_logs_to_keep: 1000,
            max_parts_to_merge_at_once: 100,
            parts_to_merge_min: 6,
            fetch_pool_size: 8,
            merge_pool_size: 2,
            merge_selecting_period_ms: 1_000,
            zookeeper_path: String::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schema {
    pub name: String,
    pub columns: Vec<Column>,
    pub partition_key: PartitionKey,
    /// Column indexes rows are sorted by inside a part.
    pub order_key: Vec<usize>,
    pub settings: TableSettings,
}

impl Schema {
    /// A schema with the default settings, its columns given as (name,
    /// type) pairs.
    pub fn new(
        name: &str,
        columns: &[(&str, ColumnType)],
        partition_key: PartitionKey,
        order_key: Vec<usize>,
    ) -> Schema {
        Schema {
            name: name.to_string(),
            columns: columns
                .iter()
                .map(|(n, ty)| Column {
                    name: n.to_string(),
                    ty: *ty,
                })
                .collect(),
            partition_key,
            order_key,
            settings: TableSettings::default(),
        }
    }

    /// Checks what the parser could not: names, key columns and types.
    pub fn validate(&self) -> Result<(), String> {
        if !valid_name(&self.name) {
            return Err(format!(
                "table name {:?}: letters, digits and _ only (≤ {NAME_BYTES_MAX} bytes)",
                self.name
            ));
        }
        if self.columns.is_empty() || self.columns.len() > COLUMNS_MAX {
            return Err(format!("table {}: needs 1..={COLUMNS_MAX} columns", self.name));
        }
        for (i, c) in self.columns.iter().enumerate() {
            if !valid_name(&c.name) {
                return Err(format!("column name {:?}: letters, digits and _ only", c.name));
            }
            if self.columns[..i].iter().any(|o| o.name == c.name) {
                return Err(format!("column {} declared twice", c.name));
            }
        }
        match self.partition_key {
            PartitionKey::None => {}
            PartitionKey::Column(i) if i < self.columns.len() => {}
            PartitionKey::IntDiv(i, n) if i < self.columns.len() => {
                if n == 0 {
                    return Err("intDiv by 0 in the partition key".into());
                }
                if self.columns[i].ty == ColumnType::String {
                    return Err(format!("intDiv of String column {}", self.columns[i].name));
                }
            }
            _ => return Err("partition key names no column".into()),
        }
        if self.order_key.iter().any(|&i| i >= self.columns.len()) {
            return Err("order key names no column".into());
        }
        let s = &self.settings;
        if s.max_parts_to_merge_at_once < 2 || s.parts_to_merge_min < 2 {
            return Err("a merge takes at least 2 parts".into());
        }
        if s.fetch_pool_size == 0 || s.merge_pool_size == 0 {
            return Err("pool sizes must be positive".into());
        }
        if s.min_replicated_logs_to_keep > s.max_replicated_logs_to_keep {
            return Err("min_replicated_logs_to_keep > max_replicated_logs_to_keep".into());
        }
        if s.cleanup_delay_period_ms == 0 || s.merge_selecting_period_ms == 0 {
            return Err("periods must be positive".into());
        }
        Ok(())
    }

    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// The partition id of a row, as ClickHouse names it: `all` without a
    /// key, the decimal value of an integer key, a hash for a string key.
    pub fn partition_id(&self, row: &[Value]) -> String {
        match &self.partition_key {
            PartitionKey::None => "all".into(),
            PartitionKey::Column(i) => partition_of(&row[*i]),
            PartitionKey::IntDiv(i, n) => match &row[*i] {
                Value::UInt64(v) => (v / n).to_string(),
                // ClickHouse's intDiv rounds toward zero
                Value::Int64(v) => (*v as i128 / *n as i128).to_string(),
                other => partition_of(other),
            },
        }
    }

    /// Compares two rows by the order key, then (so sorting is total and
    /// the same on every replica) by every column.
    pub fn compare_rows(&self, a: &[Value], b: &[Value]) -> Ordering {
        for &i in &self.order_key {
            match a[i].compare(&b[i]) {
                Ordering::Equal => {}
                o => return o,
            }
        }
        for (x, y) in a.iter().zip(b) {
            match x.compare(y) {
                Ordering::Equal => {}
                o => return o,
            }
        }
        Ordering::Equal
    }
}

fn partition_of(v: &Value) -> String {
    match v {
        Value::String(s) => {
            let h = crate::hash::sip128(s.as_bytes());
            format!("{h:032x}")
        }
        other => other.to_string(),
    }
}

/// A partition id is a znode and file name part: digits, `-`, lowercase hex
/// or `all`; never `_`, which separates a part name's fields.
pub fn valid_partition_id(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= NAME_BYTES_MAX
        && (p == "all"
            || p.bytes()
                .all(|b| b.is_ascii_digit() || b == b'-' || matches!(b, b'a'..=b'f')))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn schema(key: PartitionKey) -> Schema {
        use ColumnType::*;
        Schema::new("t", &[("id", UInt64), ("s", String), ("n", Int64)], key, vec![0])
    }

    #[test]
    fn partition_ids_follow_clickhouse() {
        let row = [Value::UInt64(1234), Value::String("x".into()), Value::Int64(-1234)];
        assert_eq!(schema(PartitionKey::None).partition_id(&row), "all");
        assert_eq!(schema(PartitionKey::IntDiv(0, 1000)).partition_id(&row), "1");
        assert_eq!(schema(PartitionKey::IntDiv(2, 1000)).partition_id(&row), "-1");
        assert_eq!(schema(PartitionKey::Column(0)).partition_id(&row), "1234");
        let p = schema(PartitionKey::Column(1)).partition_id(&row);
        assert_eq!(p.len(), 32);
        assert!(valid_partition_id(&p));
    }

    #[test]
    fn validation_names_the_problem() {
        let mut s = schema(PartitionKey::IntDiv(1, 10));
        assert!(s.validate().unwrap_err().contains("String"));
        s.partition_key = PartitionKey::IntDiv(0, 0);
        assert!(s.validate().unwrap_err().contains("by 0"));
        s.partition_key = PartitionKey::None;
        s.columns[1].name = "id".into();
        assert!(s.validate().unwrap_err().contains("twice"));
        s.columns[1].name = "a-b".into();
        assert!(s.validate().unwrap_err().contains("letters"));
    }
}
