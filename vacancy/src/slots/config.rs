//! What a slot write may carry, activation by `model.default`, and the
//! `autoload` migration.
//!
//! Payloads are slot files or slot write bodies as JSON (`[model]` is the
//! `model` object, `[server].env` is `server.env`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::slots::error::SlotError;
use crate::slots::keys::key_paths;

/// Tuning keys denied under `[model]` (SLOTCFG-04).
pub const MODEL_TUNING_KEYS: &[&str] = &["context_size", "ctx_size"];
/// Tuning keys denied under `[server]` (SLOTCFG-04).
pub const SERVER_TUNING_KEYS: &[&str] = &["extra_args"];
/// Tuning keys denied wherever they appear in a slot payload (SLOTCFG-04 and
/// its Ambiguity reading).
pub const ANYWHERE_TUNING_KEYS: &[&str] = &[
    "parallel",
    "chat_template",
    "workers",
    "mtp",
    "speculation",
    "enable_thinking",
    "vision",
];
/// The prefix of llama-server's option variables, denied in `[server].env`
/// (SLOTCFG-05).
pub const LLAMA_ENV_PREFIX: &str = "LLAMA_ARG_";
/// Other variables llama-server reads as launch options, denied in
/// `[server].env` (SLOTCFG-05).
pub const LLAMA_ENV_KEYS: &[&str] = &["LLAMA_API_KEY", "HF_TOKEN", "MTMD_BACKEND_DEVICE"];
/// Keys removed from the slot schema (SLOTCFG-06). `enabled` is the seed's
/// example; `lru` is retired too (EVICT-12), so a write may not add it back.
pub const REMOVED_SLOT_KEYS: &[&str] = &["enabled", "lru"];

/// The tuning keys in a slot payload, dotted, sorted.
///
/// # Behavior
///
/// `model.context_size`, `model.ctx_size`, `server.extra_args`, and any of
/// [`ANYWHERE_TUNING_KEYS`] at any depth (SLOTCFG-04 Ambiguity reading).
/// `server.env` is not entered (its keys are variable names).
pub fn tuning_keys(payload: &Value) -> Vec<String> {
    let mut keys: Vec<String> = key_paths(payload)
        .into_iter()
        .filter(|(path, key)| {
            ANYWHERE_TUNING_KEYS.contains(&key.as_str())
                || MODEL_TUNING_KEYS
                    .iter()
                    .any(|k| path.as_str() == format!("model.{k}"))
                || SERVER_TUNING_KEYS
                    .iter()
                    .any(|k| path.as_str() == format!("server.{k}"))
        })
        .map(|(path, _)| path)
        .collect();
    keys.sort();
    keys
}

/// The llama-server option variables in a payload's `[server].env`, sorted.
///
/// # Behavior
///
/// Names starting `LLAMA_ARG_`, and `LLAMA_API_KEY`, `HF_TOKEN`,
/// `MTMD_BACKEND_DEVICE`, matched exactly (environment names are
/// case-sensitive) (SLOTCFG-05).
pub fn llama_env_keys(payload: &Value) -> Vec<String> {
    let Some(env) = payload
        .get("server")
        .and_then(|s| s.get("env"))
        .and_then(Value::as_object)
    else {
        return Vec::new();
    };
    let mut keys: Vec<String> = env
        .keys()
        .filter(|k| k.starts_with(LLAMA_ENV_PREFIX) || LLAMA_ENV_KEYS.contains(&k.as_str()))
        .cloned()
        .collect();
    keys.sort();
    keys
}

/// The removed schema keys in a payload, dotted, sorted.
///
/// Any of [`REMOVED_SLOT_KEYS`] at any depth (SLOTCFG-06; "wherever they
/// appear", as for tuning keys).
pub fn removed_keys(payload: &Value) -> Vec<String> {
    let mut keys: Vec<String> = key_paths(payload)
        .into_iter()
        .filter(|(_, key)| REMOVED_SLOT_KEYS.contains(&key.as_str()))
        .map(|(path, _)| path)
        .collect();
    keys.sort();
    keys
}

