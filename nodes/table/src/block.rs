//! Rows in columns: what an insert carries and what a part holds.
//!
//! An insert becomes blocks the way ClickHouse makes them: its rows are cut
//! into chunks of `max_insert_block_size`, each chunk into one block per
//! partition (in partition id order), and each block is sorted by the
//! order key (ties by every column, so the order — and with it the block
//! id — is the same on every replica and every retry).

use crate::schema::{ColumnType, Schema, Value};
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// One column's values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColumnData {
    UInt64(Vec<u64>),
    Int64(Vec<i64>),
    String(Vec<String>),
}

impl ColumnData {
    pub fn empty(ty: ColumnType) -> ColumnData {
        match ty {
            ColumnType::UInt64 => ColumnData::UInt64(Vec::new()),
            ColumnType::Int64 => ColumnData::Int64(Vec::new()),
            ColumnType::String => ColumnData::String(Vec::new()),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            ColumnData::UInt64(v) => v.len(),
            ColumnData::Int64(v) => v.len(),
            ColumnData::String(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn column_type(&self) -> ColumnType {
        match self {
            ColumnData::UInt64(_) => ColumnType::UInt64,
            ColumnData::Int64(_) => ColumnType::Int64,
            ColumnData::String(_) => ColumnType::String,
        }
    }

    pub fn get(&self, i: usize) -> Value {
        match self {
            ColumnData::UInt64(v) => Value::UInt64(v[i]),
            ColumnData::Int64(v) => Value::Int64(v[i]),
            ColumnData::String(v) => Value::String(v[i].clone()),
        }
    }

    /// Appends `value`, which must have this column's type.
    fn push(&mut self, value: Value) -> Result<(), Value> {
        match (self, value) {
            (ColumnData::UInt64(v), Value::UInt64(x)) => v.push(x),
            (ColumnData::Int64(v), Value::Int64(x)) => v.push(x),
            (ColumnData::String(v), Value::String(x)) => v.push(x),
            (_, value) => return Err(value),
        }
        Ok(())
    }

    fn take(&self, order: &[usize]) -> ColumnData {
        match self {
            ColumnData::UInt64(v) => ColumnData::UInt64(order.iter().map(|&i| v[i]).collect()),
            ColumnData::Int64(v) => ColumnData::Int64(order.iter().map(|&i| v[i]).collect()),
            ColumnData::String(v) => ColumnData::String(order.iter().map(|&i| v[i].clone()).collect()),
        }
    }

    fn extend(&mut self, other: &ColumnData) {
        match (self, other) {
            (ColumnData::UInt64(a), ColumnData::UInt64(b)) => a.extend_from_slice(b),
            (ColumnData::Int64(a), ColumnData::Int64(b)) => a.extend_from_slice(b),
            (ColumnData::String(a), ColumnData::String(b)) => a.extend_from_slice(b),
            _ => panic!("extend: column types differ"),
        }
    }
}

/// Rows of one table, by column (in the schema's column order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub columns: Vec<ColumnData>,
}

impl Block {
    pub fn empty(schema: &Schema) -> Block {
        Block {
            columns: schema.columns.iter().map(|c| ColumnData::empty(c.ty)).collect(),
        }
    }

    /// Builds a block from rows whose values already have the schema's
    /// types (the parsers convert); names the first row that does not.
    pub fn from_rows(schema: &Schema, rows: Vec<Vec<Value>>) -> Result<Block, String> {
        let mut b = Block::empty(schema);
        for (r, row) in rows.into_iter().enumerate() {
            if row.len() != schema.columns.len() {
                return Err(format!(
                    "row {}: {} values for {} columns",
                    r + 1,
                    row.len(),
                    schema.columns.len()
                ));
            }
            for (c, v) in row.into_iter().enumerate() {
                b.columns[c].push(v).map_err(|v| {
                    format!(
                        "row {}: column {} is {}, got {}",
                        r + 1,
                        schema.columns[c].name,
                        schema.columns[c].ty.name(),
                        v.column_type().name()
                    )
                })?;
            }
        }
        Ok(b)
    }

    pub fn rows(&self) -> usize {
        self.columns.first().map_or(0, |c| c.len())
    }

    pub fn row(&self, i: usize) -> Vec<Value> {
        self.columns.iter().map(|c| c.get(i)).collect()
    }

    /// The rows at `order`, in that order.
    pub fn take(&self, order: &[usize]) -> Block {
        Block {
            columns: self.columns.iter().map(|c| c.take(order)).collect(),
        }
    }

    /// Sorted by the schema's order (stable on equal rows).
    pub fn sorted(&self, schema: &Schema) -> Block {
        let rows: Vec<Vec<Value>> = (0..self.rows()).map(|i| self.row(i)).collect();
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by(|&a, &b| schema.compare_rows(&rows[a], &rows[b]).then(a.cmp(&b)));
        self.take(&order)
    }

    /// Whether the rows are in the schema's order.
    pub fn is_sorted(&self, schema: &Schema) -> bool {
        (1..self.rows()).all(|i| schema.compare_rows(&self.row(i - 1), &self.row(i)) != Ordering::Greater)
    }

    /// The rows of all `blocks`, in the schema's order: what a merge writes.
    pub fn merge(schema: &Schema, blocks: &[Block]) -> Block {
        let mut all = Block::empty(schema);
        for b in blocks {
            for (c, col) in all.columns.iter_mut().zip(&b.columns) {
                c.extend(col);
            }
        }
        all.sorted(schema)
    }
}

/// ClickHouse's default `max_insert_block_size`: rows per block before an
/// insert is cut into more blocks.
pub const MAX_INSERT_BLOCK_SIZE_DEFAULT: usize = 1_048_449;

/// An insert's rows as blocks: chunks of `max_block_rows`, each split by
/// partition in partition id order, each sorted. The split depends only on
/// the rows and `max_block_rows`, so a retry of the same insert makes the
/// same blocks.
pub fn split_insert(schema: &Schema, rows: &Block, max_block_rows: usize) -> Vec<(String, Block)> {
    assert!(max_block_rows > 0);
    let mut out = Vec::new();
    let n = rows.rows();
    let mut start = 0;
    while start < n {
        let end = (start + max_block_rows).min(n);
        let mut by_partition: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for i in start..end {
            by_partition
                .entry(schema.partition_id(&rows.row(i)))
                .or_default()
                .push(i);
        }
        for (partition, idx) in by_partition {
            out.push((partition, rows.take(&idx).sorted(schema)));
        }
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::PartitionKey;

    pub(crate) fn schema() -> Schema {
        let cols = [("id", ColumnType::UInt64), ("s", ColumnType::String)];
        Schema::new("t", &cols, PartitionKey::IntDiv(0, 10), vec![0])
    }

    fn rows(ids: &[u64]) -> Block {
        Block::from_rows(
            &schema(),
            ids.iter()
                .map(|&i| vec![Value::UInt64(i), Value::String(format!("v{i}"))])
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn inserts_split_by_size_then_partition_and_sort() {
        let b = rows(&[15, 3, 12, 1, 25]);
        let blocks = split_insert(&schema(), &b, 3);
        let got: Vec<(String, Vec<Value>)> = blocks
            .iter()
            .map(|(p, b)| (p.clone(), (0..b.rows()).map(|i| b.row(i)[0].clone()).collect()))
            .collect();
        let u = Value::UInt64;
        assert_eq!(
            got,
            vec![
                ("0".into(), vec![u(3)]),
                ("1".into(), vec![u(12), u(15)]),
                ("0".into(), vec![u(1)]),
                ("2".into(), vec![u(25)]),
            ]
        );
    }

    #[test]
    fn a_row_of_the_wrong_type_is_named() {
        let e = Block::from_rows(
            &schema(),
            vec![vec![Value::String("x".into()), Value::String("y".into())]],
        )
        .unwrap_err();
        assert!(e.contains("row 1: column id is UInt64, got String"), "{e}");
        let e = Block::from_rows(&schema(), vec![vec![Value::UInt64(1)]]).unwrap_err();
        assert!(e.contains("1 values for 2 columns"), "{e}");
    }

    #[test]
    fn merge_keeps_every_row_once_in_order() {
        let m = Block::merge(&schema(), &[rows(&[5, 1]), rows(&[3, 1])]);
        assert_eq!(m.rows(), 4);
        assert!(m.is_sorted(&schema()));
        assert_eq!(m.row(0)[0], Value::UInt64(1));
        assert_eq!(m.row(1)[0], Value::UInt64(1));
    }
}
