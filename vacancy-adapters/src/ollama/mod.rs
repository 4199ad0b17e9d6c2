//! Ollama: its native `/api` routes and its OpenAI-compatible `/v1` ones,
//! observed through `GET /api/ps` and `POST /api/show`.
//!
//! Wire shapes follow Ollama v0.32.15 (`docs/api.md`, `api/types.go`), as the
//! emulator in `vacancy-test-support` reproduces them:
//!
//! - `GET /api/ps` answers `{"models": [{"name", "model", "digest",
//!   "expires_at", "size_vram", "context_length", ...}]}`; `expires_at` is an
//!   RFC 3339 time (Go's `time.Time`, with or without fractional seconds, `Z`
//!   or a numeric offset). A model kept loaded forever (`keep_alive: -1`)
//!   shows a time about 292 years ahead.
//! - `/api/ps` does not say whether a request is running on a model, so it
//!   proves no idle state and shows no foreign work.
//! - `POST /api/show {"model"}` answers the Modelfile's parameters as text
//!   lines (`num_ctx  8192`).
//!
//! # Resident credit (RES-01..15)
//!
//! A request is credited as resident only when all of these hold:
//!
//! 1. `/api/ps` shows its model (canonically named, [`canonical_model`]) with
//!    an unload at least 30 s away (RES-03), a digest and a `context_length`
//!    (which Ollama added in 0.10.0);
//! 2. it sets no runner option other than `options.num_ctx` (RES-04,
//!    [`RUNNER_OPTIONS`]);
//! 3. its kind ([`RequestKind`]: canonical model, explicit `num_ctx` or none,
//!    `/api` or `/v1`) is known to reuse the loaded context
//!    ([`LearnedContexts::evidence`], RES-05, RES-10, RES-11).
//!
//! The engine checks the rest (observation ready, ≤ 4 s old, after the last
//! job or yield, RES-02).
//!
//! On releases before 0.10.0 (`/api/ps` without `context_length`, e.g. 0.5.4
//! and 0.9.3) the adapter still observes what is loaded (name, digest,
//! unload time), reads the Modelfile `num_ctx` once per digest and forgets a
//! model's learned kinds when its digest changes, but it learns nothing and
//! credits nothing: every request is charged as a load, and a refusal says
//! that `/api/ps` reports no `context_length`. Kinds are learned from the first `/api/ps` after a
//! request of that kind finished with nothing admitted since (RES-07,
//! [`Adapter::learn`]), kept per digest in `learned-contexts.json`
//! ([`ContextCache`], RES-12..15). The Modelfile `num_ctx` is read from
//! `/api/show` once per digest (RES-09).

mod cache;
mod contexts;
mod inspect;
mod names;
mod observe;
mod ps;
mod reclaim;
mod show;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use vacancy::engine::{Lesson, ModelObservation, Refusal};
use vacancy::traits::routes::RouteOverlap;
use vacancy::traits::{
    Adapter, InspectContext, InspectResult, ObserveError, Reclaimer, RenderedRefusal, RouteClass,
    RouteSpec, RouteTable, WorkRoute, render_ollama,
};

use crate::common::routes::{OPENAI_V1, WORK};
use crate::common::{AdapterCore, AdapterSettings, ObservationClient};
pub use cache::{CacheWriteError, ContextCache, FILE_NAME as LEARNED_CONTEXTS_FILE};
pub use contexts::{
    LearnedContexts, LearnedKind, MAX_KINDS_PER_MODEL, MAX_MODELS, ModelContexts, Modelfile,
};
pub use names::{Family, RequestKind, canonical_model};
pub use ps::{MIN_UNLOAD_SECS, PsModel, parse_ps};
pub use reclaim::OllamaUnloader;
pub use show::modelfile_num_ctx;

