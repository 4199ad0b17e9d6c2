//! The admission shell: the engine behind a lock, the clock, and the
//! notifications that connect it to samplers and waiting requests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tracing::{debug, info, warn};

use crate::auth::BorrowerKeys;
use crate::config::BorrowersConfig;
use crate::engine::{
    BorrowerSpecError, Decision, Effect, Engine, EngineError, EngineStatus, EntryId, HeldRelease,
    LendingHours, Lesson, ModelObservation, OwnerPresence, Phase, PowerSource, Refusal,
    RefusalCode, Release, ReleaseOutcome, Reservation, UpstreamId, Vacancy, WorkRequest,
};
use crate::ledger::store::{ReservationStore, StoreChange, StoreError, StoreFailure, StoreWrite};
use crate::shell::state::awake_wait::{SyncPace, ready_while_awake};
use crate::shell::state::gate::BorrowerGate;
use crate::shell::state::history::History;
use crate::shell::state::live::LiveWork;
use crate::shell::state::metrics::{self, Metrics};
use crate::shell::state::observe_trigger::ObserveTrigger;
use crate::shell::state::post_job::{PostJobSampler, SampleAsk, SampleRecorder};
use crate::time::MonotonicClock;
use crate::traits::resource::{CapacitySample, SampleError};

/// The engine and everything the async shells share around it.
///
/// # Behavior
///
/// The engine lock is held only for the engine's pure calls, never across I/O.
/// Every call drains the engine's [`Effect`]s in one place (the private
/// `engine_call`): ledger effects are submitted to the
/// store under the lock, so the store's order is the engine's, and awaited
/// outside it; wake-ups fire after the lock. A release asks each freed
/// resource for an immediate sample (ADM-05); every recorded sample wakes
/// requests waiting for one (ADM-06).
pub struct Lender {
    engine: Mutex<Engine>,
    clock: MonotonicClock,
    sample_landed: Notify,
    sample_now: HashMap<String, Arc<Notify>>,
    /// Where set, post-job samples are taken where the job ended
    /// ([`post_job`](crate::shell::state::post_job)), not by the loop.
    post_job: std::sync::OnceLock<PostJobSamples>,
    observe_now: Mutex<HashMap<UpstreamId, Arc<ObserveTrigger>>>,
    store: Arc<dyn ReservationStore>,
    metrics: Metrics,
    history: History,
    live: LiveWork,
    reclaim_wake: Notify,
    /// Pulled when work is admitted or ends: the power cap (issue 35) follows it.
    work_changed: Notify,
    /// Named borrowers' keys (issue 34); unset: every borrower is anonymous.
    gate: std::sync::OnceLock<Arc<BorrowerGate>>,
    /// How long admissions wait for their record's sync here.
    sync_pace: Arc<SyncPace>,
}

/// The post-job samplers and the lender they record into.
struct PostJobSamples {
    lender: std::sync::Weak<dyn SampleRecorder>,
    samplers: HashMap<String, Arc<PostJobSampler>>,
}

