//! A private D-Bus system bus with a fake systemd-logind on it, so the real
//! `loginctl` can be asked about sessions a test chooses.
//!
//! [`Login1Bus::start`] runs a private `dbus-daemon` (a system-type bus that
//! allows everything, listening on a socket in a temporary directory) and a
//! fake `org.freedesktop.login1` written in Python with `jeepney` (installed
//! into the venv [`LOGIN1_VENV`] on first use, a few seconds). The fake serves
//! what `loginctl list-sessions` and `loginctl show-session` (systemd 252)
//! call: `Manager.ListSessions`, `Manager.GetSession` and
//! `org.freedesktop.DBus.Properties` `Get`/`GetAll` on each session. It re-reads
//! its sessions on every call, so [`Login1Bus::set_sessions`] takes effect at
//! once.
//!
//! `loginctl` refuses to run on a machine not booted with systemd (it checks
//! that `/run/systemd/system` exists). [`Login1Bus::loginctl`] is a wrapper
//! that runs the real `loginctl` with its arguments, in a private mount
//! namespace with that directory on such a machine (`unshare`: root, or
//! unprivileged user namespaces and util-linux 2.38+), and plainly otherwise. Run it with
//! `DBUS_SYSTEM_BUS_ADDRESS` set to [`Login1Bus::address`].
//!
//! Needs `dbus-daemon`, `loginctl`, `unshare` and `python3` with venv.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::{SupportError, tail_lines};
use crate::process::ManagedProcess;
use crate::python::{PythonVenv, run_checked};

/// The venv (under `cache_dir()/venvs/`) that holds the fake logind's library.
pub const LOGIN1_VENV: &str = "login1-jeepney-0.9.0";

/// What [`LOGIN1_VENV`] holds: jeepney, a pure-Python D-Bus library.
pub const LOGIN1_PACKAGES: &[&str] = &["jeepney==0.9.0"];

/// The fake logind, written next to the bus's socket.
const FAKE: &str = include_str!("login1_fake.py");

/// How long the bus and the fake may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// The wrapper [`Login1Bus::loginctl`] names: `loginctl "$@"` where
/// `/run/systemd/system` exists (sd_booted), else in a private mount namespace
/// with a tmpfs holding it.
const LOGINCTL_WRAPPER: &str = r#"#!/bin/sh
if [ -d /run/systemd/system ]; then exec loginctl "$@"; fi
over=/run/systemd; [ -d "$over" ] || over=/run
user=""; [ "$(id -u)" -eq 0 ] || user="--map-current-user --keep-caps"
exec unshare --mount --propagation private $user sh -c '
  mount -t tmpfs tmpfs "$0" && mkdir -p /run/systemd/system && exec loginctl "$@"' "$over" "$@"
"#;

/// A session of the fake logind, as its D-Bus properties say.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeSession {
    /// `Id`, e.g. `"2"` or `"c5"`.
    pub id: String,
    /// The user's uid (`User`).
    pub uid: u32,
    /// `Name`: the user name.
    pub user: String,
    /// `Seat`: `"seat0"`, or empty for none.
    pub seat: String,
    /// `TTY`: e.g. `"tty2"`, `"pts/0"`, or empty.
    pub tty: String,
    /// `Type`: `x11`, `wayland`, `mir`, `tty`, `unspecified`.
    pub kind: String,
    /// `Class`: `user`, `greeter`, `lock-screen`, `background`.
    pub class: String,
    /// `Remote`.
    pub remote: bool,
    /// `Active`.
    pub active: bool,
    /// `State`: `active`, `online`, `closing`.
    pub state: String,
    /// `IdleHint`.
    pub idle: bool,
    /// Properties served instead of (or besides) the above, as
    /// `(name, D-Bus signature, JSON value)`: what a real logind never serves.
    pub overrides: Vec<(String, String, serde_json::Value)>,
}

