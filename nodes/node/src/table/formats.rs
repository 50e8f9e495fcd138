//! Rows in and out, in ClickHouse's formats.
//!
//! In: `JSONEachRow` (one object per line; omitted columns take their
//! type's default; an unknown key is an error, as ClickHouse does without
//! `input_format_skip_unknown_fields`; numbers may come quoted),
//! `JSONCompactEachRow`, `TabSeparated` (ClickHouse's escapes:
//! `\t \n \\ \0 \' \b \f \r`), `TabSeparatedWithNames`, `CSV`, and the
//! binary `Native`, `RowBinary` and `RowBinaryWithNamesAndTypes`
//! (`binary.rs`).
//! Out: the same, and `TabSeparatedWithNamesAndTypes` and `JSON` (the
//! object with `meta`, `data` and `rows` that clients read a result's
//! column types from). 64-bit integers are quoted in JSON unless
//! `output_format_json_quote_64bit_integers=0`, as in ClickHouse.

use super::error::{TResult, TableError, CANNOT_PARSE_INPUT, INCORRECT_DATA, UNKNOWN_FORMAT};
use drift_table::schema::{ColumnType, Schema, Value};

/// Most rows one insert carries.
pub const INSERT_ROWS_MAX: usize = 10_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    JsonEachRow,
    JsonCompactEachRow,
    TabSeparated,
    TabSeparatedWithNames,
    TabSeparatedWithNamesAndTypes,
    Csv,
    Json,
    Native,
    RowBinary,
    RowBinaryWithNamesAndTypes,
}

impl Format {
    pub fn parse(name: &str) -> TResult<Format> {
        Ok(match name {
            "JSONEachRow" | "JSONLines" | "NDJSON" => Format::JsonEachRow,
            "JSONCompactEachRow" => Format::JsonCompactEachRow,
            "TabSeparated" | "TSV" => Format::TabSeparated,
            "TabSeparatedWithNames" | "TSVWithNames" => Format::TabSeparatedWithNames,
            "TabSeparatedWithNamesAndTypes" | "TSVWithNamesAndTypes" => Format::TabSeparatedWithNamesAndTypes,
            "CSV" => Format::Csv,
            "JSON" => Format::Json,
            "Native" => Format::Native,
            "RowBinary" => Format::RowBinary,
            "RowBinaryWithNamesAndTypes" => Format::RowBinaryWithNamesAndTypes,
            other => {
                return Err(TableError::new(
                    UNKNOWN_FORMAT,
                    format!(
                        "Unknown format {other} (drift has JSONEachRow, JSONCompactEachRow, JSON, TabSeparated, \
                         TabSeparatedWithNames, TabSeparatedWithNamesAndTypes, CSV, Native, RowBinary, \
                         RowBinaryWithNamesAndTypes)"
                    ),
                ))
            }
        })
    }

    /// The name ClickHouse gives the format (the `X-ClickHouse-Format`
    /// header of a result).
    pub fn name(self) -> &'static str {
        match self {
            Format::JsonEachRow => "JSONEachRow",
            Format::JsonCompactEachRow => "JSONCompactEachRow",
            Format::TabSeparated => "TabSeparated",
            Format::TabSeparatedWithNames => "TabSeparatedWithNames",
            Format::TabSeparatedWithNamesAndTypes => "TabSeparatedWithNamesAndTypes",
            Format::Csv => "CSV",
            Format::Json => "JSON",
            Format::Native => "Native",
            Format::RowBinary => "RowBinary",
            Format::RowBinaryWithNamesAndTypes => "RowBinaryWithNamesAndTypes",
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::JsonEachRow | Format::JsonCompactEachRow => "application/x-ndjson; charset=UTF-8",
            Format::Json => "application/json; charset=UTF-8",
            Format::Csv => "text/csv; charset=UTF-8",
            Format::Native | Format::RowBinary | Format::RowBinaryWithNamesAndTypes => "application/octet-stream",
            _ => "text/tab-separated-values; charset=UTF-8",
        }
    }
}

