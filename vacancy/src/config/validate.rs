//! Semantic checks on a parsed [`Config`]: every problem is collected, each with
//! its key path and line.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;

use super::Purpose;
use super::error::{ConfigError, ConfigWarning};
use super::hosts::{parse_target, same_server_key};
use super::kinds::AdapterKinds;
use super::parse::{KeyIndex, KeyPath, sort_by_line};
use super::schema::{
    Config, MAX_STOP_PROOF_TIMEOUT_S, OnBattery, OwnerScope, PresenceMode, ResourceConfig,
    SamplerKind, Scope, UpstreamConfig,
};
use crate::ResourceKind;

/// Check `config`; return its errors and warnings, each ordered by line.
pub(crate) fn validate(
    config: &Config,
    index: &KeyIndex,
    kinds: Option<&dyn AdapterKinds>,
    purpose: Purpose,
) -> (Vec<ConfigError>, Vec<ConfigWarning>) {
    let mut cx = Checker {
        index,
        kinds,
        engine_only: purpose == Purpose::Engine,
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    let root = KeyPath::root();
    let server_listen = cx.server(config, &root);
    cx.owner(config, &root);
    cx.lending(config, &root);
    cx.resources(config, &root);
    cx.upstreams(config, &root, server_listen);
    cx.same_servers(config, &root);
    cx.exemptions(config, &root);
    cx.borrowers(config, &root);
    sort_by_line(&mut cx.errors);
    sort_by_line(&mut cx.warnings);
    (cx.errors, cx.warnings)
}

/// The borrowers' keys file's problems (issue 34), each with its key and line.
pub(crate) fn validate_keys_file(
    file: &super::schema::KeysFile,
    index: &KeyIndex,
) -> Vec<ConfigError> {
    let mut cx = Checker {
        index,
        kinds: None,
        engine_only: false,
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    let list = KeyPath::root().key("borrower");
    let mut names: HashMap<&str, usize> = HashMap::new();
    let mut hashes: HashMap<String, &str> = HashMap::new();
    for (i, b) in file.borrowers.iter().enumerate() {
        let bp = list.elem(i, Some(&b.name));
        if cx.name(&bp.key("name"), "borrower", &b.name)
            && let Some(first) = names.insert(&b.name, i)
        {
            {
                cx.error(
                    &bp.key("name"),
                    format!(
                        "borrower {:?} is listed twice (also borrower[{first}]); give each borrower one entry",
                        b.name
                    ),
                );
            }
        }
        let hash = b.key_sha256.to_ascii_lowercase();
        if hash.len() != 64 || !hash.bytes().all(|c| c.is_ascii_hexdigit()) {
            cx.error(
                &bp.key("key_sha256"),
                "missing or not a SHA-256 in hex (64 characters); create the borrower with `vacancyd borrower add NAME`, which writes it",
            );
        } else if let Some(other) = hashes.insert(hash, &b.name) {
            cx.error(
                &bp.key("key_sha256"),
                format!("the same key as borrower {other:?}; each borrower needs a key of its own"),
            );
        }
        if b.share == 0 || b.share > crate::engine::MAX_SHARE {
            cx.error(
                &bp.key("share"),
                format!(
                    "{} is outside 1 to {}: a share is a borrower's weight in the line's turns",
                    b.share,
                    crate::engine::MAX_SHARE
                ),
            );
        }
        let mut seen = HashSet::new();
        for (j, budget) in b.budgets.iter().enumerate() {
            let pp = bp.key("budget").elem(j, None);
            cx.duration(&pp.key("seconds"), budget.seconds, BUDGET_S);
            if !seen.insert((budget.kind, budget.per)) {
                cx.error(
                    &pp,
                    format!(
                        "a second {} budget per {}; give each kind and period one budget",
                        budget.kind.as_str(),
                        budget.per.as_str()
                    ),
                );
            }
        }
    }
    sort_by_line(&mut cx.errors);
    cx.errors
}

struct Checker<'a> {
    index: &'a KeyIndex,
    /// The registered adapter kinds; `None`: any well-formed name passes.
    kinds: Option<&'a dyn AdapterKinds>,
    /// An engine-only configuration: listeners and targets are optional and
    /// `manual` resources are allowed.
    engine_only: bool,
    errors: Vec<ConfigError>,
    warnings: Vec<ConfigWarning>,
}

/// The range a duration key accepts: from `min` to `max` in `unit`s.
///
/// Every duration key is bounded (issue 30 item 5), so that nothing derived
/// from one (a deadline, a timer, a sum of two) can overflow a clock: a
/// value past `max` is an error naming the key, its line and `max`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DurationBounds {
    /// The smallest accepted value (0 where "at once" means something).
    pub min: u64,
    /// The largest accepted value.
    pub max: u64,
    /// `Seconds` for `_s` keys, `Millis` for `_ms` keys.
    pub unit: Unit,
    /// What the key is, for the message.
    pub what: &'static str,
}

/// The unit of a duration key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    Seconds,
    Millis,
}

const MINUTE: u64 = 60;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

const fn secs(min: u64, max: u64, what: &'static str) -> DurationBounds {
    DurationBounds {
        min,
        max,
        unit: Unit::Seconds,
        what,
    }
}

