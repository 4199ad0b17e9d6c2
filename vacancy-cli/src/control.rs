//! The control listener: `/health`, `/status`, `/metrics` (DESIGN §4).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, warn};
use vacancy::engine::{OwnerVetoStatus, ResourceStatus, Vacancy, WorkStatus};
use vacancy::proxy::Lender;
use vacancy::proxy::shells::HealthCell;

/// Static facts about one upstream plus its live health.
pub struct UpstreamInfo {
    /// Adapter name.
    pub adapter: String,
    /// Where borrowers connect.
    pub listen: String,
    /// The real server.
    pub target: String,
    /// Live health from the observation loop.
    pub health: Arc<HealthCell>,
}

/// What the control listener serves from.
pub struct ControlState {
    /// The admission shell.
    pub lender: Arc<Lender>,
    /// The upstreams, in configuration order.
    pub upstreams: Vec<UpstreamInfo>,
    /// The presence backend's name.
    pub presence_backend: String,
    /// True once every listener is bound.
    pub ready: AtomicBool,
}

/// `/status` (DESIGN §4).
#[derive(Debug, Serialize)]
pub struct StatusDoc {
    /// The lending switch.
    pub lending: bool,
    /// present | away | unknown.
    pub owner: &'static str,
    /// Which presence backend answers.
    pub presence_backend: String,
    /// The owner veto.
    pub owner_veto: OwnerVetoStatus,
    /// Resources.
    pub resources: Vec<ResourceStatus>,
    /// Upstreams.
    pub upstreams: Vec<UpstreamDoc>,
    /// Work entries.
    pub work: Vec<WorkStatus>,
}

/// One upstream in `/status`.
#[derive(Debug, Serialize)]
pub struct UpstreamDoc {
    /// Name.
    pub name: String,
    /// Adapter.
    pub adapter: String,
    /// host | resource.
    pub owner_scope: &'static str,
    /// Where borrowers connect.
    pub listen: String,
    /// The real server.
    pub target: String,
    /// Resources, primary first.
    pub resources: Vec<String>,
    /// Whether the real server answered the last check.
    pub reachable: Option<bool>,
    /// Why the last check failed.
    pub error: Option<String>,
    /// Whether the default budget would be admitted now.
    pub vacancy: Vacancy,
    /// Residency evidence of the last observation (RES-22).
    pub residency: Vec<String>,
    /// Loaded models of the last observation.
    pub models: Vec<String>,
}

impl ControlState {
    /// The `/status` document now.
    pub fn status(&self) -> StatusDoc {
        let s = self.lender.status();
        let upstreams = s
            .upstreams
            .into_iter()
            .zip(&self.upstreams)
            .map(|(u, info)| {
                let h = info.health.get();
                UpstreamDoc {
                    name: u.name,
                    adapter: info.adapter.clone(),
                    owner_scope: u.owner_scope,
                    listen: info.listen.clone(),
                    target: info.target.clone(),
                    resources: u.resources,
                    reachable: h.reachable,
                    error: h.error,
                    vacancy: u.vacancy,
                    residency: h.residency,
                    models: h.models,
                }
            })
            .collect();
        StatusDoc {
            lending: s.lending,
            owner: s.owner.as_str(),
            presence_backend: self.presence_backend.clone(),
            owner_veto: s.owner_veto,
            resources: s.resources,
            upstreams,
            work: s.work,
        }
    }

    fn metrics(&self) -> String {
        let s = self.lender.status();
        self.lender.metrics().render(&s)
    }
}

fn respond(status: u16, content_type: &str, body: impl Into<Bytes>) -> http::Response<Full<Bytes>> {
    let mut resp = http::Response::new(Full::new(body.into()));
    *resp.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    resp
}

fn route(state: &ControlState, req: &http::Request<Incoming>) -> http::Response<Full<Bytes>> {
    let json = "application/json";
    match (req.method(), req.uri().path()) {
        (&http::Method::GET, "/health") => {
            if state.ready.load(Ordering::Acquire) {
                respond(200, json, r#"{"status":"ready"}"#)
            } else {
                respond(503, json, r#"{"status":"starting"}"#)
            }
        }
        (&http::Method::GET, "/status") => match serde_json::to_vec(&state.status()) {
            Ok(body) => respond(200, json, body),
            Err(e) => respond(500, json, format!(r#"{{"error":"cannot render status: {e}"}}"#)),
        },
        (&http::Method::GET, "/metrics") => {
            respond(200, "text/plain; version=0.0.4", state.metrics())
        }
        (_, path) => respond(
            404,
            json,
            serde_json::json!({"error": format!("no control route {path}; try /status, /metrics or /health")}).to_string(),
        ),
    }
}

/// Serve the control plane until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    state: Arc<ControlState>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    warn!("control accept failed");
                    continue;
                };
                let state = Arc::clone(&state);
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let resp = route(&state, &req);
                        async move { Ok::<_, Infallible>(resp) }
                    });
                    if let Err(e) = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await {
                        debug!(error = %e, "control connection ended with an error");
                    }
                });
            }
            () = vacancy::proxy::stopped(&mut shutdown) => return,
        }
    }
}
