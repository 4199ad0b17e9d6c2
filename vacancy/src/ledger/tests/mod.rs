//! Ledger unit tests, each naming the rule it checks. Every test writes only
//! under its own temporary directory.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod faults;
mod files;
mod journal;
mod location;
mod prewrite;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::engine::{Charge, CompletionMethod, EntryId, Reservation};
use crate::time::Moment;

/// A temporary directory with a private `rec` directory inside (mode 0700).
pub(super) struct Scratch {
    pub(super) tmp: tempfile::TempDir,
    pub(super) rec: PathBuf,
}

pub(super) fn scratch() -> Scratch {
    let tmp = tempfile::tempdir().unwrap();
    let rec = tmp.path().join("rec");
    fs::DirBuilder::new().mode(0o700).create(&rec).unwrap();
    fs::set_permissions(&rec, fs::Permissions::from_mode(0o700)).unwrap();
    Scratch { tmp, rec }
}

/// A reservation on `gpu0` (and `ram`) for upstream `comfy`.
pub(super) fn reservation(n: u128, upstream_ref: Option<&str>) -> Reservation {
    Reservation {
        id: EntryId::from_u128(n),
        upstream: "comfy".to_owned(),
        model: Some("sdxl".to_owned()),
        charges: vec![
            Charge {
                resource: "gpu0".to_owned(),
                required_mib: 6000,
                free_mib: 20_000,
            },
            Charge {
                resource: "ram".to_owned(),
                required_mib: 0,
                free_mib: 30_000,
            },
        ],
        resident_credit: false,
        admitted_at: Moment::from_secs(1),
        completion: CompletionMethod::Tracked,
        upstream_ref: upstream_ref.map(str::to_owned),
        borrower: None,
    }
}

/// Entry number `n`'s ID.
pub(super) fn id(n: u128) -> EntryId {
    EntryId::from_u128(n)
}

/// The entries' IDs, in order.
pub(super) fn ids(entries: &[crate::ledger::RecoveredEntry]) -> Vec<EntryId> {
    entries.iter().map(|e| e.id).collect()
}

/// Entry `n` as the journal records it, with a fixed start.
pub(super) fn entry(n: u128) -> crate::ledger::RecoveredEntry {
    crate::ledger::RecoveredEntry::from_reservation(
        &reservation(n, None),
        1_767_225_600_000 + n as u64,
    )
}

/// Append raw bytes to a file, created private (mode 0600) as vacancyd
/// creates the files of a recovery directory.
pub(super) fn append(path: &Path, bytes: &[u8]) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    f.write_all(bytes).unwrap();
}

/// Write a file of a recovery directory, private (mode 0600) as vacancyd
/// writes it.
pub(super) fn write_private(path: &Path, bytes: &[u8]) {
    fs::write(path, bytes).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
}

/// Captured log output of a closure run with a thread-local subscriber.
pub(super) fn with_logs<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    (out, text)
}