fn bad(row: usize, why: impl std::fmt::Display) -> TableError {
    TableError::new(CANNOT_PARSE_INPUT, format!("Cannot parse input: row {row}: {why}"))
}

/// The value an omitted column takes.
pub fn default_of(ty: ColumnType) -> Value {
    match ty {
        ColumnType::UInt64 => Value::UInt64(0),
        ColumnType::Int64 => Value::Int64(0),
        ColumnType::String => Value::String(String::new()),
    }
}

/// Text of a cell as a value of `ty`.
pub fn parse_text(ty: ColumnType, s: &str) -> Result<Value, String> {
    match ty {
        ColumnType::UInt64 => s
            .parse::<u64>()
            .map(Value::UInt64)
            .map_err(|_| format!("{s:?} is not a UInt64")),
        ColumnType::Int64 => s
            .parse::<i64>()
            .map(Value::Int64)
            .map_err(|_| format!("{s:?} is not an Int64")),
        ColumnType::String => Ok(Value::String(s.to_string())),
    }
}

fn from_json(ty: ColumnType, v: &serde_json::Value) -> Result<Value, String> {
    match (ty, v) {
        (ColumnType::UInt64, serde_json::Value::Number(n)) => {
            n.as_u64().map(Value::UInt64).ok_or(format!("{n} is not a UInt64"))
        }
        (ColumnType::Int64, serde_json::Value::Number(n)) => {
            n.as_i64().map(Value::Int64).ok_or(format!("{n} is not an Int64"))
        }
        (ColumnType::String, serde_json::Value::Number(n)) => Ok(Value::String(n.to_string())),
        (ColumnType::String, serde_json::Value::Bool(b)) => Ok(Value::String(b.to_string())),
        (_, serde_json::Value::String(s)) => parse_text(ty, s),
        (_, serde_json::Value::Null) => Ok(default_of(ty)),
        (_, other) => Err(format!("{other} is not a {}", ty.name())),
    }
}

/// Which schema columns an insert fills, in the order its data gives them.
pub fn insert_columns(schema: &Schema, names: &[String]) -> TResult<Vec<usize>> {
    if names.is_empty() {
        return Ok((0..schema.columns.len()).collect());
    }
    names
        .iter()
        .map(|n| {
            schema.column_index(n).ok_or_else(|| {
                TableError::new(
                    super::error::UNKNOWN_IDENTIFIER,
                    format!("No such column {n} in table {}", schema.name),
                )
            })
        })
        .collect()
}

/// What the allocator adds to each allocation, about.
const ALLOCATION: usize = 16;

/// Memory the rows parsed from one insert may take, as [`RowsBound`]
/// counts it. A row of small values takes several times the bytes it
/// took in the body (a list, and a fixed-size value per column): this,
/// with the query port's body budget, keeps what inserts hold in memory
/// bounded whatever the clients send.
pub const ROWS_BYTES_MAX: usize = 128 << 20;

/// Counts the rows an insert's data parses into, and refuses the insert
/// past [`INSERT_ROWS_MAX`] rows or [`ROWS_BYTES_MAX`] bytes of them,
/// as it is parsed rather than after. Given the query port's budget
/// ([`RowsBound::within`]), the rows take their memory from it too, so
/// that concurrent inserts together hold no more than it gives (the
/// memory returns when the bound is dropped, after the insert).
#[derive(Default)]
pub struct RowsBound {
    rows: usize,
    bytes: usize,
    budget: Option<(crate::body::Budget, crate::body::Hold)>,
}

/// Steps in which the rows take memory from the port's budget.
const ROWS_BUDGET_STEP: usize = 1 << 20;

impl RowsBound {
    /// A bound whose rows also count against `budget`.
    pub fn within(budget: &crate::body::Budget) -> RowsBound {
        RowsBound {
            budget: Some((budget.clone(), crate::body::Hold::default())),
            ..RowsBound::default()
        }
    }

