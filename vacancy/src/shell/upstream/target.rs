//! Where an upstream lives, parsed once from its configured URL, and the
//! addresses its host name resolves to.
//!
//! # Behavior
//!
//! - A target named by an IP address is never looked up.
//! - A target named by a host name is looked up once ([`Target::resolve`],
//!   at the daemon's start, or at its first connection), and again only when
//!   connecting to every address it had fails: a work request costs no
//!   `getaddrinfo` on tokio's blocking pool (issue 31 item 5). When the fresh
//!   lookup gives other addresses, the same connection is tried on them at
//!   once, within its connect timeout: nothing reached the upstream yet, so
//!   trying again lends nothing twice (DONE-02).
//! - Every connection attempt leaves its outcome for
//!   [`Target::take_last_connect`]: the observation after a job learns from
//!   it that the upstream answered, without a connection of its own, and a
//!   job's end wakes an observation loop that learns nothing else only when
//!   it failed ([`Target::last_connect_failed`]).

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpStream;

use crate::config::parse_target;

/// Where an upstream lives: the address to connect to, the `Host` to send, and
/// the path prefix of its base URL.
#[derive(Debug, Clone)]
pub struct Target {
    /// Host to connect to.
    pub host: String,
    /// Port to connect to.
    pub port: u16,
    /// `host:port` as the `Host` header says it.
    pub authority: String,
    /// The base URL's path without a trailing slash (`""` for none).
    pub prefix: String,
    /// What `host` resolves to, shared by every clone.
    addresses: Addresses,
    /// `authority` as a `Host` header value, made once.
    host_header: Option<http::HeaderValue>,
    /// An IP address target's address as a URI authority, made once.
    fixed_authority: Option<http::uri::Authority>,
    /// The outcome of the last connection attempt not taken yet, shared by
    /// every clone: [`NO_CONNECT`], [`CONNECTED`] or [`CONNECT_FAILED`].
    last_connect: Arc<AtomicU8>,
}

const NO_CONNECT: u8 = 0;
const CONNECTED: u8 = 1;
const CONNECT_FAILED: u8 = 2;

impl PartialEq for Target {
    fn eq(&self, other: &Self) -> bool {
        (&self.host, self.port, &self.authority, &self.prefix)
            == (&other.host, other.port, &other.authority, &other.prefix)
    }
}

impl Eq for Target {}

/// Why a configured target is not one the proxy can reach.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    /// It is not a base URL the configuration accepts (an absolute URL with
    /// a host, an optional port from 1 to 65535 and path prefix, nothing
    /// else): the sentence says what is wrong and what is expected.
    #[error("target {0}")]
    Invalid(String),
    /// Its scheme is not `http`.
    #[error("target {target:?}: scheme {scheme:?} is not supported; use http://")]
    Scheme {
        /// The configured target.
        target: String,
        /// The scheme it gives.
        scheme: String,
    },
}

/// How a host name becomes addresses: the system's resolver, or a test's.
type Lookup = Arc<
    dyn Fn(String, u16) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<SocketAddr>>> + Send>>
        + Send
        + Sync,
>;

/// The addresses of a target, resolved at most once per failed connection.
#[derive(Clone)]
struct Addresses {
    /// An IP address target: fixed, never looked up.
    fixed: Option<SocketAddr>,
    /// The last lookup's answer (empty: none yet, or it failed).
    resolved: Arc<Mutex<Arc<[SocketAddr]>>>,
    lookup: Lookup,
}

impl std::fmt::Debug for Addresses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Addresses")
            .field("fixed", &self.fixed)
            .field("resolved", &self.current())
            .finish_non_exhaustive()
    }
}

impl Addresses {
    fn current(&self) -> Arc<[SocketAddr]> {
        match self.resolved.lock() {
            Ok(g) => Arc::clone(&g),
            Err(p) => Arc::clone(&p.into_inner()),
        }
    }

    fn set(&self, addresses: Arc<[SocketAddr]>) {
        match self.resolved.lock() {
            Ok(mut g) => *g = addresses,
            Err(p) => *p.into_inner() = addresses,
        }
    }
}

