//! Settings the owner console saves (`POST /admin/settings`): a small set of
//! keys, written into the configuration text with `toml_edit` so that
//! comments, order and layout survive, then validated like any configuration.
//!
//! Only these keys can be edited: each resource's `reserve_mib`; each
//! upstream's `default_min_free_mib`, `resident_min_free_mib`,
//! `[upstream.models]`, `on_owner_return`, `drain_timeout_s`, `yield_on_veto`,
//! and — needing scope admin — `owner_scope` and `management`
//! ("advanced workload permissions", SCOPE-03). A restart applies them.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml_edit::{DocumentMut, Item, Table, Value};

use super::error::ConfigError;
use super::schema::{Config, ModelRequirement, ResourceConfig, UpstreamConfig};

/// One save of the console's settings form. Absent fields are left as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SettingsEdit {
    /// By resource name.
    pub resources: BTreeMap<String, ResourceEdit>,
    /// By upstream name.
    pub upstreams: BTreeMap<String, UpstreamEdit>,
}

/// The editable keys of one `[[resource]]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResourceEdit {
    /// `reserve_mib`.
    pub reserve_mib: Option<u64>,
}

/// The editable keys of one `[[upstream]]`. Enum values are taken as text and
/// checked by the validator, which names the allowed values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamEdit {
    /// `default_min_free_mib`.
    pub default_min_free_mib: Option<u64>,
    /// `resident_min_free_mib`.
    pub resident_min_free_mib: Option<u64>,
    /// `on_owner_return`: drain | cancel | finish.
    pub on_owner_return: Option<String>,
    /// `drain_timeout_s`.
    pub drain_timeout_s: Option<u64>,
    /// `yield_on_veto`.
    pub yield_on_veto: Option<bool>,
    /// `owner_scope`: host | resource (scope admin).
    pub owner_scope: Option<String>,
    /// `management`: deny | allow (scope admin).
    pub management: Option<String>,
    /// `[upstream.models]` entries to set; `null` removes one.
    pub models: BTreeMap<String, Option<ModelEdit>>,
}

/// One `[upstream.models]` entry; an absent field is left out of the entry
/// (the upstream's value applies).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelEdit {
    /// `min_free_mib`.
    pub min_free_mib: Option<u64>,
    /// `resident_min_free_mib`.
    pub resident_min_free_mib: Option<u64>,
}

impl SettingsEdit {
    /// Whether the edit touches an advanced workload permission
    /// (`owner_scope`, `management`), which needs scope admin (SCOPE-03).
    pub fn needs_admin(&self) -> bool {
        self.upstreams
            .values()
            .any(|u| u.owner_scope.is_some() || u.management.is_some())
    }

    /// Whether the edit changes nothing.
    pub fn is_empty(&self) -> bool {
        self.resources.values().all(|r| r.reserve_mib.is_none())
            && self
                .upstreams
                .values()
                .all(|u| *u == UpstreamEdit::default())
    }

    /// `text` with the edit applied. Comments, key order and layout of
    /// everything else are kept; a replaced value keeps its own comment.
    ///
    /// # Errors
    ///
    /// Every resource or upstream the edit names that the text does not
    /// configure, every number TOML cannot hold, or a text that is not TOML.
    /// The result is not validated: run it through [`Config::parse`].
    pub fn apply(&self, text: &str) -> Result<String, Vec<ConfigError>> {
        let mut doc: DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| {
            vec![ConfigError {
                path: String::new(),
                line: None,
                message: format!("the configuration file is not valid TOML: {e}"),
            }]
        })?;
        let mut errors = Vec::new();
        for (name, edit) in &self.resources {
            let Some(table) = named_entry(&mut doc, "resource", name) else {
                errors.push(not_configured("resource", name));
                continue;
            };
            let path = format!("resource \"{name}\"");
            set_int(table, &path, "reserve_mib", edit.reserve_mib, &mut errors);
        }
        for (name, edit) in &self.upstreams {
            let Some(table) = named_entry(&mut doc, "upstream", name) else {
                errors.push(not_configured("upstream", name));
                continue;
            };
            let path = format!("upstream \"{name}\"");
            let e = &mut errors;
            set_int(
                table,
                &path,
                "default_min_free_mib",
                edit.default_min_free_mib,
                e,
            );
            set_int(
                table,
                &path,
                "resident_min_free_mib",
                edit.resident_min_free_mib,
                e,
            );
            set_str(table, "on_owner_return", edit.on_owner_return.as_deref());
            set_int(table, &path, "drain_timeout_s", edit.drain_timeout_s, e);
            if let Some(b) = edit.yield_on_veto {
                set_value(table, "yield_on_veto", Value::from(b));
            }
            set_str(table, "owner_scope", edit.owner_scope.as_deref());
            set_str(table, "management", edit.management.as_deref());
            if !edit.models.is_empty() {
                edit_models(table, &path, &edit.models, e);
            }
        }
        if errors.is_empty() {
            Ok(doc.to_string())
        } else {
            Err(errors)
        }
    }
}

