//! Tests of the whole configuration pipeline: parse, validate, report.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use super::*;
use crate::ResourceKind;

const ORIGIN: &str = "test.toml";

fn ok(text: &str) -> LoadedConfig {
    Config::parse(text, ORIGIN).unwrap_or_else(|e| panic!("expected a valid config, got:\n{e}"))
}

fn errors(text: &str) -> Vec<ConfigError> {
    match Config::parse(text, ORIGIN) {
        Ok(loaded) => panic!("expected errors, the config parsed: {loaded:?}"),
        Err(e) => {
            assert_eq!(e.origin, ORIGIN);
            assert!(!e.errors.is_empty());
            e.errors
        }
    }
}

/// The one error whose path is `path`; its message must contain every fragment.
fn find<'a>(errors: &'a [ConfigError], path: &str, fragments: &[&str]) -> &'a ConfigError {
    let found: Vec<&ConfigError> = errors.iter().filter(|e| e.path == path).collect();
    assert_eq!(
        found.len(),
        1,
        "want one error at {path:?}, got:\n{}",
        list(errors)
    );
    for fragment in fragments {
        assert!(
            found[0].message.contains(fragment),
            "error at {path:?} lacks {fragment:?}: {}",
            found[0]
        );
    }
    found[0]
}

fn list<T: std::fmt::Display>(items: &[T]) -> String {
    items.iter().map(|e| format!("  {e}\n")).collect()
}

/// The 1-based line of the first occurrence of `needle` in `text`.
fn line_of(text: &str, needle: &str) -> usize {
    let at = text
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in text"));
    text[..at].matches('\n').count() + 1
}

/// Three file-sampled resources: gpu0, gpu1 (kind gpu) and ram (memory).
const RESOURCES: &str = r#"
[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "/run/gpu0.json"

[[resource]]
name = "gpu1"
kind = "gpu"
sampler = "file"
path = "/run/gpu1.json"

[[resource]]
name = "ram"
"#;

/// An `[[upstream]]` table.
fn upstream(
    name: &str,
    port: u16,
    target: &str,
    resource: &str,
    also: &[&str],
    extra: &str,
) -> String {
    let also: Vec<String> = also.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "\n[[upstream]]\nname = {name:?}\nlisten = \"127.0.0.1:{port}\"\ntarget = {target:?}\nresource = {resource:?}\nalso_requires = [{}]\n{extra}\n",
        also.join(", ")
    )
}

fn with(upstreams: &[String]) -> String {
    format!("{RESOURCES}{}", upstreams.concat())
}

// ---------------------------------------------------------------------------
// Defaults

#[test]
fn empty_file_gives_every_top_level_default() {
    let loaded = ok("");
    let c = &loaded.config;
    assert_eq!(*c, Config::default());
    assert_eq!(c.server.listen, "127.0.0.1:7480");
    assert_eq!(c.server.admission_state_dir, "");
    assert!(c.server.lending);
    assert!(c.server.tokens.is_empty());
    assert_eq!(c.owner.presence, PresenceMode::Auto);
    assert_eq!(c.owner.command, "");
    assert!(!c.owner.remote_sessions_count);
    assert!(!c.owner.gpu_pressure.enabled);
    assert_eq!(c.owner.gpu_pressure.poll_ms, 2000);
    assert!(c.resources.is_empty());
    assert!(c.upstreams.is_empty());
    // Valid, but worth saying.
    assert_eq!(loaded.warnings.len(), 1);
    assert!(loaded.warnings[0].message.contains("nothing is lent"));
}

#[test]
fn resource_defaults() {
    let c = ok("[[resource]]\nname = \"ram\"\n").config;
    let r = &c.resources[0];
    assert_eq!(r.name, "ram");
    assert_eq!(r.kind, ResourceKind::Memory);
    assert_eq!(r.sampler, SamplerKind::System);
    assert_eq!(r.device, "0");
    assert_eq!(r.path, "");
    assert_eq!(r.reserve_mib, 0);
    assert!(r.enabled);
    assert_eq!(r.poll_ms, 1000);
    assert_eq!(r.max_sample_age_ms, 5000);
    assert_eq!(r.busy_max_pct, 90);
    assert_eq!(r.sysfs_root, "/sys/class/drm");
    assert!(!r.include_gtt);
    assert_eq!(
        *r,
        ResourceConfig {
            name: "ram".into(),
            ..ResourceConfig::default()
        }
    );
}

#[test]
fn upstream_defaults() {
    let text = format!(
        "{RESOURCES}\n[[upstream]]\nname = \"u\"\nlisten = \"127.0.0.1:9000\"\ntarget = \"http://127.0.0.1:9001\"\nresource = \"ram\"\n"
    );
    let c = ok(&text).config;
    let u = &c.upstreams[0];
    assert_eq!(u.adapter, AdapterKind::OPENAI);
    assert!(u.also_requires.is_empty());
    assert_eq!(u.default_min_free_mib, 0);
    assert_eq!(u.resident_min_free_mib, 0);
    assert_eq!(u.management, Management::Deny);
    assert_eq!(u.owner_scope, OwnerScope::Host);
    assert_eq!(u.on_owner_return, OnOwnerReturn::Drain);
    assert_eq!(u.drain_timeout_s, 30);
    assert!(!u.yield_on_veto);
    assert_eq!(u.completion_timeout_s, 3600);
    assert_eq!(u.on_borrower_disconnect, OnBorrowerDisconnect::Drain);
    assert!(u.models.is_empty());
    assert!(u.requirements.is_empty());
    assert_eq!(u.credential, None);
    assert_eq!(
        *u,
        UpstreamConfig {
            name: "u".into(),
            listen: "127.0.0.1:9000".into(),
            target: "http://127.0.0.1:9001".into(),
            resource: "ram".into(),
            ..UpstreamConfig::default()
        }
    );
}

#[test]
fn nested_table_defaults() {
    let text = with(&[upstream(
        "u",
        9000,
        "http://127.0.0.1:9001",
        "gpu0",
        &["ram"],
        "[upstream.models]\n\"m\" = {}\n[upstream.requirements]\nram = {}\n[upstream.credential]\nvalue_file = \"/etc/c\"\n",
    )]);
    let c = ok(&text).config;
    let u = &c.upstreams[0];
    assert_eq!(u.models["m"], ModelRequirement::default());
    assert_eq!(u.models["m"].min_free_mib, None);
    assert_eq!(u.models["m"].resident_min_free_mib, None);
    assert_eq!(u.requirements["ram"].min_free_mib, 0);
    let cred = u.credential.as_ref().unwrap();
    assert_eq!(cred.header, "Authorization");
    assert_eq!(cred.value_file, "/etc/c");
    assert_eq!(CredentialConfig::default().header, "Authorization");
    assert_eq!(TokenConfig::default().scopes, Vec::<Scope>::new());
    assert_eq!(Scope::default(), Scope::Read);
    assert_eq!(AdapterKind::default(), AdapterKind::OPENAI);
    assert_eq!(SamplerKind::default(), SamplerKind::System);
    assert_eq!(PresenceMode::default(), PresenceMode::Auto);
    assert_eq!(GpuPressureConfig::default().poll_ms, 2000);
}

#[test]
fn model_requirements_fall_back_to_upstream_values() {
    // MEM-06, RES-01
    let text = with(&[upstream(
        "u",
        9000,
        "http://127.0.0.1:9001",
        "gpu0",
        &[],
        "default_min_free_mib = 4000\nresident_min_free_mib = 100\n[upstream.models]\n\"big\" = { min_free_mib = 9000 }\n\"warm\" = { resident_min_free_mib = 7 }\n",
    )]);
    let c = ok(&text).config;
    let u = &c.upstreams[0];
    assert_eq!(u.model_min_free_mib(Some("big")), 9000);
    assert_eq!(u.model_min_free_mib(Some("warm")), 4000);
    assert_eq!(u.model_min_free_mib(Some("other")), 4000);
    assert_eq!(u.model_min_free_mib(None), 4000);
    assert_eq!(u.model_resident_min_free_mib(Some("big")), 100);
    assert_eq!(u.model_resident_min_free_mib(Some("warm")), 7);
    assert_eq!(u.resource_names().collect::<Vec<_>>(), ["gpu0"]);
}

#[test]
fn enum_names_round_trip() {
    for a in [
        "ollama",
        "comfyui",
        "llamacpp",
        "openai",
        "chatterbox",
        "vllm",
    ] {
        let text = format!("[[upstream]]\nadapter = \"{a}\"\n");
        let parsed = super::parse::parse(&text).ok().unwrap();
        assert_eq!(parsed.config.upstreams[0].adapter, AdapterKind::new(a));
        assert_eq!(parsed.config.upstreams[0].adapter.to_string(), a);
    }
    assert_eq!(PresenceMode::ALL.len(), 6);
    assert_eq!(PresenceMode::Windows.as_str(), "windows");
    assert_eq!(OnOwnerReturn::Finish.as_str(), "finish");
    assert_eq!(OnBorrowerDisconnect::Cut.as_str(), "cut");
    assert_eq!(Management::Allow.as_str(), "allow");
    assert_eq!(OwnerScope::Resource.as_str(), "resource");
    assert_eq!(SamplerKind::Amdgpu.as_str(), "amdgpu");
}

