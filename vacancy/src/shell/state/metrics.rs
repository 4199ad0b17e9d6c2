//! Prometheus metrics of the daemon (`/metrics`, docs/operator-guide.md#see-what-it-is-doing), kept with the
//! `prometheus-client` crate and exposed in the Prometheus text format 0.0.4.
//!
//! Counters and histograms are updated where things happen (admission, the
//! proxy's request path, sampling, observation, reclaims); gauges are set from
//! the engine's status at scrape time, so they never drift from `/status`.
//! Names follow Prometheus conventions: `_total` for counters, base units
//! (`_seconds`, `_bytes`). Five of the six original names
//! (`vacancyd_admissions_total`, `vacancyd_refusals_total`, `vacancyd_work_active`,
//! `vacancyd_yields_total`, `vacancyd_upstream_owner_veto_exempt`) are a
//! contract and keep their names; the sixth, `vacancyd_resource_free_mib`, the
//! one not in base units, is `vacancyd_resource_free_bytes` now and keeps its
//! old name for one release, marked deprecated in its HELP (issue 30).

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::engine::{EngineStatus, RefusalCode};
use crate::shell::state::worker_histogram::WorkerHistogram;
use crate::traits::RouteClass;

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabel {
    upstream: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    upstream: String,
    code: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    upstream: String,
    route_class: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    upstream: String,
    route_class: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabel {
    resource: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TermLabels {
    term: &'static str,
    resource: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkLabels {
    upstream: String,
    phase: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReclaimLabels {
    upstream: String,
    trigger: &'static str,
    mode: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CancelLabels {
    upstream: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuthLabels {
    scope: &'static str,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Histogram buckets, in seconds.
#[derive(Clone)]
struct Buckets(&'static [f64]);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

impl MetricConstructor<WorkerHistogram> for Buckets {
    fn new_metric(&self) -> WorkerHistogram {
        WorkerHistogram::new(self.0)
    }
}

/// A whole borrower request, up to the response head: from well under a
/// millisecond (a refusal) to a minute (a slow first token).
const REQUEST_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];
/// vacancyd's own time: microseconds for a refusal, one fsync for an
/// admission, up to ADM-06's 4 s wait for a post-job sample.
const ADDED_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 4.0,
    10.0,
];
/// One wait in line (up to `max_wait_s`, at most an hour).
const LINE_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
];
/// One durable record write (about one fsync).
const PERSIST_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];
/// One capacity sample (a file read, sysinfo, NVML, sysfs).
const SAMPLE_BUCKETS: &[f64] = &[
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 10.0,
];

/// How many route classes there are ([`ClassKey`]).
const ROUTE_CLASSES: usize = 5;
/// How many request outcomes there are ([`RequestOutcome`]).
const OUTCOMES: usize = 4;

/// One upstream's per-request series, each taken from its family at its
/// first use and kept: a request is counted and timed with one atomic load
/// a series, without the registry's lock or a hash of its labels (issue 31:
/// looking them up by name was about 600 instructions of a proxied read).
/// A series still appears at its first use, as the family's own would.
///
/// Kept with its upstream's route ([`UpstreamRoute`](crate::shell::upstream::route::UpstreamRoute)),
/// and tied to the first [`Metrics`] it counts in: a route is served by one
/// daemon, whose one registry it counts in.
#[derive(Debug, Default)]
pub struct RouteSeries {
    answers: [[OnceLock<Counter>; OUTCOMES]; ROUTE_CLASSES],
    admissions: OnceLock<Counter>,
    refusals: [OnceLock<Counter>; RefusalCode::ALL.len()],
    requests: [OnceLock<(WorkerHistogram, WorkerHistogram)>; ROUTE_CLASSES],
}

/// A route class as the metrics know it: its label, and its place among
/// the classes for a [`RouteSeries`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassKey {
    index: usize,
    label: &'static str,
}

impl From<&RouteClass> for ClassKey {
    fn from(class: &RouteClass) -> Self {
        let index = match class {
            RouteClass::Work(_) => 0,
            RouteClass::BorrowerRead => 1,
            RouteClass::Discovery => 2,
            RouteClass::Management => 3,
            RouteClass::Unknown => 4,
        };
        ClassKey {
            index,
            label: class.label(),
        }
    }
}

/// The series `slot` keeps: `family`'s series for `labels`, taken from it
/// at the first use and kept, so later uses neither lock nor hash.
fn kept<'a, L, M>(slot: &'a OnceLock<M>, family: &Family<L, M>, labels: impl FnOnce() -> L) -> &'a M
where
    L: Clone + std::hash::Hash + Eq,
    M: Clone + Default,
{
    slot.get_or_init(|| family.get_or_create_owned(&labels()))
}

/// What a scrape needs besides the engine's status.
#[derive(Debug, Clone, Default)]
pub struct ScrapeFacts {
    /// Per upstream, whether its server answered the last check (`None`: not yet checked).
    pub reachable: Vec<(String, Option<bool>)>,
    /// The GPUs whose pressure is measured (`[owner.gpu_pressure]` enabled).
    pub pressure_gpus: Vec<String>,
}

/// The daemon's metrics registry and the handles that update it.
pub struct Metrics {
    registry: Registry,
    admissions: Family<UpstreamLabel, Counter>,
    refusals: Family<RefusalLabels, Counter>,
    answers: Family<OutcomeLabels, Counter>,
    yields: Family<UpstreamLabel, Counter>,
    /// Counted on every proxied request, by each worker in its own copy.
    request_duration: Family<RouteLabels, WorkerHistogram, Buckets>,
    added: Family<RouteLabels, WorkerHistogram, Buckets>,
    /// Counted by each worker in its own copy, as the phases are.
    persist: WorkerHistogram,
    /// Counted by each worker in its own copy: a refused work request
    /// observes one phase, an admitted one up to eight, and the library's
    /// histogram took a lock each time (about 140 ns of a refusal, by perf
    /// on the 2-core VM; issue 31).
    phases: Family<PhaseLabel, WorkerHistogram, Buckets>,
    /// Each phase's histogram in `phases`, kept from its first use: a work
    /// request observes up to eight phases, each then without the family's
    /// lock and a hash of its label (issue 31). The series still appears at
    /// its first observation, as before.
    phase_handles: [OnceLock<WorkerHistogram>; RequestPhase::COUNT],
    sample_duration: Family<ResourceLabel, Histogram, Buckets>,
    sample_failures: Family<ResourceLabel, Counter>,
    observation_failures: Family<UpstreamLabel, Counter>,
    reclaims: Family<ReclaimLabels, Counter>,
    cancellations: Family<CancelLabels, Counter>,
    work_active: Family<WorkLabels, Gauge>,
    held: Gauge,
    free_bytes: Family<ResourceLabel, Gauge>,
    /// Deprecated: `free_bytes` in MiB, kept for one release.
    free_mib: Family<ResourceLabel, Gauge>,
    awaiting_sample: Family<ResourceLabel, Gauge>,
    exempt: Family<UpstreamLabel, Gauge>,
    presence: Family<StateLabel, Gauge>,
    lending: Gauge,
    pressure_refusing: Family<ResourceLabel, Gauge>,
    reachable: Family<UpstreamLabel, Gauge>,
    line_waiting: Family<UpstreamLabel, Gauge>,
    line_waits: Family<CancelLabels, Histogram, Buckets>,
    term_refusing: Family<TermLabels, Gauge>,
    hours_open: Gauge,
    hours_next_change: Gauge,
    power_source: Family<SourceLabel, Gauge>,
    gpu_temperature: Family<ResourceLabel, Gauge>,
    gpu_power: Family<ResourceLabel, Gauge>,
    gpu_fan: Family<ResourceLabel, Gauge>,
    power_cap: Family<ResourceLabel, Gauge>,
    auth_failures: Family<AuthLabels, Counter>,
    control_shed: Family<ReasonLabel, Counter>,
    proxy_cpu_yields: Counter,
    /// Named borrowers' use (issue 34).
    borrowers: super::borrower_metrics::BorrowerMetrics,
    /// Scrapes set gauges and then encode: one at a time.
    scrape: Mutex<()>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    // Long: it registers every metric family in the order /metrics lists them; one list reads better than pieces of it.
    fn default() -> Self {
        let mut registry = Registry::default();
        let admissions = Family::default();
        let refusals = Family::default();
        let answers = Family::default();
        let yields = Family::default();
        let request_duration = Family::new_with_constructor(Buckets(REQUEST_BUCKETS));
        let added = Family::new_with_constructor(Buckets(ADDED_BUCKETS));
        let persist = WorkerHistogram::new(PERSIST_BUCKETS);
        let phases = Family::new_with_constructor(Buckets(ADDED_BUCKETS));
        let sample_duration = Family::new_with_constructor(Buckets(SAMPLE_BUCKETS));
        let sample_failures = Family::default();
        let observation_failures = Family::default();
        let reclaims = Family::default();
        let cancellations = Family::default();
        let work_active = Family::default();
        let held = Gauge::default();
        let free_bytes = Family::default();
        let free_mib = Family::default();
        let awaiting_sample = Family::default();
        let exempt = Family::default();
        let presence = Family::default();
        let lending = Gauge::default();
        let pressure_refusing = Family::default();
        let reachable = Family::default();
        let line_waiting = Family::default();
        let line_waits = Family::new_with_constructor(Buckets(LINE_BUCKETS));
        let term_refusing = Family::default();
        let hours_open = Gauge::default();
        let hours_next_change = Gauge::default();
        let power_source = Family::default();
        let gpu_temperature = Family::default();
        let gpu_power = Family::default();
        let gpu_fan = Family::default();
        let power_cap = Family::default();
        let auth_failures = Family::default();
        let control_shed = Family::default();
        let proxy_cpu_yields = Counter::default();
        let r = &mut registry;
        r.register(
            "vacancyd_admissions",
            "Borrowed requests admitted",
            admissions.clone(),
        );
        r.register(
            "vacancyd_refusals",
            "Borrowed requests refused, by code",
            refusals.clone(),
        );
        r.register(
            "vacancyd_requests",
            "Borrower requests, each counted once when its answer is final, by upstream, route class and outcome (admitted, refused, forwarded: a read the upstream answered; gone: the borrower left before an answer)",
            answers.clone(),
        );
        r.register(
            "vacancyd_yields",
            "Unload acknowledgements (not recovered memory, OBS-04)",
            yields.clone(),
        );
        r.register(
            "vacancyd_request_duration_seconds",
            "Borrower requests from arrival to the response head, by upstream and route class",
            request_duration.clone(),
        );
        r.register(
            "vacancyd_added_seconds",
            "vacancyd's own time per request to the response head: all of it but the upstream's (from the connection made, or the pooled request sent, to its response head): inspection, admission with any wait, the ledger write, connecting, relaying the head; all of a refusal. What vacancy-overhead-ms says",
            added.clone(),
        );
        r.register(
            "vacancyd_ledger_persist_duration_seconds",
            "Durable reservation writes before forwarding (REC-01)",
            persist.clone(),
        );
        r.register(
            "vacancyd_request_phase_seconds",
            "Where an admitted request's time goes, by phase: inspect (from the request's arrival: reading and inspecting the body), admit (the engine's decision), post_job_sample (waiting for the sample after the last job, ADM-06), persist (the durable record, REC-01), connect, upstream (to the response head), first_chunk (the head to the first body byte relayed) and relay (the head to the upstream's last byte)",
            phases.clone(),
        );
        r.register(
            "vacancyd_sample_duration_seconds",
            "Capacity samples, by resource",
            sample_duration.clone(),
        );
        r.register(
            "vacancyd_sample_failures",
            "Capacity samples that failed or did not answer, by resource",
            sample_failures.clone(),
        );
        r.register(
            "vacancyd_observation_failures",
            "Upstream model observations that failed, by upstream",
            observation_failures.clone(),
        );
        r.register(
            "vacancyd_reclaims",
            "Reclaims ended, by trigger (owner_return, pressure, lending_hours, battery, heat), mode and outcome (stood_down, finished, acted)",
            reclaims.clone(),
        );
        r.register(
            "vacancyd_cancellations",
            "Borrowed work cancelled by reclaims, by outcome (closed, stopped, requested, failed, left_running)",
            cancellations.clone(),
        );
        r.register(
            "vacancyd_work_active",
            "Work entries by phase",
            work_active.clone(),
        );
        r.register(
            "vacancyd_held_entries",
            "Work entries held: completion is uncertain and needs an administrator (HELD-02)",
            held.clone(),
        );
        r.register(
            "vacancyd_resource_free_bytes",
            "Free bytes in the last good sample",
            free_bytes.clone(),
        );
        r.register(
            "vacancyd_resource_free_mib",
            "DEPRECATED: use vacancyd_resource_free_bytes; this name goes in the next release. Free MiB in the last good sample",
            free_mib.clone(),
        );
        r.register(
            "vacancyd_resource_awaiting_fresh_sample",
            "1 while a resource waits for a capacity sample taken after its last job (ADM-04)",
            awaiting_sample.clone(),
        );
        r.register(
            "vacancyd_upstream_owner_veto_exempt",
            "1 for upstreams exempt from owner presence",
            exempt.clone(),
        );
        r.register(
            "vacancyd_owner_presence",
            "1 for the owner presence the backend last reported (present, away, unknown)",
            presence.clone(),
        );
        r.register(
            "vacancyd_lending",
            "The lending switch (1 on, 0 paused)",
            lending.clone(),
        );
        r.register(
            "vacancyd_gpu_pressure_refusing",
            "1 while a GPU's pressure refuses new work (engaged, uncalibrated or unavailable)",
            pressure_refusing.clone(),
        );
        r.register(
            "vacancyd_upstream_reachable",
            "1 when the upstream's server answered the last check",
            reachable.clone(),
        );
        r.register(
            "vacancyd_line_waiting",
            "Requests waiting in an upstream's wait line ([upstream.queue])",
            line_waiting.clone(),
        );
        r.register(
            "vacancyd_line_wait_seconds",
            "Time requests waited in line, by upstream and outcome (admitted, timed_out: still busy at max_wait_s, refused: the owner, pressure or a switch answered)",
            line_waits.clone(),
        );
        r.register(
            "vacancyd_term_refusing",
            "1 while one of the owner's terms refuses new work (term: lending_hours, battery, heat; resource: the GPU of a heat term), 0 while it is in force and admits",
            term_refusing.clone(),
        );
        r.register(
            "vacancyd_lending_window_open",
            "1 inside the owner's lending hours ([lending] hours), 0 outside; always 1 without lending hours",
            hours_open.clone(),
        );
        r.register(
            "vacancyd_lending_window_next_change_seconds",
            "Seconds to the lending hours' next opening or closing; 0 without lending hours",
            hours_next_change.clone(),
        );
        r.register(
            "vacancyd_power_source",
            "1 for what the machine runs on (mains, battery, unknown) with on_battery = \"pause\"",
            power_source.clone(),
        );
        r.register(
            "vacancyd_gpu_temperature_celsius",
            "A GPU's temperature in its last sample (GPUs with heat limits)",
            gpu_temperature.clone(),
        );
        r.register(
            "vacancyd_gpu_power_watts",
            "A GPU's power draw in its last sample (GPUs with a power limit)",
            gpu_power.clone(),
        );
        r.register(
            "vacancyd_gpu_fan_percent",
            "A GPU's fan speed in its last sample (GPUs with a fan limit)",
            gpu_fan.clone(),
        );
        r.register(
            "vacancyd_gpu_power_cap_watts",
            "The power limit vacancyd set while borrowed work runs (power_cap_w), 0 while the GPU's own limit is in force",
            power_cap.clone(),
        );
        r.register(
            "vacancyd_auth_failures",
            "Control-plane calls refused for their token, by the scope the call needed (read, owner, admin) and reason (wrong_token, missing_token, insufficient_scope)",
            auth_failures.clone(),
        );
        r.register(
            "vacancyd_control_connections_shed",
            "Control connections closed or limited to make room, by reason (evicted_idle: an idle or slow connection closed for a newer one; to_reserve: a newcomer served health checks only; evicted_reserve: a reserve connection that had sent nothing closed for a newer one; refused: closed at once)",
            control_shed.clone(),
        );
        r.register(
            "vacancyd_proxy_cpu_yields",
            "Times a proxy worker thread ran 500 us without going idle and yielded its CPU once, so that a thread waiting beside it (a client, the upstream, the owner's own) ran: how often the proxy met a CPU it had to share",
            proxy_cpu_yields.clone(),
        );
        let borrowers = super::borrower_metrics::BorrowerMetrics::register(r);
        Metrics {
            registry,
            borrowers,
            admissions,
            refusals,
            answers,
            yields,
            request_duration,
            added,
            persist,
            phases,
            phase_handles: Default::default(),
            sample_duration,
            sample_failures,
            observation_failures,
            reclaims,
            cancellations,
            work_active,
            held,
            free_bytes,
            free_mib,
            awaiting_sample,
            exempt,
            presence,
            lending,
            pressure_refusing,
            reachable,
            line_waiting,
            line_waits,
            term_refusing,
            hours_open,
            hours_next_change,
            power_source,
            gpu_temperature,
            gpu_power,
            gpu_fan,
            power_cap,
            auth_failures,
            control_shed,
            proxy_cpu_yields,
            scrape: Mutex::new(()),
        }
    }
}

/// The label value of a reclaim's trigger.
pub fn trigger_label(trigger: &crate::engine::ReclaimTrigger) -> &'static str {
    match trigger {
        crate::engine::ReclaimTrigger::OwnerReturn { .. } => "owner_return",
        crate::engine::ReclaimTrigger::Pressure { .. } => "pressure",
        crate::engine::ReclaimTrigger::LendingHours { .. } => "lending_hours",
        crate::engine::ReclaimTrigger::Battery { .. } => "battery",
        crate::engine::ReclaimTrigger::Heat { .. } => "heat",
    }
}

impl Metrics {
    /// One borrower request's final answer: `vacancyd_requests_total`, and
    /// an admission or a refusal by its code. Called once per request, by
    /// the request path's [`Arrival`](crate::shell::proxy::arrival::Arrival),
    /// with its upstream's `series`.
    pub fn answered(
        &self,
        series: &RouteSeries,
        upstream: &str,
        class: ClassKey,
        outcome: RequestOutcome,
    ) {
        kept(
            &series.answers[class.index][outcome.index()],
            &self.answers,
            || OutcomeLabels {
                upstream: upstream.to_owned(),
                route_class: class.label,
                outcome: outcome.label(),
            },
        )
        .inc();
        match outcome {
            RequestOutcome::Admitted => {
                kept(&series.admissions, &self.admissions, || UpstreamLabel {
                    upstream: upstream.to_owned(),
                })
                .inc();
            }
            RequestOutcome::Refused(code) => {
                kept(&series.refusals[code as usize], &self.refusals, || {
                    RefusalLabels {
                        upstream: upstream.to_owned(),
                        code: code.as_str(),
                    }
                })
                .inc();
            }
            RequestOutcome::Forwarded | RequestOutcome::Gone => {}
        }
    }

    /// One acknowledged unload on `upstream` (OBS-04).
    pub fn yielded(&self, upstream: &str) {
        self.yields
            .get_or_create(&UpstreamLabel {
                upstream: upstream.to_owned(),
            })
            .inc();
    }

    /// One borrower request answered: `total` from arrival to the response
    /// head, `added` of it vacancyd's own (the `vacancy-overhead-ms` value).
    pub fn request(
        &self,
        series: &RouteSeries,
        upstream: &str,
        class: ClassKey,
        total: Duration,
        added: Duration,
    ) {
        let (duration, own) = series.requests[class.index].get_or_init(|| {
            let labels = RouteLabels {
                upstream: upstream.to_owned(),
                route_class: class.label,
            };
            (
                self.request_duration.get_or_create_owned(&labels),
                self.added.get_or_create_owned(&labels),
            )
        });
        duration.observe(total);
        own.observe(added);
    }

    /// A request that waited in line for `took`, and how it ended.
    pub fn line_wait(&self, upstream: &str, took: Duration, outcome: &'static str) {
        self.line_waits
            .get_or_create(&CancelLabels {
                upstream: upstream.to_owned(),
                outcome,
            })
            .observe(took.as_secs_f64());
    }

    /// One durable reservation write.
    pub fn persisted(&self, took: Duration) {
        self.persist.observe(took);
        self.phase(RequestPhase::Persist, took);
    }

    /// Time an admitted request spent in one phase.
    pub fn phase(&self, phase: RequestPhase, took: Duration) {
        let series = || {
            self.phases.get_or_create_owned(&PhaseLabel {
                phase: phase.label(),
            })
        };
        match self.phase_handles.get(phase as usize) {
            Some(handle) => handle.get_or_init(series).observe(took),
            // A phase past `COUNT` (see its test) is still counted.
            None => series().observe(took),
        }
    }

    /// One capacity sample of `resource`, successful or not.
    pub fn sampled(&self, resource: &str, took: Duration, failed: bool) {
        let labels = ResourceLabel {
            resource: resource.to_owned(),
        };
        self.sample_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        if failed {
            self.sample_failures.get_or_create(&labels).inc();
        } else {
            // Present at zero from the first sample on.
            let _ = self.sample_failures.get_or_create(&labels);
        }
    }

    /// One observation of `upstream`, failed or not.
    pub fn observed(&self, upstream: &str, failed: bool) {
        let counter = self.observation_failures.get_or_create(&UpstreamLabel {
            upstream: upstream.to_owned(),
        });
        if failed {
            counter.inc();
        }
    }

    /// One reclaim ended: `outcome` is `stood_down`, `finished` (the work
    /// ended by itself) or `acted` (cancellation or an unload went ahead).
    pub fn reclaim_ended(
        &self,
        upstream: &str,
        trigger: &'static str,
        mode: &'static str,
        outcome: &'static str,
    ) {
        self.reclaims
            .get_or_create(&ReclaimLabels {
                upstream: upstream.to_owned(),
                trigger,
                mode,
                outcome,
            })
            .inc();
    }

    /// One cancellation of borrowed work by a reclaim: `closed` (its proxied
    /// response), `stopped` (proven at the upstream), `requested` (asked,
    /// proof left to tracking) or `failed`.
    pub fn cancelled(&self, upstream: &str, outcome: &'static str) {
        self.cancellations
            .get_or_create(&CancelLabels {
                upstream: upstream.to_owned(),
                outcome,
            })
            .inc();
    }

    /// A GPU's power cap was lowered to `watts`, or restored (`None`).
    pub fn power_capped(&self, resource: &str, watts: Option<u32>) {
        self.power_cap
            .get_or_create(&ResourceLabel {
                resource: resource.to_owned(),
            })
            .set(i64::from(watts.unwrap_or(0)));
    }

    /// One control-plane call refused for its token: the scope it needed
    /// and why (`wrong_token`, `missing_token`, `insufficient_scope`).
    pub fn auth_failed(&self, scope: &'static str, reason: &'static str) {
        self.auth_failures
            .get_or_create(&AuthLabels { scope, reason })
            .inc();
    }

    /// The count of the proxy workers' CPU yields, for
    /// [`ProxyWorkers::start`](crate::shell::state::workers::ProxyWorkers::start)
    /// to count on: `vacancyd_proxy_cpu_yields_total`.
    pub fn proxy_cpu_yields(&self) -> Counter {
        self.proxy_cpu_yields.clone()
    }

    /// One control connection closed or limited to make room (`reason` as
    /// `vacancyd_control_connections_shed_total` lists them).
    pub fn control_shed(&self, reason: &'static str) {
        self.control_shed
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// The Prometheus text exposition, with gauges taken from `status`.
    pub fn render(&self, status: &EngineStatus) -> String {
        self.render_with(status, &ScrapeFacts::default())
    }

    /// [`render`](Self::render), with what only the daemon knows.
    pub fn render_with(&self, status: &EngineStatus, facts: &ScrapeFacts) -> String {
        let _one_at_a_time = match self.scrape.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        self.set_gauges(status, facts);
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }

    fn set_gauges(&self, status: &EngineStatus, facts: &ScrapeFacts) {
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.borrowers.set(&status.borrowers);
        for u in &status.upstreams {
            let upstream = UpstreamLabel {
                upstream: u.name.clone(),
            };
            // Present at zero for every upstream.
            let _ = self.admissions.get_or_create(&upstream);
            let _ = self.yields.get_or_create(&upstream);
            self.line_waiting
                .get_or_create(&upstream)
                .set(i64::from(u.line.waiting));
            self.exempt
                .get_or_create(&upstream)
                .set(i64::from(u.owner_scope == "resource"));
            for phase in ["forwarding", "tracking", "verifying", "held"] {
                let n = status
                    .work
                    .iter()
                    .filter(|w| w.upstream == u.name && w.phase.as_str() == phase)
                    .count();
                self.work_active
                    .get_or_create(&WorkLabels {
                        upstream: u.name.clone(),
                        phase,
                    })
                    .set(gauge(n as u64));
            }
        }
        let held = status
            .work
            .iter()
            .filter(|w| w.phase.as_str() == "held")
            .count();
        self.held.set(gauge(held as u64));
        for r in &status.resources {
            let labels = ResourceLabel {
                resource: r.name.clone(),
            };
            match r.free_mib {
                Some(free) => {
                    let bytes = free.saturating_mul(1024 * 1024);
                    self.free_bytes.get_or_create(&labels).set(gauge(bytes));
                    self.free_mib.get_or_create(&labels).set(gauge(free));
                }
                None => {
                    self.free_bytes.remove(&labels);
                    self.free_mib.remove(&labels);
                }
            }
            self.awaiting_sample
                .get_or_create(&labels)
                .set(i64::from(r.awaiting_fresh_sample));
            if facts.pressure_gpus.contains(&r.name) {
                self.pressure_refusing
                    .get_or_create(&labels)
                    .set(i64::from(r.pressure != "admits"));
            }
        }
        let current = status.owner.as_str();
        for state in ["present", "away", "unknown"] {
            self.presence
                .get_or_create(&StateLabel { state })
                .set(i64::from(state == current));
        }
        self.lending.set(i64::from(status.lending));
        self.set_term_gauges(status);
        for (name, reachable) in &facts.reachable {
            let labels = UpstreamLabel {
                upstream: name.clone(),
            };
            match reachable {
                Some(r) => {
                    self.reachable.get_or_create(&labels).set(i64::from(*r));
                }
                None => {
                    self.reachable.remove(&labels);
                }
            }
        }
    }
}

impl Metrics {
    /// The owner's terms (issue 35): each term's refusal, the lending hours,
    /// the power source, each limited GPU's readings.
    fn set_term_gauges(&self, status: &EngineStatus) {
        if !status.terms.iter().any(|t| t.term == "lending_hours") {
            // No lending hours: lending is open at all hours.
            self.hours_open.set(1);
            self.hours_next_change.set(0);
        }
        for t in &status.terms {
            self.term_refusing
                .get_or_create(&TermLabels {
                    term: t.term,
                    resource: t.resource.clone().unwrap_or_default(),
                })
                .set(i64::from(t.refusing));
            match t.term {
                "lending_hours" => {
                    self.hours_open.set(i64::from(t.state == "open"));
                    if let Some(next) = &t.next_change {
                        self.hours_next_change
                            .set(i64::try_from(next.in_s).unwrap_or(i64::MAX));
                    }
                }
                "battery" => {
                    for source in ["mains", "battery", "unknown"] {
                        self.power_source
                            .get_or_create(&SourceLabel { source })
                            .set(i64::from(source == t.state));
                    }
                }
                _ => {}
            }
        }
        for r in &status.resources {
            let Some(heat) = r.heat else { continue };
            let labels = ResourceLabel {
                resource: r.name.clone(),
            };
            for (family, value) in [
                (&self.gpu_temperature, heat.temperature_c),
                (&self.gpu_power, heat.power_w),
                (&self.gpu_fan, heat.fan_percent.map(u32::from)),
            ] {
                match value {
                    Some(v) => {
                        family.get_or_create(&labels).set(i64::from(v));
                    }
                    None => {
                        family.remove(&labels);
                    }
                }
            }
        }
    }
}

/// How a borrower request ended, as `vacancyd_requests_total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestOutcome {
    /// Its reservation was recorded and it was forwarded.
    Admitted,
    /// Refused with this code before anything was forwarded.
    Refused(RefusalCode),
    /// A request that needs no reservation, answered by the upstream.
    Forwarded,
    /// The borrower left before the request had an answer.
    Gone,
}

impl RequestOutcome {
    /// Its place among the outcomes, for a [`RouteSeries`].
    fn index(self) -> usize {
        match self {
            RequestOutcome::Admitted => 0,
            RequestOutcome::Refused(_) => 1,
            RequestOutcome::Forwarded => 2,
            RequestOutcome::Gone => 3,
        }
    }

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            RequestOutcome::Admitted => "admitted",
            RequestOutcome::Refused(_) => "refused",
            RequestOutcome::Forwarded => "forwarded",
            RequestOutcome::Gone => "gone",
        }
    }
}

