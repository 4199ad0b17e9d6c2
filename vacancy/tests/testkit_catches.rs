//! Each check of `vacancy::testkit` fails on an adapter that breaks its rule:
//! a kit that passes everything would prove nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use vacancy::engine::{ModelObservation, ObservedModel, ResidencyEvidence, VisibleWork};
use vacancy::registry::{AdapterContext, BuildError};
use vacancy::testkit::{
    Canned, ObservationCase, WorkSample, check_inspection, check_observation, check_route_classes,
};
use vacancy::traits::{
    Adapter, InspectContext, InspectError, InspectResult, Inspection, ObserveError, RouteClass,
    RouteMethod, RouteSpec, RouteTable, WorkRoute,
};
use vacancy::{Moment, MonotonicClock};

const WORK: RouteClass = RouteClass::Work(WorkRoute::response_end());

/// How a test adapter breaks the rules.
#[derive(Clone, Copy, Default)]
struct Breaks {
    /// Reads any body, lowercases the model, ignores background.
    careless_inspection: bool,
    /// Stamps observations with a clock of its own.
    own_clock: bool,
    /// Keeps the last good observation when an answer cannot be read.
    keeps_last: bool,
    /// Never reports the running jobs.
    hides_work: bool,
}

/// A tiny dialect: `GET /state` answers `{"model": "m", "idle": bool, "running": n}`.
struct Tiny {
    routes: RouteTable,
    target: String,
    clock: MonotonicClock,
    breaks: Breaks,
    last: Mutex<Option<ModelObservation>>,
}

fn tiny(breaks: Breaks) -> impl Fn(&AdapterContext<'_>) -> Result<Arc<dyn Adapter>, BuildError> {
    move |ctx: &AdapterContext<'_>| {
        let routes = RouteTable::new(vec![
            RouteSpec::new(RouteMethod::Post, "/v1/chat/completions", WORK),
            RouteSpec::new(RouteMethod::Post, "/v1/responses", WORK),
            RouteSpec::new(RouteMethod::Get, "/v1/models", RouteClass::Discovery),
        ])
        .map_err(BuildError::new)?;
        Ok(Arc::new(Tiny {
            routes,
            target: ctx.upstream.target.clone(),
            clock: if breaks.own_clock {
                MonotonicClock::new()
            } else {
                ctx.clock
            },
            breaks,
            last: Mutex::new(None),
        }) as Arc<dyn Adapter>)
    }
}

async fn get_json(base: &str, path: &str) -> Result<serde_json::Value, ObserveError> {
    let unreachable = |e: &dyn std::fmt::Display| ObserveError::Unreachable(e.to_string());
    let authority = base.trim_start_matches("http://").to_owned();
    let stream = tokio::net::TcpStream::connect(&authority)
        .await
        .map_err(|e| unreachable(&e))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(&e))?;
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header(http::header::HOST, authority)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.map_err(|e| unreachable(&e))?;
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| unreachable(&e))?;
    serde_json::from_slice(&body.to_bytes()).map_err(|e| ObserveError::Malformed(e.to_string()))
}

fn parse(v: &serde_json::Value, taken_at: Moment) -> Result<ModelObservation, ObserveError> {
    let malformed = || ObserveError::Malformed("GET /state".to_owned());
    let model = v["model"].as_str().ok_or_else(malformed)?;
    let idle = v["idle"].as_bool().ok_or_else(malformed)?;
    let running = v["running"].as_u64().ok_or_else(malformed)?;
    let evidence = if idle && running == 0 {
        ResidencyEvidence::Proven
    } else {
        ResidencyEvidence::NotProven("busy".to_owned())
    };
    Ok(ModelObservation {
        taken_at,
        models: vec![ObservedModel::new(model.to_owned(), evidence)],
        visible_work: (running > 0)
            .then(|| VisibleWork::new(u32::try_from(running).unwrap(), "running")),
        allocator_free_mib: None,
    })
}

#[async_trait]
impl Adapter for Tiny {
    fn name(&self) -> &str {
        "tiny"
    }
    fn routes(&self) -> &RouteTable {
        &self.routes
    }
    fn inspect(&self, _route: &WorkRoute, _ctx: InspectContext<'_>, body: &[u8]) -> InspectResult {
        let v: serde_json::Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(_) if self.breaks.careless_inspection => return Ok(Inspection::default()),
            Err(e) => return Err(InspectError::invalid(format!("not JSON: {e}"))),
        };
        let model = v.get("model").and_then(|m| m.as_str());
        if self.breaks.careless_inspection {
            return Ok(Inspection {
                model: model.map(str::to_lowercase),
                ..Inspection::default()
            });
        }
        // The honest version is vacancy_adapters::common::inspect_json_body;
        // this test keeps to crate vacancy, so it states just enough.
        if !v.is_object() || v.get("model").is_some_and(|m| !m.is_string()) {
            return Err(InspectError::invalid(
                "not a JSON object with a string model",
            ));
        }
        Ok(Inspection {
            model: model.map(str::to_owned),
            ..Inspection::default()
        })
    }
    async fn observe(&self) -> Result<ModelObservation, ObserveError> {
        let taken_at = self.clock.now();
        let got = get_json(&self.target, "/state")
            .await
            .and_then(|v| parse(&v, taken_at));
        let mut last = self.last.lock().unwrap();
        match got {
            Ok(mut o) => {
                if self.breaks.hides_work {
                    o.visible_work = None;
                }
                *last = Some(o.clone());
                Ok(o)
            }
            Err(_) if self.breaks.keeps_last && last.is_some() => {
                let mut o = last.clone().unwrap();
                o.taken_at = taken_at;
                Ok(o)
            }
            Err(e) => Err(e),
        }
    }
}

