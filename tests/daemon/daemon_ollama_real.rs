//! vacancyd end to end in front of REAL Ollama servers: 0.5.4 and 0.9.3, Intel's
//! ipex-llm builds from PyPI on the CPU (`vacancy_test_support::OllamaServer`),
//! serving a tiny model created from a generated GGUF with a Modelfile
//! (`PARAMETER num_ctx 2048`).
//!
//! Routes and the Ollama refusal dialect (ROUTE-08, ROUTE-12, ADM-01/02,
//! RES-21), `/api/ps` observation of a model preloaded before vacancyd started
//! (OBS-01, RES-09), `options.num_ctx` reloads and 0.9.3's two default slots
//! (RES-05, RES-10), runner options (RES-04), a re-created model's new digest
//! (RES-14) and the official `ollama` Python client through vacancyd.
//!
//! These releases report no `context_length` in `/api/ps` (Ollama added it
//! in 0.10.0), so the adapter proves what is loaded (name, digest, unload
//! time) but never that a request reuses the loaded context: every request
//! is charged as a load, and the refusal says why. Resident credit by request
//! kind is tested on the emulator of a later release (`daemon_ollama.rs`).
//!
//! As there, `gpu0` has 5000 MiB free with a 1000 MiB reserve and a request
//! charged in full needs 8000 MiB above the reserve: refused at `LOW`,
//! admitted at `HIGH`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::Daemon;
use serde_json::{Value, json};
use vacancy_test_support::ollama::modelfile;
use vacancy_test_support::{
    CountingShim, HttpReply, OllamaRelease, OllamaServer, PythonVenv, TinyModel, http_request,
    http_stream,
};

const JSON: (&str, &str) = ("content-type", "application/json");
/// Free MiB that admits a request charged in full (8000 + 1000 reserve).
const HIGH: u64 = 20_000;
/// Free MiB that admits only a credited request: no request, on these releases.
const LOW: u64 = 5000;
const MODEL: &str = "tiny:latest";
/// The official client, pinned.
const OLLAMA_CLIENT: &str = "ollama==0.6.3";

fn config(dir: &Path, control: u16, proxy: u16, target: &str) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:{control}"

[owner]
presence = "none"

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "{capacity}"
reserve_mib = 1000
poll_ms = 60000
max_sample_age_ms = 120000

[[upstream]]
name = "ollama"
adapter = "ollama"
listen = "127.0.0.1:{proxy}"
target = "{target}"
resource = "gpu0"
default_min_free_mib = 8000
"#,
        capacity = dir.join("gpu0.json").display(),
    )
}

/// A configuration directory for `target` with `gpu0` at `free` MiB free:
/// (the directory, the config path, control port, proxy port).
fn prepare(target: &str, free: u64) -> (tempfile::TempDir, PathBuf, u16, u16) {
    common::prepare(free, |dir, control, proxy| {
        config(dir, control, proxy, target)
    })
}

fn start(target: &str, free: u64) -> Daemon {
    let (dir, path, control, proxy) = prepare(target, free);
    Daemon::start_with(dir, &path, control, proxy)
}

/// A real Ollama of `release` with `tiny` created from the default tiny GGUF
/// (`PARAMETER num_ctx 2048`).
fn ollama(release: OllamaRelease) -> OllamaServer {
    let server = OllamaServer::start(release).unwrap();
    let gguf = TinyModel::default().ensure().unwrap();
    server
        .create("tiny", &modelfile(&gguf, Some(2048)))
        .unwrap();
    server
}

fn generate(options: Option<Value>) -> Value {
    let mut body = json!({"model": "tiny", "prompt": "hi", "stream": false});
    body["options"] = options.unwrap_or_else(|| json!({"num_predict": 4}));
    body
}

async fn post(d: &Daemon, path: &str, body: &Value) -> HttpReply {
    tokio::time::timeout(
        Duration::from_secs(60),
        http_request(
            "POST",
            &format!("{}{path}", d.proxy),
            &[JSON],
            body.to_string().into_bytes(),
        ),
    )
    .await
    .expect("the request answered within 60 s")
    .unwrap()
}