/// `guard_slot_write_payload`: refuses a slot write that carries keys a slot
/// may not hold.
///
/// # Behavior
///
/// Checked in this order, so the "belongs on a profile" answer comes first
/// (SLOTCFG-03): tuning keys → [`SlotError::TuningKeyDenied`] (400,
/// SLOTCFG-04, SERR-08); llama-server variables in `[server].env` →
/// [`SlotError::LlamaEnvDenied`] (400, SLOTCFG-05); removed keys →
/// [`SlotError::RemovedKeyDenied`] (400, SLOTCFG-06). Each error lists every
/// offending key of its kind. Every slot write runs it (SLOTCFG-02).
pub fn guard_slot_write_payload(payload: &Value) -> Result<(), SlotError> {
    let keys = tuning_keys(payload);
    if !keys.is_empty() {
        return Err(SlotError::TuningKeyDenied { keys });
    }
    let keys = llama_env_keys(payload);
    if !keys.is_empty() {
        return Err(SlotError::LlamaEnvDenied { keys });
    }
    let keys = removed_keys(payload);
    if !keys.is_empty() {
        return Err(SlotError::RemovedKeyDenied { keys });
    }
    Ok(())
}

/// Refuses a slot file on disk that still carries tuning keys.
///
/// # Behavior
///
/// → [`SlotError::Unconverted`] (`slot.unconverted`) naming the slot, the file
/// (when given) and the keys; used at launch and by the strict loader
/// (SLOTCFG-09, SLOTCFG-10).
pub fn check_unconverted(
    slot: &str,
    file: Option<&str>,
    slot_file: &Value,
) -> Result<(), SlotError> {
    let keys = tuning_keys(slot_file);
    if keys.is_empty() {
        Ok(())
    } else {
        Err(SlotError::Unconverted {
            slot: slot.to_owned(),
            file: file.map(str::to_owned),
            keys,
        })
    }
}

/// Why a slot cannot launch until it is converted, as `GET /api/slots`
/// reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversionBlocked {
    /// What is wrong.
    pub reason: String,
    /// What to do about it.
    pub fix: String,
    /// The tuning keys still in the file, dotted.
    pub keys: Vec<String>,
}

/// The `conversion_blocked` view of a slot file, `None` when it is converted.
///
/// `Some({reason, fix, keys})` exactly when [`check_unconverted`] would refuse
/// it (SLOTCFG-11).
pub fn conversion_blocked(slot_file: &Value) -> Option<ConversionBlocked> {
    let keys = tuning_keys(slot_file);
    if keys.is_empty() {
        return None;
    }
    Some(ConversionBlocked {
        reason: format!(
            "the slot file still carries tuning keys: {}",
            keys.join(", ")
        ),
        fix: "delete the keys from the slot file and set their values on the slot's profile \
              (PUT /api/profiles/{name})"
            .to_owned(),
        keys,
    })
}

/// The slot's bound model, `model.default`, when it is a non-empty string.
///
/// SLOTCFG-12: empty, absent or non-string reads as unbound.
pub fn bound_model(slot_file: &Value) -> Option<&str> {
    slot_file
        .get("model")
        .and_then(|m| m.get("default"))
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
}

/// Whether the slot is active: routable and loadable.
///
/// True exactly when `model.default` is a non-empty string; there is no
/// `enabled` field (SLOTCFG-12).
pub fn is_activated(slot_file: &Value) -> bool {
    bound_model(slot_file).is_some()
}

/// A slot's effective boot-autostart setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Autoload {
    /// Whether the slot starts at boot.
    pub autoload: bool,
    /// Whether the value was derived because the key is absent on disk.
    pub migrated: bool,
}

/// Reads `autoload`, migrating a slot written before the field existed.
///
/// # Behavior
///
/// An explicit boolean wins (SLOTCFG-13: binding a model does not imply a
/// boot start). When the key is absent, the slot migrates to `true` if it has
/// a bound model and `false` otherwise (SLOTCFG-16). A non-boolean value is a
/// [`SlotError::ConfigError`] (400).
pub fn resolve_autoload(slot_file: &Value) -> Result<Autoload, SlotError> {
    match slot_file.get("autoload") {
        None => Ok(Autoload {
            autoload: is_activated(slot_file),
            migrated: true,
        }),
        Some(Value::Bool(b)) => Ok(Autoload {
            autoload: *b,
            migrated: false,
        }),
        Some(other) => Err(SlotError::ConfigError {
            key: Some("autoload".to_owned()),
            message: format!("autoload must be true or false, got {other}"),
        }),
    }
}

