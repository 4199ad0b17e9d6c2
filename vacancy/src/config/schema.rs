//! The configuration schema: one serde struct per TOML table.
//!
//! Every struct denies unknown keys and takes its defaults from a hand-written
//! `Default` impl, so a table may leave out any key. The key names are a
//! contract (docs/config.md): keys may be added, never renamed.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use crate::ResourceKind;
use crate::engine::pressure::PressureParams;
pub use crate::engine::{OnOwnerReturn, OwnerScope};
pub use crate::traits::routes::Management;

/// A whole configuration file.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[server]`: the control plane.
    pub server: ServerConfig,
    /// `[owner]`: how the owner's presence is detected.
    pub owner: OwnerConfig,
    /// `[[resource]]`: everything with capacity that borrowed work reserves.
    #[serde(rename = "resource")]
    pub resources: Vec<ResourceConfig>,
    /// `[[upstream]]`: the servers vacancyd lends, one listener each.
    #[serde(rename = "upstream")]
    pub upstreams: Vec<UpstreamConfig>,
    /// `[lending]`: when the owner lends (issue 35).
    pub lending: LendingConfig,
    /// `[borrowers]`: borrowers with names and keys (issue 34); absent (the
    /// default), every borrower is anonymous.
    pub borrowers: Option<BorrowersConfig>,
}

impl Config {
    /// The resource named `name`, if configured.
    pub fn resource(&self, name: &str) -> Option<&ResourceConfig> {
        self.resources.iter().find(|r| r.name == name)
    }

    /// The upstream named `name`, if configured.
    pub fn upstream(&self, name: &str) -> Option<&UpstreamConfig> {
        self.upstreams.iter().find(|u| u.name == name)
    }

    /// The names of the upstreams with `owner_scope = "resource"` (SCOPE-13, SCOPE-18),
    /// in configuration order.
    pub fn exempt_upstreams(&self) -> Vec<&str> {
        self.upstreams
            .iter()
            .filter(|u| u.owner_scope == OwnerScope::Resource)
            .map(|u| u.name.as_str())
            .collect()
    }

    /// The one line naming the owner-exempt upstreams (SCOPE-18), which the
    /// daemon logs at startup and `vacancyd check-config` prints; `None` when
    /// every upstream is host-scoped.
    pub fn exemption_line(&self) -> Option<String> {
        let exempt = self.exempt_upstreams();
        (!exempt.is_empty()).then(|| {
            format!(
                "owner-exempt upstreams (owner_scope = \"resource\"): {}",
                exempt.join(", ")
            )
        })
    }
}

/// `[borrowers]`: borrowers with names (issue 34). Who they are, their keys'
/// hashes, classes, limits and budgets live in the keys file, which
/// `vacancyd borrower add|remove` edits and the daemon reloads on change.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BorrowersConfig {
    /// Whether work needs a key. Default true; false lets key-less work in
    /// as one more borrower, `(anonymous)`, of class `anonymous_priority`.
    pub require_key: bool,
    /// The keys file. Default `borrowers.toml` beside the configuration; a
    /// relative path resolves against the configuration's directory.
    pub keys_file: String,
    /// Whether discovery and the reads the seed keeps open also need a key.
    /// Default false.
    pub reads_need_key: bool,
    /// Seconds a batch request may wait in line before it goes ahead of
    /// interactive ones, so batch work never starves. Default 120.
    pub batch_max_wait_s: u64,
    /// The class of key-less work with `require_key = false`. Default `batch`.
    pub anonymous_priority: crate::engine::Priority,
    /// The owner's record of who used the machine, an SQLite file. Default
    /// `usage.sqlite` in the recovery directory's parent; a relative path
    /// resolves against the configuration's directory.
    pub usage_db: String,
}

impl Default for BorrowersConfig {
    fn default() -> Self {
        BorrowersConfig {
            require_key: true,
            keys_file: String::new(),
            reads_need_key: false,
            batch_max_wait_s: 120,
            anonymous_priority: crate::engine::Priority::Batch,
            usage_db: String::new(),
        }
    }
}

