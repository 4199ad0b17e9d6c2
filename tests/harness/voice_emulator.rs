//! The voice emulator's own behaviour: the compatible-voice-server contract
//! it pins (see `vacancy_test_support::voice_emulator`), engine switches and
//! the fault knobs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use vacancy_test_support::{
    HttpReply, StatusEngineFault, SynthesisFailure, VoiceEmulator, VoiceEmulatorOptions,
    VoiceFaults, http_request, http_stream, synthesized_audio,
};

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async { tokio::time::timeout(Duration::from_secs(30), f).await })
        .expect("the test timed out")
}

async fn call(base: &str, method: &str, path: &str, body: Option<Value>) -> HttpReply {
    let url = format!("{base}{path}");
    let (headers, bytes): (&[(&str, &str)], Vec<u8>) = match body {
        Some(body) => (
            &[("content-type", "application/json")],
            serde_json::to_vec(&body).unwrap(),
        ),
        None => (&[], Vec::new()),
    };
    http_request(method, &url, headers, bytes).await.unwrap()
}

async fn get(base: &str, path: &str) -> Value {
    let reply = call(base, "GET", path, None).await;
    assert_eq!(reply.status, 200, "GET {path}: {}", reply.text());
    reply.json().unwrap()
}

async fn post(base: &str, path: &str, body: Value) -> HttpReply {
    call(base, "POST", path, Some(body)).await
}

fn speech(model: &str, input: &str) -> Value {
    json!({"model": model, "input": input, "voice": "alloy"})
}

