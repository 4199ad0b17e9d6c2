//! Where the recovery directory is, and whether vacancyd may create it
//! (REC-10..REC-22 on Linux; REC-23, REC-24 on Windows, whose checks are the
//! platform seam's, `crate::platform::windows`).

use std::ffi::OsString;
#[cfg(unix)]
use std::fs::{self, DirBuilder};
#[cfg(unix)]
use std::io;
#[cfg(unix)]
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use tracing::info;
#[cfg(unix)]
use tracing::warn;

use crate::ledger::error::LedgerError;
#[cfg(unix)]
use crate::ledger::record;
#[cfg(unix)]
use crate::ledger::{COMPACT_FILE, JOURNAL_FILE};

/// The supplied systemd unit's state directory; its `admission`
/// subdirectory is the service's recovery directory (REC-12, REC-14).
pub const SERVICE_BASE: &str = "/var/lib/vacancyd";

/// The environment variable that moves [`SERVICE_BASE`], for packagers whose
/// service keeps state elsewhere and for tests, which must never read the
/// real host's service directory. The location rules stay the same.
pub const SERVICE_BASE_ENV: &str = "VACANCYD_SERVICE_BASE";

/// Everything [`resolve_location`] decides from, gathered by the caller so
/// that tests never read the real environment or `/var/lib/vacancyd`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LocationInput {
    /// The configuration file; `None` when vacancyd runs on its embedded default.
    pub config_path: Option<PathBuf>,
    /// `server.admission_state_dir` as written (empty: the default location).
    pub setting: String,
    /// `$STATE_DIRECTORY`, set by systemd's `StateDirectory=` (REC-12).
    pub state_directory: Option<OsString>,
    /// `$XDG_STATE_HOME`, for a run with no configuration file.
    pub xdg_state_home: Option<OsString>,
    /// `$HOME`, for a run with no configuration file.
    pub home: Option<OsString>,
    /// The service's state directory, normally [`SERVICE_BASE`]; its
    /// `admission` subdirectory is checked by REC-14..REC-16. On Windows
    /// `%ProgramData%\vacancyd`: its `admission` subdirectory is the default
    /// location, and every recovery directory must be inside it (REC-24).
    pub service_base: PathBuf,
}

impl LocationInput {
    /// The input for this process: the environment's `STATE_DIRECTORY`,
    /// `XDG_STATE_HOME` and `HOME`, and [`SERVICE_BASE`] (on Windows
    /// `%ProgramData%\vacancyd`, which no other variable moves).
    pub fn from_env(config_path: Option<&Path>, setting: &str) -> Self {
        LocationInput {
            config_path: config_path.map(Path::to_path_buf),
            setting: setting.to_owned(),
            state_directory: std::env::var_os("STATE_DIRECTORY"),
            xdg_state_home: std::env::var_os("XDG_STATE_HOME"),
            home: std::env::var_os("HOME"),
            service_base: service_base(),
        }
    }
}

/// The service's base for this process (see [`LocationInput::service_base`]).
#[cfg(unix)]
fn service_base() -> PathBuf {
    std::env::var_os(SERVICE_BASE_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(SERVICE_BASE), PathBuf::from)
}

#[cfg(windows)]
fn service_base() -> PathBuf {
    crate::platform::windows::service_base()
}

/// Where the default location came from, or that the setting chose the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocationSource {
    /// `$STATE_DIRECTORY/admission`, under the supplied systemd unit (REC-12).
    StateDirectory,
    /// Beside the configuration file, with the `.admission` extension (REC-11, REC-13).
    BesideConfig,
    /// `$XDG_STATE_HOME/vacancyd/admission` or `~/.local/state/vacancyd/admission`,
    /// with no configuration file (docs/operator-guide.md#the-recovery-directory).
    UserState,
    /// `server.admission_state_dir` named it (REC-10, REC-17).
    Setting,
    /// `%ProgramData%\vacancyd\admission`: the default on Windows, beside
    /// the default configuration `%ProgramData%\vacancyd\vacancyd.toml`.
    ProgramData,
}

