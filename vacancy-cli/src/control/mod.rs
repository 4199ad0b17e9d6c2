//! The control listener (docs/security.md#the-listeners): `/health`, `/health/upstreams/<name>`
//! (for load balancers), `/status`, `/metrics`, `/history`, the owner console
//! at `/` with its live `/events` stream, and the `/admin` calls.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, SizeHint};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use vacancy::auth::AuthError;
use vacancy::config::Scope;
use vacancy::config::TokenConfig;
use vacancy::engine::{EngineError, EntryId, HeldRelease, RefusalCode, Vacancy};
use vacancy::shell::proxy::conn::{AcceptBackoff, BorrowerBody, serve_connection};
use vacancy::shell::proxy::host::check_host;
use vacancy::shell::{HeldReleaseError, Listening};

use crate::settings::SaveError;

pub(crate) mod conns;
pub(crate) mod failures;
pub(crate) mod state;

use conns::{BusyGuard, ControlConns, Pool, Shed, Sizes};
use failures::Failure;

pub use state::{ControlState, UpstreamInfo};

type Reply = http::Response<UnsyncBoxBody<Bytes, Infallible>>;

/// `GET /usage?since=30d&by=day|borrower|resource`: the owner's record of
/// borrowers' use (issue 34), as `vacancyd usage --json` prints it; 404
/// with named borrowers off.
async fn usage_report(state: &ControlState, query: &str) -> Reply {
    let Some(path) = state.usage_db.clone() else {
        return error(
            404,
            "not_found",
            "named borrowers are off: there is no usage record ([borrowers] in the configuration turns them on)",
        );
    };
    let mut since = "30d".to_owned();
    let mut by = "day".to_owned();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("since", v)) => since = v.to_owned(),
            Some(("by", v)) => by = v.to_owned(),
            _ => {}
        }
    }
    let since: crate::usage::Since = match since.parse() {
        Ok(s) => s,
        Err(e) => return error(400, "invalid_request", format!("since: {e}")),
    };
    let by: crate::usage::By = match by.parse() {
        Ok(b) => b,
        Err(e) => return error(400, "invalid_request", format!("by: {e}")),
    };
    let start = since.start_unix_ms(vacancy::time::unix_ms_now());
    let report = tokio::task::spawn_blocking(move || {
        if !path.exists() {
            return Ok(serde_json::json!({"since_unix_ms": start, "by": by.as_str(), "rows": []}));
        }
        let db = crate::usage::UsageDb::open_read_only(&path)?;
        crate::usage::usage_json(&db, start, by)
    })
    .await;
    match report {
        Ok(Ok(v)) => respond(200, "application/json", v.to_string()),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the usage record could not be read");
            error(
                500,
                "internal",
                "the usage record could not be read; the daemon's log says why",
            )
        }
        Err(_) => error(500, "internal", "the usage report stopped"),
    }
}

fn respond(status: u16, content_type: &str, body: impl Into<Bytes>) -> Reply {
    let mut resp = http::Response::new(Full::new(body.into()).boxed_unsync());
    *resp.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    resp
}

/// A JSON error `{"error":{"code":..,"message":..}}`.
fn error(status: u16, code: &str, message: impl Into<String>) -> Reply {
    let body = serde_json::json!({"error": {"code": code, "message": message.into()}}).to_string();
    let mut resp = respond(status, "application/json", body);
    if status == 401 {
        resp.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer"),
        );
    }
    resp
}

/// An admin call refused: rendered by [`ApiError::reply`].
struct ApiError {
    status: u16,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn reply(self) -> Reply {
        error(self.status, self.code, self.message)
    }
}

fn fail(status: u16, code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError {
        status,
        code,
        message: message.into(),
    }
}

fn auth_error(e: AuthError) -> ApiError {
    match e {
        AuthError::Unauthenticated => fail(401, "unauthorized", e.to_string()),
        AuthError::Forbidden(_) => fail(403, "forbidden", e.to_string()),
        // A kind of refusal this release does not know is still a refusal.
        _ => fail(403, "forbidden", e.to_string()),
    }
}

