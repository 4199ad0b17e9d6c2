//! What wakes an upstream's observation loop besides its interval: the end
//! of work on it (RES-02, RES-07), unless that pass could learn nothing.
//!
//! # Behavior
//!
//! - A job's end wakes the loop, so residency has evidence taken after the
//!   job and its lesson is learned.
//! - An adapter that cannot observe its upstream (the OpenAI-compatible one)
//!   learns only whether the upstream answers, and the job's own connection
//!   showed that. Its loop says so ([`ObserveTrigger::set_connection_only`]);
//!   a job's end then wakes it only when the upstream's last connection
//!   attempt failed, so an upstream that stopped answering is still found
//!   at once. Waking it anyway cost each job two thread wake-ups on the
//!   daemon's main runtime, one of them on the request path before the
//!   borrower's last byte (issue 31).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// Whether the upstream's last connection attempt not yet seen by its
/// observation loop failed.
type ConnectFailed = Box<dyn Fn() -> bool + Send + Sync>;

/// The trigger of one upstream's observation loop.
#[derive(Default)]
pub struct ObserveTrigger {
    notify: Notify,
    /// The loop's last pass learned only that the upstream answers.
    connection_only: AtomicBool,
    /// Set once by the loop, which knows the upstream's connections.
    connect_failed: OnceLock<ConnectFailed>,
}

impl std::fmt::Debug for ObserveTrigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObserveTrigger")
            .field("connection_only", &self.connection_only)
            .finish_non_exhaustive()
    }
}

impl ObserveTrigger {
    /// Work on the upstream ended: wake the loop unless its pass would learn
    /// nothing (see the module docs). Returns whether it was woken.
    pub fn job_ended(&self) -> bool {
        let learns_nothing = self.connection_only.load(Ordering::Relaxed)
            && self.connect_failed.get().is_some_and(|failed| !failed());
        if !learns_nothing {
            self.notify.notify_one();
        }
        !learns_nothing
    }

    /// Wake the loop whatever it learned last.
    pub fn pull(&self) {
        self.notify.notify_one();
    }

    /// Resolves once the loop is woken (or at once if it was meanwhile).
    pub async fn pulled(&self) {
        self.notify.notified().await;
    }

    /// Said once by the loop: how to tell whether the upstream's last
    /// connection attempt since the loop last looked failed.
    pub fn watch_connections(&self, connect_failed: impl Fn() -> bool + Send + Sync + 'static) {
        let _ = self.connect_failed.set(Box::new(connect_failed));
    }

    /// Said by the loop after each pass: whether it learned only that the
    /// upstream answers.
    pub fn set_connection_only(&self, only: bool) {
        self.connection_only.store(only, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Whether the loop would wake now: a pending wake resolves at once.
    async fn woken(t: &ObserveTrigger) -> bool {
        tokio::select! {
            biased;
            () = t.pulled() => true,
            () = std::future::ready(()) => false,
        }
    }

    #[tokio::test]
    async fn a_job_end_wakes_a_loop_that_observes() {
        // RES-02: evidence taken after the job.
        let t = ObserveTrigger::default();
        assert!(t.job_ended());
        assert!(woken(&t).await);
        t.watch_connections(|| false);
        t.set_connection_only(false);
        assert!(t.job_ended());
        assert!(woken(&t).await);
    }

    #[tokio::test]
    async fn a_job_end_leaves_a_connection_only_loop_asleep_while_connections_succeed() {
        let failed = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&failed);
        let t = ObserveTrigger::default();
        t.watch_connections(move || seen.load(Ordering::Relaxed));
        t.set_connection_only(true);
        assert!(!t.job_ended());
        assert!(!woken(&t).await);
        // The upstream stopped answering: the loop checks at once.
        failed.store(true, Ordering::Relaxed);
        assert!(t.job_ended());
        assert!(woken(&t).await);
        // A pass that found it unreachable learned more than a connection.
        failed.store(false, Ordering::Relaxed);
        t.set_connection_only(false);
        assert!(t.job_ended());
        assert!(woken(&t).await);
    }
}
