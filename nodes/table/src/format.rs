//! A part's files, as bytes: what the driver writes to a part directory,
//! sends to a fetching replica, and checks before it installs a part.
//!
//! ```text
//! columns.txt     columns format version: 1 / N columns: / `name` Type
//! count.txt       the row count, decimal
//! <column>.bin    the column: u64/i64 little-endian; String as a
//!                 LEB128 length then UTF-8 bytes
//! checksums.txt   checksums format version: 1 / N files: / name<TAB>size<TAB>hash
//!                 then `total: <hash>` of everything above it
//! ```
//!
//! Every file but `checksums.txt` is listed in `checksums.txt` with its
//! size and SipHash-128; `checksums.txt` ends with a hash of its own lines.
//! [`verify`] checks all of it, so a truncated or flipped file — on disk
//! or on the wire — is refused before a part is decoded, never installed.

use crate::block::{Block, ColumnData};

/// Why a part's files are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartError {
    /// A file the part must have is not there.
    #[error("file {0} is missing")]
    Missing(String),
    /// A file no part of the schema has.
    #[error("unexpected file {0}")]
    Unexpected(String),
    /// A file whose bytes are not what they must be.
    #[error("{file}: {why}")]
    Bad { file: String, why: String },
}

fn bad(file: &str, why: impl Into<String>) -> PartError {
    PartError::Bad {
        file: file.to_string(),
        why: why.into(),
    }
}
use crate::hash::{sip128, Sip128};
use crate::schema::{ColumnType, Schema};
use std::collections::BTreeMap;

pub const CHECKSUMS: &str = "checksums.txt";
pub const COLUMNS: &str = "columns.txt";
pub const COUNT: &str = "count.txt";

/// Most rows in one part; a String's length prefix and a column file are
/// bounded by it and by [`FILE_BYTES_MAX`], so a corrupt length cannot make
/// a reader allocate without end.
pub const ROWS_MAX: usize = 1 << 28;
/// Largest file in a part.
pub const FILE_BYTES_MAX: u64 = 1 << 32;

/// A file's size and hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileSum {
    pub size: u64,
    pub hash: u128,
}

/// The `checksums.txt` of a part.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checksums {
    pub files: BTreeMap<String, FileSum>,
}

