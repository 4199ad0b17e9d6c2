//! NVIDIA GPU memory through NVML (cargo feature `nvml`).
//!
//! Without the feature the type still exists, so configuration code compiles
//! either way, but it cannot be constructed: [`NvmlGpu::new`] says how to
//! rebuild.

use async_trait::async_trait;

use crate::time::MonotonicClock;
use crate::traits::resource::{CapacitySample, Resource, ResourceKind, SampleError};

/// An NVIDIA GPU (`sampler = "nvml"`), read with NVML's `memory_info`.
///
/// # Behavior
///
/// - NVML is initialised once, at construction; the driver library
///   (`libnvidia-ml`) is loaded at run time, so a build with the feature still
///   starts on a machine without the driver and reports it as an error.
/// - `device` is an index (`"0"`) or a PCI bus id (`"00000000:01:00.0"`);
///   the device is looked up again on each sample (a cheap handle lookup),
///   which avoids holding a `Device` that borrows the `Nvml` handle.
/// - free/total are NVML's free and total framebuffer bytes, rounded down to MiB.
#[derive(Debug)]
pub struct NvmlGpu {
    name: String,
    inner: Inner,
    /// The heat and power limits whose readings each sample carries (issue 35).
    heat: Option<crate::engine::HeatLimits>,
}

impl NvmlGpu {
    /// An NVIDIA GPU sampler for the resource `name`, reading `device`
    /// (an index such as `"0"` or a PCI bus id such as `"00000000:01:00.0"`).
    ///
    /// # Errors
    ///
    /// - [`SampleError::Unavailable`] when this build has no NVML support
    ///   (saying to rebuild with `--features nvml`), or when the driver
    ///   library cannot be loaded or NVML cannot start, naming `libnvidia-ml`.
    /// - [`SampleError::Unreadable`] when no such device exists or its
    ///   memory cannot be read: a wrong `device` fails at start, not later.
    pub fn new(
        name: impl Into<String>,
        device: &str,
        clock: MonotonicClock,
    ) -> Result<Self, SampleError> {
        #[cfg(not(feature = "nvml"))]
        {
            let _ = (name.into(), device, clock);
            Err(SampleError::Unavailable(
                "vacancyd was built without NVML support; rebuild with --features nvml".to_string(),
            ))
        }
        #[cfg(feature = "nvml")]
        Ok(NvmlGpu {
            name: name.into(),
            inner: Inner::open(device, clock)?,
            heat: None,
        })
    }

    /// The same sampler, reading with each sample the temperature (the GPU
    /// die's), power draw and fan speed `limits` need (issue 35).
    pub fn with_heat_limits(mut self, limits: Option<crate::engine::HeatLimits>) -> Self {
        self.heat = limits;
        self
    }

    /// The device's power-limit control, sharing this sampler's NVML handle.
    #[cfg(feature = "nvml")]
    pub fn power_limit(&self) -> NvmlPowerLimit {
        self.inner.power_limit()
    }
}

#[async_trait]
impl Resource for NvmlGpu {
    fn id(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> ResourceKind {
        ResourceKind::Gpu
    }

    async fn sample(&self) -> Result<CapacitySample, SampleError> {
        // Without the feature `Inner` is uninhabited: no NvmlGpu exists.
        #[cfg(not(feature = "nvml"))]
        match self.inner {}
        #[cfg(feature = "nvml")]
        self.inner.sample(self.heat).await
    }
}

#[cfg(not(feature = "nvml"))]
type Inner = std::convert::Infallible;

#[cfg(feature = "nvml")]
use enabled::Inner;
#[cfg(feature = "nvml")]
pub use enabled::NvmlPowerLimit;

#[cfg(feature = "nvml")]
mod enabled {
    use std::sync::Arc;

    use nvml_wrapper::Nvml;
    use nvml_wrapper::error::NvmlError;

    use super::*;
    use crate::sample::mib;

