//! Borrowed work as the engine sees it: requests, reservations, phases and outcomes.

use std::fmt;
use std::str::FromStr;

use crate::engine::refusal::Refusal;
use crate::time::Moment;

/// The identity of one reservation (a work entry). A random UUID chosen by the
/// shell before admission, so the engine stays deterministic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryId(pub uuid::Uuid);

impl EntryId {
    /// A fresh random ID.
    pub fn random() -> Self {
        EntryId(uuid::Uuid::new_v4())
    }

    /// An ID from a number, for simulations and tests.
    pub fn from_u128(n: u128) -> Self {
        EntryId(uuid::Uuid::from_u128(n))
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for EntryId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        uuid::Uuid::parse_str(s).map(EntryId)
    }
}

/// An index into the engine's upstream table, resolved once from a name with
/// [`Engine::upstream_id`](crate::engine::Engine::upstream_id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UpstreamId(pub(crate) usize);

impl UpstreamId {
    /// Its place in configuration order, e.g. to find the upstream in a
    /// table the shell keeps beside the engine's.
    pub fn index(self) -> usize {
        self.0
    }
}

/// How the end of a job is proven, which decides what may release it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CompletionMethod {
    /// A clean end of the upstream response releases (DONE-01).
    ResponseEnd,
    /// The adapter tracks the job at the upstream after the reply (ComfyUI history).
    Tracked,
    /// Nothing proves the end: the reservation is held after the connection closes (ROUTE-10).
    HeldOnClose,
}

/// Whether the request itself would reuse a loaded model, as the adapter judges it.
///
/// The engine still checks the observation (RES-02); this is the request's half
/// of the adapter's evidence, e.g. an Ollama request with a runner option other
/// than `num_ctx` cannot reuse the loaded runner (RES-04).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RequestReuse {
    /// The request reuses the model if the observation shows it resident.
    #[default]
    Reuses,
    /// The request reuses a loaded model only where the adapter's evidence
    /// names its kind ([`ResidencyEvidence::ProvenFor`](crate::engine::ResidencyEvidence::ProvenFor)),
    /// e.g. Ollama's (canonical model, explicit `num_ctx` or none, route
    /// family), RES-06. A released request of a kind teaches the adapter what
    /// the next observation shows ([`Lesson`](crate::engine::Lesson), RES-07).
    ReusesAs(String),
    /// The request cannot reuse a loaded model, with the reason (RES-21).
    Cannot(String),
}

impl RequestReuse {
    /// The request's kind, when it has one.
    pub fn kind(&self) -> Option<&str> {
        match self {
            RequestReuse::ReusesAs(kind) => Some(kind),
            _ => None,
        }
    }
}

/// A request for borrowed work on one upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkRequest {
    /// The ID the reservation will carry.
    pub id: EntryId,
    /// Which upstream the work is for.
    pub upstream: UpstreamId,
    /// The model the request names, when it names one (MEM-06: exact match).
    pub model: Option<String>,
    /// The model as the upstream reports it, when that differs from `model`
    /// (Ollama resolves `llama3` to `llama3:latest`). Observations, residency
    /// and learned priors match this identity; configuration lookups keep
    /// `model` exact (MEM-06). `None`: the identity is `model`.
    pub canonical_model: Option<String>,
    /// When the request arrived: the ADM-06 wait is bounded from here.
    pub arrived_at: Moment,
    /// How the end of this work will be proven.
    pub completion: CompletionMethod,
    /// The request's half of the resident-model evidence.
    pub reuse: RequestReuse,
    /// The upstream's own handle for the work, when the adapter assigns one
    /// before forwarding (a ComfyUI prompt ID, COMFY-03); recorded with the reservation.
    pub upstream_ref: Option<String>,
    /// How long this request may wait in line for a reserved resource,
    /// overriding its upstream's `max_wait_s`; `None`: the upstream's line,
    /// if it has one (see the engine's `line` module).
    pub wait: Option<std::time::Duration>,
    /// Who asks, with borrowers on (issue 34): a name or a handle. `None`:
    /// an anonymous request, refused `unknown_borrower` unless the table
    /// lets anonymous requests in. Ignored with borrowers off.
    pub borrower: Option<crate::engine::who::BorrowerRef>,
    /// The class the request asks for (a `vacancy-priority` header): it
    /// may lower its borrower's class, never raise it.
    pub priority: Option<crate::engine::who::Priority>,
}

