//! `vacancyd`: the reference daemon and CLI of vacancy, with the five
//! built-in adapter kinds.

use std::process::ExitCode;

/// jemalloc, with a background thread that returns freed memory to the
/// system: after a burst of connections closes, glibc's malloc (and
/// mimalloc) kept what it had used (issue 31 item 4; the numbers are in the
/// commit that chose it). Not on Windows, whose heap returns freed memory.
#[cfg(not(windows))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    vacancy_cli::Vacancyd::with_builtin_adapters().main()
}
