//! The power cap (`[[resource]] power_cap_w`, issue 35 item 3): a GPU's
//! power limit is lowered while borrowed work holds it and restored when
//! the work ends (by itself or by a reclaim), at shutdown, and at the next
//! start after a crash.
//!
//! The original limit is recorded durably, in the recovery directory
//! through the ledger's atomic writer, *before* the limit is lowered, and
//! the record is removed only after the original is set again: whatever
//! kills vacancyd in between, the next start finds the record and restores.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::ledger::disk::{RealDisk, write_atomically};
use crate::sample::PowerLimit;
use crate::shell::state::lender::Lender;
use crate::shell::state::shutdown::stopped;

/// How often the loop looks when nothing wakes it.
const CHECK_EVERY: Duration = Duration::from_millis(250);

/// The record of a lowered limit: what to restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapRecord {
    /// The GPU resource.
    pub resource: String,
    /// What was lowered (a file, a device).
    pub control: String,
    /// The limit before it was lowered, in watts.
    pub original_w: u32,
    /// The cap set, in watts.
    pub cap_w: u32,
}

/// One GPU's power cap.
pub struct PowerCap {
    resource: String,
    cap_w: u32,
    control: Arc<dyn PowerLimit>,
    record: PathBuf,
}

impl std::fmt::Debug for PowerCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerCap")
            .field("resource", &self.resource)
            .field("cap_w", &self.cap_w)
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

/// The record's path for `resource` in the recovery directory `state_dir`.
pub fn record_path(state_dir: &Path, resource: &str) -> PathBuf {
    state_dir.join(format!("power-cap-{resource}.json"))
}

impl PowerCap {
    /// The cap of `resource` at `cap_w` through `control`, recorded in the
    /// recovery directory `state_dir`.
    pub fn new(resource: &str, cap_w: u32, control: Arc<dyn PowerLimit>, state_dir: &Path) -> Self {
        PowerCap {
            resource: resource.to_owned(),
            cap_w,
            control,
            record: record_path(state_dir, resource),
        }
    }

    /// The GPU resource.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    fn read_record(&self) -> Result<Option<CapRecord>, String> {
        match std::fs::read(&self.record) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| format!("{} is not a power-cap record: {e}", self.record.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("cannot read {}: {e}", self.record.display())),
        }
    }

    /// Lower the limit to the cap: first record the original durably (or
    /// keep the record already there: the original is the one before any
    /// cap), then set the cap. Blocking.
    ///
    /// # Errors
    ///
    /// The limit cannot be read or set (no rights, no device) or the record
    /// cannot be written; nothing is lowered without its record.
    pub fn apply(&self) -> Result<CapRecord, String> {
        let record = match self.read_record()? {
            Some(r) => r,
            None => {
                let original_w = self.control.current_w().map_err(|e| e.to_string())?;
                let r = CapRecord {
                    resource: self.resource.clone(),
                    control: self.control.name(),
                    original_w,
                    cap_w: self.cap_w,
                };
                let mut text = serde_json::to_string(&r).map_err(|e| e.to_string())?;
                text.push('\n');
                write_atomically(&RealDisk, &self.record, text.as_bytes())
                    .map_err(|e| format!("cannot record the original power limit: {e}"))?;
                r
            }
        };
        self.control.set_w(self.cap_w).map_err(|e| e.to_string())?;
        Ok(record)
    }

    /// Set the recorded original again and remove the record; `Ok(None)`
    /// when no record is there (nothing was lowered). Blocking.
    ///
    /// # Errors
    ///
    /// The record cannot be read or the limit set: the record stays, so a
    /// later restore (or the next start) tries again.
    pub fn restore(&self) -> Result<Option<CapRecord>, String> {
        let Some(record) = self.read_record()? else {
            return Ok(None);
        };
        self.control
            .set_w(record.original_w)
            .map_err(|e| e.to_string())?;
        std::fs::remove_file(&self.record)
            .map_err(|e| format!("restored, but cannot remove {}: {e}", self.record.display()))?;
        Ok(Some(record))
    }
}

/// At start, before any work is admitted: restore every limit a crash left
/// lowered (its record is still there), and warn about records of GPUs
/// that no longer have a cap configured (kept, to be restored by hand or
/// once the cap is configured again).
pub fn restore_after_crash(caps: &[PowerCap], state_dir: &Path) {
    for cap in caps {
        match cap.restore() {
            Ok(Some(r)) => {
                warn!(resource = %r.resource, control = %r.control, original_w = r.original_w, cap_w = r.cap_w, "restored a GPU power limit that a crash left lowered")
            }
            Ok(None) => {}
            Err(e) => {
                warn!(resource = %cap.resource, error = %e, "cannot restore a GPU power limit a crash left lowered; it stays recorded and is tried again")
            }
        }
    }
    let Ok(entries) = std::fs::read_dir(state_dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(resource) = name
            .strip_prefix("power-cap-")
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        if !caps.iter().any(|c| c.resource == resource) {
            warn!(resource, record = %entry.path().display(), "a GPU power limit was left lowered for a resource with no power_cap_w now; set the original in the record again by hand, or configure power_cap_w again so vacancyd restores it");
        }
    }
}

