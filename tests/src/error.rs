//! The one error type of the harness.

use std::fmt;
use std::time::Duration;

/// What went wrong in the harness, with enough context to debug a failing test
/// from its output alone: what was run, and the tail of its output or log.
///
/// `Debug` prints the same text as `Display`, so `result.unwrap()` in a test shows
/// the log tail with its line breaks instead of one escaped string.
#[derive(thiserror::Error)]
pub enum SupportError {
    /// An I/O operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, e.g. "create log file /tmp/…/llama-server.log".
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A command ran to completion and failed.
    #[error("{what} failed ({status})\n--- output tail ---\n{tail}")]
    Command {
        /// The command line that was run.
        what: String,
        /// How it ended, e.g. "exit status: 1".
        status: String,
        /// The last lines of its stdout and stderr.
        tail: String,
    },
    /// A managed process exited while the harness was waiting for it.
    #[error("{name} exited ({status}) while {waiting_for}\n--- log tail ---\n{tail}")]
    Exited {
        /// The process's name, as given to [`ManagedProcess::spawn`](crate::ManagedProcess::spawn).
        name: String,
        /// How it ended.
        status: String,
        /// What the harness was waiting for.
        waiting_for: String,
        /// The last lines of its log.
        tail: String,
    },
    /// Something did not happen in time.
    #[error("{what}: timed out after {after:?}\n--- log tail ---\n{tail}")]
    Timeout {
        /// What was awaited, with the last observation.
        what: String,
        /// The limit that ran out.
        after: Duration,
        /// The last lines of the log of the process concerned (empty if none).
        tail: String,
    },
    /// An HTTP exchange failed (connect, send, or read the reply).
    #[error("HTTP {method} {url}: {message}")]
    Http {
        /// The request method.
        method: String,
        /// The request URL.
        url: String,
        /// What failed.
        message: String,
    },
    /// An argument the harness cannot work with.
    #[error("invalid {what}: {message}")]
    Invalid {
        /// The argument.
        what: String,
        /// Why it is invalid.
        message: String,
    },
}

impl fmt::Debug for SupportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl SupportError {
    /// An [`SupportError::Io`] with its context.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    /// An [`SupportError::Http`].
    pub(crate) fn http(method: &str, url: &str, message: impl fmt::Display) -> Self {
        Self::Http {
            method: method.to_owned(),
            url: url.to_owned(),
            message: message.to_string(),
        }
    }
}

/// The last `n` lines of `text`.
pub(crate) fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail_lines("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail_lines("a\nb", 5), "a\nb");
        assert_eq!(tail_lines("", 3), "");
    }

    #[test]
    fn debug_reads_like_display() {
        let e = SupportError::Timeout {
            what: "GET /health".into(),
            after: Duration::from_secs(1),
            tail: "line 1\nline 2".into(),
        };
        assert_eq!(format!("{e:?}"), e.to_string());
        assert!(format!("{e:?}").contains("line 1\nline 2"));
    }
}
