//! A notification-area ("tray") icon with a tooltip and a pop-up menu, for
//! `vacancyd tray` (issue 33, SCOPE-17).
//!
//! One hidden top-level window of class [`TRAY_CLASS`] owns the icon and
//! receives its clicks; the program's [`TrayApp`] says what to show and what
//! a menu choice does. Another thread asks for a new look with
//! [`Waker::wake`]. The window is top-level (not message-only) so that the
//! uninstaller can find every tray with `FindWindow` and close it.

use std::io;

use windows_sys::Win32::Foundation::{HWND, LPARAM, LRESULT, POINT, WPARAM};
use windows_sys::Win32::System::LibraryLoader::GetModuleHandleW;
use windows_sys::Win32::UI::Shell::{
    NIF_ICON, NIF_MESSAGE, NIF_TIP, NIM_ADD, NIM_DELETE, NIM_MODIFY, NOTIFYICONDATAW,
    Shell_NotifyIconW, ShellExecuteW,
};
use windows_sys::Win32::UI::WindowsAndMessaging::{
    AppendMenuW, CreateIcon, CreatePopupMenu, CreateWindowExW, DefWindowProcW, DestroyIcon,
    DestroyMenu, DestroyWindow, DispatchMessageW, GetCursorPos, GetMessageW, HICON, MF_GRAYED,
    MF_SEPARATOR, MF_STRING, MSG, PostMessageW, PostQuitMessage, RegisterClassW,
    RegisterWindowMessageW, SW_SHOWNORMAL, SetForegroundWindow, TPM_RETURNCMD, TPM_RIGHTBUTTON,
    TrackPopupMenu, TranslateMessage, WM_APP, WM_CLOSE, WM_CONTEXTMENU, WM_DESTROY, WM_LBUTTONUP,
    WM_NULL, WM_RBUTTONUP, WNDCLASSW,
};

use crate::wide;

/// The tray window's class name: what the uninstaller looks for.
pub const TRAY_CLASS: &str = "vacancyd-tray";

/// The icon's clicks.
const WM_TRAY: u32 = WM_APP + 1;
/// Another thread's request for a new look.
const WM_WAKE: u32 = WM_APP + 2;

/// What the icon shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrayLook {
    /// The dot's colour, red, green, blue.
    pub color: [u8; 3],
    /// The tooltip; cut to the 127 characters Windows shows.
    pub tooltip: String,
}

/// One line of the pop-up menu.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MenuItem {
    /// A line of text that cannot be chosen (the sign's words).
    Text(String),
    /// A line that can be chosen, and the id [`TrayApp::chosen`] gets.
    Action {
        /// Passed to [`TrayApp::chosen`]; not 0.
        id: u32,
        /// The words; "&" before a letter makes it the item's key.
        label: String,
        /// Greyed out when false.
        enabled: bool,
    },
    /// A rule between groups.
    Separator,
}

/// The program behind the icon. Called on the tray's own thread.
pub trait TrayApp {
    /// What to show now.
    fn look(&mut self) -> TrayLook;
    /// The menu for a click on the icon.
    fn menu(&mut self) -> Vec<MenuItem>;
    /// The item `id` was chosen; `false` ends the tray.
    fn chosen(&mut self, id: u32) -> bool;
}

/// Asks the tray for a new look, or to end, from any thread.
#[derive(Debug, Clone, Copy)]
pub struct Waker {
    hwnd: usize,
}

impl Waker {
    /// Show [`TrayApp::look`] again. False once the tray has ended.
    pub fn wake(&self) -> bool {
        // SAFETY: PostMessageW takes any window handle; for a destroyed
        // window it fails and returns 0.
        unsafe { PostMessageW(self.hwnd as HWND, WM_WAKE, 0, 0) != 0 }
    }

    /// End the tray: its icon is removed and [`run`] returns.
    pub fn quit(&self) {
        // SAFETY: as in `wake`.
        unsafe { PostMessageW(self.hwnd as HWND, WM_CLOSE, 0, 0) };
    }
}

