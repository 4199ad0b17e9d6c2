//! The `Host` header as every listener reads it (RFC 9112 §3.2), and the
//! names the control listener answers to (a DNS-rebinding defence).
//!
//! # Behavior
//!
//! - [`check_host`]: an HTTP/1.1 request with no `Host`, any request with
//!   two or more, or one whose value is not a `host[:port]` is malformed:
//!   the listener answers 400 (RFC 9112 §3.2, issue 30 item 8). HTTP/1.0
//!   may leave it out.
//! - [`HostNames`]: the control listener answers only a `Host` naming the
//!   address the connection arrived on, `localhost`, or a name the
//!   operator lists (`[server] allowed_hosts`); others get 421 (issue 30
//!   item 6). A page on another site whose name was made to resolve to
//!   127.0.0.1 (DNS rebinding) sends its own name, so it cannot read the
//!   control plane through the visitor's browser. Ports are not compared:
//!   a rebinding page uses the listener's port anyway, and a reverse proxy
//!   in front may use another.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderValue};

/// Why a request's `Host` header makes it malformed (a 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// HTTP/1.1 without `Host`.
    #[error(
        "an HTTP/1.1 request must carry a Host header (RFC 9112 section 3.2); send the server's host and port"
    )]
    Missing,
    /// Two or more `Host` fields.
    #[error(
        "the request carries more than one Host header (RFC 9112 section 3.2); send exactly one"
    )]
    Repeated,
    /// A value that is not `host[:port]`.
    #[error("the Host header is not a host and optional port (RFC 9112 section 3.2)")]
    Invalid,
}

/// The request's one `Host` value, `None` where HTTP/1.0 left it out; an
/// error where RFC 9112 §3.2 makes the request malformed.
pub fn check_host(
    version: http::Version,
    headers: &HeaderMap,
) -> Result<Option<&HeaderValue>, HostError> {
    let mut values = headers.get_all(header::HOST).iter();
    let Some(first) = values.next() else {
        return if version >= http::Version::HTTP_11 {
            Err(HostError::Missing)
        } else {
            Ok(None)
        };
    };
    if values.next().is_some() {
        return Err(HostError::Repeated);
    }
    // What nearly every client sends, checked in one pass over its bytes
    // (all visible ASCII, so no text check first: issue 31).
    if is_plain_name_and_port(first.as_bytes()) {
        return Ok(Some(first));
    }
    let text = first.to_str().map_err(|_| HostError::Invalid)?;
    // An empty value is allowed (a target with no authority); anything else
    // must be an authority without user information.
    if !text.is_empty() && !is_authority(text) {
        return Err(HostError::Invalid);
    }
    Ok(Some(first))
}

/// `uri-host [":" port]` with no user information, the port all digits.
fn is_authority(text: &str) -> bool {
    if is_plain_name_and_port(text.as_bytes()) {
        return true;
    }
    let port = match text.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((_, "")) => "",
            Some((_, rest)) => match rest.strip_prefix(':') {
                Some(port) => port,
                None => return false,
            },
            None => return false,
        },
        None => text.rsplit_once(':').map_or("", |(_, port)| port),
    };
    !text.contains('@')
        && port.bytes().all(|b| b.is_ascii_digit())
        && text.parse::<http::uri::Authority>().is_ok()
}

/// Whether `text` is a name or IPv4 address of letters, digits, dots and
/// dashes, with a port of one to five digits or none: what nearly every
/// client sends, and an authority without parsing it (issue 31: the parse
/// showed on every request).
fn is_plain_name_and_port(text: &[u8]) -> bool {
    let (name, port): (&[u8], &[u8]) = match text.iter().position(|&b| b == b':') {
        Some(colon) => (&text[..colon], &text[colon + 1..]),
        None => (text, b"0"),
    };
    !name.is_empty()
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        && (1..=5).contains(&port.len())
        && port.iter().all(u8::is_ascii_digit)
}

/// The host part of a `Host` value, lowercased, without brackets, port or
/// a trailing dot: `"[::1]:7480"` → `"::1"`, `"LocalHost.:80"` →
/// `"localhost"`.
pub fn host_part(value: &str) -> String {
    let host = match value.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => value.rsplit_once(':').map_or(value, |(h, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                value
            }
        }),
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// The names the control listener answers to (see the [module docs](self)).
#[derive(Debug, Clone, Default)]
pub struct HostNames {
    /// `[server] allowed_hosts`, lowercased.
    extra: Vec<String>,
}