/// The phases of an admitted request, in order (`vacancyd_request_phase_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestPhase {
    /// Reading and inspecting the body.
    Inspect,
    /// The engine's decision, without the post-job sample wait.
    Admit,
    /// Waiting for the capacity sample after the last job (ADM-06).
    PostJobSample,
    /// The durable record (REC-01).
    Persist,
    /// Connecting to the upstream.
    Connect,
    /// From the request sent to the upstream's response head.
    Upstream,
    /// From the upstream's response head to the first body byte relayed to
    /// the borrower: the hand-over to the borrower's connection and the head
    /// written (a stream's first chunk).
    FirstChunk,
    /// From the response head to the upstream's last byte.
    Relay,
}

impl RequestPhase {
    /// Every phase, in order: each indexes its histogram handle
    /// (`every_phase_has_its_own_handle`).
    const ALL: [RequestPhase; 8] = [
        Self::Inspect,
        Self::Admit,
        Self::PostJobSample,
        Self::Persist,
        Self::Connect,
        Self::Upstream,
        Self::FirstChunk,
        Self::Relay,
    ];
    /// How many phases there are.
    const COUNT: usize = Self::ALL.len();

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            RequestPhase::Inspect => "inspect",
            RequestPhase::Admit => "admit",
            RequestPhase::PostJobSample => "post_job_sample",
            RequestPhase::Persist => "persist",
            RequestPhase::Connect => "connect",
            RequestPhase::Upstream => "upstream",
            RequestPhase::FirstChunk => "first_chunk",
            RequestPhase::Relay => "relay",
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use super::*;
    use crate::engine::{
        Decision, Engine, EngineSpec, OwnerPresence, QueueSpec, ResourceSpec, UpstreamSpec,
        WorkRequest,
    };
    use crate::time::Moment;
    use crate::traits::resource::{CapacitySample, ResourceKind};

