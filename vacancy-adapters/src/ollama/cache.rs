//! `learned-contexts.json`: learned Ollama contexts kept across restarts
//! (RES-13), a cache whose loss costs only full charges (RES-15).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};
use vacancy::ledger::{Disk, RealDisk, write_atomically};

use super::contexts::LearnedContexts;

/// The cache file's name in the admission state directory (RES-13).
pub const FILE_NAME: &str = "learned-contexts.json";

/// The file format this version writes and reads.
const VERSION: u32 = 1;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Document {
    version: u32,
    /// Per upstream name.
    upstreams: BTreeMap<String, LearnedContexts>,
}

/// Why the cache could not be written. The daemon logs it and keeps lending:
/// what was learned stays in memory until the next write succeeds.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {path}: {source}")]
pub struct CacheWriteError {
    action: &'static str,
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

/// Learned contexts of every Ollama upstream, shared by their adapters, in
/// memory and (with a directory) in `learned-contexts.json`.
///
/// # Behavior
///
/// - [`ContextCache::open`] reads the file; a missing, unreadable or
///   malformed file is logged with the reason and the daemon starts without
///   it (RES-15): it never blocks startup.
/// - Each change is written at once, atomically (a temporary file in the
///   same directory, synced, renamed over the old one, directory synced), so
///   a crash leaves the old file or the new one, never a torn one.
/// - Without a directory (a library user's in-memory adapter) nothing is written.
#[derive(Debug)]
pub struct ContextCache {
    path: Option<PathBuf>,
    doc: Mutex<Document>,
    /// Where the file is written: the ledger's disk seam, so that a test
    /// can fail each write.
    disk: Arc<dyn Disk>,
}

impl ContextCache {
    /// A cache that lives in memory only.
    pub fn in_memory() -> Self {
        ContextCache {
            path: None,
            doc: Mutex::new(Document {
                version: VERSION,
                upstreams: BTreeMap::new(),
            }),
            disk: Arc::new(RealDisk),
        }
    }

    /// The cache kept in `dir/learned-contexts.json`, loaded now.
    ///
    /// # Behavior
    ///
    /// Never fails: a file it cannot use is logged (with why) and replaced
    /// by the next write (RES-15). Like the ledger's own files it is read
    /// only as itself, never through a symbolic link, and only when private
    /// to the directory's owner (REC-18, REC-22); the next write replaces a
    /// link with a file and leaves what it pointed to alone.
    pub fn open(dir: &Path) -> Self {
        Self::open_on(Arc::new(RealDisk), dir)
    }

