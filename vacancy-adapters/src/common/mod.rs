//! What every adapter shares: its settings, the observation client, the
//! body checks every work request passes before anything is reserved, and
//! the route blocks several adapters serve ([`routes`]).

use std::fmt;
use std::time::Duration;

use vacancy::MonotonicClock;

mod body;
mod core;
mod inspect;
mod multipart;
mod observe;
pub mod routes;

#[cfg(test)]
pub(crate) mod testing;

pub use body::{BodyRule, content_type, inspect_request};
pub use core::AdapterCore;
pub(crate) use inspect::kind as inspect_kind;
pub use inspect::{RESPONSES_PATH, inspect_json_body, is_responses_path, request_path};
pub use multipart::{is_multipart_form, multipart_model};
pub(crate) use observe::chain as error_chain;
pub use observe::{FetchError, ObservationClient, StreamingResponse};

/// How an adapter reaches its upstream, for its own observation requests.
///
/// # Behavior
///
/// - `target` is the upstream's base URL as configured (`target = ...`); it may
///   carry a path prefix (`http://127.0.0.1:8080/llm`). Observation requests
///   join that prefix and the route (`/llm` + `/slots` = `/llm/slots`). The
///   borrower's own requests are never rewritten here: the daemon passes the
///   borrower's path as received and prepends the prefix when it forwards.
/// - `credential` is `[upstream.credential]`, sent only on observation and
///   tracking requests, never on borrowed ones; borrower credentials are
///   never used for observation (OBS-01, OBS-02). `Debug` redacts its value.
/// - `clock` is the daemon's clock, so an observation's `taken_at` is
///   comparable with the engine's moments (ADM-09, RES-20).
/// - `observe_timeout` bounds one observation request from connect to the
///   last byte of its answer (default 2 s).
#[derive(Clone)]
pub struct AdapterSettings {
    /// The upstream's base URL, possibly with a path prefix.
    pub target: http::Uri,
    /// The header vacancy sends on its own observation requests (OBS-02).
    pub credential: Option<(http::HeaderName, http::HeaderValue)>,
    /// The daemon's clock: observations are stamped with it.
    pub clock: MonotonicClock,
    /// The longest one observation request may take.
    pub observe_timeout: Duration,
}

impl AdapterSettings {
    /// The default bound on one observation request.
    ///
    /// # Behavior
    ///
    /// 2 s: an upstream slower than that is reported unreachable, so one
    /// observation (e.g. RES-20's observe-again on the refusal path) never
    /// holds a request up for longer.
    pub const DEFAULT_OBSERVE_TIMEOUT: Duration = Duration::from_secs(2);

    /// Settings for `target`, stamped with `clock`, without a credential and
    /// with the default observation timeout.
    ///
    /// Nothing is checked or connected here; a target the observation client
    /// cannot use is reported by each observation (`ObserveError::Unreachable`).
    pub fn new(target: http::Uri, clock: MonotonicClock) -> Self {
        AdapterSettings {
            target,
            credential: None,
            clock,
            observe_timeout: Self::DEFAULT_OBSERVE_TIMEOUT,
        }
    }

    /// The settings the daemon hands a factory: its target, its credential
    /// and its clock (the one observations must be stamped with).
    ///
    /// The default observation timeout; the credential, if any, stays marked
    /// sensitive.
    pub fn from_context(ctx: &vacancy::registry::AdapterContext<'_>) -> Self {
        let settings = AdapterSettings::new(ctx.target.clone(), ctx.clock);
        match &ctx.credential {
            Some((header, value)) => settings.with_credential(header.clone(), value.clone()),
            None => settings,
        }
    }

    /// The same settings with `[upstream.credential]`.
    ///
    /// The value is marked sensitive, so HTTP tooling that honours the flag
    /// never logs it (OBS-02).
    pub fn with_credential(
        mut self,
        header: http::HeaderName,
        mut value: http::HeaderValue,
    ) -> Self {
        value.set_sensitive(true);
        self.credential = Some((header, value));
        self
    }

    /// The same settings with another observation timeout.
    ///
    /// Bounds each observation request from connect to the last byte.
    pub fn with_observe_timeout(mut self, timeout: Duration) -> Self {
        self.observe_timeout = timeout;
        self
    }

    /// The target's path prefix without a trailing `/` (`""` when it has none).
    ///
    /// `http://h:p` and `http://h:p/` have the prefix `""`; `http://h:p/llm/`
    /// has `/llm`. Observation requests are sent to prefix + route.
    pub fn prefix(&self) -> &str {
        self.target.path().trim_end_matches('/')
    }
}

impl fmt::Debug for AdapterSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdapterSettings")
            .field("target", &self.target)
            .field("credential", &vacancy::registry::redacted(&self.credential))
            .field("clock", &self.clock)
            .field("observe_timeout", &self.observe_timeout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_prefix_drops_trailing_slashes() {
        let clock = MonotonicClock::new();
        let s = |t: &str| AdapterSettings::new(t.parse().unwrap(), clock);
        assert_eq!(s("http://127.0.0.1:8080").prefix(), "");
        assert_eq!(s("http://127.0.0.1:8080/").prefix(), "");
        assert_eq!(s("http://127.0.0.1:8080/llm").prefix(), "/llm");
        assert_eq!(s("http://127.0.0.1:8080/llm/").prefix(), "/llm");
        assert_eq!(s("http://h/a/b").prefix(), "/a/b");
    }

    #[test]
    fn debug_never_shows_the_credential() {
        // OBS-02: the credential is vacancy's; it never reaches a log line.
        let s = AdapterSettings::new("http://h".parse().unwrap(), MonotonicClock::new())
            .with_credential(
                http::header::AUTHORIZATION,
                http::HeaderValue::from_static("Bearer s3cret"),
            );
        let shown = format!("{s:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("authorization: <redacted>"), "{shown}");
        assert!(s.credential.as_ref().unwrap().1.is_sensitive());
        assert_eq!(s.observe_timeout, Duration::from_secs(2));
    }
}
