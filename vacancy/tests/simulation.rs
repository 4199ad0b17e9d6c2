//! The deterministic simulation at CI size (issue 18 item 7): 10^4 steps
//! over a few seeds with every invariant checked after every step, the same
//! seed giving the same run, and each planted shell mistake caught.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use vacancy::simulation::{Mutation, Settings, run};

fn settings(seed: u64, steps: u64, mutation: Mutation) -> Settings {
    Settings {
        seed,
        steps,
        mutation,
        verbose: false,
    }
}

#[test]
fn ten_thousand_steps_keep_every_invariant() {
    // ADM-01, ADM-04, MEM-01, OWN-01, DONE-01..04, HELD-06, REC-01, REC-02
    for seed in [1, 2, 3] {
        let summary = run(settings(seed, 10_000, Mutation::None)).unwrap_or_else(|v| panic!("{v}"));
        println!("{summary}");
        // The run exercised what it checks.
        assert!(summary.admitted > 50, "{summary}");
        assert!(summary.crashes > 0, "{summary}");
        assert!(summary.held_released > 0, "{summary}");
        assert!(summary.reclaims_acted > 0, "{summary}");
    }
}

#[test]
fn a_seed_reproduces_its_run_exactly() {
    let a = run(settings(42, 3000, Mutation::None)).unwrap_or_else(|v| panic!("{v}"));
    let b = run(settings(42, 3000, Mutation::None)).unwrap_or_else(|v| panic!("{v}"));
    assert_eq!(a.digest, b.digest);
    assert_eq!(a.disk_calls, b.disk_calls);
    let c = run(settings(43, 3000, Mutation::None)).unwrap_or_else(|v| panic!("{v}"));
    assert_ne!(a.digest, c.digest);
}

/// The first seed (of a few) on which the planted mistake is caught.
fn caught(mutation: Mutation) -> String {
    for seed in 1..=5 {
        if let Err(v) = run(settings(seed, 10_000, mutation)) {
            let again = run(settings(seed, 10_000, mutation)).unwrap_err();
            assert_eq!(
                (v.step, &v.what),
                (again.step, &again.what),
                "not reproduced"
            );
            return v.what;
        }
    }
    panic!("{mutation:?} was never caught");
}

#[test]
fn forwarding_an_unrecorded_reservation_is_caught() {
    // REC-01: after the crash the job still runs and nothing holds it
    let what = caught(Mutation::ForwardUnrecorded);
    assert!(what.contains("no release without proof"), "{what}");
}

#[test]
fn an_administrator_release_of_running_work_is_caught() {
    // HELD-04
    let what = caught(Mutation::AdminReleasesRunning);
    assert!(what.contains("no release without proof"), "{what}");
}

#[test]
fn admission_while_the_owner_is_present_is_caught() {
    // OWN-01
    let what = caught(Mutation::IgnoreOwner);
    assert!(what.contains("OWN-01"), "{what}");
}
