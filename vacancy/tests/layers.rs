//! The crate's modules form the layers `ARCHITECTURE.md` writes down: a
//! module's code imports only modules on lower layers, and no file imports a
//! file that imports it back. Read from the sources, so an upward import
//! fails here, naming the file and the line, before it tangles the layers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path inside the crate, from the root: `["proxy", "service"]`.
type ModPath = Vec<String>;

/// One source file's non-test code.
struct Source {
    module: ModPath,
    file: String,
    code: String,
}

fn crate_root() -> PathBuf {
    source_dir("vacancy")
}

/// The `src/` of a crate of the workspace.
fn source_dir(krate: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src")
}

/// Every product file under `src/`: unit-test files and `mod tests` blocks
/// may reach anywhere, and the binaries sit on top of everything.
fn sources() -> Vec<Source> {
    sources_of("vacancy")
}

/// The product files of one crate of the workspace.
fn sources_of(krate: &str) -> Vec<Source> {
    let root = source_dir(krate);
    let mut out = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if path.is_dir() {
                if rel != "bin" && !rel.ends_with("/tests") && rel != "tests" {
                    dirs.push(path);
                }
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !name.ends_with(".rs") || name == "tests.rs" || name.ends_with("_tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            out.push(Source {
                module: module_of(&rel),
                file: format!("{krate}/src/{rel}"),
                code: product_code(&text),
            });
        }
    }
    out
}

/// `shell/mod.rs` → `shell`, `shell/proxy/service.rs` → `shell::proxy::service`, `lib.rs` → root.
fn module_of(rel: &str) -> ModPath {
    let mut parts: ModPath = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The text without its test module, line comments and `#[cfg(test)]` items
/// of one line.
fn product_code(text: &str) -> String {
    let text = text
        .split("#[cfg(test)]\nmod tests {")
        .next()
        .unwrap_or_default();
    let mut out = String::new();
    let mut skip_next = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if skip_next {
            skip_next = false;
            out.push('\n');
            continue;
        }
        if trimmed.starts_with("#[cfg(test)]") || trimmed.starts_with("#[cfg(all(test") {
            skip_next = true;
        }
        let code = if trimmed.starts_with("//") {
            ""
        } else {
            line.split(" // ").next().unwrap_or_default()
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Every path the code names that starts at `crate::`, `super::` or
/// `self::`, resolved to a path from the root, with the line it stands on.
/// `crate::{a::X, b::Y}` names both `a::X` and `b::Y`.
fn references(src: &Source) -> Vec<(ModPath, usize)> {
    let mut out = Vec::new();
    let bytes = src.code.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        let starts = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|s| bytes[i..].starts_with(s.as_bytes()) && (i == 0 || !is_ident(bytes[i - 1])));
        let Some(_) = starts else {
            i += 1;
            continue;
        };
        let line = bytes[..i].iter().filter(|&&b| b == b'\n').count() + 1;
        let end = path_end(&src.code, i);
        for path in expand(&String::from_utf8_lossy(&bytes[i..end])) {
            if let Some(abs) = absolute(&src.module, &path) {
                out.push((abs, line));
            }
        }
        i = end.max(i + 1);
    }
    out
}

/// Where a path that starts at `start` ends: after its last segment or its
/// closing brace group.
fn path_end(code: &str, start: usize) -> usize {
    let bytes = code.as_bytes();
    let mut i = start;
    let mut depth = 0usize;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'{' => depth += 1,
            b'}' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ if depth > 0 => {}
            b':' => {}
            _ if b.is_ascii_alphanumeric() || b == b'_' => {}
            _ => return i,
        }
        i += 1;
    }
    i
}

/// `crate::{a::X, b::{Y, Z}}` → `crate::a::X`, `crate::b::Y`, `crate::b::Z`.
fn expand(path: &str) -> Vec<Vec<String>> {
    let compact: String = path.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = compact.find('{') else {
        return vec![
            compact
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
        ];
    };
    let prefix: Vec<String> = compact[..open]
        .split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let inner = &compact[open + 1..compact.len().saturating_sub(1)];
    let mut parts = Vec::new();
    let (mut depth, mut from) = (0usize, 0usize);
    for (k, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&inner[from..k]);
                from = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[from..]);
    let mut out = Vec::new();
    for part in parts.into_iter().filter(|p| !p.is_empty()) {
        for tail in expand(part) {
            let mut full = prefix.clone();
            full.extend(tail.into_iter().filter(|s| s != "self"));
            out.push(full);
        }
    }
    out
}

