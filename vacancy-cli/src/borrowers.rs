//! Named borrowers in the daemon (issue 34): where the keys file and the
//! usage record are, and the loop that reloads the keys file when it
//! changes, so `vacancyd borrower add` takes effect without a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tracing::{info, warn};
use vacancy::config::{BorrowerKeys, BorrowersConfig};
use vacancy::shell::Lender;

/// How often the keys file is looked at, and the engine's wall clock
/// anchored again (a clock step moves the budgets' days with it).
pub const KEYS_EVERY: Duration = Duration::from_secs(2);

/// The keys file's default name, beside the configuration.
pub const KEYS_FILE: &str = "borrowers.toml";

/// The usage record's default name, beside the recovery directory.
pub const USAGE_DB: &str = "usage.sqlite";

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
        state_dir
            .parent()
            .map_or_else(|| PathBuf::from(USAGE_DB), |p| p.join(USAGE_DB))
    } else {
        beside_config(config_path, &config.usage_db, USAGE_DB)
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
    mut shutdown: watch::Receiver<bool>,
) {
    let mut seen = stamp(&path);
    loop {
        tokio::select! {
            () = tokio::time::sleep(KEYS_EVERY) => {}
            _ = shutdown.changed() => return,
        }
        lender.anchor_wall_clock();
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
