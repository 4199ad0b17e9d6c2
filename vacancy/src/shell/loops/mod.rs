//! The loops beside the request path that feed the engine: capacity samples,
//! presence, upstream observation, reclaim, GPU pressure and power, lending
//! hours. They report into a [`sink::LoopSink`]: the daemon's lender or
//! Python's embedded engine.

pub mod hours_watch;
pub mod observation;
pub mod power_cap;
pub mod power_watch;
pub mod presence_watch;
pub mod pressure_watch;
pub mod reclaim;
pub mod sampling;
pub mod sink;
