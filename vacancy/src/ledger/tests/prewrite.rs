//! The zeros the journal writes ahead of its end (issue 31): records are
//! written over them, so a sync need not commit a new file size; a clean
//! close and every open cut them off, and replay passes over them.

use std::fs;
use std::sync::Arc;

use super::{append, entry, id, ids, reservation, scratch, with_logs, write_private};
use crate::engine::EntryId;
use crate::ledger::disk::{Fault, FaultDisk, MemDisk, OpKind};
use crate::ledger::record;
use crate::ledger::store::ReservationStore;
use crate::ledger::{COMPACT_FILE, JOURNAL_FILE, Ledger, RecoveredEntry};

/// The length of the journal's records: up to its last newline.
fn records_len(bytes: &[u8]) -> usize {
    bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)
}

/// Open a ledger on a journal of `bytes` and the zeros a writer had
/// written ahead of them: its entries, the log and the journal after open.
fn open_after_a_crash(mut bytes: Vec<u8>, case: &str) -> (Vec<RecoveredEntry>, String, Vec<u8>) {
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    bytes.extend_from_slice(&[0u8; 512]);
    write_private(&journal, &bytes);
    let ((_ledger, entries), logs) =
        with_logs(|| Ledger::open(&s.rec).unwrap_or_else(|e| panic!("{case}: {e}")));
    (entries, logs, fs::read(&journal).unwrap())
}

#[tokio::test]
async fn records_are_written_over_the_zeros_ahead_so_the_file_does_not_grow() {
    // REC-01 (issue 31): the first record writes zeros ahead of it; the
    // records after it go over them, and the file keeps its length.
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    let (ledger, _) = Ledger::open(&s.rec).unwrap();
    ledger.persist(&reservation(1, None)).await.unwrap();
    let bytes = fs::read(&journal).unwrap();
    let written = records_len(&bytes);
    assert!(bytes.len() >= written + 64 * 1024, "{}", bytes.len());
    assert!(bytes[written..].iter().all(|&b| b == 0));
    for n in 2..=20 {
        ledger.persist(&reservation(n, None)).await.unwrap();
    }
    ledger.forget(id(2)).await.unwrap();
    assert_eq!(fs::read(&journal).unwrap().len(), bytes.len());

    // What a kill -9 leaves (the file as it is now) replays whole.
    let copy = scratch();
    write_private(&copy.rec.join(JOURNAL_FILE), &fs::read(&journal).unwrap());
    let (_copy, entries) = Ledger::open(&copy.rec).unwrap();
    let expected: Vec<EntryId> = (1..=20).filter(|&n| n != 2).map(id).collect();
    assert_eq!(ids(&entries), expected);
}

#[tokio::test]
async fn a_clean_close_cuts_the_zeros_ahead_off() {
    // A journal closed cleanly is its records alone.
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    {
        let (ledger, _) = Ledger::open(&s.rec).unwrap();
        ledger.persist(&reservation(1, None)).await.unwrap();
        ledger.persist(&reservation(2, None)).await.unwrap();
    }
    let bytes = fs::read(&journal).unwrap();
    assert_eq!(records_len(&bytes), bytes.len());
    assert_eq!(String::from_utf8(bytes).unwrap().lines().count(), 2);
}

#[test]
fn zeros_left_by_a_crash_are_cut_off_at_open_without_a_warning() {
    // REC-02: the records before the zeros come back; nothing is discarded.
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    let admitted = record::admit_line(&entry(1));
    append(&journal, &admitted);
    append(&journal, &[0u8; 4096]);
    let ((ledger, entries), logs) = with_logs(|| Ledger::open(&s.rec).unwrap());
    assert_eq!(ids(&entries), vec![id(1)]);
    assert!(!logs.contains("WARN"), "{logs}");
    assert_eq!(fs::read(&journal).unwrap(), admitted);
    drop(ledger);

    // Records written after zeros (by hand, with O_APPEND) are records too,
    // and the zeros before them are named with their line and offset.
    append(&journal, &[0u8; 100]);
    append(&journal, &record::admit_line(&entry(2)));
    let ((_ledger, entries), logs) = with_logs(|| Ledger::open(&s.rec).unwrap());
    assert_eq!(ids(&entries), vec![id(1), id(2)]);
    assert!(logs.contains("WARN"), "{logs}");
    assert!(logs.contains("zero bytes before a record"), "{logs}");
    assert!(logs.contains("line=2"), "{logs}");
    assert!(
        logs.contains(&format!("offset={}", admitted.len())),
        "{logs}"
    );
    assert!(logs.contains("bytes=100"), "{logs}");
}

