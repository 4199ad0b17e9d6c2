//! The ComfyUI adapter's pieces: bounded streaming reads of its queue and history replies.
pub mod stream;