    /// The memory of one row as the allocator gives it: its slot in the
    /// list of rows (twice, for the room a growing list keeps), its
    /// values, its strings' bytes, and each allocation's overhead.
    pub fn row_bytes(row: &[Value]) -> usize {
        let strings: usize = row
            .iter()
            .map(|v| match v {
                Value::String(s) => Self::string_bytes(s),
                _ => 0,
            })
            .sum();
        2 * std::mem::size_of::<Vec<Value>>() + std::mem::size_of_val(row) + ALLOCATION + strings
    }

    /// Counts `rows` more rows of `bytes`.
    pub fn add(&mut self, rows: usize, bytes: usize) -> TResult<()> {
        self.rows = self.rows.saturating_add(rows);
        self.bytes = self.bytes.saturating_add(bytes);
        if self.rows >= INSERT_ROWS_MAX {
            return Err(TableError::new(
                INCORRECT_DATA,
                format!("an insert of more than {INSERT_ROWS_MAX} rows"),
            ));
        }
        if self.bytes > ROWS_BYTES_MAX {
            return Err(TableError::new(
                super::error::MEMORY_LIMIT_EXCEEDED,
                format!(
                    "Memory limit (for query) exceeded: the rows of this insert take more than {ROWS_BYTES_MAX} bytes (after {} rows): split it",
                    self.rows
                ),
            ));
        }
        if let Some((budget, hold)) = &mut self.budget {
            if self.bytes > hold.bytes() {
                let more = (self.bytes - hold.bytes()).next_multiple_of(ROWS_BUDGET_STEP);
                hold.grow(budget, more).map_err(|r| {
                    TableError::new(
                        super::error::MEMORY_LIMIT_EXCEEDED,
                        format!(
                            "Memory limit exceeded: the rows of this insert (after {} rows): {r}",
                            self.rows
                        ),
                    )
                })?;
            }
        }
        Ok(())
    }

    /// Counts a string read into a row made before (Native).
    pub fn string(&mut self, s: &str) -> TResult<()> {
        self.add(0, Self::string_bytes(s))
    }

    fn string_bytes(s: &str) -> usize {
        if s.is_empty() {
            0
        } else {
            s.len() + ALLOCATION
        }
    }

    /// Counts one parsed row.
    pub fn row(&mut self, row: &[Value]) -> TResult<()> {
        self.add(1, Self::row_bytes(row))
    }
}

/// One JSONEachRow object, its fields in order, and the first field it
/// names twice (which ClickHouse refuses).
struct JsonRow(Vec<(String, serde_json::Value)>, Option<String>);

impl<'de> serde::Deserialize<'de> for JsonRow {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<JsonRow, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = JsonRow;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<JsonRow, A::Error> {
                let mut fields: Vec<(String, serde_json::Value)> = Vec::new();
                let mut twice = None;
                while let Some(k) = m.next_key::<String>()? {
                    let v = m.next_value()?;
                    if twice.is_none() && fields.iter().any(|(n, _)| *n == k) {
                        twice = Some(k);
                        continue;
                    }
                    fields.push((k, v));
                }
                Ok(JsonRow(fields, twice))
            }
        }
        d.deserialize_map(V)
    }
}

/// Parses an insert's data into full rows (omitted columns defaulted).
pub fn parse_rows(schema: &Schema, format: Format, columns: &[usize], data: &[u8]) -> TResult<Vec<Vec<Value>>> {
    parse_rows_within(schema, format, columns, data, &mut RowsBound::default())
}

