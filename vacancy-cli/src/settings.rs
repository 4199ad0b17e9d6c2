//! Saved settings (`POST /admin/settings`): the console's edit applied to the
//! configuration file, validated as `check-config` validates, and written
//! atomically. A restart applies it; until then the running configuration
//! stays authoritative and `/status` lists what differs (SCOPE-03).

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::Serialize;
use tracing::{info, warn};
use vacancy::config::{Config, ConfigError, SettingsEdit, pending_keys};
use vacancy::registry::AdapterRegistry;

/// What `/status` says about saved settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SettingsStatus {
    /// The configuration file the daemon runs on; `None` on the embedded default.
    pub config_path: Option<String>,
    /// Keys whose saved value differs from the running one; empty when none.
    pub pending: Vec<String>,
    /// The saved file no longer passes validation (edited by hand since).
    pub saved_invalid: Option<String>,
}

/// The editable settings of one configuration, in configuration order
/// (`GET /settings`, for the console's form).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Editable {
    /// Each resource's reserve.
    pub resources: Vec<EditableResource>,
    /// Each upstream's editable keys.
    pub upstreams: Vec<EditableUpstream>,
}

/// One resource's editable keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EditableResource {
    /// Its name.
    pub name: String,
    /// `reserve_mib`.
    pub reserve_mib: u64,
}

/// One upstream's editable keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EditableUpstream {
    /// Its name.
    pub name: String,
    /// `default_min_free_mib`.
    pub default_min_free_mib: u64,
    /// `resident_min_free_mib`.
    pub resident_min_free_mib: u64,
    /// `[upstream.models]`.
    pub models: std::collections::BTreeMap<String, vacancy::config::ModelRequirement>,
    /// `on_owner_return`.
    pub on_owner_return: &'static str,
    /// `drain_timeout_s`.
    pub drain_timeout_s: u64,
    /// `yield_on_veto`.
    pub yield_on_veto: bool,
    /// `owner_scope` (advanced, scope admin).
    pub owner_scope: &'static str,
    /// `management` (advanced, scope admin).
    pub management: &'static str,
}

impl Editable {
    /// The editable keys of `config`.
    pub fn of(config: &Config) -> Self {
        Editable {
            resources: config
                .resources
                .iter()
                .map(|r| EditableResource {
                    name: r.name.clone(),
                    reserve_mib: r.reserve_mib,
                })
                .collect(),
            upstreams: config
                .upstreams
                .iter()
                .map(|u| EditableUpstream {
                    name: u.name.clone(),
                    default_min_free_mib: u.default_min_free_mib,
                    resident_min_free_mib: u.resident_min_free_mib,
                    models: u.models.clone(),
                    on_owner_return: u.on_owner_return.as_str(),
                    drain_timeout_s: u.drain_timeout_s,
                    yield_on_veto: u.yield_on_veto,
                    owner_scope: u.owner_scope.as_str(),
                    management: u.management.as_str(),
                })
                .collect(),
        }
    }
}

/// `GET /settings`: the running settings, the saved ones, and what differs.
#[derive(Debug, Clone, Serialize)]
pub struct SettingsForm {
    /// The configuration file; `None` on the embedded default (nothing can be saved).
    pub config_path: Option<String>,
    /// What the daemon runs on (authoritative until a restart, SCOPE-03).
    pub running: Editable,
    /// What the file holds now, when it validates.
    pub saved: Option<Editable>,
    /// Why the file does not validate, when it does not.
    pub saved_invalid: Option<String>,
    /// Keys that differ.
    pub pending: Vec<String>,
}

/// Why a save did not happen.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// The daemon runs on its embedded default: there is no file to save to.
    #[error(
        "vacancyd runs on its embedded default configuration, so there is no file to save settings to; start it with --config FILE"
    )]
    NoFile,
    /// The edit asks for nothing.
    #[error("the settings name no change")]
    Empty,
    /// The edited configuration does not validate: nothing was written.
    #[error("the settings were not saved: {} problem{} found (nothing was written)", .0.len(), if .0.len() == 1 { "" } else { "s" })]
    Invalid(Vec<ConfigError>),
    /// Reading or writing the file failed.
    #[error("{0}")]
    Io(String),
}