fn case() -> ObservationCase {
    ObservationCase {
        idle: vec![Canned::json(
            "/state",
            r#"{"model":"m","idle":true,"running":0}"#,
        )],
        idle_proves: true,
        model: "m".to_owned(),
        busy: vec![Canned::json(
            "/state",
            r#"{"model":"m","idle":false,"running":3}"#,
        )],
        busy_jobs: 3,
        malformed: vec![vec![Canned::json(
            "/state",
            r#"{"model":"m","idle":"yes"}"#,
        )]],
    }
}

fn build(breaks: Breaks) -> Arc<dyn Adapter> {
    let kit = vacancy::testkit::KitUpstream::new("http://127.0.0.1:9").unwrap();
    kit.build(&tiny(breaks), MonotonicClock::new()).unwrap()
}

fn joined(r: Result<(), Vec<String>>) -> String {
    r.err().map(|p| p.join("\n")).unwrap_or_default()
}

#[tokio::test]
async fn the_honest_tiny_adapter_passes_observation_and_misses_only_the_shared_inspection_rules() {
    check_observation(&tiny(Breaks::default()), &case())
        .await
        .unwrap();
    // Its hand-written inspection knows neither the background rule nor a
    // duplicated model (serde keeps the last): exactly what
    // vacancy_adapters::common::inspect_json_body covers, and all the kit finds.
    let got = joined(check_inspection(
        build(Breaks::default()).as_ref(),
        &[WorkSample::json("/v1/chat/completions", r#"{"model":"m"}"#)],
    ));
    assert!(!got.is_empty());
    assert!(
        got.lines().all(
            |l| l.starts_with("ROUTE-05") || l.contains(r#"{\"model\":\"a\",\"model\":\"b\"}"#)
        ),
        "{got}"
    );
}

#[tokio::test]
async fn an_adapter_with_its_own_clock_is_caught() {
    let got = joined(
        check_observation(
            &tiny(Breaks {
                own_clock: true,
                ..Breaks::default()
            }),
            &case(),
        )
        .await,
    );
    assert!(
        got.contains("ADM-09: the idle observation is stamped"),
        "{got}"
    );
}

#[tokio::test]
async fn an_adapter_that_keeps_its_last_good_answer_is_caught() {
    let got = joined(
        check_observation(
            &tiny(Breaks {
                keeps_last: true,
                ..Breaks::default()
            }),
            &case(),
        )
        .await,
    );
    assert!(
        got.contains("OBS-03: malformed answer set 0 proves residency"),
        "{got}"
    );
    assert!(
        got.contains("OBS-03: an upstream that hangs up proves residency"),
        "{got}"
    );
}

#[tokio::test]
async fn an_adapter_that_hides_visible_work_is_caught() {
    let got = joined(
        check_observation(
            &tiny(Breaks {
                hides_work: true,
                ..Breaks::default()
            }),
            &case(),
        )
        .await,
    );
    assert!(
        got.contains("the observation reports 0 as visible work"),
        "{got}"
    );
}

#[test]
fn careless_inspection_is_caught() {
    let got = joined(check_inspection(
        build(Breaks {
            careless_inspection: true,
            ..Breaks::default()
        })
        .as_ref(),
        &[WorkSample::json("/v1/chat/completions", r#"{"model":"m"}"#)],
    ));
    assert!(
        got.contains("MEM-06: POST /v1/chat/completions: the model"),
        "{got}"
    );
    assert!(got.contains("the body \"not json\" was accepted"), "{got}");
    assert!(
        got.contains("ROUTE-05..07: POST /v1/responses with \"{\\\"model\\\":\\\"m\\\",\\\"input\\\":\\\"hi\\\",\\\"background\\\":true}\""),
        "{got}"
    );
}

#[test]
fn a_table_that_differs_from_its_class_list_is_caught() {
    let a = build(Breaks::default());
    let expected = [
        (http::Method::POST, "/v1/chat/completions", WORK),
        (http::Method::GET, "/v1/models", RouteClass::Management),
    ];
    let got = joined(check_route_classes(a.as_ref(), &expected));
    assert!(
        got.contains("GET /v1/models classifies as Discovery, expected Management"),
        "{got}"
    );
    assert!(
        got.contains("\"/v1/responses\"") || got.contains("/v1/responses (Work"),
        "{got}"
    );
}

#[tokio::test]
async fn a_refusing_port_refuses_and_is_never_handed_out_while_it_lives() {
    // DONE-02's check needs an upstream that refuses: the kit's port must
    // refuse, and no bind in the process (the proxy's own) may take it.
    let refusing = vacancy::testkit::RefusingPort::bind().unwrap();
    let err = tokio::net::TcpStream::connect(refusing.addr())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    assert!(
        tokio::net::TcpListener::bind(refusing.addr())
            .await
            .is_err(),
        "another listener took the refusing port"
    );
    for _ in 0..200 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        assert_ne!(l.local_addr().unwrap(), refusing.addr());
    }
}
