//! The hyper floor: the least a proxy built on tokio and hyper does for a
//! request, measured by `scripts/bench-proxy` beside nginx and vacancyd
//! (issue 31). What vacancyd costs above it is vacancyd's own work; what it
//! costs against nginx beyond that is hyper's and tokio's.
//!
//! Built as vacancyd's read path is: one single-threaded runtime per thread
//! taking connections from one listener, hyper's HTTP/1 server and client
//! with flattened writes, `TCP_NODELAY` both ways. Each borrower connection
//! gets one upstream connection, opened with its first request and kept
//! while it lasts. A request goes through as it came but for `Host`: no
//! admission, no header checks, no metrics, no pool. So beyond the
//! upstream connections nginx keeps (64 a worker), which opens and closes
//! more as it goes, the floor is no floor for nginx; vacancyd's read pool
//! keeps one for each borrower connection past its bound for a second
//! after each use, much as the floor does.
//!
//! Given a second address and a body, it also answers every request there,
//! on the same threads, with that body as a `503` with the headers of
//! vacancyd's refusals, after reading the request's body: the least a
//! server on tokio and hyper does for a refusal, beside vacancyd's
//! refusals and nginx's fixed `return 503`.
//!
//! ```text
//! cargo build --release -p vacancy-cli --example hyper_floor
//! target/release/examples/hyper_floor 127.0.0.1:8081 127.0.0.1:8080 2
//! target/release/examples/hyper_floor 127.0.0.1:8081 127.0.0.1:8080 2 127.0.0.1:8082 '{"error":{}}'
//! ```

use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderValue;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

type BoxError = Box<dyn Error + Send + Sync>;

/// vacancyd's allocator, so that the floor differs from it in nothing else.
#[cfg(not(windows))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let (listen, upstream, threads, refusing) = match args.as_slice() {
        [_, listen, upstream, threads] => (listen, upstream, threads, None),
        [_, listen, upstream, threads, refusing, body] => {
            (listen, upstream, threads, Some((refusing, body)))
        }
        _ => {
            return Err(
                "usage: hyper_floor LISTEN_ADDR UPSTREAM_ADDR THREADS [REFUSING_ADDR REFUSAL_BODY]"
                    .into(),
            );
        }
    };
    let listener = nonblocking_listener(listen)?;
    let upstream: SocketAddr = upstream.parse()?;
    let threads: usize = threads.parse()?;
    let refusing = match refusing {
        Some((addr, body)) => Some((nonblocking_listener(addr)?, Bytes::from(body.clone()))),
        None => None,
    };
    let mut running = Vec::new();
    for _ in 0..threads.max(1) {
        let listener = listener.try_clone()?;
        let refusing = match &refusing {
            Some((l, body)) => Some((l.try_clone()?, body.clone())),
            None => None,
        };
        running.push(std::thread::spawn(move || {
            accept_loop(listener, upstream, refusing)
        }));
    }
    for thread in running {
        thread.join().map_err(|_| "a proxy thread panicked")??;
    }
    Ok(())
}

/// A listener on `addr` for a tokio runtime to take over.
fn nonblocking_listener(addr: &str) -> Result<std::net::TcpListener, BoxError> {
    let listener = std::net::TcpListener::bind(addr.parse::<SocketAddr>()?)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Take connections from `listener` (and `refusing`, where given) and serve
/// them on this thread.
fn accept_loop(
    listener: std::net::TcpListener,
    upstream: SocketAddr,
    refusing: Option<(std::net::TcpListener, Bytes)>,
) -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        if let Some((listener, body)) = refusing {
            let listener = TcpListener::from_std(listener)?;
            tokio::spawn(async move {
                loop {
                    if let Ok((borrower, _)) = listener.accept().await {
                        tokio::spawn(refuse(borrower, body.clone()));
                    }
                }
            });
        }
        let listener = TcpListener::from_std(listener)?;
        let host = HeaderValue::from_str(&upstream.to_string())?;
        loop {
            let Ok((borrower, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(serve(borrower, upstream, host.clone()));
        }
    })
}

/// One connection whose every request is answered with `body` as a 503,
/// with the headers vacancyd's refusals carry, once its body is read.
async fn refuse(borrower: TcpStream, body: Bytes) {
    let _ = borrower.set_nodelay(true);
    let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
        let body = body.clone();
        async move {
            req.into_body().collect().await?;
            let mut resp = http::Response::new(Full::new(body));
            *resp.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
            let headers = resp.headers_mut();
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            headers.insert("x-should-retry", HeaderValue::from_static("false"));
            headers.insert("vacancy-retry-elsewhere", HeaderValue::from_static("true"));
            Ok::<_, hyper::Error>(resp)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .writev(false)
        .serve_connection(TokioIo::new(borrower), service)
        .await;
}

/// One borrower connection, with its upstream connection once it asks.
async fn serve(borrower: TcpStream, upstream: SocketAddr, host: HeaderValue) {
    let _ = borrower.set_nodelay(true);
    let sender: Arc<Mutex<Option<SendRequest<Incoming>>>> = Arc::default();
    let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
        forward(Arc::clone(&sender), upstream, host.clone(), req)
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .writev(false)
        .serve_connection(TokioIo::new(borrower), service)
        .await;
}

/// One request, on the connection's upstream connection.
async fn forward(
    sender: Arc<Mutex<Option<SendRequest<Incoming>>>>,
    upstream: SocketAddr,
    host: HeaderValue,
    mut req: http::Request<Incoming>,
) -> Result<http::Response<Incoming>, BoxError> {
    req.headers_mut().insert(http::header::HOST, host);
    let mut sender = sender.lock().await;
    let sender = match &mut *sender {
        Some(s) => s,
        empty => empty.insert(connect(upstream).await?),
    };
    Ok(sender.send_request(req).await?)
}

/// A new upstream connection, driven on this thread.
async fn connect(upstream: SocketAddr) -> Result<SendRequest<Incoming>, BoxError> {
    let stream = TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .writev(false)
        .handshake(TokioIo::new(stream))
        .await?;
    tokio::spawn(conn);
    Ok(sender)
}
