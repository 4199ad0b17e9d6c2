//! Real Ollama servers (0.5.4 and 0.9.3, Intel's ipex-llm builds from PyPI,
//! on the CPU with the stub GPU backend), checked for what the behaviour tests
//! and the emulator's notes rely on. Each release's checks run in sequence in
//! one test; the two releases run in parallel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use vacancy_test_support::ollama::modelfile;
use vacancy_test_support::{OllamaRelease, OllamaServer, TinyModel, http_request};

fn call(method: &str, url: &str, body: Option<Value>) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (headers, bytes): (&[(&str, &str)], Vec<u8>) = match body {
        Some(b) => (
            &[("content-type", "application/json")],
            b.to_string().into_bytes(),
        ),
        None => (&[], Vec::new()),
    };
    let reply = rt
        .block_on(async {
            tokio::time::timeout(
                Duration::from_secs(60),
                http_request(method, url, headers, bytes),
            )
            .await
        })
        .unwrap_or_else(|_| panic!("{method} {url} timed out"))
        .unwrap();
    let json = reply.json().unwrap_or(Value::Null);
    (reply.status, json)
}

/// Polls `check` every 50 ms for up to 20 s.
fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn checks(release: OllamaRelease) {
    let started = Instant::now();
    let server = OllamaServer::start(release).unwrap();
    eprintln!("Ollama {} up in {:?}", release.version(), started.elapsed());
    let base = server.base_url();
    let v = release.version();

    let (status, version) = call("GET", &format!("{base}/api/version"), None);
    assert_eq!(status, 200);
    assert!(
        version["version"].as_str().unwrap().starts_with(v),
        "{version}"
    );

    let gguf = TinyModel::default().ensure().unwrap();
    server
        .create("tiny", &modelfile(&gguf, Some(2048)))
        .unwrap();
    let (_, tags) = call("GET", &format!("{base}/api/tags"), None);
    assert_eq!(tags["models"][0]["name"], "tiny:latest", "{tags}");
    let digest = tags["models"][0]["digest"].as_str().unwrap().to_owned();
    assert_eq!(digest.len(), 64, "{tags}");

    // /api/show: the Modelfile's parameters as one text block.
    let (status, show) = call(
        "POST",
        &format!("{base}/api/show"),
        Some(json!({"model": "tiny"})),
    );
    assert_eq!(status, 200, "{show}");
    let parameters = show["parameters"].as_str().unwrap();
    assert!(parameters.contains("num_ctx"), "{parameters}");
    assert!(parameters.contains("2048"), "{parameters}");

    // A generation loads the model with the Modelfile's context per slot.
    let (status, reply) = call(
        "POST",
        &format!("{base}/api/generate"),
        Some(
            json!({"model": "tiny", "prompt": "hi", "stream": false, "options": {"num_predict": 8}}),
        ),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["done"], true);
    assert_eq!(reply["eval_count"], 8, "{reply}");
    let (_, ps) = call("GET", &format!("{base}/api/ps"), None);
    let loaded = &ps["models"][0];
    assert_eq!(loaded["name"], "tiny:latest", "{ps}");
    assert_eq!(loaded["digest"], digest.as_str(), "{ps}");
    assert_eq!(loaded["size_vram"], 0, "{ps}");
    assert!(loaded["expires_at"].is_string(), "{ps}");
    assert!(
        loaded.get("context_length").is_none(),
        "{v} reports no context_length: {ps}"
    );
    let runners = server.runners();
    assert_eq!(runners.len(), 1, "{runners:?}");
    let parallel = release.default_parallel();
    assert_eq!(runners[0].parallel, Some(parallel), "{runners:?}");
    assert_eq!(runners[0].ctx_size, Some(2048 * parallel), "{runners:?}");

    // Another options.num_ctx reloads: a new runner with that context.
    let (status, _) = call(
        "POST",
        &format!("{base}/api/generate"),
        Some(json!({"model": "tiny", "prompt": "hi", "stream": false,
                    "options": {"num_predict": 2, "num_ctx": 1024}})),
    );
    assert_eq!(status, 200);
    let reloaded = server.runners();
    assert_eq!(reloaded.len(), 1, "{reloaded:?}");
    assert_ne!(reloaded[0].pid, runners[0].pid, "a new runner");
    assert_eq!(reloaded[0].ctx_size, Some(1024 * parallel), "{reloaded:?}");

    // The OpenAI-compatible routes.
    let (status, models) = call("GET", &format!("{base}/v1/models"), None);
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], "tiny:latest", "{models}");
    let (status, chat) = call(
        "POST",
        &format!("{base}/v1/chat/completions"),
        Some(json!({"model": "tiny", "max_tokens": 2,
                    "messages": [{"role": "user", "content": "hi"}]})),
    );
    assert_eq!(status, 200, "{chat}");
    assert!(
        chat["choices"][0]["message"]["content"].is_string(),
        "{chat}"
    );

    // Unknown model: 404 in Ollama's error shape.
    let (status, err) = call(
        "POST",
        &format!("{base}/api/generate"),
        Some(json!({"model": "nope", "prompt": "x"})),
    );
    assert_eq!(status, 404);
    assert_eq!(err, json!({"error": "model 'nope' not found"}));

    // keep_alive: 0 unloads: the answer says so, the runner exits.
    let (status, unload) = call(
        "POST",
        &format!("{base}/api/generate"),
        Some(json!({"model": "tiny", "keep_alive": 0})),
    );
    assert_eq!(status, 200);
    assert_eq!(unload["done_reason"], "unload", "{unload}");
    eventually("the runner to exit", || server.runners().is_empty());
    eventually("an empty /api/ps", || {
        call("GET", &format!("{base}/api/ps"), None).1["models"] == json!([])
    });

    // The same GGUF in another store gets another digest.
    let other = OllamaServer::start(release).unwrap();
    other.create("tiny", &modelfile(&gguf, Some(2048))).unwrap();
    let (_, tags) = call("GET", &format!("{}/api/tags", other.base_url()), None);
    assert_ne!(tags["models"][0]["digest"], digest.as_str(), "{tags}");
    assert!(
        server.home_dir().join(".ollama").is_dir(),
        "the server's key lives in its HOME"
    );
}

#[test]
fn ollama_0_5_4() {
    checks(OllamaRelease::V0_5_4);
}

#[test]
fn ollama_0_9_3() {
    checks(OllamaRelease::V0_9_3);
}
