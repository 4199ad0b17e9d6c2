//! `slot_lifecycle_budget`: the server's worst-case time for a lifecycle
//! operation, from which clients derive their read timeouts.

use serde::{Deserialize, Serialize};

/// The overhead margin applied to every budget (SLOTCFG-20).
pub const LIFECYCLE_OVERHEAD: f64 = 1.15;
/// The in-series eviction unloads a load's budget charges (SLOTCFG-20).
pub const BUDGET_EVICTION_UNLOADS: u32 = 3;

/// A lifecycle operation a client waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LifecycleOp {
    /// Load a slot.
    Load,
    /// Unload a slot.
    Unload,
    /// Restart a slot (unload, then load).
    Restart,
    /// Swap a slot's model (unload, then load).
    Swap,
}

/// The component budgets, in seconds, the caller's configuration supplies.
///
/// The seed does not give the component durations (SLOTCFG-20 Ambiguity), so
/// they are inputs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LifecycleBudgetInputs {
    /// The health poll's budget.
    pub health_poll_s: f64,
    /// The output-sanity gate's budget on the CPU lane (its widest).
    pub output_sanity_cpu_s: f64,
    /// One unload's budget.
    pub unload_s: f64,
}

/// The worst-case seconds `op` may take on the server.
///
/// # Behavior
///
/// Load: the health poll + the output-sanity CPU-lane budget + three
/// in-series eviction unloads (SLOTCFG-20). Unload: one unload. Restart and
/// swap: an unload plus a load (SLOTCFG-21). Every sum is multiplied by 1.15
/// (SLOTCFG-20; a pure multiplier, so per component or on the sum is the same).
/// Clients use it as their read timeout instead of a fixed number
/// (SLOTCFG-19). Negative or NaN inputs count as 0.
pub fn slot_lifecycle_budget(op: LifecycleOp, inputs: &LifecycleBudgetInputs) -> f64 {
    let nonneg = |s: f64| if s.is_nan() { 0.0 } else { s.max(0.0) };
    let unload = nonneg(inputs.unload_s);
    let load = nonneg(inputs.health_poll_s)
        + nonneg(inputs.output_sanity_cpu_s)
        + f64::from(BUDGET_EVICTION_UNLOADS) * unload;
    let raw = match op {
        LifecycleOp::Load => load,
        LifecycleOp::Unload => unload,
        LifecycleOp::Restart | LifecycleOp::Swap => unload + load,
    };
    raw * LIFECYCLE_OVERHEAD
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    // SLOTCFG-20 (a load's budget), SLOTCFG-21 (restart and swap)
    #[test]
    fn slotcfg_20_21_budgets() {
        let i = LifecycleBudgetInputs {
            health_poll_s: 120.0,
            output_sanity_cpu_s: 90.0,
            unload_s: 30.0,
        };
        // Load: (120 + 90 + 3*30) * 1.15 = 345
        assert!(close(slot_lifecycle_budget(LifecycleOp::Load, &i), 345.0));
        assert!(close(slot_lifecycle_budget(LifecycleOp::Unload, &i), 34.5));
        // Restart/swap: (30 + 300) * 1.15 = 379.5
        assert!(close(
            slot_lifecycle_budget(LifecycleOp::Restart, &i),
            379.5
        ));
        assert!(close(slot_lifecycle_budget(LifecycleOp::Swap, &i), 379.5));
        let bad = LifecycleBudgetInputs {
            health_poll_s: f64::NAN,
            output_sanity_cpu_s: -5.0,
            unload_s: 10.0,
        };
        assert!(close(slot_lifecycle_budget(LifecycleOp::Load, &bad), 34.5));
    }
}
