//! A snapshot of the engine for `/status`, the CLI and Python.

use serde::Serialize;

use crate::engine::inputs::OwnerPresence;
use crate::engine::reclaim::ReclaimStatus;
use crate::engine::refusal::RefusalCode;
use crate::engine::terms::{HeatReading, TermStatus};
use crate::engine::work::{CompletionMethod, Phase};

/// The whole engine at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngineStatus {
    /// The lending switch.
    pub lending: bool,
    /// What the presence backend last said.
    pub owner: OwnerPresence,
    /// The owner veto and who is exempt from it.
    pub owner_veto: OwnerVetoStatus,
    /// Every resource.
    pub resources: Vec<ResourceStatus>,
    /// Every upstream.
    pub upstreams: Vec<UpstreamStatus>,
    /// Every work entry, oldest first.
    pub work: Vec<WorkStatus>,
    /// Every reclaim under way.
    pub reclaims: Vec<ReclaimStatus>,
    /// The owner's terms in force beyond presence (issue 35): lending
    /// hours, the battery, each GPU's heat and power limits; which refuse now.
    pub terms: Vec<TermStatus>,
    /// Named borrowers (issue 34): who runs and waits now, their use and
    /// budgets. Empty, and absent from JSON, with borrowers off.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub borrowers: Vec<super::BorrowerStatus>,
}

/// The owner veto (SCOPE-13, SCOPE-14).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnerVetoStatus {
    /// Whether owner policy refuses host-scoped upstreams now.
    pub active: bool,
    /// Why, when active.
    pub reason: Option<String>,
    /// Upstreams with `owner_scope = "resource"`.
    pub exempt_upstreams: Vec<String>,
}

/// One resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResourceStatus {
    /// Its name.
    pub name: String,
    /// gpu | memory | cpu.
    pub kind: &'static str,
    /// Free MiB in the last good sample.
    pub free_mib: Option<u64>,
    /// Total MiB in the last good sample.
    pub total_mib: Option<u64>,
    /// For a CPU resource: busy percent in the last good sample.
    pub busy_pct: Option<u8>,
    /// The configured reserve.
    pub reserve_mib: u64,
    /// Age of the last good sample.
    pub sample_age_ms: Option<u64>,
    /// Why capacity is unknown, when it is.
    pub capacity_unknown: Option<String>,
    /// Whether a fresh sample after the last job is still due (ADM-04).
    pub awaiting_fresh_sample: bool,
    /// The resource switch.
    pub enabled: bool,
    /// `admits`, or the pressure refusal's reason.
    pub pressure: String,
    /// The entry holding it.
    pub reserved_by: Option<String>,
    /// A GPU with heat or power limits: its last temperature, power and fan
    /// reading (issue 35); `None` for a resource without limits.
    pub heat: Option<HeatReading>,
}

/// Whether an upstream admits a request with its default budget now (UI-01).
///
/// Three signs: `admitting` (a new request would be admitted now),
/// `queueing` (it would wait its turn in the upstream's wait line, issue 30)
/// and refusing (the code and reason it would get). Only `admitting` sets
/// [`admitting`](Self::admitting); a queueing sign carries `resource_busy`
/// as its code, the refusal a request would get without the line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Vacancy {
    /// Whether a default-budget request would be admitted now.
    pub admitting: bool,
    /// `Some(n)` when a new request would wait in the upstream's line, behind
    /// `n` requests that came earlier and need one of its resources.
    pub queueing: Option<u32>,
    /// The refusal code when not admitting.
    pub code: Option<RefusalCode>,
    /// The refusal reason when not admitting.
    pub reason: Option<String>,
}

impl Vacancy {
    /// A new request would be admitted now.
    pub fn admitting() -> Self {
        Vacancy {
            admitting: true,
            queueing: None,
            code: None,
            reason: None,
        }
    }

    /// A new request would wait in line behind `ahead` requests; `reason`
    /// says what it waits for.
    pub fn queueing(ahead: u32, reason: impl Into<String>) -> Self {
        Vacancy {
            admitting: false,
            queueing: Some(ahead),
            code: Some(RefusalCode::ResourceBusy),
            reason: Some(reason.into()),
        }
    }

    /// A new request would be refused with `code`.
    pub fn refusing(code: RefusalCode, reason: impl Into<String>) -> Self {
        Vacancy {
            admitting: false,
            queueing: None,
            code: Some(code),
            reason: Some(reason.into()),
        }
    }

    /// The sign in words: `admitting`, `queueing (N waiting)` or the code.
    pub fn sign(&self) -> String {
        match (self.admitting, self.queueing, self.code) {
            (true, _, _) => "admitting".to_owned(),
            (false, Some(n), _) => format!("queueing ({n} waiting)"),
            (false, None, Some(code)) => code.as_str().to_owned(),
            (false, None, None) => "refusing".to_owned(),
        }
    }
}

/// One upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UpstreamStatus {
    /// Its name.
    pub name: String,
    /// host | resource.
    pub owner_scope: &'static str,
    /// Its resources, primary first.
    pub resources: Vec<String>,
    /// Its vacancy for the default budget.
    pub vacancy: Vacancy,
    /// Its wait line (issue 22): empty when the line is off.
    pub line: super::LineStatus,
}

/// One work entry (HELD-01).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkStatus {
    /// The entry ID.
    pub id: String,
    /// The upstream.
    pub upstream: String,
    /// The model when known.
    pub model: Option<String>,
    /// The resources it holds.
    pub resources: Vec<String>,
    /// Seconds since admission.
    pub age_s: u64,
    /// How its end is proven.
    pub completion: CompletionMethod,
    /// forwarding | tracking | held (HELD-02).
    pub phase: Phase,
    /// Why it is held, when it is.
    pub held_reason: Option<String>,
    /// The upstream's own handle for the work (a ComfyUI prompt ID, REC-03),
    /// so an administrator can find it at the upstream before releasing it.
    pub upstream_ref: Option<String>,
    /// The borrower it is for, with borrowers on (issue 34): the owner sees
    /// whose work holds a resource.
    pub borrower: Option<String>,
}
