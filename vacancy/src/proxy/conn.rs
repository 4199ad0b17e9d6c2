//! Borrower and control connections: slow and idle ones are timed out, a
//! failing `accept` backs off, and connections stay within a descriptor budget
//! so that the control plane answers while borrowers exhaust theirs.
//!
//! # Behavior
//!
//! - **Header read**: a request head must arrive whole within
//!   [`ConnLimits::header`] of its first byte; else the connection is closed
//!   (slowloris).
//! - **Idle keep-alive**: a connection with no request in flight and no byte of
//!   a new one is closed after [`ConnLimits::idle`]. A response being streamed
//!   — however long a generation takes — is never idle.
//! - **Body progress**: a request body gets [`ConnLimits::body`] from its
//!   first poll plus one second for every [`ConnLimits::body_min_rate`] bytes
//!   received; a body that falls behind fails with [`BodyStalled`], so a body
//!   trickling a byte a second is cut while a slow real upload is not.
//! - **Accept errors** (descriptor exhaustion, `ECONNABORTED`) back off from
//!   5 ms up to 1 s and are logged once per 10 s with how many were not.
//! - **Budget**: each listener group takes a permit per connection before it
//!   accepts; with none left it stops accepting (the kernel's backlog holds
//!   new connections) and says so once per 10 s.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tracing::{debug, warn};

use crate::proxy::forward::{BoxError, FramePoll};

/// How long a connection may be slow or idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// From a request head's first byte to its last.
    pub header: Duration,
    /// With no request in flight.
    pub idle: Duration,
    /// A request body's allowance before `body_min_rate` extends it.
    pub body: Duration,
    /// Bytes per second a body must average after `body`.
    pub body_min_rate: u64,
}

impl ConnLimits {
    /// The limits `[server]` sets.
    pub fn from_config(server: &crate::config::ServerConfig) -> Self {
        ConnLimits {
            header: Duration::from_secs(server.header_timeout_s),
            idle: Duration::from_secs(server.idle_timeout_s),
            body: Duration::from_secs(server.body_timeout_s),
            body_min_rate: server.body_min_rate_bytes,
        }
    }
}

impl Default for ConnLimits {
    /// nginx-like defaults that a slow real client survives: 30 s for a head,
    /// 75 s idle, 30 s plus a second per KiB for a body.
    fn default() -> Self {
        ConnLimits {
            header: Duration::from_secs(30),
            idle: Duration::from_secs(75),
            body: Duration::from_secs(30),
            body_min_rate: 1024,
        }
    }
}

/// A request body that fails when it falls behind its allowance.
pub type BorrowerBody = ProgressBody<Incoming>;

/// A connection's requests in flight and when it last went idle, shared by
/// its I/O, its service and its watchdog.
#[derive(Debug)]
struct Activity {
    state: Mutex<ActivityState>,
    changed: Notify,
}

#[derive(Debug, Clone, Copy)]
struct ActivityState {
    in_flight: usize,
    idle_since: Instant,
    /// The first byte of a new request head, while none is in flight.
    head_started: Option<Instant>,
}

impl Activity {
    fn new() -> Self {
        Activity {
            state: Mutex::new(ActivityState {
                in_flight: 0,
                idle_since: Instant::now(),
                head_started: None,
            }),
            changed: Notify::new(),
        }
    }

    fn update(&self, f: impl FnOnce(&mut ActivityState) -> bool) {
        let changed = match self.state.lock() {
            Ok(mut s) => f(&mut s),
            Err(p) => f(&mut p.into_inner()),
        };
        if changed {
            self.changed.notify_one();
        }
    }

    fn snapshot(&self) -> ActivityState {
        match self.state.lock() {
            Ok(s) => *s,
            Err(p) => *p.into_inner(),
        }
    }

    fn bytes_read(&self) {
        self.update(|s| {
            if s.in_flight == 0 && s.head_started.is_none() {
                s.head_started = Some(Instant::now());
                return true;
            }
            false
        });
    }

    fn request_started(&self) {
        self.update(|s| {
            s.in_flight += 1;
            s.head_started = None;
            true
        });
    }

    fn request_ended(&self) {
        self.update(|s| {
            s.in_flight = s.in_flight.saturating_sub(1);
            if s.in_flight == 0 {
                s.idle_since = Instant::now();
                s.head_started = None;
            }
            true
        });
    }

    /// Resolves with why the connection should close.
    async fn expired(&self, limits: ConnLimits) -> &'static str {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let s = self.snapshot();
            let deadline = if s.in_flight > 0 {
                None
            } else if let Some(first) = s.head_started {
                Some((
                    first + limits.header,
                    "the request head did not arrive in time",
                ))
            } else {
                Some((s.idle_since + limits.idle, "idle"))
            };
            match deadline {
                None => changed.await,
                Some((at, _)) if at > Instant::now() => {
                    tokio::select! {
                        () = &mut changed => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                Some((_, why)) => return why,
            }
        }
    }
}

