//! The slot state machine: nine states, the legal transitions, the dispatchable
//! set and the selection ranking.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::slots::error::SlotError;

/// The state of a slot.
///
/// # Behavior
///
/// Exactly one of nine states (SLOT-02). On the wire, in `state.json` and in
/// [`FromStr`] the states are lowercase (`offline`, `pulling`, `starting`,
/// `warming`, `ready`, `serving`, `idle`, `unloading`, `error`); parsing is
/// exact (no other case is accepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotState {
    /// Not running (SLOT-03).
    Offline,
    /// Model files are being downloaded or verified (SLOT-03).
    Pulling,
    /// The unit was started; waiting for the container (SLOT-03).
    Starting,
    /// The container is up; the health probe is not yet ready (SLOT-04).
    Warming,
    /// Passed the full health probe (and, for llm slots, the output-sanity
    /// gate) (SLOT-05).
    Ready,
    /// A request is in flight (SLOT-06).
    Serving,
    /// Up but idle, or up with an empty model list (SLOT-07, SLOT-08).
    Idle,
    /// A graceful stop is in progress (SLOT-03).
    Unloading,
    /// Failed (SLOT-10).
    Error,
}

impl SlotState {
    /// Every state, in the seed's order.
    pub const ALL: [SlotState; 9] = [
        SlotState::Offline,
        SlotState::Pulling,
        SlotState::Starting,
        SlotState::Warming,
        SlotState::Ready,
        SlotState::Serving,
        SlotState::Idle,
        SlotState::Unloading,
        SlotState::Error,
    ];

    /// The lowercase wire name.
    ///
    /// The inverse of [`FromStr`] (SLOT-02).
    pub const fn as_str(self) -> &'static str {
        match self {
            SlotState::Offline => "offline",
            SlotState::Pulling => "pulling",
            SlotState::Starting => "starting",
            SlotState::Warming => "warming",
            SlotState::Ready => "ready",
            SlotState::Serving => "serving",
            SlotState::Idle => "idle",
            SlotState::Unloading => "unloading",
            SlotState::Error => "error",
        }
    }

    /// The states this one may move to.
    ///
    /// Exactly the row of [`LEGAL_TRANSITIONS`] for this state (SLOT-15 to
    /// SLOT-23).
    pub const fn legal_next(self) -> &'static [SlotState] {
        use SlotState::*;
        match self {
            Offline => &[Pulling, Starting],
            Pulling => &[Starting, Error, Offline],
            Starting => &[Warming, Error, Offline],
            Warming => &[Ready, Idle, Error, Offline],
            Ready => &[Serving, Idle, Unloading, Error],
            Serving => &[Ready, Idle, Error],
            Idle => &[Serving, Unloading, Ready],
            Unloading => &[Offline, Error],
            Error => &[Offline, Pulling, Starting],
        }
    }

    /// Whether `self → to` is in [`LEGAL_TRANSITIONS`].
    ///
    /// The table is authoritative: self-transitions, IDLE → ERROR/OFFLINE and
    /// ERROR → UNLOADING are illegal (SLOT-21 and SLOT-24 Ambiguity readings).
    pub fn can_transition_to(self, to: SlotState) -> bool {
        self.legal_next().contains(&to)
    }

    /// Whether a slot in this state can take a request right now.
    ///
    /// # Behavior
    ///
    /// True for READY, SERVING and IDLE (SLOT-25). An IDLE slot reached from
    /// WARMING has an empty model list and must not be treated as ready: a
    /// router must also confirm the model list is non-empty (SLOT-07, SLOT-09
    /// Ambiguity reading).
    pub fn is_dispatchable(self) -> bool {
        DISPATCHABLE_STATES.contains(&self)
    }

    /// The selection tier, 0 (best) to 3 (last resort).
    ///
    /// 0 dispatchable, 1 WARMING/STARTING/PULLING, 2 OFFLINE/UNLOADING,
    /// 3 ERROR (SLOT-27).
    pub const fn selection_rank(self) -> u8 {
        match self {
            SlotState::Ready | SlotState::Serving | SlotState::Idle => 0,
            SlotState::Warming | SlotState::Starting | SlotState::Pulling => 1,
            SlotState::Offline | SlotState::Unloading => 2,
            SlotState::Error => 3,
        }
    }
}

impl fmt::Display for SlotState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no slot state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown slot state {0:?}")]
pub struct UnknownSlotState(pub String);

impl FromStr for SlotState {
    type Err = UnknownSlotState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SlotState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownSlotState(s.to_owned()))
    }
}

/// The authoritative transition map SlotManager enforces, one row per state in
/// the seed's order.
///
/// Exactly the seed's table (SLOT-15 to SLOT-24); the ASCII diagram's
/// error → unloading arrow is not in it (SLOT-24 Ambiguity reading).
pub const LEGAL_TRANSITIONS: [(SlotState, &[SlotState]); 9] = [
    (SlotState::Offline, SlotState::Offline.legal_next()),
    (SlotState::Pulling, SlotState::Pulling.legal_next()),
    (SlotState::Starting, SlotState::Starting.legal_next()),
    (SlotState::Warming, SlotState::Warming.legal_next()),
    (SlotState::Ready, SlotState::Ready.legal_next()),
    (SlotState::Serving, SlotState::Serving.legal_next()),
    (SlotState::Idle, SlotState::Idle.legal_next()),
    (SlotState::Unloading, SlotState::Unloading.legal_next()),
    (SlotState::Error, SlotState::Error.legal_next()),
];

