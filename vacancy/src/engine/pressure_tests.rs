//! Tests of the pressure tracker: rules one by one, then properties under simulated time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;

use super::*;

const ATT: Attendance = Attendance::Attended;
const UNATT: Attendance = Attendance::Unattended;

fn load(util_pct: u8, memory_mib: u64) -> OwnerLoad {
    OwnerLoad {
        util_pct,
        memory_mib,
    }
}

/// poll 2 s (gap limit 20 s, stale after 15 s), +25 % / +1024 MiB, engage 4 s, quiet 30 s.
fn params() -> PressureParams {
    PressureParams::default()
}

/// Attended baseline 10 % / 1000 MiB; no unattended baseline.
fn tracker() -> PressureTracker {
    let baseline = Baseline {
        attended: Some(load(10, 1000)),
        unattended: None,
    };
    PressureTracker::new("gpu0", params(), baseline, Moment::ZERO)
}

fn at(secs: u64) -> Moment {
    Moment::from_secs(secs)
}

const QUIET: OwnerLoad = OwnerLoad {
    util_pct: 30,
    memory_mib: 2000,
};
const HIGH: OwnerLoad = OwnerLoad {
    util_pct: 55,
    memory_mib: 4000,
};

fn refuses(t: &PressureTracker, now: Moment) -> String {
    match t.verdict(now) {
        PressureVerdict::Refuses(why) => why,
        PressureVerdict::Admits => panic!("admits at {now:?}: {:?}", t.reading(now)),
    }
}

fn failed(why: &str) -> Miss {
    Miss::ReadFailed(why.to_owned())
}

// PRES-03, PRES-05, PRES-08, RECL-06: one poll folds in the observation,
// then the gap check, and reports what the engine needs.
#[test]
fn a_poll_reports_reading_verdict_clearing_and_trigger() {
    let mut t = tracker();
    let u = t.poll(at(0), Observation::Sample(QUIET, ATT));
    assert_eq!(u.resource, "gpu0");
    assert_eq!(u.reading, PressureReading::Quiet);
    assert_eq!(u.verdict, PressureVerdict::Admits);
    assert!(u.cleared && u.trigger.is_none());

    let u = t.poll(at(2), Observation::Sample(HIGH, ATT));
    assert_eq!(u.reading, PressureReading::Rising);
    assert!(matches!(u.verdict, PressureVerdict::Refuses(_)));
    assert!(!u.cleared && u.trigger.is_none());
    let u = t.poll(at(6), Observation::Sample(HIGH, ATT));
    assert_eq!(u.reading, PressureReading::Engaged);
    assert_eq!(u.trigger.map(|t| t.kind), Some(TriggerKind::Engaged));

    // Releasing: still refusing, but a reclaim may stand down.
    let u = t.poll(at(8), Observation::Sample(QUIET, ATT));
    assert_eq!(u.reading, PressureReading::Releasing);
    assert!(matches!(u.verdict, PressureVerdict::Refuses(_)) && u.cleared);

    // Misses until the gap limit: the poll itself reports the gap.
    let mut fired = None;
    for s in (10..=30).step_by(2) {
        let u = t.poll(at(s), Observation::Miss(failed("nvml gone")));
        assert!(!u.cleared, "a failed read never clears (RECL-07)");
        if u.trigger.is_some() {
            fired = Some((s, u.trigger));
            break;
        }
    }
    let (s, trigger) = fired.expect("the gap limit fires");
    assert_eq!(s, 28, "20 s after the last good sample at 8 s");
    assert_eq!(trigger.map(|t| t.kind), Some(TriggerKind::Gap));
}

#[test]
fn params_follow_the_config_and_the_floors() {
    // PRES-05, PRES-11
    let p = params();
    assert_eq!(p.gap_limit(), Duration::from_secs(20));
    assert_eq!(p.stale_after(), Duration::from_secs(15));
    let slow = PressureParams {
        poll: Duration::from_secs(10),
        ..p
    };
    assert_eq!(slow.gap_limit(), Duration::from_secs(30));
    assert_eq!(slow.stale_after(), Duration::from_secs(20));
    // The conversion from `[owner.gpu_pressure]` lives with the config.
    #[cfg(feature = "config")]
    {
        use crate::config::GpuPressureConfig;
        let c = GpuPressureConfig {
            poll_ms: 500,
            util_threshold_pct: 40,
            memory_threshold_mib: 2048,
            engage_ms: 1000,
            quiet_ms: 5000,
            ..GpuPressureConfig::default()
        };
        assert_eq!(
            PressureParams::from_config(&c),
            PressureParams {
                poll: Duration::from_millis(500),
                util_threshold_pct: 40,
                memory_threshold_mib: 2048,
                engage_after: Duration::from_secs(1),
                quiet_for: Duration::from_secs(5),
            }
        );
    }
}

