//! The journal's line format and its replay.
//!
//! One JSON object per line, each ending in `\n`, each carrying the format
//! version `v`:
//!
//! ```text
//! {"v":1,"op":"admit","id":"…","upstream":"comfy","model":null,"resources":["gpu0","ram"],"completion":"tracked","started_unix_ms":1767225600000,"upstream_ref":"…"}
//! {"v":1,"op":"admit",…,"upstream_ref":null,"borrower":"alice","priority":"batch"}
//! {"v":1,"op":"held","id":"…","reason":"response broke off"}
//! {"v":1,"op":"ref","id":"…","upstream_ref":"…"}
//! {"v":1,"op":"release","id":"…"}
//! {"v":1,"op":"end","entries":1}
//! ```
//!
//! `end` closes a compacted file; its count is the number of entries before it.
//! `borrower` and `priority` appear only with named borrowers on (issue 34):
//! a journal without them reads as before, and a build without borrowers
//! writes none.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::engine::{BorrowerTag, CompletionMethod, EntryId, Priority, Reservation, RestoredEntry};
use crate::ledger::error::LedgerError;
use crate::time::Moment;

/// The last millisecond of the year 9999: an admission recorded later than
/// this is not one vacancyd wrote (issue 30 item 3).
const LATEST_UNIX_MS: u64 = 253_402_300_799_999;

/// The newest journal format this build reads and the one it writes.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// A work entry recorded before a restart and not resolved since.
///
/// # Behavior
///
/// Every unresolved entry comes back from [`Ledger::open`](crate::ledger::Ledger::open),
/// whatever its phase before the restart: the daemon returns them all as held
/// (REC-02), with their upstream handle (REC-03), after checking each against
/// the current resource mapping with
/// [`Engine::restore_held`](crate::engine::Engine::restore_held) (REC-08). The
/// age is reconstructed from the recorded wall-clock start and the system
/// clock (REC-27).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredEntry {
    /// The entry ID.
    pub id: EntryId,
    /// The upstream's name.
    pub upstream: String,
    /// The model, when known.
    pub model: Option<String>,
    /// The resources it holds, primary first.
    pub resources: Vec<String>,
    /// How its end is proven.
    pub completion: CompletionMethod,
    /// When it was admitted, in milliseconds since the Unix epoch (wall clock).
    pub started_unix_ms: u64,
    /// The upstream's own handle for the work (REC-03), after any rewrite (REC-04).
    pub upstream_ref: Option<String>,
    /// Why it turned held before the restart, when it had.
    pub held_reason: Option<String>,
    /// Its borrower, with borrowers on (issue 34).
    pub borrower: Option<BorrowerTag>,
}

impl RecoveredEntry {
    /// The entry's age at `now`, from its recorded start (REC-27); zero if the
    /// clock now reads earlier than the start.
    pub fn age(&self, now: SystemTime) -> Duration {
        let now_ms = unix_ms(now);
        Duration::from_millis(now_ms.saturating_sub(self.started_unix_ms))
    }

    /// The entry for [`Engine::restore_held`](crate::engine::Engine::restore_held):
    /// admitted `age(now_wall)` before `now` (REC-27). The engine's timeline
    /// starts with the daemon, so an entry older than the daemon's uptime is
    /// placed at the timeline's origin and carries the rest of its age in
    /// `started_before`: its age still counts from the recorded start.
    pub fn to_restored(&self, now: Moment, now_wall: SystemTime) -> RestoredEntry {
        let age = self.age(now_wall);
        let on_timeline = age.min(now.since(Moment::ZERO));
        RestoredEntry {
            id: self.id,
            upstream: self.upstream.clone(),
            model: self.model.clone(),
            resources: self.resources.clone(),
            admitted_at: Moment::ZERO.after(now.since(Moment::ZERO) - on_timeline),
            started_before: age - on_timeline,
            completion: self.completion,
            upstream_ref: self.upstream_ref.clone(),
            borrower: self.borrower.clone(),
        }
    }

