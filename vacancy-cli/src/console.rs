//! The owner console: one page of HTML, CSS and JavaScript modules embedded
//! in the binary at compile time (no build step, nothing from elsewhere),
//! and its live feed, a server-sent-events stream of the status document.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};
use tokio::sync::mpsc;
use tracing::debug;

use crate::control::state::{ControlState, MAX_EVENT_STREAMS};

/// The console's files: path, content type, content.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "/",
        "text/html; charset=utf-8",
        include_str!("console/index.html"),
    ),
    (
        "/console/app.js",
        "text/javascript; charset=utf-8",
        include_str!("console/app.js"),
    ),
    (
        "/console/chart.js",
        "text/javascript; charset=utf-8",
        include_str!("console/chart.js"),
    ),
    (
        "/console/style.css",
        "text/css; charset=utf-8",
        include_str!("console/style.css"),
    ),
];

/// Everything the page loads comes from this listener; nothing is inlined.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'";

/// How often a stream looks for a changed status.
const CHANGE_CHECK: Duration = Duration::from_millis(500);
/// A `ping` event at least this often keeps proxies and the browser from
/// closing an idle stream and shows the page the daemon still answers.
const KEEP_ALIVE: Duration = Duration::from_secs(10);
/// A stream ends after this long; the browser's `EventSource` reconnects
/// within its `retry` (2 s) and gets the whole status again. So a stream
/// nobody reads cannot hold one of [`MAX_EVENT_STREAMS`] for good (issue 30
/// item 2).
pub const MAX_STREAM_LIFE: Duration = Duration::from_secs(600);

/// Whether `path` is one of the console's files.
pub fn is_asset(path: &str) -> bool {
    ASSETS.iter().any(|(p, _, _)| *p == path)
}

/// The total size of the console's files (the page weight), in bytes.
#[cfg(test)]
pub fn page_weight() -> usize {
    ASSETS.iter().map(|(_, _, body)| body.len()).sum()
}

/// One of the console's files.
pub fn asset(
    path: &str,
) -> http::Response<http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>> {
    let (content_type, body) = ASSETS
        .iter()
        .find(|(p, _, _)| *p == path)
        .map_or(("text/plain", ""), |(_, t, b)| (*t, *b));
    let mut resp = http::Response::new(
        http_body_util::Full::new(Bytes::from_static(body.as_bytes())).boxed_unsync(),
    );
    let h = resp.headers_mut();
    for (name, value) in [
        ("content-type", content_type),
        ("cache-control", "no-cache"),
        ("content-security-policy", CSP),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("x-frame-options", "DENY"),
    ] {
        h.insert(name, http::HeaderValue::from_static(value));
    }
    resp
}

/// A response body fed from a channel.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// Releases a stream's place when its feeding task ends.
struct StreamSlot(Arc<ControlState>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.event_streams.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `GET /events`: `event: status` with the whole status document at once and
/// whenever it changes, `event: ping` in between.
pub fn events(
    state: &Arc<ControlState>,
) -> http::Response<http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>> {
    let open = state.event_streams.fetch_add(1, Ordering::AcqRel);
    let slot = StreamSlot(Arc::clone(state));
    if open >= MAX_EVENT_STREAMS {
        drop(slot);
        let body = serde_json::json!({"error": {"code": "busy", "message": format!("{MAX_EVENT_STREAMS} console streams are open already; close a console tab, or poll /status")}});
        let mut resp = http::Response::new(
            http_body_util::Full::new(Bytes::from(body.to_string())).boxed_unsync(),
        );
        *resp.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        resp.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("application/json"),
        );
        return resp;
    }
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        let mut last = String::new();
        let mut quiet = Duration::ZERO;
        let ends = tokio::time::Instant::now() + MAX_STREAM_LIFE;
        // Ask the browser to reconnect soon when the stream breaks.
        if tx
            .send(Bytes::from_static(b"retry: 2000\n\n"))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let doc = match serde_json::to_string(&slot.0.status()) {
                Ok(doc) => doc,
                Err(e) => {
                    debug!(error = %e, "cannot render status for the console stream");
                    return;
                }
            };
            let frame = if doc != last {
                quiet = Duration::ZERO;
                let frame = format!("event: status\ndata: {doc}\n\n");
                last = doc;
                Some(frame)
            } else if quiet >= KEEP_ALIVE {
                quiet = Duration::ZERO;
                Some("event: ping\ndata: {}\n\n".to_owned())
            } else {
                None
            };
            if let Some(frame) = frame
                && tx.send(Bytes::from(frame)).await.is_err()
            {
                return; // the console went away
            }
            tokio::select! {
                () = tokio::time::sleep(CHANGE_CHECK) => quiet += CHANGE_CHECK,
                () = tx.closed() => return,
                () = tokio::time::sleep_until(ends) => return, // the browser reconnects
            }
        }
    });
    let mut resp = http::Response::new(ChannelBody(rx).boxed_unsync());
    let h = resp.headers_mut();
    for (name, value) in [
        ("content-type", "text/event-stream"),
        ("cache-control", "no-cache"),
        ("x-content-type-options", "nosniff"),
    ] {
        h.insert(name, http::HeaderValue::from_static(value));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_weighs_under_200_kib() {
        assert!(page_weight() < 200 * 1024, "{} bytes", page_weight());
    }

    #[test]
    fn every_asset_the_page_names_is_served() {
        let page = ASSETS[0].2;
        for (path, _, _) in &ASSETS[1..] {
            let named = page.contains(path)
                || ASSETS
                    .iter()
                    .any(|(_, _, body)| body.contains(path.trim_start_matches("/console")));
            assert!(named, "{path} is served but nothing loads it");
        }
        assert!(
            !page.contains("http://") && !page.contains("https://"),
            "no outside resources"
        );
    }
}
