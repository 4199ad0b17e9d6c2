//! The crash-loop breaker: throttles reloads of a slot that keeps failing to
//! load, per slot, on an injected clock.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::slots::error::SlotError;

/// First backoff step in seconds (BRK-02).
pub const BACKOFF_BASE_S: f64 = 5.0;
/// Cap on a backoff step in seconds (BRK-02).
pub const BACKOFF_CAP_S: f64 = 300.0;
/// Consecutive failures from which the breaker is parked (BRK-03).
pub const PARK_THRESHOLD: u32 = 5;
/// First parked cooldown in seconds (BRK-03).
pub const PARK_BASE_S: f64 = 300.0;
/// Cap on a parked cooldown in seconds (BRK-03).
pub const PARK_CAP_S: f64 = 3600.0;
/// The key a slot snapshot's `metadata` carries while the breaker is not
/// closed (BRK-11).
pub const METADATA_KEY: &str = "breaker";
/// How long a half-open trial may stay out unrecorded before it expires and
/// the next check may take it again: a load's lifecycle budget
/// ([`slot_lifecycle_budget`](crate::slots::slot_lifecycle_budget) of a load
/// with a 120 s health poll, a 150 s CPU-lane gate and 15 s unloads: 362.25 s).
/// A load still unrecorded by then has outlived any load that can succeed.
pub const DEFAULT_TRIAL_BUDGET_S: f64 = 362.25;

/// Where a slot's breaker stands.
///
/// # Behavior
///
/// Closed (no failures), backoff (1–4 failures, cooling down, BRK-02), parked
/// (5 or more, cooling down, BRK-03), half-open (the cooldown has elapsed; one
/// trial load may run, BRK-04). Wire names: `closed`, `backoff`, `parked`,
/// `half-open` (spelled as the seed spells the state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BreakerState {
    /// No consecutive failures.
    #[serde(rename = "closed")]
    Closed,
    /// 1–4 failures, cooling down.
    #[serde(rename = "backoff")]
    Backoff,
    /// 5 or more failures, cooling down.
    #[serde(rename = "parked")]
    Parked,
    /// The cooldown has elapsed; one trial load may run.
    #[serde(rename = "half-open")]
    HalfOpen,
}

impl BreakerState {
    /// The wire name.
    ///
    /// `closed`, `backoff`, `parked` or `half-open` (BRK-11).
    pub const fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Backoff => "backoff",
            BreakerState::Parked => "parked",
            BreakerState::HalfOpen => "half-open",
        }
    }
}

impl fmt::Display for BreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The live view of a non-closed breaker, stamped on slot snapshots as
/// `metadata.breaker`.
///
/// # Behavior
///
/// `{state, failures, retry_after_s, trial_in_flight}` (BRK-11);
/// `retry_after_s` is whole seconds rounded up (BRK-08): the cooldown left,
/// 0 while half-open with the trial free, and the trial's budget left while
/// a half-open trial is out (`trial_in_flight`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BreakerSnapshot {
    /// Backoff, parked or half-open; never closed.
    pub state: BreakerState,
    /// Consecutive load failures.
    pub failures: u32,
    /// Whole seconds until a retry may run.
    pub retry_after_s: u64,
    /// Whether a half-open trial was taken by a check and not yet recorded,
    /// given back or expired.
    #[serde(default)]
    pub trial_in_flight: bool,
}

/// The cooldown after `failures` consecutive failures, in seconds.
///
/// 0 for no failures; min(5·2^(n−1), 300) for 1–4 (5, 10, 20, 40 s, BRK-02);
/// min(300·2^(n−5), 3600) from 5 (300, 600, 1200, 2400, then 3600 s, BRK-03).
pub fn cooldown_s(failures: u32) -> f64 {
    // Exponents beyond 12 are far past either cap; clamping keeps powi exact.
    let exp = |n: u32| i32::try_from(n.min(12)).unwrap_or(12);
    match failures {
        0 => 0.0,
        n if n < PARK_THRESHOLD => (BACKOFF_BASE_S * 2f64.powi(exp(n - 1))).min(BACKOFF_CAP_S),
        n => (PARK_BASE_S * 2f64.powi(exp(n - PARK_THRESHOLD))).min(PARK_CAP_S),
    }
}

