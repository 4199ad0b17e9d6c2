//! A sampler that reads a JSON capacity file written by an exporter.
//!
//! The file sampler lets anything that can write a file report capacity
//! (a vendor tool without a native sampler, a remote exporter, a test).

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use serde::Deserialize;

use super::file_reads::FileReads;
use crate::time::MonotonicClock;
use crate::traits::resource::{CapacitySample, Resource, ResourceKind, SampleError};

/// The file's contents. Both fields are required; other fields are ignored so
/// exporters may add their own (a timestamp, a device name).
#[derive(Deserialize)]
struct Reading {
    free_mib: u64,
    total_mib: u64,
}

/// Parse the file's bytes, or say what is wrong with them.
fn parse(bytes: &[u8]) -> Result<Reading, String> {
    const EXPECTED: &str = r#"expected {"free_mib":N,"total_mib":N}"#;
    // Through `Value` so only an object is accepted: a derived `Deserialize`
    // would also take the array `[free, total]`.
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("{EXPECTED}: {e}"))?;
    if !value.is_object() {
        return Err(format!("{EXPECTED}, found {value}"));
    }
    Reading::deserialize(value).map_err(|e| format!("{EXPECTED}: {e}"))
}

/// Capacity read from a JSON file `{"free_mib":N,"total_mib":N}` (`sampler = "file"`).
///
/// # Behavior
///
/// - The file is read on every sample, and the sample is stamped with the
///   moment the read started: the file's age is the exporter's business.
/// - Both fields must be non-negative integers, `total_mib > 0` and
///   `free_mib <= total_mib`; anything else is [`SampleError::Malformed`].
/// - Exporters should replace the file atomically (write a temporary file,
///   then rename it): a torn read is reported as malformed, never guessed at.
/// - On a local filesystem the file is read on the calling thread, elsewhere
///   on tokio's blocking pool (decided once, when the sampler is made; see
///   `file_reads`).
#[derive(Debug)]
pub struct FileSampler {
    name: String,
    kind: ResourceKind,
    path: PathBuf,
    reads: FileReads,
    clock: MonotonicClock,
}

impl FileSampler {
    /// A file sampler for the resource `name` of `kind`, reading `path`.
    ///
    /// # Errors
    ///
    /// [`SampleError::Unavailable`] for `kind` [`ResourceKind::Cpu`]: the file
    /// carries memory figures only, so it cannot say how busy a CPU is.
    pub fn new(
        name: impl Into<String>,
        kind: ResourceKind,
        path: impl Into<PathBuf>,
        clock: MonotonicClock,
    ) -> Result<Self, SampleError> {
        let name = name.into();
        if kind == ResourceKind::Cpu {
            return Err(SampleError::Unavailable(format!(
                "resource {name}: the file sampler reports memory only, not CPU load; \
                 use kind = \"gpu\" or \"memory\", or sampler = \"system\" for a CPU"
            )));
        }
        let path = path.into();
        Ok(FileSampler {
            name,
            kind,
            reads: FileReads::beside(&path),
            path,
            clock,
        })
    }

    /// The file this sampler reads.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn malformed(&self, reason: String) -> SampleError {
        SampleError::Malformed {
            source_name: self.path.display().to_string(),
            reason,
        }
    }
}

