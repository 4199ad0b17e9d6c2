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

use std::path::Path;
use std::time::Duration;

use super::error::ConfigErrors;
use super::schema::{BorrowerEntry, BorrowersConfig, KeysFile};
use crate::engine::{BorrowerSpec, BorrowersSpec, TimeBudget};

impl KeysFile {
    /// Parse and check a keys file's text; `origin` names it in errors.
    ///
    /// # Errors
    ///
    /// Every problem, each with its key and line.
    pub fn parse(text: &str, origin: &str) -> Result<KeysFile, ConfigErrors> {
        let wrap = |errors| ConfigErrors {
            origin: origin.to_owned(),
            errors,
        };
        let parsed = super::parse::parse_doc::<KeysFile>(text, super::parse::check_keys_file)
            .map_err(wrap)?;
        let mut errors = super::validate::validate_keys_file(&parsed.config, &parsed.index);
        errors.extend(parsed.unknown_keys);
        super::parse::sort_by_line(&mut errors);
        if errors.is_empty() {
            Ok(parsed.config)
        } else {
            Err(wrap(errors))
        }
    }

    /// Read and check the keys file at `path`; a file that does not exist
    /// is an empty table (no borrower has a key yet).
    ///
    /// # Errors
    ///
    /// As [`parse`](Self::parse); a file that cannot be read gives one
    /// error naming the OS error.
    pub fn load(path: &Path) -> Result<KeysFile, ConfigErrors> {
        let origin = path.display().to_string();
        match std::fs::read(path) {
            Ok(bytes) => {
                let text = String::from_utf8(bytes).map_err(|_| {
                    ConfigErrors::whole(&origin, "the keys file is not UTF-8 text".to_owned())
                })?;
                KeysFile::parse(&text, &origin)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(KeysFile::default()),
            Err(e) => Err(ConfigErrors::whole(
                &origin,
                format!("cannot read the keys file: {e}"),
            )),
        }
    }

    /// The engine's borrower table: these borrowers under `config`'s terms.
    pub fn spec(&self, config: &BorrowersConfig) -> BorrowersSpec {
        let borrowers = self
            .borrowers
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
    KeysFile::parse(&out, "the keys file")?;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::ResourceKind;
    use crate::config::BudgetEntry;
    use crate::engine::{BudgetPeriod, Priority};

    const HASH_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const HASH_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn alice_file(extra: &str) -> String {
        format!(
            "[[borrower]]\nname = \"alice\"\nkey_sha256 = \"{HASH_A}\"\npriority = \"batch\"\nshare = 2\n{extra}"
        )
    }

    #[test]
    fn the_table_carries_class_share_limits_and_budgets() {
        // issue 34 items 2 and 3
        let text = alice_file(
            "max_running = 1\nmax_waiting = 5\n[[borrower.budget]]\nkind = \"gpu\"\nper = \"week\"\nseconds = 600\n",
        );
        let file = KeysFile::parse(&text, "keys").unwrap();
        let spec = file.spec(&BorrowersConfig::default());
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
        let anon = file.spec(&open).anonymous.unwrap();
        assert_eq!(anon.priority, Priority::Batch);
    }

    #[test]
    fn every_problem_is_named_with_its_key_and_line() {
        // issue 34 item 1: validated with key and line like the main configuration
        let text = format!(
            "{}[[borrower]]\nname = \"alice\"\nkey_sha256 = \"abc\"\nshare = 0\ncolour = \"red\"\n[[borrower.budget]]\nseconds = 0\n",
            alice_file("")
        );
        let e = KeysFile::parse(&text, "borrowers.toml")
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
        let e = KeysFile::parse("[[borrower]]\npriority = \"urgent\"\n", "k")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2: borrower[0].priority"), "{e}");
    }

    #[test]
    fn two_borrowers_may_not_share_a_key() {
        let text = format!(
            "{}[[borrower]]\nname = \"bob\"\nkey_sha256 = \"{}\"\n",
            alice_file(""),
            HASH_A.to_uppercase()
        );
        let e = KeysFile::parse(&text, "k").unwrap_err().to_string();
        assert!(e.contains("the same key as borrower \"alice\""), "{e}");
    }

    #[test]
    fn a_missing_keys_file_is_an_empty_table() {
        let dir = tempfile::tempdir().unwrap();
        let file = KeysFile::load(&dir.path().join("borrowers.toml")).unwrap();
        assert!(file.borrowers.is_empty());
    }

    #[test]
    fn borrowers_are_added_and_removed_keeping_the_files_comments() {
        // issue 34 item 1: `vacancyd borrower add|remove`
        let start = "# who may borrow\n".to_owned() + &alice_file("");
        let bob = BorrowerEntry {
            name: "bob".to_owned(),
            key_sha256: HASH_B.to_owned(),
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
        let file = KeysFile::parse(&added, "k").unwrap();
        assert_eq!(file.borrowers[1].name, "bob");
        assert_eq!(file.borrowers[1].budgets.len(), 1);
        assert!(
            keys_file_with(&added, &bob).is_err(),
            "a name is taken once"
        );
        let removed = keys_file_without(&added, "alice").unwrap().unwrap();
        let file = KeysFile::parse(&removed, "k").unwrap();
        assert_eq!(file.borrowers.len(), 1);
        assert_eq!(keys_file_without(&removed, "alice").unwrap(), None);
        assert!(
            keys_file_with("", &bob).is_ok(),
            "an empty file takes a first borrower"
        );
    }
}