/// The connection's socket, noting when a new request's first byte arrives.
struct WatchedIo<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T: AsyncRead + Unpin> AsyncRead for WatchedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_read();
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WatchedIo<T> {
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
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A response body that counts its request as in flight until it ends or is
/// dropped, so a long generation never reads as an idle connection.
pub struct InFlight<B> {
    inner: B,
    activity: Arc<Activity>,
}

impl<B> Drop for InFlight<B> {
    fn drop(&mut self) {
        self.activity.request_ended();
    }
}

impl<B: Body + Unpin> Body for InFlight<B> {
    type Data = B::Data;
    type Error = B::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body fell behind its allowance (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the request body arrived too slowly: {received} bytes in {elapsed_s} s; send at least {min_rate} bytes a second after the first {allowance_s} s"
)]
pub struct BodyStalled {
    /// Bytes received.
    pub received: u64,
    /// Seconds since the body was first read.
    pub elapsed_s: u64,
    /// The required average rate.
    pub min_rate: u64,
    /// The allowance before the rate counts.
    pub allowance_s: u64,
}

/// A request body with a progress deadline (see the [module docs](self)).
pub struct ProgressBody<B> {
    inner: B,
    limits: ConnLimits,
    started: Option<Instant>,
    received: u64,
    timer: Option<Pin<Box<Sleep>>>,
}

impl<B> ProgressBody<B> {
    /// `inner` under `limits`; the clock starts at the first poll.
    pub fn new(inner: B, limits: ConnLimits) -> Self {
        ProgressBody {
            inner,
            limits,
            started: None,
            received: 0,
            timer: None,
        }
    }

    fn deadline(&self, started: Instant) -> Instant {
        let extra = self.received / self.limits.body_min_rate.max(1);
        started + self.limits.body + Duration::from_secs(extra)
    }
}

impl<B> Body for ProgressBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> FramePoll {
        let started = *self.started.get_or_insert_with(Instant::now);
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.received += data.len() as u64;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                // The timer is reset only when it fires: a body on time costs
                // one timer, not one per chunk.
                loop {
                    let deadline = self.deadline(started);
                    let timer = self
                        .timer
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                    if timer.deadline() < deadline {
                        timer.as_mut().reset(deadline);
                    }
                    ready!(timer.as_mut().poll(cx));
                    if Instant::now() >= self.deadline(started) {
                        let stalled = BodyStalled {
                            received: self.received,
                            elapsed_s: started.elapsed().as_secs(),
                            min_rate: self.limits.body_min_rate,
                            allowance_s: self.limits.body.as_secs(),
                        };
                        return Poll::Ready(Some(Err(Box::new(stalled))));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether `e`, anywhere in its chain, is a [`BodyStalled`].
pub fn is_stalled(e: &(dyn std::error::Error + 'static)) -> Option<BodyStalled> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(s) = err.downcast_ref::<BodyStalled>() {
            return Some(*s);
        }
        cur = err.source();
    }
    None
}

/// Serve one HTTP/1.1 connection with `limits`: requests go to `handler`
/// with their bodies under the progress deadline; the connection closes when
/// it is too slow or idle, or, gracefully, when `stop` turns true.
pub async fn serve_connection<H, Fut, B>(
    stream: TcpStream,
    limits: ConnLimits,
    handler: H,
    mut stop: Option<watch::Receiver<bool>>,
) -> Result<(), hyper::Error>
where
    H: Fn(http::Request<BorrowerBody>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = http::Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    let activity = Arc::new(Activity::new());
    let io = WatchedIo {
        inner: stream,
        activity: Arc::clone(&activity),
    };
    let handler = Arc::new(handler);
    let svc_activity = Arc::clone(&activity);
    let service = service_fn(move |req: http::Request<Incoming>| {
        svc_activity.request_started();
        let activity = Arc::clone(&svc_activity);
        let handler = Arc::clone(&handler);
        async move {
            let req = req.map(|b| ProgressBody::new(b, limits));
            let resp = handler(req).await;
            Ok::<_, std::convert::Infallible>(resp.map(|inner| InFlight { inner, activity }))
        }
    });
    let conn = http1::Builder::new()
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(conn);
    let stopped = async {
        match stop.as_mut() {
            Some(s) => crate::proxy::stopped(s).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = conn.as_mut() => r,
        why = activity.expired(limits) => {
            debug!(reason = why, "closing a connection");
            conn.as_mut().graceful_shutdown();
            // An idle connection closes at once; a half-sent head is cut.
            match tokio::time::timeout(Duration::from_secs(1), conn.as_mut()).await {
                Ok(r) => r,
                Err(_) => Ok(()),
            }
        }
        () = stopped => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    }
}

/// Rate-limited logging and a growing pause for failing `accept` calls.
#[derive(Debug)]
pub struct AcceptBackoff {
    listener: String,
    delay: Duration,
    last_log: Option<Instant>,
    suppressed: u64,
}

/// How often a repeating listener problem is logged.
const LOG_EVERY: Duration = Duration::from_secs(10);

impl AcceptBackoff {
    /// For the listener named `listener` in logs.
    pub fn new(listener: impl Into<String>) -> Self {
        AcceptBackoff {
            listener: listener.into(),
            delay: Duration::from_millis(5),
            last_log: None,
            suppressed: 0,
        }
    }

    /// Accept one connection, backing off while accepting fails.
    pub async fn accept(&mut self, listener: &TcpListener) -> (TcpStream, SocketAddr) {
        loop {
            match listener.accept().await {
                Ok(accepted) => {
                    self.delay = Duration::from_millis(5);
                    return accepted;
                }
                Err(e) => {
                    let now = Instant::now();
                    if self.last_log.is_none_or(|t| now - t >= LOG_EVERY) {
                        warn!(listener = %self.listener, error = %e, not_logged = self.suppressed, retry_in_ms = self.delay.as_millis() as u64, "accepting a connection failed; backing off (with descriptors exhausted, raise LimitNOFILE)");
                        self.last_log = Some(now);
                        self.suppressed = 0;
                    } else {
                        self.suppressed += 1;
                    }
                    tokio::time::sleep(self.delay).await;
                    self.delay = (self.delay * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}

/// Connections a group of listeners may hold open at once.
#[derive(Debug, Clone)]
pub struct ConnBudget {
    name: &'static str,
    permits: Arc<Semaphore>,
    size: usize,
    last_full_log: Arc<AtomicU64>,
    origin: Instant,
}

impl ConnBudget {
    /// A budget of `size` connections, named in logs.
    pub fn new(name: &'static str, size: usize) -> Self {
        ConnBudget {
            name,
            permits: Arc::new(Semaphore::new(size.max(1))),
            size: size.max(1),
            last_full_log: Arc::new(AtomicU64::new(u64::MAX)),
            origin: Instant::now(),
        }
    }

    /// How many connections it allows.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Connections open now.
    pub fn in_use(&self) -> usize {
        self.size - self.permits.available_permits()
    }

    /// A permit for one more connection, waiting while none is left.
    pub async fn acquire(&self) -> OwnedSemaphorePermit {
        if let Ok(p) = Arc::clone(&self.permits).try_acquire_owned() {
            return p;
        }
        let secs = self.origin.elapsed().as_secs();
        let last = self.last_full_log.load(Ordering::Relaxed);
        if last == u64::MAX || secs.saturating_sub(last) >= LOG_EVERY.as_secs() {
            self.last_full_log.store(secs, Ordering::Relaxed);
            warn!(
                listeners = self.name,
                limit = self.size,
                "connection limit reached; new connections wait until one closes (raise LimitNOFILE for a larger limit)"
            );
        }
        loop {
            if let Ok(p) = Arc::clone(&self.permits).acquire_owned().await {
                return p;
            }
        }
    }
}

/// Split the process's descriptor limit between borrower connections (two
/// descriptors each: the borrower's and the upstream's) and the control
/// listener, keeping `reserve` for the ledger, samplers and observation.
pub fn budgets(nofile: u64, reserve: u64) -> (ConnBudget, ConnBudget) {
    let spare = nofile.saturating_sub(reserve);
    let control = (reserve / 2).clamp(8, 256);
    let borrowers = usize::try_from(spare / 2).unwrap_or(usize::MAX).max(16);
    (
        ConnBudget::new("borrower", borrowers),
        ConnBudget::new("control", usize::try_from(control).unwrap_or(64)),
    )
}

/// The number of descriptors the process may hold, raised first where it
/// can be ([`crate::platform::raise_open_file_limit`]: on Unix the soft
/// `RLIMIT_NOFILE` raised to the hard one; on Windows a fixed budget).
pub fn raise_nofile_limit() -> u64 {
    crate::platform::raise_open_file_limit()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn budgets_keep_descriptors_for_the_control_plane() {
        // Issue 14 item 4: with systemd's default soft limit of 1,024, borrower
        // connections (two descriptors each) stop short of the limit.
        let (borrowers, control) = budgets(1024, 128);
        assert_eq!(borrowers.size(), 448);
        assert_eq!(control.size(), 64);
        assert!(borrowers.size() * 2 + control.size() < 1024);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_trickling_body_stalls_and_a_steady_one_does_not() {
        let limits = ConnLimits {
            body: Duration::from_secs(10),
            body_min_rate: 100,
            ..ConnLimits::default()
        };
        // One byte a second: cut after the allowance.
        let (mut tx, body) = http_body_util::channel::Channel::<Bytes, BoxError>::new(1);
        let trickle = tokio::spawn(async move {
            for _ in 0..100 {
                if tx.send_data(Bytes::from_static(b"x")).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let started = Instant::now();
        let err = ProgressBody::new(body, limits).collect().await.unwrap_err();
        let stalled = is_stalled(err.as_ref()).unwrap();
        assert_eq!(stalled.received, 10);
        assert_eq!(started.elapsed().as_secs(), 10);
        trickle.abort();

        // 200 bytes a second for 30 s: twice the minimum rate, never cut.
        let (mut tx, body) = http_body_util::channel::Channel::<Bytes, BoxError>::new(1);
        tokio::spawn(async move {
            for _ in 0..30 {
                tx.send_data(Bytes::from(vec![b'y'; 200])).await.unwrap();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let all = ProgressBody::new(body, limits).collect().await.unwrap();
        assert_eq!(all.to_bytes().len(), 6000);
    }
}
