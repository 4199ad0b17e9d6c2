//! The observation client: small, bounded JSON reads of the upstream, made
//! with vacancy's own credential only.

use std::error::Error as _;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use vacancy::traits::ObserveError;

use super::AdapterSettings;

/// Why an observation read failed, before an adapter decides what it means.
///
/// # Behavior
///
/// Adapters that need to tell an HTTP error status apart from a broken
/// answer (llama.cpp: `/slots` disabled is "no evidence", `/slots` garbage is
/// malformed) match on this; everything else converts it into an
/// [`ObserveError`] with `?` (OBS-02, OBS-03).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// No answer: connect failure, timeout, or the connection broke off.
    #[error("{0}")]
    Unreachable(String),
    /// 401 or 403: the observation needs a credential, or refused the one sent (OBS-02).
    #[error("{what} answered {status}{detail}")]
    Unauthorized {
        /// The request, e.g. `GET /slots`.
        what: String,
        /// The status.
        status: http::StatusCode,
        /// The upstream's own error message, `": ..."`, or empty.
        detail: String,
    },
    /// Another status outside 2xx.
    #[error("{what} answered {status}{detail}")]
    Status {
        /// The request, e.g. `GET /slots`.
        what: String,
        /// The status.
        status: http::StatusCode,
        /// The upstream's own error message, `": ..."`, or empty.
        detail: String,
    },
    /// A 2xx answer that is not usable JSON, or larger than the limit (OBS-03).
    #[error("{0}")]
    Malformed(String),
}

impl FetchError {
    /// The HTTP status the upstream answered, for status errors.
    ///
    /// `Some` for [`FetchError::Unauthorized`] and [`FetchError::Status`] only.
    pub fn status(&self) -> Option<http::StatusCode> {
        match self {
            FetchError::Unauthorized { status, .. } | FetchError::Status { status, .. } => {
                Some(*status)
            }
            FetchError::Unreachable(_) | FetchError::Malformed(_) => None,
        }
    }

    /// Whether the upstream says the endpoint does not exist or is switched
    /// off (404 or 501), as servers answer for optional endpoints.
    ///
    /// Any other status, and every failure without a status, is `false`.
    pub fn is_absent(&self) -> bool {
        matches!(
            self.status(),
            Some(http::StatusCode::NOT_FOUND | http::StatusCode::NOT_IMPLEMENTED)
        )
    }
}

impl From<FetchError> for ObserveError {
    /// # Behavior
    ///
    /// Unreachable stays unreachable; 401/403 is `Unauthorized` (OBS-02); any
    /// other status outside 2xx and any unusable answer is `Malformed`, never
    /// an observation (OBS-03).
    fn from(e: FetchError) -> Self {
        match e {
            FetchError::Unreachable(why) => ObserveError::Unreachable(why),
            e @ FetchError::Unauthorized { .. } => ObserveError::Unauthorized(e.to_string()),
            e @ FetchError::Status { .. } => ObserveError::Malformed(e.to_string()),
            FetchError::Malformed(why) => ObserveError::Malformed(why),
        }
    }
}

/// A small HTTP/1 client for an adapter's observation reads.
///
/// # Behavior
///
/// - Each read is `GET target-prefix + path` with no header but `Host`, and
///   the configured `[upstream.credential]` when there is one: borrower
///   headers never reach it (OBS-01, OBS-02).
/// - A read is bounded by the settings' `observe_timeout` (connect to last
///   byte) and by [`ObservationClient::BODY_LIMIT`].
/// - 401/403 is [`FetchError::Unauthorized`], a failed connect or a timeout
///   [`FetchError::Unreachable`], another non-2xx [`FetchError::Status`], and a
///   2xx answer that is not JSON [`FetchError::Malformed`] (OBS-03).
/// - Connections are not pooled: observations are rare, and a pooled
///   connection the upstream closed meanwhile (llama-server keeps idle
///   connections 5 s) would turn into a spurious failure.
/// - Plain `http://` only: an `https://` target is reported as unreachable
///   with the reason, never read without TLS.
#[derive(Clone)]
pub struct ObservationClient {
    client: Client<HttpConnector, Full<Bytes>>,
    target: http::Uri,
    credential: Option<(http::HeaderName, http::HeaderValue)>,
    timeout: Duration,
}

