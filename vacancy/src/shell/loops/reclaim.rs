//! The reclaim shell: steps the engine's reclaim planning and does what it
//! decides — cuts proxied responses, cancels tracked work through the
//! adapter's queue API, unloads models — then reports back (RECL-01..50).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::AbortHandle;
use tracing::{debug, info, warn};

use crate::config::{OnOwnerReturn, normalize_host};
use crate::engine::{
    EntryId, HeldRelease, RESPONSE_CUT_GRACE, ReclaimCommand, ReclaimId, ReclaimTrigger,
    RefusalCode, ReleaseOutcome, UpstreamId,
};
use crate::shell::loops::observation::{UNLOAD_SKIPPED, Yielded, unload_upstream, yield_upstream};
use crate::shell::state::lender::Lender;
use crate::shell::state::live::CutReason;
use crate::shell::state::metrics::trigger_label;
use crate::shell::state::shutdown::stopped;
use crate::shell::upstream::route::UpstreamRoute;
use crate::traits::{CancelClaim, CancelItem, CancelOutcome, Reclaimer};

/// The reclaim shell's timers; parameters so tests run fast.
#[derive(Debug, Clone, Copy)]
pub struct ReclaimTimes {
    /// How often reclaims are stepped when nothing wakes them.
    pub step_every: Duration,
    /// How long cancellation waits for submission replies under way (RECL-23).
    pub reply_wait: Duration,
    /// How long a response outlives its own drain deadline when no reclaim
    /// decides (RECL-13).
    pub cut_grace: Duration,
    /// The bound on one cancellation or unload request (RECL-27).
    pub request_bound: Duration,
}

impl Default for ReclaimTimes {
    fn default() -> Self {
        ReclaimTimes {
            step_every: Duration::from_millis(250),
            reply_wait: Duration::from_secs(2),
            cut_grace: RESPONSE_CUT_GRACE,
            request_bound: Duration::from_secs(120),
        }
    }
}

/// What the loop remembers of a reclaim between its commands.
struct Known {
    reason: CutReason,
    backstops: Vec<AbortHandle>,
}

/// Step reclaims until `shutdown`: on every wake-up (presence, pressure or
/// work changed) and at least every `times.step_every`.
// Long: the loop applies each reclaim command in order (cut, cancel, unload, stand down), one arm a command.
pub async fn reclaim_loop(
    lender: Arc<Lender>,
    routes: Vec<Arc<UpstreamRoute>>,
    times: ReclaimTimes,
    mut shutdown: watch::Receiver<bool>,
) {
    let by_id: HashMap<UpstreamId, Arc<UpstreamRoute>> =
        routes.iter().map(|r| (r.id, Arc::clone(r))).collect();
    let mut known: HashMap<ReclaimId, Known> = HashMap::new();
    loop {
        let now = lender.clock().now();
        let commands = lender.with_engine(|e| e.reclaim_step(now));
        for command in commands {
            match command {
                ReclaimCommand::Started {
                    id,
                    upstream,
                    trigger,
                    mode,
                    deadline,
                    entries,
                } => {
                    let reason = cut_reason(id, &trigger, mode);
                    lender.history().reclaim_started(
                        &id.to_string(),
                        &name_of(&lender, upstream),
                        trigger.describe(),
                        trigger_label(&trigger),
                        mode.as_str(),
                        now,
                    );
                    info!(reclaim = %id, upstream = %name_of(&lender, upstream), trigger = %trigger.describe(), mode = %mode, deadline_in_ms = deadline.map(|d| d.since(now).as_millis()), entries = entries.len(), "reclaim started");
                    let backstops = match deadline {
                        Some(d) => entries
                            .iter()
                            .map(|&entry| {
                                let at = lender.clock().instant(d) + times.cut_grace;
                                backstop(Arc::clone(&lender), id, entry, at, reason.clone())
                            })
                            .collect(),
                        None => Vec::new(),
                    };
                    known.insert(id, Known { reason, backstops });
                }
                ReclaimCommand::StoodDown {
                    id,
                    upstream,
                    elapsed,
                } => {
                    forget(&mut known, id);
                    ended(&lender, id, upstream, "stood_down");
                    info!(reclaim = %id, upstream = %name_of(&lender, upstream), elapsed_ms = elapsed.as_millis(), "reclaim abandoned; its trigger cleared");
                }
                ReclaimCommand::Finished {
                    id,
                    upstream,
                    elapsed,
                } => {
                    forget(&mut known, id);
                    ended(&lender, id, upstream, "finished");
                    info!(reclaim = %id, upstream = %name_of(&lender, upstream), elapsed_ms = elapsed.as_millis(), "reclaim finished: the affected work ended by itself");
                }
                ReclaimCommand::Act {
                    id,
                    upstream,
                    cancel,
                    unload,
                    held,
                    cancel_held,
                } => {
                    let reason = forget(&mut known, id).unwrap_or_else(|| CutReason {
                        code: RefusalCode::OwnerPresent,
                        reason: format!("{id}: the owner needs the machine"),
                    });
                    let Some(route) = by_id.get(&upstream).cloned() else {
                        warn!(reclaim = %id, "reclaim for an upstream without a listener");
                        lender.with_engine(|e| e.reclaim_done(id, now)).ok();
                        continue;
                    };
                    let same_server: Vec<Arc<UpstreamRoute>> = routes
                        .iter()
                        .filter(|r| same_server(r, &route))
                        .cloned()
                        .collect();
                    let act = Act {
                        lender: Arc::clone(&lender),
                        route,
                        same_server,
                        id,
                        reason,
                        times,
                    };
                    tokio::spawn(act.run(cancel, unload, held, cancel_held));
                }
            }
        }
        let next = lender.with_engine(|e| e.next_reclaim_deadline());
        let mut sleep = times.step_every;
        if let Some(d) = next {
            sleep = sleep.min(d.since(lender.clock().now()));
        }
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = lender.reclaim_wakeup().notified() => {}
            () = stopped(&mut shutdown) => return,
        }
    }
}

