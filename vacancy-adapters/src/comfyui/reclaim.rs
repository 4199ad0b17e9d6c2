//! Getting capacity back from ComfyUI (the adapter's side of reclaim):
//! cancelling borrowed prompts through the queue API, and `/free` only when
//! ComfyUI holds no work vacancy did not admit (RECL-16..28, RECL-34..41).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::json;
use tracing::{info, warn};
use vacancy::traits::{CancelItem, CancelOutcome, ForeignWork, ReclaimError, Reclaimer, UnloadAck};

use super::follow::PromptReads;
use super::stream::{self, ListPrompts, QueueScan, ReadLimits};
use super::tracker::History;
use super::version::ComfyVersion;
use crate::common::{FetchError, ObservationClient};

/// The clocks and bounds of a reclaim at ComfyUI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReclaimTimes {
    /// How long one delete or stop request may take (RECL-27: 2 minutes).
    pub request: Duration,
    /// How long the history of a stopped prompt is checked (RECL-28: 10 s).
    pub history_check: Duration,
    /// Between those history checks.
    pub history_every: Duration,
    /// The most of the queue the pre-unload check reads (RECL-36: 16 MiB).
    pub unload_check_bytes: u64,
}

impl Default for ReclaimTimes {
    fn default() -> Self {
        ReclaimTimes {
            request: Duration::from_secs(120),
            history_check: Duration::from_secs(10),
            history_every: Duration::from_millis(500),
            unload_check_bytes: 16 * 1024 * 1024,
        }
    }
}

/// Where ComfyUI 0.26.0 and later cancel one job (RECL-26); `{id}` is the
/// prompt ID. An older release answers 404 or 405 there, and the stop falls
/// back to `POST /interrupt {"prompt_id"}` from 0.3.57 on; before 0.3.57
/// `/interrupt` ignores its body, so nothing is sent.
pub const DEFAULT_JOB_CANCEL_PATH: &str = "/api/jobs/{id}/cancel";

/// ComfyUI's [`Reclaimer`].
///
/// # Behavior
///
/// - `cancel` (RECL-16..25): claims each item once (RECL-24); deletes every
///   claimed prompt from the pending queue in one `POST /queue {"delete"}`
///   naming only borrowed IDs (RECL-19); reads the queue again and stops a
///   prompt only if it is running there: the job cancel first, then
///   `POST /interrupt {"prompt_id"}` only when the job cancel route answers
///   404 or 405 and `/system_stats` reports 0.3.57 or later (RECL-26); then
///   checks the stopped prompt's history for up to 10 s (RECL-28). On an
///   older release, one reporting no version, or one whose version cannot
///   be read, `/interrupt` would stop whatever runs, in the moment after the
///   borrowed prompt ends the owner's next one: the prompt is
///   `LeftRunning`, its reservation stays and its tracker releases it. A prompt the first queue read showed and the
///   delete removed, or whose history shows its end, is `Stopped` (RECL-17,
///   RECL-18, RECL-25); a prompt that is neither is `Requested` and its
///   tracker releases it (RECL-29); a failed request is `Failed` and the
///   reservation stays (RECL-21). An item without a prompt ID yet is left
///   to the submission recorder (RECL-23).
/// - `unload`: `POST /free {"unload_models": true, "free_memory": true}`;
///   ComfyUI accepts a worker flag and reports no model count (RECL-48).
/// - `foreign_work`: the queue read up to 16 MiB, stopping at the first
///   prompt not in `own` (RECL-34..36); a read that fails or breaks the
///   bound cannot tell (RECL-38).
#[derive(Debug)]
pub struct ComfyReclaimer<R> {
    client: ObservationClient,
    limits: ReadLimits,
    times: ReclaimTimes,
    job_cancel_path: String,
    reads: R,
}

impl<R: PromptReads> ComfyReclaimer<R> {
    /// A reclaimer using `client` (a credential and a timeout fit for
    /// `times.request`), `reads` for history, and the queue read `limits`.
    pub fn new(
        client: ObservationClient,
        limits: ReadLimits,
        times: ReclaimTimes,
        reads: R,
    ) -> Self {
        ComfyReclaimer {
            client,
            limits,
            times,
            job_cancel_path: DEFAULT_JOB_CANCEL_PATH.to_owned(),
            reads,
        }
    }

