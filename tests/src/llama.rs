//! A real llama.cpp server (llama-server's own code, in-process through the PyPI
//! wheel `xllamacpp`) serving a tiny random GGUF model.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::SupportError;
use crate::process::ManagedProcess;
use crate::python::{PythonVenv, run_checked};
use crate::{cache_dir, create_dir, free_port};

/// The venv (under `cache_dir()/venvs/`) that holds the server and the model tools.
pub const LLAMA_VENV: &str = "llama";

/// What [`LLAMA_VENV`] holds: llama.cpp's server as a wheel, and what the tiny
/// model's generator needs.
pub const LLAMA_PACKAGES: &[&str] = &["xllamacpp==2026.10.11549", "gguf==0.19.0", "numpy==2.4.6"];

const MAKE_TINY_GGUF: &str = "scripts/make_tiny_gguf.py";
const LLAMA_SERVER: &str = "scripts/llama_server.py";

/// A script of this crate, by path relative to the crate root.
fn script(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// A tiny llama-architecture GGUF with random F32 weights (4 attention heads,
/// feed-forward width 128), made by `scripts/make_tiny_gguf.py`. Its output is
/// printable-ASCII garbage, deterministic per `seed`; it never samples end-of-text,
/// so generation always runs to `n_predict`.
///
/// The default (2 layers, 64 wide) is 0.5 MB and answers in milliseconds; raise
/// `embd` and `layers` (e.g. 1024 and 8, ~110 MB) for a slot that stays busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TinyModel {
    /// Transformer blocks (at least 1).
    pub layers: u32,
    /// Embedding width (a positive multiple of 4, the head count).
    pub embd: u32,
    /// Seed of the random weights.
    pub seed: u64,
}

impl Default for TinyModel {
    fn default() -> Self {
        Self {
            layers: 2,
            embd: 64,
            seed: 0,
        }
    }
}

impl TinyModel {
    /// The model's file name in the cache: its parameters and a hash of the
    /// generator script, so a changed script makes new files.
    pub fn file_name(&self) -> String {
        let script_hash = fnv1a(include_bytes!("../scripts/make_tiny_gguf.py"));
        format!(
            "tiny-l{}-e{}-s{}-{:08x}.gguf",
            self.layers, self.embd, self.seed, script_hash as u32
        )
    }

    /// Returns the path of the model under `cache_dir()/models/`, generating it
    /// first if missing (with the Python of the [`LLAMA_VENV`] venv, into a
    /// temporary name that is then renamed, so readers never see half a file).
    pub fn ensure(&self) -> Result<PathBuf, SupportError> {
        if self.layers == 0 || self.embd == 0 || !self.embd.is_multiple_of(4) {
            return Err(SupportError::Invalid {
                what: format!("{self:?}"),
                message: "layers must be >= 1 and embd a positive multiple of 4".into(),
            });
        }
        let dir = cache_dir().join("models");
        let path = dir.join(self.file_name());
        if path.is_file() {
            return Ok(path);
        }
        create_dir(&dir)?;
        let venv = PythonVenv::ensure(LLAMA_VENV, LLAMA_PACKAGES)?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let tmp = dir.join(format!(
            ".{}.{}-{nanos}.tmp",
            self.file_name(),
            std::process::id()
        ));
        let mut cmd = Command::new(PythonVenv::python(&venv));
        cmd.arg(script(MAKE_TINY_GGUF))
            .arg(&tmp)
            .arg("--layers")
            .arg(self.layers.to_string())
            .arg("--embd")
            .arg(self.embd.to_string())
            .arg("--seed")
            .arg(self.seed.to_string());
        let made = run_checked(&mut cmd).and_then(|_| {
            std::fs::rename(&tmp, &path).map_err(|e| {
                SupportError::io(format!("rename {} to {}", tmp.display(), path.display()), e)
            })
        });
        if made.is_err() {
            // Leftovers only waste space; the error that matters is `made`'s.
            let _ = std::fs::remove_file(&tmp);
        }
        made.map(|()| path)
    }
}

