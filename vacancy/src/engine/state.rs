//! One resource's state: its holder, its samples, and the checks on them.

use crate::engine::inputs::PressureVerdict;
use crate::engine::priors::PendingFootprint;
use crate::engine::refusal::{Refusal, RefusalCode};
use crate::engine::spec::ResourceSpec;
use crate::engine::status::ResourceStatus;
use crate::engine::terms::HeatState;
use crate::engine::work::EntryId;
use crate::engine::{CapacitySample, ResourceKind};
use crate::time::Moment;

/// What admission may rely on for a resource's capacity.
pub(crate) enum Capacity {
    Known(CapacitySample),
    Unknown(String),
}

#[derive(Debug)]
pub(crate) struct ResourceState {
    pub spec: ResourceSpec,
    pub enabled: bool,
    pub holder: Option<EntryId>,
    pub pressure: PressureVerdict,
    /// Whether the pressure reading would let a pressure reclaim stand down
    /// (RECL-06: fresh, calibrated, below threshold, not rising).
    pub pressure_cleared: bool,
    /// A pressure edge not yet turned into reclaims (PRES-03).
    pub pressure_trigger: Option<String>,
    /// The newest successful sample.
    last_sample: Option<CapacitySample>,
    /// A failed attempt newer than `last_sample`: capacity is unknown until a later success.
    failure: Option<(Moment, String)>,
    /// Set when a job ends: a successful sample taken strictly after it is due (ADM-04).
    needs_sample_after: Option<Moment>,
    /// The last job end or unload: residency and foreign-work evidence must be newer.
    pub last_disturbed: Moment,
    pub footprint: Option<PendingFootprint>,
    /// Its heat and power limits' state (issue 35).
    pub heat: HeatState,
}

impl ResourceState {
    pub fn new(spec: ResourceSpec) -> Self {
        ResourceState {
            heat: HeatState::new(spec.heat),
            enabled: spec.enabled,
            spec,
            holder: None,
            pressure: PressureVerdict::Admits,
            pressure_cleared: true,
            pressure_trigger: None,
            last_sample: None,
            failure: None,
            needs_sample_after: None,
            last_disturbed: Moment::ZERO,
            footprint: None,
        }
    }

    pub fn record_sample(&mut self, sample: CapacitySample) {
        if self
            .last_sample
            .is_some_and(|s| s.taken_at > sample.taken_at)
        {
            return; // a late reading never replaces a newer one
        }
        self.last_sample = Some(sample);
        if self
            .failure
            .as_ref()
            .is_some_and(|(at, _)| sample.taken_at > *at)
        {
            self.failure = None;
        }
        self.heat
            .record(&self.spec.name, sample.taken_at, sample.heat);
        if let Some((at, _)) = &self.failure {
            // A failure at the same moment still stands (capacity unknown).
            self.heat.failed(*at);
        }
        if self
            .needs_sample_after
            .is_some_and(|after| sample.taken_at > after)
        {
            self.needs_sample_after = None;
        }
    }

    pub fn record_failure(&mut self, at: Moment, reason: &str) {
        if self.last_sample.is_none_or(|s| at >= s.taken_at) {
            self.failure = Some((at, reason.to_owned()));
            self.heat.failed(at);
        }
    }

    /// Whether the last sample is trustworthy at `now` (no newer failure,
    /// not older than `max_sample_age`), and why not.
    pub fn fresh(&self, now: Moment) -> Result<(), String> {
        match self.capacity(now) {
            Capacity::Known(_) => Ok(()),
            Capacity::Unknown(why) => Err(self.borrower_words(why)),
        }
    }

    /// Why capacity is unknown, in words for a borrower's refusal: a failed
    /// sample's own message can name a path or an OS error, which stay in the
    /// log and the owner's /status.
    pub fn borrower_words(&self, why: String) -> String {
        if self.failure.is_some() {
            "the last sample failed (the owner sees why in vacancyd status)".to_owned()
        } else {
            why
        }
    }

    /// When the last sample turns too old to trust.
    pub fn stale_at(&self) -> Option<Moment> {
        self.last_sample
            .map(|s| s.taken_at.after(self.spec.max_sample_age))
    }

    /// A job ended or models were unloaded: a fresh sample is due, and older
    /// evidence (residency, footprints) no longer describes the resource.
    pub fn disturbed(&mut self, now: Moment) {
        self.needs_sample_after = Some(self.needs_sample_after.map_or(now, |t| t.max(now)));
        self.last_disturbed = self.last_disturbed.max(now);
        self.footprint = None;
    }

    pub fn awaiting_fresh_sample(&self) -> bool {
        self.needs_sample_after.is_some()
    }

