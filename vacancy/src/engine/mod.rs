//! The sans-IO admission engine.
//!
//! Pure state plus inputs plus `now`: no sockets, no threads, no clock reads.
//! Shells feed it capacity samples, observations, presence and pressure, ask it
//! to admit and release work, and do what its answers say (ARCHITECTURE.md#layers).
//!
//! # Behavior
//!
//! - One job per resource; a job reserves its primary resource and every
//!   `also_requires` dependency in one all-or-nothing step (ADM-01..03).
//! - A released resource admits again only after a successful sample taken
//!   after the release (ADM-04); a request arriving before it waits up to 4 s
//!   ([`Decision::Wait`], ADM-06), and every other check still applies (ADM-07).
//! - Memory requirements must fit above the reserve (MEM-01..06), raised by
//!   learned priors (MEM-07..11), replaced by resident credit on proof (RES-01/02).
//! - Uncertain work is held, never released without an explicit release.
//! - With a borrower table (issue 34, off by default) requests name their
//!   borrower, take fair turns in the wait line and keep within limits and
//!   budgets; each finished reservation is accounted (`borrowers` module).

mod borrowers;
mod capacity;
mod effect;
mod inputs;
mod line;
pub mod pressure;
mod priors;
mod reclaim;
mod refusal;
mod sign;
mod spec;
mod state;
mod status;
mod terms;
mod usage;
mod who;
mod work;

use std::collections::HashMap;
use std::time::Duration;

pub use borrowers::{
    ANONYMOUS, BorrowerSpec, BorrowerSpecError, BorrowerStatus, BorrowerTotals, BorrowersSpec,
    BudgetPeriod, BudgetStatus, MAX_SHARE, TimeBudget, utc_words,
};
pub use capacity::{CapacitySample, ResourceKind};
pub use effect::Effect;
pub use inputs::{
    Lesson, ModelObservation, ObservedModel, OwnerPresence, PressureVerdict, ResidencyEvidence,
    VisibleWork,
};
pub use line::{LINE_EXPIRY_GRACE, LineStatus, QueueSpec};
pub use priors::MAX_PRIOR_IDENTITIES;
pub use reclaim::{
    OnOwnerReturn, OwnerScope, RESPONSE_CUT_GRACE, ReclaimCommand, ReclaimId, ReclaimPolicy,
    ReclaimStatus, ReclaimTrigger,
};
pub use refusal::{Refusal, RefusalCode};
pub use sign::{Sign, SignState, sign};
pub use spec::{EngineSpec, ModelBudget, ResourceSpec, SpecError, UpstreamSpec};
pub use status::{
    EngineStatus, OwnerVetoStatus, ResourceStatus, UpstreamStatus, Vacancy, WorkStatus,
};
pub use terms::{
    HeatLimits, HeatReading, HoursChange, LendingHours, NextChange, PowerSource, TermStatus,
};
pub use usage::{KindTimes, UsageRecord};
pub use who::{BorrowerId, BorrowerRef, BorrowerTag, Priority, UnknownPriority};
pub use work::{
    Charge, CompletionMethod, Decision, EntryId, HeldRelease, Phase, ReleaseOutcome, RequestReuse,
    Reservation, UpstreamId, WorkRequest,
};

use crate::time::Moment;
use borrowers::{Borrowers, Claim, WallAnchor};
use effect::Effects;
use line::Waiter;
use priors::{PendingFootprint, Priors};
use reclaim::ActiveReclaim;
use state::{Capacity, ResourceState};

/// How long a request waits for the post-job sample (ADM-06).
pub const POST_JOB_SAMPLE_WAIT: Duration = Duration::from_secs(4);

/// How old a model observation may be and still prove residency (RES-02) or
/// show foreign work (ADM-09).
pub const OBSERVATION_MAX_AGE: Duration = Duration::from_secs(4);

/// How long after vacancy's own job ends an upstream may still show it as
/// running: llama-server sends the final response before it frees the slot,
/// and a reading taken in that moment shows vacancy's finished job (ADM-09).
pub const OWN_WORK_TAIL: Duration = Duration::from_secs(1);

/// A request the engine cannot act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// No entry has this ID.
    #[error("no work entry {0}; it may have been released already")]
    UnknownEntry(EntryId),
    /// An entry with this ID exists already.
    #[error("work entry {0} exists already; each request needs a fresh ID")]
    DuplicateEntry(EntryId),
    /// No resource has this name.
    #[error("no resource named {0:?}; see [[resource]] in the configuration")]
    UnknownResource(String),
    /// No upstream has this name.
    #[error("no upstream named {0:?}; see [[upstream]] in the configuration")]
    UnknownUpstream(String),
    /// No reclaim under way has this handle.
    #[error("no reclaim {0} is under way; it may have ended already")]
    UnknownReclaim(String),
    /// The entry is held: only [`Engine::release_held`] releases it.
    #[error(
        "work entry {0} is held; stop or verify it at the upstream, then release it as an administrator"
    )]
    EntryHeld(EntryId),
    /// The entry is not held, so an administrator may not release it (HELD-06).
    #[error(
        "work entry {id} is {phase}, not held; the daemon still owns an active operation for it"
    )]
    NotHeld {
        /// The entry.
        id: EntryId,
        /// Its phase.
        phase: &'static str,
    },
    /// A restored record does not match the current configuration (REC-08).
    #[error(
        "restored work entry {id} of upstream {upstream:?} held {recorded:?} but the configuration now maps it to {configured:?}; restore the old resource mapping or release the entry first"
    )]
    ChangedMapping {
        /// The entry.
        id: EntryId,
        /// Its upstream.
        upstream: String,
        /// The resources the record holds.
        recorded: Vec<String>,
        /// The resources the configuration names now.
        configured: Vec<String>,
    },
}

/// What a release did to its entry. What the shell must do about it (the
/// record, a sample of each freed resource, an observation of the upstream)
/// is queued as [`Effect`]s like every other decision: one channel out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The entry ended and its resources are free; the queued effects ask
    /// for a sample of each (ADM-05) and an observation of the upstream
    /// (RES-02, RES-07).
    Freed,
    /// The outcome was uncertain: the entry is held and keeps its resources.
    Held,
}

/// A restored entry needs a resource another restored entry holds already:
/// both are held, and the resource stays reserved until both are released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreOverlap {
    /// The contested resource.
    pub resource: String,
    /// The entry restored first on it.
    pub holder: EntryId,
}

