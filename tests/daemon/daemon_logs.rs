//! What a real vacancyd writes to its log: no escape codes where stderr is a
//! file (or journald), colour on a terminal unless `NO_COLOR`, JSON lines for
//! log shippers (issue 14 item 12); and the one SCOPE-18 line naming the
//! owner-exempt upstreams, the same in the startup log and in `check-config`
//! (issue 14 item 13).
//!
//! The upstream is a port nothing listens on: what is tested is the daemon's
//! own output, which no upstream changes.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{Daemon, Setup};
use vacancy_test_support::{ManagedProcess, free_port};

/// The SCOPE-18 line of a configuration whose only upstream, `llama`, is exempt.
const EXEMPT_LINE: &str = "owner-exempt upstreams (owner_scope = \"resource\"): llama";

/// A configuration with the owner-exempt upstream `llama` on ports `control`
/// and `proxy`, written into `dir`.
fn exempt_config(dir: &Path, control: u16, proxy: u16) -> PathBuf {
    let target = format!("http://127.0.0.1:{}", free_port().unwrap());
    let setup = Setup {
        target: &target,
        upstream: "owner_scope = \"resource\"",
        ..Setup::default()
    };
    common::write_capacity(&dir.join("gpu0.json"), 20_000, 64_000);
    let path = dir.join("vacancyd.toml");
    std::fs::write(&path, common::config(dir, control, proxy, &setup)).unwrap();
    path
}

/// A started daemon on [`exempt_config`], with `env` set.
fn start(env: &[(&str, &str)]) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let (control, proxy) = (free_port().unwrap(), free_port().unwrap());
    let path = exempt_config(dir.path(), control, proxy);
    Daemon::start_with_env(dir, &path, control, proxy, env)
}

fn check_config(path: &Path) -> Output {
    Command::new(vacancy_test_support::vacancyd())
        .args(["check-config", "--no-sample", "--config"])
        .arg(path)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

// Issue 14 item 12: a log file (as journald gets) carries no ANSI escape
// codes; today every line starts with "\x1b[2m".
#[test]
fn a_log_file_gets_no_ansi_escape_codes() {
    let mut d = start(&[]);
    d.process.terminate(Duration::from_secs(10)).unwrap();
    let log = d.process.log();
    assert!(log.contains(" INFO "), "{log}");
    assert!(
        log.contains(" WARN "),
        "a warning is logged too (SCOPE-19):\n{log}"
    );
    assert!(
        !log.contains('\x1b'),
        "escape codes in the log file:\n{}",
        log.escape_debug()
    );
}

// Issue 14 item 12: VACANCYD_LOG_FORMAT=json writes one JSON object per line,
// with the event's fields at the top level.
#[test]
fn vacancyd_log_format_json_writes_one_object_per_line() {
    let mut d = start(&[("VACANCYD_LOG_FORMAT", "json")]);
    d.process.terminate(Duration::from_secs(10)).unwrap();
    let log = d.process.log();
    let events: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert!(events.len() >= 3, "{log}");
    for e in &events {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(e[key].is_string(), "no {key} in {e}");
        }
    }
    let open = events
        .iter()
        .find(|e| e["message"] == "recovery directory open")
        .unwrap_or_else(|| panic!("{log}"));
    assert_eq!(open["level"], "INFO");
    assert!(
        open["dir"]
            .as_str()
            .unwrap()
            .ends_with("vacancyd.admission"),
        "{open}"
    );
    assert!(events.iter().any(|e| e["message"] == EXEMPT_LINE), "{log}");
    assert!(events.iter().any(|e| e["message"] == "ready"), "{log}");
}

// Issue 14 item 12: an unknown format is named, and nothing starts.
#[test]
fn an_unknown_log_format_is_named_and_nothing_starts() {
    let dir = tempfile::tempdir().unwrap();
    let path = exempt_config(dir.path(), free_port().unwrap(), free_port().unwrap());
    let mut cmd = Command::new(vacancy_test_support::vacancyd());
    cmd.args(["run", "--config"])
        .arg(&path)
        .env("VACANCYD_LOG_FORMAT", "logfmt");
    let mut p = ManagedProcess::spawn("vacancyd", cmd).unwrap();
    let status = p.wait_exit(Duration::from_secs(20));
    let log = p.log();
    assert!(status.is_some_and(|s| !s.success()), "{status:?}: {log}");
    assert!(
        log.contains("VACANCYD_LOG_FORMAT=\"logfmt\" is not a log format"),
        "{log}"
    );
    assert!(!dir.path().join("vacancyd.admission").exists());
}

/// `vacancyd run` under a pseudo-terminal (util-linux `script`), on a
/// configuration whose upstream port is taken so that it logs its startup and
/// stops; returns what the terminal showed.
fn run_on_a_terminal(no_color: Option<&str>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = taken.local_addr().unwrap().port();
    let path = exempt_config(dir.path(), free_port().unwrap(), proxy);
    let command = format!(
        "exec {} run --config {}",
        vacancy_test_support::vacancyd().display(),
        path.display()
    );
    let mut cmd = Command::new("timeout");
    cmd.args([
        "60",
        "script",
        "--quiet",
        "--return",
        "--command",
        &command,
        "/dev/null",
    ])
    .env("VACANCYD_LOG", "info")
    .env_remove("NO_COLOR")
    .env_remove("VACANCYD_LOG_FORMAT");
    if let Some(v) = no_color {
        cmd.env("NO_COLOR", v);
    }
    let out = cmd
        .output()
        .expect("util-linux `script` runs (Debian's bsdutils)");
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    assert!(shown.contains("cannot listen on"), "{shown}");
    assert!(shown.contains(EXEMPT_LINE), "{shown}");
    shown
}

// Issue 14 item 12: on a terminal the lines are coloured, unless NO_COLOR.
#[test]
fn a_terminal_gets_colour_unless_no_color_is_set() {
    let coloured = run_on_a_terminal(None);
    assert!(coloured.contains("\x1b["), "{coloured}");
    let plain = run_on_a_terminal(Some("1"));
    assert!(!plain.contains('\x1b'), "{}", plain.escape_debug());
}

// Issue 14 item 13 (SCOPE-18): the daemon logs the exempt upstreams in one
// line at startup, and check-config prints that same line; today the daemon
// logs two different lines and check-config a third.
#[test]
fn the_exempt_upstreams_are_one_line_in_the_startup_log_and_check_config() {
    let mut d = start(&[]);
    d.process.terminate(Duration::from_secs(10)).unwrap();
    let log = d.process.log();
    let logged: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("owner-exempt upstreams"))
        .collect();
    assert_eq!(logged.len(), 1, "{log}");
    assert!(logged[0].contains(" INFO "), "{}", logged[0]);
    assert!(
        logged[0].ends_with(&format!(": {EXEMPT_LINE}")),
        "{}",
        logged[0]
    );

    let out = check_config(&d.dir.path().join("vacancyd.toml"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let printed: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("owner-exempt upstreams"))
        .collect();
    assert_eq!(printed, [EXEMPT_LINE], "{stdout}");
}