impl WorkRequest {
    /// The model identity observations and priors match: the canonical model
    /// when the adapter gave one, else the model as written.
    pub fn identity(&self) -> Option<&str> {
        self.canonical_model.as_deref().or(self.model.as_deref())
    }

    /// A request with a fresh random ID that completes at the response end.
    pub fn new(upstream: UpstreamId, model: Option<&str>, arrived_at: Moment) -> Self {
        WorkRequest {
            id: EntryId::random(),
            upstream,
            model: model.map(str::to_owned),
            canonical_model: None,
            arrived_at,
            completion: CompletionMethod::ResponseEnd,
            reuse: RequestReuse::Reuses,
            upstream_ref: None,
            wait: None,
            borrower: None,
            priority: None,
        }
    }

    /// The same request for borrower `name`.
    pub fn for_borrower(mut self, name: &str) -> Self {
        self.borrower = Some(crate::engine::who::BorrowerRef::Name(name.to_owned()));
        self
    }
}

/// What a reservation charged on one resource.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Charge {
    /// The resource.
    pub resource: String,
    /// MiB required above the reserve (0 for a dependency no requirement names).
    pub required_mib: u64,
    /// Free MiB in the sample admission decided on.
    pub free_mib: u64,
}

/// An admitted job: it holds every resource in `charges` until it is released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The entry ID.
    pub id: EntryId,
    /// The upstream's name.
    pub upstream: String,
    /// The model, when known.
    pub model: Option<String>,
    /// The primary resource first, then each `also_requires` dependency.
    pub charges: Vec<Charge>,
    /// Whether resident-model credit applied (RES-01).
    pub resident_credit: bool,
    /// When it was admitted.
    pub admitted_at: Moment,
    /// How its end is proven.
    pub completion: CompletionMethod,
    /// The upstream's own handle for the work (REC-03), when it has one.
    pub upstream_ref: Option<String>,
    /// Its borrower, with borrowers on (issue 34).
    pub borrower: Option<crate::engine::who::BorrowerTag>,
}

/// The engine's answer to a work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Admitted: forward the request (after persisting the reservation).
    Admitted(Reservation),
    /// A resource awaits its post-job capacity sample (ADM-06): ask again when a
    /// sample lands or at `until`, whichever is first.
    Wait {
        /// The latest moment to ask again; asking at or after it gets a refusal.
        until: Moment,
        /// The resources whose fresh sample is awaited.
        resources: Vec<String>,
    },
    /// Refused: answer at once with the code and reason.
    Refused(Refusal),
    /// Refused only because the upstream's model observation was too old to
    /// credit a resident model (RES-20): observe the upstream once more and
    /// ask again; if it cannot be observed, answer with this refusal.
    Reobserve(Refusal),
}

/// Where a work entry is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The request is being forwarded; the daemon owns an active operation.
    Forwarding,
    /// The reply has come; the adapter tracks the job at the upstream.
    Tracking,
    /// The response was cut (a borrower left under
    /// `on_borrower_disconnect = "cut"`, or a reclaim): the daemon checks the
    /// upstream's proof that the job stopped, within `stop_proof_timeout_s`,
    /// and the entry turns held only if none comes (DONE-04, issue 30).
    Verifying,
    /// Completion is uncertain: the entry keeps its resources until an explicit release.
    Held,
}

impl Phase {
    /// The lowercase name used in status.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Forwarding => "forwarding",
            Phase::Tracking => "tracking",
            Phase::Verifying => "verifying",
            Phase::Held => "held",
        }
    }
}

/// How a forwarding or tracking job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// Proven finished: a clean response end, or a terminal history entry.
    Completed,
    /// Nothing reached the upstream: the connection was refused or failed (DONE-02).
    NotForwarded,
    /// The end cannot be proven (DONE-03/04): the entry turns held and keeps its resources.
    Uncertain(String),
}

/// Who releases a held entry, and on what evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldRelease {
    /// An administrator confirmed the upstream stopped (`{"upstream_stopped": true}`).
    AdministratorConfirmed,
    /// The adapter's completion tracking proved the end (e.g. ComfyUI history).
    TrackingProof,
}