    /// The record of a reservation admitted at `started_unix_ms`.
    pub(crate) fn from_reservation(r: &Reservation, started_unix_ms: u64) -> Self {
        RecoveredEntry {
            id: r.id,
            upstream: r.upstream.clone(),
            model: r.model.clone(),
            resources: r.charges.iter().map(|c| c.resource.clone()).collect(),
            completion: r.completion,
            started_unix_ms,
            upstream_ref: r.upstream_ref.clone(),
            held_reason: None,
            borrower: r.borrower.clone(),
        }
    }
}

/// Milliseconds since the Unix epoch; zero before it.
pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn completion_name(c: CompletionMethod) -> &'static str {
    match c {
        CompletionMethod::ResponseEnd => "response_end",
        CompletionMethod::Tracked => "tracked",
        CompletionMethod::HeldOnClose => "held_on_close",
    }
}

fn completion_from(name: &str) -> Option<CompletionMethod> {
    match name {
        "response_end" => Some(CompletionMethod::ResponseEnd),
        "tracked" => Some(CompletionMethod::Tracked),
        "held_on_close" => Some(CompletionMethod::HeldOnClose),
        _ => None,
    }
}

/// One line as written. Field order is the order on disk.
#[derive(Serialize)]
struct LineOut<'a> {
    v: u32,
    op: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<uuid::Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resources: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    completion: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    started_unix_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_ref: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    entries: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    borrower: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<&'static str>,
}

impl LineOut<'_> {
    fn bare(op: &'static str) -> Self {
        LineOut {
            v: FORMAT_VERSION,
            op,
            id: None,
            upstream: None,
            model: None,
            resources: None,
            completion: None,
            started_unix_ms: None,
            upstream_ref: None,
            reason: None,
            entries: None,
            borrower: None,
            priority: None,
        }
    }

    fn encode(&self) -> Vec<u8> {
        // Serializing plain strings and numbers cannot fail.
        let mut out = serde_json::to_vec(self).unwrap_or_default();
        out.push(b'\n');
        out
    }
}

/// The `admit` line for an entry (its current upstream handle included).
pub(crate) fn admit_line(e: &RecoveredEntry) -> Vec<u8> {
    LineOut {
        id: Some(e.id.0),
        upstream: Some(&e.upstream),
        model: Some(e.model.as_deref()),
        resources: Some(&e.resources),
        completion: Some(completion_name(e.completion)),
        started_unix_ms: Some(e.started_unix_ms),
        upstream_ref: Some(e.upstream_ref.as_deref()),
        borrower: e.borrower.as_ref().map(|b| &*b.name),
        priority: e.borrower.as_ref().map(|b| b.priority.as_str()),
        ..LineOut::bare("admit")
    }
    .encode()
}

/// The `held` line.
pub(crate) fn held_line(id: EntryId, reason: &str) -> Vec<u8> {
    LineOut {
        id: Some(id.0),
        reason: Some(reason),
        ..LineOut::bare("held")
    }
    .encode()
}

/// The `release` line.
pub(crate) fn release_line(id: EntryId) -> Vec<u8> {
    LineOut {
        id: Some(id.0),
        ..LineOut::bare("release")
    }
    .encode()
}

/// The `ref` line (REC-04).
pub(crate) fn ref_line(id: EntryId, upstream_ref: &str) -> Vec<u8> {
    LineOut {
        id: Some(id.0),
        upstream_ref: Some(Some(upstream_ref)),
        ..LineOut::bare("ref")
    }
    .encode()
}

/// The `end` line that closes a compacted file.
pub(crate) fn end_line(entries: u64) -> Vec<u8> {
    LineOut {
        entries: Some(entries),
        ..LineOut::bare("end")
    }
    .encode()
}

