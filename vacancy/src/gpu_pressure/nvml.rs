//! The owner's load on an NVIDIA GPU through NVML process attribution (cargo feature `nvml`).
//!
//! Without the feature the type still exists, but [`NvmlPressureReader::new`]
//! fails, saying how to rebuild.

use std::collections::{BTreeMap, HashSet};

use async_trait::async_trait;

use crate::engine::pressure::OwnerLoad;
use crate::gpu_pressure::reader::{PressureError, PressureReader};

/// The owner's load on an NVIDIA GPU, from NVML's per-process accounting.
///
/// # Behavior
///
/// - Memory: the sum of `used_gpu_memory` of the GPU's running compute and
///   graphics processes whose PIDs are not excluded (a process in both lists
///   counts once). A process whose memory NVML does not report counts 0 on
///   Linux. On Windows under WDDM NVML reports no process's memory: there
///   it is Windows' own `GPU Process Memory(*)\Dedicated Usage` counter of
///   that PID (summed over the adapters it uses, which errs toward refusing
///   on a machine with several GPUs; a PID without an instance holds none).
///   If those counters cannot be read, the read fails with
///   [`PressureError::Unattributable`] rather than count the owner's
///   memory as 0.
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

impl NvmlPressureReader {
    /// A reader for the GPU resource `name` on `device` (an index such as
    /// `"0"` or a PCI bus id).
    ///
    /// # Errors
    ///
    /// [`PressureError::Unavailable`] when this build has no NVML support
    /// (saying to rebuild with `--features nvml`), the driver library cannot
    /// be loaded, NVML cannot start, or the device cannot be read.
    pub fn new(name: impl Into<String>, device: &str) -> Result<Self, PressureError> {
        let name = name.into();
        #[cfg(not(feature = "nvml"))]
        {
            let _ = device;
            Err(PressureError::Unavailable {
                gpu: name,
                reason: "vacancyd was built without NVML support; rebuild with --features nvml"
                    .to_owned(),
            })
        }
        #[cfg(feature = "nvml")]
        {
            let inner = Inner::open(&name, device)?;
            Ok(NvmlPressureReader { name, inner })
        }
    }
}

#[async_trait]
impl PressureReader for NvmlPressureReader {
    fn name(&self) -> &str {
        &self.name
    }

    async fn read(&self, exclude_pids: &[u32]) -> Result<OwnerLoad, PressureError> {
        // Without the feature `Inner` is uninhabited: no reader exists.
        #[cfg(not(feature = "nvml"))]
        match (self.inner, exclude_pids) {}
        #[cfg(feature = "nvml")]
        self.inner.read(&self.name, exclude_pids).await
    }
}

#[cfg(not(feature = "nvml"))]
type Inner = std::convert::Infallible;

#[cfg(feature = "nvml")]
use enabled::Inner;

/// Where the memory of a process NVML does not report comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(all(windows, feature = "nvml")), allow(dead_code))]
enum Unreported {
    /// It counts 0 (Linux, where NVML reports it for every process it can see).
    Zero,
    /// Windows' own per-process counters: bytes by PID (none listed: 0).
    Counted(BTreeMap<u32, u64>),
    /// Those counters could not be read: why.
    Unknown(String),
}

/// The owner's GPU memory in MiB: the memory of the processes not excluded,
/// each counted once (a process may be both compute and graphics); memory
/// NVML does not report (`None`) comes from `unreported`.
///
/// An owner's process with unreported memory and no other source is an
/// error, not 0: the owner's memory would otherwise read low and lend.
#[cfg_attr(not(feature = "nvml"), allow(dead_code))]
fn owner_memory_mib(
    processes: &[(u32, Option<u64>)],
    exclude: &HashSet<u32>,
    unreported: &Unreported,
) -> Result<u64, String> {
    let mut per_pid: BTreeMap<u32, u64> = BTreeMap::new();
    for (pid, used) in processes.iter().filter(|(pid, _)| !exclude.contains(pid)) {
        let used = match (used, unreported) {
            (Some(bytes), _) => *bytes,
            (None, Unreported::Zero) => 0,
            (None, Unreported::Counted(by_pid)) => by_pid.get(pid).copied().unwrap_or(0),
            (None, Unreported::Unknown(why)) => {
                return Err(format!(
                    "NVML does not report the memory of process {pid} (WDDM), and Windows' GPU Process Memory counters cannot be read: {why}"
                ));
            }
        };
        let e = per_pid.entry(*pid).or_default();
        *e = (*e).max(used);
    }
    Ok(per_pid.values().sum::<u64>() / (1024 * 1024))
}

