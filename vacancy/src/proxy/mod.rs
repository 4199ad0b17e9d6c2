//! The proxy: one listener per upstream, generic over `dyn Adapter`, plus the
//! async shells that feed the engine (sampling, observation, presence).
//!
//! # Behavior
//!
//! - Work is classified, inspected within a size bound, admitted (waiting up to
//!   4 s for a post-job sample, ADM-06), persisted (REC-01), then forwarded
//!   with its body streamed back chunk by chunk, never buffered.
//! - A refused or failed connection releases (DONE-02); a failure after the
//!   connection is established, or a response that breaks off, holds
//!   (DONE-03/04); the clean end releases (DONE-01).
//! - Everything else is forwarded without a reservation, or refused per
//!   [`route_policy`](crate::traits::route_policy).

pub mod completion;
pub mod conn;
pub mod forward;
pub mod history;
pub mod lender;
pub mod live;
pub mod metrics;
pub mod origin;
pub mod pool;
pub mod pressure;
pub mod reclaim;
pub mod service;
pub mod shells;
pub mod store;
pub mod tracked;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::config::{Management, OnBorrowerDisconnect};
use crate::engine::UpstreamId;
use crate::traits::Adapter;
pub use forward::{ProxyBody, Target};
pub use lender::{Admission, HeldReleaseError, Lender};
pub use store::{ReservationStore, StoreChange, StoreError, StoreWrite, VolatileStore};

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
    /// The largest work body inspected; larger ones get 413.
    pub max_body_bytes: usize,
    /// How long connecting to the upstream may take.
    pub connect_timeout: Duration,
    /// Keep-alive connections for what reserves nothing (discovery, reads,
    /// allowed management): [`pool::ReadPool`].
    pub reads: pool::ReadPool,
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

/// How a listener treats its connections: their time limits and the budget
/// of open connections it shares with other listeners.
#[derive(Debug, Clone)]
pub struct Listening {
    /// Header, idle and body limits.
    pub limits: conn::ConnLimits,
    /// Connections the listeners of this group may hold open at once.
    pub budget: conn::ConnBudget,
}

impl Default for Listening {
    fn default() -> Self {
        Listening {
            limits: conn::ConnLimits::default(),
            budget: conn::ConnBudget::new("borrower", 4096),
        }
    }
}

/// Serve borrowers on `listener` until `shutdown` turns true; then stop
/// accepting, let open exchanges finish within `grace`, and return.
pub async fn serve(
    listener: TcpListener,
    lender: Arc<Lender>,
    route: Arc<UpstreamRoute>,
    listening: Listening,
    mut shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    let mut connections = JoinSet::new();
    let mut backoff = conn::AcceptBackoff::new(format!("upstream {}", route.name));
    loop {
        let next = async {
            let permit = listening.budget.acquire().await;
            (permit, backoff.accept(&listener).await)
        };
        tokio::select! {
            (permit, (stream, peer)) = next => {
                let _ = stream.set_nodelay(true);
                let (lender, route, stop) = (Arc::clone(&lender), Arc::clone(&route), shutdown.clone());
                let limits = listening.limits;
                connections.spawn(async move {
                    let _permit = permit;
                    let svc_route = Arc::clone(&route);
                    let handler = move |req| {
                        let (lender, route) = (Arc::clone(&lender), Arc::clone(&svc_route));
                        service::handle(lender, route, req)
                    };
                    if let Err(e) = conn::serve_connection(stream, limits, handler, Some(stop)).await {
                        debug!(upstream = %route.name, %peer, error = %e, "borrower connection ended with an error");
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = stopped(&mut shutdown) => break,
        }
    }
    drop(listener);
    info!(upstream = %route.name, open = connections.len(), "listener closed; letting open exchanges finish");
    if tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        warn!(upstream = %route.name, open = connections.len(), "exchanges still open after the shutdown grace period; closing them (their work stays held)");
        connections.abort_all();
    }
}

/// Resolves once `shutdown` turns true (or its sender is gone).
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}
