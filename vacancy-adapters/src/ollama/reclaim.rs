//! Getting capacity back from Ollama: closing proxied responses cancels
//! borrowed work, and `keep_alive: 0` unloads every loaded model.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use tracing::info;
use vacancy::traits::{CancelItem, CancelOutcome, ReclaimError, Reclaimer, UnloadAck};

use super::ps::{parse_ps, unix_now};
use crate::common::{FetchError, ObservationClient};

/// Ollama's [`Reclaimer`].
///
/// # Behavior
///
/// - `cancel`: Ollama stops a generation when its client goes away, so
///   closing the proxied response is the cancellation (RECL-15); each item
///   is claimed once (RECL-24).
/// - `unload`: reads `GET /api/ps` and sends every listed model
///   `POST /api/generate {"model": name, "keep_alive": 0}` with
///   `[upstream.credential]` (OBS-02), the whole server at once (RECL-40).
///   Each answer must be Ollama's unload acknowledgement (`done: true`,
///   `done_reason: "unload"`), else the unload is
///   [`ReclaimError::Rejected`] (RECL-47). The whole exchange is bounded
///   (RECL-27, 2 minutes by default). An acknowledgement is counted by the
///   caller in `vacancyd_yields_total`; it is never recovered memory or
///   finished work (RECL-49): fresh samples decide that.
#[derive(Debug)]
pub struct OllamaUnloader {
    client: ObservationClient,
    bound: Duration,
}

impl OllamaUnloader {
    /// The default bound on one unload (RECL-27).
    pub const DEFAULT_BOUND: Duration = Duration::from_secs(120);

    /// An unloader using `client` (its credential), bounded by `bound` overall.
    pub fn new(client: ObservationClient, bound: Duration) -> Self {
        OllamaUnloader { client, bound }
    }

    async fn unload_all(&self) -> Result<UnloadAck, ReclaimError> {
        let ps = self
            .client
            .fetch_json("/api/ps")
            .await
            .map_err(reclaim_error)?;
        let models =
            parse_ps(&ps, unix_now()).map_err(|e| ReclaimError::Rejected(e.to_string()))?;
        for m in &models {
            let reply = self
                .client
                .post_json(
                    "/api/generate",
                    &json!({"model": m.reported, "keep_alive": 0, "stream": false}),
                )
                .await
                .map_err(reclaim_error)?;
            let acknowledged = reply.get("done") == Some(&Value::Bool(true))
                && reply.get("done_reason").and_then(Value::as_str) == Some("unload");
            if !acknowledged {
                return Err(ReclaimError::Rejected(format!(
                    "unloading {:?} was not acknowledged (no done_reason \"unload\" in the answer)",
                    m.reported
                )));
            }
            info!(model = %m.reported, "model unload acknowledged");
        }
        Ok(UnloadAck::Acknowledged {
            models: Some(u32::try_from(models.len()).unwrap_or(u32::MAX)),
        })
    }
}

fn reclaim_error(e: FetchError) -> ReclaimError {
    match e {
        FetchError::Unreachable(why) => ReclaimError::Unreachable(why),
        other => ReclaimError::Rejected(other.to_string()),
    }
}

#[async_trait]
impl Reclaimer for OllamaUnloader {
    async fn cancel(&self, items: &[CancelItem], _deadline: Instant) -> Vec<CancelOutcome> {
        items
            .iter()
            .map(|item| {
                if item.claim.try_claim() {
                    CancelOutcome::ByClosingResponse(item.entry)
                } else {
                    CancelOutcome::ClaimedElsewhere(item.entry)
                }
            })
            .collect()
    }

    async fn unload(&self) -> Result<UnloadAck, ReclaimError> {
        match tokio::time::timeout(self.bound, self.unload_all()).await {
            Ok(result) => result,
            Err(_) => Err(ReclaimError::TimedOut(self.bound.as_secs())),
        }
    }
}
