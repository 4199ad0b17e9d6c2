//! Post-job samples taken on the thread where the job ended (ADM-05).
//!
//! A release asks for a sample of each freed resource, and the next request
//! for it waits for that sample (ADM-06). Through the resource's sampling
//! loop on the daemon's main runtime, the sample crossed threads four times
//! (the release's proxy worker to the loop, the loop to the sampler's
//! blocking pool and back, the loop to the waiting request); a `sampler =
//! "file"` stream's first chunk paid about 65 µs for it (issue 31,
//! `scripts/bench-proxy`). Started where the job ended, the sample crosses
//! only into the sampler's own I/O and back. The loop still takes the
//! periodic samples; a late reading never replaces a newer one in the engine,
//! so the two may overlap.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::runtime::Handle;

use crate::time::{Moment, MonotonicClock};
use crate::traits::resource::{CapacitySample, Resource, SampleError};

/// Where a post-job sample is recorded: the daemon's lender.
pub trait SampleRecorder: Send + Sync {
    /// The clock samples are stamped with.
    fn clock(&self) -> MonotonicClock;
    /// A sampler's result, started at `started`.
    fn record_sample(
        &self,
        resource: &str,
        result: Result<CapacitySample, SampleError>,
        started: Moment,
    );
}

/// One sample of `resource` within `timeout`, and when it was started.
pub async fn take_sample(
    resource: &dyn Resource,
    clock: &MonotonicClock,
    timeout: Duration,
) -> (Result<CapacitySample, SampleError>, Moment) {
    let started = clock.now();
    let result = match tokio::time::timeout(timeout, resource.sample()).await {
        Ok(r) => r,
        Err(_) => Err(SampleError::Unreadable {
            source_name: resource.id().to_owned(),
            reason: format!("no answer within {} ms", timeout.as_millis()),
        }),
    };
    (result, started)
}

/// Why a sample is asked for: whether a sample already under way answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleAsk {
    /// A job ended: a sample under way may have started before that end, so
    /// one more follows it.
    JobEnded,
    /// A request waits for a fresh sample (ADM-06): a sample under way
    /// answers it, as it started after the job end the request waits on, or
    /// that job's own end asked for one more. The request asks again each
    /// time a sample lands, so no need is left unasked.
    Waiting,
}

/// A resource's post-job samples: at most one at a time, and one more after
/// it when a job ended while it ran (that job's end may postdate its start).
pub struct PostJobSampler {
    resource: Arc<dyn Resource>,
    timeout: Duration,
    run: Mutex<Run>,
}

#[derive(Debug, Default)]
struct Run {
    running: bool,
    again: bool,
}

impl std::fmt::Debug for PostJobSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostJobSampler")
            .field("resource", &self.resource.id())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl PostJobSampler {
    /// Post-job samples of `resource`, each within `timeout`.
    pub fn new(resource: Arc<dyn Resource>, timeout: Duration) -> Arc<Self> {
        Arc::new(PostJobSampler {
            resource,
            timeout,
            run: Mutex::new(Run::default()),
        })
    }

    /// The resource it samples.
    pub fn resource_id(&self) -> &str {
        self.resource.id()
    }

    fn run(&self) -> std::sync::MutexGuard<'_, Run> {
        self.run
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sample now on the calling thread's runtime, recording into `to`;
    /// false off any runtime (the caller then pulls the loop's trigger).
    pub fn trigger(self: &Arc<Self>, to: &Weak<dyn SampleRecorder>, ask: SampleAsk) -> bool {
        let Ok(runtime) = Handle::try_current() else {
            return false;
        };
        {
            let mut run = self.run();
            if run.running {
                run.again |= ask == SampleAsk::JobEnded;
                return true;
            }
            run.running = true;
        }
        let mut running = Running(Some(Arc::clone(self)));
        let sampler = Arc::clone(self);
        let to = Weak::clone(to);
        runtime.spawn(async move {
            loop {
                let Some(to) = to.upgrade() else {
                    return;
                };
                let (result, started) =
                    take_sample(&*sampler.resource, &to.clock(), sampler.timeout).await;
                to.record_sample(sampler.resource.id(), result, started);
                let mut run = sampler.run();
                if run.again {
                    run.again = false;
                    continue;
                }
                // Under the same lock as the check: a trigger from now on
                // starts a new sample.
                run.running = false;
                running.disarm();
                return;
            }
        });
        true
    }
}

/// The running sample, until it ends normally: a sample that ends otherwise
/// (a runtime shutting down drops it) still lets the next trigger start one.
struct Running(Option<Arc<PostJobSampler>>);

