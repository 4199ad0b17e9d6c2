//! The state an `Engine` shares with its `Driver`'s threads: the engine
//! behind its lock, the wakeups of waiting callers, the configured samplers
//! and presence backend. It feeds the daemon's own sampling and presence
//! loops (`vacancy::shell::loops::sampling`, `vacancy::shell::loops::presence_watch`),
//! which see it as a [`LoopSink`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use vacancy::config::{Config as VConfig, ResourceConfig, SamplerKind};
use vacancy::engine::{Effect, OwnerPresence};
use vacancy::presence::{ManualPresence, PresenceBackend};
use vacancy::shell::loops::sampling;
use vacancy::shell::loops::sink::{LoopSink, SampleRecorder};
use vacancy::{CapacitySample, Moment, MonotonicClock, Resource, SampleError};

use crate::inner::{Inner, Timeline};

/// Where login seats are listed on a systemd machine (as the daemon looks).
const SEATS_DIR: &str = "/run/systemd/seats";

/// One configured resource the driver samples.
pub(crate) struct Sampled {
    pub(crate) config: ResourceConfig,
    pub(crate) sampler: Arc<dyn Resource>,
}

/// What `Engine` and `Driver` share.
pub(crate) struct Core {
    inner: Mutex<Inner>,
    /// Notified on every sample and every moved wait line, for callers waiting
    /// in `admit()` and the asyncio waker. Always notified with `inner`'s lock
    /// held ([`Core::notify_changed`]): a waiter checks its condition and
    /// starts waiting under that lock, so no notification falls between the
    /// two (issue 30).
    pub(crate) changed: Condvar,
    /// Bumped with every notification of `changed`, under `inner`'s lock, so
    /// a waiter can tell a change from a timeout.
    generation: AtomicU64,
    pub(crate) clock: MonotonicClock,
    /// Pulled when a job on the resource ends (ADM-05): the driver samples it now.
    triggers: HashMap<String, Arc<Notify>>,
    /// The configured resources, in order; their samplers are built on first use.
    resources: Vec<ResourceConfig>,
    samplers: OnceLock<Vec<Sampled>>,
    /// The configured presence backend, as the daemon selects it.
    pub(crate) presence: Arc<dyn PresenceBackend>,
    /// `presence = "manual"`: what `set_owner_present` says, read by the backend.
    pub(crate) manual: Option<ManualPresence>,
    /// The runtime `sample_now` and `poll_presence` run the samplers on.
    runtime: OnceLock<Result<tokio::runtime::Runtime, String>>,
}

impl Core {
    pub(crate) fn new(inner: Inner, config: &VConfig) -> Self {
        let presence = vacancy::presence::from_owner(&config.owner, Path::new(SEATS_DIR));
        Core {
            inner: Mutex::new(inner),
            changed: Condvar::new(),
            generation: AtomicU64::new(0),
            clock: MonotonicClock::new(),
            triggers: config
                .resources
                .iter()
                .map(|r| (r.name.clone(), Arc::new(Notify::new())))
                .collect(),
            resources: config.resources.clone(),
            samplers: OnceLock::new(),
            presence: Arc::from(presence.backend),
            manual: presence.manual,
            runtime: OnceLock::new(),
        }
    }

