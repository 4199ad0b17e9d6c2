//! The Debian package (issue 21 item 5): `vacancyd_<version>_amd64.deb`,
//! built by `cargo deb`, installed on this machine with `dpkg -i`, upgraded,
//! removed and purged. It is run by `scripts/test`, which builds the package
//! first (from the release binary) and passes it in `VACANCY_DEB`, and a
//! second build of it with a higher revision in `VACANCY_DEB_UPGRADE`:
//!
//! ```text
//! cargo bench -p vacancy-cli --bench fleet --no-run    # the release vacancyd
//! cargo deb -p vacancy-cli --no-build --deb-revision 2 -o target/deb-upgrade/
//! cargo deb -p vacancy-cli --no-build
//! VACANCY_DEB=$PWD/target/debian/vacancyd_0.1.0-1_amd64.deb \
//! VACANCY_DEB_UPGRADE=$PWD/target/deb-upgrade/vacancyd_0.1.0-2_amd64.deb \
//!   cargo test -p vacancy-cli --test deb -- --ignored
//! ```
//!
//! It needs root and a machine without a vacancyd package of its own, and
//! leaves the machine as it found it: the package removed, and the account
//! and `/var/lib/vacancyd` deleted only if this test created them (the
//! package itself never deletes them, REC-07).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use vacancy_test_support::{ManagedProcess, free_port};

const STATE: &str = "/var/lib/vacancyd";
const CONFIG: &str = "/etc/vacancyd/vacancyd.toml";

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

fn ok(program: &str, args: &[&str]) -> String {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {} failed ({}):\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn package(var: &str) -> PathBuf {
    let path = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        panic!("{var} is not set: scripts/test builds the package (cargo deb) and sets it")
    });
    assert!(path.is_file(), "{var}={} is not a file", path.display());
    path
}

fn installed() -> bool {
    run("dpkg-query", &["-W", "-f=${Status}", "vacancyd"])
        .stdout
        .starts_with(b"install ok installed")
}

fn account_exists() -> bool {
    run("getent", &["passwd", "vacancyd"]).status.success()
}

/// Puts back what the test changed, whatever happens: the package, and the
/// account and state directory if they were not there before.
struct Restore {
    had_account: bool,
    had_state: bool,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = run("dpkg", &["--purge", "vacancyd"]);
        if !self.had_state {
            let _ = std::fs::remove_dir_all(STATE);
        }
        if !self.had_account {
            let _ = run("userdel", &["vacancyd"]);
            let _ = run("groupdel", &["vacancyd"]);
        }
    }
}

/// The installed unit file, wherever the package put it.
fn unit_path() -> PathBuf {
    let listed = ok("dpkg-query", &["-L", "vacancyd"]);
    listed
        .lines()
        .find(|l| l.ends_with("/systemd/system/vacancyd.service"))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("the package installs no vacancyd.service:\n{listed}"))
}

/// Runs the installed binary as the `vacancyd` account, as the unit would
/// (`STATE_DIRECTORY`), on the installed configuration moved to free ports,
/// until it is ready; then stops it with SIGTERM.
fn run_as_the_service_account() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let control = free_port().unwrap();
    let config = std::fs::read_to_string(CONFIG)
        .unwrap()
        .replace("127.0.0.1:7480", &format!("127.0.0.1:{control}"))
        .replace(
            "127.0.0.1:8081",
            &format!("127.0.0.1:{}", free_port().unwrap()),
        )
        .replace(
            "127.0.0.1:11435",
            &format!("127.0.0.1:{}", free_port().unwrap()),
        );
    let path = dir.path().join("vacancyd.toml");
    std::fs::write(&path, config).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=vacancyd",
        "--regid=vacancyd",
        "--clear-groups",
        "--",
        "/usr/bin/vacancyd",
        "run",
        "--config",
    ])
    .arg(&path)
    .env("STATE_DIRECTORY", STATE);
    let mut daemon = ManagedProcess::spawn("installed-vacancyd", cmd).unwrap();
    daemon
        .wait_http_ok(
            &format!("http://127.0.0.1:{control}/health"),
            Duration::from_secs(20),
        )
        .unwrap();
    let status = daemon.terminate(Duration::from_secs(40)).unwrap();
    assert!(
        status.success(),
        "vacancyd ended {status}:\n{}",
        daemon.log_tail(40)
    );
    // It ran as vacancyd: its recovery directory is the account's, mode 0700 (REC-22).
    let admission = std::fs::metadata(format!("{STATE}/admission")).unwrap();
    let uid: u32 = ok("id", &["-u", "vacancyd"]).trim().parse().unwrap();
    assert_eq!(
        admission.uid(),
        uid,
        "the recovery directory is not vacancyd's"
    );
    assert_eq!(admission.mode() & 0o777, 0o700);
}

/// Every file under `dir`, with its contents.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                files.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    files.sort();
    files
}

