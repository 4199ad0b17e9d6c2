#![doc = include_str!("../../README.md")]
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
pub mod ledger;
#[cfg(feature = "runtime")]
pub mod platform;
#[cfg(feature = "runtime")]
pub mod presence;
#[cfg(feature = "runtime")]
pub mod pressure;
#[cfg(feature = "runtime")]
pub mod proxy;
#[cfg(feature = "config")]
pub mod registry;
#[cfg(feature = "runtime")]
pub mod sample;
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
