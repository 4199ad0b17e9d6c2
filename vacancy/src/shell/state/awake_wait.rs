//! An admission's wait for its record's sync, with its thread kept awake
//! (issue 31).
//!
//! An admitted request waits one `fdatasync` of the journal before it is
//! forwarded (REC-01). If its thread sleeps meanwhile, the journal writer's
//! reply has to wake it, and on a machine at rest that wake-up is slow: the
//! CPU is idle and must be woken first (on the bench's 2-CPU VM it cost
//! 20–60 µs an admission, a fifth of the time vacancyd adds to one). So the
//! wait polls instead, for about as long as syncs take here: between two
//! polls the task yields to its runtime (the thread's other connections go
//! on, and its I/O is polled without blocking) and the thread yields its CPU
//! (the journal writer, woken onto this CPU, runs at once instead of queueing
//! behind a spinning thread). Past that budget, or on a disk whose syncs take
//! long (a flush of a millisecond or more gains nothing from it), it waits
//! as any future does.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

/// No awake wait where syncs take longer than this.
const AWAKE_UP_TO: Duration = Duration::from_micros(500);
/// The longest awake wait.
const MOST_AWAKE: Duration = Duration::from_millis(1);

/// How long this machine's journal syncs take, as admissions wait for them.
#[derive(Debug, Default)]
pub(crate) struct SyncPace {
    /// The recent waits' moving average in µs; 0 until the first.
    recent_us: AtomicU64,
}

impl SyncPace {
    /// How long the next wait may poll awake: twice the recent waits (a
    /// sync's time varies), none where they are long. The first wait may
    /// poll up to [`MOST_AWAKE`].
    pub(crate) fn budget(&self) -> Duration {
        let recent = Duration::from_micros(self.recent_us.load(Ordering::Relaxed));
        if recent.is_zero() {
            MOST_AWAKE
        } else if recent > AWAKE_UP_TO {
            Duration::ZERO
        } else {
            (recent * 2).min(MOST_AWAKE)
        }
    }

    /// One wait took `took`: an average over about the last eight.
    pub(crate) fn record(&self, took: Duration) {
        let took = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        // Lost updates between racing admissions only drop one sample.
        let recent = self.recent_us.load(Ordering::Relaxed);
        let next = if recent == 0 {
            took
        } else {
            recent.saturating_mul(7).saturating_add(took) / 8
        };
        self.recent_us.store(next.max(1), Ordering::Relaxed);
    }
}

/// Poll `fut` until it is ready, for at most `budget`, without letting the
/// thread sleep (see the module docs); `None` when the budget ran out first,
/// for the caller to await it as usual.
pub(crate) async fn ready_while_awake<F: Future + ?Sized>(
    fut: &mut Pin<Box<F>>,
    budget: Duration,
) -> Option<F::Output> {
    let until = Instant::now() + budget;
    loop {
        let polled = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
        if let Poll::Ready(out) = polled {
            return Some(out);
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::yield_now();
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    fn current_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_reply_from_another_thread_is_taken_while_awake() {
        // REC-01: the record's reply still decides; only the wait differs.
        current_thread().block_on(async {
            let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
            let writer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_micros(200));
                tx.send(7).unwrap();
            });
            let mut fut: Pin<Box<dyn Future<Output = _>>> = Box::pin(rx);
            let out = ready_while_awake(&mut fut, Duration::from_secs(5)).await;
            assert_eq!(out.map(Result::unwrap), Some(7));
            writer.join().unwrap();
        });
    }

    #[test]
    fn the_threads_other_tasks_go_on_while_it_waits_awake() {
        // The proxy thread's other connections are served during the wait.
        current_thread().block_on(async {
            let ticks = Arc::new(AtomicU64::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let (t, s) = (Arc::clone(&ticks), Arc::clone(&stop));
            let neighbour = tokio::spawn(async move {
                while !s.load(Ordering::Relaxed) {
                    t.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            });
            // Ready once the neighbour has run 100 times on this thread.
            let seen = Arc::clone(&ticks);
            let mut fut: Pin<Box<dyn Future<Output = ()>>> =
                Box::pin(std::future::poll_fn(move |cx| {
                    if seen.load(Ordering::Relaxed) >= 100 {
                        Poll::Ready(())
                    } else {
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                }));
            let out = ready_while_awake(&mut fut, Duration::from_secs(5)).await;
            assert_eq!(out, Some(()));
            stop.store(true, Ordering::Relaxed);
            neighbour.await.unwrap();
        });
    }

    #[test]
    fn past_its_budget_the_wait_hands_the_future_back() {
        current_thread().block_on(async {
            let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
            let mut fut: Pin<Box<dyn Future<Output = _>>> = Box::pin(rx);
            let started = Instant::now();
            let out = ready_while_awake(&mut fut, Duration::from_millis(2)).await;
            assert!(out.is_none());
            assert!(started.elapsed() >= Duration::from_millis(2));
            // Still pending, and still answered once the reply comes.
            tx.send(3).unwrap();
            assert_eq!(fut.await.unwrap(), 3);
        });
    }

    #[test]
    fn the_budget_follows_the_syncs_and_is_none_on_a_slow_disk() {
        let pace = SyncPace::default();
        assert_eq!(pace.budget(), MOST_AWAKE, "before any sync");
        for _ in 0..20 {
            pace.record(Duration::from_micros(100));
        }
        assert_eq!(pace.budget(), Duration::from_micros(200));
        for _ in 0..20 {
            pace.record(Duration::from_micros(400));
        }
        assert!(
            pace.budget() > Duration::from_micros(700),
            "{:?}",
            pace.budget()
        );
        assert!(pace.budget() <= MOST_AWAKE);
        // A disk whose flush takes milliseconds: no awake wait at all.
        for _ in 0..20 {
            pace.record(Duration::from_millis(4));
        }
        assert_eq!(pace.budget(), Duration::ZERO);
        // And back when it is fast again.
        for _ in 0..40 {
            pace.record(Duration::from_micros(80));
        }
        assert!(pace.budget() > Duration::ZERO);
    }
}
