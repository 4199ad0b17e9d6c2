//! `vacancy::slots` and `vacancy::gate` for the Python layer `vacancy.slots`.
//!
//! These functions take and give plain Python data (str, int, dict, list,
//! tuple); `python/vacancy/slots.py` turns them into the idiomatic surface
//! (`SlotState` as a `StrEnum`, frozensets, dataclasses). Rust errors become
//! the `vacancy._errors` classes; nothing here panics on input, and no Python
//! code runs while a Rust lock is held.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use vacancy::gate::{self, GateOptions, GateOutcome, Lane, Probe};
use vacancy::slots::{self as s, SlotState};

use crate::convert::{json_to_py, py_to_json};
use crate::errors::{slot_error, state_record_error};

/// How often a running gate wakes up to let Python handle signals (Ctrl-C).
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

fn state(name: &str) -> PyResult<SlotState> {
    name.parse::<SlotState>().map_err(|e| {
        PyValueError::new_err(format!(
            "{e}: one of {}",
            SlotState::ALL.map(SlotState::as_str).join(", ")
        ))
    })
}

fn slot<T>(py: Python<'_>, r: Result<T, s::SlotError>) -> PyResult<T> {
    r.map_err(|e| slot_error(py, &e))
}

// ---- states --------------------------------------------------------------

/// Raise `IllegalSlotTransition` unless `from_state -> to_state` is legal (SLOT-01).
#[pyfunction]
pub fn check_transition(py: Python<'_>, from_state: &str, to_state: &str) -> PyResult<()> {
    let (from, to) = (state(from_state)?, state(to_state)?);
    slot(py, s::check_transition(from, to))
}

/// The selection rank of a state string; unknown strings rank with `error` (SLOT-15).
#[pyfunction]
pub fn selection_rank(state: &str) -> u8 {
    s::selection_rank(state)
}

/// The state a health outcome leads to.
#[pyfunction]
pub fn state_after_health(outcome: &str) -> PyResult<&'static str> {
    use s::HealthOutcome::*;
    let o = match outcome {
        "ready" => Ready,
        "empty_models" => EmptyModels,
        "not_ready" => NotReady,
        "unresolved" => Unresolved,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown health outcome {other:?}: ready, empty_models, not_ready or unresolved"
            )));
        }
    };
    Ok(s::state_after_health(o).as_str())
}

/// The state a unit exit leads to.
#[pyfunction]
pub fn state_after_exit(exit: &str) -> PyResult<&'static str> {
    let e = match exit {
        "clean_stop" => s::UnitExit::CleanStop,
        "crashed" => s::UnitExit::Crashed,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown unit exit {other:?}: clean_stop or crashed"
            )));
        }
    };
    Ok(s::state_after_exit(e).as_str())
}

// ---- breaker ---------------------------------------------------------------

/// The cooldown after `failures` consecutive failures, in seconds (BRK).
#[pyfunction]
pub fn cooldown_s(failures: u32) -> f64 {
    s::cooldown_s(failures)
}

fn snapshot_dict<'py>(py: Python<'py>, snap: &s::BreakerSnapshot) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("state", snap.state.as_str())?;
    d.set_item("failures", snap.failures)?;
    d.set_item("retry_after_s", snap.retry_after_s)?;
    d.set_item("trial_in_flight", snap.trial_in_flight)?;
    Ok(d)
}

/// The per-slot crash-loop breaker; time comes from `clock` (default
/// `time.monotonic`), read before the breaker's lock is taken.
#[pyclass(frozen, module = "vacancy._vacancy")]
pub struct CrashLoopBreaker {
    inner: Mutex<s::CrashLoopBreaker>,
    clock: Py<PyAny>,
}

impl CrashLoopBreaker {
    fn lock(&self) -> MutexGuard<'_, s::CrashLoopBreaker> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `now` if given, else the clock's reading; called with no lock held.
    fn now(&self, py: Python<'_>, now: Option<f64>) -> PyResult<f64> {
        let t = match now {
            Some(t) => t,
            None => self.clock.bind(py).call0()?.extract::<f64>()?,
        };
        if t.is_finite() {
            Ok(t)
        } else {
            Err(PyValueError::new_err(format!(
                "the breaker's clock gave {t}, not a finite number of seconds"
            )))
        }
    }
}

