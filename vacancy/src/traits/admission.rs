//! The [`Admission`] trait: decides borrowed work.

use crate::engine::{
    Decision, Engine, EngineError, EngineStatus, EntryId, Release, ReleaseOutcome, WorkRequest,
};
use crate::time::Moment;

/// Decides borrowed work: admit, release, report.
///
/// The [`Engine`] is the reference implementation. A scheduler may wrap it to
/// add its own policy, but should delegate the rules to it so it decides with
/// exactly the daemon's rules.
///
/// Sans-IO: `now` is an argument and nothing blocks. [`Decision::Wait`] asks
/// the caller to retry when a fresh sample lands or at its deadline (ADM-06).
pub trait Admission {
    /// Decide a request.
    fn admit(&mut self, request: &WorkRequest, now: Moment) -> Decision;
    /// End a forwarding or tracking job with its outcome.
    fn release(
        &mut self,
        id: EntryId,
        outcome: ReleaseOutcome,
        now: Moment,
    ) -> Result<Release, EngineError>;
    /// A snapshot of resources, upstreams and work.
    fn status(&mut self, now: Moment) -> EngineStatus;
}

impl Admission for Engine {
    fn admit(&mut self, request: &WorkRequest, now: Moment) -> Decision {
        Engine::admit(self, request, now)
    }

    fn release(
        &mut self,
        id: EntryId,
        outcome: ReleaseOutcome,
        now: Moment,
    ) -> Result<Release, EngineError> {
        Engine::release(self, id, outcome, now)
    }

    fn status(&mut self, now: Moment) -> EngineStatus {
        Engine::status(self, now)
    }
}
