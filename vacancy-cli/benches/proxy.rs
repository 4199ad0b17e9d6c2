//! The proxy path side by side with its anchors, in one run: the direct path,
//! nginx `proxy_pass` (a keep-alive upstream pool, `proxy_buffering off`) and
//! vacancyd, all in front of the same fixed upstream. Not a test: it prints
//! numbers, and at the end each target of issue 31 beside what was measured.
//! Run it with `scripts/bench-proxy` (which installs nginx and wrk).
//!
//! Fairness: nginx runs as many worker processes as vacancyd has proxy
//! threads (`BENCH_WORKERS`, default the machine's cores; vacancyd gets it
//! as `TOKIO_WORKER_THREADS`, which sets both its runtime and, with
//! `proxy_threads = 0`, its proxy threads), and the run prints the counts as
//! it found them in `/proc`.
//!
//! What it measures, each for direct / nginx / vacancyd where it applies:
//! - memory first, on a fresh daemon: RSS per idle borrower connection
//!   (`BENCH_IDLE_CONNECTIONS` opened, nothing sent), per connection once
//!   each has made one request and sits in keep-alive (at once, and
//!   [`SETTLE`] later: an idle connection rests and the allocator returns
//!   what it gave back), and RSS
//!   `BENCH_RECOVERY_SECONDS` after they all close, against the RSS before;
//! - `GET /v1/models` (wrk) at each of `BENCH_READ_CONNECTIONS`: requests/s,
//!   p99, and CPU time per request of the proxy's processes, with its user
//!   space part; also through the hyper floor where `BENCH_FLOOR` names it
//!   (`vacancy-cli/examples/hyper_floor.rs`, which scripts/bench-proxy
//!   builds): tokio and hyper alone, built as vacancyd's read path is, so
//!   vacancyd's own cost shows apart from hyper's. The columns are measured
//!   in `BENCH_READ_ROUNDS` short rounds side by side (8, over `BENCH_SECONDS`
//!   a column), and the verdict takes the median round's ratio to nginx;
//! - admitted `POST /v1/chat/completions`, one after another on one
//!   keep-alive connection: p50 and p99, the added p50 over direct; then a
//!   vacancyd of the product's build with `overhead_header = true`, measured
//!   beside direct, its `vacancy-overhead-ms` header against the added time
//!   (every other column, the baseline's and callgrind's included, runs as
//!   users do by default, without the header, which callgrind counts at
//!   about 790 instructions a read);
//! - SSE streams: the first chunk's added time (p50, p90), and the delay of
//!   each later chunk from the upstream's write to the client's read (p50,
//!   p99) in streams of 200 chunks 5 ms apart, the chunks through the hyper
//!   floor too;
//! - refusals (a switched-off resource) at 64 and 1,000 connections (wrk),
//!   beside nginx answering the same refusal as a fixed `return 503`, and the
//!   hyper floor answering it fixed where `BENCH_FLOOR` names it: what a
//!   server that only answers a fixed reply does on this machine, and what
//!   tokio and hyper alone keep of it from 64 connections to 1,000;
//! - instructions per read, counted by callgrind for nginx (one worker),
//!   each vacancyd build and the hyper floor, one at a time: the proxies' own work, exact where
//!   requests per second on a shared machine are not (only where valgrind
//!   is installed);
//! - one 300-byte append + `fdatasync` on the disk of vacancyd's recovery
//!   directory (about one ledger record): back to back, and at the pace at
//!   which vacancyd's admissions came in each admitted section (a sync after
//!   the disk idled costs more: 184 µs back to back against 245 µs one every
//!   600 µs on the 2-core test machine), which that section's target uses;
//!   its p90 at the streams' pace beside the first chunk's, which waits for
//!   one sync.
//!
//! Every section measures each column twice, in order and then in reverse
//! (A B B A), each half over half the requests or time, and merges the
//! halves: no column gains from its place in the run. The reads and the
//! chunks take more and shorter rounds the same way (A B C C B A A B C …):
//! on a shared machine their rate, and the cost of a wake-up, drift by more
//! than the proxies differ.
//!
//! Sizes (environment): `BENCH_SECONDS` (each wrk run, default 8),
//! `BENCH_REQUESTS` (sequential requests, 2000), `BENCH_STREAMS` (streams for
//! the first chunk, 200), `BENCH_CHUNK_STREAMS` (streams of 200 chunks, one a column a round, 10),
//! `BENCH_READ_CONNECTIONS` (`1,32,1000`), `BENCH_READ_ROUNDS` (8),
//! `BENCH_IDLE_CONNECTIONS` (10000,
//! or what the descriptor limit allows), `BENCH_RECOVERY_SECONDS` (60),
//! `BENCH_WORKERS`. `BENCH_QUICK=1` (or `--quick`) makes every size small;
//! `BENCH_ONLY=memory,reads,admitted,first_chunk,chunks,refusals,instructions`
//! runs those sections only. `BENCH_BASELINE=/path/to/vacancyd` adds a second vacancyd
//! (an older build) as one more column, measured in the same run.
//! `BENCH_VACANCYD=/path/to/vacancyd` is the build measured as "vacancyd";
//! scripts/bench-proxy sets it to a plain `cargo build --release`, since
//! the bench's own build has its dev-dependencies' features on.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    clippy::print_stdout,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

use std::convert::Infallible;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Command;
use std::sync::OnceLock;
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

#[path = "support/instructions.rs"]
mod instructions;

const MODELS: &str =
    r#"{"object":"list","data":[{"id":"fixed","object":"model","created":0,"owned_by":"bench"}]}"#;
const CHAT: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":0,"model":"fixed","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
const REQUEST: &str =
    r#"{"model":"fixed","messages":[{"role":"user","content":"hi"}],"max_tokens":1}"#;
/// The refusal vacancyd's refusing upstream answers with (a resource named
/// `off`, switched off), which nginx answers with too, as the anchor.
const REFUSAL: &str = r#"{"error":{"code":"resource_disabled","message":"the owner switched resource off off for lending","type":"resource_disabled"}}"#;
const STREAM_REQUEST: &str =
    r#"{"model":"fixed","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"stream":true}"#;
/// The header vacancyd puts its own time on (issue 31 item 6).
const OVERHEAD_HEADER: &str = "vacancy-overhead-ms";
/// How many chunks the upstream streams, and how far apart (request headers).
const CHUNKS_HEADER: &str = "x-bench-chunks";
const GAP_HEADER: &str = "x-bench-gap-us";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().replace('_', "").parse().ok())
        .unwrap_or(default)
}

/// The moment every chunk's timestamp counts from: the upstream writes
/// microseconds since it into each chunk, the client reads them back.
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn since_origin_us() -> f64 {
    origin().elapsed().as_secs_f64() * 1e6
}

// ---- sizes ------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Sizes {
    seconds: usize,
    requests: usize,
    first_streams: usize,
    chunk_streams: usize,
    chunks: usize,
    chunk_gap: Duration,
    read_connections: Vec<usize>,
    /// The reads' rounds side by side ([`interleaved`]), over `seconds`
    /// a column in all.
    read_rounds: usize,
    idle_connections: usize,
    recovery: Duration,
    workers: usize,
    only: Option<Vec<String>>,
}

impl Sizes {
    fn from_env(test_mode: bool, quick: bool) -> Sizes {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let (seconds, requests, first, chunk_streams, reads, rounds, idle, recovery) = if test_mode
        {
            (1, 20, 4, 1, "32", 1, 200, 1)
        } else if quick {
            (2, 300, 40, 2, "32", 2, 1000, 5)
        } else {
            (8, 2000, 200, 10, "1,32,1000", 8, 10_000, 60)
        };
        let reads = std::env::var("BENCH_READ_CONNECTIONS").unwrap_or_else(|_| reads.to_owned());
        let only = std::env::var("BENCH_ONLY")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.split(',').map(|p| p.trim().to_owned()).collect());
        let fixed = |name: &str, default: usize| {
            if test_mode {
                default
            } else {
                env_usize(name, default)
            }
        };
        Sizes {
            seconds: fixed("BENCH_SECONDS", seconds),
            requests: fixed("BENCH_REQUESTS", requests),
            first_streams: fixed("BENCH_STREAMS", first),
            chunk_streams: fixed("BENCH_CHUNK_STREAMS", chunk_streams),
            chunks: if test_mode { 10 } else { 200 },
            chunk_gap: Duration::from_millis(5),
            read_connections: reads
                .split(',')
                .filter_map(|c| c.trim().replace('_', "").parse().ok())
                .filter(|&c: &usize| c > 0)
                .collect(),
            read_rounds: fixed("BENCH_READ_ROUNDS", rounds).max(1),
            idle_connections: fixed("BENCH_IDLE_CONNECTIONS", idle),
            recovery: Duration::from_secs(fixed("BENCH_RECOVERY_SECONDS", recovery) as u64),
            workers: env_usize("BENCH_WORKERS", cores).max(1),
            only,
        }
    }

    fn runs(&self, section: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|s| s == section))
    }
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

