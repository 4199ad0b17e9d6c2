//! What the shell must do because of an engine decision.
//!
//! The engine decides; it never writes a file or wakes a task. Each decision
//! that needs the outside world queues [`Effect`]s, in the order it decided
//! them, and the shell drains them with
//! [`Engine::poll_effect`](super::Engine::poll_effect) (quinn-proto's
//! `poll_transmit` is the model). Ledger effects must reach the store in that
//! order: a release queued before an admission that reuses its resource is
//! written before it, so the journal never shows two live records on one
//! resource that the engine never had at once.

use std::collections::VecDeque;

use super::usage::UsageRecord;
use super::work::{EntryId, Reservation, UpstreamId};

/// One thing the shell must do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Effect {
    /// Record an admitted reservation; its request is forwarded only once
    /// the record is durable (REC-01).
    Persist(Reservation),
    /// Record that an entry is held, and why (its end is uncertain).
    MarkHeld {
        /// The entry.
        entry: EntryId,
        /// Why its end is uncertain.
        reason: String,
    },
    /// Record the upstream's own handle for an entry's work (REC-04).
    RewriteRef {
        /// The entry.
        entry: EntryId,
        /// The upstream's handle.
        upstream_ref: String,
    },
    /// A named borrower's reservation ended (issue 34): the owner's record
    /// of it, exactly one per reservation, queued just before its `Forget`
    /// so a store can write both at once. Only with borrowers on.
    Account(Box<UsageRecord>),
    /// An entry ended: its record may go.
    Forget(EntryId),
    /// Sample this resource now: a job on it ended (ADM-05).
    Sample(String),
    /// Observe this upstream now, so residency has evidence taken after the
    /// job (RES-02) and a lesson is learned (RES-07).
    Observe(UpstreamId),
    /// Presence, pressure or work changed: step the reclaims now.
    WakeReclaims,
    /// The wait line moved, or an input that may refuse its waiters changed:
    /// every waiter asks again now.
    WakeWaiters,
}

impl Effect {
    /// Whether this effect changes the reservation store.
    pub fn is_ledger(&self) -> bool {
        // Exhaustive, as every match on an effect inside this crate: a new
        // variant does not compile until each place says what it does.
        match self {
            Effect::Persist(_)
            | Effect::MarkHeld { .. }
            | Effect::RewriteRef { .. }
            | Effect::Forget(_) => true,
            // The accounting store is the daemon's (issue 34 item 4), not the
            // reservation journal's.
            Effect::Account(_)
            | Effect::Sample(_)
            | Effect::Observe(_)
            | Effect::WakeReclaims
            | Effect::WakeWaiters => false,
        }
    }
}

/// The queue of effects not yet drained.
#[derive(Debug, Default)]
pub(super) struct Effects {
    queue: VecDeque<Effect>,
}

impl Effects {
    /// Queue `effect`. A wake-up or a sample already queued is not queued
    /// twice: doing it once does what both ask.
    pub(super) fn push(&mut self, effect: Effect) {
        let idempotent = matches!(
            effect,
            Effect::WakeReclaims | Effect::WakeWaiters | Effect::Sample(_) | Effect::Observe(_)
        );
        // Variants first: a full comparison only against the same kind.
        let kind = std::mem::discriminant(&effect);
        if idempotent
            && self
                .queue
                .iter()
                .any(|e| std::mem::discriminant(e) == kind && *e == effect)
        {
            return;
        }
        self.queue.push_back(effect);
    }

    pub(super) fn pop(&mut self) -> Option<Effect> {
        self.queue.pop_front()
    }
}
