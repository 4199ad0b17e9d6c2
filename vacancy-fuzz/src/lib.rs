//! Fuzz targets for vacancy's parsers (issue 18 item 1). Each one takes
//! arbitrary bytes and checks an invariant, not only that nothing panics: a
//! broken invariant panics with what differed. `scripts/fuzz TARGET
//! [SECONDS]` runs one under AFL++; `tests/seeds.rs` runs every target over
//! its seed corpus (`corpus/TARGET/`) on every test run.

#![allow(clippy::panic)]

use serde_json::Value;
use vacancy_adapters::comfyui::stream::{FindPrompt, Flow, PromptPlace, QueueScan, Scanner};

/// The targets, by name.
pub const TARGETS: &[&str] = &[
    "comfyui_queue_scan",
    "comfyui_prompt_id",
    "config",
    "inspection",
    "journal",
    "ollama_model_name",
    "route_classification",
    "voice_result_id",
];

/// Run `target` on `input`; false for an unknown target.
pub fn run(target: &str, input: &[u8]) -> bool {
    match target {
        "comfyui_queue_scan" => comfyui_queue_scan(input),
        "comfyui_prompt_id" => comfyui_prompt_id(input),
        "config" => config(input),
        "inspection" => inspection(input),
        "journal" => journal(input),
        "route_classification" => route_classification(input),
        "ollama_model_name" => ollama_model_name(input),
        "voice_result_id" => voice_result_id(input),
        _ => return false,
    }
    true
}

/// The prompt ID the queue scan looks for.
const FIND: &str = "p-1";

/// The streaming `GET /queue` scanner (COMFY-22) agrees with a full
/// `serde_json` parse: where the parse finds the prompt, the scan finds it
/// in the same list; a reply the parse reads as a well-formed queue is never
/// an error to the scan; and a scan's `Absent` is only ever said of a reply
/// that parses. The first byte picks the chunk size the scan is fed in.
fn comfyui_queue_scan(input: &[u8]) {
    let Some((&first, reply)) = input.split_first() else {
        return;
    };
    let chunk = usize::from(first % 64) + 1;
    let mut scan = QueueScan::new(FindPrompt::new(FIND));
    let mut scanned = Ok(Flow::Continue);
    for part in reply.chunks(chunk) {
        scanned = scan.feed(part);
        if !matches!(scanned, Ok(Flow::Continue)) {
            break;
        }
    }
    let scanned = scanned.and_then(|_| scan.finish());
    let parsed = parse_as_python(reply);
    let expected = parsed.as_ref().and_then(queue_place);
    match (&scanned, expected) {
        (Ok(place), Some(want)) => assert_eq!(*place, want, "scan and parse disagree"),
        (Err(e), Some(want)) => panic!("the scan failed ({e}) on a well-formed queue ({want:?})"),
        (Ok(PromptPlace::Absent), None) => {
            panic!("the scan said Absent of a reply that is not a well-formed queue")
        }
        // Found before the scan read the rest: the rest may be anything.
        (Ok(_), None) | (Err(_), None) => {}
    }
}

/// `reply` read as ComfyUI's own Python reads JSON, which the scan follows:
/// a number beyond `f64` (`1e999`, read as infinity) and the literals
/// `NaN`, `Infinity` and `-Infinity` are values there, while `serde_json`
/// refuses them. Each one `serde_json` stops at is read as `0` (no prompt
/// ID is a number), and the parse goes on; any other error is a reply that
/// is not JSON. (A fuzz finding: `17959E0781181` in an item's extra data.)
fn parse_as_python(reply: &[u8]) -> Option<Value> {
    let mut text = reply.to_vec();
    for _ in 0..64 {
        let e = match serde_json::from_slice::<Value>(&text) {
            Ok(v) => return Some(v),
            Err(e) => e,
        };
        let at = byte_offset(&text, e.line(), e.column());
        let (start, end) = if e.to_string().starts_with("number out of range") {
            number_around(&text, at)?
        } else {
            python_literal_at(&text, at)?
        };
        text.splice(start..end, *b"0");
    }
    None
}

/// The byte where `serde_json` reports an error: `column` bytes into the
/// 1-based `line`.
fn byte_offset(text: &[u8], line: usize, column: usize) -> usize {
    let line_start = match line.checked_sub(2) {
        None => 0,
        Some(newlines_before) => text
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b == b'\n')
            .nth(newlines_before)
            .map_or(0, |(i, _)| i + 1),
    };
    (line_start + column).min(text.len())
}

