//! Adapter kinds by name: the door through which every adapter, built-in or
//! third-party, reaches the daemon.
//!
//! A binary registers an [`AdapterFactory`] under each kind name it can run;
//! the configuration's `adapter = "..."` picks one (checked with key and line
//! by [`Config::parse_with`](crate::config::Config::parse_with)), and the
//! daemon asks that factory for one adapter per upstream, handing it an
//! [`AdapterContext`] that carries the daemon's own clock.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::config::{AdapterKinds, SettingProblem, UpstreamConfig};
use crate::time::MonotonicClock;
use crate::traits::Adapter;

/// What the daemon hands a factory to build one upstream's adapter.
///
/// # Behavior
///
/// - `clock` is the daemon's clock. Stamp every observation's `taken_at` with
///   it: the engine compares those moments with its own (an observation older
///   than 4 s proves nothing), so an adapter with a clock of its own would see
///   stale answers as fresh or fresh ones as stale.
/// - `credential` is `[upstream.credential]`, read from its file, marked
///   sensitive: send it on your own observation requests only, never on a
///   borrower's (OBS-01, OBS-02).
/// - `state_dir` is the recovery directory, for what an adapter learns and
///   must keep across restarts (Ollama's learned contexts).
#[derive(Clone)]
pub struct AdapterContext<'a> {
    /// The upstream's whole configuration table (its name, timeouts and
    /// `[upstream.adapter_settings]`).
    pub upstream: &'a UpstreamConfig,
    /// The upstream's base URL, parsed from `target`.
    pub target: http::Uri,
    /// The header vacancy sends on its own observation requests.
    pub credential: Option<(http::HeaderName, http::HeaderValue)>,
    /// The daemon's clock.
    pub clock: MonotonicClock,
    /// The recovery directory.
    pub state_dir: &'a Path,
}

/// A credential as `Debug` output shows it: the header's name, never its
/// value (which is a secret and must not reach a log).
pub fn redacted(credential: &Option<(http::HeaderName, http::HeaderValue)>) -> Option<String> {
    credential
        .as_ref()
        .map(|(name, _)| format!("{name}: <redacted>"))
}

impl fmt::Debug for AdapterContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdapterContext")
            .field("upstream", &self.upstream.name)
            .field("target", &self.target)
            .field("credential", &redacted(&self.credential))
            .field("clock", &self.clock)
            .field("state_dir", &self.state_dir)
            .finish()
    }
}