    /// The status of an engine with nothing configured: the scrape shows
    /// the series the tests count and nothing of the engine's own.
    fn no_upstreams() -> EngineStatus {
        Engine::new(EngineSpec {
            lending: true,
            resources: vec![],
            upstreams: vec![],
        })
        .unwrap()
        .status(Moment::from_millis(0))
    }

    #[test]
    fn every_phase_has_its_own_handle() {
        let mut seen = [false; RequestPhase::COUNT];
        for p in RequestPhase::ALL {
            let i = p as usize;
            assert!(i < RequestPhase::COUNT, "{p:?} is past COUNT");
            assert!(!seen[i], "{p:?} shares a handle");
            seen[i] = true;
        }
        // The last variant is in `ALL`, so none comes after it unlisted
        // (a variant past `COUNT` would still count, through the family).
        assert_eq!(RequestPhase::Relay as usize + 1, RequestPhase::COUNT);
    }

    #[test]
    fn a_phase_appears_at_its_first_observation_and_counts_each() {
        // Issue 31: the kept handle is the family's own series.
        let m = Metrics::default();
        let status = no_upstreams();
        let count =
            |phase: &str| format!("vacancyd_request_phase_seconds_count{{phase=\"{phase}\"}}");
        assert!(!m.render(&status).contains(&count("connect")));
        m.phase(RequestPhase::Connect, Duration::from_micros(5));
        m.phase(RequestPhase::Connect, Duration::from_micros(7));
        m.persisted(Duration::from_micros(70));
        let text = m.render(&status);
        assert!(text.contains(&format!("{} 2", count("connect"))), "{text}");
        assert!(text.contains(&format!("{} 1", count("persist"))), "{text}");
        assert!(!text.contains(&count("inspect")), "{text}");
    }

