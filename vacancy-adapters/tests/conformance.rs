//! vacancy's adapter conformance kit (docs/adapter-guide.md#check-it-with-the-kit) on both adapters: route
//! classes, the refusal dialect, and completion through the real proxy
//! (DONE-01 clean end, DONE-02 refused connection, DONE-03 cut stream).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use vacancy::registry::AdapterFactory;
use vacancy::testkit::{WorkSample, check_completion, check_refusal_dialect, check_route_table};
use vacancy::{Adapter, MonotonicClock};
use vacancy_adapters::{AdapterSettings, LlamaCppAdapter, OpenAiAdapter};

fn settings(target: &str) -> AdapterSettings {
    AdapterSettings::new(target.parse().unwrap(), MonotonicClock::new())
}

fn factory(kind: &str) -> Arc<dyn AdapterFactory> {
    Arc::clone(vacancy_adapters::builtin::registry().get(kind).unwrap())
}

fn llamacpp(target: &str) -> Arc<dyn Adapter> {
    Arc::new(LlamaCppAdapter::new(settings(target)).unwrap())
}

fn openai(target: &str) -> Arc<dyn Adapter> {
    Arc::new(OpenAiAdapter::new(settings(target)).unwrap())
}

#[tokio::test]
async fn llamacpp_conforms() {
    let a = llamacpp("http://127.0.0.1:1");
    check_route_table(a.as_ref()).unwrap();
    check_refusal_dialect(a.as_ref()).unwrap();
    check_completion(
        factory("llamacpp").as_ref(),
        &WorkSample::json("/completion", r#"{"prompt":"hi","n_predict":4}"#),
    )
    .await
    .unwrap();
    check_completion(
        factory("llamacpp").as_ref(),
        &WorkSample::json("/v1/responses", r#"{"model":"m","input":"hi"}"#),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn openai_conforms() {
    let a = openai("http://127.0.0.1:1");
    check_route_table(a.as_ref()).unwrap();
    check_refusal_dialect(a.as_ref()).unwrap();
    check_completion(
        factory("openai").as_ref(),
        &WorkSample::json(
            "/v1/chat/completions",
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        ),
    )
    .await
    .unwrap();
    let form = WorkSample {
        method: http::Method::POST,
        path: "/v1/audio/transcriptions".into(),
        content_type: "multipart/form-data; boundary=vacancy".into(),
        body: bytes::Bytes::from_static(
            b"--vacancy\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--vacancy\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF\r\n--vacancy--\r\n",
        ),
    };
    check_completion(factory("openai").as_ref(), &form)
        .await
        .unwrap();
}