/// Record a reclaim's end in the console's log and the metrics.
fn ended(lender: &Lender, id: ReclaimId, upstream: UpstreamId, outcome: &'static str) {
    let key = id.to_string();
    lender
        .history()
        .reclaim_ended(&key, outcome, lender.clock().now());
    if let Some((trigger, mode)) = lender.history().reclaim_labels(&key) {
        lender
            .metrics()
            .reclaim_ended(&name_of(lender, upstream), trigger, mode, outcome);
    }
}

fn name_of(lender: &Lender, upstream: UpstreamId) -> String {
    lender
        .with_engine(|e| e.upstream_name(upstream).map(str::to_owned))
        .unwrap_or_default()
}

/// A response's own cut at `at` (its deadline plus the grace), should no
/// reclaim decide its fate first (RECL-13); aborted when one does.
fn backstop(
    lender: Arc<Lender>,
    id: ReclaimId,
    entry: EntryId,
    at: std::time::Instant,
    reason: CutReason,
) -> AbortHandle {
    tokio::spawn(async move {
        tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
        if lender.live().cut(entry, &reason) {
            warn!(entry = %entry, reclaim = %id, "no reclaim decided within 30 s after the response's deadline; cut it (RECL-13)");
        }
    })
    .abort_handle()
}

fn forget(known: &mut HashMap<ReclaimId, Known>, id: ReclaimId) -> Option<CutReason> {
    let k = known.remove(&id)?;
    for b in k.backstops {
        b.abort();
    }
    Some(k.reason)
}

fn cut_reason(id: ReclaimId, trigger: &ReclaimTrigger, mode: OnOwnerReturn) -> CutReason {
    let code = match trigger {
        ReclaimTrigger::OwnerReturn { .. } => RefusalCode::OwnerPresent,
        ReclaimTrigger::Pressure { .. } => RefusalCode::Pressure,
        ReclaimTrigger::LendingHours { .. } => RefusalCode::OutsideLendingHours,
        ReclaimTrigger::Battery { .. } => RefusalCode::OnBattery,
        ReclaimTrigger::Heat { code, .. } => *code,
    };
    let why = match trigger {
        ReclaimTrigger::OwnerReturn { .. } | ReclaimTrigger::Pressure { .. } => {
            "to give the machine back to its owner"
        }
        _ => "under the owner's terms",
    };
    CutReason {
        code,
        reason: format!(
            "borrowed work was cancelled {why} ({id}, {}, on_owner_return = {mode}); retry later",
            trigger.describe()
        ),
    }
}

/// Two routes whose targets reach one server (RECL-35, RECL-40).
fn same_server(a: &UpstreamRoute, b: &UpstreamRoute) -> bool {
    a.target.port == b.target.port
        && normalize_host(&a.target.host) == normalize_host(&b.target.host)
}

