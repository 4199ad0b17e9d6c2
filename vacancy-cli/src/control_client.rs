//! The CLI as a client of the control plane (`vacancyd status`, `vacancyd
//! admin-request`, `vacancyd token new`): one request helper, and why a call
//! did not get its answer, each saying what went wrong and what to do.

use std::path::PathBuf;

/// A CLI call to the control plane that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The action words are not an action.
    #[error(
        "actions: release_work <id> | lending on|off | resource <name> on|off | presence present|away"
    )]
    Usage,
    /// A switch that is neither `on` nor `off`.
    #[error("expected on or off, not {0:?}")]
    OnOff(String),
    /// The token file could not be read.
    #[error("cannot read the token file {path}: {source}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The token file is empty.
    #[error("the token file {0} is empty")]
    EmptyTokenFile(PathBuf),
    /// No token was given.
    #[error(
        "no token: pass --token-file FILE or set VACANCYD_TOKEN (create one with `vacancyd token new`)"
    )]
    NoToken,
    /// No random token could be drawn.
    #[error("cannot draw a random token: {0}")]
    Random(String),
    /// The control listener's URL is not one.
    #[error("{url:?} is not a URL: {reason}")]
    Url {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The request could not be built.
    #[error("cannot build the request to {url}: {reason}")]
    Request {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// No answer in time.
    #[error("no answer from {url} within {secs} s")]
    Timeout {
        /// The URL.
        url: String,
        /// The limit.
        secs: u64,
    },
    /// The daemon could not be reached.
    #[error("cannot reach vacancyd at {url}: {reason}{hint}")]
    Unreachable {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
        /// What to check, where there is something to say.
        hint: &'static str,
    },
    /// The reply broke off.
    #[error("reading {what}: {reason}")]
    Reading {
        /// What was being read: the reply, or the URL it came from.
        what: String,
        /// Why.
        reason: String,
    },
    /// The daemon refused the action, with its reason.
    #[error("{status}: {message}")]
    Refused {
        /// The reply's status.
        status: http::StatusCode,
        /// The reply's error message, or its body.
        message: String,
    },
    /// `/status` answered with an error status.
    #[error("{url} answered {status}")]
    Status {
        /// The URL.
        url: String,
        /// The status.
        status: http::StatusCode,
    },
    /// The local administration pipe refused this caller (HELD-09).
    #[error(
        "the local administration pipe {pipe} admits only Administrators and LocalSystem: run \
         `vacancyd admin-request` as an administrator (an elevated prompt: right-click the \
         terminal, \"Run as administrator\"), or pass a token with --token-file to use the \
         control listener"
    )]
    NotAdministrator {
        /// The pipe.
        pipe: String,
    },
    /// No daemon serves the local administration pipe.
    #[error("vacancyd is not running here: there is no local administration pipe {pipe}")]
    NoPipe {
        /// The pipe.
        pipe: String,
    },
    /// The local administration pipe failed.
    #[error("the local administration pipe {pipe} failed: {reason}")]
    Pipe {
        /// The pipe.
        pipe: String,
        /// Why.
        reason: String,
    },
    /// `/status` did not answer JSON.
    #[error("{url} did not answer JSON: {reason}")]
    NotJson {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
}

/// One request to the control listener: its status and whole body, within
/// `secs` seconds. `hint` follows the reason when the daemon is unreachable;
/// `reading` names what was being read when the body broke off.
pub(crate) async fn exchange(
    req: http::Request<http_body_util::Full<bytes::Bytes>>,
    url: &str,
    secs: u64,
    hint: &'static str,
    reading: &str,
) -> Result<(http::StatusCode, bytes::Bytes), ClientError> {
    use http_body_util::BodyExt;
    let client: hyper_util::client::legacy::Client<_, http_body_util::Full<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let resp = tokio::time::timeout(std::time::Duration::from_secs(secs), client.request(req))
        .await
        .map_err(|_| ClientError::Timeout {
            url: url.to_owned(),
            secs,
        })?
        .map_err(|e| ClientError::Unreachable {
            url: url.to_owned(),
            reason: e.to_string(),
            hint,
        })?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| ClientError::Reading {
            what: reading.to_owned(),
            reason: e.to_string(),
        })?
        .to_bytes();
    Ok((status, body))
}
