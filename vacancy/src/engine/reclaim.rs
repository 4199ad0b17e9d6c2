//! Reclaim planning: what happens to accepted work when the owner comes back
//! or a GPU's pressure refuses (RECL-01..50, PRES-01/02, SCOPE-05..07).
//!
//! The engine decides *when* (deadlines, stand-downs, holds); the shell does
//! the I/O its [`ReclaimCommand`]s ask for (closing responses, cancelling at
//! the upstream, unloading) and reports back with
//! [`Engine::reclaim_done`](crate::engine::Engine::reclaim_done).

use std::fmt;
use std::time::Duration;

use crate::engine::work::{EntryId, UpstreamId};
use crate::time::Moment;

/// How long a proxied response outlives its own drain deadline when no
/// reclaim decides its fate (RECL-13).
pub const RESPONSE_CUT_GRACE: Duration = Duration::from_secs(30);

/// An upstream's reclaim options (`on_owner_return`, `drain_timeout_s`,
/// `yield_on_veto`, `completion_timeout_s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReclaimPolicy {
    /// drain | cancel | finish (RECL-01..03).
    pub on_owner_return: OnOwnerReturn,
    /// How long a drain lets accepted work run (RECL-01; default 30 s).
    pub drain_timeout: Duration,
    /// Whether models are unloaded after cancellation (RECL-30) and the
    /// reclaim holds its resources meanwhile (RECL-43).
    pub yield_on_veto: bool,
    /// How long finish mode waits before unloading (RECL-32).
    pub completion_timeout: Duration,
}

impl Default for ReclaimPolicy {
    fn default() -> Self {
        ReclaimPolicy {
            on_owner_return: OnOwnerReturn::Drain,
            drain_timeout: Duration::from_secs(30),
            yield_on_veto: false,
            completion_timeout: Duration::from_secs(3600),
        }
    }
}

/// A reclaim's handle, unique within one engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct ReclaimId(pub u64);

impl fmt::Display for ReclaimId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reclaim-{}", self.0)
    }
}

/// What started a reclaim.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
#[non_exhaustive]
pub enum ReclaimTrigger {
    /// Owner policy started refusing a host-scoped upstream (OWN-01).
    OwnerReturn {
        /// Why, as admission would say it.
        why: String,
    },
    /// A GPU's pressure started refusing (PRES-01..03).
    Pressure {
        /// The GPUs whose pressure started it.
        resources: Vec<String>,
        /// Why, as the pressure tracker said it.
        why: String,
    },
    /// The owner's lending hours closed (issue 35 item 1).
    LendingHours {
        /// Why, in words.
        why: String,
    },
    /// The machine left mains power, with `on_battery = "pause"` (issue 35 item 2).
    Battery {
        /// Why, in words.
        why: String,
    },
    /// A GPU stayed above a heat or power limit, or unread, for `hot_for_s`
    /// (issue 35 item 3).
    Heat {
        /// The GPU.
        resources: Vec<String>,
        /// `gpu_too_hot` or `gpu_power_limit`.
        code: crate::engine::RefusalCode,
        /// Why, as admission says it.
        why: String,
    },
}

impl ReclaimTrigger {
    /// One line for logs and status. A pressure reason that already names
    /// its GPUs (the tracker's do) is not prefixed with them a second time.
    pub fn describe(&self) -> String {
        match self {
            ReclaimTrigger::OwnerReturn { why } => format!("owner return: {why}"),
            ReclaimTrigger::Pressure { resources, why } => {
                let on = format!("GPU pressure on {}", resources.join(", "));
                if why.starts_with(&on) {
                    why.clone()
                } else {
                    format!("{on}: {why}")
                }
            }
            ReclaimTrigger::LendingHours { why } => format!("lending hours: {why}"),
            ReclaimTrigger::Battery { why } => format!("battery: {why}"),
            ReclaimTrigger::Heat { resources, why, .. } => {
                format!("heat and power limits of {}: {why}", resources.join(", "))
            }
        }
    }
}