impl Running {
    /// It ended normally, and said so under the run's lock.
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(sampler) = self.0.take() {
            let mut run = sampler.run();
            run.running = false;
            run.again = false;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;
    use tokio::sync::{Notify, Semaphore};

    use super::*;
    use crate::ledger::store::VolatileStore;
    use crate::shell::state::lender::{Lender, one_gpu_lender};
    use crate::traits::resource::ResourceKind;

    /// A resource whose samples each wait for a permit, and are counted.
    struct Gated {
        clock: MonotonicClock,
        permits: Semaphore,
        taken: AtomicUsize,
        took: Notify,
    }

    #[async_trait]
    impl Resource for Gated {
        fn id(&self) -> &str {
            "gpu0"
        }
        fn kind(&self) -> ResourceKind {
            ResourceKind::Gpu
        }
        async fn sample(&self) -> Result<CapacitySample, SampleError> {
            let started = self.clock.now();
            self.permits.acquire().await.unwrap().forget();
            self.taken.fetch_add(1, Ordering::SeqCst);
            self.took.notify_one();
            Ok(CapacitySample::memory(9000, 9000, started))
        }
    }

    fn lender_with(gated: &Arc<Gated>) -> Arc<Lender> {
        let lender = one_gpu_lender(gated.clock, Arc::new(VolatileStore));
        let resource: Arc<dyn Resource> = Arc::clone(gated) as Arc<dyn Resource>;
        lender.sample_where_jobs_end(vec![PostJobSampler::new(resource, Duration::from_secs(10))]);
        lender
    }

    fn gated() -> Arc<Gated> {
        Arc::new(Gated {
            clock: MonotonicClock::new(),
            permits: Semaphore::new(0),
            taken: AtomicUsize::new(0),
            took: Notify::new(),
        })
    }

    async fn samples_reach(gated: &Gated, n: usize) {
        while gated.taken.load(Ordering::SeqCst) < n {
            let took = tokio::time::timeout(Duration::from_secs(10), gated.took.notified());
            assert!(took.await.is_ok(), "sample {n} never came");
        }
    }

    /// No sample beyond the `n` taken: one more started would have been
    /// taken within these turns of the single-threaded runtime (its
    /// permit is there already).
    async fn stays_at(gated: &Gated, n: usize) {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(gated.taken.load(Ordering::SeqCst), n);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn adm_05_a_job_end_samples_where_it_ended_not_through_the_loop() {
        let gated = gated();
        let lender = lender_with(&gated);
        let loop_trigger = lender.sample_trigger("gpu0").unwrap();
        let now = lender.clock().now();
        lender.record_sample("gpu0", Ok(CapacitySample::memory(9000, 9000, now)), now);
        let up = lender.upstream_id("llm").unwrap();
        let request = crate::engine::WorkRequest::new(up, None, now);
        let crate::shell::state::lender::Decided::Admitted(admission) =
            lender.decide(&request).await
        else {
            panic!("not admitted");
        };
        let entry = admission.recorded().await.unwrap().id;
        lender.release(entry, crate::engine::ReleaseOutcome::Completed);
        gated.permits.add_permits(1);
        samples_reach(&gated, 1).await;
        let loop_asked = tokio::time::timeout(Duration::ZERO, loop_trigger.notified()).await;
        assert!(loop_asked.is_err(), "the sampling loop was asked as well");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn adm_05_jobs_ending_during_a_sample_get_one_more_after_it() {
        let gated = gated();
        let lender = lender_with(&gated);
        lender.sample_soon("gpu0", SampleAsk::JobEnded);
        // Two more jobs end while the first sample runs: one sample follows.
        tokio::task::yield_now().await;
        lender.sample_soon("gpu0", SampleAsk::JobEnded);
        lender.sample_soon("gpu0", SampleAsk::JobEnded);
        gated.permits.add_permits(3);
        samples_reach(&gated, 2).await;
        stays_at(&gated, 2).await;
        // Idle again: the next job's end starts a sample of its own.
        lender.sample_soon("gpu0", SampleAsk::JobEnded);
        samples_reach(&gated, 3).await;
    }

    // ADM-06
    #[tokio::test(flavor = "current_thread")]
    async fn adm_06_a_waiting_request_is_answered_by_the_sample_under_way() {
        let gated = gated();
        let lender = lender_with(&gated);
        lender.sample_soon("gpu0", SampleAsk::JobEnded);
        // A request waits for the sample the job's end started: no second one.
        lender.sample_soon("gpu0", SampleAsk::Waiting);
        gated.permits.add_permits(2);
        samples_reach(&gated, 1).await;
        stays_at(&gated, 1).await;
        // With none under way, a waiting request starts one.
        lender.sample_soon("gpu0", SampleAsk::Waiting);
        samples_reach(&gated, 2).await;
    }

    #[test]
    fn off_any_runtime_the_loop_is_asked() {
        let gated = gated();
        let lender = lender_with(&gated);
        let loop_trigger = lender.sample_trigger("gpu0").unwrap();
        lender.sample_soon("gpu0", SampleAsk::JobEnded);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let asked = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), loop_trigger.notified()).await
        });
        assert!(asked.is_ok(), "the sampling loop was not asked");
        assert_eq!(gated.taken.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_sample_cut_short_lets_the_next_job_end_start_one() {
        let gated = gated();
        let lender = lender_with(&gated);
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap()
        };
        // Started on a runtime that is then shut down mid-sample.
        let first = runtime();
        first.block_on(async { lender.sample_soon("gpu0", SampleAsk::JobEnded) });
        drop(first);
        runtime().block_on(async {
            lender.sample_soon("gpu0", SampleAsk::JobEnded);
            gated.permits.add_permits(1);
            samples_reach(&gated, 1).await;
        });
    }
}