struct State {
    app: Box<dyn TrayApp>,
    hwnd: HWND,
    icon: HICON,
    color: [u8; 3],
    taskbar_created: u32,
}

// The initializer is const already; clippy 1.96 still asks for it under -Zbuild-std.
#[allow(clippy::missing_const_for_thread_local)]
mod state {
    thread_local! {
        pub(super) static STATE: std::cell::RefCell<Option<super::State>> =
            const { std::cell::RefCell::new(None) };
    }
}
use state::STATE;

/// Show the icon and run the window's message loop until the tray ends.
/// `started` gets the [`Waker`] before the loop starts (to start the thread
/// that watches the daemon).
///
/// # Errors
///
/// When the window or the icon cannot be created.
pub fn run(app: Box<dyn TrayApp>, started: impl FnOnce(Waker)) -> io::Result<()> {
    let class = wide(TRAY_CLASS.as_ref());
    // SAFETY: a null name asks for this program's own module handle.
    let instance = unsafe { GetModuleHandleW(std::ptr::null()) };
    let wc = WNDCLASSW {
        lpfnWndProc: Some(window_proc),
        hInstance: instance,
        lpszClassName: class.as_ptr(),
        ..Default::default()
    };
    // SAFETY: `wc` is valid and its class name outlives the class's use
    // (`class` lives until this function returns, after the loop).
    if unsafe { RegisterClassW(&wc) } == 0 {
        return Err(io::Error::last_os_error());
    }
    let title = wide("vacancyd".as_ref());
    // SAFETY: the class was registered above; the strings are NUL-terminated
    // and live through the call. The window is never shown.
    let hwnd = unsafe {
        CreateWindowExW(
            0,
            class.as_ptr(),
            title.as_ptr(),
            0,
            0,
            0,
            0,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            instance,
            std::ptr::null(),
        )
    };
    if hwnd.is_null() {
        return Err(io::Error::last_os_error());
    }
    let explorer = wide("TaskbarCreated".as_ref());
    // SAFETY: a NUL-terminated string that lives through the call.
    let taskbar_created = unsafe { RegisterWindowMessageW(explorer.as_ptr()) };
    STATE.with(|s| {
        *s.borrow_mut() = Some(State {
            app,
            hwnd,
            icon: std::ptr::null_mut(),
            color: [0, 0, 0],
            taskbar_created,
        });
    });
    started(Waker {
        hwnd: hwnd as usize,
    });
    if let Err(e) = show(NIM_ADD) {
        // SAFETY: `hwnd` is this thread's window.
        unsafe { DestroyWindow(hwnd) };
        return Err(e);
    }
    let mut msg = MSG::default();
    loop {
        // SAFETY: `msg` is a valid, writable MSG.
        let got = unsafe { GetMessageW(&mut msg, std::ptr::null_mut(), 0, 0) };
        if got == 0 || got == -1 {
            break;
        }
        // SAFETY: `msg` came from GetMessageW.
        unsafe { TranslateMessage(&msg) };
        // SAFETY: as above.
        unsafe { DispatchMessageW(&msg) };
    }
    STATE.with(|s| {
        if let Some(state) = s.borrow_mut().take()
            && !state.icon.is_null()
        {
            // SAFETY: the icon was created by `dot` and is no longer shown.
            unsafe { DestroyIcon(state.icon) };
        }
    });
    Ok(())
}

