//! The vLLM adapter through `vacancy::testkit`, as every built-in adapter is
//! checked. vLLM's answers below are written from its API's documented shapes
//! (`/v1/models`, the `vllm:num_requests_*` gauges of `/metrics`); the kit
//! serves them from a fake upstream by design: it tests the adapter's
//! contract with the daemon, not a server.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use http::Method;
use vacancy::MonotonicClock;
use vacancy::testkit::{
    Canned, KitUpstream, ObservationCase, WorkSample, check_completion, check_inspection,
    check_observation, check_refusal_dialect, check_route_classes, check_route_table,
};
use vacancy::traits::{RouteClass, WorkRoute};
use vacancy_vllm::VllmFactory;

const MODEL: &str = "Qwen/Qwen2.5-0.5B-Instruct";

fn models() -> String {
    format!(
        r#"{{"object":"list","data":[{{"id":"{MODEL}","object":"model","created":1767225600,"owned_by":"vllm","root":"{MODEL}","parent":null,"max_model_len":32768}}]}}"#
    )
}

fn metrics(running: u32, waiting: u32) -> String {
    format!(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{engine=\"0\",model_name=\"{MODEL}\"}} {running}.0\n# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{engine=\"0\",model_name=\"{MODEL}\"}} {waiting}.0\n"
    )
}

fn text(path: &str, body: &str) -> Canned {
    Canned::get(path, 200, "text/plain; version=0.0.4", body)
}

#[test]
fn the_route_table_is_the_vllm_dialect() {
    let a = KitUpstream::new("http://127.0.0.1:9")
        .unwrap()
        .build(&VllmFactory, MonotonicClock::new())
        .unwrap();
    check_route_table(a.as_ref()).unwrap();
    check_refusal_dialect(a.as_ref()).unwrap();
    let work = RouteClass::Work(WorkRoute::response_end());
    let mut expected: Vec<(Method, &str, RouteClass)> = [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/pooling",
        "/classify",
        "/score",
        "/v1/score",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
    ]
    .into_iter()
    .map(|p| (Method::POST, p, work))
    .collect();
    expected.extend([
        (Method::POST, "/tokenize", RouteClass::BorrowerRead),
        (Method::POST, "/detokenize", RouteClass::BorrowerRead),
        (Method::GET, "/v1/models", RouteClass::Discovery),
        (Method::GET, "/v1/models/m", RouteClass::Discovery),
        (Method::GET, "/health", RouteClass::Discovery),
        (Method::GET, "/ping", RouteClass::Discovery),
        (Method::GET, "/version", RouteClass::Discovery),
        (Method::GET, "/metrics", RouteClass::Management),
        (
            Method::POST,
            "/v1/load_lora_adapter",
            RouteClass::Management,
        ),
        (
            Method::POST,
            "/v1/unload_lora_adapter",
            RouteClass::Management,
        ),
        (Method::POST, "/sleep", RouteClass::Management),
        (Method::POST, "/wake_up", RouteClass::Management),
        (Method::GET, "/is_sleeping", RouteClass::Management),
        (Method::POST, "/reset_prefix_cache", RouteClass::Management),
        (Method::POST, "/v1/images/generations", RouteClass::Unknown),
    ]);
    if let Err(p) = check_route_classes(a.as_ref(), &expected) {
        panic!("{}", p.join("\n"));
    }
    let samples = [
        WorkSample::json("/v1/chat/completions", r#"{"model":"m","messages":[]}"#),
        WorkSample::json("/v1/embeddings", r#"{"model":"m","input":"hi"}"#),
        WorkSample::json("/rerank", r#"{"model":"m","query":"q","documents":["a"]}"#),
    ];
    if let Err(p) = check_inspection(a.as_ref(), &samples) {
        panic!("{}", p.join("\n"));
    }
}

#[tokio::test]
async fn observation_passes_the_kit_with_the_daemons_clock() {
    let case = ObservationCase {
        idle: vec![
            Canned::json("/v1/models", &models()),
            text("/metrics", &metrics(0, 0)),
        ],
        idle_proves: true,
        model: MODEL.to_owned(),
        busy: vec![
            Canned::json("/v1/models", &models()),
            text("/metrics", &metrics(2, 1)),
        ],
        busy_jobs: 3,
        malformed: vec![
            vec![
                Canned::json("/v1/models", r#"{"data":[{"object":"model"}]}"#),
                text("/metrics", &metrics(0, 0)),
            ],
            vec![
                Canned::json("/v1/models", &models()),
                text("/metrics", "llamacpp:requests_processing 0\n"),
            ],
            vec![
                Canned::json("/v1/models", &models()),
                text("/metrics", "vllm:num_requests_running{} zero\n"),
            ],
            vec![
                Canned::json("/v1/models", &models()),
                text("/metrics", &metrics(0, 0)),
                Canned::json("/is_sleeping", r#"{"is_sleeping":"no"}"#),
            ],
            vec![
                Canned::json("/v1/models", &models()),
                text("/metrics", &metrics(0, 0)),
                Canned::json("/is_sleeping", r#"{"is_sleeping":true}"#),
            ],
        ],
    };
    if let Err(p) = check_observation(&VllmFactory, &case).await {
        panic!("{}", p.join("\n"));
    }
}

#[tokio::test]
async fn completion_passes_the_kit() {
    for sample in [
        WorkSample::json("/v1/chat/completions", r#"{"model":"m","messages":[]}"#),
        WorkSample::json("/v1/responses", r#"{"model":"m","input":"hi"}"#),
        WorkSample::json("/score", r#"{"model":"m","text_1":"a","text_2":"b"}"#),
    ] {
        check_completion(&VllmFactory, &sample).await.unwrap();
    }
}
