//! What `vacancyd usage` sums (issue 34 item 4): stored rows grouped by
//! borrower, UTC day or resource. Pure: the database only supplies the rows.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use super::db::{RefusalRow, ReservationRow};

/// How reservations are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum By {
    /// One row per borrower.
    #[default]
    Borrower,
    /// One row per UTC day (YYYY-MM-DD). A reservation counts in the day it
    /// was released: a row is written then, and a report since a date then
    /// never misses a reservation the database holds for that day.
    Day,
    /// One row per resource a reservation held.
    Resource,
}

impl By {
    /// `borrower`, `day` or `resource`: the name of the grouping's column.
    pub fn as_str(self) -> &'static str {
        match self {
            By::Borrower => "borrower",
            By::Day => "day",
            By::Resource => "resource",
        }
    }
}

impl fmt::Display for By {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for By {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "borrower" => Ok(By::Borrower),
            "day" => Ok(By::Day),
            "resource" => Ok(By::Resource),
            other => Err(format!("{other:?} is not one of borrower, day, resource")),
        }
    }
}

/// Reserved seconds per resource kind.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KindSeconds {
    /// GPUs.
    pub gpu: f64,
    /// System memory.
    pub memory: f64,
    /// Processor.
    pub cpu: f64,
}

/// One group's totals.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UsageRow {
    /// The borrower, the day (YYYY-MM-DD) or the resource.
    pub key: String,
    /// Reservations.
    pub jobs: u64,
    /// Reserved seconds per kind (by borrower and by day).
    pub reserved: KindSeconds,
    /// Seconds the resource was reserved, admission to release (by resource).
    pub resource_s: f64,
    /// Seconds waited in line before admission.
    pub waited_s: f64,
    /// Reservations held before their release.
    pub held: u64,
    /// Refusals by code (by borrower and by day; empty by resource, which
    /// a refusal does not name).
    pub refusals: BTreeMap<String, u64>,
}

/// The UTC day of `unix_ms`, YYYY-MM-DD.
pub fn utc_day(unix_ms: i64) -> String {
    match jiff::Timestamp::from_millisecond(unix_ms) {
        Ok(t) => t
            .to_zoned_datetime(jiff::tz::TimeZone::UTC)
            .date()
            .to_string(),
        // Outside jiff's range (years beyond ±9999): no calendar day to name.
        Err(_) => format!("@{unix_ms}ms"),
    }
}

