//! Connection handling through a real vacancyd in front of the real
//! llama-server (issue 14 item 4): slow heads, idle keep-alive connections and
//! trickling bodies are closed on the borrower and control listeners; a long
//! generation is never idle; with descriptors scarce, borrowers cannot take
//! the control plane down and a failing accept is logged once, not in a loop.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemon, JSON, Setup, completion, fds, rss_kib};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use vacancy_test_support::{LlamaOptions, LlamaServer, ManagedProcess, TinyModel, http_request};

/// Short limits so that the test sees them act within seconds.
const LIMITS: &str =
    "header_timeout_s = 2\nidle_timeout_s = 2\nbody_timeout_s = 2\nbody_min_rate_bytes = 100\n";

fn daemon(llama: &LlamaServer) -> Daemon {
    Daemon::setup(Setup {
        target: &llama.base_url(),
        server: LIMITS,
        ..Setup::default()
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
        let head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
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
        s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .unwrap();
        let got = until_closed(&mut s, Duration::from_secs(20)).await;
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 200"), "{url}: {text}");
    }

    // A non-streamed generation that outlasts the idle timeout: 400 tokens
    // took 2.96 s on an idle CI machine, and 700 took 2.72 s on another
    // (a CI rehearsal of issue 31), both too close to the bound below.
    let started = Instant::now();
    let r = d.complete(1400).await;
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
    let setup = Setup {
        target: &llama.base_url(),
        server: "idle_timeout_s = 5\n",
        ..Setup::default()
    };
    let (config, control, proxy) = setup.write_into(dir.path());
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -n 256 && exec \"$0\" run --config \"$1\"")
        .arg(vacancy_test_support::vacancyd())
        .arg(&config)
        .env("VACANCYD_LOG", "info");
    let p = common::spawn_daemon(cmd, control);
    let control = format!("http://127.0.0.1:{control}");
    let log = plain(&p.log());
    // (256 - 64 reserved - 32 for the read pool's idle connections (an eighth
    // of the limit) - 64 for the control plane) / 2 descriptors a borrower
    // connection.
    assert!(log.contains("borrower_connections=48"), "{log}");

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

/// Descriptors of the daemon's own that may come and go during a count.
const FD_SLACK: usize = 8;

/// Wait until the daemon holds a descriptor for each of `opened` borrower
/// connections beyond its `before` (less a few: `before` may have counted a
/// pooled upstream connection since closed); panics when it stops accepting.
async fn wait_accepted(p: &ManagedProcess, before: usize, opened: usize) {
    let pid = p.pid();
    let deadline = Instant::now() + Duration::from_secs(30);
    while fds(pid) + FD_SLACK < before + opened {
        if Instant::now() > deadline {
            panic!(
                "the daemon stopped accepting: {opened} connections opened, {} descriptors open ({before} before)\n{}",
                fds(pid),
                p.log_tail(20)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_and_slow_borrowers_never_stop_work_health_or_status() {
    // Issue 18 item 6: with the connection timeouts on (a head within 900 s,
    // idle keep-alive 900 s: longer than a loaded machine takes to open them) and the descriptor limit raised to its hard limit,
    // 10,000 borrowers, half of which connect and send nothing and half
    // trickle a request head a byte a second, never stop a real borrower's
    // work, /health or /status from answering, and the daemon's memory stays
    // bounded. Each borrower connection is budgeted two descriptors (its own
    // and the upstream's), so 10,000 need a hard limit above 20,256; where
    // the hard limit is lower (20,000 in this project's containers, which
    // may not raise it) the test holds all the budget allows but 64.
    let ours = vacancy::shell::proxy::conn::raise_nofile_limit();
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup {
        target: &llama.base_url(),
        // Longer than the test, so that every connection stays open to the
        // end; the defaults (30 s, 75 s) act the same way, only sooner.
        server: "header_timeout_s = 900\nidle_timeout_s = 900\n",
        ..Setup::default()
    };
    let (config, control, proxy) = setup.write_into(dir.path());
    let p = common::spawn_daemon(common::run_command(&config), control);
    let control = format!("http://127.0.0.1:{control}");
    let log = plain(&p.log());
    let budget: usize = log
        .split("borrower_connections=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the daemon logs its connection budget:\n{log}"));
    let total = 10_000.min(budget.saturating_sub(64));
    assert!(
        total >= 9_000,
        "a budget of {budget} borrower connections is too small for this test (raise the hard descriptor limit)"
    );
    assert!(
        ours > total as u64 + 500,
        "this test needs {} descriptors of its own; the limit is {ours}",
        total + 500
    );
    let (idle_n, slow_n) = (total / 2, total - total / 2);
    let work_url = format!("http://127.0.0.1:{proxy}/completion");
    let work = || http_request("POST", &work_url, &[JSON], completion(4, false));
    // Warm up: one request through every layer.
    assert_eq!(work().await.unwrap().status, 200);
    let pid = p.pid();
    let (rss_before, fds_before) = (rss_kib(pid), fds(pid));

    let target = format!("127.0.0.1:{proxy}");
    let mut idle = Vec::with_capacity(idle_n);
    let mut slow = Vec::with_capacity(slow_n);
    let connect_started = Instant::now();
    // In batches, each accepted before the next, so the accept queue never
    // overflows into SYN-ACK retransmissions. The last batch opens only what
    // is left: a connection past the budget would wait in the accept queue
    // (the daemon accepts no more until one of its own closes), and the
    // test's own connect would time out behind it.
    while idle.len() + slow.len() < total {
        let opened = idle.len() + slow.len();
        wait_accepted(&p, fds_before, opened).await;
        let batch: Vec<_> = (0..250.min(total - opened))
            .map(|_| tokio::spawn(TcpStream::connect(target.clone())))
            .collect();
        for b in batch {
            let s = b.await.unwrap().unwrap();
            if idle.len() < idle_n {
                idle.push(s);
            } else {
                slow.push(s);
            }
        }
    }
    wait_accepted(&p, fds_before, total).await;
    let connected_in = connect_started.elapsed();
    let head = b"POST /completion HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n";
    let mut rss_peak = rss_kib(pid);
    let mut fds_peak = fds(pid);
    let mut slowest = Duration::ZERO;
    for (i, byte) in head.iter().take(10).enumerate() {
        // One byte of the head on every slow connection, then the checks.
        for s in &mut slow {
            s.write_all(&[*byte]).await.unwrap();
        }
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
        let w = tokio::time::timeout(Duration::from_secs(20), work())
            .await
            .expect("a borrower's work is served while borrowers hold their connections")
            .unwrap();
        assert_eq!(w.status, 200, "round {i}: {}", w.text());
        slowest = slowest.max(started.elapsed());
        rss_peak = rss_peak.max(rss_kib(pid));
        fds_peak = fds_peak.max(fds(pid));
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    // Every connection is still open: none was closed early.
    let mut open = 0;
    let mut probe = [0u8; 1];
    for s in idle.iter_mut().chain(slow.iter_mut()) {
        if let Err(tokio::time::error::Elapsed { .. }) =
            tokio::time::timeout(Duration::from_micros(10), s.read(&mut probe)).await
        {
            open += 1;
        }
    }
    drop(idle);
    drop(slow);
    // The descriptors come back once the borrowers go.
    let deadline = Instant::now() + Duration::from_secs(20);
    while fds(pid) > fds_before + FD_SLACK && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fds_after = fds(pid);
    let rss_after = rss_kib(pid);
    println!(
        "{total} borrower connections ({idle_n} idle, {slow_n} slow; budget {budget}) opened in {:.1} s; {open} still open at the end; \
         /health + /status + one completion each round, slowest {:.0} ms; \
         vacancyd RSS {:.1} MiB before, {:.1} MiB peak ({:.1} KiB a connection), {:.1} MiB after they closed; \
         descriptors {fds_before} before, {fds_peak} peak, {fds_after} after",
        connected_in.as_secs_f64(),
        slowest.as_secs_f64() * 1000.0,
        rss_before as f64 / 1024.0,
        rss_peak as f64 / 1024.0,
        rss_peak.saturating_sub(rss_before) as f64 / total as f64,
        rss_after as f64 / 1024.0,
    );
    assert_eq!(
        open, total,
        "the daemon closed connections before their timeouts"
    );
    assert!(
        fds_peak + FD_SLACK >= fds_before + total,
        "every connection was accepted"
    );
    assert!(
        fds_after <= fds_before + FD_SLACK,
        "descriptors leaked: {fds_before} before, {fds_after} after"
    );
    // Bounded: a few KiB a waiting connection, never megabytes.
    assert!(
        rss_peak.saturating_sub(rss_before) < 40 * total as u64,
        "RSS grew {} KiB for {total} connections",
        rss_peak - rss_before,
    );
}
