//! The journal's one writer: a dedicated thread that applies changes in the
//! order they were submitted, each appended and synced before its reply.
//!
//! Group commit: the writer appends every change already queued, then syncs
//! once for all of them. An admission or a handle rewrite is synced at once
//! (REC-01, REC-04); a release or a hold may wait up to [`DEFERRED_SYNC`] for
//! the next sync, so the common sequence "release one job, admit the next"
//! costs one `fdatasync`, not two. A crash inside that window brings the entry
//! back held (REC-02), never released; the file is always a prefix of the
//! submission order, so no crash can reorder two changes.

use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tracing::{debug, info, warn};

use crate::engine::{EntryId, UsageRecord};
use crate::ledger::disk::{Disk, DiskFile};
use crate::ledger::error::LedgerError;
use crate::ledger::queue::{AbandonOnDrop, Queue, Taken};
use crate::ledger::record::{self, LiveSet, RecoveredEntry};
use crate::ledger::store::UsageSink;
use crate::ledger::{COMPACT_FILE, sync_dir_on};

/// Compact once the journal has more lines than this…
pub(crate) const COMPACT_MIN_LINES: u64 = 1000;
/// …and more than this many times the lines a compaction would keep.
const COMPACT_RATIO: u64 = 2;
/// How long a release or a hold may wait for its sync (see the module docs).
pub(crate) const DEFERRED_SYNC: Duration = Duration::from_millis(5);
/// The most changes appended before one sync, so a steady stream of
/// submissions still syncs (and answers) in bounded batches.
const MAX_BATCH: usize = 256;

/// One change to the journal.
pub(crate) enum Change {
    Admit(RecoveredEntry),
    Held {
        id: EntryId,
        reason: String,
    },
    Ref {
        id: EntryId,
        upstream_ref: String,
    },
    Release {
        id: EntryId,
    },
    /// A borrower's finished reservation for the usage record (issue 34):
    /// no journal line; written to the sink before the release that follows it.
    Account(Box<UsageRecord>),
}

impl Change {
    fn id(&self) -> EntryId {
        match self {
            Change::Admit(e) => e.id,
            Change::Held { id, .. } | Change::Ref { id, .. } | Change::Release { id } => *id,
            Change::Account(r) => r.entry,
        }
    }

    /// Whether someone waits on this change before acting: an admission's
    /// request is forwarded only once it is on disk (REC-01), and a rewritten
    /// handle must survive a crash before tracking relies on it (REC-04). A
    /// lost release or hold only brings the entry back held (REC-02).
    fn sync_at_once(&self) -> bool {
        matches!(self, Change::Admit(_) | Change::Ref { .. })
    }
}

/// A reply that waits for the next sync, and whether its caller waits on it
/// before acting ([`Change::sync_at_once`]).
type Waiting = (
    oneshot::Sender<Result<Appended, LedgerError>>,
    Appended,
    bool,
);

/// What an append did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Appended {
    /// Written and synced; for a `ref`, the handle it replaced.
    Written { previous_ref: Option<String> },
    /// The entry has no record (released already, or never recorded):
    /// nothing was written, so the journal never names an unknown entry.
    NoEntry,
}

/// Work for the writer thread.
pub(crate) enum Job {
    Change(Change, oneshot::Sender<Result<Appended, LedgerError>>),
    Compact(oneshot::Sender<Result<(), LedgerError>>),
    /// Where accounting rows go from now on (issue 34).
    UsageSink(Box<dyn UsageSink>),
    #[cfg(any(test, feature = "testkit"))]
    CompactMinLines(u64),
    #[cfg(any(test, feature = "testkit"))]
    DeferredSync(Duration),
    #[cfg(test)]
    Inspect(Box<dyn FnOnce(&mut Writer) + Send>),
}

impl Job {
    /// Whether the writer must be woken for it even while it waits with a
    /// deadline: everything but a release or a hold, which may wait for the
    /// next sync (the `queue` module).
    pub(crate) fn wakes_writer(&self) -> bool {
        match self {
            Job::Change(change, _) => change.sync_at_once(),
            _ => true,
        }
    }
}

