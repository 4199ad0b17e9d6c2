//! Conformance checks of what the daemon relies on from an adapter, public so
//! adapter authors outside this repository run the same checks as the
//! built-in adapters (feature `testkit`). Each returns every problem found,
//! each naming the rule it breaks.
//!
//! - [`check_route_table`]: each entry classifies as itself; unknown routes are unknown.
//! - [`check_route_classes`]: the table is exactly the class list you expect.
//! - [`check_refusal_dialect`]: every refusal code renders with its one status,
//!   its name in the body, and its `Retry-After`.
//! - [`check_inspection`]: unreadable bodies refused, exact model names, the
//!   Responses background rule, the empty body of a route that does not read it.
//! - [`check_observation`]: stamped by the daemon's clock; malformed, hung-up
//!   and stale answers never prove residency; all visible work reported.
//! - [`check_completion`]: through the real proxy, with the daemon's clock, a
//!   clean upstream end releases (DONE-01), a refused connection releases
//!   (DONE-02), and a stream cut after the connection is established holds (DONE-03).
//!
//! The checks that need an upstream run against tiny in-process ones that
//! answer as told, refuse, or break off, because they test the daemon's
//! contract with the adapter, not any real server. The adapter is built by
//! its [`AdapterFactory`] as the daemon builds it.

mod inspection;
mod observation;

pub use inspection::{RESPONSES_PATH, check_inspection};
pub use observation::{Canned, ObservationCase, check_observation};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::{Management, OnBorrowerDisconnect, UpstreamConfig};
use crate::engine::{
    Engine, EngineSpec, OwnerPresence, Phase, RefusalCode, ResourceSpec, UpstreamSpec,
};
use crate::ledger::store::VolatileStore;
use crate::registry::{AdapterContext, AdapterFactory};
use crate::shell::state::lender::Lender;
use crate::shell::upstream::route::UpstreamRoute;
use crate::shell::upstream::target::Target;
use crate::traits::{Adapter, RouteClass};
use crate::{CapacitySample, ResourceKind};

/// The clock the kit hands adapters: the daemon's stand-in, running for an hour
/// already, so moments read from any clock an adapter made itself are an hour off.
fn kit_clock() -> crate::MonotonicClock {
    crate::MonotonicClock::started_ago(Duration::from_secs(3600))
}

/// An upstream's configuration and recovery directory, to build an adapter
/// through its factory as the daemon does. The directory is removed when dropped.
pub struct KitUpstream {
    /// The `[[upstream]]` table the factory sees: name `under-test`, the target.
    pub config: UpstreamConfig,
    dir: std::path::PathBuf,
}

