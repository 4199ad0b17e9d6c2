//! The [`Resource`] trait: something with capacity that borrowed work reserves.

use async_trait::async_trait;

use crate::time::Moment;

/// What a resource is. The kind decides which checks admission applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
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
            taken_at,
        }
    }
}

/// Why a resource could not be sampled. A failed sample is "capacity unknown":
/// the engine refuses work on that resource with `capacity_unknown`, never guesses.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    /// The source could not be read (file, sysfs, driver).
    #[error("cannot read {source_name}: {reason}")]
    Unreadable {
        /// What was read: a path, a device, a library.
        source_name: String,
        /// Why the read failed.
        reason: String,
    },
    /// The source answered something that is not a capacity reading.
    #[error("{source_name} holds no valid capacity reading: {reason}")]
    Malformed {
        /// What was read.
        source_name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The sampler is not available in this build or on this machine.
    #[error("sampler unavailable: {0}")]
    Unavailable(String),
}

/// Something with capacity: a GPU, system memory, the CPU.
///
/// Implementations are thin: they read a source and stamp the reading with the
/// moment it started. The engine decides what the number means.
///
/// # Behavior
///
/// - A failed read returns [`SampleError`], never a guessed number.
/// - `sample` may be called at any time, including right after a job ends
///   (ADM-05); it must not hold locks across unrelated I/O.
#[async_trait]
pub trait Resource: Send + Sync {
    /// The configured name of this resource (`[[resource]] name`).
    fn id(&self) -> &str;
    /// What kind of resource this is.
    fn kind(&self) -> ResourceKind;
    /// Read the current capacity.
    async fn sample(&self) -> Result<CapacitySample, SampleError>;
}
