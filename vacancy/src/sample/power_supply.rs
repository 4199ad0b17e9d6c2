//! What the machine runs on, for `[owner] on_battery = "pause"` (issue 35
//! item 2): Linux's `/sys/class/power_supply`; Windows' `GetSystemPowerStatus`
//! behind the platform seam.

use std::path::{Path, PathBuf};

use crate::engine::PowerSource;

/// Where the machine's power comes from.
pub trait PowerSupply: Send + Sync {
    /// What is read, for logs (a directory, an API).
    fn name(&self) -> String;
    /// Read it now. Blocking: call it on a blocking thread.
    fn read(&self) -> PowerSource;
}

/// The power supplies the Linux kernel lists under
/// `/sys/class/power_supply` (a test points it at a fake tree).
///
/// # Behavior
///
/// - On mains when any `Mains` or `USB*` supply reports `online` = 1.
/// - Otherwise on battery when a system battery (`type` = `Battery`, its
///   `scope` not `Device`: a mouse's battery is not the machine's) reports
///   `status` = `Discharging`, or when the machine has an external supply and
///   none is online.
/// - A machine with no system battery is on mains (a desktop).
/// - A supply whose `type`, `online` or `status` cannot be read, or a
///   directory that cannot be listed, is unknown: it refuses like the
///   battery, never counts as mains.
#[derive(Debug, Clone)]
pub struct SysfsPowerSupply {
    dir: PathBuf,
}

impl SysfsPowerSupply {
    /// Where the kernel lists power supplies.
    pub const DEFAULT_DIR: &'static str = "/sys/class/power_supply";

    /// A reader of the supplies listed in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        SysfsPowerSupply { dir: dir.into() }
    }

    fn read_in(&self) -> Result<PowerSource, String> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| format!("cannot list {}: {e}", self.dir.display()))?;
        let mut names: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
        names.sort();
        let mut external = 0usize;
        let mut online = false;
        let mut battery = false;
        let mut discharging = false;
        for supply in &names {
            let kind = attribute(supply, "type")?;
            match kind.as_str() {
                "Mains" | "USB" | "USB_C" | "USB_PD" | "USB_PD_DRP" | "USB_DCP" | "USB_CDP"
                | "USB_ACA" | "BrickID" | "Wireless" => {
                    external += 1;
                    if attribute(supply, "online")? == "1" {
                        online = true;
                    }
                }
                "Battery" => {
                    if optional_attribute(supply, "scope").as_deref() == Some("Device") {
                        continue; // a peripheral's battery
                    }
                    battery = true;
                    if attribute(supply, "status")? == "Discharging" {
                        discharging = true;
                    }
                }
                _ => {} // UPS and others: not this machine's own supply
            }
        }
        Ok(if online || !battery {
            PowerSource::Mains
        } else if discharging || external > 0 {
            PowerSource::Battery
        } else {
            // A battery that is not discharging and no external supply
            // listed: charging or full from a supply the kernel does not show.
            PowerSource::Mains
        })
    }
}