#[test]
fn a_quiet_calibrated_sample_admits() {
    let mut t = tracker();
    // Exactly at the threshold is not above it.
    assert_eq!(t.on_sample(at(0), load(35, 2024), ATT), None);
    assert_eq!(t.reading(at(1)), PressureReading::Quiet);
    assert_eq!(t.verdict(at(1)), PressureVerdict::Admits);
    assert!(t.cleared(at(1)));
}

#[test]
fn pres_04_no_sample_or_a_failed_read_refuses_at_once() {
    // PRES-04
    let mut t = tracker();
    assert!(matches!(t.reading(at(0)), PressureReading::Unavailable(_)));
    assert!(refuses(&t, at(0)).contains("no pressure sample yet"));
    assert!(!t.cleared(at(0)));
    t.on_sample(at(1), QUIET, ATT);
    assert_eq!(t.on_miss(at(3), failed("NVML: GPU is lost")), None);
    let why = refuses(&t, at(3));
    assert!(why.contains("gpu0") && why.contains("GPU is lost"), "{why}");
    // RECL-07: not engaged, but not cleared either.
    assert!(!t.cleared(at(3)));
    t.on_sample(at(5), QUIET, ATT);
    assert_eq!(t.verdict(at(5)), PressureVerdict::Admits);
}

#[test]
fn pres_03_pressure_engages_after_engage_after_and_fires_once() {
    // PRES-03
    let mut t = tracker();
    assert_eq!(t.on_sample(at(0), HIGH, ATT), None);
    assert_eq!(t.reading(at(0)), PressureReading::Rising);
    assert!(!t.cleared(at(0)));
    let why = refuses(&t, at(2));
    assert!(
        why.contains("55% / 4000 MiB")
            && why.contains("attended baseline of 10% / 1000 MiB")
            && why.contains("for 2 s"),
        "{why}"
    );
    assert_eq!(t.on_sample(at(2), HIGH, ATT), None);
    let trigger = t.on_sample(at(4), HIGH, ATT).unwrap();
    assert_eq!(trigger.kind, TriggerKind::Engaged);
    assert!(trigger.why.contains("engaged"), "{}", trigger.why);
    assert_eq!(t.reading(at(4)), PressureReading::Engaged);
    assert!(refuses(&t, at(5)).contains("engaged"));
    // The same condition persisting does not fire again.
    for s in 3..10 {
        assert_eq!(t.on_sample(at(2 * s), HIGH, ATT), None);
        assert_eq!(t.tick(at(2 * s + 1)), None);
    }
}

#[test]
fn memory_alone_can_be_above_the_threshold() {
    let mut t = tracker();
    t.on_sample(at(0), load(10, 2025), ATT);
    assert_eq!(t.reading(at(0)), PressureReading::Rising);
}

#[test]
fn a_sample_below_the_threshold_restarts_the_time_to_engage() {
    let mut t = tracker();
    t.on_sample(at(0), HIGH, ATT);
    t.on_sample(at(2), QUIET, ATT);
    assert_eq!(t.on_sample(at(4), HIGH, ATT), None);
    assert_eq!(t.on_sample(at(6), HIGH, ATT), None);
    assert!(t.on_sample(at(8), HIGH, ATT).is_some());
}

#[test]
fn pres_07_a_miss_does_not_reset_the_time_above_the_threshold() {
    // PRES-07
    let mut t = tracker();
    t.on_sample(at(0), HIGH, ATT);
    assert_eq!(t.on_miss(at(2), failed("busy")), None);
    assert_eq!(t.on_miss(at(3), Miss::PresenceUnknown), None);
    let trigger = t.on_sample(at(4), HIGH, ATT).unwrap();
    assert_eq!(trigger.kind, TriggerKind::Engaged);
    assert!(trigger.why.contains("for 4 s"), "{}", trigger.why);
}

