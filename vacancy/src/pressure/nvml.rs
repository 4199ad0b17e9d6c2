//! The owner's load on an NVIDIA GPU through NVML process attribution (cargo feature `nvml`).
//!
//! Without the feature the type still exists, but [`NvmlPressureReader::new`]
//! fails, saying how to rebuild.

use async_trait::async_trait;

use crate::pressure::reader::{PressureError, PressureReader};
use crate::pressure::tracker::OwnerLoad;

/// The owner's load on an NVIDIA GPU, from NVML's per-process accounting.
///
/// # Behavior
///
/// - Memory: the sum of `used_gpu_memory` of the GPU's running compute and
///   graphics processes whose PIDs are not excluded (a process in both lists
///   counts once; a process whose memory NVML does not report counts 0).
/// - Utilization: the SM utilization of each non-excluded process, averaged
///   over NVML's samples since the previous read, summed and clamped to 100.
/// - Where the GPU or driver does not report per-process utilization, the
///   whole device's utilization is used if none of the excluded processes
///   is running on the GPU (then all of it is the owner's); otherwise the
///   owner's share cannot be told and the read fails with
///   [`PressureError::Unattributable`], which makes the reading unavailable.
/// - NVML calls run on a blocking thread.
#[derive(Debug)]
pub struct NvmlPressureReader {
    name: String,
    inner: Inner,
}

#[cfg(not(feature = "nvml"))]
type Inner = std::convert::Infallible;

#[cfg(feature = "nvml")]
use enabled::Inner;

#[cfg(not(feature = "nvml"))]
impl NvmlPressureReader {
    /// Always fails: this build has no NVML support.
    ///
    /// # Errors
    ///
    /// Always [`PressureError::Unavailable`], saying to rebuild with `--features nvml`.
    pub fn new(name: impl Into<String>, device: &str) -> Result<Self, PressureError> {
        let _ = device;
        Err(PressureError::Unavailable {
            gpu: name.into(),
            reason: "vacancyd was built without NVML support; rebuild with --features nvml"
                .to_owned(),
        })
    }
}

#[cfg(not(feature = "nvml"))]
#[async_trait]
impl PressureReader for NvmlPressureReader {
    fn name(&self) -> &str {
        &self.name
    }

    async fn read(&self, _exclude_pids: &[u32]) -> Result<OwnerLoad, PressureError> {
        // `Inner` is uninhabited here: no reader exists without the feature.
        match self.inner {}
    }
}

#[cfg(feature = "nvml")]
mod enabled {
    use std::collections::{BTreeMap, HashSet};
    use std::sync::{Arc, Mutex, PoisonError};

    use nvml_wrapper::Nvml;
    use nvml_wrapper::enums::device::UsedGpuMemory;
    use nvml_wrapper::error::NvmlError;

    use super::*;

    /// The NVML handle, the device, and where the last utilization read ended.
    pub(super) struct Inner {
        nvml: Arc<Nvml>,
        device: String,
        /// NVML's timestamp of the newest utilization sample seen (µs).
        last_seen: Arc<Mutex<Option<u64>>>,
    }

