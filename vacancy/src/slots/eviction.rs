//! Eviction: which resident slots may be unloaded to make room, in which order,
//! and the checks that protect pinned slots and the NPU.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::slots::error::SlotError;
use crate::slots::keys::key_paths;
use crate::slots::state::SlotState;

/// The lowest eviction priority (EVICT-02).
pub const MIN_PRIORITY: u8 = 0;
/// The highest eviction priority: evicted last, but not a pin (EVICT-02, EVICT-06).
pub const MAX_PRIORITY: u8 = 100;
/// The priority of a slot that sets none (EVICT-02).
pub const DEFAULT_PRIORITY: u8 = 50;
/// The default-pinned anchors. The seed says "agent and friends" without
/// enumerating the friends (EVICT-08 Ambiguity), so only `agent` is listed;
/// callers pass their own anchor set to every function here.
pub const DEFAULT_PINNED_ANCHORS: &[&str] = &["agent"];
/// The most victims one pre-load eviction takes: a load's budget charges "up
/// to three in-series eviction unloads" (SLOTCFG-20).
pub const MAX_PRELOAD_VICTIMS: usize = 3;
/// The warning the sweep logs once per slot that still carries `lru` (EVICT-11).
pub const LRU_RETIRED_EVENT: &str = "slot.lru_flag_retired";

/// Reads a slot's `priority` value the lenient way hal0's sweep does.
///
/// # Behavior
///
/// Absent → 50 (EVICT-02). An integer is clamped into 0..=100. Anything that
/// is not an integer — a float (even `70.0`), a string, a bool — reads as 50.
/// The seed is silent on out-of-range values and docs/rules.md's EVICT-02 reading
/// rejects them at validation; that strict check is [`validate_priority`].
/// This lenient reading follows hal0's sweep, which must still order a slot
/// file that was loaded leniently. (Python's `bool` is an `int`; reading it as
/// 50 here is this crate's choice.)
pub fn priority_from_value(value: Option<&Value>) -> u8 {
    match value {
        Some(Value::Number(n)) => {
            if let Some(i) = n.as_i64() {
                clamp_priority(i)
            } else if n.as_u64().is_some() {
                MAX_PRIORITY
            } else {
                DEFAULT_PRIORITY
            }
        }
        _ => DEFAULT_PRIORITY,
    }
}

/// Clamps an integer priority into 0..=100.
///
/// EVICT-02 (lenient reading).
pub fn clamp_priority(priority: i64) -> u8 {
    u8::try_from(priority.clamp(i64::from(MIN_PRIORITY), i64::from(MAX_PRIORITY)))
        .unwrap_or(DEFAULT_PRIORITY)
}

/// Validates a slot's `priority` value strictly.
///
/// # Behavior
///
/// Absent → 50; an integer in 0..=100 → itself; anything else (out of range,
/// non-integer) → [`SlotError::ConfigError`] (400) at key `priority`
/// (EVICT-02 Ambiguity reading).
pub fn validate_priority(value: Option<&Value>) -> Result<u8, SlotError> {
    let Some(value) = value else {
        return Ok(DEFAULT_PRIORITY);
    };
    value
        .as_i64()
        .and_then(|i| u8::try_from(i).ok())
        .filter(|p| *p <= MAX_PRIORITY)
        .ok_or_else(|| SlotError::ConfigError {
            key: Some("priority".to_owned()),
            message: format!("priority must be an integer from 0 to 100, got {value}"),
        })
}

/// What the eviction logic needs to know about one slot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvictionCandidate {
    /// The slot name.
    pub name: String,
    /// Its current state.
    pub state: SlotState,
    /// Its eviction priority; clamped into 0..=100 when ordering (EVICT-02).
    pub priority: i64,
    /// `pinned` as configured; `None` when the slot does not set it, in which
    /// case it is pinned exactly when it is an anchor (EVICT-08).
    pub pinned: Option<bool>,
    /// Requests in flight on the slot right now.
    pub in_flight: u32,
    /// When it last served a request, in seconds on the caller's clock.
    pub last_used_s: f64,
    /// Memory it would free when unloaded, in MiB.
    pub resident_mib: u64,
}

