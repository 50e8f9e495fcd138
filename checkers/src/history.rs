//! The history: drift's JSON Lines record of a run (docs/ARCHITECTURE.md, "History", normative).
//!
//! One operation per line. The reader streams and validates line by line,
//! so a history of any length is read in constant memory per line and every
//! error names the file and the line. Validation here is *syntactic and
//! per-line* (JSON, fields, `type`, dense `index`); the pairing rules
//! (completion without invoke, second invoke on a busy process) live in
//! [`crate::pairing`], which consumes this reader.
//!
//! The writer appends one line per operation and flushes after each, so a
//! crash of the controller leaves a checkable prefix.

use crate::name::{Interner, Name};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Longest history line the reader accepts. A longer line is an error, not
/// an allocation the size of whatever the file holds (a final read of a set
/// with a million elements is about 8 MiB).
pub const LINE_BYTES_MAX: usize = 64 << 20;

/// The kind of a history line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpType {
    Invoke,
    Ok,
    Fail,
    Info,
}

impl OpType {
    pub fn parse(s: &str) -> Option<OpType> {
        Some(match s {
            "invoke" => OpType::Invoke,
            "ok" => OpType::Ok,
            "fail" => OpType::Fail,
            "info" => OpType::Info,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OpType::Invoke => "invoke",
            OpType::Ok => "ok",
            OpType::Fail => "fail",
            OpType::Info => "info",
        }
    }
}

/// Who performed an operation: a logical single-threaded client, or the
/// nemesis (node-side events and faults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Process {
    Client(u64),
    Nemesis,
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Process::Client(p) => write!(f, "{p}"),
            Process::Nemesis => f.write_str("nemesis"),
        }
    }
}

impl Serialize for Process {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Process::Client(p) => s.serialize_u64(*p),
            Process::Nemesis => s.serialize_str("nemesis"),
        }
    }
}

/// One line of a history.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Op {
    pub index: u64,
    pub time: i64,
    pub process: Process,
    #[serde(rename = "type")]
    pub kind: OpType,
    pub f: Name,
    pub value: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<Name>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<Name>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where a history came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub file: PathBuf,
    /// 1-based line number.
    pub line: u64,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// A history that cannot be read: what is wrong and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {reason}")]
pub struct HistoryError {
    pub at: Location,
    pub reason: String,
}

/// Streams validated [`Op`]s out of a JSONL history file.
///
/// Guarantees for every op it yields: the line was one JSON object with all
/// required fields of the right types, `type` is one of the four kinds, and
/// `index` equals the number of ops before it (dense from 0). Blank lines
/// are skipped. After the first error the reader yields nothing more.
pub struct HistoryReader<R> {
    input: R,
    file: PathBuf,
    line: u64,
    next_index: u64,
    buf: Vec<u8>,
    failed: bool,
    names: Interner,
}

impl HistoryReader<BufReader<File>> {
    /// Opens a history file. An unreadable file is an error at line 0.
    pub fn open(path: &Path) -> Result<Self, HistoryError> {
        let file = File::open(path).map_err(|e| HistoryError {
            at: Location {
                file: path.to_path_buf(),
                line: 0,
            },
            reason: format!("cannot open: {e}"),
        })?;
        Ok(Self::new(BufReader::with_capacity(1 << 16, file), path))
    }
}

impl<R: BufRead> HistoryReader<R> {
    pub fn new(input: R, file: &Path) -> Self {
        HistoryReader {
            input,
            file: file.to_path_buf(),
            line: 0,
            next_index: 0,
            buf: Vec::new(),
            failed: false,
            names: Interner::new(),
        }
    }

    /// Number of ops yielded so far.
    pub fn ops_read(&self) -> u64 {
        self.next_index
    }

    /// The location of the line most recently read.
    pub fn location(&self) -> Location {
        Location {
            file: self.file.clone(),
            line: self.line,
        }
    }

    fn error(&mut self, reason: String) -> HistoryError {
        self.failed = true;
        HistoryError {
            at: self.location(),
            reason,
        }
    }