/// `[server]`: the control plane (console, `/status`, `/metrics`, `/admin`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Control-plane listen address. Default `127.0.0.1:7480`.
    pub listen: String,
    /// The recovery directory (REC-10). Empty (the default): the default location,
    /// beside the configuration with the `.admission` extension (REC-11). A relative
    /// path resolves against the configuration's directory (REC-17).
    pub admission_state_dir: String,
    /// The lending switch at start. Default `true`.
    pub lending: bool,
    /// The largest work request body vacancyd reads to inspect it, in MiB;
    /// larger bodies get 413 `body_too_large`. Default 32.
    pub max_body_mib: u64,
    /// Seconds a request head may take from its first byte to its last, on
    /// every listener; slower connections are closed. Default 30.
    pub header_timeout_s: u64,
    /// Seconds a connection may stay open with no request in flight (HTTP
    /// keep-alive). A response being streamed is never idle. Default 75.
    pub idle_timeout_s: u64,
    /// Seconds a request body may take before `body_min_rate_bytes` applies;
    /// a body that falls behind is refused and its connection closed. Default 30.
    pub body_timeout_s: u64,
    /// Bytes per second a request body must average after `body_timeout_s`
    /// (each such amount extends the deadline by a second). Default 1024.
    pub body_min_rate_bytes: u64,
    /// Whether every proxied response carries `vacancy-overhead-ms`, the
    /// time vacancyd itself added to it in milliseconds (issue 31 item 6).
    /// Default false.
    pub overhead_header: bool,
    /// Threads that serve borrower connections, each a single-threaded
    /// runtime holding its connections from accept to close (issue 31);
    /// 0 (the default): one per core.
    pub proxy_threads: u64,
    /// Seconds a WebSocket (or other upgraded) connection may carry no byte
    /// either way before both sides are closed. ComfyUI's progress socket is
    /// quiet between prompts and through a node that reports no progress, so
    /// the default is long: 3600, the default `completion_timeout_s`, the
    /// longest vacancyd awaits one job.
    pub tunnel_idle_timeout_s: u64,
    /// Host names the control listener answers to besides its own address
    /// and `localhost` (a DNS-rebinding defence): the names clients or a
    /// reverse proxy use for it, without ports. Default none.
    pub allowed_hosts: Vec<String>,
    /// `[[server.token]]`: admin/owner credentials (hashes only).
    #[serde(rename = "token")]
    pub tokens: Vec<TokenConfig>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:7480".to_owned(),
            admission_state_dir: String::new(),
            lending: true,
            max_body_mib: 32,
            header_timeout_s: 30,
            idle_timeout_s: 75,
            body_timeout_s: 30,
            body_min_rate_bytes: 1024,
            overhead_header: false,
            proxy_threads: 0,
            tunnel_idle_timeout_s: 3600,
            allowed_hosts: Vec::new(),
            tokens: Vec::new(),
        }
    }
}

/// `[[server.token]]`: one bearer token for the control plane. Only its hash is stored.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokenConfig {
    /// A name for logs and audit lines.
    pub name: String,
    /// What the token may do. `admin` implies `owner`, which implies `read`.
    pub scopes: Vec<Scope>,
    /// Lowercase or uppercase hex SHA-256 of the token (64 hex digits).
    pub sha256: String,
}

impl TokenConfig {
    /// Whether this token grants `needed`, counting implied scopes
    /// (`admin` ⊇ `owner` ⊇ `read`).
    pub fn grants(&self, needed: Scope) -> bool {
        self.scopes.iter().any(|s| s.implies(needed))
    }
}

/// A control-plane permission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Read status and metrics.
    #[default]
    Read,
    /// Owner actions (the lending switch, presence); implies `read`.
    Owner,
    /// Administration (release held work, change settings); implies `owner`.
    Admin,
}

impl Scope {
    /// Whether holding `self` grants `needed` (`admin` ⊇ `owner` ⊇ `read`).
    pub fn implies(self, needed: Scope) -> bool {
        self.rank() >= needed.rank()
    }

