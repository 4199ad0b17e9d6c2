//! The pressure tracker of one GPU: pure state, fed samples, misses and ticks.
//!
//! No IO and no clock reads: every input carries the caller's `now`
//! ([`Moment`]), so the tracker runs the same under simulated time in tests.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::engine::PressureVerdict;
use crate::time::Moment;

/// The tracker's settings, from `[owner.gpu_pressure]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PressureParams {
    /// How often the owner's load is sampled (`poll_ms`).
    pub poll: Duration,
    /// How many utilization points above the baseline count as pressure.
    pub util_threshold_pct: u8,
    /// How many MiB above the baseline count as pressure.
    pub memory_threshold_mib: u64,
    /// How long the load must stay above the threshold before pressure engages.
    pub engage_after: Duration,
    /// How long engaged pressure must be observed quiet before it releases (PRES-08).
    pub quiet_for: Duration,
}

impl PressureParams {
    /// How long a GPU may go without a good sample before accepted work is
    /// reclaimed: three polls, at least 20 s (PRES-05).
    pub fn gap_limit(&self) -> Duration {
        (self.poll.saturating_mul(3)).max(Duration::from_secs(20))
    }

    /// How old the last good sample may be before the reading is unknown:
    /// two polls, at least 15 s (PRES-11).
    pub fn stale_after(&self) -> Duration {
        (self.poll.saturating_mul(2)).max(Duration::from_secs(15))
    }
}

impl Default for PressureParams {
    /// The defaults of `[owner.gpu_pressure]`.
    fn default() -> Self {
        PressureParams {
            poll: Duration::from_millis(2000),
            util_threshold_pct: 25,
            memory_threshold_mib: 1024,
            engage_after: Duration::from_millis(4000),
            quiet_for: Duration::from_millis(30_000),
        }
    }
}

/// The owner's attributed load on one GPU: what its processes (everything
/// but the lent upstream servers) use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OwnerLoad {
    /// Utilization in percent, 0..=100.
    pub util_pct: u8,
    /// GPU memory in MiB.
    pub memory_mib: u64,
}

impl std::fmt::Display for OwnerLoad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}% / {} MiB", self.util_pct, self.memory_mib)
    }
}

/// Whether the owner is at the machine when a sample is taken (PRES-10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Attendance {
    /// The owner is present.
    Attended,
    /// The owner is away.
    Unattended,
}

impl Attendance {
    /// `attended` or `unattended`.
    pub fn as_str(self) -> &'static str {
        match self {
            Attendance::Attended => "attended",
            Attendance::Unattended => "unattended",
        }
    }
}

impl std::fmt::Display for Attendance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A GPU's calibrated normal load, attended and unattended (`None`: not calibrated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Baseline {
    /// The owner's normal load while present.
    pub attended: Option<OwnerLoad>,
    /// The owner's normal load while away.
    pub unattended: Option<OwnerLoad>,
}

impl Baseline {
    /// The baseline for `attendance`, if calibrated.
    pub fn for_attendance(&self, attendance: Attendance) -> Option<OwnerLoad> {
        match attendance {
            Attendance::Attended => self.attended,
            Attendance::Unattended => self.unattended,
        }
    }

    /// Set the baseline for `attendance`.
    pub fn set(&mut self, attendance: Attendance, load: OwnerLoad) {
        match attendance {
            Attendance::Attended => self.attended = Some(load),
            Attendance::Unattended => self.unattended = Some(load),
        }
    }
}

/// Why no good sample was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Miss {
    /// The attribution read failed: the reading is unavailable at once (PRES-04).
    ReadFailed(String),
    /// Presence is unknown, so there is no baseline to judge against and no
    /// sample was taken: the last reading stands until it is stale (PRES-10, PRES-11).
    PresenceUnknown,
}

impl std::fmt::Display for Miss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Miss::ReadFailed(why) => write!(f, "the attribution read failed: {why}"),
            Miss::PresenceUnknown => {
                f.write_str("owner presence is unknown, so nothing was sampled")
            }
        }
    }
}

