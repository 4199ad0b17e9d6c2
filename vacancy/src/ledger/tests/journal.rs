//! The journal: persistence, replay, corruption, compaction and the lock.

use std::fs;
use std::time::{Duration, SystemTime};

use super::{append, entry, id, ids, reservation, scratch, with_logs, write_private};
use crate::engine::{
    CompletionMethod, Decision, Engine, EngineSpec, EntryId, OwnerPresence, Phase, ResourceSpec,
    UpstreamSpec, WorkRequest,
};
use crate::ledger::record::{self, unix_ms};
use crate::ledger::store::{ReservationStore, StoreWrite};
use crate::ledger::{
    COMPACT_FILE, JOURNAL_FILE, Ledger, LedgerError, RecoveredEntry, StoreFailure,
};
use crate::time::Moment;
use crate::traits::{CapacitySample, ResourceKind};

fn open(dir: &std::path::Path) -> (Ledger, Vec<RecoveredEntry>) {
    Ledger::open(dir).unwrap()
}

fn open_err(dir: &std::path::Path) -> LedgerError {
    match Ledger::open(dir) {
        Ok(_) => panic!("open of {} should fail", dir.display()),
        Err(e) => e,
    }
}

/// The journal's records as text, without the zeros written ahead of them
/// while the ledger is open.
fn records(rec: &std::path::Path) -> String {
    let text = fs::read_to_string(rec.join(JOURNAL_FILE)).unwrap();
    text.trim_end_matches('\0').to_owned()
}

#[tokio::test]
async fn persisted_reservation_returns_after_reopen() {
    // REC-01, REC-02, REC-03, REC-27
    let s = scratch();
    let before = unix_ms(SystemTime::now());
    {
        let (ledger, entries) = open(&s.rec);
        assert!(entries.is_empty());
        ledger
            .persist(&reservation(1, Some("prompt-abc")))
            .await
            .unwrap();
    }
    let after = unix_ms(SystemTime::now());
    let (_ledger, entries) = open(&s.rec);
    assert_eq!(entries.len(), 1);
    let e = &entries[0];
    assert_eq!(e.id, id(1));
    assert_eq!(e.upstream, "comfy");
    assert_eq!(e.model.as_deref(), Some("sdxl"));
    assert_eq!(e.resources, vec!["gpu0".to_owned(), "ram".to_owned()]);
    assert_eq!(e.completion, CompletionMethod::Tracked);
    assert_eq!(e.upstream_ref.as_deref(), Some("prompt-abc"));
    assert_eq!(e.held_reason, None);
    assert!(before <= e.started_unix_ms && e.started_unix_ms <= after);
}

#[tokio::test]
async fn released_entry_is_gone_after_reopen() {
    // REC-02: only a release removes a record
    let s = scratch();
    {
        let (ledger, _) = open(&s.rec);
        ledger.persist(&reservation(1, None)).await.unwrap();
        ledger.persist(&reservation(2, None)).await.unwrap();
        ledger.forget(id(1)).await.unwrap();
    }
    let (_ledger, entries) = open(&s.rec);
    assert_eq!(ids(&entries), vec![id(2)]);
}

#[tokio::test]
async fn held_entry_returns_held_with_its_reason() {
    // REC-02
    let s = scratch();
    {
        let (ledger, _) = open(&s.rec);
        ledger.persist(&reservation(1, None)).await.unwrap();
        ledger
            .mark_held(id(1), "the response broke off")
            .await
            .unwrap();
    }
    let (_ledger, entries) = open(&s.rec);
    assert_eq!(entries.len(), 1);
    assert_eq!(
        entries[0].held_reason.as_deref(),
        Some("the response broke off")
    );
}

#[tokio::test]
async fn rewritten_upstream_ref_returns_after_reopen() {
    // REC-03, REC-04
    let s = scratch();
    {
        let (ledger, _) = open(&s.rec);
        ledger.persist(&reservation(1, Some("ours"))).await.unwrap();
        ledger.rewrite_ref(id(1), "comfys-own").await.unwrap();
    }
    let (ledger, entries) = open(&s.rec);
    assert_eq!(entries[0].upstream_ref.as_deref(), Some("comfys-own"));
    // REC-06: a rewrite the ledger cannot record is an error for the caller to log.
    assert!(matches!(
        ledger.rewrite_ref(id(9), "x").await,
        Err(LedgerError::UnknownEntry { .. })
    ));
}

