//! `Driver`: the daemon's sampling, post-job sampling and presence loops on a
//! Rust thread of their own, feeding an embedded engine.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyType;
use tokio::sync::watch;
use tokio::task::JoinSet;
use vacancy::shell::loops::sink::LoopSink;
use vacancy::shell::loops::{presence_watch, sampling};

use crate::core::Core;
use crate::engine::Engine;
use crate::errors::IntoPyResult;

struct Running {
    stop: watch::Sender<bool>,
    thread: JoinHandle<()>,
}

/// Runs the configured samplers and presence backend for an `Engine` on a
/// Rust thread, as `vacancyd` does: each resource every `poll_ms` and right
/// after a job on it ends, presence every second. It never takes the GIL.
#[pyclass(frozen, module = "vacancy._vacancy")]
pub struct Driver {
    core: Arc<Core>,
    running: Mutex<Option<Running>>,
}

impl Driver {
    fn stop_running(&self) -> Option<JoinHandle<()>> {
        let running = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        let _ = running.stop.send(true);
        Some(running.thread)
    }
}

/// The driver thread: first samples and presence (reported on `ready`),
/// then the loops until `stop` turns true.
fn run(core: Arc<Core>, stop: watch::Receiver<bool>, ready: mpsc::Sender<Result<(), String>>) {
    // This thread and its runtime's blocking pool never wait for the GIL,
    // not even to log.
    crate::log_bridge::queue_this_thread();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_start(crate::log_bridge::queue_this_thread)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(format!("cannot start the driver's runtime: {e}")));
            return;
        }
    };
    rt.block_on(async move {
        let loops: Vec<_> = core
            .samplers()
            .iter()
            .map(|s| {
                let poll = std::time::Duration::from_millis(s.config.poll_ms);
                (Arc::clone(&s.sampler), poll, sampling::sample_timeout(poll))
            })
            .collect();
        // One sample of each and one presence reading before the caller goes
        // on, so its first admit is not refused merely because nothing ran yet.
        for (sampler, _, timeout) in &loops {
            let _ = sampling::sample_once(&*core, &**sampler, *timeout).await;
        }
        let presence = core.presence.presence().await;
        core.set_owner(presence);
        let _ = ready.send(Ok(()));
        let mut tasks = JoinSet::new();
        for (sampler, poll, timeout) in loops {
            tasks.spawn(sampling::sample_loop(
                Arc::clone(&core),
                sampler,
                poll,
                timeout,
                stop.clone(),
            ));
        }
        tasks.spawn(presence_watch::presence_loop(
            Arc::clone(&core),
            Arc::clone(&core.presence),
            presence_watch::PRESENCE_EVERY,
            None,
            stop.clone(),
        ));
        while tasks.join_next().await.is_some() {}
    });
}

#[pymethods]
impl Driver {
    /// Start driving `engine`: returns once every configured resource has been
    /// sampled once and presence read once.
    #[new]
    fn new(py: Python<'_>, engine: &Bound<'_, Engine>) -> PyResult<Self> {
        let core = Arc::clone(&engine.get().core);
        core.require_real_time("a Driver").py(py)?;
        let (stop, stop_rx) = watch::channel(false);
        let (ready_tx, ready_rx) = mpsc::channel();
        let c = Arc::clone(&core);
        let thread = std::thread::Builder::new()
            .name("vacancy-driver".to_owned())
            .spawn(move || run(c, stop_rx, ready_tx))
            .map_err(|e| PyRuntimeError::new_err(format!("cannot start the driver thread: {e}")))?;
        let ready = py.detach(move || ready_rx.recv());
        match ready {
            Ok(Ok(())) => Ok(Driver {
                core,
                running: Mutex::new(Some(Running { stop, thread })),
            }),
            Ok(Err(why)) => {
                let _ = py.detach(|| thread.join());
                Err(PyRuntimeError::new_err(why))
            }
            Err(_) => {
                let _ = py.detach(|| thread.join());
                Err(PyRuntimeError::new_err(
                    "the driver thread stopped before its first samples",
                ))
            }
        }
    }

    /// Whether the loops run.
    #[getter]
    fn running(&self) -> bool {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|r| !r.thread.is_finished())
    }

    /// The resources it samples (every configured one but the `manual` ones).
    #[getter]
    fn resources(&self) -> Vec<String> {
        self.core
            .samplers()
            .iter()
            .map(|s| s.config.name.clone())
            .collect()
    }

    /// Stop the loops and wait for the thread (at most one sample's timeout).
    /// Stopping twice does nothing.
    fn stop(&self, py: Python<'_>) {
        if let Some(thread) = self.stop_running() {
            let _ = py.detach(|| thread.join());
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyType>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) {
        self.stop(py);
    }

    fn __repr__(&self) -> String {
        format!(
            "Driver(resources={:?}, running={})",
            self.resources(),
            if self.running() { "True" } else { "False" }
        )
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The thread never needs the GIL, so joining here cannot deadlock.
        if let Some(thread) = self.stop_running() {
            let _ = thread.join();
        }
    }
}