impl FakeSession {
    /// An active, non-idle local user session of type `kind` on seat0.
    pub fn local(id: &str, kind: &str) -> Self {
        FakeSession {
            id: id.to_owned(),
            uid: 1000,
            user: "owner".to_owned(),
            seat: "seat0".to_owned(),
            tty: if kind == "tty" { "tty3" } else { "tty2" }.to_owned(),
            kind: kind.to_owned(),
            class: "user".to_owned(),
            remote: false,
            active: true,
            state: "active".to_owned(),
            idle: false,
            overrides: Vec::new(),
        }
    }

    /// An active SSH login: a remote `tty` user session without a seat.
    pub fn ssh(id: &str) -> Self {
        FakeSession {
            seat: String::new(),
            tty: "pts/0".to_owned(),
            remote: true,
            ..Self::local(id, "tty")
        }
    }

    /// The display manager's login screen: an active `greeter` session.
    pub fn greeter(id: &str) -> Self {
        FakeSession {
            uid: 110,
            user: "gdm".to_owned(),
            class: "greeter".to_owned(),
            ..Self::local(id, "wayland")
        }
    }

    /// The same session with `IdleHint` set to `idle`.
    pub fn idle(mut self, idle: bool) -> Self {
        self.idle = idle;
        self
    }

    /// The same session serving property `name` as `value` of D-Bus type
    /// `signature` (`"s"`, `"b"`, `"u"`, ...).
    pub fn with_property(mut self, name: &str, signature: &str, value: serde_json::Value) -> Self {
        self.overrides
            .push((name.to_owned(), signature.to_owned(), value));
        self
    }

    fn to_json(&self) -> serde_json::Value {
        let props: serde_json::Map<String, serde_json::Value> = self
            .overrides
            .iter()
            .map(|(name, sig, value)| (name.clone(), serde_json::json!([sig, value])))
            .collect();
        serde_json::json!({
            "id": self.id, "uid": self.uid, "user": self.user, "seat": self.seat,
            "tty": self.tty, "type": self.kind, "class": self.class,
            "remote": self.remote, "active": self.active, "state": self.state,
            "idle": self.idle, "props": props,
        })
    }
}

/// A private system bus with a fake logind (see the [module](self)); both
/// processes die with the value.
#[derive(Debug)]
pub struct Login1Bus {
    // Field order: the processes die before their directory goes.
    service: Option<ManagedProcess>,
    bus: Option<ManagedProcess>,
    address: String,
    loginctl: PathBuf,
    sessions_file: PathBuf,
    python: PathBuf,
    script: PathBuf,
    dir: tempfile::TempDir,
}

impl Login1Bus {
    /// Starts the bus and the fake logind with no sessions, and checks that
    /// the wrapped `loginctl` can list them.
    pub fn start() -> Result<Self, SupportError> {
        let venv = PythonVenv::ensure(LOGIN1_VENV, LOGIN1_PACKAGES)?;
        let dir = tempfile::Builder::new()
            .prefix("vacancy-login1-")
            .tempdir()
            .map_err(|e| SupportError::io("create the login1 bus directory", e))?;
        let socket = dir.path().join("system_bus_socket");
        let config = dir.path().join("bus.conf");
        write(&config, &bus_config(&socket))?;
        let script = dir.path().join("login1_fake.py");
        write(&script, FAKE)?;
        let loginctl = dir.path().join("loginctl");
        write(&loginctl, LOGINCTL_WRAPPER)?;
        make_executable(&loginctl)?;
        let sessions_file = dir.path().join("sessions.json");
        let address = format!("unix:path={}", socket.display());

        let mut cmd = Command::new("dbus-daemon");
        cmd.arg(format!("--config-file={}", config.display()))
            .args(["--nofork", "--nopidfile", "--nosyslog"]);
        let mut bus = ManagedProcess::spawn("dbus-daemon", cmd)?;
        wait_for(&mut bus, "the bus socket", || socket.exists())?;

        let mut this = Login1Bus {
            service: None,
            bus: Some(bus),
            address,
            loginctl,
            sessions_file,
            python: PythonVenv::python(&venv),
            script,
            dir,
        };
        this.set_sessions(&[])?;
        this.start_service()?;
        // The whole chain once: wrapper, loginctl, bus, fake.
        let mut probe = Command::new(&this.loginctl);
        probe
            .args(["--no-pager", "--no-legend", "list-sessions"])
            .env("DBUS_SYSTEM_BUS_ADDRESS", &this.address);
        run_checked(&mut probe)?;
        Ok(this)
    }

