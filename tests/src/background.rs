//! An in-process server on its own thread and tokio runtime, so it outlives any
//! test runtime: the shared mechanics of the counting shim and the emulators
//! (Ollama, ComfyUI, voice), with their HTTP accept loop and streamed bodies.

use std::convert::Infallible;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use crate::error::SupportError;

/// A listener on a free 127.0.0.1 port served by a future on a dedicated thread.
#[derive(Debug)]
pub(crate) struct BackgroundServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl BackgroundServer {
    /// Bind, then run `serve(listener, stopped)` on `runtime` in a thread named
    /// `name-PORT`. Dropping the runtime at the end cancels what still runs.
    pub(crate) fn start<F, Fut>(
        name: &str,
        runtime: tokio::runtime::Runtime,
        serve: F,
    ) -> Result<Self, SupportError>
    where
        F: FnOnce(TcpListener, oneshot::Receiver<()>) -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let std_listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| SupportError::io(format!("{name}: bind 127.0.0.1:0"), e))?;
        let addr = std_listener
            .local_addr()
            .map_err(|e| SupportError::io(format!("{name}: read its address"), e))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| SupportError::io(format!("{name}: make the listener non-blocking"), e))?;
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(std_listener)
                .map_err(|e| SupportError::io(format!("{name}: register the listener"), e))?
        };
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("{name}-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(serve(listener, stopped));
                runtime.shutdown_background();
            })
            .map_err(|e| SupportError::io(format!("{name}: spawn its thread"), e))?;
        Ok(BackgroundServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub(crate) fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stop listening and cut what still runs. Idempotent.
    pub(crate) fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            // An error means the thread is already gone.
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // A panic in the server thread has nowhere better to go than the join.
            let _ = thread.join();
        }
    }
}

impl Drop for BackgroundServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serve HTTP/1.1 on `listener` with `handler` until `stopped` fires, each
/// connection on a task of its own. A connection error (a reply cut on
/// purpose included) concerns that client only; a failed accept (e.g. out of
/// file descriptors) backs off rather than spins.
pub(crate) async fn serve_http<H, Fut, B, E>(
    listener: TcpListener,
    mut stopped: oneshot::Receiver<()>,
    handler: H,
) where
    H: Fn(http::Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<http::Response<B>, E>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let handler = handler.clone();
                    tokio::spawn(async move {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service_fn(handler))
                            .await;
                    });
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            },
        }
    }
}

/// A response body fed by a channel: each message one frame. Items are
/// `Bytes` (a body that cannot fail) or `Result<Bytes, E>` (one that can
/// break off with an error).
pub(crate) struct ChannelBody<T> {
    rx: mpsc::Receiver<T>,
}

impl<T> ChannelBody<T> {
    /// The body the other end of `rx`'s channel feeds.
    pub(crate) fn new(rx: mpsc::Receiver<T>) -> Self {
        ChannelBody { rx }
    }
}

impl Body for ChannelBody<Bytes> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|item| item.map(|b| Ok(Frame::data(b))))
    }
}

impl<E> Body for ChannelBody<Result<Bytes, E>> {
    type Data = Bytes;
    type Error = E;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, E>>> {
        self.rx
            .poll_recv(cx)
            .map(|item| item.map(|r| r.map(Frame::data)))
    }
}