/// What the shell must do, or log, for a reclaim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReclaimCommand {
    /// A reclaim began: log it; in drain mode, arm each response's own cut
    /// at `deadline` + [`RESPONSE_CUT_GRACE`] in case no decision comes (RECL-13).
    Started {
        /// The reclaim.
        id: ReclaimId,
        /// The upstream.
        upstream: UpstreamId,
        /// Its trigger.
        trigger: ReclaimTrigger,
        /// Its mode.
        mode: OnOwnerReturn,
        /// The drain deadline (drain mode only), fixed by the earliest event (RECL-14).
        deadline: Option<Moment>,
        /// The accepted work it affects.
        entries: Vec<EntryId>,
    },
    /// Go ahead: cancel `cancel` at the upstream (closing proxied responses,
    /// or the adapter's queue API), then unload when `unload`; then report
    /// [`Engine::reclaim_done`](crate::engine::Engine::reclaim_done).
    Act {
        /// The reclaim.
        id: ReclaimId,
        /// The upstream.
        upstream: UpstreamId,
        /// Work to cancel now (empty in finish mode, RECL-22).
        cancel: Vec<EntryId>,
        /// Whether to unload the upstream's models afterwards (RECL-30..32).
        unload: bool,
        /// Held work of the upstream: it keeps its reservation and never delays
        /// the unload (RECL-33); log each with its reason.
        held: Vec<(EntryId, String)>,
        /// Held work with the upstream's own handle for it (a restored or
        /// timed-out ComfyUI prompt): cancel it at the upstream too, so it
        /// cannot run on the owner's machine (REC-03). Only the upstream's
        /// proof of its stop releases it; it never delays the unload (RECL-33).
        /// Empty in finish mode (RECL-22).
        cancel_held: Vec<EntryId>,
    },
    /// The trigger cleared before anything was done (RECL-04, RECL-08).
    StoodDown {
        /// The reclaim.
        id: ReclaimId,
        /// The upstream.
        upstream: UpstreamId,
        /// Time since it began.
        elapsed: Duration,
    },
    /// The affected work ended by itself and nothing is to be unloaded.
    Finished {
        /// The reclaim.
        id: ReclaimId,
        /// The upstream.
        upstream: UpstreamId,
        /// Time since it began.
        elapsed: Duration,
    },
}

impl ReclaimCommand {
    /// The reclaim the command is about.
    pub fn id(&self) -> ReclaimId {
        match self {
            ReclaimCommand::Started { id, .. }
            | ReclaimCommand::Act { id, .. }
            | ReclaimCommand::StoodDown { id, .. }
            | ReclaimCommand::Finished { id, .. } => *id,
        }
    }
}

/// One reclaim under way, for `/status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReclaimStatus {
    /// Its handle.
    pub id: String,
    /// The upstream.
    pub upstream: String,
    /// What started it.
    pub trigger: String,
    /// drain | cancel | finish.
    pub mode: &'static str,
    /// `waiting` (drain or finish wait) or `acting` (cancelling or unloading).
    pub stage: &'static str,
    /// Milliseconds to the drain deadline, when there is one.
    pub deadline_in_ms: Option<u64>,
    /// Whether it holds its resources against new work (RECL-43).
    pub holds: bool,
}

/// The engine's record of one reclaim.
#[derive(Debug, Clone)]
pub(crate) struct ActiveReclaim {
    pub id: ReclaimId,
    pub upstream: usize,
    pub trigger: ReclaimTrigger,
    /// Resources (indices) whose pressure started it.
    pub pressured: Vec<usize>,
    pub mode: OnOwnerReturn,
    pub started_at: Moment,
    pub deadline: Option<Moment>,
    /// Cancellation or the unload has begun: it runs to completion (RECL-44).
    pub acting: bool,
    /// It holds its upstream's resources against new work (RECL-43).
    pub holds: bool,
}

impl ActiveReclaim {
    pub fn status(&self, upstream: &str, now: Moment) -> ReclaimStatus {
        ReclaimStatus {
            id: self.id.to_string(),
            upstream: upstream.to_owned(),
            trigger: self.trigger.describe(),
            mode: self.mode.as_str(),
            stage: if self.acting { "acting" } else { "waiting" },
            deadline_in_ms: self
                .deadline
                .map(|d| u64::try_from(d.since(now).as_millis()).unwrap_or(u64::MAX)),
            holds: self.holds,
        }
    }
}

use crate::engine::inputs::{OwnerPresence, PressureVerdict};
use crate::engine::work::Phase;
use crate::engine::{Effect, Engine, EngineError};

