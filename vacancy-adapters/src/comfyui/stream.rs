//! Bounded streaming reads of ComfyUI's `GET /queue` and `GET /history/<id>`
//! replies (COMFY-30..35).
//!
//! A `/queue` reply carries every queued workflow and can be hundreds of MiB,
//! so vacancyd never collects it: the bytes are pushed, chunk by chunk as they
//! arrive, into a [`Scanner`] that keeps only prompt IDs, statuses and (for
//! one history entry) at most [`MAX_OUTPUT_FILES`] output file names
//! (COMFY-30), while [`read_body_since`] enforces the size and time limits of
//! [`ReadLimits`] (COMFY-31..35).
//!
//! The scanner itself, and the bounded read, are [`crate::json_stream`]'s;
//! they are re-exported here, where they were first written.

use std::collections::HashSet;

use super::OutputFile;
use crate::json_stream::{Driver, Event, ShapeResult, Sink};
pub use crate::json_stream::{
    Flow, JsonStr, MAX_DEPTH, MAX_KEPT_BYTES, ReadError, ReadLimits, ScanError, Scanner,
    StreamFetchError, get_scanned, read_body_since,
};

// ---------------------------------------------------------------------------
// Queue scans.
// ---------------------------------------------------------------------------

/// Which list of `GET /queue` an item is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueuePlace {
    /// `queue_running`: executing now.
    Running,
    /// `queue_pending`: waiting.
    Pending,
}

/// Told every queue item as the scan meets it.
///
/// # Behavior
///
/// [`QueueVisitor::item`] is called once per item of `queue_running` and
/// `queue_pending`, in reply order, with the item's prompt ID (index 1);
/// returning [`Flow::Stop`] ends the read there. [`QueueVisitor::finish`]
/// gets `stopped = true` after such a stop, and `false` after a complete,
/// well-formed reply.
pub trait QueueVisitor {
    /// What the scan finds.
    type Output;
    /// One queue item's prompt ID.
    fn item(&mut self, place: QueuePlace, id: JsonStr<'_>) -> Flow;
    /// The answer.
    fn finish(self, stopped: bool) -> Self::Output;
}

#[derive(Debug)]
struct QueueSink<V> {
    visitor: V,
    /// The queue list the current depth-1 key names, if any.
    key: Option<QueuePlace>,
    /// The queue list being read (depth >= 2).
    section: Option<QueuePlace>,
    /// The index of the next element of the current item.
    index: usize,
    running_seen: bool,
    pending_seen: bool,
}

fn place_name(place: QueuePlace) -> &'static str {
    match place {
        QueuePlace::Running => "queue_running",
        QueuePlace::Pending => "queue_pending",
    }
}

impl<V: QueueVisitor> Sink for QueueSink<V> {
    fn event(&mut self, depth: usize, event: Event<'_>) -> ShapeResult {
        match depth {
            0 => match event {
                Event::BeginObject | Event::End => Ok(Flow::Continue),
                _ => Err("the queue reply is not a JSON object".into()),
            },
            1 => match event {
                Event::Key(k) => {
                    self.key = match k.as_str() {
                        Some("queue_running") => Some(QueuePlace::Running),
                        Some("queue_pending") => Some(QueuePlace::Pending),
                        _ => None,
                    };
                    Ok(Flow::Continue)
                }
                Event::End => {
                    self.section = None;
                    Ok(Flow::Continue)
                }
                Event::BeginArray if self.key.is_some() => {
                    self.section = self.key;
                    match self.key {
                        Some(QueuePlace::Running) => self.running_seen = true,
                        Some(QueuePlace::Pending) => self.pending_seen = true,
                        None => {}
                    }
                    Ok(Flow::Continue)
                }
                _ => match self.key {
                    Some(place) => Err(format!("{} is not an array", place_name(place))),
                    None => Ok(Flow::Continue),
                },
            },
            2 => match (self.section, event) {
                (None, _) => Ok(Flow::Continue),
                (Some(_), Event::BeginArray) => {
                    self.index = 0;
                    Ok(Flow::Continue)
                }
                (Some(place), Event::End) => {
                    if self.index < 2 {
                        Err(format!("an item of {} has no prompt ID", place_name(place)))
                    } else {
                        Ok(Flow::Continue)
                    }
                }
                (Some(place), _) => {
                    Err(format!("an item of {} is not an array", place_name(place)))
                }
            },
            3 => {
                let Some(place) = self.section else {
                    return Ok(Flow::Continue);
                };
                if !event.is_value() {
                    return Ok(Flow::Continue);
                }
                let index = self.index;
                self.index += 1;
                if index != 1 {
                    return Ok(Flow::Continue);
                }
                match event {
                    Event::String(id) => Ok(self.visitor.item(place, id)),
                    _ => Err(format!(
                        "the prompt ID of an item of {} is not a string",
                        place_name(place)
                    )),
                }
            }
            _ => Ok(Flow::Continue),
        }
    }
}

