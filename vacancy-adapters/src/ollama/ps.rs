//! `GET /api/ps`: the models Ollama has loaded, with their unload times,
//! digests and contexts.

use std::time::SystemTime;

use serde_json::Value;
use vacancy::traits::ObserveError;

use super::names::canonical_model;

/// How far ahead a loaded model's unload must be for resident credit (RES-03).
pub const MIN_UNLOAD_SECS: i64 = 30;

/// One entry of `/api/ps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PsModel {
    /// The name as Ollama reports it (what `/api/show` and unloads are sent with).
    pub reported: String,
    /// Its canonical form (what requests are matched with).
    pub name: String,
    /// The manifest digest, when reported.
    pub digest: Option<String>,
    /// Seconds until Ollama unloads it (negative: overdue).
    pub unloads_in: i64,
    /// The loaded context in tokens, when reported (`context_length`).
    pub context_length: Option<u64>,
}

/// The models `/api/ps` lists, with unload times relative to `now` (Unix seconds).
///
/// # Behavior
///
/// An answer without a `models` list, an entry without a string `name`, an
/// `expires_at` that is not RFC 3339, a `digest` that is not a string or a
/// `context_length` that is not a non-negative integer is
/// [`ObserveError::Malformed`], never an observation (OBS-03). `digest` and
/// `context_length` may be absent (older releases); such a model is then
/// never credited (RES-05 needs both).
pub fn parse_ps(v: &Value, now: i64) -> Result<Vec<PsModel>, ObserveError> {
    let malformed = |why: String| ObserveError::Malformed(format!("GET /api/ps: {why}"));
    let list = v
        .get("models")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("the answer has no \"models\" list".into()))?;
    let mut models = Vec::with_capacity(list.len());
    for (i, entry) in list.iter().enumerate() {
        let reported = entry
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| malformed(format!("model {i} has no string \"name\"")))?;
        let expires = entry
            .get("expires_at")
            .and_then(Value::as_str)
            .and_then(parse_rfc3339)
            .ok_or_else(|| malformed(format!("model {i} has no RFC 3339 \"expires_at\"")))?;
        let digest = match entry.get("digest") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) if !d.is_empty() => Some(d.clone()),
            Some(_) => {
                return Err(malformed(format!(
                    "model {i} has a \"digest\" that is not a string"
                )));
            }
        };
        let context_length = match entry.get("context_length") {
            None | Some(Value::Null) => None,
            Some(n) => Some(n.as_u64().ok_or_else(|| {
                malformed(format!(
                    "model {i} has a \"context_length\" that is not a whole number"
                ))
            })?),
        };
        models.push(PsModel {
            reported: reported.to_owned(),
            name: canonical_model(reported),
            digest,
            unloads_in: expires.saturating_sub(now),
            context_length,
        });
    }
    Ok(models)
}

/// The current time in whole Unix seconds.
pub fn unix_now() -> i64 {
    unix_seconds(SystemTime::now())
}

/// Whole seconds since the Unix epoch (negative before it).
pub(crate) fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

/// An RFC 3339 date-time (`2024-06-04T14:38:31.83753-07:00`, `...Z`) as
/// whole Unix seconds, fractions dropped; `None` if it is not one.
pub(crate) fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let digits = b.get(r)?;
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    if !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if day < 1 || day > month_days || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest.as_bytes() {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let hm = [*h1, *h2, *m1, *m2];
            if !hm.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let h = i64::from(hm[0] - b'0') * 10 + i64::from(hm[1] - b'0');
            let m = i64::from(hm[2] - b'0') * 10 + i64::from(hm[3] - b'0');
            if h > 23 || m > 59 {
                return None;
            }
            let secs = h * 3600 + m * 60;
            if *sign == b'+' { secs } else { -secs }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    Some(days * 86_400 + hour * 3600 + minute * 60 + second - offset)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn rfc3339_times_parse_to_unix_seconds() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339("2024-03-01T00:00:00.000001Z"),
            Some(1_709_251_200)
        );
        assert_eq!(
            parse_rfc3339("2024-06-04T14:38:31.83753-07:00"),
            Some(1_717_537_111)
        );
        assert_eq!(
            parse_rfc3339("2024-06-04T21:38:31+00:00"),
            Some(1_717_537_111)
        );
        assert!(parse_rfc3339("2318-02-23T22:51:18.123456789+01:00").unwrap() > 10_000_000_000);
        for bad in [
            "",
            "2024-06-04",
            "2024-06-04T14:38:31",
            "2024-13-01T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-06-04T14:38:31.Z",
            "2024-06-04T14:38:31+0700",
            "2024-06-04T14:38:31Zjunk",
            "soon",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn ps_entries_carry_unload_time_digest_and_context() {
        // RES-03, RES-05, RES-14: what the evidence is built from.
        let now = 1_717_537_111;
        let ps = serde_json::json!({"models": [
            {"name": "llama3:latest", "expires_at": "2024-06-04T21:39:01Z", "digest": "abc", "context_length": 8192},
            {"name": "B", "expires_at": "2024-06-04T21:39:00Z"},
            {"name": "c:latest", "expires_at": "2024-06-04T21:00:00Z", "digest": null, "context_length": null},
        ]});
        let models = parse_ps(&ps, now).unwrap();
        assert_eq!(
            models[0],
            PsModel {
                reported: "llama3:latest".into(),
                name: "llama3:latest".into(),
                digest: Some("abc".into()),
                unloads_in: 30,
                context_length: Some(8192),
            }
        );
        assert_eq!(
            (models[1].name.as_str(), models[1].unloads_in),
            ("b:latest", 29)
        );
        assert_eq!(models[1].reported, "B");
        assert_eq!(
            (models[2].digest.as_ref(), models[2].context_length),
            (None, None)
        );
        assert!(models[2].unloads_in < 0);
        assert_eq!(
            parse_ps(&serde_json::json!({"models": []}), now),
            Ok(vec![])
        );
    }

    #[test]
    fn a_malformed_ps_is_no_observation() {
        // OBS-03
        for bad in [
            serde_json::json!({}),
            serde_json::json!([]),
            serde_json::json!({"models": {}}),
            serde_json::json!({"models": [{"expires_at": "2024-06-04T21:39:01Z"}]}),
            serde_json::json!({"models": [{"name": "a"}]}),
            serde_json::json!({"models": [{"name": "a", "expires_at": "tomorrow"}]}),
            serde_json::json!({"models": [{"name": "a", "expires_at": "2024-06-04T21:39:01Z", "digest": 5}]}),
            serde_json::json!({"models": [{"name": "a", "expires_at": "2024-06-04T21:39:01Z", "context_length": "8k"}]}),
            serde_json::json!({"models": [{"name": "a", "expires_at": "2024-06-04T21:39:01Z", "context_length": -1}]}),
        ] {
            assert!(
                matches!(parse_ps(&bad, 0), Err(ObserveError::Malformed(_))),
                "{bad}"
            );
        }
    }
}
