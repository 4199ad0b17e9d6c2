//! The writer thread's queue: jobs in submission order, and a wake-up only
//! where the writer would not look at the queue soon enough on its own.
//!
//! A release or a hold may wait [`DEFERRED_SYNC`](super::writer::DEFERRED_SYNC)
//! for its sync. While the writer waits with a deadline (it always has one
//! within that window of its last sync), such a change does not wake it: the
//! writer finds it at that deadline, or with the next admission, whose wake-up
//! it shares. Waking the writer for every release cost more than the system
//! call: the woken writer was queued on the releasing proxy thread's CPU,
//! runnable but not running, and the next admission's record waited for that
//! proxy thread to sleep before it was written (issue 31: a scheduler trace
//! of sequential admitted POSTs showed the append starting about 40 µs after
//! the admission was submitted, with the other CPU idle).

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Jobs for the writer, and whether and how it waits for them.
pub(crate) struct Queue<Job> {
    state: Mutex<State<Job>>,
    wake: Condvar,
}

struct State<Job> {
    jobs: VecDeque<Job>,
    /// No more jobs are taken: the ledger is dropped, or its writer ended.
    closed: bool,
    wait: Wait,
}

/// How the writer waits, as far as a submitter needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// It is not waiting: it looks at the queue before it waits again.
    Working,
    /// It waits until a deadline, at most the deferred window away.
    Until,
    /// It waits for the next job, however long.
    Forever,
}

/// What [`Queue::take`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// At least one job.
    Jobs,
    /// None came before the deadline.
    TimedOut,
    /// The queue is closed and empty: the writer ends.
    Closed,
}

impl<Job> Default for Queue<Job> {
    fn default() -> Self {
        Queue {
            state: Mutex::new(State {
                jobs: VecDeque::new(),
                closed: false,
                wait: Wait::Working,
            }),
            wake: Condvar::new(),
        }
    }
}

impl<Job> Queue<Job> {
    /// Queue `job` behind every job submitted before it, waking the writer
    /// if it waits and `urgent` (someone waits on the job before acting), or
    /// if it waits with no deadline. A closed queue hands the job back.
    pub(crate) fn push(&self, job: Job, urgent: bool) -> Result<(), Job> {
        let mut state = self.lock();
        if state.closed {
            return Err(job);
        }
        state.jobs.push_back(job);
        let wake = match state.wait {
            Wait::Working => false,
            Wait::Until => urgent,
            Wait::Forever => true,
        };
        if wake {
            // Once is enough: the writer takes everything queued.
            state.wait = Wait::Working;
            drop(state);
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Wait for jobs, until `deadline` if given, and move up to `max` of
    /// them into `into`, in submission order. Jobs queued at the deadline
    /// are taken, not reported as a time-out.
    pub(crate) fn take(&self, deadline: Option<Instant>, max: usize, into: &mut Vec<Job>) -> Taken {
        let mut state = self.lock();
        loop {
            if !state.jobs.is_empty() {
                state.wait = Wait::Working;
                let n = state.jobs.len().min(max);
                into.extend(state.jobs.drain(..n));
                return Taken::Jobs;
            }
            if state.closed {
                state.wait = Wait::Working;
                return Taken::Closed;
            }
            match deadline {
                None => {
                    state.wait = Wait::Forever;
                    state = match self.wake.wait(state) {
                        Ok(g) => g,
                        Err(p) => p.into_inner(),
                    };
                }
                Some(by) => {
                    let left = by.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        state.wait = Wait::Working;
                        return Taken::TimedOut;
                    }
                    state.wait = Wait::Until;
                    state = match self.wake.wait_timeout(state, left) {
                        Ok((g, _)) => g,
                        Err(p) => p.into_inner().0,
                    };
                }
            }
        }
    }

    /// Take no more jobs; the writer finishes those queued, then ends.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_one();
    }

    /// Take no more jobs and drop those queued: the writer has ended, so
    /// their submitters hear that it stopped instead of waiting forever.
    pub(crate) fn abandon(&self) {
        let dropped = {
            let mut state = self.lock();
            state.closed = true;
            std::mem::take(&mut state.jobs)
        };
        drop(dropped);
    }

    /// The state. A panic while it was held leaves it whole (every change
    /// is one push, drain or assignment): the queue goes on.
    fn lock(&self) -> MutexGuard<'_, State<Job>> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

impl<Job> std::fmt::Debug for Queue<Job> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("Queue")
            .field("jobs", &state.jobs.len())
            .field("closed", &state.closed)
            .field("wait", &state.wait)
            .finish()
    }
}

