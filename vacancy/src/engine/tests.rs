//! Engine unit tests, each naming the rule it checks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use super::*;

const GPU: &str = "gpu0";
const RAM: &str = "ram";

fn t(ms: u64) -> Moment {
    Moment::from_millis(ms)
}

fn gpu_and_ram() -> EngineSpec {
    let mut llm = UpstreamSpec::new("llm", GPU, 6000);
    llm.also_requires = vec![RAM.to_owned()];
    EngineSpec {
        lending: true,
        resources: vec![
            ResourceSpec::new(GPU, ResourceKind::Gpu, 2048),
            ResourceSpec::new(RAM, ResourceKind::Memory, 8192),
        ],
        upstreams: vec![llm, UpstreamSpec::new("cpu-lane", RAM, 1000)],
    }
}

/// An engine with the owner away and both resources sampled at `at`.
fn ready(spec: EngineSpec, at: u64) -> Engine {
    let mut e = Engine::new(spec).unwrap();
    e.set_owner(OwnerPresence::Away);
    let names: Vec<String> = e.resources.iter().map(|r| r.spec.name.clone()).collect();
    for name in names {
        e.record_sample(&name, CapacitySample::memory(64_000, 80_000, t(at)))
            .unwrap();
    }
    e
}

fn req(e: &Engine, upstream: &str, model: Option<&str>, at: u64) -> WorkRequest {
    WorkRequest::new(e.upstream_id(upstream).unwrap(), model, t(at))
}

fn admit(e: &mut Engine, upstream: &str, model: Option<&str>, at: u64) -> Decision {
    let r = req(e, upstream, model, at);
    e.admit(&r, t(at))
}

fn admitted(d: Decision) -> Reservation {
    match d {
        Decision::Admitted(r) => r,
        other => panic!("expected admission, got {other:?}"),
    }
}

fn refused(d: Decision) -> Refusal {
    match d {
        Decision::Refused(r) => r,
        other => panic!("expected refusal, got {other:?}"),
    }
}

#[test]
fn one_job_per_resource_second_gets_resource_busy_retry_after_2() {
    // ADM-01, ADM-02
    let mut e = ready(gpu_and_ram(), 0);
    admitted(admit(&mut e, "llm", None, 10));
    let r = refused(admit(&mut e, "llm", None, 10));
    assert_eq!(r.code, RefusalCode::ResourceBusy);
    assert_eq!(r.retry_after(), Some(Duration::from_secs(2)));
    assert_eq!(r.code.http_status(), 503);
}

#[test]
fn primary_and_also_requires_are_reserved_together() {
    // ADM-03: llm holds gpu0 and ram, so the ram-only lane is busy.
    let mut e = ready(gpu_and_ram(), 0);
    let res = admitted(admit(&mut e, "llm", None, 10));
    let names: Vec<&str> = res.charges.iter().map(|c| c.resource.as_str()).collect();
    assert_eq!(names, [GPU, RAM]);
    let r = refused(admit(&mut e, "cpu-lane", None, 10));
    assert_eq!(r.code, RefusalCode::ResourceBusy);
    assert_eq!(r.resource.as_deref(), Some(RAM));
}

#[test]
fn reservation_is_all_or_nothing() {
    // ADM-03: a refused request reserves nothing.
    let mut e = ready(gpu_and_ram(), 0);
    admitted(admit(&mut e, "cpu-lane", None, 10)); // holds ram
    assert_eq!(
        refused(admit(&mut e, "llm", None, 10)).code,
        RefusalCode::ResourceBusy
    );
    assert!(
        e.resources[0].holder.is_none(),
        "gpu0 must not stay reserved"
    );
}

#[test]
fn released_resource_needs_a_sample_taken_after_the_job() {
    // ADM-04, ADM-05
    let mut e = ready(gpu_and_ram(), 0);
    let res = admitted(admit(&mut e, "llm", None, 10));
    drain(&mut e);
    let released = e
        .release(res.id, ReleaseOutcome::Completed, t(100))
        .unwrap();
    assert_eq!(released, Release::Freed);
    let up = e.upstream_id("llm").unwrap();
    let asked: Vec<Effect> = drain(&mut e)
        .into_iter()
        .filter(|f| matches!(f, Effect::Sample(_) | Effect::Observe(_)))
        .collect();
    assert_eq!(
        asked,
        vec![
            Effect::Sample(GPU.to_owned()),
            Effect::Sample(RAM.to_owned()),
            Effect::Observe(up),
        ]
    );
    assert!(matches!(
        admit(&mut e, "llm", None, 110),
        Decision::Wait { .. }
    ));
    // A sample that started before the job ended does not count, nor one at the same instant.
    e.record_sample(GPU, CapacitySample::memory(64_000, 80_000, t(90)))
        .unwrap();
    e.record_sample(GPU, CapacitySample::memory(64_000, 80_000, t(100)))
        .unwrap();
    e.record_sample(RAM, CapacitySample::memory(64_000, 80_000, t(101)))
        .unwrap();
    match admit(&mut e, "llm", None, 120) {
        Decision::Wait { resources, .. } => assert_eq!(resources, [GPU]),
        other => panic!("{other:?}"),
    }
    e.record_sample(GPU, CapacitySample::memory(64_000, 80_000, t(101)))
        .unwrap();
    admitted(admit(&mut e, "llm", None, 130));
}

#[test]
fn request_before_the_post_job_sample_waits_at_most_4_s() {
    // ADM-06 (and its Ambiguity reading: resource_busy after the wait)
    let mut e = ready(gpu_and_ram(), 0);
    let res = admitted(admit(&mut e, "llm", None, 10));
    e.release(res.id, ReleaseOutcome::Completed, t(100))
        .unwrap();
    let r = req(&e, "llm", None, 200);
    match e.admit(&r, t(200)) {
        Decision::Wait { until, .. } => assert_eq!(until, t(4200)),
        other => panic!("{other:?}"),
    }
    assert!(matches!(e.admit(&r, t(4199)), Decision::Wait { .. }));
    let refusal = refused(e.admit(&r, t(4200)));
    assert_eq!(refusal.code, RefusalCode::ResourceBusy);
    assert_eq!(refusal.retry_after(), Some(Duration::from_secs(2)));
}

#[test]
fn fresh_sample_still_faces_owner_and_reserve_checks() {
    // ADM-07
    let mut e = ready(gpu_and_ram(), 0);
    let res = admitted(admit(&mut e, "llm", None, 10));
    e.release(res.id, ReleaseOutcome::Completed, t(100))
        .unwrap();
    e.record_sample(GPU, CapacitySample::memory(7000, 80_000, t(101)))
        .unwrap();
    e.record_sample(RAM, CapacitySample::memory(64_000, 80_000, t(101)))
        .unwrap();
    // gpu0: 7000 free - 2048 reserve = 4952 < 6000
    assert_eq!(
        refused(admit(&mut e, "llm", None, 110)).code,
        RefusalCode::InsufficientMemory
    );
    e.record_sample(GPU, CapacitySample::memory(64_000, 80_000, t(120)))
        .unwrap();
    e.set_owner(OwnerPresence::Present);
    assert_eq!(
        refused(admit(&mut e, "llm", None, 130)).code,
        RefusalCode::OwnerPresent
    );
}

#[test]
fn a_hard_refusal_does_not_wait_for_the_sample() {
    // ADM-06 applies only where waiting can lead to admission.
    let mut e = ready(gpu_and_ram(), 0);
    let res = admitted(admit(&mut e, "llm", None, 10));
    e.release(res.id, ReleaseOutcome::Completed, t(100))
        .unwrap();
    e.set_lending(false);
    assert_eq!(
        refused(admit(&mut e, "llm", None, 110)).code,
        RefusalCode::LendingPaused
    );
}

fn memory_lane(reserve: u64, free: u64, job: u64) -> Engine {
    let spec = EngineSpec {
        lending: true,
        resources: vec![ResourceSpec::new(RAM, ResourceKind::Memory, reserve)],
        upstreams: vec![UpstreamSpec::new("cpu", RAM, job)],
    };
    let mut e = Engine::new(spec).unwrap();
    e.set_owner(OwnerPresence::Away);
    e.record_sample(RAM, CapacitySample::memory(free, 64_000, t(0)))
        .unwrap();
    e
}

#[test]
fn mem_02_vector_31000_free_24000_reserve_8000_job_is_refused() {
    // MEM-01, MEM-02, MEM-03 (system memory as the primary resource)
    let mut e = memory_lane(24_000, 31_000, 8000);
    let r = refused(admit(&mut e, "cpu", None, 1));
    assert_eq!(r.code, RefusalCode::InsufficientMemory);
    assert!(r.reason.contains("7000 MiB"), "{}", r.reason);
    // Exactly fitting is admitted: requirement <= free - reserve.
    let mut e = memory_lane(24_000, 32_000, 8000);
    admitted(admit(&mut e, "cpu", None, 1));
}

#[test]
fn unnamed_also_requires_memory_is_charged_nothing_but_keeps_its_floor() {
    // MEM-04, MEM-05 (and its Ambiguity: free == reserve admits)
    let mut e = ready(gpu_and_ram(), 0);
    e.record_sample(RAM, CapacitySample::memory(8192, 80_000, t(1)))
        .unwrap();
    let res = admitted(admit(&mut e, "llm", None, 2));
    assert_eq!(res.charges[1].required_mib, 0);
    e.release(res.id, ReleaseOutcome::Completed, t(3)).unwrap();
    e.record_sample(GPU, CapacitySample::memory(64_000, 80_000, t(4)))
        .unwrap();
    e.record_sample(RAM, CapacitySample::memory(8191, 80_000, t(4)))
        .unwrap();
    let r = refused(admit(&mut e, "llm", None, 5));
    assert_eq!(r.code, RefusalCode::InsufficientMemory);
    assert_eq!(r.resource.as_deref(), Some(RAM));
}

