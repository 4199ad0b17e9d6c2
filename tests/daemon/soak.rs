//! The soak (issue 18 item 5), run by `scripts/soak [MINUTES]`: one vacancyd
//! in front of a real llama-server (the tiny model, through a counting shim)
//! and a ComfyUI emulator, for `VACANCY_SOAK_MINUTES` (default 2). Borrowers
//! with think time complete on llama-server and submit prompts to ComfyUI;
//! the owner comes and goes through the manual presence backend, so drains
//! finish, are cut at their deadline and stand down; an operator releases
//! held work once its upstream is idle (HELD-04); idle and slow
//! connections come and go as the daemon times them out. Every
//! `VACANCY_SOAK_SAMPLE_S` seconds (default 60) it prints the daemon's RSS,
//! open descriptors, CPU and the engine's entry counts.
//!
//! Passes when, after the first sample (the warm-up), RSS grew less than
//! 5 MiB; the descriptors stayed within the connection lane's churn and came
//! back to where they started once the borrowers left; no upstream ever ran
//! two borrowed jobs at once (the shim's intervals, the emulator's queue);
//! and every reservation is accounted for at the end: the admissions the
//! daemon counted are the ones borrowers were answered for, and what is
//! left is held, with a reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Daemon, JSON, Rng, completion, describe_fds, fds, rss_kib, write_capacity};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use vacancy_test_support::{
    ComfyEmulator, ComfyEmulatorOptions, CountingShim, LlamaOptions, LlamaServer, Record,
    free_port, http_request, http_stream, prompt_request, simple_workflow,
};

const OWNER: &str = "soak-owner-token";
const ADMIN: &str = "soak-admin-token";

/// What the borrowers saw, counted as they go.
#[derive(Default)]
struct Seen {
    /// Answers that say the request was admitted (200, or an upstream
    /// failure after admission: 502, 504).
    admitted: AtomicU64,
    /// Refusals (503, 429).
    refused: AtomicU64,
    /// Admitted requests a reclaim cut before their reply: the borrower is
    /// answered 503 with the reclaim's reason ("... was cancelled to give
    /// the machine back to its owner ...").
    cut: AtomicU64,
    /// Requests that got no answer at all.
    unanswered: AtomicU64,
    /// Times the emulator held two borrowed prompts at once.
    comfy_double: AtomicU64,
    /// Held entries the operator released once the upstream was idle.
    released_held: AtomicU64,
}

