//! The owner's terms beyond presence (issue 35) through a real vacancyd in
//! front of a real llama-server: the lending hours closing drains a
//! streaming job, a fake hwmon temperature crossing the GPU's limit refuses
//! and then reclaims, unplugging a fake battery reclaims, a power cap is
//! applied and restored across a kill -9; each reason shows in `/status`,
//! `vacancyd status` and the console (Chromium).
//!
//! The lending-hours test needs a window that closes a few seconds after
//! the daemon starts. Windows are whole minutes of the machine's local
//! time, so rather than a clock seam in the daemon, the test starts
//! vacancyd in a time zone of its own: a POSIX `TZ` whose offset has
//! seconds (`TST-01:26:14`), chosen so that local time is 12:00:45 at
//! start and the window `daily 11:00-12:01` closes 15 s later. The daemon
//! runs unchanged and reads its zone the way it always does (`TZ`), so the
//! test also covers that path.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemon, JSON, completion};
use serde_json::Value;
use vacancy_test_support::{
    Browser, LlamaOptions, LlamaServer, TinyModel, free_port, http_request, http_stream,
};

/// An administrator's token (its hash is in the power-cap test's configuration).
const OPS: &str = "ops-token-for-terms-tests";

/// How long an event may take to show on a loaded two-core machine.
const EVENT_BOUND: Duration = Duration::from_secs(60);

/// A tiny model slow enough that a long stream is still running when a
/// term closes in on it, with room for thousands of tokens.
fn busy_model() -> LlamaOptions {
    LlamaOptions {
        model: TinyModel {
            layers: 8,
            embd: 1024,
            seed: 1,
        },
        ctx: 8192,
        ..LlamaOptions::default()
    }
}

/// A fake `/sys/class/drm/card0` with 16 GiB of VRAM, 1 GiB used, and an
/// hwmon directory at `temp_c`, 100 W and a 250 W power cap.
fn fake_card(root: &Path, temp_c: u32) {
    let device = root.join("drm/card0/device");
    std::fs::create_dir_all(device.join("hwmon/hwmon0")).unwrap();
    std::fs::write(
        device.join("mem_info_vram_total"),
        format!("{}\n", 16u64 << 30),
    )
    .unwrap();
    std::fs::write(
        device.join("mem_info_vram_used"),
        format!("{}\n", 1u64 << 30),
    )
    .unwrap();
    write(&hwmon(root, "power1_average"), "100000000");
    write(&hwmon(root, "power1_cap"), "250000000");
    set_temperature(root, temp_c);
}

fn hwmon(root: &Path, file: &str) -> PathBuf {
    root.join("drm/card0/device/hwmon/hwmon0").join(file)
}

/// Replace a sysfs file as the kernel would show a new value.
fn write(path: &Path, value: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{value}\n")).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn set_temperature(root: &Path, c: u32) {
    write(&hwmon(root, "temp1_input"), &(c * 1000).to_string());
}

