//! The observation loop: what each upstream holds (its models, its queue),
//! its health for `/status`, and the yield and unload a reclaim asks of it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::engine::{ModelObservation, ObservedModel, ResidencyEvidence};
use crate::shell::state::lender::Lender;
use crate::shell::state::shutdown::stopped;
use crate::shell::upstream::route::UpstreamRoute;
use crate::traits::{ForeignWork, ObserveError, ReclaimError, UnloadAck};

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

/// Observe an upstream once and give the observation to the engine: what the
/// observation loop and the RES-20 refusal path both do.
///
/// # Behavior
///
/// When the observation is the first one after a request of a known kind
/// finished, with nothing admitted since, the adapter learns from it first
/// (RES-07) and the engine gets the evidence that lesson changed.
pub async fn observe_upstream(
    lender: &Lender,
    route: &UpstreamRoute,
) -> Result<ModelObservation, ObserveError> {
    let mut obs = route.adapter.observe().await?;
    if let Some(lesson) = lender.take_lesson(route.id, obs.taken_at) {
        route.adapter.learn(&lesson, &mut obs).await;
    }
    lender.observe(route.id, obs.clone());
    Ok(obs)
}

/// What a yield did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Yielded {
    /// The upstream acknowledged the unload (never proof of freed memory).
    Unloaded(UnloadAck),
    /// The upstream holds work vacancy did not admit: no unload (RECL-34).
    Skipped,
}

/// The log line of a skipped unload, as the seed words it (RECL-37).
pub const UNLOAD_SKIPPED: &str =
    "model unload skipped; the upstream holds work vacancyd did not admit";

/// Ask an upstream to unload its models (a yield, for reclaim).
///
/// # Behavior
///
/// - Uses the adapter's [`Reclaimer`](crate::traits::Reclaimer); an adapter
///   without one is [`ReclaimError::Unsupported`].
/// - First asks whether the upstream holds work other than `own` (the
///   upstream handles of vacancy's work on the same server, RECL-35): work
///   vacancy did not admit skips the unload, logged as [`UNLOAD_SKIPPED`]
///   without prompt IDs (RECL-34, RECL-37); when it cannot be told, the
///   unload goes ahead and the reason is logged (RECL-38, RECL-39).
/// - An acknowledgement is counted in `vacancyd_yields_total{upstream}`
///   (OBS-04) and disturbs the upstream's resources: residency proofs taken
///   before it no longer hold and new work waits for a fresh sample
///   (RECL-45). It releases nothing and is never counted as recovered
///   memory (RECL-49).
pub async fn yield_upstream(
    lender: &Lender,
    route: &UpstreamRoute,
    own: &[String],
) -> Result<Yielded, ReclaimError> {
    let Some(reclaimer) = route.adapter.reclaimer() else {
        return Err(ReclaimError::Unsupported(format!(
            "the {} adapter cannot unload models",
            route.adapter.name()
        )));
    };
    match reclaimer.foreign_work(own).await {
        Ok(ForeignWork::Present) => {
            info!(upstream = %route.name, "{UNLOAD_SKIPPED}");
            return Ok(Yielded::Skipped);
        }
        Ok(ForeignWork::None) => {}
        Ok(ForeignWork::CannotTell(why)) => {
            info!(upstream = %route.name, reason = %why, "unloading without knowing whose work the upstream holds");
        }
        Err(e) => {
            info!(upstream = %route.name, reason = %e, "unloading without knowing whose work the upstream holds");
        }
    }
    unload_upstream(lender, route).await
}

/// Ask an upstream to unload its models without first asking whose work it
/// holds: for when that cannot be told (RECL-38), with the reason logged by
/// the caller. Counts and records an acknowledgement as [`yield_upstream`] does.
pub async fn unload_upstream(
    lender: &Lender,
    route: &UpstreamRoute,
) -> Result<Yielded, ReclaimError> {
    let Some(reclaimer) = route.adapter.reclaimer() else {
        return Err(ReclaimError::Unsupported(format!(
            "the {} adapter cannot unload models",
            route.adapter.name()
        )));
    };
    let ack = reclaimer.unload().await;
    match &ack {
        Ok(UnloadAck::Acknowledged { models }) => {
            lender.metrics().yielded(&route.name);
            let now = lender.clock().now();
            if let Err(e) = lender.with_engine(|e| e.record_yield(route.id, now)) {
                warn!(upstream = %route.name, error = %e, "yield for an unknown upstream");
            }
            match models {
                Some(n) => {
                    info!(upstream = %route.name, models = n, "upstream acknowledged the unload (not proof of freed memory)")
                }
                None => {
                    info!(upstream = %route.name, "upstream acknowledged the unload (not proof of freed memory)")
                }
            }
        }
        Err(e) => warn!(upstream = %route.name, error = %e, "unload failed"),
    }
    ack.map(Yielded::Unloaded)
}

