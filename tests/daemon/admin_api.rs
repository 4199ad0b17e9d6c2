//! The admin API and its CLI against a real daemon and a real llama-server:
//! tokens stored as hashes, scopes read ⊂ owner ⊂ admin, the Vacancy-Intent
//! header, and the release of held work (HELD-04..07), lending and resource
//! switches, manual presence (OWN-01), observation credentials (OBS-01/02).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::process::Command;

use common::{Daemon, JSON, Setup, completion};
use vacancy_test_support::{LlamaOptions, LlamaServer, TinyModel, http_request, http_stream};

const OPS: &str = "ops-token-for-tests";
const OWNER: &str = "owner-token-for-tests";
const READER: &str = "reader-token-for-tests";

fn tokens() -> String {
    let t = |name: &str, scope: &str, token: &str| {
        format!(
            "[[server.token]]\nname = \"{name}\"\nscopes = [\"{scope}\"]\nsha256 = \"{}\"\n",
            vacancy::auth::hash_token(token)
        )
    };
    format!(
        "{}{}{}",
        t("ops", "admin", OPS),
        t("desk", "owner", OWNER),
        t("grafana", "read", READER)
    )
}

fn daemon(target: &str, presence: &str, upstream: &str) -> Daemon {
    let server = tokens();
    Daemon::setup(Setup {
        target,
        server: &server,
        upstream,
        presence,
        ..Setup::default()
    })
}

async fn admin(
    d: &Daemon,
    path: &str,
    token: Option<&str>,
    intent: Option<&str>,
    body: &str,
) -> (u16, serde_json::Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers: Vec<(&str, &str)> = vec![JSON];
    if let Some(a) = &auth {
        headers.push(("authorization", a));
    }
    if let Some(i) = intent {
        headers.push(("vacancy-intent", i));
    }
    let r = http_request(
        "POST",
        &format!("{}{path}", d.control),
        &headers,
        body.as_bytes().to_vec(),
    )
    .await
    .unwrap();
    (r.status, r.json().unwrap_or(serde_json::Value::Null))
}

fn cli(d: &Daemon, token: &str, action: &[&str]) -> std::process::Output {
    let file = d.dir.path().join("token");
    std::fs::write(&file, token).unwrap();
    Command::new(vacancy_test_support::vacancyd())
        .args([
            "admin-request",
            "--url",
            &d.control,
            "--token-file",
            file.to_str().unwrap(),
        ])
        .args(action)
        .output()
        .unwrap()
}