    fn rank(self) -> u8 {
        match self {
            Scope::Read => 0,
            Scope::Owner => 1,
            Scope::Admin => 2,
        }
    }
}

/// `[owner]`: how vacancyd tells whether the machine's owner is present.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OwnerConfig {
    /// The presence backend. Default `auto`.
    pub presence: PresenceMode,
    /// `presence = "command"`: a command run through the shell; exit 0 means
    /// present, 1 away, anything else unknown.
    pub command: String,
    /// logind: whether remote (SSH) sessions count as the owner. Default `false`.
    pub remote_sessions_count: bool,
    /// windows: whether a locked console session counts as away (else as
    /// unlocked). Default `true`.
    pub locked_counts_as_away: bool,
    /// `[owner.gpu_pressure]`: attributed GPU pressure.
    pub gpu_pressure: GpuPressureConfig,
    /// What happens on battery power. Default `lend` (the term is off).
    pub on_battery: OnBattery,
    /// Linux: where the kernel lists power supplies. Default
    /// `/sys/class/power_supply` (a test points it at a fake tree).
    pub power_supply_dir: String,
}

impl Default for OwnerConfig {
    fn default() -> Self {
        OwnerConfig {
            presence: PresenceMode::Auto,
            command: String::new(),
            remote_sessions_count: false,
            locked_counts_as_away: true,
            gpu_pressure: GpuPressureConfig::default(),
            on_battery: OnBattery::Lend,
            power_supply_dir: "/sys/class/power_supply".to_owned(),
        }
    }
}

/// `[owner] on_battery`: whether a laptop lends on battery power.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBattery {
    /// Lend on battery as on mains (the term is off).
    #[default]
    Lend,
    /// Refuse new work and reclaim accepted work while on battery (or while
    /// the supply cannot be read); lend again after a reading on mains.
    Pause,
}

/// `[lending]`: when the owner lends (issue 35).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LendingConfig {
    /// Weekly windows in the machine's local time zone, e.g.
    /// `["Mon-Fri 19:00-08:00", "Sat-Sun"]`. Absent: lend at all hours.
    pub hours: Option<Vec<String>>,
}

/// The owner-presence backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum PresenceMode {
    /// On Windows `windows`; elsewhere logind on a machine with seats,
    /// otherwise `none` (logged).
    #[default]
    Auto,
    /// systemd-logind sessions.
    Logind,
    /// Set by the owner through the console or CLI.
    Manual,
    /// The exit status of `owner.command`.
    Command,
    /// A dedicated machine: the owner is never present.
    None,
    /// The Windows console session (Windows builds only).
    Windows,
}

/// `[owner.gpu_pressure]`: attributed GPU pressure (off by default).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuPressureConfig {
    /// Whether GPU pressure is measured. Default `false`.
    pub enabled: bool,
    /// Sampling interval in milliseconds. Default 2000.
    pub poll_ms: u64,
    /// Utilization points above the baseline that count as pressure. Default 25.
    pub util_threshold_pct: u8,
    /// MiB above the baseline that count as pressure. Default 1024.
    pub memory_threshold_mib: u64,
    /// Milliseconds the owner's load must stay above the threshold before
    /// pressure engages. Default 4000.
    pub engage_ms: u64,
    /// Milliseconds engaged pressure must be observed quiet before it
    /// releases (PRES-08). Default 30000.
    pub quiet_ms: u64,
}

