//! Adapters for the upstreams vacancy lends: llama.cpp's `llama-server`
//! ([`llamacpp`]), Ollama ([`ollama`]), ComfyUI ([`comfyui`]),
//! OpenAI-compatible servers ([`openai`]) and compatible voice servers
//! ([`chatterbox`]).
//!
//! Each adapter is data plus code: a route table declared once as a constant
//! and checked for overlaps when the adapter is built, request inspection
//! built from the shared checks in [`common`], and, where the upstream can be
//! observed, an observation made with vacancy's own credential only.
//!
//! Every adapter is a folder: `mod.rs` (the adapter and its route table),
//! and `inspect.rs`, `observe.rs`, `reclaim.rs` and `tests.rs` where it has
//! more to say than the shared parts (OpenAI-compatible has none of them). What several share is in [`common`] (settings, [`common::AdapterCore`],
//! the body rules, the OpenAI `/v1` route block) and [`json_stream`] (the
//! streaming JSON scanner); `docs/adapter-guide.md` describes the shape.
#![forbid(unsafe_code)]

pub mod builtin;
pub mod chatterbox;
pub mod comfyui;
pub mod common;
pub mod json_stream;
pub mod llamacpp;
pub mod ollama;
pub mod openai;

pub use chatterbox::ChatterboxAdapter;
pub use common::{AdapterSettings, FetchError, ObservationClient};
pub use llamacpp::LlamaCppAdapter;
pub use ollama::OllamaAdapter;
pub use openai::OpenAiAdapter;