#[tokio::test]
async fn changes_for_entries_without_a_record_write_nothing() {
    // REC-08: the journal never names an entry no record admits (a hold
    // reported after its release, a release of a reservation never recorded).
    let s = scratch();
    let (ledger, _) = open(&s.rec);
    ledger.persist(&reservation(1, None)).await.unwrap();
    ledger.forget(id(1)).await.unwrap();
    let len = fs::metadata(s.rec.join(JOURNAL_FILE)).unwrap().len();
    ledger.mark_held(id(1), "late").await.unwrap();
    ledger.forget(id(1)).await.unwrap();
    ledger.forget(id(7)).await.unwrap();
    assert_eq!(fs::metadata(s.rec.join(JOURNAL_FILE)).unwrap().len(), len);
    // A second admission of a live entry is refused, not written.
    ledger.persist(&reservation(2, None)).await.unwrap();
    assert!(ledger.persist(&reservation(2, None)).await.is_err());
    drop(ledger);
    let (_ledger, entries) = open(&s.rec);
    assert_eq!(ids(&entries), vec![id(2)]);
}

#[tokio::test]
async fn an_admission_cancelled_mid_persist_is_recorded_before_its_release() {
    // REC-01, REC-02: the proxy's guard releases a request whose persist was
    // cancelled; the writer applies changes in submission order, so the
    // release never overtakes the admission (which would leave a phantom
    // held entry after a restart).
    let s = scratch();
    {
        let (ledger, _) = open(&s.rec);
        for n in 1..=20u128 {
            let r = reservation(n, None);
            // Polled once (the change is queued), then dropped.
            let _ = tokio::time::timeout(Duration::ZERO, ledger.persist(&r)).await;
            ledger.forget(r.id).await.unwrap();
        }
    }
    let (_ledger, entries) = open(&s.rec);
    assert!(entries.is_empty(), "{entries:?}");
}

#[tokio::test]
async fn a_failed_append_refuses_the_reservation_and_keeps_the_journal_readable() {
    // REC-01: not recorded, not forwarded; REC-08: no torn line left behind
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    let (ledger, _) = open(&s.rec);
    ledger.persist(&reservation(1, None)).await.unwrap();
    let before = fs::read(&journal).unwrap();
    // Swap the writer's handle for a read-only one: appends fail, and so
    // does cutting them back, which leaves the ledger unavailable.
    let read_only = fs::File::open(&journal).unwrap();
    ledger.inspect(move |w| w.file = Box::new(crate::ledger::disk::RealFile(read_only)));
    let e = ledger.persist(&reservation(2, None)).await.unwrap_err();
    assert_eq!(e.entry, id(2));
    // The ledger's own error, carried whole (issue 32 item 6).
    assert!(matches!(e.reason, StoreFailure::Ledger(_)), "{e:?}");
    let reason = e.reason.to_string();
    assert!(reason.contains(&journal.display().to_string()), "{reason}");
    let e = ledger.persist(&reservation(3, None)).await.unwrap_err();
    let reason = e.reason.to_string();
    assert!(reason.contains("unavailable"), "{reason}");
    assert!(reason.contains("restarted"), "{reason}");
    // A release cannot be recorded either: the record stays, to return held.
    assert!(ledger.forget(id(1)).await.is_err());
    drop(ledger);
    assert_eq!(fs::read(&journal).unwrap(), before);
    let (_ledger, entries) = open(&s.rec);
    assert_eq!(ids(&entries), vec![id(1)]);
}

#[tokio::test]
async fn records_hold_job_metadata_only() {
    // REC-26
    let s = scratch();
    let (ledger, _) = open(&s.rec);
    ledger.persist(&reservation(1, Some("p"))).await.unwrap();
    ledger.mark_held(id(1), "uncertain").await.unwrap();
    ledger.rewrite_ref(id(1), "q").await.unwrap();
    ledger.forget(id(1)).await.unwrap();
    let text = records(&s.rec);
    let allowed = [
        "v",
        "op",
        "id",
        "upstream",
        "model",
        "resources",
        "completion",
        "started_unix_ms",
        "upstream_ref",
        "reason",
        "entries",
    ];
    assert_eq!(text.lines().count(), 4);
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        for key in v.as_object().unwrap().keys() {
            assert!(allowed.contains(&key.as_str()), "unexpected key {key}");
        }
        assert_eq!(v["v"], 1);
    }
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["op"], "admit");
    assert_eq!(first["resources"], serde_json::json!(["gpu0", "ram"]));
    assert_eq!(first["completion"], "tracked");
}

