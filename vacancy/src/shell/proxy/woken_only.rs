//! A future polled only once something it waits on has woken it.
//!
//! A connection's task waits on hyper's connection and, beside it, on its
//! idle timer and the daemon's shutdown. `select!` polls every branch each
//! time the task wakes, and the task wakes for every read from the borrower
//! and from the upstream: the timer and the shutdown watch were polled twice
//! a request for nothing (issue 31: 722 of a read's 30,500 instructions under
//! callgrind). Wrapped, they are polled when their own waker fired, and a
//! poll between costs a flag check.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};

/// `inner`, polled only after its own wake-up (and once at first).
pub struct WokenOnly<F> {
    inner: F,
    flag: Arc<Flag>,
    /// The waker `inner` is polled with: it raises the flag, then wakes the
    /// task.
    waker: Waker,
}

/// Whether `inner` was woken since its last poll, and the task to wake.
struct Flag {
    woken: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        let task = self.task().clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

impl Flag {
    /// The task to wake. A panic while it was held leaves it whole (it is
    /// only ever replaced): it goes on.
    fn task(&self) -> MutexGuard<'_, Option<Waker>> {
        match self.task.lock() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        }
    }
}

impl<F: Future + Unpin> WokenOnly<F> {
    /// Wrap `inner`; its first poll is never skipped.
    pub fn new(inner: F) -> Self {
        let flag = Arc::new(Flag {
            woken: AtomicBool::new(true),
            task: Mutex::new(None),
        });
        WokenOnly {
            inner,
            waker: Waker::from(Arc::clone(&flag)),
            flag,
        }
    }
}

impl<F: Future + Unpin> Future for WokenOnly<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        {
            // The task to wake, kept current before the flag is read: a
            // wake-up after this finds it, one before it raised the flag.
            let mut task = self.flag.task();
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        if !self.flag.woken.swap(false, Ordering::SeqCst) {
            return Poll::Pending;
        }
        let this = &mut *self;
        let mut own = Context::from_waker(&this.waker);
        Pin::new(&mut this.inner).poll(&mut own)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// A future that counts its polls and is ready once its sender sends.
    struct Counted {
        polls: Arc<AtomicUsize>,
        ready: tokio::sync::oneshot::Receiver<()>,
    }

    impl Future for Counted {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            Pin::new(&mut self.ready).poll(cx).map(|_| ())
        }
    }

    #[tokio::test]
    async fn a_neighbours_wake_ups_do_not_poll_it_and_its_own_do() {
        let polls = Arc::new(AtomicUsize::new(0));
        let (set, ready) = tokio::sync::oneshot::channel();
        let mut side = WokenOnly::new(Counted {
            polls: Arc::clone(&polls),
            ready,
        });
        let (tick, mut ticks) = tokio::sync::mpsc::unbounded_channel::<()>();
        let ticker = tokio::spawn(async move {
            for _ in 0..100 {
                tick.send(()).unwrap();
                tokio::task::yield_now().await;
            }
            set.send(()).unwrap();
        });
        let mut busy = 0;
        loop {
            tokio::select! {
                biased;
                Some(()) = ticks.recv() => busy += 1,
                () = &mut side => break,
            }
        }
        ticker.await.unwrap();
        assert_eq!(busy, 100, "every neighbour's wake-up was served");
        let polled = polls.load(Ordering::SeqCst);
        assert!(
            polled <= 3,
            "polled {polled} times: once at first and once when it was woken"
        );
    }

    #[tokio::test]
    async fn a_timer_inside_fires_on_time() {
        let mut timer = WokenOnly::new(Box::pin(tokio::time::sleep(Duration::from_millis(50))));
        let start = std::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(10), &mut timer)
            .await
            .expect("the timer fired");
        assert!(start.elapsed() >= Duration::from_millis(50));
    }
}
