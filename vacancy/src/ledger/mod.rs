//! The durable reservation ledger: the recovery directory.
//!
//! Every reservation is on disk before its request is forwarded (REC-01), so a
//! crash never forgets work that may still run. After a restart every
//! unresolved record comes back, and the daemon returns it as held (REC-02).
//!
//! # Layout
//!
//! The recovery directory (mode 0700, owned by the account vacancyd runs as)
//! holds:
//!
//! - `journal.jsonl`: an append-only journal, one JSON object per line, each
//!   ending in `\n` and carrying the format version `v`. Job metadata only:
//!   entry ID, upstream, model, resources, completion method, wall-clock
//!   start and the upstream's handle; never prompts, responses or
//!   credentials (REC-26).
//!
//!   ```text
//!   {"v":1,"op":"admit","id":"…","upstream":"comfy","model":"sdxl","resources":["gpu0","ram"],"completion":"tracked","started_unix_ms":1767225600000,"upstream_ref":"…"}
//!   {"v":1,"op":"held","id":"…","reason":"the response broke off"}
//!   {"v":1,"op":"ref","id":"…","upstream_ref":"…"}
//!   {"v":1,"op":"release","id":"…"}
//!   {"v":1,"op":"end","entries":1}
//!   ```
//!
//!   `resources` lists the primary resource first; `completion` is
//!   `response_end`, `tracked` or `held_on_close`; `end` closes a compacted
//!   file and counts the entries before it. A reader refuses lines with a
//!   newer `v` than it knows.
//!
//!   While the ledger is open, zero bytes follow the last line
//!   ([`disk::JOURNAL_PREWRITE`] of them, written ahead): each new line is
//!   written over them, so its `fdatasync` need not also commit a new file
//!   size (a third of the sync's time on ext4, issue 31). Replay passes over
//!   zeros where a line would start; a clean close and every open cut them
//!   off, so a closed journal is its lines alone.
//! - `journal.jsonl.new`: only while a compaction is being written.
//! - `lock`: locked exclusively for the ledger's life; it names the holder's
//!   pid and since when (REC-25).
//!
//! Each file is opened as itself, never through a symbolic link, and must be
//! a regular file owned by the directory's owner with mode 0600, as vacancyd
//! creates it ([`open_private`]); otherwise opening stops with its path and
//! the fix. The learned Ollama contexts and the GPU pressure calibration
//! beside them are read the same way.
//!
//! # Behavior
//!
//! - [`Ledger::persist`](crate::ledger::store::ReservationStore::persist) appends the
//!   `admit` line and waits for one `fdatasync` of the journal: the only sync
//!   on the request path (REC-01). One writer thread does the blocking
//!   I/O and applies changes whole, in the order they were submitted, so a
//!   release never overtakes the admission it releases.
//! - `mark_held`, `forget` and [`Ledger::rewrite_ref`] append and sync too, off
//!   the request path. A change for an entry the ledger no longer holds (a
//!   hold reported after its release) writes nothing, so the journal never
//!   names an unknown entry.
//! - When a line does not fit in the zeros written ahead, more are written
//!   first; if that fails (a full disk), the line is appended alone.
//! - A failed append is cut back off the file; if that or a sync fails, the
//!   ledger refuses every further write (the proxy then refuses work with
//!   `ledger_unavailable`) until a restart replays what is on disk.
//! - When the journal holds many dead lines, a release compacts it: the live
//!   entries are written to `journal.jsonl.new` with an `end` marker,
//!   synced, renamed over the journal, and the directory synced, so a crash
//!   leaves one or the other (REC-04). At open, a complete `.new` is
//!   completed (REC-05) and an incomplete one removed with a warning.
//! - At open the journal is replayed (REC-02). A cut-short newest line (no
//!   terminating newline, or only its end, after the zeros written ahead:
//!   a write over them can reach the disk end first) is discarded with a
//!   warning and cut off the file (REC-09); zeros before any other line
//!   are logged with their offset; any other malformed line, a complete newest one included,
//!   an impossible value, unknown op, change for an unknown entry or
//!   duplicate admission stops startup with an error naming the file and
//!   line (REC-08).
//! - Where the directory is, and whether it may be created, is decided by
//!   [`resolve_location`] (REC-10..REC-22). vacancyd never deletes the
//!   directory or its journal (REC-07).

