//! Reading the owner's load on a GPU, and finding the processes that are not the owner's.

#[cfg(not(windows))]
use std::collections::HashSet;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
#[cfg(not(windows))]
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use thiserror::Error;

use crate::config::normalize_host;
use crate::engine::pressure::OwnerLoad;

/// Why the owner's load on a GPU could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PressureError {
    /// Nothing can measure this GPU's pressure here: this build has no NVML
    /// support, the driver library is missing, or there is no such device.
    #[error("GPU pressure on {gpu} cannot be measured here: {reason}")]
    Unavailable {
        /// The GPU resource.
        gpu: String,
        /// Why, with what to do about it.
        reason: String,
    },
    /// One read failed; the next may succeed.
    #[error("reading the owner's load on {gpu} failed: {reason}")]
    Read {
        /// The GPU resource.
        gpu: String,
        /// What failed.
        reason: String,
    },
    /// The GPU's utilization cannot be split between the owner and the
    /// excluded processes (no per-process utilization on this GPU or driver).
    #[error("the owner's share of {gpu}'s utilization cannot be told: {reason}")]
    Unattributable {
        /// The GPU resource.
        gpu: String,
        /// Why.
        reason: String,
    },
}

/// Reads the owner's load on one GPU.
#[async_trait]
pub trait PressureReader: Send + Sync {
    /// The GPU resource this reader measures.
    fn name(&self) -> &str;

    /// The owner's load: utilization and memory of the GPU's processes whose
    /// PIDs are not in `exclude_pids` (the lent upstream servers, see
    /// [`server_pids`]).
    ///
    /// # Errors
    ///
    /// A [`PressureError`] when the load cannot be read or attributed; the
    /// tracker then takes it as a failed read (the reading is unavailable).
    async fn read(&self, exclude_pids: &[u32]) -> Result<OwnerLoad, PressureError>;
}

/// What a [`ScriptedReader`] holds: results still to give, and every call's exclusions.
#[derive(Debug, Default)]
struct Script {
    queue: VecDeque<Result<OwnerLoad, String>>,
    calls: Vec<Vec<u32>>,
}

/// A GPU whose reader could not be set up (no NVML, no such device): every
/// read fails with why, so its pressure reads unavailable and refuses work on
/// it (PRES-04) rather than lending unmeasured.
#[derive(Debug, Clone)]
pub struct UnavailableReader {
    error: PressureError,
}

impl UnavailableReader {
    /// A reader that always answers `error`.
    pub fn new(error: PressureError) -> Self {
        UnavailableReader { error }
    }
}

#[async_trait]
impl PressureReader for UnavailableReader {
    fn name(&self) -> &str {
        "unavailable"
    }
    async fn read(&self, _exclude_pids: &[u32]) -> Result<OwnerLoad, PressureError> {
        Err(self.error.clone())
    }
}

/// A [`PressureReader`] for tests and CI: it returns the results queued by
/// the test, in order, and records each call's `exclude_pids`.
///
/// Clones share the queue, so a test keeps one handle and gives another to
/// the code under test. With the queue empty, a read fails
/// ([`PressureError::Read`], "nothing queued").
#[derive(Debug, Clone)]
pub struct ScriptedReader {
    name: String,
    script: Arc<Mutex<Script>>,
}

impl ScriptedReader {
    /// A reader for the GPU resource `name` with nothing queued.
    pub fn new(name: impl Into<String>) -> Self {
        ScriptedReader {
            name: name.into(),
            script: Arc::new(Mutex::new(Script::default())),
        }
    }

    fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queue a good read.
    pub fn push_load(&self, load: OwnerLoad) {
        self.script().queue.push_back(Ok(load));
    }

    /// Queue a failed read ([`PressureError::Read`] with `reason`).
    pub fn push_failure(&self, reason: impl Into<String>) {
        self.script().queue.push_back(Err(reason.into()));
    }

    /// How many results are still queued.
    pub fn pending(&self) -> usize {
        self.script().queue.len()
    }

    /// The `exclude_pids` of every read so far, in order.
    pub fn calls(&self) -> Vec<Vec<u32>> {
        self.script().calls.clone()
    }
}

#[async_trait]
impl PressureReader for ScriptedReader {
    fn name(&self) -> &str {
        &self.name
    }

