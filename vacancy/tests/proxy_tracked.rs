//! Tracked work through the real proxy (COMFY-01, COMFY-08, COMFY-09,
//! COMFY-11, COMFY-17, DONE-02): the reply is read whole and handed to the
//! borrower, the adapter's tracker gets what the exchange produced, and its
//! verdict releases or holds. The upstreams here are raw TCP servers, because
//! the faults (a reply that never comes, a connection cut after the request,
//! a body that breaks off) cannot be had from a real server on demand.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use vacancy::engine::{CompletionMethod, Phase};
use vacancy::testkit::{ProxyUnderTest, RefusingPort};
use vacancy::traits::{
    Adapter, InspectContext, InspectResult, Inspection, RouteClass, RouteMethod, RouteSpec,
    RouteTable, Submission, TrackedEnd, TrackedWork, Tracker, TrackingEvents, WorkRoute,
};

/// A tracker the test drives: each `track` call reports what it got and
/// waits for the test's verdict.
struct Remote {
    calls: mpsc::UnboundedSender<(TrackedWork, Submission, oneshot::Sender<TrackedEnd>)>,
}

#[async_trait]
impl Tracker for Remote {
    async fn track(
        &self,
        work: TrackedWork,
        submission: Submission,
        events: &dyn TrackingEvents,
    ) -> TrackedEnd {
        events.upstream_ref("upstream-own-id").await;
        let (tx, rx) = oneshot::channel();
        if self.calls.send((work, submission, tx)).is_err() {
            return TrackedEnd::Held("test gone".into());
        }
        rx.await.unwrap_or(TrackedEnd::Held("test gone".into()))
    }
}

struct Queued {
    routes: RouteTable,
    tracker: Arc<Remote>,
}

impl Adapter for Queued {
    fn name(&self) -> &str {
        "queued"
    }
    fn routes(&self) -> &RouteTable {
        &self.routes
    }
    fn inspect(&self, _r: &WorkRoute, _c: InspectContext<'_>, _b: &[u8]) -> InspectResult {
        Ok(Inspection {
            upstream_ref: Some("assigned-1".into()),
            ..Inspection::default()
        })
    }
    fn tracker(&self) -> Option<Arc<dyn Tracker>> {
        Some(Arc::clone(&self.tracker) as Arc<dyn Tracker>)
    }
}

type Calls = mpsc::UnboundedReceiver<(TrackedWork, Submission, oneshot::Sender<TrackedEnd>)>;

async fn proxy(upstream: SocketAddr) -> (ProxyUnderTest, Calls) {
    let (tx, rx) = mpsc::unbounded_channel();
    let tracked = WorkRoute {
        completion: CompletionMethod::Tracked,
        inspect_body: true,
        websocket: false,
    };
    let adapter = Queued {
        routes: RouteTable::new(vec![RouteSpec::new(
            RouteMethod::Post,
            "/submit",
            RouteClass::Work(tracked),
        )])
        .unwrap(),
        tracker: Arc::new(Remote { calls: tx }),
    };
    (
        ProxyUnderTest::start(Arc::new(adapter), upstream)
            .await
            .unwrap(),
        rx,
    )
}

#[derive(Clone, Copy)]
enum Behaviour {
    /// Answer with these bytes after reading the request head and body.
    Reply(&'static [u8]),
    /// Read the request, then close without a byte.
    CloseSilently,
    /// Read the request, then say nothing for this long.
    Stall(Duration),
    /// Read the request, wait, then answer.
    ReplyAfter(Duration, &'static [u8]),
}

/// A raw upstream; returns its address and the requests it read.
async fn upstream(b: Behaviour) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let seen = Arc::clone(&seen2);
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                // Head, then a body of Content-Length bytes.
                loop {
                    let Ok(n) = s.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len: usize = text
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if got.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                seen.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&got).to_string());
                match b {
                    Behaviour::Reply(bytes) => {
                        let _ = s.write_all(bytes).await;
                        let _ = s.shutdown().await;
                    }
                    Behaviour::CloseSilently => {}
                    Behaviour::Stall(d) => tokio::time::sleep(d).await,
                    Behaviour::ReplyAfter(d, bytes) => {
                        tokio::time::sleep(d).await;
                        let _ = s.write_all(bytes).await;
                        let _ = s.shutdown().await;
                    }
                }
            });
        }
    });
    (addr, seen)
}

async fn submit(addr: SocketAddr) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        b"POST /submit HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

