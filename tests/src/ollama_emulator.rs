//! An in-process emulator of the Ollama HTTP API of a release later than the
//! real ones the harness runs ([`OllamaServer`](crate::OllamaServer): 0.5.4
//! and 0.9.3), for what those releases lack and for faults.
//!
//! # Which release each part follows
//!
//! Checked against the real 0.5.4 and 0.9.3 (`tests/harness/ollama.rs`), the parts
//! they share with later releases: the routes and reply shapes of
//! `/api/generate`, `/api/chat` (NDJSON by default, `done_reason`), loading
//! with an empty prompt and unloading with `keep_alive: 0` (`done_reason:
//! "unload"`), `/api/tags`, `/api/version`, `/v1/chat/completions`,
//! `/v1/models`, `/api/ps`'s `name`, `model`, `digest`, `expires_at` (and
//! 292 years ahead for `keep_alive: -1`), a reload when `options.num_ctx`
//! changes, and 404 `model 'x' not found`. Tests of those run against the
//! real servers.
//!
//! Only later releases (this emulator, after v0.32.15), which tests need it for:
//! - `context_length` in `/api/ps`: Ollama 0.10.0 added it (ollama/ollama
//!   pull request 11331); 0.5.4 and 0.9.3 report none, so resident credit by
//!   request kind (RES-05..15) is tested here.
//! - The default context of 4096 ([`DEFAULT_NUM_CTX`], `docs/faq.mdx` of
//!   v0.32.15); 0.5.4 and 0.9.3 load 2048 per slot.
//! - One slot by default ([`OllamaOptions::parallel`]); 0.9.3 runs 2 (as
//!   `parallel: 2` here), 0.5.4 one.
//! - `size_vram == size`: a GPU build; the CPU builds report 0.
//! - Faults no real server shows on demand: a failing or malformed `/api/ps`
//!   ([`OllamaEmulator::set_fail_ps`], [`OllamaEmulator::set_override`]),
//!   a digest changed under a loaded model ([`OllamaEmulator::set_digest`],
//!   as after `ollama pull`), an expiry brought forward
//!   ([`OllamaEmulator::expire`]), and a fixed pause between tokens
//!   ([`OllamaOptions::token_delay`]) that keeps a generation busy for as
//!   long as a test needs on any machine.
//!
//! # Pinned release
//!
//! The wire shapes follow **Ollama v0.32.15** (tag `v0.32.15` of
//! `github.com/ollama/ollama`): `docs/api.md` (generate, chat, load/unload with
//! `done_reason: "load"`/`"unload"`, embed, embeddings, tags, show, ps, version),
//! `docs/openapi.yaml` (`context_length` in `/api/ps`), `docs/faq.mdx` ("By
//! default, Ollama uses a context window size of 4096 tokens"; `OLLAMA_NUM_PARALLEL`:
//! "Required RAM will scale by `OLLAMA_NUM_PARALLEL` * `OLLAMA_CONTEXT_LENGTH`"),
//! `api/types.go` (`ProcessModelResponse`, `ShowResponse`), and, for the error
//! texts, `server/routes.go` (`model 'x' not found` with 404 for an unknown model,
//! `model is required` with 400, `Ollama is running` on `/`) and `openai/openai.go`
//! (`{"error": {"message", "type"}}` on `/v1/*`).
//!
//! # What it emulates
//!
//! - `POST /api/generate`, `/api/chat`: NDJSON streaming by default (one object
//!   a token, then a `done: true` object with `done_reason`, `total_duration`,
//!   `load_duration`, `prompt_eval_count`, `prompt_eval_duration`, `eval_count`,
//!   `eval_duration`, and `context` for generate); `"stream": false` gives one
//!   object. An empty prompt (no messages) loads the model (`done_reason: "load"`),
//!   or unloads it with `keep_alive: 0` (`done_reason: "unload"`).
//! - `POST /api/embed`, `/api/embeddings` (legacy): deterministic unit vectors.
//! - `GET /api/ps`, `GET /api/tags`, `POST /api/show`, `GET /api/version`, `GET` and
//!   `HEAD /`.
//! - OpenAI-compatible `POST /v1/chat/completions`, `/v1/completions` (SSE when
//!   streaming, ending with `data: [DONE]`), `/v1/embeddings`, `GET /v1/models`.
//!
//! Load semantics: a request runs on its model loaded with the context it asks for:
//! `options.num_ctx`, else the Modelfile's `num_ctx`, else the default (4096). If
//! the model is not loaded, or loaded with another `num_ctx` or an older digest
//! (after [`OllamaEmulator::set_digest`], as after `ollama pull`), it is (re)loaded
//! with `context_length = num_ctx × parallel` (`num_ctx` capped at the model's
//! trained context, as Ollama caps it). `keep_alive` (a Go duration string
//! such as `"5m"`, or a number of seconds; default `5m`) sets `expires_at` from the
//! end of the request; `0` unloads right after it, a negative value keeps it
//! forever (reported, as Ollama does, about 292 years ahead). A model stays loaded
//! while a request runs on it.
//!
//! Generation: with [`OllamaOptions::llama_server`] set, text comes from a real
//! llama-server's `/completion` (streamed chunks become NDJSON lines); otherwise
//! from deterministic filler tokens, one every [`OllamaOptions::token_delay`], so a
//! test can keep a request busy.
//!
//! Simplifications: no model registry (pull, push, create, copy, delete answer
//! 404), no VRAM accounting across models (every model fits; `size_vram == size`),
//! `size = model size + context_length × kv_bytes_per_token`, tools, images,
//! `format` and `think` are ignored.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::background::{BackgroundServer, ChannelBody, serve_http};
use crate::error::SupportError;

/// The Ollama release whose API the emulator follows (see the module docs).
pub const OLLAMA_RELEASE: &str = "0.32.15";

