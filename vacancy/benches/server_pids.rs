//! The cost of finding the upstream servers' processes once per GPU-pressure
//! poll (`vacancy::gpu_pressure::server_pids`): every process's descriptors and
//! parent are read from `/proc`, so the cost grows with the process count.
//! Measured with this machine's processes plus 0, 250 and 1,000 idle
//! `sleep` children of the listening "server" (a busy desktop runs several
//! hundred processes).
//!
//! Run: `cargo bench -p vacancy --bench server_pids`
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use vacancy::gpu_pressure::server_pids;

fn sleepers(n: usize) -> Vec<Child> {
    (0..n)
        .map(|_| {
            Command::new("sleep")
                .arg("600")
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    // This process is the "server": it listens, and its children are its runners.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut group = c.benchmark_group("server_pids");
    let mut children: Vec<Child> = Vec::new();
    // `--test` (the suite's smoke run) spawns fewer processes.
    let sizes: &[usize] = if std::env::args().any(|a| a == "--test") {
        &[0, 50]
    } else {
        &[0, 250, 1000]
    };
    for &extra in sizes {
        children.extend(sleepers(extra - children.len()));
        let processes = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.parse::<u32>().is_ok())
            })
            .count();
        let found = server_pids(&[addr]).len();
        assert!(
            found > extra,
            "the server and its {extra} children: {found}"
        );
        group.bench_with_input(
            BenchmarkId::new("processes", processes),
            &addr,
            |b, addr| b.iter(|| server_pids(std::slice::from_ref(addr))),
        );
    }
    group.finish();
    for mut child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench
}
criterion_main!(benches);
