//! A security descriptor that Windows allocated with `LocalAlloc`, freed on drop.

use std::io;
use std::ptr::null_mut;

use windows_sys::Win32::Foundation::LocalFree;
use windows_sys::Win32::Security::Authorization::{
    ConvertStringSecurityDescriptorToSecurityDescriptorW, SDDL_REVISION_1,
};
use windows_sys::Win32::Security::{PSECURITY_DESCRIPTOR, SECURITY_ATTRIBUTES};

/// A self-relative security descriptor owned by this value.
pub(crate) struct LocalDescriptor(pub(crate) PSECURITY_DESCRIPTOR);

impl LocalDescriptor {
    /// The descriptor an SDDL string describes.
    pub(crate) fn from_sddl(sddl: &str) -> io::Result<Self> {
        let text: Vec<u16> = sddl.encode_utf16().chain(std::iter::once(0)).collect();
        let mut sd: PSECURITY_DESCRIPTOR = null_mut();
        // SAFETY: `text` is NUL-terminated and outlives the call; `sd` is a
        // valid out-pointer; the size out-pointer may be null.
        let ok = unsafe {
            ConvertStringSecurityDescriptorToSecurityDescriptorW(
                text.as_ptr(),
                SDDL_REVISION_1,
                &mut sd,
                null_mut(),
            )
        };
        if ok == 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(LocalDescriptor(sd))
    }

    /// `SECURITY_ATTRIBUTES` pointing at this descriptor, valid while `self` lives.
    pub(crate) fn attributes(&self) -> SECURITY_ATTRIBUTES {
        SECURITY_ATTRIBUTES {
            // A small struct: its size fits in u32.
            nLength: u32::try_from(size_of::<SECURITY_ATTRIBUTES>()).unwrap_or(u32::MAX),
            lpSecurityDescriptor: self.0,
            bInheritHandle: 0,
        }
    }
}

impl Drop for LocalDescriptor {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the pointer came from LocalAlloc (through a Win32 call
            // documented to allocate it so) and is freed once, here.
            unsafe { LocalFree(self.0) };
        }
    }
}

/// A UTF-16 string Windows allocated with `LocalAlloc`, read and freed.
///
/// # Safety
///
/// `ptr` must be null or a NUL-terminated UTF-16 string allocated by
/// `LocalAlloc` that nothing else frees.
pub(crate) unsafe fn take_local_string(ptr: *mut u16) -> String {
    if ptr.is_null() {
        return String::new();
    }
    let mut len = 0;
    loop {
        // SAFETY: the caller promises a NUL-terminated string: every index
        // up to and including the terminator is inside its allocation.
        let unit = unsafe { ptr.add(len) };
        // SAFETY: `unit` is inside the string, per the above.
        if unsafe { *unit } == 0 {
            break;
        }
        len += 1;
    }
    // SAFETY: `len` UTF-16 units were just read from this allocation.
    let units = unsafe { std::slice::from_raw_parts(ptr, len) };
    let text = String::from_utf16_lossy(units);
    // SAFETY: allocated by LocalAlloc, per the caller; freed once, here.
    unsafe { LocalFree(ptr.cast()) };
    text
}
