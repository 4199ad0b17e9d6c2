//! What llama-server shows: `/props` (asleep?), `/v1/models` (what is
//! loaded) and `/slots` (what is running), read with vacancy's credential.

use serde_json::Value;
use vacancy::engine::{ModelObservation, ObservedModel, ResidencyEvidence, VisibleWork};
use vacancy::traits::ObserveError;

use super::LlamaCppAdapter;
use crate::common::FetchError;

impl LlamaCppAdapter {
    /// Whether the server reports itself asleep; `false` when it has no `/props`.
    async fn sleeping(&self) -> Result<bool, ObserveError> {
        match self.core.observer().fetch_json("/props").await {
            Ok(props) => Ok(is_sleeping(&props)?),
            Err(e) if e.is_absent() => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// [`vacancy::traits::Adapter::observe`]: `/props` first (a sleeping
    /// server is left asleep), then `/v1/models` and `/slots` together.
    pub(super) async fn observe_now(&self) -> Result<ModelObservation, ObserveError> {
        let taken_at = self.core.settings().clock.now();
        if self.sleeping().await? {
            return Ok(ModelObservation::empty(taken_at));
        }
        let (models, slots) = tokio::join!(
            self.core.observer().fetch_json("/v1/models"),
            self.core.observer().fetch_json("/slots"),
        );
        let models = parse_models(&models?)?;
        let slots = match slots {
            Ok(v) => Ok(parse_slots(&v)?),
            Err(e @ FetchError::Unreachable(_) | e @ FetchError::Malformed(_)) => {
                return Err(e.into());
            }
            Err(e) => Err(e),
        };
        Ok(observation(taken_at, models, slots))
    }

    /// [`vacancy::traits::Adapter::verify_stopped`]: asleep, or no slot processing.
    pub(super) async fn slots_idle(&self) -> Result<bool, ObserveError> {
        if self.sleeping().await? {
            return Ok(true);
        }
        let slots = parse_slots(&self.core.observer().get_json("/slots").await?)?;
        Ok(slots.processing == 0)
    }
}

/// What `/slots` says: how many slots, how many processing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slots {
    pub(super) total: usize,
    pub(super) processing: usize,
}

/// `"is_sleeping"` from `/props`; absent (servers without sleep mode) is awake.
pub(super) fn is_sleeping(props: &Value) -> Result<bool, ObserveError> {
    let Some(props) = props.as_object() else {
        return Err(ObserveError::Malformed(
            "GET /props answered something other than a JSON object".into(),
        ));
    };
    match props.get("is_sleeping") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ObserveError::Malformed(format!(
            "GET /props: is_sleeping is {}, not a boolean",
            crate::common::inspect_kind(other)
        ))),
    }
}

/// The models `/v1/models` lists: `(name, ready)`.
pub(super) fn parse_models(v: &Value) -> Result<Vec<(String, bool)>, ObserveError> {
    let malformed = |why: &str| ObserveError::Malformed(format!("GET /v1/models: {why}"));
    let data = v
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("the answer has no \"data\" list"))?;
    let mut models: Vec<(String, bool)> = Vec::new();
    for entry in data {
        let id = entry
            .get("id")
            .and_then(Value::as_str)
            .ok_or_else(|| malformed("a model entry has no string \"id\""))?;
        // Router mode: {"status": {"value": "loaded" | "loading" | "unloaded" | "sleeping" ...}}.
        let ready = match entry.pointer("/status/value").and_then(Value::as_str) {
            None | Some("loaded") => true,
            Some("loading") => false,
            Some(_) => continue,
        };
        let aliases = entry
            .get("aliases")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str);
        for name in std::iter::once(id).chain(aliases) {
            if !models.iter().any(|(n, _)| n == name) {
                models.push((name.to_owned(), ready));
            }
        }
    }
    Ok(models)
}

/// Slot states from `/slots`: `is_processing` on current servers, `state`
/// (0 = idle) on servers before it.
pub(super) fn parse_slots(v: &Value) -> Result<Slots, ObserveError> {
    let malformed = |why: String| ObserveError::Malformed(format!("GET /slots: {why}"));
    let list = v
        .as_array()
        .ok_or_else(|| malformed("the answer is not a list of slots".into()))?;
    if list.is_empty() {
        return Err(malformed("the answer lists no slot".into()));
    }
    let mut processing = 0;
    for (i, slot) in list.iter().enumerate() {
        let busy = match (slot.get("is_processing"), slot.get("state")) {
            (Some(Value::Bool(b)), _) => *b,
            (None, Some(state)) => match state.as_u64() {
                Some(s) => s != 0,
                None => {
                    return Err(malformed(format!(
                        "slot {i} has a state that is not a number"
                    )));
                }
            },
            _ => {
                return Err(malformed(format!(
                    "slot {i} does not say whether it is processing"
                )));
            }
        };
        processing += usize::from(busy);
    }
    Ok(Slots {
        total: list.len(),
        processing,
    })
}

/// The observation from the models and what `/slots` said (or why it said nothing).
pub(super) fn observation(
    taken_at: vacancy::Moment,
    models: Vec<(String, bool)>,
    slots: Result<Slots, FetchError>,
) -> ModelObservation {
    let (evidence, visible_work) = match slots {
        Ok(Slots { processing: 0, .. }) => (ResidencyEvidence::Proven, None),
        Ok(Slots { total, processing }) => {
            let busy = format!("{processing} of {total} slots processing");
            let why = if processing == total {
                format!("no idle slot ({busy})")
            } else {
                format!("{busy}; resident credit needs idle slots")
            };
            let jobs = u32::try_from(processing).unwrap_or(u32::MAX);
            (
                ResidencyEvidence::NotProven(why),
                Some(VisibleWork::new(jobs, busy)),
            )
        }
        Err(e) => {
            let hint = if matches!(e, FetchError::Unauthorized { .. }) {
                "; configure [upstream.credential]"
            } else {
                ""
            };
            (
                ResidencyEvidence::NotProven(format!(
                    "the /slots endpoint is unavailable: {e}{hint}; without it no idle slot is proven"
                )),
                None,
            )
        }
    };
    ModelObservation {
        taken_at,
        models: models
            .into_iter()
            .map(|(name, ready)| ObservedModel {
                ready,
                ..ObservedModel::new(name, evidence.clone())
            })
            .collect(),
        visible_work,
        allocator_free_mib: None,
    }
}