#[pymethods]
impl CrashLoopBreaker {
    #[new]
    #[pyo3(signature = (clock = None, *, trial_budget_s = s::breaker::DEFAULT_TRIAL_BUDGET_S))]
    fn new(py: Python<'_>, clock: Option<Py<PyAny>>, trial_budget_s: f64) -> PyResult<Self> {
        if !trial_budget_s.is_finite() || trial_budget_s < 0.0 {
            return Err(PyValueError::new_err(format!(
                "trial_budget_s must be a finite, non-negative number of seconds (a load's lifecycle budget), not {trial_budget_s}"
            )));
        }
        let clock = match clock {
            Some(c) => {
                if !c.bind(py).is_callable() {
                    return Err(PyTypeError::new_err(
                        "clock must be a callable returning seconds as a float",
                    ));
                }
                c
            }
            None => py.import("time")?.getattr("monotonic")?.unbind(),
        };
        Ok(CrashLoopBreaker {
            // The Rust clock is never read: every call passes the time.
            inner: Mutex::new(s::CrashLoopBreaker::new(|| 0.0).with_trial_budget(trial_budget_s)),
            clock,
        })
    }

    /// The clock this breaker reads.
    #[getter]
    fn clock(&self, py: Python<'_>) -> Py<PyAny> {
        self.clock.clone_ref(py)
    }

    /// Raise `SlotCrashLooping` while `key` is cooling down; in half-open,
    /// admit one trial (BRK).
    #[pyo3(signature = (key, *, now = None))]
    fn check(&self, py: Python<'_>, key: &str, now: Option<f64>) -> PyResult<()> {
        let now = self.now(py, now)?;
        let r = self.lock().check_at(key, now);
        slot(py, r)
    }

    /// Record a failed start of `key`; returns the snapshot after it.
    #[pyo3(signature = (key, *, now = None))]
    fn record_failure<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        now: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let now = self.now(py, now)?;
        let snap = self.lock().record_failure_at(key, now);
        snapshot_dict(py, &snap)
    }

    /// Seconds a half-open trial may stay out unrecorded before it expires.
    #[getter]
    fn trial_budget_s(&self) -> f64 {
        self.lock().trial_budget_s()
    }

    /// Give back the half-open trial a passing `check` took: the load did not run.
    fn give_back_trial(&self, key: &str) {
        self.lock().give_back_trial(key);
    }

    /// A successful start closes the breaker of `key`.
    fn record_success(&self, key: &str) {
        self.lock().record_success(key);
    }

    /// Forget `key` (an operator reset).
    fn reset(&self, key: &str) {
        self.lock().reset(key);
    }

    /// Seed `key` from persisted state (`failures` 0 closes it).
    fn seed(&self, key: &str, failures: u32, last_failure_s: f64) -> PyResult<()> {
        if !last_failure_s.is_finite() {
            return Err(PyValueError::new_err("last_failure_s must be finite"));
        }
        self.lock().seed(
            key,
            s::BreakerSeed {
                failures,
                last_failure_s,
            },
        );
        Ok(())
    }

    /// `(failures, last_failure_s)` to persist, or `None` while closed.
    fn seed_of(&self, key: &str) -> Option<(u32, f64)> {
        self.lock()
            .seed_of(key)
            .map(|b| (b.failures, b.last_failure_s))
    }

    /// Consecutive failures of `key`.
    fn failures(&self, key: &str) -> u32 {
        self.lock().failures(key)
    }

    /// `closed`, `backoff`, `parked` or `half-open`.
    #[pyo3(signature = (key, *, now = None))]
    fn state(&self, py: Python<'_>, key: &str, now: Option<f64>) -> PyResult<&'static str> {
        let now = self.now(py, now)?;
        Ok(self.lock().state_at(key, now).as_str())
    }

    /// The `metadata.breaker` dict of `key`, or `None` while closed.
    #[pyo3(signature = (key, *, now = None))]
    fn snapshot<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        now: Option<f64>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let now = self.now(py, now)?;
        let snap = self.lock().snapshot_at(key, now);
        snap.map(|snap| snapshot_dict(py, &snap)).transpose()
    }

    /// Set (or remove, while closed) `metadata["breaker"]`.
    #[pyo3(signature = (key, metadata, *, now = None))]
    fn stamp_metadata(
        &self,
        py: Python<'_>,
        key: &str,
        metadata: &Bound<'_, PyDict>,
        now: Option<f64>,
    ) -> PyResult<()> {
        let now = self.now(py, now)?;
        let snap = self.lock().snapshot_at(key, now);
        match snap {
            Some(snap) => metadata.set_item(s::breaker::METADATA_KEY, snapshot_dict(py, &snap)?),
            None => {
                if metadata.contains(s::breaker::METADATA_KEY)? {
                    metadata.del_item(s::breaker::METADATA_KEY)?;
                }
                Ok(())
            }
        }
    }
}

