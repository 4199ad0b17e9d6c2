//! The admission shell: the engine behind a lock, the clock, and the
//! notifications that connect it to samplers and waiting requests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tracing::{debug, info, warn};

use crate::engine::{
    Decision, Engine, EngineError, EngineStatus, EntryId, HeldRelease, Lesson, ModelObservation,
    Refusal, ReleaseEffect, ReleaseOutcome, Reservation, UpstreamId, WorkRequest,
};
use crate::proxy::history::History;
use crate::proxy::live::LiveWork;
use crate::proxy::metrics::Metrics;
use crate::proxy::store::ReservationStore;
use crate::time::MonotonicClock;
use crate::traits::resource::{CapacitySample, SampleError};

/// The engine and everything the async shells share around it.
///
/// # Behavior
///
/// The engine lock is held only for the engine's pure calls, never across I/O.
/// A release asks each freed resource for an immediate sample (ADM-05); every
/// recorded sample wakes requests waiting for one (ADM-06).
pub struct Lender {
    engine: Mutex<Engine>,
    clock: MonotonicClock,
    sample_landed: Notify,
    sample_now: HashMap<String, Arc<Notify>>,
    observe_now: Mutex<HashMap<UpstreamId, Arc<Notify>>>,
    store: Arc<dyn ReservationStore>,
    metrics: Metrics,
    history: History,
    live: LiveWork,
    reclaim_wake: Notify,
}

impl std::fmt::Debug for Lender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lender").finish_non_exhaustive()
    }
}

impl Lender {
    /// A lender around `engine`, with one sample trigger per resource name.
    pub fn new(
        engine: Engine,
        resources: impl IntoIterator<Item = String>,
        clock: MonotonicClock,
        store: Arc<dyn ReservationStore>,
    ) -> Self {
        Lender {
            engine: Mutex::new(engine),
            clock,
            sample_landed: Notify::new(),
            sample_now: resources
                .into_iter()
                .map(|r| (r, Arc::new(Notify::new())))
                .collect(),
            observe_now: Mutex::new(HashMap::new()),
            store,
            metrics: Metrics::default(),
            history: History::default(),
            live: LiveWork::default(),
            reclaim_wake: Notify::new(),
        }
    }

    /// Run `f` with the engine locked. Keep `f` short and free of I/O.
    pub fn with_engine<R>(&self, f: impl FnOnce(&mut Engine) -> R) -> R {
        f(&mut self.lock())
    }

