//! Local administration on Windows (HELD-09): the control plane's routes
//! over a named pipe whose DACL admits only Administrators and LocalSystem.
//!
//! Each connection speaks HTTP/1.1, as the control listener does, and its
//! requests go to the same handler with the [`LocalAdministrator`] mark:
//! the pipe's DACL has already decided who may call, so no token is asked
//! for, and every other check (the intent header, the confirmation, the
//! phase of a held entry, the ledger write before the answer) is the HTTP
//! route's own. A process that is not an administrator cannot open the pipe
//! at all; `vacancyd admin-request` then says to run it as one.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::windows::named_pipe::NamedPipeServer;
use tokio::sync::watch;
use tracing::{debug, info, warn};
use vacancy::platform::windows::{ADMIN_PIPE, create_admin_pipe};
use vacancy::proxy::conn::{ConnLimits, ProgressBody};

use super::{ControlState, LocalAdministrator, handle};

/// The environment variable that names another pipe than [`ADMIN_PIPE`]
/// (`\\.\pipe\...`), for a second daemon on one machine and for tests; the
/// client reads it too.
pub const PIPE_ENV: &str = "VACANCYD_ADMIN_PIPE";

/// How long one pipe connection may last: an admin request is one short exchange.
const CONNECTION_LIMIT: Duration = Duration::from_secs(60);

/// The pipe's name for this process: `$VACANCYD_ADMIN_PIPE` or [`ADMIN_PIPE`].
pub fn pipe_name() -> String {
    std::env::var(PIPE_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| ADMIN_PIPE.to_owned())
}

/// Create the pipe's first instance. A pipe of that name that another
/// process created first is an error: a client would otherwise hand its
/// requests to that process.
///
/// # Errors
///
/// The operating system's error, with the pipe's name.
pub fn bind() -> Result<(String, NamedPipeServer), String> {
    let name = pipe_name();
    match create_admin_pipe(&name, true) {
        Ok(server) => Ok((name, server)),
        Err(e) => Err(format!(
            "cannot create the local administration pipe {name}: {e} (is another vacancyd \
             running, or another program holding the name? set {PIPE_ENV} to use another)"
        )),
    }
}

/// Serve the pipe until `shutdown`: one task per connection, a fresh
/// instance waiting for the next client meanwhile.
pub async fn serve(
    name: String,
    first: NamedPipeServer,
    state: Arc<ControlState>,
    limits: ConnLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    info!(pipe = %name, "local administration pipe open (Administrators and LocalSystem only)");
    let mut server = first;
    loop {
        tokio::select! {
            connected = server.connect() => {
                if let Err(e) = connected {
                    warn!(pipe = %name, error = %e, "a local administration client failed to connect");
                }
                let next = match create_admin_pipe(&name, false) {
                    Ok(next) => next,
                    Err(e) => {
                        warn!(pipe = %name, error = %e, "cannot open another instance of the local administration pipe; it stays closed");
                        return;
                    }
                };
                let client = std::mem::replace(&mut server, next);
                tokio::spawn(serve_client(client, Arc::clone(&state), limits));
            }
            () = vacancy::proxy::stopped(&mut shutdown) => return,
        }
    }
}

/// One client: HTTP/1.1 requests to the control plane's handler, marked as
/// a local administrator's.
async fn serve_client(client: NamedPipeServer, state: Arc<ControlState>, limits: ConnLimits) {
    let local = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let service = service_fn(move |req: http::Request<Incoming>| {
        let state = Arc::clone(&state);
        async move {
            let mut req = req.map(|b| ProgressBody::new(b, limits));
            req.extensions_mut().insert(LocalAdministrator);
            Ok::<_, std::convert::Infallible>(handle(&state, local, req).await)
        }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header);
    let conn = builder.serve_connection(TokioIo::new(client), service);
    match tokio::time::timeout(CONNECTION_LIMIT, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug!(error = %e, "local administration connection ended with an error"),
        Err(_) => debug!("local administration connection cut after {CONNECTION_LIMIT:?}"),
    }
}