/// The number token that ends at or just before `at`.
fn number_around(text: &[u8], at: usize) -> Option<(usize, usize)> {
    let is_number = |b: u8| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E');
    let mut end = at.min(text.len());
    while end > 0 && !is_number(text[end - 1]) {
        end -= 1;
        if at - end > 1 {
            return None;
        }
    }
    while end < text.len() && is_number(text[end]) {
        end += 1;
    }
    let mut start = end;
    while start > 0 && is_number(text[start - 1]) {
        start -= 1;
    }
    (start < end).then_some((start, end))
}

/// Python's `NaN`, `Infinity` or `-Infinity` where `serde_json` stopped
/// (at `at` or the byte before it).
fn python_literal_at(text: &[u8], at: usize) -> Option<(usize, usize)> {
    for start in [at.saturating_sub(1), at] {
        for literal in [&b"-Infinity"[..], b"Infinity", b"NaN"] {
            if text.get(start..start + literal.len()) == Some(literal) {
                return Some((start, start + literal.len()));
            }
        }
    }
    None
}

/// Where a parsed `GET /queue` reply holds [`FIND`], or `None` when it is
/// not a well-formed queue: an object whose `queue_running` and
/// `queue_pending` are arrays of arrays, each with a string ID second.
fn queue_place(v: &Value) -> Option<PromptPlace> {
    let list = |key: &str| -> Option<Vec<&str>> {
        v.get(key)?
            .as_array()?
            .iter()
            .map(|item| item.as_array()?.get(1)?.as_str())
            .collect()
    };
    let (running, pending) = (list("queue_running")?, list("queue_pending")?);
    Some(if running.contains(&FIND) {
        PromptPlace::Running
    } else if pending.contains(&FIND) {
        PromptPlace::Pending
    } else {
        PromptPlace::Absent
    })
}

/// The ID vacancy assigns in the rewrite target.
const ASSIGNED: &str = "00000000-0000-4000-8000-00000000f022";

/// The submission rewrite (COMFY-04, COMFY-05) changes only `prompt_id`:
/// every JSON object is accepted; the result parses, its `prompt_id` is the
/// assigned one, every other member is as the borrower sent it, and the
/// bytes outside the borrower's `prompt_id` members are kept in order.
fn comfyui_prompt_id(input: &[u8]) {
    use vacancy_adapters::comfyui::submission::with_prompt_id;
    let parsed = std::str::from_utf8(input)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(t).ok());
    let rewritten = with_prompt_id(input, ASSIGNED);
    let (Some(Value::Object(mut before)), Ok(out)) = (parsed.clone(), &rewritten) else {
        if let (Some(Value::Object(_)), Err(e)) = (&parsed, &rewritten) {
            panic!("a JSON object was refused: {e}");
        }
        return;
    };
    let after = serde_json::from_slice::<Value>(&out.body)
        .unwrap_or_else(|e| panic!("the rewritten body does not parse: {e}"));
    let Value::Object(mut after) = after else {
        panic!("the rewritten body is not an object");
    };
    assert_eq!(
        after.remove("prompt_id"),
        Some(Value::String(ASSIGNED.to_owned())),
        "the assigned prompt_id is missing"
    );
    before.remove("prompt_id");
    assert_eq!(before, after, "a member other than prompt_id changed");
    // Every byte of the input, but those of its prompt_id members, is kept
    // in order: the input with them removed is a subsequence of the output.
    let mut rest = out.body.iter();
    let kept = input.len() - removed_len(input);
    let matched = input.iter().filter(|b| rest.any(|o| o == *b)).count();
    assert!(matched >= kept, "bytes outside prompt_id were not kept");
}

/// An upper bound on the bytes the rewrite may drop: the length of every
/// top-level `"prompt_id"` member's text (key, value and separators).
fn removed_len(input: &[u8]) -> usize {
    let text = String::from_utf8_lossy(input);
    let mut total = 0;
    let mut from = 0;
    while let Some(at) = text[from..].find("\"prompt_id\"") {
        let start = from + at;
        // The member runs to the next top-level comma or the closing brace;
        // bound it by the rest of the text.
        total += text.len() - start;
        from = start + 1;
    }
    total.min(input.len())
}

/// The configuration parser and validator never panic, and an error always
/// says where and what: a non-empty list of messages with text.
fn config(input: &[u8]) {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    if let Err(e) = vacancy::config::Config::parse(text, "fuzz.toml") {
        assert!(!e.errors.is_empty(), "an error with no problem in it");
        let shown = e.to_string();
        assert!(
            shown.contains("fuzz.toml"),
            "the error does not name the file: {shown}"
        );
    }
}

