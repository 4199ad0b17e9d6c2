//! Spanned parsing that reports every problem at once.
//!
//! A single serde pass stops at the first error. Instead the document is parsed
//! into a spanned tree (`toml::de::DeTable`), then each table is checked key by
//! key: a struct is deserialized from a table holding only that key, which works
//! because every struct is `#[serde(default)]`. Nested tables are walked
//! explicitly, so problems in several of them are all reported. When every
//! value passes, the unknown keys are taken out of the tree and the rest is
//! deserialized into a [`Config`], so the semantic checks still run: an unknown
//! key has no effect, so it hides nothing they would find.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use serde::de::{self, DeserializeOwned};
use toml::Spanned;
use toml::de::{DeString, DeTable, DeValue, ValueDeserializer};

use super::error::ConfigError;
use super::schema::{
    BorrowersConfig, Config, CredentialConfig, GpuPressureConfig, LendingConfig, ModelRequirement,
    OwnerConfig, QueueConfig, ResourceConfig, ResourceRequirement, ServerConfig, TokenConfig,
    UpstreamConfig, VoiceRoutesConfig,
};

/// A configuration that parsed, with the line of every key that was written.
pub(crate) type Parsed = ParsedDoc<Config>;

/// A document of schema `T` that parsed, with the line of every key that was written.
pub(crate) struct ParsedDoc<T> {
    pub config: T,
    pub index: KeyIndex,
    /// Keys the schema does not have, left out of `config`; errors still, to
    /// be reported with the semantic ones.
    pub unknown_keys: Vec<ConfigError>,
}

/// Parse `text` into a [`Config`] (leaving out unknown keys, which are
/// returned as errors beside it), or return every syntax and schema error.
pub(crate) fn parse(text: &str) -> Result<Parsed, Vec<ConfigError>> {
    parse_doc::<Config>(text, check_root)
}

/// Parse `text` as a document of schema `T` whose root table `check` walks
/// (the main configuration, the borrowers' keys file).
pub(crate) fn parse_doc<T: DeserializeOwned>(
    text: &str,
    check: Check,
) -> Result<ParsedDoc<T>, Vec<ConfigError>> {
    let lines = LineMap::new(text);
    let (root, syntax_errors) = DeTable::parse_recoverable(text);
    if !syntax_errors.is_empty() {
        let mut errors: Vec<ConfigError> = Vec::new();
        for e in syntax_errors {
            let line = e.span().map(|s| lines.line_of(s.start));
            // Recovery often reports one mistake several times; keep the first per line.
            if line.is_some() && errors.iter().any(|x| x.line == line) {
                continue;
            }
            errors.push(ConfigError {
                path: String::new(),
                line,
                message: format!("invalid TOML: {}", e.message()),
            });
        }
        sort_by_line(&mut errors);
        return Err(errors);
    }

    let span = root.span();
    let mut root = Spanned::new(span, DeValue::Table(root.into_inner()));
    let mut walker = Walker {
        lines,
        errors: Vec::new(),
        unknown: Vec::new(),
        index: KeyIndex::default(),
    };
    check(&mut walker, &root, &KeyPath::root());
    if !walker.errors.is_empty() {
        // A value that does not parse leaves nothing sound to check further.
        let mut errors = walker.errors;
        errors.extend(walker.unknown.into_iter().map(|(_, e)| e));
        sort_by_line(&mut errors);
        return Err(errors);
    }
    let unknown: HashSet<String> = walker.unknown.iter().map(|(raw, _)| raw.clone()).collect();
    prune(&mut root, &KeyPath::root(), &unknown);
    let mut unknown_keys: Vec<ConfigError> = walker.unknown.into_iter().map(|(_, e)| e).collect();
    sort_by_line(&mut unknown_keys);
    let root_span = root.span();
    match T::deserialize(ValueDeserializer::from(root)) {
        Ok(config) => Ok(ParsedDoc {
            config,
            index: walker.index,
            unknown_keys,
        }),
        // Not expected once every key passed; reported rather than lost.
        Err(e) => {
            unknown_keys.push(ConfigError {
                path: String::new(),
                line: Some(walker.lines.line_of(e.span().unwrap_or(root_span).start)),
                message: describe(e.message()),
            });
            sort_by_line(&mut unknown_keys);
            Err(unknown_keys)
        }
    }
}

