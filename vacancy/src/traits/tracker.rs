//! The [`Tracker`] trait: completion an adapter proves at the upstream after
//! the reply, for work whose reply only says it was queued (COMFY-01).

use async_trait::async_trait;
use bytes::Bytes;

use crate::engine::EntryId;
use crate::time::Moment;

/// One piece of tracked work, as the proxy hands it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackedWork {
    /// The work entry.
    pub entry: EntryId,
    /// The upstream's handle vacancy assigned and recorded before forwarding
    /// (a ComfyUI prompt ID, COMFY-03).
    pub assigned_ref: String,
    /// When it was admitted: tracking is bounded from here (COMFY-26).
    pub admitted_at: Moment,
}

/// What the submission exchange produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submission {
    /// A complete reply within the size bound.
    Reply {
        /// Its HTTP status.
        status: u16,
        /// Its body.
        body: Bytes,
    },
    /// A reply arrived but cannot be used: it broke off, was larger than the
    /// bound, or could not be read (COMFY-09).
    Broken(String),
    /// The connection failed after the request was sent and before any of
    /// the reply arrived (COMFY-17).
    Lost(String),
}

/// How tracked work ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrackedEnd {
    /// Proven finished, never queued, or it can never run: release (the reason is logged).
    Released(String),
    /// No proof within the bound: hold for an administrator (COMFY-27).
    Held(String),
}

/// What a tracker tells the proxy while it follows work.
#[async_trait]
pub trait TrackingEvents: Send + Sync {
    /// The upstream reported a handle of its own for the work (ComfyUI before
    /// 0.3.45, REC-04): record it before following it. A failure is logged
    /// with both handles and tracking goes on (REC-06).
    async fn upstream_ref(&self, upstream_ref: &str);

    /// The submission's reply is understood and the tracker follows the work
    /// under `upstream_ref` (after [`upstream_ref`](Self::upstream_ref) where
    /// that differs from the assigned handle). Until then a reclaim cannot
    /// name the work at the upstream, so it waits for this (RECL-23) and
    /// cancels it here if it wanted to meanwhile (RECL-24). Trackers call it
    /// once, before they start following; the default ignores it.
    async fn following(&self, upstream_ref: &str) {
        let _ = upstream_ref;
    }
}

/// Follows tracked work at the upstream until its end is proven.
///
/// # Behavior
///
/// - `track` first decides what the submission proves (a recognized
///   rejection releases at once, COMFY-28), then follows the work, and
///   returns only when it is released or must be held.
/// - Nothing but proof releases: an unusable or lost reply follows the
///   assigned handle (COMFY-09), a read that fails proves nothing
///   (COMFY-15), and the bound ends in [`TrackedEnd::Held`] (COMFY-27).
#[async_trait]
pub trait Tracker: Send + Sync {
    /// Decide what `submission` proves about `work` and follow it to its end.
    async fn track(
        &self,
        work: TrackedWork,
        submission: Submission,
        events: &dyn TrackingEvents,
    ) -> TrackedEnd;
}
