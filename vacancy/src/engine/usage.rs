//! The owner's record of one finished reservation of a borrower (issue 34
//! item 4): the row a shell persists for each [`Effect::Account`](super::Effect::Account).

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::who::Priority;
use super::work::{Charge, EntryId};

/// One finished reservation as the owner's record keeps it: exactly one per
/// reservation of a borrower, queued with its release ([`Effect::Account`](super::Effect::Account)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UsageRecord {
    /// The entry.
    #[serde(serialize_with = "entry_id")]
    pub entry: EntryId,
    /// The borrower's name ([`ANONYMOUS`](super::ANONYMOUS) for requests that named none).
    #[serde(serialize_with = "shared_str")]
    pub borrower: Arc<str>,
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
    /// Reservation time per resource kind: one second of one resource of
    /// the kind held from admission to release counts one second.
    #[serde(rename = "reserved_s")]
    pub reserved: KindTimes,
    /// The resources it held, primary first, with what admission charged.
    pub resources: Vec<Charge>,
}

/// Reservation time per resource kind, in seconds in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct KindTimes {
    /// GPUs.
    #[serde(serialize_with = "seconds")]
    pub gpu: Duration,
    /// System memory.
    #[serde(serialize_with = "seconds")]
    pub memory: Duration,
    /// Processor.
    #[serde(serialize_with = "seconds")]
    pub cpu: Duration,
}

fn shared_str<S: serde::Serializer>(v: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v)
}

fn entry_id<S: serde::Serializer>(id: &EntryId, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(id)
}

pub(super) fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 1000.0).round() / 1000.0)
}