#[async_trait]
impl Resource for FileSampler {
    fn id(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> ResourceKind {
        self.kind
    }

    async fn sample(&self) -> Result<CapacitySample, SampleError> {
        let taken_at = self.clock.now();
        let bytes = self
            .reads
            .read(&self.path)
            .await
            .map_err(|e| SampleError::Unreadable {
                source_name: self.path.display().to_string(),
                reason: e.to_string(),
            })?;
        let reading = parse(&bytes).map_err(|reason| self.malformed(reason))?;
        if reading.total_mib == 0 {
            return Err(self.malformed("total_mib is 0".to_string()));
        }
        if reading.free_mib > reading.total_mib {
            return Err(self.malformed(format!(
                "free_mib ({}) exceeds total_mib ({})",
                reading.free_mib, reading.total_mib
            )));
        }
        Ok(CapacitySample::memory(
            reading.free_mib,
            reading.total_mib,
            taken_at,
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sampler(dir: &tempfile::TempDir, contents: Option<&str>) -> (FileSampler, MonotonicClock) {
        let path = dir.path().join("capacity.json");
        if let Some(contents) = contents {
            std::fs::write(&path, contents).unwrap();
        }
        let clock = MonotonicClock::new();
        (
            FileSampler::new("gpu0", ResourceKind::Gpu, path, clock).unwrap(),
            clock,
        )
    }

    async fn malformed_reason(contents: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let (file, _) = sampler(&dir, Some(contents));
        match file.sample().await {
            Err(e @ SampleError::Malformed { .. }) => {
                let message = e.to_string();
                assert!(message.contains("capacity.json"), "{message}");
                message
            }
            other => panic!("{contents:?} should be malformed, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn reads_a_good_file() {
        let dir = tempfile::tempdir().unwrap();
        let (file, clock) = sampler(
            &dir,
            Some(r#"{"free_mib": 1000, "total_mib": 24576, "exporter": "x"}"#),
        );
        assert_eq!(file.id(), "gpu0");
        assert_eq!(file.kind(), ResourceKind::Gpu);

        let before = clock.now();
        let sample = file.sample().await.unwrap();
        let after = clock.now();
        assert_eq!(
            (sample.free_mib, sample.total_mib, sample.busy_pct),
            (1000, 24576, None)
        );
        assert!(before <= sample.taken_at && sample.taken_at <= after);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn memory_kind_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ram.json");
        let file =
            FileSampler::new("ram", ResourceKind::Memory, &path, MonotonicClock::new()).unwrap();
        assert_eq!(file.kind(), ResourceKind::Memory);
        assert_eq!(file.path(), path);
    }

    #[test]
    fn cpu_kind_is_refused() {
        let err = FileSampler::new("cpu", ResourceKind::Cpu, "/x.json", MonotonicClock::new())
            .unwrap_err();
        assert!(matches!(err, SampleError::Unavailable(_)), "{err:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn missing_file_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let (file, _) = sampler(&dir, None);
        let err = file.sample().await.unwrap_err();
        assert!(matches!(err, SampleError::Unreadable { .. }), "{err:?}");
        assert!(
            err.to_string().contains(&file.path().display().to_string()),
            "{err}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn malformed_json_is_an_error() {
        malformed_reason("").await;
        malformed_reason("{\"free_mib\": 1, \"total_mib\": ").await;
        malformed_reason("not json").await;
        malformed_reason("[1, 2]").await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn missing_field_is_an_error() {
        let message = malformed_reason(r#"{"free_mib": 1}"#).await;
        assert!(message.contains("total_mib"), "{message}");
        malformed_reason(r#"{"total_mib": 1}"#).await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn negative_or_fractional_numbers_are_errors() {
        malformed_reason(r#"{"free_mib": -1, "total_mib": 100}"#).await;
        malformed_reason(r#"{"free_mib": 1.5, "total_mib": 100}"#).await;
        malformed_reason(r#"{"free_mib": 1, "total_mib": 100.0}"#).await;
        malformed_reason(r#"{"free_mib": "1", "total_mib": 100}"#).await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn free_above_total_is_an_error() {
        let message = malformed_reason(r#"{"free_mib": 101, "total_mib": 100}"#).await;
        assert!(message.contains("exceeds"), "{message}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn zero_total_is_an_error() {
        malformed_reason(r#"{"free_mib": 0, "total_mib": 0}"#).await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn rewriting_the_file_changes_the_next_sample() {
        let dir = tempfile::tempdir().unwrap();
        let (file, _) = sampler(&dir, Some(r#"{"free_mib": 100, "total_mib": 1000}"#));
        let first = file.sample().await.unwrap();
        assert_eq!(first.free_mib, 100);

        // The way exporters should do it: write beside, then rename over.
        let tmp = dir.path().join("capacity.json.tmp");
        std::fs::write(&tmp, r#"{"free_mib": 900, "total_mib": 1000}"#).unwrap();
        std::fs::rename(&tmp, file.path()).unwrap();
        let second = file.sample().await.unwrap();
        assert_eq!(second.free_mib, 900);
        assert!(second.taken_at >= first.taken_at);

        std::fs::write(file.path(), r#"{"free_mib": 5, "total_mib": 1000}"#).unwrap();
        assert_eq!(file.sample().await.unwrap().free_mib, 5);
    }
}
