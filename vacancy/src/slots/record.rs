//! The persisted slot state record (`state.json`), written atomically.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ledger::{RealDisk, write_atomically};
use crate::slots::state::SlotState;

/// The file name of a slot's state record inside its directory.
pub const STATE_FILE_NAME: &str = "state.json";

/// A slot's persisted state.
///
/// # Behavior
///
/// Carries `name`, `state`, `model_id`, `port`, `updated_at`, `message` and
/// `extra` (PERS-01). `updated_at` is seconds since the Unix epoch, supplied by
/// the caller (nothing here reads a clock). `state` is the lowercase state name
/// (SLOT-02). Missing optional fields read as `None`/empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlotStateRecord {
    /// The slot name.
    pub name: String,
    /// Its state.
    pub state: SlotState,
    /// The bound model, if any.
    #[serde(default)]
    pub model_id: Option<String>,
    /// The port its server listens on, if any.
    #[serde(default)]
    pub port: Option<u16>,
    /// When the record was written, in seconds since the Unix epoch.
    pub updated_at: f64,
    /// A human-readable message, e.g. an ERROR's cause.
    #[serde(default)]
    pub message: Option<String>,
    /// Anything else the caller keeps with the state.
    #[serde(default)]
    pub extra: Map<String, Value>,
}

/// Why a state record could not be read or written.
///
/// Every variant names the file (PERS-04: a reader gets a typed error, never a
/// half-parsed record).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateRecordError {
    /// A file system operation failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done, e.g. `replace`.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// The file is not a valid state record: torn, empty, not JSON, or JSON of
    /// the wrong shape.
    #[error("{path} is not a valid slot state record: {detail}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
}

impl StateRecordError {
    /// The file or directory the error is about.
    ///
    /// PERS-04: errors name the file.
    pub fn path(&self) -> &Path {
        match self {
            StateRecordError::Io { path, .. } | StateRecordError::Corrupt { path, .. } => path,
        }
    }

    fn io(action: &'static str, path: &Path, source: io::Error) -> Self {
        StateRecordError::Io {
            action,
            path: path.to_owned(),
            source,
        }
    }
}

/// The state record's path inside a slot directory.
///
/// `<slot_dir>/state.json` (PERS-03 names the file; where `slot_dir` lives is
/// the caller's).
pub fn state_record_path(slot_dir: &Path) -> PathBuf {
    slot_dir.join(STATE_FILE_NAME)
}

/// Writes `record` to `path` atomically.
///
/// # Behavior
///
/// Creates the parent directory if needed, then replaces `path` as the
/// ledger replaces its files ([`write_atomically`]): the JSON goes to a fresh
/// private (0600) temp file in the same directory, which is fsynced and
/// renamed over `path`, and the directory is fsynced (PERS-02). A reader sees
/// the old record or the new one, never a torn write (PERS-04). On failure
/// the temp file is removed.
pub fn write_state_record(path: &Path, record: &SlotStateRecord) -> Result<(), StateRecordError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    if path.file_name().is_none() {
        return Err(StateRecordError::io(
            "name a state record at",
            path,
            io::Error::new(io::ErrorKind::InvalidInput, "the path has no file name"),
        ));
    }
    fs::create_dir_all(&dir).map_err(|e| StateRecordError::io("create the directory", &dir, e))?;
    let mut bytes = serde_json::to_vec_pretty(record).map_err(|e| StateRecordError::Corrupt {
        path: path.to_owned(),
        detail: format!("cannot serialise the record: {e}"),
    })?;
    bytes.push(b'\n');
    write_atomically(&RealDisk, path, &bytes)
        .map_err(|e| StateRecordError::io(e.action, &e.path, e.source))
}

