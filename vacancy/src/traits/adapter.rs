//! The [`Adapter`] trait: one upstream dialect.

use std::sync::Arc;

use async_trait::async_trait;

use crate::engine::{EntryId, Lesson, ModelObservation, Refusal, RefusalCode, RequestReuse};
use crate::traits::reclaimer::Reclaimer;
use crate::traits::routes::{RouteClass, RouteTable, WorkRoute};
use crate::traits::tracker::Tracker;

/// What an adapter learned from a work request's head and body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inspection {
    /// The model the request names (MEM-06), exactly as written.
    pub model: Option<String>,
    /// The model as the upstream reports it when that differs from `model`
    /// (Ollama's canonical name: `llama3` is `llama3:latest`); observations,
    /// residency and learned priors match it. `None`: the same as `model`.
    pub canonical_model: Option<String>,
    /// Whether the request would reuse a loaded model (the request's half of RES evidence).
    pub reuse: RequestReuse,
    /// A replacement body to forward instead of the original (e.g. ComfyUI's
    /// `prompt_id`, COMFY-04); `None` forwards the original bytes.
    pub rewritten_body: Option<Vec<u8>>,
    /// The upstream's handle for this work, recorded with the reservation
    /// (e.g. the ComfyUI prompt ID, COMFY-03).
    pub upstream_ref: Option<String>,
}

/// A work request refused at inspection, before anything is reserved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct InspectError {
    /// `invalid_request`, `invalid_submission` or `unsupported_request`.
    pub code: RefusalCode,
    /// What is wrong and what to send instead.
    pub message: String,
}

/// What [`Adapter::inspect`] answers: the request's [`Inspection`], or the
/// [`InspectError`] that refuses it.
pub type InspectResult = Result<Inspection, InspectError>;

impl InspectError {
    /// A malformed body (400 `invalid_request`).
    pub fn invalid(message: impl Into<String>) -> Self {
        InspectError {
            code: RefusalCode::InvalidRequest,
            message: message.into(),
        }
    }

    /// The refusal to render for it.
    pub fn to_refusal(&self) -> Refusal {
        Refusal::new(self.code, self.message.clone())
    }
}

/// What inspection is told about the request it inspects.
#[derive(Debug, Clone, Copy)]
pub struct InspectContext<'a> {
    /// The ID the reservation will carry (ComfyUI uses it as the prompt ID).
    pub entry: EntryId,
    /// The request method.
    pub method: &'a http::Method,
    /// The request path, query included.
    pub path: &'a str,
    /// The request headers.
    pub headers: &'a http::HeaderMap,
}

/// An observation that could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ObserveError {
    /// This adapter does not observe its upstream.
    #[error("this adapter does not observe its upstream")]
    Unsupported,
    /// The upstream could not be reached.
    #[error("upstream unreachable: {0}")]
    Unreachable(String),
    /// The upstream answered something unusable (OBS-03: never success).
    #[error("malformed observation: {0}")]
    Malformed(String),
    /// The upstream wants a credential that is missing or refused (OBS-02).
    #[error("observation needs a credential: {0}; configure [upstream.credential]")]
    Unauthorized(String),
}

/// A refusal rendered in an upstream's dialect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedRefusal {
    /// The HTTP status (the code's one status).
    pub status: http::StatusCode,
    /// Headers to send: `Content-Type`, and `Retry-After` where the code has one.
    pub headers: http::HeaderMap,
    /// The body.
    pub body: Vec<u8>,
}

/// `refusal` with a JSON `body` of an adapter's own error shape: the code's one
/// status, `Content-Type: application/json`, and `Retry-After` where the code
/// has one. Build a dialect's renderer on it; the body must carry the code's
/// name (`resource_busy`) so borrowers and the kit can tell refusals apart.
///
/// `body` is any serializable value: a `serde_json::Value` (`json!`), or, on
/// a path taken for every refusal, a struct of borrowed fields, written
/// straight into the body's bytes (issue 31: building a `Value` and writing
/// it through `Display` was a quarter of a refusal's instructions).
pub fn rendered(refusal: &Refusal, body: impl serde::Serialize) -> RenderedRefusal {
    let status = http::StatusCode::from_u16(refusal.code.http_status())
        .unwrap_or(http::StatusCode::SERVICE_UNAVAILABLE);
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if let Some(after) = refusal.retry_after() {
        headers.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from(after.as_secs()),
        );
    }
    let mut bytes = Vec::with_capacity(RENDERED_CAPACITY + refusal.reason.len());
    if serde_json::to_writer(&mut bytes, &body).is_err() {
        // Only a map with keys that are not strings fails; the code still
        // tells the refusal apart.
        bytes.clear();
        bytes.extend_from_slice(br#"{"error":{"code":""#);
        bytes.extend_from_slice(refusal.code.as_str().as_bytes());
        bytes.extend_from_slice(br#""}}"#);
    }
    RenderedRefusal {
        status,
        headers,
        body: bytes,
    }
}

/// Room for a rendered body's JSON beside its reason: one allocation for
/// every dialect here.
const RENDERED_CAPACITY: usize = 160;

/// OpenAI's error object, its fields in the order `json!` wrote them.
#[derive(serde::Serialize)]
struct OpenAiError<'a> {
    error: OpenAiErrorFields<'a>,
}

