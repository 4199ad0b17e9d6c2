//! The proxy's modules form layers: none imports a module that imports it
//! back (issue 16). Read from the sources, so a new cycle fails here with
//! its path before it tangles the request path again.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The proxy modules each module's non-test code imports.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/proxy");
    let mut sources = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            // Unit tests may reach anywhere; the layering is about the code.
            let code = text
                .split("#[cfg(test)]\nmod tests")
                .next()
                .unwrap()
                .to_owned();
            sources.insert(name, code);
        }
    }
    // What mod.rs re-exports, by name: an import of `crate::proxy::Lender`
    // depends on the module that defines it.
    let mut exported = BTreeMap::new();
    for line in sources["mod"].lines() {
        if let Some(rest) = line.strip_prefix("pub use ") {
            let (module, names) = rest.trim_end_matches(';').split_once("::").unwrap();
            for name in names.trim_matches(|c| c == '{' || c == '}').split(',') {
                exported.insert(name.trim().to_owned(), module.to_owned());
            }
        }
    }
    let modules: BTreeSet<String> = sources.keys().cloned().collect();
    let resolve = |name: &str| -> Option<String> {
        if modules.contains(name) {
            Some(name.to_owned())
        } else {
            exported.get(name).cloned()
        }
    };
    let mut graph = BTreeMap::new();
    for (name, code) in &sources {
        if name == "mod" {
            continue;
        }
        let mut deps = BTreeSet::new();
        for (i, _) in code.match_indices("crate::proxy::") {
            let rest = &code[i + "crate::proxy::".len()..];
            let items: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap()];
                group.split(',').collect()
            } else {
                vec![rest]
            };
            for item in items {
                let first: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if let Some(m) = resolve(&first).filter(|m| m != name) {
                    deps.insert(m);
                }
            }
        }
        assert!(
            !code.contains("use super::"),
            "{name}.rs imports through super::; name the module (crate::proxy::...)"
        );
        graph.insert(name.clone(), deps);
    }
    graph
}

fn find_cycle(
    graph: &BTreeMap<String, BTreeSet<String>>,
    node: &str,
    path: &mut Vec<String>,
    done: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    if let Some(at) = path.iter().position(|n| n == node) {
        let mut cycle = path[at..].to_vec();
        cycle.push(node.to_owned());
        return Some(cycle);
    }
    if done.contains(node) {
        return None;
    }
    path.push(node.to_owned());
    for dep in graph.get(node).into_iter().flatten() {
        if let Some(cycle) = find_cycle(graph, dep, path, done) {
            return Some(cycle);
        }
    }
    path.pop();
    done.insert(node.to_owned());
    None
}

#[test]
fn no_proxy_module_imports_one_that_imports_it_back() {
    let graph = imports();
    // The reading sees the request path's known edges.
    assert!(graph["service"].contains("exchange"), "{graph:#?}");
    assert!(graph["tracked"].contains("lender"), "{graph:#?}");
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(cycle) = find_cycle(&graph, node, &mut Vec::new(), &mut done) {
            panic!("import cycle in proxy/: {}", cycle.join(" -> "));
        }
    }
}