/// One reclaim going ahead: cancel, then unload, then report (RECL-30, RECL-44).
struct Act {
    lender: Arc<Lender>,
    route: Arc<UpstreamRoute>,
    same_server: Vec<Arc<UpstreamRoute>>,
    id: ReclaimId,
    reason: CutReason,
    times: ReclaimTimes,
}

impl Act {
    async fn run(
        self,
        cancel: Vec<EntryId>,
        unload: bool,
        held: Vec<(EntryId, String)>,
        cancel_held: Vec<EntryId>,
    ) {
        let (id, upstream) = (self.id, self.route.name.as_str());
        for (entry, why) in held.iter().filter(|(e, _)| !cancel_held.contains(e)) {
            // RECL-33: nothing finishes held work, so it never delays the unload.
            warn!(entry = %entry, reclaim = %id, upstream, reason = %why, "held work keeps its reservation through the reclaim; release it as an administrator once the upstream has stopped");
        }
        let live = self.lender.live();
        let (responses, tracked): (Vec<EntryId>, Vec<EntryId>) =
            cancel.into_iter().partition(|e| live.is_response(*e));
        for entry in &responses {
            // RECL-15: closing the proxied response is the cancellation.
            if live.cut(*entry, &self.reason) {
                info!(entry = %entry, reclaim = %id, upstream, "closing the proxied response");
                self.lender
                    .history()
                    .reclaim_closed(&id.to_string(), *entry);
                self.lender.metrics().cancelled(upstream, "closed");
            }
        }
        if !tracked.is_empty() {
            self.cancel_tracked(&tracked).await;
        }
        if !cancel_held.is_empty() {
            self.cancel_held(&cancel_held).await;
        }
        if unload {
            self.unload().await;
        }
        let now = self.lender.clock().now();
        if let Err(e) = self.lender.with_engine(|e| e.reclaim_done(id, now)) {
            warn!(reclaim = %id, error = %e, "could not end the reclaim");
        }
        ended(&self.lender, id, self.route.id, "acted");
        info!(reclaim = %id, upstream, "reclaim complete; new work waits for a fresh capacity sample");
    }

    /// Cancel tracked work through the adapter (RECL-16..29).
    async fn cancel_tracked(&self, entries: &[EntryId]) {
        let (id, upstream) = (self.id, self.route.name.as_str());
        let live = self.lender.live();
        let mut claims = Vec::with_capacity(entries.len());
        for &entry in entries {
            if let Some((claim, _)) = live.want_cancel(entry, &self.reason.reason) {
                claims.push((entry, claim));
            }
        }
        // RECL-23: wait a little for replies under way, then go on.
        let wait_until = tokio::time::Instant::now() + self.times.reply_wait;
        while live.replies_pending(entries) && tokio::time::Instant::now() < wait_until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let Some(reclaimer) = self.route.adapter.reclaimer() else {
            for (entry, _) in &claims {
                warn!(entry = %entry, reclaim = %id, upstream, "the adapter cannot cancel tracked work; the reservation stays (RECL-21)");
            }
            return;
        };
        let items: Vec<CancelItem> = claims
            .into_iter()
            .map(|(entry, claim)| {
                let upstream_ref = if live.replies_pending(&[entry]) {
                    info!(entry = %entry, reclaim = %id, upstream, "the submission reply is still under way; it is cancelled as soon as it is recorded (RECL-23)");
                    None
                } else {
                    self.lender.with_engine(|e| {
                        e.reservation(entry).and_then(|r| r.upstream_ref.clone())
                    })
                };
                CancelItem {
                    entry,
                    upstream_ref,
                    claim,
                }
            })
            .collect();
        let Some(outcomes) = self.cancel_within_bound(reclaimer.as_ref(), &items).await else {
            for item in &items {
                warn!(entry = %item.entry, reclaim = %id, upstream, "cancellation did not finish within its bound; the reservation stays (RECL-21, RECL-27)");
            }
            return;
        };
        settle(&self.lender, &id.to_string(), Some(id), upstream, outcomes);
    }

