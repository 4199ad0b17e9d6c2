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
pub mod budget;
pub mod config;
pub mod error;
pub mod eviction;
mod keys;
pub mod launch;
pub mod providers;
pub mod record;
pub mod state;

pub use breaker::{BreakerSeed, BreakerSnapshot, BreakerState, CrashLoopBreaker, cooldown_s};
pub use budget::{
    BUDGET_EVICTION_UNLOADS, LIFECYCLE_OVERHEAD, LifecycleBudgetInputs, LifecycleOp,
    slot_lifecycle_budget,
};
pub use config::{
    Autoload, ConversionBlocked, autoload_for_create, bound_model, check_unconverted,
    conversion_blocked, guard_slot_write_payload, is_activated, resolve_autoload,
};
pub use error::SlotError;
pub use eviction::{
    DEFAULT_PINNED_ANCHORS, DEFAULT_PRIORITY, EvictionCandidate, EvictionPlan,
    LruRetirementWarnings, MAX_PRELOAD_VICTIMS, PinnedAction, PreloadNeed, SlotPlacement,
    check_npu_exclusivity, check_pinned, clamp_priority, eviction_order, is_eviction_candidate,
    is_pinned, plan_preload_eviction, priority_from_value, reject_retired_lru, validate_priority,
};
pub use launch::{
    FlagProvenance, LaunchFlag, LaunchLayer, ResolvedLaunch, canonical_flag, compose_launch_argv,
    llama_device_arg, parse_launch_args,
};
pub use providers::{SELF_MANAGED_PROVIDERS, provider_requires_model};
pub use record::{
    STATE_FILE_NAME, SlotStateRecord, StateRecordError, read_state_record, state_record_path,
    write_state_record,
};
pub use state::{
    DISPATCHABLE_STATES, LEGAL_TRANSITIONS, SlotState, UnknownSlotState, check_transition,
    selection_rank, sort_by_selection,
};
