//! Everything the proxy needs to know about one lent upstream.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{Management, OnBorrowerDisconnect};
use crate::engine::UpstreamId;
use crate::shell::state::metrics::RouteSeries;
use crate::shell::upstream::pool;
use crate::shell::upstream::target::Target;
use crate::traits::Adapter;

/// Everything the proxy needs to know about one upstream.
pub struct UpstreamRoute {
    /// The upstream's name.
    pub name: String,
    /// Its handle in the engine.
    pub id: UpstreamId,
    /// Its dialect.
    pub adapter: Arc<dyn Adapter>,
    /// The real server.
    pub target: Target,
    /// Whether management routes are forwarded.
    pub management: Management,
    /// What happens when a borrower leaves mid-response.
    pub on_borrower_disconnect: OnBorrowerDisconnect,
    /// How long a drained or tracked job may take before it is held.
    pub completion_timeout: Duration,
    /// How long the upstream's proof that a cut job stopped is awaited
    /// before the entry is held (`stop_proof_timeout_s`, DONE-04).
    pub stop_proof_timeout: Duration,
    /// The largest work body inspected; larger ones get 413.
    pub max_body_bytes: usize,
    /// How long connecting to the upstream may take.
    pub connect_timeout: Duration,
    /// Whether responses carry `vacancy-overhead-ms` (`[server] overhead_header`).
    pub overhead_header: bool,
    /// How long an upgraded connection (a WebSocket) may carry nothing
    /// before it is closed (`[server] tunnel_idle_timeout_s`).
    pub tunnel_idle: Duration,
    /// The upstream's own credential (`[upstream.credential]`): with named
    /// borrowers on, a borrower's `Authorization` is its key to vacancyd and
    /// is taken off, so the upstream gets this in its place (issue 34).
    pub credential: Option<(http::HeaderName, http::HeaderValue)>,
    /// Keep-alive connections for what reserves nothing (discovery, reads,
    /// allowed management): [`pool::ReadPool`].
    pub reads: pool::ReadPool,
    /// Its requests' counters and timings, resolved at their first use
    /// (`RouteSeries::default()`).
    pub series: RouteSeries,
}

impl std::fmt::Debug for UpstreamRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamRoute")
            .field("name", &self.name)
            .field("adapter", &self.adapter.name())
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}
