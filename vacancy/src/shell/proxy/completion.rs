//! The response body of synchronous work, which carries its [`Exchange`]
//! (ARCHITECTURE.md#the-request-path).
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
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Incoming, SizeHint};
use tracing::{info, warn};

use crate::config::OnBorrowerDisconnect;
use crate::shell::proxy::exchange::{Exchange, Observed};
use crate::shell::state::lender::Lender;
use crate::shell::state::live::{CutReason, CutSignal, cut_or_end, cut_reason};
use crate::shell::state::metrics::RequestPhase;
use crate::shell::upstream::forward::{BoxError, FramePoll};
use crate::traits::ObserveError;

/// A response body that releases its reservation on a proven clean end.
///
/// A reclaim may cut it (RECL-15): its upstream connection is closed at once
/// (see [`exchange_with_cut`](crate::shell::upstream::forward::exchange_with_cut)),
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
    /// The response head's arrival, until the first body byte is relayed
    /// (the `first_chunk` phase).
    first_chunk: Option<(Instant, Arc<Lender>)>,
}

type SharedGuard = Arc<Mutex<Option<Exchange>>>;

fn take(guard: &SharedGuard) -> Option<Exchange> {
    match guard.lock() {
        Ok(mut g) => g.take(),
        Err(p) => p.into_inner().take(),
    }
}

impl GuardedBody {
    /// Guard `inner` with its exchange; `cut` is the response's cut signal.
    pub fn new(inner: Incoming, guard: Exchange, cut: Option<CutSignal>) -> Self {
        let first_chunk = guard.head_at().map(|at| (at, Arc::clone(guard.lender())));
        let shared: SharedGuard = Arc::new(Mutex::new(Some(guard)));
        if let Some(signal) = cut.clone() {
            let watched = Arc::clone(&shared);
            tokio::spawn(async move {
                // Ends uncut when the entry is released (its signal dropped).
                if let Some(reason) = cut_or_end(signal).await
                    && let Some(guard) = take(&watched)
                {
                    info!(entry = %guard.entry(), upstream = %guard.route().name, reason = %reason, "proxied response cut by a reclaim");
                    verify_cut(guard, reason.to_string()).await;
                }
            });
        }
        GuardedBody {
            inner: Some(inner),
            guard: shared,
            cut,
            first_chunk,
        }
    }

    fn finish(&mut self, observed: Observed) {
        if let Some(g) = take(&self.guard) {
            g.finish(observed);
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
    fn cut_end(&mut self, reason: &CutReason) -> FramePoll {
        self.inner = None;
        Poll::Ready(Some(Err(reason.to_string().into())))
    }
}

impl Body for GuardedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> FramePoll {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = ready!(Pin::new(&mut *inner).poll_frame(cx));
        let cut = this.cut.as_ref().and_then(cut_reason);
        match (polled, cut) {
            (Some(Ok(frame)), None) => {
                if frame.data_ref().is_some_and(|d| !d.is_empty())
                    && let Some((head, lender)) = this.first_chunk.take()
                {
                    lender
                        .metrics()
                        .phase(RequestPhase::FirstChunk, head.elapsed());
                }
                if inner.is_end_stream() {
                    // The upstream's last byte is read: release before handing it on.
                    this.finish(Observed::Ended);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            // Bytes read before the cut are still the borrower's.
            (Some(Ok(frame)), Some(_)) if !inner.is_end_stream() => Poll::Ready(Some(Ok(frame))),
            (_, Some(reason)) => this.cut_end(&reason),
            (Some(Err(e)), None) => {
                this.finish(Observed::BrokeOff(e.to_string()));
                this.inner = None;
                Poll::Ready(Some(Err(Box::new(e))))
            }
            (None, None) => {
                this.finish(Observed::Ended);
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
        let route = Arc::clone(guard.route());
        match route.on_borrower_disconnect {
            OnBorrowerDisconnect::Drain => {
                info!(entry = %entry, upstream = %route.name, "borrower disconnected; reading the upstream reply to its end");
                let timeout = route.completion_timeout;
                handle.spawn(drain(inner, guard, timeout, self.cut.take()));
            }
            OnBorrowerDisconnect::Cut => {
                drop(inner); // closes the upstream connection
                info!(entry = %entry, upstream = %route.name, "borrower disconnected; upstream cut");
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
async fn drain(mut body: Incoming, exchange: Exchange, timeout: Duration, cut: Option<CutSignal>) {
    let read = async {
        while let Some(frame) = body.frame().await {
            frame?;
        }
        Ok::<(), hyper::Error>(())
    };
    let outcome = tokio::time::timeout(timeout, read).await;
    if let Some(reason) = cut.as_ref().and_then(cut_reason) {
        info!(entry = %exchange.entry(), upstream = %exchange.route().name, reason = %reason, "draining response cut by a reclaim");
        return verify_cut(exchange, reason.to_string()).await;
    }
    exchange.finish(match outcome {
        Ok(Ok(())) => Observed::Ended,
        Ok(Err(e)) => Observed::BrokeOff(format!("{e} (while draining)")),
        Err(_) => Observed::DrainTimedOut {
            bound_s: timeout.as_secs(),
        },
    });
}

/// After a cut, ask the adapter for proof of the stop until it comes or
/// `stop_proof_timeout_s` ends: the upstream notices a closed connection
/// only at its next write, which a loaded machine delays (issue 30). The
/// entry shows `verifying` meanwhile; without proof it is held (DONE-04).
/// An adapter that cannot prove a stop at all holds it at once.
pub(crate) async fn verify_cut(exchange: Exchange, why: String) {
    let stop_proven = stop_proven(&exchange).await;
    exchange.finish(Observed::Cut { why, stop_proven });
}

/// The longest pause between two requests for proof.
const PROOF_POLL_MAX: Duration = Duration::from_secs(1);

async fn stop_proven(exchange: &Exchange) -> bool {
    let (route, entry) = (exchange.route(), exchange.entry());
    let deadline = tokio::time::Instant::now() + route.stop_proof_timeout;
    let mut pause = Duration::from_millis(100);
    let mut verifying = false;
    let mut last_error = None;
    loop {
        match route.adapter.verify_stopped().await {
            Ok(true) => return true,
            Err(ObserveError::Unsupported) => return false,
            Ok(false) => {}
            Err(e) => {
                // No proof this time (a slow or unreadable reading); ask again.
                if last_error.is_none() {
                    info!(entry = %entry, upstream = %route.name, error = %e, "cannot read the upstream's proof that the cut job stopped yet; asking again");
                }
                last_error = Some(e);
            }
        }
        if !verifying {
            verifying = true;
            exchange.lender().start_verifying(entry);
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break;
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(PROOF_POLL_MAX);
    }
    let bound_s = route.stop_proof_timeout.as_secs();
    match last_error {
        Some(e) => {
            warn!(entry = %entry, upstream = %route.name, bound_s, error = %e, "no proof that the cut job stopped within stop_proof_timeout_s")
        }
        None => {
            warn!(entry = %entry, upstream = %route.name, bound_s, "the upstream still shows work within stop_proof_timeout_s after the cut")
        }
    }
    false
}
