//! One borrower request from its arrival to its final answer: what the shell
//! knows of it before an admission makes it an `Exchange`
//! (`shell::proxy::exchange`; pingora's per-request context is the model),
//! and the one place it is counted.
//!
//! # Behavior
//!
//! - The request path notes the outcome where the answer becomes final, and
//!   the request is counted then, once: [`Arrival::admitted`] once the
//!   reservation is durable, [`Arrival::refused`] for a refusal before that,
//!   [`Arrival::forwarded`] for a read the upstream answered. The first
//!   outcome noted stands: a failure after an admission is the exchange's
//!   end, not a second outcome.
//! - A request dropped with no outcome — the borrower left and the
//!   connection dropped the request's future, e.g. while it waited in line —
//!   is counted `gone` when its arrival drops. The time to the response head
//!   is recorded then too, for a request that had one.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tracing::{debug, info};

use crate::engine::{Refusal, Reservation};
use crate::shell::state::lender::Lender;
use crate::shell::state::metrics::{ClassKey, RequestOutcome};
use crate::shell::upstream::route::UpstreamRoute;

/// One borrower request before and around its admission; counted once, by
/// its outcome, when that is final (`gone` if dropped without one).
pub struct Arrival {
    pub(crate) lender: Arc<Lender>,
    pub(crate) route: Arc<UpstreamRoute>,
    /// When the request's head arrived: tokio's instant, which is the
    /// engine clock's, so that a work request's engine time is read from
    /// it rather than from the clock once more (issue 31).
    pub(crate) at: Instant,
    /// The request's path and query, as the borrower sent it.
    pub(crate) path: http::uri::PathAndQuery,
    /// The route class, as the metrics count it.
    class: ClassKey,
    /// How long the request waited in its upstream's line, once decided.
    pub(crate) waited: Option<Duration>,
    /// Its place in line when it joined, 1 being next (issue 34).
    pub(crate) line_position: Option<u32>,
    /// Its borrower's name, with named borrowers on (issue 34).
    pub(crate) borrower: Option<Arc<str>>,
    /// How long the upstream had it before its response head came, for a
    /// request it answered: the rest of the time to the head is vacancyd's.
    pub(crate) upstream_took: Option<Duration>,
    outcome: Option<RequestOutcome>,
    /// The whole time to the response head and vacancyd's own part of it,
    /// once answered.
    timing: Option<(Duration, Duration)>,
}

impl Arrival {
    /// A request whose head arrived `at`, on `route`, in route class `class`.
    pub fn new(
        lender: Arc<Lender>,
        route: Arc<UpstreamRoute>,
        at: Instant,
        path: http::uri::PathAndQuery,
        class: ClassKey,
    ) -> Self {
        Self {
            lender,
            route,
            at,
            path,
            class,
            waited: None,
            line_position: None,
            borrower: None,
            upstream_took: None,
            outcome: None,
            timing: None,
        }
    }

    /// The reservation is durable: the request is admitted (its history
    /// entry and log line start here).
    pub fn admitted(&mut self, reservation: &Reservation) {
        if self.note(RequestOutcome::Admitted) {
            self.lender.history().job_started(reservation);
            info!(entry = %reservation.id, upstream = %self.route.name, model = reservation.model.as_deref().unwrap_or(""), resident_credit = reservation.resident_credit, borrower = self.borrower.as_deref().unwrap_or(""), "admitted");
        }
    }

    /// The request is refused with `refusal`, nothing forwarded.
    pub fn refused(&mut self, refusal: &Refusal) {
        if self.note(RequestOutcome::Refused(refusal.code)) {
            debug!(upstream = %self.route.name, code = %refusal.code, reason = %refusal.reason, borrower = self.borrower.as_deref().unwrap_or(""), "refused");
        }
    }

    /// A request that needs no reservation reached the upstream and has its
    /// answer.
    pub fn forwarded(&mut self) {
        self.note(RequestOutcome::Forwarded);
    }

    /// The response head is ready: `total` since arrival, `own` of it
    /// vacancyd's.
    pub fn answered(&mut self, total: Duration, own: Duration) {
        self.timing = Some((total, own));
    }

    /// Note and count `outcome` unless one stands already; whether it was
    /// noted.
    fn note(&mut self, outcome: RequestOutcome) -> bool {
        if self.outcome.is_some() {
            return false;
        }
        self.outcome = Some(outcome);
        let route = &*self.route;
        self.lender
            .metrics()
            .answered(&route.series, &route.name, self.class, outcome);
        true
    }
}

impl Drop for Arrival {
    fn drop(&mut self) {
        let (metrics, route) = (self.lender.metrics(), &*self.route);
        if self.outcome.is_none() {
            metrics.answered(&route.series, &route.name, self.class, RequestOutcome::Gone);
        }
        if let Some((total, own)) = self.timing {
            metrics.request(&route.series, &route.name, self.class, total, own);
        }
    }
}
