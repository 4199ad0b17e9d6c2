//! COMFY-35: a read that breaks a limit fails and is logged, naming the rule.
//!
//! In a test binary of its own: a scoped `tracing` subscriber misses events
//! while other tests on other threads meet the same callsite.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use hyper::body::{Body, Frame};
use vacancy_adapters::comfyui::stream::{
    ListPrompts, QueueScan, ReadError, ReadLimits, read_body_since,
};

/// Sends one chunk, then falls silent for ever.
struct StallingBody {
    first: Option<Bytes>,
}

impl Body for StallingBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.first.take() {
            Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
            // The timeout wakes the read; nothing else ever will.
            None => Poll::Pending,
        }
    }
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_silent_reply_is_logged_as_comfy_33() {
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let limits = ReadLimits {
        silence: Duration::from_millis(100),
        ..ReadLimits::default()
    };
    let body = StallingBody {
        first: Some(Bytes::from_static(b"{\"queue_running\": [")),
    };
    let got = read_body_since(
        "GET /queue",
        Instant::now(),
        body,
        &limits,
        QueueScan::new(ListPrompts::new()),
    )
    .await;
    assert_eq!(
        got,
        Err(ReadError::Silence {
            what: "GET /queue".into(),
            limit: Duration::from_millis(100),
            received: 19,
        })
    );
    let logged = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    assert!(logged.contains("WARN"), "{logged}");
    assert!(logged.contains("ComfyUI reply read failed"), "{logged}");
    assert!(logged.contains("rule=\"COMFY-33\""), "{logged}");
    assert!(
        logged.contains("GET /queue: the reply fell silent for 100 ms after 19 bytes (COMFY-33)"),
        "{logged}"
    );
}