/// The documented default context window (`docs/faq.mdx` of v0.32.15).
pub const DEFAULT_NUM_CTX: u32 = 4096;

/// Go's longest `time.Duration`, what Ollama uses for "keep loaded forever".
const FOREVER: Duration = Duration::from_nanos(i64::MAX as u64);

/// One model in the emulator's catalog (what `ollama pull` would have fetched).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OllamaModel {
    /// Full name with tag, e.g. `llama3:latest`. A name without a tag gets
    /// `:latest`.
    pub name: String,
    /// The manifest digest (64 hex digits in Ollama).
    pub digest: String,
    /// `PARAMETER num_ctx` of its Modelfile, if any.
    pub modelfile_num_ctx: Option<u32>,
    /// Bytes of weights (`size` in `/api/tags`).
    pub size: u64,
    /// `details.family` and the `model_info` key prefix, e.g. `llama`.
    pub family: String,
    /// `details.parameter_size`, e.g. `8.0B`.
    pub parameter_size: String,
    /// `details.quantization_level`, e.g. `Q4_0`.
    pub quantization_level: String,
    /// The model's trained context length (`<family>.context_length`).
    pub max_context: u32,
    /// Whether it is an embedding model (`capabilities: ["embedding"]`).
    pub embedding: bool,
}

impl OllamaModel {
    /// A model named `name` with a digest derived from the name, no Modelfile
    /// `num_ctx`, 1 GiB of weights, family `llama`.
    pub fn new(name: &str) -> Self {
        let name = full_name(name);
        Self {
            digest: fake_digest(&name),
            name,
            modelfile_num_ctx: None,
            size: 1 << 30,
            family: "llama".into(),
            parameter_size: "1.0B".into(),
            quantization_level: "Q4_0".into(),
            max_context: 131_072,
            embedding: false,
        }
    }

    /// With `PARAMETER num_ctx n` in its Modelfile.
    pub fn with_num_ctx(mut self, num_ctx: u32) -> Self {
        self.modelfile_num_ctx = Some(num_ctx);
        self
    }
}

/// How to run an [`OllamaEmulator`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OllamaOptions {
    /// The catalog. Default: `llama3:latest`, `qwen2.5:7b` (Modelfile `num_ctx
    /// 8192`) and the embedding model `all-minilm:latest`.
    pub models: Vec<OllamaModel>,
    /// Parallel slots (`OLLAMA_NUM_PARALLEL`): a model loads with `parallel ×
    /// num_ctx` of context. Default 1.
    pub parallel: u32,
    /// The context when neither the request nor the Modelfile sets one. Default
    /// [`DEFAULT_NUM_CTX`].
    pub default_num_ctx: u32,
    /// Tokens generated when the request sets no `num_predict` (`max_tokens`).
    /// Default 8.
    pub default_tokens: u32,
    /// The pause before each filler token. Default zero.
    pub token_delay: Duration,
    /// A llama-server base URL (e.g. [`LlamaServer::base_url`](crate::LlamaServer::base_url))
    /// to generate real text through its `/completion`. Default none: filler.
    pub llama_server: Option<String>,
    /// Bytes of KV cache a token of context adds to a loaded model's size.
    /// Default 64 KiB.
    pub kv_bytes_per_token: u64,
    /// Length of the embedding vectors. Default 8.
    pub embedding_length: usize,
    /// What `/api/version` answers. Default [`OLLAMA_RELEASE`].
    pub version: String,
}

impl Default for OllamaOptions {
    fn default() -> Self {
        let mut embed = OllamaModel::new("all-minilm");
        embed.family = "bert".into();
        embed.parameter_size = "23M".into();
        embed.quantization_level = "F16".into();
        embed.size = 45_960_996;
        embed.max_context = 512;
        embed.embedding = true;
        Self {
            models: vec![
                OllamaModel::new("llama3"),
                OllamaModel::new("qwen2.5:7b").with_num_ctx(8192),
                embed,
            ],
            parallel: 1,
            default_num_ctx: DEFAULT_NUM_CTX,
            default_tokens: 8,
            token_delay: Duration::ZERO,
            llama_server: None,
            kv_bytes_per_token: 64 * 1024,
            embedding_length: 8,
            version: OLLAMA_RELEASE.into(),
        }
    }
}

/// A loaded model, as the emulator sees it (more than `/api/ps` shows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedModelInfo {
    /// Full name with tag.
    pub name: String,
    /// The digest it was loaded from.
    pub digest: String,
    /// The per-slot context it was loaded for (requested, Modelfile or default).
    pub num_ctx: u32,
    /// `num_ctx × parallel`: `context_length` in `/api/ps`.
    pub context_length: u32,
    /// `size` (and `size_vram`) in `/api/ps`.
    pub size: u64,
    /// When it unloads; `None` while a request runs on it.
    pub expires_at: Option<SystemTime>,
    /// Requests running on it now.
    pub active: usize,
    /// Which load this is: 1 for the emulator's first load, counting up.
    pub load_id: u64,
}

/// One request the emulator received.
#[derive(Debug, Clone, PartialEq)]
pub struct OllamaRequest {
    /// E.g. `POST`.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The body as JSON; `Value::Null` when empty or not JSON.
    pub body: Value,
}

/// An emulated Ollama server on its own thread and tokio runtime, listening on a
/// free 127.0.0.1 port (see the module docs for what it emulates).
#[derive(Debug)]
pub struct OllamaEmulator {
    server: BackgroundServer,
    state: Arc<Shared>,
}

