//! The service control dispatcher's entry point.
//!
//! `windows-service` wraps the service control manager safely except for
//! the entry point the dispatcher calls, which its macro defines with an
//! unsafe block; it is defined here, and calls the function [`dispatch`]
//! was given.

use std::ffi::OsString;
use std::sync::OnceLock;

/// The service's main function, called on the dispatcher's thread.
static MAIN: OnceLock<fn(Vec<OsString>)> = OnceLock::new();

windows_service::define_windows_service!(ffi_service_main, call_main);

fn call_main(arguments: Vec<OsString>) {
    if let Some(main) = MAIN.get() {
        main(arguments);
    }
}

/// Connect this process to the service control manager as service `name`
/// and run `main` when it starts the service; returns when the service has
/// stopped. Only the first `main` given in a process is used.
///
/// # Errors
///
/// `windows-service`'s error, e.g. when the process was not started by the
/// service control manager.
pub fn dispatch(name: &str, main: fn(Vec<OsString>)) -> windows_service::Result<()> {
    let _ = MAIN.set(main);
    windows_service::service_dispatcher::start(name, ffi_service_main)
}
