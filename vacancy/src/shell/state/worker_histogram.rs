//! A Prometheus histogram of durations that each proxy worker thread
//! counts in its own copy of, summed when `/metrics` is scraped.
//!
//! # Why
//!
//! Every proxied request is timed into two histograms (its whole time and
//! vacancyd's own part), and a work request into its phases as well.
//! `prometheus-client`'s histogram takes one lock for each observation, and
//! every worker takes the same lock, so its cache line moved between the
//! CPUs on every read: about 100 ns a read on the 2-core VM, by `perf`, and
//! as much again for a refused work request's one phase (issue 31). Here a
//! worker adds to counts no other worker writes, with no lock.
//!
//! # Behavior
//!
//! - An observation adds one to its bucket (the first whose upper bound it
//!   does not pass, `+Inf` last) and its nanoseconds to the sum, in the
//!   calling worker's copy; threads that are not workers share one more.
//!   One observation adds at most about 11.6 days to the sum.
//! - A scrape sums the copies. The count it reports is the sum of the
//!   buckets, so `_count` always equals the `+Inf` bucket; the sum may miss
//!   an observation being added at that moment, and has it next time.
//! - It encodes as a classic histogram, as `prometheus-client`'s own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

use crate::shell::state::workers::current_worker;

/// How many copies a histogram keeps: workers past this many share them
/// (correctly, as the counts are atomic, only no longer alone).
const COPIES: usize = 16;

/// The most one observation adds to the sum, in nanoseconds (about 11.6
/// days): the sum then cannot wrap before 18,000 of the longest.
const MAX_SUMMED_NS: u64 = 1_000_000_000_000_000;

/// The most buckets a histogram has, `+Inf` among them.
pub const MAX_BUCKETS: usize = 24;

/// One worker's counts, on cache lines of their own.
#[repr(align(128))]
#[derive(Debug, Default)]
struct WorkerCounts {
    /// Observations per bucket (not cumulative).
    buckets: [AtomicU64; MAX_BUCKETS],
    /// The observations' sum, in nanoseconds.
    sum_ns: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    /// Each bucket's upper bound as given, in seconds, `+Inf` last.
    bounds: Vec<f64>,
    /// The same bounds in nanoseconds (`u64::MAX` for `+Inf`).
    bounds_ns: Vec<u64>,
    copies: Box<[WorkerCounts]>,
}

/// A histogram of durations, counted per worker thread (see the
/// [module docs](self)). Clones count into the same histogram.
#[derive(Debug, Clone)]
pub struct WorkerHistogram {
    inner: Arc<Inner>,
}

impl WorkerHistogram {
    /// A histogram with these upper bounds in seconds, ascending; `+Inf` is
    /// added. Bounds past [`MAX_BUCKETS`] less one, and those not finite,
    /// are left out.
    pub fn new(bounds: &[f64]) -> Self {
        let mut given: Vec<f64> = bounds
            .iter()
            .copied()
            .filter(|b| b.is_finite())
            .take(MAX_BUCKETS - 1)
            .collect();
        // Nanoseconds, rounded: a bound of 0.0005 s is 500,000 ns, and a
        // duration of exactly that is in its bucket, as its f64 would be.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let mut bounds_ns: Vec<u64> = given
            .iter()
            .map(|b| (b * 1e9).round().max(0.0) as u64)
            .collect();
        given.push(f64::INFINITY);
        bounds_ns.push(u64::MAX);
        WorkerHistogram {
            inner: Arc::new(Inner {
                bounds: given,
                bounds_ns,
                copies: (0..COPIES).map(|_| WorkerCounts::default()).collect(),
            }),
        }
    }

    /// Count one duration.
    pub fn observe(&self, took: Duration) {
        let inner = &*self.inner;
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let bucket = inner
            .bounds_ns
            .iter()
            .position(|&bound| ns <= bound)
            .unwrap_or(inner.bounds_ns.len() - 1);
        let copy = &inner.copies[current_worker().map_or(COPIES - 1, |w| w % (COPIES - 1))];
        copy.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        copy.sum_ns
            .fetch_add(ns.min(MAX_SUMMED_NS), Ordering::Relaxed);
    }

    /// The sum in seconds, the count, and each bucket's upper bound and
    /// count (not cumulative), over every copy.
    fn totals(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let inner = &*self.inner;
        let mut buckets: Vec<(f64, u64)> = inner.bounds.iter().map(|&b| (b, 0)).collect();
        let mut sum_ns: u128 = 0;
        for copy in &inner.copies {
            for (total, n) in buckets.iter_mut().zip(&copy.buckets) {
                total.1 += n.load(Ordering::Relaxed);
            }
            sum_ns += u128::from(copy.sum_ns.load(Ordering::Relaxed));
        }
        let count = buckets.iter().map(|b| b.1).sum();
        #[allow(clippy::cast_precision_loss)]
        let sum = sum_ns as f64 / 1e9;
        (sum, count, buckets)
    }

    /// The observations' sum in seconds and their count (tests).
    #[cfg(test)]
    pub fn sum_and_count(&self) -> (f64, u64) {
        let (sum, count, _) = self.totals();
        (sum, count)
    }
}

impl TypedMetric for WorkerHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for WorkerHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.totals();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Registry;

    use super::*;

    const BOUNDS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 1.0];

    fn text(
        name: &str,
        metric: impl EncodeMetric + Send + Sync + std::fmt::Debug + 'static,
    ) -> String {
        let mut registry = Registry::default();
        registry.register(name, "help", metric);
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn it_encodes_as_prometheus_clients_own_histogram_does() {
        let ours = WorkerHistogram::new(BOUNDS);
        let theirs = Histogram::new(BOUNDS.iter().copied());
        // On a bound, between bounds, past the last, and zero.
        for us in [500, 499, 501, 1_000, 2_000, 7_000, 2_000_000, 0, 250] {
            let took = Duration::from_micros(us);
            ours.observe(took);
            theirs.observe(took.as_secs_f64());
        }
        // The same lines but the sum, which is exact here: whole
        // nanoseconds, added as integers, where theirs adds floats.
        let without_sum = |t: String| {
            t.lines()
                .filter(|l| !l.starts_with("t_sum"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let ours = text("t", ours);
        assert!(ours.contains("\nt_sum 2.01175\n"), "{ours}");
        assert_eq!(without_sum(ours), without_sum(text("t", theirs)));
    }

    #[test]
    fn every_thread_counts_into_the_one_histogram() {
        let h = WorkerHistogram::new(BOUNDS);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let h = h.clone();
                std::thread::spawn(move || {
                    for _ in 0..1_000 {
                        h.observe(Duration::from_micros(700));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let (sum, count) = h.sum_and_count();
        assert_eq!(count, 4_000);
        assert!((sum - 2.8).abs() < 1e-9, "{sum}");
        assert!(text("t", h).contains("t_bucket{le=\"0.001\"} 4000\n"));
    }

    #[test]
    fn a_duration_too_long_for_nanoseconds_is_counted_past_the_last_bound() {
        let h = WorkerHistogram::new(BOUNDS);
        h.observe(Duration::MAX);
        let out = text("t", h);
        assert!(out.contains("t_bucket{le=\"1.0\"} 0\n"), "{out}");
        assert!(out.contains("t_bucket{le=\"+Inf\"} 1\n"), "{out}");
    }
}