#[test]
fn scopes_imply_lower_scopes() {
    assert!(Scope::Admin.implies(Scope::Owner));
    assert!(Scope::Admin.implies(Scope::Read));
    assert!(Scope::Owner.implies(Scope::Read));
    assert!(!Scope::Owner.implies(Scope::Admin));
    assert!(!Scope::Read.implies(Scope::Owner));
    let t = TokenConfig {
        scopes: vec![Scope::Owner],
        ..TokenConfig::default()
    };
    assert!(t.grants(Scope::Read));
    assert!(!t.grants(Scope::Admin));
}

// ---------------------------------------------------------------------------
// Parse errors: all at once, each with path and line

#[test]
fn unknown_keys_in_three_tables_reported_at_once_with_lines() {
    let text = r#"
[server]
lisen = "127.0.0.1:7480"

[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "/run/gpu0.json"
reserve_mb = 10

[[upstream]]
name = "ollama"
listen = "127.0.0.1:11435"
target = "http://127.0.0.1:11434"
resource = "gpu0"

[upstream.models]
"llama3.1:8b" = { min_free_mib = 6000, resident_min_fre_mib = 10 }
"#;
    let errs = errors(text);
    assert_eq!(errs.len(), 3, "{}", list(&errs));
    let e = find(
        &errs,
        "server.lisen",
        &[
            "unknown key",
            "did you mean \"listen\"",
            "admission_state_dir",
        ],
    );
    assert_eq!(e.line, Some(line_of(text, "lisen")));
    let e = find(
        &errs,
        "resource[0] (\"gpu0\").reserve_mb",
        &["did you mean \"reserve_mib\""],
    );
    assert_eq!(e.line, Some(line_of(text, "reserve_mb")));
    let e = find(
        &errs,
        "upstream[0] (\"ollama\").models.\"llama3.1:8b\".resident_min_fre_mib",
        &["unknown key", "resident_min_free_mib"],
    );
    assert_eq!(e.line, Some(line_of(text, "resident_min_fre_mib")));
    // Ordered by line.
    assert!(errs.windows(2).all(|w| w[0].line <= w[1].line));
}

#[test]
fn unknown_keys_everywhere() {
    let text = r#"
bogus = 1
[server]
x1 = 1
[[server.token]]
x2 = 1
[owner]
x3 = 1
[owner.gpu_pressure]
x4 = 1
[[upstream]]
x5 = 1
[upstream.requirements]
ram = { x6 = 1 }
[upstream.credential]
x7 = 1
"#;
    let all = errors(text);
    // The semantic problems of the rest (missing names, ...) come with them.
    let errs: Vec<ConfigError> = all
        .iter()
        .filter(|e| e.message.starts_with("unknown key"))
        .cloned()
        .collect();
    let lines: Vec<usize> = errs.iter().filter_map(|e| e.line).collect();
    let want: Vec<usize> = ["bogus", "x1", "x2", "x3", "x4", "x5", "x6", "x7"]
        .iter()
        .map(|k| line_of(text, k))
        .collect();
    assert_eq!(lines, want, "{}", list(&all));
    find(&all, "upstream[0].name", &["missing"]);
    find(&errs, "bogus", &["server, owner, resource, upstream"]);
    find(&errs, "server.token[0].x2", &["name, scopes, sha256"]);
    find(&errs, "owner.gpu_pressure.x4", &["enabled, poll_ms"]);
    find(&errs, "upstream[0].requirements.ram.x6", &["min_free_mib"]);
    find(&errs, "upstream[0].credential.x7", &["header, value_file"]);
}

// Issue 14 item 11: an unknown key has no effect, so it must not hide the
// semantic problems of the rest of the file.
#[test]
fn unknown_keys_and_semantic_problems_are_reported_in_one_run() {
    let text = format!(
        "[server]\nlisen = \"127.0.0.1:7480\"\n{RESOURCES}{}{}{}",
        upstream(
            "a",
            9000,
            "http://127.0.0.1:11434",
            "gpu0",
            &["gpu7"],
            "colour = 1"
        ),
        upstream("b", 9001, "http://localhost:11434", "gpu1", &[], ""),
        upstream("c", 9002, "127.0.0.1:8080", "ram", &[], ""),
    );
    let errs = errors(&text);
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "server.lisen",                      // unknown key
            "upstream[0] (\"a\").also_requires", // undefined resource
            "upstream[0] (\"a\").colour",        // unknown key
            "upstream[1] (\"b\").resource",      // CFG-01
            "upstream[2] (\"c\").target",        // no scheme
        ],
        "{}",
        list(&errs)
    );
    find(
        &errs,
        "server.lisen",
        &["unknown key", "did you mean \"listen\""],
    );
    find(&errs, "upstream[1] (\"b\").resource", &["CFG-01"]);
    assert!(errs.iter().all(|e| e.line.is_some()), "{}", list(&errs));
    assert!(errs.windows(2).all(|w| w[0].line <= w[1].line));
}

// Issue 14 item 11: a value that does not parse still stops the semantic
// checks (nothing sound is left to check), and still names its key and line.
#[test]
fn a_bad_value_is_reported_with_the_unknown_keys_and_stops_the_semantic_checks() {
    let text = format!(
        "[server]\nlisen = 1\n{RESOURCES}{}",
        upstream(
            "a",
            9000,
            "http://127.0.0.1:11434",
            "gpu0",
            &["gpu7"],
            "management = \"alow\""
        ),
    );
    let errs = errors(&text);
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        ["server.lisen", "upstream[0] (\"a\").management"],
        "{}",
        list(&errs)
    );
    let e = find(
        &errs,
        "upstream[0] (\"a\").management",
        &["unknown value \"alow\""],
    );
    assert_eq!(e.line, Some(line_of(&text, "alow")));
}

/// A registry of two kinds; `vllm` takes one setting, `sleep_level`, 1 or 2.
struct TwoKinds;

impl super::AdapterKinds for TwoKinds {
    fn names(&self) -> Vec<String> {
        vec!["ollama".to_owned(), "vllm".to_owned()]
    }
    fn check_settings(&self, u: &UpstreamConfig) -> Vec<super::SettingProblem> {
        let mut problems = Vec::new();
        for (key, value) in &u.adapter_settings {
            match (key.as_str(), value.as_integer()) {
                ("sleep_level", Some(1 | 2)) => {}
                ("sleep_level", _) => {
                    problems.push(super::SettingProblem::new("sleep_level", "must be 1 or 2"))
                }
                (other, _) => {
                    problems.push(super::SettingProblem::new(other, "unknown setting"));
                }
            }
        }
        problems
    }
}

#[test]
fn an_unregistered_adapter_kind_names_key_line_and_the_registered_kinds() {
    let text = with(&[upstream(
        "a",
        9000,
        "http://127.0.0.1:11434",
        "gpu0",
        &[],
        "adapter = \"olama\"",
    )]);
    // Without a registry any kind parses; the daemon always passes its own.
    ok(&text);
    let errs = Config::parse_with(&text, ORIGIN, &TwoKinds)
        .unwrap_err()
        .errors;
    assert_eq!(errs.len(), 1, "{}", list(&errs));
    let e = find(
        &errs,
        "upstream[0] (\"a\").adapter",
        &[
            "unknown adapter \"olama\" (did you mean \"ollama\"?)",
            "registered adapters: \"ollama\", \"vllm\"",
        ],
    );
    assert_eq!(e.line, Some(line_of(&text, "olama")));
}

#[test]
fn a_registered_kind_checks_its_own_settings_with_key_and_line() {
    let text = with(&[upstream(
        "v",
        9000,
        "http://127.0.0.1:8000",
        "gpu0",
        &[],
        "adapter = \"vllm\"\n[upstream.adapter_settings]\nsleep_level = 3\nwake = true\n",
    )]);
    let errs = Config::parse_with(&text, ORIGIN, &TwoKinds)
        .unwrap_err()
        .errors;
    assert_eq!(errs.len(), 2, "{}", list(&errs));
    let e = find(
        &errs,
        "upstream[0] (\"v\").adapter_settings.sleep_level",
        &["must be 1 or 2"],
    );
    assert_eq!(e.line, Some(line_of(&text, "sleep_level")));
    let e = find(
        &errs,
        "upstream[0] (\"v\").adapter_settings.wake",
        &["unknown setting"],
    );
    assert_eq!(e.line, Some(line_of(&text, "wake = true")));
    let fixed = text.replace("sleep_level = 3\nwake = true\n", "sleep_level = 2\n");
    let loaded = Config::parse_with(&fixed, ORIGIN, &TwoKinds).unwrap();
    let u = &loaded.config.upstreams[0];
    assert_eq!(u.adapter, AdapterKind::new("vllm"));
    assert_eq!(u.adapter_settings["sleep_level"].as_integer(), Some(2));
}

