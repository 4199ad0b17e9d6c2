//! What the owner console charts and lists besides the live status: each
//! resource's free memory over the last hour, the jobs that ran on it, and the
//! recent reclaims. Bounded rings in memory, never a database: they start
//! empty with the daemon and never grow past their bounds.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use crate::engine::{EntryId, Reservation};
use crate::time::Moment;
use crate::traits::resource::CapacitySample;

/// How far back the memory chart reaches.
pub const WINDOW: Duration = Duration::from_secs(3600);
/// One chart point per this much time: the lowest free memory in it is kept,
/// so a dip between two polls is never smoothed away.
pub const BUCKET: Duration = Duration::from_secs(10);
/// Points per resource: the window in buckets.
const MAX_POINTS: usize = (WINDOW.as_secs() / BUCKET.as_secs()) as usize;
/// Job marks kept (the newest).
const MAX_JOBS: usize = 256;
/// Reclaims kept (the newest).
const MAX_RECLAIMS: usize = 32;
/// Entry IDs kept per list of one reclaim.
const MAX_ENTRIES_PER_RECLAIM: usize = 32;

/// The daemon's recent history, shared by the shells that record it and the
/// control listener that serves it.
#[derive(Debug, Default)]
pub struct History {
    inner: Mutex<Rings>,
}

#[derive(Debug, Default)]
struct Rings {
    resources: Vec<(String, VecDeque<Point>)>,
    jobs: VecDeque<Job>,
    reclaims: VecDeque<Reclaim>,
}

#[derive(Debug, Clone, Copy)]
struct Point {
    bucket: u64,
    at: Moment,
    free_mib: u64,
    min_free_mib: u64,
    total_mib: u64,
}

#[derive(Debug, Clone)]
struct Job {
    entry: EntryId,
    upstream: String,
    resources: Vec<String>,
    started: Moment,
    ended: Option<Moment>,
}

#[derive(Debug, Clone)]
struct Reclaim {
    id: String,
    upstream: String,
    trigger: String,
    trigger_kind: &'static str,
    mode: &'static str,
    started: Moment,
    ended: Option<Moment>,
    outcome: Option<&'static str>,
    closed: Vec<String>,
    cancelled: Vec<String>,
    cancel_failed: Vec<String>,
    unload: Option<String>,
}

/// The history as served to the console (`GET /history`); every time is an
/// age in seconds at the moment of the snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HistorySnapshot {
    /// The chart's window in seconds.
    pub window_s: u64,
    /// The width of one point in seconds.
    pub bucket_s: u64,
    /// Per resource, in the order first sampled.
    pub resources: Vec<ResourceHistory>,
    /// Jobs admitted in the window, oldest first.
    pub jobs: Vec<JobMark>,
}

/// One resource's free memory over the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResourceHistory {
    /// The resource.
    pub name: String,
    /// Oldest first.
    pub points: Vec<MemoryPoint>,
}

/// One chart point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryPoint {
    /// Seconds since the newest sample of the point.
    pub age_s: u64,
    /// Free MiB in the point's newest sample.
    pub free_mib: u64,
    /// The lowest free MiB of the point's samples.
    pub min_free_mib: u64,
    /// Total MiB in the point's newest sample.
    pub total_mib: u64,
}

/// One job on the chart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobMark {
    /// The entry ID.
    pub entry: String,
    /// The upstream.
    pub upstream: String,
    /// The resources it held.
    pub resources: Vec<String>,
    /// Seconds since it was admitted.
    pub started_age_s: u64,
    /// Seconds since it was released; `None` while it still holds its resources.
    pub ended_age_s: Option<u64>,
}

/// One reclaim in the recent-reclaims log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReclaimLogEntry {
    /// Its handle (`reclaim-3`).
    pub id: String,
    /// The upstream.
    pub upstream: String,
    /// What started it, in words.
    pub trigger: String,
    /// `owner_return` or `pressure`.
    pub trigger_kind: &'static str,
    /// drain | cancel | finish.
    pub mode: &'static str,
    /// Seconds since it started.
    pub started_age_s: u64,
    /// How long it took, once ended.
    pub elapsed_s: Option<u64>,
    /// `stood_down` (its trigger cleared), `finished` (the work ended by
    /// itself), `acted` (cancellation or an unload went ahead); `None` while under way.
    pub outcome: Option<&'static str>,
    /// Entries whose proxied response it closed.
    pub closed: Vec<String>,
    /// Entries it cancelled at the upstream (stopped, or asked to stop).
    pub cancelled: Vec<String>,
    /// Entries whose cancellation failed (they keep their reservation).
    pub cancel_failed: Vec<String>,
    /// What the unload did, when one was asked for.
    pub unload: Option<String>,
}

fn age(now: Moment, at: Moment) -> u64 {
    now.since(at).as_secs()
}

fn push_bounded<T>(ring: &mut VecDeque<T>, item: T, bound: usize) {
    if ring.len() == bound {
        ring.pop_front();
    }
    ring.push_back(item);
}

impl History {
    fn with<R>(&self, f: impl FnOnce(&mut Rings) -> R) -> R {
        let mut guard = match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(&mut guard)
    }