const fn millis(min: u64, max_secs: u64, what: &'static str) -> DurationBounds {
    DurationBounds {
        min,
        max: max_secs * 1000,
        unit: Unit::Millis,
        what,
    }
}

/// `[server] header_timeout_s`.
const HEADER_TIMEOUT_S: DurationBounds = secs(1, HOUR, "seconds a request head may take");
/// `[server] idle_timeout_s`.
const IDLE_TIMEOUT_S: DurationBounds = secs(1, DAY, "seconds an idle connection stays open");
/// `[server] body_timeout_s`.
const BODY_TIMEOUT_S: DurationBounds = secs(
    1,
    HOUR,
    "seconds a request body may take before its minimum rate applies",
);
/// `[server] tunnel_idle_timeout_s`.
const TUNNEL_IDLE_TIMEOUT_S: DurationBounds = secs(
    1,
    7 * DAY,
    "seconds an upgraded connection such as a WebSocket may carry nothing",
);
/// `[owner.gpu_pressure] poll_ms`.
const PRESSURE_POLL_MS: DurationBounds = millis(1, HOUR, "milliseconds between pressure samples");
/// `[owner.gpu_pressure] engage_ms`.
const ENGAGE_MS: DurationBounds = millis(
    0,
    HOUR,
    "milliseconds the owner's load must stay above the threshold before pressure engages",
);
/// `[owner.gpu_pressure] quiet_ms`.
const QUIET_MS: DurationBounds = millis(
    1,
    DAY,
    "milliseconds engaged pressure must be observed quiet before it releases",
);
/// `[[resource]] poll_ms`.
const RESOURCE_POLL_MS: DurationBounds = millis(1, HOUR, "milliseconds between samples");
/// `[[resource]] max_sample_age_ms`.
const MAX_SAMPLE_AGE_MS: DurationBounds = millis(
    1,
    DAY,
    "milliseconds a sample counts as fresh; at 0 every sample would count as capacity unknown",
);
/// `[[upstream]] drain_timeout_s`.
const DRAIN_TIMEOUT_S: DurationBounds = secs(
    0,
    DAY,
    "seconds accepted work may drain after the owner returns",
);
/// `[[upstream]] completion_timeout_s`.
const COMPLETION_TIMEOUT_S: DurationBounds =
    secs(1, 7 * DAY, "seconds an unfinished job is awaited");
/// `[[upstream]] stop_proof_timeout_s`.
const STOP_PROOF_TIMEOUT_S: DurationBounds = secs(
    1,
    MAX_STOP_PROOF_TIMEOUT_S,
    "seconds the proof that a cut job stopped is awaited",
);
/// `[[resource]] hot_for_s` (issue 35).
const HOT_FOR_S: DurationBounds = secs(
    0,
    DAY,
    "seconds a GPU may stay above a limit before its accepted work is reclaimed",
);
/// `[borrowers] batch_max_wait_s` (issue 34).
const BATCH_MAX_WAIT_S: DurationBounds = secs(
    1,
    DAY,
    "seconds a batch request may wait before it goes ahead of interactive ones",
);
/// A keys file's `[[borrower.budget]] seconds` (issue 34): up to a year of
/// one resource's time.
const BUDGET_S: DurationBounds = secs(
    1,
    365 * DAY,
    "seconds of reservation time the period allows",
);
/// `[upstream.queue] max_wait_s`.
const MAX_WAIT_S: DurationBounds = secs(
    1,
    HOUR,
    "seconds a request may wait for a reserved resource",
);

/// `n` seconds in words: "7 days", "1 hour", "90 seconds".
fn in_words(seconds: u64) -> String {
    let (n, unit) = if seconds >= DAY && seconds.is_multiple_of(DAY) {
        (seconds / DAY, "day")
    } else if seconds >= HOUR && seconds.is_multiple_of(HOUR) {
        (seconds / HOUR, "hour")
    } else if seconds >= MINUTE && seconds.is_multiple_of(MINUTE) {
        (seconds / MINUTE, "minute")
    } else {
        (seconds, "second")
    };
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
}

/// Token hashes whose token anyone can read, refused wherever they appear
/// (issue 30 item 4): with one configured, anyone could use the control plane.
const PUBLIC_TOKEN_HASHES: &[(&str, &str)] = &[
    (
        "3690a4a2ed3b26b46a696e9ab873a300d9da3ae56bc84352e2bf724885c91dfd",
        "this is the hash of \"example-token-do-not-use\", the token earlier copies of examples/vacancyd.toml carried: that token is public, so anyone could use it",
    ),
    (
        EXAMPLE_TOKEN_PLACEHOLDER,
        "this is the placeholder of examples/vacancyd.toml, not a token of yours",
    ),
];

/// The `sha256` examples/vacancyd.toml ships: no token hashes to it that
/// anyone knows, and validation refuses it so that a copied example never
/// starts with a token table nobody filled in.
pub const EXAMPLE_TOKEN_PLACEHOLDER: &str =
    "0000000000000000000000000000000000000000000000000000000000000000";

/// The example shown when a listen address does not parse.
const LISTEN_FORM: &str = "expected an IP address and port such as \"127.0.0.1:11435\" (names like localhost are not accepted here)";

