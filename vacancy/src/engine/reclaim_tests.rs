//! Reclaim planning under simulated time, each test naming its rule.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use proptest::prelude::*;

use crate::engine::*;
use crate::engine::{OnOwnerReturn, OwnerScope};
use crate::time::Moment;
use crate::traits::resource::{CapacitySample, ResourceKind};

fn t(ms: u64) -> Moment {
    Moment::from_millis(ms)
}

/// gpu0 + ram; "llm" (host) on gpu0+ram, "tts" (exempt) on gpu1+ram,
/// "helper" (host) on gpu1 only.
fn spec(mode: OnOwnerReturn, yield_on_veto: bool) -> EngineSpec {
    let policy = ReclaimPolicy {
        on_owner_return: mode,
        drain_timeout: Duration::from_secs(30),
        yield_on_veto,
        completion_timeout: Duration::from_secs(600),
    };
    let mut llm = UpstreamSpec::new("llm", "gpu0", 1000);
    llm.also_requires = vec!["ram".to_owned()];
    llm.reclaim = policy;
    let mut tts = UpstreamSpec::new("tts", "gpu1", 1000);
    tts.also_requires = vec!["ram".to_owned()];
    tts.owner_scope = OwnerScope::Resource;
    tts.reclaim = policy;
    let mut helper = UpstreamSpec::new("helper", "gpu1", 1000);
    helper.reclaim = policy;
    EngineSpec {
        lending: true,
        resources: vec![
            ResourceSpec::new("gpu0", ResourceKind::Gpu, 1024),
            ResourceSpec::new("gpu1", ResourceKind::Gpu, 1024),
            ResourceSpec::new("ram", ResourceKind::Memory, 1024),
        ],
        upstreams: vec![llm, tts, helper],
    }
}

fn engine(mode: OnOwnerReturn, yield_on_veto: bool) -> Engine {
    let mut e = Engine::new(spec(mode, yield_on_veto)).unwrap();
    e.set_owner(OwnerPresence::Away);
    assert!(e.reclaim_step(t(0)).is_empty());
    sample_all(&mut e, 0);
    e
}

fn sample_all(e: &mut Engine, at: u64) {
    for r in ["gpu0", "gpu1", "ram"] {
        e.record_sample(r, CapacitySample::memory(60_000, 80_000, t(at)))
            .unwrap();
    }
}

fn admit(e: &mut Engine, upstream: &str, at: u64) -> Result<EntryId, Refusal> {
    let req = WorkRequest::new(e.upstream_id(upstream).unwrap(), None, t(at));
    match e.admit(&req, t(at)) {
        Decision::Admitted(r) => Ok(r.id),
        Decision::Refused(r) | Decision::Reobserve(r) => Err(r),
        Decision::Wait { resources, .. } => Err(Refusal::new(
            RefusalCode::ResourceBusy,
            format!("waiting for {resources:?}"),
        )),
    }
}

fn started(cmds: &[ReclaimCommand]) -> Vec<(ReclaimId, String, Option<Moment>)> {
    cmds.iter()
        .filter_map(|c| match c {
            ReclaimCommand::Started {
                id,
                trigger,
                deadline,
                ..
            } => Some((*id, trigger.describe(), *deadline)),
            _ => None,
        })
        .collect()
}

fn acts(cmds: &[ReclaimCommand]) -> Vec<(Vec<EntryId>, bool)> {
    cmds.iter()
        .filter_map(|c| match c {
            ReclaimCommand::Act { cancel, unload, .. } => Some((cancel.clone(), *unload)),
            _ => None,
        })
        .collect()
}

