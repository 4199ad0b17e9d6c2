//! The daemon as a library: `vacancyd`'s command line, configuration check and
//! daemon, run with the adapter kinds a binary registers.
//!
//! `vacancyd` itself is [`Vacancyd::with_builtin_adapters`] and nothing more; a
//! third party's binary adds its own kinds through the same door:
//!
//! ```no_run
//! use std::sync::Arc;
//! use vacancy::registry::{AdapterContext, BuildError};
//! use vacancy::traits::Adapter;
//!
//! fn my_kind(ctx: &AdapterContext<'_>) -> Result<Arc<dyn Adapter>, BuildError> {
//!     // Build the adapter for ctx.target, stamping observations with ctx.clock.
//!     # let _ = ctx;
//!     # Err(BuildError::new("not in this example"))
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     vacancy_cli::Vacancyd::with_builtin_adapters()
//!         .adapter("mykind", my_kind)
//!         .main()
//! }
//! ```
//!
//! With it, `adapter = "mykind"` in the configuration resolves to `my_kind`,
//! `check-config` checks the kind's own `[upstream.adapter_settings]`, and an
//! unknown kind is reported with the list of registered ones.

mod admin;
#[cfg(windows)]
mod admin_pipe;
#[cfg(not(windows))]
mod allocator;
mod borrower_cmd;
mod borrowers;
mod calibrate;
mod check_config;
mod cli;
mod console;
mod control;
mod control_client;
mod daemon;
mod logging;
#[cfg(windows)]
mod service;
mod settings;
mod status;
mod tray;
mod usage;

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use vacancy::registry::{AdapterFactory, AdapterRegistry};

pub use daemon::StartError;

/// Compiles and runs the examples of the adapter author's guide (here, where
/// the daemon library, the building blocks and `vacancy` are all at hand).
#[cfg(doctest)]
#[doc = include_str!("../../docs/adapter-guide.md")]
struct AdapterGuideExamples;

/// The daemon and its command line, with a set of adapter kinds.
#[derive(Debug, Clone, Default)]
pub struct Vacancyd {
    registry: AdapterRegistry,
}

impl Vacancyd {
    /// A daemon that knows no adapter kind yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A daemon with the five built-in kinds: `ollama`, `comfyui`,
    /// `llamacpp`, `openai` and `chatterbox`.
    pub fn with_builtin_adapters() -> Self {
        Vacancyd {
            registry: vacancy_adapters::builtin::registry(),
        }
    }

    /// Register `factory` as adapter kind `name` (`adapter = "name"` in the
    /// configuration); the name of a kind already registered is replaced.
    pub fn adapter(mut self, name: &str, factory: impl AdapterFactory + 'static) -> Self {
        self.registry.register(name, factory);
        self
    }

    /// The registered kinds.
    pub fn registry(&self) -> &AdapterRegistry {
        &self.registry
    }

    /// Parse the process's command line and run it (`run`, `check-config`,
    /// `status`, ...), exactly as `vacancyd` does.
    pub fn main(self) -> ExitCode {
        cli::main(Arc::new(self.registry))
    }

    /// Load the configuration at `config` (or the embedded default), serve
    /// until SIGTERM or SIGINT, then shut down gracefully.
    ///
    /// # Errors
    ///
    /// An invalid configuration, or something configured that cannot be set up.
    pub async fn run(self, config: Option<&Path>) -> Result<(), StartError> {
        daemon::run(config, Arc::new(self.registry)).await
    }
}