/// A [`Scanner`] of a `GET /queue` reply, telling a [`QueueVisitor`] each item.
///
/// # Behavior
///
/// - The reply must be an object with the arrays `queue_running` and
///   `queue_pending` (in either order; other keys are skipped); each item an
///   array whose element 1 is the prompt ID string. Anything else, or a reply
///   that ends early, is a [`ScanError`], never an empty queue.
/// - Only the current short string and the nesting stack are held: memory
///   does not grow with the reply (COMFY-30).
#[derive(Debug)]
pub struct QueueScan<V> {
    driver: Driver<QueueSink<V>>,
}

impl<V: QueueVisitor> QueueScan<V> {
    /// A scan reporting to `visitor`.
    pub fn new(visitor: V) -> Self {
        QueueScan {
            driver: Driver::new(
                MAX_KEPT_BYTES,
                QueueSink {
                    visitor,
                    key: None,
                    section: None,
                    index: 0,
                    running_seen: false,
                    pending_seen: false,
                },
            ),
        }
    }
}

impl<V: QueueVisitor> Scanner for QueueScan<V> {
    type Output = V::Output;

    fn feed(&mut self, chunk: &[u8]) -> Result<Flow, ScanError> {
        self.driver.feed(chunk)
    }

    fn finish(mut self) -> Result<V::Output, ScanError> {
        let stopped = self.driver.finish()?;
        let sink = &self.driver.sink;
        let complete = sink.running_seen && sink.pending_seen;
        if !stopped && !complete {
            return Err(self
                .driver
                .shape("the queue reply lacks queue_running or queue_pending"));
        }
        Ok(self.driver.sink.visitor.finish(stopped))
    }
}

/// Where one prompt is in ComfyUI's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptPlace {
    /// In `queue_running`.
    Running,
    /// In `queue_pending`.
    Pending,
    /// In neither list of a complete, well-formed reply.
    Absent,
}

/// Finds one prompt ID in the queue, stopping the read there (COMFY-22).
#[derive(Debug, Clone)]
pub struct FindPrompt {
    id: String,
    found: Option<QueuePlace>,
}

impl FindPrompt {
    /// Looks for `id`.
    pub fn new(id: impl Into<String>) -> Self {
        FindPrompt {
            id: id.into(),
            found: None,
        }
    }
}

impl QueueVisitor for FindPrompt {
    type Output = PromptPlace;

    fn item(&mut self, place: QueuePlace, id: JsonStr<'_>) -> Flow {
        if id.as_str() == Some(self.id.as_str()) {
            self.found = Some(place);
            Flow::Stop
        } else {
            Flow::Continue
        }
    }

    fn finish(self, _stopped: bool) -> PromptPlace {
        match self.found {
            Some(QueuePlace::Running) => PromptPlace::Running,
            Some(QueuePlace::Pending) => PromptPlace::Pending,
            None => PromptPlace::Absent,
        }
    }
}

/// A queue item whose prompt is not one of ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignPrompt {
    /// The list it is in.
    pub place: QueuePlace,
    /// Its prompt ID; `None` when longer than [`MAX_KEPT_BYTES`].
    pub id: Option<String>,
}

/// Stops at the first queue item whose prompt ID is not in a set of our own
/// (the unload check: is anyone else's work queued?).
///
/// The answer is `Some(first foreign item)`, or `None` when a complete reply
/// held only our prompts (or none).
#[derive(Debug, Clone)]
pub struct FirstForeign {
    own: HashSet<String>,
    found: Option<ForeignPrompt>,
}

impl FirstForeign {
    /// Foreign means: not in `own`.
    pub fn new(own: HashSet<String>) -> Self {
        FirstForeign { own, found: None }
    }
}

impl QueueVisitor for FirstForeign {
    type Output = Option<ForeignPrompt>;

    fn item(&mut self, place: QueuePlace, id: JsonStr<'_>) -> Flow {
        match id.as_str() {
            Some(id) if self.own.contains(id) => Flow::Continue,
            id => {
                self.found = Some(ForeignPrompt {
                    place,
                    id: id.map(str::to_owned),
                });
                Flow::Stop
            }
        }
    }

