//! The named borrowers' metrics (issue 34), set from the engine's status at
//! scrape time. Labels carry only names the keys file configured (and
//! `(anonymous)`), so their number is bounded by the owner; a name gone from
//! the table and done with its jobs is dropped from every family.

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::engine::BorrowerStatus;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BorrowerLabel {
    borrower: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    borrower: String,
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    borrower: String,
    code: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabels {
    borrower: String,
    kind: &'static str,
    period: &'static str,
}

/// The families, registered once.
#[derive(Debug, Default)]
pub(crate) struct BorrowerMetrics {
    jobs: Family<BorrowerLabel, Counter>,
    reserved: Family<KindLabels, Counter<f64, AtomicU64>>,
    refusals: Family<CodeLabels, Counter>,
    running: Family<BorrowerLabel, Gauge>,
    waiting: Family<BorrowerLabel, Gauge>,
    held: Family<BorrowerLabel, Gauge>,
    budget_left: Family<BudgetLabels, Gauge<f64, AtomicU64>>,
    /// The names last exported, to drop those that went.
    shown: std::sync::Mutex<HashSet<String>>,
}

const KINDS: [&str; 3] = ["gpu", "memory", "cpu"];

impl BorrowerMetrics {
    /// Register every family in `r`.
    pub(crate) fn register(r: &mut Registry) -> Self {
        let m = BorrowerMetrics::default();
        r.register(
            "vacancyd_borrower_jobs",
            "Jobs admitted per named borrower since the daemon started (issue 34)",
            m.jobs.clone(),
        );
        r.register(
            "vacancyd_borrower_reserved_seconds",
            "Reservation time of a borrower's finished jobs per resource kind: one second of one resource held from admission to release",
            m.reserved.clone(),
        );
        r.register(
            "vacancyd_borrower_refusals",
            "Refusals of a borrower's requests by code",
            m.refusals.clone(),
        );
        r.register(
            "vacancyd_borrower_running",
            "A borrower's jobs now, held ones included",
            m.running.clone(),
        );
        r.register(
            "vacancyd_borrower_waiting",
            "A borrower's requests waiting in line now",
            m.waiting.clone(),
        );
        r.register(
            "vacancyd_borrower_held",
            "A borrower's held entries now",
            m.held.clone(),
        );
        r.register(
            "vacancyd_borrower_budget_left_seconds",
            "What a borrower's budget has left in its current period, by kind and period",
            m.budget_left.clone(),
        );
        m
    }

    /// Bring every family to `borrowers`: counters grow by what the engine
    /// counted since the last scrape; gauges are set.
    pub(crate) fn set(&self, borrowers: &[BorrowerStatus]) {
        let mut shown = match self.shown.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let now: HashSet<String> = borrowers.iter().map(|b| b.name.clone()).collect();
        for gone in shown.difference(&now) {
            self.forget(gone);
        }
        *shown = now;
        drop(shown);
        for b in borrowers {
            let who = BorrowerLabel {
                borrower: b.name.clone(),
            };
            let jobs = self.jobs.get_or_create(&who);
            jobs.inc_by(b.totals.jobs.saturating_sub(jobs.get()));
            let times = [
                b.totals.reserved.gpu,
                b.totals.reserved.memory,
                b.totals.reserved.cpu,
            ];
            for (kind, d) in KINDS.into_iter().zip(times) {
                let c = self.reserved.get_or_create(&KindLabels {
                    borrower: b.name.clone(),
                    kind,
                });
                let more = d.as_secs_f64() - c.get();
                if more > 0.0 {
                    c.inc_by(more);
                }
            }
            for (&code, &n) in &b.totals.refusals {
                let c = self.refusals.get_or_create(&CodeLabels {
                    borrower: b.name.clone(),
                    code,
                });
                c.inc_by(n.saturating_sub(c.get()));
            }
            self.running.get_or_create(&who).set(i64::from(b.running));
            self.waiting.get_or_create(&who).set(i64::from(b.waiting));
            self.held.get_or_create(&who).set(i64::from(b.held));
            for budget in &b.budgets {
                self.budget_left
                    .get_or_create(&BudgetLabels {
                        borrower: b.name.clone(),
                        kind: budget.kind.as_str(),
                        period: budget.period.as_str(),
                    })
                    .set(budget.left.as_secs_f64());
            }
        }
    }

    /// Drop every series of `name`.
    fn forget(&self, name: &str) {
        let who = BorrowerLabel {
            borrower: name.to_owned(),
        };
        self.jobs.remove(&who);
        self.running.remove(&who);
        self.waiting.remove(&who);
        self.held.remove(&who);
        for kind in KINDS {
            self.reserved.remove(&KindLabels {
                borrower: name.to_owned(),
                kind,
            });
            for period in ["day", "week"] {
                self.budget_left.remove(&BudgetLabels {
                    borrower: name.to_owned(),
                    kind,
                    period,
                });
            }
        }
        for code in crate::engine::RefusalCode::ALL {
            self.refusals.remove(&CodeLabels {
                borrower: name.to_owned(),
                code: code.as_str(),
            });
        }
    }
}
