//! Refusals: the machine-readable code, its one HTTP status, and the reason.

use std::fmt;
use std::time::Duration;

/// Every reason vacancyd refuses a borrowed request, each with exactly one HTTP status.
///
/// The code is what clients match on; it is rendered in every upstream dialect
/// (docs/operator-guide.md#refusals). `resource_busy` always carries `Retry-After: 2` (ADM-02).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RefusalCode {
    /// Another job holds a resource the request needs, or a fresh sample is still due (ADM-02, ADM-06).
    ResourceBusy,
    /// The owner is present, or presence is unknown, and the upstream is host-scoped (OWN-01).
    OwnerPresent,
    /// GPU pressure from the owner's own workload refuses new work.
    Pressure,
    /// The requirement does not fit above a resource's reserve (MEM-01).
    InsufficientMemory,
    /// The owner switched lending off.
    LendingPaused,
    /// The owner switched a resource off.
    ResourceDisabled,
    /// No trustworthy, recent capacity sample exists for a resource.
    CapacityUnknown,
    /// The request body is malformed.
    InvalidRequest,
    /// A ComfyUI submission that could never be queued (COMFY-07).
    InvalidSubmission,
    /// A request vacancyd cannot track to its end, e.g. a background Responses request (ROUTE-05).
    UnsupportedRequest,
    /// The request body is larger than vacancyd inspects.
    BodyTooLarge,
    /// A management, owner-data or unlisted read route (ROUTE-02, ROUTE-08).
    RouteForbidden,
    /// An unrecognized route with a method other than GET/HEAD (ROUTE-03).
    RouteNotSupported,
    /// The upstream server could not be reached; nothing was forwarded (DONE-02).
    UpstreamUnreachable,
    /// The reservation could not be recorded, so nothing was forwarded (REC-01).
    LedgerUnavailable,
    /// Outside the owner's lending hours (`[lending] hours`, issue 35); the
    /// refusal's `Retry-After` is the next opening.
    OutsideLendingHours,
    /// The machine runs on battery, or its power supply cannot be read, and
    /// the owner lends only on mains (`[owner] on_battery = "pause"`).
    OnBattery,
    /// A GPU is above its `max_temperature_c` (not yet back below
    /// `resume_below_c`) or `max_fan_percent`, or has no such reading.
    GpuTooHot,
    /// A GPU draws more than its `max_power_w`, or has no power reading.
    GpuPowerLimit,
    /// The request names no borrower the lender knows, while it lends to
    /// named borrowers only (issue 34); the daemon answers it 401.
    UnknownBorrower,
    /// The borrower spent a budget of reservation time for the period
    /// (issue 34); the refusal's `Retry-After` is the reset.
    QuotaExhausted,
    /// The borrower runs its `max_running` jobs, or has its `max_waiting`
    /// requests in line (issue 34).
    BorrowerLimit,
}

impl RefusalCode {
    /// Every code, for tables and tests.
    pub const ALL: [RefusalCode; 22] = [
        RefusalCode::ResourceBusy,
        RefusalCode::OwnerPresent,
        RefusalCode::Pressure,
        RefusalCode::InsufficientMemory,
        RefusalCode::LendingPaused,
        RefusalCode::ResourceDisabled,
        RefusalCode::CapacityUnknown,
        RefusalCode::InvalidRequest,
        RefusalCode::InvalidSubmission,
        RefusalCode::UnsupportedRequest,
        RefusalCode::BodyTooLarge,
        RefusalCode::RouteForbidden,
        RefusalCode::RouteNotSupported,
        RefusalCode::UpstreamUnreachable,
        RefusalCode::LedgerUnavailable,
        RefusalCode::OutsideLendingHours,
        RefusalCode::OnBattery,
        RefusalCode::GpuTooHot,
        RefusalCode::GpuPowerLimit,
        RefusalCode::UnknownBorrower,
        RefusalCode::QuotaExhausted,
        RefusalCode::BorrowerLimit,
    ];