/// The journal's state, owned by the writer thread.
pub(crate) struct Writer {
    pub(crate) dir: PathBuf,
    pub(crate) journal_path: PathBuf,
    /// Every write goes through it (tests put faults or memory there).
    pub(crate) disk: Arc<dyn Disk>,
    pub(crate) file: Box<dyn DiskFile>,
    /// Bytes in the journal, all of them whole lines: where the next one goes.
    pub(crate) len: u64,
    /// The file's length, never below `len`: past `len` it holds zeros
    /// written ahead, so that a record written there needs no new size
    /// synced (`JOURNAL_PREWRITE`). Zeros are only ever written from here.
    pub(crate) allocated: u64,
    /// How many zeros to write ahead when a record would not fit.
    pub(crate) prewrite: u64,
    /// Lines in the journal.
    pub(crate) lines: u64,
    pub(crate) live: LiveSet,
    /// Lines a compaction would keep: one per live entry, plus one per hold.
    pub(crate) live_lines: u64,
    /// Set when the journal's state is in doubt: no more writes.
    pub(crate) unavailable: Option<String>,
    pub(crate) compact_min_lines: u64,
    /// How long a release or a hold may wait for its sync.
    pub(crate) deferred_sync: Duration,
    /// Syncs so far (tests count them).
    pub(crate) syncs: u64,
    /// Where accounting rows go (issue 34); none: they are logged only.
    pub(crate) usage: Option<Box<dyn UsageSink>>,
}

/// Start the writer thread. It owns the journal and the directory's lock
/// (REC-25) and ends, releasing the lock, once the queue is closed and the
/// jobs queued before that are done.
pub(crate) fn spawn(
    writer: Writer,
    lock: Option<File>,
) -> Result<(Arc<Queue<Job>>, JoinHandle<()>), LedgerError> {
    let queue = Arc::new(Queue::default());
    let dir = writer.dir.clone();
    let theirs = Arc::clone(&queue);
    let handle = std::thread::Builder::new()
        .name("vacancy-ledger".to_owned())
        .spawn(move || run(&theirs, writer, lock))
        .map_err(|e| LedgerError::io("start the journal writer for", dir, e))?;
    Ok((queue, handle))
}

fn run(queue: &Queue<Job>, mut w: Writer, lock: Option<File>) {
    // However this ends, submitters stop waiting on it.
    let _abandon = AbandonOnDrop(queue);
    // Appended changes whose replies wait for the next sync, and when that
    // sync is due at the latest.
    let mut waiting: Vec<Waiting> = Vec::new();
    let mut sync_by: Option<Instant> = None;
    // Until when, after a sync, the writer looks at the queue again on its
    // own, so a release or hold submitted meanwhile need not wake it
    // (`queue`'s module docs).
    let mut look_again: Option<Instant> = None;
    let mut jobs: Vec<Job> = Vec::new();
    loop {
        let deadline = sync_by.or(look_again);
        match queue.take(deadline, MAX_BATCH, &mut jobs) {
            Taken::Jobs => {}
            Taken::TimedOut => look_again = None,
            Taken::Closed => break,
        }
        // At the deadline everything appended is due: a change found then
        // has waited since the writer began waiting, at most the window.
        let due = deadline.is_some_and(|by| by <= Instant::now());
        let batch = jobs.len();
        let mut urgent = false;
        for job in jobs.drain(..) {
            match job {
                Job::Change(change, reply) => {
                    let at_once = change.sync_at_once();
                    match w.write(change) {
                        Ok(Appended::NoEntry) => {
                            // Nothing was written: nothing to wait for.
                            let _ = reply.send(Ok(Appended::NoEntry));
                        }
                        Ok(appended) => {
                            waiting.push((reply, appended, at_once));
                            urgent |= at_once;
                            sync_by.get_or_insert_with(|| Instant::now() + w.deferred_sync);
                        }
                        // The caller may have gone (a cancelled request): the
                        // record is written all the same, in submission order.
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    }
                }
                Job::Compact(reply) => {
                    w.sync(&mut waiting);
                    sync_by = None;
                    let result = if w.lines > w.live_lines + 1 {
                        w.compact()
                    } else {
                        Ok(())
                    };
                    let _ = reply.send(result);
                }
                Job::UsageSink(sink) => w.usage = Some(sink),
                #[cfg(any(test, feature = "testkit"))]
                Job::CompactMinLines(n) => w.compact_min_lines = n,
                #[cfg(any(test, feature = "testkit"))]
                Job::DeferredSync(window) => w.deferred_sync = window,
                #[cfg(test)]
                Job::Inspect(f) => {
                    w.sync(&mut waiting);
                    sync_by = None;
                    f(&mut w);
                }
            }
        }
        // Appended changes are synced when one is waited on, when a deadline
        // came (a sync_by that passes later makes the next take time out),
        // or when the batch was full.
        if !waiting.is_empty() && (urgent || due || batch >= MAX_BATCH) {
            w.sync(&mut waiting);
            sync_by = None;
            look_again = Some(Instant::now() + w.deferred_sync);
        }
    }
    w.sync(&mut waiting);
    w.cut_zeros_ahead();
    drop(lock);
}

