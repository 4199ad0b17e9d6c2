#![doc = include_str!("../../README.md")]
#![forbid(unsafe_code)]

pub mod config;
pub mod engine;
pub mod sample;
pub mod time;
pub mod traits;

pub use time::{Moment, MonotonicClock};
pub use traits::resource::{CapacitySample, Resource, ResourceKind, SampleError};
