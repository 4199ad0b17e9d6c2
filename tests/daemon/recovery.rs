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
    let mut cmd = Command::new(vacancy_test_support::vacancyd());
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

/// The journal's records, without the zeros that a running vacancyd writes
/// ahead of its last record and a kill -9 leaves behind (issue 31).
fn journal_records(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    text.trim_end_matches('\0').to_owned()
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
    let setup = common::Setup {
        target: &llama.base_url(),
        ..common::Setup::default()
    };
    let (config, control, _proxy) = setup.write_into(dir.path());
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_but_corrupt_last_record_stops_startup_and_only_a_cut_one_is_discarded() {
    // REC-08, REC-09, issue 30 item 3: the journal's last line is the
    // admission of a job really running on llama-server at a kill -9. With
    // one byte changed (`"op"` -> `x"op"`) and its newline kept, or its
    // started_unix_ms set to 2^64 (or 2^64-1, past the year 9999), the
    // daemon started with the entry gone and a REC-09 warning. Now each
    // stops startup naming the file and line and leaves the journal as it
    // was; only the same line cut short (no newline) is discarded.
    let (d, config, _llama) = leave_a_held_entry().await;
    let journal = d
        .dir
        .path()
        .join("vacancyd.admission")
        .join("journal.jsonl");
    let good = journal_records(&journal);
    let lines: Vec<&str> = good.lines().collect();
    let last = *lines.last().unwrap();
    assert!(last.contains("\"op\":\"admit\""), "{good}");
    assert!(good.ends_with('\n'));
    let line_no = lines.len();
    let started = last
        .split("\"started_unix_ms\":")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap()
        .to_owned();
    let damaged = [
        (last.replacen("\"op\"", "x\"op\"", 1), "not a JSON record"),
        (
            last.replacen(&started, "18446744073709551616", 1),
            "not a JSON record",
        ),
        (
            last.replacen(&started, "18446744073709551615", 1),
            "past the year 9999",
        ),
    ];
    for (bad_last, why) in damaged {
        let mut text = lines[..line_no - 1].join("\n");
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&bad_last);
        text.push('\n');
        std::fs::write(&journal, &text).unwrap();
        // Bounded: a daemon that starts anyway is stopped when `p` drops.
        let mut p = ManagedProcess::spawn("vacancyd", run(&config, &[])).unwrap();
        let status = p.wait_exit(Duration::from_secs(20));
        let err = p.log();
        assert!(
            status.is_some_and(|s| !s.success()),
            "started with {bad_last}:\n{err}"
        );
        assert!(err.contains("journal.jsonl"), "{err}");
        assert!(err.contains(&format!("line {line_no}")), "{err}");
        assert!(err.contains(why), "{err}");
        assert!(!err.contains("REC-09"), "{err}");
        assert_eq!(std::fs::read_to_string(&journal).unwrap(), text);
    }
    // The exception: the same record cut short by a crash (no newline).
    let mut text = lines[..line_no - 1].join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    text.push_str(&last[..last.len() / 2]);
    std::fs::write(&journal, &text).unwrap();
    let control = d.control.clone();
    let mut p = ManagedProcess::spawn("vacancyd", run(&config, &[])).unwrap();
    p.wait_http_ok(&format!("{control}/health"), Duration::from_secs(20))
        .unwrap();
    assert!(p.log().contains("REC-09"), "{}", p.log());
}

/// A tmpfs of `size` mounted at `path` for one test (root only), unmounted
/// when dropped: a real disk that can be filled.
struct Tmpfs {
    path: std::path::PathBuf,
}

impl Tmpfs {
    fn mount(path: &std::path::Path, size: &str) -> Tmpfs {
        let uid = std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next().map(str::to_owned))
            .unwrap();
        assert_eq!(
            uid, "0",
            "this test fills a real disk: it mounts a tmpfs, which needs root (run the suite as root, as CI does)"
        );
        std::fs::create_dir_all(path).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
            .arg("tmpfs")
            .arg(path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount a tmpfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs {
            path: path.to_owned(),
        }
    }

