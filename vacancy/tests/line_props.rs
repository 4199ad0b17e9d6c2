//! Property tests of the wait line (issue 22) under simulated time: random
//! arrivals, re-asks, job ends, samples, owner flips, departures and time.
//!
//! Checked after every step:
//! - never two jobs on one resource (ADM-01);
//! - fairness: a request is admitted only when no request that joined the
//!   line before it, and still waits, needs any of its resources; so the
//!   same resource set is first come, first served and a multi-resource
//!   request is never overtaken on a resource it needs (no starvation);
//! - no admission while the owner is present (OWN-01);
//! - every waiter is answered by its deadline: asked at or after it, the
//!   answer is never another wait;
//! - leaving or being refused reserves nothing;
//! - the vacancy sign tells a new request what it gets (issue 30):
//!   `admitting` is an admission, `queueing` a place in line, anything
//!   else no admission.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use vacancy::engine::{
    Decision, Engine, EngineSpec, EntryId, LINE_EXPIRY_GRACE, OwnerPresence, QueueSpec,
    ReleaseOutcome, ResourceSpec, UpstreamSpec, WorkRequest,
};
use vacancy::{CapacitySample, Moment, ResourceKind};

const RESOURCES: [&str; 2] = ["gpu0", "ram"];
/// a: gpu0 + ram, b: ram, c: gpu0.
const UPSTREAMS: [&str; 3] = ["a", "b", "c"];
const MAX_WAIT_MS: u64 = 3_000;

fn deps(upstream: usize) -> Vec<usize> {
    match upstream {
        0 => vec![0, 1],
        1 => vec![1],
        _ => vec![0],
    }
}

fn spec() -> EngineSpec {
    let resources = RESOURCES
        .iter()
        .map(|n| ResourceSpec::new(n, ResourceKind::Gpu, 1000))
        .collect();
    let mut a = UpstreamSpec::new("a", "gpu0", 1000);
    a.also_requires = vec!["ram".into()];
    let b = UpstreamSpec::new("b", "ram", 1000);
    let c = UpstreamSpec::new("c", "gpu0", 1000);
    let mut upstreams = vec![a, b, c];
    for u in &mut upstreams {
        u.queue = Some(QueueSpec {
            max_waiting: 6,
            max_wait: Duration::from_millis(MAX_WAIT_MS),
        });
    }
    EngineSpec {
        lending: true,
        resources,
        upstreams,
    }
}

#[derive(Debug, Clone)]
enum Event {
    Arrive(usize),
    Ask(usize),
    End(usize),
    Sample,
    Owner(bool),
    Leave(usize),
    Advance(u64),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (0..3usize).prop_map(Event::Arrive),
        6 => (0..16usize).prop_map(Event::Ask),
        3 => (0..8usize).prop_map(Event::End),
        3 => Just(Event::Sample),
        1 => any::<bool>().prop_map(Event::Owner),
        1 => (0..16usize).prop_map(Event::Leave),
        3 => (1..1500u64).prop_map(Event::Advance),
    ]
}

struct Pending {
    req: WorkRequest,
    upstream: usize,
    /// The order it joined the line in, once it has.
    joined: Option<u64>,
    until: Option<Moment>,
}

