//! Python virtual environments, built once and shared by test binaries.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{SupportError, tail_lines};
use crate::process::describe;
use crate::{cache_dir, create_dir};

/// Marks a finished venv; holds what it was built from.
const STAMP: &str = ".vacancy-stamp";

/// Python virtual environments under `cache_dir()/venvs/<name>`.
///
/// The interpreter that creates them is `$VACANCY_TEST_PYTHON`, else `python3`.
#[derive(Debug)]
pub struct PythonVenv;

impl PythonVenv {
    /// Returns the directory of the venv `name`, creating it first if it is missing
    /// or was built from other packages: `python3 -m venv`, then
    /// `pip install -q --disable-pip-version-check <packages>`.
    ///
    /// An exclusive lock on `venvs/<name>.lock` is held throughout, so test threads
    /// and parallel test binaries neither race nor use a half-built venv. A stamp
    /// file listing the packages, written last, marks it complete.
    pub fn ensure(name: &str, packages: &[&str]) -> Result<PathBuf, SupportError> {
        let valid = !name.is_empty()
            && !name.starts_with('.')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !valid {
            return Err(SupportError::Invalid {
                what: format!("venv name {name:?}"),
                message: "use letters, digits, '-', '_' and '.' (not leading)".into(),
            });
        }
        let root = cache_dir().join("venvs");
        create_dir(&root)?;
        let dir = root.join(name);
        let lock_path = root.join(format!("{name}.lock"));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| SupportError::io(format!("open {}", lock_path.display()), e))?;
        lock.lock()
            .map_err(|e| SupportError::io(format!("lock {}", lock_path.display()), e))?;
        // The lock is released when `lock` is dropped (closed), on every return.

        let interpreter = interpreter();
        let stamp = format!(
            "python: {}\n{}\n",
            interpreter.to_string_lossy(),
            packages.join("\n")
        );
        let stamp_path = dir.join(STAMP);
        let python = Self::python(&dir);
        if python.exists() && std::fs::read_to_string(&stamp_path).ok().as_ref() == Some(&stamp) {
            return Ok(dir);
        }

        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| SupportError::io(format!("remove stale venv {}", dir.display()), e))?;
        }
        let mut venv = Command::new(&interpreter);
        venv.arg("-m").arg("venv").arg(&dir);
        run_checked(&mut venv)?;
        if !packages.is_empty() {
            let mut pip = Command::new(dir.join("bin/pip"));
            pip.args(["install", "-q", "--disable-pip-version-check"])
                .args(packages);
            run_checked(&mut pip)?;
        }
        let tmp = dir.join(format!("{STAMP}.tmp"));
        std::fs::write(&tmp, &stamp)
            .and_then(|()| std::fs::rename(&tmp, &stamp_path))
            .map_err(|e| SupportError::io(format!("write {}", stamp_path.display()), e))?;
        Ok(dir)
    }

    /// The venv's Python interpreter, `<dir>/bin/python`.
    pub fn python(dir: &Path) -> PathBuf {
        dir.join("bin/python")
    }
}

/// `$VACANCY_TEST_PYTHON` or `python3`.
fn interpreter() -> std::ffi::OsString {
    match std::env::var_os("VACANCY_TEST_PYTHON") {
        Some(p) if !p.is_empty() => p,
        _ => "python3".into(),
    }
}

/// Runs `cmd` to completion; a failure carries the command line and the tail of
/// its stdout and stderr.
pub(crate) fn run_checked(cmd: &mut Command) -> Result<String, SupportError> {
    let what = describe(cmd);
    let out = cmd
        .output()
        .map_err(|e| SupportError::io(format!("run {what}"), e))?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    if out.status.success() {
        Ok(text)
    } else {
        Err(SupportError::Command {
            what,
            status: out.status.to_string(),
            tail: tail_lines(&text, 60),
        })
    }
}