/// The states in which a slot can take a request right now.
///
/// `{READY, SERVING, IDLE}` (SLOT-25).
pub const DISPATCHABLE_STATES: [SlotState; 3] =
    [SlotState::Ready, SlotState::Serving, SlotState::Idle];

/// Refuses a transition that is not in [`LEGAL_TRANSITIONS`].
///
/// # Behavior
///
/// `Ok(())` for a legal transition; otherwise
/// [`SlotError::IllegalTransition`] (409, `slot.illegal_transition`) naming
/// both states (SLOT-24, SERR-03). Self-transitions are illegal.
pub fn check_transition(from: SlotState, to: SlotState) -> Result<(), SlotError> {
    if from.can_transition_to(to) {
        Ok(())
    } else {
        Err(SlotError::IllegalTransition {
            from: from.as_str().to_owned(),
            to: to.as_str().to_owned(),
        })
    }
}

/// The selection tier of a state given as a string, 0 (best) to 3.
///
/// As [`SlotState::selection_rank`] (SLOT-27); a string that is not a
/// lowercase state name ranks as ERROR, 3 (SLOT-28).
pub fn selection_rank(state: &str) -> u8 {
    state
        .parse::<SlotState>()
        .map_or(SlotState::Error.selection_rank(), SlotState::selection_rank)
}

/// Orders candidate slots that bind the same model, best first.
///
/// # Behavior
///
/// Sorted by [`selection_rank`] (SLOT-27, SLOT-28); the sort is stable, so
/// candidates of one tier keep the caller's (configuration) order (SLOT-27
/// Ambiguity reading).
pub fn sort_by_selection<T>(candidates: &mut [T], state_of: impl Fn(&T) -> &str) {
    candidates.sort_by_key(|c| selection_rank(state_of(c)));
}

/// What a health probe concluded about a slot whose container is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthOutcome {
    /// Non-empty `/v1/models` plus a passing sentinel completion (and, for an
    /// llm slot, a passing output-sanity gate).
    Ready,
    /// The process answers but `/v1/models` is empty.
    EmptyModels,
    /// The probe returned non-ready responses.
    NotReady,
    /// The probe did not resolve (timed out or was ambiguous).
    Unresolved,
}

/// The state a health-probe outcome puts a WARMING slot in.
///
/// Ready → READY (SLOT-05); empty model list → IDLE (SLOT-07); not ready →
/// WARMING (SLOT-04); unresolved → WARMING, never ERROR (SLOT-29).
pub const fn state_after_health(outcome: HealthOutcome) -> SlotState {
    match outcome {
        HealthOutcome::Ready => SlotState::Ready,
        HealthOutcome::EmptyModels => SlotState::Idle,
        HealthOutcome::NotReady | HealthOutcome::Unresolved => SlotState::Warming,
    }
}

/// How a slot's unit ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnitExit {
    /// A deliberate, clean stop.
    CleanStop,
    /// A crash (or a crash loop).
    Crashed,
}