impl Engine {
    /// Whether owner policy refuses a host-scoped upstream now (OWN-01/02):
    /// the owner is present, or presence is unknown. Exempt upstreams never (SCOPE-02).
    fn owner_refuses(&self, up: usize) -> bool {
        self.upstreams[up].spec.owner_scope == OwnerScope::Host && self.owner != OwnerPresence::Away
    }

    /// The reclaim holding resource `res` against new work, if any (RECL-43, SCOPE-12).
    pub(crate) fn holding_reclaim(&self, res: usize) -> Option<&ActiveReclaim> {
        self.reclaims.iter().find(|rc| {
            rc.holds
                && self.upstreams[rc.upstream]
                    .deps
                    .iter()
                    .any(|d| d.res == res)
        })
    }

    /// Accepted work of an upstream still being forwarded or tracked: what a
    /// reclaim waits for and cancels. Held work is apart (RECL-33).
    fn live_work(&self, up: usize) -> Vec<EntryId> {
        let mut ids: Vec<(Moment, EntryId)> = self
            .entries
            .values()
            .filter(|e| e.upstream == up && e.phase != Phase::Held)
            .map(|e| (e.reservation.admitted_at, e.reservation.id))
            .collect();
        ids.sort();
        ids.into_iter().map(|(_, id)| id).collect()
    }

    fn held_work(&self, up: usize) -> Vec<(EntryId, String)> {
        let mut held: Vec<(EntryId, String)> = self
            .entries
            .values()
            .filter(|e| e.upstream == up && e.phase == Phase::Held)
            .map(|e| (e.reservation.id, e.held_reason.clone().unwrap_or_default()))
            .collect();
        held.sort_by_key(|(id, _)| *id);
        held
    }

    /// Held work of an upstream that the upstream knows by its own handle,
    /// so that it can be found and cancelled there (REC-03).
    fn held_with_handle(&self, up: usize) -> Vec<EntryId> {
        let mut ids: Vec<EntryId> = self
            .entries
            .values()
            .filter(|e| e.upstream == up && e.phase == Phase::Held)
            .filter(|e| e.reservation.upstream_ref.is_some())
            .map(|e| e.reservation.id)
            .collect();
        ids.sort();
        ids
    }

    /// Whether a reclaim's trigger has cleared, judged by the checks
    /// admission applies (RECL-04..07), the owner's terms included (issue 35).
    fn trigger_cleared(&self, rc: &ActiveReclaim, now: Moment) -> bool {
        let up = rc.upstream;
        if self.owner_refuses(up) {
            return false; // RECL-05, and for a host-scoped upstream RECL-06's owner checks
        }
        if !self.terms_clear(up, now) {
            return false;
        }
        self.upstreams[up].deps.iter().all(|d| {
            let r = &self.resources[d.res];
            if rc.pressured.contains(&d.res) {
                r.pressure_cleared // RECL-06/07
            } else {
                r.pressure == PressureVerdict::Admits
            }
        })
    }

