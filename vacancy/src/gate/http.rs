//! The probe's one HTTP call: POST a JSON body, read a JSON reply, within a
//! wall clock. Every failure is a reason string, never a panic.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Largest reply body read (a probe answer is a few hundred bytes).
const MAX_REPLY: usize = 1 << 20;

/// `base_url` (scheme, host, port and an optional path prefix) joined with `path`.
pub(crate) fn join(base_url: &str, path: &str) -> String {
    format!("{}{path}", base_url.trim_end_matches('/'))
}

/// POSTs `body` to `url` and parses a 2xx reply as JSON; the whole exchange
/// (connect, send, read) must finish within `timeout`.
pub(crate) async fn post_json(
    url: &str,
    body: &serde_json::Value,
    authorization: Option<&str>,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    match tokio::time::timeout(timeout, exchange(url, body, authorization)).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "POST {url}: no reply within {:.1} s",
            timeout.as_secs_f64()
        )),
    }
}

async fn exchange(
    url: &str,
    body: &serde_json::Value,
    authorization: Option<&str>,
) -> Result<serde_json::Value, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("POST {url}: invalid URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!("POST {url}: only http:// URLs are supported"));
    }
    let payload =
        serde_json::to_vec(body).map_err(|e| format!("POST {url}: encode request: {e}"))?;
    let mut request = http::Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json");
    if let Some(value) = authorization {
        request = request.header(http::header::AUTHORIZATION, value);
    }
    let request = request
        .body(Full::new(Bytes::from(payload)))
        .map_err(|e| format!("POST {url}: build request: {e}"))?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = client
        .request(request)
        .await
        .map_err(|e| format!("POST {url}: {}", error_chain(&e)))?;
    let status = response.status();
    let bytes = Limited::new(response.into_body(), MAX_REPLY)
        .collect()
        .await
        .map_err(|e| format!("POST {url}: read reply (HTTP {status}): {e}"))?
        .to_bytes();
    if !status.is_success() {
        return Err(format!(
            "POST {url}: HTTP {status}: {}",
            snippet(&String::from_utf8_lossy(&bytes))
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        format!(
            "POST {url}: malformed JSON reply ({e}): {}",
            snippet(&String::from_utf8_lossy(&bytes))
        )
    })
}

/// An error and its sources, `: `-joined (hyper's top error alone says little,
/// e.g. "client error (Connect)").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// At most 200 characters of `text`, for a reason string.
pub(crate) fn snippet(text: &str) -> String {
    const MAX: usize = 200;
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(MAX).collect();
    if chars.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn join_handles_trailing_slash_and_prefix() {
        assert_eq!(join("http://h:1/", "/completion"), "http://h:1/completion");
        assert_eq!(
            join("http://h:1/llm", "/completion"),
            "http://h:1/llm/completion"
        );
    }

    #[test]
    fn snippet_caps_length() {
        assert_eq!(snippet("abc"), "abc");
        assert_eq!(snippet(&"x".repeat(300)).chars().count(), 201);
    }

    #[tokio::test]
    async fn invalid_and_https_urls_are_reasons_not_panics() {
        let body = serde_json::json!({});
        let t = Duration::from_secs(1);
        assert!(post_json("not a url", &body, None, t).await.is_err());
        let e = post_json("https://127.0.0.1:1/x", &body, None, t)
            .await
            .unwrap_err();
        assert!(e.contains("only http://"), "{e}");
    }
}
