#![doc = include_str!("../../README.md")]
#![forbid(unsafe_code)]

pub mod config;
pub mod engine;
pub mod sample;
pub mod time;
pub mod traits;

pub use engine::{
    Decision, Engine, EngineSpec, EntryId, Refusal, RefusalCode, Reservation, WorkRequest,
};
pub use time::{Moment, MonotonicClock};
pub use traits::{
    Adapter, Admission, CapacitySample, Reclaimer, Resource, ResourceKind, SampleError,
};