/// Ollama's route table, as data.
///
/// # Behavior
///
/// - Work (admitted, released at the clean end of the response, DONE-01):
///   `POST` `/api/generate`, `/api/chat`, `/api/embed`, `/api/embeddings`,
///   `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
///   `/v1/responses`. A `/api/generate` or `/api/chat` request without a
///   prompt or messages loads the model, or with `keep_alive: 0` unloads it;
///   both are still work: a load uses the hardware like any request, and an
///   unload is admitted like one rather than trusted to free anything.
/// - Discovery, forwarded without admission and while lending is refused
///   (ROUTE-12): `GET` (and `HEAD`) `/api/tags`, `/api/version`, `/v1/models`,
///   `/v1/models/{id}` and `/` ("Ollama is running").
/// - Management and owner data, 403 unless `management = "allow"` (ROUTE-08,
///   ROUTE-09): the model store (`POST /api/pull`, `/api/push`, `/api/create`,
///   `/api/copy`, `DELETE /api/delete`, `POST` and `HEAD /api/blobs/{digest}`),
///   `GET /api/ps` (what the owner has loaded, named by ROUTE-08), and
///   `POST /api/show`: it answers the model's Modelfile, template, system
///   prompt, parameters and license, which are the owner's configuration
///   rather than a model listing, so it is owner data, not discovery.
/// - Anything else is unknown: a GET/HEAD is 403, any other method 501
///   (ROUTE-01..03, via `route_policy`).
pub const ROUTES: &[RouteSpec] = crate::join_routes![OWN_ROUTES, OPENAI_V1];

/// The routes of its own, beside [`OPENAI_V1`].
const OWN_ROUTES: &[RouteSpec] = crate::routes![
    Post WORK => ["/api/generate", "/api/chat", "/api/embed", "/api/embeddings"];
    Get RouteClass::Discovery => ["/api/tags", "/api/version", "/"];
    Post RouteClass::Management => [
        "/api/pull", "/api/push", "/api/create", "/api/copy", "/api/blobs/{digest}", "/api/show",
    ];
    Delete RouteClass::Management => ["/api/delete"];
    Get RouteClass::Management => ["/api/blobs/{digest}", "/api/ps"];
];

/// [`ROUTES`] as a checked [`RouteTable`].
///
/// Refused if two entries could match the same request (docs/adapter-guide.md#route-classes); the
/// table's tests build it, so an overlap never ships.
pub fn route_table() -> Result<RouteTable, RouteOverlap> {
    RouteTable::new(ROUTES.to_vec())
}

pub use inspect::RUNNER_OPTIONS;

/// The adapter for Ollama (name `ollama`).
///
/// # Behavior
///
/// - Routes: [`ROUTES`] (ROUTE-01..03, ROUTE-08, ROUTE-09, ROUTE-12).
/// - Inspection: [`inspect_json_body`](crate::common::inspect_json_body) on every work route: a JSON object,
///   `model` a string kept exactly for configuration (MEM-06), and the
///   Responses background rule (ROUTE-05..07). The request's canonical
///   model is what observations and priors match. On the native `/api`
///   routes, `options` must be a JSON object (or absent or `null`) and
///   `options.num_ctx` a positive number, else 400 `invalid_request`; one
///   naming a [`RUNNER_OPTIONS`] key makes the request
///   `RequestReuse::Cannot("the request sets runner option X")` (RES-04);
///   otherwise the request is `RequestReuse::ReusesAs(kind)` (RES-06).
///   The `/v1` routes never set `num_ctx`: Ollama does not read `options` there.
/// - Completion: the clean end of the response (DONE-01).
/// - Observation ([`Adapter::observe`]), with `[upstream.credential]` only
///   (OBS-01/02), stamped before the request: `GET /api/ps`, then
///   `POST /api/show` for each digest not read before (RES-09). Each loaded
///   model is an [`ObservedModel`](vacancy::engine::ObservedModel) (canonical name, digest, context) with
///   evidence `NotProven` when it unloads within [`MIN_UNLOAD_SECS`]
///   (RES-03) or lacks a digest or context, else `ProvenFor` the kinds known
///   to reuse it (RES-05). A malformed `/api/ps` is [`ObserveError::Malformed`],
///   never an observation (OBS-03); a malformed `/api/show` only withholds
///   the Modelfile rule for that digest.
/// - Learning ([`Adapter::learn`]): the lesson's kind gets the context the
///   observation shows, under its digest; written to the [`ContextCache`].
/// - No `verify_stopped` proof: `/api/ps` does not show running requests, so
///   a cut stream keeps its hold (DONE-04).
/// - Reclaimer: [`OllamaUnloader`].
/// - Refusals render in Ollama's dialect, `{"error": "code: reason"}`.
#[derive(Debug)]
pub struct OllamaAdapter {
    core: AdapterCore,
    unloader: Arc<OllamaUnloader>,
    cache: Arc<ContextCache>,
    /// The cache key: the upstream's name.
    upstream: String,
    /// Modelfile `num_ctx` per digest, read once each (RES-09).
    modelfiles: Mutex<HashMap<String, Modelfile>>,
}

impl OllamaAdapter {
    /// The adapter's name in configuration (`adapter = "ollama"`).
    ///
    /// What [`Adapter::name`] answers.
    pub const NAME: &'static str = "ollama";

