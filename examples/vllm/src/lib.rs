//! vLLM's OpenAI-compatible server (`vllm serve`) as a vacancy adapter kind,
//! built only from the public parts of `vacancy` and `vacancy-adapters`.
//!
//! - Work, released when the response ends: OpenAI's `/v1` chat, completions,
//!   embeddings, responses (background mode refused) and audio transcription
//!   routes, and vLLM's own `/pooling`, `/classify`, `/score`, `/rerank`.
//! - Discovery: `/v1/models`, `/health`, `/ping`, `/version`.
//! - Management (403 unless `management = "allow"`): `/metrics`, LoRA
//!   load/unload, `/sleep`, `/wake_up`, `/is_sleeping`, `/reset_prefix_cache`.
//! - Observation: `/v1/models` lists what is loaded. vLLM holds its weights
//!   and KV cache from start to stop, so a listed model is proven resident
//!   while `/metrics` shows no request running or waiting and the server is
//!   not asleep; the running and waiting requests are its visible work.
//! - Reclaim: closing a proxied response aborts the request in vLLM. There is
//!   no unload: `/sleep` frees the GPU, but a sleeping vLLM does not wake for
//!   the next request, so lending it again would fail every borrower.
//!
//! Settings (`[upstream.adapter_settings]`): `metrics = false` when the
//! server's `/metrics` is not reachable by vacancy (then nothing is proven).

use std::sync::Arc;

use async_trait::async_trait;
use vacancy::config::{SettingProblem, UpstreamConfig};
use vacancy::engine::{ModelObservation, ObservedModel, ResidencyEvidence, VisibleWork};
use vacancy::registry::{AdapterContext, AdapterFactory, BuildError};
use vacancy::traits::{
    Adapter, CancelItem, CancelOutcome, ForeignWork, InspectContext, InspectResult, ObserveError,
    ReclaimError, Reclaimer, RouteClass, RouteSpec, RouteTable, UnloadAck, WorkRoute,
};
use vacancy_adapters::common::routes::{OPENAI_AUDIO_INPUT, OPENAI_V1, WORK};
use vacancy_adapters::common::{AdapterCore, AdapterSettings, inspect_request};

/// The kind's name in configuration: `adapter = "vllm"`.
pub const NAME: &str = "vllm";

/// vLLM's routes beyond the OpenAI `/v1` slice it shares.
const VLLM_ROUTES: &[RouteSpec] = vacancy_adapters::routes![
    Post WORK => ["/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"];
    Post RouteClass::BorrowerRead => ["/tokenize", "/detokenize"];
    Get RouteClass::Discovery => ["/health", "/ping", "/version"];
    Get RouteClass::Management => ["/metrics", "/is_sleeping"];
    Post RouteClass::Management => [
        "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/sleep", "/wake_up",
        "/reset_prefix_cache",
    ];
];

/// The routes: the OpenAI slice vLLM serves (the shared `/v1` block and
/// audio input; no images, no speech), then its own.
pub const ROUTES: &[RouteSpec] =
    vacancy_adapters::join_routes![OPENAI_V1, OPENAI_AUDIO_INPUT, VLLM_ROUTES];

/// [`ROUTES`] as a checked [`RouteTable`].
pub fn route_table() -> Result<RouteTable, vacancy::traits::routes::RouteOverlap> {
    RouteTable::new(ROUTES.to_vec())
}

/// Builds `vllm` adapters; checks `[upstream.adapter_settings]`.
pub struct VllmFactory;

impl AdapterFactory for VllmFactory {
    fn check(&self, upstream: &UpstreamConfig) -> Vec<SettingProblem> {
        upstream
            .adapter_settings
            .iter()
            .filter_map(|(key, value)| match (key.as_str(), value) {
                ("metrics", toml::Value::Boolean(_)) => None,
                ("metrics", _) => Some(SettingProblem::new(key.clone(), "must be true or false")),
                _ => Some(SettingProblem::new(
                    key.clone(),
                    "unknown setting; adapter \"vllm\" takes: metrics",
                )),
            })
            .collect()
    }

    fn build(&self, ctx: &AdapterContext<'_>) -> Result<Arc<dyn Adapter>, BuildError> {
        let metrics = ctx
            .upstream
            .adapter_settings
            .get("metrics")
            .and_then(toml::Value::as_bool)
            .unwrap_or(true);
        let settings = AdapterSettings::from_context(ctx);
        let core = AdapterCore::new(settings, ROUTES).map_err(BuildError::new)?;
        let server = Arc::new(Server { core, metrics });
        Ok(Arc::new(VllmAdapter { server }))
    }
}

/// The adapter for one vLLM server.
pub struct VllmAdapter {
    server: Arc<Server>,
}

/// What vacancy reads from the server, shared with the reclaimer.
struct Server {
    /// Settings, routes and the observation client, as the built-in adapters hold them.
    core: AdapterCore,
    metrics: bool,
}

