//! The five built-in kinds as factories, registered through the same door as
//! any third party's ([`vacancy::registry::AdapterRegistry::register`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vacancy::config::{SettingProblem, UpstreamConfig};
use vacancy::registry::{AdapterContext, AdapterFactory, AdapterRegistry, BuildError, no_settings};
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
    registry.register(ChatterboxAdapter::NAME, ChatterboxFactory);
}

/// A registry holding the five built-in kinds.
pub fn registry() -> AdapterRegistry {
    let mut registry = AdapterRegistry::new();
    register(&mut registry);
    registry
}

fn built(kind: &str, e: impl std::error::Error + Send + Sync + 'static) -> BuildError {
    BuildError::because(format!("{kind} adapter: {e}"), e)
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

/// The chatterbox kind: no `adapter_settings`, and `[upstream.voice_routes]`,
/// the compatible voice server's paths, which it checks itself (issue 30).
pub struct ChatterboxFactory;

impl AdapterFactory for ChatterboxFactory {
    fn check(&self, upstream: &UpstreamConfig) -> Vec<SettingProblem> {
        let mut problems = no_settings(upstream);
        if let Some(routes) = &upstream.voice_routes {
            problems.extend(crate::chatterbox::check_voice_routes(routes));
        }
        problems
    }

    fn reads_tables(&self) -> &'static [&'static str] {
        &["voice_routes"]
    }

    fn build(&self, ctx: &AdapterContext<'_>) -> Result<Arc<dyn Adapter>, BuildError> {
        chatterbox(ctx)
    }
}

fn chatterbox(ctx: &AdapterContext<'_>) -> Result<Arc<dyn Adapter>, BuildError> {
    let adapter = ChatterboxAdapter::new(AdapterSettings::from_context(ctx))
        .map_err(|e| built("chatterbox", e))?;
    let adapter = match &ctx.upstream.voice_routes {
        Some(routes) => adapter.with_routes(routes).map_err(|e| {
            BuildError::because(
                format!("upstream {:?}: voice_routes: {e}", ctx.upstream.name),
                e,
            )
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

    /// One chatterbox upstream ("voice") with `voice`'s extra lines, and
    /// one Ollama upstream ("ollama") with `ollama`'s.
    fn two(voice: &str, ollama: &str) -> String {
        format!(
            r#"[[resource]]
name = "gpu0"
kind = "gpu"
sampler = "file"
path = "/tmp/free.json"

[[resource]]
name = "gpu1"
kind = "gpu"
sampler = "file"
path = "/tmp/free1.json"

[[upstream]]
name = "voice"
adapter = "chatterbox"
listen = "127.0.0.1:9000"
target = "http://127.0.0.1:4123"
resource = "gpu0"
{voice}
[[upstream]]
name = "ollama"
adapter = "ollama"
listen = "127.0.0.1:9001"
target = "http://127.0.0.1:11434"
resource = "gpu1"
{ollama}
"#
        )
    }

    #[test]
    fn the_chatterbox_kind_checks_its_voice_routes() {
        // docs/config.md#upstreamvoice_routes, issue 30 item 13: the adapter validates its own table,
        // with the key and line; core configuration knows no adapter names.
        let registry = registry();
        let good = two(
            "[upstream.voice_routes]\nspeech = \"/tts/speak\"\nexecution = \"/tts/jobs/{id}\"\n",
            "",
        );
        let c = vacancy::config::Config::parse_with(&good, "t", &registry)
            .unwrap()
            .config;
        assert_eq!(
            c.upstreams[0].voice_routes.as_ref().unwrap().speech,
            "/tts/speak"
        );
        let bad = two(
            "[upstream.voice_routes]\nspeech = \"tts\"\nexecution = \"/tts/jobs\"\ncapabilities = \"/caps/{id}\"\nexecution_audio = \"/v1/audio/speech\"\nexecutions = \"/x?y\"\n",
            "[upstream.voice_routes]\nspeech = \"/s\"\n",
        );
        let errs = vacancy::config::Config::parse_with(&bad, "t", &registry)
            .unwrap_err()
            .errors;
        let find = |path: &str, words: &str| {
            let e = errs
                .iter()
                .find(|e| e.path == path)
                .unwrap_or_else(|| panic!("no error at {path}: {errs:#?}"));
            assert!(e.message.contains(words), "{}: {}", e.path, e.message);
            e.line
        };
        let at = |key: &str| format!("upstream[0] (\"voice\").voice_routes.{key}");
        let line = find(&at("speech"), "not an absolute path");
        let speech_line = bad.lines().position(|l| l == "speech = \"tts\"").unwrap() + 1;
        assert_eq!(line, Some(speech_line), "the line of speech = ...");
        find(&at("execution"), "needs an {id} segment");
        find(&at("capabilities"), "parameters");
        find(&at("execution_audio"), "needs an {id} segment");
        find(&at("executions"), "not an absolute path");
        find(
            "upstream[1] (\"ollama\").voice_routes",
            "applies only to adapter = \"chatterbox\", not ollama",
        );
        assert_eq!(errs.len(), 6, "{errs:#?}");
    }
}