#[test]
fn per_resource_requirement_charges_an_also_requires_resource() {
    // MEM-04
    let mut spec = gpu_and_ram();
    spec.upstreams[0].requirements.insert(RAM.to_owned(), 8000);
    let mut e = ready(spec, 0);
    e.record_sample(RAM, CapacitySample::memory(16_000, 80_000, t(1)))
        .unwrap();
    // 16000 - 8192 = 7808 < 8000
    assert_eq!(
        refused(admit(&mut e, "llm", None, 2)).resource.as_deref(),
        Some(RAM)
    );
    e.record_sample(RAM, CapacitySample::memory(16_192, 80_000, t(3)))
        .unwrap();
    let res = admitted(admit(&mut e, "llm", None, 4));
    assert_eq!(res.charges[1].required_mib, 8000);
}

#[test]
fn per_model_requirement_by_exact_name_else_default() {
    // MEM-06 (exact, case-sensitive) and VOICE-17's numbers
    let mut voice = UpstreamSpec::new("voice", GPU, 11_500);
    for (m, mib) in [("qwen", 6000), ("qwen-design", 6000), ("breeze", 11_500)] {
        voice.models.insert(
            m.to_owned(),
            ModelBudget {
                min_free_mib: Some(mib),
                resident_min_free_mib: None,
            },
        );
    }
    let spec = EngineSpec {
        lending: true,
        resources: vec![ResourceSpec::new(GPU, ResourceKind::Gpu, 0)],
        upstreams: vec![voice],
    };
    let cases = [
        (Some("qwen"), 6000),
        (Some("qwen-design"), 6000),
        (Some("breeze"), 11_500),
        (Some("Qwen"), 11_500),
        (Some("default"), 11_500),
        (None, 11_500),
    ];
    for (model, expected) in cases {
        let mut e = ready(spec.clone(), 0);
        let res = admitted(admit(&mut e, "voice", model, 1));
        assert_eq!(res.charges[0].required_mib, expected, "{model:?}");
    }
}

fn observe_loaded(e: &mut Engine, upstream: &str, model: &str, at: u64) {
    let id = e.upstream_id(upstream).unwrap();
    e.observe(
        id,
        ModelObservation {
            taken_at: t(at),
            models: vec![ObservedModel::new(
                model.to_owned(),
                ResidencyEvidence::Proven,
            )],
            visible_work: None,
            allocator_free_mib: None,
        },
    )
    .unwrap();
}

#[test]
fn footprint_is_learned_and_raises_the_requirement() {
    // MEM-07, MEM-08
    let spec = EngineSpec {
        lending: true,
        resources: vec![ResourceSpec::new(GPU, ResourceKind::Gpu, 1000)],
        upstreams: vec![UpstreamSpec::new("llm", GPU, 4000)],
    };
    let mut e = ready(spec, 0);
    let res = admitted(admit(&mut e, "llm", Some("big"), 10)); // free 64000 at admission
    // The observation after admission arms the measurement; the next sample after it closes it.
    observe_loaded(&mut e, "llm", "big", 20);
    e.record_sample(GPU, CapacitySample::memory(63_000, 80_000, t(15)))
        .unwrap(); // before the observation: ignored
    e.record_sample(GPU, CapacitySample::memory(54_000, 80_000, t(25)))
        .unwrap();
    let up = e.upstream_id("llm").unwrap();
    assert_eq!(e.learned_prior(up, "big", GPU), Some(10_000));
    e.release(res.id, ReleaseOutcome::Completed, t(30)).unwrap();
    e.record_sample(GPU, CapacitySample::memory(10_500, 80_000, t(31)))
        .unwrap();
    // Configured 4000 would fit in 9500; the prior of 10000 does not.
    let r = refused(admit(&mut e, "llm", Some("big"), 32));
    assert_eq!(r.code, RefusalCode::InsufficientMemory);
    // Another model is still charged its configured minimum.
    admitted(admit(&mut e, "llm", Some("small"), 33));
}

#[test]
fn a_prior_never_lowers_the_configured_minimum() {
    // MEM-08
    let spec = EngineSpec {
        lending: true,
        resources: vec![ResourceSpec::new(GPU, ResourceKind::Gpu, 0)],
        upstreams: vec![UpstreamSpec::new("llm", GPU, 20_000)],
    };
    let mut e = ready(spec, 0);
    let res = admitted(admit(&mut e, "llm", Some("m"), 10));
    observe_loaded(&mut e, "llm", "m", 20);
    e.record_sample(GPU, CapacitySample::memory(63_000, 80_000, t(25)))
        .unwrap(); // 1000 MiB delta
    e.release(res.id, ReleaseOutcome::Completed, t(30)).unwrap();
    e.record_sample(GPU, CapacitySample::memory(64_000, 80_000, t(31)))
        .unwrap();
    let res = admitted(admit(&mut e, "llm", Some("m"), 32));
    assert_eq!(res.charges[0].required_mib, 20_000);
}

#[test]
fn zero_delta_is_not_learned_and_another_job_voids_a_measurement() {
    // MEM-09, MEM-07
    let spec = EngineSpec {
        lending: true,
        resources: vec![ResourceSpec::new(GPU, ResourceKind::Gpu, 0)],
        upstreams: vec![UpstreamSpec::new("llm", GPU, 1000)],
    };
    let mut e = ready(spec, 0);
    let up = e.upstream_id("llm").unwrap();
    admitted(admit(&mut e, "llm", Some("m"), 10));
    observe_loaded(&mut e, "llm", "m", 20);
    e.record_sample(GPU, CapacitySample::memory(64_000, 80_000, t(25)))
        .unwrap();
    assert_eq!(e.learned_prior(up, "m", GPU), None);

    let mut e = ready(
        EngineSpec {
            lending: true,
            resources: vec![ResourceSpec::new(GPU, ResourceKind::Gpu, 0)],
            upstreams: vec![UpstreamSpec::new("llm", GPU, 1000)],
        },
        0,
    );
    let res = admitted(admit(&mut e, "llm", Some("m"), 10));
    e.release(res.id, ReleaseOutcome::Completed, t(12)).unwrap();
    observe_loaded(&mut e, "llm", "m", 20); // after the job ended: measurement was dropped
    e.record_sample(GPU, CapacitySample::memory(50_000, 80_000, t(25)))
        .unwrap();
    assert_eq!(e.learned_prior(up, "m", GPU), None);
}

#[test]
fn priors_start_empty_and_are_bounded() {
    // MEM-10, MEM-11: a new engine (a restarted daemon) knows no priors.
    let spec = EngineSpec {
        lending: true,
        resources: vec![ResourceSpec::new(GPU, ResourceKind::Gpu, 0)],
        upstreams: vec![UpstreamSpec::new("llm", GPU, 0)],
    };
    let mut e = ready(spec, 0);
    let up = e.upstream_id("llm").unwrap();
    let mut now = 10;
    for i in 0..(MAX_PRIOR_IDENTITIES + 5) {
        let model = format!("m{i}");
        let res = admitted(admit(&mut e, "llm", Some(&model), now));
        observe_loaded(&mut e, "llm", &model, now + 1);
        e.record_sample(GPU, CapacitySample::memory(60_000, 80_000, t(now + 2)))
            .unwrap();
        e.release(res.id, ReleaseOutcome::Completed, t(now + 3))
            .unwrap();
        e.record_sample(GPU, CapacitySample::memory(64_000, 80_000, t(now + 4)))
            .unwrap();
        now += 10;
    }
    assert_eq!(e.priors.len(), MAX_PRIOR_IDENTITIES);
    assert_eq!(e.learned_prior(up, "m0", GPU), None);
    assert_eq!(
        e.learned_prior(up, &format!("m{}", MAX_PRIOR_IDENTITIES + 4), GPU),
        Some(4000)
    );
}

#[test]
fn resident_model_is_charged_resident_min_free_on_proof() {
    // RES-01, RES-02
    let mut spec = gpu_and_ram();
    spec.upstreams[0].resident_min_free_mib = 500;
    spec.upstreams[0].requirements.insert(RAM.to_owned(), 4000);
    let mut e = ready(spec, 0);
    observe_loaded(&mut e, "llm", "m", 5);
    let res = admitted(admit(&mut e, "llm", Some("m"), 10));
    assert!(res.resident_credit);
    assert_eq!(res.charges[0].required_mib, 500);
    assert_eq!(
        res.charges[1].required_mib, 500,
        "credit applies on every budgeted dependency"
    );
}

#[test]
fn resident_credit_needs_a_fresh_observation_after_the_last_job() {
    // RES-02, RES-20, RES-21
    let mut spec = gpu_and_ram();
    spec.upstreams[0].default_min_free_mib = 70_000; // only fits with credit
    let mut e = ready(spec, 0);
    observe_loaded(&mut e, "llm", "m", 5);
    // Too old: refused, says why, and asks to observe once more.
    e.record_sample(GPU, CapacitySample::memory(64_000, 80_000, t(5000)))
        .unwrap();
    e.record_sample(RAM, CapacitySample::memory(64_000, 80_000, t(5000)))
        .unwrap();
    let r = match admit(&mut e, "llm", Some("m"), 5006) {
        Decision::Reobserve(r) => r,
        other => panic!("expected a re-observation, got {other:?}"),
    };
    assert_eq!(r.code, RefusalCode::InsufficientMemory);
    assert!(r.reason.contains("no resident credit"), "{}", r.reason);
    // Fresh, but taken before the last job ended: no credit, and no "observe again".
    observe_loaded(&mut e, "llm", "m", 5010);
    let res = admitted(admit(&mut e, "llm", Some("m"), 5011));
    e.release(res.id, ReleaseOutcome::Completed, t(5020))
        .unwrap();
    e.record_sample(GPU, CapacitySample::memory(64_000, 80_000, t(5021)))
        .unwrap();
    e.record_sample(RAM, CapacitySample::memory(64_000, 80_000, t(5021)))
        .unwrap();
    let r = refused(admit(&mut e, "llm", Some("m"), 5022));
    assert!(r.reason.contains("predates the last job"), "{}", r.reason);
    observe_loaded(&mut e, "llm", "m", 5030);
    admitted(admit(&mut e, "llm", Some("m"), 5031));
}

