//! The four public traits: [`Resource`], [`Admission`], [`Reclaimer`], [`Adapter`]
//! (with its optional [`Tracker`]), and the data they speak in.

pub mod adapter;
pub mod admission;
pub mod reclaimer;
pub mod resource;
pub mod routes;
pub mod tracker;

pub use adapter::{
    Adapter, InspectContext, InspectError, InspectResult, Inspection, ObserveError, Reconsidered,
    RenderedRefusal, render_ollama, render_openai, rendered,
};
pub use admission::Admission;
pub use reclaimer::{
    CancelClaim, CancelItem, CancelOutcome, ForeignWork, ReclaimError, Reclaimer, UnloadAck,
};
pub use resource::{CapacitySample, Resource, ResourceKind, SampleError};
pub use routes::{
    ParamCheck, RouteClass, RouteMethod, RoutePolicy, RouteSpec, RouteTable, WorkRoute,
    route_policy,
};
pub use tracker::{Submission, TrackedEnd, TrackedWork, Tracker, TrackingEvents};