    /// The bus address, for `DBUS_SYSTEM_BUS_ADDRESS`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// A program that runs the real `loginctl` with its arguments where it
    /// can reach this bus (see the [module](self)).
    pub fn loginctl(&self) -> &Path {
        &self.loginctl
    }

    /// Replaces the fake's sessions; the next call sees them.
    pub fn set_sessions(&self, sessions: &[FakeSession]) -> Result<(), SupportError> {
        let list: Vec<serde_json::Value> = sessions.iter().map(FakeSession::to_json).collect();
        self.write_state(&serde_json::json!({ "sessions": list }))
    }

    /// Makes the fake answer nothing (a hung logind) until the next
    /// [`set_sessions`](Self::set_sessions).
    pub fn go_silent(&self) -> Result<(), SupportError> {
        self.write_state(&serde_json::json!({ "silent": true }))
    }

    /// Starts the fake logind (again), and waits until it owns its name.
    pub fn start_service(&mut self) -> Result<(), SupportError> {
        self.stop_service()?;
        let mut cmd = Command::new(&self.python);
        cmd.arg(&self.script)
            .arg(&self.address)
            .arg(&self.sessions_file);
        let mut service = ManagedProcess::spawn("fake-login1", cmd)?;
        wait_for(&mut service, "the fake login1 to own its name", || false)?;
        self.service = Some(service);
        Ok(())
    }

    /// Stops the fake logind; the bus stays.
    pub fn stop_service(&mut self) -> Result<(), SupportError> {
        if let Some(mut service) = self.service.take() {
            service.kill()?;
        }
        Ok(())
    }

    /// Stops the bus daemon (and the fake): the bus is unreachable.
    pub fn stop_bus(&mut self) -> Result<(), SupportError> {
        self.stop_service()?;
        if let Some(mut bus) = self.bus.take() {
            bus.kill()?;
        }
        Ok(())
    }

    /// The fake's log: one line per call it was asked.
    pub fn service_log(&self) -> String {
        self.service
            .as_ref()
            .map(ManagedProcess::log)
            .unwrap_or_default()
    }

    fn write_state(&self, state: &serde_json::Value) -> Result<(), SupportError> {
        // Written whole, then renamed: the fake never reads half a file.
        let tmp = self.dir.path().join("sessions.json.tmp");
        write(&tmp, &state.to_string())?;
        std::fs::rename(&tmp, &self.sessions_file)
            .map_err(|e| SupportError::io(format!("rename to {}", self.sessions_file.display()), e))
    }
}

/// A system-type bus on `socket` whose policy allows everything.
fn bus_config(socket: &Path) -> String {
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_type="method_call"/>
    <allow send_type="method_return"/>
    <allow send_type="error"/>
    <allow send_type="signal"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
  </policy>
</busconfig>
"#,
        socket.display()
    )
}

fn write(path: &Path, text: &str) -> Result<(), SupportError> {
    std::fs::write(path, text).map_err(|e| SupportError::io(format!("write {}", path.display()), e))
}

fn make_executable(path: &Path) -> Result<(), SupportError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| SupportError::io(format!("chmod {}", path.display()), e))
}

/// Waits until `ready()` holds or the process's log has a line `ready`; an
/// error if it exits or takes longer than [`START_TIMEOUT`].
fn wait_for(
    process: &mut ManagedProcess,
    what: &str,
    ready: impl Fn() -> bool,
) -> Result<(), SupportError> {
    let started = Instant::now();
    loop {
        if ready() || process.log().lines().any(|l| l == "ready") {
            return Ok(());
        }
        if let Some(status) = process.exit_status() {
            return Err(SupportError::Exited {
                name: process.name().to_owned(),
                status: status.to_string(),
                waiting_for: what.to_owned(),
                tail: process.log_tail(60),
            });
        }
        if started.elapsed() > START_TIMEOUT {
            return Err(SupportError::Timeout {
                what: what.to_owned(),
                after: START_TIMEOUT,
                tail: tail_lines(&process.log(), 60),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
