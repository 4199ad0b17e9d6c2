//! The bounded read of a streamed reply into a [`Scanner`] (COMFY-31..35).

use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body_util::BodyExt;
use hyper::body::Body;
use tokio::time::Instant;

use super::{Flow, ScanError, Scanner};
use crate::common::{FetchError, ObservationClient};

/// The limits on one streamed read of a reply (first written for ComfyUI's).
///
/// # Behavior
///
/// The defaults are the rules: at most 256 MiB (COMFY-31), the first byte
/// within 60 s (COMFY-32), never silent for more than 10 s (COMFY-33), and
/// the whole read, parsing included, within 5 minutes (COMFY-34). A use that
/// reads less (the unload check: 16 MiB) lowers `max_bytes`; tests shrink
/// the times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimits {
    /// The most bytes read from the body (COMFY-31).
    pub max_bytes: u64,
    /// From the request to the first body byte (COMFY-32).
    pub first_byte: Duration,
    /// The longest wait for the next bytes once the body has started (COMFY-33).
    pub silence: Duration,
    /// From the request to the end of the scan (COMFY-34).
    pub total: Duration,
}

impl ReadLimits {
    /// COMFY-31: 256 MiB.
    pub const MAX_BYTES: u64 = 256 * 1024 * 1024;
    /// COMFY-32: 60 s.
    pub const FIRST_BYTE: Duration = Duration::from_secs(60);
    /// COMFY-33: 10 s.
    pub const SILENCE: Duration = Duration::from_secs(10);
    /// COMFY-34: 5 minutes.
    pub const TOTAL: Duration = Duration::from_secs(300);

    /// The same limits with another byte cap.
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }
}

impl Default for ReadLimits {
    fn default() -> Self {
        ReadLimits {
            max_bytes: Self::MAX_BYTES,
            first_byte: Self::FIRST_BYTE,
            silence: Self::SILENCE,
            total: Self::TOTAL,
        }
    }
}

/// Why a streamed read failed (COMFY-35): each variant names the limit or
/// the fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// No body byte within [`ReadLimits::first_byte`] of the request (COMFY-32).
    #[error("{what}: no reply within {} ms (COMFY-32)", limit.as_millis())]
    FirstByte {
        /// The request, e.g. `GET /queue`.
        what: String,
        /// The limit.
        limit: Duration,
    },
    /// The body fell silent for longer than [`ReadLimits::silence`] (COMFY-33).
    #[error("{what}: the reply fell silent for {} ms after {received} bytes (COMFY-33)", limit.as_millis())]
    Silence {
        /// The request.
        what: String,
        /// The limit.
        limit: Duration,
        /// Bytes read before the silence.
        received: u64,
    },
    /// The read and scan took longer than [`ReadLimits::total`] (COMFY-34).
    #[error("{what}: the read took longer than {} ms after {received} bytes (COMFY-34)", limit.as_millis())]
    Total {
        /// The request.
        what: String,
        /// The limit.
        limit: Duration,
        /// Bytes read by then.
        received: u64,
    },
    /// The reply went past [`ReadLimits::max_bytes`] before the scan had its
    /// answer (COMFY-31).
    #[error("{what}: the reply is larger than {limit} bytes (COMFY-31)")]
    TooLarge {
        /// The request.
        what: String,
        /// The limit.
        limit: u64,
    },
    /// The connection broke off.
    #[error("{what}: the reply broke off after {received} bytes: {detail}")]
    Broken {
        /// The request.
        what: String,
        /// Bytes read before.
        received: u64,
        /// The transport's error.
        detail: String,
    },
    /// The reply is not the JSON it should be (truncated, malformed, shaped
    /// otherwise).
    #[error("{what}: {source}")]
    Scan {
        /// The request.
        what: String,
        /// The scanner's error.
        #[source]
        source: ScanError,
    },
}

impl ReadError {
    /// The rule the failure breaks, for logs and metrics.
    pub fn rule(&self) -> &'static str {
        match self {
            ReadError::FirstByte { .. } => "COMFY-32",
            ReadError::Silence { .. } => "COMFY-33",
            ReadError::Total { .. } => "COMFY-34",
            ReadError::TooLarge { .. } => "COMFY-31",
            ReadError::Broken { .. } | ReadError::Scan { .. } => "COMFY-35",
        }
    }
}

/// Reads `body` into `scanner` as it arrives, within `limits` counted from
/// `started` (when the request was sent).
///
/// # Behavior
///
/// - Each chunk is scanned as it arrives and dropped (COMFY-30); the read
///   ends as soon as the scanner says [`Flow::Stop`], leaving the rest unread.
/// - At most `limits.max_bytes` are scanned: a scan that has no answer by
///   then is [`ReadError::TooLarge`] (COMFY-31). A stop inside the cap is
///   an answer, even when the chunk it came in reached past it.
/// - The first body byte must come within `limits.first_byte` of `started`
///   (COMFY-32), each further chunk within `limits.silence` of the previous
///   one (COMFY-33), and the whole read and scan must end within
///   `limits.total` of `started` (COMFY-34).
/// - Every failure is logged at `warn` with the rule it breaks, and returned
///   (COMFY-35).
pub async fn read_body_since<B, S>(
    what: &str,
    started: Instant,
    body: B,
    limits: &ReadLimits,
    scanner: S,
) -> Result<S::Output, ReadError>
where
    B: Body<Data = Bytes>,
    B::Error: std::error::Error,
    S: Scanner,
{
    let result = read_inner(what, started, body, limits, scanner).await;
    if let Err(e) = &result {
        log_failure(e, started);
    }
    result
}

