//! The Unix side of the seam.

use std::ffi::c_int;
use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use tracing::warn;

/// The mode every file of the recovery directory is created with: the owner's only.
const PRIVATE_FILE_MODE: u32 = 0o600;

/// Create files private to the running account (mode 0600).
pub fn private_file(options: &mut OpenOptions) -> &mut OpenOptions {
    options.mode(PRIVATE_FILE_MODE)
}

/// Never open through a symbolic link at the name (`O_NOFOLLOW`): the open
/// fails with `ELOOP`, see [`link_refused`].
pub fn no_follow(options: &mut OpenOptions) -> &mut OpenOptions {
    // A small constant (0o400000 on Linux); the cast cannot wrap.
    options.custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as c_int)
}

/// Whether an open with [`no_follow`] failed because the name is a link.
pub fn link_refused(e: &io::Error) -> bool {
    rustix::io::Errno::from_io_error(e) == Some(rustix::io::Errno::LOOP)
}

/// Whether a file opened with [`no_follow`] is a link after all: never on
/// Unix, where the open itself refuses one.
pub fn opened_link(_meta: &Metadata) -> bool {
    false
}

/// Rename `from` over `to`, atomically (`rename(2)`); durable once the
/// directory is synced ([`sync_dir`]).
pub fn replace_file(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::rename(from, to)
}

/// Make `dir`'s entries (files created, renamed, removed) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir).and_then(|d| d.sync_all())
}

/// The soft limit on open descriptors, raised first to the hard limit (at
/// most 2^20, the kernel's usual `nr_open`) where it is lower, as Go's
/// runtime does.
pub fn raise_open_file_limit() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    const CAP: u64 = 1 << 20;
    let limit = getrlimit(Resource::Nofile);
    let current = limit.current.unwrap_or(CAP);
    let wanted = limit.maximum.unwrap_or(CAP).min(CAP);
    if current < wanted {
        let raised = Rlimit {
            current: Some(wanted),
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => return wanted,
            Err(e) => warn!(error = %e, "cannot raise the open-file limit to its hard limit"),
        }
    }
    current
}
