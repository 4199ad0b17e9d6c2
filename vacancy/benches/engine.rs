//! Engine admit + release throughput (target: <= 2 µs, flat in the
//! number of resources and upstreams). Each iteration admits one job, releases
//! it, and records the post-job sample that the next admission needs (ADM-04),
//! cycling through the upstreams.
//!
//! Run: `cargo bench -p vacancy --bench engine`; criterion prints the time per
//! iteration (one admit + one release + one sample).
//!
//! `engine_reclaim_step` measures the reclaim planner the daemon steps every
//! 250 ms and after every change: `idle` with one job running on each of `n`
//! upstreams and nothing to reclaim, and `owner_return` for a whole cycle (the
//! owner returns and `n` drain reclaims start; the owner leaves and they stand
//! down).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use vacancy::engine::{
    CompletionMethod, Decision, Engine, EngineSpec, EntryId, OwnerPresence, ReleaseOutcome,
    RequestReuse, ResourceSpec, UpstreamSpec, WorkRequest,
};
use vacancy::{CapacitySample, Moment, ResourceKind};

/// `n` GPUs plus system memory, and `n` upstreams: upstream i borrows gpu i
/// with a per-model requirement, so the table sizes grow while each admission
/// touches one resource.
fn engine(n: usize) -> (Engine, Vec<WorkRequest>) {
    let mut resources: Vec<ResourceSpec> = (0..n)
        .map(|i| ResourceSpec::new(&format!("gpu{i}"), ResourceKind::Gpu, 2048))
        .collect();
    resources.push(ResourceSpec::new("ram", ResourceKind::Memory, 8192));
    let upstreams = (0..n)
        .map(|i| {
            let mut u = UpstreamSpec::new(&format!("up{i}"), &format!("gpu{i}"), 6000);
            u.models.insert(
                "llama3.1:8b".into(),
                vacancy::engine::ModelBudget {
                    min_free_mib: Some(5000),
                    resident_min_free_mib: None,
                },
            );
            u
        })
        .collect();
    let mut e = Engine::new(EngineSpec {
        lending: true,
        resources,
        upstreams,
    })
    .unwrap();
    e.set_owner(OwnerPresence::Away);
    for i in 0..n {
        e.record_sample(
            &format!("gpu{i}"),
            CapacitySample::memory(64_000, 80_000, Moment::ZERO),
        )
        .unwrap();
    }
    e.record_sample("ram", CapacitySample::memory(64_000, 128_000, Moment::ZERO))
        .unwrap();
    let requests = (0..n)
        .map(|i| WorkRequest {
            id: EntryId::from_u128(0),
            upstream: e.upstream_id(&format!("up{i}")).unwrap(),
            model: Some("llama3.1:8b".into()),
            canonical_model: None,
            arrived_at: Moment::ZERO,
            completion: CompletionMethod::ResponseEnd,
            reuse: RequestReuse::Reuses,
            upstream_ref: None,
            wait: None,
            borrower: None,
            priority: None,
        })
        .collect();
    (e, requests)
}

fn admit_release(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine_admit_release_sample");
    for n in [1usize, 64] {
        let (mut e, mut requests) = engine(n);
        let names: Vec<String> = (0..n).map(|i| format!("gpu{i}")).collect();
        let mut tick: u64 = 1;
        let mut next: u128 = 1;
        group.bench_function(format!("{n}_resources"), |b| {
            b.iter(|| {
                let i = (tick as usize) % n;
                let now = Moment::from_nanos(tick * 1_000);
                let req = &mut requests[i];
                req.id = EntryId::from_u128(next);
                req.arrived_at = now;
                next += 1;
                let Decision::Admitted(res) = e.admit(black_box(req), now) else {
                    panic!("benchmark request refused");
                };
                e.release(
                    res.id,
                    ReleaseOutcome::Completed,
                    now.after(std::time::Duration::from_nanos(10)),
                )
                .unwrap();
                e.record_sample(
                    &names[i],
                    CapacitySample::memory(
                        64_000,
                        80_000,
                        now.after(std::time::Duration::from_nanos(20)),
                    ),
                )
                .unwrap();
                tick += 1;
            });
        });
    }
    group.finish();
}

/// With `named`, 1,000 borrowers on `e`, each with `max_running` and a
/// daily GPU budget: their handles; else one anonymous slot.
fn thousand_borrowers(e: &mut Engine, named: bool) -> Vec<Option<vacancy::engine::BorrowerId>> {
    use vacancy::engine::{BorrowerSpec, BorrowersSpec, BudgetPeriod, TimeBudget};
    if !named {
        return vec![None];
    }
    let borrowers = (0..1000)
        .map(|i| {
            let mut b = BorrowerSpec::new(&format!("b{i}"));
            b.max_running = Some(2);
            b.budgets = vec![TimeBudget {
                kind: ResourceKind::Gpu,
                period: BudgetPeriod::Day,
                allowed: std::time::Duration::from_secs(3600),
            }];
            b
        })
        .collect();
    e.set_borrowers(Some(BorrowersSpec {
        borrowers,
        batch_max_wait: std::time::Duration::from_secs(60),
        anonymous: None,
    }))
    .unwrap();
    (0..1000).map(|i| e.borrower_id(&format!("b{i}"))).collect()
}

