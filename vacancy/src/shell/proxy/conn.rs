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
//! - **Resting**: a keep-alive connection idle for [`REST`] gives hyper's
//!   state and buffers back and waits for its next byte as a fresh connection
//!   does, so an idle borrower costs the same few hundred bytes after a
//!   request as before its first (issue 31 item 4: 12 KiB before).
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
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tracing::{debug, warn};

use crate::shell::proxy::woken_only::WokenOnly;
use crate::shell::state::shutdown::stopped;
use crate::shell::upstream::forward::{BoxError, FramePoll};

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

/// `at` moved `by` later; a sum past the clock's range (a limit set to
/// `Duration::MAX`) reads as thirty years from now, which no connection
/// reaches, instead of panicking (issue 30 item 5).
fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(30 * 365 * 86_400))
}

/// A request body that fails when it falls behind its allowance.
pub type BorrowerBody = ProgressBody<Incoming>;

/// A connection's requests in flight and when it last went idle, shared by
/// its I/O, its service and its watchdog.
///
/// Plain atomics, written where a request starts and ends and where bytes
/// arrive, and read only when the watchdog's one timer fires: a request
/// costs no lock, no notification and no timer work.
#[derive(Debug)]
struct Activity {
    /// What the times below count from.
    origin: Instant,
    in_flight: AtomicUsize,
    /// When the last request ended (µs since `origin`).
    idle_since: AtomicU64,
    /// The first byte of a new request head while none is in flight (µs
    /// since `origin`, plus one; 0 for none).
    head_started: AtomicU64,
    /// Set while hyper lets go of an idle connection to rest it: its
    /// shutdown of the socket is then not carried out.
    resting: AtomicBool,
}

/// How long a keep-alive connection is idle before it rests (see the
/// [module docs](self)): long enough that a client sending its requests
/// back to back keeps hyper's state, short enough that one that pauses
/// gives its buffers back before the next comes.
pub const REST: Duration = Duration::from_millis(250);

/// Why a connection's hyper state ends while the connection is idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdleEnd {
    /// Past a limit: the connection closes, for this reason.
    Close(&'static str),
    /// Idle for [`REST`]: hyper's state goes, the connection stays.
    Rest,
}

impl Activity {
    fn new() -> Self {
        Activity {
            origin: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_started: AtomicU64::new(0),
            resting: AtomicBool::new(false),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX - 1)
    }

    fn at(&self, micros: u64) -> Instant {
        self.origin + Duration::from_micros(micros)
    }

    fn bytes_read(&self) {
        if self.in_flight.load(Ordering::Relaxed) == 0
            && self.head_started.load(Ordering::Relaxed) == 0
        {
            self.head_started.store(self.now() + 1, Ordering::Relaxed);
        }
    }

    fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_started.store(0, Ordering::Relaxed);
    }

    fn request_ended(&self) {
        if self.in_flight.fetch_sub(1, Ordering::Relaxed) <= 1 {
            self.in_flight.store(0, Ordering::Relaxed);
            self.idle_since.store(self.now(), Ordering::Relaxed);
            self.head_started.store(0, Ordering::Relaxed);
        }
    }

    /// When the connection's hyper state should end and why, as things
    /// stand; `None` while a request is in flight. An idle connection rests
    /// before its idle limit, where that limit is longer than [`REST`].
    fn deadline(&self, limits: ConnLimits) -> Option<(Instant, IdleEnd)> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        match self.head_started.load(Ordering::Relaxed) {
            0 => {
                let since = self.at(self.idle_since.load(Ordering::Relaxed));
                Some(if REST < limits.idle {
                    (later(since, REST), IdleEnd::Rest)
                } else {
                    (later(since, limits.idle), IdleEnd::Close("idle"))
                })
            }
            first => Some((
                later(self.at(first - 1), limits.header),
                IdleEnd::Close("the request head did not arrive in time"),
            )),
        }
    }

    /// What is left of the idle limit of a connection idle since its last
    /// request ended (or hyper started, if none has).
    fn idle_left(&self, limits: ConnLimits) -> Duration {
        let since = self.at(self.idle_since.load(Ordering::Relaxed));
        later(since, limits.idle).saturating_duration_since(Instant::now())
    }

    /// Resolves with why the connection's hyper state should end.
    ///
    /// One timer, armed no later than any limit could run out from what is
    /// known when it is armed, and re-armed when it fires: a request that
    /// starts or ends moves a limit only later, except a head's first byte,
    /// whose limit is never earlier than `header` from the moment the timer
    /// was armed while none had come.
    async fn expired(&self, limits: ConnLimits) -> IdleEnd {
        let soonest = limits.idle.min(limits.header).min(REST);
        let timer = tokio::time::sleep(soonest);
        tokio::pin!(timer);
        loop {
            timer.as_mut().await;
            let now = Instant::now();
            let next = match self.deadline(limits) {
                None => later(now, soonest),
                Some((at, why)) if at <= now => return why,
                Some((at, _)) if self.head_started.load(Ordering::Relaxed) == 0 => {
                    at.min(later(now, limits.header))
                }
                Some((at, _)) => at,
            };
            timer.as_mut().reset(next);
        }
    }
}

