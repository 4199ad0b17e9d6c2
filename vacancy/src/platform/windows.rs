//! The Windows side of the seam: files, the recovery directory's folders
//! (REC-23, REC-24), the connection budget and the local administration pipe
//! (HELD-09). Win32 calls go through `vacancy_win32`'s safe functions; what
//! they return is judged by [`super::access`].

use std::fs::{Metadata, OpenOptions};
use std::io;
use std::os::windows::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Once;

use tokio::net::windows::named_pipe::NamedPipeServer;
use tracing::warn;

use super::access::{
    ADMIN_PIPE_SDDL, PRIVATE_DIR_SDDL, Trusted, describe, exposures, is_reparse_point,
    windows_path_inside,
};
use super::sddl::{self, Descriptor, Sid};

/// `FILE_FLAG_OPEN_REPARSE_POINT`: open a reparse point itself, not what it points to.
const FILE_FLAG_OPEN_REPARSE_POINT: u32 = 0x0020_0000;

/// Connections the process may hold at once. Windows has no per-process
/// descriptor limit like Unix's `RLIMIT_NOFILE` (handles are bounded by
/// memory, in the millions), so the budget is a fixed number, as many as a
/// Linux host's default hard limit allows.
const CONNECTION_HANDLES: u64 = 16_384;

/// The local administration pipe's name (HELD-09).
pub const ADMIN_PIPE: &str = r"\\.\pipe\vacancyd-admin";

/// Under Wine only: with this variable set to `1`, the account vacancyd runs
/// as counts as trusted in the recovery directory's checks, beside
/// Administrators and LocalSystem. Wine reports every folder as owned by
/// the user running it and does not keep the owner or DACL a program sets,
/// so no folder could ever pass REC-23 there; the behaviour suite runs the
/// Windows build under Wine with it. On Windows it is ignored (and said so
/// in the log): nothing there weakens the check.
pub const WINE_TRUST_ENV: &str = "VACANCYD_WINE_TRUST_RUNNING_ACCOUNT";

/// New files inherit the recovery directory's protected DACL
/// ([`PRIVATE_DIR_SDDL`]): nothing to set.
pub fn private_file(options: &mut OpenOptions) -> &mut OpenOptions {
    options
}

/// Open a reparse point (a symbolic link, a junction) itself rather than
/// what it points to; [`opened_link`] then tells.
pub fn no_follow(options: &mut OpenOptions) -> &mut OpenOptions {
    options.custom_flags(FILE_FLAG_OPEN_REPARSE_POINT)
}

/// The open itself never fails for a link on Windows (see [`opened_link`]).
pub fn link_refused(_e: &io::Error) -> bool {
    false
}

/// Whether a file opened with [`no_follow`] is a reparse point.
pub fn opened_link(meta: &Metadata) -> bool {
    is_reparse_point(meta.file_attributes())
}

/// Move `from` over `to` with `MoveFileExW(REPLACE_EXISTING | WRITE_THROUGH)`:
/// durable when it returns.
pub fn replace_file(from: &Path, to: &Path) -> io::Result<()> {
    vacancy_win32::fs::replace_file(from, to)
}

