//! The async loops around the engine: sampling, observation, presence.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::engine::{ModelObservation, ObservedModel, OwnerPresence, ResidencyEvidence};
use crate::presence::PresenceBackend;
use crate::proxy::lender::Lender;
use crate::proxy::route::UpstreamRoute;
use crate::proxy::shutdown::stopped;
use crate::traits::resource::{CapacitySample, Resource, ResourceKind, SampleError};
use crate::traits::{ForeignWork, ObserveError, ReclaimError, UnloadAck};
use crate::{Moment, MonotonicClock};

/// How often the presence backend is asked.
pub const PRESENCE_EVERY: Duration = Duration::from_secs(1);

/// What the sampling and presence loops feed: the daemon's [`Lender`], or an
/// engine embedded in another program (Python's `vacancy.Driver`), so both
/// run the same loops.
pub trait LoopSink: Send + Sync {
    /// The clock samples are stamped with.
    fn clock(&self) -> MonotonicClock;
    /// What a resource's sampling loop waits on besides its interval: pulled
    /// when a job on it ends (ADM-05).
    fn sample_trigger(&self, resource: &str) -> Option<Arc<Notify>>;
    /// A sampler's result, started at `started`; a failure makes the
    /// resource's capacity unknown until a later success.
    fn record_sample(
        &self,
        resource: &str,
        result: Result<CapacitySample, SampleError>,
        started: Moment,
    );
    /// What the presence backend said; returns whether it changed.
    fn set_owner(&self, presence: OwnerPresence) -> bool;
}

impl LoopSink for Lender {
    fn clock(&self) -> MonotonicClock {
        Lender::clock(self)
    }
    fn sample_trigger(&self, resource: &str) -> Option<Arc<Notify>> {
        Lender::sample_trigger(self, resource)
    }
    fn record_sample(
        &self,
        resource: &str,
        result: Result<CapacitySample, SampleError>,
        started: Moment,
    ) {
        Lender::record_sample(self, resource, result, started);
    }
    fn set_owner(&self, presence: OwnerPresence) -> bool {
        Lender::set_owner(self, presence) // a change wakes the reclaim loop (OWN-01)
    }
}

/// How long one sample of a resource polled every `poll` may take: the
/// interval, within 2 to 10 s.
pub fn sample_timeout(poll: Duration) -> Duration {
    poll.max(Duration::from_secs(2))
        .min(Duration::from_secs(10))
}

/// The sampler a `[[resource]]` configures; one that cannot be built here
/// (no NVML, no card, a `manual` resource) fails every sample with the
/// reason, so its capacity stays unknown and `/status` says why.
pub fn sampler_for(
    config: &crate::config::ResourceConfig,
    clock: MonotonicClock,
) -> Arc<dyn Resource> {
    match crate::sample::from_config(config, clock) {
        Ok(s) => s,
        Err(e) => {
            error!(resource = %config.name, error = %e, "cannot sample this resource; its work is refused with capacity_unknown");
            Arc::new(UnavailableResource::new(&config.name, config.kind, &e))
        }
    }
}

/// Take one sample of `resource` within `timeout` and record it; returns the
/// sample, or why it failed.
pub async fn sample_once<S: LoopSink + ?Sized>(
    sink: &S,
    resource: &dyn Resource,
    timeout: Duration,
) -> Result<CapacitySample, String> {
    let started = sink.clock().now();
    let result = match tokio::time::timeout(timeout, resource.sample()).await {
        Ok(r) => r,
        Err(_) => Err(SampleError::Unreadable {
            source_name: resource.id().to_owned(),
            reason: format!("no answer within {} ms", timeout.as_millis()),
        }),
    };
    let outcome = result.as_ref().copied().map_err(ToString::to_string);
    sink.record_sample(resource.id(), result, started);
    outcome
}

