//! Scan throughput and memory of a ComfyUI `GET /queue` reply (COMFY-30/31):
//! a generated 256 MiB reply (the COMFY-31 cap) of realistic items (SDXL
//! workflows with nested inputs and 3 KiB prompt texts full of escapes),
//! scanned in 64 KiB chunks for the last pending prompt, so every byte is
//! scanned.
//!
//! Run: `cargo bench -p vacancy-adapters --bench comfyui_queue_scan`; it
//! prints one timed scan (MB/s, peak heap growth measured with a counting
//! global allocator), then criterion's throughput.
//!
//! Test mode (`-- --test`, as `scripts/test` runs it) generates a 16 MiB
//! reply instead and runs each step once, so it stays quick.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::alloc::System;
use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use peakmem_alloc::{INSTRUMENTED_SYSTEM, PeakMemAlloc, PeakMemAllocTrait};
use vacancy_adapters::comfyui::stream::{FindPrompt, Flow, PromptPlace, QueueScan, Scanner};

#[path = "../tests/support/comfyui_queue.rs"]
mod comfyui_queue;
use comfyui_queue::QueueReply;

#[global_allocator]
static GLOBAL: &PeakMemAlloc<System> = &INSTRUMENTED_SYSTEM;

const MIB: usize = 1024 * 1024;
const CHUNK: usize = 64 * 1024;
const TARGET: &str = "the-last-prompt";

fn scan(reply: &[u8]) -> PromptPlace {
    let mut scanner = QueueScan::new(FindPrompt::new(TARGET));
    for chunk in reply.chunks(CHUNK) {
        if scanner.feed(black_box(chunk)).unwrap() == Flow::Stop {
            break;
        }
    }
    scanner.finish().unwrap()
}

fn queue_scan(c: &mut Criterion) {
    let test_mode = std::env::args().any(|a| a == "--test");
    let size = if test_mode { 16 * MIB } else { 256 * MIB };
    let reply = QueueReply::new(size, CHUNK, TARGET).collect();

    // One scan, timed and measured on its own.
    GLOBAL.reset_peak_memory();
    let started = Instant::now();
    let place = scan(&reply);
    let elapsed = started.elapsed();
    let peak = GLOBAL.get_peak_memory();
    assert_eq!(place, PromptPlace::Pending);
    println!(
        "comfyui queue scan: {:.1} MiB in {:.3} s = {:.0} MB/s (1 MB = 10^6 bytes), peak heap growth {} bytes, {} KiB chunks{}",
        reply.len() as f64 / MIB as f64,
        elapsed.as_secs_f64(),
        reply.len() as f64 / 1e6 / elapsed.as_secs_f64(),
        peak,
        CHUNK / 1024,
        if test_mode {
            " (test mode: 16 MiB reply)"
        } else {
            ""
        }
    );

    let mut group = c.benchmark_group("comfyui_queue_scan");
    group.throughput(Throughput::Bytes(reply.len() as u64));
    group.sample_size(10);
    group.bench_function(format!("find_last_in_{}_mib", reply.len() / MIB), |b| {
        b.iter(|| scan(black_box(&reply)))
    });
    group.finish();
}

criterion_group!(benches, queue_scan);
criterion_main!(benches);
