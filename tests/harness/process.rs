//! free_port, ManagedProcess and PythonVenv against real processes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::{Duration, Instant};

use vacancy_test_support::{
    ManagedProcess, PythonVenv, SupportError, cache_dir, free_port, http_get_status,
};

fn sh(script: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script]);
    cmd
}

/// Waits until the log contains `needle`.
fn wait_log(p: &ManagedProcess, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !p.log().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in log: {}",
            p.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether a process with this pid exists (`kill -0`).
fn pid_exists(pid: u32) -> bool {
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success()
}

#[test]
fn free_port_gives_distinct_bindable_ports() {
    let ports: Vec<u16> = (0..64).map(|_| free_port().unwrap()).collect();
    for &port in &ports {
        assert_ne!(port, 0);
        std::net::TcpListener::bind(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("port {port} from free_port is not bindable: {e}"));
    }
    // A process never gets the same port twice, so two listeners of one
    // daemon cannot collide; and none is in the ephemeral range outgoing
    // connections take their ports from.
    let distinct: HashSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "ports repeat: {ports:?}");
    assert!(
        ports.iter().all(|p| (20_000..32_000).contains(p)),
        "{ports:?}"
    );
}

#[test]
fn cache_dir_exists() {
    assert!(cache_dir().is_dir());
}

#[test]
fn log_is_captured_and_kill_works() {
    let mut p =
        ManagedProcess::spawn("echo-sleep", sh("echo hi; echo err >&2; exec sleep 30")).unwrap();
    assert!(p.pid() > 0);
    wait_log(&p, "err");
    assert!(p.log().contains("hi\n"), "stdout captured: {:?}", p.log());
    assert!(p.is_running());
    assert_eq!(p.wait_exit(Duration::from_millis(50)), None);

    let pid = p.pid();
    let status = p.kill().unwrap();
    assert_eq!(status.signal(), Some(9), "{status}");
    assert!(!p.is_running());
    assert!(!pid_exists(pid), "pid {pid} still exists after kill");
    // Killing again is harmless and reports the same status.
    assert_eq!(p.kill().unwrap(), status);
    assert!(p.log().contains("hi"), "log survives the process");
}