    /// Fill it: write until the disk says it is full.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let filler = self.path.join("filler");
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 4096];
        loop {
            match f.write_all(&block) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        // Whatever fits below a page, too.
        while f.write_all(&[0u8]).is_ok() {}
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// A journal holding one admitted `llama` entry on gpu0, started `age_s`
/// seconds ago, padded to end exactly at a page boundary so that the next
/// append needs a new page of the disk.
fn held_journal(id: &str, age_s: u64) -> Vec<u8> {
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        - age_s * 1000;
    let line = |model: &str| {
        format!(
            "{{\"v\":1,\"op\":\"admit\",\"id\":\"{id}\",\"upstream\":\"llama\",\"model\":\"{model}\",\"resources\":[\"gpu0\"],\"completion\":\"response_end\",\"started_unix_ms\":{started},\"upstream_ref\":null}}\n"
        )
    };
    let bare = line("").len();
    line(&"m".repeat(4096 - bare)).into_bytes()
}

const RELEASE_OPS: &str = "release-test-admin-token";

/// A daemon whose recovery directory is a small tmpfs holding `journal`; an
/// unreachable upstream (nothing here needs one to answer).
struct OnTmpfs {
    dir: tempfile::TempDir,
    rec: Tmpfs,
    config: std::path::PathBuf,
    control: String,
    proxy: String,
}

impl OnTmpfs {
    fn new(journal: &[u8]) -> OnTmpfs {
        let dir = tempfile::tempdir().unwrap();
        let rec = Tmpfs::mount(&dir.path().join("rec"), "256k");
        let path = rec.path.join("journal.jsonl");
        std::fs::write(&path, journal).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let server = format!(
            "admission_state_dir = \"{}\"\n[[server.token]]\nname = \"ops\"\nscopes = [\"admin\"]\nsha256 = \"{}\"\n",
            rec.path.display(),
            vacancy::auth::hash_token(RELEASE_OPS)
        );
        let setup = common::Setup {
            target: &format!("http://127.0.0.1:{}", free_port().unwrap()),
            server: &server,
            ..common::Setup::default()
        };
        let (config, control, proxy) = setup.write_into(dir.path());
        OnTmpfs {
            dir,
            rec,
            config,
            control: format!("http://127.0.0.1:{control}"),
            proxy: format!("http://127.0.0.1:{proxy}"),
        }
    }

    fn start(&self) -> ManagedProcess {
        let mut p = ManagedProcess::spawn("vacancyd", run(&self.config, &[])).unwrap();
        p.wait_http_ok(&format!("{}/health", self.control), Duration::from_secs(20))
            .unwrap();
        p
    }

    async fn status(&self) -> serde_json::Value {
        http_request("GET", &format!("{}/status", self.control), &[], Vec::new())
            .await
            .unwrap()
            .json()
            .unwrap()
    }

    async fn metrics(&self) -> String {
        http_request("GET", &format!("{}/metrics", self.control), &[], Vec::new())
            .await
            .unwrap()
            .text()
    }

    async fn release(&self, id: &str) -> vacancy_test_support::HttpReply {
        let auth = format!("Bearer {RELEASE_OPS}");
        http_request(
            "POST",
            &format!("{}/admin/work/{id}/release", self.control),
            &[
                JSON,
                ("authorization", auth.as_str()),
                ("vacancy-intent", "release_work"),
            ],
            br#"{"upstream_stopped": true}"#.to_vec(),
        )
        .await
        .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_release_is_answered_only_once_on_disk_and_a_full_disk_keeps_it_held() {
    // HELD-04, REC-01 (issue 14 item 3): the 200 leaves only after the
    // release record is synced; on a full disk the release is refused with
    // the reason and the entry stays held. REC-27 (item 2): an entry held for
    // two hours shows its two hours after the restart.
    let id = "3f1c2a9e-8d4b-4e6f-9a21-7b5c0d9e1f42";
    let journal = held_journal(id, 7200);
    assert_eq!(journal.len(), 4096);
    let t = OnTmpfs::new(&journal);
    let mut p = t.start();
    let s = t.status().await;
    assert_eq!(s["work"][0]["id"], id, "{s:#}");
    assert_eq!(s["work"][0]["phase"], "held");
    let age = s["work"][0]["age_s"].as_u64().unwrap();
    assert!(
        (7200..7300).contains(&age),
        "REC-27: the age counts from the recorded start, not the restart: {age}"
    );

    // A full disk: the release cannot be saved, so it is refused and the
    // entry stays held.
    let filler = t.rec.fill();
    let r = t.release(id).await;
    assert_eq!(r.status, 503, "{}", r.text());
    let body = r.json().unwrap();
    assert_eq!(body["error"]["code"], "ledger_unavailable", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stays held"),
        "{body}"
    );
    let s = t.status().await;
    assert_eq!(s["work"][0]["phase"], "held", "{s:#}");
    assert_eq!(s["resources"][0]["reserved_by"], id);

    // Space again: the release is answered once it is on disk, so a kill -9
    // right after the answer never brings it back.
    std::fs::remove_file(filler).unwrap();
    let r = t.release(id).await;
    assert_eq!(r.status, 200, "{}", r.text());
    p.kill().unwrap();
    let _p = t.start();
    let s = t.status().await;
    assert_eq!(s["work"], serde_json::json!([]), "{s:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_unavailable_refusal_is_counted_once_as_a_refusal_and_shows_no_internals() {
    // REC-01, issue 14 items 8 and 15: on a full disk the reservation cannot
    // be recorded, so nothing is forwarded; the borrower is told so without
    // the journal's path or the OS error, and /metrics counts a refusal, not
    // an admission. When space returns the next request is admitted again.
    let t = OnTmpfs::new(b"");
    let _p = t.start();
    let filler = t.rec.fill();
    let r = http_request(
        "POST",
        &format!("{}/completion", t.proxy),
        &[JSON],
        completion(4, false),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    let body = r.json().unwrap();
    assert_eq!(body["error"]["code"], "ledger_unavailable", "{body}");
    let text = body.to_string();
    let path = t.rec.path.display().to_string();
    assert!(!text.contains(&path), "the refusal names a path: {text}");
    assert!(
        !text.contains("journal"),
        "the refusal names a file: {text}"
    );
    assert!(
        !text.contains("os error"),
        "the refusal shows an OS error: {text}"
    );
    let m = t.metrics().await;
    assert!(
        m.contains("vacancyd_admissions_total{upstream=\"llama\"} 0"),
        "{m}"
    );
    assert!(
        m.contains("vacancyd_refusals_total{upstream=\"llama\",code=\"ledger_unavailable\"} 1"),
        "{m}"
    );
    assert_eq!(t.status().await["work"], serde_json::json!([]));

    std::fs::remove_file(filler).unwrap();
    common::write_capacity(&t.dir.path().join("gpu0.json"), 20_000, 64_000);
    let r = http_request(
        "POST",
        &format!("{}/completion", t.proxy),
        &[JSON],
        completion(4, false),
    )
    .await
    .unwrap();
    let body = r.json().unwrap();
    assert_ne!(body["error"]["code"], "ledger_unavailable", "{body}");
    let m = t.metrics().await;
    assert!(
        m.contains("vacancyd_admissions_total{upstream=\"llama\"} 1"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_unresolved_records_both_come_back_held_and_startup_goes_on() {
    // REC-02 (issue 14 item 18): two unresolved records on one resource (a
    // crash between one job's end and its record) never stop startup: both
    // are held, the resource stays reserved, and the log names both.
    let (a, b) = (
        "11111111-2222-4333-8444-555555555555",
        "66666666-7777-4888-9999-aaaaaaaaaaaa",
    );
    let journal = [held_journal(a, 60), held_journal(b, 30)].concat();
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("vacancyd.admission");
    std::fs::create_dir(&rec).unwrap();
    std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(rec.join("journal.jsonl"), journal).unwrap();
    std::fs::set_permissions(
        rec.join("journal.jsonl"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let setup = common::Setup {
        target: &format!("http://127.0.0.1:{}", free_port().unwrap()),
        ..common::Setup::default()
    };
    let (config, control, _proxy) = setup.write_into(dir.path());
    let p = common::spawn_daemon(run(&config, &[]), control);
    let control = format!("http://127.0.0.1:{control}");
    let s = http_request("GET", &format!("{control}/status"), &[], Vec::new())
        .await
        .unwrap()
        .json()
        .unwrap();
    let work = s["work"].as_array().unwrap();
    assert_eq!(work.len(), 2, "{s:#}");
    assert!(work.iter().all(|w| w["phase"] == "held"), "{s:#}");
    assert_eq!(s["resources"][0]["reserved_by"], a);
    let log = p.log();
    let line = log
        .lines()
        .find(|l| l.contains("two unresolved records name the same resource"))
        .unwrap_or_else(|| panic!("no overlap warning in the log:\n{log}"));
    assert!(line.contains(a) && line.contains(b), "{line}");
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
