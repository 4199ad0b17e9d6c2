//! A forwarding HTTP/1.1 proxy that records every request it relays.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONNECTION, HeaderMap, HeaderName};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::sync::oneshot;

use crate::background::{BackgroundServer, serve_http};
use crate::error::SupportError;

/// One request the shim relayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The request method, e.g. `POST`.
    pub method: String,
    /// The request path, without the query.
    pub path: String,
    /// When the shim received the request (before it connected upstream).
    pub started: Instant,
    /// When the exchange ended: the last byte of the response body was handed on,
    /// or the exchange was cut (client gone, upstream failed). `None` while running.
    pub ended: Option<Instant>,
    /// The upstream's status code; `None` until its response head arrives, and for
    /// good if it never did (the client then got a 502 from the shim).
    pub status: Option<u16>,
    /// Whether the whole response body was relayed.
    pub completed: bool,
}

/// An in-process HTTP/1.1 forwarding proxy between a client (vacancyd) and an
/// upstream, recording every request: the oracle of "the upstream never saw two
/// work requests at once".
///
/// It runs on its own thread with its own tokio runtime, so it outlives any test
/// runtime, and listens on a free 127.0.0.1 port. Each request goes to the upstream
/// over a fresh TCP connection with its method, path, query, headers (less the
/// hop-by-hop ones) and body; the response is streamed back frame by frame, never
/// buffered, so server-sent events pass through as they come.
///
/// A record's interval, `started..ended`, contains the upstream's own view of the
/// exchange: `started` is taken before the upstream is contacted and `ended` before
/// the client can see the end of the response. So a client that sends its next
/// request only after reading a whole response never shows a false overlap.
#[derive(Debug)]
pub struct CountingShim {
    server: BackgroundServer,
    upstream: SocketAddr,
    log: Arc<Log>,
}

impl CountingShim {
    /// Starts a shim in front of `upstream`.
    pub fn start(upstream: SocketAddr) -> Result<Self, SupportError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| SupportError::io("counting shim: build its tokio runtime", e))?;
        let log = Arc::new(Log::default());
        let thread_log = Arc::clone(&log);
        // Stopping the runtime cancels the exchanges still running; their records
        // end as not completed.
        let server =
            BackgroundServer::start("counting-shim", runtime, move |listener, stopped| {
                serve(listener, upstream, thread_log, stopped)
            })?;
        Ok(Self {
            server,
            upstream,
            log,
        })
    }

    /// The address the shim listens on.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://127.0.0.1:PORT` of the shim, without a trailing slash.
    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    /// The upstream it forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Every request recorded since the start or the last [`clear`](Self::clear),
    /// in the order they arrived.
    pub fn records(&self) -> Vec<Record> {
        self.log
            .lock()
            .entries
            .iter()
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// The most records matching `pred` that were running at one instant, from
    /// their intervals (a record without an end is still running). Intervals that
    /// only touch (one ends when the next starts) do not overlap.
    pub fn max_concurrency_where(&self, pred: impl Fn(&Record) -> bool) -> usize {
        max_overlap(self.records().iter().filter(|r| pred(r)))
    }

    /// How many exchanges are running now.
    pub fn in_flight(&self) -> usize {
        self.log
            .lock()
            .entries
            .iter()
            .filter(|(_, r)| r.ended.is_none())
            .count()
    }

    /// Waits up to `timeout` for no exchange to be running; whether that happened.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.in_flight() == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Forgets the finished records. Those still running stay, so
    /// [`in_flight`](Self::in_flight) and the concurrency measures stay true.
    pub fn clear(&self) {
        self.log.lock().entries.retain(|(_, r)| r.ended.is_none());
    }

    /// Stops listening and cuts the exchanges still running (their records end as
    /// not completed). Idempotent; also done on drop.
    pub fn stop(&mut self) {
        self.server.stop();
    }
}

/// The records, by id.
#[derive(Debug, Default)]
struct Log {
    state: Mutex<LogState>,
}

#[derive(Debug, Default)]
struct LogState {
    next_id: u64,
    entries: Vec<(u64, Record)>,
}

impl Log {
    fn lock(&self) -> MutexGuard<'_, LogState> {
        // The state stays consistent even if a holder panicked: every update is
        // one field assignment.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn begin(&self, method: String, path: String) -> u64 {
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        state.entries.push((
            id,
            Record {
                method,
                path,
                started: Instant::now(),
                ended: None,
                status: None,
                completed: false,
            },
        ));
        id
    }

    fn update(&self, id: u64, f: impl FnOnce(&mut Record)) {
        let mut state = self.lock();
        if let Some((_, record)) = state.entries.iter_mut().rev().find(|(i, _)| *i == id) {
            f(record);
        }
    }
}

/// Ends a record exactly once: explicitly with [`finish`](Self::finish), or as
/// not completed when dropped (the exchange was cut).
struct Ending {
    log: Arc<Log>,
    id: u64,
    done: bool,
}