    /// How the configured device is found.
    #[derive(Debug, Clone)]
    enum Selector {
        Index(u32),
        PciBusId(String),
    }

    /// The NVML handle and what to ask it.
    pub(super) struct Inner {
        // An Arc so each sample can move a handle into `spawn_blocking`.
        nvml: Arc<Nvml>,
        selector: Selector,
        /// The device as configured, for error messages.
        device: String,
        clock: MonotonicClock,
    }

    impl std::fmt::Debug for Inner {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Inner")
                .field("selector", &self.selector)
                .field("clock", &self.clock)
                .finish_non_exhaustive()
        }
    }

    fn device<'n>(
        nvml: &'n Nvml,
        selector: &Selector,
    ) -> Result<nvml_wrapper::Device<'n>, NvmlError> {
        match selector {
            Selector::Index(index) => nvml.device_by_index(*index),
            Selector::PciBusId(id) => nvml.device_by_pci_bus_id(id.as_str()),
        }
    }

    /// The NVIDIA device `selector` names: its memory as `(free, total)` bytes.
    fn read(nvml: &Nvml, selector: &Selector) -> Result<(u64, u64), NvmlError> {
        let info = device(nvml, selector)?.memory_info()?;
        Ok((info.free, info.total))
    }

    /// The readings `limits` need; each `None` where NVML cannot give it
    /// (the engine counts that as unknown, not cool).
    fn read_heat(
        nvml: &Nvml,
        selector: &Selector,
        limits: &crate::engine::HeatLimits,
    ) -> crate::engine::HeatReading {
        use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
        let mut reading = crate::engine::HeatReading::default();
        let Ok(device) = device(nvml, selector) else {
            return reading;
        };
        if limits.temperature.is_some() {
            reading.temperature_c = device.temperature(TemperatureSensor::Gpu).ok();
        }
        if limits.max_power_w.is_some() {
            reading.power_w = device.power_usage().ok().map(|mw| mw.div_ceil(1000));
        }
        if limits.max_fan_percent.is_some() {
            reading.fan_percent = device
                .fan_speed(0)
                .ok()
                .map(|p| u8::try_from(p.min(100)).unwrap_or(100));
        }
        reading
    }

    /// An NVIDIA GPU's power limit through NVML (milliwatts there, watts
    /// here). Setting it needs the rights NVML asks for (root, as a rule).
    #[derive(Clone)]
    pub struct NvmlPowerLimit {
        nvml: Arc<Nvml>,
        selector: Selector,
        device: String,
    }

    impl std::fmt::Debug for NvmlPowerLimit {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("NvmlPowerLimit")
                .field("device", &self.device)
                .finish_non_exhaustive()
        }
    }

    impl crate::sample::PowerLimit for NvmlPowerLimit {
        fn name(&self) -> String {
            format!("NVIDIA GPU {} power management limit (NVML)", self.device)
        }

        fn current_w(&self) -> Result<u32, crate::sample::PowerLimitError> {
            device(&self.nvml, &self.selector)
                .and_then(|d| d.power_management_limit())
                .map(|mw| mw / 1000)
                .map_err(|e| crate::sample::PowerLimitError::new(&self.name(), e))
        }

        fn set_w(&self, watts: u32) -> Result<(), crate::sample::PowerLimitError> {
            device(&self.nvml, &self.selector)
                .and_then(|mut d| d.set_power_management_limit(watts.saturating_mul(1000)))
                .map_err(|e| crate::sample::PowerLimitError::new(&self.name(), e))
        }
    }

    fn unreadable(device: &str, e: impl std::fmt::Display) -> SampleError {
        SampleError::Unreadable {
            source_name: format!("NVIDIA GPU {device} (NVML)"),
            reason: e.to_string(),
        }
    }

    impl Inner {
        /// Starts NVML and reads `device` once, so a wrong device fails here.
        pub(super) fn open(device: &str, clock: MonotonicClock) -> Result<Self, SampleError> {
            let nvml = Nvml::init().map_err(|e| {
                let what = match e {
                    NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound => "not found",
                    _ => "could not start",
                };
                let library = if cfg!(windows) {
                    "nvml.dll"
                } else {
                    "libnvidia-ml"
                };
                SampleError::Unavailable(format!(
                    "NVIDIA driver library ({library}) {what}: {e}; \
                     install the driver or use sampler = \"file\""
                ))
            })?;
            let selector = match device.parse::<u32>() {
                Ok(index) => Selector::Index(index),
                Err(_) => Selector::PciBusId(device.to_string()),
            };
            read(&nvml, &selector).map_err(|e| unreadable(device, e))?;
            Ok(Inner {
                nvml: Arc::new(nvml),
                selector,
                device: device.to_string(),
                clock,
            })
        }

        pub(super) fn power_limit(&self) -> NvmlPowerLimit {
            NvmlPowerLimit {
                nvml: Arc::clone(&self.nvml),
                selector: self.selector.clone(),
                device: self.device.clone(),
            }
        }

        pub(super) async fn sample(
            &self,
            heat: Option<crate::engine::HeatLimits>,
        ) -> Result<CapacitySample, SampleError> {
            let taken_at = self.clock.now();
            // NVML calls are usually fast but go through the kernel driver and
            // can stall (driver lock, GPU waking from a low-power state); on a
            // blocking thread such a stall cannot hold up the proxy's tasks.
            let nvml = Arc::clone(&self.nvml);
            let selector = self.selector.clone();
            let ((free, total), reading) = tokio::task::spawn_blocking(move || {
                let memory = read(&nvml, &selector)?;
                let reading = heat.map(|limits| read_heat(&nvml, &selector, &limits));
                Ok::<_, NvmlError>((memory, reading))
            })
            .await
            .map_err(|e| unreadable(&self.device, e))?
            .map_err(|e| unreadable(&self.device, e))?;
            if total == 0 || free > total {
                return Err(SampleError::Malformed {
                    source_name: format!("NVIDIA GPU {} (NVML)", self.device),
                    reason: format!("free {free} bytes of total {total} bytes"),
                });
            }
            let sample = CapacitySample::memory(mib(free), mib(total), taken_at);
            Ok(match reading {
                Some(reading) => sample.with_heat(reading),
                None => sample,
            })
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
        let err = NvmlGpu::new("gpu0", "0", MonotonicClock::new()).unwrap_err();
        assert!(matches!(err, SampleError::Unavailable(_)), "{err:?}");
        assert!(err.to_string().contains("--features nvml"), "{err}");
    }

    /// Without an NVIDIA device (no `/dev/nvidia*`: CI, the development
    /// machines) construction is an error naming the library; with one, NVML
    /// must work and device 0 gives a valid sample.
    #[cfg(feature = "nvml")]
    #[tokio::test(flavor = "current_thread")]
    async fn construction_fails_cleanly_or_samples() {
        let clock = MonotonicClock::new();
        match NvmlGpu::new("gpu0", "0", clock) {
            Err(err) => {
                let message = err.to_string();
                let devices = crate::test_prereq::nvidia_device_nodes();
                assert!(
                    devices.is_empty(),
                    "NVML failed on a machine with NVIDIA devices {devices:?}: {message}"
                );
                assert!(message.contains("libnvidia-ml"), "{message}");
                assert!(message.contains("sampler = \"file\""), "{message}");
            }
            Ok(gpu) => {
                assert_eq!((gpu.id(), gpu.kind()), ("gpu0", ResourceKind::Gpu));
                let before = clock.now();
                let sample = gpu.sample().await.unwrap();
                assert!(sample.total_mib > 0 && sample.free_mib <= sample.total_mib);
                assert!(before <= sample.taken_at && sample.taken_at <= clock.now());
            }
        }
    }
}