/// Empty `items`, those that are `urgent` first, each part in its order.
fn urgent_first<T>(
    items: &mut Vec<T>,
    urgent: impl Fn(&T) -> bool,
) -> impl Iterator<Item = T> + '_ {
    let first: Vec<T> = items.extract_if(.., |t| urgent(t)).collect();
    first.into_iter().chain(items.drain(..))
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("journal_path", &self.journal_path)
            .field("len", &self.len)
            .field("lines", &self.lines)
            .field("live", &self.live.len())
            .field("unavailable", &self.unavailable)
            .field("usage", &self.usage.is_some())
            .finish_non_exhaustive()
    }
}

impl Writer {
    fn unavailable_error(&self, reason: &str) -> LedgerError {
        LedgerError::Unavailable {
            path: self.dir.clone(),
            reason: reason.to_owned(),
        }
    }

    /// Append one change, unsynced: its reply waits for [`sync`](Self::sync).
    fn write(&mut self, change: Change) -> Result<Appended, LedgerError> {
        if let Some(reason) = &self.unavailable {
            return Err(self.unavailable_error(reason));
        }
        let id = change.id();
        let mut previous_ref = None;
        let line = match &change {
            Change::Account(r) => {
                self.account(r);
                return Ok(Appended::NoEntry);
            }
            Change::Admit(e) => {
                if self.live.contains(e.id) {
                    return Err(LedgerError::DuplicateEntry {
                        path: self.dir.clone(),
                        entry: e.id,
                    });
                }
                record::admit_line(e)
            }
            Change::Held { id, reason } => {
                if !self.live.contains(*id) {
                    debug!(entry = %id, "hold of an entry with no record (released already): nothing to write");
                    return Ok(Appended::NoEntry);
                }
                record::held_line(*id, reason)
            }
            Change::Ref { id, upstream_ref } => {
                let Some(e) = self.live.get(*id) else {
                    return Ok(Appended::NoEntry);
                };
                previous_ref = e.upstream_ref.clone();
                record::ref_line(*id, upstream_ref)
            }
            Change::Release { id } => {
                if !self.live.contains(*id) {
                    debug!(entry = %id, "release of an entry with no record: nothing to write");
                    return Ok(Appended::NoEntry);
                }
                record::release_line(*id)
            }
        };
        let before = self.len;
        self.write_ahead(line.len() as u64);
        if let Err(e) = self.file.write_at(before, &line) {
            // Cut the partial line off so later appends stay readable (the
            // zeros after it go too: the next record writes more).
            if let Err(cut) = self.file.set_len(before) {
                let reason = format!(
                    "appending failed ({e}) and the partial record could not be cut off ({cut})"
                );
                warn!(entry = %id, path = %self.journal_path.display(), reason = %reason, "journal unavailable");
                self.unavailable = Some(reason);
            } else {
                self.allocated = before;
            }
            return Err(LedgerError::io("append to", &self.journal_path, e));
        }
        self.len += line.len() as u64;
        // A record appended past the zeros (their write failed) moves the
        // end: the next zeros go after it, never over it.
        self.allocated = self.allocated.max(self.len);
        self.lines += 1;
        match change {
            Change::Admit(e) => {
                self.live.insert(e);
                self.live_lines += 1;
            }
            Change::Held { id, reason } => {
                if let Some(e) = self.live.get_mut(id) {
                    if e.held_reason.is_none() {
                        self.live_lines += 1;
                    }
                    e.held_reason = Some(reason);
                }
            }
            Change::Ref { id, upstream_ref } => {
                if let Some(e) = self.live.get_mut(id) {
                    e.upstream_ref = Some(upstream_ref);
                }
            }
            Change::Release { id } => {
                if let Some(e) = self.live.remove(id) {
                    self.live_lines -= 1 + u64::from(e.held_reason.is_some());
                }
            }
            Change::Account(_) => {}
        }
        Ok(Appended::Written { previous_ref })
    }