/// A work entry recorded before a restart, returned as held (REC-02).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoredEntry {
    /// The entry ID.
    pub id: EntryId,
    /// The upstream's name.
    pub upstream: String,
    /// The model when known.
    pub model: Option<String>,
    /// The resources it held, primary first.
    pub resources: Vec<String>,
    /// When it was admitted, on this engine's timeline; the timeline's
    /// origin when the work started before it.
    pub admitted_at: Moment,
    /// How long before `admitted_at` the work really started: non-zero when
    /// its recorded start predates this engine's timeline, so that its age
    /// counts from the recorded start whatever the daemon's uptime (REC-27).
    pub started_before: Duration,
    /// How its end is proven.
    pub completion: CompletionMethod,
    /// The upstream's own handle for it (REC-03).
    pub upstream_ref: Option<String>,
    /// Its borrower as recorded (issue 34): the restored entry is accounted
    /// to it when it is released.
    pub borrower: Option<BorrowerTag>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Budget {
    /// The primary resource: the model's or upstream's requirement.
    Primary,
    /// An `also_requires` resource with a per-resource requirement.
    Required(u64),
    /// An `also_requires` resource no requirement names: only its reserve floor (MEM-04/05).
    FloorOnly,
}

#[derive(Debug, Clone, Copy)]
struct Dep {
    res: usize,
    budget: Budget,
}

#[derive(Debug)]
struct UpstreamState {
    spec: UpstreamSpec,
    deps: Vec<Dep>,
    observation: Option<ModelObservation>,
    /// The last released request of a known kind, until an observation
    /// takes it or an admission on a shared resource voids it (RES-07).
    lesson: Option<Lesson>,
}

#[derive(Debug)]
struct Entry {
    reservation: Reservation,
    upstream: usize,
    deps: Vec<usize>,
    phase: Phase,
    held_reason: Option<String>,
    /// (model identity, kind) of a request of a known kind (RES-06).
    kind: Option<(String, String)>,
    /// Age the entry had before the timeline's origin (REC-27).
    started_before: Duration,
    /// Its borrower and class, with borrowers on (issue 34).
    borrower: Option<Claim>,
    /// How long it waited in line before its admission.
    waited: Duration,
    /// Whether it was ever held.
    was_held: bool,
}

/// Why [`Engine::evaluate`] did not admit.
enum Blocked {
    Wait {
        until: Moment,
        resources: Vec<String>,
    },
    Refused(Refusal),
    /// Refused only because the model observation was too old (RES-20).
    Reobserve(Refusal),
}

impl From<Blocked> for Decision {
    fn from(b: Blocked) -> Self {
        match b {
            Blocked::Wait { until, resources } => Decision::Wait { until, resources },
            Blocked::Refused(r) => Decision::Refused(r),
            Blocked::Reobserve(r) => Decision::Reobserve(r),
        }
    }
}

/// The two names of a request's model: as written (configuration, MEM-06)
/// and as the upstream reports it (observations and priors).
#[derive(Debug, Clone, Copy, Default)]
struct ModelNames<'a> {
    written: Option<&'a str>,
    identity: Option<&'a str>,
}

impl<'a> ModelNames<'a> {
    fn of(req: &'a WorkRequest) -> Self {
        ModelNames {
            written: req.model.as_deref(),
            identity: req.identity(),
        }
    }
}

/// Whether resident credit applies, and if not, why.
enum Residency {
    Proven,
    NotProven { why: String, stale: bool },
}

/// The admission engine. See the [module docs](self).
#[derive(Debug)]
pub struct Engine {
    lending: bool,
    owner: OwnerPresence,
    resources: Vec<ResourceState>,
    resource_index: HashMap<String, usize>,
    upstreams: Vec<UpstreamState>,
    upstream_index: HashMap<String, usize>,
    entries: HashMap<EntryId, Entry>,
    priors: Priors,
    reclaims: Vec<ActiveReclaim>,
    next_reclaim: u64,
    /// Presence went from away to refusing since the last reclaim step: the
    /// owner edge that starts reclaims (OWN-01). Recorded here, not derived
    /// at the step, so an away moment between two steps is never missed.
    owner_edge: bool,
    /// What the shell must do, in decision order ([`poll_effect`](Self::poll_effect)).
    effects: Effects,
    /// Requests waiting for a reserved resource, in arrival order ([`line`]).
    line: Vec<Waiter>,
    /// The owner's host-wide terms: lending hours and the battery (issue 35).
    terms: terms::Terms,
    /// The moment of the last reclaim step.
    last_step: Moment,
    /// The borrower table, its turns and its use (issue 34); `None`: off.
    borrowers: Option<Borrowers>,
    /// The timeline anchored to UTC, for budget periods.
    wall: WallAnchor,
}

impl Engine {
    /// Build an engine. Owner presence starts `Unknown` (refusing host-scoped
    /// work) until the shell reports it; every resource starts with capacity unknown.
    pub fn new(spec: EngineSpec) -> Result<Engine, SpecError> {
        let mut resource_index = HashMap::new();
        let mut resources = Vec::with_capacity(spec.resources.len());
        for r in spec.resources {
            if resource_index
                .insert(r.name.clone(), resources.len())
                .is_some()
            {
                return Err(SpecError::DuplicateResource(r.name));
            }
            resources.push(ResourceState::new(r));
        }
        let mut upstream_index = HashMap::new();
        let mut upstreams = Vec::with_capacity(spec.upstreams.len());
        for u in spec.upstreams {
            let deps = Self::deps_of(&u, &resource_index)?;
            if upstream_index
                .insert(u.name.clone(), upstreams.len())
                .is_some()
            {
                return Err(SpecError::DuplicateUpstream(u.name));
            }
            upstreams.push(UpstreamState {
                spec: u,
                deps,
                observation: None,
                lesson: None,
            });
        }
        Ok(Engine {
            lending: spec.lending,
            owner: OwnerPresence::Unknown,
            resources,
            resource_index,
            upstreams,
            upstream_index,
            entries: HashMap::new(),
            priors: Priors::default(),
            reclaims: Vec::new(),
            next_reclaim: 1,
            owner_edge: false,
            effects: Effects::default(),
            line: Vec::new(),
            terms: terms::Terms::default(),
            last_step: Moment::ZERO,
            borrowers: None,
            wall: WallAnchor::default(),
        })
    }

