//! An in-process emulator of an engine-switching, "chatterbox-style" voice
//! server, for testing vacancy's `chatterbox` adapter where no real server can
//! be installed.
//!
//! # The contract emulated
//!
//! It follows the project's *compatible voice server* contract
//! (docs/operator-guide.md#voice-servers; rules VOICE-01 to VOICE-20), not any specific
//! third-party release. Where that contract leaves a shape open, the choice
//! below is the emulator's own and is pinned by its tests
//! (`tests/harness/voice_emulator.rs`).
//!
//! Work (synthesis; one worker, so requests run one at a time in arrival
//! order):
//!
//! - `POST /v1/audio/speech`: JSON `{"model", "input", "voice"?,
//!   "response_format"?}` → 200 with the audio bytes (`audio/wav`: a small
//!   16 kHz mono 16-bit WAV whose length grows with `input`; or `audio/pcm`:
//!   the same samples without the header, for `"response_format": "pcm"`).
//! - `POST /v1/audio/executions`: the same JSON; durable synthesis. The
//!   response is held open until the audio and the receipt are published and
//!   the worker is released (VOICE-04), then answers 200 with the receipt:
//!   `{"id", "object": "audio.execution", "status": "completed", "model",
//!   "engine", "voice", "response_format", "audio_url":
//!   "/v1/audio/executions/<id>/audio", "bytes", "created_at",
//!   "completed_at"}`. IDs are `exec_` and 16 hex digits, so they match
//!   `^[A-Za-z0-9_-]{8,80}$` (VOICE-07). The receipt exists from the moment
//!   the request is accepted: `"status": "queued"` while it waits for the
//!   worker, `"running"` while it switches or synthesizes, then
//!   `"completed"` (with `bytes` and `completed_at`) or `"failed"`.
//!
//! Reads, which never start synthesis and answer while the worker is busy
//! (VOICE-05):
//!
//! - `GET /v1/audio/capabilities`: `{"engines": [{"id", "loaded"}],
//!   "aliases": [...], "default_engine", "voices": [...], "formats":
//!   ["wav", "pcm"]}`.
//! - `GET /v1/audio/executions/{id}`: the receipt; 404 for an unknown ID or
//!   one that does not match the pattern above.
//! - `GET /v1/audio/executions/{id}/audio`: the published audio bytes again,
//!   with the execution's content type; 404 as above, 409 while the
//!   execution is queued or runs, or after it failed.
//!
//! Discovery:
//!
//! - `GET /health`: `{"status": "ok"}`.
//! - `GET /status`: `{"loaded": bool, "engine": string|null, "busy": bool}`;
//!   in legacy mode ([`VoiceEmulatorOptions::legacy`]) the `engine` key is
//!   absent (VOICE-15).
//! - `GET /v1/models`: `{"object": "list", "data": [{"id", "object":
//!   "model", "owned_by"}]}`, the engines then the aliases.
//!
//! Errors are OpenAI-style `{"error": {"message", "type"}}`: 400
//! `invalid_request_error` for a body that is not a JSON object, a missing
//! or empty `model` or `input`, an unknown model, voice or format; 404
//! `not_found_error` for an unknown route or execution; 405 for a known
//! route with another method.
//!
//! # Engines
//!
//! The request's top-level `model` names an engine (e.g. `qwen`,
//! `qwen-design`, `breeze`). A request for another engine than the loaded
//! one switches: the loaded engine is unloaded (`/status` answers
//! `"loaded": false`, `"engine": null`, `"busy": true`) for
//! [`VoiceEmulatorOptions::switch_time`], then the requested engine is loaded
//! and synthesizes. A generic alias (default `default` and `tts-1`)
//! synthesizes with whatever engine is loaded, or loads
//! [`VoiceEmulatorOptions::default_engine`] (else the first engine) when none
//! is. `/status` answers `"busy": true` while the worker switches or
//! synthesizes.
//!
//! # Faults
//!
//! [`VoiceFaults`] (set with [`VoiceEmulator::set_faults`]): a `/status`
//! engine forced to `null`, `""` or a non-string
//! ([`StatusEngineFault`]); executions answered 202 at once while synthesis
//! continues (a non-conformant server, VOICE-04); syntheses failing with a
//! 500 or cut mid-body ([`SynthesisFailure`]). [`VoiceEmulator::requests`]
//! logs every request and [`VoiceEmulator::synthesis_count`] counts the
//! syntheses each engine started, so tests can verify that vacancy never
//! retries one (VOICE-20).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::background::{BackgroundServer, ChannelBody, serve_http};
use crate::error::SupportError;