/// The recovery directory to open with [`Ledger::open`](crate::ledger::Ledger::open).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The directory (absolute, lexically normalized), with every symbolic
    /// link on its way resolved: the directory that was checked, so a link
    /// changed after the check cannot redirect the ledger (issue 30 item 13).
    pub path: PathBuf,
    /// Where it came from.
    pub source: LocationSource,
    /// Whether it is the default location (the setting is empty or names it).
    pub is_default: bool,
    /// Whether this call created it.
    pub created: bool,
}

/// Find the recovery directory, creating it only when it is the default.
///
/// # Behavior
///
/// - The setting selects the directory (REC-10); a relative one resolves
///   against the configuration file's directory (REC-17).
/// - Empty setting: `$STATE_DIRECTORY/admission` under systemd (the first
///   path if it lists several, REC-12); otherwise beside the configuration
///   file with `.admission` replacing its extension, `vacancyd.toml` →
///   `vacancyd.admission` (REC-11, REC-13); with no configuration file
///   `$XDG_STATE_HOME/vacancyd/admission` or `~/.local/state/vacancyd/admission`.
/// - Empty setting and no `$STATE_DIRECTORY`: the service's recovery
///   directory `<service_base>/admission` is checked. Holding records of
///   unfinished or held work (or a journal that cannot be replayed), it
///   stops startup with [`LedgerError::ServiceRecordsElsewhere`] naming the
///   `admission_state_dir` line to add (REC-14); existing without records,
///   or unreadable, it logs a warning that the two locations differ (REC-15);
///   absent, nothing is said (REC-16).
/// - The default location (also when the setting names it) is checked first:
///   every existing directory on the path owned by root or the running
///   account, none writable by group or others unless it is a root-owned
///   sticky directory like `/tmp`; a symbolic link on the way (an operator's
///   link to another disk) is followed only when it is owned by root or the
///   running account, and the directories its target passes through are
///   checked the same way. A failure stops startup (REC-18, REC-19). Only
///   then is it created if missing, with missing parents, mode 0700 from
///   creation (REC-18, REC-21).
/// - A directory the setting names is held to the same path check when its
///   path passes through a symbolic link (issue 14 item 16).
/// - Any other directory must exist already, else [`LedgerError::Missing`]
///   names it (REC-20).
/// - The directory must be owned by the running account with mode 0700
///   ([`check_recovery_dir`], REC-22); vacancyd never changes an existing
///   directory's permissions or owner (REC-21).
/// - On Windows instead: with an empty setting the directory is
///   `%ProgramData%\vacancyd\admission`, created folder by folder with a
///   protected DACL for Administrators and LocalSystem; any directory must be
///   inside `%ProgramData%\vacancyd` with no reparse point on its way and no
///   folder from there down letting another account in (REC-24), and the
///   directory itself owned by and private to those two (REC-23).
pub fn resolve_location(input: &LocationInput) -> Result<Location, LedgerError> {
    let located = locate(input)?;
    let (created, path) = check_and_create(input, &located)?;
    check_recovery_dir(&path)?;
    Ok(Location {
        path,
        source: located.source,
        is_default: located.is_default,
        created,
    })
}

/// The checks before the directory itself, and the creation of the default
/// location: REC-14..REC-16, REC-18, REC-19, REC-21 and issue 14 item 16.
/// Returns whether the directory was created, and the directory as checked:
/// its path with every link on the way resolved, so that what is opened later
/// is what was checked.
#[cfg(unix)]
fn check_and_create(
    input: &LocationInput,
    located: &Located,
) -> Result<(bool, PathBuf), LedgerError> {
    let Located {
        config,
        state_dir,
        path,
        is_default,
        ..
    } = located;
    if input.setting.trim().is_empty() && state_dir.is_none() {
        check_service_dir(input, config.as_deref(), path)?;
    }
    let euid = running_uid();
    let mut created = false;
    let mut checked = check_path_safety(path, euid, *is_default)?;
    if *is_default {
        created = create_private(&checked)?;
        if created {
            // Look again: nothing may have been swapped in while creating.
            checked = check_path_safety(path, euid, *is_default)?;
            info!(path = %checked.display(), "created the recovery directory");
        }
    }
    if checked != *path {
        info!(
            path = %path.display(),
            resolved = %checked.display(),
            "the recovery directory is reached through a symbolic link; using the directory it leads to"
        );
    }
    Ok((created, checked))
}

