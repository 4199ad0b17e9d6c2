//! What GPU pressure needs to tell the owner's GPU use from borrowed work's
//! on Windows: which processes listen on TCP ports (`GetExtendedTcpTable`),
//! the process tree (a Toolhelp32 snapshot) with each process's start time
//! (`GetProcessTimes`), and each process's dedicated GPU memory from the
//! `GPU Process Memory` performance counters (PDH). Under WDDM NVML reports
//! no process's memory; Windows itself counts it there. vacancy parses and
//! decides (`vacancy::gpu_pressure`), so those decisions are tested on
//! every system.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ptr::null_mut;

use windows_sys::Win32::Foundation::{
    CloseHandle, ERROR_INSUFFICIENT_BUFFER, FILETIME, HANDLE, INVALID_HANDLE_VALUE, NO_ERROR,
};
use windows_sys::Win32::NetworkManagement::IpHelper::{
    GetExtendedTcpTable, MIB_TCP6ROW_OWNER_PID, MIB_TCPROW_OWNER_PID, TCP_TABLE_OWNER_PID_LISTENER,
};
use windows_sys::Win32::Networking::WinSock::{AF_INET, AF_INET6};
use windows_sys::Win32::System::Diagnostics::ToolHelp::{
    CreateToolhelp32Snapshot, PROCESSENTRY32W, Process32FirstW, Process32NextW, TH32CS_SNAPPROCESS,
};
use windows_sys::Win32::System::Performance::{
    PDH_CSTATUS_VALID_DATA, PDH_FMT_COUNTERVALUE_ITEM_W, PDH_FMT_LARGE, PDH_HCOUNTER, PDH_HQUERY,
    PDH_MORE_DATA, PdhAddEnglishCounterW, PdhCloseQuery, PdhCollectQueryData,
    PdhGetFormattedCounterArrayW, PdhOpenQueryW,
};
use windows_sys::Win32::System::Threading::{
    GetProcessTimes, OpenProcess, PROCESS_QUERY_LIMITED_INFORMATION,
};

/// A listening TCP socket and the process that owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listener {
    /// Where it listens.
    pub local: SocketAddr,
    /// The owning process.
    pub pid: u32,
}

/// Every listening TCP socket, IPv4 and IPv6, with its owning process.
/// Windows reports every process's sockets to every account.
///
/// # Errors
///
/// The operating system's error when either table cannot be read.
pub fn listening_tcp() -> io::Result<Vec<Listener>> {
    let mut out = Vec::new();
    let v4 = tcp_table(AF_INET)?;
    for row in rows::<MIB_TCPROW_OWNER_PID>(&v4) {
        out.push(Listener {
            local: SocketAddr::new(
                IpAddr::V4(Ipv4Addr::from(row.dwLocalAddr.to_ne_bytes())),
                port(row.dwLocalPort),
            ),
            pid: row.dwOwningPid,
        });
    }
    let v6 = tcp_table(AF_INET6)?;
    for row in rows::<MIB_TCP6ROW_OWNER_PID>(&v6) {
        out.push(Listener {
            local: SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from(row.ucLocalAddr)),
                port(row.dwLocalPort),
            ),
            pid: row.dwOwningPid,
        });
    }
    Ok(out)
}

/// The port in a table row: network byte order in the low 16 bits.
fn port(dw: u32) -> u16 {
    u16::from_be(u16::try_from(dw & 0xFFFF).unwrap_or(0))
}

/// The raw listener table of one address family, in u64 units so that its
/// rows are aligned.
fn tcp_table(family: u16) -> io::Result<Vec<u64>> {
    let mut buffer: Vec<u64> = Vec::new();
    let mut size = 0u32;
    // The table may grow between the size query and the read: a few tries.
    for _ in 0..8 {
        let units = usize::try_from(size).unwrap_or(usize::MAX).div_ceil(8);
        buffer.resize(units.max(1), 0);
        let mut bytes = u32::try_from(buffer.len() * 8).unwrap_or(u32::MAX);
        // SAFETY: `buffer` is writable for `bytes` bytes and outlives the
        // call; `bytes` is a valid in/out pointer.
        let rc = unsafe {
            GetExtendedTcpTable(
                buffer.as_mut_ptr().cast(),
                &mut bytes,
                0,
                u32::from(family),
                TCP_TABLE_OWNER_PID_LISTENER,
                0,
            )
        };
        match rc {
            NO_ERROR => return Ok(buffer),
            ERROR_INSUFFICIENT_BUFFER => size = bytes,
            other => {
                return Err(io::Error::from_raw_os_error(
                    i32::try_from(other).unwrap_or(i32::MAX),
                ));
            }
        }
    }
    Err(io::Error::other(
        "the TCP table kept growing while it was read",
    ))
}

