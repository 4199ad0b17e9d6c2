//! Which adapter kinds a configuration may name, and how each checks its own
//! settings: the daemon's adapter registry answers, so `adapter = "vllm"` is
//! valid exactly where a `vllm` factory is registered.

use super::schema::UpstreamConfig;

/// One problem a kind found in its own settings: `[upstream.adapter_settings]`,
/// or an adapter-specific table of the upstream such as `[upstream.voice_routes]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingProblem {
    /// The key inside `[upstream.adapter_settings]`, dotted for nested tables
    /// (`sleep.level`); empty for the table as a whole. With `in_upstream`,
    /// the key inside the `[[upstream]]` table instead (`voice_routes.speech`).
    pub key: String,
    /// What is wrong and what to write instead.
    pub message: String,
    /// Whether `key` is relative to the `[[upstream]]` table.
    pub in_upstream: bool,
}

impl SettingProblem {
    /// A problem with `key` of `[upstream.adapter_settings]`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        SettingProblem {
            key: key.into(),
            message: message.into(),
            in_upstream: false,
        }
    }

    /// A problem with `key` of the `[[upstream]]` table: one of the
    /// adapter-specific tables a kind reads (`voice_routes.speech`).
    pub fn in_upstream(key: impl Into<String>, message: impl Into<String>) -> Self {
        SettingProblem {
            key: key.into(),
            message: message.into(),
            in_upstream: true,
        }
    }
}

/// The adapter kinds a configuration is checked against.
///
/// # Behavior
///
/// - `names` lists every kind that may be named, in the order shown to
///   operators when they name one that is not there.
/// - `check_settings` is asked only for a kind in `names`, once per upstream,
///   and returns every problem in that upstream's settings for the kind:
///   `[upstream.adapter_settings]` and the adapter-specific tables
///   (`[upstream.voice_routes]`), which only the kinds that read them accept.
pub trait AdapterKinds {
    /// The registered kind names.
    fn names(&self) -> Vec<String>;

    /// Every problem in `upstream`'s settings for its kind.
    fn check_settings(&self, upstream: &UpstreamConfig) -> Vec<SettingProblem>;
}

/// A plain list of kind names whose settings are never checked (tests, tools).
impl AdapterKinds for [&str] {
    fn names(&self) -> Vec<String> {
        self.iter().map(|s| (*s).to_owned()).collect()
    }

    fn check_settings(&self, _upstream: &UpstreamConfig) -> Vec<SettingProblem> {
        Vec::new()
    }
}
