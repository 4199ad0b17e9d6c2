//! A usage report as people read it (a table), as programs read it (JSON)
//! and as spreadsheets read it (CSV, RFC 4180).

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::report::{By, UsageRow};

/// Seconds rounded to the millisecond, as the engine's JSON writes them.
fn secs(s: f64) -> f64 {
    (s * 1000.0).round() / 1000.0
}

/// `{"since", "since_unix_ms", "by", "rows"}`: rows keyed by the grouping's
/// name, with `reserved_s` per kind (by borrower and day) or the resource's
/// seconds (by resource).
pub fn json(rows: &[UsageRow], since_unix_ms: i64, by: By) -> Value {
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            let mut o = Map::new();
            o.insert(by.as_str().to_owned(), Value::from(r.key.clone()));
            o.insert("jobs".to_owned(), Value::from(r.jobs));
            if by == By::Resource {
                o.insert("reserved_s".to_owned(), Value::from(secs(r.resource_s)));
            } else {
                o.insert(
                    "reserved_s".to_owned(),
                    json!({
                        "gpu": secs(r.reserved.gpu),
                        "memory": secs(r.reserved.memory),
                        "cpu": secs(r.reserved.cpu),
                    }),
                );
            }
            o.insert("waited_s".to_owned(), Value::from(secs(r.waited_s)));
            o.insert("held".to_owned(), Value::from(r.held));
            if by != By::Resource {
                o.insert("refusals".to_owned(), json!(r.refusals));
            }
            Value::Object(o)
        })
        .collect();
    let since = jiff::Timestamp::from_millisecond(since_unix_ms)
        .map(|t| Value::from(t.to_string()))
        .unwrap_or(Value::Null);
    json!({
        "since": since,
        "since_unix_ms": since_unix_ms,
        "by": by.as_str(),
        "rows": rows,
    })
}

/// The refusal codes of any row, sorted: one column each.
fn codes(rows: &[UsageRow]) -> Vec<String> {
    let set: BTreeSet<&String> = rows.iter().flat_map(|r| r.refusals.keys()).collect();
    set.into_iter().cloned().collect()
}

/// The header and the cells of each row (numbers with `decimals` places).
fn cells(rows: &[UsageRow], by: By, decimals: usize) -> (Vec<String>, Vec<Vec<String>>) {
    let f = |s: f64| format!("{:.*}", decimals, s);
    let codes = codes(rows);
    let mut header = vec![by.as_str().to_owned(), "jobs".to_owned()];
    if by == By::Resource {
        header.push("reserved_s".to_owned());
    } else {
        header.extend(["gpu_s", "memory_s", "cpu_s"].map(str::to_owned));
    }
    header.extend(["waited_s", "held"].map(str::to_owned));
    header.extend(codes.iter().map(|c| format!("refused_{c}")));
    let body = rows
        .iter()
        .map(|r| {
            let mut line = vec![r.key.clone(), r.jobs.to_string()];
            if by == By::Resource {
                line.push(f(r.resource_s));
            } else {
                line.extend([f(r.reserved.gpu), f(r.reserved.memory), f(r.reserved.cpu)]);
            }
            line.extend([f(r.waited_s), r.held.to_string()]);
            line.extend(
                codes
                    .iter()
                    .map(|c| r.refusals.get(c).copied().unwrap_or(0).to_string()),
            );
            line
        })
        .collect();
    (header, body)
}

/// One CSV field: quoted when it holds a comma, a quote or a line break,
/// its quotes doubled (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// A header line, then one line per row, CRLF-terminated (RFC 4180); a
/// refusal code seen in any row is a `refused_CODE` column.
pub fn csv(rows: &[UsageRow], by: By) -> String {
    let (header, body) = cells(rows, by, 3);
    let mut out = String::new();
    for line in std::iter::once(&header).chain(&body) {
        let fields: Vec<String> = line.iter().map(|c| csv_field(c)).collect();
        out.push_str(&fields.join(","));
        out.push_str("\r\n");
    }
    out
}

/// Columns aligned for a terminal: names left, numbers right.
pub fn table(rows: &[UsageRow], by: By) -> String {
    let (header, body) = cells(rows, by, 1);
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            std::iter::once(&header)
                .chain(&body)
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in std::iter::once(&header).chain(&body) {
        let cols: Vec<String> = line
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i == 0 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        out.push_str(cols.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> UsageRow {
        let mut r = UsageRow {
            key: "alice".to_owned(),
            jobs: 2,
            waited_s: 1.25,
            held: 1,
            ..UsageRow::default()
        };
        r.reserved.gpu = 10.0;
        r.refusals.insert("busy".to_owned(), 3);
        r
    }

    // issue 34 item 4
    #[test]
    fn csv_quotes_commas_quotes_and_line_breaks_per_rfc_4180() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("two\nlines"), "\"two\nlines\"");
        let mut odd = alice();
        odd.key = "smith, \"j\"".to_owned();
        let out = csv(&[odd], By::Borrower);
        assert_eq!(
            out,
            "borrower,jobs,gpu_s,memory_s,cpu_s,waited_s,held,refused_busy\r\n\
             \"smith, \"\"j\"\"\",2,10.000,0.000,0.000,1.250,1,3\r\n"
        );
    }

    // issue 34 item 4
    #[test]
    fn csv_of_no_rows_is_its_header() {
        assert_eq!(
            csv(&[], By::Resource),
            "resource,jobs,reserved_s,waited_s,held\r\n"
        );
    }

    // issue 34 item 4
    #[test]
    fn json_names_since_by_and_rows_keyed_by_the_grouping() {
        let v = json(&[alice()], 1_796_083_200_000, By::Borrower);
        assert_eq!(v["since"], "2026-12-01T00:00:00Z");
        assert_eq!(v["by"], "borrower");
        assert_eq!(v["rows"][0]["borrower"], "alice");
        assert_eq!(v["rows"][0]["reserved_s"]["gpu"], 10.0);
        assert_eq!(v["rows"][0]["refusals"]["busy"], 3);
        let empty = json(&[], 0, By::Day);
        assert_eq!(empty["rows"], json!([]));
    }

    // issue 34 item 4
    #[test]
    fn table_aligns_columns_under_their_header() {
        let out = table(&[alice()], By::Borrower);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("borrower  jobs"));
        assert_eq!(lines[0].len(), lines[1].len());
    }
}