/// Whether a slot counts as pinned.
///
/// # Behavior
///
/// An explicit `pinned` wins; without one, a slot named in `anchors` is
/// pinned ("default-pinned anchors", EVICT-07, EVICT-08). Reading: an anchor
/// that explicitly sets `pinned = false` is not pinned, since the anchors are
/// pinned by default only.
pub fn is_pinned(name: &str, pinned: Option<bool>, anchors: &[&str]) -> bool {
    pinned.unwrap_or_else(|| anchors.contains(&name))
}

/// Whether a slot may be an eviction victim at all.
///
/// # Behavior
///
/// Only resident slots (READY or IDLE, EVICT-10), never with a request in
/// flight (EVICT-09), never pinned or a default-pinned anchor (EVICT-07,
/// EVICT-08). Priority does not exempt: 100 is still a candidate (EVICT-06).
/// Whether the slot ever set the retired `lru` key plays no part (EVICT-11,
/// EVICT-13).
pub fn is_eviction_candidate(slot: &EvictionCandidate, anchors: &[&str]) -> bool {
    matches!(slot.state, SlotState::Ready | SlotState::Idle)
        && slot.in_flight == 0
        && !is_pinned(&slot.name, slot.pinned, anchors)
}

/// The eviction candidates among `slots`, victims first.
///
/// # Behavior
///
/// Filters with [`is_eviction_candidate`], then orders by priority (clamped,
/// lowest first, EVICT-02, EVICT-04) and, within a priority, least recently
/// used first (EVICT-05). Ties keep the caller's order. The same order serves
/// memory-pressure and pre-load eviction (EVICT-03).
pub fn eviction_order<'a>(
    slots: &'a [EvictionCandidate],
    anchors: &[&str],
) -> Vec<&'a EvictionCandidate> {
    let mut victims: Vec<&EvictionCandidate> = slots
        .iter()
        .filter(|s| is_eviction_candidate(s, anchors))
        .collect();
    victims.sort_by(|a, b| {
        clamp_priority(a.priority)
            .cmp(&clamp_priority(b.priority))
            .then(a.last_used_s.total_cmp(&b.last_used_s))
    });
    victims
}

/// What a pre-load eviction must make room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreloadNeed {
    /// Memory the new load needs, in MiB.
    pub need_mib: u64,
    /// Headroom to keep free on top of it, in MiB.
    pub headroom_mib: u64,
    /// Memory free now, in MiB.
    pub free_mib: u64,
    /// The most victims to take; [`MAX_PRELOAD_VICTIMS`] by default.
    pub max_victims: usize,
}

/// The victims a pre-load eviction should unload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictionPlan {
    /// Slot names to unload, in order.
    pub victims: Vec<String>,
    /// Memory they free, in MiB.
    pub freed_mib: u64,
    /// Whether the need plus headroom fits after unloading them.
    pub fits: bool,
}

/// Plans a pre-load eviction (`preload_evict`).
///
/// # Behavior
///
/// Nothing to evict when `free + 0 ≥ need + headroom`. Otherwise takes victims
/// in [`eviction_order`] (EVICT-03 to EVICT-10) until the freed memory makes
/// the need plus headroom fit, taking at most `max_victims` (the budget's
/// three in-series unloads, SLOTCFG-20). When even that does not fit, the plan
/// evicts nothing and `fits` is false: unloading slots that cannot make room
/// would only lose work (reading; the seed does not say).
pub fn plan_preload_eviction(
    slots: &[EvictionCandidate],
    anchors: &[&str],
    need: PreloadNeed,
) -> EvictionPlan {
    let target = need.need_mib.saturating_add(need.headroom_mib);
    let mut free = need.free_mib;
    let mut victims = Vec::new();
    let mut freed = 0u64;
    for slot in eviction_order(slots, anchors) {
        if free >= target || victims.len() >= need.max_victims {
            break;
        }
        victims.push(slot.name.clone());
        freed = freed.saturating_add(slot.resident_mib);
        free = free.saturating_add(slot.resident_mib);
    }
    if free >= target {
        EvictionPlan {
            victims,
            freed_mib: freed,
            fits: true,
        }
    } else {
        EvictionPlan {
            victims: Vec::new(),
            freed_mib: 0,
            fits: false,
        }
    }
}

/// An operation a pin protects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PinnedAction {
    /// Unloading the slot.
    Unload,
    /// Deleting the slot.
    Delete,
}

impl PinnedAction {
    /// `unload` or `delete`.
    ///
    /// The word used in [`SlotError::Pinned`] (SERR-11).
    pub const fn as_str(self) -> &'static str {
        match self {
            PinnedAction::Unload => "unload",
            PinnedAction::Delete => "delete",
        }
    }
}

