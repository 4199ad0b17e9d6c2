//! An in-process server on its own thread and tokio runtime, so it outlives any
//! test runtime: the shared mechanics of the counting shim and the Ollama emulator.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::thread::JoinHandle;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

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