/// Write all of `bytes` at `offset` (`WriteFile` with an `OVERLAPPED`
/// offset); the file's cursor moves past them, which the journal never uses.
pub fn write_at(file: &std::fs::File, mut offset: u64, mut bytes: &[u8]) -> io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !bytes.is_empty() {
        match file.seek_write(bytes, offset) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => {
                bytes = &bytes[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Nothing to do: a folder cannot be flushed without backup privileges, and
/// the entries that matter are made durable by [`replace_file`]'s
/// write-through and by each file's own flush.
pub fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}

/// The connection budget's basis ([`CONNECTION_HANDLES`]).
pub fn raise_open_file_limit() -> u64 {
    CONNECTION_HANDLES
}

/// Nothing to add: opening a file does not wait for a writer here, and no
/// file is read on the calling thread (see [`local_filesystem`]).
pub fn open_without_waiting(options: &mut OpenOptions) -> &mut OpenOptions {
    options
}

/// Not asked on Windows: a sampler's file reads stay on the blocking pool
/// (see the Unix side).
pub fn local_filesystem(_dir: &Path) -> bool {
    false
}

/// The ProgramData folder, as the shell knows it (`C:\ProgramData`; the
/// variable `%ProgramData%` is not read: a service's environment may lack it
/// or, under Wine, name another folder).
pub fn program_data() -> PathBuf {
    vacancy_win32::fs::program_data().unwrap_or_else(|e| {
        warn!(error = %e, "cannot ask Windows where ProgramData is; using C:\\ProgramData");
        PathBuf::from(r"C:\ProgramData")
    })
}

/// `%ProgramData%\vacancyd`: the default configuration, the recovery
/// directory (REC-24) and the service's logs live inside it.
pub fn service_base() -> PathBuf {
    program_data().join("vacancyd")
}

/// The accounts a recovery directory may let in: Administrators and
/// LocalSystem (REC-23), and under Wine with [`WINE_TRUST_ENV`] the
/// running account too.
pub fn trusted_accounts() -> Trusted {
    static SAID: Once = Once::new();
    let trusted = Trusted::administrators_and_system();
    if std::env::var_os(WINE_TRUST_ENV).is_none_or(|v| v != "1") {
        return trusted;
    }
    if !vacancy_win32::process::under_wine() {
        SAID.call_once(|| {
            warn!("{WINE_TRUST_ENV} is set but this is Windows, not Wine: ignored");
        });
        return trusted;
    }
    match vacancy_win32::process::user_sid() {
        Ok(sid) => {
            SAID.call_once(|| {
                warn!(account = %sid, "running under Wine with {WINE_TRUST_ENV}=1: the recovery directory's checks trust this account as well as Administrators and LocalSystem (Wine keeps no owner or DACL a program sets; for tests only)");
            });
            trusted.and(Sid::new(&sid))
        }
        Err(e) => {
            warn!(error = %e, "cannot read the running account's SID; {WINE_TRUST_ENV} has no effect");
            trusted
        }
    }
}

/// `path`'s owner and DACL.
///
/// # Errors
///
/// The operating system's error, or `InvalidData` for a descriptor the
/// parser cannot read.
pub fn descriptor(path: &Path) -> io::Result<Descriptor> {
    let text = vacancy_win32::security::descriptor_sddl(path)?;
    sddl::parse(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Why a recovery directory's path or folder is refused on Windows.
#[derive(Debug)]
pub enum DirRefusal {
    /// The directory is not inside the service base (REC-24).
    Outside {
        /// `%ProgramData%\vacancyd`.
        base: PathBuf,
    },
    /// A junction or other reparse point on the way (REC-24).
    Reparse {
        /// The reparse point.
        component: PathBuf,
    },
    /// A folder lets in another account (REC-23, REC-24).
    Exposed {
        /// The folder.
        folder: PathBuf,
        /// Who may do what, as [`describe`] says it.
        what: String,
    },
    /// The directory does not exist.
    Missing,
    /// The path is not a directory.
    NotADirectory,
    /// The operating system failed.
    Io {
        /// What vacancyd was doing.
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// Its error.
        source: io::Error,
    },
}

fn io_refusal(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> DirRefusal {
    let path = path.to_path_buf();
    move |source| DirRefusal::Io {
        action,
        path,
        source,
    }
}

/// Whether `folder` lets in only `trusted` (REC-23).
fn judge_folder(folder: &Path, trusted: &Trusted) -> Result<(), DirRefusal> {
    let d = descriptor(folder).map_err(io_refusal("read the owner and permissions of", folder))?;
    let found = exposures(&d, trusted);
    if found.is_empty() {
        return Ok(());
    }
    Err(DirRefusal::Exposed {
        folder: folder.to_path_buf(),
        what: describe(&found),
    })
}

/// REC-23: an existing recovery directory, a folder (not a reparse point)
/// owned by and accessible only to `trusted`. Never changes it (REC-21).
///
/// # Errors
///
/// [`DirRefusal`] naming what is wrong.
pub fn check_private_dir(path: &Path, trusted: &Trusted) -> Result<(), DirRefusal> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(DirRefusal::Missing),
        Err(e) => return Err(io_refusal("inspect the recovery directory", path)(e)),
    };
    if is_reparse_point(meta.file_attributes()) {
        return Err(DirRefusal::Reparse {
            component: path.to_path_buf(),
        });
    }
    if !meta.is_dir() {
        return Err(DirRefusal::NotADirectory);
    }
    judge_folder(path, trusted)
}

/// REC-24: `dir` is inside `base`, no existing component on its way from the
/// drive's root is a reparse point, and every existing folder from `base`
/// down lets in only `trusted`. The walk stops at the first component that
/// does not exist (the caller creates the rest, or refuses).
///
/// # Errors
///
/// [`DirRefusal`] naming the first thing wrong.
pub fn check_path(dir: &Path, base: &Path, trusted: &Trusted) -> Result<(), DirRefusal> {
    let inside = |p: &Path| windows_path_inside(&p.to_string_lossy(), &base.to_string_lossy());
    if !inside(dir) {
        return Err(DirRefusal::Outside {
            base: base.to_path_buf(),
        });
    }
    let mut on_the_way: Vec<&Path> = dir.ancestors().collect();
    on_the_way.reverse();
    for folder in on_the_way {
        let meta = match std::fs::symlink_metadata(folder) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_refusal("inspect", folder)(e)),
        };
        if is_reparse_point(meta.file_attributes()) {
            return Err(DirRefusal::Reparse {
                component: folder.to_path_buf(),
            });
        }
        if !meta.is_dir() {
            return Err(DirRefusal::NotADirectory);
        }
        if inside(folder) {
            judge_folder(folder, trusted)?;
        }
    }
    Ok(())
}

/// Create `dir` and its missing parents from `base` down (`base` too, if
/// missing), each with [`PRIVATE_DIR_SDDL`] from creation (REC-18, REC-21).
/// Returns whether anything was created. The folders above `base` must
/// exist.
///
/// # Errors
///
/// [`DirRefusal::Io`]: creating a folder owned by Administrators needs an
/// administrator or LocalSystem.
pub fn create_private_dirs(dir: &Path, base: &Path) -> Result<bool, DirRefusal> {
    let inside = |p: &Path| windows_path_inside(&p.to_string_lossy(), &base.to_string_lossy());
    let mut missing: Vec<&Path> = Vec::new();
    for folder in dir.ancestors().filter(|p| inside(p)) {
        match std::fs::symlink_metadata(folder) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(folder),
            Err(e) => return Err(io_refusal("inspect", folder)(e)),
        }
    }
    let created = !missing.is_empty();
    for folder in missing.into_iter().rev() {
        match vacancy_win32::security::create_dir(folder, PRIVATE_DIR_SDDL) {
            Ok(()) => {}
            // Someone else made it first: the checks that follow judge it.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(io_refusal(
                    "create, owned by Administrators (vacancyd must run as an administrator or \
                     as LocalSystem to create it),",
                    folder,
                )(e));
            }
        }
    }
    Ok(created)
}