    /// A successful capacity sample of `resource`.
    pub fn sample(&self, resource: &str, sample: &CapacitySample) {
        let at = sample.taken_at;
        let bucket = at.since(Moment::ZERO).as_secs() / BUCKET.as_secs();
        self.with(|rings| {
            let points = match rings.resources.iter().position(|(n, _)| n == resource) {
                Some(i) => &mut rings.resources[i].1,
                None => {
                    rings
                        .resources
                        .push((resource.to_owned(), VecDeque::with_capacity(MAX_POINTS)));
                    let last = rings.resources.len() - 1;
                    &mut rings.resources[last].1
                }
            };
            match points.back_mut() {
                Some(p) if p.bucket == bucket => {
                    if at >= p.at {
                        p.at = at;
                        p.free_mib = sample.free_mib;
                        p.total_mib = sample.total_mib;
                    }
                    p.min_free_mib = p.min_free_mib.min(sample.free_mib);
                }
                Some(p) if p.bucket > bucket => {} // an old sample landing late
                _ => push_bounded(
                    points,
                    Point {
                        bucket,
                        at,
                        free_mib: sample.free_mib,
                        min_free_mib: sample.free_mib,
                        total_mib: sample.total_mib,
                    },
                    MAX_POINTS,
                ),
            }
            while points.front().is_some_and(|p| at.since(p.at) > WINDOW) {
                points.pop_front();
            }
        });
    }

    /// A job admitted.
    pub fn job_started(&self, reservation: &Reservation) {
        let job = Job {
            entry: reservation.id,
            upstream: reservation.upstream.clone(),
            resources: reservation
                .charges
                .iter()
                .map(|c| c.resource.clone())
                .collect(),
            started: reservation.admitted_at,
            ended: None,
        };
        self.with(|rings| push_bounded(&mut rings.jobs, job, MAX_JOBS));
    }

    /// A job released at `now`: its resources are free again.
    pub fn job_ended(&self, entry: EntryId, now: Moment) {
        self.with(|rings| {
            if let Some(job) = rings.jobs.iter_mut().rev().find(|j| j.entry == entry) {
                job.ended.get_or_insert(now);
            }
        });
    }

    /// A reclaim started.
    pub fn reclaim_started(
        &self,
        id: &str,
        upstream: &str,
        trigger: String,
        trigger_kind: &'static str,
        mode: &'static str,
        now: Moment,
    ) {
        let r = Reclaim {
            id: id.to_owned(),
            upstream: upstream.to_owned(),
            trigger,
            trigger_kind,
            mode,
            started: now,
            ended: None,
            outcome: None,
            closed: Vec::new(),
            cancelled: Vec::new(),
            cancel_failed: Vec::new(),
            unload: None,
        };
        self.with(|rings| push_bounded(&mut rings.reclaims, r, MAX_RECLAIMS));
    }

    fn reclaim(&self, id: &str, f: impl FnOnce(&mut Reclaim)) {
        self.with(|rings| {
            if let Some(r) = rings.reclaims.iter_mut().rev().find(|r| r.id == id) {
                f(r);
            }
        });
    }

    /// A reclaim closed `entry`'s proxied response.
    pub fn reclaim_closed(&self, id: &str, entry: EntryId) {
        self.reclaim(id, |r| add_bounded(&mut r.closed, entry));
    }

    /// A reclaim cancelled `entry` at the upstream (stopped or asked to stop).
    pub fn reclaim_cancelled(&self, id: &str, entry: EntryId) {
        self.reclaim(id, |r| add_bounded(&mut r.cancelled, entry));
    }

    /// A reclaim's cancellation of `entry` failed.
    pub fn reclaim_cancel_failed(&self, id: &str, entry: EntryId) {
        self.reclaim(id, |r| add_bounded(&mut r.cancel_failed, entry));
    }

    /// What a reclaim's unload did.
    pub fn reclaim_unload(&self, id: &str, what: impl Into<String>) {
        let what = what.into();
        self.reclaim(id, |r| r.unload = Some(what));
    }

    /// A reclaim ended with `outcome` (`stood_down`, `finished`, `acted`).
    pub fn reclaim_ended(&self, id: &str, outcome: &'static str, now: Moment) {
        self.reclaim(id, |r| {
            r.outcome = Some(outcome);
            r.ended = Some(now);
        });
    }

    /// A reclaim's trigger kind and mode, for counting its end.
    pub fn reclaim_labels(&self, id: &str) -> Option<(&'static str, &'static str)> {
        self.with(|rings| {
            rings
                .reclaims
                .iter()
                .rev()
                .find(|r| r.id == id)
                .map(|r| (r.trigger_kind, r.mode))
        })
    }

