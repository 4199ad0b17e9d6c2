//! A fleet of lenders behind HAProxy (issue 21): `scripts/fleet-demo` runs
//! `docs/fleet/haproxy.cfg` — the configuration docs/fleet.md shows — in
//! front of three vacancyd, each lending its own real llama-server (tiny
//! model, one thread) through a counting shim. Also the load balancers'
//! health route `/health/upstreams/<name>` and the `vacancy-retry-elsewhere`
//! header, through a real vacancyd.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Daemon, JSON, completion, write_capacity};
use serde_json::json;
use vacancy_test_support::fleet::{STATS_REDISPATCHES, STATS_RETRIES, fleet_haproxy_cfg};
use vacancy_test_support::{
    CountingShim, FleetDemo, HttpReply, HttpStream, LlamaOptions, LlamaServer, TinyModel,
    free_port, http_request, http_stream,
};

const OWNER: &str = "fleet-test-owner-token";
const READ: &str = "fleet-test-read-token";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The work requests an upstream saw.
fn work(shim: &CountingShim) -> usize {
    shim.records()
        .iter()
        .filter(|r| r.path == "/completion")
        .count()
}

fn most_at_once(shim: &CountingShim) -> usize {
    shim.max_concurrency_where(|r| r.path == "/completion")
}

/// A model slow enough (about 0.8 s for 32 tokens on one thread) that three
/// jobs started together overlap.
fn slow_llama() -> LlamaServer {
    LlamaServer::start(LlamaOptions {
        model: TinyModel {
            layers: 8,
            embd: 1024,
            seed: 1,
        },
        threads: 1,
        ..LlamaOptions::default()
    })
    .unwrap()
}

fn header<'a>(r: &'a HttpReply, name: &str) -> Option<&'a str> {
    r.headers.get(name).and_then(|v| v.to_str().ok())
}

/// The health check interval of the tested configuration (`inter 250ms`).
fn check_interval() -> Duration {
    let cfg = std::fs::read_to_string(fleet_haproxy_cfg()).unwrap();
    let inter = cfg
        .split_whitespace()
        .skip_while(|w| *w != "inter")
        .nth(1)
        .expect("docs/fleet/haproxy.cfg sets a check interval (inter)");
    match inter.strip_suffix("ms") {
        Some(ms) => Duration::from_millis(ms.parse().unwrap()),
        None => Duration::from_secs(inter.trim_end_matches('s').parse().unwrap()),
    }
}

/// Three lenders behind HAProxy (`scripts/fleet-demo`), each in front of its
/// own real llama-server through a counting shim.
struct Fleet {
    demo: FleetDemo,
    shims: Vec<CountingShim>,
    _llamas: Vec<LlamaServer>,
}

impl Fleet {
    fn start() -> Fleet {
        let llamas: Vec<LlamaServer> = (0..3).map(|_| slow_llama()).collect();
        let shims: Vec<CountingShim> = llamas
            .iter()
            .map(|l| CountingShim::start(l.addr()).unwrap())
            .collect();
        let urls: Vec<String> = shims.iter().map(CountingShim::base_url).collect();
        let demo = FleetDemo::start(vacancy_test_support::vacancyd(), "llamacpp", &urls).unwrap();
        Fleet {
            demo,
            shims,
            _llamas: llamas,
        }
    }

    /// A borrower's `/completion` through HAProxy.
    async fn borrow(&self, n_predict: u32) -> HttpReply {
        http_request(
            "POST",
            &self.demo.url("/completion").unwrap(),
            &[JSON],
            completion(n_predict, false),
        )
        .await
        .unwrap()
    }

