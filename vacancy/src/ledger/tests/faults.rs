//! The ledger on a disk that fails chosen writes ([`FaultDisk`]) or keeps its
//! files in memory and crashes ([`MemDisk`]) (issue 18 items 3 and 7).

use std::path::PathBuf;
use std::sync::Arc;

use super::reservation;
use crate::engine::EntryId;
use crate::ledger::disk::{Fault, FaultDisk, MemDisk};
use crate::ledger::{Ledger, RecoveredEntry};
use crate::proxy::ReservationStore;

const ENOSPC: i32 = 28;

fn dir() -> PathBuf {
    PathBuf::from("/mem/rec")
}

fn open_on(disk: &FaultDisk) -> (Ledger, Vec<RecoveredEntry>) {
    Ledger::open_on(&dir(), Arc::new(disk.clone())).unwrap()
}

fn ids(entries: &[RecoveredEntry]) -> Vec<EntryId> {
    entries.iter().map(|e| e.id).collect()
}

/// The disk after a crash that kept only the first `dir_ops` directory
/// changes not yet synced, and all file data.
fn crash_keeping(mem: &MemDisk, dir_ops: u64) -> FaultDisk {
    let mut first = true;
    let image = mem.crash_image(&mut |n| {
        if std::mem::take(&mut first) {
            dir_ops.min(n - 1)
        } else {
            n - 1
        }
    });
    FaultDisk::new(Arc::new(image))
}

#[tokio::test]
async fn a_failed_compaction_never_comes_back_over_newer_records() {
    // REC-05: found by the simulation (seed 29). A compaction whose rename
    // failed removed its file without syncing the directory; a crash could
    // bring the complete stale file back, and the next open completed it
    // over the records appended since.
    let mem = MemDisk::new();
    let disk = FaultDisk::new(Arc::new(mem.clone()));
    let (ledger, _) = open_on(&disk);
    ledger.persist(&reservation(1, None)).await.unwrap();
    ledger.forget(EntryId::from_u128(1)).await.unwrap();
    // Remove the stale file, create, write, sync, then the rename fails.
    let rename = disk.writes() + 4;
    disk.set_fault(Some(Fault::Once {
        at: rename,
        errno: ENOSPC,
        torn: false,
    }));
    assert!(ledger.compact().await.is_err());
    ledger.persist(&reservation(2, None)).await.unwrap();
    drop(ledger);
    // Keep the compaction file's creation, lose its removal.
    let (_ledger, entries) = open_on(&crash_keeping(&mem, 1));
    assert_eq!(ids(&entries), vec![EntryId::from_u128(2)]);
}
