//! One slot driven through its lifecycle: the order in which a load, the
//! output-sanity gate, requests and stops move it, each move checked against
//! [`LEGAL_TRANSITIONS`](crate::slots::LEGAL_TRANSITIONS) and kept in a
//! journal (what a caller writes to its journal and `state.json`).
//!
//! Pure, like the rest of [`slots`](crate::slots): time is an argument, and
//! the caller owns the unit, the journal and the files. It ties together the
//! rules that are about *when* something happens in a load rather than what
//! one step computes: the crash-loop breaker is asked before anything moves
//! (BRK-07), the gate runs once per load while the slot is WARMING and not
//! dispatchable (GATE-03), and a wrong answer's verdict stays until a later
//! load passes the gate (GATE-07, GATE-08).

use crate::gate::{GateNextState, GateOutcome};
use crate::slots::breaker::CrashLoopBreaker;
use crate::slots::error::SlotError;
use crate::slots::record::SlotStateRecord;
use crate::slots::state::{SlotState, check_transition};

/// Why a lifecycle step was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LifecycleError {
    /// A slot error: the breaker's `SlotCrashLooping`, or an
    /// `IllegalSlotTransition` the table refuses.
    #[error(transparent)]
    Slot(#[from] SlotError),
    /// The gate already ran in this load (GATE-03: once per load; an
    /// unanswered probe is re-run by the next load, GATE-09).
    #[error("the output-sanity gate already ran in this load of slot {slot:?}")]
    GateAlreadyRan {
        /// The slot.
        slot: String,
    },
    /// The gate runs only while the slot is WARMING: up, not yet dispatchable
    /// (GATE-03).
    #[error("the output-sanity gate runs while slot {slot:?} is warming, not {state}")]
    GateOutsideWarming {
        /// The slot.
        slot: String,
        /// Its state.
        state: SlotState,
    },
}

/// One slot's lifecycle: its state, the gate's verdict, and every transition
/// it made, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotLifecycle {
    name: String,
    state: SlotState,
    /// The cause of the last ERROR (SLOT-10), cleared by the next load.
    message: Option<String>,
    /// A wrong answer's verdict (GATE-07), cleared only by a passing gate
    /// on a later load (GATE-08).
    verdict: Option<String>,
    gated_this_load: bool,
    /// When the last request ended, for the idle timeout (SLOT-08).
    last_request_s: f64,
    journal: Vec<(SlotState, SlotState)>,
}

impl SlotLifecycle {
    /// A slot named `name`, OFFLINE, with an empty journal.
    pub fn new(name: impl Into<String>) -> Self {
        SlotLifecycle {
            name: name.into(),
            state: SlotState::Offline,
            message: None,
            verdict: None,
            gated_this_load: false,
            last_request_s: 0.0,
            journal: Vec::new(),
        }
    }

    /// The slot's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its state now.
    pub fn state(&self) -> SlotState {
        self.state
    }

    /// The gate's standing verdict, if a wrong answer left one.
    pub fn verdict(&self) -> Option<&str> {
        self.verdict.as_deref()
    }

    /// Every transition made, oldest first.
    pub fn journal(&self) -> &[(SlotState, SlotState)] {
        &self.journal
    }

    fn go(&mut self, to: SlotState) -> Result<(), SlotError> {
        check_transition(self.state, to)?;
        self.journal.push((self.state, to));
        self.state = to;
        Ok(())
    }

    /// Starts a load: OFFLINE or ERROR → STARTING.
    ///
    /// # Behavior
    ///
    /// - BRK-07: the breaker is asked first; a refusal is its
    ///   `SlotCrashLooping` (503) and nothing moves: no transition, no
    ///   journal row.
    /// - A load that cannot start from the current state gives a half-open
    ///   trial its check took back to the breaker (BRK-04): it did not run.
    /// - A new load may run the gate again, and clears the last ERROR's
    ///   message; a standing verdict stays (GATE-08).
    pub fn begin_load(
        &mut self,
        breaker: &mut CrashLoopBreaker,
        now_s: f64,
    ) -> Result<(), LifecycleError> {
        breaker.check_at(&self.name, now_s)?;
        if let Err(e) = self.go(SlotState::Starting) {
            breaker.give_back_trial(&self.name);
            return Err(e.into());
        }
        self.gated_this_load = false;
        self.message = None;
        Ok(())
    }

    /// The container is up and its health probe not yet ready: STARTING →
    /// WARMING, not dispatchable (SLOT-04).
    pub fn container_up(&mut self) -> Result<(), LifecycleError> {
        Ok(self.go(SlotState::Warming)?)
    }

