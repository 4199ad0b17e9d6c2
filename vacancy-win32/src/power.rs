//! What the machine runs on: `GetSystemPowerStatus`, for `[owner]
//! on_battery = "pause"` (issue 35 item 2). vacancy decides from the two
//! fields (`vacancy::sample::windows_power_source`), so the decision is
//! tested on every system.

use std::io;

use windows_sys::Win32::System::Power::{GetSystemPowerStatus, SYSTEM_POWER_STATUS};

/// The two fields of `SYSTEM_POWER_STATUS` that say what the machine runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PowerStatus {
    /// `ACLineStatus`: 0 offline, 1 online, 255 unknown.
    pub ac_line_status: u8,
    /// `BatteryFlag`: bits 1 high, 2 low, 4 critical, 8 charging, 128 no
    /// system battery; 255 unknown.
    pub battery_flag: u8,
}

/// The system's power status now.
///
/// # Errors
///
/// The operating system's error when the call fails.
pub fn system_power_status() -> io::Result<PowerStatus> {
    let mut status = SYSTEM_POWER_STATUS {
        ACLineStatus: 255,
        BatteryFlag: 255,
        BatteryLifePercent: 255,
        SystemStatusFlag: 0,
        BatteryLifeTime: u32::MAX,
        BatteryFullLifeTime: u32::MAX,
    };
    // SAFETY: `status` is a valid, writable SYSTEM_POWER_STATUS that
    // outlives the call.
    if unsafe { GetSystemPowerStatus(&mut status) } == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PowerStatus {
        ac_line_status: status.ACLineStatus,
        battery_flag: status.BatteryFlag,
    })
}