    /// Make room for `n` more bytes of records: when they would not fit in
    /// the zeros written ahead, write `prewrite` more past them. The sync
    /// after it then commits the new size once, and the records after it
    /// need only their data synced. A failure is no error: the record is
    /// written past the end as a plain append, and what the zeros' write
    /// added is cut off again so that a full disk keeps what space it has.
    fn write_ahead(&mut self, n: u64) {
        let needed = self.len + n;
        if needed <= self.allocated {
            return;
        }
        let end = needed + self.prewrite;
        let Ok(zeros) = usize::try_from(end - self.allocated).map(|z| vec![0u8; z]) else {
            return;
        };
        match self.file.write_at(self.allocated, &zeros) {
            Ok(()) => self.allocated = end,
            Err(e) => {
                debug!(path = %self.journal_path.display(), error = %e, "could not write zeros ahead of the journal's end; appending instead");
                let _ = self.file.set_len(self.allocated);
            }
        }
    }

    /// Cut the zeros written ahead off, at a clean close: the journal is
    /// then its records alone. Nothing depends on it (a later open cuts
    /// them too), so a failure is only logged.
    fn cut_zeros_ahead(&mut self) {
        if self.unavailable.is_some() || self.allocated <= self.len {
            return;
        }
        match self.file.set_len(self.len) {
            Ok(()) => self.allocated = self.len,
            Err(e) => {
                debug!(path = %self.journal_path.display(), error = %e, "could not cut the zeros written ahead off the journal");
            }
        }
    }

    /// Hand a borrower's finished reservation to the usage record, before
    /// its release is appended. A row that cannot be written is logged and
    /// the release goes on: the resource is free either way, and holding it
    /// for want of a statistics row would take it from every borrower.
    fn account(&mut self, r: &UsageRecord) {
        match &mut self.usage {
            Some(sink) => {
                if let Err(reason) = sink.record(r) {
                    warn!(entry = %r.entry, borrower = %r.borrower, reason = %reason, "the usage record could not be written; this reservation is missing from `vacancyd usage`");
                }
            }
            None => {
                info!(target: "vacancy::accounting", entry = %r.entry, borrower = %r.borrower, upstream = %r.upstream, "a borrower's reservation ended (no usage record is kept)")
            }
        }
    }

    /// Sync every appended change and answer its waiting reply; then compact
    /// if releases have left the journal mostly dead lines.
    fn sync(&mut self, waiting: &mut Vec<Waiting>) {
        if waiting.is_empty() {
            return;
        }
        self.syncs += 1;
        let failed = match self.file.sync_data() {
            Ok(()) => None,
            Err(e) => {
                // After a failed sync the file's contents are in doubt (the
                // kernel may have dropped the dirty pages): stop writing.
                let reason = format!("syncing the journal failed ({e})");
                warn!(path = %self.journal_path.display(), reason = %reason, "journal unavailable");
                self.unavailable = Some(reason.clone());
                Some(reason)
            }
        };
        let answer = |(reply, appended, _): Waiting| {
            let result = match &failed {
                None => Ok(appended),
                Some(reason) => Err(self.unavailable_error(reason)),
            };
            let _ = reply.send(result);
        };
        // Those a request waits on first: an admission's reply wakes the
        // proxy thread that forwards it, while a release's only ends a
        // background watch. Answered in submission order, a release queued
        // before the admission put one more wake-up ahead of it (issue 31).
        urgent_first(waiting, |(_, _, at_once)| *at_once).for_each(answer);
        if failed.is_none()
            && self.lines > self.compact_min_lines
            && self.lines > COMPACT_RATIO * (self.live_lines + 1)
            && let Err(e) = self.compact()
        {
            warn!(path = %self.journal_path.display(), error = %e, "journal compaction failed");
        }
    }