#[test]
fn bad_enum_values_list_the_allowed_values() {
    let text = r#"
[owner]
presence = "sometimes"

[[server.token]]
name = "ops"
scopes = ["read", "root"]

[[upstream]]
name = "u"
management = "maybe"
"#;
    let errs = errors(text);
    assert_eq!(errs.len(), 3, "{}", list(&errs));
    let e = find(
        &errs,
        "owner.presence",
        &[
            "\"sometimes\"",
            "\"auto\", \"logind\", \"manual\", \"command\", \"none\", \"windows\"",
        ],
    );
    assert_eq!(e.line, Some(line_of(text, "sometimes")));
    find(
        &errs,
        "server.token[0] (\"ops\").scopes",
        &["\"root\"", "\"read\", \"owner\", \"admin\""],
    );
    find(
        &errs,
        "upstream[0] (\"u\").management",
        &["\"maybe\"", "\"deny\", \"allow\""],
    );
}

#[test]
fn type_errors_name_the_expected_type() {
    let text = r#"
[server]
listen = 7480
lending = "yes"

[[resource]]
name = "r"
reserve_mib = "lots"
busy_max_pct = 300
poll_ms = -5
kind = 1

[[upstream]]
name = "u"
also_requires = "ram"
drain_timeout_s = 1.5
"#;
    let errs = errors(text);
    assert_eq!(errs.len(), 8, "{}", list(&errs));
    let e = find(&errs, "server.listen", &["expected a string", "7480"]);
    assert_eq!(e.line, Some(line_of(text, "7480")));
    find(&errs, "server.lending", &["expected a boolean"]);
    find(
        &errs,
        "resource[0] (\"r\").reserve_mib",
        &["expected a non-negative integer", "lots"],
    );
    find(
        &errs,
        "resource[0] (\"r\").busy_max_pct",
        &["from 0 to 255", "300"],
    );
    find(
        &errs,
        "resource[0] (\"r\").poll_ms",
        &["non-negative integer", "-5"],
    );
    find(&errs, "resource[0] (\"r\").kind", &["expected a string"]);
    find(
        &errs,
        "upstream[0] (\"u\").also_requires",
        &["expected an array"],
    );
    find(
        &errs,
        "upstream[0] (\"u\").drain_timeout_s",
        &["non-negative integer"],
    );
}

#[test]
fn wrong_table_shapes_are_type_errors() {
    let text = r#"
[server.token]
name = "single table, not an array of tables"

[[upstream]]
name = "u"
credential = "secret"

[upstream.models]
"m" = 5
"#;
    let errs = errors(text);
    assert_eq!(errs.len(), 3, "{}", list(&errs));
    find(
        &errs,
        "server.token",
        &["expected an array", "[[server.token]]"],
    );
    find(
        &errs,
        "upstream[0] (\"u\").credential",
        &["expected a table"],
    );
    let e = find(&errs, "upstream[0] (\"u\").models.m", &["expected a table"]);
    assert_eq!(e.line, Some(line_of(text, "\"m\" = 5")));
}

#[test]
fn syntax_errors_are_all_reported_with_lines() {
    let text = "[server]\nlisten = \n\n[owner]\npresence = none\nx = 'unterminated\n";
    let errs = errors(text);
    let lines: BTreeSet<usize> = errs.iter().filter_map(|e| e.line).collect();
    assert_eq!(lines, BTreeSet::from([2, 5, 6]), "{}", list(&errs));
    assert!(errs.iter().all(|e| e.message.starts_with("invalid TOML")));
    // At most one error per line.
    assert_eq!(lines.len(), errs.len());
}

#[test]
fn duplicate_key_is_a_syntax_error() {
    let errs = errors("[server]\nlisten = \"127.0.0.1:1\"\nlisten = \"127.0.0.1:2\"\n");
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].line, Some(3));
}

// ---------------------------------------------------------------------------
// Semantic checks

#[test]
fn missing_required_values_name_the_key() {
    let text = "[[resource]]\nkind = \"memory\"\n\n[[upstream]]\nname = \"u\"\n\n[[upstream]]\nlisten = \"127.0.0.1:9\"\n";
    let errs = errors(text);
    let e = find(&errs, "resource[0].name", &["missing"]);
    assert_eq!(e.line, Some(1), "falls back to the table's line");
    find(
        &errs,
        "upstream[0] (\"u\").listen",
        &["missing", "127.0.0.1:11435"],
    );
    find(&errs, "upstream[0] (\"u\").target", &["missing"]);
    find(&errs, "upstream[0] (\"u\").resource", &["missing"]);
    let e = find(&errs, "upstream[1].name", &["missing"]);
    assert_eq!(e.line, Some(7));
    find(&errs, "upstream[1].target", &["missing"]);
}

#[test]
fn names_must_be_simple() {
    let errs = errors("[[resource]]\nname = \"my gpu\"\n[[upstream]]\nname = \"a/b\"\n");
    find(
        &errs,
        "resource[0] (\"my gpu\").name",
        &["not a valid resource name"],
    );
    find(
        &errs,
        "upstream[0] (\"a/b\").name",
        &["not a valid upstream name"],
    );
}

#[test]
fn duplicate_names_are_rejected() {
    let text = format!(
        "{RESOURCES}\n[[resource]]\nname = \"ram\"\n{}{}\n[[server.token]]\nname = \"t\"\nscopes = [\"read\"]\nsha256 = \"{h}\"\n[[server.token]]\nname = \"t\"\nscopes = [\"read\"]\nsha256 = \"{h}\"\n",
        upstream("u", 9000, "http://127.0.0.1:9001", "ram", &[], ""),
        upstream("u", 9002, "http://127.0.0.1:9003", "ram", &[], ""),
        h = "a".repeat(64),
    );
    let errs = errors(&text);
    assert_eq!(errs.len(), 3, "{}", list(&errs));
    find(
        &errs,
        "resource[3] (\"ram\").name",
        &["duplicate resource name", "resource[2] (\"ram\")"],
    );
    find(
        &errs,
        "upstream[1] (\"u\").name",
        &["duplicate upstream name", "upstream[0] (\"u\")"],
    );
    find(
        &errs,
        "server.token[1] (\"t\").name",
        &["duplicate token name"],
    );
}

#[test]
fn listen_addresses_must_parse_and_differ() {
    let text = with(&[
        upstream("a", 7480, "http://127.0.0.1:1", "ram", &[], ""),
        upstream("b", 9000, "http://127.0.0.1:2", "ram", &[], ""),
        upstream("c", 9000, "http://127.0.0.1:3", "ram", &[], ""),
        "\n[[upstream]]\nname = \"d\"\nlisten = \"0.0.0.0:9000\"\ntarget = \"http://127.0.0.1:4\"\nresource = \"ram\"\n".to_owned(),
        "\n[[upstream]]\nname = \"e\"\nlisten = \"localhost:9100\"\ntarget = \"http://127.0.0.1:5\"\nresource = \"ram\"\n".to_owned(),
        // Port 0 (ephemeral, as tests use) never conflicts.
        "\n[[upstream]]\nname = \"f\"\nlisten = \"127.0.0.1:0\"\ntarget = \"http://127.0.0.1:6\"\nresource = \"ram\"\n".to_owned(),
        "\n[[upstream]]\nname = \"g\"\nlisten = \"127.0.0.1:0\"\ntarget = \"http://127.0.0.1:7\"\nresource = \"ram\"\n".to_owned(),
    ]);
    let errs = errors(&text);
    assert_eq!(errs.len(), 4, "{}", list(&errs));
    find(
        &errs,
        "upstream[0] (\"a\").listen",
        &["already used by server.listen (its default)"],
    );
    find(
        &errs,
        "upstream[2] (\"c\").listen",
        &["already used by upstream[1] (\"b\").listen"],
    );
    find(
        &errs,
        "upstream[3] (\"d\").listen",
        &["0.0.0.0:9000 overlaps 127.0.0.1:9000, already used by upstream[1] (\"b\").listen (line"],
    );
    find(
        &errs,
        "upstream[4] (\"e\").listen",
        &["\"127.0.0.1:11435\""],
    );

    let errs = errors("[server]\nlisten = \"7480\"\n");
    find(
        &errs,
        "server.listen",
        &["not a listen address", "127.0.0.1:11435"],
    );
}

#[test]
fn targets_must_be_http_urls_with_a_host() {
    let text = with(&[
        upstream("a", 9000, "ftp://127.0.0.1:1", "ram", &[], ""),
        upstream("b", 9001, "127.0.0.1:11434", "ram", &[], ""),
        upstream("c", 9002, "http://127.0.0.1:3/?x=1", "ram", &[], ""),
        upstream("d", 9003, "http://127.0.0.1:70000", "ram", &[], ""),
        upstream("ok1", 9004, "https://example.org/prefix/v1", "ram", &[], ""),
        upstream("ok2", 9005, "http://[::1]:8000", "ram", &[], ""),
    ]);
    let errs = errors(&text);
    assert_eq!(errs.len(), 4, "{}", list(&errs));
    find(
        &errs,
        "upstream[0] (\"a\").target",
        &["only http and https"],
    );
    find(
        &errs,
        "upstream[1] (\"b\").target",
        &["http://127.0.0.1:11434"],
    );
    find(&errs, "upstream[2] (\"c\").target", &["query"]);
    find(&errs, "upstream[3] (\"d\").target", &["1 to 65535"]);
}