    /// The stable machine-readable name, e.g. `resource_busy`.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalCode::ResourceBusy => "resource_busy",
            RefusalCode::OwnerPresent => "owner_present",
            RefusalCode::Pressure => "pressure",
            RefusalCode::InsufficientMemory => "insufficient_memory",
            RefusalCode::LendingPaused => "lending_paused",
            RefusalCode::ResourceDisabled => "resource_disabled",
            RefusalCode::CapacityUnknown => "capacity_unknown",
            RefusalCode::InvalidRequest => "invalid_request",
            RefusalCode::InvalidSubmission => "invalid_submission",
            RefusalCode::UnsupportedRequest => "unsupported_request",
            RefusalCode::BodyTooLarge => "body_too_large",
            RefusalCode::RouteForbidden => "route_forbidden",
            RefusalCode::RouteNotSupported => "route_not_supported",
            RefusalCode::UpstreamUnreachable => "upstream_unreachable",
            RefusalCode::LedgerUnavailable => "ledger_unavailable",
            RefusalCode::OutsideLendingHours => "outside_lending_hours",
            RefusalCode::OnBattery => "on_battery",
            RefusalCode::GpuTooHot => "gpu_too_hot",
            RefusalCode::GpuPowerLimit => "gpu_power_limit",
            RefusalCode::UnknownBorrower => "unknown_borrower",
            RefusalCode::QuotaExhausted => "quota_exhausted",
            RefusalCode::BorrowerLimit => "borrower_limit",
        }
    }

    /// The one HTTP status this code is answered with.
    pub fn http_status(self) -> u16 {
        match self {
            RefusalCode::ResourceBusy
            | RefusalCode::OwnerPresent
            | RefusalCode::Pressure
            | RefusalCode::InsufficientMemory
            | RefusalCode::LendingPaused
            | RefusalCode::ResourceDisabled
            | RefusalCode::CapacityUnknown => 503,
            RefusalCode::InvalidRequest
            | RefusalCode::InvalidSubmission
            | RefusalCode::UnsupportedRequest => 400,
            RefusalCode::BodyTooLarge => 413,
            RefusalCode::RouteForbidden => 403,
            RefusalCode::RouteNotSupported => 501,
            RefusalCode::UpstreamUnreachable => 502,
            RefusalCode::LedgerUnavailable
            | RefusalCode::OutsideLendingHours
            | RefusalCode::OnBattery
            | RefusalCode::GpuTooHot
            | RefusalCode::GpuPowerLimit => 503,
            RefusalCode::UnknownBorrower => 401,
            RefusalCode::QuotaExhausted | RefusalCode::BorrowerLimit => 429,
        }
    }

    /// The `Retry-After` this code carries, where retrying soon can help.
    ///
    /// # Behavior
    ///
    /// `resource_busy` is 2 s (ADM-02). Capacity and pressure refusals clear by
    /// themselves and suggest a later retry, as do a GPU's heat (30 s: it
    /// cools slowly) and power (10 s) limits; the owner's choices (presence,
    /// the lending and resource switches, the battery) and malformed requests
    /// carry none. `outside_lending_hours` carries none here: each such
    /// refusal carries its own, the next opening ([`Refusal::retry_after`]);
    /// so does `quota_exhausted`, the budget's reset. `borrower_limit` is
    /// 2 s, as a busy resource: one of the borrower's jobs may end soon.
    pub fn retry_after(self) -> Option<Duration> {
        match self {
            RefusalCode::ResourceBusy | RefusalCode::BorrowerLimit => Some(Duration::from_secs(2)),
            RefusalCode::CapacityUnknown | RefusalCode::LedgerUnavailable => {
                Some(Duration::from_secs(5))
            }
            RefusalCode::Pressure
            | RefusalCode::InsufficientMemory
            | RefusalCode::GpuPowerLimit => Some(Duration::from_secs(10)),
            RefusalCode::GpuTooHot => Some(Duration::from_secs(30)),
            _ => None,
        }
    }

    /// Whether a client's retry within seconds can succeed: exactly the codes
    /// with a `Retry-After`. Sent as `x-should-retry`, which the OpenAI and
    /// Anthropic SDKs honour, so they stop retrying a paused lender three
    /// times and keep retrying a busy one.
    pub fn should_retry(self) -> bool {
        self.retry_after().is_some()
    }

    /// Whether the refusal comes from this lender's own state — a job holds
    /// the resource, the owner is present, lending or a resource is switched
    /// off, pressure, memory, capacity, the ledger — so the same request may be
    /// admitted by another lender: exactly the 503 codes. The borrower's own
    /// faults (400, 403, 413, 501) would be refused anywhere, and
    /// `upstream_unreachable` may come after the upstream received the work.
    ///
    /// Sent as `vacancy-retry-elsewhere: true` only when, in addition, nothing
    /// of the request reached the upstream (docs/fleet.md).
    pub fn retry_elsewhere(self) -> bool {
        self.http_status() == 503
    }
}

