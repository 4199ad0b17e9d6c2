//! AMD GPU memory from the amdgpu driver's sysfs files.

use std::path::{Path, PathBuf};

use async_trait::async_trait;

use super::file_reads::FileReads;
use super::{Hwmon, mib};
use crate::engine::HeatLimits;
use crate::time::MonotonicClock;
use crate::traits::resource::{CapacitySample, Resource, ResourceKind, SampleError};

/// An AMD GPU (`sampler = "amdgpu"`), read from
/// `<sysfs_root>/<card>/device/mem_info_{vram,gtt}_{total,used}`.
///
/// # Behavior
///
/// - Free is `vram_total - vram_used`; with `include_gtt`, GTT (system memory
///   the GPU maps, which is where an APU's models mostly live) is added to both
///   free and total.
/// - Each file must hold a decimal byte count; an unreadable file, garbage,
///   `used > total`, or a total of 0 is an error naming the file.
/// - The files are read one after another, not atomically; the driver keeps
///   them current, so the skew is the time of a few small reads.
#[derive(Debug)]
pub struct AmdGpu {
    name: String,
    device_dir: PathBuf,
    /// sysfs is read on the calling thread (a fake tree in tests wherever it is).
    reads: FileReads,
    include_gtt: bool,
    clock: MonotonicClock,
    /// The heat and power limits whose readings each sample carries (issue 35).
    heat: Option<HeatLimits>,
}

impl AmdGpu {
    /// Where the kernel lists DRM cards; tests pass a fake tree instead.
    pub const DEFAULT_SYSFS_ROOT: &'static str = "/sys/class/drm";

    /// A sampler for the resource `name` reading card `card` (e.g. `card0`)
    /// under `sysfs_root` (normally [`AmdGpu::DEFAULT_SYSFS_ROOT`]).
    ///
    /// # Errors
    ///
    /// [`SampleError::Unavailable`] when `card` is not a plain name (empty,
    /// `.`/`..`, or containing a path separator): the name comes from
    /// configuration and must not reach outside the sysfs tree.
    pub fn new(
        name: impl Into<String>,
        sysfs_root: impl AsRef<Path>,
        card: &str,
        include_gtt: bool,
        clock: MonotonicClock,
    ) -> Result<Self, SampleError> {
        let name = name.into();
        let plain =
            !card.is_empty() && card != "." && card != ".." && !card.contains(['/', '\\', '\0']);
        if !plain {
            return Err(SampleError::Unavailable(format!(
                "resource {name}: amdgpu device {card:?} is not a card name; \
                 use a plain name such as \"card0\" (see /sys/class/drm)"
            )));
        }
        let device_dir = sysfs_root.as_ref().join(card).join("device");
        Ok(AmdGpu {
            name,
            reads: FileReads::in_dir(sysfs_root.as_ref()),
            device_dir,
            include_gtt,
            clock,
            heat: None,
        })
    }

    /// The same sampler, reading with each sample the hwmon values `limits`
    /// need (temperature, power, fan; issue 35).
    pub fn with_heat_limits(mut self, limits: Option<HeatLimits>) -> Self {
        self.heat = limits;
        self
    }

    /// The card's hwmon files.
    pub fn hwmon(&self) -> Hwmon {
        Hwmon::with_reads(&self.device_dir, self.reads)
    }

    /// Read one `mem_info_*` file as a byte count.
    async fn read_bytes(&self, file: &str) -> Result<u64, SampleError> {
        let path = self.device_dir.join(file);
        let text = self
            .reads
            .read_to_string(&path)
            .await
            .map_err(|e| SampleError::Unreadable {
                source_name: path.display().to_string(),
                reason: e.to_string(),
            })?;
        text.trim()
            .parse::<u64>()
            .map_err(|e| SampleError::Malformed {
                source_name: path.display().to_string(),
                reason: format!(
                    "expected a decimal byte count, found {:?}: {e}",
                    text.trim()
                ),
            })
    }

    /// Read `mem_info_<pool>_total` and `_used`; return `(free, total)` in bytes.
    async fn read_pool(&self, pool: &str) -> Result<(u64, u64), SampleError> {
        let total = self.read_bytes(&format!("mem_info_{pool}_total")).await?;
        let used_file = format!("mem_info_{pool}_used");
        let used = self.read_bytes(&used_file).await?;
        let free = total
            .checked_sub(used)
            .ok_or_else(|| SampleError::Malformed {
                source_name: self.device_dir.join(&used_file).display().to_string(),
                reason: format!("{pool} used ({used} bytes) exceeds {pool} total ({total} bytes)"),
            })?;
        Ok((free, total))
    }

    fn malformed(&self, reason: &str) -> SampleError {
        SampleError::Malformed {
            source_name: self.device_dir.display().to_string(),
            reason: reason.to_string(),
        }
    }
}