/// Sample `resource` every `poll` and whenever a job on it ends (ADM-05).
/// The caller takes the first sample before the loop starts.
///
/// A sample that fails or does not answer within `timeout` is recorded as a
/// failure: the resource's capacity is unknown until a later success.
pub async fn sample_loop<S: LoopSink + ?Sized>(
    sink: Arc<S>,
    resource: Arc<dyn Resource>,
    poll: Duration,
    timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let name = resource.id().to_owned();
    let Some(trigger) = sink.sample_trigger(&name) else {
        warn!(resource = %name, "no sample trigger for this resource; not sampling it");
        return;
    };
    loop {
        tokio::select! {
            () = tokio::time::sleep(poll) => {}
            () = trigger.notified() => debug!(resource = %name, "post-job sample"),
            () = stopped(&mut shutdown) => return,
        }
        // A failure is recorded (capacity unknown) and logged by the sink.
        let _ = sample_once(&*sink, &*resource, timeout).await;
    }
}

/// A resource whose sampler could not be built: every sample fails with the
/// reason, so its capacity stays unknown and `/status` says why.
pub struct UnavailableResource {
    name: String,
    kind: ResourceKind,
    reason: String,
}

impl UnavailableResource {
    /// A stand-in for a sampler that failed to start.
    pub fn new(name: &str, kind: ResourceKind, error: &SampleError) -> Self {
        UnavailableResource {
            name: name.to_owned(),
            kind,
            reason: error.to_string(),
        }
    }
}

#[async_trait]
impl Resource for UnavailableResource {
    fn id(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> ResourceKind {
        self.kind
    }
    async fn sample(&self) -> Result<CapacitySample, SampleError> {
        Err(SampleError::Unavailable(self.reason.clone()))
    }
}

/// What `/status` shows about an upstream's server, from the observation loop.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct UpstreamHealth {
    /// Whether the server answered the last check; `None` before the first.
    pub reachable: Option<bool>,
    /// Why the last check failed.
    pub error: Option<String>,
    /// The models the last observation showed loaded.
    pub models: Vec<String>,
    /// The residency evidence of the last observation, per model.
    pub residency: Vec<String>,
}

/// Shared, updatable health of one upstream.
#[derive(Debug, Default)]
pub struct HealthCell(Mutex<UpstreamHealth>);

impl HealthCell {
    /// The latest health.
    pub fn get(&self) -> UpstreamHealth {
        match self.0.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn set(&self, health: UpstreamHealth) {
        match self.0.lock() {
            Ok(mut g) => *g = health,
            Err(p) => *p.into_inner() = health,
        }
    }
}

/// Observe an upstream once and give the observation to the engine: what the
/// observation loop and the RES-20 refusal path both do.
///
/// # Behavior
///
/// When the observation is the first one after a request of a known kind
/// finished, with nothing admitted since, the adapter learns from it first
/// (RES-07) and the engine gets the evidence that lesson changed.
pub async fn observe_upstream(
    lender: &Lender,
    route: &UpstreamRoute,
) -> Result<ModelObservation, ObserveError> {
    let mut obs = route.adapter.observe().await?;
    if let Some(lesson) = lender.take_lesson(route.id, obs.taken_at) {
        route.adapter.learn(&lesson, &mut obs).await;
    }
    lender.observe(route.id, obs.clone());
    Ok(obs)
}

/// What a yield did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Yielded {
    /// The upstream acknowledged the unload (never proof of freed memory).
    Unloaded(UnloadAck),
    /// The upstream holds work vacancy did not admit: no unload (RECL-34).
    Skipped,
}

/// The log line of a skipped unload, as the seed words it (RECL-37).
pub const UNLOAD_SKIPPED: &str =
    "model unload skipped; the upstream holds work vacancyd did not admit";

