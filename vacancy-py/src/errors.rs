//! Rust errors as the Python exceptions of `vacancy._errors`.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyType};

use vacancy::config::ConfigErrors;
use vacancy::engine::{EngineError, Refusal, RefusalCode, SpecError};

/// Everything that can go wrong in a call, as plain Rust data: built while
/// the engine's mutex is held, turned into a Python exception after it is dropped.
#[derive(Debug)]
pub enum Error {
    /// The engine refused the work.
    Refused(Refusal),
    /// The engine refused the work only because the model observation was
    /// too old (RES-20): `details["observe_again"]` is true.
    Reobserve(Refusal),
    /// Only with an explicit `now=`: the post-job sample is awaited (ADM-06).
    Wait {
        until: f64,
        arrived_at: f64,
        resources: Vec<String>,
    },
    /// An engine error (unknown entry, held entry, ...).
    Engine(EngineError),
    /// A configuration that the engine cannot be built from.
    Spec(SpecError),
    /// Simulated and real time mixed, or a bad time value.
    Timeline(String),
    /// A string that is not a work entry ID.
    BadId(String),
}

impl From<EngineError> for Error {
    fn from(e: EngineError) -> Self {
        Error::Engine(e)
    }
}

static CLASSES: [PyOnceLock<Py<PyType>>; 11] = [const { PyOnceLock::new() }; 11];

const NAMES: [&str; 11] = [
    "VacancyError",
    "ConfigError",
    "Refused",
    "ResourceBusy",
    "WaitForSample",
    "UnknownEntry",
    "UnknownResource",
    "UnknownUpstream",
    "EntryHeld",
    "NotHeld",
    "TimelineError",
];

fn class<'py>(py: Python<'py>, name: &str) -> PyResult<&'py Bound<'py, PyType>> {
    let i = NAMES
        .iter()
        .position(|n| *n == name)
        .ok_or_else(|| PyRuntimeError::new_err(format!("vacancy: no exception class {name}")))?;
    CLASSES[i].import(py, "vacancy._errors", name)
}

fn raise(py: Python<'_>, name: &str, message: String, kwargs: Option<&Bound<'_, PyDict>>) -> PyErr {
    let made = class(py, name).and_then(|cls| cls.call((message,), kwargs));
    match made {
        Ok(exc) => PyErr::from_value(exc),
        Err(e) => e,
    }
}

fn refused(py: Python<'_>, r: &Refusal, observe_again: bool) -> PyResult<PyErr> {
    let kwargs = PyDict::new(py);
    kwargs.set_item("code", r.code.as_str())?;
    kwargs.set_item("http_status", r.code.http_status())?;
    kwargs.set_item("retry_after_s", r.retry_after().map(|d| d.as_secs()))?;
    kwargs.set_item("reason", &r.reason)?;
    let details = PyDict::new(py);
    details.set_item("resource", r.resource.as_deref())?;
    details.set_item("observe_again", observe_again)?;
    kwargs.set_item("details", details)?;
    let name = if r.code == RefusalCode::ResourceBusy {
        "ResourceBusy"
    } else {
        "Refused"
    };
    Ok(raise(py, name, r.to_string(), Some(&kwargs)))
}

/// Raise a `ConfigError` with one problem per configuration error.
pub fn config_error(py: Python<'_>, e: &ConfigErrors) -> PyResult<PyErr> {
    let problems = PyList::empty(py);
    for err in &e.errors {
        let p = PyDict::new(py);
        p.set_item("path", &err.path)?;
        p.set_item("line", err.line)?;
        p.set_item("message", &err.message)?;
        problems.append(p)?;
    }
    let kwargs = PyDict::new(py);
    kwargs.set_item("origin", &e.origin)?;
    kwargs.set_item("problems", problems)?;
    Ok(raise(py, "ConfigError", e.to_string(), Some(&kwargs)))
}

