//! The tray's view of the daemon: it follows the control plane's `/events`
//! stream (the one the console reads) and turns each status into a
//! [`TrayView`]; while the daemon cannot be reached it shows that, and tries
//! again every [`RETRY_SECS`] seconds.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use tracing::{debug, info};

use super::view::{NoSign, RETRY_SECS, TrayView};

/// The daemon pings an idle stream every 10 s; three missed pings end it.
const QUIET_LIMIT: Duration = Duration::from_secs(30);
/// The most one event may hold before the stream is given up as broken.
const MAX_EVENT: usize = 1 << 20;

/// Why one stream ended.
#[derive(Debug, thiserror::Error)]
enum StreamEnd {
    #[error("cannot reach it: {0}")]
    Unreachable(String),
    #[error("it answered {0} to /events")]
    Status(http::StatusCode),
    #[error("the stream broke: {0}")]
    Broken(String),
    #[error("nothing came for {} s", QUIET_LIMIT.as_secs())]
    Quiet,
    #[error("an event over {MAX_EVENT} bytes")]
    TooLarge,
    #[error("a status that is not JSON: {0}")]
    NotJson(String),
    #[error(transparent)]
    NoSign(#[from] NoSign),
    #[error("the stream ended")]
    Ended,
}

/// Follow the daemon at `base` forever, calling `show` with each view that
/// differs from the last.
pub async fn follow(base: &str, mut show: impl FnMut(TrayView)) {
    let base = base.trim_end_matches('/');
    let mut last: Option<TrayView> = None;
    let mut changed = |view: TrayView| {
        if last.as_ref() != Some(&view) {
            last = Some(view.clone());
            show(view);
        }
    };
    loop {
        let started = tokio::time::Instant::now();
        let end = stream(base, &mut changed).await;
        match end {
            // The daemon closes a stream after its longest life: follow the
            // next one at once, unless it ended as soon as it began.
            StreamEnd::Ended if started.elapsed() > Duration::from_secs(RETRY_SECS) => {
                debug!(
                    url = base,
                    "the daemon's event stream ended; following the next"
                );
                continue;
            }
            StreamEnd::Unreachable(_) => {
                debug!(url = base, reason = %end, "vacancyd is not reachable");
                changed(TrayView::not_running(base));
            }
            other => {
                info!(url = base, reason = %other, "the daemon's event stream ended");
                changed(TrayView::not_running(base));
            }
        }
        tokio::time::sleep(Duration::from_secs(RETRY_SECS)).await;
    }
}

/// One `/events` stream, until it ends.
async fn stream(base: &str, show: &mut impl FnMut(TrayView)) -> StreamEnd {
    let url = format!("{base}/events");
    let req = match http::Request::get(&url)
        .header(http::header::ACCEPT, "text/event-stream")
        .body(Empty::<Bytes>::new())
    {
        Ok(req) => req,
        Err(e) => return StreamEnd::Unreachable(e.to_string()),
    };
    let client: hyper_util::client::legacy::Client<_, Empty<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let resp = match tokio::time::timeout(QUIET_LIMIT, client.request(req)).await {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => return StreamEnd::Unreachable(e.to_string()),
        Err(_) => return StreamEnd::Quiet,
    };
    if resp.status() != http::StatusCode::OK {
        return StreamEnd::Status(resp.status());
    }
    let mut body = resp.into_body();
    let mut events = Events::default();
    loop {
        let frame = match tokio::time::timeout(QUIET_LIMIT, body.frame()).await {
            Err(_) => return StreamEnd::Quiet,
            Ok(None) => return StreamEnd::Ended,
            Ok(Some(Err(e))) => return StreamEnd::Broken(e.to_string()),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        match events.push(&data) {
            Ok(statuses) => {
                for status in statuses {
                    match serde_json::from_str::<serde_json::Value>(&status) {
                        Ok(doc) => match TrayView::of_status(&doc) {
                            Ok(view) => show(view),
                            Err(e) => return e.into(),
                        },
                        Err(e) => return StreamEnd::NotJson(e.to_string()),
                    }
                }
            }
            Err(end) => return end,
        }
    }
}

/// Server-sent events split from the bytes as they come: the `data` of each
/// `status` event.
#[derive(Debug, Default)]
struct Events {
    pending: String,
}

impl Events {
    fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, StreamEnd> {
        self.pending.push_str(&String::from_utf8_lossy(bytes));
        if self.pending.len() > MAX_EVENT {
            return Err(StreamEnd::TooLarge);
        }
        let mut statuses = Vec::new();
        while let Some(end) = self.pending.find("\n\n") {
            let event: String = self.pending.drain(..end + 2).collect();
            let mut name = "message";
            let mut data = String::new();
            for line in event.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = v.trim();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            if name == "status" {
                statuses.push(data);
            }
        }
        Ok(statuses)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn status_events_are_split_as_they_come_and_pings_skipped() {
        let mut e = Events::default();
        assert!(
            e.push(b"retry: 2000\n\nevent: status\ndata: {\"a\"")
                .unwrap()
                .is_empty()
        );
        let got = e
            .push(b":1}\n\nevent: ping\ndata: {}\n\nevent: status\ndata: {}\n\n")
            .unwrap();
        assert_eq!(got, vec!["{\"a\":1}".to_owned(), "{}".to_owned()]);
    }

    #[test]
    fn an_endless_event_is_refused() {
        let mut e = Events::default();
        let big = vec![b'x'; MAX_EVENT + 1];
        assert!(matches!(e.push(&big), Err(StreamEnd::TooLarge)));
    }

    // The tray against a port nobody listens on: "not running", then again
    // after each retry, shown once.
    #[tokio::test(start_paused = true)]
    async fn without_a_daemon_it_shows_not_running_once() {
        // Bound and never listened on: refused while it lives, and no other
        // test's port 0 can be given it.
        let refusing = tokio::net::TcpSocket::new_v4().unwrap();
        refusing.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let url = format!("http://{}", refusing.local_addr().unwrap());
        let mut seen = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(7), follow(&url, |v| seen.push(v))).await;
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].state_name(), "not_running");
    }
}