/// Why a factory could not build an adapter; the daemon does not start.
///
/// Its message is what the operator reads; [`source`](std::error::Error::source)
/// is the error behind it, where the factory gave one ([`BuildError::because`]).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct BuildError {
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl BuildError {
    /// A build error saying `why`.
    pub fn new(why: impl fmt::Display) -> Self {
        BuildError {
            message: why.to_string(),
            source: None,
        }
    }

    /// A build error saying `message` (which should say `source`'s words:
    /// it is what the operator reads), caused by `source`.
    pub fn because(
        message: impl fmt::Display,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        BuildError {
            message: message.to_string(),
            source: Some(Box::new(source)),
        }
    }

    /// What the operator reads.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Builds the adapters of one kind.
///
/// # Behavior
///
/// - `check` sees the upstream's table when the configuration is loaded
///   (`vacancyd run` and `vacancyd check-config`) and returns every problem in
///   `[upstream.adapter_settings]`; the default accepts only an empty table.
/// - `build` is called once per upstream of this kind, after `check` passed,
///   and connects nothing: a target that cannot be reached is the
///   observations' business, never a reason not to start.
pub trait AdapterFactory: Send + Sync {
    /// Every problem in this kind's own settings of `upstream`: its
    /// `[upstream.adapter_settings]`, and the tables of [`reads_tables`](Self::reads_tables).
    fn check(&self, upstream: &UpstreamConfig) -> Vec<SettingProblem> {
        no_settings(upstream)
    }

    /// The adapter-specific `[upstream.<table>]` tables this kind reads
    /// (besides `adapter_settings`), which its [`check`](Self::check)
    /// validates: `["voice_routes"]` for the chatterbox kind. An upstream of
    /// any other kind that sets one is refused, naming the kinds that read it.
    fn reads_tables(&self) -> &'static [&'static str] {
        &[]
    }

    /// The adapter for one upstream.
    fn build(&self, ctx: &AdapterContext<'_>) -> Result<Arc<dyn Adapter>, BuildError>;
}

/// The check of a kind that takes no settings: every key is a problem.
pub fn no_settings(upstream: &UpstreamConfig) -> Vec<SettingProblem> {
    upstream
        .adapter_settings
        .keys()
        .map(|key| {
            SettingProblem::new(
                key.clone(),
                format!(
                    "adapter {:?} takes no settings; remove the key",
                    upstream.adapter.as_str()
                ),
            )
        })
        .collect()
}

/// Any `Fn(&AdapterContext) -> Result<Arc<dyn Adapter>, BuildError>` is a
/// factory for a kind without settings.
impl<F> AdapterFactory for F
where
    F: Fn(&AdapterContext<'_>) -> Result<Arc<dyn Adapter>, BuildError> + Send + Sync,
{
    fn build(&self, ctx: &AdapterContext<'_>) -> Result<Arc<dyn Adapter>, BuildError> {
        self(ctx)
    }
}

/// Adapter factories by kind name, in registration order.
#[derive(Clone, Default)]
pub struct AdapterRegistry {
    kinds: Vec<(String, Arc<dyn AdapterFactory>)>,
}

impl fmt::Debug for AdapterRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.kinds.iter().map(|(name, _)| name))
            .finish()
    }
}

impl AdapterRegistry {
    /// A registry with no kinds.
    pub fn new() -> Self {
        Self::default()
    }

    /// Register `factory` as kind `name`; a second registration of one name
    /// replaces the first (a binary may replace a built-in kind).
    pub fn register(&mut self, name: impl Into<String>, factory: impl AdapterFactory + 'static) {
        let name = name.into();
        let factory: Arc<dyn AdapterFactory> = Arc::new(factory);
        match self.kinds.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = factory,
            None => self.kinds.push((name, factory)),
        }
    }

    /// The factory of kind `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn AdapterFactory>> {
        self.kinds.iter().find(|(n, _)| n == name).map(|(_, f)| f)
    }

    /// Build the adapter of `ctx.upstream`'s kind.
    ///
    /// # Errors
    ///
    /// An unregistered kind (a configuration not checked with this registry),
    /// or the factory's own error.
    pub fn build(&self, ctx: &AdapterContext<'_>) -> Result<Arc<dyn Adapter>, BuildError> {
        let kind = ctx.upstream.adapter.as_str();
        let factory = self.get(kind).ok_or_else(|| {
            BuildError::new(format!(
                "upstream {:?}: no adapter kind {kind:?} is registered (registered: {})",
                ctx.upstream.name,
                self.names().join(", ")
            ))
        })?;
        factory.build(ctx)
    }
}

impl AdapterKinds for AdapterRegistry {
    fn names(&self) -> Vec<String> {
        self.kinds.iter().map(|(n, _)| n.clone()).collect()
    }

