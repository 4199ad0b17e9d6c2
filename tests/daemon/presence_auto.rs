//! `presence = "auto"` (the embedded default) through a real vacancyd: the
//! choice it made is logged at startup and shown in `/status`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{Daemon, Setup};
use vacancy_test_support::free_port;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_shows_its_choice_in_status_and_the_startup_log() {
    // logind where the machine has login seats, else none (a dedicated machine).
    let seats = std::fs::read_dir("/run/systemd/seats")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    let (chosen, line) = if seats {
        ("auto: logind", "so logind decides")
    } else {
        ("auto: none", "so this is a dedicated machine")
    };
    let closed = format!("http://127.0.0.1:{}", free_port().unwrap());
    let d = Daemon::setup(Setup {
        target: &closed,
        presence: "auto",
        ..Setup::default()
    });
    let s = d.status().await;
    assert_eq!(s["presence_backend"], chosen, "{s:#}");
    let log = d.process.log();
    assert!(
        log.contains("presence auto: ") && log.contains(line),
        "{log}"
    );
    let out = std::process::Command::new(vacancy_test_support::vacancyd())
        .args(["status", "--url", &d.control])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("(presence {chosen})")), "{text}");
}