/// Take every key whose raw path is in `unknown` out of the tree under `value`.
fn prune(value: &mut Spanned<DeValue<'_>>, path: &KeyPath, unknown: &HashSet<String>) {
    if unknown.is_empty() {
        return;
    }
    match value.get_mut() {
        DeValue::Table(table) => {
            let mut gone: Vec<String> = Vec::new();
            for (key, child) in table.iter_mut() {
                let child_path = path.key(key.get_ref());
                if unknown.contains(child_path.raw()) {
                    gone.push(key.get_ref().to_string());
                } else {
                    prune(child, &child_path, unknown);
                }
            }
            for key in gone {
                table.remove(key.as_str());
            }
        }
        DeValue::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                prune(item, &path.elem(i, None), unknown);
            }
        }
        _ => {}
    }
}

/// Order errors by line; those without a line go last. The sort is stable.
pub(crate) fn sort_by_line<T>(items: &mut [T])
where
    T: HasLine,
{
    items.sort_by_key(|e| e.line().unwrap_or(usize::MAX));
}

/// Something with an optional line number.
pub(crate) trait HasLine {
    fn line(&self) -> Option<usize>;
}

impl HasLine for ConfigError {
    fn line(&self) -> Option<usize> {
        self.line
    }
}

impl HasLine for super::error::ConfigWarning {
    fn line(&self) -> Option<usize> {
        self.line
    }
}

/// A key path, both as raw text for lookups (`upstream[0].listen`) and as shown
/// to people (`upstream[0] ("ollama").listen`).
#[derive(Debug, Clone)]
pub(crate) struct KeyPath {
    /// The raw path of every ancestor and then this one, root (`""`) first.
    raws: Vec<String>,
    shown: String,
}

impl KeyPath {
    /// The document root.
    pub fn root() -> Self {
        KeyPath {
            raws: vec![String::new()],
            shown: String::new(),
        }
    }

    /// The raw path, used as the index key.
    pub fn raw(&self) -> &str {
        self.raws.last().map(String::as_str).unwrap_or_default()
    }

    /// The path as shown in messages.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// The path of `key` inside this table.
    pub fn key(&self, key: &str) -> Self {
        let segment = quote_key(key);
        let join = |base: &str| {
            if base.is_empty() {
                segment.clone()
            } else {
                format!("{base}.{segment}")
            }
        };
        let mut raws = self.raws.clone();
        raws.push(join(self.raw()));
        KeyPath {
            raws,
            shown: join(&self.shown),
        }
    }

    /// The path of element `i` of this array; `name` is shown when not empty.
    pub fn elem(&self, i: usize, name: Option<&str>) -> Self {
        let mut raws = self.raws.clone();
        raws.push(format!("{}[{i}]", self.raw()));
        let shown = match name {
            Some(name) if !name.is_empty() => format!("{}[{i}] ({name:?})", self.shown),
            _ => format!("{}[{i}]", self.shown),
        };
        KeyPath { raws, shown }
    }
}

/// A key as written in a path: bare when it can be, quoted otherwise.
fn quote_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

/// The line of every key and array element that was written, by raw path.
#[derive(Debug, Default)]
pub(crate) struct KeyIndex {
    lines: HashMap<String, usize>,
}

impl KeyIndex {
    /// The line of `path`, or of its nearest written ancestor.
    pub fn line(&self, path: &KeyPath) -> Option<usize> {
        path.raws
            .iter()
            .rev()
            .find_map(|raw| self.lines.get(raw).copied())
    }

    /// Whether `path` itself was written in the file.
    pub fn has(&self, path: &KeyPath) -> bool {
        self.lines.contains_key(path.raw())
    }

    /// Every written raw path.
    #[cfg(test)]
    pub fn raw_paths(&self) -> impl Iterator<Item = &str> {
        self.lines.keys().map(String::as_str)
    }

    fn insert(&mut self, path: &KeyPath, line: usize) {
        self.lines.entry(path.raw().to_owned()).or_insert(line);
    }
}

/// Byte offset to 1-based line.
struct LineMap {
    starts: Vec<usize>,
}

impl LineMap {
    fn new(text: &str) -> Self {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        LineMap { starts }
    }

    fn line_of(&self, offset: usize) -> usize {
        self.starts.partition_point(|&start| start <= offset).max(1)
    }
}

pub(crate) struct Walker {
    lines: LineMap,
    /// Values that do not parse.
    errors: Vec<ConfigError>,
    /// Keys the schema does not have, by raw path.
    unknown: Vec<(String, ConfigError)>,
    index: KeyIndex,
}