/// Which condition a [`Trigger`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TriggerKind {
    /// The owner's load stayed above the threshold for `engage_after` (PRES-03),
    /// or went above it again while pressure was releasing (PRES-09).
    Engaged,
    /// A sample had no baseline for its attendance (PRES-03, PRES-09).
    Uncalibrated,
    /// No good sample for the gap limit (PRES-05, PRES-13), or a good sample
    /// ended a gap that long (PRES-06).
    Gap,
}

/// An edge that should start a reclaim of the work depending on this GPU (PRES-01, PRES-02).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trigger {
    /// The condition that fired (the first, when one input fired several).
    pub kind: TriggerKind,
    /// Why, for the reclaim log.
    pub why: String,
}

/// What the tracker says about its GPU now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PressureReading {
    /// Calibrated and below the threshold, not engaged: admits new work.
    Quiet,
    /// Above the threshold, not yet for `engage_after`.
    Rising,
    /// Above the threshold: pressure is engaged.
    Engaged,
    /// Engaged, now below the threshold, but not yet quiet for `quiet_for`.
    Releasing,
    /// The last sample had no baseline for its attendance.
    Uncalibrated(Attendance),
    /// No trustworthy reading: a failed read, no sample yet, or the last good
    /// sample is stale (PRES-04, PRES-11, PRES-12).
    Unavailable(String),
}

/// What one poll of a GPU observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// A good sample of the owner's load, taken while presence was known to
    /// be this attendance (PRES-10).
    Sample(OwnerLoad, Attendance),
    /// No good sample: a failed read, or presence unknown.
    Miss(Miss),
}

/// What a GPU's tracker says after one poll: everything the engine needs
/// ([`Engine::apply_pressure`](crate::engine::Engine::apply_pressure)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PressureUpdate {
    /// The GPU resource.
    pub resource: String,
    /// The reading after the poll.
    pub reading: PressureReading,
    /// Whether new work on the GPU is admitted, or why not (PRES-04).
    pub verdict: PressureVerdict,
    /// Whether a pressure reclaim on the GPU may stand down (RECL-06, RECL-07).
    pub cleared: bool,
    /// An edge that reclaims the GPU's work, if the poll fired one (PRES-01..03).
    pub trigger: Option<Trigger>,
}

/// A good sample as the tracker judged it.
#[derive(Debug, Clone, Copy)]
struct Good {
    at: Moment,
    load: OwnerLoad,
    attendance: Attendance,
    /// The baseline it was judged against; `None`: uncalibrated.
    baseline: Option<OwnerLoad>,
    above: bool,
}

/// The pressure state of one GPU resource.
///
/// # Behavior
///
/// - A sample is *above threshold* when its utilization exceeds the baseline
///   for its attendance by more than `util_threshold_pct`, or its memory by
///   more than `memory_threshold_mib`; without a baseline it is *uncalibrated*.
/// - Pressure engages when the load has stayed above the threshold for
///   `engage_after`, counted from the first sample above it; misses do not
///   reset that time (PRES-07), an observed sample below does. Engagement
///   is decided on samples, never on ticks.
/// - Engaged pressure releases only after `quiet_for` of continuously observed
///   quiet samples, decided on the sample that completes it; a miss or an
///   uncalibrated sample restarts the quiet time (PRES-08).
/// - Triggers ([`Trigger`]) are edges: engaged (PRES-03; again when the load
///   rises above the threshold while releasing, PRES-09), uncalibrated (once
///   per run of uncalibrated samples, PRES-03, PRES-09) and the gap (once per
///   gap: when `gap_limit` has passed since the last good sample, on a miss
///   or tick, PRES-05, PRES-13, or when the good sample ending such a gap
///   arrives first, even if it is quiet, PRES-06). Before any good sample, the
///   gap counts from the tracker's creation.
/// - A failed read makes the reading unavailable at once (PRES-04); a miss
///   because presence is unknown leaves the last reading standing until it is
///   older than `stale_after` (PRES-11, PRES-12).
#[derive(Debug, Clone)]
pub struct PressureTracker {
    resource: String,
    params: PressureParams,
    baseline: Baseline,
    created: Moment,
    last_good: Option<Good>,
    /// A failed read after the last good sample, with why.
    failed: Option<String>,
    /// The start of the current run of samples above the threshold.
    above_since: Option<Moment>,
    /// Pressure is engaged (possibly releasing).
    engaged: bool,
    /// While engaged: the start of the current run of observed quiet samples.
    quiet_since: Option<Moment>,
    /// An engaged trigger fired and no quiet sample has come since.
    engaged_fired: bool,
    /// An uncalibrated trigger fired and no calibrated sample has come since.
    uncalibrated_fired: bool,
    /// A gap trigger fired and no good sample has come since.
    gap_fired: bool,
}

