//! The seam where reservations become durable before they are forwarded (REC-01).

use async_trait::async_trait;

use crate::engine::{EntryId, Reservation};

/// A reservation could not be recorded: the request must not be forwarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot record work entry {entry}: {reason}")]
pub struct StoreError {
    /// The entry.
    pub entry: EntryId,
    /// Why, naming the file or directory.
    pub reason: String,
}

/// Where reservations are recorded.
///
/// # Behavior
///
/// `persist` returns only once the reservation would survive a crash; the
/// proxy forwards nothing before it returns `Ok` (REC-01). `mark_held` and
/// `forget` follow the entry's life. Records hold job metadata only, never
/// prompts, responses or credentials (REC-26).
#[async_trait]
pub trait ReservationStore: Send + Sync {
    /// Record an admitted reservation before its request is forwarded.
    async fn persist(&self, reservation: &Reservation) -> Result<(), StoreError>;
    /// The entry turned held, with why.
    async fn mark_held(&self, entry: EntryId, reason: &str) -> Result<(), StoreError>;
    /// The entry was released: its record may go.
    async fn forget(&self, entry: EntryId) -> Result<(), StoreError>;
    /// The upstream named its own handle for the entry (REC-04): the record
    /// is rewritten so that a crash leaves the old handle or the new one.
    async fn rewrite_ref(&self, entry: EntryId, upstream_ref: &str) -> Result<(), StoreError>;
}

/// A store that records nothing: reservations live only in memory, so a crash
/// forgets running work. For tests and embedders with their own durability;
/// the daemon uses the durable ledger.
#[derive(Debug, Default, Clone, Copy)]
pub struct VolatileStore;

#[async_trait]
impl ReservationStore for VolatileStore {
    async fn persist(&self, _reservation: &Reservation) -> Result<(), StoreError> {
        Ok(())
    }
    async fn mark_held(&self, _entry: EntryId, _reason: &str) -> Result<(), StoreError> {
        Ok(())
    }
    async fn forget(&self, _entry: EntryId) -> Result<(), StoreError> {
        Ok(())
    }
    async fn rewrite_ref(&self, _entry: EntryId, _upstream_ref: &str) -> Result<(), StoreError> {
        Ok(())
    }
}
