//! The shell: the IO around the engine, in four folders, each importing
//! only from the ones before it:
//!
//! - [`state`]: what the shell shares — the lender (the engine, the ledger,
//!   the line), the metrics, the console's history, live exchanges, the stop
//!   signal;
//! - [`upstream`]: reaching an upstream — its target, origin rules, route and
//!   read pool, the request forwarded to it;
//! - [`loops`]: the loops beside the request path that feed the engine
//!   (sampling, presence, observation, reclaim, pressure, power, hours);
//! - [`proxy`]: the request path — one listener per upstream, generic over
//!   `dyn Adapter`.
//!
//! # Behavior
//!
//! - Work is classified, inspected within a size bound, admitted (waiting up to
//!   4 s for a post-job sample, ADM-06), persisted (REC-01), then forwarded
//!   with its body streamed back chunk by chunk, never buffered.
//! - Each admitted request is one `proxy::exchange::Exchange`, which ends once
//!   with what was observed; `proxy::exchange::outcome` is the one table of
//!   what each observation means: a refused or failed connection releases
//!   (DONE-02); a failure after the connection is established, or a response
//!   that breaks off, holds (DONE-03/04); the clean end releases (DONE-01).
//! - No module here imports one that imports it back; this file only names
//!   the folders and what they export.
//! - Everything else is forwarded without a reservation, or refused per
//!   [`route_policy`](crate::traits::route_policy).

pub mod loops;
pub mod proxy;
pub mod state;
pub mod upstream;

pub use crate::ledger::store::{
    ReservationStore, StoreChange, StoreError, StoreFailure, StoreWrite, VolatileStore,
};
pub use proxy::listen::{Listening, serve};
pub use state::lender::{Decided, HeldReleaseError, Lender, RecordError, Recording, Seat};
pub use state::shutdown::stopped;
pub use upstream::forward::ProxyBody;
pub use upstream::route::UpstreamRoute;
pub use upstream::target::{ConnectError, Target, TargetError};