/// One attribute file, trimmed; an error names it.
fn attribute(supply: &Path, name: &str) -> Result<String, String> {
    let path = supply.join(name);
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn optional_attribute(supply: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(supply.join(name))
        .ok()
        .map(|s| s.trim().to_owned())
}

impl PowerSupply for SysfsPowerSupply {
    fn name(&self) -> String {
        self.dir.display().to_string()
    }

    fn read(&self) -> PowerSource {
        self.read_in().unwrap_or_else(PowerSource::Unknown)
    }
}

/// What the machine runs on, from the two fields of Windows'
/// `SYSTEM_POWER_STATUS` (`GetSystemPowerStatus`): `ACLineStatus` (0
/// offline, 1 online, 255 unknown) and `BatteryFlag` (128: no system
/// battery). The same rules as [`SysfsPowerSupply`]: no battery is mains,
/// and what Windows does not know is unknown, which refuses like the battery.
pub fn windows_power_source(ac_line_status: u8, battery_flag: u8) -> PowerSource {
    const NO_SYSTEM_BATTERY: u8 = 128;
    if battery_flag != 255 && battery_flag & NO_SYSTEM_BATTERY != 0 {
        return PowerSource::Mains;
    }
    match ac_line_status {
        1 => PowerSource::Mains,
        0 => PowerSource::Battery,
        other => PowerSource::Unknown(format!(
            "Windows does not know whether the machine is on AC power (GetSystemPowerStatus: ACLineStatus {other})"
        )),
    }
}

/// Windows' power status (`GetSystemPowerStatus`, through the platform
/// seam's Win32 crate), decided by [`windows_power_source`].
#[cfg(windows)]
#[derive(Debug, Clone, Default)]
pub struct WindowsPowerStatus;

#[cfg(windows)]
impl PowerSupply for WindowsPowerStatus {
    fn name(&self) -> String {
        "GetSystemPowerStatus".to_owned()
    }

    fn read(&self) -> PowerSource {
        match vacancy_win32::power::system_power_status() {
            Ok(s) => windows_power_source(s.ac_line_status, s.battery_flag),
            Err(e) => PowerSource::Unknown(format!("GetSystemPowerStatus failed: {e}")),
        }
    }
}

/// The machine's power supply reader: sysfs under `dir` on Linux and other
/// Unix systems, `GetSystemPowerStatus` on Windows.
pub fn system_power_supply(dir: &str) -> Box<dyn PowerSupply> {
    #[cfg(windows)]
    {
        let _ = dir;
        Box::new(WindowsPowerStatus)
    }
    #[cfg(not(windows))]
    Box::new(SysfsPowerSupply::new(dir))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A fake `/sys/class/power_supply` with `supplies` of `(name, [(attribute, value)])`.
    fn tree(supplies: &[(&str, &[(&str, &str)])]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for (name, attributes) in supplies {
            let dir = root.path().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            for (attribute, value) in *attributes {
                std::fs::write(dir.join(attribute), format!("{value}\n")).unwrap();
            }
        }
        root
    }

    fn read(root: &tempfile::TempDir) -> PowerSource {
        SysfsPowerSupply::new(root.path()).read()
    }

    const AC_ON: (&str, &[(&str, &str)]) = ("AC", &[("type", "Mains"), ("online", "1")]);
    const AC_OFF: (&str, &[(&str, &str)]) = ("AC", &[("type", "Mains"), ("online", "0")]);

    #[test]
    fn a_laptop_is_on_battery_when_unplugged_and_on_mains_when_plugged_in() {
        let bat = (
            "BAT0",
            &[
                ("type", "Battery"),
                ("status", "Discharging"),
                ("scope", "System"),
            ][..],
        );
        assert_eq!(read(&tree(&[AC_OFF, bat])), PowerSource::Battery);
        let charging = ("BAT0", &[("type", "Battery"), ("status", "Charging")][..]);
        assert_eq!(read(&tree(&[AC_ON, charging])), PowerSource::Mains);
        // Unplugged at full charge: the battery may say "Not charging".
        let full = (
            "BAT0",
            &[("type", "Battery"), ("status", "Not charging")][..],
        );
        assert_eq!(read(&tree(&[AC_OFF, full])), PowerSource::Battery);
    }

    #[test]
    fn a_machine_without_a_battery_is_on_mains() {
        assert_eq!(read(&tree(&[])), PowerSource::Mains);
        assert_eq!(
            read(&tree(&[AC_OFF])),
            PowerSource::Mains,
            "no battery: a desktop's odd AC entry"
        );
        // A wireless mouse's battery is not the machine's.
        let mouse = (
            "hidpp_battery_0",
            &[
                ("type", "Battery"),
                ("scope", "Device"),
                ("status", "Discharging"),
            ][..],
        );
        assert_eq!(read(&tree(&[mouse])), PowerSource::Mains);
    }

    #[test]
    fn windows_power_status_decides_like_sysfs() {
        // ACLineStatus 1 online, 0 offline, 255 unknown; BatteryFlag 128 no battery.
        assert_eq!(windows_power_source(1, 8), PowerSource::Mains);
        assert_eq!(windows_power_source(0, 1), PowerSource::Battery);
        assert_eq!(windows_power_source(0, 2 | 8), PowerSource::Battery);
        assert_eq!(
            windows_power_source(255, 128),
            PowerSource::Mains,
            "a desktop"
        );
        assert_eq!(windows_power_source(0, 128), PowerSource::Mains);
        assert!(matches!(
            windows_power_source(255, 1),
            PowerSource::Unknown(ref w) if w.contains("ACLineStatus 255")
        ));
        assert!(
            matches!(windows_power_source(255, 255), PowerSource::Unknown(_)),
            "BatteryFlag 255 is unknown, not \"no battery\""
        );
    }

    #[test]
    fn an_unreadable_supply_is_unknown_never_mains() {
        let no_status = ("BAT0", &[("type", "Battery")][..]);
        let PowerSource::Unknown(why) = read(&tree(&[AC_OFF, no_status])) else {
            panic!("expected unknown");
        };
        assert!(why.contains("BAT0/status"), "{why}");
        let no_online = ("AC", &[("type", "Mains")][..]);
        assert!(matches!(read(&tree(&[no_online])), PowerSource::Unknown(_)));
        let missing = SysfsPowerSupply::new("/nonexistent/power_supply").read();
        assert!(
            matches!(missing, PowerSource::Unknown(ref w) if w.contains("cannot list")),
            "{missing:?}"
        );
    }
}