/// What a successful save reports.
#[derive(Debug, Clone, Serialize)]
pub struct Saved {
    /// The file written.
    pub path: String,
    /// Where the previous version was kept.
    pub previous: String,
    /// Keys that differ from the running configuration now.
    pub pending: Vec<String>,
    /// What to do next.
    pub message: String,
}

/// The configuration file and the configuration the daemon started with.
pub struct Settings {
    path: Option<PathBuf>,
    running: Config,
    /// The adapter kinds a saved file is checked against.
    registry: Arc<AdapterRegistry>,
    state: Mutex<Known>,
    /// How often the file was read and validated (tests).
    #[cfg(test)]
    reads: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct Known {
    /// The file's modification time when it was last read.
    seen: Option<SystemTime>,
    status: SettingsStatus,
    /// The saved file's editable values, when it was valid at that read.
    saved: Option<Editable>,
}

impl Settings {
    /// Settings for a daemon running `running`, read from `path`.
    pub fn new(path: Option<PathBuf>, running: Config, registry: Arc<AdapterRegistry>) -> Self {
        let status = SettingsStatus {
            config_path: path.as_ref().map(|p| p.display().to_string()),
            ..SettingsStatus::default()
        };
        Settings {
            path,
            running,
            registry,
            state: Mutex::new(Known {
                seen: None,
                status,
                saved: None,
            }),
            #[cfg(test)]
            reads: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// What differs between the saved file and the running configuration,
    /// re-read only when the file changed since the last look.
    pub fn status(&self) -> SettingsStatus {
        self.look().status.clone()
    }

    /// The form the console edits: running and saved values. The file is
    /// read and validated at most once for both (issue 30), and not at all
    /// when it has not changed since the last look.
    pub fn form(&self) -> SettingsForm {
        let known = self.look();
        SettingsForm {
            config_path: known.status.config_path.clone(),
            running: Editable::of(&self.running),
            saved: known.saved.clone(),
            saved_invalid: known.status.saved_invalid.clone(),
            pending: known.status.pending.clone(),
        }
    }

    /// What is known of the saved file, read and validated again only when
    /// its modification time changed since the last look.
    fn look(&self) -> std::sync::MutexGuard<'_, Known> {
        let mut known = self.known();
        let Some(path) = &self.path else {
            return known;
        };
        let mtime = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        if mtime.is_some() && known.seen == mtime {
            return known;
        }
        known.seen = mtime;
        #[cfg(test)]
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| {
                crate::check_config::validate(&text, &path.display().to_string(), &self.registry)
                    .map_err(|e| e.to_string())
            }) {
            Ok(saved) => {
                known.status.pending = pending_keys(&self.running, &saved.config);
                known.status.saved_invalid = None;
                known.saved = Some(Editable::of(&saved.config));
            }
            Err(e) => {
                known.status.pending = Vec::new();
                known.status.saved_invalid = Some(e);
                known.saved = None;
            }
        }
        known
    }

