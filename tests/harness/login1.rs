//! The fake logind on its private bus, asked by the real `loginctl`: what it
//! prints is what vacancy's logind presence backend reads.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use vacancy_test_support::{FakeSession, Login1Bus};

fn loginctl(bus: &Login1Bus, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bus.loginctl())
        .args(args)
        .env("DBUS_SYSTEM_BUS_ADDRESS", bus.address())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn loginctl_lists_and_shows_the_sessions_the_test_sets() {
    let mut bus = Login1Bus::start().unwrap();
    let list = ["--no-pager", "--no-legend", "list-sessions"];
    let (ok, out, err) = loginctl(&bus, &list);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "", "no sessions yet");

    bus.set_sessions(&[
        FakeSession::local("2", "wayland").idle(true),
        FakeSession::ssh("c5"),
    ])
    .unwrap();
    let (ok, out, err) = loginctl(&bus, &list);
    assert!(ok, "{err}");
    let ids: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(ids, ["2", "c5"], "{out}");

    let show = [
        "--no-pager",
        "--all",
        "show-session",
        "2",
        "c5",
        "-p",
        "Id",
        "-p",
        "Type",
        "-p",
        "Remote",
        "-p",
        "IdleHint",
        "-p",
        "Class",
    ];
    let (ok, out, err) = loginctl(&bus, &show);
    assert!(ok, "{err}");
    let blocks: Vec<&str> = out.split("\n\n").collect();
    assert_eq!(blocks.len(), 2, "{out}");
    for line in [
        "Id=2",
        "Type=wayland",
        "Remote=no",
        "IdleHint=yes",
        "Class=user",
    ] {
        assert!(blocks[0].lines().any(|l| l == line), "{line} in {out}");
    }
    for line in ["Id=c5", "Type=tty", "Remote=yes", "IdleHint=no"] {
        assert!(blocks[1].lines().any(|l| l == line), "{line} in {out}");
    }
    assert!(
        bus.service_log().contains("GetSession"),
        "{}",
        bus.service_log()
    );

    // An unknown session, then no service: loginctl fails, saying why.
    let (ok, _, err) = loginctl(&bus, &["--no-pager", "show-session", "9"]);
    assert!(!ok);
    assert!(err.contains("No session '9' known"), "{err}");
    bus.stop_service().unwrap();
    let (ok, _, err) = loginctl(&bus, &list);
    assert!(!ok);
    assert!(err.contains("org.freedesktop.login1"), "{err}");
}
