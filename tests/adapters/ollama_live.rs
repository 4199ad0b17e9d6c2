//! The Ollama adapter's observation against the Ollama API emulator of
//! `vacancy-test-support` (Ollama v0.32.15 wire shapes): `GET /api/ps` with
//! vacancy's own credential, RES-03's 30-second rule, OBS-03 on garbage,
//! `/api/show` once per digest, learning, unloading and yields.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use vacancy::Adapter;
use vacancy::MonotonicClock;
use vacancy::engine::{Lesson, ResidencyEvidence};
use vacancy::traits::{ObserveError, ReclaimError, UnloadAck};
use vacancy_adapters::ollama::{ContextCache, Family, RequestKind};
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
    assert_eq!(obs.visible_work, None);
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

fn kind(model: &str, num_ctx: Option<u64>, family: Family) -> String {
    RequestKind {
        model: model.into(),
        num_ctx,
        family,
    }
    .to_string()
}

fn credited(obs: &vacancy::engine::ModelObservation) -> Vec<String> {
    match &obs.models[0].evidence {
        ResidencyEvidence::ProvenFor { kinds, .. } => {
            let mut k = kinds.clone();
            k.sort();
            k
        }
        other => panic!("{other:?}"),
    }
}

fn paths(emulator: &OllamaEmulator) -> Vec<String> {
    emulator
        .requests()
        .into_iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_modelfile_num_ctx_is_read_once_per_digest_and_credits_unset_kinds() {
    // RES-09, RES-05 (c), RES-14
    let emulator = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    assert!(emulator.set_modelfile_num_ctx("llama3", Some(2048)));
    emulator.preload("llama3", None).unwrap();
    let a = adapter(&emulator);
    for _ in 0..3 {
        let obs = a.observe().await.unwrap();
        assert_eq!(obs.models[0].context_length, Some(2048));
        let mut want = vec![
            kind("llama3:latest", Some(2048), Family::Api),
            kind("llama3:latest", None, Family::Api),
            kind("llama3:latest", None, Family::V1),
        ];
        want.sort();
        assert_eq!(credited(&obs), want);
    }
    let shows = paths(&emulator)
        .into_iter()
        .filter(|p| p == "POST /api/show")
        .count();
    assert_eq!(shows, 1, "once per digest");
    // A new digest (as after `ollama pull`) is read again.
    assert!(emulator.set_digest("llama3", &"e".repeat(64)));
    a.observe().await.unwrap(); // the loaded runner still has the old weights
    emulator.preload("llama3", None).unwrap(); // reloaded with the new ones
    let obs = a.observe().await.unwrap();
    assert_eq!(
        obs.models[0].digest.as_deref(),
        Some("e".repeat(64).as_str())
    );
    let shows = paths(&emulator)
        .into_iter()
        .filter(|p| p == "POST /api/show")
        .count();
    assert_eq!(shows, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_show_withholds_only_the_modelfile_rule() {
    // OBS-03 for /api/show: no (c) credit, (b) still applies.
    let emulator = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    assert!(emulator.set_modelfile_num_ctx("llama3", Some(4096)));
    emulator.preload("llama3", None).unwrap();
    emulator.set_override("/api/show", Some((200, r#"{"parameters": 7}"#.into())));
    let obs = adapter(&emulator).observe().await.unwrap();
    assert_eq!(
        credited(&obs),
        [kind("llama3:latest", Some(4096), Family::Api)]
    );
    let ResidencyEvidence::ProvenFor { otherwise, .. } = &obs.models[0].evidence else {
        panic!();
    };
    assert!(
        otherwise.contains("Modelfile num_ctx unknown"),
        "{otherwise}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lesson_teaches_the_kind_its_context_and_parallel_slots_narrow_credit() {
    // RES-07, RES-08, RES-10, RES-13 (in the shared cache)
    let emulator = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    emulator.set_parallel(2);
    emulator.preload("llama3", Some(2048)).unwrap(); // 2 slots × 2048
    let cache = std::sync::Arc::new(ContextCache::in_memory());
    let a = adapter(&emulator).with_context_cache(std::sync::Arc::clone(&cache), "ollama");
    let mut obs = a.observe().await.unwrap();
    assert_eq!(obs.models[0].context_length, Some(4096));
    // Before learning, an explicit num_ctx 4096 would be credited (RES-05 b).
    assert_eq!(
        credited(&obs),
        [kind("llama3:latest", Some(4096), Family::Api)]
    );
    let lesson = Lesson {
        model: "llama3:latest".into(),
        kind: kind("llama3:latest", Some(2048), Family::Api),
        finished_at: a.settings().clock.now(),
    };
    a.learn(&lesson, &mut obs).await;
    // Parallel slots seen: only the learned kind is credited now.
    assert_eq!(
        credited(&obs),
        [kind("llama3:latest", Some(2048), Family::Api)]
    );
    let learned = cache.read("ollama", |c| c.models["llama3:latest"].clone());
    assert!(learned.parallel);
    assert_eq!(learned.kinds[0].context, 4096);
    // A later observation keeps it.
    assert_eq!(
        credited(&a.observe().await.unwrap()),
        [kind("llama3:latest", Some(2048), Family::Api)]
    );
    // A lesson about a model that is not loaded teaches nothing.
    let mut empty = a.observe().await.unwrap();
    empty.models.clear();
    let other = Lesson {
        model: "phi3:latest".into(),
        kind: kind("phi3:latest", None, Family::V1),
        finished_at: a.settings().clock.now(),
    };
    a.learn(&other, &mut empty).await;
    assert!(cache.read("ollama", |c| !c.models.contains_key("phi3:latest")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unloading_sends_keep_alive_zero_for_every_model_and_checks_the_answer() {
    // RECL-40, RECL-47, RECL-48 (the Ollama side of a yield)
    let emulator = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    emulator.preload("llama3", None).unwrap();
    emulator.preload("qwen2.5:7b", None).unwrap();
    let a = adapter(&emulator);
    let reclaimer = a.reclaimer().unwrap();
    assert_eq!(
        reclaimer.unload().await,
        Ok(UnloadAck::Acknowledged { models: Some(2) })
    );
    assert!(emulator.loaded().is_empty());
    let unloads: Vec<_> = emulator
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/generate")
        .collect();
    assert_eq!(unloads.len(), 2);
    // Nothing loaded: acknowledged with zero models.
    assert_eq!(
        reclaimer.unload().await,
        Ok(UnloadAck::Acknowledged { models: Some(0) })
    );
    // An answer that is not Ollama's unload acknowledgement is a rejection.
    emulator.preload("llama3", None).unwrap();
    emulator.set_override(
        "/api/generate",
        Some((200, r#"{"done":true,"done_reason":"stop"}"#.into())),
    );
    assert!(matches!(
        reclaimer.unload().await,
        Err(ReclaimError::Rejected(_))
    ));
    emulator.set_override("/api/generate", Some((500, r#"{"error":"boom"}"#.into())));
    assert!(matches!(
        reclaimer.unload().await,
        Err(ReclaimError::Rejected(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_yield_is_counted_and_disturbs_residency_but_releases_nothing() {
    // OBS-04 (vacancyd_yields_total), RECL-45, RECL-49
    use vacancy::shell::loops::observation::{Yielded, observe_upstream, yield_upstream};

    let emulator = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    emulator.preload("llama3", None).unwrap();
    let adapter = adapter(&emulator);
    let clock = adapter.settings().clock;
    let (lender, route) = vacancy::testkit::lone_upstream(
        "ollama",
        std::sync::Arc::new(adapter),
        &emulator.base_url(),
        clock,
    )
    .unwrap();
    observe_upstream(&lender, &route).await.unwrap();
    let ack = yield_upstream(&lender, &route, &[]).await.unwrap();
    assert_eq!(
        ack,
        Yielded::Unloaded(UnloadAck::Acknowledged { models: Some(1) })
    );
    let status = lender.status();
    let metrics = lender.metrics().render(&status);
    assert!(
        metrics.contains("vacancyd_yields_total{upstream=\"ollama\"} 1"),
        "{metrics}"
    );
    // Not recovered memory: the resource waits for a sample taken after the yield.
    assert!(!status.upstreams[0].vacancy.admitting, "{status:?}");
    lender.record_sample(
        "testkit",
        Ok(vacancy::CapacitySample::memory(
            1 << 20,
            1 << 21,
            clock.now(),
        )),
        clock.now(),
    );
    assert!(lender.status().upstreams[0].vacancy.admitting);
    // A failed unload counts nothing.
    emulator.preload("llama3", None).unwrap();
    emulator.set_override("/api/generate", Some((500, r#"{"error":"boom"}"#.into())));
    assert!(yield_upstream(&lender, &route, &[]).await.is_err());
    let metrics = lender.metrics().render(&lender.status());
    assert!(
        metrics.contains("vacancyd_yields_total{upstream=\"ollama\"} 1"),
        "{metrics}"
    );
}