/// The system resolver (`getaddrinfo`, on tokio's blocking pool).
fn system_lookup() -> Lookup {
    Arc::new(|host: String, port: u16| {
        Box::pin(async move {
            tokio::net::lookup_host((host.as_str(), port))
                .await
                .map(Iterator::collect)
        })
    })
}

impl Target {
    /// Parse a configured `http://` target, checked as the configuration
    /// checks every `target` (one parser for both). HTTPS targets are not
    /// proxied by this release.
    pub fn parse(target: &str) -> Result<Target, TargetError> {
        Self::parse_with(target, system_lookup())
    }

    fn parse_with(target: &str, lookup: Lookup) -> Result<Target, TargetError> {
        let checked = parse_target(target).map_err(TargetError::Invalid)?;
        if !checked.scheme.eq_ignore_ascii_case("http") {
            return Err(TargetError::Scheme {
                target: target.to_owned(),
                scheme: checked.scheme,
            });
        }
        let fixed = checked
            .host
            .parse::<IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, checked.port));
        Ok(Target {
            fixed_authority: fixed.and_then(|a| a.to_string().parse().ok()),
            host_header: http::HeaderValue::from_str(&checked.authority).ok(),
            host: checked.host,
            port: checked.port,
            authority: checked.authority,
            prefix: checked.prefix,
            addresses: Addresses {
                fixed,
                resolved: Arc::new(Mutex::new(Arc::from(Vec::new()))),
                lookup,
            },
            last_connect: Arc::new(AtomicU8::new(NO_CONNECT)),
        })
    }

    /// The `Host` header the upstream is sent.
    pub(crate) fn host_header(&self) -> Result<http::HeaderValue, String> {
        self.host_header.clone().ok_or_else(|| {
            format!(
                "target authority {:?} is not a header value",
                self.authority
            )
        })
    }

    /// `host:port`, as logs and errors name the upstream's address.
    pub fn address(&self) -> String {
        match self.addresses.fixed {
            Some(a) => a.to_string(),
            None => format!("{}:{}", self.host, self.port),
        }
    }

    /// Look the host name up now and keep the answer; nothing for an IP
    /// address. Returns the addresses, or why there are none.
    pub async fn resolve(&self) -> std::io::Result<Arc<[SocketAddr]>> {
        if let Some(a) = self.addresses.fixed {
            return Ok(Arc::from(vec![a]));
        }
        let found: Arc<[SocketAddr]> =
            Arc::from((self.addresses.lookup)(self.host.clone(), self.port).await?);
        if found.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{} resolves to no address", self.host),
            ));
        }
        self.addresses.set(Arc::clone(&found));
        Ok(found)
    }

    /// The address to connect to now: the IP address, or the first address
    /// the host name resolved to (looked up when it has not been yet).
    pub async fn socket_address(&self) -> Result<SocketAddr, ConnectError> {
        if let Some(a) = self.addresses.fixed {
            return Ok(a);
        }
        if let Some(a) = self.addresses.current().first() {
            return Ok(*a);
        }
        let fresh = self
            .resolve()
            .await
            .map_err(|e| ConnectError::Lookup(e.to_string()))?;
        fresh
            .first()
            .copied()
            .ok_or_else(|| ConnectError::Lookup(format!("{} resolves to no address", self.host)))
    }

    /// [`socket_address`](Self::socket_address) as a URI authority (made
    /// once for an IP address target).
    pub async fn socket_authority(&self) -> Result<http::uri::Authority, ConnectError> {
        if let Some(a) = &self.fixed_authority {
            return Ok(a.clone());
        }
        let socket = self.socket_address().await?;
        socket
            .to_string()
            .parse()
            .map_err(|e| ConnectError::Failed(format!("{socket} is not a URI authority: {e}")))
    }

    /// A TCP connection to the target within `timeout`: to its known
    /// addresses, and after they all fail, to what a fresh lookup gives if
    /// that differs: nothing was sent on a failed connection, so trying the
    /// new addresses lends nothing twice (DONE-02).
    pub async fn connect(&self, timeout: Duration) -> Result<TcpStream, ConnectError> {
        let connected = self.connect_once(timeout).await;
        let outcome = if connected.is_ok() {
            CONNECTED
        } else {
            CONNECT_FAILED
        };
        self.last_connect.store(outcome, Ordering::Relaxed);
        connected
    }

    /// Whether the last connection attempt since the last call succeeded;
    /// `None` when there was none. Any clone's attempts count.
    pub fn take_last_connect(&self) -> Option<bool> {
        match self.last_connect.swap(NO_CONNECT, Ordering::Relaxed) {
            CONNECTED => Some(true),
            CONNECT_FAILED => Some(false),
            _ => None,
        }
    }

    /// Whether the last connection attempt since the last
    /// [`take_last_connect`](Self::take_last_connect) failed, leaving it to
    /// be taken.
    pub fn last_connect_failed(&self) -> bool {
        self.last_connect.load(Ordering::Relaxed) == CONNECT_FAILED
    }

    async fn connect_once(&self, timeout: Duration) -> Result<TcpStream, ConnectError> {
        let deadline = tokio::time::Instant::now() + timeout;
        if let Some(a) = self.addresses.fixed {
            return connect_any(&[a], deadline, timeout).await;
        }
        let known = self.addresses.current();
        let first = if known.is_empty() {
            None
        } else {
            match connect_any(&known, deadline, timeout).await {
                Ok(s) => return Ok(s),
                Err(e) => Some(e),
            }
        };
        let fresh = match tokio::time::timeout_at(deadline, self.resolve()).await {
            Ok(Ok(fresh)) => fresh,
            Ok(Err(e)) => {
                return Err(first.unwrap_or_else(|| ConnectError::Lookup(e.to_string())));
            }
            Err(_) => return Err(first.unwrap_or(ConnectError::TimedOut(timeout))),
        };
        match first {
            Some(e) if fresh == known => Err(e),
            _ => connect_any(&fresh, deadline, timeout).await,
        }
    }
}