/// REC-24 on the way to the directory, and the creation of the default
/// location with its protected DACL (REC-18, REC-21). Returns whether the
/// directory was created, and the directory (no reparse point is on its
/// way, so its path is itself).
#[cfg(windows)]
fn check_and_create(
    input: &LocationInput,
    located: &Located,
) -> Result<(bool, PathBuf), LedgerError> {
    use crate::platform::windows as win;
    let trusted = win::trusted_accounts();
    let base = &input.service_base;
    let path = &located.path;
    win::check_path(path, base, &trusted).map_err(|r| windows_refusal(path, r))?;
    let mut created = false;
    if located.is_default {
        created = win::create_private_dirs(path, base).map_err(|r| windows_refusal(path, r))?;
        if created {
            // Look again: nothing may have been swapped in while creating.
            win::check_path(path, base, &trusted).map_err(|r| windows_refusal(path, r))?;
            info!(path = %path.display(), "created the recovery directory");
        }
    }
    Ok((created, path.clone()))
}

/// A refusal of the Windows side, as the ledger's error naming `path`.
#[cfg(windows)]
fn windows_refusal(path: &Path, refusal: crate::platform::windows::DirRefusal) -> LedgerError {
    use crate::platform::windows::DirRefusal;
    let path = path.to_path_buf();
    match refusal {
        DirRefusal::Outside { base } => LedgerError::OutsideServiceBase { path, base },
        DirRefusal::Reparse { component } => LedgerError::UnsafePath {
            path,
            component,
            why: "is a junction, symbolic link or other reparse point, which could send the \
                  recovery directory anywhere"
                .to_owned(),
        },
        DirRefusal::Exposed { folder, what } => LedgerError::NotPrivate { path, folder, what },
        DirRefusal::Missing => LedgerError::Missing { path },
        DirRefusal::NotADirectory => LedgerError::NotADirectory { path },
        DirRefusal::Io {
            action,
            path,
            source,
        } => LedgerError::Io {
            action,
            path,
            source,
        },
    }
}

/// The recovery directory [`resolve_location`] would use, without checking,
/// creating or reading anything there: for tools that only look, such as
/// `vacancyd check-config`, which must not create a directory as whatever
/// account runs it.
///
/// # Errors
///
/// A configuration path that cannot be made absolute, or a relative
/// setting without a configuration file.
pub fn recovery_path(input: &LocationInput) -> Result<PathBuf, LedgerError> {
    locate(input).map(|l| l.path)
}

/// Where the recovery directory is, and what decided it.
#[cfg_attr(windows, allow(dead_code))]
struct Located {
    config: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    path: PathBuf,
    source: LocationSource,
    is_default: bool,
}

fn locate(input: &LocationInput) -> Result<Located, LedgerError> {
    let config = match &input.config_path {
        Some(p) => Some(normalize(
            &std::path::absolute(p).map_err(|e| LedgerError::io("resolve", p, e))?,
        )),
        None => None,
    };
    let state_dir = state_directory(input.state_directory.as_ref());
    let (default, default_source) =
        default_location(input, config.as_deref(), state_dir.as_deref())?;
    let setting = input.setting.trim();
    let (path, source) = if setting.is_empty() {
        (default.clone(), default_source)
    } else {
        let named = Path::new(setting);
        let abs = if named.is_absolute() {
            named.to_path_buf()
        } else {
            let base = config.as_deref().and_then(Path::parent).ok_or_else(|| {
                LedgerError::RelativeWithoutConfig {
                    setting: setting.to_owned(),
                }
            })?;
            base.join(named)
        };
        (normalize(&abs), LocationSource::Setting)
    };
    let is_default = path == default;
    Ok(Located {
        config,
        state_dir,
        path,
        source,
        is_default,
    })
}