/// Whether any process not excluded has memory NVML does not report.
#[cfg_attr(not(all(windows, feature = "nvml")), allow(dead_code))]
fn owner_memory_unreported(processes: &[(u32, Option<u64>)], exclude: &HashSet<u32>) -> bool {
    processes
        .iter()
        .any(|(pid, used)| used.is_none() && !exclude.contains(pid))
}

/// Bytes of dedicated GPU memory by PID from the `GPU Process Memory`
/// instances (`pid_<PID>_luid_0x…_0x…_phys_<n>`), summed over adapters;
/// an instance whose name does not parse is left out.
#[cfg_attr(not(all(windows, feature = "nvml")), allow(dead_code))]
fn memory_by_pid(instances: &[(String, u64)]) -> BTreeMap<u32, u64> {
    let mut by_pid: BTreeMap<u32, u64> = BTreeMap::new();
    for (name, bytes) in instances {
        if let Some(pid) = instance_pid(name) {
            let e = by_pid.entry(pid).or_default();
            *e = e.saturating_add(*bytes);
        }
    }
    by_pid
}

/// The PID of a GPU performance-counter instance, `pid_<PID>_luid_…`.
#[cfg_attr(not(all(windows, feature = "nvml")), allow(dead_code))]
fn instance_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("pid_")?;
    let (pid, rest) = rest.split_once('_')?;
    rest.starts_with("luid_").then_some(())?;
    pid.parse().ok()
}

/// Where unreported memory comes from on this system (see [`Unreported`]).
#[cfg_attr(not(feature = "nvml"), allow(dead_code))]
fn unreported_source(processes: &[(u32, Option<u64>)], exclude: &HashSet<u32>) -> Unreported {
    #[cfg(windows)]
    {
        if !owner_memory_unreported(processes, exclude) {
            return Unreported::Zero;
        }
        match crate::platform::windows::gpu_process_memory() {
            Ok(instances) => Unreported::Counted(memory_by_pid(&instances)),
            Err(e) => Unreported::Unknown(e.to_string()),
        }
    }
    #[cfg(not(windows))]
    {
        let _ = (processes, exclude);
        Unreported::Zero
    }
}

/// The NVIDIA driver's library NVML is loaded from.
#[cfg_attr(not(feature = "nvml"), allow(dead_code))]
const NVML_LIBRARY: &str = if cfg!(windows) {
    "nvml.dll"
} else {
    "libnvidia-ml.so"
};

/// The owner's utilization from NVML's `(pid, SM %)` samples: each process
/// not excluded contributes the mean of its samples; the sum is clamped to 100.
#[cfg_attr(not(feature = "nvml"), allow(dead_code))]
fn owner_util_pct(samples: &[(u32, u32)], exclude: &HashSet<u32>) -> u8 {
    // pid -> (sum of SM %, sample count)
    let mut per_pid: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for (pid, sm) in samples.iter().filter(|(pid, _)| !exclude.contains(pid)) {
        let e = per_pid.entry(*pid).or_default();
        e.0 += u64::from(*sm);
        e.1 += 1;
    }
    let util: u64 = per_pid.values().map(|(sum, n)| sum / (*n).max(1)).sum();
    u8::try_from(util.min(100)).unwrap_or(100)
}

