//! Does the owner console cost the proxy path anything? A benchmark, not a
//! test: it prints numbers. A real vacancyd (this build, or `VACANCYD_BIN`)
//! lends an instant in-process upstream; the proxy path is measured with no
//! console open and then with `VACANCY_CONSOLES` (default 8) consoles open —
//! each an `/events` stream — plus `/history` and `/metrics` read every
//! second, more than a browser tab does.
//!
//! - admitted: sequential keep-alive requests that are admitted, persisted
//!   (one fsync), forwarded and released; latency percentiles.
//! - refused: two keep-alive connections sending work to a switched-off
//!   resource (classify, inspect, admit, refuse, count); requests per second.
//!
//! `cargo bench -p vacancy-cli --bench console_cost` (sizes:
//! `VACANCY_COST_ADMITTED`, default 2000; `VACANCY_COST_REFUSE_S`, default 5).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// An upstream that answers every request at once, like a llama-server
/// that has nothing to do.
async fn instant_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    let mut resp = http::Response::new(Full::new(Bytes::from_static(
                        br#"{"content":"ok","stop":true}"#,
                    )));
                    resp.headers_mut().insert(
                        "content-type",
                        http::HeaderValue::from_static("application/json"),
                    );
                    Ok::<_, Infallible>(resp)
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Daemon(Child);
impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(addr: &str) -> Sender {
    let stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

async fn post(sender: &mut Sender, host: &str, path: &str) -> u16 {
    sender.ready().await.unwrap();
    let req = http::Request::post(path)
        .header("host", host)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"prompt":"x","n_predict":1}"#,
        )))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    status
}

/// A console: the event stream read to its end, until aborted.
async fn console(control: String) {
    let stream = TcpStream::connect(&control).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get("/events")
        .header("host", &control)
        .body(Empty::new())
        .unwrap();
    let mut body = sender.send_request(req).await.unwrap().into_body();
    while let Some(Ok(_)) = body.frame().await {}
}

/// `/history` and `/metrics` every second.
async fn poller(control: String) {
    loop {
        for path in ["/history", "/metrics", "/status"] {
            let stream = TcpStream::connect(&control).await.unwrap();
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            let req = http::Request::get(path)
                .header("host", &control)
                .body(Empty::new())
                .unwrap();
            let _ = sender
                .send_request(req)
                .await
                .unwrap()
                .into_body()
                .collect()
                .await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// CPU seconds `pid` has used (user + system), from /proc.
fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
    let rest = stat.rsplit(')').next().unwrap_or_default();
    let f: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    f.iter().sum::<f64>() / 100.0 // USER_HZ
}

/// What one round measured.
struct Round {
    p50: f64,
    p90: f64,
    p99: f64,
    admitted_cpu_us: f64,
    refused_per_s: f64,
    refused_cpu_us: f64,
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

async fn measure(pid: u32, proxy: &str, closed: &str, admitted_n: u64, refuse_s: u64) -> Round {
    let mut sender = connect(proxy).await;
    for _ in 0..50 {
        assert_eq!(post(&mut sender, proxy, "/completion").await, 200);
    }
    let mut lat = Vec::with_capacity(admitted_n as usize);
    let cpu0 = cpu_s(pid);
    for _ in 0..admitted_n {
        let t = Instant::now();
        let status = post(&mut sender, proxy, "/completion").await;
        lat.push(t.elapsed());
        assert_eq!(status, 200);
    }
    let admitted_cpu_us = (cpu_s(pid) - cpu0) * 1e6 / admitted_n as f64;
    lat.sort();
    let cpu1 = cpu_s(pid);
    let until = Instant::now() + Duration::from_secs(refuse_s);
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let closed = closed.to_owned();
            tokio::spawn(async move {
                let mut s = connect(&closed).await;
                let mut n = 0u64;
                while Instant::now() < until {
                    assert_eq!(post(&mut s, &closed, "/completion").await, 503);
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut refused = 0;
    for w in workers {
        refused += w.await.unwrap();
    }
    Round {
        p50: pct(&lat, 0.5),
        p90: pct(&lat, 0.9),
        p99: pct(&lat, 0.99),
        admitted_cpu_us,
        refused_per_s: refused as f64 / refuse_s as f64,
        refused_cpu_us: (cpu_s(pid) - cpu1) * 1e6 / refused.max(1) as f64,
    }
}

fn main() {
    // `cargo bench -- --test` (scripts/test) runs it at a token size.
    let quick = std::env::args().any(|a| a == "--test");
    let admitted_n = if quick {
        50
    } else {
        env_or("VACANCY_COST_ADMITTED", 2000)
    };
    let refuse_s = if quick {
        1
    } else {
        env_or("VACANCY_COST_REFUSE_S", 5)
    };
    let consoles = env_or("VACANCY_CONSOLES", 8);
    let bin =
        std::env::var("VACANCYD_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_vacancyd").to_owned());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let upstream = instant_upstream().await;
        let dir = tempfile::tempdir().unwrap();
        let capacity = dir.path().join("gpu0.json");
        std::fs::write(&capacity, r#"{"free_mib": 20000, "total_mib": 64000}"#).unwrap();
        let (control, proxy, closed) = (free_port(), free_port(), free_port());
        let config = format!(
            r#"[server]
listen = "127.0.0.1:{control}"
[owner]
presence = "none"
[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "{cap}"
reserve_mib = 1000
poll_ms = 1000
[[resource]]
name = "off"
kind = "gpu"
sampler = "file"
path = "{cap}"
enabled = false
[[upstream]]
name = "llama"
adapter = "llamacpp"
listen = "127.0.0.1:{proxy}"
target = "http://{upstream}"
resource = "gpu0"
default_min_free_mib = 100
[[upstream]]
name = "closed"
adapter = "llamacpp"
listen = "127.0.0.1:{closed}"
target = "http://127.0.0.1:9"
resource = "off"
"#,
            cap = capacity.display()
        );
        let path = dir.path().join("vacancyd.toml");
        std::fs::write(&path, config).unwrap();
        let daemon = Daemon(
            Command::new(&bin)
                .args(["run", "--config"])
                .arg(&path)
                .env("VACANCYD_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let (control, proxy, closed) = (
            format!("127.0.0.1:{control}"),
            format!("127.0.0.1:{proxy}"),
            format!("127.0.0.1:{closed}"),
        );
        for _ in 0..200 {
            if TcpStream::connect(&control).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pid = daemon.0.id();
        println!("vacancyd: {bin}");
        println!("consoles  admitted p50 / p90 / p99 µs  CPU µs/req   refused/s  CPU µs/refusal   console CPU ms/s");
        for open in [0, consoles, 0, consoles, 0, consoles] {
            let mut tasks = Vec::new();
            for _ in 0..open {
                tasks.push(tokio::spawn(console(control.clone())));
            }
            if open > 0 {
                tasks.push(tokio::spawn(poller(control.clone())));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            // What the open consoles cost by themselves, with no borrower.
            let idle0 = cpu_s(pid);
            tokio::time::sleep(Duration::from_secs(2)).await;
            let idle = (cpu_s(pid) - idle0) * 1000.0 / 2.0;
            let r = measure(pid, &proxy, &closed, admitted_n, refuse_s).await;
            println!(
                "{open:>8}  {:>6.0} / {:>6.0} / {:>6.0}  {:>10.0}  {:>10.0}  {:>14.1}  {idle:>17.1}",
                r.p50, r.p90, r.p99, r.admitted_cpu_us, r.refused_per_s, r.refused_cpu_us
            );
            for t in tasks {
                t.abort();
            }
        }
    });
}
