//! Property tests of the engine's invariants under simulated time: random
//! interleavings of admit / release / sample / observe / owner / switch events.
//!
//! Checked after every step (ADM-01, ADM-03, ADM-04, MEM-01, MEM-05, OWN-01,
//! SCOPE-02, SCOPE-04, HELD-06):
//! - never two jobs on one resource;
//! - never admitted below a reserve;
//! - never admitted on a sample older than the last job on that resource, or on
//!   a stale or failed one;
//! - never admitted against the owner, the lending switch, a resource switch or pressure;
//! - held work is never released without an explicit administrator release.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use vacancy::engine::OwnerScope;
use vacancy::engine::{
    CompletionMethod, Decision, Engine, EngineError, EngineSpec, EntryId, HeldRelease,
    ModelObservation, ObservedModel, OwnerPresence, Phase, PressureVerdict, ReleaseOutcome,
    ResidencyEvidence, ResourceSpec, UpstreamSpec, WorkRequest,
};
use vacancy::{CapacitySample, Moment, ResourceKind};

const RESOURCES: [&str; 3] = ["gpu0", "gpu1", "ram"];
const UPSTREAMS: [&str; 4] = ["a", "b", "c", "d"];
const MODELS: [&str; 3] = ["m0", "m1", "m2"];
const MAX_AGE_MS: u64 = 5000;

fn spec(reserves: [u64; 3]) -> EngineSpec {
    let resources = RESOURCES
        .iter()
        .zip(reserves)
        .map(|(name, reserve)| {
            let kind = if *name == "ram" {
                ResourceKind::Memory
            } else {
                ResourceKind::Gpu
            };
            let mut r = ResourceSpec::new(name, kind, reserve);
            r.max_sample_age = Duration::from_millis(MAX_AGE_MS);
            r
        })
        .collect();
    let mut a = UpstreamSpec::new("a", "gpu0", 6000);
    a.also_requires = vec!["ram".into()];
    a.requirements.insert("ram".into(), 4000);
    a.resident_min_free_mib = 500;
    let mut b = UpstreamSpec::new("b", "gpu1", 3000);
    b.also_requires = vec!["ram".into()];
    let mut c = UpstreamSpec::new("c", "ram", 2000);
    c.owner_scope = OwnerScope::Resource;
    let d = UpstreamSpec::new("d", "gpu0", 1000);
    EngineSpec {
        lending: true,
        resources,
        upstreams: vec![a, b, c, d],
    }
}

#[derive(Debug, Clone)]
enum Event {
    Advance(u64),
    Admit {
        upstream: usize,
        model: Option<usize>,
    },
    Release {
        pick: usize,
        outcome: u8,
    },
    AdminRelease {
        pick: usize,
    },
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
        model: usize,
    },
    Owner(u8),
    Lending(bool),
    Switch {
        resource: usize,
        on: bool,
    },
    Pressure {
        resource: usize,
        refuses: bool,
    },
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => (0u64..3000).prop_map(Event::Advance),
        6 => (0usize..4, proptest::option::of(0usize..3)).prop_map(|(upstream, model)| Event::Admit { upstream, model }),
        3 => (any::<usize>(), 0u8..3).prop_map(|(pick, outcome)| Event::Release { pick, outcome }),
        1 => any::<usize>().prop_map(|pick| Event::AdminRelease { pick }),
        6 => (0usize..3, 0u64..40_000, prop_oneof![3 => Just(0u64), 1 => 0u64..2000]).prop_map(|(resource, free, lag)| Event::Sample { resource, free, lag }),
        1 => (0usize..3).prop_map(|resource| Event::SampleFail { resource }),
        1 => (0usize..4, 0usize..3).prop_map(|(upstream, model)| Event::Observe { upstream, model }),
        1 => (0u8..3).prop_map(Event::Owner),
        1 => any::<bool>().prop_map(Event::Lending),
        1 => (0usize..3, prop_oneof![4 => Just(true), 1 => Just(false)]).prop_map(|(resource, on)| Event::Switch { resource, on }),
        1 => (0usize..3, prop_oneof![4 => Just(false), 1 => Just(true)]).prop_map(|(resource, refuses)| Event::Pressure { resource, refuses }),
    ]
}

/// The test's own record of the world, to judge the engine's decisions by.
#[derive(Default)]
struct Shadow {
    now: u64,
    /// resource -> newest successful sample (taken_at ms, free)
    sample: BTreeMap<usize, (u64, u64)>,
    /// resource -> newest failure (ms)
    failure: BTreeMap<usize, u64>,
    /// resource -> last moment a job on it ended
    job_end: BTreeMap<usize, u64>,
    /// live entries: id -> (upstream, resources)
    live: BTreeMap<EntryId, (usize, Vec<usize>)>,
    held: BTreeSet<EntryId>,
    owner: u8,
    lending: bool,
    enabled: [bool; 3],
    pressure: [bool; 3],
    next_id: u128,
}