impl PressureTracker {
    /// A tracker for the GPU resource `resource`, created at `now`, with no sample yet.
    pub fn new(
        resource: impl Into<String>,
        params: PressureParams,
        baseline: Baseline,
        now: Moment,
    ) -> Self {
        PressureTracker {
            resource: resource.into(),
            params,
            baseline,
            created: now,
            last_good: None,
            failed: None,
            above_since: None,
            engaged: false,
            quiet_since: None,
            engaged_fired: false,
            uncalibrated_fired: false,
            gap_fired: false,
        }
    }

    /// The GPU resource's name.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The settings.
    pub fn params(&self) -> &PressureParams {
        &self.params
    }

    /// The calibration in use.
    pub fn baseline(&self) -> &Baseline {
        &self.baseline
    }

    /// Use a new calibration from the next sample on.
    pub fn set_baseline(&mut self, baseline: Baseline) {
        self.baseline = baseline;
    }

    /// When the gap counts from: the last good sample, or the tracker's creation.
    fn gap_origin(&self) -> Moment {
        self.last_good.map_or(self.created, |g| g.at)
    }

    /// The gap trigger, if the gap limit has been reached and it has not fired.
    fn check_gap(&mut self, now: Moment) -> Option<Trigger> {
        let gap = now.since(self.gap_origin());
        if self.gap_fired || gap < self.params.gap_limit() {
            return None;
        }
        self.gap_fired = true;
        let from = if self.last_good.is_some() {
            "its last good sample"
        } else {
            "pressure tracking started"
        };
        Some(Trigger {
            kind: TriggerKind::Gap,
            why: format!(
                "no good GPU pressure sample on {} for {} since {from} (gap limit {})",
                self.resource,
                secs(gap),
                secs(self.params.gap_limit())
            ),
        })
    }

