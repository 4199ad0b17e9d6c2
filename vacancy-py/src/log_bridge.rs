//! vacancy's log records into Python's `logging`, without ever making a
//! Rust thread wait for the GIL.
//!
//! `pyo3-log` hands a record to Python under the GIL. A Python call into
//! vacancy hands its records over at once, in order with Python's own. The
//! driver's threads — its runtime sampling, watching presence, observing,
//! and that runtime's blocking pool — are marked ([`queue_this_thread`]) and
//! only queue their records; one forwarding thread takes the GIL and hands
//! the queue over. So a Python thread that keeps the GIL for seconds delays
//! the driver's log lines, never the driver
//! (`test_the_driver_never_needs_the_gil`).

use std::cell::Cell;

use std::sync::Mutex;
use std::sync::mpsc::{Receiver, Sender, channel};

/// A record with everything it borrowed copied, to cross to the forwarder.
struct Owned {
    level: log::Level,
    target: String,
    message: String,
    module_path: Option<String>,
    file: Option<String>,
    line: Option<u32>,
}

impl Owned {
    fn of(record: &log::Record<'_>) -> Self {
        Owned {
            level: record.level(),
            target: record.target().to_owned(),
            message: record.args().to_string(),
            module_path: record.module_path().map(str::to_owned),
            file: record.file().map(str::to_owned),
            line: record.line(),
        }
    }

    fn hand_to(&self, logger: &dyn log::Log) {
        logger.log(
            &log::Record::builder()
                .level(self.level)
                .target(&self.target)
                .args(format_args!("{}", self.message))
                .module_path(self.module_path.as_deref())
                .file(self.file.as_deref())
                .line(self.line)
                .build(),
        );
    }
}

/// The `log` logger vacancy-py installs: `inner` (pyo3-log) at once, or
/// through the forwarding thread from a thread marked by
/// [`queue_this_thread`].
pub(crate) struct Bridge {
    inner: &'static pyo3_log::Logger,
    /// Records from marked threads; `None` if the forwarding thread could
    /// not be started (then they are handed over inline).
    queue: Option<Mutex<Sender<Owned>>>,
    max_level: log::LevelFilter,
}

impl Bridge {
    /// A bridge over `inner`, passing records at `max_level` and above to it.
    pub(crate) fn new(inner: pyo3_log::Logger, max_level: log::LevelFilter) -> Self {
        let inner: &'static pyo3_log::Logger = Box::leak(Box::new(inner));
        let (tx, rx) = channel::<Owned>();
        let started = std::thread::Builder::new()
            .name("vacancy-log".to_owned())
            .spawn(move || forward(inner, &rx))
            .is_ok();
        Bridge {
            inner,
            queue: started.then(|| Mutex::new(tx)),
            max_level,
        }
    }
}

fn forward(inner: &'static pyo3_log::Logger, rx: &Receiver<Owned>) {
    while let Ok(record) = rx.recv() {
        record.hand_to(inner);
    }
}

thread_local! {
    /// Whether this thread's records go through the forwarding thread.
    static QUEUED: Cell<bool> = const { Cell::new(false) };
}

/// From now on, this thread's log records are queued for the forwarding
/// thread: for threads that must never wait for the GIL.
pub(crate) fn queue_this_thread() {
    QUEUED.with(|q| q.set(true));
}

fn queued_here() -> bool {
    QUEUED.try_with(Cell::get).unwrap_or(false)
}

impl log::Log for Bridge {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        // Python's levels are read where the record is handed over, under
        // the GIL; here only the static bound and the target.
        metadata.level() <= self.max_level && metadata.target().starts_with("vacancy")
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        match &self.queue {
            Some(queue) if queued_here() => {
                let sent = match queue.lock() {
                    Ok(tx) => tx.send(Owned::of(record)),
                    Err(poisoned) => poisoned.into_inner().send(Owned::of(record)),
                };
                // The forwarder is gone only if its thread died; nothing to
                // hand the record to then.
                drop(sent);
            }
            _ => self.inner.log(record),
        }
    }

    fn flush(&self) {}
}
