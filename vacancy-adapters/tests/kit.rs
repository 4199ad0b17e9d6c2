//! The built-in adapters through the same kit a third party's runs
//! (`vacancy::testkit`), each built by its registered factory as the daemon
//! builds it: inspection, the route table against its class list,
//! observation with the daemon's clock, completion.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use http::Method;
use vacancy::MonotonicClock;
use vacancy::registry::AdapterFactory;
use vacancy::testkit::{
    Canned, KitUpstream, ObservationCase, WorkSample, check_inspection, check_observation,
    check_route_classes,
};
use vacancy::traits::{Adapter, RouteClass, WorkRoute};

fn factory(kind: &str) -> Arc<dyn AdapterFactory> {
    Arc::clone(vacancy_adapters::builtin::registry().get(kind).unwrap())
}

fn built(kind: &str) -> Arc<dyn Adapter> {
    KitUpstream::new("http://127.0.0.1:9")
        .unwrap()
        .build(factory(kind).as_ref(), MonotonicClock::new())
        .unwrap()
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/llamacpp")
            .join(name),
    )
    .unwrap()
}

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

#[test]
fn every_built_in_adapter_passes_the_inspection_checks() {
    let cases: [(&str, Vec<WorkSample>); 5] = [
        (
            "llamacpp",
            vec![
                WorkSample::json("/completion", r#"{"model":"m","prompt":"hi"}"#),
                WorkSample::json("/v1/chat/completions", CHAT),
            ],
        ),
        (
            "openai",
            vec![WorkSample::json("/v1/chat/completions", CHAT)],
        ),
        (
            "ollama",
            vec![
                WorkSample::json("/api/generate", r#"{"model":"llama3","prompt":"hi"}"#),
                WorkSample::json("/v1/chat/completions", CHAT),
            ],
        ),
        (
            "comfyui",
            vec![WorkSample::json(
                "/prompt",
                r#"{"prompt":{"1":{"class_type":"KSampler","inputs":{}}}}"#,
            )],
        ),
        (
            "chatterbox",
            vec![WorkSample::json(
                "/v1/audio/speech",
                r#"{"model":"tts-1","input":"hi","voice":"alloy"}"#,
            )],
        ),
    ];
    for (kind, samples) in cases {
        if let Err(problems) = check_inspection(built(kind).as_ref(), &samples) {
            panic!("{kind}:\n{}", problems.join("\n"));
        }
    }
}

#[test]
fn the_openai_and_llamacpp_tables_are_their_class_lists() {
    let work = RouteClass::Work(WorkRoute::response_end());
    let post = |p: &'static str| (Method::POST, p, work);
    let openai = [
        post("/v1/chat/completions"),
        post("/v1/completions"),
        post("/v1/embeddings"),
        post("/v1/responses"),
        post("/v1/audio/speech"),
        post("/v1/audio/transcriptions"),
        post("/v1/audio/translations"),
        post("/v1/images/generations"),
        post("/v1/images/edits"),
        (Method::GET, "/v1/models", RouteClass::Discovery),
        (Method::GET, "/v1/models/m", RouteClass::Discovery),
    ];
    check_route_classes(built("openai").as_ref(), &openai).unwrap();
    let mut llama: Vec<(Method, &str, RouteClass)> = [
        "/completion",
        "/completions",
        "/v1/completions",
        "/chat/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/embedding",
        "/embeddings",
        "/v1/embeddings",
        "/rerank",
        "/reranking",
        "/v1/rerank",
        "/infill",
    ]
    .into_iter()
    .map(post)
    .collect();
    llama.extend([
        (Method::POST, "/tokenize", RouteClass::BorrowerRead),
        (Method::POST, "/detokenize", RouteClass::BorrowerRead),
        (Method::GET, "/health", RouteClass::Discovery),
        (Method::GET, "/v1/models", RouteClass::Discovery),
        (Method::GET, "/v1/models/m", RouteClass::Discovery),
        (Method::GET, "/models", RouteClass::Discovery),
        (Method::GET, "/props", RouteClass::Discovery),
        (Method::GET, "/slots", RouteClass::Management),
        (Method::POST, "/slots", RouteClass::Management),
        (Method::POST, "/slots/0", RouteClass::Management),
        (Method::POST, "/props", RouteClass::Management),
        (Method::GET, "/metrics", RouteClass::Management),
    ]);
    let got = check_route_classes(built("llamacpp").as_ref(), &llama);
    if let Err(problems) = got {
        panic!("{}", problems.join("\n"));
    }
}

#[tokio::test]
async fn llamacpp_observation_passes_the_kit_with_the_daemons_clock() {
    let models = fixture("v1_models.json");
    let case = ObservationCase {
        idle: vec![
            Canned::json("/v1/models", &models),
            Canned::json("/slots", &fixture("slots_idle.json")),
            Canned::json("/props", &fixture("props_idle.json")),
        ],
        idle_proves: true,
        model: "tiny.gguf".to_owned(),
        busy: vec![
            Canned::json("/v1/models", &models),
            Canned::json("/slots", &fixture("slots_all_processing.json")),
            Canned::json("/props", &fixture("props_all_processing.json")),
        ],
        busy_jobs: 2,
        malformed: vec![
            vec![
                Canned::json("/v1/models", &models),
                Canned::json("/slots", r#"[{"id":0}]"#),
            ],
            vec![
                Canned::json("/v1/models", r#"{"data":"tiny.gguf"}"#),
                Canned::json("/slots", &fixture("slots_idle.json")),
            ],
            vec![
                Canned::get("/v1/models", 200, "text/html", "<html>proxy login</html>"),
                Canned::json("/slots", &fixture("slots_idle.json")),
            ],
        ],
    };
    if let Err(problems) = check_observation(factory("llamacpp").as_ref(), &case).await {
        panic!("{}", problems.join("\n"));
    }
}

#[tokio::test]
async fn an_adapter_that_does_not_observe_passes_with_nothing_to_check() {
    check_observation(factory("openai").as_ref(), &ObservationCase::default())
        .await
        .unwrap();
}

fn comfy_fixture(name: &str) -> String {
    std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/comfyui")
            .join(name),
    )
    .unwrap()
}

#[test]
fn every_built_in_adapter_passes_the_route_table_and_dialect_checks() {
    for kind in vacancy::config::AdapterKinds::names(&vacancy_adapters::builtin::registry()) {
        let a = built(&kind);
        // ComfyUI classifies a history or file read as a borrower's only for
        // prompts it lent (its table lists the most a read can be), so its
        // entries need not classify as themselves: its unit tests check them.
        if kind != "comfyui"
            && let Err(p) = vacancy::testkit::check_route_table(a.as_ref())
        {
            panic!("{kind}:\n{}", p.join("\n"));
        }
        if let Err(p) = vacancy::testkit::check_refusal_dialect(a.as_ref()) {
            panic!("{kind}:\n{}", p.join("\n"));
        }
    }
}

#[tokio::test]
async fn chatterbox_observation_and_completion_pass_the_kit() {
    let status = |body: &str| vec![Canned::json("/status", body)];
    let case = ObservationCase {
        idle: status(r#"{"loaded":true,"engine":"chatterbox","busy":false}"#),
        idle_proves: true,
        model: "chatterbox".to_owned(),
        busy: status(r#"{"loaded":true,"engine":"chatterbox","busy":true}"#),
        busy_jobs: 1,
        malformed: vec![
            status(r#"{"loaded":"yes","engine":"chatterbox","busy":false}"#),
            status(r#"{"loaded":true,"engine":"chatterbox"}"#),
            vec![Canned::get(
                "/status",
                200,
                "text/html",
                "<html>login</html>",
            )],
        ],
    };
    if let Err(p) = check_observation(factory("chatterbox").as_ref(), &case).await {
        panic!("{}", p.join("\n"));
    }
    vacancy::testkit::check_completion(
        factory("chatterbox").as_ref(),
        &WorkSample::json(
            "/v1/audio/speech",
            r#"{"model":"tts-1","input":"hi","voice":"alloy"}"#,
        ),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn comfyui_observation_passes_the_kit() {
    let case = ObservationCase {
        idle: vec![
            Canned::json("/prompt", r#"{"exec_info":{"queue_remaining":0}}"#),
            Canned::json("/queue", &comfy_fixture("queue_idle.json")),
        ],
        // ComfyUI reports no models: its work is charged as a load (RES-18).
        idle_proves: false,
        model: String::new(),
        busy: vec![
            Canned::json("/prompt", r#"{"exec_info":{"queue_remaining":2}}"#),
            Canned::json("/queue", &comfy_fixture("queue_running_and_pending.json")),
        ],
        busy_jobs: 2,
        malformed: vec![vec![Canned::json("/prompt", r#"{"exec_info":{}}"#)]],
    };
    if let Err(p) = check_observation(factory("comfyui").as_ref(), &case).await {
        panic!("{}", p.join("\n"));
    }
}

#[tokio::test]
async fn ollama_observation_passes_the_kit() {
    let ps = r#"{"models":[{"name":"llama3:latest","model":"llama3:latest","size":1000,"digest":"abc","expires_at":"2099-01-01T00:00:00Z","size_vram":1000,"context_length":8192}]}"#;
    let case = ObservationCase {
        idle: vec![Canned::json("/api/ps", ps)],
        idle_proves: true,
        model: "llama3:latest".to_owned(),
        // Ollama shows no running work: nothing to report (ADM-09 needs none).
        busy: Vec::new(),
        busy_jobs: 0,
        malformed: vec![
            vec![Canned::json("/api/ps", r#"{"models":"llama3"}"#)],
            vec![Canned::json("/api/ps", r#"{"models":[{"name":1}]}"#)],
        ],
    };
    if let Err(p) = check_observation(factory("ollama").as_ref(), &case).await {
        panic!("{}", p.join("\n"));
    }
}
