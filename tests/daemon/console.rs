//! The owner console in a real headless Chromium (the Debian `chromium`,
//! driven by `chromium-driver` through Selenium), against a real vacancyd and
//! the real llama-server: the vacancy sign (UI-01..03), the owner veto with
//! an exempt route (SCOPE-16), target health apart from admission (UI-04),
//! work entries (HELD-01), held work with its release command and no release
//! control (HELD-08), the controls and their refusals, saved settings
//! (SCOPE-03), `promtool check metrics` on `/metrics`, and the Borrowers
//! page (issue 34) with no borrower's key or hash anywhere the owner looks.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Daemon, JSON, completion, write_capacity};
use vacancy_test_support::{
    Browser, LlamaOptions, LlamaServer, TinyModel, free_port, http_request, http_stream,
};

const OPS: &str = "ops-token-for-console-tests";
const OWNER: &str = "owner-token-for-console-tests";
const READER: &str = "reader-token-for-console-tests";
const WAIT: Duration = Duration::from_secs(20);

fn tokens() -> String {
    let t = |name: &str, scope: &str, token: &str| {
        format!(
            "[[server.token]]\nname = \"{name}\"\nscopes = [\"{scope}\"]\nsha256 = \"{}\"\n",
            vacancy::auth::hash_token(token)
        )
    };
    format!(
        "{}{}{}",
        t("ops", "admin", OPS),
        t("desk", "owner", OWNER),
        t("grafana", "read", READER)
    )
}

/// A tiny model slow enough that a 400-token stream is still running while
/// the browser looks.
fn busy_model() -> LlamaOptions {
    LlamaOptions {
        model: TinyModel {
            layers: 8,
            embd: 1024,
            seed: 1,
        },
        ..LlamaOptions::default()
    }
}

fn resource(dir: &Path, name: &str, reserve: u64) -> String {
    let path = dir.join(format!("{name}.json"));
    write_capacity(&path, 20_000, 64_000);
    format!(
        r#"
[[resource]]
name = "{name}"
kind = "gpu"
sampler = "file"
path = "{}"
reserve_mib = {reserve}
poll_ms = 60000
max_sample_age_ms = 120000
"#,
        path.display()
    )
}

/// vacancyd on `config` written into `dir`, on the given ports.
fn start(dir: tempfile::TempDir, config: &str, control: u16, proxy: u16) -> Daemon {
    let path = dir.path().join("vacancyd.toml");
    std::fs::write(&path, config).unwrap();
    Daemon::start_with(dir, &path, control, proxy)
}

fn restart(d: Daemon) -> Daemon {
    let Daemon {
        process,
        dir,
        control,
        proxy,
    } = d;
    drop(process);
    let port = |url: &str| url.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    let (control, proxy) = (port(&control), port(&proxy));
    let path = dir.path().join("vacancyd.toml");
    Daemon::start_with(dir, &path, control, proxy)
}

fn browser() -> Browser {
    Browser::start().expect("a headless Chromium (Debian chromium + chromium-driver)")
}

fn wait(b: &mut Browser, css: &str, text: &str) -> String {
    b.wait_for(css, Some(text), WAIT)
        .unwrap_or_else(|e| panic!("waiting for {css} to say {text:?}: {e}"))
}

fn set_token(b: &mut Browser, token: &str) {
    if b.js("return document.getElementById('token-form').hidden")
        .unwrap()
        == true
    {
        b.click("#token-button").unwrap();
    }
    b.type_into("#token-input", token).unwrap();
    b.click("#token-form button[type=submit]").unwrap();
}

