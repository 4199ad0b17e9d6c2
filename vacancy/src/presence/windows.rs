//! `presence = "windows"` (and `auto` on Windows): the owner's presence from
//! the Windows console session (issue 33 item 2).
//!
//! Two pure steps, compiled and tested on every system: [`console_state`]
//! reads what the Win32 calls answered (vacancy-win32's `session` module),
//! and [`windows_session`] decides presence from it. The backend,
//! [`WindowsSessionBackend`], asks on every poll of the presence loop (every
//! second); session-change notifications (`WTSRegisterSessionNotification`)
//! are not used, since a poll a second is as prompt as the loop that reads
//! it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tracing::{info, warn};

use super::PresenceBackend;
use crate::engine::OwnerPresence;

/// What the console says about its user, as the decision needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsoleState {
    /// Nobody is signed in on the console (the sign-in screen, or a session
    /// left disconnected from it).
    SignedOut,
    /// A sign-in or a user switch is under way: no session is attached to
    /// the console, or the attached one is still connecting.
    Changing,
    /// A user is signed in on the console.
    SignedIn {
        /// Whether the session is locked: `None` when Windows does not say.
        locked: Option<bool>,
    },
}

/// The session facts one decision is made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionFacts {
    /// The console session.
    pub console: ConsoleState,
    /// How long since the owner's last keyboard or mouse input, where it is
    /// known. The service cannot know it (`GetLastInputInfo` sees only its
    /// own session 0), so the daemon passes `None`; a program in the
    /// owner's session (the tray, issue 33 item 1) can.
    pub since_input: Option<Duration>,
}

/// How the facts are judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSettings {
    /// `[owner] locked_counts_as_away`: a locked session is away (default)
    /// rather than present.
    pub locked_counts_as_away: bool,
    /// With input idleness known: a signed-in, unlocked session is present
    /// only while its last input is more recent than this. `None`: the
    /// session alone decides. Not configurable yet (see `since_input`).
    pub idle_after: Option<Duration>,
}

impl Default for SessionSettings {
    fn default() -> Self {
        SessionSettings {
            locked_counts_as_away: true,
            idle_after: None,
        }
    }
}

/// Whether the owner is at this Windows machine, from the console session.
///
/// - a sign-in or a switch under way: unknown (the pressure readings then
///   stand until stale, PRES-11..13; host-scoped work is refused, OWN-01);
/// - nobody signed in: away;
/// - locked: away, or as unlocked when `locked_counts_as_away` is off;
///   unknown when Windows does not say whether it is locked (and it
///   matters);
/// - signed in and unlocked: present, except that with `idle_after` set and
///   the time since the last input known, input longer ago than that is
///   away. Unknown input time never makes the owner away.
pub fn windows_session(facts: &SessionFacts, settings: &SessionSettings) -> OwnerPresence {
    match facts.console {
        ConsoleState::Changing => OwnerPresence::Unknown,
        ConsoleState::SignedOut => OwnerPresence::Away,
        ConsoleState::SignedIn { locked } => {
            if settings.locked_counts_as_away {
                match locked {
                    None => return OwnerPresence::Unknown,
                    Some(true) => return OwnerPresence::Away,
                    Some(false) => {}
                }
            }
            match (settings.idle_after, facts.since_input) {
                (Some(limit), Some(since)) if since >= limit => OwnerPresence::Away,
                _ => OwnerPresence::Present,
            }
        }
    }
}

/// `WTS_CONNECTSTATE_CLASS` values the reading uses.
mod state {
    pub const ACTIVE: i32 = 0;
    pub const CONNECTED: i32 = 1;
    pub const CONNECT_QUERY: i32 = 2;
    pub const SHADOW: i32 = 3;
    pub const DISCONNECTED: i32 = 4;
    pub const IDLE: i32 = 5;
    pub const LISTEN: i32 = 6;
    pub const RESET: i32 = 7;
    pub const DOWN: i32 = 8;
    pub const INIT: i32 = 9;
}

/// What the Win32 calls answered about the console session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WtsConsole {
    /// `WTSGetActiveConsoleSessionId`; `None` while no session is attached.
    pub session: Option<u32>,
    /// `WTSConnectState` (`WTS_CONNECTSTATE_CLASS`).
    pub connect_state: i32,
    /// `WTSUserName`: empty when nobody is signed in.
    pub user_name: String,
    /// `WTSSessionInfoEx`'s `SessionFlags` (0 locked, 1 unlocked, -1
    /// unknown); `Err` with the reason when the call failed.
    pub session_flags: Result<i32, String>,
}

