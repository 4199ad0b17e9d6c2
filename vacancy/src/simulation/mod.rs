//! Deterministic simulation of a lender (issue 18 item 7; TigerBeetle's VOPR
//! and FoundationDB's simulator are the models).
//!
//! One seeded scheduler drives the real [`Engine`] and the real [`Ledger`]
//! on an in-memory disk ([`MemDisk`]) under simulated time, with simulated
//! upstreams whose jobs finish, fail to connect, break off or hang; owner
//! presence and GPU pressure edges, the lending switch, capacity samples,
//! observations, reclaims, administrator releases, compactions, and crashes
//! at any disk call followed by a restart from what the disk kept.
//!
//! The scheduler plays the shell's part as the lender does: a reservation is
//! forwarded only once its record is durable (REC-01), a release is queued
//! after the engine's, an administrator release frees the entry only once
//! its record is durable, and after a restart every recovered entry is
//! restored held (REC-02).
//!
//! # Behavior
//!
//! After every step the scheduler checks:
//! - never two jobs on one resource, counted at the simulated upstreams
//!   (ADM-01, ADM-03);
//! - every job an upstream still runs has its entry in the engine: no
//!   release without proof (DONE-01..04, HELD-06);
//! - the engine's entries and phases are the scheduler's own record's.
//!
//! At every admission: the owner was away for host-scoped work (OWN-01,
//! SCOPE-02), lending was on, no resource was switched off or under pressure,
//! the sample decided on was fresh, taken after the resource's last job
//! (ADM-04), and the requirement fit above the reserve (MEM-01, MEM-05).
//!
//! After every crash: every entry whose record was acknowledged and whose
//! release was not comes back held; no entry whose release was acknowledged
//! comes back; no entry comes back twice (REC-01, REC-02, REC-04, REC-05).
//!
//! The same seed and step count give the same run, step for step: the
//! summary's digest says so. A violation names the seed, the step and the
//! last events, and `scripts/simulate SEED STEPS` replays it.

mod rng;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

pub use rng::Rng;

use crate::config::{OnOwnerReturn, OwnerScope};
use crate::engine::{
    CompletionMethod, Decision, Effect, Engine, EngineSpec, EntryId, HeldRelease, ModelObservation,
    ObservedModel, OwnerPresence, Phase, PressureVerdict, ReclaimCommand, Release, ReleaseOutcome,
    RequestReuse, ResidencyEvidence, ResourceSpec, UpstreamSpec, VisibleWork, WorkRequest,
};
use crate::ledger::Ledger;
use crate::ledger::disk::{Fault, FaultDisk, MemDisk};
use crate::ledger::store::{ReservationStore, StoreChange};
use crate::time::Moment;
use crate::traits::resource::{CapacitySample, ResourceKind};

const RESOURCES: [&str; 3] = ["gpu0", "gpu1", "ram"];
const RESERVES: [u64; 3] = [1000, 500, 2000];
const UPSTREAMS: [&str; 4] = ["comfy", "llama", "voice", "ollama"];
const MODELS: [&str; 3] = ["m0", "m1", "m2"];
const MAX_SAMPLE_AGE_MS: u64 = 5000;
const TOTAL_MIB: u64 = 48_000;
/// Where the ledger lives on the simulated disk.
const RECOVERY_DIR: &str = "/sim/recovery";

/// The resources (indices) each upstream's work reserves, primary first.
fn deps(upstream: usize) -> &'static [usize] {
    match upstream {
        0 => &[0, 2],
        1 => &[1, 2],
        2 => &[2],
        _ => &[0],
    }
}

/// Upstream 0 is ComfyUI-like (tracked, its own handle, cancel on the owner's
/// return, unloads on a veto); 1 llama-like (drain); 2 resource-scoped
/// (finish); 3 holds on close (nothing proves its end).
fn spec() -> EngineSpec {
    let resources = RESOURCES
        .iter()
        .zip(RESERVES)
        .map(|(name, reserve)| {
            let kind = if *name == "ram" {
                ResourceKind::Memory
            } else {
                ResourceKind::Gpu
            };
            let mut r = ResourceSpec::new(name, kind, reserve);
            r.max_sample_age = Duration::from_millis(MAX_SAMPLE_AGE_MS);
            r
        })
        .collect();
    let mut comfy = UpstreamSpec::new(UPSTREAMS[0], "gpu0", 6000);
    comfy.also_requires = vec!["ram".into()];
    comfy.requirements.insert("ram".into(), 4000);
    comfy.resident_min_free_mib = 500;
    comfy.reclaim.on_owner_return = OnOwnerReturn::Cancel;
    comfy.reclaim.yield_on_veto = true;
    let mut llama = UpstreamSpec::new(UPSTREAMS[1], "gpu1", 3000);
    llama.also_requires = vec!["ram".into()];
    llama.reclaim.drain_timeout = Duration::from_secs(20);
    let mut voice = UpstreamSpec::new(UPSTREAMS[2], "ram", 2000);
    voice.owner_scope = OwnerScope::Resource;
    voice.reclaim.on_owner_return = OnOwnerReturn::Finish;
    let ollama = UpstreamSpec::new(UPSTREAMS[3], "gpu0", 1000);
    EngineSpec {
        lending: true,
        resources,
        upstreams: vec![comfy, llama, voice, ollama],
    }
}

