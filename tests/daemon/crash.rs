//! Crash campaign: the real daemon in front of a real llama-server through the
//! counting shim (whose records say which requests reached the upstream and
//! which finished), killed with SIGKILL at random points during a stream of
//! admissions, then restarted. Every round asserts (REC-01, REC-02, REC-09):
//! - startup never fails (a record cut short by the kill is discarded, REC-09);
//! - every request that reached the upstream and did not finish is held;
//! - no entry is duplicated, and every restored entry is held;
//! - no entry whose administrator release was acknowledged comes back.
//!
//! Then it releases the held entries through the admin API so the next round
//! tests something. `VACANCY_CRASH_KILLS` sets the number of kills (default 50).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemon, JSON, Rng, Setup, completion};
use vacancy_test_support::{CountingShim, LlamaOptions, LlamaServer, TinyModel, http_request};

const OPS: &str = "crash-test-admin-token";

fn is_work(r: &vacancy_test_support::Record) -> bool {
    r.method == "POST" && r.path == "/completion"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_never_forgets_work_that_reached_the_upstream() {
    let kills: usize = std::env::var("VACANCY_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let seed: u64 = std::env::var("VACANCY_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_cafe);
    let mut rng = Rng(seed);
    let llama = LlamaServer::start(LlamaOptions {
        model: TinyModel {
            layers: 4,
            embd: 256,
            seed: 2,
        },
        ..LlamaOptions::default()
    })
    .unwrap();
    let shim = CountingShim::start(llama.addr()).unwrap();
    let server = format!(
        "[[server.token]]\nname = \"crash-test\"\nscopes = [\"admin\"]\nsha256 = \"{}\"\n",
        vacancy::auth::hash_token(OPS)
    );
    // One configuration for every restart: the recovery directory is the
    // default one beside it (vacancyd.admission, REC-11).
    let first = Daemon::setup(Setup {
        target: &shim.base_url(),
        server: &server,
        ..Setup::default()
    });
    let dir = first.dir;
    let config = dir.path().join("vacancyd.toml");
    let mut process = first.process;
    let control = first.control.clone();
    let proxy = first.proxy.clone();

    let (mut total_held, mut total_incomplete, mut total_reached) = (0usize, 0usize, 0usize);
    // Entries an administrator's release was acknowledged for: a crash never
    // brings one back (issue 14 item 3).
    let mut released: BTreeSet<String> = BTreeSet::new();
    let started = Instant::now();
    for round in 0..kills {
        shim.clear();
        // A stream of admissions: borrowers one after another and a few at once.
        let load = {
            let proxy = proxy.clone();
            let n = 1 + rng.below(3);
            let tokens = 4 + rng.below(48);
            tokio::spawn(async move {
                let url = format!("{proxy}/completion");
                loop {
                    let batch: Vec<_> = (0..n)
                        .map(|_| {
                            let url = url.clone();
                            tokio::spawn(async move {
                                let _ = http_request(
                                    "POST",
                                    &url,
                                    &[JSON],
                                    completion(tokens as u32, true),
                                )
                                .await;
                            })
                        })
                        .collect();
                    for b in batch {
                        let _ = b.await;
                    }
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
        process.kill().unwrap();
        load.abort();
        // What reached the upstream this round, and which did not finish.
        assert!(
            shim.wait_idle(Duration::from_secs(30)),
            "the upstream still works after the kill"
        );
        let work: Vec<_> = shim.records().into_iter().filter(is_work).collect();
        let incomplete = work.iter().filter(|r| !r.completed).count();

        // Restart on the same configuration and recovery directory.
        let mut cmd = Command::new(vacancy_test_support::vacancyd());
        cmd.arg("run")
            .arg("--config")
            .arg(&config)
            .env("VACANCYD_LOG", "info")
            .env("VACANCYD_SERVICE_BASE", dir.path().join("service-base"));
        process = vacancy_test_support::ManagedProcess::spawn("vacancyd", cmd).unwrap();
        if let Err(e) = process.wait_http_ok(&format!("{control}/health"), Duration::from_secs(20))
        {
            panic!("round {round} (seed {seed}): restart failed: {e}");
        }
        let status = http_request("GET", &format!("{control}/status"), &[], Vec::new())
            .await
            .unwrap()
            .json()
            .unwrap();
        let entries = status["work"].as_array().unwrap().clone();
        let ids: BTreeSet<String> = entries
            .iter()
            .map(|w| w["id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            ids.len(),
            entries.len(),
            "round {round}: duplicated entries {entries:?}"
        );
        assert!(
            entries.iter().all(|w| w["phase"] == "held"),
            "round {round}: restored entries must be held: {entries:?}"
        );
        assert!(
            entries.len() >= incomplete,
            "round {round} (seed {seed}): {incomplete} requests reached the upstream without finishing but only {} entries came back held",
            entries.len()
        );
        let undone: Vec<&String> = ids.intersection(&released).collect();
        assert!(
            undone.is_empty(),
            "round {round} (seed {seed}): acknowledged releases came back held: {undone:?}"
        );
        total_held += entries.len();
        total_incomplete += incomplete;
        total_reached += work.len();

        // Release them as an administrator so the next round starts clean.
        for id in &ids {
            let auth = format!("Bearer {OPS}");
            let r = http_request(
                "POST",
                &format!("{control}/admin/work/{id}/release"),
                &[
                    JSON,
                    ("authorization", &auth),
                    ("vacancy-intent", "release_work"),
                ],
                br#"{"upstream_stopped": true}"#.to_vec(),
            )
            .await
            .unwrap();
            assert_eq!(r.status, 200, "round {round}: release {id}: {}", r.text());
            released.insert(id.clone());
        }
    }
    println!(
        "crash campaign (seed {seed}): {kills} kills in {:.1} s; {total_reached} requests reached the upstream, {total_incomplete} of them unfinished at a kill; {total_held} entries came back held; lost: 0",
        started.elapsed().as_secs_f64()
    );
}
