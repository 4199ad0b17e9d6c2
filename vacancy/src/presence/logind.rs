//! `presence = "logind"`: the owner's login sessions, as systemd-logind knows
//! them, read through the real `loginctl` binary.
//!
//! Two calls per check: `loginctl --no-pager --no-legend list-sessions` for the
//! session ids, then `loginctl --no-pager --all show-session ID... -p Id -p Type
//! -p Class -p Remote -p Active -p State -p IdleHint` for what each session is.
//! `loginctl` talks D-Bus to `org.freedesktop.login1` on the system bus (and
//! honours `DBUS_SYSTEM_BUS_ADDRESS`).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::process::Command;
use tracing::{info, warn};

use super::PresenceBackend;
use crate::engine::OwnerPresence;

/// The properties `show-session` is asked for; each block must have them all.
const PROPERTIES: [&str; 7] = [
    "Id", "Type", "Class", "Remote", "Active", "State", "IdleHint",
];

/// Session types of someone at the machine: graphical or console.
const LOCAL_TYPES: [&str; 4] = ["x11", "wayland", "mir", "tty"];

/// Why logind could not be read; the check is then unknown (OWN-01).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum LogindError {
    /// `loginctl` could not be started (missing, not executable).
    #[error("{program} cannot be started: {message}")]
    Spawn {
        /// The program that was run.
        program: String,
        /// The operating system's error.
        message: String,
    },
    /// The whole check took longer than the bound.
    #[error("loginctl did not answer within {timeout_ms} ms")]
    Timeout {
        /// The bound.
        timeout_ms: u64,
    },
    /// `loginctl` ended unsuccessfully (logind or the bus unreachable, ...).
    #[error("`loginctl {command}` failed ({status}): {stderr}")]
    Failed {
        /// The subcommand.
        command: &'static str,
        /// How it ended.
        status: String,
        /// The first line of what it said.
        stderr: String,
    },
    /// `loginctl` answered something this backend cannot read.
    #[error("`loginctl {command}` answered what this backend cannot read: {why}")]
    Unparseable {
        /// The subcommand.
        command: &'static str,
        /// What was wrong.
        why: String,
    },
}

/// One session as `show-session` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Session {
    id: String,
    kind: String,
    class: String,
    remote: bool,
    active: bool,
    state: String,
    idle: bool,
}

impl Session {
    /// Whether this session is the owner at the machine (OWN-01): an active,
    /// non-idle user session, graphical or console, local unless remote
    /// sessions count. Greeters and lock screens (class `greeter`,
    /// `lock-screen`) and background sessions are not the owner.
    fn is_owner_present(&self, remote_sessions_count: bool) -> bool {
        self.class == "user"
            && LOCAL_TYPES.contains(&self.kind.as_str())
            && self.active
            && self.state == "active"
            && !self.idle
            && (!self.remote || remote_sessions_count)
    }
}

/// Reads owner presence from systemd-logind with `loginctl`.
///
/// # Behavior
///
/// Present while some session is an active (`Active=yes`, `State=active`),
/// non-idle (`IdleHint=no`) session of class `user` and type `x11`,
/// `wayland`, `mir` or `tty`, with `Remote=no`, or any `Remote` when
/// `remote_sessions_count` is set (SSH sessions are remote `tty` sessions).
/// Away when there is no such session. Unknown (OWN-01: incomplete session
/// evidence, which refuses host-scoped work) when `loginctl` cannot be
/// started, fails (logind or the bus unreachable), answers what cannot be
/// read, or takes longer than the timeout (it is killed). A `show-session`
/// failure is retried once with a fresh session list, since a session may end
/// between the two calls. Each change of the reason presence is unknown is
/// logged once.
#[derive(Debug)]
pub struct LogindBackend {
    program: PathBuf,
    bus_address: Option<String>,
    remote_sessions_count: bool,
    timeout: Duration,
    /// The reason of the last unknown answer (`None`: the last check answered).
    last_failure: Mutex<Option<String>>,
}

impl LogindBackend {
    /// How long one check may take by default (both `loginctl` calls).
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    /// A backend running `loginctl` from `PATH` against the system bus;
    /// `remote_sessions_count` is `[owner] remote_sessions_count`.
    pub fn new(remote_sessions_count: bool) -> Self {
        LogindBackend {
            program: PathBuf::from("loginctl"),
            bus_address: None,
            remote_sessions_count,
            timeout: Self::DEFAULT_TIMEOUT,
            last_failure: Mutex::new(None),
        }
    }