    /// Reads one raw line into `self.buf`; false at end of input.
    fn read_line(&mut self) -> Result<Option<bool>, HistoryError> {
        self.buf.clear();
        let mut limited = std::io::Read::take(&mut self.input, LINE_BYTES_MAX as u64 + 1);
        let n = limited.read_until(b'\n', &mut self.buf).map_err(|e| {
            let line = self.line + 1;
            self.failed = true;
            HistoryError {
                at: Location {
                    file: self.file.clone(),
                    line,
                },
                reason: format!("read error: {e}"),
            }
        })?;
        if n == 0 {
            return Ok(None);
        }
        self.line += 1;
        if self.buf.len() > LINE_BYTES_MAX {
            return Err(self.error(format!("line longer than {LINE_BYTES_MAX} bytes (LINE_BYTES_MAX)")));
        }
        let terminated = self.buf.last() == Some(&b'\n');
        Ok(Some(terminated))
    }
}

impl<R: BufRead> Iterator for HistoryReader<R> {
    type Item = Result<Op, HistoryError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        loop {
            let terminated = match self.read_line() {
                Ok(Some(t)) => t,
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            };
            // a well-formed line needs no more than this (serde_json
            // checks the UTF-8 of its strings, and skips whitespace)
            if let Some(op) = parse_op_fast(&self.buf, self.next_index, &mut self.names) {
                self.next_index += 1;
                return Some(Ok(op));
            }
            let text = match std::str::from_utf8(&self.buf) {
                Ok(t) => t.trim(),
                Err(e) => {
                    return Some(Err(self.error(format!("not UTF-8: {e}"))));
                }
            };
            if text.is_empty() {
                continue;
            }
            let parsed = parse_op_checked(text, self.next_index, &mut self.names);
            return Some(match parsed {
                Ok(op) => {
                    self.next_index += 1;
                    Ok(op)
                }
                Err(reason) => {
                    let reason = if !terminated && reason.starts_with("not JSON") {
                        format!("truncated line (no newline at end of file): {reason}")
                    } else {
                        reason
                    };
                    Err(self.error(reason))
                }
            });
        }
    }
}

/// A well-formed line, deserialized straight into its fields: no map of
/// the line's keys is built, and the strings are borrowed from the line
/// (to be interned). Anything this cannot take (a wrong type, a missing
/// field, a repeated one, a string with escapes) goes to
/// [`parse_op_checked`], which says what is wrong.
#[derive(Deserialize)]
struct FastLine<'a> {
    index: u64,
    time: i64,
    process: RawProcess,
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(borrow)]
    f: &'a str,
    value: Value,
    #[serde(default, borrow)]
    key: Option<RawKey<'a>>,
    #[serde(default, borrow)]
    node: Option<&'a str>,
    #[serde(default)]
    error: Option<Value>,
}

/// A `process` as a line writes it: a client's number, or "nemesis"
/// (anything else fails the fast path).
struct RawProcess(Process);