#[test]
fn cut_short_newest_record_is_discarded_with_a_warning_and_cut_off() {
    // REC-09
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    let good = record::admit_line(&entry(1));
    append(&journal, &good);
    let partial = record::admit_line(&entry(2));
    append(&journal, &partial[..partial.len() / 2]);

    let ((ledger, entries), logs) = with_logs(|| open(&s.rec));
    assert_eq!(ids(&entries), vec![id(1)]);
    assert!(logs.contains("WARN"), "{logs}");
    assert!(logs.contains("REC-09"), "{logs}");
    assert!(logs.contains("line=2"), "{logs}");
    assert_eq!(fs::read(&journal).unwrap(), good);
    drop(ledger);

    // Appends continue cleanly after the cut.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    {
        let (ledger, _) = open(&s.rec);
        rt.block_on(ledger.persist(&reservation(3, None))).unwrap();
    }
    let (_ledger, entries) = open(&s.rec);
    assert_eq!(ids(&entries), vec![id(1), id(3)]);
}

#[test]
fn newest_line_without_its_newline_is_discarded_even_when_it_is_zeros() {
    // REC-09: a power loss can leave the newest write as zeros; with no
    // newline it was never complete, so never acknowledged.
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    append(&journal, &record::admit_line(&entry(1)));
    append(&journal, &[0u8; 40]);
    let (_l, entries) = open(&s.rec);
    assert_eq!(ids(&entries), vec![id(1)]);
    assert_eq!(fs::read(&journal).unwrap(), record::admit_line(&entry(1)));
}

