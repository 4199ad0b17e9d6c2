//! What a voice server shows: `GET /status` `{"loaded", "engine", "busy"}`,
//! and on a legacy server the models `GET /v1/models` lists.

use serde_json::Value;
use vacancy::engine::{ModelObservation, ObservedModel, ResidencyEvidence, VisibleWork};
use vacancy::traits::ObserveError;

use super::{ChatterboxAdapter, engine_kind};

/// The longest engine name taken as valid.
const MAX_ENGINE_LEN: usize = 128;

/// What the adapter reads from `GET /status`, said when an answer is not it
/// (a server without the route, such as local-tts-studio, answers its web
/// page there).
const STATUS_SHAPE: &str = "the chatterbox adapter reads GET /status as JSON {\"loaded\": true|false, \"engine\": \"NAME\", \"busy\": true|false}, so it cannot tell which engine is loaded or whether the server is busy";

/// A `GET /status` answer that is not the status, said with what is expected.
fn not_the_status(e: ObserveError) -> ObserveError {
    match e {
        ObserveError::Malformed(why) => ObserveError::Malformed(format!("{why}; {STATUS_SHAPE}")),
        other => other,
    }
}

/// Whether `/status` names an engine usably: a non-empty string of visible
/// ASCII without spaces, at most 128 bytes (VOICE-16 calls anything else
/// invalid).
pub(super) fn valid_engine(engine: &str) -> bool {
    !engine.is_empty()
        && engine.len() <= MAX_ENGINE_LEN
        && engine.bytes().all(|b| b.is_ascii_graphic())
}

impl ChatterboxAdapter {
    /// [`vacancy::traits::Adapter::observe`]: `GET /status`, and `GET /v1/models`
    /// on a legacy server (VOICE-11..16).
    pub(super) async fn observe_now(&self) -> Result<ModelObservation, ObserveError> {
        let taken_at = self.core.settings().clock.now();
        let status = self
            .core
            .observer()
            .get_json("/status")
            .await
            .map_err(not_the_status)?;
        let malformed =
            |why: &str| ObserveError::Malformed(format!("GET /status: {why}; {STATUS_SHAPE}"));
        let loaded = status
            .get("loaded")
            .and_then(Value::as_bool)
            .ok_or_else(|| malformed("no boolean \"loaded\""))?;
        let busy = status
            .get("busy")
            .and_then(Value::as_bool)
            .ok_or_else(|| malformed("no boolean \"busy\""))?;
        let models = match status.get("engine") {
            // VOICE-15: a legacy server serves its fixed models.
            None if loaded => self.legacy_models(busy).await?,
            None => Vec::new(),
            // VOICE-11/12: the loaded engine, named.
            Some(Value::String(engine)) if loaded && valid_engine(engine) => {
                vec![ObservedModel::new(
                    engine.clone(),
                    engine_evidence(engine, busy),
                )]
            }
            // VOICE-16: null, empty, non-string or invalid: no proof; or not loaded.
            Some(_) => Vec::new(),
        };
        Ok(ModelObservation {
            taken_at,
            models,
            visible_work: busy.then(|| VisibleWork::new(1, "the voice server reports busy")),
            allocator_free_mib: None,
        })
    }

    /// VOICE-15: a legacy server (no `engine` in `/status`) serves the fixed
    /// models `GET /v1/models` lists, resident while it is loaded and idle.
    async fn legacy_models(&self, busy: bool) -> Result<Vec<ObservedModel>, ObserveError> {
        let listed = self.core.observer().get_json("/v1/models").await?;
        let ids = listed
            .get("data")
            .and_then(Value::as_array)
            .ok_or_else(|| {
                ObserveError::Malformed("GET /v1/models: no \"data\" list".to_owned())
            })?;
        Ok(ids
            .iter()
            .filter_map(|m| m.get("id").and_then(Value::as_str))
            .map(|id| {
                let evidence = if busy {
                    ResidencyEvidence::NotProven("the voice server is busy".to_owned())
                } else {
                    ResidencyEvidence::Proven
                };
                ObservedModel::new(id, evidence)
            })
            .collect())
    }
}

/// VOICE-11, VOICE-12: the loaded engine is resident for requests naming it,
/// while the server is idle.
fn engine_evidence(name: &str, busy: bool) -> ResidencyEvidence {
    if busy {
        ResidencyEvidence::NotProven(format!("the voice server is busy, so {name} is not idle"))
    } else {
        ResidencyEvidence::ProvenFor {
            kinds: vec![engine_kind(name)],
            otherwise: format!(
                "the voice server has engine {name} loaded; only a request naming {name} reuses it, and a generic alias cannot prove which engine runs"
            ),
        }
    }
}
