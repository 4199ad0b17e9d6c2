#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use http::Method;
use vacancy::config::Management;
use vacancy::traits::{RoutePolicy, route_policy};
use vacancy::{MonotonicClock, Refusal, RefusalCode};

use serde_json::Value;
use vacancy::engine::{ObservedModel, ResidencyEvidence};

use super::observe::*;
use super::*;
use crate::common::testing::{Reply, TestServer, check_shared_inspection, closed_port};
use vacancy::traits::Inspection;

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!("../../tests/fixtures/llamacpp/", $name))
    };
}

fn adapter_for(target: &str) -> LlamaCppAdapter {
    LlamaCppAdapter::new(AdapterSettings::new(
        target.parse().unwrap(),
        MonotonicClock::new(),
    ))
    .unwrap()
}

fn adapter() -> LlamaCppAdapter {
    adapter_for("http://127.0.0.1:8080")
}

// ---------------------------------------------------------------- routes

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Kind {
    Work,
    Read,
    Discovery,
    Management,
    Unknown,
}

fn kind(c: RouteClass) -> Kind {
    match c {
        RouteClass::Work(w) => {
            assert_eq!(
                w,
                WorkRoute::response_end(),
                "DONE-01: released at response end"
            );
            Kind::Work
        }
        RouteClass::BorrowerRead => Kind::Read,
        RouteClass::Discovery => Kind::Discovery,
        RouteClass::Management => Kind::Management,
        RouteClass::Unknown => Kind::Unknown,
    }
}

#[test]
fn every_route_of_the_table_is_classified() {
    // ROUTE-01..03, ROUTE-08, ROUTE-12; DONE-01 for work.
    let a = adapter();
    let expected: &[(Method, &str, Kind)] = &[
        (Method::POST, "/completion", Kind::Work),
        (Method::POST, "/completions", Kind::Work),
        (Method::POST, "/v1/completions", Kind::Work),
        (Method::POST, "/chat/completions", Kind::Work),
        (Method::POST, "/v1/chat/completions", Kind::Work),
        (Method::POST, "/v1/responses", Kind::Work),
        (Method::POST, "/embedding", Kind::Work),
        (Method::POST, "/embeddings", Kind::Work),
        (Method::POST, "/v1/embeddings", Kind::Work),
        (Method::POST, "/rerank", Kind::Work),
        (Method::POST, "/reranking", Kind::Work),
        (Method::POST, "/v1/rerank", Kind::Work),
        (Method::POST, "/infill", Kind::Work),
        (Method::POST, "/tokenize", Kind::Read),
        (Method::POST, "/detokenize", Kind::Read),
        (Method::GET, "/health", Kind::Discovery),
        (Method::GET, "/v1/models", Kind::Discovery),
        (Method::GET, "/models", Kind::Discovery),
        (Method::GET, "/props", Kind::Discovery),
        (Method::GET, "/slots", Kind::Management),
        (Method::POST, "/slots", Kind::Management),
        (Method::POST, "/slots/0", Kind::Management),
        (Method::POST, "/slots/1?action=erase", Kind::Management),
        (Method::POST, "/props", Kind::Management),
        // Issue 14 item 8: llama-server answers one model's entry.
        (Method::GET, "/v1/models/tiny.gguf", Kind::Discovery),
        (Method::GET, "/metrics", Kind::Management),
    ];
    for (method, path, want) in expected {
        assert_eq!(kind(a.classify(method, path)), *want, "{method} {path}");
    }
    // Every table entry is covered above.
    assert_eq!(ROUTES.len(), expected.len() - 1);
}