#[test]
fn a_complete_newest_line_that_is_corrupt_stops_startup() {
    // REC-08, REC-09, issue 30 item 3: a newest line that ends in its newline
    // was written whole and may have been acknowledged and forwarded: one
    // that does not parse, or holds an impossible value, stops startup as
    // an older one does, and the journal is left as it was.
    let admitted = record::admit_line(&entry(2));
    let text = String::from_utf8(admitted.clone()).unwrap();
    let damaged: Vec<(Vec<u8>, &str)> = vec![
        (b"{\"v\":1,\"op\":\"adm\n".to_vec(), "not a JSON record"),
        (
            text.replacen("\"op\"", "x\"op\"", 1).into_bytes(),
            "not a JSON record",
        ),
        (
            text.replacen(
                &format!("\"started_unix_ms\":{}", entry(2).started_unix_ms),
                "\"started_unix_ms\":18446744073709551616",
                1,
            )
            .into_bytes(),
            "not a JSON record",
        ),
        (
            text.replacen(
                &format!("\"started_unix_ms\":{}", entry(2).started_unix_ms),
                "\"started_unix_ms\":18446744073709551615",
                1,
            )
            .into_bytes(),
            "past the year 9999",
        ),
    ];
    for (last, why) in damaged {
        assert_ne!(last, admitted);
        assert_eq!(last.last(), Some(&b'\n'));
        let s = scratch();
        let journal = s.rec.join(JOURNAL_FILE);
        append(&journal, &record::admit_line(&entry(1)));
        append(&journal, &last);
        let before = fs::read(&journal).unwrap();
        let e = open_err(&s.rec);
        assert!(matches!(e, LedgerError::Corrupt { line: 2, .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(why), "{msg}");
        assert!(msg.contains(&journal.display().to_string()), "{msg}");
        assert_eq!(fs::read(&journal).unwrap(), before, "nothing is cut off");
    }
    // The largest time vacancyd could write still opens.
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    let mut last_ms = entry(2);
    last_ms.started_unix_ms = 253_402_300_799_999;
    append(&journal, &record::admit_line(&last_ms));
    let (_l, entries) = open(&s.rec);
    assert_eq!(ids(&entries), vec![id(2)]);
}

#[test]
fn crash_at_every_byte_of_the_newest_line_never_stops_startup() {
    // REC-09: whatever the newest line is, a cut anywhere in it is discarded
    // (or, when whole, replayed); never a startup failure.
    let base: Vec<Vec<u8>> = vec![
        record::admit_line(&entry(1)),
        record::admit_line(&entry(2)),
        record::held_line(id(2), "uncertain"),
    ];
    let lasts: Vec<(Vec<u8>, Vec<EntryId>)> = vec![
        (record::admit_line(&entry(3)), vec![id(1), id(2), id(3)]),
        (record::held_line(id(1), "cut"), vec![id(1), id(2)]),
        (record::ref_line(id(1), "theirs"), vec![id(1), id(2)]),
        (record::release_line(id(2)), vec![id(1)]),
    ];
    for (last, whole) in lasts {
        for cut in 0..=last.len() {
            let s = scratch();
            let journal = s.rec.join(JOURNAL_FILE);
            let mut bytes: Vec<u8> = base.concat();
            let prefix_len = bytes.len();
            bytes.extend_from_slice(&last[..cut]);
            write_private(&journal, &bytes);
            let (_l, entries) = Ledger::open(&s.rec).unwrap_or_else(|e| {
                panic!("cut at {cut} of {:?}: {e}", String::from_utf8_lossy(&last))
            });
            if cut == last.len() {
                assert_eq!(ids(&entries), whole);
                assert_eq!(fs::read(&journal).unwrap().len(), bytes.len());
            } else {
                assert_eq!(ids(&entries), vec![id(1), id(2)]);
                assert_eq!(fs::read(&journal).unwrap().len(), prefix_len);
            }
        }
    }
}

#[test]
fn corrupt_older_record_stops_startup_naming_file_and_line() {
    // REC-08
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    append(&journal, &record::admit_line(&entry(1)));
    append(&journal, b"{\"v\":1,\"op\":\"adm\n");
    append(&journal, &record::admit_line(&entry(2)));
    let before = fs::read(&journal).unwrap();
    let e = open_err(&s.rec);
    assert!(matches!(e, LedgerError::Corrupt { line: 2, .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains(&journal.display().to_string()), "{msg}");
    assert!(msg.contains("line 2"), "{msg}");
    assert!(msg.contains("restore it from backup"), "{msg}");
    assert!(msg.contains("never deletes it"), "{msg}");
    // Nothing was changed or deleted.
    assert_eq!(fs::read(&journal).unwrap(), before);
}

// Issue 14 item 17: a change for an entry that line 1 admits and a later
// line released says so, instead of "which no record admits".
#[test]
fn a_change_after_its_entrys_release_names_the_lines_that_admit_and_release_it() {
    for (op, change) in [
        ("release", record::release_line(id(1))),
        ("held", record::held_line(id(1), "x")),
        ("ref", record::ref_line(id(1), "x")),
    ] {
        let s = scratch();
        let journal = s.rec.join(JOURNAL_FILE);
        append(&journal, &record::admit_line(&entry(1)));
        append(&journal, &record::admit_line(&entry(2)));
        append(&journal, &record::release_line(id(1)));
        append(&journal, &change);
        let e = open_err(&s.rec).to_string();
        assert!(e.contains("at line 4"), "{e}");
        assert!(
            e.contains(&format!(
                "{op} names entry {}, which line 3 released already (admitted at line 1)",
                id(1)
            )),
            "{e}"
        );
        assert!(!e.contains("no record admits"), "{e}");
    }

    // Never admitted at all: said so, as what comes before this line.
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    append(&journal, &record::admit_line(&entry(1)));
    append(&journal, &record::release_line(id(9)));
    let e = open_err(&s.rec).to_string();
    assert!(
        e.contains(&format!(
            "release names entry {}, which no earlier line admits",
            id(9)
        )),
        "{e}"
    );

    // Admitted twice: both lines named.
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    append(&journal, &record::admit_line(&entry(1)));
    append(&journal, &record::admit_line(&entry(1)));
    let e = open_err(&s.rec).to_string();
    assert!(
        e.contains(&format!(
            "entry {} is admitted twice, at line 1 and here",
            id(1)
        )),
        "{e}"
    );
}

#[test]
fn unknown_op_duplicate_admit_and_changes_for_unknown_entries_stop_startup() {
    // REC-08: also when the bad record is the newest (valid JSON is not cut short)
    let unknown_entry = "00000000-0000-0000-0000-000000000009";
    let cases: Vec<(String, Vec<u8>, &str)> = vec![
        (
            "unknown op".to_owned(),
            b"{\"v\":1,\"op\":\"teleport\",\"id\":\"00000000-0000-0000-0000-000000000001\"}\n"
                .to_vec(),
            "unknown record op",
        ),
        (
            "duplicate admit".to_owned(),
            record::admit_line(&entry(1)),
            "admitted twice",
        ),
        (
            "release of unknown".to_owned(),
            record::release_line(id(9)),
            unknown_entry,
        ),
        (
            "held of unknown".to_owned(),
            record::held_line(id(9), "x"),
            unknown_entry,
        ),
        (
            "ref of unknown".to_owned(),
            record::ref_line(id(9), "x"),
            unknown_entry,
        ),
        (
            "no version".to_owned(),
            b"{\"op\":\"release\",\"id\":\"00000000-0000-0000-0000-000000000001\"}\n".to_vec(),
            "format version",
        ),
        (
            "bad completion".to_owned(),
            String::from_utf8(record::admit_line(&entry(5)))
                .unwrap()
                .replace("tracked", "psychic")
                .into_bytes(),
            "unknown completion method",
        ),
    ];
    for (what, bad, expect) in cases {
        for bad_is_newest in [true, false] {
            let s = scratch();
            let journal = s.rec.join(JOURNAL_FILE);
            append(&journal, &record::admit_line(&entry(1)));
            append(&journal, &bad);
            if !bad_is_newest {
                append(&journal, &record::admit_line(&entry(3)));
            }
            let e = open_err(&s.rec);
            let msg = e.to_string();
            assert!(
                matches!(e, LedgerError::Corrupt { line: 2, .. }),
                "{what}: {msg}"
            );
            assert!(msg.contains(expect), "{what}: {msg}");
        }
    }
}

#[test]
fn records_from_a_newer_format_stop_startup() {
    // REC-08: never guess at a newer format
    let s = scratch();
    append(
        &s.rec.join(JOURNAL_FILE),
        b"{\"v\":2,\"op\":\"admit\",\"id\":\"00000000-0000-0000-0000-000000000001\"}\n",
    );
    let e = open_err(&s.rec);
    assert!(
        matches!(e, LedgerError::NewerFormat { version: 2, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("newer vacancyd"), "{e}");
}

#[test]
fn complete_compaction_beside_the_journal_is_completed_at_open() {
    // REC-05: the .new holds the rewritten ref; completing it must win
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    let new = s.rec.join(COMPACT_FILE);
    append(&journal, &record::admit_line(&entry(1)));
    append(&journal, &record::admit_line(&entry(2)));
    append(&journal, &record::release_line(id(2)));
    let mut rewritten = entry(1);
    rewritten.upstream_ref = Some("theirs".to_owned());
    let mut compacted = record::admit_line(&rewritten);
    compacted.extend_from_slice(&record::end_line(1));
    write_private(&new, &compacted);

    let ((_l, entries), logs) = with_logs(|| open(&s.rec));
    assert_eq!(ids(&entries), vec![id(1)]);
    assert_eq!(entries[0].upstream_ref.as_deref(), Some("theirs"));
    assert!(!new.exists());
    assert_eq!(fs::read(&journal).unwrap(), compacted);
    assert!(logs.contains("REC-05"), "{logs}");
}

#[test]
fn incomplete_compaction_is_removed_and_the_journal_kept() {
    // REC-04: a crash before the rename leaves the old journal authoritative
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    let new = s.rec.join(COMPACT_FILE);
    append(&journal, &record::admit_line(&entry(1)));
    append(&journal, &record::admit_line(&entry(2)));
    let mut full = record::admit_line(&entry(1));
    full.extend_from_slice(&record::admit_line(&entry(2)));
    full.extend_from_slice(&record::end_line(2));
    // Every cut short of the whole file is incomplete, as is a wrong count.
    let mut cases: Vec<Vec<u8>> = (0..full.len()).map(|n| full[..n].to_vec()).collect();
    let mut miscounted = record::admit_line(&entry(1));
    miscounted.extend_from_slice(&record::end_line(5));
    cases.push(miscounted);
    for bytes in cases {
        write_private(&new, &bytes);
        let ((_l, entries), logs) = with_logs(|| open(&s.rec));
        assert_eq!(ids(&entries), vec![id(1), id(2)]);
        assert!(!new.exists());
        assert!(logs.contains("incomplete"), "{logs}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_keeps_exactly_the_live_entries_and_survives_reopen() {
    // REC-02, REC-04
    let s = scratch();
    {
        let (ledger, _) = open(&s.rec);
        ledger.set_compact_min_lines(20);
        for n in 1..=40u128 {
            ledger.persist(&reservation(n, Some("p"))).await.unwrap();
            if n % 10 == 0 {
                ledger.mark_held(id(n), "uncertain").await.unwrap();
                ledger
                    .rewrite_ref(id(n), &format!("theirs-{n}"))
                    .await
                    .unwrap();
            } else {
                ledger.forget(id(n)).await.unwrap();
            }
        }
        // Without compaction: 40 admits, 36 releases, 8 held/ref lines.
        assert!(ledger.journal_lines() < 40, "{}", ledger.journal_lines());
        assert_eq!(ledger.live_entries(), 4);
        assert!(!s.rec.join(COMPACT_FILE).exists());
        // Appends after a compaction land in the new journal.
        ledger.persist(&reservation(41, None)).await.unwrap();
    }
    let (ledger, entries) = open(&s.rec);
    assert_eq!(ids(&entries), vec![id(10), id(20), id(30), id(40), id(41)]);
    for e in &entries[..4] {
        assert_eq!(e.held_reason.as_deref(), Some("uncertain"));
        assert_eq!(e.upstream_ref, Some(format!("theirs-{}", e.id.0.as_u128())));
    }
    // An explicit compaction leaves exactly the live lines and the end
    // marker, and keeps every field (the wall-clock start included).
    ledger.forget(id(41)).await.unwrap();
    ledger.compact().await.unwrap();
    let text = records(&s.rec);
    assert_eq!(text.lines().count(), 4 * 2 + 1);
    assert!(
        text.ends_with("{\"v\":1,\"op\":\"end\",\"entries\":4}\n"),
        "{text}"
    );
    drop(ledger);
    let (_ledger, again) = open(&s.rec);
    assert_eq!(again, entries[..4].to_vec());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_never_interleave() {
    // REC-01, REC-08: every line whole, every entry back
    let s = scratch();
    {
        let (ledger, _) = open(&s.rec);
        let mut tasks = Vec::new();
        for n in 1..=64u128 {
            let l = ledger.clone();
            tasks.push(tokio::spawn(async move {
                l.persist(&reservation(n, Some("p"))).await.unwrap();
                if n % 2 == 0 {
                    l.forget(id(n)).await.unwrap();
                } else {
                    l.mark_held(id(n), "x").await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
    let (_l, entries) = open(&s.rec);
    let expect: Vec<EntryId> = (1..=64u128).filter(|n| n % 2 == 1).map(id).collect();
    let mut got = ids(&entries);
    got.sort();
    assert_eq!(got, expect);
    assert!(
        entries
            .iter()
            .all(|e| e.held_reason.as_deref() == Some("x"))
    );
}

#[tokio::test]
async fn a_release_shares_its_sync_with_the_next_admission() {
    // REC-01: the admission is synced before it answers; the release
    // submitted before it, while the writer waits out the deferral after its
    // last sync, waits for that same sync instead of paying one of its own.
    let s = scratch();
    let (ledger, _) = open(&s.rec);
    ledger.set_deferred_sync(Duration::from_secs(600));
    ledger.persist(&reservation(1, None)).await.unwrap();
    let before = ledger.syncs();
    let release = ledger.forget(id(1));
    admit_2_with(ledger, release, before, &s.rec).await;
}

#[tokio::test]
async fn a_release_appended_unsynced_shares_its_sync_with_the_next_admission() {
    // REC-01: a release that wakes an idle writer is appended and waits for
    // the next sync; the admission after it syncs both at once.
    let s = scratch();
    {
        let (ledger, _) = open(&s.rec);
        ledger.persist(&reservation(1, None)).await.unwrap();
    }
    // A fresh writer has synced nothing, so it waits for the next job with
    // no deadline, and the release wakes it.
    let (ledger, recovered) = open(&s.rec);
    assert_eq!(ids(&recovered), vec![id(1)]);
    ledger.set_deferred_sync(Duration::from_secs(600));
    let before = ledger.syncs();
    let journal = s.rec.join(JOURNAL_FILE);
    let len = fs::metadata(&journal).unwrap().len();
    let release = ledger.forget(id(1));
    // Wait until the writer has appended the release (unsynced), so the
    // admission comes after it rather than in the same batch.
    let appended = std::time::Instant::now();
    while fs::metadata(&journal).unwrap().len() == len {
        assert!(
            appended.elapsed() < Duration::from_secs(10),
            "the release is appended"
        );
        std::thread::yield_now();
    }
    admit_2_with(ledger, release, before, &s.rec).await;
}

/// Admit entry 2 while `release` (of entry 1) waits for its sync: both are
/// answered after one sync more than `before`, and only entry 2 comes back.
async fn admit_2_with(ledger: Ledger, release: StoreWrite, before: u64, rec: &std::path::Path) {
    let admit = ledger.persist(&reservation(2, None));
    let (released, admitted) = tokio::join!(release, admit);
    released.unwrap();
    admitted.unwrap();
    assert_eq!(
        ledger.syncs() - before,
        1,
        "one sync for the release and the admission"
    );
    drop(ledger);
    let (_l, entries) = open(rec);
    assert_eq!(ids(&entries), vec![id(2)]);
}

#[tokio::test]
async fn a_release_alone_is_synced_within_the_deferral() {
    // REC-02: a release nobody follows is still made durable, and its
    // future resolves only then.
    let s = scratch();
    let (ledger, _) = open(&s.rec);
    ledger.persist(&reservation(1, None)).await.unwrap();
    let before = ledger.syncs();
    tokio::time::timeout(Duration::from_secs(10), ledger.forget(id(1)))
        .await
        .expect("the deferred sync comes")
        .unwrap();
    // The writer answered after syncing: the count is up without an
    // inspection forcing it.
    assert_eq!(ledger.syncs() - before, 1);
    drop(ledger);
    let (_l, entries) = open(&s.rec);
    assert!(entries.is_empty());
}

#[tokio::test]
async fn an_admission_is_never_answered_before_its_sync() {
    // REC-01: however long releases may wait, an admission does not.
    let s = scratch();
    let (ledger, _) = open(&s.rec);
    ledger.set_deferred_sync(Duration::from_secs(600));
    tokio::time::timeout(
        Duration::from_secs(10),
        ledger.persist(&reservation(1, None)),
    )
    .await
    .expect("an admission syncs at once")
    .unwrap();
    assert_eq!(ledger.syncs(), 1);
}

#[test]
fn only_one_ledger_may_open_a_directory() {
    // REC-25
    let s = scratch();
    let (first, _) = open(&s.rec);
    let e = open_err(&s.rec);
    let msg = e.to_string();
    assert!(matches!(e, LedgerError::InUse { .. }), "{msg}");
    assert!(msg.contains(&s.rec.display().to_string()), "{msg}");
    assert!(
        msg.contains(&format!("vacancyd pid {} since ", std::process::id())),
        "{msg}"
    );
    assert!(msg.contains("only one daemon may open it"), "{msg}");
    // A clone keeps the lock; dropping the last one frees it.
    let clone = first.clone();
    drop(first);
    assert!(matches!(open_err(&s.rec), LedgerError::InUse { .. }));
    drop(clone);
    let (_again, _) = open(&s.rec);
}

#[test]
fn open_refuses_a_directory_that_is_not_private() {
    // REC-21, REC-22
    use std::os::unix::fs::PermissionsExt;
    let s = scratch();
    fs::set_permissions(&s.rec, fs::Permissions::from_mode(0o755)).unwrap();
    let e = open_err(&s.rec);
    assert!(
        matches!(e, LedgerError::WrongMode { mode: 0o755, .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains(&format!("chmod 700 {}", s.rec.display()))
    );
    // Never changed by vacancyd, and nothing written.
    let meta = fs::metadata(&s.rec).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o755);
    assert!(!s.rec.join(JOURNAL_FILE).exists());
}

#[test]
fn recovered_age_comes_from_the_recorded_start_and_the_clock() {
    // REC-27
    let now = SystemTime::now();
    let mut e = entry(1);
    e.started_unix_ms = unix_ms(now) - 90_000;
    assert_eq!(e.age(now), Duration::from_secs(90));
    let restored = e.to_restored(Moment::from_secs(1000), now);
    assert_eq!(restored.admitted_at, Moment::from_secs(910));
    assert_eq!(restored.started_before, Duration::ZERO);
    // A clock that went back reads as age zero.
    e.started_unix_ms = unix_ms(now) + 5_000;
    assert_eq!(e.age(now), Duration::ZERO);
    // An entry older than the daemon's uptime sits at the timeline's origin
    // and carries the rest of its age: it never restarts at 0.
    e.started_unix_ms = unix_ms(now) - 3 * 3_600_000;
    let restored = e.to_restored(Moment::from_secs(5), now);
    assert_eq!(restored.admitted_at, Moment::ZERO);
    assert_eq!(restored.started_before, Duration::from_secs(3 * 3600 - 5));
}

#[tokio::test]
async fn recovered_entries_restore_as_held_in_the_engine() {
    // REC-02, REC-03, REC-08: the daemon's startup path
    let spec = || {
        let mut up = UpstreamSpec::new("comfy", "gpu0", 1000);
        up.also_requires = vec!["ram".to_owned()];
        EngineSpec {
            lending: true,
            resources: vec![
                ResourceSpec::new("gpu0", ResourceKind::Gpu, 1024),
                ResourceSpec::new("ram", ResourceKind::Memory, 1024),
            ],
            upstreams: vec![up],
        }
    };
    let mut engine = Engine::new(spec()).unwrap();
    engine.set_owner(OwnerPresence::Away);
    for r in ["gpu0", "ram"] {
        engine
            .record_sample(r, CapacitySample::memory(60_000, 80_000, Moment::ZERO))
            .unwrap();
    }
    let mut req = WorkRequest::new(
        engine.upstream_id("comfy").unwrap(),
        Some("sdxl"),
        Moment::from_millis(1),
    );
    req.upstream_ref = Some("prompt-7".to_owned());
    let Decision::Admitted(res) = engine.admit(&req, Moment::from_millis(1)) else {
        panic!("not admitted");
    };
    let s = scratch();
    {
        let (ledger, _) = open(&s.rec);
        ledger.persist(&res).await.unwrap();
    }
    let (_ledger, entries) = open(&s.rec);
    let mut after_restart = Engine::new(spec()).unwrap();
    for e in &entries {
        after_restart
            .restore_held(
                e.to_restored(Moment::from_secs(60), SystemTime::now()),
                "restored after a restart",
            )
            .unwrap();
    }
    assert_eq!(after_restart.phase(res.id), Some(Phase::Held));
    assert_eq!(entries[0].upstream_ref.as_deref(), Some("prompt-7"));
}

#[tokio::test]
async fn rec_07_vacancyd_never_deletes_the_directory_or_its_journal() {
    // REC-07: releasing everything, compacting and closing keep the
    // directory and its journal; only the records change.
    let s = scratch();
    {
        let (ledger, _) = open(&s.rec);
        ledger.persist(&reservation(1, None)).await.unwrap();
        ledger.persist(&reservation(2, None)).await.unwrap();
        ledger.forget(id(1)).await.unwrap();
        ledger.forget(id(2)).await.unwrap();
        ledger.compact().await.unwrap();
    }
    assert!(s.rec.is_dir(), "the directory stays");
    assert!(s.rec.join(JOURNAL_FILE).is_file(), "the journal stays");
    let (_ledger, entries) = open(&s.rec);
    assert!(entries.is_empty());
    // A corrupt journal, the one case that stops startup, is left as it is.
    let journal = s.rec.join(JOURNAL_FILE);
    drop(_ledger);
    append(&journal, b"garbage\n");
    append(&journal, &record::admit_line(&entry(3)));
    let before = fs::read(&journal).unwrap();
    let e = open_err(&s.rec);
    assert!(e.to_string().contains("vacancyd never deletes it"), "{e}");
    assert_eq!(fs::read(&journal).unwrap(), before);
    assert!(s.rec.is_dir());
}

/// A usage sink that keeps its rows in memory, shared with the test.
struct Rows(
    std::sync::Arc<std::sync::Mutex<Vec<(EntryId, bool)>>>,
    std::path::PathBuf,
);

impl crate::ledger::UsageSink for Rows {
    fn record(&mut self, r: &crate::engine::UsageRecord) -> Result<(), String> {
        // Whether the journal still held the entry when the row was written.
        let journal = fs::read_to_string(self.1.join(JOURNAL_FILE)).unwrap_or_default();
        let released = journal.contains(&format!("\"op\":\"release\",\"id\":\"{}\"", r.entry));
        self.0.lock().unwrap().push((r.entry, released));
        Ok(())
    }
}

fn usage_record(n: u128) -> crate::engine::UsageRecord {
    crate::engine::UsageRecord {
        entry: id(n),
        borrower: "alice".into(),
        upstream: "comfy".to_owned(),
        model: None,
        priority: crate::engine::Priority::Batch,
        admitted_unix_ms: 1,
        released_unix_ms: 2,
        waited: Duration::ZERO,
        held: false,
        reserved: crate::engine::KindTimes::default(),
        resources: Vec::new(),
    }
}

#[tokio::test]
async fn a_borrowers_reservation_comes_back_to_its_borrower_after_a_restart() {
    // issue 34 item 4: the admit line carries the borrower and its class
    let s = scratch();
    {
        let (ledger, _) = open(&s.rec);
        let mut r = reservation(1, None);
        r.borrower = Some(crate::engine::BorrowerTag {
            name: "alice".into(),
            priority: crate::engine::Priority::Batch,
        });
        ledger.persist(&r).await.unwrap();
        ledger.persist(&reservation(2, None)).await.unwrap();
    }
    let journal = fs::read_to_string(s.rec.join(JOURNAL_FILE)).unwrap();
    assert!(
        journal.contains("\"borrower\":\"alice\",\"priority\":\"batch\""),
        "{journal}"
    );
    let (_ledger, entries) = open(&s.rec);
    let tag = entries[0].borrower.as_ref().unwrap();
    assert_eq!(
        (&*tag.name, tag.priority),
        ("alice", crate::engine::Priority::Batch)
    );
    assert_eq!(
        entries[1].borrower, None,
        "an anonymous entry's line has no borrower"
    );
    assert!(!journal.lines().nth(1).unwrap().contains("borrower"));
}

#[tokio::test]
async fn the_usage_row_is_written_before_the_journal_forgets_the_entry() {
    // issue 34 item 4: a crash between the two never loses the row
    let s = scratch();
    let (ledger, _) = open(&s.rec);
    let rows = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    ledger
        .set_usage_sink(Box::new(Rows(std::sync::Arc::clone(&rows), s.rec.clone())))
        .unwrap();
    ledger.persist(&reservation(1, None)).await.unwrap();
    ReservationStore::submit(
        &ledger,
        crate::ledger::StoreChange::Account(Box::new(usage_record(1))),
    )
    .await
    .unwrap();
    ledger.forget(id(1)).await.unwrap();
    assert_eq!(*rows.lock().unwrap(), vec![(id(1), false)]);
    let journal = fs::read_to_string(s.rec.join(JOURNAL_FILE)).unwrap();
    assert!(journal.contains("\"op\":\"release\""), "{journal}");
}