impl std::fmt::Debug for ObservationClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObservationClient")
            .field("target", &self.target)
            .field("credential", &self.credential.as_ref().map(|(n, _)| n))
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The most of an error answer read for its message.
const ERROR_BODY_LIMIT: usize = 64 * 1024;
/// The most characters of an upstream error message repeated in ours.
const DETAIL_CHARS: usize = 200;

impl ObservationClient {
    /// The largest answer an observation reads: 4 MiB.
    ///
    /// A larger 2xx answer is [`FetchError::Malformed`] (OBS-03).
    pub const BODY_LIMIT: usize = 4 * 1024 * 1024;

    /// A client for the settings' target, credential and timeout.
    ///
    /// Connects nothing; needs no runtime until the first read.
    pub fn new(settings: &AdapterSettings) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(settings.observe_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(connector);
        ObservationClient {
            client,
            target: settings.target.clone(),
            credential: settings.credential.clone(),
            timeout: settings.observe_timeout,
        }
    }

    /// The full path a route is read from: the target's prefix + `path`.
    ///
    /// `http://h:p/llm/` + `/slots` is `/llm/slots`; a target without a
    /// prefix reads `/slots`.
    pub fn full_path(&self, path: &str) -> String {
        format!("{}{}", self.target.path().trim_end_matches('/'), path)
    }

    /// `GET path` as JSON, as an [`ObserveError`] on failure.
    ///
    /// # Behavior
    ///
    /// [`ObservationClient::fetch_json`], with its error converted: 401/403 is
    /// `Unauthorized` (OBS-02), a failed connect or a timeout `Unreachable`,
    /// any other non-2xx or a malformed answer `Malformed` (OBS-03).
    pub async fn get_json(&self, path: &str) -> Result<serde_json::Value, ObserveError> {
        Ok(self.fetch_json(path).await?)
    }

    /// `GET path` (relative to the target's prefix) as JSON.
    ///
    /// # Behavior
    ///
    /// See [`ObservationClient`]: bounded in time and size, vacancy's own
    /// credential only (OBS-01/02), a 2xx answer that is not JSON is
    /// [`FetchError::Malformed`] (OBS-03).
    pub async fn fetch_json(&self, path: &str) -> Result<serde_json::Value, FetchError> {
        self.exchange_json(http::Method::GET, path, None).await
    }

