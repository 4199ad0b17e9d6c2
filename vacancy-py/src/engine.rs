//! `Config`, `Engine` and `Reservation`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, MutexGuard, PoisonError};
use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyType};

use vacancy::config::{LoadedConfig, PresenceMode, SamplerKind};
use vacancy::engine::{
    CompletionMethod, Decision, EngineError, EngineSpec, EntryId, HeldRelease, ModelObservation,
    ObservedModel, OwnerPresence, Phase, PressureVerdict, ReclaimCommand, ReclaimId,
    ReleaseOutcome, RequestReuse, ResidencyEvidence, WorkRequest,
};
use vacancy::gpu_pressure::{
    Attendance, Miss, Observation, OwnerLoad, PressureParams, PressureReading, PressureTracker,
    PressureUpdate, TriggerKind,
};
use vacancy::shell::loops::sink::LoopSink;
use vacancy::{CapacitySample, Moment, ResourceKind};

use crate::convert::json_to_py;
use crate::core::Core;
use crate::errors::{Error, IntoPyResult, config_error};
use crate::inner::{Inner, Timeline, moment_of, secs};

/// How often a waiting `admit()` on the main thread wakes up to let Python
/// handle signals (Ctrl-C); only the main thread receives them, so other
/// threads wait for a change or their deadline alone.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

// ---- Config ------------------------------------------------------------

/// A validated configuration (the daemon's TOML schema).
#[pyclass(frozen, module = "vacancy._vacancy")]
pub struct Config {
    loaded: LoadedConfig,
}

fn parsed(
    py: Python<'_>,
    r: Result<LoadedConfig, vacancy::config::ConfigErrors>,
) -> PyResult<Config> {
    match r {
        Ok(loaded) => Ok(Config { loaded }),
        Err(e) => Err(config_error(py, &e)?),
    }
}

#[pymethods]
impl Config {
    /// Parse and validate a configuration text.
    #[staticmethod]
    #[pyo3(signature = (text, origin = "<string>"))]
    fn from_toml(py: Python<'_>, text: &str, origin: &str) -> PyResult<Config> {
        parsed(py, vacancy::config::Config::parse(text, origin))
    }

    /// Read, parse and validate a configuration file.
    #[staticmethod]
    fn from_file(py: Python<'_>, path: PathBuf) -> PyResult<Config> {
        parsed(py, vacancy::config::Config::load(&path))
    }

    /// An engine-only configuration, for a program embedding the engine: from
    /// TOML text or from Python values (a dict shaped as the TOML). An
    /// upstream needs no `listen` or `target`, and a resource without a
    /// `sampler` is `"manual"` (fed with `Engine.sample`).
    #[staticmethod]
    #[pyo3(signature = (source, origin = None))]
    fn for_engine(
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        origin: Option<&str>,
    ) -> PyResult<Config> {
        if let Ok(text) = source.extract::<String>() {
            return parsed(
                py,
                vacancy::config::Config::parse_for_engine(&text, origin.unwrap_or("<string>")),
            );
        }
        if !source.is_instance_of::<PyDict>() {
            return Err(PyTypeError::new_err(
                "source must be TOML text (str) or a dict shaped as the TOML",
            ));
        }
        let value = crate::convert::py_to_json(source)?;
        let text = toml::to_string(&value).map_err(|e| {
            PyValueError::new_err(format!(
                "these values cannot be written as TOML ({e}); None has no TOML form: leave the key out"
            ))
        })?;
        parsed(
            py,
            vacancy::config::Config::parse_for_engine(&text, origin.unwrap_or("<values>")),
        )
    }

    /// As `for_engine`, reading a TOML file.
    #[staticmethod]
    fn for_engine_file(py: Python<'_>, path: PathBuf) -> PyResult<Config> {
        parsed(py, vacancy::config::Config::load_for_engine(&path))
    }

    /// Valid but noteworthy things, as `{path, line, message}` dicts.
    #[getter]
    fn warnings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for w in &self.loaded.warnings {
            let d = PyDict::new(py);
            d.set_item("path", &w.path)?;
            d.set_item("line", w.line)?;
            d.set_item("message", &w.message)?;
            list.append(d)?;
        }
        Ok(list)
    }

    /// The resource names, in configuration order.
    #[getter]
    fn resources(&self) -> Vec<String> {
        self.loaded
            .config
            .resources
            .iter()
            .map(|r| r.name.clone())
            .collect()
    }

    /// The upstream names, in configuration order.
    #[getter]
    fn upstreams(&self) -> Vec<String> {
        self.loaded
            .config
            .upstreams
            .iter()
            .map(|u| u.name.clone())
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "Config(resources={:?}, upstreams={:?})",
            self.resources(),
            self.upstreams()
        )
    }
}

// ---- Engine --------------------------------------------------------------

/// The admission engine: the daemon's rules, embedded. See `docs/python.md`.
/// Weak-referenceable: `vacancy._aio` keeps one waker per engine without
/// keeping the engine alive.
#[pyclass(frozen, weakref, module = "vacancy._vacancy")]
pub struct Engine {
    /// The state a `Driver`'s threads share with the engine.
    pub(crate) core: Arc<Core>,
    /// `[owner.gpu_pressure]`'s parameters when enabled; `None`: pressure is
    /// off and a GPU is limited only by its free memory (SCOPE-09).
    pressure: Option<PressureParams>,
    /// Each resource's kind, to tell GPUs from the rest.
    kinds: HashMap<String, ResourceKind>,
}

fn entry_id(id: &str) -> Result<EntryId, Error> {
    id.parse::<EntryId>()
        .map_err(|_| Error::BadId(id.to_owned()))
}

fn attendance_arg(attendance: &str) -> PyResult<Attendance> {
    match attendance {
        "attended" => Ok(Attendance::Attended),
        "unattended" => Ok(Attendance::Unattended),
        other => Err(PyValueError::new_err(format!(
            "attendance must be 'attended' (the owner is present) or 'unattended' (away), not {other:?}"
        ))),
    }
}