/// [`parse_rows`], the rows counted by `bound`.
pub fn parse_rows_within(
    schema: &Schema,
    format: Format,
    columns: &[usize],
    data: &[u8],
    bound: &mut RowsBound,
) -> TResult<Vec<Vec<Value>>> {
    match format {
        Format::Native => return super::binary::read_native(schema, columns, data, bound),
        Format::RowBinary => return super::binary::read_row_binary(schema, columns, data, false, bound),
        Format::RowBinaryWithNamesAndTypes => {
            return super::binary::read_row_binary(schema, columns, data, true, bound)
        }
        Format::Json | Format::TabSeparatedWithNamesAndTypes => {
            return Err(TableError::new(
                super::error::NOT_IMPLEMENTED,
                format!("drift reads no inserts in {} (it writes results in it)", format.name()),
            ))
        }
        _ => {}
    }
    let data = std::str::from_utf8(data).map_err(|e| {
        TableError::new(
            CANNOT_PARSE_INPUT,
            format!(
                "Cannot parse input: {} data is not UTF-8 (at byte {})",
                format.name(),
                e.valid_up_to()
            ),
        )
    })?;
    let blank = || -> Vec<Value> { schema.columns.iter().map(|c| default_of(c.ty)).collect() };
    let mut rows = Vec::new();
    match format {
        Format::JsonEachRow => {
            let stream = serde_json::Deserializer::from_str(data).into_iter::<JsonRow>();
            for (i, obj) in stream.enumerate() {
                let JsonRow(map, twice) = obj.map_err(|e| bad(i + 1, e))?;
                if let Some(k) = twice {
                    return Err(TableError::new(
                        INCORRECT_DATA,
                        format!(
                            "Duplicate field found while parsing JSONEachRow format: {k}: (at row {})",
                            i + 1
                        ),
                    ));
                }
                let mut row = blank();
                for (k, v) in &map {
                    let c = schema.column_index(k).filter(|c| columns.contains(c)).ok_or_else(|| {
                        TableError::new(
                            INCORRECT_DATA,
                            format!(
                                "Unknown field found while parsing JSONEachRow format: {k}: (at row {})",
                                i + 1
                            ),
                        )
                    })?;
                    row[c] = from_json(schema.columns[c].ty, v).map_err(|e| bad(i + 1, format!("column {k}: {e}")))?;
                }
                bound.row(&row)?;
                rows.push(row);
            }
        }
        Format::JsonCompactEachRow => {
            let stream = serde_json::Deserializer::from_str(data).into_iter::<serde_json::Value>();
            for (i, arr) in stream.enumerate() {
                let arr = arr.map_err(|e| bad(i + 1, e))?;
                let serde_json::Value::Array(items) = arr else {
                    return Err(bad(i + 1, "expected a JSON array"));
                };
                if items.len() != columns.len() {
                    return Err(bad(
                        i + 1,
                        format!("{} values for {} columns", items.len(), columns.len()),
                    ));
                }
                let mut row = blank();
                for (&c, v) in columns.iter().zip(&items) {
                    row[c] = from_json(schema.columns[c].ty, v)
                        .map_err(|e| bad(i + 1, format!("column {}: {e}", schema.columns[c].name)))?;
                }
                bound.row(&row)?;
                rows.push(row);
            }
        }
        // TabSeparated, TabSeparatedWithNames, CSV: the others returned above
        _ => {
            let mut lines = data.split('\n').enumerate().filter(|(_, l)| !l.is_empty()).peekable();
            if format == Format::TabSeparatedWithNames {
                lines.next();
            }
            for (i, line) in lines {
                let line = line.strip_suffix('\r').unwrap_or(line);
                let fields: Vec<String> = if format == Format::Csv {
                    csv_fields(line).map_err(|e| bad(i + 1, e))?
                } else {
                    line.split('\t')
                        .map(unescape_tsv)
                        .collect::<Result<_, _>>()
                        .map_err(|e| bad(i + 1, e))?
                };
                if fields.len() != columns.len() {
                    return Err(bad(
                        i + 1,
                        format!("{} fields for {} columns", fields.len(), columns.len()),
                    ));
                }
                let mut row = blank();
                for (&c, f) in columns.iter().zip(&fields) {
                    row[c] = parse_text(schema.columns[c].ty, f)
                        .map_err(|e| bad(i + 1, format!("column {}: {e}", schema.columns[c].name)))?;
                }
                bound.row(&row)?;
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

fn unescape_tsv(field: &str) -> Result<String, String> {
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('0') => out.push('\0'),
            Some('b') => out.push('\u{8}'),
            Some('f') => out.push('\u{c}'),
            Some(c @ ('\\' | '\'' | '"')) => out.push(c),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => return Err("a field ends in a lone backslash".into()),
        }
    }
    Ok(out)
}

fn escape_tsv(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c => out.push(c),
        }
    }
}