#[derive(serde::Serialize)]
struct OpenAiErrorFields<'a> {
    code: &'a str,
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
}

/// OpenAI-style: `{"error":{"code":"resource_busy","type":"resource_busy","message":"..."}}`.
pub fn render_openai(refusal: &Refusal) -> RenderedRefusal {
    let code = refusal.code.as_str();
    rendered(
        refusal,
        OpenAiError {
            error: OpenAiErrorFields {
                code,
                message: &refusal.reason,
                kind: code,
            },
        },
    )
}

/// Ollama-style: `{"error":"resource_busy: ..."}`.
pub fn render_ollama(refusal: &Refusal) -> RenderedRefusal {
    #[derive(serde::Serialize)]
    struct OllamaError {
        error: String,
    }
    rendered(
        refusal,
        OllamaError {
            error: refusal.to_string(),
        },
    )
}

/// An adapter's second look at a request the route policy refuses
/// ([`Adapter::reconsider_refusal`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconsidered {
    /// The route policy's refusal stands.
    Stands,
    /// Forward it after all, without a reservation: e.g. a borrower's own
    /// output file the upstream listed since the adapter last looked.
    Forward,
    /// Refuse it with this more precise refusal instead, e.g. one naming the
    /// ID the borrower should ask for.
    Refuse(Refusal),
}

/// One upstream dialect: its routes, inspection, completion, observation,
/// refusal rendering and reclaimer. The daemon holds adapters as `Arc<dyn Adapter>`.
///
/// # Behavior
///
/// - The route table is data, checked for overlaps when built; `classify`
///   defaults to it, and unknown routes follow [`route_policy`](crate::traits::routes::route_policy).
/// - `inspect` reads a bounded body and never reserves anything; a body it
///   cannot read is an [`InspectError`] (400), never a guess.
/// - Completion is the [`WorkRoute::completion`] of the matched route.
/// - `observe` never forwards borrower credentials (OBS-01) and never reports a
///   malformed answer as an observation (OBS-03).
/// - Refusals render in the upstream's own error dialect, always with the code.
#[async_trait]
pub trait Adapter: Send + Sync {
    /// The adapter's name (`ollama`, `llamacpp`, ...).
    fn name(&self) -> &str;

    /// The route table.
    fn routes(&self) -> &RouteTable;

    /// Classify a request by method and path.
    fn classify(&self, method: &http::Method, path: &str) -> RouteClass {
        self.routes().classify(method, path)
    }

    /// A second look at a request the route policy refuses (a management,
    /// owner-data or unlisted route, 403 or 501): an adapter whose answer
    /// depends on what its upstream says now, or on what it remembers about
    /// borrowed work, decides here. The default lets the refusal stand.
    async fn reconsider_refusal(&self, method: &http::Method, path: &str) -> Reconsidered {
        let _ = (method, path);
        Reconsidered::Stands
    }

    /// Inspect a work request's head and body.
    fn inspect(&self, route: &WorkRoute, ctx: InspectContext<'_>, body: &[u8]) -> InspectResult;

    /// Observe the upstream: loaded models, residency evidence, foreign work.
    async fn observe(&self) -> Result<ModelObservation, ObserveError> {
        Err(ObserveError::Unsupported)
    }

    /// Learn from `observation`, the first one taken after a request of a known
    /// kind finished with nothing admitted since (RES-07), and update its
    /// residency evidence with what was learned. The default learns nothing.
    async fn learn(&self, lesson: &Lesson, observation: &mut ModelObservation) {
        let _ = (lesson, observation);
    }

    /// After vacancyd cut the upstream response (a borrower left under
    /// `on_borrower_disconnect = "cut"`, or a reclaim), prove that the
    /// upstream stopped the work, e.g. llama.cpp's `/slots` showing no slot
    /// processing. `Ok(true)` releases the reservation. `Ok(false)` and other
    /// errors are no proof yet: vacancyd asks again until the upstream's
    /// `stop_proof_timeout_s` ends (the entry shows `verifying`), then holds
    /// it (DONE-04). The default, [`ObserveError::Unsupported`], says the
    /// adapter can never prove a stop: the entry is held at once.
    async fn verify_stopped(&self) -> Result<bool, ObserveError> {
        Err(ObserveError::Unsupported)
    }

    /// Render a refusal in the upstream's dialect. Defaults to OpenAI's.
    fn render_refusal(&self, refusal: &Refusal) -> RenderedRefusal {
        render_openai(refusal)
    }

    /// How this adapter gets capacity back, if it can.
    fn reclaimer(&self) -> Option<Arc<dyn Reclaimer>> {
        None
    }

    /// How this adapter proves the end of work on its
    /// [`CompletionMethod::Tracked`](crate::engine::CompletionMethod::Tracked)
    /// routes. An adapter with tracked routes must have one; without it the
    /// proxy holds such work after its reply (nothing proves its end).
    fn tracker(&self) -> Option<Arc<dyn Tracker>> {
        None
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::traits::routes::{RouteMethod, RouteSpec};

    #[test]
    fn openai_dialect_carries_code_type_message_and_retry_after() {
        // ADM-02; docs/operator-guide.md#refusals
        let r = render_openai(&Refusal::new(RefusalCode::ResourceBusy, "gpu0 is reserved"));
        assert_eq!(r.status, http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers.get(http::header::RETRY_AFTER).unwrap(), "2");
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["error"]["code"], "resource_busy");
        assert_eq!(body["error"]["type"], "resource_busy");
        assert_eq!(body["error"]["message"], "gpu0 is reserved");
    }

    #[test]
    fn ollama_dialect_prefixes_the_code() {
        let r = render_ollama(&Refusal::new(
            RefusalCode::RouteForbidden,
            "/api/pull manages the upstream",
        ));
        assert_eq!(r.status, http::StatusCode::FORBIDDEN);
        assert!(r.headers.get(http::header::RETRY_AFTER).is_none());
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            body["error"],
            "route_forbidden: /api/pull manages the upstream"
        );
    }