#[test]
fn head_follows_get_and_the_query_is_ignored() {
    // ROUTE-12 discovery by HEAD; ROUTE-08 /slots and /metrics by HEAD.
    let a = adapter();
    for path in ["/health", "/v1/models", "/models", "/props"] {
        assert_eq!(
            kind(a.classify(&Method::HEAD, path)),
            Kind::Discovery,
            "{path}"
        );
    }
    assert_eq!(kind(a.classify(&Method::HEAD, "/slots")), Kind::Management);
    assert_eq!(
        kind(a.classify(&Method::HEAD, "/metrics")),
        Kind::Management
    );
    assert_eq!(
        kind(a.classify(&Method::GET, "/slots?fail_on_no_slot=1")),
        Kind::Management
    );
    assert_eq!(
        kind(a.classify(&Method::POST, "/v1/chat/completions?stream=true")),
        Kind::Work
    );
    assert_eq!(kind(a.classify(&Method::GET, "/health?x")), Kind::Discovery);
}

#[test]
fn unlisted_requests_are_unknown() {
    // ROUTE-01: never work.
    let a = adapter();
    for (method, path) in [
        (Method::GET, "/"),
        (Method::GET, "/index.html"),
        (Method::GET, "/completion"),
        (Method::GET, "/slots/0"),
        (Method::GET, "/lora-adapters"),
        (Method::POST, "/lora-adapters"),
        (Method::POST, "/v1/models"),
        (Method::POST, "/health"),
        (Method::POST, "/v1/messages"),
        (Method::POST, "/apply-template"),
        (Method::POST, "/models/load"),
        (Method::PUT, "/completion"),
        (Method::DELETE, "/slots/0"),
        (Method::POST, "/v1/chat/completions/"),
        (Method::POST, "/V1/chat/completions"),
        (Method::POST, "/llm/v1/chat/completions"),
    ] {
        assert_eq!(
            kind(a.classify(&method, path)),
            Kind::Unknown,
            "{method} {path}"
        );
    }
}

#[test]
fn the_policy_refuses_owner_data_and_unknown_routes() {
    // ROUTE-02, ROUTE-03, ROUTE-08, ROUTE-09
    let a = adapter();
    let policy = |m: Method, p: &str, mgmt| route_policy(a.classify(&m, p), &m, mgmt);
    let forbidden = RoutePolicy::Refuse(RefusalCode::RouteForbidden);
    let unsupported = RoutePolicy::Refuse(RefusalCode::RouteNotSupported);
    assert_eq!(policy(Method::GET, "/slots", Management::Deny), forbidden);
    assert_eq!(policy(Method::GET, "/metrics", Management::Deny), forbidden);
    assert_eq!(policy(Method::POST, "/props", Management::Deny), forbidden);
    assert_eq!(
        policy(Method::POST, "/slots/0", Management::Deny),
        forbidden
    );
    assert_eq!(
        policy(Method::GET, "/slots", Management::Allow),
        RoutePolicy::Forward
    );
    assert_eq!(policy(Method::GET, "/unknown", Management::Deny), forbidden);
    assert_eq!(
        policy(Method::POST, "/unknown", Management::Deny),
        unsupported
    );
    assert_eq!(
        policy(Method::POST, "/unknown", Management::Allow),
        unsupported
    );
    assert_eq!(
        policy(Method::GET, "/props", Management::Deny),
        RoutePolicy::Forward
    );
    assert_eq!(
        policy(Method::POST, "/tokenize", Management::Deny),
        RoutePolicy::Forward
    );
    assert!(matches!(
        policy(Method::POST, "/infill", Management::Deny),
        RoutePolicy::Admit(_)
    ));
}

#[test]
fn the_table_has_no_overlaps_and_a_name() {
    route_table().unwrap();
    let a = adapter();
    assert_eq!(a.name(), "llamacpp");
    assert_eq!(a.routes().entries().len(), ROUTES.len());
    assert!(a.reclaimer().is_none());
    // Refusals render OpenAI-style.
    let r = a.render_refusal(&Refusal::new(RefusalCode::ResourceBusy, "gpu0 is reserved"));
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["error"]["code"], "resource_busy");
    assert_eq!(r.headers.get(http::header::RETRY_AFTER).unwrap(), "2");
}

// ------------------------------------------------------------ inspection