// ---- eviction ----------------------------------------------------------------

fn get<'py, T: FromPyObjectOwned<'py>>(
    d: &Bound<'py, PyDict>,
    key: &str,
    default: Option<T>,
) -> PyResult<T> {
    match d.get_item(key)? {
        Some(v) if !v.is_none() => v.extract::<T>().map_err(|e| {
            let e: PyErr = e.into();
            PyTypeError::new_err(format!("{key}: {e}"))
        }),
        _ => default.ok_or_else(|| PyTypeError::new_err(format!("missing {key:?}"))),
    }
}

fn candidate(d: &Bound<'_, PyDict>) -> PyResult<s::EvictionCandidate> {
    let pinned = match d.get_item("pinned")? {
        Some(v) if !v.is_none() => Some(v.extract::<bool>()?),
        _ => None,
    };
    Ok(s::EvictionCandidate {
        name: get(d, "name", None)?,
        state: state(&get::<String>(d, "state", None)?)?,
        priority: get(d, "priority", Some(i64::from(s::DEFAULT_PRIORITY)))?,
        pinned,
        in_flight: get(d, "in_flight", Some(0))?,
        last_used_s: get(d, "last_used_s", Some(0.0))?,
        resident_mib: get(d, "resident_mib", Some(0))?,
    })
}

fn candidates(list: &Bound<'_, PyList>) -> PyResult<Vec<s::EvictionCandidate>> {
    list.iter()
        .map(|item| candidate(item.cast::<PyDict>()?))
        .collect()
}

fn anchors(a: &[String]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

/// Whether a slot is pinned: its own `pinned`, else whether it is an anchor.
#[pyfunction]
pub fn is_pinned(name: &str, pinned: Option<bool>, anchors: Vec<String>) -> bool {
    s::is_pinned(name, pinned, &self::anchors(&anchors))
}

/// Whether a candidate dict may be evicted (EVICT).
#[pyfunction]
pub fn is_eviction_candidate(
    candidate: &Bound<'_, PyDict>,
    anchors: Vec<String>,
) -> PyResult<bool> {
    Ok(s::is_eviction_candidate(
        &self::candidate(candidate)?,
        &self::anchors(&anchors),
    ))
}

/// Indices into `candidates` of the eviction victims, first victim first.
#[pyfunction]
pub fn eviction_order(
    candidates: &Bound<'_, PyList>,
    anchors: Vec<String>,
) -> PyResult<Vec<usize>> {
    let slots = self::candidates(candidates)?;
    let order = s::eviction_order(&slots, &self::anchors(&anchors));
    Ok(order
        .into_iter()
        .filter_map(|v| slots.iter().position(|c| std::ptr::eq(c, v)))
        .collect())
}

/// The pre-load eviction plan: `(victims, freed_mib, fits)`.
#[pyfunction]
pub fn plan_preload_eviction(
    candidates: &Bound<'_, PyList>,
    anchors: Vec<String>,
    need_mib: u64,
    headroom_mib: u64,
    free_mib: u64,
    max_victims: usize,
) -> PyResult<(Vec<String>, u64, bool)> {
    let slots = self::candidates(candidates)?;
    let plan = s::plan_preload_eviction(
        &slots,
        &self::anchors(&anchors),
        s::PreloadNeed {
            need_mib,
            headroom_mib,
            free_mib,
            max_victims,
        },
    );
    Ok((plan.victims, plan.freed_mib, plan.fits))
}

/// Raise `SlotPinned` if a pinned slot is unloaded or deleted without force.
#[pyfunction]
pub fn check_pinned(
    py: Python<'_>,
    name: &str,
    pinned: Option<bool>,
    anchors: Vec<String>,
    action: &str,
    force: bool,
) -> PyResult<()> {
    let action = match action {
        "unload" => s::PinnedAction::Unload,
        "delete" => s::PinnedAction::Delete,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown action {other:?}: unload or delete"
            )));
        }
    };
    slot(
        py,
        s::check_pinned(name, pinned, &self::anchors(&anchors), action, force),
    )
}

