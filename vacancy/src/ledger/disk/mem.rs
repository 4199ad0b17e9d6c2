//! A disk in memory that can crash between any two writes, for the
//! simulation: what survives is what a real disk could keep.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Disk, DiskFile};
use crate::ledger::error::LedgerError;

/// EIO: what every call gets once the simulated machine crashed.
const EIO: i32 = 5;
/// ENOENT.
const ENOENT: i32 = 2;
/// EEXIST.
const EEXIST: i32 = 17;
/// EFBIG.
const EFBIG: i32 = 27;
/// The zeros the journal writes ahead here: small, so that a simulation
/// grows the file often, and each sync's copy of it stays cheap.
const MEM_JOURNAL_PREWRITE: u64 = 1024;

#[derive(Debug, Default, Clone)]
struct Inode {
    /// What reads see.
    data: Vec<u8>,
    /// What survives a crash for certain: the data at the last sync.
    durable: Vec<u8>,
}

/// A change to the directory not yet made durable by a directory sync.
#[derive(Debug, Clone)]
enum DirOp {
    Link(PathBuf, u64),
    Unlink(PathBuf),
    Rename(PathBuf, PathBuf),
}

#[derive(Debug, Default)]
struct State {
    names: BTreeMap<PathBuf, u64>,
    /// The names as of the last directory sync.
    durable_names: BTreeMap<PathBuf, u64>,
    /// Directory changes since then, in order.
    pending: Vec<DirOp>,
    inodes: BTreeMap<u64, Inode>,
    next_inode: u64,
    ops: u64,
    crash_at: Option<u64>,
}

impl State {
    /// Count one call; once the crash point is reached every call fails.
    fn op(&mut self) -> io::Result<()> {
        let index = self.ops;
        self.ops += 1;
        if self.crash_at.is_some_and(|at| index >= at) {
            return Err(io::Error::from_raw_os_error(EIO));
        }
        Ok(())
    }

    fn inode(&mut self, ino: u64) -> &mut Inode {
        self.inodes.entry(ino).or_default()
    }
}

fn apply(names: &mut BTreeMap<PathBuf, u64>, op: &DirOp) {
    match op {
        DirOp::Link(p, ino) => {
            names.insert(p.clone(), *ino);
        }
        DirOp::Unlink(p) => {
            names.remove(p);
        }
        DirOp::Rename(from, to) => {
            if let Some(ino) = names.remove(from) {
                names.insert(to.clone(), ino);
            }
        }
    }
}

/// A file system in memory with a crash model: data is durable once its
/// file is synced, directory changes once the directory is synced, and a
/// crash keeps what is durable plus any prefix of what is not (a torn
/// append, some of the directory changes in their order). Clones share one
/// disk.
#[derive(Debug, Clone, Default)]
pub struct MemDisk {
    state: Arc<Mutex<State>>,
}

impl MemDisk {
    /// An empty disk.
    pub fn new() -> Self {
        MemDisk::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Calls made so far (reads included).
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// Crash when call number `at` is made: it and every later call fail
    /// with EIO, as if the machine had stopped (`None`: never).
    pub fn set_crash_at(&self, at: Option<u64>) {
        self.lock().crash_at = at;
    }

    /// Whether the crash point was reached.
    pub fn crashed(&self) -> bool {
        let s = self.lock();
        s.crash_at.is_some_and(|at| s.ops > at)
    }

    /// The disk as the machine finds it after a crash now: durable data,
    /// plus prefixes of what was not synced, chosen by `pick(n)` (a number
    /// below `n`, from the simulation's seeded generator).
    pub fn crash_image(&self, pick: &mut dyn FnMut(u64) -> u64) -> MemDisk {
        let s = self.lock();
        let mut names = s.durable_names.clone();
        let kept = pick(s.pending.len() as u64 + 1) as usize;
        for op in &s.pending[..kept] {
            apply(&mut names, op);
        }
        let mut inodes = BTreeMap::new();
        for ino in names.values() {
            let Some(node) = s.inodes.get(ino) else {
                continue;
            };
            let survived = survivor(node, pick);
            inodes.insert(
                *ino,
                Inode {
                    data: survived.clone(),
                    durable: survived,
                },
            );
        }
        MemDisk {
            state: Arc::new(Mutex::new(State {
                durable_names: names.clone(),
                names,
                pending: Vec::new(),
                inodes,
                next_inode: s.next_inode,
                ops: 0,
                crash_at: None,
            })),
        }
    }

    /// The current contents of `path`, for checks.
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        let s = self.lock();
        let ino = s.names.get(path)?;
        s.inodes.get(ino).map(|n| n.data.clone())
    }

    /// Every file's name.
    pub fn names(&self) -> Vec<PathBuf> {
        self.lock().names.keys().cloned().collect()
    }

    fn link_new(&self, path: &Path, exclusive: bool) -> io::Result<u64> {
        let mut s = self.lock();
        s.op()?;
        if let Some(&ino) = s.names.get(path) {
            if exclusive {
                return Err(io::Error::from_raw_os_error(EEXIST));
            }
            return Ok(ino);
        }
        let ino = s.next_inode;
        s.next_inode += 1;
        s.inodes.insert(ino, Inode::default());
        s.names.insert(path.to_owned(), ino);
        s.pending.push(DirOp::Link(path.to_owned(), ino));
        Ok(ino)
    }
}

