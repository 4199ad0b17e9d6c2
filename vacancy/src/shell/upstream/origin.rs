//! The borrower's `Origin` and `Referer`, where they name the proxy itself.
//!
//! vacancyd sends the target's `Host`, as the upstream expects. A page or
//! WebSocket client that came to vacancyd's listener also sends an `Origin`
//! (and a browser a `Referer`) naming that listener, which no longer matches
//! the `Host` the upstream sees: ComfyUI then answers 403 ("request with non
//! matching host and origin"). Such headers are rewritten to the target's
//! origin, as `Host` is. An origin naming anything else (a web app elsewhere
//! calling the proxy) is forwarded as it came, so the upstream's CORS and
//! cross-site checks still see it.
//!
//! "Names the proxy itself" means: the header's `host[:port]` is the `Host`
//! the borrower sent to vacancyd (the address it reached vacancyd at),
//! ports compared with the scheme's default filled in. That is the
//! same-origin test browsers and ComfyUI apply, made before `Host` changes.

use http::header::{self, HeaderMap, HeaderValue};

use crate::shell::upstream::target::Target;

/// Rewrite `Origin` and `Referer` in `headers` to `target`'s origin where
/// they name `borrower_host`, the `Host` the borrower sent (`None`: none
/// sent, nothing is rewritten).
///
/// # Behavior
///
/// - `Origin: <scheme>://<borrower_host>` becomes `http://<target authority>`.
/// - `Referer: <scheme>://<borrower_host><path>` becomes
///   `http://<target authority><target prefix><path>`, the same path mapping
///   the request itself gets.
/// - Any other value, `Origin: null`, a value with user info, a repeated
///   header or one that is not visible ASCII is left as it is.
pub fn rewrite_own_origin(headers: &mut HeaderMap, borrower_host: Option<&str>, target: &Target) {
    let Some(host) = borrower_host else {
        return;
    };
    // Most requests: nothing to rewrite, nothing to format. One pass over
    // the few names a request has costs less than two lookups (issue 31).
    if !headers
        .keys()
        .any(|k| k == header::ORIGIN || k == header::REFERER)
    {
        return;
    }
    let target_origin = format!("http://{}", target.authority);
    if let Some(url) = single(headers, &header::ORIGIN)
        && let Some((scheme, authority, rest)) = split_url(&url)
        && rest.is_empty()
        && names_host(scheme, authority, host)
        && let Ok(v) = HeaderValue::from_str(&target_origin)
    {
        headers.insert(header::ORIGIN, v);
    }
    if let Some(url) = single(headers, &header::REFERER)
        && let Some((scheme, authority, rest)) = split_url(&url)
        && names_host(scheme, authority, host)
        && let Ok(v) = HeaderValue::from_str(&format!("{target_origin}{}{rest}", target.prefix))
    {
        headers.insert(header::REFERER, v);
    }
}

/// The header's one value as text; `None` if absent, repeated or not ASCII.
fn single(headers: &HeaderMap, name: &header::HeaderName) -> Option<String> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    if values.next().is_some() {
        return None;
    }
    first.to_str().ok().map(str::to_owned)
}

/// `scheme://authority rest` → (scheme, authority, rest), where `rest` is
/// the path, query and fragment (possibly empty). `None` for anything else,
/// including an authority with user info.
fn split_url(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, after) = url.split_once("://")?;
    if scheme.is_empty()
        || !scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    {
        return None;
    }
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let (authority, rest) = after.split_at(end);
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    Some((scheme, authority, rest))
}

/// Whether `authority` (of a URL with `scheme`) is the same host and port as
/// the `Host` header `host`, a missing port being the scheme's default.
fn names_host(scheme: &str, authority: &str, host: &str) -> bool {
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" | "ws" => 80,
        "https" | "wss" => 443,
        _ => return false,
    };
    match (host_port(authority), host_port(host)) {
        (Some((a, ap)), Some((h, hp))) => {
            a.eq_ignore_ascii_case(h) && ap.unwrap_or(default) == hp.unwrap_or(default)
        }
        _ => false,
    }
}