    /// The memory chart's data at `now`.
    pub fn snapshot(&self, now: Moment) -> HistorySnapshot {
        self.with(|rings| HistorySnapshot {
            window_s: WINDOW.as_secs(),
            bucket_s: BUCKET.as_secs(),
            resources: rings
                .resources
                .iter()
                .map(|(name, points)| ResourceHistory {
                    name: name.clone(),
                    points: points
                        .iter()
                        .filter(|p| now.since(p.at) <= WINDOW)
                        .map(|p| MemoryPoint {
                            age_s: age(now, p.at),
                            free_mib: p.free_mib,
                            min_free_mib: p.min_free_mib,
                            total_mib: p.total_mib,
                        })
                        .collect(),
                })
                .collect(),
            jobs: rings
                .jobs
                .iter()
                .filter(|j| j.ended.is_none_or(|e| now.since(e) <= WINDOW))
                .map(|j| JobMark {
                    entry: j.entry.to_string(),
                    upstream: j.upstream.clone(),
                    resources: j.resources.clone(),
                    started_age_s: age(now, j.started),
                    ended_age_s: j.ended.map(|e| age(now, e)),
                })
                .collect(),
        })
    }

    /// The recent reclaims at `now`, newest first.
    pub fn reclaims(&self, now: Moment) -> Vec<ReclaimLogEntry> {
        self.with(|rings| {
            rings
                .reclaims
                .iter()
                .rev()
                .map(|r| ReclaimLogEntry {
                    id: r.id.clone(),
                    upstream: r.upstream.clone(),
                    trigger: r.trigger.clone(),
                    trigger_kind: r.trigger_kind,
                    mode: r.mode,
                    started_age_s: age(now, r.started),
                    elapsed_s: r.ended.map(|e| e.since(r.started).as_secs()),
                    outcome: r.outcome,
                    closed: r.closed.clone(),
                    cancelled: r.cancelled.clone(),
                    cancel_failed: r.cancel_failed.clone(),
                    unload: r.unload.clone(),
                })
                .collect()
        })
    }
}

fn add_bounded(list: &mut Vec<String>, entry: EntryId) {
    let id = entry.to_string();
    if list.len() < MAX_ENTRIES_PER_RECLAIM && !list.contains(&id) {
        list.push(id);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn at(s: u64) -> Moment {
        Moment::ZERO.after(Duration::from_secs(s))
    }

    #[test]
    fn the_memory_ring_keeps_an_hour_of_ten_second_points_and_their_lowest_sample() {
        let h = History::default();
        // Two hours of samples every second: the ring stays at one hour.
        for s in 0..7200 {
            let free = if s % 10 == 3 { 100 } else { 5000 };
            h.sample("gpu0", &CapacitySample::memory(free, 8000, at(s)));
        }
        let snap = h.snapshot(at(7199));
        let points = &snap.resources[0].points;
        assert!(points.len() <= MAX_POINTS, "{}", points.len());
        assert!(points.len() >= MAX_POINTS - 1, "{}", points.len());
        assert!(points.iter().all(|p| p.age_s <= 3600));
        // The dip inside each bucket is kept even though the last sample is high.
        assert!(
            points
                .iter()
                .all(|p| p.min_free_mib == 100 && p.free_mib == 5000)
        );
    }

    #[test]
    fn job_marks_are_bounded_and_end_on_release() {
        let h = History::default();
        let mut ids = Vec::new();
        for s in 0..(MAX_JOBS as u64 + 10) {
            let r = Reservation {
                id: EntryId::random(),
                upstream: "llama".into(),
                model: None,
                charges: vec![crate::engine::Charge {
                    resource: "gpu0".into(),
                    required_mib: 1,
                    free_mib: 1,
                }],
                resident_credit: false,
                admitted_at: at(s),
                completion: crate::engine::CompletionMethod::ResponseEnd,
                upstream_ref: None,
                borrower: None,
            };
            ids.push(r.id);
            h.job_started(&r);
        }
        let last = *ids.last().unwrap();
        h.job_ended(last, at(300));
        let snap = h.snapshot(at(300));
        assert_eq!(snap.jobs.len(), MAX_JOBS);
        let mark = snap.jobs.last().unwrap();
        assert_eq!(mark.entry, last.to_string());
        assert_eq!(mark.ended_age_s, Some(0));
        assert!(snap.jobs[0].ended_age_s.is_none());
    }

    #[test]
    fn the_reclaim_log_keeps_the_newest_and_what_each_did() {
        let h = History::default();
        for n in 0..(MAX_RECLAIMS + 5) {
            h.reclaim_started(
                &format!("reclaim-{n}"),
                "llama",
                "owner return: present".into(),
                "owner_return",
                "drain",
                at(n as u64),
            );
        }
        let e = EntryId::random();
        let newest = format!("reclaim-{}", MAX_RECLAIMS + 4);
        h.reclaim_closed(&newest, e);
        h.reclaim_unload(&newest, "unloaded");
        h.reclaim_ended(&newest, "acted", at(100));
        let log = h.reclaims(at(100));
        assert_eq!(log.len(), MAX_RECLAIMS);
        assert_eq!(log[0].id, newest);
        assert_eq!(log[0].outcome, Some("acted"));
        assert_eq!(log[0].closed, vec![e.to_string()]);
        assert_eq!(log[0].unload.as_deref(), Some("unloaded"));
        assert_eq!(h.reclaim_labels(&newest), Some(("owner_return", "drain")));
        assert!(log[1].outcome.is_none());
    }
}