#[test]
fn request_that_cannot_reuse_the_model_gets_no_credit() {
    // RES-18, RES-21
    let mut spec = gpu_and_ram();
    spec.upstreams[0].default_min_free_mib = 70_000;
    let mut e = ready(spec, 0);
    observe_loaded(&mut e, "llm", "m", 5);
    let mut r = req(&e, "llm", Some("m"), 10);
    r.reuse = RequestReuse::Cannot("the request sets runner option num_gpu".to_owned());
    let refusal = refused(e.admit(&r, t(10)));
    assert!(refusal.reason.contains("num_gpu"), "{}", refusal.reason);
}

#[test]
fn memory_an_idle_model_would_free_is_not_available() {
    // RES-19: 64,000 MiB free with "m" loaded and idle; "n" needs 70,000. Evicting
    // "m" would make room, but that memory is never counted: "n" is refused.
    let mut spec = gpu_and_ram();
    spec.upstreams[0].default_min_free_mib = 70_000;
    let mut e = ready(spec, 0);
    observe_loaded(&mut e, "llm", "m", 5);
    let r = refused(admit(&mut e, "llm", Some("n"), 10));
    assert_eq!(r.code, RefusalCode::InsufficientMemory, "{}", r.reason);
    // The loaded model itself is credited as resident (RES-03).
    assert!(admitted(admit(&mut e, "llm", Some("m"), 10)).resident_credit);
}

fn observe_for_kinds(e: &mut Engine, model: &str, kinds: &[&str], at: u64) {
    let id = e.upstream_id("llm").unwrap();
    e.observe(
        id,
        ModelObservation {
            taken_at: t(at),
            models: vec![ObservedModel::new(
                model,
                ResidencyEvidence::ProvenFor {
                    kinds: kinds.iter().map(|k| (*k).to_owned()).collect(),
                    otherwise: format!("{model} is loaded with context 8192"),
                },
            )],
            visible_work: None,
            allocator_free_mib: None,
        },
    )
    .unwrap();
}

fn kind_req(e: &Engine, model: &str, canonical: Option<&str>, kind: &str, at: u64) -> WorkRequest {
    let mut r = req(e, "llm", Some(model), at);
    r.canonical_model = canonical.map(str::to_owned);
    r.reuse = RequestReuse::ReusesAs(kind.to_owned());
    r
}

#[test]
fn kind_evidence_credits_only_the_kinds_it_names() {
    // RES-05, RES-06, RES-21
    let mut spec = gpu_and_ram();
    spec.upstreams[0].default_min_free_mib = 70_000; // only fits with credit
    let mut e = ready(spec, 0);
    observe_for_kinds(&mut e, "m:latest", &["m:latest, num_ctx unset, /api"], 5);
    let other = kind_req(
        &e,
        "m",
        Some("m:latest"),
        "m:latest, num_ctx 4096, /api",
        10,
    );
    let r = refused(e.admit(&other, t(10)));
    assert!(
        r.reason.contains("loaded with context 8192"),
        "{}",
        r.reason
    );
    assert!(
        r.reason
            .contains("this request: m:latest, num_ctx 4096, /api"),
        "{}",
        r.reason
    );
    // A request without a kind is not credited on kind evidence either.
    let mut plain = req(&e, "llm", Some("m:latest"), 10);
    plain.reuse = RequestReuse::Reuses;
    let r = refused(e.admit(&plain, t(10)));
    assert!(r.reason.contains("kind is unknown"), "{}", r.reason);
    // The named kind, with the request written as "m": matched by its canonical model.
    let ok = kind_req(
        &e,
        "m",
        Some("m:latest"),
        "m:latest, num_ctx unset, /api",
        10,
    );
    let res = admitted(e.admit(&ok, t(10)));
    assert!(res.resident_credit);
    assert_eq!(
        res.model.as_deref(),
        Some("m"),
        "the reservation keeps the written name"
    );
}

#[test]
fn configuration_stays_exact_while_observations_match_the_canonical_model() {
    // MEM-06 with RES-06: [upstream.models] is looked up by the name as written.
    let mut spec = gpu_and_ram();
    spec.upstreams[0].models.insert(
        "m".to_owned(),
        ModelBudget {
            min_free_mib: Some(1234),
            resident_min_free_mib: None,
        },
    );
    let mut e = ready(spec, 0);
    let r = kind_req(&e, "m", Some("m:latest"), "k", 10);
    let res = admitted(e.admit(&r, t(10)));
    assert_eq!(res.charges[0].required_mib, 1234);
    assert!(!res.resident_credit);
}

#[test]
fn footprints_are_measured_and_charged_by_the_canonical_model() {
    // MEM-07, MEM-08 with RES-06: `llama3` and `llama3:latest` are one identity.
    let spec = EngineSpec {
        lending: true,
        resources: vec![ResourceSpec::new(GPU, ResourceKind::Gpu, 1000)],
        upstreams: vec![UpstreamSpec::new("llm", GPU, 4000)],
    };
    let mut e = ready(spec, 0);
    let up = e.upstream_id("llm").unwrap();
    let mut r = req(&e, "llm", Some("llama3"), 10);
    r.canonical_model = Some("llama3:latest".to_owned());
    let res = admitted(e.admit(&r, t(10)));
    observe_loaded(&mut e, "llm", "llama3:latest", 20);
    e.record_sample(GPU, CapacitySample::memory(57_000, 80_000, t(25)))
        .unwrap();
    assert_eq!(e.learned_prior(up, "llama3:latest", GPU), Some(7000));
    assert_eq!(e.learned_prior(up, "llama3", GPU), None);
    e.release(res.id, ReleaseOutcome::Completed, t(30)).unwrap();
    e.record_sample(GPU, CapacitySample::memory(64_000, 80_000, t(31)))
        .unwrap();
    let mut again = req(&e, "llm", Some("llama3:latest"), 40);
    again.reuse = RequestReuse::Cannot("the request sets runner option num_gpu".to_owned());
    let res = admitted(e.admit(&again, t(40)));
    assert_eq!(
        res.charges[0].required_mib, 7000,
        "the prior raises the requirement"
    );
}

#[test]
fn a_finished_request_of_a_kind_teaches_the_next_observation_only() {
    // RES-07
    let mut e = ready(gpu_and_ram(), 0);
    let up = e.upstream_id("llm").unwrap();
    let r = kind_req(
        &e,
        "m",
        Some("m:latest"),
        "m:latest, num_ctx unset, /v1",
        10,
    );
    let res = admitted(e.admit(&r, t(10)));
    assert_eq!(e.take_lesson(up, t(15)), None, "nothing finished yet");
    drain(&mut e);
    let released = e.release(res.id, ReleaseOutcome::Completed, t(20)).unwrap();
    assert_eq!(released, Release::Freed);
    assert!(drain(&mut e).contains(&Effect::Observe(up)));
    // An observation that started before the end teaches nothing and leaves the lesson.
    assert_eq!(e.take_lesson(up, t(20)), None);
    let lesson = e.take_lesson(up, t(21)).unwrap();
    assert_eq!(
        lesson,
        Lesson {
            model: "m:latest".to_owned(),
            kind: "m:latest, num_ctx unset, /v1".to_owned(),
            finished_at: t(20),
        }
    );
    assert_eq!(
        e.take_lesson(up, t(22)),
        None,
        "only the first observation learns"
    );
}

#[test]
fn an_admission_on_a_shared_resource_voids_the_lesson() {
    // RES-07: "an observation taken after another admission teaches nothing".
    let mut e = ready(gpu_and_ram(), 0);
    let up = e.upstream_id("llm").unwrap();
    let r = kind_req(&e, "m", None, "k", 10);
    let res = admitted(e.admit(&r, t(10)));
    e.release(res.id, ReleaseOutcome::Completed, t(20)).unwrap();
    e.record_sample(RAM, CapacitySample::memory(64_000, 80_000, t(21)))
        .unwrap();
    // The ram-only lane shares ram with llm: its admission voids llm's lesson.
    let lane = admitted(admit(&mut e, "cpu-lane", None, 22));
    assert_eq!(e.take_lesson(up, t(30)), None);
    e.release(lane.id, ReleaseOutcome::Completed, t(40))
        .unwrap();
    assert_eq!(e.take_lesson(up, t(41)), None);
}

#[test]
fn uncertain_unforwarded_kindless_and_yielded_work_teaches_nothing() {
    // RES-07: only a request of a known kind that finished teaches.
    let mut e = ready(gpu_and_ram(), 0);
    let up = e.upstream_id("llm").unwrap();
    let resample = |e: &mut Engine, at: u64| {
        for r in [GPU, RAM] {
            e.record_sample(r, CapacitySample::memory(64_000, 80_000, t(at)))
                .unwrap();
        }
    };
    let r = kind_req(&e, "m", None, "k", 10);
    let res = admitted(e.admit(&r, t(10)));
    e.release(res.id, ReleaseOutcome::NotForwarded, t(11))
        .unwrap();
    assert_eq!(e.take_lesson(up, t(12)), None, "not forwarded");
    resample(&mut e, 13);
    let r = kind_req(&e, "m", None, "k", 14);
    let res = admitted(e.admit(&r, t(14)));
    e.release(res.id, ReleaseOutcome::Uncertain("cut".into()), t(15))
        .unwrap();
    e.release_held(res.id, HeldRelease::AdministratorConfirmed, t(16))
        .unwrap();
    assert_eq!(
        e.take_lesson(up, t(17)),
        None,
        "held, then released by an admin"
    );
    resample(&mut e, 18);
    let res = admitted(admit(&mut e, "llm", Some("m"), 19));
    e.release(res.id, ReleaseOutcome::Completed, t(20)).unwrap();
    assert_eq!(e.take_lesson(up, t(21)), None, "a request without a kind");
    resample(&mut e, 22);
    let r = kind_req(&e, "m", None, "k", 23);
    let res = admitted(e.admit(&r, t(23)));
    e.release(res.id, ReleaseOutcome::Completed, t(24)).unwrap();
    e.record_unload(GPU, t(25)).unwrap();
    assert_eq!(e.take_lesson(up, t(26)), None, "a yield came between");
}

