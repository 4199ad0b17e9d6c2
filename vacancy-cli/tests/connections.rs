//! Connection handling through a real vacancyd in front of the real
//! llama-server (issue 14 item 4): slow heads, idle keep-alive connections and
//! trickling bodies are closed on the borrower and control listeners; a long
//! generation is never idle; with descriptors scarce, borrowers cannot take
//! the control plane down and a failing accept is logged once, not in a loop.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemon, JSON, Setup, completion};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use vacancy_test_support::{
    LlamaOptions, LlamaServer, ManagedProcess, TinyModel, free_port, http_request,
};

/// Short limits so that the test sees them act within seconds.
const LIMITS: &str =
    "header_timeout_s = 2\nidle_timeout_s = 2\nbody_timeout_s = 2\nbody_min_rate_bytes = 100\n";

fn daemon(llama: &LlamaServer) -> Daemon {
    Daemon::setup(Setup {
        target: &llama.base_url(),
        reserve: 1000,
        need: 2000,
        free: 20_000,
        server: LIMITS,
        upstream: "",
        presence: "none",
    })
}

/// `text` without terminal colour codes.
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn addr(url: &str) -> String {
    url.trim_start_matches("http://").to_owned()
}

/// Read until the server closes the connection (EOF or reset); what it sent.
/// Panics if it stays open past `bound`.
async fn until_closed(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    bound: Duration,
) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(bound, read_all)
        .await
        .unwrap_or_else(|_| panic!("the connection was still open after {bound:?}"));
    got
}

/// Send `bytes` one a second until the server stops taking them.
async fn trickle(stream: &mut (impl tokio::io::AsyncWrite + Unpin), bytes: &[u8]) {
    for b in bytes {
        if stream.write_all(&[*b]).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_sent_a_byte_a_second_is_closed_at_the_header_timeout() {
    // Issue 14 item 4 (slowloris), on the borrower and the control listener.
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let d = daemon(&llama);
    for url in [&d.proxy, &d.control] {
        let (mut r, mut s) = TcpStream::connect(addr(url)).await.unwrap().into_split();
        let started = Instant::now();
        let head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        tokio::select! {
            () = trickle(&mut s, head) => panic!("{url}: the whole slow head was taken"),
            _ = until_closed(&mut r, Duration::from_secs(30)) => {}
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{url}: closed only after {:?}",
            started.elapsed()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_and_a_long_generation_is_not() {
    // Issue 14 item 4: idle keep-alive timeout; a response being generated is
    // never idle, however long the upstream takes.
    let llama = LlamaServer::start(LlamaOptions {
        model: TinyModel {
            layers: 8,
            embd: 1024,
            seed: 1,
        },
        ..LlamaOptions::default()
    })
    .unwrap();
    let d = daemon(&llama);
    for url in [&d.proxy, &d.control] {
        let mut s = TcpStream::connect(addr(url)).await.unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let got = until_closed(&mut s, Duration::from_secs(20)).await;
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 200"), "{url}: {text}");
    }

    // A non-streamed generation that outlasts the idle timeout.
    let started = Instant::now();
    let r = d.complete(400).await;
    let took = started.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        took > Duration::from_secs(3),
        "the generation took {took:?}, not longer than the 2 s idle timeout: make it longer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_trickling_a_byte_a_second_is_refused_and_closed() {
    // Issue 14 item 4: body progress. The work body is refused with a 400
    // saying what to do, nothing is admitted, and the connection closes.
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let d = daemon(&llama);
    let (mut r, mut s) = TcpStream::connect(addr(&d.proxy))
        .await
        .unwrap()
        .into_split();
    s.write_all(
        b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
    )
    .await
    .unwrap();
    let body = [b' '; 1000];
    let got = tokio::select! {
        () = trickle(&mut s, &body) => panic!("the trickling body was read whole"),
        got = until_closed(&mut r, Duration::from_secs(30)) => got,
    };
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("arrived too slowly"), "{text}");
    let m = http_request("GET", &format!("{}/metrics", d.control), &[], Vec::new())
        .await
        .unwrap()
        .text();
    assert!(
        m.contains("vacancyd_admissions_total{upstream=\"llama\"} 0"),
        "{m}"
    );
    // A steady client is served as always.
    assert_eq!(d.complete(4).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn borrowers_holding_every_descriptor_leave_the_control_plane_answering() {
    // Issue 14 item 4: with a 256-descriptor limit, 300 idle borrower
    // connections never stop /health and /status from answering, work is
    // still served once idle connections time out, and the daemon does not
    // spin logging failed accepts.
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (control, proxy) = (free_port().unwrap(), free_port().unwrap());
    common::write_capacity(&dir.path().join("gpu0.json"), 20_000, 64_000);
    let setup = Setup {
        target: &llama.base_url(),
        reserve: 1000,
        need: 2000,
        free: 20_000,
        server: "idle_timeout_s = 5\n",
        upstream: "",
        presence: "none",
    };
    let config = dir.path().join("vacancyd.toml");
    std::fs::write(&config, common::config(dir.path(), control, proxy, &setup)).unwrap();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -n 256 && exec \"$0\" run --config \"$1\"")
        .arg(env!("CARGO_BIN_EXE_vacancyd"))
        .arg(&config)
        .env("VACANCYD_LOG", "info");
    let mut p = ManagedProcess::spawn("vacancyd", cmd).unwrap();
    let control = format!("http://127.0.0.1:{control}");
    p.wait_http_ok(&format!("{control}/health"), Duration::from_secs(20))
        .unwrap();
    let log = plain(&p.log());
    assert!(log.contains("borrower_connections=64"), "{log}");

    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(
            TcpStream::connect(format!("127.0.0.1:{proxy}"))
                .await
                .unwrap(),
        );
    }
    for _ in 0..20 {
        let started = Instant::now();
        let h = tokio::time::timeout(
            Duration::from_secs(2),
            http_request("GET", &format!("{control}/health"), &[], Vec::new()),
        )
        .await
        .expect("/health answers while borrowers hold their connections")
        .unwrap();
        assert_eq!(h.status, 200);
        let s = tokio::time::timeout(
            Duration::from_secs(2),
            http_request("GET", &format!("{control}/status"), &[], Vec::new()),
        )
        .await
        .expect("/status answers while borrowers hold their connections")
        .unwrap();
        assert_eq!(s.status, 200);
        assert!(started.elapsed() < Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Idle borrowers time out; a real one then gets through.
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        http_request(
            "POST",
            &format!("http://127.0.0.1:{proxy}/completion"),
            &[JSON],
            completion(4, false),
        ),
    )
    .await
    .expect("a borrower is served once idle connections time out")
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    drop(idle);
    let log = p.log();
    let noisy = log.matches("accepting a connection failed").count()
        + log.matches("connection limit reached").count();
    assert!(
        noisy <= 10,
        "{noisy} lines about accepting:\n{}",
        p.log_tail(40)
    );
}