    fn deps_of(u: &UpstreamSpec, index: &HashMap<String, usize>) -> Result<Vec<Dep>, SpecError> {
        let lookup = |name: &str| {
            index
                .get(name)
                .copied()
                .ok_or_else(|| SpecError::UnknownResource {
                    upstream: u.name.clone(),
                    resource: name.to_owned(),
                })
        };
        let mut deps = vec![Dep {
            res: lookup(&u.resource)?,
            budget: Budget::Primary,
        }];
        for name in &u.also_requires {
            let res = lookup(name)?;
            if deps.iter().any(|d| d.res == res) {
                return Err(SpecError::RepeatedResource {
                    upstream: u.name.clone(),
                    resource: name.clone(),
                });
            }
            let budget = match u.requirements.get(name) {
                Some(mib) => Budget::Required(*mib),
                None => Budget::FloorOnly,
            };
            deps.push(Dep { res, budget });
        }
        if let Some(name) = u.requirements.keys().find(|k| !u.also_requires.contains(k)) {
            return Err(SpecError::RequirementNotDependency {
                upstream: u.name.clone(),
                resource: name.clone(),
            });
        }
        Ok(deps)
    }

    // ---- lookups -------------------------------------------------------

    /// The handle of the upstream named `name`.
    pub fn upstream_id(&self, name: &str) -> Option<UpstreamId> {
        self.upstream_index.get(name).copied().map(UpstreamId)
    }

    /// The name of an upstream.
    pub fn upstream_name(&self, id: UpstreamId) -> Option<&str> {
        self.upstreams.get(id.0).map(|u| u.spec.name.as_str())
    }

    fn resource_idx(&self, name: &str) -> Result<usize, EngineError> {
        self.resource_index
            .get(name)
            .copied()
            .ok_or_else(|| EngineError::UnknownResource(name.to_owned()))
    }

    fn resource_mut(&mut self, name: &str) -> Result<&mut ResourceState, EngineError> {
        let i = self.resource_idx(name)?;
        Ok(&mut self.resources[i])
    }

    /// The learned prior of `model` on `resource` for `upstream`, if any.
    pub fn learned_prior(&self, upstream: UpstreamId, model: &str, resource: &str) -> Option<u64> {
        let res = *self.resource_index.get(resource)?;
        self.priors.peek(upstream.0, model, res)
    }