/// Whole seconds, rounded up, never negative (BRK-08 Ambiguity reading).
fn ceil_secs(s: f64) -> u64 {
    if s.is_nan() || s <= 0.0 {
        0
    } else {
        // `as` saturates for values beyond u64.
        s.ceil() as u64
    }
}

/// Carried-over breaker state for one slot, for callers migrating state.
///
/// `failures` consecutive failures, the last at `last_failure_s` on the
/// breaker's clock. Seeding 0 failures closes the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BreakerSeed {
    /// Consecutive load failures.
    pub failures: u32,
    /// When the last one happened, in seconds on the breaker's clock.
    pub last_failure_s: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    failures: u32,
    last_failure_s: f64,
    /// When the half-open trial was taken by a check, while it is out.
    trial_taken_s: Option<f64>,
}

impl Entry {
    /// Seconds left of the cooldown at `now_s`; a clock that went backwards
    /// counts as no time elapsed.
    fn remaining_s(&self, now_s: f64) -> f64 {
        let elapsed = (now_s - self.last_failure_s).max(0.0);
        cooldown_s(self.failures) - elapsed
    }

    fn state(&self, now_s: f64) -> BreakerState {
        if self.remaining_s(now_s) > 0.0 {
            if self.failures >= PARK_THRESHOLD {
                BreakerState::Parked
            } else {
                BreakerState::Backoff
            }
        } else {
            BreakerState::HalfOpen
        }
    }

    /// Seconds left of the trial's budget at `now_s`, while a trial is out
    /// and unexpired; a clock that went backwards counts as no time elapsed.
    fn trial_left_s(&self, now_s: f64, budget_s: f64) -> Option<f64> {
        let taken = self.trial_taken_s?;
        let left = budget_s - (now_s - taken).max(0.0);
        (left > 0.0).then_some(left)
    }

    fn snapshot(&self, now_s: f64, budget_s: f64) -> BreakerSnapshot {
        let state = self.state(now_s);
        let trial = match state {
            BreakerState::HalfOpen => self.trial_left_s(now_s, budget_s),
            _ => None,
        };
        BreakerSnapshot {
            state,
            failures: self.failures,
            retry_after_s: ceil_secs(trial.unwrap_or_else(|| self.remaining_s(now_s))),
            trial_in_flight: trial.is_some(),
        }
    }
}

/// A clock returning seconds on a monotonic timeline.
pub type Clock = Arc<dyn Fn() -> f64 + Send + Sync>;

/// Per-slot crash-loop breakers on one injected clock.
///
/// # Behavior
///
/// Tracks consecutive load failures per slot key (BRK-01). [`check`] refuses a
/// load with [`SlotError::CrashLooping`] (503, `retry_after_s`) while the
/// cooldown runs — backoff for 1–4 failures (BRK-02), parked from 5 (BRK-03) —
/// and the caller then makes no state transition (BRK-07). Once the cooldown
/// elapses the breaker is half-open: the first `check` passes as the one trial
/// load, and later checks are refused until the trial is recorded (BRK-04
/// Ambiguity reading), given back ([`give_back_trial`]: the checked load did
/// not run) or its budget runs out (the load's lifecycle budget,
/// [`DEFAULT_TRIAL_BUDGET_S`] unless [`with_trial_budget`] says otherwise):
/// a trial no caller records cannot lock the slot for good. A recorded failure increments the count and starts the
/// cooldown for the new count (BRK-06 and its Ambiguity reading); a recorded
/// success or a reset closes it (BRK-05, BRK-09, BRK-10). The breaker never
/// reads a clock inside its logic: every `*_at` method takes the time, and the
/// plain methods ask the injected clock once and call them.
///
/// Operator actions (a manual load, a restart, a config edit) call [`reset`]
/// and bypass [`check`]; the breaker throttles automatic, request-driven loads
/// (BRK-09 Ambiguity reading).
///
/// [`check`]: CrashLoopBreaker::check
/// [`reset`]: CrashLoopBreaker::reset
/// [`give_back_trial`]: CrashLoopBreaker::give_back_trial
/// [`with_trial_budget`]: CrashLoopBreaker::with_trial_budget
#[derive(Clone)]
pub struct CrashLoopBreaker {
    clock: Clock,
    entries: HashMap<String, Entry>,
    /// How long a half-open trial may stay out unrecorded.
    trial_budget_s: f64,
}

