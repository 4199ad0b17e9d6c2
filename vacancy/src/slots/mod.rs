//! hal0's slot lifecycle as pure, clock-injected logic.
//!
//! A *slot* is a named place where one model server runs. This module holds the
//! reusable rules of hal0's slot lifecycle (seed 002; rule IDs are those of the
//! rule catalog, `docs/rules.md`), one concept per file:
//!
//! - [`state`]: the nine [`SlotState`]s, [`LEGAL_TRANSITIONS`],
//!   [`DISPATCHABLE_STATES`], [`check_transition`] and [`selection_rank`]
//!   (SLOT).
//! - [`error`]: [`SlotError`], the typed `slot.*` errors with their HTTP
//!   statuses and structured details (SERR).
//! - [`breaker`]: the per-slot [`CrashLoopBreaker`] (BRK).
//! - [`eviction`]: the candidate filter, [`eviction_order`], the pre-load
//!   planner, the pinned and NPU-exclusivity checks and the retired `lru` key
//!   (EVICT, SERR-10, SERR-11).
//! - [`record`]: [`SlotStateRecord`] and its atomic `state.json` persistence
//!   (PERS).
//! - [`config`]: the slot-write guards, activation and `autoload` (SLOTCFG-02
//!   to SLOTCFG-17).
//! - [`budget`]: [`slot_lifecycle_budget`] (SLOTCFG-19 to SLOTCFG-21).
//! - [`launch`]: launch-argv composition with per-flag provenance (SLOTCFG-22
//!   to SLOTCFG-29).
//! - [`lifecycle`]: [`SlotLifecycle`], one slot driven through loads, the
//!   gate, requests and stops in order (BRK-07, GATE-03, GATE-07, GATE-08,
//!   SLOT-06 to SLOT-10).
//! - [`providers`]: [`SELF_MANAGED_PROVIDERS`] (PROV).
//!
//! Nothing here reads a clock, spawns a process or talks to systemd: time is an
//! argument (or an injected clock, [`CrashLoopBreaker::new`]), and callers own
//! the side effects. Where the seed is ambiguous the code follows the
//! `Ambiguity:` reading of the rule catalog and says so in its docs.
//!
//! ```
//! use vacancy::slots::{CrashLoopBreaker, SlotState, check_transition, selection_rank};
//!
//! assert!(check_transition(SlotState::Ready, SlotState::Serving).is_ok());
//! assert_eq!(check_transition(SlotState::Idle, SlotState::Error).unwrap_err().http_status(), 409);
//! assert_eq!(selection_rank("no-such-state"), 3);
//!
//! let mut breaker = CrashLoopBreaker::new(|| 0.0);
//! breaker.record_failure_at("agent", 100.0);
//! let refused = breaker.check_at("agent", 102.0).unwrap_err();
//! assert_eq!((refused.http_status(), refused.retry_after_s()), (503, Some(3)));
//! assert!(breaker.check_at("agent", 105.0).is_ok()); // the half-open trial
//! ```

pub mod breaker;
pub mod budget;
pub mod config;
pub mod error;
pub mod eviction;
mod keys;
pub mod launch;
pub mod lifecycle;
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
pub use lifecycle::{LifecycleError, SlotLifecycle};
pub use providers::{SELF_MANAGED_PROVIDERS, provider_requires_model};
pub use record::{
    STATE_FILE_NAME, SlotStateRecord, StateRecordError, read_state_record, state_record_path,
    write_state_record,
};
pub use state::{
    DISPATCHABLE_STATES, HealthOutcome, LEGAL_TRANSITIONS, SlotState, UnitExit, UnknownSlotState,
    check_transition, selection_rank, sort_by_selection, state_after_exit, state_after_health,
};