/// Refuses to unload or delete a pinned slot unless forced.
///
/// # Behavior
///
/// A pinned slot (explicit pin or default-pinned anchor, [`is_pinned`])
/// without `force` → [`SlotError::Pinned`] (409); with `?force=true` it
/// proceeds (SERR-11). Unpinned slots always proceed.
pub fn check_pinned(
    name: &str,
    pinned: Option<bool>,
    anchors: &[&str],
    action: PinnedAction,
    force: bool,
) -> Result<(), SlotError> {
    if force || !is_pinned(name, pinned, anchors) {
        Ok(())
    } else {
        Err(SlotError::Pinned {
            slot: name.to_owned(),
            action: action.as_str().to_owned(),
        })
    }
}

/// Where a slot runs and what it serves, for the NPU exclusivity check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotPlacement {
    /// The slot name.
    pub name: String,
    /// Its `device`, e.g. `npu`.
    pub device: String,
    /// Its `type`, e.g. `llm`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its `model.default`; empty when no model is bound.
    pub model_default: String,
}

impl SlotPlacement {
    /// Whether the slot holds the NPU's one hardware context.
    ///
    /// `device = "npu"`, `type = "llm"` and a bound (non-empty) model
    /// (SERR-10, SLOTCFG-12).
    pub fn holds_npu(&self) -> bool {
        self.device == "npu" && self.kind == "llm" && !self.model_default.is_empty()
    }
}

/// Refuses a write or load that would make a second NPU llm slot with a bound
/// model.
///
/// # Behavior
///
/// When `target` holds the NPU ([`SlotPlacement::holds_npu`]) and another slot
/// in `others` (a different name) does too → [`SlotError::NpuExclusivity`]
/// (409) naming the holder (SERR-10; checked on any write or load, SERR-10
/// Ambiguity reading). `others` may include `target`'s own previous version.
pub fn check_npu_exclusivity(
    target: &SlotPlacement,
    others: &[SlotPlacement],
) -> Result<(), SlotError> {
    if !target.holds_npu() {
        return Ok(());
    }
    match others
        .iter()
        .find(|o| o.name != target.name && o.holds_npu())
    {
        Some(holder) => Err(SlotError::NpuExclusivity {
            slot: target.name.clone(),
            holder: holder.name.clone(),
        }),
        None => Ok(()),
    }
}

/// Every path in a slot payload at which the retired `lru` key appears.
fn lru_paths(slot_file: &Value) -> Vec<String> {
    key_paths(slot_file)
        .into_iter()
        .filter(|(_, key)| key == "lru")
        .map(|(path, _)| path)
        .collect()
}

/// The strict slot loader's refusal of the retired `lru` key.
///
/// # Behavior
///
/// A slot file that still carries `lru` (anywhere) fails with
/// [`SlotError::ConfigError`] (400) whose message names the replacement,
/// `priority`/`pinned` (EVICT-12, strict side of its Ambiguity reading).
pub fn reject_retired_lru(slot_file: &Value) -> Result<(), SlotError> {
    match lru_paths(slot_file).into_iter().next() {
        None => Ok(()),
        Some(path) => Err(SlotError::ConfigError {
            key: Some(path),
            message: "the lru eviction opt-in is retired: use priority (0-100, lowest evicted \
                      first) or pinned = true instead"
                .to_owned(),
        }),
    }
}

/// The sweep's one-time warnings about the retired `lru` key.
///
/// # Behavior
///
/// The sweep ignores `lru` (EVICT-11): [`LruRetirementWarnings::note`] logs a
/// `slot.lru_flag_retired` warning the first time it sees a slot carrying it
/// and never again for that slot.
#[derive(Debug, Clone, Default)]
pub struct LruRetirementWarnings {
    warned: HashSet<String>,
}

impl LruRetirementWarnings {
    /// No slot warned yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Notes that the sweep saw `slot`, whose file does or does not carry
    /// `lru`; returns whether a warning was logged now.
    ///
    /// Warns (tracing, `warn` level, event `slot.lru_flag_retired`) once per
    /// slot (EVICT-11); eviction itself is unaffected (EVICT-13).
    pub fn note(&mut self, slot: &str, carries_lru: bool) -> bool {
        if !carries_lru || self.warned.contains(slot) {
            return false;
        }
        self.warned.insert(slot.to_owned());
        tracing::warn!(
            event = LRU_RETIRED_EVENT,
            slot,
            "slot {slot} still sets the retired lru key; it is ignored: use priority or pinned"
        );
        true
    }

