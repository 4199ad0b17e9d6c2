//! An OpenAI-compatible upstream whose every job takes the same wall time and
//! almost no CPU: for benchmarks of the proxy and a fleet, where a real model
//! on a shared two-core machine would measure the CPU instead.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use crate::background::{BackgroundServer, serve_http};
use crate::error::SupportError;

/// An upstream that answers each `POST` (e.g. `/v1/chat/completions`) after
/// exactly `job_time` with a small chat completion, and `GET /v1/models`
/// at once. It runs any number of jobs at once: put a
/// [`CountingShim`](crate::CountingShim) in front to count how many ran
/// together.
#[derive(Debug)]
pub struct FixedTimeUpstream {
    server: BackgroundServer,
    job_time: Duration,
}

impl FixedTimeUpstream {
    /// Starts one on a free 127.0.0.1 port, on a thread of its own.
    pub fn start(job_time: Duration) -> Result<Self, SupportError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| SupportError::io("fixed-time upstream: build its tokio runtime", e))?;
        let server = BackgroundServer::start("fixed-time", runtime, move |listener, stopped| {
            serve_http(listener, stopped, move |req| answer(req, job_time))
        })?;
        Ok(Self { server, job_time })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    /// How long each job takes.
    pub fn job_time(&self) -> Duration {
        self.job_time
    }
}

async fn answer(
    req: Request<Incoming>,
    job_time: Duration,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    // The whole request is read before the job "runs", as a server would.
    let _ = body.collect().await;
    let (status, json) = match (&parts.method, parts.uri.path()) {
        (&Method::GET, "/v1/models") => (
            StatusCode::OK,
            r#"{"object":"list","data":[{"id":"tiny","object":"model","owned_by":"fixed-time"}]}"#,
        ),
        (&Method::POST, _) => {
            tokio::time::sleep(job_time).await;
            (
                StatusCode::OK,
                r#"{"id":"chatcmpl-fixed","object":"chat.completion","model":"tiny","choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}]}"#,
            )
        }
        _ => (
            StatusCode::NOT_FOUND,
            r#"{"error":{"message":"no such route","type":"not_found_error"}}"#,
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from_static(json.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::http_request;

    #[tokio::test]
    async fn a_job_takes_at_least_its_fixed_time() {
        let up = FixedTimeUpstream::start(Duration::from_millis(300)).unwrap();
        let url = format!("{}/v1/chat/completions", up.base_url());
        let t = std::time::Instant::now();
        let (a, b) = tokio::join!(
            http_request("POST", &url, &[], b"{}".to_vec()),
            http_request("POST", &url, &[], b"{}".to_vec())
        );
        let took = t.elapsed();
        assert_eq!(a.unwrap().status, 200);
        assert_eq!(b.unwrap().status, 200);
        assert!(took >= Duration::from_millis(300), "{took:?}");
        let models = http_request(
            "GET",
            &format!("{}/v1/models", up.base_url()),
            &[],
            Vec::new(),
        )
        .await
        .unwrap();
        assert_eq!(models.status, 200);
    }
}
