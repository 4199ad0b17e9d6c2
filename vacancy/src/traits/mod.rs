//! The four public traits: [`Resource`](resource::Resource), `Admission`, `Reclaimer`, `Adapter`.

pub mod resource;