fn owner_load(util_pct: u8, memory_mib: u64) -> PyResult<OwnerLoad> {
    if util_pct > 100 {
        return Err(PyValueError::new_err(format!(
            "util_pct is a percentage (0 to 100), not {util_pct}"
        )));
    }
    Ok(OwnerLoad {
        util_pct,
        memory_mib,
    })
}

/// A pressure poll's result as the dict `pressure_sample` / `pressure_miss` return.
fn update_json(u: &PressureUpdate) -> serde_json::Value {
    let reading = match &u.reading {
        PressureReading::Quiet => "quiet",
        PressureReading::Rising => "rising",
        PressureReading::Engaged => "engaged",
        PressureReading::Releasing => "releasing",
        PressureReading::Uncalibrated(_) => "uncalibrated",
        PressureReading::Unavailable(_) => "unavailable",
    };
    let refuses = match &u.verdict {
        PressureVerdict::Admits => None,
        PressureVerdict::Refuses(why) => Some(why.clone()),
    };
    let trigger = u.trigger.as_ref().map(|t| {
        let kind = match t.kind {
            TriggerKind::Engaged => "engaged",
            TriggerKind::Uncalibrated => "uncalibrated",
            TriggerKind::Gap => "gap",
        };
        serde_json::json!({"kind": kind, "why": t.why})
    });
    serde_json::json!({
        "resource": u.resource, "reading": reading, "refuses": refuses,
        "cleared": u.cleared, "trigger": trigger,
    })
}

/// A work entry ID from a `str` or a `Reservation`.
fn id_arg(id: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(r) = id.cast::<Reservation>() {
        return Ok(r.get().id.clone());
    }
    id.extract::<String>()
        .map_err(|_| PyTypeError::new_err("id must be a work entry ID (str) or a Reservation"))
}

fn observed_model(item: &Bound<'_, PyAny>) -> PyResult<ObservedModel> {
    if let Ok(name) = item.extract::<String>() {
        return Ok(ObservedModel::new(name, ResidencyEvidence::Proven));
    }
    let d = item.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err("each observed model is a name (str) or a dict with at least 'name'")
    })?;
    for key in d.keys() {
        let key: String = key.extract()?;
        if !matches!(
            key.as_str(),
            "name" | "ready" | "proven" | "reason" | "kinds"
        ) {
            return Err(PyValueError::new_err(format!(
                "unknown key {key:?} in an observed model; known: name, ready, proven, reason, kinds"
            )));
        }
    }
    let name: String = d
        .get_item("name")?
        .ok_or_else(|| PyValueError::new_err("an observed model needs a 'name'"))?
        .extract()?;
    let get_bool = |key: &str| -> PyResult<bool> {
        match d.get_item(key)? {
            Some(v) => v.extract(),
            None => Ok(true),
        }
    };
    let ready = get_bool("ready")?;
    let proven = get_bool("proven")?;
    let reason: Option<String> = match d.get_item("reason")? {
        Some(v) => v.extract()?,
        None => None,
    };
    let kinds: Option<Vec<String>> = match d.get_item("kinds")? {
        Some(v) if !v.is_none() => {
            if v.is_instance_of::<pyo3::types::PyString>() {
                return Err(PyTypeError::new_err(
                    "kinds must be a list of str, not a str",
                ));
            }
            Some(v.extract()?)
        }
        _ => None,
    };
    let evidence = if let Some(kinds) = kinds {
        // RES-05: proven only for requests of these kinds.
        if !proven {
            return Err(PyValueError::new_err(
                "an observed model has either kinds= (proven for those kinds) or proven=False, not both",
            ));
        }
        ResidencyEvidence::ProvenFor {
            kinds,
            otherwise: reason.unwrap_or_else(|| {
                "the loaded model is not known to serve requests of this kind".to_owned()
            }),
        }
    } else if proven {
        ResidencyEvidence::Proven
    } else {
        ResidencyEvidence::NotProven(reason.unwrap_or_else(|| {
            "the upstream's evidence does not prove the loaded model will be reused".to_owned()
        }))
    };
    Ok(ObservedModel {
        ready,
        ..ObservedModel::new(name, evidence)
    })
}

impl Engine {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.core.lock()
    }

    /// The pressure parameters, if `resource` is a GPU and pressure is on.
    fn pressure_gpu(&self, py: Python<'_>, resource: &str) -> PyResult<PressureParams> {
        match self.kinds.get(resource) {
            None => Err(Error::Engine(vacancy::engine::EngineError::UnknownResource(
                resource.to_owned(),
            ))
            .into_py(py)),
            Some(ResourceKind::Gpu) => self.pressure.ok_or_else(|| {
                PyValueError::new_err(
                    "GPU pressure is off in this configuration ([owner.gpu_pressure] enabled = false): \
                     a GPU is limited only by its free memory",
                )
            }),
            Some(kind) => Err(PyValueError::new_err(format!(
                "resource {resource:?} is a {} resource; GPU pressure is measured on GPUs only",
                kind.as_str()
            ))),
        }
    }

    /// One pressure poll of `resource`, applied to the engine as the daemon's
    /// pressure loop applies it.
    fn pressure_poll(
        &self,
        py: Python<'_>,
        resource: &str,
        observation: Observation,
        at: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        let params = self.pressure_gpu(py, resource)?;
        let value = self.with(py, |g| {
            let m = g.moment(&self.core.clock, at)?;
            let baseline = g.baselines.get(resource).copied().unwrap_or_default();
            let tracker = g
                .trackers
                .entry(resource.to_owned())
                .or_insert_with(|| PressureTracker::new(resource, params, baseline, m));
            let update = tracker.poll(m, observation);
            g.engine.apply_pressure(&update)?;
            Ok(update_json(&update))
        })?;
        json_to_py(py, &value)
    }

    /// Run `f` on the engine with the lock held; map its error after the lock is dropped.
    fn with<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Inner) -> Result<T, Error>,
    ) -> PyResult<T> {
        let r = {
            let mut g = self.lock();
            let r = f(&mut g);
            self.core.drain_effects(&mut g);
            r
        };
        r.py(py)
    }

    /// One cycle of a real-time wait for the post-job sample, with the GIL
    /// released: admit now, and if the answer is still `Wait`, sleep until a
    /// change (a sample, a moved line), the wait's end or the end of `slice`
    /// (the main thread's signal check). The decision and the sleep are under
    /// one lock, and every change is notified under it: none is missed.
    fn wait_cycle(&self, req: &WorkRequest, slice: Option<Duration>) -> Option<Decision> {
        let mut g = self.lock();
        let now = self.core.clock.now();
        g.latest = g.latest.max(now);
        match g.engine.admit(req, now) {
            Decision::Wait { until, .. } => {
                let left = until.since(now);
                let slice = slice.map_or(left, |s| left.min(s));
                let (g, _) = self
                    .core
                    .changed
                    .wait_timeout(g, slice)
                    .unwrap_or_else(PoisonError::into_inner);
                drop(g);
                None
            }
            d => Some(d),
        }
    }
}

