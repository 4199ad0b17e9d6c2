//! The recovery directory through the real daemon: where it lives, that only
//! one daemon opens it, and that restarts never release work (REC-02, REC-08,
//! REC-11, REC-12, REC-25).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use common::{Daemon, JSON, completion};
use vacancy_test_support::{
    LlamaOptions, LlamaServer, ManagedProcess, TinyModel, free_port, http_request, http_stream,
};

fn run(config: &std::path::Path, env: &[(&str, &std::path::Path)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vacancyd"));
    cmd.arg("run")
        .arg("--config")
        .arg(config)
        .env("VACANCYD_LOG", "info");
    cmd.env(
        "VACANCYD_SERVICE_BASE",
        config.parent().unwrap().join("service-base"),
    );
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// A daemon holding one entry of `llama` after a kill -9 mid-stream, then
/// stopped; returns its directory and config path.
async fn leave_a_held_entry() -> (Daemon, std::path::PathBuf, LlamaServer) {
    let llama = LlamaServer::start(LlamaOptions {
        model: TinyModel {
            layers: 8,
            embd: 1024,
            seed: 1,
        },
        ..LlamaOptions::default()
    })
    .unwrap();
    let mut d = Daemon::start(&llama.base_url(), 1000, 2000, 20_000, "");
    let mut s = http_stream(
        "POST",
        &format!("{}/completion", d.proxy),
        &[JSON],
        completion(400, true),
    )
    .await
    .unwrap();
    s.next_chunk().await.unwrap().unwrap();
    d.process.kill().unwrap();
    drop(s);
    let config = d.dir.path().join("vacancyd.toml");
    (d, config, llama)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_recovery_directory_is_beside_the_configuration_and_private() {
    // REC-11, REC-18, REC-21
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let d = Daemon::start(&llama.base_url(), 1000, 2000, 20_000, "");
    let dir = d.dir.path().join("vacancyd.admission");
    let meta = std::fs::metadata(&dir).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    let r = d.complete(2).await;
    assert_eq!(r.status, 200);
    let journal = std::fs::read_to_string(dir.join("journal.jsonl")).unwrap();
    assert!(journal.contains("\"op\":\"admit\""), "{journal}");
    assert!(
        !journal.contains("Once upon a time"),
        "records hold metadata only (REC-26)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_systemd_the_recovery_directory_is_in_state_directory() {
    // REC-12: $STATE_DIRECTORY/admission.
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (control, proxy) = (free_port().unwrap(), free_port().unwrap());
    common::write_capacity(&dir.path().join("gpu0.json"), 20_000, 64_000);
    let config = dir.path().join("vacancyd.toml");
    let setup = common::Setup {
        target: &llama.base_url(),
        reserve: 1000,
        need: 2000,
        free: 20_000,
        server: "",
        upstream: "",
        presence: "none",
    };
    std::fs::write(&config, common::config(dir.path(), control, proxy, &setup)).unwrap();
    let mut p =
        ManagedProcess::spawn("vacancyd", run(&config, &[("STATE_DIRECTORY", &state)])).unwrap();
    p.wait_http_ok(
        &format!("http://127.0.0.1:{control}/health"),
        Duration::from_secs(20),
    )
    .unwrap();
    assert!(state.join("admission").join("journal.jsonl").exists());
    assert!(!dir.path().join("vacancyd.admission").exists());
    assert!(
        p.log()
            .contains(&state.join("admission").display().to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_on_the_same_directory_refuses_to_start_naming_the_holder() {
    // REC-25
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let d = Daemon::start(&llama.base_url(), 1000, 2000, 20_000, "");
    let config = d.dir.path().join("vacancyd.toml");
    let out = run(&config, &[]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by vacancyd pid"), "{err}");
    assert!(err.contains(&d.process.pid().to_string()), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_returns_unfinished_work_as_held_and_never_releases_it() {
    // REC-02, REC-27
    let (d, config, _llama) = leave_a_held_entry().await;
    let control = d.control.clone();
    let mut p = ManagedProcess::spawn("vacancyd", run(&config, &[])).unwrap();
    p.wait_http_ok(&format!("{control}/health"), Duration::from_secs(20))
        .unwrap();
    let s = http_request("GET", &format!("{control}/status"), &[], Vec::new())
        .await
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(s["work"].as_array().unwrap().len(), 1, "{s:#}");
    assert_eq!(s["work"][0]["phase"], "held");
    assert_eq!(s["resources"][0]["reserved_by"], s["work"][0]["id"]);
    // A second restart still holds it.
    p.terminate(Duration::from_secs(10)).unwrap();
    let mut p = ManagedProcess::spawn("vacancyd", run(&config, &[])).unwrap();
    p.wait_http_ok(&format!("{control}/health"), Duration::from_secs(20))
        .unwrap();
    let s = http_request("GET", &format!("{control}/status"), &[], Vec::new())
        .await
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(s["work"][0]["phase"], "held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_resource_mapping_stops_startup() {
    // REC-08
    let (_d, config, _llama) = leave_a_held_entry().await;
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("name = \"gpu0\"", "name = \"gpu1\"")
        .replace("resource = \"gpu0\"", "resource = \"gpu1\"");
    std::fs::write(&config, text).unwrap();
    let out = run(&config, &[]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gpu0") && err.contains("gpu1"), "{err}");
    assert!(err.contains("does not start rather than forget"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_stops_startup_naming_the_file() {
    // REC-08
    let (d, config, _llama) = leave_a_held_entry().await;
    let journal = d
        .dir
        .path()
        .join("vacancyd.admission")
        .join("journal.jsonl");
    let text = std::fs::read_to_string(&journal).unwrap();
    std::fs::write(&journal, format!("{{\"v\":1,\"op\":\"bogus\"}}\n{text}")).unwrap();
    let out = run(&config, &[]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("journal.jsonl"), "{err}");
    assert!(err.contains("line 1"), "{err}");
}

// Issue 14 item 16: a journal.jsonl that is a symbolic link to a 0644 file
// elsewhere stops startup naming the link; the file it points to is left as
// it was. (No upstream is needed: startup stops before any is asked.)
#[test]
fn a_linked_journal_stops_startup_naming_it() {
    let target = format!("http://127.0.0.1:{}", free_port().unwrap());
    let mut d = Daemon::start(&target, 1000, 2000, 20_000, "");
    d.process.terminate(Duration::from_secs(10)).unwrap();
    let journal = d.dir.path().join("vacancyd.admission/journal.jsonl");
    let elsewhere = d.dir.path().join("journal-on-another-disk.jsonl");
    std::fs::rename(&journal, &elsewhere).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &journal).unwrap();
    let before = std::fs::read(&elsewhere).unwrap();

    let config = d.dir.path().join("vacancyd.toml");
    let mut p = ManagedProcess::spawn("vacancyd", run(&config, &[])).unwrap();
    let status = p.wait_exit(Duration::from_secs(20));
    let log = p.log();
    assert!(status.is_some_and(|s| !s.success()), "{status:?}: {log}");
    assert!(
        log.contains(&format!("{} is a symbolic link", journal.display())),
        "{log}"
    );
    assert_eq!(std::fs::read(&elsewhere).unwrap(), before);
}
