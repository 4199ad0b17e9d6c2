//! Borrowers with names for Python (issue 34): the table as a dict, checked
//! key by key as the configuration is, into the engine's `BorrowersSpec`.

use std::time::Duration;

use serde_json::{Map, Value};
use vacancy::ResourceKind;
use vacancy::engine::{BorrowerSpec, BorrowersSpec, BudgetPeriod, Priority, TimeBudget};

/// `batch_max_wait_s` when the dict names none.
const DEFAULT_BATCH_MAX_WAIT_S: f64 = 300.0;

/// The table from `{"borrowers": [...], "batch_max_wait_s": 60, "anonymous": {...}}`;
/// an error names the key that is wrong.
pub fn spec_of(v: &Value) -> Result<BorrowersSpec, String> {
    let top = object(v, "borrowers=")?;
    known(
        top,
        "borrowers=",
        &["borrowers", "batch_max_wait_s", "anonymous"],
    )?;
    let list = match top.get("borrowers") {
        Some(Value::Array(items)) => items,
        Some(_) => return Err("borrowers=: \"borrowers\" must be a list of dicts".into()),
        None => return Err("borrowers=: \"borrowers\" is missing (a list of dicts)".into()),
    };
    let borrowers = list
        .iter()
        .enumerate()
        .map(|(i, b)| borrower(b, &format!("borrowers[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let wait = match top.get("batch_max_wait_s") {
        None | Some(Value::Null) => DEFAULT_BATCH_MAX_WAIT_S,
        Some(w) => w
            .as_f64()
            .filter(|w| w.is_finite() && (0.0..=86_400.0).contains(w))
            .ok_or("borrowers=: batch_max_wait_s must be 0 to 86400 seconds")?,
    };
    let anonymous = match top.get("anonymous") {
        None | Some(Value::Null) => None,
        Some(a) => {
            let mut a = a.clone();
            if let Value::Object(m) = &mut a {
                m.entry("name").or_insert_with(|| Value::from("anonymous"));
            }
            Some(borrower(&a, "anonymous")?)
        }
    };
    Ok(BorrowersSpec {
        borrowers,
        batch_max_wait: Duration::from_secs_f64(wait),
        anonymous,
    })
}

fn object<'a>(v: &'a Value, at: &str) -> Result<&'a Map<String, Value>, String> {
    v.as_object().ok_or_else(|| format!("{at} must be a dict"))
}

fn known(m: &Map<String, Value>, at: &str, keys: &[&str]) -> Result<(), String> {
    match m.keys().find(|k| !keys.contains(&k.as_str())) {
        Some(k) => Err(format!(
            "{at}: unknown key {k:?}; expected one of {}",
            keys.join(", ")
        )),
        None => Ok(()),
    }
}

fn count(m: &Map<String, Value>, key: &str, at: &str) -> Result<Option<u32>, String> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| format!("{at}.{key} must be a whole number ≥ 0 or None")),
    }
}

fn borrower(v: &Value, at: &str) -> Result<BorrowerSpec, String> {
    let m = object(v, at)?;
    known(
        m,
        at,
        &[
            "name",
            "priority",
            "share",
            "max_running",
            "max_waiting",
            "budgets",
        ],
    )?;
    let name = m
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{at}.name must be a str"))?;
    let mut b = BorrowerSpec::new(name);
    if let Some(p) = m.get("priority") {
        b.priority = p
            .as_str()
            .ok_or_else(|| format!("{at}.priority must be \"interactive\" or \"batch\""))?
            .parse::<Priority>()
            .map_err(|e| format!("{at}.priority: {e}"))?;
    }
    if let Some(share) = count(m, "share", at)? {
        b.share = share;
    }
    b.max_running = count(m, "max_running", at)?;
    b.max_waiting = count(m, "max_waiting", at)?;
    if let Some(list) = m.get("budgets") {
        let list = list
            .as_array()
            .ok_or_else(|| format!("{at}.budgets must be a list of dicts"))?;
        for (i, item) in list.iter().enumerate() {
            b.budgets.push(budget(item, &format!("{at}.budgets[{i}]"))?);
        }
    }
    Ok(b)
}

fn budget(v: &Value, at: &str) -> Result<TimeBudget, String> {
    let m = object(v, at)?;
    known(m, at, &["kind", "period", "seconds"])?;
    let kind = match m.get("kind").and_then(Value::as_str) {
        Some("gpu") => ResourceKind::Gpu,
        Some("memory") => ResourceKind::Memory,
        Some("cpu") => ResourceKind::Cpu,
        _ => return Err(format!("{at}.kind must be \"gpu\", \"memory\" or \"cpu\"")),
    };
    let period = match m.get("period").and_then(Value::as_str) {
        Some("day") => BudgetPeriod::Day,
        Some("week") => BudgetPeriod::Week,
        _ => return Err(format!("{at}.period must be \"day\" or \"week\"")),
    };
    let seconds = m
        .get("seconds")
        .and_then(Value::as_f64)
        .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 1e9)
        .ok_or_else(|| format!("{at}.seconds must be a number of seconds ≥ 0"))?;
    Ok(TimeBudget {
        kind,
        period,
        allowed: Duration::from_secs_f64(seconds),
    })
}