    #[test]
    fn every_refusal_code_has_its_own_series_slot() {
        // Issue 31: a route's refusal counters are indexed by the code.
        for (i, code) in RefusalCode::ALL.iter().enumerate() {
            assert_eq!(*code as usize, i, "{code:?} is not at its place in ALL");
        }
    }

    #[test]
    fn every_route_class_and_outcome_has_its_own_series_slot() {
        let classes = [
            RouteClass::BorrowerRead,
            RouteClass::Discovery,
            RouteClass::Management,
            RouteClass::Unknown,
        ]
        .map(|c| ClassKey::from(&c));
        let mut seen = [false; ROUTE_CLASSES];
        seen[0] = true; // RouteClass::Work, which needs a WorkRoute to build
        for c in classes {
            assert!(!seen[c.index], "{c:?} shares a slot");
            seen[c.index] = true;
        }
        let outcomes = [
            RequestOutcome::Admitted,
            RequestOutcome::Refused(RefusalCode::ResourceBusy),
            RequestOutcome::Forwarded,
            RequestOutcome::Gone,
        ];
        let mut seen = [false; OUTCOMES];
        for o in outcomes {
            assert!(!seen[o.index()], "{o:?} shares a slot");
            seen[o.index()] = true;
        }
    }

    #[test]
    fn a_routes_series_appear_at_their_first_use_and_count_into_the_family() {
        // Issue 31: the series a route keeps are the family's own, so a
        // route built again (a new RouteSeries) counts on in the same ones.
        let m = Metrics::default();
        let status = no_upstreams();
        let discovery = ClassKey::from(&RouteClass::Discovery);
        let answers = |outcome: &str| {
            format!(
                "vacancyd_requests_total{{upstream=\"llm\",route_class=\"discovery\",outcome=\"{outcome}\"}}"
            )
        };
        let (first, again) = (RouteSeries::default(), RouteSeries::default());
        assert!(!m.render(&status).contains(&answers("forwarded")));
        m.answered(&first, "llm", discovery, RequestOutcome::Forwarded);
        m.answered(&again, "llm", discovery, RequestOutcome::Forwarded);
        m.answered(
            &first,
            "llm",
            discovery,
            RequestOutcome::Refused(RefusalCode::LendingPaused),
        );
        m.request(
            &first,
            "llm",
            discovery,
            Duration::from_millis(2),
            Duration::from_micros(90),
        );
        let text = m.render(&status);
        assert!(
            text.contains(&format!("{} 2", answers("forwarded"))),
            "{text}"
        );
        assert!(
            text.contains(&format!("{} 1", answers("refused"))),
            "{text}"
        );
        assert!(!text.contains(&answers("gone")), "{text}");
        assert!(
            text.contains("vacancyd_refusals_total{upstream=\"llm\",code=\"lending_paused\"} 1"),
            "{text}"
        );
        assert!(
            !text.contains("code=\"resource_busy\""),
            "a code never refused has no series: {text}"
        );
        assert!(
            text.contains(
                "vacancyd_request_duration_seconds_count{upstream=\"llm\",route_class=\"discovery\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_wait_line_is_in_the_metrics() {
        // Issue 22 item 5: the line's length per upstream, and each wait by outcome.
        let mut llm = UpstreamSpec::new("llm", "gpu0", 1000);
        llm.queue = Some(QueueSpec {
            max_waiting: 4,
            max_wait: Duration::from_secs(30),
        });
        let mut e = Engine::new(EngineSpec {
            lending: true,
            resources: vec![ResourceSpec::new("gpu0", ResourceKind::Gpu, 1000)],
            upstreams: vec![llm],
        })
        .unwrap();
        e.set_owner(OwnerPresence::Away);
        let t = Moment::from_millis(10);
        e.record_sample("gpu0", CapacitySample::memory(9000, 9000, t))
            .unwrap();
        let up = e.upstream_id("llm").unwrap();
        assert!(matches!(
            e.admit(&WorkRequest::new(up, None, t), t),
            Decision::Admitted(_)
        ));
        for _ in 0..2 {
            assert!(matches!(
                e.admit(&WorkRequest::new(up, None, t), t),
                Decision::Wait { .. }
            ));
        }
        let m = Metrics::default();
        m.line_wait("llm", Duration::from_millis(1500), "admitted");
        let text = m.render(&e.status(t));
        assert!(
            text.contains("vacancyd_line_waiting{upstream=\"llm\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "vacancyd_line_wait_seconds_count{upstream=\"llm\",outcome=\"admitted\"} 1"
            ),
            "{text}"
        );
    }

    /// An engine lending `gpu0` (1000 MiB reserve) to one upstream, `llm`.
    fn llm_on_gpu0() -> Engine {
        Engine::new(EngineSpec {
            lending: true,
            resources: vec![ResourceSpec::new("gpu0", ResourceKind::Gpu, 1000)],
            upstreams: vec![UpstreamSpec::new("llm", "gpu0", 1000)],
        })
        .unwrap()
    }

    #[test]
    fn the_proxy_workers_cpu_yields_are_a_counter_that_follows_their_count() {
        let mut e = llm_on_gpu0();
        let status = e.status(Moment::from_millis(10));
        let m = Metrics::default();
        // The workers count on the handle (ProxyWorkers::start).
        let workers_count = m.proxy_cpu_yields();
        let scrape = |more| {
            workers_count.inc_by(more);
            m.render(&status)
        };
        assert!(scrape(0).contains("vacancyd_proxy_cpu_yields_total 0\n"));
        assert!(scrape(7).contains("vacancyd_proxy_cpu_yields_total 7\n"));
        assert!(scrape(0).contains("vacancyd_proxy_cpu_yields_total 7\n"));
        assert!(scrape(5).contains("vacancyd_proxy_cpu_yields_total 12\n"));
    }

    #[test]
    fn free_memory_is_in_bytes_and_the_mib_name_is_marked_deprecated() {
        // Issue 30 item 13: base units; the old name stays one release.
        let mut e = llm_on_gpu0();
        let t = Moment::from_millis(10);
        e.record_sample("gpu0", CapacitySample::memory(20_000, 24_000, t))
            .unwrap();
        let text = Metrics::default().render(&e.status(t));
        assert!(
            text.contains("vacancyd_resource_free_bytes{resource=\"gpu0\"} 20971520000"),
            "{text}"
        );
        assert!(
            text.contains("vacancyd_resource_free_mib{resource=\"gpu0\"} 20000"),
            "{text}"
        );
        let help = text
            .lines()
            .find(|l| l.starts_with("# HELP vacancyd_resource_free_mib "))
            .unwrap();
        assert!(
            help.contains("DEPRECATED") && help.contains("vacancyd_resource_free_bytes"),
            "{help}"
        );
    }
}