    /// A good sample of the owner's load, taken at `now` while presence was
    /// known to be `attendance` (PRES-10).
    // Long: the tracker's one transition on a good sample (baseline, engage, quiet, release), PRES-01..13 in order.
    pub fn on_sample(
        &mut self,
        now: Moment,
        load: OwnerLoad,
        attendance: Attendance,
    ) -> Option<Trigger> {
        let mut fired: Vec<Trigger> = Vec::new();
        // PRES-06: a good sample ending a gap that no miss or tick reported.
        if let Some(t) = self.check_gap(now) {
            fired.push(Trigger {
                kind: t.kind,
                why: format!("a good sample ended a gap: {}", t.why),
            });
        }
        self.gap_fired = false;
        self.failed = None;
        let baseline = self.baseline.for_attendance(attendance);
        let above = baseline.is_some_and(|b| self.is_above(load, b));
        self.last_good = Some(Good {
            at: now,
            load,
            attendance,
            baseline,
            above,
        });
        match baseline {
            None => {
                // Unjudgeable: like a miss for the engage and quiet times.
                self.quiet_since = None;
                if !self.uncalibrated_fired {
                    self.uncalibrated_fired = true;
                    fired.push(Trigger {
                        kind: TriggerKind::Uncalibrated,
                        why: format!(
                            "GPU pressure on {} has no {attendance} baseline to judge the owner's load ({load}) against",
                            self.resource
                        ),
                    });
                }
            }
            Some(b) if above => {
                self.uncalibrated_fired = false;
                self.quiet_since = None;
                let since = *self.above_since.get_or_insert(now);
                if !self.engaged && now.since(since) >= self.params.engage_after {
                    self.engaged = true;
                }
                if self.engaged && !self.engaged_fired {
                    self.engaged_fired = true;
                    fired.push(Trigger {
                        kind: TriggerKind::Engaged,
                        why: format!(
                            "GPU pressure on {} engaged: the owner's load is {load}, above its {attendance} baseline of {b} plus the threshold, for {}",
                            self.resource,
                            secs(now.since(since))
                        ),
                    });
                }
            }
            Some(_) => {
                self.uncalibrated_fired = false;
                self.above_since = None;
                self.engaged_fired = false;
                if self.engaged {
                    let since = *self.quiet_since.get_or_insert(now);
                    if now.since(since) >= self.params.quiet_for {
                        self.engaged = false;
                        self.quiet_since = None;
                        tracing::info!(resource = %self.resource, quiet_s = now.since(since).as_secs(), "GPU pressure released");
                    }
                }
            }
        }
        let mut fired = fired.into_iter();
        let first = fired.next()?;
        let why = std::iter::once(first.why)
            .chain(fired.map(|t| t.why))
            .collect::<Vec<_>>()
            .join("; ");
        tracing::info!(resource = %self.resource, kind = ?first.kind, %why, "GPU pressure trigger");
        Some(Trigger {
            kind: first.kind,
            why,
        })
    }

    /// No good sample at `now`: a failed read or presence unknown.
    pub fn on_miss(&mut self, now: Moment, why: Miss) -> Option<Trigger> {
        // PRES-08: quiet that was not observed is not evidence.
        self.quiet_since = None;
        // PRES-07: above_since is kept.
        if let Miss::ReadFailed(reason) = &why {
            tracing::debug!(resource = %self.resource, %reason, "GPU pressure read failed");
            self.failed = Some(reason.clone());
        }
        let t = self.check_gap(now);
        if let Some(t) = &t {
            tracing::info!(resource = %self.resource, why = %t.why, "GPU pressure trigger");
        }
        t
    }

    /// Time has passed: reports the gap limit being reached (PRES-05, PRES-13).
    pub fn tick(&mut self, now: Moment) -> Option<Trigger> {
        let t = self.check_gap(now);
        if let Some(t) = &t {
            tracing::info!(resource = %self.resource, why = %t.why, "GPU pressure trigger");
        }
        t
    }

    /// One poll at `now`: fold in what it observed, check the gap limit, and
    /// say what the engine needs. The daemon's pressure loop and the Python
    /// binding both poll through this, so they decide alike.
    pub fn poll(&mut self, now: Moment, observation: Observation) -> PressureUpdate {
        let trigger = match observation {
            Observation::Sample(load, attendance) => self.on_sample(now, load, attendance),
            Observation::Miss(why) => self.on_miss(now, why),
        };
        let trigger = trigger.or_else(|| self.tick(now));
        PressureUpdate {
            resource: self.resource.clone(),
            reading: self.reading(now),
            verdict: self.verdict(now),
            cleared: self.cleared(now),
            trigger,
        }
    }

    fn is_above(&self, load: OwnerLoad, baseline: OwnerLoad) -> bool {
        u16::from(load.util_pct)
            > u16::from(baseline.util_pct) + u16::from(self.params.util_threshold_pct)
            || load.memory_mib
                > baseline
                    .memory_mib
                    .saturating_add(self.params.memory_threshold_mib)
    }

