//! An AMD GPU's temperature, power draw and fan from the hwmon files under
//! its sysfs device (`<card>/device/hwmon/hwmonN/`, issue 35 item 3).

use std::path::{Path, PathBuf};

use super::file_reads::FileReads;
use crate::engine::{HeatLimits, HeatReading};

/// The hwmon directory of one DRM card's device.
///
/// # Behavior
///
/// - The first `hwmon*` directory under `<device>/hwmon` (in name order) is
///   read; amdgpu registers one per card.
/// - `temp1_input` (the edge sensor, millidegrees Celsius), `power1_average`
///   or else `power1_input` (microwatts) and `pwm1` (0..=255, or up to
///   `pwm1_max`) are read, each only where a limit needs it.
/// - A file that is missing or holds no number is no reading: the engine
///   counts it as unknown, not cool, and refuses.
#[derive(Debug, Clone)]
pub struct Hwmon {
    device_dir: PathBuf,
    reads: FileReads,
}

impl Hwmon {
    /// The hwmon files of the card whose device directory is `device_dir`
    /// (`/sys/class/drm/card0/device`).
    pub fn new(device_dir: impl Into<PathBuf>) -> Self {
        let device_dir = device_dir.into();
        Hwmon {
            reads: FileReads::in_dir(&device_dir),
            device_dir,
        }
    }

    /// The same, read as its card's memory files are.
    pub(crate) fn with_reads(device_dir: impl Into<PathBuf>, reads: FileReads) -> Self {
        Hwmon {
            device_dir: device_dir.into(),
            reads,
        }
    }

    /// The hwmon directory, if the device has one.
    pub fn dir(&self) -> Option<PathBuf> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(self.device_dir.join("hwmon"))
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("hwmon"))
            })
            .collect();
        dirs.sort();
        dirs.into_iter().next()
    }

    /// The readings `limits` need, each `None` where it cannot be read.
    pub async fn read(&self, limits: &HeatLimits) -> HeatReading {
        let Some(dir) = self.dir() else {
            return HeatReading::default();
        };
        let mut reading = HeatReading::default();
        if limits.temperature.is_some() {
            reading.temperature_c = number(self.reads, &dir, "temp1_input")
                .await
                .map(|m| u32::try_from(m.div_ceil(1000)).unwrap_or(u32::MAX));
        }
        if limits.max_power_w.is_some() {
            let micro = match number(self.reads, &dir, "power1_average").await {
                Some(v) => Some(v),
                None => number(self.reads, &dir, "power1_input").await,
            };
            reading.power_w =
                micro.map(|uw| u32::try_from(uw.div_ceil(1_000_000)).unwrap_or(u32::MAX));
        }
        if limits.max_fan_percent.is_some() {
            let max = number(self.reads, &dir, "pwm1_max")
                .await
                .unwrap_or(255)
                .max(1);
            reading.fan_percent = number(self.reads, &dir, "pwm1")
                .await
                .map(|pwm| u8::try_from((pwm.min(max) * 100).div_ceil(max)).unwrap_or(100));
        }
        reading
    }
}

/// One hwmon file as a non-negative integer; `None` when missing or not one.
async fn number(reads: FileReads, dir: &Path, file: &str) -> Option<u64> {
    let text = reads.read_to_string(&dir.join(file)).await.ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn all() -> HeatLimits {
        HeatLimits {
            temperature: Some((80, 75)),
            max_power_w: Some(200),
            max_fan_percent: Some(70),
            hot_for: Duration::from_secs(30),
        }
    }

    fn device(files: &[(&str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("hwmon").join("hwmon3");
        std::fs::create_dir_all(&dir).unwrap();
        for (name, value) in files {
            std::fs::write(dir.join(name), format!("{value}\n")).unwrap();
        }
        root
    }

    #[tokio::test(flavor = "current_thread")]
    async fn reads_temperature_power_and_fan_in_whole_units_rounded_up() {
        let root = device(&[
            ("temp1_input", "61500"),
            ("power1_average", "150000001"),
            ("pwm1", "128"),
        ]);
        let r = Hwmon::new(root.path()).read(&all()).await;
        assert_eq!(r.temperature_c, Some(62), "61.5 °C never reads as cooler");
        assert_eq!(r.power_w, Some(151));
        assert_eq!(r.fan_percent, Some(51));
        // power1_input where there is no average.
        let root = device(&[("power1_input", "90000000")]);
        assert_eq!(Hwmon::new(root.path()).read(&all()).await.power_w, Some(90));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_missing_or_garbled_file_is_no_reading() {
        let root = device(&[("temp1_input", "hot")]);
        let r = Hwmon::new(root.path()).read(&all()).await;
        assert_eq!(r, HeatReading::default());
        let none = tempfile::tempdir().unwrap();
        assert_eq!(
            Hwmon::new(none.path()).read(&all()).await,
            HeatReading::default()
        );
        assert!(Hwmon::new(none.path()).dir().is_none());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn only_what_a_limit_needs_is_read() {
        let root = device(&[("temp1_input", "50000"), ("power1_average", "1000000")]);
        let only_temperature = HeatLimits {
            max_power_w: None,
            max_fan_percent: None,
            ..all()
        };
        let r = Hwmon::new(root.path()).read(&only_temperature).await;
        assert_eq!((r.temperature_c, r.power_w), (Some(50), None));
    }
}
