//! The owner's terms beyond presence (issue 35): lending hours, the battery,
//! and each GPU's heat and power limits.
//!
//! Each term is a veto like the owner's presence: it refuses new work with a
//! code of its own and reclaims accepted work through the upstream's
//! `on_owner_return` / `drain_timeout_s`. All are inputs: the shell projects
//! the lending hours onto the engine's timeline ([`LendingHours`]), reads the
//! power supply ([`PowerSource`]) and reads each GPU's temperature, power and
//! fan with its capacity sample ([`HeatReading`]); the engine decides with
//! `now`. Off unless configured: with no hours, no power source and no heat
//! limits nothing here refuses or reclaims.

use std::time::Duration;

use serde::Serialize;

use crate::engine::refusal::{Refusal, RefusalCode};
use crate::time::Moment;

/// One change of the lending hours on the engine's timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoursChange {
    /// When it happens.
    pub at: Moment,
    /// Whether lending opens (else it closes).
    pub opens: bool,
    /// The local time, as the owner reads it (`Mon 2026-12-07 19:00 CET`).
    pub local: String,
}

/// The lending hours as the shell projects them: open or not at `as_of`,
/// and each change after it. The engine evaluates them at `now`, so a change
/// takes effect at its moment even before the shell's next projection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LendingHours {
    /// The schedule in words, with its time zone.
    pub schedule: String,
    /// Whether lending is open at `as_of`.
    pub open: bool,
    /// When the projection was made.
    pub as_of: Moment,
    /// The changes after `as_of`, earliest first.
    pub changes: Vec<HoursChange>,
}

impl LendingHours {
    /// Whether lending is open at `now`.
    pub fn open_at(&self, now: Moment) -> bool {
        self.changes
            .iter()
            .take_while(|c| c.at <= now)
            .last()
            .map_or(self.open, |c| c.opens)
    }

    /// The first change after `now`, if the projection shows one.
    pub fn next_change(&self, now: Moment) -> Option<&HoursChange> {
        self.changes.iter().find(|c| c.at > now)
    }

    /// The next opening after `now`, if the projection shows one.
    pub fn next_opening(&self, now: Moment) -> Option<&HoursChange> {
        self.changes.iter().find(|c| c.at > now && c.opens)
    }

    /// Whether lending closed at some moment in `(after, now]`.
    fn closed_between(&self, after: Moment, now: Moment) -> bool {
        self.changes
            .iter()
            .any(|c| !c.opens && c.at > after && c.at <= now)
    }
}

/// What the machine runs on, read from its power supply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PowerSource {
    /// Mains power (also: a machine with no battery).
    Mains,
    /// The battery.
    Battery,
    /// The supply could not be read: refuses like the battery.
    Unknown(String),
}

impl PowerSource {
    /// `mains`, `battery` or `unknown`.
    pub fn as_str(&self) -> &'static str {
        match self {
            PowerSource::Mains => "mains",
            PowerSource::Battery => "battery",
            PowerSource::Unknown(_) => "unknown",
        }
    }
}

/// A GPU's heat and power limits (`[[resource]] max_temperature_c`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeatLimits {
    /// `(max_temperature_c, resume_below_c)`: above the first new work is
    /// refused; it lends again only below the second.
    pub temperature: Option<(u32, u32)>,
    /// Above this many watts new work is refused.
    pub max_power_w: Option<u32>,
    /// Above this fan speed in percent new work is refused.
    pub max_fan_percent: Option<u8>,
    /// How long the GPU may stay above a limit (or unread) before its
    /// accepted work is reclaimed.
    pub hot_for: Duration,
}

impl HeatLimits {
    /// The limits in words, for status.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some((max, resume)) = self.temperature {
            parts.push(format!(
                "max_temperature_c = {max} (resume_below_c = {resume})"
            ));
        }
        if let Some(w) = self.max_power_w {
            parts.push(format!("max_power_w = {w}"));
        }
        if let Some(p) = self.max_fan_percent {
            parts.push(format!("max_fan_percent = {p}"));
        }
        parts.push(format!("hot_for_s = {}", self.hot_for.as_secs()));
        parts.join(", ")
    }
}

