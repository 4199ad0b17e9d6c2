//! Owner presence backends: where the engine's presence input comes from.
//!
//! - `none`: a dedicated machine, the owner is never present;
//! - `manual`: the owner says present or away through the admin API;
//! - `command`: the owner's own check (exit 0 present, 1 away);
//! - `logind`: the owner's login sessions (see [`LogindBackend`]);
//! - `windows`: the Windows console session (see [`WindowsSessionBackend`]);
//! - `auto` (the default): on Windows `windows`; elsewhere `logind` on a
//!   machine with login seats, else `none`.
//!
//! A backend that cannot answer reports *unknown*, which refuses host-scoped
//! work (OWN-01) rather than lending while the owner may be there.

mod command;
mod logind;
pub mod windows;

pub use command::CommandBackend;
pub use logind::LogindBackend;
pub use windows::{WindowsSessionBackend, windows_session};

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::config::{OwnerConfig, PresenceMode};
use crate::engine::OwnerPresence;

/// A source of owner presence.
///
/// A backend that cannot answer returns [`OwnerPresence::Unknown`] (incomplete
/// session evidence), never `Away` (OWN-01).
#[async_trait]
pub trait PresenceBackend: Send + Sync {
    /// What `/status` and the logs call this backend.
    fn name(&self) -> &str;
    /// Whether the owner is at the machine now.
    async fn presence(&self) -> OwnerPresence;
}

/// `presence = "none"`: a dedicated machine whose owner is never present.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoneBackend;

#[async_trait]
impl PresenceBackend for NoneBackend {
    fn name(&self) -> &str {
        "none"
    }
    async fn presence(&self) -> OwnerPresence {
        OwnerPresence::Away
    }
}

/// A backend this build cannot answer with: presence stays unknown, which
/// refuses host-scoped work, and `why` says what to configure.
#[derive(Debug, Clone)]
pub struct UnavailableBackend {
    name: String,
    /// Why presence cannot be read, with the configuration hint.
    pub why: String,
}

#[async_trait]
impl PresenceBackend for UnavailableBackend {
    fn name(&self) -> &str {
        &self.name
    }
    async fn presence(&self) -> OwnerPresence {
        OwnerPresence::Unknown
    }
}

/// Whether this machine has login seats (a desktop whose owner may sit at it).
pub fn machine_has_seats(seats_dir: &Path) -> bool {
    std::fs::read_dir(seats_dir)
        .map(|mut entries| entries.any(|e| e.is_ok()))
        .unwrap_or(false)
}

/// `presence = "manual"`: the owner sets presence through the admin API
/// (`POST /admin/owner`). It starts unknown, which refuses host-scoped work,
/// until the owner first says present or away.
#[derive(Debug, Clone, Default)]
pub struct ManualPresence(Arc<Mutex<OwnerPresence>>);

impl ManualPresence {
    /// Record what the owner said.
    pub fn set(&self, present: bool) {
        let value = if present {
            OwnerPresence::Present
        } else {
            OwnerPresence::Away
        };
        match self.0.lock() {
            Ok(mut g) => *g = value,
            Err(p) => *p.into_inner() = value,
        }
    }

    /// Forget what the owner said: presence is unknown until told again.
    pub fn clear(&self) {
        match self.0.lock() {
            Ok(mut g) => *g = OwnerPresence::Unknown,
            Err(p) => *p.into_inner() = OwnerPresence::Unknown,
        }
    }

    fn get(&self) -> OwnerPresence {
        match self.0.lock() {
            Ok(g) => *g,
            Err(p) => *p.into_inner(),
        }
    }
}

#[async_trait]
impl PresenceBackend for ManualPresence {
    fn name(&self) -> &str {
        "manual"
    }
    async fn presence(&self) -> OwnerPresence {
        self.get()
    }
}

/// The backend a configuration selects.
pub struct Presence {
    /// The backend the presence loop asks.
    pub backend: Box<dyn PresenceBackend>,
    /// The switch of the `manual` backend, for the admin API.
    pub manual: Option<ManualPresence>,
    /// The line to log at startup.
    pub line: String,
    /// How `/status` names the backend: its name, or for `auto` the choice
    /// made (`auto: logind`, `auto: none`).
    pub shown: String,
}

