//! `vacancyd-vllm`, the example's own binary, in front of a REAL llama-server
//! (xllamacpp, tiny GGUF), which speaks the OpenAI routes this test needs: the
//! whole path for a third party's kind — configuration, registry, admission,
//! ledger, completion. vLLM's own observation endpoints are absent there, so
//! nothing is proven resident and the configured requirement is charged.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use vacancy_test_support::{
    LlamaOptions, LlamaServer, ManagedProcess, TinyModel, free_port, http_request, http_stream,
};

const JSON: (&str, &str) = ("content-type", "application/json");
const BIN: &str = env!("CARGO_BIN_EXE_vacancyd-vllm");

/// ~110 MB: a completion of a few hundred tokens keeps the server busy for seconds.
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

fn config(dir: &Path, control: u16, proxy: u16, target: &str, settings: &str) -> PathBuf {
    let capacity = dir.join("gpu0.json");
    std::fs::write(&capacity, r#"{"free_mib": 20000, "total_mib": 64000}"#).unwrap();
    let text = format!(
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

[[upstream]]
name = "vllm"
adapter = "vllm"
listen = "127.0.0.1:{proxy}"
target = "{target}"
resource = "gpu0"
default_min_free_mib = 2000
[upstream.adapter_settings]
{settings}
"#,
        capacity = capacity.display()
    );
    let path = dir.join("vacancyd.toml");
    std::fs::write(&path, text).unwrap();
    path
}

struct Daemon {
    process: ManagedProcess,
    control: String,
    proxy: String,
}

fn start(config: &Path, control: u16, proxy: u16) -> Daemon {
    let mut cmd = Command::new(BIN);
    cmd.arg("run")
        .arg("--config")
        .arg(config)
        .env("VACANCYD_LOG", "info");
    let mut process = ManagedProcess::spawn("vacancyd-vllm", cmd).unwrap();
    let control = format!("http://127.0.0.1:{control}");
    process
        .wait_http_ok(&format!("{control}/health"), Duration::from_secs(20))
        .unwrap();
    Daemon {
        process,
        control,
        proxy: format!("http://127.0.0.1:{proxy}"),
    }
}

impl Daemon {
    async fn status(&self) -> serde_json::Value {
        http_request("GET", &format!("{}/status", self.control), &[], Vec::new())
            .await
            .unwrap()
            .json()
            .unwrap()
    }

    async fn wait_status(
        &self,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let mut last = serde_json::Value::Null;
        for _ in 0..400 {
            last = self.status().await;
            if pred(&last) {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("timed out waiting for {what}; last status: {last:#}");
    }
}

fn completion(max_tokens: u32, stream: bool) -> Vec<u8> {
    serde_json::json!({"model": "tiny", "prompt": "Once upon a time", "max_tokens": max_tokens, "stream": stream})
        .to_string()
        .into_bytes()
}

fn work(s: &serde_json::Value) -> Vec<serde_json::Value> {
    s["work"].as_array().cloned().unwrap_or_default()
}

#[test]
fn check_config_knows_the_vllm_kind_and_its_settings() {
    let dir = tempfile::tempdir().unwrap();
    let good = config(dir.path(), 1, 2, "http://127.0.0.1:8000", "metrics = true");
    let out = Command::new(BIN)
        .args(["check-config", "--no-sample", "--config"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let bad = config(
        dir.path(),
        1,
        2,
        "http://127.0.0.1:8000",
        "metrics = \"yes\"\nsleep = 1",
    );
    let out = Command::new(BIN)
        .args(["check-config", "--no-sample", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "line 22: upstream[0] (\"vllm\").adapter_settings.metrics: must be true or false"
        ),
        "{err}"
    );
    assert!(
        err.contains("line 23: upstream[0] (\"vllm\").adapter_settings.sleep: unknown setting"),
        "{err}"
    );

    // Plain vacancyd does not know the kind; this binary lists it among the registered.
    let typo = std::fs::read_to_string(&good)
        .unwrap()
        .replace("adapter = \"vllm\"", "adapter = \"vlm\"");
    std::fs::write(&bad, typo).unwrap();
    let out = Command::new(BIN)
        .args(["check-config", "--no-sample", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown adapter \"vlm\" (did you mean \"vllm\"?); registered adapters: \"ollama\", \"comfyui\", \"llamacpp\", \"openai\", \"chatterbox\", \"vllm\""),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_party_kind_runs_the_whole_path_in_front_of_a_real_llama_server() {
    let llama = LlamaServer::start(busy_model()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (control, proxy) = (free_port().unwrap(), free_port().unwrap());
    let path = config(dir.path(), control, proxy, &llama.base_url(), "");
    let mut d = start(&path, control, proxy);

    // The registry resolved the kind; the observation of a server without
    // vLLM's /metrics proves nothing.
    let s = d
        .wait_status("the upstream to be observed", |s| {
            s["upstreams"][0]["models"]
                .as_array()
                .is_some_and(|m| !m.is_empty())
        })
        .await;
    let u = &s["upstreams"][0];
    assert_eq!(
        (u["name"].as_str(), u["adapter"].as_str()),
        (Some("vllm"), Some("vllm")),
        "{s:#}"
    );
    assert!(
        u["residency"][0]
            .as_str()
            .unwrap()
            .contains("not proven (/metrics has no vllm:num_requests_running gauge"),
        "{s:#}"
    );

    // Inspection: background mode is refused before anything is reserved.
    let r = http_request(
        "POST",
        &format!("{}/v1/responses", d.proxy),
        &[JSON],
        br#"{"model":"tiny","input":"hi","background":true}"#.to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json().unwrap()["error"]["code"], "unsupported_request");
    // Management is refused.
    let r = http_request("GET", &format!("{}/metrics", d.proxy), &[], Vec::new())
        .await
        .unwrap();
    assert_eq!(r.status, 403, "{}", r.text());

    // Admission: one job at a time; the second is refused at once.
    let url = format!("{}/v1/completions", d.proxy);
    let mut stream = http_stream("POST", &url, &[JSON], completion(400, true))
        .await
        .unwrap();
    assert_eq!(stream.status, 200);
    stream.next_chunk().await.unwrap().unwrap();
    let second = http_request("POST", &url, &[JSON], completion(4, false))
        .await
        .unwrap();
    assert_eq!(second.status, 503, "{}", second.text());
    assert_eq!(second.json().unwrap()["error"]["code"], "resource_busy");
    assert_eq!(second.headers["retry-after"], "2");
    let s = d.status().await;
    let w = work(&s);
    assert_eq!(w.len(), 1, "{s:#}");
    assert_eq!(w[0]["upstream"], "vllm", "{s:#}");

    // Completion: the clean end of the stream releases it.
    stream.collect_chunks().await.unwrap();
    d.wait_status("the job to be released", |s| work(s).is_empty())
        .await;
    let ok = http_request("POST", &url, &[JSON], completion(4, false))
        .await
        .unwrap();
    assert_eq!(ok.status, 200, "{}", ok.text());
    d.wait_status("the job to be released", |s| work(s).is_empty())
        .await;

    // Ledger: the reservation was on disk before forwarding, so a kill -9
    // mid-stream comes back held after a restart.
    let mut stream = http_stream("POST", &url, &[JSON], completion(400, true))
        .await
        .unwrap();
    stream.next_chunk().await.unwrap().unwrap();
    d.process.kill().unwrap();
    drop(stream);
    let journal =
        std::fs::read_to_string(dir.path().join("vacancyd.admission/journal.jsonl")).unwrap();
    assert!(journal.contains("\"upstream\":\"vllm\""), "{journal}");
    let d = start(&path, control, proxy);
    let s = d.status().await;
    let w = work(&s);
    assert_eq!(w.len(), 1, "{s:#}");
    assert_eq!(w[0]["phase"], "held", "{s:#}");
    assert_eq!(w[0]["upstream"], "vllm", "{s:#}");
}