/// A GPU's temperature, power draw and fan speed, read with its capacity
/// sample; `None` where the sampler has no such reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct HeatReading {
    /// Degrees Celsius.
    pub temperature_c: Option<u32>,
    /// Watts.
    pub power_w: Option<u32>,
    /// Fan speed in percent of its maximum.
    pub fan_percent: Option<u8>,
}

impl HeatReading {
    /// The reading in words: `84 °C, 215 W, fan 62%`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(t) = self.temperature_c {
            parts.push(format!("{t} °C"));
        }
        if let Some(w) = self.power_w {
            parts.push(format!("{w} W"));
        }
        if let Some(f) = self.fan_percent {
            parts.push(format!("fan {f}%"));
        }
        if parts.is_empty() {
            "no reading".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// What a GPU with limits reads as now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Heat {
    /// Within every limit (and below the resume mark after a breach).
    Cool,
    /// Above a limit, or not yet back below the resume mark.
    Breach(RefusalCode, String),
    /// A configured reading is missing, failed or too old.
    Unknown(RefusalCode, String),
}

/// One GPU's heat state: the latch that gives the hysteresis, and how long
/// the GPU has not been known cool.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeatState {
    pub limits: Option<HeatLimits>,
    /// The breach latched by the last sample above a limit; cleared only by
    /// a later sample below every resume mark.
    breach: Option<(RefusalCode, String)>,
    /// A configured reading the last sample lacked.
    missing: Option<(RefusalCode, String)>,
    /// The last reading and when it was taken.
    pub last: Option<(Moment, HeatReading)>,
    /// Since when the GPU has not been known cool (the first sample above
    /// a limit or without a reading, or a failed sample, since the last
    /// cool one).
    not_cool_since: Option<Moment>,
    /// The current episode's reclaim has been started.
    pub triggered: bool,
}

impl HeatState {
    pub fn new(limits: Option<HeatLimits>) -> Self {
        HeatState {
            limits,
            ..HeatState::default()
        }
    }

    /// A sample's reading, taken at `at`, on GPU `name`: the latch moves
    /// only here, so the verdict never flips faster than one fresh sample.
    pub fn record(&mut self, name: &str, at: Moment, reading: HeatReading) {
        let Some(limits) = self.limits else {
            return;
        };
        self.last = Some((at, reading));
        self.missing = missing(name, &limits, &reading);
        let over = over_limit(name, &limits, &reading);
        self.breach = match (&self.breach, over) {
            (_, Some(over)) => Some(over),
            (Some(latched), None) if !resumed(&limits, &reading) => Some(latched.clone()),
            _ => None,
        };
        if self.breach.is_none() && self.missing.is_none() {
            self.not_cool_since = None;
            self.triggered = false;
        } else {
            self.not_cool_since.get_or_insert(at);
        }
    }

    /// A failed sample at `at`: the reading is unknown from then on.
    pub fn failed(&mut self, at: Moment) {
        if self.limits.is_some() {
            self.not_cool_since.get_or_insert(at);
        }
    }

    /// What the GPU reads as at `now`; `fresh` says whether its capacity
    /// sample is trustworthy (no newer failure, not older than
    /// `max_sample_age`), and why not.
    pub fn verdict(&self, name: &str, fresh: Result<(), String>) -> Option<Heat> {
        let limits = self.limits?;
        let code = unknown_code(&limits);
        if let Err(why) = fresh {
            return Some(Heat::Unknown(
                code,
                format!(
                    "the heat and power readings of {name} are unknown ({why}); a GPU with limits lends only on a fresh reading"
                ),
            ));
        }
        if let Some((code, why)) = &self.breach {
            return Some(Heat::Breach(*code, why.clone()));
        }
        if let Some((code, why)) = &self.missing {
            return Some(Heat::Unknown(*code, why.clone()));
        }
        if self.last.is_none() {
            return Some(Heat::Unknown(
                code,
                format!(
                    "{name} has no heat reading yet; a GPU with limits lends only on a reading"
                ),
            ));
        }
        Some(Heat::Cool)
    }

