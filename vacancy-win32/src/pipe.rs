//! Named pipes with a DACL of the caller's choosing.

use std::io;

use tokio::net::windows::named_pipe::{NamedPipeServer, ServerOptions};

use crate::descriptor::LocalDescriptor;

/// Create one instance of the named pipe `name` (`\\.\pipe\...`) for a
/// server, with the security descriptor `sddl` from creation, refusing
/// clients on other machines. `first` asks that the pipe not exist yet, so
/// no other process can have created it (and chosen its DACL) first.
///
/// # Errors
///
/// An SDDL string Windows does not accept, or the operating system's error
/// (access denied when `first` and another process holds the name).
pub fn create_server(name: &str, sddl: &str, first: bool) -> io::Result<NamedPipeServer> {
    let sd = LocalDescriptor::from_sddl(sddl)?;
    let mut attributes = sd.attributes();
    let mut options = ServerOptions::new();
    options
        .first_pipe_instance(first)
        .reject_remote_clients(true);
    // SAFETY: `attributes` is a valid SECURITY_ATTRIBUTES whose descriptor
    // (`sd`) outlives the call; Windows copies the descriptor into the pipe.
    unsafe { options.create_with_security_attributes_raw(name, (&raw mut attributes).cast()) }
}