#[test]
fn upstream_resource_references_are_checked() {
    let text = with(&[
        upstream(
            "a",
            9000,
            "http://127.0.0.1:1",
            "gpu9",
            &["ram", "gpu8"],
            "",
        ),
        upstream(
            "b",
            9001,
            "http://127.0.0.1:2",
            "gpu0",
            &["gpu0", "ram", "ram"],
            "",
        ),
        upstream(
            "c",
            9002,
            "http://127.0.0.1:3",
            "gpu0",
            &["ram"],
            "[upstream.requirements]\ngpu0 = { min_free_mib = 1 }\ngpu1 = { min_free_mib = 1 }\nnope = { min_free_mib = 1 }\nram = { min_free_mib = 1 }\n",
        ),
    ]);
    let errs = errors(&text);
    assert_eq!(errs.len(), 7, "{}", list(&errs));
    let e = find(
        &errs,
        "upstream[0] (\"a\").resource",
        &["unknown resource \"gpu9\"", "gpu0, gpu1, ram"],
    );
    assert_eq!(e.line, Some(line_of(&text, "\"gpu9\"")));
    find(
        &errs,
        "upstream[0] (\"a\").also_requires",
        &["unknown resource \"gpu8\""],
    );
    let b: Vec<&ConfigError> = errs
        .iter()
        .filter(|e| e.path == "upstream[1] (\"b\").also_requires")
        .collect();
    assert_eq!(b.len(), 2);
    assert!(b[0].message.contains("already the primary resource"));
    assert!(b[1].message.contains("listed twice"));
    find(
        &errs,
        "upstream[2] (\"c\").requirements.gpu0",
        &["primary resource", "default_min_free_mib"],
    );
    find(
        &errs,
        "upstream[2] (\"c\").requirements.gpu1",
        &["not in also_requires"],
    );
    find(
        &errs,
        "upstream[2] (\"c\").requirements.nope",
        &["unknown resource"],
    );
}

#[test]
fn samplers_must_fit_their_kind() {
    let text = r#"
[[resource]]
name = "a"
kind = "memory"
sampler = "nvml"

[[resource]]
name = "b"
kind = "gpu"
sampler = "amdgpu"

[[resource]]
name = "c"
kind = "gpu"
sampler = "system"

[[resource]]
name = "d"
kind = "cpu"
sampler = "file"
path = "/x"

[[resource]]
name = "e"
kind = "memory"
sampler = "file"

[[resource]]
name = "f"
kind = "cpu"
busy_max_pct = 0

[[resource]]
name = "g"
poll_ms = 0
max_sample_age_ms = 0

[[resource]]
name = "h"
kind = "gpu"
sampler = "amdgpu"
device = "card2"
include_gtt = true
"#;
    let errs = errors(text);
    assert_eq!(errs.len(), 8, "{}", list(&errs));
    find(
        &errs,
        "resource[0] (\"a\").sampler",
        &["\"nvml\" cannot measure kind \"memory\"", "\"gpu\""],
    );
    find(&errs, "resource[1] (\"b\").device", &["\"card0\""]);
    find(
        &errs,
        "resource[2] (\"c\").sampler",
        &["\"memory\" or \"cpu\""],
    );
    find(
        &errs,
        "resource[3] (\"d\").sampler",
        &["\"gpu\" or \"memory\""],
    );
    find(&errs, "resource[4] (\"e\").path", &["missing", "free_mib"]);
    find(&errs, "resource[5] (\"f\").busy_max_pct", &["1 to 100"]);
    find(&errs, "resource[6] (\"g\").poll_ms", &["above 0"]);
    find(&errs, "resource[6] (\"g\").max_sample_age_ms", &["above 0"]);
}

#[test]
fn short_sample_age_and_ignored_keys_are_warnings() {
    let text = "[[resource]]\nname = \"ram\"\npoll_ms = 2000\nmax_sample_age_ms = 1000\npath = \"/x\"\ndevice = \"1\"\nbusy_max_pct = 50\ninclude_gtt = true\n";
    let loaded = ok(text);
    let w: Vec<&ConfigWarning> = loaded
        .warnings
        .iter()
        .filter(|w| w.path.starts_with("resource"))
        .collect();
    assert_eq!(w.len(), 5, "{}", list(&loaded.warnings));
    assert_eq!(w[0].path, "resource[0] (\"ram\").max_sample_age_ms");
    assert_eq!(w[0].line, Some(4));
    assert!(w[0].message.contains("shorter than poll_ms"));
    assert!(w[1].message.contains("sampler = \"file\""), "{}", w[1]);
    assert!(w[2].message.contains("\"nvml\" or \"amdgpu\""), "{}", w[2]);
    assert!(w[3].message.contains("kind = \"cpu\""), "{}", w[3]);
    assert!(w[4].message.contains("\"amdgpu\""), "{}", w[4]);
}

#[test]
fn owner_settings_are_checked() {
    let errs = errors("[owner]\npresence = \"command\"\n[owner.gpu_pressure]\npoll_ms = 0\n");
    assert_eq!(errs.len(), 2, "{}", list(&errs));
    let e = find(
        &errs,
        "owner.command",
        &["presence = \"command\" needs a command"],
    );
    assert_eq!(e.line, Some(1));
    find(&errs, "owner.gpu_pressure.poll_ms", &["above 0"]);
    let c = ok("[owner]\npresence = \"command\"\ncommand = \"/bin/true\"\n").config;
    assert_eq!(c.owner.presence, PresenceMode::Command);
    assert!(c.owner.locked_counts_as_away, "the default");
}

#[test]
fn the_windows_session_is_a_windows_builds_presence() {
    let text = "[owner]\nlocked_counts_as_away = false\npresence = \"windows\"\n";
    if cfg!(windows) {
        let c = ok(text).config;
        assert_eq!(c.owner.presence, PresenceMode::Windows);
        assert!(!c.owner.locked_counts_as_away);
    } else {
        let errs = errors(text);
        assert_eq!(errs.len(), 1, "{}", list(&errs));
        let e = find(
            &errs,
            "owner.presence",
            &["reads the Windows console session", "not for Windows"],
        );
        assert_eq!(e.line, Some(line_of(text, "windows")));
    }
}

#[test]
fn tokens_are_checked() {
    let text = format!(
        "[[server.token]]\nscopes = [\"admin\"]\nsha256 = \"{}\"\n\n[[server.token]]\nname = \"b\"\nsha256 = \"abc\"\n\n[[server.token]]\nname = \"c\"\nscopes = [\"read\"]\nsha256 = \"{}\"\n",
        "A".repeat(64),
        "g".repeat(64)
    );
    let errs = errors(&text);
    assert_eq!(errs.len(), 4, "{}", list(&errs));
    find(&errs, "server.token[0].name", &["missing"]);
    find(&errs, "server.token[1] (\"b\").scopes", &["at least one"]);
    find(
        &errs,
        "server.token[1] (\"b\").sha256",
        &["64 hex digits", "vacancyd token new"],
    );
    find(
        &errs,
        "server.token[2] (\"c\").sha256",
        &["vacancyd token new"],
    );
}

#[test]
fn credentials_and_timeouts_are_checked() {
    let text = with(&[
        upstream(
            "a",
            9000,
            "http://127.0.0.1:1",
            "ram",
            &[],
            "completion_timeout_s = 0\n[upstream.credential]\nheader = \"Bad Header\"\n",
        ),
        upstream(
            "b",
            9001,
            "http://127.0.0.1:2",
            "ram",
            &[],
            "[upstream.models]\n\"\" = {}\n",
        ),
    ]);
    let errs = errors(&text);
    assert_eq!(errs.len(), 4, "{}", list(&errs));
    find(
        &errs,
        "upstream[0] (\"a\").completion_timeout_s",
        &["above 0"],
    );
    find(
        &errs,
        "upstream[0] (\"a\").credential.value_file",
        &["missing"],
    );
    find(
        &errs,
        "upstream[0] (\"a\").credential.header",
        &["not a valid HTTP header name"],
    );
    find(
        &errs,
        "upstream[1] (\"b\").models.\"\"",
        &["empty model name"],
    );
}

// ---------------------------------------------------------------------------
// Shared servers (CFG) and owner-exempt upstreams (SCOPE)

#[test]
fn cfg_01_different_resources_on_one_server_rejected() {
    let text = with(&[
        upstream(
            "ollama",
            9000,
            "http://127.0.0.1:11434",
            "gpu0",
            &["ram"],
            "",
        ),
        upstream(
            "ollama-v1",
            9001,
            "http://127.0.0.1:11434/v1",
            "gpu0",
            &[],
            "",
        ),
    ]);
    let errs = errors(&text);
    assert_eq!(errs.len(), 1, "{}", list(&errs));
    let e = find(
        &errs,
        "upstream[1] (\"ollama-v1\").resource",
        &[
            "same server as \"ollama\"",
            "{\"gpu0\"}",
            "{\"gpu0\", \"ram\"}",
            "CFG-01",
            "same resource and also_requires",
        ],
    );
    assert_eq!(
        e.line,
        Some(line_of(&text, "resource = \"gpu0\"\nalso_requires = []"))
    );
}