/// The state a slot settles in once its unit has ended.
///
/// # Behavior
///
/// A deliberate stop is not a failure: OFFLINE, and a cached ERROR converges
/// to OFFLINE too (SLOT-11, SLOT-13). A crash is ERROR, and a crashed slot
/// keeps its ERROR (SLOT-14). The caller still moves the slot through legal
/// transitions ([`check_transition`]).
pub const fn state_after_exit(exit: UnitExit) -> SlotState {
    match exit {
        UnitExit::CleanStop => SlotState::Offline,
        UnitExit::Crashed => SlotState::Error,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use SlotState::*;

    /// The seed's table, written out independently of `legal_next`.
    const TABLE: [(SlotState, &[SlotState]); 9] = [
        (Offline, &[Pulling, Starting]),             // SLOT-15
        (Pulling, &[Starting, Error, Offline]),      // SLOT-16
        (Starting, &[Warming, Error, Offline]),      // SLOT-17
        (Warming, &[Ready, Idle, Error, Offline]),   // SLOT-18
        (Ready, &[Serving, Idle, Unloading, Error]), // SLOT-19
        (Serving, &[Ready, Idle, Error]),            // SLOT-20
        (Idle, &[Serving, Unloading, Ready]),        // SLOT-21
        (Unloading, &[Offline, Error]),              // SLOT-22
        (Error, &[Offline, Pulling, Starting]),      // SLOT-23
    ];

    // SLOT-15..SLOT-24, SERR-03: all 81 pairs.
    #[test]
    fn slot_15_to_24_every_pair_is_legal_exactly_as_the_table_says() {
        let mut legal = 0;
        for (from, next) in TABLE {
            for to in SlotState::ALL {
                let expected = next.contains(&to);
                match check_transition(from, to) {
                    Ok(()) => {
                        assert!(expected, "{from} -> {to} should be illegal");
                        legal += 1;
                    }
                    Err(err) => {
                        assert!(!expected, "{from} -> {to} should be legal");
                        assert_eq!(err.http_status(), 409);
                        assert_eq!(err.code(), "slot.illegal_transition");
                        assert_eq!(
                            err,
                            SlotError::IllegalTransition {
                                from: from.as_str().into(),
                                to: to.as_str().into()
                            }
                        );
                    }
                }
            }
        }
        assert_eq!(legal, 27);
        for ((a, next_a), (b, next_b)) in LEGAL_TRANSITIONS.iter().zip(TABLE.iter()) {
            assert_eq!(a, b);
            assert_eq!(next_a, next_b);
        }
    }

    // SLOT-21 / SLOT-24 Ambiguity readings: the table wins.
    #[test]
    fn slot_24_self_transitions_and_diagram_only_edges_are_illegal() {
        for s in SlotState::ALL {
            assert!(check_transition(s, s).is_err(), "{s} -> {s}");
        }
        assert!(check_transition(Error, Unloading).is_err());
        assert!(check_transition(Idle, Error).is_err());
        assert!(check_transition(Idle, Offline).is_err());
        assert!(check_transition(Serving, Unloading).is_err());
        assert!(check_transition(Ready, Offline).is_err());
    }

    // SLOT-02
    #[test]
    fn slot_02_names_round_trip_lowercase_only() {
        for s in SlotState::ALL {
            assert_eq!(s.as_str().parse::<SlotState>(), Ok(s));
            assert_eq!(s.to_string(), s.as_str());
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
            assert_eq!(serde_json::from_str::<SlotState>(&json).unwrap(), s);
        }
        assert!("READY".parse::<SlotState>().is_err());
        assert!("".parse::<SlotState>().is_err());
        assert_eq!(SlotState::ALL.len(), 9);
    }

    // SLOT-25
    #[test]
    fn slot_25_dispatchable_states() {
        let dispatchable: Vec<_> = SlotState::ALL
            .into_iter()
            .filter(|s| s.is_dispatchable())
            .collect();
        assert_eq!(dispatchable, vec![Ready, Serving, Idle]);
        assert_eq!(DISPATCHABLE_STATES, [Ready, Serving, Idle]);
    }

    // SLOT-27, SLOT-28
    #[test]
    fn slot_27_28_selection_rank_including_unknown_strings() {
        let cases = [
            ("ready", 0),
            ("serving", 0),
            ("idle", 0),
            ("warming", 1),
            ("starting", 1),
            ("pulling", 1),
            ("offline", 2),
            ("unloading", 2),
            ("error", 3),
            ("", 3),      // SLOT-28
            ("bogus", 3), // SLOT-28
            ("READY", 3), // SLOT-28: not a lowercase state name
        ];
        for (state, rank) in cases {
            assert_eq!(selection_rank(state), rank, "{state:?}");
        }
    }

    // SLOT-27 Ambiguity: stable within a tier.
    #[test]
    fn slot_27_sort_is_stable_within_a_tier() {
        let mut c = vec![
            ("a", "error"),
            ("b", "offline"),
            ("c", "idle"),
            ("d", "weird"),
            ("e", "warming"),
            ("f", "ready"),
            ("g", "pulling"),
        ];
        sort_by_selection(&mut c, |x| x.1);
        let names: Vec<_> = c.iter().map(|x| x.0).collect();
        assert_eq!(names, vec!["c", "f", "e", "g", "b", "a", "d"]);
    }
    // SLOT-04, SLOT-05, SLOT-07, SLOT-29
    #[test]
    fn slot_29_unresolved_health_resolves_to_warming() {
        assert_eq!(state_after_health(HealthOutcome::Unresolved), Warming);
        assert_eq!(state_after_health(HealthOutcome::NotReady), Warming);
        assert_eq!(state_after_health(HealthOutcome::Ready), Ready);
        assert_eq!(state_after_health(HealthOutcome::EmptyModels), Idle);
        for o in [
            HealthOutcome::Unresolved,
            HealthOutcome::NotReady,
            HealthOutcome::Ready,
            HealthOutcome::EmptyModels,
        ] {
            let to = state_after_health(o);
            assert!(to == Warming || check_transition(Warming, to).is_ok());
        }
    }

    // SLOT-11, SLOT-13, SLOT-14
    #[test]
    fn slot_11_14_clean_stop_is_offline_crash_keeps_error() {
        assert_eq!(state_after_exit(UnitExit::CleanStop), Offline);
        assert_eq!(state_after_exit(UnitExit::Crashed), Error);
        assert!(check_transition(Error, state_after_exit(UnitExit::CleanStop)).is_ok());
        assert!(check_transition(Unloading, state_after_exit(UnitExit::CleanStop)).is_ok());
    }
}
