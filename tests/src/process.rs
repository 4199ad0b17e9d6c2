//! Child processes owned by a test, and a tiny blocking HTTP probe.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::error::{SupportError, tail_lines};

/// Lines of log shown in errors and when a test panics.
const TAIL_LINES: usize = 200;

/// How often the `wait_*` methods look again.
const POLL: Duration = Duration::from_millis(25);

/// A child process owned by a test.
///
/// Its stdout and stderr go to one log file in a temporary directory that the
/// `ManagedProcess` owns (and deletes when dropped). Dropping it kills the process
/// (SIGKILL) and reaps it; if the thread is panicking, the last 200 lines of the log
/// are printed to stderr first, so a failing test shows why.
///
/// Only the direct child is signalled: start servers so that the child *is* the
/// server (no shell wrapper that forks it).
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    command_line: String,
    child: Child,
    exit: Option<ExitStatus>,
    log_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl ManagedProcess {
    /// Starts `cmd` with stdin from `/dev/null` and stdout and stderr appended to
    /// its log file. `name` labels the log and every error.
    pub fn spawn(name: &str, mut cmd: Command) -> Result<Self, SupportError> {
        let command_line = describe(&cmd);
        let file_name: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let dir = tempfile::Builder::new()
            .prefix(&format!("vacancy-{file_name}-"))
            .tempdir()
            .map_err(|e| SupportError::io(format!("{name}: create a log directory"), e))?;
        let log_path = dir.path().join(format!("{file_name}.log"));
        let log = File::create(&log_path)
            .map_err(|e| SupportError::io(format!("{name}: create {}", log_path.display()), e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| SupportError::io(format!("{name}: duplicate the log handle"), e))?;
        cmd.stdin(Stdio::null()).stdout(log).stderr(log_err);
        let child = cmd
            .spawn()
            .map_err(|e| SupportError::io(format!("{name}: spawn {command_line}"), e))?;
        Ok(Self {
            name: name.to_owned(),
            command_line,
            child,
            exit: None,
            log_path,
            _dir: dir,
        })
    }

    /// The name given to [`spawn`](Self::spawn).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The path of the log file (stdout and stderr together).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Everything the process has written so far (lossy UTF-8).
    pub fn log(&self) -> String {
        match std::fs::read(&self.log_path) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) => format!("<log {} unreadable: {e}>", self.log_path.display()),
        }
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail_lines(&self.log(), lines)
    }

    /// Whether the process is still running (reaps it if it has exited).
    pub fn is_running(&mut self) -> bool {
        self.exit_status().is_none()
    }

    /// The exit status, if the process has exited; does not wait.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            // An error here means the child was already reaped, which only this
            // type does, and it records the status when it does.
            if let Ok(Some(status)) = self.child.try_wait() {
                self.exit = Some(status);
            }
        }
        self.exit
    }

    /// Waits up to `timeout` for the process to exit; `None` if it is still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit_status() {
                return Some(status);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            std::thread::sleep(POLL.min(deadline - now));
        }
    }

    /// Kills the process with SIGKILL and reaps it. Returns its exit status (that
    /// of its earlier exit if it had already exited).
    pub fn kill(&mut self) -> Result<ExitStatus, SupportError> {
        if let Some(status) = self.exit_status() {
            return Ok(status);
        }
        self.child
            .kill()
            .map_err(|e| SupportError::io(format!("{}: kill pid {}", self.name, self.pid()), e))?;
        let status = self.child.wait().map_err(|e| {
            SupportError::io(format!("{}: wait for pid {}", self.name, self.pid()), e)
        })?;
        self.exit = Some(status);
        Ok(status)
    }

    /// Asks the process to stop with SIGTERM (`kill -TERM <pid>`), waits up to
    /// `timeout`, then kills it with SIGKILL. Returns its exit status.
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus, SupportError> {
        if let Some(status) = self.exit_status() {
            return Ok(status);
        }
        // The child is not reaped yet, so its pid cannot have been reused.
        let pid = self.pid().to_string();
        let out = Command::new("kill")
            .args(["-TERM", &pid])
            .output()
            .map_err(|e| SupportError::io(format!("{}: run kill -TERM {pid}", self.name), e))?;
        if !out.status.success() && self.exit_status().is_none() {
            return Err(SupportError::Command {
                what: format!("kill -TERM {pid} ({})", self.name),
                status: out.status.to_string(),
                tail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        match self.wait_exit(timeout) {
            Some(status) => Ok(status),
            None => self.kill(),
        }
    }

    /// Polls `GET url` until it answers 200 (ready), the process exits (error with
    /// the log tail), or `timeout` passes (error with the last answer and the log tail).
    pub fn wait_http_ok(&mut self, url: &str, timeout: Duration) -> Result<(), SupportError> {
        self.wait_http_ok_with(url, &[], timeout)
    }

    /// [`wait_http_ok`](Self::wait_http_ok), sending `headers` with every probe
    /// (e.g. the credential of a server that asks for one).
    pub fn wait_http_ok_with(
        &mut self,
        url: &str,
        headers: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<(), SupportError> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.exit_status() {
                return Err(SupportError::Exited {
                    name: self.name.clone(),
                    status: status.to_string(),
                    waiting_for: format!("waiting for GET {url} to answer 200"),
                    tail: self.log_tail(TAIL_LINES),
                });
            }
            let left = timeout.saturating_sub(start.elapsed());
            let attempt = left.clamp(Duration::from_millis(100), Duration::from_secs(2));
            let last = match get_status(url, headers, attempt) {
                Ok(200) => return Ok(()),
                Ok(code) => format!("last answer: HTTP {code}"),
                Err(e) => format!("last error: {e}"),
            };
            if start.elapsed() >= timeout {
                return Err(SupportError::Timeout {
                    what: format!(
                        "{} (pid {}): GET {url} never answered 200 ({last})",
                        self.name,
                        self.pid()
                    ),
                    after: timeout,
                    tail: self.log_tail(TAIL_LINES),
                });
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        // Nothing more can be done about a failed kill here; the process is ours
        // and unreaped, so it only fails if it is already gone.
        let killed = self.kill();
        if std::thread::panicking() {
            let outcome = match killed {
                Ok(status) => status.to_string(),
                Err(e) => e.to_string(),
            };
            eprintln!(
                "--- {name} (pid {pid}: {cmd}; {outcome}): last {TAIL_LINES} log lines ---\n{tail}\n--- end of {name} log ---",
                name = self.name,
                pid = self.pid(),
                cmd = self.command_line,
                tail = self.log_tail(TAIL_LINES),
            );
        }
    }
}

/// `program arg1 arg2 …` for messages.
pub(crate) fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Sends `GET url` (plain `http://host:port/path`) over a fresh connection and
/// returns the status code. A small blocking HTTP/1.1 client for readiness probes;
/// `timeout` bounds the connect and each read and write.
pub fn http_get_status(url: &str, timeout: Duration) -> Result<u16, SupportError> {
    get_status(url, &[], timeout)
}

/// [`http_get_status`] with extra request headers.
fn get_status(url: &str, headers: &[(&str, &str)], timeout: Duration) -> Result<u16, SupportError> {
    let fail = |message: String| SupportError::http("GET", url, message);
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| fail("only http:// URLs are supported".into()))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = authority
        .to_socket_addrs()
        .map_err(|e| fail(format!("resolve {authority}: {e}")))?
        .next()
        .ok_or_else(|| fail(format!("{authority} resolves to no address")))?;
    let mut stream =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| fail(format!("connect: {e}")))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| fail(format!("set timeouts: {e}")))?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n");
    for (name, value) in headers {
        if [name, value].iter().any(|s| s.contains(['\r', '\n'])) {
            return Err(fail(format!("header {name:?} has a line break")));
        }
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|e| fail(format!("send: {e}")))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 512];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 8192 {
        let n = stream
            .read(&mut buf)
            .map_err(|e| fail(format!("read: {e}")))?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    let status_line = head.lines().next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    match (parts.next(), parts.next().map(str::parse::<u16>)) {
        (Some(version), Some(Ok(code))) if version.starts_with("HTTP/") => Ok(code),
        _ => Err(fail(format!("not an HTTP status line: {status_line:?}"))),
    }
}