fn placement(d: &Bound<'_, PyDict>) -> PyResult<s::SlotPlacement> {
    Ok(s::SlotPlacement {
        name: get(d, "name", None)?,
        device: get(d, "device", Some(String::new()))?,
        kind: get(d, "type", Some(String::new()))?,
        model_default: get(d, "model_default", Some(String::new()))?,
    })
}

/// Raise `NpuExclusivityViolation` for a second NPU LLM slot with a bound model.
#[pyfunction]
pub fn check_npu_exclusivity(
    py: Python<'_>,
    target: &Bound<'_, PyDict>,
    others: &Bound<'_, PyList>,
) -> PyResult<()> {
    let target = placement(target)?;
    let others = others
        .iter()
        .map(|o| placement(o.cast::<PyDict>()?))
        .collect::<PyResult<Vec<_>>>()?;
    slot(py, s::check_npu_exclusivity(&target, &others))
}

/// Raise `SlotConfigError` naming the key path of a retired `lru` key.
#[pyfunction]
pub fn reject_retired_lru(py: Python<'_>, slot_file: &Bound<'_, PyAny>) -> PyResult<()> {
    let v = py_to_json(slot_file)?;
    slot(py, s::reject_retired_lru(&v))
}

/// A priority value clamped to 0..=100 (50 when not a number).
#[pyfunction]
pub fn priority_from_value(value: &Bound<'_, PyAny>) -> PyResult<u8> {
    let v = py_to_json(value)?;
    Ok(s::priority_from_value(Some(&v)))
}

/// Clamp an integer priority to 0..=100.
#[pyfunction]
pub fn clamp_priority(priority: i64) -> u8 {
    s::clamp_priority(priority)
}