/// The audio formats the emulator synthesizes.
pub const VOICE_FORMATS: &[&str] = &["wav", "pcm"];

/// The sample rate of the synthesized audio.
const SAMPLE_RATE: u32 = 16_000;

/// How to run a [`VoiceEmulator`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoiceEmulatorOptions {
    /// The engine names a request's `model` may name. Must be non-empty and
    /// distinct. Default `qwen`, `qwen-design`, `breeze`.
    pub engines: Vec<String>,
    /// Generic model names that synthesize with whatever engine is loaded.
    /// Must not name an engine. Default `default`, `tts-1`.
    pub aliases: Vec<String>,
    /// The engine loaded at start; `None`: none. Default `Some("qwen")`.
    pub loaded: Option<String>,
    /// The engine an alias loads when none is loaded; `None`: the first of
    /// [`engines`](Self::engines). Default `None`.
    pub default_engine: Option<String>,
    /// The voices a request may name (`voice` is optional). Default
    /// `alloy`, `default`.
    pub voices: Vec<String>,
    /// How long each synthesis takes. Default 50 ms.
    pub synthesis_time: Duration,
    /// How long an engine switch (unload, then load) takes. Default 50 ms.
    pub switch_time: Duration,
    /// A legacy server: `/status` has no `engine` key. Default `false`.
    pub legacy: bool,
}

impl Default for VoiceEmulatorOptions {
    fn default() -> Self {
        VoiceEmulatorOptions {
            engines: ["qwen", "qwen-design", "breeze"].map(String::from).to_vec(),
            aliases: ["default", "tts-1"].map(String::from).to_vec(),
            loaded: Some("qwen".to_owned()),
            default_engine: None,
            voices: ["alloy", "default"].map(String::from).to_vec(),
            synthesis_time: Duration::from_millis(50),
            switch_time: Duration::from_millis(50),
            legacy: false,
        }
    }
}

/// What a faulty `/status` reports as `engine` (the `loaded` and `busy`
/// keys stay true to the state; VOICE-16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusEngineFault {
    /// `"engine": null`.
    Null,
    /// `"engine": ""`.
    Empty,
    /// `"engine": 42`, a non-string.
    NotAString,
}

/// How a faulty synthesis fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthesisFailure {
    /// After the synthesis time, answer 500 with an OpenAI-style error
    /// (`"type": "server_error"`); an execution's receipt turns `failed`
    /// and no audio is published.
    ServerError,
    /// After the synthesis time, answer 200 with the full `Content-Length`,
    /// send half of the body, then cut the connection. An execution's audio
    /// and receipt are published first (only the reply is lost).
    CutMidBody,
}

/// Fault knobs for tests; the default has none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VoiceFaults {
    /// Force the `engine` of `/status` (ignored in legacy mode).
    pub status_engine: Option<StatusEngineFault>,
    /// Answer `POST /v1/audio/executions` with 202 and the running receipt
    /// at once, and synthesize afterwards (non-conformant, VOICE-04).
    pub early_accept: bool,
    /// Fail every synthesis that starts while this is set.
    pub fail_synthesis: Option<SynthesisFailure>,
}

/// One request the emulator received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoiceRequest {
    /// E.g. `POST`.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The body as JSON; `Value::Null` when empty or not JSON.
    pub body: Value,
}

/// One durable execution.
#[derive(Debug, Clone)]
struct Execution {
    id: String,
    model: String,
    engine: Option<String>,
    voice: String,
    format: &'static str,
    status: &'static str,
    audio: Option<Bytes>,
    created_at: u64,
    completed_at: Option<u64>,
}