/// The same cycle on one GPU, effects drained, anonymous and with 1,000
/// named borrowers configured (issue 34: within 10% of anonymous admission), each with a daily GPU budget and
/// a `max_running`, the requests cycling through them; the owner's record
/// (`Effect::Account`) is queued at each release.
fn admit_release_borrowers(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine_admit_release_sample_drained");
    for named in [false, true] {
        let (mut e, mut requests) = engine(1);
        let ids = thousand_borrowers(&mut e, named);
        let mut tick: u64 = 1;
        let mut next: u128 = 1;
        let name = if named { "1000_borrowers" } else { "anonymous" };
        group.bench_function(name, |b| {
            b.iter(|| {
                let now = Moment::from_nanos(tick * 1_000);
                let req = &mut requests[0];
                req.id = EntryId::from_u128(next);
                req.arrived_at = now;
                req.borrower =
                    ids[(tick as usize) % ids.len()].map(vacancy::engine::BorrowerRef::Id);
                next += 1;
                let Decision::Admitted(res) = e.admit(black_box(req), now) else {
                    panic!("benchmark request refused");
                };
                e.release(
                    res.id,
                    ReleaseOutcome::Completed,
                    now.after(std::time::Duration::from_nanos(10)),
                )
                .unwrap();
                e.record_sample(
                    "gpu0",
                    CapacitySample::memory(
                        64_000,
                        80_000,
                        now.after(std::time::Duration::from_nanos(20)),
                    ),
                )
                .unwrap();
                while e.poll_effect().is_some() {}
                tick += 1;
            });
        });
    }
    group.finish();
}

/// Admission alone (issue 34: "admission cost with 1,000 configured
/// borrowers stays within 10% of anonymous admission"): 64 admissions in a
/// row on 64 GPUs, timed together; their releases and post-job samples
/// follow, untimed. The whole cycle with the owner's record is
/// `engine_admit_release_sample_drained` above.
fn admit_borrowers(c: &mut Criterion) {
    use std::time::{Duration, Instant};
    const N: usize = 64;
    let mut group = c.benchmark_group("engine_admit_64");
    for named in [false, true] {
        let (mut e, mut requests) = engine(N);
        let names: Vec<String> = (0..N).map(|i| format!("gpu{i}")).collect();
        let ids = thousand_borrowers(&mut e, named);
        let mut tick: u64 = 1;
        let mut next: u128 = 1;
        let mut admitted = Vec::with_capacity(N);
        let name = if named { "1000_borrowers" } else { "anonymous" };
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let now = Moment::from_nanos(tick * 1_000);
                    for req in &mut requests {
                        req.id = EntryId::from_u128(next);
                        req.arrived_at = now;
                        req.borrower =
                            ids[(next as usize) % ids.len()].map(vacancy::engine::BorrowerRef::Id);
                        next += 1;
                    }
                    let started = Instant::now();
                    for req in &requests {
                        admitted.push(e.admit(black_box(req), now));
                    }
                    timed += started.elapsed();
                    for d in admitted.drain(..) {
                        let Decision::Admitted(res) = d else {
                            panic!("benchmark request refused");
                        };
                        e.release(
                            res.id,
                            ReleaseOutcome::Completed,
                            now.after(Duration::from_nanos(10)),
                        )
                        .unwrap();
                    }
                    for n in &names {
                        e.record_sample(
                            n,
                            CapacitySample::memory(
                                64_000,
                                80_000,
                                now.after(Duration::from_nanos(20)),
                            ),
                        )
                        .unwrap();
                    }
                    while e.poll_effect().is_some() {}
                    tick += 1;
                }
                // Per admission.
                timed / N as u32
            });
        });
    }
    group.finish();
}

fn reclaim_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine_reclaim_step");
    for n in [1usize, 64] {
        let (mut e, requests) = engine(n);
        for (i, req) in requests.iter().enumerate() {
            let mut req = req.clone();
            req.id = EntryId::from_u128(i as u128 + 1);
            let Decision::Admitted(_) = e.admit(&req, Moment::ZERO) else {
                panic!("benchmark request refused");
            };
        }
        let mut tick: u64 = 1;
        group.bench_function(format!("idle_{n}_upstreams"), |b| {
            b.iter(|| {
                tick += 1;
                black_box(e.reclaim_step(Moment::from_nanos(tick * 1_000)))
            });
        });
        group.bench_function(format!("owner_return_{n}_upstreams"), |b| {
            b.iter(|| {
                tick += 1;
                let now = Moment::from_nanos(tick * 1_000);
                e.set_owner(OwnerPresence::Present);
                assert_eq!(e.reclaim_step(now).len(), n);
                e.set_owner(OwnerPresence::Away);
                black_box(e.reclaim_step(now))
            });
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    admit_release,
    admit_release_borrowers,
    admit_borrowers,
    reclaim_step
);
criterion_main!(benches);