    /// Since when the GPU has not been known cool at `now`, given that its
    /// readings turn stale at `stale_at`.
    pub fn not_cool_since(&self, stale_at: Option<Moment>, now: Moment) -> Option<Moment> {
        self.limits?;
        let stale = stale_at.filter(|s| *s <= now);
        match (self.not_cool_since, stale) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The code a missing reading refuses with: a temperature or fan limit
/// refuses as too hot, a power limit alone as the power limit.
fn unknown_code(limits: &HeatLimits) -> RefusalCode {
    if limits.temperature.is_some() || limits.max_fan_percent.is_some() {
        RefusalCode::GpuTooHot
    } else {
        RefusalCode::GpuPowerLimit
    }
}

fn missing(name: &str, limits: &HeatLimits, r: &HeatReading) -> Option<(RefusalCode, String)> {
    let absent = |what: &str, key: &str| {
        format!(
            "{name} reports no {what}, and {key} is set: a missing reading is unknown, not cool, so borrowed work is refused; check the GPU's sensors (hwmon or NVML)"
        )
    };
    if limits.temperature.is_some() && r.temperature_c.is_none() {
        return Some((
            RefusalCode::GpuTooHot,
            absent("temperature", "max_temperature_c"),
        ));
    }
    if limits.max_power_w.is_some() && r.power_w.is_none() {
        return Some((
            RefusalCode::GpuPowerLimit,
            absent("power draw", "max_power_w"),
        ));
    }
    if limits.max_fan_percent.is_some() && r.fan_percent.is_none() {
        return Some((
            RefusalCode::GpuTooHot,
            absent("fan speed", "max_fan_percent"),
        ));
    }
    None
}

fn over_limit(name: &str, limits: &HeatLimits, r: &HeatReading) -> Option<(RefusalCode, String)> {
    if let (Some((max, resume)), Some(t)) = (limits.temperature, r.temperature_c)
        && t > max
    {
        return Some((
            RefusalCode::GpuTooHot,
            format!(
                "{name} is at {t} °C, above the owner's max_temperature_c = {max}; borrowed work resumes once a reading is below {resume} °C (resume_below_c)"
            ),
        ));
    }
    if let (Some(max), Some(w)) = (limits.max_power_w, r.power_w)
        && w > max
    {
        return Some((
            RefusalCode::GpuPowerLimit,
            format!(
                "{name} draws {w} W, above the owner's max_power_w = {max}; borrowed work resumes once a reading is at or below it"
            ),
        ));
    }
    if let (Some(max), Some(f)) = (limits.max_fan_percent, r.fan_percent)
        && f > max
    {
        return Some((
            RefusalCode::GpuTooHot,
            format!(
                "{name}'s fan runs at {f}%, above the owner's max_fan_percent = {max}; borrowed work resumes once a reading is at or below it"
            ),
        ));
    }
    None
}

/// Whether a reading is below every resume mark: the temperature below
/// `resume_below_c`, power and fan at or below their limits.
fn resumed(limits: &HeatLimits, r: &HeatReading) -> bool {
    let temperature = match (limits.temperature, r.temperature_c) {
        (Some((_, resume)), Some(t)) => t < resume,
        (Some(_), None) => false,
        (None, _) => true,
    };
    let power = match (limits.max_power_w, r.power_w) {
        (Some(max), Some(w)) => w <= max,
        (Some(_), None) => false,
        (None, _) => true,
    };
    let fan = match (limits.max_fan_percent, r.fan_percent) {
        (Some(max), Some(f)) => f <= max,
        (Some(_), None) => false,
        (None, _) => true,
    };
    temperature && power && fan
}

/// One term in force, for `/status`, the console and `vacancyd status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TermStatus {
    /// `lending_hours`, `battery` or `heat`.
    pub term: &'static str,
    /// The GPU, for a heat term.
    pub resource: Option<String>,
    /// What the owner set, in words.
    pub in_force: String,
    /// Its state in one word: `open` or `closed` (lending hours), `mains`,
    /// `battery` or `unknown` (battery), `cool`, `breach` or `unknown` (heat).
    pub state: &'static str,
    /// What it reads now, in words (open until ..., on mains, 61 °C, ...).
    pub now: String,
    /// Whether it refuses new work now.
    pub refusing: bool,
    /// The refusal code while it refuses.
    pub code: Option<RefusalCode>,
    /// The refusal's reason while it refuses.
    pub reason: Option<String>,
    /// Lending hours: the next opening or closing.
    pub next_change: Option<NextChange>,
}

/// The lending hours' next change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NextChange {
    /// `opens` or `closes`.
    pub change: &'static str,
    /// Its local time.
    pub at: String,
    /// Seconds from now.
    pub in_s: u64,
}