/// A `crate::`/`super::`/`self::` path as a path from the root.
fn absolute(module: &ModPath, path: &[String]) -> Option<ModPath> {
    let mut segments = path.iter();
    let mut base = match path.first()?.as_str() {
        "crate" => {
            segments.next();
            Vec::new()
        }
        _ => module.clone(),
    };
    let mut rest = Vec::new();
    for s in segments {
        match s.as_str() {
            "super" if rest.is_empty() => {
                base.pop()?;
            }
            "self" if rest.is_empty() => {}
            _ => rest.push(s.clone()),
        }
    }
    base.extend(rest);
    Some(base)
}

/// The layers, lowest first, from the fenced `layers` block of ARCHITECTURE.md.
fn layers() -> Vec<Vec<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let block = text
        .split("```layers\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("ARCHITECTURE.md has a ```layers block");
    block
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default())
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The modules `lib.rs` declares, with a module whose folders the layers
/// name one by one (`shell::state`) replaced by the modules its `mod.rs`
/// declares.
fn declared_modules(layers: &[Vec<String>]) -> BTreeSet<String> {
    let declared = |file: &Path| -> Vec<String> {
        let text = std::fs::read_to_string(file).unwrap();
        text.lines()
            .filter_map(|l| {
                l.trim()
                    .strip_prefix("pub mod ")
                    .or_else(|| l.trim().strip_prefix("mod "))
            })
            .map(|l| l.trim_end_matches(';').trim().to_owned())
            .filter(|m| m != "test_prereq")
            .collect()
    };
    let split: BTreeSet<&str> = layers
        .iter()
        .flatten()
        .filter_map(|name| name.split_once("::").map(|(parent, _)| parent))
        .collect();
    let mut out = BTreeSet::new();
    for module in declared(&crate_root().join("lib.rs")) {
        if split.contains(module.as_str()) {
            for inner in declared(&crate_root().join(&module).join("mod.rs")) {
                out.insert(format!("{module}::{inner}"));
            }
        } else {
            out.insert(module);
        }
    }
    out
}

/// The layer a module path stands on: its longest prefix the layers name
/// (`shell::proxy::service` stands on `shell::proxy`), with that name.
fn layer_of<'a>(path: &[String], layer_of: &BTreeMap<&'a str, usize>) -> Option<(&'a str, usize)> {
    (1..=path.len()).rev().find_map(|k| {
        let name = path[..k].join("::");
        layer_of.get_key_value(name.as_str()).map(|(n, l)| (*n, *l))
    })
}

/// Every upward or sideways import between layers, as
/// `file:line: a imports b (layer n over m)`; a name a module re-exports is
/// followed to the file that defines it.
fn layer_violations(sources: &[Source], layers: &[Vec<String>]) -> Vec<String> {
    let by_name: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(n, mods)| mods.iter().map(move |m| (m.as_str(), n)))
        .collect();
    let files: BTreeSet<ModPath> = sources.iter().map(|s| s.module.clone()).collect();
    let exports = re_exports(sources);
    let mut out = Vec::new();
    for src in sources {
        let Some((from, from_layer)) = layer_of(&src.module, &by_name) else {
            continue;
        };
        for (target, line) in references(src) {
            let target = file_of(&target, &files, &exports).unwrap_or(target);
            let Some((to, to_layer)) = layer_of(&target, &by_name) else {
                continue;
            };
            if to == from {
                continue;
            }
            if to_layer >= from_layer {
                out.push(format!(
                    "{}:{line}: `{from}` (layer {from_layer}) imports `{to}` (layer {to_layer}); a module imports only from lower layers",
                    src.file
                ));
            }
        }
    }
    out
}

/// Each `pub use x::Name` of a module file: the name and the module it comes from.
fn re_exports(sources: &[Source]) -> BTreeMap<ModPath, BTreeMap<String, ModPath>> {
    let mut out: BTreeMap<ModPath, BTreeMap<String, ModPath>> = BTreeMap::new();
    for src in sources {
        for stmt in src.code.split(';') {
            let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
                continue;
            };
            let rest = if rest.starts_with("crate::")
                || rest.starts_with("super::")
                || rest.starts_with("self::")
            {
                rest.to_owned()
            } else {
                format!("self::{rest}")
            };
            for path in expand(&rest) {
                if let (Some(name), Some(abs)) = (path.last(), absolute(&src.module, &path)) {
                    let from = abs[..abs.len() - 1].to_vec();
                    out.entry(src.module.clone())
                        .or_default()
                        .insert(name.clone(), from);
                }
            }
        }
    }
    out
}

/// The file a path lands in: its longest prefix that is a file, followed
/// through that file's re-exports.
fn file_of(
    path: &[String],
    files: &BTreeSet<ModPath>,
    exports: &BTreeMap<ModPath, BTreeMap<String, ModPath>>,
) -> Option<ModPath> {
    let mut path = path.to_vec();
    for _ in 0..8 {
        let k = (0..=path.len())
            .rev()
            .find(|&k| files.contains(&path[..k]))?;
        let file = path[..k].to_vec();
        match path.get(k).and_then(|name| exports.get(&file)?.get(name)) {
            Some(from) if from != &file => {
                let mut next = from.clone();
                next.extend(path[k..].iter().cloned());
                path = next;
            }
            _ => return Some(file),
        }
    }
    None
}

/// The file-level import graph, without a file's imports of its own
/// ancestors (their `mod` declarations make those edges structural).
fn file_graph(sources: &[Source]) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let files: BTreeSet<ModPath> = sources.iter().map(|s| s.module.clone()).collect();
    let exports = re_exports(sources);
    let mut graph: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for src in sources {
        for (target, _) in references(src) {
            if let Some(file) = file_of(&target, &files, &exports)
                && file != src.module
                && !src.module.starts_with(&file)
                && !file.starts_with(&src.module)
            {
                graph.entry(src.module.clone()).or_default().insert(file);
            }
        }
    }
    graph
}

/// A cycle in the graph, if there is one, as its files in order.
fn find_cycle(graph: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Option<Vec<ModPath>> {
    fn visit(
        node: &ModPath,
        graph: &BTreeMap<ModPath, BTreeSet<ModPath>>,
        done: &mut BTreeSet<ModPath>,
        stack: &mut Vec<ModPath>,
    ) -> Option<Vec<ModPath>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.clone());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

#[test]
fn every_module_stands_on_exactly_one_layer() {
    let layers = layers();
    let listed: Vec<&String> = layers.iter().flatten().collect();
    let unique: BTreeSet<&String> = listed.iter().copied().collect();
    assert_eq!(
        listed.len(),
        unique.len(),
        "a module is on two layers: {layers:?}"
    );
    let listed: BTreeSet<String> = unique.into_iter().cloned().collect();
    assert_eq!(
        listed,
        declared_modules(&layers),
        "ARCHITECTURE.md's layers and lib.rs's modules differ"
    );
}

#[test]
fn no_module_imports_from_its_own_layer_or_above() {
    let violations = layer_violations(&sources(), &layers());
    assert!(
        violations.is_empty(),
        "upward imports:\n{}",
        violations.join("\n")
    );
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    for krate in ["vacancy", "vacancy-adapters", "vacancy-cli", "vacancy-py"] {
        let graph = file_graph(&sources_of(krate));
        if let Some(cycle) = find_cycle(&graph) {
            let names: Vec<String> = cycle.iter().map(|m| m.join("::")).collect();
            panic!("import cycle in {krate}: {}", names.join(" -> "));
        }
    }
}

#[test]
fn the_reader_sees_grouped_relative_and_re_exported_imports() {
    let src = Source {
        module: vec!["shell".into(), "proxy".into(), "service".into()],
        file: "x.rs".into(),
        code: "use crate::{engine::Refusal, time::{Moment, MonotonicClock}};\nuse super::exchange::Exchange;\nfn f() { crate::ledger::Ledger::open(); }\n".into(),
    };
    let refs: Vec<String> = references(&src)
        .into_iter()
        .map(|(p, l)| format!("{}@{l}", p.join("::")))
        .collect();
    assert_eq!(
        refs,
        [
            "engine::Refusal@1",
            "time::Moment@1",
            "time::MonotonicClock@1",
            "shell::proxy::exchange::Exchange@2",
            "ledger::Ledger::open@3"
        ]
    );
    // An upward import is caught, with its file and line, between top-level
    // layers and between the folders of one module that the layers name.
    let layers = vec![
        vec!["time".to_owned()],
        vec!["engine".to_owned()],
        vec!["shell::state".to_owned()],
        vec!["shell::proxy".to_owned()],
    ];
    let engine = Source {
        module: vec!["engine".into()],
        file: "vacancy/src/engine/mod.rs".into(),
        code: "use crate::time::Moment;\nuse crate::shell::state::lender::Lender;\n".into(),
    };
    let lender = Source {
        module: vec!["shell".into(), "state".into(), "lender".into()],
        file: "vacancy/src/shell/state/lender.rs".into(),
        code: "use crate::engine::Engine;\nuse super::live::Live;\nuse crate::shell::proxy::exchange::Exchange;\n".into(),
    };
    assert_eq!(
        layer_violations(&[engine, lender], &layers),
        [
            "vacancy/src/engine/mod.rs:2: `engine` (layer 1) imports `shell::state` (layer 2); a module imports only from lower layers",
            "vacancy/src/shell/state/lender.rs:3: `shell::state` (layer 2) imports `shell::proxy` (layer 3); a module imports only from lower layers",
        ]
    );
}