    /// The same reclaimer cancelling jobs at another path (`{id}` = prompt ID).
    pub fn with_job_cancel_path(mut self, path: &str) -> Self {
        self.job_cancel_path = path.to_owned();
        self
    }

    async fn listing(&self) -> Result<stream::QueueListing, String> {
        stream::get_scanned(
            &self.client,
            "/queue",
            &self.limits,
            QueueScan::new(ListPrompts::new()),
        )
        .await
        .map_err(|e| e.to_string())
    }

    /// Stop one running prompt: job cancel, else a targeted interrupt where
    /// the release honours it (RECL-26).
    async fn stop(&self, id: &str) -> Result<Stop, String> {
        let path = self
            .job_cancel_path
            .replace("{id}", &super::path_segment(id));
        match self.client.post_for_status(&path, &json!({})).await {
            Ok(_) => return Ok(Stop::Requested),
            Err(e)
                if matches!(
                    e.status(),
                    Some(http::StatusCode::NOT_FOUND | http::StatusCode::METHOD_NOT_ALLOWED)
                ) => {}
            Err(e) => return Err(e.to_string()),
        }
        let first = ComfyVersion::TARGETS_INTERRUPT;
        // The release observation last read (every poll), else read it now.
        let version = match self.reads.known_version() {
            Some(v) => Ok(v),
            None => self.reads.version().await,
        };
        match version {
            Ok(v) if v.targets_interrupt() => {}
            Ok(v) => {
                return Ok(Stop::Unsafe(format!(
                    "{v} has no job cancel and its /interrupt ignores the prompt ID (honoured from {first} on): it would stop whatever runs, the owner's next prompt once this one ends; the prompt runs to its end"
                )));
            }
            Err(e) => {
                return Ok(Stop::Unsafe(format!(
                    "the ComfyUI release could not be read ({e}), so an /interrupt might stop the owner's prompt instead (it honours the prompt ID from {first} on); the prompt runs to its end"
                )));
            }
        }
        self.client
            .post_for_status("/interrupt", &json!({ "prompt_id": id }))
            .await
            .map(|_| Stop::Requested)
            .map_err(|e| e.to_string())
    }

    /// Whether the history shows the prompt ended, checked for up to 10 s (RECL-28).
    async fn ended_within_window(&self, id: &str) -> bool {
        self.ended_within(id, self.times.history_check).await
    }

    /// Whether the history shows the prompt ended, checked every
    /// `history_every` for up to `window`.
    async fn ended_within(&self, id: &str, window: Duration) -> bool {
        let until = tokio::time::Instant::now() + window;
        loop {
            if let Ok(History::Finished { .. }) = self.reads.history(id).await {
                return true;
            }
            if tokio::time::Instant::now() + self.times.history_every > until {
                return false;
            }
            tokio::time::sleep(self.times.history_every).await;
        }
    }
}

/// What [`ComfyReclaimer::stop`] did.
#[derive(Debug)]
enum Stop {
    /// A stop naming only this prompt was sent.
    Requested,
    /// None could be sent without risking the owner's work; why.
    Unsafe(String),
}

fn fetch_reason(e: &FetchError) -> String {
    e.to_string()
}

impl<R: PromptReads> ComfyReclaimer<R> {
    /// A borrowed prompt the queue shows running: asked to stop, and
    /// `Stopped` only when its end is seen within the window (RECL-26, RECL-29).
    async fn stop_running(&self, item: &CancelItem, id: &str) -> CancelOutcome {
        match self.stop(id).await {
            // The caller logs it with the reason (RECL-26).
            Ok(Stop::Unsafe(reason)) => CancelOutcome::LeftRunning {
                entry: item.entry,
                reason,
            },
            Ok(Stop::Requested) => {
                info!(entry = %item.entry, "stop requested for a running borrowed prompt");
                if self.ended_within_window(id).await {
                    CancelOutcome::Stopped(item.entry)
                } else {
                    // RECL-29: its tracker releases it when the history shows the end.
                    CancelOutcome::Requested(item.entry)
                }
            }
            Err(reason) => CancelOutcome::Failed {
                entry: item.entry,
                reason: format!("stopping the running prompt failed: {reason}"),
            },
        }
    }
}

/// Every claimed item failed for the same `reason` (RECL-21: the reservations stay).
fn all_failed(ours: &[(&CancelItem, String)], reason: &str) -> Vec<CancelOutcome> {
    ours.iter()
        .map(|(item, _)| CancelOutcome::Failed {
            entry: item.entry,
            reason: reason.to_owned(),
        })
        .collect()
}