    /// The last good sample, if it still stands at `now`: no failed read
    /// since, and not stale.
    fn standing(&self, now: Moment) -> Result<Good, String> {
        let Some(good) = self.last_good else {
            return Err(match &self.failed {
                Some(why) => format!("the attribution read failed: {why}"),
                None => "no pressure sample yet".to_owned(),
            });
        };
        if let Some(why) = &self.failed {
            return Err(format!("the attribution read failed: {why}"));
        }
        let age = now.since(good.at);
        if age > self.params.stale_after() {
            return Err(format!(
                "the last good sample is {} old (stale after {})",
                secs(age),
                secs(self.params.stale_after())
            ));
        }
        Ok(good)
    }

    /// The reading at `now`.
    pub fn reading(&self, now: Moment) -> PressureReading {
        match self.standing(now) {
            Err(why) => PressureReading::Unavailable(why),
            Ok(g) if g.baseline.is_none() => PressureReading::Uncalibrated(g.attendance),
            Ok(g) if g.above && self.engaged => PressureReading::Engaged,
            Ok(g) if g.above => PressureReading::Rising,
            Ok(_) if self.engaged => PressureReading::Releasing,
            Ok(_) => PressureReading::Quiet,
        }
    }

    /// Whether pressure admits new work at `now`: only a [`PressureReading::Quiet`]
    /// reading does; every other refuses with the reason (PRES-04).
    pub fn verdict(&self, now: Moment) -> PressureVerdict {
        let r = &self.resource;
        let reason = match (self.reading(now), self.standing(now)) {
            (PressureReading::Quiet, _) => return PressureVerdict::Admits,
            (PressureReading::Unavailable(why), _) => {
                format!("GPU pressure on {r} is unavailable: {why}")
            }
            (PressureReading::Uncalibrated(a), _) => format!(
                "GPU pressure on {r} has no {a} baseline; calibrate it with `vacancyd calibrate-pressure --resource {r} --{a}`"
            ),
            (reading, Ok(g)) => {
                let b = g.baseline.unwrap_or_default();
                let p = &self.params;
                let over = format!(
                    "the owner's load on {r} is {}, above its {} baseline of {b} plus {}% / {} MiB",
                    g.load, g.attendance, p.util_threshold_pct, p.memory_threshold_mib
                );
                let above_for = self.above_since.map_or(Duration::ZERO, |s| now.since(s));
                match reading {
                    PressureReading::Rising => format!(
                        "{over} for {}; pressure engages after {}",
                        secs(above_for),
                        secs(p.engage_after)
                    ),
                    PressureReading::Engaged => {
                        format!("GPU pressure engaged: {over} for {}", secs(above_for))
                    }
                    _ => {
                        let quiet = self.quiet_since.map_or(Duration::ZERO, |s| now.since(s));
                        format!(
                            "GPU pressure on {r} is releasing: the owner's load ({}) has been observed below its threshold for {} of the {} it must stay quiet",
                            g.load,
                            secs(quiet),
                            secs(p.quiet_for)
                        )
                    }
                }
            }
            (_, Err(why)) => format!("GPU pressure on {r} is unavailable: {why}"),
        };
        PressureVerdict::Refuses(reason)
    }

    /// Whether a pressure trigger on this GPU has cleared at `now` (RECL-06):
    /// the last good sample is fresh, calibrated, below the threshold and not
    /// rising. A reading that is merely not engaged (unavailable, stale) has
    /// not cleared (RECL-07). [`PressureReading::Releasing`] has cleared,
    /// although its verdict still refuses new work.
    pub fn cleared(&self, now: Moment) -> bool {
        matches!(
            self.reading(now),
            PressureReading::Quiet | PressureReading::Releasing
        )
    }
}

/// A duration as whole seconds when it is one, else with milliseconds: `4 s`, `2.5 s`.
fn secs(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

#[cfg(test)]
#[path = "pressure_tests.rs"]
mod tests;