impl Default for GpuPressureConfig {
    fn default() -> Self {
        let p = PressureParams::default();
        GpuPressureConfig {
            enabled: false,
            poll_ms: millis(p.poll),
            util_threshold_pct: p.util_threshold_pct,
            memory_threshold_mib: p.memory_threshold_mib,
            engage_ms: millis(p.engage_after),
            quiet_ms: millis(p.quiet_for),
        }
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl PressureParams {
    /// The settings of `[owner.gpu_pressure]`.
    pub fn from_config(config: &GpuPressureConfig) -> Self {
        PressureParams {
            poll: std::time::Duration::from_millis(config.poll_ms),
            util_threshold_pct: config.util_threshold_pct,
            memory_threshold_mib: config.memory_threshold_mib,
            engage_after: std::time::Duration::from_millis(config.engage_ms),
            quiet_for: std::time::Duration::from_millis(config.quiet_ms),
        }
    }
}

/// `[[resource]]`: something with capacity that borrowed work reserves.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResourceConfig {
    /// The resource's name, referenced by upstreams. Required.
    pub name: String,
    /// What it is. Default `memory`.
    pub kind: ResourceKind,
    /// How it is sampled. Default `system`.
    pub sampler: SamplerKind,
    /// `nvml`: device index or PCI bus id; `amdgpu`: card name (`card0`). Default `"0"`.
    pub device: String,
    /// `sampler = "file"`: a JSON file `{"free_mib":N,"total_mib":N}`.
    pub path: String,
    /// Memory no borrowed job may touch (MEM-01). Default 0.
    pub reserve_mib: u64,
    /// The resource's lending switch at start. Default `true`.
    pub enabled: bool,
    /// Regular sampling interval in milliseconds. Default 1000.
    pub poll_ms: u64,
    /// Samples older than this count as capacity unknown. Default 5000.
    pub max_sample_age_ms: u64,
    /// `kind = "cpu"`: new work is refused while busier than this percentage
    /// (SCOPE-08). Default 90.
    pub busy_max_pct: u8,
    /// `sampler = "amdgpu"`: the DRM sysfs directory. Default `/sys/class/drm`.
    pub sysfs_root: String,
    /// `sampler = "amdgpu"`: count free GTT as well as VRAM (APUs). Default `false`.
    pub include_gtt: bool,
    /// A GPU's temperature limit in °C: above it new work is refused
    /// `gpu_too_hot` (issue 35). Absent: none.
    pub max_temperature_c: Option<u32>,
    /// With `max_temperature_c`: the GPU lends again only below this.
    /// Default 5 below `max_temperature_c`.
    pub resume_below_c: Option<u32>,
    /// A GPU's power limit in watts: above it new work is refused
    /// `gpu_power_limit`. Absent: none.
    pub max_power_w: Option<u32>,
    /// A GPU's fan limit in percent: above it new work is refused
    /// `gpu_too_hot`. Absent: none.
    pub max_fan_percent: Option<u8>,
    /// Seconds a GPU may stay above a limit (or without a reading) before
    /// the accepted work on it is reclaimed. Default 30.
    pub hot_for_s: u64,
    /// Lower the GPU's power limit to this many watts while borrowed work
    /// runs on it, and restore it afterwards. Absent: off.
    pub power_cap_w: Option<u32>,
}

impl Default for ResourceConfig {
    fn default() -> Self {
        ResourceConfig {
            name: String::new(),
            kind: ResourceKind::Memory,
            sampler: SamplerKind::System,
            device: "0".to_owned(),
            path: String::new(),
            reserve_mib: 0,
            enabled: true,
            poll_ms: 1000,
            max_sample_age_ms: 5000,
            busy_max_pct: 90,
            sysfs_root: "/sys/class/drm".to_owned(),
            include_gtt: false,
            max_temperature_c: None,
            resume_below_c: None,
            max_power_w: None,
            max_fan_percent: None,
            hot_for_s: 30,
            power_cap_w: None,
        }
    }
}

/// How a resource's capacity is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum SamplerKind {
    /// NVIDIA GPUs through NVML (feature `nvml`).
    Nvml,
    /// AMD GPUs through sysfs (VRAM, optionally GTT).
    Amdgpu,
    /// System memory or CPU load.
    #[default]
    System,
    /// A JSON file written by an exporter or a test.
    File,
    /// Nothing samples it: the program embedding the engine feeds its samples
    /// (Python's `Engine.sample`). Only in an engine-only configuration
    /// ([`Config::parse_for_engine`](super::Config::parse_for_engine)), where it is the default;
    /// `vacancyd` cannot run it.
    Manual,
}

