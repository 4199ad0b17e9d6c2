//! The sampling loop: each resource's capacity, every poll and at once when
//! a job on it ends (ADM-04, ADM-05).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tracing::{debug, error, warn};

use crate::MonotonicClock;
use crate::shell::loops::sink::LoopSink;
use crate::shell::state::post_job::take_sample;
use crate::shell::state::shutdown::stopped;
use crate::traits::resource::{CapacitySample, Resource, ResourceKind, SampleError};

/// How long one sample of a resource polled every `poll` may take: the
/// interval, within 2 to 10 s.
pub fn sample_timeout(poll: Duration) -> Duration {
    poll.max(Duration::from_secs(2))
        .min(Duration::from_secs(10))
}

/// The sampler a `[[resource]]` configures; one that cannot be built here
/// (no NVML, no card, a `manual` resource) fails every sample with the
/// reason, so its capacity stays unknown and `/status` says why.
pub fn sampler_for(
    config: &crate::config::ResourceConfig,
    clock: MonotonicClock,
) -> Arc<dyn Resource> {
    match crate::sample::from_config(config, clock) {
        Ok(s) => s,
        Err(e) => {
            error!(resource = %config.name, error = %e, "cannot sample this resource; its work is refused with capacity_unknown");
            Arc::new(UnavailableResource::new(&config.name, config.kind, &e))
        }
    }
}

/// Take one sample of `resource` within `timeout` and record it; returns the
/// sample, or why it failed.
pub async fn sample_once<S: LoopSink + ?Sized>(
    sink: &S,
    resource: &dyn Resource,
    timeout: Duration,
) -> Result<CapacitySample, String> {
    let (result, started) = take_sample(resource, &sink.clock(), timeout).await;
    let outcome = result.as_ref().copied().map_err(ToString::to_string);
    sink.record_sample(resource.id(), result, started);
    outcome
}

/// Sample `resource` every `poll` and whenever a job on it ends (ADM-05).
/// The caller takes the first sample before the loop starts.
///
/// A sample that fails or does not answer within `timeout` is recorded as a
/// failure: the resource's capacity is unknown until a later success.
pub async fn sample_loop<S: LoopSink + ?Sized>(
    sink: Arc<S>,
    resource: Arc<dyn Resource>,
    poll: Duration,
    timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let name = resource.id().to_owned();
    let Some(trigger) = sink.sample_trigger(&name) else {
        warn!(resource = %name, "no sample trigger for this resource; not sampling it");
        return;
    };
    loop {
        tokio::select! {
            () = tokio::time::sleep(poll) => {}
            () = trigger.notified() => debug!(resource = %name, "post-job sample"),
            () = stopped(&mut shutdown) => return,
        }
        // A failure is recorded (capacity unknown) and logged by the sink.
        let _ = sample_once(&*sink, &*resource, timeout).await;
    }
}

/// A resource whose sampler could not be built: every sample fails with the
/// reason, so its capacity stays unknown and `/status` says why.
pub struct UnavailableResource {
    name: String,
    kind: ResourceKind,
    reason: String,
}

impl UnavailableResource {
    /// A stand-in for a sampler that failed to start.
    pub fn new(name: &str, kind: ResourceKind, error: &SampleError) -> Self {
        UnavailableResource {
            name: name.to_owned(),
            kind,
            reason: error.to_string(),
        }
    }
}

#[async_trait]
impl Resource for UnavailableResource {
    fn id(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> ResourceKind {
        self.kind
    }
    async fn sample(&self) -> Result<CapacitySample, SampleError> {
        Err(SampleError::Unavailable(self.reason.clone()))
    }
}