/// Add or modify the icon with the app's look now.
fn show(message: u32) -> io::Result<()> {
    // The state's borrow ends before the shell is called: the call may
    // deliver messages sent to this window meanwhile.
    let data = STATE.with(|s| -> io::Result<Option<NOTIFYICONDATAW>> {
        let Ok(mut guard) = s.try_borrow_mut() else {
            return Ok(None);
        };
        let Some(state) = guard.as_mut() else {
            return Ok(None);
        };
        let look = state.app.look();
        if state.icon.is_null() || look.color != state.color {
            let icon = dot(look.color)?;
            if !state.icon.is_null() {
                // SAFETY: the old icon was created by `dot`; the shell keeps
                // its own copy of the icon it shows.
                unsafe { DestroyIcon(state.icon) };
            }
            state.icon = icon;
            state.color = look.color;
        }
        let mut data = NOTIFYICONDATAW {
            cbSize: size_of::<NOTIFYICONDATAW>() as u32,
            hWnd: state.hwnd,
            uID: 1,
            uFlags: NIF_ICON | NIF_MESSAGE | NIF_TIP,
            uCallbackMessage: WM_TRAY,
            hIcon: state.icon,
            ..Default::default()
        };
        let tip: Vec<u16> = look.tooltip.encode_utf16().take(127).collect();
        data.szTip[..tip.len()].copy_from_slice(&tip);
        Ok(Some(data))
    })?;
    let Some(data) = data else {
        return Ok(());
    };
    // SAFETY: `data` is a valid NOTIFYICONDATAW for this thread's window.
    if unsafe { Shell_NotifyIconW(message, &data) } == 0 {
        return Err(io::Error::other("the shell refused the notification icon"));
    }
    Ok(())
}

fn remove_icon(hwnd: HWND) {
    let data = NOTIFYICONDATAW {
        cbSize: size_of::<NOTIFYICONDATAW>() as u32,
        hWnd: hwnd,
        uID: 1,
        ..Default::default()
    };
    // SAFETY: `data` names this window's icon; deleting a missing one fails harmlessly.
    unsafe { Shell_NotifyIconW(NIM_DELETE, &data) };
}

/// A 16×16 round dot of `color` with a darker rim, transparent around it.
fn dot(color: [u8; 3]) -> io::Result<HICON> {
    const SIZE: usize = 16;
    let mut mask = [0xffu8; SIZE * 2]; // 1 bit a pixel, rows of two bytes: 1 = transparent
    let mut pixels = [0u8; SIZE * SIZE * 4]; // BGRA
    let rim = color.map(|c| c / 2);
    for y in 0..SIZE {
        for x in 0..SIZE {
            let (dx, dy) = (x as f32 - 7.5, y as f32 - 7.5);
            let r = (dx * dx + dy * dy).sqrt();
            if r > 7.5 {
                continue;
            }
            let c = if r > 6.0 { rim } else { color };
            let i = (y * SIZE + x) * 4;
            pixels[i..i + 4].copy_from_slice(&[c[2], c[1], c[0], 0xff]);
            mask[y * 2 + x / 8] &= !(0x80 >> (x % 8));
        }
    }
    // SAFETY: a null name asks for this program's own module handle.
    let instance = unsafe { GetModuleHandleW(std::ptr::null()) };
    // SAFETY: `mask` holds 16 rows of 16 bits and `pixels` 16×16 32-bit
    // pixels, as the width, height and depth say; both outlive the call.
    let icon = unsafe {
        CreateIcon(
            instance,
            SIZE as i32,
            SIZE as i32,
            1,
            32,
            mask.as_ptr(),
            pixels.as_ptr(),
        )
    };
    if icon.is_null() {
        return Err(io::Error::last_os_error());
    }
    Ok(icon)
}

/// Open `url` in the user's browser.
///
/// # Errors
///
/// When the shell cannot open it.
pub fn open_url(url: &str) -> io::Result<()> {
    let verb = wide("open".as_ref());
    let file = wide(url.as_ref());
    // SAFETY: NUL-terminated strings that live through the call; the other
    // pointers may be null.
    let code = unsafe {
        ShellExecuteW(
            std::ptr::null_mut(),
            verb.as_ptr(),
            file.as_ptr(),
            std::ptr::null(),
            std::ptr::null(),
            SW_SHOWNORMAL,
        )
    };
    // ShellExecuteW returns a value above 32 on success.
    if code as usize <= 32 {
        return Err(io::Error::other(format!(
            "the shell could not open {url} (code {})",
            code as usize
        )));
    }
    Ok(())
}

