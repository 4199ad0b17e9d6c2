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

pub use command::{Args, run};
pub use db::{DB_FILE, UsageDb, UsageError, path_beside};
pub use report::{By, usage};
pub use since::Since;

/// The report `vacancyd usage --json` prints, for the control API to serve
/// the console's chart: `{"since", "since_unix_ms", "by", "rows"}`.
///
/// # Errors
///
/// The database cannot be read.
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
