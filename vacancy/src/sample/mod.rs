//! Capacity samplers implementing [`Resource`](crate::Resource).
//!
//! Each sampler is a thin shell around one source of capacity readings:
//!
//! | sampler | type | kind | source |
//! |---|---|---|---|
//! | `system` | [`SystemMemory`] | memory | sysinfo: available (not free) memory |
//! | `system` | [`SystemCpu`] | cpu | sysinfo: CPU usage since the previous sample, plus memory |
//! | `file` | [`FileSampler`] | gpu or memory | a JSON file `{"free_mib":N,"total_mib":N}` |
//! | `amdgpu` | [`AmdGpu`] | gpu | sysfs `mem_info_vram_*` (plus `mem_info_gtt_*` on APUs) |
//! | `nvml` | [`NvmlGpu`] | gpu | NVIDIA's NVML (feature `nvml`) |
//!
//! A GPU with heat or power limits (issue 35) carries its temperature, power
//! and fan with each sample: AMD's from its [`Hwmon`] files, NVIDIA's from NVML.
//! Beside them, [`PowerSupply`] reads what the machine runs on and
//! [`PowerLimit`] lowers and restores a GPU's power limit.
//!
//! # Behavior
//!
//! - Every sample is stamped with [`MonotonicClock::now`](crate::MonotonicClock::now)
//!   read *before* the source is read, so a reading that started before a job
//!   ended never counts as taken after it (ADM-04).
//! - A failed or implausible read is a [`SampleError`](crate::SampleError) naming
//!   the source (path, device, library) and the reason. Samplers never guess a
//!   number and never panic: the engine treats an error as "capacity unknown".
//! - Byte counts are converted with [`mib`], rounding down, so free capacity is
//!   never overstated.

mod amdgpu;
mod file;
mod file_reads;
mod hwmon;
mod nvml;
mod power_limit;
mod power_supply;
mod system;

pub use amdgpu::AmdGpu;
pub use file::FileSampler;
pub use hwmon::Hwmon;
pub use nvml::NvmlGpu;
#[cfg(feature = "nvml")]
pub use nvml::NvmlPowerLimit;
pub use power_limit::{PowerLimit, PowerLimitError, RecordedPowerLimit, SysfsPowerLimit};
pub use power_supply::{PowerSupply, SysfsPowerSupply, system_power_supply, windows_power_source};
pub use system::{SystemCpu, SystemMemory};

/// Bytes in one MiB.
const MIB: u64 = 1024 * 1024;

/// Whole MiB in `bytes`, rounded down.
///
/// Rounding down keeps a sampler from reporting capacity that is not there.
pub fn mib(bytes: u64) -> u64 {
    bytes / MIB
}

/// Build the sampler a `[[resource]]` table configures.
///
/// # Errors
///
/// The sampler cannot be built here: NVML without the driver or without the
/// `nvml` feature, an amdgpu card name that is not plain, a file sampler for a
/// CPU, a `manual` resource (nothing samples it). The daemon treats that
/// resource's capacity as unknown.
pub fn from_config(
    config: &crate::config::ResourceConfig,
    clock: crate::MonotonicClock,
) -> Result<std::sync::Arc<dyn crate::Resource>, crate::SampleError> {
    use crate::config::SamplerKind;
    use crate::traits::resource::ResourceKind;
    use std::sync::Arc;
    let name = config.name.clone();
    Ok(match (config.sampler, config.kind) {
        (SamplerKind::System, ResourceKind::Cpu) => Arc::new(SystemCpu::new(name, clock)?),
        (SamplerKind::System, _) => Arc::new(SystemMemory::new(name, clock)?),
        (SamplerKind::File, kind) => Arc::new(FileSampler::new(name, kind, &config.path, clock)?),
        (SamplerKind::Amdgpu, _) => Arc::new(
            AmdGpu::new(
                name,
                &config.sysfs_root,
                &config.device,
                config.include_gtt,
                clock,
            )?
            .with_heat_limits(config.heat_limits()),
        ),
        (SamplerKind::Nvml, _) => Arc::new(
            NvmlGpu::new(name, &config.device, clock)?.with_heat_limits(config.heat_limits()),
        ),
        (SamplerKind::Manual, _) => {
            return Err(crate::SampleError::Unavailable(format!(
                "resource {name:?} has sampler = \"manual\": the program embedding the engine feeds its samples"
            )));
        }
    })
}

/// The power-limit control of a `[[resource]]` with `power_cap_w`: AMD's
/// sysfs file or NVIDIA's NVML limit.
///
/// # Errors
///
/// The card has no hwmon directory, NVML cannot start (or this build has no
/// NVML), or the sampler is neither `amdgpu` nor `nvml`.
pub fn power_limit_for(
    config: &crate::config::ResourceConfig,
) -> Result<Box<dyn PowerLimit>, PowerLimitError> {
    use crate::config::SamplerKind;
    match config.sampler {
        SamplerKind::Amdgpu => {
            let device = std::path::PathBuf::from(&config.sysfs_root)
                .join(&config.device)
                .join("device");
            Ok(Box::new(SysfsPowerLimit::new(&Hwmon::new(device))?))
        }
        #[cfg(feature = "nvml")]
        SamplerKind::Nvml => {
            let gpu = NvmlGpu::new(
                config.name.clone(),
                &config.device,
                crate::MonotonicClock::new(),
            )
            .map_err(|e| PowerLimitError::new(&format!("NVIDIA GPU {}", config.device), e))?;
            Ok(Box::new(gpu.power_limit()))
        }
        #[cfg(not(feature = "nvml"))]
        SamplerKind::Nvml => Err(PowerLimitError::new(
            &format!("NVIDIA GPU {}", config.device),
            "this vacancyd was built without NVML; rebuild with --features nvml to set its power limit",
        )),
        other => Err(PowerLimitError::new(
            &format!("resource {}", config.name),
            format!("sampler = \"{other}\" has no power limit to set"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mib_rounds_down() {
        assert_eq!(mib(0), 0);
        assert_eq!(mib(MIB - 1), 0);
        assert_eq!(mib(MIB), 1);
        assert_eq!(mib(3 * MIB + 5), 3);
        assert_eq!(mib(u64::MAX), u64::MAX / MIB);
    }

    /// Issue 35 item 3, the NVML-absent path: an NVIDIA GPU's power cap
    /// cannot be set without NVML, and the error says why (the daemon logs
    /// it and lends at the GPU's own limit). On a machine with an NVIDIA
    /// device and NVML the control opens instead.
    #[test]
    fn a_power_cap_without_nvml_is_an_error_naming_nvml() {
        let text = "[[resource]]\nname = \"gpu0\"\nkind = \"gpu\"\nsampler = \"nvml\"\ndevice = \"0\"\npower_cap_w = 150\n";
        let Ok(loaded) = crate::config::Config::parse(text, "t") else {
            panic!("the configuration parses");
        };
        match power_limit_for(&loaded.config.resources[0]) {
            Err(e) => {
                let message = e.to_string();
                assert!(
                    message.contains("NVML") || message.contains("libnvidia-ml"),
                    "{message}"
                );
                assert!(message.starts_with("NVIDIA GPU 0"), "{message}");
            }
            Ok(control) => {
                #[cfg(feature = "nvml")]
                assert!(
                    !crate::test_prereq::nvidia_device_nodes().is_empty(),
                    "NVML opened {} on a machine without NVIDIA devices",
                    control.name()
                );
                #[cfg(not(feature = "nvml"))]
                panic!("{} opened without NVML", control.name());
            }
        }
    }
}
