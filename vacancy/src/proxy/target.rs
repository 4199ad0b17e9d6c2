//! Where an upstream lives, parsed once from its configured URL.

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
    /// It does not parse as a URL.
    #[error("target {target:?} is not a URL: {reason}")]
    NotAUrl {
        /// The configured target.
        target: String,
        /// The parser's reason.
        reason: String,
    },
    /// Its scheme is not `http`.
    #[error("target {target:?}: scheme {scheme:?} is not supported; use http://")]
    Scheme {
        /// The configured target.
        target: String,
        /// The scheme it gives.
        scheme: String,
    },
    /// It has no scheme.
    #[error("target {0:?} has no scheme; use http://host:port")]
    NoScheme(String),
    /// It has no host.
    #[error("target {0:?} has no host")]
    NoHost(String),
}

impl Target {
    /// Parse a configured `http://` target. HTTPS targets are not proxied by
    /// this release.
    pub fn parse(target: &str) -> Result<Target, TargetError> {
        let uri: http::Uri =
            target
                .parse()
                .map_err(|e: http::uri::InvalidUri| TargetError::NotAUrl {
                    target: target.to_owned(),
                    reason: e.to_string(),
                })?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(TargetError::Scheme {
                    target: target.to_owned(),
                    scheme: other.to_owned(),
                });
            }
            None => return Err(TargetError::NoScheme(target.to_owned())),
        }
        let host = uri
            .host()
            .ok_or_else(|| TargetError::NoHost(target.to_owned()))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(80);
        let authority = uri
            .authority()
            .map(|a| a.as_str().to_owned())
            .unwrap_or_else(|| format!("{host}:{port}"));
        let prefix = uri.path().trim_end_matches('/').to_owned();
        Ok(Target {
            host,
            port,
            authority,
            prefix,
        })
    }
}