/// 64-bit FNV-1a, a stable hash for cache names.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// How to run a [`LlamaServer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlamaOptions {
    /// The model to serve.
    pub model: TinyModel,
    /// Slots, i.e. requests served at once (`--parallel`). Default 1.
    pub parallel: u32,
    /// Context size in tokens, shared by all slots (`--ctx-size`). Default 1024.
    pub ctx: u32,
    /// CPU threads. Default 2.
    pub threads: u32,
    /// Whether `/slots` is served (`--slots`); without it the server answers 501
    /// there. Default true.
    pub slots_endpoint: bool,
    /// The model's name in `/v1/models` and `/props` (`--alias`). Default none:
    /// the server names it by its file name (`….gguf`).
    pub alias: Option<String>,
    /// The API key the server asks for (`--api-key`): every endpoint but the
    /// public ones answers 401 without `Authorization: Bearer KEY`. Default none.
    pub api_key: Option<String>,
    /// A path prefix, e.g. `/llm`, under which the server serves every endpoint
    /// (`--api-prefix`; see [`LlamaServer::api_url`]). Default none.
    pub api_prefix: Option<String>,
    /// Idle seconds after which the server unloads the model and sleeps until
    /// the next request (`--sleep-idle-seconds`). Default none: it never sleeps.
    pub sleep_idle_seconds: Option<u32>,
}

impl Default for LlamaOptions {
    fn default() -> Self {
        Self {
            model: TinyModel::default(),
            parallel: 1,
            ctx: 1024,
            threads: 2,
            slots_endpoint: true,
            alias: None,
            api_key: None,
            api_prefix: None,
            sleep_idle_seconds: None,
        }
    }
}

/// A real llama.cpp server on 127.0.0.1, run by `scripts/llama_server.py` under a
/// [`ManagedProcess`] (so it dies with the value, and its log shows when a test
/// panics). It serves the native API: `/health`, `/slots`, `/props`, `/metrics`,
/// `/completion`, `/tokenize`, `/v1/*`.
#[derive(Debug)]
pub struct LlamaServer {
    process: ManagedProcess,
    port: u16,
    model_path: PathBuf,
    options: LlamaOptions,
}

impl LlamaServer {
    /// How long [`start`](Self::start) waits for `/health` to answer 200.
    pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