/// Engaged at 4 s, quiet samples from 6 s.
fn releasing() -> PressureTracker {
    let mut t = tracker();
    t.on_sample(at(0), HIGH, ATT);
    t.on_sample(at(2), HIGH, ATT);
    assert!(t.on_sample(at(4), HIGH, ATT).is_some());
    assert_eq!(t.on_sample(at(6), QUIET, ATT), None);
    t
}

#[test]
fn pres_08_release_needs_quiet_for_of_observed_quiet() {
    // PRES-08
    let mut t = releasing();
    assert_eq!(t.reading(at(6)), PressureReading::Releasing);
    let why = refuses(&t, at(6));
    assert!(why.contains("releasing") && why.contains("30 s"), "{why}");
    // RECL-06: below the threshold is cleared, though new work is refused.
    assert!(t.cleared(at(6)));
    for s in 4..18 {
        t.on_sample(at(2 * s), QUIET, ATT);
        assert_eq!(t.reading(at(2 * s)), PressureReading::Releasing, "{s}");
    }
    // 36 s: quiet from 6 s to 36 s is 30 s.
    t.on_sample(at(36), QUIET, ATT);
    assert_eq!(t.reading(at(36)), PressureReading::Quiet);
    assert_eq!(t.verdict(at(36)), PressureVerdict::Admits);
}

#[test]
fn pres_08_a_miss_restarts_the_quiet_time() {
    // PRES-08
    for miss in [failed("busy"), Miss::PresenceUnknown] {
        let mut t = releasing();
        t.on_sample(at(20), QUIET, ATT);
        t.on_miss(at(22), miss.clone());
        t.on_sample(at(24), QUIET, ATT);
        // Without the miss, 36 s would release; now quiet counts from 24 s.
        t.on_sample(at(36), QUIET, ATT);
        assert_eq!(t.reading(at(36)), PressureReading::Releasing, "{miss:?}");
        t.on_sample(at(50), QUIET, ATT);
        assert_eq!(t.reading(at(50)), PressureReading::Releasing, "{miss:?}");
        t.on_sample(at(54), QUIET, ATT);
        assert_eq!(t.reading(at(54)), PressureReading::Quiet, "{miss:?}");
    }
}

#[test]
fn pres_09_engaged_again_while_releasing_fires_at_once() {
    // PRES-09
    let mut t = releasing();
    let trigger = t.on_sample(at(8), HIGH, ATT).unwrap();
    assert_eq!(trigger.kind, TriggerKind::Engaged);
    assert_eq!(t.reading(at(8)), PressureReading::Engaged);
    assert!(!t.cleared(at(8)));
    // A miss between two high samples does not fire twice.
    t.on_miss(at(9), failed("busy"));
    assert_eq!(t.on_sample(at(10), HIGH, ATT), None);
}

#[test]
fn pres_09_uncalibrated_while_releasing_fires_at_once() {
    // PRES-09
    let mut t = releasing();
    let trigger = t.on_sample(at(8), QUIET, UNATT).unwrap();
    assert_eq!(trigger.kind, TriggerKind::Uncalibrated);
    // The quiet time restarts: the uncalibrated sample was not judged quiet.
    t.on_sample(at(10), QUIET, ATT);
    t.on_sample(at(36), QUIET, ATT);
    assert_eq!(t.reading(at(36)), PressureReading::Releasing);
}

