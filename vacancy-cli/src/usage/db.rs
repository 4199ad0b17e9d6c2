//! The owner's record on disk (issue 34 item 4): one SQLite file the daemon
//! writes and `vacancyd usage` reads while it does.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use vacancy::engine::{EntryId, UsageRecord};

/// The schema this build writes and reads (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i32 = 1;

/// How long a statement waits for the other side's lock before failing: the
/// daemon's writes are one row, so any wait this long means something is wrong.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS reservations (
    entry TEXT PRIMARY KEY NOT NULL,
    borrower TEXT NOT NULL,
    upstream TEXT NOT NULL,
    model TEXT,
    priority TEXT NOT NULL,
    admitted_unix_ms INTEGER NOT NULL,
    released_unix_ms INTEGER NOT NULL,
    waited_s REAL NOT NULL,
    held INTEGER NOT NULL,
    gpu_s REAL NOT NULL,
    memory_s REAL NOT NULL,
    cpu_s REAL NOT NULL,
    resources TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS reservations_released ON reservations (released_unix_ms);
CREATE TABLE IF NOT EXISTS refusals (
    borrower TEXT NOT NULL,
    day_unix_s INTEGER NOT NULL,
    code TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (borrower, day_unix_s, code)
);
";

/// The database's file name.
pub const DB_FILE: &str = "usage.sqlite";

/// The database of the daemon whose recovery directory is `recovery_dir`:
/// beside it, so the journal's directory keeps only the journal's files.
pub fn path_beside(recovery_dir: &Path) -> PathBuf {
    recovery_dir.parent().unwrap_or(recovery_dir).join(DB_FILE)
}

/// Why the record cannot be opened, read or written; each names the file.
#[derive(Debug, Error)]
pub enum UsageError {
    /// SQLite failed.
    #[error("usage database {path}: {action}: {source}")]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// The file was written by a newer vacancyd: reading it could misreport,
    /// writing it could corrupt what the newer version keeps.
    #[error(
        "usage database {path} has schema version {found}; this vacancyd knows up to {supported} (upgrade vacancyd, or move the file aside)"
    )]
    NewerSchema {
        /// The database file.
        path: PathBuf,
        /// Its `user_version`.
        found: i32,
        /// [`SCHEMA_VERSION`].
        supported: i32,
    },
    /// A stored row cannot be read back (its resources column is not the JSON written).
    #[error("usage database {path}: entry {entry}: unreadable resources: {source}")]
    Resources {
        /// The database file.
        path: PathBuf,
        /// The entry.
        entry: String,
        /// The JSON error.
        source: serde_json::Error,
    },
}

/// One resource a reservation held, as the `resources` column keeps it (a JSON array).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCharge {
    /// The resource.
    pub resource: String,
    /// MiB admission charged above the reserve.
    pub required_mib: u64,
}

/// One stored reservation, as reports read it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReservationRow {
    /// The entry ID as text.
    pub entry: String,
    /// The borrower.
    pub borrower: String,
    /// The upstream.
    pub upstream: String,
    /// The model, when known.
    pub model: Option<String>,
    /// `interactive` or `batch`.
    pub priority: String,
    /// Admission, Unix milliseconds.
    pub admitted_unix_ms: i64,
    /// Release, Unix milliseconds.
    pub released_unix_ms: i64,
    /// Seconds waited in line.
    pub waited_s: f64,
    /// Whether it was held before its release.
    pub held: bool,
    /// Reserved GPU seconds.
    pub gpu_s: f64,
    /// Reserved memory seconds.
    pub memory_s: f64,
    /// Reserved processor seconds.
    pub cpu_s: f64,
    /// The resources held, primary first.
    pub resources: Vec<StoredCharge>,
}

/// Refusals of one borrower on one UTC day for one reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusalRow {
    /// The borrower.
    pub borrower: String,
    /// The UTC day's midnight, Unix seconds.
    pub day_unix_s: i64,
    /// The refusal code.
    pub code: String,
    /// How many.
    pub count: u64,
}