    /// Cancel held work the upstream knows by its own handle (REC-03): a
    /// restored or timed-out prompt could still run on the owner's machine.
    /// Nothing else cancels it, so each gets a claim of its own; the
    /// upstream's proof of its stop (RECL-17, RECL-18, RECL-25) releases it,
    /// anything less leaves it held for an administrator.
    async fn cancel_held(&self, entries: &[EntryId]) {
        let (id, upstream) = (self.id, self.route.name.as_str());
        let Some(reclaimer) = self.route.adapter.reclaimer() else {
            for entry in entries {
                warn!(entry = %entry, reclaim = %id, upstream, "the adapter cannot cancel held work at the upstream; it stays held (RECL-21)");
            }
            return;
        };
        let items: Vec<CancelItem> = entries
            .iter()
            .map(|&entry| CancelItem {
                entry,
                upstream_ref: self
                    .lender
                    .with_engine(|e| e.reservation(entry).and_then(|r| r.upstream_ref.clone())),
                claim: CancelClaim::new(),
            })
            .collect();
        let Some(outcomes) = self.cancel_within_bound(reclaimer.as_ref(), &items).await else {
            for item in &items {
                warn!(entry = %item.entry, reclaim = %id, upstream, "cancelling held work did not finish within its bound; it stays held (RECL-21, RECL-27)");
            }
            return;
        };
        for outcome in outcomes {
            record_cancel(&self.lender, Some(id), upstream, &outcome);
            match outcome {
                CancelOutcome::Stopped(entry) => {
                    info!(entry = %entry, reclaim = %id, upstream, "held work deleted or stopped at the upstream, which proves its end; released");
                    if let Err(e) = self
                        .lender
                        .release_held(entry, HeldRelease::TrackingProof)
                        .await
                    {
                        warn!(entry = %entry, reclaim = %id, error = %e, "could not release the held work");
                    }
                }
                CancelOutcome::Failed { entry, reason } => {
                    warn!(entry = %entry, reclaim = %id, upstream, reason = %reason, "cancelling held work failed; it stays held (RECL-21)");
                }
                CancelOutcome::LeftRunning { entry, reason } => {
                    warn!(entry = %entry, reclaim = %id, upstream, reason = %reason, "held work left running at the upstream; it stays held: release it as an administrator once the upstream has finished it");
                }
                CancelOutcome::Requested(entry) => {
                    let upstream_ref = items
                        .iter()
                        .find(|i| i.entry == entry)
                        .and_then(|i| i.upstream_ref.clone());
                    match upstream_ref {
                        Some(upstream_ref) => self.follow_stopped(&reclaimer, entry, upstream_ref),
                        None => {
                            warn!(entry = %entry, reclaim = %id, upstream, "stop requested for held work, but the upstream does not prove its end; it stays held: release it as an administrator once the upstream has stopped")
                        }
                    }
                }
                CancelOutcome::ClaimedElsewhere(entry)
                | CancelOutcome::ByClosingResponse(entry) => {
                    warn!(entry = %entry, reclaim = %id, upstream, "stop requested for held work, but the upstream does not prove its end; it stays held: release it as an administrator once the upstream has stopped");
                }
            }
        }
    }

    /// Held work a stop was requested for, whose end the upstream did not
    /// prove within RECL-28's window (the stop lands later on a loaded
    /// machine): no tracker follows held work, so its end is awaited here,
    /// in the background and up to `completion_timeout_s` (the unload does
    /// not wait, RECL-28), and its proof releases it (RECL-29, issue 30).
    fn follow_stopped(&self, reclaimer: &Arc<dyn Reclaimer>, entry: EntryId, upstream_ref: String) {
        let (id, upstream) = (self.id, self.route.name.clone());
        let within = self.route.completion_timeout;
        info!(entry = %entry, reclaim = %id, upstream = %upstream, within_s = within.as_secs(), "stop requested for held work; its end is not proven yet, so vacancyd reads on until the upstream proves it (completion_timeout_s)");
        let (reclaimer, lender) = (Arc::clone(reclaimer), Arc::clone(&self.lender));
        tokio::spawn(async move {
            if !reclaimer.ended_after_stop(&upstream_ref, within).await {
                warn!(entry = %entry, reclaim = %id, upstream = %upstream, "stop requested for held work, but the upstream did not prove its end within completion_timeout_s; it stays held: release it as an administrator once the upstream has stopped");
                return;
            }
            info!(entry = %entry, reclaim = %id, upstream = %upstream, "held work's end is proven at the upstream after its stop; released");
            if let Err(e) = lender.release_held(entry, HeldRelease::TrackingProof).await {
                warn!(entry = %entry, reclaim = %id, error = %e, "could not release the held work");
            }
        });
    }

