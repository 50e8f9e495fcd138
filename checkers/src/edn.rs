//! Jepsen's `history.edn`, read as a drift history.
//!
//! A Jepsen run stores its history as EDN: one operation map per line
//! (or, in older files and knossos's test data, one vector or list of
//! them), with keywords for `:type`,
//! `:f` and `:process :nemesis`, nanosecond `:time`, and values that are
//! numbers, `nil`, strings, vectors (`[0 3]` for a cas) or maps. Keyed
//! workloads (`jepsen.independent`) wrap every client value in a
//! `[key value]` tuple. Older files have no `:index` or `:time`; newer
//! ones may print each operation as a `#jepsen.history.Op{…}` record.
//!
//! What this reader does with them:
//! * the operations' order is the file's; `index` is the position (a
//!   Jepsen index, where present, is the same for a whole history);
//! * `time` is `:time`; a file without times gets each operation's index,
//!   and the report says the times are not nanoseconds;
//! * a history whose every client value is a two-element vector, with a
//!   read or write among them or a cas whose second element is itself a
//!   pair, is keyed: `[k v]` becomes `key` k and `value` v;
//! * keywords become strings without their colon; `:error` becomes a
//!   string (a keyword's name, a string, or the EDN as printed);
//! * EDN's `#inst` and `#uuid` in a value become their strings; any other
//!   tag but `#jepsen.history.Op` is an error, as is anything that is not
//!   EDN: every error names the file and the line.
//!
//! Parsing is `clojure-reader`'s (a maintained EDN reader that reports
//! line and column); this module maps its values onto [`Op`].

use crate::history::{HistoryError, Location, Op, OpType, Process};
use crate::name::Name;
use clojure_reader::edn::{self, Edn};
use serde_json::{Map, Number, Value};
use std::path::Path;

/// The record tag a newer Jepsen prints operations with.
const OP_RECORD_TAG: &str = "jepsen.history.Op";

/// Whether the file at `path` is EDN: by its name (`.edn`), else by its
/// first characters (an EDN map opens `{:`, JSON Lines open `{"`).
pub fn is_edn(path: &Path, head: &[u8]) -> bool {
    if path.extension().is_some_and(|e| e == "edn") {
        return true;
    }
    let text = String::from_utf8_lossy(head);
    let t = text.trim_start();
    t.starts_with("{:") || t.starts_with('[') || t.starts_with('(') || t.starts_with("#jepsen") || t.starts_with(';')
}

/// An operation map as read, before keyed values are unwrapped.
struct Raw {
    line: u64,
    process: Process,
    kind: OpType,
    f: String,
    value: Value,
    time: Option<i64>,
    node: Option<String>,
    error: Option<String>,
}

/// Reads the history at `path`: its ops and the line each starts on.
pub fn read(path: &Path) -> Result<(Vec<Op>, Vec<u64>), HistoryError> {
    let at = |line: u64, reason: String| HistoryError {
        at: Location {
            file: path.to_path_buf(),
            line,
        },
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| at(1, format!("cannot read: {e}")))?;
    let raws = parse(&text).map_err(|(line, reason)| at(line, reason))?;
    let keyed = is_keyed(&raws);
    let timed = raws.iter().all(|r| r.time.is_some());
    let mut ops = Vec::with_capacity(raws.len());
    let mut lines = Vec::with_capacity(raws.len());
    for (i, r) in raws.into_iter().enumerate() {
        let (key, value) = match (&r.process, keyed, r.value) {
            (Process::Client(_), true, Value::Array(mut kv)) if kv.len() == 2 => {
                let v = kv.pop().expect("two elements");
                let k = kv.pop().expect("two elements");
                (Some(key_text(&k)), v)
            }
            (_, _, v) => (None, v),
        };
        ops.push(Op {
            index: i as u64,
            time: if timed { r.time.unwrap_or(0) } else { i as i64 },
            process: r.process,
            kind: r.kind,
            f: r.f.into(),
            value,
            key: key.map(Name::from),
            node: r.node.map(Name::from),
            error: r.error,
        });
        lines.push(r.line);
    }
    Ok((ops, lines))
}