impl Execution {
    fn receipt(&self) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": "audio.execution",
            "status": self.status,
            "model": self.model,
            "engine": self.engine,
            "voice": self.voice,
            "response_format": self.format,
            "audio_url": format!("/v1/audio/executions/{}/audio", self.id),
            "created_at": self.created_at,
        });
        if let Some(o) = v.as_object_mut() {
            if let Some(audio) = &self.audio {
                o.insert("bytes".into(), json!(audio.len()));
            }
            if let Some(at) = self.completed_at {
                o.insert("completed_at".into(), json!(at));
            }
        }
        v
    }
}

#[derive(Debug)]
struct State {
    options: VoiceEmulatorOptions,
    faults: VoiceFaults,
    loaded: Option<String>,
    switching: bool,
    working: bool,
    counts: BTreeMap<String, usize>,
    switches: usize,
    executions: Vec<Execution>,
    next_id: u64,
    log: Vec<VoiceRequest>,
}

impl State {
    /// The engine a request for `model` synthesizes with; `None`: unknown.
    fn resolve(&self, model: &str) -> Option<String> {
        let o = &self.options;
        if o.engines.iter().any(|e| e == model) {
            return Some(model.to_owned());
        }
        if o.aliases.iter().any(|a| a == model) {
            return self
                .loaded
                .clone()
                .or_else(|| o.default_engine.clone())
                .or_else(|| o.engines.first().cloned());
        }
        None
    }

    fn new_id(&mut self) -> String {
        use std::hash::{BuildHasher, Hasher};
        self.next_id += 1;
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(self.next_id);
        format!("exec_{:016x}", h.finish())
    }

    fn execution(&self, id: &str) -> Option<&Execution> {
        self.executions.iter().find(|e| e.id == id)
    }

    fn execution_mut(&mut self, id: &str) -> Option<&mut Execution> {
        self.executions.iter_mut().find(|e| e.id == id)
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// The one synthesis worker.
    worker: tokio::sync::Mutex<()>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

/// An emulated engine-switching voice server on its own thread and tokio
/// runtime, listening on a free 127.0.0.1 port (see the module docs for the
/// contract it emulates).
#[derive(Debug)]
pub struct VoiceEmulator {
    server: BackgroundServer,
    shared: Arc<Shared>,
}

fn invalid(what: &str, message: String) -> SupportError {
    SupportError::Invalid {
        what: format!("VoiceEmulatorOptions::{what}"),
        message,
    }
}

impl VoiceEmulator {
    /// Starts an emulator. Options that contradict themselves (no engines,
    /// a duplicate name, an alias naming an engine, a `loaded` or
    /// `default_engine` that is not an engine, no voices) are an error.
    pub fn start(options: VoiceEmulatorOptions) -> Result<Self, SupportError> {
        if options.engines.is_empty() {
            return Err(invalid("engines", "no engines".into()));
        }
        let mut names: Vec<&String> = options.engines.iter().chain(&options.aliases).collect();
        names.sort();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(invalid(
                "engines",
                format!("{:?} is named twice (engines and aliases)", w[0]),
            ));
        }
        if names.iter().any(|n| n.is_empty()) {
            return Err(invalid("engines", "an empty name".into()));
        }
        for (what, engine) in [
            ("loaded", &options.loaded),
            ("default_engine", &options.default_engine),
        ] {
            if let Some(e) = engine
                && !options.engines.contains(e)
            {
                return Err(invalid(what, format!("{e:?} is not an engine")));
            }
        }
        if options.voices.is_empty() {
            return Err(invalid("voices", "no voices".into()));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| SupportError::io("voice emulator: build its tokio runtime", e))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                loaded: options.loaded.clone(),
                options,
                faults: VoiceFaults::default(),
                switching: false,
                working: false,
                counts: BTreeMap::new(),
                switches: 0,
                executions: Vec::new(),
                next_id: 0,
                log: Vec::new(),
            }),
            worker: tokio::sync::Mutex::new(()),
        });
        let thread_shared = Arc::clone(&shared);
        let server =
            BackgroundServer::start("voice-emulator", runtime, move |listener, stopped| {
                serve(listener, thread_shared, stopped)
            })?;
        Ok(VoiceEmulator { server, shared })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    /// Replaces the fault knobs (for the next requests and syntheses).
    pub fn set_faults(&self, faults: VoiceFaults) {
        self.shared.lock().faults = faults;
    }

    /// How long the syntheses started from now on take.
    pub fn set_synthesis_time(&self, time: Duration) {
        self.shared.lock().options.synthesis_time = time;
    }

    /// How long the engine switches started from now on take.
    pub fn set_switch_time(&self, time: Duration) {
        self.shared.lock().options.switch_time = time;
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<VoiceRequest> {
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

    /// How many syntheses (speech and executions, failed ones included)
    /// `engine` has started.
    pub fn synthesis_count(&self, engine: &str) -> usize {
        self.shared.lock().counts.get(engine).copied().unwrap_or(0)
    }

    /// The syntheses started, per engine.
    pub fn synthesis_counts(&self) -> BTreeMap<String, usize> {
        self.shared.lock().counts.clone()
    }

    /// How many engine switches (loads) have started.
    pub fn switch_count(&self) -> usize {
        self.shared.lock().switches
    }

    /// The loaded engine; `None` while none is or during a switch.
    pub fn loaded_engine(&self) -> Option<String> {
        self.shared.lock().loaded.clone()
    }

    /// Whether the worker is switching or synthesizing.
    pub fn busy(&self) -> bool {
        let st = self.shared.lock();
        st.switching || st.working
    }

    /// The receipt `GET /v1/audio/executions/{id}` would answer now.
    pub fn receipt(&self, id: &str) -> Option<Value> {
        self.shared.lock().execution(id).map(Execution::receipt)
    }

    /// The IDs of the executions accepted so far, oldest first.
    pub fn execution_ids(&self) -> Vec<String> {
        self.shared
            .lock()
            .executions
            .iter()
            .map(|e| e.id.clone())
            .collect()
    }
}

// Serving

type HandlerError = Box<dyn std::error::Error + Send + Sync>;
type RespBody = BoxBody<Bytes, HandlerError>;

async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    stopped: oneshot::Receiver<()>,
) {
    serve_http(listener, stopped, move |req| {
        handle(req, Arc::clone(&shared))
    })
    .await;
}