/// A span in words: `3 h 12 min`, `45 s`.
pub(crate) fn in_words(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s} s")
    } else if s < 3600 && !s.is_multiple_of(60) {
        format!("{} min {} s", s / 60, s % 60)
    } else if s < 3600 {
        format!("{} min", s / 60)
    } else if s < 48 * 3600 {
        format!("{} h {} min", s / 3600, (s % 3600) / 60)
    } else {
        format!("{} days {} h", s / 86_400, (s % 86_400) / 3600)
    }
}

use crate::engine::Engine;

impl Engine {
    /// The lending hours, as the shell projected them; `None`: lending at
    /// all hours (the term is off). A new projection replaces the last; a
    /// change wakes reclaims and waiters.
    pub fn set_lending_hours(&mut self, hours: Option<LendingHours>) {
        self.terms.hours = hours;
        self.effects.push(crate::engine::Effect::WakeReclaims);
        self.wake_waiters();
    }

    /// Whether the lending hours are open at `now` (`None`: no lending hours).
    pub fn lending_hours_open(&self, now: Moment) -> Option<bool> {
        self.terms.hours.as_ref().map(|h| h.open_at(now))
    }

    /// What the power supply reads, where `[owner] on_battery = "pause"`:
    /// `None` switches the term off. Leaving mains (for the battery or an
    /// unreadable supply) is an edge: the next
    /// [`reclaim_step`](Self::reclaim_step) reclaims every upstream's work.
    pub fn set_power(&mut self, power: Option<PowerSource>) {
        let was_mains = self.terms.power == Some(PowerSource::Mains);
        let now_mains = power == Some(PowerSource::Mains);
        if was_mains && power.is_some() && !now_mains {
            self.terms.power_edge = true;
        }
        if self.terms.power != power {
            self.effects.push(crate::engine::Effect::WakeReclaims);
            self.wake_waiters();
        }
        self.terms.power = power;
    }

    /// What the power supply last read (`None`: the term is off).
    pub fn power(&self) -> Option<&PowerSource> {
        self.terms.power.as_ref()
    }

    /// The refusal of the host-wide terms at `now`: outside the lending
    /// hours, or on battery (or an unreadable supply) with `on_battery =
    /// "pause"`. They apply to every upstream, exempt ones included:
    /// neither is about the owner's presence.
    pub(crate) fn terms_refusal(&self, now: Moment) -> Option<Refusal> {
        self.hours_refusal(now).or_else(|| self.battery_refusal())
    }

    /// Outside the lending hours at `now`: refused until the next opening.
    fn hours_refusal(&self, now: Moment) -> Option<Refusal> {
        let h = self.terms.hours.as_ref()?;
        if !h.open_at(now) {
            let mut refusal = Refusal::new(
                RefusalCode::OutsideLendingHours,
                match h.next_opening(now) {
                    Some(next) => format!(
                        "the owner lends only in their lending hours ({}); lending opens at {}, in {}; retry then",
                        h.schedule,
                        next.local,
                        in_words(next.at.since(now))
                    ),
                    None => format!(
                        "the owner lends only in their lending hours ({}); retry in the next window",
                        h.schedule
                    ),
                },
            );
            refusal.retry_in = h
                .next_opening(now)
                .map(|next| next.at.since(now).max(Duration::from_secs(1)));
            return Some(refusal);
        }
        None
    }

    /// On battery, or with a supply that cannot be read, under `on_battery
    /// = "pause"`. What could not be read (a path, an OS error) stays out
    /// of the borrower's refusal: `/status` and the log say it.
    fn battery_refusal(&self) -> Option<Refusal> {
        match &self.terms.power {
            Some(PowerSource::Battery) => Some(Refusal::new(
                RefusalCode::OnBattery,
                "the machine runs on battery and its owner lends only on mains power ([owner] on_battery = \"pause\"); borrowed work resumes once it is plugged in",
            )),
            Some(PowerSource::Unknown(_)) => Some(Refusal::new(
                RefusalCode::OnBattery,
                "the machine's power supply cannot be read, and the owner lends only on mains power ([owner] on_battery = \"pause\"); an unknown supply counts as the battery",
            )),
            _ => None,
        }
    }

