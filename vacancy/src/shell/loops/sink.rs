//! What the loops around the engine feed: the daemon's lender, or an engine
//! embedded in another program.

use std::sync::Arc;

use tokio::sync::Notify;

use crate::engine::OwnerPresence;
use crate::shell::state::lender::Lender;
use crate::traits::resource::{CapacitySample, SampleError};
use crate::{Moment, MonotonicClock};

/// What the sampling and presence loops feed: the daemon's [`Lender`], or an
/// engine embedded in another program (Python's `vacancy.Driver`), so both
/// run the same loops.
pub trait LoopSink: Send + Sync {
    /// The clock samples are stamped with.
    fn clock(&self) -> MonotonicClock;
    /// What a resource's sampling loop waits on besides its interval: pulled
    /// when a job on it ends (ADM-05).
    fn sample_trigger(&self, resource: &str) -> Option<Arc<Notify>>;
    /// A sampler's result, started at `started`; a failure makes the
    /// resource's capacity unknown until a later success.
    fn record_sample(
        &self,
        resource: &str,
        result: Result<CapacitySample, SampleError>,
        started: Moment,
    );
    /// What the presence backend said; returns whether it changed.
    fn set_owner(&self, presence: OwnerPresence) -> bool;
}

impl LoopSink for Lender {
    fn clock(&self) -> MonotonicClock {
        Lender::clock(self)
    }
    fn sample_trigger(&self, resource: &str) -> Option<Arc<Notify>> {
        Lender::sample_trigger(self, resource)
    }
    fn record_sample(
        &self,
        resource: &str,
        result: Result<CapacitySample, SampleError>,
        started: Moment,
    ) {
        Lender::record_sample(self, resource, result, started);
    }
    fn set_owner(&self, presence: OwnerPresence) -> bool {
        Lender::set_owner(self, presence) // a change wakes the reclaim loop (OWN-01)
    }
}