/// The connection's socket, noting when a new request's first byte arrives.
struct WatchedIo<T> {
    inner: T,
    /// Bytes read before the connection last rested, read again first.
    unread: Bytes,
    activity: Arc<Activity>,
}

impl<T: AsyncRead + Unpin> AsyncRead for WatchedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.unread.is_empty() {
            let n = self.unread.len().min(buf.remaining());
            buf.put_slice(&self.unread.split_to(n));
            self.activity.bytes_read();
            return Poll::Ready(Ok(()));
        }
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
        if self.activity.resting.load(Ordering::Relaxed) {
            return Poll::Ready(Ok(()));
        }
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
        later(later(started, self.limits.body), Duration::from_secs(extra))
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

/// Resolves once the daemon stops, where the connection watches for that;
/// never where it does not.
async fn stopped_if_watched(stop: Option<&mut watch::Receiver<bool>>) {
    match stop {
        Some(s) => stopped(s).await,
        None => std::future::pending().await,
    }
}

/// Serve one HTTP/1.1 connection with `limits`: requests go to `handler`
/// with their bodies under the progress deadline; the connection closes when
/// it is too slow or idle, or, gracefully, when `stop` turns true.
///
/// Until its first byte arrives a connection is only its socket, one timer
/// and this small task: hyper's buffers (two of 8 KiB) and its state are
/// made with the first byte, so an idle borrower costs a few hundred bytes
/// (issue 31 item 4). Once idle for [`REST`] after a request it gives them
/// back and waits so again, for what is left of its idle limit.
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
    let handler = Arc::new(handler);
    let (mut stream, mut unread, mut idle) = (stream, Bytes::new(), limits.idle);
    loop {
        if unread.is_empty() && !first_byte(&stream, idle, stop.as_mut()).await {
            return Ok(());
        }
        let served = serve_started(stream, unread, limits, Arc::clone(&handler), stop.as_mut());
        match Box::pin(served).await? {
            Served::Closed => return Ok(()),
            Served::Rested(rested) => (stream, unread, idle) = rested,
        }
    }
}

/// Whether a byte arrived (or the peer closed or failed, which hyper then
/// sees) within `idle`, before the daemon stopped.
async fn first_byte(
    stream: &TcpStream,
    idle: Duration,
    stop: Option<&mut watch::Receiver<bool>>,
) -> bool {
    let mut peeked = [0u8; 1];
    tokio::select! {
        // A peek, not `readable()`: tokio takes an accepted socket as
        // readable at first.
        r = stream.peek(&mut peeked) => r.is_ok(),
        () = tokio::time::sleep(idle) => {
            debug!(reason = "idle", "closing a connection");
            false
        }
        () = stopped_if_watched(stop) => false,
    }
}

/// How hyper's part of a connection ended.
enum Served {
    /// The connection is over (closed, failed, upgraded or stopped).
    Closed,
    /// Idle for [`REST`]: the socket, what hyper had read of a next request
    /// and not parsed, and what is left of the idle limit.
    Rested((TcpStream, Bytes, Duration)),
}