#[test]
fn inspection_follows_the_shared_rules() {
    // ROUTE-05, ROUTE-06, ROUTE-07, MEM-06
    check_shared_inspection(&adapter());
}

#[test]
fn native_routes_read_the_model_too() {
    let a = adapter();
    let headers = http::HeaderMap::new();
    for path in ["/completion", "/infill", "/rerank", "/embedding"] {
        let RouteClass::Work(route) = a.classify(&Method::POST, path) else {
            panic!("{path}");
        };
        let ctx = InspectContext {
            entry: vacancy::EntryId::from_u128(1),
            method: &Method::POST,
            path,
            headers: &headers,
        };
        assert_eq!(
            a.inspect(&route, ctx, br#"{"prompt":"hi","n_predict":8}"#)
                .unwrap(),
            Inspection::default()
        );
        assert_eq!(
            a.inspect(&route, ctx, br#"{"model":"tiny.gguf","background":true}"#)
                .unwrap()
                .model
                .as_deref(),
            Some("tiny.gguf"),
            "background only matters on /v1/responses"
        );
    }
}

// ----------------------------------------------------------- observation

/// A fake llama-server answering each path with a fixture and a status.
async fn upstream(routes: &[(&'static str, u16, &'static str)]) -> TestServer {
    let routes: HashMap<&'static str, (u16, &'static str)> =
        routes.iter().map(|(p, s, b)| (*p, (*s, *b))).collect();
    TestServer::start(move |req| {
        let path = req.path.split('?').next().unwrap_or_default();
        match routes.get(path) {
            Some((status, body)) => Reply::json(*status, body),
            None => Reply::json(
                404,
                r#"{"error":{"message":"File Not Found","type":"not_found_error","code":404}}"#,
            ),
        }
    })
    .await
}

fn at(server: &TestServer) -> LlamaCppAdapter {
    adapter_for(&format!("http://{}", server.addr()))
}

fn paths(server: &TestServer) -> Vec<String> {
    let mut p: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    // /v1/models and /slots are read together; /props always first.
    p[1..].sort();
    p
}

fn model(obs: &ModelObservation, name: &str) -> ObservedModel {
    obs.model(name)
        .unwrap_or_else(|| panic!("{name} not in {obs:?}"))
        .clone()
}

#[tokio::test]
async fn idle_slots_prove_residency() {
    // RES-16, from the real server's idle answers.
    for slots in [
        fixture!("slots_idle.json"),
        fixture!("slots_idle_after_work.json"),
    ] {
        let server = upstream(&[
            ("/props", 200, fixture!("props_idle.json")),
            ("/v1/models", 200, fixture!("v1_models.json")),
            ("/slots", 200, slots),
        ])
        .await;
        let a = at(&server);
        let before = a.settings().clock.now();
        let obs = a.observe().await.unwrap();
        assert!(obs.taken_at >= before && obs.taken_at <= a.settings().clock.now());
        assert_eq!(obs.models.len(), 1);
        assert_eq!(
            model(&obs, "tiny.gguf"),
            ObservedModel::new("tiny.gguf", ResidencyEvidence::Proven)
        );
        assert_eq!(obs.visible_work, None);
        assert_eq!(paths(&server), ["/props", "/slots", "/v1/models"]);
    }
}

#[tokio::test]
async fn a_processing_slot_is_foreign_work_and_no_proof() {
    // ADM-09, RES-16, from the real server while one of two slots generated.
    let server = upstream(&[
        ("/props", 200, fixture!("props_one_processing.json")),
        ("/v1/models", 200, fixture!("v1_models.json")),
        ("/slots", 200, fixture!("slots_one_processing.json")),
    ])
    .await;
    let obs = at(&server).observe().await.unwrap();
    assert_eq!(
        obs.visible_work
            .as_ref()
            .map(|w| (w.jobs, w.description.as_str())),
        Some((1, "1 of 2 slots processing"))
    );
    assert_eq!(
        model(&obs, "tiny.gguf").evidence,
        ResidencyEvidence::NotProven(
            "1 of 2 slots processing; resident credit needs idle slots".into()
        )
    );
    assert!(model(&obs, "tiny.gguf").ready);

    let server = upstream(&[
        ("/props", 200, fixture!("props_all_processing.json")),
        ("/v1/models", 200, fixture!("v1_models.json")),
        ("/slots", 200, fixture!("slots_all_processing.json")),
    ])
    .await;
    let obs = at(&server).observe().await.unwrap();
    assert_eq!(
        obs.visible_work
            .as_ref()
            .map(|w| (w.jobs, w.description.as_str())),
        Some((2, "2 of 2 slots processing"))
    );
    assert_eq!(
        model(&obs, "tiny.gguf").evidence,
        ResidencyEvidence::NotProven("no idle slot (2 of 2 slots processing)".into())
    );
}

#[tokio::test]
async fn an_unavailable_slots_endpoint_is_no_evidence_never_idle() {
    // RES-16, OBS-02: disabled (501, the real server's answer), missing (404), unauthorized.
    let cases: [(u16, &str, &str); 4] = [
        (
            501,
            fixture!("slots_disabled_501.json"),
            "the /slots endpoint is unavailable: GET /slots answered 501 Not Implemented: This server does not support slots endpoint. Start it with `--slots`; without it no idle slot is proven",
        ),
        (
            404,
            r#"{"error":{"message":"File Not Found","type":"not_found_error","code":404}}"#,
            "the /slots endpoint is unavailable: GET /slots answered 404 Not Found: File Not Found; without it no idle slot is proven",
        ),
        (
            401,
            fixture!("slots_unauthorized_401.json"),
            "the /slots endpoint is unavailable: GET /slots answered 401 Unauthorized: Invalid API Key; configure [upstream.credential]; without it no idle slot is proven",
        ),
        (
            503,
            fixture!("slots_fail_on_no_slot_all_busy_503.json"),
            "the /slots endpoint is unavailable: GET /slots answered 503 Service Unavailable: no slot available; without it no idle slot is proven",
        ),
    ];
    for (status, body, why) in cases {
        let server = upstream(&[
            ("/props", 200, fixture!("props_idle.json")),
            ("/v1/models", 200, fixture!("v1_models.json")),
            ("/slots", status, body),
        ])
        .await;
        let obs = at(&server).observe().await.unwrap();
        assert_eq!(obs.visible_work, None, "{status}");
        assert_eq!(
            model(&obs, "tiny.gguf").evidence,
            ResidencyEvidence::NotProven(why.into()),
            "{status}"
        );
    }
}

#[tokio::test]
async fn garbage_is_malformed_never_an_observation() {
    // OBS-03
    let garbage: [(&str, &str, &str); 8] = [
        (
            "/slots",
            "{}",
            "GET /slots: the answer is not a list of slots",
        ),
        ("/slots", "[]", "GET /slots: the answer lists no slot"),
        (
            "/slots",
            r#"[{"id":0,"is_processing":"no"}]"#,
            "GET /slots: slot 0 does not say whether it is processing",
        ),
        (
            "/slots",
            r#"[{"id":0,"is_processing":false},{"id":1}]"#,
            "GET /slots: slot 1 does not say whether it is processing",
        ),
        (
            "/slots",
            "<html>",
            "GET /slots: the answer is not JSON (application/json; charset=utf-8): expected value at line 1 column 1",
        ),
        (
            "/v1/models",
            r#"{"models":[]}"#,
            "GET /v1/models: the answer has no \"data\" list",
        ),
        (
            "/v1/models",
            r#"{"data":[{"object":"model"}]}"#,
            "GET /v1/models: a model entry has no string \"id\"",
        ),
        (
            "/props",
            "[]",
            "GET /props answered something other than a JSON object",
        ),
    ];
    for (path, body, why) in garbage {
        let mut routes = vec![
            ("/props", 200, fixture!("props_idle.json")),
            ("/v1/models", 200, fixture!("v1_models.json")),
            ("/slots", 200, fixture!("slots_idle.json")),
        ];
        routes.retain(|(p, _, _)| *p != path);
        routes.push((path, 200, body));
        let server = upstream(&routes).await;
        assert_eq!(
            at(&server).observe().await,
            Err(ObserveError::Malformed(why.into())),
            "{path} {body}"
        );
    }
    // Models that cannot be listed are an error, not an empty observation.
    let server = upstream(&[
        ("/props", 200, fixture!("props_idle.json")),
        (
            "/v1/models",
            503,
            r#"{"error":{"code":503,"message":"Loading model"}}"#,
        ),
        ("/slots", 200, fixture!("slots_idle.json")),
    ])
    .await;
    assert_eq!(
        at(&server).observe().await,
        Err(ObserveError::Malformed(
            "GET /v1/models answered 503 Service Unavailable: Loading model".into()
        ))
    );
}

#[tokio::test]
async fn a_sleeping_server_lists_nothing_and_is_not_woken() {
    // The real server with --sleep-idle-seconds: /props says it sleeps; /slots would reload it.
    let server = upstream(&[
        ("/props", 200, fixture!("props_sleeping.json")),
        ("/v1/models", 200, fixture!("v1_models.json")),
        ("/slots", 200, fixture!("slots_idle.json")),
    ])
    .await;
    let a = at(&server);
    let obs = a.observe().await.unwrap();
    assert_eq!(obs.models, []);
    assert_eq!(obs.visible_work, None);
    assert_eq!(a.verify_stopped().await, Ok(true));
    assert_eq!(paths(&server), ["/props", "/props"]);
}

#[tokio::test]
async fn a_server_without_props_is_read_as_awake() {
    let server = upstream(&[
        ("/v1/models", 200, fixture!("v1_models.json")),
        ("/slots", 200, fixture!("slots_idle.json")),
    ])
    .await;
    let obs = at(&server).observe().await.unwrap();
    assert_eq!(model(&obs, "tiny.gguf").evidence, ResidencyEvidence::Proven);
}

#[tokio::test]
async fn without_a_usable_credential_the_observation_is_unavailable() {
    // OBS-02: the real server with --api-key answers 401 on /props, /v1/models and /slots.
    let key = fixture!("slots_unauthorized_401.json");
    let server = upstream(&[
        ("/props", 401, key),
        ("/v1/models", 401, key),
        ("/slots", 401, key),
    ])
    .await;
    let a = at(&server);
    let want =
        ObserveError::Unauthorized("GET /props answered 401 Unauthorized: Invalid API Key".into());
    assert_eq!(a.observe().await, Err(want.clone()));
    assert_eq!(a.verify_stopped().await, Err(want));
}

#[tokio::test]
async fn observation_uses_the_prefix_and_only_vacancys_credential() {
    // OBS-01, OBS-02; the target's prefix is joined to each route.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let server = TestServer::start(move |req| {
        log.lock()
            .unwrap()
            .push((req.path.clone(), req.header("authorization")));
        if req.header("authorization").as_deref() != Some("Bearer vacancy") {
            return Reply::json(401, fixture!("slots_unauthorized_401.json"));
        }
        match req.path.as_str() {
            "/llm/props" => Reply::json(200, fixture!("props_idle.json")),
            "/llm/v1/models" => Reply::json(200, fixture!("v1_models_alias.json")),
            "/llm/slots" => Reply::json(200, fixture!("slots_idle.json")),
            _ => Reply::json(404, "{}"),
        }
    })
    .await;
    let settings = AdapterSettings::new(
        format!("http://{}/llm/", server.addr()).parse().unwrap(),
        MonotonicClock::new(),
    )
    .with_credential(
        http::header::AUTHORIZATION,
        http::HeaderValue::from_static("Bearer vacancy"),
    );
    let a = LlamaCppAdapter::new(settings).unwrap();
    let obs = a.observe().await.unwrap();
    assert_eq!(model(&obs, "my-model").evidence, ResidencyEvidence::Proven);
    assert_eq!(obs.models.len(), 1, "the alias equals the id: listed once");
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    let auth = Some("Bearer vacancy".to_owned());
    assert_eq!(
        seen,
        [
            ("/llm/props".to_owned(), auth.clone()),
            ("/llm/slots".to_owned(), auth.clone()),
            ("/llm/v1/models".to_owned(), auth),
        ]
    );
}