/// Whether the calling thread is Python's main thread, the one that
/// receives signals.
fn main_thread(py: Python<'_>) -> PyResult<bool> {
    let threading = py.import("threading")?;
    let main = threading.call_method0("main_thread")?;
    let current = threading.call_method0("current_thread")?;
    Ok(main.is(&current))
}

fn parse_outcome(outcome: &str, reason: Option<&str>) -> PyResult<ReleaseOutcome> {
    match outcome {
        "completed" => Ok(ReleaseOutcome::Completed),
        "not_forwarded" => Ok(ReleaseOutcome::NotForwarded),
        "uncertain" => Ok(ReleaseOutcome::Uncertain(
            reason
                .unwrap_or("the end of the work could not be proven")
                .to_owned(),
        )),
        other => Err(PyValueError::new_err(format!(
            "outcome must be 'completed', 'not_forwarded' or 'uncertain', not {other:?}"
        ))),
    }
}

fn parse_completion(completion: &str) -> PyResult<CompletionMethod> {
    match completion {
        "response_end" => Ok(CompletionMethod::ResponseEnd),
        "tracked" => Ok(CompletionMethod::Tracked),
        "held_on_close" => Ok(CompletionMethod::HeldOnClose),
        other => Err(PyValueError::new_err(format!(
            "completion must be 'response_end', 'tracked' or 'held_on_close', not {other:?}"
        ))),
    }
}

/// `admit`'s arguments, checked.
struct AdmitArgs {
    upstream: String,
    model: Option<String>,
    completion: CompletionMethod,
    reuse: RequestReuse,
    canonical_model: Option<String>,
    wait: Option<Duration>,
    /// The borrower's name (issue 34); ignored with borrowers off.
    borrower: Option<String>,
    /// The class asked for: may lower the borrower's, never raise it.
    priority: Option<vacancy::engine::Priority>,
}

impl AdmitArgs {
    #[allow(clippy::too_many_arguments)]
    fn parse(
        upstream: &str,
        model: Option<&str>,
        completion: &str,
        kind: Option<String>,
        canonical_model: Option<String>,
        cannot_reuse: Option<String>,
        wait_s: Option<f64>,
        borrower: Option<String>,
        priority: Option<&str>,
    ) -> PyResult<Self> {
        let priority = priority
            .map(str::parse::<vacancy::engine::Priority>)
            .transpose()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let completion = parse_completion(completion)?;
        let reuse = match (kind, cannot_reuse) {
            (Some(_), Some(_)) => {
                return Err(PyValueError::new_err(
                    "kind= and cannot_reuse= exclude each other: a request either has a kind or cannot reuse a loaded model",
                ));
            }
            (Some(k), None) => RequestReuse::ReusesAs(k),
            (None, Some(why)) => RequestReuse::Cannot(why),
            (None, None) => RequestReuse::Reuses,
        };
        let wait = match wait_s {
            None => None,
            Some(w) if w.is_finite() && (0.0..=3600.0).contains(&w) => {
                Some(Duration::from_secs_f64(w))
            }
            Some(w) => {
                return Err(PyValueError::new_err(format!(
                    "wait_s must be 0 to 3600 seconds, not {w}"
                )));
            }
        };
        Ok(AdmitArgs {
            upstream: upstream.to_owned(),
            model: model.map(str::to_owned),
            completion,
            reuse,
            canonical_model,
            wait,
            borrower,
            priority,
        })
    }

    /// The work request, arrived at `arrived`.
    fn request(&self, g: &Inner, arrived: Moment) -> Result<WorkRequest, Error> {
        let up = g.upstream(&self.upstream)?;
        let mut req = WorkRequest::new(up, self.model.as_deref(), arrived);
        req.completion = self.completion;
        req.reuse = self.reuse.clone();
        req.canonical_model = self.canonical_model.clone();
        req.wait = self.wait;
        req.borrower = self
            .borrower
            .as_ref()
            .map(|name| vacancy::engine::BorrowerRef::Name(name.clone()));
        req.priority = self.priority;
        Ok(req)
    }
}

