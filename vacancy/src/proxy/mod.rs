//! The proxy: one listener per upstream, generic over `dyn Adapter`, plus the
//! async shells that feed the engine (sampling, observation, presence).
//!
//! # Behavior
//!
//! - Work is classified, inspected within a size bound, admitted (waiting up to
//!   4 s for a post-job sample, ADM-06), persisted (REC-01), then forwarded
//!   with its body streamed back chunk by chunk, never buffered.
//! - Each admitted request is one `exchange::Exchange`, which ends once
//!   with what was observed; `exchange::outcome` is the one table of what
//!   each observation means: a refused or failed connection releases
//!   (DONE-02); a failure after the connection is established, or a response
//!   that breaks off, holds (DONE-03/04); the clean end releases (DONE-01).
//! - No module here imports one that imports it back; this file only names
//!   the modules and what they export.
//! - Everything else is forwarded without a reservation, or refused per
//!   [`route_policy`](crate::traits::route_policy).

pub(crate) mod answer;
pub(crate) mod completion;
pub mod conn;
pub(crate) mod exchange;
pub(crate) mod forward;
pub mod history;
pub mod host;
pub mod hours_watch;
pub(crate) mod lender;
pub(crate) mod listen;
pub mod live;
pub mod metrics;
pub mod observation;
pub(crate) mod origin;
pub mod pool;
pub mod power_cap;
pub mod power_watch;
pub mod presence_watch;
pub mod pressure;
pub mod reclaim;
pub(crate) mod route;
pub mod sampling;
pub(crate) mod service;
pub(crate) mod shutdown;
pub mod sink;
pub(crate) mod target;
pub(crate) mod tracked;
pub mod tunnel;

pub use crate::ledger::store::{
    ReservationStore, StoreChange, StoreError, StoreFailure, StoreWrite, VolatileStore,
};
pub use forward::ProxyBody;
pub use lender::{Admission, Decided, HeldReleaseError, Lender, RecordError, Seat};
pub use listen::{Listening, serve};
pub use route::UpstreamRoute;
pub use shutdown::stopped;
pub use target::{ConnectError, Target, TargetError};