impl Walker {
    fn error_at(&mut self, path: &KeyPath, span: Range<usize>, message: String) {
        self.errors.push(ConfigError {
            path: path.shown().to_owned(),
            line: Some(self.lines.line_of(span.start)),
            message,
        });
    }

    fn de_error(&mut self, path: &KeyPath, fallback: Range<usize>, e: &toml::de::Error) {
        let span = e.span().unwrap_or(fallback);
        self.error_at(path, span, describe(e.message()));
    }
}

pub(crate) type Check = fn(&mut Walker, &Spanned<DeValue<'_>>, &KeyPath);

/// How a nested key is walked.
enum Nested {
    /// A table of the child struct.
    Table(Check),
    /// An array of tables of the child struct.
    Array(Check),
    /// A table whose every entry is a table of the child struct.
    Map(Check),
}

fn check_root(w: &mut Walker, v: &Spanned<DeValue<'_>>, p: &KeyPath) {
    check_struct::<Config>(
        w,
        v,
        p,
        &[
            ("server", Nested::Table(check_server)),
            ("owner", Nested::Table(check_owner)),
            ("lending", Nested::Table(check_struct_leaf::<LendingConfig>)),
            (
                "resource",
                Nested::Array(check_struct_leaf::<ResourceConfig>),
            ),
            ("upstream", Nested::Array(check_upstream)),
            (
                "borrowers",
                Nested::Table(check_struct_leaf::<BorrowersConfig>),
            ),
        ],
    );
}

/// The borrowers' keys file (issue 34): `[[borrower]]` tables, each with
/// its `[[borrower.budget]]` tables.
pub(crate) fn check_keys_file(w: &mut Walker, v: &Spanned<DeValue<'_>>, p: &KeyPath) {
    check_struct::<super::schema::KeysFile>(
        w,
        v,
        p,
        &[("borrower", Nested::Array(check_borrower))],
    );
}

fn check_borrower(w: &mut Walker, v: &Spanned<DeValue<'_>>, p: &KeyPath) {
    check_struct::<super::schema::BorrowerEntry>(
        w,
        v,
        p,
        &[(
            "budget",
            Nested::Array(check_struct_leaf::<super::schema::BudgetEntry>),
        )],
    );
}

fn check_server(w: &mut Walker, v: &Spanned<DeValue<'_>>, p: &KeyPath) {
    check_struct::<ServerConfig>(
        w,
        v,
        p,
        &[("token", Nested::Array(check_struct_leaf::<TokenConfig>))],
    );
}

fn check_owner(w: &mut Walker, v: &Spanned<DeValue<'_>>, p: &KeyPath) {
    check_struct::<OwnerConfig>(
        w,
        v,
        p,
        &[(
            "gpu_pressure",
            Nested::Table(check_struct_leaf::<GpuPressureConfig>),
        )],
    );
}

fn check_upstream(w: &mut Walker, v: &Spanned<DeValue<'_>>, p: &KeyPath) {
    check_struct::<UpstreamConfig>(
        w,
        v,
        p,
        &[
            ("models", Nested::Map(check_struct_leaf::<ModelRequirement>)),
            (
                "requirements",
                Nested::Map(check_struct_leaf::<ResourceRequirement>),
            ),
            (
                "credential",
                Nested::Table(check_struct_leaf::<CredentialConfig>),
            ),
            (
                "voice_routes",
                Nested::Table(check_struct_leaf::<VoiceRoutesConfig>),
            ),
            ("adapter_settings", Nested::Table(index_free_table)),
            ("queue", Nested::Table(check_struct_leaf::<QueueConfig>)),
        ],
    );
}

/// `[upstream.adapter_settings]`: any keys (the adapter kind's factory checks
/// them), each indexed with its line so its problems name key and line.
fn index_free_table(w: &mut Walker, v: &Spanned<DeValue<'_>>, p: &KeyPath) {
    let DeValue::Table(table) = v.get_ref() else {
        w.error_at(
            p,
            v.span(),
            "expected a table of the adapter's own settings".to_owned(),
        );
        return;
    };
    for (key, val) in table.iter() {
        let key_path = p.key(key.get_ref());
        let line = w.lines.line_of(key.span().start);
        w.index.insert(&key_path, line);
        if matches!(val.get_ref(), DeValue::Table(_)) {
            index_free_table(w, val, &key_path);
        }
    }
}

fn check_struct_leaf<T: DeserializeOwned>(w: &mut Walker, v: &Spanned<DeValue<'_>>, p: &KeyPath) {
    check_struct::<T>(w, v, p, &[]);
}

/// Check one table against struct `T`, key by key, recursing into `nested` keys.
fn check_struct<T: DeserializeOwned>(
    w: &mut Walker,
    value: &Spanned<DeValue<'_>>,
    path: &KeyPath,
    nested: &[(&str, Nested)],
) {
    let DeValue::Table(table) = value.get_ref() else {
        // Not a table at all: let serde say what was expected.
        if let Err(e) = T::deserialize(ValueDeserializer::from(value.clone())) {
            w.de_error(path, value.span(), &e);
        }
        return;
    };
    let fields = field_names::<T>();
    for (key, val) in table.iter() {
        let name: &str = key.get_ref();
        let key_path = path.key(name);
        let line = w.lines.line_of(key.span().start);
        w.index.insert(&key_path, line);
        if !fields.contains(&name) {
            let error = ConfigError {
                path: key_path.shown().to_owned(),
                line: Some(line),
                message: unknown_key_message(name, fields),
            };
            w.unknown.push((key_path.raw().to_owned(), error));
            continue;
        }
        let how = nested.iter().find(|(n, _)| *n == name).map(|(_, how)| how);
        match (how, val.get_ref()) {
            (Some(Nested::Table(check)), _) => check(w, val, &key_path),
            (Some(Nested::Array(check)), DeValue::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let item_path = key_path.elem(i, name_of(item));
                    let line = w.lines.line_of(item.span().start);
                    w.index.insert(&item_path, line);
                    check(w, item, &item_path);
                }
            }
            (Some(Nested::Array(_)), DeValue::Table(_)) => {
                let message = format!(
                    "expected an array of tables, found a table; write each entry under its own [[{}]] header",
                    key_path.raw()
                );
                w.error_at(&key_path, val.span(), message);
            }
            (Some(Nested::Map(check)), DeValue::Table(entries)) => {
                for (entry_key, entry) in entries.iter() {
                    let entry_path = key_path.key(entry_key.get_ref());
                    let line = w.lines.line_of(entry_key.span().start);
                    w.index.insert(&entry_path, line);
                    check(w, entry, &entry_path);
                }
            }
            _ => check_one_key::<T>(w, value.span(), key, val, &key_path),
        }
    }
}

