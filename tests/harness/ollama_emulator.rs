//! The Ollama emulator: wire shapes over raw HTTP, load semantics, the official
//! Python client (PyPI `ollama`) against it, and generation through a real
//! llama-server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::{Value, json};
use vacancy_test_support::ollama_emulator::DEFAULT_NUM_CTX;
use vacancy_test_support::{
    LlamaOptions, LlamaServer, OllamaEmulator, OllamaOptions, PythonVenv, http_request, http_stream,
};

/// The official client, pinned.
const OLLAMA_CLIENT: &str = "ollama==0.6.3";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn post(base: &str, path: &str, body: Value) -> (u16, String) {
    let r = http_request(
        "POST",
        &format!("{base}{path}"),
        &[("content-type", "application/json")],
        body.to_string().into_bytes(),
    )
    .await
    .unwrap();
    (r.status, r.text())
}

async fn post_json(base: &str, path: &str, body: Value) -> Value {
    let (status, text) = post(base, path, body).await;
    assert_eq!(status, 200, "{path}: {text}");
    serde_json::from_str(&text).unwrap()
}

async fn get_json(base: &str, path: &str) -> Value {
    let r = http_request("GET", &format!("{base}{path}"), &[], vec![])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.json().unwrap()
}

fn ndjson(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn generate_streams_ndjson_ending_with_a_done_object() {
    let emu = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    let base = emu.base_url();
    runtime().block_on(async {
        let (status, text) = post(
            &base,
            "/api/generate",
            json!({"model": "llama3", "prompt": "Why is the sky blue?", "options": {"num_predict": 5}}),
        )
        .await;
        assert_eq!(status, 200, "{text}");
        let lines = ndjson(&text);
        assert_eq!(lines.len(), 6, "{text}");
        for l in &lines[..5] {
            assert_eq!(l["done"], false);
            assert_eq!(l["model"], "llama3");
            assert!(!l["response"].as_str().unwrap().is_empty());
            assert!(l["created_at"].as_str().unwrap().ends_with('Z'));
        }
        let last = &lines[5];
        assert_eq!(last["done"], true);
        assert_eq!(last["done_reason"], "length");
        assert_eq!(last["response"], "");
        assert_eq!(last["eval_count"], 5);
        for field in [
            "total_duration",
            "load_duration",
            "prompt_eval_count",
            "prompt_eval_duration",
            "eval_duration",
        ] {
            assert!(last[field].is_u64(), "{field}: {last}");
        }
        assert!(last["context"].is_array());

        // stream:false → one object with the whole text.
        let one = post_json(
            &base,
            "/api/generate",
            json!({"model": "llama3", "prompt": "hi", "stream": false}),
        )
        .await;
        assert_eq!(one["done"], true);
        assert_eq!(one["done_reason"], "stop");
        assert_eq!(one["eval_count"], 8);
        assert!(one["response"].as_str().unwrap().starts_with("The sky"));

        // Chat streams message objects.
        let (status, text) = post(
            &base,
            "/api/chat",
            json!({"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
        assert_eq!(status, 200);
        let lines = ndjson(&text);
        assert_eq!(lines.len(), 9);
        assert_eq!(lines[0]["message"]["role"], "assistant");
        assert_eq!(lines[8]["done"], true);
        assert_eq!(lines[8]["message"]["content"], "");

        // Unknown model, missing model.
        let (status, text) =
            post(&base, "/api/generate", json!({"model": "nope", "prompt": "x"})).await;
        assert_eq!(status, 404);
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap()["error"],
            "model 'nope' not found"
        );
        let (status, _) = post(&base, "/api/chat", json!({"messages": []})).await;
        assert_eq!(status, 400);
    });
    let paths: Vec<String> = emu.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths[0], "/api/generate");
    assert_eq!(emu.requests()[0].body["prompt"], "Why is the sky blue?");
}

#[test]
fn streaming_is_incremental_and_keeps_the_model_busy() {
    let emu = OllamaEmulator::start(OllamaOptions {
        token_delay: Duration::from_millis(40),
        ..OllamaOptions::default()
    })
    .unwrap();
    let base = emu.base_url();
    runtime().block_on(async {
        let mut s = http_stream(
            "POST",
            &format!("{base}/api/generate"),
            &[],
            json!({"model": "llama3", "prompt": "x", "options": {"num_predict": 6}})
                .to_string()
                .into_bytes(),
        )
        .await
        .unwrap();
        assert_eq!(
            s.headers["content-type"].to_str().unwrap(),
            "application/x-ndjson"
        );
        let first = s.next_chunk().await.unwrap().unwrap();
        assert_eq!(emu.in_flight(), 1);
        let loaded = emu.loaded();
        assert_eq!(loaded[0].active, 1);
        assert_eq!(loaded[0].expires_at, None);
        let rest = s.collect_chunks().await.unwrap();
        let last = rest.last().unwrap();
        assert!(last.at.duration_since(first.at) >= Duration::from_millis(150));
        assert_eq!(emu.in_flight(), 0);
    });
}

#[test]
fn ps_reports_loaded_models_with_their_fields() {
    let emu = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    let base = emu.base_url();
    runtime().block_on(async {
        assert_eq!(get_json(&base, "/api/ps").await, json!({"models": []}));
        post_json(
            &base,
            "/api/generate",
            json!({"model": "llama3", "prompt": "x", "stream": false, "keep_alive": "10m"}),
        )
        .await;
        let ps = get_json(&base, "/api/ps").await;
        let m = &ps["models"][0];
        assert_eq!(m["name"], "llama3:latest");
        assert_eq!(m["model"], "llama3:latest");
        assert_eq!(m["context_length"], DEFAULT_NUM_CTX);
        assert_eq!(m["size_vram"], m["size"]);
        assert!(m["size"].as_u64().unwrap() > 1 << 30);
        assert_eq!(m["digest"].as_str().unwrap().len(), 64);
        assert_eq!(m["details"]["format"], "gguf");
        let expires = m["expires_at"].as_str().unwrap();
        assert!(expires.ends_with('Z') && expires.contains('T'), "{expires}");
        let info = &emu.loaded()[0];
        let left = info
            .expires_at
            .unwrap()
            .duration_since(std::time::SystemTime::now())
            .unwrap();
        assert!(left > Duration::from_secs(590) && left <= Duration::from_secs(600));

        // keep_alive -1: forever (far in the future); a number of seconds works too.
        post_json(
            &base,
            "/api/generate",
            json!({"model": "llama3", "prompt": "x", "stream": false, "keep_alive": -1}),
        )
        .await;
        let ps = get_json(&base, "/api/ps").await;
        assert!(
            ps["models"][0]["expires_at"]
                .as_str()
                .unwrap()
                .starts_with("23")
        );

        emu.set_fail_ps(true);
        let r = http_request("GET", &format!("{base}/api/ps"), &[], vec![])
            .await
            .unwrap();
        assert_eq!(r.status, 500);
        emu.set_fail_ps(false);
        emu.set_override("/api/ps", Some((200, "{\"models\": [".into())));
        let r = http_request("GET", &format!("{base}/api/ps"), &[], vec![])
            .await
            .unwrap();
        assert!(r.json().is_err());
        emu.set_override("/api/ps", None);
        assert_eq!(
            get_json(&base, "/api/ps").await["models"][0]["name"],
            "llama3:latest"
        );
    });
}

#[test]
fn keep_alive_zero_unloads() {
    let emu = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    emu.preload("llama3", None).unwrap();
    assert_eq!(emu.loaded().len(), 1);
    let base = emu.base_url();
    runtime().block_on(async {
        let r = post_json(
            &base,
            "/api/generate",
            json!({"model": "llama3", "keep_alive": 0}),
        )
        .await;
        assert_eq!(r["done"], true);
        assert_eq!(r["done_reason"], "unload");
        assert!(emu.loaded().is_empty());
        assert_eq!(get_json(&base, "/api/ps").await["models"], json!([]));

        // Load with an empty chat, unload with an empty chat.
        let r = post_json(
            &base,
            "/api/chat",
            json!({"model": "llama3", "messages": []}),
        )
        .await;
        assert_eq!(r["done_reason"], "load");
        assert_eq!(emu.loaded().len(), 1);
        let r = post_json(
            &base,
            "/api/chat",
            json!({"model": "llama3", "messages": [], "keep_alive": "0s"}),
        )
        .await;
        assert_eq!(r["done_reason"], "unload");
        assert!(emu.loaded().is_empty());

        // A real request with keep_alive 0: unloaded once it is answered.
        post_json(
            &base,
            "/api/generate",
            json!({"model": "llama3", "prompt": "x", "stream": false, "keep_alive": 0}),
        )
        .await;
        assert!(emu.loaded().is_empty());
    });
}

#[test]
fn a_different_num_ctx_reloads_and_parallel_multiplies_it() {
    let emu = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    let base = emu.base_url();
    runtime().block_on(async {
        let gen_ctx = |ctx: Option<u32>| {
            let mut body = json!({"model": "llama3", "prompt": "x", "stream": false});
            if let Some(ctx) = ctx {
                body["options"] = json!({"num_ctx": ctx});
            }
            body
        };
        post_json(&base, "/api/generate", gen_ctx(Some(2048))).await;
        let first = emu.loaded()[0].clone();
        assert_eq!((first.num_ctx, first.context_length), (2048, 2048));
        post_json(&base, "/api/generate", gen_ctx(Some(2048))).await;
        assert_eq!(
            emu.loaded()[0].load_id,
            first.load_id,
            "same context: no reload"
        );
        post_json(&base, "/api/generate", gen_ctx(Some(8192))).await;
        let second = emu.loaded()[0].clone();
        assert_ne!(second.load_id, first.load_id);
        assert_eq!(second.context_length, 8192);
        // No num_ctx: back to the default, which is another reload.
        post_json(&base, "/api/generate", gen_ctx(None)).await;
        assert_eq!(emu.loaded()[0].context_length, DEFAULT_NUM_CTX);

        emu.set_parallel(4);
        post_json(&base, "/api/generate", gen_ctx(Some(2048))).await;
        let ps = get_json(&base, "/api/ps").await;
        assert_eq!(ps["models"][0]["context_length"], 8192);
        assert_eq!(emu.loaded()[0].num_ctx, 2048);

        // The Modelfile's num_ctx applies when the request sets none.
        emu.set_parallel(1);
        assert!(emu.set_modelfile_num_ctx("llama3", Some(16384)));
        post_json(&base, "/api/generate", gen_ctx(None)).await;
        assert_eq!(emu.loaded()[0].context_length, 16384);
    });
}

#[test]
fn show_tags_version_and_root() {
    let emu = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    let base = emu.base_url();
    runtime().block_on(async {
        let show = post_json(&base, "/api/show", json!({"model": "qwen2.5:7b"})).await;
        let params = show["parameters"].as_str().unwrap();
        let num_ctx: Vec<&str> = params
            .lines()
            .filter(|l| l.starts_with("num_ctx"))
            .collect();
        assert_eq!(num_ctx.len(), 1, "{params}");
        assert_eq!(num_ctx[0].split_whitespace().nth(1), Some("8192"));
        assert_eq!(show["model_info"]["llama.context_length"], 131_072);
        assert_eq!(show["details"]["family"], "llama");
        assert!(
            show["modelfile"]
                .as_str()
                .unwrap()
                .contains("PARAMETER num_ctx 8192")
        );

        let show = post_json(&base, "/api/show", json!({"model": "llama3"})).await;
        assert!(!show["parameters"].as_str().unwrap().contains("num_ctx"));
        emu.set_modelfile_num_ctx("llama3", Some(2048));
        let show = post_json(&base, "/api/show", json!({"model": "llama3:latest"})).await;
        assert!(show["parameters"].as_str().unwrap().contains("num_ctx"));

        let (status, text) = post(&base, "/api/show", json!({"model": "ghost"})).await;
        assert_eq!(status, 404, "{text}");

        let tags = get_json(&base, "/api/tags").await;
        let names: Vec<&str> = tags["models"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["llama3:latest", "qwen2.5:7b", "all-minilm:latest"]);

        assert_eq!(get_json(&base, "/api/version").await["version"], "0.32.15");
        let root = http_request("GET", &format!("{base}/"), &[], vec![])
            .await
            .unwrap();
        assert_eq!(root.text(), "Ollama is running");
        let head = http_request("HEAD", &format!("{base}/"), &[], vec![])
            .await
            .unwrap();
        assert_eq!(head.status, 200);
    });
}

#[test]
fn a_new_digest_shows_at_once_and_reloads_on_the_next_request() {
    let emu = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    emu.preload("llama3", Some(2048)).unwrap();
    let old = emu.loaded()[0].clone();
    let new_digest = "ab".repeat(32);
    assert!(emu.set_digest("llama3", &new_digest));
    let base = emu.base_url();
    runtime().block_on(async {
        let tags = get_json(&base, "/api/tags").await;
        assert_eq!(tags["models"][0]["digest"], new_digest.as_str());
        let ps = get_json(&base, "/api/ps").await;
        assert_eq!(ps["models"][0]["digest"], old.digest.as_str());
        post_json(
            &base,
            "/api/generate",
            json!({"model": "llama3", "prompt": "x", "stream": false, "options": {"num_ctx": 2048}}),
        )
        .await;
        let ps = get_json(&base, "/api/ps").await;
        assert_eq!(ps["models"][0]["digest"], new_digest.as_str());
        assert_ne!(emu.loaded()[0].load_id, old.load_id);
    });
}

#[test]
fn tags_resolve_and_embeddings_and_openai_endpoints_answer() {
    let emu = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    let base = emu.base_url();
    runtime().block_on(async {
        // `llama3` and `llama3:latest` are one model; another tag is not.
        post_json(&base, "/api/generate", json!({"model": "llama3", "prompt": "x", "stream": false})).await;
        post_json(&base, "/api/generate", json!({"model": "llama3:latest", "prompt": "x", "stream": false})).await;
        assert_eq!(emu.loaded().len(), 1);
        let (status, _) = post(&base, "/api/generate", json!({"model": "llama3:8b", "prompt": "x"})).await;
        assert_eq!(status, 404);
        let (status, _) = post(&base, "/api/generate", json!({"model": "qwen2.5", "prompt": "x"})).await;
        assert_eq!(status, 404);

        let e = post_json(&base, "/api/embed", json!({"model": "all-minilm", "input": ["a", "b"]})).await;
        assert_eq!(e["embeddings"].as_array().unwrap().len(), 2);
        assert_eq!(e["embeddings"][0].as_array().unwrap().len(), 8);
        let legacy = post_json(&base, "/api/embeddings", json!({"model": "all-minilm", "prompt": "a"})).await;
        assert_eq!(legacy["embedding"], e["embeddings"][0]);
        assert_eq!(emu.loaded().len(), 2);

        let c = post_json(
            &base,
            "/v1/chat/completions",
            json!({"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
        )
        .await;
        assert_eq!(c["object"], "chat.completion");
        assert_eq!(c["choices"][0]["finish_reason"], "length");
        assert_eq!(c["usage"]["completion_tokens"], 3);
        let (status, text) = post(
            &base,
            "/v1/chat/completions",
            json!({"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": true}),
        )
        .await;
        assert_eq!(status, 200);
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
        let c = post_json(&base, "/v1/completions", json!({"model": "llama3", "prompt": "x"})).await;
        assert_eq!(c["object"], "text_completion");
        let e = post_json(&base, "/v1/embeddings", json!({"model": "all-minilm", "input": "a"})).await;
        assert_eq!(e["data"][0]["object"], "embedding");
        let m = get_json(&base, "/v1/models").await;
        assert_eq!(m["data"][0]["id"], "llama3:latest");
        let (status, text) = post(&base, "/v1/chat/completions", json!({"model": "ghost", "messages": []})).await;
        assert_eq!(status, 404);
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"]["type"], "not_found_error");
    });
}

const CLIENT_SCRIPT: &str = r#"
import sys, ollama
c = ollama.Client(host=sys.argv[1])
r = c.generate(model="llama3", prompt="Why is the sky blue?", options={"num_ctx": 2048})
assert r.done and r.response, r
parts = list(c.chat(model="llama3", messages=[{"role": "user", "content": "hi"}], stream=True))
assert parts[-1].done and parts[-1].eval_count == 8, parts[-1]
assert "".join(p.message.content for p in parts).startswith("The sky"), parts
ps = c.ps()
m = ps.models[0]
assert m.model == "llama3:latest" and m.size_vram == m.size and m.expires_at is not None, m
# The chat asked no num_ctx: the model reloaded with the default.
assert m.context_length == 4096, m
show = c.show("qwen2.5:7b")
assert "num_ctx" in show.parameters and show.modelinfo["llama.context_length"] == 131072, show
assert show.details.family == "llama"
names = [m.model for m in c.list().models]
assert names == ["llama3:latest", "qwen2.5:7b", "all-minilm:latest"], names
e = c.embed(model="all-minilm", input=["a", "b"])
assert len(e.embeddings) == 2
try:
    c.generate(model="ghost", prompt="x")
    raise SystemExit("no error for an unknown model")
except ollama.ResponseError as err:
    assert err.status_code == 404 and "not found" in err.error, err
u = c.generate(model="llama3", keep_alive=0)
assert u.done_reason == "unload", u
left = [m.model for m in c.ps().models]
assert left == ["all-minilm:latest"], left
assert c.ps().models[0].context_length == 512, c.ps()
print("client ok", ollama.__name__)
"#;

#[test]
fn the_official_python_client_parses_every_reply() {
    let venv = PythonVenv::ensure("ollama-client", &[OLLAMA_CLIENT]).unwrap();
    let emu = OllamaEmulator::start(OllamaOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("client.py");
    std::fs::write(&script, CLIENT_SCRIPT).unwrap();
    let out = std::process::Command::new(PythonVenv::python(&venv))
        .arg(&script)
        .arg(emu.base_url())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("client ok"), "{text}");
}

#[test]
fn generates_through_a_real_llama_server() {
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let emu = OllamaEmulator::start(OllamaOptions {
        llama_server: Some(llama.base_url()),
        ..OllamaOptions::default()
    })
    .unwrap();
    let base = emu.base_url();
    runtime().block_on(async {
        let (status, text) = post(
            &base,
            "/api/generate",
            json!({"model": "llama3", "prompt": "Once upon a time", "options": {"num_predict": 6}}),
        )
        .await;
        assert_eq!(status, 200, "{text}");
        let lines = ndjson(&text);
        let last = lines.last().unwrap();
        assert_eq!(last["done"], true, "{text}");
        assert!(last["eval_count"].as_u64().unwrap() >= 1, "{text}");
        let streamed: String = lines
            .iter()
            .filter_map(|l| l["response"].as_str())
            .collect();
        assert!(!streamed.is_empty(), "{text}");
        assert!(
            !streamed.starts_with("The sky"),
            "filler, not llama-server: {text}"
        );

        let one = post_json(
            &base,
            "/api/chat",
            json!({"model": "llama3", "messages": [{"role": "user", "content": "hi"}],
                   "stream": false, "options": {"num_predict": 4}}),
        )
        .await;
        assert_eq!(one["done"], true);
        assert!(
            !one["message"]["content"].as_str().unwrap().is_empty(),
            "{one}"
        );
    });
}

#[test]
fn a_failing_llama_server_gives_ollama_errors() {
    let dead = vacancy_test_support::free_port().unwrap();
    let emu = OllamaEmulator::start(OllamaOptions {
        llama_server: Some(format!("http://127.0.0.1:{dead}")),
        ..OllamaOptions::default()
    })
    .unwrap();
    let base = emu.base_url();
    runtime().block_on(async {
        let (status, text) = post(
            &base,
            "/api/generate",
            json!({"model": "llama3", "prompt": "x", "stream": false}),
        )
        .await;
        assert_eq!(status, 500, "{text}");
        assert!(serde_json::from_str::<Value>(&text).unwrap()["error"].is_string());
        // Streaming: the status is sent already; the error comes as the last line.
        let (status, text) = post(
            &base,
            "/api/chat",
            json!({"model": "llama3", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
        assert_eq!(status, 200);
        assert!(ndjson(&text).last().unwrap()["error"].is_string(), "{text}");
        assert_eq!(emu.in_flight(), 0);
    });
}
