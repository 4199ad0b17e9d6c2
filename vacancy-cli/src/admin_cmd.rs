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
    let text = String::from_utf8_lossy(&body).into_owned();
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
