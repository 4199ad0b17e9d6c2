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
//! ```text
//! cargo build --release -p vacancy-cli --example hyper_floor
//! target/release/examples/hyper_floor 127.0.0.1:8081 127.0.0.1:8080 2
//! ```

use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;

use http::HeaderValue;
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
    let [_, listen, upstream, threads] = args.as_slice() else {
        return Err("usage: hyper_floor LISTEN_ADDR UPSTREAM_ADDR THREADS".into());
    };
    let listen: SocketAddr = listen.parse()?;
    let upstream: SocketAddr = upstream.parse()?;
    let threads: usize = threads.parse()?;
    let listener = std::net::TcpListener::bind(listen)?;
    listener.set_nonblocking(true)?;
    let mut running = Vec::new();
    for _ in 0..threads.max(1) {
        let listener = listener.try_clone()?;
        running.push(std::thread::spawn(move || accept_loop(listener, upstream)));
    }
    for thread in running {
        thread.join().map_err(|_| "a proxy thread panicked")??;
    }
    Ok(())
}

/// Take connections from `listener` and serve them on this thread.
fn accept_loop(listener: std::net::TcpListener, upstream: SocketAddr) -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
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