impl SampleRecorder for Lender {
    fn clock(&self) -> MonotonicClock {
        self.clock
    }
    fn record_sample(
        &self,
        resource: &str,
        result: Result<CapacitySample, SampleError>,
        started: crate::Moment,
    ) {
        Lender::record_sample(self, resource, result, started);
    }
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
        let mut engine = engine;
        // What the engine decided before it had a lender: ledger changes are
        // queued in the store now (it queues on submission, so the futures
        // may go); wake-ups have nobody to wake yet.
        while let Some(effect) = engine.poll_effect() {
            if let Some(change) = StoreChange::of_effect(effect) {
                drop(store.submit(change));
            }
        }
        Lender {
            engine: Mutex::new(engine),
            clock,
            sample_landed: Notify::new(),
            sample_now: resources
                .into_iter()
                .map(|r| (r, Arc::new(Notify::new())))
                .collect(),
            post_job: std::sync::OnceLock::new(),
            observe_now: Mutex::new(HashMap::new()),
            store,
            metrics: Metrics::default(),
            history: History::default(),
            live: LiveWork::default(),
            reclaim_wake: Notify::new(),
            work_changed: Notify::new(),
            gate: std::sync::OnceLock::new(),
            sync_pace: Arc::default(),
        }
    }

    /// Put named borrowers' keys at the proxy's door (issue 34), once, at
    /// start. The engine has their table already ([`Engine::set_borrowers`],
    /// before the ledger opens, so restored entries find their borrowers); a
    /// keys file reload changes both through
    /// [`reload_borrowers`](Self::reload_borrowers).
    pub fn open_borrower_gate(&self, keys: BorrowerKeys, config: &BorrowersConfig) {
        self.gate
            .get_or_init(|| Arc::new(BorrowerGate::new(keys, config)));
    }

    /// Replace the borrowers' keys and terms (a keys file reload): each name
    /// that stays keeps its use, budgets and turns.
    ///
    /// # Errors
    ///
    /// The engine refused the table; the old one stays in force.
    pub fn reload_borrowers(
        &self,
        keys: BorrowerKeys,
        config: &BorrowersConfig,
    ) -> Result<(), BorrowerSpecError> {
        let spec = keys.spec(config);
        self.with_engine(|e| e.set_borrowers(Some(spec)))?;
        if let Some(gate) = self.gate.get() {
            gate.replace_keys(keys);
        }
        Ok(())
    }

    /// The borrowers' door, with named borrowers on.
    pub fn borrower_gate(&self) -> Option<&Arc<BorrowerGate>> {
        self.gate.get()
    }

    /// Anchor the engine's timeline to the wall clock now (budgets count UTC
    /// days and weeks; accounting rows carry Unix times).
    pub fn anchor_wall_clock(&self) {
        let now = self.clock.now();
        let unix_ms = crate::time::unix_ms_now();
        self.with_engine(|e| e.set_wall_clock(now, unix_ms));
    }

    /// Borrower `name`'s own view (`/v1/vacancy/me`): its use, limits,
    /// budgets and its waiting requests' places in line.
    pub fn borrower_view(&self, name: &str) -> Option<serde_json::Value> {
        let now = self.clock.now();
        let engine = self.lock();
        let status = engine.borrower_status(name, now)?;
        let line: Vec<serde_json::Value> = engine
            .borrower_line(name, now)
            .into_iter()
            .map(|(upstream, position)| {
                serde_json::json!({"upstream": upstream, "position": position})
            })
            .collect();
        let mut v = serde_json::to_value(status).ok()?;
        if let Some(o) = v.as_object_mut() {
            o.insert("line".to_owned(), serde_json::Value::Array(line));
        }
        Some(v)
    }

    /// Run `f` with the engine locked and apply what it decided. Keep `f`
    /// short and free of I/O. Inside the crate only: what the control plane
    /// may change goes through the typed methods below.
    pub(crate) fn with_engine<R>(&self, f: impl FnOnce(&mut Engine) -> R) -> R {
        let (out, writes) = self.engine_call(f);
        for write in writes {
            write.in_background();
        }
        out
    }

    /// The one place the engine's effects are applied: run `f` under the
    /// lock, submit each ledger effect to the store in the engine's order
    /// before the lock is let go, then fire the wake-ups. Returns the
    /// submitted writes, for the caller to await outside the lock.
    fn engine_call<R>(&self, f: impl FnOnce(&mut Engine) -> R) -> (R, Vec<LedgerWrite>) {
        self.engine_call_recorded(f, None)
    }

    /// [`engine_call`](Self::engine_call), where the caller has recorded
    /// `recorded` itself already (an acknowledged release, which must be on
    /// disk before the engine frees anything): that effect is not submitted
    /// twice.
    fn engine_call_recorded<R>(
        &self,
        f: impl FnOnce(&mut Engine) -> R,
        recorded: Option<&Effect>,
    ) -> (R, Vec<LedgerWrite>) {
        let mut writes = Vec::new();
        let mut wakes = Wakes::default();
        let mut work_changed = false;
        let out = {
            let mut engine = self.lock();
            let out = f(&mut engine);
            while let Some(effect) = engine.poll_effect() {
                if recorded == Some(&effect) {
                    continue;
                }
                // Exhaustive: a new effect does not compile until the
                // lender says what it does with it.
                match effect {
                    Effect::Sample(resource) => wakes.sample.push(resource),
                    Effect::Observe(upstream) => wakes.observe.push(upstream),
                    Effect::WakeReclaims => wakes.reclaims = true,
                    Effect::WakeWaiters => wakes.waiters = true,
                    // The owner's record of a borrower's reservation (issue
                    // 34 item 4) goes through the store, ahead of its release.
                    ledger @ (Effect::Persist(_)
                    | Effect::Account(_)
                    | Effect::MarkHeld { .. }
                    | Effect::RewriteRef { .. }
                    | Effect::Forget(_)) => {
                        if let Some(change) = StoreChange::of_effect(ledger) {
                            work_changed |=
                                matches!(change, StoreChange::Admit(_) | StoreChange::Release(_));
                            writes.push(LedgerWrite {
                                record: Record::of(&change),
                                write: self.store.submit(change),
                            });
                        }
                    }
                }
            }
            out
        };
        for resource in &wakes.sample {
            self.sample_soon(resource, SampleAsk::JobEnded);
        }
        for upstream in wakes.observe {
            self.observe_trigger(upstream).job_ended();
        }
        if wakes.reclaims {
            self.wake_reclaims();
        }
        if work_changed {
            self.work_changed.notify_waiters();
        }
        if wakes.waiters {
            // Waiters wait on the same signal as a post-job sample: either
            // may change their decision.
            self.sample_landed.notify_waiters();
        }
        (out, writes)
    }

    /// The engine's handle of the upstream called `name`.
    pub fn upstream_id(&self, name: &str) -> Option<UpstreamId> {
        self.lock().upstream_id(name)
    }

    /// The upstream's vacancy sign now: whether its default budget would be
    /// admitted, else the refusal (what `/status` shows).
    pub fn vacancy(&self, upstream: UpstreamId) -> Vacancy {
        let now = self.clock.now();
        self.lock().vacancy(upstream, now)
    }

    /// Switch lending on or off (the owner's switch).
    pub fn set_lending(&self, enabled: bool) {
        self.with_engine(|e| e.set_lending(enabled));
    }

    /// Switch one resource's lending on or off.
    ///
    /// # Errors
    ///
    /// [`EngineError`] when no resource has that name.
    pub fn set_resource_enabled(&self, resource: &str, enabled: bool) -> Result<(), EngineError> {
        self.with_engine(|e| e.set_resource_enabled(resource, enabled))
    }

    /// The lending hours as the hours loop projected them (issue 35);
    /// `None`: lend at all hours.
    pub fn set_lending_hours(&self, hours: Option<LendingHours>) {
        self.with_engine(|e| e.set_lending_hours(hours));
    }

    /// What the power supply reads (issue 35; `None`: the term is off).
    /// Returns whether it changed.
    pub fn set_power(&self, power: Option<PowerSource>) -> bool {
        self.with_engine(|e| {
            let changed = e.power() != power.as_ref();
            e.set_power(power);
            changed
        })
    }

    /// Whether any work entry (forwarding, tracking or held) holds `resource`.
    pub fn resource_held(&self, resource: &str) -> bool {
        self.lock().resource_held(resource)
    }

    /// What the power cap waits on besides its interval: pulled when work
    /// is admitted or ends.
    pub fn work_changed(&self) -> &Notify {
        &self.work_changed
    }

    /// The owner's presence now.
    pub fn owner(&self) -> OwnerPresence {
        self.lock().owner()
    }

    /// Record the owner's presence; a change wakes the reclaim loop, since
    /// an owner coming back may start reclaims (OWN-01). Returns whether it
    /// changed.
    pub fn set_owner(&self, presence: OwnerPresence) -> bool {
        self.with_engine(|engine| {
            let before = engine.owner();
            engine.set_owner(presence);
            before != presence
        })
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

    /// Take post-job samples of these resources where each job ends, on
    /// that thread's runtime, instead of through their sampling loops (once,
    /// at start; see [`post_job`](crate::shell::state::post_job)).
    pub fn sample_where_jobs_end(self: &Arc<Self>, samplers: Vec<Arc<PostJobSampler>>) {
        let lender: std::sync::Weak<Lender> = Arc::downgrade(self);
        let samples = PostJobSamples {
            lender,
            samplers: samplers
                .into_iter()
                .map(|s| (s.resource_id().to_owned(), s))
                .collect(),
        };
        if self.post_job.set(samples).is_err() {
            warn!("post-job samplers were set already; keeping the first");
        }
    }

    /// A sample of `resource` now: where the job ended when it can be,
    /// else through the resource's sampling loop.
    pub(crate) fn sample_soon(&self, resource: &str, ask: SampleAsk) {
        let started = self.post_job.get().is_some_and(|p| {
            p.samplers
                .get(resource)
                .is_some_and(|s| s.trigger(&p.lender, ask))
        });
        if !started && let Some(t) = self.sample_now.get(resource) {
            t.notify_one();
        }
    }

    /// The trigger a resource's sampling loop waits on besides its interval.
    pub fn sample_trigger(&self, resource: &str) -> Option<Arc<Notify>> {
        self.sample_now.get(resource).cloned()
    }

    /// The trigger an upstream's observation loop waits on besides its
    /// interval: pulled when work on the upstream ends (RES-02, RES-07).
    pub fn observe_trigger(&self, upstream: UpstreamId) -> Arc<ObserveTrigger> {
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
    /// sample (ADM-06). Nothing is counted here: the request path counts
    /// each request once, by its final outcome (`shell::proxy::arrival`).
    ///
    /// An admission's record is queued in the store under the engine lock, so
    /// the store's order is the engine's; the caller awaits
    /// [`Recording::recorded`] before forwarding (REC-01).
    pub async fn decide(&self, request: &WorkRequest) -> Decided {
        self.decide_in_line(request).await.0
    }

    /// [`decide`](Self::decide), also saying how long the request waited in
    /// its upstream's wait line, if it did (issue 22). A request whose future
    /// is dropped while it waits (the borrower left) leaves the line.
    pub async fn decide_in_line(
        &self,
        request: &WorkRequest,
    ) -> (Decided, Option<std::time::Duration>) {
        let mut seat = self.seat(request);
        let decided = self.decide_seated(request, &mut seat).await;
        let waited = seat.finish(&decided);
        (decided, waited)
    }

    /// The place of `request` in its upstream's wait line, held across its
    /// decisions ([`decide_seated`](Self::decide_seated)): a request decided
    /// twice (RES-20) keeps the place it took the first time. Dropped — the
    /// borrower left, or the caller is done — it leaves the line.
    pub fn seat(&self, request: &WorkRequest) -> Seat<'_> {
        self.seat_since(request, tokio::time::Instant::now())
    }

    /// [`seat`](Self::seat) for a request whose deciding began `since`:
    /// its first decision is timed from there (the `admit` phase) instead
    /// of from one more clock reading (issue 31).
    pub fn seat_since(&self, request: &WorkRequest, since: tokio::time::Instant) -> Seat<'_> {
        Seat {
            lender: self,
            entry: request.id,
            upstream: request.upstream,
            deciding: Some(since),
            joined: None,
            position: None,
        }
    }

    fn upstream_name(&self, upstream: UpstreamId) -> Option<String> {
        self.lock().upstream_name(upstream).map(str::to_owned)
    }

    /// Decide `request` from its `seat` (see [`decide`](Self::decide)).
    pub async fn decide_seated(&self, request: &WorkRequest, seat: &mut Seat<'_>) -> Decided {
        let deciding = seat
            .deciding
            .take()
            .unwrap_or_else(tokio::time::Instant::now);
        let mut waited = std::time::Duration::ZERO;
        loop {
            let landed = self.sample_landed.notified();
            tokio::pin!(landed);
            landed.as_mut().enable();
            let now = self.clock.now();
            let first = seat.joined.is_none();
            let ((decision, place), writes) = self.engine_call(|e| {
                let d = e.admit(request, now);
                // Where it waits, asked once: when it joins the line.
                let place = if first && e.in_line(request.id) {
                    Some(e.line_position(request.id, now).map_or(1, |n| n + 1))
                } else {
                    None
                };
                (d, place)
            });
            if let Some(place) = place {
                seat.joined = Some(std::time::Instant::now());
                seat.position = Some(place);
            }
            let step = match decision {
                Decision::Admitted(reservation) => Step::Admitted(Recording {
                    write: persisted(&reservation, writes),
                    reservation,
                    pace: Arc::clone(&self.sync_pace),
                }),
                Decision::Refused(refusal) => Step::Decided(Decided::Refused(refusal)),
                Decision::Reobserve(refusal) => Step::Decided(Decided::Reobserve(refusal)),
                Decision::Wait { until, resources } => Step::Wait(until, resources),
            };
            let (until, resources) = match step {
                Step::Admitted(admission) => {
                    self.metrics.phase(
                        metrics::RequestPhase::Admit,
                        deciding.elapsed().saturating_sub(waited),
                    );
                    if !waited.is_zero() {
                        self.metrics
                            .phase(metrics::RequestPhase::PostJobSample, waited);
                    }
                    return Decided::Admitted(admission);
                }
                Step::Decided(decided) => return decided,
                Step::Wait(until, resources) => (until, resources),
            };
            for r in &resources {
                self.sample_soon(r, SampleAsk::Waiting);
            }
            let deadline = tokio::time::Instant::from_std(self.clock.instant(until));
            let waiting = tokio::time::Instant::now();
            tokio::select! {
                () = &mut landed => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
            waited += waiting.elapsed();
        }
    }

    /// Tracked work's reply came and its tracker follows the job now (the
    /// engine's phase turns `tracking`).
    pub fn start_tracking(&self, entry: EntryId) {
        if let Err(e) = self.with_engine(|e| e.start_tracking(entry)) {
            warn!(entry = %entry, error = %e, "could not mark the entry as tracked");
        }
    }

    /// A cut response's entry waits for the upstream's proof that the job
    /// stopped (the engine's phase turns `verifying`).
    pub fn start_verifying(&self, entry: EntryId) {
        if let Err(e) = self.with_engine(|e| e.start_verifying(entry)) {
            warn!(entry = %entry, error = %e, "could not mark the entry as verifying");
        }
    }

    /// End a job: release it or hold it, and trigger post-job samples (ADM-05).
    ///
    /// The engine's release is synchronous, so it is recorded before the caller
    /// hands the borrower its last byte. Its record is queued in the store
    /// under the same engine lock, so it reaches the journal before any later
    /// admission that reuses the resources; the write itself completes in the
    /// background.
    pub fn release(&self, entry: EntryId, outcome: ReleaseOutcome) {
        let held_reason = match &outcome {
            ReleaseOutcome::Uncertain(r) => Some(r.clone()),
            _ => None,
        };
        let now = self.clock.now();
        let released = self.with_engine(|e| e.release(entry, outcome, now));
        self.live.forget(entry);
        match released {
            Ok(Release::Freed) => {
                info!(entry = %entry, "released");
                self.history.job_ended(entry, now);
            }
            Ok(Release::Held) => {
                let reason = held_reason.unwrap_or_default();
                warn!(entry = %entry, reason = %reason, "work held: completion is uncertain; release it as an administrator once the upstream has stopped");
            }
            // A reclaim proved the stop and released it first (RECL-17).
            Err(EngineError::UnknownEntry(_)) => {
                debug!(entry = %entry, "already released");
            }
            Err(e) => warn!(entry = %entry, error = %e, "release refused"),
        }
    }

    /// Release a held entry on an administrator's confirmation (HELD-04) or
    /// tracking proof, once its release is durable.
    ///
    /// # Behavior
    ///
    /// The release record is written and synced *before* the engine frees the
    /// entry, so an acknowledged release survives a crash; if it cannot be
    /// written the entry stays held and the error says so. Meanwhile the
    /// entry keeps its resources, so no admission can reuse them before the
    /// record is on disk; the engine's own `Forget` that follows is not
    /// submitted again.
    pub async fn release_held(
        &self,
        entry: EntryId,
        by: HeldRelease,
    ) -> Result<(), HeldReleaseError> {
        let write = self.with_engine(|e| match e.phase(entry) {
            None => Err(EngineError::UnknownEntry(entry)),
            Some(Phase::Held) => Ok(self.store.forget(entry)),
            Some(phase) => Err(EngineError::NotHeld {
                id: entry,
                phase: phase.as_str(),
            }),
        })?;
        write.await.map_err(HeldReleaseError::NotRecorded)?;
        let now = self.clock.now();
        let (released, writes) = self.engine_call_recorded(
            |e| e.release_held(entry, by, now),
            Some(&Effect::Forget(entry)),
        );
        for write in writes {
            write.in_background();
        }
        match released {
            Ok(()) => {
                info!(entry = %entry, by = ?by, "held work released");
                self.history.job_ended(entry, now);
                Ok(())
            }
            // Released meanwhile by the other door (tracking proof or an administrator).
            Err(EngineError::UnknownEntry(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The upstream named its own handle for an entry's work (REC-04): the
    /// record is rewritten, and then the engine carries the handle, so
    /// `/status` never shows a handle that a crash would lose (REC-03).
    /// Resolves once the rewrite is durable, or with why it is not (REC-06:
    /// the engine and the tracking go on with the upstream's handle either way).
    pub async fn set_upstream_ref(
        &self,
        entry: EntryId,
        upstream_ref: &str,
    ) -> Result<(), RecordError> {
        // Queued under the engine lock, so the store keeps the engine's order.
        let write = self.with_engine(|e| match e.phase(entry) {
            Some(_) => Ok(self.store.rewrite_ref(entry, upstream_ref)),
            None => Err(EngineError::UnknownEntry(entry)),
        })?;
        let written = write.await.map_err(RecordError::NotRecorded);
        let recorded = Effect::RewriteRef {
            entry,
            upstream_ref: upstream_ref.to_owned(),
        };
        let (set, writes) =
            self.engine_call_recorded(|e| e.set_upstream_ref(entry, upstream_ref), Some(&recorded));
        for write in writes {
            write.in_background();
        }
        set?;
        written
    }

    /// A snapshot of the engine.
    pub fn status(&self) -> EngineStatus {
        let now = self.clock.now();
        self.with_engine(|e| e.status(now))
    }
}

/// Which record a ledger write carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Record {
    Admission(EntryId),
    Hold(EntryId),
    Handle(EntryId),
    End(EntryId),
    Usage(EntryId),
}

impl Record {
    /// Which record `change` writes.
    fn of(change: &StoreChange) -> Record {
        match change {
            StoreChange::Admit(r) => Record::Admission(r.id),
            StoreChange::Held { entry, .. } => Record::Hold(*entry),
            StoreChange::Ref { entry, .. } => Record::Handle(*entry),
            StoreChange::Release(entry) => Record::End(*entry),
            StoreChange::Account(r) => Record::Usage(r.entry),
        }
    }
}

/// A ledger effect submitted to the store, on its way to disk.
struct LedgerWrite {
    record: Record,
    write: StoreWrite,
}

impl LedgerWrite {
    /// Nobody waits for this write: log its failure from a task of its own.
    /// The change is queued already; outside a runtime (a shutdown) only the
    /// log line is lost.
    fn in_background(self) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            warn!(record = ?self.record, "no runtime to watch the reservation store's write; the record is queued");
            return;
        };
        handle.spawn(async move {
            if let Err(e) = self.write.await {
                match self.record {
                    Record::End(entry) | Record::Hold(entry) => warn!(entry = %entry, error = %e.reason, "could not record the end of the work; a restart returns it as held"),
                    Record::Admission(entry) | Record::Handle(entry) => warn!(entry = %entry, error = %e.reason, "could not record the work"),
                    Record::Usage(entry) => warn!(entry = %entry, error = %e.reason, "could not record the borrower's use of the work"),
                }
            }
        });
    }
}

/// A request's place in the wait line ([`Lender::seat`]): dropped with the
/// future that decides (the borrower left), it leaves the line.
pub struct Seat<'a> {
    lender: &'a Lender,
    entry: EntryId,
    upstream: UpstreamId,
    /// When its first decision began, until that decision takes it.
    deciding: Option<tokio::time::Instant>,
    /// When it joined the line, if it did.
    joined: Option<std::time::Instant>,
    /// Its place in line when it joined, 1 being next (`vacancy-line-position`).
    pub position: Option<u32>,
}

