//! What the daemon relies on from `observe`: observations stamped with the
//! daemon's clock when they start; malformed, unreachable and stale answers
//! never prove residency; all visible work is reported.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use crate::engine::{ModelObservation, ResidencyEvidence};
use crate::registry::AdapterFactory;
use crate::traits::{Adapter, ForeignWork, ObserveError};

use super::{KitUpstream, kit_clock, outcome};

/// One canned answer of a fake upstream.
#[derive(Debug, Clone)]
pub struct Canned {
    /// The method it answers.
    pub method: http::Method,
    /// The path it answers, without the query (the query is ignored).
    pub path: String,
    /// Its status.
    pub status: u16,
    /// Its `Content-Type`.
    pub content_type: String,
    /// Its body.
    pub body: String,
}

impl Canned {
    /// `GET path` answered 200 with a JSON `body`.
    pub fn json(path: &str, body: &str) -> Self {
        Self::get(path, 200, "application/json", body)
    }

    /// `GET path` answered `status` with `body` of `content_type`.
    pub fn get(path: &str, status: u16, content_type: &str, body: &str) -> Self {
        Canned {
            method: http::Method::GET,
            path: path.to_owned(),
            status,
            content_type: content_type.to_owned(),
            body: body.to_owned(),
        }
    }

    /// `POST path` answered 200 with a JSON `body`.
    pub fn post_json(path: &str, body: &str) -> Self {
        Canned {
            method: http::Method::POST,
            ..Self::json(path, body)
        }
    }
}

/// How an upstream answers an adapter's observation, in the upstream's own
/// dialect, for [`check_observation`].
#[derive(Debug, Clone, Default)]
pub struct ObservationCase {
    /// An idle upstream with `model` loaded. Anything not listed is 404.
    pub idle: Vec<Canned>,
    /// Whether the idle answers prove `model` resident (`false` for an
    /// adapter that never proves residency).
    pub idle_proves: bool,
    /// The model the idle answers show loaded, as requests name it.
    pub model: String,
    /// The same upstream running `busy_jobs` jobs vacancy did not admit;
    /// empty for an upstream that never shows its work.
    pub busy: Vec<Canned>,
    /// How many jobs the busy answers show running or queued.
    pub busy_jobs: u32,
    /// Answers that are malformed, each set tried on its own (a missing
    /// field, a wrong type, HTML where JSON belongs).
    pub malformed: Vec<Vec<Canned>>,
}

#[derive(Clone)]
enum Mode {
    Answer(Vec<Canned>),
    /// Accept, read, and close without a word.
    HangUp,
}

struct FakeUpstream {
    addr: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeUpstream {
    async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let mode = Arc::new(Mutex::new(Mode::Answer(Vec::new())));
        let shared = Arc::clone(&mode);
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let now = lock(&shared).clone();
                tokio::spawn(async move {
                    match now {
                        Mode::HangUp => {
                            let mut buf = [0u8; 1024];
                            let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await;
                            let _ = stream.shutdown().await;
                        }
                        Mode::Answer(answers) => {
                            let svc = hyper::service::service_fn(move |req| {
                                let reply = answer(&answers, &req);
                                async move { Ok::<_, std::convert::Infallible>(reply) }
                            });
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), svc)
                                .await;
                        }
                    }
                });
            }
        });
        Ok(FakeUpstream { addr, mode, task })
    }

    fn set(&self, mode: Mode) {
        *lock(&self.mode) = mode;
    }
}

fn lock(m: &Mutex<Mode>) -> std::sync::MutexGuard<'_, Mode> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn answer<B>(answers: &[Canned], req: &http::Request<B>) -> http::Response<Full<Bytes>> {
    let found = answers
        .iter()
        .find(|c| c.method == req.method() && c.path == req.uri().path());
    let (status, ct, body) = match found {
        Some(c) => (c.status, c.content_type.as_str(), c.body.clone()),
        None => (404, "text/plain", "404 page not found".to_owned()),
    };
    let mut resp = http::Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = http::HeaderValue::from_str(ct) {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    resp
}

fn proves(o: &ModelObservation, model: &str) -> bool {
    o.models.iter().any(|m| {
        m.name == model
            && match &m.evidence {
                ResidencyEvidence::Proven => true,
                ResidencyEvidence::ProvenFor { kinds, .. } => !kinds.is_empty(),
                ResidencyEvidence::NotProven(_) => false,
            }
    })
}

fn proves_any(o: &ModelObservation) -> bool {
    o.models.iter().any(|m| proves(o, &m.name))
}