#[test]
fn pres_03_uncalibrated_fires_once_per_episode() {
    // PRES-03
    let mut t = tracker();
    let trigger = t.on_sample(at(0), QUIET, UNATT).unwrap();
    assert_eq!(trigger.kind, TriggerKind::Uncalibrated);
    assert!(
        trigger.why.contains("unattended baseline"),
        "{}",
        trigger.why
    );
    assert_eq!(t.reading(at(0)), PressureReading::Uncalibrated(UNATT));
    let why = refuses(&t, at(0));
    assert!(
        why.contains("calibrate-pressure --resource gpu0 --unattended"),
        "{why}"
    );
    assert!(!t.cleared(at(0)));
    assert_eq!(t.on_sample(at(2), QUIET, UNATT), None);
    assert_eq!(t.on_miss(at(3), failed("busy")), None);
    assert_eq!(t.on_sample(at(4), QUIET, UNATT), None);
    // A calibrated sample ends the episode; the next uncalibrated one fires.
    assert_eq!(t.on_sample(at(6), QUIET, ATT), None);
    assert!(t.on_sample(at(8), QUIET, UNATT).is_some());
    // Calibrating ends it too.
    t.set_baseline(Baseline {
        attended: Some(load(10, 1000)),
        unattended: Some(load(0, 0)),
    });
    assert_eq!(t.on_sample(at(10), load(5, 100), UNATT), None);
    assert_eq!(t.reading(at(10)), PressureReading::Quiet);
}

#[test]
fn pres_05_the_gap_limit_reclaims_once_counted_from_the_last_good_sample() {
    // PRES-05
    let mut t = tracker();
    t.on_sample(at(1), QUIET, ATT);
    for s in 1..10 {
        assert_eq!(t.on_miss(at(1 + 2 * s), failed("busy")), None, "{s}");
    }
    let trigger = t.on_miss(at(21), failed("busy")).unwrap();
    assert_eq!(trigger.kind, TriggerKind::Gap);
    assert!(
        trigger.why.contains("for 20 s") && trigger.why.contains("gap limit 20 s"),
        "{}",
        trigger.why
    );
    assert_eq!(t.tick(at(22)), None);
    assert_eq!(t.on_miss(at(23), failed("busy")), None);
    // The good sample ending it does not fire again (the gap already did).
    assert_eq!(t.on_sample(at(24), QUIET, ATT), None);
    // A new gap fires again.
    assert!(t.tick(at(44)).is_some());
}

#[test]
fn pres_05_before_any_sample_the_gap_counts_from_creation() {
    // PRES-05
    let mut t = PressureTracker::new("gpu0", params(), Baseline::default(), at(100));
    assert_eq!(t.tick(at(119)), None);
    let trigger = t.tick(at(120)).unwrap();
    assert!(trigger.why.contains("tracking started"), "{}", trigger.why);
}

#[test]
fn pres_06_a_good_sample_ending_a_long_gap_fires_even_if_quiet() {
    // PRES-06
    let mut t = tracker();
    t.on_sample(at(0), QUIET, ATT);
    let trigger = t.on_sample(at(25), QUIET, ATT).unwrap();
    assert_eq!(trigger.kind, TriggerKind::Gap);
    assert!(trigger.why.contains("ended a gap"), "{}", trigger.why);
    assert_eq!(t.reading(at(25)), PressureReading::Quiet);
    // A gap within the limit does not.
    assert_eq!(t.on_sample(at(44), QUIET, ATT), None);
}

#[test]
fn pres_06_gap_and_engagement_on_one_sample_report_both() {
    // PRES-06, PRES-07
    let mut t = tracker();
    t.on_sample(at(0), HIGH, ATT);
    let trigger = t.on_sample(at(30), HIGH, ATT).unwrap();
    assert_eq!(trigger.kind, TriggerKind::Gap);
    assert!(trigger.why.contains("engaged"), "{}", trigger.why);
    assert_eq!(t.on_sample(at(32), HIGH, ATT), None);
}

#[test]
fn pres_11_to_13_a_presence_outage_keeps_the_reading_until_stale() {
    // PRES-11, PRES-12, PRES-13
    let mut t = tracker();
    t.on_sample(at(0), QUIET, ATT);
    for s in 1..=7 {
        assert_eq!(t.on_miss(at(2 * s), Miss::PresenceUnknown), None);
        assert_eq!(t.reading(at(2 * s)), PressureReading::Quiet, "{s}");
    }
    assert!(t.cleared(at(15)));
    assert_eq!(t.verdict(at(15)), PressureVerdict::Admits);
    // Stale: unknown, refuses at once, not cleared.
    let why = refuses(&t, at(16));
    assert!(
        why.contains("16 s old") && why.contains("stale after 15 s"),
        "{why}"
    );
    assert!(!t.cleared(at(16)));
    assert_eq!(t.on_miss(at(18), Miss::PresenceUnknown), None);
    // PRES-13: the gap limit still counts from the last good sample.
    let trigger = t.on_miss(at(20), Miss::PresenceUnknown).unwrap();
    assert_eq!(trigger.kind, TriggerKind::Gap);
}

