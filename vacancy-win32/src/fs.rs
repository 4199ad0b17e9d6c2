//! Replacing a file the Windows way.

use std::io;
use std::path::Path;

use windows_sys::Win32::Storage::FileSystem::{
    MOVEFILE_REPLACE_EXISTING, MOVEFILE_WRITE_THROUGH, MoveFileExW,
};

use crate::wide;

/// Move `from` over `to`, replacing it, and return only once the move is on
/// disk (`MoveFileExW` with `MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH`):
/// a crash leaves the old file or the new one, and an acknowledged replace
/// survives it. (The standard library's `rename` does not ask for write-through.)
///
/// # Errors
///
/// The operating system's error.
pub fn replace_file(from: &Path, to: &Path) -> io::Result<()> {
    let (from, to) = (wide(from.as_os_str()), wide(to.as_os_str()));
    // SAFETY: both names are NUL-terminated and outlive the call.
    let ok = unsafe {
        MoveFileExW(
            from.as_ptr(),
            to.as_ptr(),
            MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH,
        )
    };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