/// Straight to Ollama, as the owner would.
async fn direct(server: &OllamaServer, method: &str, path: &str, body: Option<Value>) -> HttpReply {
    http_request(
        method,
        &format!("{}{path}", server.base_url()),
        &[JSON],
        body.map(|b| b.to_string().into_bytes()).unwrap_or_default(),
    )
    .await
    .unwrap()
}

/// A 503 `insufficient_memory` in Ollama's dialect (`{"error": "code: why"}`)
/// saying why no resident credit applied (RES-21); its error text.
fn assert_uncredited(r: &HttpReply) -> String {
    assert_eq!(r.status, 503, "{}", r.text());
    let body = r.json().unwrap();
    let error = body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("Ollama dialect {{\"error\": \"...\"}}: {body}"))
        .to_owned();
    assert!(error.starts_with("insufficient_memory: "), "{error}");
    assert!(error.contains("no resident credit: "), "{error}");
    error
}

/// `/status` `upstreams[0].residency`, joined with ` | `.
fn residency(s: &Value) -> String {
    s["upstreams"][0]["residency"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or_default().to_owned())
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .unwrap_or_default()
}

async fn wait_residency(d: &Daemon, what: &str, pred: impl Fn(&str) -> bool) -> Value {
    d.wait_status(what, |s| pred(&residency(s))).await
}

/// What the residency says of a model loaded on a release before 0.10.0.
const NO_CONTEXT_LENGTH: &str = "Ollama's /api/ps reports no context_length for tiny:latest (releases before 0.10.0 report none)";