    /// `GET path` (relative to the target's prefix) as UTF-8 text, e.g. a
    /// Prometheus `/metrics` page.
    ///
    /// # Behavior
    ///
    /// As [`ObservationClient::fetch_json`]: bounded in time and size,
    /// vacancy's own credential only; a 2xx answer that is not UTF-8 is
    /// [`FetchError::Malformed`] (OBS-03).
    pub async fn fetch_text(&self, path: &str) -> Result<String, FetchError> {
        let (request, what) = self.request(http::Method::GET, path, None)?;
        let read = async {
            let (_, body) = self.read_bytes(request, &what).await?;
            String::from_utf8(body.to_vec()).map_err(|e| {
                FetchError::Malformed(format!("{what}: the answer is not UTF-8 text: {e}"))
            })
        };
        match tokio::time::timeout(self.timeout, read).await {
            Ok(result) => result,
            Err(_) => Err(FetchError::Unreachable(format!(
                "{what}: no complete answer within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }

    /// `POST path` with a JSON body, read as JSON, as an [`ObserveError`] on failure.
    ///
    /// # Behavior
    ///
    /// As [`ObservationClient::get_json`], for the reads an upstream only
    /// answers to a POST (Ollama's `/api/show`) and for vacancy's own control
    /// requests (Ollama's unload): vacancy's credential only, bounded.
    pub async fn post_json(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, FetchError> {
        self.exchange_json(
            http::Method::POST,
            path,
            Some(body.to_string().into_bytes()),
        )
        .await
    }

    /// `POST path` with a JSON body, for a control request whose answer is
    /// only its status (ComfyUI's `POST /queue`, `/interrupt`, `/free` answer
    /// an empty 200).
    ///
    /// # Behavior
    ///
    /// Vacancy's credential only (OBS-02), bounded by the client's timeout
    /// from sending to the end of the answer (read up to 64 KiB and dropped).
    /// A 2xx answer is `Ok(status)`; any other is [`FetchError::Status`] or
    /// [`FetchError::Unauthorized`] with the upstream's message.
    pub async fn post_for_status(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<http::StatusCode, FetchError> {
        let (request, what) = self.request(
            http::Method::POST,
            path,
            Some(body.to_string().into_bytes()),
        )?;
        let exchange = async {
            let response = self.send(request, &what).await?;
            let status = response.status();
            if !status.is_success() {
                return Err(status_error(response, &what).await);
            }
            let _ = Limited::new(response.into_body(), ERROR_BODY_LIMIT)
                .collect()
                .await;
            Ok(status)
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(FetchError::Unreachable(format!(
                "{what}: no complete answer within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }

    /// `GET path` (relative to the target's prefix), answered as a stream.
    ///
    /// # Behavior
    ///
    /// - Sends vacancy's own credential only, like every observation
    ///   (OBS-01/02), and returns as soon as the response head arrives: the
    ///   body is not collected, so a caller can scan a reply far larger than
    ///   [`ObservationClient::BODY_LIMIT`] as it arrives (ComfyUI's
    ///   `/queue`, COMFY-30). The caller bounds the body read.
    /// - `head_timeout` bounds the wait from sending the request to the
    ///   response head; past it the read is [`FetchError::Unreachable`].
    /// - A non-2xx answer is [`FetchError::Unauthorized`] or
    ///   [`FetchError::Status`], as for [`ObservationClient::fetch_json`].
    pub async fn get_streaming(
        &self,
        path: &str,
        head_timeout: Duration,
    ) -> Result<StreamingResponse, FetchError> {
        let (request, what) = self.request(http::Method::GET, path, None)?;
        let sent_at = tokio::time::Instant::now();
        let response = match tokio::time::timeout(head_timeout, self.send(request, &what)).await {
            Ok(response) => response?,
            Err(_) => {
                return Err(FetchError::Unreachable(format!(
                    "{what}: no response head within {} ms",
                    head_timeout.as_millis()
                )));
            }
        };
        let status = response.status();
        if !status.is_success() {
            return Err(status_error(response, &what).await);
        }
        Ok(StreamingResponse {
            what,
            status,
            sent_at,
            body: response.into_body(),
        })
    }

    async fn exchange_json(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<serde_json::Value, FetchError> {
        let (request, what) = self.request(method, path, body)?;
        match tokio::time::timeout(self.timeout, self.read(request, &what)).await {
            Ok(result) => result,
            Err(_) => Err(FetchError::Unreachable(format!(
                "{what}: no complete answer within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }

    /// The request for `method path`, with vacancy's credential, and its
    /// description (`GET /llm/slots`).
    fn request(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(http::Request<Full<Bytes>>, String), FetchError> {
        let full = self.full_path(path);
        let what = format!("{method} {full}");
        let uri = self.uri(&full, &what)?;
        let mut request = http::Request::builder().method(method).uri(uri);
        if let Some((name, value)) = &self.credential {
            request = request.header(name, value);
        }
        if body.is_some() {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        let body = Full::new(Bytes::from(body.unwrap_or_default()));
        let request = request.body(body).map_err(|e| {
            FetchError::Unreachable(format!("{what}: cannot build the request: {e}"))
        })?;
        Ok((request, what))
    }

    fn uri(&self, full: &str, what: &str) -> Result<http::Uri, FetchError> {
        match self.target.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("http") => {}
            other => {
                return Err(FetchError::Unreachable(format!(
                    "{what}: the observation client speaks plain http only, and the target's scheme is {}",
                    other.unwrap_or("missing")
                )));
            }
        }
        let Some(authority) = self.target.authority() else {
            return Err(FetchError::Unreachable(format!(
                "{what}: the target {} has no host",
                self.target
            )));
        };
        http::Uri::builder()
            .scheme("http")
            .authority(authority.clone())
            .path_and_query(full)
            .build()
            .map_err(|e| FetchError::Unreachable(format!("{what}: not a valid URL: {e}")))
    }

    async fn send(
        &self,
        request: http::Request<Full<Bytes>>,
        what: &str,
    ) -> Result<http::Response<Incoming>, FetchError> {
        self.client.request(request).await.map_err(|e| {
            if is_parse_error(&e) {
                FetchError::Malformed(format!("{what}: the answer is not HTTP: {}", chain(&e)))
            } else {
                FetchError::Unreachable(format!("{what}: {}", chain(&e)))
            }
        })
    }

    async fn read(
        &self,
        request: http::Request<Full<Bytes>>,
        what: &str,
    ) -> Result<serde_json::Value, FetchError> {
        let (content_type, body) = self.read_bytes(request, what).await?;
        serde_json::from_slice(&body).map_err(|e| {
            let found = content_type.map_or_else(String::new, |c| format!(" ({c})"));
            FetchError::Malformed(format!("{what}: the answer is not JSON{found}: {e}"))
        })
    }

    /// A 2xx answer's content type and body, bounded by [`Self::BODY_LIMIT`].
    async fn read_bytes(
        &self,
        request: http::Request<Full<Bytes>>,
        what: &str,
    ) -> Result<(Option<String>, Bytes), FetchError> {
        let response = self.send(request, what).await?;
        let status = response.status();
        if !status.is_success() {
            return Err(status_error(response, what).await);
        }
        // Named when the answer is not JSON: a web page (text/html) means
        // another program, or a web UI's catch-all, answers at this path.
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = Limited::new(response.into_body(), Self::BODY_LIMIT)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    FetchError::Malformed(format!(
                        "{what}: the answer is larger than {} MiB",
                        Self::BODY_LIMIT >> 20
                    ))
                } else {
                    FetchError::Unreachable(format!("{what}: the answer broke off: {e}"))
                }
            })?
            .to_bytes();
        Ok((content_type, body))
    }
}

/// A 2xx answer whose body is still to be read: see
/// [`ObservationClient::get_streaming`].
#[derive(Debug)]
pub struct StreamingResponse {
    /// The request, e.g. `GET /comfy/queue`, for error messages and logs.
    pub what: String,
    /// The answer's status (2xx).
    pub status: http::StatusCode,
    /// When the request was sent: time limits on the body count from here.
    pub sent_at: tokio::time::Instant,
    /// The body, unread.
    pub body: Incoming,
}

/// A non-2xx answer as [`FetchError::Unauthorized`] (401/403) or
/// [`FetchError::Status`], with the upstream's own message when it sent one.
async fn status_error(response: http::Response<Incoming>, what: &str) -> FetchError {
    let status = response.status();
    let body = Limited::new(response.into_body(), ERROR_BODY_LIMIT)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let detail = error_detail(&body);
    let what = what.to_owned();
    if status == http::StatusCode::UNAUTHORIZED || status == http::StatusCode::FORBIDDEN {
        FetchError::Unauthorized {
            what,
            status,
            detail,
        }
    } else {
        FetchError::Status {
            what,
            status,
            detail,
        }
    }
}

fn is_parse_error(e: &hyper_util::client::legacy::Error) -> bool {
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            return h.is_parse() || h.is_parse_status();
        }
        source = s.source();
    }
    false
}

/// An error with its sources, `outer: inner: innermost`, without repeats.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// The upstream's own error message (`{"error":{"message":..}}`,
/// `{"error":".."}`, `{"message":".."}` or `{"detail":".."}`), shortened and
/// stripped of control characters; empty when there is none.
fn error_detail(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return String::new();
    };
    let message = v
        .pointer("/error/message")
        .or_else(|| v.get("error"))
        .or_else(|| v.get("message"))
        .or_else(|| v.get("detail"))
        .and_then(serde_json::Value::as_str);
    match message {
        Some(m) if !m.trim().is_empty() => {
            let clean: String = m
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .take(DETAIL_CHARS)
                .collect();
            format!(": {}", clean.trim())
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::common::testing::{Reply, TestServer};
    use vacancy::MonotonicClock;

    fn client(server: &TestServer, prefix: &str) -> ObservationClient {
        let target = format!("http://{}{prefix}", server.addr()).parse().unwrap();
        ObservationClient::new(&AdapterSettings::new(target, MonotonicClock::new()))
    }

    #[tokio::test]
    async fn reads_json_under_the_target_prefix() {
        let server = TestServer::start(|req| match req.path.as_str() {
            "/llm/slots" => Reply::json(200, r#"[{"id":0,"is_processing":false}]"#),
            _ => Reply::json(404, r#"{"error":{"message":"File Not Found"}}"#),
        })
        .await;
        let c = client(&server, "/llm/");
        let v = c.get_json("/slots").await.unwrap();
        assert_eq!(v[0]["is_processing"], false);
        assert_eq!(server.requests()[0].path, "/llm/slots");
    }

    #[tokio::test]
    async fn sends_only_vacancys_credential() {
        // OBS-01, OBS-02
        let server = TestServer::start(|req| {
            if req.header("x-api-key").as_deref() == Some("vacancy-key") {
                Reply::json(200, "{}")
            } else {
                Reply::json(401, r#"{"error":{"message":"Invalid API Key"}}"#)
            }
        })
        .await;
        let target: http::Uri = format!("http://{}", server.addr()).parse().unwrap();
        let plain =
            ObservationClient::new(&AdapterSettings::new(target.clone(), MonotonicClock::new()));
        let err = plain.get_json("/props").await.unwrap_err();
        assert_eq!(
            err,
            ObserveError::Unauthorized(
                "GET /props answered 401 Unauthorized: Invalid API Key".into()
            )
        );
        let keyed = ObservationClient::new(
            &AdapterSettings::new(target, MonotonicClock::new()).with_credential(
                http::HeaderName::from_static("x-api-key"),
                http::HeaderValue::from_static("vacancy-key"),
            ),
        );
        keyed.get_json("/props").await.unwrap();
        let reqs = server.requests();
        assert_eq!(reqs[0].header("x-api-key"), None);
        assert_eq!(reqs[1].header("x-api-key").as_deref(), Some("vacancy-key"));
        assert_eq!(reqs[1].header("authorization"), None);
    }

    #[tokio::test]
    async fn forbidden_is_unauthorized_and_other_statuses_are_malformed() {
        // OBS-02, OBS-03
        let server = TestServer::start(|req| match req.path.as_str() {
            "/forbidden" => Reply::json(403, "{}"),
            "/disabled" => Reply::json(
                501,
                r#"{"error":{"code":501,"message":"This server does not support slots endpoint.\nStart it with `--slots`"}}"#,
            ),
            _ => Reply::text(500, "boom"),
        })
        .await;
        let c = client(&server, "");
        assert!(matches!(
            c.get_json("/forbidden").await,
            Err(ObserveError::Unauthorized(m)) if m == "GET /forbidden answered 403 Forbidden"
        ));
        let err = c.fetch_json("/disabled").await.unwrap_err();
        assert_eq!(err.status(), Some(http::StatusCode::NOT_IMPLEMENTED));
        assert_eq!(
            ObserveError::from(err),
            ObserveError::Malformed(
                "GET /disabled answered 501 Not Implemented: This server does not support slots endpoint. Start it with `--slots`".into()
            )
        );
        assert_eq!(
            c.get_json("/x").await,
            Err(ObserveError::Malformed(
                "GET /x answered 500 Internal Server Error".into()
            ))
        );
    }

    #[tokio::test]
    async fn an_answer_that_is_not_json_is_malformed() {
        // OBS-03
        let server = TestServer::start(|req| match req.path.as_str() {
            "/html" => Reply::text(200, "<html>hello</html>"),
            "/huge" => Reply::json(200, &" ".repeat(ObservationClient::BODY_LIMIT + 1)),
            _ => Reply::raw(b"NOT HTTP AT ALL\r\n\r\n".to_vec()),
        })
        .await;
        let c = client(&server, "");
        let Err(ObserveError::Malformed(m)) = c.get_json("/html").await else {
            panic!("not malformed");
        };
        assert!(
            m.starts_with("GET /html: the answer is not JSON (text/plain")
                && m.contains("): expected value"),
            "{m}"
        );
        let Err(ObserveError::Malformed(m)) = c.get_json("/huge").await else {
            panic!("not malformed");
        };
        assert!(m.contains("larger than 4 MiB"), "{m}");
        let Err(ObserveError::Malformed(m)) = c.get_json("/garbage").await else {
            panic!("not malformed");
        };
        assert!(m.contains("not HTTP"), "{m}");
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable() {
        let refusing = crate::common::testing::closed_port();
        let port = refusing.addr().port();
        let c = ObservationClient::new(&AdapterSettings::new(
            format!("http://127.0.0.1:{port}").parse().unwrap(),
            MonotonicClock::new(),
        ));
        let Err(ObserveError::Unreachable(m)) = c.get_json("/slots").await else {
            panic!("not unreachable");
        };
        assert!(m.starts_with("GET /slots: "), "{m}");
        assert!(m.to_lowercase().contains("refused"), "{m}");
    }

    #[tokio::test]
    async fn a_silent_upstream_times_out_as_unreachable() {
        let server = TestServer::start(|_| Reply::Hang).await;
        let target = format!("http://{}", server.addr()).parse().unwrap();
        let c = ObservationClient::new(
            &AdapterSettings::new(target, MonotonicClock::new())
                .with_observe_timeout(Duration::from_millis(150)),
        );
        assert_eq!(
            c.get_json("/slots").await,
            Err(ObserveError::Unreachable(
                "GET /slots: no complete answer within 150 ms".into()
            ))
        );
    }

    #[tokio::test]
    async fn https_targets_are_refused_with_the_reason() {
        let c = ObservationClient::new(&AdapterSettings::new(
            "https://127.0.0.1:1/x".parse().unwrap(),
            MonotonicClock::new(),
        ));
        let Err(ObserveError::Unreachable(m)) = c.get_json("/slots").await else {
            panic!("not unreachable");
        };
        assert!(m.contains("plain http only") && m.contains("https"), "{m}");
    }

    #[test]
    fn error_details_are_short_and_single_line() {
        assert_eq!(
            error_detail(br#"{"error":"model not found"}"#),
            ": model not found"
        );
        assert_eq!(error_detail(br#"{"detail":"a\nb"}"#), ": a b");
        assert_eq!(error_detail(b"<html>"), "");
        assert_eq!(error_detail(br#"{"error":{"message":""}}"#), "");
        let long = format!(r#"{{"message":"{}"}}"#, "x".repeat(500));
        assert_eq!(error_detail(long.as_bytes()).len(), 2 + DETAIL_CHARS);
    }
}
