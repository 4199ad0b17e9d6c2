//! Prometheus counters and gauges of the proxy (DESIGN §4 `/metrics`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use crate::engine::{EngineStatus, RefusalCode};

/// Counters the proxy updates as it admits and refuses.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    admissions: BTreeMap<String, u64>,
    refusals: BTreeMap<String, BTreeMap<&'static str, u64>>,
    yields: BTreeMap<String, u64>,
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Counters) -> R) -> R {
        let mut guard = match self.inner.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    }

    /// One admission on `upstream`.
    pub fn admitted(&self, upstream: &str) {
        self.with(|c| match c.admissions.get_mut(upstream) {
            Some(n) => *n += 1,
            None => {
                c.admissions.insert(upstream.to_owned(), 1);
            }
        });
    }

    /// One refusal on `upstream` with `code`.
    pub fn refused(&self, upstream: &str, code: RefusalCode) {
        self.with(|c| {
            // Look up by reference first: refusals are the hot path, so no
            // allocation once an upstream has been seen.
            let codes = match c.refusals.get_mut(upstream) {
                Some(codes) => codes,
                None => c.refusals.entry(upstream.to_owned()).or_default(),
            };
            *codes.entry(code.as_str()).or_default() += 1;
        });
    }

    /// One acknowledged unload on `upstream` (OBS-04).
    pub fn yielded(&self, upstream: &str) {
        self.with(|c| *c.yields.entry(upstream.to_owned()).or_default() += 1);
    }

    /// The Prometheus text exposition, with gauges taken from `status`.
    pub fn render(&self, status: &EngineStatus) -> String {
        let mut out = String::new();
        self.with(|c| {
            let _ = writeln!(
                out,
                "# HELP vacancyd_admissions_total Borrowed requests admitted."
            );
            let _ = writeln!(out, "# TYPE vacancyd_admissions_total counter");
            for u in &status.upstreams {
                let n = c.admissions.get(&u.name).copied().unwrap_or(0);
                let _ = writeln!(
                    out,
                    "vacancyd_admissions_total{{upstream=\"{}\"}} {n}",
                    u.name
                );
            }
            let _ = writeln!(
                out,
                "# HELP vacancyd_refusals_total Borrowed requests refused, by code."
            );
            let _ = writeln!(out, "# TYPE vacancyd_refusals_total counter");
            for (upstream, codes) in &c.refusals {
                for (code, n) in codes {
                    let _ = writeln!(
                        out,
                        "vacancyd_refusals_total{{upstream=\"{upstream}\",code=\"{code}\"}} {n}"
                    );
                }
            }
            let _ = writeln!(
                out,
                "# HELP vacancyd_yields_total Unload acknowledgements (not recovered memory)."
            );
            let _ = writeln!(out, "# TYPE vacancyd_yields_total counter");
            for u in &status.upstreams {
                let n = c.yields.get(&u.name).copied().unwrap_or(0);
                let _ = writeln!(out, "vacancyd_yields_total{{upstream=\"{}\"}} {n}", u.name);
            }
        });
        let _ = writeln!(out, "# HELP vacancyd_work_active Work entries by phase.");
        let _ = writeln!(out, "# TYPE vacancyd_work_active gauge");
        for u in &status.upstreams {
            for phase in ["forwarding", "tracking", "held"] {
                let n = status
                    .work
                    .iter()
                    .filter(|w| w.upstream == u.name && w.phase.as_str() == phase)
                    .count();
                let _ = writeln!(
                    out,
                    "vacancyd_work_active{{upstream=\"{}\",phase=\"{phase}\"}} {n}",
                    u.name
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP vacancyd_resource_free_mib Free MiB in the last good sample."
        );
        let _ = writeln!(out, "# TYPE vacancyd_resource_free_mib gauge");
        for r in &status.resources {
            if let Some(free) = r.free_mib {
                let _ = writeln!(
                    out,
                    "vacancyd_resource_free_mib{{resource=\"{}\"}} {free}",
                    r.name
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP vacancyd_upstream_owner_veto_exempt 1 for upstreams exempt from owner presence."
        );
        let _ = writeln!(out, "# TYPE vacancyd_upstream_owner_veto_exempt gauge");
        for u in &status.upstreams {
            let exempt = u8::from(u.owner_scope == "resource");
            let _ = writeln!(
                out,
                "vacancyd_upstream_owner_veto_exempt{{upstream=\"{}\"}} {exempt}",
                u.name
            );
        }
        out
    }
}