#[tokio::test]
async fn a_closed_port_is_unreachable() {
    let refusing = closed_port();
    let port = refusing.addr().port();
    let a = adapter_for(&format!("http://127.0.0.1:{port}"));
    assert!(matches!(
        a.observe().await,
        Err(ObserveError::Unreachable(_))
    ));
    assert!(matches!(
        a.verify_stopped().await,
        Err(ObserveError::Unreachable(_))
    ));
}

#[tokio::test]
async fn verify_stopped_needs_a_fresh_reading_of_no_slot_processing() {
    // DONE-04: only Ok(true) releases.
    let busy = Arc::new(Mutex::new(true));
    let state = busy.clone();
    let server = TestServer::start(move |req| match req.path.as_str() {
        "/props" => Reply::json(200, fixture!("props_one_processing.json")),
        "/slots" if *state.lock().unwrap() => {
            Reply::json(200, fixture!("slots_one_processing.json"))
        }
        "/slots" => Reply::json(200, fixture!("slots_idle_after_work.json")),
        _ => Reply::json(404, "{}"),
    })
    .await;
    let a = at(&server);
    assert_eq!(a.verify_stopped().await, Ok(false));
    *busy.lock().unwrap() = false;
    assert_eq!(a.verify_stopped().await, Ok(true));

    let server = upstream(&[
        ("/props", 200, fixture!("props_idle.json")),
        ("/slots", 501, fixture!("slots_disabled_501.json")),
    ])
    .await;
    assert!(matches!(
        at(&server).verify_stopped().await,
        Err(ObserveError::Malformed(m)) if m.contains("501")
    ));
    let server = upstream(&[("/slots", 200, r#"[{"id":0}]"#)]).await;
    assert!(matches!(
        at(&server).verify_stopped().await,
        Err(ObserveError::Malformed(_))
    ));
}

#[test]
fn older_servers_report_slot_state_numbers() {
    // Before `is_processing`, /slots carried `state` (0 = idle).
    let v: Value = serde_json::from_str(r#"[{"id":0,"state":0},{"id":1,"state":1}]"#).unwrap();
    assert_eq!(
        parse_slots(&v).unwrap(),
        Slots {
            total: 2,
            processing: 1
        }
    );
    let v: Value = serde_json::from_str(r#"[{"id":0,"state":"idle"}]"#).unwrap();
    assert!(parse_slots(&v).is_err());
}

#[test]
fn router_mode_lists_only_loaded_models_as_ready() {
    let v: Value = serde_json::from_str(
        r#"{"data":[
            {"id":"a","status":{"value":"loaded"},"aliases":["a-alias"]},
            {"id":"b","status":{"value":"loading"}},
            {"id":"c","status":{"value":"unloaded"}},
            {"id":"d","status":{"value":"sleeping"}},
            {"id":"e"}
        ]}"#,
    )
    .unwrap();
    assert_eq!(
        parse_models(&v).unwrap(),
        [
            ("a".to_owned(), true),
            ("a-alias".to_owned(), true),
            ("b".to_owned(), false),
            ("e".to_owned(), true),
        ]
    );
}

#[test]
fn is_sleeping_must_be_a_boolean() {
    assert!(!is_sleeping(&serde_json::json!({})).unwrap());
    assert!(is_sleeping(&serde_json::json!({"is_sleeping": true})).unwrap());
    assert_eq!(
        is_sleeping(&serde_json::json!({"is_sleeping": "yes"})),
        Err(ObserveError::Malformed(
            "GET /props: is_sleeping is a string, not a boolean".into()
        ))
    );
}
