//! The wait line (issue 22) end to end: vacancyd in front of a REAL
//! llama-server (xllamacpp, tiny GGUF) through the counting shim, whose
//! records are the oracle of what reached the upstream.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::{Daemon, JSON, Setup, completion};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use vacancy_test_support::{
    Browser, CountingShim, LlamaOptions, LlamaServer, Record, TinyModel, http_request, http_stream,
};

const TOKEN: &str = "owner-token-for-the-line";

fn busy_model() -> LlamaOptions {
    LlamaOptions {
        model: TinyModel {
            layers: 8,
            embd: 1024,
            seed: 1,
        },
        ..LlamaOptions::default()
    }
}

fn is_work(r: &Record) -> bool {
    r.method == "POST" && r.path.contains("completion")
}

/// vacancyd with manual presence (the owner away) and a line of `max_waiting`.
async fn lined(target: &str, max_waiting: u32) -> Daemon {
    let server = format!(
        "[[server.token]]\nname = \"desk\"\nscopes = [\"owner\"]\nsha256 = \"{}\"",
        vacancy::auth::hash_token(TOKEN)
    );
    // max_wait_s: the line's own bound is a test bound here. Beside two CPU
    // hogs the third of five borrowers waited out 120 s behind two 24-token
    // jobs (issue 30 item 14); 600 s is met by a loaded 2-core machine and
    // costs nothing when jobs are quick.
    let upstream = format!("[upstream.queue]\nmax_waiting = {max_waiting}\nmax_wait_s = 600");
    let d = Daemon::setup(Setup {
        target,
        server: &server,
        upstream: &upstream,
        presence: "manual",
        ..Setup::default()
    });
    presence(&d, false).await;
    d
}