/// Check an existing recovery directory: a directory owned by the running
/// account with permission bits exactly 0700.
///
/// # Behavior
///
/// Missing: [`LedgerError::Missing`] (REC-20). Another owner:
/// [`LedgerError::WrongOwner`] naming the path and the `chown` fix; other
/// permissions: [`LedgerError::WrongMode`] naming the path and `chmod 700`
/// (REC-22). Never changes the directory (REC-21).
///
/// On Windows: a folder, not a reparse point, owned by and accessible only
/// to Administrators and LocalSystem, else [`LedgerError::NotPrivate`]
/// naming which account has which access (REC-23).
#[cfg(unix)]
pub fn check_recovery_dir(path: &Path) -> Result<(), LedgerError> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(LedgerError::Missing {
                path: path.to_path_buf(),
            });
        }
        Err(e) => return Err(LedgerError::io("inspect the recovery directory", path, e)),
    };
    if !meta.is_dir() {
        return Err(LedgerError::NotADirectory {
            path: path.to_path_buf(),
        });
    }
    let euid = running_uid();
    if meta.uid() != euid {
        return Err(LedgerError::WrongOwner {
            path: path.to_path_buf(),
            owner: meta.uid(),
            expected: euid,
        });
    }
    // The permission bits decide; the mode is reported whole, with the
    // sticky, setuid and setgid bits, as `ls` and `stat` show it (1777).
    if meta.mode() & 0o777 != 0o700 {
        return Err(LedgerError::WrongMode {
            path: path.to_path_buf(),
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(())
}

/// REC-23 (see the Unix version's documentation).
#[cfg(windows)]
pub fn check_recovery_dir(path: &Path) -> Result<(), LedgerError> {
    use crate::platform::windows as win;
    win::check_private_dir(path, &win::trusted_accounts()).map_err(|r| windows_refusal(path, r))
}

/// The effective uid: the owner of the files this process creates.
#[cfg(unix)]
pub(crate) fn running_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The first path `$STATE_DIRECTORY` lists (colon-separated), when set and not empty.
#[cfg(unix)]
fn state_directory(value: Option<&OsString>) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    value?
        .as_bytes()
        .split(|&b| b == b':')
        .find(|p| !p.is_empty())
        .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)))
}

/// No systemd on Windows.
#[cfg(windows)]
fn state_directory(_value: Option<&OsString>) -> Option<PathBuf> {
    None
}

/// `%ProgramData%\vacancyd\admission`, wherever the configuration is (issue
/// 29: the service's location, as `$STATE_DIRECTORY/admission` is on Linux).
#[cfg(windows)]
fn default_location(
    input: &LocationInput,
    _config: Option<&Path>,
    _state_dir: Option<&Path>,
) -> Result<(PathBuf, LocationSource), LedgerError> {
    Ok((
        normalize(&input.service_base.join("admission")),
        LocationSource::ProgramData,
    ))
}

