//! Histories as other tools write them: Jepsen's EDN (every public etcd
//! history, rendered as EDN, judges as its JSON Lines original), and the
//! initial values Knossos and Porcupine assume.

use drift_checkers::linear::model::ModelKind;
use drift_checkers::linear::Linearizable;
use drift_checkers::{CheckContext, Checker, History, Verdict};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

fn etcd_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/histories/etcd");
    if dir.is_dir() {
        return Some(dir);
    }
    // the histories live beside the clone, not in it: a fresh clone says
    // NOT RUN; CI (`CI=true`), which has them, fails without them
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{} is absent, and CI=true: CI must have the etcd histories beside the clone",
        dir.display()
    );
    eprintln!(
        "NOT RUN: {} is absent (the etcd histories are read in place)",
        dir.display()
    );
    None
}

/// A JSON value as EDN.
fn edn(v: &Value) -> String {
    match v {
        Value::Null => "nil".into(),
        Value::Array(items) => format!("[{}]", items.iter().map(edn).collect::<Vec<_>>().join(" ")),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!(":{k} {}", edn(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

/// A JSON Lines history rendered as Jepsen writes `history.edn`: one map
/// per line, keywords for type, f and the nemesis.
fn render_edn(jsonl: &str) -> String {
    let mut out = String::new();
    for line in jsonl.lines().filter(|l| !l.trim().is_empty()) {
        let op: Value = serde_json::from_str(line).unwrap();
        let process = match &op["process"] {
            Value::String(s) => format!(":{s}"),
            p => p.to_string(),
        };
        out.push_str(&format!(
            "{{:index {}, :time {}, :type :{}, :process {process}, :f :{}, :value {}}}\n",
            op["index"],
            op["time"],
            op["type"].as_str().unwrap(),
            op["f"].as_str().unwrap(),
            edn(&op["value"])
        ));
    }
    out
}

fn verdict(path: &Path, model: ModelKind, init: Value) -> Verdict {
    let h = History::load(path).unwrap_or_else(|e| panic!("{e}"));
    let c = Linearizable {
        model,
        explain: false,
        init,
        tuning: Default::default(),
    };
    c.check(&h, &CheckContext::new(None, 1 << 30)).unwrap().verdict
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("drift-foreign-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn every_etcd_history_judges_the_same_from_its_edn_rendering() {
    let Some(dir) = etcd_dir() else { return };
    let out = scratch("etcd");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 102);
    let (mut valid, mut invalid) = (0, 0);
    for f in files {
        let edn_path = out.join(f.file_stem().unwrap()).with_extension("edn");
        std::fs::write(&edn_path, render_edn(&std::fs::read_to_string(&f).unwrap())).unwrap();
        let want = verdict(&f, ModelKind::CasRegister, Value::Null);
        assert_eq!(
            verdict(&edn_path, ModelKind::CasRegister, Value::Null),
            want,
            "{}",
            f.display()
        );
        match want {
            Verdict::Valid => valid += 1,
            Verdict::Invalid => invalid += 1,
            Verdict::Unknown => panic!("{}: unknown", f.display()),
        }
    }
    assert!(
        valid > 0 && invalid > 0,
        "both verdicts occur: {valid} valid, {invalid} invalid"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// Writes `lines` ((process, type, f, value, key)) as JSON Lines.
fn jsonl(dir: &Path, name: &str, lines: &[(u64, &str, &str, Value, Option<&str>)]) -> PathBuf {
    let path = dir.join(name);
    let text: String = lines
        .iter()
        .enumerate()
        .map(|(i, (p, t, f, v, k))| {
            let mut op = json!({"index": i, "time": i * 10, "process": p, "type": t, "f": f, "value": v});
            if let Some(k) = k {
                op["key"] = json!(k);
            }
            format!("{op}\n")
        })
        .collect();
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_kv_key_read_before_any_write_is_judged_by_the_initial_value() {
    let dir = scratch("kv-init");
    // Porcupine's key/value histories: a get of a key nobody wrote is ""
    let path = jsonl(
        &dir,
        "kv.jsonl",
        &[
            (0, "invoke", "get", Value::Null, Some("x")),
            (0, "ok", "get", json!(""), Some("x")),
            (1, "invoke", "put", json!("a"), Some("x")),
            (1, "ok", "put", json!("a"), Some("x")),
            (0, "invoke", "get", Value::Null, Some("x")),
            (0, "ok", "get", json!("a"), Some("x")),
        ],
    );
    assert_eq!(verdict(&path, ModelKind::Kv, json!("")), Verdict::Valid);
    assert_eq!(verdict(&path, ModelKind::Kv, Value::Null), Verdict::Invalid);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_register_read_before_any_write_is_judged_by_the_initial_value() {
    let dir = scratch("cas-init");
    // Knossos's (cas-register 0)
    let path = jsonl(
        &dir,
        "cas.jsonl",
        &[
            (0, "invoke", "read", Value::Null, None),
            (0, "ok", "read", json!(0), None),
            (1, "invoke", "cas", json!([0, 5]), None),
            (1, "ok", "cas", json!([0, 5]), None),
        ],
    );
    assert_eq!(verdict(&path, ModelKind::CasRegister, json!(0)), Verdict::Valid);
    assert_eq!(verdict(&path, ModelKind::CasRegister, Value::Null), Verdict::Invalid);
    let _ = std::fs::remove_dir_all(&dir);
}