fn not_configured(what: &str, name: &str) -> ConfigError {
    ConfigError {
        path: format!("{what} \"{name}\""),
        line: None,
        message: format!("no [[{what}]] named \"{name}\" in the configuration file"),
    }
}

/// The `[[kind]]` entry whose `name` is `name`.
fn named_entry<'d>(doc: &'d mut DocumentMut, kind: &str, name: &str) -> Option<&'d mut Table> {
    doc.get_mut(kind)?
        .as_array_of_tables_mut()?
        .iter_mut()
        .find(|t| t.get("name").and_then(Item::as_str) == Some(name))
}

/// Replace `key`'s value, keeping the comment and spacing around it; or add it.
fn set_value(table: &mut Table, key: &str, new: Value) {
    match table.get_mut(key).and_then(Item::as_value_mut) {
        Some(old) => {
            let decor = old.decor().clone();
            *old = new;
            *old.decor_mut() = decor;
        }
        None => {
            table.insert(key, Item::Value(new));
        }
    }
}

fn set_str(table: &mut Table, key: &str, value: Option<&str>) {
    if let Some(v) = value {
        set_value(table, key, Value::from(v));
    }
}

fn toml_int(path: &str, key: &str, v: u64, errors: &mut Vec<ConfigError>) -> Option<i64> {
    match i64::try_from(v) {
        Ok(i) => Some(i),
        Err(_) => {
            errors.push(ConfigError {
                path: format!("{path}.{key}"),
                line: None,
                message: format!("{v} is larger than a TOML integer can hold"),
            });
            None
        }
    }
}

fn set_int(
    table: &mut Table,
    path: &str,
    key: &str,
    value: Option<u64>,
    errors: &mut Vec<ConfigError>,
) {
    if let Some(i) = value.and_then(|v| toml_int(path, key, v, errors)) {
        set_value(table, key, Value::from(i));
    }
}

/// Set or remove `[upstream.models]` entries, keeping the table's own form
/// (a `[upstream.models]` table or an inline one).
fn edit_models(
    table: &mut Table,
    path: &str,
    models: &BTreeMap<String, Option<ModelEdit>>,
    errors: &mut Vec<ConfigError>,
) {
    if !table.contains_key("models") {
        let mut t = Table::new();
        t.set_implicit(false);
        table.insert("models", Item::Table(t));
    }
    let Some(item) = table.get_mut("models") else {
        return;
    };
    let path = format!("{path}.models");
    for (model, edit) in models {
        let entry = edit.as_ref().map(|m| {
            let mut inline = toml_edit::InlineTable::new();
            for (key, v) in [
                ("min_free_mib", m.min_free_mib),
                ("resident_min_free_mib", m.resident_min_free_mib),
            ] {
                if let Some(i) = v.and_then(|v| toml_int(&path, key, v, errors)) {
                    inline.insert(key, Value::from(i));
                }
            }
            inline
        });
        match (item.as_table_like_mut(), entry) {
            (Some(t), None) => {
                t.remove(model);
            }
            (Some(t), Some(inline)) => match t.get_mut(model) {
                Some(existing) if existing.is_table() => {
                    // A `[upstream.models."name"]` table of its own: keep it one.
                    *existing = Item::Table(inline.into_table());
                }
                _ => {
                    t.insert(model, Item::Value(Value::InlineTable(inline)));
                }
            },
            (None, _) => errors.push(ConfigError {
                path: path.clone(),
                line: None,
                message: "models is not a table".to_owned(),
            }),
        }
    }
}

