//! Security descriptors of files and directories, as SDDL strings.
//!
//! vacancy judges a descriptor as data (`vacancy::platform::sddl`), so the
//! same decision is tested on every build from SDDL written by hand; here a
//! real path's descriptor is read and written in that form.

use std::io;
use std::path::Path;
use std::ptr::null_mut;

use windows_sys::Win32::Foundation::ERROR_SUCCESS;
use windows_sys::Win32::Security::Authorization::{
    ConvertSecurityDescriptorToStringSecurityDescriptorW, GetNamedSecurityInfoW, SDDL_REVISION_1,
    SE_FILE_OBJECT,
};
use windows_sys::Win32::Security::{
    DACL_SECURITY_INFORMATION, OWNER_SECURITY_INFORMATION, PSECURITY_DESCRIPTOR,
};
use windows_sys::Win32::Storage::FileSystem::CreateDirectoryW;

use crate::descriptor::{LocalDescriptor, take_local_string};
use crate::wide;

/// The owner and DACL of `path` (a file or directory), as SDDL:
/// `O:BAD:P(A;OICI;FA;;;BA)(A;OICI;FA;;;SY)`. A protected DACL shows as
/// `D:P`, a NULL DACL as `D:NO_ACCESS_CONTROL`.
///
/// # Errors
///
/// The operating system's error (`GetNamedSecurityInfoW`, or the conversion).
pub fn descriptor_sddl(path: &Path) -> io::Result<String> {
    let name = wide(path.as_os_str());
    let info = OWNER_SECURITY_INFORMATION | DACL_SECURITY_INFORMATION;
    let mut sd: PSECURITY_DESCRIPTOR = null_mut();
    // SAFETY: `name` is NUL-terminated and outlives the call; the owner,
    // group, DACL and SACL out-pointers may be null; `sd` is a valid
    // out-pointer, set to a LocalAlloc'd descriptor on success.
    let status = unsafe {
        GetNamedSecurityInfoW(
            name.as_ptr(),
            SE_FILE_OBJECT,
            info,
            null_mut(),
            null_mut(),
            null_mut(),
            null_mut(),
            &mut sd,
        )
    };
    if status != ERROR_SUCCESS {
        // A WIN32_ERROR: a small positive code, as io::Error wants it.
        return Err(io::Error::from_raw_os_error(
            i32::try_from(status).unwrap_or(i32::MAX),
        ));
    }
    let owned = LocalDescriptor(sd);
    let mut text: *mut u16 = null_mut();
    // SAFETY: `owned.0` is the valid descriptor just read; `text` is a valid
    // out-pointer; the length out-pointer may be null.
    let ok = unsafe {
        ConvertSecurityDescriptorToStringSecurityDescriptorW(
            owned.0,
            SDDL_REVISION_1,
            info,
            &mut text,
            null_mut(),
        )
    };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: on success `text` is a NUL-terminated LocalAlloc'd string that
    // only this function owns.
    Ok(unsafe { take_local_string(text) })
}

/// Create the directory `path` (its parent must exist) with the security
/// descriptor `sddl` from creation: no moment exists when it has another.
///
/// # Errors
///
/// An SDDL string Windows does not accept, or the operating system's error
/// (`AlreadyExists` when something is there).
pub fn create_dir(path: &Path, sddl: &str) -> io::Result<()> {
    let sd = LocalDescriptor::from_sddl(sddl)?;
    let attributes = sd.attributes();
    let name = wide(path.as_os_str());
    // SAFETY: `name` is NUL-terminated; `attributes` points at `sd`'s valid
    // descriptor; both outlive the call.
    let ok = unsafe { CreateDirectoryW(name.as_ptr(), &attributes) };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
