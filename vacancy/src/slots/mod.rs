//! hal0's slot lifecycle as pure, clock-injected logic.
//!
//! A *slot* is a named place where one model server runs. This module holds the
//! reusable rules of hal0's slot lifecycle (seed 002; rule IDs from the rule
//! catalog): the state machine and its selection ranking ([`state`]), the
//! typed `slot.*` errors ([`error`]).
//!
//! Nothing here reads a clock, spawns a process or talks to systemd: time is an
//! argument (or an injected clock), and callers own the side effects.

pub mod breaker;
pub mod error;
pub mod state;

pub use breaker::{BreakerSeed, BreakerSnapshot, BreakerState, CrashLoopBreaker, cooldown_s};
pub use error::SlotError;
pub use state::{
    DISPATCHABLE_STATES, LEGAL_TRANSITIONS, SlotState, UnknownSlotState, check_transition,
    selection_rank, sort_by_selection,
};