/// The console's state from what the Win32 calls answered.
///
/// No session attached, or one connecting or initialising (`ConnectQuery`,
/// `Init`), or active without a user yet, is a sign-in or switch under way.
/// Active (or shadowed) with a user is signed in, locked as `SessionFlags`
/// says (anything but 0 or 1, or a failed call, is not said). Connected
/// (the sign-in screen), disconnected, idle, listening, reset or down is
/// nobody signed in, except that connected with a user name is between two
/// states, so changing. An unknown state value is changing too: never away
/// on what this code cannot read.
pub fn console_state(console: &WtsConsole) -> ConsoleState {
    if console.session.is_none() {
        return ConsoleState::Changing;
    }
    let user = !console.user_name.trim().is_empty();
    match console.connect_state {
        state::ACTIVE | state::SHADOW if user => ConsoleState::SignedIn {
            locked: match console.session_flags {
                Ok(0) => Some(true),
                Ok(1) => Some(false),
                _ => None,
            },
        },
        state::CONNECTED if user => ConsoleState::Changing,
        state::CONNECTED
        | state::DISCONNECTED
        | state::IDLE
        | state::LISTEN
        | state::RESET
        | state::DOWN => ConsoleState::SignedOut,
        state::ACTIVE | state::SHADOW | state::CONNECT_QUERY | state::INIT => {
            ConsoleState::Changing
        }
        _ => ConsoleState::Changing,
    }
}

/// A one-line account of what the console answered, for the log.
pub fn describe(console: &WtsConsole) -> String {
    let Some(id) = console.session else {
        return "no session attached to the console (a switch under way)".to_owned();
    };
    let user = if console.user_name.is_empty() {
        "no user".to_owned()
    } else {
        format!("user {:?}", console.user_name)
    };
    let lock = match &console.session_flags {
        Ok(0) => "locked".to_owned(),
        Ok(1) => "unlocked".to_owned(),
        Ok(other) => format!("lock state not known (SessionFlags {other})"),
        Err(e) => format!("lock state not readable ({e})"),
    };
    format!(
        "console session {id}: connect state {}, {user}, {lock}",
        console.connect_state
    )
}

/// Reads the console session; `Err` with the reason when it cannot.
pub type ConsoleReader = dyn Fn() -> Result<WtsConsole, String> + Send + Sync;

/// Presence from the Windows console session, asked on every poll.
///
/// Unknown (OWN-01) when the console cannot be read; each change of what
/// the console answered is logged once (what it is, or why not).
pub struct WindowsSessionBackend {
    read: Arc<ConsoleReader>,
    settings: SessionSettings,
    last: Mutex<Option<String>>,
}

impl WindowsSessionBackend {
    /// A backend asking `read` and judging with `settings`.
    pub fn new(read: Arc<ConsoleReader>, settings: SessionSettings) -> Self {
        WindowsSessionBackend {
            read,
            settings,
            last: Mutex::new(None),
        }
    }

    /// The backend reading this machine's console through vacancy-win32.
    #[cfg(windows)]
    pub fn console(settings: SessionSettings) -> Self {
        Self::new(Arc::new(read_console), settings)
    }

    /// Log `line` when it differs from the last one logged.
    fn note(&self, line: &str, failed: bool) {
        let mut last = match self.last.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if last.as_deref() != Some(line) {
            if failed {
                warn!("presence windows: {line}; presence is unknown");
            } else {
                info!("presence windows: {line}");
            }
            *last = Some(line.to_owned());
        }
    }
}

#[async_trait]
impl PresenceBackend for WindowsSessionBackend {
    fn name(&self) -> &str {
        "windows"
    }

    async fn presence(&self) -> OwnerPresence {
        let read = Arc::clone(&self.read);
        // The WTS calls ask the Terminal Services service: off the runtime.
        let answer = match tokio::task::spawn_blocking(move || read()).await {
            Ok(answer) => answer,
            Err(e) => Err(format!("the session reader ended: {e}")),
        };
        match answer {
            Ok(console) => {
                self.note(&describe(&console), false);
                let facts = SessionFacts {
                    console: console_state(&console),
                    since_input: None,
                };
                windows_session(&facts, &self.settings)
            }
            Err(why) => {
                self.note(&why, true);
                OwnerPresence::Unknown
            }
        }
    }
}

/// This machine's console session, through vacancy-win32.
#[cfg(windows)]
fn read_console() -> Result<WtsConsole, String> {
    use vacancy_win32::session;
    let Some(id) = session::active_console_session() else {
        return Ok(WtsConsole {
            session: None,
            connect_state: -1,
            user_name: String::new(),
            session_flags: Err("no session".to_owned()),
        });
    };
    let connect_state = session::connect_state(id)
        .map_err(|e| format!("WTSQuerySessionInformationW(WTSConnectState) failed: {e}"))?;
    let user_name = session::user_name(id)
        .map_err(|e| format!("WTSQuerySessionInformationW(WTSUserName) failed: {e}"))?;
    let session_flags = session::session_flags(id)
        .map_err(|e| format!("WTSQuerySessionInformationW(WTSSessionInfoEx) failed: {e}"));
    Ok(WtsConsole {
        session: Some(id),
        connect_state,
        user_name,
        session_flags,
    })
}

#[path = "windows_table.rs"]
mod table;
pub use table::{DecisionRow, decision_table};

#[cfg(test)]
#[path = "windows_tests.rs"]
mod tests;