    /// Advance reclaims at `now`: turn owner and pressure edges into
    /// reclaims, stand down those whose trigger cleared, and say which may go
    /// ahead. Call it after every input that may change presence, pressure or
    /// work, and at least every few hundred milliseconds.
    ///
    /// # Behavior
    ///
    /// - An edge starts a reclaim on each affected upstream that has accepted
    ///   work, held work it can cancel at the upstream (REC-03), or that
    ///   unloads on a veto; a reclaim already under way absorbs
    ///   later edges, so the earliest event fixes the deadline (RECL-14).
    /// - Pressure reaches only upstreams that depend on the pressured GPU
    ///   (PRES-02); while the owner veto refuses a host-scoped upstream,
    ///   pressure leaves it to the veto (SCOPE-06).
    /// - cancel goes ahead at once (RECL-02, RECL-11); drain at its deadline
    ///   (RECL-01) or as soon as the work has ended (RECL-31); finish never
    ///   cancels and unloads when the work has ended or after
    ///   `completion_timeout` (RECL-03, RECL-22, RECL-32).
    /// - A waiting reclaim whose trigger cleared stands down (RECL-04, RECL-10);
    ///   one that is acting runs to completion (RECL-44).
    // Long: one pass of every reclaim's state machine, edges first, in the order RECL-01..44 give; splitting it would hide that order.
    pub fn reclaim_step(&mut self, now: Moment) -> Vec<ReclaimCommand> {
        let mut out = Vec::new();
        // Owner edges (OWN-01): each host-scoped upstream that owner policy
        // refuses now, if presence left "away" since the last step.
        if std::mem::take(&mut self.owner_edge) {
            let why = match self.owner {
                OwnerPresence::Unknown => {
                    "owner presence cannot be determined (incomplete session evidence)"
                }
                _ => "the owner is present",
            };
            for up in 0..self.upstreams.len() {
                if self.owner_refuses(up) {
                    let trigger = ReclaimTrigger::OwnerReturn {
                        why: why.to_owned(),
                    };
                    self.start_reclaim(up, trigger, Vec::new(), now, &mut out);
                }
            }
        }
        // Pressure edges (PRES-01..03).
        let mut pressured: Vec<(usize, String)> = Vec::new();
        for (i, r) in self.resources.iter_mut().enumerate() {
            if let Some(why) = r.pressure_trigger.take() {
                pressured.push((i, why));
            }
        }
        for (res, why) in pressured {
            for up in 0..self.upstreams.len() {
                if !self.upstreams[up].deps.iter().any(|d| d.res == res) || self.owner_refuses(up) {
                    continue; // PRES-02; SCOPE-06: the veto reclaims host-scoped work
                }
                let trigger = ReclaimTrigger::Pressure {
                    resources: vec![self.resources[res].spec.name.clone()],
                    why: why.clone(),
                };
                self.start_reclaim(up, trigger, vec![res], now, &mut out);
            }
        }
        // The owner's terms (issue 35): the lending hours closed, the
        // battery, a GPU above a limit for hot_for_s.
        for (upstreams, trigger) in self.term_edges(now) {
            for up in upstreams {
                self.start_reclaim(up, trigger.clone(), Vec::new(), now, &mut out);
            }
        }
        self.last_step = now;
        // Advance waiting reclaims.
        let mut i = 0;
        while i < self.reclaims.len() {
            let rc = self.reclaims[i].clone();
            if rc.acting {
                i += 1;
                continue;
            }
            let elapsed = now.since(rc.started_at);
            if rc.mode != OnOwnerReturn::Cancel && self.trigger_cleared(&rc, now) {
                // RECL-04, RECL-08, RECL-10: nothing is cancelled or unloaded.
                self.end_reclaim(i, now);
                out.push(ReclaimCommand::StoodDown {
                    id: rc.id,
                    upstream: UpstreamId(rc.upstream),
                    elapsed,
                });
                continue;
            }
            let live = self.live_work(rc.upstream);
            let policy = self.upstreams[rc.upstream].spec.reclaim;
            let unload = policy.yield_on_veto;
            let act = match rc.mode {
                OnOwnerReturn::Cancel => Some(live),
                OnOwnerReturn::Drain if live.is_empty() => Some(Vec::new()),
                OnOwnerReturn::Drain if rc.deadline.is_some_and(|d| now >= d) => Some(live),
                OnOwnerReturn::Drain => None,
                OnOwnerReturn::Finish if live.is_empty() => Some(Vec::new()),
                OnOwnerReturn::Finish
                    if unload && now >= rc.started_at.after(policy.completion_timeout) =>
                {
                    Some(Vec::new()) // RECL-32: unload without cancelling (RECL-22)
                }
                OnOwnerReturn::Finish => None,
            };
            // REC-03: held prompts the upstream can find are cancelled with the
            // live work, never in finish mode (RECL-22).
            let cancel_held = match (&act, rc.mode) {
                (Some(_), OnOwnerReturn::Cancel | OnOwnerReturn::Drain) => {
                    self.held_with_handle(rc.upstream)
                }
                _ => Vec::new(),
            };
            match act {
                None => i += 1,
                Some(cancel) if cancel.is_empty() && cancel_held.is_empty() && !unload => {
                    // The work ended by itself; there is nothing to unload.
                    self.end_reclaim(i, now);
                    out.push(ReclaimCommand::Finished {
                        id: rc.id,
                        upstream: UpstreamId(rc.upstream),
                        elapsed,
                    });
                }
                Some(cancel) => {
                    self.reclaims[i].acting = true;
                    out.push(ReclaimCommand::Act {
                        id: rc.id,
                        upstream: UpstreamId(rc.upstream),
                        cancel,
                        unload,
                        held: self.held_work(rc.upstream),
                        cancel_held,
                    });
                    i += 1;
                }
            }
        }
        out
    }

