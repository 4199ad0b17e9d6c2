//! How a sampler reads its small files: on the calling thread where the
//! filesystem answers from memory or a local disk, else on tokio's blocking
//! pool.
//!
//! # Why
//!
//! A post-job sample runs where the job ended, on a proxy worker, and the
//! borrower's next request may wait for it (ADM-06). Through the blocking
//! pool, each read of a 40-byte capacity file crossed to another thread and
//! back (a futex wake of 11-13 µs on the 2-core test VM, then the wake back),
//! while the read itself (open, read, close of a cached page) takes a few
//! microseconds: sequential admitted POSTs waited about 25 µs for the sample
//! on nine in ten requests, and with the read on the worker none waits
//! (`scripts/bench-proxy`'s phases, issue 31). Where a read can wait on a network or a user-space server
//! (NFS, SMB, FUSE) or the filesystem is not known, it stays on the pool,
//! where the sample's timeout still bounds it, and so does a file that is
//! not a regular one (a FIFO or a device can make a read wait for a writer).

use std::fs::OpenOptions;
use std::io::{self, Read};
use std::path::Path;

/// Where a sampler's file reads run, decided once for its directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileReads {
    /// On the calling thread: a local filesystem
    /// ([`local_filesystem`](crate::platform::local_filesystem)).
    Inline,
    /// On tokio's blocking pool.
    BlockingPool,
}

impl FileReads {
    /// The reads of files in `dir`.
    pub(crate) fn in_dir(dir: &Path) -> Self {
        if crate::platform::local_filesystem(dir) {
            FileReads::Inline
        } else {
            FileReads::BlockingPool
        }
    }

    /// The reads of `file` and of the files beside it.
    pub(crate) fn beside(file: &Path) -> Self {
        match file.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => Self::in_dir(dir),
            _ => Self::in_dir(Path::new(".")),
        }
    }

    /// The whole of `path`.
    pub(crate) async fn read(self, path: &Path) -> io::Result<Vec<u8>> {
        if self == FileReads::Inline
            && let Some(bytes) = read_regular_file(path)?
        {
            return Ok(bytes);
        }
        tokio::fs::read(path).await
    }

    /// The whole of `path`, as UTF-8 text.
    pub(crate) async fn read_to_string(self, path: &Path) -> io::Result<String> {
        let bytes = self.read(path).await?;
        String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

/// The whole of `path` on the calling thread when it is a regular file;
/// `None` for anything else, which is read on the blocking pool.
fn read_regular_file(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let mut options = OpenOptions::new();
    options.read(true);
    let mut file = crate::platform::open_without_waiting(&mut options).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(None);
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0).saturating_add(1));
    file.read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn files_on_memory_and_local_disk_filesystems_are_read_inline() {
        assert_eq!(FileReads::in_dir(Path::new("/proc")), FileReads::Inline);
        assert_eq!(FileReads::in_dir(Path::new("/sys")), FileReads::Inline);
        assert_eq!(
            FileReads::beside(Path::new("/proc/meminfo")),
            FileReads::Inline
        );
    }

    #[test]
    fn a_directory_that_cannot_be_asked_reads_on_the_blocking_pool() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("not-there");
        assert_eq!(FileReads::in_dir(&missing), FileReads::BlockingPool);
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_is_read_on_the_blocking_pool_not_the_calling_thread() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("gpu.json");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        assert_eq!(FileReads::beside(&fifo), FileReads::Inline);
        let (free, freed) = std::sync::mpsc::channel();
        let reader = std::thread::spawn({
            let fifo = fifo.clone();
            move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    let read = tokio::spawn(async move { FileReads::Inline.read(&fifo).await });
                    // The read starts here; read on this thread, it would
                    // wait for a writer and never let this line run.
                    tokio::task::yield_now().await;
                    free.send(()).unwrap();
                    read.await.unwrap()
                })
            }
        });
        let was_free = freed.recv_timeout(std::time::Duration::from_secs(5));
        // Either way the writer ends the read, so the thread ends.
        std::fs::write(&fifo, b"{}").unwrap();
        let read = reader.join().unwrap().unwrap();
        assert!(was_free.is_ok(), "the FIFO was read on the calling thread");
        assert_eq!(read, b"{}");
    }

    #[tokio::test]
    async fn both_ways_read_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("gpu.json");
        std::fs::write(&file, "{\"free_mib\": 1}").unwrap();
        for reads in [FileReads::Inline, FileReads::BlockingPool] {
            assert_eq!(reads.read(&file).await.unwrap(), b"{\"free_mib\": 1}");
            assert_eq!(
                reads.read_to_string(&file).await.unwrap(),
                "{\"free_mib\": 1}"
            );
            assert!(reads.read(&dir.path().join("gone")).await.is_err());
        }
    }
}