pub mod disk;
mod error;
mod files;
mod location;
mod lock;
mod queue;
mod record;
pub mod store;
mod writer;

#[cfg(test)]
mod tests;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::SystemTime;

use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::engine::EntryId;

pub use disk::{AtomicWriteError, Disk, DiskFile, RealDisk, write_atomically};
pub use error::LedgerError;
pub use files::{PRIVATE_FILE_MODE, check_private, open_private, read_private};
pub use location::{
    Location, LocationInput, LocationSource, SERVICE_BASE, SERVICE_BASE_ENV, check_recovery_dir,
    recovery_path, resolve_location,
};
pub use record::RecoveredEntry;
pub use store::{
    ReservationStore, StoreChange, StoreError, StoreFailure, StoreWrite, UsageSink, VolatileStore,
};

use queue::Queue;
use record::{LiveSet, Replay};
use writer::{Appended, Change, Job, Writer};

/// The journal's file name inside the recovery directory.
pub const JOURNAL_FILE: &str = "journal.jsonl";
/// The compaction file's name, present only while a compaction is written.
pub const COMPACT_FILE: &str = "journal.jsonl.new";

/// The durable reservation ledger in one recovery directory.
///
/// Cheap to clone: clones share one writer thread, which owns the journal
/// and the lock. Dropping the last clone waits for the writes already
/// submitted, then releases the lock.
///
/// # Behavior
///
/// Implements [`ReservationStore`]: `persist` returns only after the
/// reservation's record is synced (REC-01), with exactly one `fdatasync` on
/// the request path. Records hold job metadata only (REC-26). Only one
/// ledger may hold a directory at a time (REC-25). See the
/// [module docs](self) for the journal and its recovery (REC-02, REC-04,
/// REC-05, REC-08, REC-09).
#[derive(Debug, Clone)]
pub struct Ledger {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    journal_path: PathBuf,
    /// To the writer thread, which owns the journal and the lock (REC-25).
    queue: Arc<Queue<Job>>,
    worker: Option<JoinHandle<()>>,
}

