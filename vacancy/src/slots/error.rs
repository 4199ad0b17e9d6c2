//! Typed slot errors: one variant per row of hal0's error table, each with its
//! `slot.*` code, its HTTP status and structured details.

use serde_json::{Value, json};

/// A slot-lifecycle error as hal0 reports it over HTTP.
///
/// # Behavior
///
/// Every variant carries an HTTP status ([`SlotError::http_status`]) and a code
/// in the `slot.*` namespace ([`SlotError::code`]) (SERR-01). The seed spells
/// dotted codes only for some errors; for the CamelCase ones the code is
/// `slot.` plus the snake-cased name without its `Slot` prefix, e.g.
/// `SlotNotFound` → `slot.not_found`, `IllegalSlotTransition` →
/// `slot.illegal_transition`, `NpuExclusivityViolation` →
/// `slot.npu_exclusivity_violation` (SERR-01 Ambiguity reading). Statuses:
/// SERR-02 to SERR-11. [`SlotError::details`] gives the structured fields for a
/// response body; [`SlotError::retry_after_s`] feeds the Retry-After header of
/// a crash-loop refusal (SERR-05, BRK-08).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SlotError {
    /// `SlotNotFound`, 404 (SERR-02).
    #[error("slot {slot:?} not found")]
    NotFound {
        /// The slot name asked for.
        slot: String,
    },
    /// `IllegalSlotTransition`, 409: the transition is not in
    /// `LEGAL_TRANSITIONS` (SERR-03, SLOT-24).
    #[error("illegal slot transition {from} -> {to}")]
    IllegalTransition {
        /// The current state, lowercase.
        from: String,
        /// The refused next state, lowercase.
        to: String,
    },
    /// `SlotNotReady`, 503 (SERR-02).
    #[error("slot {slot:?} is not ready (state {state})")]
    NotReady {
        /// The slot.
        slot: String,
        /// Its state, lowercase.
        state: String,
    },
    /// `SlotSpawnFailed`, 500 (SERR-02).
    #[error("slot {slot:?} failed to spawn: {message}")]
    SpawnFailed {
        /// The slot.
        slot: String,
        /// What failed.
        message: String,
    },
    /// `SlotHealthFailed`, 503 (SERR-02).
    #[error("slot {slot:?} failed its health probe: {message}")]
    HealthFailed {
        /// The slot.
        slot: String,
        /// What the probe saw.
        message: String,
    },
    /// `SlotOutputSanityFailed`, 500: healthy server, output is not language
    /// (SERR-04).
    #[error(
        "slot {slot:?} failed the output-sanity probe {probe}: expected {expected:?}, the model said {actual:?}"
    )]
    OutputSanityFailed {
        /// The slot.
        slot: String,
        /// The probe that failed, e.g. `/completion`.
        probe: String,
        /// The expected token.
        expected: String,
        /// What the model actually said.
        actual: String,
    },
    /// `SlotCrashLooping`, 503: the crash-loop breaker refused a load
    /// (SERR-05, BRK-07, BRK-08).
    #[error(
        "slot {slot:?} is crash-looping ({state}, {failures} consecutive failures): retry in {retry_after_s}s"
    )]
    CrashLooping {
        /// The slot.
        slot: String,
        /// The breaker state: `backoff`, `parked` or `half-open`.
        state: String,
        /// Consecutive load failures.
        failures: u32,
        /// Whole seconds until a retry may run (rounded up, BRK-08).
        retry_after_s: u64,
    },
    /// `SlotTerminateTimeout`, 504: the stop did not return in time; the
    /// request unblocks anyway (SERR-06).
    #[error("slot {slot:?} did not stop within {timeout_s}s")]
    TerminateTimeout {
        /// The slot.
        slot: String,
        /// The stop budget in seconds.
        timeout_s: f64,
    },
    /// `SeamTimeout` (`slot.seam_timeout`), 504: a bounded systemctl/podman
    /// seam call did not return within its budget (SERR-07).
    #[error("slot {slot:?}: {command} did not return within {budget_s}s (last state {last_state})")]
    SeamTimeout {
        /// The slot.
        slot: String,
        /// The seam command.
        command: String,
        /// Its budget in seconds.
        budget_s: f64,
        /// The slot's last known state, lowercase.
        last_state: String,
    },
    /// `SlotConfigError`, 400 (SERR-02): an invalid slot configuration, e.g. a
    /// retired `lru` key under a strict load (EVICT-12) or an out-of-range
    /// `priority` under strict validation (EVICT-02).
    #[error("slot config error{}: {message}", key.as_ref().map(|k| format!(" at {k}")).unwrap_or_default())]
    ConfigError {
        /// The offending key, dotted, when there is one.
        key: Option<String>,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// `slot.tuning_key_denied`, 400: a slot write carried keys that belong on
    /// the profile (SERR-08, SLOTCFG-04).
    #[error(
        "{} belongs on a profile: set it on the slot's profile (PUT /api/profiles/{{name}}) or pick another profile",
        keys.join(", ")
    )]
    TuningKeyDenied {
        /// The denied keys, dotted.
        keys: Vec<String>,
    },
    /// `slot.llama_env_denied`, 400: `[server].env` carried llama-server
    /// options (SLOTCFG-05).
    #[error(
        "[server].env must not set llama-server options ({}): put a LLAMA_ARG_* tune in the profile's flags; the others are owned by hal0",
        keys.join(", ")
    )]
    LlamaEnvDenied {
        /// The denied environment variable names.
        keys: Vec<String>,
    },
    /// `slot.removed_key_denied`, 400: keys removed from the slot schema
    /// (SLOTCFG-06).
    #[error("{} removed from the slot schema", keys.join(", "))]
    RemovedKeyDenied {
        /// The denied keys, dotted.
        keys: Vec<String>,
    },
    /// `slot.unconverted`, 400: a slot file on disk still carries tuning keys;
    /// the launch and the strict loader refuse it (SLOTCFG-09, SLOTCFG-10).
    ///
    /// The seed names the code but not its status; 400 is this crate's reading
    /// (it is a slot-config error).
    #[error(
        "slot {slot:?} is unconverted: delete {} from {} and put the values on its profile",
        keys.join(", "),
        file.as_deref().unwrap_or("the slot file")
    )]
    Unconverted {
        /// The slot.
        slot: String,
        /// The slot file, when the caller knows it (SLOTCFG-10 names it).
        file: Option<String>,
        /// The tuning keys still in the file, dotted.
        keys: Vec<String>,
    },
    /// `slot.profile_missing`, 422: the slot names a profile the catalog does
    /// not have; the launch is refused (SERR-09).
    #[error("slot {slot:?} names profile {profile:?}, which the catalog does not have")]
    ProfileMissing {
        /// The slot.
        slot: String,
        /// The missing profile.
        profile: String,
    },
    /// `NpuExclusivityViolation`, 409: only one `device=npu`, `type=llm` slot
    /// with a bound model at a time (SERR-10).
    #[error(
        "slot {slot:?} would be a second device=npu type=llm slot with a bound model ({holder:?} already is): the AMD XDNA hardware context limit allows one"
    )]
    NpuExclusivity {
        /// The slot being written or loaded.
        slot: String,
        /// The slot that already holds the NPU.
        holder: String,
    },
    /// `SlotPinned`, 409: a pinned slot needs `?force=true` to unload or
    /// delete (SERR-11).
    #[error("slot {slot:?} is pinned: pass ?force=true to {action} it")]
    Pinned {
        /// The slot.
        slot: String,
        /// `unload` or `delete`.
        action: String,
    },
}