    async fn read(&self, exclude_pids: &[u32]) -> Result<OwnerLoad, PressureError> {
        let mut script = self.script();
        script.calls.push(exclude_pids.to_vec());
        match script.queue.pop_front() {
            Some(Ok(load)) => Ok(load),
            Some(Err(reason)) => Err(PressureError::Read {
                gpu: self.name.clone(),
                reason,
            }),
            None => Err(PressureError::Read {
                gpu: self.name.clone(),
                reason: "nothing queued in the scripted reader".to_owned(),
            }),
        }
    }
}

/// The PIDs of the upstream servers: the processes listening on `ports` and
/// every process they started, so that their GPU use is not counted as the
/// owner's. The descendants matter: an Ollama server's models run in runner
/// processes it starts, a vLLM server's in engine processes.
///
/// # Behavior
///
/// - Linux: listening TCP sockets are found in `/proc/net/tcp` and
///   `/proc/net/tcp6` (this network namespace), then their owners by the
///   `socket:[inode]` links under `/proc/*/fd`, then those owners'
///   descendants by the parent PIDs in `/proc/*/stat` (readable for every
///   process) — except init's and a systemd manager's, which hold sockets
///   for socket-activated services and are the ancestors of everything.
/// - Windows: the listening sockets' owners come from `GetExtendedTcpTable`
///   (every account's, IPv4 and IPv6), their descendants from a Toolhelp32
///   snapshot of the process tree — except the System process's (PID 4,
///   which holds HTTP.sys's listeners). A listener whose owner is not named
///   (PID 0: Wine names none) adds nothing, with a warning. Windows keeps
///   a process's parent PID after the parent ends and reuses PIDs, so a
///   child counts only if it started after its parent (`GetProcessTimes`);
///   a process whose start cannot be read is not counted as the server's
///   (its GPU use counts as the owner's: this errs toward refusing).
/// - Elsewhere the list is empty.
/// - Only host and port are compared; loopback addresses, `0.0.0.0`, `::`
///   and `localhost` count as the same host.
/// - Linux: a process of another account is invisible unless vacancyd may read
///   its `/proc/PID/fd` (the same account, or root). If the socket belongs
///   to a system account (uid 1 to 999, such as the `ollama` user of the
///   packaged service), every process of that account counts as the
///   server's; otherwise (root, a person's account) the server is missing
///   from the list, a warning says so, and its GPU use counts as the owner's.
/// - It reads `/proc` (or the Win32 tables) synchronously: from async
///   code, call it on a blocking thread, and not more often than once a poll.
pub fn server_pids(ports: &[SocketAddr]) -> Vec<u32> {
    #[cfg(windows)]
    {
        win32_server_pids(ports)
    }
    #[cfg(not(windows))]
    {
        proc_server_pids(ports)
    }
}

/// [`server_pids`] from `/proc`.
#[cfg(not(windows))]
fn proc_server_pids(ports: &[SocketAddr]) -> Vec<u32> {
    let mut wanted: Vec<(Listening, SocketAddr)> = Vec::new();
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for sock in parse_listening(&text, v6) {
            if let Some(want) = ports.iter().find(|w| same_socket(sock.local, **w)) {
                wanted.push((sock, *want));
            }
        }
    }
    if wanted.is_empty() {
        return Vec::new();
    }
    let inodes: HashSet<u64> = wanted.iter().map(|(s, _)| s.inode).collect();
    let mut pids = BTreeSet::new();
    let mut found: HashSet<u64> = HashSet::new();
    for pid in all_pids() {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let inode = target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|t| t.parse::<u64>().ok());
            if let Some(inode) = inode.filter(|i| inodes.contains(i)) {
                found.insert(inode);
                pids.insert(pid);
            }
        }
    }
    for (sock, want) in wanted {
        if found.contains(&sock.inode) {
            continue;
        }
        let account = if is_system_account(sock.uid) {
            processes_of(sock.uid)
        } else {
            BTreeSet::new()
        };
        let first = first_time(sock.inode);
        if account.is_empty() {
            if first {
                tracing::warn!(%want, uid = sock.uid, "a server listens on this upstream address, but its process cannot be seen (an account vacancyd may not inspect); its GPU use counts as the owner's: run it as vacancyd's account or under a system account");
            }
        } else {
            if first {
                tracing::info!(%want, uid = sock.uid, "the server on this upstream address runs under a system account vacancyd cannot inspect; every process of that account counts as the server's");
            }
            pids.extend(account);
        }
    }
    with_descendants(pids).into_iter().collect()
}

