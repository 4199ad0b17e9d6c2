//! One exchange with the upstream: connect, send, and hand back the streaming
//! response. Knows nothing of admission; says precisely how an exchange failed,
//! because that decides release or hold (DONE-02, DONE-03).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::shell::state::live::{CutSignal, cut_happens};
use crate::shell::upstream::origin::rewrite_own_origin;
use crate::shell::upstream::target::{ConnectError, Target};

/// Errors a body may carry through the proxy.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a proxied body's `poll_frame` answers: the next frame, the error that
/// cuts the body, or its end.
pub type FramePoll = std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, BoxError>>>;

/// The body type the proxy sends both ways.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// A response for the borrower, with how long the upstream had the request
/// before its head came (none for vacancyd's own answers): the service's
/// `handle` tells vacancyd's own time from the upstream's with it.
#[derive(Debug)]
pub struct Answer {
    /// What the borrower gets.
    pub response: http::Response<ProxyBody>,
    /// The upstream's part of the time to the response head.
    pub upstream_took: Option<Duration>,
}

impl From<http::Response<ProxyBody>> for Answer {
    /// vacancyd's own answer: none of its time was the upstream's.
    fn from(response: http::Response<ProxyBody>) -> Self {
        Answer {
            response,
            upstream_took: None,
        }
    }
}

/// How an exchange failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExchangeError {
    /// No connection was established: nothing reached the upstream (DONE-02).
    #[error("cannot connect to the upstream at {address}: {reason}")]
    Connect {
        /// host:port
        address: String,
        /// Why.
        reason: String,
    },
    /// The connection was established and then failed: the upstream may have
    /// received the request (DONE-03).
    #[error("the upstream exchange failed after connecting: {0}")]
    AfterConnect(String),
}

impl ExchangeError {
    /// What the borrower is told: what happened and what it means for the
    /// work, without the upstream's address or the OS error (those go to the
    /// log with the entry).
    pub fn borrower_words(&self) -> &'static str {
        match self {
            ExchangeError::Connect { .. } => {
                "vacancyd could not connect to the upstream server, so nothing was sent; retry once the owner's server is running again"
            }
            ExchangeError::AfterConnect(_) => {
                "the connection to the upstream server failed after the request was sent, so whether it ran is unknown"
            }
        }
    }
}

/// Headers that belong to one connection and are never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Whether a request or response asks to switch protocols.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && connection_tokens(headers.get_all(header::CONNECTION))
            .any(|t| t.eq_ignore_ascii_case("upgrade"))
}

/// Remove hop-by-hop headers, and those the `Connection` header names. An
/// upgrade keeps `Connection: upgrade` and `Upgrade`.
///
/// Run on every relayed request and response (issue 31): one pass over the
/// names finds which hop-by-hop headers are there, most of them passed over
/// by their length alone (most requests carry none; many responses carry
/// `Connection: keep-alive`); only those are removed. The names `Connection`
/// lists are removed by their text, and only when one of them is not a
/// hop-by-hop name already removed (`keep-alive` names only itself).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let present = headers.keys().fold(0u8, |found, name| {
        hop_by_hop_index(name).map_or(found, |i| found | 1 << i)
    });
    if present == 0 {
        return;
    }
    let upgrade_value = if present & 1 << UPGRADE_INDEX != 0 && is_upgrade(headers) {
        headers.get(header::UPGRADE).cloned()
    } else {
        None
    };
    if present & 1 << CONNECTION_INDEX != 0 {
        remove_connection_and_what_it_lists(headers);
    }
    // The others present, one bit each, lowest first.
    let mut rest = present & !(1 << CONNECTION_INDEX);
    while rest != 0 {
        headers.remove(&HOP_BY_HOP[rest.trailing_zeros() as usize]);
        rest &= rest - 1;
    }
    if let Some(v) = upgrade_value {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, v);
    }
}

/// Where `CONNECTION` and `UPGRADE` are in [`HOP_BY_HOP`].
const CONNECTION_INDEX: usize = 0;
const UPGRADE_INDEX: usize = 6;