impl Server {
    /// Requests running plus waiting, from `vllm:num_requests_*` in `/metrics`;
    /// `Err(reason)` when that cannot be read.
    async fn requests(&self) -> Result<u32, String> {
        if !self.metrics {
            return Err("metrics = false: vacancy does not read /metrics".to_owned());
        }
        let text = self
            .core
            .observer()
            .fetch_text("/metrics")
            .await
            .map_err(|e| e.to_string())?;
        let (mut seen, mut total) = (false, 0.0_f64);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            if name == "vllm:num_requests_running" || name == "vllm:num_requests_waiting" {
                let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
                total += value.ok_or_else(|| format!("/metrics: unreadable line {line:?}"))?;
                seen = true;
            }
        }
        if !seen {
            return Err("/metrics has no vllm:num_requests_running gauge".to_owned());
        }
        // Gauges of whole requests; anything else is not vLLM's.
        if total < 0.0 || total.fract() != 0.0 || total > f64::from(u32::MAX) {
            return Err(format!("/metrics: {total} requests is not a count"));
        }
        Ok(total as u32)
    }

    /// Whether the server sleeps; `/is_sleeping` is absent unless the sleep
    /// endpoints are, so a server without it cannot have been put to sleep.
    async fn sleeping(&self) -> Result<bool, ObserveError> {
        match self.core.observer().fetch_json("/is_sleeping").await {
            Ok(v) => v["is_sleeping"].as_bool().ok_or_else(|| {
                ObserveError::Malformed("GET /is_sleeping: no boolean is_sleeping".to_owned())
            }),
            // 404 or 501: vLLM serves the endpoint only when started to (dev mode).
            Err(e) if e.is_absent() => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

#[async_trait]
impl Adapter for VllmAdapter {
    fn name(&self) -> &str {
        NAME
    }

    fn routes(&self) -> &RouteTable {
        self.server.core.routes()
    }

    fn inspect(&self, route: &WorkRoute, ctx: InspectContext<'_>, body: &[u8]) -> InspectResult {
        inspect_request(route, ctx, body)
    }

    async fn observe(&self) -> Result<ModelObservation, ObserveError> {
        let taken_at = self.server.core.settings().clock.now();
        let models = self.server.core.observer().get_json("/v1/models").await?;
        let names: Vec<String> = models["data"]
            .as_array()
            .ok_or_else(|| ObserveError::Malformed("GET /v1/models: no data list".to_owned()))?
            .iter()
            .map(|m| m["id"].as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                ObserveError::Malformed("GET /v1/models: a model without id".to_owned())
            })?;
        let sleeping = self.server.sleeping().await?;
        let requests = self.server.requests().await;
        let evidence = match (&requests, sleeping) {
            (_, true) => ResidencyEvidence::NotProven("the server sleeps".to_owned()),
            (Ok(0), false) => ResidencyEvidence::Proven,
            (Ok(n), false) => {
                ResidencyEvidence::NotProven(format!("{n} requests running or waiting"))
            }
            (Err(why), false) => {
                ResidencyEvidence::NotProven(format!("{why}; idleness is not proven"))
            }
        };
        Ok(ModelObservation {
            taken_at,
            models: names
                .into_iter()
                .map(|name| ObservedModel::new(name, evidence.clone()))
                .collect(),
            visible_work: match requests {
                Ok(n) if n > 0 => Some(VisibleWork::new(
                    n,
                    format!("{n} requests running or waiting"),
                )),
                _ => None,
            },
            allocator_free_mib: None,
        })
    }

    async fn verify_stopped(&self) -> Result<bool, ObserveError> {
        Ok(self.server.requests().await == Ok(0))
    }

    fn reclaimer(&self) -> Option<Arc<dyn Reclaimer>> {
        Some(Arc::clone(&self.server) as Arc<dyn Reclaimer>)
    }
}

#[async_trait]
impl Reclaimer for Server {
    async fn cancel(
        &self,
        items: &[CancelItem],
        _deadline: std::time::Instant,
    ) -> Vec<CancelOutcome> {
        // vLLM aborts a request whose client disconnects.
        items
            .iter()
            .map(|i| match i.claim.try_claim() {
                true => CancelOutcome::ByClosingResponse(i.entry),
                false => CancelOutcome::ClaimedElsewhere(i.entry),
            })
            .collect()
    }

    async fn unload(&self) -> Result<UnloadAck, ReclaimError> {
        Err(ReclaimError::Unsupported(
            "vLLM's /sleep frees the GPU but a sleeping server does not wake for the next request; stop the server or POST /wake_up yourself".to_owned(),
        ))
    }

    async fn foreign_work(&self, _own: &[String]) -> Result<ForeignWork, ReclaimError> {
        Ok(match self.requests().await {
            Ok(0) => ForeignWork::None,
            Ok(n) => {
                ForeignWork::CannotTell(format!("{n} requests running; vLLM does not say whose"))
            }
            Err(why) => ForeignWork::CannotTell(why),
        })
    }
}
