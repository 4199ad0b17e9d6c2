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
//! - `journal.jsonl.new`: only while a compaction is being written.
//! - `lock`: locked exclusively for the ledger's life; it names the holder's
//!   pid and since when (REC-25).
//!
//! # Behavior
//!
//! - [`Ledger::persist`](crate::proxy::ReservationStore::persist) appends the
//!   `admit` line and waits for one `fdatasync` of the journal: the only sync
//!   on the request path (DESIGN §8). The blocking I/O runs on tokio's
//!   blocking pool; one mutex keeps appends whole and in order.
//! - `mark_held`, `forget` and [`Ledger::rewrite_ref`] append and sync too, off
//!   the request path. A change for an entry the ledger no longer holds (a
//!   hold reported after its release) writes nothing, so the journal never
//!   names an unknown entry.
//! - A failed append is cut back off the file; if that or a sync fails, the
//!   ledger refuses every further write (the proxy then refuses work with
//!   `ledger_unavailable`) until a restart replays what is on disk.
//! - When the journal holds many dead lines, a release compacts it: the live
//!   entries are written to `journal.jsonl.new` with an `end` marker,
//!   synced, renamed over the journal, and the directory synced, so a crash
//!   leaves one or the other (REC-04). At open, a complete `.new` is
//!   completed (REC-05) and an incomplete one removed with a warning.
//! - At open the journal is replayed (REC-02). A cut-short newest line is
//!   discarded with a warning and cut off the file (REC-09); any other
//!   malformed line, unknown op, change for an unknown entry or duplicate
//!   admission stops startup with an error naming the file and line (REC-08).
//! - Where the directory is, and whether it may be created, is decided by
//!   [`resolve_location`] (REC-10..REC-22). vacancyd never deletes the
//!   directory or its journal (REC-07).

mod error;
mod location;
mod lock;
mod record;

#[cfg(test)]
mod tests;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use async_trait::async_trait;
use tracing::{debug, info, warn};

use crate::engine::{EntryId, Reservation};
use crate::proxy::{ReservationStore, StoreError};

pub use error::LedgerError;
pub use location::{
    Location, LocationInput, LocationSource, SERVICE_BASE, check_recovery_dir, resolve_location,
};
pub use record::RecoveredEntry;

use record::{LiveSet, Replay};

/// The journal's file name inside the recovery directory.
pub const JOURNAL_FILE: &str = "journal.jsonl";
/// The compaction file's name, present only while a compaction is written.
pub const COMPACT_FILE: &str = "journal.jsonl.new";

/// Compact once the journal has more lines than this…
const COMPACT_MIN_LINES: u64 = 1000;
/// …and more than this many times the live entries' lines.
const COMPACT_RATIO: u64 = 2;

/// The durable reservation ledger in one recovery directory.
///
/// Cheap to clone: clones share the journal and the lock, which is released
/// when the last clone is dropped.
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
    state: Mutex<State>,
    /// Held for the ledger's life: the exclusive lock (REC-25).
    _lock: File,
}

#[derive(Debug)]
struct State {
    file: File,
    /// Bytes in the journal, all of them whole lines.
    len: u64,
    /// Lines in the journal.
    lines: u64,
    live: LiveSet,
    /// Lines a compaction would keep: one per live entry, plus one per hold.
    live_lines: u64,
    /// Set when the journal's state is in doubt: no more writes.
    unavailable: Option<String>,
    compact_min_lines: u64,
}

/// One change to the journal.
enum Change {
    Admit(RecoveredEntry),
    Held { id: EntryId, reason: String },
    Ref { id: EntryId, upstream_ref: String },
    Release { id: EntryId },
}

impl Change {
    fn id(&self) -> EntryId {
        match self {
            Change::Admit(e) => e.id,
            Change::Held { id, .. } | Change::Ref { id, .. } | Change::Release { id } => *id,
        }
    }
}

