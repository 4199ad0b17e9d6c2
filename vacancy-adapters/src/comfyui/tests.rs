#![allow(clippy::unwrap_used, clippy::panic)]
use vacancy::engine::RequestReuse;

use super::*;
use http::Method;
use serde_json::json;
use vacancy::config::Management;
use vacancy::traits::{RoutePolicy, route_policy};
use vacancy::{EntryId, MonotonicClock, RefusalCode};

fn adapter() -> ComfyUiAdapter {
    ComfyUiAdapter::new(AdapterSettings::new(
        "http://127.0.0.1:8188".parse().unwrap(),
        MonotonicClock::new(),
    ))
    .unwrap()
}

fn inspect(a: &ComfyUiAdapter, entry: u128, body: &str) -> InspectResult {
    let RouteClass::Work(route) = a.classify(&Method::POST, "/prompt") else {
        panic!("POST /prompt is not work");
    };
    let headers = http::HeaderMap::new();
    let ctx = InspectContext {
        entry: EntryId::from_u128(entry),
        method: &Method::POST,
        path: "/prompt",
        headers: &headers,
    };
    a.inspect(&route, ctx, body.as_bytes())
}

#[test]
fn submissions_are_tracked_work_and_the_table_classifies_every_route() {
    // COMFY-01, ROUTE-08, ROUTE-12
    let a = adapter();
    for path in ["/prompt", "/api/prompt"] {
        assert_eq!(a.classify(&Method::POST, path), SUBMIT, "{path}");
    }
    for path in [
        "/object_info",
        "/object_info/EmptyImage",
        "/api/object_info",
        "/system_stats",
        "/api/system_stats",
        "/embeddings",
        "/extensions",
        "/features",
        "/api/features",
        "/ws",
        "/ws?clientId=abc",
        "/api/ws",
    ] {
        assert_eq!(
            a.classify(&Method::GET, path),
            RouteClass::Discovery,
            "{path}"
        );
    }
    for (method, path) in [
        (Method::GET, "/queue"),
        (Method::POST, "/queue"),
        (Method::POST, "/interrupt"),
        (Method::POST, "/free"),
        (Method::GET, "/history"),
        (Method::GET, "/history?max_items=2"),
        (Method::POST, "/history"),
        (Method::GET, "/prompt"),
        (Method::POST, "/api/free"),
    ] {
        assert_eq!(
            a.classify(&method, path),
            RouteClass::Management,
            "{method} {path}"
        );
    }
    for (method, path) in [
        (Method::POST, "/upload/image"),
        (Method::GET, "/userdata/x"),
        (Method::GET, "/settings"),
        (Method::GET, "/models/checkpoints"),
        (Method::GET, "/internal/logs"),
    ] {
        let class = a.classify(&method, path);
        assert!(
            matches!(
                route_policy(class, &method, Management::Deny),
                RoutePolicy::Refuse(_)
            ),
            "{method} {path}"
        );
    }
    assert_eq!(a.name(), "comfyui");
}