#[test]
fn recl_06_rising_is_not_cleared() {
    // RECL-06
    let mut t = tracker();
    t.on_sample(at(0), HIGH, ATT);
    assert!(!t.cleared(at(0)));
    t.on_sample(at(2), QUIET, ATT);
    assert!(t.cleared(at(2)));
}

// ---------------------------------------------------------------------------
// Properties under simulated time.

#[derive(Debug, Clone)]
enum Event {
    Sample(OwnerLoad, Attendance),
    Failed,
    PresenceUnknown,
    Tick,
}

fn event() -> impl Strategy<Value = Event> {
    let attendance = prop_oneof![4 => Just(ATT), 1 => Just(UNATT)];
    let sample =
        (0u8..=100, 0u64..4000, attendance).prop_map(|(u, m, a)| Event::Sample(load(u, m), a));
    prop_oneof![
        6 => sample,
        2 => Just(Event::Failed),
        1 => Just(Event::PresenceUnknown),
        2 => Just(Event::Tick),
    ]
}

/// Events with the milliseconds before each (up to 8 s, so gaps happen).
fn script() -> impl Strategy<Value = Vec<(u64, Event)>> {
    prop::collection::vec((0u64..8000, event()), 1..120)
}

fn apply(t: &mut PressureTracker, now: Moment, e: &Event) -> Option<Trigger> {
    match e {
        Event::Sample(l, a) => t.on_sample(now, *l, *a),
        Event::Failed => t.on_miss(now, failed("scripted")),
        Event::PresenceUnknown => t.on_miss(now, Miss::PresenceUnknown),
        Event::Tick => t.tick(now),
    }
}

fn baseline_for(a: Attendance, partial: bool) -> Option<OwnerLoad> {
    match a {
        Attendance::Attended => Some(load(20, 1000)),
        Attendance::Unattended if partial => None,
        Attendance::Unattended => Some(load(5, 300)),
    }
}

fn prop_tracker(partial: bool) -> PressureTracker {
    let baseline = Baseline {
        attended: baseline_for(ATT, partial),
        unattended: baseline_for(UNATT, partial),
    };
    PressureTracker::new("gpu0", params(), baseline, Moment::ZERO)
}

fn above(l: OwnerLoad, b: OwnerLoad) -> bool {
    let p = params();
    u16::from(l.util_pct) > u16::from(b.util_pct) + u16::from(p.util_threshold_pct)
        || l.memory_mib > b.memory_mib + p.memory_threshold_mib
}

/// The first Engaged trigger's time, if any.
fn first_engaged(events: &[(u64, Moment, Event)], partial: bool) -> Option<Moment> {
    let mut t = prop_tracker(partial);
    events.iter().find_map(|(_, now, e)| {
        apply(&mut t, *now, e)
            .filter(|tr| tr.kind == TriggerKind::Engaged || tr.why.contains("gpu0 engaged"))
            .map(|_| *now)
    })
}