/// Group `reservations` and `refusals` `by`, rows sorted by their key.
pub fn usage(reservations: &[ReservationRow], refusals: &[RefusalRow], by: By) -> Vec<UsageRow> {
    let mut groups: BTreeMap<String, UsageRow> = BTreeMap::new();
    let mut add = |key: &str, r: &ReservationRow, f: &dyn Fn(&mut UsageRow)| {
        let row = groups.entry(key.to_owned()).or_insert_with(|| UsageRow {
            key: key.to_owned(),
            ..UsageRow::default()
        });
        row.jobs += 1;
        row.waited_s += r.waited_s;
        row.held += u64::from(r.held);
        f(row);
    };
    for r in reservations {
        let kinds = |row: &mut UsageRow| {
            row.reserved.gpu += r.gpu_s;
            row.reserved.memory += r.memory_s;
            row.reserved.cpu += r.cpu_s;
        };
        match by {
            By::Borrower => add(&r.borrower, r, &kinds),
            By::Day => add(&utc_day(r.released_unix_ms), r, &kinds),
            By::Resource => {
                let held_s =
                    r.released_unix_ms.saturating_sub(r.admitted_unix_ms).max(0) as f64 / 1000.0;
                for c in &r.resources {
                    add(&c.resource, r, &|row: &mut UsageRow| {
                        row.resource_s += held_s
                    });
                }
            }
        }
    }
    for f in refusals {
        let key = match by {
            By::Borrower => f.borrower.clone(),
            By::Day => utc_day(f.day_unix_s.saturating_mul(1000)),
            By::Resource => continue,
        };
        let row = groups.entry(key.clone()).or_insert_with(|| UsageRow {
            key,
            ..UsageRow::default()
        });
        *row.refusals.entry(f.code.clone()).or_default() += f.count;
    }
    groups.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::db::StoredCharge;

    const DAY_MS: i64 = 86_400_000;
    /// 2026-12-01T00:00:00Z.
    const DEC_1: i64 = 1_796_083_200_000;

    fn row(entry: &str, borrower: &str, admitted: i64, released: i64) -> ReservationRow {
        ReservationRow {
            entry: entry.to_owned(),
            borrower: borrower.to_owned(),
            upstream: "llama".to_owned(),
            model: None,
            priority: "interactive".to_owned(),
            admitted_unix_ms: admitted,
            released_unix_ms: released,
            waited_s: 1.0,
            held: false,
            gpu_s: 10.0,
            memory_s: 5.0,
            cpu_s: 0.0,
            resources: vec![StoredCharge {
                resource: "gpu0".to_owned(),
                required_mib: 2048,
            }],
        }
    }

    fn refusal(borrower: &str, day_unix_s: i64, code: &str, count: u64) -> RefusalRow {
        RefusalRow {
            borrower: borrower.to_owned(),
            day_unix_s,
            code: code.to_owned(),
            count,
        }
    }

    // issue 34 item 4
    #[test]
    fn utc_day_names_the_calendar_day_in_utc() {
        assert_eq!(utc_day(DEC_1), "2026-12-01");
        assert_eq!(utc_day(DEC_1 - 1), "2026-11-30");
    }

    // issue 34 item 4
    #[test]
    fn by_borrower_sums_jobs_kinds_waits_holds_and_refusals() {
        let mut held = row("b", "alice", DEC_1, DEC_1 + 1000);
        held.held = true;
        let rows = usage(
            &[
                row("a", "alice", DEC_1, DEC_1 + 1000),
                held,
                row("c", "bob", DEC_1, DEC_1 + 1000),
            ],
            &[
                refusal("alice", DEC_1 / 1000, "busy", 2),
                refusal("alice", DEC_1 / 1000 + 86_400, "busy", 1),
                refusal("carol", DEC_1 / 1000, "owner_present", 4),
            ],
            By::Borrower,
        );
        let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["alice", "bob", "carol"]);
        let alice = &rows[0];
        assert_eq!(alice.jobs, 2);
        assert_eq!(alice.held, 1);
        assert_eq!(alice.reserved.gpu, 20.0);
        assert_eq!(alice.reserved.memory, 10.0);
        assert_eq!(alice.waited_s, 2.0);
        assert_eq!(alice.refusals.get("busy"), Some(&3));
        // A borrower only ever refused still has a row.
        assert_eq!(rows[2].jobs, 0);
        assert_eq!(rows[2].refusals.get("owner_present"), Some(&4));
    }

    // issue 34 item 4
    #[test]
    fn by_day_counts_a_reservation_in_the_utc_day_it_was_released() {
        let rows = usage(
            &[
                // Admitted before midnight, released after: Dec 1.
                row("a", "alice", DEC_1 - 60_000, DEC_1 + 60_000),
                row("b", "bob", DEC_1 + DAY_MS, DEC_1 + DAY_MS + 1),
            ],
            &[refusal("carol", DEC_1 / 1000, "busy", 5)],
            By::Day,
        );
        let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["2026-12-01", "2026-12-02"]);
        assert_eq!(rows[0].jobs, 1);
        assert_eq!(rows[0].refusals.get("busy"), Some(&5));
        assert_eq!(rows[1].jobs, 1);
        assert!(rows[1].refusals.is_empty());
    }

    // issue 34 item 4
    #[test]
    fn by_resource_counts_each_resource_held_with_its_seconds_and_no_refusals() {
        let mut both = row("b", "bob", DEC_1, DEC_1 + 4000);
        both.resources.push(StoredCharge {
            resource: "ram".to_owned(),
            required_mib: 0,
        });
        let rows = usage(
            &[row("a", "alice", DEC_1, DEC_1 + 1500), both],
            &[refusal("carol", DEC_1 / 1000, "busy", 5)],
            By::Resource,
        );
        let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["gpu0", "ram"]);
        assert_eq!(rows[0].jobs, 2);
        assert_eq!(rows[0].resource_s, 5.5);
        assert_eq!(rows[1].jobs, 1);
        assert_eq!(rows[1].resource_s, 4.0);
        assert!(rows.iter().all(|r| r.refusals.is_empty()));
    }

    // issue 34 item 4
    #[test]
    fn by_parses_its_three_names_and_refuses_others() {
        assert_eq!("day".parse::<By>(), Ok(By::Day));
        assert_eq!("resource".parse::<By>(), Ok(By::Resource));
        assert_eq!("borrower".parse::<By>(), Ok(By::Borrower));
        assert!("week".parse::<By>().is_err());
    }
}
