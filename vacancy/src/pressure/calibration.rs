//! The calibration file: each GPU's attended and unattended baseline.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::pressure::tracker::{Attendance, Baseline, OwnerLoad};

/// The file's name in the admission state directory.
pub const CALIBRATION_FILE: &str = "pressure-calibration.json";

/// The file format version this build reads and writes.
const VERSION: u32 = 1;

/// Why the calibration file could not be read or written.
#[derive(Debug, Error)]
pub enum CalibrationError {
    /// Reading or writing failed.
    #[error("GPU pressure calibration {path}: cannot {action}: {source}")]
    Io {
        /// What was being done: `read`, `write`, ...
        action: &'static str,
        /// The file (or its temporary file).
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is a link, or not private to the recovery directory's owner
    /// (REC-18, REC-22): the error names it and the fix.
    #[error("GPU pressure calibration: {0}")]
    Unsafe(#[source] crate::ledger::LedgerError),
    /// The file is not a calibration file this build understands.
    #[error(
        "GPU pressure calibration {path} is not valid: {reason}; fix or delete it and calibrate again with `vacancyd calibrate-pressure`"
    )]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The file's contents: `{"version":1,"gpus":{"<resource>":{"attended":..,"unattended":..}}}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OnDisk {
    version: u32,
    gpus: BTreeMap<String, Baseline>,
}

/// Each GPU resource's baseline, as stored in [`CALIBRATION_FILE`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CalibrationFile {
    /// Baselines by GPU resource name.
    pub gpus: BTreeMap<String, Baseline>,
}

impl CalibrationFile {
    /// The file's path in the admission state directory `dir`.
    pub fn path_in(dir: &Path) -> PathBuf {
        dir.join(CALIBRATION_FILE)
    }

    /// Read `path`. A missing file is an empty calibration (every GPU uncalibrated).
    ///
    /// # Errors
    ///
    /// [`CalibrationError::Io`] when it exists but cannot be read,
    /// [`CalibrationError::Unsafe`] when it is a symbolic link or not private
    /// to the directory's owner (mode 0600, as [`CalibrationFile::save`]
    /// writes it), [`CalibrationError::Invalid`] when it is not a version 1
    /// calibration file.
    pub fn load(path: &Path) -> Result<Self, CalibrationError> {
        // As the ledger's own files: never through a link, only when private.
        let bytes = match crate::ledger::read_private(path) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Ok(CalibrationFile::default()),
            Err(crate::ledger::LedgerError::Io { source, .. }) => {
                return Err(CalibrationError::Io {
                    action: "read",
                    path: path.to_owned(),
                    source,
                });
            }
            Err(e) => return Err(CalibrationError::Unsafe(e)),
        };
        let invalid = |reason: String| CalibrationError::Invalid {
            path: path.to_owned(),
            reason,
        };
        let disk: OnDisk = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
        if disk.version != VERSION {
            return Err(invalid(format!(
                "version {} (this vacancyd reads version {VERSION})",
                disk.version
            )));
        }
        for (gpu, b) in &disk.gpus {
            for (attendance, load) in [("attended", b.attended), ("unattended", b.unattended)] {
                if load.is_some_and(|l| l.util_pct > 100) {
                    return Err(invalid(format!("{gpu}: {attendance} util_pct above 100")));
                }
            }
        }
        Ok(CalibrationFile { gpus: disk.gpus })
    }

    /// Write to `path` atomically: a temporary file in the same directory,
    /// flushed to disk, then renamed over `path`, and the directory synced.
    ///
    /// # Errors
    ///
    /// [`CalibrationError::Io`] naming the step that failed; `path` is then unchanged.
    pub fn save(&self, path: &Path) -> Result<(), CalibrationError> {
        let io = |action: &'static str, path: &Path| {
            let path = path.to_owned();
            move |source| CalibrationError::Io {
                action,
                path,
                source,
            }
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        let disk = OnDisk {
            version: VERSION,
            gpus: self.gpus.clone(),
        };
        let mut text =
            serde_json::to_string_pretty(&disk).map_err(|e| CalibrationError::Invalid {
                path: path.to_owned(),
                reason: e.to_string(),
            })?;
        text.push('\n');
        let tmp = dir.join(format!(".{CALIBRATION_FILE}.{}.tmp", std::process::id()));
        let written = (|| {
            // Private from creation, and never through a link left at the name.
            match fs::remove_file(&tmp) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io("remove the stale", &tmp)(e));
                }
                _ => {}
            }
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(crate::ledger::PRIVATE_FILE_MODE)
                .open(&tmp)
                .map_err(io("create", &tmp))?;
            file.write_all(text.as_bytes()).map_err(io("write", &tmp))?;
            file.sync_all().map_err(io("sync", &tmp))?;
            fs::rename(&tmp, path).map_err(io("replace", path))
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written?;
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io("sync the directory of", path))?;
        tracing::info!(path = %path.display(), gpus = self.gpus.len(), "GPU pressure calibration saved");
        Ok(())
    }

    /// The baseline of `gpu` (empty: uncalibrated).
    pub fn baseline(&self, gpu: &str) -> Baseline {
        self.gpus.get(gpu).copied().unwrap_or_default()
    }

    /// Set `gpu`'s baseline for `attendance`, keeping the other.
    pub fn set(&mut self, gpu: &str, attendance: Attendance, load: OwnerLoad) {
        self.gpus
            .entry(gpu.to_owned())
            .or_default()
            .set(attendance, load);
    }
}

