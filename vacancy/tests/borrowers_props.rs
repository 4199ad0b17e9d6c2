//! Property tests of borrowers with names (issue 34) under simulated time:
//! random borrowers, arrivals and job lengths through a shell that asks
//! every waiter again at each step, as the daemon does on `WakeWaiters`.
//!
//! Checked:
//! - fair turns: while a waiter of borrower B waits, another borrower X is
//!   admitted on its resource at most `(k + 1) * share_X / share_B + 1`
//!   times, `k` being B's own waiters ahead of it when it joined; so with
//!   equal shares a single waiter waits about one job per other borrower
//!   (two if B had the latest turn), whatever their backlogs;
//! - priority without starvation: a batch waiter among interactive floods
//!   is admitted within `batch_max_wait` plus the job in service then
//!   (plus the post-job sample);
//! - limits and budgets are never exceeded: running <= max_running,
//!   waiting <= max_waiting, and no job starts once its borrower's budget
//!   for the period is spent (running jobs counted as the engine counts
//!   them; `quota_exhausted` only then); never two jobs on one resource.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use vacancy::engine::{
    BorrowerSpec, BorrowersSpec, BudgetPeriod, Decision, Engine, EngineSpec, EntryId,
    OwnerPresence, Priority, QueueSpec, RefusalCode, ReleaseOutcome, ResourceSpec, TimeBudget,
    UpstreamSpec, WorkRequest,
};
use vacancy::{CapacitySample, Moment, ResourceKind};

const STEP_MS: u64 = 250;
const DAY_MS: u64 = 86_400_000;

/// gpu0: `one`; gpu1: `two`; both: `pair`. Each with a long line.
fn spec() -> EngineSpec {
    let resources = ["gpu0", "gpu1"]
        .iter()
        .map(|n| ResourceSpec::new(n, ResourceKind::Gpu, 1000))
        .collect();
    let one = UpstreamSpec::new("one", "gpu0", 1000);
    let two = UpstreamSpec::new("two", "gpu1", 1000);
    let mut pair = UpstreamSpec::new("pair", "gpu0", 1000);
    pair.also_requires = vec!["gpu1".into()];
    let mut upstreams = vec![one, two, pair];
    for u in &mut upstreams {
        u.queue = Some(QueueSpec {
            max_waiting: 1000,
            max_wait: Duration::from_secs(3600),
        });
    }
    EngineSpec {
        lending: true,
        resources,
        upstreams,
    }
}

fn deps(upstream: usize) -> Vec<usize> {
    match upstream {
        0 => vec![0],
        1 => vec![1],
        _ => vec![0, 1],
    }
}

#[derive(Debug, Clone)]
struct Arrival {
    at_ms: u64,
    borrower: usize,
    upstream: usize,
    batch: bool,
    job_ms: u64,
}

struct Waiting {
    req: WorkRequest,
    a: Arrival,
    joined_ms: Option<u64>,
    /// The borrower's own waiters (same class) ahead of it when it joined.
    own_ahead: u32,
    /// Admissions of each other borrower on a resource it needs since it joined.
    others: BTreeMap<usize, u32>,
}

struct Job {
    borrower: usize,
    resources: Vec<usize>,
    admitted_ms: u64,
    ends_ms: u64,
}

/// What the borrower used of GPU time in the UTC day holding `now_ms`
/// (the timeline's origin is `origin_ms` of the day), finished and running.
fn used_ms(
    finished: &[(usize, u64, u64, u64)],
    jobs: &BTreeMap<EntryId, Job>,
    b: usize,
    now_ms: u64,
    origin_ms: u64,
) -> u64 {
    let day_start = (now_ms + origin_ms) / DAY_MS * DAY_MS;
    let from = day_start.saturating_sub(origin_ms);
    let part = |a: u64, e: u64| e.saturating_sub(a.max(from));
    let done: u64 = finished
        .iter()
        .filter(|f| f.0 == b)
        .map(|&(_, n, a, e)| n * part(a, e))
        .sum();
    let running: u64 = jobs
        .values()
        .filter(|j| j.borrower == b)
        .map(|j| j.resources.len() as u64 * part(j.admitted_ms, now_ms))
        .sum();
    done + running
}

struct Outcome {
    /// (borrower, batch, wait in ms) of each admitted waiter.
    waits: Vec<(usize, bool, u64)>,
}

