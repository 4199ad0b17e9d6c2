//! A GPU's power limit, lowered while borrowed work runs on it
//! (`[[resource]] power_cap_w`, issue 35 item 3): one trait, with the AMD
//! sysfs (`hwmon/power1_cap`) and NVIDIA NVML implementations and a
//! recording fake for tests.

use std::path::PathBuf;
use std::sync::Mutex;

use super::hwmon::Hwmon;

/// Why a GPU's power limit could not be read or set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {reason}")]
pub struct PowerLimitError {
    /// What was read or written (a file, a device).
    pub what: String,
    /// Why it failed.
    pub reason: String,
}

impl PowerLimitError {
    /// An error about `what`.
    pub fn new(what: &str, reason: impl std::fmt::Display) -> Self {
        PowerLimitError {
            what: what.to_owned(),
            reason: reason.to_string(),
        }
    }
}

/// A GPU's power limit, in watts. Blocking: call it on a blocking thread.
pub trait PowerLimit: Send + Sync {
    /// What it controls, for logs.
    fn name(&self) -> String;
    /// The limit in force now.
    fn current_w(&self) -> Result<u32, PowerLimitError>;
    /// Set the limit (needs the rights to: root, as a rule).
    fn set_w(&self, watts: u32) -> Result<(), PowerLimitError>;
}

/// An AMD GPU's `power1_cap` (microwatts) in its hwmon directory.
#[derive(Debug, Clone)]
pub struct SysfsPowerLimit {
    file: PathBuf,
}

impl SysfsPowerLimit {
    /// The `power1_cap` of the card whose hwmon files are `hwmon`.
    ///
    /// # Errors
    ///
    /// The card has no hwmon directory.
    pub fn new(hwmon: &Hwmon) -> Result<Self, PowerLimitError> {
        let dir = hwmon.dir().ok_or_else(|| {
            PowerLimitError::new(
                "the card's hwmon directory",
                "not found; amdgpu lists it under <card>/device/hwmon",
            )
        })?;
        Ok(SysfsPowerLimit {
            file: dir.join("power1_cap"),
        })
    }
}

impl PowerLimit for SysfsPowerLimit {
    fn name(&self) -> String {
        self.file.display().to_string()
    }

    fn current_w(&self) -> Result<u32, PowerLimitError> {
        let text = std::fs::read_to_string(&self.file)
            .map_err(|e| PowerLimitError::new(&self.name(), e))?;
        let micro: u64 = text.trim().parse().map_err(|_| {
            PowerLimitError::new(&self.name(), format!("{:?} is not microwatts", text.trim()))
        })?;
        Ok(u32::try_from(micro / 1_000_000).unwrap_or(u32::MAX))
    }

    fn set_w(&self, watts: u32) -> Result<(), PowerLimitError> {
        std::fs::write(&self.file, format!("{}\n", u64::from(watts) * 1_000_000))
            .map_err(|e| PowerLimitError::new(&self.name(), e))
    }
}

/// A power limit in memory that records every call: the fake the power
/// cap's tests run against.
#[derive(Debug, Default)]
pub struct RecordedPowerLimit {
    state: Mutex<(u32, Vec<String>)>,
    /// Sets fail with this reason while it is `Some`.
    pub fail_sets: Mutex<Option<String>>,
}

impl RecordedPowerLimit {
    /// A limit of `watts`.
    pub fn new(watts: u32) -> Self {
        RecordedPowerLimit {
            state: Mutex::new((watts, Vec::new())),
            fail_sets: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u32, Vec<String>)> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The calls so far: `set 150`, in order.
    pub fn calls(&self) -> Vec<String> {
        self.lock().1.clone()
    }

    /// The limit now.
    pub fn watts(&self) -> u32 {
        self.lock().0
    }
}

impl PowerLimit for RecordedPowerLimit {
    fn name(&self) -> String {
        "a recorded power limit".to_owned()
    }

    fn current_w(&self) -> Result<u32, PowerLimitError> {
        Ok(self.watts())
    }

    fn set_w(&self, watts: u32) -> Result<(), PowerLimitError> {
        let failing = self
            .fail_sets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut state = self.lock();
        state.1.push(format!("set {watts}"));
        if let Some(reason) = failing {
            return Err(PowerLimitError::new("a recorded power limit", reason));
        }
        state.0 = watts;
        Ok(())
    }
}
