//! ClickHouse's binary formats for the column types a table declares
//! (`UInt64`, `Int64`, `String`): `Native`, `RowBinary` and
//! `RowBinaryWithNamesAndTypes`, read for inserts and written for query
//! results.
//!
//! * `Native` is columnar, in blocks: VarUInt column count, VarUInt row
//!   count, then per column its name, its type name and its values
//!   (integers as 8 little-endian bytes, strings as VarUInt length and
//!   bytes). A client that names a protocol revision
//!   (`client_protocol_version`) gets each block led by the block info
//!   ClickHouse's TCP protocol carries (revision 51903 on), and, from
//!   revision 54454 on, a "no custom serialization" byte after each
//!   column's type.
//! * `RowBinary` is the same values row after row with no header;
//!   `RowBinaryWithNamesAndTypes` leads with the column count, the names
//!   and the type names.
//!
//! Nothing read is trusted: counts are bounded by the bytes that remain
//! before anything is allocated for them, and every error names the block,
//! row or column where the data went wrong.

use super::error::{TResult, TableError, CANNOT_PARSE_INPUT, INCORRECT_DATA};
use super::formats::{default_of, RowsBound};
use drift_table::schema::{ColumnType, Schema, Value};

/// The revision from which a Native block is led by its block info.
pub const REVISION_WITH_BLOCK_INFO: u64 = 51_903;
/// The revision from which each Native column says whether it uses a
/// custom serialization.
pub const REVISION_WITH_CUSTOM_SERIALIZATION: u64 = 54_454;
/// Rows per Native block written (ClickHouse's `max_block_size`).
pub const BLOCK_ROWS: usize = 65_536;
/// Most columns one block or header may declare.
const COLUMNS_MAX: u64 = 4096;
/// Longest column or type name read.
const NAME_BYTES_MAX: u64 = 4096;

fn bad(where_: &str, why: impl std::fmt::Display) -> TableError {
    TableError::new(CANNOT_PARSE_INPUT, format!("Cannot parse input: {where_}: {why}"))
}

