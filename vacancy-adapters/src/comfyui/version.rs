//! ComfyUI release numbers (COMFY-37): read from `system.comfyui_version` in
//! `/system_stats` and compared numerically, so 0.26.0 > 0.6.0 > 0.3.57 > 0.3.45.

use std::cmp::Ordering;
use std::fmt;

use serde_json::Value;

/// A ComfyUI release, `major.minor.patch`, compared part by part as numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ComfyVersion {
    /// The first number.
    pub major: u64,
    /// The second number.
    pub minor: u64,
    /// The third number (0 when the string has only two).
    pub patch: u64,
}

impl ComfyVersion {
    /// The first release that queues a prompt under the client's `prompt_id`
    /// (COMFY-06); earlier ones report an ID of their own.
    pub const KEEPS_CLIENT_ID: ComfyVersion = ComfyVersion::new(0, 3, 45);
    /// The first release whose `POST /interrupt` honours a `prompt_id`
    /// (RECL-26): ComfyUI commit 464ba1d6 ("Accept prompt_id in interrupt
    /// handler", PR #9607, 2025-09-02), first released in 0.3.57; before it
    /// the handler ignores its body and interrupts whatever runs.
    pub const TARGETS_INTERRUPT: ComfyVersion = ComfyVersion::new(0, 3, 57);
    /// The first release with `GET /api/jobs/<prompt_id>` (COMFY-21).
    pub const HAS_JOBS_API: ComfyVersion = ComfyVersion::new(0, 6, 0);
    /// The first release that cancels one job by ID (RECL-26).
    pub const HAS_JOB_CANCEL: ComfyVersion = ComfyVersion::new(0, 26, 0);

    /// A version from its three numbers.
    pub const fn new(major: u64, minor: u64, patch: u64) -> Self {
        ComfyVersion {
            major,
            minor,
            patch,
        }
    }

    /// Parse `0.3.75`, `v0.6.0`, `0.26` or `0.3.75-rc1` (a suffix after the
    /// numbers is ignored); `None` for anything without two leading numbers.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        let s = s.strip_prefix(['v', 'V']).unwrap_or(s);
        let end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let mut parts = s[..end].split('.');
        let mut num = || -> Option<Option<u64>> {
            match parts.next() {
                None | Some("") => Some(None),
                Some(p) => p.parse().ok().map(Some),
            }
        };
        let major = num()??;
        let minor = num()??;
        let patch = num()?.unwrap_or(0);
        Some(ComfyVersion::new(major, minor, patch))
    }
}

impl PartialOrd for ComfyVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ComfyVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.major, self.minor, self.patch).cmp(&(other.major, other.minor, other.patch))
    }
}

impl fmt::Display for ComfyVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What `/system_stats` says about the release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportedVersion {
    /// `system.comfyui_version` holds a release number.
    Known(ComfyVersion),
    /// The server reports no version (early 2024 releases): treated as older
    /// than 0.3.45 wherever the version matters (COMFY-19).
    NotReported,
}

impl ReportedVersion {
    /// Whether the release queues prompts under the ID vacancy assigns (COMFY-06, COMFY-18).
    pub fn keeps_client_id(self) -> bool {
        matches!(self, ReportedVersion::Known(v) if v >= ComfyVersion::KEEPS_CLIENT_ID)
    }

    /// Whether `GET /api/jobs/<id>` answers one prompt's state (COMFY-21).
    pub fn has_jobs_api(self) -> bool {
        matches!(self, ReportedVersion::Known(v) if v >= ComfyVersion::HAS_JOBS_API)
    }

    /// Whether one job can be cancelled by ID (RECL-26).
    pub fn has_job_cancel(self) -> bool {
        matches!(self, ReportedVersion::Known(v) if v >= ComfyVersion::HAS_JOB_CANCEL)
    }

    /// Whether `POST /interrupt {"prompt_id"}` stops only that prompt (RECL-26).
    pub fn targets_interrupt(self) -> bool {
        matches!(self, ReportedVersion::Known(v) if v >= ComfyVersion::TARGETS_INTERRUPT)
    }
}