fn run(events: Vec<Event>) -> Result<(), TestCaseError> {
    let mut e = Engine::new(spec()).unwrap();
    e.set_owner(OwnerPresence::Away);
    let mut now = 0u64;
    let mut owner_away = true;
    let mut next_id = 0u128;
    let mut seq = 0u64;
    let mut pending: Vec<Pending> = Vec::new();
    let mut jobs: BTreeMap<EntryId, Vec<usize>> = BTreeMap::new();
    let sample_all = |e: &mut Engine, at: u64| {
        for r in RESOURCES {
            e.record_sample(
                r,
                CapacitySample::memory(60_000, 64_000, Moment::from_millis(at)),
            )
            .unwrap();
        }
    };
    sample_all(&mut e, 0);
    for ev in events {
        let t = Moment::from_millis(now);
        let mut sign = None;
        let ask = match ev {
            Event::Arrive(u) => {
                next_id += 1;
                let up = e.upstream_id(UPSTREAMS[u]).unwrap();
                sign = Some(e.vacancy(up, t));
                let mut req = WorkRequest::new(up, None, t);
                req.id = EntryId::from_u128(next_id);
                pending.push(Pending {
                    req,
                    upstream: u,
                    joined: None,
                    until: None,
                });
                Some(pending.len() - 1)
            }
            Event::Ask(i) if !pending.is_empty() => Some(i % pending.len()),
            Event::Ask(_) => None,
            Event::End(i) => {
                if let Some(id) = jobs.keys().nth(i % jobs.len().max(1)).copied() {
                    jobs.remove(&id);
                    e.release(id, ReleaseOutcome::Completed, t).unwrap();
                }
                None
            }
            Event::Sample => {
                now += 1;
                sample_all(&mut e, now);
                None
            }
            Event::Owner(away) => {
                owner_away = away;
                e.set_owner(if away {
                    OwnerPresence::Away
                } else {
                    OwnerPresence::Present
                });
                None
            }
            Event::Leave(i) => {
                if !pending.is_empty() {
                    let p = pending.remove(i % pending.len());
                    e.leave_line(p.req.id);
                    prop_assert!(!e.in_line(p.req.id));
                }
                None
            }
            Event::Advance(ms) => {
                now += ms;
                None
            }
        };
        let Some(i) = ask else { continue };
        let t = Moment::from_millis(now);
        // A waiter that did not ask again within the grace after its
        // deadline is dropped from the line: it asks as a new request.
        for p in &mut pending {
            if p.until.is_some_and(|u| t >= u.after(LINE_EXPIRY_GRACE)) {
                p.joined = None;
                p.until = None;
            }
        }
        let decision = e.admit(&pending[i].req, t);
        let p = &pending[i];
        if let Some(v) = sign {
            let told = match &decision {
                Decision::Admitted(_) => v.admitting,
                Decision::Wait { .. } if e.in_line(p.req.id) => v.queueing.is_some(),
                // The post-job sample first, then its turn behind any waiters.
                Decision::Wait { .. } => !v.admitting,
                _ => !v.admitting && v.queueing.is_none(),
            };
            prop_assert!(
                told,
                "the sign said {} but a new request got {decision:?}",
                v.sign()
            );
        }
        match decision {
            Decision::Admitted(r) => {
                let needs = deps(p.upstream);
                prop_assert!(owner_away, "admitted while the owner is present");
                for (other, held) in &jobs {
                    prop_assert!(
                        !held.iter().any(|x| needs.contains(x)),
                        "{} admitted on a resource {other} holds",
                        r.id
                    );
                }
                // Fairness: nobody still waiting joined before it on a shared resource.
                let mine = p.joined.unwrap_or(u64::MAX);
                for q in &pending {
                    if q.req.id != p.req.id
                        && e.in_line(q.req.id)
                        && q.joined.is_some_and(|j| j < mine)
                    {
                        let theirs = deps(q.upstream);
                        prop_assert!(
                            !theirs.iter().any(|x| needs.contains(x)),
                            "{} (upstream {}) overtook {} (upstream {}) that joined earlier",
                            p.req.id,
                            UPSTREAMS[p.upstream],
                            q.req.id,
                            UPSTREAMS[q.upstream]
                        );
                    }
                }
                jobs.insert(r.id, needs);
                pending.remove(i);
            }
            Decision::Wait { until, .. } => {
                if let Some(deadline) = p.until {
                    prop_assert!(t < deadline, "asked at its deadline, told to wait again");
                }
                prop_assert!(until > t, "a wait that ends before now");
                let in_line = e.in_line(p.req.id);
                let p = &mut pending[i];
                if in_line && p.joined.is_none() {
                    seq += 1;
                    p.joined = Some(seq);
                    p.until = Some(t.after(Duration::from_millis(MAX_WAIT_MS)));
                }
            }
            Decision::Reobserve(_) => prop_assert!(false, "no observation, no RES-20"),
            Decision::Refused(_) => {
                prop_assert!(!e.in_line(p.req.id), "refused but still in line");
                pending.remove(i);
            }
        }
        prop_assert_eq!(e.entry_count(), jobs.len(), "only admissions reserve");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_wait_line_is_fair_safe_and_answers_every_waiter_by_its_deadline(
        events in proptest::collection::vec(event(), 1..200)
    ) {
        run(events)?;
    }
}
