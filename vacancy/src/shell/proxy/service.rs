//! One borrower request through one upstream's listener:
//! classify → (inspect → admit → persist) → forward → complete.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use tokio::sync::oneshot;
use tracing::{debug, info, warn};

use crate::engine::{
    BorrowerRef, CompletionMethod, EntryId, Refusal, RefusalCode, Reservation, WorkRequest,
};
use crate::shell::loops::observation::observe_upstream;
use crate::shell::proxy::answer::{refusal_after_forwarding, refusal_response};
use crate::shell::proxy::arrival::Arrival;
use crate::shell::proxy::completion::{GuardedBody, verify_cut};
use crate::shell::proxy::conn::{BorrowerBody, is_stalled};
use crate::shell::proxy::exchange::{Exchange, Observed};
use crate::shell::proxy::host::check_host;
use crate::shell::proxy::tracked::exchange_tracked;
use crate::shell::proxy::tunnel::{BorrowerSide, tunnel};
use crate::shell::state::gate::{
    BorrowerGate, Caller, LINE_POSITION_HEADER, ME_PATH, take_priority,
};
use crate::shell::state::lender::{Decided, Lender, Recording};
use crate::shell::state::live::{CutSignal, cut_happens, cut_reason};
use crate::shell::state::metrics::RequestPhase;
use crate::shell::upstream::forward::{
    Answer, Connecting, ExchangeError, ProxyBody, exchange_with_cut, full, head_first, is_upgrade,
    prepare_response_head, streaming, upstream_request,
};
use crate::shell::upstream::route::UpstreamRoute;
use crate::traits::{
    InspectContext, Reconsidered, RouteClass, RoutePolicy, WorkRoute, route_policy,
};

/// How much of an unread request body a refusal drains to keep the connection alive.
const REFUSAL_DRAIN_BYTES: usize = 256 * 1024;

/// The header that says how long a request waited in its upstream's wait
/// line, in milliseconds (issue 22); absent when it did not wait.
pub const WAITED_HEADER: &str = "vacancy-waited-ms";

/// The header that says how long vacancyd itself took on a request, in
/// milliseconds (issue 31 item 6; `[server] overhead_header`, off by default).
pub const OVERHEAD_HEADER: &str = "vacancy-overhead-ms";

/// Answer one borrower request, timing it for the metrics: the whole time to
/// the response head, and vacancyd's own part of it (all of it but the
/// upstream's, [`Arrival::upstream_took`]; all of it for a refusal), which
/// `vacancy-overhead-ms` says where the configuration asks for it. The
/// request is counted once, by its outcome, through its [`Arrival`].
pub async fn handle(
    lender: Arc<Lender>,
    route: Arc<UpstreamRoute>,
    req: http::Request<BorrowerBody>,
) -> http::Response<ProxyBody> {
    let at = tokio::time::Instant::now();
    // A handle on the request head's own bytes: no copy per request.
    let path = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    let class = route.adapter.classify(req.method(), path.as_str());
    let mut arrival = Arrival::new(lender, route, at, path, (&class).into());
    let mut response = answer_request(&mut arrival, req, class).await;
    if let Some(p) = arrival.line_position {
        response.headers_mut().insert(
            http::HeaderName::from_static(LINE_POSITION_HEADER),
            http::HeaderValue::from(p),
        );
    }
    if let Some(w) = arrival.waited
        && let Ok(v) = http::HeaderValue::from_str(&w.as_millis().to_string())
    {
        response
            .headers_mut()
            .insert(http::HeaderName::from_static(WAITED_HEADER), v);
    }
    let total = arrival.at.elapsed();
    let own = total.saturating_sub(arrival.upstream_took.unwrap_or_default());
    if arrival.route.overhead_header
        && let Some(v) = milliseconds_value(own)
    {
        response
            .headers_mut()
            .insert(http::HeaderName::from_static(OVERHEAD_HEADER), v);
    }
    arrival.answered(total, own);
    response
}

