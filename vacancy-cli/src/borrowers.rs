//! Named borrowers in the daemon (issue 34): where the keys file and the
//! usage record are, and the loop that reloads the keys file when it
//! changes, so `vacancyd borrower add` takes effect without a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tracing::{info, warn};
use vacancy::auth::BorrowerKeys;
use vacancy::config::BorrowersConfig;
use vacancy::shell::Lender;

/// How often the keys file is looked at, and the engine's wall clock
/// anchored again (a clock step moves the budgets' days with it).
pub const KEYS_EVERY: Duration = Duration::from_secs(2);

/// The keys file's default name, beside the configuration.
pub const KEYS_FILE: &str = "borrowers.toml";

/// `value` as a path: relative ones resolve against the configuration's
/// directory (the working directory without a configuration file); empty
/// is `default` there.
pub fn beside_config(config_path: Option<&Path>, value: &str, default: &str) -> PathBuf {
    let base = config_path
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let v = if value.is_empty() { default } else { value };
    let p = Path::new(v);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// The keys file of `config`.
pub fn keys_path(config: &BorrowersConfig, config_path: Option<&Path>) -> PathBuf {
    beside_config(config_path, &config.keys_file, KEYS_FILE)
}

/// The usage record of `config`: `usage_db`, or `usage.sqlite` beside the
/// recovery directory `state_dir`.
pub fn usage_path(
    config: &BorrowersConfig,
    config_path: Option<&Path>,
    state_dir: &Path,
) -> PathBuf {
    if config.usage_db.is_empty() {
        crate::usage::path_beside(state_dir)
    } else {
        beside_config(config_path, &config.usage_db, crate::usage::DB_FILE)
    }
}

/// What identifies a version of the keys file: its modification time and
/// length (`None`: it does not exist).
fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Reload the keys file at `path` whenever it changes, and anchor the
/// engine's wall clock, every [`KEYS_EVERY`]. A file that does not pass
/// is logged with every problem and changes nothing.
pub async fn keys_loop(
    lender: Arc<Lender>,
    path: PathBuf,
    config: BorrowersConfig,
    mut usage: Option<crate::usage::UsageDb>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut seen = stamp(&path);
    let mut refusals = RefusalTally::default();
    loop {
        tokio::select! {
            () = tokio::time::sleep(KEYS_EVERY) => {}
            _ = shutdown.changed() => {
                if let Some(db) = &mut usage {
                    refusals.flush(&lender, db);
                }
                return;
            }
        }
        lender.anchor_wall_clock();
        if let Some(db) = &mut usage {
            refusals.flush(&lender, db);
        }
        let now = stamp(&path);
        if now == seen {
            continue;
        }
        seen = now;
        match BorrowerKeys::load(&path) {
            Ok(keys) => {
                let n = keys.len();
                match lender.reload_borrowers(keys, &config) {
                    Ok(()) => {
                        info!(path = %path.display(), borrowers = n, "borrowers' keys reloaded")
                    }
                    Err(e) => {
                        warn!(path = %path.display(), error = %e, "the borrowers' keys were not reloaded; the previous ones stay in force")
                    }
                }
            }
            Err(e) => {
                warn!(path = %path.display(), errors = %e, "the borrowers' keys file has problems; the previous keys stay in force")
            }
        }
    }
}

/// The usage record as the ledger's writer sees it: one row per finished
/// reservation, written before the journal forgets the entry.
pub struct UsageRows(pub crate::usage::UsageDb);

impl vacancy::ledger::UsageSink for UsageRows {
    fn record(&mut self, r: &vacancy::engine::UsageRecord) -> Result<(), String> {
        self.0.record(r).map(|_| ()).map_err(|e| e.to_string())
    }
}

/// Each borrower's refusals by code as last written, so each pass writes
/// only what was added since.
#[derive(Default)]
pub struct RefusalTally {
    seen: std::collections::HashMap<(String, &'static str), u64>,
}

impl RefusalTally {
    /// Add the refusals counted since the last pass to `db`, in today's UTC day.
    pub fn flush(&mut self, lender: &Lender, db: &mut crate::usage::UsageDb) {
        let status = lender.status();
        let day = vacancy::engine::BudgetPeriod::Day.start_of(vacancy::time::unix_ms_now() / 1000);
        let mut rows: Vec<(String, &'static str, u64)> = Vec::new();
        for b in &status.borrowers {
            for (code, &n) in &b.totals.refusals {
                let last = self.seen.entry((b.name.clone(), code)).or_insert(0);
                if n > *last {
                    rows.push((b.name.clone(), code, n - *last));
                    *last = n;
                }
            }
        }
        if rows.is_empty() {
            return;
        }
        let counts: Vec<(&str, i64, &str, u64)> = rows
            .iter()
            .map(|(name, code, n)| (name.as_str(), day, *code, *n))
            .collect();
        if let Err(e) = db.add_refusals(&counts) {
            warn!(error = %e, "the borrowers' refusal counts could not be written to the usage record");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn the_keys_file_and_usage_record_default_beside_their_anchors() {
        let cfg = BorrowersConfig::default();
        let conf = Path::new("/etc/vacancyd/vacancyd.toml");
        assert_eq!(
            keys_path(&cfg, Some(conf)),
            Path::new("/etc/vacancyd/borrowers.toml")
        );
        assert_eq!(
            usage_path(
                &cfg,
                Some(conf),
                Path::new("/var/lib/vacancyd/vacancyd.admission")
            ),
            Path::new("/var/lib/vacancyd/usage.sqlite")
        );
        let set = BorrowersConfig {
            keys_file: "keys/b.toml".to_owned(),
            usage_db: "/srv/u.sqlite".to_owned(),
            ..BorrowersConfig::default()
        };
        assert_eq!(
            keys_path(&set, Some(conf)),
            Path::new("/etc/vacancyd/keys/b.toml")
        );
        assert_eq!(
            usage_path(&set, Some(conf), Path::new("/x/y")),
            Path::new("/srv/u.sqlite")
        );
    }
}