    /// Wait (bounded) until HAProxy shows `server` as `want`; how long it took.
    async fn wait_server(&self, server: &str, want: &str) -> Duration {
        let t = Instant::now();
        loop {
            let status = self.demo.server_status(server).await.unwrap();
            if status.starts_with(want) {
                return t.elapsed();
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "HAProxy shows {server} {status:?}, not {want}, after 10 s:\n{}",
                self.demo.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `vacancyd_refusals_total` of lender `n`, all codes.
    async fn refusals(&self, n: usize) -> f64 {
        let url = format!("{}/metrics", self.demo.control(n).unwrap());
        let m = http_request("GET", &url, &[], Vec::new())
            .await
            .unwrap()
            .text();
        m.lines()
            .filter(|l| l.starts_with("vacancyd_refusals_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// HAProxy's retries and redispatches of backend `llama` so far.
    async fn retries(&self) -> (u64, u64) {
        let stats = self.demo.stats().await.unwrap();
        let backend = &stats["BACKEND"];
        let n = |i: usize| backend[i].parse().unwrap_or(0);
        (n(STATS_RETRIES), n(STATS_REDISPATCHES))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_lends_each_job_to_a_free_lender_drops_a_reclaimed_one_and_passes_on_busy() {
    // Issue 21: the behaviour test of the fleet.
    let fleet = Fleet::start();

    // Three borrowers at once: three 200s, one on each machine.
    let (a, b, c) = tokio::join!(fleet.borrow(32), fleet.borrow(32), fleet.borrow(32));
    for r in [a, b, c] {
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for (i, shim) in fleet.shims.iter().enumerate() {
        assert_eq!(
            work(shim),
            1,
            "lender {} ran {} of the three jobs",
            i + 1,
            work(shim)
        );
    }

    // Lender 1's owner comes back: HAProxy stops sending to it within one
    // check interval (plus the check's own time, `timeout check`), and the
    // borrowers are served by the other two.
    fleet.demo.presence(1, true).await.unwrap();
    let down = fleet.wait_server("lender1", "DOWN").await;
    let interval = check_interval();
    println!(
        "lender 1 marked down {down:?} after its owner came back (check interval {interval:?})"
    );
    assert!(
        down <= interval + Duration::from_secs(1),
        "HAProxy took {down:?} to stop sending to lender 1 (check interval {interval:?})"
    );
    let (seen, refused) = (work(&fleet.shims[0]), fleet.refusals(1).await);
    for _ in 0..2 {
        let (a, b) = tokio::join!(fleet.borrow(32), fleet.borrow(32));
        assert_eq!(
            (a.status, b.status),
            (200, 200),
            "{} {}",
            a.text(),
            b.text()
        );
    }
    assert_eq!(
        work(&fleet.shims[0]),
        seen,
        "lender 1 got work while its owner was present"
    );
    assert_eq!(
        fleet.refusals(1).await,
        refused,
        "HAProxy still sent borrowers to lender 1"
    );
    fleet.demo.presence(1, false).await.unwrap();
    fleet.wait_server("lender1", "UP").await;

    // Every lender busy: a fourth borrower is tried on each and gets
    // vacancyd's own refusal.
    let mut long: Vec<HttpStream> = Vec::new();
    for n in 1..=3 {
        let url = fleet.demo.url("/completion").unwrap();
        let s = http_stream("POST", &url, &[JSON], completion(100_000, true))
            .await
            .unwrap();
        assert_eq!(s.status, 200);
        long.push(s);
        let t = Instant::now();
        while fleet
            .shims
            .iter()
            .map(CountingShim::in_flight)
            .sum::<usize>()
            < n
        {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "long job {n} never reached an upstream"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    for (i, shim) in fleet.shims.iter().enumerate() {
        assert_eq!(
            shim.in_flight(),
            1,
            "lender {} runs {} long jobs",
            i + 1,
            shim.in_flight()
        );
    }
    let before = fleet.retries().await;
    let r = fleet.borrow(8).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        r.json().unwrap()["error"]["code"],
        "resource_busy",
        "{}",
        r.text()
    );
    assert_eq!(header(&r, "retry-after"), Some("2"));
    assert_eq!(header(&r, "vacancy-retry-elsewhere"), Some("true"));
    let after = fleet.retries().await;
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (2, 2),
        "the refused borrower was tried on each lender in turn (retries, redispatches)"
    );
    drop(long);

    for (i, shim) in fleet.shims.iter().enumerate() {
        assert!(
            most_at_once(shim) <= 1,
            "lender {}'s upstream ran two jobs at once",
            i + 1
        );
    }
}

/// One vacancyd in front of `target` whose control listener takes
/// connections from other hosts too (`0.0.0.0`), with a read and an owner
/// token, manual presence (set away) and `extra` upstream lines.
async fn lender(target: &str, extra: &str) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let (control, proxy) = (free_port().unwrap(), free_port().unwrap());
    write_capacity(&dir.path().join("gpu0.json"), 20_000, 64_000);
    let config = format!(
        r#"[server]
listen = "0.0.0.0:{control}"

[[server.token]]
name = "balancer"
scopes = ["read"]
sha256 = "{read}"

[[server.token]]
name = "owner"
scopes = ["owner"]
sha256 = "{owner}"

[owner]
presence = "manual"

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
default_min_free_mib = 2000
{extra}
"#,
        read = vacancy::auth::hash_token(READ),
        owner = vacancy::auth::hash_token(OWNER),
        capacity = dir.path().join("gpu0.json").display(),
    );
    let path = dir.path().join("vacancyd.toml");
    std::fs::write(&path, config).unwrap();
    let d = Daemon::start_with(dir, &path, control, proxy);
    owner(&d, "presence", json!({"present": false})).await;
    d
}

/// An owner's admin call (`/admin/owner`, `/admin/lending`).
async fn owner(d: &Daemon, intent: &str, body: serde_json::Value) {
    let route = if intent == "presence" {
        "owner"
    } else {
        intent
    };
    let r = http_request(
        "POST",
        &format!("{}/admin/{route}", d.control),
        &[
            JSON,
            ("authorization", &format!("Bearer {OWNER}")),
            ("vacancy-intent", intent),
        ],
        body.to_string().into_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

async fn health(base: &str, name: &str, headers: &[(&str, &str)]) -> HttpReply {
    http_request(
        "GET",
        &format!("{base}/health/upstreams/{name}"),
        headers,
        Vec::new(),
    )
    .await
    .unwrap()
}

/// Wait (bounded) until the upstream's health answers `status`.
async fn wait_health(d: &Daemon, status: u16) -> HttpReply {
    let t = Instant::now();
    loop {
        let r = health(&d.control, "llama", &[]).await;
        if r.status == status {
            return r;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the health route answered {} {}, not {status}, for 15 s",
            r.status,
            r.text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// This machine's address on a non-loopback interface, as another host
/// would connect to the control listener. Connecting a UDP socket sends
/// nothing; it only picks the outgoing interface.
fn lan_address() -> std::net::IpAddr {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    socket.connect("192.0.2.1:9").expect(
        "a non-loopback route (to 192.0.2.1) to reach the control listener as another host would",
    );
    let ip = socket.local_addr().unwrap().ip();
    assert!(!ip.is_loopback(), "no non-loopback address on this machine");
    ip
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_health_route_shows_the_vacancy_sign_for_load_balancers() {
    // Issue 21 item 1: 200 while the default budget would be admitted (the
    // /status decision), else 503 with the code and its Retry-After.
    let mut llama = slow_llama();
    let d = lender(&llama.base_url(), "").await;

    let r = health(&d.control, "llama", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json().unwrap(),
        json!({"upstream": "llama", "admitting": true})
    );
    let head = http_request(
        "HEAD",
        &format!("{}/health/upstreams/llama", d.control),
        &[],
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(head.status, 200);
    let unknown = health(&d.control, "ollama", &[]).await;
    assert_eq!(unknown.status, 404, "{}", unknown.text());
    assert_eq!(unknown.json().unwrap()["error"]["code"], "not_found");

    // Busy with a job: resource_busy, Retry-After 2, as /status says.
    let proxy = d.proxy.clone();
    let job = tokio::spawn(async move {
        http_request(
            "POST",
            &format!("{proxy}/completion"),
            &[JSON],
            completion(64, false),
        )
        .await
        .unwrap()
    });
    let busy = wait_health(&d, 503).await;
    let body = busy.json().unwrap();
    assert_eq!(body["code"], "resource_busy", "{body}");
    assert_eq!(body["admitting"], false);
    assert_eq!(header(&busy, "retry-after"), Some("2"));
    let status = d.status().await;
    assert_eq!(status["upstreams"][0]["vacancy"]["code"], "resource_busy");
    assert_eq!(job.await.unwrap().status, 200);
    wait_health(&d, 200).await;

    // The owner's switches: no Retry-After, a retry within seconds cannot help.
    owner(&d, "lending", json!({"enabled": false})).await;
    let paused = health(&d.control, "llama", &[]).await;
    assert_eq!(paused.status, 503);
    assert_eq!(paused.json().unwrap()["code"], "lending_paused");
    assert_eq!(header(&paused, "retry-after"), None);
    owner(&d, "lending", json!({"enabled": true})).await;
    owner(&d, "presence", json!({"present": true})).await;
    let present = health(&d.control, "llama", &[]).await;
    assert_eq!(present.status, 503);
    assert_eq!(present.json().unwrap()["code"], "owner_present");
    owner(&d, "presence", json!({"present": false})).await;
    wait_health(&d, 200).await;

    // From another host: a read token, as for /status.
    let port = d.control.rsplit(':').next().unwrap();
    let remote = format!("http://{}:{port}", lan_address());
    let anonymous = health(&remote, "llama", &[]).await;
    assert_eq!(anonymous.status, 401, "{}", anonymous.text());
    let bearer = format!("Bearer {READ}");
    let read = health(&remote, "llama", &[("authorization", &bearer)]).await;
    assert_eq!(read.status, 200, "{}", read.text());

    // The server gone: its lender is no use to a balancer.
    llama.kill().unwrap();
    let gone = wait_health(&d, 503).await;
    assert_eq!(
        gone.json().unwrap()["code"],
        "upstream_unreachable",
        "{}",
        gone.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_says_whether_another_lender_may_take_the_request() {
    // Issue 21 item 2: vacancy-retry-elsewhere is true only on vacancyd's
    // own refusals sent before anything reached the upstream.
    let llama = slow_llama();
    let shim = CountingShim::start(llama.addr()).unwrap();
    let d = lender(&shim.base_url(), "on_owner_return = \"cancel\"").await;
    let url = format!("{}/completion", d.proxy);
    let elsewhere = |r: &HttpReply| header(r, "vacancy-retry-elsewhere").map(str::to_owned);

    // Busy: another lender may take it.
    let long = {
        let url = url.clone();
        tokio::spawn(async move {
            http_request("POST", &url, &[JSON], completion(100_000, false))
                .await
                .unwrap()
        })
    };
    let t = Instant::now();
    while work(&shim) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the long job never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let busy = http_request("POST", &url, &[JSON], completion(4, false))
        .await
        .unwrap();
    assert_eq!(busy.status, 503);
    assert_eq!(busy.json().unwrap()["error"]["code"], "resource_busy");
    assert_eq!(elsewhere(&busy).as_deref(), Some("true"));

    // The owner comes back: the long job, already at the upstream, is cut
    // (on_owner_return = "cancel") before its reply; a retry elsewhere would
    // run it twice, so it is not marked. A new request, refused before
    // forwarding, is.
    owner(&d, "presence", json!({"present": true})).await;
    let cut = long.await.unwrap();
    assert_eq!(cut.status, 503, "{}", cut.text());
    assert_eq!(cut.json().unwrap()["error"]["code"], "owner_present");
    assert_eq!(elsewhere(&cut).as_deref(), Some("false"));
    let present = http_request("POST", &url, &[JSON], completion(4, false))
        .await
        .unwrap();
    assert_eq!(present.json().unwrap()["error"]["code"], "owner_present");
    assert_eq!(elsewhere(&present).as_deref(), Some("true"));
    owner(&d, "presence", json!({"present": false})).await;

    owner(&d, "lending", json!({"enabled": false})).await;
    let paused = http_request("POST", &url, &[JSON], completion(4, false))
        .await
        .unwrap();
    assert_eq!(paused.json().unwrap()["error"]["code"], "lending_paused");
    assert_eq!(elsewhere(&paused).as_deref(), Some("true"));
    owner(&d, "lending", json!({"enabled": true})).await;

    // The borrower's own mistake would be refused anywhere.
    let unknown = http_request(
        "POST",
        &format!("{}/no/such/route", d.proxy),
        &[JSON],
        b"{}".to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(unknown.status, 501, "{}", unknown.text());
    assert_eq!(elsewhere(&unknown).as_deref(), Some("false"));
}

#[test]
fn docs_fleet_shows_the_configuration_the_fleet_test_runs() {
    // Issue 21: the HAProxy configuration in docs/fleet.md is
    // docs/fleet/haproxy.cfg, the file scripts/fleet-demo and the fleet test
    // run, character for character.
    let doc = std::fs::read_to_string(repo().join("docs/fleet.md")).unwrap();
    let cfg = std::fs::read_to_string(repo().join("docs/fleet/haproxy.cfg")).unwrap();
    let shown = doc
        .split("```haproxy\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/fleet.md shows the configuration in a ```haproxy block");
    assert_eq!(
        shown, cfg,
        "docs/fleet.md's haproxy block differs from docs/fleet/haproxy.cfg; paste the file again"
    );
}
