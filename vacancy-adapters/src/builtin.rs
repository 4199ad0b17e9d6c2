//! The five built-in kinds as factories, registered through the same door as
//! any third party's ([`vacancy::registry::AdapterRegistry::register`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vacancy::registry::{AdapterContext, AdapterFactory, AdapterRegistry, BuildError};
use vacancy::traits::Adapter;

use crate::comfyui::ComfyUiAdapter;
use crate::comfyui::tracker::TrackingTimes;
use crate::ollama::ContextCache;
use crate::{AdapterSettings, ChatterboxAdapter, LlamaCppAdapter, OllamaAdapter, OpenAiAdapter};

/// Register `ollama`, `comfyui`, `llamacpp`, `openai` and `chatterbox`.
pub fn register(registry: &mut AdapterRegistry) {
    registry.register(OllamaAdapter::NAME, OllamaFactory::default());
    registry.register(ComfyUiAdapter::NAME, comfyui);
    registry.register(LlamaCppAdapter::NAME, llamacpp);
    registry.register(OpenAiAdapter::NAME, openai);
    registry.register(ChatterboxAdapter::NAME, chatterbox);
}

/// A registry holding the five built-in kinds.
pub fn registry() -> AdapterRegistry {
    let mut registry = AdapterRegistry::new();
    register(&mut registry);
    registry
}

fn built(kind: &str, e: impl std::fmt::Display) -> BuildError {
    BuildError::new(format!("{kind} adapter: {e}"))
}

fn llamacpp(ctx: &AdapterContext<'_>) -> Result<Arc<dyn Adapter>, BuildError> {
    let adapter = LlamaCppAdapter::new(AdapterSettings::from_context(ctx))
        .map_err(|e| built("llamacpp", e))?;
    Ok(Arc::new(adapter))
}

fn openai(ctx: &AdapterContext<'_>) -> Result<Arc<dyn Adapter>, BuildError> {
    let adapter =
        OpenAiAdapter::new(AdapterSettings::from_context(ctx)).map_err(|e| built("openai", e))?;
    Ok(Arc::new(adapter))
}

fn chatterbox(ctx: &AdapterContext<'_>) -> Result<Arc<dyn Adapter>, BuildError> {
    let adapter = ChatterboxAdapter::new(AdapterSettings::from_context(ctx))
        .map_err(|e| built("chatterbox", e))?;
    let adapter = match &ctx.upstream.voice_routes {
        Some(routes) => adapter.with_routes(routes).map_err(|e| {
            BuildError::new(format!(
                "upstream {:?}: voice_routes: {e}",
                ctx.upstream.name
            ))
        })?,
        None => adapter,
    };
    Ok(Arc::new(adapter))
}

fn comfyui(ctx: &AdapterContext<'_>) -> Result<Arc<dyn Adapter>, BuildError> {
    let adapter = ComfyUiAdapter::new(AdapterSettings::from_context(ctx))
        .map_err(|e| built("comfyui", e))?
        .with_tracking_times(TrackingTimes {
            timeout: Duration::from_secs(ctx.upstream.completion_timeout_s),
            ..TrackingTimes::default()
        });
    Ok(Arc::new(adapter))
}

/// Ollama's factory: the Ollama upstreams of one recovery directory share its
/// learned-contexts file (RES-13), opened when the first is built; a file
/// that cannot be read is logged and never blocks startup (RES-15).
#[derive(Default)]
pub struct OllamaFactory {
    contexts: Mutex<HashMap<PathBuf, Arc<ContextCache>>>,
}

impl AdapterFactory for OllamaFactory {
    fn build(&self, ctx: &AdapterContext<'_>) -> Result<Arc<dyn Adapter>, BuildError> {
        let cache = {
            let mut open = match self.contexts.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            Arc::clone(
                open.entry(ctx.state_dir.to_path_buf())
                    .or_insert_with(|| Arc::new(ContextCache::open(ctx.state_dir))),
            )
        };
        let adapter = OllamaAdapter::new(AdapterSettings::from_context(ctx))
            .map_err(|e| built("ollama", e))?
            .with_context_cache(cache, &ctx.upstream.name);
        Ok(Arc::new(adapter))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use vacancy::MonotonicClock;
    use vacancy::config::{AdapterKind, AdapterKinds, UpstreamConfig};

    #[test]
    fn every_built_in_kind_builds_an_adapter_of_its_name() {
        let registry = registry();
        assert_eq!(
            registry.names(),
            ["ollama", "comfyui", "llamacpp", "openai", "chatterbox"]
        );
        let dir = tempfile::tempdir().unwrap();
        for name in registry.names() {
            let upstream = UpstreamConfig {
                name: "u".to_owned(),
                adapter: AdapterKind::new(name.clone()),
                target: "http://127.0.0.1:9".to_owned(),
                ..UpstreamConfig::default()
            };
            let ctx = AdapterContext {
                upstream: &upstream,
                target: upstream.target.parse().unwrap(),
                credential: None,
                clock: MonotonicClock::new(),
                state_dir: dir.path(),
            };
            assert_eq!(registry.build(&ctx).unwrap().name(), name);
        }
    }
}