#[cfg(unix)]
fn default_location(
    input: &LocationInput,
    config: Option<&Path>,
    state_dir: Option<&Path>,
) -> Result<(PathBuf, LocationSource), LedgerError> {
    if let Some(sd) = state_dir {
        if !sd.is_absolute() {
            return Err(LedgerError::NoDefaultLocation {
                why: format!("STATE_DIRECTORY={} is not an absolute path", sd.display()),
            });
        }
        return Ok((
            normalize(&sd.join("admission")),
            LocationSource::StateDirectory,
        ));
    }
    if let Some(cfg) = config {
        let beside = cfg.with_extension("admission");
        if beside == cfg {
            return Err(LedgerError::NoDefaultLocation {
                why: format!(
                    "the default recovery directory would be the configuration file {} itself; \
                     set server.admission_state_dir",
                    cfg.display()
                ),
            });
        }
        return Ok((beside, LocationSource::BesideConfig));
    }
    let absolute = |v: &Option<OsString>| v.as_ref().map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(xdg) = absolute(&input.xdg_state_home) {
        return Ok((
            normalize(&xdg.join("vacancyd").join("admission")),
            LocationSource::UserState,
        ));
    }
    if let Some(home) = absolute(&input.home) {
        return Ok((
            normalize(&home.join(".local/state/vacancyd/admission")),
            LocationSource::UserState,
        ));
    }
    Err(LedgerError::NoDefaultLocation {
        why: "there is no configuration file and neither XDG_STATE_HOME nor HOME is an absolute \
              path"
            .to_owned(),
    })
}

#[cfg(unix)]
/// What the service's recovery directory holds.
enum ServiceDir {
    Absent,
    NoRecords,
    Unreadable(String),
    Records(String),
}

#[cfg(unix)]
fn probe_service_dir(dir: &Path) -> ServiceDir {
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return ServiceDir::Absent,
        Err(e) => return ServiceDir::Unreadable(e.to_string()),
        Ok(m) if !m.is_dir() && !m.file_type().is_symlink() => {
            return ServiceDir::Unreadable("it is not a directory".to_owned());
        }
        Ok(_) => {}
    }
    let mut found = None;
    for name in [JOURNAL_FILE, COMPACT_FILE] {
        let file = dir.join(name);
        match fs::read(&file) {
            Ok(bytes) => {
                found = Some((file, bytes));
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return ServiceDir::Unreadable(format!("{}: {e}", file.display())),
        }
    }
    let Some((file, bytes)) = found else {
        return ServiceDir::NoRecords;
    };
    match record::replay(&bytes, &file) {
        Ok(r) if r.live.len() == 0 => ServiceDir::NoRecords,
        Ok(r) => {
            let n = r.live.len();
            let first = r
                .live
                .ordered()
                .first()
                .map(|e| format!(", among them entry {}", e.id));
            ServiceDir::Records(format!(
                "{n} unresolved {}{}",
                if n == 1 { "entry" } else { "entries" },
                first.unwrap_or_default()
            ))
        }
        Err(e) => ServiceDir::Records(format!("a journal that cannot be replayed: {e}")),
    }
}

#[cfg(unix)]
/// REC-14..REC-16: the service's recovery directory, for a run with an empty
/// setting and no `$STATE_DIRECTORY`.
fn check_service_dir(
    input: &LocationInput,
    config: Option<&Path>,
    chosen: &Path,
) -> Result<(), LedgerError> {
    let service_dir = normalize(&input.service_base.join("admission"));
    if service_dir == chosen {
        return Ok(());
    }
    match probe_service_dir(&service_dir) {
        ServiceDir::Absent => Ok(()),
        ServiceDir::NoRecords => {
            warn!(
                service_dir = %service_dir.display(),
                chosen = %chosen.display(),
                "the service's recovery directory exists without records, but this run uses \
                 another: the two locations differ (set server.admission_state_dir to use one \
                 of them for every start)"
            );
            Ok(())
        }
        ServiceDir::Unreadable(why) => {
            warn!(
                service_dir = %service_dir.display(),
                chosen = %chosen.display(),
                reason = %why,
                "the service's recovery directory cannot be read, and this run uses another: the \
                 two locations differ (set server.admission_state_dir to use one of them for \
                 every start)"
            );
            Ok(())
        }
        ServiceDir::Records(detail) => Err(LedgerError::ServiceRecordsElsewhere {
            service_dir,
            chosen: chosen.to_path_buf(),
            detail,
            config: match config {
                Some(c) => c.display().to_string(),
                None => "a configuration file (this run has none: pass --config)".to_owned(),
            },
        }),
    }
}