impl OllamaEmulator {
    /// Starts an emulator.
    pub fn start(options: OllamaOptions) -> Result<Self, SupportError> {
        if options.parallel == 0 {
            return Err(SupportError::Invalid {
                what: "OllamaOptions::parallel".into(),
                message: "it must be at least 1".into(),
            });
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| SupportError::io("ollama emulator: build its tokio runtime", e))?;
        let state = Arc::new(Shared::new(options));
        let thread_state = Arc::clone(&state);
        let server =
            BackgroundServer::start("ollama-emulator", runtime, move |listener, stopped| {
                serve(listener, thread_state, stopped)
            })?;
        Ok(Self { server, state })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    /// Loads `model` before any request, as an installer's preload would: with
    /// `num_ctx` per slot (else the Modelfile's or the default) and the default
    /// keep-alive (5 minutes).
    pub fn preload(&self, model: &str, num_ctx: Option<u32>) -> Result<(), SupportError> {
        let mut st = self.state.lock();
        let name = st.resolve(model).ok_or_else(|| SupportError::Invalid {
            what: format!("model {model:?}"),
            message: "not in the emulator's catalog".into(),
        })?;
        let (_, load_id) = st.ensure_loaded(&name, num_ctx);
        st.release(
            &name,
            load_id,
            KeepAlive::For(Duration::from_secs(300)),
            false,
        );
        Ok(())
    }

    /// Adds (or replaces) a model in the catalog.
    pub fn add_model(&self, model: OllamaModel) {
        let mut st = self.state.lock();
        st.models.retain(|m| m.name != model.name);
        st.models.push(model);
    }

    /// Sets or clears the Modelfile `num_ctx` of `model`; whether it exists.
    pub fn set_modelfile_num_ctx(&self, model: &str, num_ctx: Option<u32>) -> bool {
        self.state
            .lock()
            .model_mut(model)
            .map(|m| m.modelfile_num_ctx = num_ctx)
            .is_some()
    }

    /// Gives `model` a new digest, as after `ollama pull` fetched a new version:
    /// `/api/tags` and `/api/show` tell the new one at once, a loaded instance
    /// keeps the old one in `/api/ps` until a request reloads it. Whether the
    /// model exists.
    pub fn set_digest(&self, model: &str, digest: &str) -> bool {
        self.state
            .lock()
            .model_mut(model)
            .map(|m| m.digest = digest.to_owned())
            .is_some()
    }

    /// Sets the parallel slots for the next loads (`n` ≥ 1).
    pub fn set_parallel(&self, n: u32) {
        self.state.lock().options.parallel = n.max(1);
    }

    /// Sets the pause before each filler token.
    pub fn set_token_delay(&self, delay: Duration) {
        self.state.lock().options.token_delay = delay;
    }

    /// Makes `/api/ps` answer 500 with an error object (or serve again).
    pub fn set_fail_ps(&self, fail: bool) {
        self.set_override(
            "/api/ps",
            fail.then(|| (500, r#"{"error":"emulated failure"}"#.to_owned())),
        );
    }

    /// Makes every request to `path` answer `status` with `body` as
    /// `application/json`, verbatim, e.g. a malformed body for bad-input tests;
    /// `None` restores the normal answer. The request is still recorded.
    pub fn set_override(&self, path: &str, reply: Option<(u16, String)>) {
        let mut st = self.state.lock();
        match reply {
            Some(reply) => {
                st.overrides.insert(path.to_owned(), reply);
            }
            None => {
                st.overrides.remove(path);
            }
        }
    }

    /// The loaded models (expired ones are gone), sorted by name.
    pub fn loaded(&self) -> Vec<LoadedModelInfo> {
        let mut st = self.state.lock();
        st.purge();
        let mut out: Vec<LoadedModelInfo> = st.loaded.values().cloned().collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Unloads `model` now, as if its keep-alive ran out; whether it was loaded.
    pub fn expire(&self, model: &str) -> bool {
        let mut st = self.state.lock();
        let name = st.resolve(model).unwrap_or_else(|| full_name(model));
        st.loaded.remove(&name).is_some()
    }

    /// Every request received since the start or the last
    /// [`clear_requests`](Self::clear_requests), in order of arrival.
    pub fn requests(&self) -> Vec<OllamaRequest> {
        self.state.lock().requests.clone()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        self.state.lock().requests.clear();
    }

    /// Generation requests running now (across models).
    pub fn in_flight(&self) -> usize {
        self.state.lock().loaded.values().map(|l| l.active).sum()
    }

    /// Stops listening and cuts the running exchanges. Idempotent; also done on
    /// drop.
    pub fn stop(&mut self) {
        self.server.stop();
    }
}

// ---------------------------------------------------------------------------
// State

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    options: OllamaOptions,
    models: Vec<OllamaModel>,
    loaded: HashMap<String, LoadedModelInfo>,
    requests: Vec<OllamaRequest>,
    overrides: HashMap<String, (u16, String)>,
    loads: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeepAlive {
    For(Duration),
    Forever,
}

impl Shared {
    fn new(options: OllamaOptions) -> Self {
        let models = options
            .models
            .iter()
            .cloned()
            .map(|mut m| {
                m.name = full_name(&m.name);
                m
            })
            .collect();
        Self {
            state: Mutex::new(State {
                options,
                models,
                loaded: HashMap::new(),
                requests: Vec::new(),
                overrides: HashMap::new(),
                loads: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update leaves the state consistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    fn resolve(&self, name: &str) -> Option<String> {
        let full = full_name(name);
        self.models
            .iter()
            .find(|m| m.name == full)
            .map(|m| m.name.clone())
    }

    fn model(&self, full: &str) -> Option<&OllamaModel> {
        self.models.iter().find(|m| m.name == full)
    }

    fn model_mut(&mut self, name: &str) -> Option<&mut OllamaModel> {
        let full = full_name(name);
        self.models.iter_mut().find(|m| m.name == full)
    }

    fn purge(&mut self) {
        let now = SystemTime::now();
        self.loaded
            .retain(|_, l| l.active > 0 || l.expires_at.is_none_or(|at| at > now));
    }

    /// Makes sure `name` is loaded for `num_ctx` (or its default) with its
    /// current digest, counts one more request on it; (whether it loaded now,
    /// the load id).
    fn ensure_loaded(&mut self, name: &str, num_ctx: Option<u32>) -> (bool, u64) {
        self.purge();
        let Some(model) = self.model(name).cloned() else {
            return (false, 0);
        };
        let num_ctx = num_ctx
            .or(model.modelfile_num_ctx)
            .unwrap_or(self.options.default_num_ctx)
            // Ollama caps the context at the model's trained context.
            .min(model.max_context.max(1));
        if let Some(l) = self.loaded.get_mut(name)
            && l.num_ctx == num_ctx
            && l.digest == model.digest
        {
            l.active += 1;
            l.expires_at = None;
            return (false, l.load_id);
        }
        self.loads += 1;
        let context_length = num_ctx.saturating_mul(self.options.parallel);
        let info = LoadedModelInfo {
            name: name.to_owned(),
            digest: model.digest.clone(),
            num_ctx,
            context_length,
            size: model.size + u64::from(context_length) * self.options.kv_bytes_per_token,
            expires_at: None,
            active: 1,
            load_id: self.loads,
        };
        self.loaded.insert(name.to_owned(), info);
        (true, self.loads)
    }

    /// One request on load `load_id` of `name` ended.
    fn release(&mut self, name: &str, load_id: u64, keep: KeepAlive, unload: bool) {
        let Some(l) = self.loaded.get_mut(name) else {
            return;
        };
        if l.load_id != load_id {
            return;
        }
        l.active = l.active.saturating_sub(1);
        let drop_now = unload || keep == KeepAlive::For(Duration::ZERO);
        if l.active == 0 {
            if drop_now {
                self.loaded.remove(name);
                return;
            }
            let span = match keep {
                KeepAlive::For(d) => d,
                KeepAlive::Forever => FOREVER,
            };
            l.expires_at = Some(SystemTime::now() + span);
        }
    }
}

// ---------------------------------------------------------------------------
// Serving

type RespBody = BoxBody<Bytes, Infallible>;

async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<Shared>,
    stopped: oneshot::Receiver<()>,
) {
    serve_http(listener, stopped, move |req| {
        handle(req, Arc::clone(&state))
    })
    .await;
}

fn full(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response<RespBody> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    if let Ok(v) = content_type.parse() {
        response.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    response
}

fn json_reply(status: u16, value: &Value) -> Response<RespBody> {
    full(status, "application/json; charset=utf-8", value.to_string())
}

fn ollama_error(status: u16, message: &str) -> Response<RespBody> {
    json_reply(status, &json!({ "error": message }))
}

fn openai_error(status: u16, message: &str) -> Response<RespBody> {
    let kind = match status {
        400 => "invalid_request_error",
        404 => "not_found_error",
        _ => "api_error",
    };
    json_reply(
        status,
        &json!({ "error": { "message": message, "type": kind, "param": null, "code": null } }),
    )
}

fn streaming(content_type: &str, rx: mpsc::Receiver<Bytes>) -> Response<RespBody> {
    let mut response = Response::new(ChannelBody::new(rx).boxed());
    if let Ok(v) = content_type.parse() {
        response.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    response
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<Shared>,
) -> Result<Response<RespBody>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let overridden = {
        let mut st = state.lock();
        st.requests.push(OllamaRequest {
            method: method.to_string(),
            path: path.clone(),
            body: body.clone(),
        });
        st.overrides.get(&path).cloned()
    };
    if let Some((status, text)) = overridden {
        return Ok(full(status, "application/json; charset=utf-8", text));
    }
    let is_json_post = method == Method::POST;
    if is_json_post && !body.is_object() && path.starts_with("/api/") {
        let message = if bytes.is_empty() {
            "missing request body"
        } else {
            "invalid character in request body"
        };
        return Ok(ollama_error(400, message));
    }
    let reply = match (method.clone(), path.as_str()) {
        (Method::GET | Method::HEAD, "/") => {
            full(200, "text/plain; charset=utf-8", "Ollama is running")
        }
        (Method::GET, "/api/version") => {
            let version = state.lock().options.version.clone();
            json_reply(200, &json!({ "version": version }))
        }
        (Method::GET, "/api/tags") => json_reply(200, &tags(&state)),
        (Method::GET, "/api/ps") => json_reply(200, &ps(&state)),
        (Method::POST, "/api/show") => show(&state, &body),
        (Method::POST, "/api/generate") => generate(&state, &body, Api::Generate).await,
        (Method::POST, "/api/chat") => generate(&state, &body, Api::Chat).await,
        (Method::POST, "/api/embed") => embed(&state, &body, Api::Embed),
        (Method::POST, "/api/embeddings") => embed(&state, &body, Api::Embeddings),
        (Method::POST, "/v1/chat/completions") => generate(&state, &body, Api::OpenAiChat).await,
        (Method::POST, "/v1/completions") => generate(&state, &body, Api::OpenAiCompletion).await,
        (Method::POST, "/v1/embeddings") => embed(&state, &body, Api::OpenAiEmbeddings),
        (Method::GET, "/v1/models") => json_reply(200, &openai_models(&state)),
        (_, p) if p.starts_with("/v1/") => openai_error(404, "404 page not found"),
        _ => full(404, "text/plain", "404 page not found"),
    };
    Ok(reply)
}

fn details(m: &OllamaModel) -> Value {
    json!({
        "parent_model": "",
        "format": "gguf",
        "family": m.family,
        "families": [m.family],
        "parameter_size": m.parameter_size,
        "quantization_level": m.quantization_level,
    })
}

fn tags(state: &Shared) -> Value {
    let st = state.lock();
    let models: Vec<Value> = st
        .models
        .iter()
        .map(|m| {
            json!({
                "name": m.name,
                "model": m.name,
                "modified_at": "2026-01-01T00:00:00Z",
                "size": m.size,
                "digest": m.digest,
                "details": details(m),
            })
        })
        .collect();
    json!({ "models": models })
}

fn ps(state: &Shared) -> Value {
    let mut st = state.lock();
    st.purge();
    let mut loaded: Vec<&LoadedModelInfo> = st.loaded.values().collect();
    loaded.sort_by(|a, b| a.name.cmp(&b.name));
    let models: Vec<Value> = loaded
        .iter()
        .map(|l| {
            let model = st.model(&l.name);
            // A running request keeps it loaded; Ollama then shows now + keep-alive.
            let expires = l
                .expires_at
                .unwrap_or_else(|| SystemTime::now() + Duration::from_secs(300));
            json!({
                "name": l.name,
                "model": l.name,
                "size": l.size,
                "digest": l.digest,
                "details": model.map(details).unwrap_or_else(|| json!({})),
                "expires_at": rfc3339(expires),
                "size_vram": l.size,
                "context_length": l.context_length,
            })
        })
        .collect();
    json!({ "models": models })
}

fn show(state: &Shared, body: &Value) -> Response<RespBody> {
    let asked = body["model"]
        .as_str()
        .or_else(|| body["name"].as_str())
        .unwrap_or("");
    if asked.is_empty() {
        return ollama_error(400, "model is required");
    }
    let st = state.lock();
    let Some(m) = st.resolve(asked).and_then(|n| st.model(&n).cloned()) else {
        return ollama_error(404, &format!("model '{asked}' not found"));
    };
    let mut parameters = String::new();
    let mut modelfile = format!(
        "# Modelfile generated by \"ollama show\"\n# To build a new Modelfile based on this one, replace the FROM line with:\n# FROM {}\n\nFROM /root/.ollama/models/blobs/sha256-{}\nTEMPLATE \"\"\"{{{{ .Prompt }}}}\"\"\"\n",
        m.name, m.digest
    );
    if let Some(n) = m.modelfile_num_ctx {
        parameters.push_str(&format!("{:<31}{n}\n", "num_ctx"));
        modelfile.push_str(&format!("PARAMETER num_ctx {n}\n"));
    }
    parameters.push_str(&format!("{:<31}\"<|eot_id|>\"", "stop"));
    modelfile.push_str("PARAMETER stop <|eot_id|>\n");
    let f = &m.family;
    let model_info = json!({
        "general.architecture": f,
        "general.file_type": 2,
        "general.parameter_count": m.size,
        "general.quantization_version": 2,
        format!("{f}.context_length"): m.max_context,
        format!("{f}.embedding_length"): st.options.embedding_length,
    });
    let capabilities = if m.embedding {
        json!(["embedding"])
    } else {
        json!(["completion"])
    };
    json_reply(
        200,
        &json!({
            "modelfile": modelfile,
            "parameters": parameters,
            "template": "{{ .Prompt }}",
            "details": details(&m),
            "model_info": model_info,
            "capabilities": capabilities,
            "modified_at": "2026-01-01T00:00:00Z",
        }),
    )
}

fn openai_models(state: &Shared) -> Value {
    let st = state.lock();
    let data: Vec<Value> = st
        .models
        .iter()
        .map(|m| json!({ "id": m.name, "object": "model", "created": 1_767_225_600, "owned_by": "library" }))
        .collect();
    json!({ "object": "list", "data": data })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Generate,
    Chat,
    Embed,
    Embeddings,
    OpenAiChat,
    OpenAiCompletion,
    OpenAiEmbeddings,
}

impl Api {
    fn openai(self) -> bool {
        matches!(
            self,
            Api::OpenAiChat | Api::OpenAiCompletion | Api::OpenAiEmbeddings
        )
    }
}

/// Parses `keep_alive`: a number of seconds, or a Go duration string; negative
/// means forever. `None` for an absent value (the default applies), `Err` for a
/// bad one.
fn keep_alive(v: &Value) -> Result<Option<KeepAlive>, String> {
    let secs = match v {
        Value::Null => return Ok(None),
        Value::Number(n) => n.as_f64().unwrap_or(0.0),
        Value::String(s) => match s.trim().parse::<f64>() {
            Ok(n) => n,
            Err(_) => go_duration(s).ok_or_else(|| format!("time: invalid duration \"{s}\""))?,
        },
        _ => return Err("invalid keep_alive".into()),
    };
    if secs < 0.0 {
        Ok(Some(KeepAlive::Forever))
    } else {
        Ok(Some(KeepAlive::For(Duration::from_secs_f64(secs))))
    }
}

/// Go's `time.ParseDuration`, in seconds (e.g. `1h30m`, `-1s`, `500ms`).
fn go_duration(s: &str) -> Option<f64> {
    let s = s.trim();
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Some(0.0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += n * scale;
    }
    Some(if neg { -total } else { total })
}

/// What a generation request asked for.
struct Job {
    api: Api,
    /// The model name as the request spelled it (echoed back, as Ollama does).
    asked: String,
    name: String,
    load_id: u64,
    keep: KeepAlive,
    prompt: String,
    tokens: u32,
    explicit_limit: bool,
    stream: bool,
    load_duration: Duration,
    started: Instant,
}

fn requested_num_ctx(body: &Value) -> Option<u32> {
    body["options"]["num_ctx"]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
}

fn prompt_of(api: Api, body: &Value) -> String {
    match api {
        Api::Chat | Api::OpenAiChat => body["messages"]
            .as_array()
            .map(|ms| {
                ms.iter()
                    .filter_map(|m| m["content"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default(),
        _ => body["prompt"].as_str().unwrap_or("").to_owned(),
    }
}

async fn generate(state: &Arc<Shared>, body: &Value, api: Api) -> Response<RespBody> {
    let (mut response, status) = start_job(state, body, api);
    // Without streaming, the status waits for the outcome: 500 on a failure.
    if let Some(status) = status {
        let status = status.await.unwrap_or(500);
        *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    }
    response
}

/// A response, and without streaming, where its status will come from.
type Started = (Response<RespBody>, Option<oneshot::Receiver<u16>>);

/// Answers at once (an error, a load, an unload), or starts the job.
fn start_job(state: &Arc<Shared>, body: &Value, api: Api) -> Started {
    let err = |status: u16, message: &str| {
        if api.openai() {
            openai_error(status, message)
        } else {
            ollama_error(status, message)
        }
    };
    let asked = body["model"].as_str().unwrap_or("").to_owned();
    if asked.is_empty() {
        return (err(400, "model is required"), None);
    }
    let keep = match keep_alive(&body["keep_alive"]) {
        Ok(k) => k.unwrap_or(KeepAlive::For(Duration::from_secs(300))),
        Err(e) => return (err(400, &e), None),
    };
    let prompt = prompt_of(api, body);
    let has_messages = body["messages"].as_array().is_some_and(|m| !m.is_empty());
    let empty = match api {
        Api::Chat => !has_messages,
        Api::Generate => prompt.is_empty(),
        _ => false,
    };
    let mut st = state.lock();
    let Some(name) = st.resolve(&asked) else {
        return (err(404, &format!("model '{asked}' not found")), None);
    };
    let created_at = rfc3339(SystemTime::now());
    let head = |reason: &str| {
        let mut v = json!({ "model": asked, "created_at": created_at });
        if api == Api::Chat {
            v["message"] = json!({ "role": "assistant", "content": "" });
        } else {
            v["response"] = json!("");
        }
        v["done"] = json!(true);
        v["done_reason"] = json!(reason);
        v
    };
    if empty && keep == KeepAlive::For(Duration::ZERO) {
        st.loaded.remove(&name);
        return (json_reply(200, &head("unload")), None);
    }
    let t0 = Instant::now();
    let (_, load_id) = st.ensure_loaded(&name, requested_num_ctx(body));
    if empty {
        st.release(&name, load_id, keep, false);
        return (json_reply(200, &head("load")), None);
    }
    let limit = if api.openai() {
        body["max_tokens"].as_u64()
    } else {
        body["options"]["num_predict"].as_u64()
    };
    let tokens = limit
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(st.options.default_tokens);
    let llama = st.options.llama_server.clone();
    let delay = st.options.token_delay;
    drop(st);
    let default_stream = !api.openai();
    let job = Job {
        api,
        asked,
        name,
        load_id,
        keep,
        prompt,
        tokens,
        explicit_limit: limit.is_some(),
        stream: body["stream"].as_bool().unwrap_or(default_stream),
        load_duration: t0.elapsed(),
        started: t0,
    };
    let (tx, rx) = mpsc::channel(64);
    let content_type = match (job.stream, api.openai()) {
        (true, true) => "text/event-stream",
        (true, false) => "application/x-ndjson",
        (false, _) => "application/json; charset=utf-8",
    };
    let (status_tx, status_rx) = oneshot::channel();
    let stream = job.stream;
    tokio::spawn(run_job(Arc::clone(state), job, llama, delay, tx, status_tx));
    (streaming(content_type, rx), (!stream).then_some(status_rx))
}

/// Generates the tokens of `job` and writes its body into `tx`; ends the request
/// on its model (also when the client went away).
async fn run_job(
    state: Arc<Shared>,
    job: Job,
    llama: Option<String>,
    delay: Duration,
    tx: mpsc::Sender<Bytes>,
    status: oneshot::Sender<u16>,
) {
    let mut guard = Release {
        state: Arc::clone(&state),
        name: job.name.clone(),
        load_id: job.load_id,
        keep: job.keep,
        done: false,
    };
    let id = format!(
        "{:x}",
        job.load_id * 1_000_003 + job.started.elapsed().subsec_nanos() as u64
    );
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (tok_tx, mut tok_rx) = mpsc::channel::<Result<String, String>>(16);
    let prompt = job.prompt.clone();
    let n = job.tokens;
    tokio::spawn(async move {
        match llama {
            Some(url) => llama_tokens(&url, &prompt, n, tok_tx).await,
            None => filler_tokens(n, delay, tok_tx).await,
        }
    });
    let eval_start = Instant::now();
    let mut text = String::new();
    let mut count = 0u32;
    let mut error = None;
    while let Some(item) = tok_rx.recv().await {
        match item {
            Ok(token) => {
                count += 1;
                if job.stream {
                    let line = stream_chunk(&job, &token, &id, created);
                    if tx.send(line).await.is_err() {
                        return; // The client went away; `guard` ends the request.
                    }
                }
                text.push_str(&token);
            }
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    let eval = eval_start.elapsed();
    // The request ends before the client can see its end.
    guard.finish();
    let _ = status.send(if error.is_some() { 500 } else { 200 });
    if let Some(e) = error {
        let msg = if job.api.openai() {
            json!({ "error": { "message": e, "type": "api_error" } })
        } else {
            json!({ "error": e })
        };
        let _ = tx.send(Bytes::from(format!("{msg}\n"))).await;
        return;
    }
    let reason = if job.explicit_limit && count >= job.tokens {
        "length"
    } else {
        "stop"
    };
    let prompt_tokens = job.prompt.split_whitespace().count().max(1) as u64;
    let last = final_chunk(
        &job,
        &text,
        count,
        prompt_tokens,
        reason,
        eval,
        &id,
        created,
    );
    let _ = tx.send(last).await;
}

struct Release {
    state: Arc<Shared>,
    name: String,
    load_id: u64,
    keep: KeepAlive,
    done: bool,
}

impl Release {
    fn finish(&mut self) {
        if !self.done {
            self.done = true;
            self.state
                .lock()
                .release(&self.name, self.load_id, self.keep, false);
        }
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        self.finish();
    }
}

const FILLER: [&str; 8] = [
    "The ",
    "sky ",
    "is ",
    "blue ",
    "because ",
    "of ",
    "Rayleigh ",
    "scattering. ",
];

async fn filler_tokens(n: u32, delay: Duration, tx: mpsc::Sender<Result<String, String>>) {
    for i in 0..n as usize {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if tx
            .send(Ok(FILLER[i % FILLER.len()].to_owned()))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Streams `/completion` of a llama-server, one message a chunk of content.
async fn llama_tokens(url: &str, prompt: &str, n: u32, tx: mpsc::Sender<Result<String, String>>) {
    let body = json!({ "prompt": prompt, "n_predict": n, "stream": true }).to_string();
    let target = format!("{}/completion", url.trim_end_matches('/'));
    let stream = crate::http::http_stream(
        "POST",
        &target,
        &[("content-type", "application/json")],
        body.into_bytes(),
    )
    .await;
    let mut stream = match stream {
        Ok(s) if s.status == 200 => s,
        Ok(s) => {
            let _ = tx
                .send(Err(format!("llama-server answered {}", s.status)))
                .await;
            return;
        }
        Err(e) => {
            let _ = tx.send(Err(e.to_string())).await;
            return;
        }
    };
    let mut buf = String::new();
    while let Some(chunk) = stream.next_chunk().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                let _ = tx.send(Err(e.to_string())).await;
                return;
            }
        };
        buf.push_str(&String::from_utf8_lossy(&chunk.data));
        while let Some(end) = buf.find('\n') {
            let line: String = buf.drain(..=end).collect();
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(data.trim()) else {
                continue;
            };
            if let Some(content) = v["content"].as_str()
                && !content.is_empty()
                && tx.send(Ok(content.to_owned())).await.is_err()
            {
                return;
            }
            if v["stop"].as_bool() == Some(true) {
                return;
            }
        }
    }
}

fn ndjson(v: &Value) -> Bytes {
    Bytes::from(format!("{v}\n"))
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn stream_chunk(job: &Job, token: &str, id: &str, created: u64) -> Bytes {
    let now = rfc3339(SystemTime::now());
    match job.api {
        Api::Generate => ndjson(&json!({
            "model": job.asked, "created_at": now, "response": token, "done": false
        })),
        Api::Chat => ndjson(&json!({
            "model": job.asked, "created_at": now,
            "message": { "role": "assistant", "content": token }, "done": false
        })),
        Api::OpenAiChat => sse(&json!({
            "id": format!("chatcmpl-{id}"), "object": "chat.completion.chunk",
            "created": created, "model": job.asked, "system_fingerprint": "fp_ollama",
            "choices": [{ "index": 0, "delta": { "role": "assistant", "content": token },
                          "finish_reason": null }]
        })),
        Api::OpenAiCompletion => sse(&json!({
            "id": format!("cmpl-{id}"), "object": "text_completion",
            "created": created, "model": job.asked, "system_fingerprint": "fp_ollama",
            "choices": [{ "index": 0, "text": token, "finish_reason": null }]
        })),
        Api::Embed | Api::Embeddings | Api::OpenAiEmbeddings => Bytes::new(),
    }
}

#[allow(clippy::too_many_arguments)]
fn final_chunk(
    job: &Job,
    text: &str,
    count: u32,
    prompt_tokens: u64,
    reason: &str,
    eval: Duration,
    id: &str,
    created: u64,
) -> Bytes {
    let now = rfc3339(SystemTime::now());
    let body_text = if job.stream { "" } else { text };
    let total = job.started.elapsed().as_nanos() as u64;
    let stats = |v: &mut Value| {
        v["done"] = json!(true);
        v["done_reason"] = json!(reason);
        v["total_duration"] = json!(total);
        v["load_duration"] = json!(job.load_duration.as_nanos() as u64);
        v["prompt_eval_count"] = json!(prompt_tokens);
        v["prompt_eval_duration"] = json!(1_000_000u64);
        v["eval_count"] = json!(count);
        v["eval_duration"] = json!(eval.as_nanos() as u64);
    };
    let usage = json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": count,
        "total_tokens": prompt_tokens + u64::from(count),
    });
    match job.api {
        Api::Generate => {
            let mut v = json!({ "model": job.asked, "created_at": now, "response": body_text });
            stats(&mut v);
            v["context"] = json!((1..=prompt_tokens + u64::from(count)).collect::<Vec<_>>());
            if job.stream {
                ndjson(&v)
            } else {
                Bytes::from(v.to_string())
            }
        }
        Api::Chat => {
            let mut v = json!({
                "model": job.asked, "created_at": now,
                "message": { "role": "assistant", "content": body_text }
            });
            stats(&mut v);
            if job.stream {
                ndjson(&v)
            } else {
                Bytes::from(v.to_string())
            }
        }
        Api::OpenAiChat if job.stream => {
            let last = json!({
                "id": format!("chatcmpl-{id}"), "object": "chat.completion.chunk",
                "created": created, "model": job.asked, "system_fingerprint": "fp_ollama",
                "choices": [{ "index": 0, "delta": { "role": "assistant", "content": "" },
                              "finish_reason": reason }]
            });
            let mut out = sse(&last).to_vec();
            out.extend_from_slice(b"data: [DONE]\n\n");
            Bytes::from(out)
        }
        Api::OpenAiChat => Bytes::from(
            json!({
                "id": format!("chatcmpl-{id}"), "object": "chat.completion",
                "created": created, "model": job.asked, "system_fingerprint": "fp_ollama",
                "choices": [{ "index": 0, "message": { "role": "assistant", "content": text },
                              "finish_reason": reason }],
                "usage": usage,
            })
            .to_string(),
        ),
        Api::OpenAiCompletion if job.stream => {
            let last = json!({
                "id": format!("cmpl-{id}"), "object": "text_completion",
                "created": created, "model": job.asked, "system_fingerprint": "fp_ollama",
                "choices": [{ "index": 0, "text": "", "finish_reason": reason }]
            });
            let mut out = sse(&last).to_vec();
            out.extend_from_slice(b"data: [DONE]\n\n");
            Bytes::from(out)
        }
        Api::OpenAiCompletion => Bytes::from(
            json!({
                "id": format!("cmpl-{id}"), "object": "text_completion",
                "created": created, "model": job.asked, "system_fingerprint": "fp_ollama",
                "choices": [{ "index": 0, "text": text, "finish_reason": reason }],
                "usage": usage,
            })
            .to_string(),
        ),
        Api::Embed | Api::Embeddings | Api::OpenAiEmbeddings => Bytes::new(),
    }
}

fn embed(state: &Arc<Shared>, body: &Value, api: Api) -> Response<RespBody> {
    let err = |status: u16, message: &str| {
        if api.openai() {
            openai_error(status, message)
        } else {
            ollama_error(status, message)
        }
    };
    let asked = body["model"].as_str().unwrap_or("").to_owned();
    if asked.is_empty() {
        return err(400, "model is required");
    }
    let keep = match keep_alive(&body["keep_alive"]) {
        Ok(k) => k.unwrap_or(KeepAlive::For(Duration::from_secs(300))),
        Err(e) => return err(400, &e),
    };
    let field = if api == Api::Embeddings {
        "prompt"
    } else {
        "input"
    };
    let inputs: Vec<String> = match &body[field] {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    let t0 = Instant::now();
    let mut st = state.lock();
    let Some(name) = st.resolve(&asked) else {
        return err(404, &format!("model '{asked}' not found"));
    };
    let (_, load_id) = st.ensure_loaded(&name, requested_num_ctx(body));
    let dims = st.options.embedding_length;
    st.release(&name, load_id, keep, false);
    drop(st);
    let vectors: Vec<Vec<f64>> = inputs.iter().map(|s| embedding(s, dims)).collect();
    let tokens: u64 = inputs
        .iter()
        .map(|s| s.split_whitespace().count() as u64)
        .sum();
    let total = t0.elapsed().as_nanos() as u64;
    let v = match api {
        Api::Embeddings => json!({ "embedding": vectors.first().cloned().unwrap_or_default() }),
        Api::OpenAiEmbeddings => json!({
            "object": "list",
            "data": vectors.iter().enumerate().map(|(i, e)| json!({
                "object": "embedding", "embedding": e, "index": i
            })).collect::<Vec<_>>(),
            "model": asked,
            "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
        }),
        _ => json!({
            "model": asked,
            "embeddings": vectors,
            "total_duration": total,
            "load_duration": total,
            "prompt_eval_count": tokens,
        }),
    };
    json_reply(200, &v)
}

/// A deterministic unit vector for `text`.
fn embedding(text: &str, dims: usize) -> Vec<f64> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let raw: Vec<f64> = (0..dims)
        .map(|i| {
            for b in text.bytes().chain([i as u8]) {
                h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
            (h % 2001) as f64 / 1000.0 - 1.0
        })
        .collect();
    let norm = raw.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-9);
    raw.iter().map(|x| x / norm).collect()
}

// ---------------------------------------------------------------------------
// Names and times

/// `name` with `:latest` when it has no tag (a `:` after the last `/`).
pub fn full_name(name: &str) -> String {
    let base = name.rsplit('/').next().unwrap_or(name);
    if base.contains(':') {
        name.to_owned()
    } else {
        format!("{name}:latest")
    }
}

fn fake_digest(name: &str) -> String {
    let mut out = String::new();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for round in 0u8..4 {
        for b in name.bytes().chain([round]) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        out.push_str(&format!("{h:016x}"));
    }
    out
}

/// RFC 3339 in UTC with microseconds, e.g. `2026-01-02T03:04:05.123456Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, day) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_get_latest() {
        assert_eq!(full_name("llama3"), "llama3:latest");
        assert_eq!(full_name("llama3:8b"), "llama3:8b");
        assert_eq!(full_name("localhost:5000/x/y"), "localhost:5000/x/y:latest");
    }

    #[test]
    fn durations_parse_like_go() {
        assert_eq!(go_duration("5m"), Some(300.0));
        assert_eq!(go_duration("1h30m"), Some(5400.0));
        assert_eq!(go_duration("-1s"), Some(-1.0));
        assert_eq!(go_duration("500ms"), Some(0.5));
        assert_eq!(go_duration("0"), Some(0.0));
        assert_eq!(go_duration("5x"), None);
        assert_eq!(
            keep_alive(&json!(0)),
            Ok(Some(KeepAlive::For(Duration::ZERO)))
        );
        assert_eq!(keep_alive(&json!(-1)), Ok(Some(KeepAlive::Forever)));
        assert_eq!(keep_alive(&json!("-1m")), Ok(Some(KeepAlive::Forever)));
        assert_eq!(
            keep_alive(&json!("10")),
            Ok(Some(KeepAlive::For(Duration::from_secs(10))))
        );
        assert!(keep_alive(&json!("soon")).is_err());
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let t = UNIX_EPOCH + Duration::from_micros(1_709_251_200_000_001);
        assert_eq!(rfc3339(t), "2024-03-01T00:00:00.000001Z");
        assert!(rfc3339(SystemTime::now() + FOREVER).starts_with("23"));
    }
}