/// The rows of a `MIB_TCP*TABLE_OWNER_PID` in `buffer`: a `u32` count,
/// then the rows (4-byte aligned, right after the count).
fn rows<Row: Copy>(buffer: &[u64]) -> Vec<Row> {
    let bytes = buffer.len() * 8;
    let Some(&first) = buffer.first() else {
        return Vec::new();
    };
    // The count is the first u32 of the buffer (little-endian x86-64).
    let count = usize::try_from(first & 0xFFFF_FFFF).unwrap_or(0);
    let fits = (bytes.saturating_sub(4)) / size_of::<Row>();
    let count = count.min(fits);
    let base = buffer.as_ptr().cast::<u8>();
    (0..count)
        .map(|i| {
            // SAFETY: `4 + (i + 1) * size_of::<Row>() <= bytes` (count was
            // capped above), so the offset stays inside `buffer`.
            let at = unsafe { base.add(4 + i * size_of::<Row>()) };
            // SAFETY: the row lies inside `buffer`, was written by Windows
            // as a `Row` (plain integers), and is read unaligned.
            unsafe { at.cast::<Row>().read_unaligned() }
        })
        .collect()
}

/// One process in a snapshot of the process tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessEntry {
    /// Its ID.
    pub pid: u32,
    /// The ID of the process that started it (which may have ended since,
    /// and its ID been reused: compare start times).
    pub parent: u32,
}

/// Every process now, with its parent's ID.
///
/// # Errors
///
/// The operating system's error when the snapshot cannot be taken.
pub fn processes() -> io::Result<Vec<ProcessEntry>> {
    // SAFETY: plain flags; the returned handle is checked and closed below.
    let snapshot = unsafe { CreateToolhelp32Snapshot(TH32CS_SNAPPROCESS, 0) };
    if snapshot == INVALID_HANDLE_VALUE {
        return Err(io::Error::last_os_error());
    }
    let _close = Handle(snapshot);
    let mut entry = PROCESSENTRY32W {
        dwSize: u32::try_from(size_of::<PROCESSENTRY32W>()).unwrap_or(u32::MAX),
        ..Default::default()
    };
    let mut out = Vec::new();
    // SAFETY: `snapshot` is a valid snapshot handle; `entry` is writable
    // with `dwSize` set.
    let mut more = unsafe { Process32FirstW(snapshot, &mut entry) } != 0;
    while more {
        out.push(ProcessEntry {
            pid: entry.th32ProcessID,
            parent: entry.th32ParentProcessID,
        });
        // SAFETY: as for Process32FirstW.
        more = unsafe { Process32NextW(snapshot, &mut entry) } != 0;
    }
    Ok(out)
}

/// When process `pid` started, in 100 ns units since 1601; `None` when it
/// cannot be opened (ended, or protected).
pub fn started(pid: u32) -> Option<u64> {
    // SAFETY: plain arguments; the handle is checked and closed below.
    let process = unsafe { OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, 0, pid) };
    if process.is_null() {
        return None;
    }
    let _close = Handle(process);
    let zero = FILETIME {
        dwLowDateTime: 0,
        dwHighDateTime: 0,
    };
    let (mut created, mut exited, mut kernel, mut user) = (zero, zero, zero, zero);
    // SAFETY: `process` is open with query access; the four out-pointers are valid.
    let ok = unsafe { GetProcessTimes(process, &mut created, &mut exited, &mut kernel, &mut user) };
    (ok != 0).then(|| (u64::from(created.dwHighDateTime) << 32) | u64::from(created.dwLowDateTime))
}

/// A handle closed on drop.
struct Handle(HANDLE);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle was opened by this module and is closed once, here.
        unsafe { CloseHandle(self.0) };
    }
}

/// The counter whose instances are `pid_<PID>_luid_0x…_0x…_phys_<n>`: each
/// process's dedicated memory on each GPU, in bytes.
pub const DEDICATED_USAGE: &str = r"\GPU Process Memory(*)\Dedicated Usage";

/// Every instance of [`DEDICATED_USAGE`] with its value in bytes, as PDH
/// names it (the caller parses the PID and adapter out of the name).
///
/// # Errors
///
/// When the counter does not exist (Windows before 10 1709, or Wine) or
/// cannot be read: the PDH status in hex.
pub fn gpu_process_dedicated_memory() -> io::Result<Vec<(String, u64)>> {
    counter_values(DEDICATED_USAGE)
}

