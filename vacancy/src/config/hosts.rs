//! Target URLs and same-server detection (CFG-02, CFG-03, CFG-04, SCOPE-10).

use std::net::IpAddr;

/// The host every loopback spelling normalizes to.
pub const LOOPBACK: &str = "loopback";

/// A parsed upstream `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The scheme as written (`http` or `https`, in any case).
    pub scheme: String,
    /// The host as written, without IPv6 brackets.
    pub host: String,
    /// The explicit port, or 80/443 from the scheme.
    pub port: u16,
    /// The authority as written (`host[:port]`, IPv6 hosts in brackets).
    pub authority: String,
    /// The path prefix without a trailing slash (`""` for none).
    pub prefix: String,
}

/// Parse an upstream `target`: an absolute `http` or `https` URL with a host,
/// an optional port (80/443 by default) and an optional path prefix.
///
/// The error is a sentence saying what is wrong and what is expected.
pub(crate) fn parse_target(target: &str) -> Result<Target, String> {
    const FORM: &str = "expected a base URL such as \"http://127.0.0.1:11434\"";
    if target.trim() != target {
        return Err(format!("{target:?} has leading or trailing spaces; {FORM}"));
    }
    let uri: http::Uri = target
        .parse()
        .map_err(|e| format!("{target:?} is not a valid URL ({e}); {FORM}"))?;
    let default_port = match uri.scheme_str() {
        Some(s) if s.eq_ignore_ascii_case("http") => 80,
        Some(s) if s.eq_ignore_ascii_case("https") => 443,
        Some(other) => {
            return Err(format!(
                "{target:?} has scheme {other:?}; only http and https are supported"
            ));
        }
        None => return Err(format!("{target:?} has no scheme; {FORM}")),
    };
    let Some(authority) = uri.authority() else {
        return Err(format!("{target:?} has no host; {FORM}"));
    };
    if authority.as_str().contains('@') {
        return Err(format!(
            "{target:?} carries user information; put credentials in [upstream.credential] instead"
        ));
    }
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return Err(format!("{target:?} has no host; {FORM}"));
    }
    // Read the port from the text: `Authority::port` is `None` for an
    // out-of-range port such as 99999, which must not silently become 80.
    // (No user information here, so the host starts the authority; an IPv6
    // host keeps its brackets in `host()`.)
    let after_host = authority
        .as_str()
        .get(authority.host().len()..)
        .unwrap_or_default();
    let port = match after_host.strip_prefix(':') {
        None => default_port,
        Some(text) => match text.parse::<u16>() {
            Ok(0) | Err(_) => {
                return Err(format!(
                    "{target:?} has port {text:?}; a port is a number from 1 to 65535"
                ));
            }
            Ok(n) => n,
        },
    };
    if uri.query().is_some() || target.contains('#') {
        return Err(format!(
            "{target:?} has a query or fragment; a target is a base URL, optionally with a path prefix"
        ));
    }
    Ok(Target {
        scheme: uri.scheme_str().unwrap_or_default().to_owned(),
        host: host.to_owned(),
        port,
        authority: authority.as_str().to_owned(),
        prefix: uri.path().trim_end_matches('/').to_owned(),
    })
}

/// Normalize a host for same-server detection (CFG-03, CFG-04, SCOPE-10).
///
/// `localhost`, every 127.0.0.0/8 address, `::1`, `0.0.0.0` and `::` (and their
/// IPv4-mapped IPv6 forms) become [`LOOPBACK`]. Other IP addresses take their
/// canonical text form; other names are lowercased without a trailing dot. A LAN
/// address therefore stays distinct from loopback even if it is this machine's.
pub fn normalize_host(host: &str) -> String {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        let ip = ip.to_canonical();
        return if ip.is_loopback() || ip.is_unspecified() {
            LOOPBACK.to_owned()
        } else {
            ip.to_string()
        };
    }
    let name = bare.strip_suffix('.').unwrap_or(bare).to_ascii_lowercase();
    if name == "localhost" {
        LOOPBACK.to_owned()
    } else {
        name
    }
}

/// The same-server key of an upstream `target`: its normalized host and its port
/// (CFG-02: scheme and path are ignored). `None` when `target` is not a valid
/// `http`/`https` URL with a host.
///
/// Two upstreams whose keys are equal reach the same server: they must borrow
/// the same resources (CFG-01), and an owner-exempt upstream may not share its
/// server with a host-scoped one (SCOPE-10).
///
/// ```
/// use vacancy::config::same_server_key;
/// assert_eq!(
///     same_server_key("http://localhost:11434/v1"),
///     same_server_key("https://127.0.0.2:11434"),
/// );
/// assert_eq!(same_server_key("http://gpu-box/"), Some(("gpu-box".to_owned(), 80)));
/// ```
pub fn same_server_key(target: &str) -> Option<(String, u16)> {
    let t = parse_target(target).ok()?;
    Some((normalize_host(&t.host), t.port))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn key(t: &str) -> (String, u16) {
        same_server_key(t).unwrap()
    }

    #[test]
    fn cfg_02_only_host_and_port_compared() {
        // CFG-02: scheme and path prefix do not matter, the port does.
        assert_eq!(
            key("http://127.0.0.1:8080"),
            key("https://127.0.0.1:8080/v1")
        );
        assert_eq!(key("http://gpu-box:8080/a"), key("http://GPU-BOX.:8080/b/"));
        assert_ne!(key("http://127.0.0.1:8080"), key("http://127.0.0.1:8081"));
        assert_eq!(key("http://h"), ("h".to_owned(), 80));
        assert_eq!(key("https://h"), ("h".to_owned(), 443));
    }

    #[test]
    fn cfg_03_every_loopback_spelling_is_one_host() {
        // CFG-03 and SCOPE-10: loopback, localhost and 0.0.0.0 are the same host.
        let expected = (LOOPBACK.to_owned(), 11434);
        for t in [
            "http://localhost:11434",
            "http://LOCALHOST:11434",
            "http://127.0.0.1:11434",
            "http://127.0.0.2:11434",
            "http://127.255.0.9:11434",
            "http://[::1]:11434",
            "http://0.0.0.0:11434",
            "http://[::]:11434",
            "http://[::ffff:127.0.0.1]:11434",
        ] {
            assert_eq!(key(t), expected, "{t}");
        }
    }

    #[test]
    fn cfg_04_lan_address_differs_from_loopback() {
        // CFG-04
        assert_ne!(
            key("http://192.168.1.5:11434"),
            key("http://127.0.0.1:11434")
        );
        assert_eq!(key("http://192.168.1.5:11434").0, "192.168.1.5");
        assert_eq!(key("http://[fe80::1]:1").0, "fe80::1");
    }

    #[test]
    fn invalid_targets_have_no_key() {
        for t in [
            "",
            "127.0.0.1:8080",
            "ftp://h/",
            "http://:80",
            "http://h:0",
            "http://h:99999",
            "http://user:pw@h/",
            "http://h/?a=b",
            "http://h/#x",
            " http://h",
            "http//h",
        ] {
            assert_eq!(same_server_key(t), None, "{t}");
            assert!(parse_target(t).is_err(), "{t}");
        }
    }
}
