//! Every fuzz target over its seed corpus (`corpus/TARGET/`), and over the
//! findings kept in `findings/TARGET/` once fixed: the invariants hold on
//! every test run, with or without AFL++.
#![allow(clippy::unwrap_used, clippy::panic, missing_docs)]

use std::path::Path;

#[test]
fn every_target_holds_on_its_seeds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for target in vacancy_fuzz::TARGETS {
        let mut seen = 0;
        for dir in ["corpus", "findings"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                let input = std::fs::read(&path).unwrap();
                let ok = std::panic::catch_unwind(|| vacancy_fuzz::run(target, &input));
                assert!(
                    matches!(ok, Ok(true)),
                    "{target}: {} breaks its invariant",
                    path.display()
                );
                seen += 1;
            }
        }
        assert!(seen > 0, "{target} has no seed corpus");
    }
}