/// A PDH query closed on drop.
struct Query(PDH_HQUERY);

impl Drop for Query {
    fn drop(&mut self) {
        // SAFETY: the query was opened by `counter_values` and is closed once, here.
        unsafe { PdhCloseQuery(self.0) };
    }
}

fn pdh_error(call: &str, status: u32) -> io::Error {
    io::Error::other(format!("{call} failed: PDH status 0x{status:08X}"))
}

/// One collection of a raw (not rate) counter's every instance.
fn counter_values(path: &str) -> io::Result<Vec<(String, u64)>> {
    let mut query: PDH_HQUERY = null_mut();
    // SAFETY: a null data source means the live counters; `query` is a valid out-pointer.
    let rc = unsafe { PdhOpenQueryW(std::ptr::null(), 0, &mut query) };
    if rc != 0 {
        return Err(pdh_error("PdhOpenQueryW", rc));
    }
    let query = Query(query);
    let wide: Vec<u16> = path.encode_utf16().chain(std::iter::once(0)).collect();
    let mut counter: PDH_HCOUNTER = null_mut();
    // SAFETY: the query is open; `wide` is NUL-terminated and outlives the
    // call; `counter` is a valid out-pointer.
    let rc = unsafe { PdhAddEnglishCounterW(query.0, wide.as_ptr(), 0, &mut counter) };
    if rc != 0 {
        return Err(pdh_error("PdhAddEnglishCounterW", rc));
    }
    // SAFETY: the query is open and has a counter.
    let rc = unsafe { PdhCollectQueryData(query.0) };
    if rc != 0 {
        return Err(pdh_error("PdhCollectQueryData", rc));
    }
    let mut buffer: Vec<u64> = Vec::new();
    for _ in 0..8 {
        let mut bytes = u32::try_from(buffer.len() * 8).unwrap_or(u32::MAX);
        let mut count = 0u32;
        let items = if buffer.is_empty() {
            null_mut()
        } else {
            buffer.as_mut_ptr().cast::<PDH_FMT_COUNTERVALUE_ITEM_W>()
        };
        // SAFETY: `counter` belongs to the open query; `items` is null (a
        // size query) or writable for `bytes` bytes, 8-aligned as the items need.
        let rc = unsafe {
            PdhGetFormattedCounterArrayW(counter, PDH_FMT_LARGE, &mut bytes, &mut count, items)
        };
        if rc == PDH_MORE_DATA {
            buffer.resize(usize::try_from(bytes).unwrap_or(0).div_ceil(8).max(1), 0);
            continue;
        }
        if rc != 0 {
            return Err(pdh_error("PdhGetFormattedCounterArrayW", rc));
        }
        if buffer.is_empty() {
            return Ok(Vec::new());
        }
        let fits = buffer.len() * 8 / size_of::<PDH_FMT_COUNTERVALUE_ITEM_W>();
        let count = usize::try_from(count).unwrap_or(0).min(fits);
        // SAFETY: PDH wrote `count` items at the start of `buffer`, which
        // holds at least that many (capped above) and is aligned for them.
        let items = unsafe { std::slice::from_raw_parts(items.cast_const(), count) };
        return Ok(items
            .iter()
            .filter(|item| item.FmtValue.CStatus == PDH_CSTATUS_VALID_DATA)
            .map(|item| {
                // SAFETY: PDH_FMT_LARGE was asked for, so `largeValue` is the
                // union's initialised member.
                let value = unsafe { item.FmtValue.Anonymous.largeValue };
                // SAFETY: `szName` points to a NUL-terminated name inside `buffer`.
                let name = unsafe { wide_str(item.szName) };
                (name, u64::try_from(value).unwrap_or(0))
            })
            .collect());
    }
    Err(io::Error::other(
        "the GPU Process Memory counters kept growing while they were read",
    ))
}

/// A NUL-terminated UTF-16 string, copied.
///
/// # Safety
///
/// `ptr` must be null or point to a NUL-terminated UTF-16 string.
unsafe fn wide_str(ptr: *const u16) -> String {
    if ptr.is_null() {
        return String::new();
    }
    let mut len = 0;
    loop {
        // SAFETY: every index up to the terminator is inside the string.
        let unit = unsafe { ptr.add(len) };
        // SAFETY: `unit` is inside the string, per the above.
        if unsafe { *unit } == 0 {
            break;
        }
        len += 1;
    }
    // SAFETY: `len` units were just read from the string.
    String::from_utf16_lossy(unsafe { std::slice::from_raw_parts(ptr, len) })
}