fn completion(upstream: usize) -> CompletionMethod {
    match upstream {
        0 => CompletionMethod::Tracked,
        3 => CompletionMethod::HeldOnClose,
        _ => CompletionMethod::ResponseEnd,
    }
}

/// A shell mistake planted on purpose, to show the checks catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mutation {
    /// None: the shell as the lender is.
    #[default]
    None,
    /// Forward a request whose record could not be written (breaks REC-01).
    ForwardUnrecorded,
    /// An administrator confirms a stop without looking (breaks HELD-04).
    AdminReleasesRunning,
    /// Admit with the owner's veto ignored: the engine is told the owner is
    /// away whatever the presence backend says (breaks OWN-01).
    IgnoreOwner,
}

/// One run's size and seed.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The seed: the same seed and steps give the same run.
    pub seed: u64,
    /// Scheduler steps.
    pub steps: u64,
    /// A planted shell mistake (tests of the checks).
    pub mutation: Mutation,
    /// Print every event to stderr as it happens.
    pub verbose: bool,
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// The seed.
    pub seed: u64,
    /// Steps run.
    pub steps: u64,
    /// Admissions.
    pub admitted: u64,
    /// Refusals (waits for a post-job sample included).
    pub refused: u64,
    /// Refusals by code (`wait`: a post-job sample was awaited).
    pub refusals: BTreeMap<String, u64>,
    /// Reservations whose record failed, so they were not forwarded.
    pub not_recorded: u64,
    /// Jobs the upstreams received.
    pub forwarded: u64,
    /// Releases on a proven end.
    pub completed: u64,
    /// Refused connects (nothing reached the upstream).
    pub not_forwarded: u64,
    /// Entries turned held.
    pub held: u64,
    /// Administrator and tracking-proof releases of held entries.
    pub held_released: u64,
    /// Reclaims that acted (cancelled or unloaded).
    pub reclaims_acted: u64,
    /// Explicit compactions asked for.
    pub compactions: u64,
    /// Simulated crashes and restarts.
    pub crashes: u64,
    /// Entries that came back held after a crash.
    pub recovered: u64,
    /// Calls the simulated disks saw.
    pub disk_calls: u64,
    /// Simulated time, in seconds.
    pub simulated_s: u64,
    /// Wall-clock time the run took.
    pub elapsed: Duration,
    /// A digest of every event, in order: equal digests, equal runs.
    pub digest: u64,
}

impl Summary {
    /// Steps per second of wall-clock time.
    pub fn steps_per_s(&self) -> f64 {
        self.steps as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {} steps {} ({:.0} steps/s, {:.1} s wall, {} s simulated)",
            self.seed,
            self.steps,
            self.steps_per_s(),
            self.elapsed.as_secs_f64(),
            self.simulated_s
        )?;
        writeln!(
            f,
            "admitted {} refused {} not_recorded {} forwarded {} completed {} not_forwarded {} held {} held_released {}",
            self.admitted,
            self.refused,
            self.not_recorded,
            self.forwarded,
            self.completed,
            self.not_forwarded,
            self.held,
            self.held_released
        )?;
        writeln!(
            f,
            "reclaims_acted {} compactions {} crashes {} recovered {} disk_calls {}",
            self.reclaims_acted, self.compactions, self.crashes, self.recovered, self.disk_calls
        )?;
        let by_code: Vec<String> = self
            .refusals
            .iter()
            .map(|(code, n)| format!("{code} {n}"))
            .collect();
        writeln!(f, "refusals: {}", by_code.join(", "))?;
        write!(f, "digest {:016x}", self.digest)
    }
}

/// An invariant that did not hold.
#[derive(Debug, Clone)]
pub struct Violation {
    /// The seed.
    pub seed: u64,
    /// The steps the run was asked for.
    pub steps: u64,
    /// The step it broke at.
    pub step: u64,
    /// What broke.
    pub what: String,
    /// The last events before it, oldest first.
    pub trace: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "invariant broken at step {} of seed {}: {}",
            self.step, self.seed, self.what
        )?;
        writeln!(f, "last events:")?;
        for e in &self.trace {
            writeln!(f, "  {e}")?;
        }
        write!(
            f,
            "reproduce: scripts/simulate {} {}",
            self.seed, self.steps
        )
    }
}

impl std::error::Error for Violation {}

/// Run one simulation.
///
/// # Errors
///
/// The first [`Violation`], with the seed, step and last events.
pub fn run(settings: Settings) -> Result<Summary, Violation> {
    let started = Instant::now();
    let mut sim = Simulation::new(settings).map_err(|what| Violation {
        seed: settings.seed,
        steps: settings.steps,
        step: 0,
        what,
        trace: Vec::new(),
    })?;
    for step in 0..settings.steps {
        sim.step = step;
        let result = sim.one_step().and_then(|()| sim.check());
        if let Err(what) = result {
            return Err(Violation {
                seed: settings.seed,
                steps: settings.steps,
                step,
                what,
                trace: sim.trace.iter().cloned().collect(),
            });
        }
    }
    sim.summary.steps = settings.steps;
    sim.summary.elapsed = started.elapsed();
    sim.summary.simulated_s = sim.now / 1000;
    sim.summary.disk_calls += sim.disk.ops();
    sim.summary.digest = sim.digest.finish();
    Ok(sim.summary)
}