fn observe_allocator(e: &mut Engine, upstream: &str, mib: u64, at: u64) {
    let id = e.upstream_id(upstream).unwrap();
    let mut obs = ModelObservation::empty(t(at));
    obs.allocator_free_mib = Some(mib);
    e.observe(id, obs).unwrap();
}

#[test]
fn allocator_memory_counts_as_free_only_on_a_one_gpu_route_with_fresh_proof() {
    // RES-17
    let one_gpu = EngineSpec {
        lending: true,
        resources: vec![
            ResourceSpec::new(GPU, ResourceKind::Gpu, 1000),
            ResourceSpec::new("gpu1", ResourceKind::Gpu, 1000),
        ],
        upstreams: vec![UpstreamSpec::new("comfy", GPU, 8000)],
    };
    let mut e = Engine::new(one_gpu).unwrap();
    e.set_owner(OwnerPresence::Away);
    for r in [GPU, "gpu1"] {
        e.record_sample(r, CapacitySample::memory(5000, 80_000, t(0)))
            .unwrap();
    }
    // 5000 free - 1000 reserve < 8000 without the allocator's 5000.
    assert_eq!(
        refused(admit(&mut e, "comfy", None, 1)).code,
        RefusalCode::InsufficientMemory
    );
    observe_allocator(&mut e, "comfy", 5000, 2);
    let res = admitted(admit(&mut e, "comfy", None, 3));
    assert_eq!(
        res.charges[0].free_mib, 5000,
        "the charge keeps the sampled free memory"
    );
    e.release(res.id, ReleaseOutcome::Completed, t(10)).unwrap();
    e.record_sample(GPU, CapacitySample::memory(5000, 80_000, t(11)))
        .unwrap();
    // The observation predates the last job: it proves nothing now.
    assert_eq!(
        refused(admit(&mut e, "comfy", None, 12)).code,
        RefusalCode::InsufficientMemory
    );
    observe_allocator(&mut e, "comfy", 5000, 13);
    admitted(admit(&mut e, "comfy", None, 14));
    // Too old (> 4 s) proves nothing either.
    let mut e2 = ready(
        EngineSpec {
            lending: true,
            resources: vec![ResourceSpec::new(GPU, ResourceKind::Gpu, 1000)],
            upstreams: vec![UpstreamSpec::new("comfy", GPU, 8000)],
        },
        0,
    );
    e2.record_sample(GPU, CapacitySample::memory(5000, 80_000, t(0)))
        .unwrap();
    observe_allocator(&mut e2, "comfy", 5000, 1);
    assert_eq!(
        refused(admit(&mut e2, "comfy", None, 4002)).code,
        RefusalCode::InsufficientMemory
    );
    // A route with two GPUs gets no allocator credit.
    let mut e3 = Engine::new(EngineSpec {
        lending: true,
        resources: vec![
            ResourceSpec::new(GPU, ResourceKind::Gpu, 1000),
            ResourceSpec::new("gpu1", ResourceKind::Gpu, 1000),
        ],
        upstreams: vec![{
            let mut two = UpstreamSpec::new("comfy2", GPU, 8000);
            two.also_requires = vec!["gpu1".to_owned()];
            two
        }],
    })
    .unwrap();
    e3.set_owner(OwnerPresence::Away);
    for r in [GPU, "gpu1"] {
        e3.record_sample(r, CapacitySample::memory(5000, 80_000, t(0)))
            .unwrap();
    }
    observe_allocator(&mut e3, "comfy2", 50_000, 1);
    assert_eq!(
        refused(admit(&mut e3, "comfy2", None, 2)).code,
        RefusalCode::InsufficientMemory
    );
}

fn voice_spec(free_reserve: u64) -> EngineSpec {
    let mut voice = UpstreamSpec::new("voice", GPU, 11_500);
    for (m, mib) in [("qwen", 6000), ("qwen-design", 6000), ("breeze", 11_500)] {
        voice.models.insert(
            m.to_owned(),
            ModelBudget {
                min_free_mib: Some(mib),
                resident_min_free_mib: None,
            },
        );
    }
    voice.resident_min_free_mib = 300;
    EngineSpec {
        lending: true,
        resources: vec![ResourceSpec::new(GPU, ResourceKind::Gpu, free_reserve)],
        upstreams: vec![voice],
    }
}

fn voice_req(e: &Engine, model: &str, kind: &str, at: u64) -> WorkRequest {
    let mut r = req(e, "voice", Some(model), at);
    r.reuse = RequestReuse::ReusesAs(kind.to_owned());
    r
}

#[test]
fn only_the_loaded_idle_engine_is_credited_and_others_pay_their_cold_budget() {
    // VOICE-12, VOICE-13, VOICE-14, VOICE-17, VOICE-18, VOICE-19 (engine side;
    // the chatterbox adapter supplies the kinds and evidence).
    let mut e = ready(voice_spec(0), 0);
    // 9000 MiB free: Qwen's cold load fits, Breeze's does not.
    e.record_sample(GPU, CapacitySample::memory(9000, 80_000, t(1)))
        .unwrap();
    let id = e.upstream_id("voice").unwrap();
    e.observe(
        id,
        ModelObservation {
            taken_at: t(2),
            models: vec![ObservedModel::new(
                "qwen",
                ResidencyEvidence::ProvenFor {
                    kinds: vec!["voice engine qwen".to_owned()],
                    otherwise: "engine qwen is loaded".to_owned(),
                },
            )],
            visible_work: None,
            allocator_free_mib: None,
        },
    )
    .unwrap();
    // VOICE-19: the route's vacancy uses the default cold-load budget (11,500).
    let v = e.vacancy(id, t(3));
    assert!(!v.admitting, "{v:?}");
    // VOICE-14: a generic alias is never credited, even with qwen loaded.
    let r = refused(e.admit(&voice_req(&e, "default", "generic alias default", 3), t(3)));
    assert!(r.reason.contains("no resident credit"), "{}", r.reason);
    // VOICE-13: switching to Breeze needs Breeze's cold-load budget.
    let r = refused(e.admit(&voice_req(&e, "breeze", "voice engine breeze", 3), t(3)));
    assert!(r.reason.contains("11500"), "{}", r.reason);
    // VOICE-12, VOICE-18: the loaded engine, named, is charged its resident headroom.
    let res = admitted(e.admit(&voice_req(&e, "qwen", "voice engine qwen", 3), t(3)));
    assert!(res.resident_credit);
    assert_eq!(res.charges[0].required_mib, 300);
    e.release(res.id, ReleaseOutcome::Completed, t(4)).unwrap();
    e.record_sample(GPU, CapacitySample::memory(9000, 80_000, t(5)))
        .unwrap();
    // qwen-design is another engine: charged its cold budget (6000 fits here).
    let res = admitted(e.admit(
        &voice_req(&e, "qwen-design", "voice engine qwen-design", 6),
        t(6),
    ));
    assert!(!res.resident_credit);
    assert_eq!(res.charges[0].required_mib, 6000);
}

#[test]
fn owner_presence_refuses_host_scoped_work_and_unknown_counts_as_present() {
    // OWN-01, OWN-02
    let mut e = ready(gpu_and_ram(), 0);
    e.set_owner(OwnerPresence::Present);
    assert_eq!(
        refused(admit(&mut e, "llm", None, 1)).code,
        RefusalCode::OwnerPresent
    );
    e.set_owner(OwnerPresence::Unknown);
    let r = refused(admit(&mut e, "llm", None, 2));
    assert_eq!(r.code, RefusalCode::OwnerPresent);
    assert!(r.reason.contains("[owner] presence"), "{}", r.reason);
    // A fresh engine starts Unknown: nothing host-scoped is lent until presence is known.
    let mut fresh = Engine::new(gpu_and_ram()).unwrap();
    fresh
        .record_sample(GPU, CapacitySample::memory(64_000, 80_000, t(0)))
        .unwrap();
    fresh
        .record_sample(RAM, CapacitySample::memory(64_000, 80_000, t(0)))
        .unwrap();
    assert_eq!(
        refused(admit(&mut fresh, "llm", None, 1)).code,
        RefusalCode::OwnerPresent
    );
}

fn exempt_spec() -> EngineSpec {
    let mut spec = gpu_and_ram();
    spec.upstreams[1].owner_scope = OwnerScope::Resource;
    spec
}

#[test]
fn resource_scoped_upstream_keeps_lending_while_the_owner_is_present() {
    // SCOPE-01, SCOPE-02
    let mut e = ready(exempt_spec(), 0);
    e.set_owner(OwnerPresence::Present);
    assert_eq!(
        refused(admit(&mut e, "llm", None, 1)).code,
        RefusalCode::OwnerPresent
    );
    admitted(admit(&mut e, "cpu-lane", None, 1));
    e.set_owner(OwnerPresence::Unknown);
    let s = e.status(t(2));
    assert!(s.owner_veto.active);
    assert_eq!(s.owner_veto.exempt_upstreams, ["cpu-lane"]);
}