fn header_usize(req: &http::Request<Incoming>, name: &str) -> Option<usize> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

async fn answer(req: http::Request<Incoming>) -> Result<Reply, Infallible> {
    let path = req.uri().path().to_owned();
    let chunks = header_usize(&req, CHUNKS_HEADER).unwrap_or(20);
    let gap = Duration::from_micros(header_usize(&req, GAP_HEADER).unwrap_or(10_000) as u64);
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
        for i in 0..chunks {
            if i > 0 {
                tokio::time::sleep(gap).await;
            }
            // The timestamp is taken as the chunk is handed to hyper.
            let chunk = format!("data: {{\"i\":{i},\"t\":{:.1}}}\n\n", since_origin_us());
            if tx.send(Bytes::from(chunk)).await.is_err() {
                return;
            }
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

/// nginx proxying `port` to `upstream`, and where `refusing` names a port,
/// answering every request there with the refusal vacancyd's refusing
/// upstream gives (its status, fields and body): the anchor for refusals,
/// what a server that only answers a fixed reply does on this machine.
fn nginx(
    dir: &Path,
    port: u16,
    upstream: SocketAddr,
    workers: usize,
    conns: usize,
    refusing: Option<u16>,
    callgrind: Option<&Path>,
) -> ManagedProcess {
    let conf = dir.join("nginx.conf");
    let refusing = refusing.map_or_else(String::new, |port| {
        format!(
            r#"  server {{
    listen 127.0.0.1:{port};
    location / {{
      default_type application/json;
      add_header x-should-retry false always;
      add_header vacancy-retry-elsewhere true always;
      return 503 '{REFUSAL}';
    }}
  }}
"#
        )
    });
    std::fs::create_dir_all(dir.join("nginx-tmp")).unwrap();
    // Every worker may hold every client connection and its upstream one.
    let worker_connections = (conns + 1024).max(4096);
    std::fs::write(
        &conf,
        format!(
            r#"worker_processes {workers};
worker_rlimit_nofile {nofile};
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections {worker_connections}; }}
http {{
  access_log off;
  # nginx closes a keep-alive connection after 1,000 requests by default;
  # the sequential run sends more on one.
  keepalive_requests 1000000;
  keepalive_timeout 900s;
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
{refusing}}}
"#,
            dir = dir.display(),
            nofile = worker_connections * 2 + 64,
        ),
    )
    .unwrap();
    // Under callgrind, no master: the one worker is the process counted.
    let (mut cmd, globals) = match callgrind {
        None => (Command::new("nginx"), "daemon off;"),
        Some(out) => (
            instructions::under_callgrind(Path::new("nginx"), out),
            "daemon off; master_process off;",
        ),
    };
    cmd.arg("-c")
        .arg(&conf)
        .arg("-p")
        .arg(dir)
        .arg("-g")
        .arg(globals);
    ManagedProcess::spawn("nginx", cmd).unwrap()
}

/// vacancyd lending the fixed upstream on `proxy` (openai adapter) and
/// refusing everything on `refusing` (its resource switched off).
struct Vacancyd {
    name: String,
    process: ManagedProcess,
    control: u16,
    proxy: u16,
    refusing: u16,
}

/// Start [`Vacancyd`], putting `vacancy-overhead-ms` on its responses where
/// `overhead_header` (the default, off, everywhere but the header's own
/// check).
fn vacancyd(
    name: &str,
    binary: &Path,
    dir: &Path,
    upstream: SocketAddr,
    workers: usize,
    overhead_header: bool,
    callgrind: Option<&Path>,
) -> Vacancyd {
    std::fs::create_dir_all(dir).unwrap();
    let (control, proxy, refusing) = (
        free_port().unwrap(),
        free_port().unwrap(),
        free_port().unwrap(),
    );
    let capacity = dir.join("gpu.json");
    std::fs::write(&capacity, r#"{"free_mib": 60000, "total_mib": 64000}"#).unwrap();
    let config = dir.join("vacancyd.toml");
    let server_extra = if overhead_header {
        "overhead_header = true\n"
    } else {
        ""
    };
    std::fs::write(
        &config,
        format!(
            r#"[server]
listen = "127.0.0.1:{control}"
# Longer than the memory section takes, as nginx's keepalive_timeout.
idle_timeout_s = 900
header_timeout_s = 900
{server_extra}[owner]
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
    let (mut cmd, starting) = launch(binary, callgrind);
    cmd.arg("run")
        .arg("--config")
        .arg(&config)
        .env("VACANCYD_LOG", "warn")
        .env("TOKIO_WORKER_THREADS", workers.to_string());
    let mut process = ManagedProcess::spawn(name, cmd).unwrap();
    process
        .wait_http_ok(&format!("http://127.0.0.1:{control}/health"), starting)
        .unwrap();
    Vacancyd {
        name: name.to_owned(),
        process,
        control,
        proxy,
        refusing,
    }
}

/// `binary` as a command, under callgrind where `callgrind` names its
/// output folder, with how long it may take to start answering.
fn launch(binary: &Path, callgrind: Option<&Path>) -> (Command, Duration) {
    match callgrind {
        None => (Command::new(binary), Duration::from_secs(20)),
        Some(out) => (
            instructions::under_callgrind(binary, out),
            Duration::from_secs(180),
        ),
    }
}

/// The hyper floor (`vacancy-cli/examples/hyper_floor.rs`) with `workers`
/// threads in front of `up`, answering [`REFUSAL`] on `refusing` where it
/// names a port, under callgrind where `callgrind` names its output folder,
/// with its port.
fn hyper_floor(
    binary: &Path,
    up: SocketAddr,
    workers: usize,
    refusing: Option<u16>,
    callgrind: Option<&Path>,
) -> (ManagedProcess, u16) {
    let port = free_port().unwrap();
    let (mut cmd, starting) = launch(binary, callgrind);
    cmd.arg(format!("127.0.0.1:{port}"))
        .arg(up.to_string())
        .arg(workers.to_string());
    if let Some(refusing) = refusing {
        cmd.arg(format!("127.0.0.1:{refusing}")).arg(REFUSAL);
    }
    let mut process = ManagedProcess::spawn("hyper-floor", cmd).unwrap();
    process
        .wait_http_ok(&format!("http://127.0.0.1:{port}/health"), starting)
        .unwrap();
    (process, port)
}

/// One column of the tables.
#[derive(Clone)]
struct Column {
    name: String,
    port: u16,
    /// The processes whose CPU time and memory count for it (none: direct).
    pids: Vec<u32>,
}

// ---- /proc ---------------------------------------------------------------

fn proc_status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next().map(str::to_owned))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn rss_kib(pids: &[u32]) -> u64 {
    pids.iter().map(|&p| proc_status_kib(p, "VmRSS:")).sum()
}

fn fds(pids: &[u32]) -> usize {
    pids.iter()
        .map(|p| {
            std::fs::read_dir(format!("/proc/{p}/fd"))
                .map(Iterator::count)
                .unwrap_or(0)
        })
        .sum()
}

/// User and system CPU time of `pids` so far, in seconds.
fn cpu_seconds(pids: &[u32]) -> (f64, f64) {
    static TICKS: OnceLock<f64> = OnceLock::new();
    let ticks = *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    });
    pids.iter()
        .map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            // Fields after the command's closing parenthesis; utime and stime
            // are the 14th and 15th of the line.
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let f: Vec<&str> = rest.split_whitespace().collect();
            let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            (num(11) / ticks, num(12) / ticks)
        })
        .fold((0.0, 0.0), |(u, s), (pu, ps)| (u + pu, s + ps))
}

/// The processes whose parent is `pid` (nginx's workers).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

