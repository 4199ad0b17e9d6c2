//! System memory and CPU samplers backed by `sysinfo`.
//!
//! sysinfo reads small kernel files (`/proc/meminfo`, `/proc/stat` on Linux);
//! that takes microseconds, so the samplers read them directly on the calling
//! task instead of hopping to a blocking thread.

use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use sysinfo::{MemoryRefreshKind, System};

use super::mib;
use crate::time::MonotonicClock;
use crate::traits::resource::{CapacitySample, Resource, ResourceKind, SampleError};

/// What the errors of these samplers name as their source.
const SOURCE: &str = "system memory (sysinfo)";

/// A fresh `System` with nothing loaded, or an error saying why there is none.
fn new_system(what: &str) -> Result<System, SampleError> {
    System::new()
        .map_err(|e| SampleError::Unavailable(format!("{what}: sysinfo cannot start: {e}")))
}

/// Lock the `System`, recovering it if a previous holder panicked.
///
/// Recovering is safe because every sample refreshes what it reads; a
/// half-finished refresh leaves nothing the next sample relies on.
fn lock(system: &Mutex<System>) -> MutexGuard<'_, System> {
    system
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Refresh memory only and return `(free_mib, total_mib)`.
///
/// Free is *available* memory, not free memory: on Linux the page cache is
/// reclaimable, so `free_memory()` would understate what borrowed work can get.
fn read_memory(system: &mut System) -> Result<(u64, u64), SampleError> {
    system.refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
    let total = system.total_memory();
    let available = system.available_memory();
    if total == 0 {
        return Err(SampleError::Unreadable {
            source_name: SOURCE.to_string(),
            reason: "total memory reads as 0 (the memory statistics could not be read)".to_string(),
        });
    }
    if available > total {
        return Err(SampleError::Malformed {
            source_name: SOURCE.to_string(),
            reason: format!("available memory ({available} bytes) exceeds total ({total} bytes)"),
        });
    }
    Ok((mib(available), mib(total)))
}

/// System memory (`kind = "memory"`, `sampler = "system"`).
///
/// # Behavior
///
/// `free_mib` is available memory (free plus reclaimable cache), `total_mib`
/// is installed memory, both rounded down to whole MiB. A total of 0 is a
/// failed read.
#[derive(Debug)]
pub struct SystemMemory {
    name: String,
    clock: MonotonicClock,
    // A Mutex because refreshing needs `&mut System` while `sample` takes `&self`;
    // it is never held across an await.
    system: Mutex<System>,
}

impl SystemMemory {
    /// A system memory sampler for the resource `name`, stamping samples with `clock`.
    ///
    /// # Errors
    ///
    /// [`SampleError::Unavailable`] when sysinfo cannot start on this platform.
    pub fn new(name: impl Into<String>, clock: MonotonicClock) -> Result<Self, SampleError> {
        let name = name.into();
        let system = new_system(&name)?;
        Ok(SystemMemory {
            name,
            clock,
            system: Mutex::new(system),
        })
    }
}

#[async_trait]
impl Resource for SystemMemory {
    fn id(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> ResourceKind {
        ResourceKind::Memory
    }

    async fn sample(&self) -> Result<CapacitySample, SampleError> {
        let taken_at = self.clock.now();
        let (free_mib, total_mib) = read_memory(&mut lock(&self.system))?;
        Ok(CapacitySample::memory(free_mib, total_mib, taken_at))
    }
}

/// Processor load (`kind = "cpu"`, `sampler = "system"`).
///
/// # Behavior
///
/// `busy_pct` is the global CPU usage since the previous sample (the first
/// sample measures from construction), rounded and clamped to 0–100.
/// `free_mib`/`total_mib` are system memory as in [`SystemMemory`].
///
/// CPU usage is a difference of two counter readings, which is why the
/// constructor takes the first one. Samples taken less than ~200 ms apart
/// (sysinfo's `MINIMUM_CPU_UPDATE_INTERVAL`) measure a short, noisy interval.
#[derive(Debug)]
pub struct SystemCpu {
    name: String,
    clock: MonotonicClock,
    // See `SystemMemory::system`; never held across an await.
    system: Mutex<System>,
}

impl SystemCpu {
    /// A CPU sampler for the resource `name`; takes the first CPU reading now.
    ///
    /// # Errors
    ///
    /// [`SampleError::Unavailable`] when sysinfo cannot start on this platform.
    pub fn new(name: impl Into<String>, clock: MonotonicClock) -> Result<Self, SampleError> {
        let name = name.into();
        let mut system = new_system(&name)?;
        system.refresh_cpu_usage();
        Ok(SystemCpu {
            name,
            clock,
            system: Mutex::new(system),
        })
    }
}

#[async_trait]
impl Resource for SystemCpu {
    fn id(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> ResourceKind {
        ResourceKind::Cpu
    }

    async fn sample(&self) -> Result<CapacitySample, SampleError> {
        let taken_at = self.clock.now();
        let (usage, memory) = {
            let mut system = lock(&self.system);
            system.refresh_cpu_usage();
            (system.global_cpu_usage(), read_memory(&mut system))
        };
        let (free_mib, total_mib) = memory?;
        if !usage.is_finite() {
            return Err(SampleError::Malformed {
                source_name: "CPU usage (sysinfo)".to_string(),
                reason: format!("usage reads as {usage}"),
            });
        }
        // Finite and clamped to 0..=100 first, so the cast cannot truncate.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let busy_pct = usage.round().clamp(0.0, 100.0) as u8;
        Ok(CapacitySample {
            free_mib,
            total_mib,
            busy_pct: Some(busy_pct),
            heat: Default::default(),
            taken_at,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn system_memory_reads_this_machine() {
        let clock = MonotonicClock::new();
        let ram = SystemMemory::new("ram", clock).unwrap();
        assert_eq!(ram.id(), "ram");
        assert_eq!(ram.kind(), ResourceKind::Memory);

        let before = clock.now();
        let sample = ram.sample().await.unwrap();
        let after = clock.now();

        assert!(sample.total_mib > 0);
        assert!(sample.free_mib <= sample.total_mib);
        assert_eq!(sample.busy_pct, None);
        assert!(before <= sample.taken_at && sample.taken_at <= after);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn system_cpu_reports_busy_pct() {
        let clock = MonotonicClock::new();
        let cpu = SystemCpu::new("cpu", clock).unwrap();
        assert_eq!(cpu.id(), "cpu");
        assert_eq!(cpu.kind(), ResourceKind::Cpu);
        // Give the counters an interval worth measuring.
        tokio::time::sleep(sysinfo::MINIMUM_CPU_UPDATE_INTERVAL).await;

        for _ in 0..2 {
            let before = clock.now();
            let sample = cpu.sample().await.unwrap();
            let after = clock.now();

            assert!(sample.busy_pct.unwrap() <= 100);
            assert!(sample.total_mib > 0);
            assert!(sample.free_mib <= sample.total_mib);
            assert!(before <= sample.taken_at && sample.taken_at <= after);
        }
    }
}