    /// The server is up with an empty model list: WARMING → IDLE (SLOT-07).
    pub fn empty_models(&mut self) -> Result<(), LifecycleError> {
        Ok(self.go(SlotState::Idle)?)
    }

    /// Applies the gate's outcome and returns the state it leads to.
    ///
    /// # Behavior
    ///
    /// - GATE-03: only while WARMING (up, not dispatchable), once per load.
    /// - Passed: READY, and any verdict is cleared (GATE-08).
    /// - Wrong: ERROR with the outcome's message, and the verdict recorded
    ///   (GATE-05, GATE-07).
    /// - Unanswered: stays WARMING; nothing is recorded (GATE-09).
    pub fn gate(&mut self, outcome: &GateOutcome, now_s: f64) -> Result<SlotState, LifecycleError> {
        if self.state != SlotState::Warming {
            return Err(LifecycleError::GateOutsideWarming {
                slot: self.name.clone(),
                state: self.state,
            });
        }
        if self.gated_this_load {
            return Err(LifecycleError::GateAlreadyRan {
                slot: self.name.clone(),
            });
        }
        self.gated_this_load = true;
        match outcome.next_state() {
            GateNextState::Ready => {
                self.go(SlotState::Ready)?;
                if outcome.clears_verdict() {
                    self.verdict = None;
                }
                self.last_request_s = now_s;
            }
            GateNextState::Error => {
                self.go(SlotState::Error)?;
                self.message = Some(outcome.to_string());
                if outcome.records_verdict() {
                    self.verdict = Some(outcome.to_string());
                }
            }
            GateNextState::Warming => {}
        }
        Ok(self.state)
    }

    /// A later poll (or the boot-time reconcile) finds the slot's server
    /// healthy and would publish it READY. Returns whether it did.
    ///
    /// # Behavior
    ///
    /// GATE-07: never while a gate verdict stands. Otherwise only a WARMING
    /// slot whose load the gate has not judged is adopted: a slot the gate
    /// left WARMING (unanswered, GATE-09) waits for the next load's gate.
    pub fn adopt_ready(&mut self, now_s: f64) -> bool {
        if self.verdict.is_some() || self.state != SlotState::Warming || self.gated_this_load {
            return false;
        }
        if self.go(SlotState::Ready).is_err() {
            return false;
        }
        self.last_request_s = now_s;
        true
    }

    /// A request starts on the slot: READY or IDLE → SERVING (SLOT-06).
    pub fn request_started(&mut self) -> Result<(), LifecycleError> {
        Ok(self.go(SlotState::Serving)?)
    }

    /// The request in flight ended at `now_s`: SERVING → READY.
    pub fn request_finished(&mut self, now_s: f64) -> Result<(), LifecycleError> {
        self.go(SlotState::Ready)?;
        self.last_request_s = now_s;
        Ok(())
    }

    /// Checks the idle timeout at `now_s`: a READY slot with no request for
    /// longer than `idle_timeout_s` goes IDLE, an eviction candidate
    /// (SLOT-08). Returns whether it moved.
    pub fn idle_check(&mut self, now_s: f64, idle_timeout_s: f64) -> bool {
        self.state == SlotState::Ready
            && now_s - self.last_request_s > idle_timeout_s
            && self.go(SlotState::Idle).is_ok()
    }

    /// The load or the server failed: → ERROR with `message` (SLOT-10).
    pub fn fail(&mut self, message: impl Into<String>) -> Result<(), LifecycleError> {
        self.go(SlotState::Error)?;
        self.message = Some(message.into());
        Ok(())
    }

    /// Stops the slot: through UNLOADING when it is up and dispatchable,
    /// straight to OFFLINE from STARTING, WARMING or ERROR.
    pub fn stop(&mut self) -> Result<(), LifecycleError> {
        if matches!(self.state, SlotState::Ready | SlotState::Idle) {
            self.go(SlotState::Unloading)?;
        }
        Ok(self.go(SlotState::Offline)?)
    }