impl fmt::Display for ReportedVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportedVersion::Known(v) => write!(f, "ComfyUI {v}"),
            ReportedVersion::NotReported => {
                f.write_str("a ComfyUI release that reports no version")
            }
        }
    }
}

/// The release in a `/system_stats` answer.
///
/// # Behavior
///
/// `system.comfyui_version` absent (or `null`) is [`ReportedVersion::NotReported`];
/// an answer that is not an object with a `system` object, or a version that
/// is not a parseable string, is an error (a failed read, asked again, COMFY-20).
pub fn reported_version(system_stats: &Value) -> Result<ReportedVersion, String> {
    let system = system_stats
        .get("system")
        .and_then(Value::as_object)
        .ok_or_else(|| "the /system_stats answer has no \"system\" object".to_owned())?;
    match system.get("comfyui_version") {
        None | Some(Value::Null) => Ok(ReportedVersion::NotReported),
        Some(Value::String(s)) => ComfyVersion::parse(s)
            .map(ReportedVersion::Known)
            .ok_or_else(|| format!("comfyui_version {s:?} is not a release number")),
        Some(other) => Err(format!("comfyui_version {other} is not a string")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn v(s: &str) -> ComfyVersion {
        ComfyVersion::parse(s).unwrap()
    }

    #[test]
    fn versions_compare_numerically() {
        // COMFY-37: 0.26.0 > 0.6.0 > 0.3.57 > 0.3.45
        assert!(v("0.26.0") > v("0.6.0"));
        assert!(v("0.6.0") > v("0.3.57"));
        assert!(v("0.3.57") > v("0.3.45"));
        assert!(v("0.3.45") > v("0.3.9"));
        assert!(v("1.0") > v("0.99.99"));
        assert_eq!(v("v0.3.75"), ComfyVersion::new(0, 3, 75));
        assert_eq!(v("0.26"), ComfyVersion::new(0, 26, 0));
        assert_eq!(v("0.3.75-rc1"), ComfyVersion::new(0, 3, 75));
        for bad in ["", "x", "0", "0.", ".3", "0.x.1", "zero.three"] {
            assert_eq!(ComfyVersion::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn version_gates() {
        // COMFY-06, COMFY-21, RECL-26
        let known = |s| ReportedVersion::Known(v(s));
        assert!(!known("0.3.44").keeps_client_id());
        assert!(known("0.3.45").keeps_client_id());
        assert!(!known("0.3.75").has_jobs_api());
        assert!(known("0.6.0").has_jobs_api());
        assert!(!known("0.6.0").has_job_cancel());
        // Issue 14 item 10: 0.3.57 is the first whose /interrupt honours prompt_id.
        assert!(!known("0.3.56").targets_interrupt());
        assert!(known("0.3.57").targets_interrupt());
        assert!(known("0.26.0").targets_interrupt());
        assert!(!ReportedVersion::NotReported.targets_interrupt());
        assert!(known("0.26.0").has_job_cancel());
        assert!(!ReportedVersion::NotReported.keeps_client_id());
        assert!(!ReportedVersion::NotReported.has_jobs_api());
    }

    #[test]
    fn system_stats_reports_or_omits_the_version() {
        // COMFY-37, COMFY-19 (no version), COMFY-20 (a failed read)
        let stats = json!({"system": {"os": "posix", "comfyui_version": "0.3.75", "python_version": "3.12"}, "devices": []});
        assert_eq!(
            reported_version(&stats),
            Ok(ReportedVersion::Known(ComfyVersion::new(0, 3, 75)))
        );
        let old = json!({"system": {"os": "posix", "python_version": "3.12"}, "devices": []});
        assert_eq!(reported_version(&old), Ok(ReportedVersion::NotReported));
        for bad in [
            json!({}),
            json!([]),
            json!({"system": {"comfyui_version": 3}}),
            json!({"system": {"comfyui_version": "new"}}),
        ] {
            assert!(reported_version(&bad).is_err(), "{bad}");
        }
    }
}