fn key_text(k: &Value) -> String {
    match k {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Every operation of `text`, one top-level form each (or the elements of
/// one top-level vector or list, as knossos's own files hold them, `;`
/// comments among them); (line, reason) on the first error.
fn parse(text: &str) -> Result<Vec<Raw>, (u64, String)> {
    // an error at the end of the text is on its last line, not on the
    // empty one after its final newline
    let last_line = text.lines().count().max(1) as u64;
    parse_lines(text).map_err(|(line, reason)| (line.min(last_line), reason))
}

fn parse_lines(text: &str) -> Result<Vec<Raw>, (u64, String)> {
    let mut out = Vec::new();
    let mut rest = skip_blank(text);
    let mut lines = Lines::new(text);
    let opened_on = lines.at(rest);
    // one top-level vector or list of operations, or operations one by one
    let close = match rest.as_bytes().first() {
        Some(b'[') => Some(']'),
        Some(b'(') => Some(')'),
        _ => None,
    };
    let open = if close == Some(']') { '[' } else { '(' };
    if close.is_some() {
        rest = skip_blank(&rest[1..]);
    }
    loop {
        let line = lines.at(rest);
        if rest.is_empty() {
            if close.is_some() {
                return Err((
                    opened_on,
                    format!("unbalanced bracket: the history's `{open}` (line {opened_on}) is never closed"),
                ));
            }
            return Ok(out);
        }
        if let Some(c) = close.filter(|c| rest.starts_with(*c)) {
            let after = skip_blank(&rest[1..]);
            if !after.is_empty() {
                return Err((lines.at(after), format!("text after the history's closing `{c}`")));
            }
            return Ok(out);
        }
        let (form, left) = edn::read(rest).map_err(|e| {
            let reason = format!("not EDN: {:?}", e.code);
            (line + e.line.map_or(0, |l| l as u64 - 1), reason)
        })?;
        out.push(op_of(&form, line).map_err(|reason| (line, reason))?);
        rest = skip_blank(left);
    }
}

/// `s` without leading white space, commas (white space in EDN) and
/// `;` comments.
fn skip_blank(mut s: &str) -> &str {
    loop {
        s = s.trim_start_matches(|c: char| c.is_whitespace() || c == ',');
        match s.strip_prefix(';') {
            Some(comment) => s = comment.find('\n').map_or("", |i| &comment[i..]),
            None => return s,
        }
    }
}

/// Line numbers of suffixes of one text, asked in order: each call
/// counts only the newlines since the last (linear in the text, not
/// quadratic).
struct Lines<'t> {
    text: &'t str,
    pos: usize,
    line: u64,
}

impl<'t> Lines<'t> {
    fn new(text: &'t str) -> Self {
        Lines { text, pos: 0, line: 1 }
    }

    /// The 1-based line `rest` (a suffix of the text, at or after the
    /// last one asked) starts on.
    fn at(&mut self, rest: &str) -> u64 {
        let pos = self.text.len() - rest.len();
        debug_assert!(pos >= self.pos, "suffixes asked in order");
        self.line += self.text.as_bytes()[self.pos..pos]
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u64;
        self.pos = pos;
        self.line
    }
}

/// One operation from its EDN map.
fn op_of(form: &Edn<'_>, line: u64) -> Result<Raw, String> {
    let map = match form {
        Edn::Map(m) => m,
        Edn::Tagged(tag, inner) if *tag == OP_RECORD_TAG => match inner.as_ref() {
            Edn::Map(m) => m,
            _ => return Err(format!("#{OP_RECORD_TAG} must tag a map")),
        },
        Edn::Tagged(tag, _) => return Err(format!("unknown tag #{tag} (an operation is a map)")),
        other => return Err(format!("an operation must be a map, got {}", short(other))),
    };
    let get = |k: &'static str| map.get(&Edn::Key(k));
    let kind = match get("type") {
        Some(Edn::Key(t)) => OpType::parse(t),
        _ => None,
    }
    .ok_or_else(|| "`:type` must be :invoke, :ok, :fail or :info".to_string())?;
    let process = match get("process") {
        Some(Edn::Int(p)) if *p >= 0 => Process::Client(*p as u64),
        Some(Edn::Key("nemesis")) => Process::Nemesis,
        Some(other) => return Err(format!("`:process` must be a number or :nemesis, got {}", short(other))),
        None => return Err("missing `:process`".into()),
    };
    let f = match get("f") {
        Some(Edn::Key(f) | Edn::Symbol(f) | Edn::Str(f)) => f.to_string(),
        Some(other) => return Err(format!("`:f` must be a keyword, got {}", short(other))),
        None => return Err("missing `:f`".into()),
    };
    let time = match get("time") {
        Some(Edn::Int(t)) => Some(*t),
        None | Some(Edn::Nil) => None,
        Some(other) => return Err(format!("`:time` must be an integer, got {}", short(other))),
    };
    let value = match get("value") {
        Some(v) => json_of(v)?,
        None => Value::Null,
    };
    let text = |k: &'static str| -> Option<String> {
        match get(k)? {
            Edn::Nil => None,
            Edn::Key(s) | Edn::Str(s) | Edn::Symbol(s) => Some(s.to_string()),
            other => Some(other.to_string()),
        }
    };
    Ok(Raw {
        line,
        process,
        kind,
        f,
        value,
        time,
        node: text("node"),
        error: text("error"),
    })
}

/// An EDN value as JSON: keywords and symbols as their names, lists,
/// vectors and sets as arrays, maps as objects (keys as text).
fn json_of(v: &Edn<'_>) -> Result<Value, String> {
    Ok(match v {
        Edn::Nil => Value::Null,
        Edn::Bool(b) => Value::Bool(*b),
        Edn::Int(i) => Value::Number((*i).into()),
        Edn::Double(d) => Number::from_f64(d.0).map_or(Value::String(d.0.to_string()), Value::Number),
        Edn::Rational((n, d)) => {
            Number::from_f64(*n as f64 / *d as f64).map_or(Value::String(format!("{n}/{d}")), Value::Number)
        }
        Edn::Str(s) | Edn::Key(s) | Edn::Symbol(s) => Value::String(s.to_string()),
        Edn::Char(c) => Value::String(c.to_string()),
        Edn::Vector(items) | Edn::List(items) => Value::Array(items.iter().map(json_of).collect::<Result<_, _>>()?),
        Edn::Set(items) => Value::Array(items.iter().map(json_of).collect::<Result<_, _>>()?),
        Edn::Map(m) => {
            let mut out = Map::new();
            for (k, v) in m {
                let key = match k {
                    Edn::Str(s) | Edn::Key(s) | Edn::Symbol(s) => s.to_string(),
                    other => other.to_string(),
                };
                out.insert(key, json_of(v)?);
            }
            Value::Object(out)
        }
        // EDN's two built-in tags: an instant and a UUID, each a string
        Edn::Tagged(tag, inner) if *tag == "inst" || *tag == "uuid" => match inner.as_ref() {
            Edn::Str(s) => Value::String(s.to_string()),
            other => return Err(format!("#{tag} must tag a string, not {}", short(other))),
        },
        Edn::Tagged(tag, _) => return Err(format!("unknown tag #{tag} in a value")),
        other => return Err(format!("a value drift cannot read: {}", short(other))),
    })
}

/// A value as an error message shows it: the EDN, cut short.
fn short(v: &Edn<'_>) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        format!("{}…", s.chars().take(60).collect::<String>())
    } else {
        s
    }
}

