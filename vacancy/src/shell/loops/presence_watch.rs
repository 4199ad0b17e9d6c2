//! The presence loop: the owner's presence, asked every second and given to
//! the engine; a change wakes the reclaim loop. Where the platform says when
//! the answer may have changed (a Windows service is told of every sign-in,
//! lock, unlock and user switch), the loop asks at once, and the poll is the
//! fallback.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tracing::info;

use crate::engine::OwnerPresence;
use crate::presence::PresenceBackend;
use crate::shell::loops::sink::LoopSink;
use crate::shell::state::shutdown::stopped;

/// How often the presence backend is asked.
pub const PRESENCE_EVERY: Duration = Duration::from_secs(1);

/// Ask the presence backend every `every`, and at once when `changed` is
/// notified, and give the answer to the engine; a change wakes the reclaim
/// loop at once.
pub async fn presence_loop<S: LoopSink + ?Sized>(
    sink: Arc<S>,
    backend: Arc<dyn PresenceBackend>,
    every: Duration,
    changed: Option<Arc<Notify>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let never = Arc::new(Notify::new());
    let changed = changed.unwrap_or(never);
    let mut last: Option<OwnerPresence> = None;
    loop {
        let presence = backend.presence().await;
        sink.set_owner(presence);
        if last != Some(presence) {
            info!(
                backend = backend.name(),
                presence = presence.as_str(),
                "owner presence"
            );
            last = Some(presence);
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = changed.notified() => {}
            () = stopped(&mut shutdown) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::shell::loops::sink::SampleRecorder;
    use crate::traits::resource::{CapacitySample, SampleError};
    use crate::{Moment, MonotonicClock};

    #[derive(Default)]
    struct Seen(Mutex<Vec<OwnerPresence>>);

    impl SampleRecorder for Seen {
        fn clock(&self) -> MonotonicClock {
            MonotonicClock::new()
        }
        fn record_sample(&self, _: &str, _: Result<CapacitySample, SampleError>, _: Moment) {}
    }

    impl LoopSink for Seen {
        fn sample_trigger(&self, _: &str) -> Option<Arc<Notify>> {
            None
        }
        fn set_owner(&self, presence: OwnerPresence) -> bool {
            self.0.lock().unwrap().push(presence);
            true
        }
    }

    /// Away on the first question, present after.
    #[derive(Default)]
    struct Backend(AtomicUsize);

    #[async_trait::async_trait]
    impl PresenceBackend for Backend {
        fn name(&self) -> &str {
            "test"
        }
        async fn presence(&self) -> OwnerPresence {
            match self.0.fetch_add(1, Ordering::SeqCst) {
                0 => OwnerPresence::Away,
                _ => OwnerPresence::Present,
            }
        }
    }

    // Issue 33 item 2: a session notification is read at once, not at the
    // next poll.
    #[tokio::test(start_paused = true)]
    async fn a_session_change_is_read_at_once_not_at_the_next_poll() {
        let sink = Arc::new(Seen::default());
        let changed = Arc::new(Notify::new());
        let (_stop, shutdown) = watch::channel(false);
        let task = tokio::spawn(presence_loop(
            Arc::clone(&sink),
            Arc::new(Backend::default()),
            Duration::from_secs(3600),
            Some(Arc::clone(&changed)),
            shutdown,
        ));
        while sink.0.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let asked = tokio::time::Instant::now();
        changed.notify_one();
        while sink.0.lock().unwrap().len() < 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(asked.elapsed(), Duration::ZERO, "read at once");
        assert_eq!(
            *sink.0.lock().unwrap(),
            vec![OwnerPresence::Away, OwnerPresence::Present]
        );
        task.abort();
    }
}
