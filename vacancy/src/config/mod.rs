//! Configuration: the TOML schema and its validation.
//!
//! A configuration is parsed, then validated, and every problem is reported at
//! once, each with its key path and line ([`ConfigErrors`]). The schema is a
//! contract: keys may be added, never renamed; `docs/config.md` documents every key.
//!
//! ```
//! use vacancy::config::Config;
//!
//! let loaded = Config::parse(
//!     r#"
//!     [[resource]]
//!     name = "ram"
//!     reserve_mib = 4096
//!
//!     [[upstream]]
//!     name = "llamacpp"
//!     adapter = "llamacpp"
//!     listen = "127.0.0.1:8081"
//!     target = "http://127.0.0.1:8080"
//!     resource = "ram"
//!     "#,
//!     "example.toml",
//! )?;
//! assert_eq!(loaded.config.upstreams[0].resource, "ram");
//!
//! let err = Config::parse("[server]\nlisten = 7480\nlisen = 1\n", "bad.toml").unwrap_err();
//! assert_eq!(err.errors.len(), 2);
//! # Ok::<(), vacancy::config::ConfigErrors>(())
//! ```

mod borrowers;
mod edit;
mod engine_spec;
mod error;
mod hosts;
mod kinds;
mod parse;
mod schema;
mod validate;

#[cfg(test)]
mod tests;

use std::path::Path;

pub use borrowers::{keys_file_with, keys_file_without};
pub use edit::{ModelEdit, ResourceEdit, SettingsEdit, UpstreamEdit, pending_keys};
pub use error::{ConfigError, ConfigErrors, ConfigWarning};
#[cfg(feature = "runtime")]
pub(crate) use hosts::parse_target;
pub use hosts::{LOOPBACK, normalize_host, same_server_key};
pub use kinds::{AdapterKinds, SettingProblem};
pub use schema::{
    AdapterKind, BorrowerEntry, BorrowersConfig, BudgetEntry, Config, CredentialConfig,
    DEFAULT_STOP_PROOF_TIMEOUT_S, GpuPressureConfig, KeysFile, LendingConfig,
    MAX_STOP_PROOF_TIMEOUT_S, Management, ModelRequirement, OnBattery, OnBorrowerDisconnect,
    OnOwnerReturn, OwnerConfig, OwnerScope, PresenceMode, QueueConfig, ResourceConfig,
    ResourceRequirement, SamplerKind, Scope, ServerConfig, TokenConfig, UpstreamConfig,
    VoiceRoutesConfig,
};
pub use validate::EXAMPLE_TOKEN_PLACEHOLDER;

/// The configuration `vacancyd run` uses when no `--config` is given: system
/// memory as the one resource, a local llama-server lent on 127.0.0.1:8081 and
/// a local Ollama lent on 127.0.0.1:11435 (docs/config.md#the-embedded-default).
pub const EMBEDDED_DEFAULT: &str = r#"# vacancyd's built-in configuration, used when no --config is given.

[server]
listen = "127.0.0.1:7480"

[owner]
# "auto": logind on a machine with login seats (a desktop whose owner may sit
# at it), else "none" (a dedicated machine: the owner is never present).
presence = "auto"

[[resource]]
name = "ram"
kind = "memory"
sampler = "system"
reserve_mib = 4096

[[upstream]]
name = "llamacpp"
adapter = "llamacpp"
listen = "127.0.0.1:8081"
target = "http://127.0.0.1:8080"
resource = "ram"
default_min_free_mib = 2048

[[upstream]]
name = "ollama"
adapter = "ollama"
listen = "127.0.0.1:11435"
target = "http://127.0.0.1:11434"
resource = "ram"
default_min_free_mib = 4096
"#;

/// The error for a file that is not UTF-8: where its first invalid byte is.
fn not_utf8(origin: &str, bytes: &[u8], e: std::str::Utf8Error) -> ConfigErrors {
    let offset = e.valid_up_to();
    let before = bytes.get(..offset).unwrap_or_default();
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let byte = bytes
        .get(offset)
        .map(|b| format!(" (0x{b:02x})"))
        .unwrap_or_default();
    ConfigErrors {
        origin: origin.to_owned(),
        errors: vec![ConfigError {
            path: String::new(),
            line: Some(line),
            message: format!(
                "the configuration file is not UTF-8 text: the byte at offset {offset}{byte} is not valid UTF-8; save the file as UTF-8"
            ),
        }],
    }
}

/// What a configuration is read for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// `vacancyd`: listeners, targets and samplers are needed.
    Daemon,
    /// A program embedding the engine: they are optional.
    Engine,
}

/// The origin named in errors about [`EMBEDDED_DEFAULT`].
pub const EMBEDDED_ORIGIN: &str = "<embedded default>";

/// A configuration that passed validation, with the warnings it raised.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedConfig {
    /// The typed configuration.
    pub config: Config,
    /// Valid but noteworthy things, ordered by line: keys with no effect,
    /// sample ages shorter than the poll interval and what nothing watches for
    /// the owner-exempt upstreams (SCOPE-19). Which upstreams are exempt is
    /// [`Config::exemption_line`] (SCOPE-18).
    pub warnings: Vec<ConfigWarning>,
}