    /// How many work entries (forwarding, tracking or held) exist.
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }

    /// Whether any work entry holds `resource` (`false` for an unknown name).
    pub fn resource_held(&self, resource: &str) -> bool {
        self.resource_index
            .get(resource)
            .is_some_and(|&i| self.resources[i].holder.is_some())
    }

    /// The phase of an entry.
    pub fn phase(&self, id: EntryId) -> Option<Phase> {
        self.entries.get(&id).map(|e| e.phase)
    }

    /// The reservation of an entry.
    pub fn reservation(&self, id: EntryId) -> Option<&Reservation> {
        self.entries.get(&id).map(|e| &e.reservation)
    }

    // ---- effects -------------------------------------------------------

    /// The next thing the shell must do, in the order the engine decided it
    /// (see [`Effect`]). Drain it after every call that changes the engine:
    /// ledger effects go to the store in this order.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop()
    }

    // ---- inputs --------------------------------------------------------

    /// The lending switch.
    pub fn set_lending(&mut self, enabled: bool) {
        self.lending = enabled;
        self.wake_waiters();
    }

    /// The lending switch's position.
    pub fn lending(&self) -> bool {
        self.lending
    }

    /// What the presence backend says now. A change from away to present or
    /// unknown is an owner edge: the next [`reclaim_step`](Self::reclaim_step)
    /// reclaims host-scoped work (OWN-01). The engine starts unknown, so
    /// startup is no edge.
    pub fn set_owner(&mut self, presence: OwnerPresence) {
        if self.owner == OwnerPresence::Away && presence != OwnerPresence::Away {
            self.owner_edge = true;
        }
        if self.owner != presence {
            self.effects.push(Effect::WakeReclaims);
            self.wake_waiters();
        }
        self.owner = presence;
    }

    /// What the presence backend last said.
    pub fn owner(&self) -> OwnerPresence {
        self.owner
    }

    /// A resource's switch.
    pub fn set_resource_enabled(
        &mut self,
        resource: &str,
        enabled: bool,
    ) -> Result<(), EngineError> {
        self.resource_mut(resource)?.enabled = enabled;
        self.wake_waiters();
        Ok(())
    }

    /// The pressure tracker's verdict for a resource. A verdict that admits
    /// also clears a pressure reclaim; see [`set_pressure_reading`](Self::set_pressure_reading)
    /// for a tracker that tells the two apart.
    pub fn set_pressure(
        &mut self,
        resource: &str,
        verdict: PressureVerdict,
    ) -> Result<(), EngineError> {
        let cleared = verdict == PressureVerdict::Admits;
        self.set_pressure_reading(resource, verdict, cleared)
    }

    /// The pressure tracker's verdict for new work on a resource, and whether
    /// its reading lets a pressure reclaim stand down: fresh, calibrated,
    /// below threshold and not rising (RECL-06). Pressure releasing after
    /// engagement refuses new work yet clears; "not engaged" after an unknown
    /// reading does not (RECL-07).
    pub fn set_pressure_reading(
        &mut self,
        resource: &str,
        verdict: PressureVerdict,
        cleared: bool,
    ) -> Result<(), EngineError> {
        let r = self.resource_mut(resource)?;
        r.pressure = verdict;
        r.pressure_cleared = cleared;
        self.effects.push(Effect::WakeReclaims);
        self.wake_waiters();
        Ok(())
    }

    /// A pressure edge on a resource (engaged, uncalibrated, or unavailable
    /// past the gap limit): the next [`reclaim_step`](Self::reclaim_step)
    /// reclaims the work that depends on it (PRES-01..03).
    pub fn pressure_trigger(&mut self, resource: &str, why: &str) -> Result<(), EngineError> {
        self.resource_mut(resource)?.pressure_trigger = Some(why.to_owned());
        self.effects.push(Effect::WakeReclaims);
        Ok(())
    }

    /// What a GPU's pressure tracker said after a poll: its verdict and
    /// whether it clears a pressure reclaim, and its trigger, if any, for the
    /// next [`reclaim_step`](Self::reclaim_step) (PRES-01..04, RECL-06).
    pub fn apply_pressure(&mut self, update: &pressure::PressureUpdate) -> Result<(), EngineError> {
        self.set_pressure_reading(&update.resource, update.verdict.clone(), update.cleared)?;
        match &update.trigger {
            Some(t) => self.pressure_trigger(&update.resource, &t.why),
            None => Ok(()),
        }
    }

    /// A successful capacity sample. Closes a footprint measurement when the
    /// sample was taken after the observation that armed it (MEM-07).
    pub fn record_sample(
        &mut self,
        resource: &str,
        sample: CapacitySample,
    ) -> Result<(), EngineError> {
        let i = self.resource_idx(resource)?;
        let r = &mut self.resources[i];
        r.record_sample(sample);
        if r.heat.limits.is_some() {
            // A GPU's heat reading may refuse, resume or stand a reclaim down.
            self.effects.push(Effect::WakeReclaims);
            self.wake_waiters();
        }
        let r = &mut self.resources[i];
        if let Some(p) = &r.footprint
            && let Some(observed_at) = p.observed_at
            && sample.taken_at > observed_at
        {
            let delta = i128::from(p.free_at_admission) - i128::from(sample.free_mib);
            let (upstream, model) = (p.upstream, p.model.clone());
            r.footprint = None;
            self.priors.learn(upstream, &model, i, delta);
        }
        Ok(())
    }

    /// A sample that failed at `at`: capacity is unknown until a later success.
    pub fn record_sample_failure(
        &mut self,
        resource: &str,
        at: Moment,
        reason: &str,
    ) -> Result<(), EngineError> {
        self.resource_mut(resource)?.record_failure(at, reason);
        Ok(())
    }

    /// A model observation of an upstream. Arms footprint measurements on its
    /// resources for models it shows loaded (MEM-07) and becomes the evidence
    /// for resident credit (RES-02) and foreign work (ADM-09).
    pub fn observe(
        &mut self,
        upstream: UpstreamId,
        observation: ModelObservation,
    ) -> Result<(), EngineError> {
        let u = self
            .upstreams
            .get_mut(upstream.0)
            .ok_or_else(|| EngineError::UnknownUpstream(format!("#{}", upstream.0)))?;
        if u.observation
            .as_ref()
            .is_some_and(|o| o.taken_at > observation.taken_at)
        {
            return Ok(()); // an older observation arriving late teaches nothing
        }
        for dep in &u.deps {
            if let Some(p) = &mut self.resources[dep.res].footprint
                && p.upstream == upstream.0
                && p.observed_at.is_none()
                && observation.taken_at > p.admitted_at
                && observation.model(&p.model).is_some_and(|m| m.ready)
            {
                p.observed_at = Some(observation.taken_at);
            }
        }
        u.observation = Some(observation);
        Ok(())
    }

    /// Models were unloaded from a resource (a yield): residency proofs and
    /// footprint measurements taken before now no longer hold, and new work
    /// waits for a fresh sample (RECL-45).
    pub fn record_unload(&mut self, resource: &str, now: Moment) -> Result<(), EngineError> {
        let i = self.resource_idx(resource)?;
        self.resources[i].disturbed(now);
        for u in &mut self.upstreams {
            if u.deps.iter().any(|d| d.res == i) {
                u.lesson = None;
            }
        }
        Ok(())
    }

    /// An upstream acknowledged unloading its models (a yield): every
    /// resource it borrows is disturbed as by [`record_unload`](Self::record_unload),
    /// so residency needs a newer observation and new work a fresh sample
    /// (RECL-45). Never a release and never recovered memory (RECL-49).
    pub fn record_yield(&mut self, upstream: UpstreamId, now: Moment) -> Result<(), EngineError> {
        let deps: Vec<usize> = self
            .upstreams
            .get(upstream.0)
            .ok_or_else(|| EngineError::UnknownUpstream(format!("#{}", upstream.0)))?
            .deps
            .iter()
            .map(|d| d.res)
            .collect();
        for &i in &deps {
            self.resources[i].disturbed(now);
        }
        for u in &mut self.upstreams {
            if u.deps.iter().any(|d| deps.contains(&d.res)) {
                u.lesson = None;
            }
        }
        Ok(())
    }

    /// The lesson an observation of `upstream` taken at `observed_at` teaches:
    /// the last released request of a known kind, when it finished before the
    /// observation started and nothing was admitted on the upstream's
    /// resources since (RES-07). Taken once: later observations teach nothing.
    /// An observation started before the request finished leaves it in place.
    pub fn take_lesson(&mut self, upstream: UpstreamId, observed_at: Moment) -> Option<Lesson> {
        let u = self.upstreams.get_mut(upstream.0)?;
        if u.lesson.as_ref()?.finished_at < observed_at {
            u.lesson.take()
        } else {
            None
        }
    }

    // ---- admission -----------------------------------------------------

    /// Decide a work request. See the [module docs](self) for the rules,
    /// and the `borrowers` module's for a named borrower's.
    pub fn admit(&mut self, req: &WorkRequest, now: Moment) -> Decision {
        if self.borrowers.is_none() {
            return self.admit_as(req, None, now);
        }
        self.refresh_windows(now);
        let claim = match self.claim(req) {
            Ok(claim) => claim,
            Err(refusal) => {
                self.leave_line(req.id);
                return Decision::Refused(refusal);
            }
        };
        let decision = self.admit_as(req, claim, now);
        if let Decision::Refused(r) = &decision {
            self.count_refusal(claim, r.code);
        }
        self.debug_check_counts();
        decision
    }

    /// Decide a request of borrower `claim` (`None`: borrowers off).
    // Long: admission in its order (the line, the checks, the reservation, its effects) in one place.
    fn admit_as(&mut self, req: &WorkRequest, claim: Option<Claim>, now: Moment) -> Decision {
        if self.entries.contains_key(&req.id) {
            return Decision::Refused(Refusal::new(
                RefusalCode::InvalidRequest,
                format!(
                    "work entry {} exists already; each request needs a fresh ID",
                    req.id
                ),
            ));
        }
        let Some(u) = self.upstreams.get(req.upstream.0) else {
            return Decision::Refused(Refusal::new(
                RefusalCode::InvalidRequest,
                format!("no upstream #{}", req.upstream.0),
            ));
        };
        let names = ModelNames::of(req);
        let residency = self.residency(u, names.identity, &req.reuse, now);
        if !self.line.is_empty() {
            self.expire_line(now);
        }
        let seat = self.seat(req.id);
        if let Some(refusal) = self.quota_refusal(claim, req.upstream.0, now) {
            if let Some(i) = seat {
                self.leave_at(i);
            }
            return Decision::Refused(refusal);
        }
        let joined = seat.map(|i| self.line[i].joined);
        let arrived = self.line_arrival(req, seat, now);
        let mut evaluated = self.evaluate(req.upstream.0, names, &residency, arrived, now);
        if evaluated.is_ok()
            && let Some(limit) = self.running_limit(claim)
        {
            evaluated = Err(Blocked::Refused(limit));
        }
        let charges = match self.line_turn(req, seat, evaluated, claim, now) {
            Ok(charges) => charges,
            Err(decision) => return decision,
        };
        let waited = joined.map_or(Duration::ZERO, |j| now.since(j));
        self.count_admission(claim, waited);
        let up = req.upstream.0;
        let deps: Vec<usize> = self.upstreams[up].deps.iter().map(|d| d.res).collect();
        for (dep, charge) in self.upstreams[up].deps.iter().zip(&charges) {
            let r = &mut self.resources[dep.res];
            r.holder = Some(req.id);
            // A new job confounds any measurement under way on this resource.
            r.footprint = match (names.identity, dep.budget) {
                (Some(model), Budget::Primary | Budget::Required(_)) => Some(PendingFootprint {
                    upstream: up,
                    model: model.to_owned(),
                    free_at_admission: charge.free_mib,
                    admitted_at: now,
                    observed_at: None,
                }),
                _ => None,
            };
        }
        // RES-07: work on a shared resource changes what the upstream holds,
        // so an observation after now teaches no earlier request's kind.
        for u in &mut self.upstreams {
            if u.deps.iter().any(|d| deps.contains(&d.res)) {
                u.lesson = None;
            }
        }
        let kind = match (names.identity, req.reuse.kind()) {
            (Some(model), Some(kind)) => Some((model.to_owned(), kind.to_owned())),
            _ => None,
        };
        let reservation = Reservation {
            id: req.id,
            upstream: self.upstreams[up].spec.name.clone(),
            model: req.model.clone(),
            charges,
            resident_credit: matches!(residency, Residency::Proven),
            admitted_at: now,
            completion: req.completion,
            upstream_ref: req.upstream_ref.clone(),
            borrower: claim.and_then(|c| self.tag_of(c)),
        };
        self.entries.insert(
            req.id,
            Entry {
                reservation: reservation.clone(),
                upstream: up,
                deps,
                phase: Phase::Forwarding,
                held_reason: None,
                kind,
                started_before: Duration::ZERO,
                borrower: claim,
                waited,
                was_held: false,
            },
        );
        self.effects.push(Effect::Persist(reservation.clone()));
        Decision::Admitted(reservation)
    }

    /// vacancy's own jobs an upstream's reading taken at `taken_at` may show
    /// on resources `deps`: every entry holding one of them, whatever its
    /// phase, plus a job that ended within [`OWN_WORK_TAIL`] before the
    /// reading (ADM-09).
    fn own_jobs(&self, deps: &[Dep], taken_at: Moment) -> u32 {
        let holding = self
            .entries
            .values()
            .filter(|e| e.deps.iter().any(|r| deps.iter().any(|d| d.res == *r)))
            .count();
        let tail = deps.iter().any(|d| {
            let ended = self.resources[d.res].last_disturbed;
            ended > Moment::ZERO && taken_at.since(ended) < OWN_WORK_TAIL
        });
        u32::try_from(holding).unwrap_or(u32::MAX) + u32::from(tail)
    }

    /// Whether the upstream's default-budget request would be admitted now,
    /// would wait in its line, or would be refused (UI-01, VOICE-19, issue 30).
    pub fn vacancy(&mut self, upstream: UpstreamId, now: Moment) -> Vacancy {
        let not_proven = Residency::NotProven {
            why: "the status decision charges the default budget".to_owned(),
            stale: false,
        };
        let evaluated = self
            .evaluate(upstream.0, ModelNames::default(), &not_proven, now, now)
            .map(|_| ());
        self.sign(upstream.0, evaluated, now)
    }

    /// The vacancy sign of upstream `up` given its default-budget
    /// evaluation (UI-01, issue 30): `admitting` only when a new request
    /// would be admitted now; `queueing` when it would wait in the
    /// upstream's line (behind the waiters that need its resources);
    /// otherwise the refusal it would get.
    fn sign(&self, up: usize, evaluated: Result<(), Blocked>, now: Moment) -> Vacancy {
        let ahead = self.ahead_of(up, None, None, now);
        let busy = match (evaluated, ahead.first) {
            (Ok(()), None) => return Vacancy::admitting(),
            (Ok(()), Some(res)) => self.line_busy(res),
            (Err(Blocked::Refused(r)), _) if r.code == RefusalCode::ResourceBusy => r,
            (Err(Blocked::Wait { resources, .. }), None) => {
                return Vacancy::refusing(
                    RefusalCode::ResourceBusy,
                    format!(
                        "waiting for a capacity sample of {} after the last job",
                        resources.join(", ")
                    ),
                );
            }
            // The sample it waits for lands, then it takes its turn behind them.
            (Err(Blocked::Wait { .. }), Some(res)) => self.line_busy(res),
            (Err(Blocked::Refused(r) | Blocked::Reobserve(r)), _) => {
                return Vacancy::refusing(r.code, r.reason);
            }
        };
        match self.upstreams[up].spec.queue {
            Some(queue) => match self.line_room(up, queue) {
                Ok(()) => Vacancy::queueing(ahead.count, busy.reason),
                Err(why) => Vacancy::refusing(busy.code, busy.reason + &why),
            },
            None => Vacancy::refusing(busy.code, busy.reason),
        }
    }

    fn residency(
        &self,
        u: &UpstreamState,
        model: Option<&str>,
        reuse: &RequestReuse,
        now: Moment,
    ) -> Residency {
        let not = |why: String| Residency::NotProven { why, stale: false };
        let Some(model) = model else {
            return not("the request names no model".to_owned());
        };
        if let RequestReuse::Cannot(why) = reuse {
            return not(why.clone());
        }
        let Some(obs) = &u.observation else {
            return not("the upstream has not been observed".to_owned());
        };
        let Some(m) = obs.model(model) else {
            return not(format!(
                "the last observation does not show {model:?} loaded"
            ));
        };
        if !m.ready {
            return not(format!("{model:?} is not ready on the upstream"));
        }
        match (&m.evidence, reuse) {
            (ResidencyEvidence::Proven, _) => {}
            (ResidencyEvidence::NotProven(why), _) => return not(why.clone()),
            (ResidencyEvidence::ProvenFor { kinds, otherwise }, RequestReuse::ReusesAs(kind)) => {
                if !kinds.iter().any(|k| k == kind) {
                    return not(format!("{otherwise} (this request: {kind})"));
                }
            }
            (ResidencyEvidence::ProvenFor { otherwise, .. }, _) => {
                return not(format!("{otherwise} (the request's kind is unknown)"));
            }
        }
        for dep in &u.deps {
            let r = &self.resources[dep.res];
            if obs.taken_at <= r.last_disturbed {
                return not(format!(
                    "the last observation predates the last job or unload on {}",
                    r.spec.name
                ));
            }
        }
        let age = now.since(obs.taken_at);
        if age > OBSERVATION_MAX_AGE {
            return Residency::NotProven {
                why: format!(
                    "the last observation is {} ms old (at most 4000 ms proves residency)",
                    age.as_millis()
                ),
                stale: true,
            };
        }
        Residency::Proven
    }

    /// Memory the upstream's allocator holds unused, counted as free on `res`
    /// (RES-17): only where `res` is the upstream's one GPU, and only from
    /// an observation that proves it now (≤ 4 s old, taken after the last
    /// job or yield on `res`).
    fn allocator_credit(&self, up: usize, res: usize, now: Moment) -> u64 {
        let u = &self.upstreams[up];
        let gpus = u
            .deps
            .iter()
            .filter(|d| self.resources[d.res].spec.kind == ResourceKind::Gpu)
            .count();
        let r = &self.resources[res];
        if gpus != 1 || r.spec.kind != ResourceKind::Gpu {
            return 0;
        }
        match &u.observation {
            Some(obs)
                if obs.taken_at > r.last_disturbed
                    && now.since(obs.taken_at) <= OBSERVATION_MAX_AGE =>
            {
                obs.allocator_free_mib.unwrap_or(0)
            }
            _ => 0,
        }
    }

    /// The requirement on a dependency in MiB above its reserve; `None` when
    /// no requirement names it (only the reserve floor applies, MEM-05).
    fn requirement(
        &mut self,
        up: usize,
        dep: Dep,
        names: ModelNames<'_>,
        resident: bool,
    ) -> Option<u64> {
        let model = names.written;
        let spec = &self.upstreams[up].spec;
        let kind = self.resources[dep.res].spec.kind;
        let configured = match dep.budget {
            Budget::FloorOnly => return None,
            // A CPU primary is judged by how busy it is, not by memory (SCOPE-08).
            Budget::Primary if kind == ResourceKind::Cpu => return None,
            Budget::Primary => model
                .and_then(|m| spec.models.get(m))
                .and_then(|b| b.min_free_mib)
                .unwrap_or(spec.default_min_free_mib),
            Budget::Required(mib) => mib,
        };
        if resident {
            // RES-01: resident credit replaces both the configured requirement and the prior.
            return Some(
                model
                    .and_then(|m| spec.models.get(m))
                    .and_then(|b| b.resident_min_free_mib)
                    .unwrap_or(spec.resident_min_free_mib),
            );
        }
        let prior = names.identity.and_then(|m| self.priors.get(up, m, dep.res));
        // MEM-08: a prior raises the requirement, never lowers it.
        Some(prior.map_or(configured, |p| p.max(configured)))
    }

    /// The owner's refusals of upstream `up`: lending paused, the owner's
    /// host-wide terms (lending hours, the battery; issue 35), or for a
    /// host-scoped upstream the owner present or unknown (OWN-01).
    fn presence_refusal(&self, up: usize, now: Moment) -> Option<Refusal> {
        if !self.lending {
            return Some(Refusal::new(
                RefusalCode::LendingPaused,
                "the owner has paused lending; retry after lending is switched back on",
            ));
        }
        if let Some(refusal) = self.terms_refusal(now) {
            return Some(refusal);
        }
        if self.upstreams[up].spec.owner_scope != OwnerScope::Host {
            return None;
        }
        match self.owner {
            OwnerPresence::Away => None,
            OwnerPresence::Present => Some(Refusal::new(
                RefusalCode::OwnerPresent,
                "the owner is using this machine; borrowed work resumes when they leave",
            )),
            OwnerPresence::Unknown => Some(Refusal::new(
                RefusalCode::OwnerPresent,
                "the owner's presence cannot be determined (incomplete session evidence), so borrowed work is refused; check the presence backend ([owner] presence)",
            )),
        }
    }

    /// Every check of admission, in order: presence, visible work the
    /// engine did not admit, hard refusals on any dependency, then the fit of
    /// each dependency's charge (waiting for a post-job sample where one is
    /// due). `Ok` carries the charges to reserve.
    fn evaluate(
        &mut self,
        up: usize,
        names: ModelNames<'_>,
        residency: &Residency,
        arrived_at: Moment,
        now: Moment,
    ) -> Result<Vec<Charge>, Blocked> {
        let refusal = self
            .presence_refusal(up, now)
            .or_else(|| self.visible_work_refusal(up, now))
            .or_else(|| self.dependency_refusal(up, now));
        if let Some(r) = refusal {
            return Err(Blocked::Refused(r));
        }
        let (charges, awaiting) = self.charges(up, names, residency, now)?;
        if !awaiting.is_empty() {
            let until = arrived_at.after(POST_JOB_SAMPLE_WAIT);
            if now >= until {
                return Err(Blocked::Refused(
                    Refusal::new(
                        RefusalCode::ResourceBusy,
                        format!(
                            "no capacity sample of {} arrived within 4 s after the last job ended; retry in 2 s",
                            awaiting.join(", ")
                        ),
                    )
                    .on_resource(&awaiting[0]),
                ));
            }
            return Err(Blocked::Wait {
                until,
                resources: awaiting,
            });
        }
        Ok(charges)
    }

    /// ADM-09: visible work beyond vacancy's own, in a reading taken after
    /// the last job on every resource.
    fn visible_work_refusal(&self, up: usize, now: Moment) -> Option<Refusal> {
        let u = &self.upstreams[up];
        let obs = u.observation.as_ref()?;
        let work = obs.visible_work.as_ref()?;
        let busy = now.since(obs.taken_at) <= OBSERVATION_MAX_AGE
            && u.deps
                .iter()
                .all(|d| obs.taken_at > self.resources[d.res].last_disturbed)
            && work.jobs > self.own_jobs(&u.deps, obs.taken_at);
        busy.then(|| {
            Refusal::new(
                RefusalCode::ResourceBusy,
                format!(
                    "upstream {} is busy with work vacancy did not admit ({}); retry in 2 s",
                    u.spec.name, work.description
                ),
            )
        })
    }

    /// The refusals on any dependency that come before waiting for a
    /// sample: disabled, above a heat or power limit (issue 35), held for a
    /// reclaim, reserved, under pressure.
    fn dependency_refusal(&self, up: usize, now: Moment) -> Option<Refusal> {
        for dep in &self.upstreams[up].deps {
            let r = &self.resources[dep.res];
            if let Some(refusal) = r.disabled_refusal() {
                return Some(refusal);
            }
            // The owner's heat and power limits come before a busy GPU: a
            // borrower told gpu_too_hot waits for the GPU to cool (issue 35).
            if let Some(refusal) = self.heat_refusal(dep.res, now) {
                return Some(refusal);
            }
            if let Some(rc) = self.holding_reclaim(dep.res) {
                return Some(
                    Refusal::new(
                        RefusalCode::ResourceBusy,
                        format!(
                            "resource {} is held while vacancyd gets capacity back for the owner from upstream {} (yield_on_veto); retry in 2 s",
                            r.spec.name, self.upstreams[rc.upstream].spec.name
                        ),
                    )
                    .on_resource(&r.spec.name),
                );
            }
            if r.holder.is_some() {
                // The holder's entry ID is another borrower's: /status and
                // the log name it, the refusal does not.
                return Some(
                    Refusal::new(
                        RefusalCode::ResourceBusy,
                        format!(
                            "resource {} is reserved by another borrowed job; retry in 2 s",
                            r.spec.name
                        ),
                    )
                    .on_resource(&r.spec.name),
                );
            }
            if let Some(refusal) = r.pressure_refusal() {
                return Some(refusal);
            }
        }
        None
    }

    /// What the request would reserve on each dependency, and the
    /// dependencies still awaiting their post-job sample; a refusal where
    /// a charge does not fit or a capacity is unknown.
    fn charges(
        &mut self,
        up: usize,
        names: ModelNames<'_>,
        residency: &Residency,
        now: Moment,
    ) -> Result<(Vec<Charge>, Vec<String>), Blocked> {
        let resident = matches!(residency, Residency::Proven);
        let deps = self.upstreams[up].deps.clone();
        let mut awaiting: Vec<String> = Vec::new();
        let mut charges = Vec::with_capacity(deps.len());
        for dep in deps {
            if self.resources[dep.res].awaiting_fresh_sample() {
                awaiting.push(self.resources[dep.res].spec.name.clone());
                continue;
            }
            let required = self.requirement(up, dep, names, resident);
            let allocator = self.allocator_credit(up, dep.res, now);
            let r = &self.resources[dep.res];
            let sample = match r.capacity(now) {
                Capacity::Known(s) => s,
                Capacity::Unknown(why) => {
                    return Err(Blocked::Refused(
                        Refusal::new(
                            RefusalCode::CapacityUnknown,
                            format!(
                                "capacity of {} is unknown: {}",
                                r.spec.name,
                                r.borrower_words(why)
                            ),
                        )
                        .on_resource(&r.spec.name),
                    ));
                }
            };
            let credited = CapacitySample {
                free_mib: sample.free_mib.saturating_add(allocator),
                ..sample
            };
            if let Some(refusal) = r.check_fit(&credited, required) {
                let mut refusal = refusal;
                if let (Residency::NotProven { why, stale }, Some(_)) = (residency, names.written) {
                    // RES-21: say why no resident credit applied.
                    refusal
                        .reason
                        .push_str(&format!("; no resident credit: {why}"));
                    if *stale {
                        // RES-20: only the observation's age stood in the way.
                        return Err(Blocked::Reobserve(refusal));
                    }
                }
                return Err(Blocked::Refused(refusal));
            }
            charges.push(Charge {
                resource: r.spec.name.clone(),
                required_mib: required.unwrap_or(0),
                free_mib: sample.free_mib,
            });
        }
        Ok((charges, awaiting))
    }

    // ---- completion ----------------------------------------------------

    /// A live entry that is not held: held work changes only by an
    /// administrator's release (HELD-04).
    fn unheld_entry(&mut self, id: EntryId) -> Result<&mut Entry, EngineError> {
        let e = self
            .entries
            .get_mut(&id)
            .ok_or(EngineError::UnknownEntry(id))?;
        if e.phase == Phase::Held {
            return Err(EngineError::EntryHeld(id));
        }
        Ok(e)
    }

    /// The reply came and the adapter now tracks the job at the upstream.
    pub fn start_tracking(&mut self, id: EntryId) -> Result<(), EngineError> {
        let e = self.unheld_entry(id)?;
        e.phase = Phase::Tracking;
        Ok(())
    }

    /// The response was cut and the shell checks the upstream's proof that
    /// the job stopped: the entry keeps its resources, shows `verifying`,
    /// and ends by [`release`](Self::release) (proof) or a hold (none).
    pub fn start_verifying(&mut self, id: EntryId) -> Result<(), EngineError> {
        let e = self.unheld_entry(id)?;
        e.phase = Phase::Verifying;
        Ok(())
    }

    /// The upstream named its own handle for the work (ComfyUI before 0.3.45,
    /// REC-04): the reservation carries it from now on.
    pub fn set_upstream_ref(&mut self, id: EntryId, upstream_ref: &str) -> Result<(), EngineError> {
        let e = self
            .entries
            .get_mut(&id)
            .ok_or(EngineError::UnknownEntry(id))?;
        e.reservation.upstream_ref = Some(upstream_ref.to_owned());
        self.effects.push(Effect::RewriteRef {
            entry: id,
            upstream_ref: upstream_ref.to_owned(),
        });
        Ok(())
    }

    /// End a forwarding or tracking job.
    ///
    /// # Behavior
    ///
    /// `Completed` and `NotForwarded` free every resource and queue a
    /// [`Effect::Sample`] of each and an [`Effect::Observe`] of the upstream
    /// (ADM-04/05). `Uncertain` turns the entry held: it keeps
    /// its resources until [`release_held`](Self::release_held). A held entry is
    /// never released here.
    pub fn release(
        &mut self,
        id: EntryId,
        outcome: ReleaseOutcome,
        now: Moment,
    ) -> Result<Release, EngineError> {
        let e = self.unheld_entry(id)?;
        match outcome {
            ReleaseOutcome::Completed => {
                if let Some((model, kind)) = e.kind.take() {
                    let up = e.upstream;
                    self.free(id, now);
                    self.upstreams[up].lesson = Some(Lesson {
                        model,
                        kind,
                        finished_at: now,
                    });
                    return Ok(Release::Freed);
                }
                self.free(id, now);
                Ok(Release::Freed)
            }
            ReleaseOutcome::NotForwarded => {
                self.free(id, now);
                Ok(Release::Freed)
            }
            ReleaseOutcome::Uncertain(reason) => {
                e.phase = Phase::Held;
                e.held_reason = Some(reason.clone());
                e.was_held = true;
                let claim = e.borrower;
                self.count_held(claim);
                self.debug_check_counts();
                self.effects.push(Effect::MarkHeld { entry: id, reason });
                self.effects.push(Effect::WakeReclaims);
                Ok(Release::Held)
            }
        }
    }

    /// Release a held entry on an administrator's confirmation or tracking
    /// proof. Its resources still wait for a fresh sample (HELD-07); the
    /// effects queued are a plain release's.
    pub fn release_held(
        &mut self,
        id: EntryId,
        _by: HeldRelease,
        now: Moment,
    ) -> Result<(), EngineError> {
        let e = self.entries.get(&id).ok_or(EngineError::UnknownEntry(id))?;
        if e.phase != Phase::Held {
            return Err(EngineError::NotHeld {
                id,
                phase: e.phase.as_str(),
            });
        }
        self.free(id, now);
        Ok(())
    }

    /// Free an entry's resources and queue what the shell does after a job:
    /// forget its record, sample each resource, observe the upstream, and
    /// step the reclaims under way.
    fn free(&mut self, id: EntryId, now: Moment) {
        let Some(e) = self.entries.remove(&id) else {
            return;
        };
        let mut freed = Vec::with_capacity(e.deps.len());
        for &res in &e.deps {
            // Restored records may overlap (see `restore_held`): the resource
            // stays reserved while another entry still holds it.
            let next = self
                .entries
                .values()
                .filter(|other| other.deps.contains(&res))
                .map(|other| other.reservation.id)
                .min();
            let r = &mut self.resources[res];
            if r.holder == Some(id) {
                r.holder = next;
            }
            r.disturbed(now);
            freed.push(r.spec.name.clone());
        }
        let upstream = e.upstream;
        // The owner's record of the borrower's reservation, written with its release.
        self.account(e, now);
        self.effects.push(Effect::Forget(id));
        for name in freed {
            self.effects.push(Effect::Sample(name));
        }
        self.effects.push(Effect::Observe(UpstreamId(upstream)));
        // A reclaim that drains or finishes waits for work to end; with
        // none under way, the reclaim loop has nothing to step (every edge
        // that starts one wakes it itself), and waking it cost each job a
        // thread wake-up on the daemon's main runtime (issue 31).
        if !self.reclaims.is_empty() {
            self.effects.push(Effect::WakeReclaims);
        }
        self.wake_waiters();
        self.debug_check_counts();
    }

    /// Return an entry recorded before a restart as held, reserving its
    /// resources again (REC-02). A changed resource mapping is an error (REC-08).
    ///
    /// Two unresolved records may name the same resource (a crash between a
    /// release reaching memory and reaching the journal): each is uncertain,
    /// so both come back held and the resource stays reserved until every one
    /// of them is released. The overlaps are returned so the caller can say so;
    /// they never stop a restore.
    pub fn restore_held(
        &mut self,
        entry: RestoredEntry,
        reason: &str,
    ) -> Result<Vec<RestoreOverlap>, EngineError> {
        if self.entries.contains_key(&entry.id) {
            return Err(EngineError::DuplicateEntry(entry.id));
        }
        let up = *self
            .upstream_index
            .get(&entry.upstream)
            .ok_or_else(|| EngineError::UnknownUpstream(entry.upstream.clone()))?;
        let deps: Vec<usize> = self.upstreams[up].deps.iter().map(|d| d.res).collect();
        let configured: Vec<String> = deps
            .iter()
            .map(|&i| self.resources[i].spec.name.clone())
            .collect();
        if configured != entry.resources {
            return Err(EngineError::ChangedMapping {
                id: entry.id,
                upstream: entry.upstream,
                recorded: entry.resources,
                configured,
            });
        }
        let mut overlaps = Vec::new();
        for &i in &deps {
            let r = &mut self.resources[i];
            match r.holder {
                Some(holder) => overlaps.push(RestoreOverlap {
                    resource: r.spec.name.clone(),
                    holder,
                }),
                None => r.holder = Some(entry.id),
            }
        }
        let charges = configured
            .into_iter()
            .map(|resource| Charge {
                resource,
                required_mib: 0,
                free_mib: 0,
            })
            .collect();
        let claim = entry.borrower.as_ref().and_then(|t| self.restore_claim(t));
        self.entries.insert(
            entry.id,
            Entry {
                reservation: Reservation {
                    id: entry.id,
                    upstream: entry.upstream,
                    model: entry.model,
                    charges,
                    resident_credit: false,
                    admitted_at: entry.admitted_at,
                    completion: entry.completion,
                    upstream_ref: entry.upstream_ref,
                    borrower: entry.borrower.clone(),
                },
                upstream: up,
                deps,
                phase: Phase::Held,
                held_reason: Some(reason.to_owned()),
                kind: None,
                started_before: entry.started_before,
                borrower: claim,
                waited: Duration::ZERO,
                was_held: true,
            },
        );
        Ok(overlaps)
    }

    // ---- status --------------------------------------------------------

    /// A snapshot for `/status`.
    pub fn status(&mut self, now: Moment) -> EngineStatus {
        let exempt: Vec<String> = self
            .upstreams
            .iter()
            .filter(|u| u.spec.owner_scope == OwnerScope::Resource)
            .map(|u| u.spec.name.clone())
            .collect();
        let veto_reason = match self.owner {
            OwnerPresence::Away => None,
            OwnerPresence::Present => Some("the owner is present".to_owned()),
            OwnerPresence::Unknown => {
                Some("owner presence unknown (incomplete session evidence)".to_owned())
            }
        };
        let resources = self.resources.iter().map(|r| r.status(now)).collect();
        let upstreams = (0..self.upstreams.len())
            .map(|i| {
                let vacancy = self.vacancy(UpstreamId(i), now);
                let u = &self.upstreams[i];
                UpstreamStatus {
                    name: u.spec.name.clone(),
                    owner_scope: u.spec.owner_scope.as_str(),
                    resources: u
                        .deps
                        .iter()
                        .map(|d| self.resources[d.res].spec.name.clone())
                        .collect(),
                    vacancy,
                    line: self.line_status(i, now),
                }
            })
            .collect();
        let mut work: Vec<WorkStatus> = self
            .entries
            .values()
            .map(|e| WorkStatus {
                id: e.reservation.id.to_string(),
                upstream: self.upstreams[e.upstream].spec.name.clone(),
                model: e.reservation.model.clone(),
                resources: e
                    .reservation
                    .charges
                    .iter()
                    .map(|c| c.resource.clone())
                    .collect(),
                age_s: (now.since(e.reservation.admitted_at) + e.started_before).as_secs(),
                completion: e.reservation.completion,
                phase: e.phase,
                held_reason: e.held_reason.clone(),
                upstream_ref: e.reservation.upstream_ref.clone(),
                borrower: e.reservation.borrower.as_ref().map(|b| b.name.to_string()),
            })
            .collect();
        work.sort_by(|a, b| b.age_s.cmp(&a.age_s).then_with(|| a.id.cmp(&b.id)));
        EngineStatus {
            lending: self.lending,
            owner: self.owner,
            owner_veto: OwnerVetoStatus {
                active: veto_reason.is_some(),
                reason: veto_reason,
                exempt_upstreams: exempt,
            },
            resources,
            upstreams,
            work,
            reclaims: self.reclaim_statuses(now),
            terms: self.term_statuses(now),
            borrowers: self.borrower_statuses(now),
        }
    }
}

#[cfg(test)]
mod tests;
