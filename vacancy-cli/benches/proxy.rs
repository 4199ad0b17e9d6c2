//! The proxy path side by side with its anchors, in one run: the direct path,
//! nginx `proxy_pass` (a keep-alive upstream pool, `proxy_buffering off`) and
//! vacancyd, all in front of the same fixed upstream. Not a test: it prints
//! numbers. Run it with `scripts/bench-proxy` (which installs nginx and wrk).
//!
//! What it measures, each for direct / nginx / vacancyd where it applies:
//! - `GET /v1/models` at 32 connections (wrk): requests/s and p99 (no admission);
//! - admitted `POST /v1/chat/completions`, one after another on one
//!   keep-alive connection: p50 and p99, and the added p50 over direct;
//! - SSE streams (20 chunks, 10 ms apart): added time to the first chunk and
//!   added per-chunk delay;
//! - refusals (a switched-off resource) at 64 and at 1,000 connections (wrk);
//! - one 64-byte append + `fdatasync` on the disk of vacancyd's recovery
//!   directory, and vacancyd's idle resident memory.
//!
//! Sizes: `BENCH_SECONDS` (each wrk run, default 8), `BENCH_REQUESTS`
//! (sequential requests, default 2000), `BENCH_STREAMS` (default 30).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    clippy::print_stdout,
    clippy::cast_precision_loss
)]

use std::convert::Infallible;
use std::fs::OpenOptions;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Command;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use vacancy_test_support::{ManagedProcess, free_port};

const MODELS: &str =
    r#"{"object":"list","data":[{"id":"fixed","object":"model","created":0,"owned_by":"bench"}]}"#;
const CHAT: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":0,"model":"fixed","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
const REQUEST: &str =
    r#"{"model":"fixed","messages":[{"role":"user","content":"hi"}],"max_tokens":1}"#;
const STREAM_REQUEST: &str =
    r#"{"model":"fixed","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"stream":true}"#;
const CHUNKS: usize = 20;
const CHUNK_GAP: Duration = Duration::from_millis(10);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---- the fixed upstream ------------------------------------------------

/// Chunks sent by a task, as a body.
struct Chunks(mpsc::Receiver<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b))))
    }
}

type Reply = http::Response<http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>>;

fn json(body: &'static str) -> Reply {
    let mut r = http::Response::new(Full::new(Bytes::from_static(body.as_bytes())).boxed_unsync());
    r.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    r
}

async fn answer(req: http::Request<Incoming>) -> Result<Reply, Infallible> {
    let path = req.uri().path().to_owned();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if path == "/v1/models" || path == "/health" {
        return Ok(json(MODELS));
    }
    if !body.windows(13).any(|w| w == b"\"stream\":true") {
        return Ok(json(CHAT));
    }
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        for i in 0..CHUNKS {
            if tx
                .send(Bytes::from(format!("data: {{\"i\":{i}}}\n\n")))
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(CHUNK_GAP).await;
        }
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    let mut r = http::Response::new(Chunks(rx).boxed_unsync());
    r.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("text/event-stream"),
    );
    Ok(r)
}

async fn upstream(listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service_fn(answer))
                .await;
        });
    }
}

// ---- the paths under test ------------------------------------------------