/// Observation through the adapter `factory` builds for a fake upstream that
/// answers as `case` says, handed the daemon's clock (one that has run for an
/// hour):
///
/// - every observation is stamped with that clock, between the moments
///   before and after the call (ADM-09, RES-20: the engine compares them
///   with its own; an observation older than 4 s proves nothing);
/// - the idle answers prove `model` resident when `idle_proves` says so;
/// - the busy answers prove nothing and report at least `busy_jobs` jobs as
///   visible work, vacancy's own included ("report all visible work": the
///   engine subtracts its own); the reclaimer, if any, does not answer
///   `ForeignWork::None` for them (RECL-34) and `verify_stopped` is not `true`;
/// - after a proving answer, each malformed answer set, and an upstream that
///   hangs up, prove nothing (OBS-03): never an earlier answer kept and
///   stamped fresh.
///
/// An adapter that does not observe (`ObserveError::Unsupported`) passes
/// with nothing to check.
pub async fn check_observation(
    factory: &dyn AdapterFactory,
    case: &ObservationCase,
) -> Result<(), Vec<String>> {
    let up = FakeUpstream::start()
        .await
        .map_err(|e| vec![e.to_string()])?;
    let clock = kit_clock();
    let kit = KitUpstream::new(&format!("http://{}", up.addr)).map_err(|e| vec![e.to_string()])?;
    let adapter = kit.build(factory, clock).map_err(|e| vec![e.to_string()])?;
    let mut problems = Vec::new();
    let observer = Observer {
        adapter: adapter.as_ref(),
        clock,
    };

    // Idle.
    up.set(Mode::Answer(case.idle.clone()));
    match observer.observe("idle", &mut problems).await {
        Err(ObserveError::Unsupported) => return Ok(()),
        Err(e) => problems.push(format!("the idle answers could not be observed: {e}")),
        Ok(o) => {
            if case.idle_proves && !proves(&o, &case.model) {
                problems.push(format!(
                    "the idle answers should prove {:?} resident, the observation says {:?}",
                    case.model, o.models
                ));
            }
            if !case.idle_proves && proves_any(&o) {
                problems.push(format!(
                    "the idle answers prove residency though the case says they do not: {:?}",
                    o.models
                ));
            }
        }
    }

    // Busy: all visible work reported, nothing proven.
    if !case.busy.is_empty() {
        up.set(Mode::Answer(case.busy.clone()));
        busy(&observer, case, &mut problems).await;
    }

    // Stale: after a proving answer, malformed and hung-up answers prove nothing.
    let mut bad: Vec<(String, Mode)> = case
        .malformed
        .iter()
        .enumerate()
        .map(|(i, set)| {
            (
                format!("malformed answer set {i}"),
                Mode::Answer(set.clone()),
            )
        })
        .collect();
    bad.push(("an upstream that hangs up".to_owned(), Mode::HangUp));
    for (what, mode) in bad {
        let hangs_up = matches!(mode, Mode::HangUp);
        up.set(Mode::Answer(case.idle.clone()));
        let _ = adapter.observe().await;
        up.set(mode);
        if let Ok(o) = adapter.observe().await
            && proves_any(&o)
        {
            problems.push(format!(
                "OBS-03: {what} proves residency ({:?}); an answer that cannot be read proves nothing, and an earlier one is stale",
                o.models
            ));
        }
        if hangs_up && let Ok(true) = adapter.verify_stopped().await {
            problems.push(format!("DONE-04: verify_stopped proved a stop from {what}"));
        }
    }
    outcome(problems)
}

struct Observer<'a> {
    adapter: &'a dyn Adapter,
    clock: crate::MonotonicClock,
}

impl Observer<'_> {
    /// Observe once; an observation must be stamped within the call on the daemon's clock.
    async fn observe(
        &self,
        what: &str,
        problems: &mut Vec<String>,
    ) -> Result<ModelObservation, ObserveError> {
        let before = self.clock.now();
        let got = self.adapter.observe().await;
        let after = self.clock.now();
        if let Ok(o) = &got
            && !(before <= o.taken_at && o.taken_at <= after)
        {
            problems.push(format!(
                "ADM-09: the {what} observation is stamped {:?}, outside the call ({before:?} to {after:?}) on the daemon's clock; stamp taken_at with the clock in the AdapterContext when the observation starts",
                o.taken_at
            ));
        }
        got
    }
}

async fn busy(observer: &Observer<'_>, case: &ObservationCase, problems: &mut Vec<String>) {
    match observer.observe("busy", problems).await {
        Err(e) => problems.push(format!(
            "ADM-09: the busy answers could not be observed ({e}), so their {} jobs were not reported",
            case.busy_jobs
        )),
        Ok(o) => {
            if proves_any(&o) {
                problems.push(format!(
                    "the busy answers ({} jobs running) prove residency: {:?}",
                    case.busy_jobs, o.models
                ));
            }
            let jobs = o.visible_work.as_ref().map_or(0, |w| w.jobs);
            if jobs < case.busy_jobs {
                problems.push(format!(
                    "ADM-09: the busy answers show {} jobs, the observation reports {jobs} as visible work; report all visible work, vacancy's own included",
                    case.busy_jobs
                ));
            }
        }
    }
    if case.busy_jobs == 0 {
        return;
    }
    if let Some(r) = observer.adapter.reclaimer()
        && let Ok(ForeignWork::None) = r.foreign_work(&[]).await
    {
        problems.push(format!(
            "RECL-34: with {} jobs vacancy did not admit, foreign_work answered None; answer Present, or CannotTell when the upstream cannot say",
            case.busy_jobs
        ));
    }
    if let Ok(true) = observer.adapter.verify_stopped().await {
        problems.push(format!(
            "DONE-04: verify_stopped proved a stop while the upstream shows {} jobs",
            case.busy_jobs
        ));
    }
}