#[async_trait]
impl Resource for AmdGpu {
    fn id(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> ResourceKind {
        ResourceKind::Gpu
    }

    async fn sample(&self) -> Result<CapacitySample, SampleError> {
        let taken_at = self.clock.now();
        let (mut free, mut total) = self.read_pool("vram").await?;
        if self.include_gtt {
            let (gtt_free, gtt_total) = self.read_pool("gtt").await?;
            // used <= total for each pool, so free cannot overflow if total does not.
            total = total
                .checked_add(gtt_total)
                .ok_or_else(|| self.malformed("vram + gtt total overflows"))?;
            free += gtt_free;
        }
        if total == 0 {
            return Err(self.malformed("total memory is 0"));
        }
        let sample = CapacitySample::memory(mib(free), mib(total), taken_at);
        Ok(match &self.heat {
            Some(limits) => sample.with_heat(self.hwmon().read(limits).await),
            None => sample,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    /// A fake `/sys/class/drm` holding `card0` with the given files.
    fn fake_sysfs<S: AsRef<[u8]>>(files: &[(&str, S)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let device = root.path().join("card0").join("device");
        std::fs::create_dir_all(&device).unwrap();
        for (name, contents) in files {
            std::fs::write(device.join(name), contents).unwrap();
        }
        root
    }

    fn gpu(root: &tempfile::TempDir, include_gtt: bool) -> AmdGpu {
        AmdGpu::new(
            "gpu0",
            root.path(),
            "card0",
            include_gtt,
            MonotonicClock::new(),
        )
        .unwrap()
    }

    fn vram(total_mib: u64, used_mib: u64) -> [(&'static str, String); 2] {
        [
            ("mem_info_vram_total", format!("{}\n", total_mib * MIB)),
            ("mem_info_vram_used", format!("{}\n", used_mib * MIB)),
        ]
    }

    #[tokio::test(flavor = "current_thread")]
    async fn reads_vram() {
        let root = fake_sysfs(&vram(16384, 4096));
        let clock = MonotonicClock::new();
        let gpu = AmdGpu::new("gpu0", root.path(), "card0", false, clock).unwrap();
        assert_eq!(gpu.id(), "gpu0");
        assert_eq!(gpu.kind(), ResourceKind::Gpu);

        let before = clock.now();
        let sample = gpu.sample().await.unwrap();
        let after = clock.now();
        assert_eq!(
            (sample.free_mib, sample.total_mib, sample.busy_pct),
            (12288, 16384, None)
        );
        assert!(before <= sample.taken_at && sample.taken_at <= after);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn adds_gtt_when_asked() {
        let mut owned = vram(512, 256).to_vec();
        owned.push(("mem_info_gtt_total", format!("{}\n", 30000 * MIB)));
        owned.push(("mem_info_gtt_used", format!("{}\n", 10000 * MIB)));
        let root = fake_sysfs(&owned);

        let with = gpu(&root, true).sample().await.unwrap();
        assert_eq!((with.free_mib, with.total_mib), (256 + 20000, 512 + 30000));
        let without = gpu(&root, false).sample().await.unwrap();
        assert_eq!((without.free_mib, without.total_mib), (256, 512));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn missing_file_names_it() {
        let root = fake_sysfs(&vram(512, 256));
        let err = gpu(&root, true).sample().await.unwrap_err();
        assert!(matches!(err, SampleError::Unreadable { .. }), "{err:?}");
        assert!(err.to_string().contains("mem_info_gtt_total"), "{err}");

        let root = fake_sysfs(&[("mem_info_vram_total", "1024\n")]);
        let err = gpu(&root, false).sample().await.unwrap_err();
        assert!(err.to_string().contains("mem_info_vram_used"), "{err}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn missing_card_is_unreadable() {
        let root = fake_sysfs(&vram(512, 256));
        let other =
            AmdGpu::new("gpu1", root.path(), "card1", false, MonotonicClock::new()).unwrap();
        let err = other.sample().await.unwrap_err();
        assert!(matches!(err, SampleError::Unreadable { .. }), "{err:?}");
        assert!(err.to_string().contains("card1"), "{err}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn garbage_is_malformed() {
        for garbage in ["", "lots\n", "-5\n", "1.5\n", "0x100\n"] {
            let root = fake_sysfs(&[
                ("mem_info_vram_total", garbage),
                ("mem_info_vram_used", "0\n"),
            ]);
            let err = gpu(&root, false).sample().await.unwrap_err();
            assert!(
                matches!(err, SampleError::Malformed { .. }),
                "{garbage:?}: {err:?}"
            );
            assert!(err.to_string().contains("mem_info_vram_total"), "{err}");
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn used_above_total_is_malformed() {
        let root = fake_sysfs(&vram(512, 513));
        let err = gpu(&root, false).sample().await.unwrap_err();
        assert!(matches!(err, SampleError::Malformed { .. }), "{err:?}");
        assert!(err.to_string().contains("exceeds"), "{err}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn zero_total_is_malformed() {
        let root = fake_sysfs(&[
            ("mem_info_vram_total", "0\n"),
            ("mem_info_vram_used", "0\n"),
        ]);
        let err = gpu(&root, false).sample().await.unwrap_err();
        assert!(matches!(err, SampleError::Malformed { .. }), "{err:?}");
    }

    #[test]
    fn card_must_be_a_plain_name() {
        for bad in ["", ".", "..", "card0/..", "../card0", "/card0", "a\\b"] {
            let err = AmdGpu::new("gpu0", "/sys/class/drm", bad, false, MonotonicClock::new())
                .unwrap_err();
            assert!(
                matches!(err, SampleError::Unavailable(_)),
                "{bad:?}: {err:?}"
            );
        }
        assert!(
            AmdGpu::new(
                "gpu0",
                AmdGpu::DEFAULT_SYSFS_ROOT,
                "card0",
                false,
                MonotonicClock::new()
            )
            .is_ok()
        );
    }
}