    /// Reasons with what JSON must escape: quotes, backslashes, control
    /// characters, and text beyond ASCII.
    const AWKWARD_REASONS: [&str; 5] = [
        "gpu0 is reserved",
        "",
        "a \"quoted\" model\\path",
        "line\nbreak\ttab\u{1}bell\u{7f}",
        "модель ✓ 模型 🚀",
    ];

    #[test]
    fn the_typed_bodies_write_the_bytes_json_wrote() {
        // ADM-02: the dialects' bodies, written straight from their fields
        // (issue 31), are byte for byte what `json!` and `to_string` wrote.
        for reason in AWKWARD_REASONS {
            for code in [RefusalCode::ResourceBusy, RefusalCode::RouteForbidden] {
                let refusal = Refusal::new(code, reason);
                let c = code.as_str();
                assert_eq!(
                    render_openai(&refusal).body,
                    serde_json::json!({"error": {"code": c, "type": c, "message": reason}})
                        .to_string()
                        .into_bytes(),
                    "{reason:?}"
                );
                assert_eq!(
                    render_ollama(&refusal).body,
                    serde_json::json!({"error": refusal.to_string()})
                        .to_string()
                        .into_bytes(),
                    "{reason:?}"
                );
            }
        }
    }

    #[test]
    fn a_value_body_still_renders() {
        // Adapters outside this crate hand `rendered` a `json!` value.
        let refusal = Refusal::new(RefusalCode::ResourceBusy, "busy");
        let r = rendered(
            &refusal,
            serde_json::json!({"error": "x", "code": "resource_busy"}),
        );
        assert_eq!(r.body, br#"{"code":"resource_busy","error":"x"}"#);
        assert_eq!(r.headers.get(http::header::RETRY_AFTER).unwrap(), "2");
    }

    struct Echo(RouteTable);

    impl Adapter for Echo {
        fn name(&self) -> &str {
            "echo"
        }
        fn routes(&self) -> &RouteTable {
            &self.0
        }
        fn inspect(
            &self,
            _route: &WorkRoute,
            _ctx: InspectContext<'_>,
            body: &[u8],
        ) -> InspectResult {
            let v: serde_json::Value = serde_json::from_slice(body)
                .map_err(|e| InspectError::invalid(format!("body is not JSON: {e}")))?;
            Ok(Inspection {
                model: v.get("model").and_then(|m| m.as_str()).map(str::to_owned),
                ..Inspection::default()
            })
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_adapter_is_plain_methods_behind_arc_dyn() {
        let table = RouteTable::new(vec![RouteSpec::new(
            RouteMethod::Post,
            "/run",
            RouteClass::Work(WorkRoute::response_end()),
        )])
        .unwrap();
        let a: Arc<dyn Adapter> = Arc::new(Echo(table));
        let RouteClass::Work(route) = a.classify(&http::Method::POST, "/run") else {
            panic!("not work");
        };
        let headers = http::HeaderMap::new();
        let ctx = InspectContext {
            entry: EntryId::from_u128(1),
            method: &http::Method::POST,
            path: "/run",
            headers: &headers,
        };
        assert_eq!(
            a.inspect(&route, ctx, br#"{"model":"m"}"#)
                .unwrap()
                .model
                .as_deref(),
            Some("m")
        );
        assert_eq!(
            a.inspect(&route, ctx, b"{").unwrap_err().code,
            RefusalCode::InvalidRequest
        );
        assert_eq!(a.observe().await, Err(ObserveError::Unsupported));
        // No proof of a stop by default: held at once after a cut (DONE-04).
        assert_eq!(a.verify_stopped().await, Err(ObserveError::Unsupported));
        assert_eq!(
            a.reconsider_refusal(&http::Method::GET, "/other").await,
            Reconsidered::Stands
        );
        assert!(a.reclaimer().is_none());
        assert_eq!(
            a.render_refusal(&Refusal::new(RefusalCode::Pressure, "x"))
                .status,
            503
        );
    }
}
