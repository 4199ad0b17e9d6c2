//! The pressure shell: reads each GPU's attributed owner load, feeds its
//! [`PressureTracker`], and hands the verdicts and edges to the engine
//! (PRES-01..13; an extension beyond the seed on Linux, off by default).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::engine::OwnerPresence;
use crate::gpu_pressure::{
    Attendance, Miss, Observation, PressureReader, PressureReading, PressureTracker, server_pids,
};
use crate::shell::state::lender::Lender;
use crate::shell::state::shutdown::stopped;

/// One pressure-gated GPU: its tracker and where its owner load comes from.
pub struct PressureGpu {
    /// The tracker (its resource name is the engine's resource).
    pub tracker: PressureTracker,
    /// The owner-load reader.
    pub reader: Arc<dyn PressureReader>,
}

impl std::fmt::Debug for PressureGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PressureGpu")
            .field("resource", &self.tracker.resource())
            .field("reader", &self.reader.name())
            .finish()
    }
}

/// Sample every GPU's owner load every `poll` until `shutdown`.
///
/// # Behavior
///
/// - The upstream servers (the processes listening on `servers`) are not
///   the owner: their PIDs are excluded from each read.
/// - Pressure is judged against the attended or unattended baseline, so it
///   is sampled only while presence is known; while it is unknown the last
///   reading stands until it is stale (PRES-10, PRES-11).
/// - A read that fails or takes longer than `poll` is a missed sample
///   (PRES-04). Each round gives the engine every GPU's verdict and whether
///   it would let a pressure reclaim stand down (RECL-06), and each edge
///   (engaged, uncalibrated, a gap past the limit) as a reclaim trigger.
pub async fn pressure_loop(
    lender: Arc<Lender>,
    mut gpus: Vec<PressureGpu>,
    servers: Vec<SocketAddr>,
    poll: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last: Vec<Option<PressureReading>> = vec![None; gpus.len()];
    loop {
        let owner = lender.owner();
        let scan = servers.clone();
        let exclude = tokio::task::spawn_blocking(move || server_pids(&scan))
            .await
            .unwrap_or_default();
        for (gpu, last) in gpus.iter_mut().zip(&mut last) {
            round(&lender, gpu, owner, &exclude, poll, last).await;
        }
        tokio::select! {
            () = tokio::time::sleep(poll) => {}
            () = stopped(&mut shutdown) => return,
        }
    }
}

async fn round(
    lender: &Lender,
    gpu: &mut PressureGpu,
    owner: OwnerPresence,
    exclude: &[u32],
    poll: Duration,
    last: &mut Option<PressureReading>,
) {
    let clock = lender.clock();
    let attendance = match owner {
        OwnerPresence::Present => Some(Attendance::Attended),
        OwnerPresence::Away => Some(Attendance::Unattended),
        OwnerPresence::Unknown => None,
    };
    let observation = match attendance {
        None => Observation::Miss(Miss::PresenceUnknown),
        Some(attendance) => match tokio::time::timeout(poll, gpu.reader.read(exclude)).await {
            Ok(Ok(load)) => Observation::Sample(load, attendance),
            Ok(Err(e)) => Observation::Miss(Miss::ReadFailed(e.to_string())),
            Err(_) => Observation::Miss(Miss::ReadFailed(format!(
                "the attribution read took longer than poll_ms = {}",
                poll.as_millis()
            ))),
        },
    };
    let update = gpu.tracker.poll(clock.now(), observation);
    let resource = &update.resource;
    if last.as_ref() != Some(&update.reading) {
        info!(resource = %resource, reading = ?update.reading, "GPU pressure reading");
        *last = Some(update.reading.clone());
    }
    if let Err(e) = lender.with_engine(|e| e.apply_pressure(&update)) {
        warn!(resource = %resource, error = %e, "pressure for an unknown resource");
    }
    if let Some(t) = &update.trigger {
        warn!(resource = %resource, kind = ?t.kind, reason = %t.why, "GPU pressure: reclaiming the work that depends on this GPU");
    }
}
