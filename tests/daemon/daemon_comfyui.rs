//! vacancyd end to end in front of REAL ComfyUI servers (PyPI wheels that
//! vendor ComfyUI 0.3.75 and an early-2024 release that ignores a client
//! `prompt_id`): prompt IDs assigned and replaced (COMFY-03..06), tracked
//! completion by history (COMFY-01, COMFY-13, COMFY-16), the queue-absence
//! release after a restart lost the prompt (COMFY-14), validation
//! rejections (COMFY-28), bad bodies (COMFY-07), work vacancy did not admit
//! (ADM-09, COMFY-36), borrower reads of their own prompts only, and the
//! early release's own ID recorded in the ledger (REC-04).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Daemon, EVENT_BOUND};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vacancy_test_support::{
    ComfyFlavor, ComfyUi, PROMPT_BOUND, http_request, prompt_request, simple_workflow,
    slow_workflow,
};

const JSON: (&str, &str) = ("content-type", "application/json");

fn config(dir: &Path, control: u16, proxy: u16, target: &str) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:{control}"

[owner]
presence = "none"

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "{capacity}"
reserve_mib = 1000
poll_ms = 1000
max_sample_age_ms = 120000

[[upstream]]
name = "comfy"
adapter = "comfyui"
listen = "127.0.0.1:{proxy}"
target = "{target}"
resource = "gpu0"
default_min_free_mib = 4000
completion_timeout_s = 600
"#,
        capacity = dir.join("gpu0.json").display(),
    )
}

fn start(comfy: &ComfyUi) -> Daemon {
    let (dir, path, control, proxy) = prepare(comfy);
    Daemon::start_with(dir, &path, control, proxy)
}

fn prepare(comfy: &ComfyUi) -> (tempfile::TempDir, std::path::PathBuf, u16, u16) {
    common::prepare(20_000, |dir, control, proxy| {
        config(dir, control, proxy, &comfy.base_url())
    })
}

async fn post_json(url: &str, body: &Value) -> (u16, Value, String) {
    let r = http_request("POST", url, &[JSON], body.to_string().into_bytes())
        .await
        .unwrap();
    let text = r.text();
    (r.status, r.json().unwrap_or(Value::Null), text)
}

async fn get_json(url: &str) -> (u16, Value) {
    let r = http_request("GET", url, &[], Vec::new()).await.unwrap();
    (r.status, r.json().unwrap_or(Value::Null))
}

