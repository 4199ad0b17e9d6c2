//! The recovery directory's lock: only one daemon may open it (REC-25).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::SystemTime;

use crate::ledger::error::LedgerError;
use crate::ledger::files::open_private;
use crate::ledger::record::unix_ms;

/// The lock file's name inside the recovery directory.
pub(crate) const LOCK_FILE: &str = "lock";

/// Take the exclusive lock on `<dir>/lock` and record this process in it.
/// The returned file holds the lock until it is dropped.
pub(crate) fn acquire(dir: &Path) -> Result<File, LedgerError> {
    let path = dir.join(LOCK_FILE);
    let mut file = open_private(
        &path,
        crate::platform::private_file(
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false),
        ),
    )?;
    // A lock this very process recorded can outlive its release for a moment:
    // a child forked by another thread shares the locked file until it execs.
    // Such a holder is waited for briefly; any other holder is reported at once.
    let mut waits = 0;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                // Best effort: the holder may be rewriting it right now.
                let _ = file.seek(SeekFrom::Start(0));
                let _ = file.read_to_string(&mut text);
                if waits < 50 && holder_pid(&text) == Some(u64::from(std::process::id())) {
                    waits += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
                return Err(LedgerError::InUse {
                    path: dir.to_path_buf(),
                    holder: describe_holder(&text),
                });
            }
            Err(TryLockError::Error(e)) => {
                return Err(LedgerError::io("lock", &path, e));
            }
        }
    }
    let now = SystemTime::now();
    let record = serde_json::json!({
        "pid": std::process::id(),
        "since": rfc3339(unix_ms(now)),
        "since_unix_ms": unix_ms(now),
    });
    let write = |f: &mut File| -> std::io::Result<()> {
        f.set_len(0)?;
        f.seek(SeekFrom::Start(0))?;
        f.write_all(format!("{record}\n").as_bytes())
    };
    write(&mut file).map_err(|e| LedgerError::io("write the lock file", &path, e))?;
    Ok(file)
}

/// The pid a lock file records.
fn holder_pid(text: &str) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(text.trim())
        .ok()?
        .get("pid")?
        .as_u64()
}

/// "vacancyd pid N since T" from the lock file's contents, or what can be said.
fn describe_holder(text: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(text.trim()).ok();
    let pid = parsed.as_ref().and_then(|v| v.get("pid")?.as_u64());
    let since = parsed
        .as_ref()
        .and_then(|v| v.get("since")?.as_str().map(str::to_owned));
    match (pid, since) {
        (Some(pid), Some(since)) => format!("vacancyd pid {pid} since {since}"),
        (Some(pid), None) => format!("vacancyd pid {pid}"),
        _ => "another process (it has not recorded its pid yet)".to_owned(),
    }
}

/// A UTC timestamp, `YYYY-MM-DDTHH:MM:SSZ`, from milliseconds since the epoch.
pub(crate) fn rfc3339(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm, for days since 1970-01-01.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_calendar_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_767_225_599_000), "2025-12-31T23:59:59Z");
    }

    #[test]
    fn holder_description_degrades_gracefully() {
        assert_eq!(
            describe_holder(r#"{"pid":7,"since":"2026-01-01T00:00:00Z"}"#),
            "vacancyd pid 7 since 2026-01-01T00:00:00Z"
        );
        assert!(describe_holder("").contains("another process"));
    }
}