async fn borrower_status(d: &Daemon) -> (u16, String) {
    let r = http_request(
        "POST",
        &format!("{}/completion", d.proxy),
        &[JSON],
        completion(2, false),
    )
    .await
    .unwrap();
    (r.status, r.text())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_signs_work_and_the_veto_and_its_controls_steer_lending() {
    let llama = LlamaServer::start(busy_model()).unwrap();
    let helper_server = LlamaServer::start(LlamaOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (control, proxy, helper) = (
        free_port().unwrap(),
        free_port().unwrap(),
        free_port().unwrap(),
    );
    let config = format!(
        r#"[server]
listen = "127.0.0.1:{control}"
{tokens}
[owner]
presence = "manual"
{gpu0}{lane}
[[upstream]]
name = "llama"
adapter = "llamacpp"
listen = "127.0.0.1:{proxy}"
target = "{target}"
resource = "gpu0"
default_min_free_mib = 2000
drain_timeout_s = 4

[[upstream]]
name = "helper"
adapter = "llamacpp"
listen = "127.0.0.1:{helper}"
target = "{helper_target}"
resource = "lane"
default_min_free_mib = 100
owner_scope = "resource"
"#,
        tokens = tokens(),
        gpu0 = resource(dir.path(), "gpu0", 1000),
        lane = resource(dir.path(), "lane", 500),
        target = llama.base_url(),
        helper_target = helper_server.base_url(),
    );
    let d = start(dir, &config, control, proxy);
    let mut b = browser();
    b.get(&format!("{}/", d.control)).unwrap();

    // Manual presence starts unknown: only the exempt route lends (SCOPE-16).
    wait(&mut b, "[data-sign='helper']", "admitting");
    wait(&mut b, "#veto", "Only exempt routes are lending");
    wait(
        &mut b,
        "#veto-detail",
        "exempt routes still lending: helper",
    );
    wait(&mut b, "#exempt-routes", "helper");
    wait(&mut b, "[data-sign='llama']", "owner_present");

    // The presence control, with an owner token kept in sessionStorage.
    set_token(&mut b, OWNER);
    let kept = b
        .js("return [sessionStorage.getItem('vacancy-token'), document.cookie, location.href]")
        .unwrap();
    assert_eq!(kept[0], OWNER);
    assert_eq!(kept[1], "", "never in a cookie");
    assert!(
        !kept[2].as_str().unwrap().contains(OWNER),
        "never in the URL"
    );
    b.click("#presence-away").unwrap();
    wait(&mut b, "#presence-state", "away");

    // UI-01, UI-03: the overview names each route and shows it admitting.
    wait(&mut b, "[data-sign='llama']", "admitting");
    let admitting = wait(&mut b, "#admitting-routes", "Admitting now:");
    assert!(
        admitting.contains("llama") && admitting.contains("helper"),
        "{admitting}"
    );
    assert!(
        admitting.contains("a free helper route does not mean a voice route has capacity"),
        "{admitting}"
    );
    // UI-02: not a reservation, not proof.
    let caption = b.text("#sign-caption").unwrap().unwrap();
    assert!(
        caption.contains("not a reservation and not proof that a given request will succeed"),
        "{caption}"
    );
    wait(&mut b, "#veto", "Owner policy allows new work");

    // UI-01: while a long stream runs, the sign shows resource_busy and the
    // work entry appears with what HELD-01 lists.
    let mut stream = http_stream(
        "POST",
        &format!("{}/completion", d.proxy),
        &[JSON],
        completion(4000, true),
    )
    .await
    .unwrap();
    stream.next_chunk().await.unwrap().unwrap();
    wait(&mut b, "[data-sign='llama']", "resource_busy");
    let id = d.status().await["work"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    b.click("nav a[data-page='workloads']").unwrap();
    let row = wait(&mut b, &format!("tr[data-entry='{id}']"), "forwarding");
    for part in [id.as_str(), "llama", "gpu0", "response_end"] {
        assert!(row.contains(part), "{part} missing from {row}");
    }
    assert!(
        b.text(&format!("[data-age='{id}']"))
            .unwrap()
            .unwrap()
            .ends_with(" s")
    );
    // UI-04: the refusal and the target's health, apart.
    wait(&mut b, "[data-admission='llama']", "resource_busy");
    wait(&mut b, "[data-health='llama']", "reachable");
    // SCOPE-16: the exempt route's card says what can still stop it.
    let note = wait(&mut b, "[data-exempt='helper']", "still stops for");
    assert!(
        note.contains("lending switch") && note.contains("lane"),
        "{note}"
    );
    assert_eq!(b.count("[data-exempt='llama']").unwrap(), 0);

    // The owner comes back during the stream and leaves again before the
    // drain's deadline (the reclaim stands down), then comes back for good
    // (the drain closes the stream): the recent reclaims say so.
    b.click("nav a[data-page='overview']").unwrap();
    let cut = id;
    b.click("#presence-present").unwrap();
    d.wait_status("a reclaim", |s| {
        s["reclaims"].as_array().is_some_and(|r| !r.is_empty())
    })
    .await;
    b.click("#presence-away").unwrap();
    d.wait_status("the reclaim to stand down", |s| {
        s["reclaim_log"][0]["outcome"] == "stood_down"
    })
    .await;

    // Owner present: the exempt route admits, so only exempt routes lend.
    b.click("#presence-present").unwrap();
    wait(&mut b, "#presence-state", "present");
    wait(&mut b, "[data-sign='llama']", "owner_present");
    wait(&mut b, "#veto", "Only exempt routes are lending");
    wait(
        &mut b,
        "#veto-detail",
        "exempt routes still lending: helper",
    );
    while let Some(Ok(_)) = stream.next_chunk().await {}
    d.wait_status(
        "the cut stream released (llama-server's idle slots prove it)",
        |s| {
            s["reclaim_log"][0]["outcome"] == "acted"
                && s["work"].as_array().is_some_and(|w| w.is_empty())
        },
    )
    .await;
    b.click("nav a[data-page='workloads']").unwrap();
    // The page refreshes on its own schedule: wait for the drain's own line
    // (its closed stream), not for the earlier stand-down that was there first.
    let log = wait(&mut b, "#reclaims", &format!("closed: {cut}"));
    for part in ["owner return", "drain", "acted", "stood down"] {
        assert!(
            log.contains(part),
            "{part} missing from the recent reclaims:\n{log}"
        );
    }
    b.click("nav a[data-page='overview']").unwrap();
    // With the exempt route's resource switched off, nothing lends.
    b.click("[data-switch='lane']").unwrap();
    wait(&mut b, "[data-sign='helper']", "resource_disabled");
    wait(&mut b, "#veto", "Owner policy pauses new work");
    b.click("[data-switch='lane']").unwrap();
    wait(&mut b, "[data-sign='helper']", "admitting");
    b.click("#presence-away").unwrap();
    wait(&mut b, "[data-sign='llama']", "admitting");

    // Pause lending from the button: /status says so and a borrower is refused.
    b.click("#lending-toggle").unwrap();
    wait(&mut b, "#lending-state", "paused");
    wait(&mut b, "#notice", "Lending paused");
    assert_eq!(d.status().await["lending"], false);
    let (status, body) = borrower_status(&d).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("lending_paused"), "{body}");

    // A control without a token is refused and says so; so is one of the wrong scope.
    b.click("#token-button").unwrap();
    b.click("#token-forget").unwrap();
    b.click("#lending-toggle").unwrap();
    let refused = wait(&mut b, "#notice", "Refused (401");
    assert!(
        refused.contains("a valid bearer token is required"),
        "{refused}"
    );
    assert_eq!(
        b.js("return document.getElementById('token-form').hidden")
            .unwrap(),
        false,
        "the console asks for the token"
    );
    set_token(&mut b, READER);
    b.click("#lending-toggle").unwrap();
    let refused = wait(&mut b, "#notice", "Refused (403");
    assert!(refused.contains("it needs scope owner"), "{refused}");
    assert_eq!(d.status().await["lending"], false);

    // The chart: a free-memory line and the reserve drawn as a floor.
    wait(&mut b, "#veto", "Lending is paused by its switch");
    assert_eq!(b.count("svg[data-chart='gpu0'] line.reserve").unwrap(), 1);
    assert_eq!(
        b.js("return document.querySelector(\"svg[data-chart='gpu0'] line.reserve\").getAttribute('data-reserve')").unwrap(),
        "1000"
    );
    b.js("window.dispatchEvent(new HashChangeEvent('hashchange'))")
        .unwrap();
    wait(&mut b, "svg[data-chart='gpu0'] rect.job", "");
    assert!(b.count("svg[data-chart='gpu0'] polyline.free").unwrap() == 1);

    // Page weight: everything the page loaded from the daemon, under 200 KiB.
    let weight = b
        .js("return performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource')).filter(e => !/\\/(events|history|settings)$/.test(e.name)).reduce((n, e) => n + e.decodedBodySize, 0)")
        .unwrap()
        .as_u64()
        .unwrap();
    assert!(weight > 10_000 && weight < 200 * 1024, "{weight} bytes");

    // promtool check metrics on /metrics after admissions, refusals and samples.
    promtool_passes(&d).await;
}

async fn promtool_passes(d: &Daemon) {
    let r = http_request("GET", &format!("{}/metrics", d.control), &[], Vec::new())
        .await
        .unwrap();
    let text = r.text();
    for name in [
        "vacancyd_admissions_total{upstream=\"llama\"}",
        "vacancyd_refusals_total{upstream=\"llama\",code=\"lending_paused\"} 1",
        "vacancyd_request_duration_seconds_bucket{upstream=\"llama\",route_class=\"work\"",
        "vacancyd_added_seconds_count{upstream=\"llama\",route_class=\"work\"}",
        "vacancyd_ledger_persist_duration_seconds_count",
        "vacancyd_request_phase_seconds_count{phase=\"inspect\"}",
        "vacancyd_request_phase_seconds_count{phase=\"persist\"}",
        "vacancyd_request_phase_seconds_count{phase=\"upstream\"}",
        "vacancyd_sample_duration_seconds_count{resource=\"gpu0\"}",
        "vacancyd_sample_failures_total{resource=\"gpu0\"} 0",
        "vacancyd_observation_failures_total{upstream=\"llama\"}",
        "vacancyd_held_entries 0",
        "vacancyd_resource_awaiting_fresh_sample{resource=\"gpu0\"}",
        "vacancyd_owner_presence{state=\"away\"} 1",
        "vacancyd_upstream_reachable{upstream=\"llama\"} 1",
        "vacancyd_upstream_owner_veto_exempt{upstream=\"helper\"} 1",
        "vacancyd_lending 0",
        "vacancyd_lending_window_open 1",
        "vacancyd_proxy_cpu_yields_total ",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &text).unwrap();
    let out = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(file.path()).unwrap())
        .output()
        .expect("promtool (Debian package prometheus; scripts/test installs it)");
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

const COMMENTED: &str = "# The owner's workstation. Comments like this one survive a save.\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_work_shows_its_release_command_and_settings_saved_from_the_page_reach_the_file() {
    let llama = LlamaServer::start(busy_model()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (control, proxy, oai) = (
        free_port().unwrap(),
        free_port().unwrap(),
        free_port().unwrap(),
    );
    let config = format!(
        r#"{COMMENTED}[server]
listen = "127.0.0.1:{control}"
{tokens}
[owner]
presence = "none"
{gpu0}
[[upstream]]
name = "llama"
adapter = "llamacpp"
listen = "127.0.0.1:{proxy}"
target = "{target}"
resource = "gpu0"
default_min_free_mib = 2000 # measured on this card

# The same server through its OpenAI-compatible routes (CFG-06).
[[upstream]]
name = "llama-oai"
adapter = "openai"
listen = "127.0.0.1:{oai}"
target = "{target}"
resource = "gpu0"
"#,
        tokens = tokens(),
        gpu0 = resource(dir.path(), "gpu0", 1000),
        target = llama.base_url(),
    );
    let d = start(dir, &config, control, proxy);
    let mut b = browser();
    b.get(&format!("{}/#workloads", d.control)).unwrap();
    wait(&mut b, "[data-health='llama']", "reachable");

    // A stream, then kill -9 mid-stream: the page says the daemon stopped answering.
    let mut stream = http_stream(
        "POST",
        &format!("{}/completion", d.proxy),
        &[JSON],
        completion(400, true),
    )
    .await
    .unwrap();
    stream.next_chunk().await.unwrap().unwrap();
    let id = d.status().await["work"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    wait(&mut b, &format!("tr[data-entry='{id}']"), "forwarding");
    let mut d = d;
    d.process.kill().unwrap();
    drop(stream);
    wait(&mut b, "#down", "vacancyd is not answering since");
    wait(&mut b, "#link", "not answering");

    // Restarted, the entry returns held (REC-02): its ID, age and the exact
    // release command, marked as needing attention (HELD-01, HELD-08).
    let d = restart(d);
    let row = wait(&mut b, &format!("tr.held[data-entry='{id}']"), "held");
    assert!(row.contains("Needs attention"), "{row}");
    assert!(
        b.js("return document.getElementById('down').hidden")
            .unwrap()
            == true
    );
    assert_eq!(
        b.text(&format!("[data-command='{id}']")).unwrap().unwrap(),
        format!("vacancyd admin-request release_work {id}")
    );
    let age = b.text(&format!("[data-age='{id}']")).unwrap().unwrap();
    assert!(age.ends_with(" s") || age.contains("min"), "{age}");
    wait(&mut b, "#held-banner", "1 held entry needs attention");
    // HELD-08: no control releases held work: no button, link or form for it.
    let controls = b
        .js(r#"return [...document.querySelectorAll('button, a, form, input[type=submit]')]
            .map(e => (e.textContent + ' ' + (e.getAttribute('href') || '') + ' ' + (e.getAttribute('action') || '')).toLowerCase())"#)
        .unwrap();
    for c in controls.as_array().unwrap() {
        let c = c.as_str().unwrap();
        assert!(
            !c.contains("release") && !c.contains("/admin/work"),
            "a release control: {c}"
        );
    }
    let script = http_request(
        "GET",
        &format!("{}/console/app.js", d.control),
        &[],
        Vec::new(),
    )
    .await
    .unwrap()
    .text();
    assert!(
        !script.contains("/admin/work"),
        "the console never calls the release route"
    );

    // Settings saved from the page change the file on disk, comments kept.
    set_token(&mut b, OPS);
    b.click("nav a[data-page='settings']").unwrap();
    wait(&mut b, "#settings-form", "Reserves");
    b.type_into("[data-key='resources.gpu0.reserve_mib']", "1500")
        .unwrap();
    b.type_into(
        "tbody[data-models='llama'] tr:last-child [data-model='name']",
        "tiny-q4",
    )
    .unwrap();
    b.type_into(
        "tbody[data-models='llama'] tr:last-child [data-model='min_free_mib']",
        "3000",
    )
    .unwrap();
    b.click("#settings-save").unwrap();
    wait(&mut b, "#settings-saved", "restart vacancyd");
    let path = d.dir.path().join("vacancyd.toml");
    let saved = std::fs::read_to_string(&path).unwrap();
    assert!(saved.starts_with(COMMENTED), "{saved}");
    assert!(saved.contains("reserve_mib = 1500\n"), "{saved}");
    assert!(
        saved.contains("default_min_free_mib = 2000 # measured on this card"),
        "{saved}"
    );
    assert!(
        saved.contains("# The same server through its OpenAI-compatible routes (CFG-06)."),
        "{saved}"
    );
    assert!(
        saved.contains("tiny-q4 = { min_free_mib = 3000 }"),
        "{saved}"
    );
    assert_eq!(
        std::fs::read_to_string(previous(&path)).unwrap(),
        config,
        "the previous file is kept beside it"
    );
    check_config_passes(&path);
    // SCOPE-03: the running status stays authoritative; the page says what differs.
    let s = d.status().await;
    assert_eq!(s["resources"][0]["reserve_mib"], 1000);
    let pending: Vec<&str> = s["settings"]["pending"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        pending,
        ["resource.gpu0.reserve_mib", "upstream.llama.models.tiny-q4"]
    );
    let banner = wait(
        &mut b,
        "#settings-pending",
        "Saved settings differ from the running ones",
    );
    assert!(banner.contains("resource.gpu0.reserve_mib"), "{banner}");

    // Advanced workload permissions need scope admin: an owner token is refused.
    set_token(&mut b, OWNER);
    b.js("const s = document.querySelector(\"[data-key='upstreams.llama.owner_scope']\"); s.value = 'resource';")
        .unwrap();
    b.click("#settings-save").unwrap();
    let refused = wait(&mut b, "#notice", "Refused (403");
    assert!(refused.contains("needs scope admin"), "{refused}");
    // As admin, a change the validator rejects (SCOPE-10: an exempt route on a
    // host-scoped route's server) writes nothing and names its key.
    set_token(&mut b, OPS);
    b.click("#settings-save").unwrap();
    let problems = wait(&mut b, "#settings-problems", "nothing was written");
    assert!(problems.contains("owner_scope"), "{problems}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), saved);
}

/// Adds borrower `name` with the real `vacancyd borrower add` and returns
/// the key it prints, once.
fn add_borrower(config: &Path, name: &str, options: &[&str]) -> String {
    let out = Command::new(vacancy_test_support::vacancyd())
        .args(["borrower", "add", name, "--config"])
        .arg(config)
        .args(options)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vacancyd borrower add {name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(key.len() >= 20, "not a key: {key:?}");
    key
}

async fn get_text(url: &str) -> String {
    let r = http_request("GET", url, &[], Vec::new()).await.unwrap();
    assert_eq!(r.status, 200, "{url}: {}", r.text());
    r.text()
}

// issue 34: the console's Borrowers page; the key never appears in logs,
// /status, /metrics or the console.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn borrowers_page_shows_who_borrowed_and_never_a_key() {
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (control, proxy) = (free_port().unwrap(), free_port().unwrap());
    let config = format!(
        r#"[server]
listen = "127.0.0.1:{control}"
{tokens}
[owner]
presence = "none"

[borrowers]
{gpu0}
[[upstream]]
name = "llama"
adapter = "llamacpp"
listen = "127.0.0.1:{proxy}"
target = "{target}"
resource = "gpu0"
default_min_free_mib = 2000
"#,
        tokens = tokens(),
        gpu0 = resource(dir.path(), "gpu0", 1000),
        target = llama.base_url(),
    );
    let path = dir.path().join("vacancyd.toml");
    std::fs::write(&path, &config).unwrap();
    let alice = add_borrower(&path, "alice", &["--budget", "gpu:day:3600"]);
    let bob = add_borrower(&path, "bob", &["--priority", "batch", "--share", "2"]);
    let secrets = [
        ("alice's key", alice.clone()),
        ("bob's key", bob.clone()),
        ("alice's hash", vacancy::auth::hash_borrower_key(&alice)),
        ("bob's hash", vacancy::auth::hash_borrower_key(&bob)),
    ];
    let d = Daemon::start_with(dir, &path, control, proxy);

    // Two completions as alice, one as bob, each with its key as a bearer token.
    for key in [&alice, &alice, &bob] {
        let auth = format!("Bearer {key}");
        let r = http_request(
            "POST",
            &format!("{}/completion", d.proxy),
            &[JSON, ("authorization", &auth)],
            completion(4, false),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    d.wait_status("both borrowers' jobs ended", |s| {
        let jobs = |name: &str| {
            s["borrowers"]
                .as_array()
                .and_then(|b| b.iter().find(|b| b["name"] == name))
                .map(|b| (b["totals"]["jobs"].clone(), b["running"].clone()))
        };
        jobs("alice") == Some((2.into(), 0.into())) && jobs("bob") == Some((1.into(), 0.into()))
    })
    .await;

    let mut b = browser();
    b.get(&format!("{}/#borrowers", d.control)).unwrap();
    wait(&mut b, "[data-jobs='alice']", "2");
    wait(&mut b, "[data-jobs='bob']", "1");
    let table = wait(&mut b, "#borrowers-table", "alice");
    for part in ["bob", "interactive", "batch"] {
        assert!(table.contains(part), "{part} missing from:\n{table}");
    }
    let budget = wait(
        &mut b,
        "tr[data-borrower='alice'] [data-budget='gpu:day']",
        "resets",
    );
    assert!(budget.contains("UTC"), "{budget}");
    wait(&mut b, "#borrowers-now", "Nobody is borrowing now");
    // The chart draws the record as the ledger writer wrote it: today's bar.
    wait(&mut b, "#usage-chart rect.bar", "");
    assert_eq!(
        b.js("return document.getElementById('nav-borrowers').hidden")
            .unwrap(),
        false,
        "the page is in the navigation with borrowers on"
    );
    if let Ok(out) = std::env::var("VACANCY_CONSOLE_SHOTS") {
        b.screenshot(&PathBuf::from(out).join("borrowers.png"))
            .unwrap();
    }

    // Neither key nor hash anywhere the owner looks: the log, /status,
    // /metrics, the usage report, or the page as the browser built it.
    let page = b
        .js("return document.documentElement.outerHTML")
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned();
    assert!(page.contains("alice") && page.contains("bob"), "{page}");
    let places = [
        ("the daemon's log", d.process.log()),
        ("/status", get_text(&format!("{}/status", d.control)).await),
        (
            "/metrics",
            get_text(&format!("{}/metrics", d.control)).await,
        ),
        (
            "/usage by borrower",
            get_text(&format!("{}/usage?by=borrower", d.control)).await,
        ),
        (
            "/usage by day",
            get_text(&format!("{}/usage?since=30d&by=day", d.control)).await,
        ),
        ("the console page", page),
    ];
    for (place, text) in &places {
        for (what, secret) in &secrets {
            assert!(!text.contains(secret.as_str()), "{what} is in {place}");
        }
    }
}

fn previous(path: &Path) -> PathBuf {
    path.with_file_name("vacancyd.toml.prev")
}

fn check_config_passes(path: &Path) {
    let out = Command::new(vacancy_test_support::vacancyd())
        .args(["check-config", "--no-sample", "--config"])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "check-config failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The scripted scene `scripts/console-screenshots` photographs: two routes
/// (one exempt), jobs on the chart, an owner-return reclaim that cut a
/// stream, a held entry, and a saved setting waiting for a restart. Writes
/// `overview.png`, `workloads.png` and `settings.png` (1280×800) into
/// `$VACANCY_CONSOLE_SHOTS`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by scripts/console-screenshots"]
async fn console_screenshots() {
    let out = PathBuf::from(std::env::var("VACANCY_CONSOLE_SHOTS").expect("VACANCY_CONSOLE_SHOTS"));
    std::fs::create_dir_all(&out).unwrap();
    let mut llama = LlamaServer::start(busy_model()).unwrap();
    let helper_server = LlamaServer::start(LlamaOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (control, proxy, helper) = (
        free_port().unwrap(),
        free_port().unwrap(),
        free_port().unwrap(),
    );
    let fast = |text: String| text.replace("poll_ms = 60000", "poll_ms = 1000");
    let config = format!(
        r#"[server]
listen = "127.0.0.1:{control}"
{tokens}
[owner]
presence = "manual"
{gpu0}{lane}
[[upstream]]
name = "llama"
adapter = "llamacpp"
listen = "127.0.0.1:{proxy}"
target = "{target}"
resource = "gpu0"
default_min_free_mib = 6000
on_owner_return = "drain"
drain_timeout_s = 2

[[upstream]]
name = "helper"
adapter = "llamacpp"
listen = "127.0.0.1:{helper}"
target = "{helper_target}"
resource = "lane"
default_min_free_mib = 800
owner_scope = "resource"
"#,
        tokens = tokens(),
        gpu0 = fast(resource(dir.path(), "gpu0", 4096)),
        lane = fast(resource(dir.path(), "lane", 1024)),
        target = llama.base_url(),
        helper_target = helper_server.base_url(),
    );
    let d = start(dir, &config, control, proxy);
    let gpu0 = d.dir.path().join("gpu0.json");
    let lane = d.dir.path().join("lane.json");
    let admin = |path: &'static str, intent: &'static str, body: &'static str| {
        let url = format!("{}{path}", d.control);
        async move {
            let auth = format!("Bearer {OPS}");
            http_request(
                "POST",
                &url,
                &[JSON, ("authorization", &auth), ("vacancy-intent", intent)],
                body.as_bytes().to_vec(),
            )
            .await
            .unwrap()
        }
    };
    admin("/admin/owner", "presence", r#"{"present": false}"#).await;
    // A minute of jobs: free memory dips while each runs.
    for round in 0..7u64 {
        write_capacity(&gpu0, 30_000 - round * 900, 49_152);
        write_capacity(&lane, 7_000, 8_192);
        tokio::time::sleep(Duration::from_secs(3)).await;
        write_capacity(&gpu0, 21_000 - round * 500, 49_152);
        write_capacity(&lane, 5_200, 8_192);
        let r = d.complete(48).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let _ = http_request(
            "POST",
            &format!("http://127.0.0.1:{helper}/completion"),
            &[JSON],
            completion(8, false),
        )
        .await
        .unwrap();
        write_capacity(&gpu0, 29_000 - round * 700, 49_152);
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    // The owner comes back during a stream: the drain cuts it after 2 s.
    let mut stream = http_stream(
        "POST",
        &format!("{}/completion", d.proxy),
        &[JSON],
        completion(400, true),
    )
    .await
    .unwrap();
    stream.next_chunk().await.unwrap().unwrap();
    admin("/admin/owner", "presence", r#"{"present": true}"#).await;
    while let Some(Ok(_)) = stream.next_chunk().await {}
    d.wait_status("the reclaim to end", |s| {
        s["reclaim_log"][0]["outcome"].is_string()
    })
    .await;
    admin("/admin/owner", "presence", r#"{"present": false}"#).await;
    // A held entry: the upstream dies mid-stream, then comes back.
    write_capacity(&gpu0, 27_500, 49_152);
    d.wait_status("gpu0 admitting again", |s| {
        s["upstreams"][0]["vacancy"]["admitting"] == true
    })
    .await;
    let mut stream = http_stream(
        "POST",
        &format!("{}/completion", d.proxy),
        &[JSON],
        completion(400, true),
    )
    .await
    .unwrap();
    stream.next_chunk().await.unwrap().unwrap();
    let port = llama.port();
    llama.kill().unwrap();
    while let Some(Ok(_)) = stream.next_chunk().await {}
    let _llama = LlamaServer::start_on(port, busy_model()).unwrap();
    d.wait_status("a held entry", |s| s["work"][0]["phase"] == "held")
        .await;
    // A saved setting a restart would apply; the owner is at the desk.
    let saved = admin(
        "/admin/settings",
        "settings",
        r#"{"resources": {"gpu0": {"reserve_mib": 6144}}, "upstreams": {"llama": {"models": {"qwen3:8b": {"min_free_mib": 7000}}}}}"#,
    )
    .await;
    assert_eq!(saved.status, 200, "{}", saved.text());
    admin("/admin/owner", "presence", r#"{"present": true}"#).await;

    let mut b = browser();
    b.get(&format!("{}/", d.control)).unwrap();
    set_token(&mut b, OWNER);
    wait(&mut b, "#veto", "Only exempt routes are lending");
    wait(&mut b, "svg[data-chart='gpu0'] rect.job", "");
    b.js("document.getElementById('notice').hidden = true")
        .unwrap();
    b.screenshot(&out.join("overview.png")).unwrap();
    b.click("nav a[data-page='workloads']").unwrap();
    wait(&mut b, "#held-banner", "needs attention");
    wait(&mut b, "#reclaims", "owner");
    b.screenshot(&out.join("workloads.png")).unwrap();
    b.click("nav a[data-page='settings']").unwrap();
    wait(&mut b, "#settings-pending", "Saved settings differ");
    b.screenshot(&out.join("settings.png")).unwrap();
}