impl Seat<'_> {
    /// Done deciding with `decided`: how long the request waited in line, if
    /// it did, counted in the metrics by outcome; the seat is given up.
    pub fn finish(self, decided: &Decided) -> Option<std::time::Duration> {
        let waited = self.joined.map(|at| at.elapsed())?;
        let outcome = match decided {
            Decided::Admitted(_) => "admitted",
            Decided::Refused(r) | Decided::Reobserve(r) if r.code == RefusalCode::ResourceBusy => {
                "timed_out"
            }
            Decided::Refused(_) | Decided::Reobserve(_) => "refused",
        };
        let upstream = self.lender.upstream_name(self.upstream);
        self.lender
            .metrics
            .line_wait(upstream.as_deref().unwrap_or(""), waited, outcome);
        Some(waited)
    }
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        if self.joined.is_some() {
            let entry = self.entry;
            self.lender.with_engine(|e| e.leave_line(entry));
        }
    }
}

/// The wake-ups gathered under the engine lock, fired after it.
#[derive(Default)]
struct Wakes {
    sample: Vec<String>,
    observe: Vec<UpstreamId>,
    reclaims: bool,
    waiters: bool,
}

/// The admission's own record among the writes an admission queued; the
/// rest (none today) go to the background.
fn persisted(reservation: &Reservation, writes: Vec<LedgerWrite>) -> StoreWrite {
    let mut own = None;
    for w in writes {
        if own.is_none() && w.record == Record::Admission(reservation.id) {
            own = Some(w.write);
        } else {
            w.in_background();
        }
    }
    let entry = reservation.id;
    own.unwrap_or_else(|| {
        Box::pin(std::future::ready(Err(StoreError {
            entry,
            reason: StoreFailure::Other("the engine queued no record for the admission".to_owned()),
        })))
    })
}