const JSON: &str = "application/json";

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<RespBody> {
    let mut response = Response::new(Full::new(body.into()).map_err(|e| match e {}).boxed());
    *response.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        response.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    response
}

fn json_reply(status: StatusCode, value: &Value) -> Response<RespBody> {
    full(status, JSON, value.to_string())
}

fn error_reply(status: StatusCode, kind: &str, message: &str) -> Response<RespBody> {
    json_reply(
        status,
        &json!({"error": {"message": message, "type": kind}}),
    )
}

fn bad_request(message: &str) -> Response<RespBody> {
    error_reply(StatusCode::BAD_REQUEST, "invalid_request_error", message)
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Whether `id` may name an execution (VOICE-07).
fn valid_id(id: &str) -> bool {
    (8..=80).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

async fn handle(
    req: Request<Incoming>,
    shared: Arc<Shared>,
) -> Result<Response<RespBody>, HandlerError> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let body = req.into_body().collect().await?.to_bytes();
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    shared.lock().log.push(VoiceRequest {
        method: method.to_string(),
        path: path.clone(),
        body: parsed,
    });

    let route = Route::of(&path);
    let allowed = match route {
        Route::Speech | Route::Executions => Method::POST,
        Route::NotFound => {
            return Ok(error_reply(
                StatusCode::NOT_FOUND,
                "not_found_error",
                &format!("no route for {method} {path}"),
            ));
        }
        _ => Method::GET,
    };
    if method != allowed {
        return Ok(error_reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            &format!("{method} is not allowed on {path}"),
        ));
    }
    Ok(match route {
        Route::Health => json_reply(StatusCode::OK, &json!({"status": "ok"})),
        Route::Status => json_reply(StatusCode::OK, &status(&shared.lock())),
        Route::Models => json_reply(StatusCode::OK, &models(&shared.lock())),
        Route::Capabilities => json_reply(StatusCode::OK, &capabilities(&shared.lock())),
        Route::Execution(id) => match shared.lock().execution(id) {
            Some(e) => json_reply(StatusCode::OK, &e.receipt()),
            None => unknown_execution(id),
        },
        Route::ExecutionAudio(id) => match shared.lock().execution(id) {
            Some(Execution {
                audio: Some(audio),
                format,
                ..
            }) => full(StatusCode::OK, content_type(format), audio.clone()),
            Some(e) => error_reply(
                StatusCode::CONFLICT,
                "invalid_request_error",
                &format!("execution {id} is {}: no audio", e.status),
            ),
            None => unknown_execution(id),
        },
        Route::Speech => work(&shared, &body, false).await,
        Route::Executions => work(&shared, &body, true).await,
        // Answered above.
        Route::NotFound => error_reply(StatusCode::NOT_FOUND, "not_found_error", "not found"),
    })
}

