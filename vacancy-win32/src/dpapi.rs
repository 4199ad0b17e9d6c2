//! The Windows data-protection API (DPAPI): a secret sealed so that only the
//! same user on the same machine can open it, for the tray's owner token
//! (issue 33: "kept per user with the Windows data-protection API").

use std::io;

use windows_sys::Win32::Foundation::LocalFree;
use windows_sys::Win32::Security::Cryptography::{
    CRYPT_INTEGER_BLOB, CRYPTPROTECT_UI_FORBIDDEN, CryptProtectData, CryptUnprotectData,
};

/// `data` sealed for the calling user.
///
/// # Errors
///
/// The operating system's error when the call fails.
pub fn protect(data: &[u8]) -> io::Result<Vec<u8>> {
    let input = blob(data)?;
    let mut output = CRYPT_INTEGER_BLOB {
        cbData: 0,
        pbData: std::ptr::null_mut(),
    };
    let description = crate::wide("vacancyd tray token".as_ref());
    // SAFETY: `input` points at `data`, which outlives the call; the
    // description is NUL-terminated; `output` is written by the call.
    let ok = unsafe {
        CryptProtectData(
            &input,
            description.as_ptr(),
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null(),
            CRYPTPROTECT_UI_FORBIDDEN,
            &mut output,
        )
    };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(take(output))
}

/// What [`protect`] sealed, opened for the same user.
///
/// # Errors
///
/// When the data was sealed for another user or machine, or is damaged.
pub fn unprotect(sealed: &[u8]) -> io::Result<Vec<u8>> {
    let input = blob(sealed)?;
    let mut output = CRYPT_INTEGER_BLOB {
        cbData: 0,
        pbData: std::ptr::null_mut(),
    };
    // SAFETY: `input` points at `sealed`, which outlives the call; the
    // optional arguments are null; `output` is written by the call.
    let ok = unsafe {
        CryptUnprotectData(
            &input,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null(),
            CRYPTPROTECT_UI_FORBIDDEN,
            &mut output,
        )
    };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(take(output))
}

fn blob(data: &[u8]) -> io::Result<CRYPT_INTEGER_BLOB> {
    Ok(CRYPT_INTEGER_BLOB {
        cbData: u32::try_from(data.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too large to seal"))?,
        // The API takes a mutable pointer but does not write through it.
        pbData: data.as_ptr().cast_mut(),
    })
}

/// The output's bytes, copied; the system's buffer freed.
fn take(output: CRYPT_INTEGER_BLOB) -> Vec<u8> {
    if output.pbData.is_null() {
        return Vec::new();
    }
    // SAFETY: the call succeeded, so `pbData` points at `cbData` bytes it allocated.
    let bytes =
        unsafe { std::slice::from_raw_parts(output.pbData, output.cbData as usize) }.to_vec();
    // SAFETY: the buffer was allocated by the system with LocalAlloc and is
    // not used after this.
    unsafe { LocalFree(output.pbData.cast()) };
    bytes
}
