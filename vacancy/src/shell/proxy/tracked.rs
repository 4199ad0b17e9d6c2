//! Tracked work (COMFY-01): the submission reply only says the job was
//! queued, so it is read whole (bounded), handed to the borrower, and the
//! adapter's [`Tracker`](crate::traits::Tracker) follows the job until its
//! end is proven. The exchange runs apart from the borrower's connection
//! (COMFY-08): a borrower who leaves changes nothing.

use async_trait::async_trait;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use std::sync::Arc;
use tracing::{info, warn};

use crate::engine::{EntryId, Refusal, RefusalCode};
use crate::shell::loops::reclaim::cancel_late_reply;
use crate::shell::proxy::answer::refusal_response;
use crate::shell::proxy::exchange::{Exchange, Observed};
use crate::shell::state::lender::Lender;
use crate::shell::upstream::forward::{
    self, ExchangeError, ProxyBody, full, prepare_response_head,
};
use crate::shell::upstream::route::UpstreamRoute;
use crate::time::Moment;
use crate::traits::{CancelClaim, Submission, TrackedEnd, TrackedWork, TrackingEvents};

/// The most of a submission reply read: a larger one cannot be used (COMFY-09).
pub const REPLY_LIMIT: usize = 4 * 1024 * 1024;

/// What the proxy learned from one submission exchange, and what the
/// borrower gets.
pub(crate) struct Exchanged {
    pub submission: Submission,
    pub response: http::Response<ProxyBody>,
}

/// Read a submission's reply whole within `REPLY_LIMIT`, or say why it
/// cannot be used. The borrower gets the reply as the upstream sent it.
pub(crate) async fn read_reply(
    route: &UpstreamRoute,
    assigned: &str,
    result: Result<http::Response<Incoming>, ExchangeError>,
) -> Exchanged {
    let unusable = |submission: Submission, why: &str| Exchanged {
        response: refusal_response(
            route,
            &Refusal::new(
                RefusalCode::UpstreamUnreachable,
                format!(
                    "upstream {}: {why}; the work was sent and is followed as {assigned} until the upstream proves its end",
                    route.name
                ),
            ),
            false,
        ),
        submission,
    };
    let resp = match result {
        Ok(resp) => resp,
        Err(e) => {
            return unusable(Submission::Lost(e.to_string()), e.borrower_words());
        }
    };
    let (mut parts, body) = resp.into_parts();
    match Limited::new(body, REPLY_LIMIT).collect().await {
        Ok(collected) => {
            let body = collected.to_bytes();
            prepare_response_head(&mut parts);
            Exchanged {
                submission: Submission::Reply {
                    status: parts.status.as_u16(),
                    body: body.clone(),
                },
                response: http::Response::from_parts(parts, full(body)),
            }
        }
        Err(e) => {
            let why = if e.is::<http_body_util::LengthLimitError>() {
                format!("the reply is larger than {} MiB", REPLY_LIMIT >> 20)
            } else {
                format!("the reply broke off: {e}")
            };
            unusable(Submission::Broken(why.clone()), &why)
        }
    }
}

/// Follow tracked work to its end on a task of its own; its exchange releases
/// or holds it with the tracker's verdict.
fn follow(
    mut exchange: Exchange,
    assigned: String,
    admitted_at: Moment,
    submission: Submission,
    claim: CancelClaim,
) {
    let (lender, route) = (Arc::clone(exchange.lender()), Arc::clone(exchange.route()));
    let entry = exchange.entry();
    exchange.tracking();
    tokio::spawn(async move {
        let Some(tracker) = route.adapter.tracker() else {
            exchange.finish(Observed::Tracked(TrackedEnd::Held(format!(
                "the {} adapter cannot track work after its reply",
                route.adapter.name()
            ))));
            return;
        };
        let events = Events {
            lender: Arc::clone(&lender),
            route: Arc::clone(&route),
            entry,
            assigned: assigned.clone(),
            claim,
        };
        let work = TrackedWork {
            entry,
            assigned_ref: assigned,
            admitted_at,
        };
        let end = tracker.track(work, submission, &events).await;
        if let TrackedEnd::Released(why) = &end {
            info!(entry = %entry, upstream = %route.name, reason = %why, "tracked work ended");
        }
        exchange.finish(Observed::Tracked(end));
    });
}

/// The whole tracked exchange: send, read the reply within
/// `completion_timeout_s` (else hold, COMFY-11), hand the job to the tracker,
/// and answer the borrower.
pub(crate) async fn exchange_tracked(
    exchange: Exchange,
    request: http::Request<ProxyBody>,
    assigned: String,
    admitted_at: Moment,
) -> forward::Answer {
    let (lender, route) = (Arc::clone(exchange.lender()), Arc::clone(exchange.route()));
    let bound = route.completion_timeout;
    let entry = exchange.entry();
    let claim = lender.live().register_submission(entry, route.id);
    let sent = std::time::Instant::now();
    let exchanged = tokio::time::timeout(bound, async {
        match forward::exchange(&route.target, request, route.connect_timeout).await {
            Err(e @ ExchangeError::Connect { .. }) => Err(e),
            other => Ok(read_reply(&route, &assigned, other).await),
        }
    })
    .await;
    match exchanged {
        Ok(Ok(ex)) => {
            follow(exchange, assigned, admitted_at, ex.submission, claim);
            forward::Answer {
                response: ex.response,
                upstream_took: Some(sent.elapsed()),
            }
        }
        Ok(Err(e)) => {
            // DONE-02: nothing reached the upstream.
            exchange.finish(Observed::ConnectFailed(e.to_string()));
            warn!(upstream = %route.name, error = %e, "upstream exchange failed");
            refusal_response(
                &route,
                &Refusal::new(
                    RefusalCode::UpstreamUnreachable,
                    format!("upstream {}: {}", route.name, e.borrower_words()),
                ),
                false,
            )
            .into()
        }
        Err(_) => {
            let why = format!(
                "no submission reply within completion_timeout_s ({} s); the work may still run as {assigned}",
                bound.as_secs()
            );
            exchange.finish(Observed::ReplyTimedOut(why.clone()));
            refusal_response(
                &route,
                &Refusal::new(
                    RefusalCode::UpstreamUnreachable,
                    format!("upstream {}: {why}", route.name),
                ),
                false,
            )
            .into()
        }
    }
}

struct Events {
    lender: Arc<Lender>,
    route: Arc<UpstreamRoute>,
    entry: EntryId,
    assigned: String,
    claim: CancelClaim,
}

#[async_trait]
impl TrackingEvents for Events {
    async fn upstream_ref(&self, upstream_ref: &str) {
        let entry = self.entry;
        if let Err(e) = self.lender.set_upstream_ref(entry, upstream_ref).await {
            // REC-06: tracking goes on with the upstream's handle.
            warn!(entry = %entry, upstream = %self.route.name, assigned_ref = %self.assigned, upstream_ref, error = %e, "could not rewrite the record with the upstream's handle; tracking it anyway");
        }
    }

    async fn following(&self, _upstream_ref: &str) {
        // The reclaim may name the work from now on; if one wanted it
        // cancelled while its reply was under way, cancel it now (RECL-23/24).
        if self.lender.live().reply_recorded(self.entry).is_some() {
            tokio::spawn(cancel_late_reply(
                Arc::clone(&self.lender),
                Arc::clone(&self.route),
                self.entry,
                self.claim.clone(),
            ));
        }
    }
}