/// What the scheduler did, for the digest and the trace.
#[derive(Debug, Hash)]
enum Event {
    Advance(u64),
    Sample {
        resource: usize,
        free: u64,
        lag: u64,
    },
    SampleFail {
        resource: usize,
    },
    Observe {
        upstream: usize,
        resident: Option<usize>,
        foreign: bool,
    },
    Owner(OwnerPresence),
    Lending(bool),
    Pressure {
        resource: usize,
        refuses: bool,
    },
    Admit {
        id: u128,
        upstream: usize,
        outcome: &'static str,
    },
    Progress {
        id: u128,
        what: &'static str,
    },
    Reclaim(String),
    AdminRelease {
        id: u128,
        running: bool,
        recorded: bool,
    },
    Compact,
    CrashArmed {
        at: u64,
    },
    FaultArmed {
        at: u64,
        errno: i32,
        torn: bool,
    },
    Restart {
        recovered: usize,
    },
}

/// How a forwarded job goes at its upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// The response (or, tracked, the history) ends cleanly at `at`.
    Finish,
    /// The response breaks off at `at`; the job runs on at the upstream
    /// until `stops`, or for ever.
    Break { stops: Option<u64> },
    /// The response never ends; only a reclaim's cut stops it.
    Hang,
}

/// A job the scheduler's shell knows about: its entry is in the engine.
#[derive(Debug, Clone)]
struct Known {
    upstream: usize,
    phase: Phase,
    /// When the response, or the tracked reply, changes next.
    due: u64,
    fate: Fate,
    /// For tracked work: the reply came and tracking started.
    replied: bool,
}

/// A job at a simulated upstream: it holds its resources while it runs.
#[derive(Debug, Clone)]
struct Running {
    upstream: usize,
    /// When it stops by itself; `None`: not until cancelled.
    stops: Option<u64>,
}

struct Simulation {
    settings: Settings,
    rng: Rng,
    step: u64,
    /// Simulated milliseconds.
    now: u64,
    /// When the simulated daemon last started.
    started: u64,
    engine: Engine,
    disk: MemDisk,
    /// The ledger's view of `disk`: fails a chosen write (ENOSPC, EIO).
    faults: FaultDisk,
    /// Store writes refused in a row: the owner restarts a daemon whose
    /// ledger stopped.
    refused_writes: u32,
    ledger: Ledger,
    rt: tokio::runtime::Runtime,
    known: BTreeMap<EntryId, Known>,
    running: BTreeMap<EntryId, Running>,
    /// Entries whose record was acknowledged durable and whose release
    /// was not yet submitted: each must come back after a crash.
    recorded: BTreeSet<EntryId>,
    /// Entries whose release was acknowledged durable: never to come back.
    released: BTreeSet<EntryId>,
    // The shadow of the engine's inputs, to judge admissions by.
    owner: OwnerPresence,
    lending: bool,
    pressure: [bool; 3],
    /// resource -> newest successful sample (taken ms, free).
    sample: [Option<(u64, u64)>; 3],
    /// resource -> newest failed sample (ms).
    failure: [Option<u64>; 3],
    /// resource -> last moment its work ended or it was disturbed (ms).
    disturbed: [Option<u64>; 3],
    next_id: u128,
    /// An admission check that failed, reported after the step.
    violation: Option<String>,
    trace: VecDeque<String>,
    digest: DefaultHasher,
    summary: Summary,
}

const TRACE_LEN: usize = 40;