/// Threads of `pid` whose name starts with `prefix` (tokio names its
/// workers `tokio-rt-worker`, older releases `tokio-runtime-worker`).
fn threads_named(pid: u32, prefix: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim().starts_with(prefix))
                })
                .count()
        })
        .unwrap_or(0)
}

// ---- measurements --------------------------------------------------------

#[derive(Debug, Clone, Copy, Default)]
struct Wrk {
    rps: f64,
    p99_us: f64,
    requests: u64,
    non_2xx: u64,
    /// CPU time of the path's processes per request, µs.
    cpu_us: f64,
    /// The part of it in user space: where the proxies differ most, as
    /// both make the same system calls per read (issue 31).
    user_us: f64,
}

fn wrk(url: &str, connections: usize, seconds: usize, post: bool, pids: &[u32]) -> Wrk {
    let mut cmd = Command::new("wrk");
    cmd.arg(format!("-t{}", connections.min(2)))
        .arg(format!("-c{connections}"))
        .arg(format!("-d{seconds}s"))
        .arg("--latency");
    if post {
        let script = std::env::temp_dir().join(format!("bench-post-{}.lua", std::process::id()));
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
    let cpu_before = cpu_seconds(pids);
    let out = cmd
        .output()
        .expect("wrk runs (scripts/bench-proxy installs it)");
    let cpu_after = cpu_seconds(pids);
    let user = cpu_after.0 - cpu_before.0;
    let cpu = user + cpu_after.1 - cpu_before.1;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut w = Wrk::default();
    for line in text.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("Requests/sec:") {
            w.rps = v.trim().parse().unwrap_or(0.0);
        } else if let Some(v) = t.strip_prefix("99%") {
            w.p99_us = micros(v.trim());
        } else if let Some(v) = t.strip_prefix("Non-2xx or 3xx responses:") {
            w.non_2xx = v.trim().parse().unwrap_or(0);
        } else if t.contains(" requests in ") {
            w.requests = t
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
        }
    }
    if w.requests > 0 && !pids.is_empty() {
        w.cpu_us = cpu * 1e6 / w.requests as f64;
        w.user_us = user * 1e6 / w.requests as f64;
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

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
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

/// Sequential admitted requests on one keep-alive connection: latencies
/// (µs, sorted) and the overhead each response's header gave (µs, sorted).
async fn sequential(addr: SocketAddr, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut sender = connect(addr).await;
    let mut out = Vec::with_capacity(n);
    let mut said = Vec::new();
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
        if let Some(ms) = resp
            .headers()
            .get(OVERHEAD_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<f64>().ok())
        {
            said.push(ms * 1e3);
        }
        resp.into_body().collect().await.unwrap();
        assert!(status.is_success(), "sequential request answered {status}");
        out.push(started.elapsed().as_secs_f64() * 1e6);
    }
    (sorted(out), sorted(said))
}

/// Streams of `chunks` chunks `gap` apart, one after another on one
/// connection: the time to each first chunk (µs, sorted), and the delay of
/// every later chunk from the upstream's write to its arrival here (µs,
/// sorted).
async fn streams(addr: SocketAddr, n: usize, chunks: usize, gap: Duration) -> (Vec<f64>, Vec<f64>) {
    let mut sender = connect(addr).await;
    let (mut first, mut delays) = (Vec::new(), Vec::new());
    for _ in 0..n {
        sender.ready().await.unwrap();
        let mut req = post(STREAM_REQUEST);
        req.headers_mut()
            .insert(CHUNKS_HEADER, http::HeaderValue::from(chunks));
        req.headers_mut()
            .insert(GAP_HEADER, http::HeaderValue::from(gap.as_micros() as u64));
        let started = Instant::now();
        let resp = sender.send_request(req).await.unwrap();
        assert!(resp.status().is_success());
        let mut body = resp.into_body();
        let mut seen_first = false;
        while let Some(frame) = body.frame().await {
            let frame = frame.unwrap();
            let Some(data) = frame.data_ref().filter(|d| !d.is_empty()) else {
                continue;
            };
            let now_us = since_origin_us();
            if !seen_first {
                first.push(started.elapsed().as_secs_f64() * 1e6);
                seen_first = true;
            }
            // Each chunk says which it is and when the upstream wrote it; a
            // frame may carry more than one.
            let text = String::from_utf8_lossy(data);
            for event in text.split("{\"i\":").skip(1) {
                let number = |s: &str| -> Option<f64> {
                    let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.'));
                    s[..end.unwrap_or(s.len())].parse().ok()
                };
                let i = number(event);
                let t = event
                    .split_once("\"t\":")
                    .and_then(|(_, rest)| number(rest));
                if let (Some(i), Some(t)) = (i, t)
                    && i > 0.0
                {
                    delays.push(now_us - t);
                }
            }
        }
    }
    (sorted(first), sorted(delays))
}

/// A pause before each section: the one before may leave work behind (the
/// upstream closing a thousand connections after the last wrk run slowed
/// the next section's first column: the direct path's sequential p50 was
/// 62 µs against its usual 11).
fn settle(test_mode: bool) {
    if !test_mode {
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// Measure each of `columns` twice, in order and then in reverse (A B B A),
/// and merge each column's halves: no column gains from its place in the run
/// (a second identical daemon measured after the first ran 4-5% faster), and
/// a drift over the run weighs on every column alike. `measure(column, half)`
/// measures one half (0, then 1).
fn both_orders<T>(
    columns: usize,
    measure: impl FnMut(usize, usize) -> T,
    merge: impl Fn(T, T) -> T,
) -> Vec<T> {
    merged_rounds(columns, 2, measure, merge)
}

/// Measure each of `columns` `rounds` times side by side ([`interleaved`])
/// and merge each column's rounds into one measurement.
fn merged_rounds<T>(
    columns: usize,
    rounds: usize,
    measure: impl FnMut(usize, usize) -> T,
    merge: impl Fn(T, T) -> T,
) -> Vec<T> {
    interleaved(columns, rounds.max(1), measure)
        .into_iter()
        .map(|parts| {
            let mut parts = parts.into_iter();
            let first = parts.next().unwrap();
            parts.fold(first, &merge)
        })
        .collect()
}

/// Measure each of `columns` `rounds` times, the columns in order in the
/// first round, in reverse in the second, and so on (A B C C B A A B C …);
/// each column's measurements, round by round. `measure(column, round)`.
/// Short rounds side by side are how a ratio is told on a shared machine
/// whose rate drifts by more than the difference measured: a drift within
/// one round weighs on the columns beside each other alike.
fn interleaved<T>(
    columns: usize,
    rounds: usize,
    mut measure: impl FnMut(usize, usize) -> T,
) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = (0..columns).map(|_| Vec::with_capacity(rounds)).collect();
    for round in 0..rounds {
        for k in 0..columns {
            let column = if round % 2 == 0 { k } else { columns - 1 - k };
            out[column].push(measure(column, round));
        }
    }
    out
}

/// The median of `ratios` and their range, as "1.01× (0.89–1.15× over 8
/// rounds)" says them; `None` for none.
fn paired_ratios(ratios: Vec<f64>) -> Option<(f64, f64, f64)> {
    let ratios = sorted(ratios);
    let (first, last) = (*ratios.first()?, *ratios.last()?);
    let n = ratios.len();
    let median = if n % 2 == 1 {
        ratios[n / 2]
    } else {
        f64::midpoint(ratios[n / 2 - 1], ratios[n / 2])
    };
    Some((median, first, last))
}

/// How fast vacancyd's column went through a section's requests.
#[derive(Debug, Default)]
struct Paced {
    took: Duration,
    requests: usize,
}

impl Paced {
    fn add(&mut self, took: Duration, requests: usize) {
        self.took += took;
        self.requests += requests;
    }

    /// One request every this long.
    fn every(&self) -> Duration {
        self.took / u32::try_from(self.requests.max(1)).unwrap_or(u32::MAX)
    }
}

/// `n` split into two halves for [`both_orders`] (the first takes the odd one).
fn half(n: usize, which: usize) -> usize {
    if which == 0 { n - n / 2 } else { n / 2 }
}

/// Two halves of one wrk measurement, each over half the time.
fn merge_wrk(a: Wrk, b: Wrk) -> Wrk {
    merge_wrks(&[a, b])
}

/// Parts of one wrk measurement, each over the same time: their mean rate
/// and p99, and their CPU per request weighed by their requests.
fn merge_wrks(parts: &[Wrk]) -> Wrk {
    let n = parts.len().max(1) as f64;
    let requests: u64 = parts.iter().map(|w| w.requests).sum();
    let per_request = |us: fn(&Wrk) -> f64| {
        parts.iter().map(|w| us(w) * w.requests as f64).sum::<f64>() / requests.max(1) as f64
    };
    Wrk {
        rps: parts.iter().map(|w| w.rps).sum::<f64>() / n,
        p99_us: parts.iter().map(|w| w.p99_us).sum::<f64>() / n,
        requests,
        non_2xx: parts.iter().map(|w| w.non_2xx).sum(),
        cpu_us: per_request(|w| w.cpu_us),
        user_us: per_request(|w| w.user_us),
    }
}

/// Two halves of sorted samples, merged and sorted.
fn merge_sorted(mut a: Vec<f64>, b: Vec<f64>) -> Vec<f64> {
    a.extend(b);
    sorted(a)
}

/// What one 300-byte append (about one ledger record) + fdatasync costs in
/// a directory, µs.
#[derive(Debug, Clone, Copy)]
struct SyncCost {
    p50: f64,
    /// The disk's own spread: a first chunk waits for one sync, so its p90
    /// cannot be steadier than the sync's.
    p90: f64,
}

/// One 300-byte append + fdatasync in `dir`, `n` times: back to back, or one
/// every `every` (an admission's sync follows the disk's idle time since the
/// last one, and costs more after it: the anchor is measured at the pace the
/// daemon paid it).
fn fdatasync_cost(dir: &Path, n: usize, every: Option<Duration>) -> SyncCost {
    let path = dir.join("fsync-probe");
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap();
    let line = [b'x'; 299];
    let mut times = Vec::with_capacity(n);
    let mut last = Instant::now();
    for _ in 0..n {
        if let Some(every) = every {
            std::thread::sleep(every.saturating_sub(last.elapsed()));
        }
        last = Instant::now();
        let started = Instant::now();
        f.write_all(&line).unwrap();
        f.write_all(b"\n").unwrap();
        f.sync_data().unwrap();
        times.push(started.elapsed().as_secs_f64() * 1e6);
    }
    let times = sorted(times);
    SyncCost {
        p50: percentile(&times, 0.5),
        p90: percentile(&times, 0.9),
    }
}

/// `vacancyd_request_phase_seconds`: (phase, sum in seconds, count), in the
/// order /metrics lists them.
fn phases(control: u16) -> Vec<(String, f64, f64)> {
    let mut s = std::net::TcpStream::connect(addr(control)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let mut out: Vec<(String, f64, f64)> = Vec::new();
    for line in text.lines() {
        for (series, is_sum) in [
            ("vacancyd_request_phase_seconds_sum{phase=\"", true),
            ("vacancyd_request_phase_seconds_count{phase=\"", false),
        ] {
            let Some(rest) = line.strip_prefix(series) else {
                continue;
            };
            let Some((phase, value)) = rest.split_once("\"} ") else {
                continue;
            };
            let value: f64 = value.trim().parse().unwrap_or(0.0);
            let i = match out.iter().position(|(p, _, _)| p == phase) {
                Some(i) => i,
                None => {
                    out.push((phase.to_owned(), 0.0, 0.0));
                    out.len() - 1
                }
            };
            if is_sum {
                out[i].1 = value;
            } else {
                out[i].2 = value;
            }
        }
    }
    out
}

/// The phases' means between two snapshots (µs), with their counts.
/// Each daemon's phases over a section: the mean of each phase any of them
/// counted and how many requests counted it, the daemon built here first
/// and a baseline beside it.
type Phases = Vec<(String, f64, f64)>;

fn all_phases(daemons: &[Vacancyd]) -> Vec<Phases> {
    daemons.iter().map(|d| phases(d.control)).collect()
}

fn print_phases(title: &str, names: &[String], before: &[Phases], after: &[Phases]) {
    println!("{title}");
    let mean = |before: &Phases, after: &Phases, phase: &str| -> Option<(f64, f64)> {
        let (s0, c0) = before
            .iter()
            .find(|(p, _, _)| p == phase)
            .map_or((0.0, 0.0), |(_, s, c)| (*s, *c));
        let (s1, c1) = after
            .iter()
            .find(|(p, _, _)| p == phase)
            .map(|(_, s, c)| (*s, *c))?;
        let n = c1 - c0;
        (n > 0.0).then(|| ((s1 - s0) / n * 1e6, n))
    };
    print!("  {:<20}", "");
    for name in names {
        print!(" {name:>22}");
    }
    println!();
    // Every phase any daemon counted, in the order they first appear.
    let mut listed: Vec<&str> = Vec::new();
    for (phase, _, _) in after.iter().flatten() {
        if !listed.contains(&phase.as_str()) {
            listed.push(phase);
        }
    }
    for phase in listed {
        if !before
            .iter()
            .zip(after)
            .any(|(b, a)| mean(b, a, phase).is_some())
        {
            continue;
        }
        print!("  {phase:<20}");
        for (b, a) in before.iter().zip(after) {
            match mean(b, a, phase) {
                Some((us, n)) => print!(" {:>22}", format!("{us:.0}µs ({n:.0})")),
                None => print!(" {:>22}", "—"),
            }
        }
        println!();
    }
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

// ---- memory per connection -----------------------------------------------

/// How long after their one request the keep-alive connections are measured
/// again: past vacancyd's rest (250 ms, when a connection gives hyper's
/// buffers back) and jemalloc's decay (10 s, when freed pages go back to the
/// system), so what the connections still hold shows apart from what the
/// allocator has not yet returned.
const SETTLE: Duration = Duration::from_secs(15);

#[derive(Debug, Default, Clone, Copy)]
struct Memory {
    before_kib: u64,
    idle_kib_per_conn: f64,
    after_request_kib_per_conn: f64,
    /// [`SETTLE`] later, still in keep-alive.
    settled_kib_per_conn: f64,
    closed_kib: u64,
    recovered_kib: u64,
    connections: usize,
}

/// Wait until `pids` hold `want` descriptors (or 30 s pass).
fn wait_fds(pids: &[u32], want: usize, rising: bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let n = fds(pids);
        if (rising && n >= want) || (!rising && n <= want) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Read one HTTP/1.1 response (content-length or chunked) from `s`.
fn read_response(s: &mut std::net::TcpStream) -> bool {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let Ok(n) = s.read(&mut chunk) else {
            return false;
        };
        if n == 0 {
            return false;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let body = buf.len() - head_end - 4;
        if let Some(len) = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
        {
            if body >= len {
                return true;
            }
        } else if buf.ends_with(b"0\r\n\r\n") {
            return true;
        }
    }
}

/// RSS per idle connection, per connection after one request each, and
/// RSS after they all close, of the proxy at `port` run by `pids`.
fn memory(port: u16, pids: &dyn Fn() -> Vec<u32>, n: usize, recovery: Duration) -> Memory {
    // Warm up: the first requests allocate what every later one reuses.
    for _ in 0..3 {
        let mut s = std::net::TcpStream::connect(addr(port)).unwrap();
        s.write_all(b"GET /v1/models HTTP/1.1\r\nHost: bench\r\n\r\n")
            .unwrap();
        assert!(read_response(&mut s), "warm-up request on {port}");
    }
    std::thread::sleep(Duration::from_millis(500));
    let p = pids();
    let fds_before = fds(&p);
    let before = rss_kib(&p);
    let mut conns = Vec::with_capacity(n);
    while conns.len() < n {
        let batch = (n - conns.len()).min(250);
        for _ in 0..batch {
            let s = std::net::TcpStream::connect(addr(port)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            conns.push(s);
        }
        wait_fds(&pids(), fds_before + conns.len(), true);
    }
    std::thread::sleep(Duration::from_millis(500));
    let idle = rss_kib(&pids()).saturating_sub(before) as f64 / n as f64;
    // One request each, one connection at a time; then all sit in keep-alive.
    for s in &mut conns {
        s.write_all(b"GET /v1/models HTTP/1.1\r\nHost: bench\r\n\r\n")
            .unwrap();
        assert!(
            read_response(s),
            "a request on an open connection to {port}"
        );
    }
    std::thread::sleep(Duration::from_millis(500));
    let after_request = rss_kib(&pids()).saturating_sub(before) as f64 / n as f64;
    std::thread::sleep(SETTLE.saturating_sub(Duration::from_millis(500)));
    let settled = rss_kib(&pids()).saturating_sub(before) as f64 / n as f64;
    drop(conns);
    wait_fds(&pids(), fds_before + 16, false);
    std::thread::sleep(Duration::from_millis(200));
    let closed = rss_kib(&pids());
    let deadline = Instant::now() + recovery;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
    }
    Memory {
        before_kib: before,
        idle_kib_per_conn: idle,
        after_request_kib_per_conn: after_request,
        settled_kib_per_conn: settled,
        closed_kib: closed,
        recovered_kib: rss_kib(&pids()),
        connections: n,
    }
}

// ---- the report ----------------------------------------------------------

/// One row: a value per column, and vacancyd's ratio to nginx.
fn row(name: &str, values: &[Option<f64>], unit: &str, nginx: usize, ours: &[usize]) {
    let mut line = format!("{name:<48}");
    for v in values {
        match v {
            Some(v) => line.push_str(&format!(" {:>11.1}{unit:<2}", v)),
            None => line.push_str(&format!(" {:>13}", "—")),
        }
    }
    for &i in ours {
        match (
            values.get(i).copied().flatten(),
            values.get(nginx).copied().flatten(),
        ) {
            (Some(v), Some(n)) if n > 0.0 => line.push_str(&format!(" {:>9.2}×", v / n)),
            _ => line.push_str(&format!(" {:>10}", "")),
        }
    }
    println!("{line}");
}

struct Verdict {
    lines: Vec<String>,
}

impl Verdict {
    fn check(&mut self, what: &str, measured: String, target: String, met: bool) {
        self.lines.push(format!(
            "  [{}] {what}: {measured} (target {target})",
            if met { "meets " } else { "misses" }
        ));
    }
}

/// The instructions section: nginx (one worker) and each vacancyd build
/// under callgrind, one after another, each counted over the same reads.
fn count_instructions(
    dir: &Path,
    up: SocketAddr,
    binaries: &[(&str, PathBuf)],
    floor: Option<&Path>,
    workers: usize,
) {
    if !instructions::available() {
        println!(
            "instructions per read: skipped (valgrind is not installed; scripts/bench-proxy installs it)"
        );
        return;
    }
    let mut counted: Vec<(&str, Option<f64>)> = Vec::new();
    {
        let out = dir.join("nginx-callgrind");
        let port = free_port().unwrap();
        let mut ng = nginx(&out, port, up, 1, 1024, None, Some(&out));
        ng.wait_http_ok(
            &format!("http://127.0.0.1:{port}/health"),
            Duration::from_secs(120),
        )
        .unwrap();
        let url = format!("http://127.0.0.1:{port}/v1/models");
        counted.push(("nginx", instructions::per_read(ng.pid(), &url, &out)));
    }
    for (name, binary) in binaries {
        let out = dir.join(format!("{name}-callgrind"));
        let d = vacancyd(name, binary, &out, up, workers, false, Some(&out));
        let url = format!("http://127.0.0.1:{}/v1/models", d.proxy);
        counted.push((name, instructions::per_read(d.process.pid(), &url, &out)));
    }
    if let Some(binary) = floor {
        let out = dir.join("floor-callgrind");
        let (process, port) = hyper_floor(binary, up, workers, None, Some(&out));
        let url = format!("http://127.0.0.1:{port}/v1/models");
        counted.push(("floor", instructions::per_read(process.pid(), &url, &out)));
    }
    println!(
        "instructions per GET /v1/models (callgrind, user space, every thread; {} reads over {} keep-alive connections after a warm-up):",
        instructions::READS,
        instructions::CONNECTIONS
    );
    let nginx = counted.first().and_then(|(_, n)| *n);
    for (name, n) in &counted {
        match (n, nginx) {
            (Some(n), Some(ng)) => println!("  {name:<12} {n:>10.0}  {:>6.2}× nginx", n / ng),
            (Some(n), None) => println!("  {name:<12} {n:>10.0}"),
            (None, _) => println!("  {name:<12} not counted (see above)"),
        }
    }
}

// Long: the run in the order it measures, each section printing its own table.
#[allow(clippy::too_many_lines)]
fn main() {
    // `cargo bench` passes --bench; the test-mode run of scripts/test passes
    // --test too, and then only the setup and a tiny run are exercised.
    let args: Vec<String> = std::env::args().collect();
    let test_mode = args.iter().any(|a| a == "--test");
    let quick = args.iter().any(|a| a == "--quick")
        || std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1" || v == "true");
    let sizes = Sizes::from_env(test_mode, quick);
    let have = |tool: &str| Command::new(tool).arg("-v").output().is_ok();
    if !have("wrk") || !have("nginx") {
        panic!(
            "bench-proxy needs wrk and nginx (Debian packages; scripts/bench-proxy installs them)"
        );
    }
    let nofile = vacancy::shell::proxy::conn::raise_nofile_limit();
    // No more than vacancyd's borrower budget at this limit (its two
    // upstreams' read pools reserved, as the daemon does), less a margin for
    // the warm-up; this process holds one descriptor per connection.
    let (borrowers, _) = vacancy::shell::proxy::conn::budgets(nofile, 64 + 2 * 32);
    let idle_n = sizes
        .idle_connections
        .min(borrowers.size().saturating_sub(128));
    let _ = origin();

    let upstream_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bench-upstream")
        .enable_all()
        .build()
        .unwrap();
    // The clients run on this thread, apart from the upstream.
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let up_port = free_port().unwrap();
    let up = addr(up_port);
    let listener = upstream_rt.block_on(TcpListener::bind(up)).unwrap();
    upstream_rt.spawn(upstream(listener));
    let (ng_port, ng_refusing) = (free_port().unwrap(), free_port().unwrap());
    let mut ng = nginx(
        &dir.path().join("nginx"),
        ng_port,
        up,
        sizes.workers,
        idle_n,
        Some(ng_refusing),
        None,
    );
    ng.wait_http_ok(
        &format!("http://127.0.0.1:{ng_port}/health"),
        Duration::from_secs(10),
    )
    .unwrap();
    let ng_pid = ng.pid();
    let nginx_pids = move || {
        let mut p = vec![ng_pid];
        p.extend(children(ng_pid));
        p
    };
    // This build, and an older one to compare where given.
    // The plain release build where scripts/bench-proxy made one: cargo's own
    // build for this bench has the dev-dependencies' features on (tokio's
    // test-util among them), about 200 instructions more a read (issue 31).
    let vacancyd_binary = match std::env::var_os("BENCH_VACANCYD") {
        Some(path) => PathBuf::from(path),
        None => {
            if !test_mode {
                println!(
                    "vacancyd: the bench's own build, with its dev-dependency features on (scripts/bench-proxy measures the plain release build)"
                );
            }
            PathBuf::from(env!("CARGO_BIN_EXE_vacancyd"))
        }
    };
    let mut binaries = vec![("vacancyd", vacancyd_binary)];
    if let Some(base) = std::env::var_os("BENCH_BASELINE").filter(|b| !b.is_empty()) {
        binaries.push(("baseline", PathBuf::from(base)));
    }
    let daemons: Vec<Vacancyd> = binaries
        .iter()
        .map(|(name, binary)| {
            vacancyd(
                name,
                binary,
                &dir.path().join(name),
                up,
                sizes.workers,
                false,
                None,
            )
        })
        .collect();
    // tokio names its blocking-pool threads as its workers: this counts both.
    let runtime_threads: Vec<usize> = daemons
        .iter()
        .map(|d| threads_named(d.process.pid(), "tokio-r"))
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let idle_rss: Vec<u64> = daemons
        .iter()
        .map(|d| rss_kib(&[d.process.pid()]))
        .collect();

    let mut paths = vec![
        Column {
            name: "direct".to_owned(),
            port: up_port,
            pids: Vec::new(),
        },
        Column {
            name: "nginx".to_owned(),
            port: ng_port,
            pids: nginx_pids(),
        },
    ];
    for d in &daemons {
        paths.push(Column {
            name: d.name.clone(),
            port: d.proxy,
            pids: vec![d.process.pid()],
        });
    }
    let (nginx_col, ours): (usize, Vec<usize>) = (1, (2..paths.len()).collect());
    let nginx_workers = nginx_pids().len().saturating_sub(1);
    println!(
        "bench-proxy: one run, every path in front of the same fixed upstream (one upstream thread; wrk with up to 2 threads)"
    );
    println!(
        "fairness: nginx {nginx_workers} worker processes (in /proc); {}",
        daemons
            .iter()
            .zip(&runtime_threads)
            .map(|(d, n)| format!(
                "{} TOKIO_WORKER_THREADS={} ({} proxy threads and {n} runtime threads in /proc)",
                d.name,
                sizes.workers,
                threads_named(d.process.pid(), "vacancyd-proxy")
            ))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let header_of = |columns: &[Column], ratios: &[usize]| {
        let mut header = format!("{:<48}", "");
        for p in columns {
            header.push_str(&format!(" {:>13}", p.name));
        }
        for &i in ratios {
            header.push_str(&format!(
                " {:>10}",
                format!("{} vs nginx", &columns[i].name[..1])
            ));
        }
        header
    };
    let header = header_of(&paths, &ours);
    // The reads also go through the hyper floor where scripts/bench-proxy
    // built it: the same reads with nothing of vacancyd's own.
    let mut read_paths = paths.clone();
    let mut read_ours = ours.clone();
    let floor = std::env::var_os("BENCH_FLOOR")
        .filter(|b| !b.is_empty())
        .map(PathBuf::from);
    let floor_refusing = free_port().unwrap();
    let floor_process = floor.as_ref().map(|binary| {
        let (process, port) = hyper_floor(binary, up, sizes.workers, Some(floor_refusing), None);
        read_ours.push(read_paths.len());
        read_paths.push(Column {
            name: "floor".to_owned(),
            port,
            pids: vec![process.pid()],
        });
        println!(
            "hyper floor (BENCH_FLOOR, the example hyper_floor): {} threads, in the reads, chunks, refusals and instructions sections",
            sizes.workers
        );
        process
    });
    let read_header = header_of(&read_paths, &read_ours);
    let mut verdict = Verdict { lines: Vec::new() };
    let fsync_dir = dir.path().join("vacancyd");
    let fsync_probes = if test_mode { 5 } else { 200 };
    let fsync_us = fdatasync_cost(&fsync_dir, fsync_probes, None).p50;
    // The same at the pace vacancyd's admissions came in a section: one
    // every (its time on that column / its requests).
    // Each is printed with the back-to-back cost at the end.
    let mut fsync_lines: Vec<String> = Vec::new();
    let mut paced_fsync = |paced: &Paced, section: &str| -> SyncCost {
        let every = paced.every();
        let sync = fdatasync_cost(&fsync_dir, fsync_probes, Some(every));
        fsync_lines.push(format!(
            "  at the {section} pace (one every {:.0} µs): {:.0} µs, p90 {:.0} µs",
            every.as_secs_f64() * 1e6,
            sync.p50,
            sync.p90
        ));
        sync
    };

    // Memory first, on daemons nothing has loaded yet.
    if sizes.runs("memory") && idle_n > 0 {
        println!();
        println!(
            "memory: {idle_n} borrower connections opened and left idle, then one GET /v1/models each (kept alive), then all closed; RSS {} s after",
            sizes.recovery.as_secs()
        );
        let mut mem: Vec<Option<Memory>> = vec![None];
        mem.push(Some(memory(ng_port, &nginx_pids, idle_n, sizes.recovery)));
        for d in &daemons {
            let pid = d.process.pid();
            mem.push(Some(memory(
                d.proxy,
                &move || vec![pid],
                idle_n,
                sizes.recovery,
            )));
        }
        println!("{header}");
        let pick = |f: &dyn Fn(&Memory) -> f64| -> Vec<Option<f64>> {
            mem.iter().map(|m| m.as_ref().map(f)).collect()
        };
        row(
            "RSS before, MiB",
            &pick(&|m| m.before_kib as f64 / 1024.0),
            "",
            nginx_col,
            &ours,
        );
        row(
            "RSS per idle connection, KiB",
            &pick(&|m| m.idle_kib_per_conn),
            "",
            nginx_col,
            &ours,
        );
        row(
            "RSS per connection after one request, KiB",
            &pick(&|m| m.after_request_kib_per_conn),
            "",
            nginx_col,
            &ours,
        );
        row(
            &format!(
                "RSS per connection {} s after its request, KiB",
                SETTLE.as_secs()
            ),
            &pick(&|m| m.settled_kib_per_conn),
            "",
            nginx_col,
            &ours,
        );
        row(
            "RSS once all closed, MiB",
            &pick(&|m| m.closed_kib as f64 / 1024.0),
            "",
            nginx_col,
            &ours,
        );
        row(
            &format!("RSS {} s after they closed, MiB", sizes.recovery.as_secs()),
            &pick(&|m| m.recovered_kib as f64 / 1024.0),
            "",
            nginx_col,
            &ours,
        );
        if let Some(m) = mem[2] {
            verdict.check(
                "idle borrower connection",
                format!("{:.2} KiB", m.idle_kib_per_conn),
                "≤ 4 KiB".to_owned(),
                m.idle_kib_per_conn <= 4.0,
            );
            verdict.check(
                "idle borrower connection after a request",
                format!(
                    "{:.2} KiB {} s after it",
                    m.settled_kib_per_conn,
                    SETTLE.as_secs()
                ),
                "≤ 4 KiB".to_owned(),
                m.settled_kib_per_conn <= 4.0,
            );
            let ratio = m.recovered_kib as f64 / m.before_kib.max(1) as f64;
            verdict.check(
                &format!(
                    "RSS {} s after {} connections closed",
                    sizes.recovery.as_secs(),
                    m.connections
                ),
                format!(
                    "{:.1} MiB, {:.2}× the {:.1} MiB before",
                    m.recovered_kib as f64 / 1024.0,
                    ratio,
                    m.before_kib as f64 / 1024.0
                ),
                "≤ 1.2×".to_owned(),
                ratio <= 1.2,
            );
        }
    }

    // Reads at each concurrency.
    if sizes.runs("reads") {
        settle(test_mode);
        println!();
        println!("{read_header}");
        for &c in &sizes.read_connections {
            // Rounds of a second or so, the columns side by side in each
            // (issue 31: the same builds measured 0.87×, 1.15× and 0.90×
            // nginx in three runs of two 4-second halves, the hyper floor
            // 0.83×, 1.26× and 0.97×); the rate ratios are taken round by
            // round.
            let rounds = sizes.read_rounds;
            let per_round: Vec<Vec<Wrk>> = interleaved(read_paths.len(), rounds, |i, _| {
                wrk(
                    &format!("http://127.0.0.1:{}/v1/models", read_paths[i].port),
                    c,
                    (sizes.seconds / rounds).max(1),
                    false,
                    &read_paths[i].pids,
                )
            });
            let reads: Vec<Wrk> = per_round.iter().map(|r| merge_wrks(r)).collect();
            // Column `i` against column `j`, round by round.
            let ratios = |i: usize, j: usize, of: fn(&Wrk) -> f64| {
                paired_ratios(
                    per_round[i]
                        .iter()
                        .zip(&per_round[j])
                        .map(|(a, b)| of(a) / of(b).max(1.0))
                        .collect(),
                )
                .unwrap_or_default()
            };
            row(
                &format!("GET /v1/models c={c}, requests/s"),
                &reads.iter().map(|w| Some(w.rps)).collect::<Vec<_>>(),
                "",
                nginx_col,
                &read_ours,
            );
            row(
                &format!("GET /v1/models c={c}, p99 µs"),
                &reads.iter().map(|w| Some(w.p99_us)).collect::<Vec<_>>(),
                "",
                nginx_col,
                &read_ours,
            );
            // CPU per request exists only for the proxies' columns.
            let per_request = |us: fn(&Wrk) -> f64| -> Vec<Option<f64>> {
                reads
                    .iter()
                    .enumerate()
                    .map(|(i, w)| (i != 0).then_some(us(w)))
                    .collect()
            };
            row(
                &format!("GET /v1/models c={c}, proxy CPU µs/request"),
                &per_request(|w| w.cpu_us),
                "",
                nginx_col,
                &read_ours,
            );
            row(
                &format!("GET /v1/models c={c}, of it user space"),
                &per_request(|w| w.user_us),
                "",
                nginx_col,
                &read_ours,
            );
            if floor_process.is_some() {
                let (f, v) = (reads[read_paths.len() - 1], reads[2]);
                println!(
                    "  vacancyd at {:.2}× the hyper floor's requests/s, {:.2}× its p99: what vacancyd's own work costs at c={c}{}",
                    v.rps / f.rps.max(1.0),
                    v.p99_us / f.p99_us.max(1.0),
                    if c > 64 {
                        " (the floor keeps an upstream connection for each borrower connection; nginx keeps 64 a worker and opens and closes more beyond them, vacancyd's read pool keeps one for each borrower connection past its bound a second after its use)"
                    } else {
                        ""
                    }
                );
            }
            if c == 32 || sizes.read_connections.len() == 1 {
                let said = |(median, low, high): (f64, f64, f64)| {
                    let s = if rounds == 1 { "" } else { "s" };
                    // Three decimals for the median, which is judged
                    // against 1.0 and 1.2: a 0.998× printed as 1.00× beside
                    // "misses" reads as a contradiction.
                    format!("{median:.3}× nginx ({low:.2}–{high:.2}× over {rounds} round{s})")
                };
                let rate = ratios(2, nginx_col, |w| w.rps);
                let p99 = ratios(2, nginx_col, |w| w.p99_us);
                // The floor's own ratio beside it: what hyper and tokio
                // reach on this machine in this run with none of vacancyd's
                // work, so a miss the floor shares is told from vacancyd's.
                let floor_ratio = match floor_process {
                    Some(_) => format!(
                        "; the hyper floor {}",
                        said(ratios(read_paths.len() - 1, nginx_col, |w| w.rps))
                    ),
                    None => String::new(),
                };
                verdict.check(
                    &format!("GET /v1/models c={c} requests/s, the median round"),
                    format!("{}{floor_ratio}", said(rate)),
                    "≥ 1.0×".to_owned(),
                    rate.0 >= 1.0,
                );
                verdict.check(
                    &format!("GET /v1/models c={c} p99, the median round"),
                    said(p99),
                    "≤ 1.2×".to_owned(),
                    p99.0 <= 1.2,
                );
            }
        }
    }

    // Admitted requests, one after another.
    let mut control_phases = Vec::new();
    if sizes.runs("admitted") {
        settle(test_mode);
        let before = all_phases(&daemons);
        let mut pace = Paced::default();
        let seq: Vec<(Vec<f64>, Vec<f64>)> = both_orders(
            paths.len(),
            |i, h| {
                let n = half(sizes.requests, h);
                let started = Instant::now();
                let out = client_rt.block_on(sequential(addr(paths[i].port), n));
                if i == 2 {
                    pace.add(started.elapsed(), n);
                }
                out
            },
            |a, b| (merge_sorted(a.0, b.0), merge_sorted(a.1, b.1)),
        );
        control_phases.push(("admitted POST", before, all_phases(&daemons)));
        println!();
        println!("{header}");
        let p50: Vec<f64> = seq.iter().map(|s| percentile(&s.0, 0.5)).collect();
        let p99: Vec<f64> = seq.iter().map(|s| percentile(&s.0, 0.99)).collect();
        row(
            "admitted POST sequential, p50 µs",
            &p50.iter().map(|v| Some(*v)).collect::<Vec<_>>(),
            "",
            nginx_col,
            &ours,
        );
        row(
            "admitted POST sequential, p99 µs",
            &p99.iter().map(|v| Some(*v)).collect::<Vec<_>>(),
            "",
            nginx_col,
            &ours,
        );
        let added: Vec<Option<f64>> = p50
            .iter()
            .enumerate()
            .map(|(i, v)| (i > 0).then_some(v - p50[0]))
            .collect();
        row(
            "admitted POST, added p50 over direct, µs",
            &added,
            "",
            nginx_col,
            &ours,
        );
        let nginx_added = p50[nginx_col] - p50[0];
        let ours_added = p50[2] - p50[0];
        let fsync = paced_fsync(&pace, "admitted POSTs'").p50;
        verdict.check(
            "admitted POST added p50",
            format!(
                "{ours_added:.0} µs = {:.2}× (nginx added {nginx_added:.0} + fdatasync {fsync:.0} at this pace; {:.2}× with {fsync_us:.0} back to back)",
                ours_added / (nginx_added + fsync).max(1.0),
                ours_added / (nginx_added + fsync_us).max(1.0)
            ),
            "≤ 1.5×".to_owned(),
            ours_added <= 1.5 * (nginx_added + fsync),
        );
        // The header, on a vacancyd of its own (the columns above run as
        // users do by default, without it): its value against the added
        // time measured beside the direct path in this run.
        let checked = vacancyd(
            "vacancyd with overhead_header",
            &binaries[0].1,
            &dir.path().join("overhead-header"),
            up,
            sizes.workers,
            true,
            None,
        );
        let ports = [up_port, checked.proxy];
        let with_header: Vec<(Vec<f64>, Vec<f64>)> = both_orders(
            ports.len(),
            |i, h| client_rt.block_on(sequential(addr(ports[i]), half(sizes.requests, h))),
            |a, b| (merge_sorted(a.0, b.0), merge_sorted(a.1, b.1)),
        );
        drop(checked);
        let said = &with_header[1].1;
        let measured = percentile(&with_header[1].0, 0.5) - percentile(&with_header[0].0, 0.5);
        let (h50, h99) = (percentile(said, 0.5), percentile(said, 0.99));
        println!(
            "vacancyd with overhead_header = true: {OVERHEAD_HEADER} p50 {h50:.0} µs, p99 {h99:.0} µs, on {} of {} responses; measured beside the direct path, {measured:.0} µs added at p50 (the header is {:.0}% of it; the rest is the extra hop, the kernel's loopback and hyper's parsing before vacancyd's clock starts and its writing after, and the upstream's own time on the job's new connection, which the header leaves out as the upstream's)",
            said.len(),
            sizes.requests,
            h50 / measured.max(1.0) * 100.0
        );
        // Below: an admitted request's own time includes waiting for its
        // record's sync (REC-01), the largest part of it; a header that left
        // that out would fall under it. (Half the added time was the bound
        // before, but the hop's own cost is about half on the 2-core VM, so
        // a true header sat at 49–66% of it from run to run.)
        verdict.check(
            &format!("{OVERHEAD_HEADER} against the added p50 measured with it"),
            format!(
                "{h50:.0} µs of {measured:.0} µs; its record's fdatasync at this pace {fsync:.0} µs"
            ),
            "present on every response, not above the measured added time, and not below the record's fdatasync (less 10%)".to_owned(),
            said.len() == sizes.requests && h50 <= measured * 1.1 + 20.0 && h50 >= fsync * 0.9,
        );
    }

    // Streams: the first chunk (short streams, one after another).
    if sizes.runs("first_chunk") {
        settle(test_mode);
        let before = all_phases(&daemons);
        let mut pace = Paced::default();
        let st: Vec<Vec<f64>> = both_orders(
            paths.len(),
            |i, h| {
                let n = half(sizes.first_streams, h);
                let started = Instant::now();
                let out = client_rt
                    .block_on(streams(addr(paths[i].port), n, 3, Duration::from_millis(1)))
                    .0;
                if i == 2 {
                    pace.add(started.elapsed(), n);
                }
                out
            },
            merge_sorted,
        );
        control_phases.push(("streamed completion", before, all_phases(&daemons)));
        println!();
        println!("{header}");
        let p50: Vec<f64> = st.iter().map(|s| percentile(s, 0.5)).collect();
        let p90: Vec<f64> = st.iter().map(|s| percentile(s, 0.9)).collect();
        row(
            "stream first chunk, p50 µs",
            &p50.iter().map(|v| Some(*v)).collect::<Vec<_>>(),
            "",
            nginx_col,
            &ours,
        );
        row(
            "stream first chunk, p90 µs",
            &p90.iter().map(|v| Some(*v)).collect::<Vec<_>>(),
            "",
            nginx_col,
            &ours,
        );
        let added = |p: &[f64]| -> Vec<Option<f64>> {
            p.iter()
                .enumerate()
                .map(|(i, v)| (i > 0).then_some(v - p[0]))
                .collect()
        };
        row(
            "stream first chunk, added p50 over direct, µs",
            &added(&p50),
            "",
            nginx_col,
            &ours,
        );
        row(
            "stream first chunk, added p90 over direct, µs",
            &added(&p90),
            "",
            nginx_col,
            &ours,
        );
        let (n_add, v_add) = (p50[nginx_col] - p50[0], p50[2] - p50[0]);
        let sync = paced_fsync(&pace, "streams'");
        let fsync = sync.p50;
        verdict.check(
            "first chunk added p50",
            format!(
                "{v_add:.0} µs (nginx added {n_add:.0}, fdatasync {fsync:.0} at this pace, {fsync_us:.0} back to back)"
            ),
            format!(
                "≤ {:.0} µs: nginx + fdatasync + 100",
                n_add + fsync + 100.0
            ),
            v_add <= n_add + fsync + 100.0,
        );
        verdict.check(
            "first chunk p90 against p50",
            format!(
                "{:.0} µs against {:.0} µs (nginx's {:.1}×); the disk's own sync at this pace: p90 {:.0} µs against p50 {:.0} µs ({:.1}×), and a first chunk waits for one",
                p90[2],
                p50[2],
                p90[nginx_col] / p50[nginx_col].max(1.0),
                sync.p90,
                sync.p50,
                sync.p90 / sync.p50.max(1.0)
            ),
            "p90 ≤ 2× p50".to_owned(),
            p90[2] <= 2.0 * p50[2],
        );
    }

    // Streams: every chunk after the first.
    if sizes.runs("chunks") {
        settle(test_mode);
        // The floor too, where built: what a proxy of tokio and hyper alone
        // adds to each chunk, apart from what vacancyd's own work adds.
        // One stream a column a round, the columns side by side (A B C C B
        // A …): a chunk's delay is mostly wake-ups, whose cost on a VM
        // drifts within a run by more than the 10 µs judged (two runs of
        // the same build in two halves each: vacancyd 2 and 23 µs over
        // nginx at p50, the floor 17 and 18).
        let st: Vec<Vec<f64>> = merged_rounds(
            read_paths.len(),
            sizes.chunk_streams,
            |i, _| {
                client_rt
                    .block_on(streams(
                        addr(read_paths[i].port),
                        1,
                        sizes.chunks,
                        sizes.chunk_gap,
                    ))
                    .1
            },
            merge_sorted,
        );
        println!();
        println!(
            "{} streams of {} chunks {} ms apart, one a column a round side by side; each chunk's delay from the upstream's write to the client's read",
            sizes.chunk_streams,
            sizes.chunks,
            sizes.chunk_gap.as_millis()
        );
        println!("{read_header}");
        let p50: Vec<f64> = st.iter().map(|s| percentile(s, 0.5)).collect();
        let p99: Vec<f64> = st.iter().map(|s| percentile(s, 0.99)).collect();
        row(
            "per-chunk delay, p50 µs",
            &p50.iter().map(|v| Some(*v)).collect::<Vec<_>>(),
            "",
            nginx_col,
            &read_ours,
        );
        row(
            "per-chunk delay, p99 µs",
            &p99.iter().map(|v| Some(*v)).collect::<Vec<_>>(),
            "",
            nginx_col,
            &read_ours,
        );
        for (q, v) in [("p50", &p50), ("p99", &p99)] {
            verdict.check(
                &format!("per-chunk delay {q}"),
                format!(
                    "{:.0} µs (nginx {:.0}, direct {:.0})",
                    v[2], v[nginx_col], v[0]
                ),
                format!("≤ {:.0} µs: nginx + 10", v[nginx_col] + 10.0),
                v[2] <= v[nginx_col] + 10.0,
            );
        }
    }

    // Refusals.
    if sizes.runs("refusals") {
        settle(test_mode);
        println!();
        // Column 0 is nginx answering the same refusal, fixed; then each
        // vacancyd; then, where built, the hyper floor answering it fixed:
        // what tokio and hyper alone do for a refusal on this machine, at
        // 64 connections and at 1,000, whose per-connection state leaves
        // the caches there.
        let floor_column = floor_process
            .as_ref()
            .map(|p| (floor_refusing, vec![p.pid()]));
        let refusals = |connections: usize| {
            both_orders(
                1 + daemons.len() + usize::from(floor_column.is_some()),
                |i, h| {
                    let (port, pids) = match i.checked_sub(1) {
                        None => (ng_refusing, nginx_pids()),
                        Some(d) => match daemons.get(d) {
                            Some(daemon) => (daemon.refusing, vec![daemon.process.pid()]),
                            None => floor_column.clone().expect("the floor is the last column"),
                        },
                    };
                    wrk(
                        &format!("http://127.0.0.1:{port}/v1/chat/completions"),
                        connections,
                        half(sizes.seconds, h).max(1),
                        true,
                        &pids,
                    )
                },
                merge_wrk,
            )
        };
        let (at64, at1000) = (refusals(64), refusals(1000));
        let names = std::iter::once("nginx")
            .chain(daemons.iter().map(|d| d.name.as_str()))
            .chain(floor_column.as_ref().map(|_| "hyper floor"));
        for (i, (name, (r64, r1000))) in names.zip(at64.iter().zip(&at1000)).enumerate() {
            let what = if i == 0 || i > daemons.len() {
                "the same refusal, fixed,"
            } else {
                "refusals (resource off)"
            };
            println!(
                "{:<48} {:>10.0}/s  {:>6.1} CPU µs/refusal  {:.2}× nginx",
                format!("{name}: {what} c=64"),
                r64.rps,
                r64.cpu_us,
                r64.rps / at64[0].rps.max(1.0)
            );
            println!(
                "{:<48} {:>10.0}/s  {:>6.1} CPU µs/refusal  {:.2}× of c=64",
                format!("{name}: the same, c=1000"),
                r1000.rps,
                r1000.cpu_us,
                r1000.rps / r64.rps.max(1.0)
            );
            if r64.non_2xx == 0 && !test_mode {
                println!(
                    "warning: no refusal was counted as non-2xx; check {name}'s refusing port"
                );
            }
        }
        let (ours64, ours1000, nginx64) = (&at64[1], &at1000[1], &at64[0]);
        verdict.check(
            "refusals c=64",
            format!(
                "{:.0}/s; nginx answering the same refusal, fixed, {:.0}/s on this machine ({:.2}×)",
                ours64.rps,
                nginx64.rps,
                ours64.rps / nginx64.rps.max(1.0)
            ),
            "≥ 100,000/s".to_owned(),
            ours64.rps >= 100_000.0,
        );
        // Beside it, the anchors' own: a miss the hyper floor shares is
        // tokio's and hyper's per-connection cost, not vacancyd's work.
        let kept = |i: usize| at1000[i].rps / at64[i].rps.max(1.0);
        let floor_kept = match floor_column {
            Some(_) => format!(", the hyper floor's {:.2}×", kept(at64.len() - 1)),
            None => String::new(),
        };
        verdict.check(
            "refusals c=1000",
            format!(
                "{:.2}× of c=64 (nginx's fixed reply {:.2}×{floor_kept})",
                kept(1),
                kept(0)
            ),
            "≥ 0.9×".to_owned(),
            ours1000.rps >= 0.9 * ours64.rps,
        );
    }

    if sizes.runs("instructions") && !test_mode {
        println!();
        count_instructions(dir.path(), up, &binaries, floor.as_deref(), sizes.workers);
    }

    println!();
    println!(
        "{:<48} {:>10.0}µs",
        "one 300-byte append + fdatasync, back to back", fsync_us
    );
    for l in &fsync_lines {
        println!("{l}");
    }
    for (d, rss) in daemons.iter().zip(&idle_rss) {
        println!(
            "{:<48} {:>10.1}MiB",
            format!("{} idle RSS at start", d.name),
            *rss as f64 / 1024.0
        );
    }
    let names: Vec<String> = daemons.iter().map(|d| d.name.clone()).collect();
    for (what, before, after) in &control_phases {
        println!();
        print_phases(
            &format!(
                "where each daemon's time went on each {what} (its own phases, mean, and how many requests counted each):"
            ),
            &names,
            before,
            after,
        );
    }
    println!();
    println!("issue 31's targets (one run; take the acceptance numbers on an idle machine):");
    for l in &verdict.lines {
        println!("{l}");
    }
    drop(daemons);
    // Killing nginx's master (as dropping it does) leaves its workers
    // running, and a worker killed alone is started again by the master: ask
    // the master to stop (it ends its workers first) and wait for them.
    let _ = Command::new("kill")
        .args(["-TERM", &ng_pid.to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !children(ng_pid).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(ng);
}