    /// Apply `edit` to the configuration file, validate the result as
    /// `check-config` does, and write it atomically, keeping the previous
    /// file beside it as `<name>.prev`.
    ///
    /// # Errors
    ///
    /// [`SaveError`]: no file, an empty edit, every validation problem with
    /// its key (nothing written), or the I/O error.
    pub fn save(&self, edit: &SettingsEdit, by: &str) -> Result<Saved, SaveError> {
        let path = self.path.as_ref().ok_or(SaveError::NoFile)?;
        if edit.is_empty() {
            return Err(SaveError::Empty);
        }
        // One save at a time: the lock also guards the file.
        let mut known = self.known();
        let file = through_links(path)?;
        let current = std::fs::read_to_string(&file).map_err(|e| {
            SaveError::Io(format!(
                "cannot read the configuration file {}: {e}",
                path.display()
            ))
        })?;
        let edited = edit.apply(&current).map_err(SaveError::Invalid)?;
        let saved =
            crate::check_config::validate(&edited, &path.display().to_string(), &self.registry)
                .map_err(|e| SaveError::Invalid(e.errors))?;
        let previous = write_atomically(&file, &current, &edited).map_err(SaveError::Io)?;
        let pending = pending_keys(&self.running, &saved.config);
        known.seen = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        known.status.pending = pending.clone();
        known.status.saved_invalid = None;
        known.saved = Some(Editable::of(&saved.config));
        info!(token = by, file = %path.display(), pending = %pending.join(","), "settings saved; a restart applies them");
        Ok(Saved {
            path: file.display().to_string(),
            previous: previous.display().to_string(),
            message: if pending.is_empty() {
                "saved; the file now matches the running settings".to_owned()
            } else {
                "saved; restart vacancyd (systemctl restart vacancyd) to apply them — until then the running settings stay in force".to_owned()
            },
            pending,
        })
    }
}

/// The file a save replaces: `path` itself, or for a symbolic link (a
/// configuration kept elsewhere and linked into place) the file it leads
/// to, so the link stays a link and the target gets the new text. A link
/// that leads nowhere is refused with the reason.
fn through_links(path: &Path) -> Result<PathBuf, SaveError> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| {
        SaveError::Io(format!(
            "cannot read the configuration file {}: {e}",
            path.display()
        ))
    })?;
    if !meta.file_type().is_symlink() {
        return Ok(path.to_path_buf());
    }
    let target = std::fs::canonicalize(path).map_err(|e| {
        SaveError::Io(format!(
            "the configuration {} is a symbolic link that leads to no file ({e}); fix the link or save the file it should lead to",
            path.display()
        ))
    })?;
    if !std::fs::metadata(&target).is_ok_and(|m| m.is_file()) {
        return Err(SaveError::Io(format!(
            "the configuration {} is a symbolic link to {}, which is not a regular file; nothing was saved",
            path.display(),
            target.display()
        )));
    }
    Ok(target)
}

/// The previous version's place beside `path`.
pub fn previous_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".prev");
    path.with_file_name(name)
}

/// Write `text` over `path` so that a crash leaves the old file or the new
/// one, never a mix: the previous text goes to `<name>.prev` first, then the
/// new text to a temporary file beside `path`, which is synced and renamed
/// over it, and the directory is synced. Both new files take `path`'s mode.
fn write_atomically(path: &Path, previous: &str, text: &str) -> Result<PathBuf, String> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mode = std::fs::metadata(path)
        .map(|m| m.permissions())
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let prev = previous_path(path);
    write_synced(&prev, previous, &mode)?;
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".saving");
    let tmp = path.with_file_name(tmp_name);
    write_synced(&tmp, text, &mode)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot replace {}: {e}", path.display())
    })?;
    match File::open(dir).and_then(|d| d.sync_all()) {
        Ok(()) => {}
        Err(e) => {
            warn!(dir = %dir.display(), error = %e, "could not sync the configuration directory")
        }
    }
    Ok(prev)
}