/// Create one instance of the local administration pipe ([`ADMIN_PIPE`] or
/// `name`), its DACL admitting only Administrators and LocalSystem from
/// creation ([`ADMIN_PIPE_SDDL`], HELD-09). `first`: the first instance, so
/// a pipe another process created under the name is an error, not joined.
///
/// # Errors
///
/// The operating system's error.
pub fn create_admin_pipe(name: &str, first: bool) -> io::Result<NamedPipeServer> {
    vacancy_win32::pipe::create_server(name, ADMIN_PIPE_SDDL, first)
}

/// Every listening TCP socket (IPv4 and IPv6) and its owning process, for
/// telling the upstream servers' GPU use from the owner's.
///
/// # Errors
///
/// The operating system's error.
pub fn listening_tcp() -> io::Result<Vec<(std::net::SocketAddr, u32)>> {
    Ok(vacancy_win32::gpu_owners::listening_tcp()?
        .into_iter()
        .map(|l| (l.local, l.pid))
        .collect())
}

/// Every process now, as `(pid, parent pid)`; a parent PID may be stale
/// (see [`process_started`]).
///
/// # Errors
///
/// The operating system's error.
pub fn process_tree() -> io::Result<Vec<(u32, u32)>> {
    Ok(vacancy_win32::gpu_owners::processes()?
        .into_iter()
        .map(|p| (p.pid, p.parent))
        .collect())
}

/// When `pid` started (100 ns units since 1601), or `None` if it cannot be read.
pub fn process_started(pid: u32) -> Option<u64> {
    vacancy_win32::gpu_owners::started(pid)
}

/// Each `GPU Process Memory(*)\Dedicated Usage` instance and its bytes.
///
/// # Errors
///
/// The counters do not exist (before Windows 10 1709, or under Wine) or
/// cannot be read.
pub fn gpu_process_memory() -> io::Result<Vec<(String, u64)>> {
    vacancy_win32::gpu_owners::gpu_process_dedicated_memory()
}
