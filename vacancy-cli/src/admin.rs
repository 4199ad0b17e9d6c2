//! `vacancyd admin-request` and `vacancyd token new`.

use std::path::Path;

use bytes::Bytes;
use http_body_util::Full;

use crate::control_client::{ClientError, exchange};

/// One admin action: the path, the `Vacancy-Intent`, and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    path: String,
    intent: &'static str,
    body: serde_json::Value,
}

fn on_off(word: &str) -> Result<bool, ClientError> {
    match word {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(ClientError::OnOff(other.to_owned())),
    }
}

impl Action {
    /// Parse `release_work <id> | lending on|off | resource <name> on|off | presence present|away`.
    pub fn parse(words: &[String]) -> Result<Action, ClientError> {
        let w: Vec<&str> = words.iter().map(String::as_str).collect();
        match w.as_slice() {
            ["release_work", id] => Ok(Action {
                path: format!("/admin/work/{id}/release"),
                intent: "release_work",
                body: serde_json::json!({"upstream_stopped": true}),
            }),
            ["lending", state] => Ok(Action {
                path: "/admin/lending".to_owned(),
                intent: "lending",
                body: serde_json::json!({"enabled": on_off(state)?}),
            }),
            ["resource", name, state] => Ok(Action {
                path: format!("/admin/resources/{name}"),
                intent: "resource",
                body: serde_json::json!({"enabled": on_off(state)?}),
            }),
            ["presence", "present"] => Ok(Action {
                path: "/admin/owner".to_owned(),
                intent: "presence",
                body: serde_json::json!({"present": true}),
            }),
            ["presence", "away"] => Ok(Action {
                path: "/admin/owner".to_owned(),
                intent: "presence",
                body: serde_json::json!({"present": false}),
            }),
            _ => Err(ClientError::Usage),
        }
    }
}

/// How `admin-request` proves who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// A control-plane token, sent over HTTP.
    Token(String),
    /// None: the local administration pipe, which admits only
    /// Administrators and LocalSystem (HELD-09, Windows).
    LocalPipe,
}

/// The token from `--token-file` or `$VACANCYD_TOKEN`; on Windows, with
/// neither, the local administration pipe.
pub fn credential(file: Option<&Path>) -> Result<Credential, ClientError> {
    match token(file) {
        Ok(t) => Ok(Credential::Token(t)),
        Err(ClientError::NoToken) if cfg!(windows) => Ok(Credential::LocalPipe),
        Err(e) => Err(e),
    }
}

/// Send `action` with `credential`: over HTTP to `base` with a token, or
/// over the local administration pipe.
pub async fn send_with(
    base: &str,
    credential: &Credential,
    action: &Action,
) -> Result<String, ClientError> {
    match credential {
        Credential::Token(token) => send(base, token, action).await,
        #[cfg(windows)]
        Credential::LocalPipe => send_local(action).await,
        #[cfg(not(windows))]
        Credential::LocalPipe => Err(ClientError::NoToken),
    }
}

/// The token from `--token-file`, else `$VACANCYD_TOKEN`.
pub fn token(file: Option<&Path>) -> Result<String, ClientError> {
    if let Some(f) = file {
        let t = std::fs::read_to_string(f).map_err(|source| ClientError::TokenFile {
            path: f.to_path_buf(),
            source,
        })?;
        let t = t.trim().to_owned();
        if t.is_empty() {
            return Err(ClientError::EmptyTokenFile(f.to_path_buf()));
        }
        return Ok(t);
    }
    match std::env::var("VACANCYD_TOKEN") {
        Ok(t) if !t.trim().is_empty() => Ok(t.trim().to_owned()),
        _ => Err(ClientError::NoToken),
    }
}

/// Send `action` to the control listener at `base`; the reply's body on success.
pub async fn send(base: &str, token: &str, action: &Action) -> Result<String, ClientError> {
    let url = format!("{}{}", base.trim_end_matches('/'), action.path);
    let req = http::Request::post(&url)
        .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
        .header("vacancy-intent", action.intent)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(action.body.to_string())))
        .map_err(|e| ClientError::Request {
            url: url.clone(),
            reason: e.to_string(),
        })?;
    let (status, body) = exchange(req, &url, 10, "", "the reply").await?;
    reply_text(status, &body)
}

/// The reply's body on success, else its error message.
fn reply_text(status: http::StatusCode, body: &[u8]) -> Result<String, ClientError> {
    let text = String::from_utf8_lossy(body).into_owned();
    if status.is_success() {
        Ok(text)
    } else {
        let message = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or(text);
        Err(ClientError::Refused { status, message })
    }
}

/// `ERROR_FILE_NOT_FOUND`: no pipe of that name.
const ERROR_FILE_NOT_FOUND: i32 = 2;
/// `ERROR_ACCESS_DENIED`: the pipe's DACL does not admit the caller.
const ERROR_ACCESS_DENIED: i32 = 5;
/// `ERROR_PIPE_BUSY`: every instance is in use; wait and retry.
#[cfg(windows)]
const ERROR_PIPE_BUSY: i32 = 231;