/// The owner's record: reservations (one row per entry, written once) and
/// refusal counts per borrower, day and code.
#[derive(Debug)]
pub struct UsageDb {
    conn: Connection,
    path: PathBuf,
    /// A read-only open of a file no writer has set up yet: reads find nothing.
    empty: bool,
}

impl UsageDb {
    /// Open for writing, creating the file and its tables if missing.
    ///
    /// WAL, so `vacancyd usage` reads while the daemon writes; `synchronous
    /// = FULL`, so a committed row is on disk before the daemon lets its
    /// journal forget the entry.
    ///
    /// # Errors
    ///
    /// The file cannot be opened or set up, or a newer vacancyd wrote it.
    pub fn open(path: &Path) -> Result<UsageDb, UsageError> {
        let conn = Connection::open(path).map_err(sqlite(path, "open"))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(sqlite(path, "set busy_timeout"))?;
        // journal_mode answers with the mode it took.
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(sqlite(path, "set journal_mode"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(path = %path.display(), mode, "usage database is not in WAL mode; reports may wait on the daemon's writes");
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sqlite(path, "set synchronous"))?;
        let found = schema_version(&conn, path)?;
        if found < SCHEMA_VERSION {
            let tx = conn
                .unchecked_transaction()
                .map_err(sqlite(path, "begin"))?;
            tx.execute_batch(SCHEMA)
                .map_err(sqlite(path, "create the tables"))?;
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(sqlite(path, "set user_version"))?;
            tx.commit().map_err(sqlite(path, "commit the schema"))?;
        }
        Ok(UsageDb {
            conn,
            path: path.to_path_buf(),
            empty: false,
        })
    }

    /// Open an existing file for reports only: it never writes, so it runs
    /// beside the daemon (and as an account that may only read the file).
    ///
    /// # Errors
    ///
    /// The file cannot be opened (a missing file is an error: check first),
    /// or a newer vacancyd wrote it.
    pub fn open_read_only(path: &Path) -> Result<UsageDb, UsageError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn =
            Connection::open_with_flags(path, flags).map_err(sqlite(path, "open read-only"))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(sqlite(path, "set busy_timeout"))?;
        let found = schema_version(&conn, path)?;
        Ok(UsageDb {
            conn,
            path: path.to_path_buf(),
            empty: found == 0,
        })
    }