    fn start_reclaim(
        &mut self,
        up: usize,
        trigger: ReclaimTrigger,
        pressured: Vec<usize>,
        now: Moment,
        out: &mut Vec<ReclaimCommand>,
    ) {
        if self.reclaims.iter().any(|rc| rc.upstream == up) {
            return; // RECL-14: the reclaim under way keeps its deadline
        }
        let policy = self.upstreams[up].spec.reclaim;
        let entries = self.live_work(up);
        let cancels_held = policy.on_owner_return != OnOwnerReturn::Finish
            && !self.held_with_handle(up).is_empty();
        if entries.is_empty() && !cancels_held && !policy.yield_on_veto {
            return; // nothing to wait for, cancel or unload
        }
        let id = ReclaimId(self.next_reclaim);
        self.next_reclaim += 1;
        let deadline = match policy.on_owner_return {
            OnOwnerReturn::Drain => Some(now.after(policy.drain_timeout)),
            OnOwnerReturn::Cancel | OnOwnerReturn::Finish => None,
        };
        self.reclaims.push(ActiveReclaim {
            id,
            upstream: up,
            trigger: trigger.clone(),
            pressured,
            mode: policy.on_owner_return,
            started_at: now,
            deadline,
            acting: false,
            holds: policy.yield_on_veto,
        });
        out.push(ReclaimCommand::Started {
            id,
            upstream: UpstreamId(up),
            trigger,
            mode: policy.on_owner_return,
            deadline,
            entries,
        });
    }

    /// End reclaim `i`; a reclaim that held its resources leaves them
    /// waiting for a fresh capacity sample (RECL-45, SCOPE-12).
    fn end_reclaim(&mut self, i: usize, now: Moment) {
        let rc = self.reclaims.remove(i);
        self.wake_waiters();
        if rc.holds {
            let deps: Vec<usize> = self.upstreams[rc.upstream]
                .deps
                .iter()
                .map(|d| d.res)
                .collect();
            for res in deps {
                self.resources[res].disturbed(now);
            }
        }
    }

    /// The shell finished what [`ReclaimCommand::Act`] asked: the reclaim ends
    /// and its hold with it; new work waits for a fresh sample (RECL-45).
    pub fn reclaim_done(&mut self, id: ReclaimId, now: Moment) -> Result<(), EngineError> {
        let i = self
            .reclaims
            .iter()
            .position(|rc| rc.id == id)
            .ok_or_else(|| EngineError::UnknownReclaim(id.to_string()))?;
        self.end_reclaim(i, now);
        self.effects.push(Effect::WakeReclaims);
        Ok(())
    }

    /// Every reclaim under way.
    pub fn reclaim_statuses(&self, now: Moment) -> Vec<ReclaimStatus> {
        self.reclaims
            .iter()
            .map(|rc| rc.status(&self.upstreams[rc.upstream].spec.name, now))
            .collect()
    }

    /// The earliest moment a reclaim must be stepped again by time alone (a
    /// drain deadline, a finish-mode unload, the lending hours' next change,
    /// a GPU's `hot_for_s` running out), so a shell can sleep until then.
    pub fn next_reclaim_deadline(&self) -> Option<Moment> {
        let terms = self.next_term_deadline(self.last_step);
        let reclaims = self
            .reclaims
            .iter()
            .filter(|rc| !rc.acting)
            .filter_map(|rc| match rc.mode {
                OnOwnerReturn::Drain => rc.deadline,
                OnOwnerReturn::Finish if rc.holds => Some(
                    rc.started_at
                        .after(self.upstreams[rc.upstream].spec.reclaim.completion_timeout),
                ),
                _ => None,
            })
            .min();
        match (reclaims, terms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// What happens to accepted work when the owner returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnOwnerReturn {
    /// Let it run for `drain_timeout_s`, then cancel the proxy connection.
    #[default]
    Drain,
    /// Close it at once.
    Cancel,
    /// Let it finish with no deadline.
    Finish,
}

/// Whether owner presence applies to an upstream (SCOPE-01).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OwnerScope {
    /// The owner veto refuses new work and reclaims accepted work.
    #[default]
    Host,
    /// Exempt from owner presence; still obeys switches, capacity and pressure.
    Resource,
}

names! {
    OwnerScope { Host => "host", Resource => "resource" }
}

names! {
    OnOwnerReturn { Drain => "drain", Cancel => "cancel", Finish => "finish" }
}

#[cfg(test)]
#[path = "reclaim_tests.rs"]
mod tests;