#[test]
fn resource_scoped_upstream_still_obeys_switches_capacity_and_pressure() {
    // SCOPE-04, SCOPE-08
    let mut e = ready(exempt_spec(), 0);
    e.set_owner(OwnerPresence::Present);
    e.set_lending(false);
    assert_eq!(
        refused(admit(&mut e, "cpu-lane", None, 1)).code,
        RefusalCode::LendingPaused
    );
    e.set_lending(true);
    e.set_resource_enabled(RAM, false).unwrap();
    assert_eq!(
        refused(admit(&mut e, "cpu-lane", None, 1)).code,
        RefusalCode::ResourceDisabled
    );
    e.set_resource_enabled(RAM, true).unwrap();
    e.set_pressure(RAM, PressureVerdict::Refuses("engaged".to_owned()))
        .unwrap();
    assert_eq!(
        refused(admit(&mut e, "cpu-lane", None, 1)).code,
        RefusalCode::Pressure
    );
    e.set_pressure(RAM, PressureVerdict::Admits).unwrap();
    e.record_sample(RAM, CapacitySample::memory(9000, 80_000, t(1)))
        .unwrap();
    assert_eq!(
        refused(admit(&mut e, "cpu-lane", None, 2)).code,
        RefusalCode::InsufficientMemory
    );
}

#[test]
fn shared_resource_held_by_host_scoped_work_is_busy_for_the_exempt_lane() {
    // SCOPE-11, SCOPE-12 (a host-scoped entry holding the shared resource)
    let mut e = ready(exempt_spec(), 0);
    let res = admitted(admit(&mut e, "llm", None, 1));
    e.set_owner(OwnerPresence::Present);
    assert_eq!(
        refused(admit(&mut e, "cpu-lane", None, 2)).code,
        RefusalCode::ResourceBusy
    );
    e.release(res.id, ReleaseOutcome::Completed, t(3)).unwrap();
    assert!(matches!(
        admit(&mut e, "cpu-lane", None, 4),
        Decision::Wait { .. }
    ));
    e.record_sample(RAM, CapacitySample::memory(64_000, 80_000, t(5)))
        .unwrap();
    admitted(admit(&mut e, "cpu-lane", None, 6));
}

#[test]
fn capacity_unknown_without_a_sample_after_a_failure_or_when_too_old() {
    let mut e = Engine::new(gpu_and_ram()).unwrap();
    e.set_owner(OwnerPresence::Away);
    assert_eq!(
        refused(admit(&mut e, "cpu-lane", None, 1)).code,
        RefusalCode::CapacityUnknown
    );
    e.record_sample(RAM, CapacitySample::memory(64_000, 80_000, t(10)))
        .unwrap();
    admitted(admit(&mut e, "cpu-lane", None, 11));

    let mut e = ready(gpu_and_ram(), 0);
    e.record_sample_failure(RAM, t(5), "reading /proc/meminfo: file vanished")
        .unwrap();
    let r = refused(admit(&mut e, "cpu-lane", None, 6));
    assert_eq!(r.code, RefusalCode::CapacityUnknown);
    // The borrower hears that the sample failed; the sampler's own words (a
    // path, an OS error) are the owner's, in /status.
    assert!(r.reason.contains("the last sample failed"), "{}", r.reason);
    assert!(!r.reason.contains("/proc/meminfo"), "{}", r.reason);
    let status = e.status(t(6));
    let ram = status.resources.iter().find(|r| r.name == RAM).unwrap();
    assert!(
        ram.capacity_unknown
            .as_deref()
            .is_some_and(|w| w.contains("/proc/meminfo: file vanished")),
        "{:?}",
        ram.capacity_unknown
    );
    e.record_sample(RAM, CapacitySample::memory(64_000, 80_000, t(7)))
        .unwrap();
    admitted(admit(&mut e, "cpu-lane", None, 8));

    let mut e = ready(gpu_and_ram(), 0);
    assert_eq!(
        refused(admit(&mut e, "cpu-lane", None, 5001)).code,
        RefusalCode::CapacityUnknown
    );
}

#[test]
fn busy_cpu_refuses_the_next_request() {
    // SCOPE-08
    let spec = EngineSpec {
        lending: true,
        resources: vec![ResourceSpec::new("cpu", ResourceKind::Cpu, 0)],
        upstreams: vec![UpstreamSpec::new("tts", "cpu", 0)],
    };
    let mut e = Engine::new(spec).unwrap();
    e.set_owner(OwnerPresence::Away);
    let busy = |pct| CapacitySample {
        free_mib: 1000,
        total_mib: 2000,
        busy_pct: Some(pct),
        heat: Default::default(),
        taken_at: t(1),
    };
    e.record_sample("cpu", busy(95)).unwrap();
    assert_eq!(
        refused(admit(&mut e, "tts", None, 2)).code,
        RefusalCode::ResourceBusy
    );
    e.record_sample(
        "cpu",
        CapacitySample {
            taken_at: t(3),
            ..busy(90)
        },
    )
    .unwrap();
    admitted(admit(&mut e, "tts", None, 4));
}

#[test]
fn uncertain_outcome_holds_until_an_explicit_release() {
    // DONE-03, DONE-04, HELD-02, HELD-06, HELD-07
    let mut e = ready(gpu_and_ram(), 0);
    let res = admitted(admit(&mut e, "llm", None, 1));
    assert_eq!(
        e.release(
            res.id,
            ReleaseOutcome::Uncertain("upstream cut mid-stream".to_owned()),
            t(2)
        )
        .unwrap(),
        Release::Held
    );
    assert_eq!(e.phase(res.id), Some(Phase::Held));
    assert_eq!(
        refused(admit(&mut e, "llm", None, 3)).code,
        RefusalCode::ResourceBusy
    );
    assert_eq!(
        e.release(res.id, ReleaseOutcome::Completed, t(4)),
        Err(EngineError::EntryHeld(res.id))
    );
    let s = e.status(t(5));
    assert_eq!(s.work[0].phase, Phase::Held);
    assert_eq!(
        s.work[0].held_reason.as_deref(),
        Some("upstream cut mid-stream")
    );

    e.release_held(res.id, HeldRelease::AdministratorConfirmed, t(6))
        .unwrap();
    assert!(matches!(
        admit(&mut e, "llm", None, 7),
        Decision::Wait { .. }
    ));
}

#[test]
fn only_held_entries_can_be_released_by_an_administrator() {
    // HELD-06
    let mut e = ready(gpu_and_ram(), 0);
    let res = admitted(admit(&mut e, "llm", None, 1));
    assert!(matches!(
        e.release_held(res.id, HeldRelease::AdministratorConfirmed, t(2)),
        Err(EngineError::NotHeld {
            phase: "forwarding",
            ..
        })
    ));
    e.start_tracking(res.id).unwrap();
    assert!(matches!(
        e.release_held(res.id, HeldRelease::AdministratorConfirmed, t(2)),
        Err(EngineError::NotHeld {
            phase: "tracking",
            ..
        })
    ));
    assert_eq!(
        e.release_held(EntryId::from_u128(9), HeldRelease::TrackingProof, t(2)),
        Err(EngineError::UnknownEntry(EntryId::from_u128(9)))
    );
}

#[test]
fn connection_refused_releases() {
    // DONE-02
    let mut e = ready(gpu_and_ram(), 0);
    let res = admitted(admit(&mut e, "llm", None, 1));
    assert!(matches!(
        e.release(res.id, ReleaseOutcome::NotForwarded, t(2))
            .unwrap(),
        Release::Freed
    ));
    assert_eq!(e.entry_count(), 0);
}

#[test]
fn restored_entries_return_held_and_a_changed_mapping_is_an_error() {
    // REC-02, REC-08
    let mut e = ready(gpu_and_ram(), 0);
    let entry = RestoredEntry {
        id: EntryId::from_u128(1),
        upstream: "llm".to_owned(),
        model: Some("m".to_owned()),
        resources: vec![GPU.to_owned(), RAM.to_owned()],
        admitted_at: t(0),
        started_before: Duration::ZERO,
        completion: CompletionMethod::ResponseEnd,
        upstream_ref: Some("prompt-1".to_owned()),
        borrower: None,
    };
    e.restore_held(entry.clone(), "restored after a restart")
        .unwrap();
    assert_eq!(e.phase(entry.id), Some(Phase::Held));
    assert_eq!(
        refused(admit(&mut e, "cpu-lane", None, 1)).code,
        RefusalCode::ResourceBusy
    );

    let mut e = ready(gpu_and_ram(), 0);
    let moved = RestoredEntry {
        resources: vec![GPU.to_owned()],
        ..entry
    };
    assert!(matches!(
        e.restore_held(moved, "restored"),
        Err(EngineError::ChangedMapping { .. })
    ));
}

fn restored(id: u128, upstream: &str, resources: &[&str]) -> RestoredEntry {
    RestoredEntry {
        id: EntryId::from_u128(id),
        upstream: upstream.to_owned(),
        model: None,
        resources: resources.iter().map(|r| (*r).to_owned()).collect(),
        admitted_at: t(0),
        started_before: Duration::ZERO,
        completion: CompletionMethod::ResponseEnd,
        upstream_ref: None,
        borrower: None,
    }
}

#[test]
fn overlapping_restored_records_both_come_back_held() {
    // REC-02 (issue 14 item 18): a crash between a release and its record
    // leaves two unresolved records on one resource. Both are uncertain, so
    // both are held, and the resource stays reserved until both are released.
    let mut e = ready(gpu_and_ram(), 0);
    let first = restored(1, "llm", &[GPU, RAM]);
    let second = restored(2, "cpu-lane", &[RAM]);
    assert!(
        e.restore_held(first.clone(), "restored")
            .unwrap()
            .is_empty()
    );
    let overlaps = e.restore_held(second.clone(), "restored").unwrap();
    assert_eq!(
        overlaps,
        vec![RestoreOverlap {
            resource: RAM.to_owned(),
            holder: first.id
        }]
    );
    assert_eq!(e.phase(first.id), Some(Phase::Held));
    assert_eq!(e.phase(second.id), Some(Phase::Held));

    // Releasing the first leaves ram reserved by the second.
    e.release_held(first.id, HeldRelease::AdministratorConfirmed, t(10))
        .unwrap();
    for r in [GPU, RAM] {
        e.record_sample(r, CapacitySample::memory(64_000, 80_000, t(20)))
            .unwrap();
    }
    assert_eq!(
        refused(admit(&mut e, "cpu-lane", None, 30)).code,
        RefusalCode::ResourceBusy
    );
    let status = e.status(t(30));
    let ram = status.resources.iter().find(|r| r.name == RAM).unwrap();
    assert_eq!(ram.reserved_by, Some(second.id.to_string()));

    // Releasing the second frees it.
    e.release_held(second.id, HeldRelease::AdministratorConfirmed, t(40))
        .unwrap();
    e.record_sample(RAM, CapacitySample::memory(64_000, 80_000, t(50)))
        .unwrap();
    admitted(admit(&mut e, "cpu-lane", None, 60));
}