    fn check_settings(&self, upstream: &UpstreamConfig) -> Vec<SettingProblem> {
        let kind = upstream.adapter.as_str();
        let Some(factory) = self.get(kind) else {
            return Vec::new();
        };
        let mut problems = factory.check(upstream);
        // The adapter-specific tables the configuration schema knows.
        let set = [("voice_routes", upstream.voice_routes.is_some())];
        for (table, _) in set.into_iter().filter(|(_, set)| *set) {
            if factory.reads_tables().contains(&table) {
                continue;
            }
            let readers: Vec<String> = self
                .kinds
                .iter()
                .filter(|(_, f)| f.reads_tables().contains(&table))
                .map(|(n, _)| format!("adapter = {n:?}"))
                .collect();
            let only = if readers.is_empty() {
                "no registered adapter kind reads it".to_owned()
            } else {
                format!("applies only to {}", readers.join(", "))
            };
            problems.push(SettingProblem::in_upstream(
                table,
                format!("{only}, not {kind}; remove the table"),
            ));
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::Config;
    use crate::traits::{
        InspectContext, InspectResult, Inspection, RouteClass, RouteMethod, RouteSpec, RouteTable,
        WorkRoute,
    };

    struct Named(&'static str, RouteTable);

    impl Adapter for Named {
        fn name(&self) -> &str {
            self.0
        }
        fn routes(&self) -> &RouteTable {
            &self.1
        }
        fn inspect(
            &self,
            _route: &WorkRoute,
            _ctx: InspectContext<'_>,
            _body: &[u8],
        ) -> InspectResult {
            Ok(Inspection::default())
        }
    }

    fn named(name: &'static str) -> Arc<dyn Adapter> {
        let table = RouteTable::new(vec![RouteSpec::new(
            RouteMethod::Post,
            "/run",
            RouteClass::Work(WorkRoute::response_end()),
        )])
        .unwrap();
        Arc::new(Named(name, table))
    }

    struct Levelled;

    impl AdapterFactory for Levelled {
        fn check(&self, u: &UpstreamConfig) -> Vec<SettingProblem> {
            match u.adapter_settings.get("level").map(toml::Value::as_integer) {
                None | Some(Some(1 | 2)) => Vec::new(),
                Some(_) => vec![SettingProblem::new("level", "must be 1 or 2")],
            }
        }
        fn build(&self, _ctx: &AdapterContext<'_>) -> Result<Arc<dyn Adapter>, BuildError> {
            Ok(named("third"))
        }
    }

    const TEXT: &str = r#"
[[resource]]
name = "ram"

[[upstream]]
name = "u"
adapter = "third"
listen = "127.0.0.1:9000"
target = "http://127.0.0.1:9001"
resource = "ram"
[upstream.adapter_settings]
level = 2
"#;

    #[test]
    fn a_registered_kind_resolves_checks_its_settings_and_builds() {
        let mut reg = AdapterRegistry::new();
        reg.register("openai", |_: &AdapterContext<'_>| Ok(named("openai")));
        reg.register("third", Levelled);
        assert_eq!(reg.names(), ["openai", "third"]);
        let loaded = Config::parse_with(TEXT, "t.toml", &reg).unwrap();
        let u = &loaded.config.upstreams[0];
        let clock = MonotonicClock::new();
        let ctx = AdapterContext {
            upstream: u,
            target: u.target.parse().unwrap(),
            credential: None,
            clock,
            state_dir: Path::new("/nonexistent"),
        };
        assert_eq!(reg.build(&ctx).unwrap().name(), "third");

        let bad = TEXT.replace("level = 2", "level = 7");
        let errs = Config::parse_with(&bad, "t.toml", &reg).unwrap_err().errors;
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].path, "upstream[0] (\"u\").adapter_settings.level");
        assert_eq!(errs[0].line, Some(12));
    }

    #[test]
    fn a_kind_without_settings_refuses_every_key_and_unknown_kinds_do_not_build() {
        let mut reg = AdapterRegistry::new();
        reg.register("third", |_: &AdapterContext<'_>| Ok(named("third")));
        let errs = Config::parse_with(TEXT, "t.toml", &reg).unwrap_err().errors;
        assert_eq!(errs.len(), 1);
        assert!(errs[0].message.contains("takes no settings"), "{}", errs[0]);

        let loaded = Config::parse(&TEXT.replace("third", "other"), "t.toml").unwrap();
        let u = &loaded.config.upstreams[0];
        let ctx = AdapterContext {
            upstream: u,
            target: u.target.parse().unwrap(),
            credential: None,
            clock: MonotonicClock::new(),
            state_dir: Path::new("/nonexistent"),
        };
        let err = reg.build(&ctx).err().unwrap();
        assert!(err.message().contains("registered: third"), "{err}");
    }
}
