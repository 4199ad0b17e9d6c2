//! vacancyd end to end in front of voice servers: a REAL OpenAI-compatible
//! TTS server (local-tts-studio + Piper, CPU) for speech admission, busy
//! refusal, clean-end release, budgets and borrower reads; and the
//! engine-switching emulator of the project's compatible-voice-server
//! contract for durable executions, engine residency and upstream errors.
//! Rules: VOICE-01..20, ADM-01/02, DONE-01, DONE-03, ROUTE-03.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::{Value, json};
use vacancy_test_support::{
    StatusEngineFault, SynthesisFailure, TtsServer, VoiceEmulator, VoiceEmulatorOptions,
    VoiceFaults, http_request,
};

const JSON: (&str, &str) = ("content-type", "application/json");

/// `gpu0` with a 1000 MiB reserve; the voice upstream's budgets are the
/// seed's test vector (VOICE-17), with 300 MiB resident headroom (VOICE-18).
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
poll_ms = 500
max_sample_age_ms = 120000

[[upstream]]
name = "voice"
adapter = "chatterbox"
listen = "127.0.0.1:{proxy}"
target = "{target}"
resource = "gpu0"
default_min_free_mib = 11500
resident_min_free_mib = 300

[upstream.models]
qwen = {{ min_free_mib = 6000 }}
qwen-design = {{ min_free_mib = 6000 }}
breeze = {{ min_free_mib = 11500 }}
"#,
        capacity = dir.join("gpu0.json").display(),
    )
}

/// vacancyd in front of `target` with `free` MiB free on gpu0.
fn start(target: &str, free: u64) -> Daemon {
    Daemon::start_prepared(free, |dir, control, proxy| {
        config(dir, control, proxy, target)
    })
}

async fn post(d: &Daemon, path: &str, body: &Value) -> vacancy_test_support::HttpReply {
    http_request(
        "POST",
        &format!("{}{path}", d.proxy),
        &[JSON],
        body.to_string().into_bytes(),
    )
    .await
    .unwrap()
}

/// A borrower's speech request for `model` ("hi").
async fn speak(d: &Daemon, model: &str) -> vacancy_test_support::HttpReply {
    post(
        d,
        "/v1/audio/speech",
        &json!({"model": model, "input": "hi"}),
    )
    .await
}

/// Wait until vacancyd has observed the voice server.
async fn observed(d: &Daemon) {
    d.wait_status("an observation", |s| s["upstreams"][0]["reachable"] == true)
        .await;
}

async fn get(d: &Daemon, path: &str) -> vacancy_test_support::HttpReply {
    http_request("GET", &format!("{}{path}", d.proxy), &[], Vec::new())
        .await
        .unwrap()
}