fn busy_model() -> LlamaOptions {
    LlamaOptions {
        model: TinyModel {
            layers: 8,
            embd: 1024,
            seed: 1,
        },
        ..LlamaOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_work_is_released_only_by_an_admin_with_intent_and_confirmation() {
    // HELD-04, HELD-05, HELD-06
    let mut llama = LlamaServer::start(busy_model()).unwrap();
    let d = daemon(&llama.base_url(), "none", "");
    let url = format!("{}/completion", d.proxy);

    // A forwarding entry cannot be released (HELD-06).
    let mut stream = http_stream("POST", &url, &[JSON], completion(400, true))
        .await
        .unwrap();
    stream.next_chunk().await.unwrap().unwrap();
    let s = d.status().await;
    let id = s["work"][0]["id"].as_str().unwrap().to_owned();
    let release = format!("/admin/work/{id}/release");
    let stopped = r#"{"upstream_stopped": true}"#;
    let (status, body) = admin(&d, &release, Some(OPS), Some("release_work"), stopped).await;
    assert_eq!(status, 409, "{body}");

    // Kill the upstream mid-stream: the entry turns held.
    llama.kill().unwrap();
    while let Some(Ok(_)) = stream.next_chunk().await {}
    d.wait_status("a held entry", |s| s["work"][0]["phase"] == "held")
        .await;

    // HELD-05: token, scope, intent and confirmation are all required.
    assert_eq!(
        admin(&d, &release, None, Some("release_work"), stopped)
            .await
            .0,
        401
    );
    assert_eq!(
        admin(
            &d,
            &release,
            Some("not-a-token"),
            Some("release_work"),
            stopped
        )
        .await
        .0,
        401
    );
    assert_eq!(
        admin(&d, &release, Some(READER), Some("release_work"), stopped)
            .await
            .0,
        403
    );
    assert_eq!(
        admin(&d, &release, Some(OWNER), Some("release_work"), stopped)
            .await
            .0,
        403
    );
    let (status, body) = admin(&d, &release, Some(OPS), None, stopped).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("missing_intent"))
    );
    assert_eq!(
        admin(&d, &release, Some(OPS), Some("lending"), stopped)
            .await
            .0,
        403
    );
    let (status, body) = admin(
        &d,
        &release,
        Some(OPS),
        Some("release_work"),
        r#"{"upstream_stopped": false}"#,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        admin(&d, &release, Some(OPS), Some("release_work"), "{oops")
            .await
            .0,
        400
    );
    let unknown = "/admin/work/00000000-0000-0000-0000-000000000042/release";
    assert_eq!(
        admin(&d, unknown, Some(OPS), Some("release_work"), stopped)
            .await
            .0,
        404
    );
    assert_eq!(
        admin(
            &d,
            "/admin/work/nonsense/release",
            Some(OPS),
            Some("release_work"),
            stopped
        )
        .await
        .0,
        404
    );
    assert_eq!(
        d.status().await["work"][0]["phase"],
        "held",
        "nothing above may release it"
    );

    // The CLI releases it with an admin token.
    let out = cli(&d, OPS, &["release_work", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    d.wait_status("the release", |s| {
        s["work"].as_array().is_some_and(|w| w.is_empty())
    })
    .await;
    // HELD-05 again through the CLI: a reader's token is refused with a clear error.
    let out = cli(&d, READER, &["release_work", &id]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("403"));

    // Every admin action is logged with the token's name, never the token.
    let log = d.process.log();
    assert!(log.contains("admin: held work released"), "{log}");
    assert!(log.contains("ops"));
    for secret in [OPS, OWNER, READER] {
        assert!(!log.contains(secret), "a token leaked into the log");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lending_and_resource_switches_refuse_and_readmit() {
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let d = daemon(&llama.base_url(), "none", "");
    let url = format!("{}/completion", d.proxy);
    let code = |r: &vacancy_test_support::HttpReply| {
        r.json().unwrap()["error"]["code"]
            .as_str()
            .map(str::to_owned)
    };

    let out = cli(&d, OWNER, &["lending", "off"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = http_request("POST", &url, &[JSON], completion(2, false))
        .await
        .unwrap();
    assert_eq!(
        (r.status, code(&r).as_deref()),
        (503, Some("lending_paused"))
    );
    // Discovery stays available while lending is refused (ROUTE-12).
    let r = http_request("GET", &format!("{}/v1/models", d.proxy), &[], Vec::new())
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(cli(&d, OWNER, &["lending", "on"]).status.success());

    assert!(
        cli(&d, OWNER, &["resource", "gpu0", "off"])
            .status
            .success()
    );
    let r = http_request("POST", &url, &[JSON], completion(2, false))
        .await
        .unwrap();
    assert_eq!(
        (r.status, code(&r).as_deref()),
        (503, Some("resource_disabled"))
    );
    assert!(cli(&d, OWNER, &["resource", "gpu0", "on"]).status.success());
    let r = http_request("POST", &url, &[JSON], completion(2, false))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());

    let (status, _) = admin(
        &d,
        "/admin/resources/nvme0",
        Some(OWNER),
        Some("resource"),
        r#"{"enabled": true}"#,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = admin(
        &d,
        "/admin/lending",
        Some(READER),
        Some("lending"),
        r#"{"enabled": true}"#,
    )
    .await;
    assert_eq!(status, 403);
    let (status, body) = admin(
        &d,
        "/admin/lending",
        Some(OWNER),
        Some("lending"),
        r#"{"enabled": "yes"}"#,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    // Presence cannot be set by hand unless presence = "manual".
    let (status, _) = admin(
        &d,
        "/admin/owner",
        Some(OWNER),
        Some("presence"),
        r#"{"present": true}"#,
    )
    .await;
    assert_eq!(status, 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_presence_starts_unknown_and_follows_the_owner() {
    // OWN-01: unknown refuses host-scoped work until the owner says away.
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let d = daemon(&llama.base_url(), "manual", "");
    let url = format!("{}/completion", d.proxy);
    let r = http_request("POST", &url, &[JSON], completion(2, false))
        .await
        .unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.json().unwrap()["error"]["code"], "owner_present");
    assert!(cli(&d, OWNER, &["presence", "away"]).status.success());
    let r = http_request("POST", &url, &[JSON], completion(2, false))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(cli(&d, OWNER, &["presence", "present"]).status.success());
    let r = http_request("POST", &url, &[JSON], completion(2, false))
        .await
        .unwrap();
    assert_eq!(r.json().unwrap()["error"]["code"], "owner_present");
    assert_eq!(d.status().await["owner"], "present");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observations_use_the_configured_credential_never_the_borrowers() {
    // OBS-01, OBS-02
    let key = "sk-upstream-key";
    let llama = LlamaServer::start(LlamaOptions {
        api_key: Some(key.to_owned()),
        ..LlamaOptions::default()
    })
    .unwrap();
    // Without a credential the observations are unavailable, and say why.
    let d = daemon(&llama.base_url(), "none", "");
    let s = d
        .wait_status("a failed observation", |s| {
            s["upstreams"][0]["error"].is_string()
        })
        .await;
    let err = s["upstreams"][0]["error"].as_str().unwrap();
    assert!(err.contains("credential"), "{err}");
    assert!(s["upstreams"][0]["models"].as_array().unwrap().is_empty());
    // The borrower's own key goes with its own request only.
    let bearer = format!("Bearer {key}");
    let r = http_request(
        "POST",
        &format!("{}/completion", d.proxy),
        &[JSON, ("authorization", &bearer)],
        completion(2, false),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let s = d.status().await;
    assert!(
        s["upstreams"][0]["models"].as_array().unwrap().is_empty(),
        "a borrower's key must never serve observations"
    );
    drop(d);

    // With [upstream.credential], observations work.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("llama.credential");
    std::fs::write(&file, format!("Bearer {key}\n")).unwrap();
    let upstream = format!(
        "[upstream.credential]\nheader = \"Authorization\"\nvalue_file = \"{}\"\n",
        file.display()
    );
    let d = daemon(&llama.base_url(), "none", &upstream);
    let s = d
        .wait_status("an observation with the credential", |s| {
            s["upstreams"][0]["models"]
                .as_array()
                .is_some_and(|m| !m.is_empty())
        })
        .await;
    assert!(s["upstreams"][0]["error"].is_null(), "{s:#}");
    assert!(
        !d.process.log().contains(key),
        "the credential leaked into the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_case_of_bearer_is_accepted_and_unknown_admin_routes_need_a_token() {
    // Issue 14 item 14 (RFC 9110: the scheme is case-insensitive) and item 19
    // (an unknown /admin route answers 404 only after the token is checked).
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let d = daemon(&llama.base_url(), "none", "");
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let auth = format!("{scheme} {OWNER}");
        let r = http_request(
            "POST",
            &format!("{}/admin/lending", d.control),
            &[
                JSON,
                ("authorization", &auth),
                ("vacancy-intent", "lending"),
            ],
            br#"{"enabled": true}"#.to_vec(),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{scheme}: {}", r.text());
    }
    let (status, body) = admin(&d, "/admin/no-such-thing", None, None, "{}").await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = admin(&d, "/admin/no-such-thing", Some(READER), None, "{}").await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = admin(&d, "/admin/no-such-thing", Some(OWNER), None, "{}").await;
    assert_eq!(status, 404, "{body}");
}
