//! Pooled upstream connections for requests that reserve nothing:
//! discovery, borrower reads and `management = "allow"` routes.
//!
//! # Behavior
//!
//! - A bounded keep-alive pool per upstream (hyper-util's pooled client):
//!   at most [`MAX_IDLE`] idle connections, each closed after [`IDLE`].
//!   A fresh connection per read was most of the gap to nginx on reads.
//! - With the proxy's worker threads (`shell::proxy::workers`), one pool per
//!   worker, sharing [`MAX_IDLE`] between them: a pooled connection is driven
//!   by the thread that made it, so a read served on another thread would
//!   wake it for every request.
//! - Work never goes through the pool. DONE-02 releases a reservation when
//!   nothing reached the upstream, which a fresh connection proves (the
//!   connect failed); on a pooled connection a failure after the request was
//!   written could not be told from one before it, so work keeps its own
//!   connection (see `shell::upstream::forward`).
//! - A request on a pooled connection that the upstream closed while idle is
//!   retried once on a new one when hyper says it was never sent; an
//!   unreserved request holds nothing, so this can lend nothing twice.

use std::sync::OnceLock;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::shell::state::workers::current_worker;
use crate::shell::upstream::forward::{ExchangeError, ProxyBody};
use crate::shell::upstream::target::Target;

/// Idle connections kept per upstream.
pub const MAX_IDLE: usize = 32;
/// How long an idle pooled connection is kept (below the usual 60-75 s
/// keep-alive of upstream servers, so the pool closes first).
pub const IDLE: Duration = Duration::from_secs(30);

/// The keep-alive pools of one upstream: one off the worker threads, and one
/// per worker.
pub struct ReadPool {
    /// Made at first use: index 0 off the workers, `1 + i` on worker `i`.
    clients: Box<[OnceLock<Client<HttpConnector, ProxyBody>>]>,
    connect_timeout: Duration,
    max_idle: usize,
}

impl std::fmt::Debug for ReadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadPool")
            .field("pools", &self.clients.len())
            .field("max_idle", &self.max_idle)
            .finish_non_exhaustive()
    }
}

impl ReadPool {
    /// One pool whose new connections must be made within `connect_timeout`.
    pub fn new(connect_timeout: Duration) -> Self {
        Self::per_worker(connect_timeout, 0)
    }

    /// A pool for each of `workers` proxy workers and one for the rest,
    /// sharing [`MAX_IDLE`] idle connections (at least 4 each).
    pub fn per_worker(connect_timeout: Duration, workers: usize) -> Self {
        ReadPool {
            clients: (0..=workers).map(|_| OnceLock::new()).collect(),
            connect_timeout,
            max_idle: (MAX_IDLE / workers.max(1)).max(4),
        }
    }

    /// The pool of the calling thread.
    fn client(&self) -> &Client<HttpConnector, ProxyBody> {
        let i = current_worker()
            .map_or(0, |w| w + 1)
            .min(self.clients.len() - 1);
        self.clients[i].get_or_init(|| {
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            connector.set_connect_timeout(Some(self.connect_timeout));
            connector.enforce_http(true);
            Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(self.max_idle)
                .pool_idle_timeout(IDLE)
                .pool_timer(TokioTimer::new())
                .retry_canceled_requests(true)
                .build(connector)
        })
    }

    /// Send `request` (whose URI is the path, as the proxy's
    /// `forward::upstream_request` builds it) to `target` on a pooled connection.
    pub async fn send(
        &self,
        target: &Target,
        mut request: http::Request<ProxyBody>,
    ) -> Result<http::Response<Incoming>, ExchangeError> {
        // The resolved address, not the name: the connector then looks
        // nothing up (the request's Host header names the target already).
        let authority = target
            .socket_authority()
            .await
            .map_err(|e| ExchangeError::Connect {
                address: target.address(),
                reason: e.to_string(),
            })?;
        let mut uri = std::mem::take(request.uri_mut()).into_parts();
        uri.scheme = Some(http::uri::Scheme::HTTP);
        uri.authority = Some(authority);
        if uri.path_and_query.is_none() {
            uri.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        }
        *request.uri_mut() = http::Uri::from_parts(uri).map_err(|e| ExchangeError::Connect {
            address: target.address(),
            reason: format!("cannot form the upstream URL: {e}"),
        })?;
        match self.client().request(request).await {
            Ok(resp) => Ok(resp),
            Err(e) if e.is_connect() => {
                // The name may have moved: the next request uses a fresh lookup.
                let _ = target.resolve().await;
                Err(ExchangeError::Connect {
                    address: target.address(),
                    reason: error_chain(&e),
                })
            }
            Err(e) => Err(ExchangeError::AfterConnect(error_chain(&e))),
        }
    }
}

/// An error and its sources, as one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}
