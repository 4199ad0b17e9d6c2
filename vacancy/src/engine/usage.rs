//! The owner's record of one finished reservation of a borrower (issue 34
//! item 4): the row a shell persists for each [`Effect::Account`](super::Effect::Account).

use std::time::Duration;

use serde::Serialize;

use super::who::Priority;
use super::work::EntryId;

/// One finished reservation as the owner's record keeps it: exactly one per
/// reservation of a borrower, queued with its release ([`Effect::Account`](super::Effect::Account)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UsageRecord {
    /// The entry.
    #[serde(serialize_with = "entry_id")]
    pub entry: EntryId,
    /// The borrower's name ([`ANONYMOUS`](super::ANONYMOUS) for requests that named none).
    pub borrower: String,
    /// The upstream.
    pub upstream: String,
    /// The model, when known.
    pub model: Option<String>,
    /// The class it ran in.
    pub priority: Priority,
    /// When it was admitted, in Unix milliseconds (see [`Engine::set_wall_clock`](super::Engine::set_wall_clock)).
    pub admitted_unix_ms: i64,
    /// When it was released, in Unix milliseconds.
    pub released_unix_ms: i64,
    /// How long it waited in line before its admission.
    #[serde(rename = "waited_s", serialize_with = "seconds")]
    pub waited: Duration,
    /// Whether it was held before its release.
    pub held: bool,
    /// Reservation seconds per resource it held, primary first.
    pub resources: Vec<ResourceUse>,
}

/// Reservation time on one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResourceUse {
    /// The resource.
    pub resource: String,
    /// Its kind: gpu | memory | cpu.
    pub kind: &'static str,
    /// How long it was held.
    #[serde(rename = "seconds", serialize_with = "seconds")]
    pub held: Duration,
}

fn entry_id<S: serde::Serializer>(id: &EntryId, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(id)
}

pub(super) fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 1000.0).round() / 1000.0)
}
