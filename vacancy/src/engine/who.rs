//! Who a request is for, with borrowers on (issue 34): a borrower's handle
//! or name, and the priority class it asks for. Apart from the table
//! (`borrowers`) so a request can carry it without importing the engine.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A borrower's priority class.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Served ahead of batch work.
    #[default]
    Interactive,
    /// Served after interactive work, but within `batch_max_wait`.
    Batch,
}

impl Priority {
    /// `interactive` or `batch`.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::Batch => "batch",
        }
    }

    /// The class a request gets: its borrower's, lowered by its own
    /// request where it asks for less, never raised.
    pub fn lowered_by(self, requested: Option<Priority>) -> Priority {
        requested.map_or(self, |r| r.max(self))
    }

    pub(super) fn index(self) -> usize {
        match self {
            Priority::Interactive => 0,
            Priority::Batch => 1,
        }
    }
}

/// A priority name that is neither `interactive` nor `batch`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("priority {0:?} is not one of interactive, batch")]
pub struct UnknownPriority(pub String);

impl FromStr for Priority {
    type Err = UnknownPriority;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "interactive" => Ok(Priority::Interactive),
            "batch" => Ok(Priority::Batch),
            other => Err(UnknownPriority(other.to_owned())),
        }
    }
}

/// The borrower a reservation is for and the class it runs in, as the
/// reservation's record keeps them (issue 34): a restart gives the restored
/// entry back to its borrower, and its release is accounted to it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BorrowerTag {
    /// The borrower's name ([`ANONYMOUS`](super::ANONYMOUS) for one that named none).
    pub name: Arc<str>,
    /// Its class for this reservation.
    pub priority: Priority,
}

/// A handle on a borrower, resolved once from a name with
/// [`Engine::borrower_id`](super::Engine::borrower_id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BorrowerId(pub(crate) usize);

/// Who a request is for: a resolved handle, or a name the engine looks up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BorrowerRef {
    /// A handle from [`Engine::borrower_id`](super::Engine::borrower_id).
    Id(BorrowerId),
    /// A name.
    Name(String),
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