    /// Store one finished reservation; `false` when its entry was stored
    /// already (a record written again after a crash counts once).
    ///
    /// # Errors
    ///
    /// SQLite cannot write it (a read-only open, a full disk).
    pub fn record(&self, r: &UsageRecord) -> Result<bool, UsageError> {
        let resources: Vec<StoredCharge> = r
            .resources
            .iter()
            .map(|c| StoredCharge {
                resource: c.resource.clone(),
                required_mib: c.required_mib,
            })
            .collect();
        // Serializing strings and integers cannot fail; an empty array if it did.
        let resources = serde_json::to_string(&resources).unwrap_or_else(|_| "[]".to_owned());
        let n = self
            .conn
            .execute(
                "INSERT OR IGNORE INTO reservations (entry, borrower, upstream, model, priority,
                    admitted_unix_ms, released_unix_ms, waited_s, held, gpu_s, memory_s, cpu_s, resources)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                params![
                    r.entry.to_string(),
                    &*r.borrower,
                    r.upstream,
                    r.model,
                    r.priority.as_str(),
                    r.admitted_unix_ms,
                    r.released_unix_ms,
                    r.waited.as_secs_f64(),
                    r.held,
                    r.reserved.gpu.as_secs_f64(),
                    r.reserved.memory.as_secs_f64(),
                    r.reserved.cpu.as_secs_f64(),
                    resources,
                ],
            )
            .map_err(sqlite(&self.path, "record a reservation"))?;
        Ok(n == 1)
    }

    /// Which of `ids` have a row already: on restart the daemon writes the
    /// others before its journal forgets them.
    ///
    /// # Errors
    ///
    /// SQLite cannot read.
    pub fn recorded(&self, ids: &[EntryId]) -> Result<HashSet<EntryId>, UsageError> {
        let mut found = HashSet::new();
        if self.empty {
            return Ok(found);
        }
        let mut stmt = self
            .conn
            .prepare_cached("SELECT 1 FROM reservations WHERE entry = ?1")
            .map_err(sqlite(&self.path, "look up entries"))?;
        for id in ids {
            let hit = stmt
                .query_row([id.to_string()], |_| Ok(()))
                .optional()
                .map_err(sqlite(&self.path, "look up entries"))?;
            if hit.is_some() {
                found.insert(*id);
            }
        }
        Ok(found)
    }

    /// Add refusal counts `(borrower, UTC day's midnight in Unix seconds,
    /// code, n)`, all in one transaction.
    ///
    /// # Errors
    ///
    /// SQLite cannot write them; none is added then.
    pub fn add_refusals(&mut self, counts: &[(&str, i64, &str, u64)]) -> Result<(), UsageError> {
        let tx = self
            .conn
            .transaction()
            .map_err(sqlite(&self.path, "begin"))?;
        {
            let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO refusals (borrower, day_unix_s, code, count) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (borrower, day_unix_s, code) DO UPDATE SET count = count + excluded.count",
                )
                .map_err(sqlite(&self.path, "add refusals"))?;
            for &(borrower, day, code, n) in counts {
                let n = i64::try_from(n).unwrap_or(i64::MAX);
                stmt.execute(params![borrower, day, code, n])
                    .map_err(sqlite(&self.path, "add refusals"))?;
            }
        }
        tx.commit().map_err(sqlite(&self.path, "commit refusals"))
    }

    /// The reservations released at or after `since_unix_ms`.
    ///
    /// # Errors
    ///
    /// SQLite cannot read, or a row is not what this build writes.
    pub fn reservations_since(
        &self,
        since_unix_ms: i64,
    ) -> Result<Vec<ReservationRow>, UsageError> {
        if self.empty {
            return Ok(Vec::new());
        }
        let mut stmt = self
            .conn
            .prepare(
                "SELECT entry, borrower, upstream, model, priority, admitted_unix_ms, released_unix_ms,
                    waited_s, held, gpu_s, memory_s, cpu_s, resources
                 FROM reservations WHERE released_unix_ms >= ?1 ORDER BY released_unix_ms",
            )
            .map_err(sqlite(&self.path, "read reservations"))?;
        let rows = stmt
            .query_map([since_unix_ms], |r| {
                Ok((
                    ReservationRow {
                        entry: r.get(0)?,
                        borrower: r.get(1)?,
                        upstream: r.get(2)?,
                        model: r.get(3)?,
                        priority: r.get(4)?,
                        admitted_unix_ms: r.get(5)?,
                        released_unix_ms: r.get(6)?,
                        waited_s: r.get(7)?,
                        held: r.get(8)?,
                        gpu_s: r.get(9)?,
                        memory_s: r.get(10)?,
                        cpu_s: r.get(11)?,
                        resources: Vec::new(),
                    },
                    r.get::<_, String>(12)?,
                ))
            })
            .map_err(sqlite(&self.path, "read reservations"))?;
        let mut out = Vec::new();
        for row in rows {
            let (mut row, resources) = row.map_err(sqlite(&self.path, "read reservations"))?;
            row.resources =
                serde_json::from_str(&resources).map_err(|source| UsageError::Resources {
                    path: self.path.clone(),
                    entry: row.entry.clone(),
                    source,
                })?;
            out.push(row);
        }
        Ok(out)
    }

    /// The refusal counts of the UTC days from the one holding `since_unix_ms` on.
    ///
    /// # Errors
    ///
    /// SQLite cannot read.
    pub fn refusals_since(&self, since_unix_ms: i64) -> Result<Vec<RefusalRow>, UsageError> {
        if self.empty {
            return Ok(Vec::new());
        }
        let first_day = since_unix_ms.div_euclid(1000).div_euclid(86_400) * 86_400;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT borrower, day_unix_s, code, count FROM refusals
                 WHERE day_unix_s >= ?1 ORDER BY day_unix_s, borrower, code",
            )
            .map_err(sqlite(&self.path, "read refusals"))?;
        let rows = stmt
            .query_map([first_day], |r| {
                Ok(RefusalRow {
                    borrower: r.get(0)?,
                    day_unix_s: r.get(1)?,
                    code: r.get(2)?,
                    count: u64::try_from(r.get::<_, i64>(3)?).unwrap_or(0),
                })
            })
            .map_err(sqlite(&self.path, "read refusals"))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(sqlite(&self.path, "read refusals"))
    }
}

