//! The runtime's modules in layers (issue 34): a module may use those in
//! its own layer and below; every use of a module above is an edge back up
//! the circle the review found (23 modules importing each other). None
//! remains: the list below is empty, and the test fails on any new one
//! (and on a listed one that is gone, should one ever be listed while it
//! is removed). ARCHITECTURE.md's runtime section gives the layers' meaning.
//!
//! A use is `crate::<module>` in a module's code (comments and its
//! `#[cfg(test)]` part left out), or `super::<module>` in a submodule.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Bottom first.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "base: settings, clocks, errors, counters, fixed bounds",
        &[
            "clock",
            "error",
            "faults",
            "pools",
            "timer",
            "warm",
            "compile_cache",
            "log_budget",
            "durability",
            "metrics",
            "class_metrics",
            "logs",
            "config",
            "trace",
        ],
    ),
    (
        "what a guest calls: the bindings and the services behind them",
        &[
            "host",
            "cron",
            "bookmarks",
            "app_config",
            "response",
            "sockets",
            "replies",
            "outbox",
            "awaits",
            "guest_tape",
        ],
    ),
    (
        "actors: apps, their turns, their replicas and their alarms",
        &[
            "app",
            "app_versions",
            "class_migrations",
            "recording",
            "compile_process",
            "quotas",
            "scheduler",
            "replication",
            "index",
            "restore",
            "reply",
            "idempotency",
            "actor",
            "dispatch",
            "parked",
            "node",
        ],
    ),
    (
        "the node: `Runtime`, its shared state and its handles",
        &["runtime", "alarms", "secrets", "replay"],
    ),
];

/// Edges back up that remain (user, used): none. Eight were listed when
/// the layers were drawn; moving the node's shared state to `node.rs`, the
/// outbox's dispatcher to `dispatch.rs` and the parked replies' table away
/// from the guest's `replies` interface removed them.
const KNOWN_BACK_EDGES: &[(&str, &str)] = &[];

fn strip(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    code.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn uses(code: &str, prefix: &str, modules: &BTreeSet<&str>) -> BTreeSet<String> {
    code.match_indices(prefix)
        .filter_map(|(i, _)| {
            let rest = &code[i + prefix.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            modules.contains(name.as_str()).then_some(name)
        })
        .collect()
}

/// (user, used) for every use between two top-level modules.
fn edges(modules: &BTreeSet<&str>) -> BTreeSet<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeSet::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let Some(top) = rel.trim_end_matches(".rs").split('/').next() else {
                continue;
            };
            if top == "lib" || path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let code = strip(&std::fs::read_to_string(&path).unwrap());
            let mut used = uses(&code, "crate::", modules);
            if rel.contains('/') {
                used.extend(uses(&code, "super::", modules));
            }
            for m in used {
                if m != top {
                    out.insert((top.to_owned(), m));
                }
            }
        }
    }
    out
}

#[test]
fn the_runtimes_modules_use_only_their_layer_and_below_but_for_the_listed_edges() {
    let layer: BTreeMap<&str, usize> = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(i, (_, ms))| ms.iter().map(move |m| (*m, i)))
        .collect();
    let modules: BTreeSet<&str> = layer.keys().copied().collect();
    // Every module of the crate has a layer.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for entry in std::fs::read_dir(&src).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let module = name.trim_end_matches(".rs");
        if module != "lib" && !name.ends_with(".md") {
            assert!(
                modules.contains(module),
                "src/{name}: a module with no layer in tests/layers.rs"
            );
        }
    }
    let back: BTreeSet<(String, String)> = edges(&modules)
        .into_iter()
        .filter(|(user, used)| layer[used.as_str()] > layer[user.as_str()])
        .collect();
    let known: BTreeSet<(String, String)> = KNOWN_BACK_EDGES
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let new: Vec<_> = back.difference(&known).collect();
    assert!(
        new.is_empty(),
        "modules use a layer above their own (move what they use down, or \
         pass it in): {new:?}"
    );
    let gone: Vec<_> = known.difference(&back).collect();
    assert!(
        gone.is_empty(),
        "edges back that no longer exist: remove them from KNOWN_BACK_EDGES: {gone:?}"
    );
}
