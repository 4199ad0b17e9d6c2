//! The Windows build of vacancyd, run under Wine for the behaviour tests
//! (tests/daemon/windows.rs): where `vacancyd.exe` and the Wine prefix are,
//! commands that run it, and the folders of `C:\ProgramData` it uses.
//!
//! `scripts/windows test` builds `vacancyd.exe` with the Debian toolchain
//! (the harness cannot: it needs another compiler and `-Zbuild-std`) and
//! names it in `VACANCY_WINDOWS_EXE`, and the prefix in `WINEPREFIX`. Wine
//! programs use the host's sockets, so the daemon under Wine fronts the real
//! Linux upstreams the harness starts, and Linux clients reach it on
//! loopback. Wine is not Windows: docs/windows.md lists what this shows and
//! what it cannot.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::SupportError;
use crate::error::tail_lines;

/// Under Wine only, the switch that lets vacancyd trust its own account in
/// the recovery directory's checks (Wine keeps no owner or DACL a program
/// sets; see `vacancy::platform::windows::WINE_TRUST_ENV`).
pub const WINE_TRUST_ENV: &str = "VACANCYD_WINE_TRUST_RUNNING_ACCOUNT";

/// The account every program runs as under Wine 8.0.
pub const WINE_USER_SID: &str = "S-1-5-21-0-0-0-1000";

/// `vacancyd.exe` and the Wine prefix it runs in.
#[derive(Debug, Clone)]
pub struct Wine {
    exe: PathBuf,
    prefix: PathBuf,
    /// The X display its programs draw on, when a test gives one.
    display: Option<String>,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

impl Wine {
    /// `$VACANCY_WINDOWS_EXE` (else `target/windows/x86_64-pc-windows-gnu/debug/vacancyd.exe`)
    /// in `$WINEPREFIX` (else `target/windows/wine-prefix`).
    ///
    /// # Errors
    ///
    /// When the build or `wine` is missing, naming the command that makes them.
    pub fn from_env() -> Result<Wine, SupportError> {
        let exe = std::env::var_os("VACANCY_WINDOWS_EXE").map_or_else(
            || workspace().join("target/windows/x86_64-pc-windows-gnu/debug/vacancyd.exe"),
            PathBuf::from,
        );
        let prefix = std::env::var_os("WINEPREFIX").map_or_else(
            || workspace().join("target/windows/wine-prefix"),
            PathBuf::from,
        );
        let missing = |what: &str| SupportError::Invalid {
            what: what.to_owned(),
            message: "run scripts/windows test: it installs the Windows toolchain and Wine, \
                      builds vacancyd.exe and runs these tests"
                .to_owned(),
        };
        if !exe.is_file() {
            return Err(missing(&format!("{} (the Windows build)", exe.display())));
        }
        if !exe.with_file_name("bcryptprimitives.dll").is_file() {
            return Err(missing(
                "the stand-in bcryptprimitives.dll beside vacancyd.exe",
            ));
        }
        if Command::new("wine").arg("--version").output().is_err() {
            return Err(missing("wine"));
        }
        Ok(Wine {
            exe,
            prefix,
            display: None,
        })
    }

    /// The same, with its programs drawing on the X display `name` (the
    /// tray's tests): Wine's system tray and menus appear there.
    pub fn with_display(mut self, name: &str) -> Wine {
        self.display = Some(name.to_owned());
        self
    }

    /// `DISPLAY` for a Wine command: the test's display, else none.
    fn display_env(&self, cmd: &mut Command) {
        match &self.display {
            Some(name) => cmd.env("DISPLAY", name),
            None => cmd.env_remove("DISPLAY"),
        };
    }

    /// The stand-in `bcryptprimitives.dll` beside the test build (Wine 8.0
    /// lacks the DLL; the stand-in is never shipped).
    pub fn stand_in_dll(&self) -> PathBuf {
        self.exe.with_file_name("bcryptprimitives.dll")
    }

    /// The prefix's `C:\`.
    pub fn drive_c(&self) -> PathBuf {
        self.prefix.join("drive_c")
    }

    /// `vacancyd.exe ARGS` under Wine, not yet started: Wine's own messages
    /// off, no colour, `info` logs.
    pub fn vacancyd(&self, args: &[&str]) -> Command {
        self.program(&self.exe, args)
    }

    /// The Windows program `exe` (a Linux path: an installed copy) with
    /// `args` under Wine, as [`vacancyd`](Self::vacancyd) runs the build.
    pub fn program(&self, exe: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new("wine");
        cmd.arg(exe)
            .args(args)
            .env("WINEPREFIX", &self.prefix)
            .env("WINEDEBUG", "-all")
            .env("NO_COLOR", "1")
            .env("VACANCYD_LOG", "info");
        self.display_env(&mut cmd);
        cmd
    }