/// What an append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Appended {
    Written,
    /// The entry is gone already: nothing to record.
    NoEntry,
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
    /// - Replays the journal: a cut-short newest line is discarded with a
    ///   warning and cut off the file (REC-09); any other malformation stops
    ///   with [`LedgerError::Corrupt`] naming the file and line (REC-08).
    /// - Returns every unresolved entry, oldest first, whatever its phase
    ///   before the restart: the caller restores each with
    ///   [`Engine::restore_held`](crate::engine::Engine::restore_held), which
    ///   stops startup on a changed resource mapping (REC-08), and returns them
    ///   all as held (REC-02). Nothing here releases work.
    pub fn open(dir: &Path) -> Result<(Ledger, Vec<RecoveredEntry>), LedgerError> {
        check_recovery_dir(dir)?;
        let lock = lock::acquire(dir)?;
        let journal_path = dir.join(JOURNAL_FILE);
        finish_compaction(dir, &journal_path)?;

        let created = !exists(&journal_path)?;
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&journal_path)
            .map_err(|e| LedgerError::io("open the journal", &journal_path, e))?;
        if created {
            file.sync_all()
                .map_err(|e| LedgerError::io("sync the new journal", &journal_path, e))?;
            sync_dir(dir)?;
            info!(path = %journal_path.display(), "created an empty journal");
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|e| LedgerError::io("read the journal", &journal_path, e))?;
        let replay = record::replay(&bytes, &journal_path)?;
        if let Some(tail) = &replay.discarded {
            warn!(
                path = %journal_path.display(),
                line = tail.line,
                bytes = tail.bytes,
                "discarding the newest journal record: a crash cut it short while it was being \
                 saved, so its request was never forwarded (REC-09)"
            );
            file.set_len(replay.good_len)
                .and_then(|()| file.sync_all())
                .map_err(|e| LedgerError::io("cut the partial record off", &journal_path, e))?;
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
                upstream = %e.upstream,
                held = e.held_reason.is_some(),
                "recovered an unresolved work entry"
            );
        }
        let live_lines = live_lines(&live);
        let ledger = Ledger {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                journal_path,
                state: Mutex::new(State {
                    file,
                    len: good_len,
                    lines,
                    live,
                    live_lines,
                    unavailable: None,
                    compact_min_lines: COMPACT_MIN_LINES,
                }),
                _lock: lock,
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

    #[cfg(test)]
    fn live_entries(&self) -> usize {
        self.inner.lock().map(|s| s.live.len()).unwrap_or(0)
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
        let inner = Arc::clone(&self.inner);
        let change = Change::Ref {
            id: entry,
            upstream_ref: upstream_ref.to_owned(),
        };
        let joined = tokio::task::spawn_blocking(move || {
            let old = inner
                .lock()
                .ok()
                .and_then(|s| s.live.get(entry).and_then(|e| e.upstream_ref.clone()));
            (old, inner.append(change))
        })
        .await;
        let (old, result) = match joined {
            Ok((old, Ok(Appended::Written))) => (old, Ok(())),
            Ok((old, Ok(Appended::NoEntry))) => (
                old,
                Err(LedgerError::UnknownEntry {
                    path: self.inner.dir.clone(),
                    entry,
                }),
            ),
            Ok((old, Err(e))) => (old, Err(e)),
            Err(e) => (
                None,
                Err(self
                    .inner
                    .unavailable(&format!("the journal writer stopped: {e}"))),
            ),
        };
        if let Err(e) = &result {
            warn!(
                entry = %entry,
                recorded_ref = old.as_deref().unwrap_or(""),
                upstream_ref,
                error = %e,
                "could not rewrite the record with the upstream's own ID; tracking continues with \
                 the upstream's ID and the record keeps the old one (REC-06)"
            );
        }
        result
    }

    /// Compact the journal now if it holds any dead lines; otherwise nothing.
    ///
    /// # Behavior
    ///
    /// Writes the live entries and an `end` marker to `journal.jsonl.new`,
    /// syncs it, renames it over the journal and syncs the directory: a crash
    /// leaves one or the other (REC-04), and a complete `.new` is completed at
    /// the next open (REC-05). A failure before the rename keeps the old
    /// journal; a failure after it makes the ledger unavailable.
    pub async fn compact(&self) -> Result<(), LedgerError> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let mut state = inner.lock()?;
            if state.lines > state.live_lines + 1 {
                inner.compact(&mut state)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| LedgerError::Unavailable {
            path: self.inner.dir.clone(),
            reason: format!("the journal writer stopped: {e}"),
        })?
    }

    #[cfg(test)]
    fn set_compact_min_lines(&self, n: u64) {
        if let Ok(mut s) = self.inner.lock() {
            s.compact_min_lines = n;
        }
    }

    #[cfg(test)]
    fn journal_lines(&self) -> u64 {
        self.inner.lock().map(|s| s.lines).unwrap_or(0)
    }

    async fn run(&self, change: Change) -> Result<Appended, LedgerError> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || inner.append(change))
            .await
            .map_err(|e| LedgerError::Unavailable {
                path: self.inner.dir.clone(),
                reason: format!("the journal writer stopped: {e}"),
            })?
    }

    fn store_error(&self, entry: EntryId, e: &LedgerError) -> StoreError {
        StoreError {
            entry,
            reason: e.to_string(),
        }
    }
}