/// The five adapters, built once (their observation clients are not cheap).
fn adapters() -> &'static [Box<dyn vacancy::Adapter>] {
    use std::sync::OnceLock;
    use vacancy_adapters::comfyui::ComfyUiAdapter;
    use vacancy_adapters::{
        AdapterSettings, ChatterboxAdapter, LlamaCppAdapter, OllamaAdapter, OpenAiAdapter,
    };
    static ADAPTERS: OnceLock<Vec<Box<dyn vacancy::Adapter>>> = OnceLock::new();
    ADAPTERS.get_or_init(|| {
        let settings = || {
            AdapterSettings::new(
                http::Uri::from_static("http://127.0.0.1:9"),
                vacancy::MonotonicClock::new(),
            )
        };
        let built: Vec<Result<Box<dyn vacancy::Adapter>, String>> = vec![
            LlamaCppAdapter::new(settings())
                .map(|a| Box::new(a) as Box<dyn vacancy::Adapter>)
                .map_err(|e| e.to_string()),
            OpenAiAdapter::new(settings())
                .map(|a| Box::new(a) as Box<dyn vacancy::Adapter>)
                .map_err(|e| e.to_string()),
            OllamaAdapter::new(settings())
                .map(|a| Box::new(a) as Box<dyn vacancy::Adapter>)
                .map_err(|e| e.to_string()),
            ChatterboxAdapter::new(settings())
                .map(|a| Box::new(a) as Box<dyn vacancy::Adapter>)
                .map_err(|e| e.to_string()),
            ComfyUiAdapter::new(settings())
                .map(|a| Box::new(a) as Box<dyn vacancy::Adapter>)
                .map_err(|e| e.to_string()),
        ];
        built
            .into_iter()
            .map(|a| a.unwrap_or_else(|e| panic!("an adapter's own routes overlap: {e}")))
            .collect()
    })
}

const METHODS: [http::Method; 5] = [
    http::Method::GET,
    http::Method::POST,
    http::Method::DELETE,
    http::Method::PUT,
    http::Method::HEAD,
];

/// Route classification (ROUTE-01..): for every adapter, the query string
/// never changes a request's class, and neither does a repeated query. The
/// first byte picks the method, the rest is the path.
fn route_classification(input: &[u8]) {
    let Some((&m, path)) = input.split_first() else {
        return;
    };
    let Ok(path) = std::str::from_utf8(path) else {
        return;
    };
    let method = &METHODS[usize::from(m) % METHODS.len()];
    let bare = path.split('?').next().unwrap_or(path);
    for a in adapters() {
        let class = a.classify(method, path);
        assert_eq!(
            class,
            a.classify(method, bare),
            "{}: the query changed the class of {method} {path:?}",
            a.name()
        );
        assert_eq!(
            class,
            a.classify(method, &format!("{bare}?a=1&b=%2F")),
            "{}: another query changed the class of {method} {path:?}",
            a.name()
        );
    }
}