impl Drop for Inner {
    /// Close the queue and wait for the writer to finish what was submitted
    /// and release the lock, so that a next open finds the directory free.
    fn drop(&mut self) {
        self.queue.close();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

impl Ledger {
    /// Open the recovery directory `dir`, replay its journal and return every
    /// unresolved entry.
    ///
    /// Blocking: call it at startup, before serving.
    ///
    /// # Behavior
    ///
    /// - `dir` must exist, be owned by the running account and have mode 0700
    ///   (REC-22, [`check_recovery_dir`]); use [`resolve_location`] first to
    ///   find and, for the default, create it (REC-10..REC-21).
    /// - Takes the directory's exclusive lock, failing with
    ///   [`LedgerError::InUse`] naming the holder's pid while another daemon
    ///   has it (REC-25).
    /// - Completes a complete `journal.jsonl.new` left by a crash during
    ///   compaction (REC-05) and removes an incomplete one with a warning.
    /// - Replays the journal: a cut-short newest line (no terminating
    ///   newline) is discarded with a warning and cut off the file (REC-09);
    ///   any other malformation, a complete newest line included, stops with
    ///   [`LedgerError::Corrupt`] naming the file and line (REC-08).
    /// - Returns every unresolved entry, oldest first, whatever its phase
    ///   before the restart: the caller restores each with
    ///   [`Engine::restore_held`](crate::engine::Engine::restore_held), which
    ///   stops startup on a changed resource mapping (REC-08), and returns them
    ///   all as held (REC-02). Nothing here releases work.
    pub fn open(dir: &Path) -> Result<(Ledger, Vec<RecoveredEntry>), LedgerError> {
        check_recovery_dir(dir)?;
        let lock = lock::acquire(dir)?;
        Self::open_locked(dir, Arc::new(RealDisk), Some(lock))
    }

    /// Open the ledger of `dir` on another disk: a [`disk::FaultDisk`] that
    /// fails a chosen write, or a [`disk::MemDisk`] for the simulation.
    ///
    /// As [`open`](Self::open), but the directory is not checked and not
    /// locked: for tests and simulations, never for a daemon.
    #[cfg(any(test, feature = "testkit"))]
    pub fn open_on(
        dir: &Path,
        disk: Arc<dyn Disk>,
    ) -> Result<(Ledger, Vec<RecoveredEntry>), LedgerError> {
        Self::open_locked(dir, disk, None)
    }

    fn open_locked(
        dir: &Path,
        disk: Arc<dyn Disk>,
        lock: Option<File>,
    ) -> Result<(Ledger, Vec<RecoveredEntry>), LedgerError> {
        let journal_path = dir.join(JOURNAL_FILE);
        finish_compaction(disk.as_ref(), dir, &journal_path)?;

        let created = !disk
            .exists(&journal_path)
            .map_err(|e| LedgerError::io("inspect", &journal_path, e))?;
        let mut file = disk.open_rw(&journal_path, true)?;
        if created {
            file.sync_all()
                .map_err(|e| LedgerError::io("sync the new journal", &journal_path, e))?;
            sync_dir_on(disk.as_ref(), dir)?;
            info!(path = %journal_path.display(), "created an empty journal");
        }
        let bytes = disk.read(&journal_path)?.unwrap_or_default();
        let replay = record::replay(&bytes, &journal_path)?;
        if let Some(tail) = &replay.discarded {
            warn!(
                path = %journal_path.display(),
                line = tail.line,
                bytes = tail.bytes,
                "discarding the newest journal record: a crash cut it short while it was being \
                 saved, before it was acknowledged, so no request was forwarded on it (REC-09)"
            );
        }
        if let Some(gap) = &replay.zero_gap {
            warn!(
                path = %journal_path.display(),
                line = gap.line,
                offset = gap.offset,
                bytes = gap.bytes,
                "the journal has zero bytes before a record: a page of it never reached the \
                 disk (a crash while several records awaited one sync can leave this) or \
                 something else wrote the file; the records after them were read, and any \
                 record that stood there, never acknowledged, is gone"
            );
        }
        // A cut-short record goes, and with it any zeros a writer that did
        // not close cleanly had written ahead: the writer writes its own.
        if bytes.len() as u64 > replay.good_len {
            let what = if replay.discarded.is_some() {
                "cut the partial record off"
            } else {
                "cut the zeros written ahead off"
            };
            file.set_len(replay.good_len)
                .and_then(|()| file.sync_all())
                .map_err(|e| LedgerError::io(what, &journal_path, e))?;
        }
        let Replay {
            live,
            good_len,
            lines,
            ..
        } = replay;
        let entries: Vec<RecoveredEntry> = live.ordered().into_iter().cloned().collect();
        for e in &entries {
            info!(
                entry = %e.id,
                held = e.held_reason.is_some(),
                "recovered an unresolved work entry"
            );
        }
        let live_lines = live_lines(&live);
        let prewrite = disk.journal_prewrite();
        let writer = Writer {
            dir: dir.to_path_buf(),
            journal_path: journal_path.clone(),
            disk,
            file,
            len: good_len,
            allocated: good_len,
            prewrite,
            lines,
            live,
            live_lines,
            unavailable: None,
            compact_min_lines: writer::COMPACT_MIN_LINES,
            deferred_sync: writer::DEFERRED_SYNC,
            syncs: 0,
            usage: None,
        };
        let (queue, worker) = writer::spawn(writer, lock)?;
        let ledger = Ledger {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                journal_path,
                queue,
                worker: Some(worker),
            }),
        };
        Ok((ledger, entries))
    }

    /// The recovery directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The journal file.
    pub fn journal_path(&self) -> &Path {
        &self.inner.journal_path
    }

    /// Record that the upstream reported its own ID for an entry's work
    /// (ComfyUI before 0.3.45).
    ///
    /// # Behavior
    ///
    /// Appends a `ref` line and syncs it: after a crash the entry comes back
    /// with either the old or the new handle, never neither (REC-04). On an
    /// error the caller keeps tracking with the upstream's ID; the old
    /// record still survives a crash, and this logs both IDs (REC-06).
    pub async fn rewrite_ref(&self, entry: EntryId, upstream_ref: &str) -> Result<(), LedgerError> {
        let change = Change::Ref {
            id: entry,
            upstream_ref: upstream_ref.to_owned(),
        };
        let queued = self.submit(change);
        ref_written(&self.inner.dir, entry, upstream_ref, queued).await
    }