/// `host[:port]` (`[v6]:port` for IPv6) → (host, port); `None` if the port
/// is not a number.
fn host_port(authority: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (inner, after) = v6.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (inner, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        None => None,
        Some(p) => Some(p.parse::<u16>().ok()?),
    };
    Some((host, port))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn rewritten(
        target: &str,
        host: &str,
        origin: Option<&str>,
        referer: Option<&str>,
    ) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(o) = origin {
            h.insert(header::ORIGIN, HeaderValue::from_str(o).unwrap());
        }
        if let Some(r) = referer {
            h.insert(header::REFERER, HeaderValue::from_str(r).unwrap());
        }
        rewrite_own_origin(&mut h, Some(host), &Target::parse(target).unwrap());
        h
    }

    #[test]
    fn an_origin_naming_the_proxy_becomes_the_targets() {
        // Issue 14 item 5: ComfyUI's WebSocket answered 403 through vacancyd.
        for (host, origin) in [
            ("127.0.0.1:8189", "http://127.0.0.1:8189"),
            ("LOCALHOST:8189", "http://localhost:8189"),
            ("myhost:80", "http://myhost"),
            ("myhost", "http://myhost:80"),
            ("myhost", "https://myhost"),
            ("[::1]:8189", "http://[::1]:8189"),
            ("127.0.0.1:8189", "ws://127.0.0.1:8189"),
        ] {
            let h = rewritten("http://127.0.0.1:8188", host, Some(origin), None);
            assert_eq!(
                h[header::ORIGIN],
                "http://127.0.0.1:8188",
                "{host} {origin}"
            );
        }
    }

    #[test]
    fn any_other_origin_is_left_as_it_came() {
        // Issue 14 item 5: a web app elsewhere keeps its origin for the upstream's CORS.
        for (host, origin) in [
            ("127.0.0.1:8189", "http://127.0.0.1:8190"),
            ("127.0.0.1:8189", "http://localhost:8189"),
            ("127.0.0.1:8189", "https://app.example"),
            ("myhost", "https://myhost:8443"),
            ("127.0.0.1:8189", "null"),
            ("127.0.0.1:8189", "http://user@127.0.0.1:8189"),
            ("127.0.0.1:8189", "http://127.0.0.1:8189/path"),
            ("127.0.0.1:8189", "ftp://127.0.0.1:8189"),
        ] {
            let h = rewritten("http://127.0.0.1:8188", host, Some(origin), None);
            assert_eq!(h[header::ORIGIN], origin, "{host} {origin}");
        }
        // No Host from the borrower: nothing to compare with.
        let mut h = HeaderMap::new();
        h.insert(header::ORIGIN, HeaderValue::from_static("http://a:1"));
        rewrite_own_origin(&mut h, None, &Target::parse("http://b:2").unwrap());
        assert_eq!(h[header::ORIGIN], "http://a:1");
        // A repeated Origin is not guessed at.
        let mut h = HeaderMap::new();
        h.append(header::ORIGIN, HeaderValue::from_static("http://a:1"));
        h.append(header::ORIGIN, HeaderValue::from_static("http://a:1"));
        rewrite_own_origin(&mut h, Some("a:1"), &Target::parse("http://b:2").unwrap());
        assert_eq!(h.get_all(header::ORIGIN).iter().count(), 2);
        assert_eq!(h[header::ORIGIN], "http://a:1");
    }

    #[test]
    fn a_referer_naming_the_proxy_keeps_its_path_under_the_targets_prefix() {
        // Issue 14 item 5.
        let h = rewritten(
            "http://127.0.0.1:8188/base/",
            "127.0.0.1:8189",
            Some("http://127.0.0.1:8189"),
            Some("http://127.0.0.1:8189/index.html?x=1"),
        );
        assert_eq!(h[header::ORIGIN], "http://127.0.0.1:8188");
        assert_eq!(
            h[header::REFERER],
            "http://127.0.0.1:8188/base/index.html?x=1"
        );
        let h = rewritten(
            "http://127.0.0.1:8188",
            "127.0.0.1:8189",
            None,
            Some("https://elsewhere.example/page"),
        );
        assert_eq!(h[header::REFERER], "https://elsewhere.example/page");
        assert!(!h.contains_key(header::ORIGIN));
    }
}