#[test]
fn the_end_of_the_newest_record_without_its_start_is_discarded_at_every_split() {
    // REC-09: a record written over the zeros ahead that spans two pages
    // may reach the disk end first; a crash then leaves zeros where it
    // starts and its end after them. It was never acknowledged (its sync
    // had not returned): discarded with a warning, never a startup failure.
    let base = [record::admit_line(&entry(1)), record::admit_line(&entry(2))].concat();
    for last in [
        record::admit_line(&entry(3)),
        record::release_line(id(2)),
        record::held_line(id(1), "the upstream did not answer"),
    ] {
        for split in 1..last.len() {
            let mut bytes = base.clone();
            bytes.extend_from_slice(&vec![0u8; split]);
            bytes.extend_from_slice(&last[split..]);
            let (entries, logs, after) = open_after_a_crash(bytes, &format!("split at {split}"));
            assert_eq!(ids(&entries), vec![id(1), id(2)], "split at {split}");
            assert!(logs.contains("REC-09"), "split at {split}: {logs}");
            assert!(logs.contains("line=3"), "split at {split}: {logs}");
            assert_eq!(after, base, "split at {split}");
        }
    }
}

#[test]
fn a_record_without_its_start_before_other_records_stops_startup() {
    // REC-08: a record without its start that has records after it is not
    // taken for the end of a crash's last write: startup stops naming its
    // line, the safe side (a crash can leave this when several records
    // awaited one sync; discarding it then is left to an operator).
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    let second = record::admit_line(&entry(2));
    let mut bytes = record::admit_line(&entry(1));
    bytes.extend_from_slice(&[0u8; 10]);
    bytes.extend_from_slice(&second[10..]);
    bytes.extend_from_slice(&record::admit_line(&entry(3)));
    write_private(&journal, &bytes);
    let err = Ledger::open(&s.rec).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("line 2"), "{err}");
    assert_eq!(fs::read(&journal).unwrap(), bytes, "nothing was cut");
}

#[test]
fn a_compaction_with_zeros_between_its_records_is_not_completed() {
    // REC-05: a compaction's file with a page that never reached the disk
    // (zeros between its lines) is incomplete, even with an end marker that
    // counts the lines it has: it is removed and the journal it would have
    // replaced is kept, entry 2 with it.
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    let old = [
        record::admit_line(&entry(1)),
        record::admit_line(&entry(2)),
        record::admit_line(&entry(3)),
        record::release_line(id(3)),
    ]
    .concat();
    write_private(&journal, &old);
    let mut new = record::admit_line(&entry(1));
    new.extend_from_slice(&vec![0u8; record::admit_line(&entry(2)).len()]);
    new.extend_from_slice(&record::end_line(1));
    write_private(&s.rec.join(COMPACT_FILE), &new);
    let (_ledger, entries) = Ledger::open(&s.rec).unwrap();
    assert_eq!(ids(&entries), vec![id(1), id(2)]);
    assert!(!s.rec.join(COMPACT_FILE).exists());
    assert_eq!(fs::read(&journal).unwrap(), old);
}

#[test]
fn a_record_cut_short_in_the_zeros_ahead_is_discarded_at_every_byte() {
    // REC-09: a crash while the newest record was written over the zeros
    // leaves a prefix of it and the zeros after: discarded with a warning
    // naming the line, never a startup failure; whole, it is replayed.
    let base = [record::admit_line(&entry(1)), record::admit_line(&entry(2))].concat();
    let last = record::release_line(id(2));
    for cut in 0..=last.len() {
        let mut bytes = base.clone();
        bytes.extend_from_slice(&last[..cut]);
        let (entries, logs, after) = open_after_a_crash(bytes, &format!("cut at {cut}"));
        if cut == last.len() {
            assert_eq!(ids(&entries), vec![id(1)]);
            assert_eq!(after.len(), base.len() + last.len());
        } else {
            assert_eq!(ids(&entries), vec![id(1), id(2)], "cut at {cut}");
            assert_eq!(after, base, "cut at {cut}");
            if cut > 0 {
                assert!(logs.contains("REC-09"), "cut at {cut}: {logs}");
                assert!(logs.contains("line=3"), "cut at {cut}: {logs}");
                assert!(
                    logs.contains(&format!("bytes={cut}")),
                    "cut at {cut}: {logs}"
                );
            }
        }
    }
}

