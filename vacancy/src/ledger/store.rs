//! The seam where reservations become durable before they are forwarded (REC-01).

use std::future::Future;
use std::pin::Pin;

use crate::engine::{Effect, EntryId, Reservation, UsageRecord};
use crate::ledger::LedgerError;

/// A reservation could not be recorded: the request must not be forwarded.
#[derive(Debug, thiserror::Error)]
#[error("cannot record work entry {entry}: {reason}")]
pub struct StoreError {
    /// The entry.
    pub entry: EntryId,
    /// Why, naming the file or directory.
    #[source]
    pub reason: StoreFailure,
}

/// Why a store could not record a change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreFailure {
    /// The recovery directory's journal could not be written or synced.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// Another store's reason, in its words.
    #[error("{0}")]
    Other(String),
}

/// One change to the store, for one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChange {
    /// An admitted reservation, before its request is forwarded.
    Admit(Reservation),
    /// The entry turned held, with why.
    Held {
        /// The entry.
        entry: EntryId,
        /// Why its end is uncertain.
        reason: String,
    },
    /// The upstream named its own handle for the entry (REC-04): the record
    /// is rewritten so that a crash leaves the old handle or the new one.
    Ref {
        /// The entry.
        entry: EntryId,
        /// The upstream's handle.
        upstream_ref: String,
    },
    /// The entry was released: its record may go.
    Release(EntryId),
    /// A borrower's reservation ended (issue 34): the owner's record of it,
    /// queued just before its [`Release`](Self::Release) so that the row is
    /// durable before the journal forgets the entry. A store without a usage
    /// record ignores it.
    Account(Box<UsageRecord>),
}

impl StoreChange {
    /// The change `effect` asks of the store; `None` for an effect that is
    /// not the store's (a sample, an observation, a wake-up). The one mapping
    /// from the engine's effects to the store: the lender and the simulation
    /// both record through it. Exhaustive: a new [`Effect`] does not compile
    /// until it is sorted here.
    pub fn of_effect(effect: Effect) -> Option<StoreChange> {
        match effect {
            Effect::Persist(reservation) => Some(StoreChange::Admit(reservation)),
            Effect::MarkHeld { entry, reason } => Some(StoreChange::Held { entry, reason }),
            Effect::RewriteRef {
                entry,
                upstream_ref,
            } => Some(StoreChange::Ref {
                entry,
                upstream_ref,
            }),
            Effect::Forget(entry) => Some(StoreChange::Release(entry)),
            Effect::Account(record) => Some(StoreChange::Account(record)),
            Effect::Sample(_) | Effect::Observe(_) | Effect::WakeReclaims | Effect::WakeWaiters => {
                None
            }
        }
    }

    /// The entry the change is about.
    pub fn entry(&self) -> EntryId {
        match self {
            StoreChange::Admit(r) => r.id,
            StoreChange::Held { entry, .. }
            | StoreChange::Ref { entry, .. }
            | StoreChange::Release(entry) => *entry,
            StoreChange::Account(record) => record.entry,
        }
    }
}

/// A submitted change on its way to disk: resolves once it would survive a
/// crash, or with why it will not.
pub type StoreWrite = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

/// Where the owner's record of borrowers' reservations is kept (issue 34):
/// the ledger's writer hands it each [`StoreChange::Account`] before the
/// entry's release is written, so a row is never lost to a crash; a row
/// written twice (a crash after the row, before the release, and the entry
/// released again after the restart) must count once.
pub trait UsageSink: Send {
    /// Write `record` durably, once per entry.
    ///
    /// # Errors
    ///
    /// Why it could not be written, in words for the log.
    fn record(&mut self, record: &UsageRecord) -> Result<(), String>;
}

/// Where reservations are recorded.
///
/// # Behavior
///
/// [`submit`](Self::submit) queues a change behind every change submitted
/// before it, *in the call itself*, before the returned future is polled. The
/// lender submits under the engine lock, in the order the engine decided, so
/// the store's order is the engine's order: a release reaches the disk before
/// any later admission that reuses its resources, and a crash never leaves two
/// live records on one resource that the engine never had at once.
///
/// The proxy forwards nothing before an `Admit`'s future returns `Ok` (REC-01).
/// Records hold job metadata only, never prompts, responses or credentials
/// (REC-26).
pub trait ReservationStore: Send + Sync {
    /// Queue `change`; the future resolves once it is durable.
    fn submit(&self, change: StoreChange) -> StoreWrite;

    /// Queue an admitted reservation's record ([`StoreChange::Admit`]).
    fn persist(&self, reservation: &Reservation) -> StoreWrite {
        self.submit(StoreChange::Admit(reservation.clone()))
    }

    /// Queue a hold ([`StoreChange::Held`]).
    fn mark_held(&self, entry: EntryId, reason: &str) -> StoreWrite {
        self.submit(StoreChange::Held {
            entry,
            reason: reason.to_owned(),
        })
    }

    /// Queue a release ([`StoreChange::Release`]).
    fn forget(&self, entry: EntryId) -> StoreWrite {
        self.submit(StoreChange::Release(entry))
    }

    /// Queue a handle rewrite ([`StoreChange::Ref`]).
    fn rewrite_ref(&self, entry: EntryId, upstream_ref: &str) -> StoreWrite {
        self.submit(StoreChange::Ref {
            entry,
            upstream_ref: upstream_ref.to_owned(),
        })
    }
}

/// A store that records nothing: reservations live only in memory, so a crash
/// forgets running work. For tests and embedders with their own durability;
/// the daemon uses the durable ledger.
#[derive(Debug, Default, Clone, Copy)]
pub struct VolatileStore;

impl ReservationStore for VolatileStore {
    fn submit(&self, _change: StoreChange) -> StoreWrite {
        Box::pin(std::future::ready(Ok(())))
    }
}
