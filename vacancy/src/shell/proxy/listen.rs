//! One upstream's borrower listener: accept within the connection budget,
//! serve each connection under its limits, and shut down with a grace period.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::shell::proxy::conn;
use crate::shell::proxy::service;
use crate::shell::proxy::tunnel::ConnectionPermit;
use crate::shell::state::lender::Lender;
use crate::shell::state::shutdown::stopped;
use crate::shell::state::workers::ProxyWorkers;
use crate::shell::upstream::route::UpstreamRoute;

/// How a listener treats its connections: their time limits and the budget
/// of open connections it shares with other listeners.
#[derive(Debug, Clone)]
pub struct Listening {
    /// Header, idle and body limits.
    pub limits: conn::ConnLimits,
    /// Connections the listeners of this group may hold open at once.
    pub budget: conn::ConnBudget,
    /// The worker threads connections are served on; `None`: the accepting
    /// runtime itself.
    pub workers: Option<Arc<ProxyWorkers>>,
}

impl Listening {
    /// The next connection on `listener`, once the budget has room for it:
    /// the permit that holds its place, the stream and the peer.
    pub async fn next_connection(
        &self,
        backoff: &mut conn::AcceptBackoff,
        listener: &TcpListener,
    ) -> (
        tokio::sync::OwnedSemaphorePermit,
        (tokio::net::TcpStream, std::net::SocketAddr),
    ) {
        let permit = self.budget.acquire().await;
        (permit, backoff.accept(listener).await)
    }
}

impl Default for Listening {
    fn default() -> Self {
        Listening {
            limits: conn::ConnLimits::default(),
            budget: conn::ConnBudget::new("borrower", 4096),
            workers: None,
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
        tokio::select! {
            (permit, (stream, peer)) = listening.next_connection(&mut backoff, &listener) => {
                let _ = stream.set_nodelay(true);
                let (lender, route, stop) = (Arc::clone(&lender), Arc::clone(&route), shutdown.clone());
                let limits = listening.limits;
                // Shared with a tunnel the connection may become (issue 30
                // item 1): the place in the budget ends with the last of them.
                let permit = ConnectionPermit::new(permit);
                let connection = async move |stream: tokio::net::TcpStream| {
                    // Its upstream side may stay in the read pool past the
                    // pool's idle bound while it is open.
                    let _counted = route.reads.borrower_connected();
                    let svc_route = Arc::clone(&route);
                    let handler = move |mut req: http::Request<conn::BorrowerBody>| {
                        // Only a request that can become a tunnel (hyper
                        // gave it an upgrade) carries the permit: put on
                        // every request, it cost each read an allocation
                        // (issue 31).
                        if req.extensions().get::<hyper::upgrade::OnUpgrade>().is_some() {
                            req.extensions_mut().insert(permit.clone());
                        }
                        let (lender, route) = (Arc::clone(&lender), Arc::clone(&svc_route));
                        service::handle(lender, route, req)
                    };
                    if let Err(e) = conn::serve_connection(stream, limits, handler, Some(stop)).await {
                        debug!(upstream = %route.name, %peer, error = %e, "borrower connection ended with an error");
                    }
                };
                match &listening.workers {
                    None => {
                        connections.spawn(connection(stream));
                    }
                    // The stream leaves this runtime's reactor and joins the worker's.
                    Some(workers) => match stream.into_std() {
                        Ok(stream) => {
                            connections.spawn_on(
                                async move {
                                    match tokio::net::TcpStream::from_std(stream) {
                                        Ok(stream) => connection(stream).await,
                                        Err(e) => debug!(%peer, error = %e, "cannot hand a borrower connection to a worker"),
                                    }
                                },
                                workers.next(),
                            );
                        }
                        Err(e) => debug!(%peer, error = %e, "cannot hand a borrower connection to a worker"),
                    },
                }
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
