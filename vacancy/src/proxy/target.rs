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

impl Target {
    /// Parse a configured `http://` target. HTTPS targets are not proxied by
    /// this release.
    pub fn parse(target: &str) -> Result<Target, String> {
        let uri: http::Uri = target
            .parse()
            .map_err(|e| format!("target {target:?} is not a URL: {e}"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(format!(
                    "target {target:?}: scheme {other:?} is not supported; use http://"
                ));
            }
            None => {
                return Err(format!(
                    "target {target:?} has no scheme; use http://host:port"
                ));
            }
        }
        let host = uri
            .host()
            .ok_or_else(|| format!("target {target:?} has no host"))?
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
