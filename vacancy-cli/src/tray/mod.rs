//! `vacancyd tray`: the Windows owner's notification-area icon (issue 33,
//! SCOPE-17). It follows the local daemon's `/events` stream and shows the
//! daemon's own sign words (the console shows the same ones); its menu opens
//! the console, pauses or resumes lending with the owner's token (sealed for
//! the user with DPAPI), and quits. The view and the stream are portable and
//! tested on every build; the icon is Windows'.

// The icon is Windows'; elsewhere the portable parts run in their tests only.
#![cfg_attr(not(windows), allow(dead_code))]

#[cfg(windows)]
mod app;
#[cfg(windows)]
pub(crate) mod token;
pub(crate) mod view;
pub(crate) mod watch;

#[cfg(windows)]
pub(crate) use app::run;
