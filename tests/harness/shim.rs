//! CountingShim in front of a small hyper server started here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Channel, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use vacancy_test_support::{CountingShim, free_port, http_request, http_stream};

const SLOW: Duration = Duration::from_millis(300);
const CHUNKS: usize = 5;
const CHUNK_GAP: Duration = Duration::from_millis(100);

/// The upstream: `/slow` answers after [`SLOW`]; `/stream` sends [`CHUNKS`] SSE
/// events [`CHUNK_GAP`] apart (and notes when it produced the last); `/empty`
/// answers 204; `/echo` returns method, query, `x-test` header and body.
struct Upstream {
    addr: SocketAddr,
    last_chunk_sent: Arc<Mutex<Option<Instant>>>,
}

async fn start_upstream() -> Upstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let last_chunk_sent = Arc::new(Mutex::new(None));
    let sent = Arc::clone(&last_chunk_sent);
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let sent = Arc::clone(&sent);
            tokio::spawn(async move {
                let service = service_fn(move |req| handle(req, Arc::clone(&sent)));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Upstream {
        addr,
        last_chunk_sent,
    }
}

type Body = BoxBody<Bytes, Infallible>;

async fn handle(
    req: Request<Incoming>,
    last_chunk_sent: Arc<Mutex<Option<Instant>>>,
) -> Result<Response<Body>, Infallible> {
    let full = |s: String| Full::new(Bytes::from(s)).boxed();
    let response = match req.uri().path() {
        "/slow" => {
            tokio::time::sleep(SLOW).await;
            Response::new(full("done".into()))
        }
        "/stream" => {
            let (mut tx, body) = Channel::<Bytes, Infallible>::new(1);
            tokio::spawn(async move {
                for i in 0..CHUNKS {
                    if i > 0 {
                        tokio::time::sleep(CHUNK_GAP).await;
                    }
                    if i == CHUNKS - 1 {
                        *last_chunk_sent.lock().unwrap() = Some(Instant::now());
                    }
                    if tx
                        .send_data(Bytes::from(format!("data: {i}\n\n")))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(body.boxed())
                .unwrap()
        }
        "/empty" => Response::builder()
            .status(StatusCode::NO_CONTENT)
            .body(Empty::new().boxed())
            .unwrap(),
        "/echo" => {
            let method = req.method().to_string();
            let query = req.uri().query().unwrap_or("").to_owned();
            let header = req
                .headers()
                .get("x-test")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let body = String::from_utf8_lossy(&body);
            Response::new(full(format!("{method} {query} {header} {body}")))
        }
        _ => Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Empty::new().boxed())
            .unwrap(),
    };
    Ok(response)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_requests_count_two() {
    let up = start_upstream().await;
    let shim = CountingShim::start(up.addr).unwrap();
    let url = format!("{}/slow", shim.base_url());
    let (a, b) = tokio::join!(
        http_request("GET", &url, &[], vec![]),
        http_request("GET", &url, &[], vec![])
    );
    assert_eq!(a.unwrap().status, 200);
    assert_eq!(b.unwrap().status, 200);
    let records = shim.records();
    assert_eq!(records.len(), 2);
    for r in &records {
        assert_eq!((r.method.as_str(), r.path.as_str()), ("GET", "/slow"));
        assert_eq!(r.status, Some(200));
        assert!(r.completed);
        assert!(r.ended.unwrap() - r.started >= SLOW);
    }
    assert_eq!(shim.max_concurrency_where(|r| r.path == "/slow"), 2);
    assert_eq!(shim.max_concurrency_where(|r| r.path == "/other"), 0);
    assert_eq!(shim.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_requests_count_one() {
    let up = start_upstream().await;
    let shim = CountingShim::start(up.addr).unwrap();
    let url = format!("{}/slow", shim.base_url());
    for _ in 0..3 {
        assert_eq!(
            http_request("GET", &url, &[], vec![]).await.unwrap().status,
            200
        );
    }
    // A client that sends right after reading a whole response shows no overlap.
    let empty = format!("{}/empty", shim.base_url());
    for _ in 0..5 {
        let reply = http_request("GET", &empty, &[], vec![]).await.unwrap();
        assert_eq!(reply.status, 204);
    }
    assert_eq!(shim.records().len(), 8);
    assert_eq!(shim.max_concurrency_where(|_| true), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_pass_chunk_by_chunk() {
    let up = start_upstream().await;
    let shim = CountingShim::start(up.addr).unwrap();
    let stream = http_stream("GET", &format!("{}/stream", shim.base_url()), &[], vec![])
        .await
        .unwrap();
    assert_eq!(stream.status, 200);
    assert_eq!(stream.headers["content-type"], "text/event-stream");
    let chunks = stream.collect_chunks().await.unwrap();
    let text: String = chunks
        .iter()
        .map(|c| String::from_utf8_lossy(&c.data).into_owned())
        .collect();
    assert_eq!(
        text,
        "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n"
    );
    assert!(chunks.len() >= 3, "arrived in {} pieces", chunks.len());

    let last_produced = up.last_chunk_sent.lock().unwrap().unwrap();
    let first = chunks[0].at;
    let last = chunks[chunks.len() - 1].at;
    assert!(
        last_produced - first >= CHUNK_GAP * 3,
        "the first chunk arrived only {:?} before the last was produced",
        last_produced.saturating_duration_since(first)
    );
    assert!(last - first >= CHUNK_GAP * 3, "{:?}", last - first);

    let records = shim.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].status, Some(200));
    assert!(records[0].completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_request_is_in_flight_until_it_ends() {
    let up = start_upstream().await;
    let shim = CountingShim::start(up.addr).unwrap();
    let url = format!("{}/slow", shim.base_url());
    let pending = tokio::spawn(async move { http_request("GET", &url, &[], vec![]).await });
    tokio::time::sleep(SLOW / 3).await;
    assert_eq!(shim.in_flight(), 1);
    let running = shim.records();
    assert_eq!(running[0].ended, None);
    assert_eq!(running[0].status, None, "no response head yet");
    assert_eq!(shim.max_concurrency_where(|_| true), 1);

    // clear() keeps what is still running.
    shim.clear();
    assert_eq!(shim.records().len(), 1);
    assert_eq!(pending.await.unwrap().unwrap().status, 200);
    assert_eq!(shim.in_flight(), 0);
    shim.clear();
    assert!(shim.records().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_stream_ends_the_record_incomplete() {
    let up = start_upstream().await;
    let shim = CountingShim::start(up.addr).unwrap();
    let mut stream = http_stream("GET", &format!("{}/stream", shim.base_url()), &[], vec![])
        .await
        .unwrap();
    let first = stream.next_chunk().await.unwrap().unwrap();
    assert_eq!(&first.data[..], b"data: 0\n\n");
    drop(stream);
    assert_eq!(shim.records().len(), 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while shim.in_flight() > 0 {
        assert!(Instant::now() < deadline, "{:?}", shim.records());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = &shim.records()[0];
    assert_eq!(r.status, Some(200));
    assert!(!r.completed, "{r:?}");
    assert!(r.ended.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_query_headers_and_body_are_forwarded() {
    let up = start_upstream().await;
    let shim = CountingShim::start(up.addr).unwrap();
    let reply = http_request(
        "POST",
        &format!("{}/echo?fail_on_no_slot=1", shim.base_url()),
        &[("x-test", "yes"), ("content-type", "text/plain")],
        b"hello body".to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.text(), "POST fail_on_no_slot=1 yes hello body");
    let r = &shim.records()[0];
    assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/echo"));

    let reply = http_request("GET", &format!("{}/empty", shim.base_url()), &[], vec![])
        .await
        .unwrap();
    assert_eq!(reply.status, 204);
    let r = &shim.records()[1];
    assert_eq!(r.status, Some(204));
    assert!(r.completed, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_gives_502_and_a_record_without_status() {
    let dead: SocketAddr = ([127, 0, 0, 1], free_port().unwrap()).into();
    let shim = CountingShim::start(dead).unwrap();
    let reply = http_request("GET", &format!("{}/health", shim.base_url()), &[], vec![])
        .await
        .unwrap();
    assert_eq!(reply.status, 502);
    assert!(reply.text().contains("counting shim"), "{}", reply.text());
    let r = &shim.records()[0];
    assert_eq!(r.status, None);
    assert!(!r.completed);
    assert!(r.ended.is_some());
}

#[test]
fn the_shim_outlives_the_test_runtimes_and_stops_cleanly() {
    let upstream_rt = tokio::runtime::Runtime::new().unwrap();
    let up = upstream_rt.block_on(start_upstream());
    // Made outside any runtime, then used from two short-lived runtimes in turn.
    let mut shim = CountingShim::start(up.addr).unwrap();
    let url = format!("{}/empty", shim.base_url());
    for _ in 0..2 {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let reply = rt.block_on(http_request("GET", &url, &[], vec![])).unwrap();
        assert_eq!(reply.status, 204);
    }
    assert_eq!(shim.records().len(), 2);
    shim.stop();
    shim.stop();
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(
        rt.block_on(http_request("GET", &url, &[], vec![])).is_err(),
        "still listening after stop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_cuts_running_exchanges() {
    let up = start_upstream().await;
    let mut shim = CountingShim::start(up.addr).unwrap();
    let url = format!("{}/slow", shim.base_url());
    let pending = tokio::spawn(async move { http_request("GET", &url, &[], vec![]).await });
    tokio::time::sleep(SLOW / 3).await;
    tokio::task::block_in_place(|| shim.stop());
    assert!(pending.await.unwrap().is_err(), "the client saw the cut");
    let r = &shim.records()[0];
    assert!(r.ended.is_some() && !r.completed, "{r:?}");
    assert_eq!(shim.in_flight(), 0);
}