/// `PRAGMA user_version`, refusing a newer schema than this build knows.
fn schema_version(conn: &Connection, path: &Path) -> Result<i32, UsageError> {
    let found: i32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(sqlite(path, "read user_version"))?;
    if found > SCHEMA_VERSION {
        return Err(UsageError::NewerSchema {
            path: path.to_path_buf(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(found)
}

/// The error for SQLite failing at `action` on `path`.
fn sqlite(path: &Path, action: &'static str) -> impl FnOnce(rusqlite::Error) -> UsageError {
    let path = path.to_path_buf();
    move |source| UsageError::Sqlite {
        path,
        action,
        source,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use vacancy::engine::{Charge, KindTimes, Priority};

    use super::*;

    fn record(n: u128, borrower: &str) -> UsageRecord {
        UsageRecord {
            entry: EntryId::from_u128(n),
            borrower: Arc::from(borrower),
            upstream: "llama".to_owned(),
            model: Some("qwen".to_owned()),
            priority: Priority::Batch,
            admitted_unix_ms: 1_796_083_200_000,
            released_unix_ms: 1_796_083_260_000,
            waited: Duration::from_millis(1500),
            held: true,
            reserved: KindTimes {
                gpu: Duration::from_secs(60),
                memory: Duration::from_secs(30),
                cpu: Duration::ZERO,
            },
            resources: vec![Charge {
                resource: "gpu0".to_owned(),
                required_mib: 2048,
                free_mib: 8000,
            }],
        }
    }

    // issue 34 item 4
    #[test]
    fn a_record_written_twice_is_stored_once() {
        let dir = tempfile::tempdir().unwrap();
        let db = UsageDb::open(&dir.path().join("usage.sqlite")).unwrap();
        assert!(db.record(&record(1, "alice")).unwrap());
        assert!(!db.record(&record(1, "alice")).unwrap());
        let rows = db.reservations_since(0).unwrap();
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(r.entry, EntryId::from_u128(1).to_string());
        assert_eq!(
            (r.borrower.as_str(), r.upstream.as_str()),
            ("alice", "llama")
        );
        assert_eq!(
            (r.model.as_deref(), r.priority.as_str()),
            (Some("qwen"), "batch")
        );
        assert_eq!((r.waited_s, r.held), (1.5, true));
        assert_eq!((r.gpu_s, r.memory_s, r.cpu_s), (60.0, 30.0, 0.0));
        assert_eq!(
            r.resources,
            [StoredCharge {
                resource: "gpu0".to_owned(),
                required_mib: 2048
            }]
        );
    }

    // issue 34 item 4
    #[test]
    fn recorded_names_the_entries_that_have_a_row() {
        let dir = tempfile::tempdir().unwrap();
        let db = UsageDb::open(&dir.path().join("usage.sqlite")).unwrap();
        db.record(&record(1, "alice")).unwrap();
        db.record(&record(3, "bob")).unwrap();
        let ids = [1, 2, 3].map(EntryId::from_u128);
        let found = db.recorded(&ids).unwrap();
        assert_eq!(found, HashSet::from([ids[0], ids[2]]));
    }

    // issue 34 item 4
    #[test]
    fn a_record_survives_reopening_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.sqlite");
        UsageDb::open(&path)
            .unwrap()
            .record(&record(1, "alice"))
            .unwrap();
        let db = UsageDb::open(&path).unwrap();
        assert!(!db.record(&record(1, "alice")).unwrap());
        assert_eq!(db.reservations_since(0).unwrap().len(), 1);
    }

    // issue 34 item 4
    #[test]
    fn refusals_add_up_per_borrower_day_and_code() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = UsageDb::open(&dir.path().join("usage.sqlite")).unwrap();
        let day = 1_796_083_200;
        db.add_refusals(&[
            ("alice", day, "busy", 2),
            ("alice", day, "owner_present", 1),
        ])
        .unwrap();
        db.add_refusals(&[("alice", day, "busy", 3), ("bob", day - 86_400, "busy", 7)])
            .unwrap();
        let rows = db.refusals_since(day * 1000 + 5000).unwrap();
        let got: Vec<(&str, &str, u64)> = rows
            .iter()
            .map(|r| (r.borrower.as_str(), r.code.as_str(), r.count))
            .collect();
        // The day holding `since` counts whole; the day before does not.
        assert_eq!(got, [("alice", "busy", 5), ("alice", "owner_present", 1)]);
        assert_eq!(db.refusals_since(0).unwrap().len(), 3);
    }

    // issue 34 item 4
    #[test]
    fn reservations_since_leaves_out_those_released_earlier() {
        let dir = tempfile::tempdir().unwrap();
        let db = UsageDb::open(&dir.path().join("usage.sqlite")).unwrap();
        let mut early = record(1, "alice");
        early.released_unix_ms = 1000;
        db.record(&early).unwrap();
        db.record(&record(2, "bob")).unwrap();
        let rows = db.reservations_since(2000).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].borrower, "bob");
    }

    // issue 34 item 4
    #[test]
    fn a_read_only_open_reads_while_a_writer_holds_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.sqlite");
        let writer = UsageDb::open(&path).unwrap();
        writer.record(&record(1, "alice")).unwrap();
        let reader = UsageDb::open_read_only(&path).unwrap();
        assert_eq!(reader.reservations_since(0).unwrap().len(), 1);
        // The writer goes on writing while the reader is open, and the reader sees it.
        writer.record(&record(2, "bob")).unwrap();
        assert_eq!(reader.reservations_since(0).unwrap().len(), 2);
        // And the reader cannot write.
        assert!(matches!(
            reader.record(&record(3, "carol")),
            Err(UsageError::Sqlite { .. })
        ));
    }

    // issue 34 item 4
    #[test]
    fn a_database_of_a_newer_schema_is_refused_naming_its_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.sqlite");
        drop(UsageDb::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        drop(conn);
        for opened in [UsageDb::open(&path), UsageDb::open_read_only(&path)] {
            let e = opened.unwrap_err();
            assert!(
                matches!(
                    e,
                    UsageError::NewerSchema {
                        found: 2,
                        supported: 1,
                        ..
                    }
                ),
                "{e}"
            );
            let text = e.to_string();
            assert!(text.contains(&path.display().to_string()), "{text}");
            assert!(text.contains("schema version 2"), "{text}");
        }
    }

    // issue 34 item 4
    #[test]
    fn a_read_only_open_of_a_file_never_set_up_reads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.sqlite");
        drop(Connection::open(&path).unwrap());
        let db = UsageDb::open_read_only(&path).unwrap();
        assert!(db.reservations_since(0).unwrap().is_empty());
        assert!(db.refusals_since(0).unwrap().is_empty());
        assert!(db.recorded(&[EntryId::from_u128(1)]).unwrap().is_empty());
    }

    // issue 34 item 4
    #[test]
    fn usage_json_reports_what_the_file_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.sqlite");
        let mut db = UsageDb::open(&path).unwrap();
        db.record(&record(1, "alice")).unwrap();
        db.add_refusals(&[("bob", 1_796_083_200, "busy", 2)])
            .unwrap();
        let v = crate::usage::usage_json(&db, 0, crate::usage::By::Borrower).unwrap();
        assert_eq!(v["rows"][0]["borrower"], "alice");
        assert_eq!(v["rows"][0]["reserved_s"]["gpu"], 60.0);
        assert_eq!(v["rows"][1]["borrower"], "bob");
        assert_eq!(v["rows"][1]["refusals"]["busy"], 2);
    }
}