async fn no_work(d: &Daemon) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = d.status().await;
        if s["work"].as_array().is_some_and(Vec::is_empty) {
            return;
        }
        assert!(Instant::now() < deadline, "still held: {s:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wait for a fresh sample after the last job, so the next request is decided
/// on capacity rather than waiting.
async fn settled(d: &Daemon) {
    no_work(d).await;
    d.wait_status("a fresh sample", |s| {
        s["resources"][0]["awaiting_fresh_sample"] == false
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speech_on_a_real_tts_server_is_admitted_budgeted_and_released_at_its_end() {
    // VOICE-02, VOICE-17, DONE-01, ADM-01/02, VOICE-06..08 on local-tts-studio.
    let tts = TtsServer::start().unwrap();
    // 9000 free - 1000 reserve: qwen's 6000 fits, the 11,500 default does not.
    let d = start(&tts.base_url(), 9000);

    let speech =
        json!({"model": "qwen", "input": "Hello from a borrowed voice.", "response_format": "wav"});
    let reply = post(&d, "/v1/audio/speech", &speech).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.body.starts_with(b"RIFF"), "a WAV file");
    no_work(&d).await;

    // VOICE-17: the budget follows the request's top-level model exactly.
    settled(&d).await;
    for model in ["breeze", "tts-1", "Qwen"] {
        let r = post(
            &d,
            "/v1/audio/speech",
            &json!({"model": model, "input": "x"}),
        )
        .await;
        assert_eq!(r.status, 503, "{model}: {}", r.text());
        let body = r.json().unwrap();
        assert_eq!(body["error"]["code"], "insufficient_memory", "{model}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("11500"),
            "{body}"
        );
    }

    // ADM-01/02: a second request while one synthesizes is refused at once.
    settled(&d).await;
    let long = "This sentence keeps the voice busy for a while. ".repeat(40);
    let url = format!("{}/v1/audio/speech", d.proxy);
    let body = json!({"model": "qwen", "input": long})
        .to_string()
        .into_bytes();
    let first = tokio::spawn({
        let (url, body) = (url.clone(), body.clone());
        async move { http_request("POST", &url, &[JSON], body).await.unwrap() }
    });
    d.wait_status("the first synthesis to be admitted", |s| {
        s["work"].as_array().is_some_and(|w| w.len() == 1)
    })
    .await;
    let second = post(
        &d,
        "/v1/audio/speech",
        &json!({"model": "qwen", "input": "me too"}),
    )
    .await;
    assert_eq!(second.status, 503, "{}", second.text());
    assert_eq!(second.headers["retry-after"], "2");
    assert_eq!(second.json().unwrap()["error"]["code"], "resource_busy");
    let first = first.await.unwrap();
    assert_eq!(first.status, 200);
    no_work(&d).await;

    // Malformed bodies are 400 before anything is reserved or forwarded.
    settled(&d).await;
    let r = http_request("POST", &url, &[JSON], b"not json".to_vec())
        .await
        .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json().unwrap()["error"]["code"], "invalid_request");

    // VOICE-06/07/08: reads with a conforming ID pass without admission;
    // another ID, or an unlisted read, is 403 and never forwarded.
    let r = get(&d, "/v1/audio/executions/exec_0123456789abcdef").await;
    assert_ne!(r.status, 403, "a conforming result-read ID is forwarded");
    for path in [
        "/v1/audio/executions/bad.id",
        "/v1/audio/executions/short",
        "/api/health",
        "/settings",
    ] {
        let r = get(&d, path).await;
        assert_eq!(r.status, 403, "{path}: {}", r.text());
        assert_eq!(
            r.json().unwrap()["error"]["code"],
            "route_forbidden",
            "{path}"
        );
    }
    assert_eq!(get(&d, "/v1/models").await.status, 200);
    let s = d.status().await;
    assert!(
        s["work"].as_array().unwrap().is_empty(),
        "reads reserve nothing: {s:#}"
    );
}

fn emulator(options: VoiceEmulatorOptions) -> VoiceEmulator {
    VoiceEmulator::start(options).unwrap()
}

/// Wait until /status shows the voice server's residency as `want`.
async fn residency(d: &Daemon, want: &str) {
    d.wait_status(want, |s| {
        s["upstreams"][0]["residency"].as_array().is_some_and(|r| {
            r.iter()
                .any(|l| l.as_str().is_some_and(|l| l.contains(want)))
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_request_naming_the_loaded_idle_engine_is_credited() {
    // VOICE-10..14, VOICE-18, VOICE-19, RES-21
    let emu = emulator(VoiceEmulatorOptions::default()); // qwen loaded
    // 3000 free - 1000 reserve: only resident credit (300) fits.
    let d = start(&emu.base_url(), 3000);
    residency(&d, "qwen: loaded; resident for voice engine qwen").await;
    // VOICE-19: the route's vacancy uses the default cold budget.
    let s = d.status().await;
    assert_eq!(s["upstreams"][0]["vacancy"]["admitting"], false, "{s:#}");

    let r = speak(&d, "qwen").await;
    assert_eq!(r.status, 200, "{}", r.text());
    settled(&d).await;
    residency(&d, "resident for voice engine qwen").await;
    // VOICE-13: another engine pays its cold budget; VOICE-14: an alias is never credited.
    for (model, why) in [
        ("breeze", "breeze"),
        ("qwen-design", "qwen-design"),
        ("default", "generic alias"),
    ] {
        let r = speak(&d, model).await;
        assert_eq!(r.status, 503, "{model}: {}", r.text());
        let msg = r.json().unwrap()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(msg.contains("no resident credit"), "{model}: {msg}");
        assert!(msg.contains(why), "{model}: {msg}");
    }
    assert_eq!(
        emu.synthesis_count("breeze"),
        0,
        "refusals never reach the server"
    );
    assert_eq!(emu.loaded_engine().as_deref(), Some("qwen"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_null_or_empty_engine_proves_nothing_and_legacy_servers_keep_fixed_models() {
    // VOICE-15, VOICE-16
    let emu = emulator(VoiceEmulatorOptions::default()); // qwen loaded
    // 3000 free - 1000 reserve: only resident credit (300) fits.
    let d = start(&emu.base_url(), 3000);
    for fault in [
        StatusEngineFault::Null,
        StatusEngineFault::Empty,
        StatusEngineFault::NotAString,
    ] {
        // Each fault starts from a proven engine, so the refusal below comes
        // from an observation of this fault and of no earlier one.
        emu.set_faults(VoiceFaults::default());
        residency(&d, "resident for voice engine qwen").await;
        emu.set_faults(VoiceFaults {
            status_engine: Some(fault),
            ..VoiceFaults::default()
        });
        d.wait_status(&format!("an observation of the {fault:?} engine"), |s| {
            s["upstreams"][0]["reachable"] == true
                && s["upstreams"][0]["residency"]
                    .as_array()
                    .is_some_and(|r| r.iter().all(|l| !l.as_str().unwrap_or("").contains("qwen")))
        })
        .await;
        let r = speak(&d, "qwen").await;
        assert_eq!(r.status, 503, "{fault:?}: {}", r.text());
        let msg = r.json().unwrap()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(msg.contains("no resident credit"), "{fault:?}: {msg}");
    }
    drop(d);

    let legacy = emulator(VoiceEmulatorOptions {
        legacy: true,
        ..VoiceEmulatorOptions::default()
    });
    let d = start(&legacy.base_url(), 3000);
    residency(&d, "qwen: loaded; resident").await;
    let r = speak(&d, "qwen").await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_execution_holds_until_its_response_ends_and_its_results_are_borrower_reads() {
    // VOICE-01..06
    let emu = emulator(VoiceEmulatorOptions {
        synthesis_time: Duration::from_millis(800),
        ..VoiceEmulatorOptions::default()
    });
    let d = start(&emu.base_url(), 20_000);
    observed(&d).await;
    let exec = tokio::spawn({
        let url = format!("{}/v1/audio/executions", d.proxy);
        async move {
            http_request(
                "POST",
                &url,
                &[JSON],
                json!({"model": "qwen", "input": "durable"})
                    .to_string()
                    .into_bytes(),
            )
            .await
            .unwrap()
        }
    });
    // VOICE-01: held while the server keeps the response open.
    let s = d
        .wait_status("the execution to be admitted", |s| {
            s["work"].as_array().is_some_and(|w| w.len() == 1)
        })
        .await;
    assert_eq!(s["work"][0]["completion"], "response_end");
    let reply = exec.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    let receipt = reply.json().unwrap();
    // VOICE-03: the clean end released it.
    no_work(&d).await;
    let id = receipt["id"].as_str().unwrap().to_owned();
    // VOICE-05/06: lookup and replay are forwarded without admission.
    let r = get(&d, &format!("/v1/audio/executions/{id}")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json().unwrap()["status"], "completed");
    let audio = get(&d, &format!("/v1/audio/executions/{id}/audio")).await;
    assert_eq!(audio.status, 200);
    assert!(audio.body.starts_with(b"RIFF"));
    assert_eq!(get(&d, "/v1/audio/capabilities").await.status, 200);
    assert!(d.status().await["work"].as_array().unwrap().is_empty());
    assert_eq!(emu.synthesis_count("qwen"), 1, "reads never synthesize");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_errors_are_passed_on_never_retried() {
    // VOICE-09, VOICE-20, DONE-03
    let emu = emulator(VoiceEmulatorOptions::default());
    emu.set_faults(VoiceFaults {
        fail_synthesis: Some(SynthesisFailure::ServerError),
        ..VoiceFaults::default()
    });
    let d = start(&emu.base_url(), 20_000);
    observed(&d).await;
    let r = speak(&d, "qwen").await;
    assert_eq!(
        r.status,
        500,
        "the upstream's error, as it came: {}",
        r.text()
    );
    assert_eq!(emu.synthesis_count("qwen"), 1, "not retried");
    no_work(&d).await; // a clean (error) response end releases

    // A response cut mid-body is held (DONE-03), and not retried either.
    settled(&d).await;
    emu.set_faults(VoiceFaults {
        fail_synthesis: Some(SynthesisFailure::CutMidBody),
        ..VoiceFaults::default()
    });
    let _ = http_request(
        "POST",
        &format!("{}/v1/audio/speech", d.proxy),
        &[JSON],
        json!({"model": "qwen", "input": "hi"})
            .to_string()
            .into_bytes(),
    )
    .await;
    let s = d
        .wait_status("the cut response to be held", |s| {
            s["work"][0]["phase"] == "held"
        })
        .await;
    assert_eq!(s["work"].as_array().unwrap().len(), 1);
    assert_eq!(emu.synthesis_count("qwen"), 2, "not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_answered_202_early_is_released_at_that_response_end() {
    // VOICE-04 (reading): vacancyd releases on the clean end (VOICE-03); a
    // server that answers 202 while synthesis goes on breaks the contract,
    // and this shows what the owner then risks: the GPU is lent again early.
    let emu = emulator(VoiceEmulatorOptions {
        synthesis_time: Duration::from_millis(1500),
        ..VoiceEmulatorOptions::default()
    });
    emu.set_faults(VoiceFaults {
        early_accept: true,
        ..VoiceFaults::default()
    });
    let d = start(&emu.base_url(), 20_000);
    observed(&d).await;
    let r = post(
        &d,
        "/v1/audio/executions",
        &json!({"model": "qwen", "input": "early"}),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.text());
    no_work(&d).await;
    assert!(emu.busy(), "the non-conformant server still synthesizes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_observation_keeps_the_engine_name_the_server_reports() {
    // VOICE-11: the engine's name is kept exactly as /status reports it
    // (case and punctuation included), and only that name gets its credit.
    let engine = "Qwen3-TTS_v2.1";
    let emu = emulator(VoiceEmulatorOptions {
        engines: vec![engine.to_owned(), "breeze".to_owned()],
        loaded: Some(engine.to_owned()),
        ..VoiceEmulatorOptions::default()
    });
    // 3000 free - 1000 reserve: only resident credit (300) fits.
    let d = start(&emu.base_url(), 3000);
    residency(
        &d,
        &format!("{engine}: loaded; resident for voice engine {engine}"),
    )
    .await;
    let r = speak(&d, engine).await;
    assert_eq!(r.status, 200, "{}", r.text());
    settled(&d).await;
    residency(&d, &format!("resident for voice engine {engine}")).await;
    let r = speak(&d, &engine.to_lowercase()).await;
    assert_eq!(
        r.status,
        503,
        "another name is another engine: {}",
        r.text()
    );
    assert_eq!(emu.synthesis_count(engine), 1);
}

// Issue 14 item 17: local-tts-studio answers its web page (200 text/html) at
// GET /status. The chatterbox adapter cannot read that, which is an
// observation failure: /status says why, and the log says so once (not at
// every poll, and not only at debug level).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_page_that_is_not_the_voice_status_is_logged_once_with_the_reason() {
    let tts = TtsServer::start().unwrap();
    let (dir, path, control, proxy) = common::prepare(20_000, |dir, control, proxy| {
        config(dir, control, proxy, &tts.base_url())
    });
    // Debug lines of the observation loop show each poll.
    let filter = [(
        "VACANCYD_LOG",
        "info,vacancy::shell::loops::observation=debug",
    )];
    let d = Daemon::start_with_env(dir, &path, control, proxy, &filter);
    let s = d
        .wait_status("the observation failure in /status", |s| {
            s["upstreams"][0]["error"].is_string()
        })
        .await;
    let error = s["upstreams"][0]["error"].as_str().unwrap().to_owned();
    assert_eq!(s["upstreams"][0]["reachable"], true, "{s:#}");
    for expected in ["GET /status", "not JSON (text/html", "\"loaded\""] {
        assert!(error.contains(expected), "{expected:?} not in {error:?}");
    }

    // Three more polls (one every 2 s) fail the same way ...
    let polls = |d: &Daemon| {
        d.process
            .log()
            .lines()
            .filter(|l| l.contains("upstream=voice") && l.contains("GET /status"))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while polls(&d) < 4 {
        assert!(
            Instant::now() < deadline,
            "no further observations:\n{}",
            d.process.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // ... and the failure is a warning once, with its reason.
    let log = d.process.log();
    let failures: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("observation failed"))
        .collect();
    assert_eq!(failures.len(), 1, "{log}");
    assert!(failures[0].contains(" WARN "), "{}", failures[0]);
    assert!(failures[0].contains("upstream=voice"), "{}", failures[0]);
    assert!(
        failures[0].contains("not JSON (text/html"),
        "{}",
        failures[0]
    );
}
