//! Owner presence backends: where the engine's presence input comes from.
//!
//! This release has `none` (a dedicated machine: the owner is never present)
//! and `auto`. `logind`, `manual` and `command` follow with the owner issue;
//! until then `auto` on a machine with seats reports *unknown*, which refuses
//! host-scoped work (OWN-01) rather than lending while the owner may be there.

use std::path::Path;

use async_trait::async_trait;

use crate::config::PresenceMode;
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

/// The backend a configuration selects, with the line to log at startup.
pub fn from_mode(mode: PresenceMode, seats_dir: &Path) -> (Box<dyn PresenceBackend>, String) {
    let unavailable = |name: &str, why: String| -> (Box<dyn PresenceBackend>, String) {
        let line = format!("presence {name}: {why}");
        (
            Box::new(UnavailableBackend {
                name: name.to_owned(),
                why,
            }),
            line,
        )
    };
    match mode {
        PresenceMode::None => (
            Box::new(NoneBackend),
            "presence none: the owner is never present (a dedicated machine)".to_owned(),
        ),
        PresenceMode::Auto if !machine_has_seats(seats_dir) => (
            Box::new(NoneBackend),
            format!(
                "presence auto: no login seats under {}, so this is a dedicated machine (presence none)",
                seats_dir.display()
            ),
        ),
        PresenceMode::Auto => unavailable(
            "auto",
            "this machine has login seats but this build cannot read logind yet, so owner presence is unknown and host-scoped upstreams refuse work; set [owner] presence = \"none\" on a dedicated machine".to_owned(),
        ),
        other => unavailable(
            other.as_str(),
            format!(
                "presence = \"{}\" is not available in this build, so owner presence is unknown and host-scoped upstreams refuse work; use [owner] presence = \"none\" or \"auto\"",
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
        let (b, line) = from_mode(PresenceMode::None, dir.path());
        assert_eq!(b.presence().await, OwnerPresence::Away);
        assert!(line.contains("dedicated"));
        let (b, _) = from_mode(PresenceMode::Auto, dir.path());
        assert_eq!(b.presence().await, OwnerPresence::Away, "no seats: none");
        std::fs::write(dir.path().join("seat0"), "").unwrap();
        let (b, line) = from_mode(PresenceMode::Auto, dir.path());
        assert_eq!(b.presence().await, OwnerPresence::Unknown);
        assert!(line.contains("[owner] presence"), "{line}");
        for mode in [
            PresenceMode::Logind,
            PresenceMode::Manual,
            PresenceMode::Command,
        ] {
            let (b, _) = from_mode(mode, dir.path());
            assert_eq!(b.presence().await, OwnerPresence::Unknown);
        }
    }
}