#[test]
fn cfg_02_only_host_and_port_compared() {
    // CFG-02: a different scheme or path prefix is still the same server ...
    let text = with(&[
        upstream("a", 9000, "http://127.0.0.1:8188", "gpu0", &[], ""),
        upstream("b", 9001, "https://127.0.0.1:8188/prefix", "gpu1", &[], ""),
    ]);
    find(&errors(&text), "upstream[1] (\"b\").resource", &["CFG-01"]);
    // ... and a different port is another server.
    ok(&with(&[
        upstream("a", 9000, "http://127.0.0.1:8188", "gpu0", &[], ""),
        upstream("b", 9001, "http://127.0.0.1:8189", "gpu1", &[], ""),
    ]));
}

#[test]
fn cfg_03_loopback_spellings_are_one_host() {
    // CFG-03: localhost, 127.0.0.1, 127.0.0.2, [::1] and 0.0.0.0 are one host.
    let hosts = ["localhost", "127.0.0.1", "127.0.0.2", "[::1]", "0.0.0.0"];
    for (i, a) in hosts.iter().enumerate() {
        for b in &hosts[i + 1..] {
            let text = with(&[
                upstream("a", 9000, &format!("http://{a}:11434"), "gpu0", &[], ""),
                upstream("b", 9001, &format!("http://{b}:11434"), "gpu1", &[], ""),
            ]);
            let errs = errors(&text);
            assert_eq!(errs.len(), 1, "{a} vs {b}: {}", list(&errs));
            assert!(errs[0].message.contains("CFG-01"));
        }
    }
}

#[test]
fn cfg_04_lan_address_and_loopback_are_different_hosts() {
    // CFG-04
    ok(&with(&[
        upstream("a", 9000, "http://192.168.1.5:11434", "gpu0", &[], ""),
        upstream("b", 9001, "http://127.0.0.1:11434", "gpu1", &[], ""),
    ]));
}

#[test]
fn cfg_05_multi_gpu_server_is_one_upstream() {
    // CFG-05: one GPU as resource, the others in also_requires.
    let c = ok(&with(&[upstream(
        "llamacpp",
        9000,
        "http://127.0.0.1:8080",
        "gpu0",
        &["gpu1", "ram"],
        "[upstream.requirements]\ngpu1 = { min_free_mib = 4000 }\n",
    )]))
    .config;
    let names: Vec<&str> = c.upstreams[0].resource_names().collect();
    assert_eq!(names, ["gpu0", "gpu1", "ram"]);
    // The same set in another order is the same resources.
    ok(&with(&[
        upstream("a", 9000, "http://127.0.0.1:8080", "gpu0", &["gpu1"], ""),
        upstream("b", 9001, "http://localhost:8080/v1", "gpu1", &["gpu0"], ""),
    ]));
}

#[test]
fn cfg_06_two_dialects_with_same_resources_accepted() {
    // CFG-06: Ollama's native and OpenAI-compatible routes on one server.
    let loaded = ok(&with(&[
        upstream(
            "ollama",
            11435,
            "http://127.0.0.1:11434",
            "gpu0",
            &["ram"],
            "adapter = \"ollama\"",
        ),
        upstream(
            "ollama-openai",
            11436,
            "http://localhost:11434/v1",
            "gpu0",
            &["ram"],
            "adapter = \"openai\"",
        ),
    ]));
    assert!(loaded.warnings.is_empty(), "{}", list(&loaded.warnings));
}

#[test]
fn scope_10_exempt_upstream_needs_its_own_server() {
    // SCOPE-10: rejected even with the same resources; 0.0.0.0 is the same host.
    let text = with(&[
        upstream("host", 9000, "http://127.0.0.1:11434", "gpu0", &[], ""),
        upstream(
            "lane",
            9001,
            "http://0.0.0.0:11434",
            "gpu0",
            &[],
            "owner_scope = \"resource\"",
        ),
    ]);
    let errs = errors(&text);
    assert_eq!(errs.len(), 1, "{}", list(&errs));
    let e = find(
        &errs,
        "upstream[1] (\"lane\").owner_scope",
        &["host-scoped \"host\"", "SCOPE-10", "own server"],
    );
    assert_eq!(e.line, Some(line_of(&text, "owner_scope")));
    // Listed first or second, the exempt one is the one named.
    let text = with(&[
        upstream(
            "lane",
            9001,
            "http://localhost:11434",
            "gpu0",
            &[],
            "owner_scope = \"resource\"",
        ),
        upstream("host", 9000, "http://127.0.0.1:11434", "gpu0", &[], ""),
    ]);
    find(
        &errors(&text),
        "upstream[0] (\"lane\").owner_scope",
        &["SCOPE-10"],
    );
}

#[test]
fn scope_10_exempt_upstream_alone_accepted() {
    // SCOPE-10 / SCOPE-11: its own server, sharing a resource with a host-scoped one.
    let loaded = ok(&with(&[
        upstream("host", 9000, "http://127.0.0.1:11434", "gpu0", &["ram"], ""),
        upstream(
            "lane",
            9001,
            "http://127.0.0.1:8080",
            "gpu0",
            &[],
            "owner_scope = \"resource\"",
        ),
        upstream(
            "lane2",
            9002,
            "http://127.0.0.1:8080/v1",
            "gpu0",
            &[],
            "owner_scope = \"resource\"",
        ),
    ]));
    // SCOPE-18: one line, which check-config prints and the daemon logs; it
    // is a fact, not a warning.
    assert_eq!(
        loaded.config.exemption_line().as_deref(),
        Some("owner-exempt upstreams (owner_scope = \"resource\"): lane, lane2")
    );
    assert!(
        !loaded
            .warnings
            .iter()
            .any(|w| w.message.contains("owner-exempt upstreams")),
        "{}",
        list(&loaded.warnings)
    );
    assert_eq!(loaded.config.exempt_upstreams(), ["lane", "lane2"]);
}

#[test]
fn scope_19_unwatched_dependencies_of_exempt_upstreams_warned() {
    // SCOPE-19: memory has no pressure measurement; a GPU has one only with
    // gpu_pressure enabled and an NVML sampler.
    let text = format!(
        "[owner.gpu_pressure]\nenabled = true\n[[resource]]\nname = \"nv\"\nkind = \"gpu\"\nsampler = \"nvml\"\n{}",
        with(&[upstream(
            "lane",
            9001,
            "http://127.0.0.1:8080",
            "nv",
            &["gpu0", "ram"],
            "owner_scope = \"resource\""
        )])
    );
    let loaded = ok(&text);
    let scope19: Vec<&ConfigWarning> = loaded
        .warnings
        .iter()
        .filter(|w| w.message.contains("SCOPE-19"))
        .collect();
    assert_eq!(scope19.len(), 2, "{}", list(&loaded.warnings));
    assert!(scope19[0].message.contains("\"gpu0\""));
    assert!(scope19[0].message.contains("sampler = \"nvml\""));
    assert!(scope19[1].message.contains("\"ram\""));
    assert!(
        scope19
            .iter()
            .all(|w| w.path == "upstream[0] (\"lane\").owner_scope")
    );
}

// ---------------------------------------------------------------------------
// Everything at once, reporting, files

#[test]
fn six_semantic_problems_reported_at_once() {
    let text = format!(
        "[owner]\npresence = \"command\"\n{RESOURCES}\n[[resource]]\nname = \"nv\"\nkind = \"memory\"\nsampler = \"nvml\"\n{}{}",
        upstream("a", 9000, "http://127.0.0.1:11434", "gpu0", &["gpu7"], ""),
        upstream(
            "b",
            9000,
            "http://localhost:11434",
            "gpu1",
            &[],
            "[upstream.credential]\nheader = \"Authorization\"\n"
        ),
    );
    let errs = errors(&text);
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "owner.command",                             // presence = "command" without a command
            "resource[3] (\"nv\").sampler",              // nvml on memory
            "upstream[0] (\"a\").also_requires",         // unknown resource
            "upstream[1] (\"b\").listen",                // duplicate listen
            "upstream[1] (\"b\").resource",              // CFG-01
            "upstream[1] (\"b\").credential.value_file", // missing
        ],
        "{}",
        list(&errs)
    );
    assert!(errs.iter().all(|e| e.line.is_some()));
}

#[test]
fn six_parse_problems_reported_at_once() {
    let text = r#"
[server]
listen = 1
token = 2

[owner]
presence = "away"

[[resource]]
nme = "ram"
kind = "disk"

[[upstream]]
also_requires = [1]
"#;
    let errs = errors(text);
    assert_eq!(errs.len(), 6, "{}", list(&errs));
    let lines: Vec<usize> = errs.iter().map(|e| e.line.unwrap()).collect();
    let want: Vec<usize> = ["listen", "token", "away", "nme", "disk", "[1]"]
        .iter()
        .map(|n| line_of(text, n))
        .collect();
    assert_eq!(lines, want);
}

