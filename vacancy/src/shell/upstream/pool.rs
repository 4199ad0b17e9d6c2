//! Pooled upstream connections for requests that reserve nothing:
//! discovery, borrower reads and `management = "allow"` routes.
//!
//! # Behavior
//!
//! - A bounded keep-alive pool per upstream: at most [`MAX_IDLE`] idle
//!   connections, the most recently idle tried first, and one idle for
//!   [`IDLE`] closed when the pool is next used (or when the upstream closes
//!   it). A fresh connection per read was most of the gap to nginx on
//!   reads.
//! - With the proxy's worker threads (`shell::proxy::workers`), one pool per
//!   worker, sharing [`MAX_IDLE`] between them: a pooled connection is driven
//!   by the thread that made it, so a read served on another thread would
//!   wake it for every request.
//! - The pool is hyper's own connection handles (`SendRequest`), a list per
//!   worker: a connection goes back in once hyper says it is ready for the
//!   next request (its response read to the end), most recently used taken
//!   first. No pool key is hashed, no client is cloned and no absolute URI
//!   is built, which a general client's pool (hyper-util's, used before)
//!   does on every read (issue 31).
//! - Work never goes through the pool. DONE-02 releases a reservation when
//!   nothing reached the upstream, which a fresh connection proves (the
//!   connect failed); on a pooled connection a failure after the request was
//!   written could not be told from one before it, so work keeps its own
//!   connection (see `shell::upstream::forward`).
//! - A request on a pooled connection that the upstream closed while idle is
//!   tried on the next one, or a new one, when hyper hands it back unsent; an
//!   unreserved request holds nothing, so this can lend nothing twice.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use crate::shell::state::workers::current_worker;
use crate::shell::upstream::forward::{ExchangeError, ProxyBody};
use crate::shell::upstream::target::Target;

/// Connections kept per upstream.
pub const MAX_IDLE: usize = 32;
/// How long an unused pooled connection is kept (below the usual 60-75 s
/// keep-alive of upstream servers, so the pool closes first).
pub const IDLE: Duration = Duration::from_secs(30);

/// The keep-alive pools of one upstream: one off the worker threads, and one
/// per worker.
pub struct ReadPool {
    /// Index 0 off the workers, `1 + i` on worker `i`; shared with the
    /// tasks that put a connection back once its response is read.
    slots: Arc<[Mutex<Vec<Kept>>]>,
    connect_timeout: Duration,
    max_idle: usize,
}

/// An idle connection in the pool.
struct Kept {
    sender: SendRequest<ProxyBody>,
    /// When it went idle.
    since: Instant,
}

impl std::fmt::Debug for ReadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadPool")
            .field("pools", &self.slots.len())
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
    /// sharing [`MAX_IDLE`] connections (at least 4 each).
    pub fn per_worker(connect_timeout: Duration, workers: usize) -> Self {
        ReadPool {
            slots: (0..=workers).map(|_| Mutex::new(Vec::new())).collect(),
            connect_timeout,
            max_idle: (MAX_IDLE / workers.max(1)).max(4),
        }
    }

    /// The calling thread's pool.
    fn slot(&self) -> usize {
        current_worker()
            .map_or(0, |w| w + 1)
            .min(self.slots.len() - 1)
    }

    /// Send `request` (whose URI is the path, as the proxy's
    /// `forward::upstream_request` builds it, with its `Host`) to `target`
    /// on a pooled connection, or a new one.
    pub async fn send(
        &self,
        target: &Target,
        mut request: http::Request<ProxyBody>,
    ) -> Result<http::Response<Incoming>, ExchangeError> {
        let slot = self.slot();
        while let Some(mut sender) = self.checkout(slot) {
            match sender.try_send_request(request).await {
                Ok(resp) => {
                    self.checkin_when_ready(slot, sender);
                    return Ok(resp);
                }
                // Handed back unsent (the upstream closed the connection
                // while it was idle): the next connection takes it.
                Err(mut e) => match e.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(ExchangeError::AfterConnect(error_chain(e.error()))),
                },
            }
        }
        let mut sender = self.connect(target).await?;
        let resp = sender
            .send_request(request)
            .await
            .map_err(|e| ExchangeError::AfterConnect(error_chain(&e)))?;
        self.checkin_when_ready(slot, sender);
        Ok(resp)
    }

    /// The most recently idle connection ready for a request; closed ones
    /// and those idle for [`IDLE`] leave the pool.
    fn checkout(&self, slot: usize) -> Option<SendRequest<ProxyBody>> {
        let mut kept = lock(&self.slots[slot]);
        let now = Instant::now();
        kept.retain(|k| !k.sender.is_closed() && now.duration_since(k.since) < IDLE);
        let i = kept.iter().rposition(|k| k.sender.is_ready())?;
        Some(kept.remove(i).sender)
    }

    /// Put `sender` back once its response is read: at once when it is
    /// ready already (a response without a body), else from a task that
    /// waits for it on this thread. A connection that closes instead, or
    /// finds the pool full, is dropped.
    fn checkin_when_ready(&self, slot: usize, sender: SendRequest<ProxyBody>) {
        if sender.is_ready() {
            checkin(&self.slots[slot], self.max_idle, sender);
            return;
        }
        let (slots, max_idle) = (Arc::clone(&self.slots), self.max_idle);
        let mut sender = sender;
        tokio::spawn(async move {
            if sender.ready().await.is_ok() {
                checkin(&slots[slot], max_idle, sender);
            }
        });
    }

    /// A new connection to `target`, driven on this thread.
    async fn connect(&self, target: &Target) -> Result<SendRequest<ProxyBody>, ExchangeError> {
        let stream =
            target
                .connect(self.connect_timeout)
                .await
                .map_err(|e| ExchangeError::Connect {
                    address: target.address(),
                    reason: e.to_string(),
                })?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ExchangeError::AfterConnect(error_chain(&e)))?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "pooled upstream connection ended with an error");
            }
        });
        Ok(sender)
    }
}

/// Keep an idle `sender` unless `max_idle` are kept already.
fn checkin(kept: &Mutex<Vec<Kept>>, max_idle: usize, sender: SendRequest<ProxyBody>) {
    let mut kept = lock(kept);
    if kept.len() < max_idle {
        kept.push(Kept {
            sender,
            since: Instant::now(),
        });
    }
}

/// A pool's list. A panic while it was held leaves it whole (every change
/// is one push, remove or retain): the pool goes on.
fn lock(kept: &Mutex<Vec<Kept>>) -> MutexGuard<'_, Vec<Kept>> {
    match kept.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
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