fn nginx(dir: &Path, port: u16, upstream: SocketAddr) -> ManagedProcess {
    let conf = dir.join("nginx.conf");
    std::fs::create_dir_all(dir.join("nginx-tmp")).unwrap();
    std::fs::write(
        &conf,
        format!(
            r#"worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  # nginx closes a keep-alive connection after 1,000 requests by default;
  # the sequential run sends more on one.
  keepalive_requests 1000000;
  client_body_temp_path {dir}/nginx-tmp;
  proxy_temp_path {dir}/nginx-tmp;
  upstream fixed {{ server {upstream}; keepalive 64; keepalive_requests 1000000; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://fixed;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"#,
            dir = dir.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new("nginx");
    cmd.arg("-c")
        .arg(&conf)
        .arg("-p")
        .arg(dir)
        .arg("-g")
        .arg("daemon off;");
    ManagedProcess::spawn("nginx", cmd).unwrap()
}

/// vacancyd lending the fixed upstream on `proxy` (openai adapter) and
/// refusing everything on `refusing` (its resource switched off).
fn vacancyd(
    dir: &Path,
    control: u16,
    proxy: u16,
    refusing: u16,
    upstream: SocketAddr,
) -> ManagedProcess {
    let capacity = dir.join("gpu.json");
    std::fs::write(&capacity, r#"{"free_mib": 60000, "total_mib": 64000}"#).unwrap();
    let config = dir.join("vacancyd.toml");
    std::fs::write(
        &config,
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
poll_ms = 60000
max_sample_age_ms = 120000
[[resource]]
name = "off"
kind = "gpu"
sampler = "file"
path = "{capacity}"
reserve_mib = 1000
enabled = false
poll_ms = 60000
max_sample_age_ms = 120000
[[upstream]]
name = "fixed"
adapter = "openai"
listen = "127.0.0.1:{proxy}"
target = "http://{upstream}"
resource = "gpu0"
default_min_free_mib = 1000
[[upstream]]
name = "refusing"
adapter = "openai"
listen = "127.0.0.1:{refusing}"
target = "http://127.0.0.1:9"
resource = "off"
default_min_free_mib = 1000
"#,
            capacity = capacity.display()
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
    p
}

// ---- measurements --------------------------------------------------------

#[derive(Debug, Clone, Copy, Default)]
struct Wrk {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    non_2xx: u64,
}

fn wrk(url: &str, connections: usize, seconds: usize, post: bool) -> Wrk {
    let mut cmd = Command::new("wrk");
    cmd.arg("-t2")
        .arg(format!("-c{connections}"))
        .arg(format!("-d{seconds}s"))
        .arg("--latency");
    let script;
    if post {
        script = std::env::temp_dir().join(format!("bench-post-{}.lua", std::process::id()));
        std::fs::write(
            &script,
            format!(
                "wrk.method = \"POST\"\nwrk.body = '{REQUEST}'\nwrk.headers[\"Content-Type\"] = \"application/json\"\n"
            ),
        )
        .unwrap();
        cmd.arg("-s").arg(&script);
    }
    cmd.arg(url);
    let out = cmd
        .output()
        .expect("wrk runs (scripts/bench-proxy installs it)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut w = Wrk::default();
    for line in text.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("Requests/sec:") {
            w.rps = v.trim().parse().unwrap_or(0.0);
        } else if let Some(v) = t.strip_prefix("50%") {
            w.p50_us = micros(v.trim());
        } else if let Some(v) = t.strip_prefix("99%") {
            w.p99_us = micros(v.trim());
        } else if let Some(v) = t.strip_prefix("Non-2xx or 3xx responses:") {
            w.non_2xx = v.trim().parse().unwrap_or(0);
        }
    }
    w
}

/// wrk's "1.23ms" / "456.00us" / "1.20s" in microseconds.
fn micros(v: &str) -> f64 {
    let (n, unit) = v.split_at(v.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(v.len()));
    let n: f64 = n.parse().unwrap_or(0.0);
    match unit {
        "us" => n,
        "ms" => n * 1e3,
        "s" => n * 1e6,
        _ => n,
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn connect(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

fn post(body: &'static str) -> http::Request<Full<Bytes>> {
    http::Request::post("/v1/chat/completions")
        .header("host", "bench")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

/// Sequential admitted requests on one keep-alive connection: latencies (µs).
async fn sequential(addr: SocketAddr, n: usize) -> Vec<f64> {
    let mut sender = connect(addr).await;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        if let Err(e) = sender.ready().await {
            panic!("{addr}: the connection closed before request {i}: {e}");
        }
        let started = Instant::now();
        let resp = match sender.send_request(post(REQUEST)).await {
            Ok(r) => r,
            Err(e) => panic!("{addr}: request {i} failed: {e}"),
        };
        let status = resp.status();
        resp.into_body().collect().await.unwrap();
        assert!(status.is_success(), "sequential request answered {status}");
        out.push(started.elapsed().as_secs_f64() * 1e6);
    }
    out.sort_by(f64::total_cmp);
    out
}

/// Streams: time to the first chunk and each later chunk's gap (µs).
async fn streams(addr: SocketAddr, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut sender = connect(addr).await;
    let (mut first, mut gaps) = (Vec::new(), Vec::new());
    for _ in 0..n {
        sender.ready().await.unwrap();
        let started = Instant::now();
        let resp = sender.send_request(post(STREAM_REQUEST)).await.unwrap();
        assert!(resp.status().is_success());
        let mut body = resp.into_body();
        let mut last: Option<Instant> = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.unwrap();
            if frame.data_ref().is_some_and(|d| !d.is_empty()) {
                let now = Instant::now();
                match last {
                    None => first.push((now - started).as_secs_f64() * 1e6),
                    Some(t) => gaps.push((now - t).as_secs_f64() * 1e6),
                }
                last = Some(now);
            }
        }
    }
    first.sort_by(f64::total_cmp);
    gaps.sort_by(f64::total_cmp);
    (first, gaps)
}

/// One 64-byte append + fdatasync in `dir`, p50 over `n` (µs).
fn fdatasync_cost(dir: &Path, n: usize) -> f64 {
    let path = dir.join("fsync-probe");
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap();
    let line = [b'x'; 63];
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        f.write_all(&line).unwrap();
        f.write_all(b"\n").unwrap();
        f.sync_data().unwrap();
        times.push(started.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    percentile(&times, 0.5)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next().map(str::to_owned))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// vacancyd's own account of where an admitted request's time went: the
/// mean of each phase of `vacancyd_request_phase_seconds` so far (µs), in
/// the order a request passes them.
fn phase_means(control: u16) -> Vec<(&'static str, f64, f64)> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr(control)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let value = |series: &str, phase: &str| -> f64 {
        let key = format!("vacancyd_request_phase_seconds_{series}{{phase=\"{phase}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    [
        "inspect",
        "admit",
        "post_job_sample",
        "persist",
        "connect",
        "upstream",
        "relay",
    ]
    .into_iter()
    .map(|phase| {
        let (sum, count) = (value("sum", phase), value("count", phase));
        let mean = if count > 0.0 { sum / count * 1e6 } else { 0.0 };
        (phase, mean, count)
    })
    .collect()
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn main() {
    // `cargo bench` passes --bench; the test-mode run of scripts/test passes
    // --test too, and then only the setup is exercised.
    let test_mode = std::env::args().any(|a| a == "--test");
    let seconds = if test_mode {
        1
    } else {
        env_usize("BENCH_SECONDS", 8)
    };
    let requests = if test_mode {
        20
    } else {
        env_usize("BENCH_REQUESTS", 2000)
    };
    let stream_count = if test_mode {
        2
    } else {
        env_usize("BENCH_STREAMS", 30)
    };
    let have = |tool: &str| Command::new(tool).arg("-v").output().is_ok();
    if !have("wrk") || !have("nginx") {
        panic!(
            "bench-proxy needs wrk and nginx (Debian packages; scripts/bench-proxy installs them)"
        );
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let up_port = free_port().unwrap();
    let up = addr(up_port);
    let listener = rt.block_on(TcpListener::bind(up)).unwrap();
    rt.spawn(upstream(listener));
    let (ng_port, ctl, vc_port, refuse_port) = (
        free_port().unwrap(),
        free_port().unwrap(),
        free_port().unwrap(),
        free_port().unwrap(),
    );
    let mut ng = nginx(&dir.path().join("nginx"), ng_port, up);
    ng.wait_http_ok(
        &format!("http://127.0.0.1:{ng_port}/health"),
        Duration::from_secs(10),
    )
    .unwrap();
    let vc_dir: PathBuf = dir.path().join("vacancyd");
    std::fs::create_dir_all(&vc_dir).unwrap();
    let vc = vacancyd(&vc_dir, ctl, vc_port, refuse_port, up);
    std::thread::sleep(Duration::from_secs(1));
    let idle_rss = rss_kib(vc.pid());

    let paths = [
        ("direct", up_port),
        ("nginx", ng_port),
        ("vacancyd", vc_port),
    ];
    println!(
        "bench-proxy: one run, every path in front of the same fixed upstream (2 wrk threads)"
    );

    // Reads: GET /v1/models at c=32.
    let reads: Vec<Wrk> = paths
        .iter()
        .map(|(_, port)| {
            wrk(
                &format!("http://127.0.0.1:{port}/v1/models"),
                32,
                seconds,
                false,
            )
        })
        .collect();
    // Admitted requests, one after another.
    let seq: Vec<Vec<f64>> = paths
        .iter()
        .map(|(_, port)| rt.block_on(sequential(addr(*port), requests)))
        .collect();
    // Read before the streams add their own requests.
    let phases = phase_means(ctl);
    // Streams.
    let st: Vec<(Vec<f64>, Vec<f64>)> = paths
        .iter()
        .map(|(_, port)| rt.block_on(streams(addr(*port), stream_count)))
        .collect();
    // Refusals.
    let refuse_url = format!("http://127.0.0.1:{refuse_port}/v1/chat/completions");
    let refusals_64 = wrk(&refuse_url, 64, seconds, true);
    let refusals_1000 = wrk(&refuse_url, 1000, seconds, true);
    let fsync_us = fdatasync_cost(&vc_dir, if test_mode { 5 } else { 200 });

    println!();
    println!(
        "{:<46} {:>12} {:>12} {:>12} {:>10}",
        "", "direct", "nginx", "vacancyd", "vs nginx"
    );
    let row = |name: &str, v: [f64; 3], unit: &str, higher_is_better: bool| {
        let ratio = if v[1] > 0.0 { v[2] / v[1] } else { 0.0 };
        let _ = higher_is_better;
        println!(
            "{:<46} {:>10.0}{unit:>2} {:>10.0}{unit:>2} {:>10.0}{unit:>2} {:>9.2}×",
            name, v[0], v[1], v[2], ratio
        );
    };
    row(
        "GET /v1/models c=32, requests/s",
        [reads[0].rps, reads[1].rps, reads[2].rps],
        "",
        true,
    );
    row(
        "GET /v1/models c=32, p99 µs",
        [reads[0].p99_us, reads[1].p99_us, reads[2].p99_us],
        "",
        false,
    );
    let p50: Vec<f64> = seq.iter().map(|s| percentile(s, 0.5)).collect();
    let p99: Vec<f64> = seq.iter().map(|s| percentile(s, 0.99)).collect();
    row(
        "admitted POST sequential, p50 µs",
        [p50[0], p50[1], p50[2]],
        "",
        false,
    );
    row(
        "admitted POST sequential, p99 µs",
        [p99[0], p99[1], p99[2]],
        "",
        false,
    );
    let added = |i: usize| p50[i] - p50[0];
    println!(
        "{:<46} {:>12} {:>10.0}µs {:>10.0}µs {:>9.2}×",
        "admitted POST, added p50 over direct",
        "—",
        added(1),
        added(2),
        if added(1) > 0.0 {
            added(2) / added(1)
        } else {
            0.0
        }
    );
    let first: Vec<f64> = st.iter().map(|(f, _)| percentile(f, 0.5)).collect();
    let gap: Vec<f64> = st.iter().map(|(_, g)| percentile(g, 0.5)).collect();
    println!(
        "{:<46} {:>12} {:>10.0}µs {:>10.0}µs {:>9.2}×",
        "stream first chunk, added p50 over direct",
        "—",
        first[1] - first[0],
        first[2] - first[0],
        if first[1] > first[0] {
            (first[2] - first[0]) / (first[1] - first[0])
        } else {
            0.0
        }
    );
    println!(
        "{:<46} {:>12} {:>10.0}µs {:>10.0}µs {:>9.2}×",
        "stream per-chunk gap, added p50 over direct",
        "—",
        gap[1] - gap[0],
        gap[2] - gap[0],
        if gap[1] > gap[0] {
            (gap[2] - gap[0]) / (gap[1] - gap[0])
        } else {
            0.0
        }
    );
    println!(
        "{:<46} {:>12} {:>12} {:>10.0}/s",
        "refusals (resource off) c=64, keep-alive", "—", "—", refusals_64.rps
    );
    println!(
        "{:<46} {:>12} {:>12} {:>10.0}/s {:>9.2}× of c=64",
        "refusals c=1000",
        "—",
        "—",
        refusals_1000.rps,
        if refusals_64.rps > 0.0 {
            refusals_1000.rps / refusals_64.rps
        } else {
            0.0
        }
    );
    println!(
        "{:<46} {:>10.0}µs",
        "one 64-byte append + fdatasync (same disk)", fsync_us
    );
    println!();
    println!(
        "where vacancyd's admitted POST time goes (its own phases, mean over the sequential run):"
    );
    for (phase, mean_us, count) in &phases {
        println!("  {phase:<20} {mean_us:>10.0}µs  ({count:.0} requests)");
    }
    println!(
        "{:<46} {:>10.1}MiB",
        "vacancyd idle RSS",
        idle_rss as f64 / 1024.0
    );
    if refusals_64.non_2xx == 0 && !test_mode {
        println!("warning: no refusal was counted as non-2xx; check the refusing upstream");
    }
    drop(vc);
    drop(ng);
}
