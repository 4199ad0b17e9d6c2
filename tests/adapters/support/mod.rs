//! Adapter glue for the live tests: the real llama-server itself comes from
//! `vacancy-test-support` ([`LlamaServer`], venv and models in its cache).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use vacancy::MonotonicClock;
use vacancy_adapters::{AdapterSettings, ObservationClient};
use vacancy_test_support::{LlamaOptions, LlamaServer};

/// The tiny model (embd 64, 2 layers), two slots, 1024 tokens of context each.
pub fn tiny() -> LlamaOptions {
    LlamaOptions {
        parallel: 2,
        ctx: 2048,
        ..LlamaOptions::default()
    }
}

/// Starts a server (blocking work: venv, model, readiness) off the runtime's threads.
pub async fn start(options: LlamaOptions) -> LlamaServer {
    tokio::task::spawn_blocking(move || LlamaServer::start(options))
        .await
        .unwrap()
        .unwrap()
}

/// What the live tests need of a server beyond the harness.
pub trait ServerExt {
    /// Settings for an adapter that reaches this server (under its prefix), with
    /// its key when it has one.
    fn settings(&self) -> AdapterSettings;
    /// The same settings without the key.
    fn settings_without_credential(&self) -> AdapterSettings;
    /// `GET path` (under the prefix, with the key) as JSON.
    async fn get(&self, path: &str) -> serde_json::Value;
}

impl ServerExt for LlamaServer {
    fn settings(&self) -> AdapterSettings {
        let settings = AdapterSettings::new(self.api_url().parse().unwrap(), MonotonicClock::new());
        match self.authorization() {
            Some(value) => {
                settings.with_credential(http::header::AUTHORIZATION, value.parse().unwrap())
            }
            None => settings,
        }
    }

    fn settings_without_credential(&self) -> AdapterSettings {
        AdapterSettings {
            credential: None,
            ..self.settings()
        }
    }

    async fn get(&self, path: &str) -> serde_json::Value {
        ObservationClient::new(&self.settings())
            .get_json(path)
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}\n{}", self.process().log_tail(30)))
    }
}