    /// The refusal of a GPU's heat and power limits at `now`, if any.
    pub(crate) fn heat_refusal(&self, res: usize, now: Moment) -> Option<Refusal> {
        let r = &self.resources[res];
        match r.heat.verdict(&r.spec.name, r.fresh(now))? {
            Heat::Cool => None,
            Heat::Breach(code, why) | Heat::Unknown(code, why) => {
                Some(Refusal::new(code, why).on_resource(&r.spec.name))
            }
        }
    }

    /// Since when GPU `res` has not been known cool at `now`, if it has limits.
    pub(crate) fn heat_not_cool_since(&self, res: usize, now: Moment) -> Option<Moment> {
        let r = &self.resources[res];
        r.heat.not_cool_since(r.stale_at(), now)
    }

    /// The moment GPU `res`'s accepted work is reclaimed, if it is not known
    /// cool and its reclaim has not started: `hot_for` after it stopped being
    /// known cool.
    pub(crate) fn heat_deadline(&self, res: usize, now: Moment) -> Option<Moment> {
        let r = &self.resources[res];
        if r.heat.triggered {
            return None;
        }
        let limits = r.heat.limits?;
        Some(self.heat_not_cool_since(res, now)?.after(limits.hot_for))
    }

    /// Every term in force at `now`, for status.
    pub(crate) fn term_statuses(&self, now: Moment) -> Vec<TermStatus> {
        let mut out = Vec::new();
        if let Some(h) = &self.terms.hours {
            let open = h.open_at(now);
            let refusal = self.hours_refusal(now);
            let next_change = h.next_change(now).map(|c| NextChange {
                change: if c.opens { "opens" } else { "closes" },
                at: c.local.clone(),
                in_s: c.at.since(now).as_secs(),
            });
            let now_text = match (&next_change, open) {
                (Some(n), true) => format!(
                    "open; lending closes at {}, in {}",
                    n.at,
                    in_words(Duration::from_secs(n.in_s))
                ),
                (Some(n), false) => format!(
                    "closed; lending opens at {}, in {}",
                    n.at,
                    in_words(Duration::from_secs(n.in_s))
                ),
                (None, true) => "open at all hours of the week ahead".to_owned(),
                (None, false) => "closed for the week ahead".to_owned(),
            };
            out.push(TermStatus {
                term: "lending_hours",
                resource: None,
                in_force: format!("[lending] hours: {}", h.schedule),
                state: if open { "open" } else { "closed" },
                now: now_text,
                refusing: refusal.is_some(),
                code: refusal.as_ref().map(|r| r.code),
                reason: refusal.map(|r| r.reason),
                next_change,
            });
        }
        if let Some(power) = &self.terms.power {
            let refusal = self.battery_refusal();
            out.push(TermStatus {
                term: "battery",
                resource: None,
                in_force: "[owner] on_battery = \"pause\"".to_owned(),
                state: power.as_str(),
                now: match power {
                    PowerSource::Mains => "on mains power".to_owned(),
                    PowerSource::Battery => "on battery".to_owned(),
                    PowerSource::Unknown(why) => format!("power supply unknown: {why}"),
                },
                refusing: refusal.is_some(),
                code: refusal.as_ref().map(|r| r.code),
                reason: refusal.map(|r| r.reason),
                next_change: None,
            });
        }
        for (i, r) in self.resources.iter().enumerate() {
            let Some(limits) = r.heat.limits else {
                continue;
            };
            let refusal = self.heat_refusal(i, now);
            let state = match r.heat.verdict(&r.spec.name, r.fresh(now)) {
                Some(Heat::Breach(..)) => "breach",
                Some(Heat::Unknown(..)) => "unknown",
                _ => "cool",
            };
            out.push(TermStatus {
                term: "heat",
                resource: Some(r.spec.name.clone()),
                in_force: format!("{}: {}", r.spec.name, limits.describe()),
                state,
                now: match r.heat.last {
                    Some((at, reading)) => format!(
                        "{} ({} ms ago)",
                        reading.describe(),
                        now.since(at).as_millis()
                    ),
                    None => "no reading yet".to_owned(),
                },
                refusing: refusal.is_some(),
                code: refusal.as_ref().map(|r| r.code),
                reason: refusal.map(|r| r.reason),
                next_change: None,
            });
        }
        out
    }