/// The daemon's log, ANSI colours removed.
fn plain_log(d: &Daemon) -> String {
    let log = d.process.log();
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_and_refusals_speak_ollamas_dialect_on_real_ollama() {
    // ROUTE-08, ROUTE-12, ADM-01, ADM-02, RES-21 on Ollama 0.5.4
    let server = ollama(OllamaRelease::V0_5_4);
    let shim = CountingShim::start(server.addr()).unwrap();
    let d = start(&shim.base_url(), HIGH);
    // Management and owner data: 403 in Ollama's dialect, never forwarded.
    let marker = "borrower-probe";
    for (method, path, body) in [
        ("POST", "/api/show", json!({"model": "tiny"}).to_string()),
        ("GET", "/api/ps", String::new()),
        ("POST", "/api/pull", json!({"model": marker}).to_string()),
        ("POST", "/api/create", json!({"model": marker}).to_string()),
        (
            "DELETE",
            "/api/delete",
            json!({"model": "tiny"}).to_string(),
        ),
    ] {
        let r = http_request(
            method,
            &format!("{}{path}", d.proxy),
            &[JSON],
            body.into_bytes(),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 403, "{method} {path}: {}", r.text());
        let error = r.json().unwrap()["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            error.starts_with("route_forbidden: "),
            "{method} {path}: {error}"
        );
    }
    // None reached Ollama (nothing is loaded, so vacancyd's own
    // observations read /api/ps only, never /api/show).
    let reached: Vec<String> = shim.records().into_iter().map(|r| r.path).collect();
    assert!(reached.iter().all(|p| p == "/api/ps"), "{reached:?}");
    let tags = direct(&server, "GET", "/api/tags", None).await;
    assert_eq!(
        tags.json().unwrap()["models"].as_array().unwrap().len(),
        1,
        "tiny is not deleted"
    );

    // Discovery is forwarded, unadmitted: the real server's own answers.
    for path in ["/api/tags", "/api/version", "/v1/models", "/"] {
        let r = http_request("GET", &format!("{}{path}", d.proxy), &[], Vec::new())
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    let version = http_request("GET", &format!("{}/api/version", d.proxy), &[], Vec::new())
        .await
        .unwrap();
    assert!(
        version.json().unwrap()["version"]
            .as_str()
            .unwrap()
            .starts_with("0.5.4")
    );

    // Work is admitted and answered by Ollama, native and OpenAI-compatible.
    let r = post(&d, "/api/generate", &generate(None)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json().unwrap()["done"], true);
    let r = post(
        &d,
        "/v1/chat/completions",
        &json!({"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json().unwrap()["choices"][0]["message"]["content"].is_string());
    // Ollama's own errors pass through as they came.
    let r = post(
        &d,
        "/api/generate",
        &json!({"model": "nope", "prompt": "x"}),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(
        r.json().unwrap(),
        json!({"error": "model 'nope' not found"})
    );

    // ADM-01/02: a second request while one generates is refused at once,
    // `resource_busy` with Retry-After, in Ollama's dialect.
    let url = format!("{}/api/generate", d.proxy);
    let long = json!({"model": "tiny", "prompt": "hi", "options": {"num_predict": 1500}});
    let mut stream = http_stream("POST", &url, &[JSON], long.to_string().into_bytes())
        .await
        .unwrap();
    assert_eq!(stream.status, 200);
    stream.next_chunk().await.unwrap().unwrap();
    let busy = post(&d, "/api/generate", &generate(None)).await;
    assert_eq!(busy.status, 503, "{}", busy.text());
    assert_eq!(busy.headers["retry-after"], "2");
    let error = busy.json().unwrap()["error"].as_str().unwrap().to_owned();
    assert!(error.starts_with("resource_busy: "), "{error}");
    drop(stream);

    // Memory: charged in full, refused with why.
    drop(d);
    let d = start(&shim.base_url(), LOW);
    let error = assert_uncredited(&post(&d, "/api/generate", &generate(None)).await);
    assert!(error.contains("8000"), "{error}");
    // Ollama saw the admitted generations only: the first, the unknown
    // model's and the long one; no refused one.
    let generates = shim
        .records()
        .iter()
        .filter(|r| r.path == "/api/generate")
        .count();
    assert_eq!(generates, 3, "{:?}", shim.records());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_preloaded_before_vacancyd_is_observed_but_never_credited() {
    // OBS-01, RES-09, RES-10, RES-21 on both releases: /api/ps shows the
    // model, its digest and unload time but no context_length; the
    // Modelfile is read once per digest; 0.9.3 loads it with two slots.
    for release in OllamaRelease::ALL {
        let v = release.version();
        let server = ollama(release);
        // The owner's preload: an empty generate loads the model.
        let r = direct(
            &server,
            "POST",
            "/api/generate",
            Some(json!({"model": "tiny"})),
        )
        .await;
        assert_eq!(
            r.json().unwrap()["done_reason"],
            "load",
            "{v}: {}",
            r.text()
        );
        let runners = server.runners();
        assert_eq!(runners.len(), 1, "{v}: {runners:?}");
        let slots = release.default_parallel();
        assert_eq!(runners[0].parallel, Some(slots), "{v}");
        assert_eq!(
            runners[0].ctx_size,
            Some(2048 * slots),
            "{v}: Modelfile context × slots"
        );
        let digest: String = direct(&server, "GET", "/api/tags", None)
            .await
            .json()
            .unwrap()["models"][0]["digest"]
            .as_str()
            .unwrap()
            .chars()
            .take(12)
            .collect();

        let shim = CountingShim::start(server.addr()).unwrap();
        let d = start(&shim.base_url(), LOW);
        let s = wait_residency(&d, "the preloaded model", |r| r.contains(MODEL)).await;
        let r = residency(&s);
        assert!(r.contains(&format!("digest {digest}")), "{v}: {r}");
        assert!(r.contains("not proven"), "{v}: {r}");
        assert!(r.contains(NO_CONTEXT_LENGTH), "{v}: {r}");

        // RES-21: the refusal says why the loaded model gives no credit.
        let error = assert_uncredited(&post(&d, "/api/generate", &generate(None)).await);
        assert!(error.contains(NO_CONTEXT_LENGTH), "{v}: {error}");
        // So is a request naming the Modelfile's context, and on 0.9.3 that
        // is right: the loaded context is 4096, not 2048.
        let error = assert_uncredited(
            &post(
                &d,
                "/api/generate",
                &generate(Some(json!({"num_ctx": 2048}))),
            )
            .await,
        );
        assert!(error.contains(NO_CONTEXT_LENGTH), "{v}: {error}");
        // RES-09: /api/show read once for the one digest, whatever the
        // number of observations.
        let ps = || {
            shim.records()
                .iter()
                .filter(|r| r.path == "/api/ps")
                .count()
        };
        let seen = ps();
        wait_residency(&d, "two more observations", |_| ps() >= seen + 2).await;
        let shows = shim
            .records()
            .iter()
            .filter(|r| r.path == "/api/show")
            .count();
        assert_eq!(shows, 1, "{v}");
        assert!(
            !shim.records().iter().any(|r| r.path == "/api/generate"),
            "{v}: refusals never reach Ollama"
        );
        assert_eq!(
            server.runners()[0].pid,
            runners[0].pid,
            "{v}: nothing reloaded"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_num_ctx_request_reloads_the_real_model_and_runner_options_are_refused() {
    // RES-05, RES-04, RES-21 on Ollama 0.9.3
    let server = ollama(OllamaRelease::V0_9_3);
    let d = start(&server.base_url(), HIGH);
    let r = post(&d, "/api/generate", &generate(None)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let first = server.runners();
    assert_eq!(first[0].ctx_size, Some(4096), "{first:?}");
    // options.num_ctx of 1024 reloads the model with 1024 per slot.
    let r = post(
        &d,
        "/api/generate",
        &generate(Some(json!({"num_ctx": 1024, "num_predict": 2}))),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let second = server.runners();
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second[0].pid, first[0].pid, "a new runner");
    assert_eq!(second[0].ctx_size, Some(2048), "1024 × 2 slots: {second:?}");
    wait_residency(&d, "the reloaded model observed", |r| {
        r.contains(MODEL) && r.contains(NO_CONTEXT_LENGTH)
    })
    .await;
    drop(d);

    // RES-04: a runner option is never credited, and the refusal says which.
    let d = start(&server.base_url(), LOW);
    wait_residency(&d, "the model observed", |r| r.contains(MODEL)).await;
    let error = assert_uncredited(
        &post(
            &d,
            "/api/generate",
            &generate(Some(json!({"num_ctx": 1024, "num_thread": 1}))),
        )
        .await,
    );
    assert!(
        error.contains("no resident credit: the request sets runner option num_thread"),
        "{error}"
    );
    assert_eq!(
        server.runners()[0].pid,
        second[0].pid,
        "refused before Ollama: no reload"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_created_models_new_digest_forgets_its_learned_contexts() {
    // RES-14, RES-13, RES-15 on Ollama 0.9.3: contexts learned under one
    // digest (here written by an earlier run, as an Ollama reporting
    // context_length would have taught) are forgotten once /api/ps shows the
    // model re-created with other weights.
    let server = ollama(OllamaRelease::V0_9_3);
    let tags = direct(&server, "GET", "/api/tags", None)
        .await
        .json()
        .unwrap();
    let old_digest = tags["models"][0]["digest"].as_str().unwrap().to_owned();
    let r = direct(
        &server,
        "POST",
        "/api/generate",
        Some(json!({"model": "tiny"})),
    )
    .await;
    assert_eq!(r.status, 200);
    let (dir, path, control, proxy) = prepare(&server.base_url(), HIGH);
    let admission = dir.path().join("vacancyd.admission");
    std::fs::create_dir_all(&admission).unwrap();
    std::fs::set_permissions(
        &admission,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let learned = json!({
        "version": 1,
        "upstreams": {"ollama": {"models": {MODEL: {
            "digest": old_digest, "parallel": true, "learned": 1,
            "kinds": [{"num_ctx": null, "family": "api", "context": 4096}]
        }}}}
    });
    let cache = admission.join("learned-contexts.json");
    std::fs::write(&cache, learned.to_string()).unwrap();
    // The recovery directory's files are private to vacancyd's account.
    std::fs::set_permissions(&cache, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let d = Daemon::start_with(dir, &path, control, proxy);
    let seen = wait_residency(&d, "the model observed", |r| r.contains(MODEL)).await;
    // Same digest: kept.
    let kept: Value = serde_json::from_slice(&std::fs::read(&cache).unwrap()).unwrap();
    assert_eq!(
        kept["upstreams"]["ollama"]["models"][MODEL]["kinds"]
            .as_array()
            .map(Vec::len),
        Some(1),
        "{kept} after {}",
        residency(&seen)
    );

    // The owner re-creates the model from other weights and loads it.
    let other = TinyModel {
        seed: 7,
        ..TinyModel::default()
    }
    .ensure()
    .unwrap();
    server
        .create("tiny", &modelfile(&other, Some(2048)))
        .unwrap();
    let r = direct(
        &server,
        "POST",
        "/api/generate",
        Some(json!({"model": "tiny"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let tags = direct(&server, "GET", "/api/tags", None)
        .await
        .json()
        .unwrap();
    let new_digest = tags["models"][0]["digest"].as_str().unwrap().to_owned();
    assert_ne!(new_digest, old_digest, "other weights, another digest");
    let short: String = new_digest.chars().take(12).collect();
    wait_residency(&d, "the new digest observed", |r| r.contains(&short)).await;
    let forgot: Value = serde_json::from_slice(&std::fs::read(&cache).unwrap()).unwrap();
    assert!(
        forgot["upstreams"]["ollama"]["models"].get(MODEL).is_none(),
        "the old digest's contexts are forgotten: {forgot}"
    );
    assert!(
        plain_log(&d).contains("learned Ollama contexts loaded"),
        "the cache was read at startup"
    );
}

/// The official client through vacancyd: listing, generating and chatting
/// pass; a refusal is a `ResponseError` with the status and vacancyd's text.
const CLIENT_SCRIPT: &str = r#"
import sys
import ollama

c = ollama.Client(host=sys.argv[1])
mode = sys.argv[2]
if mode == "works":
    names = [m.model for m in c.list().models]
    assert names == ["tiny:latest"], names
    r = c.generate(model="tiny", prompt="hi", options={"num_predict": 3})
    assert r.done and r.eval_count == 3, r
    r = c.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2})
    assert r.message.role == "assistant", r
    parts = list(c.generate(model="tiny", prompt="hi", stream=True, options={"num_predict": 3}))
    assert parts[-1].done, parts
    print("client works")
else:
    try:
        c.generate(model="tiny", prompt="hi", options={"num_predict": 3})
    except ollama.ResponseError as e:
        print(f"refused {e.status_code}: {e.error}")
    else:
        sys.exit("a refusal was expected")
"#;

async fn run_client(venv: &Path, proxy: &str, mode: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("client.py");
    std::fs::write(&script, CLIENT_SCRIPT).unwrap();
    let out = tokio::process::Command::new(PythonVenv::python(venv))
        .arg(&script)
        .arg(proxy)
        .arg(mode)
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{mode}: {text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_client_works_through_vacancyd_and_shows_its_refusals() {
    let venv = PythonVenv::ensure("ollama-client", &[OLLAMA_CLIENT]).unwrap();
    let server = ollama(OllamaRelease::V0_5_4);
    let d = start(&server.base_url(), HIGH);
    let text = run_client(&venv, &d.proxy, "works").await;
    assert!(text.contains("client works"), "{text}");

    // A busy resource: ResponseError 503 with vacancyd's `resource_busy` text.
    let url = format!("{}/api/generate", d.proxy);
    let long = json!({"model": "tiny", "prompt": "hi", "options": {"num_predict": 1500}});
    let mut stream = http_stream("POST", &url, &[JSON], long.to_string().into_bytes())
        .await
        .unwrap();
    assert_eq!(stream.status, 200);
    stream.next_chunk().await.unwrap().unwrap();
    let text = run_client(&venv, &d.proxy, "refused").await;
    assert!(text.contains("refused 503: resource_busy: "), "{text}");
    drop(stream);
    drop(d);

    // Not enough memory: ResponseError 503 saying why.
    let d = start(&server.base_url(), LOW);
    let text = run_client(&venv, &d.proxy, "refused").await;
    assert!(
        text.contains("refused 503: insufficient_memory: "),
        "{text}"
    );
    assert!(text.contains("no resident credit"), "{text}");
}