#[cfg(unix)]
/// How many symbolic links a path may pass through before it counts as a
/// loop, as the kernel's own limit (`ELOOP`).
const MAX_LINKS: usize = 40;

#[cfg(unix)]
/// What walking a recovery directory's path found.
#[derive(Debug, Default)]
struct PathWalk {
    /// The symbolic links followed on the way, in order.
    links: Vec<PathBuf>,
    /// The first directory on the way that another account could change:
    /// the directory and why.
    untrusted: Option<(PathBuf, String)>,
    /// The path with every link on the way resolved: the directory the walk
    /// checked, to be opened as itself (issue 30 item 13: a link changed
    /// after the walk cannot send the ledger elsewhere).
    resolved: PathBuf,
}

#[cfg(unix)]
/// `reached` with the components still `pending` (a stack, the first on top).
fn joined(reached: &Path, pending: &[OsString]) -> PathBuf {
    let mut out = reached.to_path_buf();
    for name in pending.iter().rev() {
        if name == ".." {
            out.pop();
        } else if name != "." {
            out.push(name);
        }
    }
    out
}

#[cfg(unix)]
/// REC-18/REC-19 and issue 14 item 16: whether another account could replace
/// or redirect `path`.
///
/// Walks `path` from the root, following each symbolic link on the way (an
/// operator's link to another disk) and going on along its target. A link
/// owned by an account other than root or `euid` could be pointed anywhere
/// by that account, so it stops the walk with [`LedgerError::UnsafePath`];
/// so does a loop, or a file where a directory must be. Every directory
/// before the last component must be owned by root or `euid` and not
/// writable by group or others, unless it is a root-owned sticky directory
/// like `/tmp`; the first that is not is reported in
/// [`PathWalk::untrusted`], for the caller to judge. The walk ends at the
/// first component that does not exist. The last component's own owner and
/// mode are [`check_recovery_dir`]'s.
fn walk_path(path: &Path, euid: u32) -> Result<PathWalk, LedgerError> {
    let unsafe_at = |component: &Path, why: String| LedgerError::UnsafePath {
        path: path.to_path_buf(),
        component: component.to_path_buf(),
        why,
    };
    let mut walk = PathWalk::default();
    // The root, a directory on the way of every path.
    let root = Path::new("/");
    let meta = fs::symlink_metadata(root).map_err(|e| LedgerError::io("inspect", root, e))?;
    walk.untrusted = untrusted_dir(&meta, euid).map(|why| (root.to_path_buf(), why));
    // The components still to walk, and the directory reached so far (with
    // every link before it resolved, so `..` can be taken lexically).
    let mut pending: Vec<OsString> = Vec::new();
    let mut reached = PathBuf::new();
    push_components(&mut pending, &mut reached, path);
    while let Some(name) = pending.pop() {
        if name == ".." {
            reached.pop();
            continue;
        }
        if name == "." {
            continue;
        }
        let next = reached.join(&name);
        let meta = match fs::symlink_metadata(&next) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                pending.push(name);
                walk.resolved = joined(&reached, &pending);
                return Ok(walk);
            }
            Err(e) => return Err(LedgerError::io("inspect", &next, e)),
        };
        if meta.file_type().is_symlink() {
            let uid = meta.uid();
            if uid != 0 && uid != euid {
                return Err(unsafe_at(
                    &next,
                    format!(
                        "is a symbolic link owned by uid {uid}, neither root nor the account \
                         vacancyd runs as (uid {euid}), which could point it anywhere"
                    ),
                ));
            }
            if walk.links.len() == MAX_LINKS {
                return Err(unsafe_at(
                    &next,
                    format!("leads through more than {MAX_LINKS} symbolic links (a loop?)"),
                ));
            }
            let target =
                fs::read_link(&next).map_err(|e| LedgerError::io("read the link", &next, e))?;
            walk.links.push(next);
            push_components(&mut pending, &mut reached, &target);
            continue;
        }
        if pending.is_empty() {
            // The recovery directory itself: check_recovery_dir's.
            walk.resolved = next;
            return Ok(walk);
        }
        if !meta.is_dir() {
            return Err(unsafe_at(&next, "is not a directory".to_owned()));
        }
        if walk.untrusted.is_none()
            && let Some(why) = untrusted_dir(&meta, euid)
        {
            walk.untrusted = Some((next.clone(), why));
        }
        reached = next;
    }
    walk.resolved = reached;
    Ok(walk)
}

