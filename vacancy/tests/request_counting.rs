//! Every borrower request is counted exactly once, by its outcome, however
//! it ends (issue 32 item 1): admitted, refused at each place the request
//! path can refuse, forwarded as a read or discovery, refused as management,
//! malformed, or left by its borrower. Each request goes through a real
//! listener (`shell::proxy::listen::serve`) and the test reads the metrics'
//! own text, so a request counted twice, or not at all, fails here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use vacancy::config::{Management, OnBorrowerDisconnect};
use vacancy::engine::{
    CompletionMethod, Engine, EngineSpec, OwnerPresence, ResourceSpec, UpstreamSpec,
};
use vacancy::ledger::store::{
    ReservationStore, StoreChange, StoreError, StoreFailure, StoreWrite, VolatileStore,
};
use vacancy::shell::upstream::pool::ReadPool;
use vacancy::shell::{Lender, Listening, Target, UpstreamRoute, serve};
use vacancy::traits::{
    Adapter, InspectContext, InspectError, InspectResult, Inspection, RouteClass, RouteMethod,
    RouteSpec, RouteTable, SampleError, WorkRoute,
};
use vacancy::{CapacitySample, MonotonicClock, ResourceKind};

/// Work on `POST /work` (a JSON body, `{"bad": …}` malformed) and `POST /slow`
/// (the upstream answers after a second); reads, discovery and management.
struct Counted(RouteTable);

impl Adapter for Counted {
    fn name(&self) -> &str {
        "counted"
    }
    fn routes(&self) -> &RouteTable {
        &self.0
    }
    fn inspect(&self, _r: &WorkRoute, _c: InspectContext<'_>, body: &[u8]) -> InspectResult {
        if body.starts_with(b"{\"bad\"") {
            return Err(InspectError::invalid("the body says it is bad"));
        }
        Ok(Inspection::default())
    }
}

fn adapter() -> Arc<dyn Adapter> {
    let work = WorkRoute {
        completion: CompletionMethod::ResponseEnd,
        inspect_body: true,
        websocket: false,
    };
    Arc::new(Counted(
        RouteTable::new(vec![
            RouteSpec::new(RouteMethod::Post, "/work", RouteClass::Work(work)),
            RouteSpec::new(RouteMethod::Post, "/slow", RouteClass::Work(work)),
            RouteSpec::new(RouteMethod::Get, "/read", RouteClass::BorrowerRead),
            RouteSpec::new(RouteMethod::Get, "/models", RouteClass::Discovery),
            RouteSpec::new(RouteMethod::Get, "/admin", RouteClass::Management),
        ])
        .unwrap(),
    ))
}

/// A plain HTTP server: 200 at once, or after a second on `/slow`.
async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    if req.uri().path() == "/slow" {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                        Bytes::from_static(b"{}"),
                    )))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

/// An engine refusal: what it is, its status and code, how to bring it
/// about and how to undo it.
type EngineCase = (
    &'static str,
    u16,
    &'static str,
    Box<dyn Fn(&Lender)>,
    Box<dyn Fn(&Lender)>,
);

/// A store whose disk is gone: every record fails.
struct BrokenStore;

impl ReservationStore for BrokenStore {
    fn submit(&self, change: StoreChange) -> StoreWrite {
        let entry = change.entry();
        Box::pin(std::future::ready(Err(StoreError {
            entry,
            reason: StoreFailure::Other("the disk is gone".to_owned()),
        })))
    }
}

/// vacancyd's request path for one upstream `counted` on resource `gpu`
/// (2,000 MiB needed over a 1,000 MiB reserve), listening on `addr`.
struct Proxy {
    lender: Arc<Lender>,
    addr: SocketAddr,
    _stop: watch::Sender<bool>,
}

