#![allow(clippy::unwrap_used)]
use super::*;

const SIGNED_OUT: ConsoleState = ConsoleState::SignedOut;
const CHANGING: ConsoleState = ConsoleState::Changing;
const LOCKED: ConsoleState = ConsoleState::SignedIn { locked: Some(true) };
const UNLOCKED: ConsoleState = ConsoleState::SignedIn {
    locked: Some(false),
};
const LOCK_UNSAID: ConsoleState = ConsoleState::SignedIn { locked: None };

#[test]
fn own_01_the_session_decision_table() {
    let table = decision_table();
    assert_eq!(table.len(), 17);
    for row in table {
        assert_eq!(
            windows_session(&row.facts, &row.settings),
            row.expected,
            "{}",
            row.what
        );
    }
}

#[test]
fn pres_11_to_13_a_sign_in_or_switch_is_unknown_never_away() {
    // PRES-11, PRES-12, PRES-13 then apply: the last pressure reading stands until stale,
    // and host-scoped work is refused (OWN-01) rather than lent.
    for settings in [
        SessionSettings::default(),
        SessionSettings {
            locked_counts_as_away: false,
            idle_after: Some(Duration::from_secs(60)),
        },
    ] {
        for since in [None, Some(Duration::ZERO), Some(Duration::from_secs(3600))] {
            let facts = SessionFacts {
                console: ConsoleState::Changing,
                since_input: since,
            };
            assert_eq!(windows_session(&facts, &settings), OwnerPresence::Unknown);
        }
    }
}

fn wts(session: Option<u32>, state: i32, user: &str, flags: Result<i32, String>) -> WtsConsole {
    WtsConsole {
        session,
        connect_state: state,
        user_name: user.to_owned(),
        session_flags: flags,
    }
}

#[test]
fn the_console_state_is_read_from_what_wts_answered() {
    let table = [
        // No session attached to the console: a switch under way.
        (wts(None, 0, "owner", Ok(1)), CHANGING),
        // The sign-in screen: connected, nobody signed in.
        (wts(Some(1), 1, "", Ok(-1)), SIGNED_OUT),
        (wts(Some(1), 4, "owner", Ok(1)), SIGNED_OUT),
        (wts(Some(1), 8, "", Err("x".into())), SIGNED_OUT),
        // Signing in: connecting, initialising, active without a user yet,
        // connected with a user.
        (wts(Some(2), 2, "", Ok(-1)), CHANGING),
        (wts(Some(2), 9, "owner", Ok(1)), CHANGING),
        (wts(Some(2), 0, "", Ok(1)), CHANGING),
        (wts(Some(2), 1, "owner", Ok(1)), CHANGING),
        // A state this code does not know is never away.
        (wts(Some(2), 42, "owner", Ok(1)), CHANGING),
        // Signed in: the lock as SessionFlags says.
        (wts(Some(1), 0, "owner", Ok(0)), LOCKED),
        (wts(Some(1), 0, "owner", Ok(1)), UNLOCKED),
        (wts(Some(1), 3, "owner", Ok(1)), UNLOCKED),
        (wts(Some(1), 0, "owner", Ok(-1)), LOCK_UNSAID),
        (
            wts(Some(1), 0, "owner", Err("not supported".into())),
            LOCK_UNSAID,
        ),
    ];
    for (console, expected) in table {
        assert_eq!(console_state(&console), expected, "{}", describe(&console));
    }
}

#[tokio::test(flavor = "current_thread")]
async fn own_01_the_backend_is_unknown_when_the_console_cannot_be_read() {
    let backend = WindowsSessionBackend::new(
        Arc::new(|| Err("WTSGetActiveConsoleSessionId failed".to_owned())),
        SessionSettings::default(),
    );
    assert_eq!(backend.name(), "windows");
    assert_eq!(backend.presence().await, OwnerPresence::Unknown);
    let unlocked = WindowsSessionBackend::new(
        Arc::new(|| Ok(wts(Some(1), 0, "owner", Ok(1)))),
        SessionSettings::default(),
    );
    assert_eq!(unlocked.presence().await, OwnerPresence::Present);
    let locked = || Ok(wts(Some(1), 0, "owner", Ok(0)));
    let away = WindowsSessionBackend::new(Arc::new(locked), SessionSettings::default());
    assert_eq!(away.presence().await, OwnerPresence::Away);
    let kept = WindowsSessionBackend::new(
        Arc::new(locked),
        SessionSettings {
            locked_counts_as_away: false,
            idle_after: None,
        },
    );
    assert_eq!(kept.presence().await, OwnerPresence::Present);
}