/// Which of [`HOP_BY_HOP`] `name` is, told by its text in one match (a
/// length, then at most one comparison), not by comparing it with each
/// hop-by-hop name in turn: this runs on every field of every relayed
/// request and response (issue 31).
fn hop_by_hop_index(name: &HeaderName) -> Option<usize> {
    match name.as_str() {
        "connection" => Some(0),
        "keep-alive" => Some(1),
        "proxy-connection" => Some(2),
        "te" => Some(3),
        "trailer" => Some(4),
        "transfer-encoding" => Some(5),
        "upgrade" => Some(6),
        _ => None,
    }
}

/// The `Connection` field's tokens: the names of other fields that belong to
/// this connection only (RFC 9110 §7.6.1), and options such as `close`.
fn connection_tokens<'a>(
    values: impl IntoIterator<Item = &'a HeaderValue>,
) -> impl Iterator<Item = &'a str> {
    values
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Remove `Connection` and every field it names. A field that is one of
/// [`HOP_BY_HOP`] is removed with them by the caller, so only a list naming
/// another needs its names removed by text. One lookup of `Connection`, and
/// the usual `Connection: keep-alive` is told without splitting a list
/// (issue 31: both showed on every relayed response).
fn remove_connection_and_what_it_lists(headers: &mut HeaderMap) {
    let header::Entry::Occupied(entry) = headers.entry(header::CONNECTION) else {
        return;
    };
    let names_others = entry.iter().any(|v| !is_keep_alive(v) && lists_another(v));
    if !names_others {
        entry.remove();
        return;
    }
    let listed: Vec<HeaderValue> = entry.remove_entry_mult().1.collect();
    for token in connection_tokens(&listed) {
        // Text that is no header name removes nothing.
        headers.remove(token);
    }
}

/// Whether a `Connection` value is `keep-alive` alone: the usual one,
/// compared as sent before any case is folded.
fn is_keep_alive(value: &HeaderValue) -> bool {
    value == "keep-alive" || value.as_bytes().eq_ignore_ascii_case(b"keep-alive")
}

/// Whether one `Connection` value names a field that is not hop-by-hop.
fn lists_another(value: &HeaderValue) -> bool {
    connection_tokens([value]).any(|t| {
        !HOP_BY_HOP
            .iter()
            .any(|h| h.as_str().eq_ignore_ascii_case(t))
    })
}

/// Build the upstream request from the borrower's: the target's prefix is
/// prepended, hop-by-hop headers dropped, `Host` set to the target, and an
/// `Origin` or `Referer` that names the proxy itself set to the target too
/// ([`rewrite_own_origin`]). The borrower's head is changed in place and
/// becomes the upstream request's, so nothing in it is copied or built
/// afresh (issue 31: the copy, then an empty head built and dropped for it,
/// showed on every proxied read). It goes out as HTTP/1.1, whatever the
/// borrower's version, and without the borrower's request's extensions.
pub fn upstream_request(
    target: &Target,
    mut parts: http::request::Parts,
    body: ProxyBody,
) -> Result<http::Request<ProxyBody>, String> {
    let uri: http::Uri = match parts.uri.path_and_query() {
        // No prefix: the borrower's path as it came (no copy, no parse).
        Some(pq) if target.prefix.is_empty() => http::Uri::from(pq.clone()),
        pq => format!("{}{}", target.prefix, pq.map_or("/", |p| p.as_str()))
            .parse()
            .map_err(|e| format!("cannot form the upstream path: {e}"))?,
    };
    let borrower_uri = std::mem::replace(&mut parts.uri, uri);
    parts.version = http::Version::HTTP_11;
    // The upstream request starts with no extensions: what the borrower's
    // side needs of them (its upgrade, a tunnel's permit) was taken off
    // first (`BorrowerSide::take`), and the rest is hyper's for that side.
    parts.extensions.clear();
    let headers = &mut parts.headers;
    strip_hop_by_hop(headers);
    headers.remove(header::CONTENT_LENGTH);
    // Overwritten in its place, in one lookup that also gives back the
    // borrower's: Host stays where the borrower put it (first, as RFC 9110
    // §7.2 asks of clients).
    let borrower_host = headers.insert(header::HOST, target.host_header()?);
    let borrower_host = borrower_host
        .as_ref()
        .and_then(|h| h.to_str().ok())
        .or_else(|| borrower_uri.authority().map(|a| a.as_str()));
    rewrite_own_origin(headers, borrower_host, target);
    Ok(http::Request::from_parts(parts, body))
}

