//! The async loops around the engine: sampling, observation, presence.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::engine::OwnerPresence;
use crate::engine::ResidencyEvidence;
use crate::presence::PresenceBackend;
use crate::proxy::lender::Lender;
use crate::proxy::{UpstreamRoute, stopped};
use crate::traits::ObserveError;
use crate::traits::resource::{CapacitySample, Resource, ResourceKind, SampleError};

/// Sample `resource` every `poll` and whenever a job on it ends (ADM-05).
/// The caller takes the first sample before the loop starts.
///
/// # Behavior
///
/// A sample that fails or does not answer within `timeout` is recorded as a
/// failure: the resource's capacity is unknown until a later success.
pub async fn sample_loop(
    lender: Arc<Lender>,
    resource: Arc<dyn Resource>,
    poll: Duration,
    timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let name = resource.id().to_owned();
    let Some(trigger) = lender.sample_trigger(&name) else {
        warn!(resource = %name, "no sample trigger for this resource; not sampling it");
        return;
    };
    loop {
        tokio::select! {
            () = tokio::time::sleep(poll) => {}
            () = trigger.notified() => debug!(resource = %name, "post-job sample"),
            () = stopped(&mut shutdown) => return,
        }
        let started = lender.clock().now();
        let result = match tokio::time::timeout(timeout, resource.sample()).await {
            Ok(r) => r,
            Err(_) => Err(SampleError::Unreadable {
                source_name: name.clone(),
                reason: format!("no answer within {} ms", timeout.as_millis()),
            }),
        };
        lender.record_sample(&name, result, started);
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

/// What `/status` shows about an upstream's server, from the observation loop.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct UpstreamHealth {
    /// Whether the server answered the last check; `None` before the first.
    pub reachable: Option<bool>,
    /// Why the last check failed.
    pub error: Option<String>,
    /// The models the last observation showed loaded.
    pub models: Vec<String>,
    /// The residency evidence of the last observation, per model.
    pub residency: Vec<String>,
}

/// Shared, updatable health of one upstream.
#[derive(Debug, Default)]
pub struct HealthCell(Mutex<UpstreamHealth>);

impl HealthCell {
    /// The latest health.
    pub fn get(&self) -> UpstreamHealth {
        match self.0.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn set(&self, health: UpstreamHealth) {
        match self.0.lock() {
            Ok(mut g) => *g = health,
            Err(p) => *p.into_inner() = health,
        }
    }
}

/// Observe an upstream every `every`: loaded models and residency evidence
/// feed the engine; reachability feeds `/status`.
pub async fn observe_loop(
    lender: Arc<Lender>,
    route: Arc<UpstreamRoute>,
    health: Arc<HealthCell>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut was_reachable: Option<bool> = None;
    loop {
        let next = match route.adapter.observe().await {
            Ok(obs) => {
                let h = UpstreamHealth {
                    reachable: Some(true),
                    error: None,
                    models: obs.models.iter().map(|m| m.name.clone()).collect(),
                    residency: obs
                        .models
                        .iter()
                        .map(|m| match &m.evidence {
                            ResidencyEvidence::Proven => format!("{}: resident", m.name),
                            ResidencyEvidence::NotProven(why) => {
                                format!("{}: not proven ({why})", m.name)
                            }
                        })
                        .collect(),
                };
                lender.observe(route.id, obs);
                h
            }
            Err(ObserveError::Unsupported) => {
                let addr = (route.target.host.as_str(), route.target.port);
                match tokio::time::timeout(
                    Duration::from_secs(2),
                    tokio::net::TcpStream::connect(addr),
                )
                .await
                {
                    Ok(Ok(_)) => UpstreamHealth {
                        reachable: Some(true),
                        ..UpstreamHealth::default()
                    },
                    Ok(Err(e)) => unreachable(e.to_string()),
                    Err(_) => unreachable("no connection within 2 s".to_owned()),
                }
            }
            Err(ObserveError::Unreachable(e)) => unreachable(e),
            Err(e) => UpstreamHealth {
                reachable: Some(true),
                error: Some(e.to_string()),
                ..UpstreamHealth::default()
            },
        };
        if next.reachable != was_reachable {
            match next.reachable {
                Some(true) => info!(upstream = %route.name, "upstream reachable"),
                _ => {
                    warn!(upstream = %route.name, error = next.error.as_deref().unwrap_or(""), "upstream unreachable")
                }
            }
            was_reachable = next.reachable;
        }
        health.set(next);
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stopped(&mut shutdown) => return,
        }
    }
}

fn unreachable(error: String) -> UpstreamHealth {
    UpstreamHealth {
        reachable: Some(false),
        error: Some(error),
        ..UpstreamHealth::default()
    }
}

/// Ask the presence backend every `every` and give the answer to the engine.
pub async fn presence_loop(
    lender: Arc<Lender>,
    backend: Box<dyn PresenceBackend>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last: Option<OwnerPresence> = None;
    loop {
        let presence = backend.presence().await;
        if last != Some(presence) {
            info!(
                backend = backend.name(),
                presence = presence.as_str(),
                "owner presence"
            );
            last = Some(presence);
        }
        lender.with_engine(|e| e.set_owner(presence));
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stopped(&mut shutdown) => return,
        }
    }
}
