//! What the control listener serves from: the lender, the upstreams' static
//! facts and health, the tokens and the settings; and the `/status` document
//! built from them (the console reads the same state).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use serde::Serialize;
use vacancy::auth::Tokens;
use vacancy::engine::{
    OwnerVetoStatus, ReclaimStatus, ResourceStatus, Sign, TermStatus, Vacancy, WorkStatus,
};
use vacancy::presence::ManualPresence;
use vacancy::shell::Lender;
use vacancy::shell::loops::observation::HealthCell;
use vacancy::shell::state::history::ReclaimLogEntry;
use vacancy::shell::state::metrics::ScrapeFacts;

use crate::settings::{Settings, SettingsStatus};

/// Static facts about one upstream plus its live health.
pub struct UpstreamInfo {
    /// Adapter name.
    pub adapter: String,
    /// Where borrowers connect.
    pub listen: String,
    /// The real server.
    pub target: String,
    /// Live health from the observation loop.
    pub health: Arc<HealthCell>,
}

/// What the control listener serves from.
pub struct ControlState {
    /// The admission shell.
    pub lender: Arc<Lender>,
    /// The upstreams, in configuration order.
    pub upstreams: Vec<UpstreamInfo>,
    /// The presence backend's name.
    pub presence_backend: String,
    /// The switch of `presence = "manual"`, when configured.
    pub manual: Option<ManualPresence>,
    /// The control-plane tokens.
    pub tokens: Tokens,
    /// True once every listener is bound and the ledger is loaded.
    pub ready: AtomicBool,
    /// The configuration file and what a restart would change (shared with
    /// the blocking task that saves it).
    pub settings: Arc<Settings>,
    /// The GPUs whose pressure is measured, for `/metrics`.
    pub pressure_gpus: Vec<String>,
    /// Console event streams open now (bounded by [`MAX_EVENT_STREAMS`]).
    pub event_streams: std::sync::atomic::AtomicUsize,
    /// The names the control listener answers to (DNS-rebinding defence).
    pub hosts: vacancy::shell::proxy::host::HostNames,
    /// Refused tokens, per peer: counted, logged and slowed.
    pub failures: super::failures::AuthFailures,
    /// The owner's record of borrowers' use (issue 34), with named borrowers on.
    pub usage_db: Option<std::path::PathBuf>,
}

/// `/status` (docs/operator-guide.md#see-what-it-is-doing).
#[derive(Debug, Serialize)]
pub struct StatusDoc {
    /// The lending switch.
    pub lending: bool,
    /// present | away | unknown.
    pub owner: &'static str,
    /// Which presence backend answers.
    pub presence_backend: String,
    /// The owner veto.
    pub owner_veto: OwnerVetoStatus,
    /// The sign and its words, which the console and the tray show as they
    /// are (SCOPE-16, SCOPE-17).
    pub sign: Sign,
    /// Resources.
    pub resources: Vec<ResourceStatus>,
    /// Upstreams.
    pub upstreams: Vec<UpstreamDoc>,
    /// Work entries.
    pub work: Vec<WorkStatus>,
    /// Reclaims under way (drain, cancel or finish after an owner return or pressure).
    pub reclaims: Vec<ReclaimStatus>,
    /// The recent reclaims, newest first: trigger, mode, what was cancelled
    /// or unloaded, stand-downs (a bounded log kept by the daemon).
    pub reclaim_log: Vec<ReclaimLogEntry>,
    /// Saved settings that differ from the running ones (SCOPE-03).
    pub settings: SettingsStatus,
    /// The GPUs whose pressure is measured (`[owner.gpu_pressure]` enabled).
    pub gpu_pressure: Vec<String>,
    /// The owner's terms in force beyond presence (lending hours, the
    /// battery, GPU heat and power limits) and which refuse now (issue 35).
    pub terms: Vec<TermStatus>,
    /// Named borrowers (issue 34): who runs and waits now, their use since
    /// the start and their budgets; absent with borrowers off.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub borrowers: Vec<vacancy::engine::BorrowerStatus>,
}

/// One upstream in `/status`.
#[derive(Debug, Serialize)]
pub struct UpstreamDoc {
    /// Name.
    pub name: String,
    /// Adapter.
    pub adapter: String,
    /// host | resource.
    pub owner_scope: &'static str,
    /// Where borrowers connect.
    pub listen: String,
    /// The real server.
    pub target: String,
    /// Resources, primary first.
    pub resources: Vec<String>,
    /// Whether the real server answered the last check.
    pub reachable: Option<bool>,
    /// Why the last check failed.
    pub error: Option<String>,
    /// Whether the default budget would be admitted now.
    pub vacancy: Vacancy,
    /// Residency evidence of the last observation (RES-22).
    pub residency: Vec<String>,
    /// Loaded models of the last observation.
    pub models: Vec<String>,
    /// Its wait line (`[upstream.queue]`): requests waiting and the oldest
    /// one's wait, in seconds.
    pub line: vacancy::engine::LineStatus,
}

impl ControlState {
    /// The `/status` document now.
    pub fn status(&self) -> StatusDoc {
        let s = self.lender.status();
        let sign = vacancy::engine::sign(&s);
        let upstreams = s
            .upstreams
            .into_iter()
            .zip(&self.upstreams)
            .map(|(u, info)| {
                let h = info.health.get();
                UpstreamDoc {
                    name: u.name,
                    adapter: info.adapter.clone(),
                    owner_scope: u.owner_scope,
                    listen: info.listen.clone(),
                    target: info.target.clone(),
                    resources: u.resources,
                    reachable: h.reachable,
                    error: h.error,
                    vacancy: u.vacancy,
                    residency: h.residency,
                    models: h.models,
                    line: u.line,
                }
            })
            .collect();
        let now = self.lender.clock().now();
        StatusDoc {
            reclaim_log: self.lender.history().reclaims(now),
            settings: self.settings.status(),
            gpu_pressure: self.pressure_gpus.clone(),
            lending: s.lending,
            owner: s.owner.as_str(),
            presence_backend: self.presence_backend.clone(),
            owner_veto: s.owner_veto,
            sign,
            resources: s.resources,
            upstreams,
            work: s.work,
            reclaims: s.reclaims,
            terms: s.terms,
            borrowers: s.borrowers,
        }
    }

    /// The `/metrics` page now.
    pub(crate) fn metrics(&self) -> String {
        let s = self.lender.status();
        let facts = ScrapeFacts {
            reachable: s
                .upstreams
                .iter()
                .zip(&self.upstreams)
                .map(|(u, info)| (u.name.clone(), info.health.get().reachable))
                .collect(),
            pressure_gpus: self.pressure_gpus.clone(),
        };
        self.lender.metrics().render_with(&s, &facts)
    }
}

/// Console event streams served at once; more are refused with 503.
pub const MAX_EVENT_STREAMS: usize = 32;