/// The header that names the action a mutating call intends (HELD-04).
const INTENT: &str = "vacancy-intent";

/// One control connection: the peer, the address it arrived on, the pool
/// it was admitted to and whether a request of it is being answered.
#[derive(Debug, Clone)]
struct Conn {
    peer: SocketAddr,
    local: IpAddr,
    pool: Pool,
    busy: Arc<AtomicBool>,
}

/// Authenticate `head`'s bearer token for `scope`. A refusal is counted,
/// logged and, for a peer that keeps sending wrong tokens, answered late
/// ([`failures`]); a valid token is answered at once, from any peer.
async fn authorize<'a>(
    state: &'a ControlState,
    conn: &Conn,
    head: &http::request::Parts,
    scope: Scope,
) -> Result<&'a TokenConfig, ApiError> {
    let authorization = head
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let e = match state.tokens.authorize(authorization, scope) {
        Ok(token) => return Ok(token),
        Err(e) => e,
    };
    let failure = match e {
        AuthError::Forbidden(_) => Failure::InsufficientScope,
        _ if head.headers.contains_key(http::header::AUTHORIZATION) => Failure::WrongToken,
        _ => Failure::MissingToken,
    };
    state
        .lender
        .metrics()
        .auth_failed(scope.as_str(), failure.label());
    let delay = state.failures.failed(conn.peer.ip(), scope, failure);
    if !delay.is_zero() {
        // Waiting out a delay is no work of the owner's: the connection may
        // be closed to make room meanwhile (conns).
        conn.busy.store(false, Ordering::Release);
        tokio::time::sleep(delay).await;
        conn.busy.store(true, Ordering::Release);
    }
    Err(auth_error(e))
}

/// Authorize an admin call: token, scope, then intent (HELD-05).
async fn admit_call<'a>(
    state: &'a ControlState,
    conn: &Conn,
    head: &http::request::Parts,
    scope: Scope,
    intent: &str,
) -> Result<&'a str, ApiError> {
    let token = authorize(state, conn, head, scope).await?;
    let said = head
        .headers
        .get(INTENT)
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    if said != Some(intent) {
        return Err(fail(
            403,
            "missing_intent",
            format!("this call needs the header `Vacancy-Intent: {intent}` naming the action"),
        ));
    }
    Ok(token.name.as_str())
}

/// The read routes: loopback clients need no token, others one of scope
/// `read`.
async fn read_allowed(
    state: &ControlState,
    conn: &Conn,
    head: &http::request::Parts,
) -> Result<(), ApiError> {
    if conn.peer.ip().is_loopback() {
        return Ok(());
    }
    authorize(state, conn, head, Scope::Read).await.map(|_| ())
}

/// The largest body an admin call reads.
const MAX_JSON_BODY: usize = 64 * 1024;

/// A JSON object body, read within 64 KiB. A larger declared length is
/// refused before a byte is read, so a client waiting for `100 Continue`
/// uploads nothing (issue 30 item 8).
async fn json_body(
    body: BorrowerBody,
) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    if body.size_hint().lower() > MAX_JSON_BODY as u64 {
        return Err(fail(
            413,
            "body_too_large",
            format!("the body is larger than the {MAX_JSON_BODY} bytes an admin call reads"),
        ));
    }
    let bytes = Limited::new(body, MAX_JSON_BODY)
        .collect()
        .await
        .map_err(|e| {
            fail(
                400,
                "invalid_request",
                format!("the body could not be read: {e}"),
            )
        })?
        .to_bytes();
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err(fail(
            400,
            "invalid_request",
            "the body must be a JSON object",
        )),
        Err(e) => Err(fail(
            400,
            "invalid_request",
            format!("the body is not valid JSON: {e}"),
        )),
    }
}

