//! The [`Resource`] trait: something with capacity that borrowed work reserves.

use async_trait::async_trait;

pub use crate::engine::{CapacitySample, ResourceKind};

/// Why a resource could not be sampled. A failed sample is "capacity unknown":
/// the engine refuses work on that resource with `capacity_unknown`, never guesses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