/// `[[upstream]]`: one real server lent through one listener.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// The upstream's name. Required.
    pub name: String,
    /// The dialect the server speaks. Default `openai`.
    pub adapter: AdapterKind,
    /// Where borrowers connect (`127.0.0.1:11435`). Required.
    pub listen: String,
    /// The real server's base URL; a path prefix is prepended to requests. Required.
    pub target: String,
    /// The primary resource. Required.
    pub resource: String,
    /// Further resources every job needs (CFG-05: the other GPUs of a multi-GPU server).
    pub also_requires: Vec<String>,
    /// Requirement on the primary resource for models not listed in `models` (MEM-06).
    pub default_min_free_mib: u64,
    /// Requirement on each budgeted resource, instead of the configured one or a
    /// learned prior, when the requested model is proven resident (RES-01).
    pub resident_min_free_mib: u64,
    /// Whether management routes are forwarded (never reserved). Default `deny`.
    pub management: Management,
    /// Whether owner presence applies. Default `host`.
    pub owner_scope: OwnerScope,
    /// What happens to accepted work when the owner returns. Default `drain`.
    pub on_owner_return: OnOwnerReturn,
    /// `drain`: seconds before the proxy connection is cancelled. Default 30.
    pub drain_timeout_s: u64,
    /// Unload models when reclaiming for the owner. Default `false`.
    pub yield_on_veto: bool,
    /// Seconds after which an unfinished job is no longer awaited. Default 3600.
    pub completion_timeout_s: u64,
    /// What happens when the borrower disconnects. Default `drain`.
    pub on_borrower_disconnect: OnBorrowerDisconnect,
    /// Seconds vacancyd keeps asking the upstream for proof that a job whose
    /// response it cut has stopped (llama.cpp: `/slots` idle); the entry is
    /// `verifying` meanwhile and held only if no proof comes. Default 60.
    pub stop_proof_timeout_s: u64,
    /// `[upstream.models]`: per-model requirements, by exact request model name.
    pub models: BTreeMap<String, ModelRequirement>,
    /// `[upstream.requirements]`: per-resource requirements on `also_requires` resources.
    pub requirements: BTreeMap<String, ResourceRequirement>,
    /// `[upstream.credential]`: used for observation and tracking, never the borrower's.
    pub credential: Option<CredentialConfig>,
    /// `[upstream.voice_routes]`: the compatible-voice-server paths
    /// (`adapter = "chatterbox"` only).
    pub voice_routes: Option<VoiceRoutesConfig>,
    /// `[upstream.adapter_settings]`: the adapter kind's own settings, checked
    /// by the kind's factory (an empty table when not written).
    pub adapter_settings: toml::Table,
    /// `[upstream.queue]`: a bounded wait line for requests refused only
    /// because a resource is reserved. Absent: off (the seed's behaviour).
    pub queue: Option<QueueConfig>,
}

/// `stop_proof_timeout_s`'s default: a llama-server on a loaded 2-core
/// machine notices a closed connection and frees its slot within seconds;
/// a minute leaves room for a slow token and a slow `/slots` reading.
pub const DEFAULT_STOP_PROOF_TIMEOUT_S: u64 = 60;

/// `stop_proof_timeout_s`'s largest value.
pub const MAX_STOP_PROOF_TIMEOUT_S: u64 = 3600;

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            name: String::new(),
            adapter: AdapterKind::OPENAI,
            listen: String::new(),
            target: String::new(),
            resource: String::new(),
            also_requires: Vec::new(),
            default_min_free_mib: 0,
            resident_min_free_mib: 0,
            management: Management::Deny,
            owner_scope: OwnerScope::Host,
            on_owner_return: OnOwnerReturn::Drain,
            drain_timeout_s: 30,
            yield_on_veto: false,
            completion_timeout_s: 3600,
            on_borrower_disconnect: OnBorrowerDisconnect::Drain,
            stop_proof_timeout_s: DEFAULT_STOP_PROOF_TIMEOUT_S,
            models: BTreeMap::new(),
            requirements: BTreeMap::new(),
            credential: None,
            voice_routes: None,
            adapter_settings: toml::Table::new(),
            queue: None,
        }
    }
}