/// A fake `/sys/class/power_supply`: a laptop plugged in (or not).
fn fake_power_supply(root: &Path, plugged: bool) {
    for d in ["ps/AC", "ps/BAT0"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    write(&root.join("ps/AC/type"), "Mains");
    write(&root.join("ps/BAT0/type"), "Battery");
    write(&root.join("ps/BAT0/scope"), "System");
    plug(root, plugged);
}

fn plug(root: &Path, plugged: bool) {
    write(&root.join("ps/AC/online"), if plugged { "1" } else { "0" });
    write(
        &root.join("ps/BAT0/status"),
        if plugged { "Charging" } else { "Discharging" },
    );
}

/// A configuration: `[owner]` and `[lending]` extras, one amdgpu resource
/// `gpu0` on the fake card with `limits`, one llamacpp upstream.
fn config(
    dir: &Path,
    control: u16,
    proxy: u16,
    target: &str,
    owner: &str,
    limits: &str,
    upstream: &str,
) -> PathBuf {
    let text = format!(
        r#"[server]
listen = "127.0.0.1:{control}"

[owner]
presence = "none"
{owner}

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "amdgpu"
device = "card0"
sysfs_root = "{root}"
reserve_mib = 1000
poll_ms = 200
{limits}

[[upstream]]
name = "llama"
adapter = "llamacpp"
listen = "127.0.0.1:{proxy}"
target = "{target}"
resource = "gpu0"
default_min_free_mib = 1000
{upstream}
"#,
        root = dir.join("drm").display(),
    );
    let path = dir.join("vacancyd.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A POSIX `TZ` in which the local wall clock shows `local` (seconds after
/// midnight) `ahead` from now, and the instant it does (the offset carries
/// whole seconds, so that instant is within half a second of `ahead`; the
/// sign is POSIX's, inverted).
fn zone_showing(local: i64, ahead: Duration) -> (String, Instant) {
    let (now, wall) = (Instant::now(), std::time::SystemTime::now());
    let utc = wall
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        % 86_400.0;
    let then = utc + ahead.as_secs_f64();
    // local = utc + offset at that instant.
    #[allow(clippy::cast_possible_truncation)]
    let mut offset = ((local as f64 - then).round() as i64).rem_euclid(86_400);
    if offset > 43_200 {
        offset -= 86_400;
    }
    #[allow(clippy::cast_precision_loss)]
    let shows_at = (local as f64 - offset as f64 - utc).rem_euclid(86_400.0);
    let sign = if offset >= 0 { '-' } else { '+' };
    let a = offset.abs();
    (
        format!(
            "TST{sign}{:02}:{:02}:{:02}",
            a / 3600,
            (a % 3600) / 60,
            a % 60
        ),
        now + Duration::from_secs_f64(shows_at),
    )
}

/// `vacancyd status` against `d`: its text.
fn status_text(d: &Daemon) -> String {
    let out = Command::new(vacancy_test_support::vacancyd())
        .args(["status", "--url", &d.control])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The term named `term` in a `/status` document.
fn term<'a>(s: &'a Value, name: &str) -> &'a Value {
    s["terms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["term"] == name)
        .unwrap_or_else(|| panic!("no term {name} in {s:#}"))
}

async fn metric(d: &Daemon, line_start: &str) -> Option<f64> {
    let text = http_request("GET", &format!("{}/metrics", d.control), &[], Vec::new())
        .await
        .unwrap()
        .text();
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A borrower's request refused with `code`: 503, the code in the body.
async fn refused_with(d: &Daemon, code: &str) -> vacancy_test_support::HttpReply {
    let r = d.complete(2).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json().unwrap()["error"]["code"], code, "{}", r.text());
    r
}

/// A streamed completion of `n` tokens, its first chunk read.
async fn streaming(d: &Daemon, n: u32) -> vacancy_test_support::HttpStream {
    let mut s = http_stream(
        "POST",
        &format!("{}/completion", d.proxy),
        &[JSON],
        completion(n, true),
    )
    .await
    .unwrap();
    assert_eq!(s.status, 200);
    s.next_chunk().await.unwrap().unwrap();
    s
}

/// Read a stream to its end: when it ended, and whether it ended cleanly.
async fn ended(mut s: vacancy_test_support::HttpStream) -> (Instant, bool) {
    while let Some(chunk) = s.next_chunk().await {
        if chunk.is_err() {
            return (Instant::now(), false);
        }
    }
    (Instant::now(), true)
}

/// `promtool check metrics` accepts `/metrics` with every term in force,
/// and the terms' gauges are there.
async fn promtool_passes(d: &Daemon, expected: &[&str]) {
    let text = http_request("GET", &format!("{}/metrics", d.control), &[], Vec::new())
        .await
        .unwrap()
        .text();
    for name in expected {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    let out = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(text.as_bytes())?;
            child.wait_with_output()
        })
        .expect("promtool (Debian package prometheus; scripts/test installs it)");
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn reclaim_triggered(s: &Value, prefix: &str) -> bool {
    s["reclaim_log"].as_array().is_some_and(|l| {
        l.iter()
            .any(|r| r["trigger"].as_str().is_some_and(|t| t.starts_with(prefix)))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lending_window_closing_drains_a_streaming_job_and_refuses_until_it_opens() {
    let llama = LlamaServer::start(busy_model()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    fake_card(dir.path(), 50);
    let (control, proxy) = (free_port().unwrap(), free_port().unwrap());
    let path = config(
        dir.path(),
        control,
        proxy,
        &llama.base_url(),
        "",
        "",
        "on_owner_return = \"drain\"\ndrain_timeout_s = 3\n",
    );
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("\n[lending]\nhours = [\"daily 11:00-12:01\"]\n");
    std::fs::write(&path, text).unwrap();
    // The window closes at 12:01 local time, 15 s from here.
    let (tz, closes_at) = zone_showing(12 * 3600 + 60, Duration::from_secs(15));
    let d = Daemon::start_with_env(dir, &path, control, proxy, &[("TZ", &tz)]);
    let s = d.status().await;
    let hours = term(&s, "lending_hours");
    assert_eq!(hours["refusing"], false, "{s:#}");
    assert_eq!(hours["next_change"]["change"], "closes");
    assert!(
        hours["next_change"]["at"]
            .as_str()
            .unwrap()
            .ends_with("12:01 TST"),
        "{hours}"
    );
    assert!(
        status_text(&d).contains("lending hours  admits: open; lending closes at"),
        "{}",
        status_text(&d)
    );

    let stream = streaming(&d, 6000).await;
    assert!(
        Instant::now() < closes_at,
        "the stream started before the close"
    );
    let (end, clean) = ended(stream).await;
    assert!(
        end >= closes_at,
        "the stream ran to the close ({:?} early)",
        closes_at - end
    );
    if !clean {
        // Cut at the drain deadline: not before it.
        assert!(
            end >= closes_at + Duration::from_millis(2500),
            "cut {:?} after the close, before drain_timeout_s",
            end - closes_at
        );
    }
    let s = d
        .wait_status_within("the lending-hours reclaim in the log", EVENT_BOUND, |s| {
            reclaim_triggered(
                s,
                "lending hours: the lending hours (daily 11:00-12:01; time zone TST) closed",
            )
        })
        .await;
    let entry = s["reclaim_log"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["trigger"].as_str().unwrap().starts_with("lending hours"))
        .unwrap();
    assert_eq!(entry["mode"], "drain");

    // Outside the window: refused until the next opening, 11:00 tomorrow.
    let r = refused_with(&d, "outside_lending_hours").await;
    let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(
        (82_000..=82_900).contains(&retry),
        "Retry-After {retry}: tomorrow 11:00 is about 22 h 59 min away"
    );
    let message = r.json().unwrap()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("lending opens at") && message.contains("11:00 TST"),
        "{message}"
    );
    let s = d.status().await;
    let hours = term(&s, "lending_hours");
    assert_eq!(
        (hours["refusing"].as_bool(), hours["code"].as_str()),
        (Some(true), Some("outside_lending_hours"))
    );
    assert_eq!(
        s["upstreams"][0]["vacancy"]["code"],
        "outside_lending_hours"
    );
    let text = status_text(&d);
    assert!(
        text.contains("lending hours  REFUSING outside_lending_hours: closed; lending opens at"),
        "{text}"
    );
    // The console says it too: the term refusing, the sign, the next opening.
    let mut b = Browser::start().expect("a headless Chromium (Debian chromium + chromium-driver)");
    b.get(&format!("{}/#overview", d.control)).unwrap();
    let wait = |b: &mut Browser, css: &str, text: &str| {
        b.wait_for(css, Some(text), Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("waiting for {css} to say {text:?}: {e}"))
    };
    let card = wait(
        &mut b,
        "[data-term=\"lending_hours\"]",
        "outside_lending_hours",
    );
    assert!(
        card.contains("closed; lending opens at") && card.contains("11:00 TST"),
        "{card}"
    );
    wait(&mut b, "[data-sign=\"llama\"]", "outside_lending_hours");
    wait(&mut b, "[data-hours]", "Lending opens at");
    drop(b);
    assert_eq!(metric(&d, "vacancyd_lending_window_open").await, Some(0.0));
    assert_eq!(
        metric(&d, "vacancyd_term_refusing{term=\"lending_hours\"").await,
        Some(1.0)
    );
    assert!(
        metric(
            &d,
            "vacancyd_reclaims_total{upstream=\"llama\",trigger=\"lending_hours\""
        )
        .await
        .unwrap_or(0.0)
            >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hwmon_temperature_crossing_the_limit_refuses_then_reclaims_and_a_cool_reading_lends_again()
 {
    let llama = LlamaServer::start(busy_model()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    fake_card(&root, 60);
    let (control, proxy) = (free_port().unwrap(), free_port().unwrap());
    let path = config(
        &root,
        control,
        proxy,
        &llama.base_url(),
        "",
        "max_temperature_c = 80\nresume_below_c = 70\nhot_for_s = 2",
        "on_owner_return = \"cancel\"",
    );
    let d = Daemon::start_with(dir, &path, control, proxy);
    let s = d.status().await;
    assert_eq!(term(&s, "heat")["refusing"], false, "{s:#}");
    assert_eq!(s["resources"][0]["heat"]["temperature_c"], 60);

    let stream = streaming(&d, 6000).await;
    set_temperature(&root, 90);
    let crossed = Instant::now();
    // New work on the hot GPU is refused at once (well, at the next sample).
    let s = d
        .wait_status_within("gpu0 too hot", EVENT_BOUND, |s| {
            term(s, "heat")["refusing"] == true
        })
        .await;
    assert_eq!(term(&s, "heat")["code"], "gpu_too_hot");
    assert_eq!(s["upstreams"][0]["vacancy"]["code"], "gpu_too_hot");
    let r = refused_with(&d, "gpu_too_hot").await;
    assert_eq!(r.headers["retry-after"], "30");
    assert!(
        r.text()
            .contains("gpu0 is at 90 °C, above the owner's max_temperature_c = 80"),
        "{}",
        r.text()
    );
    // After hot_for_s the borrowed stream is reclaimed (cancel: cut at once).
    let (end, clean) = ended(stream).await;
    assert!(!clean, "the stream is cut, not finished");
    assert!(
        end - crossed >= Duration::from_millis(1800),
        "reclaimed after hot_for_s, not before ({:?})",
        end - crossed
    );
    // The reclaim is logged, and the cut entry leaves forwarding (its
    // release follows the closed response).
    d.wait_status_within("the heat reclaim in the log", EVENT_BOUND, |s| {
        reclaim_triggered(s, "heat and power limits of gpu0: gpu0 is at 90 °C")
            && s["work"]
                .as_array()
                .unwrap()
                .iter()
                .all(|w| w["phase"] != "forwarding")
    })
    .await;
    let text = status_text(&d);
    assert!(
        text.contains("heat gpu0      REFUSING gpu_too_hot: 90 °C"),
        "{text}"
    );
    assert_eq!(
        metric(&d, "vacancyd_gpu_temperature_celsius{resource=\"gpu0\"}").await,
        Some(90.0)
    );
    assert_eq!(
        metric(
            &d,
            "vacancyd_term_refusing{term=\"heat\",resource=\"gpu0\"}"
        )
        .await,
        Some(1.0)
    );

    // Between the marks it still refuses; below the resume mark it lends.
    set_temperature(&root, 75);
    d.wait_status_within("75 °C read", EVENT_BOUND, |s| {
        s["resources"][0]["heat"]["temperature_c"] == 75
    })
    .await;
    refused_with(&d, "gpu_too_hot").await;
    set_temperature(&root, 65);
    d.wait_status_within("gpu0 cool again", EVENT_BOUND, |s| {
        term(s, "heat")["refusing"] == false
    })
    .await;
    // The cut job's stop is proven by llama-server's idle slot (it stops
    // generating when its connection closes), so nothing stays held and
    // the cool GPU lends again.
    d.wait_status_within("the cut job's end proven", EVENT_BOUND, |s| {
        s["work"].as_array().unwrap().is_empty()
    })
    .await;
    let r = d.complete(2).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unplugging_a_fake_battery_reclaims_and_plugging_it_back_lends_again() {
    let llama = LlamaServer::start(busy_model()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    fake_card(&root, 50);
    fake_power_supply(&root, true);
    let (control, proxy) = (free_port().unwrap(), free_port().unwrap());
    let owner = format!(
        "on_battery = \"pause\"\npower_supply_dir = \"{}\"",
        root.join("ps").display()
    );
    let path = config(
        &root,
        control,
        proxy,
        &llama.base_url(),
        &owner,
        "",
        "on_owner_return = \"cancel\"",
    );
    let d = Daemon::start_with(dir, &path, control, proxy);
    let s = d.status().await;
    assert_eq!(term(&s, "battery")["state"], "mains", "{s:#}");

    let stream = streaming(&d, 6000).await;
    plug(&root, false);
    let (_, clean) = ended(stream).await;
    assert!(!clean, "the stream is cut when the battery takes over");
    let s = d
        .wait_status_within("the battery reclaim in the log", EVENT_BOUND, |s| {
            reclaim_triggered(s, "battery: the machine left mains power")
        })
        .await;
    let battery = term(&s, "battery");
    assert_eq!(
        (
            battery["refusing"].as_bool(),
            battery["code"].as_str(),
            battery["state"].as_str()
        ),
        (Some(true), Some("on_battery"), Some("battery"))
    );
    let r = refused_with(&d, "on_battery").await;
    assert!(
        r.headers.get("retry-after").is_none(),
        "no retry within seconds helps"
    );
    assert!(
        status_text(&d).contains("battery        REFUSING on_battery: on battery"),
        "{}",
        status_text(&d)
    );
    assert_eq!(
        metric(&d, "vacancyd_power_source{source=\"battery\"}").await,
        Some(1.0)
    );

    // An unreadable supply is unknown, and refuses like the battery.
    plug(&root, true);
    std::fs::remove_file(root.join("ps/BAT0/status")).unwrap();
    let s = d
        .wait_status_within("the supply unknown", EVENT_BOUND, |s| {
            term(s, "battery")["state"] == "unknown"
        })
        .await;
    assert!(
        term(&s, "battery")["reason"]
            .as_str()
            .unwrap()
            .contains("cannot be read"),
        "{s:#}"
    );
    refused_with(&d, "on_battery").await;
    // Plugged in and readable: lends after the fresh reading.
    plug(&root, true);
    d.wait_status_within("on mains", EVENT_BOUND, |s| {
        term(s, "battery")["state"] == "mains"
    })
    .await;
    assert_eq!(term(&d.status().await, "battery")["refusing"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_cap_is_applied_while_work_runs_and_restored_after_it_and_after_a_kill_9() {
    let llama = LlamaServer::start(busy_model()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    fake_card(&root, 50);
    let (control, proxy) = (free_port().unwrap(), free_port().unwrap());
    let path = config(
        &root,
        control,
        proxy,
        &llama.base_url(),
        "",
        "power_cap_w = 150",
        "",
    );
    let mut text = std::fs::read_to_string(&path).unwrap();
    text = text.replacen(
        "[owner]",
        &format!(
            "[[server.token]]\nname = \"ops\"\nscopes = [\"admin\"]\nsha256 = \"{}\"\n\n[owner]",
            vacancy::auth::hash_token(OPS)
        ),
        1,
    );
    std::fs::write(&path, text).unwrap();
    let cap_file = hwmon(&root, "power1_cap");
    let record = root.join("vacancyd.admission/power-cap-gpu0.json");
    let read_cap = || {
        std::fs::read_to_string(&cap_file)
            .unwrap()
            .trim()
            .to_owned()
    };
    let until = |what: &str, pred: &dyn Fn() -> bool| {
        let deadline = Instant::now() + EVENT_BOUND;
        while !pred() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let d = Daemon::start_with(dir, &path, control, proxy);
    assert_eq!(
        read_cap(),
        "250000000",
        "untouched while nothing is borrowed"
    );

    // A job lowers the cap and its end restores it.
    let r = d.complete(8).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let stream = streaming(&d, 6000).await;
    until("the cap lowered", &|| read_cap() == "150000000");
    let saved: Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    assert_eq!(
        (saved["original_w"].as_u64(), saved["cap_w"].as_u64()),
        (Some(250), Some(150))
    );
    assert_eq!(
        metric(&d, "vacancyd_gpu_power_cap_watts{resource=\"gpu0\"}").await,
        Some(150.0)
    );

    // kill -9 while capped: the record survives, and the next start restores.
    let Daemon {
        mut process, dir, ..
    } = d;
    process.kill().unwrap();
    drop(stream);
    assert_eq!(
        read_cap(),
        "150000000",
        "nobody restored it: the daemon died"
    );
    assert!(record.exists(), "the original is on disk");
    let d = Daemon::start_with(dir, &path, control, proxy);
    // Restored before the listeners opened: the log says so before "ready".
    let log = d.process.log();
    let restored = log
        .find("restored a GPU power limit that a crash left lowered")
        .unwrap_or_else(|| panic!("no restore logged:\n{}", d.process.log_tail(40)));
    assert!(
        restored < log.find(" ready").unwrap(),
        "restored before ready"
    );
    assert!(
        log[restored..].contains("original_w=250"),
        "{}",
        d.process.log_tail(40)
    );
    // The killed job comes back held (its end unknown): it still reserves
    // the GPU, so the cap is lowered again while it does; an
    // administrator's release ends it and restores the limit.
    let s = d.status().await;
    let held = s["work"][0]["id"]
        .as_str()
        .expect("the killed job restored held")
        .to_owned();
    until("the cap lowered for the held entry", &|| {
        read_cap() == "150000000"
    });
    let r = http_request(
        "POST",
        &format!("{}/admin/work/{held}/release", d.control),
        &[
            JSON,
            ("authorization", &format!("Bearer {OPS}")),
            ("vacancy-intent", "release_work"),
        ],
        br#"{"upstream_stopped": true}"#.to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    until("the cap restored after the release", &|| {
        read_cap() == "250000000"
    });
    until("the record gone", &|| !record.exists());

    // A clean shutdown while capped restores it too.
    let stream = streaming(&d, 6000).await;
    until("the cap lowered again", &|| read_cap() == "150000000");
    let Daemon { mut process, .. } = d;
    process.terminate(Duration::from_secs(40)).unwrap();
    drop(stream);
    assert_eq!(read_cap(), "250000000", "restored at shutdown");
    assert!(!record.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_every_term_in_force_and_which_one_refuses() {
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    fake_card(&root, 88);
    fake_power_supply(&root, false);
    let (control, proxy) = (free_port().unwrap(), free_port().unwrap());
    let owner = format!(
        "on_battery = \"pause\"\npower_supply_dir = \"{}\"",
        root.join("ps").display()
    );
    let path = config(
        &root,
        control,
        proxy,
        &llama.base_url(),
        &owner,
        "max_temperature_c = 80\nmax_power_w = 200",
        "",
    );
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("\n[lending]\nhours = [\"daily 11:00-13:00\"]\n");
    std::fs::write(&path, text).unwrap();
    let (tz, _) = zone_showing(12 * 3600, Duration::ZERO);
    let d = Daemon::start_with_env(dir, &path, control, proxy, &[("TZ", &tz)]);
    // The sign says the first term that refuses: on battery.
    refused_with(&d, "on_battery").await;
    promtool_passes(
        &d,
        &[
            "vacancyd_lending_window_open 1",
            "vacancyd_lending_window_next_change_seconds ",
            "vacancyd_power_source{source=\"battery\"} 1",
            "vacancyd_term_refusing{term=\"battery\",resource=\"\"} 1",
            "vacancyd_term_refusing{term=\"heat\",resource=\"gpu0\"} 1",
            "vacancyd_gpu_temperature_celsius{resource=\"gpu0\"} 88",
            "vacancyd_gpu_power_watts{resource=\"gpu0\"} 100",
            "vacancyd_refusals_total{upstream=\"llama\",code=\"on_battery\"} 1",
        ],
    )
    .await;

    let mut b = Browser::start().expect("a headless Chromium (Debian chromium + chromium-driver)");
    b.get(&format!("{}/#overview", d.control)).unwrap();
    let wait = |b: &mut Browser, css: &str, text: &str| {
        b.wait_for(css, Some(text), Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("waiting for {css} to say {text:?}: {e}"))
    };
    let hours = wait(&mut b, "[data-term=\"lending_hours\"]", "admits");
    assert!(
        hours.contains("Lending hours")
            && hours.contains("lending closes at")
            && hours.contains("13:00 TST"),
        "{hours}"
    );
    let battery = wait(&mut b, "[data-term=\"battery\"]", "on_battery");
    assert!(
        battery.contains("on battery") && battery.contains("plugged in"),
        "{battery}"
    );
    let heat = wait(&mut b, "[data-term=\"heat:gpu0\"]", "gpu_too_hot");
    assert!(
        heat.contains("88 °C") && heat.contains("max_temperature_c = 80"),
        "{heat}"
    );
    wait(&mut b, "[data-sign=\"llama\"]", "on_battery");
    let next = wait(&mut b, "[data-hours]", "Lending closes at");
    assert!(next.contains("13:00 TST"), "{next}");
    if let Ok(shots) = std::env::var("VACANCY_SCREENSHOTS") {
        b.screenshot(&Path::new(&shots).join("console-terms.png"))
            .unwrap();
    }
    // Plugged in, the battery admits and the heat term is the one refusing.
    plug(&root, true);
    wait(&mut b, "[data-term=\"battery\"]", "admits");
    wait(&mut b, "[data-sign=\"llama\"]", "gpu_too_hot");
    // Cooled below the resume mark but drawing 250 W above max_power_w = 200:
    // the power limit is the one refusing, on the console, to a borrower and
    // in `vacancyd status`.
    set_temperature(&root, 70);
    write(&hwmon(&root, "power1_average"), "250000000");
    let heat = wait(&mut b, "[data-term=\"heat:gpu0\"]", "gpu_power_limit");
    assert!(heat.contains("max_power_w = 200"), "{heat}");
    wait(&mut b, "[data-sign=\"llama\"]", "gpu_power_limit");
    refused_with(&d, "gpu_power_limit").await;
    let status = status_text(&d);
    assert!(status.contains("gpu_power_limit"), "{status}");
}