async fn proxy(target: SocketAddr, store: Arc<dyn ReservationStore>) -> Proxy {
    let clock = MonotonicClock::new();
    let spec = EngineSpec {
        lending: true,
        resources: vec![ResourceSpec::new("gpu", ResourceKind::Gpu, 1000)],
        upstreams: vec![UpstreamSpec::new("counted", "gpu", 2000)],
    };
    let mut engine = Engine::new(spec).unwrap();
    engine.set_owner(OwnerPresence::Away);
    let lender = Arc::new(Lender::new(engine, ["gpu".to_owned()], clock, store));
    roomy(&lender);
    let route = Arc::new(UpstreamRoute {
        name: "counted".to_owned(),
        id: lender.upstream_id("counted").unwrap(),
        adapter: adapter(),
        target: Target::parse(&format!("http://{target}")).unwrap(),
        management: Management::Deny,
        on_borrower_disconnect: OnBorrowerDisconnect::Drain,
        completion_timeout: Duration::from_secs(5),
        stop_proof_timeout: Duration::from_secs(4),
        max_body_bytes: 64 * 1024,
        connect_timeout: Duration::from_secs(2),
        overhead_header: false,
        tunnel_idle: Duration::from_secs(60),
        credential: None,
        reads: ReadPool::new(Duration::from_secs(2)),
        series: Default::default(),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, rx) = watch::channel(false);
    tokio::spawn(serve(
        listener,
        Arc::clone(&lender),
        route,
        Listening::default(),
        rx,
        Duration::from_secs(1),
    ));
    Proxy {
        lender,
        addr,
        _stop: stop,
    }
}

/// A fresh sample with room for the work.
fn roomy(lender: &Lender) {
    let now = lender.clock().now();
    lender.record_sample("gpu", Ok(CapacitySample::memory(20_000, 24_000, now)), now);
}

/// The counters a request may move: `requests{route_class,outcome}`,
/// `admissions` and `refusals{code}`, by their label text.
fn counts(lender: &Lender) -> BTreeMap<String, u64> {
    let text = lender.metrics().render(&lender.status());
    text.lines()
        .filter(|l| {
            l.starts_with("vacancyd_requests_total")
                || l.starts_with("vacancyd_admissions_total")
                || l.starts_with("vacancyd_refusals_total")
        })
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// What moved between two readings.
fn moved(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Wait until some counter moves, then return what moved.
async fn after_count(lender: &Lender, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let d = moved(before, &counts(lender));
        if !d.is_empty() {
            return d;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the request was never counted"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Send one raw HTTP/1.1 request and read the status line.
async fn send_raw(addr: SocketAddr, raw: &[u8]) -> u16 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    while !got.windows(2).any(|w| w == b"\r\n") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "the proxy closed without a status line");
        got.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&got);
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

async fn send(addr: SocketAddr, method: &str, path: &str, body: &str) -> u16 {
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    send_raw(addr, raw.as_bytes()).await
}

/// One request's expected count: the `requests` line and, where it moves
/// one, the `admissions` or `refusals` line.
fn expect(class: &str, outcome: &str, code: Option<&str>) -> BTreeMap<String, u64> {
    let mut want = BTreeMap::new();
    want.insert(
        format!(
            "vacancyd_requests_total{{upstream=\"counted\",route_class=\"{class}\",outcome=\"{outcome}\"}}"
        ),
        1,
    );
    match (outcome, code) {
        ("admitted", _) => {
            want.insert(
                "vacancyd_admissions_total{upstream=\"counted\"}".to_owned(),
                1,
            );
        }
        ("refused", Some(code)) => {
            want.insert(
                format!("vacancyd_refusals_total{{upstream=\"counted\",code=\"{code}\"}}"),
                1,
            );
        }
        _ => {}
    }
    want
}

/// Run `request`, wait for its count and check it is exactly `want`.
async fn counted_once<F: std::future::Future<Output = u16>>(
    p: &Proxy,
    what: &str,
    status: u16,
    want: BTreeMap<String, u64>,
    request: F,
) {
    let before = counts(&p.lender);
    let got = request.await;
    assert_eq!(got, status, "{what}: status");
    let moved = after_count(&p.lender, &before).await;
    assert_eq!(moved, want, "{what}: counted once, by its outcome");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_outcome_class_is_counted_exactly_once() {
    let up = upstream().await;
    let p = proxy(up, Arc::new(VolatileStore)).await;
    let mut sent = 0u64;
    let start = counts(&p.lender);

    // Admitted, then the next request waits for the post-job sample: give it.
    let admitted = expect("work", "admitted", None);
    counted_once(
        &p,
        "admitted",
        200,
        admitted,
        send(p.addr, "POST", "/work", "{}"),
    )
    .await;
    roomy(&p.lender);
    sent += 1;

    // Forwarded without a reservation: a borrower read and discovery.
    let read = expect("borrower_read", "forwarded", None);
    counted_once(&p, "read", 200, read, send(p.addr, "GET", "/read", "")).await;
    let discovery = expect("discovery", "forwarded", None);
    counted_once(
        &p,
        "discovery",
        200,
        discovery,
        send(p.addr, "GET", "/models", ""),
    )
    .await;
    sent += 2;

    // Refused by the route table: management, an unlisted read, an unknown write.
    let cases = [
        (
            "management",
            "GET",
            "/admin",
            403,
            "management",
            "route_forbidden",
        ),
        (
            "an unlisted read",
            "GET",
            "/other",
            403,
            "unknown",
            "route_forbidden",
        ),
        (
            "an unknown write",
            "POST",
            "/other",
            501,
            "unknown",
            "route_not_supported",
        ),
    ];
    for (what, method, path, status, class, code) in cases {
        let want = expect(class, "refused", Some(code));
        counted_once(&p, what, status, want, send(p.addr, method, path, "")).await;
        sent += 1;
    }

    // Bad requests: no Host, a malformed body, a body over the bound.
    let no_host = b"POST /work HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
    let bad = expect("work", "refused", Some("invalid_request"));
    counted_once(&p, "no Host", 400, bad.clone(), send_raw(p.addr, no_host)).await;
    counted_once(
        &p,
        "a malformed body",
        400,
        bad,
        send(p.addr, "POST", "/work", "{\"bad\": 1}"),
    )
    .await;
    let big = "x".repeat(100 * 1024);
    let large = expect("work", "refused", Some("body_too_large"));
    counted_once(
        &p,
        "too large",
        413,
        large,
        send(p.addr, "POST", "/work", &big),
    )
    .await;
    sent += 3;

    // Refused by the engine, one code after another.
    let engine_cases: [EngineCase; 5] = [
        (
            "owner present",
            503,
            "owner_present",
            Box::new(|l| {
                l.set_owner(OwnerPresence::Present);
            }),
            Box::new(|l| {
                l.set_owner(OwnerPresence::Away);
            }),
        ),
        (
            "lending paused",
            503,
            "lending_paused",
            Box::new(|l| l.set_lending(false)),
            Box::new(|l| l.set_lending(true)),
        ),
        (
            "resource disabled",
            503,
            "resource_disabled",
            Box::new(|l| l.set_resource_enabled("gpu", false).unwrap()),
            Box::new(|l| l.set_resource_enabled("gpu", true).unwrap()),
        ),
        (
            "insufficient memory",
            503,
            "insufficient_memory",
            Box::new(|l| {
                let now = l.clock().now();
                l.record_sample("gpu", Ok(CapacitySample::memory(2500, 24_000, now)), now);
            }),
            Box::new(roomy),
        ),
        (
            "capacity unknown",
            503,
            "capacity_unknown",
            Box::new(|l| {
                let now = l.clock().now();
                let failed = SampleError::Unreadable {
                    source_name: "gpu".to_owned(),
                    reason: "gone".to_owned(),
                };
                l.record_sample("gpu", Err(failed), now);
            }),
            Box::new(roomy),
        ),
    ];
    for (what, status, code, set, reset) in engine_cases {
        set(&p.lender);
        let want = expect("work", "refused", Some(code));
        counted_once(&p, what, status, want, send(p.addr, "POST", "/work", "{}")).await;
        reset(&p.lender);
        sent += 1;
    }

    // Busy: a slow job holds the resource; a second is refused at once.
    let mut slow = TcpStream::connect(p.addr).await.unwrap();
    let before = counts(&p.lender);
    slow.write_all(
        format!(
            "POST /slow HTTP/1.1\r\nHost: {}\r\nContent-Length: 2\r\n\r\n{{}}",
            p.addr
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let moved_slow = after_count(&p.lender, &before).await;
    assert_eq!(moved_slow, expect("work", "admitted", None), "the slow job");
    let busy = expect("work", "refused", Some("resource_busy"));
    counted_once(&p, "busy", 503, busy, send(p.addr, "POST", "/work", "{}")).await;
    sent += 2;

    // Gone after admission: the slow job's borrower leaves before the reply.
    // It was counted as admitted and is not counted again once its work ends.
    let before = counts(&p.lender);
    drop(slow);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !p.lender.status().work.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slow job never ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        moved(&before, &counts(&p.lender)).is_empty(),
        "a borrower who leaves after admission is not counted again"
    );

    // Gone before an answer: the next request waits for the post-job sample
    // (ADM-06), asking the sampler for it, and its borrower leaves while it
    // waits. A request for a sample left by the job's release is spent first.
    let wants_sample = p.lender.sample_trigger("gpu").unwrap();
    let _ = tokio::time::timeout(Duration::ZERO, wants_sample.notified()).await;
    let before = counts(&p.lender);
    let mut waiting = TcpStream::connect(p.addr).await.unwrap();
    waiting
        .write_all(
            format!(
                "POST /work HTTP/1.1\r\nHost: {}\r\nContent-Length: 2\r\n\r\n{{}}",
                p.addr
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(3), wants_sample.notified())
        .await
        .expect("the request waits for a post-job sample");
    assert!(
        moved(&before, &counts(&p.lender)).is_empty(),
        "still waiting"
    );
    drop(waiting);
    let gone = after_count(&p.lender, &before).await;
    assert_eq!(
        gone,
        expect("work", "gone", None),
        "a borrower who left the wait"
    );
    sent += 1;
    roomy(&p.lender);

    // An unreachable upstream: a read refused, work admitted (DONE-02 then
    // releases it).
    // Never the proxy's own port 0, which a dropped listener's could be.
    let refusing = vacancy::testkit::RefusingPort::bind().unwrap();
    let down = refusing.addr();
    let p2 = proxy(down, Arc::new(VolatileStore)).await;
    let unreachable = expect("borrower_read", "refused", Some("upstream_unreachable"));
    counted_once(
        &p2,
        "a read, upstream down",
        502,
        unreachable,
        send(p2.addr, "GET", "/read", ""),
    )
    .await;
    let admitted = expect("work", "admitted", None);
    counted_once(
        &p2,
        "work, upstream down",
        502,
        admitted,
        send(p2.addr, "POST", "/work", "{}"),
    )
    .await;

    // The record cannot be written: refused, nothing forwarded (REC-01).
    let p3 = proxy(up, Arc::new(BrokenStore)).await;
    let unrecorded = expect("work", "refused", Some("ledger_unavailable"));
    counted_once(
        &p3,
        "no ledger",
        503,
        unrecorded,
        send(p3.addr, "POST", "/work", "{}"),
    )
    .await;

    // Across the whole run, nothing was counted late or twice.
    let total: u64 = moved(&start, &counts(&p.lender))
        .iter()
        .filter(|(k, _)| k.starts_with("vacancyd_requests_total"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(total, sent, "each request once");
}
