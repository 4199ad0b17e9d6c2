//! A complete adapter for a small made-up upstream — a "haiku server" — written
//! only against vacancy's public API, as an adapter author outside this
//! repository would write it. Running it checks the adapter with
//! `vacancy::testkit`, exactly as the repository's own adapters are checked:
//!
//! ```sh
//! cargo run -p vacancy --features testkit --example custom_adapter
//! ```
//!
//! The made-up upstream's API:
//! - `POST /haiku/generate {"model": "...", "topic": "..."}` — work: answers when the poem is done;
//! - `GET /haiku/models` — discovery;
//! - `GET /haiku/poems/{id}` — a borrower reads a finished poem (IDs: 8–40 letters or digits);
//! - `POST /haiku/admin/reload` — management.

use std::sync::Arc;

use async_trait::async_trait;
use vacancy::engine::{ModelObservation, ObservedModel, Refusal, ResidencyEvidence};
use vacancy::registry::{AdapterContext, BuildError};
use vacancy::testkit::{self, WorkSample};
use vacancy::traits::{
    Adapter, InspectContext, InspectError, InspectResult, Inspection, ObserveError,
    RenderedRefusal, RouteClass, RouteMethod, RouteSpec, RouteTable, WorkRoute,
};

/// The haiku server's dialect.
struct HaikuAdapter {
    routes: RouteTable,
    clock: vacancy::MonotonicClock,
}

fn poem_id(s: &str) -> bool {
    (8..=40).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric())
}

impl HaikuAdapter {
    /// `clock` is the daemon's, from the factory's context: observations are
    /// stamped with it, never with a clock of the adapter's own.
    fn new(clock: vacancy::MonotonicClock) -> Result<Self, vacancy::traits::routes::RouteOverlap> {
        let routes = RouteTable::new(vec![
            RouteSpec::new(
                RouteMethod::Post,
                "/haiku/generate",
                RouteClass::Work(WorkRoute::response_end()),
            ),
            RouteSpec::new(RouteMethod::Get, "/haiku/models", RouteClass::Discovery),
            RouteSpec {
                param_check: Some(poem_id),
                ..RouteSpec::new(
                    RouteMethod::Get,
                    "/haiku/poems/{id}",
                    RouteClass::BorrowerRead,
                )
            },
            RouteSpec::new(
                RouteMethod::Post,
                "/haiku/admin/reload",
                RouteClass::Management,
            ),
        ])?;
        Ok(HaikuAdapter { routes, clock })
    }
}

/// The factory the daemon calls once per `adapter = "haiku"` upstream
/// (`vacancy_cli::Vacancyd::with_builtin_adapters().adapter("haiku", haiku)`).
fn haiku(ctx: &AdapterContext<'_>) -> Result<Arc<dyn Adapter>, BuildError> {
    let adapter = HaikuAdapter::new(ctx.clock).map_err(BuildError::new)?;
    Ok(Arc::new(adapter))
}

#[async_trait]
impl Adapter for HaikuAdapter {
    fn name(&self) -> &str {
        "haiku"
    }

    fn routes(&self) -> &RouteTable {
        &self.routes
    }

    fn inspect(&self, _route: &WorkRoute, _ctx: InspectContext<'_>, body: &[u8]) -> InspectResult {
        let json: serde_json::Value = serde_json::from_slice(body)
            .map_err(|e| InspectError::invalid(format!("the body is not JSON: {e}")))?;
        let obj = json
            .as_object()
            .ok_or_else(|| InspectError::invalid("the body must be a JSON object"))?;
        if !obj.get("topic").is_some_and(|t| t.is_string()) {
            return Err(InspectError::invalid("\"topic\" must be a string"));
        }
        let model = match obj.get("model") {
            None => None,
            Some(serde_json::Value::String(m)) => Some(m.clone()),
            Some(_) => return Err(InspectError::invalid("\"model\" must be a string")),
        };
        Ok(Inspection {
            model,
            ..Inspection::default()
        })
    }

    async fn observe(&self) -> Result<ModelObservation, ObserveError> {
        // A real adapter would GET /haiku/models with the operator's credential.
        Ok(ModelObservation {
            taken_at: self.clock.now(),
            models: vec![ObservedModel::new(
                "basho-1".to_owned(),
                ResidencyEvidence::NotProven("the haiku server reports no idle state".to_owned()),
            )],
            visible_work: None,
            allocator_free_mib: None,
        })
    }

    fn render_refusal(&self, refusal: &Refusal) -> RenderedRefusal {
        // The haiku server's own error shape is `{"error": "..."}`, like Ollama's.
        vacancy::traits::render_ollama(refusal)
    }
}

fn report(name: &str, result: Result<(), Vec<String>>) -> bool {
    match result {
        Ok(()) => {
            println!("ok   {name}");
            true
        }
        Err(problems) => {
            println!("FAIL {name}");
            for p in problems {
                println!("     {p}");
            }
            false
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let adapter = match HaikuAdapter::new(vacancy::MonotonicClock::new()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("route table: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut ok = report("route table", testkit::check_route_table(&adapter));
    ok &= report("refusal dialect", testkit::check_refusal_dialect(&adapter));
    let sample = WorkSample::json("/haiku/generate", r#"{"model":"basho-1","topic":"autumn"}"#);
    ok &= report(
        "completion (clean end, refused connect, cut stream)",
        testkit::check_completion(&haiku, &sample).await,
    );
    if ok {
        println!("the haiku adapter passes vacancy's conformance checks");
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