#[test]
fn drain_lets_work_run_until_its_deadline_then_cancels() {
    // RECL-01, OWN-01
    let mut e = engine(OnOwnerReturn::Drain, false);
    let job = admit(&mut e, "llm", 10).unwrap();
    e.set_owner(OwnerPresence::Present);
    let cmds = e.reclaim_step(t(100));
    let s = started(&cmds);
    assert_eq!(s.len(), 1, "{cmds:?}");
    assert_eq!(s[0].2, Some(t(30_100)));
    assert!(acts(&cmds).is_empty());
    assert!(acts(&e.reclaim_step(t(30_099))).is_empty());
    assert_eq!(e.next_reclaim_deadline(), Some(t(30_100)));
    let cmds = e.reclaim_step(t(30_100));
    assert_eq!(acts(&cmds), [(vec![job], false)]);
    // OWN-02: new work stays refused while the reclaim acts.
    assert_eq!(
        admit(&mut e, "llm", 30_200).unwrap_err().code,
        RefusalCode::OwnerPresent
    );
    e.reclaim_done(s[0].0, t(30_300)).unwrap();
    assert!(e.reclaim_statuses(t(30_300)).is_empty());
}

#[test]
fn drain_ends_without_cancelling_when_the_work_finishes_in_time() {
    // RECL-31, RECL-20: work that ends inside the drain window is never
    // cancelled; with no unload configured the reclaim simply finishes.
    let mut e = engine(OnOwnerReturn::Drain, false);
    let job = admit(&mut e, "llm", 10).unwrap();
    e.set_owner(OwnerPresence::Present);
    e.reclaim_step(t(100));
    e.release(job, ReleaseOutcome::Completed, t(5_000)).unwrap();
    let cmds = e.reclaim_step(t(5_001));
    assert!(acts(&cmds).is_empty());
    assert!(
        matches!(cmds.as_slice(), [ReclaimCommand::Finished { .. }]),
        "{cmds:?}"
    );
}

#[test]
fn a_release_wakes_the_reclaim_loop_only_while_a_reclaim_waits_for_work() {
    // RECL-31: a drain steps on as soon as its work ends, so that end wakes
    // the reclaim loop; with no reclaim under way a job's end does not.
    let wakes = |e: &mut Engine| {
        std::iter::from_fn(|| e.poll_effect())
            .filter(|x| *x == Effect::WakeReclaims)
            .count()
    };
    let mut e = engine(OnOwnerReturn::Drain, false);
    let quiet = admit(&mut e, "llm", 10).unwrap();
    wakes(&mut e);
    e.release(quiet, ReleaseOutcome::Completed, t(20)).unwrap();
    assert_eq!(wakes(&mut e), 0, "no reclaim is under way");
    sample_all(&mut e, 30);
    let job = admit(&mut e, "llm", 40).unwrap();
    e.set_owner(OwnerPresence::Present);
    assert_eq!(started(&e.reclaim_step(t(100))).len(), 1);
    wakes(&mut e);
    e.release(job, ReleaseOutcome::Completed, t(5_000)).unwrap();
    assert_eq!(wakes(&mut e), 1, "the drain waits for this job");
    assert!(matches!(
        e.reclaim_step(t(5_001)).as_slice(),
        [ReclaimCommand::Finished { .. }]
    ));
}

#[test]
fn drain_with_yield_unloads_as_soon_as_the_work_ends() {
    // RECL-31, RECL-30
    let mut e = engine(OnOwnerReturn::Drain, true);
    let job = admit(&mut e, "llm", 10).unwrap();
    e.set_owner(OwnerPresence::Present);
    e.reclaim_step(t(100));
    e.release(job, ReleaseOutcome::Completed, t(2_000)).unwrap();
    assert_eq!(acts(&e.reclaim_step(t(2_001))), [(vec![], true)]);
}