impl Error {
    /// The Python exception for this error.
    pub fn into_py(self, py: Python<'_>) -> PyErr {
        let made = match &self {
            Error::Refused(r) => refused(py, r, false),
            Error::Reobserve(r) => refused(py, r, true),
            Error::Wait {
                until,
                arrived_at,
                resources,
            } => (|| {
                let kwargs = PyDict::new(py);
                kwargs.set_item("until", until)?;
                kwargs.set_item("arrived_at", arrived_at)?;
                kwargs.set_item("resources", resources)?;
                Ok(raise(
                    py,
                    "WaitForSample",
                    format!(
                        "waiting for a capacity sample of {} after the last job (until t={until:.3} s)",
                        resources.join(", ")
                    ),
                    Some(&kwargs),
                ))
            })(),
            Error::Engine(e) => {
                let name = match e {
                    EngineError::UnknownEntry(_) => "UnknownEntry",
                    EngineError::UnknownResource(_) => "UnknownResource",
                    EngineError::UnknownUpstream(_) => "UnknownUpstream",
                    EngineError::EntryHeld(_) => "EntryHeld",
                    EngineError::NotHeld { .. } => "NotHeld",
                    _ => "VacancyError",
                };
                Ok(raise(py, name, e.to_string(), None))
            }
            Error::Spec(e) => config_error(
                py,
                &ConfigErrors {
                    origin: String::new(),
                    errors: vec![vacancy::config::ConfigError {
                        path: String::new(),
                        line: None,
                        message: e.to_string(),
                    }],
                },
            ),
            Error::Timeline(msg) => Ok(raise(py, "TimelineError", msg.clone(), None)),
            Error::BadId(id) => Ok(raise(
                py,
                "UnknownEntry",
                format!("{id:?} is not a work entry ID (a UUID, as Reservation.id gives)"),
                None,
            )),
        };
        match made {
            Ok(e) | Err(e) => e,
        }
    }
}

/// `Result` of a call, mapped to Python after the lock is dropped.
pub trait IntoPyResult<T> {
    /// Turn the error into its Python exception.
    fn py(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn py(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| e.into_py(py))
    }
}

/// Raise the `vacancy._errors` class named by [`SlotError::name`], carrying
/// `code`, `http_status`, `details` and `retry_after_s`.
pub fn slot_error(py: Python<'_>, e: &vacancy::slots::SlotError) -> PyErr {
    let made = (|| -> PyResult<PyErr> {
        let kwargs = PyDict::new(py);
        kwargs.set_item("code", e.code())?;
        kwargs.set_item("http_status", e.http_status())?;
        kwargs.set_item("details", crate::convert::json_to_py(py, &e.details())?)?;
        kwargs.set_item("retry_after_s", e.retry_after_s())?;
        let cls = py.import("vacancy._errors")?.getattr(e.name())?;
        Ok(PyErr::from_value(
            cls.call((e.to_string(),), Some(&kwargs))?,
        ))
    })();
    match made {
        Ok(e) | Err(e) => e,
    }
}

/// Raise `StateRecordCorrupt` or `StateRecordIOError`, naming the file.
pub fn state_record_error(py: Python<'_>, e: &vacancy::slots::StateRecordError) -> PyErr {
    use vacancy::slots::StateRecordError;
    let made = (|| -> PyResult<PyErr> {
        let kwargs = PyDict::new(py);
        kwargs.set_item("path", e.path().to_string_lossy().into_owned())?;
        let name = match e {
            StateRecordError::Corrupt { detail, .. } => {
                kwargs.set_item("detail", detail)?;
                "StateRecordCorrupt"
            }
            StateRecordError::Io { source, .. } => {
                kwargs.set_item("detail", source.to_string())?;
                "StateRecordIOError"
            }
            other => {
                kwargs.set_item("detail", other.to_string())?;
                "StateRecordIOError"
            }
        };
        let cls = py.import("vacancy._errors")?.getattr(name)?;
        Ok(PyErr::from_value(
            cls.call((e.to_string(),), Some(&kwargs))?,
        ))
    })();
    match made {
        Ok(e) | Err(e) => e,
    }
}