impl SlotError {
    /// The `slot.*` code (SERR-01).
    ///
    /// Spelled as the seed spells it where it gives one; otherwise
    /// `slot.<snake_case name without Slot>` (SERR-01 Ambiguity reading).
    pub fn code(&self) -> &'static str {
        match self {
            SlotError::NotFound { .. } => "slot.not_found",
            SlotError::IllegalTransition { .. } => "slot.illegal_transition",
            SlotError::NotReady { .. } => "slot.not_ready",
            SlotError::SpawnFailed { .. } => "slot.spawn_failed",
            SlotError::HealthFailed { .. } => "slot.health_failed",
            SlotError::OutputSanityFailed { .. } => "slot.output_sanity_failed",
            SlotError::CrashLooping { .. } => "slot.crash_looping",
            SlotError::TerminateTimeout { .. } => "slot.terminate_timeout",
            SlotError::SeamTimeout { .. } => "slot.seam_timeout",
            SlotError::ConfigError { .. } => "slot.config_error",
            SlotError::TuningKeyDenied { .. } => "slot.tuning_key_denied",
            SlotError::LlamaEnvDenied { .. } => "slot.llama_env_denied",
            SlotError::RemovedKeyDenied { .. } => "slot.removed_key_denied",
            SlotError::Unconverted { .. } => "slot.unconverted",
            SlotError::ProfileMissing { .. } => "slot.profile_missing",
            SlotError::NpuExclusivity { .. } => "slot.npu_exclusivity_violation",
            SlotError::Pinned { .. } => "slot.pinned",
        }
    }

    /// hal0's class name for the error, e.g. `SlotCrashLooping`, for bindings
    /// that raise one exception class per error.
    ///
    /// The seed's table names (SERR-02 to SERR-11); errors the seed names only
    /// by code get a CamelCase name built from the code.
    pub fn name(&self) -> &'static str {
        match self {
            SlotError::NotFound { .. } => "SlotNotFound",
            SlotError::IllegalTransition { .. } => "IllegalSlotTransition",
            SlotError::NotReady { .. } => "SlotNotReady",
            SlotError::SpawnFailed { .. } => "SlotSpawnFailed",
            SlotError::HealthFailed { .. } => "SlotHealthFailed",
            SlotError::OutputSanityFailed { .. } => "SlotOutputSanityFailed",
            SlotError::CrashLooping { .. } => "SlotCrashLooping",
            SlotError::TerminateTimeout { .. } => "SlotTerminateTimeout",
            SlotError::SeamTimeout { .. } => "SeamTimeout",
            SlotError::ConfigError { .. } => "SlotConfigError",
            SlotError::TuningKeyDenied { .. } => "SlotTuningKeyDenied",
            SlotError::LlamaEnvDenied { .. } => "SlotLlamaEnvDenied",
            SlotError::RemovedKeyDenied { .. } => "SlotRemovedKeyDenied",
            SlotError::Unconverted { .. } => "SlotUnconverted",
            SlotError::ProfileMissing { .. } => "SlotProfileMissing",
            SlotError::NpuExclusivity { .. } => "NpuExclusivityViolation",
            SlotError::Pinned { .. } => "SlotPinned",
        }
    }

    /// The HTTP status (SERR-02 to SERR-11).
    ///
    /// # Behavior
    ///
    /// 404 not found; 409 illegal transition, NPU exclusivity, pinned; 503 not
    /// ready, health failed, crash looping; 500 spawn failed, output sanity;
    /// 504 terminate and seam timeouts; 422 profile missing; 400 for config
    /// errors and every write-guard refusal.
    pub fn http_status(&self) -> u16 {
        match self {
            SlotError::NotFound { .. } => 404,
            SlotError::IllegalTransition { .. }
            | SlotError::NpuExclusivity { .. }
            | SlotError::Pinned { .. } => 409,
            SlotError::NotReady { .. }
            | SlotError::HealthFailed { .. }
            | SlotError::CrashLooping { .. } => 503,
            SlotError::SpawnFailed { .. } | SlotError::OutputSanityFailed { .. } => 500,
            SlotError::TerminateTimeout { .. } | SlotError::SeamTimeout { .. } => 504,
            SlotError::ProfileMissing { .. } => 422,
            SlotError::ConfigError { .. }
            | SlotError::TuningKeyDenied { .. }
            | SlotError::LlamaEnvDenied { .. }
            | SlotError::RemovedKeyDenied { .. }
            | SlotError::Unconverted { .. } => 400,
        }
    }

    /// Seconds for the Retry-After header; only a crash-loop refusal has one
    /// (SERR-05, BRK-08).
    ///
    /// `Some` only for [`SlotError::CrashLooping`].
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            SlotError::CrashLooping { retry_after_s, .. } => Some(*retry_after_s),
            _ => None,
        }
    }

    /// The structured fields of the error, as a JSON object.
    ///
    /// # Behavior
    ///
    /// The variant's fields by name; `slot.seam_timeout` carries `command`,
    /// `budget_s` and `last_state` (SERR-07); `slot.crash_looping` carries
    /// `retry_after_s` (SERR-05).
    pub fn details(&self) -> Value {
        match self {
            SlotError::NotFound { slot } => json!({ "slot": slot }),
            SlotError::IllegalTransition { from, to } => json!({ "from": from, "to": to }),
            SlotError::NotReady { slot, state } => json!({ "slot": slot, "state": state }),
            SlotError::SpawnFailed { slot, message }
            | SlotError::HealthFailed { slot, message } => {
                json!({ "slot": slot, "message": message })
            }
            SlotError::OutputSanityFailed {
                slot,
                probe,
                expected,
                actual,
            } => json!({ "slot": slot, "probe": probe, "expected": expected, "actual": actual }),
            SlotError::CrashLooping {
                slot,
                state,
                failures,
                retry_after_s,
            } => json!({
                "slot": slot, "state": state, "failures": failures, "retry_after_s": retry_after_s
            }),
            SlotError::TerminateTimeout { slot, timeout_s } => {
                json!({ "slot": slot, "timeout_s": timeout_s })
            }
            SlotError::SeamTimeout {
                slot,
                command,
                budget_s,
                last_state,
            } => json!({
                "slot": slot, "command": command, "budget_s": budget_s, "last_state": last_state
            }),
            SlotError::ConfigError { key, message } => json!({ "key": key, "message": message }),
            SlotError::TuningKeyDenied { keys }
            | SlotError::LlamaEnvDenied { keys }
            | SlotError::RemovedKeyDenied { keys } => json!({ "keys": keys }),
            SlotError::Unconverted { slot, file, keys } => {
                json!({ "slot": slot, "file": file, "keys": keys })
            }
            SlotError::ProfileMissing { slot, profile } => {
                json!({ "slot": slot, "profile": profile })
            }
            SlotError::NpuExclusivity { slot, holder } => {
                json!({ "slot": slot, "holder": holder })
            }
            SlotError::Pinned { slot, action } => json!({ "slot": slot, "action": action }),
        }
    }

    /// The whole error as a response body: `{code, message, details}`.
    ///
    /// `code` is [`SlotError::code`] (SERR-01), `message` the display text,
    /// `details` [`SlotError::details`].
    pub fn to_json(&self) -> Value {
        json!({ "code": self.code(), "message": self.to_string(), "details": self.details() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> String {
        v.to_owned()
    }

    /// One of each variant with its expected code, status and class name.
    fn table() -> Vec<(SlotError, &'static str, u16, &'static str)> {
        vec![
            // SERR-02
            (
                SlotError::NotFound { slot: s("a") },
                "slot.not_found",
                404,
                "SlotNotFound",
            ),
            // SERR-03
            (
                SlotError::IllegalTransition {
                    from: s("idle"),
                    to: s("error"),
                },
                "slot.illegal_transition",
                409,
                "IllegalSlotTransition",
            ),
            // SERR-02
            (
                SlotError::NotReady {
                    slot: s("a"),
                    state: s("warming"),
                },
                "slot.not_ready",
                503,
                "SlotNotReady",
            ),
            (
                SlotError::SpawnFailed {
                    slot: s("a"),
                    message: s("x"),
                },
                "slot.spawn_failed",
                500,
                "SlotSpawnFailed",
            ),
            (
                SlotError::HealthFailed {
                    slot: s("a"),
                    message: s("x"),
                },
                "slot.health_failed",
                503,
                "SlotHealthFailed",
            ),
            // SERR-04
            (
                SlotError::OutputSanityFailed {
                    slot: s("a"),
                    probe: s("/completion"),
                    expected: s("Paris"),
                    actual: s("@@@"),
                },
                "slot.output_sanity_failed",
                500,
                "SlotOutputSanityFailed",
            ),
            // SERR-05
            (
                SlotError::CrashLooping {
                    slot: s("a"),
                    state: s("backoff"),
                    failures: 1,
                    retry_after_s: 5,
                },
                "slot.crash_looping",
                503,
                "SlotCrashLooping",
            ),
            // SERR-06
            (
                SlotError::TerminateTimeout {
                    slot: s("a"),
                    timeout_s: 30.0,
                },
                "slot.terminate_timeout",
                504,
                "SlotTerminateTimeout",
            ),
            // SERR-07
            (
                SlotError::SeamTimeout {
                    slot: s("a"),
                    command: s("systemctl daemon-reload"),
                    budget_s: 10.0,
                    last_state: s("starting"),
                },
                "slot.seam_timeout",
                504,
                "SeamTimeout",
            ),
            // SERR-02
            (
                SlotError::ConfigError {
                    key: Some(s("priority")),
                    message: s("x"),
                },
                "slot.config_error",
                400,
                "SlotConfigError",
            ),
            // SERR-08
            (
                SlotError::TuningKeyDenied {
                    keys: vec![s("model.ctx_size")],
                },
                "slot.tuning_key_denied",
                400,
                "SlotTuningKeyDenied",
            ),
            // SLOTCFG-05
            (
                SlotError::LlamaEnvDenied {
                    keys: vec![s("HF_TOKEN")],
                },
                "slot.llama_env_denied",
                400,
                "SlotLlamaEnvDenied",
            ),
            // SLOTCFG-06
            (
                SlotError::RemovedKeyDenied {
                    keys: vec![s("enabled")],
                },
                "slot.removed_key_denied",
                400,
                "SlotRemovedKeyDenied",
            ),
            // SLOTCFG-09
            (
                SlotError::Unconverted {
                    slot: s("a"),
                    file: None,
                    keys: vec![s("parallel")],
                },
                "slot.unconverted",
                400,
                "SlotUnconverted",
            ),
            // SERR-09
            (
                SlotError::ProfileMissing {
                    slot: s("a"),
                    profile: s("p"),
                },
                "slot.profile_missing",
                422,
                "SlotProfileMissing",
            ),
            // SERR-10
            (
                SlotError::NpuExclusivity {
                    slot: s("a"),
                    holder: s("b"),
                },
                "slot.npu_exclusivity_violation",
                409,
                "NpuExclusivityViolation",
            ),
            // SERR-11
            (
                SlotError::Pinned {
                    slot: s("a"),
                    action: s("unload"),
                },
                "slot.pinned",
                409,
                "SlotPinned",
            ),
        ]
    }

    // SERR-01..SERR-11
    #[test]
    fn serr_every_error_has_its_code_status_and_name() {
        for (err, code, status, name) in table() {
            assert_eq!(err.code(), code, "{err:?}");
            assert!(err.code().starts_with("slot."), "SERR-01 namespace");
            assert_eq!(err.http_status(), status, "{err:?}");
            assert_eq!(err.name(), name, "{err:?}");
            let body = err.to_json();
            assert_eq!(body["code"], code);
            assert!(body["details"].is_object());
            assert!(!err.to_string().is_empty());
        }
    }

    // SERR-05, BRK-08
    #[test]
    fn serr_05_only_crash_looping_carries_retry_after() {
        for (err, ..) in table() {
            match err {
                SlotError::CrashLooping { .. } => {
                    assert_eq!(err.retry_after_s(), Some(5));
                    assert_eq!(err.details()["retry_after_s"], 5);
                }
                _ => assert_eq!(err.retry_after_s(), None),
            }
        }
    }

    // SERR-07
    #[test]
    fn serr_07_seam_timeout_details_carry_command_budget_and_last_state() {
        let err = SlotError::SeamTimeout {
            slot: s("a"),
            command: s("systemctl reset-failed"),
            budget_s: 12.5,
            last_state: s("error"),
        };
        let d = err.details();
        assert_eq!(d["command"], "systemctl reset-failed");
        assert_eq!(d["budget_s"], 12.5);
        assert_eq!(d["last_state"], "error");
    }

    // SERR-08 / SLOTCFG-04: the "belongs on a profile" answer.
    #[test]
    fn serr_08_tuning_key_message_says_belongs_on_a_profile() {
        let err = SlotError::TuningKeyDenied {
            keys: vec![s("parallel")],
        };
        assert!(err.to_string().contains("belongs on a profile"));
    }
}
