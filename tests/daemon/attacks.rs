//! The attacks of issue 30 ("Found by attacking it"), rerun through a real
//! vacancyd in front of real upstreams: WebSocket tunnels under a small
//! descriptor limit (item 1), a thousand idle and slowloris control
//! connections (item 2), the example's token (item 4), a huge duration
//! (item 5), DNS rebinding (item 6), a wrong-token flood (item 7) and the
//! HTTP details (item 8). Each prints what it measured. The corrupt last
//! journal line (item 3) is in `recovery.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Daemon, JSON, Setup, completion, fds};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use vacancy_test_support::{
    ComfyFlavor, ComfyUi, LlamaOptions, LlamaServer, ManagedProcess, http_request,
};

fn addr(url: &str) -> String {
    url.trim_start_matches("http://").to_owned()
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

/// Read a response head (up to the blank line) from `s`, within `bound`;
/// `None` if none came.
async fn read_head(s: &mut TcpStream, bound: Duration) -> Option<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if got.windows(4).any(|w| w == b"\r\n\r\n") {
                        return;
                    }
                }
            }
        }
    };
    tokio::time::timeout(bound, read).await.ok()?;
    (!got.is_empty()).then(|| String::from_utf8_lossy(&got).into_owned())
}

/// One request on a fresh connection; the whole reply as text, within `bound`.
async fn raw(addr: &str, request: &[u8], bound: Duration) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(bound, s.read_to_end(&mut got)).await;
    String::from_utf8_lossy(&got).into_owned()
}

/// `vacancyd run` under `ulimit -n limit` (soft and hard: it cannot raise it).
fn run_limited(config: &std::path::Path, limit: u32) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "ulimit -n {limit} && exec \"$0\" run --config \"$1\""
        ))
        .arg(vacancy_test_support::vacancyd())
        .arg(config)
        .env("VACANCYD_LOG", "info,vacancy=debug");
    cmd
}

/// Answers `/health`, `/status` and `/health/upstreams/<name>` within
/// `bound`? Returns the slowest.
async fn control_answers(control: &str, upstream: &str, bound: Duration) -> Duration {
    let mut slowest = Duration::ZERO;
    for path in [
        "/health",
        "/status",
        &format!("/health/upstreams/{upstream}"),
    ] {
        let started = Instant::now();
        let r = tokio::time::timeout(
            bound,
            http_request("GET", &format!("{control}{path}"), &[], Vec::new()),
        )
        .await
        .unwrap_or_else(|_| panic!("{path} did not answer within {bound:?}"))
        .unwrap();
        assert!(
            r.status == 200 || (path.starts_with("/health/upstreams") && r.status == 503),
            "{path}: {} {}",
            r.status,
            r.text()
        );
        slowest = slowest.max(started.elapsed());
    }
    slowest
}

/// The local ports of this process's connections to `127.0.0.1:<port>`
/// that the kernel shows established: the peer has not closed them. A
/// connection vacancyd closed is in CLOSE_WAIT (its FIN arrived) even
/// before the task that owns it has read the end.
///
/// A set: the kernel writes its table in several reads, and a socket that
/// moves while it does can come out twice (measured: up to 73 established
/// lines repeated in one read of this test's table, as connections opened
/// and closed around it). Counted twice, one tunnel made a CI run see 199
/// of a budget of 198 while vacancyd's own side showed 198.
fn established_to(port: u16) -> std::collections::HashSet<u16> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let hex_port = |address: &str| {
        address
            .rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() > 3 && fields[3] == "01" && hex_port(fields[2]) == Some(port))
                .then(|| hex_port(fields[1]))
                .flatten()
        })
        .collect()
}

/// Samples, every 10 ms until `stop`, how many of the connections in
/// `upgraded` (local ports) are established; returns the most seen at once.
/// The set is copied before the kernel's table is read, so each counted
/// tunnel was open (upgraded, not yet closed by vacancyd) at the copy:
/// the count never runs above the tunnels open at one moment.
fn sample_open_tunnels(
    proxy: u16,
    upgraded: Arc<std::sync::Mutex<std::collections::HashSet<u16>>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut peak = 0;
        while !stop.load(Ordering::SeqCst) {
            let ours = upgraded.lock().unwrap().clone();
            let open = established_to(proxy)
                .into_iter()
                .filter(|local| ours.contains(local))
                .count();
            peak = peak.max(open);
            std::thread::sleep(Duration::from_millis(10));
        }
        peak
    })
}

