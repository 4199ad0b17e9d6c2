// The crate doc is the workspace README (its example is a doc test). It is
// read only when documenting or collecting doc tests: the Python sdist
// carries this crate without the README where this path finds it, and a
// build from the sdist must not need it (issue 30 item 11).
#![cfg_attr(any(doc, doctest), doc = include_str!("../../README.md"))]
#![cfg_attr(
    not(any(doc, doctest)),
    doc = "Lends a machine's idle AI hardware without getting in its owner's way; see README.md."
)]
#![forbid(unsafe_code)]

#[macro_use]
mod names;

#[cfg(feature = "runtime")]
pub mod auth;
#[cfg(feature = "config")]
pub mod config;
pub mod engine;
#[cfg(feature = "runtime")]
pub mod gate;
#[cfg(feature = "runtime")]
pub mod gpu_pressure;
#[cfg(feature = "config")]
pub mod hours;
#[cfg(feature = "runtime")]
pub mod ledger;
#[cfg(feature = "runtime")]
pub mod platform;
#[cfg(feature = "runtime")]
pub mod presence;
#[cfg(feature = "config")]
pub mod registry;
#[cfg(feature = "runtime")]
pub mod sample;
#[cfg(feature = "runtime")]
pub mod shell;
#[cfg(feature = "testkit")]
pub mod simulation;
#[cfg(feature = "runtime")]
pub mod slots;
#[cfg(all(test, feature = "runtime"))]
mod test_prereq;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod time;
pub mod traits;

pub use engine::{
    Decision, Engine, EngineSpec, EntryId, Refusal, RefusalCode, Reservation, WorkRequest,
};
pub use time::{Moment, MonotonicClock};
pub use traits::{
    Adapter, Admission, CapacitySample, Reclaimer, Resource, ResourceKind, SampleError,
};