/// An upstream connection opened while the reservation's record is made
/// durable (issue 31): opening a connection sends nothing, so it need not
/// wait for the record; the request itself goes out only once the record is
/// on disk (REC-01). A record that fails leaves the upstream nothing but a
/// closed connection, and its request is still proven "not sent" (DONE-02).
/// Dropped unused, the connection is closed or its connecting stopped.
pub struct Connecting {
    task: Option<tokio::task::JoinHandle<Result<TcpStream, ConnectError>>>,
}

impl Connecting {
    /// Start `connect` beside the caller, on its runtime.
    pub fn start(
        connect: impl Future<Output = Result<TcpStream, ConnectError>> + Send + 'static,
    ) -> Self {
        Connecting {
            task: Some(tokio::spawn(connect)),
        }
    }

    /// The connection, once made.
    async fn connection(mut self) -> Result<TcpStream, ConnectError> {
        let Some(task) = self.task.take() else {
            return Err(ConnectError::Failed("no connection was started".to_owned()));
        };
        match task.await {
            Ok(connected) => connected,
            Err(e) => Err(ConnectError::Failed(format!(
                "the connecting task ended early: {e}"
            ))),
        }
    }
}

impl Drop for Connecting {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl std::fmt::Debug for Connecting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connecting").finish_non_exhaustive()
    }
}

/// Connect to the target and send one request; the response streams.
pub async fn exchange(
    target: &Target,
    request: http::Request<ProxyBody>,
    connect_timeout: Duration,
) -> Result<http::Response<Incoming>, ExchangeError> {
    exchange_with_cut(target, request, connect_timeout, None, None, None)
        .await
        .map(|(response, _connection)| response)
}

/// An exchange's own upstream connection, open until this handle goes.
///
/// hyper closes a client connection once its response is read and no
/// handle to it is left. Dropped with the response head, the handle put
/// that close (a `shutdown`, an `epoll_ctl` and a `close`) on the borrower's
/// path, before the last byte was handed on; held by the exchange until it
/// ends, the close runs after it (issue 31).
pub struct UpstreamConnection {
    _sender: hyper::client::conn::http1::SendRequest<ProxyBody>,
}

impl std::fmt::Debug for UpstreamConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConnection").finish_non_exhaustive()
    }
}

/// [`exchange`], whose upstream connection is closed the moment `cut` is
/// (RECL-15): the upstream sees its client go away at once, whether or not
/// the borrower is still reading. The response body then ends early; its
/// reader must check `cut` before counting that end as clean. `connected`,
/// when given, is set the moment the connection is ready for the request
/// (the request's phases, `vacancyd_request_phase_seconds`). `early`, when
/// given, is the connection already being opened ([`Connecting`]). The
/// response comes with its connection's handle ([`UpstreamConnection`]).
pub async fn exchange_with_cut(
    target: &Target,
    request: http::Request<ProxyBody>,
    connect_timeout: Duration,
    cut: Option<CutSignal>,
    connected: Option<&OnceLock<Instant>>,
    early: Option<Connecting>,
) -> Result<(http::Response<Incoming>, UpstreamConnection), ExchangeError> {
    let stream = match early {
        Some(connecting) => connecting.connection().await,
        None => target.connect(connect_timeout).await,
    }
    .map_err(|e| ExchangeError::Connect {
        address: target.address(),
        reason: e.to_string(),
    })?;
    if let Some(at) = connected {
        let _ = at.set(Instant::now());
    }
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ExchangeError::AfterConnect(e.to_string()))?;
    tokio::spawn(async move {
        let conn = conn.with_upgrades();
        let cut = async {
            match cut {
                Some(signal) => cut_happens(signal).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = conn => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "upstream connection ended with an error");
                }
            }
            reason = cut => {
                tracing::debug!(reason = %reason, "upstream connection closed: cut by a reclaim");
            }
        }
    });
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| ExchangeError::AfterConnect(e.to_string()))?;
    Ok((response, UpstreamConnection { _sender: sender }))
}