fn timed(script: &[(u64, Event)]) -> Vec<(u64, Moment, Event)> {
    let mut now = Moment::ZERO;
    script
        .iter()
        .map(|(dt, e)| {
            now = now.after(Duration::from_millis(*dt));
            (*dt, now, e.clone())
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The safety properties, checked after every input.
    #[test]
    fn invariants_hold_at_every_step(script in script(), partial in any::<bool>()) {
        let p = params();
        let mut t = prop_tracker(partial);
        // The model: the last good sample, a failed read since, when the gap counts from.
        let mut last: Option<(Moment, OwnerLoad, Attendance)> = None;
        let mut failed_since = false;
        let mut gap_origin = Moment::ZERO;
        let mut gap_fired = false;
        // Per kind: whether the episode of its last trigger has ended.
        let mut ended_gap = true;
        let mut ended_engaged = true;
        let mut ended_uncal = true;
        for (_, now, e) in timed(&script) {
            let trigger = apply(&mut t, now, &e);
            if let Some(tr) = &trigger {
                // No duplicate triggers within one episode.
                match tr.kind {
                    TriggerKind::Gap => { prop_assert!(ended_gap, "{tr:?}"); ended_gap = false; }
                    TriggerKind::Engaged => { prop_assert!(ended_engaged, "{tr:?}"); ended_engaged = false; }
                    TriggerKind::Uncalibrated => { prop_assert!(ended_uncal, "{tr:?}"); ended_uncal = false; }
                }
                if tr.kind == TriggerKind::Gap { gap_fired = true; }
            }
            match &e {
                Event::Sample(l, a) => {
                    // PRES-06: a sample ending a gap past the limit fired, now or before.
                    if now.since(gap_origin) >= p.gap_limit() {
                        prop_assert!(gap_fired, "gap not reported by {now:?}");
                    }
                    last = Some((now, *l, *a));
                    failed_since = false;
                    gap_origin = now;
                    gap_fired = false;
                    ended_gap = true;
                    if let Some(b) = baseline_for(*a, partial) {
                        ended_uncal = true;
                        if !above(*l, b) { ended_engaged = true; }
                    }
                }
                Event::Failed => failed_since = true,
                _ => {}
            }
            // PRES-05, PRES-13: by the first input at or past the gap limit
            // with no good sample, the gap trigger has fired.
            if !matches!(e, Event::Sample(..)) && now.since(gap_origin) >= p.gap_limit() {
                prop_assert!(gap_fired, "no gap trigger {:?} after the last good sample", now.since(gap_origin));
            }
            let fresh_below = last.is_some_and(|(at, l, a)| {
                !failed_since
                    && now.since(at) <= p.stale_after()
                    && baseline_for(a, partial).is_some_and(|b| !above(l, b))
            });
            // Cleared ⇒ the last good sample is fresh, calibrated and below the threshold.
            if t.cleared(now) { prop_assert!(fresh_below, "cleared at {now:?}"); }
            // Admits ⇒ cleared (and so never while above the threshold or unavailable).
            if t.verdict(now) == PressureVerdict::Admits {
                prop_assert!(t.cleared(now));
                prop_assert_eq!(t.reading(now), PressureReading::Quiet);
            }
            // The reading says unavailable exactly when nothing fresh stands.
            let standing = last.is_some_and(|(at, _, _)| !failed_since && now.since(at) <= p.stale_after());
            prop_assert_eq!(
                matches!(t.reading(now), PressureReading::Unavailable(_)),
                !standing
            );
            // Still standing later only if nothing changes: cleared never outlives staleness.
            if let Some((at, _, _)) = last {
                prop_assert!(!t.cleared(at.after(p.stale_after()).after(Duration::from_millis(1))));
            }
        }
    }

    /// A miss never shortens the time to engage: inserting misses leaves the
    /// first engagement where it was or later, and never before `engage_after`
    /// of samples above the threshold.
    #[test]
    fn a_miss_never_shortens_the_time_to_engage(
        script in script(),
        misses in prop::collection::vec((0usize..120, any::<bool>()), 0..20),
        partial in any::<bool>(),
    ) {
        let base = timed(&script);
        let mut with_misses = base.clone();
        for (i, read_failed) in misses {
            let i = i % (with_misses.len() + 1);
            let now = if i == 0 { Moment::ZERO } else { with_misses[i - 1].1 };
            let e = if read_failed { Event::Failed } else { Event::PresenceUnknown };
            with_misses.insert(i, (0, now, e));
        }
        let plain = first_engaged(&base, partial);
        let missed = first_engaged(&with_misses, partial);
        match (plain, missed) {
            (Some(a), Some(b)) => prop_assert!(b >= a, "{b:?} < {a:?}"),
            (None, Some(b)) => prop_assert!(false, "engaged at {b:?} only with misses"),
            _ => {}
        }
        // The first engagement comes at least engage_after after the first
        // sample above the threshold.
        if let Some(when) = plain {
            let first_above = base.iter().find_map(|(_, now, e)| match e {
                Event::Sample(l, a) => baseline_for(*a, partial)
                    .filter(|b| above(*l, *b))
                    .map(|_| *now),
                _ => None,
            });
            let first_above = first_above.expect("engaged without a sample above");
            prop_assert!(when.since(first_above) >= params().engage_after);
        }
    }
}