/// Why no connection to a target was made (nothing of a request reached it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// Every address refused or failed; the last reason.
    #[error("{0}")]
    Failed(String),
    /// The host name could not be resolved.
    #[error("cannot resolve the host: {0}")]
    Lookup(String),
    /// No connection within the timeout.
    #[error("no connection within {} s", .0.as_secs())]
    TimedOut(Duration),
}

/// Connect to the first of `addresses` that accepts, before `deadline`.
async fn connect_any(
    addresses: &[SocketAddr],
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Result<TcpStream, ConnectError> {
    let mut last = ConnectError::Failed("no address".to_owned());
    for a in addresses {
        match tokio::time::timeout_at(deadline, TcpStream::connect(a)).await {
            Ok(Ok(s)) => {
                // Requests and replies go out as written. Set here, as the
                // connection is made (beside the durable write, for work
                // connected early), not on the request's path (issue 31).
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(Err(e)) => last = ConnectError::Failed(e.to_string()),
            Err(_) => return Err(ConnectError::TimedOut(timeout)),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_target_the_configuration_refuses_is_refused_here_too() {
        // CFG-02: one parser. Before, an out-of-range port became 80, and a
        // target with user information or a query parsed.
        for bad in [
            "http://h:99999",
            "http://h:0",
            "http://user:secret@h:80",
            "http://h:80/?q=1",
            " http://h:80",
            "h:80",
            "http://",
        ] {
            let err = Target::parse(bad).unwrap_err();
            assert!(matches!(err, TargetError::Invalid(_)), "{bad}: {err:?}");
            assert!(parse_target(bad).is_err(), "{bad}");
        }
        // An https target is a valid configuration, but not proxied.
        assert!(matches!(
            Target::parse("https://h:443"),
            Err(TargetError::Scheme { .. })
        ));
    }

    #[test]
    fn a_target_keeps_what_the_host_header_says() {
        let t = Target::parse("http://[::1]:9000/base/").unwrap();
        assert_eq!(
            (
                t.host.as_str(),
                t.port,
                t.authority.as_str(),
                t.prefix.as_str()
            ),
            ("::1", 9000, "[::1]:9000", "/base")
        );
        let t = Target::parse("HTTP://Localhost").unwrap();
        assert_eq!((t.port, t.authority.as_str()), (80, "Localhost"));
    }

    /// A lookup that answers what `answer` holds now, counting its calls.
    fn counted(
        answer: Arc<Mutex<Vec<SocketAddr>>>,
        calls: Arc<std::sync::atomic::AtomicUsize>,
    ) -> Lookup {
        Arc::new(move |_host: String, _port: u16| {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let now = answer.lock().unwrap().clone();
            Box::pin(async move { Ok(now) })
        })
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_host_name_is_looked_up_once_and_again_when_its_address_fails() {
        // Issue 31 item 5: no getaddrinfo per job; a changed address is
        // followed at the first connection that fails, without failing it.
        use std::sync::atomic::{AtomicUsize, Ordering};
        let first = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let second = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let answer = Arc::new(Mutex::new(vec![first.local_addr().unwrap()]));
        let calls = Arc::new(AtomicUsize::new(0));
        let t = Target::parse_with(
            "http://upstream.internal:8080",
            counted(Arc::clone(&answer), Arc::clone(&calls)),
        )
        .unwrap();
        t.resolve().await.unwrap();
        let timeout = Duration::from_secs(5);
        for _ in 0..5 {
            t.connect(timeout).await.unwrap();
            first.accept().await.unwrap();
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "one lookup for six connections"
        );
        // The name moves to the second server and the first goes away.
        *answer.lock().unwrap() = vec![second.local_addr().unwrap()];
        drop(first);
        t.connect(timeout).await.unwrap();
        second.accept().await.unwrap();
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "looked up again after the failure"
        );
        t.connect(timeout).await.unwrap();
        second.accept().await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_upstream_connection_comes_with_nagle_off() {
        // Issue 31: a request head is sent as written, and the option is set
        // as the connection is made, not by each caller on the request's path.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let t = Target::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let stream = t.connect(Duration::from_secs(5)).await.unwrap();
        assert!(stream.nodelay().unwrap());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_last_connection_attempt_is_taken_once_by_any_clone() {
        // Issue 31: the observation after a job learns from the job's own
        // connection that the upstream answered.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let t = Target::parse(&format!("http://{addr}")).unwrap();
        let observer = t.clone();
        assert_eq!(observer.take_last_connect(), None, "nothing tried yet");
        t.connect(Duration::from_secs(5)).await.unwrap();
        assert_eq!(observer.take_last_connect(), Some(true));
        assert_eq!(observer.take_last_connect(), None, "taken once");
        assert!(!observer.last_connect_failed());
        drop(listener);
        t.connect(Duration::from_secs(5)).await.unwrap_err();
        assert!(observer.last_connect_failed(), "seen, and left to take");
        assert_eq!(observer.take_last_connect(), Some(false));
        assert!(!observer.last_connect_failed());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_unchanged_address_that_refuses_fails_the_connection_and_an_ip_is_never_looked_up() {
        // DONE-02: a refused connection is reported as one (nothing was sent).
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (_refusing, addr) = crate::test_prereq::refusing_port();
        let calls = Arc::new(AtomicUsize::new(0));
        let t = Target::parse_with(
            "http://upstream.internal:8080",
            counted(Arc::new(Mutex::new(vec![addr])), Arc::clone(&calls)),
        )
        .unwrap();
        let err = t.connect(Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(err, ConnectError::Failed(_)), "{err:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "first use looks it up");
        t.connect(Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "a failure looks it up again"
        );
        let ip = Target::parse_with(
            &format!("http://{addr}"),
            counted(Arc::new(Mutex::new(Vec::new())), Arc::clone(&calls)),
        )
        .unwrap();
        ip.connect(Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "an IP address is never looked up"
        );
    }
}