#[async_trait]
impl ReservationStore for Ledger {
    async fn persist(&self, reservation: &Reservation) -> Result<(), StoreError> {
        let entry =
            RecoveredEntry::from_reservation(reservation, record::unix_ms(SystemTime::now()));
        let id = entry.id;
        match self.run(Change::Admit(entry)).await {
            Ok(_) => Ok(()),
            Err(e) => Err(self.store_error(id, &e)),
        }
    }

    async fn mark_held(&self, entry: EntryId, reason: &str) -> Result<(), StoreError> {
        let change = Change::Held {
            id: entry,
            reason: reason.to_owned(),
        };
        match self.run(change).await {
            Ok(_) => Ok(()),
            Err(e) => Err(self.store_error(entry, &e)),
        }
    }

    async fn forget(&self, entry: EntryId) -> Result<(), StoreError> {
        match self.run(Change::Release { id: entry }).await {
            Ok(_) => Ok(()),
            Err(e) => Err(self.store_error(entry, &e)),
        }
    }
}

impl Inner {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, State>, LedgerError> {
        self.state.lock().map_err(|_| LedgerError::Unavailable {
            path: self.dir.clone(),
            reason: "a journal write panicked".to_owned(),
        })
    }

    fn unavailable(&self, reason: &str) -> LedgerError {
        LedgerError::Unavailable {
            path: self.dir.clone(),
            reason: reason.to_owned(),
        }
    }

    /// Append one change and sync it (blocking).
    fn append(&self, change: Change) -> Result<Appended, LedgerError> {
        let mut guard = self.lock()?;
        let state = &mut *guard;
        if let Some(reason) = &state.unavailable {
            return Err(self.unavailable(reason));
        }
        let id = change.id();
        let line = match &change {
            Change::Admit(e) => {
                if state.live.contains(e.id) {
                    return Err(LedgerError::DuplicateEntry {
                        path: self.dir.clone(),
                        entry: e.id,
                    });
                }
                record::admit_line(e)
            }
            Change::Held { id, reason } => {
                if !state.live.contains(*id) {
                    debug!(entry = %id, "hold of an entry with no record (released already): nothing to write");
                    return Ok(Appended::NoEntry);
                }
                record::held_line(*id, reason)
            }
            Change::Ref { id, upstream_ref } => {
                if !state.live.contains(*id) {
                    return Ok(Appended::NoEntry);
                }
                record::ref_line(*id, upstream_ref)
            }
            Change::Release { id } => {
                if !state.live.contains(*id) {
                    debug!(entry = %id, "release of an entry with no record: nothing to write");
                    return Ok(Appended::NoEntry);
                }
                record::release_line(*id)
            }
        };
        let before = state.len;
        if let Err(e) = state.file.write_all(&line) {
            // Cut the partial line off so later appends stay readable.
            if let Err(cut) = state.file.set_len(before) {
                let reason = format!(
                    "appending failed ({e}) and the partial record could not be cut off ({cut})"
                );
                warn!(entry = %id, path = %self.journal_path.display(), reason = %reason, "journal unavailable");
                state.unavailable = Some(reason);
            }
            return Err(LedgerError::io("append to", &self.journal_path, e));
        }
        if let Err(e) = state.file.sync_data() {
            // After a failed sync the file's contents are in doubt (the kernel
            // may have dropped the dirty pages): stop writing.
            let reason = format!("syncing the journal failed ({e})");
            warn!(entry = %id, path = %self.journal_path.display(), reason = %reason, "journal unavailable");
            state.unavailable = Some(reason);
            return Err(LedgerError::io("sync", &self.journal_path, e));
        }
        state.len += line.len() as u64;
        state.lines += 1;
        match change {
            Change::Admit(e) => {
                state.live.insert(e);
                state.live_lines += 1;
            }
            Change::Held { id, reason } => {
                if let Some(e) = state.live.get_mut(id) {
                    if e.held_reason.is_none() {
                        state.live_lines += 1;
                    }
                    e.held_reason = Some(reason);
                }
            }
            Change::Ref { id, upstream_ref } => {
                if let Some(e) = state.live.get_mut(id) {
                    e.upstream_ref = Some(upstream_ref);
                }
            }
            Change::Release { id } => {
                if let Some(e) = state.live.remove(id) {
                    state.live_lines -= 1 + u64::from(e.held_reason.is_some());
                }
                if state.lines > state.compact_min_lines
                    && state.lines > COMPACT_RATIO * (state.live_lines + 1)
                    && let Err(e) = self.compact(state)
                {
                    warn!(path = %self.journal_path.display(), error = %e, "journal compaction failed");
                }
            }
        }
        Ok(Appended::Written)
    }

