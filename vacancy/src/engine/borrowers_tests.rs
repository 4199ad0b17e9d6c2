//! Borrowers with names (issue 34): turns, classes, limits, budgets and
//! the owner's record. None of these is a seed rule; each test names its
//! behaviour.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use super::super::*;

const GPU: &str = "gpu0";

fn t(ms: u64) -> Moment {
    Moment::from_millis(ms)
}

/// One GPU, one upstream `llm` on it with a line of `max_waiting` and 10 min
/// of waiting; and `side` on a GPU of its own, without a line.
fn spec() -> EngineSpec {
    let mut llm = UpstreamSpec::new("llm", GPU, 1000);
    llm.queue = Some(QueueSpec {
        max_waiting: 100,
        max_wait: Duration::from_secs(600),
    });
    EngineSpec {
        lending: true,
        resources: vec![
            ResourceSpec::new(GPU, ResourceKind::Gpu, 1000),
            ResourceSpec::new("gpu1", ResourceKind::Gpu, 1000),
        ],
        upstreams: vec![llm, UpstreamSpec::new("side", "gpu1", 1000)],
    }
}

fn table(borrowers: Vec<BorrowerSpec>) -> BorrowersSpec {
    BorrowersSpec {
        borrowers,
        batch_max_wait: Duration::from_secs(60),
        anonymous: None,
    }
}

fn engine(borrowers: Option<BorrowersSpec>) -> Engine {
    let mut e = Engine::new(spec()).unwrap();
    e.set_owner(OwnerPresence::Away);
    e.set_borrowers(borrowers).unwrap();
    sample(&mut e, 0);
    e
}

fn sample(e: &mut Engine, at: u64) {
    for r in [GPU, "gpu1"] {
        e.record_sample(r, CapacitySample::memory(60_000, 80_000, t(at)))
            .unwrap();
    }
}

fn ask(e: &Engine, upstream: &str, who: &str, at: u64) -> WorkRequest {
    WorkRequest::new(e.upstream_id(upstream).unwrap(), None, t(at)).for_borrower(who)
}

