//! Where an upstream lives, parsed once from its configured URL.

use crate::config::parse_target;

/// Where an upstream lives: the address to connect to, the `Host` to send, and
/// the path prefix of its base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Host to connect to.
    pub host: String,
    /// Port to connect to.
    pub port: u16,
    /// `host:port` as the `Host` header says it.
    pub authority: String,
    /// The base URL's path without a trailing slash (`""` for none).
    pub prefix: String,
}

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

impl Target {
    /// Parse a configured `http://` target, checked as the configuration
    /// checks every `target` (one parser for both). HTTPS targets are not
    /// proxied by this release.
    pub fn parse(target: &str) -> Result<Target, TargetError> {
        let checked = parse_target(target).map_err(TargetError::Invalid)?;
        if !checked.scheme.eq_ignore_ascii_case("http") {
            return Err(TargetError::Scheme {
                target: target.to_owned(),
                scheme: checked.scheme,
            });
        }
        Ok(Target {
            host: checked.host,
            port: checked.port,
            authority: checked.authority,
            prefix: checked.prefix,
        })
    }
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
}