#[test]
#[ignore = "installs a package on this machine: scripts/test builds it and runs this with --ignored"]
fn the_debian_package_installs_runs_as_its_account_and_keeps_the_recovery_directory() {
    // Issue 21 item 5; REC-07, REC-12, REC-22.
    let (first, upgrade) = (package("VACANCY_DEB"), package("VACANCY_DEB_UPGRADE"));
    let name = first.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("vacancyd_") && name.ends_with("_amd64.deb"),
        "{name} is not vacancyd_<version>_amd64.deb"
    );
    assert!(
        !installed(),
        "a vacancyd package is installed on this machine already; this test installs and removes its own, so it leaves yours alone"
    );
    let _restore = Restore {
        had_account: account_exists(),
        had_state: Path::new(STATE).exists(),
    };

    ok("dpkg", &["-i", &first.to_string_lossy()]);
    assert!(installed());

    // The files.
    let bin = std::fs::metadata("/usr/bin/vacancyd").unwrap();
    assert_eq!(bin.mode() & 0o755, 0o755);
    assert!(ok("/usr/bin/vacancyd", &["--version"]).contains("vacancyd"));
    let unit = unit_path();
    assert!(Path::new("/usr/lib/sysusers.d/vacancyd.conf").is_file());
    for doc in [
        "README.md",
        "operator-guide.md",
        "config.md",
        "fleet.md",
        "fleet/haproxy.cfg",
    ] {
        assert!(
            Path::new("/usr/share/doc/vacancyd").join(doc).is_file(),
            "no /usr/share/doc/vacancyd/{doc}"
        );
    }
    let conffiles = ok("dpkg-query", &["-W", "-f=${Conffiles}", "vacancyd"]);
    assert!(
        conffiles.contains(CONFIG),
        "{CONFIG} is not a conffile: {conffiles}"
    );

    // The account: a system account without a login, at home in the state directory.
    let passwd = ok("getent", &["passwd", "vacancyd"]);
    let fields: Vec<&str> = passwd.trim().split(':').collect();
    let uid: u32 = fields[2].parse().unwrap();
    assert!(uid < 1000, "vacancyd is not a system account: {passwd}");
    assert_eq!(fields[5], STATE, "{passwd}");
    assert!(fields[6].ends_with("nologin"), "{passwd}");
    let state = std::fs::metadata(STATE).unwrap();
    assert_eq!((state.uid(), state.mode() & 0o777), (uid, 0o700));
    // The console saves settings into /etc/vacancyd (ReadWritePaths): the
    // vacancyd group's, closed to others.
    let gid: u32 = fields[3].parse().unwrap();
    for (path, mode) in [("/etc/vacancyd", 0o770), (CONFIG, 0o660)] {
        let m = std::fs::metadata(path).unwrap();
        assert_eq!(
            (m.uid(), m.gid(), m.mode() & 0o777),
            (0, gid, mode),
            "{path}"
        );
    }

    // The installed unit, and the shipped configuration as the account reads it.
    ok("systemd-analyze", &["verify", &unit.to_string_lossy()]);
    ok(
        "setpriv",
        &[
            "--reuid=vacancyd",
            "--regid=vacancyd",
            "--clear-groups",
            "/usr/bin/vacancyd",
            "check-config",
            "--config",
            CONFIG,
            "--no-sample",
        ],
    );
    run_as_the_service_account();

    // An upgrade keeps the owner's edits and the recovery directory.
    let edited = format!(
        "{}\n# edited by the owner\n",
        std::fs::read_to_string(CONFIG).unwrap()
    );
    std::fs::write(CONFIG, &edited).unwrap();
    let recovery = snapshot(Path::new(&format!("{STATE}/admission")));
    assert!(
        !recovery.is_empty(),
        "the run left no recovery files to keep"
    );
    ok("dpkg", &["-i", &upgrade.to_string_lossy()]);
    assert_eq!(std::fs::read_to_string(CONFIG).unwrap(), edited);
    assert_eq!(snapshot(Path::new(&format!("{STATE}/admission"))), recovery);
    run_as_the_service_account();

    // Removal takes the program, keeps the configuration (a conffile) and the
    // recovery directory; purge takes the configuration, still not the
    // recovery directory (REC-07).
    ok("dpkg", &["--remove", "vacancyd"]);
    assert!(!Path::new("/usr/bin/vacancyd").exists());
    assert!(Path::new(CONFIG).exists());
    assert!(Path::new(&format!("{STATE}/admission")).is_dir());
    ok("dpkg", &["--purge", "vacancyd"]);
    assert!(!Path::new(CONFIG).exists());
    assert!(Path::new(&format!("{STATE}/admission")).is_dir());
    assert!(!installed());
}

#[test]
fn the_packaged_configuration_is_valid() {
    // What the package installs as /etc/vacancyd/vacancyd.toml.
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/vacancyd.toml");
    let out = Command::new(vacancy_test_support::vacancyd())
        .args(["check-config", "--no-sample", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