    fn finish(self, _stopped: bool) -> Option<ForeignPrompt> {
        self.found
    }
}

/// Every prompt ID in the queue, by list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueListing {
    /// The IDs in `queue_running`, in reply order.
    pub running: Vec<String>,
    /// The IDs in `queue_pending`, in reply order.
    pub pending: Vec<String>,
    /// How many items had an ID longer than [`MAX_KEPT_BYTES`] (not ours).
    pub overlong: usize,
}

/// Lists every prompt ID (to cancel our own pending prompts, say).
#[derive(Debug, Clone, Default)]
pub struct ListPrompts {
    listing: QueueListing,
}

impl ListPrompts {
    /// An empty listing.
    pub fn new() -> Self {
        ListPrompts::default()
    }
}

impl QueueVisitor for ListPrompts {
    type Output = QueueListing;

    fn item(&mut self, place: QueuePlace, id: JsonStr<'_>) -> Flow {
        match (id, place) {
            (JsonStr::Kept(id), QueuePlace::Running) => self.listing.running.push(id.to_owned()),
            (JsonStr::Kept(id), QueuePlace::Pending) => self.listing.pending.push(id.to_owned()),
            (JsonStr::Overlong, _) => self.listing.overlong += 1,
        }
        Flow::Continue
    }

    fn finish(self, _stopped: bool) -> QueueListing {
        self.listing
    }
}

// ---------------------------------------------------------------------------
// History scan.
// ---------------------------------------------------------------------------

/// A history entry's `status`, as far as vacancy reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryStatus {
    /// The entry has no `status` key.
    Missing,
    /// `"status": null`.
    Null,
    /// `"status": {...}`.
    Present {
        /// `status_str` (`"success"` or `"error"`); `None` when absent or null.
        status_str: Option<String>,
        /// `completed`; `None` when absent or null.
        completed: Option<bool>,
    },
}

/// What `GET /history/<id>` says about one prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryLookup {
    /// A complete reply without that key (`{}`): not finished, or unknown.
    Absent,
    /// The key is there.
    Found {
        /// Its `status`.
        status: HistoryStatus,
        /// The files its `outputs` list, in reply order: at most
        /// [`MAX_OUTPUT_FILES`] (see [`HistoryScan`]).
        outputs: Vec<OutputFile>,
        /// How many listed files were left out of `outputs`: past
        /// [`MAX_OUTPUT_FILES`], or with a name longer than
        /// [`MAX_KEPT_BYTES`].
        outputs_dropped: usize,
    },
}

/// The most output files a history scan keeps for one prompt.
///
/// # Behavior
///
/// With each of a file's three strings at most [`MAX_KEPT_BYTES`], this
/// bounds what a scan holds (about 768 KiB at worst); the files past it are
/// counted in `outputs_dropped`.
pub const MAX_OUTPUT_FILES: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatusKey {
    StatusStr,
    Completed,
    Other,
}

/// Which key of our history entry the current depth-2 value belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryKey {
    Status,
    Outputs,
    Other,
}

/// Which key of an output file object the current depth-6 value belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileKey {
    Filename,
    Subfolder,
    Type,
    Other,
}

/// One field of an output file object, as far as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum FileField {
    /// Not (yet) in the object.
    #[default]
    Absent,
    /// A string of at most [`MAX_KEPT_BYTES`].
    Kept(String),
    /// A string longer than that: the file is dropped, and counted.
    Overlong,
    /// Not a string: the object is no file.
    Invalid,
}

impl FileField {
    fn of(event: &Event<'_>) -> FileField {
        match event {
            Event::String(JsonStr::Kept(s)) if s.len() <= MAX_KEPT_BYTES => {
                FileField::Kept((*s).to_owned())
            }
            Event::String(_) => FileField::Overlong,
            _ => FileField::Invalid,
        }
    }
}

/// The output file object being read (depth 5 of the reply).
#[derive(Debug, Default)]
struct FileDraft {
    key: Option<FileKey>,
    filename: FileField,
    subfolder: FileField,
    kind: FileField,
}

/// The output files of our entry: where the scan is inside `outputs`, and
/// what it kept.
#[derive(Debug, Default)]
struct OutputsSink {
    /// Inside our entry's `outputs` object (depth >= 3).
    in_outputs: bool,
    /// Inside one node's output object (depth >= 4).
    in_node: bool,
    /// Inside one of that node's lists (depth >= 5).
    in_list: bool,
    /// The list item being read, when it is an object (depth >= 6).
    draft: Option<FileDraft>,
    files: Vec<OutputFile>,
    dropped: usize,
}

