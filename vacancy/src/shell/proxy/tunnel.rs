//! Upgraded connections (WebSockets: ComfyUI's `/ws`, gated protocols):
//! bytes copied both ways after `101 Switching Protocols`.
//!
//! # Behavior
//!
//! - **Budget**: a tunnel keeps its borrower connection's permit
//!   ([`ConnectionPermit`]) until both of its sockets close, so tunnels count
//!   against the borrower budget (two descriptors each) as the connection did
//!   before the switch. While the budget is spent, new borrower connections
//!   wait in the kernel's backlog and the control plane keeps its own
//!   (issue 30 item 1).
//! - **Idle**: a tunnel that carries no byte either way for its idle timeout
//!   (`[server] tunnel_idle_timeout_s`) is closed on both sides. Traffic in
//!   either direction (a progress message, a ping) keeps it open however long
//!   it lives.
//! - **Completion**: a gated WebSocket has no completion guarantee, so its
//!   reservation is held after the close (ROUTE-10); a reclaim's cut closes
//!   both sides (RECL-15).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tracing::{debug, info};

use crate::shell::proxy::exchange::{Exchange, Observed};
use crate::shell::state::live::{CutSignal, cut_happens};

/// The place one borrower connection holds in its listener's budget,
/// shared by the connection and, after a protocol switch, its tunnel: the
/// place is given back when the last of them ends.
///
/// The listener puts a clone in every request's extensions.
#[derive(Debug, Clone)]
pub struct ConnectionPermit {
    /// Held, never read: dropping the last clone gives the place back.
    _held: Arc<OwnedSemaphorePermit>,
}

impl ConnectionPermit {
    /// The permit `permit`, to share.
    pub fn new(permit: OwnedSemaphorePermit) -> Self {
        ConnectionPermit {
            _held: Arc::new(permit),
        }
    }
}

/// The borrower's side of a protocol switch, taken from its request: the
/// connection once hyper hands it over, and its place in the budget.
#[derive(Debug, Default)]
pub struct BorrowerSide {
    upgrade: Option<OnUpgrade>,
    permit: Option<ConnectionPermit>,
}

impl BorrowerSide {
    /// Take the upgrade and the permit out of a borrower request's parts.
    pub fn take(parts: &mut http::request::Parts) -> Self {
        BorrowerSide {
            upgrade: parts.extensions.remove::<OnUpgrade>(),
            permit: parts.extensions.remove::<ConnectionPermit>(),
        }
    }
}

/// Copy bytes both ways between the borrower and the upstream until either
/// closes, nothing moves for `idle`, or a reclaim cuts it; then end the
/// exchange, if it is work (see the [module docs](self)).
pub(crate) async fn tunnel(
    borrower: BorrowerSide,
    upstream: OnUpgrade,
    exchange: Option<Exchange>,
    cut: Option<CutSignal>,
    idle: Duration,
) {
    // Held until the tunnel ends: both of its descriptors stay counted.
    let _permit = borrower.permit;
    let activity = Activity::new();
    let copy = async {
        let borrower = borrower
            .upgrade
            .ok_or("the borrower's connection cannot be upgraded")?
            .await?;
        let upstream = upstream.await?;
        let mut b = Watched::new(TokioIo::new(borrower), &activity);
        let mut u = Watched::new(TokioIo::new(upstream), &activity);
        tokio::io::copy_bidirectional(&mut b, &mut u).await?;
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    };
    let cut = async {
        match cut {
            Some(signal) => cut_happens(signal).await,
            None => std::future::pending().await,
        }
    };
    let result = tokio::select! {
        r = copy => r,
        reason = cut => {
            info!(reason = %reason, "gated WebSocket closed by a reclaim");
            Ok(())
        }
        () = activity.quiet_for(idle) => {
            debug!(idle_s = idle.as_secs(), "closing an upgraded connection that carried nothing for tunnel_idle_timeout_s");
            Ok(())
        }
    };
    if let Err(e) = &result {
        debug!(error = %e, "upgraded connection ended");
    }
    if let Some(x) = exchange {
        x.finish(Observed::TunnelClosed);
    }
}

/// When a tunnel last carried a byte, in milliseconds since it opened.
#[derive(Debug)]
struct Activity {
    opened: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            opened: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn note(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Resolves once nothing has moved for `idle`.
    async fn quiet_for(&self, idle: Duration) {
        loop {
            let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let Some(deadline) = last
                .checked_add(idle)
                .and_then(|d| self.opened.checked_add(d))
            else {
                // Past the clock's range: never.
                return std::future::pending().await;
            };
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// One side of a tunnel, noting every byte read from it (what one side
/// reads, the other is written).
struct Watched<'a, T> {
    inner: T,
    activity: &'a Activity,
}

impl<'a, T> Watched<'a, T> {
    fn new(inner: T, activity: &'a Activity) -> Self {
        Watched { inner, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<'_, T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.note();
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<'_, T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_tunnel_is_idle_only_when_nothing_moves() {
        let activity = Activity::new();
        let started = Instant::now();
        // Traffic every 4 s keeps a 5 s idle timeout from firing.
        let quiet = activity.quiet_for(Duration::from_secs(5));
        tokio::pin!(quiet);
        for _ in 0..5 {
            tokio::select! {
                () = &mut quiet => panic!("closed while bytes moved"),
                () = tokio::time::sleep(Duration::from_secs(4)) => activity.note(),
            }
        }
        quiet.await;
        assert_eq!(started.elapsed().as_secs(), 25);
        // An idle timeout past the clock's range never fires.
        let never = activity.quiet_for(Duration::MAX);
        assert!(
            tokio::time::timeout(Duration::from_secs(86_400 * 365), never)
                .await
                .is_err()
        );
    }
}