/// Wait until the daemon holds no work, or panic after `within`.
async fn released(d: &Daemon, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let s = d.status().await;
        if s["work"].as_array().is_some_and(Vec::is_empty) {
            return s;
        }
        assert!(Instant::now() < deadline, "still held: {s:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Wait until the upstream is observed reachable.
async fn observed(d: &Daemon) {
    d.wait_status("the upstream to be observed", |s| {
        s["upstreams"][0]["reachable"] == true
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_gets_vacancys_id_is_tracked_and_released_by_its_history() {
    // COMFY-01, COMFY-03..06, COMFY-13, COMFY-16 on ComfyUI 0.3.75.
    let comfy = ComfyUi::start(ComfyFlavor::V0_3_75).unwrap();
    let d = start(&comfy);
    observed(&d).await;
    let (status, reply, text) = post_json(
        &format!("{}/prompt", d.proxy),
        &prompt_request(slow_workflow(0x10_2030), Some("theirs")),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let id = reply["prompt_id"].as_str().unwrap().to_owned();
    assert_ne!(id, "theirs", "a borrower's prompt_id is replaced");
    assert!(uuid::Uuid::parse_str(&id).is_ok(), "{id}");
    // COMFY-01: the reply released nothing; the work is tracked.
    let s = d
        .wait_status("the prompt to be tracked", |s| {
            s["work"][0]["phase"] == "tracking"
        })
        .await;
    assert_eq!(s["work"][0]["completion"], "tracked");
    // ComfyUI queued it under vacancy's ID.
    let (_, queue) = get_json(&format!("{}/queue", comfy.base_url())).await;
    let queued: Vec<&str> = queue["queue_running"]
        .as_array()
        .into_iter()
        .chain(queue["queue_pending"].as_array())
        .flatten()
        .filter_map(|item| item[1].as_str())
        .collect();
    assert_eq!(queued, [id.as_str()]);
    // A second borrowed prompt meanwhile is refused: one job per resource.
    let (busy, body, text) = post_json(
        &format!("{}/prompt", d.proxy),
        &prompt_request(simple_workflow(1), None),
    )
    .await;
    assert_eq!(busy, 503, "{text}");
    assert_eq!(body["error"]["type"], "resource_busy");
    // Released once the history shows it finished.
    released(&d, PROMPT_BOUND).await;
    let (status, history) = get_json(&format!("{}/history/{id}", d.proxy)).await;
    assert_eq!(status, 200, "the borrower reads its own prompt's history");
    assert_eq!(history[&id]["status"]["status_str"], "success");
    let log = d.process.log();
    assert!(
        log.contains("ComfyUI's history shows the prompt succeeded"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_release_is_followed_under_its_own_id_recorded_in_the_ledger() {
    // COMFY-06, REC-04 on the early-2024 ComfyUI that ignores prompt_id.
    let comfy = ComfyUi::start(ComfyFlavor::Hordelib2_8_1).unwrap();
    let d = start(&comfy);
    observed(&d).await;
    let (status, reply, text) = post_json(
        &format!("{}/prompt", d.proxy),
        &prompt_request(simple_workflow(0x20_3040), None),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let own = reply["prompt_id"].as_str().unwrap().to_owned();
    released(&d, Duration::from_secs(60)).await;
    // The record was rewritten with ComfyUI's own ID before it was followed.
    let journal = std::fs::read_to_string(
        d.dir
            .path()
            .join("vacancyd.admission")
            .join("journal.jsonl"),
    )
    .unwrap_or_default();
    assert!(
        journal
            .lines()
            .any(|l| l.contains("\"op\":\"ref\"") && l.contains(&own)),
        "{journal}"
    );
    let (status, history) = get_json(&format!("{}/history/{own}", d.proxy)).await;
    assert_eq!(status, 200);
    assert!(history.get(&own).is_some(), "{history}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_bad_bodies_foreign_prompts_and_lost_history() {
    // COMFY-07, COMFY-28, ADM-09/COMFY-36, COMFY-14, ROUTE-08 on 0.3.75.
    let mut comfy = ComfyUi::start(ComfyFlavor::V0_3_75).unwrap();
    let d = start(&comfy);
    observed(&d).await;
    let url = format!("{}/prompt", d.proxy);

    // COMFY-07: not an object → 400 invalid_submission, nothing forwarded.
    for body in ["[]", "\"x\"", "not json"] {
        let r = http_request("POST", &url, &[JSON], body.as_bytes().to_vec())
            .await
            .unwrap();
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json().unwrap()["error"]["type"], "invalid_submission");
    }

    // COMFY-28: a validation rejection releases at once.
    let bad = json!({"prompt": {"1": {"class_type": "NoSuchNode", "inputs": {}}}});
    let (status, body, text) = post_json(&url, &bad).await;
    assert_eq!(status, 400, "{text}");
    assert_eq!(body["error"]["type"], "invalid_prompt");
    released(&d, EVENT_BOUND).await;

    // Management and other prompts' history are the owner's.
    for path in ["/queue", "/history", "/history/not-ours"] {
        let (status, _) = get_json(&format!("{}{path}", d.proxy)).await;
        assert_eq!(status, 403, "{path}");
    }

    // ADM-09: a prompt the owner queued directly refuses borrowed work.
    let (status, direct, _) = post_json(
        &format!("{}/prompt", comfy.base_url()),
        &prompt_request(slow_workflow(0x30_4050), None),
    )
    .await;
    assert_eq!(status, 200);
    let direct_id = direct["prompt_id"].as_str().unwrap().to_owned();
    d.wait_status("the owner's prompt to be observed", |s| {
        s["upstreams"][0]["vacancy"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("vacancy did not admit"))
    })
    .await;
    let (status, refusal, text) = post_json(&url, &prompt_request(simple_workflow(2), None)).await;
    assert_eq!(status, 503, "{text}");
    assert_eq!(refusal["error"]["type"], "resource_busy");
    assert!(
        refusal["error"]["message"]
            .as_str()
            .unwrap()
            .contains("vacancy did not admit"),
        "{refusal}"
    );
    let (status, _) = get_json(&format!("{}/history/{direct_id}", d.proxy)).await;
    assert_eq!(
        status, 403,
        "the owner's prompt is not the borrower's to read"
    );
    // Let the owner's prompt go.
    let r = http_request(
        "POST",
        &format!("{}/interrupt", comfy.base_url()),
        &[],
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    // The interrupt lands at the next node: seconds on a busy machine.
    d.wait_status_within("the owner's work to end", PROMPT_BOUND, |s| {
        s["upstreams"][0]["vacancy"]["admitting"] == true
    })
    .await;

    // COMFY-14: a restart loses the running prompt; two absent checks release it.
    let (status, reply, text) =
        post_json(&url, &prompt_request(slow_workflow(0x40_5060), None)).await;
    assert_eq!(status, 200, "{text}");
    let id = reply["prompt_id"].as_str().unwrap().to_owned();
    // Restart once ComfyUI runs it and vacancyd tracks it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, queue) = get_json(&format!("{}/queue", comfy.base_url())).await;
        let running = queue["queue_running"]
            .as_array()
            .is_some_and(|r| r.iter().any(|item| item[1] == id.as_str()));
        if running {
            break;
        }
        assert!(Instant::now() < deadline, "never ran: {queue}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    d.wait_status("the prompt tracked", |s| {
        s["work"].as_array().is_some_and(|w| w.len() == 1)
    })
    .await;
    comfy.restart().unwrap();
    let s = released(&d, Duration::from_secs(60)).await;
    assert!(s["work"].as_array().unwrap().is_empty());
    let log = d.process.log();
    assert!(
        log.contains("two consecutive checks found the acknowledged prompt"),
        "{log}"
    );
    let (_, history) = get_json(&format!("{}/history/{id}", comfy.base_url())).await;
    assert_eq!(
        history,
        json!({}),
        "the restart lost it: it never ran to its end"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_borrower_who_leaves_after_submitting_leaves_the_prompt_tracked() {
    // COMFY-02, COMFY-08 on the early-2024 release.
    let comfy = ComfyUi::start(ComfyFlavor::Hordelib2_8_1).unwrap();
    let d = start(&comfy);
    observed(&d).await;
    let body = prompt_request(slow_workflow(0x50_6070), None).to_string();
    {
        let addr = d.proxy.trim_start_matches("http://").to_owned();
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /prompt HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(body.as_bytes()).await.unwrap();
        let mut first = [0u8; 1];
        // Wait for the reply to start, then leave without reading it.
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read(&mut first)).await;
    }
    let s = d
        .wait_status("the prompt to be tracked", |s| {
            s["work"][0]["phase"] == "tracking"
        })
        .await;
    assert_eq!(s["work"].as_array().unwrap().len(), 1);
    released(&d, PROMPT_BOUND).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_tracking_never_forgets_the_prompt() {
    // REC-01..03 with REC-04: kill -9 while a prompt of the early release
    // runs under its own ID; the restarted daemon holds it with that ID.
    let comfy = ComfyUi::start(ComfyFlavor::Hordelib2_8_1).unwrap();
    let (dir, path, control, proxy) = prepare(&comfy);
    let d = Daemon::start_with(dir, &path, control, proxy);
    observed(&d).await;
    let (status, reply, text) = post_json(
        &format!("{}/prompt", d.proxy),
        &prompt_request(slow_workflow(0x60_7080), None),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let own = reply["prompt_id"].as_str().unwrap().to_owned();
    d.wait_status("the prompt to be tracked under ComfyUI's ID", |s| {
        s["work"][0]["phase"] == "tracking" && s["work"][0]["upstream_ref"] == own.as_str()
    })
    .await;
    let Daemon {
        mut process, dir, ..
    } = d;
    process.kill().unwrap();
    drop(process);
    let d = Daemon::start_with(dir, &path, control, proxy);
    let s = d.status().await;
    let work = s["work"].as_array().unwrap();
    assert_eq!(work.len(), 1, "{s:#}");
    assert_eq!(work[0]["phase"], "held");
    assert_eq!(work[0]["completion"], "tracked");
    assert_eq!(
        work[0]["upstream_ref"],
        own.as_str(),
        "REC-03: the prompt can be found"
    );
    // Held work keeps the GPU: a new borrowed prompt is refused.
    let (busy, body, text) = post_json(
        &format!("{}/prompt", d.proxy),
        &prompt_request(simple_workflow(3), None),
    )
    .await;
    assert_eq!(busy, 503, "{text}");
    assert_eq!(body["error"]["type"], "resource_busy");
}

/// The first output file a history entry lists: (filename, subfolder, type).
fn first_output(entry: &Value) -> (String, String, String) {
    let image = entry["outputs"]
        .as_object()
        .into_iter()
        .flat_map(|nodes| nodes.values())
        .filter_map(|node| node["images"].as_array())
        .flatten()
        .next()
        .unwrap_or_else(|| panic!("no output image in {entry:#}"));
    let text = |k: &str| image[k].as_str().unwrap_or_default().to_owned();
    (text("filename"), text("subfolder"), text("type"))
}

/// `%XX`-encodes everything but unreserved characters, for a query value.
fn query_value(v: &str) -> String {
    v.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn view_path(filename: &str, subfolder: &str, kind: &str) -> String {
    format!(
        "/view?filename={}&subfolder={}&type={}",
        query_value(filename),
        query_value(subfolder),
        query_value(kind)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_borrower_views_its_prompts_output_files_and_nothing_else() {
    // GET /view on 0.3.75: the files a borrowed prompt's history lists,
    // recorded by tracking; the owner's files and path tricks are refused.
    let comfy = ComfyUi::start(ComfyFlavor::V0_3_75).unwrap();
    let d = start(&comfy);
    observed(&d).await;
    let (status, reply, text) = post_json(
        &format!("{}/prompt", d.proxy),
        &prompt_request(simple_workflow(0x60_7080), None),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let id = reply["prompt_id"].as_str().unwrap().to_owned();
    released(&d, Duration::from_secs(60)).await;
    let (status, history) = get_json(&format!("{}/history/{id}", d.proxy)).await;
    assert_eq!(status, 200);
    let (filename, subfolder, kind) = first_output(&history[&id]);
    assert_eq!(kind, "output");
    let on_disk = std::fs::read(comfy.output_dir().join(&subfolder).join(&filename)).unwrap();
    for prefix in ["", "/api"] {
        let url = format!(
            "{}{prefix}{}",
            d.proxy,
            view_path(&filename, &subfolder, &kind)
        );
        let r = http_request("GET", &url, &[], Vec::new()).await.unwrap();
        assert_eq!(r.status, 200, "{url}: {}", r.text());
        assert_eq!(
            r.headers.get("content-type").and_then(|v| v.to_str().ok()),
            Some("image/png"),
            "{url}"
        );
        assert_eq!(r.body.as_ref(), on_disk.as_slice(), "{url}");
    }

    // A file of the owner's: a prompt queued directly, never through vacancy.
    let (status, direct, text) = post_json(
        &format!("{}/prompt", comfy.base_url()),
        &prompt_request(simple_workflow(0x70_8090), None),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let direct_id = direct["prompt_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    let owners = loop {
        let (_, h) = get_json(&format!("{}/history/{direct_id}", comfy.base_url())).await;
        if h[&direct_id]["status"]["completed"] == true {
            break h;
        }
        assert!(
            Instant::now() < deadline,
            "the owner's prompt never ran: {h}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (owner_file, owner_sub, owner_kind) = first_output(&owners[&direct_id]);
    assert_ne!(owner_file, filename);
    assert!(
        comfy
            .output_dir()
            .join(&owner_sub)
            .join(&owner_file)
            .is_file()
    );
    let forbidden = [
        view_path(&owner_file, &owner_sub, &owner_kind),
        format!("/api{}", view_path(&owner_file, &owner_sub, &owner_kind)),
        // Path tricks around the borrower's own file.
        view_path(&format!("../output/{filename}"), &subfolder, &kind),
        view_path(&format!("..%2F{filename}"), &subfolder, &kind),
        view_path(&filename, "..", &kind),
        view_path(&filename, &subfolder, "input"),
        "/view?filename=../../../../etc/passwd&type=output".to_owned(),
        format!("{}&subfolder=..", view_path(&filename, &subfolder, &kind)),
    ];
    for path in forbidden {
        let r = http_request("GET", &format!("{}{path}", d.proxy), &[], Vec::new())
            .await
            .unwrap();
        assert_eq!(r.status, 403, "{path}: {}", r.text());
        assert_eq!(
            r.json().unwrap()["error"]["type"],
            "route_forbidden",
            "{path}"
        );
    }
}

/// The SHA-256 of a file, hex, as the client script reports a body's.
fn sha256_hex(path: &Path) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(std::fs::read(path).unwrap());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn comfyuis_own_websocket_client_runs_end_to_end_through_vacancyd() {
    // Issue 14 item 5 (with items 6 and 7) on ComfyUI 0.3.75: the flow of
    // ComfyUI's script_examples/websockets_api_example.py with websocket-client,
    // which sends Origin: http://<vacancyd's listener>. vacancyd rewrites it to
    // the target's as it does Host; ComfyUI answered 403 to the /ws handshake
    // before. A foreign origin is forwarded as it came (ComfyUI still refuses it).
    let comfy = ComfyUi::start(ComfyFlavor::V0_3_75).unwrap();
    let d = start(&comfy);
    observed(&d).await;
    let server = d.proxy.trim_start_matches("http://").to_owned();
    let asked = uuid::Uuid::new_v4().to_string();
    let workflow = slow_workflow(0x80_90a0);
    let report = {
        let (server, asked) = (server.clone(), asked.clone());
        tokio::task::spawn_blocking(move || {
            vacancy_test_support::comfy_ws_client(&server, &workflow, &asked)
        })
        .await
        .unwrap()
        .unwrap()
    };
    assert!(report.get("error").is_none(), "{report:#}");
    assert_eq!(report["ws_opened"], true, "{report:#}");
    let id = report["prompt_id"].as_str().unwrap().to_owned();
    assert_ne!(
        id, asked,
        "COMFY-05: the client's own prompt_id is replaced"
    );
    let events: Vec<&str> = report["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for want in ["execution_start", "executing", "executed"] {
        assert!(events.contains(&want), "no {want} for {id}: {events:?}");
    }
    assert_eq!(report["status_str"], "success", "{report:#}");
    let images = report["images"].as_array().unwrap();
    assert!(!images.is_empty(), "{report:#}");
    for image in images {
        assert_eq!(image["status"], 200, "GET /view: {image}");
        let file = comfy
            .output_dir()
            .join(image["subfolder"].as_str().unwrap())
            .join(image["filename"].as_str().unwrap());
        assert_eq!(image["sha256"], sha256_hex(&file).as_str(), "{image}");
    }
    // Item 7: the client's own ID is answered with the one to use.
    assert_eq!(report["asked_history"]["status"], 403, "{report:#}");
    let body: Value =
        serde_json::from_str(report["asked_history"]["body"].as_str().unwrap()).unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&asked) && message.contains(&format!("GET /history/{id}")),
        "{message}"
    );
    assert_eq!(
        report["foreign_origin_ws"], 403,
        "another site's Origin is not rewritten: {report:#}"
    );
    released(&d, EVENT_BOUND).await;
    let log = comfy.process().log();
    assert!(
        !log.contains(&format!("http://{server} != ")) && !log.contains(&format!("!= {server}")),
        "ComfyUI refused vacancyd's own origin: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_borrowers_output_is_viewable_the_moment_its_history_lists_it() {
    // Issue 14 item 6 on ComfyUI 0.3.75: GET /view of a file that the
    // borrowed prompt's history already lists, before the tracker's next
    // history read (every 5 s), reads that history instead of refusing.
    let comfy = ComfyUi::start(ComfyFlavor::V0_3_75).unwrap();
    let d = start(&comfy);
    observed(&d).await;
    for attempt in 0..3u32 {
        let (status, reply, text) = post_json(
            &format!("{}/prompt", d.proxy),
            &prompt_request(slow_workflow(0x90_a0b0 + attempt), None),
        )
        .await;
        assert_eq!(status, 200, "{text}");
        let id = reply["prompt_id"].as_str().unwrap().to_owned();
        // Watch ComfyUI itself for the history entry.
        let deadline = Instant::now() + PROMPT_BOUND;
        let entry = loop {
            let (_, h) = get_json(&format!("{}/history/{id}", comfy.base_url())).await;
            if h[&id]["status"]["completed"] == true {
                break h[&id].clone();
            }
            assert!(Instant::now() < deadline, "the prompt never finished: {h}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let (filename, subfolder, kind) = first_output(&entry);
        let tracked_still = d.status().await["work"]
            .as_array()
            .is_some_and(|w| !w.is_empty());
        let url = format!("{}{}", d.proxy, view_path(&filename, &subfolder, &kind));
        let r = http_request("GET", &url, &[], Vec::new()).await.unwrap();
        if !tracked_still {
            // The tracker read the history first; that proves nothing here.
            assert_eq!(r.status, 200, "{url}: {}", r.text());
            released(&d, EVENT_BOUND).await;
            continue;
        }
        assert_eq!(r.status, 200, "{url}: {}", r.text());
        let on_disk = std::fs::read(comfy.output_dir().join(&subfolder).join(&filename)).unwrap();
        assert_eq!(r.body.as_ref(), on_disk.as_slice());
        // The owner's files stay refused after such a read.
        let r = http_request(
            "GET",
            &format!("{}{}", d.proxy, view_path("not-listed.png", "", "output")),
            &[],
            Vec::new(),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 403, "{}", r.text());
        released(&d, EVENT_BOUND).await;
        return;
    }
    panic!("the tracker read the history before the borrower three times running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_borrower_asking_under_its_replaced_prompt_id_is_told_the_id_to_use() {
    // Issue 14 item 7 (COMFY-05 kept) on ComfyUI 0.3.75: GET /history/<the
    // ID the borrower set> names the ID vacancyd queued the prompt under.
    let comfy = ComfyUi::start(ComfyFlavor::V0_3_75).unwrap();
    let d = start(&comfy);
    observed(&d).await;
    let asked = "my-own-prompt-id";
    let (status, reply, text) = post_json(
        &format!("{}/prompt", d.proxy),
        &prompt_request(simple_workflow(0xa0_b0c0), Some(asked)),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let id = reply["prompt_id"].as_str().unwrap().to_owned();
    assert_ne!(id, asked);
    for path in [
        format!("/history/{asked}"),
        format!("/api/history/{asked}"),
        format!("/api/jobs/{asked}"),
    ] {
        let r = http_request("GET", &format!("{}{path}", d.proxy), &[], Vec::new())
            .await
            .unwrap();
        assert_eq!(r.status, 403, "{path}: {}", r.text());
        let body = r.json().unwrap();
        assert_eq!(body["error"]["type"], "route_forbidden", "{path}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(asked), "{path}: {message}");
        assert!(
            message.contains(&format!("GET /history/{id}")),
            "{path}: {message}"
        );
    }
    released(&d, EVENT_BOUND).await;
    let (status, history) = get_json(&format!("{}/history/{id}", d.proxy)).await;
    assert_eq!(status, 200);
    assert!(history.get(&id).is_some(), "{history}");
    // Another ID nobody set is refused as before.
    let r = http_request(
        "GET",
        &format!("{}/history/nobody-set-this", d.proxy),
        &[],
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 403);
    assert!(!r.text().contains(&id), "{}", r.text());
}