/// The `autoload` value a slot created through `POST /api/slots` persists.
///
/// Always explicit; `false` unless the request sets it (SLOTCFG-17).
pub fn autoload_for_create(requested: Option<bool>) -> bool {
    requested.unwrap_or(false)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    // SLOTCFG-01: a slot holds placement, its model and its profile; every
    // tune belongs on the profile, so a slot write carrying one is refused.
    #[test]
    fn slotcfg_01_a_slot_holds_placement_its_model_and_its_profile() {
        let slot = json!({
            "device": "rocm", "layers": 99, "threads": 8, "runner": "llama-server",
            "model": {"default": "qwen3-8b"},
            "profile": "chat-fast",
        });
        assert_eq!(guard_slot_write_payload(&slot), Ok(()));
        assert_eq!(bound_model(&slot), Some("qwen3-8b"));
        for (key, value) in [
            ("parallel", json!(4)),
            ("chat_template", json!("chatml")),
            ("speculation", json!({"draft": "x"})),
            ("vision", json!("auto")),
        ] {
            let mut tuned = slot.clone();
            tuned[key] = value;
            let e = guard_slot_write_payload(&tuned).unwrap_err();
            assert_eq!(e.code(), "slot.tuning_key_denied", "{key}: {e}");
            assert_eq!(e.http_status(), 400, "{key}");
        }
        let mut tuned = slot.clone();
        tuned["model"]["context_size"] = json!(8192);
        assert!(
            guard_slot_write_payload(&tuned).is_err(),
            "a model's tune too"
        );
    }

    // SLOTCFG-04, SERR-08
    #[test]
    fn slotcfg_04_tuning_keys_denied() {
        let cases = [
            (
                json!({"model": {"context_size": 8192}}),
                "model.context_size",
            ),
            (json!({"model": {"ctx_size": 8192}}), "model.ctx_size"),
            (
                json!({"server": {"extra_args": ["--x"]}}),
                "server.extra_args",
            ),
            (json!({"parallel": 2}), "parallel"),
            (json!({"server": {"parallel": 2}}), "server.parallel"),
            (
                json!({"model": {"chat_template": "x"}}),
                "model.chat_template",
            ),
            (json!({"workers": 2}), "workers"),
            (json!({"model": {"mtp": true}}), "model.mtp"),
            (json!({"speculation": {}}), "speculation"),
            (json!({"enable_thinking": false}), "enable_thinking"),
            (json!({"model": {"vision": "auto"}}), "model.vision"),
        ];
        for (payload, key) in cases {
            let err = guard_slot_write_payload(&payload).unwrap_err();
            assert_eq!(err.code(), "slot.tuning_key_denied", "{payload}");
            assert_eq!(err.http_status(), 400);
            assert_eq!(err.details()["keys"], json!([key]));
            assert!(err.to_string().contains("belongs on a profile"));
        }
        // ctx_size outside [model] and extra_args outside [server] are not these keys.
        assert!(guard_slot_write_payload(&json!({"profile": {"ctx_size": 1}})).is_ok());
        assert!(guard_slot_write_payload(&json!({"extra_args": []})).is_ok());
        // Several at once are all named.
        let err = guard_slot_write_payload(&json!({"parallel": 1, "model": {"ctx_size": 1}}))
            .unwrap_err();
        assert_eq!(err.details()["keys"], json!(["model.ctx_size", "parallel"]));
    }

    // SLOTCFG-05
    #[test]
    fn slotcfg_05_llama_env_denied() {
        for key in [
            "LLAMA_ARG_CTX_SIZE",
            "LLAMA_API_KEY",
            "HF_TOKEN",
            "MTMD_BACKEND_DEVICE",
        ] {
            let payload = json!({"server": {"env": {key: "1", "OTHER": "x"}}});
            let err = guard_slot_write_payload(&payload).unwrap_err();
            assert_eq!(err.code(), "slot.llama_env_denied");
            assert_eq!(err.http_status(), 400);
            assert_eq!(err.details()["keys"], json!([key]));
        }
        let ok = json!({"server": {"env": {"HIP_VISIBLE_DEVICES": "0", "hf_token": "x"}}});
        assert!(guard_slot_write_payload(&ok).is_ok());
        // Variable names are not mistaken for tuning keys.
        assert!(guard_slot_write_payload(&json!({"server": {"env": {"parallel": "1"}}})).is_ok());
    }

    // SLOTCFG-06
    #[test]
    fn slotcfg_06_removed_keys_denied() {
        let err = guard_slot_write_payload(&json!({"enabled": true})).unwrap_err();
        assert_eq!(err.code(), "slot.removed_key_denied");
        assert_eq!(err.http_status(), 400);
        assert_eq!(err.details()["keys"], json!(["enabled"]));
        let err = guard_slot_write_payload(&json!({"lru": true})).unwrap_err();
        assert_eq!(err.code(), "slot.removed_key_denied");
    }

    // SLOTCFG-03: the "belongs on a profile" answer comes first.
    #[test]
    fn slotcfg_03_tuning_answer_comes_first() {
        let payload = json!({
            "enabled": true,
            "server": {"env": {"HF_TOKEN": "x"}, "extra_args": []}
        });
        let err = guard_slot_write_payload(&payload).unwrap_err();
        assert_eq!(err.code(), "slot.tuning_key_denied");
        let payload = json!({"enabled": true, "server": {"env": {"HF_TOKEN": "x"}}});
        assert_eq!(
            guard_slot_write_payload(&payload).unwrap_err().code(),
            "slot.llama_env_denied"
        );
    }

    // SLOTCFG-02, SLOTCFG-07: an ordinary write passes, including a rebind.
    #[test]
    fn slotcfg_07_plain_writes_pass() {
        assert!(guard_slot_write_payload(&json!({"model": {"default": "qwen3-8b"}})).is_ok());
        let full = json!({
            "name": "agent", "device": "rocm", "layers": 99, "threads": 8, "runner": "llama",
            "profile": "chat", "priority": 60, "pinned": true, "autoload": false,
            "model": {"default": "m"}, "server": {"env": {"HIP_VISIBLE_DEVICES": "0"}}
        });
        assert!(guard_slot_write_payload(&full).is_ok());
    }

    // SLOTCFG-09, SLOTCFG-10, SLOTCFG-11
    #[test]
    fn slotcfg_09_to_11_unconverted_files() {
        let file = json!({"model": {"default": "m", "ctx_size": 4096}, "parallel": 2});
        let err =
            check_unconverted("agent", Some("/etc/hal0/slots/agent.toml"), &file).unwrap_err();
        assert_eq!(err.code(), "slot.unconverted");
        assert_eq!(err.details()["keys"], json!(["model.ctx_size", "parallel"]));
        assert_eq!(err.details()["file"], "/etc/hal0/slots/agent.toml");
        assert!(err.to_string().contains("/etc/hal0/slots/agent.toml"));
        let blocked = conversion_blocked(&file).unwrap();
        assert!(blocked.reason.contains("model.ctx_size"));
        assert!(blocked.fix.contains("profile"));
        let clean = json!({"model": {"default": "m"}});
        assert!(check_unconverted("agent", None, &clean).is_ok());
        assert_eq!(conversion_blocked(&clean), None);
    }

    // SLOTCFG-12
    #[test]
    fn slotcfg_12_activation_by_non_empty_model_default() {
        assert!(is_activated(&json!({"model": {"default": "m"}})));
        assert_eq!(bound_model(&json!({"model": {"default": "m"}})), Some("m"));
        assert!(!is_activated(&json!({"model": {"default": ""}})));
        assert!(!is_activated(&json!({"model": {}})));
        assert!(!is_activated(&json!({})));
        assert!(!is_activated(&json!({"model": {"default": 3}})));
        assert!(!is_activated(&json!({"enabled": true})));
    }

    // SLOTCFG-13, SLOTCFG-16, SLOTCFG-17
    #[test]
    fn slotcfg_16_autoload_migration_and_create_default() {
        let bound = json!({"model": {"default": "m"}});
        assert_eq!(
            resolve_autoload(&bound).unwrap(),
            Autoload {
                autoload: true,
                migrated: true
            }
        );
        assert_eq!(
            resolve_autoload(&json!({"model": {"default": ""}})).unwrap(),
            Autoload {
                autoload: false,
                migrated: true
            }
        );
        // SLOTCFG-13: an explicit false stays false with a bound model.
        assert_eq!(
            resolve_autoload(&json!({"autoload": false, "model": {"default": "m"}})).unwrap(),
            Autoload {
                autoload: false,
                migrated: false
            }
        );
        assert_eq!(
            resolve_autoload(&json!({"autoload": true})).unwrap(),
            Autoload {
                autoload: true,
                migrated: false
            }
        );
        let err = resolve_autoload(&json!({"autoload": "yes"})).unwrap_err();
        assert_eq!(err.http_status(), 400);
        // SLOTCFG-17
        assert!(!autoload_for_create(None));
        assert!(autoload_for_create(Some(true)));
    }
}