/// Validate a slot write's priority; raise `SlotConfigError` if invalid.
#[pyfunction]
pub fn validate_priority(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<u8> {
    let v = if value.is_none() {
        None
    } else {
        Some(py_to_json(value)?)
    };
    slot(py, s::validate_priority(v.as_ref()))
}

/// Warns once per slot that still carries the retired `lru` key.
#[pyclass(frozen, module = "vacancy._vacancy")]
pub struct LruRetirementWarnings {
    inner: Mutex<s::LruRetirementWarnings>,
}

impl LruRetirementWarnings {
    fn lock(&self) -> MutexGuard<'_, s::LruRetirementWarnings> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[pymethods]
impl LruRetirementWarnings {
    #[new]
    fn new() -> Self {
        LruRetirementWarnings {
            inner: Mutex::new(s::LruRetirementWarnings::new()),
        }
    }

    /// `True` the first time a slot that carries `lru` is noted.
    fn note(&self, slot: &str, carries_lru: bool) -> bool {
        self.lock().note(slot, carries_lru)
    }

    /// `note` for a slot file (dict).
    fn note_file(&self, slot: &str, slot_file: &Bound<'_, PyAny>) -> PyResult<bool> {
        let v = py_to_json(slot_file)?;
        Ok(self.lock().note_file(slot, &v))
    }

    /// Whether `slot` was warned about.
    fn warned(&self, slot: &str) -> bool {
        self.lock().warned(slot)
    }
}

// ---- records -----------------------------------------------------------------

/// `slot_dir/state.json`.
#[pyfunction]
pub fn state_record_path(slot_dir: PathBuf) -> PathBuf {
    s::state_record_path(&slot_dir)
}

/// Write a record (a dict) atomically, with the GIL released.
#[pyfunction]
pub fn write_state_record(
    py: Python<'_>,
    path: PathBuf,
    record: &Bound<'_, PyDict>,
) -> PyResult<()> {
    let v = py_to_json(record.as_any())?;
    let record: s::SlotStateRecord = serde_json::from_value(v)
        .map_err(|e| PyValueError::new_err(format!("not a slot state record: {e}")))?;
    py.detach(|| s::write_state_record(&path, &record))
        .map_err(|e| state_record_error(py, &e))
}

/// Read a record as a dict, `None` if there is no file; GIL released.
#[pyfunction]
pub fn read_state_record(py: Python<'_>, path: PathBuf) -> PyResult<Option<Py<PyAny>>> {
    let r = py
        .detach(|| s::read_state_record(&path))
        .map_err(|e| state_record_error(py, &e))?;
    match r {
        None => Ok(None),
        Some(record) => {
            let v = serde_json::to_value(&record)
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
            Ok(Some(json_to_py(py, &v)?))
        }
    }
}

// ---- slot-write guards, activation, autoload -------------------------------------

/// Raise `SlotTuningKeyDenied`, `SlotLlamaEnvDenied` or `SlotRemovedKeyDenied`.
#[pyfunction]
pub fn guard_slot_write_payload(py: Python<'_>, payload: &Bound<'_, PyAny>) -> PyResult<()> {
    let v = py_to_json(payload)?;
    slot(py, s::guard_slot_write_payload(&v))
}

/// Raise `SlotUnconverted` if a slot file still carries tuning keys.
#[pyfunction]
#[pyo3(signature = (slot, file, slot_file))]
pub fn check_unconverted(
    py: Python<'_>,
    slot: &str,
    file: Option<&str>,
    slot_file: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let v = py_to_json(slot_file)?;
    self::slot(py, s::check_unconverted(slot, file, &v))
}

/// `(reason, fix, keys)` when a slot file cannot be converted, else `None`.
#[pyfunction]
pub fn conversion_blocked(
    slot_file: &Bound<'_, PyAny>,
) -> PyResult<Option<(String, String, Vec<String>)>> {
    let v = py_to_json(slot_file)?;
    Ok(s::conversion_blocked(&v).map(|c| (c.reason, c.fix, c.keys)))
}

/// `model.default` when set and non-empty.
#[pyfunction]
pub fn bound_model(slot_file: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    let v = py_to_json(slot_file)?;
    Ok(s::bound_model(&v).map(str::to_owned))
}

/// Whether a slot file is activated (has a bound model).
#[pyfunction]
pub fn is_activated(slot_file: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(s::is_activated(&py_to_json(slot_file)?))
}

/// `(autoload, migrated)`; raise `SlotConfigError` for a non-bool `autoload`.
#[pyfunction]
pub fn resolve_autoload(py: Python<'_>, slot_file: &Bound<'_, PyAny>) -> PyResult<(bool, bool)> {
    let v = py_to_json(slot_file)?;
    slot(py, s::resolve_autoload(&v)).map(|a| (a.autoload, a.migrated))
}

/// `autoload` of a newly created slot.
#[pyfunction]
#[pyo3(signature = (requested = None))]
pub fn autoload_for_create(requested: Option<bool>) -> bool {
    s::autoload_for_create(requested)
}

/// Key paths of tuning keys in a payload.
#[pyfunction]
pub fn tuning_keys(payload: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    Ok(s::config::tuning_keys(&py_to_json(payload)?))
}

/// `server.env` keys that set llama-server options.
#[pyfunction]
pub fn llama_env_keys(payload: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    Ok(s::config::llama_env_keys(&py_to_json(payload)?))
}

/// Key paths of removed slot keys.
#[pyfunction]
pub fn removed_keys(payload: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    Ok(s::config::removed_keys(&py_to_json(payload)?))
}

// ---- budget --------------------------------------------------------------------

/// The worst-case seconds of a lifecycle operation, overhead included.
#[pyfunction]
pub fn slot_lifecycle_budget(
    op: &str,
    health_poll_s: f64,
    output_sanity_cpu_s: f64,
    unload_s: f64,
) -> PyResult<f64> {
    let op = match op {
        "load" => s::LifecycleOp::Load,
        "unload" => s::LifecycleOp::Unload,
        "restart" => s::LifecycleOp::Restart,
        "swap" => s::LifecycleOp::Swap,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown lifecycle operation {other:?}: load, unload, restart or swap"
            )));
        }
    };
    Ok(s::slot_lifecycle_budget(
        op,
        &s::LifecycleBudgetInputs {
            health_poll_s,
            output_sanity_cpu_s,
            unload_s,
        },
    ))
}

