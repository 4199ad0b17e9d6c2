//! Local administration on Windows (HELD-09): the control plane's routes
//! over a named pipe whose DACL admits only Administrators and LocalSystem.
//!
//! The pipe's DACL decides who may call, so a caller needs no token. Each
//! pipe connection speaks HTTP/1.1; every request is passed on to the
//! control listener on this machine with the daemon's own administrator
//! token in place of any `Authorization` the caller sent. That token is
//! drawn at start, kept in memory only and never shown, so only requests
//! that came through the pipe carry it. Every other check is the HTTP
//! route's own: the intent header, the `upstream_stopped` confirmation, the
//! phase of a held entry, the ledger write before the answer. A process that
//! is not an administrator cannot open the pipe at all; `vacancyd
//! admin-request` then says to run it as one.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::net::windows::named_pipe::NamedPipeServer;
use tokio::sync::watch;
use tracing::{debug, info, warn};
use vacancy::config::{Scope, TokenConfig};
use vacancy::platform::windows::{ADMIN_PIPE, create_admin_pipe};

/// The environment variable that names another pipe than [`ADMIN_PIPE`]
/// (`\\.\pipe\...`), for a second daemon on one machine and for tests; the
/// client reads it too.
pub const PIPE_ENV: &str = "VACANCYD_ADMIN_PIPE";

/// The name the pipe's requests carry in the audit log.
const LOCAL_ADMINISTRATOR: &str = "local administrator (pipe)";

/// How long one pipe connection may last: an admin request is one short exchange.
const CONNECTION_LIMIT: Duration = Duration::from_secs(60);
/// How long a request head may take to arrive.
const HEADER_LIMIT: Duration = Duration::from_secs(10);

type Reply = http::Response<UnsyncBoxBody<Bytes, hyper::Error>>;

/// The pipe's name for this process: `$VACANCYD_ADMIN_PIPE` or [`ADMIN_PIPE`].
pub fn pipe_name() -> String {
    std::env::var(PIPE_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| ADMIN_PIPE.to_owned())
}

/// The pipe's first instance and the token its requests carry.
pub struct AdminPipe {
    name: String,
    first: NamedPipeServer,
    token: Arc<str>,
}

impl AdminPipe {
    /// Create the pipe's first instance and draw its token. A pipe of that
    /// name that another process created first is an error: a client would
    /// otherwise hand its requests to that process.
    ///
    /// # Errors
    ///
    /// The operating system's error, with the pipe's name.
    pub fn bind() -> Result<AdminPipe, String> {
        let name = pipe_name();
        let token = vacancy::auth::new_token()
            .map_err(|e| format!("cannot draw the local administration pipe's token: {e}"))?;
        let first = create_admin_pipe(&name, true).map_err(|e| {
            format!(
                "cannot create the local administration pipe {name}: {e} (is another vacancyd \
                 running, or another program holding the name? set {PIPE_ENV} to use another)"
            )
        })?;
        Ok(AdminPipe {
            name,
            first,
            token: token.into(),
        })
    }

    /// The `[[server.token]]` entry of the pipe's token (scope admin), for
    /// the control plane's tokens; it exists only in this process.
    pub fn token_entry(&self) -> TokenConfig {
        TokenConfig {
            name: LOCAL_ADMINISTRATOR.to_owned(),
            scopes: vec![Scope::Admin],
            sha256: vacancy::auth::hash_token(&self.token),
        }
    }

    /// Serve the pipe until `shutdown`, passing each request on to the
    /// control listener at `control`: one task per connection, a fresh
    /// instance waiting for the next client meanwhile.
    pub async fn serve(self, control: SocketAddr, mut shutdown: watch::Receiver<bool>) {
        let AdminPipe { name, first, token } = self;
        let control = reachable(control);
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
                    tokio::spawn(serve_client(client, control, Arc::clone(&token)));
                }
                () = vacancy::shell::stopped(&mut shutdown) => return,
            }
        }
    }
}

/// The control listener's address as a client on this machine reaches it:
/// an unspecified address (`0.0.0.0`, `::`) is reached on loopback.
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::from((Ipv4Addr::LOCALHOST, addr.port()))
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::from((Ipv6Addr::LOCALHOST, addr.port()))
        }
        _ => addr,
    }
}

/// One client: each HTTP/1.1 request passed on with the pipe's token.
async fn serve_client(client: NamedPipeServer, control: SocketAddr, token: Arc<str>) {
    let service = service_fn(move |req: http::Request<Incoming>| {
        let token = Arc::clone(&token);
        async move { Ok::<_, std::convert::Infallible>(pass_on(req, control, &token).await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_LIMIT);
    let conn = builder.serve_connection(TokioIo::new(client), service);
    match tokio::time::timeout(CONNECTION_LIMIT, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug!(error = %e, "local administration connection ended with an error"),
        Err(_) => debug!("local administration connection cut after {CONNECTION_LIMIT:?}"),
    }
}

/// `req` sent to the control listener with the pipe's token, and its answer.
async fn pass_on(mut req: http::Request<Incoming>, control: SocketAddr, token: &str) -> Reply {
    let headers = req.headers_mut();
    let bearer = http::HeaderValue::from_str(&format!("Bearer {token}"));
    let host = http::HeaderValue::from_str(&control.to_string());
    match (bearer, host) {
        (Ok(mut bearer), Ok(host)) => {
            bearer.set_sensitive(true);
            headers.insert(http::header::AUTHORIZATION, bearer);
            headers.insert(http::header::HOST, host);
        }
        _ => return unavailable("cannot build the request to the control listener"),
    }
    let sent = async {
        let stream = TcpStream::connect(control).await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        sender
            .send_request(req)
            .await
            .map_err(std::io::Error::other)
    };
    match sent.await {
        Ok(resp) => resp.map(BodyExt::boxed_unsync),
        Err(e) => {
            warn!(control = %control, error = %e, "the local administration pipe cannot reach the control listener");
            unavailable(&format!(
                "vacancyd's control listener at {control} did not answer: {e}"
            ))
        }
    }
}

/// A 502 in the control plane's error form.
fn unavailable(message: &str) -> Reply {
    let body = serde_json::json!({"error": {"code": "control_unreachable", "message": message}});
    let mut resp = http::Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *resp.status_mut() = http::StatusCode::BAD_GATEWAY;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}