#[test]
fn errors_display_with_origin_line_and_path() {
    let text = with(&[upstream(
        "ollama",
        9000,
        "http://127.0.0.1:1",
        "gpu0",
        &["gpu9"],
        "",
    )]);
    let err = Config::parse(&text, "/etc/vacancyd/vacancyd.toml").unwrap_err();
    let line = line_of(&text, "also_requires");
    assert_eq!(
        err.to_string(),
        format!(
            "/etc/vacancyd/vacancyd.toml: line {line}: upstream[0] (\"ollama\").also_requires: unknown resource \"gpu9\"; define it in a [[resource]] table (configured: gpu0, gpu1, ram)"
        )
    );
    let two = Config::parse("a = 1\nb = 2\n", "x.toml")
        .unwrap_err()
        .to_string();
    let lines: Vec<&str> = two.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(lines[0].starts_with("x.toml: line 1: a: unknown key"));
    assert!(lines[1].starts_with("x.toml: line 2: b: unknown key"));
    let bare = ConfigError {
        path: String::new(),
        line: None,
        message: "m".into(),
    };
    assert_eq!(bare.to_string(), "m");
}

/// examples/vacancyd.toml with its token placeholder replaced by a hash
/// of the operator's own.
fn example_with_own_token() -> String {
    include_str!("../../../examples/vacancyd.toml").replace(
        EXAMPLE_TOKEN_PLACEHOLDER,
        "5f1c0b7e9a4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0f9e8d7c6b5a49",
    )
}

#[test]
fn example_file_ships_no_usable_token_and_refuses_public_hashes() {
    // Issue 30 item 4: the example carried the hash of a token printed in
    // its own comment, and check-config said ok. It now carries a
    // placeholder that is refused naming its line, as is the old hash.
    let text = include_str!("../../../examples/vacancyd.toml");
    let errs = errors(text);
    assert_eq!(errs.len(), 1, "{}", list(&errs));
    let e = find(
        &errs,
        "server.token[0] (\"ops\").sha256",
        &[
            "placeholder of examples/vacancyd.toml",
            "vacancyd token new --name ops --scope admin",
        ],
    );
    assert_eq!(e.line, Some(line_of(text, "sha256 = ")));
    assert!(text.contains("vacancyd token new"));
    assert!(!text.contains("example-token-do-not-use"));
    let old = format!(
        "[server]\n\n[[server.token]]\nname = \"console\"\nscopes = [\"owner\"]\nsha256 = \"{}\"\n",
        // sha256 of "example-token-do-not-use", upper case.
        "3690A4A2ED3B26B46A696E9AB873A300D9DA3AE56BC84352E2BF724885C91DFD"
    );
    let errs = errors(&old);
    let e = find(
        &errs,
        "server.token[0] (\"console\").sha256",
        &[
            "example-token-do-not-use",
            "that token is public",
            "vacancyd token new --name console --scope owner",
        ],
    );
    assert_eq!(e.line, Some(6));
}

#[test]
fn example_file_is_valid_without_warnings() {
    let text = example_with_own_token();
    let loaded = Config::parse(&text, "examples/vacancyd.toml").unwrap_or_else(|e| panic!("{e}"));
    assert!(loaded.warnings.is_empty(), "{}", list(&loaded.warnings));
    let c = &loaded.config;
    assert_eq!(c.resources.len(), 5);
    assert_eq!(c.upstreams.len(), 3);
    assert_eq!(
        c.upstreams[0].models["llama3.1:8b"].resident_min_free_mib,
        Some(500)
    );
}

#[test]
fn example_file_sets_every_key() {
    let text = include_str!("../../../examples/vacancyd.toml");
    let parsed = super::parse::parse(text).ok().unwrap();
    let written: BTreeSet<String> = parsed
        .index
        .raw_paths()
        .filter_map(|p| {
            let last = p.rsplit('.').next()?;
            (!last.contains('[')).then(|| last.to_owned())
        })
        .collect();
    for (table, keys) in super::parse::all_tables() {
        for key in keys {
            assert!(
                written.contains(*key),
                "examples/vacancyd.toml does not set {table}.{key}"
            );
        }
    }
}

#[test]
fn embedded_default_is_valid() {
    let loaded = Config::embedded_default().unwrap_or_else(|e| panic!("{e}"));
    assert!(loaded.warnings.is_empty(), "{}", list(&loaded.warnings));
    let c = &loaded.config;
    assert_eq!(c.owner.presence, PresenceMode::Auto);
    assert_eq!(c.resources.len(), 1);
    let ram = &c.resources[0];
    assert_eq!(
        (ram.name.as_str(), ram.kind, ram.sampler, ram.reserve_mib),
        ("ram", ResourceKind::Memory, SamplerKind::System, 4096)
    );
    let u = &c.upstreams[0];
    assert_eq!(u.name, "llamacpp");
    assert_eq!(u.adapter, AdapterKind::LLAMACPP);
    assert_eq!(u.listen, "127.0.0.1:8081");
    assert_eq!(u.target, "http://127.0.0.1:8080");
    assert_eq!(u.resource, "ram");
    assert_eq!(u.default_min_free_mib, 2048);
}

#[test]
fn load_reads_a_file_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vacancyd.toml");
    std::fs::write(&path, EMBEDDED_DEFAULT).unwrap();
    let loaded = Config::load(&path).unwrap();
    assert_eq!(loaded.config.upstreams[0].name, "llamacpp");

    std::fs::write(&path, "[server]\nlisen = 1\n").unwrap();
    let err = Config::load(&path).unwrap_err();
    assert_eq!(err.origin, path.display().to_string());
    assert!(
        err.to_string()
            .starts_with(&format!("{}: line 2: server.lisen", path.display()))
    );

    let missing = dir.path().join("missing.toml");
    let err = Config::load(&missing).unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with(&missing.display().to_string()), "{text}");
    assert!(
        text.contains("cannot read the configuration file"),
        "{text}"
    );
    assert!(text.contains("os error"), "{text}");

    std::fs::write(&path, [0xff, 0xfe, b'\n']).unwrap();
    let err = Config::load(&path).unwrap_err();
    assert!(err.to_string().contains("not UTF-8"), "{err}");
}

// Issue 14 item 11: a file that is not UTF-8 names where: the byte offset and
// the line of the first byte that is not.
#[test]
fn a_file_that_is_not_utf8_names_the_byte_offset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vacancyd.toml");
    let mut bytes = b"[server]\nlisten = \"127.0.0.1:7480\" # caf".to_vec();
    let offset = bytes.len();
    bytes.extend_from_slice(&[0xe9, b'\n']); // Latin-1 "é"
    std::fs::write(&path, &bytes).unwrap();
    let err = Config::load(&path).unwrap_err();
    assert_eq!(err.errors.len(), 1);
    assert_eq!(err.errors[0].line, Some(2));
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("{}: line 2: ", path.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "not UTF-8 text: the byte at offset {offset} (0xe9)"
        )),
        "{text}"
    );
}

#[test]
fn voice_routes_parse_and_their_paths_are_the_adapters_to_check() {
    // docs/config.md#upstreamvoice_routes: the voice paths, configurable per upstream. Core
    // configuration parses the table; the chatterbox kind checks the paths
    // (vacancy-adapters' builtin tests), not core keyed on its name.
    let good = with(&[upstream(
        "voice",
        9000,
        "http://127.0.0.1:4123",
        "gpu0",
        &[],
        "adapter = \"chatterbox\"\n[upstream.voice_routes]\nspeech = \"/tts/speak\"\nexecution = \"/tts/jobs/{id}\"\n",
    )]);
    let c = ok(&good).config;
    let r = c.upstreams[0].voice_routes.as_ref().unwrap();
    assert_eq!(r.speech, "/tts/speak");
    assert_eq!(
        r.executions, "/v1/audio/executions",
        "unset keys keep the contract's path"
    );
    let unchecked = with(&[upstream(
        "ollama",
        9001,
        "http://127.0.0.1:11434",
        "gpu1",
        &[],
        "adapter = \"ollama\"\n[upstream.voice_routes]\nspeech = \"s\"\n",
    )]);
    ok(&unchecked);
    // Unknown keys name the key and its line, like everywhere else.
    let typo = with(&[upstream(
        "voice",
        9000,
        "http://127.0.0.1:4123",
        "gpu0",
        &[],
        "adapter = \"chatterbox\"\n[upstream.voice_routes]\nspeach = \"/s\"\n",
    )]);
    let e = errors(&typo);
    let err = find(
        &e,
        "upstream[0] (\"voice\").voice_routes.speach",
        &["unknown key"],
    );
    assert_eq!(err.line, Some(line_of(&typo, "speach")));
}