impl<'de> Deserialize<'de> for RawProcess {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = RawProcess;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a non-negative integer or \"nemesis\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RawProcess, E> {
                Ok(RawProcess(Process::Client(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawProcess, E> {
                match v {
                    "nemesis" => Ok(RawProcess(Process::Nemesis)),
                    _ => Err(E::custom("not a process")),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A `key` as a line writes it: a string, or an integer (read as its
/// decimal text).
enum RawKey<'a> {
    Text(&'a str),
    Number(u64),
    Signed(i64),
}

impl<'de: 'a, 'a> Deserialize<'de> for RawKey<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = RawKey<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an integer")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RawKey<'a>, E> {
                Ok(RawKey::Number(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<RawKey<'a>, E> {
                Ok(RawKey::Signed(v))
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<RawKey<'a>, E> {
                Ok(RawKey::Text(v))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// The fast path of [`parse_op`]: `None` where the line needs the careful
/// one (also for every line that is wrong, so errors read the same).
fn parse_op_fast(line: &[u8], expected_index: u64, names: &mut Interner) -> Option<Op> {
    let op = parse_op_any_index(line, names)?;
    (op.index == expected_index).then_some(op)
}

/// [`parse_op_fast`] whatever index the line carries (the caller checks
/// that the indices are dense).
fn parse_op_any_index(line: &[u8], names: &mut Interner) -> Option<Op> {
    let l: FastLine = serde_json::from_slice(line).ok()?;
    let key = match l.key {
        None => None,
        Some(RawKey::Text(s)) => Some(names.name(s)),
        Some(RawKey::Number(n)) => Some(names.name(&n.to_string())),
        Some(RawKey::Signed(n)) => Some(names.name(&n.to_string())),
    };
    let error = match l.error {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(other) => Some(other.to_string()),
    };
    Some(Op {
        index: l.index,
        time: l.time,
        process: l.process.0,
        kind: OpType::parse(l.kind)?,
        f: names.name(l.f),
        value: l.value,
        key,
        node: l.node.map(|n| names.name(n)),
        error,
    })
}

/// [`parse_op`] field by field, naming the first thing that is wrong.
fn parse_op_checked(text: &str, expected_index: u64, names: &mut Interner) -> Result<Op, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(mut m) = v else {
        return Err("not a JSON object".to_string());
    };
    let mut take = |name: &str| m.remove(name).ok_or_else(|| format!("missing field `{name}`"));

    let index = take("index")?;
    let index = index
        .as_u64()
        .ok_or_else(|| format!("field `index` must be a non-negative integer, got {index}"))?;
    if index != expected_index {
        return Err(format!("index {index} is not dense: expected {expected_index}"));
    }
    let time = take("time")?;
    let time = time
        .as_i64()
        .ok_or_else(|| format!("field `time` must be an integer (nanoseconds), got {time}"))?;
    let process = match take("process")? {
        Value::Number(n) => Process::Client(
            n.as_u64()
                .ok_or_else(|| format!("field `process` must be a non-negative integer or \"nemesis\", got {n}"))?,
        ),
        Value::String(s) if s == "nemesis" => Process::Nemesis,
        other => {
            return Err(format!(
                "field `process` must be a non-negative integer or \"nemesis\", got {other}"
            ))
        }
    };
    let kind = match take("type")? {
        Value::String(s) => {
            OpType::parse(&s).ok_or_else(|| format!("unknown type \"{s}\": expected invoke, ok, fail or info"))?
        }
        other => return Err(format!("field `type` must be a string, got {other}")),
    };
    let f = match take("f")? {
        Value::String(s) => names.name(&s),
        other => return Err(format!("field `f` must be a string, got {other}")),
    };
    let value = take("value")?;
    let key = match m.remove("key") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(names.name(&s)),
        Some(Value::Number(n)) => Some(names.name(&n.to_string())),
        Some(other) => return Err(format!("field `key` must be a string (or an integer), got {other}")),
    };
    let opt_string = |m: &mut serde_json::Map<String, Value>, name: &str| match m.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(format!("field `{name}` must be a string, got {other}")),
    };
    let node = opt_string(&mut m, "node")?.map(|n| names.name(&n));
    let error = match m.remove("error") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        // Jepsen writes structured errors; keep them readable.
        Some(other) => Some(other.to_string()),
    };
    Ok(Op {
        index,
        time,
        process,
        kind,
        f,
        value,
        key,
        node,
        error,
    })
}

/// Smallest file [`read_parallel`] splits between threads.
const PARALLEL_BYTES_MIN: u64 = 4 << 20;

/// Ops a reading thread of a later piece hands over at a time.
const CHUNK_OPS: usize = 1 << 14;

/// What a reading thread of a later piece sends the first: ops with
/// their lines (counted from its piece's start), then its line count; or
/// `None` when its piece cannot be read on the fast path.
enum Piece {
    Chunk(Vec<Op>, Vec<u64>),
    Done(u64),
}

/// Reads a JSON Lines history of well-formed lines on several threads:
/// the file is cut at line ends into one piece per thread, and each
/// thread streams its piece through a buffer of its own and parses it on
/// the fast path (the file is never held whole: fresh memory, which the
/// kernel must clear page by page, costs more here than the parsing).
/// The first thread's list has room for every op; the others hand theirs
/// over in chunks as they go, which it moves in once its own piece is
/// read — so it is given a smaller piece, and the moving overlaps the
/// others' parsing rather than following it.
/// Returns the ops and each op's 1-based line, or `None` when anything is
/// off (a line the fast path cannot take, indices that are not dense, a
/// line over [`LINE_BYTES_MAX`], a file too small to be worth it), so
/// that the caller reads it again with [`HistoryReader`], which says what
/// is wrong and where.
pub fn read_parallel(path: &Path, threads: usize) -> Option<(Vec<Op>, Vec<u64>)> {
    use std::io::{Read, Seek, SeekFrom};
    use std::sync::mpsc;
    let len = std::fs::metadata(path).ok()?.len();
    if threads < 2 || len < PARALLEL_BYTES_MIN {
        return None;
    }
    // piece boundaries, each just after a newline; the first piece, whose
    // thread also moves the others' ops in, is about 0.85 of the others
    let weights: Vec<f64> = (0..threads).map(|t| if t == 0 { 0.85 } else { 1.0 }).collect();
    let total: f64 = weights.iter().sum();
    let mut cuts = vec![0u64];
    let mut line = Vec::new();
    let mut share = 0.0;
    for w in &weights[..threads - 1] {
        share += w / total;
        let want = (len as f64 * share) as u64;
        let mut f = File::open(path).ok()?;
        f.seek(SeekFrom::Start(want)).ok()?;
        line.clear();
        let n = BufReader::new(f.take(LINE_BYTES_MAX as u64 + 1))
            .read_until(b'\n', &mut line)
            .ok()?;
        if line.last() != Some(&b'\n') {
            return None;
        }
        let at = want + n as u64;
        if at > *cuts.last().expect("one cut") && at < len {
            cuts.push(at);
        }
    }
    cuts.push(len);
    // lines in the file, about: the first piece's list has room for all
    let per_line = 80;
    let room = len as usize / per_line;
    // parses `from..to`, giving each op and its line (from the piece's
    // start) to `put`; the piece's line count, or `None` when the fast
    // path cannot take it (or `put` says stop)
    let parse = |from: u64, to: u64, put: &mut dyn FnMut(Op, u64) -> bool| -> Option<u64> {
        let mut names = Interner::new();
        let mut f = File::open(path).ok()?;
        f.seek(SeekFrom::Start(from)).ok()?;
        let mut input = BufReader::with_capacity(1 << 20, f.take(to - from));
        let mut text = Vec::with_capacity(1024);
        let mut line = 0u64;
        loop {
            // a line inside the buffer is parsed where it lies; one across
            // its end is copied out first
            let buf = input.fill_buf().ok()?;
            if buf.is_empty() {
                break;
            }
            let (op, used) = match buf.iter().position(|&b| b == b'\n') {
                Some(end) => (parse_line(&buf[..=end], &mut names)?, end + 1),
                None => {
                    text.clear();
                    (&mut input)
                        .take(LINE_BYTES_MAX as u64 + 1)
                        .read_until(b'\n', &mut text)
                        .ok()?;
                    if text.len() > LINE_BYTES_MAX {
                        return None;
                    }
                    (parse_line(&text, &mut names)?, 0)
                }
            };
            input.consume(used);
            line += 1;
            if let Some(op) = op {
                if !put(op, line) {
                    return None;
                }
            }
        }
        Some(line)
    };
    let pieces: Vec<(u64, u64)> = cuts.windows(2).map(|w| (w[0], w[1])).collect();
    let read = std::thread::scope(|scope| {
        let mut later = Vec::new();
        for &(from, to) in &pieces[1..] {
            let (tx, rx) = mpsc::channel::<Option<Piece>>();
            later.push(rx);
            let parse = &parse;
            scope.spawn(move || {
                let (mut ops, mut lines) = (Vec::with_capacity(CHUNK_OPS), Vec::with_capacity(CHUNK_OPS));
                let count = parse(from, to, &mut |op, line| {
                    ops.push(op);
                    lines.push(line);
                    if ops.len() < CHUNK_OPS {
                        return true;
                    }
                    let chunk = Piece::Chunk(
                        std::mem::replace(&mut ops, Vec::with_capacity(CHUNK_OPS)),
                        std::mem::replace(&mut lines, Vec::with_capacity(CHUNK_OPS)),
                    );
                    // the first thread gave up: stop too
                    tx.send(Some(chunk)).is_ok()
                });
                let end = count.map(|n| {
                    let _ = tx.send(Some(Piece::Chunk(ops, lines)));
                    Piece::Done(n)
                });
                let _ = tx.send(end);
            });
        }
        let (mut ops, mut lines) = (Vec::with_capacity(room), Vec::with_capacity(room));
        let (from, to) = pieces[0];
        let mut before = parse(from, to, &mut |op, line| {
            ops.push(op);
            lines.push(line);
            true
        })?;
        for rx in later {
            loop {
                match rx.recv().ok()?? {
                    Piece::Chunk(o, l) => {
                        lines.extend(l.into_iter().map(|x| x + before));
                        ops.extend(o);
                    }
                    Piece::Done(n) => {
                        before += n;
                        break;
                    }
                }
            }
        }
        Some((ops, lines))
    });
    let (ops, lines) = read?;
    ops.iter()
        .enumerate()
        .all(|(i, op)| op.index == i as u64)
        .then_some((ops, lines))
}

/// One line for [`read_parallel`]: `Some(None)` for a blank one, `None`
/// for one the fast path cannot take.
fn parse_line(text: &[u8], names: &mut Interner) -> Option<Option<Op>> {
    if text.iter().all(u8::is_ascii_whitespace) {
        return Some(None);
    }
    parse_op_any_index(text, names).map(Some)
}

/// Appends ops to a history file, one line each, assigning dense indices.
///
/// Every append is flushed to the OS before it returns, so a crash of the
/// controller leaves every appended line readable (the OS, not drift, then
/// owns durability; call [`HistoryWriter::sync`] where that matters).
pub struct HistoryWriter {
    out: BufWriter<File>,
    path: PathBuf,
    next_index: u64,
}

impl HistoryWriter {
    /// Creates (or truncates) a history file.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).write(true).truncate(true).open(path)?;
        Ok(HistoryWriter {
            out: BufWriter::new(file),
            path: path.to_path_buf(),
            next_index: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The index the next appended op will get.
    pub fn next_index(&self) -> u64 {
        self.next_index
    }

    /// Appends `op` with its `index` replaced by the next dense index, and
    /// returns that index.
    pub fn append(&mut self, op: &Op) -> std::io::Result<u64> {
        let index = self.append_buffered(op)?;
        self.out.flush()?;
        Ok(index)
    }

    /// Like [`HistoryWriter::append`] but leaves the line in the buffer
    /// until [`HistoryWriter::flush`]: for a writer that flushes whenever
    /// it has nothing queued (many lines per write call, same prefix
    /// guarantee once flushed).
    pub fn append_buffered(&mut self, op: &Op) -> std::io::Result<u64> {
        let index = self.next_index;
        let mut line = serde_json::to_vec(&Op { index, ..op.clone() }).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.out.write_all(&line)?;
        self.next_index += 1;
        Ok(index)
    }

    /// Hands buffered lines to the OS.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    /// Forces appended lines to stable storage.
    pub fn sync(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        self.out.get_ref().sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_str(s: &str) -> Vec<Result<Op, HistoryError>> {
        HistoryReader::new(s.as_bytes(), Path::new("h.jsonl")).collect()
    }

    /// A history file of `n` ops (blank lines and a nemesis line among
    /// them), over [`PARALLEL_BYTES_MIN`] when `n` is large enough.
    fn big_history(tag: &str, n: u64, bad_at: Option<u64>) -> PathBuf {
        let path = std::env::temp_dir().join(format!("drift-history-{tag}-{}.jsonl", std::process::id()));
        let mut text = String::new();
        for i in 0..n {
            if bad_at == Some(i) {
                text.push_str(&format!("{{\"index\":{i},\"time\":\"late\"}}\n"));
                continue;
            }
            if i % 1000 == 7 {
                text.push_str("\n  \n");
            }
            let (process, kind) = if i % 500 == 3 {
                ("\"nemesis\"".to_string(), "info")
            } else {
                ((i / 2 % 20).to_string(), if i % 2 == 0 { "invoke" } else { "ok" })
            };
            text.push_str(&format!(
                "{{\"index\":{i},\"time\":{},\"process\":{process},\"type\":\"{kind}\",\"f\":\"write\",\"value\":{{\"v\":[{i},\"x\\ty\"]}},\"key\":{},\"node\":\"n1\"}}\n",
                i * 10,
                i % 7
            ));
        }
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn reading_on_several_threads_gives_what_reading_line_by_line_gives() {
        let path = big_history("parallel", 60_000, None);
        assert!(std::fs::metadata(&path).unwrap().len() > PARALLEL_BYTES_MIN);
        let (ops, lines) = read_parallel(&path, 3).expect("well-formed, large enough");
        let mut reader = HistoryReader::open(&path).unwrap();
        let mut want = Vec::new();
        while let Some(op) = reader.next() {
            want.push((op.unwrap(), reader.location().line));
        }
        assert_eq!(ops.len(), 60_000);
        assert_eq!(ops.len(), want.len());
        for ((op, line), (w, wl)) in ops.iter().zip(&lines).zip(&want) {
            assert_eq!((op, line), (w, wl));
        }
        // a line the fast path cannot take: read line by line instead,
        // which says what is wrong and where
        // (in a later piece, whose thread hands its ops over in chunks,
        // and in the first, whose thread takes them)
        let bad = big_history("parallel-bad", 60_000, Some(45_000));
        assert!(read_parallel(&bad, 3).is_none());
        let e = HistoryReader::open(&bad).unwrap().find_map(Result::err).unwrap();
        assert!(e.reason.contains("`time`"), "{e}");
        let bad_first = big_history("parallel-bad-first", 60_000, Some(100));
        assert!(read_parallel(&bad_first, 3).is_none());
        let _ = std::fs::remove_file(bad_first);
        // small files are not worth the threads
        let small = big_history("parallel-small", 100, None);
        assert!(read_parallel(&small, 3).is_none());
        for p in [path, bad, small] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn reads_valid_lines_and_skips_blank_ones() {
        let ops = read_str(
            "{\"index\":0,\"time\":0,\"process\":0,\"type\":\"invoke\",\"f\":\"read\",\"value\":null}\n\n\
             {\"index\":1,\"time\":5,\"process\":\"nemesis\",\"type\":\"info\",\"f\":\"kill\",\"value\":[\"n1\"],\"key\":7}\n\
             {\"index\":2,\"time\":6,\"process\":1,\"type\":\"invoke\",\"f\":\"re\\u0061d\",\"value\":null,\"key\":\"a\\\"b\",\"node\":\"n\\t1\"}\n\
             {\"index\":3,\"time\":7,\"process\":1,\"type\":\"ok\",\"f\":\"read\",\"value\":null,\"key\":-3,\"node\":null}\n",
        );
        assert_eq!(ops.len(), 4);
        let b = ops[1].as_ref().unwrap();
        assert_eq!(b.process, Process::Nemesis);
        assert_eq!(b.key.as_deref(), Some("7"));
        // strings with escapes leave the fast path and read the same
        let c = ops[2].as_ref().unwrap();
        assert_eq!(
            (c.f.as_str(), c.key.as_deref(), c.node.as_deref()),
            ("read", Some("a\"b"), Some("n\t1"))
        );
        let d = ops[3].as_ref().unwrap();
        assert_eq!((d.key.as_deref(), d.node.as_deref()), (Some("-3"), None));
    }

    #[test]
    fn error_names_file_and_line() {
        let ops = read_str(
            "{\"index\":0,\"time\":0,\"process\":0,\"type\":\"invoke\",\"f\":\"read\",\"value\":null}\n\
             {\"index\":1,\"time\":0,\"process\":0,\"type\":\"bogus\",\"f\":\"read\",\"value\":null}\n",
        );
        let e = ops[1].as_ref().unwrap_err();
        assert_eq!(
            e.to_string(),
            "h.jsonl:2: unknown type \"bogus\": expected invoke, ok, fail or info"
        );
    }

    #[test]
    fn index_must_be_dense() {
        let ops = read_str("{\"index\":1,\"time\":0,\"process\":0,\"type\":\"invoke\",\"f\":\"r\",\"value\":null}\n");
        assert!(ops[0].as_ref().unwrap_err().reason.contains("not dense"));
    }

    #[test]
    fn missing_field_is_named() {
        let ops = read_str("{\"index\":0,\"time\":0,\"type\":\"invoke\",\"f\":\"r\",\"value\":null}\n");
        assert_eq!(ops[0].as_ref().unwrap_err().reason, "missing field `process`");
    }

    #[test]
    fn truncated_last_line_is_reported_as_truncated() {
        let ops = read_str("{\"index\":0,\"time\":0,\"process\":0,\"ty");
        let e = ops[0].as_ref().unwrap_err();
        assert_eq!(e.at.line, 1);
        assert!(e.reason.starts_with("truncated line"), "{}", e.reason);
    }

    #[test]
    fn reader_stops_after_first_error() {
        let ops = read_str("x\n{}\n");
        assert_eq!(ops.len(), 1);
    }

    #[test]
    fn writer_output_reads_back_identically() {
        let dir = std::env::temp_dir().join(format!("drift-hist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.jsonl");
        let mut w = HistoryWriter::create(&path).unwrap();
        let op = Op {
            index: 99,
            time: 12,
            process: Process::Client(3),
            kind: OpType::Invoke,
            f: "cas".into(),
            value: serde_json::json!([1, 2]),
            key: Some("k".into()),
            node: Some("n1".into()),
            error: None,
        };
        assert_eq!(w.append(&op).unwrap(), 0);
        assert_eq!(
            w.append(&Op {
                kind: OpType::Ok,
                ..op.clone()
            })
            .unwrap(),
            1
        );
        w.sync().unwrap();
        let back: Vec<Op> = HistoryReader::open(&path).unwrap().map(Result::unwrap).collect();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0], Op { index: 0, ..op.clone() });
        assert_eq!(back[1].kind, OpType::Ok);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
