//! Time as the engine sees it: a monotonic [`Moment`] passed in by the caller.
//!
//! The engine never reads a clock. Shells turn their clock's reading into a
//! [`Moment`] (see [`MonotonicClock`]); tests and simulations build moments directly.

use std::time::{Duration, Instant};

/// A point on a monotonic timeline, in nanoseconds since an arbitrary origin.
///
/// # Behavior
///
/// Moments are only compared with moments of the same timeline (one
/// [`MonotonicClock`], or one simulation). "After" is strict: a sample taken at
/// the very moment a job ended is not a sample taken after it (ADM-04).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Moment(u64);

impl Moment {
    /// The origin of the timeline.
    pub const ZERO: Moment = Moment(0);

    /// A moment `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Self {
        Moment(nanos)
    }

    /// A moment `millis` milliseconds after the origin.
    pub const fn from_millis(millis: u64) -> Self {
        Moment(millis.saturating_mul(1_000_000))
    }

    /// A moment `secs` seconds after the origin.
    pub const fn from_secs(secs: u64) -> Self {
        Moment(secs.saturating_mul(1_000_000_000))
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// This moment moved `by` later, saturating at the end of the timeline.
    pub fn after(self, by: Duration) -> Self {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        Moment(self.0.saturating_add(nanos))
    }

    /// Time elapsed from `earlier` to `self`; zero when `earlier` is later.
    pub fn since(self, earlier: Moment) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// A real monotonic clock that reads [`Moment`]s relative to its creation.
///
/// Copy it freely: every copy shares the same origin, so the moments they read
/// are comparable.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    /// With the runtime, tokio's instant: it is the real monotonic clock,
    /// except under a test runtime with paused time, where shells can be
    /// tested with simulated time (COMFY-17's 5 minutes, COMFY-26's hour)
    /// without sleeps. Without it, the standard library's.
    origin: ClockInstant,
}

#[cfg(feature = "runtime")]
type ClockInstant = tokio::time::Instant;
#[cfg(not(feature = "runtime"))]
type ClockInstant = std::time::Instant;

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        MonotonicClock {
            origin: ClockInstant::now(),
        }
    }

    /// A clock that has been running for `age` already (or since the
    /// runtime's earliest instant, if that is later): its moments are
    /// `age` ahead of a clock made now. The adapter kit hands adapters such a
    /// clock, so one that reads a clock of its own is caught.
    pub fn started_ago(age: std::time::Duration) -> Self {
        let now = ClockInstant::now();
        MonotonicClock {
            origin: now.checked_sub(age).unwrap_or(now),
        }
    }

    /// The current moment.
    pub fn now(&self) -> Moment {
        self.moment_of(ClockInstant::now())
    }

    /// The moment of `at`, an instant read earlier from the clock this one
    /// runs on (tokio's, with the runtime): a request's arrival, timed once
    /// for its metrics and its engine time alike (issue 31). An instant
    /// before the origin is its moment zero.
    pub fn moment_of(&self, at: ClockInstant) -> Moment {
        Moment::ZERO.after(at.saturating_duration_since(self.origin))
    }

    /// The real instant of a moment on this clock's timeline, for timers.
    pub fn instant(&self, moment: Moment) -> Instant {
        let at = self.origin + std::time::Duration::from_nanos(moment.as_nanos());
        #[cfg(feature = "runtime")]
        let at = at.into_std();
        at
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

/// The wall clock now, in milliseconds since the Unix epoch (0 before it):
/// what budgets' UTC days and the owner's record count in (issue 34).
pub fn unix_ms_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_and_since_round_trip() {
        let m = Moment::from_secs(10);
        let later = m.after(Duration::from_millis(1500));
        assert_eq!(later.since(m), Duration::from_millis(1500));
        assert_eq!(m.since(later), Duration::ZERO);
        assert_eq!(
            Moment::from_nanos(u64::MAX)
                .after(Duration::from_secs(1))
                .as_nanos(),
            u64::MAX
        );
    }

    #[test]
    fn a_clock_started_ago_reads_that_much_later() {
        let aged = MonotonicClock::started_ago(Duration::from_secs(3600));
        let fresh = MonotonicClock::new();
        assert!(aged.now().since(fresh.now()) >= Duration::from_secs(3599));
    }

    #[test]
    fn clock_is_monotonic() {
        let clock = MonotonicClock::new();
        let a = clock.now();
        let b = clock.now();
        assert!(b >= a);
    }

    #[test]
    fn an_instant_read_earlier_is_its_own_moment_on_the_clock() {
        let clock = MonotonicClock::started_ago(Duration::from_secs(60));
        let read = ClockInstant::now();
        let at = clock.moment_of(read);
        // What `now` would have said then: between the clock's age and now.
        assert!(at >= Moment::from_secs(60), "{at:?}");
        assert!(at <= clock.now());
        let later = clock.moment_of(read + Duration::from_millis(1500));
        assert_eq!(later.since(at), Duration::from_millis(1500));
        // Before the clock's origin: its moment zero, not a panic.
        let fresh = MonotonicClock::new();
        let before = read.checked_sub(Duration::from_secs(1)).unwrap_or(read);
        assert_eq!(fresh.moment_of(before), Moment::ZERO);
    }
}