    fn lock(&self) -> MutexGuard<'_, Engine> {
        match self.engine.lock() {
            Ok(g) => g,
            // The engine's calls do not panic midway through a mutation they
            // leave inconsistent; keep lending rather than wedge every request.
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The clock every moment comes from.
    pub fn clock(&self) -> MonotonicClock {
        self.clock
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The recent history the owner console charts and lists.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Work in flight, for reclaims to reach (RECL-15, RECL-23).
    pub fn live(&self) -> &LiveWork {
        &self.live
    }

    /// Ask the reclaim loop to step now: presence, pressure or work changed.
    pub fn wake_reclaims(&self) {
        self.reclaim_wake.notify_one();
    }

    /// What the reclaim loop waits on besides its interval.
    pub fn reclaim_wakeup(&self) -> &Notify {
        &self.reclaim_wake
    }

    /// The reservation store.
    pub fn store(&self) -> &Arc<dyn ReservationStore> {
        &self.store
    }

    /// The trigger a resource's sampling loop waits on besides its interval.
    pub fn sample_trigger(&self, resource: &str) -> Option<Arc<Notify>> {
        self.sample_now.get(resource).cloned()
    }

    /// The trigger an upstream's observation loop waits on besides its
    /// interval: pulled when work on the upstream ends (RES-02, RES-07).
    pub fn observe_trigger(&self, upstream: UpstreamId) -> Arc<Notify> {
        let mut map = match self.observe_now.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        Arc::clone(map.entry(upstream).or_default())
    }

    /// The lesson an observation taken at `observed_at` teaches (RES-07).
    pub fn take_lesson(&self, upstream: UpstreamId, observed_at: crate::Moment) -> Option<Lesson> {
        self.with_engine(|e| e.take_lesson(upstream, observed_at))
    }

    /// Record a sampler's result and wake requests waiting for a sample.
    pub fn record_sample(
        &self,
        resource: &str,
        result: Result<CapacitySample, SampleError>,
        started: crate::Moment,
    ) {
        let outcome = self.with_engine(|e| match &result {
            Ok(sample) => e.record_sample(resource, *sample),
            Err(err) => e.record_sample_failure(resource, started, &err.to_string()),
        });
        let took = self.clock.now().since(started);
        self.metrics.sampled(resource, took, result.is_err());
        if let Ok(sample) = &result {
            self.history.sample(resource, sample);
        }
        if let Err(e) = outcome {
            warn!(resource, error = %e, "sample for an unknown resource");
        }
        if let Err(err) = &result {
            warn!(resource, error = %err, "capacity sample failed; the resource's capacity is unknown");
        }
        self.sample_landed.notify_waiters();
    }

    /// Record a model observation of an upstream.
    pub fn observe(&self, upstream: UpstreamId, observation: ModelObservation) {
        if let Err(e) = self.with_engine(|e| e.observe(upstream, observation)) {
            warn!(error = %e, "observation for an unknown upstream");
        }
    }

    /// Decide a request, waiting up to the engine's bound for a post-job
    /// sample (ADM-06), and count the outcome in the metrics.
    pub async fn admit(
        &self,
        request: &WorkRequest,
        upstream: &str,
    ) -> Result<Reservation, Refusal> {
        let outcome = self.decide(request).await;
        self.count(upstream, &outcome);
        outcome
    }

    /// Decide a request, waiting up to the engine's bound for a post-job
    /// sample (ADM-06), without counting it: for callers that may decide the
    /// same request twice (RES-20) and count once with [`count`](Self::count).
    pub async fn decide(&self, request: &WorkRequest) -> Result<Reservation, Refusal> {
        loop {
            let landed = self.sample_landed.notified();
            tokio::pin!(landed);
            landed.as_mut().enable();
            let now = self.clock.now();
            match self.with_engine(|e| e.admit(request, now)) {
                Decision::Admitted(r) => return Ok(r),
                Decision::Refused(refusal) => return Err(refusal),
                Decision::Wait { until, resources } => {
                    for r in &resources {
                        if let Some(t) = self.sample_now.get(r) {
                            t.notify_one();
                        }
                    }
                    let deadline = tokio::time::Instant::from_std(self.clock.instant(until));
                    tokio::select! {
                        () = &mut landed => {}
                        () = tokio::time::sleep_until(deadline) => {}
                    }
                }
            }
        }
    }

    /// Count and log one request's final admission outcome.
    pub fn count(&self, upstream: &str, outcome: &Result<Reservation, Refusal>) {
        match outcome {
            Ok(r) => {
                self.metrics.admitted(upstream);
                self.history.job_started(r);
                info!(entry = %r.id, upstream, model = r.model.as_deref().unwrap_or(""), resident_credit = r.resident_credit, "admitted");
            }
            Err(refusal) => {
                self.metrics.refused(upstream, refusal.code);
                debug!(upstream, code = %refusal.code, reason = %refusal.reason, "refused");
            }
        }
    }

    /// End a job: release it or hold it, and trigger post-job samples (ADM-05).
    ///
    /// The engine's release is synchronous, so it is recorded before the caller
    /// hands the borrower its last byte; the store follows in the background.
    pub fn release(&self, entry: EntryId, outcome: ReleaseOutcome) {
        let held_reason = match &outcome {
            ReleaseOutcome::Uncertain(r) => Some(r.clone()),
            _ => None,
        };
        let now = self.clock.now();
        let effect = self.with_engine(|e| e.release(entry, outcome, now));
        self.live.forget(entry);
        self.wake_reclaims();
        match effect {
            Ok(ReleaseEffect::Released {
                sample_now,
                observe_now,
            }) => {
                info!(entry = %entry, "released");
                self.history.job_ended(entry, now);
                self.after_release(entry, &sample_now, observe_now);
            }
            Ok(ReleaseEffect::Held) => {
                let reason = held_reason.unwrap_or_default();
                warn!(entry = %entry, reason = %reason, "work held: completion is uncertain; release it as an administrator once the upstream has stopped");
                let store = Arc::clone(&self.store);
                spawn_store_update(async move {
                    if let Err(e) = store.mark_held(entry, &reason).await {
                        warn!(entry = %entry, error = %e, "could not record the hold");
                    }
                });
            }
            // A reclaim proved the stop and released it first (RECL-17).
            Err(EngineError::UnknownEntry(_)) => {
                debug!(entry = %entry, "already released");
            }
            Err(e) => warn!(entry = %entry, error = %e, "release refused"),
        }
    }

    /// Release a held entry on an administrator's confirmation (HELD-04).
    pub fn release_held(&self, entry: EntryId, by: HeldRelease) -> Result<(), EngineError> {
        let now = self.clock.now();
        let effect = self.with_engine(|e| e.release_held(entry, by, now))?;
        if let ReleaseEffect::Released {
            sample_now,
            observe_now,
        } = effect
        {
            info!(entry = %entry, by = ?by, "held work released");
            self.history.job_ended(entry, now);
            self.after_release(entry, &sample_now, observe_now);
        }
        Ok(())
    }

    fn after_release(&self, entry: EntryId, resources: &[String], observe: Option<UpstreamId>) {
        for r in resources {
            if let Some(t) = self.sample_now.get(r) {
                t.notify_one();
            }
        }
        if let Some(upstream) = observe {
            self.observe_trigger(upstream).notify_one();
        }
        let store = Arc::clone(&self.store);
        spawn_store_update(async move {
            if let Err(e) = store.forget(entry).await {
                warn!(entry = %entry, error = %e, "could not remove the released record");
            }
        });
    }

    /// A snapshot of the engine.
    pub fn status(&self) -> EngineStatus {
        let now = self.clock.now();
        self.with_engine(|e| e.status(now))
    }
}

/// Run a store update on the current runtime; outside one (a shutdown), skip
/// it: the record stays, and a restart returns it as held, which is safe.
fn spawn_store_update(update: impl std::future::Future<Output = ()> + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(update);
        }
        Err(_) => warn!("no runtime to update the reservation store; the record stays"),
    }
}