const QUEUED: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 27\r\n\r\n{\"prompt_id\": \"assigned-1\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reply_is_handed_over_and_only_the_trackers_verdict_releases() {
    // COMFY-01: the reply only says the job was queued.
    let (up, _) = upstream(Behaviour::Reply(QUEUED)).await;
    let (p, mut calls) = proxy(up).await;
    let (status, text) = submit(p.addr).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("{\"prompt_id\": \"assigned-1\"}"), "{text}");
    let (work, submission, verdict) = calls.recv().await.unwrap();
    assert_eq!(work.assigned_ref, "assigned-1");
    assert_eq!(
        submission,
        Submission::Reply {
            status: 200,
            body: bytes::Bytes::from_static(b"{\"prompt_id\": \"assigned-1\"}")
        }
    );
    let tracked = p
        .settle(|w| w.len() == 1 && w[0].phase == Phase::Tracking)
        .await;
    assert_eq!(tracked[0].phase, Phase::Tracking, "{tracked:?}");
    verdict
        .send(TrackedEnd::Released("history shows it finished".into()))
        .unwrap();
    assert!(p.settle(<[_]>::is_empty).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_verdict_holds() {
    // COMFY-27
    let (up, _) = upstream(Behaviour::Reply(QUEUED)).await;
    let (p, mut calls) = proxy(up).await;
    submit(p.addr).await;
    let (_, _, verdict) = calls.recv().await.unwrap();
    verdict
        .send(TrackedEnd::Held("tracking expired".into()))
        .unwrap();
    let work = p
        .settle(|w| w.len() == 1 && w[0].phase == Phase::Held)
        .await;
    assert_eq!(work[0].phase, Phase::Held);
    assert_eq!(work[0].held_reason.as_deref(), Some("tracking expired"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_after_sending_is_a_lost_submission() {
    // COMFY-17: no byte of the reply; the borrower is told the assigned ID.
    let (up, seen) = upstream(Behaviour::CloseSilently).await;
    let (p, mut calls) = proxy(up).await;
    let (status, text) = submit(p.addr).await;
    assert_eq!(status, 502, "{text}");
    assert!(text.contains("assigned-1"), "{text}");
    let (_, submission, verdict) = calls.recv().await.unwrap();
    assert!(matches!(submission, Submission::Lost(_)), "{submission:?}");
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "the request reached the upstream"
    );
    assert_eq!(p.lender.status().work[0].phase, Phase::Tracking);
    verdict
        .send(TrackedEnd::Released("absent twice".into()))
        .unwrap();
    assert!(p.settle(<[_]>::is_empty).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_breaks_off_is_unusable_not_a_release() {
    // COMFY-09
    let (up, _) = upstream(Behaviour::Reply(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"prompt_id\":",
    ))
    .await;
    let (p, mut calls) = proxy(up).await;
    let (status, text) = submit(p.addr).await;
    assert_eq!(status, 502, "{text}");
    let (_, submission, _verdict) = calls.recv().await.unwrap();
    assert!(
        matches!(submission, Submission::Broken(_)),
        "{submission:?}"
    );
    assert_eq!(p.lender.status().work[0].phase, Phase::Tracking);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_releases_without_tracking() {
    // DONE-02
    // Bound and never listened on, so the proxy's own port 0 cannot be it.
    let refusing = RefusingPort::bind().unwrap();
    let (p, mut calls) = proxy(refusing.addr()).await;
    let (status, text) = submit(p.addr).await;
    assert_eq!(status, 502, "{text}");
    assert!(p.settle(<[_]>::is_empty).await.is_empty());
    assert!(calls.try_recv().is_err(), "nothing to track");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_borrower_who_leaves_does_not_stop_the_submission() {
    // COMFY-08: the borrower leaves once the submission reached the
    // upstream; the reply still reaches the tracker.
    let (up, seen) = upstream(Behaviour::ReplyAfter(Duration::from_millis(500), QUEUED)).await;
    let (p, mut calls) = proxy(up).await;
    {
        let mut s = TcpStream::connect(p.addr).await.unwrap();
        s.write_all(b"POST /submit HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            .await
            .unwrap();
        for _ in 0..100 {
            if !seen.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(seen.lock().unwrap().len(), 1);
        // Gone before the reply.
    }
    let (_, submission, verdict) = tokio::time::timeout(Duration::from_secs(5), calls.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(submission, Submission::Reply { status: 200, .. }));
    verdict.send(TrackedEnd::Released("done".into())).unwrap();
    assert!(p.settle(<[_]>::is_empty).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reply_within_completion_timeout_holds() {
    // COMFY-11: the harness's completion_timeout is 5 s.
    let (up, _) = upstream(Behaviour::Stall(Duration::from_secs(8))).await;
    let (p, mut calls) = proxy(up).await;
    let (status, text) = submit(p.addr).await;
    assert_eq!(status, 502, "{text}");
    assert!(text.contains("completion_timeout_s"), "{text}");
    let work = p
        .settle(|w| w.len() == 1 && w[0].phase == Phase::Held)
        .await;
    assert_eq!(work[0].phase, Phase::Held);
    assert!(
        calls.try_recv().is_err(),
        "a reply that never came is not tracked"
    );
}