#[test]
fn wait_http_ok_fails_fast_with_the_log_when_the_process_exits() {
    let port = free_port().unwrap();
    let mut p = ManagedProcess::spawn("quitter", sh("echo boom >&2; exit 3")).unwrap();
    let start = Instant::now();
    let err = p
        .wait_http_ok(
            &format!("http://127.0.0.1:{port}/health"),
            Duration::from_secs(60),
        )
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(matches!(err, SupportError::Exited { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("boom"), "{text}");
    assert!(text.contains("exit status: 3"), "{text}");
    assert!(text.contains("quitter"), "{text}");
}

#[test]
fn wait_http_ok_times_out_with_the_last_error() {
    let port = free_port().unwrap();
    let mut p = ManagedProcess::spawn("silent", sh("echo waiting; exec sleep 30")).unwrap();
    wait_log(&p, "waiting");
    let err = p
        .wait_http_ok(
            &format!("http://127.0.0.1:{port}/"),
            Duration::from_millis(300),
        )
        .unwrap_err();
    assert!(matches!(err, SupportError::Timeout { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("refused"), "{text}");
    assert!(text.contains("waiting"), "log tail in the error: {text}");
}

#[test]
fn wait_http_ok_succeeds_and_terminate_stops_a_real_server() {
    let port = free_port().unwrap();
    let mut cmd = Command::new("python3");
    cmd.args([
        "-m",
        "http.server",
        "--bind",
        "127.0.0.1",
        &port.to_string(),
    ]);
    let mut p = ManagedProcess::spawn("http.server", cmd).unwrap();
    let url = format!("http://127.0.0.1:{port}/");
    p.wait_http_ok(&url, Duration::from_secs(30)).unwrap();
    assert_eq!(http_get_status(&url, Duration::from_secs(5)).unwrap(), 200);
    let status = p.terminate(Duration::from_secs(10)).unwrap();
    assert_eq!(status.signal(), Some(15), "ended by SIGTERM: {status}");
    assert!(http_get_status(&url, Duration::from_secs(1)).is_err());
}

#[test]
fn terminate_lets_the_process_clean_up() {
    let mut p = ManagedProcess::spawn(
        "trapper",
        sh("trap 'echo got-term; exit 0' TERM; echo ready; while :; do sleep 0.05; done"),
    )
    .unwrap();
    wait_log(&p, "ready");
    let status = p.terminate(Duration::from_secs(10)).unwrap();
    assert!(status.success(), "{status}");
    assert!(p.log().contains("got-term"), "{}", p.log());
}

#[test]
fn terminate_kills_a_process_that_ignores_sigterm() {
    let mut p = ManagedProcess::spawn(
        "stubborn",
        sh("trap '' TERM; echo ready; while :; do sleep 0.05; done"),
    )
    .unwrap();
    wait_log(&p, "ready");
    let start = Instant::now();
    let status = p.terminate(Duration::from_millis(300)).unwrap();
    assert_eq!(status.signal(), Some(9), "{status}");
    assert!(start.elapsed() >= Duration::from_millis(300));
}

#[test]
fn dropping_while_panicking_kills_the_process() {
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let p = ManagedProcess::spawn("doomed", sh("echo last words; exec sleep 30")).unwrap();
        wait_log(&p, "last words");
        tx.send(p.pid()).unwrap();
        panic!("on purpose: the log of 'doomed' is printed above this line");
    })
    .join();
    assert!(outcome.is_err());
    let pid = rx.recv().unwrap();
    assert!(!pid_exists(pid), "pid {pid} survived its ManagedProcess");
}

#[test]
fn spawning_a_missing_program_is_an_error() {
    let err =
        ManagedProcess::spawn("ghost", Command::new("/nonexistent/vacancy-ghost")).unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent/vacancy-ghost"),
        "{err}"
    );
}

#[test]
fn venvs_are_built_once_and_rebuilt_when_stale() {
    const NAME: &str = "vacancy-test-support-selftest";
    // Two threads at once: the lock makes one build and the other wait.
    let builders: Vec<_> = (0..2)
        .map(|_| std::thread::spawn(|| PythonVenv::ensure(NAME, &[])))
        .collect();
    let dirs: Vec<_> = builders
        .into_iter()
        .map(|b| b.join().unwrap().unwrap())
        .collect();
    assert_eq!(dirs[0], dirs[1]);
    let dir = &dirs[0];
    assert!(dir.starts_with(cache_dir()));
    let out = Command::new(PythonVenv::python(dir))
        .args(["-c", "import sys; print(sys.prefix)"])
        .output()
        .unwrap();
    assert!(out.status.success());

    // Complete: reused as is.
    let marker = dir.join("marker");
    std::fs::write(&marker, "x").unwrap();
    PythonVenv::ensure(NAME, &[]).unwrap();
    assert!(marker.exists(), "a complete venv was rebuilt");

    // Stamp missing (an interrupted build): rebuilt.
    std::fs::remove_file(dir.join(".vacancy-stamp")).unwrap();
    PythonVenv::ensure(NAME, &[]).unwrap();
    assert!(!marker.exists(), "an incomplete venv was reused");
    assert!(PythonVenv::python(dir).exists());
}

#[test]
fn bad_venv_names_are_refused() {
    for name in ["", "../escape", "a/b", ".hidden"] {
        assert!(
            matches!(
                PythonVenv::ensure(name, &[]),
                Err(SupportError::Invalid { .. })
            ),
            "{name:?}"
        );
    }
}

#[test]
fn a_failed_pip_install_reports_pip_output_and_leaves_no_stamp() {
    const NAME: &str = "vacancy-test-support-selftest-broken";
    // A local path that does not exist: pip fails without touching the network.
    let err = PythonVenv::ensure(NAME, &["/nonexistent/vacancy-missing.whl"]).unwrap_err();
    assert!(matches!(err, SupportError::Command { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("pip install"), "{text}");
    assert!(
        text.contains("vacancy-missing.whl"),
        "pip's own output: {text}"
    );
    let dir = cache_dir().join("venvs").join(NAME);
    assert!(
        !dir.join(".vacancy-stamp").exists(),
        "a failed venv is marked complete"
    );
}
