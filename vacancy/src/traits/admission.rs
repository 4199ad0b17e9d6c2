//! The [`Admission`] trait: decides borrowed work.

use crate::engine::{
    Decision, Engine, EngineError, EngineStatus, EntryId, Release, ReleaseOutcome, WorkRequest,
};
use crate::time::Moment;

/// Decides borrowed work: admit, release, report.
///
/// The [`Engine`] is the reference implementation, with every rule. The trait
/// is the seam for code that decides work without the rest of the engine's
/// API: a scheduler that layers a policy of its own over the engine (refuse
/// what the owner does not lend, then let the engine decide with exactly
/// the daemon's rules), or a test that scripts the decisions. Code that
/// drives decisions should be written against `impl Admission`, so the
/// policy behind it can be wrapped or replaced; `examples/wrap_admission.rs`
/// does both (`cargo run -p vacancy --no-default-features --example
/// wrap_admission`).
///
/// The daemon's lender holds the [`Engine`] itself, not an `Admission`: it
/// also feeds it samples, presence, observations and the wait line, and
/// drains its effects, which this trait does not cover. A policy that the
/// daemon itself must run belongs in the engine's rules or in an adapter.
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
