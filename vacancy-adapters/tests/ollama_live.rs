//! The Ollama adapter's observation against the Ollama API emulator of
//! `vacancy-test-support` (Ollama v0.32.15 wire shapes): `GET /api/ps` with
//! vacancy's own credential, RES-03's 30-second rule, OBS-03 on garbage.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use vacancy::Adapter;
use vacancy::MonotonicClock;
use vacancy::engine::ResidencyEvidence;
use vacancy::traits::ObserveError;
use vacancy_adapters::{AdapterSettings, OllamaAdapter};
use vacancy_test_support::{OllamaEmulator, OllamaOptions, http_request};

fn adapter(emulator: &OllamaEmulator) -> OllamaAdapter {
    OllamaAdapter::new(AdapterSettings::new(
        emulator.base_url().parse().unwrap(),
        MonotonicClock::new(),
    ))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preloaded_model_is_proven_resident() {
    // RES-03: the default keep-alive (5 minutes) is well over 30 s away.
    let emulator = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    let a = adapter(&emulator);
    let obs = a.observe().await.unwrap();
    assert!(obs.models.is_empty(), "{obs:?}");

    emulator.preload("llama3", None).unwrap();
    let before = a.settings().clock.now();
    let obs = a.observe().await.unwrap();
    assert!(obs.taken_at >= before);
    assert_eq!(obs.models.len(), 1, "{obs:?}");
    let m = &obs.models[0];
    assert_eq!((m.name.as_str(), m.ready), ("llama3:latest", true));
    assert_eq!(m.context_length, Some(4096));
    assert!(m.digest.is_some());
    // The emulator's models set no Modelfile num_ctx: only an explicit
    // num_ctx equal to the loaded context is known to reuse it (RES-05 b).
    assert_eq!(
        m.evidence,
        ResidencyEvidence::ProvenFor {
            kinds: vec!["llama3:latest, num_ctx 4096, /api".into()],
            otherwise: "llama3:latest is loaded with context 4096, which requests of this kind are not known to reuse (nothing learned for it; the Modelfile sets no num_ctx)".into(),
        }
    );
    assert_eq!(obs.foreign_work, None);
    // Observation reads /api/ps only, with GET (OBS-01: nothing of a borrower's).
    let asked: Vec<_> = emulator
        .requests()
        .into_iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    // /api/show once for the new digest (RES-09).
    assert_eq!(asked, ["GET /api/ps", "GET /api/ps", "POST /api/show"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_unloading_soon_is_not_proven() {
    // RES-03: keep_alive "10s" unloads within 30 s.
    let emulator = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    let reply = http_request(
        "POST",
        &format!("{}/api/generate", emulator.base_url()),
        &[("content-type", "application/json")],
        br#"{"model":"llama3","prompt":"","keep_alive":"10s","stream":false}"#.to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(emulator.loaded().len(), 1);

    let obs = adapter(&emulator).observe().await.unwrap();
    assert_eq!(obs.models.len(), 1, "{obs:?}");
    let model = &obs.models[0];
    assert_eq!(model.name, "llama3:latest");
    assert!(model.ready);
    let ResidencyEvidence::NotProven(why) = &model.evidence else {
        panic!("proven: {model:?}");
    };
    assert!(
        why.starts_with("unloads in ") && why.ends_with(" s"),
        "{why}"
    );
    let secs: i64 = why
        .trim_start_matches("unloads in ")
        .trim_end_matches(" s")
        .parse()
        .unwrap();
    assert!((0..=10).contains(&secs), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_ps_gives_no_credit() {
    // OBS-03: garbage or an error status is an error, never an observation.
    let emulator = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    emulator.preload("llama3", None).unwrap();
    let a = adapter(&emulator);
    for body in [
        r#"{"models":[{"name":"llama3:latest","expires_at":"in five minutes"}]}"#,
        r#"{"loaded":[]}"#,
        "not json",
    ] {
        emulator.set_override("/api/ps", Some((200, body.into())));
        assert!(
            matches!(a.observe().await, Err(ObserveError::Malformed(_))),
            "{body}"
        );
    }
    emulator.set_override("/api/ps", None);
    emulator.set_fail_ps(true);
    assert!(matches!(a.observe().await, Err(ObserveError::Malformed(_))));
    emulator.set_fail_ps(false);
    assert!(matches!(
        a.observe().await.unwrap().models[0].evidence,
        ResidencyEvidence::ProvenFor { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_no_observation() {
    let mut emulator = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    let a = adapter(&emulator);
    emulator.stop();
    assert!(matches!(
        a.observe().await,
        Err(ObserveError::Unreachable(_))
    ));
}