    /// What the slot's `state.json` holds now, written at `now_s`: its state,
    /// and for ERROR the cause (SLOT-10).
    pub fn record(&self, now_s: f64) -> SlotStateRecord {
        SlotStateRecord {
            name: self.name.clone(),
            state: self.state,
            model_id: None,
            port: None,
            updated_at: now_s,
            message: self.message.clone(),
            extra: serde_json::Map::new(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::gate::{Heard, Probe};
    use crate::slots::{DISPATCHABLE_STATES, EvictionCandidate, is_eviction_candidate};
    use SlotState::*;

    fn passed() -> GateOutcome {
        GateOutcome::Passed {
            probe: Probe::Completion,
            answer: " Paris.".into(),
        }
    }

    fn wrong() -> GateOutcome {
        GateOutcome::Wrong {
            expected: "Paris".into(),
            actual: "the capital of the country of France".into(),
            probe: Probe::ChatCompletions,
            heard: vec![Heard {
                probe: Probe::Completion,
                said: " the capital of the country of France".into(),
            }],
        }
    }

    fn unanswered() -> GateOutcome {
        GateOutcome::Unanswered {
            probe: Probe::Completion,
            reason: "no reply within 30.0 s".into(),
            heard: Vec::new(),
        }
    }

    fn breaker() -> CrashLoopBreaker {
        CrashLoopBreaker::new(|| 0.0)
    }

    /// OFFLINE → STARTING → WARMING, ready for the gate.
    fn warming(slot: &mut SlotLifecycle, b: &mut CrashLoopBreaker, now: f64) {
        slot.begin_load(b, now).unwrap();
        slot.container_up().unwrap();
    }

    #[test]
    fn brk_07_a_refused_load_makes_no_transition() {
        let mut b = breaker();
        let mut slot = SlotLifecycle::new("agent");
        b.record_failure_at("agent", 100.0);
        let journal = slot.journal().to_vec();
        let refused = slot.begin_load(&mut b, 101.0).unwrap_err();
        match &refused {
            LifecycleError::Slot(e) => {
                assert_eq!(e.name(), "SlotCrashLooping", "{e}");
                assert_eq!(e.http_status(), 503);
            }
            other => panic!("{other:?}"),
        }
        // No STARTING, no journal row: the slot stays where it was.
        assert_eq!(slot.state(), Offline);
        assert_eq!(slot.journal(), journal.as_slice());
        // After the cooldown the half-open trial goes ahead and transitions.
        slot.begin_load(&mut b, 105.0).unwrap();
        assert_eq!(slot.journal(), &[(Offline, Starting)]);
    }

    // BRK-04: a load that cannot start (the slot is already loading) does
    // not keep the half-open trial its check took: the real load can have it.
    #[test]
    fn brk_04_a_load_that_cannot_start_gives_the_trial_back() {
        let mut b = breaker();
        let mut slot = SlotLifecycle::new("agent");
        warming(&mut slot, &mut b, 0.0);
        b.record_failure_at("agent", 100.0);
        assert!(
            slot.begin_load(&mut b, 105.0).is_err(),
            "WARMING → STARTING is illegal"
        );
        assert!(!b.snapshot_at("agent", 105.0).unwrap().trial_in_flight);
        assert!(b.check_at("agent", 105.0).is_ok(), "the trial is free");
    }

    #[test]
    fn gate_03_runs_once_per_load_while_warming_and_not_dispatchable() {
        let mut b = breaker();
        let mut slot = SlotLifecycle::new("llm");
        // Not before the container is up: STARTING is not the gate's state.
        slot.begin_load(&mut b, 0.0).unwrap();
        assert!(matches!(
            slot.gate(&passed(), 1.0),
            Err(LifecycleError::GateOutsideWarming {
                state: Starting,
                ..
            })
        ));
        slot.container_up().unwrap();
        // While it runs the slot is WARMING: not dispatchable.
        assert!(!DISPATCHABLE_STATES.contains(&slot.state()));
        assert_eq!(slot.gate(&unanswered(), 1.0).unwrap(), Warming);
        // Once per load: the same load does not gate again.
        assert!(matches!(
            slot.gate(&passed(), 2.0),
            Err(LifecycleError::GateAlreadyRan { .. })
        ));
        assert_eq!(slot.state(), Warming);
        // The next load re-runs it (GATE-09).
        slot.stop().unwrap();
        warming(&mut slot, &mut b, 3.0);
        assert_eq!(slot.gate(&passed(), 4.0).unwrap(), Ready);
        assert!(matches!(
            slot.gate(&passed(), 5.0),
            Err(LifecycleError::GateOutsideWarming { state: Ready, .. })
        ));
    }

    #[test]
    fn gate_08_a_passing_gate_on_a_later_load_clears_the_verdict() {
        let mut b = breaker();
        let mut slot = SlotLifecycle::new("llm");
        // Load 1: a wrong answer leaves ERROR and a verdict (GATE-05, GATE-07).
        warming(&mut slot, &mut b, 0.0);
        assert_eq!(slot.gate(&wrong(), 1.0).unwrap(), Error);
        let verdict = slot.verdict().unwrap().to_owned();
        assert!(verdict.contains("expected \"Paris\""), "{verdict}");
        // Load 2: unanswered (GATE-09) clears nothing, and a poll finding the
        // server healthy does not adopt it as READY (GATE-07).
        warming(&mut slot, &mut b, 2.0);
        assert_eq!(slot.gate(&unanswered(), 3.0).unwrap(), Warming);
        assert_eq!(slot.verdict(), Some(verdict.as_str()));
        assert!(!slot.adopt_ready(3.5));
        assert_eq!(slot.state(), Warming);
        // Load 3: the pass clears it.
        slot.stop().unwrap();
        warming(&mut slot, &mut b, 4.0);
        assert_eq!(slot.gate(&passed(), 5.0).unwrap(), Ready);
        assert_eq!(slot.verdict(), None);
        assert_eq!(
            slot.journal(),
            &[
                (Offline, Starting),
                (Starting, Warming),
                (Warming, Error),
                (Error, Starting),
                (Starting, Warming),
                (Warming, Offline),
                (Offline, Starting),
                (Starting, Warming),
                (Warming, Ready),
            ]
        );
    }

    #[test]
    fn slot_06_serving_means_a_request_in_flight() {
        let mut b = breaker();
        let mut slot = SlotLifecycle::new("llm");
        warming(&mut slot, &mut b, 0.0);
        slot.gate(&passed(), 1.0).unwrap();
        slot.request_started().unwrap();
        assert_eq!(slot.state(), Serving);
        // Only one way in and out: a request starts and ends.
        assert!(slot.request_started().is_err(), "no request on a request");
        slot.request_finished(2.0).unwrap();
        assert_eq!(slot.state(), Ready);
        assert!(slot.request_finished(3.0).is_err(), "nothing was in flight");
    }

    #[test]
    fn slot_08_ready_goes_idle_after_the_idle_timeout_and_is_an_eviction_candidate() {
        let mut b = breaker();
        let mut slot = SlotLifecycle::new("llm");
        warming(&mut slot, &mut b, 0.0);
        slot.gate(&passed(), 10.0).unwrap();
        slot.request_started().unwrap();
        slot.request_finished(20.0).unwrap();
        // Not at the timeout: longer than it.
        assert!(!slot.idle_check(80.0, 60.0));
        assert_eq!(slot.state(), Ready);
        assert!(slot.idle_check(80.5, 60.0));
        assert_eq!(slot.state(), Idle);
        let candidate = EvictionCandidate {
            name: "llm".into(),
            state: slot.state(),
            priority: 50,
            pinned: None,
            in_flight: 0,
            last_used_s: 20.0,
            resident_mib: 4000,
        };
        assert!(is_eviction_candidate(&candidate, &[]));
        // A request on the idle slot serves it again.
        slot.request_started().unwrap();
        assert_eq!(slot.state(), Serving);
    }

    #[test]
    fn slot_09_both_ways_to_idle_render_identically() {
        let mut b = breaker();
        // Up with an empty model list (SLOT-07)...
        let mut empty = SlotLifecycle::new("s");
        warming(&mut empty, &mut b, 0.0);
        empty.empty_models().unwrap();
        // ...and idle after the timeout (SLOT-08).
        let mut timed_out = SlotLifecycle::new("s");
        warming(&mut timed_out, &mut b, 0.0);
        timed_out.gate(&passed(), 0.0).unwrap();
        assert!(timed_out.idle_check(100.0, 60.0));
        let (a, b) = (empty.record(5.0), timed_out.record(5.0));
        assert_eq!(a, b);
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
        assert_eq!(serde_json::to_value(&a).unwrap()["state"], "idle");
    }

    #[test]
    fn slot_10_error_keeps_its_details_in_the_state_record() {
        let mut b = breaker();
        let mut slot = SlotLifecycle::new("llm");
        slot.begin_load(&mut b, 0.0).unwrap();
        slot.fail("the container exited with status 137").unwrap();
        let record = slot.record(1.0);
        assert_eq!(record.state, Error);
        assert_eq!(
            record.message.as_deref(),
            Some("the container exited with status 137")
        );
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["state"], "error");
        assert_eq!(json["message"], "the container exited with status 137");
        // A wrong answer's record names the probe, the expected token and the answer.
        let mut gated = SlotLifecycle::new("llm");
        warming(&mut gated, &mut b, 0.0);
        gated.gate(&wrong(), 1.0).unwrap();
        let message = gated.record(2.0).message.unwrap();
        assert!(message.contains("/v1/chat/completions"), "{message}");
        assert!(message.contains("\"Paris\""), "{message}");
        // The next load clears the message.
        gated.begin_load(&mut b, 3.0).unwrap();
        assert_eq!(gated.record(3.0).message, None);
    }
}
