//! What the loops around the engine feed: the daemon's lender, or an engine
//! embedded in another program.

use std::sync::Arc;

use tokio::sync::Notify;

use crate::engine::OwnerPresence;
use crate::shell::state::lender::Lender;
pub use crate::shell::state::post_job::SampleRecorder;

/// What the sampling and presence loops feed: the daemon's [`Lender`], or an
/// engine embedded in another program (Python's `vacancy.Driver`), so both
/// run the same loops. Samples are recorded through its supertrait,
/// [`SampleRecorder`], which post-job samples use too.
pub trait LoopSink: SampleRecorder {
    /// What a resource's sampling loop waits on besides its interval: pulled
    /// when a job on it ends (ADM-05).
    fn sample_trigger(&self, resource: &str) -> Option<Arc<Notify>>;
    /// What the presence backend said; returns whether it changed.
    fn set_owner(&self, presence: OwnerPresence) -> bool;
}

impl LoopSink for Lender {
    fn sample_trigger(&self, resource: &str) -> Option<Arc<Notify>> {
        Lender::sample_trigger(self, resource)
    }
    fn set_owner(&self, presence: OwnerPresence) -> bool {
        Lender::set_owner(self, presence) // a change wakes the reclaim loop (OWN-01)
    }
}
