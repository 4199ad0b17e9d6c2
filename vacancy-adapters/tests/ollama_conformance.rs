//! vacancy's adapter conformance kit (docs/adapter-guide.md#check-it-with-the-kit) on the Ollama adapter: route
//! classes, the refusal dialect, and completion through the real proxy
//! (DONE-01 clean end, DONE-02 refused connection, DONE-03 cut stream).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use vacancy::testkit::{WorkSample, check_completion, check_refusal_dialect, check_route_table};
use vacancy::{Adapter, MonotonicClock};
use vacancy_adapters::{AdapterSettings, OllamaAdapter};

fn ollama(target: &str) -> Arc<dyn Adapter> {
    Arc::new(
        OllamaAdapter::new(AdapterSettings::new(
            target.parse().unwrap(),
            MonotonicClock::new(),
        ))
        .unwrap(),
    )
}

#[tokio::test]
async fn ollama_conforms() {
    let a = ollama("http://127.0.0.1:1");
    check_route_table(a.as_ref()).unwrap();
    check_refusal_dialect(a.as_ref()).unwrap();
    for sample in [
        WorkSample::json("/api/generate", r#"{"model":"llama3","prompt":"hi"}"#),
        WorkSample::json(
            "/api/chat",
            r#"{"model":"llama3","messages":[{"role":"user","content":"hi"}],"options":{"num_gpu":1}}"#,
        ),
        WorkSample::json(
            "/v1/chat/completions",
            r#"{"model":"llama3","messages":[{"role":"user","content":"hi"}]}"#,
        ),
        WorkSample::json("/v1/responses", r#"{"model":"llama3","input":"hi"}"#),
    ] {
        let factory = vacancy_adapters::builtin::registry();
        let factory = factory.get("ollama").unwrap();
        check_completion(factory.as_ref(), &sample).await.unwrap();
    }
}
