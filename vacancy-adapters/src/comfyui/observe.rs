//! What ComfyUI shows: its release and allocator memory (`/system_stats`)
//! and how many prompts it holds (`GET /prompt`, without the queue itself).

use serde_json::Value;
use vacancy::engine::{ModelObservation, VisibleWork};
use vacancy::traits::ObserveError;

use super::version::reported_version;
use super::{ComfyUiAdapter, lock};

impl ComfyUiAdapter {
    /// [`vacancy::traits::Adapter::observe`]: `/system_stats` (release,
    /// allocator memory) and `GET /prompt`'s queue count (COMFY-36).
    pub(super) async fn observe_now(&self) -> Result<ModelObservation, ObserveError> {
        let taken_at = self.settings.clock.now();
        // The release (COMFY-37) and the allocator's unused memory (RES-17);
        // a failure here is not an observation failure: the queue count is.
        let allocator_free_mib = match self.shared.observer.get_json("/system_stats").await {
            Ok(stats) => {
                if let Ok(v) = reported_version(&stats) {
                    *lock(&self.shared.version) = Some(v);
                }
                allocator_free_mib(&stats)
            }
            Err(_) => None,
        };
        let prompt = self.shared.observer.get_json("/prompt").await?;
        let remaining = prompt
            .pointer("/exec_info/queue_remaining")
            .and_then(Value::as_u64)
            .ok_or_else(|| {
                ObserveError::Malformed(
                    "GET /prompt: no whole-number exec_info.queue_remaining".to_owned(),
                )
            })?;
        // vacancy's own prompts are subtracted by the engine, which knows
        // every entry on the server's resources (ADM-09).
        let visible_work = (remaining > 0).then(|| {
            VisibleWork::new(
                u32::try_from(remaining).unwrap_or(u32::MAX),
                format!("ComfyUI holds {remaining} queued or running prompts"),
            )
        });
        Ok(ModelObservation {
            taken_at,
            models: Vec::new(),
            visible_work,
            allocator_free_mib,
        })
    }
}

/// The memory ComfyUI's allocator holds unused on its GPU, in MiB (RES-17):
/// `devices[0].torch_vram_free` of `/system_stats`, which ComfyUI computes as
/// memory torch reserved minus memory in use. `None` on a CPU device (there
/// it is the machine's free RAM, not the allocator's) or when it is missing.
pub fn allocator_free_mib(system_stats: &Value) -> Option<u64> {
    let device = system_stats.get("devices")?.as_array()?.first()?;
    if device.get("type").and_then(Value::as_str) == Some("cpu") {
        return None;
    }
    let bytes = device.get("torch_vram_free")?.as_u64()?;
    Some(bytes / (1024 * 1024))
}