    /// The same backend running another `loginctl` program (a path, or a
    /// wrapper taking `loginctl`'s arguments).
    pub fn with_loginctl(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = program.into();
        self
    }

    /// The same backend asking logind on another bus: `loginctl` runs with
    /// `DBUS_SYSTEM_BUS_ADDRESS` set to `address` (this process's
    /// environment is not changed).
    pub fn with_bus_address(mut self, address: impl Into<String>) -> Self {
        self.bus_address = Some(address.into());
        self
    }

    /// The same backend with another bound on one check.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether remote (SSH) sessions count as the owner.
    pub fn remote_sessions_count(&self) -> bool {
        self.remote_sessions_count
    }

    /// The sessions logind has now, or why they cannot be known.
    async fn sessions(&self) -> Result<Vec<Session>, LogindError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let listed = self
                .run(
                    "list-sessions",
                    &["--no-pager", "--no-legend", "list-sessions"],
                )
                .await?;
            let ids = parse_session_ids(&listed)?;
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            let mut args: Vec<&str> = vec!["--no-pager", "--all", "show-session"];
            args.extend(ids.iter().map(String::as_str));
            for property in PROPERTIES {
                args.push("-p");
                args.push(property);
            }
            match self.run("show-session", &args).await {
                Ok(shown) => return parse_sessions(&shown, &ids),
                // A session may have ended between the two calls: ask again once.
                Err(LogindError::Failed { .. }) if attempt < 2 => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Runs `loginctl args`, answering its standard output if it succeeded.
    async fn run(&self, command: &'static str, args: &[&str]) -> Result<String, LogindError> {
        let mut cmd = Command::new(&self.program);
        cmd.args(args)
            .env("SYSTEMD_PAGER", "")
            .env("SYSTEMD_COLORS", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(address) = &self.bus_address {
            cmd.env("DBUS_SYSTEM_BUS_ADDRESS", address);
        }
        let output = cmd.output().await.map_err(|e| LogindError::Spawn {
            program: self.program.display().to_string(),
            message: e.to_string(),
        })?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(LogindError::Failed {
                command,
                status: output.status.to_string(),
                stderr: stderr.lines().next().unwrap_or("").trim().to_owned(),
            });
        }
        String::from_utf8(output.stdout).map_err(|_| LogindError::Unparseable {
            command,
            why: "output is not UTF-8".to_owned(),
        })
    }

    /// Logs `failure` if it differs from the last one (no flood at each poll).
    fn note(&self, failure: Option<&LogindError>) {
        let text = failure.map(ToString::to_string);
        let mut last = match self.last_failure.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if *last == text {
            return;
        }
        match (&text, last.is_some()) {
            (Some(reason), _) => warn!(
                reason = %reason,
                "logind cannot be read, so owner presence is unknown and host-scoped upstreams refuse work; on a machine without an owner at it set [owner] presence = \"none\" (or \"manual\", \"command\")"
            ),
            (None, true) => info!("logind answers again; owner presence follows its sessions"),
            (None, false) => {}
        }
        *last = text;
    }
}

#[async_trait]
impl PresenceBackend for LogindBackend {
    fn name(&self) -> &str {
        "logind"
    }