impl fmt::Debug for CrashLoopBreaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrashLoopBreaker")
            .field("entries", &self.entries)
            .finish_non_exhaustive()
    }
}

impl CrashLoopBreaker {
    /// A breaker with every slot closed, reading time from `clock` (seconds).
    ///
    /// The clock is only read by the methods without an `_at` suffix, once per
    /// call (BRK-01).
    pub fn new(clock: impl Fn() -> f64 + Send + Sync + 'static) -> Self {
        CrashLoopBreaker {
            clock: Arc::new(clock),
            entries: HashMap::new(),
            trial_budget_s: DEFAULT_TRIAL_BUDGET_S,
        }
    }

    /// The same breaker with half-open trials expiring after `budget_s`
    /// seconds unrecorded (the slot's load budget,
    /// [`slot_lifecycle_budget`](crate::slots::slot_lifecycle_budget)).
    ///
    /// A negative or NaN budget counts as 0: a trial expires at once, so
    /// every check in half-open passes.
    #[must_use]
    pub fn with_trial_budget(mut self, budget_s: f64) -> Self {
        self.trial_budget_s = if budget_s.is_nan() {
            0.0
        } else {
            budget_s.max(0.0)
        };
        self
    }

    /// How long a half-open trial may stay out unrecorded, in seconds.
    pub fn trial_budget_s(&self) -> f64 {
        self.trial_budget_s
    }

    fn now(&self) -> f64 {
        (self.clock)()
    }

    /// May an automatic load of `key` run now? See [`Self::check_at`].
    ///
    /// BRK-02 to BRK-04, BRK-07, BRK-08 at the clock's time.
    pub fn check(&mut self, key: &str) -> Result<(), SlotError> {
        let now = self.now();
        self.check_at(key, now)
    }

    /// May an automatic load of `key` run at `now_s`?
    ///
    /// # Behavior
    ///
    /// `Ok` when closed. While the cooldown runs: [`SlotError::CrashLooping`]
    /// with state `backoff` (BRK-02) or `parked` (BRK-03) and `retry_after_s`
    /// the remaining cooldown rounded up (BRK-08). Half-open: `Ok` for the
    /// first check, which claims the trial (BRK-04); later checks are refused
    /// with state `half-open` and `retry_after_s` the trial's budget left
    /// until the trial is recorded, given back or expired (BRK-04 Ambiguity
    /// reading); an expired trial is claimed again by the next check. A
    /// refusal changes nothing, so the caller makes no transition (BRK-07).
    pub fn check_at(&mut self, key: &str, now_s: f64) -> Result<(), SlotError> {
        let budget = self.trial_budget_s;
        let Some(entry) = self.entries.get_mut(key) else {
            return Ok(());
        };
        let refuse = |state: BreakerState, retry: u64, failures: u32| SlotError::CrashLooping {
            slot: key.to_owned(),
            state: state.as_str().to_owned(),
            failures,
            retry_after_s: retry,
        };
        match entry.state(now_s) {
            BreakerState::Closed => Ok(()),
            state @ (BreakerState::Backoff | BreakerState::Parked) => Err(refuse(
                state,
                ceil_secs(entry.remaining_s(now_s)).max(1),
                entry.failures,
            )),
            BreakerState::HalfOpen => match entry.trial_left_s(now_s, budget) {
                Some(left) => Err(refuse(
                    BreakerState::HalfOpen,
                    ceil_secs(left).max(1),
                    entry.failures,
                )),
                None => {
                    entry.trial_taken_s = Some(now_s);
                    Ok(())
                }
            },
        }
    }

    /// The half-open trial of `key` that a passing [`check`](Self::check)
    /// took is given back unused: the load it allowed did not run (its
    /// admission was refused, the caller changed its mind). The next check
    /// may take it at once.
    ///
    /// Changes nothing when no trial is out; never counts as a failure or a
    /// success (BRK-04 Ambiguity reading).
    pub fn give_back_trial(&mut self, key: &str) {
        if let Some(entry) = self.entries.get_mut(key) {
            entry.trial_taken_s = None;
        }
    }

    /// Records a failed load of `key` at the clock's time.
    ///
    /// As [`Self::record_failure_at`].
    pub fn record_failure(&mut self, key: &str) -> BreakerSnapshot {
        let now = self.now();
        self.record_failure_at(key, now)
    }