/// [`server_pids`] from the Win32 tables.
#[cfg(windows)]
fn win32_server_pids(ports: &[SocketAddr]) -> Vec<u32> {
    use crate::platform::windows as win;
    let listeners = match win::listening_tcp() {
        Ok(l) => l,
        Err(e) => {
            if first_time(0) {
                tracing::warn!(error = %e, "the listening TCP sockets cannot be read; the upstream servers' GPU use counts as the owner's");
            }
            return Vec::new();
        }
    };
    let mut roots: BTreeSet<u32> = listeners
        .iter()
        .filter(|(local, _)| ports.iter().any(|w| same_socket(*local, *w)))
        .map(|(_, pid)| *pid)
        .collect();
    // PID 0 is no process: the owner was not named (Wine names none).
    if roots.remove(&0) && first_time(2) {
        tracing::warn!(
            "a listening socket of an upstream server names no owning process; that server's GPU use counts as the owner's"
        );
    }
    if roots.is_empty() {
        return Vec::new();
    }
    let tree = match win::process_tree() {
        Ok(t) => t,
        Err(e) => {
            if first_time(1) {
                tracing::warn!(error = %e, "the process tree cannot be read; only the upstream servers themselves, not the processes they started, are told from the owner's");
            }
            Vec::new()
        }
    };
    let started = |pid: u32| win::process_started(pid);
    descendants(
        roots,
        &tree,
        |pid| pid == 0 || pid == 4,
        |child, parent| matches!((started(child), started(parent)), (Some(c), Some(p)) if c >= p),
    )
    .into_iter()
    .collect()
}

/// Whether `inode` is seen here for the first time in this process: what
/// cannot be seen is said once per listening socket, not at every poll.
fn first_time(inode: u64) -> bool {
    static SAID: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());
    SAID.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(inode)
}

#[cfg(not(windows))]
/// Every PID under `/proc`.
fn all_pids() -> Vec<u32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .collect()
}

#[cfg(not(windows))]
/// A system account (uid 1 to 999, below Debian's and Fedora's first
/// login account): a service's own, such as the `ollama` user. Root and
/// people's accounts run far more than one server.
fn is_system_account(uid: u32) -> bool {
    (1..1000).contains(&uid)
}

/// The processes whose effective uid is `uid` (the owner of `/proc/PID`,
/// readable for every process).
#[cfg(all(unix, not(windows)))]
fn processes_of(uid: u32) -> BTreeSet<u32> {
    use std::os::unix::fs::MetadataExt;
    all_pids()
        .into_iter()
        .filter(|pid| std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == uid))
        .collect()
}

/// Without `/proc` no process is known by its account.
#[cfg(not(any(unix, windows)))]
fn processes_of(_uid: u32) -> BTreeSet<u32> {
    BTreeSet::new()
}

/// `roots` and every process they started, and those started, from the
/// parent PIDs in `/proc/*/stat`. Linux gives an orphan a living parent, so
/// a parent PID is never stale there.
#[cfg(not(windows))]
fn with_descendants(pids: BTreeSet<u32>) -> BTreeSet<u32> {
    let tree: Vec<(u32, u32)> = all_pids()
        .into_iter()
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            Some((pid, parent_pid(&stat)?))
        })
        .collect();
    // A service manager holds the listening sockets of socket-activated
    // services: everything descends from it, the owner's own work included.
    descendants(pids, &tree, is_service_manager, |_, _| true)
}

/// `roots` and their descendants in `tree` (`(pid, parent pid)` pairs):
/// a root for which `not_a_server` holds is kept but not expanded (a service
/// manager, the ancestor of everything), and a child counts only if
/// `child_of(child, parent)` confirms it (a parent PID may be stale).
fn descendants(
    mut pids: BTreeSet<u32>,
    tree: &[(u32, u32)],
    not_a_server: impl Fn(u32) -> bool,
    child_of: impl Fn(u32, u32) -> bool,
) -> BTreeSet<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for &(pid, ppid) in tree {
        if pid != ppid {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut todo: Vec<u32> = pids.iter().copied().filter(|&p| !not_a_server(p)).collect();
    while let Some(pid) = todo.pop() {
        for &child in children.get(&pid).map(Vec::as_slice).unwrap_or_default() {
            if !pids.contains(&child) && child_of(child, pid) {
                pids.insert(child);
                todo.push(child);
            }
        }
    }
    pids
}

#[cfg(not(windows))]
/// Whether `pid` is init or a systemd manager (system or `--user`), whose
/// descendants are not one server's processes.
fn is_service_manager(pid: u32) -> bool {
    pid == 1
        || std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim_end() == "systemd")
}

