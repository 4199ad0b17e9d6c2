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

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::path::Path;

use crate::ledger::error::LedgerError;
use crate::platform;

/// The mode every file of the recovery directory has on Unix: the owner's
/// only. (On Windows the files inherit the directory's protected DACL.)
pub const PRIVATE_FILE_MODE: u32 = 0o600;

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
    platform::no_follow(&mut options);
    let file = options.open(path).map_err(|e| {
        if platform::link_refused(&e) {
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
///
/// On Windows: a regular file, not a reparse point ([`LedgerError::LinkedFile`]);
/// its access is the recovery directory's, whose DACL it inherits (REC-23).
pub fn check_private(file: &File, path: &Path) -> Result<(), LedgerError> {
    let meta = file
        .metadata()
        .map_err(|e| LedgerError::io("inspect", path, e))?;
    if platform::opened_link(&meta) {
        return Err(LedgerError::LinkedFile {
            path: path.to_path_buf(),
        });
    }
    if !meta.is_file() {
        return Err(LedgerError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    check_owner_and_mode(&meta, path)
}

/// REC-22 for a file: the directory's owner, mode 0600.
#[cfg(unix)]
fn check_owner_and_mode(meta: &std::fs::Metadata, path: &Path) -> Result<(), LedgerError> {
    use std::fs;
    use std::os::unix::fs::MetadataExt;
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

/// On Windows a file's access is its folder's (checked by REC-23): nothing more here.
#[cfg(windows)]
fn check_owner_and_mode(_meta: &std::fs::Metadata, _path: &Path) -> Result<(), LedgerError> {
    Ok(())
}
