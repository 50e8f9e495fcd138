//! Sequential specifications the linearizability search checks against.
//!
//! A model interns its states and operations as small integers so the
//! search hashes and compares `u32`s, never JSON: two ops with the same `f`
//! and value get the same code (the search uses that to treat identical
//! indeterminate ops as interchangeable), and equal states get equal ids.
//!
//! Semantics (docs/ARCHITECTURE.md, "History", and Jepsen's): a register starts
//! at `null`, and a read that returns `null` means the register holds `null`
//! — it is not a wildcard.

use serde_json::Value;
use std::collections::HashMap;

/// The models `drift check --model` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum ModelKind {
    CasRegister,
    Kv,
}

impl ModelKind {
    pub const ALL: [ModelKind; 2] = [ModelKind::CasRegister, ModelKind::Kv];

    pub fn name(self) -> &'static str {
        match self {
            ModelKind::CasRegister => "cas-register",
            ModelKind::Kv => "kv",
        }
    }

    pub fn parse(s: &str) -> Option<ModelKind> {
        ModelKind::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// A sequential specification over interned states and ops.
pub trait Model {
    /// True when `f` never changes the state; such an op with an unknown
    /// outcome constrains nothing and is dropped before the search.
    fn is_read_only(&self, f: &str) -> bool;
    /// Interns an operation from its `f` and the value it is judged by, or
    /// says why the value has the wrong shape.
    fn encode(&mut self, f: &str, value: &Value) -> Result<u32, String>;
    fn init(&mut self) -> u32;
    /// The state after applying `op` in state `s`, or `None` when the op's
    /// recorded result is impossible in `s`.
    fn step(&mut self, s: u32, op: u32) -> Option<u32>;
    fn show_state(&self, s: u32) -> String;
    fn show_op(&self, op: u32) -> String;
    /// What the op does, where the model can say it in register terms
    /// (the cheap proofs, dropping useless indeterminate ops and windows
    /// that start from any state rely on it); `Shape::Opaque` otherwise.
    fn shape(&self, op: u32) -> Shape;
    /// A state no op names — it stands for "any other value" when a window
    /// of the history is judged from every state. `None` when the model's
    /// states are open-ended (an append builds new ones), so no finite set
    /// stands for all of them.
    fn fresh_state(&mut self) -> Option<u32>;
}

/// An op in register terms: which state it needs before it, which it
/// leaves after. Every state the model has is one such value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Needs the state to be `v`, leaves it.
    Read(u32),
    /// Leaves `v`, whatever came before.
    Write(u32),
    /// Needs `expected`, leaves `new`.
    Cas(u32, u32),
    /// Anything else: what it needs or leaves depends on the state.
    Opaque,
}

impl Shape {
    /// The state the op needs before it, if it needs one.
    pub fn needs(self) -> Option<u32> {
        match self {
            Shape::Read(v) | Shape::Cas(v, _) => Some(v),
            Shape::Write(_) | Shape::Opaque => None,
        }
    }

    /// The state the op leaves, when it does not depend on the state.
    pub fn leaves(self) -> Option<u32> {
        match self {
            Shape::Write(v) | Shape::Cas(_, v) => Some(v),
            Shape::Read(_) | Shape::Opaque => None,
        }
    }
}

/// The text of the state [`Model::fresh_state`] makes: not valid JSON, so
/// no op's value can be it.
const FRESH_TEXT: &str = "(any other value)";

/// JSON values interned as ids; id 0 is `null`.
#[derive(Default)]
struct Values {
    ids: HashMap<String, u32>,
    /// Integers seen, by value: most histories' values are integers, and
    /// this spares writing and hashing their text.
    ints: HashMap<i64, u32, rustc_hash::FxBuildHasher>,
    shown: Vec<Shown>,
}

/// How an interned value is shown.
enum Shown {
    Int(i64),
    Text(String),
}

impl Values {
    fn new() -> Self {
        let mut v = Values::default();
        v.intern_text("null".to_string());
        v
    }

    fn intern(&mut self, value: &Value) -> u32 {
        match value {
            Value::Null => 0,
            Value::Number(n) => match n.as_i64() {
                Some(i) => {
                    let next = self.shown.len() as u32;
                    let id = *self.ints.entry(i).or_insert(next);
                    if id == next {
                        self.shown.push(Shown::Int(i));
                    }
                    id
                }
                None => self.intern_text(value.to_string()),
            },
            _ => self.intern_text(value.to_string()),
        }
    }

    fn intern_text(&mut self, text: String) -> u32 {
        if let Some(&id) = self.ids.get(&text) {
            return id;
        }
        let id = self.shown.len() as u32;
        self.ids.insert(text.clone(), id);
        self.shown.push(Shown::Text(text));
        id
    }

    fn show(&self, id: u32) -> String {
        match &self.shown[id as usize] {
            Shown::Int(i) => i.to_string(),
            Shown::Text(t) => t.clone(),
        }
    }
}