/// Deserialize `T` from a table holding only `key = val`.
fn check_one_key<T: DeserializeOwned>(
    w: &mut Walker,
    table_span: Range<usize>,
    key: &Spanned<DeString<'_>>,
    val: &Spanned<DeValue<'_>>,
    path: &KeyPath,
) {
    let mut one = DeTable::new();
    one.insert(key.clone(), val.clone());
    let de = ValueDeserializer::from(Spanned::new(table_span, DeValue::Table(one)));
    if let Err(e) = T::deserialize(de) {
        w.de_error(path, val.span(), &e);
    }
}

/// The `name` of an array-of-tables element, for paths like `upstream[0] ("ollama")`.
fn name_of<'a>(item: &'a Spanned<DeValue<'_>>) -> Option<&'a str> {
    match item.get_ref() {
        DeValue::Table(t) => match t.get("name").map(Spanned::get_ref) {
            Some(DeValue::String(s)) => Some(s),
            _ => None,
        },
        _ => None,
    }
}

/// Every table of the schema with the keys it accepts.
#[cfg(test)]
pub(crate) fn all_tables() -> Vec<(&'static str, &'static [&'static str])> {
    vec![
        ("(root)", field_names::<Config>()),
        ("server", field_names::<ServerConfig>()),
        ("server.token", field_names::<TokenConfig>()),
        ("owner", field_names::<OwnerConfig>()),
        ("owner.gpu_pressure", field_names::<GpuPressureConfig>()),
        ("lending", field_names::<LendingConfig>()),
        ("resource", field_names::<ResourceConfig>()),
        ("upstream", field_names::<UpstreamConfig>()),
        ("borrowers", field_names::<BorrowersConfig>()),
        ("upstream.models.*", field_names::<ModelRequirement>()),
        (
            "upstream.requirements.*",
            field_names::<ResourceRequirement>(),
        ),
        ("upstream.credential", field_names::<CredentialConfig>()),
        ("upstream.voice_routes", field_names::<VoiceRoutesConfig>()),
        ("upstream.queue", field_names::<QueueConfig>()),
    ]
}

/// The keys struct `T` accepts, as serde sees them (after renames).
fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut fields: &'static [&'static str] = &[];
    // The probe always fails after recording the fields; the error carries nothing.
    let _ = T::deserialize(FieldProbe(&mut fields));
    fields
}