    /// Compact the journal now if it holds any dead lines; otherwise nothing.
    ///
    /// # Behavior
    ///
    /// Writes the live entries and an `end` marker to `journal.jsonl.new`,
    /// syncs it, renames it over the journal and syncs the directory: a crash
    /// leaves one or the other (REC-04), and a complete `.new` is completed at
    /// the next open (REC-05). A failure before the rename keeps the old
    /// journal; a failure after it makes the ledger unavailable. Releases
    /// compact on their own once the journal holds more than 1000 lines and
    /// more than twice the lines a compaction keeps.
    pub async fn compact(&self) -> Result<(), LedgerError> {
        let (tx, rx) = oneshot::channel();
        self.send(Job::Compact(tx))?;
        rx.await.map_err(|_| self.stopped())?
    }

    /// Write each borrower's finished reservation to `sink` from now on
    /// (issue 34), from the writer's thread, before the entry's release.
    ///
    /// # Errors
    ///
    /// The writer has stopped.
    pub fn set_usage_sink(&self, sink: Box<dyn UsageSink>) -> Result<(), LedgerError> {
        self.send(Job::UsageSink(sink))
    }

    /// Queue a change synchronously, before the caller's first await: the
    /// writer applies changes in submission order, so an admission whose
    /// request is cancelled mid-`persist` is written before the release
    /// that the dropped guard sends after it.
    fn submit(
        &self,
        change: Change,
    ) -> Result<oneshot::Receiver<Result<Appended, LedgerError>>, LedgerError> {
        let (tx, rx) = oneshot::channel();
        self.send(Job::Change(change, tx))?;
        Ok(rx)
    }

    fn send(&self, job: Job) -> Result<(), LedgerError> {
        let urgent = job.wakes_writer();
        self.inner
            .queue
            .push(job, urgent)
            .map_err(|_| self.stopped())
    }

    fn stopped(&self) -> LedgerError {
        LedgerError::Unavailable {
            path: self.inner.dir.clone(),
            reason: "the journal writer stopped".to_owned(),
        }
    }

    /// Run `f` on the writer's state, in queue order (tests).
    #[cfg(test)]
    fn inspect<T: Send + 'static>(&self, f: impl FnOnce(&mut Writer) -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        self.send(Job::Inspect(Box::new(move |w| {
            let _ = tx.send(f(w));
        })))
        .unwrap_or_else(|e| panic!("{e}"));
        rx.recv().unwrap_or_else(|e| panic!("{e}"))
    }

    #[cfg(test)]
    fn live_entries(&self) -> usize {
        self.inspect(|w| w.live.len())
    }

    /// Compact on release once the journal has more than `n` lines (and
    /// more than twice the lines a compaction keeps), instead of 1000: for
    /// tests and simulations that want compactions often.
    #[cfg(any(test, feature = "testkit"))]
    pub fn set_compact_min_lines(&self, n: u64) {
        // Queued like a change, so it applies to every later one; a stopped
        // writer has nothing to tune.
        let _ = self.send(Job::CompactMinLines(n));
    }

    /// Let a release or hold wait up to `window` for the next sync instead
    /// of 5 ms: zero syncs each at once, for a simulation that waits for
    /// every write.
    #[cfg(any(test, feature = "testkit"))]
    pub fn set_deferred_sync(&self, window: std::time::Duration) {
        let _ = self.send(Job::DeferredSync(window));
    }

    #[cfg(test)]
    fn syncs(&self) -> u64 {
        self.inspect(|w| w.syncs)
    }

    #[cfg(test)]
    fn journal_lines(&self) -> u64 {
        self.inspect(|w| w.lines)
    }
}

impl ReservationStore for Ledger {
    fn submit(&self, change: StoreChange) -> StoreWrite {
        let entry = change.entry();
        let dir = self.inner.dir.clone();
        let new_ref = match &change {
            StoreChange::Ref { upstream_ref, .. } => Some(upstream_ref.clone()),
            _ => None,
        };
        // Queued now, in the caller's order; only the wait is deferred.
        let queued = self.submit(journal_change(change));
        Box::pin(async move {
            let result = match new_ref {
                Some(upstream_ref) => ref_written(&dir, entry, &upstream_ref, queued).await,
                None => written(&dir, queued).await.map(|_| ()),
            };
            result.map_err(|e| StoreError {
                entry,
                reason: e.into(),
            })
        })
    }
}