    /// An adapter for the upstream at `settings.target`, learning into an
    /// in-memory [`ContextCache`].
    ///
    /// Builds and checks [`ROUTES`] (docs/adapter-guide.md#route-classes); connects nothing.
    pub fn new(settings: AdapterSettings) -> Result<Self, RouteOverlap> {
        let unload_client = ObservationClient::new(
            &settings
                .clone()
                .with_observe_timeout(OllamaUnloader::DEFAULT_BOUND),
        );
        Ok(OllamaAdapter {
            unloader: Arc::new(OllamaUnloader::new(
                unload_client,
                OllamaUnloader::DEFAULT_BOUND,
            )),
            core: AdapterCore::new(settings, ROUTES)?,
            cache: Arc::new(ContextCache::in_memory()),
            upstream: String::new(),
            modelfiles: Mutex::new(HashMap::new()),
        })
    }

    /// The same adapter learning into `cache` under the key `upstream` (the
    /// upstream's name), so learned contexts survive restarts (RES-13).
    ///
    /// Several Ollama upstreams share one cache, each under its own name.
    pub fn with_context_cache(mut self, cache: Arc<ContextCache>, upstream: &str) -> Self {
        self.cache = cache;
        self.upstream = upstream.to_owned();
        self
    }

    /// The settings it was built with.
    ///
    /// As given to [`OllamaAdapter::new`].
    pub fn settings(&self) -> &AdapterSettings {
        self.core.settings()
    }

    /// The cache it learns into.
    ///
    /// Shared with the daemon's other Ollama adapters.
    pub fn context_cache(&self) -> &Arc<ContextCache> {
        &self.cache
    }
}

#[async_trait]
impl Adapter for OllamaAdapter {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn routes(&self) -> &RouteTable {
        self.core.routes()
    }

    fn inspect(&self, route: &WorkRoute, ctx: InspectContext<'_>, body: &[u8]) -> InspectResult {
        inspect::inspect(route, ctx, body)
    }

    async fn observe(&self) -> Result<ModelObservation, ObserveError> {
        self.observe_now().await
    }

    async fn learn(&self, lesson: &Lesson, observation: &mut ModelObservation) {
        self.learn_now(lesson, observation).await;
    }

    fn render_refusal(&self, refusal: &Refusal) -> RenderedRefusal {
        render_ollama(refusal)
    }

