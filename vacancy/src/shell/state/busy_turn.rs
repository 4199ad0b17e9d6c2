//! When a proxy worker thread has run long enough without going idle that
//! it should let a waiting thread have its CPU: the proxy's share of a
//! machine it does not own.
//!
//! # Why
//!
//! A worker's event loop under a steady load keeps finding a socket ready
//! each time it looks, so it can run for milliseconds without sleeping. The
//! kernel then lets a thread woken on the same CPU wait: until the worker's
//! slice ends, or the next tick (4 ms at `HZ=250`). When that thread is a
//! client of the worker's own connections (or the upstream it reads from),
//! every request on those connections waits with it. On the 2-core bench
//! machine one worker ran 2.7 ms without a break while a `wrk` thread woken
//! beside it waited 6.5 ms (`perf sched timehist`), which made the c=32 read
//! p99 3.5–4.3 ms against nginx's 1.0–2.9 ms (issue 31). nginx's workers
//! make smaller batches and sleep more often, so they meet this less.
//!
//! # Behavior
//!
//! - The worker's runtime reports each time it parks (looks for events, at
//!   the latest when its run queue is empty) and unparks.
//! - A park that lasted [`IDLE_PARK`] or longer means the thread slept: it
//!   gave its CPU away, and its busy time starts again.
//! - One that did not (events were waiting) continues the busy time; once
//!   it reaches [`BUSY_TURN`], the worker yields its CPU once
//!   (`sched_yield`, `SwitchToThread` on Windows) and counts afresh. With
//!   no other thread waiting the yield returns at once, for the cost of one
//!   system call per [`BUSY_TURN`] of work.
//! - This is the same courtesy to the owner's own threads (the inference
//!   server beside the proxy, the desktop) as to a benchmark's client.

use std::time::{Duration, Instant};

/// How long a worker runs without going idle before it yields its CPU
/// once: below the scheduler's slice (0.75–3 ms) and its tick (1–4 ms), so
/// a thread waiting beside the worker runs within this. With 500 µs the
/// c=32 read p99 went from 4.1–4.3 ms to 1.0–1.25 ms on the bench machine
/// (1 ms gave 1.0–1.3 ms), at the same request rate.
pub const BUSY_TURN: Duration = Duration::from_micros(500);

/// A park this long or longer slept in the kernel: the thread went idle.
/// One that returns sooner found events waiting (an `epoll_wait` with ready
/// events returns in a few microseconds).
pub const IDLE_PARK: Duration = Duration::from_micros(30);

/// A worker thread's busy time, from its runtime's park and unpark hooks.
///
/// It keeps the instants its checks compare with rather than the instants
/// they start from: a comparison of two instants is cheaper than a
/// subtraction, and the hooks run on every park.
#[derive(Clone, Copy, Debug, Default)]
pub struct BusyClock {
    /// From when the current park counts as sleep ([`IDLE_PARK`] after it
    /// began), until the thread unparks.
    idle_from: Option<Instant>,
    /// When the current busy turn ends ([`BUSY_TURN`] after it began);
    /// `None` before the first unpark.
    turn_ends: Option<Instant>,
}

impl BusyClock {
    /// A clock that has not seen its thread park yet.
    pub const fn new() -> Self {
        BusyClock {
            idle_from: None,
            turn_ends: None,
        }
    }

    /// The runtime is about to look for events (and sleep if there are
    /// none).
    pub fn parking(&mut self, now: Instant) {
        self.idle_from = now.checked_add(IDLE_PARK);
    }

    /// The runtime has looked for events and goes on running tasks: whether
    /// the thread has been busy for [`BUSY_TURN`] and should yield its CPU
    /// now, then say so with [`Self::yielded`].
    pub fn unparked(&mut self, now: Instant) -> bool {
        let slept = self.idle_from.take().is_none_or(|from| now >= from);
        match self.turn_ends {
            Some(ends) if !slept => now >= ends,
            _ => {
                self.turn_ends = now.checked_add(BUSY_TURN);
                false
            }
        }
    }

    /// The thread yielded and has its CPU back at `now`: its busy time
    /// starts again here. Not before the yield: time spent waiting for the
    /// CPU again is not busy time, and counting it would yield again at
    /// once.
    pub fn yielded(&mut self, now: Instant) {
        self.turn_ends = now.checked_add(BUSY_TURN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parks of `park` each, `gap` apart, from `start`, for `total`: how
    /// many times the clock says to yield.
    fn yields(start: Instant, park: Duration, gap: Duration, total: Duration) -> usize {
        let mut clock = BusyClock::default();
        let (mut now, mut n) = (start, 0);
        while now.duration_since(start) < total {
            clock.parking(now);
            now += park;
            if clock.unparked(now) {
                n += 1;
                clock.yielded(now);
            }
            now += gap;
        }
        n
    }

    #[test]
    fn a_worker_that_goes_idle_between_requests_never_yields() {
        let start = Instant::now();
        let ms = Duration::from_millis;
        // Sleeping 30 µs or more between bits of work is idle, however
        // much work there is.
        assert_eq!(yields(start, IDLE_PARK, ms(2), ms(100)), 0);
        assert_eq!(yields(start, ms(1), Duration::from_micros(400), ms(100)), 0);
    }

    #[test]
    fn a_worker_that_always_finds_events_yields_once_each_busy_turn() {
        let start = Instant::now();
        let us = Duration::from_micros;
        // 10 ms of work in 50 µs pieces, each park finding events at once:
        // one yield per 500 µs.
        let n = yields(start, us(2), us(50), Duration::from_millis(10));
        assert!((18..=20).contains(&n), "{n} yields in 10 ms");
    }

    #[test]
    fn a_yield_or_an_idle_park_starts_the_busy_time_again() {
        let start = Instant::now();
        let us = Duration::from_micros;
        let mut clock = BusyClock::default();
        // The first unpark starts the count.
        clock.parking(start);
        assert!(!clock.unparked(start + us(1)));
        clock.parking(start + us(499));
        assert!(!clock.unparked(start + us(500)));
        clock.parking(start + us(500));
        assert!(clock.unparked(start + us(501)), "500 µs busy");
        // The yield gave the CPU away for 2 ms: counted from its return.
        clock.yielded(start + us(2501));
        clock.parking(start + us(2600));
        assert!(!clock.unparked(start + us(2601)), "counted from the yield");
        // An idle park in between: the next 500 µs start after it.
        clock.parking(start + us(2900));
        assert!(!clock.unparked(start + us(2950)));
        clock.parking(start + us(3300));
        assert!(!clock.unparked(start + us(3301)));
        clock.parking(start + us(3450));
        assert!(clock.unparked(start + us(3451)));
    }

    #[test]
    fn an_unpark_without_a_park_counts_as_idle() {
        let start = Instant::now();
        let mut clock = BusyClock::default();
        assert!(!clock.unparked(start));
        assert!(!clock.unparked(start + Duration::from_millis(5)));
    }
}