/// Why the local administration pipe `pipe` could not be opened, from the
/// Windows error code, and what to do (HELD-09). Pure, so every build tests it.
#[cfg_attr(not(windows), allow(dead_code))]
fn local_pipe_error(pipe: &str, code: Option<i32>, reason: String) -> ClientError {
    match code {
        Some(ERROR_ACCESS_DENIED) => ClientError::NotAdministrator {
            pipe: pipe.to_owned(),
        },
        Some(ERROR_FILE_NOT_FOUND) => ClientError::NoPipe {
            pipe: pipe.to_owned(),
        },
        _ => ClientError::Pipe {
            pipe: pipe.to_owned(),
            reason,
        },
    }
}

/// Send `action` over the local administration pipe (HELD-09): HTTP/1.1 to
/// the control plane's routes, with no token.
#[cfg(windows)]
pub async fn send_local(action: &Action) -> Result<String, ClientError> {
    use http_body_util::BodyExt;
    use hyper_util::rt::TokioIo;
    use tokio::net::windows::named_pipe::ClientOptions;

    let pipe = crate::admin_pipe::pipe_name();
    let failed = |reason: String| ClientError::Pipe {
        pipe: pipe.clone(),
        reason,
    };
    let mut attempts = 0;
    let client = loop {
        match ClientOptions::new().open(&pipe) {
            Ok(c) => break c,
            Err(e) if e.raw_os_error() == Some(ERROR_PIPE_BUSY) && attempts < 100 => {
                attempts += 1;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => return Err(local_pipe_error(&pipe, e.raw_os_error(), e.to_string())),
        }
    };
    let exchange = async {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client))
            .await
            .map_err(|e| failed(e.to_string()))?;
        tokio::spawn(conn);
        let req = http::Request::post(action.path.as_str())
            .header(http::header::HOST, "localhost")
            .header("vacancy-intent", action.intent)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(action.body.to_string())))
            .map_err(|e| failed(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| failed(e.to_string()))?
            .to_bytes();
        reply_text(status, &body)
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), exchange)
        .await
        .map_err(|_| failed("no answer within 10 s".to_owned()))?
}

/// The text `vacancyd token new` prints: the token once, then the lines to add.
pub fn new_token_text(name: &str, scope: &str) -> Result<String, ClientError> {
    let token = vacancy::auth::new_token().map_err(|e| ClientError::Random(e.to_string()))?;
    let hash = vacancy::auth::hash_token(&token);
    Ok(format!(
        "{token}\n\n# The token above is shown once: store it where the client reads it\n# (a file for --token-file, or VACANCYD_TOKEN). Add these lines to the configuration:\n[[server.token]]\nname = \"{name}\"\nscopes = [\"{scope}\"]\nsha256 = \"{hash}\"\n"
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn actions_map_to_paths_intents_and_bodies() {
        let a = Action::parse(&words("release_work abc")).unwrap();
        assert_eq!(
            (a.path.as_str(), a.intent),
            ("/admin/work/abc/release", "release_work")
        );
        assert_eq!(a.body["upstream_stopped"], true);
        assert_eq!(
            Action::parse(&words("lending off")).unwrap().body["enabled"],
            false
        );
        let r = Action::parse(&words("resource gpu0 on")).unwrap();
        assert_eq!(
            (r.path.as_str(), r.intent),
            ("/admin/resources/gpu0", "resource")
        );
        assert_eq!(
            Action::parse(&words("presence away")).unwrap().body["present"],
            false
        );
        assert!(Action::parse(&words("lending maybe")).is_err());
        assert!(Action::parse(&words("reboot")).is_err());
    }

    // HELD-09: a caller the pipe's DACL turns away is told to run as an administrator.
    #[test]
    fn held_09_a_refused_pipe_says_to_run_as_an_administrator() {
        let pipe = r"\\.\pipe\vacancyd-admin";
        let denied = local_pipe_error(pipe, Some(5), "Access is denied.".to_owned()).to_string();
        assert!(denied.contains("as an administrator"), "{denied}");
        assert!(denied.contains(pipe), "{denied}");
        let absent = local_pipe_error(pipe, Some(2), String::new()).to_string();
        assert!(absent.contains("not running"), "{absent}");
        let other = local_pipe_error(pipe, Some(87), "bad".to_owned()).to_string();
        assert!(other.contains("bad"), "{other}");
    }

    #[test]
    fn token_text_hashes_what_it_prints() {
        let text = new_token_text("ops", "admin").unwrap();
        let token = text.lines().next().unwrap();
        assert!(text.contains(&format!(
            "sha256 = \"{}\"",
            vacancy::auth::hash_token(token)
        )));
        assert!(text.contains("scopes = [\"admin\"]"));
    }
}
