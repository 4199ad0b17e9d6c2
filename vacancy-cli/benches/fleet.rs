//! The fleet benchmark (issue 21; by hand, prints numbers):
//!
//! ```text
//! cargo bench -p vacancy-cli --bench fleet            # the full run, ~3 minutes
//! cargo bench -p vacancy-cli --bench fleet -- --test  # one short round (scripts/test)
//! ```
//!
//! 1. Throughput of borrowed jobs with 1, 2 and 3 lenders behind HAProxy
//!    (`scripts/fleet-demo`, i.e. docs/fleet/haproxy.cfg) under 12 borrowers,
//!    each lender lending a fixed-time upstream (every job takes the same
//!    wall time and no CPU, so the two-core machine's CPU is not what is
//!    measured) through a counting shim. A borrower sends a job, sends the
//!    next after a think time (`VACANCY_FLEET_THINK_MS`, default 0), and
//!    after a refusal waits as told (`Retry-After`, else 1 s). Printed: jobs
//!    per second, the scaling ratio 3 lenders / 1 lender (target >= 2.7),
//!    double lends (two jobs on one upstream at once; must be 0), and the
//!    share of borrower requests answered 503 while some lender admitted
//!    (target 0), two ways: by the lenders' own decision, their health
//!    routes asked right after the 503 arrived (this also counts a job that
//!    ended between a lender's refusal and the question); and by the
//!    upstreams, one of which ran no job from the request's sending to its
//!    answer (this also counts a lender that had admitted a job it had not
//!    yet forwarded, e.g. in the first burst).
//! 2. The health route's cost: `GET /health/upstreams/llama` on keep-alive
//!    connections (requests per second, the lender's CPU per request), and
//!    an HAProxy with 100 checked servers at the configuration's interval
//!    (checks per second, CPU on both sides per check), for docs/fleet.md's
//!    numbers at 100 and 10,000 lenders.
//!
//! Sizes: `VACANCY_FLEET_BORROWERS` (12), `VACANCY_FLEET_SECONDS` (40 per
//! fleet), `VACANCY_FLEET_JOB_MS` (1000), `VACANCY_FLEET_THINK_MS` (0).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use vacancy_test_support::fleet::fleet_haproxy_cfg;
use vacancy_test_support::{
    CountingShim, FixedTimeUpstream, FleetDemo, ManagedProcess, Record, free_port, http_request,
};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One borrower request as the borrower saw it.
struct Seen {
    sent: Instant,
    answered: Instant,
    status: u16,
    code: String,
    /// For a 503: whether some lender's health route said admitting when
    /// asked right after the answer.
    free_after: bool,
}

/// One fleet's run.
struct Run {
    lenders: usize,
    seconds: f64,
    seen: Vec<Seen>,
    records: Vec<Vec<Record>>,
}

impl Run {
    fn jobs(&self) -> usize {
        self.seen.iter().filter(|s| s.status == 200).count()
    }

    fn throughput(&self) -> f64 {
        self.jobs() as f64 / self.seconds
    }

    /// Pairs of jobs that ran on one upstream at once.
    fn double_lends(&self) -> usize {
        let mut pairs = 0;
        for records in &self.records {
            for (i, a) in records.iter().enumerate() {
                for b in &records[i + 1..] {
                    if overlaps(a, b.started, b.ended) {
                        pairs += 1;
                    }
                }
            }
        }
        pairs
    }

    /// Requests answered 503 although some lender admitted: by the lenders'
    /// own decision (a health route said admitting right after the answer),
    /// and by their upstreams (one ran no job from the request's sending to
    /// its answer; this one also counts a lender that had admitted a job
    /// not yet forwarded, e.g. in the first burst).
    fn refused_while_free(&self) -> (usize, usize) {
        let idle_during = |from: Instant, to: Instant| {
            self.records
                .iter()
                .any(|rs| !rs.iter().any(|r| overlaps(r, from, Some(to))))
        };
        let refused = self.seen.iter().filter(|s| s.status == 503);
        let by_sign = refused.clone().filter(|s| s.free_after).count();
        let by_upstream = refused.filter(|s| idle_during(s.sent, s.answered)).count();
        (by_sign, by_upstream)
    }

    fn other(&self) -> Vec<String> {
        let mut other: Vec<String> = self
            .seen
            .iter()
            .filter(|s| s.status != 200 && !(s.status == 503 && s.code == "resource_busy"))
            .map(|s| format!("{} {}", s.status, s.code))
            .collect();
        other.sort();
        other.dedup();
        other
    }
}

/// Whether record `r` ran at some instant of `[from, to]` (`to` None: still open).
fn overlaps(r: &Record, from: Instant, to: Option<Instant>) -> bool {
    let r_end_after_from = r.ended.is_none_or(|e| e > from);
    let r_start_before_to = to.is_none_or(|t| r.started < t || (r.started == t && from == t));
    r_end_after_from && r_start_before_to
}