    pub fn capacity(&self, now: Moment) -> Capacity {
        if let Some((_, why)) = &self.failure {
            return Capacity::Unknown(format!("the last sample failed: {why}"));
        }
        let Some(sample) = self.last_sample else {
            return Capacity::Unknown("no sample has been taken yet".to_owned());
        };
        let age = now.since(sample.taken_at);
        if age > self.spec.max_sample_age {
            return Capacity::Unknown(format!(
                "the last sample is {} ms old (max_sample_age_ms = {})",
                age.as_millis(),
                self.spec.max_sample_age.as_millis()
            ));
        }
        if self.spec.kind == ResourceKind::Cpu && sample.busy_pct.is_none() {
            return Capacity::Unknown("the sampler reports no CPU load".to_owned());
        }
        Capacity::Known(sample)
    }

    /// Whether `required` MiB fits above the reserve (MEM-01), or, with no
    /// requirement, whether free memory is at least the reserve (MEM-05).
    /// A CPU resource is judged by how busy it is (SCOPE-08).
    pub fn check_fit(&self, sample: &CapacitySample, required: Option<u64>) -> Option<Refusal> {
        let name = &self.spec.name;
        if self.spec.kind == ResourceKind::Cpu {
            let busy = sample.busy_pct.unwrap_or(100);
            if busy > self.spec.busy_max_pct {
                return Some(
                    Refusal::new(
                        RefusalCode::ResourceBusy,
                        format!(
                            "cpu {name} is {busy}% busy, above busy_max_pct = {}; retry when the machine is quieter",
                            self.spec.busy_max_pct
                        ),
                    )
                    .on_resource(name),
                );
            }
            return None;
        }
        let reserve = self.spec.reserve_mib;
        let free = sample.free_mib;
        let beyond = free.saturating_sub(reserve);
        match required {
            // The floor holds even for a zero requirement (resident credit): free
            // memory below the reserve admits nothing (MEM-01, MEM-05).
            _ if free < reserve => Some(
                Refusal::new(
                    RefusalCode::InsufficientMemory,
                    format!("{name} has {free} MiB free, below its {reserve} MiB reserve; retry when memory frees up"),
                )
                .on_resource(name),
            ),
            Some(req) if req > beyond => Some(
                Refusal::new(
                    RefusalCode::InsufficientMemory,
                    format!(
                        "{name} has {free} MiB free, {beyond} MiB of it above the {reserve} MiB reserve, but the job needs {req} MiB above the reserve; retry when memory frees up, or lower the requirement in [upstream.models] or the reserve"
                    ),
                )
                .on_resource(name),
            ),
            _ => None,
        }
    }

    /// The owner switched this resource off for lending.
    pub fn disabled_refusal(&self) -> Option<Refusal> {
        (!self.enabled).then(|| {
            Refusal::new(
                RefusalCode::ResourceDisabled,
                format!(
                    "the owner switched resource {} off for lending",
                    self.spec.name
                ),
            )
            .on_resource(&self.spec.name)
        })
    }

    /// The owner's workload puts pressure on this GPU (PRES-01).
    pub fn pressure_refusal(&self) -> Option<Refusal> {
        match &self.pressure {
            PressureVerdict::Refuses(why) => Some(
                Refusal::new(
                    RefusalCode::Pressure,
                    format!(
                        "the owner's workload puts pressure on {}: {why}",
                        self.spec.name
                    ),
                )
                .on_resource(&self.spec.name),
            ),
            _ => None,
        }
    }

    pub fn status(&self, now: Moment) -> ResourceStatus {
        let capacity_unknown = match self.capacity(now) {
            Capacity::Known(_) => None,
            Capacity::Unknown(why) => Some(why),
        };
        ResourceStatus {
            name: self.spec.name.clone(),
            kind: self.spec.kind.as_str(),
            free_mib: self.last_sample.map(|s| s.free_mib),
            total_mib: self.last_sample.map(|s| s.total_mib),
            busy_pct: self.last_sample.and_then(|s| s.busy_pct),
            reserve_mib: self.spec.reserve_mib,
            sample_age_ms: self
                .last_sample
                .map(|s| u64::try_from(now.since(s.taken_at).as_millis()).unwrap_or(u64::MAX)),
            capacity_unknown,
            awaiting_fresh_sample: self.awaiting_fresh_sample(),
            enabled: self.enabled,
            pressure: match &self.pressure {
                PressureVerdict::Admits => "admits".to_owned(),
                PressureVerdict::Refuses(why) => why.clone(),
            },
            reserved_by: self.holder.map(|h| h.to_string()),
            heat: self
                .heat
                .limits
                .map(|_| self.last_sample.map(|s| s.heat).unwrap_or_default()),
        }
    }
}