#[async_trait]
impl<R: PromptReads + std::fmt::Debug> Reclaimer for ComfyReclaimer<R> {
    /// A held prompt a stop was requested for, whose history did not show
    /// its end within RECL-28's window: its history is read on, every
    /// `history_every`, up to `within` (RECL-29 for work no tracker follows).
    async fn ended_after_stop(&self, upstream_ref: &str, within: Duration) -> bool {
        self.ended_within(upstream_ref, within).await
    }

    async fn cancel(&self, items: &[CancelItem], _deadline: Instant) -> Vec<CancelOutcome> {
        let mut outcomes = Vec::with_capacity(items.len());
        let mut ours: Vec<(&CancelItem, String)> = Vec::new();
        for item in items {
            let Some(id) = item.upstream_ref.clone() else {
                // RECL-23: the submission recorder cancels it when its reply is recorded.
                continue;
            };
            if item.claim.try_claim() {
                ours.push((item, id));
            } else {
                outcomes.push(CancelOutcome::ClaimedElsewhere(item.entry));
            }
        }
        if ours.is_empty() {
            return outcomes;
        }
        // What the queue held before the delete: a prompt it showed and the
        // delete removed never runs (RECL-17, RECL-25).
        let before = self.listing().await.ok();
        let ids: Vec<&str> = ours.iter().map(|(_, id)| id.as_str()).collect();
        if let Err(e) = self
            .client
            .post_for_status("/queue", &json!({ "delete": ids }))
            .await
        {
            let reason = format!(
                "deleting borrowed prompts from the queue failed: {}",
                fetch_reason(&e)
            );
            warn!(error = %reason, "cancellation failed; the reservations stay (RECL-21)");
            outcomes.extend(all_failed(&ours, &reason));
            return outcomes;
        }
        let after = match self.listing().await {
            Ok(l) => l,
            Err(e) => {
                let reason = format!("the queue could not be read after the delete: {e}");
                outcomes.extend(all_failed(&ours, &reason));
                return outcomes;
            }
        };
        let running: HashSet<&str> = after.running.iter().map(String::as_str).collect();
        let pending: HashSet<&str> = after.pending.iter().map(String::as_str).collect();
        let seen_before = |id: &str| {
            before
                .as_ref()
                .is_some_and(|b| b.running.iter().chain(&b.pending).any(|x| x == id))
        };
        for (item, id) in ours {
            let outcome = if running.contains(id.as_str()) {
                self.stop_running(item, &id).await
            } else if pending.contains(id.as_str()) {
                CancelOutcome::Failed {
                    entry: item.entry,
                    reason: "the prompt is still pending after the delete".to_owned(),
                }
            } else if seen_before(&id) {
                // Deleted from the pending queue, or ended between the reads.
                CancelOutcome::Stopped(item.entry)
            } else if matches!(self.reads.history(&id).await, Ok(History::Finished { .. })) {
                CancelOutcome::Stopped(item.entry)
            } else {
                // Absence alone proves nothing here (RECL-25, COMFY-24): tracking decides.
                CancelOutcome::Requested(item.entry)
            };
            outcomes.push(outcome);
        }
        outcomes
    }

    async fn unload(&self) -> Result<UnloadAck, ReclaimError> {
        match self
            .client
            .post_for_status(
                "/free",
                &json!({"unload_models": true, "free_memory": true}),
            )
            .await
        {
            Ok(_) => Ok(UnloadAck::Acknowledged { models: None }),
            Err(FetchError::Unreachable(why)) => Err(ReclaimError::Unreachable(why)),
            Err(e) => Err(ReclaimError::Rejected(e.to_string())),
        }
    }

    async fn foreign_work(&self, own: &[String]) -> Result<ForeignWork, ReclaimError> {
        let own: HashSet<String> = own.iter().cloned().collect();
        let limits = self.limits.with_max_bytes(self.times.unload_check_bytes);
        match stream::get_scanned(
            &self.client,
            "/queue",
            &limits,
            QueueScan::new(stream::FirstForeign::new(own)),
        )
        .await
        {
            Ok(Some(_)) => Ok(ForeignWork::Present),
            Ok(None) => Ok(ForeignWork::None),
            Err(e) => Ok(ForeignWork::CannotTell(format!(
                "the queue could not be read within 16 MiB and its time limits: {e}"
            ))),
        }
    }
}