// ---- launch --------------------------------------------------------------------

/// Tokens as `(flag, values)` pairs.
#[pyfunction]
pub fn parse_launch_args(tokens: Vec<String>) -> Vec<(String, Vec<String>)> {
    s::parse_launch_args(&tokens)
        .into_iter()
        .map(|f| (f.flag, f.values))
        .collect()
}

/// The canonical spelling of a flag (`-c` → `--ctx-size`).
#[pyfunction]
pub fn canonical_flag(flag: &str) -> String {
    s::canonical_flag(flag).to_owned()
}

/// llama-server's `--device` value for a slot device.
#[pyfunction]
pub fn llama_device_arg(slot_device: &str) -> Option<&'static str> {
    s::llama_device_arg(slot_device)
}

type Flags = Vec<(String, Vec<String>)>;

/// `(argv, [(flag, layer), ...])`.
type Composed = (Option<Vec<String>>, Vec<(String, &'static str)>);

/// `(argv, [(flag, layer), ...])` from `[(layer, [(flag, values), ...]), ...]`.
#[pyfunction]
#[pyo3(signature = (program, layers))]
pub fn compose_launch_argv(
    program: Option<&str>,
    layers: Vec<(String, Flags)>,
) -> PyResult<Composed> {
    let mut resolved = Vec::with_capacity(layers.len());
    for (layer, flags) in layers {
        let layer = match layer.as_str() {
            "base" => s::LaunchLayer::Base,
            "model" => s::LaunchLayer::Model,
            "profile" => s::LaunchLayer::Profile,
            "slot" => s::LaunchLayer::Slot,
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown launch layer {other:?}: base, model, profile or slot"
                )));
            }
        };
        let flags = flags
            .into_iter()
            .map(|(flag, values)| s::LaunchFlag { flag, values })
            .collect();
        resolved.push((layer, flags));
    }
    let r = s::compose_launch_argv(program, &resolved);
    Ok((
        r.argv,
        r.provenance
            .into_iter()
            .map(|p| (p.flag, p.layer.as_str()))
            .collect(),
    ))
}

// ---- providers -------------------------------------------------------------------

/// Whether a provider needs a model (self-managed ones serve a baked-in one).
#[pyfunction]
pub fn provider_requires_model(provider: &str) -> bool {
    s::provider_requires_model(provider)
}

// ---- gate ------------------------------------------------------------------------

fn probe_str(p: Probe) -> &'static str {
    match p {
        Probe::Completion => "completion",
        Probe::ChatCompletions => "chat_completions",
    }
}

fn heard(h: &[gate::Heard]) -> Vec<(&'static str, String)> {
    h.iter()
        .map(|h| (probe_str(h.probe), h.said.clone()))
        .collect()
}

/// The default options of a lane: `(completion_tokens, completion_timeout_s,
/// chat_tokens, chat_timeout_s)`.
#[pyfunction]
pub fn gate_defaults(lane: &str) -> PyResult<(u32, f64, u32, f64)> {
    let o = match lane {
        "accelerated" => GateOptions::accelerated(),
        "cpu" => GateOptions::cpu(),
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown lane {other:?}: accelerated or cpu"
            )));
        }
    };
    Ok((
        o.completion_tokens,
        o.completion_timeout.as_secs_f64(),
        o.chat_tokens,
        o.chat_timeout.as_secs_f64(),
    ))
}

fn timeout(name: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            PyValueError::new_err(format!("{name} must be a positive number of seconds"))
        })
}

