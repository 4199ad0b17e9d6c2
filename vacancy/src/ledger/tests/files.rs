//! The files of the recovery directory (issue 14 item 16, REC-18, REC-22):
//! opened as themselves, never through a symbolic link, and only when they
//! are private to the directory's owner, as the directory itself must be.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;

use super::{reservation, scratch};
use crate::gpu_pressure::CalibrationFile;
use crate::ledger::location::running_uid;
use crate::ledger::store::ReservationStore;
use crate::ledger::{COMPACT_FILE, JOURNAL_FILE, Ledger};

fn open_err(dir: &Path) -> String {
    match Ledger::open(dir) {
        Ok(_) => panic!("open of {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// Whether this process may give files away (root); under `CI=true` a test
/// that needs it fails instead of skipping.
fn can_chown(what: &str) -> bool {
    if running_uid() == 0 {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{what} needs root to change a file's owner"
    );
    eprintln!("skipped {what}: changing a file's owner needs root");
    false
}

/// A 0644 file outside the recovery directory, with `text`.
fn outside_file(tmp: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = tmp.join(name);
    fs::write(&path, text).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    path
}

// Issue 14 item 16: a journal.jsonl that is a symbolic link to a 0644 file
// elsewhere is refused, naming it; the file it points to is neither read
// nor written.
#[tokio::test]
async fn a_linked_journal_is_refused_naming_it_and_its_target_is_untouched() {
    let s = scratch();
    let line = br#"{"v":1,"op":"admit","id":"00000000-0000-0000-0000-000000000001","upstream":"comfy","model":null,"resources":["gpu0"],"completion":"response_end","started_unix_ms":1767225600000,"upstream_ref":null}
"#;
    let target = outside_file(
        s.tmp.path(),
        "elsewhere.jsonl",
        std::str::from_utf8(line).unwrap(),
    );
    let journal = s.rec.join(JOURNAL_FILE);
    symlink(&target, &journal).unwrap();
    let e = open_err(&s.rec);
    assert!(e.contains(&journal.display().to_string()), "{e}");
    assert!(e.contains("symbolic link"), "{e}");
    assert_eq!(fs::read(&target).unwrap(), line);
    assert!(
        fs::symlink_metadata(&journal)
            .unwrap()
            .file_type()
            .is_symlink()
    );

    // A dangling link is refused too, and nothing is created where it points.
    let s = scratch();
    let nowhere = s.tmp.path().join("nowhere.jsonl");
    symlink(&nowhere, s.rec.join(JOURNAL_FILE)).unwrap();
    let e = open_err(&s.rec);
    assert!(e.contains("symbolic link"), "{e}");
    assert!(!nowhere.exists());
}

// Issue 14 item 16, REC-22: a journal that is not private is refused with the
// fix, as the directory is; vacancyd does not change it.
#[test]
fn a_journal_that_is_not_private_is_refused_and_left_alone() {
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    fs::write(&journal, "").unwrap();
    for mode in [0o644, 0o640, 0o604, 0o660] {
        fs::set_permissions(&journal, fs::Permissions::from_mode(mode)).unwrap();
        let e = open_err(&s.rec);
        assert!(e.contains(&format!("mode {mode:04o}")), "{e}");
        assert!(
            e.contains(&format!("chmod 600 {}", journal.display())),
            "{e}"
        );
        assert_eq!(fs::metadata(&journal).unwrap().mode() & 0o7777, mode);
    }
    fs::set_permissions(&journal, fs::Permissions::from_mode(0o600)).unwrap();
    assert!(Ledger::open(&s.rec).is_ok());
}

// Issue 14 item 16, REC-22: a journal owned by another account is refused.
#[test]
fn a_journal_owned_by_another_account_is_refused() {
    if !can_chown("a_journal_owned_by_another_account_is_refused") {
        return;
    }
    let s = scratch();
    let journal = s.rec.join(JOURNAL_FILE);
    fs::write(&journal, "").unwrap();
    fs::set_permissions(&journal, fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&journal, Some(12345), Some(12345)).unwrap();
    let e = open_err(&s.rec);
    assert!(e.contains("owned by uid 12345"), "{e}");
    assert!(
        e.contains(&format!("chown {} {}", running_uid(), journal.display())),
        "{e}"
    );
}

// Issue 14 item 16: the lock file is not followed through a link either (a
// dangling one would otherwise create the file it names).
#[test]
fn a_linked_lock_file_is_refused() {
    let s = scratch();
    let lock = s.rec.join("lock");
    let nowhere = s.tmp.path().join("lock-elsewhere");
    symlink(&nowhere, &lock).unwrap();
    let e = open_err(&s.rec);
    assert!(e.contains(&lock.display().to_string()), "{e}");
    assert!(e.contains("symbolic link"), "{e}");
    assert!(!nowhere.exists());

    let s = scratch();
    let lock = s.rec.join("lock");
    fs::write(&lock, "").unwrap();
    fs::set_permissions(&lock, fs::Permissions::from_mode(0o666)).unwrap();
    let e = open_err(&s.rec);
    assert!(e.contains("mode 0666"), "{e}");
}

// Issue 14 item 16: a compaction file that is a link is not renamed over the
// journal (which would make the journal the link).
#[tokio::test]
async fn a_linked_compaction_file_is_refused() {
    let s = scratch();
    {
        let (ledger, _) = Ledger::open(&s.rec).unwrap();
        ledger.persist(&reservation(1, None)).await.unwrap();
    }
    let complete = "{\"v\":1,\"op\":\"end\",\"entries\":0}\n";
    let target = outside_file(s.tmp.path(), "compacted", complete);
    let new = s.rec.join(COMPACT_FILE);
    symlink(&target, &new).unwrap();
    let e = open_err(&s.rec);
    assert!(e.contains(&new.display().to_string()), "{e}");
    assert!(e.contains("symbolic link"), "{e}");
    assert!(
        fs::symlink_metadata(s.rec.join(JOURNAL_FILE))
            .unwrap()
            .is_file()
    );
}

// Issue 14 item 16: the pressure calibration in the recovery directory is
// read only as itself and only when private, as the journal is.
#[test]
fn a_linked_or_shared_pressure_calibration_is_refused() {
    let s = scratch();
    let path = CalibrationFile::path_in(&s.rec);
    let target = outside_file(s.tmp.path(), "cal.json", r#"{"version":1,"gpus":{}}"#);
    symlink(&target, &path).unwrap();
    let e = CalibrationFile::load(&path).unwrap_err().to_string();
    assert!(e.contains(&path.display().to_string()), "{e}");
    assert!(e.contains("symbolic link"), "{e}");

    fs::remove_file(&path).unwrap();
    fs::copy(&target, &path).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    let e = CalibrationFile::load(&path).unwrap_err().to_string();
    assert!(e.contains("mode 0644"), "{e}");
    assert!(e.contains(&format!("chmod 600 {}", path.display())), "{e}");

    // What calibrate-pressure saves is private, and reads back.
    fs::remove_file(&path).unwrap();
    CalibrationFile::default().save(&path).unwrap();
    assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
    assert_eq!(
        CalibrationFile::load(&path).unwrap(),
        CalibrationFile::default()
    );
}

// Issue 14 item 16: what the ledger creates is private, so it passes its own
// check at the next open.
#[tokio::test]
async fn the_files_the_ledger_creates_are_private() {
    let s = scratch();
    {
        let (ledger, _) = Ledger::open(&s.rec).unwrap();
        ledger.persist(&reservation(1, None)).await.unwrap();
        ledger.forget(reservation(1, None).id).await.unwrap();
        ledger.compact().await.unwrap();
    }
    for name in [JOURNAL_FILE, "lock"] {
        let meta = fs::symlink_metadata(s.rec.join(name)).unwrap();
        assert!(meta.is_file(), "{name}");
        assert_eq!(meta.mode() & 0o7777, 0o600, "{name}");
    }
    assert!(Ledger::open(&s.rec).is_ok());
}

// Issue 30 item 13: a FIFO (or any file that is not a regular one) in place
// of a file of the recovery directory is refused by its type before it is
// opened: opening a FIFO to read would wait for a writer forever.
#[test]
fn a_fifo_in_the_recovery_directory_is_refused_by_type_without_opening_it() {
    let s = scratch();
    let fifo = s.rec.join("learned-contexts.json");
    let made = std::process::Command::new("mkfifo")
        .args(["-m", "600"])
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo");
    let (tx, rx) = std::sync::mpsc::channel();
    let path = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(crate::ledger::files::read_private(&path).map(|_| ()));
    });
    let read = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("reading a FIFO in the recovery directory hung: it was opened");
    let e = read
        .expect_err("a FIFO is no file of vacancyd's")
        .to_string();
    assert!(e.contains(&fifo.display().to_string()), "{e}");
    assert!(e.contains("not a regular file"), "{e}");
}
