//! The llama.cpp adapter against a REAL llama-server (llama.cpp's server code
//! through PyPI `xllamacpp`), started by these tests with tiny random models
//! through `vacancy-test-support` (which installs the venv and makes the models
//! into its cache on first use).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vacancy::Adapter;
use vacancy::MonotonicClock;
use vacancy::engine::{ObservedModel, ResidencyEvidence};
use vacancy::traits::ObserveError;
use vacancy_adapters::{AdapterSettings, LlamaCppAdapter};
use vacancy_test_support::{LlamaOptions, TinyModel};

use support::ServerExt;

fn adapter(settings: AdapterSettings) -> LlamaCppAdapter {
    LlamaCppAdapter::new(settings).unwrap()
}

async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_server_proves_its_model_resident() {
    // RES-16: every slot idle; the model as /v1/models names it; OBS-01: no borrower headers.
    let server = support::start(LlamaOptions {
        alias: Some("vacancy-tiny".into()),
        ..support::tiny()
    })
    .await;
    let a = adapter(server.settings());
    let before = a.settings().clock.now();
    let obs = a.observe().await.unwrap();
    assert!(obs.taken_at >= before);
    assert_eq!(
        obs.models,
        [ObservedModel::new(
            "vacancy-tiny",
            ResidencyEvidence::Proven
        )]
    );
    assert_eq!(obs.visible_work, None);
    assert_eq!(a.verify_stopped().await, Ok(true));

    // A credential the server does not ask for changes nothing.
    let keyed = adapter(server.settings().with_credential(
        http::header::AUTHORIZATION,
        http::HeaderValue::from_static("Bearer not-needed"),
    ));
    assert_eq!(
        keyed.observe().await.unwrap().models[0].evidence,
        ResidencyEvidence::Proven
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_slot_is_foreign_work_and_a_cut_stream_is_proven_stopped() {
    // ADM-09, RES-16, DONE-04 (verify_stopped after a cut borrower).
    let server = support::start(LlamaOptions {
        model: TinyModel {
            layers: 4,
            embd: 256,
            seed: 0,
        },
        parallel: 1,
        ctx: 2048,
        ..LlamaOptions::default()
    })
    .await;
    let a = adapter(server.settings());

    // A borrower that bypasses vacancy: a long streamed completion.
    let mut borrower = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let body = r#"{"prompt":"Once upon a time","n_predict":1900,"ignore_eos":true,"stream":true}"#;
    let request = format!(
        "POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    borrower.write_all(request.as_bytes()).await.unwrap();
    let mut first = [0u8; 64];
    let n = borrower.read(&mut first).await.unwrap();
    assert!(
        String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        server.process().log_tail(30)
    );

    let obs = a.observe().await.unwrap();
    assert_eq!(
        obs.visible_work
            .as_ref()
            .map(|w| (w.jobs, w.description.as_str())),
        Some((1, "1 of 1 slots processing")),
        "{}",
        server.process().log_tail(30)
    );
    assert_eq!(
        obs.models[0].evidence,
        ResidencyEvidence::NotProven("no idle slot (1 of 1 slots processing)".into())
    );
    assert_eq!(a.verify_stopped().await, Ok(false));

    // The borrower goes away: llama-server cancels the task and frees the slot.
    drop(borrower);
    eventually(
        "the slot is idle after the cut",
        Duration::from_secs(20),
        || async { a.verify_stopped().await == Ok(true) },
    )
    .await;
    let obs = a.observe().await.unwrap();
    assert_eq!(obs.visible_work, None);
    assert_eq!(obs.models[0].evidence, ResidencyEvidence::Proven);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_server_under_a_prefix_needs_the_credential() {
    // OBS-02: without [upstream.credential] the observation is unavailable; with it, it works.
    let server = support::start(LlamaOptions {
        api_key: Some("vacancy-test-key".into()),
        api_prefix: Some("/llm".into()),
        ..support::tiny()
    })
    .await;
    let bare = adapter(server.settings_without_credential());
    assert_eq!(
        bare.observe().await,
        Err(ObserveError::Unauthorized(
            "GET /llm/props answered 401 Unauthorized: Invalid API Key".into()
        ))
    );
    assert!(matches!(
        bare.verify_stopped().await,
        Err(ObserveError::Unauthorized(_))
    ));
    let keyed = adapter(server.settings());
    let obs = keyed.observe().await.unwrap();
    assert_eq!(obs.models.len(), 1);
    assert_eq!(obs.models[0].evidence, ResidencyEvidence::Proven);
    assert_eq!(keyed.verify_stopped().await, Ok(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_slots_are_no_evidence() {
    // RES-16: absence of /slots is never "idle".
    let server = support::start(LlamaOptions {
        slots_endpoint: false,
        ..support::tiny()
    })
    .await;
    let a = adapter(server.settings());
    let obs = a.observe().await.unwrap();
    assert_eq!(obs.visible_work, None);
    let ResidencyEvidence::NotProven(why) = &obs.models[0].evidence else {
        panic!("proven without /slots: {obs:?}");
    };
    assert!(
        why.starts_with(
            "the /slots endpoint is unavailable: GET /slots answered 501 Not Implemented"
        ),
        "{why}"
    );
    assert!(matches!(
        a.verify_stopped().await,
        Err(ObserveError::Malformed(m)) if m.contains("501")
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_server_is_observed_without_waking_it() {
    // --sleep-idle-seconds unloads the model: nothing is resident, and reading
    // /slots would reload it, so observation must leave it asleep.
    let server = support::start(LlamaOptions {
        sleep_idle_seconds: Some(1),
        ..support::tiny()
    })
    .await;
    eventually("the server sleeps", Duration::from_secs(15), || async {
        server.get("/props").await["is_sleeping"] == true
    })
    .await;
    let a = adapter(server.settings());
    let obs = a.observe().await.unwrap();
    assert_eq!(obs.models, []);
    assert_eq!(obs.visible_work, None);
    assert_eq!(a.verify_stopped().await, Ok(true));
    assert_eq!(server.get("/props").await["is_sleeping"], true);
    assert!(
        !server.process().log().contains("exiting sleeping state"),
        "observation woke the server:\n{}",
        server.process().log_tail(30)
    );
}

#[tokio::test]
async fn a_closed_port_is_unreachable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let a = adapter(AdapterSettings::new(
        format!("http://127.0.0.1:{port}").parse().unwrap(),
        MonotonicClock::new(),
    ));
    assert!(matches!(
        a.observe().await,
        Err(ObserveError::Unreachable(m)) if m.starts_with("GET /props: ")
    ));
    assert!(matches!(
        a.verify_stopped().await,
        Err(ObserveError::Unreachable(_))
    ));
}