/// Run the output-sanity gate on a private Tokio runtime with the GIL
/// released; returns the outcome as a dict.
#[pyfunction]
#[pyo3(signature = (base_url, lane, completion_tokens, completion_timeout_s, chat_tokens, chat_timeout_s, model = None, authorization = None))]
#[allow(clippy::too_many_arguments)]
pub fn check_output_sanity<'py>(
    py: Python<'py>,
    base_url: String,
    lane: &str,
    completion_tokens: u32,
    completion_timeout_s: f64,
    chat_tokens: u32,
    chat_timeout_s: f64,
    model: Option<String>,
    authorization: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let lane = match lane {
        "accelerated" => Lane::Accelerated,
        "cpu" => Lane::Cpu,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown lane {other:?}: accelerated or cpu"
            )));
        }
    };
    let opts = GateOptions {
        lane,
        completion_tokens,
        completion_timeout: timeout("completion_timeout_s", completion_timeout_s)?,
        chat_tokens,
        chat_timeout: timeout("chat_timeout_s", chat_timeout_s)?,
        model,
        authorization,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start a Tokio runtime: {e}")))?;
    let fut = gate::check_output_sanity(&base_url, &opts);
    let mut fut = std::pin::pin!(fut);
    let outcome = loop {
        let step = py.detach(|| {
            rt.block_on(async { tokio::time::timeout(SIGNAL_CHECK, fut.as_mut()).await })
        });
        match step {
            Ok(outcome) => break outcome,
            Err(_) => py.check_signals()?,
        }
    };
    outcome_dict(py, &outcome)
}

fn outcome_dict<'py>(py: Python<'py>, o: &GateOutcome) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("message", o.to_string())?;
    d.set_item(
        "next_state",
        match o.next_state() {
            gate::GateNextState::Ready => "ready",
            gate::GateNextState::Warming => "warming",
            gate::GateNextState::Error => "error",
        },
    )?;
    match o {
        GateOutcome::Passed { probe, answer } => {
            d.set_item("kind", "passed")?;
            d.set_item("probe", probe_str(*probe))?;
            d.set_item("answer", answer)?;
            d.set_item("heard", vec![(probe_str(*probe), answer.clone())])?;
        }
        GateOutcome::Wrong {
            expected,
            actual,
            probe,
            heard: h,
        } => {
            d.set_item("kind", "wrong")?;
            d.set_item("probe", probe_str(*probe))?;
            d.set_item("expected", expected)?;
            d.set_item("actual", actual)?;
            d.set_item("heard", heard(h))?;
        }
        GateOutcome::Unanswered {
            probe,
            reason,
            heard: h,
        } => {
            d.set_item("kind", "unanswered")?;
            d.set_item("probe", probe_str(*probe))?;
            d.set_item("reason", reason)?;
            d.set_item("heard", heard(h))?;
        }
    }
    Ok(d)
}

/// Whether a load of this slot runs the gate (GATE-01, 11–14).
#[pyfunction]
#[pyo3(signature = (slot_type, runtime = "llama_server", box_switch = None, slot_switch = None))]
pub fn is_gated(
    slot_type: &str,
    runtime: &str,
    box_switch: Option<&str>,
    slot_switch: Option<bool>,
) -> PyResult<bool> {
    let t = match slot_type {
        "llm" => gate::SlotType::Llm,
        "embedding" => gate::SlotType::Embedding,
        "reranking" => gate::SlotType::Reranking,
        "tts" => gate::SlotType::Tts,
        "stt" => gate::SlotType::Stt,
        "image" => gate::SlotType::Image,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown slot type {other:?}: llm, embedding, reranking, tts, stt or image"
            )));
        }
    };
    let r = match runtime {
        "llama_server" => gate::Runtime::LlamaServer,
        "flm_npu" => gate::Runtime::FlmNpu,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown runtime {other:?}: llama_server or flm_npu"
            )));
        }
    };
    Ok(gate::is_gated(t, r, box_switch, slot_switch))
}

