//! The Win32 calls vacancy makes on Windows, each behind a safe function.
//!
//! Everything else in the workspace forbids unsafe code; what the platform
//! seam (`vacancy::platform`) and the daemon's Windows service need of the
//! Win32 API that the standard library, tokio and `windows-service` do not
//! wrap safely is here, small and in one place: reading a path's owner and
//! DACL as an SDDL string, creating a directory with a given security
//! descriptor, replacing a file with `MoveFileExW`, creating a named pipe
//! with a DACL, the service dispatcher's entry point, reading the system's
//! power status, the console session's state (owner presence), what GPU
//! pressure needs to attribute GPU use (listening ports' processes, the
//! process tree, per-process GPU memory), the tray's icon and menu and its
//! sealed token (DPAPI), and telling Wine from Windows. Each unsafe block
//! says why it is sound.
//!
//! On other systems the crate is empty.
#![cfg(windows)]

mod descriptor;
pub mod dpapi;
pub mod fs;
pub mod gpu_owners;
pub mod pipe;
pub mod power;
pub mod process;
pub mod security;
pub mod service;
pub mod session;
pub mod tray;

/// The `windows-service` crate this one is built with, for the service's control.
pub use windows_service;

/// `path` as a NUL-terminated UTF-16 string for the `W` functions.
pub(crate) fn wide(path: &std::ffi::OsStr) -> Vec<u16> {
    use std::os::windows::ffi::OsStrExt;
    path.encode_wide().chain(std::iter::once(0)).collect()
}