#[test]
fn gpu_pressure_thresholds_have_defaults_and_are_checked() {
    let d = GpuPressureConfig::default();
    assert_eq!(
        (
            d.enabled,
            d.util_threshold_pct,
            d.memory_threshold_mib,
            d.engage_ms,
            d.quiet_ms
        ),
        (false, 25, 1024, 4000, 30000)
    );
    let c = ok("[owner.gpu_pressure]\nenabled = true\nutil_threshold_pct = 40\nmemory_threshold_mib = 512\nengage_ms = 0\nquiet_ms = 10000\n").config;
    let p = &c.owner.gpu_pressure;
    assert_eq!(
        (
            p.util_threshold_pct,
            p.memory_threshold_mib,
            p.engage_ms,
            p.quiet_ms
        ),
        (40, 512, 0, 10000)
    );
    let text =
        "[owner.gpu_pressure]\nutil_threshold_pct = 101\nmemory_threshold_mib = 0\nquiet_ms = 0\n";
    let errs = errors(text);
    assert_eq!(errs.len(), 3, "{}", list(&errs));
    let e = find(
        &errs,
        "owner.gpu_pressure.util_threshold_pct",
        &["1 to 100", "101"],
    );
    assert_eq!(e.line, Some(2));
    let e = find(
        &errs,
        "owner.gpu_pressure.memory_threshold_mib",
        &["above 0"],
    );
    assert_eq!(e.line, Some(3));
    let e = find(&errs, "owner.gpu_pressure.quiet_ms", &["above 0"]);
    assert_eq!(e.line, Some(4));
    let errs = errors("[owner.gpu_pressure]\nutil_threshold_pct = 0\n");
    find(
        &errs,
        "owner.gpu_pressure.util_threshold_pct",
        &["1 to 100"],
    );
    // Too large for the key's type: still reported with its key and line.
    let errs = errors("[owner.gpu_pressure]\nutil_threshold_pct = 300\n");
    let e = &errs[0];
    assert_eq!(
        e.path,
        "owner.gpu_pressure.util_threshold_pct",
        "{}",
        list(&errs)
    );
    assert_eq!(e.line, Some(2));
}

// ---------------------------------------------------------------------------
// Engine-only configurations (a program embedding the engine)

const ENGINE_ONLY: &str = "[[resource]]\nname = \"gpu0\"\nkind = \"gpu\"\nreserve_mib = 512\n\n[[resource]]\nname = \"ram\"\nsampler = \"system\"\n\n[[upstream]]\nname = \"llm\"\nresource = \"gpu0\"\nalso_requires = [\"ram\"]\ndefault_min_free_mib = 4000\n";

#[test]
fn engine_only_config_needs_no_listen_target_or_sampler() {
    let loaded = Config::parse_for_engine(ENGINE_ONLY, "<engine>").unwrap();
    let c = &loaded.config;
    assert_eq!(
        c.resources[0].sampler,
        SamplerKind::Manual,
        "no sampler: fed by hand"
    );
    assert_eq!(
        c.resources[1].sampler,
        SamplerKind::System,
        "a given sampler stays"
    );
    assert_eq!(c.upstreams[0].listen, "");
    assert_eq!(c.upstreams[0].target, "");
    // The daemon still needs all three.
    let errs = errors(ENGINE_ONLY);
    find(&errs, "upstream[0] (\"llm\").listen", &["missing"]);
    find(&errs, "upstream[0] (\"llm\").target", &["missing"]);
    find(
        &errs,
        "resource[0] (\"gpu0\").sampler",
        &["cannot measure kind \"gpu\""],
    );
}

#[test]
fn engine_only_config_checks_what_is_given() {
    let text = format!("{ENGINE_ONLY}listen = \"localhost:1\"\ntarget = \"ftp://x\"\n");
    let errs = Config::parse_for_engine(&text, "<engine>")
        .unwrap_err()
        .errors;
    find(
        &errs,
        "upstream[0] (\"llm\").listen",
        &["not a listen address"],
    );
    find(&errs, "upstream[0] (\"llm\").target", &[]);
    let errs = Config::parse_for_engine(
        "[[resource]]\nname = \"g\"\nkind = \"gpu\"\nsampler = \"system\"\n",
        "<e>",
    )
    .unwrap_err()
    .errors;
    find(&errs, "resource[0] (\"g\").sampler", &["cannot measure"]);
}

#[test]
fn manual_sampler_is_refused_by_the_daemon() {
    let errs = errors("[[resource]]\nname = \"g\"\nkind = \"gpu\"\nsampler = \"manual\"\n");
    find(
        &errs,
        "resource[0] (\"g\").sampler",
        &["embedding the engine"],
    );
    let loaded = Config::parse_for_engine(
        "[[resource]]\nname = \"g\"\nkind = \"gpu\"\nsampler = \"manual\"\n",
        "<e>",
    )
    .unwrap();
    assert_eq!(loaded.config.resources[0].sampler, SamplerKind::Manual);
    assert_eq!(SamplerKind::Manual.as_str(), "manual");
}

// ---------------------------------------------------------------------------
// The owner's terms beyond presence (issue 35)

const AMD_GPU: &str =
    "[[resource]]\nname = \"gpu0\"\nkind = \"gpu\"\nsampler = \"amdgpu\"\ndevice = \"card0\"\n";

#[test]
fn the_terms_are_off_unless_configured() {
    let c = ok("[[resource]]\nname = \"ram\"\n").config;
    assert_eq!(c.lending.hours, None);
    assert_eq!(c.owner.on_battery, super::OnBattery::Lend);
    assert_eq!(c.owner.power_supply_dir, "/sys/class/power_supply");
    let r = &c.resources[0];
    assert_eq!(
        (
            r.max_temperature_c,
            r.resume_below_c,
            r.max_power_w,
            r.max_fan_percent,
            r.hot_for_s,
            r.power_cap_w
        ),
        (None, None, None, None, 30, None)
    );
    assert_eq!(r.heat_limits(), None);
    assert!(
        crate::engine::EngineSpec::from(&c).resources[0]
            .heat
            .is_none()
    );
}

#[test]
fn the_terms_parse_into_the_engines_limits() {
    let text = format!(
        "[owner]\non_battery = \"pause\"\npower_supply_dir = \"/tmp/ps\"\n\n[lending]\nhours = [\"Mon-Fri 19:00-08:00\", \"Sat-Sun\"]\n\n{AMD_GPU}max_temperature_c = 83\nmax_power_w = 250\nmax_fan_percent = 70\nhot_for_s = 12\npower_cap_w = 200\n"
    );
    let c = ok(&text).config;
    assert_eq!(c.owner.on_battery, super::OnBattery::Pause);
    assert_eq!(c.lending.hours.as_deref().map(<[String]>::len), Some(2));
    let limits = c.resources[0].heat_limits().unwrap();
    assert_eq!(
        limits.temperature,
        Some((83, 78)),
        "resume_below_c defaults to 5 below"
    );
    assert_eq!(
        (limits.max_power_w, limits.max_fan_percent),
        (Some(250), Some(70))
    );
    assert_eq!(limits.hot_for, std::time::Duration::from_secs(12));
    assert_eq!(c.resources[0].power_cap_w, Some(200));
}

#[test]
fn bad_terms_are_refused_with_key_and_line() {
    let text = "[lending]\nhours = [\"Mon-Fry 19:00-08:00\"]\n";
    let errs = errors(text);
    let e = find(&errs, "lending.hours", &["entry 1", "unknown day \"Fry\""]);
    assert_eq!(e.line, Some(2));
    find(
        &errors("[lending]\nhours = []\n"),
        "lending.hours",
        &["empty", "remove the key"],
    );
    find(
        &errors("[owner]\non_battery = \"maybe\"\n"),
        "owner.on_battery",
        &["\"lend\", \"pause\""],
    );
    let text = format!(
        "{AMD_GPU}max_temperature_c = 80\nresume_below_c = 85\nmax_fan_percent = 120\nmax_power_w = 0\n"
    );
    let errs = errors(&text);
    let e = find(
        &errs,
        "resource[0] (\"gpu0\").resume_below_c",
        &["above max_temperature_c = 80"],
    );
    assert_eq!(e.line, Some(7));
    find(
        &errs,
        "resource[0] (\"gpu0\").max_fan_percent",
        &["percentage from 1 to 100"],
    );
    find(
        &errs,
        "resource[0] (\"gpu0\").max_power_w",
        &["out of range"],
    );
    find(
        &errors(&format!("{AMD_GPU}resume_below_c = 70\n")),
        "resource[0] (\"gpu0\").resume_below_c",
        &["needs max_temperature_c"],
    );
    // Only a GPU whose sampler reads heat can have limits.
    let text = "[[resource]]\nname = \"egpu\"\nkind = \"gpu\"\nsampler = \"file\"\npath = \"/run/e.json\"\nmax_temperature_c = 80\n";
    let errs = errors(text);
    let e = find(
        &errs,
        "resource[0] (\"egpu\").max_temperature_c",
        &["sampler = \"amdgpu\" or \"nvml\""],
    );
    assert_eq!(e.line, Some(6));
}

