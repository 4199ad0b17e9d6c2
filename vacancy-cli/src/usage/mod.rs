//! The owner's record of who used the machine (issue 34 item 4): every
//! finished reservation of a borrower and the refusals each borrower met,
//! kept in an embedded SQLite file, and the `vacancyd usage` reports on it.
//!
//! The file is `usage.sqlite` in the directory that holds the recovery
//! directory ([`path_beside`]): `$STATE_DIRECTORY/usage.sqlite` under
//! systemd, beside `vacancyd.toml` otherwise, `%ProgramData%\vacancyd` on
//! Windows. The daemon writes it; reports open it read-only.

mod command;
mod db;
mod format;
mod report;
mod since;

use std::path::{Path, PathBuf};

pub use command::{Args, run};
#[allow(
    unused_imports,
    reason = "the daemon's ledger hook uses these (issue 34 item 4)"
)]
pub use db::{RefusalRow, ReservationRow, SCHEMA_VERSION, StoredCharge, UsageDb, UsageError};
pub use report::{By, usage, utc_day};

/// The database's file name.
pub const DB_FILE: &str = "usage.sqlite";

/// The database of the daemon whose recovery directory is `recovery_dir`:
/// beside it, so the journal's directory keeps only the journal's files.
pub fn path_beside(recovery_dir: &Path) -> PathBuf {
    recovery_dir.parent().unwrap_or(recovery_dir).join(DB_FILE)
}

/// The report `vacancyd usage --json` prints, for the control API to serve
/// the console's chart: `{"since", "since_unix_ms", "by", "rows"}`.
///
/// # Errors
///
/// The database cannot be read.
#[allow(
    dead_code,
    reason = "the control API serves it (issue 34 item 4); wired separately"
)]
pub fn usage_json(
    db: &UsageDb,
    since_unix_ms: i64,
    by: By,
) -> Result<serde_json::Value, UsageError> {
    let rows = usage(
        &db.reservations_since(since_unix_ms)?,
        &db.refusals_since(since_unix_ms)?,
        by,
    );
    Ok(format::json(&rows, since_unix_ms, by))
}
