//! A disk that fails a chosen write: SQLite's I/O-error test, for the ledger.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Disk, DiskFile};
use crate::ledger::error::LedgerError;

/// Which write a [`DiskOp`] was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// An open that may create the file (`open_rw` with `create`).
    OpenCreate,
    /// `create_new`.
    CreateNew,
    /// A write (at the cursor or at an offset).
    Write,
    /// A cut-back.
    SetLen,
    /// `fdatasync`.
    SyncData,
    /// `fsync`.
    SyncAll,
    /// A rename.
    Rename,
    /// A removal.
    Remove,
    /// A directory sync.
    SyncDir,
}

/// One write as the disk saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskOp {
    /// Its place among the disk's writes, from 0.
    pub index: u64,
    /// What it was.
    pub kind: OpKind,
    /// The file it touched (the source of a rename).
    pub path: PathBuf,
    /// The error it was failed with, if it was.
    pub failed: Option<i32>,
}

/// Which writes fail, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Write number `at` fails with `errno`; a torn append writes half its
    /// bytes first, as a short write on a full disk does.
    Once {
        /// The write's index.
        at: u64,
        /// The error, e.g. `libc`'s ENOSPC (28) or EIO (5).
        errno: i32,
        /// Whether an append writes half its bytes before failing.
        torn: bool,
    },
    /// Every write from number `at` on fails with `errno` (a full disk),
    /// until the fault is cleared.
    From {
        /// The first failing write's index.
        at: u64,
        /// The error.
        errno: i32,
    },
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    fault: Option<Fault>,
    log: Vec<DiskOp>,
    /// Whether `log` is kept (a long simulation does without).
    logging: bool,
}

impl State {
    /// Count one write; `Some((errno, torn))` when it is to fail.
    fn op(&mut self, kind: OpKind, path: &Path) -> Option<(i32, bool)> {
        let index = self.next;
        self.next += 1;
        let failed = match self.fault {
            Some(Fault::Once { at, errno, torn }) if at == index => Some((errno, torn)),
            Some(Fault::From { at, errno }) if index >= at => Some((errno, false)),
            _ => None,
        };
        if !self.logging {
            return failed;
        }
        self.log.push(DiskOp {
            index,
            kind,
            path: path.to_owned(),
            failed: failed.map(|(e, _)| e),
        });
        failed
    }
}

/// A disk that passes every call to another one, counts the writes, and
/// fails the ones its [`Fault`] names. Clones share the count and the fault.
#[derive(Debug, Clone)]
pub struct FaultDisk {
    inner: Arc<dyn Disk>,
    state: Arc<Mutex<State>>,
}

impl FaultDisk {
    /// Around `inner`, failing nothing yet.
    pub fn new(inner: Arc<dyn Disk>) -> Self {
        let disk = Self::unlogged(inner);
        disk.lock().logging = true;
        disk
    }

    /// As [`new`](Self::new), keeping no [`log`](Self::log): for runs with
    /// millions of writes.
    pub fn unlogged(inner: Arc<dyn Disk>) -> Self {
        FaultDisk {
            inner,
            state: Arc::default(),
        }
    }

    /// Fail the writes `fault` names from now on (`None`: none).
    pub fn set_fault(&self, fault: Option<Fault>) {
        self.lock().fault = fault;
    }

    /// Writes counted so far.
    pub fn writes(&self) -> u64 {
        self.lock().next
    }

    /// Every write so far, in order.
    pub fn log(&self) -> Vec<DiskOp> {
        self.lock().log.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    fn check(&self, kind: OpKind, path: &Path) -> io::Result<()> {
        match self.lock().op(kind, path) {
            Some((errno, _)) => Err(io::Error::from_raw_os_error(errno)),
            None => Ok(()),
        }
    }
}

#[derive(Debug)]
struct FaultFile {
    inner: Box<dyn DiskFile>,
    path: PathBuf,
    disk: FaultDisk,
}

impl DiskFile for FaultFile {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        let failed = self.disk.lock().op(OpKind::Write, &self.path);
        match failed {
            Some((errno, torn)) => {
                if torn {
                    self.inner.write_all(&bytes[..bytes.len() / 2])?;
                }
                Err(io::Error::from_raw_os_error(errno))
            }
            None => self.inner.write_all(bytes),
        }
    }
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let failed = self.disk.lock().op(OpKind::Write, &self.path);
        match failed {
            Some((errno, torn)) => {
                if torn {
                    self.inner.write_at(offset, &bytes[..bytes.len() / 2])?;
                }
                Err(io::Error::from_raw_os_error(errno))
            }
            None => self.inner.write_at(offset, bytes),
        }
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.disk.check(OpKind::SetLen, &self.path)?;
        self.inner.set_len(len)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        self.disk.check(OpKind::SyncData, &self.path)?;
        self.inner.sync_data()
    }
    fn sync_all(&mut self) -> io::Result<()> {
        self.disk.check(OpKind::SyncAll, &self.path)?;
        self.inner.sync_all()
    }
}

impl Disk for FaultDisk {
    fn open_rw(&self, path: &Path, create: bool) -> Result<Box<dyn DiskFile>, LedgerError> {
        if create {
            self.check(OpKind::OpenCreate, path)
                .map_err(|e| LedgerError::io("open", path, e))?;
        }
        let inner = self.inner.open_rw(path, create)?;
        Ok(Box::new(FaultFile {
            inner,
            path: path.to_owned(),
            disk: self.clone(),
        }))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        self.check(OpKind::CreateNew, path)?;
        let inner = self.inner.create_new(path)?;
        Ok(Box::new(FaultFile {
            inner,
            path: path.to_owned(),
            disk: self.clone(),
        }))
    }

    fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, LedgerError> {
        self.inner.read(path)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        self.inner.exists(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.check(OpKind::Rename, from)?;
        self.inner.rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.check(OpKind::Remove, path)?;
        self.inner.remove(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.check(OpKind::SyncDir, dir)?;
        self.inner.sync_dir(dir)
    }

    fn journal_prewrite(&self) -> u64 {
        self.inner.journal_prewrite()
    }
}
