//! The wait line (issue 22), measured: 50 concurrent borrowers of short jobs
//! through vacancyd in front of a real llama-server (xllamacpp, the tiny
//! generated model), once without the line (the seed's 503 + Retry-After: 2,
//! which the borrowers honour as the `openai` SDK does, up to 10 retries) and
//! once with `[upstream.queue]`. Prints completed jobs per second, the
//! upstream's busy share (the union of the exchanges the counting shim saw,
//! over the run) and p50 / p99 time to completion.
//!
//! A benchmark, not a test: `bash scripts/bench-line` on an idle machine.
//! Sizes: BENCH_BORROWERS (50), BENCH_TOKENS (tokens per job, 16).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::process::Command;
use std::time::{Duration, Instant};

use vacancy_test_support::{
    CountingShim, LlamaOptions, LlamaServer, ManagedProcess, free_port, http_request,
};

const MAX_RETRIES: u32 = 10;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn vacancyd(dir: &std::path::Path, target: &str, line: bool) -> (ManagedProcess, String) {
    let (control, proxy) = (free_port().unwrap(), free_port().unwrap());
    let capacity = dir.join("gpu0.json");
    std::fs::write(&capacity, r#"{"free_mib": 60000, "total_mib": 64000}"#).unwrap();
    let queue = if line {
        "[upstream.queue]\nmax_waiting = 256\nmax_wait_s = 600\n"
    } else {
        ""
    };
    let config = dir.join(if line { "line.toml" } else { "seed.toml" });
    std::fs::write(
        &config,
        format!(
            r#"[server]
listen = "127.0.0.1:{control}"
admission_state_dir = "{state}"
[owner]
presence = "none"
[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "{capacity}"
reserve_mib = 1000
poll_ms = 60000
max_sample_age_ms = 120000
[[upstream]]
name = "llama"
adapter = "llamacpp"
listen = "127.0.0.1:{proxy}"
target = "{target}"
resource = "gpu0"
default_min_free_mib = 1000
{queue}"#,
            state = {
                let d = dir.join(if line {
                    "line.admission"
                } else {
                    "seed.admission"
                });
                std::fs::create_dir_all(&d).unwrap();
                std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700))
                    .unwrap();
                d.display().to_string()
            },
            capacity = capacity.display(),
        ),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vacancyd"));
    cmd.arg("run")
        .arg("--config")
        .arg(&config)
        .env("VACANCYD_LOG", "warn");
    let mut p = ManagedProcess::spawn("vacancyd", cmd).unwrap();
    p.wait_http_ok(
        &format!("http://127.0.0.1:{control}/health"),
        Duration::from_secs(20),
    )
    .unwrap();
    (p, format!("http://127.0.0.1:{proxy}"))
}

#[derive(Debug, Default)]
struct Run {
    completed: usize,
    gave_up: usize,
    wall: Duration,
    busy_share: f64,
    times: Vec<f64>,
}

async fn borrowers(proxy: &str, n: usize, tokens: usize, shim: &CountingShim) -> Run {
    let before = shim.records().len();
    let started = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let url = format!("{proxy}/completion");
            tokio::spawn(async move {
                let body = serde_json::json!({"prompt": "Once upon a time", "n_predict": tokens, "ignore_eos": true})
                    .to_string()
                    .into_bytes();
                let t0 = Instant::now();
                for _ in 0..=MAX_RETRIES {
                    let r = http_request("POST", &url, &[("content-type", "application/json")], body.clone())
                        .await
                        .unwrap();
                    if r.status == 200 {
                        return Some(t0.elapsed());
                    }
                    // As the openai SDK: honour Retry-After on 503.
                    let wait = r
                        .headers
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<f64>().ok())
                        .unwrap_or(1.0);
                    tokio::time::sleep(Duration::from_secs_f64(wait)).await;
                }
                None
            })
        })
        .collect();
    let mut run = Run::default();
    for t in tasks {
        match t.await.unwrap() {
            Some(took) => {
                run.completed += 1;
                run.times.push(took.as_secs_f64());
            }
            None => run.gave_up += 1,
        }
    }
    run.wall = started.elapsed();
    let mut spans: Vec<(Instant, Instant)> = shim
        .records()
        .into_iter()
        .skip(before)
        .filter(|r| r.method == "POST" && r.path.contains("completion"))
        .map(|r| (r.started, r.ended.unwrap_or_else(Instant::now)))
        .collect();
    spans.sort();
    let mut busy = Duration::ZERO;
    let mut cur: Option<(Instant, Instant)> = None;
    for (s, e) in spans {
        cur = match cur {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                busy += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some((cs, ce)) = cur {
        busy += ce - cs;
    }
    run.busy_share = busy.as_secs_f64() / run.wall.as_secs_f64();
    run.times.sort_by(f64::total_cmp);
    run
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    if std::env::args().any(|a| a == "--test") {
        // `cargo bench -- --test` (CI's compile check): nothing to time.
        return;
    }
    let n = env_usize("BENCH_BORROWERS", 50);
    let tokens = env_usize("BENCH_TOKENS", 16);
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let shim = CountingShim::start(llama.addr()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // One job alone, for scale.
    let (single, seed_proxy) = {
        let (p, proxy) = vacancyd(dir.path(), &shim.base_url(), false);
        let one = rt.block_on(borrowers(&proxy, 1, tokens, &shim));
        drop(p);
        (one, proxy)
    };
    let _ = seed_proxy;
    let (p, proxy) = vacancyd(dir.path(), &shim.base_url(), false);
    let seed = rt.block_on(borrowers(&proxy, n, tokens, &shim));
    drop(p);
    let (p, proxy) = vacancyd(dir.path(), &shim.base_url(), true);
    let line = rt.block_on(borrowers(&proxy, n, tokens, &shim));
    drop(p);
    println!(
        "bench-line: {n} concurrent borrowers, one {tokens}-token llama-server job each (alone: {:.2} s); 503s honour Retry-After, up to {MAX_RETRIES} retries\n",
        single.times.first().copied().unwrap_or(f64::NAN)
    );
    println!("{:<34} {:>14} {:>14}", "", "without line", "with the line");
    let row = |name: &str, a: String, b: String| println!("{name:<34} {a:>14} {b:>14}");
    row(
        "completed jobs",
        format!("{}/{n}", seed.completed),
        format!("{}/{n}", line.completed),
    );
    row(
        "gave up after 10 retries",
        seed.gave_up.to_string(),
        line.gave_up.to_string(),
    );
    row(
        "wall time",
        format!("{:.1} s", seed.wall.as_secs_f64()),
        format!("{:.1} s", line.wall.as_secs_f64()),
    );
    row(
        "completed jobs per second",
        format!("{:.2}", seed.completed as f64 / seed.wall.as_secs_f64()),
        format!("{:.2}", line.completed as f64 / line.wall.as_secs_f64()),
    );
    row(
        "upstream busy share",
        format!("{:.0}%", seed.busy_share * 100.0),
        format!("{:.0}%", line.busy_share * 100.0),
    );
    row(
        "time to completion p50",
        format!("{:.1} s", pct(&seed.times, 0.5)),
        format!("{:.1} s", pct(&line.times, 0.5)),
    );
    row(
        "time to completion p99",
        format!("{:.1} s", pct(&seed.times, 0.99)),
        format!("{:.1} s", pct(&line.times, 0.99)),
    );
}