/// One line as read: every field optional, checked per op.
#[derive(Deserialize)]
struct LineIn {
    v: Option<u64>,
    op: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    upstream: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    resources: Option<Vec<String>>,
    #[serde(default)]
    completion: Option<String>,
    #[serde(default)]
    started_unix_ms: Option<u64>,
    #[serde(default)]
    upstream_ref: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    entries: Option<u64>,
    #[serde(default)]
    borrower: Option<String>,
    #[serde(default)]
    priority: Option<String>,
}

/// The live entries, in admission order.
#[derive(Debug, Default, Clone)]
pub(crate) struct LiveSet {
    next_seq: u64,
    entries: BTreeMap<EntryId, (u64, RecoveredEntry)>,
}

impl LiveSet {
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn contains(&self, id: EntryId) -> bool {
        self.entries.contains_key(&id)
    }

    pub(crate) fn get(&self, id: EntryId) -> Option<&RecoveredEntry> {
        self.entries.get(&id).map(|(_, e)| e)
    }

    pub(crate) fn insert(&mut self, e: RecoveredEntry) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.insert(e.id, (seq, e));
    }

    pub(crate) fn remove(&mut self, id: EntryId) -> Option<RecoveredEntry> {
        self.entries.remove(&id).map(|(_, e)| e)
    }

    pub(crate) fn get_mut(&mut self, id: EntryId) -> Option<&mut RecoveredEntry> {
        self.entries.get_mut(&id).map(|(_, e)| e)
    }

    /// Every live entry, oldest admission first.
    pub(crate) fn ordered(&self) -> Vec<&RecoveredEntry> {
        let mut v: Vec<&(u64, RecoveredEntry)> = self.entries.values().collect();
        v.sort_by_key(|(seq, _)| *seq);
        v.into_iter().map(|(_, e)| e).collect()
    }

    /// The compacted journal: each live entry's lines, then the end marker.
    /// Returns the bytes and their line count.
    pub(crate) fn compacted(&self) -> (Vec<u8>, u64) {
        let mut out = Vec::new();
        let mut lines = 0u64;
        let ordered = self.ordered();
        for e in &ordered {
            out.extend_from_slice(&admit_line(e));
            lines += 1;
            if let Some(reason) = &e.held_reason {
                out.extend_from_slice(&held_line(e.id, reason));
                lines += 1;
            }
        }
        out.extend_from_slice(&end_line(ordered.len() as u64));
        (out, lines + 1)
    }
}

/// A cut-short newest line that replay discarded (REC-09).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DiscardedTail {
    /// Its 1-based line number.
    pub line: u64,
    /// Its length in bytes.
    pub bytes: u64,
}

/// Zero bytes found before a line: a page of what was written never reached
/// the disk (a crash while several records awaited one sync, their pages
/// landing out of order), or something else wrote the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ZeroGap {
    /// The 1-based number of the line after them.
    pub line: u64,
    /// Where they start in the file.
    pub offset: u64,
    /// How many there are.
    pub bytes: u64,
}

/// The result of replaying a journal.
#[derive(Debug, Default)]
pub(crate) struct Replay {
    /// The unresolved entries.
    pub live: LiveSet,
    /// Bytes up to and including the last good line.
    pub good_len: u64,
    /// Good lines.
    pub lines: u64,
    /// The cut-short newest line, when one was discarded.
    pub discarded: Option<DiscardedTail>,
    /// Whether the last good line is an `end` marker.
    pub ends_with_marker: bool,
    /// The first run of zeros before a good line, when there is one.
    pub zero_gap: Option<ZeroGap>,
}

