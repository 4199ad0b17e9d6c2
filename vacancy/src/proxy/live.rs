//! The proxy's handles on work in flight, so a reclaim can reach it: the cut
//! of a proxied response (RECL-15), and the cancellation claim and reply
//! state of tracked submissions (RECL-23, RECL-24).

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::oneshot;

use crate::engine::{EntryId, RefusalCode, UpstreamId};
use crate::traits::CancelClaim;

/// Why a proxied response was cut, for the borrower and the logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutReason {
    /// `owner_present` or `pressure`: what the borrower is told.
    pub code: RefusalCode,
    /// The reclaim and its trigger.
    pub reason: String,
}

impl std::fmt::Display for CutReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

#[derive(Debug)]
struct Live {
    upstream: UpstreamId,
    /// Sync work: closing the proxied response is its cancellation.
    cut: Option<oneshot::Sender<CutReason>>,
    /// Tracked work: the one-shot right to cancel it at the upstream.
    claim: CancelClaim,
    /// Tracked work whose submission reply has not been recorded yet.
    reply_pending: bool,
    /// A reclaim wants it cancelled: a reply recorded later cancels it (RECL-23).
    cancel_wanted: Option<String>,
}

/// Work in flight, by entry.
#[derive(Debug, Default)]
pub struct LiveWork {
    entries: Mutex<HashMap<EntryId, Live>>,
}

impl LiveWork {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<EntryId, Live>> {
        match self.entries.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Register sync work; the receiver resolves when a reclaim cuts it.
    pub fn register_response(
        &self,
        entry: EntryId,
        upstream: UpstreamId,
    ) -> oneshot::Receiver<CutReason> {
        let (tx, rx) = oneshot::channel();
        self.map().insert(
            entry,
            Live {
                upstream,
                cut: Some(tx),
                claim: CancelClaim::new(),
                reply_pending: false,
                cancel_wanted: None,
            },
        );
        rx
    }

    /// Register a tracked submission whose reply is still to come.
    pub fn register_submission(&self, entry: EntryId, upstream: UpstreamId) -> CancelClaim {
        let claim = CancelClaim::new();
        self.map().insert(
            entry,
            Live {
                upstream,
                cut: None,
                claim: claim.clone(),
                reply_pending: true,
                cancel_wanted: None,
            },
        );
        claim
    }

    /// The submission's reply is recorded. `Some(reason)` when a reclaim asked
    /// to cancel it meanwhile: the recorder cancels it now (RECL-23).
    pub fn reply_recorded(&self, entry: EntryId) -> Option<String> {
        let mut map = self.map();
        let live = map.get_mut(&entry)?;
        live.reply_pending = false;
        live.cancel_wanted.clone()
    }

    /// Cut a proxied response. `false` when it is not sync work in flight.
    pub fn cut(&self, entry: EntryId, reason: &CutReason) -> bool {
        let tx = self.map().get_mut(&entry).and_then(|l| l.cut.take());
        tx.is_some_and(|tx| tx.send(reason.clone()).is_ok())
    }

    /// Whether the entry is sync work (cancelled by closing its response).
    pub fn is_response(&self, entry: EntryId) -> bool {
        self.map()
            .get(&entry)
            .is_some_and(|l| !l.reply_pending && l.cut.is_some())
    }

    /// Mark a tracked submission for cancellation and return its claim and
    /// whether its reply is still pending.
    pub fn want_cancel(&self, entry: EntryId, reason: &str) -> Option<(CancelClaim, bool)> {
        let mut map = self.map();
        let live = map.get_mut(&entry)?;
        live.cancel_wanted = Some(reason.to_owned());
        Some((live.claim.clone(), live.reply_pending))
    }

    /// Whether any of `entries` still awaits its submission reply.
    pub fn replies_pending(&self, entries: &[EntryId]) -> bool {
        let map = self.map();
        entries
            .iter()
            .any(|e| map.get(e).is_some_and(|l| l.reply_pending))
    }

    /// Whether work on any of `upstreams` still awaits its submission reply
    /// (RECL-38: then whose work the server holds cannot be told).
    pub fn replies_pending_on(&self, upstreams: &[UpstreamId]) -> bool {
        self.map()
            .values()
            .any(|l| l.reply_pending && upstreams.contains(&l.upstream))
    }

    /// The entry ended: forget it.
    pub fn forget(&self, entry: EntryId) {
        self.map().remove(&entry);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_cut_reaches_the_response_once() {
        // RECL-15
        let live = LiveWork::default();
        let e = EntryId::from_u128(1);
        let rx = live.register_response(e, UpstreamId(0));
        assert!(live.is_response(e));
        let why = CutReason {
            code: RefusalCode::OwnerPresent,
            reason: "owner returned".to_owned(),
        };
        assert!(live.cut(e, &why));
        assert!(!live.cut(e, &why));
        assert_eq!(rx.await.unwrap(), why);
    }

    #[test]
    fn a_late_reply_learns_that_a_reclaim_wanted_it_cancelled() {
        // RECL-23, RECL-38
        let live = LiveWork::default();
        let e = EntryId::from_u128(2);
        let claim = live.register_submission(e, UpstreamId(3));
        assert!(live.replies_pending(&[e]));
        assert!(live.replies_pending_on(&[UpstreamId(3)]));
        let (wanted, pending) = live.want_cancel(e, "drain deadline").unwrap();
        assert!(pending);
        assert_eq!(live.reply_recorded(e).as_deref(), Some("drain deadline"));
        assert!(!live.replies_pending(&[e]));
        // RECL-24: both sides share one claim.
        assert!(wanted.try_claim());
        assert!(!claim.try_claim());
        live.forget(e);
        assert!(live.reply_recorded(e).is_none());
    }
}