fn csv_fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut was_quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                cur.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => cur.push(c),
            (false, '"') if cur.is_empty() && !was_quoted => {
                quoted = true;
                was_quoted = true;
            }
            (false, ',') => {
                fields.push(std::mem::take(&mut cur));
                was_quoted = false;
            }
            (false, c) => cur.push(c),
        }
    }
    if quoted {
        return Err("an unterminated quoted field".into());
    }
    fields.push(cur);
    Ok(fields)
}

/// How query results are written.
#[derive(Clone, Copy, Debug)]
pub struct OutputOptions {
    pub quote_64bit: bool,
    /// The client's protocol revision (`client_protocol_version`; 0 when
    /// it names none): what a `Native` block carries besides the columns.
    pub revision: u64,
}

impl Default for OutputOptions {
    fn default() -> Self {
        OutputOptions {
            quote_64bit: true,
            revision: 0,
        }
    }
}

fn json_cell(v: &Value, o: OutputOptions) -> serde_json::Value {
    match v {
        Value::UInt64(x) if o.quote_64bit => serde_json::Value::String(x.to_string()),
        Value::Int64(x) if o.quote_64bit => serde_json::Value::String(x.to_string()),
        Value::UInt64(x) => serde_json::Value::from(*x),
        Value::Int64(x) => serde_json::Value::from(*x),
        Value::String(s) => serde_json::Value::String(s.clone()),
    }
}

fn json_object(names: &[String], r: &[Value], o: OutputOptions, out: &mut String) {
    // by hand: the columns keep their order (a JSON map would sort them)
    out.push('{');
    for (i, (n, v)) in names.iter().zip(r).enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::Value::String(n.clone()).to_string());
        out.push(':');
        out.push_str(&json_cell(v, o).to_string());
    }
    out.push('}');
}

fn tsv_line(cells: impl Iterator<Item = String>, out: &mut String) {
    for (i, c) in cells.enumerate() {
        if i > 0 {
            out.push('\t');
        }
        escape_tsv(&c, out);
    }
    out.push('\n');
}

