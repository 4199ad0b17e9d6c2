//! COMFY-30: scanning a ComfyUI queue reply keeps vacancyd's memory flat,
//! however large the reply; parsing it whole (serde_json) would not.
//!
//! One test in its own binary: the counting allocator sees every thread.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::alloc::System;

use peakmem_alloc::{INSTRUMENTED_SYSTEM, PeakMemAlloc, PeakMemAllocTrait};
use vacancy_adapters::comfyui::stream::{
    FindPrompt, Flow, ListPrompts, PromptPlace, QueueScan, Scanner,
};

#[path = "support/comfyui_queue.rs"]
mod comfyui_queue;
use comfyui_queue::QueueReply;

#[global_allocator]
static GLOBAL: &PeakMemAlloc<System> = &INSTRUMENTED_SYSTEM;

const MIB: usize = 1024 * 1024;

/// Feeds the whole generated reply to `scanner` in 64 KiB chunks; the
/// answer, the bytes fed, and the peak heap growth while scanning.
fn scan_generated<S: Scanner>(size: usize, scanner: S) -> (S::Output, usize, usize) {
    let mut reply = QueueReply::new(size, 64 * 1024, "the-last-prompt");
    let mut scanner = scanner;
    let mut fed = 0;
    GLOBAL.reset_peak_memory();
    while let Some(chunk) = reply.next_chunk() {
        fed += chunk.len();
        if scanner.feed(chunk).unwrap() == Flow::Stop {
            break;
        }
    }
    let out = scanner.finish().unwrap();
    (out, fed, GLOBAL.get_peak_memory())
}

#[test]
fn scanning_a_64_mib_queue_reply_keeps_the_heap_flat_and_parsing_it_whole_does_not() {
    // The scan: a 64 MiB reply fed in 64 KiB chunks, looking for the very
    // last prompt. The growth measured includes the generator's own chunk
    // buffer (~80 KiB).
    let (place, fed, peak) =
        scan_generated(64 * MIB, QueueScan::new(FindPrompt::new("the-last-prompt")));
    assert_eq!(place, PromptPlace::Pending);
    assert!(fed >= 64 * MIB, "{fed}");
    assert!(peak < MIB, "scanning 64 MiB grew the heap by {peak} bytes");
    println!("scan of {fed} bytes: peak heap growth {peak} bytes");

    // Listing keeps every ID (36 bytes each): it grows with the number of
    // items, not with their workflows.
    let (listing, fed, peak) = scan_generated(16 * MIB, QueueScan::new(ListPrompts::new()));
    let ids = listing.running.len() + listing.pending.len();
    assert!(ids > 1000, "{ids}");
    assert!(peak < MIB + ids * 64, "{peak} for {ids} ids in {fed} bytes");

    // The naive way: the whole reply in memory, parsed into a tree. Measured
    // on 16 MiB to keep the debug-mode test quick; it already needs more than
    // the reply's size again on top of the reply itself.
    let data = QueueReply::new(16 * MIB, 64 * 1024, "the-last-prompt").collect();
    GLOBAL.reset_peak_memory();
    let value: serde_json::Value = serde_json::from_slice(&data).unwrap();
    let naive = GLOBAL.get_peak_memory();
    assert_eq!(
        value["queue_pending"].as_array().map(Vec::len),
        Some(ids - 1)
    );
    drop(value);
    println!(
        "serde_json::from_slice of {} bytes: peak heap growth {naive} bytes",
        data.len()
    );
    assert!(naive > data.len(), "{naive}");
    assert!(naive > 16 * peak, "{naive} vs {peak}");
}