#[test]
fn a_drain_stands_down_when_the_owner_leaves_and_a_later_return_starts_anew() {
    // RECL-04, RECL-05, RECL-08, RECL-09, RECL-12
    let mut e = engine(OnOwnerReturn::Drain, true);
    admit(&mut e, "llm", 10).unwrap();
    e.set_owner(OwnerPresence::Present);
    let first = started(&e.reclaim_step(t(100)))[0].clone();
    e.set_owner(OwnerPresence::Away);
    let cmds = e.reclaim_step(t(10_100));
    assert!(
        cmds.iter().any(|c| matches!(c, ReclaimCommand::StoodDown { id, elapsed, .. } if *id == first.0 && *elapsed == Duration::from_secs(10))),
        "{cmds:?}"
    );
    assert!(acts(&cmds).is_empty(), "a stand-down does nothing");
    assert!(
        e.reclaim_statuses(t(10_100))
            .iter()
            .all(|s| s.upstream != "llm")
    );
    e.set_owner(OwnerPresence::Present);
    let second: Vec<_> = e
        .reclaim_step(t(20_000))
        .into_iter()
        .filter_map(|c| match c {
            ReclaimCommand::Started {
                id,
                upstream,
                deadline,
                ..
            } if upstream == e.upstream_id("llm").unwrap() => Some((id, (), deadline)),
            _ => None,
        })
        .collect();
    assert_eq!(second.len(), 1);
    assert_ne!(second[0].0, first.0);
    assert_eq!(second[0].2, Some(t(50_000)), "its own deadline");
}

#[test]
fn unknown_presence_is_an_owner_edge_and_does_not_clear() {
    // OWN-01: incomplete session evidence reclaims like presence.
    let mut e = engine(OnOwnerReturn::Drain, false);
    admit(&mut e, "llm", 10).unwrap();
    e.set_owner(OwnerPresence::Unknown);
    let s = started(&e.reclaim_step(t(100)));
    assert!(s[0].1.contains("incomplete session evidence"), "{s:?}");
    assert!(
        e.reclaim_step(t(20_000)).is_empty(),
        "unknown never stands down"
    );
}

#[test]
fn cancel_acts_at_once_and_never_stands_down() {
    // RECL-02, RECL-11
    let mut e = engine(OnOwnerReturn::Cancel, false);
    let job = admit(&mut e, "llm", 10).unwrap();
    e.set_owner(OwnerPresence::Present);
    let cmds = e.reclaim_step(t(100));
    assert_eq!(acts(&cmds), [(vec![job], false)]);
    e.set_owner(OwnerPresence::Away);
    assert!(
        e.reclaim_step(t(200)).is_empty(),
        "acting runs to completion (RECL-44)"
    );
    assert_eq!(e.reclaim_statuses(t(200))[0].stage, "acting");
}

#[test]
fn finish_never_cancels_and_unloads_after_the_work_or_completion_timeout() {
    // RECL-03, RECL-22, RECL-32
    let mut e = engine(OnOwnerReturn::Finish, true);
    admit(&mut e, "llm", 10).unwrap();
    e.set_owner(OwnerPresence::Present);
    let s = started(&e.reclaim_step(t(100)));
    assert_eq!(s[0].2, None, "no owner-return deadline");
    assert!(acts(&e.reclaim_step(t(599_000))).is_empty());
    assert_eq!(e.next_reclaim_deadline(), Some(t(600_100)));
    assert_eq!(acts(&e.reclaim_step(t(600_100))), [(vec![], true)]);
}

#[test]
fn finish_without_yield_stands_down_like_a_drain() {
    // RECL-10
    let mut e = engine(OnOwnerReturn::Finish, false);
    admit(&mut e, "llm", 10).unwrap();
    e.set_owner(OwnerPresence::Present);
    e.reclaim_step(t(100));
    e.set_owner(OwnerPresence::Away);
    assert!(matches!(
        e.reclaim_step(t(200)).as_slice(),
        [ReclaimCommand::StoodDown { .. }]
    ));
}

