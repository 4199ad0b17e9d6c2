//! ComfyUI: borrowed prompts with vacancy-assigned IDs, tracked until their
//! history proves them finished or the queue proves they will never run.

pub mod submission;
pub mod tracker;
pub mod version;