    async fn presence(&self) -> OwnerPresence {
        let checked = match tokio::time::timeout(self.timeout, self.sessions()).await {
            Ok(result) => result,
            // Dropping the future drops the child, and kill_on_drop kills it.
            Err(_) => Err(LogindError::Timeout {
                timeout_ms: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
            }),
        };
        match checked {
            Ok(sessions) => {
                self.note(None);
                verdict(&sessions, self.remote_sessions_count)
            }
            Err(e) => {
                self.note(Some(&e));
                OwnerPresence::Unknown
            }
        }
    }
}

/// Present if any session is the owner at the machine, else away (OWN-01).
fn verdict(sessions: &[Session], remote_sessions_count: bool) -> OwnerPresence {
    if sessions
        .iter()
        .any(|s| s.is_owner_present(remote_sessions_count))
    {
        OwnerPresence::Present
    } else {
        OwnerPresence::Away
    }
}

/// Whether `id` looks like a logind session id (`2`, `c5`, `auto-x`): it is
/// passed to `loginctl` as an argument, so nothing that could read as an
/// option.
fn is_session_id(id: &str) -> bool {
    !id.is_empty()
        && !id.starts_with('-')
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The session ids of `loginctl --no-legend list-sessions` (systemd 252:
/// `SESSION UID USER SEAT TTY`, right-aligned, seat and tty may be empty).
fn parse_session_ids(out: &str) -> Result<Vec<String>, LogindError> {
    let bad = |why: String| LogindError::Unparseable {
        command: "list-sessions",
        why,
    };
    let mut ids = Vec::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let mut fields = line.split_whitespace();
        let (Some(id), Some(uid), Some(_user)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(bad(format!(
                "a line without session, uid and user: {line:?}"
            )));
        };
        if !is_session_id(id) || uid.parse::<u32>().is_err() {
            return Err(bad(format!("not a session line: {line:?}")));
        }
        if !ids.iter().any(|known| known == id) {
            ids.push(id.to_owned());
        }
    }
    Ok(ids)
}

/// The sessions of `loginctl --all show-session ID... -p ...`: one block of
/// `Key=value` lines per session, separated by blank lines, each with every
/// property of [`PROPERTIES`]; exactly the sessions `ids` asked for.
fn parse_sessions(out: &str, ids: &[String]) -> Result<Vec<Session>, LogindError> {
    let bad = |why: String| LogindError::Unparseable {
        command: "show-session",
        why,
    };
    let mut sessions = Vec::new();
    for block in out.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let mut fields: Vec<(&str, &str)> = Vec::new();
        for line in block.lines().filter(|l| !l.is_empty()) {
            let Some((key, value)) = line.split_once('=') else {
                return Err(bad(format!("not a property line: {line:?}")));
            };
            fields.push((key, value));
        }
        let get = |key: &str| -> Result<&str, LogindError> {
            fields
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| *v)
                .ok_or_else(|| bad(format!("a session without {key}")))
        };
        let flag = |key: &str| -> Result<bool, LogindError> {
            match get(key)? {
                "yes" => Ok(true),
                "no" => Ok(false),
                other => Err(bad(format!("{key}={other:?} is neither yes nor no"))),
            }
        };
        sessions.push(Session {
            id: get("Id")?.to_owned(),
            kind: get("Type")?.to_owned(),
            class: get("Class")?.to_owned(),
            remote: flag("Remote")?,
            active: flag("Active")?,
            state: get("State")?.to_owned(),
            idle: flag("IdleHint")?,
        });
    }
    let mut got: Vec<&str> = sessions.iter().map(|s| s.id.as_str()).collect();
    let mut want: Vec<&str> = ids.iter().map(String::as_str).collect();
    got.sort_unstable();
    want.sort_unstable();
    if got != want {
        return Err(bad(format!("sessions {got:?} for {want:?}")));
    }
    Ok(sessions)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn block(id: &str, kind: &str, class: &str, remote: &str, active: &str, idle: &str) -> String {
        // The order GetAll gives, as loginctl 252 prints it.
        format!(
            "Id={id}\nRemote={remote}\nType={kind}\nClass={class}\nActive={active}\nState={}\nIdleHint={idle}\n",
            if active == "yes" { "active" } else { "online" }
        )
    }

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn session_ids_come_from_the_first_column() {
        // Captured from loginctl 252 against the fake login1 of vacancy-test-support.
        let out = " 2 1000 owner seat0 tty2\nc5 1000 owner       pts/0\n";
        assert_eq!(parse_session_ids(out).unwrap(), ids(&["2", "c5"]));
        assert_eq!(parse_session_ids("").unwrap(), Vec::<String>::new());
        // A legend or message, or an option-like id, is not a session (OWN-01:
        // unreadable evidence is unknown, never away).
        for garbage in [
            "SESSION  UID USER  SEAT  TTY\n",
            "No sessions.\n",
            "-p 1000 owner\n",
            "2 owner seat0\n",
            "2\n",
        ] {
            assert!(parse_session_ids(garbage).is_err(), "{garbage:?}");
        }
    }

