//! A real llama.cpp server (xllamacpp from PyPI) serving the tiny model.
//!
//! The first run installs the venv and generates the model into the cache
//! (`VACANCY_TEST_CACHE`, else `~/.cache/vacancy-test`); run with `--nocapture` to
//! see how long each start took.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use vacancy_test_support::{
    CountingShim, LlamaOptions, LlamaServer, http_get_status, http_request, http_stream,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn real_llama_server_serves_dies_and_comes_back_on_its_port() {
    let rt = runtime();
    let t = Instant::now();
    let mut server = LlamaServer::start(LlamaOptions::default()).unwrap();
    eprintln!(
        "llama-server start (cold if the cache was empty): {:?}",
        t.elapsed()
    );
    let base = server.base_url();
    assert_eq!(base, format!("http://127.0.0.1:{}", server.port()));
    assert_eq!(server.addr().port(), server.port());
    assert!(server.model_path().is_file());

    rt.block_on(async {
        let health = http_request("GET", &format!("{base}/health"), &[], vec![])
            .await
            .unwrap();
        assert_eq!(health.status, 200, "{}", health.text());

        let models = http_request("GET", &format!("{base}/v1/models"), &[], vec![])
            .await
            .unwrap();
        assert_eq!(models.status, 200, "{}", models.text());
        let id = &models.json().unwrap()["data"][0]["id"];
        assert!(id.as_str().unwrap().ends_with(".gguf"), "{id}");

        let slots = http_request("GET", &format!("{base}/slots"), &[], vec![])
            .await
            .unwrap();
        assert_eq!(slots.status, 200, "{}", slots.text());
        assert_eq!(slots.json().unwrap().as_array().unwrap().len(), 1);

        let completion = http_request(
            "POST",
            &format!("{base}/completion"),
            &[("content-type", "application/json")],
            br#"{"prompt":"Once upon a time","n_predict":4}"#.to_vec(),
        )
        .await
        .unwrap();
        assert_eq!(completion.status, 200, "{}", completion.text());
        let completion = completion.json().unwrap();
        assert_eq!(completion["tokens_predicted"], 4, "{completion}");
        assert!(!completion["content"].as_str().unwrap().is_empty());
    });

    // Down: killed, reaped, the port refuses.
    let port = server.port();
    let pid = server.process().pid();
    let status = server.kill().unwrap();
    assert!(!status.success());
    assert!(!server.process_mut().is_running());
    let gone = std::process::Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!gone.success(), "pid {pid} still exists");
    assert!(http_get_status(&format!("{base}/health"), Duration::from_secs(2)).is_err());

    // Up again on the same port.
    let t = Instant::now();
    let server = LlamaServer::start_on(port, LlamaOptions::default()).unwrap();
    eprintln!("llama-server start (warm, same port): {:?}", t.elapsed());
    assert_eq!(server.base_url(), base);
    assert_eq!(
        http_get_status(&format!("{base}/health"), Duration::from_secs(5)).unwrap(),
        200
    );
}

#[test]
fn options_reach_the_server_and_sse_streams_through_the_shim() {
    let rt = runtime();
    let options = LlamaOptions {
        parallel: 2,
        slots_endpoint: false,
        ..LlamaOptions::default()
    };
    let t = Instant::now();
    let mut server = LlamaServer::start(options).unwrap();
    eprintln!(
        "llama-server start (parallel 2, no /slots): {:?}",
        t.elapsed()
    );
    let shim = CountingShim::start(server.addr()).unwrap();
    let base = shim.base_url();

    rt.block_on(async {
        let slots = http_request("GET", &format!("{base}/slots"), &[], vec![])
            .await
            .unwrap();
        assert_eq!(slots.status, 501, "{}", slots.text());

        let props = http_request("GET", &format!("{base}/props"), &[], vec![])
            .await
            .unwrap();
        assert_eq!(props.json().unwrap()["total_slots"], 2);

        let stream = http_stream(
            "POST",
            &format!("{base}/completion"),
            &[("content-type", "application/json")],
            br#"{"prompt":"Once upon a time","n_predict":16,"stream":true}"#.to_vec(),
        )
        .await
        .unwrap();
        assert_eq!(stream.status, 200);
        let chunks = stream.collect_chunks().await.unwrap();
        let text: String = chunks
            .iter()
            .map(|c| String::from_utf8_lossy(&c.data).into_owned())
            .collect();
        assert_eq!(text.matches("data: ").count(), 17, "{text}");
        assert!(text.contains(r#""stop":true"#), "{text}");
    });

    let records = shim.records();
    assert_eq!(records.len(), 3);
    let completion = &records[2];
    assert_eq!(
        (completion.method.as_str(), completion.path.as_str()),
        ("POST", "/completion")
    );
    assert_eq!(completion.status, Some(200));
    assert!(completion.completed);
    assert_eq!(shim.max_concurrency_where(|r| r.path == "/completion"), 1);

    // Killed mid-test: the shim answers 502 and records no status.
    server.kill().unwrap();
    let reply = rt
        .block_on(http_request("GET", &format!("{base}/health"), &[], vec![]))
        .unwrap();
    assert_eq!(reply.status, 502);
    assert_eq!(shim.records()[3].status, None);
}

#[test]
fn alias_key_prefix_and_sleep_reach_the_server() {
    let rt = runtime();
    let server = LlamaServer::start(LlamaOptions {
        alias: Some("tiny-alias".into()),
        api_key: Some("test-key".into()),
        api_prefix: Some("/llm".into()),
        sleep_idle_seconds: Some(1),
        ..LlamaOptions::default()
    })
    .unwrap();
    let api = server.api_url();
    assert_eq!(api, format!("{}/llm", server.base_url()));
    let authorization = server.authorization().unwrap();
    assert_eq!(authorization, "Bearer test-key");
    let key = [("authorization", authorization.as_str())];

    rt.block_on(async {
        // Everything lives under the prefix; the root has nothing.
        let root = http_request(
            "GET",
            &format!("{}/health", server.base_url()),
            &key,
            vec![],
        )
        .await
        .unwrap();
        assert_eq!(root.status, 404, "{}", root.text());

        let bare = http_request("GET", &format!("{api}/v1/models"), &[], vec![])
            .await
            .unwrap();
        assert_eq!(bare.status, 401, "{}", bare.text());

        let models = http_request("GET", &format!("{api}/v1/models"), &key, vec![])
            .await
            .unwrap();
        assert_eq!(models.status, 200, "{}", models.text());
        assert_eq!(models.json().unwrap()["data"][0]["id"], "tiny-alias");

        // Idle for a second: the server unloads the model and says so in /props.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let props = http_request("GET", &format!("{api}/props"), &key, vec![])
                .await
                .unwrap();
            assert_eq!(props.status, 200, "{}", props.text());
            if props.json().unwrap()["is_sleeping"] == true {
                break;
            }
            assert!(Instant::now() < deadline, "never slept: {}", props.text());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}