/// Ask an upstream to unload its models (a yield, for reclaim).
///
/// # Behavior
///
/// - Uses the adapter's [`Reclaimer`](crate::traits::Reclaimer); an adapter
///   without one is [`ReclaimError::Unsupported`].
/// - First asks whether the upstream holds work other than `own` (the
///   upstream handles of vacancy's work on the same server, RECL-35): work
///   vacancy did not admit skips the unload, logged as [`UNLOAD_SKIPPED`]
///   without prompt IDs (RECL-34, RECL-37); when it cannot be told, the
///   unload goes ahead and the reason is logged (RECL-38, RECL-39).
/// - An acknowledgement is counted in `vacancyd_yields_total{upstream}`
///   (OBS-04) and disturbs the upstream's resources: residency proofs taken
///   before it no longer hold and new work waits for a fresh sample
///   (RECL-45). It releases nothing and is never counted as recovered
///   memory (RECL-49).
pub async fn yield_upstream(
    lender: &Lender,
    route: &UpstreamRoute,
    own: &[String],
) -> Result<Yielded, ReclaimError> {
    let Some(reclaimer) = route.adapter.reclaimer() else {
        return Err(ReclaimError::Unsupported(format!(
            "the {} adapter cannot unload models",
            route.adapter.name()
        )));
    };
    match reclaimer.foreign_work(own).await {
        Ok(ForeignWork::Present) => {
            info!(upstream = %route.name, "{UNLOAD_SKIPPED}");
            return Ok(Yielded::Skipped);
        }
        Ok(ForeignWork::None) => {}
        Ok(ForeignWork::CannotTell(why)) => {
            info!(upstream = %route.name, reason = %why, "unloading without knowing whose work the upstream holds");
        }
        Err(e) => {
            info!(upstream = %route.name, reason = %e, "unloading without knowing whose work the upstream holds");
        }
    }
    unload_upstream(lender, route).await
}

/// Ask an upstream to unload its models without first asking whose work it
/// holds: for when that cannot be told (RECL-38), with the reason logged by
/// the caller. Counts and records an acknowledgement as [`yield_upstream`] does.
pub async fn unload_upstream(
    lender: &Lender,
    route: &UpstreamRoute,
) -> Result<Yielded, ReclaimError> {
    let Some(reclaimer) = route.adapter.reclaimer() else {
        return Err(ReclaimError::Unsupported(format!(
            "the {} adapter cannot unload models",
            route.adapter.name()
        )));
    };
    let ack = reclaimer.unload().await;
    match &ack {
        Ok(UnloadAck::Acknowledged { models }) => {
            lender.metrics().yielded(&route.name);
            let now = lender.clock().now();
            if let Err(e) = lender.with_engine(|e| e.record_yield(route.id, now)) {
                warn!(upstream = %route.name, error = %e, "yield for an unknown upstream");
            }
            match models {
                Some(n) => {
                    info!(upstream = %route.name, models = n, "upstream acknowledged the unload (not proof of freed memory)")
                }
                None => {
                    info!(upstream = %route.name, "upstream acknowledged the unload (not proof of freed memory)")
                }
            }
        }
        Err(e) => warn!(upstream = %route.name, error = %e, "unload failed"),
    }
    ack.map(Yielded::Unloaded)
}

/// How `/status` describes one observed model's residency (RES-22).
pub fn describe_residency(m: &ObservedModel) -> String {
    let mut loaded = String::new();
    if let Some(ctx) = m.context_length {
        loaded.push_str(&format!(", context {ctx}"));
    }
    if let Some(digest) = &m.digest {
        let short: String = digest
            .trim_start_matches("sha256:")
            .chars()
            .take(12)
            .collect();
        loaded.push_str(&format!(", digest {short}"));
    }
    let state = if m.ready { "loaded" } else { "loading" };
    match &m.evidence {
        ResidencyEvidence::Proven => format!("{}: {state}{loaded}; resident", m.name),
        ResidencyEvidence::ProvenFor { kinds, otherwise } if kinds.is_empty() => {
            format!("{}: {state}{loaded}; not proven ({otherwise})", m.name)
        }
        ResidencyEvidence::ProvenFor { kinds, .. } => format!(
            "{}: {state}{loaded}; resident for {}",
            m.name,
            kinds.join("; ")
        ),
        ResidencyEvidence::NotProven(why) => {
            format!("{}: {state}{loaded}; not proven ({why})", m.name)
        }
    }
}