impl OutputsSink {
    /// Restart at an `outputs` object (a repeated key replaces the first).
    fn begin(&mut self) {
        *self = OutputsSink {
            in_outputs: true,
            ..OutputsSink::default()
        };
    }

    /// An event at `depth` >= 3 inside our entry's `outputs`.
    fn event(&mut self, depth: usize, event: &Event<'_>) {
        match depth {
            3 => match event {
                Event::BeginObject => self.in_node = true,
                Event::End => self.in_node = false,
                _ => {}
            },
            4 if self.in_node => match event {
                Event::BeginArray => self.in_list = true,
                Event::End => self.in_list = false,
                _ => {}
            },
            5 if self.in_list => match event {
                Event::BeginObject => self.draft = Some(FileDraft::default()),
                Event::End => {
                    if let Some(draft) = self.draft.take() {
                        self.file_done(draft);
                    }
                }
                _ => {}
            },
            6 => {
                let Some(draft) = &mut self.draft else {
                    return;
                };
                if let Event::Key(k) = event {
                    draft.key = Some(match k.as_str() {
                        Some("filename") => FileKey::Filename,
                        Some("subfolder") => FileKey::Subfolder,
                        Some("type") => FileKey::Type,
                        _ => FileKey::Other,
                    });
                    return;
                }
                if !event.is_value() {
                    return;
                }
                let field = FileField::of(event);
                match draft.key.take() {
                    Some(FileKey::Filename) => draft.filename = field,
                    Some(FileKey::Subfolder) => draft.subfolder = field,
                    Some(FileKey::Type) => draft.kind = field,
                    Some(FileKey::Other) | None => {}
                }
            }
            _ => {}
        }
    }

    /// A list item object ended: keep it, count it as dropped, or skip it.
    fn file_done(&mut self, draft: FileDraft) {
        let fields = [&draft.filename, &draft.subfolder, &draft.kind];
        if matches!(draft.filename, FileField::Absent)
            || fields.iter().any(|f| matches!(f, FileField::Invalid))
        {
            // No string filename (or a non-string subfolder or type): not a
            // file `/view` could name.
            return;
        }
        if fields.iter().any(|f| matches!(f, FileField::Overlong))
            || self.files.len() >= MAX_OUTPUT_FILES
        {
            self.dropped += 1;
            return;
        }
        let text = |f: FileField, default: &str| match f {
            FileField::Kept(s) => s,
            _ => default.to_owned(),
        };
        self.files.push(OutputFile {
            filename: text(draft.filename, ""),
            subfolder: text(draft.subfolder, ""),
            kind: text(draft.kind, "output"),
        });
    }
}

#[derive(Debug)]
struct HistorySink {
    id: String,
    /// The current depth-1 key is our ID.
    ours: bool,
    /// Inside our entry (depth >= 2).
    in_entry: bool,
    /// What the current depth-2 key of our entry is.
    entry_key: EntryKey,
    /// Inside our entry's `status` object (depth >= 3).
    in_status: bool,
    field: StatusKey,
    found: Option<HistoryStatus>,
    /// Our entry's output files.
    outputs: OutputsSink,
}

impl HistorySink {
    fn status_mut(&mut self) -> Option<(&mut Option<String>, &mut Option<bool>)> {
        match &mut self.found {
            Some(HistoryStatus::Present {
                status_str,
                completed,
            }) => Some((status_str, completed)),
            _ => None,
        }
    }

    /// An event inside the entry's `status` object: `status_str` and
    /// `completed` are kept, anything else there is skipped.
    fn status_event(&mut self, event: Event<'_>) -> ShapeResult {
        if let Event::Key(k) = event {
            self.field = match k.as_str() {
                Some("status_str") => StatusKey::StatusStr,
                Some("completed") => StatusKey::Completed,
                _ => StatusKey::Other,
            };
            return Ok(Flow::Continue);
        }
        if !event.is_value() {
            return Ok(Flow::Continue);
        }
        let field = self.field;
        let Some((status_str, completed)) = self.status_mut() else {
            return Ok(Flow::Continue);
        };
        match (field, event) {
            (StatusKey::StatusStr, Event::String(JsonStr::Kept(s))) => {
                *status_str = Some(s.to_owned());
            }
            (StatusKey::StatusStr, Event::Null) => *status_str = None,
            (StatusKey::StatusStr, _) => {
                return Err("status.status_str is not a short string".into());
            }
            (StatusKey::Completed, Event::Bool(b)) => *completed = Some(b),
            (StatusKey::Completed, Event::Null) => *completed = None,
            (StatusKey::Completed, _) => {
                return Err("status.completed is not a boolean".into());
            }
            (StatusKey::Other, _) => {}
        }
        Ok(Flow::Continue)
    }
}