#[cfg(unix)]
/// Put `path`'s components on `pending` (a stack: the first on top), in
/// front of what is there; an absolute `path` starts again from the root.
fn push_components(pending: &mut Vec<OsString>, reached: &mut PathBuf, path: &Path) {
    let mut names: Vec<OsString> = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => {
                reached.clear();
                reached.push("/");
                names.clear();
            }
            Component::CurDir => {}
            Component::ParentDir => names.push(OsString::from("..")),
            Component::Normal(n) => names.push(n.to_os_string()),
        }
    }
    pending.extend(names.into_iter().rev());
}

#[cfg(unix)]
/// Why another account could change entries in this directory, if it could.
fn untrusted_dir(meta: &fs::Metadata, euid: u32) -> Option<String> {
    let uid = meta.uid();
    if uid != 0 && uid != euid {
        return Some(format!(
            "is owned by uid {uid}, neither root nor the account vacancyd runs as (uid {euid})"
        ));
    }
    let mode = meta.mode() & 0o7777;
    let sticky_root = mode & 0o1000 != 0 && uid == 0;
    if mode & 0o022 != 0 && !sticky_root {
        return Some(format!(
            "is writable by group or others (mode {mode:04o}) and is not a root-owned sticky \
             directory like /tmp"
        ));
    }
    None
}

#[cfg(unix)]
/// REC-18/REC-19 for the default location, which vacancyd may create: no
/// directory on the path, on either side of any link, that another account
/// could change. Issue 14 item 16 for any other: a path that passes through
/// a symbolic link is held to the same rule, since the link redirects it;
/// without links, a named directory is only [`check_recovery_dir`]'s (REC-22).
///
/// Returns the path with its links resolved: the directory that was checked.
fn check_path_safety(path: &Path, euid: u32, is_default: bool) -> Result<PathBuf, LedgerError> {
    let walk = walk_path(path, euid)?;
    if !is_default && walk.links.is_empty() {
        return Ok(walk.resolved);
    }
    let Some((component, why)) = walk.untrusted else {
        return Ok(walk.resolved);
    };
    let why = match walk.links.first() {
        Some(link) if !is_default => {
            format!(
                "{why}, on a path that follows the symbolic link {}",
                link.display()
            )
        }
        _ => why,
    };
    Err(LedgerError::UnsafePath {
        path: path.to_path_buf(),
        component,
        why,
    })
}

#[cfg(unix)]
/// Create `path` and its missing parents, private from creation (mode 0700),
/// and make the new entries durable. Returns whether it was created.
fn create_private(path: &Path) -> Result<bool, LedgerError> {
    match fs::symlink_metadata(path) {
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(LedgerError::io("inspect", path, e)),
    }
    // The nearest ancestor that exists: every directory below it is new.
    let mut existing = path.parent();
    while let Some(p) = existing {
        if fs::symlink_metadata(p).is_ok() {
            break;
        }
        existing = p.parent();
    }
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| LedgerError::io("create the recovery directory", path, e))?;
    // Sync each parent whose entries changed, deepest first.
    let mut dir = path.parent();
    while let Some(d) = dir {
        super::sync_dir(d)?;
        if Some(d) == existing {
            break;
        }
        dir = d.parent();
    }
    Ok(true)
}

/// An absolute path with `.` and `..` resolved lexically (the path has no
/// symbolic links to resolve where it matters: the default is checked).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                if out.parent().is_some() {
                    out.pop();
                }
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}