impl Engine {
    /// An `admit_async` in progress, arrived now on the real clock.
    fn ticket(slf: &Bound<'_, Self>, args: AdmitArgs) -> PyResult<AdmitTicket> {
        let py = slf.py();
        let this = slf.get();
        this.core.require_real_time("admit_async()").py(py)?;
        let req = this.with(py, |g| {
            let t = g.moment(&this.core.clock, None)?;
            args.request(g, t)
        })?;
        Ok(AdmitTicket {
            engine: slf.clone().unbind(),
            req,
            left: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// A ticket for `args`, handed to `vacancy._aio.<entry>` (`admit`, the
    /// coroutine, or `Admitting`, the async context manager).
    fn to_aio(slf: &Bound<'_, Self>, args: AdmitArgs, entry: &str) -> PyResult<Py<PyAny>> {
        let ticket = Self::ticket(slf, args)?;
        Ok(slf
            .py()
            .import("vacancy._aio")?
            .getattr(entry)?
            .call1((ticket,))?
            .unbind())
    }
}

/// One `admit_async` call: its request (the same arrival and place in the
/// wait line at every step) and the engine. `vacancy._aio` steps it on the
/// event loop's thread, so a reservation is only ever made there and a
/// cancelled task cannot leave one behind.
#[pyclass(frozen, module = "vacancy._vacancy")]
pub struct AdmitTicket {
    engine: Py<Engine>,
    req: WorkRequest,
    left: std::sync::atomic::AtomicBool,
}

#[pymethods]
impl AdmitTicket {
    /// The engine.
    #[getter]
    fn engine(&self, py: Python<'_>) -> Py<Engine> {
        self.engine.clone_ref(py)
    }

    /// Ask once, never blocking: the `Reservation`; or while it waits for the
    /// post-job sample or its turn in the wait line, `(generation, wait_s)`:
    /// the engine's change generation at this decision (a change after it
    /// moves it, see `Engine._wait_change`) and the seconds until the wait's
    /// deadline, when it must ask again even if nothing changed; or the
    /// refusal raised.
    fn step(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if self.left.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(PyValueError::new_err("this admission was cancelled"));
        }
        let engine = self.engine.get();
        let (decision, now, generation) = engine.with(py, |g| {
            let now = engine.core.clock.now();
            g.latest = g.latest.max(now);
            let d = g.engine.admit(&self.req, now);
            // Read under the lock the decision was made under: a change
            // after it moves the generation past this.
            Ok((d, now, engine.core.generation()))
        })?;
        match decision {
            Decision::Admitted(r) => {
                let job = Reservation::new(r, self.engine.clone_ref(py));
                Ok(Py::new(py, job)?.into_any())
            }
            Decision::Refused(r) => Err(Error::Refused(r).into_py(py)),
            Decision::Reobserve(r) => Err(Error::Reobserve(r).into_py(py)),
            Decision::Wait { until, .. } => {
                let wait_s = until.since(now).as_secs_f64();
                Ok((generation, wait_s).into_pyobject(py)?.into_any().unbind())
            }
        }
    }

    /// The awaiting task was cancelled: leave the wait line, reserving nothing.
    fn cancel(&self) {
        self.leave();
    }
}

impl AdmitTicket {
    /// Leave the wait line, once.
    fn leave(&self) {
        if !self.left.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.engine.get().lock().engine.leave_line(self.req.id);
        }
    }
}

/// A ticket dropped without an answer (its coroutine never finished, or was
/// collected without being closed) leaves the wait line: it never holds
/// back those behind it until the line's expiry. Takes only the engine's
/// lock, never the GIL's Python code.
impl Drop for AdmitTicket {
    fn drop(&mut self) {
        self.leave();
    }
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (config, *, borrowers = None))]
    fn new(
        py: Python<'_>,
        config: &Config,
        borrowers: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let spec = EngineSpec::from(&config.loaded.config);
        let mut engine = vacancy::Engine::new(spec).map_err(|e| Error::Spec(e).into_py(py))?;
        // Budgets reset at UTC day and week boundaries: the timeline's
        // origin is now on the wall clock until `set_wall_clock` says otherwise.
        engine.set_wall_clock(Moment::ZERO, unix_ms_now());
        engine
            .set_borrowers(borrowers_of(borrowers)?)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        // No presence backend runs inside Python: a dedicated machine
        // (presence = "none") starts away, every other mode unknown until told.
        if config.loaded.config.owner.presence == PresenceMode::None {
            engine.set_owner(OwnerPresence::Away);
        }
        let c = &config.loaded.config;
        let inner = Inner {
            engine,
            timeline: Timeline::Unset,
            latest: Moment::ZERO,
            trackers: HashMap::new(),
            baselines: HashMap::new(),
        };
        Ok(Engine {
            core: Arc::new(Core::new(inner, c)),
            pressure: c
                .owner
                .gpu_pressure
                .enabled
                .then(|| PressureParams::from_config(&c.owner.gpu_pressure)),
            kinds: c
                .resources
                .iter()
                .map(|r| (r.name.clone(), r.kind))
                .collect(),
        })
    }

    /// Replace the borrower table (issue 34): a dict as the constructor's
    /// `borrowers=`, or `None` to switch borrowers off.
    #[pyo3(signature = (borrowers))]
    fn set_borrowers(&self, py: Python<'_>, borrowers: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let spec = borrowers_of(borrowers)?;
        self.with(py, |g| Ok(g.engine.set_borrowers(spec)))?
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Anchor the engine's timeline to the wall clock for budget periods:
    /// `at` (engine seconds; default now) is `unix_s` seconds after
    /// 1970-01-01 00:00 UTC.
    #[pyo3(signature = (unix_s, at = None))]
    fn set_wall_clock(&self, py: Python<'_>, unix_s: f64, at: Option<f64>) -> PyResult<()> {
        if !unix_s.is_finite() {
            return Err(PyValueError::new_err("unix_s must be a finite number"));
        }
        self.with(py, |g| {
            let m = g.moment(&self.core.clock, at)?;
            g.engine.set_wall_clock(m, (unix_s * 1000.0) as i64);
            Ok(())
        })
    }

    /// The engine's current time in seconds: its clock, or the latest simulated moment.
    fn now(&self) -> f64 {
        let mut g = self.lock();
        secs(g.current(&self.core.clock))
    }

    /// Whether the engine runs on simulated time (`None` until a call decides).
    #[getter]
    fn simulated(&self) -> Option<bool> {
        match self.lock().timeline {
            Timeline::Unset => None,
            Timeline::Real => Some(false),
            Timeline::Simulated => Some(true),
        }
    }

    /// A successful capacity sample of `resource`.
    #[pyo3(signature = (resource, free_mib, total_mib, at = None, *, busy_pct = None))]
    fn sample(
        &self,
        py: Python<'_>,
        resource: &str,
        free_mib: u64,
        total_mib: u64,
        at: Option<f64>,
        busy_pct: Option<u8>,
    ) -> PyResult<()> {
        self.with(py, |g| {
            let taken_at = g.moment(&self.core.clock, at)?;
            let sample = CapacitySample {
                free_mib,
                total_mib,
                busy_pct,
                heat: Default::default(),
                taken_at,
            };
            g.engine.record_sample(resource, sample)?;
            // Under the lock, as every notification (Core::notify_changed).
            self.core.notify_changed(g);
            Ok(())
        })?;
        Ok(())
    }

    /// A failed sample: capacity is unknown until a later success.
    #[pyo3(signature = (resource, reason, at = None))]
    fn sample_failed(
        &self,
        py: Python<'_>,
        resource: &str,
        reason: &str,
        at: Option<f64>,
    ) -> PyResult<()> {
        self.with(py, |g| {
            let m = g.moment(&self.core.clock, at)?;
            Ok(g.engine.record_sample_failure(resource, m, reason)?)
        })
    }

    /// A model observation of `upstream`: the loaded models, each a name or a
    /// dict `{name, ready=True, proven=True, reason=None}`.
    #[pyo3(signature = (upstream, models, at = None, *, foreign_work = None))]
    fn observe(
        &self,
        py: Python<'_>,
        upstream: &str,
        models: &Bound<'_, PyAny>,
        at: Option<f64>,
        foreign_work: Option<String>,
    ) -> PyResult<()> {
        if models.is_instance_of::<pyo3::types::PyString>() {
            return Err(PyTypeError::new_err("models must be a list, not a str"));
        }
        let models = models
            .try_iter()?
            .map(|item| observed_model(&item?))
            .collect::<PyResult<Vec<_>>>()?;
        self.with(py, |g| {
            let up = g.upstream(upstream)?;
            let taken_at = g.moment(&self.core.clock, at)?;
            g.engine.observe(
                up,
                ModelObservation {
                    taken_at,
                    models,
                    // Work the caller says vacancy did not admit: foreign
                    // whatever vacancy's own jobs are.
                    visible_work: foreign_work
                        .map(|what| vacancy::engine::VisibleWork::new(u32::MAX, what)),
                    allocator_free_mib: None,
                },
            )?;
            Ok(())
        })
    }

    /// Decide borrowed work on `upstream`.
    #[pyo3(signature = (upstream, model = None, *, now = None, arrived_at = None, completion = "response_end", kind = None, canonical_model = None, cannot_reuse = None, wait_s = None, borrower = None, priority = None))]
    #[allow(clippy::too_many_arguments)]
    fn admit(
        slf: &Bound<'_, Self>,
        upstream: &str,
        model: Option<&str>,
        now: Option<f64>,
        arrived_at: Option<f64>,
        completion: &str,
        kind: Option<String>,
        canonical_model: Option<String>,
        cannot_reuse: Option<String>,
        wait_s: Option<f64>,
        borrower: Option<String>,
        priority: Option<&str>,
    ) -> PyResult<Reservation> {
        let py = slf.py();
        let this = slf.get();
        let args = AdmitArgs::parse(
            upstream,
            model,
            completion,
            kind,
            canonical_model,
            cannot_reuse,
            wait_s,
            borrower,
            priority,
        )?;
        if arrived_at.is_some() && now.is_none() {
            return Err(PyValueError::new_err(
                "arrived_at= is for simulated time: pass now= as well",
            ));
        }
        let (req, mut decision) = this.with(py, |g| {
            let t = g.moment(&this.core.clock, now)?;
            let arrived = match arrived_at {
                Some(a) => moment_of(a)?,
                None => t,
            };
            let req = args.request(g, arrived)?;
            let d = g.engine.admit(&req, t);
            Ok((req, d))
        })?;
        loop {
            match decision {
                Decision::Admitted(r) => return Ok(Reservation::new(r, slf.clone().unbind())),
                Decision::Refused(r) => return Err(Error::Refused(r).into_py(py)),
                Decision::Reobserve(r) => {
                    // The engine keeps a waiter's place for a shell that
                    // observes and asks again (RES-20); this call answers
                    // instead, so it gives the place up.
                    this.lock().engine.leave_line(req.id);
                    return Err(Error::Reobserve(r).into_py(py));
                }
                Decision::Wait { until, resources } => {
                    if now.is_some() {
                        return Err(Error::Wait {
                            until: secs(until),
                            arrived_at: secs(req.arrived_at),
                            resources,
                        }
                        .into_py(py));
                    }
                    // ADM-06 on the real clock: wait for the sample with the GIL
                    // and the engine's lock released, so another thread can feed it.
                    let slice = main_thread(py)?.then_some(SIGNAL_CHECK);
                    loop {
                        if let Some(d) = py.detach(|| this.wait_cycle(&req, slice)) {
                            decision = d;
                            break;
                        }
                        if let Err(e) = py.check_signals() {
                            // Interrupted while waiting: it leaves the line,
                            // reserving nothing.
                            this.lock().engine.leave_line(req.id);
                            return Err(e);
                        }
                    }
                }
            }
        }
    }

    /// `await engine.admit_async(...)`: `admit` on the real clock for asyncio.
    /// Waiting for the post-job sample (or in the wait line) never blocks the
    /// event loop; cancelling the awaiting task reserves nothing.
    #[pyo3(signature = (upstream, model = None, *, completion = "response_end", kind = None, canonical_model = None, cannot_reuse = None, wait_s = None, borrower = None, priority = None))]
    #[allow(clippy::too_many_arguments)]
    fn admit_async(
        slf: &Bound<'_, Self>,
        upstream: &str,
        model: Option<&str>,
        completion: &str,
        kind: Option<String>,
        canonical_model: Option<String>,
        cannot_reuse: Option<String>,
        wait_s: Option<f64>,
        borrower: Option<String>,
        priority: Option<&str>,
    ) -> PyResult<Py<PyAny>> {
        let args = AdmitArgs::parse(
            upstream,
            model,
            completion,
            kind,
            canonical_model,
            cannot_reuse,
            wait_s,
            borrower,
            priority,
        )?;
        Self::to_aio(slf, args, "admit")
    }

    /// `async with engine.admitting(...) as job:`: `admit_async`, released as
    /// the `with` block of a `Reservation` releases.
    #[pyo3(signature = (upstream, model = None, *, completion = "response_end", kind = None, canonical_model = None, cannot_reuse = None, wait_s = None, borrower = None, priority = None))]
    #[allow(clippy::too_many_arguments)]
    fn admitting(
        slf: &Bound<'_, Self>,
        upstream: &str,
        model: Option<&str>,
        completion: &str,
        kind: Option<String>,
        canonical_model: Option<String>,
        cannot_reuse: Option<String>,
        wait_s: Option<f64>,
        borrower: Option<String>,
        priority: Option<&str>,
    ) -> PyResult<Py<PyAny>> {
        let args = AdmitArgs::parse(
            upstream,
            model,
            completion,
            kind,
            canonical_model,
            cannot_reuse,
            wait_s,
            borrower,
            priority,
        )?;
        Self::to_aio(slf, args, "Admitting")
    }

    /// Sample `resource` (default: every sampled resource) now with the
    /// configured sampler, as the daemon does; returns `{resource: None}` for
    /// a good sample and `{resource: reason}` for a failed one (recorded as
    /// `sample_failed`). Runs with the GIL released.
    #[pyo3(signature = (resource = None))]
    fn sample_now(
        &self,
        py: Python<'_>,
        resource: Option<&str>,
    ) -> PyResult<HashMap<String, Option<String>>> {
        self.core.require_real_time("sample_now()").py(py)?;
        let names: Vec<String> = match resource {
            Some(name) => {
                let Some(r) = self.core.resource_config(name) else {
                    return Err(
                        Error::Engine(EngineError::UnknownResource(name.to_owned())).into_py(py)
                    );
                };
                if r.sampler == SamplerKind::Manual {
                    return Err(PyValueError::new_err(format!(
                        "resource {name:?} has no sampler (sampler = \"manual\"): feed it with engine.sample()"
                    )));
                }
                vec![name.to_owned()]
            }
            None => self
                .core
                .samplers()
                .iter()
                .map(|s| s.config.name.clone())
                .collect(),
        };
        let core = Arc::clone(&self.core);
        let results = py.detach(move || core.sample_now(&names));
        Ok(results.into_iter().collect())
    }

    /// Ask the configured presence backend once (logind, command, manual,
    /// none, as the daemon does) and apply its answer: `True` present,
    /// `False` away, `None` unknown. Runs with the GIL released.
    fn poll_presence(&self, py: Python<'_>) -> PyResult<Option<bool>> {
        let core = Arc::clone(&self.core);
        let presence = py
            .detach(move || core.poll_presence())
            .map_err(pyo3::exceptions::PyRuntimeError::new_err)?;
        Ok(match presence {
            OwnerPresence::Present => Some(true),
            OwnerPresence::Away => Some(false),
            OwnerPresence::Unknown => None,
        })
    }

    /// The presence backend the configuration selects, as `/status` names it.
    #[getter]
    fn presence_backend(&self) -> String {
        self.core.presence.name().to_owned()
    }

    /// The change generation (asyncio waker).
    fn _generation(&self) -> u64 {
        self.core.generation()
    }

    /// Wait, with the GIL released, until a sample lands or the wait line
    /// moves after generation `seen`, or `timeout_s` passes; returns the
    /// generation then (asyncio waker).
    fn _wait_change(&self, py: Python<'_>, seen: u64, timeout_s: f64) -> u64 {
        let timeout = Duration::from_secs_f64(timeout_s.clamp(0.0, 1.0));
        let core = Arc::clone(&self.core);
        py.detach(move || core.wait_change(seen, timeout))
    }

    /// The lesson an observation of `upstream` taken at `at` teaches (RES-07):
    /// `{model, kind, finished_at}` of the last request of a known kind that
    /// finished before `at` with nothing admitted on its resources since, or
    /// `None`. Taken once.
    #[pyo3(signature = (upstream, at = None))]
    fn take_lesson<'py>(
        &self,
        py: Python<'py>,
        upstream: &str,
        at: Option<f64>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let lesson = self.with(py, |g| {
            let up = g.upstream(upstream)?;
            let t = g.moment(&self.core.clock, at)?;
            Ok(g.engine.take_lesson(up, t))
        })?;
        lesson
            .map(|l| {
                let d = PyDict::new(py);
                d.set_item("model", l.model)?;
                d.set_item("kind", l.kind)?;
                d.set_item("finished_at", secs(l.finished_at))?;
                Ok(d)
            })
            .transpose()
    }

    /// The reply came; the caller now tracks the job at the upstream.
    fn start_tracking(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = id_arg(id)?;
        self.with(py, |g| Ok(g.engine.start_tracking(entry_id(&id)?)?))
    }

    /// End a forwarding or tracking job. Returns the resources to sample now
    /// (empty when the entry turned held).
    #[pyo3(signature = (id, outcome = "completed", reason = None, *, at = None))]
    fn release(
        &self,
        py: Python<'_>,
        id: &Bound<'_, PyAny>,
        outcome: &str,
        reason: Option<&str>,
        at: Option<f64>,
    ) -> PyResult<Vec<String>> {
        let id = id_arg(id)?;
        let outcome = parse_outcome(outcome, reason)?;
        self.with(py, |g| {
            let eid = entry_id(&id)?;
            let m = g.moment(&self.core.clock, at)?;
            g.engine.release(eid, outcome, m)?;
            // What to sample now is what the release queued (none when held).
            Ok(self.core.drain_effects(g))
        })
    }

    /// Release a held entry on an administrator's confirmation (`by="administrator"`)
    /// or tracking proof (`by="tracking"`). Returns the resources to sample now.
    #[pyo3(signature = (id, *, by = "administrator", at = None))]
    fn release_held(
        &self,
        py: Python<'_>,
        id: &Bound<'_, PyAny>,
        by: &str,
        at: Option<f64>,
    ) -> PyResult<Vec<String>> {
        let id = id_arg(id)?;
        let by = match by {
            "administrator" => HeldRelease::AdministratorConfirmed,
            "tracking" => HeldRelease::TrackingProof,
            other => {
                return Err(PyValueError::new_err(format!(
                    "by must be 'administrator' or 'tracking', not {other:?}"
                )));
            }
        };
        self.with(py, |g| {
            let eid = entry_id(&id)?;
            let m = g.moment(&self.core.clock, at)?;
            g.engine.release_held(eid, by, m)?;
            Ok(self.core.drain_effects(g))
        })
    }

    /// What the presence backend says: `True` present, `False` away, `None` unknown.
    /// Under `presence = "manual"` the manual backend remembers it, so a
    /// `Driver` keeps it; under the other backends a running `Driver`'s next
    /// presence poll (within a second) replaces it.
    fn set_owner_present(&self, present: Option<bool>) {
        let presence = match present {
            Some(true) => OwnerPresence::Present,
            Some(false) => OwnerPresence::Away,
            None => OwnerPresence::Unknown,
        };
        self.core.set_manual(presence);
        self.core.set_owner(presence);
    }

    /// The lending switch.
    fn set_lending(&self, enabled: bool) {
        self.lock().engine.set_lending(enabled);
    }

    /// A resource's switch.
    fn set_resource_enabled(&self, py: Python<'_>, name: &str, enabled: bool) -> PyResult<()> {
        self.with(py, |g| Ok(g.engine.set_resource_enabled(name, enabled)?))
    }

    /// The pressure verdict for a resource: `None` admits, a reason refuses.
    /// `cleared` says whether the reading would let a pressure reclaim stand
    /// down (fresh, calibrated, below threshold, not rising: RECL-06); by
    /// default only an admitting verdict clears.
    #[pyo3(signature = (resource, refuses = None, *, cleared = None))]
    fn set_pressure(
        &self,
        py: Python<'_>,
        resource: &str,
        refuses: Option<String>,
        cleared: Option<bool>,
    ) -> PyResult<()> {
        let cleared = cleared.unwrap_or(refuses.is_none());
        let verdict = refuses.map_or(PressureVerdict::Admits, PressureVerdict::Refuses);
        self.with(py, |g| {
            Ok(g.engine.set_pressure_reading(resource, verdict, cleared)?)
        })
    }

    /// A pressure edge on a resource (engaged, uncalibrated, or unavailable
    /// past the gap limit): the next `reclaim_step` reclaims the work that
    /// depends on it (PRES-01..03).
    fn pressure_trigger(&self, py: Python<'_>, resource: &str, why: &str) -> PyResult<()> {
        self.with(py, |g| Ok(g.engine.pressure_trigger(resource, why)?))
    }

    /// A GPU's calibrated baseline for `attendance` (`"attended"` or
    /// `"unattended"`), as `vacancyd calibrate-pressure` saves it: the
    /// owner's normal utilization (percent) and memory (MiB).
    fn set_pressure_baseline(
        &self,
        py: Python<'_>,
        resource: &str,
        attendance: &str,
        util_pct: u8,
        memory_mib: u64,
    ) -> PyResult<()> {
        self.pressure_gpu(py, resource)?;
        let attendance = attendance_arg(attendance)?;
        let load = owner_load(util_pct, memory_mib)?;
        let mut g = self.lock();
        let baseline = g.baselines.entry(resource.to_owned()).or_default();
        baseline.set(attendance, load);
        let baseline = *baseline;
        if let Some(t) = g.trackers.get_mut(resource) {
            t.set_baseline(baseline);
        }
        Ok(())
    }

    /// A good sample of the owner's load on a GPU (every process's use but
    /// the lent servers'), taken while the owner was `attendance`. Judges it
    /// with the daemon's pressure rules (PRES-01..13) and applies the result
    /// to admission and reclaims; returns `{resource, reading, refuses,
    /// cleared, trigger}`.
    #[pyo3(signature = (resource, util_pct, memory_mib, attendance, at = None))]
    fn pressure_sample(
        &self,
        py: Python<'_>,
        resource: &str,
        util_pct: u8,
        memory_mib: u64,
        attendance: &str,
        at: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        let observation = Observation::Sample(
            owner_load(util_pct, memory_mib)?,
            attendance_arg(attendance)?,
        );
        self.pressure_poll(py, resource, observation, at)
    }

    /// No good sample of a GPU this poll: `reason` says why the read failed,
    /// or `None` when owner presence is unknown and nothing was sampled
    /// (PRES-04, PRES-10, PRES-11). Returns what `pressure_sample` returns.
    #[pyo3(signature = (resource, reason = None, at = None))]
    fn pressure_miss(
        &self,
        py: Python<'_>,
        resource: &str,
        reason: Option<String>,
        at: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        let miss = reason.map_or(Miss::PresenceUnknown, Miss::ReadFailed);
        self.pressure_poll(py, resource, Observation::Miss(miss), at)
    }

    /// Advance reclaims (RECL-01..50): owner and pressure edges start them,
    /// cleared triggers stand them down, deadlines let them act. Returns the
    /// commands as dicts with `kind` `started` | `act` | `stood_down` |
    /// `finished`; after doing what an `act` asks (cancel `cancel`, then
    /// unload when `unload`), call `reclaim_done(id)`.
    #[pyo3(signature = (at = None))]
    fn reclaim_step(&self, py: Python<'_>, at: Option<f64>) -> PyResult<Py<PyAny>> {
        let value = self.with(py, |g| {
            let m = g.moment(&self.core.clock, at)?;
            let commands = g.engine.reclaim_step(m);
            let name = |u| g.engine.upstream_name(u).unwrap_or_default().to_owned();
            let ids = |v: &[EntryId]| -> Vec<String> {
                v.iter().map(ToString::to_string).collect()
            };
            let list: Vec<serde_json::Value> = commands
                .iter()
                .map(|c| match c {
                    ReclaimCommand::Started {
                        id,
                        upstream,
                        trigger,
                        mode,
                        deadline,
                        entries,
                    } => serde_json::json!({
                        "kind": "started", "id": id.to_string(), "upstream": name(*upstream),
                        "trigger": trigger.describe(), "mode": mode.as_str(),
                        "deadline": deadline.map(secs), "entries": ids(entries),
                    }),
                    ReclaimCommand::Act {
                        id,
                        upstream,
                        cancel,
                        unload,
                        held,
                        cancel_held,
                    } => serde_json::json!({
                        "kind": "act", "id": id.to_string(), "upstream": name(*upstream),
                        "cancel": ids(cancel), "unload": unload,
                        "held": held.iter().map(|(e, why)| serde_json::json!([e.to_string(), why])).collect::<Vec<_>>(),
                        "cancel_held": ids(cancel_held),
                    }),
                    ReclaimCommand::StoodDown {
                        id,
                        upstream,
                        elapsed,
                    } => serde_json::json!({
                        "kind": "stood_down", "id": id.to_string(), "upstream": name(*upstream),
                        "elapsed": elapsed.as_secs_f64(),
                    }),
                    ReclaimCommand::Finished {
                        id,
                        upstream,
                        elapsed,
                    } => serde_json::json!({
                        "kind": "finished", "id": id.to_string(), "upstream": name(*upstream),
                        "elapsed": elapsed.as_secs_f64(),
                    }),
                })
                .collect();
            Ok(serde_json::Value::Array(list))
        })?;
        json_to_py(py, &value)
    }

    /// The reclaim `id` did what its `act` asked: it ends, and its hold with
    /// it; new work waits for a fresh capacity sample (RECL-45).
    #[pyo3(signature = (id, at = None))]
    fn reclaim_done(&self, py: Python<'_>, id: &str, at: Option<f64>) -> PyResult<()> {
        self.with(py, |g| {
            let m = g.moment(&self.core.clock, at)?;
            let n = id
                .strip_prefix("reclaim-")
                .and_then(|n| n.parse::<u64>().ok())
                .ok_or_else(|| EngineError::UnknownReclaim(id.to_owned()))?;
            Ok(g.engine.reclaim_done(ReclaimId(n), m)?)
        })
    }

    /// The engine's status as plain dicts and lists (the daemon's `/status` engine part).
    #[pyo3(signature = (at = None))]
    fn status(&self, py: Python<'_>, at: Option<f64>) -> PyResult<Py<PyAny>> {
        let value = self.with(py, |g| {
            let m = g.moment(&self.core.clock, at)?;
            Ok(serde_json::to_value(g.engine.status(m)).unwrap_or_default())
        })?;
        json_to_py(py, &value)
    }

    fn __repr__(&self) -> String {
        let g = self.lock();
        format!(
            "Engine(lending={}, owner={}, entries={})",
            g.engine.lending(),
            g.engine.owner().as_str(),
            g.engine.entry_count()
        )
    }
}