/// Follow the work on each capped GPU until `shutdown`: lower the limit
/// when work holds the GPU, restore it when none does, and restore every
/// lowered limit at shutdown.
pub async fn power_cap_loop(
    lender: Arc<Lender>,
    caps: Vec<PowerCap>,
    mut shutdown: watch::Receiver<bool>,
) {
    let caps: Vec<Arc<PowerCap>> = caps.into_iter().map(Arc::new).collect();
    let mut capped = vec![false; caps.len()];
    let mut warned = vec![false; caps.len()];
    loop {
        let changed = lender.work_changed().notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        for (i, cap) in caps.iter().enumerate() {
            let held = lender.resource_held(&cap.resource);
            if held && !capped[i] {
                match blocking(cap, PowerCap::apply).await {
                    Ok(r) => {
                        info!(resource = %cap.resource, original_w = r.original_w, cap_w = r.cap_w, "GPU power limit lowered while borrowed work runs");
                        lender.metrics().power_capped(&cap.resource, Some(r.cap_w));
                        capped[i] = true;
                        warned[i] = false;
                    }
                    Err(e) if !warned[i] => {
                        warn!(resource = %cap.resource, error = %e, "cannot lower the GPU power limit; borrowed work runs at the GPU's own limit (power_cap_w needs the rights to set it)");
                        warned[i] = true;
                    }
                    Err(_) => {}
                }
            } else if !held && capped[i] {
                restore_one(&lender, cap, &mut capped[i]).await;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(CHECK_EVERY) => {}
            () = &mut changed => {}
            () = stopped(&mut shutdown) => {
                for (i, cap) in caps.iter().enumerate() {
                    if capped[i] {
                        restore_one(&lender, cap, &mut capped[i]).await;
                    }
                }
                return;
            }
        }
    }
}

async fn restore_one(lender: &Lender, cap: &Arc<PowerCap>, capped: &mut bool) {
    match blocking(cap, PowerCap::restore).await {
        Ok(r) => {
            info!(resource = %cap.resource, original_w = r.map(|r| r.original_w), "GPU power limit restored");
            lender.metrics().power_capped(&cap.resource, None);
            *capped = false;
        }
        Err(e) => {
            warn!(resource = %cap.resource, error = %e, "cannot restore the GPU power limit; tried again shortly and at the next start");
        }
    }
}

async fn blocking<T: Send + 'static>(
    cap: &Arc<PowerCap>,
    f: fn(&PowerCap) -> Result<T, String>,
) -> Result<T, String> {
    let cap = Arc::clone(cap);
    tokio::task::spawn_blocking(move || f(&cap))
        .await
        .map_err(|e| format!("the power-limit call failed: {e}"))?
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::sample::RecordedPowerLimit;

    #[test]
    fn the_original_is_on_disk_before_the_limit_is_lowered_and_restored_after() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Arc::new(RecordedPowerLimit::new(300));
        let cap = PowerCap::new("gpu0", 150, fake.clone(), dir.path());
        // A failing set leaves the record: the original is known first.
        *fake.fail_sets.lock().unwrap() = Some("permission denied".to_owned());
        assert!(cap.apply().unwrap_err().contains("permission denied"));
        let record: CapRecord =
            serde_json::from_slice(&std::fs::read(record_path(dir.path(), "gpu0")).unwrap())
                .unwrap();
        assert_eq!((record.original_w, record.cap_w), (300, 150));
        *fake.fail_sets.lock().unwrap() = None;
        cap.apply().unwrap();
        assert_eq!(fake.watts(), 150);
        // Applying again keeps the first original, never the cap.
        cap.apply().unwrap();
        assert_eq!(cap.restore().unwrap().unwrap().original_w, 300);
        assert_eq!(fake.watts(), 300);
        assert!(!record_path(dir.path(), "gpu0").exists());
        assert_eq!(cap.restore().unwrap(), None, "nothing to restore twice");
        assert_eq!(fake.calls(), ["set 150", "set 150", "set 150", "set 300"]);
    }

    #[test]
    fn a_record_left_by_a_crash_is_restored_at_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let before = Arc::new(RecordedPowerLimit::new(280));
        PowerCap::new("gpu0", 120, before.clone(), dir.path())
            .apply()
            .unwrap();
        assert_eq!(before.watts(), 120);
        // The next process: the GPU still at the cap.
        let after = Arc::new(RecordedPowerLimit::new(120));
        let caps = [PowerCap::new("gpu0", 120, after.clone(), dir.path())];
        restore_after_crash(&caps, dir.path());
        assert_eq!(after.watts(), 280);
        assert_eq!(after.calls(), ["set 280"]);
        assert!(!record_path(dir.path(), "gpu0").exists());
    }
}
