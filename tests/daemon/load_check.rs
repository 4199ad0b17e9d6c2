//! Load check (not a timed test): many concurrent borrowers against a REAL
//! llama-server through vacancyd and the counting shim. It asserts what must
//! hold under load — zero double admissions (ADM-01), every request answered
//! with 200 or 503, no leaked reservation — and prints the numbers it saw.
//!
//! Size: `VACANCY_LOAD_BORROWERS` × `VACANCY_LOAD_ROUNDS` (default 50 × 5;
//! the full check is 200 × 20).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::{Daemon, JSON};
use vacancy_test_support::{CountingShim, LlamaOptions, LlamaServer, http_request};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_borrowers_never_share_the_upstream() {
    let borrowers = env_or("VACANCY_LOAD_BORROWERS", 50);
    let rounds = env_or("VACANCY_LOAD_ROUNDS", 5);
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let shim = CountingShim::start(llama.addr()).unwrap();
    let d = Daemon::start(&shim.base_url(), 1000, 2000, 20_000, "");
    let url = format!("{}/completion", d.proxy);
    let body = serde_json::json!({"prompt": "hi", "n_predict": 8})
        .to_string()
        .into_bytes();

    let (mut ok, mut busy, mut other) = (0usize, 0usize, Vec::new());
    let mut latencies = Vec::new();
    let started = Instant::now();
    for _ in 0..rounds {
        let tasks: Vec<_> = (0..borrowers)
            .map(|_| {
                let (url, body) = (url.clone(), body.clone());
                tokio::spawn(async move {
                    let t = Instant::now();
                    let r = tokio::time::timeout(
                        Duration::from_secs(60),
                        http_request("POST", &url, &[JSON], body),
                    )
                    .await;
                    (t.elapsed(), r)
                })
            })
            .collect();
        for t in tasks {
            let (elapsed, r) = t.await.unwrap();
            latencies.push(elapsed);
            match r {
                Ok(Ok(reply)) if reply.status == 200 => ok += 1,
                Ok(Ok(reply))
                    if reply.status == 503
                        && reply
                            .json()
                            .is_ok_and(|j| j["error"]["code"] == "resource_busy") =>
                {
                    busy += 1
                }
                Ok(Ok(reply)) => other.push(format!("{} {}", reply.status, reply.text())),
                Ok(Err(e)) => other.push(format!("error: {e}")),
                Err(_) => other.push("no answer within 60 s".to_owned()),
            }
        }
    }
    let wall = started.elapsed();
    latencies.sort_unstable();
    let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p) as usize];
    let work = shim
        .records()
        .into_iter()
        .filter(|r| r.path == "/completion")
        .collect::<Vec<_>>();
    let double = shim.max_concurrency_where(|r| r.path == "/completion");
    println!(
        "load check: {borrowers} borrowers x {rounds} rounds = {} requests in {:.2} s: {ok} admitted (200), {busy} refused (503 resource_busy), {} other; upstream saw {} work requests, max concurrency {double}; latency p50 {:?} p99 {:?} max {:?}",
        borrowers * rounds,
        wall.as_secs_f64(),
        other.len(),
        work.len(),
        pct(0.5),
        pct(0.99),
        latencies[latencies.len() - 1]
    );
    assert!(
        other.is_empty(),
        "every request must be answered 200 or 503: {other:?}"
    );
    assert_eq!(double, 1, "two admitted jobs reached the upstream at once");
    assert_eq!(
        work.len(),
        ok,
        "every admitted request, and only those, reached the upstream"
    );
    assert!(ok >= rounds, "at least one request per round is admitted");
    d.wait_status("no leaked reservation", |s| {
        s["work"].as_array().is_some_and(|w| w.is_empty())
            && s["resources"][0]["reserved_by"].is_null()
    })
    .await;
}
