//! Attributed GPU pressure (an extension beyond the seed, off by default).
//!
//! With `[owner.gpu_pressure] enabled = true`, each GPU resource gets a
//! [`PressureTracker`]: the owner's own load on the GPU (every process but
//! the lent upstream servers, read by a [`PressureReader`]) is compared with
//! a calibrated baseline ([`CalibrationFile`]) for whether the owner is
//! present. Load well above the baseline refuses new work on that GPU and
//! reclaims the work depending on it (PRES-01..13). With pressure disabled, a
//! GPU is limited only by its free memory (SCOPE-09).
//!
//! The tracker is sans-IO; the readers ([`NvmlPressureReader`],
//! [`ScriptedReader`] for tests) and the calibration file are the IO.

mod calibration;
mod nvml;
mod reader;

pub use crate::engine::pressure::{
    Attendance, Baseline, Miss, Observation, OwnerLoad, PressureParams, PressureReading,
    PressureTracker, PressureUpdate, Trigger, TriggerKind,
};
pub use calibration::{CALIBRATION_FILE, CalibrationError, CalibrationFile, calibrate};
pub use nvml::NvmlPressureReader;
pub use reader::{PressureError, PressureReader, ScriptedReader, UnavailableReader, server_pids};
