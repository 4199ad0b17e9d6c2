//! How the daemon's log lines are written: text or JSON, coloured only on a
//! terminal.
//!
//! stderr is usually a file or journald, where escape codes are noise that
//! breaks `grep` and log shippers; so colour only when stderr is a terminal and
//! `NO_COLOR` (<https://no-color.org>) is not set. `VACANCYD_LOG_FORMAT=json`
//! writes one JSON object per line for log shippers.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// The environment variable that selects the format.
pub const FORMAT_VAR: &str = "VACANCYD_LOG_FORMAT";
/// The environment variable that sets the filter.
pub const FILTER_VAR: &str = "VACANCYD_LOG";

/// The format of the log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines, with ANSI colour or without.
    Text {
        /// Whether lines carry ANSI escape codes.
        ansi: bool,
    },
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and
    /// the event's fields.
    Json,
}

/// A `VACANCYD_LOG_FORMAT` that names no format.
#[derive(Debug, thiserror::Error)]
#[error("{FORMAT_VAR}={0:?} is not a log format; use \"text\" (the default) or \"json\"")]
pub struct UnknownFormat(String);

/// The format for `format` (the value of `VACANCYD_LOG_FORMAT`, if set), on a
/// stderr that is or is not a terminal, with `NO_COLOR` set to `no_color`.
///
/// # Errors
///
/// A format other than `text` or `json`.
pub fn choose(
    format: Option<&str>,
    stderr_is_terminal: bool,
    no_color: Option<&str>,
) -> Result<LogFormat, UnknownFormat> {
    match format.map(str::trim).unwrap_or_default() {
        "" | "text" => Ok(LogFormat::Text {
            // NO_COLOR counts when set to anything but the empty string.
            ansi: stderr_is_terminal && no_color.is_none_or(str::is_empty),
        }),
        "json" => Ok(LogFormat::Json),
        other => Err(UnknownFormat(other.to_owned())),
    }
}

/// The format this process's environment and stderr ask for.
///
/// # Errors
///
/// As [`choose`].
pub fn from_env() -> Result<LogFormat, UnknownFormat> {
    let format = std::env::var(FORMAT_VAR).ok();
    let no_color = std::env::var("NO_COLOR").ok();
    choose(
        format.as_deref(),
        std::io::stderr().is_terminal(),
        no_color.as_deref(),
    )
}

/// Install the global subscriber: lines in `format` on stderr, filtered by
/// `VACANCYD_LOG` (`info` when unset or invalid).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env(FILTER_VAR).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Text { ansi } => builder.with_ansi(ansi).init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}

/// Install the global subscriber writing text lines without colour codes
/// to `writer` (the Windows service's log file), filtered as [`init`] is.
#[cfg(windows)]
pub fn init_to<W>(writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_env(FILTER_VAR).unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_writer(writer)
        .with_env_filter(filter)
        .with_ansi(false)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(ansi: bool) -> LogFormat {
        LogFormat::Text { ansi }
    }

    // Issue 14 item 12: colour only on a terminal; NO_COLOR honoured.
    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert_eq!(choose(None, true, None).ok(), Some(text(true)));
        assert_eq!(choose(None, false, None).ok(), Some(text(false)));
        assert_eq!(choose(None, true, Some("1")).ok(), Some(text(false)));
        // An empty NO_COLOR is as if unset (no-color.org).
        assert_eq!(choose(None, true, Some("")).ok(), Some(text(true)));
        assert_eq!(choose(Some("text"), true, None).ok(), Some(text(true)));
        assert_eq!(choose(Some(""), false, None).ok(), Some(text(false)));
    }

    // Issue 14 item 12: JSON for log shippers; anything else is named.
    #[test]
    fn json_is_chosen_by_name_and_an_unknown_format_is_an_error() {
        assert_eq!(choose(Some("json"), true, None).ok(), Some(LogFormat::Json));
        assert_eq!(
            choose(Some(" json "), false, None).ok(),
            Some(LogFormat::Json)
        );
        let e = choose(Some("xml"), false, None)
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some(
                "VACANCYD_LOG_FORMAT=\"xml\" is not a log format; use \"text\" (the default) or \"json\""
            )
        );
    }
}