    /// The reclaimer's cancellation of `items`, each request within the
    /// request bound (RECL-27); `None` when the whole did not end in twice that.
    async fn cancel_within_bound(
        &self,
        reclaimer: &dyn Reclaimer,
        items: &[CancelItem],
    ) -> Option<Vec<CancelOutcome>> {
        let deadline = std::time::Instant::now() + self.times.request_bound;
        tokio::time::timeout(
            self.times.request_bound * 2,
            reclaimer.cancel(items, deadline),
        )
        .await
        .ok()
    }

    /// Unload the whole server behind the upstream (RECL-30..40, RECL-47..49).
    async fn unload(&self) {
        let (id, upstream) = (self.id, self.route.name.as_str());
        let server: Vec<UpstreamId> = self.same_server.iter().map(|r| r.id).collect();
        let result = if self.lender.live().replies_pending_on(&server) {
            info!(reclaim = %id, upstream, reason = "a submission to the server still awaits its reply", "unloading without knowing whose work the upstream holds (RECL-38)");
            tokio::time::timeout(
                self.times.request_bound,
                unload_upstream(&self.lender, &self.route),
            )
            .await
        } else {
            // RECL-35: vacancy's own work is what any upstream on this server admitted.
            let names: Vec<String> = self.same_server.iter().map(|r| r.name.clone()).collect();
            let own: Vec<String> = self
                .lender
                .status()
                .work
                .into_iter()
                .filter(|w| names.contains(&w.upstream))
                .filter_map(|w| w.upstream_ref)
                .collect();
            tokio::time::timeout(
                self.times.request_bound,
                yield_upstream(&self.lender, &self.route, &own),
            )
            .await
        };
        let what = match result {
            Ok(Ok(Yielded::Unloaded(_))) => {
                info!(reclaim = %id, upstream, "models unloaded (acknowledged; fresh samples show what was freed)");
                "models unloaded (acknowledged)".to_owned()
            }
            Ok(Ok(Yielded::Skipped)) => {
                info!(reclaim = %id, upstream, "{UNLOAD_SKIPPED}");
                UNLOAD_SKIPPED.to_owned()
            }
            Ok(Err(e)) => {
                warn!(reclaim = %id, upstream, error = %e, "unload failed (RECL-47)");
                format!("unload failed: {e}")
            }
            Err(_) => {
                warn!(reclaim = %id, upstream, "unload got no answer within its bound");
                "unload got no answer within its bound".to_owned()
            }
        };
        self.lender.history().reclaim_unload(&id.to_string(), what);
    }
}

/// Act on cancellation outcomes: a proven stop releases (RECL-17), a failure
/// keeps the reservation and says why (RECL-21); everything else is left to
/// completion tracking (RECL-18, RECL-29, RECL-42).
/// `by` names who cancelled: a reclaim's id, or the submission recorder.
fn settle(
    lender: &Lender,
    by: &str,
    reclaim: Option<ReclaimId>,
    upstream: &str,
    outcomes: Vec<CancelOutcome>,
) {
    for outcome in outcomes {
        record_cancel(lender, reclaim, upstream, &outcome);
        match outcome {
            CancelOutcome::Stopped(entry) => {
                info!(entry = %entry, by, upstream, "borrowed work deleted or stopped at the upstream; released");
                lender.release(entry, ReleaseOutcome::Completed);
            }
            CancelOutcome::Requested(entry) => {
                info!(entry = %entry, by, upstream, "stop requested; completion tracking releases it when the upstream proves the end");
            }
            CancelOutcome::ClaimedElsewhere(entry) => {
                debug!(entry = %entry, by, "the other side of its claim cancels it (RECL-24)");
            }
            CancelOutcome::ByClosingResponse(entry) => {
                debug!(entry = %entry, by, "cancelled by closing its response");
            }
            CancelOutcome::Failed { entry, reason } => {
                warn!(entry = %entry, by, upstream, reason = %reason, "cancellation failed; the reservation stays (RECL-21)");
            }
            CancelOutcome::LeftRunning { entry, reason } => {
                warn!(entry = %entry, by, upstream, reason = %reason, "borrowed work left running at the upstream; the reservation stays until completion tracking proves its end (RECL-26)");
            }
        }
    }
}