/// `took` in milliseconds with three decimals (whole microseconds), for
/// `vacancy-overhead-ms`: the digits written by `itoa`, not `core::fmt`,
/// whose `u128` formatting made a value cost 76–109 ns against 44–51 now
/// (in a loop on the 2-core VM, the value's allocation included; issue 31).
fn milliseconds_value(took: Duration) -> Option<http::HeaderValue> {
    let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    let (ms, frac) = (us / 1000, us % 1000);
    let mut digits = itoa::Buffer::new();
    let mut text = [0u8; 24];
    let whole = digits.format(ms).as_bytes();
    let (head, tail) = text.split_at_mut(whole.len());
    head.copy_from_slice(whole);
    // `frac` < 1000: its three digits, each < 10.
    let [point, d1, d2, d3, ..] = tail else {
        return None;
    };
    *point = b'.';
    *d1 = b'0' + (frac / 100) as u8;
    *d2 = b'0' + (frac / 10 % 10) as u8;
    *d3 = b'0' + (frac % 10) as u8;
    http::HeaderValue::from_bytes(&text[..whole.len() + 4]).ok()
}

async fn answer_request(
    arrival: &mut Arrival,
    mut req: http::Request<BorrowerBody>,
    class: RouteClass,
) -> http::Response<ProxyBody> {
    // The route is borrowed from the arrival where it is used, not cloned: a
    // clone and its drop are two writes to a count every proxy thread shares
    // (issue 31).
    // RFC 9112 §3.2: no Host on HTTP/1.1, or two, is a malformed request
    // (issue 30 item 8). Its body is not read, so the connection closes.
    if let Err(e) = check_host(req.version(), req.headers()) {
        let refusal = Refusal::new(RefusalCode::InvalidRequest, e.to_string());
        arrival.refused(&refusal);
        return refusal_response(&arrival.route, &refusal, true);
    }
    let policy = route_policy(class, req.method(), arrival.route.management);
    if let Some(gate) = arrival.lender.borrower_gate().cloned() {
        let caller = identify(arrival, &gate, &mut req);
        if req.method() == http::Method::GET && arrival.path.path() == ME_PATH {
            return borrower_view(arrival, &caller);
        }
        if let Some(refusal) = gate.refusal(&caller, &policy) {
            arrival.refused(&refusal);
            let waits_to_send = expects_continue(req.headers());
            let body = req.into_body();
            return Box::pin(refuse_after_draining(
                &arrival.route,
                refusal,
                body,
                waits_to_send,
            ))
            .await;
        }
    }
    // Every path but a read's is boxed: a request's future is as large as
    // its largest path, and hyper moves each one into its connection's slot,
    // so a read paid for copying the state of work and of refusals (issue
    // 31: 6.7 KB a request before, 1.9 KB of it the read's). An allocation is
    // nothing beside a durable write or a refusal's drain.
    match policy {
        RoutePolicy::Refuse(code) => Box::pin(refuse_route(arrival, req, class, code)).await,
        RoutePolicy::Forward => forward_unreserved(arrival, req).await,
        RoutePolicy::Admit(work) => Box::pin(work_request(arrival, req, work)).await,
    }
}

/// A route the policy does not lend: refused, unless the adapter, asked
/// again, forwards it or says more precisely why not.
async fn refuse_route(
    arrival: &mut Arrival,
    req: http::Request<BorrowerBody>,
    class: RouteClass,
    code: RefusalCode,
) -> http::Response<ProxyBody> {
    let route = Arc::clone(&arrival.route);
    let path = arrival.path.as_str();
    let refusal = match route.adapter.reconsider_refusal(req.method(), path).await {
        Reconsidered::Stands => route_refusal(&route, class, code, req.method(), path),
        Reconsidered::Forward => return forward_unreserved(arrival, req).await,
        Reconsidered::Refuse(precise) => precise,
    };
    arrival.refused(&refusal);
    let waits_to_send = expects_continue(req.headers());
    refuse_after_draining(&route, refusal, req.into_body(), waits_to_send).await
}

/// With named borrowers on: who sent `req`. Its key is taken off (never
/// forwarded) and the upstream's own credential put on in its place; the
/// borrower's name goes on the arrival for its admission and its log lines.
fn identify(
    arrival: &mut Arrival,
    gate: &BorrowerGate,
    req: &mut http::Request<BorrowerBody>,
) -> Caller {
    let caller = gate.take_caller(req.headers_mut());
    if let Some((name, value)) = &arrival.route.credential {
        req.headers_mut().insert(name.clone(), value.clone());
    }
    arrival.borrower = caller.name().cloned();
    caller
}

