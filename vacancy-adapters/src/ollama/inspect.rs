//! What an Ollama request asks for: its model, canonically named, and
//! whether its options let it reuse the loaded runner (RES-04, RES-06).

use serde::Deserialize;
use serde_json::Value;
use vacancy::engine::RequestReuse;
use vacancy::traits::{InspectContext, InspectError, InspectResult, WorkRoute};

use super::names::{Family, RequestKind, canonical_model};
use crate::common::{inspect_json_body, request_path};

/// The `options` keys that change how Ollama loads the model's runner
/// (RES-04 Ambiguity reading), from Ollama's `api.Runner` options and the
/// runner options earlier releases accepted.
///
/// # Behavior
///
/// A native request (`/api/...`) that sets any of these forfeits resident
/// credit. `num_ctx` is not listed: it is the one runner option RES-04
/// allows (its match with the loaded context is RES-05's concern). Sampling
/// and prediction options (`temperature`, `top_k`, `top_p`, `min_p`, `seed`,
/// `num_predict`, `stop`, `repeat_penalty`, `num_keep`, ...) are per request
/// and never forfeit it; neither do keys Ollama does not know.
pub const RUNNER_OPTIONS: &[&str] = &[
    "num_batch",
    "num_gpu",
    "main_gpu",
    "num_thread",
    "use_mmap",
    "use_mlock",
    "low_vram",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "numa",
    "num_gqa",
    "rope_frequency_base",
    "rope_frequency_scale",
    "embedding_only",
];

/// [`vacancy::traits::Adapter::inspect`] for Ollama: the shared JSON checks,
/// then the request's kind (RES-06) or why it cannot reuse the runner (RES-04).
pub(super) fn inspect(route: &WorkRoute, ctx: InspectContext<'_>, body: &[u8]) -> InspectResult {
    let mut inspection = inspect_json_body(route, ctx.path, body)?;
    if !route.inspect_body {
        return Ok(inspection);
    }
    let family = if request_path(ctx.path).starts_with("/api/") {
        Family::Api
    } else {
        Family::V1
    };
    let options = match family {
        Family::Api => native_options(body)?,
        Family::V1 => NativeOptions::default(),
    };
    let Some(model) = inspection.model.as_deref() else {
        return Ok(inspection);
    };
    let canonical = canonical_model(model);
    inspection.reuse = match options.runner_option {
        Some(key) => RequestReuse::Cannot(format!("the request sets runner option {key}")),
        None => RequestReuse::ReusesAs(
            RequestKind {
                model: canonical.clone(),
                num_ctx: options.num_ctx,
                family,
            }
            .to_string(),
        ),
    };
    if canonical != model {
        inspection.canonical_model = Some(canonical);
    }
    Ok(inspection)
}

/// What a native request's `options` say for residency.
#[derive(Debug, Default)]
struct NativeOptions {
    /// `options.num_ctx`, when set.
    num_ctx: Option<u64>,
    /// The first runner option it sets (RES-04).
    runner_option: Option<String>,
}

/// The top level of a native request, reading `options` only; every other
/// member (prompt, messages) is skipped unparsed.
#[derive(Deserialize)]
struct NativeRequest {
    #[serde(default)]
    options: Option<std::collections::BTreeMap<String, Value>>,
}

/// RES-04, RES-06: a native request's runner options and `num_ctx`.
fn native_options(body: &[u8]) -> Result<NativeOptions, InspectError> {
    // The body already passed `inspect_json_body`: a JSON object in UTF-8.
    let request: NativeRequest = serde_json::from_slice(body).map_err(|e| {
        InspectError::invalid(format!(
            "\"options\" must be an object of option names and values, named once: {e}"
        ))
    })?;
    let options = request.options.unwrap_or_default();
    let runner_option = options
        .keys()
        .find(|key| RUNNER_OPTIONS.contains(&key.as_str()))
        .cloned();
    let num_ctx = match options.get("num_ctx") {
        None | Some(Value::Null) => None,
        Some(v) => Some(num_ctx_value(v).ok_or_else(|| {
            InspectError::invalid(format!(
                "options.num_ctx must be a positive whole number of tokens, not {v}"
            ))
        })?),
    };
    Ok(NativeOptions {
        num_ctx,
        runner_option,
    })
}

/// `num_ctx` as Ollama reads it: a JSON number, truncated to a whole number
/// (Go's `int(float64)` in `api.Options.FromMap`), at least 1.
fn num_ctx_value(v: &Value) -> Option<u64> {
    if let Some(n) = v.as_u64() {
        return (n > 0).then_some(n);
    }
    let f = v.as_f64()?;
    if (1.0..1e15).contains(&f) {
        // Truncation toward zero is Ollama's conversion; the range is checked above.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = f as u64;
        return Some(n);
    }
    None
}
