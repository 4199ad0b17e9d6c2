//! Inputs about the world that the engine decides with: owner presence, GPU
//! pressure verdicts and model observations.

use crate::time::Moment;

/// What the presence backend says about the machine's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OwnerPresence {
    /// The owner is at the machine: host-scoped work is refused (OWN-01).
    Present,
    /// The owner is away.
    Away,
    /// No trustworthy answer (incomplete session evidence): refuses like
    /// `Present` (OWN-01). The engine starts here until the shell says otherwise.
    #[default]
    Unknown,
}

impl OwnerPresence {
    /// The lowercase name used in status.
    pub fn as_str(self) -> &'static str {
        match self {
            OwnerPresence::Present => "present",
            OwnerPresence::Away => "away",
            OwnerPresence::Unknown => "unknown",
        }
    }
}

/// The admission side of GPU pressure for one resource, decided by the pressure
/// tracker (a shell) and given to the engine as an input.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PressureVerdict {
    /// Pressure allows new work (also: pressure disabled, SCOPE-09).
    #[default]
    Admits,
    /// Pressure refuses new work: engaged, uncalibrated or unavailable, with why.
    Refuses(String),
}

/// Whether the upstream's own evidence proves a loaded model will be reused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResidencyEvidence {
    /// The adapter's evidence holds for any request (e.g. llama.cpp: an idle slot, RES-16).
    Proven,
    /// The evidence holds only for requests of these kinds
    /// ([`RequestReuse::ReusesAs`](crate::engine::RequestReuse::ReusesAs)), e.g. the
    /// Ollama request kinds known to reuse the loaded context (RES-05).
    ProvenFor {
        /// The kinds credited.
        kinds: Vec<String>,
        /// Why a request of any other kind is not (RES-21).
        otherwise: String,
    },
    /// It does not, with the reason shown in refusals (RES-21).
    NotProven(String),
}

/// One model the upstream reports as loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedModel {
    /// The model's name exactly as requests name it.
    pub name: String,
    /// Loaded and ready to serve (not still loading).
    pub ready: bool,
    /// The adapter's residency evidence for this model.
    pub evidence: ResidencyEvidence,
    /// The loaded weights' digest, where the upstream reports one (Ollama).
    pub digest: Option<String>,
    /// The context the model is loaded with, in tokens, where reported (Ollama).
    pub context_length: Option<u64>,
}

impl ObservedModel {
    /// A ready model with `evidence` and nothing else reported.
    pub fn new(name: impl Into<String>, evidence: ResidencyEvidence) -> Self {
        ObservedModel {
            name: name.into(),
            ready: true,
            evidence,
            digest: None,
            context_length: None,
        }
    }
}

/// A request of a known kind finished, and no other work was admitted on the
/// upstream's resources since: the first observation taken after
/// `finished_at` shows what that kind leaves loaded (RES-07). Given to the
/// adapter by [`Engine::take_lesson`](crate::engine::Engine::take_lesson).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lesson {
    /// The model identity of the finished request.
    pub model: String,
    /// Its kind ([`RequestReuse::ReusesAs`](crate::engine::RequestReuse::ReusesAs)).
    pub kind: String,
    /// When it was released.
    pub finished_at: Moment,
}

/// Jobs an upstream shows running or queued (ADM-09): llama.cpp's processing
/// slots, ComfyUI's queue, a voice server's busy flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisibleWork {
    /// How many jobs, vacancy's own included.
    pub jobs: u32,
    /// What was seen, for refusals and the log: never prompt contents.
    pub description: String,
}

impl VisibleWork {
    /// `jobs` jobs, described as `description`.
    pub fn new(jobs: u32, description: impl Into<String>) -> Self {
        VisibleWork {
            jobs,
            description: description.into(),
        }
    }
}

/// What an adapter saw when it observed its upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelObservation {
    /// When the observation started.
    pub taken_at: Moment,
    /// The loaded models.
    pub models: Vec<ObservedModel>,
    /// The work the upstream shows running or queued, vacancy's own included
    /// (ADM-09); `None` when none is visible or the upstream cannot tell. The
    /// engine subtracts its own jobs: only work beyond them is foreign.
    pub visible_work: Option<VisibleWork>,
    /// Memory the upstream's own allocator holds but does not use, in MiB
    /// (ComfyUI's `torch_vram_free`): the upstream reuses it for the next job,
    /// so on a route with one GPU it counts as free (RES-17). `None` when the
    /// upstream reports none.
    pub allocator_free_mib: Option<u64>,
}

impl ModelObservation {
    /// An observation of an upstream with nothing loaded and nothing running.
    pub fn empty(taken_at: Moment) -> Self {
        ModelObservation {
            taken_at,
            models: Vec::new(),
            visible_work: None,
            allocator_free_mib: None,
        }
    }

    /// The observed model named `name`, if loaded.
    pub fn model(&self, name: &str) -> Option<&ObservedModel> {
        self.models.iter().find(|m| m.name == name)
    }
}