fn unknown_execution(id: &str) -> Response<RespBody> {
    error_reply(
        StatusCode::NOT_FOUND,
        "not_found_error",
        &format!("no execution {id}"),
    )
}

enum Route<'a> {
    Health,
    Status,
    Models,
    Capabilities,
    Speech,
    Executions,
    Execution(&'a str),
    ExecutionAudio(&'a str),
    NotFound,
}

impl<'a> Route<'a> {
    fn of(path: &'a str) -> Self {
        match path {
            "/health" => return Route::Health,
            "/status" => return Route::Status,
            "/v1/models" => return Route::Models,
            "/v1/audio/capabilities" => return Route::Capabilities,
            "/v1/audio/speech" => return Route::Speech,
            "/v1/audio/executions" => return Route::Executions,
            _ => {}
        }
        let Some(rest) = path.strip_prefix("/v1/audio/executions/") else {
            return Route::NotFound;
        };
        let (id, audio) = match rest.strip_suffix("/audio") {
            Some(id) => (id, true),
            None => (rest, false),
        };
        if !valid_id(id) {
            return Route::NotFound;
        }
        if audio {
            Route::ExecutionAudio(id)
        } else {
            Route::Execution(id)
        }
    }
}

fn status(st: &State) -> Value {
    let loaded = st.loaded.is_some();
    let busy = st.switching || st.working;
    if st.options.legacy {
        return json!({"loaded": loaded, "busy": busy});
    }
    let engine = match st.faults.status_engine {
        None => json!(st.loaded),
        Some(StatusEngineFault::Null) => Value::Null,
        Some(StatusEngineFault::Empty) => json!(""),
        Some(StatusEngineFault::NotAString) => json!(42),
    };
    json!({"loaded": loaded, "engine": engine, "busy": busy})
}

fn models(st: &State) -> Value {
    let data: Vec<Value> = st
        .options
        .engines
        .iter()
        .chain(&st.options.aliases)
        .map(|id| json!({"id": id, "object": "model", "owned_by": "vacancy-voice-emulator"}))
        .collect();
    json!({"object": "list", "data": data})
}

fn capabilities(st: &State) -> Value {
    let o = &st.options;
    let engines: Vec<Value> = o
        .engines
        .iter()
        .map(|e| json!({"id": e, "loaded": st.loaded.as_ref() == Some(e)}))
        .collect();
    json!({
        "engines": engines,
        "aliases": o.aliases,
        "default_engine": o.default_engine.as_ref().or(o.engines.first()),
        "voices": o.voices,
        "formats": VOICE_FORMATS,
    })
}

fn content_type(format: &str) -> &'static str {
    if format == "pcm" {
        "audio/pcm"
    } else {
        "audio/wav"
    }
}

/// A validated synthesis request.
#[derive(Debug, Clone)]
struct Job {
    model: String,
    input: String,
    voice: String,
    format: &'static str,
}