#[cfg(not(windows))]
/// The parent PID in a `/proc/PID/stat` line: `pid (comm) state ppid ...`,
/// where `comm` may hold spaces and parentheses, so fields are counted from
/// the last `)`.
fn parent_pid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether a socket listening on `local` serves `want`: same port, same host.
fn same_socket(local: SocketAddr, want: SocketAddr) -> bool {
    local.port() == want.port()
        && normalize_host(&local.ip().to_string()) == normalize_host(&want.ip().to_string())
}

#[cfg(not(windows))]
/// The listening sockets of a `/proc/net/tcp` (or `tcp6`) table.
fn parse_listening(text: &str, v6: bool) -> Vec<Listening> {
    const LISTEN: &str = "0A";
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.get(3) != Some(&LISTEN) {
                return None;
            }
            let (addr, port) = fields.get(1)?.split_once(':')?;
            let port = u16::from_str_radix(port, 16).ok()?;
            let ip = if v6 {
                parse_ipv6(addr)?
            } else {
                parse_ipv4(addr)?
            };
            Some(Listening {
                local: SocketAddr::new(ip, port),
                uid: fields.get(7)?.parse().ok()?,
                inode: fields.get(9)?.parse().ok()?,
            })
        })
        .collect()
}

#[cfg(not(windows))]
/// A listening TCP socket in `/proc/net/tcp` or `/proc/net/tcp6`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Listening {
    /// Where it listens.
    local: SocketAddr,
    /// The account that opened it.
    uid: u32,
    /// Its inode, as the owners' `/proc/PID/fd/*` links name it.
    inode: u64,
}

#[cfg(not(windows))]
/// The kernel prints each 32-bit word of the address in host byte order.
fn parse_ipv4(hex: &str) -> Option<IpAddr> {
    let word = u32::from_str_radix(hex, 16).ok()?;
    (hex.len() == 8).then(|| IpAddr::V4(Ipv4Addr::from(word.to_ne_bytes())))
}