/// Replay a journal's bytes (REC-02, REC-08, REC-09).
///
/// Zero bytes where a line would start are the space the writer wrote ahead
/// (`disk::JOURNAL_PREWRITE`), not a record, and are passed over. Zeros
/// before a line are noted ([`Replay::zero_gap`]): the writer only leaves
/// them there when a crash kept some pages of a sync and not others.
///
/// Only the newest line may be discarded, and only when a crash cut it
/// short while it was being saved, so `persist` never returned and nothing
/// was forwarded on it (REC-09): when it lacks its newline (the start of
/// its write reached the disk, not the end), or when it is the last thing
/// in the file, comes after zeros and does not parse (the end of its write
/// reached the disk, not the start: a write over the zeros written ahead
/// that spans two pages can land either way round). Any other complete
/// line (its newline written) was written whole, and may have been
/// acknowledged and forwarded, so one that does not parse or holds an
/// impossible value stops startup like any other corrupt record, wherever
/// it is (REC-08, issue 30 item 3). Every problem is an error naming `path`
/// and the line.
pub(crate) fn replay(bytes: &[u8], path: &Path) -> Result<Replay, LedgerError> {
    let mut out = Replay::default();
    let mut seen = Seen::default();
    let mut pos = 0usize;
    let mut line_no = 0u64;
    loop {
        let zeros_at = pos;
        pos += bytes[pos..].iter().take_while(|&&b| b == 0).count();
        if pos >= bytes.len() {
            break;
        }
        line_no += 1;
        let rest = &bytes[pos..];
        let (text, next, terminated) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], pos + i + 1, true),
            None => (rest, bytes.len(), false),
        };
        if !terminated {
            // No newline: the write was cut short, so persist never returned.
            // What it wrote ends where the zeros written ahead begin.
            let written = text.iter().position(|&b| b == 0).unwrap_or(text.len());
            out.discarded = Some(DiscardedTail {
                line: line_no,
                bytes: written as u64,
            });
            break;
        }
        let after_zeros = pos > zeros_at;
        let parsed: LineIn = match serde_json::from_slice(text) {
            Ok(parsed) => parsed,
            // The end of the newest record without its start.
            Err(_) if after_zeros && bytes[next..].iter().all(|&b| b == 0) => {
                out.discarded = Some(DiscardedTail {
                    line: line_no,
                    bytes: (next - pos) as u64,
                });
                break;
            }
            Err(e) => return Err(corrupt(path, line_no, format!("not a JSON record ({e})"))),
        };
        if after_zeros && out.zero_gap.is_none() {
            out.zero_gap = Some(ZeroGap {
                line: line_no,
                offset: zeros_at as u64,
                bytes: (pos - zeros_at) as u64,
            });
        }
        let is_end = apply(&mut out.live, &mut seen, parsed, path, line_no)?;
        out.ends_with_marker = is_end;
        out.lines += 1;
        out.good_len = next as u64;
        pos = next;
    }
    Ok(out)
}

fn corrupt(path: &Path, line: u64, detail: String) -> LedgerError {
    LedgerError::Corrupt {
        path: path.to_path_buf(),
        line,
        detail,
    }
}

/// The lines that admitted and released each entry so far, so that a bad
/// change can say what is really wrong with it.
#[derive(Debug, Default)]
struct Seen {
    /// By entry: the line of its admission, and of its release once released.
    lines: HashMap<EntryId, (u64, Option<u64>)>,
}

impl Seen {
    /// Why `op` cannot apply to `id`, which is not live.
    fn not_live(&self, op: &str, id: EntryId) -> String {
        match self.lines.get(&id) {
            Some((admitted, Some(released))) => format!(
                "{op} names entry {id}, which line {released} released already (admitted at line \
                 {admitted}); vacancyd writes nothing for an entry after its release, so this \
                 line was copied or added by something else"
            ),
            _ => format!("{op} names entry {id}, which no earlier line admits"),
        }
    }
}

