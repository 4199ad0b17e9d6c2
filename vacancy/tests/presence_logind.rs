//! The logind presence backend against the real `loginctl` and a fake
//! systemd-logind on a private bus (vacancy-test-support's [`Login1Bus`]).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use vacancy::engine::OwnerPresence;
use vacancy::presence::{LogindBackend, PresenceBackend};
use vacancy_test_support::{FakeSession, Login1Bus};

fn backend(bus: &Login1Bus, remote_sessions_count: bool) -> LogindBackend {
    LogindBackend::new(remote_sessions_count)
        .with_loginctl(bus.loginctl())
        .with_bus_address(bus.address())
}

fn ask(backend: &LogindBackend) -> OwnerPresence {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(backend.presence())
}

#[test]
fn sessions_decide_presence() {
    // OWN-01: the owner at the machine is present, and refuses host-scoped work.
    let bus = Login1Bus::start().unwrap();
    let local = backend(&bus, false);
    let remote_counts = backend(&bus, true);
    let cases: Vec<(&str, Vec<FakeSession>, OwnerPresence, OwnerPresence)> = vec![
        (
            "no sessions",
            vec![],
            OwnerPresence::Away,
            OwnerPresence::Away,
        ),
        (
            "x11",
            vec![FakeSession::local("2", "x11")],
            OwnerPresence::Present,
            OwnerPresence::Present,
        ),
        (
            "wayland",
            vec![FakeSession::local("3", "wayland")],
            OwnerPresence::Present,
            OwnerPresence::Present,
        ),
        (
            "tty",
            vec![FakeSession::local("4", "tty")],
            OwnerPresence::Present,
            OwnerPresence::Present,
        ),
        (
            "idle wayland",
            vec![FakeSession::local("3", "wayland").idle(true)],
            OwnerPresence::Away,
            OwnerPresence::Away,
        ),
        (
            "ssh only",
            vec![FakeSession::ssh("c5")],
            OwnerPresence::Away,
            OwnerPresence::Present,
        ),
        (
            "greeter",
            vec![FakeSession::greeter("c1")],
            OwnerPresence::Away,
            OwnerPresence::Away,
        ),
        (
            "greeter, idle desktop and ssh, then a console login",
            vec![
                FakeSession::greeter("c1"),
                FakeSession::local("2", "x11").idle(true),
                FakeSession::ssh("c5"),
                FakeSession::local("7", "tty"),
            ],
            OwnerPresence::Present,
            OwnerPresence::Present,
        ),
    ];
    for (what, sessions, want, want_with_remote) in cases {
        bus.set_sessions(&sessions).unwrap();
        assert_eq!(ask(&local), want, "{what}\n{}", bus.service_log());
        assert_eq!(
            ask(&remote_counts),
            want_with_remote,
            "{what} (remote sessions count)"
        );
    }
}

#[test]
fn no_logind_or_no_bus_is_unknown() {
    // OWN-01: incomplete session evidence is unknown, never away.
    let mut bus = Login1Bus::start().unwrap();
    let b = backend(&bus, false);
    bus.set_sessions(&[]).unwrap();
    assert_eq!(ask(&b), OwnerPresence::Away);
    bus.stop_service().unwrap();
    assert_eq!(ask(&b), OwnerPresence::Unknown, "the service is gone");
    bus.start_service().unwrap();
    assert_eq!(ask(&b), OwnerPresence::Away, "it is back");
    bus.stop_bus().unwrap();
    assert_eq!(ask(&b), OwnerPresence::Unknown, "the bus is gone");
}

#[test]
fn garbage_and_silence_are_unknown() {
    // OWN-01: what cannot be read is unknown, never away.
    let bus = Login1Bus::start().unwrap();
    let b = backend(&bus, false);
    let odd = FakeSession::local("2", "x11").with_property("Active", "s", "perhaps".into());
    bus.set_sessions(&[odd]).unwrap();
    assert_eq!(ask(&b), OwnerPresence::Unknown, "{}", bus.service_log());
    let odd = FakeSession::ssh("c5").with_property("IdleHint", "u", 7.into());
    bus.set_sessions(&[odd]).unwrap();
    assert_eq!(ask(&b), OwnerPresence::Unknown, "{}", bus.service_log());

    // A logind that never answers: loginctl is killed after the bound.
    bus.go_silent().unwrap();
    let quick = backend(&bus, false).with_timeout(Duration::from_millis(500));
    let started = Instant::now();
    assert_eq!(ask(&quick), OwnerPresence::Unknown);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    bus.set_sessions(&[FakeSession::local("2", "x11")]).unwrap();
    // With the default bound: a loaded machine can take over 500 ms to run
    // loginctl, and this only checks that the silence did not stick.
    assert_eq!(ask(&b), OwnerPresence::Present, "answers again");
}