/// Whether every client value is a `[key value]` tuple of
/// `jepsen.independent`: all two-element vectors, and some op that a
/// plain register would not write as a pair (a read or write, or a cas
/// whose second element is itself a pair).
fn is_keyed(raws: &[Raw]) -> bool {
    let client: Vec<&Raw> = raws.iter().filter(|r| r.process != Process::Nemesis).collect();
    let pair = |v: &Value| v.as_array().is_some_and(|a| a.len() == 2);
    !client.is_empty()
        && client.iter().all(|r| pair(&r.value))
        && client
            .iter()
            .any(|r| r.f != "cas" || r.value.as_array().is_some_and(|a| pair(&a[1])))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_str(text: &str) -> Result<(Vec<Op>, Vec<u64>), HistoryError> {
        // one directory per call: tests run in parallel, and two texts
        // may be of one length
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("drift-edn-{}-{call}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.edn");
        std::fs::write(&path, text).unwrap();
        let out = read(&path);
        let _ = std::fs::remove_dir_all(&dir);
        out
    }

    #[test]
    fn jepsen_operation_maps_become_ops() {
        let (ops, lines) = read_str(
            "{:type :invoke, :f :cas, :value [1 2], :process 0, :time 10, :index 0}\n\
             {:type :info, :f :start, :value nil, :process :nemesis, :time 20}\n\
             {:type :fail, :f :cas, :value [1 2], :process 0, :time 30, :error [:precondition \"no\"]}\n",
        )
        .unwrap();
        assert_eq!(lines, [1, 2, 3]);
        assert_eq!(ops[0].value, serde_json::json!([1, 2]));
        assert_eq!(
            (ops[0].kind, ops[0].f.as_str(), ops[0].time),
            (OpType::Invoke, "cas", 10)
        );
        assert_eq!(ops[1].process, Process::Nemesis);
        assert_eq!(ops[2].error.as_deref(), Some("[:precondition \"no\"]"));
        assert!(ops.iter().all(|o| o.key.is_none()), "a plain cas register is not keyed");
    }

    #[test]
    fn independent_tuples_become_keys_and_a_missing_time_becomes_the_index() {
        let (ops, _) = read_str(
            "[{:type :invoke :f :read :value [3 nil] :process 1}\n\
              {:type :ok :f :read :value [3 4] :process 1}\n\
              {:type :invoke :f :cas :value [\"k\" [4 5]] :process 2}]",
        )
        .unwrap();
        assert_eq!(ops[1].key.as_deref(), Some("3"));
        assert_eq!(ops[1].value, serde_json::json!(4));
        assert_eq!(ops[2].key.as_deref(), Some("k"));
        assert_eq!(ops[2].value, serde_json::json!([4, 5]));
        assert_eq!(ops.iter().map(|o| o.time).collect::<Vec<_>>(), [0, 1, 2]);
    }

    #[test]
    fn a_newer_jepsen_record_reads_as_its_map() {
        let (ops, _) =
            read_str("#jepsen.history.Op{:index 0 :time 5 :type :invoke :process 0 :f :write :value 3}").unwrap();
        assert_eq!(ops[0].value, serde_json::json!(3));
    }

    /// The shape of knossos's own test histories: one top-level list, `;`
    /// comments between the operations (and a vector the same way).
    #[test]
    fn a_history_as_one_list_or_vector_with_comments_reads_like_one_map_per_line() {
        let list = "({:type :invoke, :f :write, :value 0, :process 0}\n \
                    {:type :ok, :f :write, :value 0, :process 0}\n \
                    ; then a read, concurrent with nothing\n \
                    {:type :invoke, :f :read, :value nil, :process 1}\n \
                    ; it read what no one wrote\n \
                    {:type :ok, :f :read, :value 3, :process 1}\n)\n";
        let (ops, lines) = read_str(list).unwrap();
        assert_eq!(ops.len(), 4);
        assert_eq!(lines, [1, 2, 4, 6]);
        assert_eq!((ops[3].kind, ops[3].value.clone()), (OpType::Ok, serde_json::json!(3)));
        let (same, _) = read_str(&list.replacen('(', "[", 1).replace("\n)\n", "\n]\n")).unwrap();
        assert_eq!(same, ops);
        let e = read_str("({:type :invoke :f :read :value nil :process 0}\n").unwrap_err();
        assert!(e.reason.contains("the history's `(` (line 1) is never closed"), "{e}");
        let e = read_str("({:type :invoke :f :read :value nil :process 0})\n{:x 1}").unwrap_err();
        assert!(e.reason.contains("text after the history's closing `)`"), "{e}");
        assert!(is_edn(Path::new("h"), b"({:type :invoke"));
    }

    #[test]
    fn builtin_tags_in_a_value_read_as_their_strings() {
        let (ops, _) = read_str(concat!(
            "{:type :invoke :f :write :value #uuid \"f81d4fae-7dec-11d0-a765-00a0c91e6bf6\" :process 0}\n",
            "{:type :ok :f :write :value #inst \"1985-04-12T23:20:50.52Z\" :process 0}\n",
        ))
        .unwrap();
        assert_eq!(ops[0].value, serde_json::json!("f81d4fae-7dec-11d0-a765-00a0c91e6bf6"));
        assert_eq!(ops[1].value, serde_json::json!("1985-04-12T23:20:50.52Z"));
        let e = read_str("{:type :invoke :f :write :value #inst 5 :process 0}\n").unwrap_err();
        assert!(e.reason.contains("#inst must tag a string"), "{e}");
    }

    #[test]
    fn bad_edn_names_the_line() {
        let e = read_str("{:type :invoke :f :read :value nil :process 0}\n{:type :ok :f :read :value [1 :process 0}\n")
            .unwrap_err();
        assert_eq!(e.at.line, 2, "{e}");
        let e = read_str("{:type :invoke :f :read :value nil :process 0}\n#foo/bar {:x 1}\n").unwrap_err();
        assert_eq!(e.at.line, 2);
        assert!(e.reason.contains("unknown tag #foo/bar"), "{e}");
        let e = read_str("[{:type :invoke :f :read :value nil :process 0}\n").unwrap_err();
        assert!(e.reason.contains("unbalanced"), "{e}");
        assert_eq!(e.at.line, 1, "the line of the `[`, not the one past the end: {e}");
        // a form cut off by the end of a file that ends in a newline
        let e = read_str("{:type :invoke :f :read :value nil :process 0}\n{:type :ok :f :read\n").unwrap_err();
        assert_eq!(e.at.line, 2, "{e}");
        let e = read_str("{:type :begin :f :read :process 0}").unwrap_err();
        assert!(e.reason.contains("`:type`"), "{e}");
    }
}
