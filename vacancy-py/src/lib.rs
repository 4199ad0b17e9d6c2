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

mod convert;
mod core;
mod driver;
mod engine;
mod errors;
mod inner;
mod slots;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _vacancy(m: &Bound<'_, PyModule>) -> PyResult<()> {
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