/// How `/status` describes one observed model's residency (RES-22).
pub fn describe_residency(m: &ObservedModel) -> String {
    let mut loaded = String::new();
    if let Some(ctx) = m.context_length {
        loaded.push_str(&format!(", context {ctx}"));
    }
    if let Some(digest) = &m.digest {
        let short: String = digest
            .trim_start_matches("sha256:")
            .chars()
            .take(12)
            .collect();
        loaded.push_str(&format!(", digest {short}"));
    }
    let state = if m.ready { "loaded" } else { "loading" };
    match &m.evidence {
        ResidencyEvidence::Proven => format!("{}: {state}{loaded}; resident", m.name),
        ResidencyEvidence::ProvenFor { kinds, otherwise } if kinds.is_empty() => {
            format!("{}: {state}{loaded}; not proven ({otherwise})", m.name)
        }
        ResidencyEvidence::ProvenFor { kinds, .. } => format!(
            "{}: {state}{loaded}; resident for {}",
            m.name,
            kinds.join("; ")
        ),
        ResidencyEvidence::NotProven(why) => {
            format!("{}: {state}{loaded}; not proven ({why})", m.name)
        }
    }
}

/// Observe an upstream every `every`, and at once when work on it ends:
/// loaded models and residency evidence feed the engine; reachability feeds
/// `/status`.
pub async fn observe_loop(
    lender: Arc<Lender>,
    route: Arc<UpstreamRoute>,
    health: Arc<HealthCell>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut was_reachable: Option<bool> = None;
    // The observation failure last logged while the upstream answers: each
    // new one is logged once, not every poll, and so is the recovery.
    let mut failing: Option<String> = None;
    let trigger = lender.observe_trigger(route.id);
    let target = route.target.clone();
    trigger.watch_connections(move || target.last_connect_failed());
    let mut after_job = false;
    loop {
        // Whether a connection made since the last pass (the job's own, or
        // a read's) reached the upstream.
        let answered = route.target.take_last_connect() == Some(true);
        let observed = observe_upstream(&lender, &route).await;
        // An adapter that cannot observe learns only that the upstream
        // answers: a job's end need not wake this loop while it does.
        let connection_only = matches!(observed, Err(ObserveError::Unsupported));
        let next = match observed {
            // After a job whose connection reached the upstream, a connect
            // proves nothing more, and costs the upstream one more
            // connection per job.
            Err(ObserveError::Unsupported) if after_job && answered => UpstreamHealth {
                reachable: Some(true),
                ..UpstreamHealth::default()
            },
            Ok(obs) => UpstreamHealth {
                reachable: Some(true),
                error: None,
                models: obs.models.iter().map(|m| m.name.clone()).collect(),
                residency: obs.models.iter().map(describe_residency).collect(),
            },
            Err(ObserveError::Unsupported) => {
                match route.target.connect(Duration::from_secs(2)).await {
                    Ok(_) => UpstreamHealth {
                        reachable: Some(true),
                        ..UpstreamHealth::default()
                    },
                    Err(e) => unreachable(e.to_string()),
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
        let answering_error = next.error.as_ref().filter(|_| next.reachable == Some(true));
        match (answering_error, &failing) {
            (Some(error), Some(last)) if error == last => {
                debug!(upstream = %route.name, error = %error, "observation still fails");
            }
            (Some(error), _) => {
                warn!(upstream = %route.name, error = %error, "observation failed: the upstream answers, but vacancyd cannot read its models or work from the answer (logged again only when the error changes)");
                failing = Some(error.clone());
            }
            (None, Some(_)) => {
                if next.reachable == Some(true) {
                    info!(upstream = %route.name, "observation works again");
                }
                failing = None;
            }
            (None, None) => {}
        }
        lender.metrics().observed(&route.name, next.error.is_some());
        trigger.set_connection_only(connection_only && next.reachable == Some(true));
        health.set(next);
        after_job = false;
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = trigger.pulled() => {
                after_job = true;
                debug!(upstream = %route.name, "post-job observation");
            }
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
