//! The systemd unit under packaging/ is valid and carries what the recovery
//! directory rules need (REC-12, REC-22).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::process::Command;

fn unit() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/vacancyd.service");
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn the_unit_keeps_its_state_in_a_private_state_directory() {
    let u = unit();
    for line in [
        "StateDirectory=vacancyd",
        "StateDirectoryMode=0700",
        "UMask=0077",
        "KillSignal=SIGTERM",
        "User=vacancyd",
    ] {
        assert!(u.lines().any(|l| l.trim() == line), "missing {line}");
    }
    assert!(u.contains("ExecStart=/usr/bin/vacancyd run --config /etc/vacancyd/vacancyd.toml"));
}

#[test]
fn the_unit_lets_saved_settings_write_the_configuration_directory_and_nothing_more() {
    // POST /admin/settings writes vacancyd.toml (temp + rename, .prev kept):
    // the configuration's directory is writable, the rest of the system is not.
    let u = unit();
    assert!(u.lines().any(|l| l.trim() == "ProtectSystem=strict"));
    let writable: Vec<&str> = u
        .lines()
        .filter(|l| l.trim_start().starts_with("ReadWritePaths="))
        .collect();
    assert_eq!(writable, ["ReadWritePaths=/etc/vacancyd"]);
    assert!(!u.contains("ProtectSystem=full") && !u.contains("ReadOnlyPaths=/etc/vacancyd"));
}

#[test]
fn systemd_analyze_verifies_the_unit() {
    // .ci/run installs systemd where systemd-analyze is missing.
    let dir = tempfile::tempdir().unwrap();
    let unit = unit().replace("/usr/bin/vacancyd", env!("CARGO_BIN_EXE_vacancyd"));
    let path = dir.path().join("vacancyd.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian package systemd) runs");
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_unit_never_removes_its_recovery_directory() {
    // REC-07: systemd keeps a StateDirectory across stop, restart and
    // package removal unless told otherwise; the unit tells it nothing of the
    // kind, and the operator guide says to keep the directory.
    let unit = unit();
    let exec: Vec<&str> = unit
        .lines()
        .filter(|l| l.trim().starts_with("Exec"))
        .collect();
    assert_eq!(
        exec,
        ["ExecStart=/usr/bin/vacancyd run --config /etc/vacancyd/vacancyd.toml"],
        "no command before or after the daemon could remove it"
    );
    assert!(!unit.contains("RuntimeDirectory=vacancyd"), "{unit}");
    assert!(unit.contains("StateDirectory=vacancyd"), "{unit}");
    let guide = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operator-guide.md"),
    )
    .unwrap();
    assert!(
        guide.contains("Keep the directory through\nupgrades, rollback and uninstall, and never delete it to clear a busy\nresource."),
        "the operator guide says to keep it"
    );
}