/// The journal's form of a store change.
fn journal_change(change: StoreChange) -> Change {
    match change {
        StoreChange::Admit(r) => Change::Admit(RecoveredEntry::from_reservation(
            &r,
            record::unix_ms(SystemTime::now()),
        )),
        StoreChange::Held { entry, reason } => Change::Held { id: entry, reason },
        StoreChange::Ref {
            entry,
            upstream_ref,
        } => Change::Ref {
            id: entry,
            upstream_ref,
        },
        StoreChange::Release(entry) => Change::Release { id: entry },
        StoreChange::Account(record) => Change::Account(record),
    }
}

/// Wait for a queued change's reply.
async fn written(
    dir: &Path,
    queued: Result<oneshot::Receiver<Result<Appended, LedgerError>>, LedgerError>,
) -> Result<Appended, LedgerError> {
    let stopped = || LedgerError::Unavailable {
        path: dir.to_path_buf(),
        reason: "the journal writer stopped".to_owned(),
    };
    queued?.await.map_err(|_| stopped())?
}

/// Wait for a queued `ref` change and log what it did (REC-04, REC-06).
async fn ref_written(
    dir: &Path,
    entry: EntryId,
    upstream_ref: &str,
    queued: Result<oneshot::Receiver<Result<Appended, LedgerError>>, LedgerError>,
) -> Result<(), LedgerError> {
    let result = match written(dir, queued).await {
        Ok(Appended::Written { previous_ref }) => {
            info!(
                entry = %entry,
                recorded_ref = previous_ref.as_deref().unwrap_or(""),
                upstream_ref,
                "rewrote the record with the upstream's own ID (REC-04)"
            );
            return Ok(());
        }
        Ok(Appended::NoEntry) => Err(LedgerError::UnknownEntry {
            path: dir.to_path_buf(),
            entry,
        }),
        Err(e) => Err(e),
    };
    if let Err(e) = &result {
        warn!(
            entry = %entry,
            upstream_ref,
            error = %e,
            "could not rewrite the record with the upstream's own ID; tracking continues with \
             the upstream's ID and the record keeps the old one (REC-06)"
        );
    }
    result
}

/// Lines a compaction keeps for these entries (the end marker not counted).
fn live_lines(live: &LiveSet) -> u64 {
    live.ordered()
        .iter()
        .map(|e| 1 + u64::from(e.held_reason.is_some()))
        .sum()
}

/// At open: complete a complete compaction left by a crash (REC-05), remove
/// an incomplete one.
fn finish_compaction(disk: &dyn Disk, dir: &Path, journal_path: &Path) -> Result<(), LedgerError> {
    let new_path = dir.join(COMPACT_FILE);
    let Some(bytes) = disk.read(&new_path)? else {
        return Ok(());
    };
    let complete = match record::replay(&bytes, &new_path) {
        // Zeros between its lines: a page of it never reached the disk.
        Ok(r) => r.discarded.is_none() && r.zero_gap.is_none() && r.ends_with_marker,
        Err(_) => false,
    };
    if complete {
        disk.rename(&new_path, journal_path)
            .map_err(|e| LedgerError::io("complete the compaction by renaming", &new_path, e))?;
        sync_dir_on(disk, dir)?;
        warn!(
            path = %new_path.display(),
            "completed a journal compaction that a crash interrupted before its rename (REC-05)"
        );
    } else {
        disk.remove(&new_path)
            .map_err(|e| LedgerError::io("remove the incomplete compaction", &new_path, e))?;
        sync_dir_on(disk, dir)?;
        warn!(
            path = %new_path.display(),
            "removed an incomplete journal compaction left by a crash; the journal beside it is \
             complete"
        );
    }
    Ok(())
}

/// Make a directory's entries (a created or renamed file) durable.
#[cfg(unix)]
pub(crate) fn sync_dir(dir: &Path) -> Result<(), LedgerError> {
    sync_dir_on(&RealDisk, dir)
}

/// [`sync_dir`] on `disk`.
pub(crate) fn sync_dir_on(disk: &dyn Disk, dir: &Path) -> Result<(), LedgerError> {
    disk.sync_dir(dir)
        .map_err(|e| LedgerError::io("sync the directory", dir, e))
}