#[test]
fn history_reads_only_for_prompts_admitted_through_vacancy() {
    // The borrower reads its own prompts; another prompt's history is the owner's.
    let a = adapter();
    let mine = EntryId::from_u128(7).to_string();
    assert_eq!(
        a.classify(&Method::GET, &format!("/history/{mine}")),
        RouteClass::Management,
        "not admitted yet"
    );
    inspect(&a, 7, r#"{"prompt": {}}"#).unwrap();
    for path in [format!("/history/{mine}"), format!("/api/history/{mine}")] {
        assert_eq!(
            a.classify(&Method::GET, &path),
            RouteClass::BorrowerRead,
            "{path}"
        );
    }
    assert_eq!(
        a.classify(&Method::GET, "/history/someone-elses-prompt"),
        RouteClass::Management
    );
    // An early release's own ID, recorded by tracking (REC-04), is readable too.
    a.remember("7e2ca66c-997f-424b-8a66-5157d3ca4a53");
    assert_eq!(
        a.classify(
            &Method::GET,
            "/history/7e2ca66c-997f-424b-8a66-5157d3ca4a53"
        ),
        RouteClass::BorrowerRead
    );
    assert!(matches!(
        route_policy(RouteClass::Management, &Method::GET, Management::Deny),
        RoutePolicy::Refuse(RefusalCode::RouteForbidden)
    ));
}

#[test]
fn view_serves_only_files_listed_in_a_borrowed_prompts_outputs() {
    let a = adapter();
    inspect(&a, 9, r#"{"prompt": {}}"#).unwrap();
    let id = EntryId::from_u128(9).to_string();
    let path = "/view?filename=ci_simple_00001_.png&subfolder=&type=output";
    assert_eq!(
        a.classify(&Method::GET, path),
        RouteClass::Management,
        "no outputs yet"
    );
    a.record_outputs(
        &id,
        vec![OutputFile {
            filename: "ci_simple_00001_.png".into(),
            subfolder: String::new(),
            kind: "output".into(),
        }],
    );
    assert_eq!(a.classify(&Method::GET, path), RouteClass::BorrowerRead);
    assert_eq!(
        a.classify(
            &Method::GET,
            "/api/view?type=output&filename=ci_simple_00001_.png&preview=webp%3B90"
        ),
        RouteClass::BorrowerRead
    );
    for other in [
        "/view?filename=owners_00001_.png&type=output",
        "/view?filename=ci_simple_00001_.png&subfolder=private&type=output",
        "/view?filename=ci_simple_00001_.png&type=input",
        "/view?filename=..%2Fci_simple_00001_.png&type=output",
        "/view?filename=ci_simple_00001_.png&type=output&extra=1",
        "/view",
        "/view?filename=%zz",
    ] {
        assert_eq!(
            a.classify(&Method::GET, other),
            RouteClass::Management,
            "{other}"
        );
    }
    // Outputs for a prompt vacancy never admitted are ignored.
    a.record_outputs(
        "foreign",
        vec![OutputFile {
            filename: "owners_00001_.png".into(),
            subfolder: String::new(),
            kind: "output".into(),
        }],
    );
    assert_eq!(
        a.classify(&Method::GET, "/view?filename=owners_00001_.png&type=output"),
        RouteClass::Management
    );
}

#[test]
fn a_submission_gets_vacancys_prompt_id_and_is_recorded() {
    // COMFY-03, COMFY-04, COMFY-05, RES-18
    let a = adapter();
    let i = inspect(
        &a,
        42,
        r#"{"prompt": {"1": {"class_type": "EmptyImage"}}, "prompt_id": "theirs"}"#,
    )
    .unwrap();
    let id = EntryId::from_u128(42).to_string();
    assert_eq!(i.upstream_ref.as_deref(), Some(id.as_str()));
    assert_eq!(i.model, None);
    assert!(matches!(i.reuse, RequestReuse::Cannot(_)));
    let body: Value = serde_json::from_slice(&i.rewritten_body.unwrap()).unwrap();
    assert_eq!(body["prompt_id"], id.as_str());
    assert_eq!(body["prompt"]["1"]["class_type"], "EmptyImage");
}

#[test]
fn a_body_that_is_not_an_object_is_an_invalid_submission() {
    // COMFY-07: refused before anything is reserved.
    let a = adapter();
    for body in ["[]", "\"x\"", "3", "null", "", "not json"] {
        let e = inspect(&a, 1, body).unwrap_err();
        assert_eq!(e.code, RefusalCode::InvalidSubmission, "{body}");
        assert_eq!(e.to_refusal().code.http_status(), 400);
    }
    assert!(!a.is_borrowed(&EntryId::from_u128(1).to_string()));
}

#[test]
fn refusals_speak_comfyuis_error_shape() {
    let r = adapter().render_refusal(&Refusal::new(RefusalCode::ResourceBusy, "gpu0 is reserved"));
    assert_eq!(r.status, http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers.get(http::header::RETRY_AFTER).unwrap(), "2");
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["error"]["type"], "resource_busy");
    assert_eq!(body["error"]["code"], "resource_busy");
    assert_eq!(body["error"]["message"], "gpu0 is reserved");
    assert_eq!(body["node_errors"], json!({}));
}

#[test]
fn the_refusal_body_is_the_bytes_json_wrote() {
    // ADM-02: written straight from its fields (issue 31), byte for byte
    // what the `json!` value wrote, whatever the reason holds.
    for reason in ["gpu0 is reserved", "a \"quoted\" \\ path\n\u{1}", "模型 🚀"] {
        let refusal = Refusal::new(RefusalCode::ResourceBusy, reason);
        let code = refusal.code.as_str();
        let expected = json!({
            "error": {"type": code, "code": code, "message": reason, "details": "", "extra_info": {}},
            "node_errors": {}
        });
        assert_eq!(
            render_comfyui(&refusal).body,
            expected.to_string().into_bytes(),
            "{reason:?}"
        );
    }
}

#[test]
fn remembered_prompts_are_bounded() {
    let a = adapter();
    for i in 0..(REMEMBERED_PROMPTS + 3) {
        a.remember(&format!("p{i}"));
    }
    assert!(!a.is_borrowed("p0"));
    assert!(a.is_borrowed(&format!("p{}", REMEMBERED_PROMPTS + 2)));
}

#[test]
fn the_allocators_unused_memory_is_read_from_a_gpu_device_only() {
    // RES-17: torch_vram_free is the allocator's unused memory on a GPU.
    let cuda = json!({"system": {}, "devices": [{"name": "cuda:0 NVIDIA", "type": "cuda", "index": 0,
        "vram_total": 25_769_803_776_u64, "vram_free": 2_147_483_648_u64,
        "torch_vram_total": 8_589_934_592_u64, "torch_vram_free": 3_221_225_472_u64}]});
    assert_eq!(allocator_free_mib(&cuda), Some(3072));
    // The recorded CPU servers report RAM there: no credit.
    let cpu = json!({"system": {}, "devices": [{"name": "cpu", "type": "cpu", "index": null,
        "vram_total": 25_276_059_648_u64, "vram_free": 23_994_695_680_u64,
        "torch_vram_total": 25_276_059_648_u64, "torch_vram_free": 23_994_695_680_u64}]});
    assert_eq!(allocator_free_mib(&cpu), None);
    assert_eq!(allocator_free_mib(&json!({"devices": []})), None);
    assert_eq!(allocator_free_mib(&json!({})), None);
}

/// A local HTTP server answering every request with `body` as JSON.
async fn serve_json(body: String) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(reply.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (addr, task)
}

#[tokio::test]
async fn the_trackers_history_read_records_a_borrowed_prompts_output_files() {
    // The real 0.3.75 reply of a finished prompt, under vacancy's ID, beside
    // an entry of the owner's.
    let id = EntryId::from_u128(77).to_string();
    let real = include_str!("../../tests/fixtures/comfyui/history_completed.json")
        .trim_end()
        .replace("200495ec-9a62-49c8-8775-cb835cc250dd", &id);
    let body = format!(
        r#"{}, "owners": {{"outputs": {{"1": {{"images": [{{"filename": "owner_00001_.png", "subfolder": "", "type": "output"}}]}}}}, "status": {{"status_str": "success", "completed": true}}}}}}"#,
        real.strip_suffix('}').unwrap()
    );
    let (addr, server) = serve_json(body).await;
    let a = ComfyUiAdapter::new(AdapterSettings::new(
        format!("http://{addr}").parse().unwrap(),
        MonotonicClock::new(),
    ))
    .unwrap();
    inspect(&a, 77, r#"{"prompt": {}}"#).unwrap();
    let view = "/view?filename=ci_slowC_00002_.png&subfolder=&type=output";
    assert_eq!(a.classify(&Method::GET, view), RouteClass::Management);

    let tracker = ComfyTracker(Arc::clone(&a.shared));
    let h = tracker.history(&id).await.unwrap();
    assert!(matches!(h, History::Finished { success: true }), "{h:?}");
    assert_eq!(a.classify(&Method::GET, view), RouteClass::BorrowerRead);
    assert_eq!(
        a.classify(
            &Method::GET,
            "/api/view?filename=ci_slowC_00001_.png&type=output"
        ),
        RouteClass::BorrowerRead
    );

    // The owner's prompt was never admitted: reading its history records nothing.
    let h = tracker.history("owners").await.unwrap();
    assert!(matches!(h, History::Finished { success: true }), "{h:?}");
    assert_eq!(
        a.classify(&Method::GET, "/view?filename=owner_00001_.png&type=output"),
        RouteClass::Management
    );
    server.abort();
}

#[tokio::test(flavor = "current_thread")]
async fn a_replaced_prompt_id_is_answered_with_the_id_to_use() {
    // COMFY-05 with issue 14 item 7: the ID a borrower set is remembered with
    // its prompt, and a read under it names the ID the prompt is queued as.
    let a = adapter();
    let queued = EntryId::from_u128(9).to_string();
    inspect(&a, 9, r#"{"prompt": {}, "prompt_id": "my own id"}"#).unwrap();
    for path in [
        "/history/my%20own%20id",
        "/api/history/my%20own%20id",
        "/api/jobs/my%20own%20id",
        "/api/jobs/my%20own%20id/cancel",
    ] {
        let Reconsidered::Refuse(refusal) = a.reconsider_refusal(&Method::GET, path).await else {
            panic!("{path} is not refused with the ID to use");
        };
        assert_eq!(refusal.code, RefusalCode::RouteForbidden, "{path}");
        assert!(
            refusal.reason.contains("\"my own id\""),
            "{}",
            refusal.reason
        );
        assert!(
            refusal.reason.contains(&format!("GET /history/{queued}")),
            "{}",
            refusal.reason
        );
    }
    // Any other refused read stands as it was.
    assert_eq!(
        a.reconsider_refusal(&Method::GET, "/history/another-id")
            .await,
        Reconsidered::Stands
    );
    assert_eq!(
        a.reconsider_refusal(&Method::GET, "/queue").await,
        Reconsidered::Stands
    );
    // An early release's own ID (REC-04) becomes the one to use.
    {
        let mut borrowed = lock(&a.shared.borrowed);
        borrowed.remember("their-own");
        borrowed.moved(&queued, "their-own");
    }
    let Reconsidered::Refuse(refusal) = a
        .reconsider_refusal(&Method::GET, "/history/my%20own%20id")
        .await
    else {
        panic!("not refused");
    };
    assert!(
        refusal.reason.contains("GET /history/their-own"),
        "{}",
        refusal.reason
    );
}

#[test]
fn a_requested_id_is_forgotten_with_its_prompt() {
    // Issue 14 item 7: bounded like the prompts it belongs to.
    let mut b = Borrowed::default();
    b.remember("first");
    b.remember_requested("asked-first", "first");
    b.remember_requested("unknown-prompt", "never-admitted");
    assert_eq!(b.requested.len(), 1);
    for n in 0..REMEMBERED_PROMPTS {
        b.remember(&format!("p{n}"));
    }
    assert!(b.requested.is_empty(), "{:?}", b.requested);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_view_refresh_against_a_silent_comfyui_gives_up_within_its_bound() {
    // Issue 14 item 6: the history reads a refused /view makes are bounded
    // as a whole, so a hung ComfyUI never holds the borrower's request for
    // the reads' own limits (60 s to the first byte each).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket); // accepted, never answered
        }
    });
    let a = ComfyUiAdapter::new(AdapterSettings::new(
        format!("http://{addr}").parse().unwrap(),
        MonotonicClock::new(),
    ))
    .unwrap();
    inspect(&a, 11, r#"{"prompt": {}}"#).unwrap();
    lock(&a.shared.following).push(EntryId::from_u128(11).to_string());
    let started = tokio::time::Instant::now();
    let answer = a
        .reconsider_refusal(&Method::GET, "/view?filename=x.png&type=output")
        .await;
    assert_eq!(answer, Reconsidered::Stands);
    let waited = started.elapsed();
    assert!(
        waited >= VIEW_REFRESH_WITHIN
            && waited < VIEW_REFRESH_WITHIN + std::time::Duration::from_secs(1),
        "{waited:?}"
    );
}
