//! Python bindings of `vacancy`: the extension module `vacancy._vacancy`.
//!
//! The Python package (`python/vacancy/`) re-exports what is defined here and
//! defines the exception classes in `vacancy._errors`, which this module raises.
//! Every Rust error becomes a Python exception; nothing here panics on input.
//!
//! The engine is sans-IO and not thread-safe, so the `Engine` class keeps it in a mutex.
//! Rule kept throughout: **no Python code runs while the mutex is held** (a
//! thread holding the mutex never needs the GIL), so a thread blocked on the
//! mutex with the GIL cannot deadlock with the holder. Results are computed
//! under the lock as plain Rust values and turned into Python objects after it
//! is dropped.
//!
//! Log records: vacancy's `tracing` events (a sampler that fails, a presence
//! backend that cannot answer, GPU pressure) become `log` records (tracing's
//! `log` feature, since no tracing subscriber runs here), which `pyo3-log`
//! hands to Python's `logging` under the `vacancy` logger (`vacancy.proxy.sampling`,
//! ...). Handing one over runs Python code, so the rule above covers it: no
//! event is emitted while the mutex is held. A thread without the GIL (the
//! driver's) only queues its records for a forwarding thread
//! (`log_bridge`), so it never waits for the GIL.

mod borrowers;
mod convert;
mod core;
mod driver;
mod engine;
mod errors;
mod inner;
mod log_bridge;
mod slots;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _vacancy(m: &Bound<'_, PyModule>) -> PyResult<()> {
    install_logging(m.py())?;
    m.add_class::<engine::Config>()?;
    m.add_class::<engine::Engine>()?;
    m.add_class::<engine::Reservation>()?;
    m.add_class::<engine::AdmitTicket>()?;
    m.add_class::<driver::Driver>()?;
    m.add(
        "POST_JOB_SAMPLE_WAIT_S",
        vacancy::engine::POST_JOB_SAMPLE_WAIT.as_secs_f64(),
    )?;
    slots::register(m)?;
    Ok(())
}

/// Route vacancy's log records into Python's `logging`: only targets under
/// `vacancy` (a dependency's records stay out), debug and above, with the
/// Python loggers' levels read at each record (not cached), so
/// `logging.getLogger("vacancy").setLevel(...)` applies whenever it is called.
/// Another extension's logger installed first keeps its place.
fn install_logging(py: Python<'_>) -> PyResult<()> {
    let inner = pyo3_log::Logger::new(py, pyo3_log::Caching::Loggers)?
        .filter(log::LevelFilter::Off)
        .filter_target("vacancy".to_owned(), log::LevelFilter::Debug);
    let bridge = log_bridge::Bridge::new(inner, log::LevelFilter::Debug);
    let installed = log::set_boxed_logger(Box::new(bridge));
    if installed.is_ok() {
        log::set_max_level(log::LevelFilter::Debug);
    } else {
        // A `log` logger is process-wide; the first installed wins.
        py.import("warnings")?.call_method1(
            "warn",
            ("another extension installed a Rust log bridge first; vacancy's log records go to it",),
        )?;
    }
    Ok(())
}