/// An admitted request whose record is queued in the store.
pub struct Recording {
    reservation: Reservation,
    write: StoreWrite,
    pace: Arc<SyncPace>,
}

impl std::fmt::Debug for Recording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recording")
            .field("reservation", &self.reservation)
            .finish_non_exhaustive()
    }
}

impl Recording {
    /// The reservation, before its record is durable.
    pub fn reservation(&self) -> &Reservation {
        &self.reservation
    }

    /// Wait until the record would survive a crash (REC-01), with the
    /// thread kept awake for about as long as a sync takes here (instead of
    /// parked until the writer's reply wakes it, issue 31). On a failure the
    /// request must not be forwarded: the refusal says so without
    /// internals, and the log gets the store's reason.
    pub async fn recorded(self) -> Result<Reservation, Refusal> {
        let Recording {
            reservation,
            mut write,
            pace,
        } = self;
        let entry = reservation.id;
        let waiting = std::time::Instant::now();
        let written = match ready_while_awake(&mut write, pace.budget()).await {
            Some(written) => written,
            None => write.await,
        };
        pace.record(waiting.elapsed());
        match written {
            Ok(()) => Ok(reservation),
            Err(e) => {
                warn!(entry = %entry, error = %e, "reservation not recorded; not forwarding");
                Err(Refusal::new(
                    RefusalCode::LedgerUnavailable,
                    "vacancyd could not record the reservation on its disk, so it did not forward the request; nothing ran. The owner's daemon log says why; retry later",
                ))
            }
        }
    }
}