/// `GET /v1/vacancy/me`: the borrower's own use, limits, budgets and place
/// in line, as JSON (issue 34 item 5); 401 without a known key.
fn borrower_view(arrival: &mut Arrival, caller: &Caller) -> http::Response<ProxyBody> {
    let route = Arc::clone(&arrival.route);
    let view = caller
        .name()
        .and_then(|name| arrival.lender.borrower_view(name));
    let Some(view) = view else {
        let refusal = Refusal::new(
            RefusalCode::UnknownBorrower,
            "send your key (Authorization: Bearer <key>) to see your own use; ask the machine's owner for one",
        );
        arrival.refused(&refusal);
        return refusal_response(&route, &refusal, false);
    };
    arrival.forwarded();
    let mut resp = http::Response::new(full(Bytes::from(view.to_string())));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    resp
}

/// Why a route is not lent, in words that say which case it is (ROUTE-04).
fn route_refusal(
    route: &UpstreamRoute,
    class: RouteClass,
    code: RefusalCode,
    method: &http::Method,
    path: &str,
) -> Refusal {
    let path = path.split('?').next().unwrap_or(path);
    let adapter = route.adapter.name();
    let reason = match (code, class) {
        (RefusalCode::RouteForbidden, RouteClass::Management) => format!(
            "{method} {path} manages the {adapter} server or reads its owner's data, so it is not lent to borrowers; the machine's owner can forward it by setting management = \"allow\" for upstream {}",
            route.name
        ),
        (RefusalCode::RouteForbidden, _) => format!(
            "{method} {path} is not a read the {adapter} adapter lists, so it could return the owner's data and is not forwarded; check the path for a typo (docs/adapter-guide.md lists each adapter's routes). If the server really serves it to borrowers, report it in vacancy's issue tracker with the server's name and version"
        ),
        _ => format!(
            "{method} {path} is not a route the {adapter} adapter recognizes, so vacancyd cannot tell when its work would end and does not forward it; check the path for a typo (docs/adapter-guide.md lists each adapter's routes). If the server really serves it, report it in vacancy's issue tracker with the server's name and version"
        ),
    };
    Refusal::new(code, reason)
}

