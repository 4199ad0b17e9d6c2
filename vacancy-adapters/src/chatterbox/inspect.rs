//! What a voice request names: its engine, from a JSON body or a form.

use vacancy::engine::RequestReuse;
use vacancy::traits::{InspectContext, InspectResult, WorkRoute};

use super::engine_kind;
use crate::common::inspect_request;

/// Model names that do not name an engine: OpenAI's TTS model names, which
/// compatible servers take as "the loaded or default engine", and
/// `default`. On a server that reports its engine they never get resident
/// credit, because they cannot prove which engine will be reused (VOICE-14).
pub const GENERIC_ALIASES: &[&str] = &["default", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"];

/// [`vacancy::traits::Adapter::inspect`] for a voice server: the shared
/// OpenAI-style inspection, then the engine kind the request can reuse.
pub(super) fn inspect(route: &WorkRoute, ctx: InspectContext<'_>, body: &[u8]) -> InspectResult {
    let mut inspection = inspect_request(route, ctx, body)?;
    inspection.reuse = match inspection.model.as_deref() {
        Some(m) if !GENERIC_ALIASES.contains(&m) => RequestReuse::ReusesAs(engine_kind(m)),
        Some(m) => RequestReuse::Cannot(format!(
            "{m:?} is a generic alias, which cannot prove which engine will be reused"
        )),
        None => RequestReuse::Cannot(
            "the request names no engine, so it cannot prove which engine will be reused"
                .to_owned(),
        ),
    };
    Ok(inspection)
}