/// The baseline from a calibration run's samples: the 95th percentile of
/// utilization and the maximum of memory (all zero with no samples).
///
/// A baseline is the owner's *normal* load, and pressure is load well above
/// it, so it must sit near the top of what calibration saw: the mean would
/// let ordinary spikes (a browser tab animating, a compositor frame) read as
/// pressure. Utilization is spiky, so its top 5% is ignored; memory changes
/// slowly and a real allocation is not noise, so its maximum is used.
pub fn calibrate(samples: &[OwnerLoad]) -> OwnerLoad {
    let mut util: Vec<u8> = samples.iter().map(|s| s.util_pct).collect();
    util.sort_unstable();
    // Nearest-rank p95: the smallest value with at least 95% of samples at or below it.
    let rank = (util.len() * 95).div_ceil(100);
    OwnerLoad {
        util_pct: util.get(rank.saturating_sub(1)).copied().unwrap_or(0),
        memory_mib: samples.iter().map(|s| s.memory_mib).max().unwrap_or(0),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn load(util_pct: u8, memory_mib: u64) -> OwnerLoad {
        OwnerLoad {
            util_pct,
            memory_mib,
        }
    }

    #[test]
    fn calibrate_takes_p95_util_and_max_memory() {
        assert_eq!(calibrate(&[]), load(0, 0));
        assert_eq!(calibrate(&[load(40, 7)]), load(40, 7));
        // 20 samples: 1..=20 % ; p95 is the 19th value, the one spike (20) ignored.
        let samples: Vec<OwnerLoad> = (1..=20).map(|u| load(u, 100 + u64::from(u))).collect();
        assert_eq!(calibrate(&samples), load(19, 120));
        // 100 samples, five spikes at 90%: p95 is still the normal load.
        let mut samples = vec![load(10, 500); 95];
        samples.extend(vec![load(90, 600); 5]);
        assert_eq!(calibrate(&samples), load(10, 600));
    }

    #[test]
    fn file_round_trips_and_a_missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = CalibrationFile::path_in(dir.path());
        assert_eq!(path.file_name().unwrap(), CALIBRATION_FILE);
        let empty = CalibrationFile::load(&path).unwrap();
        assert_eq!(empty, CalibrationFile::default());
        assert_eq!(empty.baseline("gpu0"), Baseline::default());

        let mut file = CalibrationFile::default();
        file.set("gpu0", Attendance::Attended, load(20, 1500));
        file.save(&path).unwrap();
        file.set("gpu0", Attendance::Unattended, load(5, 300));
        file.set("gpu1", Attendance::Unattended, load(0, 0));
        file.save(&path).unwrap();
        let back = CalibrationFile::load(&path).unwrap();
        assert_eq!(back, file);
        assert_eq!(
            back.baseline("gpu0"),
            Baseline {
                attended: Some(load(20, 1500)),
                unattended: Some(load(5, 300)),
            }
        );
        // The documented format, and no temporary file left behind.
        let json: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(json["version"], 1);
        assert_eq!(json["gpus"]["gpu1"]["attended"], serde_json::Value::Null);
        assert_eq!(json["gpus"]["gpu0"]["attended"]["util_pct"], 20);
        assert_eq!(json["gpus"]["gpu0"]["attended"]["memory_mib"], 1500);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn garbage_names_the_file_and_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = CalibrationFile::path_in(dir.path());
        for (text, why) in [
            ("not json", "expected"),
            (r#"{"version":2,"gpus":{}}"#, "version 2"),
            (r#"{"version":1}"#, "gpus"),
            (
                r#"{"version":1,"gpus":{"g":{"attended":{"util_pct":101,"memory_mib":0},"unattended":null}}}"#,
                "above 100",
            ),
        ] {
            fs::write(&path, text).unwrap();
            fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap();
            let err = CalibrationFile::load(&path).unwrap_err();
            let message = err.to_string();
            assert!(matches!(err, CalibrationError::Invalid { .. }), "{err:?}");
            assert!(message.contains(CALIBRATION_FILE), "{message}");
            assert!(message.contains(why), "{text}: {message}");
        }
        // A directory where the file should be: not a file, named.
        let err = CalibrationFile::load(dir.path()).unwrap_err();
        assert!(
            matches!(
                err,
                CalibrationError::Unsafe(crate::ledger::LedgerError::NotAFile { .. })
            ),
            "{err:?}"
        );
    }

    #[test]
    fn a_failed_save_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-dir").join(CALIBRATION_FILE);
        let err = CalibrationFile::default().save(&missing).unwrap_err();
        assert!(err.to_string().contains("cannot create"), "{err}");
    }
}
