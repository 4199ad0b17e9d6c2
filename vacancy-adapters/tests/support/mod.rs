//! A real llama.cpp server for the live tests, kept local to this crate's tests.
//!
//! - Python: `$VACANCY_PYTHON`, else `python3`.
//! - The venv lives in `$VACANCY_TEST_CACHE/venvs/xllamacpp`, else
//!   `~/.cache/vacancy-test/venvs/xllamacpp`; it is created (PyPI
//!   `xllamacpp==2026.10.11549 gguf numpy`, ~10 s) when missing, under a file
//!   lock, built aside and renamed into place.
//! - Models are random-weight GGUFs from `make_tiny_gguf.py`, cached in
//!   `<cache>/models/`.
//! - `VACANCY_SKIP_LIVE_UPSTREAMS=1` skips these tests (for machines without
//!   Python or a package registry); otherwise a failed setup fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use vacancy::MonotonicClock;
use vacancy_adapters::{AdapterSettings, ObservationClient};

pub const XLLAMACPP: &str = "xllamacpp==2026.10.11549";
const SUPPORT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support");

/// Whether the live tests are switched off on this machine.
pub fn skipped() -> bool {
    if std::env::var_os("VACANCY_SKIP_LIVE_UPSTREAMS").is_some_and(|v| !v.is_empty() && v != "0") {
        eprintln!("VACANCY_SKIP_LIVE_UPSTREAMS is set: live llama-server test skipped");
        return true;
    }
    false
}

fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("VACANCY_TEST_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").expect("HOME or VACANCY_TEST_CACHE must be set");
    PathBuf::from(home).join(".cache/vacancy-test")
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn venv_works(venv: &Path) -> bool {
    let check = format!(
        "import importlib.metadata as m, gguf, numpy; assert m.version('xllamacpp') == '{}'",
        XLLAMACPP.trim_start_matches("xllamacpp==")
    );
    Command::new(venv.join("bin/python"))
        .args(["-c", &check])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The venv's python, installing it the first time.
pub fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let venvs = cache_dir().join("venvs");
        fs::create_dir_all(&venvs).unwrap();
        let venv = venvs.join("xllamacpp");
        let lock = fs::File::create(venvs.join("xllamacpp.lock")).unwrap();
        lock.lock().unwrap();
        if !venv_works(&venv) {
            let system = std::env::var("VACANCY_PYTHON").unwrap_or_else(|_| "python3".into());
            let aside = venvs.join(format!("xllamacpp.tmp-{}", std::process::id()));
            let _ = fs::remove_dir_all(&aside);
            eprintln!("creating {} with {XLLAMACPP} (once)", venv.display());
            run(
                Command::new(&system).args(["-m", "venv"]).arg(&aside),
                "creating the venv",
            );
            run(
                Command::new(aside.join("bin/python")).args([
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--disable-pip-version-check",
                    XLLAMACPP,
                    "gguf",
                    "numpy",
                ]),
                "installing xllamacpp",
            );
            let _ = fs::remove_dir_all(&venv);
            fs::rename(&aside, &venv).unwrap();
            assert!(
                venv_works(&venv),
                "the new venv {} does not work",
                venv.display()
            );
        }
        lock.unlock().unwrap();
        venv.join("bin/python")
    })
}

/// A random-weight GGUF with `embd` and `layers`, cached.
pub fn model(embd: u32, layers: u32) -> PathBuf {
    let python = python();
    let dir = cache_dir().join("models");
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("vacancy-tiny-e{embd}-l{layers}.gguf"));
    if !path.exists() {
        let aside = dir.join(format!(
            "vacancy-tiny-e{embd}-l{layers}.tmp-{}-{:?}.gguf",
            std::process::id(),
            std::thread::current().id()
        ));
        run(
            Command::new(python)
                .arg(Path::new(SUPPORT).join("make_tiny_gguf.py"))
                .arg(&aside)
                .args(["--embd", &embd.to_string(), "--layers", &layers.to_string()]),
            "making the model",
        );
        fs::rename(&aside, &path).unwrap();
    }
    path
}

/// How to start one server.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub embd: u32,
    pub layers: u32,
    pub parallel: u32,
    /// Context per slot (0: 1024).
    pub ctx_per_slot: u32,
    pub alias: Option<&'static str>,
    pub api_key: Option<&'static str>,
    pub api_prefix: Option<&'static str>,
    pub no_slots: bool,
    pub sleep_s: Option<u32>,
}

impl Options {
    /// The tiny model (embd 64, 2 layers), two slots.
    pub fn tiny() -> Self {
        Options {
            embd: 64,
            layers: 2,
            parallel: 2,
            ..Options::default()
        }
    }
}

/// A running llama-server, killed when dropped.
pub struct LlamaServer {
    child: Child,
    pub port: u16,
    pub options: Options,
    log: PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl LlamaServer {
    /// Start a server and wait until it answers `GET /health`.
    pub async fn start(options: Options) -> LlamaServer {
        let python = python();
        let model = model(options.embd, options.layers);
        let port = free_port();
        let log = std::env::temp_dir().join(format!("vacancy-llama-{port}.log"));
        let mut cmd = Command::new(python);
        cmd.arg(Path::new(SUPPORT).join("llama_server.py"))
            .arg(&model)
            .args(["--port", &port.to_string()])
            .args(["--parallel", &options.parallel.to_string()])
            .args([
                "--ctx",
                &(options.ctx_per_slot.max(1024) * options.parallel).to_string(),
            ]);
        if let Some(a) = options.alias {
            cmd.args(["--alias", a]);
        }
        if let Some(k) = options.api_key {
            cmd.args(["--api-key", k]);
        }
        if let Some(p) = options.api_prefix {
            cmd.args(["--api-prefix", p]);
        }
        if options.no_slots {
            cmd.arg("--no-slots");
        }
        if let Some(s) = options.sleep_s {
            cmd.args(["--sleep", &s.to_string()]);
        }
        let out = fs::File::create(&log).unwrap();
        let child = cmd
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let mut server = LlamaServer {
            child,
            port,
            options,
            log,
        };
        server.wait_ready().await;
        server
    }

    /// Settings for an adapter that reaches this server, with its key when it has one.
    pub fn settings(&self) -> AdapterSettings {
        let target = format!(
            "http://127.0.0.1:{}{}",
            self.port,
            self.options.api_prefix.unwrap_or("")
        );
        let settings = AdapterSettings::new(target.parse().unwrap(), MonotonicClock::new());
        match self.options.api_key {
            Some(key) => settings.with_credential(
                http::header::AUTHORIZATION,
                format!("Bearer {key}").parse().unwrap(),
            ),
            None => settings,
        }
    }

    /// The same settings without the key.
    pub fn settings_without_credential(&self) -> AdapterSettings {
        AdapterSettings {
            credential: None,
            ..self.settings()
        }
    }

    /// `GET path` (under the prefix, with the key) as JSON.
    pub async fn get(&self, path: &str) -> serde_json::Value {
        ObservationClient::new(&self.settings())
            .get_json(path)
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}\n{}", self.log_tail()))
    }

    async fn wait_ready(&mut self) {
        let client = ObservationClient::new(&self.settings());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if client.get_json("/health").await.is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("llama-server exited ({status}):\n{}", self.log_tail());
            }
            assert!(
                Instant::now() < deadline,
                "llama-server not ready after 60 s:\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_file(&self.log);
    }
}