/// A held entry could not be released.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeldReleaseError {
    /// The engine refused: unknown entry, or not held.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The release could not be recorded; the entry stays held.
    #[error("the release could not be recorded, so the entry stays held: {0}")]
    NotRecorded(#[source] StoreError),
}

/// A change the engine made could not be recorded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The engine refused: unknown entry.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The store could not write it.
    #[error("the change could not be recorded: {0}")]
    NotRecorded(#[source] StoreError),
}

/// One pass of [`Lender::decide`]: the engine's decision, with an admission's
/// record already queued.
enum Step {
    Admitted(Recording),
    Decided(Decided),
    Wait(crate::Moment, Vec<String>),
}

/// What the lender decided for a request, and what the proxy does next.
pub enum Decided {
    /// Admitted: await [`Recording::recorded`], then forward.
    Admitted(Recording),
    /// Refused: answer with it.
    Refused(Refusal),
    /// Refused only because the model observation was too old (RES-20):
    /// observe the upstream once more and decide again; answer with this
    /// refusal if that cannot be done.
    Reobserve(Refusal),
}

/// A lender lending one GPU, `gpu0` (1,000 MiB needed), to one upstream,
/// `llm`, with the owner away: the unit tests' common case.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn one_gpu_lender(
    clock: MonotonicClock,
    store: Arc<dyn ReservationStore>,
) -> Arc<Lender> {
    use crate::engine::{EngineSpec, OwnerPresence, ResourceSpec, UpstreamSpec};
    use crate::traits::resource::ResourceKind;
    let mut engine = Engine::new(EngineSpec {
        lending: true,
        resources: vec![ResourceSpec::new("gpu0", ResourceKind::Gpu, 1000)],
        upstreams: vec![UpstreamSpec::new("llm", "gpu0", 1000)],
    })
    .unwrap();
    engine.set_owner(OwnerPresence::Away);
    Arc::new(Lender::new(engine, ["gpu0".to_owned()], clock, store))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    /// Decide and, once admitted, wait for the durable record (REC-01).
    async fn admit_recorded(
        lender: &Lender,
        request: &WorkRequest,
    ) -> Result<Reservation, Refusal> {
        match lender.decide(request).await {
            Decided::Admitted(admission) => admission.recorded().await,
            Decided::Refused(refusal) | Decided::Reobserve(refusal) => Err(refusal),
        }
    }

    use std::sync::Mutex;

    use tokio::sync::oneshot;

    use super::*;
    use crate::ledger::store::StoreChange;

    /// A store that notes each change in submission order, and whose writes
    /// complete when the test says (or fail).
    #[derive(Default)]
    struct Recorder {
        order: Mutex<Vec<String>>,
        /// Writes of releases wait for this to be sent (or dropped: failure).
        gate: Mutex<Option<oneshot::Receiver<bool>>>,
        /// Writes of upstream handles wait for this, likewise.
        ref_gate: Mutex<Option<oneshot::Receiver<bool>>>,
    }

    impl Recorder {
        fn order(&self) -> Vec<String> {
            self.order.lock().unwrap().clone()
        }
    }

    impl ReservationStore for Recorder {
        fn submit(&self, change: StoreChange) -> StoreWrite {
            let entry = change.entry();
            let line = match &change {
                StoreChange::Admit(r) => format!("admit {}", r.id),
                StoreChange::Held { entry, .. } => format!("held {entry}"),
                StoreChange::Ref { entry, .. } => format!("ref {entry}"),
                StoreChange::Release(entry) => format!("release {entry}"),
                StoreChange::Account(r) => format!("account {}", r.entry),
            };
            self.order.lock().unwrap().push(line);
            let gate = match change {
                StoreChange::Release(_) => self.gate.lock().unwrap().take(),
                StoreChange::Ref { .. } => self.ref_gate.lock().unwrap().take(),
                _ => None,
            };
            Box::pin(async move {
                match gate {
                    None => Ok(()),
                    Some(rx) => match rx.await {
                        Ok(true) => Ok(()),
                        _ => Err(StoreError {
                            entry,
                            reason: StoreFailure::Other("No space left on device".to_owned()),
                        }),
                    },
                }
            })
        }
    }

    fn lender(store: Arc<Recorder>) -> (Arc<Lender>, UpstreamId) {
        let lender = one_gpu_lender(MonotonicClock::new(), store);
        sample(&lender);
        let up = lender.with_engine(|e| e.upstream_id("llm")).unwrap();
        (lender, up)
    }

    fn sample(lender: &Lender) {
        let now = lender.clock().now();
        lender.record_sample("gpu0", Ok(CapacitySample::memory(9000, 9000, now)), now);
    }

    async fn admit(lender: &Lender, up: UpstreamId) -> Reservation {
        let req = WorkRequest::new(up, None, lender.clock().now());
        admit_recorded(lender, &req).await.unwrap()
    }

    fn upstream_ref_of(lender: &Lender, entry: EntryId) -> Option<String> {
        let id = entry.to_string();
        let status = lender.status();
        let work = status.work.iter().find(|w| w.id == id).expect("the entry");
        work.upstream_ref.clone()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_upstream_handle_is_on_disk_before_the_engine_carries_it() {
        // REC-03, REC-04: /status (and a reclaim) may use the upstream's
        // handle only once a crash would keep it.
        let store = Arc::new(Recorder::default());
        let (written, wait) = oneshot::channel();
        *store.ref_gate.lock().unwrap() = Some(wait);
        let (lender, up) = lender(Arc::clone(&store));
        let r = admit(&lender, up).await;
        let setting = {
            let lender = Arc::clone(&lender);
            tokio::spawn(async move { lender.set_upstream_ref(r.id, "prompt-7").await })
        };
        let mut turns = 0;
        while !store.order().iter().any(|l| l.starts_with("ref ")) {
            assert!(turns < 1000, "the handle never reached the store");
            turns += 1;
            tokio::task::yield_now().await;
        }
        tokio::task::yield_now().await;
        assert_eq!(
            upstream_ref_of(&lender, r.id),
            None,
            "carried before it was on disk"
        );
        written.send(true).unwrap();
        setting.await.unwrap().unwrap();
        assert_eq!(upstream_ref_of(&lender, r.id).as_deref(), Some("prompt-7"));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_release_reaches_the_store_before_the_next_admission_on_its_resources() {
        // REC-01, REC-02 (issue 14 item 18): the store's order is the
        // engine's. A release spawned into a task of its own could reach the
        // journal after the next job's admission, and a kill -9 between the
        // two left two live records on one resource.
        let store = Arc::new(Recorder::default());
        let (lender, up) = lender(Arc::clone(&store));
        let first = admit(&lender, up).await;
        lender.release(first.id, ReleaseOutcome::Completed);
        sample(&lender);
        let second = admit(&lender, up).await;
        assert_eq!(
            store.order(),
            vec![
                format!("admit {}", first.id),
                format!("release {}", first.id),
                format!("admit {}", second.id),
            ]
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_hold_reaches_the_store_in_the_engine_order() {
        // REC-01: a hold is queued when the engine holds, before anything later.
        let store = Arc::new(Recorder::default());
        let (lender, up) = lender(Arc::clone(&store));
        let first = admit(&lender, up).await;
        lender.release(first.id, ReleaseOutcome::Uncertain("broke off".to_owned()));
        assert_eq!(
            store.order(),
            vec![format!("admit {}", first.id), format!("held {}", first.id)]
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_administrator_release_is_answered_only_once_it_is_durable() {
        // HELD-04 (issue 14 item 3): until the release is on disk the entry
        // stays held and keeps its resources; then it is released.
        let store = Arc::new(Recorder::default());
        let (tx, rx) = oneshot::channel();
        *store.gate.lock().unwrap() = Some(rx);
        let (lender, up) = lender(Arc::clone(&store));
        let first = admit(&lender, up).await;
        lender.release(first.id, ReleaseOutcome::Uncertain("broke off".to_owned()));
        let releasing = {
            let lender = Arc::clone(&lender);
            tokio::spawn(async move {
                lender
                    .release_held(first.id, HeldRelease::AdministratorConfirmed)
                    .await
            })
        };
        // The release is submitted to the store, and its write is pending.
        let submitted = format!("release {}", first.id);
        for _ in 0..1000 {
            if store.order().contains(&submitted) {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(store.order().contains(&submitted), "{:?}", store.order());
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!releasing.is_finished(), "answered before the write");
        let phase = lender.with_engine(|e| e.phase(first.id));
        assert_eq!(phase, Some(Phase::Held));
        tx.send(true).unwrap();
        releasing.await.unwrap().unwrap();
        assert_eq!(lender.with_engine(|e| e.phase(first.id)), None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_administrator_release_that_cannot_be_saved_keeps_the_entry_held() {
        // HELD-04 (issue 14 item 3): a full disk answers with an error saying
        // so, and the entry stays held.
        let store = Arc::new(Recorder::default());
        let (tx, rx) = oneshot::channel::<bool>();
        *store.gate.lock().unwrap() = Some(rx);
        let (lender, up) = lender(Arc::clone(&store));
        let first = admit(&lender, up).await;
        lender.release(first.id, ReleaseOutcome::Uncertain("broke off".to_owned()));
        drop(tx);
        let err = lender
            .release_held(first.id, HeldRelease::AdministratorConfirmed)
            .await
            .unwrap_err();
        assert!(matches!(err, HeldReleaseError::NotRecorded(_)), "{err}");
        assert!(err.to_string().contains("stays held"), "{err}");
        assert_eq!(lender.with_engine(|e| e.phase(first.id)), Some(Phase::Held));
    }

    /// A store that notes every change in submission order and yields the
    /// thread while it does, to widen any window between the engine's
    /// decision and the store's queue.
    #[derive(Default)]
    struct Journal {
        changes: Mutex<Vec<StoreChange>>,
    }

    impl ReservationStore for Journal {
        fn submit(&self, change: StoreChange) -> StoreWrite {
            std::thread::yield_now();
            self.changes.lock().unwrap().push(change);
            Box::pin(std::future::ready(Ok(())))
        }
    }

    /// Replay a journal: each entry's changes come admit first and end
    /// last, and no two live records ever hold one resource.
    fn replay(changes: &[StoreChange]) -> Result<usize, String> {
        use std::collections::HashSet;
        let mut live: HashMap<EntryId, Vec<String>> = HashMap::new();
        let mut ended: HashSet<EntryId> = HashSet::new();
        for (line, change) in changes.iter().enumerate() {
            let entry = change.entry();
            if ended.contains(&entry) {
                return Err(format!("line {line}: {change:?} after the entry's end"));
            }
            match change {
                StoreChange::Admit(r) => {
                    for c in &r.charges {
                        if let Some(other) = live.iter().find(|(_, res)| res.contains(&c.resource))
                        {
                            return Err(format!(
                                "line {line}: {entry} admitted on {} while {} still holds it",
                                c.resource, other.0
                            ));
                        }
                    }
                    live.insert(
                        entry,
                        r.charges.iter().map(|c| c.resource.clone()).collect(),
                    );
                }
                StoreChange::Held { .. } | StoreChange::Ref { .. } | StoreChange::Account(_) => {
                    if !live.contains_key(&entry) {
                        return Err(format!("line {line}: {change:?} before its admission"));
                    }
                }
                StoreChange::Release(_) => {
                    if live.remove(&entry).is_none() {
                        return Err(format!(
                            "line {line}: release of {entry} before its admission"
                        ));
                    }
                    ended.insert(entry);
                }
            }
        }
        Ok(changes.len())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn releases_holds_and_admissions_reach_the_journal_in_the_engines_order() {
        // REC-01, REC-02 (issue 16 item 2): borrowers on four threads race
        // a release against the next admission and a hold against an
        // administrator's release. The engine lends gpu0 to one job at a
        // time; the journal, replayed, must never show two live records on
        // it, nor a change after its entry's end.
        let store = Arc::new(Journal::default());
        let (lender, up) = {
            let lender = one_gpu_lender(
                MonotonicClock::new(),
                Arc::clone(&store) as Arc<dyn ReservationStore>,
            );
            let up = lender.upstream_id("llm").unwrap();
            (lender, up)
        };
        // The post-job sampler (ADM-04/05).
        let sampler = {
            let lender = Arc::clone(&lender);
            let trigger = lender.sample_trigger("gpu0").unwrap();
            tokio::spawn(async move {
                loop {
                    sample(&lender);
                    trigger.notified().await;
                }
            })
        };
        let mut borrowers = Vec::new();
        for b in 0..8u32 {
            let lender = Arc::clone(&lender);
            borrowers.push(tokio::spawn(async move {
                let mut done = 0;
                let mut n = 0u32;
                while done < 25 {
                    n += 1;
                    let req = WorkRequest::new(up, None, lender.clock().now());
                    let Ok(r) = admit_recorded(&lender, &req).await else {
                        tokio::task::yield_now().await;
                        continue;
                    };
                    done += 1;
                    if (n + b).is_multiple_of(3) {
                        lender.release(r.id, ReleaseOutcome::Uncertain("broke off".to_owned()));
                        lender
                            .release_held(r.id, HeldRelease::AdministratorConfirmed)
                            .await
                            .unwrap();
                    } else {
                        lender.release(r.id, ReleaseOutcome::Completed);
                    }
                }
            }));
        }
        for b in borrowers {
            b.await.unwrap();
        }
        sampler.abort();
        let changes = store.changes.lock().unwrap().clone();
        let admitted = changes
            .iter()
            .filter(|c| matches!(c, StoreChange::Admit(_)))
            .count();
        assert_eq!(admitted, 200, "every job recorded");
        if let Err(e) = replay(&changes) {
            panic!("the journal is out of the engine's order: {e}");
        }
    }
}