#[test]
fn hot_for_s_is_bounded_naming_its_line_and_largest_value() {
    // Issue 30 item 5's rule for every duration key, for issue 35's one.
    let text = format!("{AMD_GPU}max_temperature_c = 80\nhot_for_s = 9223372036854775807\n");
    let errs = errors(&text);
    let e = find(
        &errs,
        "resource[0] (\"gpu0\").hot_for_s",
        &["too large", "86400"],
    );
    assert_eq!(e.line, Some(7));
    // Without a limit it has no effect, and says so.
    let loaded = ok(&format!("{AMD_GPU}hot_for_s = 10\n"));
    assert!(
        loaded
            .warnings
            .iter()
            .any(|w| w.path.ends_with("hot_for_s") && w.message.contains("ignored"))
    );
}

#[test]
fn every_duration_key_is_bounded_naming_its_line_and_largest_value() {
    // Issue 30 item 5: `idle_timeout_s = 9223372036854775807` passed and every
    // connection then panicked adding it to a clock. Each duration key is
    // bounded; one past its bound is refused with the key, its line and the
    // largest accepted value, and i64::MAX (TOML's largest integer) too.
    let keys: &[(&str, &str, &str, u64)] = &[
        ("[server]", "server", "header_timeout_s", 3600),
        ("[server]", "server", "idle_timeout_s", 86_400),
        ("[server]", "server", "body_timeout_s", 3600),
        ("[server]", "server", "tunnel_idle_timeout_s", 604_800),
        (
            "[owner.gpu_pressure]",
            "owner.gpu_pressure",
            "poll_ms",
            3_600_000,
        ),
        (
            "[owner.gpu_pressure]",
            "owner.gpu_pressure",
            "engage_ms",
            3_600_000,
        ),
        (
            "[owner.gpu_pressure]",
            "owner.gpu_pressure",
            "quiet_ms",
            86_400_000,
        ),
        (
            "[[resource]]\nname = \"ram\"",
            "resource[0] (\"ram\")",
            "poll_ms",
            3_600_000,
        ),
        (
            "[[resource]]\nname = \"ram\"",
            "resource[0] (\"ram\")",
            "max_sample_age_ms",
            86_400_000,
        ),
        (
            "[[resource]]\nname = \"ram\"",
            "resource[0] (\"ram\")",
            "hot_for_s",
            86_400,
        ),
    ];
    for &(table, path, key, max) in keys {
        for value in [max + 1, i64::MAX as u64] {
            let text = format!("{table}\n{key} = {value}\n");
            let errs = errors(&text);
            let e = find(
                &errs,
                &format!("{path}.{key}"),
                &["too large", &format!("largest accepted value is {max} (")],
            );
            assert_eq!(e.line, Some(line_of(&text, key)), "{e}");
        }
        // The bound itself is accepted.
        let text = format!("{table}\n{key} = {max}\n");
        assert!(
            Config::parse(&text, ORIGIN).is_ok_and(|l| !l
                .warnings
                .iter()
                .any(|w| w.path.ends_with(key) && w.message.contains("too large"))),
            "{text}"
        );
    }
    let upstream_keys: &[(&str, u64)] = &[
        ("drain_timeout_s", 86_400),
        ("completion_timeout_s", 604_800),
        ("stop_proof_timeout_s", 3600),
    ];
    for &(key, max) in upstream_keys {
        for value in [max + 1, i64::MAX as u64] {
            let text = with(&[upstream(
                "a",
                9000,
                "http://127.0.0.1:1",
                "ram",
                &[],
                &format!("{key} = {value}\n"),
            )]);
            let errs = errors(&text);
            let e = find(
                &errs,
                &format!("upstream[0] (\"a\").{key}"),
                &[&format!("largest accepted value is {max} (")],
            );
            assert_eq!(e.line, Some(line_of(&text, key)), "{e}");
        }
    }
    let text = with(&[upstream(
        "a",
        9000,
        "http://127.0.0.1:1",
        "ram",
        &[],
        "[upstream.queue]\nmax_wait_s = 3601\n",
    )]);
    find(
        &errors(&text),
        "upstream[0] (\"a\").queue.max_wait_s",
        &["largest accepted value is 3600 (1 hour"],
    );
    // The message, whole, for the attack's value.
    let errs = errors("[server]\nidle_timeout_s = 9223372036854775807\n");
    assert_eq!(
        errs[0].to_string(),
        "line 2: server.idle_timeout_s: 9223372036854775807 is too large: the largest accepted value is 86400 (1 day; seconds an idle connection stays open)"
    );
}

#[test]
fn no_duration_key_is_left_unbounded() {
    // Issue 30 item 5: every key named as a duration (`_s`, `_ms`) in any
    // table, including keys added later, refuses TOML's largest integer.
    let max = i64::MAX;
    for (table, keys) in super::parse::all_tables() {
        for key in keys
            .iter()
            .filter(|k| k.ends_with("_s") || k.ends_with("_ms"))
        {
            let (text, path) = match table {
                "server" | "owner.gpu_pressure" | "borrowers" => (
                    format!("[{table}]\n{key} = {max}\n"),
                    format!("{table}.{key}"),
                ),
                "resource" => (
                    format!("[[resource]]\nname = \"ram\"\n{key} = {max}\n"),
                    format!("resource[0] (\"ram\").{key}"),
                ),
                "upstream" | "upstream.queue" => {
                    let extra = if table == "upstream" {
                        format!("{key} = {max}\n")
                    } else {
                        format!("[upstream.queue]\n{key} = {max}\n")
                    };
                    let sub = table.strip_prefix("upstream").unwrap_or_default();
                    (
                        with(&[upstream(
                            "a",
                            9000,
                            "http://127.0.0.1:1",
                            "ram",
                            &[],
                            &extra,
                        )]),
                        format!("upstream[0] (\"a\"){sub}.{key}"),
                    )
                }
                other => panic!(
                    "{other}.{key} is a duration in a table this test has no template for: add one, and a bound in validate.rs"
                ),
            };
            find(&errors(&text), &path, &["too large"]);
        }
    }
}

#[test]
fn stop_proof_timeout_defaults_to_a_minute_and_is_bounded() {
    // Issue 30 item 12: the window for a cut job's proof of its stop.
    let ok = with(&[upstream("a", 9000, "http://127.0.0.1:1", "ram", &[], "")]);
    let c = Config::parse(&ok, "t").unwrap().config;
    assert_eq!(c.upstreams[0].stop_proof_timeout_s, 60);
    let text = with(&[
        upstream(
            "a",
            9000,
            "http://127.0.0.1:1",
            "ram",
            &[],
            "stop_proof_timeout_s = 0\n",
        ),
        upstream(
            "b",
            9001,
            "http://127.0.0.1:2",
            "ram",
            &[],
            "stop_proof_timeout_s = 3601\n",
        ),
    ]);
    let errs = errors(&text);
    assert_eq!(errs.len(), 2, "{}", list(&errs));
    for up in ["upstream[0] (\"a\")", "upstream[1] (\"b\")"] {
        find(
            &errs,
            &format!("{up}.stop_proof_timeout_s"),
            &["cut job stopped"],
        );
    }
}

// Issue 31: the proxy's worker threads; 0 is one per core, past 256 an error
// naming the key and its line.
#[test]
fn proxy_threads_is_bounded_naming_its_line() {
    let base = "[server]\nproxy_threads = {n}\n\n[[resource]]\nname = \"gpu0\"\nkind = \"gpu\"\nsampler = \"file\"\npath = \"/tmp/x.json\"\n\n[[upstream]]\nname = \"u\"\nadapter = \"openai\"\nlisten = \"127.0.0.1:18081\"\ntarget = \"http://127.0.0.1:18080\"\nresource = \"gpu0\"\n";
    assert_eq!(ok(&base.replace("{n}", "0")).config.server.proxy_threads, 0);
    assert_eq!(ok(&base.replace("{n}", "4")).config.server.proxy_threads, 4);
    let text = base.replace("{n}", "257");
    let errs = errors(&text);
    let e = find(
        &errs,
        "server.proxy_threads",
        &["at most 256", "one per core"],
    );
    assert_eq!(e.line, Some(line_of(&text, "proxy_threads")));
}

#[test]
fn borrowers_table_is_off_by_default_and_checked_when_present() {
    // issue 34: with no [borrowers] every borrower is anonymous
    let c = ok(&with(&[])).config;
    assert_eq!(c.borrowers, None);
    let c = ok(&format!("{}[borrowers]\n", with(&[]))).config;
    let b = c.borrowers.unwrap();
    assert!(b.require_key && !b.reads_need_key);
    assert_eq!(b.batch_max_wait_s, 120);
    let text = format!(
        "{}[borrowers]\nbatch_max_wait_s = 0\nanonymous_priority = \"urgent\"\n",
        with(&[])
    );
    let e = errors(&text);
    find(&e, "borrowers.anonymous_priority", &["urgent"]);
}

#[test]
fn the_example_keys_file_is_valid() {
    // issue 34: examples/borrowers.toml parses as the daemon reads it
    let keys = KeysFile::parse(
        include_str!("../../../examples/borrowers.toml"),
        "examples/borrowers.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(keys.borrowers.len(), 3);
}
