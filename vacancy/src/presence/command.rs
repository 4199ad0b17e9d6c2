//! `presence = "command"`: the owner's own check, run through the shell.

use std::time::Duration;

use async_trait::async_trait;
use tokio::process::Command;
use tracing::warn;

use super::PresenceBackend;
use crate::engine::OwnerPresence;

/// Runs `[owner] command` through `sh -c` each time presence is asked.
///
/// # Behavior
///
/// Exit status 0 is present, 1 is away; any other status, a signal, a
/// command that cannot be started, or one that has not ended within the
/// timeout (it is killed) is unknown, which refuses host-scoped work
/// (OWN-01). The command's output is discarded; its stdin is empty.
#[derive(Debug, Clone)]
pub struct CommandBackend {
    command: String,
    timeout: Duration,
}

impl CommandBackend {
    /// How long one run may take by default: a presence check must be quick.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    /// A backend running `command` with the default timeout.
    pub fn new(command: &str) -> Self {
        CommandBackend {
            command: command.to_owned(),
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }

    /// The same backend with another timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

#[async_trait]
impl PresenceBackend for CommandBackend {
    fn name(&self) -> &str {
        "command"
    }

    async fn presence(&self) -> OwnerPresence {
        let child = Command::new("sh")
            .arg("-c")
            .arg(&self.command)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "the presence command cannot be started; owner presence is unknown");
                return OwnerPresence::Unknown;
            }
        };
        match tokio::time::timeout(self.timeout, child.wait()).await {
            Ok(Ok(status)) => match status.code() {
                Some(0) => OwnerPresence::Present,
                Some(1) => OwnerPresence::Away,
                other => {
                    warn!(status = ?other, "the presence command answered neither 0 (present) nor 1 (away); owner presence is unknown");
                    OwnerPresence::Unknown
                }
            },
            Ok(Err(e)) => {
                warn!(error = %e, "the presence command could not be waited for; owner presence is unknown");
                OwnerPresence::Unknown
            }
            Err(_) => {
                // kill_on_drop ends it when `child` goes out of scope.
                let _ = child.start_kill();
                warn!(
                    timeout_ms = self.timeout.as_millis() as u64,
                    "the presence command did not end in time; owner presence is unknown"
                );
                OwnerPresence::Unknown
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn exit_zero_is_present_one_is_away_anything_else_unknown() {
        // OWN-01 and the command backend's contract.
        for (command, want) in [
            ("exit 0", OwnerPresence::Present),
            ("true", OwnerPresence::Present),
            ("exit 1", OwnerPresence::Away),
            ("false", OwnerPresence::Away),
            ("exit 2", OwnerPresence::Unknown),
            ("kill -9 $$", OwnerPresence::Unknown),
            ("/nonexistent/presence-check", OwnerPresence::Unknown),
        ] {
            assert_eq!(
                CommandBackend::new(command).presence().await,
                want,
                "{command}"
            );
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_command_that_hangs_is_unknown_after_the_timeout() {
        let b = CommandBackend::new("sleep 5").with_timeout(Duration::from_millis(100));
        let started = std::time::Instant::now();
        assert_eq!(b.presence().await, OwnerPresence::Unknown);
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