    /// Remove the file of a compaction that will not be renamed, and make
    /// the removal durable before anything more is appended: a removal lost
    /// in a crash would bring the stale file back whole, and the next open
    /// would complete it over the records appended since (REC-05). Found by
    /// the simulation (seed 29); when the removal cannot be made certain,
    /// stop writing.
    fn discard_compaction(&mut self, new_path: &std::path::Path) {
        let removed = match self.disk.remove(new_path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) => Err(LedgerError::io("remove", new_path, e)),
            Ok(()) => sync_dir_on(self.disk.as_ref(), &self.dir),
        };
        if let Err(e) = removed {
            let reason =
                format!("a failed compaction's file could not be removed for certain ({e})");
            warn!(path = %new_path.display(), reason = %reason, "journal unavailable");
            self.unavailable = Some(reason);
        }
    }

    /// Rewrite the journal with only the live entries (REC-04).
    pub(crate) fn compact(&mut self) -> Result<(), LedgerError> {
        let new_path = self.dir.join(COMPACT_FILE);
        let (bytes, lines) = self.live.compacted();
        match self.disk.remove(&new_path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(LedgerError::io("remove", &new_path, e)),
        }
        // With zeros written ahead, in the same write and sync.
        let mut ahead = bytes.clone();
        ahead.resize(bytes.len() + usize::try_from(self.prewrite).unwrap_or(0), 0);
        let written = (|| -> io::Result<Box<dyn DiskFile>> {
            let mut f = self.disk.create_new(&new_path)?;
            f.write_all(&ahead)?;
            f.sync_all()?;
            Ok(f)
        })();
        let file = match written {
            Ok(f) => f,
            Err(e) => {
                self.discard_compaction(&new_path);
                return Err(LedgerError::io("write the compacted journal", &new_path, e));
            }
        };
        if let Err(e) = self.disk.rename(&new_path, &self.journal_path) {
            self.discard_compaction(&new_path);
            return Err(LedgerError::io(
                "rename the compacted journal over",
                &self.journal_path,
                e,
            ));
        }
        // From here the old journal is gone: append only to the new one.
        let dropped = self.lines - lines;
        self.file = file;
        self.len = bytes.len() as u64;
        self.allocated = ahead.len() as u64;
        self.lines = lines;
        if let Err(e) = sync_dir_on(self.disk.as_ref(), &self.dir) {
            // The rename may not survive a crash, and appends to the new file
            // would be lost with it: stop writing.
            self.unavailable = Some(format!(
                "the compacted journal's rename could not be synced ({e})"
            ));
            return Err(e);
        }
        info!(
            path = %self.journal_path.display(),
            entries = self.live.len(),
            dropped_lines = dropped,
            "compacted the journal"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_answers_the_admissions_before_the_releases_queued_ahead_of_them() {
        // REC-01: the admission's reply is the one a request waits on, so it
        // goes out first; the others keep their order.
        let mut items = vec![
            ("release 1", false),
            ("admit 2", true),
            ("release 3", false),
            ("ref 4", true),
        ];
        let order: Vec<&str> = urgent_first(&mut items, |(_, urgent)| *urgent)
            .map(|(name, _)| name)
            .collect();
        assert_eq!(order, ["admit 2", "ref 4", "release 1", "release 3"]);
        assert!(items.is_empty());
    }
}
