//! Small async HTTP clients for tests (hyper-util's client, one fresh connection
//! per request).

use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;

use crate::error::SupportError;

/// A whole HTTP response.
#[derive(Debug, Clone)]
pub struct HttpReply {
    /// The status code.
    pub status: u16,
    /// The response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl HttpReply {
    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON.
    pub fn json(&self) -> Result<serde_json::Value, SupportError> {
        serde_json::from_slice(&self.body).map_err(|e| SupportError::Invalid {
            what: "JSON body".into(),
            message: format!("{e}; body: {}", self.text()),
        })
    }
}

/// Sends one request and reads the whole response. `method` is e.g. `"POST"`,
/// `url` a plain `http://` URL. No timeout: wrap the call in
/// `tokio::time::timeout` where one matters.
pub async fn http_request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<HttpReply, SupportError> {
    let response = send(method, url, headers, body).await?;
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|e| SupportError::http(method, url, format!("read the body: {e}")))?
        .to_bytes();
    Ok(HttpReply {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
    })
}

/// One piece of a streamed response body, stamped when it arrived.
#[derive(Debug, Clone)]
pub struct Chunk {
    /// When the client received it.
    pub at: Instant,
    /// Its bytes.
    pub data: Bytes,
}

/// A response whose body is read as it arrives (see [`http_stream`]).
#[derive(Debug)]
pub struct HttpStream {
    /// The status code.
    pub status: u16,
    /// The response headers.
    pub headers: HeaderMap,
    chunks: mpsc::UnboundedReceiver<Result<Chunk, SupportError>>,
}

impl HttpStream {
    /// The next piece of the body; `None` at its end. An error ends the stream.
    pub async fn next_chunk(&mut self) -> Option<Result<Chunk, SupportError>> {
        self.chunks.recv().await
    }

    /// Reads the rest of the body, piece by piece.
    pub async fn collect_chunks(mut self) -> Result<Vec<Chunk>, SupportError> {
        let mut chunks = Vec::new();
        while let Some(chunk) = self.next_chunk().await {
            chunks.push(chunk?);
        }
        Ok(chunks)
    }
}

/// Sends one request and returns once the response head arrives. A task reads
/// the body and stamps each piece with its arrival time, whether or not the test
/// is reading at that moment, so a test can check that the first piece came well
/// before the last. Dropping the [`HttpStream`] closes the connection at once,
/// like a client that goes away mid-response.
pub async fn http_stream(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<HttpStream, SupportError> {
    let response = send(method, url, headers, body).await?;
    let (parts, mut body) = response.into_parts();
    let (tx, chunks) = mpsc::unbounded_channel();
    let (method, url) = (method.to_owned(), url.to_owned());
    tokio::spawn(async move {
        loop {
            let frame = tokio::select! {
                // The reader went away: drop the body, which closes the connection.
                () = tx.closed() => return,
                frame = body.frame() => frame,
            };
            let item = match frame {
                None => return,
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if data.is_empty() => continue,
                    Ok(data) => Ok(Chunk {
                        at: Instant::now(),
                        data,
                    }),
                    // Trailers carry no body bytes.
                    Err(_) => continue,
                },
                Some(Err(e)) => Err(SupportError::http(
                    &method,
                    &url,
                    format!("read the body: {e}"),
                )),
            };
            let failed = item.is_err();
            if tx.send(item).is_err() || failed {
                return;
            }
        }
    });
    Ok(HttpStream {
        status: parts.status.as_u16(),
        headers: parts.headers,
        chunks,
    })
}

async fn send(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<Response<Incoming>, SupportError> {
    let fail = |message: String| SupportError::http(method, url, message);
    let parsed_method =
        Method::from_bytes(method.as_bytes()).map_err(|e| fail(format!("bad method: {e}")))?;
    let mut request = Request::builder()
        .method(parsed_method)
        .uri(url)
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| fail(format!("bad request: {e}")))?;
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| fail(format!("bad header name {name:?}: {e}")))?;
        let value = HeaderValue::from_str(value)
            .map_err(|e| fail(format!("bad header value {value:?}: {e}")))?;
        request.headers_mut().append(name, value);
    }
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http();
    client.request(request).await.map_err(|e| {
        // The source chain says why (e.g. "Connection refused").
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        fail(message)
    })
}
