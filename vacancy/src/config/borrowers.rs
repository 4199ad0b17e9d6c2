//! The borrowers' keys file (issue 34): one `[[borrower]]` per named
//! borrower, with the SHA-256 of its key (never the key itself), its class,
//! its weight in the line, its limits and its budgets.
//!
//! ```toml
//! [[borrower]]
//! name = "alice"
//! key_sha256 = "9f86d0…"          # `vacancyd borrower add alice` writes it
//! priority = "batch"             # interactive (default) | batch
//! share = 1                      # 1 to 1000
//! max_running = 2                # optional
//! max_waiting = 20               # optional
//!
//! [[borrower.budget]]
//! kind = "gpu"                   # gpu | memory | cpu
//! per = "day"                    # day (UTC) | week (from Monday 00:00 UTC)
//! seconds = 3600
//! ```
//!
//! It is checked like the main configuration (every problem, with its key
//! and line), and a file that does not pass changes nothing: the daemon
//! keeps the table it has.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::error::ConfigErrors;
use super::schema::BorrowersConfig;
use crate::ResourceKind;
use crate::engine::{BorrowerSpec, BorrowersSpec, BudgetPeriod, Priority, TimeBudget};

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
    pub priority: Priority,
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
            priority: Priority::Interactive,
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
    pub per: BudgetPeriod,
    /// Seconds of one resource of the kind held, from admission to release.
    pub seconds: u64,
}

impl Default for BudgetEntry {
    fn default() -> Self {
        BudgetEntry {
            kind: ResourceKind::Gpu,
            per: BudgetPeriod::Day,
            seconds: 0,
        }
    }
}

/// The keys of a checked keys file, for telling who a request is for.
///
/// # Behavior
///
/// A presented key is hashed (SHA-256) and looked up by its hash; the hash
/// found is compared again in constant time. The lookup's timing depends
/// only on the hash of what was presented, which tells an attacker nothing
/// about any key, and no key is ever stored or logged.
#[derive(Debug, Clone, Default)]
pub struct BorrowerKeys {
    by_hash: HashMap<[u8; 32], usize>,
    names: Vec<Arc<str>>,
    entries: Vec<BorrowerEntry>,
}

impl BorrowerKeys {
    /// Parse and check a keys file's text; `origin` names it in errors.
    ///
    /// # Errors
    ///
    /// Every problem, each with its key and line.
    pub fn parse(text: &str, origin: &str) -> Result<BorrowerKeys, ConfigErrors> {
        let wrap = |errors| ConfigErrors {
            origin: origin.to_owned(),
            errors,
        };
        let parsed = super::parse::parse_doc::<KeysFile>(text, super::parse::check_keys_file)
            .map_err(wrap)?;
        let mut errors = super::validate::validate_keys_file(&parsed.config, &parsed.index);
        errors.extend(parsed.unknown_keys);
        super::parse::sort_by_line(&mut errors);
        if !errors.is_empty() {
            return Err(wrap(errors));
        }
        let mut keys = BorrowerKeys::default();
        for (i, b) in parsed.config.borrowers.into_iter().enumerate() {
            if let Some(hash) = digest_of_hex(&b.key_sha256) {
                keys.by_hash.insert(hash, i);
            }
            keys.names.push(Arc::from(b.name.as_str()));
            keys.entries.push(b);
        }
        Ok(keys)
    }

    /// Read and check the keys file at `path`; a file that does not exist
    /// is an empty table (no borrower has a key yet).
    ///
    /// # Errors
    ///
    /// As [`parse`](Self::parse); a file that cannot be read gives one
    /// error naming the OS error.
    pub fn load(path: &Path) -> Result<BorrowerKeys, ConfigErrors> {
        let origin = path.display().to_string();
        match std::fs::read(path) {
            Ok(bytes) => {
                let text = String::from_utf8(bytes).map_err(|_| {
                    ConfigErrors::whole(&origin, "the keys file is not UTF-8 text".to_owned())
                })?;
                BorrowerKeys::parse(&text, &origin)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BorrowerKeys::default()),
            Err(e) => Err(ConfigErrors::whole(
                &origin,
                format!("cannot read the keys file: {e}"),
            )),
        }
    }

    /// The borrower whose key `presented` is, if any.
    pub fn identify(&self, presented: &str) -> Option<&Arc<str>> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let &i = self.by_hash.get(&digest)?;
        let stored = digest_of_hex(&self.entries[i].key_sha256)?;
        crate::auth::constant_time_eq(&stored, &digest).then(|| &self.names[i])
    }

    /// How many borrowers the file names.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it names none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The borrowers as the file lists them.
    pub fn entries(&self) -> &[BorrowerEntry] {
        &self.entries
    }

    /// The engine's borrower table: these borrowers under `config`'s terms.
    pub fn spec(&self, config: &BorrowersConfig) -> BorrowersSpec {
        let borrowers = self
            .entries
            .iter()
            .map(|b| BorrowerSpec {
                name: b.name.clone(),
                priority: b.priority,
                share: b.share,
                max_running: b.max_running,
                max_waiting: b.max_waiting,
                budgets: b
                    .budgets
                    .iter()
                    .map(|t| TimeBudget {
                        kind: t.kind,
                        period: t.per,
                        allowed: Duration::from_secs(t.seconds),
                    })
                    .collect(),
            })
            .collect();
        let anonymous = (!config.require_key).then(|| BorrowerSpec {
            priority: config.anonymous_priority,
            ..BorrowerSpec::new(crate::engine::ANONYMOUS)
        });
        BorrowersSpec {
            borrowers,
            batch_max_wait: Duration::from_secs(config.batch_max_wait_s),
            anonymous,
        }
    }
}