/// Writes a result: `names` are the output columns, `types` their types,
/// `rows` their values.
pub fn write_rows(
    format: Format,
    names: &[String],
    types: &[ColumnType],
    rows: &[Vec<Value>],
    o: OutputOptions,
) -> TResult<Vec<u8>> {
    let mut out = String::new();
    match format {
        Format::Native => {
            let mut bytes = Vec::new();
            super::binary::write_native(names, types, rows, o.revision, &mut bytes)?;
            return Ok(bytes);
        }
        Format::RowBinary | Format::RowBinaryWithNamesAndTypes => {
            let mut bytes = Vec::new();
            let header = format == Format::RowBinaryWithNamesAndTypes;
            super::binary::write_row_binary(names, types, rows, header, &mut bytes)?;
            return Ok(bytes);
        }
        Format::JsonEachRow => {
            for r in rows {
                json_object(names, r, o, &mut out);
                out.push('\n');
            }
        }
        Format::JsonCompactEachRow => {
            for r in rows {
                let arr: Vec<serde_json::Value> = r.iter().map(|v| json_cell(v, o)).collect();
                out.push_str(&serde_json::Value::Array(arr).to_string());
                out.push('\n');
            }
        }
        Format::Json => {
            out.push_str("{\n\t\"meta\":\n\t[");
            for (i, (n, t)) in names.iter().zip(types).enumerate() {
                out.push_str(if i > 0 { ",\n\t\t" } else { "\n\t\t" });
                out.push_str(&serde_json::json!({"name": n, "type": t.name()}).to_string());
            }
            out.push_str("\n\t],\n\t\"data\":\n\t[");
            for (i, r) in rows.iter().enumerate() {
                out.push_str(if i > 0 { ",\n\t\t" } else { "\n\t\t" });
                json_object(names, r, o, &mut out);
            }
            out.push_str(&format!(
                "\n\t],\n\t\"rows\": {},\n\t\"statistics\": {{\"elapsed\": 0, \"rows_read\": {}, \"bytes_read\": 0}}\n}}\n",
                rows.len(),
                rows.len()
            ));
        }
        Format::TabSeparated | Format::TabSeparatedWithNames | Format::TabSeparatedWithNamesAndTypes => {
            if format != Format::TabSeparated {
                tsv_line(names.iter().cloned(), &mut out);
            }
            if format == Format::TabSeparatedWithNamesAndTypes {
                tsv_line(types.iter().map(|t| t.name().to_string()), &mut out);
            }
            for r in rows {
                tsv_line(r.iter().map(|v| v.to_string()), &mut out);
            }
        }
        Format::Csv => {
            for r in rows {
                let cells: Vec<String> = r
                    .iter()
                    .map(|v| match v {
                        Value::String(s) => format!("\"{}\"", s.replace('"', "\"\"")),
                        other => other.to_string(),
                    })
                    .collect();
                out.push_str(&cells.join(","));
                out.push('\n');
            }
        }
    }
    Ok(out.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Schema {
        let cols = [("id", ColumnType::UInt64), ("s", ColumnType::String)];
        Schema::new("t", &cols, drift_table::PartitionKey::None, vec![0])
    }

    #[test]
    fn json_each_row_defaults_omitted_columns_and_refuses_unknown_ones() {
        let s = schema();
        let rows = parse_rows(
            &s,
            Format::JsonEachRow,
            &[0, 1],
            b"{\"id\":1,\"s\":\"a\"}\n{\"id\":\"2\"}\n",
        )
        .unwrap();
        assert_eq!(rows[1], vec![Value::UInt64(2), Value::String(String::new())]);
        let e = parse_rows(&s, Format::JsonEachRow, &[0, 1], b"{\"id\":1,\"x\":2}").unwrap_err();
        assert_eq!(e.code, INCORRECT_DATA);
        let e = parse_rows(&s, Format::JsonEachRow, &[0, 1], b"{\"id\":-1}").unwrap_err();
        assert!(e.message.contains("row 1: column id"), "{}", e.message);
        let e = parse_rows(&s, Format::JsonEachRow, &[0, 1], b"{\"id\":1}\n{\"id\":").unwrap_err();
        assert!(e.message.contains("row 2"), "{}", e.message);
    }

    #[test]
    fn tab_separated_round_trips_its_escapes() {
        let s = schema();
        let rows = vec![vec![Value::UInt64(7), Value::String("a\tb\nc\\d".into())]];
        let text = write_rows(
            Format::TabSeparated,
            &["id".into(), "s".into()],
            &[ColumnType::UInt64, ColumnType::String],
            &rows,
            OutputOptions::default(),
        )
        .unwrap();
        assert_eq!(text, b"7\ta\\tb\\nc\\\\d\n");
        assert_eq!(parse_rows(&s, Format::TabSeparated, &[0, 1], &text).unwrap(), rows);
        let e = parse_rows(&s, Format::TabSeparated, &[0, 1], b"1\n").unwrap_err();
        assert!(e.message.contains("1 fields for 2 columns"), "{}", e.message);
        let csv = parse_rows(&s, Format::Csv, &[0, 1], b"3,\"x,\"\"y\"\"\"\n").unwrap();
        assert_eq!(csv[0][1], Value::String("x,\"y\"".into()));
    }

    #[test]
    fn json_output_quotes_64bit_integers_unless_asked_not_to() {
        let rows = vec![vec![Value::UInt64(7), Value::String("x".into())]];
        let names = ["id".to_string(), "s".to_string()];
        let types = [ColumnType::UInt64, ColumnType::String];
        let write = |f, quote_64bit| {
            let o = OutputOptions {
                quote_64bit,
                ..OutputOptions::default()
            };
            String::from_utf8(write_rows(f, &names, &types, &rows, o).unwrap()).unwrap()
        };
        assert_eq!(write(Format::JsonEachRow, true), "{\"id\":\"7\",\"s\":\"x\"}\n");
        assert_eq!(write(Format::JsonEachRow, false), "{\"id\":7,\"s\":\"x\"}\n");
        // JSON: the object a client reads the column types from
        let json: serde_json::Value = serde_json::from_str(&write(Format::Json, true)).unwrap();
        assert_eq!(json["meta"][1], serde_json::json!({"name": "s", "type": "String"}));
        assert_eq!(json["data"][0]["id"], "7");
        assert_eq!(json["rows"], 1);
        assert_eq!(
            write(Format::TabSeparatedWithNamesAndTypes, true),
            "id\ts\nUInt64\tString\n7\tx\n"
        );
    }

    #[test]
    fn text_inserts_that_are_not_utf8_are_refused_naming_the_byte() {
        let e = parse_rows(&schema(), Format::TabSeparated, &[0, 1], b"1\t\xff\n").unwrap_err();
        assert!(e.message.contains("not UTF-8 (at byte 2)"), "{}", e.message);
    }

    #[test]
    fn a_json_each_row_object_naming_a_field_twice_is_refused() {
        let e = parse_rows(
            &schema(),
            Format::JsonEachRow,
            &[0, 1],
            b"{\"id\":1,\"s\":\"a\"}\n{\"id\":2,\"id\":3}\n",
        )
        .unwrap_err();
        assert_eq!(e.code, INCORRECT_DATA);
        assert!(
            e.message.contains("Duplicate field") && e.message.contains("id"),
            "{}",
            e.message
        );
        assert!(e.message.contains("row 2"), "{}", e.message);
        let e = parse_rows(&schema(), Format::JsonEachRow, &[0, 1], b"[1, 2]\n").unwrap_err();
        assert_eq!(e.code, CANNOT_PARSE_INPUT);
    }

    #[test]
    fn the_rows_of_one_insert_are_bounded_in_memory_as_they_are_parsed() {
        // rows of a short string each: a few bytes in the body, about a
        // hundred once parsed
        let row = RowsBound::row_bytes(&[Value::UInt64(1), Value::String("abcd".into())]);
        let n = ROWS_BYTES_MAX / row + 10;
        let mut tsv = Vec::with_capacity(n * 8);
        for i in 0..n {
            tsv.extend_from_slice(format!("{}\tabcd\n", i % 10).as_bytes());
        }
        let e = parse_rows(&schema(), Format::TabSeparated, &[0, 1], &tsv).unwrap_err();
        assert_eq!(e.code, super::super::error::MEMORY_LIMIT_EXCEEDED);
        assert!(e.message.contains("split it"), "{}", e.message);
        // within the bound it parses
        let ok = parse_rows(&schema(), Format::TabSeparated, &[0, 1], &tsv[..n / 2 * 7]).unwrap();
        assert_eq!(ok.len(), n / 2);
    }

    #[test]
    fn rows_bounded_within_a_budget_take_their_memory_from_it_until_dropped() {
        let budget = crate::body::Budget::new(4 << 20);
        let mut tsv = Vec::new();
        for i in 0..200_000 {
            tsv.extend_from_slice(format!("{}\tabcd\n", i % 10).as_bytes());
        }
        // another insert holds most of the budget: this one's rows find
        // too little of it
        let mut other = RowsBound::within(&budget);
        other.add(0, 3 << 20).unwrap();
        let mut bound = RowsBound::within(&budget);
        let e = parse_rows_within(&schema(), Format::TabSeparated, &[0, 1], &tsv, &mut bound).unwrap_err();
        assert_eq!(e.code, super::super::error::MEMORY_LIMIT_EXCEEDED);
        assert!(e.message.contains("bodies being read on this port"), "{}", e.message);
        drop((bound, other));
        assert_eq!(budget.available(), 4 << 20);
        // alone, a smaller insert's rows fit, and hold memory until dropped
        let mut bound = RowsBound::within(&budget);
        let rows = parse_rows_within(&schema(), Format::TabSeparated, &[0, 1], &tsv[..7 * 10_000], &mut bound).unwrap();
        assert_eq!(rows.len(), 10_000);
        assert!(budget.available() < 4 << 20);
        drop(bound);
        assert_eq!(budget.available(), 4 << 20);
    }
}
