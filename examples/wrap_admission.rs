//! An embedder's own admission policy, layered over vacancy's rules through
//! the [`Admission`] trait: a Python-free scheduler that lends only the
//! models its owner chose, and otherwise decides exactly as `vacancyd` does.
//!
//! The policy is generic over `A: Admission`, so it wraps the [`Engine`] (the
//! reference implementation, with every rule) or any other policy built the
//! same way; the code that drives it (`lend_one`) is written against the
//! trait alone. It links the crate with no features: no runtime, no IO.
//!
//! ```sh
//! cargo run -p vacancy --no-default-features --example wrap_admission
//! ```

use std::collections::BTreeSet;

use vacancy::engine::{
    CapacitySample, Decision, Engine, EngineError, EngineSpec, EngineStatus, EntryId,
    OwnerPresence, Refusal, RefusalCode, Release, ReleaseOutcome, ResourceSpec, UpstreamSpec,
    WorkRequest,
};
use vacancy::{Admission, Moment, ResourceKind};

/// Lends only the models in `allowed`; everything else is the inner policy's
/// decision. A refusal says what the borrower can do about it.
struct AllowedModels<A> {
    inner: A,
    allowed: BTreeSet<String>,
}

impl<A: Admission> Admission for AllowedModels<A> {
    fn admit(&mut self, request: &WorkRequest, now: Moment) -> Decision {
        match request.identity() {
            Some(model) if !self.allowed.contains(model) => {
                let lent: Vec<&str> = self.allowed.iter().map(String::as_str).collect();
                Decision::Refused(Refusal::new(
                    RefusalCode::InvalidRequest,
                    format!(
                        "model {model} is not lent on this machine; ask for one of: {}",
                        lent.join(", ")
                    ),
                ))
            }
            _ => self.inner.admit(request, now),
        }
    }

    fn release(
        &mut self,
        id: EntryId,
        outcome: ReleaseOutcome,
        now: Moment,
    ) -> Result<Release, EngineError> {
        self.inner.release(id, outcome, now)
    }

    fn status(&mut self, now: Moment) -> EngineStatus {
        self.inner.status(now)
    }
}

/// Decide one request and, when admitted, finish it: what a scheduler does
/// with any [`Admission`], knowing nothing of the policy behind it.
fn lend_one(policy: &mut impl Admission, request: &WorkRequest, now: Moment) -> Result<(), String> {
    match policy.admit(request, now) {
        Decision::Admitted(reservation) => {
            // ... forward the work; here it ends cleanly a second later.
            let done = now.after(std::time::Duration::from_secs(1));
            policy
                .release(reservation.id, ReleaseOutcome::Completed, done)
                .map_err(|e| e.to_string())?;
            Ok(())
        }
        Decision::Refused(refusal) | Decision::Reobserve(refusal) => {
            Err(format!("{}: {}", refusal.code, refusal.reason))
        }
        Decision::Wait { resources, .. } => Err(format!("wait for a sample of {resources:?}")),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec = EngineSpec {
        lending: true,
        resources: vec![ResourceSpec::new("gpu0", ResourceKind::Gpu, 1_000)],
        upstreams: vec![UpstreamSpec::new("llama", "gpu0", 4_000)],
    };
    let mut engine = Engine::new(spec)?;
    engine.set_owner(OwnerPresence::Away);
    let now = Moment::from_secs(10);
    engine.record_sample("gpu0", CapacitySample::memory(20_000, 24_000, now))?;
    let llama = engine.upstream_id("llama").ok_or("no upstream llama")?;

    let mut policy = AllowedModels {
        inner: engine,
        allowed: BTreeSet::from(["qwen2.5-7b".to_owned()]),
    };

    let lent = WorkRequest::new(llama, Some("qwen2.5-7b"), now);
    lend_one(&mut policy, &lent, now)?;
    println!("qwen2.5-7b: admitted and released");

    let other = WorkRequest::new(llama, Some("llama-3-70b"), now);
    let refused = lend_one(&mut policy, &other, now)
        .err()
        .ok_or("llama-3-70b was lent")?;
    println!("llama-3-70b: {refused}");
    assert!(refused.starts_with("invalid_request: model llama-3-70b is not lent"));

    // The engine's own rules still hold underneath: after a job, the next
    // one waits for a fresh capacity sample (ADM-06).
    let next = WorkRequest::new(llama, Some("qwen2.5-7b"), now);
    let waits = lend_one(&mut policy, &next, Moment::from_secs(12))
        .err()
        .ok_or("admitted without a post-job sample")?;
    println!("qwen2.5-7b again: {waits}");
    assert!(waits.contains("wait for a sample"), "{waits}");
    let status = policy.status(Moment::from_secs(12));
    assert!(status.work.is_empty(), "nothing left running");
    Ok(())
}