/// Work-request inspection of every adapter's work routes (MEM-06,
/// COMFY-03..07): any body is either refused with a code and a message, or
/// inspected; a model named is one the body wrote (never made up); a
/// ComfyUI submission is accepted exactly when it is a JSON object, its
/// rewritten body parses, and its handle is the entry's ID. The first byte
/// picks the route.
fn inspection(input: &[u8]) {
    use vacancy::traits::{InspectContext, RouteClass};
    let Some((&pick, body)) = input.split_first() else {
        return;
    };
    let entry = vacancy::engine::EntryId(uuid_for_fuzz());
    let headers = {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        h
    };
    let is_object = matches!(serde_json::from_slice::<Value>(body), Ok(Value::Object(_)));
    for a in adapters() {
        let work: Vec<_> = a
            .routes()
            .entries()
            .iter()
            .filter_map(|e| match e.class {
                RouteClass::Work(w) => Some((e, w)),
                _ => None,
            })
            .collect();
        if work.is_empty() {
            continue;
        }
        let (spec, route) = work[usize::from(pick) % work.len()];
        let path = spec.path.replace('{', "x").replace('}', "");
        let ctx = InspectContext {
            entry,
            method: &METHODS[1],
            path: &path,
            headers: &headers,
        };
        match a.inspect(&route, ctx, body) {
            Err(e) => assert!(
                !e.code.as_str().is_empty() && !e.message.is_empty(),
                "{}: a refusal without its code or words: {e:?}",
                a.name()
            ),
            Ok(inspection) => {
                if let Some(model) = &inspection.model {
                    let text = String::from_utf8_lossy(body);
                    assert!(
                        text.contains(model.as_str()) || text.contains('\\'),
                        "{}: model {model:?} is not in the body",
                        a.name()
                    );
                }
                if a.name() == "comfyui" {
                    let rewritten = inspection.rewritten_body.as_deref().unwrap_or(body);
                    assert!(
                        serde_json::from_slice::<Value>(rewritten).is_ok(),
                        "comfyui: the forwarded body does not parse"
                    );
                    assert_eq!(
                        inspection.upstream_ref.as_deref(),
                        Some(entry.0.to_string().as_str()),
                        "comfyui: the handle is not the entry's ID"
                    );
                }
            }
        }
        if a.name() == "comfyui" && spec.path == "/prompt" {
            let accepted = a
                .inspect(
                    &route,
                    InspectContext {
                        entry,
                        method: &METHODS[1],
                        path: "/prompt",
                        headers: &headers,
                    },
                    body,
                )
                .is_ok();
            assert_eq!(
                accepted, is_object,
                "comfyui: /prompt accepted {accepted} for an object {is_object}"
            );
        }
    }
}

/// A fixed entry ID: runs must repeat exactly.
fn uuid_for_fuzz() -> uuid::Uuid {
    uuid::Uuid::from_u128(0x0000_0000_0000_4000_8000_0000_0000_f022)
}

/// The journal reader (REC-02, REC-05, REC-09): any bytes as
/// `journal.jsonl` either refuse to open with a reason, or open with no
/// entry twice; opening again what the first open left (a torn last record
/// cut off) gives the same entries, and nothing was acknowledged by the
/// reader itself (it only cuts an unacknowledged tail).
fn journal(input: &[u8]) {
    use std::path::Path;
    use std::sync::Arc;
    use vacancy::ledger::disk::{Disk, MemDisk};
    use vacancy::ledger::{JOURNAL_FILE, Ledger};
    let disk = Arc::new(MemDisk::new());
    let dir = Path::new("/fuzz");
    let path = dir.join(JOURNAL_FILE);
    let written = disk.create_new(&path).and_then(|mut f| {
        f.write_all(input)?;
        f.sync_all()
    });
    if written.and_then(|()| disk.sync_dir(dir)).is_err() {
        panic!("the in-memory disk refused a write");
    }
    let first = match Ledger::open_on(dir, disk.clone()) {
        Ok((ledger, entries)) => {
            drop(ledger);
            entries
        }
        Err(e) => {
            assert!(!e.to_string().is_empty(), "an error without a reason");
            return;
        }
    };
    let mut ids: Vec<_> = first.iter().map(|e| e.id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), first.len(), "an entry came back twice");
    let again = match Ledger::open_on(dir, disk) {
        Ok((ledger, entries)) => {
            drop(ledger);
            entries
        }
        Err(e) => panic!("a journal that opened once does not open again: {e}"),
    };
    assert_eq!(first, again, "a second open read other entries");
}

/// Ollama model-name canonicalisation is idempotent and ignores ASCII case
/// and surrounding whitespace, as Ollama's own name matching does.
fn ollama_model_name(input: &[u8]) {
    use vacancy_adapters::ollama::canonical_model;
    let Ok(name) = std::str::from_utf8(input) else {
        return;
    };
    let c = canonical_model(name);
    assert_eq!(canonical_model(&c), c, "not idempotent on {name:?}");
    assert_eq!(
        canonical_model(&name.to_ascii_uppercase()),
        c,
        "case changes {name:?}"
    );
    assert_eq!(
        canonical_model(&format!(" {name}\t")),
        c,
        "whitespace changes {name:?}"
    );
}

/// The voice result-ID check (VOICE-07) accepts exactly
/// `^[A-Za-z0-9_-]{8,80}$`, checked here character by character.
fn voice_result_id(input: &[u8]) {
    use vacancy_adapters::chatterbox::is_result_id;
    let Ok(id) = std::str::from_utf8(input) else {
        return;
    };
    let chars: Vec<char> = id.chars().collect();
    let want = (8..=80).contains(&chars.len())
        && chars
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-');
    assert_eq!(is_result_id(id), want, "{id:?}");
}