    /// Rewrite the journal with only the live entries (REC-04). Holds the
    /// state lock, so no append interleaves.
    fn compact(&self, state: &mut State) -> Result<(), LedgerError> {
        let new_path = self.dir.join(COMPACT_FILE);
        let (bytes, lines) = state.live.compacted();
        remove_if_present(&new_path)?;
        let written = (|| -> io::Result<File> {
            let mut f = OpenOptions::new()
                .read(true)
                .append(true)
                .create_new(true)
                .mode(0o600)
                .open(&new_path)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            Ok(f)
        })();
        let file = match written {
            Ok(f) => f,
            Err(e) => {
                let _ = fs::remove_file(&new_path);
                return Err(LedgerError::io("write the compacted journal", &new_path, e));
            }
        };
        if let Err(e) = fs::rename(&new_path, &self.journal_path) {
            let _ = fs::remove_file(&new_path);
            return Err(LedgerError::io(
                "rename the compacted journal over",
                &self.journal_path,
                e,
            ));
        }
        // From here the old journal is gone: append only to the new one.
        let dropped = state.lines - lines;
        state.file = file;
        state.len = bytes.len() as u64;
        state.lines = lines;
        if let Err(e) = sync_dir(&self.dir) {
            let reason = format!("the compacted journal's rename could not be synced ({e})");
            state.unavailable = Some(reason);
            return Err(e);
        }
        info!(
            path = %self.journal_path.display(),
            entries = state.live.len(),
            dropped_lines = dropped,
            "compacted the journal"
        );
        Ok(())
    }
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
fn finish_compaction(dir: &Path, journal_path: &Path) -> Result<(), LedgerError> {
    let new_path = dir.join(COMPACT_FILE);
    let bytes = match fs::read(&new_path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(LedgerError::io("read", &new_path, e)),
    };
    let complete = match record::replay(&bytes, &new_path) {
        Ok(r) => r.discarded.is_none() && r.ends_with_marker,
        Err(_) => false,
    };
    if complete {
        fs::rename(&new_path, journal_path)
            .map_err(|e| LedgerError::io("complete the compaction by renaming", &new_path, e))?;
        sync_dir(dir)?;
        warn!(
            path = %new_path.display(),
            "completed a journal compaction that a crash interrupted before its rename (REC-05)"
        );
    } else {
        fs::remove_file(&new_path)
            .map_err(|e| LedgerError::io("remove the incomplete compaction", &new_path, e))?;
        sync_dir(dir)?;
        warn!(
            path = %new_path.display(),
            "removed an incomplete journal compaction left by a crash; the journal beside it is \
             complete"
        );
    }
    Ok(())
}

fn exists(path: &Path) -> Result<bool, LedgerError> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(LedgerError::io("inspect", path, e)),
    }
}

fn remove_if_present(path: &Path) -> Result<(), LedgerError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LedgerError::io("remove", path, e)),
    }
}

/// Make a directory's entries (a created or renamed file) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), LedgerError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| LedgerError::io("sync the directory", dir, e))
}