fn bool_field(
    map: &serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Result<bool, ApiError> {
    map.get(key)
        .and_then(serde_json::Value::as_bool)
        .ok_or_else(|| {
            fail(
                400,
                "invalid_request",
                format!("the body needs a boolean \"{key}\""),
            )
        })
}

fn ok(value: serde_json::Value) -> Reply {
    respond(200, "application/json", value.to_string())
}

/// Whether a request arriving on `conn` is malformed or misdirected by its
/// `Host` (issue 30 items 6 and 8): 400 where RFC 9112 makes it malformed,
/// 421 where it names a host that is not this listener (DNS rebinding).
fn host_refusal(state: &ControlState, conn: &Conn, head: &http::request::Parts) -> Option<Reply> {
    let host = match check_host(head.version, &head.headers) {
        Ok(host) => host,
        Err(e) => return Some(error(400, "invalid_request", e.to_string())),
    };
    // An absolute-form target names the host too, and RFC 9112 §3.2.2 has
    // it override Host: both must be this listener's.
    let target = head
        .uri
        .authority()
        .and_then(|a| http::HeaderValue::from_str(a.as_str()).ok());
    let refused = [host, target.as_ref()]
        .into_iter()
        .flatten()
        .find(|h| !state.hosts.allows(Some(h), conn.local))?;
    let named = refused
        .to_str()
        .map(vacancy::shell::proxy::host::host_part)
        .unwrap_or_default();
    Some(error(
        421,
        "misdirected_request",
        format!(
            "Host {named:?} is not a name of this control listener: it answers its own address, localhost and the names in [server] allowed_hosts (a defence against DNS rebinding); add the name there if clients really reach vacancyd by it"
        ),
    ))
}

/// A route a reserve connection serves: the health checks.
fn is_health_route(method: &http::Method, path: &str) -> bool {
    matches!(*method, http::Method::GET | http::Method::HEAD)
        && (path == "/health" || path.starts_with(UPSTREAM_HEALTH))
}

// Long: the control plane's route table, one match arm a route; each arm calls one function.
async fn handle(state: &Arc<ControlState>, conn: &Conn, req: http::Request<BorrowerBody>) -> Reply {
    let json = "application/json";
    let (head, body) = req.into_parts();
    if let Some(refused) = host_refusal(state, conn, &head) {
        return refused;
    }
    let path = head.uri.path().to_owned();
    let method = head.method.clone();
    if conn.pool == Pool::Reserve && !is_health_route(&method, &path) {
        let mut resp = error(
            503,
            "busy",
            "the control listener is at its connection limit, so this connection answers only /health and /health/upstreams/<name>; retry in a moment",
        );
        resp.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("1"),
        );
        return resp;
    }
    match (&method, path.as_str()) {
        (&http::Method::GET | &http::Method::HEAD, "/health") => {
            if state.ready.load(Ordering::Acquire) {
                respond(200, json, r#"{"status":"ready"}"#)
            } else {
                respond(503, json, r#"{"status":"starting"}"#)
            }
        }
        (&http::Method::GET, "/status") => match read_allowed(state, conn, &head).await {
            Err(e) => e.reply(),
            Ok(()) => match serde_json::to_vec(&state.status()) {
                Ok(body) => respond(200, json, body),
                Err(e) => error(500, "internal", format!("cannot render status: {e}")),
            },
        },
        (&http::Method::GET | &http::Method::HEAD, p) if p.starts_with(UPSTREAM_HEALTH) => {
            match read_allowed(state, conn, &head).await {
                Err(e) => e.reply(),
                Ok(()) => upstream_health(state, &p[UPSTREAM_HEALTH.len()..]),
            }
        }
        (&http::Method::GET, "/metrics") => match read_allowed(state, conn, &head).await {
            Err(e) => e.reply(),
            Ok(()) => respond(
                200,
                vacancy::shell::state::metrics::CONTENT_TYPE,
                state.metrics(),
            ),
        },
        (&http::Method::GET, "/history") => match read_allowed(state, conn, &head).await {
            Err(e) => e.reply(),
            Ok(()) => {
                let now = state.lender.clock().now();
                match serde_json::to_vec(&state.lender.history().snapshot(now)) {
                    Ok(body) => respond(200, json, body),
                    Err(e) => error(500, "internal", format!("cannot render history: {e}")),
                }
            }
        },
        (&http::Method::GET, "/usage") => match read_allowed(state, conn, &head).await {
            Err(e) => e.reply(),
            Ok(()) => usage_report(state, head.uri.query().unwrap_or("")).await,
        },
        (&http::Method::GET, "/settings") => match read_allowed(state, conn, &head).await {
            Err(e) => e.reply(),
            Ok(()) => settings_form(state).await,
        },
        (&http::Method::GET, "/events") => match read_allowed(state, conn, &head).await {
            Err(e) => e.reply(),
            Ok(()) => crate::console::events(state),
        },
        (&http::Method::GET, p) if crate::console::is_asset(p) => crate::console::asset(p),
        (&http::Method::POST, "/admin/settings") => save_settings(state, conn, &head, body)
            .await
            .unwrap_or_else(ApiError::reply),
        (&http::Method::POST, "/admin/lending") => lending(state, conn, &head, body)
            .await
            .unwrap_or_else(ApiError::reply),
        (&http::Method::POST, "/admin/owner") => presence(state, conn, &head, body)
            .await
            .unwrap_or_else(ApiError::reply),
        (&http::Method::POST, p) if p.starts_with("/admin/resources/") => {
            let name = p.trim_start_matches("/admin/resources/").to_owned();
            resource(state, conn, &head, body, &name)
                .await
                .unwrap_or_else(ApiError::reply)
        }
        (&http::Method::POST, p) if p.starts_with("/admin/work/") && p.ends_with("/release") => {
            let id = p
                .trim_start_matches("/admin/work/")
                .trim_end_matches("/release")
                .to_owned();
            release_work(state, conn, &head, body, &id)
                .await
                .unwrap_or_else(ApiError::reply)
        }
        // An unknown admin route is not told apart from a known one before
        // the token is checked: probing /admin/* learns nothing.
        (_, p) if p.starts_with("/admin/") || p == "/admin" => {
            match authorize(state, conn, &head, Scope::Owner).await {
                Err(e) => e.reply(),
                Ok(_) => error(
                    404,
                    "not_found",
                    format!(
                        "no admin route {method} {path}; see docs/operator-guide.md for the /admin routes"
                    ),
                ),
            }
        }
        (_, path) => error(
            404,
            "not_found",
            format!(
                "no control route {method} {path}; see / (the console), /status, /events, /history, /settings, /metrics, /health, /health/upstreams/<name> and /admin/*"
            ),
        ),
    }
}

/// The prefix of the load balancers' per-upstream health route.
const UPSTREAM_HEALTH: &str = "/health/upstreams/";

/// `GET /health/upstreams/<name>`'s body: the upstream's vacancy sign.
#[derive(Serialize)]
struct UpstreamHealth<'a> {
    upstream: &'a str,
    admitting: bool,
    /// A new request would wait in the upstream's line behind this many.
    #[serde(skip_serializing_if = "Option::is_none")]
    queueing: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<RefusalCode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

/// For load balancers: 200 while the upstream's default budget would be
/// admitted (the decision `/status` shows as `vacancy.admitting`), else 503
/// with the refusal code and its `Retry-After`. Also 503
/// `upstream_unreachable` while the observation loop's last check could not
/// reach the server: a balancer should not send borrowers to a lender that
/// can only answer 502. Answered from state in memory alone — no disk, no
/// request to the upstream — so a balancer may ask several times a second.
fn upstream_health(state: &ControlState, name: &str) -> Reply {
    let found = state
        .lender
        .upstream_id(name)
        .map(|id| (id, state.lender.vacancy(id)));
    let Some((id, mut vacancy)) = found else {
        return error(
            404,
            "not_found",
            format!("no upstream {name:?}; /status lists the upstreams by name"),
        );
    };
    let health = state.upstreams.get(id.index()).map(|u| u.health.get());
    if vacancy.admitting
        && let Some(h) = health.filter(|h| h.reachable == Some(false))
    {
        vacancy = Vacancy::refusing(
            RefusalCode::UpstreamUnreachable,
            format!(
                "vacancyd's last check could not reach the {name} server: {}",
                h.error.as_deref().unwrap_or("no answer")
            ),
        );
    }
    let body = UpstreamHealth {
        upstream: name,
        admitting: vacancy.admitting,
        queueing: vacancy.queueing,
        code: vacancy.code,
        reason: vacancy.reason,
    };
    let json = serde_json::to_vec(&body).unwrap_or_default();
    if vacancy.admitting {
        return respond(200, "application/json", json);
    }
    let mut resp = respond(503, "application/json", json);
    if let Some(after) = vacancy.code.and_then(RefusalCode::retry_after)
        && let Ok(v) = http::HeaderValue::from_str(&after.as_secs().to_string())
    {
        resp.headers_mut().insert(http::header::RETRY_AFTER, v);
    }
    resp
}

async fn lending(
    state: &ControlState,
    conn: &Conn,
    head: &http::request::Parts,
    body: BorrowerBody,
) -> Result<Reply, ApiError> {
    let who = admit_call(state, conn, head, Scope::Owner, "lending").await?;
    let enabled = bool_field(&json_body(body).await?, "enabled")?;
    state.lender.set_lending(enabled);
    info!(token = who, enabled, "admin: lending switched");
    Ok(ok(serde_json::json!({"lending": enabled})))
}

async fn resource(
    state: &ControlState,
    conn: &Conn,
    head: &http::request::Parts,
    body: BorrowerBody,
    name: &str,
) -> Result<Reply, ApiError> {
    let who = admit_call(state, conn, head, Scope::Owner, "resource").await?;
    let enabled = bool_field(&json_body(body).await?, "enabled")?;
    state
        .lender
        .set_resource_enabled(name, enabled)
        .map_err(|e| fail(404, "not_found", e.to_string()))?;
    info!(
        token = who,
        resource = name,
        enabled,
        "admin: resource switched"
    );
    Ok(ok(
        serde_json::json!({"resource": name, "enabled": enabled}),
    ))
}

async fn presence(
    state: &ControlState,
    conn: &Conn,
    head: &http::request::Parts,
    body: BorrowerBody,
) -> Result<Reply, ApiError> {
    let who = admit_call(state, conn, head, Scope::Owner, "presence").await?;
    let present = bool_field(&json_body(body).await?, "present")?;
    let Some(manual) = &state.manual else {
        return Err(fail(
            409,
            "conflict",
            format!(
                "owner presence comes from the {} backend; setting it by hand needs [owner] presence = \"manual\"",
                state.presence_backend
            ),
        ));
    };
    manual.set(present);
    // Apply at once rather than at the next presence poll.
    let presence = if present {
        vacancy::engine::OwnerPresence::Present
    } else {
        vacancy::engine::OwnerPresence::Away
    };
    state.lender.set_owner(presence);
    info!(token = who, present, "admin: owner presence set");
    Ok(ok(serde_json::json!({"owner": presence.as_str()})))
}

async fn release_work(
    state: &ControlState,
    conn: &Conn,
    head: &http::request::Parts,
    body: BorrowerBody,
    id: &str,
) -> Result<Reply, ApiError> {
    let who = admit_call(state, conn, head, Scope::Admin, "release_work").await?;
    let map = json_body(body).await?;
    if map.get("upstream_stopped") != Some(&serde_json::Value::Bool(true)) {
        return Err(fail(
            400,
            "invalid_request",
            "confirm with {\"upstream_stopped\": true} after stopping or verifying the job at the upstream",
        ));
    }
    let entry: EntryId = id.parse().map_err(|_| {
        fail(
            404,
            "not_found",
            format!("no work entry {id:?}; IDs are listed by vacancyd status"),
        )
    })?;
    // Answered only once the release is on disk (HELD-04): an acknowledged
    // release never comes back as held after a crash.
    match state
        .lender
        .release_held(entry, HeldRelease::AdministratorConfirmed)
        .await
    {
        Ok(()) => {
            info!(token = who, entry = %entry, "admin: held work released");
            Ok(ok(serde_json::json!({"released": entry.to_string()})))
        }
        Err(HeldReleaseError::Engine(e @ EngineError::UnknownEntry(_))) => {
            Err(fail(404, "not_found", e.to_string()))
        }
        Err(HeldReleaseError::Engine(e)) => Err(fail(409, "conflict", e.to_string())),
        Err(HeldReleaseError::NotRecorded(e)) => {
            warn!(token = who, entry = %entry, error = %e, "admin: the release could not be recorded; the entry stays held");
            Err(fail(
                503,
                "ledger_unavailable",
                format!(
                    "the release of work entry {entry} could not be saved in the recovery directory, so the entry stays held: {}. Free disk space or fix the directory, then send the release again",
                    e.reason
                ),
            ))
        }
        Err(e) => Err(fail(409, "conflict", e.to_string())),
    }
}

/// The console's settings form. Reading and validating the file blocks, so
/// it runs on tokio's blocking pool.
async fn settings_form(state: &ControlState) -> Reply {
    let settings = Arc::clone(&state.settings);
    match tokio::task::spawn_blocking(move || serde_json::to_vec(&settings.form())).await {
        Ok(Ok(body)) => respond(200, "application/json", body),
        Ok(Err(e)) => error(500, "internal", format!("cannot render settings: {e}")),
        Err(e) => {
            warn!(error = %e, "the settings form task failed");
            error(
                500,
                "internal",
                "cannot read the settings; see the daemon's log",
            )
        }
    }
}

async fn save_settings(
    state: &ControlState,
    conn: &Conn,
    head: &http::request::Parts,
    body: BorrowerBody,
) -> Result<Reply, ApiError> {
    // Scope owner; admin for the advanced workload permissions (SCOPE-03).
    let who = admit_call(state, conn, head, Scope::Owner, "settings")
        .await?
        .to_owned();
    let map = json_body(body).await?;
    let edit: vacancy::config::SettingsEdit =
        serde_json::from_value(serde_json::Value::Object(map)).map_err(|e| {
            fail(
                400,
                "invalid_request",
                format!("the settings are not in the expected form: {e}"),
            )
        })?;
    if edit.needs_admin() {
        admit_call(state, conn, head, Scope::Admin, "settings")
            .await
            .map_err(|e| ApiError {
                message: format!(
                    "{} (owner_scope and management are advanced workload permissions)",
                    e.message
                ),
                ..e
            })?;
    }
    // Reading, validating and writing the file (three fsyncs) blocks: off
    // the runtime's threads, so the console and borrowers never wait on it.
    let settings = Arc::clone(&state.settings);
    let by = who.clone();
    let outcome = tokio::task::spawn_blocking(move || settings.save(&edit, &by))
        .await
        .map_err(|e| {
            warn!(token = %who, error = %e, "the settings save task failed");
            fail(
                500,
                "not_saved",
                "the settings were not saved; see the daemon's log",
            )
        })?;
    match outcome {
        Ok(saved) => Ok(ok(serde_json::json!({
            "saved": true,
            "restart_required": !saved.pending.is_empty(),
            "path": saved.path,
            "previous": saved.previous,
            "pending": saved.pending,
            "message": saved.message,
        }))),
        Err(SaveError::Invalid(problems)) => {
            let n = problems.len();
            let list: Vec<serde_json::Value> = problems
                .iter()
                .map(|p| serde_json::json!({"key": p.path, "line": p.line, "message": p.message}))
                .collect();
            let body = serde_json::json!({"error": {
                "code": "invalid_settings",
                "message": SaveError::Invalid(problems).to_string(),
                "problems": list,
            }});
            warn!(token = %who, problems = n, "settings not saved: they do not validate");
            Ok(respond(422, "application/json", body.to_string()))
        }
        Err(e @ SaveError::NoFile) => Err(fail(409, "conflict", e.to_string())),
        Err(e @ SaveError::Empty) => Err(fail(400, "invalid_request", e.to_string())),
        Err(e @ SaveError::Io(_)) => {
            warn!(token = %who, error = %e, "settings not saved");
            Err(fail(
                500,
                "not_saved",
                format!("the settings were not saved: {e}"),
            ))
        }
    }
}

/// Serve the control plane until `shutdown`. Connections are admitted to
/// the pools of [`conns`], sized from `listening.budget`, under the
/// configured limits shortened for the control plane ([`conns::limits`]),
/// so that idle, slow and many connections never stop it answering, and a
/// health check always gets through (issue 30 item 2).
pub async fn serve(
    listener: TcpListener,
    state: Arc<ControlState>,
    listening: Listening,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = AcceptBackoff::new("control");
    let pools = ControlConns::new(Sizes::from_total(listening.budget.size()));
    let mut shed_log = ShedLog::default();
    loop {
        tokio::select! {
            (stream, peer) = backoff.accept(&listener) => {
                let admitted = pools.admit(peer.ip());
                for (what, whose) in &admitted.shed {
                    state.lender.metrics().control_shed(what.label());
                    shed_log.note(*what, *whose, &pools);
                }
                let Some(mut ticket) = admitted.ticket else {
                    continue; // dropping the stream closes it
                };
                let local = stream
                    .local_addr()
                    .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip());
                let conn = Conn {
                    peer,
                    local,
                    pool: ticket.pool,
                    busy: Arc::clone(&ticket.busy),
                };
                let limits = conns::limits(ticket.pool, listening.limits);
                let state = Arc::clone(&state);
                tokio::spawn(async move {
                    let handler = move |req| {
                        let (state, conn) = (Arc::clone(&state), conn.clone());
                        let busy = BusyGuard::new(&conn.busy);
                        async move {
                            let mut resp = handle(&state, &conn, req).await;
                            if conn.pool == Pool::Reserve || resp.status() == http::StatusCode::PAYLOAD_TOO_LARGE {
                                // One answer, then closed; or a body left unread.
                                resp.headers_mut().insert(
                                    http::header::CONNECTION,
                                    http::HeaderValue::from_static("close"),
                                );
                            }
                            resp.map(|body| WhileBusy { inner: body, _busy: busy }.boxed_unsync())
                        }
                    };
                    tokio::select! {
                        r = serve_connection(stream, limits, handler, None) => {
                            if let Err(e) = r {
                                debug!(error = %e, "control connection ended with an error");
                            }
                        }
                        _ = &mut ticket.closed => {
                            debug!(%peer, "control connection closed to make room for a newer one");
                        }
                    }
                    drop(ticket);
                });
            }
            () = vacancy::shell::stopped(&mut shutdown) => return,
        }
    }
}

/// A response body that keeps its connection marked busy until it ends.
struct WhileBusy<B> {
    inner: B,
    _busy: BusyGuard,
}

impl<B: Body + Unpin> Body for WhileBusy<B> {
    type Data = B::Data;
    type Error = B::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Logs what the pools shed, at most once per [`SHED_LOG_EVERY`], with how
/// many more there were.
#[derive(Debug, Default)]
struct ShedLog {
    last: Option<Instant>,
    unlogged: u64,
}

/// How often shed control connections are logged, at most.
const SHED_LOG_EVERY: Duration = Duration::from_secs(10);

impl ShedLog {
    fn note(&mut self, what: Shed, peer: IpAddr, pools: &ControlConns) {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < SHED_LOG_EVERY)
        {
            self.unlogged += 1;
            return;
        }
        let sizes = pools.sizes();
        let (general, reserve) = pools.open();
        warn!(
            %peer,
            reason = what.label(),
            not_logged = std::mem::take(&mut self.unlogged),
            general_open = general,
            general_limit = sizes.general,
            per_peer_limit = sizes.per_peer,
            reserve_open = reserve,
            reserve_limit = sizes.reserve,
            "control listener at its connection limit: idle and slow connections are closed for new ones, and health checks use the reserve (vacancyd_control_connections_shed_total); raise LimitNOFILE for a larger limit"
        );
        self.last = Some(now);
    }
}