/// `text` (a keys file) with `entry` added as a new `[[borrower]]` at its
/// end, every comment and entry before it kept (`vacancyd borrower add`).
/// The result is checked as the daemon checks it.
///
/// # Errors
///
/// `text` is not TOML, or the result does not pass (a name taken twice).
pub fn keys_file_with(text: &str, entry: &BorrowerEntry) -> Result<String, ConfigErrors> {
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .map_err(|e| ConfigErrors::whole("the keys file", format!("invalid TOML: {e}")))?;
    let mut t = toml_edit::Table::new();
    t["name"] = toml_edit::value(entry.name.as_str());
    t["key_sha256"] = toml_edit::value(entry.key_sha256.as_str());
    t["priority"] = toml_edit::value(entry.priority.as_str());
    t["share"] = toml_edit::value(i64::from(entry.share));
    if let Some(n) = entry.max_running {
        t["max_running"] = toml_edit::value(i64::from(n));
    }
    if let Some(n) = entry.max_waiting {
        t["max_waiting"] = toml_edit::value(i64::from(n));
    }
    if !entry.budgets.is_empty() {
        let mut budgets = toml_edit::ArrayOfTables::new();
        for b in &entry.budgets {
            let mut bt = toml_edit::Table::new();
            bt["kind"] = toml_edit::value(b.kind.as_str());
            bt["per"] = toml_edit::value(b.per.as_str());
            bt["seconds"] = toml_edit::value(i64::try_from(b.seconds).unwrap_or(i64::MAX));
            budgets.push(bt);
        }
        t.insert("budget", toml_edit::Item::ArrayOfTables(budgets));
    }
    match doc
        .entry("borrower")
        .or_insert(toml_edit::Item::ArrayOfTables(
            toml_edit::ArrayOfTables::new(),
        )) {
        toml_edit::Item::ArrayOfTables(list) => list.push(t),
        _ => {
            return Err(ConfigErrors::whole(
                "the keys file",
                "its `borrower` key is not a list of [[borrower]] tables".to_owned(),
            ));
        }
    }
    let out = doc.to_string();
    BorrowerKeys::parse(&out, "the keys file")?;
    Ok(out)
}

/// `text` (a keys file) without borrower `name`; `None` if it has no such
/// borrower (`vacancyd borrower remove`).
///
/// # Errors
///
/// `text` is not TOML.
pub fn keys_file_without(text: &str, name: &str) -> Result<Option<String>, ConfigErrors> {
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .map_err(|e| ConfigErrors::whole("the keys file", format!("invalid TOML: {e}")))?;
    let Some(toml_edit::Item::ArrayOfTables(list)) = doc.get_mut("borrower") else {
        return Ok(None);
    };
    let Some(i) = list
        .iter()
        .position(|t| t.get("name").and_then(|n| n.as_str()) == Some(name))
    else {
        return Ok(None);
    };
    list.remove(i);
    Ok(Some(doc.to_string()))
}