    fn reclaimer(&self) -> Option<Arc<dyn Reclaimer>> {
        Some(Arc::clone(&self.unloader) as Arc<dyn Reclaimer>)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::common::testing::check_shared_inspection;
    use http::Method;
    use serde_json::Value;
    use vacancy::config::Management;
    use vacancy::engine::RequestReuse;
    use vacancy::traits::{RoutePolicy, route_policy};
    use vacancy::{EntryId, MonotonicClock, RefusalCode};

    fn adapter() -> OllamaAdapter {
        OllamaAdapter::new(AdapterSettings::new(
            "http://127.0.0.1:11434".parse().unwrap(),
            MonotonicClock::new(),
        ))
        .unwrap()
    }

    fn inspect(a: &OllamaAdapter, path: &str, body: &str) -> InspectResult {
        let RouteClass::Work(route) = a.classify(&Method::POST, path) else {
            panic!("POST {path} is not work");
        };
        let headers = http::HeaderMap::new();
        let ctx = InspectContext {
            entry: EntryId::from_u128(1),
            method: &Method::POST,
            path,
            headers: &headers,
        };
        a.inspect(&route, ctx, body.as_bytes())
    }

    #[test]
    fn every_route_of_the_table_is_classified() {
        // ROUTE-01, ROUTE-08, ROUTE-12; DONE-01 for work.
        let a = adapter();
        let work = RouteClass::Work(WorkRoute::response_end());
        let d = RouteClass::Discovery;
        let m = RouteClass::Management;
        let expected = [
            (Method::POST, "/api/generate", work),
            (Method::POST, "/api/chat", work),
            (Method::POST, "/api/embed", work),
            (Method::POST, "/api/embeddings", work),
            (Method::POST, "/v1/chat/completions", work),
            (Method::POST, "/v1/completions", work),
            (Method::POST, "/v1/embeddings", work),
            (Method::POST, "/v1/responses", work),
            (Method::GET, "/api/tags", d),
            (Method::GET, "/api/version", d),
            (Method::GET, "/v1/models", d),
            (Method::GET, "/v1/models/llama3:latest", d),
            (Method::GET, "/", d),
            (Method::POST, "/api/pull", m),
            (Method::POST, "/api/push", m),
            (Method::POST, "/api/create", m),
            (Method::POST, "/api/copy", m),
            (Method::DELETE, "/api/delete", m),
            (Method::POST, "/api/blobs/sha256:abc", m),
            (Method::GET, "/api/blobs/sha256:abc", m),
            (Method::GET, "/api/ps", m),
            (Method::POST, "/api/show", m),
        ];
        for (method, path, class) in &expected {
            assert_eq!(a.classify(method, path), *class, "{method} {path}");
        }
        assert_eq!(ROUTES.len(), expected.len());
        assert_eq!(a.name(), "ollama");
    }

    #[test]
    fn head_reads_follow_their_get() {
        // ROUTE-12 (HEAD / is Ollama's liveness check), ROUTE-08 (HEAD blobs).
        let a = adapter();
        assert_eq!(a.classify(&Method::HEAD, "/"), RouteClass::Discovery);
        assert_eq!(
            a.classify(&Method::HEAD, "/api/tags"),
            RouteClass::Discovery
        );
        assert_eq!(
            a.classify(&Method::HEAD, "/api/blobs/sha256:abc"),
            RouteClass::Management
        );
    }

    #[test]
    fn management_and_owner_data_are_refused_unless_allowed() {
        // ROUTE-08, ROUTE-09: 403 by default, forwarded without a reservation with "allow".
        let a = adapter();
        for (method, path) in [
            (Method::POST, "/api/pull"),
            (Method::POST, "/api/show"),
            (Method::GET, "/api/ps"),
            (Method::DELETE, "/api/delete"),
            (Method::HEAD, "/api/blobs/sha256:abc"),
        ] {
            let class = a.classify(&method, path);
            let RoutePolicy::Refuse(code) = route_policy(class, &method, Management::Deny) else {
                panic!("{method} {path} is not refused");
            };
            assert_eq!(code, RefusalCode::RouteForbidden, "{method} {path}");
            assert_eq!(
                route_policy(class, &method, Management::Allow),
                RoutePolicy::Forward,
                "{method} {path}"
            );
        }
    }

    #[test]
    fn unknown_routes_follow_the_route_policy() {
        // ROUTE-02, ROUTE-03: unlisted GET is 403, another method 501.
        let a = adapter();
        assert_eq!(a.classify(&Method::GET, "/api/secret"), RouteClass::Unknown);
        assert_eq!(a.classify(&Method::PUT, "/api/chat"), RouteClass::Unknown);
        assert_eq!(a.classify(&Method::GET, "/api/chat"), RouteClass::Unknown);
        assert_eq!(
            route_policy(RouteClass::Unknown, &Method::PUT, Management::Allow),
            RoutePolicy::Refuse(RefusalCode::RouteNotSupported)
        );
        assert!(matches!(
            a.classify(&Method::POST, "/api/chat?x=1"),
            RouteClass::Work(_)
        ));
    }

    #[test]
    fn the_shared_inspection_holds() {
        // MEM-06, ROUTE-05..07.
        check_shared_inspection(&adapter());
    }

    #[test]
    fn a_runner_option_forfeits_resident_credit() {
        // RES-04
        let a = adapter();
        for (path, body, key) in [
            (
                "/api/generate",
                r#"{"model":"llama3","prompt":"hi","options":{"num_gpu":10}}"#,
                "num_gpu",
            ),
            (
                "/api/chat",
                r#"{"model":"llama3","messages":[],"options":{"temperature":0.2,"num_thread":4}}"#,
                "num_thread",
            ),
            (
                "/api/embed",
                r#"{"model":"m","input":"x","options":{"use_mmap":false,"num_ctx":2048}}"#,
                "use_mmap",
            ),
        ] {
            let i = inspect(&a, path, body).unwrap();
            assert_eq!(
                i.reuse,
                RequestReuse::Cannot(format!("the request sets runner option {key}")),
                "{body}"
            );
        }
    }

    #[test]
    fn num_ctx_and_sampling_options_keep_resident_credit() {
        // RES-04: num_ctx is allowed; sampling options are not runner options.
        let a = adapter();
        for body in [
            r#"{"model":"llama3","prompt":"hi"}"#,
            r#"{"model":"llama3","prompt":"hi","options":null}"#,
            r#"{"model":"llama3","prompt":"hi","options":{"num_ctx":8192}}"#,
            r#"{"model":"llama3","prompt":"hi","options":{"temperature":0.1,"top_p":0.9,"top_k":40,"seed":7,"num_predict":4,"stop":["x"],"repeat_penalty":1.1}}"#,
            r#"{"model":"llama3","prompt":"","keep_alive":0}"#,
        ] {
            let i = inspect(&a, "/api/generate", body).unwrap();
            assert!(matches!(i.reuse, RequestReuse::ReusesAs(_)), "{body}");
            assert_eq!(i.model.as_deref(), Some("llama3"));
        }
        // /v1 has no options: Ollama does not read them there.
        let i = inspect(
            &a,
            "/v1/chat/completions",
            r#"{"model":"llama3","messages":[],"options":{"num_gpu":1}}"#,
        )
        .unwrap();
        assert_eq!(i.reuse, kind("llama3:latest", None, Family::V1));
    }

    #[test]
    fn options_that_are_not_an_object_are_invalid() {
        let a = adapter();
        for body in [
            r#"{"model":"m","options":"num_gpu"}"#,
            r#"{"model":"m","options":[1]}"#,
            r#"{"model":"m","options":{},"options":{}}"#,
        ] {
            assert_eq!(
                inspect(&a, "/api/chat", body).unwrap_err().code,
                RefusalCode::InvalidRequest,
                "{body}"
            );
        }
    }

    #[test]
    fn refusals_speak_ollamas_dialect() {
        let r =
            adapter().render_refusal(&Refusal::new(RefusalCode::ResourceBusy, "gpu0 is reserved"));
        assert_eq!(r.status, http::StatusCode::SERVICE_UNAVAILABLE);
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": "resource_busy: gpu0 is reserved"})
        );
    }