    /// Run `vacancyd.exe ARGS` with `env` to its end, within 30 s.
    ///
    /// # Errors
    ///
    /// When it cannot be started, or runs past 30 s (a refusal takes about one).
    pub fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Result<Output, SupportError> {
        let what = format!("vacancyd.exe {}", args.join(" "));
        let mut attempts = 0;
        loop {
            let mut cmd = self.vacancyd(args);
            cmd.envs(env.iter().copied());
            let out = output_within(cmd, Duration::from_secs(30), &what)?;
            // Wine's own client lost its wineserver before the program said
            // anything: a server that an earlier test ended, or that was
            // leaving after its idle time, took the connection with it
            // ("wine client error:0: recvmsg: Connection reset by peer").
            // The program never ran; once that server is gone, run it again.
            let lost_server = out.stdout.is_empty()
                && String::from_utf8_lossy(&out.stderr).contains("wine client error");
            attempts += 1;
            if !lost_server || attempts == 3 {
                return Ok(out);
            }
            self.wineserver("-w")?;
        }
    }

    /// A Wine command (`taskkill`, `reg`, `cmd`) in the prefix, to its end.
    ///
    /// # Errors
    ///
    /// When it cannot be started, runs past a minute, or fails.
    pub fn tool(&self, args: &[&str]) -> Result<Output, SupportError> {
        let mut cmd = Command::new("wine");
        cmd.args(args)
            .env("WINEPREFIX", &self.prefix)
            .env("WINEDEBUG", "-all");
        self.display_env(&mut cmd);
        let what = format!("wine {}", args.join(" "));
        let out = output_within(cmd, Duration::from_secs(60), &what)?;
        if !out.status.success() {
            return Err(SupportError::Command {
                what,
                status: out.status.to_string(),
                tail: tail_lines(&String::from_utf8_lossy(&out.stderr), 20),
            });
        }
        Ok(out)
    }

    /// `wineserver -k`: every process in the prefix ends at once, as a power
    /// cut ends them, then the server itself; returns once it is gone.
    ///
    /// # Errors
    ///
    /// When `wineserver` cannot be run.
    pub fn kill_everything(&self) -> Result<(), SupportError> {
        self.wineserver("-k")?;
        self.wineserver("-w")
    }

    /// `wineserver FLAG` for the prefix, to its end within 30 s (`-w`
    /// returns once the server is gone).
    fn wineserver(&self, flag: &str) -> Result<(), SupportError> {
        let mut cmd = Command::new("wineserver");
        cmd.arg(flag).env("WINEPREFIX", &self.prefix);
        output_within(cmd, Duration::from_secs(30), &format!("wineserver {flag}"))?;
        Ok(())
    }

    /// A folder `C:\ProgramData\vacancyd\<name>` made from the Linux side
    /// with mode `mode` (and its parents private, 0700): Wine shows a mode
    /// of 0700 as a DACL for LocalSystem and its user alone, and 0755 as one
    /// that lets Everyone read. Returns (its Linux path, its Windows path).
    ///
    /// # Errors
    ///
    /// When the folder cannot be made.
    pub fn program_data_dir(
        &self,
        name: &str,
        mode: u32,
    ) -> Result<(PathBuf, String), SupportError> {
        use std::os::unix::fs::PermissionsExt;
        let base = self.drive_c().join("ProgramData/vacancyd");
        let linux = base.join(name.replace('\\', "/"));
        let io = |e| SupportError::io(format!("make {}", linux.display()), e);
        std::fs::create_dir_all(&linux).map_err(io)?;
        let mut dir = linux.as_path();
        while dir != base.parent().unwrap_or(&base) {
            let m = if dir == linux { mode } else { 0o700 };
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(m)).map_err(io)?;
            match dir.parent() {
                Some(p) => dir = p,
                None => break,
            }
        }
        Ok((linux, format!(r"C:\ProgramData\vacancyd\{name}")))
    }
}

/// The Windows path of a Linux path, through Wine's `Z:` drive.
pub fn windows_path(linux: &Path) -> String {
    format!("Z:{}", linux.display()).replace('/', "\\")
}

/// Run `cmd` to its end within `limit`, its output collected through files:
/// a Wine program's first call may start the prefix's services, which
/// inherit its handles, so a pipe would not close when the program ends.
fn output_within(mut cmd: Command, limit: Duration, what: &str) -> Result<Output, SupportError> {
    use std::process::Stdio;
    let io = |e| SupportError::io(format!("run {what}"), e);
    let out = tempfile::tempfile().map_err(io)?;
    let err = tempfile::tempfile().map_err(io)?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(io)?)
        .stderr(err.try_clone().map_err(io)?)
        .spawn()
        .map_err(io)?;
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(io)? {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(SupportError::Timeout {
                what: what.to_owned(),
                after: limit,
                tail: String::new(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |mut f: std::fs::File| -> Result<Vec<u8>, SupportError> {
        use std::io::{Read, Seek};
        let mut bytes = Vec::new();
        f.rewind().map_err(io)?;
        f.read_to_end(&mut bytes).map_err(io)?;
        Ok(bytes)
    };
    Ok(Output {
        status,
        stdout: read(out)?,
        stderr: read(err)?,
    })
}