#[cfg(feature = "nvml")]
mod enabled {
    use std::collections::HashSet;
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
        let processes: Vec<(u32, Option<u64>)> = device
            .running_compute_processes()?
            .into_iter()
            .chain(device.running_graphics_processes()?)
            .map(|p| match p.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => (p.pid, Some(bytes)),
                UsedGpuMemory::Unavailable => (p.pid, None),
            })
            .collect();
        let excluded_running = processes.iter().any(|(pid, _)| exclude.contains(pid));
        let unreported = unreported_source(&processes, exclude);
        let memory_mib =
            owner_memory_mib(&processes, exclude, &unreported).map_err(Failure::Unattributable)?;
        let (util_pct, newest) = match device.process_utilization_stats(last_seen) {
            Ok(samples) => {
                let newest = samples.iter().map(|s| s.timestamp).max().or(last_seen);
                let samples: Vec<(u32, u32)> = samples.iter().map(|s| (s.pid, s.sm_util)).collect();
                (owner_util_pct(&samples, exclude), newest)
            }
            // No process had a sample since the last read: nothing ran.
            Err(NvmlError::NotFound) => (0, last_seen),
            Err(NvmlError::NotSupported) if !excluded_running => {
                let device_util = device.utilization_rates()?.gpu.min(100);
                (u8::try_from(device_util).unwrap_or(100), last_seen)
            }
            Err(NvmlError::NotSupported) => {
                return Err(Failure::Unattributable(
                    "this GPU or driver has no per-process utilization, and a lent upstream server is running on it".to_owned(),
                ));
            }
            Err(e) => return Err(e.into()),
        };
        Ok((
            OwnerLoad {
                util_pct,
                memory_mib,
            },
            newest,
        ))
    }

    impl Inner {
        /// Starts NVML and reads `device` once, so a wrong device fails here.
        pub(super) fn open(gpu: &str, device: &str) -> Result<Self, PressureError> {
            let unavailable = |reason: String| PressureError::Unavailable {
                gpu: gpu.to_owned(),
                reason,
            };
            let nvml = Nvml::init().map_err(|e| {
                unavailable(format!(
                    "the NVIDIA driver library ({NVML_LIBRARY}) could not start: {e}"
                ))
            })?;
            match read(&nvml, device, &HashSet::new(), None) {
                Ok((_, newest)) => Ok(Inner {
                    nvml: Arc::new(nvml),
                    device: device.to_owned(),
                    last_seen: Arc::new(Mutex::new(newest)),
                }),
                Err(Failure::Nvml(e)) => Err(unavailable(format!(
                    "NVIDIA GPU {device} cannot be read: {e}"
                ))),
                // Utilization always falls back here (nothing is excluded),
                // but Windows' memory counters may fail: each read says so.
                Err(Failure::Unattributable(reason)) => {
                    tracing::warn!(gpu, %reason, "the owner's load on this GPU cannot be attributed yet; each read until it can makes the reading unavailable");
                    Ok(Inner {
                        nvml: Arc::new(nvml),
                        device: device.to_owned(),
                        last_seen: Arc::new(Mutex::new(None)),
                    })
                }
            }
        }

        pub(super) async fn read(
            &self,
            gpu: &str,
            exclude_pids: &[u32],
        ) -> Result<OwnerLoad, PressureError> {
            let nvml = Arc::clone(&self.nvml);
            let device = self.device.clone();
            let last_seen = Arc::clone(&self.last_seen);
            let exclude: HashSet<u32> = exclude_pids.iter().copied().collect();
            let result = tokio::task::spawn_blocking(move || {
                let mut last = last_seen.lock().unwrap_or_else(PoisonError::into_inner);
                let (load, newest) = read(&nvml, &device, &exclude, *last)?;
                *last = newest;
                Ok::<_, Failure>(load)
            })
            .await;
            let gpu = gpu.to_owned();
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

    #[test]
    fn memory_and_utilization_leave_out_the_excluded_processes() {
        const MIB: u64 = 1024 * 1024;
        let exclude: HashSet<u32> = [7].into_iter().collect();
        // 10 is both compute and graphics: counted once; 11's memory is not reported.
        let processes = [
            (10, Some(1000 * MIB)),
            (7, Some(20_000 * MIB)),
            (10, Some(1000 * MIB)),
            (11, None),
            (12, Some(500 * MIB)),
        ];
        assert_eq!(
            owner_memory_mib(&processes, &exclude, &Unreported::Zero),
            Ok(1500)
        );
        assert_eq!(owner_memory_mib(&[], &exclude, &Unreported::Zero), Ok(0));
        // 10 averages 30 %, 12 is 20 %, 7 (excluded) is busy.
        let samples = [(10, 20), (7, 90), (10, 40), (12, 20), (7, 95)];
        assert_eq!(owner_util_pct(&samples, &exclude), 50);
        assert_eq!(owner_util_pct(&[(1, 80), (2, 70)], &exclude), 100);
        assert_eq!(owner_util_pct(&[], &exclude), 0);
    }

    #[test]
    fn under_wddm_the_owners_memory_comes_from_windows_counters_or_is_unknown() {
        const MIB: u64 = 1024 * 1024;
        let exclude: HashSet<u32> = [7].into_iter().collect();
        // WDDM: NVML reports no process's memory.
        let processes = [(10, None), (7, None), (12, None), (10, None)];
        let counters = vec![
            (
                "pid_10_luid_0x00000000_0x0000D1A5_phys_0".to_owned(),
                3000 * MIB,
            ),
            (
                "pid_7_luid_0x00000000_0x0000D1A5_phys_0".to_owned(),
                20_000 * MIB,
            ),
            // 10 on a second adapter too: summed (errs toward refusing).
            (
                "pid_10_luid_0x00000000_0x0000E2B6_phys_0".to_owned(),
                100 * MIB,
            ),
            ("_Total".to_owned(), 99_999 * MIB),
            ("pid_x_luid_0x0_0x0_phys_0".to_owned(), MIB),
        ];
        let by_pid = memory_by_pid(&counters);
        assert_eq!(by_pid.len(), 2, "{by_pid:?}");
        assert!(owner_memory_unreported(&processes, &exclude));
        // 12 has no instance: it holds no dedicated memory. 7 is the server's.
        assert_eq!(
            owner_memory_mib(&processes, &exclude, &Unreported::Counted(by_pid)),
            Ok(3100)
        );
        // Without the counters the owner's memory is unknown, never 0.
        let err = owner_memory_mib(
            &processes,
            &exclude,
            &Unreported::Unknown("PDH status 0xC0000BB8".to_owned()),
        )
        .unwrap_err();
        assert!(
            err.contains("process 10") && err.contains("0xC0000BB8"),
            "{err}"
        );
        // Only the server's memory unreported: nothing to look up.
        let only_server = [(7, None), (10, Some(MIB))];
        assert!(!owner_memory_unreported(&only_server, &exclude));
        assert_eq!(
            owner_memory_mib(&only_server, &exclude, &Unreported::Unknown(String::new())),
            Ok(1)
        );
        assert_eq!(instance_pid("pid_4242_luid_0x1_0x2_phys_0"), Some(4242));
        assert_eq!(instance_pid("pid_4242_engtype_3D"), None);
        assert_eq!(instance_pid("luid_0x1"), None);
    }

    #[cfg(not(feature = "nvml"))]
    #[test]
    fn without_the_feature_construction_says_how_to_rebuild() {
        let err = NvmlPressureReader::new("gpu0", "0").unwrap_err();
        assert!(matches!(err, PressureError::Unavailable { .. }), "{err:?}");
        assert!(err.to_string().contains("--features nvml"), "{err}");
    }

    /// Without an NVIDIA device (no `/dev/nvidia*`: CI) construction fails
    /// naming the library; with one, NVML must work and a read gives a load
    /// within range.
    #[cfg(feature = "nvml")]
    #[tokio::test(flavor = "current_thread")]
    async fn construction_fails_cleanly_or_reads() {
        match NvmlPressureReader::new("gpu0", "0") {
            Err(err) => {
                let message = err.to_string();
                let devices = crate::test_prereq::nvidia_device_nodes();
                assert!(
                    devices.is_empty(),
                    "NVML failed on a machine with NVIDIA devices {devices:?}: {message}"
                );
                assert!(matches!(err, PressureError::Unavailable { .. }), "{err:?}");
            }
            Ok(reader) => {
                let load = reader.read(&[std::process::id()]).await.unwrap();
                assert!(load.util_pct <= 100);
            }
        }
    }
}