impl Seen {
    fn count(&self, status: Option<u16>, body: &[u8]) {
        let cut = String::from_utf8_lossy(body).contains("was cancelled to give the machine back");
        let counter = match status {
            Some(200 | 502 | 504) => &self.admitted,
            Some(503) if cut => &self.cut,
            Some(503 | 429) => &self.refused,
            Some(other) => panic!("a borrower was answered {other}"),
            None => &self.unanswered,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// User plus system CPU time of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command's closing parenthesis; utime and stime
    // are the 14th and 15th of the line.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The sum of every sample of `metric` in the daemon's exposition.
async fn metric_sum(control: &str, metric: &str) -> f64 {
    let text = http_request("GET", &format!("{control}/metrics"), &[], Vec::new())
        .await
        .unwrap()
        .text();
    text.lines()
        .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn presence(control: &str, present: bool) {
    let r = http_request(
        "POST",
        &format!("{control}/admin/owner"),
        &[
            JSON,
            ("authorization", &format!("Bearer {OWNER}")),
            ("vacancy-intent", "presence"),
        ],
        json!({ "present": present }).to_string().into_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

fn is_work(r: &Record) -> bool {
    r.method == "POST" && r.path == "/completion"
}

/// A borrower on llama-server: a completion of 4–64 tokens, streamed or
/// not, then 50–500 ms of thought.
async fn llama_borrower(url: String, seen: Arc<Seen>, stop: Arc<AtomicBool>, seed: u64) {
    let mut rng = Rng(seed);
    while !stop.load(Ordering::Relaxed) {
        let tokens = 4 + rng.below(60) as u32;
        let stream = rng.below(2) == 0;
        let body = completion(tokens, stream);
        let (status, text) = if stream {
            match http_stream("POST", &url, &[JSON], body).await {
                Ok(mut s) => {
                    let mut text = Vec::new();
                    while let Some(Ok(c)) = s.next_chunk().await {
                        if s.status != 200 {
                            text.extend_from_slice(&c.data);
                        }
                    }
                    (Some(s.status), text)
                }
                Err(_) => (None, Vec::new()),
            }
        } else {
            match http_request("POST", &url, &[JSON], body).await {
                Ok(r) => (Some(r.status), r.body.to_vec()),
                Err(_) => (None, Vec::new()),
            }
        };
        seen.count(status, &text);
        tokio::time::sleep(Duration::from_millis(50 + rng.below(450))).await;
    }
}

/// A borrower on ComfyUI: a prompt, its history polled until it is done,
/// then up to a second of thought. After each admission the emulator must
/// hold no other borrowed prompt.
async fn comfy_borrower(
    proxy: String,
    comfy: Arc<ComfyEmulator>,
    seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
) {
    let mut rng = Rng(0x00c0_ffee);
    let mut color = 0u32;
    while !stop.load(Ordering::Relaxed) {
        color += 1;
        let r = http_request(
            "POST",
            &format!("{proxy}/prompt"),
            &[JSON],
            prompt_request(simple_workflow(color), None)
                .to_string()
                .into_bytes(),
        )
        .await
        .ok();
        seen.count(
            r.as_ref().map(|r| r.status),
            r.as_ref().map_or(&[][..], |r| &r.body[..]),
        );
        if let Some(r) = r.filter(|r| r.status == 200) {
            let queued = comfy.pending().len() + usize::from(comfy.running().is_some());
            if queued > 1 {
                seen.comfy_double.fetch_add(1, Ordering::Relaxed);
            }
            let id = r.json().unwrap()["prompt_id"].as_str().unwrap().to_owned();
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                let h = http_request("GET", &format!("{proxy}/history/{id}"), &[], Vec::new())
                    .await
                    .ok()
                    .and_then(|h| h.json().ok());
                if h.is_some_and(|h: Value| h.get(&id).is_some()) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.below(1000))).await;
    }
}

/// A connection that sends nothing (`slow`: a head a byte a second) until the
/// daemon closes it, then another.
async fn lingering_connection(addr: String, slow: bool, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(&addr).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if slow {
            for b in b"POST /completion HTTP/1.1\r\nhost: x\r\n".iter().cycle() {
                if stop.load(Ordering::Relaxed) || s.write_all(&[*b]).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        } else {
            let mut buf = [0u8; 64];
            loop {
                tokio::select! {
                    r = s.read(&mut buf) => if matches!(r, Ok(0) | Err(_)) { break },
                    () = tokio::time::sleep(Duration::from_millis(200)) => {
                        if stop.load(Ordering::Relaxed) { break }
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The owner comes back for 1–4 s every 5–15 s: drains that finish in
/// time, drains cut at their 2 s deadline, and stand-downs when the owner
/// leaves before it.
async fn owner(control: String, stop: Arc<AtomicBool>) {
    let mut rng = Rng(0x0_0a11);
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(5_000 + rng.below(10_000))).await;
        presence(&control, true).await;
        tokio::time::sleep(Duration::from_millis(1_000 + rng.below(3_000))).await;
        presence(&control, false).await;
    }
}

/// The operator (HELD-04): every 5 s, each held entry whose upstream is
/// idle (llama-server's slots, read directly; the emulator's queue) is
/// released as an administrator. A drain cut before a non-streamed reply
/// leaves llama-server generating until its end, so under load the daemon
/// cannot always prove the stop within its verification window, and holds.
async fn operator(
    control: String,
    llama: String,
    comfy: Arc<ComfyEmulator>,
    seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let Ok(status) = http_request("GET", &format!("{control}/status"), &[], Vec::new()).await
        else {
            continue;
        };
        let Ok(status) = status.json() else { continue };
        for w in status["work"].as_array().into_iter().flatten() {
            if w["phase"] != "held" {
                continue;
            }
            let idle = if w["upstream"] == "llama" {
                let slots = http_request("GET", &format!("{llama}/slots"), &[], Vec::new())
                    .await
                    .ok()
                    .and_then(|r| r.json().ok());
                slots.is_some_and(|v: Value| {
                    v.as_array().is_some_and(|slots| {
                        slots.iter().all(|s| s["is_processing"] == json!(false))
                    })
                })
            } else {
                comfy.running().is_none() && comfy.pending().is_empty()
            };
            let Some(id) = w["id"].as_str().filter(|_| idle) else {
                continue;
            };
            let r = http_request(
                "POST",
                &format!("{control}/admin/work/{id}/release"),
                &[
                    JSON,
                    ("authorization", &format!("Bearer {ADMIN}")),
                    ("vacancy-intent", "release_work"),
                ],
                br#"{"upstream_stopped": true}"#.to_vec(),
            )
            .await;
            if r.is_ok_and(|r| r.status == 200) {
                seen.released_held.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

struct Sample {
    minute: f64,
    rss_kib: u64,
    fds: usize,
    cpu_pct: f64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak: run by scripts/soak [MINUTES] (scripts/test runs 2 minutes)"]
async fn soak_keeps_memory_descriptors_and_reservations_steady() {
    let minutes = env_u64("VACANCY_SOAK_MINUTES", 2).max(2);
    let every = Duration::from_secs(env_u64("VACANCY_SOAK_SAMPLE_S", 60).max(1));
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let shim = CountingShim::start(llama.addr()).unwrap();
    let comfy = Arc::new(
        ComfyEmulator::start(ComfyEmulatorOptions {
            run_time: Duration::from_millis(300),
            ..ComfyEmulatorOptions::default()
        })
        .unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let control = free_port().unwrap();
    let (llama_port, comfy_port) = (free_port().unwrap(), free_port().unwrap());
    let mut resources = String::new();
    for name in ["gpu0", "gpu1"] {
        let path = dir.path().join(format!("{name}.json"));
        write_capacity(&path, 40_000, 64_000);
        resources.push_str(&format!(
            "[[resource]]\nname = \"{name}\"\nkind = \"gpu\"\nsampler = \"file\"\npath = \"{}\"\nreserve_mib = 1000\npoll_ms = 1000\n\n",
            path.display()
        ));
    }
    let config = format!(
        r#"[server]
listen = "127.0.0.1:{control}"
header_timeout_s = 5
idle_timeout_s = 5

[[server.token]]
name = "desk"
scopes = ["owner"]
sha256 = "{owner}"

[[server.token]]
name = "ops"
scopes = ["admin"]
sha256 = "{admin}"

[owner]
presence = "manual"

{resources}
[[upstream]]
name = "llama"
adapter = "llamacpp"
listen = "127.0.0.1:{llama_port}"
target = "{llama}"
resource = "gpu0"
default_min_free_mib = 1000
on_owner_return = "drain"
drain_timeout_s = 2

[[upstream]]
name = "comfy"
adapter = "comfyui"
listen = "127.0.0.1:{comfy_port}"
target = "{comfy}"
resource = "gpu1"
default_min_free_mib = 1000
on_owner_return = "drain"
drain_timeout_s = 2
"#,
        owner = vacancy::auth::hash_token(OWNER),
        admin = vacancy::auth::hash_token(ADMIN),
        llama = shim.base_url(),
        comfy = comfy.base_url(),
    );
    let path = dir.path().join("vacancyd.toml");
    std::fs::write(&path, config).unwrap();
    let d = Daemon::start_with(dir, &path, control, llama_port);
    let pid = d.process.pid();
    presence(&d.control, false).await;
    let fds_start = fds(pid);

    let seen = Arc::new(Seen::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut lanes = Vec::new();
    for seed in 1..=4u64 {
        lanes.push(tokio::spawn(llama_borrower(
            format!("{}/completion", d.proxy),
            Arc::clone(&seen),
            Arc::clone(&stop),
            seed * 0x9e37_79b9,
        )));
    }
    lanes.push(tokio::spawn(comfy_borrower(
        format!("http://127.0.0.1:{comfy_port}"),
        Arc::clone(&comfy),
        Arc::clone(&seen),
        Arc::clone(&stop),
    )));
    for i in 0..50 {
        let addr = format!(
            "127.0.0.1:{}",
            if i % 2 == 0 { llama_port } else { comfy_port }
        );
        lanes.push(tokio::spawn(lingering_connection(
            addr,
            i % 5 == 0,
            Arc::clone(&stop),
        )));
    }
    lanes.push(tokio::spawn(owner(d.control.clone(), Arc::clone(&stop))));
    lanes.push(tokio::spawn(operator(
        d.control.clone(),
        llama.base_url(),
        Arc::clone(&comfy),
        Arc::clone(&seen),
        Arc::clone(&stop),
    )));

    let started = Instant::now();
    let ticks_per_s = 100.0; // USER_HZ on Linux
    let (mut last_ticks, mut last_at) = (cpu_ticks(pid), Instant::now());
    let mut samples: Vec<Sample> = Vec::new();
    let mut max_llama = 0usize;
    println!("soak: {minutes} min, a sample every {} s", every.as_secs());
    println!(
        "{:>7} {:>9} {:>5} {:>6} {:>6} {:>5} {:>9} {:>10} {:>8} {:>8} {:>7}",
        "minute",
        "RSS MiB",
        "fds",
        "CPU %",
        "active",
        "held",
        "released",
        "admitted",
        "refused",
        "reclaims",
        "double"
    );
    while started.elapsed() < Duration::from_secs(minutes * 60) {
        let left = Duration::from_secs(minutes * 60).saturating_sub(started.elapsed());
        tokio::time::sleep(every.min(left)).await;
        let ticks = cpu_ticks(pid);
        let cpu_pct =
            (ticks - last_ticks) as f64 / ticks_per_s / last_at.elapsed().as_secs_f64() * 100.0;
        (last_ticks, last_at) = (ticks, Instant::now());
        let s = d.status().await;
        let work = s["work"].as_array().unwrap();
        let held = work.iter().filter(|w| w["phase"] == "held").count();
        let double = shim.max_concurrency_where(is_work);
        max_llama = max_llama.max(double);
        shim.clear();
        let sample = Sample {
            minute: started.elapsed().as_secs_f64() / 60.0,
            rss_kib: rss_kib(pid),
            fds: fds(pid),
            cpu_pct,
        };
        println!(
            "{:>7.2} {:>9.1} {:>5} {:>6.1} {:>6} {:>5} {:>9} {:>10} {:>8} {:>8} {:>7}",
            sample.minute,
            sample.rss_kib as f64 / 1024.0,
            sample.fds,
            sample.cpu_pct,
            work.len() - held,
            held,
            seen.released_held.load(Ordering::Relaxed),
            metric_sum(&d.control, "vacancyd_admissions_total").await,
            seen.refused.load(Ordering::Relaxed),
            metric_sum(&d.control, "vacancyd_reclaims_total").await,
            u64::from(double > 1) + seen.comfy_double.load(Ordering::Relaxed),
        );
        samples.push(sample);
    }

    // The borrowers leave; whatever they started ends.
    stop.store(true, Ordering::Relaxed);
    for lane in lanes {
        lane.await.unwrap();
    }
    presence(&d.control, false).await;
    let end = d
        .wait_status_within("the daemon quiet", Duration::from_secs(60), |s| {
            s["reclaims"].as_array().unwrap().is_empty()
                && s["work"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|w| w["phase"] == "held")
        })
        .await;
    // Reads keep upstream connections in the read pool until they have been
    // idle for its IDLE (the ComfyUI emulator never closes one itself).
    let quiet_at = Instant::now();
    let deadline = quiet_at + vacancy::shell::upstream::pool::IDLE + Duration::from_secs(10);
    while fds(pid) > fds_start && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fds_end = fds(pid);
    let fds_back_after = quiet_at.elapsed();
    let admitted_daemon = metric_sum(&d.control, "vacancyd_admissions_total").await as u64;
    let admitted = seen.admitted.load(Ordering::Relaxed) + seen.cut.load(Ordering::Relaxed);
    let unanswered = seen.unanswered.load(Ordering::Relaxed);
    let held: Vec<&Value> = end["work"].as_array().unwrap().iter().collect();

    let warm = &samples[0];
    let last = samples.last().unwrap();
    let growth_kib = last.rss_kib as i64 - warm.rss_kib as i64;
    let (fds_min, fds_max) = samples[1..]
        .iter()
        .fold((warm.fds, warm.fds), |(lo, hi), s| {
            (lo.min(s.fds), hi.max(s.fds))
        });
    println!(
        "soak over: RSS {:.1} MiB after warm-up, {:.1} MiB at the end ({:+.2} MiB); descriptors {fds_start} at the start, {fds_min}..{fds_max} under load, {fds_end} at the end ({:.1} s after the daemon was quiet); \
         CPU {:.1} % at the first sample, {:.1} % at the last; admitted {admitted_daemon} (borrowers were answered for {admitted}, {} of them cut by a reclaim before the reply; {unanswered} unanswered), refused {}; held work released by the operator {}; \
         llama's most borrowed jobs at once {max_llama}, ComfyUI's doubles {}; held at the end {}",
        warm.rss_kib as f64 / 1024.0,
        last.rss_kib as f64 / 1024.0,
        growth_kib as f64 / 1024.0,
        fds_back_after.as_secs_f64(),
        warm.cpu_pct,
        last.cpu_pct,
        seen.cut.load(Ordering::Relaxed),
        seen.refused.load(Ordering::Relaxed),
        seen.released_held.load(Ordering::Relaxed),
        seen.comfy_double.load(Ordering::Relaxed),
        held.len(),
    );

    assert!(
        growth_kib < 5 * 1024,
        "RSS grew {growth_kib} KiB after the warm-up"
    );
    assert!(
        fds_max - fds_min <= 64,
        "descriptors drifted under load: {fds_min}..{fds_max}"
    );
    assert!(
        fds_end <= fds_start,
        "descriptors leaked: {fds_start} at the start, {fds_end} at the end; they are:\n{}",
        describe_fds(pid)
    );
    assert!(
        max_llama <= 1,
        "llama-server ran {max_llama} borrowed jobs at once"
    );
    assert_eq!(
        seen.comfy_double.load(Ordering::Relaxed),
        0,
        "ComfyUI held two borrowed prompts"
    );
    assert!(
        admitted <= admitted_daemon && admitted_daemon <= admitted + unanswered,
        "the daemon admitted {admitted_daemon}; borrowers were answered for {admitted} ({unanswered} unanswered)"
    );
    for w in &held {
        assert!(
            w["held_reason"].as_str().is_some_and(|r| !r.is_empty()),
            "a held entry without a reason: {w:#}"
        );
    }
    assert!(samples.len() >= 2, "at least a warm-up and one more sample");
}
