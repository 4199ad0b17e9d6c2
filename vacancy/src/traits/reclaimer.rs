//! The [`Reclaimer`] trait: gets capacity back for the owner.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::engine::EntryId;

/// A one-shot right to cancel one item of borrowed work (RECL-24).
///
/// Two sides may learn of the same item at once: the reclaim that cancels at a
/// deadline, and the recorder of a submission reply that arrives late (RECL-23).
/// Both hold clones of one claim; only the side whose [`try_claim`](Self::try_claim)
/// returns `true` sends the cancellation, so each item is cancelled exactly once.
#[derive(Debug, Clone, Default)]
pub struct CancelClaim(Arc<AtomicBool>);

impl CancelClaim {
    /// A claim nobody has taken yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Take the claim. `true` exactly once across all clones.
    pub fn try_claim(&self) -> bool {
        !self.0.swap(true, Ordering::AcqRel)
    }

    /// Whether some side has taken it.
    pub fn is_claimed(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// One item of borrowed work to cancel at the upstream.
#[derive(Debug, Clone)]
pub struct CancelItem {
    /// The work entry.
    pub entry: EntryId,
    /// The upstream's own handle for it, when it has one (a ComfyUI prompt ID).
    /// `None` for work that only a reply under way knows about yet.
    pub upstream_ref: Option<String>,
    /// The shared one-shot claim (RECL-24).
    pub claim: CancelClaim,
}

/// What cancelling one item achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The upstream proves the item will never run or has ended: release it (RECL-17).
    Stopped(EntryId),
    /// A stop was requested; completion tracking releases it once the upstream
    /// proves the end (RECL-18), and for held work that no tracker follows,
    /// [`Reclaimer::ended_after_stop`].
    Requested(EntryId),
    /// The other side took the claim and cancels it (RECL-24).
    ClaimedElsewhere(EntryId),
    /// Closing the proxied response is this adapter's cancellation (RECL-15).
    ByClosingResponse(EntryId),
    /// Left running: the upstream cannot stop this item without risking work
    /// vacancy did not admit (RECL-26: a ComfyUI whose `/interrupt` stops
    /// whatever runs). The reservation stays; completion tracking releases it
    /// when the upstream proves the end.
    LeftRunning {
        /// The entry.
        entry: EntryId,
        /// Why it was not stopped.
        reason: String,
    },
    /// The cancellation failed: the reservation stays, and the reason is logged (RECL-21).
    Failed {
        /// The entry.
        entry: EntryId,
        /// Why, without prompt contents.
        reason: String,
    },
}

/// An upstream's answer to an unload request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnloadAck {
    /// The upstream acknowledged (RECL-48). Never proof of recovered memory or
    /// finished work (RECL-49, OBS-05): fresh samples decide that.
    Acknowledged {
        /// Models it reported unloading, when it reports a count.
        models: Option<u32>,
    },
}

/// Whether the upstream holds work that vacancy did not admit (RECL-34).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForeignWork {
    /// Only vacancy's own work, or nothing.
    None,
    /// Work vacancy did not admit is running or queued: skip the unload (RECL-37).
    Present,
    /// It cannot be told (RECL-38, RECL-39); the unload goes ahead with this reason logged.
    CannotTell(String),
}

/// A reclaim action that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReclaimError {
    /// The upstream could not be reached.
    #[error("upstream unreachable: {0}")]
    Unreachable(String),
    /// The upstream rejected the request or answered something malformed (RECL-47).
    #[error("upstream rejected the request: {0}")]
    Rejected(String),
    /// The request ran past its bound (RECL-27: up to 2 minutes).
    #[error("no answer within {0} s")]
    TimedOut(u64),
    /// The adapter cannot do this.
    #[error("not supported by this adapter: {0}")]
    Unsupported(String),
}

/// Gets capacity back: cancels borrowed work at the upstream, unloads models,
/// and lists work vacancy did not admit.
///
/// # Behavior
///
/// - `cancel` names only borrowed work (RECL-19) and cancels an item only after
///   winning its [`CancelClaim`] (RECL-24). It finishes by `deadline` or reports
///   the item as failed; a failure keeps the reservation (RECL-21).
/// - `unload` acts on the whole server (RECL-40); its acknowledgement never
///   clears a reservation (RECL-49).
/// - `foreign_work` defaults to "cannot tell", so adapters that cannot list an
///   upstream's work unload as before (RECL-39).
#[async_trait]
pub trait Reclaimer: Send + Sync {
    /// Cancel borrowed work at the upstream, by `deadline`.
    async fn cancel(&self, items: &[CancelItem], deadline: Instant) -> Vec<CancelOutcome>;

    /// Ask the upstream to unload its models.
    async fn unload(&self) -> Result<UnloadAck, ReclaimError>;

    /// After a stop was requested ([`CancelOutcome::Requested`]) for held
    /// work that no tracker follows (an entry restored after a restart,
    /// REC-02), wait up to `within` for the upstream's proof that the work
    /// it knows as `upstream_ref` ended: `true` is that proof (RECL-17,
    /// RECL-18). A stop that lands after RECL-28's window — a loaded machine
    /// — is then released by proof, not left for an administrator. The
    /// default proves nothing.
    async fn ended_after_stop(&self, upstream_ref: &str, within: Duration) -> bool {
        let _ = (upstream_ref, within);
        false
    }

    /// Whether the upstream holds work other than `own` (the upstream refs of
    /// vacancy's work on the same server, RECL-35).
    async fn foreign_work(&self, own: &[String]) -> Result<ForeignWork, ReclaimError> {
        let _ = own;
        Ok(ForeignWork::CannotTell(
            "this adapter cannot list the upstream's work".to_owned(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_item_is_claimed_exactly_once_across_threads() {
        // RECL-24
        for _ in 0..50 {
            let claim = CancelClaim::new();
            let winners: usize = std::thread::scope(|s| {
                let handles: Vec<_> = (0..4)
                    .map(|_| {
                        let c = claim.clone();
                        s.spawn(move || usize::from(c.try_claim()))
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
            });
            assert_eq!(winners, 1);
            assert!(claim.is_claimed());
        }
    }

    struct Closing;

    #[async_trait]
    impl Reclaimer for Closing {
        async fn cancel(&self, items: &[CancelItem], _deadline: Instant) -> Vec<CancelOutcome> {
            items
                .iter()
                .map(|i| {
                    if i.claim.try_claim() {
                        CancelOutcome::ByClosingResponse(i.entry)
                    } else {
                        CancelOutcome::ClaimedElsewhere(i.entry)
                    }
                })
                .collect()
        }
        async fn unload(&self) -> Result<UnloadAck, ReclaimError> {
            Err(ReclaimError::Unsupported("no unload".to_owned()))
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn default_foreign_work_cannot_tell_and_claims_are_honoured() {
        // RECL-39, RECL-24
        let r: Arc<dyn Reclaimer> = Arc::new(Closing);
        assert!(matches!(
            r.foreign_work(&[]).await,
            Ok(ForeignWork::CannotTell(_))
        ));
        let claim = CancelClaim::new();
        let item = CancelItem {
            entry: EntryId::from_u128(1),
            upstream_ref: None,
            claim: claim.clone(),
        };
        let first = r.cancel(std::slice::from_ref(&item), Instant::now()).await;
        let second = r.cancel(&[item], Instant::now()).await;
        assert_eq!(
            first,
            [CancelOutcome::ByClosingResponse(EntryId::from_u128(1))]
        );
        assert_eq!(
            second,
            [CancelOutcome::ClaimedElsewhere(EntryId::from_u128(1))]
        );
    }
}
