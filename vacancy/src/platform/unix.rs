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

/// Open without waiting for a writer (`O_NONBLOCK`): a FIFO opens at once
/// instead of blocking the thread; a regular file reads as usual.
pub fn open_without_waiting(options: &mut OpenOptions) -> &mut OpenOptions {
    // A small constant (0o4000 on Linux); the cast cannot wrap.
    options.custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as c_int)
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

/// Write all of `bytes` at `offset` (`pwrite(2)`), leaving the file's
/// cursor where it was.
pub fn write_at(file: &File, offset: u64, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(bytes, offset)
}

/// Make `dir`'s entries (files created, renamed, removed) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir).and_then(|d| d.sync_all())
}

/// Whether `dir` is on a filesystem that answers reads from memory or a
/// local disk (tmpfs, procfs, sysfs, ext4, xfs, btrfs, overlayfs, ...), so a
/// sampler may read its small files there on the calling thread (issue 31).
/// No for a network or user-space filesystem (NFS, SMB, FUSE), one not
/// listed, a directory that cannot be asked, and systems other than Linux.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn local_filesystem(dir: &Path) -> bool {
    // linux/magic.h
    const LOCAL: [u32; 12] = [
        0x0102_1994, // tmpfs
        0x8584_58f6, // ramfs
        0x0000_9fa0, // procfs
        0x6265_6572, // sysfs
        0x0000_ef53, // ext2, ext3, ext4
        0x5846_5342, // xfs
        0x9123_683e, // btrfs
        0x794c_7630, // overlayfs
        0xf2f5_2010, // f2fs
        0x2fc1_2fc1, // zfs
        0xca45_1a4e, // bcachefs
        0x0000_4d44, // vfat
    ];
    // f_type's width and sign differ by architecture; the magic numbers
    // are 32 bits, so its low 32 bits are compared.
    rustix::fs::statfs(dir).is_ok_and(|s| LOCAL.contains(&(s.f_type as u32)))
}

/// See the Linux version: no other Unix is asked.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn local_filesystem(_dir: &Path) -> bool {
    false
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