/// Interned ops of one model.
struct Ops<T> {
    ids: HashMap<T, u32, rustc_hash::FxBuildHasher>,
    list: Vec<T>,
}

impl<T: Clone + Eq + std::hash::Hash> Ops<T> {
    fn new() -> Self {
        Ops {
            ids: HashMap::default(),
            list: Vec::new(),
        }
    }

    fn intern(&mut self, op: T) -> u32 {
        if let Some(&id) = self.ids.get(&op) {
            return id;
        }
        let id = self.list.len() as u32;
        self.ids.insert(op.clone(), id);
        self.list.push(op);
        id
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum RegOp {
    Read(u32),
    Write(u32),
    Cas(u32, u32),
}

/// A compare-and-set register: `read` / `write` / `cas [expected, new]`.
pub struct CasRegister {
    values: Values,
    ops: Ops<RegOp>,
    /// The state every key starts in.
    init: u32,
}

impl CasRegister {
    /// A register that starts at `null`.
    pub fn new() -> Self {
        CasRegister::with_init(&Value::Null)
    }

    /// A register that starts at `init`.
    pub fn with_init(init: &Value) -> Self {
        let mut values = Values::new();
        let init = values.intern(init);
        CasRegister {
            values,
            ops: Ops::new(),
            init,
        }
    }
}

impl Default for CasRegister {
    fn default() -> Self {
        Self::new()
    }
}

impl Model for CasRegister {
    fn is_read_only(&self, f: &str) -> bool {
        f == "read"
    }

    fn encode(&mut self, f: &str, value: &Value) -> Result<u32, String> {
        let op = match f {
            "read" => RegOp::Read(self.values.intern(value)),
            "write" => RegOp::Write(self.values.intern(value)),
            "cas" => match value.as_array().map(Vec::as_slice) {
                Some([expected, new]) => RegOp::Cas(self.values.intern(expected), self.values.intern(new)),
                _ => return Err(format!("cas value must be [expected, new], got {value}")),
            },
            _ => {
                return Err(format!(
                    "the cas-register model has no operation `{f}` (it knows read, write, cas)"
                ))
            }
        };
        Ok(self.ops.intern(op))
    }

    fn init(&mut self) -> u32 {
        self.init
    }

    #[inline]
    fn step(&mut self, s: u32, op: u32) -> Option<u32> {
        match self.ops.list[op as usize] {
            RegOp::Read(v) => (s == v).then_some(s),
            RegOp::Write(v) => Some(v),
            RegOp::Cas(expected, new) => (s == expected).then_some(new),
        }
    }

    fn show_state(&self, s: u32) -> String {
        self.values.show(s)
    }

    fn show_op(&self, op: u32) -> String {
        match self.ops.list[op as usize] {
            RegOp::Read(v) => format!("read → {}", self.values.show(v)),
            RegOp::Write(v) => format!("write {}", self.values.show(v)),
            RegOp::Cas(a, b) => format!("cas {} → {}", self.values.show(a), self.values.show(b)),
        }
    }

    fn shape(&self, op: u32) -> Shape {
        match self.ops.list[op as usize] {
            RegOp::Read(v) => Shape::Read(v),
            RegOp::Write(v) => Shape::Write(v),
            RegOp::Cas(a, b) => Shape::Cas(a, b),
        }
    }

    fn fresh_state(&mut self) -> Option<u32> {
        Some(self.values.intern_text(FRESH_TEXT.to_string()))
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum KvOp {
    Get(u32),
    Put(u32),
    Append(u32),
}

/// One key of a string store: `get` / `put` / `append`. The key starts
/// absent (`null`); appending to an absent key stores the appended string.
pub struct Kv {
    /// Interned strings; id 0 is "absent" (`null`).
    strings: Vec<Option<String>>,
    ids: HashMap<String, u32>,
    ops: Ops<KvOp>,
    appended: HashMap<(u32, u32), u32>,
    /// The state every key starts in.
    init: u32,
}

impl Kv {
    /// Keys that start absent.
    pub fn new() -> Self {
        Kv {
            strings: vec![None],
            ids: HashMap::new(),
            ops: Ops::new(),
            appended: HashMap::new(),
            init: 0,
        }
    }

    /// Keys that start at `init`: a string, or `null` (absent).
    pub fn with_init(init: &Value) -> Result<Self, String> {
        let mut kv = Kv::new();
        kv.init = match init {
            Value::Null => 0,
            Value::String(s) => kv.intern(s.clone()),
            other => return Err(format!("a kv key starts at a string or null, not {other}")),
        };
        Ok(kv)
    }

    fn intern(&mut self, s: String) -> u32 {
        if let Some(&id) = self.ids.get(&s) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.ids.insert(s.clone(), id);
        self.strings.push(Some(s));
        id
    }

    fn string_arg(&mut self, f: &str, value: &Value, allow_null: bool) -> Result<u32, String> {
        match value {
            Value::String(s) => Ok(self.intern(s.clone())),
            Value::Null if allow_null => Ok(0),
            other => Err(format!("kv `{f}` value must be a string, got {other}")),
        }
    }
}

impl Default for Kv {
    fn default() -> Self {
        Self::new()
    }
}

impl Model for Kv {
    fn is_read_only(&self, f: &str) -> bool {
        f == "get"
    }

    fn encode(&mut self, f: &str, value: &Value) -> Result<u32, String> {
        let op = match f {
            "get" => KvOp::Get(self.string_arg(f, value, true)?),
            "put" => KvOp::Put(self.string_arg(f, value, false)?),
            "append" => KvOp::Append(self.string_arg(f, value, false)?),
            _ => {
                return Err(format!(
                    "the kv model has no operation `{f}` (it knows get, put, append)"
                ))
            }
        };
        Ok(self.ops.intern(op))
    }

    fn init(&mut self) -> u32 {
        self.init
    }

    fn step(&mut self, s: u32, op: u32) -> Option<u32> {
        match self.ops.list[op as usize] {
            KvOp::Get(v) => (s == v).then_some(s),
            KvOp::Put(v) => Some(v),
            KvOp::Append(v) => {
                if s == 0 {
                    return Some(v);
                }
                if let Some(&next) = self.appended.get(&(s, v)) {
                    return Some(next);
                }
                let joined = format!(
                    "{}{}",
                    self.strings[s as usize].as_deref().unwrap_or(""),
                    self.strings[v as usize].as_deref().unwrap_or("")
                );
                let next = self.intern(joined);
                self.appended.insert((s, v), next);
                Some(next)
            }
        }
    }

    fn show_state(&self, s: u32) -> String {
        match &self.strings[s as usize] {
            None => "null".to_string(),
            Some(text) => Value::String(text.clone()).to_string(),
        }
    }

    fn show_op(&self, op: u32) -> String {
        match self.ops.list[op as usize] {
            KvOp::Get(v) => format!("get → {}", self.show_state(v)),
            KvOp::Put(v) => format!("put {}", self.show_state(v)),
            KvOp::Append(v) => format!("append {}", self.show_state(v)),
        }
    }

    fn shape(&self, op: u32) -> Shape {
        match self.ops.list[op as usize] {
            KvOp::Get(v) => Shape::Read(v),
            KvOp::Put(v) => Shape::Write(v),
            KvOp::Append(_) => Shape::Opaque,
        }
    }

    fn fresh_state(&mut self) -> Option<u32> {
        // An append makes new strings from old ones: no finite set of
        // states stands for every string.
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn null_read_means_register_holds_null() {
        let mut m = CasRegister::new();
        let read_null = m.encode("read", &Value::Null).unwrap();
        let write1 = m.encode("write", &json!(1)).unwrap();
        let s0 = m.init();
        assert_eq!(m.step(s0, read_null), Some(s0));
        let s1 = m.step(s0, write1).unwrap();
        assert_eq!(m.step(s1, read_null), None);
    }

    #[test]
    fn cas_applies_only_on_expected_value() {
        let mut m = CasRegister::new();
        let w = m.encode("write", &json!(3)).unwrap();
        let cas_ok = m.encode("cas", &json!([3, 4])).unwrap();
        let cas_bad = m.encode("cas", &json!([2, 4])).unwrap();
        let s0 = m.init();
        let s = m.step(s0, w).unwrap();
        let s4 = m.step(s, cas_ok).unwrap();
        assert_eq!(m.show_state(s4), "4");
        assert_eq!(m.step(s, cas_bad), None);
        assert!(m.encode("cas", &json!(3)).is_err());
        assert!(m.encode("incr", &json!(3)).is_err());
    }

    #[test]
    fn identical_ops_share_a_code() {
        let mut m = CasRegister::new();
        assert_eq!(
            m.encode("write", &json!(7)).unwrap(),
            m.encode("write", &json!(7)).unwrap()
        );
        assert_ne!(
            m.encode("write", &json!(7)).unwrap(),
            m.encode("write", &json!(8)).unwrap()
        );
    }

    #[test]
    fn kv_append_concatenates_and_get_compares() {
        let mut m = Kv::new();
        let a = m.encode("append", &json!("a")).unwrap();
        let b = m.encode("append", &json!("b")).unwrap();
        let get_ab = m.encode("get", &json!("ab")).unwrap();
        let get_null = m.encode("get", &Value::Null).unwrap();
        let s0 = m.init();
        assert!(m.step(s0, get_null).is_some());
        let s = m.step(s0, a).unwrap();
        let s = m.step(s, b).unwrap();
        assert_eq!(m.step(s, get_ab), Some(s));
        assert!(m.encode("put", &json!(1)).is_err());
    }
}