/// Prepare an upstream response for the borrower: hop-by-hop headers dropped,
/// and `X-Accel-Buffering: no` on streams so no buffering proxy in front holds them.
pub fn prepare_response_head(parts: &mut http::response::Parts) {
    if parts.status != http::StatusCode::SWITCHING_PROTOCOLS {
        strip_hop_by_hop(&mut parts.headers);
    }
    let streaming = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_streamed_type);
    if streaming {
        parts
            .headers
            .insert("x-accel-buffering", HeaderValue::from_static("no"));
    }
}

/// Whether a `Content-Type` is one of a stream of events: server-sent events
/// or newline-delimited JSON (Ollama's `application/x-ndjson`). Looked for
/// at each `n`, not with `str::contains`, whose searcher cost more than the
/// rest of the check on every relayed response (issue 31).
fn is_streamed_type(content_type: &str) -> bool {
    let bytes = content_type.as_bytes();
    content_type.starts_with("text/event-stream")
        || bytes
            .iter()
            .enumerate()
            .any(|(i, &b)| b == b'n' && bytes[i..].starts_with(b"ndjson"))
}

/// A relayed response body that never fails on its first poll, so that
/// hyper writes the response head to the borrower before the body breaks.
///
/// Without it, a body that fails on its first poll (the upstream sent its
/// head, then broke off inside the first chunk-size line) makes hyper close
/// the borrower's connection with the head still unwritten: the borrower
/// would get no answer at all. With it that error waits one poll (the head
/// is written meanwhile) and the borrower gets the head and a body that
/// breaks off, as for a break later in the body (issue 18 item 2). A first
/// poll with data or nothing yet passes straight through: no extra trip
/// through the scheduler for every response (issue 31).
pub fn head_first<B>(body: B) -> ProxyBody
where
    B: hyper::body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    // Boxed once, here, around the body itself (issue 31: a box for the body
    // and another for this wrapper showed on every proxied read).
    HeadFirst {
        inner: body,
        polled: false,
        held_back: None,
    }
    .boxed_unsync()
}

struct HeadFirst<B> {
    inner: B,
    polled: bool,
    /// The first poll's error, answered at the next poll.
    held_back: Option<BoxError>,
}