/// Whether some lender's health route says admitting now.
async fn some_lender_admits(signs: &[String]) -> bool {
    let answers: Vec<_> = signs
        .iter()
        .map(|url| {
            let url = url.clone();
            tokio::spawn(async move { http_request("GET", &url, &[], Vec::new()).await })
        })
        .collect();
    let mut admits = false;
    for a in answers {
        admits |= matches!(a.await, Ok(Ok(r)) if r.status == 200);
    }
    admits
}

async fn borrower(
    url: String,
    signs: Arc<Vec<String>>,
    think: Duration,
    until: Instant,
) -> Vec<Seen> {
    let body = br#"{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;
    let mut seen = Vec::new();
    while Instant::now() < until {
        let sent = Instant::now();
        let reply = http_request(
            "POST",
            &url,
            &[("content-type", "application/json")],
            body.to_vec(),
        )
        .await;
        let answered = Instant::now();
        let (status, code, wait) = match reply {
            Ok(r) => {
                let code = r
                    .json()
                    .ok()
                    .and_then(|j| j["error"]["code"].as_str().map(str::to_owned))
                    .unwrap_or_default();
                let wait = r
                    .headers
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .map_or(Duration::from_secs(1), Duration::from_secs);
                (r.status, code, wait)
            }
            Err(e) => (0, e.to_string(), Duration::from_secs(1)),
        };
        let free_after = status == 503 && some_lender_admits(&signs).await;
        seen.push(Seen {
            sent,
            answered,
            status,
            code,
            free_after,
        });
        let pause = if status == 200 { think } else { wait };
        tokio::time::sleep_until((Instant::now() + pause).min(until).into()).await;
    }
    seen
}