/// What of one file survives a crash.
fn survivor(node: &Inode, pick: &mut dyn FnMut(u64) -> u64) -> Vec<u8> {
    let common = node
        .data
        .iter()
        .zip(&node.durable)
        .take_while(|(a, b)| a == b)
        .count();
    if node.data.len() >= node.durable.len() {
        // Written over (the journal's zeros written ahead) or appended to
        // since the last sync: any prefix of the new bytes, over the old.
        let kept = common + pick((node.data.len() - common) as u64 + 1) as usize;
        let mut survived = node.data[..kept].to_vec();
        survived.extend_from_slice(node.durable.get(kept..).unwrap_or_default());
        return survived;
    }
    // Cut back (and maybe appended to) since: the old state, or a prefix
    // of the new one past what both share.
    if pick(2) == 0 {
        return node.durable.clone();
    }
    let extra = pick((node.data.len() - common) as u64 + 1) as usize;
    node.data[..common + extra].to_vec()
}

#[derive(Debug)]
struct MemFile {
    disk: MemDisk,
    ino: u64,
}

impl DiskFile for MemFile {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        // Whole files are written once, from their start: the cursor is the end.
        let mut s = self.disk.lock();
        s.op()?;
        s.inode(self.ino).data.extend_from_slice(bytes);
        Ok(())
    }
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let mut s = self.disk.lock();
        s.op()?;
        let data = &mut s.inode(self.ino).data;
        let start = usize::try_from(offset).map_err(|_| io::Error::from_raw_os_error(EFBIG))?;
        let end = start + bytes.len();
        if data.len() < end {
            data.resize(end, 0);
        }
        data[start..end].copy_from_slice(bytes);
        Ok(())
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let mut s = self.disk.lock();
        s.op()?;
        let data = &mut s.inode(self.ino).data;
        data.resize(usize::try_from(len).unwrap_or(usize::MAX), 0);
        Ok(())
    }
    fn sync_data(&mut self) -> io::Result<()> {
        let mut s = self.disk.lock();
        s.op()?;
        let node = s.inode(self.ino);
        node.durable = node.data.clone();
        Ok(())
    }
    fn sync_all(&mut self) -> io::Result<()> {
        self.sync_data()
    }
}

impl Disk for MemDisk {
    fn open_rw(&self, path: &Path, create: bool) -> Result<Box<dyn DiskFile>, LedgerError> {
        let opened = if create {
            self.link_new(path, false)
        } else {
            let mut s = self.lock();
            s.op().and_then(|()| {
                s.names
                    .get(path)
                    .copied()
                    .ok_or_else(|| io::Error::from_raw_os_error(ENOENT))
            })
        };
        let ino = opened.map_err(|e| LedgerError::io("open", path, e))?;
        Ok(Box::new(MemFile {
            disk: self.clone(),
            ino,
        }))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        let ino = self.link_new(path, true)?;
        Ok(Box::new(MemFile {
            disk: self.clone(),
            ino,
        }))
    }

    fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, LedgerError> {
        let mut s = self.lock();
        s.op().map_err(|e| LedgerError::io("read", path, e))?;
        let Some(&ino) = s.names.get(path) else {
            return Ok(None);
        };
        Ok(Some(s.inode(ino).data.clone()))
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        let mut s = self.lock();
        s.op()?;
        Ok(s.names.contains_key(path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.op()?;
        let ino = s
            .names
            .remove(from)
            .ok_or_else(|| io::Error::from_raw_os_error(ENOENT))?;
        s.names.insert(to.to_owned(), ino);
        s.pending
            .push(DirOp::Rename(from.to_owned(), to.to_owned()));
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.op()?;
        s.names
            .remove(path)
            .ok_or_else(|| io::Error::from_raw_os_error(ENOENT))?;
        s.pending.push(DirOp::Unlink(path.to_owned()));
        Ok(())
    }

    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.op()?;
        let pending = std::mem::take(&mut s.pending);
        for op in &pending {
            apply(&mut s.durable_names, op);
        }
        Ok(())
    }

    fn journal_prewrite(&self) -> u64 {
        MEM_JOURNAL_PREWRITE
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_crash_keeps_a_prefix_of_what_was_written_over_synced_zeros() {
        // The journal's zeros written ahead (issue 31): a crash before the
        // sync keeps the old bytes past whatever prefix of the new ones
        // reached the disk; the file never shrinks.
        let disk = MemDisk::new();
        let path = Path::new("/mem/f");
        let mut f = disk.open_rw(path, true).unwrap();
        f.write_at(0, b"abc\n\0\0\0\0\0\0").unwrap();
        f.sync_data().unwrap();
        disk.sync_dir(Path::new("/mem")).unwrap();
        f.write_at(4, b"de\n").unwrap();
        for kept in 0..=3u64 {
            let image = disk.crash_image(&mut |n| kept.min(n - 1));
            let mut expected = b"abc\n".to_vec();
            expected.extend_from_slice(&b"de\n"[..kept as usize]);
            expected.resize(10, 0);
            assert_eq!(image.contents(path).unwrap(), expected, "kept {kept}");
        }
    }
}