impl<B> hyper::body::Body for HeadFirst<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> FramePoll {
        if let Some(e) = self.held_back.take() {
            return std::task::Poll::Ready(Some(Err(e)));
        }
        let first = !self.polled;
        self.polled = true;
        match std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            std::task::Poll::Ready(Some(Err(e))) if first => {
                self.held_back = Some(e.into());
                cx.waker().wake_by_ref();
                std::task::Poll::Pending
            }
            other => other.map(|frame| frame.map(|r| r.map_err(Into::into))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.polled && self.held_back.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A body from bytes.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A streaming body, forwarded as it arrives. One already at its end (a
/// request without a body: most reads) becomes the empty body, which boxes
/// nothing (issue 31).
pub fn streaming<B>(body: B) -> ProxyBody
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    if body.is_end_stream() {
        return ProxyBody::default();
    }
    body.map_err(Into::into).boxed_unsync()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn targets_keep_their_prefix_and_default_port() {
        let t = Target::parse("http://127.0.0.1:8080/base/").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.prefix.as_str()),
            ("127.0.0.1", 8080, "/base")
        );
        let t = Target::parse("http://localhost").unwrap();
        assert_eq!((t.port, t.prefix.as_str()), (80, ""));
        let t = Target::parse("http://[::1]:9000").unwrap();
        assert_eq!(t.host, "::1");
        assert!(
            Target::parse("https://h:1")
                .unwrap_err()
                .to_string()
                .contains("http://")
        );
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-private"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer b"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key(header::AUTHORIZATION));
    }

    #[test]
    fn upgrades_keep_their_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(is_upgrade(&h));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.get(header::UPGRADE).unwrap(), "websocket");
        assert_eq!(h.get(header::CONNECTION).unwrap(), "upgrade");
    }

    /// The parts of a borrower request with no body.
    fn head(request: http::request::Builder) -> http::request::Parts {
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn upstream_request_prepends_the_prefix_and_sets_host() {
        let t = Target::parse("http://127.0.0.1:8080/p").unwrap();
        let parts = head(
            http::Request::post("/v1/chat/completions?x=1")
                .header(header::HOST, "proxy:1")
                .header(header::CONTENT_LENGTH, "2"),
        );
        let req = upstream_request(&t, parts, full("{}")).unwrap();
        assert_eq!(req.uri(), "/p/v1/chat/completions?x=1");
        assert_eq!(req.headers()[header::HOST], "127.0.0.1:8080");
        assert!(!req.headers().contains_key(header::CONTENT_LENGTH));
    }

    #[test]
    fn upstream_request_goes_out_as_http_1_1_without_the_borrowers_extensions() {
        // The borrower's head becomes the upstream's (issue 31): an HTTP/1.0
        // borrower's version and what the listener put on its request stay
        // behind.
        #[derive(Clone)]
        struct OnTheBorrowersSide;
        let t = Target::parse("http://127.0.0.1:8080").unwrap();
        let mut parts = head(
            http::Request::get("/v1/models")
                .version(http::Version::HTTP_10)
                .header(header::HOST, "proxy:1"),
        );
        parts.extensions.insert(OnTheBorrowersSide);
        let req = upstream_request(&t, parts, full("")).unwrap();
        assert_eq!(req.version(), http::Version::HTTP_11);
        assert!(req.extensions().get::<OnTheBorrowersSide>().is_none());
        assert_eq!(req.uri(), "/v1/models");
        assert_eq!(req.method(), http::Method::GET);
    }

    #[test]
    fn upstream_request_keeps_host_first_and_the_borrowers_headers_in_order() {
        // The headers are moved, not copied (issue 31); Host is overwritten
        // in its place, first, where clients put it (RFC 9110 §7.2).
        let t = Target::parse("http://127.0.0.1:8080").unwrap();
        let parts = head(
            http::Request::get("/v1/models")
                .header(header::HOST, "proxy:1")
                .header(header::ACCEPT, "application/json")
                .header(header::CONNECTION, "keep-alive")
                .header(header::USER_AGENT, "OpenAI/Python 1.0")
                .header(header::AUTHORIZATION, "Bearer b"),
        );
        let req = upstream_request(&t, parts, full("")).unwrap();
        let names: Vec<&str> = req.headers().keys().map(HeaderName::as_str).collect();
        assert_eq!(names[0], "host");
        assert_eq!(req.headers()[header::HOST], "127.0.0.1:8080");
        assert!(!req.headers().contains_key(header::CONNECTION));
        for kept in ["accept", "user-agent", "authorization"] {
            assert!(names.contains(&kept), "{names:?}");
        }
    }

    #[test]
    fn every_connection_header_and_the_names_each_lists_are_dropped() {
        let mut h = HeaderMap::new();
        h.append(header::CONNECTION, HeaderValue::from_static("Keep-Alive"));
        h.append(
            header::CONNECTION,
            HeaderValue::from_static(" X-Hop , , not a name"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        strip_hop_by_hop(&mut h);
        assert_eq!(
            h.keys().map(HeaderName::as_str).collect::<Vec<_>>(),
            ["content-type"]
        );
    }

    #[test]
    fn every_hop_by_hop_name_is_found_and_the_indexes_name_their_headers() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_index(name), Some(i), "{name}");
        }
        assert_eq!(HOP_BY_HOP[CONNECTION_INDEX], header::CONNECTION);
        assert_eq!(HOP_BY_HOP[UPGRADE_INDEX], header::UPGRADE);
        for other in [header::CONTENT_TYPE, header::DATE, header::HOST] {
            assert_eq!(hop_by_hop_index(&other), None);
        }
    }

    /// The rule itself, written plainly: every `Connection` token's field
    /// removed, then every hop-by-hop field; an upgrade keeps its two.
    fn strip_plainly(headers: &mut HeaderMap) {
        let upgrade_value = is_upgrade(headers)
            .then(|| headers.get(header::UPGRADE).cloned())
            .flatten();
        let listed: Vec<String> = connection_tokens(headers.get_all(header::CONNECTION))
            .map(str::to_owned)
            .collect();
        for token in listed {
            headers.remove(token.as_str());
        }
        for name in &HOP_BY_HOP {
            headers.remove(name);
        }
        if let Some(v) = upgrade_value {
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            headers.insert(header::UPGRADE, v);
        }
    }

    #[test]
    fn each_hop_by_hop_name_is_told_at_its_own_place_and_no_other_name_is() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_index(name), Some(i), "{name}");
        }
        for other in [
            "content-type",
            "date",
            "server",
            "host",
            "tes",
            "upgrades",
            "x-hop",
        ] {
            assert_eq!(
                hop_by_hop_index(&HeaderName::from_static(other)),
                None,
                "{other}"
            );
        }
        assert_eq!(
            CONNECTION_INDEX,
            hop_by_hop_index(&header::CONNECTION).unwrap()
        );
        assert_eq!(UPGRADE_INDEX, hop_by_hop_index(&header::UPGRADE).unwrap());
    }

    #[test]
    fn streamed_types_are_told_from_the_rest() {
        for streamed in [
            "text/event-stream",
            "text/event-stream; charset=utf-8",
            "application/x-ndjson",
            "application/ndjson",
        ] {
            assert!(is_streamed_type(streamed), "{streamed}");
        }
        for other in [
            "application/json",
            "text/plain",
            "",
            "n",
            "ndjso",
            "application/nd-json",
        ] {
            assert!(!is_streamed_type(other), "{other}");
        }
    }

    proptest::proptest! {
        #[test]
        fn strip_hop_by_hop_removes_what_the_plain_rule_removes(
            fields in proptest::collection::vec(
                (
                    proptest::sample::select(vec![
                        "connection", "keep-alive", "proxy-connection", "te", "trailer",
                        "transfer-encoding", "upgrade", "content-type", "date", "x-hop",
                        "close", "authorization",
                    ]),
                    proptest::sample::select(vec![
                        "keep-alive", "Keep-Alive, x-hop", "close", "upgrade", " , ",
                        "x-hop,TE", "not a name", "websocket", "1",
                    ]),
                ),
                0..8,
            )
        ) {
            let mut h = HeaderMap::new();
            for (name, value) in fields {
                h.append(name, HeaderValue::from_static(value));
            }
            let mut plain = h.clone();
            strip_plainly(&mut plain);
            strip_hop_by_hop(&mut h);
            proptest::prop_assert_eq!(h, plain);
        }
    }

    #[test]
    fn a_message_without_hop_by_hop_headers_keeps_all_of_them() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("proxy:1"));
        h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        h.append(header::ACCEPT, HeaderValue::from_static("text/plain"));
        let before = h.clone();
        strip_hop_by_hop(&mut h);
        assert_eq!(h, before);
    }

    #[test]
    fn upstream_request_gives_the_proxys_own_origin_the_targets() {
        // Issue 14 item 5: Origin follows Host where it named the proxy.
        let t = Target::parse("http://127.0.0.1:8188").unwrap();
        let parts = head(
            http::Request::get("/ws?clientId=c")
                .header(header::HOST, "127.0.0.1:8189")
                .header(header::ORIGIN, "http://127.0.0.1:8189"),
        );
        let req = upstream_request(&t, parts, full("")).unwrap();
        assert_eq!(req.headers()[header::HOST], "127.0.0.1:8188");
        assert_eq!(req.headers()[header::ORIGIN], "http://127.0.0.1:8188");
    }
}
