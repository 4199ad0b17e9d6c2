//! The proxy's worker threads: one single-threaded runtime per core, each
//! serving whole borrower connections, as nginx's worker processes do. Kept
//! with the shell's shared state: the listeners hand connections to them and
//! the read pools keep one pool per worker.
//!
//! # Why
//!
//! On tokio's work-stealing runtime a proxied request crossed threads at
//! each hop (the borrower's connection task, the upstream connection's task,
//! the timers), and each crossing is a futex wake-up: on a 2-core machine a
//! second runtime thread added nothing to the read rate (44.8k/s with one,
//! 41.2k/s with two; issue 31). A connection here lives on one thread from
//! its accept to its close, and so do the upstream connections and tasks it
//! starts there (tokio spawns on the current runtime), so a request's path
//! wakes no other thread; the kernel spreads connections over the threads.
//!
//! # Behavior
//!
//! - The accept loops stay on the daemon's runtime; each accepted stream is
//!   moved to the next worker in turn (its descriptor leaves the accepting
//!   runtime's reactor and joins the worker's), so binding, the connection
//!   budget and shutdown are as before.
//! - What the engine shares (the lender's lock, the ledger) is shared as
//!   before; only where tasks run changes.
//! - The threads stop when the last handle is dropped, after the listeners'
//!   grace period has ended their connections.
//! - A worker that has run for a while without ever going idle yields its
//!   CPU once, so a thread woken beside it (a client of its connections,
//!   the upstream, the owner's own) does not wait for the scheduler's tick
//!   (`shell::state::busy_turn`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

use crate::shell::state::busy_turn::BusyClock;

/// The worker threads and a handle to each one's runtime.
#[derive(Debug)]
pub struct ProxyWorkers {
    handles: Vec<Handle>,
    next: AtomicUsize,
    /// How many times a worker has yielded its CPU after a busy turn.
    cpu_yields: Counter,
    /// Dropped with the workers: each thread's runtime then stops.
    _stops: Vec<oneshot::Sender<()>>,
}

// The initializer is const already; clippy 1.96 still asks for it under
// -Zbuild-std (the Windows build).
#[allow(clippy::missing_const_for_thread_local)]
mod worker_index {
    thread_local! {
        /// Which worker this thread is, for state kept per worker (the read
        /// pools); `None` off the worker threads.
        pub(super) static WORKER: std::cell::Cell<Option<usize>> =
            const { std::cell::Cell::new(None) };
        /// The worker's busy time, from its runtime's park hooks.
        pub(super) static BUSY: std::cell::Cell<super::BusyClock> =
            const { std::cell::Cell::new(super::BusyClock::new()) };
    }
}
use worker_index::{BUSY, WORKER};

/// The worker the calling thread is, or `None` off the worker threads.
pub fn current_worker() -> Option<usize> {
    WORKER.with(std::cell::Cell::get)
}

impl ProxyWorkers {
    /// Start `threads` workers (at least one), named `vacancyd-proxy-N`,
    /// counting their CPU yields on `cpu_yields`: the daemon passes
    /// [`Metrics::proxy_cpu_yields`](crate::shell::state::metrics::Metrics::proxy_cpu_yields),
    /// so `/metrics` shows them; `Counter::default()` counts them alone.
    ///
    /// # Errors
    ///
    /// When a runtime or a thread cannot be started.
    pub fn start(threads: usize, cpu_yields: Counter) -> std::io::Result<Arc<ProxyWorkers>> {
        let mut handles = Vec::new();
        let mut stops = Vec::new();
        for i in 0..threads.max(1) {
            let yielded = cpu_yields.clone();
            let runtime = Builder::new_current_thread()
                .on_thread_park(|| {
                    BUSY.with(|b| {
                        let mut clock = b.get();
                        clock.parking(Instant::now());
                        b.set(clock);
                    });
                })
                .on_thread_unpark(move || {
                    BUSY.with(|b| {
                        let mut clock = b.get();
                        if clock.unparked(Instant::now()) {
                            std::thread::yield_now();
                            clock.yielded(Instant::now());
                            yielded.inc();
                        }
                        b.set(clock);
                    });
                })
                .enable_all()
                .thread_name("vacancyd-blocking")
                .build()?;
            handles.push(runtime.handle().clone());
            let (stop, stopped) = oneshot::channel::<()>();
            stops.push(stop);
            std::thread::Builder::new()
                .name(format!("vacancyd-proxy-{i}"))
                .spawn(move || {
                    WORKER.with(|w| w.set(Some(i)));
                    // Runs the runtime's tasks until the workers are dropped.
                    let _ = runtime.block_on(stopped);
                    runtime.shutdown_background();
                })?;
        }
        Ok(Arc::new(ProxyWorkers {
            handles,
            next: AtomicUsize::new(0),
            cpu_yields,
            _stops: stops,
        }))
    }

