//! The harness's modules import one way: no circle among them (a module
//! that names `crate::x` depends on `x`). Commands and backends share
//! what they share through modules of their own (`servers.rs`, `run.rs`,
//! `settle.rs`, `events.rs`), not through each other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each top-level module of `src` and the top-level modules it names
/// through `crate::` (tests excluded).
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    let mut files = Vec::new();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            for f in std::fs::read_dir(&p).unwrap() {
                files.push((p.file_name().unwrap().to_string_lossy().into_owned(), f.unwrap().path()));
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push((p.file_stem().unwrap().to_string_lossy().into_owned(), p));
        }
    }
    for (module, path) in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.split("#[cfg(test)]\nmod tests").next().unwrap();
        let deps: &mut BTreeSet<String> = out.entry(module.clone()).or_default();
        for (i, _) in text.match_indices("crate::") {
            let name: String = text[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && name != module {
                deps.insert(name);
            }
        }
    }
    out
}

/// A circle of modules, if there is one (depth-first search).
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        v: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(v.to_string(), 1);
        path.push(v.to_string());
        for w in graph.get(v).into_iter().flatten() {
            if !graph.contains_key(w) {
                continue;
            }
            match state.get(w.as_str()).copied().unwrap_or(0) {
                1 => {
                    let from = path.iter().position(|p| p == w).unwrap();
                    return Some(path[from..].to_vec());
                }
                0 => {
                    if let Some(c) = visit(w, graph, state, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(v.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for v in graph.keys() {
        if state.get(v.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(v, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn the_harness_modules_import_one_way() {
    let graph = imports(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(graph.len() > 30, "read the harness's modules: {:?}", graph.keys());
    assert!(
        graph["campaign"].contains("run"),
        "campaign uses run: the reading works"
    );
    if let Some(c) = circle(&graph) {
        panic!("a circle of imports: {}", c.join(" → "));
    }
}

#[test]
fn a_circle_is_found() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    g.entry("c".into()).or_default().insert("a".into());
    g.entry("d".into()).or_default().insert("a".into());
    assert_eq!(circle(&g).unwrap().len(), 3);
    g.get_mut("c").unwrap().clear();
    assert_eq!(circle(&g), None);
}