/// Add the functions, classes and constants to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<CrashLoopBreaker>()?;
    m.add_class::<LruRetirementWarnings>()?;
    for f in [
        wrap_pyfunction!(check_transition, m)?,
        wrap_pyfunction!(selection_rank, m)?,
        wrap_pyfunction!(state_after_health, m)?,
        wrap_pyfunction!(state_after_exit, m)?,
        wrap_pyfunction!(cooldown_s, m)?,
        wrap_pyfunction!(is_pinned, m)?,
        wrap_pyfunction!(is_eviction_candidate, m)?,
        wrap_pyfunction!(eviction_order, m)?,
        wrap_pyfunction!(plan_preload_eviction, m)?,
        wrap_pyfunction!(check_pinned, m)?,
        wrap_pyfunction!(check_npu_exclusivity, m)?,
        wrap_pyfunction!(reject_retired_lru, m)?,
        wrap_pyfunction!(priority_from_value, m)?,
        wrap_pyfunction!(clamp_priority, m)?,
        wrap_pyfunction!(validate_priority, m)?,
        wrap_pyfunction!(state_record_path, m)?,
        wrap_pyfunction!(write_state_record, m)?,
        wrap_pyfunction!(read_state_record, m)?,
        wrap_pyfunction!(guard_slot_write_payload, m)?,
        wrap_pyfunction!(check_unconverted, m)?,
        wrap_pyfunction!(conversion_blocked, m)?,
        wrap_pyfunction!(bound_model, m)?,
        wrap_pyfunction!(is_activated, m)?,
        wrap_pyfunction!(resolve_autoload, m)?,
        wrap_pyfunction!(autoload_for_create, m)?,
        wrap_pyfunction!(tuning_keys, m)?,
        wrap_pyfunction!(llama_env_keys, m)?,
        wrap_pyfunction!(removed_keys, m)?,
        wrap_pyfunction!(slot_lifecycle_budget, m)?,
        wrap_pyfunction!(parse_launch_args, m)?,
        wrap_pyfunction!(canonical_flag, m)?,
        wrap_pyfunction!(llama_device_arg, m)?,
        wrap_pyfunction!(compose_launch_argv, m)?,
        wrap_pyfunction!(provider_requires_model, m)?,
        wrap_pyfunction!(gate_defaults, m)?,
        wrap_pyfunction!(check_output_sanity, m)?,
        wrap_pyfunction!(is_gated, m)?,
    ] {
        m.add_function(f)?;
    }
    m.add(
        "SLOT_STATES",
        SlotState::ALL.map(SlotState::as_str).to_vec(),
    )?;
    let transitions = PyDict::new(py);
    for (from, to) in s::LEGAL_TRANSITIONS {
        transitions.set_item(
            from.as_str(),
            to.iter().map(|t| t.as_str()).collect::<Vec<_>>(),
        )?;
    }
    m.add("SLOT_TRANSITIONS", transitions)?;
    m.add(
        "SLOT_DISPATCHABLE",
        s::DISPATCHABLE_STATES.map(SlotState::as_str).to_vec(),
    )?;
    m.add("BACKOFF_BASE_S", s::breaker::BACKOFF_BASE_S)?;
    m.add("BACKOFF_CAP_S", s::breaker::BACKOFF_CAP_S)?;
    m.add("PARK_THRESHOLD", s::breaker::PARK_THRESHOLD)?;
    m.add("PARK_BASE_S", s::breaker::PARK_BASE_S)?;
    m.add("PARK_CAP_S", s::breaker::PARK_CAP_S)?;
    m.add("DEFAULT_TRIAL_BUDGET_S", s::breaker::DEFAULT_TRIAL_BUDGET_S)?;
    m.add("DEFAULT_PRIORITY", s::DEFAULT_PRIORITY)?;
    m.add("DEFAULT_PINNED_ANCHORS", s::DEFAULT_PINNED_ANCHORS.to_vec())?;
    m.add("MAX_PRELOAD_VICTIMS", s::MAX_PRELOAD_VICTIMS)?;
    m.add("LRU_RETIRED_EVENT", s::eviction::LRU_RETIRED_EVENT)?;
    m.add("STATE_FILE_NAME", s::STATE_FILE_NAME)?;
    m.add("LIFECYCLE_OVERHEAD", s::LIFECYCLE_OVERHEAD)?;
    m.add("BUDGET_EVICTION_UNLOADS", s::BUDGET_EVICTION_UNLOADS)?;
    m.add("SELF_MANAGED_PROVIDERS", s::SELF_MANAGED_PROVIDERS.to_vec())?;
    m.add("GATE_PROMPT", gate::PROMPT)?;
    m.add("GATE_CHAT_PROMPT", gate::CHAT_PROMPT)?;
    m.add("GATE_EXPECTED", gate::EXPECTED)?;
    Ok(())
}
