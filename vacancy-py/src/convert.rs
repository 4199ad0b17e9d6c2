//! Plain Rust values into plain Python objects.

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::Value;

/// A JSON value as Python `dict`/`list`/`str`/`int`/`float`/`bool`/`None`.
pub fn json_to_py(py: Python<'_>, v: &Value) -> PyResult<Py<PyAny>> {
    Ok(match v {
        Value::Null => py.None(),
        Value::Bool(b) => b.into_py_any(py)?,
        Value::Number(n) => {
            if let Some(i) = n.as_u64() {
                i.into_py_any(py)?
            } else if let Some(i) = n.as_i64() {
                i.into_py_any(py)?
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_py_any(py)?
            }
        }
        Value::String(s) => s.into_py_any(py)?,
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(json_to_py(py, item)?)?;
            }
            list.into_any().unbind()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, item) in map {
                dict.set_item(k, json_to_py(py, item)?)?;
            }
            dict.into_any().unbind()
        }
    })
}
