//! What differs by operating system, behind one seam: a Unix side and a
//! Windows side with the same functions, and the decisions about Windows
//! security descriptors as pure functions every build tests.
//!
//! The rest of the crate (the engine, the ledger's logic, the proxy, the
//! adapters) is one code path; it asks here how to open a private file
//! without following a link, how to replace a file durably, how to make a
//! directory's entries durable, and how many connections the process can
//! hold. The recovery directory's location rules call the Windows side for
//! REC-23/REC-24 ([`access`], and `windows` on that system) where Linux has
//! its owner-and-mode checks (REC-22).
//!
//! - [`sddl`], [`access`]: descriptors as data and who they let in (pure).
//! - `unix` / `windows`: the system calls, one of them per build.

pub mod access;
pub mod sddl;

#[cfg(unix)]
mod unix;
#[cfg(unix)]
use unix as sys;

#[cfg(windows)]
pub mod windows;
#[cfg(windows)]
use windows as sys;

pub use sys::{
    link_refused, local_filesystem, no_follow, open_without_waiting, opened_link, private_file,
    raise_open_file_limit, replace_file, sync_dir, write_at,
};
