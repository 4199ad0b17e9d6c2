//! The files of the recovery directory: opened as themselves, never through
//! a symbolic link, and used only when they are private to the directory's
//! owner, as the directory itself must be (REC-18, REC-22).
//!
//! A link in place of the journal, its compaction, the lock, the learned
//! contexts or the pressure calibration would send the ledger's reads and
//! writes to a file elsewhere (a dangling one would even create it); a file
//! that others can read or write shares what only the service's account
//! should see or change. Such a file stops whoever opens it, with its path
//! and the fix; vacancyd never changes an existing file's owner or mode.

use std::ffi::c_int;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::ledger::error::LedgerError;

/// The mode every file of the recovery directory has: the owner's only.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// `O_NOFOLLOW`: the open fails (`ELOOP`) when the file's name is a symbolic link.
fn no_follow() -> c_int {
    // A small constant (0o400000 on Linux); the cast cannot wrap.
    rustix::fs::OFlags::NOFOLLOW.bits() as c_int
}

/// Open `path`, a file of the recovery directory, with `options`, without
/// following a symbolic link, then check it with [`check_private`].
///
/// # Errors
///
/// [`LedgerError::NotAFile`] when `path` is there but no regular file (a
/// FIFO, a socket, a device, a directory: refused before it is opened),
/// [`LedgerError::LinkedFile`] when `path` is a symbolic link (dangling or
/// not; nothing is created where it points), the errors of
/// [`check_private`], and [`LedgerError::Io`] for the rest (`NotFound`
/// among them, for the caller to tell apart).
pub fn open_private(path: &Path, options: &OpenOptions) -> Result<File, LedgerError> {
    // Refused by type before opening: opening a FIFO to read waits for a
    // writer, so one in place of a file would hang startup (issue 30); a
    // device or socket is no file of vacancyd's either. A link is refused
    // below, by the open itself, so nothing is created where it points.
    match fs::symlink_metadata(path) {
        Ok(meta) if !meta.is_file() && !meta.file_type().is_symlink() => {
            return Err(LedgerError::NotAFile {
                path: path.to_path_buf(),
            });
        }
        _ => {}
    }
    let mut options = options.clone();
    options.custom_flags(no_follow());
    let file = options.open(path).map_err(|e| {
        if rustix::io::Errno::from_io_error(&e) == Some(rustix::io::Errno::LOOP) {
            LedgerError::LinkedFile {
                path: path.to_path_buf(),
            }
        } else {
            LedgerError::io("open", path, e)
        }
    })?;
    check_private(&file, path)?;
    Ok(file)
}

/// Read the whole of `path`, a file of the recovery directory, as
/// [`open_private`] opens it; `None` when it does not exist.
///
/// # Errors
///
/// As [`open_private`], and [`LedgerError::Io`] when reading fails.
pub fn read_private(path: &Path) -> Result<Option<Vec<u8>>, LedgerError> {
    let mut file = match open_private(path, OpenOptions::new().read(true)) {
        Ok(f) => f,
        Err(LedgerError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| LedgerError::io("read", path, e))?;
    Ok(Some(bytes))
}

/// Check an open file of the recovery directory: a regular file, owned by
/// the account that owns the directory (the account vacancyd runs as, once
/// [`check_recovery_dir`](crate::ledger::check_recovery_dir) passed), with
/// mode 0600.
///
/// # Errors
///
/// [`LedgerError::NotAFile`], [`LedgerError::FileWrongOwner`] or
/// [`LedgerError::FileWrongMode`], each naming the path and the fix.
pub fn check_private(file: &File, path: &Path) -> Result<(), LedgerError> {
    let meta = file
        .metadata()
        .map_err(|e| LedgerError::io("inspect", path, e))?;
    if !meta.is_file() {
        return Err(LedgerError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let expected = fs::metadata(dir)
        .map_err(|e| LedgerError::io("inspect the recovery directory", dir, e))?
        .uid();
    if meta.uid() != expected {
        return Err(LedgerError::FileWrongOwner {
            path: path.to_path_buf(),
            owner: meta.uid(),
            expected,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode != PRIVATE_FILE_MODE {
        return Err(LedgerError::FileWrongMode {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}