#[test]
fn a_restored_entry_older_than_the_timeline_keeps_its_age() {
    // REC-27: an entry held for hours reads its hours after a restart, however
    // short the daemon's uptime.
    let mut e = ready(gpu_and_ram(), 0);
    let mut entry = restored(1, "llm", &[GPU, RAM]);
    entry.started_before = Duration::from_secs(3 * 3600);
    e.restore_held(entry, "restored").unwrap();
    let status = e.status(t(5_000));
    assert_eq!(status.work[0].age_s, 3 * 3600 + 5);
}

#[test]
fn visible_foreign_work_refuses_as_busy() {
    // ADM-09 (Ambiguity reading: resource_busy)
    let mut e = ready(gpu_and_ram(), 0);
    let id = e.upstream_id("llm").unwrap();
    let mut obs = ModelObservation::empty(t(10));
    obs.visible_work = Some(VisibleWork::new(1, "1 of 2 slots processing"));
    e.observe(id, obs).unwrap();
    let r = refused(admit(&mut e, "llm", None, 11));
    assert_eq!(r.code, RefusalCode::ResourceBusy);
    assert!(r.reason.contains("did not admit"), "{}", r.reason);
    // A stale observation proves nothing.
    e.record_sample(GPU, CapacitySample::memory(64_000, 80_000, t(4100)))
        .unwrap();
    e.record_sample(RAM, CapacitySample::memory(64_000, 80_000, t(4100)))
        .unwrap();
    admitted(admit(&mut e, "llm", None, 4100));
}

#[test]
fn vacancys_own_running_job_is_not_foreign_work() {
    // ADM-09 (issue 14 item 1): a reading taken during vacancy's own job
    // shows that job; the refusal and /status say the resource is reserved,
    // not that the upstream runs work vacancy did not admit.
    let mut e = ready(gpu_and_ram(), 0);
    let id = e.upstream_id("llm").unwrap();
    let job = admitted(admit(&mut e, "llm", None, 10));
    let mut obs = ModelObservation::empty(t(1000));
    obs.visible_work = Some(VisibleWork::new(1, "1 of 2 slots processing"));
    e.observe(id, obs).unwrap();
    let r = refused(admit(&mut e, "llm", None, 1100));
    assert_eq!(r.code, RefusalCode::ResourceBusy);
    assert!(!r.reason.contains("did not admit"), "{}", r.reason);
    assert!(r.reason.contains("reserved"), "{}", r.reason);
    let vacancy = e.vacancy(id, t(1100));
    assert!(
        !vacancy
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("did not admit"),
        "{vacancy:?}"
    );
    // Two jobs visible while vacancy runs one: one is foreign.
    let mut obs = ModelObservation::empty(t(1200));
    obs.visible_work = Some(VisibleWork::new(2, "2 of 2 slots processing"));
    e.observe(id, obs).unwrap();
    let r = refused(admit(&mut e, "llm", None, 1300));
    assert!(r.reason.contains("did not admit"), "{}", r.reason);
    drop(job);
}

#[test]
fn a_reading_of_a_finished_job_never_refuses_the_next_one() {
    // ADM-09 (issue 14 item 1): once the job ends, a reading taken during it
    // is older than the job's end and refuses nothing; one taken just after
    // it that still shows the finished job (llama-server frees the slot after
    // the final response) is vacancy's own work, not the owner's.
    let mut e = ready(gpu_and_ram(), 0);
    let id = e.upstream_id("llm").unwrap();
    let job = admitted(admit(&mut e, "llm", None, 10));
    let mut during = ModelObservation::empty(t(1000));
    during.visible_work = Some(VisibleWork::new(1, "1 of 2 slots processing"));
    e.observe(id, during).unwrap();
    e.release(job.id, ReleaseOutcome::Completed, t(2000))
        .unwrap();
    let mut tail = ModelObservation::empty(t(2005));
    tail.visible_work = Some(VisibleWork::new(1, "1 of 2 slots processing"));
    e.observe(id, tail).unwrap();
    for r in [GPU, RAM] {
        e.record_sample(r, CapacitySample::memory(64_000, 80_000, t(2010)))
            .unwrap();
    }
    admitted(admit(&mut e, "llm", None, 2020));
}

#[test]
fn work_seen_well_after_vacancys_job_ended_is_foreign() {
    // ADM-09: past the tail, a processing slot is someone else's.
    let mut e = ready(gpu_and_ram(), 0);
    let id = e.upstream_id("llm").unwrap();
    let job = admitted(admit(&mut e, "llm", None, 10));
    e.release(job.id, ReleaseOutcome::Completed, t(2000))
        .unwrap();
    for r in [GPU, RAM] {
        e.record_sample(r, CapacitySample::memory(64_000, 80_000, t(2010)))
            .unwrap();
    }
    let mut obs = ModelObservation::empty(t(3500));
    obs.visible_work = Some(VisibleWork::new(1, "1 of 2 slots processing"));
    e.observe(id, obs).unwrap();
    let r = refused(admit(&mut e, "llm", None, 3600));
    assert!(r.reason.contains("did not admit"), "{}", r.reason);
}

#[test]
fn a_busy_refusal_does_not_name_another_borrowers_entry() {
    // Issue 14 item 8: entry IDs are for the log and /status.
    let mut e = ready(gpu_and_ram(), 0);
    let job = admitted(admit(&mut e, "llm", None, 10));
    let r = refused(admit(&mut e, "llm", None, 11));
    assert!(!r.reason.contains(&job.id.to_string()), "{}", r.reason);
}

#[test]
fn status_reports_vacancy_for_the_default_budget() {
    // UI-01, VOICE-19
    let mut e = ready(gpu_and_ram(), 0);
    let s = e.status(t(1));
    assert!(s.upstreams.iter().all(|u| u.vacancy.admitting));
    let res = admitted(admit(&mut e, "llm", None, 2));
    let s = e.status(t(3));
    assert_eq!(s.upstreams[1].vacancy.code, Some(RefusalCode::ResourceBusy));
    assert_eq!(s.resources[0].reserved_by, Some(res.id.to_string()));
    assert_eq!(s.work.len(), 1);
    assert_eq!(s.work[0].resources, [GPU, RAM]);
    assert_eq!(s.work[0].phase, Phase::Forwarding);
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["work"][0]["phase"], "forwarding");
    assert_eq!(json["upstreams"][1]["vacancy"]["code"], "resource_busy");
}

#[test]
fn spec_errors_are_precise() {
    let mut spec = gpu_and_ram();
    spec.upstreams[0].also_requires.push("nvme".to_owned());
    assert!(matches!(
        Engine::new(spec),
        Err(SpecError::UnknownResource { .. })
    ));
    let mut spec = gpu_and_ram();
    spec.upstreams[0].requirements.insert(GPU.to_owned(), 1);
    assert!(matches!(
        Engine::new(spec),
        Err(SpecError::RequirementNotDependency { .. })
    ));
    let mut spec = gpu_and_ram();
    spec.upstreams[0].also_requires.push(GPU.to_owned());
    assert!(matches!(
        Engine::new(spec),
        Err(SpecError::RepeatedResource { .. })
    ));
}

#[test]
fn resident_credit_never_breaches_the_reserve_floor() {
    // MEM-01 with RES-01: a zero resident requirement still needs free >= reserve.
    let mut e = ready(gpu_and_ram(), 0);
    observe_loaded(&mut e, "llm", "m", 1);
    e.record_sample(GPU, CapacitySample::memory(1000, 80_000, t(2)))
        .unwrap(); // reserve 2048
    let r = refused(admit(&mut e, "llm", Some("m"), 3));
    assert_eq!(r.code, RefusalCode::InsufficientMemory);
    assert!(
        r.reason.contains("below its 2048 MiB reserve"),
        "{}",
        r.reason
    );
}

#[cfg(feature = "config")]
#[test]
fn example_configuration_builds_an_engine() {
    // With its token placeholder (refused, issue 30 item 4) filled in.
    let text = include_str!("../../../examples/vacancyd.toml")
        .replace(crate::config::EXAMPLE_TOKEN_PLACEHOLDER, &"ab".repeat(32));
    let loaded = crate::config::Config::parse(&text, "examples/vacancyd.toml").unwrap();
    let spec = EngineSpec::from(&loaded.config);
    let ollama = spec.upstreams.iter().find(|u| u.name == "ollama").unwrap();
    assert!(!ollama.also_requires.is_empty());
    let engine = Engine::new(spec).unwrap();
    assert!(engine.upstream_id("ollama").is_some());
    let default = crate::config::Config::embedded_default().unwrap();
    Engine::new(EngineSpec::from(&default.config)).unwrap();
}

fn drain(e: &mut Engine) -> Vec<Effect> {
    std::iter::from_fn(|| e.poll_effect()).collect()
}

#[test]
fn an_admission_queues_its_record_before_anything_is_forwarded() {
    // REC-01: the shell learns from the engine what to persist.
    let mut e = ready(gpu_and_ram(), 0);
    drain(&mut e);
    let r = admitted(admit(&mut e, "llm", None, 10));
    assert_eq!(drain(&mut e), vec![Effect::Persist(r)]);
    // A refusal changes nothing on disk.
    refused(admit(&mut e, "llm", None, 10));
    assert_eq!(drain(&mut e), vec![]);
}