struct FieldProbe<'a>(&'a mut &'static [&'static str]);

impl<'de> de::Deserializer<'de> for FieldProbe<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: de::Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("field probe"))
    }

    fn deserialize_struct<V: de::Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(de::Error::custom("field probe"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

fn unknown_key_message(key: &str, fields: &[&str]) -> String {
    let suggestion = fields
        .iter()
        .map(|f| (edit_distance(key, f), *f))
        .filter(|(d, f)| *d <= 2 && *d < f.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, f)| format!(" (did you mean \"{f}\"?)"))
        .unwrap_or_default();
    format!(
        "unknown key{suggestion}; valid keys here: {}",
        fields.join(", ")
    )
}

/// Levenshtein distance between two short keys.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if ca == *cb {
                diagonal
            } else {
                1 + diagonal.min(above).min(row[j])
            };
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Rewrite serde's messages in configuration terms; anything unrecognized is kept.
fn describe(message: &str) -> String {
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let quoted = backticked(rest);
        if let Some((value, allowed)) = quoted.split_first() {
            let allowed: Vec<String> = allowed.iter().map(|a| format!("\"{a}\"")).collect();
            return format!(
                "unknown value \"{value}\"; allowed values: {}",
                allowed.join(", ")
            );
        }
    }
    let rest = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "));
    if let Some((found, expected)) = rest.and_then(|r| r.rsplit_once(", expected ")) {
        return format!(
            "expected {}, found {}",
            expected_name(expected),
            found_name(found)
        );
    }
    if message == "wanted string or table" {
        return "expected a string".to_owned();
    }
    message.to_owned()
}

fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn expected_name(expected: &str) -> String {
    match expected {
        "u64" | "u32" | "u16" | "usize" => "a non-negative integer".to_owned(),
        "u8" => "an integer from 0 to 255".to_owned(),
        "a sequence" => "an array".to_owned(),
        "a map" => "a table".to_owned(),
        e if e.starts_with("struct ") => "a table".to_owned(),
        e => e.to_owned(),
    }
}

fn found_name(found: &str) -> String {
    match found {
        "map" => "a table".to_owned(),
        "sequence" => "an array".to_owned(),
        f => f.replace('`', ""),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn key_paths_quote_and_name() {
        let p = KeyPath::root().key("upstream").elem(0, Some("ollama"));
        let m = p.key("models").key("llama3.1:8b").key("min_free_mib");
        assert_eq!(m.raw(), "upstream[0].models.\"llama3.1:8b\".min_free_mib");
        assert_eq!(
            m.shown(),
            "upstream[0] (\"ollama\").models.\"llama3.1:8b\".min_free_mib"
        );
        assert_eq!(
            KeyPath::root().key("server").key("listen").shown(),
            "server.listen"
        );
        assert_eq!(
            KeyPath::root().key("resource").elem(2, None).shown(),
            "resource[2]"
        );
    }

    #[test]
    fn field_probe_sees_renamed_keys() {
        assert_eq!(
            field_names::<Config>(),
            &[
                "server",
                "owner",
                "resource",
                "upstream",
                "lending",
                "borrowers"
            ]
        );
        assert!(field_names::<ServerConfig>().contains(&"token"));
    }

    #[test]
    fn line_map_is_one_based() {
        let m = LineMap::new("a\nb\n\nc");
        assert_eq!(m.line_of(0), 1);
        assert_eq!(m.line_of(1), 1);
        assert_eq!(m.line_of(2), 2);
        assert_eq!(m.line_of(5), 4);
    }

    #[test]
    fn serde_messages_are_rewritten() {
        assert_eq!(
            describe("unknown variant `maybe`, expected one of `auto`, `none`"),
            "unknown value \"maybe\"; allowed values: \"auto\", \"none\""
        );
        assert_eq!(
            describe("unknown variant `x`, expected `deny` or `allow`"),
            "unknown value \"x\"; allowed values: \"deny\", \"allow\""
        );
        assert_eq!(
            describe("invalid type: string \"a\", expected u64"),
            "expected a non-negative integer, found string \"a\""
        );
        assert_eq!(
            describe("invalid value: integer `-1`, expected u64"),
            "expected a non-negative integer, found integer -1"
        );
        assert_eq!(describe("something else"), "something else");
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("lisen", "listen"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("abc", "abc"), 0);
        assert_eq!(edit_distance("kind", "sink"), 2);
    }
}