impl fmt::Display for RefusalCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refusal: the code, a reason a person can act on, and the resource it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The machine-readable code.
    pub code: RefusalCode,
    /// Why, and what to do about it. Never contains prompts or credentials.
    pub reason: String,
    /// The resource the refusal is about, when it is about one.
    pub resource: Option<String>,
    /// When a retry can succeed, where this refusal knows it better than its
    /// code (the lending hours' next opening); `None`: the code's.
    pub retry_in: Option<Duration>,
}

impl Refusal {
    /// A refusal with a code and a reason.
    pub fn new(code: RefusalCode, reason: impl Into<String>) -> Self {
        Refusal {
            code,
            reason: reason.into(),
            resource: None,
            retry_in: None,
        }
    }

    /// The same refusal, naming the resource it concerns.
    pub fn on_resource(mut self, resource: &str) -> Self {
        self.resource = Some(resource.to_owned());
        self
    }

    /// The `Retry-After` to send with it: its own where it knows when a
    /// retry can succeed, else its code's.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_in.or(self.code.retry_after())
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_busy_is_503_with_retry_after_2() {
        // ADM-02
        assert_eq!(RefusalCode::ResourceBusy.http_status(), 503);
        assert_eq!(
            RefusalCode::ResourceBusy.retry_after(),
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn only_refusals_with_a_retry_after_say_a_retry_helps() {
        // Issue 14 item 9: x-should-retry is true exactly with Retry-After.
        for code in RefusalCode::ALL {
            assert_eq!(code.should_retry(), code.retry_after().is_some(), "{code}");
        }
        assert!(RefusalCode::ResourceBusy.should_retry());
        assert!(!RefusalCode::LendingPaused.should_retry());
        assert!(!RefusalCode::RouteNotSupported.should_retry());
        assert!(!RefusalCode::OwnerPresent.should_retry());
    }

    #[test]
    fn only_the_lenders_own_refusals_may_be_retried_elsewhere() {
        // Issue 21: a balancer retries exactly vacancyd's own 503s on another
        // lender; a 502 may follow a forwarded request and is never retried.
        for code in RefusalCode::ALL {
            assert_eq!(code.retry_elsewhere(), code.http_status() == 503, "{code}");
        }
        for code in [
            RefusalCode::ResourceBusy,
            RefusalCode::OwnerPresent,
            RefusalCode::LendingPaused,
            RefusalCode::Pressure,
            RefusalCode::InsufficientMemory,
        ] {
            assert!(code.retry_elsewhere(), "{code}");
        }
        assert!(!RefusalCode::UpstreamUnreachable.retry_elsewhere());
    }

    #[test]
    fn every_code_has_one_status_and_a_distinct_name() {
        let mut names: Vec<&str> = RefusalCode::ALL.iter().map(|c| c.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), RefusalCode::ALL.len());
        for code in RefusalCode::ALL {
            assert!(matches!(
                code.http_status(),
                400 | 401 | 403 | 413 | 429 | 501 | 502 | 503
            ));
            let json = serde_json::to_string(&code).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
        }
    }
}