/// Write `text` to `path` (replacing it through a temporary file) and sync it.
fn write_synced(path: &Path, text: &str, mode: &std::fs::Permissions) -> Result<(), String> {
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.set_permissions(mode.clone())?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const TEXT: &str = r#"# keep me
[server]
listen = "127.0.0.1:7480"

[[resource]]
name = "ram"
reserve_mib = 1024 # desk

[[upstream]]
name = "llama"
adapter = "llamacpp"
listen = "127.0.0.1:18081"
target = "http://127.0.0.1:18080"
resource = "ram"
"#;

    fn setup() -> (tempfile::TempDir, PathBuf, Settings) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vacancyd.toml");
        std::fs::write(&path, TEXT).unwrap();
        let running = Config::parse(TEXT, "t").unwrap().config;
        let s = Settings::new(
            Some(path.clone()),
            running,
            Arc::new(vacancy_adapters::builtin::registry()),
        );
        (dir, path, s)
    }

    #[test]
    fn a_save_writes_the_file_keeps_the_previous_beside_it_and_lists_what_is_pending() {
        let (_dir, path, s) = setup();
        let edit: SettingsEdit =
            serde_json::from_str(r#"{"resources": {"ram": {"reserve_mib": 2048}}}"#).unwrap();
        let saved = s.save(&edit, "test").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# keep me\n"), "{text}");
        assert!(text.contains("reserve_mib = 2048 # desk"), "{text}");
        assert_eq!(std::fs::read_to_string(previous_path(&path)).unwrap(), TEXT);
        assert_eq!(saved.pending, ["resource.ram.reserve_mib"]);
        assert_eq!(s.status().pending, ["resource.ram.reserve_mib"]);
        // No temporary file is left behind.
        let names: Vec<String> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn an_invalid_edit_writes_nothing_and_names_every_problem() {
        let (_dir, path, s) = setup();
        let edit: SettingsEdit = serde_json::from_str(
            r#"{"upstreams": {"llama": {"on_owner_return": "later", "management": "sometimes"}}}"#,
        )
        .unwrap();
        let Err(SaveError::Invalid(problems)) = s.save(&edit, "test") else {
            panic!("expected validation errors");
        };
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems.iter().any(|p| p.path.ends_with("on_owner_return")));
        assert!(problems.iter().any(|p| p.path.ends_with("management")));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), TEXT);
        assert!(!previous_path(&path).exists());
    }

    #[test]
    fn a_file_edited_by_hand_is_noticed() {
        let (_dir, path, s) = setup();
        assert!(s.status().pending.is_empty());
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, TEXT.replace("1024", "4096")).unwrap();
        // mtime granularity: make sure the change is seen as one.
        let later = SystemTime::now() + std::time::Duration::from_secs(1);
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert_eq!(s.status().pending, ["resource.ram.reserve_mib"]);
    }

    #[test]
    fn the_form_reads_and_validates_the_file_once() {
        // Issue 30 item 13: status and form share one read and validation,
        // and an unchanged file is not read again.
        let (_dir, path, s) = setup();
        let form = s.form();
        assert_eq!(s.reads.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(form.saved.is_some() && form.saved_invalid.is_none());
        let _ = s.status();
        let _ = s.form();
        assert_eq!(s.reads.load(std::sync::atomic::Ordering::SeqCst), 1);
        std::fs::write(&path, "not toml [").unwrap();
        let later = SystemTime::now() + std::time::Duration::from_secs(1);
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(later)
            .unwrap();
        let form = s.form();
        assert_eq!(s.reads.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert!(form.saved.is_none() && form.saved_invalid.is_some());
    }

    #[cfg(unix)]
    #[test]
    fn a_save_through_a_symlinked_configuration_writes_the_link_target() {
        // Issue 30 item 13: the link stays a link; the file it leads to gets
        // the new text and its previous version beside it.
        let (dir, real, _) = setup();
        let link = dir.path().join("linked.toml");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let running = Config::parse(TEXT, "t").unwrap().config;
        let s = Settings::new(
            Some(link.clone()),
            running,
            Arc::new(vacancy_adapters::builtin::registry()),
        );
        let edit: SettingsEdit =
            serde_json::from_str(r#"{"resources": {"ram": {"reserve_mib": 2048}}}"#).unwrap();
        let saved = s.save(&edit, "test").unwrap();
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink(),
            "the link was replaced by a regular file"
        );
        assert!(
            std::fs::read_to_string(&real)
                .unwrap()
                .contains("reserve_mib = 2048")
        );
        assert_eq!(std::fs::read_to_string(previous_path(&real)).unwrap(), TEXT);
        assert_eq!(
            saved.path,
            real.canonicalize().unwrap().display().to_string()
        );
        // A link that leads nowhere is refused, and nothing is written.
        let dangling = dir.path().join("dangling.toml");
        std::os::unix::fs::symlink(dir.path().join("gone.toml"), &dangling).unwrap();
        let running = Config::parse(TEXT, "t").unwrap().config;
        let s = Settings::new(
            Some(dangling.clone()),
            running,
            Arc::new(vacancy_adapters::builtin::registry()),
        );
        let Err(SaveError::Io(why)) = s.save(&edit, "test") else {
            panic!("a dangling link must be refused");
        };
        assert!(why.contains("symbolic link"), "{why}");
        assert!(
            std::fs::symlink_metadata(&dangling)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(!dir.path().join("gone.toml").exists());
    }
}