impl HostNames {
    /// The listener's own address and `localhost`, plus `allowed` (host
    /// names without ports, any case).
    pub fn new<S: AsRef<str>>(allowed: impl IntoIterator<Item = S>) -> Self {
        HostNames {
            extra: allowed
                .into_iter()
                .map(|n| host_part(n.as_ref()))
                .filter(|n| !n.is_empty())
                .collect(),
        }
    }

    /// Whether a request that arrived on `local` with `Host: host` may be
    /// answered. No `Host` (HTTP/1.0, which no browser sends) is allowed.
    pub fn allows(&self, host: Option<&HeaderValue>, local: IpAddr) -> bool {
        let Some(value) = host else {
            return true;
        };
        let Ok(text) = value.to_str() else {
            return false;
        };
        let name = host_part(text);
        if name == "localhost" || self.extra.contains(&name) {
            return true;
        }
        match name.parse::<IpAddr>() {
            Ok(ip) => same_ip(ip, local),
            Err(_) => false,
        }
    }
}

/// Equal addresses, an IPv4 address matching its IPv4-mapped IPv6 form.
fn same_ip(a: IpAddr, b: IpAddr) -> bool {
    let canonical = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    canonical(a) == canonical(b)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    proptest::proptest! {
        #[test]
        fn rfc_9112_a_plain_name_and_port_is_taken_only_where_the_parse_would_take_it(
            text in "[a-zA-Z0-9.:@\\[\\]%-]{0,12}"
        ) {
            if is_plain_name_and_port(text.as_bytes()) {
                proptest::prop_assert!(
                    !text.contains('@') && text.parse::<http::uri::Authority>().is_ok(),
                    "{}", text
                );
            }
        }
    }

    #[test]
    fn plain_names_and_ports_are_taken_without_a_parse() {
        for plain in [
            "localhost",
            "127.0.0.1:11434",
            "my-box.lan:8188",
            "a:1",
            "x:65535",
            "x:99999",
            "-.-:00000",
        ] {
            assert!(is_plain_name_and_port(plain.as_bytes()), "{plain}");
            assert!(is_authority(plain), "{plain}");
        }
        for other in [
            "", ":80", "a:", "a:123456", "a:b", "[::1]:80", "u@h", "a:1:2", "h_1",
        ] {
            assert!(!is_plain_name_and_port(other.as_bytes()), "{other}");
        }
    }

    fn headers(hosts: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in hosts {
            h.append(header::HOST, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn rfc_9112_one_host_on_http_1_1() {
        // Issue 30 item 8.
        use http::Version;
        assert_eq!(
            check_host(Version::HTTP_11, &headers(&[])),
            Err(HostError::Missing)
        );
        assert_eq!(check_host(Version::HTTP_10, &headers(&[])), Ok(None));
        assert_eq!(
            check_host(Version::HTTP_11, &headers(&["a", "b"])),
            Err(HostError::Repeated)
        );
        assert_eq!(
            check_host(Version::HTTP_10, &headers(&["a", "a"])),
            Err(HostError::Repeated)
        );
        for bad in ["a b", "user@host", "host:port", "[::1", "a/b"] {
            assert_eq!(
                check_host(Version::HTTP_11, &headers(&[bad])),
                Err(HostError::Invalid),
                "{bad}"
            );
        }
        for good in ["", "x", "127.0.0.1:7480", "[::1]:7480", "Example.COM"] {
            assert!(
                check_host(Version::HTTP_11, &headers(&[good])).is_ok(),
                "{good}"
            );
        }
    }

    #[test]
    fn the_control_listener_answers_its_own_names_only() {
        // Issue 30 item 6.
        let names = HostNames::new(["Lender1.LAN", "proxy.example:443"]);
        let v4: IpAddr = "127.0.0.1".parse().unwrap();
        let lan: IpAddr = "192.168.1.5".parse().unwrap();
        let allows = |h: &str, local| names.allows(Some(&HeaderValue::from_str(h).unwrap()), local);
        for ok in [
            "127.0.0.1:7480",
            "127.0.0.1",
            "localhost:7480",
            "LOCALHOST.",
            "lender1.lan:7480",
            "proxy.example",
            "[::ffff:127.0.0.1]:7480",
        ] {
            assert!(allows(ok, v4), "{ok}");
        }
        for refused in [
            "attacker.example:7480",
            "127.0.0.2:7480",
            "192.168.1.5:7480",
            "localhost.attacker.example",
            "",
        ] {
            assert!(!allows(refused, v4), "{refused}");
        }
        assert!(allows("192.168.1.5:7480", lan));
        assert!(allows("[::1]:7480", "::1".parse().unwrap()));
        assert!(names.allows(None, v4), "HTTP/1.0 without Host");
    }
}
