//! Replacing a file the Windows way, and where ProgramData is.

use std::ffi::OsString;
use std::io;
use std::os::windows::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::ptr::null_mut;

use windows_sys::Win32::System::Com::CoTaskMemFree;
use windows_sys::Win32::UI::Shell::{FOLDERID_ProgramData, SHGetKnownFolderPath};

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

/// The ProgramData folder (`C:\ProgramData`), from the shell's known
/// folders rather than the `ProgramData` variable, which a service's
/// environment may not have (or may have otherwise: Wine's services see
/// `C:\users\Public`).
///
/// # Errors
///
/// The operating system's error.
pub fn program_data() -> io::Result<PathBuf> {
    let mut path: *mut u16 = null_mut();
    // SAFETY: the GUID is a static; flags 0 and a null token ask for the
    // folder as every account sees it; `path` is a valid out-pointer, set to
    // a CoTaskMemAlloc'd string even on failure.
    let status = unsafe { SHGetKnownFolderPath(&FOLDERID_ProgramData, 0, null_mut(), &mut path) };
    let result = if status == 0 && !path.is_null() {
        let mut len = 0;
        loop {
            // SAFETY: the string is NUL-terminated: every index up to the
            // terminator is inside it.
            let unit = unsafe { path.add(len) };
            // SAFETY: `unit` is inside the string, per the above.
            if unsafe { *unit } == 0 {
                break;
            }
            len += 1;
        }
        // SAFETY: `len` units were just read from this string.
        let units = unsafe { std::slice::from_raw_parts(path, len) };
        Ok(PathBuf::from(OsString::from_wide(units)))
    } else {
        Err(io::Error::from_raw_os_error(status))
    };
    // SAFETY: allocated by the call above (or null), freed once, here.
    unsafe { CoTaskMemFree(path.cast()) };
    result
}