    /// How many workers there are.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Always false: there is at least one worker.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Run `task` on each worker thread every `every`, for as long as the
    /// workers run: per-thread upkeep, such as handing an allocator's
    /// thread cache back (each worker is one thread, so the task runs on
    /// the thread whose state it tends).
    pub fn upkeep(&self, every: std::time::Duration, task: fn()) {
        for handle in &self.handles {
            handle.spawn(async move {
                let mut ticks = tokio::time::interval(every);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                // The first tick is at once: skip it.
                ticks.tick().await;
                loop {
                    ticks.tick().await;
                    task();
                }
            });
        }
    }

    /// How many times the workers have yielded their CPU after running
    /// [`BUSY_TURN`](crate::shell::state::busy_turn::BUSY_TURN) without
    /// going idle: how often the proxy met a CPU it had to share
    /// (`vacancyd_proxy_cpu_yields_total`).
    pub fn cpu_yields(&self) -> u64 {
        self.cpu_yields.get()
    }

    /// The runtime the next connection goes to, in turn.
    pub fn next(&self) -> &Handle {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        &self.handles[i]
    }
}

/// The workers for `[server] proxy_threads = configured`: when 0, what
/// `TOKIO_WORKER_THREADS` says if it is set (as tokio's own runtime does),
/// else one per core the system reports.
pub fn thread_count(configured: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    let from_env = std::env::var("TOKIO_WORKER_THREADS").ok();
    default_count(from_env.as_deref())
}

fn default_count(tokio_worker_threads: Option<&str>) -> usize {
    tokio_worker_threads
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn connections_go_to_each_worker_in_turn_and_run_there() {
        let workers = ProxyWorkers::start(2, Counter::default()).unwrap();
        assert_eq!(workers.len(), 2);
        let mut seen = Vec::new();
        for _ in 0..4 {
            let at = workers
                .next()
                .spawn(async {
                    (
                        current_worker(),
                        std::thread::current().name().map(str::to_owned),
                    )
                })
                .await
                .unwrap();
            seen.push(at);
        }
        assert_eq!(seen[0].0, Some(0));
        assert_eq!(seen[1].0, Some(1));
        assert_eq!(seen[2].0, Some(0));
        assert_eq!(seen[0].1.as_deref(), Some("vacancyd-proxy-0"));
        assert_eq!(current_worker(), None, "the test's own thread is none");
    }

    #[tokio::test]
    async fn a_worker_that_never_goes_idle_yields_its_cpu_each_busy_turn() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let workers = ProxyWorkers::start(1, Counter::default()).unwrap();
        let on_worker = Arc::clone(&workers);
        // A connection whose next bytes are always there when the worker
        // looks for them, as under a steady load: each read waits for the
        // runtime to look for events, and each look finds them at once.
        let busy = workers.next().spawn(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let mut a = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
                .await
                .unwrap();
            let (mut b, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 64];
            let start = std::time::Instant::now();
            while start.elapsed() < std::time::Duration::from_secs(10) {
                a.write_all(b"x").await.unwrap();
                assert_eq!(b.read(&mut buf).await.unwrap(), 1);
                if on_worker.cpu_yields() >= 2 {
                    return true;
                }
            }
            false
        });
        assert!(
            busy.await.unwrap(),
            "{} yields in 10 s",
            workers.cpu_yields()
        );
    }

    #[tokio::test]
    async fn a_worker_that_sleeps_between_tasks_does_not_yield() {
        let workers = ProxyWorkers::start(1, Counter::default()).unwrap();
        workers
            .next()
            .spawn(async {
                for _ in 0..50 {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            })
            .await
            .unwrap();
        assert_eq!(workers.cpu_yields(), 0);
    }

    static UPKEEP_THREADS: std::sync::Mutex<Vec<Option<usize>>> = std::sync::Mutex::new(Vec::new());
    static UPKEEP_RAN: tokio::sync::Notify = tokio::sync::Notify::const_new();

    fn note_upkeep() {
        UPKEEP_THREADS.lock().unwrap().push(current_worker());
        UPKEEP_RAN.notify_one();
    }

    #[tokio::test]
    async fn upkeep_runs_on_every_worker_thread() {
        let workers = ProxyWorkers::start(2, Counter::default()).unwrap();
        workers.upkeep(std::time::Duration::from_millis(5), note_upkeep);
        loop {
            let mut seen = UPKEEP_THREADS.lock().unwrap().clone();
            seen.sort_unstable();
            seen.dedup();
            if seen == [Some(0), Some(1)] {
                break;
            }
            let ran =
                tokio::time::timeout(std::time::Duration::from_secs(10), UPKEEP_RAN.notified());
            assert!(
                ran.await.is_ok(),
                "upkeep ran on {seen:?}, not on each worker"
            );
        }
    }

    #[test]
    fn zero_threads_means_tokio_worker_threads_else_one_per_core() {
        assert!(default_count(None) >= 1);
        assert_eq!(default_count(Some("3")), 3);
        assert_eq!(default_count(Some("0")), default_count(None));
        assert_eq!(default_count(Some("many")), default_count(None));
        assert_eq!(thread_count(5), 5);
    }
}
