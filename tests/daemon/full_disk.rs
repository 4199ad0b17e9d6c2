//! A full disk under the recovery directory (issue 18 item 3): a real
//! vacancyd whose recovery directory is a 64 KiB tmpfs the test mounts and
//! fills, in front of a real llama-server behind a counting shim.
//!
//! Needs root (`mount -t tmpfs`); a missing prerequisite fails the test with
//! the reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Daemon, JSON, Setup, completion};
use vacancy_test_support::{CountingShim, LlamaOptions, LlamaServer, http_request};

/// A tmpfs mounted for the test; unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .output()
            .unwrap_or_else(|e| panic!("prerequisite missing: cannot run mount: {e}"));
        assert!(
            out.status.success(),
            "prerequisite missing: `mount -t tmpfs` failed: {} (the test needs root to mount \
             a small tmpfs; CI runs as root)",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Tmpfs(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
    }
}

/// Fill the file system under `dir` to its last byte with `dir/fill`.
fn fill(dir: &Path) -> u64 {
    let path = dir.join("fill");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap();
    let mut written = 0u64;
    for chunk in [4096usize, 1] {
        let buf = vec![b'x'; chunk];
        loop {
            match f.write(&buf) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
    }
    written
}

fn is_work(r: &vacancy_test_support::Record) -> bool {
    r.path == "/completion"
}

async fn get(url: &str) -> u16 {
    http_request("GET", url, &[], Vec::new())
        .await
        .unwrap()
        .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_work_unforwarded_keeps_answering_and_recovers_when_space_returns() {
    // REC-01: a reservation that is not on disk is never forwarded.
    let llama = LlamaServer::start(LlamaOptions::default()).unwrap();
    let shim = CountingShim::start(llama.addr()).unwrap();
    let base = tempfile::tempdir().unwrap();
    let state = base.path().join("admission");
    let _tmpfs = Tmpfs::mount(&state, "64k");
    let server = format!("admission_state_dir = \"{}\"", state.display());
    let d = Daemon::setup(Setup {
        target: &shim.base_url(),
        server: &server,
        ..Setup::default()
    });

    // The journal is empty, so its first record needs a new page of the
    // tmpfs: filled now, no record fits (a journal with a partly used last
    // page would take records until that page is full).
    let journal = state.join("journal.jsonl");
    assert_eq!(std::fs::metadata(&journal).map(|m| m.len()).unwrap_or(0), 0);
    let filled = fill(&state);
    assert!(filled > 0);
    let forwarded = shim.records().iter().filter(|r| is_work(r)).count();
    assert_eq!(forwarded, 0);

    // Full: each request is refused at once with the reason, and nothing
    // reaches the upstream.
    for _ in 0..3 {
        let r = d.complete(4).await;
        assert_eq!(r.status, 503, "{}", r.text());
        let body = r.json().unwrap();
        let code = body["error"]["code"]
            .as_str()
            .or(body["code"].as_str())
            .unwrap_or_default()
            .to_owned();
        assert_eq!(code, "ledger_unavailable", "{body}");
        let text = r.text();
        assert!(text.contains("nothing ran"), "{text}");
        assert!(
            !text.contains(&state.display().to_string()),
            "a refusal names the owner's path: {text}"
        );
    }
    assert_eq!(
        shim.records().iter().filter(|r| is_work(r)).count(),
        forwarded,
        "a request whose reservation was not recorded reached the upstream"
    );

    // Reads and the control plane still answer.
    assert_eq!(get(&format!("{}/props", d.proxy)).await, 200);
    assert_eq!(get(&format!("{}/health", d.control)).await, 200);
    assert_eq!(get(&format!("{}/metrics", d.control)).await, 200);
    let status = d.status().await;
    assert!(
        status["work"].as_array().is_some_and(Vec::is_empty),
        "a refused reservation stayed: {status}"
    );
    assert!(
        d.process
            .log()
            .contains("reservation not recorded; not forwarding"),
        "the log does not say why:\n{}",
        d.process.log_tail(20)
    );

    // Space returns: lending resumes by itself, without a restart.
    std::fs::remove_file(state.join("fill")).unwrap();
    let r = d.complete(4).await;
    assert_eq!(r.status, 200, "after space returned: {}", r.text());
    d.wait_status("the job's release", |s| {
        s["work"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    assert_eq!(
        shim.records().iter().filter(|r| is_work(r)).count(),
        forwarded + 1
    );

    // And the journal reads back whole after a restart: nothing held.
    let d = d.restart();
    let status = d.status().await;
    assert!(
        status["work"].as_array().is_some_and(Vec::is_empty),
        "{status}"
    );
    let r = http_request(
        "POST",
        &format!("{}/completion", d.proxy),
        &[JSON],
        completion(4, false),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}
