//! The reservation guard that travels with a response body (DESIGN §8).
//!
//! The clean end of the upstream response releases the reservation, recorded
//! before the borrower's last byte is handed over. A broken-off response holds
//! it (DONE-03/04). Dropping the body early — the borrower went away — never
//! releases by itself: with `on_borrower_disconnect = "drain"` the upstream
//! reply is read to its end and then released; with `"cut"` the upstream
//! connection is closed and the reservation is held unless the adapter proves
//! the stop.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tracing::{info, warn};

use crate::config::OnBorrowerDisconnect;
use crate::engine::{EntryId, ReleaseOutcome};
use crate::proxy::UpstreamRoute;
use crate::proxy::forward::BoxError;
use crate::proxy::lender::Lender;
use crate::proxy::live::{CutReason, CutSignal, cut_or_end, cut_reason};

/// Owns one reservation until its end is proven.
pub struct CompletionGuard {
    lender: Arc<Lender>,
    route: Arc<UpstreamRoute>,
    entry: EntryId,
    forwarded: bool,
    finished: bool,
}

impl CompletionGuard {
    /// A guard for an admitted entry that has not been forwarded yet: dropped
    /// now, it releases, because nothing reached the upstream.
    pub fn new(lender: Arc<Lender>, route: Arc<UpstreamRoute>, entry: EntryId) -> Self {
        CompletionGuard {
            lender,
            route,
            entry,
            forwarded: false,
            finished: false,
        }
    }

    /// The request is about to leave for the upstream: from now on only a
    /// proven end releases it.
    pub fn forwarding(&mut self) {
        self.forwarded = true;
    }

    /// The entry it guards.
    pub fn entry(&self) -> EntryId {
        self.entry
    }

    /// The reply came and the adapter's tracker follows the job now (the
    /// engine's phase turns `tracking`); the guard still holds the entry if
    /// the tracking task ends without a verdict.
    pub fn tracking(&mut self) {
        if let Err(e) = self.lender.with_engine(|e| e.start_tracking(self.entry)) {
            warn!(entry = %self.entry, error = %e, "could not mark the entry as tracked");
        }
    }

    /// End the entry with `outcome`; later calls do nothing.
    pub fn finish(&mut self, outcome: ReleaseOutcome) {
        if !self.finished {
            self.finished = true;
            self.lender.release(self.entry, outcome);
        }
    }
}

impl Drop for CompletionGuard {
    fn drop(&mut self) {
        if self.forwarded {
            // Nothing proved the end: never release here.
            self.finish(ReleaseOutcome::Uncertain(
                "the proxy lost track of the exchange before its end".to_owned(),
            ));
        } else {
            self.finish(ReleaseOutcome::NotForwarded);
        }
    }
}

/// A response body that releases its reservation on a proven clean end.
///
/// A reclaim may cut it (RECL-15): its upstream connection is closed at once
/// (see [`exchange_with_cut`](crate::proxy::forward::exchange_with_cut)),
/// so the body ends early. An end — clean-looking or not — after a cut is
/// never a completion: the borrower's response ends with an error, and the
/// reservation is released only if the adapter proves the upstream stopped,
/// else held (DONE-04).
pub struct GuardedBody {
    inner: Option<Incoming>,
    /// Shared with the cut watcher, which settles the entry at a cut even
    /// while a stalled borrower leaves the body unpolled.
    guard: SharedGuard,
    cut: Option<CutSignal>,
}

type SharedGuard = Arc<Mutex<Option<CompletionGuard>>>;

fn take(guard: &SharedGuard) -> Option<CompletionGuard> {
    match guard.lock() {
        Ok(mut g) => g.take(),
        Err(p) => p.into_inner().take(),
    }
}

impl GuardedBody {
    /// Guard `inner` with `guard`; `cut` is the response's cut signal.
    pub fn new(inner: Incoming, guard: CompletionGuard, cut: Option<CutSignal>) -> Self {
        let shared: SharedGuard = Arc::new(Mutex::new(Some(guard)));
        if let Some(signal) = cut.clone() {
            let watched = Arc::clone(&shared);
            tokio::spawn(async move {
                // Ends uncut when the entry is released (its signal dropped).
                if let Some(reason) = cut_or_end(signal).await
                    && let Some(guard) = take(&watched)
                {
                    info!(entry = %guard.entry(), upstream = %guard.route.name, reason = %reason, "proxied response cut by a reclaim");
                    verify_cut(guard, reason.to_string()).await;
                }
            });
        }
        GuardedBody {
            inner: Some(inner),
            guard: shared,
            cut,
        }
    }