/// Observe an upstream every `every`, and at once when work on it ends:
/// loaded models and residency evidence feed the engine; reachability feeds
/// `/status`.
pub async fn observe_loop(
    lender: Arc<Lender>,
    route: Arc<UpstreamRoute>,
    health: Arc<HealthCell>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut was_reachable: Option<bool> = None;
    // The observation failure last logged while the upstream answers: each
    // new one is logged once, not every poll, and so is the recovery.
    let mut failing: Option<String> = None;
    let trigger = lender.observe_trigger(route.id);
    loop {
        let next = match observe_upstream(&lender, &route).await {
            Ok(obs) => UpstreamHealth {
                reachable: Some(true),
                error: None,
                models: obs.models.iter().map(|m| m.name.clone()).collect(),
                residency: obs.models.iter().map(describe_residency).collect(),
            },
            Err(ObserveError::Unsupported) => {
                let addr = (route.target.host.as_str(), route.target.port);
                match tokio::time::timeout(
                    Duration::from_secs(2),
                    tokio::net::TcpStream::connect(addr),
                )
                .await
                {
                    Ok(Ok(_)) => UpstreamHealth {
                        reachable: Some(true),
                        ..UpstreamHealth::default()
                    },
                    Ok(Err(e)) => unreachable(e.to_string()),
                    Err(_) => unreachable("no connection within 2 s".to_owned()),
                }
            }
            Err(ObserveError::Unreachable(e)) => unreachable(e),
            Err(e) => UpstreamHealth {
                reachable: Some(true),
                error: Some(e.to_string()),
                ..UpstreamHealth::default()
            },
        };
        if next.reachable != was_reachable {
            match next.reachable {
                Some(true) => info!(upstream = %route.name, "upstream reachable"),
                _ => {
                    warn!(upstream = %route.name, error = next.error.as_deref().unwrap_or(""), "upstream unreachable")
                }
            }
            was_reachable = next.reachable;
        }
        let answering_error = next.error.as_ref().filter(|_| next.reachable == Some(true));
        match (answering_error, &failing) {
            (Some(error), Some(last)) if error == last => {
                debug!(upstream = %route.name, error = %error, "observation still fails");
            }
            (Some(error), _) => {
                warn!(upstream = %route.name, error = %error, "observation failed: the upstream answers, but vacancyd cannot read its models or work from the answer (logged again only when the error changes)");
                failing = Some(error.clone());
            }
            (None, Some(_)) => {
                if next.reachable == Some(true) {
                    info!(upstream = %route.name, "observation works again");
                }
                failing = None;
            }
            (None, None) => {}
        }
        lender.metrics().observed(&route.name, next.error.is_some());
        health.set(next);
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = trigger.notified() => debug!(upstream = %route.name, "post-job observation"),
            () = stopped(&mut shutdown) => return,
        }
    }
}

fn unreachable(error: String) -> UpstreamHealth {
    UpstreamHealth {
        reachable: Some(false),
        error: Some(error),
        ..UpstreamHealth::default()
    }
}

/// Ask the presence backend every `every` and give the answer to the engine;
/// a change wakes the reclaim loop at once.
pub async fn presence_loop<S: LoopSink + ?Sized>(
    sink: Arc<S>,
    backend: Arc<dyn PresenceBackend>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last: Option<OwnerPresence> = None;
    loop {
        let presence = backend.presence().await;
        sink.set_owner(presence);
        if last != Some(presence) {
            info!(
                backend = backend.name(),
                presence = presence.as_str(),
                "owner presence"
            );
            last = Some(presence);
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stopped(&mut shutdown) => return,
        }
    }
}
