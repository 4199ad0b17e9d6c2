//! The console session, for owner presence (issue 33 item 2): which session
//! is attached to the physical console (`WTSGetActiveConsoleSessionId`),
//! whether a user is signed in there (`WTSQuerySessionInformationW`:
//! `WTSConnectState`, `WTSUserName`) and whether it is locked
//! (`WTSSessionInfoEx`'s `SessionFlags`). vacancy decides from these raw
//! values (`vacancy::presence::windows`), so the decision is tested on every
//! system.
//!
//! `GetLastInputInfo` is not here: it sees only the input of the caller's own
//! session, and the service runs in session 0, never the owner's.

use std::io;
use std::ptr::null_mut;

use windows_sys::Win32::System::RemoteDesktop::{
    WTS_CURRENT_SERVER_HANDLE, WTS_INFO_CLASS, WTSConnectState, WTSFreeMemory,
    WTSGetActiveConsoleSessionId, WTSINFOEXW, WTSQuerySessionInformationW, WTSSessionInfoEx,
    WTSUserName,
};

/// What `WTSGetActiveConsoleSessionId` answers while no session is attached
/// to the console (one is being attached or detached: a switch).
const NO_CONSOLE_SESSION: u32 = 0xFFFF_FFFF;

/// The session attached to the physical console, or `None` while none is
/// (a session is being attached or detached).
pub fn active_console_session() -> Option<u32> {
    // SAFETY: no arguments; it only answers a number.
    let id = unsafe { WTSGetActiveConsoleSessionId() };
    (id != NO_CONSOLE_SESSION).then_some(id)
}

/// A buffer `WTSQuerySessionInformationW` allocated, freed on drop.
struct WtsBuffer {
    ptr: *mut u16,
    bytes: usize,
}

impl Drop for WtsBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from WTSQuerySessionInformationW and is freed
        // once, here, with the function its documentation names.
        unsafe { WTSFreeMemory(self.ptr.cast()) };
    }
}

impl WtsBuffer {
    /// The buffer's first value of type `T`, when it holds one.
    fn read<T: Copy>(&self) -> io::Result<T> {
        if self.bytes < size_of::<T>() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} bytes answered where {} were expected",
                    self.bytes,
                    size_of::<T>()
                ),
            ));
        }
        // SAFETY: the buffer is alive and holds at least size_of::<T>()
        // bytes; T is a plain C value (every bit pattern is valid), and the
        // read does not assume alignment.
        Ok(unsafe { self.ptr.cast::<T>().read_unaligned() })
    }

    /// The buffer as a NUL-terminated UTF-16 string (lossily decoded).
    fn string(&self) -> io::Result<String> {
        let units = self.bytes / 2;
        if units == 0 {
            return Ok(String::new());
        }
        if !self.ptr.is_aligned() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a string not aligned for UTF-16",
            ));
        }
        // SAFETY: the buffer is alive, aligned (checked) and holds `units`
        // UTF-16 units, which nothing else writes while it is borrowed.
        let all = unsafe { std::slice::from_raw_parts(self.ptr, units) };
        let end = all.iter().position(|&u| u == 0).unwrap_or(all.len());
        Ok(String::from_utf16_lossy(&all[..end]))
    }
}

fn query(session: u32, class: WTS_INFO_CLASS) -> io::Result<WtsBuffer> {
    let mut ptr: *mut u16 = null_mut();
    let mut bytes = 0u32;
    // SAFETY: the local server's pseudo-handle; `ptr` and `bytes` are valid
    // out-pointers; on success the buffer is ours to free (WtsBuffer).
    let ok = unsafe {
        WTSQuerySessionInformationW(
            WTS_CURRENT_SERVER_HANDLE,
            session,
            class,
            &mut ptr,
            &mut bytes,
        )
    };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    if ptr.is_null() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "success without a buffer",
        ));
    }
    Ok(WtsBuffer {
        ptr,
        bytes: usize::try_from(bytes).unwrap_or(0),
    })
}

/// The session's connection state (`WTS_CONNECTSTATE_CLASS`: 0 active,
/// 1 connected, 2 connect query, 3 shadow, 4 disconnected, 5 idle, 6
/// listen, 7 reset, 8 down, 9 init).
///
/// # Errors
///
/// The operating system's error, or `InvalidData` for a short answer.
pub fn connect_state(session: u32) -> io::Result<i32> {
    query(session, WTSConnectState)?.read::<i32>()
}

/// The name of the user signed in to the session; empty when nobody is.
///
/// # Errors
///
/// The operating system's error, or `InvalidData` for an unaligned answer.
pub fn user_name(session: u32) -> io::Result<String> {
    query(session, WTSUserName)?.string()
}

/// `WTSINFOEX_LEVEL1_W.SessionFlags`: `WTS_SESSIONSTATE_LOCK` (0),
/// `WTS_SESSIONSTATE_UNLOCK` (1) or `WTS_SESSIONSTATE_UNKNOWN` (-1).
/// Windows 7 and Server 2008 R2 swapped lock and unlock (a documented
/// defect); this crate's programs need Windows 10 or later, as the Rust
/// standard library does.
///
/// # Errors
///
/// The operating system's error (Windows before 7 lacks the class), or
/// `InvalidData` for a short answer or another level than 1.
pub fn session_flags(session: u32) -> io::Result<i32> {
    let info = query(session, WTSSessionInfoEx)?.read::<WTSINFOEXW>()?;
    if info.Level != 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("WTSINFOEXW level {} (1 expected)", info.Level),
        ));
    }
    // SAFETY: level 1 says the union holds WTSINFOEX_LEVEL1_W, its only member.
    Ok(unsafe { info.Data.WTSInfoExLevel1 }.SessionFlags)
}