    /// Whether every term that applies to upstream `up` admits at `now`:
    /// what lets a reclaim stand down (RECL-04, as admission judges it).
    pub(crate) fn terms_clear(&self, up: usize, now: Moment) -> bool {
        self.terms_refusal(now).is_none()
            && self.upstreams[up]
                .deps
                .iter()
                .all(|d| self.heat_refusal(d.res, now).is_none())
    }

    /// The terms' reclaim edges at `now`, each as the upstreams it reaches
    /// and its trigger: the lending hours closed since the last step, the
    /// machine left mains power, a GPU not known cool for `hot_for`.
    pub(crate) fn term_edges(
        &mut self,
        now: Moment,
    ) -> Vec<(Vec<usize>, crate::engine::ReclaimTrigger)> {
        use crate::engine::ReclaimTrigger;
        let every: Vec<usize> = (0..self.upstreams.len()).collect();
        let mut edges = Vec::new();
        if let Some(h) = &self.terms.hours {
            let open = h.open_at(now);
            let last = self.terms.hours_stepped.replace((now, open));
            let closed = match last {
                Some((at, was_open)) => !open && (was_open || h.closed_between(at, now)),
                None => false, // startup is no edge
            };
            if closed {
                edges.push((
                    every.clone(),
                    ReclaimTrigger::LendingHours {
                        why: format!("the lending hours ({}) closed", h.schedule),
                    },
                ));
            }
        } else {
            self.terms.hours_stepped = None;
        }
        if std::mem::take(&mut self.terms.power_edge)
            && self
                .terms
                .power
                .as_ref()
                .is_some_and(|p| *p != PowerSource::Mains)
        {
            let why = match &self.terms.power {
                Some(PowerSource::Unknown(why)) => {
                    format!("the power supply cannot be read: {why}")
                }
                _ => "the machine left mains power for its battery".to_owned(),
            };
            edges.push((every, ReclaimTrigger::Battery { why }));
        }
        for res in 0..self.resources.len() {
            let Some(deadline) = self.heat_deadline(res, now) else {
                continue;
            };
            if now < deadline {
                continue;
            }
            let name = self.resources[res].spec.name.clone();
            let (code, why) = match self.heat_refusal(res, now) {
                Some(r) => (r.code, r.reason),
                // Not known cool, yet nothing refuses: cannot happen with a
                // deadline; reclaim as too hot rather than not at all.
                None => (RefusalCode::GpuTooHot, format!("{name} was not known cool")),
            };
            self.resources[res].heat.triggered = true;
            let reached: Vec<usize> = (0..self.upstreams.len())
                .filter(|&up| self.upstreams[up].deps.iter().any(|d| d.res == res))
                .collect();
            edges.push((
                reached,
                ReclaimTrigger::Heat {
                    resources: vec![name],
                    code,
                    why,
                },
            ));
        }
        edges
    }

    /// The earliest moment a term needs a reclaim step by time alone: the
    /// lending hours' next change, a GPU's `hot_for` running out.
    pub(crate) fn next_term_deadline(&self, now: Moment) -> Option<Moment> {
        let hours = self
            .terms
            .hours
            .as_ref()
            .and_then(|h| h.next_change(now))
            .map(|c| c.at);
        let heat = (0..self.resources.len())
            .filter_map(|res| self.heat_deadline(res, now))
            .min();
        match (hours, heat) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The engine's record of the host-wide terms.
#[derive(Debug, Default)]
pub(crate) struct Terms {
    pub hours: Option<LendingHours>,
    /// The moment of the last reclaim step and whether the hours were open then.
    pub hours_stepped: Option<(Moment, bool)>,
    pub power: Option<PowerSource>,
    /// The machine left mains power since the last reclaim step.
    pub power_edge: bool,
}

#[cfg(test)]
#[path = "terms_tests.rs"]
mod tests;
