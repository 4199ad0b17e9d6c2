//! The presence loop: the owner's presence, asked every second and given to
//! the engine; a change wakes the reclaim loop.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::info;

use crate::engine::OwnerPresence;
use crate::presence::PresenceBackend;
use crate::shell::loops::sink::LoopSink;
use crate::shell::state::shutdown::stopped;

/// How often the presence backend is asked.
pub const PRESENCE_EVERY: Duration = Duration::from_secs(1);

/// Ask the presence backend every `every` and give the answer to the engine;
/// a change wakes the reclaim loop at once.
pub async fn presence_loop<S: LoopSink + ?Sized>(
    sink: Arc<S>,
    backend: Arc<dyn PresenceBackend>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last: Option<OwnerPresence> = None;
    loop {
        let presence = backend.presence().await;
        sink.set_owner(presence);
        if last != Some(presence) {
            info!(
                backend = backend.name(),
                presence = presence.as_str(),
                "owner presence"
            );
            last = Some(presence);
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stopped(&mut shutdown) => return,
        }
    }
}