impl UpstreamConfig {
    /// Every resource this upstream borrows: `resource` first, then `also_requires`.
    pub fn resource_names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.resource.as_str()).chain(self.also_requires.iter().map(String::as_str))
    }

    /// The configured requirement on the primary resource for `model` (MEM-06):
    /// the model's `min_free_mib` if listed, else `default_min_free_mib`.
    pub fn model_min_free_mib(&self, model: Option<&str>) -> u64 {
        model
            .and_then(|m| self.models.get(m))
            .and_then(|r| r.min_free_mib)
            .unwrap_or(self.default_min_free_mib)
    }

    /// The requirement on each budgeted resource for `model` when it is proven
    /// resident (RES-01): the model's `resident_min_free_mib` if set, else the
    /// upstream's.
    pub fn model_resident_min_free_mib(&self, model: Option<&str>) -> u64 {
        model
            .and_then(|m| self.models.get(m))
            .and_then(|r| r.resident_min_free_mib)
            .unwrap_or(self.resident_min_free_mib)
    }
}

/// The dialect an upstream speaks: the name of an adapter kind (`adapter = "..."`).
///
/// # Behavior
///
/// Any name parses; which kinds exist is decided by whoever runs the
/// configuration: the daemon's adapter registry
/// ([`AdapterKinds`](crate::config::AdapterKinds), checked by
/// [`Config::parse_with`](crate::config::Config::parse_with)), where the five
/// built-in kinds below and any third party's register alike.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdapterKind(Cow<'static, str>);

impl AdapterKind {
    /// Ollama's native API (and its OpenAI-compatible routes).
    pub const OLLAMA: AdapterKind = AdapterKind(Cow::Borrowed("ollama"));
    /// ComfyUI.
    pub const COMFYUI: AdapterKind = AdapterKind(Cow::Borrowed("comfyui"));
    /// llama.cpp's llama-server.
    pub const LLAMACPP: AdapterKind = AdapterKind(Cow::Borrowed("llamacpp"));
    /// A generic OpenAI-compatible server (the default).
    pub const OPENAI: AdapterKind = AdapterKind(Cow::Borrowed("openai"));
    /// A Chatterbox-compatible voice server.
    pub const CHATTERBOX: AdapterKind = AdapterKind(Cow::Borrowed("chatterbox"));

    /// The kind named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        AdapterKind(Cow::Owned(name.into()))
    }

    /// The name as written in configuration.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for AdapterKind {
    fn default() -> Self {
        AdapterKind::OPENAI
    }
}

impl fmt::Display for AdapterKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for AdapterKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(AdapterKind::new)
    }
}

/// What happens when a borrower disconnects mid-request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBorrowerDisconnect {
    /// Read the upstream's reply to its end, then release.
    #[default]
    Drain,
    /// Close the upstream connection; held unless the adapter proves the stop.
    Cut,
}

/// One entry of `[upstream.models]`. `None` falls back to the upstream's value.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelRequirement {
    /// Requirement on the primary resource; `None`: `default_min_free_mib`.
    pub min_free_mib: Option<u64>,
    /// Requirement when proven resident; `None`: the upstream's `resident_min_free_mib`.
    pub resident_min_free_mib: Option<u64>,
}

/// One entry of `[upstream.requirements]`: a requirement on an `also_requires` resource.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResourceRequirement {
    /// Free memory the job needs on that resource (MEM-04).
    pub min_free_mib: u64,
}

/// `[upstream.voice_routes]`: where a compatible voice server answers
/// (docs/config.md#upstreamvoice_routes); each path defaults to the contract's. `{id}` stands for a
/// result-read ID (`^[A-Za-z0-9_-]{8,80}$`, VOICE-07).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VoiceRoutesConfig {
    /// Speech synthesis (work). Default `/v1/audio/speech`.
    pub speech: String,
    /// Durable synthesis (work). Default `/v1/audio/executions`.
    pub executions: String,
    /// Capability read. Default `/v1/audio/capabilities`.
    pub capabilities: String,
    /// Execution lookup, with `{id}`. Default `/v1/audio/executions/{id}`.
    pub execution: String,
    /// Audio replay, with `{id}`. Default `/v1/audio/executions/{id}/audio`.
    pub execution_audio: String,
}

