//! The cost of durability on the request path (REC-01: reservations are persisted before forwarding): one `persist`
//! (an appended journal line and one `fdatasync`) against the floor, a bare
//! append and `fdatasync` on the same file system, plus `forget`.
//!
//! Run: `cargo bench -p vacancy --bench ledger`
//! (`VACANCY_LEDGER_BENCH_DIR` picks the file system; default: the temp dir).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::fs::{DirBuilder, OpenOptions};
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;

use criterion::{Criterion, criterion_group, criterion_main};
use vacancy::engine::{Charge, CompletionMethod, EntryId, Reservation};
use vacancy::ledger::Ledger;
use vacancy::ledger::store::ReservationStore;

fn reservation(n: u128) -> Reservation {
    Reservation {
        id: EntryId::from_u128(n),
        upstream: "llama".into(),
        model: Some("llama3.1:8b".into()),
        charges: vec![Charge {
            resource: "gpu0".into(),
            required_mib: 6000,
            free_mib: 20_000,
        }],
        resident_credit: false,
        admitted_at: vacancy::Moment::ZERO,
        completion: CompletionMethod::ResponseEnd,
        upstream_ref: None,
        borrower: None,
    }
}

fn bench(c: &mut Criterion) {
    let base = std::env::var_os("VACANCY_LEDGER_BENCH_DIR");
    let tmp = match &base {
        Some(b) => tempfile::tempdir_in(b).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let rec = tmp.path().join("rec");
    DirBuilder::new().mode(0o700).create(&rec).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (ledger, _) = Ledger::open(&rec).unwrap();
    let mut n: u128 = 1;
    let mut group = c.benchmark_group("ledger");
    group.bench_function("persist (append + fdatasync)", |b| {
        b.iter(|| {
            n += 1;
            rt.block_on(ledger.persist(&reservation(n))).unwrap();
        });
    });
    group.bench_function("persist + forget", |b| {
        b.iter(|| {
            n += 1;
            let r = reservation(n);
            rt.block_on(ledger.persist(&r)).unwrap();
            rt.block_on(ledger.forget(r.id)).unwrap();
        });
    });
    let floor = tmp.path().join("floor");
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&floor)
        .unwrap();
    let line = serde_json::json!({"v":1,"op":"admit","id":EntryId::from_u128(7).to_string()})
        .to_string()
        + "\n";
    group.bench_function("floor: bare append + fdatasync", |b| {
        b.iter(|| {
            file.write_all(line.as_bytes()).unwrap();
            file.sync_data().unwrap();
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