impl Checker<'_> {
    fn error(&mut self, path: &KeyPath, message: impl Into<String>) {
        self.errors.push(ConfigError {
            path: path.shown().to_owned(),
            line: self.index.line(path),
            message: message.into(),
        });
    }

    fn warn(&mut self, path: &KeyPath, message: impl Into<String>) {
        self.warnings.push(ConfigWarning {
            path: path.shown().to_owned(),
            line: self.index.line(path),
            message: message.into(),
        });
    }

    /// Warn about a key that was written but has no effect in this table.
    fn ignored(&mut self, path: &KeyPath, why: &str) {
        if self.index.has(path) {
            self.warn(path, format!("ignored: {why}"));
        }
    }

    /// A duration key within its `bounds` (issue 30 item 5).
    fn duration(&mut self, path: &KeyPath, value: u64, bounds: DurationBounds) {
        let what = bounds.what;
        if value < bounds.min {
            self.error(path, format!("must be above {} ({what})", bounds.min - 1));
        } else if value > bounds.max {
            let (max, words) = match bounds.unit {
                Unit::Seconds => (bounds.max, in_words(bounds.max)),
                Unit::Millis => (bounds.max, in_words(bounds.max / 1000)),
            };
            self.error(
                path,
                format!(
                    "{value} is too large: the largest accepted value is {max} ({words}; {what})"
                ),
            );
        }
    }

    /// A required name: present, and made of characters safe in paths, URLs and metrics.
    fn name(&mut self, path: &KeyPath, what: &str, name: &str) -> bool {
        if name.is_empty() {
            self.error(path, format!("missing: every {what} needs a name"));
            return false;
        }
        let valid = name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !valid {
            self.error(
                path,
                format!(
                    "{name:?} is not a valid {what} name; use up to 64 letters, digits, '-', '_' or '.'"
                ),
            );
        }
        valid
    }

    fn listen(&mut self, path: &KeyPath, listen: &str) -> Option<SocketAddr> {
        match listen.parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(_) => {
                self.error(
                    path,
                    format!("{listen:?} is not a listen address; {LISTEN_FORM}"),
                );
                None
            }
        }
    }

    // Long: one short check per [server] key, in docs/config.md's order, all into one error list.
    fn server(&mut self, config: &Config, root: &KeyPath) -> Option<(SocketAddr, KeyPath)> {
        let server = &config.server;
        let sp = root.key("server");
        let listen_path = sp.key("listen");
        let listen = if server.listen.is_empty() {
            self.error(
                &listen_path,
                format!("missing: the control plane needs an address; {LISTEN_FORM}"),
            );
            None
        } else {
            self.listen(&listen_path, &server.listen)
        };

        if server.proxy_threads > 256 {
            self.error(
                &sp.key("proxy_threads"),
                "must be at most 256 (threads serving borrower connections; 0 is one per core)",
            );
        }
        if server.max_body_mib == 0 {
            self.error(
                &sp.key("max_body_mib"),
                "must be at least 1 (MiB of a work request body read to inspect it)",
            );
        }
        for (key, value, bounds) in [
            (
                "header_timeout_s",
                server.header_timeout_s,
                HEADER_TIMEOUT_S,
            ),
            ("idle_timeout_s", server.idle_timeout_s, IDLE_TIMEOUT_S),
            ("body_timeout_s", server.body_timeout_s, BODY_TIMEOUT_S),
            (
                "tunnel_idle_timeout_s",
                server.tunnel_idle_timeout_s,
                TUNNEL_IDLE_TIMEOUT_S,
            ),
        ] {
            self.duration(&sp.key(key), value, bounds);
        }
        if server.body_min_rate_bytes == 0 {
            self.error(
                &sp.key("body_min_rate_bytes"),
                "must be at least 1 (bytes per second a request body must average)",
            );
        }

        for name in &server.allowed_hosts {
            if !is_host_name(name) {
                self.error(
                    &sp.key("allowed_hosts"),
                    format!(
                        "{name:?} is not a host name or IP address; list the names clients use for the control listener, without scheme or port, such as \"lender1.lan\""
                    ),
                );
            }
        }

        let mut seen: HashMap<&str, KeyPath> = HashMap::new();
        for (i, token) in server.tokens.iter().enumerate() {
            let tp = sp.key("token").elem(i, Some(&token.name));
            let np = tp.key("name");
            if token.name.is_empty() {
                self.error(
                    &np,
                    "missing: every token needs a name (it appears in the audit log)",
                );
            } else if let Some(first) = seen.get(token.name.as_str()) {
                let first = first.shown().to_owned();
                self.error(
                    &np,
                    format!("duplicate token name {:?}; {first} has it too", token.name),
                );
            } else {
                seen.insert(&token.name, tp.clone());
            }
            if token.scopes.is_empty() {
                self.error(
                    &tp.key("scopes"),
                    "no scopes: give at least one of \"read\", \"owner\", \"admin\"",
                );
            }
            let hash_ok =
                token.sha256.len() == 64 && token.sha256.bytes().all(|b| b.is_ascii_hexdigit());
            if !hash_ok {
                const HOW: &str = "generate a token and its hash with `vacancyd token new`";
                let message = if token.sha256.is_empty() {
                    format!("missing: the token's SHA-256 as 64 hex digits; {HOW}")
                } else {
                    let non_hex = if token.sha256.chars().all(|c| c.is_ascii_hexdigit()) {
                        ""
                    } else {
                        ", some not hex digits"
                    };
                    format!(
                        "not a SHA-256: expected 64 hex digits, found {} characters{non_hex}; {HOW}",
                        token.sha256.chars().count()
                    )
                };
                self.error(&tp.key("sha256"), message);
            } else if let Some((_, what)) = PUBLIC_TOKEN_HASHES
                .iter()
                .find(|(hash, _)| hash.eq_ignore_ascii_case(&token.sha256))
            {
                self.error(
                    &tp.key("sha256"),
                    format!(
                        "{what}; make a token of your own with `vacancyd token new --name {name} --scope {scope}` and put the sha256 it prints here (or remove this [[server.token]] table)",
                        name = if token.name.is_empty() { "ops" } else { &token.name },
                        scope = [Scope::Admin, Scope::Owner, Scope::Read]
                            .into_iter()
                            .find(|s| token.scopes.contains(s))
                            .unwrap_or(Scope::Admin),
                    ),
                );
            }
        }
        listen.map(|addr| (addr, listen_path))
    }

    fn owner(&mut self, config: &Config, root: &KeyPath) {
        let owner = &config.owner;
        let op = root.key("owner");
        if owner.presence == PresenceMode::Command && owner.command.trim().is_empty() {
            self.error(
                &op.key("command"),
                "missing: presence = \"command\" needs a command (exit 0: present, 1: away); set owner.command or choose another presence",
            );
        }
        if owner.presence == PresenceMode::Windows && !cfg!(windows) {
            self.error(
                &op.key("presence"),
                "presence = \"windows\" reads the Windows console session, and this build is not for Windows; choose \"auto\" (logind on a machine with login seats, else none), \"logind\", \"manual\", \"command\" or \"none\"",
            );
        }
        let gp = op.key("gpu_pressure");
        let pressure = &owner.gpu_pressure;
        self.duration(&gp.key("poll_ms"), pressure.poll_ms, PRESSURE_POLL_MS);
        self.duration(&gp.key("engage_ms"), pressure.engage_ms, ENGAGE_MS);
        self.duration(&gp.key("quiet_ms"), pressure.quiet_ms, QUIET_MS);
        if pressure.util_threshold_pct == 0 || pressure.util_threshold_pct > 100 {
            self.error(
                &gp.key("util_threshold_pct"),
                format!(
                    "must be 1 to 100 (utilization points above the baseline), found {}",
                    pressure.util_threshold_pct
                ),
            );
        }
        if pressure.memory_threshold_mib == 0 {
            self.error(
                &gp.key("memory_threshold_mib"),
                "must be above 0 (MiB above the baseline); at 0 any allocation by the owner counts as pressure",
            );
        }
        if owner.power_supply_dir.trim().is_empty() {
            self.error(
                &op.key("power_supply_dir"),
                "must not be empty; the default is \"/sys/class/power_supply\"",
            );
        }
        if owner.on_battery != OnBattery::Pause {
            self.ignored(
                &op.key("power_supply_dir"),
                "used only with on_battery = \"pause\"",
            );
        }
    }

    /// `[lending] hours`: every window parses (issue 35 item 1).
    /// `[borrowers]` (issue 34).
    fn borrowers(&mut self, config: &Config, root: &KeyPath) {
        let Some(b) = &config.borrowers else {
            return;
        };
        let bp = root.key("borrowers");
        self.duration(
            &bp.key("batch_max_wait_s"),
            b.batch_max_wait_s,
            BATCH_MAX_WAIT_S,
        );
    }

    fn lending(&mut self, config: &Config, root: &KeyPath) {
        let Some(hours) = &config.lending.hours else {
            return;
        };
        if let Err(e) = crate::hours::Schedule::parse(hours) {
            let message = if e.index == 0 { e.why } else { format!("{e}") };
            self.error(&root.key("lending").key("hours"), message);
        }
    }

    /// A GPU's heat and power limits and its power cap (issue 35 item 3).
    fn heat_limits(&mut self, r: &ResourceConfig, rp: &KeyPath) {
        let hp = rp.key("hot_for_s");
        self.duration(&hp, r.hot_for_s, HOT_FOR_S);
        let set: Vec<&str> = [
            ("max_temperature_c", r.max_temperature_c.is_some()),
            ("resume_below_c", r.resume_below_c.is_some()),
            ("max_power_w", r.max_power_w.is_some()),
            ("max_fan_percent", r.max_fan_percent.is_some()),
            ("power_cap_w", r.power_cap_w.is_some()),
        ]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(k, _)| *k)
        .collect();
        if set.is_empty() {
            self.ignored(
                &hp,
                "used only with max_temperature_c, max_power_w or max_fan_percent",
            );
            return;
        }
        let readable = r.kind == ResourceKind::Gpu
            && matches!(r.sampler, SamplerKind::Amdgpu | SamplerKind::Nvml);
        if !readable {
            for key in &set {
                self.error(
                    &rp.key(key),
                    format!(
                        "heat and power limits need a GPU read by sampler = \"amdgpu\" or \"nvml\" (this resource is kind = \"{}\", sampler = \"{}\"): no other sampler reads a temperature, power or fan",
                        r.kind.as_str(),
                        r.sampler
                    ),
                );
            }
            return;
        }
        for (key, value, max, what) in [
            (
                "max_temperature_c",
                r.max_temperature_c,
                150,
                "degrees Celsius",
            ),
            ("resume_below_c", r.resume_below_c, 150, "degrees Celsius"),
            ("max_power_w", r.max_power_w, 5000, "watts"),
            ("power_cap_w", r.power_cap_w, 5000, "watts"),
        ] {
            if let Some(v) = value
                && !(1..=max).contains(&v)
            {
                self.error(
                    &rp.key(key),
                    format!("{v} is out of range: {what} from 1 to {max}"),
                );
            }
        }
        if let Some(f) = r.max_fan_percent
            && !(1..=100).contains(&f)
        {
            self.error(
                &rp.key("max_fan_percent"),
                format!("{f} is not a percentage from 1 to 100"),
            );
        }
        match (r.max_temperature_c, r.resume_below_c) {
            (None, Some(_)) => self.error(
                &rp.key("resume_below_c"),
                "needs max_temperature_c: it is the temperature the GPU must cool below after going above that limit",
            ),
            (Some(max), Some(resume)) if resume > max => self.error(
                &rp.key("resume_below_c"),
                format!("{resume} is above max_temperature_c = {max}; it must be at or below it (the GPU lends again only once it cools below this)"),
            ),
            (Some(max), None) if max <= super::engine_spec::DEFAULT_RESUME_MARGIN_C => self.error(
                &rp.key("max_temperature_c"),
                format!("{max} leaves no room for the default resume_below_c ({} below it); set resume_below_c", super::engine_spec::DEFAULT_RESUME_MARGIN_C),
            ),
            _ => {}
        }
    }

    fn resources(&mut self, config: &Config, root: &KeyPath) {
        let mut seen: HashMap<&str, KeyPath> = HashMap::new();
        for (i, r) in config.resources.iter().enumerate() {
            let rp = root.key("resource").elem(i, Some(&r.name));
            let np = rp.key("name");
            if self.name(&np, "resource", &r.name) {
                if let Some(first) = seen.get(r.name.as_str()) {
                    let first = first.shown().to_owned();
                    self.error(
                        &np,
                        format!("duplicate resource name {:?}; {first} has it too", r.name),
                    );
                } else {
                    seen.insert(&r.name, rp.clone());
                }
            }
            self.sampler(r, &rp);
            self.heat_limits(r, &rp);
            self.duration(&rp.key("poll_ms"), r.poll_ms, RESOURCE_POLL_MS);
            self.duration(
                &rp.key("max_sample_age_ms"),
                r.max_sample_age_ms,
                MAX_SAMPLE_AGE_MS,
            );
            if r.max_sample_age_ms > 0 && r.poll_ms > 0 && r.max_sample_age_ms < r.poll_ms {
                self.warn(
                    &rp.key("max_sample_age_ms"),
                    format!(
                        "{} ms is shorter than poll_ms ({} ms): every sample expires before the next one, so the resource is often \"capacity unknown\"",
                        r.max_sample_age_ms, r.poll_ms
                    ),
                );
            }
        }
    }

    /// Sampler and kind compatibility, and the keys each sampler needs.
    fn sampler(&mut self, r: &ResourceConfig, rp: &KeyPath) {
        let kinds: &[ResourceKind] = match r.sampler {
            SamplerKind::Nvml | SamplerKind::Amdgpu => &[ResourceKind::Gpu],
            SamplerKind::System => &[ResourceKind::Memory, ResourceKind::Cpu],
            SamplerKind::File => &[ResourceKind::Gpu, ResourceKind::Memory],
            SamplerKind::Manual => &[ResourceKind::Gpu, ResourceKind::Memory, ResourceKind::Cpu],
        };
        if r.sampler == SamplerKind::Manual && !self.engine_only {
            self.error(
                &rp.key("sampler"),
                "sampler = \"manual\" is for programs embedding the engine (Python's Config.for_engine); vacancyd needs \"nvml\", \"amdgpu\", \"system\" or \"file\"",
            );
        }
        if !kinds.contains(&r.kind) {
            let allowed: Vec<String> = kinds
                .iter()
                .map(|k| format!("\"{}\"", k.as_str()))
                .collect();
            self.error(
                &rp.key("sampler"),
                format!(
                    "sampler \"{}\" cannot measure kind \"{}\"; it needs kind {}",
                    r.sampler,
                    r.kind.as_str(),
                    allowed.join(" or ")
                ),
            );
        }
        match r.sampler {
            SamplerKind::File if r.path.trim().is_empty() => self.error(
                &rp.key("path"),
                "missing: sampler = \"file\" needs the path of a JSON file {\"free_mib\":N,\"total_mib\":N}",
            ),
            SamplerKind::Amdgpu if !is_card_name(&r.device) => self.error(
                &rp.key("device"),
                format!(
                    "{:?} is not a DRM card name; sampler = \"amdgpu\" needs one such as \"card0\" (see {}/)",
                    r.device, r.sysfs_root
                ),
            ),
            SamplerKind::Amdgpu if r.sysfs_root.trim().is_empty() => self.error(
                &rp.key("sysfs_root"),
                "must not be empty; the default is \"/sys/class/drm\"",
            ),
            SamplerKind::Nvml if r.device.trim().is_empty() => self.error(
                &rp.key("device"),
                "missing: sampler = \"nvml\" needs a device index (\"0\") or PCI bus id",
            ),
            _ => {}
        }
        if r.kind == ResourceKind::Cpu && !(1..=100).contains(&r.busy_max_pct) {
            self.error(
                &rp.key("busy_max_pct"),
                format!("{} is not a percentage from 1 to 100", r.busy_max_pct),
            );
        }
        if r.sampler != SamplerKind::File {
            self.ignored(&rp.key("path"), "used only with sampler = \"file\"");
        }
        if r.sampler != SamplerKind::Amdgpu {
            self.ignored(&rp.key("sysfs_root"), "used only with sampler = \"amdgpu\"");
            self.ignored(
                &rp.key("include_gtt"),
                "used only with sampler = \"amdgpu\"",
            );
        }
        if matches!(
            r.sampler,
            SamplerKind::System | SamplerKind::File | SamplerKind::Manual
        ) {
            self.ignored(
                &rp.key("device"),
                "used only with sampler = \"nvml\" or \"amdgpu\"",
            );
        }
        if r.kind != ResourceKind::Cpu {
            self.ignored(&rp.key("busy_max_pct"), "used only with kind = \"cpu\"");
        }
    }

    /// `adapter`: a registered kind, and that kind's own settings.
    fn adapter_kind(&mut self, u: &UpstreamConfig, up: &KeyPath) {
        let ap = up.key("adapter");
        let name = u.adapter.as_str();
        let Some(kinds) = self.kinds else {
            if name.is_empty() {
                self.error(&ap, "missing: name the adapter kind, such as \"openai\"");
            }
            return;
        };
        let names = kinds.names();
        if !names.iter().any(|n| n == name) {
            let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
            let suggestion = names
                .iter()
                .map(|n| (super::parse::edit_distance(name, n), n))
                .filter(|(d, n)| *d <= 2 && *d < n.len())
                .min_by_key(|(d, _)| *d)
                .map(|(_, n)| format!(" (did you mean {n:?}?)"))
                .unwrap_or_default();
            self.error(
                &ap,
                format!(
                    "unknown adapter {name:?}{suggestion}; registered adapters: {}",
                    if quoted.is_empty() {
                        "none".to_owned()
                    } else {
                        quoted.join(", ")
                    }
                ),
            );
            return;
        }
        let sp = up.key("adapter_settings");
        for problem in kinds.check_settings(u) {
            let base = if problem.in_upstream { up } else { &sp };
            let path = problem
                .key
                .split('.')
                .filter(|k| !k.is_empty())
                .fold(base.clone(), |p, k| p.key(k));
            self.error(&path, problem.message);
        }
    }

    // Long: one short check per [[upstream]] key, in docs/config.md's order, all into one error list.
    fn upstreams(
        &mut self,
        config: &Config,
        root: &KeyPath,
        server_listen: Option<(SocketAddr, KeyPath)>,
    ) {
        if config.upstreams.is_empty() {
            self.warn(root, "no [[upstream]] is configured: nothing is lent");
        }
        let mut names: HashMap<&str, KeyPath> = HashMap::new();
        let mut listens: Vec<(SocketAddr, KeyPath)> = server_listen.into_iter().collect();
        for (i, u) in config.upstreams.iter().enumerate() {
            let up = root.key("upstream").elem(i, Some(&u.name));
            let np = up.key("name");
            if self.name(&np, "upstream", &u.name) {
                if let Some(first) = names.get(u.name.as_str()) {
                    let first = first.shown().to_owned();
                    self.error(
                        &np,
                        format!("duplicate upstream name {:?}; {first} has it too", u.name),
                    );
                } else {
                    names.insert(&u.name, up.clone());
                }
            }

            let lp = up.key("listen");
            if u.listen.is_empty() && self.engine_only {
                // An embedded engine has no listeners.
            } else if u.listen.is_empty() {
                self.error(
                    &lp,
                    format!("missing: where borrowers connect; {LISTEN_FORM}"),
                );
            } else if let Some(addr) = self.listen(&lp, &u.listen) {
                if let Some((other, op)) = listens
                    .iter()
                    .find(|(other, _)| listens_overlap(addr, *other))
                {
                    let whose = if self.index.has(op) {
                        let line = self.index.line(op).map(|l| format!(" (line {l})"));
                        format!("{}{}", op.shown(), line.unwrap_or_default())
                    } else {
                        format!("{} (its default)", op.shown())
                    };
                    let message = if addr == *other {
                        format!(
                            "{addr} is already used by {whose}; every listener needs its own address"
                        )
                    } else {
                        format!(
                            "{addr} overlaps {other}, already used by {whose}; every listener needs its own address"
                        )
                    };
                    self.error(&lp, message);
                } else {
                    listens.push((addr, lp.clone()));
                }
            }

            let tp = up.key("target");
            if u.target.is_empty() && self.engine_only {
                // An embedded engine forwards nothing.
            } else if u.target.is_empty() {
                self.error(
                    &tp,
                    "missing: the real server's base URL, such as \"http://127.0.0.1:11434\"",
                );
            } else if let Err(why) = parse_target(&u.target) {
                self.error(&tp, why);
            }

            self.upstream_resources(config, u, &up);

            for model in u.models.keys().filter(|m| m.is_empty()) {
                self.error(
                    &up.key("models").key(model),
                    "empty model name; keys are the exact model names requests carry",
                );
            }
            self.duration(
                &up.key("drain_timeout_s"),
                u.drain_timeout_s,
                DRAIN_TIMEOUT_S,
            );
            self.duration(
                &up.key("completion_timeout_s"),
                u.completion_timeout_s,
                COMPLETION_TIMEOUT_S,
            );
            self.duration(
                &up.key("stop_proof_timeout_s"),
                u.stop_proof_timeout_s,
                STOP_PROOF_TIMEOUT_S,
            );
            // The kind checks its own settings, `[upstream.voice_routes]`
            // included (the chatterbox adapter's; issue 30).
            self.adapter_kind(u, &up);
            if let Some(q) = &u.queue {
                let qp = up.key("queue");
                if q.max_waiting == 0 {
                    self.error(
                        &qp.key("max_waiting"),
                        "must be above 0 (requests that may wait at once); remove [upstream.queue] to turn the line off",
                    );
                }
                self.duration(&qp.key("max_wait_s"), q.max_wait_s, MAX_WAIT_S);
            }
            if let Some(c) = &u.credential {
                let cp = up.key("credential");
                if c.value_file.trim().is_empty() {
                    self.error(
                        &cp.key("value_file"),
                        "missing: the file holding the header's value (keep the secret out of this file)",
                    );
                }
                if http::HeaderName::from_bytes(c.header.as_bytes()).is_err() {
                    self.error(
                        &cp.key("header"),
                        format!(
                            "{:?} is not a valid HTTP header name, such as \"Authorization\"",
                            c.header
                        ),
                    );
                }
            }
        }
    }

    /// `resource`, `also_requires` and `requirements` of one upstream.
    fn upstream_resources(&mut self, config: &Config, u: &UpstreamConfig, up: &KeyPath) {
        let known: Vec<&str> = config.resources.iter().map(|r| r.name.as_str()).collect();
        let unknown = |name: &str| {
            format!(
                "unknown resource {name:?}; define it in a [[resource]] table (configured: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            )
        };
        let rp = up.key("resource");
        if u.resource.is_empty() {
            self.error(
                &rp,
                "missing: the primary resource this upstream borrows, a [[resource]] name",
            );
        } else if !known.contains(&u.resource.as_str()) {
            self.error(&rp, unknown(&u.resource));
        }

        let ap = up.key("also_requires");
        for (j, extra) in u.also_requires.iter().enumerate() {
            if *extra == u.resource {
                self.error(
                    &ap,
                    format!(
                        "{extra:?} is already the primary resource; remove it from also_requires"
                    ),
                );
            } else if u.also_requires[..j].contains(extra) {
                self.error(&ap, format!("{extra:?} is listed twice"));
            } else if !known.contains(&extra.as_str()) {
                self.error(&ap, unknown(extra));
            }
        }

        for name in u.requirements.keys() {
            let qp = up.key("requirements").key(name);
            if *name == u.resource {
                self.error(
                    &qp,
                    format!(
                        "{name:?} is the primary resource; set its requirement with default_min_free_mib (or per model in [upstream.models])"
                    ),
                );
            } else if !u.also_requires.contains(name) {
                let message = if known.contains(&name.as_str()) {
                    format!(
                        "{name:?} is not in also_requires; add it there or remove this requirement"
                    )
                } else {
                    unknown(name)
                };
                self.error(&qp, message);
            }
        }
    }

    /// CFG-01 and SCOPE-10: upstreams that reach one server.
    fn same_servers(&mut self, config: &Config, root: &KeyPath) {
        let mut groups: BTreeMap<(String, u16), Vec<usize>> = BTreeMap::new();
        for (i, u) in config.upstreams.iter().enumerate() {
            if let Some(key) = same_server_key(&u.target) {
                groups.entry(key).or_default().push(i);
            }
        }
        let path = |i: usize| {
            root.key("upstream")
                .elem(i, config.upstreams.get(i).map(|u| u.name.as_str()))
        };
        for members in groups.values() {
            let Some((&first, rest)) = members.split_first() else {
                continue;
            };
            let a = &config.upstreams[first];
            let a_set: BTreeSet<&str> = a.resource_names().collect();
            for &j in rest {
                let b = &config.upstreams[j];
                let b_set: BTreeSet<&str> = b.resource_names().collect();
                if a_set != b_set {
                    // CFG-01
                    self.error(
                        &path(j).key("resource"),
                        format!(
                            "target {:?} reaches the same server as {:?}'s {:?}, but borrows {} where {:?} borrows {}; unloading acts on the whole server, so upstreams of one server must borrow the same resources (CFG-01): give both the same resource and also_requires, or point them at different servers",
                            b.target,
                            a.name,
                            a.target,
                            set_text(&b_set),
                            a.name,
                            set_text(&a_set),
                        ),
                    );
                }
            }
            // SCOPE-10: an exempt upstream needs its own server.
            let host_scoped = members
                .iter()
                .copied()
                .find(|&i| config.upstreams[i].owner_scope == OwnerScope::Host);
            if let Some(h) = host_scoped {
                let host = &config.upstreams[h];
                for &e in members {
                    let exempt = &config.upstreams[e];
                    if exempt.owner_scope == OwnerScope::Resource {
                        self.error(
                            &path(e).key("owner_scope"),
                            format!(
                                "owner_scope = \"resource\", but target {:?} reaches the same server as host-scoped {:?} ({:?}); owner-return reclaim can affect both, so an owner-exempt upstream needs its own server (SCOPE-10): run a separate server instance for it, or make both host-scoped",
                                exempt.target, host.name, host.target
                            ),
                        );
                    }
                }
            }
        }
    }

    /// SCOPE-19: dependencies of an exempt upstream that no pressure
    /// measurement watches. (Which upstreams are exempt is a fact, not a
    /// warning: [`Config::exemption_line`], SCOPE-18.)
    fn exemptions(&mut self, config: &Config, root: &KeyPath) {
        let pressure = config.owner.gpu_pressure.enabled;
        for (i, u) in config.upstreams.iter().enumerate() {
            if u.owner_scope != OwnerScope::Resource {
                continue;
            }
            let up = root.key("upstream").elem(i, Some(&u.name));
            for name in u.resource_names() {
                let Some(r) = config.resource(name) else {
                    continue;
                };
                let watched =
                    pressure && r.kind == ResourceKind::Gpu && r.sampler == SamplerKind::Nvml;
                if !watched {
                    let why = match r.kind {
                        ResourceKind::Gpu if !pressure => {
                            "GPU pressure is off ([owner.gpu_pressure] enabled = false)"
                        }
                        ResourceKind::Gpu => "attributed GPU pressure needs sampler = \"nvml\"",
                        _ => "only GPUs have a pressure measurement",
                    };
                    self.warn(
                        &up.key("owner_scope"),
                        format!(
                            "owner-exempt, but nothing measures the owner's use of {name:?} ({why}): accepted work keeps it while the owner competes for it (SCOPE-19)"
                        ),
                    );
                }
            }
        }
    }
}