impl Ending {
    fn finish(&mut self, completed: bool) {
        if !self.done {
            self.done = true;
            let now = Instant::now();
            self.log.update(self.id, |r| {
                r.ended = Some(now);
                r.completed = completed;
            });
        }
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        self.finish(false);
    }
}

/// The upstream's response body on its way to the client, ending the record when
/// its last frame is handed on.
struct Relay {
    inner: Incoming,
    ending: Ending,
    // Keeps the upstream connection's request side open while the body streams.
    _sender: SendRequest<Incoming>,
}

impl Body for Relay {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.ending.finish(true),
            Poll::Ready(Some(Err(_))) => this.ending.finish(false),
            // With a known length the server may not ask again after the last frame.
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.ending.finish(true),
            Poll::Ready(Some(Ok(_))) | Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // An empty body may never be polled; it was relayed in full all the same.
        let completed = self.inner.is_end_stream();
        self.ending.finish(completed);
    }
}

type ShimBody = BoxBody<Bytes, hyper::Error>;

async fn serve(
    listener: tokio::net::TcpListener,
    upstream: SocketAddr,
    log: Arc<Log>,
    stopped: oneshot::Receiver<()>,
) {
    serve_http(listener, stopped, move |req| {
        relay(req, upstream, Arc::clone(&log))
    })
    .await;
}

async fn relay(
    req: Request<Incoming>,
    upstream: SocketAddr,
    log: Arc<Log>,
) -> Result<Response<ShimBody>, Infallible> {
    let id = log.begin(req.method().to_string(), req.uri().path().to_owned());
    let ending = Ending {
        log: Arc::clone(&log),
        id,
        done: false,
    };
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers);

    let stream = match tokio::net::TcpStream::connect(upstream).await {
        Ok(stream) => stream,
        Err(e) => return Ok(bad_gateway(format!("connect to {upstream}: {e}"))),
    };
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
            Ok(pair) => pair,
            Err(e) => return Ok(bad_gateway(format!("handshake with {upstream}: {e}"))),
        };
    tokio::spawn(async move {
        // Its errors reach the request or the body stream below.
        let _ = connection.await;
    });
    let response = match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(response) => response,
        Err(e) => return Ok(bad_gateway(format!("request to {upstream}: {e}"))),
    };
    let status = response.status().as_u16();
    log.update(id, |r| r.status = Some(status));
    let (mut parts, inner) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = Relay {
        inner,
        ending,
        _sender: sender,
    };
    Ok(Response::from_parts(parts, body.boxed()))
}

fn bad_gateway(message: String) -> Response<ShimBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(format!("counting shim: {message}\n")))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}

/// Removes the headers that describe one connection, not the message (RFC 9110
/// section 7.6.1), including those the `Connection` header names. Framing
/// (`Transfer-Encoding`, `Content-Length`) stays: hyper frames by it.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .filter(|name| {
            name != http::header::TRANSFER_ENCODING && name != http::header::CONTENT_LENGTH
        })
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    ] {
        headers.remove(name);
    }
}

/// The most intervals running at one instant.
fn max_overlap<'a>(records: impl Iterator<Item = &'a Record>) -> usize {
    // (time, +1 start / -1 end); a record without an end never ends.
    let mut events: Vec<(Instant, i32)> = Vec::new();
    for r in records {
        events.push((r.started, 1));
        if let Some(ended) = r.ended {
            events.push((ended, -1));
        }
    }
    // Ends before starts at equal instants: touching intervals do not overlap.
    events.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut running, mut most) = (0i64, 0i64);
    for (_, delta) in events {
        running += i64::from(delta);
        most = most.max(running);
    }
    usize::try_from(most).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn rec(start_ms: u64, end_ms: Option<u64>, t0: Instant) -> Record {
        Record {
            method: "POST".into(),
            path: "/completion".into(),
            started: t0 + Duration::from_millis(start_ms),
            ended: end_ms.map(|e| t0 + Duration::from_millis(e)),
            status: Some(200),
            completed: end_ms.is_some(),
        }
    }

    #[test]
    fn overlap_counts_intervals_running_together() {
        let t0 = Instant::now();
        let seq = [
            rec(0, Some(10), t0),
            rec(10, Some(20), t0),
            rec(30, Some(40), t0),
        ];
        assert_eq!(
            max_overlap(seq.iter()),
            1,
            "touching intervals do not overlap"
        );
        let two = [
            rec(0, Some(10), t0),
            rec(5, Some(20), t0),
            rec(15, Some(30), t0),
        ];
        assert_eq!(max_overlap(two.iter()), 2);
        let three = [
            rec(0, Some(100), t0),
            rec(5, None, t0),
            rec(50, Some(60), t0),
        ];
        assert_eq!(
            max_overlap(three.iter()),
            3,
            "an unended record is still running"
        );
        assert_eq!(max_overlap([].iter()), 0);
    }

    #[test]
    fn hop_by_hop_headers_go_framing_stays() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-private"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["transfer-encoding", "content-type"]);
    }
}
