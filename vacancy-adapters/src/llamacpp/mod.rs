//! llama.cpp's `llama-server`: its native routes and its OpenAI-compatible
//! ones, observed through `/props`, `/v1/models` and `/slots`.
//!
//! Observation follows what the real server answers (fixtures recorded from
//! llama.cpp's server via PyPI `xllamacpp==2026.10.11549`, in
//! `tests/fixtures/llamacpp/`):
//!
//! - `/slots` lists each slot with `is_processing`; it can be disabled
//!   (`--no-slots`: 501) or need the API key (401). Its absence is "no
//!   evidence", never "idle".
//! - A server started with `--sleep-idle-seconds` unloads its model when idle
//!   and reports `"is_sleeping": true` in `GET /props`, while `/v1/models`
//!   still lists the model. `GET /props` does not wake it, but `GET /slots`
//!   does (it reloads the model): observation therefore reads `/props` first
//!   and leaves a sleeping server asleep.
//! - Reading `/slots` of an awake server also restarts its idle timer: polled
//!   every second, a server with `--sleep-idle-seconds 2` never fell asleep.
//!   Whoever schedules observations should observe on demand (admission, the
//!   RES-20 refusal path, status), not on a timer shorter than the owner's
//!   sleep setting.

mod observe;

use async_trait::async_trait;
use vacancy::engine::ModelObservation;
use vacancy::traits::routes::RouteOverlap;
use vacancy::traits::{
    Adapter, InspectContext, InspectResult, ObserveError, RouteClass, RouteSpec, RouteTable,
    WorkRoute,
};

use crate::common::routes::{OPENAI_V1, WORK};
use crate::common::{AdapterCore, AdapterSettings, inspect_json_body};

/// llama-server's route table, as data.
///
/// # Behavior
///
/// - Work (admitted, released at the clean end of the response, DONE-01):
///   `POST` `/completion`, `/completions`, `/v1/completions`,
///   `/chat/completions`, `/v1/chat/completions`, `/v1/responses`,
///   `/embedding`, `/embeddings`, `/v1/embeddings`, `/rerank`, `/reranking`,
///   `/v1/rerank`, `/infill`.
/// - `POST /tokenize` and `POST /detokenize` are forwarded without admission
///   as [`RouteClass::BorrowerRead`]: llama-server answers them in its HTTP
///   thread from the vocabulary alone, with no slot, no task and no model
///   compute, so they use nothing a reservation protects (and do not wake a
///   sleeping server's model).
/// - Discovery, forwarded without admission and while lending is refused
///   (ROUTE-12): `GET` (and `HEAD`) `/health`, `/v1/models`, `/models`, `/props`.
/// - Management and owner data, 403 unless `management = "allow"` (ROUTE-08):
///   `GET /slots` (slot state, the owner's work), `POST /slots` and
///   `POST /slots/{id}` (save, restore, erase a slot's cache), `POST /props`
///   (changes server settings), `GET /metrics`.
/// - Anything else is unknown: a GET/HEAD is 403, any other method 501
///   (ROUTE-01..03, via `route_policy`).
pub const ROUTES: &[RouteSpec] = crate::join_routes![OWN_ROUTES, OPENAI_V1];

/// The routes of its own, beside [`OPENAI_V1`].
const OWN_ROUTES: &[RouteSpec] = crate::routes![
    Post WORK => [
        "/completion", "/completions", "/chat/completions", "/embedding", "/embeddings",
        "/rerank", "/reranking", "/v1/rerank", "/infill",
    ];
    Post RouteClass::BorrowerRead => ["/tokenize", "/detokenize"];
    Get RouteClass::Discovery => ["/health", "/models", "/props"];
    Get RouteClass::Management => ["/slots", "/metrics"];
    Post RouteClass::Management => ["/slots", "/slots/{id}", "/props"];
];