fn set_text(set: &BTreeSet<&str>) -> String {
    let names: Vec<String> = set.iter().map(|n| format!("{n:?}")).collect();
    format!("{{{}}}", names.join(", "))
}

/// A DNS name (letters, digits, `-` and `.`) or an IP address (IPv6 with
/// or without brackets): what `[server] allowed_hosts` lists.
fn is_host_name(name: &str) -> bool {
    let bare = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name);
    let dns = name.strip_suffix('.').unwrap_or(name);
    bare.parse::<std::net::IpAddr>().is_ok()
        || (!dns.is_empty()
            && dns.len() <= 253
            && dns
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            && dns.split('.').all(|label| !label.is_empty()))
}

/// `card0`, `card12`: a DRM card directory name.
fn is_card_name(device: &str) -> bool {
    device
        .strip_prefix("card")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether two listen addresses cannot both be bound. Port 0 (an ephemeral
/// port, as tests use) never conflicts; an unspecified address conflicts with
/// every address of its family on the same port (IPv6 `::` with IPv4 too,
/// as on a dual-stack host).
fn listens_overlap(a: SocketAddr, b: SocketAddr) -> bool {
    if a.port() == 0 || a.port() != b.port() {
        return false;
    }
    let covers = |x: SocketAddr, y: SocketAddr| {
        x.ip().is_unspecified() && (x.is_ipv6() || x.is_ipv4() == y.is_ipv4())
    };
    a.ip() == b.ip() || covers(a, b) || covers(b, a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_names() {
        assert!(is_card_name("card0"));
        assert!(is_card_name("card12"));
        assert!(!is_card_name("0"));
        assert!(!is_card_name("card"));
        assert!(!is_card_name("cardX"));
    }

    #[test]
    fn listen_overlap_rules() {
        let a = |s: &str| {
            s.parse::<SocketAddr>()
                .ok()
                .unwrap_or_else(|| panic!("{s}"))
        };
        assert!(listens_overlap(a("127.0.0.1:80"), a("127.0.0.1:80")));
        assert!(listens_overlap(a("0.0.0.0:80"), a("127.0.0.1:80")));
        assert!(listens_overlap(a("[::]:80"), a("127.0.0.1:80")));
        assert!(!listens_overlap(a("0.0.0.0:80"), a("[::1]:80")));
        assert!(!listens_overlap(a("127.0.0.1:80"), a("127.0.0.1:81")));
        assert!(!listens_overlap(a("127.0.0.1:80"), a("127.0.0.2:80")));
        assert!(!listens_overlap(a("127.0.0.1:0"), a("127.0.0.1:0")));
    }
}