/// The editable keys (and, coarsely, everything else) that differ between
/// the running configuration and the one saved on disk: what
/// "saved settings differ from the running ones" lists until a restart.
pub fn pending_keys(running: &Config, saved: &Config) -> Vec<String> {
    let mut keys = Vec::new();
    if running.server != saved.server {
        keys.push("[server]".to_owned());
    }
    if running.owner != saved.owner {
        keys.push("[owner]".to_owned());
    }
    diff_named(
        &running.resources,
        &saved.resources,
        "resource",
        |r| &r.name,
        resource_diff,
        &mut keys,
    );
    diff_named(
        &running.upstreams,
        &saved.upstreams,
        "upstream",
        |u| &u.name,
        upstream_diff,
        &mut keys,
    );
    keys
}

fn diff_named<T>(
    running: &[T],
    saved: &[T],
    kind: &str,
    name: impl Fn(&T) -> &String,
    diff: impl Fn(&T, &T, &str, &mut Vec<String>),
    keys: &mut Vec<String>,
) {
    for r in running {
        let path = format!("{kind}.{}", name(r));
        match saved.iter().find(|s| name(s) == name(r)) {
            Some(s) => diff(r, s, &path, keys),
            None => keys.push(format!("{path} (removed)")),
        }
    }
    for s in saved {
        if !running.iter().any(|r| name(r) == name(s)) {
            keys.push(format!("{kind}.{} (added)", name(s)));
        }
    }
}

fn resource_diff(a: &ResourceConfig, b: &ResourceConfig, path: &str, keys: &mut Vec<String>) {
    if a.reserve_mib != b.reserve_mib {
        keys.push(format!("{path}.reserve_mib"));
    }
    let same_otherwise = ResourceConfig {
        reserve_mib: b.reserve_mib,
        ..a.clone()
    } == *b;
    if !same_otherwise {
        keys.push(format!("{path} (other keys)"));
    }
}

