//! What a unit test needs from the machine, checked one way everywhere.
//!
//! A missing prerequisite fails the test with its reason and how to get it; a
//! test never returns early and counts as a pass without having checked
//! anything. `scripts/test` installs the Debian packages (util-linux for
//! `setpriv`), and CI runs the suite as root, as `.ci/run` is run.

#![allow(clippy::panic)]

use std::path::Path;

/// Fails the test unless it runs as root: `why` says what needs it.
pub(crate) fn require_root(why: &str) {
    let uid = rustix::process::geteuid().as_raw();
    assert!(
        uid == 0,
        "prerequisite missing: {why} needs root, and this test runs as uid {uid}; \
         run the suite as root (CI does: `sudo bash scripts/test`)"
    );
}

/// The path of `setpriv` (util-linux), or a failed test saying how to get it.
pub(crate) fn setpriv() -> &'static Path {
    ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "prerequisite missing: setpriv (Debian package util-linux) runs a process as \
                 another account; `scripts/test` installs it (apt-get install util-linux)"
            )
        })
}

/// A listener on the IPv6 loopback `[::1]`, or a failed test saying why.
pub(crate) fn ipv6_loopback_listener() -> std::net::TcpListener {
    std::net::TcpListener::bind("[::1]:0").unwrap_or_else(|e| {
        panic!(
            "prerequisite missing: no IPv6 loopback on this machine ({e}); enable it with \
             `sysctl -w net.ipv6.conf.lo.disable_ipv6=0`"
        )
    })
}

/// The NVIDIA device nodes (`/dev/nvidia*`) of this machine: where there is
/// one, NVML must work, so an NVML error fails the test.
#[cfg_attr(not(feature = "nvml"), allow(dead_code))]
pub(crate) fn nvidia_device_nodes() -> Vec<String> {
    let mut nodes: Vec<String> = std::fs::read_dir("/dev")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with("nvidia"))
                .map(|name| format!("/dev/{name}"))
                .collect()
        })
        .unwrap_or_default();
    nodes.sort();
    nodes
}

/// A loopback port that refuses connections while the returned socket lives:
/// bound, never listened on, so no other test's bind to port 0 is given it
/// (the port of a dropped listener may be, and then something answers).
pub(crate) fn refusing_port() -> (tokio::net::TcpSocket, std::net::SocketAddr) {
    let bound = tokio::net::TcpSocket::new_v4()
        .and_then(|s| s.bind(([127, 0, 0, 1], 0).into()).map(|()| s))
        .and_then(|s| s.local_addr().map(|addr| (s, addr)));
    bound.unwrap_or_else(|e| panic!("cannot bind a loopback port: {e}"))
}