async fn presence(d: &Daemon, present: bool) {
    let r = http_request(
        "POST",
        &format!("{}/admin/owner", d.control),
        &[
            JSON,
            ("authorization", &format!("Bearer {TOKEN}")),
            ("vacancy-intent", "presence"),
        ],
        json!({ "present": present }).to_string().into_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

fn waiting(status: &serde_json::Value) -> u64 {
    status["upstreams"][0]["line"]["waiting"]
        .as_u64()
        .unwrap_or(0)
}

/// Wait until `n` borrowers have arrived: admitted so far plus waiting now.
/// Admissions only grow and are read first, so a waiter admitted between the
/// two reads is missed (the next poll counts it), never counted twice.
async fn arrived(d: &Daemon, n: u64) {
    let deadline = Instant::now() + common::EVENT_BOUND;
    loop {
        let admitted = admissions(d).await;
        let waiting = waiting(&d.status().await);
        if admitted + waiting >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for borrower {n} to arrive: {admitted} admitted, {waiting} waiting"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn admitted_total(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("vacancyd_admissions_total{upstream=\"llama\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

async fn admissions(d: &Daemon) -> u64 {
    let m = http_request("GET", &format!("{}/metrics", d.control), &[], Vec::new())
        .await
        .unwrap()
        .text();
    admitted_total(&m)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_concurrent_borrowers_all_succeed_in_arrival_order_one_at_a_time() {
    // Issue 22 items 2-3, ADM-01, ADM-04..06: with the line on, busy
    // borrowers wait instead of getting 503, and are served in arrival order.
    let llama = LlamaServer::start(busy_model()).unwrap();
    let shim = CountingShim::start(llama.addr()).unwrap();
    let d = lined(&shim.base_url(), 8).await;
    let url = format!("{}/completion", d.proxy);
    let mut borrowers = Vec::new();
    for i in 0..5u64 {
        let url = url.clone();
        borrowers.push(tokio::spawn(async move {
            let r = http_request("POST", &url, &[JSON], completion(24, false))
                .await
                .unwrap();
            (i, r, Instant::now())
        }));
        // A clear arrival order: each joins after the one before has arrived
        // (admitted, or in line).
        arrived(&d, i + 1).await;
    }
    let mut finished = Vec::new();
    for b in borrowers {
        finished.push(b.await.unwrap());
    }
    for (i, r, _) in &finished {
        assert_eq!(r.status, 200, "borrower {i}: {}", r.text());
        if *i > 0 {
            let waited: u64 = r.headers["vacancy-waited-ms"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(waited > 0, "borrower {i} waited");
        }
    }
    let order: Vec<u64> = {
        let mut by_end = finished.clone();
        by_end.sort_by_key(|(_, _, at)| *at);
        by_end.iter().map(|(i, _, _)| *i).collect()
    };
    assert_eq!(order, vec![0, 1, 2, 3, 4], "served in arrival order");
    assert_eq!(shim.max_concurrency_where(is_work), 1, "never two at once");
    assert_eq!(shim.records().iter().filter(|r| is_work(r)).count(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_returning_answers_every_waiter_owner_present_at_once() {
    // Issue 22 item 4, OWN-01: the owner comes first.
    let llama = LlamaServer::start(busy_model()).unwrap();
    let shim = CountingShim::start(llama.addr()).unwrap();
    let d = lined(&shim.base_url(), 8).await;
    let url = format!("{}/completion", d.proxy);
    let mut long = serde_json::from_slice::<serde_json::Value>(&completion(100_000, true)).unwrap();
    long["ignore_eos"] = json!(true);
    let mut stream = http_stream("POST", &url, &[JSON], long.to_string().into_bytes())
        .await
        .unwrap();
    assert_eq!(stream.status, 200);
    stream.next_chunk().await.unwrap().unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                http_request("POST", &url, &[JSON], completion(4, false))
                    .await
                    .unwrap()
            })
        })
        .collect();
    d.wait_status("three waiters in line", |s| waiting(s) == 3)
        .await;
    // Item 5: the owner's console shows the line.
    {
        let mut b =
            Browser::start().expect("a headless Chromium (Debian chromium + chromium-driver)");
        b.get(&format!("{}/", d.control)).unwrap();
        b.wait_for(
            "[data-line='llama']",
            Some("3 waiting in line"),
            Duration::from_secs(20),
        )
        .unwrap_or_else(|e| panic!("the console shows the line: {e}"));
    }
    let returned = Instant::now();
    presence(&d, true).await;
    for w in waiters {
        let r = w.await.unwrap();
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(r.json().unwrap()["error"]["code"], "owner_present");
        assert!(r.headers.contains_key("vacancy-waited-ms"));
    }
    // At once: well under max_wait_s (600 s), with room for a loaded machine.
    assert!(
        returned.elapsed() < Duration::from_secs(30),
        "answered at once, not at max_wait_s ({:?})",
        returned.elapsed()
    );
    assert_eq!(
        shim.records().iter().filter(|r| is_work(r)).count(),
        1,
        "no waiter reached the upstream"
    );
    drop(stream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_who_disconnects_leaves_the_line_and_is_never_forwarded() {
    // Issue 22 item 4: leaving reserves nothing and forwards nothing.
    let llama = LlamaServer::start(busy_model()).unwrap();
    let shim = CountingShim::start(llama.addr()).unwrap();
    let d = lined(&shim.base_url(), 8).await;
    let url = format!("{}/completion", d.proxy);
    let job = {
        let url = url.clone();
        tokio::spawn(async move {
            http_request("POST", &url, &[JSON], completion(160, false))
                .await
                .unwrap()
        })
    };
    d.wait_status("the first job admitted", |s| {
        s["work"].as_array().is_some_and(|w| w.len() == 1)
    })
    .await;
    let addr = d.proxy.trim_start_matches("http://").to_owned();
    let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let body = completion(4, false);
    let head = format!(
        "POST /completion HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    sock.write_all(&body).await.unwrap();
    d.wait_status("the second borrower in line", |s| waiting(s) == 1)
        .await;
    drop(sock);
    d.wait_status("the line empty after the disconnect", |s| waiting(s) == 0)
        .await;
    let r = job.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    d.wait_status("the job released", |s| {
        s["work"].as_array().is_some_and(|w| w.is_empty())
    })
    .await;
    assert_eq!(
        shim.records().iter().filter(|r| is_work(r)).count(),
        1,
        "the waiter that left was never forwarded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vacancy_sign_says_queueing_while_a_new_request_would_wait() {
    // Issue 30 item 9, UI-01: with a job running and two borrowers in line,
    // a new request would wait behind them: /status, /health/upstreams,
    // `vacancyd status` and the console say `queueing (2 waiting)`, never
    // `admitting`.
    let llama = LlamaServer::start(busy_model()).unwrap();
    let shim = CountingShim::start(llama.addr()).unwrap();
    let d = lined(&shim.base_url(), 8).await;
    let url = format!("{}/completion", d.proxy);
    let mut long = serde_json::from_slice::<serde_json::Value>(&completion(100_000, true)).unwrap();
    long["ignore_eos"] = json!(true);
    let mut stream = http_stream("POST", &url, &[JSON], long.to_string().into_bytes())
        .await
        .unwrap();
    assert_eq!(stream.status, 200);
    stream.next_chunk().await.unwrap().unwrap();
    let s = d.status().await;
    assert_eq!(s["upstreams"][0]["vacancy"]["queueing"], 0, "{s}");
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                http_request("POST", &url, &[JSON], completion(4, false))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let s = d
        .wait_status("two waiters in line", |s| waiting(s) == 2)
        .await;
    let v = &s["upstreams"][0]["vacancy"];
    assert_eq!(v["admitting"], false, "{v}");
    assert_eq!(v["queueing"], 2, "{v}");
    assert_eq!(v["code"], "resource_busy", "{v}");
    let health = http_request(
        "GET",
        &format!("{}/health/upstreams/llama", d.control),
        &[],
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(health.status, 503, "{}", health.text());
    assert_eq!(health.json().unwrap()["queueing"], 2);
    let out = std::process::Command::new(vacancy_test_support::vacancyd())
        .args(["status", "--url", &d.control])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("queueing (2 waiting)"), "{text}");
    {
        let mut b =
            Browser::start().expect("a headless Chromium (Debian chromium + chromium-driver)");
        b.get(&format!("{}/", d.control)).unwrap();
        b.wait_for(
            "[data-sign='llama']",
            Some("queueing (2 waiting)"),
            Duration::from_secs(20),
        )
        .unwrap_or_else(|e| panic!("the console's sign says queueing: {e}"));
    }
    // The owner returns: the waiters are answered, the sign refuses.
    presence(&d, true).await;
    for w in waiters {
        assert_eq!(w.await.unwrap().status, 503);
    }
    let s = d.status().await;
    assert_eq!(s["upstreams"][0]["vacancy"]["code"], "owner_present", "{s}");
    assert!(s["upstreams"][0]["vacancy"]["queueing"].is_null(), "{s}");
    drop(stream);
}