    /// The engine, with its pending effects handled.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        self.drain_effects(&mut g);
        g
    }

    /// Python keeps no ledger and runs no reclaim loop of its own: its queue
    /// is emptied rather than left to grow. A post-job sample request pulls
    /// the resource's trigger (a running driver samples it at once) and is
    /// returned, in the engine's order, so that `release` can tell its caller
    /// what to sample; a moved wait line wakes the callers waiting in `admit`.
    pub(crate) fn drain_effects(&self, g: &mut Inner) -> Vec<String> {
        let mut wake = false;
        let mut sample = Vec::new();
        while let Some(effect) = g.engine.poll_effect() {
            match effect {
                Effect::WakeWaiters => wake = true,
                Effect::Sample(resource) => {
                    if let Some(t) = self.triggers.get(&resource) {
                        t.notify_one();
                    }
                    sample.push(resource);
                }
                // No ledger here: Python's engine persists nothing.
                Effect::Persist(_)
                | Effect::MarkHeld { .. }
                | Effect::RewriteRef { .. }
                | Effect::Forget(_) => {}
                // No observation or reclaim loop runs in Python.
                Effect::Observe(_) | Effect::WakeReclaims => {}
                // No owner's record either: `status()["borrowers"]` has the totals.
                Effect::Account(_) => {}
                // `Effect` is non_exhaustive: one this version does not know
                // is said in the log, never dropped silently (issue 32 item 2).
                other => tracing::warn!(
                    target: "vacancy::effects",
                    effect = ?other,
                    "the engine asked for an effect these bindings do not know; it was not carried out"
                ),
            }
        }
        if wake {
            self.notify_changed(g);
        }
        sample
    }

    /// Wake every caller waiting for a change. Takes the engine's state as
    /// proof that its lock is held: a notification outside it could fall
    /// between a waiter's check and its wait, and be missed.
    pub(crate) fn notify_changed(&self, _locked: &mut Inner) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_all();
    }

    /// The current change generation.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Block (call with the GIL released) until the generation moves past
    /// `seen` or `timeout` passes; returns the generation then. A change made
    /// after `seen` was read is never missed: the generation moves under the
    /// lock this checks and waits under.
    pub(crate) fn wait_change(&self, seen: u64, timeout: Duration) -> u64 {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if self.generation() != seen {
            return self.generation();
        }
        let (g, _) = self
            .changed
            .wait_timeout_while(g, timeout, |_| self.generation() == seen)
            .unwrap_or_else(PoisonError::into_inner);
        drop(g);
        self.generation()
    }

    /// Fix the real timeline for a caller that reads the clock behind the
    /// scenes (the driver, `sample_now`, `poll_presence`, `admit_async`).
    pub(crate) fn require_real_time(&self, what: &str) -> Result<(), crate::errors::Error> {
        let mut g = self.lock();
        match g.timeline {
            Timeline::Simulated => Err(crate::errors::Error::Timeline(format!(
                "{what} runs on the engine's monotonic clock, but this engine runs on simulated time \
                 (an earlier call gave at=/now=): use a separate Engine on the real clock"
            ))),
            Timeline::Real | Timeline::Unset => {
                g.timeline = Timeline::Real;
                Ok(())
            }
        }
    }

    /// The configured samplers, built once (as the daemon builds them); a
    /// `manual` resource has none.
    pub(crate) fn samplers(&self) -> &[Sampled] {
        self.samplers.get_or_init(|| {
            self.resources
                .iter()
                .filter(|r| r.sampler != SamplerKind::Manual)
                .map(|r| Sampled {
                    config: r.clone(),
                    sampler: sampling::sampler_for(r, self.clock),
                })
                .collect()
        })
    }

    /// Whether `resource` is configured, and fed by hand (`manual`).
    pub(crate) fn resource_config(&self, resource: &str) -> Option<&ResourceConfig> {
        self.resources.iter().find(|r| r.name == resource)
    }

    /// A small runtime for one-off samples and presence polls.
    pub(crate) fn runtime(&self) -> Result<&tokio::runtime::Runtime, String> {
        self.runtime
            .get_or_init(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot start the sampling runtime: {e}"))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// What the owner said, for `set_owner_present`: the manual backend
    /// remembers it, so a driver's presence loop reads it back.
    pub(crate) fn set_manual(&self, presence: OwnerPresence) {
        if let Some(m) = &self.manual {
            match presence {
                OwnerPresence::Present => m.set(true),
                OwnerPresence::Away => m.set(false),
                OwnerPresence::Unknown => m.clear(),
            }
        }
    }
}

impl SampleRecorder for Core {
    fn clock(&self) -> MonotonicClock {
        self.clock
    }

    fn record_sample(
        &self,
        resource: &str,
        result: Result<CapacitySample, SampleError>,
        started: Moment,
    ) {
        {
            let mut g = self.lock();
            if g.timeline == Timeline::Simulated {
                return; // the driver refuses simulated engines; never mix
            }
            g.timeline = Timeline::Real;
            g.latest = g.latest.max(self.clock.now());
            // A failure makes the capacity unknown, with the reason in
            // status() and in refusals; an unknown name cannot come from
            // the configured samplers.
            let _ = match &result {
                Ok(sample) => g.engine.record_sample(resource, *sample),
                Err(err) => g
                    .engine
                    .record_sample_failure(resource, started, &err.to_string()),
            };
            self.drain_effects(&mut g);
            self.notify_changed(&mut g);
        }
        // After the lock: the record goes to Python's logging (lib.rs).
        if let Err(err) = &result {
            tracing::warn!(target: "vacancy::sampling", resource, error = %err, "capacity sample failed; the resource's capacity is unknown");
        }
    }
}

impl LoopSink for Core {
    fn sample_trigger(&self, resource: &str) -> Option<Arc<Notify>> {
        self.triggers.get(resource).cloned()
    }

    fn set_owner(&self, presence: OwnerPresence) -> bool {
        let mut g = self.lock();
        let before = g.engine.owner();
        g.engine.set_owner(presence);
        self.drain_effects(&mut g);
        before != presence
    }
}

/// One-off calls outside the driver's loops.
impl Core {
    /// Sample `names` once with their configured samplers (outside the driver's
    /// loops); returns each name with why its sample failed, or `None`.
    pub(crate) fn sample_now(&self, names: &[String]) -> Vec<(String, Option<String>)> {
        let rt = match self.runtime() {
            Ok(rt) => rt,
            Err(why) => {
                return names
                    .iter()
                    .map(|n| (n.clone(), Some(why.clone())))
                    .collect();
            }
        };
        rt.block_on(async {
            let mut out = Vec::new();
            for s in self
                .samplers()
                .iter()
                .filter(|s| names.contains(&s.config.name))
            {
                let timeout =
                    sampling::sample_timeout(std::time::Duration::from_millis(s.config.poll_ms));
                let r = sampling::sample_once(self, &*s.sampler, timeout).await;
                out.push((s.config.name.clone(), r.err()));
            }
            out
        })
    }

    /// Ask the presence backend once and apply its answer.
    pub(crate) fn poll_presence(&self) -> Result<vacancy::engine::OwnerPresence, String> {
        let rt = self.runtime()?;
        let presence = rt.block_on(self.presence.presence());
        self.set_owner(presence);
        Ok(presence)
    }
}
