//! The file system under the ledger, as a seam: the daemon writes through
//! [`RealDisk`]; tests and the simulation put a disk that fails a chosen
//! write (`FaultDisk`) or one that lives in memory and can crash between
//! any two writes (`MemDisk`) in its place (both under the `testkit`
//! feature).
//!
//! Every write the recovery directory sees goes through these two traits:
//! the journal's appends, cut-backs and syncs, the compaction's file,
//! rename and directory sync, and the replace-by-rename of the learned
//! contexts, the pressure calibration and hal0's slot state records
//! ([`write_atomically`]). So a test
//! can count them and fail each one in turn.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::ledger::error::LedgerError;
use crate::ledger::files;
use crate::platform;

#[cfg(any(test, feature = "testkit"))]
mod fault;
#[cfg(any(test, feature = "testkit"))]
mod mem;

#[cfg(any(test, feature = "testkit"))]
pub use fault::{DiskOp, Fault, FaultDisk, OpKind};
#[cfg(any(test, feature = "testkit"))]
pub use mem::MemDisk;

/// How many zero bytes the journal writes ahead of its end on a real disk.
///
/// A record written over bytes the file already has is made durable by
/// `fdatasync` alone; one that grows the file also needs the file system's
/// own journal to commit the new size, which on ext4 took a third longer
/// (80 µs against 117 µs on the bench machine, issue 31). 256 KiB holds
/// about a thousand records, so the one sync that grows the file is rare.
pub const JOURNAL_PREWRITE: u64 = 256 * 1024;

/// One open file of the recovery directory.
pub trait DiskFile: Send + fmt::Debug {
    /// Write all of `bytes` at the file's cursor: from its start for a new
    /// file, which is how whole files are written.
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Write all of `bytes` at `offset`, over what is there or past the end.
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()>;
    /// Cut the file to `len` bytes.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// Make the file's data durable (`fdatasync`).
    fn sync_data(&mut self) -> io::Result<()>;
    /// Make the file's data and metadata durable (`fsync`).
    fn sync_all(&mut self) -> io::Result<()>;
}

/// The directory operations the ledger and its neighbours use.
///
/// Paths are those of the recovery directory's files. A method that opens
/// or reads an existing file checks it as [`open_private`](files::open_private)
/// does; the others return the operating system's error for the caller to
/// put in context.
pub trait Disk: Send + Sync + fmt::Debug {
    /// Open `path` for reading and writing, creating it (mode 0600) when
    /// `create`; never through a symbolic link, and only when private.
    fn open_rw(&self, path: &Path, create: bool) -> Result<Box<dyn DiskFile>, LedgerError>;
    /// Create `path`, which must not exist, private (mode 0600), for writing.
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn DiskFile>>;
    /// The whole of `path`, read as [`read_private`](files::read_private)
    /// reads it; `None` when it does not exist.
    fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, LedgerError>;
    /// Whether anything exists at `path` (a link is not followed).
    fn exists(&self, path: &Path) -> io::Result<bool>;
    /// Rename `from` over `to`, atomically.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Remove `path`.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Make `dir`'s entries (created, renamed, removed files) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// How many zero bytes the journal writes ahead of its end on this disk
    /// ([`JOURNAL_PREWRITE`]; the simulation's disk in memory takes less).
    fn journal_prewrite(&self) -> u64 {
        JOURNAL_PREWRITE
    }
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealDisk;

#[derive(Debug)]
pub(crate) struct RealFile(pub(crate) File);

impl DiskFile for RealFile {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.0.write_all(bytes)
    }
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        platform::write_at(&self.0, offset, bytes)
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn sync_all(&mut self) -> io::Result<()> {
        self.0.sync_all()
    }
}

impl Disk for RealDisk {
    fn open_rw(&self, path: &Path, create: bool) -> Result<Box<dyn DiskFile>, LedgerError> {
        // Not O_APPEND: the journal writes over the zeros it wrote ahead,
        // and `pwrite` on an O_APPEND file writes at the end whatever the offset.
        let file = files::open_private(
            path,
            platform::private_file(OpenOptions::new().read(true).write(true).create(create)),
        )?;
        Ok(Box::new(RealFile(file)))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        // O_EXCL: never through a link left at the name.
        let file =
            platform::private_file(OpenOptions::new().read(true).write(true).create_new(true))
                .open(path)?;
        Ok(Box::new(RealFile(file)))
    }

    fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, LedgerError> {
        files::read_private(path)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        match fs::symlink_metadata(path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        platform::replace_file(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        platform::sync_dir(dir)
    }
}

/// Why an atomic replacement failed: the step and its error. The file at
/// the path is then unchanged (the old contents, or none), never partial.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {path}: {source}")]
pub struct AtomicWriteError {
    /// The step, e.g. `write`.
    pub action: &'static str,
    /// The file concerned (the temporary one for the first steps).
    pub path: PathBuf,
    /// The operating system's error.
    #[source]
    pub source: io::Error,
}

/// Distinguishes the temporary files of writers in one process, so two
/// threads replacing the same file never share one.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Replace `path` with `bytes` so that a crash or a failed write leaves the
/// old file or the new one, never a mix: a private temporary file beside it
/// (`.NAME.PID.N.tmp`, N counting this process's writes), written and synced,
/// renamed over `path`, then the directory synced. A failure removes the
/// temporary file. Readers see the old contents or the new, never a torn
/// write, even with writers racing on one path (the last rename wins).
///
/// # Errors
///
/// [`AtomicWriteError`] naming the step that failed. After a failed
/// directory sync the new file is in place but may not survive a crash.
pub fn write_atomically(
    disk: &dyn Disk,
    path: &Path,
    bytes: &[u8],
) -> Result<(), AtomicWriteError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let fail = |action: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| AtomicWriteError {
            action,
            path,
            source,
        }
    };
    let written = (|| {
        match disk.remove(&tmp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(fail("remove the stale", &tmp)(e));
            }
            _ => {}
        }
        let mut file = disk.create_new(&tmp).map_err(fail("create", &tmp))?;
        file.write_all(bytes).map_err(fail("write", &tmp))?;
        file.sync_all().map_err(fail("sync", &tmp))?;
        disk.rename(&tmp, path).map_err(fail("replace", path))
    })();
    if written.is_err() {
        let _ = disk.remove(&tmp);
    }
    written?;
    disk.sync_dir(&dir)
        .map_err(fail("sync the directory of", path))
}