/// The borrower table of a `borrowers=` dict (`None`: off).
fn borrowers_of(v: Option<&Bound<'_, PyAny>>) -> PyResult<Option<vacancy::engine::BorrowersSpec>> {
    match v {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => crate::borrowers::spec_of(&crate::convert::py_to_json(v)?)
            .map(Some)
            .map_err(PyValueError::new_err),
    }
}

/// Milliseconds since 1970-01-01 00:00 UTC on the system clock.
fn unix_ms_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

// ---- Reservation -----------------------------------------------------------

/// An admitted job. It holds its resources until released; as a context
/// manager a clean exit releases it as completed and an exception turns it held.
#[pyclass(frozen, module = "vacancy._vacancy")]
pub struct Reservation {
    /// The work entry ID (a UUID string).
    #[pyo3(get)]
    id: String,
    /// The upstream's name.
    #[pyo3(get)]
    upstream: String,
    /// The model, when known.
    #[pyo3(get)]
    model: Option<String>,
    /// Whether resident-model credit applied (RES-01).
    #[pyo3(get)]
    resident_credit: bool,
    /// When it was admitted, in seconds on the engine's timeline.
    #[pyo3(get)]
    admitted_at: f64,
    charges: Vec<vacancy::engine::Charge>,
    engine: Py<Engine>,
    /// What the `with` block's release returned: the resources to sample now.
    to_sample: std::sync::Mutex<Vec<String>>,
}

