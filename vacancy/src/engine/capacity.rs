//! What a resource is and one reading of its capacity: the engine's input
//! from the samplers (the [`Resource`](crate::traits::Resource) trait).

use crate::engine::terms::HeatReading;
use crate::time::Moment;

/// What a resource is. The kind decides which checks admission applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ResourceKind {
    /// A GPU: free memory is VRAM (plus GTT on AMD APUs).
    Gpu,
    /// System memory.
    Memory,
    /// Processor time: refuses new work while busy above a threshold (SCOPE-08).
    Cpu,
}

impl ResourceKind {
    /// The lowercase name used in configuration and status.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceKind::Gpu => "gpu",
            ResourceKind::Memory => "memory",
            ResourceKind::Cpu => "cpu",
        }
    }
}

/// One successful reading of a resource's capacity.
///
/// # Behavior
///
/// `taken_at` is the moment the reading *started*, so a sample that began
/// before a job ended never counts as taken after it (ADM-04). `busy_pct` is
/// set by CPU samplers only; memory and GPU samplers leave it `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacitySample {
    /// Free memory in MiB (for a CPU resource: free system memory).
    pub free_mib: u64,
    /// Total memory in MiB.
    pub total_mib: u64,
    /// For a CPU resource: how busy it was, in percent (0–100).
    pub busy_pct: Option<u8>,
    /// A GPU's temperature, power and fan, read with the sample where its
    /// heat and power limits need them (issue 35); empty otherwise.
    pub heat: HeatReading,
    /// When the reading started.
    pub taken_at: Moment,
}

impl CapacitySample {
    /// A memory or GPU sample.
    pub fn memory(free_mib: u64, total_mib: u64, taken_at: Moment) -> Self {
        CapacitySample {
            free_mib,
            total_mib,
            busy_pct: None,
            heat: HeatReading::default(),
            taken_at,
        }
    }

    /// The same sample with `heat` read beside it.
    pub fn with_heat(self, heat: HeatReading) -> Self {
        CapacitySample { heat, ..self }
    }
}