    #[test]
    fn show_session_blocks_are_read_strictly() {
        let out = format!(
            "{}\n{}",
            block("2", "wayland", "user", "no", "yes", "no"),
            block("c5", "tty", "user", "yes", "yes", "no")
        );
        let sessions = parse_sessions(&out, &ids(&["2", "c5"])).unwrap();
        assert_eq!(sessions.len(), 2);
        assert_eq!(sessions[0].kind, "wayland");
        assert!(sessions[1].remote);
        // Empty values appear with --all (`Type=`) and are read as such.
        let empty = block("3", "", "user", "no", "yes", "no");
        assert_eq!(parse_sessions(&empty, &ids(&["3"])).unwrap()[0].kind, "");
        // OWN-01: anything unreadable is an error (unknown), never away.
        let one = block("2", "x11", "user", "no", "yes", "no");
        for (garbage, asked) in [
            (one.replace("Active=yes", "Active=perhaps"), ids(&["2"])),
            (one.replace("IdleHint=no\n", ""), ids(&["2"])),
            (one.replace("Class=user", "Class user"), ids(&["2"])),
            (one.clone(), ids(&["2", "3"])),
            (one.clone(), ids(&["9"])),
            (String::new(), ids(&["2"])),
        ] {
            assert!(parse_sessions(&garbage, &asked).is_err(), "{garbage:?}");
        }
    }

    #[test]
    fn only_an_active_local_user_session_not_idle_is_the_owner() {
        // OWN-01: the owner at the machine refuses host-scoped work.
        let read = |b: String| parse_sessions(&b, &ids(&["1"])).unwrap();
        for kind in LOCAL_TYPES {
            let present = read(block("1", kind, "user", "no", "yes", "no"));
            assert_eq!(verdict(&present, false), OwnerPresence::Present, "{kind}");
        }
        for (b, why) in [
            (block("1", "x11", "user", "no", "yes", "yes"), "idle"),
            (block("1", "x11", "user", "no", "no", "no"), "not active"),
            (block("1", "x11", "greeter", "no", "yes", "no"), "greeter"),
            (
                block("1", "x11", "lock-screen", "no", "yes", "no"),
                "lock screen",
            ),
            (
                block("1", "unspecified", "background", "no", "yes", "no"),
                "background",
            ),
            (block("1", "tty", "user", "yes", "yes", "no"), "remote"),
        ] {
            assert_eq!(verdict(&read(b), false), OwnerPresence::Away, "{why}");
        }
        assert_eq!(verdict(&[], false), OwnerPresence::Away, "no sessions");
        // A closing session is not the owner even if still marked active.
        let closing =
            block("1", "tty", "user", "no", "yes", "no").replace("State=active", "State=closing");
        assert_eq!(verdict(&read(closing), false), OwnerPresence::Away);
        // remote_sessions_count: an SSH session counts, but not when idle.
        let ssh = read(block("1", "tty", "user", "yes", "yes", "no"));
        assert_eq!(verdict(&ssh, true), OwnerPresence::Present);
        let idle_ssh = read(block("1", "tty", "user", "yes", "yes", "yes"));
        assert_eq!(verdict(&idle_ssh, true), OwnerPresence::Away);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_missing_or_failing_loginctl_is_unknown() {
        // OWN-01: no answer is unknown, never away.
        let missing = LogindBackend::new(false).with_loginctl("/nonexistent/loginctl");
        assert_eq!(missing.presence().await, OwnerPresence::Unknown);
        assert_eq!(missing.presence().await, OwnerPresence::Unknown);
        let failing = LogindBackend::new(false).with_loginctl("false");
        assert_eq!(failing.presence().await, OwnerPresence::Unknown);
        // The reason is kept, so it is logged once per change, not per poll.
        let reason = missing.last_failure.lock().unwrap().clone().unwrap();
        assert!(reason.contains("cannot be started"), "{reason}");
        assert!(
            failing
                .last_failure
                .lock()
                .unwrap()
                .as_ref()
                .unwrap()
                .contains("failed")
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn garbage_from_loginctl_is_unknown_and_an_answer_clears_the_reason() {
        // OWN-01: a loginctl that prints what cannot be read is unknown.
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("loginctl");
        std::fs::write(&fake, "#!/bin/sh\necho 'all is well'\n").unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let b = LogindBackend::new(false).with_loginctl(&fake);
        assert_eq!(b.presence().await, OwnerPresence::Unknown);
        assert!(b.last_failure.lock().unwrap().is_some());
        std::fs::write(&fake, "#!/bin/sh\nexit 0\n").unwrap();
        assert_eq!(b.presence().await, OwnerPresence::Away, "no sessions");
        assert!(b.last_failure.lock().unwrap().is_none());
    }
}