impl Simulation {
    fn new(settings: Settings) -> Result<Simulation, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(|e| format!("cannot start the simulation's runtime: {e}"))?;
        let disk = MemDisk::new();
        let (ledger, faults, recovered) = open_ledger(&disk)?;
        if !recovered.is_empty() {
            return Err("a fresh disk recovered entries".into());
        }
        let mut engine = Engine::new(spec()).map_err(|e| e.to_string())?;
        engine.set_owner(OwnerPresence::Away);
        Ok(Simulation {
            settings,
            rng: Rng::new(settings.seed),
            step: 0,
            now: 1,
            started: 0,
            engine,
            disk,
            faults,
            refused_writes: 0,
            ledger,
            rt,
            known: BTreeMap::new(),
            running: BTreeMap::new(),
            recorded: BTreeSet::new(),
            released: BTreeSet::new(),
            owner: OwnerPresence::Away,
            lending: true,
            pressure: [false; 3],
            sample: [None; 3],
            failure: [None; 3],
            disturbed: [None; 3],
            next_id: 0,
            violation: None,
            trace: VecDeque::with_capacity(TRACE_LEN),
            digest: DefaultHasher::new(),
            summary: Summary {
                seed: settings.seed,
                ..Summary::default()
            },
        })
    }

    fn moment(&self) -> Moment {
        Moment::from_millis(self.now)
    }

    fn log(&mut self, event: Event) {
        event.hash(&mut self.digest);
        if self.trace.len() == TRACE_LEN {
            self.trace.pop_front();
        }
        let line = format!("step {} t={}ms {event:?}", self.step, self.now);
        if self.settings.verbose {
            eprintln!("{line}");
        }
        self.trace.push_back(line);
    }

    /// Wait for a store write; `Err(())` once the simulated machine crashed,
    /// whatever the write said: nothing after the crash point happens.
    fn wait(&mut self, write: crate::ledger::store::StoreWrite) -> Result<bool, Crashed> {
        let ok = self.rt.block_on(write).is_ok();
        if self.disk.crashed() {
            return Err(Crashed);
        }
        self.refused_writes = if ok { 0 } else { self.refused_writes + 1 };
        if self.refused_writes > 20 {
            // The ledger stopped after a failed sync: the owner restarts
            // the daemon (as abruptly as a crash).
            return Err(Crashed);
        }
        Ok(ok)
    }

    /// Do what the engine asked, in its order, as the lender does: ledger
    /// effects go to the store, one at a time here, each waited for; the
    /// wake-ups are the scheduler's own steps. `Ok(false)` when a write
    /// failed; `skip`: an entry whose Forget is on disk already.
    fn apply_effects(&mut self, skip: Option<EntryId>) -> Result<bool, Crashed> {
        let mut ok = true;
        while let Some(effect) = self.engine.poll_effect() {
            // Exhaustive, as the lender's: the wake-ups are this scheduler's
            // own steps, the records go through the lender's mapping.
            let change = match effect {
                Effect::Sample(_)
                | Effect::Observe(_)
                | Effect::WakeReclaims
                | Effect::WakeWaiters
                // The simulation lends to no named borrowers.
                | Effect::Account(_) => {
                    continue;
                }
                ledger @ (Effect::Persist(_)
                | Effect::MarkHeld { .. }
                | Effect::RewriteRef { .. }
                | Effect::Forget(_)) => StoreChange::of_effect(ledger),
            };
            let write = match change {
                Some(StoreChange::Release(entry)) if Some(entry) == skip => continue,
                Some(change) => ReservationStore::submit(&self.ledger, change),
                None => continue,
            };
            ok &= self.wait(write)?;
        }
        Ok(ok)
    }

    fn one_step(&mut self) -> Result<(), String> {
        match self
            .act()
            .and_then(|()| self.apply_effects(None).map(|_| ()))
        {
            Ok(()) => Ok(()),
            Err(Crashed) => self.restart(),
        }
    }

    /// One scheduler step: pick what happens next.
    // Long: the scheduler's table of next events, one arm an event with its odds.
    fn act(&mut self) -> Result<(), Crashed> {
        let roll = self.rng.below(100);
        match roll {
            0..=14 => {
                let ms = self.rng.below(1500);
                self.now += ms;
                self.log(Event::Advance(ms));
                if !self.lending && self.rng.one_in(3) {
                    self.lending = true;
                    self.engine.set_lending(true);
                    self.log(Event::Lending(true));
                }
                self.progress()
            }
            15..=29 => {
                self.sample();
                Ok(())
            }
            30..=31 => {
                let resource = self.rng.index(3);
                let now = self.moment();
                let _ = self
                    .engine
                    .record_sample_failure(RESOURCES[resource], now, "unreadable");
                self.failure[resource] = Some(self.now);
                self.log(Event::SampleFail { resource });
                Ok(())
            }
            32..=36 => {
                self.observe();
                Ok(())
            }
            37..=39 => {
                self.presence();
                self.reclaim()
            }
            40 => {
                self.lending = !self.lending || !self.rng.one_in(4);
                self.engine.set_lending(self.lending);
                self.log(Event::Lending(self.lending));
                Ok(())
            }
            41..=42 => {
                self.pressure_edge();
                self.reclaim()
            }
            43..=64 => self.admit(),
            65..=77 => self.progress(),
            78..=84 => self.reclaim(),
            85..=91 => self.admin_release(),
            92..=93 => {
                self.summary.compactions += 1;
                self.log(Event::Compact);
                let compacted = self.rt.block_on(self.ledger.compact());
                let _ = compacted;
                if self.disk.crashed() {
                    return Err(Crashed);
                }
                Ok(())
            }
            94 if self.rng.one_in(2) => {
                // A full or failing disk: one of the next writes fails.
                let at = self.faults.writes() + self.rng.below(6);
                let errno = if self.rng.one_in(2) { ENOSPC } else { EIO };
                let torn = self.rng.one_in(2);
                self.faults.set_fault(Some(Fault::Once { at, errno, torn }));
                self.log(Event::FaultArmed { at, errno, torn });
                Ok(())
            }
            94 => {
                if self.rng.one_in(3) {
                    let at = self.disk.ops() + self.rng.below(24);
                    self.disk.set_crash_at(Some(at));
                    self.log(Event::CrashArmed { at });
                }
                Ok(())
            }
            _ => {
                self.now += 1;
                self.progress()
            }
        }
    }

    fn sample(&mut self) {
        let resource = self.rng.index(3);
        let free = self.rng.below(TOTAL_MIB);
        let lag = if self.rng.one_in(4) {
            self.rng.below(2000)
        } else {
            0
        };
        // A reading is started by this daemon: never before it started.
        let taken = self.now.saturating_sub(lag).max(self.started);
        let _ = self.engine.record_sample(
            RESOURCES[resource],
            CapacitySample::memory(free, TOTAL_MIB, Moment::from_millis(taken)),
        );
        // The engine keeps the newest sample; so does the shadow.
        if self.sample[resource].is_none_or(|(t, _)| t <= taken) {
            self.sample[resource] = Some((taken, free));
        }
        self.log(Event::Sample {
            resource,
            free,
            lag,
        });
    }

    fn observe(&mut self) {
        let upstream = self.rng.index(UPSTREAMS.len());
        let Some(id) = self.engine.upstream_id(UPSTREAMS[upstream]) else {
            return;
        };
        let resident = (!self.rng.one_in(3)).then(|| self.rng.index(MODELS.len()));
        let foreign = self.rng.one_in(8);
        let mut o = ModelObservation::empty(self.moment());
        if let Some(m) = resident {
            o.models
                .push(ObservedModel::new(MODELS[m], ResidencyEvidence::Proven));
        }
        if foreign {
            let own = self
                .running
                .values()
                .filter(|r| r.upstream == upstream)
                .count();
            o.visible_work = Some(VisibleWork::new(own as u32 + 1, "a job of the owner's"));
        }
        let _ = self.engine.observe(id, o);
        self.log(Event::Observe {
            upstream,
            resident,
            foreign,
        });
    }

    fn presence(&mut self) {
        self.owner = match self.rng.below(5) {
            0..=2 => OwnerPresence::Away,
            3 => OwnerPresence::Present,
            _ => OwnerPresence::Unknown,
        };
        let told = match self.settings.mutation {
            Mutation::IgnoreOwner => OwnerPresence::Away,
            _ => self.owner,
        };
        self.engine.set_owner(told);
        self.log(Event::Owner(self.owner));
    }

    fn pressure_edge(&mut self) {
        let resource = self.rng.index(2); // the GPUs
        let refuses = self.rng.one_in(3);
        self.pressure[resource] = refuses;
        let verdict = if refuses {
            PressureVerdict::Refuses(format!("GPU pressure on {} engaged", RESOURCES[resource]))
        } else {
            PressureVerdict::Admits
        };
        let _ = self.engine.set_pressure(RESOURCES[resource], verdict);
        if refuses {
            let _ = self
                .engine
                .pressure_trigger(RESOURCES[resource], "pressure engaged");
        }
        self.log(Event::Pressure { resource, refuses });
    }

    // Long: the simulation's admit step checks every invariant of the decision where it is made.
    fn admit(&mut self) -> Result<(), Crashed> {
        let upstream = self.rng.index(UPSTREAMS.len());
        let Some(up) = self.engine.upstream_id(UPSTREAMS[upstream]) else {
            return Ok(());
        };
        self.next_id += 1;
        let n = self.next_id;
        let id = EntryId::from_u128(n);
        let model = (!self.rng.one_in(4)).then(|| MODELS[self.rng.index(MODELS.len())].to_owned());
        let request = WorkRequest {
            id,
            upstream: up,
            model,
            canonical_model: None,
            arrived_at: self.moment(),
            completion: completion(upstream),
            reuse: RequestReuse::Reuses,
            upstream_ref: (upstream == 0).then(|| format!("prompt-{n}")),
            wait: None,
            borrower: None,
            priority: None,
        };
        let reservation = match self.engine.admit(&request, self.moment()) {
            Decision::Admitted(r) => r,
            decision => {
                let code = match decision {
                    Decision::Refused(r) | Decision::Reobserve(r) => r.code.to_string(),
                    _ => "wait".to_owned(),
                };
                *self.summary.refusals.entry(code).or_default() += 1;
                self.summary.refused += 1;
                self.log(Event::Admit {
                    id: n,
                    upstream,
                    outcome: "refused",
                });
                return Ok(());
            }
        };
        self.summary.admitted += 1;
        if let Err(what) = self.judge_admission(upstream, &reservation) {
            // Reported by the check after the step.
            self.violation = Some(what);
        }
        self.known.insert(
            id,
            Known {
                upstream,
                phase: Phase::Forwarding,
                due: 0,
                fate: Fate::Finish,
                replied: false,
            },
        );
        // The engine asks for the record (Effect::Persist).
        let recorded = self.apply_effects(None)?;
        if recorded {
            self.recorded.insert(id);
        } else {
            self.summary.not_recorded += 1;
        }
        if !recorded && self.settings.mutation != Mutation::ForwardUnrecorded {
            // REC-01: not forwarded; the guard releases it.
            self.log(Event::Admit {
                id: n,
                upstream,
                outcome: "not recorded",
            });
            return self.release(id, ReleaseOutcome::NotForwarded);
        }
        // Forward: the upstream takes it, or the connect is refused.
        if self.rng.one_in(12) {
            self.log(Event::Admit {
                id: n,
                upstream,
                outcome: "connect refused",
            });
            self.summary.not_forwarded += 1;
            return self.release(id, ReleaseOutcome::NotForwarded);
        }
        self.summary.forwarded += 1;
        let length = 1 + self.rng.below(8000);
        let fate = match self.rng.below(20) {
            0 | 1 => {
                let stops = match self.rng.below(3) {
                    0 => Some(self.now + length),
                    1 => Some(self.now + length + self.rng.below(30_000)),
                    _ => None,
                };
                Fate::Break { stops }
            }
            2 => Fate::Hang,
            _ => Fate::Finish,
        };
        let stops = match fate {
            Fate::Finish => Some(self.now + length),
            Fate::Break { stops } => stops,
            Fate::Hang => None,
        };
        self.running.insert(id, Running { upstream, stops });
        if let Some(k) = self.known.get_mut(&id) {
            k.due = self.now + length;
            k.fate = fate;
        }
        self.log(Event::Admit {
            id: n,
            upstream,
            outcome: "forwarded",
        });
        Ok(())
    }

    /// The admission checks: policy, one job per resource, sample and reserve.
    fn judge_admission(
        &self,
        upstream: usize,
        r: &crate::engine::Reservation,
    ) -> Result<(), String> {
        let host = upstream != 2;
        if host && self.owner != OwnerPresence::Away {
            return Err(format!(
                "{} admitted host-scoped work while the owner is {} (OWN-01)",
                r.id,
                self.owner.as_str()
            ));
        }
        if !self.lending {
            return Err(format!("{} admitted while lending is off", r.id));
        }
        if r.charges.len() != deps(upstream).len() {
            return Err(format!("{} charged {} resources", r.id, r.charges.len()));
        }
        for &res in deps(upstream) {
            let name = RESOURCES[res];
            if self.pressure[res] {
                return Err(format!("{} admitted on {name} under pressure", r.id));
            }
            if let Some((other, _)) = self
                .known
                .iter()
                .find(|(_, k)| deps(k.upstream).contains(&res))
            {
                return Err(format!(
                    "{} admitted on {name}, which {other} holds (ADM-01)",
                    r.id
                ));
            }
            let Some((taken, free)) = self.sample[res] else {
                return Err(format!("{} admitted on {name} without a sample", r.id));
            };
            if self.failure[res].is_some_and(|f| f >= taken) {
                return Err(format!("{} admitted on {name} after a failed sample", r.id));
            }
            if self.now.saturating_sub(taken) > MAX_SAMPLE_AGE_MS {
                return Err(format!("{} admitted on a stale sample of {name}", r.id));
            }
            if self.disturbed[res].is_some_and(|d| taken <= d) {
                return Err(format!(
                    "{} admitted on a sample of {name} not taken after its last job (ADM-04)",
                    r.id
                ));
            }
            let Some(charge) = r.charges.iter().find(|c| c.resource == name) else {
                return Err(format!("{} has no charge on {name}", r.id));
            };
            if charge.free_mib != free || free < RESERVES[res] + charge.required_mib {
                return Err(format!(
                    "{} admitted on {name} with {} MiB required, {} free, reserve {} (MEM-01)",
                    r.id, charge.required_mib, free, RESERVES[res]
                ));
            }
        }
        Ok(())
    }

    /// Release an entry as the lender does: the engine first, then the record.
    fn release(&mut self, id: EntryId, outcome: ReleaseOutcome) -> Result<(), Crashed> {
        let reason = match &outcome {
            ReleaseOutcome::Uncertain(r) => Some(r.clone()),
            _ => None,
        };
        let Ok(released) = self.engine.release(id, outcome, self.moment()) else {
            return Ok(());
        };
        match released {
            Release::Freed => {
                if let Some(k) = self.known.remove(&id) {
                    self.ended(k.upstream);
                }
                // From here a crash may keep the release or lose it: the
                // work is over either way (Effect::Forget).
                self.recorded.remove(&id);
                if self.apply_effects(None)? {
                    self.released.insert(id);
                }
            }
            Release::Held => {
                self.summary.held += 1;
                if let Some(k) = self.known.get_mut(&id) {
                    k.phase = Phase::Held;
                }
                let _ = reason;
                self.apply_effects(None)?; // Effect::MarkHeld
            }
        }
        Ok(())
    }

    /// Work on `upstream`'s resources ended now: a new admission needs a
    /// sample taken after this (ADM-04).
    fn ended(&mut self, upstream: usize) {
        for &res in deps(upstream) {
            self.disturbed[res] = Some(self.now);
        }
    }

    /// Upstream jobs stop when their time comes; responses end or break.
    fn progress(&mut self) -> Result<(), Crashed> {
        let now = self.now;
        self.running.retain(|_, r| r.stops.is_none_or(|s| s > now));
        let due: Vec<EntryId> = self
            .known
            .iter()
            .filter(|(_, k)| k.phase != Phase::Held && k.due > 0 && k.due <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let Some(k) = self.known.get(&id).cloned() else {
                continue;
            };
            let n = id.0.as_u128();
            match (k.fate, completion(k.upstream)) {
                (Fate::Hang, _) => {}
                (Fate::Break { .. }, _) => {
                    self.log(Event::Progress {
                        id: n,
                        what: "broke off",
                    });
                    self.release(
                        id,
                        ReleaseOutcome::Uncertain("the response broke off".into()),
                    )?;
                }
                (Fate::Finish, CompletionMethod::Tracked) if !k.replied => {
                    // The reply came: tracking starts; the upstream may name
                    // its own handle (REC-04).
                    let _ = self.engine.start_tracking(id);
                    if let Some(k) = self.known.get_mut(&id) {
                        k.phase = Phase::Tracking;
                        k.replied = true;
                        k.due = 0;
                    }
                    self.log(Event::Progress {
                        id: n,
                        what: "tracking",
                    });
                    if self.rng.one_in(3) {
                        let handle = format!("own-{n}");
                        let _ = self.engine.set_upstream_ref(id, &handle);
                        self.apply_effects(None)?; // Effect::RewriteRef
                    }
                    // The history shows it done a little later.
                    let done = now + 1 + self.rng.below(3000);
                    if let Some(k) = self.known.get_mut(&id) {
                        k.due = done;
                    }
                    if let Some(r) = self.running.get_mut(&id) {
                        r.stops = Some(done);
                    }
                }
                (Fate::Finish, CompletionMethod::HeldOnClose) => {
                    self.log(Event::Progress {
                        id: n,
                        what: "closed, held",
                    });
                    self.release(
                        id,
                        ReleaseOutcome::Uncertain("nothing proves the end (ROUTE-10)".into()),
                    )?;
                }
                (Fate::Finish, _) => {
                    self.log(Event::Progress {
                        id: n,
                        what: "done",
                    });
                    self.summary.completed += 1;
                    self.release(id, ReleaseOutcome::Completed)?;
                }
            }
        }
        Ok(())
    }

    /// Step the reclaims and do what they ask.
    fn reclaim(&mut self) -> Result<(), Crashed> {
        let commands = self.engine.reclaim_step(self.moment());
        for command in commands {
            match command {
                ReclaimCommand::Started { upstream, .. } => {
                    self.log(Event::Reclaim(format!("started on {}", upstream.index())));
                }
                ReclaimCommand::StoodDown { upstream, .. }
                | ReclaimCommand::Finished { upstream, .. } => {
                    let up = upstream.index();
                    if self.engine_holds_on_reclaim(up) {
                        self.ended(up);
                    }
                    self.log(Event::Reclaim(format!("ended on {up}")));
                }
                ReclaimCommand::Act {
                    id,
                    upstream,
                    mut cancel,
                    unload,
                    mut cancel_held,
                    ..
                } => {
                    self.summary.reclaims_acted += 1;
                    let up = upstream.index();
                    self.log(Event::Reclaim(format!(
                        "act on {up}: cancel {} held {} unload {unload}",
                        cancel.len(),
                        cancel_held.len()
                    )));
                    // The engine's lists come from a map: sort them so the
                    // run does not depend on its order.
                    cancel.sort();
                    cancel_held.sort();
                    for entry in cancel {
                        // Cut the response; the upstream proves the stop, or not.
                        if self.rng.one_in(5) {
                            if let Some(r) = self.running.get_mut(&entry) {
                                r.stops = r.stops.max(Some(self.now + 5000));
                            }
                            self.release(
                                entry,
                                ReleaseOutcome::Uncertain("cut; the stop is not proven".into()),
                            )?;
                        } else {
                            self.running.remove(&entry);
                            self.summary.completed += 1;
                            self.release(entry, ReleaseOutcome::Completed)?;
                        }
                    }
                    for entry in cancel_held {
                        // Cancelled at the upstream by its handle (REC-03): the
                        // history proves the stop.
                        self.running.remove(&entry);
                        self.release_held(entry, HeldRelease::TrackingProof)?;
                    }
                    if unload {
                        let _ = self.engine.record_yield(upstream, self.moment());
                        self.ended(up);
                    }
                    let _ = self.engine.reclaim_done(id, self.moment());
                    if self.engine_holds_on_reclaim(up) {
                        self.ended(up);
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether `upstream`'s reclaims hold its resources (yield on veto), so
    /// their end disturbs them (RECL-45).
    fn engine_holds_on_reclaim(&self, upstream: usize) -> bool {
        upstream == 0 // the only one with yield_on_veto, see spec()
    }

    /// Release a held entry once its release is durable (HELD-04..07).
    fn release_held(&mut self, id: EntryId, by: HeldRelease) -> Result<bool, Crashed> {
        if self.engine.phase(id) != Some(Phase::Held) {
            return Ok(false);
        }
        // A crash during the write, or a failed write (whose line a sync
        // may still have taken), may keep the release or lose it: the job
        // has stopped either way. A failed write keeps it held meanwhile.
        self.recorded.remove(&id);
        let write = self.ledger.forget(id);
        if !self.wait(write)? {
            return Ok(false);
        }
        self.released.insert(id);
        let released = self.engine.release_held(id, by, self.moment());
        // Its Forget is on disk already, as the lender does it.
        self.apply_effects(Some(id))?;
        if released.is_ok() {
            self.summary.held_released += 1;
            if let Some(k) = self.known.remove(&id) {
                self.ended(k.upstream);
            }
        }
        Ok(true)
    }

    /// An administrator looks at a held entry's upstream and releases it
    /// once the job has stopped there.
    fn admin_release(&mut self) -> Result<(), Crashed> {
        let held: Vec<EntryId> = self
            .known
            .iter()
            .filter(|(_, k)| k.phase == Phase::Held)
            .map(|(id, _)| *id)
            .collect();
        if held.is_empty() {
            return Ok(());
        }
        let id = held[self.rng.index(held.len())];
        let running = self.running.contains_key(&id);
        if running && self.settings.mutation != Mutation::AdminReleasesRunning {
            // The administrator stops the job at the upstream first, or
            // comes back later.
            if self.rng.one_in(2) {
                self.running.remove(&id);
            }
            self.log(Event::AdminRelease {
                id: id.0.as_u128(),
                running,
                recorded: false,
            });
            return Ok(());
        }
        let recorded = self.release_held(id, HeldRelease::AdministratorConfirmed)?;
        self.log(Event::AdminRelease {
            id: id.0.as_u128(),
            running,
            recorded,
        });
        Ok(())
    }

    /// The machine stopped at the crash point: start again from what the
    /// disk kept, and check what came back.
    fn restart(&mut self) -> Result<(), String> {
        self.summary.crashes += 1;
        self.summary.disk_calls += self.disk.ops();
        let rng = &mut self.rng;
        let image = self.disk.crash_image(&mut |n| rng.below(n));
        let (ledger, faults, recovered) = open_ledger(&image)?;
        // The old writer's thread ends once its queue is dropped.
        self.ledger = ledger;
        self.faults = faults;
        self.refused_writes = 0;
        self.disk = image;
        self.ledger.set_compact_min_lines(8 + self.rng.below(64));
        let back: BTreeSet<EntryId> = recovered.iter().map(|e| e.id).collect();
        if back.len() != recovered.len() {
            return Err("an entry came back twice after a crash".into());
        }
        for (id, _) in self
            .known
            .iter()
            .filter(|(id, _)| self.recorded.contains(id))
        {
            if !back.contains(id) {
                return Err(format!(
                    "{id} was recorded and not released, yet did not come back after the crash (REC-02)"
                ));
            }
        }
        if let Some(id) = back.iter().find(|id| self.released.contains(id)) {
            return Err(format!(
                "{id} came back after the crash though its release was acknowledged"
            ));
        }
        // A new daemon, a few seconds later: a fresh engine, every
        // recovered entry held.
        self.now += 2000 + self.rng.below(3000);
        self.started = self.now;
        let mut engine = Engine::new(spec()).map_err(|e| e.to_string())?;
        let now = self.moment();
        for e in &recovered {
            let wall = SystemTime::UNIX_EPOCH + Duration::from_millis(e.started_unix_ms);
            engine
                .restore_held(e.to_restored(now, wall), "recovered after a restart")
                .map_err(|err| format!("restoring {} failed: {err}", e.id))?;
        }
        self.engine = engine;
        self.owner = OwnerPresence::Unknown;
        self.lending = true;
        self.pressure = [false; 3];
        self.sample = [None; 3];
        self.failure = [None; 3];
        let mut known = BTreeMap::new();
        for e in &recovered {
            let upstream = UPSTREAMS
                .iter()
                .position(|u| *u == e.upstream)
                .ok_or_else(|| format!("{} came back on unknown upstream {}", e.id, e.upstream))?;
            known.insert(
                e.id,
                Known {
                    upstream,
                    phase: Phase::Held,
                    due: 0,
                    fate: Fate::Finish,
                    replied: false,
                },
            );
        }
        self.known = known;
        self.recorded = back;
        self.summary.recovered += recovered.len() as u64;
        self.log(Event::Restart {
            recovered: recovered.len(),
        });
        Ok(())
    }

    /// The invariants that hold after every step.
    fn check(&mut self) -> Result<(), String> {
        if let Some(what) = self.violation.take() {
            return Err(what);
        }
        if self.engine.entry_count() != self.known.len() {
            return Err(format!(
                "the engine has {} entries, the shell knows {}",
                self.engine.entry_count(),
                self.known.len()
            ));
        }
        for (id, k) in &self.known {
            if self.engine.phase(*id) != Some(k.phase) {
                return Err(format!(
                    "{id} is {:?} in the engine, {:?} to the shell",
                    self.engine.phase(*id),
                    k.phase
                ));
            }
        }
        let now = self.now;
        let mut users = [0u32; 3];
        for (id, r) in &self.running {
            if r.stops.is_some_and(|s| s <= now) {
                continue;
            }
            if self.engine.phase(*id).is_none() {
                return Err(format!(
                    "{id} still runs at {} but its entry was released (no release without proof)",
                    UPSTREAMS[r.upstream]
                ));
            }
            for &res in deps(r.upstream) {
                users[res] += 1;
                if users[res] > 1 {
                    return Err(format!(
                        "two jobs run on {} at once (ADM-01)",
                        RESOURCES[res]
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The machine stopped at the crash point.
struct Crashed;

/// EIO and ENOSPC, as Linux numbers them.
const EIO: i32 = 5;
const ENOSPC: i32 = 28;

fn open_ledger(
    disk: &MemDisk,
) -> Result<(Ledger, FaultDisk, Vec<crate::ledger::RecoveredEntry>), String> {
    let faults = FaultDisk::unlogged(Arc::new(disk.clone()));
    let (ledger, recovered) =
        Ledger::open_on(&PathBuf::from(RECOVERY_DIR), Arc::new(faults.clone()))
            .map_err(|e| format!("the ledger did not open after a crash: {e}"))?;
    ledger.set_compact_min_lines(16);
    // Every write is waited for, so a deferred sync would only cost time.
    ledger.set_deferred_sync(Duration::ZERO);
    Ok((ledger, faults, recovered))
}
