//! Where the recovery directory is (REC-10..REC-22), with temporary
//! directories standing in for the configuration's folder, `$STATE_DIRECTORY`,
//! the home directory and the service base `/var/lib/vacancyd`.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use super::{Scratch, scratch, with_logs, write_private};
use crate::ledger::location::running_uid;
use crate::ledger::record;
use crate::ledger::{
    JOURNAL_FILE, Ledger, LedgerError, Location, LocationInput, LocationSource, check_recovery_dir,
    resolve_location,
};

fn mkdir(path: &Path, mode: u32) {
    fs::DirBuilder::new().recursive(true).create(path).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

/// An input with a configuration file at `<tmp>/etc/vacancyd.toml` and a
/// fake, absent service base at `<tmp>/svc`.
fn with_config(s: &Scratch) -> LocationInput {
    let etc = s.tmp.path().join("etc");
    mkdir(&etc, 0o755);
    let config = etc.join("vacancyd.toml");
    fs::write(&config, "").unwrap();
    LocationInput {
        config_path: Some(config),
        service_base: s.tmp.path().join("svc"),
        ..LocationInput::default()
    }
}

fn resolve(input: &LocationInput) -> Location {
    resolve_location(input).unwrap_or_else(|e| panic!("{e}"))
}

fn resolve_err(input: &LocationInput) -> LedgerError {
    match resolve_location(input) {
        Ok(l) => panic!("expected an error, got {l:?}"),
        Err(e) => e,
    }
}

/// Write a service recovery directory at `<tmp>/svc/admission` with these lines.
fn service_dir(s: &Scratch, lines: &[Vec<u8>]) -> PathBuf {
    let dir = s.tmp.path().join("svc/admission");
    mkdir(&dir, 0o700);
    if !lines.is_empty() {
        write_private(&dir.join(JOURNAL_FILE), &lines.concat());
    }
    dir
}

fn live_entry() -> crate::ledger::RecoveredEntry {
    crate::ledger::RecoveredEntry::from_reservation(&super::reservation(1, None), 1)
}

#[test]
fn default_is_beside_the_configuration_with_the_admission_extension() {
    // REC-11, REC-13 (no $STATE_DIRECTORY), REC-18, REC-21
    let s = scratch();
    let input = with_config(&s);
    let loc = resolve(&input);
    let expect = s.tmp.path().join("etc/vacancyd.admission");
    assert_eq!(loc.path, expect);
    assert_eq!(loc.source, LocationSource::BesideConfig);
    assert!(loc.is_default && loc.created);
    assert_eq!(mode(&expect), 0o700);
    // Found again, not created again; the ledger opens it.
    let again = resolve(&input);
    assert!(!again.created);
    let (_ledger, entries) = Ledger::open(&again.path).unwrap();
    assert!(entries.is_empty());

    for (name, dir) in [
        ("vacancyd", "vacancyd.admission"),
        ("lab.conf.toml", "lab.conf.admission"),
    ] {
        let config = s.tmp.path().join("etc").join(name);
        let input = LocationInput {
            config_path: Some(config),
            ..input.clone()
        };
        assert_eq!(resolve(&input).path, s.tmp.path().join("etc").join(dir));
    }
}

#[test]
fn under_systemd_the_default_is_state_directory_admission() {
    // REC-12: the first of several paths; created with its missing parents
    let s = scratch();
    let mut input = with_config(&s);
    let state = s.tmp.path().join("state/vacancyd");
    let mut value = state.clone().into_os_string();
    value.push(":");
    value.push(s.tmp.path().join("other"));
    input.state_directory = Some(value);
    // Records in the service base do not matter under systemd (REC-14 is for
    // runs without $STATE_DIRECTORY).
    service_dir(&s, &[record::admit_line(&live_entry())]);
    let loc = resolve(&input);
    assert_eq!(loc.path, state.join("admission"));
    assert_eq!(loc.source, LocationSource::StateDirectory);
    assert!(loc.created);
    assert_eq!(mode(&loc.path), 0o700);
    assert!(!s.tmp.path().join("other").exists());
}

#[test]
fn without_a_configuration_file_the_default_is_the_users_state_directory() {
    // docs/operator-guide.md#the-recovery-directory; REC-18, REC-21: created with missing parents, private from creation
    let s = scratch();
    let xdg = s.tmp.path().join("xdg");
    let input = LocationInput {
        xdg_state_home: Some(xdg.clone().into_os_string()),
        home: Some(s.tmp.path().join("home").into_os_string()),
        service_base: s.tmp.path().join("svc"),
        ..LocationInput::default()
    };
    let loc = resolve(&input);
    assert_eq!(loc.path, xdg.join("vacancyd/admission"));
    assert_eq!(loc.source, LocationSource::UserState);
    assert_eq!(mode(&loc.path), 0o700);
    for p in [&xdg, &xdg.join("vacancyd")] {
        assert_eq!(mode(p) & 0o077, 0, "{} is {:o}", p.display(), mode(p));
    }

    let input = LocationInput {
        xdg_state_home: Some("relative/ignored".into()),
        ..input
    };
    assert_eq!(
        resolve(&input).path,
        s.tmp.path().join("home/.local/state/vacancyd/admission")
    );
    let none = LocationInput {
        service_base: s.tmp.path().join("svc"),
        ..LocationInput::default()
    };
    assert!(matches!(
        resolve_err(&none),
        LedgerError::NoDefaultLocation { .. }
    ));
}

#[test]
fn a_relative_setting_resolves_against_the_configurations_directory() {
    // REC-10, REC-17
    let s = scratch();
    let mut input = with_config(&s);
    mkdir(&s.tmp.path().join("etc/state"), 0o700);
    mkdir(&s.tmp.path().join("var/rec"), 0o700);
    input.setting = "state".to_owned();
    let loc = resolve(&input);
    assert_eq!(loc.path, s.tmp.path().join("etc/state"));
    assert_eq!(loc.source, LocationSource::Setting);
    assert!(!loc.is_default && !loc.created);
    input.setting = "../var/./rec".to_owned();
    assert_eq!(resolve(&input).path, s.tmp.path().join("var/rec"));

    let no_config = LocationInput {
        config_path: None,
        home: Some(s.tmp.path().join("home").into_os_string()),
        ..input
    };
    assert!(matches!(
        resolve_err(&no_config),
        LedgerError::RelativeWithoutConfig { .. }
    ));
}

#[test]
fn a_named_directory_other_than_the_default_must_exist() {
    // REC-20
    let s = scratch();
    let mut input = with_config(&s);
    let named = s.tmp.path().join("srv/vacancy-state");
    input.setting = named.display().to_string();
    let e = resolve_err(&input);
    assert!(
        matches!(&e, LedgerError::Missing { path } if *path == named),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains(&named.display().to_string()), "{msg}");
    assert!(msg.contains("mkdir -m 700"), "{msg}");
    assert!(!named.exists());
    assert!(!s.tmp.path().join("srv").exists());
    // The same directory, once created as the operator is told, is used.
    mkdir(&named, 0o700);
    assert_eq!(resolve(&input).path, named);
}

#[test]
fn a_setting_that_names_the_default_is_created_after_the_path_check() {
    // REC-18, REC-19
    let s = scratch();
    let mut input = with_config(&s);
    let default = s.tmp.path().join("etc/vacancyd.admission");
    input.setting = default.display().to_string();
    let loc = resolve(&input);
    assert_eq!(loc.path, default);
    assert!(loc.is_default && loc.created);
    assert_eq!(loc.source, LocationSource::Setting);

    // …and refused like the empty setting when the path is unsafe.
    let s = scratch();
    let mut input = with_config(&s);
    fs::set_permissions(s.tmp.path().join("etc"), fs::Permissions::from_mode(0o777)).unwrap();
    input.setting = s
        .tmp
        .path()
        .join("etc/vacancyd.admission")
        .display()
        .to_string();
    assert!(matches!(
        resolve_err(&input),
        LedgerError::UnsafePath { .. }
    ));
}

#[test]
fn an_existing_directory_that_is_not_private_is_refused_and_left_alone() {
    // REC-21, REC-22
    let s = scratch();
    let input = with_config(&s);
    let default = s.tmp.path().join("etc/vacancyd.admission");
    mkdir(&default, 0o755);
    let e = resolve_err(&input);
    assert!(
        matches!(e, LedgerError::WrongMode { mode: 0o755, .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains(&format!("chmod 700 {}", default.display())),
        "{e}"
    );
    assert_eq!(mode(&default), 0o755);

    // A named directory too.
    let named = s.tmp.path().join("named");
    mkdir(&named, 0o750);
    let input = LocationInput {
        setting: named.display().to_string(),
        ..input
    };
    assert!(matches!(
        resolve_err(&input),
        LedgerError::WrongMode { mode: 0o750, .. }
    ));
    assert_eq!(mode(&named), 0o750);

    // A file where the directory should be.
    let file = s.tmp.path().join("file");
    fs::write(&file, "").unwrap();
    assert!(matches!(
        check_recovery_dir(&file),
        Err(LedgerError::NotADirectory { .. })
    ));
}

// Issue 14 item 17, REC-22: a directory with the sticky bit is reported with
// it, as the mode `ls` and `stat` show: "mode 1777", not 0777.
#[test]
fn a_sticky_world_writable_directory_is_reported_as_mode_1777() {
    let s = scratch();
    let named = s.tmp.path().join("shared");
    mkdir(&named, 0o1777);
    let input = LocationInput {
        setting: named.display().to_string(),
        ..with_config(&s)
    };
    let e = resolve_err(&input);
    assert!(
        matches!(e, LedgerError::WrongMode { mode: 0o1777, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("has mode 1777;"), "{e}");
    assert_eq!(mode(&named), 0o1777);
}

// Issue 14 item 16, REC-18: a link on the way to the default location (an
// operator's symlink to another disk) is followed when the link and every
// directory on the path, on both sides of it, are root's or this account's
// and writable by no one else.
#[test]
fn a_trusted_link_on_the_default_path_is_followed() {
    let s = scratch();
    let real = s.tmp.path().join("disk2/etc");
    mkdir(&real, 0o755);
    mkdir(&s.tmp.path().join("disk2"), 0o755);
    let link = s.tmp.path().join("etc");
    symlink(&real, &link).unwrap();
    let config = link.join("vacancyd.toml");
    fs::write(&config, "").unwrap();
    let input = LocationInput {
        config_path: Some(config),
        service_base: s.tmp.path().join("svc"),
        ..LocationInput::default()
    };
    let location = resolve(&input);
    assert!(location.created);
    // The directory as checked: the link resolved (issue 30 item 13).
    assert_eq!(location.path, real.join("vacancyd.admission"));
    let made = real.join("vacancyd.admission");
    assert_eq!(mode(&made), 0o700);
    assert!(Ledger::open(&location.path).is_ok());
    assert!(made.join(JOURNAL_FILE).exists());

    // The directory itself a link to a private directory: followed too.
    let s = scratch();
    let input = with_config(&s);
    let elsewhere = s.tmp.path().join("elsewhere");
    mkdir(&elsewhere, 0o700);
    symlink(&elsewhere, s.tmp.path().join("etc/vacancyd.admission")).unwrap();
    let location = resolve(&input);
    assert!(!location.created);
    assert!(Ledger::open(&location.path).is_ok());
    assert!(elsewhere.join(JOURNAL_FILE).exists());
}

// Issue 30 item 13: the walk follows a trusted link, and then the ledger opens
// the directory the walk checked, not the path with the link in it: a link
// re-pointed after the check (by whoever may change it) cannot send the
// journal to a directory that was never checked.
#[test]
fn the_directory_checked_through_a_link_is_the_one_opened() {
    let s = scratch();
    let input = with_config(&s);
    let checked = s.tmp.path().join("checked");
    mkdir(&checked, 0o700);
    let link = s.tmp.path().join("etc/vacancyd.admission");
    symlink(&checked, &link).unwrap();
    let location = resolve(&input);
    assert_eq!(location.path, checked);

    // The link now leads to a directory nobody checked (not private).
    let unchecked = s.tmp.path().join("unchecked");
    mkdir(&unchecked, 0o755);
    fs::remove_file(&link).unwrap();
    symlink(&unchecked, &link).unwrap();
    assert!(Ledger::open(&location.path).is_ok());
    assert!(checked.join(JOURNAL_FILE).exists());
    assert!(!unchecked.join(JOURNAL_FILE).exists());
}

// Issue 14 item 16, REC-18: a link another account could change, or one that
// leads through a directory another account could change, is not followed,
// for the default location and for a named one alike.
#[test]
fn a_link_another_account_could_change_is_not_followed() {
    // The link leads into a directory writable by others.
    let s = scratch();
    let open = s.tmp.path().join("open");
    mkdir(&open, 0o777);
    let real = open.join("etc");
    mkdir(&real, 0o755);
    let link = s.tmp.path().join("etc");
    symlink(&real, &link).unwrap();
    let config = link.join("vacancyd.toml");
    fs::write(&config, "").unwrap();
    let input = LocationInput {
        config_path: Some(config),
        service_base: s.tmp.path().join("svc"),
        ..LocationInput::default()
    };
    let e = resolve_err(&input);
    assert!(
        matches!(&e, LedgerError::UnsafePath { component, .. } if *component == open),
        "{e}"
    );
    assert!(e.to_string().contains("writable by group or others"), "{e}");
    assert!(!real.join("vacancyd.admission").exists());

    // A named directory reached through such a link: refused too ...
    let named = open.join("rec");
    mkdir(&named, 0o700);
    let named_link = s.tmp.path().join("named");
    symlink(&named, &named_link).unwrap();
    let e = resolve_err(&LocationInput {
        setting: named_link.display().to_string(),
        ..input.clone()
    });
    assert!(
        matches!(&e, LedgerError::UnsafePath { component, .. } if *component == open),
        "{e}"
    );
    assert!(e.to_string().contains("symbolic link"), "{e}");
    // ... while the same directory named directly is what REC-22 checks.
    let location = resolve(&LocationInput {
        setting: named.display().to_string(),
        ..input.clone()
    });
    assert_eq!(location.path, named);

    // A loop of links is named, not followed forever.
    let a = s.tmp.path().join("loop-a");
    let b = s.tmp.path().join("loop-b");
    symlink(&b, &a).unwrap();
    symlink(&a, &b).unwrap();
    let e = resolve_err(&LocationInput {
        setting: a.join("rec").display().to_string(),
        ..input.clone()
    });
    assert!(e.to_string().contains("links"), "{e}");
}

// Issue 14 item 16, REC-18: a link owned by another account is not followed,
// even to a safe directory (needs root to give the link away).
#[test]
fn a_link_owned_by_another_account_is_not_followed() {
    if running_uid() != 0 {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "giving a link away needs root"
        );
        eprintln!("skipped: giving a link away needs root");
        return;
    }
    let s = scratch();
    let input = with_config(&s);
    let elsewhere = s.tmp.path().join("elsewhere");
    mkdir(&elsewhere, 0o700);
    let link = s.tmp.path().join("etc/vacancyd.admission");
    symlink(&elsewhere, &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(12345), Some(12345)).unwrap();
    let e = resolve_err(&input);
    assert!(
        matches!(&e, LedgerError::UnsafePath { component, .. } if *component == link),
        "{e}"
    );
    assert!(e.to_string().contains("owned by uid 12345"), "{e}");
    // A named directory through it too.
    let e = resolve_err(&LocationInput {
        setting: link.display().to_string(),
        ..input
    });
    assert!(e.to_string().contains("owned by uid 12345"), "{e}");
}

#[test]
fn an_ancestor_writable_by_others_stops_startup() {
    // REC-18, REC-19: world- or group-writable, not a root-owned sticky directory
    for bad in [0o777, 0o775, 0o757] {
        let s = scratch();
        let input = with_config(&s);
        let etc = s.tmp.path().join("etc");
        fs::set_permissions(&etc, fs::Permissions::from_mode(bad)).unwrap();
        let e = resolve_err(&input);
        assert!(
            matches!(&e, LedgerError::UnsafePath { component, .. } if *component == etc),
            "{bad:o}: {e}"
        );
        assert!(e.to_string().contains("writable by group or others"), "{e}");
        assert!(!etc.join("vacancyd.admission").exists());
    }
}

#[test]
fn a_sticky_world_writable_ancestor_must_be_root_owned() {
    // REC-18: like /tmp
    let s = scratch();
    let input = with_config(&s);
    let etc = s.tmp.path().join("etc");
    fs::set_permissions(&etc, fs::Permissions::from_mode(0o1777)).unwrap();
    if running_uid() == 0 {
        assert!(resolve(&input).created);
    } else {
        // Owned by this unprivileged account, so not a safe sticky directory.
        assert!(matches!(
            resolve_err(&input),
            LedgerError::UnsafePath { .. }
        ));
    }
}

#[test]
fn an_ancestor_owned_by_another_account_stops_startup() {
    // REC-18, REC-19
    crate::test_prereq::require_root("giving a directory to another account (chown)");
    let s = scratch();
    let input = with_config(&s);
    let etc = s.tmp.path().join("etc");
    std::os::unix::fs::chown(&etc, Some(12345), Some(12345)).unwrap();
    let e = resolve_err(&input);
    assert!(
        matches!(&e, LedgerError::UnsafePath { component, .. } if *component == etc),
        "{e}"
    );
    assert!(e.to_string().contains("owned by uid 12345"), "{e}");
}

#[test]
fn service_records_elsewhere_refuse_to_start_naming_the_line() {
    // REC-14
    let s = scratch();
    let input = with_config(&s);
    let svc = service_dir(&s, &[record::admit_line(&live_entry())]);
    let e = resolve_err(&input);
    let msg = e.to_string();
    assert!(
        matches!(e, LedgerError::ServiceRecordsElsewhere { .. }),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("admission_state_dir = \"{}\"", svc.display())),
        "{msg}"
    );
    assert!(
        msg.contains(&input.config_path.as_ref().unwrap().display().to_string()),
        "{msg}"
    );
    assert!(msg.contains("1 unresolved entry"), "{msg}");
    // Nothing was created at the location this run would have used.
    assert!(!s.tmp.path().join("etc/vacancyd.admission").exists());

    // A held entry counts; so does a journal that cannot be replayed.
    let s = scratch();
    let input = with_config(&s);
    service_dir(
        &s,
        &[
            record::admit_line(&live_entry()),
            record::held_line(live_entry().id, "uncertain"),
        ],
    );
    assert!(matches!(
        resolve_err(&input),
        LedgerError::ServiceRecordsElsewhere { .. }
    ));
    let s = scratch();
    let input = with_config(&s);
    service_dir(&s, &[b"garbage\n".to_vec(), b"more\n".to_vec()]);
    assert!(matches!(
        resolve_err(&input),
        LedgerError::ServiceRecordsElsewhere { .. }
    ));

    // Setting the line makes the run use those records.
    let s = scratch();
    let mut input = with_config(&s);
    let svc = service_dir(&s, &[record::admit_line(&live_entry())]);
    input.setting = svc.display().to_string();
    let loc = resolve(&input);
    assert_eq!(loc.path, svc);
    let (_l, entries) = Ledger::open(&loc.path).unwrap();
    assert_eq!(entries.len(), 1);
}

#[test]
fn service_directory_without_records_or_unreadable_warns_that_locations_differ() {
    // REC-15
    type Setup = fn(&Scratch);
    let cases: Vec<(&str, Setup)> = vec![
        ("empty", |s: &Scratch| {
            service_dir(s, &[]);
        }),
        ("all released", |s: &Scratch| {
            service_dir(
                s,
                &[
                    record::admit_line(&live_entry()),
                    record::release_line(live_entry().id),
                ],
            );
        }),
        ("cannot be read", |s: &Scratch| {
            mkdir(&s.tmp.path().join("svc"), 0o755);
            fs::write(s.tmp.path().join("svc/admission"), "not a directory").unwrap();
        }),
    ];
    for (what, setup) in cases {
        let s = scratch();
        let input = with_config(&s);
        setup(&s);
        let (loc, logs) = with_logs(|| resolve_location(&input));
        let loc = loc.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(loc.path, s.tmp.path().join("etc/vacancyd.admission"));
        assert!(logs.contains("WARN"), "{what}: {logs}");
        assert!(logs.contains("the two locations differ"), "{what}: {logs}");
        assert!(
            logs.contains(&s.tmp.path().join("svc/admission").display().to_string()),
            "{what}: {logs}"
        );
    }
}

#[test]
fn absent_service_directory_says_nothing() {
    // REC-16
    let s = scratch();
    let input = with_config(&s);
    let (loc, logs) = with_logs(|| resolve_location(&input));
    assert!(loc.is_ok());
    assert!(!logs.contains("WARN"), "{logs}");
    assert!(!logs.contains("differ"), "{logs}");
}

#[test]
fn the_service_check_applies_only_while_the_setting_is_empty() {
    // REC-14: a set admission_state_dir is every start's choice
    let s = scratch();
    let mut input = with_config(&s);
    service_dir(&s, &[record::admit_line(&live_entry())]);
    let named = s.tmp.path().join("named");
    mkdir(&named, 0o700);
    input.setting = named.display().to_string();
    let (loc, logs) = with_logs(|| resolve_location(&input));
    assert_eq!(loc.unwrap().path, named);
    assert!(!logs.contains("differ"), "{logs}");
}

/// Set for the copy of [`a_directory_owned_by_another_account_is_refused`]
/// that runs as `nobody`: the root-owned 0700 directory it must refuse.
const CHILD_ENV: &str = "VACANCY_LEDGER_TEST_UNPRIVILEGED_DIR";

/// Every way of opening `dir`, a directory of root's, as this unprivileged
/// account is refused, naming the directory and the `chown` that fixes it.
fn refuses_a_root_owned_directory(dir: &Path) {
    let me = running_uid();
    assert_ne!(me, 0, "the check runs as an unprivileged account");
    let check = |e: LedgerError| {
        let msg = e.to_string();
        assert!(
            matches!(e, LedgerError::WrongOwner { owner: 0, expected, .. } if expected == me),
            "{msg}"
        );
        assert!(msg.contains(&dir.display().to_string()), "{msg}");
        assert!(
            msg.contains(&format!("chown {me} {}", dir.display())),
            "{msg}"
        );
    };
    check(check_recovery_dir(dir).unwrap_err());
    check(Ledger::open(dir).map(|_| ()).unwrap_err());
    let input = LocationInput {
        setting: dir.display().to_string(),
        service_base: dir.join("absent-service-base"),
        config_path: Some(dir.with_file_name("vacancyd.toml")),
        ..LocationInput::default()
    };
    check(resolve_location(&input).unwrap_err());
}

#[test]
fn a_directory_owned_by_another_account_is_refused() {
    // REC-22. One test, two roles: as root it makes a private root-owned
    // directory and runs its own copy as `nobody` (CHILD_ENV names the
    // directory) to be refused it; an unprivileged run is refused `/`.
    match (std::env::var_os(CHILD_ENV), running_uid()) {
        (Some(dir), _) => {
            refuses_a_root_owned_directory(Path::new(&dir));
            println!("unprivileged child: ok");
        }
        (None, 0) => refused_to_nobody(),
        (None, _) => refuses_a_root_owned_directory(Path::new("/")),
    }
}

/// The root half of [`a_directory_owned_by_another_account_is_refused`].
fn refused_to_nobody() {
    let setpriv = crate::test_prereq::setpriv();
    // A folder `nobody` can enter, holding a copy of this test binary and a
    // private directory owned by root.
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let rec = tmp.path().join("rec");
    fs::DirBuilder::new().mode(0o700).create(&rec).unwrap();
    let bin = tmp.path().join("ledger-tests");
    let exe = std::env::current_exe().unwrap();
    if fs::hard_link(&exe, &bin).is_err() {
        fs::copy(&exe, &bin).unwrap();
    }
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    let out = std::process::Command::new(setpriv)
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .args([
            "--exact",
            "ledger::tests::location::a_directory_owned_by_another_account_is_refused",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &rec)
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("unprivileged child: ok"),
        "child failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // Left as it was.
    let meta = fs::metadata(&rec).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o700));
}