/// A reader over an insert's bytes.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    fn at_end(&self) -> bool {
        self.pos >= self.data.len()
    }

    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if self.remaining() < n {
            return Err(format!(
                "{what}: needs {n} bytes at byte {}, {} left",
                self.pos,
                self.remaining()
            ));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn varuint(&mut self, what: &str) -> Result<u64, String> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = self.take(1, what)?[0];
            if i == 9 && b > 1 {
                return Err(format!(
                    "{what}: a VarUInt longer than 64 bits at byte {}",
                    self.pos - 1
                ));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!("{what}: a VarUInt of more than 10 bytes at byte {}", self.pos))
    }

    fn string(&mut self, what: &str, max: u64) -> Result<String, String> {
        let n = self.varuint(what)?;
        if n > max || n > self.remaining() as u64 {
            return Err(format!(
                "{what}: a string of {n} bytes at byte {} ({} left, most {max})",
                self.pos,
                self.remaining()
            ));
        }
        let bytes = self.take(n as usize, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what}: not UTF-8 (drift stores UTF-8 strings)"))
    }

    fn value(&mut self, ty: ColumnType, what: &str) -> Result<Value, String> {
        Ok(match ty {
            ColumnType::UInt64 => Value::UInt64(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes"))),
            ColumnType::Int64 => Value::Int64(i64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes"))),
            ColumnType::String => Value::String(self.string(what, u64::MAX)?),
        })
    }
}

fn put_varuint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn put_string(s: &str, out: &mut Vec<u8>) {
    put_varuint(s.len() as u64, out);
    out.extend_from_slice(s.as_bytes());
}

/// Writes `v` as a value of `ty`; integers convert between the two
/// integer types where the value fits.
fn put_value(ty: ColumnType, v: &Value, out: &mut Vec<u8>) -> TResult<()> {
    let misfit = || {
        TableError::new(
            INCORRECT_DATA,
            format!("the value {v} does not fit the result column's type {}", ty.name()),
        )
    };
    match (ty, v) {
        (ColumnType::String, Value::String(s)) => put_string(s, out),
        (ColumnType::String, _) | (_, Value::String(_)) => return Err(misfit()),
        (ColumnType::UInt64, v) => {
            let x = u64::try_from(v.as_i128().expect("an integer")).map_err(|_| misfit())?;
            out.extend_from_slice(&x.to_le_bytes());
        }
        (ColumnType::Int64, v) => {
            let x = i64::try_from(v.as_i128().expect("an integer")).map_err(|_| misfit())?;
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    Ok(())
}

/// A query result in `Native`, blocks of at most [`BLOCK_ROWS`] rows; an
/// empty result is one block of no rows, which still names and types the
/// columns.
pub fn write_native(
    names: &[String],
    types: &[ColumnType],
    rows: &[Vec<Value>],
    revision: u64,
    out: &mut Vec<u8>,
) -> TResult<()> {
    let mut start = 0;
    loop {
        let end = (start + BLOCK_ROWS).min(rows.len());
        if revision >= REVISION_WITH_BLOCK_INFO {
            // field 1: is_overflows = false; field 2: bucket_num = -1; end
            out.extend_from_slice(&[1, 0, 2]);
            out.extend_from_slice(&(-1i32).to_le_bytes());
            out.push(0);
        }
        put_varuint(names.len() as u64, out);
        put_varuint((end - start) as u64, out);
        for (c, (name, ty)) in names.iter().zip(types).enumerate() {
            put_string(name, out);
            put_string(ty.name(), out);
            if revision >= REVISION_WITH_CUSTOM_SERIALIZATION {
                out.push(0);
            }
            for r in &rows[start..end] {
                put_value(*ty, &r[c], out)?;
            }
        }
        start = end;
        if start >= rows.len() {
            return Ok(());
        }
    }
}

/// A query result in `RowBinary`, led by the names and types when
/// `header` (`RowBinaryWithNamesAndTypes`).
pub fn write_row_binary(
    names: &[String],
    types: &[ColumnType],
    rows: &[Vec<Value>],
    header: bool,
    out: &mut Vec<u8>,
) -> TResult<()> {
    if header {
        put_varuint(names.len() as u64, out);
        for n in names {
            put_string(n, out);
        }
        for t in types {
            put_string(t.name(), out);
        }
    }
    for r in rows {
        for (ty, v) in types.iter().zip(r) {
            put_value(*ty, v, out)?;
        }
    }
    Ok(())
}

fn blank(schema: &Schema) -> Vec<Value> {
    schema.columns.iter().map(|c| default_of(c.ty)).collect()
}

/// The schema column a block or header names, which must be one the insert
/// fills and of the type the table declares.
fn column_of(schema: &Schema, columns: &[usize], name: &str, ty: &str, where_: &str) -> TResult<usize> {
    let c = schema
        .column_index(name)
        .filter(|c| columns.contains(c))
        .ok_or_else(|| {
            TableError::new(
                INCORRECT_DATA,
                format!(
                    "{where_}: column {name:?} is not one this insert fills in table {}",
                    schema.name
                ),
            )
        })?;
    let declared = schema.columns[c].ty;
    if ty != declared.name() {
        return Err(TableError::new(
            INCORRECT_DATA,
            format!(
                "{where_}: column {name} is sent as {ty}, the table declares {} (drift converts no types)",
                declared.name()
            ),
        ));
    }
    Ok(c)
}

/// An insert's `Native` blocks as full rows (columns a block leaves out
/// take their defaults). The blocks carry no block info, as ClickHouse's
/// clients send them over HTTP.
pub fn read_native(schema: &Schema, columns: &[usize], data: &[u8], bound: &mut RowsBound) -> TResult<Vec<Vec<Value>>> {
    let mut input = Input { data, pos: 0 };
    let mut rows: Vec<Vec<Value>> = Vec::new();
    let mut block = 0;
    while !input.at_end() {
        block += 1;
        let w = format!("Native block {block}");
        let ncols = input.varuint("the column count").map_err(|e| bad(&w, e))?;
        let nrows = input.varuint("the row count").map_err(|e| bad(&w, e))?;
        if ncols > COLUMNS_MAX || ncols as usize > schema.columns.len() {
            return Err(bad(
                &w,
                format!("{ncols} columns (table {} has {})", schema.name, schema.columns.len()),
            ));
        }
        if ncols > 0 && nrows > input.remaining() as u64 {
            // every value takes at least one byte
            return Err(bad(
                &w,
                format!("{nrows} rows declared, {} bytes left", input.remaining()),
            ));
        }
        // the block's rows are made before their values are read: counted
        // first (their strings once read, below)
        let row = RowsBound::row_bytes(&blank(schema));
        bound.add(nrows as usize, (nrows as usize).saturating_mul(row))?;
        let first = rows.len();
        rows.extend((0..nrows).map(|_| blank(schema)));
        let mut seen = Vec::new();
        for k in 0..ncols {
            let wc = format!("{w}, column {}", k + 1);
            let name = input.string("its name", NAME_BYTES_MAX).map_err(|e| bad(&wc, e))?;
            let ty = input.string("its type", NAME_BYTES_MAX).map_err(|e| bad(&wc, e))?;
            let c = column_of(schema, columns, &name, &ty, &wc)?;
            if seen.contains(&c) {
                return Err(bad(&wc, format!("column {name} twice in one block")));
            }
            seen.push(c);
            for (i, row) in rows[first..].iter_mut().enumerate() {
                let v = input
                    .value(schema.columns[c].ty, &format!("row {}", i + 1))
                    .map_err(|e| bad(&format!("{wc} ({name})"), e))?;
                if let Value::String(s) = &v {
                    bound.string(s)?;
                }
                row[c] = v;
            }
        }
    }
    Ok(rows)
}

/// An insert's `RowBinary` rows (the insert's columns, in its order) or
/// `RowBinaryWithNamesAndTypes` rows (the header's columns).
pub fn read_row_binary(
    schema: &Schema,
    columns: &[usize],
    data: &[u8],
    header: bool,
    bound: &mut RowsBound,
) -> TResult<Vec<Vec<Value>>> {
    let mut input = Input { data, pos: 0 };
    let order: Vec<usize> = if header {
        let w = "RowBinaryWithNamesAndTypes header";
        let n = input.varuint("the column count").map_err(|e| bad(w, e))?;
        if n > COLUMNS_MAX || n as usize > schema.columns.len() {
            return Err(bad(
                w,
                format!("{n} columns (table {} has {})", schema.name, schema.columns.len()),
            ));
        }
        let names: Vec<String> = (0..n)
            .map(|i| input.string(&format!("name {}", i + 1), NAME_BYTES_MAX))
            .collect::<Result<_, _>>()
            .map_err(|e| bad(w, e))?;
        let mut order = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let ty = input
                .string(&format!("type {}", i + 1), NAME_BYTES_MAX)
                .map_err(|e| bad(w, e))?;
            let c = column_of(schema, columns, name, &ty, w)?;
            if order.contains(&c) {
                return Err(bad(w, format!("column {name} twice")));
            }
            order.push(c);
        }
        order
    } else {
        columns.to_vec()
    };
    if order.is_empty() {
        return Err(bad("RowBinary", "an insert of no columns"));
    }
    let mut rows = Vec::new();
    while !input.at_end() {
        let mut row = blank(schema);
        for &c in &order {
            let col = &schema.columns[c];
            row[c] = input
                .value(col.ty, &format!("column {}", col.name))
                .map_err(|e| bad(&format!("RowBinary row {}", rows.len() + 1), e))?;
        }
        bound.row(&row)?;
        rows.push(row);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_native(s: &Schema, c: &[usize], d: &[u8]) -> TResult<Vec<Vec<Value>>> {
        super::read_native(s, c, d, &mut RowsBound::default())
    }

    fn read_row_binary(s: &Schema, c: &[usize], d: &[u8], header: bool) -> TResult<Vec<Vec<Value>>> {
        super::read_row_binary(s, c, d, header, &mut RowsBound::default())
    }
    use drift_table::schema::PartitionKey;

    fn schema() -> Schema {
        Schema::new(
            "t",
            &[
                ("id", ColumnType::UInt64),
                ("d", ColumnType::Int64),
                ("s", ColumnType::String),
            ],
            PartitionKey::None,
            vec![0],
        )
    }

    fn rows() -> Vec<Vec<Value>> {
        vec![
            vec![Value::UInt64(1), Value::Int64(-2), Value::String("a\tb".into())],
            vec![
                Value::UInt64(u64::MAX),
                Value::Int64(i64::MIN),
                Value::String(String::new()),
            ],
        ]
    }

    fn names() -> Vec<String> {
        vec!["id".into(), "d".into(), "s".into()]
    }

    const TYPES: [ColumnType; 3] = [ColumnType::UInt64, ColumnType::Int64, ColumnType::String];

    #[test]
    fn native_round_trips_and_its_bytes_are_clickhouses() {
        let mut out = Vec::new();
        write_native(&names(), &TYPES, &rows(), 0, &mut out).unwrap();
        // 3 columns, 2 rows, "id", "UInt64", 1, u64::MAX
        assert_eq!(&out[..2], &[3, 2]);
        assert_eq!(&out[2..12], b"\x02id\x06UInt64");
        assert_eq!(&out[12..20], &1u64.to_le_bytes());
        assert_eq!(read_native(&schema(), &[0, 1, 2], &out).unwrap(), rows());
        // with block info: the probe a client makes reads b"\x01\x01\x05check" at 8..16
        let mut probe = Vec::new();
        write_native(
            &["check".into()],
            &[ColumnType::UInt64],
            &[vec![Value::UInt64(1)]],
            54405,
            &mut probe,
        )
        .unwrap();
        assert_eq!(&probe[..8], &[1, 0, 2, 0xff, 0xff, 0xff, 0xff, 0]);
        assert_eq!(&probe[8..16], b"\x01\x01\x05check");
        let mut custom = Vec::new();
        write_native(&["c".into()], &[ColumnType::UInt64], &[], 54460, &mut custom).unwrap();
        assert_eq!(&custom[8..], b"\x01\x00\x01c\x06UInt64\x00");
    }

    #[test]
    fn native_blocks_may_leave_columns_out_and_split_rows() {
        let mut out = Vec::new();
        write_native(
            &["id".into()],
            &[ColumnType::UInt64],
            &[vec![Value::UInt64(7)]],
            0,
            &mut out,
        )
        .unwrap();
        write_native(
            &["id".into()],
            &[ColumnType::UInt64],
            &[vec![Value::UInt64(8)]],
            0,
            &mut out,
        )
        .unwrap();
        let got = read_native(&schema(), &[0, 1, 2], &out).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[1],
            vec![Value::UInt64(8), Value::Int64(0), Value::String(String::new())]
        );
    }

    #[test]
    fn bad_native_is_refused_naming_where() {
        let s = schema();
        let mut good = Vec::new();
        write_native(&names(), &TYPES, &rows(), 0, &mut good).unwrap();
        for cut in 1..good.len() {
            let e = read_native(&s, &[0, 1, 2], &good[..cut]).unwrap_err();
            assert!(e.message.contains("Native block 1"), "{cut}: {}", e.message);
        }
        // a type the table does not declare
        let mut wrong = Vec::new();
        write_native(
            &["id".into()],
            &[ColumnType::Int64],
            &[vec![Value::Int64(1)]],
            0,
            &mut wrong,
        )
        .unwrap();
        let e = read_native(&s, &[0, 1, 2], &wrong).unwrap_err();
        assert!(
            e.message.contains("sent as Int64, the table declares UInt64"),
            "{}",
            e.message
        );
        // a column the insert does not name
        let e = read_native(&s, &[1, 2], &good).unwrap_err();
        assert!(
            e.message.contains("\"id\" is not one this insert fills"),
            "{}",
            e.message
        );
        // a huge row count is refused before anything is allocated for it
        let e = read_native(&s, &[0], &[1, 0xc0, 0x84, 0x3d, 2, b'i', b'd']).unwrap_err();
        assert!(e.message.contains("rows declared"), "{}", e.message);
        // a VarUInt that never ends
        let e = read_native(&s, &[0], &[0xff; 12]).unwrap_err();
        assert!(e.message.contains("VarUInt"), "{}", e.message);
        // a negative value in a UInt64 result column is an error, not a wrap
        let mut out = Vec::new();
        let e = write_native(
            &["x".into()],
            &[ColumnType::UInt64],
            &[vec![Value::Int64(-1)]],
            0,
            &mut out,
        )
        .unwrap_err();
        assert!(e.message.contains("does not fit"), "{}", e.message);
    }

    #[test]
    fn row_binary_round_trips_with_and_without_its_header() {
        let s = schema();
        for header in [false, true] {
            let mut out = Vec::new();
            write_row_binary(&names(), &TYPES, &rows(), header, &mut out).unwrap();
            assert_eq!(read_row_binary(&s, &[0, 1, 2], &out, header).unwrap(), rows());
            let e = read_row_binary(&s, &[0, 1, 2], &out[..out.len() - 1], header).unwrap_err();
            assert!(e.message.contains("RowBinary row 2"), "{}", e.message);
        }
        // columns in the insert's order
        let mut out = Vec::new();
        write_row_binary(
            &["s".into(), "id".into()],
            &[ColumnType::String, ColumnType::UInt64],
            &[vec![Value::String("x".into()), Value::UInt64(5)]],
            false,
            &mut out,
        )
        .unwrap();
        let got = read_row_binary(&s, &[2, 0], &out, false).unwrap();
        assert_eq!(
            got,
            vec![vec![Value::UInt64(5), Value::Int64(0), Value::String("x".into())]]
        );
    }
}
