//! A real headless Chromium for the owner console's tests: the Debian
//! `chromium` and `chromium-driver` packages, driven by Selenium (from PyPI,
//! in a venv the harness builds) through a small bridge process that takes
//! one JSON command per line. Nothing downloads a browser.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::error::SupportError;
use crate::python::PythonVenv;

/// The venv the bridge runs in.
pub const BROWSER_VENV: &str = "selenium-4.38";
/// Its packages, pinned.
pub const BROWSER_PACKAGES: &[&str] = &["selenium==4.38.0"];
/// The Debian packages the browser comes from (scripts/test installs them).
pub const BROWSER_DEBIAN_PACKAGES: &str = "chromium chromium-driver";

const BRIDGE: &str = include_str!("browser_bridge.py");

/// The binaries, overridable for other layouts.
fn chromium() -> PathBuf {
    std::env::var_os("VACANCY_CHROMIUM").map_or_else(|| "/usr/bin/chromium".into(), PathBuf::from)
}
fn chromedriver() -> PathBuf {
    std::env::var_os("VACANCY_CHROMEDRIVER")
        .map_or_else(|| "/usr/bin/chromedriver".into(), PathBuf::from)
}

/// A headless Chromium window of 1280×800, quit on drop.
pub struct Browser {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    log: PathBuf,
    _dir: tempfile::TempDir,
    /// The browser's version, as the driver reports it.
    pub version: String,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser")
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Browser {
    /// Start Chromium through chromedriver. Fails, naming the Debian
    /// packages, when either binary is missing.
    pub fn start() -> Result<Self, SupportError> {
        for (binary, what) in [(chromium(), "chromium"), (chromedriver(), "chromedriver")] {
            if !binary.exists() {
                return Err(SupportError::Invalid {
                    what: what.to_owned(),
                    message: format!(
                        "{} is missing; install the Debian packages {BROWSER_DEBIAN_PACKAGES} (scripts/test does)",
                        binary.display()
                    ),
                });
            }
        }
        let venv = PythonVenv::ensure(BROWSER_VENV, BROWSER_PACKAGES)?;
        let dir = tempfile::tempdir().map_err(|e| SupportError::io("create a browser dir", e))?;
        let script = dir.path().join("browser_bridge.py");
        std::fs::write(&script, BRIDGE)
            .map_err(|e| SupportError::io(format!("write {}", script.display()), e))?;
        let log = dir.path().join("browser.log");
        let log_file = std::fs::File::create(&log)
            .map_err(|e| SupportError::io(format!("create {}", log.display()), e))?;
        let mut child = Command::new(PythonVenv::python(&venv))
            .arg(&script)
            .env("VACANCY_CHROMIUM", chromium())
            .env("VACANCY_CHROMEDRIVER", chromedriver())
            .env("SE_OFFLINE", "true")
            .env("HOME", dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .map_err(|e| SupportError::io("start the Selenium bridge", e))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err(SupportError::Invalid {
                what: "browser bridge".into(),
                message: "no pipes".into(),
            });
        };
        let mut browser = Browser {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            log,
            _dir: dir,
            version: String::new(),
        };
        let hello = browser.read_reply("start Chromium")?;
        browser.version = hello.as_str().unwrap_or_default().to_owned();
        Ok(browser)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn read_reply(&mut self, what: &str) -> Result<Value, SupportError> {
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .map_err(|e| SupportError::io(format!("read the browser's answer to {what}"), e))?;
        if n == 0 {
            return Err(SupportError::Command {
                what: format!("browser: {what}"),
                status: "the bridge exited".into(),
                tail: self.log_tail(),
            });
        }
        let reply: Value = serde_json::from_str(&line).map_err(|e| SupportError::Invalid {
            what: "browser reply".into(),
            message: format!("{e}: {line}"),
        })?;
        if reply["ok"] == true {
            Ok(reply["value"].clone())
        } else {
            Err(SupportError::Command {
                what: format!("browser: {what}"),
                status: reply["error"].as_str().unwrap_or("failed").to_owned(),
                tail: self.log_tail(),
            })
        }
    }

    fn call(&mut self, command: Value) -> Result<Value, SupportError> {
        let what = command.to_string();
        writeln!(self.stdin, "{command}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| SupportError::io(format!("send {what} to the browser"), e))?;
        self.read_reply(&what)
    }

    /// Open `url`.
    pub fn get(&mut self, url: &str) -> Result<(), SupportError> {
        self.call(json!({"op": "get", "url": url})).map(drop)
    }

    /// Wait up to `timeout` for an element matching `css` whose text
    /// contains `text` (any text when `None`); its text.
    pub fn wait_for(
        &mut self,
        css: &str,
        text: Option<&str>,
        timeout: Duration,
    ) -> Result<String, SupportError> {
        let v = self.call(
            json!({"op": "wait", "css": css, "text": text, "timeout": timeout.as_secs_f64()}),
        )?;
        Ok(v.as_str().unwrap_or_default().to_owned())
    }

    /// The text of the first element matching `css`, if any.
    pub fn text(&mut self, css: &str) -> Result<Option<String>, SupportError> {
        let v = self.call(json!({"op": "text", "css": css}))?;
        Ok(v.as_str().map(str::to_owned))
    }

    /// How many elements match `css`.
    pub fn count(&mut self, css: &str) -> Result<u64, SupportError> {
        let v = self.call(json!({"op": "count", "css": css}))?;
        Ok(v.as_u64().unwrap_or(0))
    }

    /// Click the first element matching `css`.
    pub fn click(&mut self, css: &str) -> Result<(), SupportError> {
        self.call(json!({"op": "click", "css": css})).map(drop)
    }

    /// Replace the value of the first input matching `css` with `text`.
    pub fn type_into(&mut self, css: &str, text: &str) -> Result<(), SupportError> {
        self.call(json!({"op": "type", "css": css, "text": text}))
            .map(drop)
    }

    /// Run `script` in the page (`return ...` gives a value).
    pub fn js(&mut self, script: &str) -> Result<Value, SupportError> {
        self.call(json!({"op": "js", "script": script}))
    }

    /// Write a PNG of the window to `path`.
    pub fn screenshot(&mut self, path: &Path) -> Result<(), SupportError> {
        self.call(json!({"op": "screenshot", "path": path}))
            .map(drop)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"op": "quit"}));
        let _ = self.stdin.flush();
        for _ in 0..50 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