/// Reads the state record at `path`.
///
/// # Behavior
///
/// `Ok(None)` when the file does not exist (the slot never persisted a
/// state). A torn, empty, non-JSON or wrongly shaped file is
/// [`StateRecordError::Corrupt`] naming the file; other read failures are
/// [`StateRecordError::Io`] (PERS-04).
pub fn read_state_record(path: &Path) -> Result<Option<SlotStateRecord>, StateRecordError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StateRecordError::io("read", path, e)),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| StateRecordError::Corrupt {
            path: path.to_owned(),
            detail: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn record() -> SlotStateRecord {
        let mut extra = Map::new();
        extra.insert("breaker".into(), json!({"failures": 2}));
        SlotStateRecord {
            name: "agent".into(),
            state: SlotState::Ready,
            model_id: Some("qwen3-8b".into()),
            port: Some(8081),
            updated_at: 1_790_000_000.25,
            message: None,
            extra,
        }
    }

    fn dir_entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    // PERS-01, PERS-02
    #[test]
    fn pers_01_02_round_trip_and_no_temp_file_left() {
        let tmp = tempfile::tempdir().unwrap();
        let path = state_record_path(&tmp.path().join("agent"));
        assert_eq!(read_state_record(&path).unwrap(), None);
        write_state_record(&path, &record()).unwrap();
        assert_eq!(read_state_record(&path).unwrap(), Some(record()));
        let mut second = record();
        second.state = SlotState::Error;
        second.message = Some("health probe failed".into());
        write_state_record(&path, &second).unwrap();
        assert_eq!(read_state_record(&path).unwrap(), Some(second));
        assert_eq!(dir_entries(path.parent().unwrap()), vec!["state.json"]);
        // PERS-01: the field names on disk.
        let raw: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        let keys: Vec<&String> = raw.as_object().unwrap().keys().collect();
        for k in [
            "name",
            "state",
            "model_id",
            "port",
            "updated_at",
            "message",
            "extra",
        ] {
            assert!(keys.iter().any(|x| *x == k), "{k}");
        }
        assert_eq!(raw["state"], "error");
    }

    // PERS-01: optional fields may be absent.
    #[test]
    fn pers_01_minimal_record_reads() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state.json");
        fs::write(&path, r#"{"name":"s","state":"offline","updated_at":1}"#).unwrap();
        let r = read_state_record(&path).unwrap().unwrap();
        assert_eq!(r.state, SlotState::Offline);
        assert_eq!(r.model_id, None);
        assert!(r.extra.is_empty());
    }

    // PERS-04: torn, empty, non-JSON and wrongly shaped files are typed errors naming the file.
    #[test]
    fn pers_04_torn_or_non_json_file_is_a_typed_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state.json");
        let full = serde_json::to_vec(&record()).unwrap();
        let torn = &full[..full.len() / 2];
        for bad in [
            torn,
            b"".as_slice(),
            b"not json at all".as_slice(),
            br#"{"name":"s","state":"exploded","updated_at":1}"#.as_slice(),
            b"[1,2,3]".as_slice(),
        ] {
            fs::write(&path, bad).unwrap();
            let err = read_state_record(&path).unwrap_err();
            assert!(matches!(err, StateRecordError::Corrupt { .. }), "{err:?}");
            assert_eq!(err.path(), path);
            assert!(err.to_string().contains(&*path.to_string_lossy()));
        }
    }

    // PERS-02: a failing rename leaves no temp file behind and names the target.
    #[test]
    fn pers_02_failed_write_cleans_up() {
        let tmp = tempfile::tempdir().unwrap();
        // The target is a non-empty directory, so the rename fails.
        let path = tmp.path().join("state.json");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("x"), "x").unwrap();
        let err = write_state_record(&path, &record()).unwrap_err();
        assert!(
            matches!(
                err,
                StateRecordError::Io {
                    action: "replace",
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.path(), path);
        assert_eq!(dir_entries(tmp.path()), vec!["state.json"]);
    }

    // PERS-02: two writers racing on one record each replace it whole (each
    // its own temp file), and the record is private, as Python's mkstemp makes it.
    #[test]
    fn pers_02_writers_racing_on_one_record_each_replace_it_whole() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state.json");
        let writers: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|who| {
                let path = path.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        let mut r = record();
                        r.message = Some(format!("{who}{}", "x".repeat(i)));
                        write_state_record(&path, &r).unwrap();
                        read_state_record(&path).unwrap().unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(dir_entries(tmp.path()), vec!["state.json"]);
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    // PERS-04: a concurrent reader never sees a torn record.
    #[test]
    fn pers_04_concurrent_reader_sees_whole_records_only() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state.json");
        write_state_record(&path, &record()).unwrap();
        let reader_path = path.clone();
        let reader = std::thread::spawn(move || {
            for _ in 0..300 {
                let r = read_state_record(&reader_path).unwrap().unwrap();
                assert_eq!(r.name, "agent");
            }
        });
        for i in 0..300u32 {
            let mut r = record();
            r.message = Some("x".repeat(usize::try_from(i).unwrap() * 7));
            write_state_record(&path, &r).unwrap();
        }
        reader.join().unwrap();
        assert_eq!(dir_entries(tmp.path()), vec!["state.json"]);
    }
}