/// Why the kit could not set up what it tests an adapter in.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KitError {
    /// The kit's recovery directory could not be made.
    #[error("cannot create the kit's directory {path}: {source}")]
    Directory {
        /// The directory.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The upstream's target is not a URL the kit can reach.
    #[error("target {target:?}: {reason}")]
    Target {
        /// The target.
        target: String,
        /// Why it does not parse.
        reason: String,
    },
    /// The factory did not build the adapter.
    #[error("the factory did not build the adapter: {0}")]
    Factory(#[source] crate::registry::BuildError),
    /// The kit's engine refused its own spec.
    #[error("the kit's engine: {0}")]
    Engine(#[from] crate::engine::SpecError),
    /// The kit's proxy could not listen.
    #[error("the kit's proxy cannot listen: {0}")]
    Listen(#[source] std::io::Error),
    /// The proxy cannot reach the upstream's target.
    #[error(transparent)]
    Unreachable(#[from] crate::shell::upstream::target::TargetError),
    /// The kit's engine lost the upstream it was built with.
    #[error("the kit's engine has no upstream {0:?}")]
    NoUpstream(String),
}

impl KitUpstream {
    /// An upstream reaching `target` (a base URL), with a fresh recovery directory.
    pub fn new(target: &str) -> Result<Self, KitError> {
        let dir = std::env::temp_dir().join(format!("vacancy-testkit-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).map_err(|source| KitError::Directory {
            path: dir.clone(),
            source,
        })?;
        Ok(KitUpstream {
            config: UpstreamConfig {
                name: "under-test".to_owned(),
                target: target.to_owned(),
                ..UpstreamConfig::default()
            },
            dir,
        })
    }

    /// The adapter `factory` builds for this upstream, handed `clock`.
    pub fn build(
        &self,
        factory: &dyn AdapterFactory,
        clock: crate::MonotonicClock,
    ) -> Result<Arc<dyn Adapter>, KitError> {
        let target = self
            .config
            .target
            .parse()
            .map_err(|e: http::uri::InvalidUri| KitError::Target {
                target: self.config.target.clone(),
                reason: e.to_string(),
            })?;
        let ctx = AdapterContext {
            upstream: &self.config,
            target,
            credential: None,
            clock,
            state_dir: &self.dir,
        };
        factory.build(&ctx).map_err(KitError::Factory)
    }
}

impl Drop for KitUpstream {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A request that is work on the adapter under test.
#[derive(Debug, Clone)]
pub struct WorkSample {
    /// Its method.
    pub method: http::Method,
    /// Its path.
    pub path: String,
    /// Its content type.
    pub content_type: String,
    /// Its body.
    pub body: Bytes,
}

impl WorkSample {
    /// A JSON POST.
    pub fn json(path: &str, body: &str) -> Self {
        WorkSample {
            method: http::Method::POST,
            path: path.to_owned(),
            content_type: "application/json".to_owned(),
            body: Bytes::copy_from_slice(body.as_bytes()),
        }
    }
}

/// Every problem, or `Ok`.
fn outcome(problems: Vec<String>) -> Result<(), Vec<String>> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// A pattern's path with every `{param}` filled with an ID-shaped segment.
fn concrete_path(pattern: &str) -> String {
    pattern
        .split('/')
        .map(|seg| {
            if seg.starts_with('{') && seg.ends_with('}') {
                "abcd_1234-ef"
            } else {
                seg
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Every route-table entry classifies as itself; paths no adapter serves are unknown.
///
/// For an adapter whose `classify` follows its table; one that narrows a
/// class by what it remembers (ComfyUI's reads of borrowed prompts only)
/// checks its table with [`check_route_classes`] and its own tests.
pub fn check_route_table(adapter: &dyn Adapter) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    for e in adapter.routes().entries() {
        let method = inspection::method_of(e.method);
        let path = concrete_path(e.path);
        let got = adapter.classify(&method, &path);
        if e.param_check.is_none() && got != e.class {
            problems.push(format!(
                "{method} {path} classifies as {got:?}, its entry says {:?}",
                e.class
            ));
        }
    }
    for method in [http::Method::GET, http::Method::POST, http::Method::DELETE] {
        let path = "/vacancy-testkit/no/such/route";
        let got = adapter.classify(&method, path);
        if got != RouteClass::Unknown {
            problems.push(format!(
                "{method} {path} classifies as {got:?}, expected Unknown (ROUTE-01)"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// The route table is exactly `expected`: each `(method, path, class)`
/// classifies as its class (a concrete path, `{param}` segments filled in),
/// and every entry of the table matches one of them, so a route added,
/// dropped or reclassified is caught (ROUTE-01: only listed work is admitted).
pub fn check_route_classes(
    adapter: &dyn Adapter,
    expected: &[(http::Method, &str, RouteClass)],
) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    for (method, path, class) in expected {
        let got = adapter.classify(method, path);
        if got != *class {
            problems.push(format!(
                "{method} {path} classifies as {got:?}, expected {class:?}"
            ));
        }
    }
    for e in adapter.routes().entries() {
        if !expected.iter().any(|(m, p, _)| e.matches(m, p)) {
            problems.push(format!(
                "{:?} {} ({:?}) is in the table but not in the expected list",
                e.method, e.path, e.class
            ));
        }
    }
    outcome(problems)
}

/// Every refusal code renders with its status, its name, and its `Retry-After`.
pub fn check_refusal_dialect(adapter: &dyn Adapter) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    for code in RefusalCode::ALL {
        let r = adapter.render_refusal(&crate::engine::Refusal::new(code, "testkit reason"));
        if r.status.as_u16() != code.http_status() {
            problems.push(format!(
                "{code}: status {} (expected {})",
                r.status,
                code.http_status()
            ));
        }
        if !String::from_utf8_lossy(&r.body).contains(code.as_str()) {
            problems.push(format!("{code}: the body does not carry the code"));
        }
        let retry = r
            .headers
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let want = code.retry_after().map(|d| d.as_secs().to_string());
        if retry != want {
            problems.push(format!("{code}: Retry-After {retry:?}, expected {want:?}"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// How a fake upstream answers.
#[derive(Debug, Clone, Copy)]
enum Upstream {
    Clean,
    BreaksOff,
}

async fn fake_upstream(kind: Upstream) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            match kind {
                Upstream::Clean => {
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(|_req| async {
                            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                                Bytes::from_static(b"{\"ok\":true}"),
                            )))
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
                Upstream::BreaksOff => {
                    tokio::spawn(async move {
                        let mut buf = [0u8; 4096];
                        let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await;
                        let _ = stream
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\npartial")
                            .await;
                        let _ = stream.shutdown().await;
                    });
                }
            }
        }
    });
    Ok(addr)
}

/// A loopback port where connections are refused for as long as this lives:
/// it is bound but never listened on, so nothing answers and nothing else can
/// bind it. The port of a listener that was bound and dropped is not that: the
/// next bind to port 0 (the proxy's own, say) may be given it, and the proxy
/// would then forward to itself.
pub struct RefusingPort {
    _socket: tokio::net::TcpSocket,
    addr: SocketAddr,
}

impl RefusingPort {
    /// Binds a fresh loopback port without listening on it.
    pub fn bind() -> std::io::Result<Self> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let addr = socket.local_addr()?;
        Ok(Self {
            _socket: socket,
            addr,
        })
    }

    /// The address whose connections are refused.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// The real proxy in front of `upstream` with one always-free resource, for
/// conformance checks and for adapter authors' own tests. Stops when dropped.
pub struct ProxyUnderTest {
    /// The admission shell: its status shows what the proxy holds.
    pub lender: Arc<Lender>,
    /// Where borrowers connect.
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
}

impl Drop for ProxyUnderTest {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

impl ProxyUnderTest {
    /// Start the proxy for `adapter` in front of `upstream`; borrowers who leave
    /// are drained (`on_borrower_disconnect = "drain"`). The proxy reads a
    /// clock of its own: an adapter that observes should be built by
    /// [`ProxyUnderTest::build`] instead, with the proxy's clock.
    pub async fn start(adapter: Arc<dyn Adapter>, upstream: SocketAddr) -> Result<Self, KitError> {
        harness(adapter, upstream, crate::MonotonicClock::new()).await
    }

    /// Build the adapter with `factory` as the daemon would (the proxy's
    /// clock in its [`AdapterContext`]) and start the proxy for it in front
    /// of `upstream`.
    pub async fn build(
        factory: &dyn AdapterFactory,
        upstream: SocketAddr,
    ) -> Result<Self, KitError> {
        let clock = kit_clock();
        let adapter = KitUpstream::new(&format!("http://{upstream}"))?.build(factory, clock)?;
        harness(adapter, upstream, clock).await
    }

    /// The work entries once `want` holds, or after 2 s, whichever is first.
    pub async fn settle(
        &self,
        want: impl Fn(&[crate::engine::WorkStatus]) -> bool,
    ) -> Vec<crate::engine::WorkStatus> {
        settle(&self.lender, want).await
    }
}

/// A lender with one always-roomy resource (`testkit`) and one upstream
/// `name` reaching `target` through `adapter`, the owner away: for tests of
/// the shells around an adapter (observation, yields, reclaims), with or
/// without a listener in front.
pub fn lone_upstream(
    name: &str,
    adapter: Arc<dyn Adapter>,
    target: &str,
    clock: crate::MonotonicClock,
) -> Result<(Arc<Lender>, Arc<UpstreamRoute>), KitError> {
    let spec = EngineSpec {
        lending: true,
        resources: vec![ResourceSpec::new("testkit", ResourceKind::Memory, 0)],
        upstreams: vec![UpstreamSpec::new(name, "testkit", 0)],
    };
    let mut engine = Engine::new(spec)?;
    engine.set_owner(OwnerPresence::Away);
    let lender = Arc::new(Lender::new(
        engine,
        ["testkit".to_owned()],
        clock,
        Arc::new(VolatileStore),
    ));
    lender.record_sample(
        "testkit",
        Ok(CapacitySample::memory(1 << 20, 1 << 21, clock.now())),
        clock.now(),
    );
    let id = lender
        .upstream_id(name)
        .ok_or_else(|| KitError::NoUpstream(name.to_owned()))?;
    let route = Arc::new(UpstreamRoute {
        name: name.to_owned(),
        id,
        adapter,
        target: Target::parse(target)?,
        management: Management::Deny,
        on_borrower_disconnect: OnBorrowerDisconnect::Drain,
        completion_timeout: Duration::from_secs(5),
        stop_proof_timeout: Duration::from_secs(4),
        max_body_bytes: 1 << 20,
        connect_timeout: Duration::from_secs(2),
        overhead_header: false,
        tunnel_idle: Duration::from_secs(3600),
        credential: None,
        reads: crate::shell::upstream::pool::ReadPool::new(Duration::from_secs(2)),
        series: Default::default(),
    });
    Ok((lender, route))
}

async fn harness(
    adapter: Arc<dyn Adapter>,
    upstream: SocketAddr,
    clock: crate::MonotonicClock,
) -> Result<ProxyUnderTest, KitError> {
    let (lender, route) =
        lone_upstream("under-test", adapter, &format!("http://{upstream}"), clock)?;
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(KitError::Listen)?;
    let addr = listener.local_addr().map_err(KitError::Listen)?;
    let (stop, rx) = watch::channel(false);
    tokio::spawn(crate::shell::proxy::listen::serve(
        listener,
        Arc::clone(&lender),
        route,
        crate::shell::proxy::listen::Listening::default(),
        rx,
        Duration::from_secs(1),
    ));
    Ok(ProxyUnderTest { lender, addr, stop })
}

/// Send `sample` through the proxy; the status and whether the body ended cleanly.
async fn send(addr: SocketAddr, sample: &WorkSample) -> Result<(u16, bool), String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(sample.method.clone())
        .uri(&sample.path)
        .header(http::header::HOST, addr.to_string())
        .header(http::header::CONTENT_TYPE, &sample.content_type)
        .body(Full::new(sample.body.clone()))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let clean = resp.into_body().collect().await.is_ok();
    Ok((status, clean))
}

async fn settle(
    lender: &Lender,
    want: impl Fn(&[crate::engine::WorkStatus]) -> bool,
) -> Vec<crate::engine::WorkStatus> {
    for _ in 0..100 {
        let work = lender.status().work;
        if want(&work) {
            return work;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lender.status().work
}

/// Through the real proxy: a clean end releases, a refused connection
/// releases, a stream cut after connecting holds. `factory` builds the
/// adapter for each fake upstream exactly as the daemon would: with the
/// proxy's own clock in its [`AdapterContext`] (a clock that has run for an
/// hour, so an adapter that reads a clock of its own stamps moments an hour
/// off).
pub async fn check_completion(
    factory: &dyn AdapterFactory,
    sample: &WorkSample,
) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    let io = |e: std::io::Error| vec![e.to_string()];

    // DONE-01: a clean end releases.
    let up = fake_upstream(Upstream::Clean).await.map_err(io)?;
    let h = ProxyUnderTest::build(factory, up)
        .await
        .map_err(|e| vec![e.to_string()])?;
    match send(h.addr, sample).await {
        Ok((200, true)) => {
            let work = settle(&h.lender, |w| w.is_empty()).await;
            if !work.is_empty() {
                problems.push(format!(
                    "DONE-01: a clean end left {} entries: {work:?}",
                    work.len()
                ));
            }
        }
        other => problems.push(format!(
            "DONE-01: the work sample through the proxy gave {other:?}, expected a clean 200"
        )),
    }
    drop(h);

    // DONE-02: a refused connection releases.
    let refusing = RefusingPort::bind().map_err(io)?;
    let h = ProxyUnderTest::build(factory, refusing.addr())
        .await
        .map_err(|e| vec![e.to_string()])?;
    match send(h.addr, sample).await {
        Ok((502, _)) => {
            let work = settle(&h.lender, |w| w.is_empty()).await;
            if !work.is_empty() {
                problems.push(format!(
                    "DONE-02: a refused connection left {} entries",
                    work.len()
                ));
            }
        }
        other => problems.push(format!(
            "DONE-02: a refused upstream gave {other:?}, expected 502 upstream_unreachable"
        )),
    }
    drop(h);
    drop(refusing);

    // DONE-03: a stream cut after the connection is established holds.
    let up = fake_upstream(Upstream::BreaksOff).await.map_err(io)?;
    let h = ProxyUnderTest::build(factory, up)
        .await
        .map_err(|e| vec![e.to_string()])?;
    match send(h.addr, sample).await {
        Ok((_, false)) | Err(_) => {
            let work = settle(&h.lender, |w| w.iter().any(|e| e.phase == Phase::Held)).await;
            if !(work.len() == 1 && work[0].phase == Phase::Held) {
                problems.push(format!(
                    "DONE-03: a cut stream should leave one held entry, found {work:?}"
                ));
            }
        }
        Ok(other) => problems.push(format!(
            "DONE-03: a cut stream reached the borrower as complete: {other:?}"
        )),
    }
    drop(h);

    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}