impl Config {
    /// Parse and validate a configuration text. `origin` names it in errors
    /// (a file path, `<stdin>`, ...).
    ///
    /// # Errors
    ///
    /// Every syntax error; or else every ill-typed value and bad enum value,
    /// with every unknown key; or else every unknown key together with every
    /// semantic problem. Each has its key path and line.
    ///
    /// Any well-formed adapter kind passes here; [`Config::parse_with`] checks
    /// the kinds against a registry, as the daemon does.
    pub fn parse(text: &str, origin: &str) -> Result<LoadedConfig, ConfigErrors> {
        Self::parse_checked(text, origin, None, Purpose::Daemon)
    }

    /// As [`Config::parse`], for a program embedding the engine (Python's
    /// `Config.for_engine`): an upstream's `listen` and `target` are not
    /// required (nothing listens or forwards), and a resource without a
    /// `sampler` is [`SamplerKind::Manual`], fed by the program. What is given
    /// is checked as the daemon checks it.
    ///
    /// # Errors
    ///
    /// As [`Config::parse`].
    pub fn parse_for_engine(text: &str, origin: &str) -> Result<LoadedConfig, ConfigErrors> {
        Self::parse_checked(text, origin, None, Purpose::Engine)
    }

    /// As [`Config::parse`], and every `adapter` must be one of `kinds`, with
    /// its `[upstream.adapter_settings]` as that kind checks them. An unknown
    /// kind is reported with its key and line and the registered names.
    ///
    /// # Errors
    ///
    /// As [`Config::parse`], with the kinds' problems among the semantic ones.
    pub fn parse_with(
        text: &str,
        origin: &str,
        kinds: &dyn AdapterKinds,
    ) -> Result<LoadedConfig, ConfigErrors> {
        Self::parse_checked(text, origin, Some(kinds), Purpose::Daemon)
    }

    fn parse_checked(
        text: &str,
        origin: &str,
        kinds: Option<&dyn AdapterKinds>,
        purpose: Purpose,
    ) -> Result<LoadedConfig, ConfigErrors> {
        let mut parsed = parse::parse(text).map_err(|errors| ConfigErrors {
            origin: origin.to_owned(),
            errors,
        })?;
        if purpose == Purpose::Engine {
            for (i, r) in parsed.config.resources.iter_mut().enumerate() {
                let key = parse::KeyPath::root()
                    .key("resource")
                    .elem(i, Some(&r.name))
                    .key("sampler");
                if !parsed.index.has(&key) {
                    r.sampler = SamplerKind::Manual;
                }
            }
        }
        let (mut errors, warnings) =
            validate::validate(&parsed.config, &parsed.index, kinds, purpose);
        errors.extend(parsed.unknown_keys);
        parse::sort_by_line(&mut errors);
        if errors.is_empty() {
            Ok(LoadedConfig {
                config: parsed.config,
                warnings,
            })
        } else {
            Err(ConfigErrors {
                origin: origin.to_owned(),
                errors,
            })
        }
    }

    /// Read, parse and validate the configuration file at `path`.
    ///
    /// # Errors
    ///
    /// As [`Config::parse`], with the path as origin; a file that cannot be read
    /// gives one error naming the OS error, and one that is not UTF-8 one error
    /// naming the byte offset and line of the first byte that is not.
    pub fn load(path: &Path) -> Result<LoadedConfig, ConfigErrors> {
        Self::load_checked(path, None, Purpose::Daemon)
    }

    /// As [`Config::load`], for a program embedding the engine, as
    /// [`Config::parse_for_engine`].
    ///
    /// # Errors
    ///
    /// As [`Config::load`].
    pub fn load_for_engine(path: &Path) -> Result<LoadedConfig, ConfigErrors> {
        Self::load_checked(path, None, Purpose::Engine)
    }

    /// As [`Config::load`], checking the adapter kinds as [`Config::parse_with`].
    ///
    /// # Errors
    ///
    /// As [`Config::load`] and [`Config::parse_with`].
    pub fn load_with(path: &Path, kinds: &dyn AdapterKinds) -> Result<LoadedConfig, ConfigErrors> {
        Self::load_checked(path, Some(kinds), Purpose::Daemon)
    }

    fn load_checked(
        path: &Path,
        kinds: Option<&dyn AdapterKinds>,
        purpose: Purpose,
    ) -> Result<LoadedConfig, ConfigErrors> {
        let origin = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| {
            ConfigErrors::whole(&origin, format!("cannot read the configuration file: {e}"))
        })?;
        let text = String::from_utf8(bytes)
            .map_err(|e| not_utf8(&origin, e.as_bytes(), e.utf8_error()))?;
        Config::parse_checked(&text, &origin, kinds, purpose)
    }

    /// The parsed [`EMBEDDED_DEFAULT`].
    ///
    /// # Errors
    ///
    /// None in practice: a test keeps the embedded text valid.
    pub fn embedded_default() -> Result<LoadedConfig, ConfigErrors> {
        Config::parse(EMBEDDED_DEFAULT, EMBEDDED_ORIGIN)
    }
}
