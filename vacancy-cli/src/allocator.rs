//! Upkeep of the daemon's allocator (issue 31 item 4).
//!
//! jemalloc (the binary's global allocator on Unix, `src/main.rs`) keeps a
//! cache of freed blocks per thread, and collects it only while that thread
//! goes on allocating. After a burst of connections the proxy's worker
//! threads sit idle with their caches full, and the pages under them stay
//! resident. Each worker hands its cache back every [`EVERY`]; the
//! allocator's background thread then returns the emptied pages to the
//! system. Under load a cache refills from its arena at once, so the cost is
//! one refill per worker per period. Not on Windows, whose heap is the
//! system's own.

use std::time::Duration;

/// How often each proxy worker hands its thread cache back: well inside the
/// minute after a burst within which RSS is to be back near where it was.
pub(crate) const EVERY: Duration = Duration::from_secs(15);

/// Hand the calling thread's allocator cache back to the shared arenas;
/// a failure is logged and only means the cache stays where it is.
pub(crate) fn return_thread_cache() {
    if let Err(e) = hand_back() {
        tracing::debug!(error = %e, "could not hand the thread's allocator cache back");
    }
}

/// jemalloc flushes a thread's cache when the cache is switched off; it is
/// switched on again at once. (`thread.tcache.flush` takes no value, which
/// the safe interface cannot send, and this workspace forbids unsafe code.)
fn hand_back() -> Result<(), tikv_jemalloc_ctl::Error> {
    use tikv_jemalloc_ctl::{Access as _, AsName as _};
    let enabled = b"thread.tcache.enabled\0".name();
    enabled.write(false)?;
    enabled.write(true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tikv_jemalloc_ctl::{Access as _, AsName as _};

    /// jemalloc takes the switch (a wrong name or a build without thread
    /// caches would fail here) and the thread keeps its cache on after it.
    /// What it saves is measured in `scripts/bench-proxy` (memory), not here:
    /// the statistics that would show it are not built into the daemon.
    #[test]
    fn a_threads_cache_is_handed_back_and_stays_on() {
        std::thread::spawn(|| {
            hand_back().unwrap();
            let on: bool = b"thread.tcache.enabled\0".name().read().unwrap();
            assert!(on, "the thread's cache was left off");
        })
        .join()
        .unwrap();
    }
}
