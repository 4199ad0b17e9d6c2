//! The calibration file: each GPU's attended and unattended baseline.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::engine::pressure::{Attendance, Baseline, OwnerLoad};
use crate::ledger::disk::{Disk, RealDisk, write_atomically};

/// The file's name in the admission state directory.
pub const CALIBRATION_FILE: &str = "pressure-calibration.json";

/// The file format version this build reads and writes.
const VERSION: u32 = 1;

/// Why the calibration file could not be read or written.
#[derive(Debug, Error)]
#[non_exhaustive]
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
        self.save_on(&RealDisk, path)
    }

    /// [`CalibrationFile::save`] on `disk` (the ledger's disk seam, so a
    /// test can fail each of its writes).
    ///
    /// # Errors
    ///
    /// As [`CalibrationFile::save`]; after a failed directory sync the new
    /// file is in place but may not survive a crash.
    pub fn save_on(&self, disk: &dyn Disk, path: &Path) -> Result<(), CalibrationError> {
        let on_disk = OnDisk {
            version: VERSION,
            gpus: self.gpus.clone(),
        };
        let mut text =
            serde_json::to_string_pretty(&on_disk).map_err(|e| CalibrationError::Invalid {
                path: path.to_owned(),
                reason: e.to_string(),
            })?;
        text.push('\n');
        write_atomically(disk, path, text.as_bytes()).map_err(|e| CalibrationError::Io {
            action: e.action,
            path: e.path,
            source: e.source,
        })?;
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
    use std::fs;
    use std::sync::Arc;

    use super::*;
    use crate::ledger::disk::{Fault, FaultDisk};

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

    #[test]
    fn every_write_of_a_save_failed_with_enospc_and_eio_leaves_the_old_file_or_the_new() {
        // Issue 18 item 3: each write of a save fails in turn (ENOSPC 28, EIO
        // 5; appends torn and whole). The save says which step failed; the
        // file reads as the old calibration or the new one, never a mix or
        // nothing; no temporary file is left; the next save succeeds.
        let mut old = CalibrationFile::default();
        old.set("gpu0", Attendance::Attended, load(20, 1500));
        let mut new = old.clone();
        new.set("gpu0", Attendance::Unattended, load(5, 300));
        let count = {
            let dir = tempfile::tempdir().unwrap();
            let path = CalibrationFile::path_in(dir.path());
            let disk = FaultDisk::new(Arc::new(RealDisk));
            new.save_on(&disk, &path).unwrap();
            disk.writes()
        };
        assert!(
            count >= 5,
            "a save is remove, create, write, sync, rename, sync dir"
        );
        let mut failed = 0;
        for at in 0..count {
            for (errno, torn) in [(28, false), (28, true), (5, false), (5, true)] {
                let dir = tempfile::tempdir().unwrap();
                let path = CalibrationFile::path_in(dir.path());
                old.save(&path).unwrap();
                let disk = FaultDisk::new(Arc::new(RealDisk));
                disk.set_fault(Some(Fault::Once { at, errno, torn }));
                let saved = new.save_on(&disk, &path);
                let op = &disk.log()[usize::try_from(at).unwrap()];
                let on_disk = CalibrationFile::load(&path).unwrap();
                match saved {
                    Ok(()) => {
                        // Only the removal of a stale temporary file that is
                        // not there may fail without failing the save.
                        assert_eq!(op.kind, crate::ledger::disk::OpKind::Remove, "{op:?}");
                        assert_eq!(on_disk, new);
                    }
                    Err(e) => {
                        failed += 1;
                        assert!(matches!(e, CalibrationError::Io { .. }), "{e:?}");
                        assert!(e.to_string().contains("cannot "), "{e}");
                        if op.kind == crate::ledger::disk::OpKind::SyncDir {
                            assert_eq!(on_disk, new, "{op:?}: the rename was done");
                        } else {
                            assert_eq!(on_disk, old, "{op:?}: {e}");
                        }
                    }
                }
                let names: Vec<_> = fs::read_dir(dir.path())
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .collect();
                assert_eq!(names, [CALIBRATION_FILE], "after {op:?}");
                new.save(&path).unwrap();
                assert_eq!(CalibrationFile::load(&path).unwrap(), new);
            }
        }
        assert!(
            failed >= 4 * (count - 1),
            "{failed} saves failed of {count} writes"
        );
    }
}
