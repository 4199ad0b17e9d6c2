//! Owner presence backends: where the engine's presence input comes from.
//!
//! This release has `none` (a dedicated machine: the owner is never present),
//! `manual` (the owner says present or away through the admin API),
//! `command` (the owner's own check: exit 0 present, 1 away) and `auto`.
//! `logind` follows with the owner issue; until then `auto` on a machine
//! with seats reports *unknown*, which refuses host-scoped work (OWN-01)
//! rather than lending while the owner may be there.

mod command;

pub use command::CommandBackend;

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::config::{OwnerConfig, PresenceMode};
use crate::engine::OwnerPresence;

/// A source of owner presence.
///
/// # Behavior
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
}

/// The backend `[owner]` selects, with the line to log at startup.
pub fn from_owner(owner: &OwnerConfig, seats_dir: &Path) -> Presence {
    if owner.presence == PresenceMode::Command && !owner.command.trim().is_empty() {
        return Presence {
            backend: Box::new(CommandBackend::new(&owner.command)),
            manual: None,
            line: "presence command: the owner's command decides (exit 0 present, 1 away, anything else unknown)".to_owned(),
        };
    }
    from_mode(owner.presence, seats_dir)
}

/// The backend a presence mode selects, with the line to log at startup
/// (`command` needs its command: see [`from_owner`]).
pub fn from_mode(mode: PresenceMode, seats_dir: &Path) -> Presence {
    let plain = |backend: Box<dyn PresenceBackend>, line: String| Presence {
        backend,
        manual: None,
        line,
    };
    let unavailable = |name: &str, why: String| -> Presence {
        let line = format!("presence {name}: {why}");
        Presence {
            backend: Box::new(UnavailableBackend {
                name: name.to_owned(),
                why,
            }),
            manual: None,
            line,
        }
    };
    match mode {
        PresenceMode::None => plain(
            Box::new(NoneBackend),
            "presence none: the owner is never present (a dedicated machine)".to_owned(),
        ),
        PresenceMode::Manual => {
            let manual = ManualPresence::default();
            Presence {
                backend: Box::new(manual.clone()),
                manual: Some(manual),
                line: "presence manual: unknown until the owner says present or away (vacancyd admin-request presence away)".to_owned(),
            }
        }
        PresenceMode::Auto if !machine_has_seats(seats_dir) => plain(
            Box::new(NoneBackend),
            format!(
                "presence auto: no login seats under {}, so this is a dedicated machine (presence none)",
                seats_dir.display()
            ),
        ),
        PresenceMode::Auto => unavailable(
            "auto",
            "this machine has login seats but this build cannot read logind yet, so owner presence is unknown and host-scoped upstreams refuse work; set [owner] presence = \"none\" on a dedicated machine, or \"manual\"".to_owned(),
        ),
        other => unavailable(
            other.as_str(),
            format!(
                "presence = \"{}\" is not available in this build, so owner presence is unknown and host-scoped upstreams refuse work; use [owner] presence = \"none\", \"manual\", \"command\" or \"auto\"",
                other.as_str()
            ),
        ),
    }
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
        std::fs::write(dir.path().join("seat0"), "").unwrap();
        let p = from_mode(PresenceMode::Auto, dir.path());
        assert_eq!(p.backend.presence().await, OwnerPresence::Unknown);
        assert!(p.line.contains("[owner] presence"), "{}", p.line);
        for mode in [PresenceMode::Logind, PresenceMode::Command] {
            let p = from_mode(mode, dir.path());
            assert_eq!(p.backend.presence().await, OwnerPresence::Unknown);
        }
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