    /// [`ContextCache::open`] on `disk` (the ledger's disk seam: tests fail
    /// its writes, as a full or failing disk would).
    pub fn open_on(disk: Arc<dyn Disk>, dir: &Path) -> Self {
        let path = dir.join(FILE_NAME);
        let doc = match disk.read(&path) {
            Ok(Some(bytes)) => match serde_json::from_slice::<Document>(&bytes) {
                Ok(doc) if doc.version == VERSION => {
                    let mut doc = doc;
                    for contexts in doc.upstreams.values_mut() {
                        contexts.sanitize();
                    }
                    let models: usize = doc.upstreams.values().map(|c| c.models.len()).sum();
                    info!(path = %path.display(), models, "learned Ollama contexts loaded");
                    doc
                }
                Ok(doc) => {
                    warn!(path = %path.display(), version = doc.version, "learned-contexts.json has a version this vacancyd does not read; starting without learned contexts (requests are charged in full until they teach them again)");
                    Document::fresh()
                }
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "learned-contexts.json is unreadable; starting without learned contexts (requests are charged in full until they teach them again)");
                    Document::fresh()
                }
            },
            Ok(None) => {
                info!(path = %path.display(), "no learned-contexts.json yet; starting without learned contexts");
                Document::fresh()
            }
            Err(e) => {
                warn!(path = %path.display(), error = %e, "learned-contexts.json cannot be read; starting without learned contexts (requests are charged in full until they teach them again)");
                Document::fresh()
            }
        };
        ContextCache {
            path: Some(path),
            doc: Mutex::new(doc),
            disk,
        }
    }

    /// Where the cache is written, if anywhere.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Read `upstream`'s contexts.
    pub fn read<R>(&self, upstream: &str, f: impl FnOnce(&LearnedContexts) -> R) -> R {
        let doc = self.lock();
        match doc.upstreams.get(upstream) {
            Some(c) => f(c),
            None => f(&LearnedContexts::default()),
        }
    }

    /// Change `upstream`'s contexts; when `f` says it changed something
    /// (returns `true`), write the file.
    pub fn update(
        &self,
        upstream: &str,
        f: impl FnOnce(&mut LearnedContexts) -> bool,
    ) -> Result<(), CacheWriteError> {
        let mut doc = self.lock();
        let changed = f(doc.upstreams.entry(upstream.to_owned()).or_default());
        if !changed {
            return Ok(());
        }
        doc.upstreams.retain(|_, c| !c.models.is_empty());
        let Some(path) = &self.path else {
            return Ok(());
        };
        let bytes = serde_json::to_vec_pretty(&*doc).map_err(|e| CacheWriteError {
            action: "encode",
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        write_atomically(&*self.disk, path, &bytes).map_err(|e| CacheWriteError {
            action: e.action,
            path: e.path,
            source: e.source,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Document> {
        match self.doc.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

impl Document {
    fn fresh() -> Self {
        Document {
            version: VERSION,
            upstreams: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::ollama::contexts::Modelfile;
    use crate::ollama::names::{Family, RequestKind};

    fn kind() -> RequestKind {
        RequestKind {
            model: "llama3:latest".into(),
            num_ctx: None,
            family: Family::Api,
        }
    }

    #[test]
    fn learned_contexts_survive_a_reopen() {
        // RES-13
        let dir = tempfile::tempdir().unwrap();
        let cache = ContextCache::open(dir.path());
        cache
            .update("ollama", |c| {
                c.learn(&kind(), "sha256:d", 8192, Modelfile::Unset);
                true
            })
            .unwrap();
        let reopened = ContextCache::open(dir.path());
        let kinds = reopened.read("ollama", |c| c.models["llama3:latest"].kinds.clone());
        assert_eq!(kinds.len(), 1);
        assert_eq!(kinds[0].context, 8192);
        assert_eq!(reopened.read("other", |c| c.models.len()), 0);
        let text = std::fs::read_to_string(dir.path().join(FILE_NAME)).unwrap();
        assert!(text.contains("\"digest\": \"sha256:d\""), "{text}");
    }

    #[test]
    fn a_missing_or_corrupt_file_starts_empty_and_is_replaced() {
        // RES-15
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            ContextCache::open(dir.path()).read("o", |c| c.models.len()),
            0
        );
        let path = dir.path().join(FILE_NAME);
        for junk in ["{not json", "[]", r#"{"version": 99, "upstreams": {}}"#, ""] {
            std::fs::write(&path, junk).unwrap();
            let cache = ContextCache::open(dir.path());
            assert_eq!(cache.read("o", |c| c.models.len()), 0, "{junk}");
            cache
                .update("o", |c| {
                    c.learn(&kind(), "sha256:d", 4096, Modelfile::Unset);
                    true
                })
                .unwrap();
            assert_eq!(
                ContextCache::open(dir.path()).read("o", |c| c.models.len()),
                1
            );
        }
    }

    // Issue 14 item 16: learned-contexts.json that is a symbolic link is not
    // read through it, and the next write replaces the link, leaving the
    // file it pointed to alone.
    #[test]
    fn a_linked_cache_file_is_not_followed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere.json");
        let learned = ContextCache::open(dir.path());
        learned
            .update("o", |c| {
                c.learn(&kind(), "sha256:d", 4096, Modelfile::Unset);
                true
            })
            .unwrap();
        std::fs::rename(dir.path().join(FILE_NAME), &elsewhere).unwrap();
        let before = std::fs::read(&elsewhere).unwrap();
        let path = dir.path().join(FILE_NAME);
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();

        let (cache, log) = logs(|| ContextCache::open(dir.path()));
        assert_eq!(cache.read("o", |c| c.models.len()), 0);
        assert!(log.contains("symbolic link"), "{log}");
        assert!(log.contains(&path.display().to_string()), "{log}");
        cache
            .update("p", |c| {
                c.learn(&kind(), "sha256:e", 2048, Modelfile::Unset);
                true
            })
            .unwrap();
        assert_eq!(std::fs::read(&elsewhere).unwrap(), before);
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.is_file());
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600);

        // Shared with others: not read either.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (cache, log) = logs(|| ContextCache::open(dir.path()));
        assert_eq!(cache.read("p", |c| c.models.len()), 0);
        assert!(log.contains("mode 0644"), "{log}");
    }

    /// What `f` logs, at INFO and above, without colour.
    fn logs<T>(f: impl FnOnce() -> T) -> (T, String) {
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let out = tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        (out, text)
    }

    #[test]
    fn an_unchanged_update_writes_nothing_and_memory_only_never_writes() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ContextCache::open(dir.path());
        cache.update("o", |_| false).unwrap();
        assert!(!dir.path().join(FILE_NAME).exists());
        let mem = ContextCache::in_memory();
        mem.update("o", |c| {
            c.learn(&kind(), "sha256:d", 4096, Modelfile::Unset);
            true
        })
        .unwrap();
        assert_eq!(mem.read("o", |c| c.models.len()), 1);
        assert!(mem.path().is_none());
    }

    #[test]
    fn a_write_that_fails_is_an_error_and_keeps_memory() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        std::fs::create_dir(&gone).unwrap();
        let cache = ContextCache::open(&gone);
        std::fs::remove_dir(&gone).unwrap();
        let err = cache
            .update("o", |c| {
                c.learn(&kind(), "sha256:d", 4096, Modelfile::Unset);
                true
            })
            .unwrap_err();
        assert!(err.to_string().contains("learned-contexts.json"), "{err}");
        assert_eq!(cache.read("o", |c| c.models.len()), 1);
    }

    #[test]
    fn every_write_of_an_update_failed_with_enospc_and_eio_keeps_memory_and_the_old_file() {
        // Issue 18 item 3, RES-13, RES-15: each write of an update fails in
        // turn (ENOSPC 28, EIO 5; torn and whole). The update is an error
        // naming the file; what was learned stays in memory; the file holds
        // the old contexts (the new ones once the rename is done); no
        // temporary file is left; the next update writes everything.
        use vacancy::ledger::disk::{Fault, FaultDisk, OpKind};
        let learn = |cache: &ContextCache, digest: &str, upstream: &str| {
            cache.update(upstream, |c| {
                c.learn(&kind(), digest, 4096, Modelfile::Unset);
                true
            })
        };
        let count = {
            let dir = tempfile::tempdir().unwrap();
            let disk = Arc::new(FaultDisk::new(Arc::new(RealDisk)));
            let cache = ContextCache::open_on(disk.clone(), dir.path());
            learn(&cache, "sha256:a", "o").unwrap();
            disk.writes()
        };
        assert!(count >= 5, "{count} writes");
        for at in 0..count {
            for (errno, torn) in [(28, false), (28, true), (5, false), (5, true)] {
                let dir = tempfile::tempdir().unwrap();
                let disk = Arc::new(FaultDisk::new(Arc::new(RealDisk)));
                let cache = ContextCache::open_on(disk.clone(), dir.path());
                learn(&cache, "sha256:a", "o").unwrap();
                let first = disk.writes();
                disk.set_fault(Some(Fault::Once {
                    at: first + at,
                    errno,
                    torn,
                }));
                let updated = learn(&cache, "sha256:b", "p");
                let op = disk.log()[usize::try_from(first + at).unwrap()].clone();
                assert_eq!(cache.read("p", |c| c.models.len()), 1, "memory keeps it");
                let on_disk = ContextCache::open(dir.path());
                match updated {
                    Ok(()) => assert_eq!(op.kind, OpKind::Remove, "{op:?}"),
                    Err(e) => {
                        assert!(e.to_string().contains(FILE_NAME), "{e}");
                        let p = on_disk.read("p", |c| c.models.len());
                        let expected = usize::from(op.kind == OpKind::SyncDir);
                        assert_eq!(p, expected, "{op:?}: {e}");
                    }
                }
                assert_eq!(on_disk.read("o", |c| c.models.len()), 1, "{op:?}");
                let names: Vec<_> = std::fs::read_dir(dir.path())
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .collect();
                assert_eq!(names, [FILE_NAME], "after {op:?}");
                learn(&cache, "sha256:c", "q").unwrap();
                let back = ContextCache::open(dir.path());
                for u in ["o", "p", "q"] {
                    assert_eq!(back.read(u, |c| c.models.len()), 1, "{u} after {op:?}");
                }
            }
        }
    }
}
