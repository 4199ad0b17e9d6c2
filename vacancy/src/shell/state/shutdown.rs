//! The daemon's shutdown signal, as every loop of the proxy waits for it.

use tokio::sync::watch;

/// Resolves once `shutdown` turns true (or its sender is gone).
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}