fn parse_job(st: &State, body: &[u8]) -> Result<Job, String> {
    let Ok(Value::Object(req)) = serde_json::from_slice::<Value>(body) else {
        return Err("the body must be a JSON object".into());
    };
    let model = match req.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => return Err("`model` must be a non-empty string".into()),
    };
    if st.resolve(&model).is_none() {
        return Err(format!("unknown model {model:?}"));
    }
    let input = match req.get("input") {
        Some(Value::String(i)) if !i.is_empty() => i.clone(),
        _ => return Err("`input` must be a non-empty string".into()),
    };
    let voice = match req.get("voice") {
        None | Some(Value::Null) => st.options.voices[0].clone(),
        Some(Value::String(v)) if st.options.voices.contains(v) => v.clone(),
        Some(v) => return Err(format!("unknown voice {v}")),
    };
    let format = match req.get("response_format") {
        None | Some(Value::Null) => VOICE_FORMATS[0],
        Some(Value::String(f)) => match VOICE_FORMATS.iter().find(|k| *k == f) {
            Some(k) => k,
            None => return Err(format!("unsupported response_format {f:?}")),
        },
        Some(f) => return Err(format!("unsupported response_format {f}")),
    };
    Ok(Job {
        model,
        input,
        voice,
        format,
    })
}

/// What one synthesis produced.
struct Outcome {
    audio: Bytes,
    failure: Option<SynthesisFailure>,
}

/// `POST /v1/audio/speech` (`durable` false) and `/v1/audio/executions`.
async fn work(shared: &Arc<Shared>, body: &[u8], durable: bool) -> Response<RespBody> {
    let (job, id, early) = {
        let mut st = shared.lock();
        let job = match parse_job(&st, body) {
            Ok(job) => job,
            Err(message) => return bad_request(&message),
        };
        let id = durable.then(|| st.new_id());
        if let Some(id) = &id {
            st.executions.push(Execution {
                id: id.clone(),
                model: job.model.clone(),
                engine: None,
                voice: job.voice.clone(),
                format: job.format,
                status: "queued",
                audio: None,
                created_at: now_s(),
                completed_at: None,
            });
        }
        (job, id, durable && st.faults.early_accept)
    };
    // The synthesis runs on its own task: a client that goes away does not
    // stop it, as on a real server.
    let (done_tx, done_rx) = oneshot::channel();
    let task_shared = Arc::clone(shared);
    let task_job = job.clone();
    let task_id = id.clone();
    tokio::spawn(async move {
        let outcome = synthesize(&task_shared, &task_job, task_id.as_deref()).await;
        let _ = done_tx.send(outcome);
    });
    if early && let Some(id) = &id {
        let receipt = shared
            .lock()
            .execution(id)
            .map(Execution::receipt)
            .unwrap_or(Value::Null);
        return json_reply(StatusCode::ACCEPTED, &receipt);
    }
    let Ok(outcome) = done_rx.await else {
        return error_reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "the synthesis task ended without a result",
        );
    };
    if outcome.failure == Some(SynthesisFailure::ServerError) {
        return error_reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "emulated synthesis failure",
        );
    }
    let (bytes, kind) = match &id {
        Some(id) => {
            let receipt = shared
                .lock()
                .execution(id)
                .map(Execution::receipt)
                .unwrap_or(Value::Null);
            (Bytes::from(receipt.to_string()), JSON)
        }
        None => (outcome.audio, content_type(job.format)),
    };
    if outcome.failure == Some(SynthesisFailure::CutMidBody) {
        return cut_reply(bytes, kind);
    }
    full(StatusCode::OK, kind, bytes)
}

