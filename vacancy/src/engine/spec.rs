//! What the engine is built from: resources and upstreams with their budgets.
//!
//! A `Config` (feature `config`) converts into an [`EngineSpec`]; library
//! users may also build one directly.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::engine::ResourceKind;
use crate::engine::reclaim::{OwnerScope, ReclaimPolicy};
use crate::engine::terms::HeatLimits;

/// One resource the engine lends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceSpec {
    /// Its unique name.
    pub name: String,
    /// What kind of resource it is.
    pub kind: ResourceKind,
    /// The floor no job touches (MEM-01), in MiB.
    pub reserve_mib: u64,
    /// The resource switch at start.
    pub enabled: bool,
    /// Samples older than this count as capacity unknown.
    pub max_sample_age: Duration,
    /// For a CPU resource: refuse new work while busier than this, in percent.
    pub busy_max_pct: u8,
    /// A GPU's heat and power limits (issue 35); `None`: none.
    pub heat: Option<HeatLimits>,
}

impl ResourceSpec {
    /// A memory or GPU resource with the usual defaults (enabled, 5 s sample age).
    pub fn new(name: &str, kind: ResourceKind, reserve_mib: u64) -> Self {
        ResourceSpec {
            name: name.to_owned(),
            kind,
            reserve_mib,
            enabled: true,
            max_sample_age: Duration::from_secs(5),
            busy_max_pct: 90,
            heat: None,
        }
    }
}

/// A per-model budget (`[upstream.models]`); `None` falls back to the upstream's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModelBudget {
    /// Requirement on the primary resource for a cold load.
    pub min_free_mib: Option<u64>,
    /// Requirement on each budgeted resource when the model is proven resident.
    pub resident_min_free_mib: Option<u64>,
}

/// One upstream: the resources its work reserves and what it is charged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamSpec {
    /// Its unique name.
    pub name: String,
    /// The primary resource.
    pub resource: String,
    /// Further resources reserved with the primary one (ADM-03).
    pub also_requires: Vec<String>,
    /// `host` (owner presence refuses) or `resource` (exempt, SCOPE-02).
    pub owner_scope: OwnerScope,
    /// Requirement on the primary resource for a model not listed in `models`.
    pub default_min_free_mib: u64,
    /// Requirement when the model is proven resident (RES-01), unless the model overrides it.
    pub resident_min_free_mib: u64,
    /// Per-model budgets by exact request name (MEM-06).
    pub models: BTreeMap<String, ModelBudget>,
    /// Per-resource requirements on `also_requires` resources (MEM-04).
    pub requirements: BTreeMap<String, u64>,
    /// What happens to its accepted work when the owner returns or pressure refuses.
    pub reclaim: ReclaimPolicy,
    /// Its wait line; `None`: off, a busy resource refuses at once (issue 22).
    pub queue: Option<super::QueueSpec>,
}

impl UpstreamSpec {
    /// A host-scoped upstream on one resource with a default requirement.
    pub fn new(name: &str, resource: &str, default_min_free_mib: u64) -> Self {
        UpstreamSpec {
            name: name.to_owned(),
            resource: resource.to_owned(),
            also_requires: Vec::new(),
            owner_scope: OwnerScope::Host,
            default_min_free_mib,
            resident_min_free_mib: 0,
            models: BTreeMap::new(),
            requirements: BTreeMap::new(),
            reclaim: ReclaimPolicy::default(),
            queue: None,
        }
    }
}

/// Everything the engine needs to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineSpec {
    /// The lending switch at start.
    pub lending: bool,
    /// The resources.
    pub resources: Vec<ResourceSpec>,
    /// The upstreams.
    pub upstreams: Vec<UpstreamSpec>,
}

/// A spec the engine cannot run: the configuration validator reports these
/// earlier with line numbers; this guards library users who build specs by hand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// Two resources share a name.
    #[error("resource {0:?} is defined twice; give each [[resource]] a unique name")]
    DuplicateResource(String),
    /// Two upstreams share a name.
    #[error("upstream {0:?} is defined twice; give each [[upstream]] a unique name")]
    DuplicateUpstream(String),
    /// An upstream names a resource that does not exist.
    #[error(
        "upstream {upstream:?} needs resource {resource:?}, which is not defined; add a [[resource]] with that name"
    )]
    UnknownResource {
        /// The upstream.
        upstream: String,
        /// The missing resource.
        resource: String,
    },
    /// An upstream lists a resource twice among its dependencies.
    #[error(
        "upstream {upstream:?} lists resource {resource:?} twice; a job reserves each resource once"
    )]
    RepeatedResource {
        /// The upstream.
        upstream: String,
        /// The repeated resource.
        resource: String,
    },
    /// A per-resource requirement names a resource that is not an `also_requires` dependency.
    #[error(
        "upstream {upstream:?} has a requirement on {resource:?}, which is not in its also_requires; the primary resource's requirement is default_min_free_mib"
    )]
    RequirementNotDependency {
        /// The upstream.
        upstream: String,
        /// The resource.
        resource: String,
    },
}
