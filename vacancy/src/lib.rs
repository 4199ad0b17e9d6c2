#![doc = include_str!("../../README.md")]
#![forbid(unsafe_code)]

pub mod auth;
pub mod config;
pub mod engine;
pub mod gate;
pub mod ledger;
pub mod presence;
pub mod pressure;
pub mod proxy;
pub mod registry;
pub mod sample;
#[cfg(feature = "testkit")]
pub mod simulation;
pub mod slots;
#[cfg(test)]
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