    /// Starts a server on a free port: ensures the venv and the model, starts the
    /// server and waits for `/health` (under the prefix, with the key, if any) to
    /// answer 200. If another process took the
    /// port in between, it tries again on another.
    pub fn start(options: LlamaOptions) -> Result<Self, SupportError> {
        let mut attempt = 1;
        loop {
            let port = free_port()
                .map_err(|e| SupportError::io("find a free port for llama-server", e))?;
            match Self::start_on(port, options.clone()) {
                Err(SupportError::Exited { ref tail, .. })
                    if attempt < 3 && tail.contains("couldn't bind") =>
                {
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    /// Starts a server on `port`, e.g. the port of one that a test killed, to
    /// bring an upstream back where the daemon expects it.
    pub fn start_on(port: u16, options: LlamaOptions) -> Result<Self, SupportError> {
        if let Some(prefix) = &options.api_prefix
            && (!prefix.starts_with('/') || prefix.ends_with('/'))
        {
            return Err(SupportError::Invalid {
                what: format!("api_prefix {prefix:?}"),
                message: "it must start with '/' and not end with one, e.g. \"/llm\"".into(),
            });
        }
        let venv = PythonVenv::ensure(LLAMA_VENV, LLAMA_PACKAGES)?;
        let model_path = options.model.ensure()?;
        let mut cmd = Command::new(PythonVenv::python(&venv));
        cmd.env("PYTHONUNBUFFERED", "1")
            .arg(script(LLAMA_SERVER))
            .arg(&model_path)
            .args(["--host", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .arg("--ctx")
            .arg(options.ctx.to_string())
            .arg("--parallel")
            .arg(options.parallel.to_string())
            .arg("--threads")
            .arg(options.threads.to_string());
        if !options.slots_endpoint {
            cmd.arg("--no-slots");
        }
        if let Some(alias) = &options.alias {
            cmd.arg("--alias").arg(alias);
        }
        if let Some(key) = &options.api_key {
            cmd.arg("--api-key").arg(key);
        }
        if let Some(prefix) = &options.api_prefix {
            cmd.arg("--api-prefix").arg(prefix);
        }
        if let Some(seconds) = options.sleep_idle_seconds {
            cmd.arg("--sleep-idle-seconds").arg(seconds.to_string());
        }
        let mut process = ManagedProcess::spawn("llama-server", cmd)?;
        // With a prefix, /health lives under it and is no longer public: probe
        // it with the key.
        let authorization = bearer(&options);
        let headers: Vec<(&str, &str)> = authorization
            .iter()
            .map(|value| ("authorization", value.as_str()))
            .collect();
        process.wait_http_ok_with(
            &format!(
                "http://127.0.0.1:{port}{}/health",
                options.api_prefix.as_deref().unwrap_or("")
            ),
            &headers,
            Self::READY_TIMEOUT,
        )?;
        Ok(Self {
            process,
            port,
            model_path,
            options,
        })
    }

    /// Kills the server and starts a new one with the same options on the same port.
    pub fn restart(&mut self) -> Result<(), SupportError> {
        self.kill()?;
        *self = Self::start_on(self.port, self.options.clone())?;
        Ok(())
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash (and without the
    /// [`api_prefix`](LlamaOptions::api_prefix): see [`api_url`](Self::api_url)).
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Where its endpoints live: [`base_url`](Self::base_url) followed by the
    /// [`api_prefix`](LlamaOptions::api_prefix), if any, e.g.
    /// `http://127.0.0.1:PORT/llm`; without a prefix, the same as `base_url`.
    pub fn api_url(&self) -> String {
        format!(
            "{}{}",
            self.base_url(),
            self.options.api_prefix.as_deref().unwrap_or("")
        )
    }

    /// The `Authorization` header value the server asks for (`Bearer KEY`), if
    /// it was started with an [`api_key`](LlamaOptions::api_key).
    pub fn authorization(&self) -> Option<String> {
        bearer(&self.options)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The GGUF file it serves.
    pub fn model_path(&self) -> &Path {
        &self.model_path
    }

    /// The options it was started with.
    pub fn options(&self) -> &LlamaOptions {
        &self.options
    }

    /// The server process (pid, log).
    pub fn process(&self) -> &ManagedProcess {
        &self.process
    }

    /// The server process, to signal it (e.g. kill it mid-request).
    pub fn process_mut(&mut self) -> &mut ManagedProcess {
        &mut self.process
    }

    /// Kills the server (SIGKILL) and reaps it.
    pub fn kill(&mut self) -> Result<ExitStatus, SupportError> {
        self.process.kill()
    }
}

/// `Bearer KEY` for the options' API key, if any.
fn bearer(options: &LlamaOptions) -> Option<String> {
    options.api_key.as_ref().map(|key| format!("Bearer {key}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_differ_by_parameters() {
        let a = TinyModel::default();
        let b = TinyModel { seed: 1, ..a };
        assert_ne!(a.file_name(), b.file_name());
        assert!(a.file_name().starts_with("tiny-l2-e64-s0-"));
        assert!(a.file_name().ends_with(".gguf"));
    }

    #[test]
    fn invalid_models_are_refused_before_any_work() {
        let bad = TinyModel {
            embd: 30,
            ..TinyModel::default()
        };
        assert!(matches!(bad.ensure(), Err(SupportError::Invalid { .. })));
    }

    #[test]
    fn malformed_prefixes_are_refused_before_any_work() {
        for prefix in ["llm", "/llm/", "/"] {
            let options = LlamaOptions {
                api_prefix: Some(prefix.into()),
                ..LlamaOptions::default()
            };
            assert!(
                matches!(
                    LlamaServer::start_on(1, options),
                    Err(SupportError::Invalid { .. })
                ),
                "{prefix}"
            );
        }
    }

    #[test]
    fn the_defaults_add_no_switches() {
        let options = LlamaOptions::default();
        assert_eq!(
            (
                &options.alias,
                &options.api_key,
                &options.api_prefix,
                options.sleep_idle_seconds
            ),
            (&None, &None, &None, None)
        );
        assert_eq!(bearer(&options), None);
        let keyed = LlamaOptions {
            api_key: Some("k".into()),
            ..options
        };
        assert_eq!(bearer(&keyed).as_deref(), Some("Bearer k"));
    }
}