#[test]
fn held_work_is_listed_but_never_waited_for() {
    // RECL-33 (held work without an upstream handle is not cancelled either:
    // nothing can find it there; REC-03 covers held work with one)
    let mut e = engine(OnOwnerReturn::Drain, true);
    let job = admit(&mut e, "llm", 10).unwrap();
    e.release(job, ReleaseOutcome::Uncertain("broke off".into()), t(20))
        .unwrap();
    e.set_owner(OwnerPresence::Present);
    let llm = e.upstream_id("llm").unwrap();
    let cmds: Vec<ReclaimCommand> = e
        .reclaim_step(t(100))
        .into_iter()
        .filter(|c| {
            matches!(c, ReclaimCommand::Started { upstream, .. } | ReclaimCommand::Act { upstream, .. } if *upstream == llm)
        })
        .collect();
    // Nothing live: a yield reclaim goes straight to the unload.
    match cmds.as_slice() {
        [
            ReclaimCommand::Started { entries, .. },
            ReclaimCommand::Act {
                cancel,
                unload,
                held,
                ..
            },
        ] => {
            assert!(entries.is_empty() && cancel.is_empty() && *unload);
            assert_eq!(held, &[(job, "broke off".to_owned())]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn no_work_and_no_yield_starts_no_reclaim() {
    // RECL-46: without unloading, a reclaim holds nothing.
    let mut e = engine(OnOwnerReturn::Drain, false);
    e.set_owner(OwnerPresence::Present);
    assert!(e.reclaim_step(t(100)).is_empty());
}

#[test]
fn a_yield_reclaim_holds_its_resources_even_after_the_owner_leaves() {
    // RECL-43, RECL-45, SCOPE-12
    let mut e = engine(OnOwnerReturn::Cancel, true);
    let job = admit(&mut e, "llm", 10).unwrap();
    e.set_owner(OwnerPresence::Present);
    let cmds = e.reclaim_step(t(100));
    let ids: Vec<ReclaimId> = started(&cmds).iter().map(|s| s.0).collect();
    assert_eq!(ids.len(), 2, "llm and helper both unload: {cmds:?}");
    e.release(job, ReleaseOutcome::Completed, t(200)).unwrap();
    sample_all(&mut e, 300);
    // The exempt tts shares ram with llm: busy while the reclaim holds it.
    let busy = admit(&mut e, "tts", 400).unwrap_err();
    assert_eq!(busy.code, RefusalCode::ResourceBusy);
    assert!(busy.reason.contains("yield_on_veto"), "{}", busy.reason);
    e.set_owner(OwnerPresence::Away);
    e.reclaim_step(t(500));
    assert_eq!(
        admit(&mut e, "llm", 600).unwrap_err().code,
        RefusalCode::ResourceBusy
    );
    for id in ids {
        e.reclaim_done(id, t(700)).unwrap();
    }
    // RECL-45: a fresh sample is due before new work.
    assert!(admit(&mut e, "tts", 800).is_err());
    sample_all(&mut e, 900);
    assert!(admit(&mut e, "tts", 1000).is_ok());
}

#[test]
fn without_yield_a_reclaim_holds_nothing() {
    // RECL-46, SCOPE-02: the exempt upstream keeps lending.
    let mut e = engine(OnOwnerReturn::Drain, false);
    admit(&mut e, "helper", 10).unwrap();
    e.set_owner(OwnerPresence::Present);
    assert_eq!(started(&e.reclaim_step(t(100))).len(), 1);
    // tts needs gpu1 (held by helper's job): use a spec where it is free.
    let mut e = engine(OnOwnerReturn::Drain, false);
    admit(&mut e, "llm", 10).unwrap();
    e.set_owner(OwnerPresence::Present);
    e.reclaim_step(t(100));
    assert_eq!(
        admit(&mut e, "tts", 200).unwrap_err().code,
        RefusalCode::ResourceBusy,
        "ram is reserved by llm's job, not by the reclaim"
    );
}

#[test]
fn exempt_upstreams_are_not_reclaimed_on_owner_return() {
    // SCOPE-02, SCOPE-07: presence never reclaims an exempt upstream; its
    // reclaim options apply to pressure only (see the pressure tests).
    let mut e = engine(OnOwnerReturn::Cancel, true);
    admit(&mut e, "tts", 10).unwrap();
    e.set_owner(OwnerPresence::Present);
    let cmds = e.reclaim_step(t(100));
    let names: Vec<UpstreamId> = cmds
        .iter()
        .filter_map(|c| match c {
            ReclaimCommand::Started { upstream, .. } => Some(*upstream),
            _ => None,
        })
        .collect();
    assert!(!names.contains(&e.upstream_id("tts").unwrap()), "{cmds:?}");
}

#[test]
fn pressure_reclaims_only_work_on_the_pressured_gpu() {
    // PRES-01, PRES-02, SCOPE-05
    let mut e = engine(OnOwnerReturn::Cancel, false);
    let on_gpu0 = admit(&mut e, "llm", 10).unwrap();
    e.pressure_trigger("gpu1", "engaged").unwrap();
    e.set_pressure_reading("gpu1", PressureVerdict::Refuses("engaged".into()), false)
        .unwrap();
    assert!(e.reclaim_step(t(100)).is_empty(), "nothing runs on gpu1");
    e.pressure_trigger("gpu0", "engaged").unwrap();
    let cmds = e.reclaim_step(t(200));
    assert_eq!(acts(&cmds), [(vec![on_gpu0], false)]);
    assert!(started(&cmds)[0].1.contains("gpu0"));
}

#[test]
fn while_the_veto_is_active_pressure_reclaims_only_exempt_upstreams() {
    // SCOPE-06, SCOPE-05
    let mut e = engine(OnOwnerReturn::Finish, false);
    let tts = admit(&mut e, "tts", 10).unwrap();
    e.set_owner(OwnerPresence::Present);
    e.reclaim_step(t(50));
    e.pressure_trigger("gpu1", "engaged").unwrap();
    e.set_pressure_reading("gpu1", PressureVerdict::Refuses("engaged".into()), false)
        .unwrap();
    let cmds = e.reclaim_step(t(100));
    match cmds.as_slice() {
        [
            ReclaimCommand::Started {
                upstream, entries, ..
            },
        ] => {
            assert_eq!(*upstream, e.upstream_id("tts").unwrap());
            assert_eq!(entries, &[tts]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_pressure_reclaim_stands_down_only_on_a_cleared_reading() {
    // RECL-06, RECL-07
    let mut e = engine(OnOwnerReturn::Drain, false);
    admit(&mut e, "tts", 10).unwrap();
    e.pressure_trigger("gpu1", "engaged").unwrap();
    e.set_pressure_reading("gpu1", PressureVerdict::Refuses("engaged".into()), false)
        .unwrap();
    e.reclaim_step(t(100));
    // Unknown reading: "not engaged", but not cleared.
    e.set_pressure_reading(
        "gpu1",
        PressureVerdict::Refuses("unavailable".into()),
        false,
    )
    .unwrap();
    assert!(e.reclaim_step(t(200)).is_empty());
    // Below threshold while the quiet time runs: cleared, though new work still waits.
    e.set_pressure_reading("gpu1", PressureVerdict::Refuses("releasing".into()), true)
        .unwrap();
    assert!(matches!(
        e.reclaim_step(t(300)).as_slice(),
        [ReclaimCommand::StoodDown { .. }]
    ));
}

#[test]
fn a_pressure_reclaim_of_a_host_upstream_also_needs_the_owner_away() {
    // RECL-06: for a host-scoped upstream the owner checks pass too.
    let mut e = engine(OnOwnerReturn::Drain, false);
    admit(&mut e, "llm", 10).unwrap();
    e.pressure_trigger("gpu0", "engaged").unwrap();
    e.set_pressure_reading("gpu0", PressureVerdict::Refuses("engaged".into()), false)
        .unwrap();
    e.reclaim_step(t(100));
    e.set_owner(OwnerPresence::Unknown);
    e.set_pressure_reading("gpu0", PressureVerdict::Admits, true)
        .unwrap();
    assert!(
        e.reclaim_step(t(200)).is_empty(),
        "owner edge absorbed, not cleared"
    );
    e.set_owner(OwnerPresence::Away);
    assert!(matches!(
        e.reclaim_step(t(300)).as_slice(),
        [ReclaimCommand::StoodDown { .. }]
    ));
}

#[test]
fn the_earliest_event_fixes_the_deadline() {
    // RECL-14
    let mut e = engine(OnOwnerReturn::Drain, false);
    admit(&mut e, "llm", 10).unwrap();
    e.set_owner(OwnerPresence::Present);
    e.reclaim_step(t(100));
    e.pressure_trigger("gpu0", "engaged").unwrap();
    assert!(e.reclaim_step(t(20_000)).is_empty(), "absorbed");
    assert_eq!(e.next_reclaim_deadline(), Some(t(30_100)));
    assert_eq!(acts(&e.reclaim_step(t(30_100))).len(), 1);
}

// ---- properties -----------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Owner(u8),
    Admit(u8),
    Release(u8, bool),
    Trigger(u8),
    Reading(u8, bool, bool),
    Sample,
    Advance(u32),
    Done,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..3).prop_map(Op::Owner),
        (0u8..3).prop_map(Op::Admit),
        (0u8..8, any::<bool>()).prop_map(|(i, c)| Op::Release(i, c)),
        (0u8..2).prop_map(Op::Trigger),
        (0u8..2, any::<bool>(), any::<bool>()).prop_map(|(g, a, c)| Op::Reading(g, a, c)),
        Just(Op::Sample),
        (1u32..40_000).prop_map(Op::Advance),
        Just(Op::Done),
    ]
}

fn mode() -> impl Strategy<Value = OnOwnerReturn> {
    prop_oneof![
        Just(OnOwnerReturn::Drain),
        Just(OnOwnerReturn::Cancel),
        Just(OnOwnerReturn::Finish)
    ]
}

proptest! {
    /// A stand-down never cancels or unloads anything; work on unrelated
    /// resources is never touched; nothing is admitted on a resource a
    /// yield reclaim holds (RECL-08, PRES-02, RECL-43).
    #[test]
    fn reclaim_invariants(mode in mode(), yield_on_veto in any::<bool>(), ops in prop::collection::vec(op(), 1..80)) {
        let mut e = engine(mode, yield_on_veto);
        let names = ["llm", "tts", "helper"];
        let gpus = ["gpu0", "gpu1"];
        let mut now = 0u64;
        let mut live: Vec<EntryId> = Vec::new();
        let mut stood_down: Vec<ReclaimId> = Vec::new();
        let mut acting: Vec<ReclaimId> = Vec::new();
        let mut reclaim_upstream: std::collections::HashMap<ReclaimId, (UpstreamId, Vec<String>)> = Default::default();
        let mut entry_upstream: std::collections::HashMap<EntryId, UpstreamId> = Default::default();
        for op in ops {
            match op {
                Op::Owner(i) => e.set_owner([OwnerPresence::Away, OwnerPresence::Present, OwnerPresence::Unknown][usize::from(i)]),
                Op::Admit(i) => {
                    let name = names[usize::from(i)];
                    let up = e.upstream_id(name).unwrap();
                    let deps: Vec<String> = e.status(t(now)).upstreams[up.0].resources.clone();
                    let held_by_reclaim = e.reclaims.iter().any(|rc| rc.holds && e.upstreams[rc.upstream].deps.iter().any(|d| deps.contains(&e.resources[d.res].spec.name)));
                    if let Ok(id) = admit(&mut e, name, now) {
                        prop_assert!(!held_by_reclaim, "admitted {name} while a yield reclaim holds its resources");
                        live.push(id);
                        entry_upstream.insert(id, up);
                    }
                }
                Op::Release(i, clean) => {
                    if !live.is_empty() {
                        let id = live.remove(usize::from(i) % live.len());
                        let outcome = if clean { ReleaseOutcome::Completed } else { ReleaseOutcome::Uncertain("x".into()) };
                        let _ = e.release(id, outcome, t(now));
                    }
                }
                Op::Trigger(g) => e.pressure_trigger(gpus[usize::from(g)], "engaged").unwrap(),
                Op::Reading(g, admits, cleared) => {
                    let v = if admits { PressureVerdict::Admits } else { PressureVerdict::Refuses("engaged".into()) };
                    e.set_pressure_reading(gpus[usize::from(g)], v, cleared || admits).unwrap();
                }
                Op::Sample => sample_all(&mut e, now),
                Op::Advance(ms) => now += u64::from(ms),
                Op::Done => {
                    if let Some(id) = acting.pop() {
                        e.reclaim_done(id, t(now)).unwrap();
                    }
                }
            }
            for cmd in e.reclaim_step(t(now)) {
                match cmd {
                    ReclaimCommand::Started { id, upstream, trigger, .. } => {
                        let pressured = match trigger { ReclaimTrigger::Pressure { resources, .. } => resources, _ => Vec::new() };
                        reclaim_upstream.insert(id, (upstream, pressured));
                    }
                    ReclaimCommand::StoodDown { id, .. } => {
                        prop_assert!(!acting.contains(&id));
                        stood_down.push(id);
                    }
                    ReclaimCommand::Act { id, upstream, cancel, .. } => {
                        prop_assert!(!stood_down.contains(&id), "an abandoned reclaim acted");
                        prop_assert!(mode != OnOwnerReturn::Finish || cancel.is_empty(), "finish cancelled (RECL-22)");
                        let (up, pressured) = &reclaim_upstream[&id];
                        prop_assert_eq!(*up, upstream);
                        let deps = e.status(t(now)).upstreams[up.0].resources.clone();
                        for r in pressured {
                            prop_assert!(deps.contains(r), "pressure on {r} reclaimed an unrelated upstream");
                        }
                        for c in &cancel {
                            prop_assert_eq!(entry_upstream[c], upstream, "cancelled work of another upstream");
                        }
                        acting.push(id);
                    }
                    ReclaimCommand::Finished { .. } => {}
                }
            }
        }
    }
}

#[test]
fn an_away_moment_between_two_steps_is_never_missed() {
    // OWN-01: work admitted while away is reclaimed when the owner returns,
    // even if no step ran while the owner was away.
    let mut e = Engine::new(spec(OnOwnerReturn::Cancel, false)).unwrap();
    e.set_owner(OwnerPresence::Present);
    assert!(e.reclaim_step(t(0)).is_empty(), "startup is no edge");
    sample_all(&mut e, 0);
    e.set_owner(OwnerPresence::Away);
    let job = admit(&mut e, "llm", 10).unwrap();
    e.set_owner(OwnerPresence::Present);
    assert_eq!(acts(&e.reclaim_step(t(20))), [(vec![job], false)]);
}

// PRES-02: a reclaim's trigger names the pressured GPU once, whether or not
// the reason given already names it.
#[test]
fn a_pressure_trigger_names_its_gpu_once() {
    let named = ReclaimTrigger::Pressure {
        resources: vec!["gpu0".to_owned()],
        why: "GPU pressure on gpu0 engaged: the owner's load is 64% / 6954 MiB".to_owned(),
    };
    assert_eq!(
        named.describe(),
        "GPU pressure on gpu0 engaged: the owner's load is 64% / 6954 MiB"
    );
    let bare = ReclaimTrigger::Pressure {
        resources: vec!["gpu0".to_owned()],
        why: "the owner's load is high".to_owned(),
    };
    assert_eq!(
        bare.describe(),
        "GPU pressure on gpu0: the owner's load is high"
    );
}

// PRES-01, PRES-03, RECL-06: a tracker's poll applied to the engine refuses
// new work on its GPU and reclaims the work there, as the daemon's loop does.
#[test]
fn an_applied_tracker_poll_refuses_and_reclaims_the_gpus_work() {
    use crate::engine::pressure::{
        Attendance, Baseline, Observation, OwnerLoad, PressureParams, PressureTracker,
    };
    let mut e = engine(OnOwnerReturn::Cancel, false);
    let on_gpu0 = admit(&mut e, "llm", 10).unwrap();
    let baseline = Baseline {
        attended: None,
        unattended: Some(OwnerLoad {
            util_pct: 0,
            memory_mib: 0,
        }),
    };
    let params = PressureParams {
        engage_after: Duration::ZERO,
        ..PressureParams::default()
    };
    let mut tracker = PressureTracker::new("gpu0", params, baseline, t(0));
    let owner = OwnerLoad {
        util_pct: 90,
        memory_mib: 8000,
    };
    let update = tracker.poll(t(20), Observation::Sample(owner, Attendance::Unattended));
    e.apply_pressure(&update).unwrap();
    let status = e.status(t(20));
    let gpu0 = status.resources.iter().find(|r| r.name == "gpu0").unwrap();
    assert!(
        gpu0.pressure.starts_with("GPU pressure engaged"),
        "{}",
        gpu0.pressure
    );
    let cmds = e.reclaim_step(t(30));
    assert_eq!(acts(&cmds), [(vec![on_gpu0], false)]);
}

/// A held entry of `upstream` on `resource`, restored after a restart with
/// the upstream's own handle `upstream_ref`.
fn restore(e: &mut Engine, upstream: &str, resource: &str, upstream_ref: Option<&str>) -> EntryId {
    let id = EntryId::from_u128(0xfeed + u128::from(upstream_ref.is_some()));
    let mut resources = vec![resource.to_owned()];
    if upstream != "helper" {
        resources.push("ram".to_owned());
    }
    e.restore_held(
        RestoredEntry {
            id,
            upstream: upstream.to_owned(),
            model: None,
            resources,
            admitted_at: t(0),
            started_before: std::time::Duration::ZERO,
            completion: CompletionMethod::Tracked,
            upstream_ref: upstream_ref.map(str::to_owned),
            borrower: None,
        },
        "restored after a restart",
    )
    .unwrap();
    id
}

fn act_of(cmds: &[ReclaimCommand]) -> Option<(Vec<EntryId>, Vec<EntryId>, Vec<EntryId>)> {
    cmds.iter().find_map(|c| match c {
        ReclaimCommand::Act {
            cancel,
            held,
            cancel_held,
            ..
        } => Some((
            cancel.clone(),
            held.iter().map(|(id, _)| *id).collect(),
            cancel_held.clone(),
        )),
        _ => None,
    })
}

// REC-03: a restored entry the upstream knows by its own ID (a ComfyUI prompt)
// is cancelled there at a later owner return, even with no live work and no
// unload; it stays listed as held (RECL-33).
#[test]
fn a_restored_prompt_is_cancelled_at_a_later_owner_return() {
    for mode in [OnOwnerReturn::Drain, OnOwnerReturn::Cancel] {
        let mut e = engine(mode, false);
        let held = restore(&mut e, "llm", "gpu0", Some("prompt-1"));
        e.set_owner(OwnerPresence::Present);
        let cmds = e.reclaim_step(t(100));
        assert_eq!(
            act_of(&cmds),
            Some((vec![], vec![held], vec![held])),
            "{mode}: {cmds:?}"
        );
    }
}

// REC-03 with RECL-22: finish never cancels, held work included; held work
// without an upstream handle cannot be found there and is only listed.
#[test]
fn held_work_is_cancelled_only_where_the_upstream_can_find_it_and_never_in_finish_mode() {
    let mut e = engine(OnOwnerReturn::Finish, false);
    restore(&mut e, "llm", "gpu0", Some("prompt-1"));
    e.set_owner(OwnerPresence::Present);
    assert!(
        e.reclaim_step(t(100)).is_empty(),
        "nothing to wait for or unload"
    );

    let mut e = engine(OnOwnerReturn::Finish, true);
    let held = restore(&mut e, "llm", "gpu0", Some("prompt-1"));
    e.set_owner(OwnerPresence::Present);
    let cmds = e.reclaim_step(t(100));
    assert_eq!(
        act_of(&cmds),
        Some((vec![], vec![held], vec![])),
        "{cmds:?}"
    );

    let mut e = engine(OnOwnerReturn::Cancel, true);
    let bare = restore(&mut e, "llm", "gpu0", None);
    e.set_owner(OwnerPresence::Present);
    let cmds = e.reclaim_step(t(100));
    assert_eq!(
        act_of(&cmds),
        Some((vec![], vec![bare], vec![])),
        "{cmds:?}"
    );
}