fn deps(upstream: usize) -> Vec<usize> {
    match upstream {
        0 => vec![0, 2],
        1 => vec![1, 2],
        2 => vec![2],
        _ => vec![0],
    }
}

fn pick(live: &BTreeMap<EntryId, (usize, Vec<usize>)>, n: usize) -> Option<EntryId> {
    if live.is_empty() {
        return None;
    }
    live.keys().nth(n % live.len()).copied()
}

fn run(reserves: [u64; 3], events: Vec<Event>) -> Result<(), TestCaseError> {
    let mut e = Engine::new(spec(reserves)).unwrap();
    e.set_owner(OwnerPresence::Away);
    let mut s = Shadow {
        owner: 1,
        lending: true,
        enabled: [true; 3],
        ..Shadow::default()
    };
    for ev in events {
        let now = Moment::from_millis(s.now);
        match ev {
            Event::Advance(ms) => s.now += ms,
            Event::Admit { upstream, model } => {
                s.next_id += 1;
                let up = e.upstream_id(UPSTREAMS[upstream]).unwrap();
                let req = WorkRequest {
                    id: EntryId::from_u128(s.next_id),
                    upstream: up,
                    model: model.map(|m| MODELS[m].to_owned()),
                    canonical_model: None,
                    arrived_at: now,
                    completion: CompletionMethod::ResponseEnd,
                    reuse: Default::default(),
                    upstream_ref: None,
                    wait: None,
                    borrower: None,
                    priority: None,
                };
                if let Decision::Admitted(res) = e.admit(&req, now) {
                    let needs = deps(upstream);
                    // Policy.
                    prop_assert!(s.lending, "admitted while lending is paused");
                    prop_assert!(
                        s.owner == 1 || upstream == 2,
                        "host-scoped work admitted while the owner is not away"
                    );
                    for &r in &needs {
                        prop_assert!(s.enabled[r], "admitted on a disabled resource");
                        prop_assert!(!s.pressure[r], "admitted under pressure");
                        // One job per resource.
                        for (other, (_, held_res)) in &s.live {
                            prop_assert!(
                                !held_res.contains(&r),
                                "{} already holds {}",
                                other,
                                RESOURCES[r]
                            );
                        }
                        // Sample freshness and ADM-04.
                        let (taken, free) = *s
                            .sample
                            .get(&r)
                            .ok_or_else(|| TestCaseError::fail("admitted without a sample"))?;
                        prop_assert!(
                            s.failure.get(&r).is_none_or(|f| *f < taken),
                            "admitted on a failed sample"
                        );
                        prop_assert!(s.now - taken <= MAX_AGE_MS, "admitted on a stale sample");
                        if let Some(end) = s.job_end.get(&r) {
                            prop_assert!(
                                taken > *end,
                                "admitted on a sample not taken after the last job on {}",
                                RESOURCES[r]
                            );
                        }
                        // Reserves.
                        let charge = res
                            .charges
                            .iter()
                            .find(|c| c.resource == RESOURCES[r])
                            .unwrap();
                        prop_assert_eq!(charge.free_mib, free);
                        prop_assert!(
                            free >= reserves[r],
                            "admitted below the reserve of {}",
                            RESOURCES[r]
                        );
                        prop_assert!(
                            charge.required_mib <= free - reserves[r],
                            "requirement does not fit above the reserve"
                        );
                    }
                    prop_assert_eq!(res.charges.len(), needs.len());
                    s.live.insert(req.id, (upstream, needs));
                }
            }
            Event::Release { pick: n, outcome } => {
                if let Some(id) = pick(&s.live, n) {
                    let outcome = match outcome {
                        0 => ReleaseOutcome::Completed,
                        1 => ReleaseOutcome::NotForwarded,
                        _ => ReleaseOutcome::Uncertain("cut".into()),
                    };
                    let held_before = s.held.contains(&id);
                    let result = e.release(id, outcome.clone(), now);
                    if held_before {
                        prop_assert_eq!(result, Err(EngineError::EntryHeld(id)));
                    } else if matches!(outcome, ReleaseOutcome::Uncertain(_)) {
                        prop_assert!(result.is_ok());
                        s.held.insert(id);
                    } else {
                        prop_assert!(result.is_ok());
                        let (_, res) = s.live.remove(&id).unwrap();
                        for r in res {
                            s.job_end.insert(r, s.now);
                        }
                    }
                }
            }
            Event::AdminRelease { pick: n } => {
                if let Some(id) = pick(&s.live, n) {
                    let result = e.release_held(id, HeldRelease::AdministratorConfirmed, now);
                    if s.held.remove(&id) {
                        prop_assert!(result.is_ok());
                        let (_, res) = s.live.remove(&id).unwrap();
                        for r in res {
                            s.job_end.insert(r, s.now);
                        }
                    } else {
                        let not_held = matches!(result, Err(EngineError::NotHeld { .. }));
                        prop_assert!(
                            not_held,
                            "an entry that is not held was released by an administrator"
                        );
                    }
                }
            }
            Event::Sample {
                resource,
                free,
                lag,
            } => {
                let taken = s.now.saturating_sub(lag);
                e.record_sample(
                    RESOURCES[resource],
                    CapacitySample::memory(free, 64_000, Moment::from_millis(taken)),
                )
                .unwrap();
                if s.sample.get(&resource).is_none_or(|(t, _)| *t <= taken) {
                    s.sample.insert(resource, (taken, free));
                    if s.failure.get(&resource).is_some_and(|f| *f < taken) {
                        s.failure.remove(&resource);
                    }
                }
            }
            Event::SampleFail { resource } => {
                e.record_sample_failure(RESOURCES[resource], now, "unreadable")
                    .unwrap();
                s.failure.insert(resource, s.now);
            }
            Event::Observe { upstream, model } => {
                let up = e.upstream_id(UPSTREAMS[upstream]).unwrap();
                e.observe(
                    up,
                    ModelObservation {
                        taken_at: now,
                        models: vec![ObservedModel::new(MODELS[model], ResidencyEvidence::Proven)],
                        visible_work: None,
                        allocator_free_mib: None,
                    },
                )
                .unwrap();
            }
            Event::Owner(o) => {
                s.owner = o;
                e.set_owner(match o {
                    0 => OwnerPresence::Present,
                    1 => OwnerPresence::Away,
                    _ => OwnerPresence::Unknown,
                });
            }
            Event::Lending(on) => {
                s.lending = on;
                e.set_lending(on);
            }
            Event::Switch { resource, on } => {
                s.enabled[resource] = on;
                e.set_resource_enabled(RESOURCES[resource], on).unwrap();
            }
            Event::Pressure { resource, refuses } => {
                s.pressure[resource] = refuses;
                let v = if refuses {
                    PressureVerdict::Refuses("engaged".into())
                } else {
                    PressureVerdict::Admits
                };
                e.set_pressure(RESOURCES[resource], v).unwrap();
            }
        }
        // After every step: the engine's work list is exactly the shadow's, held
        // entries are still held, and no resource is reserved twice.
        let status = e.status(Moment::from_millis(s.now));
        prop_assert_eq!(status.work.len(), s.live.len());
        let mut seen = BTreeSet::new();
        for w in &status.work {
            let id: EntryId = w.id.parse().unwrap();
            prop_assert!(s.live.contains_key(&id), "unknown entry in status");
            prop_assert_eq!(w.phase == Phase::Held, s.held.contains(&id));
            for r in &w.resources {
                prop_assert!(seen.insert(r.clone()), "resource {} reserved twice", r);
            }
        }
        for r in &status.resources {
            let holders = status
                .work
                .iter()
                .filter(|w| w.resources.contains(&r.name))
                .count();
            prop_assert_eq!(holders, usize::from(r.reserved_by.is_some()));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn engine_invariants_hold_under_random_interleavings(
        reserves in [0u64..20_000, 0u64..20_000, 0u64..20_000],
        events in proptest::collection::vec(event(), 1..200),
    ) {
        run(reserves, events)?;
    }
}

#[test]
fn mem_02_vector_through_the_public_api() {
    // MEM-02: 31,000 free, 24,000 reserve, 8,000 job -> refused.
    let spec = EngineSpec {
        lending: true,
        resources: vec![ResourceSpec::new("ram", ResourceKind::Memory, 24_000)],
        upstreams: vec![UpstreamSpec::new("cpu", "ram", 8000)],
    };
    let mut e = Engine::new(spec).unwrap();
    e.set_owner(OwnerPresence::Away);
    e.record_sample("ram", CapacitySample::memory(31_000, 64_000, Moment::ZERO))
        .unwrap();
    let req = WorkRequest::new(e.upstream_id("cpu").unwrap(), None, Moment::ZERO);
    match e.admit(&req, Moment::ZERO) {
        Decision::Refused(r) => assert_eq!(r.code.as_str(), "insufficient_memory"),
        other => panic!("{other:?}"),
    }
}