/// Count one cancellation outcome and note it in its reclaim's log entry.
fn record_cancel(
    lender: &Lender,
    reclaim: Option<ReclaimId>,
    upstream: &str,
    outcome: &CancelOutcome,
) {
    let (entry, label, failed) = match outcome {
        CancelOutcome::Stopped(e) => (*e, "stopped", false),
        CancelOutcome::Requested(e) => (*e, "requested", false),
        CancelOutcome::Failed { entry, .. } => (*entry, "failed", true),
        // RECL-26: not cancelled; it stays held until its end is proven.
        CancelOutcome::LeftRunning { entry, .. } => (*entry, "left_running", true),
        CancelOutcome::ClaimedElsewhere(_) | CancelOutcome::ByClosingResponse(_) => return,
    };
    lender.metrics().cancelled(upstream, label);
    if let Some(id) = reclaim {
        let key = id.to_string();
        if failed {
            lender.history().reclaim_cancel_failed(&key, entry);
        } else {
            lender.history().reclaim_cancelled(&key, entry);
        }
    }
}

/// The submission recorder's side of RECL-23/24: a reply recorded after a
/// reclaim wanted its work cancelled cancels it now, unless the reclaim won
/// the claim first.
pub(crate) async fn cancel_late_reply(
    lender: Arc<Lender>,
    route: Arc<UpstreamRoute>,
    entry: EntryId,
    claim: crate::traits::CancelClaim,
) {
    let Some(reclaimer) = route.adapter.reclaimer() else {
        return;
    };
    let upstream_ref =
        lender.with_engine(|e| e.reservation(entry).and_then(|r| r.upstream_ref.clone()));
    let item = CancelItem {
        entry,
        upstream_ref,
        claim,
    };
    info!(entry = %entry, upstream = %route.name, "a reclaim wanted this submission cancelled; cancelling it now that its reply is recorded (RECL-23)");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let outcomes = reclaimer
        .cancel(std::slice::from_ref(&item), deadline)
        .await;
    settle(
        &lender,
        "the submission recorder",
        None,
        &route.name,
        outcomes,
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::engine::{
        Decision, Engine, EngineSpec, OwnerPresence, ReclaimPolicy, ResourceSpec, UpstreamSpec,
        WorkRequest,
    };
    use crate::ledger::store::VolatileStore;
    use crate::time::MonotonicClock;
    use crate::traits::resource::{CapacitySample, ResourceKind};

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_response_is_cut_30_s_after_its_deadline_when_no_reclaim_decides() {
        // RECL-13: the reclaim loop stops after starting the drain, so nothing
        // decides; the response's own cut fires 30 s after its deadline.
        let mut spec = UpstreamSpec::new("llm", "gpu0", 1000);
        spec.reclaim = ReclaimPolicy {
            drain_timeout: Duration::from_secs(5),
            ..ReclaimPolicy::default()
        };
        let mut engine = Engine::new(EngineSpec {
            lending: true,
            resources: vec![ResourceSpec::new("gpu0", ResourceKind::Gpu, 1000)],
            upstreams: vec![spec],
        })
        .unwrap();
        engine.set_owner(OwnerPresence::Away);
        let clock = MonotonicClock::new();
        let lender = Arc::new(Lender::new(
            engine,
            ["gpu0".to_owned()],
            clock,
            Arc::new(VolatileStore),
        ));
        let now = clock.now();
        lender.record_sample("gpu0", Ok(CapacitySample::memory(9000, 9000, now)), now);
        let up = lender.with_engine(|e| e.upstream_id("llm")).unwrap();
        let req = WorkRequest::new(up, None, now);
        let Decision::Admitted(r) = lender.with_engine(|e| e.admit(&req, now)) else {
            panic!("refused");
        };
        let cut = lender.live().register_response(r.id, up);
        let (stop, shutdown) = watch::channel(false);
        let task = tokio::spawn(reclaim_loop(
            Arc::clone(&lender),
            Vec::new(),
            ReclaimTimes::default(),
            shutdown,
        ));
        lender.with_engine(|e| e.set_owner(OwnerPresence::Present));
        lender.wake_reclaims();
        while lender.status().reclaims.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.send(true).unwrap();
        task.await.unwrap();
        tokio::time::sleep(Duration::from_secs(34)).await;
        assert!(
            crate::shell::state::live::cut_reason(&cut).is_none(),
            "not cut before deadline + 30 s"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        let reason =
            crate::shell::state::live::cut_reason(&cut).expect("cut 30 s after its deadline");
        assert_eq!(reason.code, RefusalCode::OwnerPresent);
        assert!(reason.reason.contains("reclaim-1"), "{}", reason.reason);
    }
}