/// 200 with the full length announced, half the body, then an abort.
fn cut_reply(bytes: Bytes, kind: &str) -> Response<RespBody> {
    let (tx, rx) = mpsc::channel(2);
    let len = bytes.len();
    let half = bytes.slice(..len / 2);
    tokio::spawn(async move {
        if tx.send(Ok(half)).await.is_ok() {
            // Let the half reach the client before the connection is cut.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = tx
                .send(Err("emulated failure: the reply is cut mid-body".into()))
                .await;
        }
    });
    let mut response = Response::new(BodyExt::boxed(ChannelBody::new(rx)));
    if let Ok(v) = kind.parse() {
        response.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    response
        .headers_mut()
        .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
    response
}

/// Runs one job on the worker: switch if needed, synthesize, publish.
async fn synthesize(shared: &Shared, job: &Job, id: Option<&str>) -> Outcome {
    let _worker = shared.worker.lock().await;
    let (engine, switch_time) = {
        let mut st = shared.lock();
        // `parse_job` checked the model; a fallback keeps this total.
        let engine = st.resolve(&job.model).unwrap_or_else(|| job.model.clone());
        let switch = (st.loaded.as_ref() != Some(&engine)).then_some(st.options.switch_time);
        if switch.is_some() {
            st.loaded = None;
            st.switching = true;
            st.switches += 1;
        }
        (engine, switch)
    };
    if let Some(time) = switch_time {
        tokio::time::sleep(time).await;
        let mut st = shared.lock();
        st.loaded = Some(engine.clone());
        st.switching = false;
    }
    let (synthesis_time, failure) = {
        let mut st = shared.lock();
        st.working = true;
        *st.counts.entry(engine.clone()).or_insert(0) += 1;
        if let Some(e) = id.and_then(|id| st.execution_mut(id)) {
            e.status = "running";
            e.engine = Some(engine.clone());
        }
        (st.options.synthesis_time, st.faults.fail_synthesis)
    };
    tokio::time::sleep(synthesis_time).await;
    let audio = audio(&job.input, job.format);
    let mut st = shared.lock();
    if let Some(e) = id.and_then(|id| st.execution_mut(id)) {
        e.completed_at = Some(now_s());
        if failure == Some(SynthesisFailure::ServerError) {
            e.status = "failed";
        } else {
            e.status = "completed";
            e.audio = Some(audio.clone());
        }
    }
    st.working = false;
    Outcome { audio, failure }
}

/// The synthesized audio: 0.1 s plus 10 ms per input character (at most
/// 1 s) of a 440 Hz square wave, as WAV or raw PCM.
pub fn synthesized_audio(input: &str, format: &str) -> Bytes {
    audio(input, format)
}

fn audio(input: &str, format: &str) -> Bytes {
    let chars = u32::try_from(input.chars().count()).unwrap_or(u32::MAX);
    let samples = (SAMPLE_RATE / 10)
        .saturating_add(chars.saturating_mul(SAMPLE_RATE / 100))
        .min(SAMPLE_RATE);
    let period = SAMPLE_RATE / 440;
    let mut pcm = Vec::with_capacity(samples as usize * 2);
    for i in 0..samples {
        let v: i16 = if (i % period) < period / 2 {
            8_000
        } else {
            -8_000
        };
        pcm.extend_from_slice(&v.to_le_bytes());
    }
    if format == "pcm" {
        return Bytes::from(pcm);
    }
    let data_len = u32::try_from(pcm.len()).unwrap_or(u32::MAX);
    let mut wav = Vec::with_capacity(44 + pcm.len());
    wav.extend_from_slice(b"RIFF");
    wav.extend_from_slice(&(36 + data_len).to_le_bytes());
    wav.extend_from_slice(b"WAVEfmt ");
    wav.extend_from_slice(&16u32.to_le_bytes());
    wav.extend_from_slice(&1u16.to_le_bytes()); // PCM
    wav.extend_from_slice(&1u16.to_le_bytes()); // mono
    wav.extend_from_slice(&SAMPLE_RATE.to_le_bytes());
    wav.extend_from_slice(&(SAMPLE_RATE * 2).to_le_bytes()); // byte rate
    wav.extend_from_slice(&2u16.to_le_bytes()); // block align
    wav.extend_from_slice(&16u16.to_le_bytes()); // bits per sample
    wav.extend_from_slice(b"data");
    wav.extend_from_slice(&data_len.to_le_bytes());
    wav.extend_from_slice(&pcm);
    Bytes::from(wav)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn ids_are_valid_result_read_ids() {
        assert!(valid_id("exec_0123456789abcdef"));
        assert!(!valid_id("short"));
        assert!(!valid_id("has space!"));
        assert!(!valid_id(&"a".repeat(81)));
    }

    #[test]
    fn wav_header_matches_its_data() {
        let wav = audio("hi", "wav");
        assert_eq!(&wav[0..4], b"RIFF");
        assert_eq!(&wav[8..12], b"WAVE");
        let data_len = u32::from_le_bytes(wav[40..44].try_into().unwrap()) as usize;
        assert_eq!(wav.len(), 44 + data_len);
        assert_eq!(audio("hi", "pcm").len(), data_len);
    }
}
