//! `vacancyd`: the reference daemon and CLI of vacancy, with the five
//! built-in adapter kinds.

use std::process::ExitCode;

/// jemalloc, with a background thread that returns freed memory to the
/// system: after a burst of connections closes, glibc's malloc (and
/// mimalloc) kept what it had used (issue 31 item 4; the numbers are in the
/// commit that chose it). Its options (larger slabs for connection buffers,
/// no thread cache for objects over 8 KiB) are built in from
/// `.cargo/config.toml`. Not on Windows, whose heap returns freed memory.
#[cfg(not(windows))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    vacancy_cli::Vacancyd::with_builtin_adapters().main()
}

#[cfg(all(test, unix))]
mod tests {
    /// The options `.cargo/config.toml` builds into jemalloc are in the
    /// binary: without them (a build outside this workspace's config), the
    /// memory a burst of connections leaves behind grows from about 1.2x to
    /// 1.4x what the daemon held before (`scripts/bench-proxy`, memory).
    #[test]
    fn jemalloc_is_built_with_the_daemons_options() {
        // Set for rustc too by the same `[env]` entry that builds jemalloc.
        let wanted = option_env!("JEMALLOC_SYS_WITH_MALLOC_CONF")
            .filter(|w| !w.is_empty())
            .unwrap_or("(JEMALLOC_SYS_WITH_MALLOC_CONF was not set at build time)");
        let conf = tikv_jemalloc_ctl::config::malloc_conf::read();
        assert!(
            conf.is_ok_and(|c| c.contains(wanted) && c.contains("background_thread:true")),
            "jemalloc's built-in options lack the daemon's: {wanted}"
        );
    }
}
