//! What can go wrong with the recovery directory, each error naming the path and the fix.

use std::io;
use std::path::PathBuf;

use crate::engine::EntryId;

/// Why the recovery directory could not be located, opened or written.
///
/// # Behavior
///
/// Every message names the file or directory concerned and what an operator
/// can do about it. Startup errors (everything but [`LedgerError::Io`] and
/// [`LedgerError::Unavailable`] during operation) stop vacancyd: the old work
/// must not silently disappear (REC-08, REC-19, REC-20, REC-22, REC-25).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// A file system operation failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What vacancyd was doing, e.g. `read the journal`.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// A record other than a cut-short newest one is malformed (REC-08).
    #[error(
        "the recovery directory is corrupt at line {line} of {path}: {detail}; restore it from \
         backup or move the file aside after releasing the work it records at the upstream; \
         vacancyd never deletes it"
    )]
    Corrupt {
        /// The journal file.
        path: PathBuf,
        /// The 1-based line number.
        line: u64,
        /// What is wrong with the line.
        detail: String,
    },
    /// A record was written by a newer vacancyd in a format this one cannot read.
    #[error(
        "line {line} of {path} is in recovery format {version}, written by a newer vacancyd; this \
         one reads format {supported}: run that newer version (or later) so the work it records \
         is not forgotten"
    )]
    NewerFormat {
        /// The journal file.
        path: PathBuf,
        /// The 1-based line number.
        line: u64,
        /// The format version on the line.
        version: u64,
        /// The newest format this build reads.
        supported: u32,
    },
    /// Another daemon holds the directory's lock (REC-25).
    #[error(
        "recovery directory {path} is in use by {holder}; only one daemon may open it: stop that \
         daemon or give this one another admission_state_dir"
    )]
    InUse {
        /// The recovery directory.
        path: PathBuf,
        /// Who holds it, e.g. `vacancyd pid 4242 since 2026-05-01T10:00:00Z`.
        holder: String,
    },
    /// A directory named by `admission_state_dir` does not exist (REC-20).
    #[cfg_attr(
        not(windows),
        error(
            "the recovery directory {path} named by server.admission_state_dir does not exist; \
             vacancyd creates only the default location, so that a moved configuration, a \
             changed setting or a typo cannot start with an empty ledger and forget held work \
             recorded elsewhere: correct the setting, or for a new installation create it empty \
             and private to the account vacancyd runs as (mkdir -m 700 {path})"
        )
    )]
    #[cfg_attr(
        windows,
        error(
            "the recovery directory {path} named by server.admission_state_dir does not exist; \
             vacancyd creates only the default location, so that a moved configuration, a \
             changed setting or a typo cannot start with an empty ledger and forget held work \
             recorded elsewhere: correct the setting, or for a new installation create it empty, \
             owned by and accessible only to Administrators and LocalSystem, as an administrator: \
             mkdir \"{path}\" && icacls \"{path}\" /inheritance:r /grant:r \
             *S-1-5-32-544:(OI)(CI)F *S-1-5-18:(OI)(CI)F && icacls \"{path}\" /setowner \
             *S-1-5-32-544"
        )
    )]
    Missing {
        /// The directory.
        path: PathBuf,
    },
    /// The recovery directory path is not a directory.
    #[error(
        "the recovery directory {path} is not a directory; move it aside or set \
         server.admission_state_dir to a directory"
    )]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// An existing recovery directory is owned by another account (REC-22).
    #[error(
        "the recovery directory {path} is owned by uid {owner}, but vacancyd runs as uid \
         {expected}; it must be owned by the account vacancyd runs as (vacancyd never changes \
         an existing recovery directory's owner): chown {expected} {path}, or run vacancyd as \
         uid {owner}"
    )]
    WrongOwner {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The account vacancyd runs as.
        expected: u32,
    },
    /// An existing recovery directory is not private (REC-22).
    #[error(
        "the recovery directory {path} has mode {mode:04o}; it must be private to the account \
         vacancyd runs as, mode 0700 (vacancyd never changes an existing recovery directory's \
         permissions): chmod 700 {path}"
    )]
    WrongMode {
        /// The directory.
        path: PathBuf,
        /// Its mode: the permission bits with the sticky, setuid and setgid bits.
        mode: u32,
    },
    /// A file of the recovery directory is a symbolic link (REC-18).
    #[error(
        "{path} is a symbolic link; vacancyd opens the files of its recovery directory only as \
         themselves, never through a link, which could send its records to any file: put the \
         file itself there (mv the file it points to over the link), private to the account \
         vacancyd runs as (chmod 600)"
    )]
    LinkedFile {
        /// The link.
        path: PathBuf,
    },
    /// A file of the recovery directory is not a regular file.
    #[error(
        "{path} is not a regular file; the recovery directory holds only vacancyd's own files: \
         move it aside"
    )]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// A file of the recovery directory is owned by another account than the directory (REC-22).
    #[error(
        "{path} is owned by uid {owner}, but its recovery directory by uid {expected}; every file \
         in it must be owned by the account vacancyd runs as (vacancyd never changes an existing \
         file's owner): chown {expected} {path}"
    )]
    FileWrongOwner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The directory's owner.
        expected: u32,
    },
    /// A file of the recovery directory is not private (REC-22).
    #[error(
        "{path} has mode {mode:04o}; the files of the recovery directory must be private to the \
         account vacancyd runs as, mode 0600 (vacancyd never changes an existing file's \
         permissions): chmod 600 {path}"
    )]
    FileWrongMode {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The default location's path could be replaced or redirected by an untrusted account (REC-18, REC-19).
    #[error(
        "the recovery directory {path} is not safe to use: {component} {why}; another account \
         could replace or redirect it: fix that directory, or set server.admission_state_dir \
         to a private directory on a safe path"
    )]
    UnsafePath {
        /// The recovery directory.
        path: PathBuf,
        /// The offending path component.
        component: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// On Windows: a folder of the recovery directory's path lets in an
    /// account other than Administrators and LocalSystem (REC-23, REC-24).
    #[error(
        "the recovery directory {path} is not private: {folder} {what}; on Windows the recovery \
         directory and every folder from ProgramData\\vacancyd down must be owned by and \
         accessible only to Administrators and LocalSystem, and vacancyd never changes an \
         existing folder's owner or permissions: as an administrator, icacls \"{folder}\" \
         /inheritance:r /grant:r *S-1-5-32-544:(OI)(CI)F *S-1-5-18:(OI)(CI)F, then icacls \
         \"{folder}\" /setowner *S-1-5-32-544 (or move the work aside and let vacancyd create \
         the default location)"
    )]
    NotPrivate {
        /// The recovery directory.
        path: PathBuf,
        /// The folder that lets another account in: the directory or one on its way.
        folder: PathBuf,
        /// Which account has which access, and any other owner.
        what: String,
    },
    /// On Windows: the recovery directory is not inside `ProgramData\vacancyd` (REC-24).
    #[error(
        "the recovery directory {path} is not inside {base}; on Windows it must be there, where \
         only Administrators and LocalSystem can reach it: set server.admission_state_dir to a \
         directory inside {base} (empty: {base}\\admission)"
    )]
    OutsideServiceBase {
        /// The recovery directory.
        path: PathBuf,
        /// `%ProgramData%\vacancyd`.
        base: PathBuf,
    },
    /// The service's recovery directory holds work while this run would use another (REC-14).
    #[error(
        "the service's recovery directory {service_dir} holds records of unfinished or held \
         work ({detail}), but this run would use {chosen}; to make every start use those records, \
         add this line to the [server] section of {config}: admission_state_dir = \"{}\"",
        service_dir.display()
    )]
    ServiceRecordsElsewhere {
        /// The service's recovery directory.
        service_dir: PathBuf,
        /// The directory this run would have used.
        chosen: PathBuf,
        /// How many entries, or why they could not be replayed.
        detail: String,
        /// The configuration file, or a description when none was given.
        config: String,
    },
    /// No default location can be derived (no configuration file, no home).
    #[error(
        "cannot choose a recovery directory: {why}; pass --config with a configuration file, or \
         set XDG_STATE_HOME or HOME"
    )]
    NoDefaultLocation {
        /// What is missing.
        why: String,
    },
    /// A relative `admission_state_dir` with no configuration file to resolve it against.
    #[error(
        "server.admission_state_dir = {setting:?} is relative, but there is no configuration \
         file to resolve it against; give an absolute path"
    )]
    RelativeWithoutConfig {
        /// The setting.
        setting: String,
    },
    /// The ledger stopped accepting writes after a failure that left the journal in doubt.
    #[error(
        "the journal in {path} is unavailable: {reason}; nothing is forwarded until vacancyd is \
         restarted (the records already written are kept and return as held)"
    )]
    Unavailable {
        /// The recovery directory.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A change names an entry the ledger does not hold.
    #[error("work entry {entry} has no record in {path}")]
    UnknownEntry {
        /// The recovery directory.
        path: PathBuf,
        /// The entry.
        entry: EntryId,
    },
    /// An entry is recorded already.
    #[error("work entry {entry} is recorded already in {path}")]
    DuplicateEntry {
        /// The recovery directory.
        path: PathBuf,
        /// The entry.
        entry: EntryId,
    },
}

impl LedgerError {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        LedgerError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
