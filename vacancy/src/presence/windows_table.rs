//! The session decision as a table (issue 33 item 2): each row is the
//! console's facts, the owner's settings and the presence they decide. The
//! unit tests check [`windows_session`] against it, and so does the Windows
//! build's own check program (`vacancy-cli/examples/win32_checks.rs`, run
//! under Wine), so the table holds on both builds.

use std::time::Duration;

#[cfg(doc)]
use super::windows_session;
use super::{ConsoleState, SessionFacts, SessionSettings};
use crate::engine::OwnerPresence;

/// One row: what it is, the facts, the settings, the presence decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecisionRow {
    /// The case, in words.
    pub what: &'static str,
    /// The console's facts.
    pub facts: SessionFacts,
    /// The owner's settings.
    pub settings: SessionSettings,
    /// The presence they decide.
    pub expected: OwnerPresence,
}

const SIGNED_OUT: ConsoleState = ConsoleState::SignedOut;
const CHANGING: ConsoleState = ConsoleState::Changing;
const LOCKED: ConsoleState = ConsoleState::SignedIn { locked: Some(true) };
const UNLOCKED: ConsoleState = ConsoleState::SignedIn {
    locked: Some(false),
};
const LOCK_UNSAID: ConsoleState = ConsoleState::SignedIn { locked: None };

/// A row from seconds since input, `locked_counts_as_away` and `idle_after_s`.
fn row(
    what: &'static str,
    console: ConsoleState,
    since_input_s: Option<u64>,
    locked_counts_as_away: bool,
    idle_after_s: Option<u64>,
    expected: OwnerPresence,
) -> DecisionRow {
    DecisionRow {
        what,
        facts: SessionFacts {
            console,
            since_input: since_input_s.map(Duration::from_secs),
        },
        settings: SessionSettings {
            locked_counts_as_away,
            idle_after: idle_after_s.map(Duration::from_secs),
        },
        expected,
    }
}

/// Signed out, locked, unlocked, switching and input idle, with and without
/// each setting.
#[rustfmt::skip] // one row a line: a table
pub fn decision_table() -> Vec<DecisionRow> {
    use OwnerPresence::{Away, Present, Unknown};
    vec![
        row("signed out", SIGNED_OUT, None, true, None, Away),
        row("signed out, locked kept", SIGNED_OUT, None, false, None, Away),
        row("signed out, recent input", SIGNED_OUT, Some(1), true, Some(300), Away),
        row("locked", LOCKED, None, true, None, Away),
        row("locked, not counted as away", LOCKED, None, false, None, Present),
        row("locked, not away, input idle", LOCKED, Some(900), false, Some(300), Away),
        row("locked, recent input", LOCKED, Some(1), true, Some(300), Away),
        row("lock state not said", LOCK_UNSAID, None, true, None, Unknown),
        row("lock state not said, locks do not count", LOCK_UNSAID, None, false, None, Present),
        row("unlocked", UNLOCKED, None, true, None, Present),
        row("unlocked, locks do not count", UNLOCKED, None, false, None, Present),
        row("unlocked, input recent", UNLOCKED, Some(10), true, Some(300), Present),
        row("unlocked, input idle", UNLOCKED, Some(300), true, Some(300), Away),
        row("unlocked, input time unknown", UNLOCKED, None, true, Some(300), Present),
        row("unlocked, input idle, no idle_after", UNLOCKED, Some(9999), true, None, Present),
        row("switching", CHANGING, None, true, None, Unknown),
        row("switching, recent input", CHANGING, Some(1), false, Some(300), Unknown),
    ]
}