fn run_fleet(lenders: usize, borrowers: u64, seconds: u64, job: Duration, think: Duration) -> Run {
    let upstreams: Vec<FixedTimeUpstream> = (0..lenders)
        .map(|_| FixedTimeUpstream::start(job).unwrap())
        .collect();
    let shims: Vec<CountingShim> = upstreams
        .iter()
        .map(|u| CountingShim::start(u.addr()).unwrap())
        .collect();
    let urls: Vec<String> = shims.iter().map(CountingShim::base_url).collect();
    let fleet =
        FleetDemo::start(Path::new(env!("CARGO_BIN_EXE_vacancyd")), "openai", &urls).unwrap();
    let url = fleet.url("/v1/chat/completions").unwrap();
    let signs: Arc<Vec<String>> = Arc::new(
        (1..=lenders)
            .map(|n| format!("{}/health/upstreams/llama", fleet.control(n).unwrap()))
            .collect(),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let seen = runtime.block_on(async {
        let tasks: Vec<_> = (0..borrowers)
            .map(|_| tokio::spawn(borrower(url.clone(), Arc::clone(&signs), think, until)))
            .collect();
        let mut seen = Vec::new();
        for t in tasks {
            seen.extend(t.await.unwrap());
        }
        seen
    });
    let elapsed = started.elapsed().as_secs_f64();
    let records = shims
        .iter()
        .map(|s| {
            s.records()
                .into_iter()
                .filter(|r| r.method == "POST")
                .collect()
        })
        .collect();
    Run {
        lenders,
        seconds: elapsed,
        seen,
        records,
    }
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start at ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 here.
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    let hz = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(100.0);
    ticks / hz
}

/// Requests per second and lender CPU microseconds per request of the health
/// route on `connections` keep-alive connections for `seconds`.
fn health_rate(control: &str, pid: &str, connections: usize, seconds: u64) -> (f64, f64) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let url: hyper::Uri = format!("{control}/health/upstreams/llama").parse().unwrap();
    let cpu0 = cpu_seconds(pid);
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let total = runtime.block_on(async {
        let client: Arc<Client<_, Empty<Bytes>>> =
            Arc::new(Client::builder(TokioExecutor::new()).build_http());
        let tasks: Vec<_> = (0..connections)
            .map(|_| {
                let (client, url) = (Arc::clone(&client), url.clone());
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while Instant::now() < until {
                        let resp = client.get(url.clone()).await.unwrap();
                        let _ = resp.into_body().collect().await.unwrap();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        total
    });
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - cpu0;
    (total as f64 / elapsed, cpu / total as f64 * 1e6)
}

/// An HAProxy checking `servers` copies of one lender with the tested
/// configuration's check (interval, request, expectation) for `seconds`,
/// counted by a shim in front of the lender's control listener: checks per
/// second, and HAProxy's and the lender's CPU microseconds per check.
fn check_load(control: &str, lender_pid: &str, servers: usize, seconds: u64) -> (f64, f64, f64) {
    let tested = std::fs::read_to_string(fleet_haproxy_cfg()).unwrap();
    let line = |prefix: &str| {
        tested
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("docs/fleet/haproxy.cfg has no {prefix} line"))
            .to_owned()
    };
    let addr: std::net::SocketAddr = control.trim_start_matches("http://").parse().unwrap();
    let shim = CountingShim::start(addr).unwrap();
    let stats = free_port().unwrap();
    let mut cfg = format!(
        "global\n    log stdout local0 notice\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n    {}\nlisten stats\n    bind 127.0.0.1:{stats}\n    stats enable\n    stats uri /stats\nbackend llama\n    option httpchk\n    {}\n    {}\n    {}\n",
        line("timeout check"),
        line("http-check send"),
        line("http-check expect"),
        line("default-server"),
    );
    for i in 0..servers {
        cfg.push_str(&format!(
            "    server s{i} 127.0.0.1:1 port {}\n",
            shim.addr().port()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checks.cfg");
    std::fs::write(&path, cfg).unwrap();
    let mut cmd = Command::new("haproxy");
    cmd.arg("-db")
        .arg("-f")
        .arg(&path)
        .env("VACANCY_READ_TOKEN", "");
    let mut haproxy = ManagedProcess::spawn("haproxy-checks", cmd).unwrap();
    haproxy
        .wait_http_ok(
            &format!("http://127.0.0.1:{stats}/stats"),
            Duration::from_secs(10),
        )
        .unwrap();
    // Let the checks spread out over the interval, then measure.
    std::thread::sleep(Duration::from_secs(2));
    let hpid = haproxy.pid().to_string();
    let (h0, l0, n0) = (
        cpu_seconds(&hpid),
        cpu_seconds(lender_pid),
        shim.records().len(),
    );
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    let checks = (shim.records().len() - n0) as f64;
    let elapsed = t.elapsed().as_secs_f64();
    let (h, l) = (cpu_seconds(&hpid) - h0, cpu_seconds(lender_pid) - l0);
    let _ = haproxy.terminate(Duration::from_secs(5));
    (checks / elapsed, h / checks * 1e6, l / checks * 1e6)
}

fn health_cost(seconds: u64) {
    let upstream = FixedTimeUpstream::start(Duration::from_millis(10)).unwrap();
    let fleet = FleetDemo::start(
        Path::new(env!("CARGO_BIN_EXE_vacancyd")),
        "openai",
        &[upstream.base_url()],
    )
    .unwrap();
    let control = fleet.control(1).unwrap().to_owned();
    let pid = fleet.var("LENDER1_PID").unwrap().to_owned();
    for connections in [1, 4] {
        let (rate, cpu) = health_rate(&control, &pid, connections, seconds);
        println!(
            "health route, {connections} keep-alive connection(s): {rate:.0} requests/s, lender CPU {cpu:.1} us per request"
        );
    }
    let servers = 100;
    let (rate, haproxy_us, lender_us) = check_load(&control, &pid, servers, seconds);
    println!(
        "HAProxy checking {servers} servers ({}): {rate:.0} checks/s; CPU per check: HAProxy {haproxy_us:.1} us, lender {lender_us:.1} us (a new TCP connection each)",
        std::fs::read_to_string(fleet_haproxy_cfg())
            .unwrap()
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("default-server"))
            .unwrap_or_default()
    );
}

fn main() {
    let test_mode = std::env::args().any(|a| a == "--test");
    let borrowers = env_or("VACANCY_FLEET_BORROWERS", 12);
    let seconds = env_or("VACANCY_FLEET_SECONDS", if test_mode { 5 } else { 40 });
    let job = Duration::from_millis(env_or("VACANCY_FLEET_JOB_MS", 1000));
    let think = Duration::from_millis(env_or("VACANCY_FLEET_THINK_MS", 0));
    let fleets: &[usize] = if test_mode { &[3] } else { &[1, 2, 3] };

    println!(
        "fleet benchmark: {borrowers} borrowers thinking {} ms between jobs, {seconds} s per fleet, every job {} ms (fixed-time upstream), HAProxy {}",
        think.as_millis(),
        job.as_millis(),
        haproxy_version()
    );
    let mut runs = Vec::new();
    for &lenders in fleets {
        let run = run_fleet(lenders, borrowers, seconds, job, think);
        let refused = run.seen.iter().filter(|s| s.status == 503).count();
        let (by_sign, by_upstream) = run.refused_while_free();
        let share = |n: usize| 100.0 * n as f64 / run.seen.len().max(1) as f64;
        println!(
            "{} lender(s): {} jobs in {:.1} s = {:.2} jobs/s (ideal {:.2}); {} borrower requests, {refused} answered 503; double lends {}; 503 while some lender admitted: {by_sign} ({:.2} %) by the lenders' signs right after the answer, {by_upstream} ({:.2} %) by an upstream idle the whole request; other answers: {:?}",
            run.lenders,
            run.jobs(),
            run.seconds,
            run.throughput(),
            run.lenders as f64 / job.as_secs_f64(),
            run.seen.len(),
            run.double_lends(),
            share(by_sign),
            share(by_upstream),
            run.other(),
        );
        assert_eq!(
            run.double_lends(),
            0,
            "two jobs ran on one upstream at once"
        );
        runs.push(run);
    }
    if let (Some(one), Some(three)) = (
        runs.iter().find(|r| r.lenders == 1),
        runs.iter().find(|r| r.lenders == 3),
    ) {
        println!(
            "scaling 3 lenders / 1 lender: {:.2}x (target >= 2.7x)",
            three.throughput() / one.throughput()
        );
    }
    health_cost(if test_mode { 1 } else { 5 });
}

fn haproxy_version() -> String {
    Command::new("haproxy")
        .arg("-v")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(2)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "?".to_owned())
}