/// Run the arrivals to their end (or `horizon_ms`) and check the invariants
/// that hold for every table.
fn run(
    table: &BorrowersSpec,
    mut arrivals: Vec<Arrival>,
    origin_ms: u64,
    horizon_ms: u64,
    check_fairness: bool,
) -> Result<Outcome, TestCaseError> {
    arrivals.sort_by_key(|a| a.at_ms);
    let mut e = Engine::new(spec()).unwrap();
    e.set_owner(OwnerPresence::Away);
    e.set_borrowers(Some(table.clone())).unwrap();
    e.set_wall_clock(Moment::ZERO, i64::try_from(origin_ms).unwrap());
    let sample = |e: &mut Engine, at: u64| {
        for r in ["gpu0", "gpu1"] {
            e.record_sample(
                r,
                CapacitySample::memory(60_000, 64_000, Moment::from_millis(at)),
            )
            .unwrap();
        }
    };
    sample(&mut e, 0);
    let ups: Vec<_> = ["one", "two", "pair"]
        .iter()
        .map(|n| e.upstream_id(n).unwrap())
        .collect();
    let names: Vec<String> = table.borrowers.iter().map(|b| b.name.clone()).collect();
    let mut next = 0usize;
    let mut next_id = 0u128;
    let mut line: Vec<Waiting> = Vec::new();
    let mut jobs: BTreeMap<EntryId, Job> = BTreeMap::new();
    let mut finished: Vec<(usize, u64, u64, u64)> = Vec::new();
    let mut waits = Vec::new();
    let mut now = 0u64;
    let mut sample_due = false;
    while now <= horizon_ms && (next < arrivals.len() || !line.is_empty() || !jobs.is_empty()) {
        let t = Moment::from_millis(now);
        if sample_due {
            sample(&mut e, now);
            sample_due = false;
        }
        let ended: Vec<EntryId> = jobs
            .iter()
            .filter(|(_, j)| j.ends_ms <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in ended {
            let j = jobs.remove(&id).unwrap();
            e.release(id, ReleaseOutcome::Completed, t).unwrap();
            finished.push((j.borrower, j.resources.len() as u64, j.admitted_ms, now));
            sample_due = true;
        }
        while next < arrivals.len() && arrivals[next].at_ms <= now {
            let a = arrivals[next].clone();
            next += 1;
            next_id += 1;
            let mut req =
                WorkRequest::new(ups[a.upstream], None, t).for_borrower(&names[a.borrower]);
            req.id = EntryId::from_u128(next_id);
            req.priority = a.batch.then_some(Priority::Batch);
            line.push(Waiting {
                req,
                a,
                joined_ms: None,
                own_ahead: 0,
                others: BTreeMap::new(),
            });
        }
        // Everyone in line (and every newcomer) asks, in arrival order.
        let mut i = 0;
        while i < line.len() {
            let decision = e.admit(&line[i].req, t);
            let w = &line[i];
            let b = w.a.borrower;
            let spec = &table.borrowers[b];
            match decision {
                Decision::Admitted(r) => {
                    let needs = deps(w.a.upstream);
                    for j in jobs.values() {
                        prop_assert!(
                            !j.resources.iter().any(|x| needs.contains(x)),
                            "two jobs on one resource"
                        );
                    }
                    for budget in &spec.budgets {
                        let used = used_ms(&finished, &jobs, b, now, origin_ms);
                        prop_assert!(
                            u128::from(used) < budget.allowed.as_millis(),
                            "{} admitted with {used} ms of {:?} used",
                            spec.name,
                            budget.allowed
                        );
                    }
                    let running = jobs.values().filter(|j| j.borrower == b).count() as u32;
                    if let Some(max) = spec.max_running {
                        prop_assert!(running < max, "{} over max_running", spec.name);
                    }
                    if let Some(joined) = w.joined_ms {
                        waits.push((b, w.a.batch, now - joined));
                        if check_fairness {
                            for (x, n) in &w.others {
                                let (sx, sb) =
                                    (f64::from(table.borrowers[*x].share), f64::from(spec.share));
                                let bound = f64::from(w.own_ahead + 1) * sx / sb + 1.0;
                                prop_assert!(
                                    f64::from(*n) <= bound + 1e-9,
                                    "{} waited through {n} jobs of {} (bound {bound})",
                                    spec.name,
                                    table.borrowers[*x].name
                                );
                            }
                        }
                    }
                    for other in line.iter_mut() {
                        if other.joined_ms.is_some()
                            && other.a.borrower != b
                            && deps(other.a.upstream).iter().any(|x| needs.contains(x))
                        {
                            *other.others.entry(b).or_default() += 1;
                        }
                    }
                    let w = line.remove(i);
                    jobs.insert(
                        r.id,
                        Job {
                            borrower: b,
                            resources: needs,
                            admitted_ms: now,
                            ends_ms: now + w.a.job_ms,
                        },
                    );
                }
                Decision::Wait { .. } => {
                    if w.joined_ms.is_none() && e.in_line(w.req.id) {
                        let own = line[..i]
                            .iter()
                            .filter(|o| {
                                o.joined_ms.is_some()
                                    && o.a.borrower == b
                                    && o.a.batch == line[i].a.batch
                            })
                            .count() as u32;
                        let w = &mut line[i];
                        w.joined_ms = Some(now);
                        w.own_ahead = own;
                    }
                    i += 1;
                }
                Decision::Refused(r) => {
                    if r.code == RefusalCode::QuotaExhausted {
                        let used = used_ms(&finished, &jobs, b, now, origin_ms);
                        prop_assert!(
                            spec.budgets
                                .iter()
                                .any(|bg| u128::from(used) >= bg.allowed.as_millis()),
                            "quota_exhausted with budget left"
                        );
                    }
                    prop_assert!(!e.in_line(line[i].req.id), "refused but in line");
                    line.remove(i);
                }
                Decision::Reobserve(_) => prop_assert!(false, "no observation, no RES-20"),
            }
        }
        for (b, spec) in table.borrowers.iter().enumerate() {
            let waiting = line
                .iter()
                .filter(|w| w.a.borrower == b && e.in_line(w.req.id))
                .count() as u32;
            if let Some(max) = spec.max_waiting {
                prop_assert!(waiting <= max, "{} over max_waiting", spec.name);
            }
            let running = jobs.values().filter(|j| j.borrower == b).count() as u32;
            if let Some(max) = spec.max_running {
                prop_assert!(running <= max, "{} over max_running", spec.name);
            }
        }
        prop_assert_eq!(e.entry_count(), jobs.len());
        now += STEP_MS;
    }
    Ok(Outcome { waits })
}

fn arrival(borrowers: usize, upstreams: usize, batch: bool) -> impl Strategy<Value = Arrival> {
    (0..60_000u64, 0..borrowers, 0..upstreams, 1..=20u64).prop_map(move |(at, b, u, job)| Arrival {
        at_ms: at / STEP_MS * STEP_MS,
        borrower: b,
        upstream: u,
        batch,
        job_ms: job * STEP_MS,
    })
}

fn borrower(i: usize, share: u32) -> BorrowerSpec {
    let mut b = BorrowerSpec::new(&format!("b{i}"));
    b.share = share;
    b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn borrowers_fair_turns_bound_each_waiters_wait_by_the_others_shares(
        shares in proptest::collection::vec(1..=3u32, 2..=4),
        arrivals in proptest::collection::vec(arrival(4, 1, false), 1..60),
    ) {
        let n = shares.len();
        let table = BorrowersSpec {
            borrowers: shares.iter().enumerate().map(|(i, s)| borrower(i, *s)).collect(),
            batch_max_wait: Duration::from_secs(3600),
            anonymous: None,
        };
        let arrivals = arrivals
            .into_iter()
            .map(|mut a| {
                a.borrower %= n;
                a
            })
            .collect();
        run(&table, arrivals, 0, 10 * 3_600_000, true)?;
    }

    #[test]
    fn borrowers_a_batch_waiter_is_served_within_batch_max_wait_and_one_job(
        max_wait_s in 2..30u64,
        batch_at in 0..20_000u64,
        batch_job in 1..=20u64,
        flood in proptest::collection::vec(arrival(2, 1, false), 10..80),
    ) {
        let mut bob = borrower(2, 1);
        bob.priority = Priority::Batch;
        let table = BorrowersSpec {
            borrowers: vec![borrower(0, 1), borrower(1, 1), bob],
            batch_max_wait: Duration::from_secs(max_wait_s),
            anonymous: None,
        };
        let mut arrivals = flood;
        arrivals.push(Arrival {
            at_ms: batch_at / STEP_MS * STEP_MS,
            borrower: 2,
            upstream: 0,
            batch: false,
            job_ms: batch_job * STEP_MS,
        });
        let out = run(&table, arrivals, 0, 10 * 3_600_000, false)?;
        let longest_job = 20 * STEP_MS;
        for (b, _, waited) in out.waits {
            if b == 2 {
                // Overdue at max_wait_s (seen at the next step), then the
                // job in service ends and its sample lands (two steps).
                let bound = max_wait_s * 1000 + STEP_MS + longest_job + 2 * STEP_MS;
                prop_assert!(waited <= bound, "the batch waiter waited {waited} ms (bound {bound})");
            }
        }
    }

    #[test]
    fn borrowers_limits_and_budgets_are_never_exceeded(
        limits in proptest::collection::vec(
            (proptest::option::of(1..=3u32), proptest::option::of(1..=4u32), proptest::option::of(2..=40u64), 1..=3u32, any::<bool>()),
            2..=4,
        ),
        arrivals in proptest::collection::vec(arrival(4, 3, false), 1..80),
        lowered in proptest::collection::vec(any::<bool>(), 80),
        boundary_s in 0..60u64,
    ) {
        let n = limits.len();
        let table = BorrowersSpec {
            borrowers: limits
                .iter()
                .enumerate()
                .map(|(i, (running, waiting, budget_s, share, batch))| {
                    let mut b = borrower(i, *share);
                    b.max_running = *running;
                    b.max_waiting = *waiting;
                    if *batch {
                        b.priority = Priority::Batch;
                    }
                    b.budgets = budget_s
                        .iter()
                        .map(|s| TimeBudget {
                            kind: ResourceKind::Gpu,
                            period: BudgetPeriod::Day,
                            allowed: Duration::from_secs(*s),
                        })
                        .collect();
                    b
                })
                .collect(),
            batch_max_wait: Duration::from_secs(10),
            anonymous: None,
        };
        let arrivals = arrivals
            .into_iter()
            .zip(lowered)
            .map(|(mut a, low)| {
                a.borrower %= n;
                a.batch = low;
                a
            })
            .collect();
        // A UTC day ends `boundary_s` into the run.
        run(&table, arrivals, DAY_MS - boundary_s * 1000, 10 * 3_600_000, false)?;
    }
}
