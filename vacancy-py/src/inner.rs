//! The engine's state behind its lock, and the timeline its calls run on
//! (the monotonic clock, or simulated seconds given as `at=`/`now=`).

use std::collections::HashMap;

use vacancy::engine::pressure::{Baseline, PressureTracker};
use vacancy::{Moment, MonotonicClock};

use crate::errors::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timeline {
    /// No call has fixed the timeline yet.
    Unset,
    /// The engine's monotonic clock (no `at=`/`now=` given).
    Real,
    /// Explicit seconds (`at=`/`now=` given).
    Simulated,
}

pub(crate) fn secs(m: Moment) -> f64 {
    m.as_nanos() as f64 / 1e9
}

pub(crate) fn moment_of(s: f64) -> Result<Moment, Error> {
    if !s.is_finite() || s < 0.0 {
        return Err(Error::Timeline(format!(
            "a time must be a finite, non-negative number of seconds, not {s}"
        )));
    }
    Ok(Moment::from_nanos((s * 1e9).round() as u64))
}

pub(crate) struct Inner {
    pub(crate) engine: vacancy::Engine,
    pub(crate) timeline: Timeline,
    /// The latest moment any call used.
    pub(crate) latest: Moment,
    /// One pressure tracker per GPU fed through `pressure_sample` /
    /// `pressure_miss`, created at its first poll (its gap limit counts from then).
    pub(crate) trackers: HashMap<String, PressureTracker>,
    /// Calibrated baselines, kept for trackers not created yet.
    pub(crate) baselines: HashMap<String, Baseline>,
}

impl Inner {
    /// The moment of a call: `at` on a simulated timeline, the clock otherwise.
    pub(crate) fn moment(
        &mut self,
        clock: &MonotonicClock,
        at: Option<f64>,
    ) -> Result<Moment, Error> {
        let m = match (at, self.timeline) {
            (Some(_), Timeline::Real) => {
                return Err(Error::Timeline(
                    "this engine runs on its monotonic clock (an earlier call gave no time); \
                     passing at=/now= mixes simulated and real time: use a separate Engine for simulation"
                        .to_owned(),
                ));
            }
            (None, Timeline::Simulated) => {
                return Err(Error::Timeline(
                    "this engine runs on simulated time (an earlier call gave at=/now=); \
                     pass at=/now= to every call, or use a separate Engine on the real clock"
                        .to_owned(),
                ));
            }
            (Some(s), _) => {
                self.timeline = Timeline::Simulated;
                moment_of(s)?
            }
            (None, _) => {
                self.timeline = Timeline::Real;
                clock.now()
            }
        };
        self.latest = self.latest.max(m);
        Ok(m)
    }

    /// The moment for a call that takes no time of its own: the clock, or the
    /// latest simulated moment.
    pub(crate) fn current(&mut self, clock: &MonotonicClock) -> Moment {
        match self.timeline {
            Timeline::Simulated => self.latest,
            Timeline::Real | Timeline::Unset => {
                self.timeline = Timeline::Real;
                let m = clock.now();
                self.latest = self.latest.max(m);
                m
            }
        }
    }

    pub(crate) fn upstream(&self, name: &str) -> Result<vacancy::engine::UpstreamId, Error> {
        self.engine.upstream_id(name).ok_or_else(|| {
            Error::Engine(vacancy::engine::EngineError::UnknownUpstream(
                name.to_owned(),
            ))
        })
    }
}