impl Checksums {
    pub fn of(files: &BTreeMap<String, Vec<u8>>) -> Checksums {
        Checksums {
            files: files
                .iter()
                .filter(|(n, _)| n.as_str() != CHECKSUMS)
                .map(|(n, b)| {
                    (
                        n.clone(),
                        FileSum {
                            size: b.len() as u64,
                            hash: sip128(b),
                        },
                    )
                })
                .collect(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut s = format!("checksums format version: 1\n{} files:\n", self.files.len());
        for (name, sum) in &self.files {
            s.push_str(&format!("{name}\t{}\t{:032x}\n", sum.size, sum.hash));
        }
        let total = sip128(s.as_bytes());
        s.push_str(&format!("total: {total:032x}\n"));
        s.into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<Checksums, PartError> {
        let text = std::str::from_utf8(bytes).map_err(|_| bad(CHECKSUMS, "not UTF-8"))?;
        let Some(body_end) = text.rfind("total: ") else {
            return Err(bad(CHECKSUMS, "no total line (truncated?)"));
        };
        let (body, total) = text.split_at(body_end);
        let want = total
            .strip_prefix("total: ")
            .and_then(|t| t.strip_suffix('\n'))
            .filter(|t| t.len() == 32)
            .and_then(|t| u128::from_str_radix(t, 16).ok())
            .ok_or_else(|| bad(CHECKSUMS, "bad total line"))?;
        if sip128(body.as_bytes()) != want {
            return Err(bad(CHECKSUMS, "its total does not match its lines"));
        }
        let mut lines = body.lines();
        if lines.next() != Some("checksums format version: 1") {
            return Err(bad(CHECKSUMS, "unknown format version"));
        }
        let count: usize = lines
            .next()
            .and_then(|l| l.strip_suffix(" files:"))
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| bad(CHECKSUMS, "bad file count line"))?;
        let mut files = BTreeMap::new();
        for line in lines {
            let f: Vec<&str> = line.split('\t').collect();
            let parsed = match f.as_slice() {
                [name, size, hash] => size
                    .parse::<u64>()
                    .ok()
                    .zip(u128::from_str_radix(hash, 16).ok())
                    .map(|(size, hash)| (name.to_string(), FileSum { size, hash })),
                _ => None,
            };
            let (name, sum) = parsed.ok_or_else(|| bad(CHECKSUMS, format!("bad line {line:?}")))?;
            files.insert(name, sum);
        }
        if files.len() != count {
            return Err(bad(CHECKSUMS, format!("says {count} files, lists {}", files.len())));
        }
        Ok(Checksums { files })
    }

    /// The hash of the data files' checksums, in name order: a part's
    /// content identity (what an insert's block id is made of).
    pub fn content_hash(&self) -> u128 {
        let mut h = Sip128::default();
        for (name, sum) in &self.files {
            h.update(name.as_bytes());
            h.update(&[0]);
            h.update(&sum.size.to_le_bytes());
            h.update(&sum.hash.to_le_bytes());
        }
        h.finish()
    }
}

fn column_file(name: &str) -> String {
    format!("{name}.bin")
}

fn encode_column(c: &ColumnData) -> Vec<u8> {
    let mut out = Vec::new();
    match c {
        ColumnData::UInt64(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        ColumnData::Int64(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        ColumnData::String(v) => {
            for s in v {
                let mut n = s.len() as u64;
                loop {
                    let b = (n & 0x7f) as u8;
                    n >>= 7;
                    out.push(if n == 0 { b } else { b | 0x80 });
                    if n == 0 {
                        break;
                    }
                }
                out.extend_from_slice(s.as_bytes());
            }
        }
    }
    out
}

fn decode_column(name: &str, ty: ColumnType, bytes: &[u8], rows: usize) -> Result<ColumnData, PartError> {
    let bad = |why: String| bad(&column_file(name), why);
    let fixed = |width: usize| -> Result<Vec<[u8; 8]>, PartError> {
        if bytes.len() != rows * width {
            return Err(bad(format!("{} bytes for {rows} rows", bytes.len())));
        }
        Ok(bytes.chunks_exact(8).map(|c| c.try_into().expect("8 bytes")).collect())
    };
    Ok(match ty {
        ColumnType::UInt64 => ColumnData::UInt64(fixed(8)?.into_iter().map(u64::from_le_bytes).collect()),
        ColumnType::Int64 => ColumnData::Int64(fixed(8)?.into_iter().map(i64::from_le_bytes).collect()),
        ColumnType::String => {
            let mut v = Vec::with_capacity(rows.min(1 << 16));
            let mut at = 0usize;
            for r in 0..rows {
                let mut len: u64 = 0;
                let mut shift = 0;
                loop {
                    let Some(&b) = bytes.get(at) else {
                        return Err(bad(format!("ends inside row {r}'s length")));
                    };
                    at += 1;
                    len |= ((b & 0x7f) as u64) << shift;
                    if b & 0x80 == 0 {
                        break;
                    }
                    shift += 7;
                    if shift > 35 {
                        return Err(bad(format!("row {r}: length prefix too long")));
                    }
                }
                let end = at
                    .checked_add(len as usize)
                    .filter(|&e| e <= bytes.len())
                    .ok_or_else(|| bad(format!("row {r}: {len} bytes run past the end")))?;
                let s = std::str::from_utf8(&bytes[at..end]).map_err(|_| bad(format!("row {r}: not UTF-8")))?;
                v.push(s.to_string());
                at = end;
            }
            if at != bytes.len() {
                return Err(bad(format!("{} bytes after the last row", bytes.len() - at)));
            }
            ColumnData::String(v)
        }
    })
}

fn encode_columns(schema: &Schema) -> Vec<u8> {
    let mut s = format!("columns format version: 1\n{} columns:\n", schema.columns.len());
    for c in &schema.columns {
        s.push_str(&format!("`{}` {}\n", c.name, c.ty.name()));
    }
    s.into_bytes()
}

/// The files of a part holding `block` (sorted by the caller), with
/// `checksums.txt` last computed over the others.
pub fn encode_part(schema: &Schema, block: &Block) -> BTreeMap<String, Vec<u8>> {
    debug_assert!(block.is_sorted(schema));
    let mut files = BTreeMap::new();
    files.insert(COLUMNS.to_string(), encode_columns(schema));
    files.insert(COUNT.to_string(), block.rows().to_string().into_bytes());
    for (c, data) in schema.columns.iter().zip(&block.columns) {
        files.insert(column_file(&c.name), encode_column(data));
    }
    let sums = Checksums::of(&files);
    files.insert(CHECKSUMS.to_string(), sums.encode());
    files
}

/// The file names a part of `schema` has, `checksums.txt` included.
pub fn part_file_names(schema: &Schema) -> Vec<String> {
    let mut names: Vec<String> = [CHECKSUMS, COLUMNS, COUNT].iter().map(|s| s.to_string()).collect();
    names.extend(schema.columns.iter().map(|c| column_file(&c.name)));
    names.sort();
    names
}

/// Checks that `files` are exactly a part of `schema` whose every file
/// matches `checksums.txt`; returns the checksums.
pub fn verify(schema: &Schema, files: &BTreeMap<String, Vec<u8>>) -> Result<Checksums, PartError> {
    let sums = Checksums::decode(
        files
            .get(CHECKSUMS)
            .ok_or_else(|| PartError::Missing(CHECKSUMS.into()))?,
    )?;
    let expected = part_file_names(schema);
    let listed: Vec<&String> = sums.files.keys().collect();
    let want: Vec<&String> = expected.iter().filter(|n| n.as_str() != CHECKSUMS).collect();
    if listed != want {
        return Err(bad(CHECKSUMS, format!("lists {listed:?}, the schema has {want:?}")));
    }
    for (name, sum) in &sums.files {
        let bytes = files.get(name).ok_or_else(|| PartError::Missing(name.clone()))?;
        if bytes.len() as u64 != sum.size {
            return Err(bad(
                name,
                format!("{} bytes, {CHECKSUMS} says {}", bytes.len(), sum.size),
            ));
        }
        if sip128(bytes) != sum.hash {
            return Err(bad(name, "checksum mismatch"));
        }
    }
    if let Some(extra) = files.keys().find(|n| !expected.contains(n)) {
        return Err(PartError::Unexpected(extra.clone()));
    }
    if files[COLUMNS] != encode_columns(schema) {
        return Err(bad(COLUMNS, "does not match the table's columns"));
    }
    Ok(sums)
}

/// Verifies and decodes a part's rows.
pub fn decode_part(schema: &Schema, files: &BTreeMap<String, Vec<u8>>) -> Result<Block, PartError> {
    verify(schema, files)?;
    let rows: usize = std::str::from_utf8(&files[COUNT])
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|&n| n <= ROWS_MAX)
        .ok_or_else(|| bad(COUNT, "not a row count"))?;
    let mut columns = Vec::with_capacity(schema.columns.len());
    for c in &schema.columns {
        columns.push(decode_column(&c.name, c.ty, &files[&column_file(&c.name)], rows)?);
    }
    Ok(Block { columns })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{PartitionKey, Value};

    fn schema() -> Schema {
        let cols = [
            ("id", ColumnType::UInt64),
            ("n", ColumnType::Int64),
            ("s", ColumnType::String),
        ];
        Schema::new("t", &cols, PartitionKey::None, vec![0])
    }

    fn block() -> Block {
        let rows = (0..50u64)
            .map(|i| {
                vec![
                    Value::UInt64(i),
                    Value::Int64(-(i as i64)),
                    Value::String("é".repeat(i as usize * 3)),
                ]
            })
            .collect();
        Block::from_rows(&schema(), rows).unwrap()
    }

    #[test]
    fn a_part_round_trips() {
        let files = encode_part(&schema(), &block());
        assert_eq!(files.keys().cloned().collect::<Vec<_>>(), part_file_names(&schema()));
        assert_eq!(decode_part(&schema(), &files).unwrap(), block());
    }

    #[test]
    fn every_flipped_or_truncated_byte_is_refused() {
        let files = encode_part(&schema(), &block());
        for name in files.keys() {
            let len = files[name].len();
            for at in [0, len / 2, len - 1] {
                let mut bad = files.clone();
                bad.get_mut(name).unwrap()[at] ^= 0x01;
                assert!(decode_part(&schema(), &bad).is_err(), "{name} flipped at {at}");
            }
            let mut bad = files.clone();
            bad.get_mut(name).unwrap().truncate(len - 1);
            assert!(decode_part(&schema(), &bad).is_err(), "{name} truncated");
            let mut bad = files.clone();
            bad.remove(name);
            assert!(decode_part(&schema(), &bad).is_err(), "{name} missing");
        }
    }

    #[test]
    fn content_hash_depends_on_content_only() {
        let a = verify(&schema(), &encode_part(&schema(), &block())).unwrap();
        let b = verify(&schema(), &encode_part(&schema(), &block())).unwrap();
        assert_eq!(a.content_hash(), b.content_hash());
        let other = block().take(&[0, 1]);
        let c = verify(&schema(), &encode_part(&schema(), &other)).unwrap();
        assert_ne!(a.content_hash(), c.content_hash());
    }
}