/// The backend `[owner]` selects, with the line to log at startup.
pub fn from_owner(owner: &OwnerConfig, seats_dir: &Path) -> Presence {
    let plain = |backend: Box<dyn PresenceBackend>, line: String| Presence {
        shown: backend.name().to_owned(),
        backend,
        manual: None,
        line,
    };
    let logind = |line: String| {
        let remote = if owner.remote_sessions_count {
            "remote (SSH) sessions count too"
        } else {
            "remote (SSH) sessions do not count"
        };
        plain(
            Box::new(LogindBackend::new(owner.remote_sessions_count)),
            format!(
                "{line}: the owner is present while an active, non-idle local graphical or console user session exists ({remote}); if logind cannot be read presence is unknown and host-scoped upstreams refuse work"
            ),
        )
    };
    let auto = |p: Presence| Presence {
        shown: format!("auto: {}", p.backend.name()),
        ..p
    };
    match owner.presence {
        PresenceMode::None => plain(
            Box::new(NoneBackend),
            "presence none: the owner is never present (a dedicated machine)".to_owned(),
        ),
        PresenceMode::Manual => {
            let manual = ManualPresence::default();
            Presence {
                backend: Box::new(manual.clone()),
                manual: Some(manual),
                shown: "manual".to_owned(),
                line: "presence manual: unknown until the owner says present or away (vacancyd admin-request presence away)".to_owned(),
            }
        }
        PresenceMode::Command if !owner.command.trim().is_empty() => plain(
            Box::new(CommandBackend::new(&owner.command)),
            "presence command: the owner's command decides (exit 0 present, 1 away, anything else unknown)".to_owned(),
        ),
        PresenceMode::Command => {
            // Validation refuses this configuration; stay on the owner's side.
            let why = "presence = \"command\" without [owner] command, so owner presence is unknown and host-scoped upstreams refuse work".to_owned();
            plain(
                Box::new(UnavailableBackend {
                    name: "command".to_owned(),
                    why: why.clone(),
                }),
                format!("presence command: {why}"),
            )
        }
        PresenceMode::Windows => windows_backend(owner, "presence windows".to_owned()),
        PresenceMode::Auto if cfg!(windows) => auto(windows_backend(
            owner,
            "presence auto: on Windows the console session decides (presence windows)".to_owned(),
        )),
        // Windows has no logind: on the owner's side, presence is unknown
        // (host-scoped work refused) rather than "never present".
        PresenceMode::Logind if cfg!(windows) => {
            let why = "logind does not exist on Windows, so owner presence is unknown and \
                       host-scoped upstreams refuse work; set [owner] presence = \"auto\" or \
                       \"windows\" (the console session), \"none\" on a dedicated machine, or \
                       \"manual\" or \"command\""
                .to_owned();
            plain(
                Box::new(UnavailableBackend {
                    name: "logind".to_owned(),
                    why: why.clone(),
                }),
                format!("presence logind: {why}"),
            )
        }
        PresenceMode::Logind => logind("presence logind".to_owned()),
        PresenceMode::Auto if machine_has_seats(seats_dir) => auto(logind(format!(
            "presence auto: login seats under {}, so logind decides (presence logind)",
            seats_dir.display()
        ))),
        PresenceMode::Auto => auto(plain(
            Box::new(NoneBackend),
            format!(
                "presence auto: no login seats under {}, so this is a dedicated machine (presence none)",
                seats_dir.display()
            ),
        )),
    }
}

/// `presence = "windows"`: the console session (see [`windows`]), with the
/// line to log at startup. Not a Windows build: unknown (validation refuses
/// the configuration).
fn windows_backend(owner: &OwnerConfig, line: String) -> Presence {
    let settings = windows::SessionSettings {
        locked_counts_as_away: owner.locked_counts_as_away,
        idle_after: None,
    };
    let locked = if settings.locked_counts_as_away {
        "away (locked_counts_as_away)"
    } else {
        "present (locked_counts_as_away = false)"
    };
    #[cfg(windows)]
    let (backend, line): (Box<dyn PresenceBackend>, String) = (
        Box::new(WindowsSessionBackend::console(settings)),
        format!(
            "{line}: the owner is present while a user is signed in on the console and the session is unlocked; away when nobody is signed in there; a locked session is {locked}; unknown during a sign-in or a user switch, or when Windows does not answer (host-scoped upstreams then refuse work); input idleness is not read (the service cannot see the owner's input)"
        ),
    );
    #[cfg(not(windows))]
    let (backend, line): (Box<dyn PresenceBackend>, String) = {
        let why = format!(
            "presence = \"windows\" reads the Windows console session and this is not a Windows build, so owner presence is unknown and host-scoped upstreams refuse work (a locked session would be {locked})"
        );
        (
            Box::new(UnavailableBackend {
                name: "windows".to_owned(),
                why: why.clone(),
            }),
            format!("{line}: {why}"),
        )
    };
    Presence {
        shown: backend.name().to_owned(),
        backend,
        manual: None,
        line,
    }
}