#[test]
fn a_release_queues_forget_then_post_job_samples_then_wake_ups_in_order() {
    // ADM-05, RES-02: the record goes first, then each freed resource is
    // sampled and the upstream observed. No reclaim is under way, so the
    // reclaim loop is not woken (reclaim_tests: one that is, is).
    let mut e = ready(gpu_and_ram(), 0);
    let r = admitted(admit(&mut e, "llm", None, 10));
    drain(&mut e);
    e.release(r.id, ReleaseOutcome::Completed, t(20)).unwrap();
    let up = e.upstream_id("llm").unwrap();
    assert_eq!(
        drain(&mut e),
        vec![
            Effect::Forget(r.id),
            Effect::Sample(GPU.to_owned()),
            Effect::Sample(RAM.to_owned()),
            Effect::Observe(up),
        ]
    );
}

#[test]
fn an_uncertain_end_queues_the_hold_and_a_held_release_queues_forget() {
    // DONE-03, HELD-04: a hold is recorded with its reason; releasing it
    // forgets the record and samples the resources it held (HELD-07).
    let mut e = ready(gpu_and_ram(), 0);
    let r = admitted(admit(&mut e, "cpu-lane", None, 10));
    drain(&mut e);
    e.release(
        r.id,
        ReleaseOutcome::Uncertain("broke off".to_owned()),
        t(20),
    )
    .unwrap();
    assert_eq!(
        drain(&mut e),
        vec![
            Effect::MarkHeld {
                entry: r.id,
                reason: "broke off".to_owned()
            },
            Effect::WakeReclaims,
        ]
    );
    e.release_held(r.id, HeldRelease::AdministratorConfirmed, t(30))
        .unwrap();
    let effects = drain(&mut e);
    assert_eq!(effects.first(), Some(&Effect::Forget(r.id)));
    assert!(effects.contains(&Effect::Sample(RAM.to_owned())));
}

#[test]
fn a_rewritten_handle_is_queued_for_the_record() {
    // REC-04
    let mut e = ready(gpu_and_ram(), 0);
    let r = admitted(admit(&mut e, "cpu-lane", None, 10));
    drain(&mut e);
    e.set_upstream_ref(r.id, "prompt-9").unwrap();
    assert_eq!(
        drain(&mut e),
        vec![Effect::RewriteRef {
            entry: r.id,
            upstream_ref: "prompt-9".to_owned()
        }]
    );
}

#[test]
fn presence_and_pressure_changes_wake_the_reclaims_once() {
    // OWN-01, PRES-01: a change the reclaim step acts on wakes it; the
    // same presence twice does not, and wake-ups are not queued twice.
    let mut e = ready(gpu_and_ram(), 0);
    drain(&mut e);
    e.set_owner(OwnerPresence::Away);
    assert_eq!(drain(&mut e), vec![]);
    e.set_owner(OwnerPresence::Present);
    e.pressure_trigger(GPU, "engaged").unwrap();
    assert_eq!(drain(&mut e), vec![Effect::WakeReclaims]);
}

// ---- the wait line (issue 22) -------------------------------------------

/// gpu_and_ram with a line on every upstream.
fn lined(max_waiting: u32, max_wait_ms: u64) -> Engine {
    let mut spec = gpu_and_ram();
    for u in &mut spec.upstreams {
        u.queue = Some(QueueSpec {
            max_waiting,
            max_wait: Duration::from_millis(max_wait_ms),
        });
    }
    ready(spec, 0)
}

fn waits(d: Decision) {
    match d {
        Decision::Wait { resources, .. } => {
            assert!(resources.is_empty(), "a line wait samples nothing")
        }
        other => panic!("expected a wait in line, got {other:?}"),
    }
}

/// Release `r` at `at` and land fresh samples of both resources after it.
fn end_job(e: &mut Engine, r: &Reservation, at: u64) {
    e.release(r.id, ReleaseOutcome::Completed, t(at)).unwrap();
    for name in [GPU, RAM] {
        e.record_sample(name, CapacitySample::memory(64_000, 80_000, t(at + 1)))
            .unwrap();
    }
}

#[test]
fn line_off_a_busy_resource_still_refuses_at_once() {
    // ADM-01, ADM-02: without [upstream.queue] the seed's answer stands.
    let mut e = ready(gpu_and_ram(), 0);
    admitted(admit(&mut e, "llm", None, 10));
    let r = refused(admit(&mut e, "llm", None, 10));
    assert_eq!(r.code, RefusalCode::ResourceBusy);
    assert!(!e.in_line(e.entries.keys().next().copied().unwrap()));
}

#[test]
fn line_a_busy_request_waits_and_is_admitted_after_the_post_job_sample() {
    // ADM-04..06 through the line: the waiter is admitted only once the
    // sample taken after the job has landed.
    let mut e = lined(4, 30_000);
    let first = admitted(admit(&mut e, "llm", None, 10));
    let second = req(&e, "llm", None, 20);
    waits(e.admit(&second, t(20)));
    assert!(e.in_line(second.id));
    e.release(first.id, ReleaseOutcome::Completed, t(30))
        .unwrap();
    match e.admit(&second, t(31)) {
        Decision::Wait { resources, .. } => assert!(!resources.is_empty(), "the post-job sample"),
        other => panic!("expected the post-job sample wait, got {other:?}"),
    }
    for name in [GPU, RAM] {
        e.record_sample(name, CapacitySample::memory(64_000, 80_000, t(32)))
            .unwrap();
    }
    let r = admitted(e.admit(&second, t(33)));
    assert_eq!(r.id, second.id);
    assert!(!e.in_line(second.id));
}

#[test]
fn line_serves_the_same_resources_first_come_first_served() {
    let mut e = lined(8, 30_000);
    let mut job = admitted(admit(&mut e, "llm", None, 10));
    let waiters: Vec<WorkRequest> = (0..4).map(|i| req(&e, "llm", None, 20 + i)).collect();
    for w in &waiters {
        waits(e.admit(w, t(30)));
    }
    let mut at = 100;
    for expected in &waiters {
        end_job(&mut e, &job, at);
        // Everyone asks again, latest first: only the head is admitted.
        let mut admitted_now = Vec::new();
        for w in waiters.iter().rev() {
            if let Decision::Admitted(r) = e.admit(w, t(at + 2)) {
                admitted_now.push(r);
            }
        }
        assert_eq!(admitted_now.len(), 1);
        assert_eq!(admitted_now[0].id, expected.id, "first come, first served");
        job = admitted_now.remove(0);
        at += 100;
    }
}

#[test]
fn line_a_multi_resource_waiter_is_not_overtaken_by_a_later_single_resource_one() {
    // llm needs gpu0 and ram; cpu-lane only ram. With llm waiting, a later
    // cpu-lane request may not take ram even while ram alone is free.
    let mut e = lined(8, 30_000);
    let lane = admitted(admit(&mut e, "cpu-lane", None, 10));
    let big = req(&e, "llm", None, 20);
    waits(e.admit(&big, t(20)));
    let small = req(&e, "cpu-lane", None, 30);
    waits(e.admit(&small, t(30)));
    end_job(&mut e, &lane, 100);
    waits(e.admit(&small, t(102)));
    admitted(e.admit(&big, t(103)));
}

#[test]
fn line_a_request_without_a_line_does_not_overtake_a_waiter() {
    let mut spec = gpu_and_ram();
    spec.upstreams[0].queue = Some(QueueSpec {
        max_waiting: 4,
        max_wait: Duration::from_secs(30),
    });
    let mut e = ready(spec, 0);
    let job = admitted(admit(&mut e, "llm", None, 10));
    let waiter = req(&e, "llm", None, 20);
    waits(e.admit(&waiter, t(20)));
    end_job(&mut e, &job, 100);
    // cpu-lane has no line: it is refused, not admitted ahead of llm.
    let r = refused(admit(&mut e, "cpu-lane", None, 102));
    assert_eq!(r.code, RefusalCode::ResourceBusy);
    assert!(r.reason.contains("wait in line"), "{}", r.reason);
    admitted(e.admit(&waiter, t(103)));
}

#[test]
fn line_the_owner_returning_answers_every_waiter_at_once() {
    // OWN-01: waiters never wait out the owner; the shell is woken to ask.
    let mut e = lined(8, 30_000);
    admitted(admit(&mut e, "llm", None, 10));
    let waiters: Vec<WorkRequest> = (0..3).map(|i| req(&e, "llm", None, 20 + i)).collect();
    for w in &waiters {
        waits(e.admit(w, t(30)));
    }
    drain(&mut e);
    e.set_owner(OwnerPresence::Present);
    assert!(drain(&mut e).contains(&Effect::WakeWaiters));
    for w in &waiters {
        assert_eq!(refused(e.admit(w, t(40))).code, RefusalCode::OwnerPresent);
        assert!(!e.in_line(w.id));
    }
}

#[test]
fn line_pressure_a_switch_and_a_pause_answer_waiters_at_once() {
    for change in 0..3 {
        let mut e = lined(8, 30_000);
        admitted(admit(&mut e, "llm", None, 10));
        let w = req(&e, "llm", None, 20);
        waits(e.admit(&w, t(20)));
        let expected = match change {
            0 => {
                e.set_pressure(GPU, PressureVerdict::Refuses("engaged".into()))
                    .unwrap();
                RefusalCode::Pressure
            }
            1 => {
                e.set_resource_enabled(RAM, false).unwrap();
                RefusalCode::ResourceDisabled
            }
            _ => {
                e.set_lending(false);
                RefusalCode::LendingPaused
            }
        };
        assert_eq!(refused(e.admit(&w, t(30))).code, expected);
    }
}