impl Reservation {
    fn new(r: vacancy::Reservation, engine: Py<Engine>) -> Self {
        Reservation {
            id: r.id.to_string(),
            upstream: r.upstream,
            model: r.model,
            resident_credit: r.resident_credit,
            admitted_at: secs(r.admitted_at),
            charges: r.charges,
            engine,
            to_sample: std::sync::Mutex::new(Vec::new()),
        }
    }
}

#[pymethods]
impl Reservation {
    /// The resources it holds, primary first.
    #[getter]
    fn resources(&self) -> Vec<String> {
        self.charges.iter().map(|c| c.resource.clone()).collect()
    }

    /// What it charged: `{resource, required_mib, free_mib}` per resource.
    #[getter]
    fn charges<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for c in &self.charges {
            let d = PyDict::new(py);
            d.set_item("resource", &c.resource)?;
            d.set_item("required_mib", c.required_mib)?;
            d.set_item("free_mib", c.free_mib)?;
            list.append(d)?;
        }
        Ok(list)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// A clean exit releases the work as completed; an exception turns it
    /// held (uncertain). An entry already released or held is left as it is.
    /// The resources the `with` block's release asked to sample now (what
    /// `release()` returns): empty before the block ends, when the entry
    /// turned held, or was released inside the block. A running `Driver`
    /// samples them by itself.
    #[getter]
    fn to_sample(&self) -> Vec<String> {
        self.to_sample
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyType>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let outcome = match exc_type {
            None => ReleaseOutcome::Completed,
            Some(t) => ReleaseOutcome::Uncertain(format!(
                "{} raised inside the reservation's with block",
                t.name()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "an exception".to_owned())
            )),
        };
        let engine = self.engine.get();
        let id = self.id.clone();
        let sample = engine.with(py, |g| {
            let eid = entry_id(&id)?;
            match g.engine.phase(eid) {
                Some(Phase::Forwarding | Phase::Tracking | Phase::Verifying) => {
                    let m = g.current(&engine.core.clock);
                    g.engine.release(eid, outcome, m)?;
                    Ok(engine.core.drain_effects(g))
                }
                Some(Phase::Held) | None => Ok(Vec::new()),
            }
        })?;
        *self
            .to_sample
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = sample;
        Ok(())
    }

    fn __repr__(&self) -> String {
        let model = self
            .model
            .as_ref()
            .map_or_else(|| "None".to_owned(), |m| format!("{m:?}"));
        format!(
            "Reservation(id={:?}, upstream={:?}, model={model}, resources={:?})",
            self.id,
            self.upstream,
            self.resources()
        )
    }
}
