//! The proxy's handles on work in flight, so a reclaim can reach it: the cut
//! of a proxied response (RECL-15), and the cancellation claim and reply
//! state of tracked submissions (RECL-23, RECL-24).

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

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

/// Whether (and why) a reclaim cut a proxied response: `None` until it does.
/// Every part of the exchange watches it — the upstream connection (closed at
/// once, whether or not the borrower reads), the response body and the drain
/// after a borrower left (which then ask the adapter for proof of the stop).
pub type CutSignal = watch::Receiver<Option<CutReason>>;

/// The reason a [`CutSignal`] carries, once cut.
pub fn cut_reason(signal: &CutSignal) -> Option<CutReason> {
    signal.borrow().clone()
}

/// Resolves when `signal` is cut; never, when it is dropped uncut.
pub async fn cut_happens(signal: CutSignal) -> CutReason {
    match cut_or_end(signal).await {
        Some(r) => r,
        None => std::future::pending().await, // the work ended uncut
    }
}

/// Resolves with the reason when `signal` is cut, or `None` once the work
/// ended uncut (its signal dropped).
pub async fn cut_or_end(mut signal: CutSignal) -> Option<CutReason> {
    match signal.wait_for(Option::is_some).await {
        Ok(r) => r.clone(),
        Err(_) => None,
    }
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
    cut: Option<watch::Sender<Option<CutReason>>>,
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

    /// Register sync work; the signal turns `Some` when a reclaim cuts it.
    pub fn register_response(&self, entry: EntryId, upstream: UpstreamId) -> CutSignal {
        let (tx, rx) = watch::channel(None);
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

    /// Cut a proxied response. `false` when it is not sync work in flight,
    /// or was cut already.
    pub fn cut(&self, entry: EntryId, reason: &CutReason) -> bool {
        let map = self.map();
        let Some(tx) = map.get(&entry).and_then(|l| l.cut.as_ref()) else {
            return false;
        };
        tx.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            *current = Some(reason.clone());
            true
        })
    }

    /// Whether the entry is sync work not cut yet (cancelled by closing its response).
    pub fn is_response(&self, entry: EntryId) -> bool {
        self.map()
            .get(&entry)
            .and_then(|l| l.cut.as_ref())
            .is_some_and(|tx| tx.borrow().is_none())
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
        assert_eq!(cut_reason(&rx), None);
        let why = CutReason {
            code: RefusalCode::OwnerPresent,
            reason: "owner returned".to_owned(),
        };
        assert!(live.cut(e, &why));
        assert!(!live.cut(e, &why));
        assert!(!live.is_response(e));
        assert_eq!(cut_happens(rx.clone()).await, why);
        assert_eq!(cut_reason(&rx), Some(why));
        // An uncut signal whose work ended never resolves.
        let e2 = EntryId::from_u128(9);
        let rx2 = live.register_response(e2, UpstreamId(0));
        live.forget(e2);
        let never =
            tokio::time::timeout(std::time::Duration::from_millis(20), cut_happens(rx2)).await;
        assert!(never.is_err());
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