    fn kind(model: &str, num_ctx: Option<u64>, family: Family) -> RequestReuse {
        RequestReuse::ReusesAs(
            RequestKind {
                model: model.into(),
                num_ctx,
                family,
            }
            .to_string(),
        )
    }

    #[test]
    fn requests_carry_their_kind_and_canonical_model() {
        // RES-06: (canonical model, explicit num_ctx or none, route family).
        let a = adapter();
        let i = inspect(&a, "/api/generate", r#"{"model":"llama3","prompt":"hi"}"#).unwrap();
        assert_eq!(i.model.as_deref(), Some("llama3"));
        assert_eq!(i.canonical_model.as_deref(), Some("llama3:latest"));
        assert_eq!(i.reuse, kind("llama3:latest", None, Family::Api));
        let i = inspect(
            &a,
            "/api/chat",
            r#"{"model":"llama3:latest","messages":[],"options":{"num_ctx":8192}}"#,
        )
        .unwrap();
        assert_eq!(i.canonical_model, None, "already canonical");
        assert_eq!(i.reuse, kind("llama3:latest", Some(8192), Family::Api));
        // Ollama truncates a fractional num_ctx.
        let i = inspect(
            &a,
            "/api/embed",
            r#"{"model":"m","input":"x","options":{"num_ctx":2048.9}}"#,
        )
        .unwrap();
        assert_eq!(i.reuse, kind("m:latest", Some(2048), Family::Api));
        // /v1 never sets num_ctx, whatever its body carries.
        let i = inspect(
            &a,
            "/v1/chat/completions",
            r#"{"model":"llama3","messages":[],"options":{"num_ctx":8192,"num_gpu":1}}"#,
        )
        .unwrap();
        assert_eq!(i.reuse, kind("llama3:latest", None, Family::V1));
        // No model: no kind.
        let i = inspect(&a, "/api/generate", r#"{"prompt":"hi"}"#).unwrap();
        assert_eq!(i.reuse, RequestReuse::Reuses);
    }

    #[test]
    fn a_num_ctx_that_is_not_a_positive_number_is_invalid() {
        let a = adapter();
        for body in [
            r#"{"model":"m","options":{"num_ctx":"8k"}}"#,
            r#"{"model":"m","options":{"num_ctx":0}}"#,
            r#"{"model":"m","options":{"num_ctx":-4096}}"#,
            r#"{"model":"m","options":{"num_ctx":[1]}}"#,
        ] {
            let e = inspect(&a, "/api/generate", body).unwrap_err();
            assert_eq!(e.code, RefusalCode::InvalidRequest, "{body}");
            assert!(e.message.contains("num_ctx"), "{}", e.message);
        }
        let i = inspect(
            &a,
            "/api/generate",
            r#"{"model":"m","options":{"num_ctx":null}}"#,
        )
        .unwrap();
        assert_eq!(i.reuse, kind("m:latest", None, Family::Api));
    }
}