#[test]
fn a_complete_compaction_with_zeros_ahead_is_completed_at_open() {
    // REC-05: a compaction's file is written with its zeros ahead; a crash
    // before its rename leaves it complete all the same.
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    write_private(
        &journal,
        &[
            record::admit_line(&entry(1)),
            record::admit_line(&entry(2)),
            record::release_line(id(2)),
        ]
        .concat(),
    );
    let compacted = [record::admit_line(&entry(1)), record::end_line(1)].concat();
    let mut new = compacted.clone();
    new.extend_from_slice(&[0u8; 2048]);
    write_private(&s.rec.join(COMPACT_FILE), &new);
    let (_ledger, entries) = Ledger::open(&s.rec).unwrap();
    assert_eq!(ids(&entries), vec![id(1)]);
    assert!(!s.rec.join(COMPACT_FILE).exists());
    assert_eq!(fs::read(&journal).unwrap(), compacted);
}

/// A ledger on a disk in memory that fails the writes it is told to.
fn on_a_fault_disk() -> (MemDisk, FaultDisk, std::path::PathBuf, Ledger) {
    let mem = MemDisk::new();
    let disk = FaultDisk::new(Arc::new(mem.clone()));
    let dir = std::path::PathBuf::from("/mem/rec");
    let (ledger, _) = Ledger::open_on(&dir, Arc::new(disk.clone())).unwrap();
    (mem, disk, dir, ledger)
}

#[tokio::test]
async fn when_the_zeros_cannot_be_written_the_record_is_appended() {
    // REC-01 on a full disk: the zeros' write fails, and the record is
    // still written and synced at the end of the file, as a plain append.
    let (mem, disk, dir, ledger) = on_a_fault_disk();
    disk.set_fault(Some(Fault::Once {
        at: disk.writes(),
        errno: 28,
        torn: true,
    }));
    ledger.persist(&reservation(1, None)).await.unwrap();
    let kinds: Vec<(OpKind, bool)> = disk
        .log()
        .iter()
        .map(|op| (op.kind, op.failed.is_some()))
        .collect();
    assert!(
        kinds.ends_with(&[
            (OpKind::Write, true),
            (OpKind::SetLen, false),
            (OpKind::Write, false),
            (OpKind::SyncData, false),
        ]),
        "{kinds:?}"
    );
    let journal = dir.join(JOURNAL_FILE);
    // The record alone: the half of the zeros the failed write left was cut off.
    let text = String::from_utf8(mem.contents(&journal).unwrap()).unwrap();
    assert!(text.starts_with("{\"v\":1,\"op\":\"admit\""), "{text:?}");
    assert_eq!(text.find('\n'), Some(text.len() - 1), "{text:?}");
    // The records after it go after it: the next zeros never over it.
    ledger.persist(&reservation(2, None)).await.unwrap();
    ledger.persist(&reservation(3, None)).await.unwrap();
    drop(ledger);
    let (_ledger, entries) = Ledger::open_on(&dir, Arc::new(disk)).unwrap();
    assert_eq!(ids(&entries), vec![id(1), id(2), id(3)]);
}

#[tokio::test]
async fn on_a_disk_too_small_for_the_zeros_every_record_is_kept() {
    // REC-01, REC-02 (the full_disk test's 64 KiB tmpfs, in memory): every
    // zeros' write fails, each record is appended alone, and each comes
    // back after a reopen, with no zero over any of them.
    let (mem, disk, dir, ledger) = on_a_fault_disk();
    for n in 1..=5 {
        // Fail the next write (the zeros), torn: half of them land first.
        disk.set_fault(Some(Fault::Once {
            at: disk.writes(),
            errno: 28,
            torn: true,
        }));
        ledger.persist(&reservation(n, None)).await.unwrap();
    }
    ledger.forget(id(2)).await.unwrap();
    let journal = dir.join(JOURNAL_FILE);
    let bytes = mem.contents(&journal).unwrap();
    let records = &bytes[..records_len(&bytes)];
    assert!(
        !records.contains(&0),
        "{:?}",
        String::from_utf8_lossy(records)
    );
    assert_eq!(String::from_utf8_lossy(records).lines().count(), 6);
    drop(ledger);
    let (_ledger, entries) = Ledger::open_on(&dir, Arc::new(disk)).unwrap();
    assert_eq!(ids(&entries), vec![id(1), id(3), id(4), id(5)]);
}