/// Whether the client waits for `100 Continue` before sending its body.
fn expects_continue(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// Refuse, draining a small unread body first so the connection stays usable
/// (docs/operator-guide.md#refusals); a larger body closes the connection instead, and so does one
/// the client has not sent yet because it waits for `100 Continue`: reading
/// it would ask for it (issue 30 item 8).
async fn refuse_after_draining(
    route: &UpstreamRoute,
    refusal: Refusal,
    body: BorrowerBody,
    waits_to_send: bool,
) -> http::Response<ProxyBody> {
    let drained = if hyper::body::Body::is_end_stream(&body) {
        true
    } else if waits_to_send {
        false
    } else {
        tokio::time::timeout(
            std::time::Duration::from_millis(200),
            Limited::new(body, REFUSAL_DRAIN_BYTES).collect(),
        )
        .await
        .is_ok_and(|r| r.is_ok())
    };
    refusal_response(route, &refusal, !drained)
}

async fn forward_unreserved(
    arrival: &mut Arrival,
    req: http::Request<BorrowerBody>,
) -> http::Response<ProxyBody> {
    let (mut parts, body) = req.into_parts();
    let borrower = BorrowerSide::take(&mut parts);
    let upstream_req = match upstream_request(&arrival.route.target, parts, streaming(body)) {
        Ok(r) => r,
        Err(e) => {
            let refusal = Refusal::new(RefusalCode::InvalidRequest, e);
            arrival.refused(&refusal);
            return refusal_response(&arrival.route, &refusal, true);
        }
    };
    // Nothing is reserved: a pooled keep-alive connection (shell::upstream::pool).
    let sent = Instant::now();
    let sending = arrival
        .route
        .reads
        .send(&arrival.route.target, upstream_req);
    match sending.await {
        Ok(replied) => {
            arrival.forwarded();
            arrival.upstream_took = Some(replied.at.saturating_duration_since(sent));
            relay(
                replied.response,
                borrower,
                None,
                None,
                arrival.route.tunnel_idle,
            )
        }
        Err(e) => {
            let refusal = exchange_failed(&arrival.route, &e);
            arrival.refused(&refusal);
            refusal_response(&arrival.route, &refusal, false)
        }
    }
}

/// The refusal a failed upstream exchange answers with; logged here.
fn exchange_failed(route: &UpstreamRoute, e: &ExchangeError) -> Refusal {
    warn!(upstream = %route.name, error = %e, "upstream exchange failed");
    Refusal::new(
        RefusalCode::UpstreamUnreachable,
        format!("upstream {}: {}", route.name, e.borrower_words()),
    )
}

/// Hand an upstream response to the borrower: streamed, guarded when it is
/// work, tunnelled when it switches protocols (closed after `tunnel_idle`
/// with nothing moving, [`tunnel`](crate::shell::proxy::tunnel)).
fn relay(
    mut resp: http::Response<Incoming>,
    borrower: BorrowerSide,
    exchange: Option<Exchange>,
    cut: Option<CutSignal>,
    tunnel_idle: std::time::Duration,
) -> http::Response<ProxyBody> {
    if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS {
        let upstream_upgrade = hyper::upgrade::on(&mut resp);
        let (mut parts, _) = resp.into_parts();
        prepare_response_head(&mut parts);
        tokio::spawn(tunnel(
            borrower,
            upstream_upgrade,
            exchange,
            cut,
            tunnel_idle,
        ));
        return http::Response::from_parts(parts, full(Bytes::new()));
    }
    let (mut parts, body) = resp.into_parts();
    prepare_response_head(&mut parts);
    let body = match exchange {
        Some(x) => head_first(GuardedBody::new(body, x, cut)),
        None => head_first(body),
    };
    http::Response::from_parts(parts, body)
}

/// Work: read the body within its bound, inspect it, decide, record the
/// reservation (REC-01), then forward it apart from the borrower's connection.
async fn work_request(
    arrival: &mut Arrival,
    req: http::Request<BorrowerBody>,
    work: WorkRoute,
) -> http::Response<ProxyBody> {
    let (lender, route) = (Arc::clone(&arrival.lender), Arc::clone(&arrival.route));
    // One clock reading a boundary (issue 31): the engine time of its
    // arrival is the arrival's, inspecting starts there, and deciding
    // starts where inspecting ended.
    let arrived_at = lender.clock().moment_of(arrival.at);
    let (mut parts, body) = req.into_parts();
    let priority = match lender.borrower_gate() {
        None => None,
        Some(_) => match take_priority(&mut parts.headers) {
            Ok(p) => p,
            Err(refusal) => {
                arrival.refused(&refusal);
                return refusal_response(&route, &refusal, true);
            }
        },
    };
    let body = match read_work_body(&route, body, work.inspect_body).await {
        Ok(body) => body,
        Err(refusal) => {
            arrival.refused(&refusal);
            return refusal_response(&route, &refusal, true);
        }
    };
    let entry = EntryId::random();
    let ctx = InspectContext {
        entry,
        method: &parts.method,
        path: arrival.path.as_str(),
        headers: &parts.headers,
    };
    let inspection = match route.adapter.inspect(&work, ctx, &body) {
        Ok(i) => i,
        Err(e) => {
            let refusal = e.to_refusal();
            arrival.refused(&refusal);
            return refusal_response(&route, &refusal, false);
        }
    };
    let inspected = tokio::time::Instant::now();
    lender.metrics().phase(
        RequestPhase::Inspect,
        inspected.saturating_duration_since(arrival.at),
    );
    let request = WorkRequest {
        id: entry,
        upstream: route.id,
        model: inspection.model,
        canonical_model: inspection.canonical_model,
        arrived_at,
        completion: work.completion,
        reuse: inspection.reuse,
        upstream_ref: inspection.upstream_ref,
        wait: None,
        borrower: arrival
            .borrower
            .as_deref()
            .map(|name| BorrowerRef::Name(name.to_owned())),
        priority,
    };
    let recording = match decide(arrival, &request, inspected).await {
        Ok(a) => a,
        Err(refusal) => {
            arrival.refused(&refusal);
            return refusal_response(&route, &refusal, false);
        }
    };
    let exchange = Exchange::admitted(Arc::clone(&lender), Arc::clone(&route), entry);
    // The upstream connection opens while the record is synced: connecting
    // sends nothing (DONE-02), and it takes that much off the wait (issue 31).
    let early = (work.completion != CompletionMethod::Tracked).then(|| {
        let route = Arc::clone(&route);
        Connecting::start(async move { route.target.connect(route.connect_timeout).await })
    });
    // REC-01: nothing is forwarded before the record is durable. A request
    // that is not forwarded is counted by its outcome, the refusal.
    let persisting = Instant::now();
    let recorded = recording.recorded().await;
    lender.metrics().persisted(persisting.elapsed());
    let reservation = match recorded {
        Ok(r) => r,
        Err(refusal) => {
            arrival.refused(&refusal);
            exchange.finish(Observed::NotForwarded);
            return refusal_response(&route, &refusal, false);
        }
    };
    arrival.admitted(&reservation);
    let body = inspection.rewritten_body.map_or(body, Bytes::from);
    let answer = forward_work(
        exchange,
        route,
        parts,
        body,
        &reservation,
        work.completion,
        early,
    )
    .await;
    arrival.upstream_took = answer.upstream_took;
    answer.response
}

/// Forward recorded work apart from the borrower's connection, so a borrower
/// who leaves mid-wait never leaves the entry without an owner, and answer
/// with what the exchange task hands back.
async fn forward_work(
    mut exchange: Exchange,
    route: Arc<UpstreamRoute>,
    mut parts: http::request::Parts,
    body: Bytes,
    reservation: &Reservation,
    completion: CompletionMethod,
    early: Option<Connecting>,
) -> Answer {
    let entry = exchange.entry();
    let borrower = if is_upgrade(&parts.headers) {
        BorrowerSide::take(&mut parts)
    } else {
        BorrowerSide::default()
    };
    let upstream_req = match upstream_request(&route.target, parts, full(body)) {
        Ok(r) => r,
        Err(e) => {
            exchange.finish(Observed::NotForwarded);
            return refusal_response(&route, &Refusal::new(RefusalCode::InvalidRequest, e), false)
                .into();
        }
    };
    let (tx, rx) = oneshot::channel();
    if completion == CompletionMethod::Tracked {
        let assigned = reservation
            .upstream_ref
            .clone()
            .unwrap_or_else(|| entry.to_string());
        let admitted_at = reservation.admitted_at;
        tokio::spawn(async move {
            exchange.forwarding();
            let response = exchange_tracked(exchange, upstream_req, assigned, admitted_at).await;
            drop(tx.send(response));
        });
        return answer(&route, rx).await;
    }
    let task_route = Arc::clone(&route);
    let cut = exchange.cut_signal();
    tokio::spawn(async move {
        let response =
            exchange_synchronous(exchange, cut, &task_route, upstream_req, borrower, early).await;
        // A borrower who left gets nothing; dropping the response applies the
        // on_borrower_disconnect policy.
        drop(tx.send(response));
    });
    answer(&route, rx).await
}

/// The body of a work request, read whole within `max_body_mib` where the
/// adapter inspects it; a refusal when it is too large, too slow or broken.
async fn read_work_body(
    route: &UpstreamRoute,
    body: BorrowerBody,
    inspect: bool,
) -> Result<Bytes, Refusal> {
    if !inspect {
        return Ok(Bytes::new());
    }
    // A declared Content-Length over the bound is refused before a byte is
    // read, so a client sending `Expect: 100-continue` gets the 413 instead
    // of `100 Continue` and uploads nothing (issue 30 item 8).
    let declared = hyper::body::Body::size_hint(&body).lower();
    let refusal = if declared > route.max_body_bytes as u64 {
        too_large(route)
    } else {
        match Limited::new(body, route.max_body_bytes).collect().await {
            Ok(collected) => return Ok(collected.to_bytes()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => too_large(route),
            Err(e) => {
                let reason = match is_stalled(e.as_ref()) {
                    Some(stalled) => {
                        info!(upstream = %route.name, received = stalled.received, elapsed_s = stalled.elapsed_s, "a request body arrived too slowly; closing the connection");
                        stalled.to_string()
                    }
                    None => format!("the request body could not be read: {e}"),
                };
                Refusal::new(RefusalCode::InvalidRequest, reason)
            }
        }
    };
    Err(refusal)
}

/// 413 `body_too_large`.
fn too_large(route: &UpstreamRoute) -> Refusal {
    Refusal::new(
        RefusalCode::BodyTooLarge,
        format!(
            "the request body is larger than the {} bytes vacancyd inspects for work (max_body_mib); send a smaller request",
            route.max_body_bytes
        ),
    )
}

/// The engine's decision on a work request, after its wait in line (noted
/// on the arrival) and, where the resident observation was only too old, one
/// more observation (RES-20).
async fn decide(
    arrival: &mut Arrival,
    request: &WorkRequest,
    since: tokio::time::Instant,
) -> Result<Recording, Refusal> {
    let (lender, route) = (&*arrival.lender, &*arrival.route);
    // One seat for both decisions: a waiter keeps its place in line while
    // the upstream is observed once more (issue 30).
    let mut seat = lender.seat_since(request, since);
    let decided = match lender.decide_seated(request, &mut seat).await {
        Decided::Reobserve(refusal) => {
            info!(entry = %request.id, upstream = %route.name, "the resident observation was too old; observing once more before deciding (RES-20)");
            match observe_upstream(lender, route).await {
                Ok(_) => lender.decide_seated(request, &mut seat).await,
                Err(e) => {
                    debug!(upstream = %route.name, error = %e, "RES-20 re-observation failed");
                    Decided::Refused(refusal)
                }
            }
        }
        decided => decided,
    };
    arrival.line_position = seat.position;
    if let Some(w) = seat.finish(&decided) {
        arrival.waited = Some(w);
    }
    match decided {
        Decided::Admitted(a) => Ok(a),
        Decided::Refused(refusal) | Decided::Reobserve(refusal) => Err(refusal),
    }
}

/// Forward synchronous work and hand back the borrower's response: the
/// upstream's, relayed with the exchange riding on its body, or a refusal
/// that says how the exchange ended (a failed connection, a failure after
/// it, a reclaim's cut before the reply, RECL-15).
async fn exchange_synchronous(
    mut exchange: Exchange,
    cut: CutSignal,
    route: &Arc<UpstreamRoute>,
    upstream_req: http::Request<ProxyBody>,
    borrower: BorrowerSide,
    early: Option<Connecting>,
) -> Answer {
    let entry = exchange.entry();
    exchange.forwarding();
    let (sent, connected) = (Instant::now(), OnceLock::new());
    let exchanged = tokio::select! {
        r = exchange_with_cut(&route.target, upstream_req, route.connect_timeout, Some(cut.clone()), Some(&connected), early) => Ok(r),
        reason = cut_happens(cut.clone()) => Err(reason),
    };
    // A cut closes the upstream connection, which fails the exchange too;
    // whichever the select saw first, the cause is the cut.
    let exchanged = match (exchanged, cut_reason(&cut)) {
        (Ok(Err(ExchangeError::AfterConnect(_))), Some(reason)) => Err(reason),
        (other, _) => other,
    };
    match exchanged {
        Ok(Ok((resp, connection))) => {
            // The upstream's own time: from the connection made (vacancyd's
            // fresh connection counts as vacancyd's) to its response head.
            let took = connected.get().map(|at| {
                let metrics = exchange.lender().metrics();
                metrics.phase(RequestPhase::Connect, at.saturating_duration_since(sent));
                let upstream = at.elapsed();
                metrics.phase(RequestPhase::Upstream, upstream);
                upstream
            });
            exchange.response_head(connection);
            Answer {
                response: relay(resp, borrower, Some(exchange), Some(cut), route.tunnel_idle),
                upstream_took: took,
            }
        }
        Ok(Err(e @ ExchangeError::Connect { .. })) => {
            exchange.finish(Observed::ConnectFailed(e.to_string()));
            refusal_response(route, &exchange_failed(route, &e), false).into()
        }
        Ok(Err(e @ ExchangeError::AfterConnect(_))) => {
            exchange.finish(Observed::FailedAfterConnect(e.to_string()));
            refusal_response(route, &exchange_failed(route, &e), false).into()
        }
        Err(reason) => {
            // RECL-15: cut before the reply began; dropping the exchange closed it.
            info!(entry = %entry, upstream = %route.name, reason = %reason, "request cut by a reclaim before its reply");
            let refusal = Refusal::new(reason.code, reason.reason.clone());
            tokio::spawn(verify_cut(exchange, reason.reason));
            refusal_after_forwarding(route, &refusal, true).into()
        }
    }
}

/// The exchange task's response for the borrower, or why there is none.
async fn answer(route: &UpstreamRoute, rx: oneshot::Receiver<Answer>) -> Answer {
    match rx.await {
        Ok(answer) => answer,
        Err(_) => refusal_response(
            route,
            &Refusal::new(
                RefusalCode::UpstreamUnreachable,
                "the upstream exchange ended without a response",
            ),
            true,
        )
        .into(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_overhead_header_is_milliseconds_with_three_decimals() {
        let says = |d: Duration| milliseconds_value(d).unwrap().to_str().unwrap().to_owned();
        assert_eq!(says(Duration::from_micros(296)), "0.296");
        assert_eq!(says(Duration::from_micros(1_040)), "1.040");
        assert_eq!(says(Duration::from_nanos(999)), "0.000");
        assert_eq!(says(Duration::from_secs(12)), "12000.000");
        assert_eq!(says(Duration::from_micros(1_000_999)), "1000.999");
        assert_eq!(
            says(Duration::MAX),
            format!("{}.{:03}", u64::MAX / 1000, u64::MAX % 1000)
        );
    }
}