impl Default for VoiceRoutesConfig {
    fn default() -> Self {
        VoiceRoutesConfig {
            speech: "/v1/audio/speech".to_owned(),
            executions: "/v1/audio/executions".to_owned(),
            capabilities: "/v1/audio/capabilities".to_owned(),
            execution: "/v1/audio/executions/{id}".to_owned(),
            execution_audio: "/v1/audio/executions/{id}/audio".to_owned(),
        }
    }
}

/// `[upstream.credential]`: how vacancyd authenticates its own observation and
/// tracking requests (OBS-02).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CredentialConfig {
    /// The header to send. Default `Authorization`.
    pub header: String,
    /// A file holding the header's value. Required when the table is present.
    pub value_file: String,
}

impl Default for CredentialConfig {
    fn default() -> Self {
        CredentialConfig {
            header: "Authorization".to_owned(),
            value_file: String::new(),
        }
    }
}

names! {
    Scope { Read => "read", Owner => "owner", Admin => "admin" }
    PresenceMode { Auto => "auto", Logind => "logind", Manual => "manual", Command => "command", None => "none", Windows => "windows" }
    SamplerKind { Nvml => "nvml", Amdgpu => "amdgpu", System => "system", File => "file", Manual => "manual" }
    OnBorrowerDisconnect { Drain => "drain", Cut => "cut" }
    OnBattery { Lend => "lend", Pause => "pause" }
}

/// `[upstream.queue]`: the wait line (off unless the table is present).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// How many of this upstream's requests may wait at once; one more is
    /// refused `resource_busy` at once. Default 16.
    pub max_waiting: u32,
    /// How long a request waits at most before it is refused
    /// `resource_busy`. Default 30.
    pub max_wait_s: u64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            max_waiting: 16,
            max_wait_s: 30,
        }
    }
}

// ---- the borrowers' keys file (issue 34; config::borrowers) ----

/// The whole keys file.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KeysFile {
    /// `[[borrower]]`.
    #[serde(rename = "borrower")]
    pub borrowers: Vec<BorrowerEntry>,
}

/// `[[borrower]]`: one named borrower.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BorrowerEntry {
    /// Its name: up to 64 letters, digits, '-', '_' or '.'.
    pub name: String,
    /// The lowercase hex SHA-256 of its key.
    pub key_sha256: String,
    /// Its class. Default `interactive`.
    pub priority: crate::engine::Priority,
    /// Its weight in the line's turns, 1 to 1000. Default 1.
    pub share: u32,
    /// At most this many jobs at once.
    pub max_running: Option<u32>,
    /// At most this many requests waiting at once.
    pub max_waiting: Option<u32>,
    /// `[[borrower.budget]]`: reservation time per kind and period.
    #[serde(rename = "budget")]
    pub budgets: Vec<BudgetEntry>,
}

impl Default for BorrowerEntry {
    fn default() -> Self {
        BorrowerEntry {
            name: String::new(),
            key_sha256: String::new(),
            priority: crate::engine::Priority::Interactive,
            share: 1,
            max_running: None,
            max_waiting: None,
            budgets: Vec::new(),
        }
    }
}

/// `[[borrower.budget]]`: seconds of one kind of resource per period.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetEntry {
    /// `gpu` (default), `memory` or `cpu`.
    pub kind: ResourceKind,
    /// `day` (default) or `week`.
    pub per: crate::engine::BudgetPeriod,
    /// Seconds of one resource of the kind held, from admission to release.
    pub seconds: u64,
}

impl Default for BudgetEntry {
    fn default() -> Self {
        BudgetEntry {
            kind: ResourceKind::Gpu,
            per: crate::engine::BudgetPeriod::Day,
            seconds: 0,
        }
    }
}