/// The backend a presence mode selects with the other `[owner]` keys at
/// their defaults, with the line to log at startup (see [`from_owner`]).
pub fn from_mode(mode: PresenceMode, seats_dir: &Path) -> Presence {
    let owner = OwnerConfig {
        presence: mode,
        ..OwnerConfig::default()
    };
    from_owner(&owner, seats_dir)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn none_is_away_and_unavailable_backends_are_unknown() {
        // OWN-01: a backend that cannot answer never reads as away.
        let dir = tempfile::tempdir().unwrap();
        let p = from_mode(PresenceMode::None, dir.path());
        assert_eq!(p.backend.presence().await, OwnerPresence::Away);
        assert!(p.line.contains("dedicated"));
        let p = from_mode(PresenceMode::Auto, dir.path());
        assert_eq!(
            p.backend.presence().await,
            OwnerPresence::Away,
            "no seats: none"
        );
        assert_eq!(p.backend.name(), "none");
        assert_eq!(p.shown, "auto: none", "/status says auto chose none");
        assert!(p.line.contains("no login seats"), "{}", p.line);
        // `command` without a command (validation refuses it) is unknown.
        let p = from_mode(PresenceMode::Command, dir.path());
        assert_eq!(p.backend.presence().await, OwnerPresence::Unknown);
    }

    #[test]
    fn auto_chooses_logind_on_a_machine_with_seats() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("seat0"), "").unwrap();
        let p = from_mode(PresenceMode::Auto, dir.path());
        assert_eq!(p.backend.name(), "logind");
        assert_eq!(p.shown, "auto: logind");
        assert!(p.line.contains("login seats under"), "{}", p.line);
        assert!(p.line.contains("do not count"), "{}", p.line);
        // Explicitly, and with remote sessions counting: from_owner passes it on.
        let owner = OwnerConfig {
            presence: PresenceMode::Logind,
            remote_sessions_count: true,
            ..OwnerConfig::default()
        };
        let empty = tempfile::tempdir().unwrap();
        let p = from_owner(&owner, empty.path());
        assert_eq!(p.backend.name(), "logind");
        assert!(p.line.starts_with("presence logind"), "{}", p.line);
        assert!(p.line.contains("count too"), "{}", p.line);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_command_backend_is_chosen_by_the_owner_table() {
        let dir = tempfile::tempdir().unwrap();
        let owner = OwnerConfig {
            presence: PresenceMode::Command,
            command: "exit 1".to_owned(),
            ..OwnerConfig::default()
        };
        let p = from_owner(&owner, dir.path());
        assert_eq!(p.backend.name(), "command");
        assert_eq!(p.backend.presence().await, OwnerPresence::Away);
        assert!(p.line.contains("exit 0 present"), "{}", p.line);
        // Without a command (validation refuses that config) presence stays unknown.
        let empty = OwnerConfig {
            command: String::new(),
            ..owner
        };
        assert_eq!(
            from_owner(&empty, dir.path()).backend.presence().await,
            OwnerPresence::Unknown
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn own_01_the_windows_session_off_windows_is_unknown() {
        // Validation refuses presence = "windows" off Windows; were it run,
        // presence stays unknown, never away.
        let dir = tempfile::tempdir().unwrap();
        let p = from_mode(PresenceMode::Windows, dir.path());
        assert_eq!(p.backend.name(), "windows");
        assert_eq!(p.shown, "windows");
        assert_eq!(p.backend.presence().await, OwnerPresence::Unknown);
        assert!(p.line.contains("not a Windows build"), "{}", p.line);
        assert!(p.line.contains("locked_counts_as_away"), "{}", p.line);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn manual_presence_starts_unknown_and_follows_the_owner() {
        // OWN-01: unknown until the owner speaks.
        let dir = tempfile::tempdir().unwrap();
        let p = from_mode(PresenceMode::Manual, dir.path());
        assert_eq!(p.backend.presence().await, OwnerPresence::Unknown);
        let switch = p.manual.unwrap();
        switch.set(false);
        assert_eq!(p.backend.presence().await, OwnerPresence::Away);
        switch.set(true);
        assert_eq!(p.backend.presence().await, OwnerPresence::Present);
    }
}