/// The 32 bytes of a hex SHA-256; `None` if it is not one.
fn digest_of_hex(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let nibble = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

/// A fresh borrower key: 32 random bytes from the operating system,
/// hex-encoded after `vbk_`, so a key found in a log or a paste is
/// recognizable as vacancy's.
///
/// # Errors
///
/// The operating system's random source failed.
pub fn new_borrower_key() -> Result<String, getrandom::Error> {
    let token = crate::auth::new_token()?;
    Ok(format!("vbk_{}", token.trim_start_matches("vac_")))
}

/// The hash a keys file stores for `key`.
pub fn hash_borrower_key(key: &str) -> String {
    crate::auth::hash_token(key)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    const ALICE_KEY: &str = "vbk_alice";

    fn alice_file(extra: &str) -> String {
        format!(
            "[[borrower]]\nname = \"alice\"\nkey_sha256 = \"{}\"\npriority = \"batch\"\nshare = 2\n{extra}",
            hash_borrower_key(ALICE_KEY)
        )
    }

    #[test]
    fn a_key_names_its_borrower_and_nothing_else_does() {
        // issue 34 item 1
        let keys = BorrowerKeys::parse(&alice_file(""), "keys").unwrap();
        assert_eq!(keys.identify(ALICE_KEY).map(|n| &**n), Some("alice"));
        assert_eq!(keys.identify("vbk_alicf"), None);
        assert_eq!(keys.identify(""), None);
        assert_eq!(
            keys.identify(&hash_borrower_key(ALICE_KEY)),
            None,
            "the hash is not a key"
        );
    }

    #[test]
    fn the_table_carries_class_share_limits_and_budgets() {
        // issue 34 items 2 and 3
        let text = alice_file(
            "max_running = 1\nmax_waiting = 5\n[[borrower.budget]]\nkind = \"gpu\"\nper = \"week\"\nseconds = 600\n",
        );
        let keys = BorrowerKeys::parse(&text, "keys").unwrap();
        let spec = keys.spec(&BorrowersConfig::default());
        let a = &spec.borrowers[0];
        assert_eq!((a.priority, a.share), (Priority::Batch, 2));
        assert_eq!((a.max_running, a.max_waiting), (Some(1), Some(5)));
        assert_eq!(
            a.budgets,
            vec![TimeBudget {
                kind: ResourceKind::Gpu,
                period: BudgetPeriod::Week,
                allowed: Duration::from_secs(600)
            }]
        );
        assert_eq!(spec.anonymous, None, "require_key defaults to true");
        let open = BorrowersConfig {
            require_key: false,
            ..BorrowersConfig::default()
        };
        let anon = keys.spec(&open).anonymous.unwrap();
        assert_eq!(anon.priority, Priority::Batch);
    }

    #[test]
    fn every_problem_is_named_with_its_key_and_line() {
        // issue 34 item 1: validated with key and line like the main configuration
        let text = format!(
            "{}[[borrower]]\nname = \"alice\"\nkey_sha256 = \"abc\"\nshare = 0\ncolour = \"red\"\n[[borrower.budget]]\nseconds = 0\n",
            alice_file("")
        );
        let e = BorrowerKeys::parse(&text, "borrowers.toml")
            .unwrap_err()
            .to_string();
        for want in [
            "borrowers.toml: line 7: borrower[1] (\"alice\").name: borrower \"alice\" is listed twice",
            "line 8: borrower[1] (\"alice\").key_sha256: missing or not a SHA-256",
            "line 9: borrower[1] (\"alice\").share: 0 is outside 1 to 1000",
            "line 10: borrower[1] (\"alice\").colour: unknown key",
            "line 12: borrower[1] (\"alice\").budget[0].seconds: must be above 0",
        ] {
            assert!(e.contains(want), "missing {want:?} in:\n{e}");
        }
        let e = BorrowerKeys::parse("[[borrower]]\npriority = \"urgent\"\n", "k")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2: borrower[0].priority"), "{e}");
    }

    #[test]
    fn two_borrowers_may_not_share_a_key() {
        let text = format!(
            "{}[[borrower]]\nname = \"bob\"\nkey_sha256 = \"{}\"\n",
            alice_file(""),
            hash_borrower_key(ALICE_KEY).to_uppercase()
        );
        let e = BorrowerKeys::parse(&text, "k").unwrap_err().to_string();
        assert!(e.contains("the same key as borrower \"alice\""), "{e}");
    }

    #[test]
    fn a_missing_keys_file_is_an_empty_table() {
        let dir = tempfile::tempdir().unwrap();
        let keys = BorrowerKeys::load(&dir.path().join("borrowers.toml")).unwrap();
        assert!(keys.is_empty());
    }

    #[test]
    fn borrowers_are_added_and_removed_keeping_the_files_comments() {
        // issue 34 item 1: `vacancyd borrower add|remove`
        let start = "# who may borrow\n".to_owned() + &alice_file("");
        let bob = BorrowerEntry {
            name: "bob".to_owned(),
            key_sha256: hash_borrower_key("vbk_bob"),
            max_running: Some(2),
            budgets: vec![BudgetEntry {
                kind: ResourceKind::Gpu,
                per: BudgetPeriod::Week,
                seconds: 60,
            }],
            ..BorrowerEntry::default()
        };
        let added = keys_file_with(&start, &bob).unwrap();
        assert!(added.starts_with("# who may borrow\n"), "{added}");
        let keys = BorrowerKeys::parse(&added, "k").unwrap();
        assert_eq!(keys.identify("vbk_bob").map(|n| &**n), Some("bob"));
        assert_eq!(keys.entries()[1].budgets.len(), 1);
        assert!(
            keys_file_with(&added, &bob).is_err(),
            "a name is taken once"
        );
        let removed = keys_file_without(&added, "alice").unwrap().unwrap();
        let keys = BorrowerKeys::parse(&removed, "k").unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys.identify(ALICE_KEY), None);
        assert_eq!(keys_file_without(&removed, "alice").unwrap(), None);
        assert!(
            keys_file_with("", &bob).is_ok(),
            "an empty file takes a first borrower"
        );
    }

    #[test]
    fn new_keys_are_random_long_and_recognizable() {
        let (a, b) = (new_borrower_key().unwrap(), new_borrower_key().unwrap());
        assert_ne!(a, b);
        assert!(a.starts_with("vbk_") && a.len() == 68, "{a}");
    }
}