    impl std::fmt::Debug for Inner {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Inner")
                .field("device", &self.device)
                .finish_non_exhaustive()
        }
    }

    /// Why a read failed, before the GPU's name is added.
    enum Failure {
        Nvml(NvmlError),
        Unattributable(String),
    }

    impl From<NvmlError> for Failure {
        fn from(e: NvmlError) -> Self {
            Failure::Nvml(e)
        }
    }

    /// One read: `(load, newest utilization timestamp)`.
    fn read(
        nvml: &Nvml,
        device: &str,
        exclude: &HashSet<u32>,
        last_seen: Option<u64>,
    ) -> Result<(OwnerLoad, Option<u64>), Failure> {
        let device = match device.parse::<u32>() {
            Ok(index) => nvml.device_by_index(index)?,
            Err(_) => nvml.device_by_pci_bus_id(device)?,
        };
        let mut memory: BTreeMap<u32, u64> = BTreeMap::new();
        let mut excluded_running = false;
        for p in device
            .running_compute_processes()?
            .into_iter()
            .chain(device.running_graphics_processes()?)
        {
            if exclude.contains(&p.pid) {
                excluded_running = true;
                continue;
            }
            let used = match p.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => bytes,
                UsedGpuMemory::Unavailable => 0,
            };
            memory.insert(p.pid, used);
        }
        let memory_mib = memory.values().sum::<u64>() / (1024 * 1024);
        let (util, newest) = match device.process_utilization_stats(last_seen) {
            Ok(samples) => {
                let newest = samples.iter().map(|s| s.timestamp).max().or(last_seen);
                // pid -> (sum of SM %, sample count)
                let mut per_pid: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
                for s in samples.iter().filter(|s| !exclude.contains(&s.pid)) {
                    let e = per_pid.entry(s.pid).or_default();
                    e.0 += u64::from(s.sm_util);
                    e.1 += 1;
                }
                let util: u64 = per_pid.values().map(|(sum, n)| sum / (*n).max(1)).sum();
                (util, newest)
            }
            // No process had a sample since the last read: nothing ran.
            Err(NvmlError::NotFound) => (0, last_seen),
            Err(NvmlError::NotSupported) if !excluded_running => {
                (u64::from(device.utilization_rates()?.gpu), last_seen)
            }
            Err(NvmlError::NotSupported) => {
                return Err(Failure::Unattributable(
                    "this GPU or driver has no per-process utilization, and a lent upstream server is running on it".to_owned(),
                ));
            }
            Err(e) => return Err(e.into()),
        };
        let util_pct = u8::try_from(util.min(100)).unwrap_or(100);
        Ok((
            OwnerLoad {
                util_pct,
                memory_mib,
            },
            newest,
        ))
    }

    impl NvmlPressureReader {
        /// A reader for the GPU resource `name` on `device` (an index such as
        /// `"0"` or a PCI bus id).
        ///
        /// # Errors
        ///
        /// [`PressureError::Unavailable`] when the driver library cannot be
        /// loaded, NVML cannot start, or the device cannot be read.
        pub fn new(name: impl Into<String>, device: &str) -> Result<Self, PressureError> {
            let name = name.into();
            let unavailable = |reason: String| PressureError::Unavailable {
                gpu: name.clone(),
                reason,
            };
            let nvml = Nvml::init().map_err(|e| {
                unavailable(format!(
                    "the NVIDIA driver library (libnvidia-ml) could not start: {e}"
                ))
            })?;
            match read(&nvml, device, &HashSet::new(), None) {
                Ok((_, newest)) => Ok(NvmlPressureReader {
                    name: name.clone(),
                    inner: Inner {
                        nvml: Arc::new(nvml),
                        device: device.to_owned(),
                        last_seen: Arc::new(Mutex::new(newest)),
                    },
                }),
                Err(Failure::Nvml(e)) => Err(unavailable(format!(
                    "NVIDIA GPU {device} cannot be read: {e}"
                ))),
                // The first read excludes nothing, so the fallback always applies.
                Err(Failure::Unattributable(reason)) => Err(unavailable(reason)),
            }
        }
    }

    #[async_trait]
    impl PressureReader for NvmlPressureReader {
        fn name(&self) -> &str {
            &self.name
        }

        async fn read(&self, exclude_pids: &[u32]) -> Result<OwnerLoad, PressureError> {
            let nvml = Arc::clone(&self.inner.nvml);
            let device = self.inner.device.clone();
            let last_seen = Arc::clone(&self.inner.last_seen);
            let exclude: HashSet<u32> = exclude_pids.iter().copied().collect();
            let result = tokio::task::spawn_blocking(move || {
                let mut last = last_seen.lock().unwrap_or_else(PoisonError::into_inner);
                let (load, newest) = read(&nvml, &device, &exclude, *last)?;
                *last = newest;
                Ok::<_, Failure>(load)
            })
            .await;
            let gpu = self.name.clone();
            match result {
                Ok(Ok(load)) => Ok(load),
                Ok(Err(Failure::Nvml(e))) => Err(PressureError::Read {
                    gpu,
                    reason: format!("NVML: {e}"),
                }),
                Ok(Err(Failure::Unattributable(reason))) => {
                    Err(PressureError::Unattributable { gpu, reason })
                }
                Err(e) => Err(PressureError::Read {
                    gpu,
                    reason: format!("the NVML read did not finish: {e}"),
                }),
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[cfg(not(feature = "nvml"))]
    #[test]
    fn without_the_feature_construction_says_how_to_rebuild() {
        let err = NvmlPressureReader::new("gpu0", "0").unwrap_err();
        assert!(matches!(err, PressureError::Unavailable { .. }), "{err:?}");
        assert!(err.to_string().contains("--features nvml"), "{err}");
    }

    /// Without a driver (CI) construction fails naming the library; with one,
    /// a read gives a load within range.
    #[cfg(feature = "nvml")]
    #[tokio::test(flavor = "current_thread")]
    async fn construction_fails_cleanly_or_reads() {
        match NvmlPressureReader::new("gpu0", "0") {
            Err(err) => {
                let message = err.to_string();
                eprintln!("expected on a machine without the driver: {message}");
                assert!(matches!(err, PressureError::Unavailable { .. }), "{err:?}");
            }
            Ok(reader) => {
                let load = reader.read(&[std::process::id()]).await.unwrap();
                assert!(load.util_pct <= 100);
            }
        }
    }
}