#[test]
fn line_a_full_line_refuses_busy_with_retry_after_2() {
    let mut e = lined(2, 30_000);
    admitted(admit(&mut e, "llm", None, 10));
    waits(admit(&mut e, "llm", None, 20));
    waits(admit(&mut e, "llm", None, 21));
    let r = refused(admit(&mut e, "llm", None, 22));
    assert_eq!(r.code, RefusalCode::ResourceBusy);
    assert_eq!(r.retry_after(), Some(Duration::from_secs(2)));
    assert!(r.reason.contains("full"), "{}", r.reason);
}

#[test]
fn line_a_waiter_is_answered_busy_at_its_deadline() {
    let mut e = lined(2, 5_000);
    admitted(admit(&mut e, "llm", None, 10));
    let w = req(&e, "llm", None, 20);
    let until = match e.admit(&w, t(20)) {
        Decision::Wait { until, .. } => until,
        other => panic!("{other:?}"),
    };
    assert_eq!(until, t(5_020));
    waits(e.admit(&w, t(5_019)));
    let r = refused(e.admit(&w, until));
    assert_eq!(r.code, RefusalCode::ResourceBusy);
    assert!(r.reason.contains("waited"), "{}", r.reason);
    assert!(!e.in_line(w.id));
}

#[test]
fn line_a_waiter_who_leaves_reserves_nothing_and_lets_the_next_move_up() {
    let mut e = lined(4, 30_000);
    let job = admitted(admit(&mut e, "llm", None, 10));
    let gone = req(&e, "llm", None, 20);
    let next = req(&e, "llm", None, 21);
    waits(e.admit(&gone, t(20)));
    waits(e.admit(&next, t(21)));
    drain(&mut e);
    e.leave_line(gone.id);
    assert!(drain(&mut e).contains(&Effect::WakeWaiters));
    assert!(!e.in_line(gone.id));
    assert_eq!(e.entry_count(), 1, "leaving reserved nothing");
    end_job(&mut e, &job, 100);
    admitted(e.admit(&next, t(102)));
}

#[test]
fn line_a_request_may_bring_its_own_wait() {
    // Python's admit(wait_s=): waits even where the upstream has no line.
    let mut e = ready(gpu_and_ram(), 0);
    admitted(admit(&mut e, "llm", None, 10));
    let mut w = req(&e, "llm", None, 20);
    w.wait = Some(Duration::from_secs(3));
    match e.admit(&w, t(20)) {
        Decision::Wait { until, .. } => assert_eq!(until, t(3_020)),
        other => panic!("{other:?}"),
    }
    assert_eq!(e.line_status(0, t(1_020)).waiting, 1);
    assert_eq!(
        e.line_status(0, t(1_020)).oldest_wait,
        Some(Duration::from_secs(1))
    );
}

#[test]
fn line_a_waiter_that_never_asks_again_does_not_block_the_line_for_good() {
    // A shell that lost a waiter without saying so: past its deadline and
    // the grace, it no longer holds back those behind it.
    let mut e = lined(4, 1_000);
    let job = admitted(admit(&mut e, "llm", None, 10));
    let ghost = req(&e, "llm", None, 20);
    waits(e.admit(&ghost, t(20)));
    end_job(&mut e, &job, 100);
    let late = 20 + 1_000 + LINE_EXPIRY_GRACE.as_millis() as u64;
    for name in [GPU, RAM] {
        e.record_sample(name, CapacitySample::memory(64_000, 80_000, t(late)))
            .unwrap();
    }
    let next = req(&e, "llm", None, late);
    admitted(e.admit(&next, t(late)));
    assert!(!e.in_line(ghost.id));
}

// ---- the vacancy sign and the wait line (issue 30) -----------------------

#[test]
fn line_sign_queueing_when_a_new_request_would_wait_behind_a_waiter() {
    // UI-01, issue 30 item 9: llm (gpu0 + ram) waits for ram, which a
    // cpu-lane job holds; gpu0 is free, yet a new llm request would queue
    // behind the waiter, never be admitted now.
    let mut e = lined(8, 30_000);
    let llm = e.upstream_id("llm").unwrap();
    let lane = e.upstream_id("cpu-lane").unwrap();
    assert!(
        e.vacancy(llm, t(5)).admitting,
        "nothing reserved, nobody waits"
    );
    let job = admitted(admit(&mut e, "cpu-lane", None, 10));
    let v = e.vacancy(llm, t(15));
    assert_eq!(
        v.queueing,
        Some(0),
        "ram is reserved: it would queue, first"
    );
    assert_eq!(v.sign(), "queueing (0 waiting)");
    let waiter = req(&e, "llm", None, 20);
    waits(e.admit(&waiter, t(20)));
    for up in [llm, lane] {
        let v = e.vacancy(up, t(25));
        assert!(!v.admitting, "{v:?}");
        assert_eq!(v.queueing, Some(1), "{v:?}");
        assert_eq!(v.code, Some(RefusalCode::ResourceBusy));
        assert_eq!(v.sign(), "queueing (1 waiting)");
    }
    // The job ends and its sample lands: ram and gpu0 are free, yet the
    // waiter comes first.
    end_job(&mut e, &job, 100);
    let v = e.vacancy(lane, t(102));
    assert!(
        !v.admitting,
        "a new request would queue behind the waiter: {v:?}"
    );
    assert_eq!(v.queueing, Some(1));
    admitted(e.admit(&waiter, t(103)));
    let v = e.vacancy(lane, t(104));
    assert_eq!(v.queueing, Some(0), "llm's job holds ram now: {v:?}");
}

#[test]
fn line_sign_without_a_line_is_refusing_and_a_full_line_says_so() {
    // Issue 30 item 9: a waiter ahead blocks an upstream without a line
    // (refused), and a full line refuses rather than queues.
    let mut spec = gpu_and_ram();
    spec.upstreams[0].queue = Some(QueueSpec {
        max_waiting: 1,
        max_wait: Duration::from_secs(30),
    });
    let mut e = ready(spec, 0);
    let llm = e.upstream_id("llm").unwrap();
    let lane = e.upstream_id("cpu-lane").unwrap();
    let job = admitted(admit(&mut e, "llm", None, 10));
    let waiter = req(&e, "llm", None, 20);
    waits(e.admit(&waiter, t(20)));
    end_job(&mut e, &job, 100);
    let v = e.vacancy(lane, t(102));
    assert!(!v.admitting && v.queueing.is_none(), "{v:?}");
    assert_eq!(v.code, Some(RefusalCode::ResourceBusy));
    assert!(
        v.reason.as_deref().unwrap_or("").contains("wait in line"),
        "{v:?}"
    );
    let v = e.vacancy(llm, t(102));
    assert!(v.queueing.is_none(), "{v:?}");
    assert!(v.reason.as_deref().unwrap_or("").contains("full"), "{v:?}");
    // The owner's refusals come before the line.
    e.set_lending(false);
    assert_eq!(
        e.vacancy(llm, t(103)).code,
        Some(RefusalCode::LendingPaused)
    );
}

#[test]
fn line_a_waiter_that_reobserves_keeps_its_place() {
    // RES-20, issue 30 item 10: a waiter refused only because the resident
    // observation was too old keeps its place while the shell observes once
    // more; those behind it stay behind.
    let mut spec = gpu_and_ram();
    spec.upstreams[0].default_min_free_mib = 70_000; // only fits with credit
    spec.upstreams[0].queue = Some(QueueSpec {
        max_waiting: 8,
        max_wait: Duration::from_secs(60),
    });
    let mut e = ready(spec, 0);
    observe_loaded(&mut e, "llm", "m", 5);
    let job = admitted(admit(&mut e, "llm", Some("m"), 10));
    let first = req(&e, "llm", Some("m"), 20);
    let second = req(&e, "llm", Some("m"), 21);
    waits(e.admit(&first, t(20)));
    waits(e.admit(&second, t(21)));
    end_job(&mut e, &job, 100);
    observe_loaded(&mut e, "llm", "m", 102);
    // Its turn comes when the observation is too old to prove residency.
    match e.admit(&first, t(5_000)) {
        Decision::Reobserve(r) => assert_eq!(r.code, RefusalCode::InsufficientMemory),
        other => panic!("expected a re-observation, got {other:?}"),
    }
    assert!(e.in_line(first.id), "it keeps its place while observing");
    assert!(matches!(e.admit(&second, t(5_001)), Decision::Reobserve(_)));
    observe_loaded(&mut e, "llm", "m", 5_002);
    // The one behind asks first after the observation: still behind.
    waits(e.admit(&second, t(5_003)));
    let r = admitted(e.admit(&first, t(5_004)));
    assert_eq!(r.id, first.id, "first come, first served across RES-20");
    assert!(r.resident_credit);
}

#[test]
fn a_verifying_entry_keeps_its_resources_until_proof_or_a_hold() {
    // DONE-04, HELD-06, issue 30 item 12: a cut job whose stop is being
    // checked shows `verifying`, keeps its resources, is no administrator's
    // to release, and ends released on proof or held without.
    let mut e = ready(gpu_and_ram(), 0);
    for proven in [true, false] {
        let res = admitted(admit(&mut e, "llm", None, 10));
        e.start_verifying(res.id).unwrap();
        let s = e.status(t(11));
        assert_eq!(s.work[0].phase, Phase::Verifying);
        assert_eq!(s.work[0].phase.as_str(), "verifying");
        assert_eq!(
            refused(admit(&mut e, "llm", None, 12)).code,
            RefusalCode::ResourceBusy
        );
        assert!(matches!(
            e.release_held(res.id, HeldRelease::AdministratorConfirmed, t(13)),
            Err(EngineError::NotHeld { .. })
        ));
        let outcome = if proven {
            ReleaseOutcome::Completed
        } else {
            ReleaseOutcome::Uncertain("no proof".into())
        };
        e.release(res.id, outcome, t(14)).unwrap();
        if proven {
            assert_eq!(e.entry_count(), 0);
            for name in [GPU, RAM] {
                e.record_sample(name, CapacitySample::memory(64_000, 80_000, t(15)))
                    .unwrap();
            }
        } else {
            assert_eq!(e.phase(res.id), Some(Phase::Held));
        }
    }
}