#[cfg(not(windows))]
fn parse_ipv6(hex: &str) -> Option<IpAddr> {
    if hex.len() != 32 || !hex.is_ascii() {
        return None;
    }
    let mut bytes = [0u8; 16];
    for (i, chunk) in bytes.chunks_exact_mut(4).enumerate() {
        let word = u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
        chunk.copy_from_slice(&word.to_ne_bytes());
    }
    Some(IpAddr::V6(Ipv6Addr::from(bytes)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn server_pids_finds_this_process_on_its_port() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let me = std::process::id();
        assert!(server_pids(&[addr]).contains(&me), "{addr}");
        // Every loopback spelling and 0.0.0.0 name the same host.
        for host in ["127.0.0.2", "0.0.0.0", "::1"] {
            let other = SocketAddr::new(host.parse().unwrap(), addr.port());
            assert!(server_pids(&[other]).contains(&me), "{other}");
        }
        // A LAN address is another host.
        let lan = SocketAddr::new("192.0.2.7".parse().unwrap(), addr.port());
        assert!(!server_pids(&[lan]).contains(&me));
    }

    #[test]
    fn server_pids_is_empty_for_an_unused_port() {
        // Bound but not listening: no server, and no other test's listener.
        let (_unused, addr) = crate::test_prereq::refusing_port();
        assert!(!server_pids(&[addr]).contains(&std::process::id()));
        assert!(server_pids(&[]).is_empty());
    }

    #[test]
    fn an_ipv6_listener_is_found() {
        let listener = crate::test_prereq::ipv6_loopback_listener();
        let addr = listener.local_addr().unwrap();
        let v4 = SocketAddr::new("127.0.0.1".parse().unwrap(), addr.port());
        assert!(server_pids(&[v4]).contains(&std::process::id()));
    }

    #[test]
    fn server_pids_include_the_processes_the_server_started() {
        // An Ollama server's models run in runner processes it starts: this
        // process listens, its child `sh` and grandchild `sleep` are the runners.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let grandchild: u32 = line.trim().parse().unwrap();
        let pids = server_pids(&[addr]);
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::process::Command::new("kill")
            .arg(grandchild.to_string())
            .status();
        assert!(pids.contains(&std::process::id()), "{pids:?}");
        assert!(pids.contains(&child.id()), "the child: {pids:?}");
        assert!(pids.contains(&grandchild), "the grandchild: {pids:?}");
        // Not every process: the parent of this test is no server of ours.
        let parent = parent_pid(&std::fs::read_to_string("/proc/self/stat").unwrap()).unwrap();
        assert!(!pids.contains(&parent), "{pids:?}");
    }

    #[test]
    fn init_is_never_expanded_to_its_descendants() {
        assert!(is_service_manager(1));
        assert!(!is_service_manager(std::process::id()));
        let all = with_descendants(BTreeSet::from([1]));
        assert_eq!(
            all,
            BTreeSet::from([1]),
            "init's descendants are everything"
        );
    }

    /// Set for the copy of the account test that runs as `nobody`: the port
    /// whose server pids it prints.
    const CHILD_ENV: &str = "VACANCY_PRESSURE_TEST_SERVER_PORT";
    /// Set for the copy of the account test that plays the server under
    /// another account: it listens on a port, says which, and waits.
    const LISTEN_ENV: &str = "VACANCY_PRESSURE_TEST_LISTEN";

    /// A server under another account that vacancyd may not inspect: a
    /// system account's processes all count as the server's, a person's
    /// account cannot be told (only the warning).
    ///
    /// One test, three roles: run plainly (as root) it starts copies of
    /// itself as the server ([`LISTEN_ENV`]) and as `nobody` ([`CHILD_ENV`]).
    #[test]
    fn a_server_under_a_system_account_vacancyd_cannot_inspect_is_found_by_its_account() {
        let port = std::env::var(CHILD_ENV).ok();
        match (std::env::var_os(LISTEN_ENV), port) {
            (Some(_), _) => listen_and_wait(),
            (None, Some(port)) => print_server_pids(&port),
            (None, None) => server_under_other_accounts(),
        }
    }

    /// The server role: listens on a port, says which, and waits.
    fn listen_and_wait() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        println!(
            "listening on port {}",
            listener.local_addr().unwrap().port()
        );
        std::io::Write::flush(&mut std::io::stdout()).unwrap();
        std::thread::sleep(std::time::Duration::from_secs(60));
    }

    /// The `nobody` role: prints what [`server_pids`] finds on `port`.
    fn print_server_pids(port: &str) {
        let port: u16 = port.parse().unwrap();
        let addr = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port);
        println!("server pids: {:?}", server_pids(&[addr]));
    }

    /// The root role of the account test.
    fn server_under_other_accounts() {
        use std::os::unix::fs::PermissionsExt;
        use std::process::{Command, Stdio};
        crate::test_prereq::require_root("running processes as other accounts");
        let setpriv = crate::test_prereq::setpriv();
        let as_uid = |uid: u32| {
            let mut c = Command::new(setpriv);
            c.args([
                format!("--reuid={uid}"),
                format!("--regid={uid}"),
                "--clear-groups".to_owned(),
            ]);
            c
        };
        const SELF: &str = "gpu_pressure::reader::tests::a_server_under_a_system_account_vacancyd_cannot_inspect_is_found_by_its_account";
        // A copy of this test binary that `nobody` may run.
        let tmp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = tmp.path().join("pressure-tests");
        std::fs::copy(std::env::current_exe().unwrap(), &bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let run_child = |uid: u32, test: &str| {
            let mut c = as_uid(uid);
            c.arg(&bin)
                .args(["--exact", test, "--nocapture", "--test-threads=1"])
                .current_dir(tmp.path());
            c
        };
        for (uid, system) in [(2u32, true), (4321u32, false)] {
            let mut server = run_child(uid, SELF)
                .env(LISTEN_ENV, "1")
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            // Another process of the same account, not started by the server.
            let sibling = as_uid(uid).args(["sleep", "60"]).spawn().unwrap();
            let port =
                std::io::BufRead::lines(std::io::BufReader::new(server.stdout.take().unwrap()))
                    .map_while(Result::ok)
                    .find_map(|l| {
                        // The harness prints the test's name on the same line first.
                        l.split("listening on port ")
                            .nth(1)
                            .map(|p| p.trim().to_owned())
                    })
                    .expect("the server says its port");
            let out = run_child(65534, SELF)
                .env(CHILD_ENV, &port)
                .output()
                .unwrap();
            let (server_pid, sibling_pid) = (server.id(), sibling.id());
            for mut p in [server, sibling] {
                let _ = p.kill();
                let _ = p.wait();
            }
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            let printed = stdout
                .lines()
                .find_map(|l| l.split("server pids: ").nth(1))
                .unwrap_or_else(|| panic!("child printed nothing: {stdout}"));
            let has = |pid: u32| {
                printed
                    .trim_matches(|c| c == '[' || c == ']')
                    .split(", ")
                    .any(|p| p == pid.to_string())
            };
            // setpriv execs its program: the pids are the processes' own.
            if system {
                assert!(has(server_pid) && has(sibling_pid), "uid {uid}: {printed}");
            } else {
                assert_eq!(
                    printed, "[]",
                    "uid {uid}: a person's account cannot be told"
                );
            }
        }
    }

    #[test]
    fn the_descendant_walk_skips_stale_parents_and_unexpanded_roots() {
        // 10 listens; 11 and 12 are its runners, 13 a runner's child. 20's
        // parent ended and its PID 10 was reused by the server: 20 started
        // before 10, so it is not the server's. 4 (System) holds HTTP.sys's
        // listeners and is never expanded; 30 descends from it.
        let tree = [
            (10, 1),
            (11, 10),
            (12, 10),
            (13, 11),
            (20, 10),
            (30, 4),
            (4, 4),
        ];
        let start = |pid: u32| match pid {
            20 => 1,
            _ => 100 + u64::from(pid),
        };
        let child_of = |c: u32, p: u32| start(c) >= start(p);
        let not_a_server = |pid: u32| pid == 0 || pid == 4;
        let walk = |roots: &[u32]| {
            descendants(
                roots.iter().copied().collect(),
                &tree,
                not_a_server,
                child_of,
            )
        };
        assert_eq!(walk(&[10]), BTreeSet::from([10, 11, 12, 13]));
        assert_eq!(walk(&[4]), BTreeSet::from([4]));
        assert_eq!(walk(&[]), BTreeSet::new());
        // A cycle of stale parents ends.
        let cycle = [(1, 2), (2, 1)];
        assert_eq!(
            descendants(BTreeSet::from([1]), &cycle, |_| false, |_, _| true),
            BTreeSet::from([1, 2])
        );
    }

    #[test]
    fn a_parent_pid_is_read_past_any_command_name() {
        assert_eq!(parent_pid("42 (ollama) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parent_pid("43 (a) b (c) R 9 43 43 0 -1"), Some(9));
        assert_eq!(parent_pid("garbage"), None);
    }

    #[test]
    fn proc_net_tables_parse() {
        let ipv4_loopback = format!("{:08X}", u32::from_ne_bytes([127, 0, 0, 1]));
        let text = format!(
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
             0: {ipv4_loopback}:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0 100 0 0 10 0\n\
             1: {ipv4_loopback}:1F91 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 4243 1 0 100 0 0 10 0\n\
             garbage\n"
        );
        assert_eq!(
            parse_listening(&text, false),
            vec![Listening {
                local: "127.0.0.1:8080".parse().unwrap(),
                uid: 1000,
                inode: 4242
            }]
        );
        let any6 = "00000000000000000000000000000000";
        let text6 = format!("header\n 0: {any6}:2BCB {any6}:0000 0A 0:0 0:0 0 0 0 77 1\n");
        assert_eq!(
            parse_listening(&text6, true),
            vec![Listening {
                local: "[::]:11211".parse().unwrap(),
                uid: 0,
                inode: 77
            }]
        );
        assert_eq!(parse_ipv4("zz"), None);
        assert_eq!(parse_ipv6("00"), None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn scripted_reader_replays_its_queue_and_records_calls() {
        let reader = ScriptedReader::new("gpu0");
        let handle = reader.clone();
        let load = OwnerLoad {
            util_pct: 30,
            memory_mib: 2000,
        };
        handle.push_load(load);
        handle.push_failure("driver busy");
        assert_eq!(reader.pending(), 2);
        assert_eq!(reader.read(&[7]).await, Ok(load));
        let err = reader.read(&[]).await.unwrap_err();
        assert!(err.to_string().contains("driver busy"), "{err}");
        let err = reader.read(&[1, 2]).await.unwrap_err();
        assert!(err.to_string().contains("nothing queued"), "{err}");
        assert_eq!(handle.calls(), vec![vec![7], vec![], vec![1, 2]]);
        assert_eq!(reader.name(), "gpu0");
    }
}
