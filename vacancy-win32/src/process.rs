//! The running process: its account, and whether it runs under Wine.

use std::io;
use std::ptr::null_mut;

use windows_sys::Win32::Foundation::{CloseHandle, HANDLE};
use windows_sys::Win32::Security::Authorization::ConvertSidToStringSidW;
use windows_sys::Win32::Security::{GetTokenInformation, TOKEN_QUERY, TOKEN_USER, TokenUser};
use windows_sys::Win32::System::LibraryLoader::{GetModuleHandleW, GetProcAddress};
use windows_sys::Win32::System::Threading::{GetCurrentProcess, OpenProcessToken};

use crate::descriptor::take_local_string;

/// Whether this process runs under Wine rather than Windows: Wine's
/// `ntdll.dll` exports `wine_get_version`, Windows' never does. `ntdll.dll`
/// is loaded into every process from the system directory, so nothing a
/// user can place beside the program changes the answer.
pub fn under_wine() -> bool {
    let ntdll: Vec<u16> = "ntdll.dll"
        .encode_utf16()
        .chain(std::iter::once(0))
        .collect();
    // SAFETY: the name is NUL-terminated and outlives the call; the handle
    // of a module every process has loaded is not reference-counted.
    let module = unsafe { GetModuleHandleW(ntdll.as_ptr()) };
    if module.is_null() {
        return false;
    }
    // SAFETY: `module` is a loaded module's handle; the name is a
    // NUL-terminated ASCII string.
    unsafe { GetProcAddress(module, c"wine_get_version".as_ptr().cast()) }.is_some()
}

/// The SID of the account this process runs as, as a string (`S-1-5-18`).
///
/// # Errors
///
/// The operating system's error.
pub fn user_sid() -> io::Result<String> {
    let mut token: HANDLE = null_mut();
    // SAFETY: no arguments; returns this process's pseudo-handle.
    let process = unsafe { GetCurrentProcess() };
    // SAFETY: the pseudo-handle of this process is always valid; `token`
    // is a valid out-pointer.
    if unsafe { OpenProcessToken(process, TOKEN_QUERY, &mut token) } == 0 {
        return Err(io::Error::last_os_error());
    }
    let sid = token_user_sid(token);
    // SAFETY: `token` was opened above and is closed once, here.
    unsafe { CloseHandle(token) };
    sid
}

fn token_user_sid(token: HANDLE) -> io::Result<String> {
    // TOKEN_USER and the SID it points to: a SID is at most 68 bytes.
    // u64 units keep the buffer aligned for TOKEN_USER's pointer.
    let mut buffer = [0u64; 16];
    let mut needed = 0u32;
    let size = u32::try_from(size_of_val(&buffer)).unwrap_or(u32::MAX);
    // SAFETY: `buffer` is writable for `size` bytes; `needed` is a valid out-pointer.
    let ok = unsafe {
        GetTokenInformation(
            token,
            TokenUser,
            buffer.as_mut_ptr().cast(),
            size,
            &mut needed,
        )
    };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: on success the buffer starts with an initialised, aligned TOKEN_USER.
    let user = unsafe { &*buffer.as_ptr().cast::<TOKEN_USER>() };
    let mut text: *mut u16 = null_mut();
    // SAFETY: `user.User.Sid` points into `buffer`, which is alive; `text`
    // is a valid out-pointer.
    if unsafe { ConvertSidToStringSidW(user.User.Sid, &mut text) } == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: on success `text` is a NUL-terminated LocalAlloc'd string only we own.
    Ok(unsafe { take_local_string(text) })
}

/// Let go of the console window when this process is its only user: a
/// program started at sign-in (the tray) would otherwise keep an empty
/// console window open. A console shared with a shell is kept.
pub fn detach_console_if_alone() {
    use windows_sys::Win32::System::Console::{FreeConsole, GetConsoleProcessList};
    let mut ids = [0u32; 2];
    // SAFETY: `ids` has room for the two ids the call is told of.
    let count = unsafe { GetConsoleProcessList(ids.as_mut_ptr(), 2) };
    if count == 1 {
        // SAFETY: no arguments; detaching from a console is always allowed.
        unsafe { FreeConsole() };
    }
}