impl Sink for HistorySink {
    fn event(&mut self, depth: usize, event: Event<'_>) -> ShapeResult {
        match depth {
            0 => match event {
                Event::BeginObject | Event::End => {}
                _ => return Err("the history reply is not a JSON object".into()),
            },
            1 => match event {
                Event::Key(k) => self.ours = k.as_str() == Some(self.id.as_str()),
                Event::End => self.in_entry = false,
                Event::BeginObject if self.ours => {
                    self.in_entry = true;
                    self.found = Some(HistoryStatus::Missing);
                    self.outputs = OutputsSink::default();
                }
                _ if self.ours => return Err("the prompt's history entry is not an object".into()),
                _ => {}
            },
            2 if self.in_entry => match event {
                Event::Key(k) => {
                    self.entry_key = match k.as_str() {
                        Some("status") => EntryKey::Status,
                        Some("outputs") => EntryKey::Outputs,
                        _ => EntryKey::Other,
                    };
                }
                Event::End => {
                    self.in_status = false;
                    self.outputs.in_outputs = false;
                }
                Event::BeginObject if self.entry_key == EntryKey::Status => {
                    self.in_status = true;
                    self.found = Some(HistoryStatus::Present {
                        status_str: None,
                        completed: None,
                    });
                }
                Event::Null if self.entry_key == EntryKey::Status => {
                    self.found = Some(HistoryStatus::Null);
                }
                _ if self.entry_key == EntryKey::Status => {
                    return Err("the entry's status is not an object".into());
                }
                // Outputs of another shape list no files; the status decides.
                Event::BeginObject if self.entry_key == EntryKey::Outputs => self.outputs.begin(),
                _ => {}
            },
            3.. if self.outputs.in_outputs => self.outputs.event(depth, &event),
            3 if self.in_status => return self.status_event(event),
            _ => {}
        }
        Ok(Flow::Continue)
    }
}

/// A [`Scanner`] of a `GET /history/<id>` reply for one prompt ID.
///
/// # Behavior
///
/// - The reply must be a JSON object; the entry under `id`, when present,
///   an object whose `status` is an object or null, with `status_str` a
///   string or null and `completed` a boolean or null.
/// - The entry's `outputs` (`{"<node id>": {"images": [{"filename",
///   "subfolder", "type"}, ...], "gifs": [...], ...}}`) give its files:
///   every object in a node's lists with a string `filename` (`subfolder`
///   `""` and `type` `"output"` when absent; an object whose `subfolder` or
///   `type` is not a string is no file). At most [`MAX_OUTPUT_FILES`] are
///   kept, each string at most [`MAX_KEPT_BYTES`]; further files and files
///   with a longer string are counted in `outputs_dropped`, never an error.
///   `outputs` of another shape lists no files.
/// - `prompt`, `status.messages` and other keys are skipped without being
///   kept (COMFY-30).
/// - The whole reply is read and checked: a malformed or truncated reply is
///   a [`ScanError`], never [`HistoryLookup::Absent`].
#[derive(Debug)]
pub struct HistoryScan {
    driver: Driver<HistorySink>,
}

impl HistoryScan {
    /// A scan for the history entry of prompt `id`.
    pub fn new(id: impl Into<String>) -> Self {
        let id = id.into();
        HistoryScan {
            driver: Driver::new(
                MAX_KEPT_BYTES.max(id.len()),
                HistorySink {
                    id,
                    ours: false,
                    in_entry: false,
                    entry_key: EntryKey::Other,
                    in_status: false,
                    field: StatusKey::Other,
                    found: None,
                    outputs: OutputsSink::default(),
                },
            ),
        }
    }
}

impl Scanner for HistoryScan {
    type Output = HistoryLookup;

    fn feed(&mut self, chunk: &[u8]) -> Result<Flow, ScanError> {
        self.driver.feed(chunk)
    }

    fn finish(mut self) -> Result<HistoryLookup, ScanError> {
        self.driver.finish()?;
        let sink = self.driver.sink;
        Ok(match sink.found {
            Some(status) => HistoryLookup::Found {
                status,
                outputs: sink.outputs.files,
                outputs_dropped: sink.outputs.dropped,
            },
            None => HistoryLookup::Absent,
        })
    }
}

#[cfg(test)]
mod tests;