    fn finish(&mut self, outcome: ReleaseOutcome) {
        if let Some(mut g) = take(&self.guard) {
            g.finish(outcome);
        }
    }

    fn guarded(&self) -> bool {
        match self.guard.lock() {
            Ok(g) => g.is_some(),
            Err(p) => p.into_inner().is_some(),
        }
    }

    /// The body ended (or broke off) after a cut: the watcher settles the
    /// entry (proof of the stop, or held); the borrower gets an error.
    fn cut_end(&mut self, reason: &CutReason) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.inner = None;
        Poll::Ready(Some(Err(reason.to_string().into())))
    }
}

impl Body for GuardedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = ready!(Pin::new(&mut *inner).poll_frame(cx));
        let cut = this.cut.as_ref().and_then(cut_reason);
        match (polled, cut) {
            (Some(Ok(frame)), None) => {
                if inner.is_end_stream() {
                    // The upstream's last byte is read: release before handing it on.
                    this.finish(ReleaseOutcome::Completed);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            // Bytes read before the cut are still the borrower's.
            (Some(Ok(frame)), Some(_)) if !inner.is_end_stream() => Poll::Ready(Some(Ok(frame))),
            (_, Some(reason)) => this.cut_end(&reason),
            (Some(Err(e)), None) => {
                this.finish(ReleaseOutcome::Uncertain(format!(
                    "the upstream response broke off: {e}"
                )));
                this.inner = None;
                Poll::Ready(Some(Err(Box::new(e))))
            }
            (None, None) => {
                this.finish(ReleaseOutcome::Completed);
                this.inner = None;
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // While the guard is open, report "not ended" so the end is always polled
        // and the release recorded.
        !self.guarded() && self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}

impl Drop for GuardedBody {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        if self.cut.as_ref().and_then(cut_reason).is_some() {
            return; // the cut watcher settles the entry
        }
        let Some(guard) = take(&self.guard) else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return; // the guard's own drop holds the entry
        };
        let entry = guard.entry();
        match guard.route.on_borrower_disconnect {
            OnBorrowerDisconnect::Drain => {
                info!(entry = %entry, upstream = %guard.route.name, "borrower disconnected; reading the upstream reply to its end");
                let timeout = guard.route.completion_timeout;
                handle.spawn(drain(inner, guard, timeout, self.cut.take()));
            }
            OnBorrowerDisconnect::Cut => {
                drop(inner); // closes the upstream connection
                info!(entry = %entry, upstream = %guard.route.name, "borrower disconnected; upstream cut");
                handle.spawn(verify_cut(
                    guard,
                    "the borrower disconnected and the upstream was cut".to_owned(),
                ));
            }
        }
    }
}

/// Read the upstream reply of a borrower who left to its end, then release.
/// A reclaim's cut closes the upstream connection meanwhile; the end that
/// follows is no completion (RECL-15).
async fn drain(
    mut body: Incoming,
    mut guard: CompletionGuard,
    timeout: Duration,
    cut: Option<CutSignal>,
) {
    let read = async {
        while let Some(frame) = body.frame().await {
            frame?;
        }
        Ok::<(), hyper::Error>(())
    };
    let outcome = tokio::time::timeout(timeout, read).await;
    if let Some(reason) = cut.as_ref().and_then(cut_reason) {
        info!(entry = %guard.entry(), upstream = %guard.route.name, reason = %reason, "draining response cut by a reclaim");
        return verify_cut(guard, reason.to_string()).await;
    }
    let outcome = match outcome {
        Ok(Ok(())) => ReleaseOutcome::Completed,
        Ok(Err(e)) => {
            ReleaseOutcome::Uncertain(format!("the upstream reply broke off while draining: {e}"))
        }
        Err(_) => ReleaseOutcome::Uncertain(format!(
            "the upstream reply did not end within completion_timeout_s = {}",
            timeout.as_secs()
        )),
    };
    guard.finish(outcome);
}

/// After a cut, ask the adapter for proof of the stop a few times: the
/// upstream notices a closed connection only at its next write. Without
/// proof the entry is held (DONE-04).
pub(crate) async fn verify_cut(mut guard: CompletionGuard, why: String) {
    for attempt in 0..10u32 {
        tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt + 1).min(5))).await;
        match guard.route.adapter.verify_stopped().await {
            Ok(true) => {
                guard.finish(ReleaseOutcome::Completed);
                return;
            }
            Ok(false) => {}
            Err(e) => {
                warn!(entry = %guard.entry(), error = %e, "cannot verify the upstream stopped");
                break;
            }
        }
    }
    guard.finish(ReleaseOutcome::Uncertain(format!(
        "{why}, and the adapter could not prove the upstream stopped"
    )));
}