/// Apply one parsed line; returns whether it was an `end` marker.
// Long: one arm per journal line kind (admit, held, ref, end, ...), each checked against what came before.
fn apply(
    live: &mut LiveSet,
    seen: &mut Seen,
    l: LineIn,
    path: &Path,
    line: u64,
) -> Result<bool, LedgerError> {
    let bad = |detail: String| corrupt(path, line, detail);
    let version =
        l.v.ok_or_else(|| bad("the record has no format version \"v\"".to_owned()))?;
    if version == 0 {
        return Err(bad("format version 0 does not exist".to_owned()));
    }
    if version > u64::from(FORMAT_VERSION) {
        return Err(LedgerError::NewerFormat {
            path: path.to_path_buf(),
            line,
            version,
            supported: FORMAT_VERSION,
        });
    }
    let op =
        l.op.ok_or_else(|| bad("the record has no \"op\"".to_owned()))?;
    if op == "end" {
        let n = l
            .entries
            .ok_or_else(|| bad("the end marker has no \"entries\" count".to_owned()))?;
        if n != live.len() as u64 {
            return Err(bad(format!(
                "the end marker counts {n} entries but {} precede it",
                live.len()
            )));
        }
        return Ok(true);
    }
    let id_text =
        l.id.ok_or_else(|| bad(format!("the {op} record has no \"id\"")))?;
    let id: EntryId = id_text
        .parse()
        .map_err(|e| bad(format!("the entry id {id_text:?} is not a UUID ({e})")))?;
    match op.as_str() {
        "admit" => {
            if live.contains(id) {
                let first = seen.lines.get(&id).map_or(0, |(admitted, _)| *admitted);
                return Err(bad(format!(
                    "entry {id} is admitted twice, at line {first} and here"
                )));
            }
            let upstream = l
                .upstream
                .ok_or_else(|| bad(format!("admit of {id} has no \"upstream\"")))?;
            let resources = l
                .resources
                .ok_or_else(|| bad(format!("admit of {id} has no \"resources\"")))?;
            let completion_text = l
                .completion
                .ok_or_else(|| bad(format!("admit of {id} has no \"completion\"")))?;
            let completion = completion_from(&completion_text).ok_or_else(|| {
                bad(format!(
                    "admit of {id} has an unknown completion method {completion_text:?}"
                ))
            })?;
            let started_unix_ms = l
                .started_unix_ms
                .ok_or_else(|| bad(format!("admit of {id} has no \"started_unix_ms\"")))?;
            if started_unix_ms > LATEST_UNIX_MS {
                return Err(bad(format!(
                    "admit of {id} starts at {started_unix_ms} ms after 1970, past the year 9999: \
                     not a time vacancyd writes"
                )));
            }
            let borrower = match l.borrower {
                None => None,
                Some(name) => {
                    let text = l.priority.unwrap_or_default();
                    let priority: Priority = text
                        .parse()
                        .map_err(|e| bad(format!("admit of {id} for borrower {name:?}: {e}")))?;
                    Some(BorrowerTag {
                        name: name.into(),
                        priority,
                    })
                }
            };
            live.insert(RecoveredEntry {
                id,
                upstream,
                model: l.model,
                resources,
                completion,
                started_unix_ms,
                upstream_ref: l.upstream_ref,
                held_reason: None,
                borrower,
            });
            seen.lines.insert(id, (line, None));
        }
        "held" => {
            let reason = l
                .reason
                .ok_or_else(|| bad(format!("held of {id} has no \"reason\"")))?;
            let e = live
                .get_mut(id)
                .ok_or_else(|| bad(seen.not_live("held", id)))?;
            e.held_reason = Some(reason);
        }
        "ref" => {
            let r = l
                .upstream_ref
                .ok_or_else(|| bad(format!("ref of {id} has no \"upstream_ref\"")))?;
            let e = live
                .get_mut(id)
                .ok_or_else(|| bad(seen.not_live("ref", id)))?;
            e.upstream_ref = Some(r);
        }
        "release" => {
            if live.remove(id).is_none() {
                return Err(bad(seen.not_live("release", id)));
            }
            if let Some((_, released)) = seen.lines.get_mut(&id) {
                *released = Some(line);
            }
        }
        other => return Err(bad(format!("unknown record op {other:?}"))),
    }
    Ok(false)
}