/// The menu at the cursor; the chosen item's id, 0 for none.
fn pop_up(hwnd: HWND, items: &[MenuItem]) -> u32 {
    // SAFETY: no arguments; a null handle is checked.
    let menu = unsafe { CreatePopupMenu() };
    if menu.is_null() {
        return 0;
    }
    for item in items {
        let (flags, id, label) = match item {
            // "&" would underline the next letter: the words are shown as they are.
            MenuItem::Text(text) => (MF_STRING | MF_GRAYED, 0, text.replace('&', "&&")),
            MenuItem::Action { id, label, enabled } => (
                if *enabled {
                    MF_STRING
                } else {
                    MF_STRING | MF_GRAYED
                },
                *id as usize,
                label.clone(),
            ),
            MenuItem::Separator => (MF_SEPARATOR, 0, String::new()),
        };
        let label = wide(label.as_str().as_ref());
        // SAFETY: `menu` was created above; `label` is NUL-terminated and the
        // menu copies it.
        unsafe { AppendMenuW(menu, flags, id, label.as_ptr()) };
    }
    let mut at = POINT { x: 0, y: 0 };
    // SAFETY: `at` is a valid, writable POINT.
    unsafe { GetCursorPos(&mut at) };
    // SAFETY: the menu closes when the user clicks elsewhere only while its
    // window is in the foreground (the documented pattern for tray menus).
    unsafe { SetForegroundWindow(hwnd) };
    // SAFETY: `menu` and `hwnd` are valid; TPM_RETURNCMD returns the id
    // instead of posting WM_COMMAND.
    let chosen = unsafe {
        TrackPopupMenu(
            menu,
            TPM_RETURNCMD | TPM_RIGHTBUTTON,
            at.x,
            at.y,
            0,
            hwnd,
            std::ptr::null(),
        )
    };
    // SAFETY: as documented with TrackPopupMenu, so that the next click works.
    unsafe { PostMessageW(hwnd, WM_NULL, 0, 0) };
    // SAFETY: `menu` was created above and is not shown any more.
    unsafe { DestroyMenu(menu) };
    chosen.max(0) as u32
}

extern "system" fn window_proc(hwnd: HWND, msg: u32, wparam: WPARAM, lparam: LPARAM) -> LRESULT {
    match msg {
        WM_WAKE => {
            let _ = show(NIM_MODIFY);
            0
        }
        WM_TRAY => {
            let mouse = (lparam as u32) & 0xffff;
            if mouse == WM_RBUTTONUP || mouse == WM_LBUTTONUP || mouse == WM_CONTEXTMENU {
                // The borrow ends before the menu's own message loop runs,
                // which may deliver WM_WAKE to this procedure meanwhile.
                let items = STATE.with(|s| {
                    s.try_borrow_mut()
                        .ok()
                        .and_then(|mut st| st.as_mut().map(|st| st.app.menu()))
                });
                let chosen = pop_up(hwnd, &items.unwrap_or_default());
                if chosen != 0 {
                    let go_on = STATE.with(|s| {
                        s.try_borrow_mut()
                            .ok()
                            .and_then(|mut st| st.as_mut().map(|st| st.app.chosen(chosen)))
                            .unwrap_or(true)
                    });
                    if !go_on {
                        // SAFETY: this thread's window.
                        unsafe { DestroyWindow(hwnd) };
                    }
                }
            }
            0
        }
        WM_CLOSE => {
            // SAFETY: this thread's window.
            unsafe { DestroyWindow(hwnd) };
            0
        }
        WM_DESTROY => {
            remove_icon(hwnd);
            // SAFETY: ends this thread's message loop.
            unsafe { PostQuitMessage(0) };
            0
        }
        _ => {
            let restarted = STATE.with(|s| {
                s.try_borrow()
                    .ok()
                    .and_then(|st| st.as_ref().map(|st| st.taskbar_created))
            });
            if restarted == Some(msg) && msg != 0 {
                // Explorer restarted: its notification area forgot the icon.
                let _ = show(NIM_ADD);
                return 0;
            }
            // SAFETY: the default procedure for this thread's window.
            unsafe { DefWindowProcW(hwnd, msg, wparam, lparam) }
        }
    }
}