/// Why [`get_scanned`] failed: before the body (the request) or while
/// reading it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamFetchError {
    /// The request failed or was answered with a non-2xx status.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// The reply broke a limit or is not the JSON it should be (COMFY-31..35).
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// `GET path` through `client`, its reply scanned as it arrives within
/// `limits`.
///
/// # Behavior
///
/// - The request carries vacancy's credential only (OBS-01/02).
/// - The time limits count from sending the request: no response head
///   within `limits.first_byte` is [`ReadError::FirstByte`] (COMFY-32), and
///   the body is read by [`read_body_since`] (COMFY-30..35).
/// - A failed request or a non-2xx answer is [`StreamFetchError::Fetch`].
pub async fn get_scanned<S: Scanner>(
    client: &ObservationClient,
    path: &str,
    limits: &ReadLimits,
    scanner: S,
) -> Result<S::Output, StreamFetchError> {
    let started = Instant::now();
    let head_limit = limits.first_byte.min(limits.total);
    // The client's own bound is a second later, so ours always fires first
    // and names the rule.
    let head = client.get_streaming(path, head_limit + Duration::from_secs(1));
    let response = match tokio::time::timeout_at(started + head_limit, head).await {
        Ok(response) => response?,
        Err(_) => {
            let what = format!("GET {}", client.full_path(path));
            let e = if head_limit < limits.first_byte {
                ReadError::Total {
                    what,
                    limit: limits.total,
                    received: 0,
                }
            } else {
                ReadError::FirstByte {
                    what,
                    limit: limits.first_byte,
                }
            };
            log_failure(&e, started);
            return Err(e.into());
        }
    };
    Ok(read_body_since(&response.what, started, response.body, limits, scanner).await?)
}

fn log_failure(e: &ReadError, started: Instant) {
    // COMFY-35: a read that breaks a limit fails, and says so.
    tracing::warn!(
        rule = e.rule(),
        elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        error = %e,
        "ComfyUI reply read failed"
    );
}

/// The limit a wait for the next bytes broke: the whole read's (COMFY-34),
/// the first byte's (COMFY-32) or the silence's (COMFY-33).
fn timed_out(what: &str, limits: &ReadLimits, received: u64, whole_read: bool) -> ReadError {
    let what = what.to_owned();
    if whole_read {
        ReadError::Total {
            what,
            limit: limits.total,
            received,
        }
    } else if received == 0 {
        ReadError::FirstByte {
            what,
            limit: limits.first_byte,
        }
    } else {
        ReadError::Silence {
            what,
            limit: limits.silence,
            received,
        }
    }
}

async fn read_inner<B, S>(
    what: &str,
    started: Instant,
    body: B,
    limits: &ReadLimits,
    mut scanner: S,
) -> Result<S::Output, ReadError>
where
    B: Body<Data = Bytes>,
    B::Error: std::error::Error,
    S: Scanner,
{
    let mut body = std::pin::pin!(body);
    let total_deadline = started + limits.total;
    let mut received: u64 = 0;
    let mut last = started;
    let scan_err = |source| ReadError::Scan {
        what: what.to_owned(),
        source,
    };
    loop {
        // COMFY-32 before the first byte, COMFY-33 after it; COMFY-34 always.
        let wait_deadline = if received == 0 {
            started + limits.first_byte
        } else {
            last + limits.silence
        };
        let deadline = wait_deadline.min(total_deadline);
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(frame) => frame,
            Err(_) => {
                let whole_read = deadline >= total_deadline;
                return Err(timed_out(what, limits, received, whole_read));
            }
        };
        let Some(frame) = frame else {
            // The body ended: the scanner checks it was complete.
            return scanner.finish().map_err(scan_err);
        };
        let frame = frame.map_err(|e| ReadError::Broken {
            what: what.to_owned(),
            received,
            detail: crate::common::error_chain(&e),
        })?;
        let Ok(mut data) = frame.into_data() else {
            continue; // trailers carry no reply bytes
        };
        if !data.has_remaining() {
            continue;
        }
        last = Instant::now();
        let room = limits.max_bytes.saturating_sub(received);
        let len = data.len() as u64;
        let over = len > room;
        if over {
            // COMFY-31: scan what fits; past the cap only a stop is an answer.
            data.truncate(usize::try_from(room).unwrap_or(usize::MAX));
        }
        received += data.len() as u64;
        let flow = scanner.feed(&data).map_err(scan_err)?;
        if flow == Flow::Stop {
            return scanner.finish().map_err(scan_err);
        }
        if over {
            return Err(ReadError::TooLarge {
                what: what.to_owned(),
                limit: limits.max_bytes,
            });
        }
        if Instant::now() >= total_deadline {
            return Err(ReadError::Total {
                what: what.to_owned(),
                limit: limits.total,
                received,
            });
        }
    }
}