    /// Records a failed load of `key` at `now_s` and returns the new view.
    ///
    /// # Behavior
    ///
    /// Increments the consecutive-failure count, restarts the cooldown for
    /// the new count (BRK-02, BRK-03) and ends any half-open trial: a failed
    /// trial re-parks at the next step (BRK-06).
    pub fn record_failure_at(&mut self, key: &str, now_s: f64) -> BreakerSnapshot {
        let entry = self.entries.entry(key.to_owned()).or_insert(Entry {
            failures: 0,
            last_failure_s: now_s,
            trial_taken_s: None,
        });
        entry.failures = entry.failures.saturating_add(1);
        entry.last_failure_s = now_s;
        entry.trial_taken_s = None;
        entry.snapshot(now_s, self.trial_budget_s)
    }

    /// Records a load of `key` that converged healthy: closes the breaker.
    ///
    /// A successful trial closes the breaker (BRK-05), as does any healthy
    /// load (BRK-10).
    pub fn record_success(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// An operator action on `key` (manual load, restart, config edit): closes
    /// the breaker at once.
    ///
    /// Independent of the cooldown clock (BRK-09).
    pub fn reset(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// Seeds the breaker of `key` with carried-over state.
    ///
    /// Replaces whatever was there; 0 failures closes it. No trial is in
    /// flight after seeding.
    pub fn seed(&mut self, key: &str, seed: BreakerSeed) {
        if seed.failures == 0 {
            self.entries.remove(key);
        } else {
            self.entries.insert(
                key.to_owned(),
                Entry {
                    failures: seed.failures,
                    last_failure_s: seed.last_failure_s,
                    trial_taken_s: None,
                },
            );
        }
    }

    /// The carried-over form of `key`'s breaker, `None` when closed.
    ///
    /// Round-trips through [`Self::seed`].
    pub fn seed_of(&self, key: &str) -> Option<BreakerSeed> {
        self.entries.get(key).map(|e| BreakerSeed {
            failures: e.failures,
            last_failure_s: e.last_failure_s,
        })
    }

    /// Consecutive failures recorded for `key`.
    ///
    /// 0 when closed (BRK-01).
    pub fn failures(&self, key: &str) -> u32 {
        self.entries.get(key).map_or(0, |e| e.failures)
    }

    /// The state of `key`'s breaker at the clock's time.
    ///
    /// As [`Self::state_at`].
    pub fn state(&self, key: &str) -> BreakerState {
        self.state_at(key, self.now())
    }

    /// The state of `key`'s breaker at `now_s`.
    ///
    /// Closed without failures; backoff or parked while cooling down
    /// (BRK-02, BRK-03); half-open after (BRK-04).
    pub fn state_at(&self, key: &str, now_s: f64) -> BreakerState {
        self.entries
            .get(key)
            .map_or(BreakerState::Closed, |e| e.state(now_s))
    }

    /// The live view of `key`'s breaker at the clock's time.
    ///
    /// As [`Self::snapshot_at`].
    pub fn snapshot(&self, key: &str) -> Option<BreakerSnapshot> {
        self.snapshot_at(key, self.now())
    }

    /// The live view of `key`'s breaker at `now_s`, `None` when closed.
    ///
    /// `Some({state, failures, retry_after_s, trial_in_flight})` while not
    /// closed (BRK-11); `None` once closed, so the key is omitted (BRK-12).
    pub fn snapshot_at(&self, key: &str, now_s: f64) -> Option<BreakerSnapshot> {
        self.entries
            .get(key)
            .map(|e| e.snapshot(now_s, self.trial_budget_s))
    }

    /// Stamps `key`'s breaker onto a slot snapshot's `metadata` object.
    ///
    /// Sets `metadata.breaker` to the snapshot while not closed (BRK-11) and
    /// removes the key once closed (BRK-12).
    pub fn stamp_metadata_at(&self, key: &str, now_s: f64, metadata: &mut Map<String, Value>) {
        match self.snapshot_at(key, now_s) {
            Some(snap) => {
                metadata.insert(
                    METADATA_KEY.to_owned(),
                    serde_json::json!({
                        "state": snap.state.as_str(),
                        "failures": snap.failures,
                        "retry_after_s": snap.retry_after_s,
                        "trial_in_flight": snap.trial_in_flight,
                    }),
                );
            }
            None => {
                metadata.remove(METADATA_KEY);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Mutex;

    use proptest::prelude::*;

    use super::*;

    /// A breaker on a simulated clock the test moves.
    fn sim() -> (CrashLoopBreaker, Arc<Mutex<f64>>) {
        let t = Arc::new(Mutex::new(0.0_f64));
        let c = Arc::clone(&t);
        (CrashLoopBreaker::new(move || *c.lock().unwrap()), t)
    }

    fn set(t: &Arc<Mutex<f64>>, v: f64) {
        *t.lock().unwrap() = v;
    }

    fn refusal(r: Result<(), SlotError>) -> (String, u32, u64) {
        match r {
            Err(SlotError::CrashLooping {
                state,
                failures,
                retry_after_s,
                ..
            }) => (state, failures, retry_after_s),
            other => panic!("expected a crash-loop refusal, got {other:?}"),
        }
    }

    // BRK-02, BRK-03
    #[test]
    fn brk_02_03_cooldown_steps() {
        let expected = [
            0.0, 5.0, 10.0, 20.0, 40.0, 300.0, 600.0, 1200.0, 2400.0, 3600.0, 3600.0,
        ];
        for (n, want) in expected.iter().enumerate() {
            assert_eq!(cooldown_s(u32::try_from(n).unwrap()), *want, "n={n}");
        }
        assert_eq!(cooldown_s(u32::MAX), 3600.0);
    }

    // BRK-01..BRK-08: n = 1..8 consecutive failures under simulated time.
    #[test]
    fn brk_timings_for_one_to_eight_failures_with_half_open_trials() {
        let (mut b, t) = sim();
        let mut now = 1000.0;
        set(&t, now);
        assert!(b.check("s").is_ok(), "closed");
        assert!(b.snapshot("s").is_none());
        for n in 1..=8u32 {
            let snap = b.record_failure("s");
            let cd = cooldown_s(n);
            let state = if n >= 5 { "parked" } else { "backoff" };
            assert_eq!(snap.failures, n);
            assert_eq!(snap.state.as_str(), state);
            assert_eq!(snap.retry_after_s, cd as u64);
            // BRK-07/08: refused during the cooldown with retry_after_s.
            assert_eq!(refusal(b.check("s")), (state.to_owned(), n, cd as u64));
            set(&t, now + cd - 0.5);
            // BRK-08: 0.5 s left rounds up to 1.
            assert_eq!(refusal(b.check("s")), (state.to_owned(), n, 1));
            assert_eq!(b.snapshot("s").unwrap().retry_after_s, 1);
            // BRK-04: elapsed → half-open, one trial passes, the next is refused.
            now += cd;
            set(&t, now);
            assert_eq!(b.state("s"), BreakerState::HalfOpen);
            assert_eq!(
                b.snapshot("s").unwrap(),
                BreakerSnapshot {
                    state: BreakerState::HalfOpen,
                    failures: n,
                    retry_after_s: 0,
                    trial_in_flight: false,
                }
            );
            assert!(b.check("s").is_ok(), "trial n={n}");
            let budget = DEFAULT_TRIAL_BUDGET_S.ceil() as u64;
            assert_eq!(refusal(b.check("s")), ("half-open".to_owned(), n, budget));
            // BRK-06: the trial fails → next step (loop continues).
        }
        assert_eq!(b.failures("s"), 8);
    }

    // BRK-05
    #[test]
    fn brk_05_successful_trial_closes() {
        let (mut b, t) = sim();
        for _ in 0..5 {
            b.record_failure("s");
        }
        set(&t, 300.0);
        assert!(b.check("s").is_ok());
        b.record_success("s");
        assert_eq!(b.state("s"), BreakerState::Closed);
        assert!(b.check("s").is_ok());
        assert!(b.check("s").is_ok(), "no trial limit once closed");
        // Next failure starts again at the first backoff step.
        assert_eq!(b.record_failure("s").retry_after_s, 5);
    }

    // BRK-06 Ambiguity: a failed trial below 5 failures follows BRK-02.
    #[test]
    fn brk_06_failed_trial_moves_to_the_next_step() {
        let (mut b, _t) = sim();
        b.record_failure_at("s", 0.0);
        assert!(b.check_at("s", 5.0).is_ok());
        let snap = b.record_failure_at("s", 7.0);
        assert_eq!(snap.state, BreakerState::Backoff);
        assert_eq!(snap.retry_after_s, 10);
        assert!(b.check_at("s", 16.9).is_err());
        assert!(b.check_at("s", 17.0).is_ok());
    }

    // BRK-09
    #[test]
    fn brk_09_operator_reset_ignores_the_cooldown() {
        let (mut b, _t) = sim();
        for _ in 0..7 {
            b.record_failure_at("s", 0.0);
        }
        assert!(b.check_at("s", 1.0).is_err());
        b.reset("s");
        assert!(b.check_at("s", 1.0).is_ok());
        assert!(b.snapshot_at("s", 1.0).is_none());
    }

    // BRK-10
    #[test]
    fn brk_10_healthy_load_clears() {
        let (mut b, _t) = sim();
        b.record_failure_at("s", 0.0);
        b.record_success("s");
        assert_eq!(b.failures("s"), 0);
        assert!(b.check_at("s", 0.0).is_ok());
    }

    // BRK-01: keyed per slot.
    #[test]
    fn brk_01_breakers_are_per_slot() {
        let (mut b, _t) = sim();
        b.record_failure_at("a", 0.0);
        assert!(b.check_at("a", 1.0).is_err());
        assert!(b.check_at("b", 1.0).is_ok());
        b.reset("b");
        assert!(b.check_at("a", 1.0).is_err());
    }

    // Seeding carried-over state.
    #[test]
    fn brk_seed_keeps_migrated_state() {
        let (mut b, _t) = sim();
        let seed = BreakerSeed {
            failures: 6,
            last_failure_s: 100.0,
        };
        b.seed("s", seed);
        assert_eq!(b.seed_of("s"), Some(seed));
        assert_eq!(refusal(b.check_at("s", 200.0)), ("parked".into(), 6, 500));
        assert!(b.check_at("s", 700.0).is_ok());
        b.seed(
            "s",
            BreakerSeed {
                failures: 0,
                last_failure_s: 0.0,
            },
        );
        assert_eq!(b.state_at("s", 0.0), BreakerState::Closed);
        assert_eq!(b.seed_of("s"), None);
    }

    // BRK-11, BRK-12: metadata.breaker present only while not closed.
    #[test]
    fn brk_11_12_metadata_presence_is_the_render_signal() {
        let (mut b, _t) = sim();
        let mut meta = Map::new();
        meta.insert("other".into(), Value::from(1));
        b.stamp_metadata_at("s", 0.0, &mut meta);
        assert!(!meta.contains_key("breaker"));
        b.record_failure_at("s", 0.0);
        b.stamp_metadata_at("s", 2.0, &mut meta);
        assert_eq!(
            meta["breaker"],
            serde_json::json!({"state": "backoff", "failures": 1, "retry_after_s": 3, "trial_in_flight": false})
        );
        b.stamp_metadata_at("s", 5.0, &mut meta);
        assert_eq!(meta["breaker"]["state"], "half-open");
        b.record_success("s");
        b.stamp_metadata_at("s", 5.0, &mut meta);
        assert!(!meta.contains_key("breaker"));
        assert_eq!(meta["other"], 1);
        let snap = BreakerSnapshot {
            state: BreakerState::Parked,
            failures: 5,
            retry_after_s: 300,
            trial_in_flight: false,
        };
        assert_eq!(
            serde_json::to_value(snap).unwrap(),
            serde_json::json!({"state": "parked", "failures": 5, "retry_after_s": 300, "trial_in_flight": false})
        );
    }

    // BRK-04 Ambiguity reading: a trial a check took and nobody recorded (the
    // scheduler checked, then its admission was refused and it never loaded)
    // expires after the trial budget instead of locking the slot for good,
    // and the snapshot says it is out and for how long.
    #[test]
    fn brk_04_unrecorded_trial_expires_after_the_lifecycle_budget() {
        let (mut b, _t) = sim();
        b.record_failure_at("s", 0.0);
        assert!(b.check_at("s", 5.0).is_ok(), "the trial");
        let snap = b.snapshot_at("s", 6.0).unwrap();
        assert_eq!(snap.state, BreakerState::HalfOpen);
        assert!(snap.trial_in_flight);
        let left = (DEFAULT_TRIAL_BUDGET_S - 1.0).ceil() as u64;
        assert_eq!(snap.retry_after_s, left);
        assert_eq!(refusal(b.check_at("s", 6.0)), ("half-open".into(), 1, left));
        // Still out just before the budget ends...
        let end = 5.0 + DEFAULT_TRIAL_BUDGET_S;
        assert_eq!(refusal(b.check_at("s", end - 0.5)).2, 1);
        // ...and free again once it has: 10 000 s later the slot is not locked.
        let late = 10_000.0;
        let snap = b.snapshot_at("s", late).unwrap();
        assert!(!snap.trial_in_flight);
        assert_eq!(snap.retry_after_s, 0);
        assert!(
            b.check_at("s", late).is_ok(),
            "the expired trial is taken again"
        );
        assert!(b.snapshot_at("s", late).unwrap().trial_in_flight);
    }

    // BRK-04 Ambiguity reading: a trial given back (the load did not run) is
    // free at once and counts as neither failure nor success.
    #[test]
    fn brk_04_a_trial_given_back_is_free_at_once() {
        let (mut b, _t) = sim();
        b.record_failure_at("s", 0.0);
        assert!(b.check_at("s", 5.0).is_ok());
        assert!(b.check_at("s", 5.1).is_err());
        b.give_back_trial("s");
        assert!(!b.snapshot_at("s", 5.2).unwrap().trial_in_flight);
        assert_eq!(b.failures("s"), 1);
        assert!(b.check_at("s", 5.2).is_ok());
        b.give_back_trial("closed-slot"); // nothing to give back: no effect
        assert_eq!(b.state_at("closed-slot", 5.2), BreakerState::Closed);
    }

    // The trial budget is the load's lifecycle budget; a custom one applies.
    #[test]
    fn brk_04_trial_budget_default_is_a_load_budget_and_can_be_set() {
        use crate::slots::budget::{LifecycleBudgetInputs, LifecycleOp, slot_lifecycle_budget};
        let load = slot_lifecycle_budget(
            LifecycleOp::Load,
            &LifecycleBudgetInputs {
                health_poll_s: 120.0,
                output_sanity_cpu_s: 150.0,
                unload_s: 15.0,
            },
        );
        assert!((load - DEFAULT_TRIAL_BUDGET_S).abs() < 1e-9);
        let mut b = CrashLoopBreaker::new(|| 0.0).with_trial_budget(30.0);
        assert_eq!(b.trial_budget_s(), 30.0);
        b.record_failure_at("s", 0.0);
        assert!(b.check_at("s", 5.0).is_ok());
        assert_eq!(refusal(b.check_at("s", 20.0)).2, 15);
        assert!(b.check_at("s", 35.0).is_ok());
        assert_eq!(
            CrashLoopBreaker::new(|| 0.0)
                .with_trial_budget(f64::NAN)
                .trial_budget_s(),
            0.0
        );
    }

    // A clock that goes backwards counts as no time elapsed.
    #[test]
    fn brk_clock_going_backwards_does_not_shorten_the_cooldown() {
        let (mut b, _t) = sim();
        b.record_failure_at("s", 100.0);
        assert_eq!(refusal(b.check_at("s", 50.0)).2, 5);
    }

    proptest! {
        // BRK-02..BRK-04: a check is refused exactly while the cooldown runs,
        // and retry_after_s never undershoots it.
        #[test]
        fn brk_prop_refused_exactly_during_cooldown(n in 1u32..20, dt in 0.0f64..5000.0) {
            let (mut b, _t) = sim();
            b.seed("s", BreakerSeed { failures: n, last_failure_s: 0.0 });
            let cd = cooldown_s(n);
            match b.check_at("s", dt) {
                Ok(()) => prop_assert!(dt >= cd),
                Err(e) => {
                    prop_assert!(dt < cd);
                    let retry = e.retry_after_s().unwrap();
                    prop_assert!(retry as f64 >= cd - dt);
                    prop_assert!((retry as f64) < cd - dt + 1.0);
                    prop_assert_eq!(e.http_status(), 503);
                }
            }
        }
    }
}