fn refused(d: Decision) -> Refusal {
    match d {
        Decision::Refused(r) => r,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn admitted(d: Decision) -> Reservation {
    match d {
        Decision::Admitted(r) => r,
        other => panic!("expected an admission, got {other:?}"),
    }
}

/// Every pending request asks at `at`; the one admitted (at most one: one
/// GPU) leaves `pending` and is returned with its borrower.
fn serve(
    e: &mut Engine,
    pending: &mut Vec<(String, WorkRequest)>,
    at: u64,
) -> Option<(String, Reservation)> {
    let mut won = None;
    let mut i = 0;
    while i < pending.len() {
        match e.admit(&pending[i].1, t(at)) {
            Decision::Admitted(r) => {
                assert!(won.is_none(), "two admissions on one GPU");
                let (who, _) = pending.remove(i);
                won = Some((who, r));
            }
            Decision::Wait { .. } => i += 1,
            other => panic!("a waiter was answered {other:?}"),
        }
    }
    won
}

/// Run the line to its end: each admitted job takes 1 s, then a fresh
/// sample. Returns the borrowers in the order they were served.
fn drain_line(e: &mut Engine, mut pending: Vec<(String, WorkRequest)>, mut at: u64) -> Vec<String> {
    let mut order = Vec::new();
    while let Some((who, r)) = serve(e, &mut pending, at) {
        order.push(who);
        at += 1000;
        e.release(r.id, ReleaseOutcome::Completed, t(at)).unwrap();
        sample(e, at + 1);
        at += 2;
    }
    assert!(
        pending.is_empty(),
        "waiters left unserved: {}",
        pending.len()
    );
    order
}

/// `n` requests of each borrower joining in that order behind a running job.
fn queue_up(
    e: &mut Engine,
    who: &[(&str, usize, Option<Priority>)],
    at: u64,
) -> Vec<(String, WorkRequest)> {
    let mut pending = Vec::new();
    for (name, n, priority) in who {
        for _ in 0..*n {
            let mut r = ask(e, "llm", name, at);
            r.priority = *priority;
            match e.admit(&r, t(at)) {
                Decision::Wait { .. } => pending.push(((*name).to_owned(), r)),
                other => panic!("{name} expected to wait, got {other:?}"),
            }
        }
    }
    pending
}

fn alice_bob() -> BorrowersSpec {
    table(vec![BorrowerSpec::new("alice"), BorrowerSpec::new("bob")])
}

#[test]
fn borrowers_off_ignore_a_named_request() {
    let mut e = engine(None);
    admitted(e.admit(&ask(&e, "llm", "nobody", 10), t(10)));
    assert!(e.status(t(10)).borrowers.is_empty());
    assert_eq!(e.borrower_id("nobody"), None);
}

#[test]
fn borrowers_an_unknown_name_is_refused_unknown_borrower_401() {
    let mut e = engine(Some(alice_bob()));
    let r = refused(e.admit(&ask(&e, "llm", "mallory", 10), t(10)));
    assert_eq!(r.code, RefusalCode::UnknownBorrower);
    assert_eq!(r.code.http_status(), 401);
    assert_eq!(r.code.as_str(), "unknown_borrower");
    assert!(r.reason.contains("not known"), "{}", r.reason);
}

#[test]
fn borrowers_anonymous_requests_are_refused_unless_let_in() {
    let mut e = engine(Some(alice_bob()));
    let anon = WorkRequest::new(e.upstream_id("llm").unwrap(), None, t(10));
    assert_eq!(
        refused(e.admit(&anon, t(10))).code,
        RefusalCode::UnknownBorrower
    );
    let mut spec = alice_bob();
    spec.anonymous = Some(BorrowerSpec::new("ignored"));
    e.set_borrowers(Some(spec)).unwrap();
    let r = admitted(e.admit(&anon, t(20)));
    e.release(r.id, ReleaseOutcome::Completed, t(30)).unwrap();
    let status = e.status(t(30));
    let a = status
        .borrowers
        .iter()
        .find(|b| b.name == ANONYMOUS)
        .unwrap();
    assert_eq!(a.totals.jobs, 1);
}

#[test]
fn borrowers_status_work_names_whose_work_holds_a_resource() {
    let mut e = engine(Some(alice_bob()));
    admitted(e.admit(&ask(&e, "llm", "alice", 10), t(10)));
    let status = e.status(t(10));
    assert_eq!(status.work.len(), 1);
    assert_eq!(status.work[0].borrower.as_deref(), Some("alice"));
    // Borrowers off: no name, even where the request gave one.
    let mut off = engine(None);
    admitted(off.admit(&ask(&off, "llm", "alice", 10), t(10)));
    assert_eq!(off.status(t(10)).work[0].borrower, None);
}

#[test]
fn borrowers_by_handle_admit_as_by_name() {
    let mut e = engine(Some(alice_bob()));
    let mut r = WorkRequest::new(e.upstream_id("llm").unwrap(), None, t(10));
    r.borrower = Some(BorrowerRef::Id(e.borrower_id("bob").unwrap()));
    admitted(e.admit(&r, t(10)));
    assert_eq!(e.status(t(10)).borrowers[1].running, 1);
}

#[test]
fn borrowers_fair_turns_one_waiter_is_not_behind_another_borrowers_backlog() {
    let mut e = engine(Some(alice_bob()));
    let first = admitted(e.admit(&ask(&e, "llm", "alice", 1), t(1)));
    let mut pending = queue_up(&mut e, &[("alice", 20, None), ("bob", 1, None)], 2);
    e.release(first.id, ReleaseOutcome::Completed, t(100))
        .unwrap();
    sample(&mut e, 101);
    let order = drain_line(&mut e, std::mem::take(&mut pending), 102);
    // bob waits at most one of alice's jobs (hers came first in the line).
    let bob = order.iter().position(|w| w == "bob").unwrap();
    assert!(bob <= 1, "bob served {bob}th: {order:?}");
}

#[test]
fn borrowers_fair_turns_alternate_between_backlogs_of_equal_share() {
    let mut e = engine(Some(alice_bob()));
    let first = admitted(e.admit(&ask(&e, "llm", "alice", 1), t(1)));
    let pending = queue_up(&mut e, &[("alice", 4, None), ("bob", 4, None)], 2);
    e.release(first.id, ReleaseOutcome::Completed, t(100))
        .unwrap();
    sample(&mut e, 101);
    let order = drain_line(&mut e, pending, 102);
    assert_eq!(
        order,
        [
            "bob", "alice", "bob", "alice", "bob", "alice", "bob", "alice"
        ]
    );
}

#[test]
fn borrowers_fair_turns_share_two_gets_two_turns_for_one() {
    let mut alice = BorrowerSpec::new("alice");
    alice.share = 2;
    let mut e = engine(Some(table(vec![alice, BorrowerSpec::new("bob")])));
    let first = admitted(e.admit(&ask(&e, "side", "alice", 1), t(1)));
    let _ = first; // on gpu1: counts a turn of alice's, blocks nothing on gpu0
    let block = admitted(e.admit(&ask(&e, "llm", "bob", 1), t(1)));
    let pending = queue_up(&mut e, &[("alice", 6, None), ("bob", 3, None)], 2);
    e.release(block.id, ReleaseOutcome::Completed, t(100))
        .unwrap();
    sample(&mut e, 101);
    let order = drain_line(&mut e, pending, 102);
    let alices = order[..6].iter().filter(|w| *w == "alice").count();
    assert_eq!(
        alices, 4,
        "two turns of alice's for one of bob's: {order:?}"
    );
}

#[test]
fn borrowers_interactive_is_served_ahead_of_batch() {
    let mut bob = BorrowerSpec::new("bob");
    bob.priority = Priority::Batch;
    let mut e = engine(Some(table(vec![BorrowerSpec::new("alice"), bob])));
    let first = admitted(e.admit(&ask(&e, "llm", "alice", 1), t(1)));
    let pending = queue_up(&mut e, &[("bob", 3, None), ("alice", 3, None)], 2);
    e.release(first.id, ReleaseOutcome::Completed, t(100))
        .unwrap();
    sample(&mut e, 101);
    let order = drain_line(&mut e, pending, 102);
    assert_eq!(order, ["alice", "alice", "alice", "bob", "bob", "bob"]);
}

#[test]
fn borrowers_a_request_may_lower_its_class_never_raise_it() {
    assert_eq!(
        Priority::Interactive.lowered_by(Some(Priority::Batch)),
        Priority::Batch
    );
    assert_eq!(
        Priority::Batch.lowered_by(Some(Priority::Interactive)),
        Priority::Batch
    );
    assert_eq!(Priority::Batch.lowered_by(None), Priority::Batch);
    assert_eq!("batch".parse::<Priority>(), Ok(Priority::Batch));
    assert!("urgent".parse::<Priority>().is_err());
    // alice's own batch requests go behind bob's interactive ones.
    let mut e = engine(Some(alice_bob()));
    let first = admitted(e.admit(&ask(&e, "llm", "alice", 1), t(1)));
    let pending = queue_up(
        &mut e,
        &[("alice", 2, Some(Priority::Batch)), ("bob", 2, None)],
        2,
    );
    e.release(first.id, ReleaseOutcome::Completed, t(100))
        .unwrap();
    sample(&mut e, 101);
    assert_eq!(
        drain_line(&mut e, pending, 102),
        ["bob", "bob", "alice", "alice"]
    );
}

#[test]
fn borrowers_an_overdue_batch_waiter_goes_ahead_of_interactive_ones() {
    let mut bob = BorrowerSpec::new("bob");
    bob.priority = Priority::Batch;
    let mut spec = table(vec![BorrowerSpec::new("alice"), bob]);
    spec.batch_max_wait = Duration::from_secs(5);
    let mut e = engine(Some(spec));
    let first = admitted(e.admit(&ask(&e, "llm", "alice", 1), t(1)));
    let pending = queue_up(&mut e, &[("bob", 1, None), ("alice", 10, None)], 2);
    e.release(first.id, ReleaseOutcome::Completed, t(100))
        .unwrap();
    sample(&mut e, 101);
    // Each job takes about 1 s: bob's waiter is overdue from 5 s on and
    // then takes the next turn, with at most one job more.
    let order = drain_line(&mut e, pending, 102);
    let bob = order.iter().position(|w| w == "bob").unwrap();
    assert!((4..=6).contains(&bob), "bob served {bob}th: {order:?}");
}

#[test]
fn borrowers_max_running_refuses_borrower_limit_without_a_line() {
    let mut alice = BorrowerSpec::new("alice");
    alice.max_running = Some(1);
    let mut e = engine(Some(table(vec![alice, BorrowerSpec::new("bob")])));
    admitted(e.admit(&ask(&e, "llm", "alice", 1), t(1)));
    // `side` has no line: gpu1 is free, alice's limit refuses.
    let r = refused(e.admit(&ask(&e, "side", "alice", 2), t(2)));
    assert_eq!(r.code, RefusalCode::BorrowerLimit);
    assert_eq!(r.code.http_status(), 429);
    assert_eq!(r.retry_after(), Some(Duration::from_secs(2)));
    assert!(r.reason.contains("max_running"), "{}", r.reason);
    // bob is not held back by alice's limit.
    admitted(e.admit(&ask(&e, "side", "bob", 3), t(3)));
}

#[test]
fn borrowers_at_max_running_a_waiter_stands_aside_for_others() {
    let mut alice = BorrowerSpec::new("alice");
    alice.max_running = Some(1);
    let mut e = engine(Some(table(vec![alice, BorrowerSpec::new("bob")])));
    let side = admitted(e.admit(&ask(&e, "side", "alice", 1), t(1)));
    // alice at her limit waits in llm's line though gpu0 is free...
    let mine = ask(&e, "llm", "alice", 2);
    assert!(matches!(e.admit(&mine, t(2)), Decision::Wait { .. }));
    // ...and bob, behind her, is admitted: she does not block gpu0.
    admitted(e.admit(&ask(&e, "llm", "bob", 3), t(3)));
    let bob_job = e.entries.keys().copied().find(|id| *id != side.id).unwrap();
    e.release(side.id, ReleaseOutcome::Completed, t(10))
        .unwrap();
    e.release(bob_job, ReleaseOutcome::Completed, t(11))
        .unwrap();
    sample(&mut e, 12);
    admitted(e.admit(&mine, t(13)));
}

#[test]
fn borrowers_max_waiting_refuses_borrower_limit() {
    let mut alice = BorrowerSpec::new("alice");
    alice.max_waiting = Some(2);
    let mut e = engine(Some(table(vec![alice, BorrowerSpec::new("bob")])));
    admitted(e.admit(&ask(&e, "llm", "bob", 1), t(1)));
    queue_up(&mut e, &[("alice", 2, None)], 2);
    let r = refused(e.admit(&ask(&e, "llm", "alice", 3), t(3)));
    assert_eq!(r.code, RefusalCode::BorrowerLimit);
    assert!(r.reason.contains("max_waiting"), "{}", r.reason);
    queue_up(&mut e, &[("bob", 1, None)], 4);
    let status = e.status(t(5));
    assert_eq!(status.borrowers[0].waiting, 2);
    assert_eq!(
        status.borrowers[0].totals.refusals.get("borrower_limit"),
        Some(&1)
    );
}

/// alice with 100 s of GPU time a day.
fn budgeted() -> Engine {
    let mut alice = BorrowerSpec::new("alice");
    alice.budgets = vec![TimeBudget {
        kind: ResourceKind::Gpu,
        period: BudgetPeriod::Day,
        allowed: Duration::from_secs(100),
    }];
    let mut e = engine(Some(table(vec![alice, BorrowerSpec::new("bob")])));
    // 2026-12-03 20:00:00 UTC at the origin.
    e.set_wall_clock(Moment::ZERO, 1_796_328_000_000);
    e
}

#[test]
fn borrowers_a_spent_budget_is_refused_quota_exhausted_until_its_reset() {
    let mut e = budgeted();
    // 90 s used: budget left, so the next job is admitted and runs past it.
    let r = admitted(e.admit(&ask(&e, "llm", "alice", 0), t(0)));
    e.release(r.id, ReleaseOutcome::Completed, t(90_000))
        .unwrap();
    sample(&mut e, 90_001);
    let r = admitted(e.admit(&ask(&e, "llm", "alice", 90_002), t(90_002)));
    e.release(r.id, ReleaseOutcome::Completed, t(150_000))
        .unwrap();
    sample(&mut e, 150_001);
    let refusal = refused(e.admit(&ask(&e, "llm", "alice", 150_002), t(150_002)));
    assert_eq!(refusal.code, RefusalCode::QuotaExhausted);
    assert_eq!(refusal.code.http_status(), 429);
    // Reset at 2026-12-04 00:00 UTC, 4 h after the origin.
    let to_reset = Duration::from_secs(4 * 3600) - Duration::from_millis(150_002);
    assert_eq!(refusal.retry_after(), Some(to_reset));
    assert!(
        refusal.reason.contains("2026-12-04 00:00 UTC"),
        "{}",
        refusal.reason
    );
    assert!(refusal.reason.contains("gpu"), "{}", refusal.reason);
    // bob has no budget; alice's budget is not his.
    admitted(e.admit(&ask(&e, "llm", "bob", 150_003), t(150_003)));
    // After the reset alice is admitted again.
    let id = e.entries.keys().copied().next().unwrap();
    e.release(id, ReleaseOutcome::Completed, t(160_000))
        .unwrap();
    sample(&mut e, 4 * 3_600_000);
    admitted(e.admit(
        &ask(&e, "llm", "alice", 4 * 3_600_000 + 1),
        t(4 * 3_600_000 + 1),
    ));
}

#[test]
fn borrowers_running_jobs_count_against_the_budget() {
    let mut e = budgeted();
    admitted(e.admit(&ask(&e, "side", "alice", 0), t(0)));
    // 100 s into her running job on gpu1, a job on gpu0 is refused.
    let refusal = refused(e.admit(&ask(&e, "llm", "alice", 100_000), t(100_000)));
    assert_eq!(refusal.code, RefusalCode::QuotaExhausted);
    let status = e.status(t(100_000));
    let b = &status.borrowers[0].budgets[0];
    assert_eq!(b.used, Duration::from_secs(100));
    assert_eq!(b.left, Duration::ZERO);
    assert_eq!(b.resets, "2026-12-04 00:00 UTC");
}

#[test]
fn borrowers_a_waiter_whose_budget_runs_out_leaves_the_line_refused() {
    let mut e = budgeted();
    let side = admitted(e.admit(&ask(&e, "side", "alice", 0), t(0)));
    let block = admitted(e.admit(&ask(&e, "llm", "bob", 0), t(0)));
    let mine = ask(&e, "llm", "alice", 1);
    assert!(matches!(e.admit(&mine, t(1)), Decision::Wait { .. }));
    let r = refused(e.admit(&mine, t(120_000)));
    assert_eq!(r.code, RefusalCode::QuotaExhausted);
    assert!(!e.in_line(mine.id));
    let _ = (side, block);
}

#[test]
fn borrowers_each_release_queues_one_accounting_row_before_its_forget() {
    let mut e = budgeted();
    while e.poll_effect().is_some() {}
    let r = admitted(e.admit(&ask(&e, "llm", "alice", 1_000), t(1_000)));
    e.release(r.id, ReleaseOutcome::Uncertain("cut".into()), t(2_000))
        .unwrap();
    e.release_held(r.id, HeldRelease::AdministratorConfirmed, t(31_000))
        .unwrap();
    let effects: Vec<Effect> = std::iter::from_fn(|| e.poll_effect()).collect();
    let rows: Vec<&UsageRecord> = effects
        .iter()
        .filter_map(|f| match f {
            Effect::Account(row) => Some(&**row),
            _ => None,
        })
        .collect();
    assert_eq!(rows.len(), 1);
    let row = rows[0];
    assert_eq!(&*row.borrower, "alice");
    assert_eq!(row.upstream, "llm");
    assert!(row.held);
    assert_eq!(row.reserved.gpu, Duration::from_secs(30));
    assert_eq!(row.resources[0].resource, GPU);
    assert_eq!(row.admitted_unix_ms, 1_796_328_001_000);
    assert_eq!(row.released_unix_ms, 1_796_328_031_000);
    let account = effects.iter().position(|f| matches!(f, Effect::Account(_)));
    let forget = effects.iter().position(|f| matches!(f, Effect::Forget(_)));
    assert_eq!(account.map(|a| a + 1), forget, "{effects:?}");
    let status = e.status(t(31_000));
    let totals = &status.borrowers[0].totals;
    assert_eq!((totals.jobs, totals.held), (1, 1));
    assert_eq!(totals.reserved.gpu, Duration::from_secs(30));
    let json = serde_json::to_value(row).unwrap();
    assert_eq!(json["reserved_s"]["gpu"], 30.0);
    assert_eq!(json["borrower"], "alice");
}

#[test]
fn borrowers_off_queue_no_accounting_row() {
    let mut e = engine(None);
    let r = admitted(e.admit(&ask(&e, "llm", "x", 0), t(0)));
    e.release(r.id, ReleaseOutcome::Completed, t(10)).unwrap();
    assert!(!std::iter::from_fn(|| e.poll_effect()).any(|f| matches!(f, Effect::Account(_))));
}

#[test]
fn borrowers_status_shows_who_runs_and_waits_and_time_waited() {
    let mut e = engine(Some(alice_bob()));
    let first = admitted(e.admit(&ask(&e, "llm", "alice", 0), t(0)));
    let bob = ask(&e, "llm", "bob", 1_000);
    assert!(matches!(e.admit(&bob, t(1_000)), Decision::Wait { .. }));
    let status = e.status(t(2_000));
    assert_eq!(
        (status.borrowers[0].running, status.borrowers[0].waiting),
        (1, 0)
    );
    assert_eq!(
        (status.borrowers[1].running, status.borrowers[1].waiting),
        (0, 1)
    );
    e.release(first.id, ReleaseOutcome::Completed, t(5_000))
        .unwrap();
    sample(&mut e, 5_001);
    admitted(e.admit(&bob, t(6_000)));
    let status = e.status(t(6_000));
    assert_eq!(status.borrowers[1].totals.waited, Duration::from_secs(5));
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["borrowers"][1]["totals"]["waited_s"], 5.0);
    assert!(
        serde_json::to_value(engine(None).status(t(0)))
            .unwrap()
            .get("borrowers")
            .is_none()
    );
}

#[test]
fn borrowers_a_reload_keeps_use_and_retires_a_removed_name() {
    let mut e = engine(Some(alice_bob()));
    let r = admitted(e.admit(&ask(&e, "llm", "bob", 0), t(0)));
    e.set_borrowers(Some(table(vec![BorrowerSpec::new("alice")])))
        .unwrap();
    assert_eq!(
        refused(e.admit(&ask(&e, "side", "bob", 1), t(1))).code,
        RefusalCode::UnknownBorrower
    );
    // bob's running job still counts as his, and is accounted at its end.
    assert_eq!(e.status(t(1)).borrowers.len(), 2);
    e.release(r.id, ReleaseOutcome::Completed, t(10)).unwrap();
    assert!(
        std::iter::from_fn(|| e.poll_effect())
            .any(|f| matches!(f, Effect::Account(row) if &*row.borrower == "bob"))
    );
    assert_eq!(e.status(t(10)).borrowers.len(), 1);
    // A table in error leaves the last in force.
    let bad = table(vec![BorrowerSpec::new("x"), BorrowerSpec::new("x")]);
    assert_eq!(
        e.set_borrowers(Some(bad)),
        Err(BorrowerSpecError::Duplicate("x".into()))
    );
    assert!(e.borrower_id("alice").is_some());
}

#[test]
fn borrowers_budget_periods_are_utc_days_and_monday_weeks() {
    // 2026-12-03 is a Thursday.
    let thu = 1_796_328_000;
    assert_eq!(
        utc_words(BudgetPeriod::Day.start_of(thu)),
        "2026-12-03 00:00 UTC"
    );
    assert_eq!(
        utc_words(BudgetPeriod::Week.start_of(thu)),
        "2026-11-30 00:00 UTC"
    );
    assert_eq!(utc_words(0), "1970-01-01 00:00 UTC");
    assert_eq!(utc_words(951_782_400), "2000-02-29 00:00 UTC");
}

#[test]
fn borrowers_fair_turns_keep_the_multi_resource_no_overtaking_rule() {
    // bob's job on gpu0+gpu1 waits with the earlier turn; alice's single-GPU
    // requests on gpu1, free meanwhile, do not overtake it there.
    let mut spec = spec();
    let mut pair = UpstreamSpec::new("pair", GPU, 1000);
    pair.also_requires = vec!["gpu1".into()];
    pair.queue = spec.upstreams[0].queue;
    let mut two = UpstreamSpec::new("two", "gpu1", 1000);
    two.queue = spec.upstreams[0].queue;
    spec.upstreams.extend([pair, two]);
    let mut e = Engine::new(spec).unwrap();
    e.set_owner(OwnerPresence::Away);
    e.set_borrowers(Some(alice_bob())).unwrap();
    sample(&mut e, 0);
    let running = admitted(e.admit(&ask(&e, "llm", "alice", 1), t(1)));
    let bobs = ask(&e, "pair", "bob", 2);
    assert!(matches!(e.admit(&bobs, t(2)), Decision::Wait { .. }));
    // gpu1 is free, but bob's waiter has the earlier turn and needs it.
    let alices = ask(&e, "two", "alice", 3);
    match e.admit(&alices, t(3)) {
        Decision::Wait { .. } => {}
        other => panic!("alice overtook bob on gpu1: {other:?}"),
    }
    e.release(running.id, ReleaseOutcome::Completed, t(10))
        .unwrap();
    sample(&mut e, 11);
    assert!(matches!(e.admit(&alices, t(12)), Decision::Wait { .. }));
    admitted(e.admit(&bobs, t(12)));
}

#[test]
fn borrowers_owner_return_answers_every_waiter_at_once() {
    let mut e = engine(Some(alice_bob()));
    let running = admitted(e.admit(&ask(&e, "llm", "alice", 1), t(1)));
    let pending = queue_up(
        &mut e,
        &[("alice", 3, None), ("bob", 3, Some(Priority::Batch))],
        2,
    );
    e.set_owner(OwnerPresence::Present);
    for (_, r) in &pending {
        assert_eq!(refused(e.admit(r, t(3))).code, RefusalCode::OwnerPresent);
        assert!(!e.in_line(r.id));
    }
    let _ = running;
}

#[test]
fn borrowers_see_their_own_place_in_line_and_status() {
    let mut e = engine(Some(alice_bob()));
    let running = admitted(e.admit(&ask(&e, "llm", "alice", 1), t(1)));
    let pending = queue_up(&mut e, &[("alice", 3, None), ("bob", 1, None)], 2);
    let (_, bobs) = &pending[3];
    // bob's single waiter is first in turn, alice's third is behind all.
    assert_eq!(e.line_position(bobs.id, t(3)), Some(0));
    assert_eq!(e.line_position(pending[2].1.id, t(3)), Some(3));
    assert_eq!(e.line_position(running.id, t(3)), None);
    let me = e.borrower_status("bob", t(3)).unwrap();
    assert_eq!((me.running, me.waiting), (0, 1));
    assert!(e.borrower_status("mallory", t(3)).is_none());
}

#[test]
fn borrowers_a_reservation_records_its_borrower_and_class() {
    let mut e = engine(Some(alice_bob()));
    let r = admitted(e.admit(&ask(&e, "llm", "alice", 1_000), t(1_000)));
    let tag = r.borrower.expect("the reservation names its borrower");
    assert_eq!((&*tag.name, tag.priority), ("alice", Priority::Interactive));
    let mut off = engine(None);
    let r = admitted(off.admit(&ask(&off, "llm", "alice", 1_000), t(1_000)));
    assert_eq!(r.borrower, None, "borrowers off record none");
}

#[test]
fn borrowers_a_restored_entry_is_accounted_to_its_recorded_borrower() {
    // A restart brings the entry back held; its release is accounted to the
    // borrower its record names, even one the table no longer holds.
    for name in ["alice", "mallory"] {
        let mut e = engine(Some(alice_bob()));
        let id = EntryId::from_u128(7);
        e.restore_held(
            RestoredEntry {
                id,
                upstream: "llm".to_owned(),
                model: None,
                resources: vec![GPU.to_owned()],
                admitted_at: t(0),
                started_before: Duration::from_secs(10),
                completion: CompletionMethod::ResponseEnd,
                upstream_ref: None,
                borrower: Some(BorrowerTag {
                    name: name.into(),
                    priority: Priority::Batch,
                }),
            },
            "restored",
        )
        .unwrap();
        while e.poll_effect().is_some() {}
        e.release_held(id, HeldRelease::AdministratorConfirmed, t(5_000))
            .unwrap();
        let row = std::iter::from_fn(|| e.poll_effect())
            .find_map(|f| match f {
                Effect::Account(row) => Some(row),
                _ => None,
            })
            .expect("one accounting row");
        assert_eq!(&*row.borrower, name);
        assert_eq!(row.priority, Priority::Batch);
        assert!(row.held);
        assert_eq!(row.reserved.gpu, Duration::from_secs(15));
    }
}