/// [`ROUTES`] as a checked [`RouteTable`].
///
/// Refused if two entries could match the same request (docs/adapter-guide.md#route-classes); the
/// table's tests build it, so an overlap never ships.
pub fn route_table() -> Result<RouteTable, RouteOverlap> {
    RouteTable::new(ROUTES.to_vec())
}

/// The adapter for llama.cpp's `llama-server` (name `llamacpp`).
///
/// # Behavior
///
/// - Routes: [`ROUTES`] (ROUTE-01..03, ROUTE-08, ROUTE-12).
/// - Inspection: [`inspect_json_body`] on every work route: a JSON object,
///   `model` a string kept exactly (MEM-06), and the Responses background
///   rule (ROUTE-05..07). llama-server serves its one model whatever name a
///   request gives; a name other than the observed one simply gets no
///   resident credit.
/// - Completion: the clean end of the response (DONE-01).
/// - Observation ([`Adapter::observe`]), with `[upstream.credential]` only
///   (OBS-01/02), stamped before the first request:
///   1. `GET /props`: `"is_sleeping": true` means the model is unloaded, so
///      the observation lists no model and nothing else is read (reading
///      `/slots` would reload it). 404/501 (no `/props`) is read as awake.
///   2. `GET /v1/models`: each `data[].id` (and alias) is an [`ObservedModel`](vacancy::engine::ObservedModel),
///      ready unless router mode says it is still loading; router-mode
///      models that are not loaded are left out.
///   3. `GET /slots`: every slot idle is [`ResidencyEvidence::Proven`](vacancy::engine::ResidencyEvidence::Proven)
///      (RES-16); N slots processing are `visible_work` of N jobs, "N of M
///      slots processing" (ADM-09: the engine counts the jobs beyond its own,
///      and only when the observation is fresh and taken after vacancy's last
///      job there) and `NotProven`;
///      `/slots` answering an error status (disabled: 501, missing: 404,
///      401/403 without a usable credential) is `NotProven("the /slots
///      endpoint is unavailable: ...")` with no foreign work: absence is no
///      evidence, never idle.
///   4. A failed or malformed `/props` or `/v1/models`, or a `/slots` answer
///      that is not a slot list, is an error, never an observation (OBS-03).
/// - [`Adapter::verify_stopped`]: a fresh read shows no slot processing
///   (or the server asleep, which it only is with no task): `Ok(true)`;
///   a slot processing: `Ok(false)`; no usable answer: the error. The caller
///   keeps the hold unless it is `Ok(true)` (DONE-04).
/// - Refusals render OpenAI-style (the default).
#[derive(Debug)]
pub struct LlamaCppAdapter {
    core: AdapterCore,
}

impl LlamaCppAdapter {
    /// The adapter's name in configuration (`adapter = "llamacpp"`).
    ///
    /// What [`Adapter::name`] answers.
    pub const NAME: &'static str = "llamacpp";

    /// An adapter for the upstream at `settings.target`.
    ///
    /// Builds and checks [`ROUTES`] (docs/adapter-guide.md#route-classes); connects nothing.
    pub fn new(settings: AdapterSettings) -> Result<Self, RouteOverlap> {
        Ok(LlamaCppAdapter {
            core: AdapterCore::new(settings, ROUTES)?,
        })
    }

    /// The settings it was built with.
    ///
    /// As given to [`LlamaCppAdapter::new`].
    pub fn settings(&self) -> &AdapterSettings {
        self.core.settings()
    }
}

#[async_trait]
impl Adapter for LlamaCppAdapter {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn routes(&self) -> &RouteTable {
        self.core.routes()
    }

    fn inspect(&self, route: &WorkRoute, ctx: InspectContext<'_>, body: &[u8]) -> InspectResult {
        inspect_json_body(route, ctx.path, body)
    }

    async fn observe(&self) -> Result<ModelObservation, ObserveError> {
        self.observe_now().await
    }

    async fn verify_stopped(&self) -> Result<bool, ObserveError> {
        self.slots_idle().await
    }
}

#[cfg(test)]
mod tests;