/// Serve requests on `stream` with hyper from its first byte (after
/// `unread`, read before it last rested) until it closes or rests.
async fn serve_started<H, Fut, B>(
    stream: TcpStream,
    unread: Bytes,
    limits: ConnLimits,
    handler: Arc<H>,
    stop: Option<&mut watch::Receiver<bool>>,
) -> Result<Served, hyper::Error>
where
    H: Fn(http::Request<BorrowerBody>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = http::Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    let activity = Arc::new(Activity::new());
    let io = WatchedIo {
        inner: stream,
        unread,
        activity: Arc::clone(&activity),
    };
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
    // One buffer per write, not a `writev` of the head and each body chunk
    // (hyper's default for sockets): a read's reply costs the kernel about
    // 1 µs less and hyper 700 instructions less (issue 31). What is copied
    // is bounded by hyper's buffer, as the upstream's chunks are.
    let mut conn = http1::Builder::new()
        .writev(false)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    // The idle timer and the shutdown watch, polled only when one of them
    // woke the task, not on each of the connection's reads (issue 31).
    let mut ends = WokenOnly::new(Box::pin(async {
        tokio::select! {
            biased;
            end = activity.expired(limits) => Some(end),
            () = stopped_if_watched(stop) => None,
        }
    }));
    let end = tokio::select! {
        biased;
        r = &mut conn => return r.map(|()| Served::Closed),
        end = &mut ends => end,
    };
    drop(ends);
    if end == Some(IdleEnd::Rest) {
        // Nothing of a next request has been read, nor can be until the
        // connection is polled again: hyper ends once the last reply is
        // written out (at once, unless the borrower is slow to read it), and
        // without shutting the socket down. A borrower who reads nothing
        // more is closed at the idle limit, as before.
        activity.resting.store(true, Ordering::Relaxed);
        Pin::new(&mut conn).graceful_shutdown();
        match tokio::time::timeout(activity.idle_left(limits), &mut conn).await {
            Ok(r) => r?,
            Err(_) => {
                debug!(reason = "idle", "closing a connection");
                return Ok(Served::Closed);
            }
        }
        let Some(parts) = conn.into_parts() else {
            // Upgraded while its 101 was still going out: the tunnel has the
            // socket now, and its shutdown is to be carried out.
            activity.resting.store(false, Ordering::Relaxed);
            return Ok(Served::Closed);
        };
        let io = parts.io.into_inner();
        // Copied out, and nothing kept when there is nothing: hyper's
        // leftover is a view of its whole read buffer, which it would keep.
        let unread = match (parts.read_buf.is_empty(), io.unread.is_empty()) {
            (true, true) => Bytes::new(),
            _ => [parts.read_buf, io.unread].concat().into(),
        };
        debug!("connection resting: hyper's state and buffers given back until its next byte");
        #[cfg(test)]
        tests::RESTS.with(|r| r.send_modify(|n| *n += 1));
        return Ok(Served::Rested((
            io.inner,
            unread,
            activity.idle_left(limits),
        )));
    }
    Pin::new(&mut conn).graceful_shutdown();
    match end {
        Some(IdleEnd::Close(why)) => {
            debug!(reason = why, "closing a connection");
            // An idle connection closes at once; a half-sent head is cut.
            match tokio::time::timeout(Duration::from_secs(1), &mut conn).await {
                Ok(r) => r.map(|()| Served::Closed),
                Err(_) => Ok(Served::Closed),
            }
        }
        _ => conn.await.map(|()| Served::Closed),
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
/// listener (a sixteenth, 64 to 2048: it grows with the limit, issue 30
/// item 2), keeping `reserve` for the ledger, samplers and observation.
pub fn budgets(nofile: u64, reserve: u64) -> (ConnBudget, ConnBudget) {
    let control = (nofile / 16).clamp(64, 2048);
    let spare = nofile.saturating_sub(reserve).saturating_sub(control);
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Serves one connection at `addr` with a handler that answers each
    /// request with its path.
    async fn path_echo(limits: ConnLimits) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let handler = |req: http::Request<BorrowerBody>| async move {
                let path = Bytes::copy_from_slice(req.uri().path().as_bytes());
                http::Response::new(http_body_util::Full::new(path))
            };
            serve_connection(stream, limits, handler, None)
                .await
                .unwrap();
        });
        (addr, server)
    }

    /// Reads one reply whose body is `body`, whole.
    async fn reply(client: &mut TcpStream, body: &str) {
        let mut got = Vec::new();
        let mut chunk = [0u8; 1024];
        while !got.ends_with(body.as_bytes()) {
            let n = tokio::time::timeout(Duration::from_secs(10), client.read(&mut chunk))
                .await
                .expect("a reply")
                .unwrap();
            assert_ne!(
                n,
                0,
                "closed before the reply: {}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&chunk[..n]);
        }
        let got = String::from_utf8_lossy(&got);
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    }

    thread_local! {
        /// The rests of connections served on this thread (a test's own
        /// runtime is its thread), for a test to wait on.
        pub(super) static RESTS: watch::Sender<usize> = watch::Sender::new(0);
    }

    /// Issue 31 item 4: a keep-alive connection idle for REST lets hyper's
    /// state go and serves its next request as a fresh one would, with
    /// what hyper had read of it and not parsed (here half a pipelined
    /// head) read again first.
    #[tokio::test]
    async fn a_keep_alive_connection_rests_and_serves_its_next_request_whole() {
        let mut rests = RESTS.with(watch::Sender::subscribe);
        let mut rested = async |n| {
            tokio::time::timeout(Duration::from_secs(10), rests.wait_for(|r| *r >= n))
                .await
                .expect("the connection never rested")
                .map(|_| ())
                .unwrap();
        };
        let (addr, _server) = path_echo(ConnLimits::default()).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\nGET /second HTTP/1.1\r\nHo")
            .await
            .unwrap();
        reply(&mut client, "/first").await;
        rested(1).await;
        client.write_all(b"st: x\r\n\r\n").await.unwrap();
        reply(&mut client, "/second").await;
        rested(2).await;
        client
            .write_all(b"GET /third HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        reply(&mut client, "/third").await;
    }

    /// Resting does not lengthen the idle limit: a connection idle since
    /// its last reply closes at `idle` after it, rested or not.
    #[tokio::test(start_paused = true)]
    async fn a_rested_connection_still_closes_at_its_idle_limit() {
        let idle = REST * 4;
        let limits = ConnLimits {
            idle,
            ..ConnLimits::default()
        };
        let (addr, server) = path_echo(limits).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET /only HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        reply(&mut client, "/only").await;
        let replied = Instant::now();
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        let idled = replied.elapsed();
        assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
        assert!(
            idled >= idle - Duration::from_millis(5) && idled < idle + REST / 2,
            "closed {idled:?} after the reply; the idle limit is {idle:?}"
        );
        server.await.unwrap();
    }

    #[test]
    fn budgets_keep_descriptors_for_the_control_plane() {
        // Issue 14 item 4: with systemd's default soft limit of 1,024, borrower
        // connections (two descriptors each) stop short of the limit.
        let (borrowers, control) = budgets(1024, 64);
        assert_eq!(borrowers.size(), 448);
        assert_eq!(control.size(), 64);
        assert!(borrowers.size() * 2 + control.size() < 1024);
        // Issue 30 item 2: the control plane's share grows with the limit.
        let (borrowers, control) = budgets(20_000, 64);
        assert_eq!(control.size(), 1250);
        assert!(borrowers.size() * 2 + control.size() + 64 <= 20_000);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn limits_past_the_clocks_range_never_panic_a_connection() {
        // Issue 30 item 5: a limit of Duration::MAX (a library caller's, or
        // an unchecked configuration's) was added to an Instant: by the
        // watchdog when it re-armed after a request, and by a request body
        // that had to wait for its bytes. Either panicked the connection.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let limits = ConnLimits {
            header: Duration::MAX,
            idle: Duration::from_millis(1500),
            body: Duration::MAX,
            body_min_rate: 1,
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let handler = |req: http::Request<BorrowerBody>| async move {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                http::Response::new(http_body_util::Full::new(body))
            };
            serve_connection(stream, limits, handler, None).await
        });
        let mut client = TcpStream::connect(addr).await.unwrap();
        // A head, then its body later: the body's deadline is computed.
        client
            .write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        client.write_all(b"ok").await.unwrap();
        // The reply, then idle: the watchdog fires at 1.5 s with the idle
        // limit moved by the request, and re-arms with the header limit.
        let mut reply = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut reply))
            .await
            .unwrap()
            .unwrap();
        let reply = String::from_utf8_lossy(&reply);
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(reply.ends_with("ok"), "{reply}");
        server.await.unwrap().unwrap();
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