/// Polls `/status` until `pred` holds; returns that status.
async fn status_until(base: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = get(base, "/status").await;
        if pred(&status) {
            return status;
        }
        assert!(Instant::now() < deadline, "last /status: {status}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn valid_id(id: &str) -> bool {
    (8..=80).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn start(options: VoiceEmulatorOptions) -> VoiceEmulator {
    VoiceEmulator::start(options).unwrap()
}

#[test]
fn speech_answers_audio_bytes() {
    let emu = start(VoiceEmulatorOptions::default());
    let base = emu.base_url();
    block_on(async {
        let reply = post(&base, "/v1/audio/speech", speech("qwen", "hello")).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.headers["content-type"], "audio/wav");
        assert_eq!(reply.body, synthesized_audio("hello", "wav"));
        assert_eq!(&reply.body[..4], b"RIFF");

        let mut pcm = speech("qwen", "hello");
        pcm["response_format"] = json!("pcm");
        let reply = post(&base, "/v1/audio/speech", pcm).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.headers["content-type"], "audio/pcm");
        assert_eq!(reply.body, synthesized_audio("hello", "pcm"));

        // `voice` is optional; a longer input is longer audio.
        let reply = post(
            &base,
            "/v1/audio/speech",
            json!({"model": "qwen", "input": "a longer sentence"}),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert!(reply.body.len() > synthesized_audio("hello", "wav").len());
    });
    assert_eq!(emu.synthesis_count("qwen"), 3);
    assert_eq!(emu.switch_count(), 0);
    assert_eq!(emu.count("POST", "/v1/audio/speech"), 3);
    assert_eq!(emu.requests()[0].body["model"], "qwen");
}

#[test]
fn bad_bodies_are_openai_style_400s_and_unknown_routes_404() {
    let emu = start(VoiceEmulatorOptions::default());
    let base = emu.base_url();
    block_on(async {
        let url = format!("{base}/v1/audio/speech");
        let raw = http_request("POST", &url, &[], b"not json".to_vec())
            .await
            .unwrap();
        assert_eq!(raw.status, 400);
        let bodies = [
            json!([1, 2]),
            json!({"input": "hi"}),
            json!({"model": "", "input": "hi"}),
            json!({"model": 7, "input": "hi"}),
            json!({"model": "qwen"}),
            json!({"model": "qwen", "input": ""}),
            json!({"model": "whisper", "input": "hi"}),
            json!({"model": "qwen", "input": "hi", "voice": "nobody"}),
            json!({"model": "qwen", "input": "hi", "response_format": "flac"}),
        ];
        for path in ["/v1/audio/speech", "/v1/audio/executions"] {
            for body in &bodies {
                let reply = post(&base, path, body.clone()).await;
                assert_eq!(reply.status, 400, "{path} {body}: {}", reply.text());
                let error = reply.json().unwrap();
                assert!(error["error"]["message"].is_string(), "{error}");
                assert_eq!(error["error"]["type"], "invalid_request_error");
            }
        }
        for (method, path, status) in [
            ("GET", "/nope", 404),
            ("GET", "/v1/audio/transcriptions", 404),
            ("GET", "/v1/audio/executions/short", 404),
            ("GET", "/v1/audio/executions/exec_0000000000000000", 404),
            (
                "GET",
                "/v1/audio/executions/exec_0000000000000000/audio",
                404,
            ),
            ("GET", "/v1/audio/speech", 405),
            ("POST", "/status", 405),
        ] {
            let reply = call(&base, method, path, None).await;
            assert_eq!(reply.status, status, "{method} {path}: {}", reply.text());
            assert!(reply.json().unwrap()["error"]["type"].is_string());
        }
    });
    assert!(emu.synthesis_counts().is_empty());
    assert!(emu.execution_ids().is_empty());
}

#[test]
fn executions_are_held_open_until_published_then_replayed() {
    let emu = start(VoiceEmulatorOptions {
        synthesis_time: Duration::from_millis(300),
        ..VoiceEmulatorOptions::default()
    });
    let base = emu.base_url();
    block_on(async {
        let started = Instant::now();
        let reply = post(&base, "/v1/audio/executions", speech("qwen", "durable")).await;
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(reply.status, 200, "{}", reply.text());
        let receipt = reply.json().unwrap();
        let id = receipt["id"].as_str().unwrap().to_owned();
        assert!(valid_id(&id), "{id}");
        assert_eq!(receipt["status"], "completed");
        assert_eq!(receipt["model"], "qwen");
        assert_eq!(receipt["engine"], "qwen");
        assert_eq!(receipt["object"], "audio.execution");
        assert_eq!(
            receipt["audio_url"],
            format!("/v1/audio/executions/{id}/audio")
        );
        let audio = synthesized_audio("durable", "wav");
        assert_eq!(receipt["bytes"], audio.len());
        assert!(receipt["completed_at"].is_u64());
        // Published before the response: no busy worker left behind.
        assert!(!emu.busy());

        let lookup = get(&base, &format!("/v1/audio/executions/{id}")).await;
        assert_eq!(lookup, receipt);
        assert_eq!(emu.receipt(&id), Some(receipt.clone()));
        let replay = call(&base, "GET", receipt["audio_url"].as_str().unwrap(), None).await;
        assert_eq!(replay.status, 200);
        assert_eq!(replay.headers["content-type"], "audio/wav");
        assert_eq!(replay.body, audio);
        assert_eq!(emu.execution_ids(), vec![id]);
    });
    // Reads never synthesize.
    assert_eq!(emu.synthesis_count("qwen"), 1);
}

#[test]
fn reads_answer_while_busy_without_synthesizing() {
    let emu = start(VoiceEmulatorOptions {
        synthesis_time: Duration::from_millis(1000),
        ..VoiceEmulatorOptions::default()
    });
    let base = emu.base_url();
    block_on(async {
        let work_base = base.clone();
        let work = tokio::spawn(async move {
            post(&work_base, "/v1/audio/executions", speech("qwen", "busy")).await
        });
        let status = status_until(&base, |s| s["busy"] == true).await;
        assert_eq!(
            status,
            json!({"loaded": true, "engine": "qwen", "busy": true})
        );
        let ids = emu.execution_ids();
        assert_eq!(ids.len(), 1);
        let id = &ids[0];

        let started = Instant::now();
        let running = get(&base, &format!("/v1/audio/executions/{id}")).await;
        assert_eq!(running["status"], "running");
        assert!(running.get("bytes").is_none());
        let audio = call(
            &base,
            "GET",
            &format!("/v1/audio/executions/{id}/audio"),
            None,
        )
        .await;
        assert_eq!(audio.status, 409, "{}", audio.text());
        let caps = get(&base, "/v1/audio/capabilities").await;
        assert_eq!(caps["formats"], json!(["wav", "pcm"]));
        get(&base, "/health").await;
        get(&base, "/v1/models").await;
        assert!(started.elapsed() < Duration::from_millis(600));
        assert!(!work.is_finished());

        let reply = work.await.unwrap();
        assert_eq!(reply.status, 200);
        assert_eq!(reply.json().unwrap()["id"], *id);
        let status = get(&base, "/status").await;
        assert_eq!(
            status,
            json!({"loaded": true, "engine": "qwen", "busy": false})
        );
    });
    assert_eq!(emu.synthesis_counts().values().sum::<usize>(), 1);
}

#[test]
fn discovery_and_capabilities() {
    let emu = start(VoiceEmulatorOptions::default());
    let base = emu.base_url();
    block_on(async {
        assert_eq!(get(&base, "/health").await, json!({"status": "ok"}));
        let models = get(&base, "/v1/models").await;
        let ids: Vec<&str> = models["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["qwen", "qwen-design", "breeze", "default", "tts-1"]);
        let caps = get(&base, "/v1/audio/capabilities").await;
        assert_eq!(
            caps["engines"],
            json!([
                {"id": "qwen", "loaded": true},
                {"id": "qwen-design", "loaded": false},
                {"id": "breeze", "loaded": false},
            ])
        );
        assert_eq!(caps["aliases"], json!(["default", "tts-1"]));
        assert_eq!(caps["default_engine"], "qwen");
        assert_eq!(caps["voices"], json!(["alloy", "default"]));
    });
}

#[test]
fn status_shapes_in_every_mode() {
    let emu = start(VoiceEmulatorOptions::default());
    let idle = |engine: Value| json!({"loaded": true, "engine": engine, "busy": false});
    let base = emu.base_url();
    block_on(async {
        assert_eq!(get(&base, "/status").await, idle(json!("qwen")));
        for (fault, engine) in [
            (StatusEngineFault::Null, Value::Null),
            (StatusEngineFault::Empty, json!("")),
            (StatusEngineFault::NotAString, json!(42)),
        ] {
            emu.set_faults(VoiceFaults {
                status_engine: Some(fault),
                ..VoiceFaults::default()
            });
            assert_eq!(get(&base, "/status").await, idle(engine), "{fault:?}");
        }
        emu.set_faults(VoiceFaults::default());
        assert_eq!(get(&base, "/status").await, idle(json!("qwen")));
    });

    let none = start(VoiceEmulatorOptions {
        loaded: None,
        ..VoiceEmulatorOptions::default()
    });
    let legacy = start(VoiceEmulatorOptions {
        legacy: true,
        ..VoiceEmulatorOptions::default()
    });
    block_on(async {
        assert_eq!(
            get(&none.base_url(), "/status").await,
            json!({"loaded": false, "engine": null, "busy": false})
        );
        let status = get(&legacy.base_url(), "/status").await;
        assert_eq!(status, json!({"loaded": true, "busy": false}));
        assert!(status.get("engine").is_none());
        // Legacy servers still synthesize; the key stays absent while busy.
        legacy.set_faults(VoiceFaults {
            status_engine: Some(StatusEngineFault::Null),
            ..VoiceFaults::default()
        });
        let reply = post(&legacy.base_url(), "/v1/audio/speech", speech("qwen", "x")).await;
        assert_eq!(reply.status, 200);
        assert!(
            get(&legacy.base_url(), "/status")
                .await
                .get("engine")
                .is_none()
        );
    });
    assert_eq!(none.loaded_engine(), None);
    assert_eq!(legacy.loaded_engine().as_deref(), Some("qwen"));
}

#[test]
fn another_engine_switches_and_aliases_reuse_the_loaded_one() {
    let emu = start(VoiceEmulatorOptions {
        switch_time: Duration::from_millis(400),
        synthesis_time: Duration::from_millis(200),
        ..VoiceEmulatorOptions::default()
    });
    let base = emu.base_url();
    block_on(async {
        let work_base = base.clone();
        let work = tokio::spawn(async move {
            post(&work_base, "/v1/audio/speech", speech("breeze", "switch")).await
        });
        let switching = status_until(&base, |s| s["loaded"] == false).await;
        assert_eq!(
            switching,
            json!({"loaded": false, "engine": null, "busy": true})
        );
        assert_eq!(emu.loaded_engine(), None);
        let synthesizing = status_until(&base, |s| s["loaded"] == true).await;
        assert_eq!(
            synthesizing,
            json!({"loaded": true, "engine": "breeze", "busy": true})
        );
        let reply = work.await.unwrap();
        assert_eq!(reply.status, 200);
        assert_eq!(
            get(&base, "/status").await,
            json!({"loaded": true, "engine": "breeze", "busy": false})
        );

        // An alias synthesizes with whatever is loaded: no switch.
        for alias in ["default", "tts-1"] {
            let reply = post(&base, "/v1/audio/executions", speech(alias, "reuse")).await;
            assert_eq!(reply.status, 200, "{}", reply.text());
            let receipt = reply.json().unwrap();
            assert_eq!(receipt["model"], alias);
            assert_eq!(receipt["engine"], "breeze");
        }
        let caps = get(&base, "/v1/audio/capabilities").await;
        assert_eq!(caps["engines"][2], json!({"id": "breeze", "loaded": true}));
    });
    assert_eq!(emu.switch_count(), 1);
    assert_eq!(emu.synthesis_count("breeze"), 3);
    assert_eq!(emu.synthesis_count("qwen"), 0);
    assert_eq!(emu.loaded_engine().as_deref(), Some("breeze"));
}

#[test]
fn an_alias_with_nothing_loaded_loads_the_default_engine() {
    let emu = start(VoiceEmulatorOptions {
        loaded: None,
        default_engine: Some("qwen-design".into()),
        ..VoiceEmulatorOptions::default()
    });
    let base = emu.base_url();
    block_on(async {
        let reply = post(&base, "/v1/audio/executions", speech("default", "cold")).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json().unwrap()["engine"], "qwen-design");
        assert_eq!(
            get(&base, "/status").await,
            json!({"loaded": true, "engine": "qwen-design", "busy": false})
        );
    });
    assert_eq!(emu.switch_count(), 1);
    assert_eq!(emu.synthesis_count("qwen-design"), 1);
}

#[test]
fn requests_queue_behind_the_one_worker() {
    let emu = start(VoiceEmulatorOptions {
        synthesis_time: Duration::from_millis(200),
        ..VoiceEmulatorOptions::default()
    });
    let base = emu.base_url();
    block_on(async {
        let started = Instant::now();
        let a = tokio::spawn({
            let base = base.clone();
            async move { post(&base, "/v1/audio/speech", speech("qwen", "one")).await }
        });
        let b = tokio::spawn({
            let base = base.clone();
            async move { post(&base, "/v1/audio/speech", speech("qwen", "two")).await }
        });
        assert_eq!(a.await.unwrap().status, 200);
        assert_eq!(b.await.unwrap().status, 200);
        assert!(started.elapsed() >= Duration::from_millis(400));
    });
    assert_eq!(emu.synthesis_count("qwen"), 2);
}

#[test]
fn a_failed_synthesis_answers_500_once() {
    let emu = start(VoiceEmulatorOptions::default());
    emu.set_faults(VoiceFaults {
        fail_synthesis: Some(SynthesisFailure::ServerError),
        ..VoiceFaults::default()
    });
    let base = emu.base_url();
    block_on(async {
        let reply = post(&base, "/v1/audio/speech", speech("breeze", "fail")).await;
        assert_eq!(reply.status, 500);
        assert_eq!(reply.json().unwrap()["error"]["type"], "server_error");

        let reply = post(&base, "/v1/audio/executions", speech("breeze", "fail")).await;
        assert_eq!(reply.status, 500);
        let id = emu.execution_ids().pop().unwrap();
        let receipt = get(&base, &format!("/v1/audio/executions/{id}")).await;
        assert_eq!(receipt["status"], "failed");
        let audio = call(
            &base,
            "GET",
            &format!("/v1/audio/executions/{id}/audio"),
            None,
        )
        .await;
        assert_eq!(audio.status, 409);
        assert!(!emu.busy());
    });
    assert_eq!(emu.synthesis_count("breeze"), 2);
    assert_eq!(emu.count("POST", "/v1/audio/"), 2);
}

#[test]
fn a_synthesis_cut_mid_body_sends_half_then_breaks() {
    let emu = start(VoiceEmulatorOptions::default());
    emu.set_faults(VoiceFaults {
        fail_synthesis: Some(SynthesisFailure::CutMidBody),
        ..VoiceFaults::default()
    });
    let base = emu.base_url();
    block_on(async {
        let url = format!("{base}/v1/audio/speech");
        let body = serde_json::to_vec(&speech("qwen", "cut")).unwrap();
        assert!(http_request("POST", &url, &[], body.clone()).await.is_err());

        let mut stream = http_stream("POST", &url, &[], body).await.unwrap();
        assert_eq!(stream.status, 200);
        let full_len = synthesized_audio("cut", "wav").len();
        assert_eq!(stream.headers["content-length"], full_len.to_string());
        let mut got = 0;
        let mut broke = false;
        while let Some(chunk) = stream.next_chunk().await {
            match chunk {
                Ok(chunk) => got += chunk.data.len(),
                Err(_) => {
                    broke = true;
                    break;
                }
            }
        }
        assert!(broke);
        assert_eq!(got, full_len / 2);

        // An execution publishes first; only its reply is lost.
        let url = format!("{base}/v1/audio/executions");
        let body = serde_json::to_vec(&speech("qwen", "cut")).unwrap();
        assert!(http_request("POST", &url, &[], body).await.is_err());
        let id = emu.execution_ids().pop().unwrap();
        let receipt = get(&base, &format!("/v1/audio/executions/{id}")).await;
        assert_eq!(receipt["status"], "completed");
    });
    assert_eq!(emu.synthesis_count("qwen"), 3);
}

#[test]
fn early_accept_answers_202_while_synthesis_continues() {
    let emu = start(VoiceEmulatorOptions {
        synthesis_time: Duration::from_millis(500),
        ..VoiceEmulatorOptions::default()
    });
    emu.set_faults(VoiceFaults {
        early_accept: true,
        ..VoiceFaults::default()
    });
    let base = emu.base_url();
    block_on(async {
        let started = Instant::now();
        let reply = post(&base, "/v1/audio/executions", speech("qwen", "early")).await;
        assert!(started.elapsed() < Duration::from_millis(300));
        assert_eq!(reply.status, 202, "{}", reply.text());
        let receipt = reply.json().unwrap();
        assert_ne!(receipt["status"], "completed");
        let id = receipt["id"].as_str().unwrap().to_owned();
        assert!(valid_id(&id));
        let busy = status_until(&base, |s| s["busy"] == true).await;
        assert_eq!(busy["engine"], "qwen");
        status_until(&base, |s| s["busy"] == false).await;
        let done = get(&base, &format!("/v1/audio/executions/{id}")).await;
        assert_eq!(done["status"], "completed");
        let audio = call(
            &base,
            "GET",
            &format!("/v1/audio/executions/{id}/audio"),
            None,
        )
        .await;
        assert_eq!(audio.body, synthesized_audio("early", "wav"));
    });
    assert_eq!(emu.synthesis_count("qwen"), 1);
}

#[test]
fn contradictory_options_are_refused() {
    let bad = [
        VoiceEmulatorOptions {
            engines: Vec::new(),
            loaded: None,
            ..VoiceEmulatorOptions::default()
        },
        VoiceEmulatorOptions {
            aliases: vec!["qwen".into()],
            ..VoiceEmulatorOptions::default()
        },
        VoiceEmulatorOptions {
            loaded: Some("kokoro".into()),
            ..VoiceEmulatorOptions::default()
        },
        VoiceEmulatorOptions {
            default_engine: Some("kokoro".into()),
            ..VoiceEmulatorOptions::default()
        },
        VoiceEmulatorOptions {
            voices: Vec::new(),
            ..VoiceEmulatorOptions::default()
        },
    ];
    for options in bad {
        assert!(
            VoiceEmulator::start(options.clone()).is_err(),
            "{options:?}"
        );
    }
}