/// Abandons the queue when the writer ends, by returning or by a panic.
pub(crate) struct AbandonOnDrop<'a, Job>(pub(crate) &'a Queue<Job>);

impl<Job> Drop for AbandonOnDrop<'_, Job> {
    fn drop(&mut self) {
        self.0.abandon();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    /// A job of the tests' own queues.
    type Job = u32;

    fn job() -> Job {
        7
    }

    fn wait_state(q: &Queue<Job>) -> Wait {
        q.lock().wait
    }

    /// A queue and a writer thread taking from it until `deadline`, once
    /// that thread waits as `want` (waited for without a bare sleep); the
    /// thread answers what it took and how many jobs.
    fn writer_taking(
        deadline: Option<Instant>,
        want: Wait,
    ) -> (Arc<Queue<Job>>, std::thread::JoinHandle<(Taken, usize)>) {
        let q = Arc::new(Queue::default());
        let writer = {
            let q = Arc::clone(&q);
            std::thread::spawn(move || {
                let mut got = Vec::new();
                (q.take(deadline, 10, &mut got), got.len())
            })
        };
        let start = Instant::now();
        while wait_state(&q) != want {
            assert!(start.elapsed() < Duration::from_secs(10), "never {want:?}");
            std::thread::yield_now();
        }
        (q, writer)
    }

    #[test]
    fn rec_01_jobs_are_taken_in_submission_order() {
        let q = Queue::default();
        for _ in 0..5 {
            q.push(job(), false).map_err(|_| ()).unwrap();
        }
        let mut got = Vec::new();
        assert_eq!(q.take(None, 3, &mut got), Taken::Jobs);
        assert_eq!(got.len(), 3);
        assert_eq!(q.take(None, 3, &mut got), Taken::Jobs);
        assert_eq!(got.len(), 5);
    }

    #[test]
    fn a_deferred_job_does_not_wake_a_writer_with_a_deadline() {
        let by = Instant::now() + Duration::from_millis(300);
        let (q, writer) = writer_taking(Some(by), Wait::Until);
        q.push(job(), false).map_err(|_| ()).unwrap();
        assert_eq!(writer.join().unwrap(), (Taken::Jobs, 1));
        assert!(
            Instant::now() >= by,
            "the deferred job was taken at the deadline, not at once"
        );
    }

    #[test]
    fn an_urgent_job_wakes_a_writer_with_a_deadline() {
        let by = Instant::now() + Duration::from_secs(60);
        let (q, writer) = writer_taking(Some(by), Wait::Until);
        q.push(job(), true).map_err(|_| ()).unwrap();
        assert_eq!(writer.join().unwrap(), (Taken::Jobs, 1));
    }

    #[test]
    fn any_job_wakes_a_writer_without_a_deadline() {
        let (q, writer) = writer_taking(None, Wait::Forever);
        q.push(job(), false).map_err(|_| ()).unwrap();
        assert_eq!(writer.join().unwrap(), (Taken::Jobs, 1));
    }

    #[test]
    fn a_closed_queue_is_drained_then_ends_and_refuses_jobs() {
        let q = Queue::default();
        q.push(job(), false).map_err(|_| ()).unwrap();
        q.close();
        assert!(q.push(job(), true).is_err());
        let mut got = Vec::new();
        assert_eq!(q.take(None, 10, &mut got), Taken::Jobs);
        assert_eq!(q.take(None, 10, &mut got), Taken::Closed);
        assert_eq!(got.len(), 1);
    }

    #[test]
    fn an_abandoned_queue_drops_what_it_held() {
        let q = Queue::default();
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        q.push(tx, true).map_err(|_| ()).unwrap();
        drop(AbandonOnDrop(&q));
        assert!(matches!(
            rx.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Closed)
        ));
        let (tx, _rx) = tokio::sync::oneshot::channel::<()>();
        assert!(q.push(tx, true).is_err());
    }

    #[test]
    fn take_times_out_when_nothing_comes() {
        let q = Queue::<Job>::default();
        let mut got = Vec::new();
        let by = Instant::now() + Duration::from_millis(20);
        assert_eq!(q.take(Some(by), 10, &mut got), Taken::TimedOut);
        assert!(Instant::now() >= by);
    }
}