/// The WebSocket handshake of ComfyUI's own client for `/ws`.
fn ws_upgrade(host: &str, n: usize) -> Vec<u8> {
    format!(
        "GET /ws?clientId=attack-{n} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_tunnels_keep_their_permit_and_close_when_idle() {
    // Issue 30 item 1: under `ulimit -n 600` (borrower_connections=220 then;
    // 198 since the read pool keeps an eighth of the descriptors, issue 31),
    // 400 `GET /ws` upgrades through the ComfyUI listener to a real ComfyUI
    // gave 291 live tunnels, every descriptor taken, /health and /status
    // timing out and EMFILE in the log; an idle tunnel outlived
    // idle_timeout_s. Now at most 198 tunnels live at once (the rest wait in
    // the backlog), the control plane answers throughout, each tunnel closes
    // tunnel_idle_timeout_s after its last byte, and one with traffic stays.
    let comfy = ComfyUi::start(ComfyFlavor::V0_3_75).unwrap();
    const IDLE_S: u64 = 4;
    let (_dir, config, control, proxy) = common::prepare(20_000, |dir, control, proxy| {
        format!(
            r#"[server]
listen = "127.0.0.1:{control}"
idle_timeout_s = 20
tunnel_idle_timeout_s = {IDLE_S}

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
"#,
            capacity = dir.join("gpu0.json").display(),
            target = comfy.base_url(),
        )
    });
    let p = common::spawn_daemon(run_limited(&config, 600), control);
    let control = format!("http://127.0.0.1:{control}");
    let log = plain(&p.log());
    assert!(log.contains("borrower_connections=198"), "{log}");
    let host = format!("127.0.0.1:{proxy}");

    const N: usize = 400;
    // The tunnels open at once: the upgraded connections the kernel shows
    // established, sampled. (A count of the clients that have not yet read
    // their tunnel's end runs high: one tunnel's close lets the next upgrade
    // through before the closed one's client task has run. One CI run
    // counted 202 that way.)
    let upgraded_ports = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampler = sample_open_tunnels(
        proxy,
        Arc::clone(&upgraded_ports),
        Arc::clone(&stop_sampling),
    );
    let upgraded = Arc::new(AtomicUsize::new(0));
    let idle_closed = Arc::new(AtomicUsize::new(0));
    // Quiet for at least the idle timeout before the close, and not much more.
    let quiet_max_ms = Arc::new(AtomicU64::new(0));
    let quiet_min_ms = Arc::new(AtomicU64::new(u64::MAX));
    let started = Instant::now();
    let mut clients = Vec::new();
    for n in 0..N {
        let (host, ports, upgraded, idle_closed, qmax, qmin) = (
            host.clone(),
            Arc::clone(&upgraded_ports),
            Arc::clone(&upgraded),
            Arc::clone(&idle_closed),
            Arc::clone(&quiet_max_ms),
            Arc::clone(&quiet_min_ms),
        );
        clients.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(&host).await.unwrap();
            s.write_all(&ws_upgrade(&host, n)).await.unwrap();
            let head = read_head(&mut s, Duration::from_secs(120))
                .await
                .unwrap_or_else(|| panic!("tunnel {n}: no answer to the upgrade"));
            assert!(head.starts_with("HTTP/1.1 101"), "tunnel {n}: {head}");
            upgraded.fetch_add(1, Ordering::SeqCst);
            let local = s.local_addr().unwrap().port();
            ports.lock().unwrap().insert(local);
            // Read what ComfyUI sends (its status message) until vacancyd closes.
            let mut last = Instant::now();
            let mut buf = [0u8; 4096];
            let closed = tokio::time::timeout(Duration::from_secs(60), async {
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => last = Instant::now(),
                    }
                }
            })
            .await;
            // Before the socket closes, so that no later connection on this
            // port is taken for this tunnel.
            ports.lock().unwrap().remove(&local);
            assert!(
                closed.is_ok(),
                "tunnel {n}: still open 60 s after its last byte"
            );
            let quiet = u64::try_from(last.elapsed().as_millis()).unwrap();
            qmax.fetch_max(quiet, Ordering::SeqCst);
            qmin.fetch_min(quiet, Ordering::SeqCst);
            idle_closed.fetch_add(1, Ordering::SeqCst);
        }));
    }
    // The control plane answers while tunnels come and go.
    let mut slowest = Duration::ZERO;
    let mut fds_peak = 0;
    while idle_closed.load(Ordering::SeqCst) < N {
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "only {} of {N} tunnels came and went in 180 s\n{}",
            idle_closed.load(Ordering::SeqCst),
            p.log_tail(30)
        );
        slowest = slowest.max(control_answers(&control, "comfy", Duration::from_secs(2)).await);
        fds_peak = fds_peak.max(fds(p.pid()));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for c in clients {
        c.await.unwrap();
    }
    let took = started.elapsed();
    stop_sampling.store(true, Ordering::SeqCst);
    let peak = sampler.join().unwrap();

    // One tunnel with traffic (a WebSocket ping every second, which ComfyUI
    // answers with a pong) outlives three idle timeouts.
    let mut s = TcpStream::connect(&host).await.unwrap();
    s.write_all(&ws_upgrade(&host, N)).await.unwrap();
    let head = read_head(&mut s, Duration::from_secs(10)).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let (mut r, mut w) = s.into_split();
    let pinger = tokio::spawn(async move {
        // A masked, empty ping frame.
        let ping = [0x89u8, 0x80, 1, 2, 3, 4];
        while w.write_all(&ping).await.is_ok() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let busy_for = Duration::from_secs(3 * IDLE_S);
    let mut buf = [0u8; 1024];
    let held = tokio::time::timeout(busy_for, async {
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    pinger.abort();
    assert!(held.is_err(), "a tunnel with traffic was closed");

    let log = plain(&p.log());
    for bad in ["Too many open files", "accepting a connection failed"] {
        assert!(!log.contains(bad), "{bad}:\n{}", p.log_tail(30));
    }
    let (qmin, qmax) = (
        quiet_min_ms.load(Ordering::SeqCst),
        quiet_max_ms.load(Ordering::SeqCst),
    );
    println!(
        "ulimit -n 600, {N} WebSocket upgrades to ComfyUI: {} upgraded, at most {peak} tunnels at once \
         (budget 198), all closed after {qmin}..{qmax} ms of quiet (tunnel_idle_timeout_s = {IDLE_S}) \
         within {:.1} s; vacancyd descriptors at most {fds_peak}; /health, /status and \
         /health/upstreams/comfy slowest {:.0} ms; a tunnel with a ping a second open after {} s",
        upgraded.load(Ordering::SeqCst),
        took.as_secs_f64(),
        slowest.as_secs_f64() * 1000.0,
        busy_for.as_secs(),
    );
    assert!(
        peak <= 198,
        "{peak} tunnels at once beyond the budget of 198"
    );
    assert!(
        qmin >= (IDLE_S - 1) * 1000,
        "closed after only {qmin} ms of quiet"
    );
    assert!(
        qmax <= (IDLE_S + 6) * 1000,
        "closed only after {qmax} ms of quiet"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_and_slowloris_control_connections_leave_health_checks_answering() {
    // Issue 30 item 2: 64 idle or slowloris connections on the control
    // listener took /health, /status and /health/upstreams/<name> down with
    // 20,000 descriptors available. Here 500 idle and 500 slowloris
    // connections (a byte of a head every 500 ms), reopened as soon as
    // vacancyd closes them, are kept up for 20 s while a load balancer's
    // check asks /health/upstreams/llama every 50 ms on a new connection:
    // every answer must come within 100 ms. (An attacker reopens a closed
    // connection after a second.)
    let ours = vacancy::shell::proxy::conn::raise_nofile_limit();
    assert!(
        ours >= 4096,
        "this test needs 4096 descriptors; the limit is {ours}"
    );
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let d = Daemon::setup(Setup {
        target: &llama.base_url(),
        ..Setup::default()
    });
    let control_addr = addr(&d.control);
    // The upstream is observed reachable before the attack.
    d.wait_status("llama reachable", |s| {
        s["upstreams"][0]["reachable"] == true
    })
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let (opened, closed_by_daemon) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut attackers = Vec::new();
    for i in 0..1000 {
        let (stop, opened, closed) = (
            Arc::clone(&stop),
            Arc::clone(&opened),
            Arc::clone(&closed_by_daemon),
        );
        let target = control_addr.clone();
        attackers.push(tokio::spawn(async move {
            let slow = i % 2 == 1;
            let head = b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut s) = TcpStream::connect(&target).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                opened.fetch_add(1, Ordering::Relaxed);
                let mut buf = [0u8; 256];
                let mut k = 0usize;
                loop {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    if slow {
                        let byte = head.get(k).copied().unwrap_or(b'a');
                        k += 1;
                        if s.write_all(&[byte]).await.is_err() {
                            break;
                        }
                    }
                    let read =
                        tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await;
                    if let Ok(Ok(0) | Err(_)) = read {
                        break;
                    }
                }
                closed.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }));
    }
    // Let the attack build up — every attacker has opened its connection —
    // then probe for 20 s from a thread of its own, as a load balancer is a
    // process of its own: its latencies are vacancyd's, not the attackers'
    // runtime's.
    let built_up = Instant::now() + common::EVENT_BOUND;
    while opened.load(Ordering::Relaxed) < 1000 {
        assert!(
            Instant::now() < built_up,
            "only {} of 1,000 attackers connected",
            opened.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (probe_url, status_url) = (
        format!("{}/health/upstreams/llama", d.control),
        format!("{}/status", d.control),
    );
    let probing = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let started = Instant::now();
            let mut latencies = Vec::new();
            let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
            let mut status_slowest = Duration::ZERO;
            let mut status_retried = 0usize;
            while started.elapsed() < Duration::from_secs(20) {
                let t = Instant::now();
                let r = tokio::time::timeout(
                    Duration::from_secs(2),
                    http_request("GET", &probe_url, &[], Vec::new()),
                )
                .await
                .expect("/health/upstreams/llama answers during the attack");
                latencies.push(t.elapsed());
                // A connection closed before its request was read (the
                // probe shares 127.0.0.1 with the attackers, so its
                // connection is one of theirs to the per-peer cap): a failed
                // check, counted as status 0; a load balancer tries again.
                let status = r.map_or(0, |r| r.status);
                *statuses.entry(status).or_default() += 1;
                if latencies.len() % 20 == 0 {
                    // The same peer as the attackers: a connection closed
                    // before its request was read is tried once more on a
                    // new one, as an operator's client would; a second
                    // close in a row fails the test.
                    let t = Instant::now();
                    let mut answer = None;
                    for _attempt in 0..2 {
                        let r = tokio::time::timeout(
                            Duration::from_secs(2),
                            http_request("GET", &status_url, &[], Vec::new()),
                        )
                        .await
                        .expect("/status answers during the attack");
                        match r {
                            Ok(s) => {
                                answer = Some(s);
                                break;
                            }
                            Err(e) => {
                                status_retried += 1;
                                println!(
                                    "/status: closed before its request was read ({e}); tried again"
                                );
                            }
                        }
                    }
                    let s = answer.expect("/status answers on one of two connections");
                    assert_eq!(s.status, 200, "{}", s.text());
                    status_slowest = status_slowest.max(t.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (latencies, statuses, status_slowest, status_retried)
        })
    });
    let (mut latencies, statuses, status_slowest, status_retried) =
        tokio::task::spawn_blocking(move || probing.join())
            .await
            .unwrap()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.await.unwrap();
    }
    latencies.sort();
    let max = *latencies.last().unwrap();
    let median = latencies[latencies.len() / 2];
    let p99 = latencies[latencies.len() * 99 / 100];
    let metrics = http_request("GET", &format!("{}/metrics", d.control), &[], Vec::new())
        .await
        .unwrap()
        .text();
    let shed: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("vacancyd_control_connections_shed_total"))
        .collect();
    println!(
        "1,000 idle and slowloris control connections held for 20 s ({} opened, {} closed by vacancyd): \
         {} checks of /health/upstreams/llama, statuses {statuses:?}, median {:.1} ms, p99 {:.1} ms, max {:.1} ms; \
         /status slowest {:.1} ms, tried again {status_retried} times; {shed:?}",
        opened.load(Ordering::Relaxed),
        closed_by_daemon.load(Ordering::Relaxed),
        latencies.len(),
        median.as_secs_f64() * 1000.0,
        p99.as_secs_f64() * 1000.0,
        max.as_secs_f64() * 1000.0,
        status_slowest.as_secs_f64() * 1000.0,
    );
    // Every check answered within 2 s (above), and all but a rare one with
    // 200: at most one in a hundred closed before its request was read.
    let ok = statuses.get(&200).copied().unwrap_or(0);
    let failed = statuses.get(&0).copied().unwrap_or(0);
    assert_eq!(ok + failed, latencies.len(), "{statuses:?}");
    assert!(
        (failed + status_retried) * 100 <= latencies.len(),
        "{statuses:?}, /status tried again {status_retried} times"
    );
    assert!(
        max < Duration::from_millis(100),
        "a health check took {max:?}"
    );
    assert!(!shed.is_empty(), "shed connections are counted");
    // And the daemon still serves work.
    assert_eq!(d.complete(4).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_duration_is_refused_by_check_config_and_run() {
    // Issue 30 item 5: idle_timeout_s = 9223372036854775807 passed
    // check-config, `run` reported ready, and every connection task panicked.
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup {
        target: "http://127.0.0.1:9",
        server: "idle_timeout_s = 9223372036854775807\n",
        upstream: "completion_timeout_s = 604801\n",
        ..Setup::default()
    };
    let (config, control, _) = setup.write_into(dir.path());
    let text = std::fs::read_to_string(&config).unwrap();
    let line = |needle: &str| text[..text.find(needle).unwrap()].matches('\n').count() + 1;
    let check = Command::new(vacancy_test_support::vacancyd())
        .arg("check-config")
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&check.stderr).into_owned()
        + &String::from_utf8_lossy(&check.stdout);
    assert!(!check.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "line {}: server.idle_timeout_s: 9223372036854775807 is too large: the largest accepted value is 86400 (1 day",
            line("idle_timeout_s")
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "line {}: upstream[0] (\"llama\").completion_timeout_s",
            line("completion_timeout_s")
        )) && err.contains("largest accepted value is 604800 (7 days"),
        "{err}"
    );
    let mut run = ManagedProcess::spawn("vacancyd", common::run_command(&config)).unwrap();
    let status = run
        .wait_exit(Duration::from_secs(20))
        .expect("vacancyd run refuses the configuration and exits");
    assert!(!status.success());
    let log = run.log();
    assert!(log.contains("server.idle_timeout_s"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", control)).is_err(),
        "the control listener was opened: {log}"
    );
    // The attack's other value is not even an integer TOML can hold.
    std::fs::write(
        &config,
        text.replace("9223372036854775807", "18446744073709551615"),
    )
    .unwrap();
    let check = Command::new(vacancy_test_support::vacancyd())
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!check.status.success());
    assert!(
        String::from_utf8_lossy(&check.stderr)
            .contains(&format!("line {}", line("idle_timeout_s"))),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    println!(
        "idle_timeout_s = 9223372036854775807: check-config exit {:?}; run exit {:?}; control port {control} never answered",
        check.status.code(),
        status.code()
    );
}

#[test]
fn the_example_configuration_ships_no_usable_token() {
    // Issue 30 item 4: check-config said ok to examples/vacancyd.toml, whose
    // token's text was in its own comment; `Authorization: Bearer
    // example-token-do-not-use` switched lending off.
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/vacancyd.toml");
    let text = std::fs::read_to_string(&example).unwrap();
    assert!(!text.contains("example-token-do-not-use"));
    let out = Command::new(vacancy_test_support::vacancyd())
        .args(["check-config", "--config"])
        .arg(&example)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let line = text[..text.find("sha256 = ").unwrap()]
        .matches('\n')
        .count()
        + 1;
    assert!(
        err.contains(&format!("line {line}: server.token[0] (\"ops\").sha256"))
            && err.contains("vacancyd token new --name ops --scope admin"),
        "{err}"
    );
    // A configuration holding the old example's hash is refused too.
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.toml");
    std::fs::write(
        &old,
        "[[server.token]]\nname = \"ops\"\nscopes = [\"admin\"]\nsha256 = \"3690a4a2ed3b26b46a696e9ab873a300d9da3ae56bc84352e2bf724885c91dfd\"\n",
    )
    .unwrap();
    let out = Command::new(vacancy_test_support::vacancyd())
        .args(["check-config", "--config"])
        .arg(&old)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("line 4:") && err.contains("example-token-do-not-use"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_listener_answers_only_its_own_host_names() {
    // Issue 30 item 6: `curl -H 'Host: attacker.example:PORT'
    // 127.0.0.1:PORT/status` answered 200, as did /settings and /events: a
    // DNS-rebinding page could read them through a visitor's browser.
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let d = Daemon::setup(Setup {
        target: &llama.base_url(),
        server: "allowed_hosts = [\"lender1.lan\"]\n",
        ..Setup::default()
    });
    let port = d.control.rsplit(':').next().unwrap().to_owned();
    let mut results = Vec::new();
    for path in ["/status", "/settings", "/events", "/metrics", "/health"] {
        for (host, want) in [
            (format!("attacker.example:{port}"), 421),
            (format!("localhost.attacker.example:{port}"), 421),
            (format!("127.0.0.1:{port}"), 200),
            (format!("localhost:{port}"), 200),
            ("LENDER1.lan".to_owned(), 200),
        ] {
            let reply = raw(
                &addr(&d.control),
                format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
                Duration::from_secs(if path == "/events" { 1 } else { 5 }),
            )
            .await;
            let status: u16 = reply
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            assert_eq!(status, want, "{path} with Host {host}: {reply}");
            if want == 421 {
                assert!(reply.contains("allowed_hosts"), "{reply}");
                assert!(!reply.contains("\"lending\""), "{reply}");
            }
            results.push(format!("{path} {host}: {status}"));
        }
    }
    // An absolute-form target overrides Host (RFC 9112 section 3.2.2): it
    // must name this listener too.
    let reply = raw(
        &addr(&d.control),
        format!(
            "GET http://attacker.example:{port}/status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
        Duration::from_secs(5),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 421"), "{reply}");
    results.push("absolute-form http://attacker.example/status: 421".to_owned());
    println!("{}", results.join("; "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_flood_is_counted_logged_once_and_slowed_and_the_owner_gets_in() {
    // Issue 30 item 7: 1,207,974 wrong bearer tokens in 10 s (119,605/s)
    // left no log line and no metric. Here 32 connections send wrong
    // tokens to POST /admin/lending as fast as they are answered for 10 s,
    // while the owner's right token is sent from loopback every second.
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let token = "vac_the-owners-own-token";
    let d = Daemon::setup(Setup {
        target: &llama.base_url(),
        server: &format!(
            "[[server.token]]\nname = \"owner\"\nscopes = [\"owner\"]\nsha256 = \"{}\"\n",
            vacancy::auth::hash_token(token)
        ),
        ..Setup::default()
    });
    let url = format!("{}/admin/lending", d.control);
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let mut flood = Vec::new();
    for i in 0..32 {
        let (stop, answered, url) = (Arc::clone(&stop), Arc::clone(&answered), url.clone());
        flood.push(tokio::spawn(async move {
            let client = reqwest_like::Client::new(&url);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let wrong = format!("Bearer vac_guess-{i}-{n}");
                n += 1;
                match client.post_lending(&wrong).await {
                    Some(401) => {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(other) => panic!("a wrong token got {other}"),
                    None => {} // closed to make room: reconnect
                }
            }
        }));
    }
    let started = Instant::now();
    let mut owner_slowest = Duration::ZERO;
    while started.elapsed() < Duration::from_secs(10) {
        let t = Instant::now();
        let r = tokio::time::timeout(
            Duration::from_secs(2),
            http_request(
                "POST",
                &url,
                &[
                    JSON,
                    ("authorization", &format!("Bearer {token}")),
                    ("vacancy-intent", "lending"),
                ],
                br#"{"enabled":true}"#.to_vec(),
            ),
        )
        .await
        .expect("the owner's right token is answered during the flood")
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        owner_slowest = owner_slowest.max(t.elapsed());
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let sent_for = started.elapsed();
    for f in flood {
        f.abort();
    }
    let answered = answered.load(Ordering::Relaxed);
    let metrics = http_request("GET", &format!("{}/metrics", d.control), &[], Vec::new())
        .await
        .unwrap()
        .text();
    let counted: u64 = metrics
        .lines()
        .find(|l| {
            l.starts_with("vacancyd_auth_failures_total{")
                && l.contains("scope=\"owner\"")
                && l.contains("reason=\"wrong_token\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64);
    let log = plain(&d.process.log());
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("refused for its token"))
        .collect();
    println!(
        "32 connections of wrong tokens for {:.1} s: {answered} answered ({:.1}/s), {counted} counted in \
         vacancyd_auth_failures_total{{scope=\"owner\",reason=\"wrong_token\"}}, {} log lines; \
         the owner's right token slowest {:.0} ms",
        sent_for.as_secs_f64(),
        answered as f64 / sent_for.as_secs_f64(),
        lines.len(),
        owner_slowest.as_secs_f64() * 1000.0,
    );
    assert!(
        counted >= answered && counted > 0,
        "{counted} counted, {answered} answered"
    );
    assert!(
        answered < 100,
        "{answered} wrong tokens answered in 10 s: not slowed"
    );
    assert!(!lines.is_empty() && lines.len() <= 3, "{lines:#?}");
    assert!(lines[0].contains("127.0.0.1"), "{}", lines[0]);
    assert!(!log.contains("vac_guess"), "a token was logged");
    assert!(
        owner_slowest < Duration::from_millis(500),
        "{owner_slowest:?}"
    );
}

/// A minimal keep-alive client for the flood: one connection, reopened
/// when the daemon closes it.
mod reqwest_like {
    use super::*;

    pub struct Client {
        addr: String,
        path: String,
        conn: tokio::sync::Mutex<Option<TcpStream>>,
    }

    impl Client {
        pub fn new(url: &str) -> Self {
            let rest = url.trim_start_matches("http://");
            let (addr, path) = rest.split_once('/').unwrap();
            Client {
                addr: addr.to_owned(),
                path: format!("/{path}"),
                conn: tokio::sync::Mutex::new(None),
            }
        }

        /// The status of one POST with `authorization`, or `None` if the
        /// connection closed first.
        pub async fn post_lending(&self, authorization: &str) -> Option<u16> {
            let mut guard = self.conn.lock().await;
            if guard.is_none() {
                *guard = TcpStream::connect(&self.addr).await.ok();
            }
            let s = guard.as_mut()?;
            let body = br#"{"enabled":false}"#;
            let req = format!(
                "POST {} HTTP/1.1\r\nHost: {}\r\nAuthorization: {authorization}\r\nVacancy-Intent: lending\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                self.path,
                self.addr,
                body.len()
            );
            let ok = s.write_all(req.as_bytes()).await.is_ok() && s.write_all(body).await.is_ok();
            let head = if ok {
                read_head(s, Duration::from_secs(30)).await
            } else {
                None
            };
            let Some(head) = head else {
                *guard = None;
                return None;
            };
            // The error body follows the head: read it by its length.
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            let have = head.len() - head.find("\r\n\r\n").map_or(head.len(), |i| i + 4);
            let mut rest = vec![0u8; len.saturating_sub(have)];
            if s.read_exact(&mut rest).await.is_err() {
                *guard = None;
            }
            head.split_whitespace().nth(1).and_then(|c| c.parse().ok())
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_over_the_limit_gets_413_first_and_host_follows_rfc_9112() {
    // Issue 30 item 8: a declared Content-Length of 10 GiB with `Expect:
    // 100-continue` got `100 Continue` and the 413 only after ~36 MB; HTTP/1.1
    // with no Host, or two, was answered 200.
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let token = "vac_owner-token-for-item-8";
    let d = Daemon::setup(Setup {
        target: &llama.base_url(),
        server: &format!(
            "[[server.token]]\nname = \"owner\"\nscopes = [\"owner\"]\nsha256 = \"{}\"\n",
            vacancy::auth::hash_token(token)
        ),
        ..Setup::default()
    });
    let (proxy, control) = (addr(&d.proxy), addr(&d.control));
    let ten_gib = 10u64 << 30;
    // The proxy listener: 413 at once, no 100 Continue, nothing uploaded.
    let started = Instant::now();
    let reply = raw(
        &proxy,
        format!(
            "POST /completion HTTP/1.1\r\nHost: {proxy}\r\nContent-Type: application/json\r\n\
             Content-Length: {ten_gib}\r\nExpect: 100-continue\r\n\r\n"
        )
        .as_bytes(),
        Duration::from_secs(10),
    )
    .await;
    let took = started.elapsed();
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(!reply.contains("100 Continue"), "{reply}");
    assert!(reply.contains("body_too_large"), "{reply}");
    // The control listener: the same for an admin call with its token.
    let reply_control = raw(
        &control,
        format!(
            "POST /admin/lending HTTP/1.1\r\nHost: {control}\r\nAuthorization: Bearer {token}\r\n\
             Vacancy-Intent: lending\r\nContent-Length: {ten_gib}\r\nExpect: 100-continue\r\n\r\n"
        )
        .as_bytes(),
        Duration::from_secs(10),
    )
    .await;
    assert!(reply_control.starts_with("HTTP/1.1 413"), "{reply_control}");
    assert!(!reply_control.contains("100 Continue"), "{reply_control}");
    // Lending was not switched.
    assert_eq!(d.status().await["lending"], true);

    // Host (RFC 9112 section 3.2), on both listeners.
    let mut seen = Vec::new();
    for (listener, path) in [(&proxy, "/health"), (&control, "/health")] {
        for (what, head, want) in [
            (
                "HTTP/1.1 without Host",
                format!("GET {path} HTTP/1.1\r\nConnection: close\r\n\r\n"),
                400,
            ),
            (
                "two Hosts",
                format!(
                    "GET {path} HTTP/1.1\r\nHost: {listener}\r\nHost: {listener}\r\nConnection: close\r\n\r\n"
                ),
                400,
            ),
            (
                "HTTP/1.0 without Host",
                format!("GET {path} HTTP/1.0\r\n\r\n"),
                200,
            ),
            (
                "one Host",
                format!("GET {path} HTTP/1.1\r\nHost: {listener}\r\nConnection: close\r\n\r\n"),
                200,
            ),
        ] {
            let reply = raw(listener, head.as_bytes(), Duration::from_secs(10)).await;
            let status: u16 = reply
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            assert_eq!(status, want, "{listener} {what}: {reply}");
            if want == 400 {
                assert!(reply.contains("Host"), "{reply}");
            }
            seen.push(format!("{listener} {what}: {status}"));
        }
    }
    // And work still goes through.
    let r = http_request(
        "POST",
        &format!("{}/completion", d.proxy),
        &[JSON],
        completion(4, false),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    println!(
        "Content-Length 10 GiB with Expect: 100-continue: {} in {:.1} ms on the proxy, {} on the control listener; {}",
        reply.lines().next().unwrap_or_default(),
        took.as_secs_f64() * 1000.0,
        reply_control.lines().next().unwrap_or_default(),
        seen.join("; ")
    );
}