fn upstream_diff(a: &UpstreamConfig, b: &UpstreamConfig, path: &str, keys: &mut Vec<String>) {
    let mut push = |changed: bool, key: &str| {
        if changed {
            keys.push(format!("{path}.{key}"));
        }
    };
    push(
        a.default_min_free_mib != b.default_min_free_mib,
        "default_min_free_mib",
    );
    push(
        a.resident_min_free_mib != b.resident_min_free_mib,
        "resident_min_free_mib",
    );
    push(a.on_owner_return != b.on_owner_return, "on_owner_return");
    push(a.drain_timeout_s != b.drain_timeout_s, "drain_timeout_s");
    push(a.yield_on_veto != b.yield_on_veto, "yield_on_veto");
    push(a.owner_scope != b.owner_scope, "owner_scope");
    push(a.management != b.management, "management");
    let models: std::collections::BTreeSet<&String> =
        a.models.keys().chain(b.models.keys()).collect();
    for m in models {
        let (x, y): (Option<&ModelRequirement>, Option<&ModelRequirement>) =
            (a.models.get(m), b.models.get(m));
        if x != y {
            keys.push(format!("{path}.models.{m}"));
        }
    }
    let same_otherwise = UpstreamConfig {
        default_min_free_mib: b.default_min_free_mib,
        resident_min_free_mib: b.resident_min_free_mib,
        on_owner_return: b.on_owner_return,
        drain_timeout_s: b.drain_timeout_s,
        yield_on_veto: b.yield_on_veto,
        owner_scope: b.owner_scope,
        management: b.management,
        models: b.models.clone(),
        ..a.clone()
    } == *b;
    if !same_otherwise {
        keys.push(format!("{path} (other keys)"));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const TEXT: &str = r#"# The owner's machine. Keep this comment.
[server]
listen = "127.0.0.1:7480"

[owner]
presence = "manual"

# The desktop GPU.
[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "/tmp/gpu0.json"
reserve_mib = 2048   # the desktop needs this much

[[upstream]]
name = "llama"
adapter = "llamacpp"
listen = "127.0.0.1:8081"
target = "http://127.0.0.1:8080"
resource = "gpu0"
default_min_free_mib = 4000 # measured
"#;

    fn edit(json: &str) -> SettingsEdit {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn an_edit_keeps_comments_layout_and_the_replaced_values_own_comment() {
        let e = edit(
            r#"{"resources": {"gpu0": {"reserve_mib": 3072}},
                "upstreams": {"llama": {"default_min_free_mib": 5000, "yield_on_veto": true,
                  "on_owner_return": "cancel", "drain_timeout_s": 10,
                  "models": {"qwen": {"min_free_mib": 6000}, "breeze": {"min_free_mib": 11500, "resident_min_free_mib": 500}}}}}"#,
        );
        let out = e.apply(TEXT).unwrap();
        assert!(
            out.starts_with("# The owner's machine. Keep this comment.\n"),
            "{out}"
        );
        assert!(out.contains("# The desktop GPU.\n[[resource]]"), "{out}");
        assert!(
            out.contains("reserve_mib = 3072   # the desktop needs this much\n"),
            "{out}"
        );
        assert!(
            out.contains("default_min_free_mib = 5000 # measured\n"),
            "{out}"
        );
        assert!(out.contains("yield_on_veto = true"), "{out}");
        let loaded = Config::parse(&out, "edited.toml").unwrap();
        let u = &loaded.config.upstreams[0];
        assert_eq!(u.model_min_free_mib(Some("qwen")), 6000);
        assert_eq!(u.model_resident_min_free_mib(Some("breeze")), 500);
        assert_eq!(u.drain_timeout_s, 10);
        assert_eq!(loaded.config.resources[0].reserve_mib, 3072);
        // Everything before the edited table is byte for byte the same.
        let head = &TEXT[..TEXT.find("reserve_mib").unwrap()];
        assert!(out.starts_with(head));
    }

    #[test]
    fn models_can_be_removed_and_an_unknown_name_is_an_error_with_its_key() {
        let with =
            edit(r#"{"upstreams": {"llama": {"models": {"qwen": {"min_free_mib": 6000}}}}}"#)
                .apply(TEXT)
                .unwrap();
        let without = edit(r#"{"upstreams": {"llama": {"models": {"qwen": null}}}}"#)
            .apply(&with)
            .unwrap();
        let loaded = Config::parse(&without, "t.toml").unwrap();
        assert!(loaded.config.upstreams[0].models.is_empty());
        let errors =
            edit(r#"{"resources": {"gpu9": {"reserve_mib": 1}}, "upstreams": {"nope": {}}}"#)
                .apply(TEXT)
                .unwrap_err();
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["resource \"gpu9\"", "upstream \"nope\""]);
    }

    #[test]
    fn a_bad_value_reaches_the_validator_which_names_its_key() {
        let out = edit(r#"{"upstreams": {"llama": {"on_owner_return": "sometimes"}}}"#)
            .apply(TEXT)
            .unwrap();
        let errors = Config::parse(&out, "t.toml").unwrap_err().errors;
        assert!(
            errors.iter().any(|e| e.path.contains("on_owner_return")),
            "{errors:?}"
        );
    }

    #[test]
    fn scope_and_management_need_admin() {
        // SCOPE-03: advanced workload permissions.
        assert!(!edit(r#"{"upstreams": {"llama": {"drain_timeout_s": 5}}}"#).needs_admin());
        assert!(edit(r#"{"upstreams": {"llama": {"owner_scope": "resource"}}}"#).needs_admin());
        assert!(edit(r#"{"upstreams": {"llama": {"management": "allow"}}}"#).needs_admin());
        assert!(
            serde_json::from_str::<SettingsEdit>(r#"{"upstreams": {"llama": {"target": "x"}}}"#)
                .is_err()
        );
    }

    #[test]
    fn pending_keys_name_what_a_restart_would_change() {
        // SCOPE-03: the running status stays authoritative until a restart.
        let running = Config::parse(TEXT, "t.toml").unwrap().config;
        let out = edit(
            r#"{"resources": {"gpu0": {"reserve_mib": 1}}, "upstreams": {"llama": {"owner_scope": "resource", "models": {"qwen": {"min_free_mib": 6000}}}}}"#,
        )
        .apply(TEXT)
        .unwrap();
        let saved = Config::parse(&out, "t.toml").unwrap().config;
        assert_eq!(
            pending_keys(&running, &saved),
            [
                "resource.gpu0.reserve_mib",
                "upstream.llama.owner_scope",
                "upstream.llama.models.qwen"
            ]
        );
        assert!(pending_keys(&running, &running).is_empty());
    }
}
