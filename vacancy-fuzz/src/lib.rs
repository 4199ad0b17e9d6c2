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
    "journal",
    "ollama_model_name",
    "voice_result_id",
];

/// Run `target` on `input`; false for an unknown target.
pub fn run(target: &str, input: &[u8]) -> bool {
    match target {
        "comfyui_queue_scan" => comfyui_queue_scan(input),
        "comfyui_prompt_id" => comfyui_prompt_id(input),
        "config" => config(input),
        "journal" => journal(input),
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
    let parsed = serde_json::from_slice::<Value>(reply).ok();
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