    /// Notes a slot file the way [`Self::note`] does, looking for `lru` in it.
    ///
    /// EVICT-11.
    pub fn note_file(&mut self, slot: &str, slot_file: &Value) -> bool {
        let carries = !lru_paths(slot_file).is_empty();
        self.note(slot, carries)
    }

    /// Whether `slot` has been warned about.
    ///
    /// EVICT-11.
    pub fn warned(&self, slot: &str) -> bool {
        self.warned.contains(slot)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn slot(name: &str, state: SlotState, priority: i64, last_used_s: f64) -> EvictionCandidate {
        EvictionCandidate {
            name: name.to_owned(),
            state,
            priority,
            pinned: None,
            in_flight: 0,
            last_used_s,
            resident_mib: 1000,
        }
    }

    fn names(v: &[&EvictionCandidate]) -> Vec<String> {
        v.iter().map(|s| s.name.clone()).collect()
    }

    // EVICT-02
    #[test]
    fn evict_02_priority_default_clamp_and_non_integers() {
        assert_eq!(priority_from_value(None), 50);
        assert_eq!(priority_from_value(Some(&json!(0))), 0);
        assert_eq!(priority_from_value(Some(&json!(100))), 100);
        assert_eq!(priority_from_value(Some(&json!(70))), 70);
        assert_eq!(priority_from_value(Some(&json!(-5))), 0);
        assert_eq!(priority_from_value(Some(&json!(250))), 100);
        assert_eq!(priority_from_value(Some(&json!(u64::MAX))), 100);
        assert_eq!(priority_from_value(Some(&json!(70.0))), 50);
        assert_eq!(priority_from_value(Some(&json!("70"))), 50);
        assert_eq!(priority_from_value(Some(&json!(true))), 50);
        assert_eq!(priority_from_value(Some(&json!(null))), 50);
        assert_eq!(clamp_priority(i64::MIN), 0);
        assert_eq!(clamp_priority(i64::MAX), 100);
    }

    // EVICT-02 Ambiguity: strict validation rejects out-of-range values.
    #[test]
    fn evict_02_strict_validation() {
        assert_eq!(validate_priority(None).unwrap(), 50);
        assert_eq!(validate_priority(Some(&json!(0))).unwrap(), 0);
        assert_eq!(validate_priority(Some(&json!(100))).unwrap(), 100);
        for bad in [json!(101), json!(-1), json!(5.5), json!("x"), json!(true)] {
            let err = validate_priority(Some(&bad)).unwrap_err();
            assert_eq!(err.http_status(), 400, "{bad}");
            assert_eq!(err.code(), "slot.config_error");
        }
    }

    // EVICT-09, EVICT-10, EVICT-07, EVICT-08, EVICT-06, EVICT-01
    #[test]
    fn evict_candidate_filter() {
        let anchors = DEFAULT_PINNED_ANCHORS;
        let mut slots = vec![];
        for state in SlotState::ALL {
            slots.push(slot(state.as_str(), state, 50, 0.0));
        }
        let order = eviction_order(&slots, anchors);
        assert_eq!(names(&order), vec!["ready", "idle"], "EVICT-10");

        let mut busy = slot("busy", SlotState::Ready, 0, 0.0);
        busy.in_flight = 1;
        assert!(!is_eviction_candidate(&busy, anchors), "EVICT-09");
        let mut pinned = slot("p", SlotState::Idle, 0, 0.0);
        pinned.pinned = Some(true);
        assert!(!is_eviction_candidate(&pinned, anchors), "EVICT-07");
        let agent = slot("agent", SlotState::Idle, 0, 0.0);
        assert!(!is_eviction_candidate(&agent, anchors), "EVICT-08");
        assert!(
            is_eviction_candidate(&agent, &[]),
            "caller-supplied anchors"
        );
        let mut unpinned_agent = agent.clone();
        unpinned_agent.pinned = Some(false);
        assert!(is_eviction_candidate(&unpinned_agent, anchors));
        let top = slot("top", SlotState::Ready, 100, 0.0);
        assert!(is_eviction_candidate(&top, anchors), "EVICT-06");
    }

    // EVICT-04, EVICT-05, EVICT-06, EVICT-02 (clamping in order)
    #[test]
    fn evict_order_priority_then_lru() {
        let slots = vec![
            slot("hi-old", SlotState::Idle, 100, 1.0),
            slot("mid-new", SlotState::Ready, 50, 30.0),
            slot("mid-old", SlotState::Ready, 50, 10.0),
            slot("low", SlotState::Ready, 10, 99.0),
            slot("neg", SlotState::Ready, -40, 500.0), // clamps to 0
            slot("huge", SlotState::Idle, 1000, 0.0),  // clamps to 100
        ];
        let order = eviction_order(&slots, DEFAULT_PINNED_ANCHORS);
        assert_eq!(
            names(&order),
            vec!["neg", "low", "mid-old", "mid-new", "huge", "hi-old"]
        );
    }

    // EVICT-03, SLOTCFG-20: the planner.
    #[test]
    fn evict_03_preload_planner() {
        let mut slots = vec![
            slot("a", SlotState::Ready, 10, 0.0),
            slot("b", SlotState::Idle, 20, 0.0),
            slot("c", SlotState::Idle, 30, 0.0),
            slot("d", SlotState::Idle, 40, 0.0),
        ];
        slots[0].resident_mib = 2000;
        let need = |need_mib, free_mib| PreloadNeed {
            need_mib,
            headroom_mib: 500,
            free_mib,
            max_victims: MAX_PRELOAD_VICTIMS,
        };
        // Already fits: nothing evicted.
        let plan = plan_preload_eviction(&slots, &[], need(1000, 1500));
        assert_eq!(
            plan,
            EvictionPlan {
                victims: vec![],
                freed_mib: 0,
                fits: true
            }
        );
        // Need 4000+500 with 1000 free: a (2000) + b (1000) + c (1000) = 5000.
        let plan = plan_preload_eviction(&slots, &[], need(4000, 1000));
        assert_eq!(plan.victims, vec!["a", "b", "c"]);
        assert_eq!(plan.freed_mib, 4000);
        assert!(plan.fits);
        // Would need four victims: over the cap, evict nothing.
        let plan = plan_preload_eviction(&slots, &[], need(5000, 1000));
        assert_eq!(
            plan,
            EvictionPlan {
                victims: vec![],
                freed_mib: 0,
                fits: false
            }
        );
        // Without the cap the fourth fits it.
        let plan = plan_preload_eviction(
            &slots,
            &[],
            PreloadNeed {
                max_victims: 10,
                ..need(5000, 1000)
            },
        );
        assert_eq!(plan.victims, vec!["a", "b", "c", "d"]);
        // Exactly fitting counts as fitting.
        let plan = plan_preload_eviction(&slots, &[], need(2500, 1000));
        assert_eq!(plan.victims, vec!["a"]);
    }

    // SERR-11
    #[test]
    fn serr_11_pinned_needs_force() {
        let anchors = DEFAULT_PINNED_ANCHORS;
        let err = check_pinned("p", Some(true), anchors, PinnedAction::Unload, false).unwrap_err();
        assert_eq!(err.http_status(), 409);
        assert_eq!(err.code(), "slot.pinned");
        assert!(err.to_string().contains("force=true"));
        assert!(check_pinned("p", Some(true), anchors, PinnedAction::Unload, true).is_ok());
        let err = check_pinned("agent", None, anchors, PinnedAction::Delete, false).unwrap_err();
        assert_eq!(err.details()["action"], "delete");
        assert!(check_pinned("q", None, anchors, PinnedAction::Delete, false).is_ok());
        assert!(check_pinned("q", Some(false), anchors, PinnedAction::Unload, false).is_ok());
    }

    fn placement(name: &str, device: &str, kind: &str, model: &str) -> SlotPlacement {
        SlotPlacement {
            name: name.into(),
            device: device.into(),
            kind: kind.into(),
            model_default: model.into(),
        }
    }

    // SERR-10
    #[test]
    fn serr_10_npu_exclusivity() {
        let holder = placement("a", "npu", "llm", "m1");
        let second = placement("b", "npu", "llm", "m2");
        let err = check_npu_exclusivity(&second, std::slice::from_ref(&holder)).unwrap_err();
        assert_eq!(err.http_status(), 409);
        assert_eq!(err.code(), "slot.npu_exclusivity_violation");
        assert_eq!(err.details()["holder"], "a");
        // Its own previous version does not count.
        assert!(check_npu_exclusivity(&holder, std::slice::from_ref(&holder)).is_ok());
        // Unbound, other device, other type: fine either way.
        let others = [holder.clone()];
        assert!(check_npu_exclusivity(&placement("b", "npu", "llm", ""), &others).is_ok());
        assert!(check_npu_exclusivity(&placement("b", "rocm", "llm", "m"), &others).is_ok());
        assert!(check_npu_exclusivity(&placement("b", "npu", "stt", "m"), &others).is_ok());
        let unbound_holder = [placement("a", "npu", "llm", "")];
        assert!(check_npu_exclusivity(&second, &unbound_holder).is_ok());
    }

    // EVICT-12
    #[test]
    fn evict_12_strict_loader_refuses_lru_naming_the_replacement() {
        assert!(reject_retired_lru(&json!({"priority": 10})).is_ok());
        let err = reject_retired_lru(&json!({"name": "s", "lru": true})).unwrap_err();
        assert_eq!(err.http_status(), 400);
        assert_eq!(err.details()["key"], "lru");
        let msg = err.to_string();
        assert!(msg.contains("priority") && msg.contains("pinned"), "{msg}");
        let err = reject_retired_lru(&json!({"eviction": {"lru": false}})).unwrap_err();
        assert_eq!(err.details()["key"], "eviction.lru");
    }

    // EVICT-11, EVICT-13
    #[test]
    fn evict_11_sweep_warns_once_per_slot_and_ignores_lru() {
        let mut w = LruRetirementWarnings::new();
        assert!(!w.note("clean", false));
        assert!(w.note_file("old", &json!({"lru": true})));
        assert!(!w.note_file("old", &json!({"lru": true})), "once");
        assert!(w.note("other", true), "per slot");
        assert!(w.warned("old") && w.warned("other") && !w.warned("clean"));
        // EVICT-13: lru plays no part in the order.
        let slots = vec![
            slot("old", SlotState::Idle, 50, 0.0),
            slot("clean", SlotState::Idle, 50, 1.0),
        ];
        assert_eq!(names(&eviction_order(&slots, &[])), vec!["old", "clean"]);
    }

    // EVICT-11: the warning goes to the log with the event name.
    #[test]
    fn evict_11_warning_is_logged() {
        use std::io::Write;
        use std::sync::{Arc, Mutex};

        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let mut w = LruRetirementWarnings::new();
            w.note("s1", true);
            w.note("s1", true);
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(out.matches(LRU_RETIRED_EVENT).count(), 1, "{out}");
        assert!(out.contains("WARN"));
    }

    fn arb_slot() -> impl Strategy<Value = EvictionCandidate> {
        (
            "[a-z]{1,6}",
            0usize..9,
            -50i64..150,
            proptest::option::of(any::<bool>()),
            0u32..3,
            0.0f64..1000.0,
        )
            .prop_map(|(name, st, priority, pinned, in_flight, last_used_s)| {
                EvictionCandidate {
                    name,
                    state: SlotState::ALL[st],
                    priority,
                    pinned,
                    in_flight,
                    last_used_s,
                    resident_mib: 100,
                }
            })
    }

    proptest! {
        // EVICT-04..EVICT-10: every victim is eligible, every eligible slot is
        // a victim, and the order is non-decreasing in (priority, last use).
        #[test]
        fn evict_prop_order_is_filtered_and_sorted(slots in proptest::collection::vec(arb_slot(), 0..12)) {
            let anchors = DEFAULT_PINNED_ANCHORS;
            let order = eviction_order(&slots, anchors);
            let eligible = slots.iter().filter(|s| is_eviction_candidate(s, anchors)).count();
            prop_assert_eq!(order.len(), eligible);
            for v in &order {
                prop_assert!(matches!(v.state, SlotState::Ready | SlotState::Idle));
                prop_assert_eq!(v.in_flight, 0);
                prop_assert!(!is_pinned(&v.name, v.pinned, anchors));
            }
            for w in order.windows(2) {
                let (a, b) = (w[0], w[1]);
                let (pa, pb) = (clamp_priority(a.priority), clamp_priority(b.priority));
                prop_assert!(pa < pb || (pa == pb && a.last_used_s <= b.last_used_s));
            }
        }
    }
}
